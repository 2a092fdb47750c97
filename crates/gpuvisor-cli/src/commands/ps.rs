//! `gpuvisor ps`, `stop`, `restart`: talk to a running supervisor over its control socket
//! (`control.sock` in the run directory) and say what they did; `ps` on a finished run reads
//! its record instead (the recorded GPU peaks, not `?`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use gpuvisor_core::size::ByteSize;
use gpuvisor_record::{RunDir, RunNotFound};
use gpuvisor_supervisor::clock::human_duration;
use gpuvisor_supervisor::control::{request, PsRow, Request};
use gpuvisor_supervisor::record::ps_from_record;
use gpuvisor_supervisor::rundir::{socket_path, DEFAULT_RUNS};
use serde_json::Value;

use crate::cli::{PsArgs, RestartArgs, StopArgs};
use crate::failure::Failure;
use crate::table::Table;

/// Lists the processes of a run.
pub fn ps(args: PsArgs) -> Result<ExitCode, Failure> {
    let run = resolve_run(args.run.as_deref())?;
    let (rows, live) = match request(&socket_path(&run), &Request::Ps) {
        Ok(reply) => (rows_of(reply)?, true),
        Err(_) => {
            let events = RunDir::at(&run).events_path();
            let (mut rows, note) = ps_from_record(&events).map_err(|error| {
                Failure::unavailable(format!(
                    "cannot read the run record {}: {error}",
                    events.display()
                ))
            })?;
            add_budgets(&run, &mut rows);
            if let Some(note) = note {
                eprintln!("gpuvisor: {note}");
            }
            (rows, false)
        }
    };
    // Physical memory nobody charged, from the sampler's latest tick (a live run only).
    // Only replicas with a budget can have any: a CPU-only job skips the request (the whole
    // sample, thousands of rows with 1,024 replicas).
    let untracked = match live && rows.iter().any(|row| row.budget_bytes > 0) {
        true => untracked_of(&run),
        false => std::collections::HashMap::new(),
    };
    if args.json {
        let mut json = serde_json::json!({ "run": run, "live": live, "replicas": rows });
        if let Some(replicas) = json["replicas"].as_array_mut() {
            for replica in replicas {
                let label = replica["label"].as_str().unwrap_or_default().to_string();
                if let Some(&(bytes, alarm)) = untracked.get(&label) {
                    replica["untracked_bytes"] = bytes.into();
                    replica["untracked_alarm"] = alarm.into();
                }
            }
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&json).map_err(Failure::unavailable)?
        );
        return Ok(ExitCode::SUCCESS);
    }
    // A multi-node run names each replica's node.
    let nodes = rows.iter().any(|row| row.node.is_some());
    let mut header = vec!["PROCESS"];
    if nodes {
        header.push("NODE");
    }
    header.extend([
        "STATE",
        "PID",
        "RESTARTS",
        // A finished run uses nothing: its recorded peak is what tells.
        if live {
            "GPU MEMORY / BUDGET"
        } else {
            "PEAK GPU / BUDGET"
        },
        "UNTRACKED",
        "UPTIME",
        "LAST EXIT",
    ]);
    let mut table = Table::new(&header);
    for row in &rows {
        let shown = if live {
            row.gpu_used_bytes
        } else {
            row.gpu_peak_bytes
        };
        let gpu = match (shown, row.budget_bytes) {
            (_, 0) => "-".to_string(),
            (Some(bytes), budget) => format!("{} / {}", ByteSize(bytes), ByteSize(budget)),
            (None, budget) => format!("? / {}", ByteSize(budget)),
        };
        let mut cells = vec![row.label.clone()];
        if nodes {
            cells.push(row.node.clone().unwrap_or_else(|| "-".into()));
        }
        cells.extend([
            row.state.clone(),
            row.pid
                .map(|pid| pid.to_string())
                .unwrap_or_else(|| "-".into()),
            row.restarts.to_string(),
            gpu,
            match untracked.get(&row.label) {
                Some(&(bytes, true)) => format!("{} (alarm)", ByteSize(bytes)),
                Some(&(bytes, false)) => ByteSize(bytes).to_string(),
                None => "-".into(),
            },
            row.uptime_ms
                .map(human_duration)
                .unwrap_or_else(|| "-".into()),
            row.last_exit.clone().unwrap_or_else(|| "-".into()),
        ]);
        table.row(cells);
    }
    let status = if live {
        "running"
    } else {
        "finished (from its record)"
    };
    print!("run {} — {status}\n{}", run.display(), table.render(""));
    Ok(ExitCode::SUCCESS)
}

