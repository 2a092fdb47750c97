//! The literal every pattern requires, for the scan's prefilter.
//!
//! Searching a log for a set of plain strings is several times faster than running the
//! patterns' combined automaton over every byte, and a line without a pattern's literal cannot
//! match the pattern. So each pattern must contain, outside groups and classes, a run of at
//! least [`MIN_LITERAL_CHARS`] plain characters; the longest such run is its literal. The scan
//! searches for [`fingerprints`] of the literals: few shared substrings, so the search stays in
//! the SIMD multi-literal fast path.

/// The shortest literal a pattern may rely on. Shorter ones would make most lines candidates,
/// and a 3-byte string among the fingerprints limits the SIMD search to 3-byte masks, which
/// let through many more false candidates: with two such strings among 64 the block search
/// ran at about half the speed (docs/explain.md, "How it works, and how fast").
pub const MIN_LITERAL_CHARS: usize = 4;

/// A literal a pattern requires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Literal {
    /// The text.
    pub text: String,
}

/// The longest run of plain characters `pattern` requires on every line it matches, if one of
/// at least [`MIN_LITERAL_CHARS`] exists and the pattern sets no flags (`(?i)`: write
/// `[Ww]orker` instead). Conservative: anything inside groups, classes, or
/// under a quantifier that allows zero repetitions is not counted; a top-level `|` means no
/// literal is required.
pub fn required_literal(pattern: &str) -> Option<Literal> {
    // Case-insensitive patterns would need a case-insensitive search of every byte.
    if pattern.starts_with("(?") {
        return None;
    }
    let chars: Vec<char> = pattern.chars().collect();
    let mut runs: Vec<String> = Vec::new();
    let mut run = String::new();
    let mut index = 0;
    while index < chars.len() {
        let c = chars[index];
        match c {
            '\\' => {
                let &next = chars.get(index + 1)?;
                index += 2;
                if next.is_ascii_alphanumeric() {
                    // \d, \s, \b, \x27 ...: not a plain character.
                    runs.push(std::mem::take(&mut run));
                    index = skip_escape_tail(&chars, index, next);
                    index = skip_quantifier(&chars, index);
                } else if let Some(after) = quantified(&chars, index) {
                    runs.push(std::mem::take(&mut run));
                    index = after.0;
                    if after.1 {
                        // `x+` requires one x.
                        runs.push(next.to_string());
                    }
                } else {
                    run.push(next);
                }
            }
            '(' => {
                runs.push(std::mem::take(&mut run));
                index = skip_group(&chars, index)?;
                index = skip_quantifier(&chars, index);
            }
            '[' => {
                runs.push(std::mem::take(&mut run));
                index = skip_class(&chars, index)?;
                index = skip_quantifier(&chars, index);
            }
            '|' => return None,
            '.' | '^' | '$' => {
                runs.push(std::mem::take(&mut run));
                index += 1;
                index = skip_quantifier(&chars, index);
            }
            _ => {
                index += 1;
                if let Some((after, keeps_one)) = quantified(&chars, index) {
                    runs.push(std::mem::take(&mut run));
                    index = after;
                    if keeps_one {
                        runs.push(c.to_string());
                    }
                } else {
                    run.push(c);
                }
            }
        }
    }
    runs.push(run);
    let text = runs.into_iter().max_by_key(|run| run.chars().count())?;
    (text.chars().count() >= MIN_LITERAL_CHARS).then_some(Literal { text })
}

/// If a quantifier starts at `index`: where it ends, and whether it keeps at least one
/// repetition (`+`, `{n,..}` with n >= 1).
fn quantified(chars: &[char], index: usize) -> Option<(usize, bool)> {
    let keeps_one = match chars.get(index)? {
        '?' | '*' => false,
        '+' => true,
        '{' => {
            let close = chars[index..].iter().position(|&c| c == '}')? + index;
            let inner: String = chars[index + 1..close].iter().collect();
            let minimum = inner.split(',').next()?.trim().parse::<u32>().ok()?;
            let end = close + 1;
            let end = if chars.get(end) == Some(&'?') {
                end + 1
            } else {
                end
            };
            return Some((end, minimum >= 1));
        }
        _ => return None,
    };
    let end = index + 1;
    // Lazy or possessive-looking suffix.
    let end = if chars.get(end) == Some(&'?') {
        end + 1
    } else {
        end
    };
    Some((end, keeps_one))
}

