//! Wall-clock timestamps as RFC 3339 UTC text with milliseconds (`2026-11-21T23:25:16.123Z`),
//! without a date-time crate: the event log and the log files need only this one format.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, now.
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}

/// `unix_ms` as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn rfc3339_ms(unix_ms: u64) -> String {
    let (date, time) = split(unix_ms);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        date.0, date.1, date.2, time.0, time.1, time.2, time.3
    )
}

/// `unix_ms` as `YYYYMMDDTHHMMSSZ`, for directory names (sorts by time, no colons).
pub fn compact_utc(unix_ms: u64) -> String {
    let (date, time) = split(unix_ms);
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        date.0, date.1, date.2, time.0, time.1, time.2
    )
}

type Date = (i64, u32, u32);
type Time = (u64, u64, u64, u64);

fn split(unix_ms: u64) -> (Date, Time) {
    let millis = unix_ms % 1000;
    let seconds = unix_ms / 1000;
    let days = (seconds / 86_400) as i64;
    let of_day = seconds % 86_400;
    (
        civil_from_days(days),
        (of_day / 3600, of_day % 3600 / 60, of_day % 60, millis),
    )
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> Date {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A duration in milliseconds as `1h02m`, `3m05s`, `12.3s` or `250ms`, for tables.
pub fn human_duration(ms: u64) -> String {
    let seconds = ms / 1000;
    if seconds >= 3600 {
        format!("{}h{:02}m", seconds / 3600, seconds % 3600 / 60)
    } else if seconds >= 60 {
        format!("{}m{:02}s", seconds / 60, seconds % 60)
    } else if ms >= 1000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        // 2026-11-21T23:25:16.123Z, checked with `date -u -d @1795303516`.
        assert_eq!(rfc3339_ms(1_795_303_516_123), "2026-11-21T23:25:16.123Z");
        // A leap day.
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(compact_utc(1_795_303_516_123), "20261121T232516Z");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human_duration(250), "250ms");
        assert_eq!(human_duration(12_345), "12.3s");
        assert_eq!(human_duration(185_000), "3m05s");
        assert_eq!(human_duration(3_720_000), "1h02m");
    }
}
