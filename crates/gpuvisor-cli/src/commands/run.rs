//! `gpuvisor run JOB`: plan, check every replica's working directory, program and script
//! (`gpuvisor_runtime::prestart`), create the run directory, start and supervise every replica, then print the
//! exit summary; with `--detach`, the same in the background (`run/detach.rs`). Also the
//! hidden `__keeper` that stands between `run` and each replica (see
//! gpuvisor_supervisor::keeper).

use std::path::Path;
use std::process::ExitCode;

use gpuvisor_core::inventory::{Inventory, InventorySource};
use gpuvisor_core::size::ByteSize;
use gpuvisor_core::spec::{read_job_file, DeviceKind, Diagnostic, Enforcement, JobSpec};
use gpuvisor_supervisor::clock::human_duration;
use gpuvisor_supervisor::rundir::{RunDir, RunDirError, DEFAULT_RUNS};
use gpuvisor_supervisor::supervisor::{supervise, Options, Outcome, Readiness};
use regex::bytes::Regex;

mod detach;
mod head;
mod tui;

use crate::cli::{AgentArgs, KeeperArgs, RunArgs};
use crate::failure::{hinted, Failure};
use crate::inventory::load_inventory;
use crate::shim;
use crate::table::Table;
use gpuvisor_probe::sampler_source::sampler_source;
use gpuvisor_runtime::enforce as ledger;
use gpuvisor_runtime::launch::RunEnv;
use gpuvisor_runtime::replicas::{
    check_exec_size, give_environment, local_coordinators, replica_specs, spare_groups,
};
use gpuvisor_runtime::safe_path;
use gpuvisor_runtime::sampling::{bind_metrics, watch_config, WithSource};
use gpuvisor_runtime::{agent, book, prestart, slurm};

/// Runs the keeper (never returns).
pub fn keeper(args: KeeperArgs) -> Result<ExitCode, Failure> {
    gpuvisor_supervisor::keeper::run(args.parent, &args.command)
}

/// Runs `gpuvisor __agent` (gpuvisor_runtime::agent) with what is the binary's: the
/// inventory (NVML or `--simulate`), the embedded libraries, the sampler's GPU source, stderr.
pub fn agent(args: AgentArgs) -> Result<ExitCode, Failure> {
    let install = |with_simulator| {
        let libraries = shim::install(with_simulator).map_err(into_runtime)?;
        Ok(agent::Libraries {
            shim: libraries.shim.clone(),
            sim_dir: libraries.sim_dir.clone(),
            keep: Box::new(libraries),
        })
    };
    let support = agent::NodeSupport {
        inventory: &|job, simulate| job_inventory(job, simulate).map_err(into_runtime),
        install: &install,
        gpu_source: &|state, sim_dir, inventory| sampler_source(state, sim_dir, inventory),
        console: |line| eprintln!("{line}"),
        keeper: gpuvisor_supervisor::keeper::command_beside(&std::env::current_exe()?),
    };
    Ok(ExitCode::from(agent::agent(&args.head, &support)?))
}

/// A failure of the binary's part, for the agent to say to its head (the message already
/// carries its hint).
fn into_runtime(failure: Failure) -> gpuvisor_runtime::RuntimeError {
    match failure {
        Failure::BadInput(what) => gpuvisor_runtime::RuntimeError::Refused { what, hint: None },
        Failure::Unavailable(what) => {
            gpuvisor_runtime::RuntimeError::Unavailable { what, hint: None }
        }
    }
}