/// label -> (untracked bytes, past its alarm) for the replicas whose untracked memory the
/// supervisor's latest sample knows (those with a ledger and a GPU source).
fn untracked_of(run: &Path) -> std::collections::HashMap<String, (u64, bool)> {
    let Ok(mut reply) = request(&socket_path(run), &Request::Sample) else {
        return Default::default();
    };
    // Taken out of the reply, not cloned: it is most of the reply.
    let sample = reply.get_mut("sample").map(Value::take).unwrap_or_default();
    let Ok(sample) = serde_json::from_value::<gpuvisor_supervisor::sample::Snapshot>(sample) else {
        return Default::default();
    };
    sample
        .replicas
        .into_iter()
        .filter_map(|row| Some((row.label, (row.untracked_bytes?, row.untracked_alarm))))
        .collect()
}

/// Stops a run or one process of it.
pub fn stop(args: StopArgs) -> Result<ExitCode, Failure> {
    let (run, process) = match args.targets.as_slice() {
        [] => (None, None),
        [one] if is_run_dir(one) => (Some(PathBuf::from(one)), None),
        [one] => (None, Some(one.clone())),
        [run, process] => (Some(PathBuf::from(run)), Some(process.clone())),
        _ => unreachable!("clap allows at most two"),
    };
    let run = resolve_run(run.as_deref())?;
    // What is running now, to say what the request did.
    let before = request(&socket_path(&run), &Request::Ps).ok();
    let code = send(
        &run,
        &Request::Stop {
            process: process.clone(),
        },
    )?;
    let job = before
        .as_ref()
        .and_then(|reply| reply["job"].as_str())
        .unwrap_or("?")
        .to_string();
    let Some(process) = process else {
        // The supervisor removes its socket as its very last step: wait for that, so `stop`
        // returns when the job is down (each process has its grace period, then SIGKILL).
        let socket = socket_path(&run);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
        while socket.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let ended = match job_end_status(&run) {
            Some(status) if !socket.exists() => format!("it ended with status {status}"),
            _ if socket.exists() => "it is still stopping".to_string(),
            _ => "it ended".to_string(),
        };
        println!(
            "gpuvisor: stopped job {job} ({}); {ended}; its record: {}",
            replicas_said(before.as_ref(), None),
            run.display()
        );
        return Ok(code);
    };
    println!(
        "gpuvisor: stopping {} of job {job}; they stay stopped until `gpuvisor restart {} {process}`",
        replicas_said(before.as_ref(), Some(&process)),
        run.display()
    );
    Ok(code)
}

/// `actor[0] (pid 12), actor[1] (pid 13)` of the replicas of `process` (all: None) in a `ps`
/// reply, or `every replica` when there was none.
fn replicas_said(reply: Option<&Value>, process: Option<&str>) -> String {
    let rows: Vec<PsRow> = reply
        .and_then(|reply| serde_json::from_value(reply["replicas"].clone()).ok())
        .unwrap_or_default();
    let said: Vec<String> = rows
        .iter()
        .filter(|row| process.is_none_or(|name| row.process == name || row.label == name))
        .map(|row| match row.pid {
            Some(pid) => format!("{} (pid {pid})", row.label),
            None => format!("{} ({})", row.label, row.state),
        })
        .collect();
    match said.is_empty() {
        true => "every replica".to_string(),
        false => said.join(", "),
    }
}

/// The status in the run's `job-end` event, once written.
fn job_end_status(run: &Path) -> Option<i64> {
    let record = gpuvisor_record::read_record(&RunDir::at(run).events_path()).ok()?;
    record
        .typed()
        .iter()
        .rev()
        .find_map(|line| match &line.event {
            gpuvisor_record::Event::JobEnd(end) => Some(i64::from(end.status)),
            _ => None,
        })
}

/// Restarts one process of a run.
pub fn restart(args: RestartArgs) -> Result<ExitCode, Failure> {
    let (run, process) = match args.targets.as_slice() {
        [process] => (None, process.clone()),
        [run, process] => (Some(PathBuf::from(run)), process.clone()),
        _ => unreachable!("clap requires one or two"),
    };
    let run = resolve_run(run.as_deref())?;
    let before = request(&socket_path(&run), &Request::Ps).ok();
    let code = send(
        &run,
        &Request::Restart {
            process: process.clone(),
        },
    )?;
    println!(
        "gpuvisor: restarting {} of job {}: each is stopped (its stop signal, then SIGKILL after its grace) and started again",
        replicas_said(before.as_ref(), Some(&process)),
        before
            .as_ref()
            .and_then(|reply| reply["job"].as_str())
            .unwrap_or("?")
    );
    Ok(code)
}

