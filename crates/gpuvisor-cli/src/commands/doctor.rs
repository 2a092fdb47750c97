//! `gpuvisor doctor` (in progress).

use std::process::ExitCode;

use crate::cli::DoctorArgs;
use crate::failure::Failure;

/// Runs the machine checks.
pub fn run(_args: DoctorArgs) -> Result<ExitCode, Failure> {
    Err(Failure::unavailable("doctor is not built yet"))
}
