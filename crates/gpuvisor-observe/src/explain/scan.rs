//! The streaming matcher: one pass over a log in fixed-size blocks, in bounded memory.
//!
//! Every pattern requires a plain literal, and each literal has a short fingerprint shared with
//! other literals (see [`super::literal`], [`super::fingerprint`]). A block is searched for all
//! fingerprints at once (a SIMD multi-literal search, `scan/search.rs`, much faster than the
//! patterns' automaton); only a line holding one is checked further, and only against the patterns
//! its fingerprints belong to. An ordinary line costs the literal search and nothing else. The
//! block search itself lists a line's fingerprints (it goes on one byte past each hit), so no line
//! is searched twice. Patterns whose further hits would change nothing (a supporting line already
//! seen three times) are not run again. Per pattern only the count, the first few and the last few
//! hits are kept (`scan/hits.rs`). Blocks can be matched on several threads (`scan/parallel.rs`).

use std::io::{self, Read};
use std::sync::OnceLock;

use regex::bytes::Regex;

mod hits;
mod parallel;
mod search;

use hits::{line_text, read_figure, read_row};
pub use hits::{FigureValue, Hit, PatternHits, Row};
use search::BlockSearch;
pub use search::SIMD_SEARCH_LIMIT;

use super::fingerprint::fingerprints;
use super::literal::required_literal;
use super::rules::{Combine, Rule, ROW_ANALYSES};

/// Bytes read per block. A line longer than this is matched in pieces.
const BLOCK_BYTES: usize = 1 << 20;
/// Evidence text kept per line (longer lines are cut at a character boundary).
const MAX_LINE_TEXT: usize = 2_000;
/// Hits remembered at the start and at the end of the log, per pattern.
const FIRST_HITS: usize = 3;
const LAST_HITS: usize = 2;
/// Rows kept per pattern for a table-reading analysis: more than any pasted nvidia-smi table.
pub const MAX_ROWS: usize = 256;
/// The shortest literal whose presence, without its pattern's match, makes a line a near miss
/// of the rule. Shorter ones ("rror", "CUDA ", shared so the prefilter stays small) are on many
/// lines of any failing log and would make every rule that uses them the closest.
const NEAR_LITERAL_BYTES: usize = 8;

/// What a pattern is for, in its rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Fires the rule.
    Anchor,
    /// Raises the confidence.
    Supporting,
    /// Member of `requires` group N.
    Requires(usize),
    /// Silences the rule.
    Unless,
    /// Chooses variant N.
    When(usize),
    /// Reads figure N (index into the rule's figure names).
    Figure(usize),
}

/// One pattern of the compiled set.
#[derive(Debug)]
pub struct PatternRef {
    /// Index of the rule in the knowledge base.
    pub rule: usize,
    /// Its role there.
    pub role: Role,
    /// The pattern's source, compiled on first use: most patterns never see a line holding
    /// their literal, and compiling all of them was half of loading the rules.
    source: String,
    /// The compiled pattern, once a line needed it (`None` if it does not compile, which
    /// `parse_rules` and the built-in rules' tests rule out).
    regex: OnceLock<Option<Regex>>,
    /// The literal every match contains.
    literal: Box<[u8]>,
    /// Where the pattern's fingerprint sits in `literal` (every place, usually one): a line
    /// holds the literal only if it starts at one of these distances before a place where the
    /// block search found the fingerprint, so checking those few bytes replaces searching the
    /// whole line for it.
    fingerprint_offsets: Box<[usize]>,
    /// For figures: how repeated captures combine.
    combine: Option<Combine>,
    /// An anchor of a rule whose analysis reads rows: every matching line is kept.
    keeps_rows: bool,
}

impl PatternRef {
    /// The compiled pattern (compiled here the first time).
    fn regex(&self) -> Option<&Regex> {
        self.regex
            .get_or_init(|| Regex::new(&self.source).ok())
            .as_ref()
    }
}

/// One fingerprint's patterns, keyed by the bytes after the fingerprint in their literal: a
/// line holds a pattern's literal only if those bytes follow the fingerprint there too, so of a
/// common fingerprint's many patterns ("CUDA": 57, most of them "CUDA_" or "CUDA ") a line is
/// checked against the few that continue as it does.
#[derive(Debug, Clone, Default)]
struct ByNextByte {
    /// (the two bytes after the fingerprint, set index), sorted.
    two: Vec<(u16, usize)>,
    /// (the one byte after it, where the literal ends there, set index), sorted.
    one: Vec<(u8, usize)>,
    /// Patterns whose literal ends with the fingerprint, or holds it more than once.
    always: Vec<usize>,
}

