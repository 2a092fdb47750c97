//! The `restart` and `stop` sections of a process, and the duration strings they use.

use super::reader::{suggest, Field, Source, Table};
use super::{Diagnostic, RestartPolicy, RestartSpec, StopSpec};

/// Keys accepted in `[process.NAME.restart]`.
pub(super) const RESTART_KEYS: &[&str] = &[
    "policy",
    "max_restarts",
    "window",
    "backoff",
    "backoff_max",
    "restart_dependents",
    "ends_job",
];

/// Keys accepted in `[process.NAME.stop]`.
pub(super) const STOP_KEYS: &[&str] = &["signal", "grace"];

/// Policies as written in job files.
const POLICIES: &[(&str, RestartPolicy)] = &[
    ("no", RestartPolicy::No),
    ("on-failure", RestartPolicy::OnFailure),
    ("always", RestartPolicy::Always),
];

/// Signals a process may be stopped with, canonical names.
const SIGNALS: &[&str] = &[
    "SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGKILL",
];

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// No leading integer.
    #[error("does not start with a whole number")]
    NotANumber,
    /// A number with no unit.
    #[error("has no unit")]
    NoUnit,
    /// A unit other than ms, s, m, h.
    #[error("has unknown unit `{0}`")]
    UnknownUnit(String),
    /// More milliseconds than fit in 64 bits.
    #[error("is too long")]
    TooLong,
}

/// Parses a duration written as a whole number and a unit: `500ms`, `10s`, `2m`, `1h`.
/// Returns milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, DurationError> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    if number.is_empty() {
        return Err(DurationError::NotANumber);
    }
    let number: u64 = number.parse().map_err(|_| DurationError::TooLong)?;
    let unit_ms = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "" => return Err(DurationError::NoUnit),
        other => return Err(DurationError::UnknownUnit(other.to_string())),
    };
    number.checked_mul(unit_ms).ok_or(DurationError::TooLong)
}

/// Reads a duration field; `min_ms` is the smallest value allowed.
pub(super) fn duration(field: &Field<'_, '_>, min_ms: u64) -> Result<u64, Diagnostic> {
    let expected = "a duration such as \"500ms\", \"10s\", \"2m\" or \"1h\"";
    let text = match field.value.get_ref() {
        toml::de::DeValue::Integer(_) | toml::de::DeValue::Float(_) => {
            return Err(field.wrong(expected).with_hint(format!(
                "write the unit in a string: {} = \"{}s\"",
                field.key,
                field.value_text()
            )))
        }
        _ => field.string(expected)?,
    };
    let ms = parse_duration_ms(text).map_err(|error| {
        field
            .error(format_args!("must be {expected}; \"{text}\" {error}"))
            .with_hint("a duration is a whole number followed by ms, s, m or h, with no space: \"1500ms\", \"90s\"")
    })?;
    if ms < min_ms {
        return Err(field.error(format_args!(
            "must be at least {min_ms}ms, found \"{text}\""
        )));
    }
    Ok(ms)
}

/// Reads a restart policy string.
fn policy(field: &Field<'_, '_>) -> Result<RestartPolicy, Diagnostic> {
    let names: Vec<&str> = POLICIES.iter().map(|(name, _)| *name).collect();
    let expected = "one of \"no\", \"on-failure\", \"always\"";
    let text = field.string(expected)?;
    match POLICIES.iter().find(|(name, _)| *name == text) {
        Some((_, policy)) => Ok(*policy),
        None => {
            let error = field.wrong(expected);
            Err(match suggest(text, names) {
                Some(near) => error.with_hint(format!("did you mean \"{near}\"?")),
                None => error,
            })
        }
    }
}