fn skip_quantifier(chars: &[char], index: usize) -> usize {
    quantified(chars, index).map_or(index, |(end, _)| end)
}

/// Skips the rest of an escape such as `\x27`, `\x{1F600}`, `\p{L}`.
fn skip_escape_tail(chars: &[char], index: usize, letter: char) -> usize {
    match letter {
        'x' if chars.get(index) == Some(&'{') => chars[index..]
            .iter()
            .position(|&c| c == '}')
            .map_or(chars.len(), |p| index + p + 1),
        'x' => (index + 2).min(chars.len()),
        'p' | 'P' if chars.get(index) == Some(&'{') => chars[index..]
            .iter()
            .position(|&c| c == '}')
            .map_or(chars.len(), |p| index + p + 1),
        'p' | 'P' => (index + 1).min(chars.len()),
        _ => index,
    }
}

/// Index just past the group opening at `index`.
fn skip_group(chars: &[char], mut index: usize) -> Option<usize> {
    let mut depth = 0;
    while index < chars.len() {
        match chars[index] {
            '\\' => index += 1,
            '[' => {
                index = skip_class(chars, index)?;
                continue;
            }
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(index + 1);
                }
            }
            _ => {}
        }
        index += 1;
    }
    None
}

/// Index just past the class opening at `index`.
fn skip_class(chars: &[char], mut index: usize) -> Option<usize> {
    index += 1;
    if chars.get(index) == Some(&'^') {
        index += 1;
    }
    // A `]` first in a class is literal.
    if chars.get(index) == Some(&']') {
        index += 1;
    }
    let mut depth = 1;
    while index < chars.len() {
        match chars[index] {
            '\\' => index += 1,
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(index + 1);
                }
            }
            _ => {}
        }
        index += 1;
    }
    None
}

/// How many fingerprints the block search is built for. Teddy (the SIMD search) takes up to
/// [`SIMD_SEARCH_LIMIT`](super::scan::SIMD_SEARCH_LIMIT), but more strings crowd its 16
/// buckets and let through more false candidates: on the benchmark's 1 GiB log a cover of 81
/// pieces took 1.8 times as long as one of 64, and 103 pieces 2.5 times (docs/explain.md, "How
/// it works, and how fast"). So 64 is a budget, kept by the built-in rules' test, not a wall:
/// a rules file that needs more still runs on Teddy, slower.
pub const FAST_SEARCH_LIMIT: usize = 64;

/// Shortest fingerprint taken from a longer literal.
const FINGERPRINT_CHARS: usize = 4;

/// Chooses, for each literal, a fingerprint: a substring it shares with other literals where
/// that saves search strings (greedy set cover). Longer pieces are rarer in ordinary log text,
/// so the cover favours length as much as it can while staying within
/// [`FAST_SEARCH_LIMIT`] distinct strings; when even the shortest-piece cover needs more,
/// pairs of pieces are exchanged for one ([`merge_pairs`]). Returns one fingerprint per
/// literal, in order.
pub fn fingerprints(literals: &[String]) -> Vec<String> {
    let candidates = fingerprint_candidates(literals);
    let debug = std::env::var_os("GPUVISOR_DEBUG_FINGERPRINTS").is_some();
    let distinct = |chosen: &[String]| {
        let mut distinct = chosen.to_vec();
        distinct.sort();
        distinct.dedup();
        distinct.len()
    };
    let covers: Vec<Vec<String>> = [3, 2, 1, 0]
        .into_iter()
        .map(|length_weight| greedy_cover(literals.len(), &candidates, length_weight))
        .collect();
    // The first within the budget, favouring length (the covers are cheap; exchanges are not).
    for (chosen, weight) in covers.iter().zip([3, 2, 1, 0]) {
        if debug {
            eprintln!("weight {weight}: {} fingerprints", distinct(chosen));
        }
        if distinct(chosen) <= FAST_SEARCH_LIMIT {
            return chosen.clone();
        }
    }
    // None is: the shortest-piece cover, exchanged down.
    let mut best = covers.last().cloned().unwrap_or_default();
    merge_pairs(&mut best, &candidates);
    if debug {
        eprintln!("after exchanges: {} fingerprints", distinct(&best));
    }
    best
}

/// A set of literal indices.
type Bits = Vec<u64>;

