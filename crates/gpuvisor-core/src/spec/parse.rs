//! Job-file parsing and validation (text -> [`JobSpec`]).

use std::path::Path;

use super::{Diagnostic, JobSpec};

/// Parses and validates the text of a job file. `path` is only used in diagnostics and to name
/// the job when `[job] name` is absent.
pub fn parse_job(path: &Path, source: &str) -> Result<JobSpec, Diagnostic> {
    let _ = source;
    Err(Diagnostic::whole_file(
        path,
        "job-file parsing is not written yet",
    ))
}

/// Reads and parses the job file at `path`.
pub fn read_job_file(path: &Path) -> Result<JobSpec, Diagnostic> {
    let source = std::fs::read_to_string(path).map_err(|error| {
        Diagnostic::whole_file(path, format!("cannot read the job file: {error}"))
    })?;
    parse_job(path, &source)
}
