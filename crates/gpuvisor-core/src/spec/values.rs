//! Values with a grammar of their own: sizes, memory asks, commands, environments.

use std::collections::BTreeMap;
use std::ops::Range;

use toml::de::DeValue;
use toml::Spanned;

use super::placeholder::find_unknown_placeholder;
use super::reader::{entries_in_file_order, suggest, Field, Source};
use super::{Command, Diagnostic, MemoryAsk, ReadyWhen};
use crate::size::{parse_size, SizeError};

/// Linux's limit on one argument or one `NAME=value` of a program's environment
/// (`MAX_ARG_STRLEN`: 32 pages of 4 KiB), counting the NUL that ends it.
pub const MAX_ARG_BYTES: usize = 131_072;

/// Refuses a string that cannot reach a program: a NUL byte (arguments, variables and paths are
/// C strings, which end there), or more bytes than Linux passes as one argument or variable.
/// `what` names the key ("`env.NAME` in [process.x]"); `bytes` is what the program gets (for a
/// variable, `NAME=value`).
pub(super) fn check_passable(
    source: Source<'_>,
    range: Range<usize>,
    what: &str,
    text: &str,
    bytes: usize,
) -> Result<(), Diagnostic> {
    if let Some(at) = text.find('\0') {
        return Err(source
            .error(range, format!("{what} holds a NUL byte (\\u0000) at byte {}", at + 1))
            .with_hint("programs get their arguments, environment and paths as C strings, which end at the first NUL byte; remove it"));
    }
    if bytes >= MAX_ARG_BYTES {
        return Err(source
            .error(
                range,
                format!(
                    "{what} is {bytes} bytes; Linux passes at most {} bytes as one argument or variable",
                    MAX_ARG_BYTES - 1
                ),
            )
            .with_hint("put large data in a file and pass its path instead"));
    }
    Ok(())
}

/// Units [`parse_size`] accepts, for hints.
const SIZE_UNITS: &[&str] = &["B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB"];

/// What a `memory` value may be.
const MEMORY_EXPECTED: &str =
    "a size (\"12GiB\", \"800MiB\", \"12GB\"), a percentage (\"30%\") or \"rest\"";

/// Characters that mean a command string needs a shell to run as intended.
const SHELL_CHARACTERS: &[char] = &[
    '|', '&', ';', '<', '>', '$', '`', '*', '?', '(', ')', '~', '"', '\'',
];

/// Hint for a number written without a unit.
fn quote_with_unit_hint(field: &Field<'_, '_>) -> String {
    format!(
        "write it as a string with a unit: {} = \"{}GiB\"",
        field.key,
        field.value_text()
    )
}

/// Turns a [`SizeError`] about `text` into a diagnostic at `field`.
fn size_error(field: &Field<'_, '_>, text: &str, error: SizeError, expected: &str) -> Diagnostic {
    let units =
        "units are B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)";
    match error {
        SizeError::Empty => field
            .error("is empty")
            .with_hint(format!("write {expected}")),
        SizeError::NotANumber(_) => {
            let diagnostic = field.wrong(expected);
            match suggest(text.trim(), ["rest"]).filter(|_| expected == MEMORY_EXPECTED) {
                Some(near) => diagnostic.with_hint(format!("did you mean \"{near}\"?")),
                None => diagnostic.with_hint(format!(
                    "a size is a number and a unit, e.g. \"12GiB\"; {units}"
                )),
            }
        }
        SizeError::UnknownUnit { unit, .. } => {
            let diagnostic = field.error(format_args!(
                "has unknown unit `{unit}` in \"{}\"",
                text.trim()
            ));
            match suggest(&unit, SIZE_UNITS.iter().copied()) {
                Some(near) => diagnostic.with_hint(format!("did you mean `{near}`? {units}")),
                None => diagnostic.with_hint(units),
            }
        }
        SizeError::NotPositive(_) => field
            .error(format_args!(
                "must be more than 0, found \"{}\"",
                text.trim()
            ))
            .with_hint("give a positive size such as \"512MiB\", or remove the key"),
        SizeError::TooLarge(_) => field.error(format_args!("is too large: \"{}\"", text.trim())),
    }
}