/// Reads `restart`: a policy string, or a `[process.NAME.restart]` table.
pub(super) fn restart(
    source: Source<'_>,
    process_table: &str,
    field: Option<Field<'_, '_>>,
) -> Result<RestartSpec, Diagnostic> {
    let mut spec = RestartSpec::default();
    let Some(field) = field else { return Ok(spec) };
    if field.value.get_ref().is_str() {
        spec.policy = policy(&field)?;
        return Ok(spec);
    }
    let table = field.table("a policy string (\"no\", \"on-failure\", \"always\") or a table")?;
    let name = format!(
        "[{}.restart]",
        process_table.trim_matches(|c| c == '[' || c == ']')
    );
    let table = Table::new(source, &name, field.value_range(), table, RESTART_KEYS)?;
    spec.policy = match table.get("policy") {
        Some(field) => policy(&field)?,
        None => {
            return Err(table
                .error(format!("{name} has no `policy`"))
                .with_hint("add policy = \"on-failure\" (or \"always\", or \"no\")"))
        }
    };
    if let Some(field) = table.get("max_restarts") {
        spec.max_restarts = field.integer_in(0, 1_000_000).map_err(|error| {
            super::process::or_hint(error, "`max_restarts` counts restarts within `window`; for no restarts write policy = \"no\"")
        })? as u32;
    }
    if let Some(field) = table.get("window") {
        spec.window_ms = duration(&field, 1)?;
    }
    if let Some(field) = table.get("backoff") {
        spec.backoff_initial_ms = duration(&field, 0)?;
        // An explicit first delay longer than the default cap raises the cap with it, so writing
        // only `backoff = "2m"` is not an error.
        spec.backoff_max_ms = spec.backoff_max_ms.max(spec.backoff_initial_ms);
    }
    if let Some(field) = table.get("backoff_max") {
        spec.backoff_max_ms = duration(&field, 0)?;
        if spec.backoff_max_ms < spec.backoff_initial_ms {
            return Err(field
                .error(format_args!(
                    "must be at least `backoff` ({}ms), found {}ms",
                    spec.backoff_initial_ms, spec.backoff_max_ms
                ))
                .with_hint("backoff_max caps the delay that starts at backoff and doubles; raise it or lower backoff"));
        }
    }
    if let Some(field) = table.get("restart_dependents") {
        spec.restart_dependents = field.boolean()?;
    }
    if let Some(field) = table.get("ends_job") {
        spec.ends_job = field.boolean()?;
    }
    Ok(spec)
}

/// Reads the `[process.NAME.stop]` table.
pub(super) fn stop(
    source: Source<'_>,
    process_table: &str,
    field: Option<Field<'_, '_>>,
) -> Result<StopSpec, Diagnostic> {
    let mut spec = StopSpec::default();
    let Some(field) = field else { return Ok(spec) };
    let inner = process_table.trim_matches(|c| c == '[' || c == ']');
    let table = field.table("a table").map_err(|error| {
        error.with_hint(format!("write the stop settings as a table: [{inner}.stop] with signal = \"SIGTERM\", grace = \"30s\""))
    })?;
    let name = format!("[{inner}.stop]");
    let table = Table::new(source, &name, field.value_range(), table, STOP_KEYS)?;
    if let Some(field) = table.get("signal") {
        let expected =
            "a signal name (INT, TERM, HUP, QUIT, USR1, USR2, KILL, with or without SIG)";
        let text = field.string(expected)?;
        let upper = text.trim().to_ascii_uppercase();
        let canonical = if upper.starts_with("SIG") {
            upper
        } else {
            format!("SIG{upper}")
        };
        if !SIGNALS.contains(&canonical.as_str()) {
            let error = field.wrong(expected);
            return Err(match suggest(&canonical, SIGNALS.iter().copied()) {
                Some(near) => error.with_hint(format!("did you mean \"{near}\"?")),
                None => error.with_hint(format!("known signals: {}", SIGNALS.join(", "))),
            });
        }
        spec.signal = canonical;
    }
    if let Some(field) = table.get("grace") {
        spec.grace_ms = duration(&field, 0)?;
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("10s"), Ok(10_000));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
        assert_eq!(parse_duration_ms("0s"), Ok(0));
    }

    #[test]
    fn refuses_bad_durations() {
        assert_eq!(parse_duration_ms("s"), Err(DurationError::NotANumber));
        assert_eq!(
            parse_duration_ms("1.5s"),
            Err(DurationError::UnknownUnit(".5s".into()))
        );
        assert_eq!(parse_duration_ms("10"), Err(DurationError::NoUnit));
        assert_eq!(
            parse_duration_ms("3d"),
            Err(DurationError::UnknownUnit("d".into()))
        );
        assert_eq!(
            parse_duration_ms("99999999999999999999h"),
            Err(DurationError::TooLong)
        );
    }
}