/// The entries of a sorted `(key, index)` list whose key is `key`.
fn keyed<K: Ord + Copy>(list: &[(K, usize)], key: K) -> impl Iterator<Item = usize> + '_ {
    let start = list.partition_point(|&(other, _)| other < key);
    let end = list.partition_point(|&(other, _)| other <= key);
    list[start..end].iter().map(|&(_, index)| index)
}

impl ByNextByte {
    /// Adds to `out` the patterns to check where the fingerprint is followed by `after` (the
    /// rest of the line).
    fn extend_for(&self, after: &[u8], out: &mut Vec<usize>) {
        if let [first, rest @ ..] = after {
            out.extend(keyed(&self.one, *first));
            if let [second, ..] = rest {
                out.extend(keyed(&self.two, u16::from_be_bytes([*first, *second])));
            }
        }
    }
}

/// All rules compiled for matching.
#[derive(Debug)]
pub struct Compiled {
    /// Finds fingerprints (see [`fingerprints`]) in a block; ids index `fingerprints`.
    prefilter: BlockSearch,
    /// Per fingerprint id: the other fingerprints that start with it or that it starts with.
    /// The block search reports one fingerprint per position, so these are the ones that may
    /// also be present where it reported this one.
    same_start: Vec<Vec<usize>>,
    /// Per fingerprint id: the patterns (set indices) that require it, keyed by the bytes that
    /// follow the fingerprint in their literal (see [`ByNextByte`]).
    patterns_of: Vec<ByNextByte>,
    /// Per set index.
    pub patterns: Vec<PatternRef>,
    /// The distinct strings the prefilter searches for.
    pub fingerprints: Vec<String>,
}

/// Why compiling failed (a rules file validated by `parse_rules` compiles).
#[derive(Debug, thiserror::Error)]
#[error("compiling the rules: {0}\n  hint: see docs/explain.md: every pattern needs a literal of 4 or more characters")]
pub struct CompileError(String);

impl Compiled {
    /// Compiles every pattern of `rules`.
    pub fn new(rules: &[Rule]) -> Result<Self, CompileError> {
        let mut sources: Vec<(&str, Role, Option<Combine>, usize)> = Vec::new();
        for (index, rule) in rules.iter().enumerate() {
            for p in &rule.patterns {
                sources.push((p, Role::Anchor, None, index));
            }
            for p in &rule.supporting {
                sources.push((p, Role::Supporting, None, index));
            }
            for (group, members) in rule.requires.iter().enumerate() {
                for p in members {
                    sources.push((p, Role::Requires(group), None, index));
                }
            }
            for p in &rule.unless {
                sources.push((p, Role::Unless, None, index));
            }
            for (variant, spec) in rule.variant.iter().enumerate() {
                for p in &spec.when {
                    sources.push((p, Role::When(variant), None, index));
                }
            }
            for (figure, spec) in rule.figures.values().enumerate() {
                for p in spec.pattern.all() {
                    sources.push((p, Role::Figure(figure), Some(spec.combine), index));
                }
            }
        }
        let mut literals = Vec::with_capacity(sources.len());
        let mut patterns = Vec::with_capacity(sources.len());
        for (source, role, combine, rule) in sources {
            let literal = required_literal(source)
                .ok_or_else(|| CompileError(format!("pattern `{source}` has no literal")))?;
            let reads_rows = rules[rule]
                .analysis
                .as_deref()
                .is_some_and(|name| ROW_ANALYSES.contains(&name));
            patterns.push(PatternRef {
                keeps_rows: role == Role::Anchor && reads_rows,
                rule,
                role,
                literal: literal.text.as_bytes().into(),
                fingerprint_offsets: Box::default(),
                source: source.to_string(),
                regex: OnceLock::new(),
                combine,
            });
            literals.push(literal.text);
        }
        let per_pattern = fingerprints(&literals);
        for (pattern, fingerprint) in patterns.iter_mut().zip(&per_pattern) {
            let literal = &pattern.literal;
            let length = fingerprint.len();
            pattern.fingerprint_offsets = (0..=literal.len().saturating_sub(length))
                .filter(|&at| literal[at..].starts_with(fingerprint.as_bytes()))
                .collect();
        }
        let mut distinct = per_pattern.clone();
        distinct.sort();
        distinct.dedup();
        let mut patterns_of = vec![ByNextByte::default(); distinct.len()];
        for (index, fingerprint) in per_pattern.iter().enumerate() {
            let id = distinct
                .binary_search(fingerprint)
                .expect("every fingerprint is listed");
            let pattern = &patterns[index];
            let after = match *pattern.fingerprint_offsets {
                [before] => pattern.literal.get(before + fingerprint.len()..),
                _ => None,
            };
            match after {
                Some([first, second, ..]) => patterns_of[id]
                    .two
                    .push((u16::from_be_bytes([*first, *second]), index)),
                Some([first]) => patterns_of[id].one.push((*first, index)),
                _ => patterns_of[id].always.push(index),
            }
        }
        for patterns in &mut patterns_of {
            patterns.two.sort_unstable();
            patterns.one.sort_unstable();
        }
        // It reports one fingerprint per start position; `same_start` finds the others
        // starting there.
        let prefilter = BlockSearch::new(&distinct)?;
        let same_start = distinct
            .iter()
            .enumerate()
            .map(|(id, this)| {
                (0..distinct.len())
                    .filter(|&other| {
                        other != id
                            && (distinct[other].starts_with(this.as_str())
                                || this.starts_with(distinct[other].as_str()))
                    })
                    .collect()
            })
            .collect();
        Ok(Compiled {
            prefilter,
            same_start,
            patterns_of,
            patterns,
            fingerprints: distinct,
        })
    }
}

