//! `gpuvisor explain`: names known failures in a log, with evidence, cause, fix and confidence.
//!
//! The knowledge is data ([`rules`], from `rules/failures.toml`); [`scan`] streams a log once
//! and remembers, per pattern, a count and a few hit lines; [`KnowledgeBase::explain_reader`]
//! then decides which rules fired and which variant of each the evidence (and, for a few rules,
//! an [`analysis`] of the numbers) supports. [`render`] prints the result.

pub mod analysis;
pub mod fingerprint;
pub mod literal;
pub mod render;
pub mod rules;
pub mod scan;
pub mod smi_table;
pub mod sources;

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::sync::OnceLock;

use serde::Serialize;

use self::rules::{
    parse_builtin_rules, parse_rules, Confidence, Rule, RuleKind, RulesError, BUILTIN_RULES,
    ROW_ANALYSES,
};
use self::scan::{CompileError, Compiled, Hit, Role, Row, Scan};

/// Evidence lines shown per finding at most.
const MAX_EVIDENCE: usize = 10;

/// The rules, compiled.
#[derive(Debug)]
pub struct KnowledgeBase {
    rules: Vec<Rule>,
    compiled: Compiled,
}

/// Why a knowledge base could not be built.
#[derive(Debug, thiserror::Error)]
pub enum KnowledgeError {
    /// The rules file is wrong.
    #[error(transparent)]
    Rules(#[from] RulesError),
    /// The patterns do not compile together.
    #[error(transparent)]
    Compile(#[from] CompileError),
}

/// One evidence line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Evidence {
    /// 1-based line number in the log.
    pub line: u64,
    /// The line.
    pub text: String,
}

/// A number read from the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Figure {
    /// As printed.
    pub text: String,
    /// In bytes, when it is a size.
    pub bytes: Option<u64>,
    /// Where.
    pub line: u64,
}

/// A known failure found in a log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The rule's id.
    pub rule: String,
    /// The variant's id, when one was chosen.
    pub variant: Option<String>,
    /// What the failure is.
    pub name: String,
    /// Cause or symptom.
    pub kind: RuleKind,
    /// How sure.
    pub confidence: Confidence,
    /// Why it happens.
    pub cause: String,
    /// The lines that show it.
    pub evidence: Vec<Evidence>,
    /// Numbers read from the log.
    pub figures: BTreeMap<String, Figure>,
    /// What the numbers imply, when the rule has an analysis.
    pub analysis: Option<String>,
    /// What to change.
    pub fix: String,
    /// Where the facts come from.
    pub references: Vec<String>,
    /// For symptoms: the findings (rule ids) that are the likelier cause.
    pub see_also: Vec<String>,
    /// How many lines matched the rule's main patterns.
    pub matched_lines: u64,
}

/// What explain found in one log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The log's name as the user gave it (or `-` for stdin).
    pub source: String,
    /// Lines read.
    pub lines: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Known failures, likeliest cause first.
    pub findings: Vec<Finding>,
    /// When nothing fired: the rule the log came closest to, and the line that made it so.
    pub closest: Option<NearMiss>,
}

/// A rule that did not fire but whose words the log holds: the class a log that matches
/// nothing came closest to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NearMiss {
    /// The rule's id.
    pub rule: String,
    /// What the failure is.
    pub name: String,
    /// The first line holding the rule's words.
    pub evidence: Evidence,
    /// The line that says it is not that failure (one of the rule's `unless` patterns).
    pub ruled_out_by: Option<Evidence>,
    /// How many of the rule's patterns had a hit or their words present (the score).
    pub signals: u64,
}

