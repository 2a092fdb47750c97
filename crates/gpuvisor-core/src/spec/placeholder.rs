//! `{replica}` placeholders in commands and environment values.
//!
//! Rules (the parser checks them, [`substitute_replica`] applies them):
//! - `{replica}` becomes the replica's index (0-based);
//! - `{{` is a literal `{` (so `{{replica}` stays `{replica}`);
//! - any other `{name}` where name looks like an identifier is refused at parse time as a
//!   probable typo;
//! - `${NAME}` (a shell variable) and every other brace is left alone, so JSON such as `{"lr": 0.1}` passes through unchanged.

/// The one placeholder gpuvisor knows.
pub const REPLICA_PLACEHOLDER: &str = "{replica}";

/// A `{name}` placeholder that is not `{replica}`: its byte range in the text and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct UnknownPlaceholder {
    /// Byte range of `{name}` within the text.
    pub range: std::ops::Range<usize>,
    /// The name between the braces.
    pub name: String,
}

/// One piece of a text split at placeholders.
enum Piece<'t> {
    Literal(&'t str),
    Replica,
    Unknown(std::ops::Range<usize>, &'t str),
}

/// Splits `text` into literal runs and placeholders.
fn pieces(text: &str) -> Vec<Piece<'_>> {
    let bytes = text.as_bytes();
    let mut pieces = Vec::new();
    let mut literal_start = 0;
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'{' {
            at += 1;
            continue;
        }
        if bytes.get(at + 1) == Some(&b'{') {
            // `{{`: keep one brace, drop the other.
            pieces.push(Piece::Literal(&text[literal_start..=at]));
            at += 2;
            literal_start = at;
            continue;
        }
        let name_len = bytes[at + 1..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
            .count();
        let name = &text[at + 1..at + 1 + name_len];
        let closes = bytes.get(at + 1 + name_len) == Some(&b'}');
        let is_identifier = name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
        // `${NAME}` is a shell variable, not ours.
        let after_dollar = at > 0 && bytes[at - 1] == b'$';
        if closes && is_identifier && !after_dollar {
            pieces.push(Piece::Literal(&text[literal_start..at]));
            let end = at + name_len + 2;
            pieces.push(if name == "replica" {
                Piece::Replica
            } else {
                Piece::Unknown(at..end, name)
            });
            at = end;
            literal_start = at;
        } else {
            at += 1;
        }
    }
    pieces.push(Piece::Literal(&text[literal_start..]));
    pieces
}

/// The first `{name}` in `text` that is not `{replica}`, if any.
pub(super) fn find_unknown_placeholder(text: &str) -> Option<UnknownPlaceholder> {
    pieces(text).into_iter().find_map(|piece| match piece {
        Piece::Unknown(range, name) => Some(UnknownPlaceholder {
            range,
            name: name.to_string(),
        }),
        _ => None,
    })
}

/// `text` with `{replica}` replaced by `replica` and `{{` by `{`: what a replica's command
/// argument or environment value becomes. Use this rather than a plain string replace so that
/// the escape works as the job-file reference documents.
pub fn substitute_replica(text: &str, replica: u32) -> String {
    let mut out = String::with_capacity(text.len());
    for piece in pieces(text) {
        match piece {
            Piece::Literal(literal) => out.push_str(literal),
            Piece::Replica => out.push_str(&replica.to_string()),
            // Refused at parse time; left as written if a caller skipped validation.
            Piece::Unknown(range, _) => out.push_str(&text[range]),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitutes_replica_and_unescapes_braces() {
        assert_eq!(substitute_replica("--seed={replica}", 2), "--seed=2");
        assert_eq!(substitute_replica("{replica}-{replica}", 7), "7-7");
        assert_eq!(substitute_replica("{{replica}", 3), "{replica}");
        assert_eq!(
            substitute_replica(r#"{"lr": 0.1, "n": {"a": 1}}"#, 0),
            r#"{"lr": 0.1, "n": {"a": 1}}"#
        );
        assert_eq!(substitute_replica("${HOME}/{replica}", 1), "${HOME}/1");
        assert_eq!(substitute_replica("{", 1), "{");
        assert_eq!(substitute_replica("{}", 1), "{}");
    }

    #[test]
    fn finds_unknown_placeholders() {
        assert_eq!(find_unknown_placeholder("--seed {replica}"), None);
        assert_eq!(find_unknown_placeholder(r#"{"lr": 0.1}"#), None);
        assert_eq!(find_unknown_placeholder("{{rank}}"), None);
        assert_eq!(find_unknown_placeholder("{0}"), None);
        assert_eq!(find_unknown_placeholder("echo ${HOME}"), None);
        let found = find_unknown_placeholder("--id {replca}").expect("typo is found");
        assert_eq!(found.name, "replca");
        assert_eq!(&"--id {replca}"[found.range], "{replca}");
    }
}
