//! Byte sizes as tools print them in logs: `2.00 GiB`, `17.55G`, `20.00 MiB`, `12884901888`.
//!
//! CUDA tools print binary units, with or without the `i` (XLA writes `17.55G` for GiB), so `K`,
//! `M`, `G`, `T` are read as powers of 1024 here; `KB`/`MB`/`GB` too, because the frameworks that
//! print them mean binary units as well.

/// Parses a size as printed in a log; a bare number is bytes. None when it is not a size.
pub fn parse_log_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.replace(',', "").parse().ok()?;
    let unit = unit.trim().trim_end_matches("ytes").trim_end_matches("yte");
    let scale: f64 = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1.0,
        "K" | "KB" | "KIB" => 1024.0,
        "M" | "MB" | "MIB" => 1024.0 * 1024.0,
        "G" | "GB" | "GIB" => 1024.0 * 1024.0 * 1024.0,
        "T" | "TB" | "TIB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let bytes = number * scale;
    // Guard the cast: a log can print anything.
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_log_size;

    const GIB: u64 = 1 << 30;

    #[test]
    fn reads_the_forms_frameworks_print() {
        assert_eq!(parse_log_size("2.00 GiB"), Some(2 * GIB));
        assert_eq!(parse_log_size("20.00 MiB"), Some(20 << 20));
        assert_eq!(parse_log_size("12884901888"), Some(12 * GIB));
        assert_eq!(parse_log_size("12884901888 bytes"), Some(12 * GIB));
        assert_eq!(parse_log_size("1.50G"), Some(3 * GIB / 2));
        assert_eq!(parse_log_size("512B"), Some(512));
        assert_eq!(parse_log_size("1,024 KiB"), Some(1 << 20));
    }

    #[test]
    fn refuses_what_is_not_a_size() {
        assert_eq!(parse_log_size(""), None);
        assert_eq!(parse_log_size("GiB"), None);
        assert_eq!(parse_log_size("12 parsecs"), None);
        assert_eq!(parse_log_size("1e999"), None);
    }
}
