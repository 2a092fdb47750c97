//! The literal every pattern requires, for the scan's prefilter.
//!
//! Searching a log for a set of plain strings is several times faster than running the
//! patterns' combined automaton over every byte, and a line without a pattern's literal cannot
//! match the pattern. So each pattern must contain, outside groups and classes, a run of at
//! least [`MIN_LITERAL_CHARS`] plain characters; the longest such run is its literal. The scan
//! searches for [`fingerprints`](super::fingerprint::fingerprints) of the literals: few shared substrings, so the search stays in
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