/// Budgets from the run's plan.json (the record's events do not repeat them), and the rows in
/// the plan's order.
fn add_budgets(run: &Path, rows: &mut [PsRow]) {
    let Ok(text) = std::fs::read_to_string(RunDir::at(run).plan_path()) else {
        return;
    };
    let Ok(plan) = gpuvisor_record::PlanRecord::parse(&text) else {
        return;
    };
    let mut order = Vec::new();
    for replica in &plan.replicas {
        let label = replica.label();
        if let Some(row) = rows.iter_mut().find(|row| row.label == label) {
            row.budget_bytes = replica.budget_bytes;
        }
        order.push(label);
    }
    // The plan's order (a multi-node record has the nodes' events interleaved).
    rows.sort_by_key(|row| {
        order
            .iter()
            .position(|label| label == &row.label)
            .unwrap_or(usize::MAX)
    });
}

fn is_run_dir(text: &str) -> bool {
    gpuvisor_record::is_run_dir(Path::new(text))
}

/// Whether `run` (or its `events.jsonl`) exists but this user may not look inside.
fn is_unreadable(run: &Path) -> bool {
    let denied = |error: std::io::Error| error.kind() == std::io::ErrorKind::PermissionDenied;
    RunDir::at(run)
        .events_path()
        .try_exists()
        .is_err_and(denied)
        || std::fs::read_dir(run).is_err_and(denied)
}

/// ` (owned by NAME, mode 0700)`, or nothing when even that cannot be read.
fn owner_and_mode(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return String::new();
    };
    let uid = nix::unistd::Uid::from_raw(meta.uid());
    let owner = match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => user.name,
        _ => format!("uid {uid}"),
    };
    format!(
        " ({} is owned by {owner}, mode {:04o})",
        path.display(),
        meta.mode() & 0o7777
    )
}

/// The run a command means (`latest` or none: the latest under ./runs; a path; a name under
/// ./runs), or why there is none.
pub(crate) fn resolve_run(run: Option<&Path>) -> Result<PathBuf, Failure> {
    match gpuvisor_record::resolve_run(run, Path::new(DEFAULT_RUNS)) {
        Ok(run) => Ok(run),
        Err(RunNotFound::NoRuns(_)) => Err(no_run()),
        Err(RunNotFound::NotARun(run)) if is_unreadable(&run) => Err(Failure::unavailable(format!(
            "cannot read the run directory {}: permission denied{}\n  hint: a run directory is private to the user who ran the job; run `gpuvisor ps` as that user or as root",
            run.display(),
            owner_and_mode(&run)
        ))),
        Err(RunNotFound::NotARun(run)) => Err(Failure::bad_input(format!(
            "{} is not a run directory (it has no events.jsonl)\n  hint: give the directory `gpuvisor run` printed, e.g. runs/<job>-<time>",
            run.display()
        ))),
    }
}

/// No run was given and ./runs holds none.
pub(crate) fn no_run() -> Failure {
    Failure::bad_input(format!(
        "no run in ./{DEFAULT_RUNS}\n  hint: give the run directory, or run this where `gpuvisor run` was started"
    ))
}

pub(crate) fn send(run: &Path, message: &Request) -> Result<ExitCode, Failure> {
    let reply = request(&socket_path(run), message).map_err(|error| {
        Failure::unavailable(format!(
            "the run in {} is not running (its control socket: {error})\n  hint: `gpuvisor ps {}` shows how it ended",
            run.display(),
            run.display()
        ))
    })?;
    check(&reply)?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn check(reply: &Value) -> Result<(), Failure> {
    if reply["ok"] == true {
        Ok(())
    } else {
        Err(Failure::bad_input(
            reply["error"].as_str().unwrap_or("the supervisor refused"),
        ))
    }
}

fn rows_of(mut reply: Value) -> Result<Vec<PsRow>, Failure> {
    check(&reply)?;
    let replicas = reply
        .get_mut("replicas")
        .map(Value::take)
        .unwrap_or_default();
    serde_json::from_value(replicas).map_err(Failure::unavailable)
}