/// The state of one pass over a log.
#[derive(Debug)]
pub struct Scan<'a> {
    compiled: &'a Compiled,
    /// Per set index.
    pub hits: Vec<PatternHits>,
    /// Per set index; only figure patterns get values.
    pub figures: Vec<Option<FigureValue>>,
    /// Per set index; only the anchors of a table-reading rule keep rows (at most `MAX_ROWS`).
    pub rows: Vec<Vec<Row>>,
    /// Newlines seen before the current block.
    newlines: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Whether the last byte seen was a newline (for the line count).
    ended_with_newline: bool,
    /// Scratch: which fingerprints the current line holds (flags, and the ids set), and where:
    /// (fingerprint id, offset in the line) for every place the block search found one.
    present: Vec<bool>,
    present_ids: Vec<usize>,
    found: Vec<(usize, usize)>,
    /// Scratch: the patterns one fingerprint's places on the current line call for.
    candidates: Vec<usize>,
    /// Per rule: lines any of its main patterns matched (a line counts once).
    pub anchor_lines: Vec<u64>,
    /// Per rule: the last line counted in `anchor_lines`.
    last_anchor_line: Vec<u64>,
    /// Per rule: lines holding a main pattern's literal that the pattern did not match (what
    /// makes a rule the closest one when nothing fired), and the first such line.
    pub near_lines: Vec<u64>,
    /// Per rule: the first of `near_lines`.
    pub near_first: Vec<Option<Hit>>,
    /// Per rule: the last line counted in `near_lines`.
    last_near_line: Vec<u64>,
}

impl<'a> Scan<'a> {
    /// A fresh pass.
    pub fn new(compiled: &'a Compiled) -> Self {
        let count = compiled.patterns.len();
        let rules = compiled
            .patterns
            .iter()
            .map(|p| p.rule + 1)
            .max()
            .unwrap_or(0);
        Scan {
            compiled,
            hits: vec![PatternHits::default(); count],
            figures: vec![None; count],
            rows: vec![Vec::new(); count],
            newlines: 0,
            bytes: 0,
            ended_with_newline: true,
            present: vec![false; compiled.fingerprints.len()],
            present_ids: Vec::new(),
            found: Vec::new(),
            candidates: Vec::new(),
            anchor_lines: vec![0; rules],
            last_anchor_line: vec![0; rules],
            near_lines: vec![0; rules],
            near_first: vec![None; rules],
            last_near_line: vec![0; rules],
        }
    }

    /// Reads `reader` to the end, block by block, on several threads where there are cores
    /// for them (see [`parallel`]).
    pub fn read_all(&mut self, reader: impl Read) -> io::Result<()> {
        match parallel::workers() {
            0 | 1 => self.read_all_here(reader),
            workers => parallel::read_all(self, reader, workers),
        }
    }

