//! `gpuvisor top [RUN]`: the live terminal view of a run, or without RUN of every process
//! holding GPU memory on this machine. The UI lives in `gpuvisor_observe::top`; this file
//! picks the source and opens its GPUs' (a gpuvisor-probe `GpuSource`: NVML's full reads, or
//! the simulated inventory as a fixed reading).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use gpuvisor_observe::top::terminal::{
    render_once, run_interactive, screen_size, LoopEnd, LoopOptions,
};
use gpuvisor_observe::top::{MachineSource, RunSource, TopSource};
use gpuvisor_probe::gpu_source::FixedReading;
use gpuvisor_probe::{GpuReading, GpuSource, NvmlGpus};

use crate::cli::TopArgs;
use crate::failure::Failure;
use crate::inventory::{load_inventory, no_driver, open_nvml};

/// Where runs are, relative to the current directory (as `gpuvisor run` makes them).
const RUNS_DIR: &str = "runs";
/// `--once` size when standard output is not a terminal.
const ONCE_SIZE: (u16, u16) = (120, 40);

/// Shows the run or the machine until `q`, or one frame with `--once`.
pub fn run(args: TopArgs) -> Result<ExitCode, Failure> {
    let simulate = args.inventory.simulate.as_deref();
    let mut source: Box<dyn TopSource> = match &args.run {
        Some(run) => {
            let run = resolve_run(run)?;
            // A run's GPUs come from its plan; reading them only adds live usage and
            // utilisation, so a machine without NVML (or a simulated run) goes without.
            let gpus = if simulate.is_some() {
                None
            } else {
                nvml_if_available()
            };
            Box::new(RunSource::new(run, gpus))
        }
        None => {
            let (gpus, note) = machine_gpus(simulate)?;
            Box::new(MachineSource::new(gpus, note))
        }
    };
    if args.once {
        let (width, height) = screen_size().unwrap_or(ONCE_SIZE);
        print!("{}", render_once(source.as_mut(), width, height));
        return Ok(ExitCode::SUCCESS);
    }
    if !std::io::stdout().is_terminal() {
        return Err(Failure::bad_input(
            "standard output is not a terminal, so there is nothing to draw the live view on",
        )
        .with_hint("`gpuvisor top --once` prints one frame as text"));
    }
    let options = LoopOptions {
        interval: Duration::from_millis(args.interval_ms.max(50)),
        ..LoopOptions::default()
    };
    match run_interactive(source.as_mut(), &options)? {
        // Nobody is left to read a message; the status says it.
        LoopEnd::TerminalGone(_) => Ok(ExitCode::from(1)),
        LoopEnd::Quit | LoopEnd::Finished => Ok(ExitCode::SUCCESS),
    }
}

/// A run directory given as a path, or as a name under ./runs.
fn resolve_run(run: &str) -> Result<PathBuf, Failure> {
    gpuvisor_record::resolve_run(Some(Path::new(run)), Path::new(RUNS_DIR)).map_err(|_| {
            Failure::bad_input(format!(
                "{run} is not a run directory (neither it nor ./{RUNS_DIR}/{run} has events.jsonl)"
            ))
            .with_hint(format!("give the directory `gpuvisor run` printed, e.g. {RUNS_DIR}/<job>-<time>; without RUN, top shows every GPU process of this machine"))
        })
}

/// The machine-wide view's GPUs: NVML (one handle for the whole session) or the simulated
/// inventory, with a note saying which.
fn machine_gpus(simulate: Option<&str>) -> Result<(Box<dyn GpuSource>, String), Failure> {
    if let Some(spec) = simulate {
        // Read once here so a bad spec is an error, not a status line; it does not change.
        let reading = GpuReading::from_inventory(&load_inventory(Some(spec))?);
        return Ok((
            Box::new(FixedReading(reading)),
            format!("simulated: {spec}"),
        ));
    }
    // The same message as `gpuvisor gpus` when there is no driver or it cannot be read.
    let gpus = open_nvml()?;
    gpus.read_inventory().map_err(no_driver)?;
    Ok((Box::new(gpus.for_viewing()), "NVML".to_string()))
}

/// NVML for viewing when there is a driver (a run's view goes without otherwise).
pub(crate) fn nvml_if_available() -> Option<Box<dyn GpuSource>> {
    NvmlGpus::open()
        .ok()
        .map(|gpus| Box::new(gpus.for_viewing()) as Box<dyn GpuSource>)
}