/// A byte size such as `reserve = "2GiB"`; zero (`"0"`, `"0GiB"`) is allowed.
pub(super) fn size_allowing_zero(field: &Field<'_, '_>) -> Result<u64, Diagnostic> {
    let expected = "a size such as \"2GiB\", \"800MiB\" or \"0\"";
    let text = match field.value.get_ref() {
        DeValue::Integer(_) if field.value_text() == "0" => return Ok(0),
        DeValue::Integer(_) | DeValue::Float(_) => {
            return Err(field.wrong(expected).with_hint(quote_with_unit_hint(field)))
        }
        _ => field.string(expected)?,
    };
    match parse_size(text) {
        Ok(bytes) => Ok(bytes),
        Err(SizeError::NotPositive(_)) if is_zero_size(text) => Ok(0),
        Err(SizeError::NotPositive(_)) => Err(field
            .error(format_args!(
                "must not be negative, found \"{}\"",
                text.trim()
            ))
            .with_hint("give a size such as \"2GiB\", or \"0\" for none")),
        Err(error) => Err(size_error(field, text, error, expected)),
    }
}

/// Whether `text` is zero written with a valid unit ("0", "0MiB", "0.0 GiB").
fn is_zero_size(text: &str) -> bool {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    number.parse::<f64>() == Ok(0.0) && parse_size(&format!("1{unit}")).is_ok()
}

/// A `memory` value: a size, a percentage of the GPU's usable memory, or "rest".
pub(super) fn memory(field: &Field<'_, '_>) -> Result<MemoryAsk, Diagnostic> {
    let text = match field.value.get_ref() {
        DeValue::Integer(_) | DeValue::Float(_) => {
            return Err(field
                .wrong(MEMORY_EXPECTED)
                .with_hint(quote_with_unit_hint(field)))
        }
        _ => field.string(MEMORY_EXPECTED)?,
    };
    let trimmed = text.trim();
    if trimmed == "rest" {
        return Ok(MemoryAsk::Rest);
    }
    if let Some(number) = trimmed.strip_suffix('%') {
        let percent: f64 = number.trim().parse().map_err(|_| {
            field
                .wrong(MEMORY_EXPECTED)
                .with_hint("a percentage is a number followed by %, e.g. \"30%\" or \"12.5%\"")
        })?;
        if percent.is_nan() || percent <= 0.0 {
            return Err(field
                .error(format_args!("must be more than 0%, found \"{trimmed}\""))
                .with_hint(
                    "give a share between 0% and 100% of the GPU's usable memory, e.g. \"10%\"",
                ));
        }
        if percent > 100.0 {
            return Err(field
                .error(format_args!("must be at most 100%, found \"{trimmed}\""))
                .with_hint("a percentage is a share of one GPU's usable memory (after `reserve`); use \"100%\" or less, or an absolute size"));
        }
        return Ok(MemoryAsk::Percent(percent));
    }
    parse_size(text)
        .map(MemoryAsk::Bytes)
        .map_err(|error| size_error(field, text, error, MEMORY_EXPECTED))
}

/// What `ready` accepts, for messages.
const READY_EXPECTED: &str = "\"started\", \"exit\", \"log:REGEX\" or \"port:PORT\"";

