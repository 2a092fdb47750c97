//! Fingerprints: the few short strings the scan's block search looks for, one per pattern
//! literal ([`super::literal`]), shared between literals so that the search stays small.
//!
//! Choosing them is a set cover: each piece (a substring of 4, 6, 8 or 12 characters of a
//! literal) covers the literals that contain it, and every literal needs one. Fewer and rarer
//! pieces make a faster search (docs/explain.md, "How it works, and how fast"). Depends only on
//! the literals' text; what the search does with the pieces is `scan/search.rs`'s business.

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
            print_pieces(literals, chosen);
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
        print_pieces(literals, &best);
    }
    best
}

/// For GPUVISOR_DEBUG_FINGERPRINTS: each chosen piece with the literals it serves, fewest
/// first (a piece serving one literal is what a rewritten pattern could save).
fn print_pieces(literals: &[String], chosen: &[String]) {
    let mut served: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (literal, piece) in literals.iter().zip(chosen) {
        served.entry(piece).or_default().push(literal);
    }
    let mut pieces: Vec<_> = served.into_iter().collect();
    pieces.sort_by_key(|(_, served)| served.len());
    for (piece, served) in pieces {
        eprintln!("  {piece:?} ({}): {served:?}", served.len());
    }
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
    // length, position), which picks what scanning for the maximum did (the last of equals),
    // after rescoring a few pieces per round instead of all of them.
    let mut heap: std::collections::BinaryHeap<(usize, usize, usize)> = candidates
        .iter()
        .enumerate()
        .map(|(at, candidate)| (score(&uncovered, candidate), candidate.0.len(), at))
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
        // Of every possible exchange, the one whose replacement is longest: a short one ("not ")
        // is in every tenth line of the benchmark's log, and taking the first exchange found let
        // the rules' order pick it.
        let mut best: Option<(usize, usize, usize)> = None;
        for (first, &p) in distinct.iter().enumerate() {
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
                if let Some(r) = replacement {
                    let longer = best.is_none_or(|(_, _, known)| {
                        candidates[r].0.len() > candidates[known].0.len()
                    });
                    if longer {
                        best = Some((p, q, r));
                    }
                }
            }
        }
        let Some((p, q, r)) = best else {
            return;
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
                    .max_by_key(|&other| (candidates[other].0.len(), std::cmp::Reverse(other)))
                    .expect("the exchange keeps every literal covered");
                *slot = candidates[best].0.clone();
            }
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
    fn exchanges_replace_two_pieces_by_one_that_covers_both() {
        let literals = vec![
            "alpha_one".to_string(),
            "alpha_two".to_string(),
            "gamma_six".to_string(),
        ];
        let candidates = fingerprint_candidates(&literals);
        // A cover with a piece of its own for every literal.
        let own = |index: usize| {
            candidates
                .iter()
                .find(|(_, bits)| bits[0] == 1 << index)
                .map(|(piece, _)| piece.clone())
                .unwrap()
        };
        let mut chosen: Vec<String> = (0..3).map(own).collect();
        merge_pairs(&mut chosen, &candidates);
        for (literal, piece) in literals.iter().zip(&chosen) {
            assert!(literal.contains(piece.as_str()), "{literal} / {piece}");
        }
        // "alpha_" serves both alpha literals; nothing serves "gamma_six" and an alpha one.
        assert_eq!(chosen[0], "alpha_");
        assert_eq!(chosen[1], "alpha_");
        assert_ne!(chosen[2], "alpha_");
    }
}