/// Runs the job to its end.
pub fn run(args: RunArgs) -> Result<ExitCode, Failure> {
    let job = read_job_file(&args.job).map_err(Failure::bad_input)?;
    if args.detach {
        if !args.local && slurm::Allocation::from_env()?.is_some() {
            return Err(Failure::bad_input("--detach is for runs on one machine; under Slurm the batch job is what runs detached").with_hint("`gpuvisor submit JOB` hands the job to sbatch; or run with --local to use this machine only"));
        }
        return detach::start(&args, &job.name);
    }
    say_warnings(&job);
    let readiness = parse_readiness(&args.ready, &job)?;
    if !args.local {
        if let Some(allocation) = slurm::Allocation::from_env()? {
            if !args.ready.is_empty() {
                return Err(Failure::bad_input("--ready is for runs on one machine; under Slurm, write `ready` in the job file's [process.NAME] (every node reads the job file)").with_hint("or run with --local to use this machine only"));
            }
            if args.tui {
                tui::check_terminal()?;
            }
            return head::head(&args, job, allocation);
        }
    }
    if args.tui {
        tui::check_terminal()?;
    }
    let inventory = job_inventory(&job, args.inventory.simulate.as_deref())?;
    let run_dir_path = args
        .run_dir
        .clone()
        .unwrap_or_else(|| RunDir::default_path(Path::new(DEFAULT_RUNS), &job.name));
    // Planned against what other runs on this machine booked, and booked at once (under the
    // record's lock); the booking goes when it drops: with the supervisor's options at the end,
    // or here on a refusal.
    let say = |line: &str| eprintln!("{line}");
    let record = book::record_for(args.inventory.simulate.is_some(), &say);
    let (plan, booking) = book::plan_and_book(
        &job,
        &inventory,
        record.as_ref(),
        &run_dir_path,
        args.wait,
        &say,
    )?;
    let mut env = RunEnv::new(plan.enforcement);
    env.coordinators = local_coordinators(&plan)?;
    let mut replicas = replica_specs(&job, &plan, &args.job, &readiness, &env)?;
    // Everything that can be refused is checked before anything is created (exit 2, nothing
    // left behind): the working directories, programs and scripts (all problems at once),
    // then the size of each start, then the metrics port, held from here on.
    if let Some(problems) = Diagnostic::all(prestart::problems(&job, &plan.replicas)) {
        return Err(Failure::bad_input(problems));
    }
    check_exec_size(&job, &replicas)?;
    let metrics = args.metrics.map(bind_metrics).transpose()?;
    // The shim (and with --simulate the stand-in driver) are written out before anything
    // starts, so a failure here starts nothing.
    let libraries = match (plan.enforcement, args.inventory.simulate.is_some()) {
        (Enforcement::Framework, false) => None,
        (_, with_simulator) => Some(shim::install(with_simulator)?),
    };
    // Owner-only and checked from `/` down: the supervisor (often root) writes its record and
    // control socket there.
    let run_dir_path = safe_path::private_run_dir(&run_dir_path)?;
    let run_dir = RunDir::create(&run_dir_path).map_err(|error| match error {
        RunDirError::InUse { .. } => Failure::bad_input(error),
        RunDirError::Unwritable { .. } => Failure::unavailable(error),
    })?;
    if args.detached {
        // From here on the run speaks to its console file, not to whoever started it.
        detach::redirect_console(run_dir.path())?;
    }
    let plan_json = serde_json::to_string_pretty(&plan).map_err(Failure::unavailable)?;
    run_dir.write_plan(&plan_json)?;
    eprintln!(
        "gpuvisor: running job {} ({} replicas); record in {}",
        job.name,
        replicas.len(),
        run_dir.path().display()
    );
    let keeper = gpuvisor_supervisor::keeper::command_beside(&std::env::current_exe()?);
    let mut options = Options::new(&job.name, Some(keeper));
    options.terminal = !args.quiet && !args.tui;
    options.console = !args.tui;
    options.sampler_interval = std::time::Duration::from_millis(job.sample_interval_ms);
    options.metrics = metrics;
    options.watch = watch_config(&job, &plan);
    options.queue = gpuvisor_core::plan::admit::queue_setup(&job, &plan);
    options.holdings = Some(gpuvisor_core::plan::resize::Holdings::of(
        &plan,
        job.gpus.context_overhead_bytes,
    ));
    options.gpu_indices = plan.gpus.iter().map(|gpu| gpu.index).collect();
    options.host_booking = record
        .zip(booking)
        .map(|(record, held)| book::host_booking(record, held, &plan));
    env.shim = libraries.as_ref().map(|libraries| libraries.shim.clone());
    let sim_dir = libraries.as_ref().and_then(|l| l.sim_dir.as_deref());
    // The ledger (with `enforce = "shim"`) and the simulator's state file (with `--simulate`),
    // made now, with spare groups for replicas added while the job runs (`queue add`).
    let mut ledger_hooks = ledger::prepare(
        &job.name,
        &plan,
        &inventory,
        env,
        sim_dir,
        spare_groups(&job),
    )?
    .with_console(Box::new(|line| eprintln!("{line}")));
    let sim_state = ledger_hooks.sim_state();
    give_environment(&mut replicas, &plan, ledger_hooks.env());
    if options.queue.is_some() {
        ledger_hooks = ledger_hooks.with_queue(&plan);
    }
    let mut hooks = WithSource {
        inner: ledger_hooks,
        source: Some(sampler_source(sim_state, sim_dir, &inventory)),
    };
    let view = match args.tui {
        true => Some(tui::Tui::start(
            run_dir.path(),
            args.inventory.simulate.is_some(),
        )?),
        false => None,
    };
    let outcome = supervise(replicas, &run_dir, options, &mut hooks);
    if let Some(view) = view {
        view.finish();
    }
    if outcome.is_err() {
        // Failed while setting up (the control socket, a thread): the ledger and the
        // simulator's state go now, not at the next run. (Removing them twice is harmless.)
        let _ = gpuvisor_supervisor::supervisor::Hooks::finish(&mut hooks);
    }
    let outcome = outcome?;
    // Not eprint!, which panics when stderr is a terminal that went away.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), render_summary(&outcome).as_bytes());
    Ok(ExitCode::from(outcome.status))
}

