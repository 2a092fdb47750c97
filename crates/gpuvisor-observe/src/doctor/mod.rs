//! `gpuvisor doctor`: is this machine fit to run a job?
//!
//! Split in three so the judgement is testable without a GPU: [`probe`] gathers [`facts`]
//! (NVML or a simulated inventory, /proc, statvfs, a short `python3` run, the environment),
//! [`checks`] turns facts into [`Finding`]s — pure functions — and [`render`] prints them.
//! Anything that could not be looked at becomes a "could not check" finding, never a failure
//! of the command.

pub mod checks;
pub mod facts;
pub mod probe;
pub mod render;

use serde::Serialize;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Works, but something will bite (slow start, a variable that fights the plan).
    Warn,
    /// Will break a job until fixed.
    Fail,
    /// Could not be checked here (no driver, no python3); says why.
    Skip,
}

impl Status {
    /// The word printed in the status column.
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// What was checked: `driver`, `gpu 0`, `python`, `torch`, `/dev/shm`, `disk /data`,
    /// `env XLA_PYTHON_CLIENT_MEM_FRACTION` ...
    pub check: String,
    /// The outcome.
    pub status: Status,
    /// What was found, with the numbers.
    pub summary: String,
    /// What to do about it (for warn / fail / skip).
    pub fix: Option<String>,
}

impl Finding {
    /// A finding without a fix.
    pub fn new(check: impl Into<String>, status: Status, summary: impl Into<String>) -> Self {
        Finding {
            check: check.into(),
            status,
            summary: summary.into(),
            fix: None,
        }
    }

    /// The same finding with a fix.
    pub fn with_fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

/// Everything doctor found, in check order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The findings.
    pub findings: Vec<Finding>,
}

impl Report {
    /// Whether any finding is a failure (the command then exits 1).
    pub fn has_failures(&self) -> bool {
        self.findings.iter().any(|f| f.status == Status::Fail)
    }

    /// How many findings have `status`.
    pub fn count(&self, status: Status) -> usize {
        self.findings.iter().filter(|f| f.status == status).count()
    }
}