/// Substrings of [`FINGERPRINT_CHARS`], 6, 8 and 12 characters of each literal (or a shorter
/// literal whole), with the literals containing each; sorted for deterministic ties.
fn fingerprint_candidates(literals: &[String]) -> Vec<(String, Bits)> {
    let words = literals.len().div_ceil(64);
    let lengths_of = |chars: usize| -> Vec<usize> {
        if chars <= FINGERPRINT_CHARS {
            vec![chars]
        } else {
            [FINGERPRINT_CHARS, 6, 8, 12]
                .into_iter()
                .filter(|&length| length <= chars)
                .collect()
        }
    };
    let mut all_lengths: Vec<usize> = literals
        .iter()
        .flat_map(|literal| lengths_of(literal.chars().count()))
        .collect();
    all_lengths.sort_unstable();
    all_lengths.dedup();
    // A piece of k characters is in a literal exactly when it is one of that literal's
    // k-character substrings, so enumerating every literal's substrings of every length in use
    // gives each piece's literals without searching each literal for each piece (which made
    // loading the rules cost more than scanning a 16 MiB log).
    let mut containing: std::collections::HashMap<&str, Bits> = Default::default();
    let mut candidates: Vec<&str> = Vec::new();
    for (index, literal) in literals.iter().enumerate() {
        let bounds: Vec<usize> = literal
            .char_indices()
            .map(|(i, _)| i)
            .chain([literal.len()])
            .collect();
        let chars = bounds.len() - 1;
        let own = lengths_of(chars);
        for &length in all_lengths.iter().filter(|&&length| length <= chars) {
            for start in 0..=chars - length {
                let piece = &literal[bounds[start]..bounds[start + length]];
                let bits = containing.entry(piece).or_insert_with(|| vec![0u64; words]);
                bits[index / 64] |= 1 << (index % 64);
                if own.contains(&length) {
                    candidates.push(piece);
                }
            }
        }
    }
    candidates.sort_unstable();
    candidates.dedup();
    // Of pieces held by the same literals, the cover only ever picks the longest (and of
    // those the last in order, as `max_by_key` does): keep just that one, which leaves far
    // fewer candidates for every round of the cover.
    let mut best_of: std::collections::HashMap<&Bits, &str> = Default::default();
    for &piece in &candidates {
        let best = best_of.entry(&containing[piece]).or_insert(piece);
        if piece.len() >= best.len() {
            *best = piece;
        }
    }
    candidates
        .into_iter()
        .filter(|piece| best_of[&containing[piece]] == *piece)
        .map(|piece| (piece.to_string(), containing[piece].clone()))
        .collect()
}

/// How rare a piece is likely to be in ordinary log text, for breaking ties: prose (lower-case
/// letters and spaces) is everywhere in logs, capitals, digits and punctuation much less so;
/// then longer is rarer.
fn rarity(piece: &str) -> usize {
    let marked = piece
        .chars()
        .filter(|c| !(c.is_ascii_lowercase() || *c == ' '))
        .count();
    marked * 16 + piece.len()
}

/// Greedy cover scoring each piece by (literals newly covered) x length^weight.
fn greedy_cover(count: usize, candidates: &[(String, Bits)], weight: u32) -> Vec<String> {
    let mut chosen: Vec<Option<String>> = vec![None; count];
    let mut uncovered: Bits = vec![0; count.div_ceil(64)];
    for index in 0..count {
        uncovered[index / 64] |= 1 << (index % 64);
    }
    let score = |uncovered: &Bits, (piece, covers): &(String, Bits)| {
        let gain: u32 = covers
            .iter()
            .zip(uncovered)
            .map(|(c, u)| (c & u).count_ones())
            .sum();
        gain as usize * piece.len().pow(weight)
    };
    // Lazy greedy: a piece's score only falls as literals get covered, so a piece whose fresh
    // score still tops every other piece's last-known score is the round's best. Keyed (score,
    // rarity, position): of equal scores the piece likelier to be rare in ordinary text, then the
    // last; rescoring a few pieces per round instead of all of them.
    let mut heap: std::collections::BinaryHeap<(usize, usize, usize)> = candidates
        .iter()
        .enumerate()
        .map(|(at, candidate)| (score(&uncovered, candidate), rarity(&candidate.0), at))
        .collect();
    while uncovered.iter().any(|&word| word != 0) {
        let Some((_, length, at)) = heap.pop() else {
            break;
        };
        let fresh = (score(&uncovered, &candidates[at]), length, at);
        if heap.peek().is_some_and(|&next| next > fresh) {
            heap.push(fresh);
            continue;
        }
        let best = &candidates[at];
        for (index, slot) in chosen.iter_mut().enumerate() {
            let bit = 1 << (index % 64);
            if best.1[index / 64] & bit != 0 && uncovered[index / 64] & bit != 0 {
                *slot = Some(best.0.clone());
                uncovered[index / 64] &= !bit;
            }
        }
    }
    let mut chosen: Vec<String> = chosen.into_iter().map(Option::unwrap_or_default).collect();
    drop_redundant(&mut chosen, candidates);
    chosen
}

