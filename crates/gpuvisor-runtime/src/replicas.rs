//! The supervisor's replicas for a planned job on this node: one [`ReplicaSpec`] per planned
//! replica (its command, working directory, whole environment from [`crate::launch`], restart,
//! stop and readiness policies), the coordinators of its `distributed` worlds when they all
//! run here, and the checks a start would otherwise fail late on (`ARG_MAX`).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::str::FromStr;

use gpuvisor_core::env::Coordinator;
use gpuvisor_core::plan::Plan;
use gpuvisor_core::spec::{Diagnostic, JobSpec, ReadyWhen};
use gpuvisor_supervisor::spawn::{Launch, Output};
use gpuvisor_supervisor::supervisor::{Readiness, ReplicaSpec};
use nix::sys::signal::Signal;
use regex::bytes::Regex;

use crate::launch::{as_changes, replica_environment, RunEnv};
use crate::{prestart, RuntimeError};

/// A refusal pointing at `span` of process `name`'s table in the job file.
fn process_error(
    job: &JobSpec,
    name: &str,
    span: impl Fn(&gpuvisor_core::spec::ProcessSpec) -> gpuvisor_core::spec::Span,
    message: String,
    hint: &str,
) -> RuntimeError {
    let diagnostic = match job.process(name) {
        Some(process) => Diagnostic::at(&job.path, &job.source, span(process), message),
        None => Diagnostic::whole_file(&job.path, message),
    };
    RuntimeError::Job(diagnostic.with_hint(hint))
}

/// Refuses a replica whose arguments and environment (gpuvisor's own, with the job's on top)
/// come to more than Linux lets a program start with (`ARG_MAX`), pointing at its process
/// table: it would fail only after the start, with E2BIG. Each string counts with its NUL and
/// a pointer to it; 4 KiB are kept for the keeper's arguments and the shim's variables.
pub fn check_exec_size(job: &JobSpec, replicas: &[ReplicaSpec]) -> Result<(), RuntimeError> {
    use nix::unistd::{sysconf, SysconfVar};
    let Ok(Some(limit)) = sysconf(SysconfVar::ARG_MAX) else {
        return Ok(());
    };
    let limit = limit as usize;
    let pointer = std::mem::size_of::<usize>();
    let inherited: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
    for replica in replicas {
        let mut env = inherited.clone();
        for (name, value) in &replica.launch.env {
            match value {
                Some(value) => env.insert(name.into(), value.into()),
                None => env.remove(std::ffi::OsStr::new(name)),
            };
        }
        let argv: usize = replica
            .launch
            .argv
            .iter()
            .map(|arg| arg.len() + 1 + pointer)
            .sum();
        let environment: usize = env
            .iter()
            .map(|(name, value)| name.len() + value.len() + 2 + pointer)
            .sum();
        let total = argv + environment + 4096;
        if total <= limit {
            continue;
        }
        return Err(process_error(
            job,
            &replica.process,
            |process| process.span,
            format!(
                "the arguments and environment of [process.{}] come to {total} bytes ({argv} of arguments, {environment} of environment), more than the {limit} bytes Linux lets a program start with (ARG_MAX)",
                replica.process
            ),
            "put large data in files and pass their paths; the environment gpuvisor is started with counts too",
        ));
    }
    Ok(())
}

/// Each replica's whole environment (launch.rs), now that what it names exists.
pub fn give_environment(replicas: &mut [ReplicaSpec], plan: &Plan, env: &RunEnv) {
    for (index, (spec, replica)) in replicas.iter_mut().zip(&plan.replicas).enumerate() {
        spec.launch.env = as_changes(replica_environment(replica, index, env));
    }
}

/// Budget groups a queued job's ledger keeps for replicas added while it runs
/// (`gpuvisor queue add`); none for other jobs.
pub fn spare_groups(job: &JobSpec) -> usize {
    match job.admission.is_all() {
        true => 0,
        false => 256,
    }
}

/// The job file's `ready` as the supervisor's readiness (its regex was checked when parsing).
fn job_readiness(ready: &ReadyWhen) -> Result<Readiness, RuntimeError> {
    Ok(match ready {
        ReadyWhen::Started => Readiness::Started,
        ReadyWhen::Exit => Readiness::Exit,
        ReadyWhen::Port(port) => Readiness::Port(*port),
        ReadyWhen::LogLine(pattern) => {
            Readiness::LogLine(Regex::new(pattern).map_err(|error| RuntimeError::Refused {
                what: format!("`ready = \"log:{pattern}\"` is not a regex: {error}"),
                hint: None,
            })?)
        }
    })
}

/// On one machine every world's coordinator is this machine, on a port free now.
pub fn local_coordinators(plan: &Plan) -> Result<BTreeMap<String, Coordinator>, RuntimeError> {
    let mut coordinators = BTreeMap::new();
    for replica in &plan.replicas {
        let Some(rank) = &replica.rank else { continue };
        if coordinators.contains_key(&rank.world) {
            continue;
        }
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|listener| listener.local_addr())
            .map_err(|error| RuntimeError::Unavailable {
                what: format!(
                    "cannot find a free port for `{}`'s coordinator: {error}",
                    rank.world
                ),
                hint: None,
            })?
            .port();
        coordinators.insert(
            rank.world.clone(),
            Coordinator {
                host: "127.0.0.1".to_string(),
                port,
            },
        );
    }
    Ok(coordinators)
}

/// One supervisor replica per planned replica, with its environment as far as `env` goes
/// (before the run made its ledger: enough to check its size) and policies.
pub fn replica_specs(
    job: &JobSpec,
    plan: &Plan,
    job_path: &Path,
    readiness: &[(String, Readiness)],
    env: &RunEnv,
) -> Result<Vec<ReplicaSpec>, RuntimeError> {
    plan.replicas
        .iter()
        .enumerate()
        .map(|(index, replica)| {
            let process =
                job.process(&replica.process)
                    .ok_or_else(|| RuntimeError::Unavailable {
                        what: format!(
                            "the plan names process `{}` the job does not have",
                            replica.process
                        ),
                        hint: None,
                    })?;
            let stop_signal =
                Signal::from_str(&process.stop.signal).map_err(|_| RuntimeError::Refused {
                    what: format!(
                        "`stop.signal` of [process.{}] is `{}`, not a signal",
                        process.name, process.stop.signal
                    ),
                    hint: Some(
                        "use SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 or SIGUSR2".to_string(),
                    ),
                })?;
            let env = as_changes(replica_environment(replica, index, env));
            // Not set: the job file's directory, where its relative paths were written from.
            let cwd = Some(prestart::working_dir(job_path, replica.cwd.as_deref()));
            let file_stem = if replica.replicas > 1 {
                format!("{}.{}", replica.process, replica.replica)
            } else {
                replica.process.clone()
            };
            Ok(ReplicaSpec {
                process: replica.process.clone(),
                replica: replica.replica,
                label: replica.label(),
                file_stem,
                launch: Launch {
                    argv: replica.argv.clone(),
                    env,
                    cwd,
                    output: Output::Pipes,
                },
                after: replica.after.clone(),
                restart: process.restart.clone(),
                stop_signal,
                grace_ms: process.stop.grace_ms,
                // A `--ready` flag wins over the job file's `ready`.
                readiness: match readiness
                    .iter()
                    .rev()
                    .find(|(name, _)| name == &replica.process)
                {
                    Some((_, readiness)) => readiness.clone(),
                    None => job_readiness(&process.ready)?,
                },
                budget_bytes: replica.budget_bytes,
                direct_logs: process.direct_logs,
            })
        })
        .collect()
}