/// What the job file may not mean as written (sizes, `on_gpu_use = "kill"` without restarts),
/// on stderr: `run` and `plan` say it and go on.
pub(crate) fn say_warnings(job: &JobSpec) {
    let text: String = job
        .warnings
        .iter()
        .map(|warning| format!("warning: {warning}\n"))
        .collect();
    // Not eprint!, which panics when stderr is a terminal that went away.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), text.as_bytes());
}

/// `--metrics ADDR`: `HOST:PORT`, or a bare `PORT` on 127.0.0.1; a loopback address only
/// (checked with the arguments, before anything is created).
pub fn parse_metrics_address(text: &str) -> Result<std::net::SocketAddr, String> {
    let address = match text.parse::<u16>() {
        Ok(port) => std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Err(_) => text.parse().map_err(|_| {
            hinted(
                format!("`{text}` is not PORT or HOST:PORT"),
                "--metrics 9400 serves on 127.0.0.1:9400",
            )
        })?,
    };
    if !address.ip().is_loopback() {
        return Err(hinted(
            format!("{address} is not a loopback address"),
            "use 127.0.0.1:PORT (or just PORT); the metrics name your processes and are not authenticated",
        ));
    }
    Ok(address)
}

/// The GPUs the job is planned on: simulated, or NVML's; a job of CPU-only processes needs
/// no GPU, nor a driver to list them.
fn job_inventory(job: &JobSpec, simulate: Option<&str>) -> Result<Inventory, Failure> {
    let cpu_only_job = job
        .processes
        .iter()
        .all(|process| process.device == DeviceKind::Cpu);
    match load_inventory(simulate) {
        Err(_) if cpu_only_job && simulate.is_none() => Ok(Inventory {
            source: InventorySource::Nvml,
            driver_version: None,
            gpus: Vec::new(),
        }),
        result => result,
    }
}

