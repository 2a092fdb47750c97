//! The human form of doctor's report: one line per finding, its fix underneath.

use std::fmt::Write;

use super::{Report, Status};

/// Renders the report as aligned lines and a summary.
pub fn render(report: &Report) -> String {
    let width = report
        .findings
        .iter()
        .map(|f| f.check.len())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for finding in &report.findings {
        let _ = writeln!(
            out,
            "{:<4}  {:<width$}  {}",
            finding.status.label(),
            finding.check,
            finding.summary
        );
        if let Some(fix) = &finding.fix {
            let _ = writeln!(out, "{:<4}  {:<width$}  fix: {fix}", "", "");
        }
    }
    let _ = writeln!(
        out,
        "\n{} ok, {} warn, {} fail, {} could not check",
        report.count(Status::Ok),
        report.count(Status::Warn),
        report.count(Status::Fail),
        report.count(Status::Skip)
    );
    out
}