/// A `ready` value: `started`, `exit`, `log:REGEX` (checked to compile) or `port:PORT`.
pub(super) fn ready(field: &Field<'_, '_>) -> Result<ReadyWhen, Diagnostic> {
    let text = field.string(READY_EXPECTED)?;
    let hint = "write ready = \"started\" (default), \"exit\" (a set-up step that must succeed), \"log:listening on\" (a line of its output matches the regex) or \"port:8476\" (127.0.0.1:8476 accepts connections)";
    match text.split_once(':') {
        None if text == "started" => Ok(ReadyWhen::Started),
        None if text == "exit" => Ok(ReadyWhen::Exit),
        Some(("log", pattern)) => match regex::Regex::new(pattern) {
            Ok(_) if !pattern.is_empty() => Ok(ReadyWhen::LogLine(pattern.to_string())),
            Ok(_) => Err(field
                .error("has an empty pattern after `log:`")
                .with_hint(hint)),
            Err(error) => {
                let reason = error.to_string();
                let last = reason
                    .lines()
                    .last()
                    .unwrap_or("invalid")
                    .trim()
                    .to_string();
                Err(field
                    .error(format_args!("is not a valid regex after `log:` ({last})"))
                    .with_hint("escape regex characters with a backslash, e.g. \"log:ready \\\\(rank 0\\\\)\""))
            }
        },
        Some(("port", port)) => match port.trim().parse::<u16>() {
            Ok(port) if port > 0 => Ok(ReadyWhen::Port(port)),
            _ => Err(field
                .error(format_args!(
                    "names port `{port}`, which is not a port number from 1 to 65535"
                ))
                .with_hint(hint)),
        },
        _ => Err(field.wrong(READY_EXPECTED).with_hint(hint)),
    }
}

/// Reads `command`, which is an argv array, or (with `shell = true`) a shell command line.
pub(super) fn command(
    source: Source<'_>,
    field: &Field<'_, '_>,
    shell: bool,
) -> Result<Command, Diagnostic> {
    let value = field.value;
    match value.get_ref() {
        DeValue::String(text) if text.trim().is_empty() => Err(field.error("is empty").with_hint(if shell {
            "give the command line for /bin/sh -c, e.g. command = \"python train.py | tee train.log\""
        } else {
            "give the program and its arguments, e.g. command = [\"python\", \"train.py\"]"
        })),
        DeValue::String(text) if shell => {
            check_placeholders(source, field, value, text)?;
            let what = format!("`{}` in {}", field.key, field.table);
            check_passable(source, value.span(), &what, text, text.len())?;
            Ok(Command::Shell(text.to_string()))
        }
        DeValue::String(text) => {
            let hint = if text.contains(SHELL_CHARACTERS) {
                "this looks like a shell command line: set shell = true to run it with /bin/sh -c".to_string()
            } else {
                let words: Vec<String> = text.split_whitespace().map(|word| format!("{word:?}")).collect();
                format!(
                    "write it as an array of arguments: command = [{}], or set shell = true to run the string with /bin/sh -c",
                    words.join(", ")
                )
            };
            Err(field.wrong("an array of strings (the program and its arguments)").with_hint(hint))
        }
        DeValue::Array(elements) if shell => {
            let words: Vec<&str> = elements.iter().filter_map(|element| element.get_ref().as_str()).collect();
            Err(field.wrong("a string when shell = true").with_hint(format!(
                "write one command line: command = {:?}, or remove shell = true to run the array directly",
                words.join(" ")
            )))
        }
        DeValue::Array(elements) => {
            if elements.is_empty() {
                return Err(field
                    .error("is an empty array")
                    .with_hint("give the program and its arguments, e.g. command = [\"python\", \"train.py\"]"));
            }
            let mut argv = Vec::with_capacity(elements.len());
            for (index, element) in elements.iter().enumerate() {
                let DeValue::String(word) = element.get_ref() else {
                    let found = source.describe(element);
                    let written = source.text.get(element.span()).unwrap_or("");
                    return Err(source
                        .error(
                            element.span(),
                            format!("`{}` in {} must be an array of strings; element {} is {found}", field.key, field.table, index + 1),
                        )
                        .with_hint(format!("quote it: \"{written}\"")));
                };
                if index == 0 && word.trim().is_empty() {
                    return Err(source
                        .error(element.span(), format!("`{}` in {} starts with an empty program name", field.key, field.table))
                        .with_hint("the first element is the program to run, e.g. \"python\""));
                }
                check_placeholders(source, field, element, word)?;
                let what = format!("element {} of `{}` in {}", index + 1, field.key, field.table);
                check_passable(source, element.span(), &what, word, word.len())?;
                argv.push(word.to_string());
            }
            Ok(Command::Argv(argv))
        }
        _ if shell => Err(field.wrong("a string (the command line for /bin/sh -c)")),
        _ => Err(field.wrong("an array of strings (the program and its arguments)")),
    }
}