/// `--ready NAME=WHEN` flags, checked against the job's processes.
fn parse_readiness(flags: &[String], job: &JobSpec) -> Result<Vec<(String, Readiness)>, Failure> {
    let hint = "write NAME=started, NAME=log:REGEX, NAME=port:PORT or NAME=exit";
    flags
        .iter()
        .map(|flag| {
            let (name, when) = flag.split_once('=').ok_or_else(|| {
                Failure::bad_input(format!("`--ready {flag}` names no process")).with_hint(hint)
            })?;
            if job.process(name).is_none() {
                let names: Vec<&str> = job.processes.iter().map(|p| p.name.as_str()).collect();
                return Err(Failure::bad_input(format!(
                    "`--ready {flag}`: no process `{name}` in job {}",
                    job.name
                ))
                .with_hint(format!("processes are: {}", names.join(", "))));
            }
            let readiness = match when.split_once(':') {
                None if when == "started" => Readiness::Started,
                None if when == "exit" => Readiness::Exit,
                Some(("log", pattern)) => {
                    Readiness::LogLine(Regex::new(pattern).map_err(|error| {
                        Failure::bad_input(format!(
                            "`--ready {flag}`: the pattern is not a regex: {error}"
                        ))
                        .with_hint(hint)
                    })?)
                }
                Some(("port", port)) => Readiness::Port(port.parse().map_err(|_| {
                    Failure::bad_input(format!(
                        "`--ready {flag}`: `{port}` is not a port number (1-65535)"
                    ))
                    .with_hint(hint)
                })?),
                _ => {
                    return Err(Failure::bad_input(format!(
                        "`--ready {flag}`: unknown readiness `{when}`"
                    ))
                    .with_hint(hint))
                }
            };
            Ok((name.to_string(), readiness))
        })
        .collect()
}

/// The exit summary: the verdict and why gpuvisor stopped the job, then per replica its
/// restarts, refusals, CPU-only violations, stalls, GPU peak, time waited in the queue (with
/// queued admission) and why it ended; then what a policy did, in words. (`exec`'s summary has
/// the same shape, per process.)
pub(crate) fn render_summary(outcome: &Outcome) -> String {
    let queued = outcome.makespan_ms.is_some();
    let mut headings = vec![
        "PROCESS",
        "RESTARTS",
        "REFUSED",
        "VIOLATIONS",
        "STALLS",
        "PEAK GPU / BUDGET",
        "RUN TIME",
    ];
    if queued {
        headings.push("WAITED");
    }
    headings.push("EXIT CAUSE");
    let mut table = Table::new(&headings);
    for row in &outcome.rows {
        let gpu = match (row.gpu_peak_bytes, row.budget_bytes) {
            (_, 0) => "-".to_string(),
            (Some(peak), budget) => format!("{} / {}", ByteSize(peak), ByteSize(budget)),
            (None, budget) => format!("? / {}", ByteSize(budget)),
        };
        let mut cells = vec![
            row.label.clone(),
            row.restarts.to_string(),
            row.seen.refusals.to_string(),
            row.seen.violations.to_string(),
            row.seen.stalls.to_string(),
            gpu,
            human_duration(row.run_ms),
        ];
        if queued {
            cells.push(human_duration(row.wait_ms.unwrap_or(0)));
        }
        cells.push(row.seen.ended.clone().unwrap_or_else(|| row.cause.clone()));
        table.row(cells);
    }
    let verdict = if outcome.status == 0 { "ok" } else { "failed" };
    let why = match &outcome.job.stopped_because {
        Some(reason) => format!(": {reason}"),
        None => String::new(),
    };
    let mut text = format!(
        "\ngpuvisor: job {verdict} (exit status {}){why}\n{}",
        outcome.status,
        table.render("  ")
    );
    if let Some(makespan) = outcome.makespan_ms {
        text.push_str(&format!("  makespan {}\n", human_duration(makespan)));
    }
    for note in &outcome.job.notes {
        text.push_str(&format!("  {note}\n"));
    }
    if let Some(record) = &outcome.record {
        text.push_str(&format!("  {record}\n"));
    }
    text
}
