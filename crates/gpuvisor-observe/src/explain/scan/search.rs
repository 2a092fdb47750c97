//! The block search: finds the rules' fingerprints in a block of log text.
//!
//! aho-corasick's `AhoCorasick` uses its SIMD searcher (Teddy) only up to 64 strings, a
//! heuristic limit of the crate ("too many patterns will overwhelm Teddy"), not one of the
//! algorithm: Teddy's own builder takes up to 128 when that heuristic is turned off. Above 64
//! `AhoCorasick` silently falls back to its automaton, several times slower per byte. So the
//! search is built here on the crate's packed searcher with the heuristic off, and the
//! fingerprints are chosen to stay within [`SIMD_SEARCH_LIMIT`]. Where Teddy cannot run (a CPU
//! without SSSE3 / NEON, another architecture) the automaton is used: slower, same results.
//! Owns only the search; which fingerprints to look for is `literal.rs`'s business.

use aho_corasick::packed;
use aho_corasick::{AhoCorasick, Input, MatchKind, Span};

use super::CompileError;

/// The most strings Teddy takes (aho-corasick 1.x's packed searcher; its builder refuses more).
pub const SIMD_SEARCH_LIMIT: usize = 128;

/// A multi-string search over blocks; reports the leftmost string at or after a position (of
/// strings starting at the same byte, the first listed).
#[derive(Debug)]
pub(super) enum BlockSearch {
    /// SIMD (Teddy).
    Simd(packed::Searcher),
    /// The fallback automaton.
    Automaton(AhoCorasick),
}

impl BlockSearch {
    /// Builds the search for `strings` (ids are their indices).
    pub(super) fn new(strings: &[String]) -> Result<Self, CompileError> {
        if strings.len() <= SIMD_SEARCH_LIMIT {
            let simd = packed::Config::new()
                .match_kind(packed::MatchKind::LeftmostFirst)
                .heuristic_pattern_limits(false)
                .builder()
                .extend(strings)
                .build();
            if let Some(simd) = simd {
                return Ok(BlockSearch::Simd(simd));
            }
        }
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostFirst)
            .build(strings)
            .map_err(|e| CompileError(e.to_string()))?;
        Ok(BlockSearch::Automaton(automaton))
    }

    /// The first string found in `block[from..]`: where it starts, and its id.
    #[inline]
    pub(super) fn find(&self, block: &[u8], from: usize) -> Option<(usize, usize)> {
        let found = match self {
            BlockSearch::Simd(simd) => simd.find_in(block, Span::from(from..block.len())),
            BlockSearch::Automaton(automaton) => {
                automaton.find(Input::new(block).span(from..block.len()))
            }
        }?;
        Some((found.start(), found.pattern().as_usize()))
    }

    /// Whether the SIMD searcher runs (false on CPUs without it).
    #[cfg(test)]
    pub fn is_simd(&self) -> bool {
        matches!(self, BlockSearch::Simd(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More strings than `AhoCorasick` would give Teddy: the SIMD search still runs (on x86-64
    /// with SSSE3 and on aarch64), and finds what the automaton finds.
    #[test]
    fn over_64_strings_stay_simd_and_agree_with_the_automaton() {
        let strings: Vec<String> = (0..100).map(|n| format!("k{n:03}x")).collect();
        let search = BlockSearch::new(&strings).unwrap();
        if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            assert!(search.is_simd());
        }
        let automaton = BlockSearch::Automaton(AhoCorasick::new(&strings).unwrap());
        let text: Vec<u8> = (0..5_000u32)
            .flat_map(|n| format!("line {n} k{:03}x and k{:03}y\n", n % 130, n % 7).into_bytes())
            .collect();
        let all = |search: &BlockSearch| {
            let mut found = Vec::new();
            let mut from = 0;
            while let Some((at, id)) = search.find(&text, from) {
                found.push((at, id));
                from = at + 1;
            }
            found
        };
        let expected = all(&automaton);
        assert_eq!(expected.len(), (0..5_000).filter(|n| n % 130 < 100).count());
        assert_eq!(all(&search), expected);
    }
}