/// Replaces two chosen pieces by one where a single candidate covers every literal that has
/// neither any other chosen piece (a 2-for-1 exchange, repeated until none is left). Greedy
/// cover is not monotone: one more literal can change its early choices and cost several
/// pieces, where an exchange afterwards gets them back.
fn merge_pairs(chosen: &mut [String], candidates: &[(String, Bits)]) {
    let count = chosen.len();
    let index_of = |piece: &str| {
        candidates
            .binary_search_by(|(candidate, _)| candidate.as_str().cmp(piece))
            .expect("every chosen piece is a candidate")
    };
    let holds = |bits: &Bits, index: usize| bits[index / 64] & (1 << (index % 64)) != 0;
    // Per literal: the candidates it holds.
    let mut held_by: Vec<Vec<usize>> = vec![Vec::new(); count];
    for (at, (_, bits)) in candidates.iter().enumerate() {
        for (index, held) in held_by.iter_mut().enumerate() {
            if holds(bits, index) {
                held.push(at);
            }
        }
    }
    loop {
        let mut distinct: Vec<usize> = chosen.iter().map(|piece| index_of(piece)).collect();
        distinct.sort_unstable();
        distinct.dedup();
        // Per literal: how many chosen pieces it holds.
        let holders: Vec<usize> = (0..count)
            .map(|index| {
                distinct
                    .iter()
                    .filter(|&&piece| holds(&candidates[piece].1, index))
                    .count()
            })
            .collect();
        let mut exchanged = false;
        'pairs: for (first, &p) in distinct.iter().enumerate() {
            for &q in &distinct[first + 1..] {
                // Literals only p or q covers.
                let alone: Vec<usize> = (0..count)
                    .filter(|&index| {
                        let in_p = usize::from(holds(&candidates[p].1, index));
                        let in_q = usize::from(holds(&candidates[q].1, index));
                        in_p + in_q > 0 && holders[index] == in_p + in_q
                    })
                    .collect();
                let Some(&probe) = alone.first() else {
                    continue;
                };
                let replacement = held_by[probe]
                    .iter()
                    .copied()
                    .filter(|&r| alone.iter().all(|&index| holds(&candidates[r].1, index)))
                    .max_by_key(|&r| (candidates[r].0.len(), std::cmp::Reverse(r)));
                let Some(r) = replacement else {
                    continue;
                };
                let kept: Vec<usize> = distinct
                    .iter()
                    .copied()
                    .filter(|&other| other != p && other != q)
                    .chain([r])
                    .collect();
                for (index, slot) in chosen.iter_mut().enumerate() {
                    let current = index_of(slot);
                    if current == p || current == q {
                        let best = kept
                            .iter()
                            .copied()
                            .filter(|&other| holds(&candidates[other].1, index))
                            .max_by_key(|&other| {
                                (candidates[other].0.len(), std::cmp::Reverse(other))
                            })
                            .expect("the exchange keeps every literal covered");
                        *slot = candidates[best].0.clone();
                    }
                }
                exchanged = true;
                break 'pairs;
            }
        }
        if !exchanged {
            return;
        }
    }
}

