//! `gpuvisor explain`: known failures in logs, from the knowledge base in gpuvisor-observe.

use std::fs::File;
use std::io::{self, IsTerminal};
use std::process::ExitCode;

use gpuvisor_observe::explain::render::render;
use gpuvisor_observe::explain::sources::{resolve, LogSource};
use gpuvisor_observe::explain::{KnowledgeBase, Report};

use crate::cli::ExplainArgs;
use crate::failure::Failure;

/// Explains each log the argument names and prints the findings.
pub fn run(args: ExplainArgs) -> Result<ExitCode, Failure> {
    let input = match args.input {
        Some(input) => input,
        None if !io::stdin().is_terminal() => "-".to_string(),
        None => {
            return Err(Failure::bad_input(
                "no log to explain\n  hint: gpuvisor explain train.log, gpuvisor explain runs/<job>-<time>, or pipe a log: ... 2>&1 | gpuvisor explain",
            ))
        }
    };
    let sources = resolve(&input).map_err(Failure::bad_input)?;
    let knowledge = KnowledgeBase::builtin();
    let mut reports: Vec<Report> = Vec::with_capacity(sources.len());
    for source in &sources {
        let name = source.display_name();
        let report = match source {
            LogSource::Stdin => knowledge.explain_reader(&name, io::stdin().lock()),
            LogSource::File(path) => {
                File::open(path).and_then(|file| knowledge.explain_reader(&name, file))
            }
        }
        .map_err(|error| Failure::unavailable(format!("cannot read {name}: {error}")))?;
        reports.push(report);
    }
    if args.json {
        let json = serde_json::json!({ "reports": reports });
        println!(
            "{}",
            serde_json::to_string_pretty(&json).map_err(Failure::unavailable)?
        );
    } else {
        print!("{}", render(&reports));
    }
    Ok(ExitCode::SUCCESS)
}