    /// Reads `reader` to the end, block by block, on this thread.
    pub fn read_all_here(&mut self, mut reader: impl Read) -> io::Result<()> {
        let mut buffer = vec![0u8; BLOCK_BYTES];
        let mut filled = 0;
        loop {
            let read = match reader.read(&mut buffer[filled..]) {
                Ok(read) => read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(error),
            };
            if read == 0 {
                self.block(&buffer[..filled]);
                return Ok(());
            }
            filled += read;
            match memchr::memrchr(b'\n', &buffer[..filled]) {
                Some(last) => {
                    self.block(&buffer[..=last]);
                    buffer.copy_within(last + 1..filled, 0);
                    filled -= last + 1;
                }
                // A line longer than the buffer: match it in pieces rather than grow.
                None if filled == buffer.len() => {
                    self.block(&buffer[..filled]);
                    filled = 0;
                }
                None => {}
            }
        }
    }

    /// Lines read (a last line without a newline counts).
    pub fn lines(&self) -> u64 {
        self.newlines + u64::from(!self.ended_with_newline)
    }

    /// Matches one block: whole lines, except for pieces of over-long lines.
    ///
    /// One search over the block finds every fingerprint, line after line, so a line is never
    /// searched a second time to learn which fingerprints it holds.
    pub fn block(&mut self, block: &[u8]) {
        if block.is_empty() {
            return;
        }
        self.bytes += block.len() as u64;
        let compiled = self.compiled;
        let mut position = 0;
        let mut counted = 0;
        let mut newlines = self.newlines;
        // The line being gathered: its start and end (exclusive, at its newline).
        let mut current: Option<(usize, usize)> = None;
        while position < block.len() {
            let Some((at, id)) = compiled.prefilter.find(block, position) else {
                break;
            };
            if current.is_none_or(|(_, end)| at > end) {
                if let Some((start, end)) = current {
                    self.line(&block[start..end], newlines + 1);
                }
                let start = memchr::memrchr(b'\n', &block[position..at])
                    .map_or(position, |i| position + i + 1);
                let end = memchr::memchr(b'\n', &block[at..]).map_or(block.len(), |i| at + i);
                newlines += count_newlines(&block[counted..start]);
                counted = start;
                current = Some((start, end));
            }
            let offset = at - current.map_or(0, |(start, _)| start);
            self.mark(id, offset);
            for &other in &compiled.same_start[id] {
                if block[at..].starts_with(compiled.fingerprints[other].as_bytes()) {
                    self.mark(other, offset);
                }
            }
            // Fingerprints may overlap: the next one can start one byte further on.
            position = at + 1;
        }
        if let Some((start, end)) = current {
            self.line(&block[start..end], newlines + 1);
        }
        newlines += count_newlines(&block[counted..]);
        self.newlines = newlines;
        self.ended_with_newline = block.last() == Some(&b'\n');
    }

    fn mark(&mut self, id: usize, offset: usize) {
        if !self.present[id] {
            self.present[id] = true;
            self.present_ids.push(id);
        }
        self.found.push((id, offset));
    }

    /// Whether `line` holds `pattern`'s literal where one of its fingerprint's places (`found`,
    /// that fingerprint's entries only) puts it.
    fn holds_literal(found: &[(usize, usize)], pattern: &PatternRef, line: &[u8]) -> bool {
        found.iter().any(|&(_, at)| {
            pattern.fingerprint_offsets.iter().any(|&before| {
                at.checked_sub(before).is_some_and(|start| {
                    line.get(start..start + pattern.literal.len()) == Some(&pattern.literal[..])
                })
            })
        })
    }