/// Drops a chosen piece when every literal it was chosen for also holds another chosen piece
/// (greedy cover leaves some: a piece picked early for a few literals whose other literals were
/// all covered later). Shorter pieces go first, as they are the commoner ones in ordinary text.
fn drop_redundant(chosen: &mut [String], candidates: &[(String, Bits)]) {
    let covers = |piece: &str| {
        let at = candidates
            .binary_search_by(|(candidate, _)| candidate.as_str().cmp(piece))
            .expect("every chosen piece is a candidate");
        &candidates[at].1
    };
    let holds = |bits: &Bits, index: usize| bits[index / 64] & (1 << (index % 64)) != 0;
    let mut distinct: Vec<String> = chosen.to_vec();
    distinct.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
    distinct.dedup();
    let mut kept = distinct.clone();
    for piece in distinct {
        let others: Vec<&String> = kept.iter().filter(|&other| *other != piece).collect();
        let mut moves = Vec::new();
        for (index, current) in chosen.iter().enumerate() {
            if *current != piece {
                continue;
            }
            // The longest other piece this literal holds.
            match others
                .iter()
                .filter(|other| holds(covers(other), index))
                .max_by(|a, b| a.len().cmp(&b.len()).then_with(|| b.cmp(a)))
            {
                Some(other) => moves.push((index, (*other).clone())),
                None => {
                    moves.clear();
                    break;
                }
            }
        }
        if !moves.is_empty() {
            for (index, other) in moves {
                chosen[index] = other;
            }
            kept.retain(|other| *other != piece);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn literal(pattern: &str) -> Option<String> {
        required_literal(pattern).map(|literal| literal.text)
    }

    #[test]
    fn picks_the_longest_plain_run() {
        assert_eq!(
            literal(r"Allocator \(GPU_\d+_bfc\) ran out of memory trying to allocate").as_deref(),
            Some("_bfc) ran out of memory trying to allocate")
        );
        assert_eq!(
            literal(r"(torch\.|torch\.cuda\.)?OutOfMemoryError: CUDA out of memory").as_deref(),
            Some("OutOfMemoryError: CUDA out of memory")
        );
        assert_eq!(
            literal(r"^\s*torch\.cuda\.synchronize\(\)").as_deref(),
            Some("torch.cuda.synchronize()")
        );
    }

    #[test]
    fn optional_characters_are_not_required() {
        // "exit ?code": the space is optional, so "exit code" is not required.
        assert_eq!(literal(r"exit ?code[ =:]+-9\b").as_deref(), Some("code"));
        assert_eq!(literal(r"abcde*fghi").as_deref(), Some("fghi"));
        assert_eq!(literal(r"abcd*efg"), None);
        assert_eq!(literal(r"abx{0,2}yz"), None);
    }

    #[test]
    fn flags_are_refused() {
        assert_eq!(literal("(?i)address already in use"), None);
    }

    #[test]
    fn no_literal_when_alternation_or_too_short() {
        assert_eq!(literal("abc|def"), None);
        assert_eq!(literal(r"(jax|xla)"), None);
        assert_eq!(literal(r"\d+ab\d"), None);
    }

    #[test]
    fn classes_and_escapes_break_runs() {
        assert_eq!(
            literal(r#"XLA_PYTHON_CLIENT_PREALLOCATE\s*[=:]\s*["\x27]?(false|False|0)\b"#)
                .as_deref(),
            Some("XLA_PYTHON_CLIENT_PREALLOCATE")
        );
        assert_eq!(literal(r"[]abc]defg").as_deref(), Some("defg"));
    }

    #[test]
    fn fingerprints_cover_every_literal_within_the_limit() {
        let mut literals: Vec<String> = (0..150)
            .map(|i| format!("{} failure number {i}", ["CUDA", "NCCL", "XLA"][i % 3]))
            .collect();
        literals.push("abcd".to_string());
        let chosen = fingerprints(&literals);
        for (literal, fingerprint) in literals.iter().zip(&chosen) {
            assert!(
                literal.contains(fingerprint.as_str()),
                "{literal} / {fingerprint}"
            );
        }
        let mut distinct = chosen.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() <= FAST_SEARCH_LIMIT, "{}", distinct.len());
        assert_eq!(chosen[150], "abcd");
        // Few literals: each keeps a long piece of its own.
        let few = fingerprints(&["CUDA out of memory".to_string(), "NCCL WARN x".to_string()]);
        assert!(few.iter().all(|piece| piece.len() >= 8), "{few:?}");
    }

    #[test]
    fn the_literal_is_in_every_match() {
        // For each builtin pattern with a literal, lines the pattern matches contain it.
        let samples = [
            (
                r"Process \d+ has ([0-9.]+ ?[KMGT]i?B) memory in use",
                "Process 12 has 3.00 GiB memory in use",
            ),
            (r"exit ?code[ =:]+-9\b", "exitcode -9"),
            (
                r"Tried to allocate ([0-9.]+ ?[KMGT]?i?B)",
                "Tried to allocate 20.00 MiB",
            ),
        ];
        for (pattern, line) in samples {
            let regex = regex::Regex::new(pattern).unwrap();
            assert!(regex.is_match(line));
            let found = required_literal(pattern).unwrap();
            assert!(line.contains(&found.text), "{pattern}: {:?}", found.text);
        }
    }
}