impl KnowledgeBase {
    /// The rules shipped in the binary, compiled once.
    pub fn builtin() -> &'static KnowledgeBase {
        static BUILTIN: OnceLock<KnowledgeBase> = OnceLock::new();
        BUILTIN.get_or_init(|| {
            // The shipped file is validated by the tests (its patterns compiled there, not at
            // every start); failing here is a build defect.
            let rules =
                parse_builtin_rules(BUILTIN_RULES).expect("the built-in rules file is valid");
            let compiled = Compiled::new(&rules).expect("the built-in rules compile");
            KnowledgeBase { rules, compiled }
        })
    }

    /// Builds a knowledge base from a rules file's text.
    pub fn from_toml(text: &str) -> Result<Self, KnowledgeError> {
        let rules = parse_rules(text)?;
        let compiled = Compiled::new(&rules)?;
        Ok(KnowledgeBase { rules, compiled })
    }

    /// The rules.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Explains a text (for tests and small inputs).
    pub fn explain_text(&self, source: &str, text: &str) -> Report {
        self.explain_reader(source, text.as_bytes())
            .expect("reading from memory cannot fail")
    }

    /// Streams `reader` once and reports what it found.
    pub fn explain_reader(&self, source: &str, reader: impl Read) -> io::Result<Report> {
        let mut scan = Scan::new(&self.compiled);
        scan.read_all(reader)?;
        let mut findings: Vec<Finding> = (0..self.rules.len())
            .filter_map(|index| self.evaluate(index, &scan))
            .collect();
        findings.sort_by_key(|finding| {
            (
                finding.kind == RuleKind::Symptom,
                std::cmp::Reverse(finding.confidence),
                finding.evidence.first().map_or(u64::MAX, |e| e.line),
            )
        });
        let causes: Vec<String> = findings
            .iter()
            .filter(|finding| finding.kind == RuleKind::Cause)
            .map(|finding| finding.rule.clone())
            .collect();
        for finding in &mut findings {
            if finding.kind == RuleKind::Symptom {
                finding.see_also = causes.clone();
            }
        }
        let closest = if findings.is_empty() {
            self.closest(&scan)
        } else {
            None
        };
        Ok(Report {
            source: source.to_string(),
            lines: scan.lines(),
            bytes: scan.bytes,
            findings,
            closest,
        })
    }

    /// The rule with most signals among those that did not fire: main patterns that matched
    /// (the rule was silenced by an `unless` line or lacked a `requires` line; they count
    /// double), main patterns whose literal appeared on a line they did not match, and other
    /// patterns (supporting, requires, when, figures) that matched; a rule needs one of the
    /// first three or a supporting line to count at all. Ties go to the earlier evidence line.
    fn closest(&self, scan: &Scan) -> Option<NearMiss> {
        let mut best: Option<NearMiss> = None;
        for (index, rule) in self.rules.iter().enumerate() {
            let mut signals = u64::from(scan.near_lines[index] > 0);
            let mut first: Option<&Hit> = scan.near_first[index].as_ref();
            let mut ruled_out = None;
            // A variant's or a figure's words alone ("Connection reset") say too little.
            let mut strong = scan.near_lines[index] > 0;
            for (set_index, pattern) in self.compiled.patterns.iter().enumerate() {
                if pattern.rule != index || scan.hits[set_index].count == 0 {
                    continue;
                }
                let hit = scan.hits[set_index].first.first();
                if pattern.role == Role::Unless {
                    ruled_out = ruled_out.or(hit);
                    continue;
                }
                signals += if pattern.role == Role::Anchor { 2 } else { 1 };
                strong |= matches!(pattern.role, Role::Anchor | Role::Supporting);
                if first.is_none_or(|known| hit.is_some_and(|hit| hit.line < known.line)) {
                    first = hit.or(first);
                }
            }
            let (Some(hit), true) = (first, strong) else {
                continue;
            };
            let better = best.as_ref().is_none_or(|known| {
                (signals, std::cmp::Reverse(hit.line))
                    > (known.signals, std::cmp::Reverse(known.evidence.line))
            });
            if better {
                let evidence = |hit: &Hit| Evidence {
                    line: hit.line,
                    text: hit.text.clone(),
                };
                best = Some(NearMiss {
                    rule: rule.id.clone(),
                    name: rule.name.clone(),
                    evidence: evidence(hit),
                    ruled_out_by: ruled_out.map(evidence),
                    signals,
                });
            }
        }
        best
    }

    /// Decides whether rule `index` fired, and builds its finding.
    /// A rule whose analysis reads table rows (`rules::ROW_ANALYSES`): it fires only with the
    /// analysis's reading, and its evidence is the rows that show it.
    fn table_finding(
        rule: &Rule,
        analysis: &str,
        rows: &[&Row],
        matched_lines: u64,
    ) -> Option<Finding> {
        let reading = smi_table::read_rows(analysis, rows)?;
        let evidence = rows
            .iter()
            .filter(|row| reading.lines.contains(&row.line))
            .take(MAX_EVIDENCE)
            .map(|row| Evidence {
                line: row.line,
                text: row.text.clone(),
            })
            .collect();
        Some(Finding {
            rule: rule.id.clone(),
            variant: None,
            name: rule.name.clone(),
            kind: rule.kind,
            confidence: rule.confidence,
            cause: rule.cause.trim().to_string(),
            evidence,
            figures: BTreeMap::new(),
            analysis: Some(reading.text),
            fix: rule.fix.trim().to_string(),
            references: rule.references.clone(),
            see_also: Vec::new(),
            matched_lines,
        })
    }

    fn evaluate(&self, index: usize, scan: &Scan) -> Option<Finding> {
        let rule = &self.rules[index];
        let mine = || {
            self.compiled
                .patterns
                .iter()
                .enumerate()
                .filter(move |(_, pattern)| pattern.rule == index)
        };
        let found = |role: Role| {
            mine()
                .filter(move |(_, pattern)| pattern.role == role)
                .map(|(set_index, _)| set_index)
                .filter(|&set_index| scan.hits[set_index].count > 0)
        };
        let matched_lines = scan.anchor_lines[index];
        if matched_lines == 0 || found(Role::Unless).next().is_some() {
            return None;
        }
        if (0..rule.requires.len()).any(|group| found(Role::Requires(group)).next().is_none()) {
            return None;
        }

        if let Some(name) = rule
            .analysis
            .as_deref()
            .filter(|name| ROW_ANALYSES.contains(name))
        {
            let rows: Vec<&Row> = found(Role::Anchor)
                .flat_map(|set_index| &scan.rows[set_index])
                .collect();
            return Self::table_finding(rule, name, &rows, matched_lines);
        }

        let mut evidence: Vec<&Hit> = Vec::new();
        for set_index in found(Role::Anchor) {
            evidence.extend(scan.hits[set_index].hits());
        }
        let supporting: Vec<usize> = found(Role::Supporting).collect();
        // Supporting lines are context ("NCCL INFO ..."): one each, and only while the
        // evidence is short.
        for &set_index in &supporting {
            if evidence.len() < 4 {
                evidence.extend(scan.hits[set_index].first.iter().take(1));
            }
        }
        for group in 0..rule.requires.len() {
            if let Some(set_index) = found(Role::Requires(group)).next() {
                evidence.extend(scan.hits[set_index].first.iter().take(1));
            }
        }

        let figure_names: Vec<&String> = rule.figures.keys().collect();
        let mut figures = BTreeMap::new();
        for (set_index, pattern) in mine() {
            if let (Role::Figure(figure), Some(value)) = (pattern.role, &scan.figures[set_index]) {
                // Several patterns may read one figure: the latest line wins.
                if figures
                    .get(figure_names[figure])
                    .is_some_and(|known: &Figure| known.line > value.line)
                {
                    continue;
                }
                figures.insert(
                    figure_names[figure].clone(),
                    Figure {
                        text: value.text.clone(),
                        bytes: value.bytes,
                        line: value.line,
                    },
                );
            }
        }
        let analysis = rule.analysis.as_deref().map(|name| {
            let bytes = figures
                .iter()
                // Sizes in bytes; counts (no unit) as the number they are.
                .filter_map(|(name, figure)| {
                    let value = figure.bytes.or_else(|| figure.text.parse().ok())?;
                    Some((name.clone(), value))
                })
                .collect();
            analysis::analyse(name, &bytes)
        });

        let chosen_by_evidence = (0..rule.variant.len()).find_map(|variant| {
            let set_index = found(Role::When(variant)).next()?;
            Some((variant, set_index))
        });
        let variant = match chosen_by_evidence {
            Some((variant, set_index)) => {
                evidence.extend(scan.hits[set_index].first.iter().take(2));
                Some(&rule.variant[variant])
            }
            None => analysis
                .as_ref()
                .and_then(|analysis| analysis.variant)
                .and_then(|id| rule.variant.iter().find(|variant| variant.id == id)),
        };
        // Lines a figure was read from are evidence too.
        let figure_lines: Vec<u64> = figures.values().map(|figure| figure.line).collect();
        for set_index in mine().map(|(set_index, _)| set_index) {
            evidence.extend(
                scan.hits[set_index]
                    .hits()
                    .filter(|hit| figure_lines.contains(&hit.line)),
            );
        }
        evidence.sort_by_key(|hit| hit.line);
        evidence.dedup_by_key(|hit| hit.line);
        evidence.truncate(MAX_EVIDENCE);

        let mut confidence = variant
            .and_then(|variant| variant.confidence)
            .unwrap_or(rule.confidence);
        if !supporting.is_empty() {
            confidence = confidence.raised();
        }
        Some(Finding {
            rule: rule.id.clone(),
            variant: variant.map(|variant| variant.id.clone()),
            name: variant
                .and_then(|variant| variant.name.clone())
                .unwrap_or_else(|| rule.name.clone()),
            kind: rule.kind,
            confidence,
            cause: variant
                .map_or(&rule.cause, |variant| &variant.cause)
                .trim()
                .to_string(),
            evidence: evidence
                .into_iter()
                .map(|hit| Evidence {
                    line: hit.line,
                    text: hit.text.clone(),
                })
                .collect(),
            figures,
            analysis: analysis.and_then(|analysis| analysis.text),
            fix: variant
                .map_or(&rule.fix, |variant| &variant.fix)
                .trim()
                .to_string(),
            references: rule.references.clone(),
            see_also: Vec::new(),
            matched_lines,
        })
    }
}