    /// Runs the patterns of the fingerprints marked present on `line`, then clears the marks.
    fn line(&mut self, line: &[u8], number: u64) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let compiled = self.compiled;
        let mut ids = std::mem::take(&mut self.present_ids);
        ids.sort_unstable();
        // Grouped by fingerprint, so each pattern looks only at its own fingerprint's places.
        let mut found = std::mem::take(&mut self.found);
        found.sort_unstable();
        let mut text = None;
        for &id in &ids {
            self.present[id] = false;
            let first = found.partition_point(|&(other, _)| other < id);
            let end = found.partition_point(|&(other, _)| other <= id);
            let places = &found[first..end];
            let fingerprint_len = compiled.fingerprints[id].len();
            let by_next = &compiled.patterns_of[id];
            let mut candidates = std::mem::take(&mut self.candidates);
            candidates.clear();
            candidates.extend_from_slice(&by_next.always);
            for &(_, at) in places {
                let after = line.get(at + fingerprint_len..).unwrap_or_default();
                by_next.extend_for(after, &mut candidates);
            }
            if places.len() > 1 {
                candidates.sort_unstable();
                candidates.dedup();
            }
            for &index in &candidates {
                let pattern = &compiled.patterns[index];
                let saturated = !matches!(pattern.role, Role::Anchor | Role::Figure(_))
                    && self.hits[index].count >= FIRST_HITS as u64;
                // The pattern's own literal first: far cheaper than the regex, and most
                // lines sharing a common fingerprint ("CUDA") lack it.
                if saturated || !Self::holds_literal(places, pattern, line) {
                    continue;
                }
                let Some(regex) = pattern.regex() else {
                    continue;
                };
                if !regex.is_match(line) {
                    // A main pattern's literal without its match: the wording changed, or a
                    // near relative of the failure. Counted per rule, once per line.
                    if pattern.role == Role::Anchor
                        && pattern.literal.len() >= NEAR_LITERAL_BYTES
                        && self.last_near_line[pattern.rule] != number
                    {
                        self.last_near_line[pattern.rule] = number;
                        self.near_lines[pattern.rule] += 1;
                        if self.near_first[pattern.rule].is_none() {
                            self.near_first[pattern.rule] = Some(Hit {
                                line: number,
                                text: text.get_or_insert_with(|| line_text(line)).clone(),
                            });
                        }
                    }
                    continue;
                }
                let text = text.get_or_insert_with(|| line_text(line));
                self.hits[index].record(number, text);
                if pattern.role == Role::Anchor && self.last_anchor_line[pattern.rule] != number {
                    self.last_anchor_line[pattern.rule] = number;
                    self.anchor_lines[pattern.rule] += 1;
                }
                if pattern.keeps_rows && self.rows[index].len() < MAX_ROWS {
                    if let Some(row) = read_row(regex, line, number, text) {
                        self.rows[index].push(row);
                    }
                }
                if let Some(combine) = pattern.combine {
                    if let Some(value) = read_figure(regex, combine, line, number) {
                        self.figures[index] = Some(value);
                    }
                }
            }
            self.candidates = candidates;
        }
        ids.clear();
        self.present_ids = ids;
        found.clear();
        self.found = found;
    }
}

fn count_newlines(bytes: &[u8]) -> u64 {
    // Byte-wide counters over short chunks let LLVM vectorise the comparison without widening
    // every byte to a 64-bit lane (several times faster than a plain filter-count).
    bytes
        .chunks(255)
        .map(|chunk| {
            chunk
                .iter()
                .fold(0u8, |count, &b| count + u8::from(b == b'\n')) as u64
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explain::rules::{parse_rules, BUILTIN_RULES};

    #[test]
    fn builtin_prefilter_stays_in_the_fast_path() {
        let compiled = Compiled::new(&parse_rules(BUILTIN_RULES).unwrap()).unwrap();
        let count = compiled.fingerprints.len();
        eprintln!("{count} fingerprints: {:?}", compiled.fingerprints);
        assert!(
            count <= crate::explain::fingerprint::FAST_SEARCH_LIMIT,
            "{count} fingerprints"
        );
    }

    fn scan_text(text: &str) -> (u64, Vec<u64>) {
        let rules = parse_rules(
            "[[rule]]\nid = 'x'\nname = 'n'\ncause = 'c'\nfix = 'f'\npatterns = ['needle\\d']\n",
        )
        .unwrap();
        let compiled = Compiled::new(&rules).unwrap();
        let mut scan = Scan::new(&compiled);
        scan.read_all(text.as_bytes()).unwrap();
        let lines = scan.hits[0].hits().map(|hit| hit.line).collect();
        (scan.lines(), lines)
    }

    #[test]
    fn line_numbers_count_every_line() {
        assert_eq!(scan_text("a\nneedle1\nb\r\nneedle2\r\n"), (4, vec![2, 4]));
        assert_eq!(scan_text("needle1"), (1, vec![1]));
        assert_eq!(scan_text(""), (0, vec![]));
        // A candidate line that does not match does not hide the next line.
        assert_eq!(scan_text("needle x\nneedle3\n"), (2, vec![2]));
        // The literal is checked where each fingerprint was found, not only the first.
        assert_eq!(scan_text("needle x needle4\r\n"), (1, vec![1]));
    }

    #[test]
    fn long_lines_and_block_boundaries() {
        let mut text = "x".repeat(BLOCK_BYTES + 10);
        text.push('\n');
        text.push_str(&"y\n".repeat(BLOCK_BYTES / 2));
        text.push_str("needle7\n");
        let (lines, hits) = scan_text(&text);
        let expected = 1 + (BLOCK_BYTES / 2) as u64 + 1;
        assert_eq!(lines, expected);
        assert_eq!(hits, vec![expected]);
    }
}