/// Reads `env`: a table of NAME = "value" strings.
pub(super) fn env(
    source: Source<'_>,
    field: &Field<'_, '_>,
) -> Result<BTreeMap<String, String>, Diagnostic> {
    let table = field.table("a table of NAME = \"value\" strings")?;
    let mut env = BTreeMap::new();
    for (name, value) in entries_in_file_order(table) {
        let name_text: &str = name.get_ref();
        if name_text.is_empty() || name_text.contains(['=', '\0']) {
            return Err(source
                .error(
                    name.span(),
                    format!(
                        "`env` in {} has an invalid variable name {name_text:?}",
                        field.table
                    ),
                )
                .with_hint("a variable name must be non-empty and contain no `=`"));
        }
        let DeValue::String(text) = value.get_ref() else {
            let written = source.text.get(value.span()).unwrap_or("");
            return Err(source
                .error(
                    value.span(),
                    format!(
                        "`env.{name_text}` in {} must be a string, found {}",
                        field.table,
                        source.describe(value)
                    ),
                )
                .with_hint(format!(
                    "environment values are strings; quote it: {name_text} = \"{written}\""
                )));
        };
        check_placeholders(source, field, value, text)?;
        let what = format!("`env.{name_text}` in {}", field.table);
        let bytes = name_text.len() + 1 + text.len();
        check_passable(source, value.span(), &what, text, bytes)?;
        env.insert(name_text.to_string(), text.to_string());
    }
    Ok(env)
}

/// Refuses a `{name}` placeholder other than `{replica}` in the string `value` (decoded text
/// `text`), pointing at the placeholder itself where the string is written without escapes.
fn check_placeholders(
    source: Source<'_>,
    field: &Field<'_, '_>,
    value: &Spanned<DeValue<'_>>,
    text: &str,
) -> Result<(), Diagnostic> {
    let Some(unknown) = find_unknown_placeholder(text) else {
        return Ok(());
    };
    let span = value.span();
    let written = source.text.get(span.clone()).unwrap_or("");
    // Between the quotes, the file holds the decoded text when the string has no escapes.
    let range: Range<usize> =
        if written.len() == text.len() + 2 && &written[1..written.len() - 1] == text {
            span.start + 1 + unknown.range.start..span.start + 1 + unknown.range.end
        } else {
            span
        };
    let near = suggest(&unknown.name, ["replica"])
        .map_or(String::new(), |_| "did you mean `{replica}`? ".to_string());
    Err(source
        .error(
            range,
            format!(
                "`{}` in {} uses unknown placeholder `{{{}}}`",
                field.key, field.table, unknown.name
            ),
        )
        .with_hint(format!(
            "{near}only `{{replica}}` is substituted; write `{{{{` for a literal `{{`"
        )))
}

#[cfg(test)]
mod tests {
    use super::is_zero_size;

    #[test]
    fn recognises_written_zero_sizes() {
        assert!(is_zero_size("0"));
        assert!(is_zero_size("0GiB"));
        assert!(is_zero_size("0.0 MiB"));
        assert!(!is_zero_size("0XB"));
        assert!(!is_zero_size("-1GiB"));
        assert!(!is_zero_size("0.0000001B"));
    }
}
