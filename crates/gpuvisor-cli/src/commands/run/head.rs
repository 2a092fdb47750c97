//! `gpuvisor run JOB` inside a Slurm allocation: the head of a multi-node run. What it does
//! is `gpuvisor_runtime::head::run`; this maps the arguments onto its options, shows what it
//! says (lines, the preflight table, the `--tui` live view) and prints how the job ended.

use std::path::Path;
use std::process::ExitCode;

use gpuvisor_core::spec::JobSpec;
use gpuvisor_runtime::head::{self, Console, Options, Outcome};
use gpuvisor_runtime::slurm::Allocation;
use gpuvisor_runtime::RuntimeError;
use gpuvisor_supervisor::cluster::wire::{ProbeResult, ProbeTarget};

use super::RunArgs;
use crate::failure::Failure;
use crate::table::Table;

/// Runs the job across the allocation's nodes.
pub fn head(args: &RunArgs, job: JobSpec, allocation: Allocation) -> Result<ExitCode, Failure> {
    let options = Options {
        job_path: args.job.clone(),
        run_dir: args.run_dir.clone(),
        metrics: args.metrics,
        srun_args: args.srun_args.clone(),
        simulate: args.inventory.simulate.clone(),
        quiet: args.quiet || args.tui,
        gpuvisor: std::env::current_exe()?,
    };
    let mut console = Terminal {
        tui: args.tui,
        view: None,
    };
    match head::run(&job, &allocation, &options, &mut console)? {
        Outcome::Ended { summary, failures } => {
            for (node, why) in &failures {
                eprintln!("gpuvisor: node {node} failed: {why}");
            }
            eprint!("{}", super::render_summary(&summary));
            Ok(ExitCode::from(summary.status))
        }
        Outcome::StoppedInPreflight { status, round } => {
            eprintln!(
                "gpuvisor: stopped during the preflight; {}",
                if round == 0 {
                    "nothing was started"
                } else {
                    "the job was not started again"
                }
            );
            Ok(ExitCode::from(status))
        }
    }
}

/// The head's console: stderr, and with `--tui` the live view over the run directory.
struct Terminal {
    tui: bool,
    view: Option<super::tui::Tui>,
}

impl Console for Terminal {
    fn record_ready(&mut self, run: &Path) -> Result<bool, RuntimeError> {
        if self.tui {
            // The view reads the run directory and the head's control socket, which answers
            // for every node (no local GPU probe: this machine's GPUs are not the job's).
            let view = super::tui::Tui::start(run, true).map_err(super::into_runtime)?;
            self.view = Some(view);
        }
        Ok(self.view.is_some())
    }

    fn say(&mut self, line: &str) {
        eprintln!("{line}");
    }

    fn preflight(&mut self, targets: &[ProbeTarget], results: &[(String, Vec<ProbeResult>)]) {
        eprint!("{}", preflight_table(targets, results));
    }

    fn finish_view(&mut self) {
        if let Some(view) = self.view.take() {
            view.finish();
        }
    }
}

/// The per-node preflight table.
fn preflight_table(targets: &[ProbeTarget], results: &[(String, Vec<ProbeResult>)]) -> String {
    let mut header = vec!["NODE".to_string()];
    header.extend(
        targets
            .iter()
            .map(|target| format!("{} @ {}:{}", target.world, target.host, target.port)),
    );
    let mut table = Table::new(&header.iter().map(String::as_str).collect::<Vec<_>>());
    for (node, probed) in results {
        let mut row = vec![node.clone()];
        for target in targets {
            let cell = match probed.iter().find(|result| &result.target == target) {
                Some(ProbeResult { ms: Some(ms), .. }) => format!("ok {ms} ms"),
                Some(ProbeResult {
                    error: Some(error), ..
                }) => format!("FAILED: {error}"),
                _ => "?".to_string(),
            };
            row.push(cell);
        }
        table.row(row);
    }
    format!(
        "gpuvisor: preflight (every node to every coordinator):\n{}",
        table.render("  ")
    )
}
