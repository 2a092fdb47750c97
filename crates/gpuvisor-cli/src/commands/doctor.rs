//! `gpuvisor doctor`: machine checks from gpuvisor-observe, printed as lines or JSON.

use std::process::ExitCode;
use std::time::Duration;

use gpuvisor_observe::doctor::checks::run_checks;
use gpuvisor_observe::doctor::probe::{gather, ProbeOptions};
use gpuvisor_observe::doctor::render::render;

use crate::cli::DoctorArgs;
use crate::failure::Failure;

/// Runs every check; exits 1 when any finding is a failure.
pub fn run(args: DoctorArgs) -> Result<ExitCode, Failure> {
    let options = ProbeOptions {
        simulate: args.inventory.simulate,
        python: args.python,
        python_timeout: Duration::from_secs(args.python_timeout),
        paths: args.paths,
    };
    let facts = gather(&options).map_err(Failure::bad_input)?;
    let report = run_checks(&facts);
    if args.json {
        let json = serde_json::json!({ "facts": facts, "findings": report.findings });
        println!(
            "{}",
            serde_json::to_string_pretty(&json).map_err(Failure::unavailable)?
        );
    } else {
        print!("{}", render(&report));
    }
    Ok(if report.has_failures() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
