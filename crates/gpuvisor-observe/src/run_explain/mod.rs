//! Explaining a run directory: every failure in time order (refused allocations, failing exits,
//! crash loops, group restarts...), who held how much of that GPU at that moment (from the
//! samples and the ledger's figures in the events), and which process started each chain of
//! failures.
//!
//! The chain rule: an incident is a consequence of an earlier one when it is the same replica
//! in the same life (a refusal, then its exit), when gpuvisor restarted or blocked it because
//! of another process (`restart` with reason `group: X restarted`, `blocked`), or when its
//! process runs `after` (directly or through others) a process that failed and was not ready
//! again yet. The first incident of a chain that is nobody's consequence is its origin.

pub mod render;

use std::collections::BTreeSet;

use gpuvisor_core::size::ByteSize;
use serde::Serialize;

use crate::run_memory::{Holding, MemorySeries};
use crate::run_record::{clock_ms, process_of, RunEvent, RunRecord};

/// A dependant failing this long after its upstream became ready again still counts as a
/// consequence (a reconnect that fails at once).
const READY_GRACE_MS: u64 = 2_000;

/// What kind of failure an incident is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IncidentKind {
    /// The shim refused an allocation.
    Denial,
    /// A replica exited with a failure (not stopped by gpuvisor).
    Exit,
    /// Restarted because another process restarted.
    GroupRestart,
    /// Given up: too many restarts.
    CrashLoop,
    /// Failed for good, or could not start.
    Failed,
    /// Never started: what it waits for ended.
    Blocked,
    /// A CPU-only process tried to use CUDA.
    Violation,
    /// Over its budget (seen by the sampler).
    BudgetExceeded,
}

/// One process on the GPU at an incident.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// Process name.
    pub process: String,
    /// Replicas of it on this GPU.
    pub replicas: u32,
    /// Bytes they held together.
    pub bytes: u64,
    /// The most one replica held.
    pub max_bytes: u64,
    /// One replica's budget, bytes.
    pub budget_bytes: u64,
}

/// One failure in the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Incident {
    /// When, RFC 3339-free clock time (`HH:MM:SS.mmm`, UTC).
    pub time: String,
    /// When, Unix ms.
    pub time_unix_ms: u64,
    /// The replica (or process) it happened to.
    pub replica: String,
    /// What it is.
    pub kind: IncidentKind,
    /// One line: what happened.
    pub what: String,
    /// The GPU (plan index) it concerns, when one.
    pub gpu: Option<u32>,
    /// Who held that GPU's memory then (empty when unknown).
    pub holders: Vec<Holder>,
    /// Memory held by processes outside the job, when known.
    pub other_bytes: Option<u64>,
    /// The held memory as one line (`sim 37.1 GiB, learner 23.8 of 24.0 GiB, actor 4 × 2.4 GiB`).
    pub held: Option<String>,
    /// The incident it follows from (index into [`RunExplanation::incidents`]).
    pub caused_by: Option<usize>,
    /// Why it follows from that one.
    pub because: Option<String>,
}

/// A chain of failures and where it started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Chain {
    /// The first incident (index), whose replica started the chain.
    pub origin: usize,
    /// The replica that started it.
    pub origin_replica: String,
    /// Every incident of the chain, in time order (the origin first).
    pub incidents: Vec<usize>,
    /// Replicas the chain reached.
    pub replicas: Vec<String>,
}

/// The explanation of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunExplanation {
    /// The job.
    pub job: String,
    /// The run directory.
    pub run: String,
    /// gpuvisor's exit status, when the run ended normally (None: the supervisor was killed).
    pub status: Option<i64>,
    /// Whether the run recorded memory samples.
    pub has_samples: bool,
    /// Failures in time order.
    pub incidents: Vec<Incident>,
    /// Chains, in order of their origin.
    pub chains: Vec<Chain>,
}

/// Explains a run.
pub fn explain_run(record: &RunRecord) -> RunExplanation {
    let memory = MemorySeries::of(record);
    let mut incidents: Vec<Incident> = Vec::new();
    for (at, event) in record.events.iter().enumerate() {
        let Some((kind, what)) = incident_of(event) else {
            continue;
        };
        let label = event.label.clone().unwrap_or_default();
        let gpu = gpu_of(record, event, kind);
        let mut incident = Incident {
            time: clock_ms(event.time_unix_ms),
            time_unix_ms: event.time_unix_ms,
            replica: label,
            kind,
            what,
            gpu,
            holders: Vec::new(),
            other_bytes: None,
            held: None,
            caused_by: None,
            because: None,
        };
        if let Some(gpu) = gpu {
            held_at(&memory, event, gpu, &mut incident);
        }
        let cause = cause_of(record, &record.events[..at], event, &incidents);
        if let Some((index, because)) = cause {
            incident.caused_by = Some(index);
            incident.because = Some(because);
        }
        incidents.push(incident);
    }
    let chains = chains_of(&incidents);
    RunExplanation {
        job: record.plan.job.clone(),
        run: record.dir.display().to_string(),
        status: record.end_status(),
        has_samples: record.samples.is_some(),
        incidents,
        chains,
    }
}

/// Whether an event is a failure, and the line that says what happened.
fn incident_of(event: &RunEvent) -> Option<(IncidentKind, String)> {
    let size = |name: &str| ByteSize(event.number(name).unwrap_or(0)).to_string();
    let reason = || event.text("reason").unwrap_or("").to_string();
    Some(match event.kind.as_str() {
        "denial" => (
            IncidentKind::Denial,
            format!(
                "asked for {} and was refused: it held {} of its {} {}",
                size("size_bytes"),
                size("used_bytes"),
                size("limit_bytes"),
                match event.text("limit") {
                    Some("replica") | None => "budget".to_string(),
                    Some(limit) => format!("{limit} limit"),
                }
            ),
        ),
        "exit" => {
            let cause = event.text("cause").unwrap_or("exit");
            let failed = event.number("code").is_some_and(|code| code != 0)
                || event
                    .fields
                    .get("code")
                    .is_some_and(|c| c.as_i64() != Some(0))
                || event.fields.contains_key("signal");
            if cause == "stopped" || !failed {
                return None;
            }
            let summary = event.text("summary").unwrap_or(cause);
            let run = event
                .number("run_ms")
                .map(|ms| format!(" after {}", seconds(ms)))
                .unwrap_or_default();
            let how = if cause == "exit" {
                format!("exited with {summary}")
            } else {
                format!("exited: {summary} [{cause}]")
            };
            (IncidentKind::Exit, format!("{how}{run}"))
        }
        "restart"
            if event
                .text("reason")
                .is_some_and(|r| r.starts_with("group:")) =>
        {
            (
                IncidentKind::GroupRestart,
                format!("was restarted with its group ({})", reason()),
            )
        }
        "crash-loop" => (IncidentKind::CrashLoop, format!("gave up: {}", reason())),
        "failed" => (
            IncidentKind::Failed,
            format!("failed for good: {}", reason()),
        ),
        "blocked" => (
            IncidentKind::Blocked,
            format!("never started: {}", reason()),
        ),
        "violation" => (
            IncidentKind::Violation,
            format!(
                "is CPU-only but tried to use CUDA (pid {}, {})",
                event.number("pid").unwrap_or(0),
                event.text("executable").unwrap_or("?")
            ),
        ),
        "budget-exceeded" => (
            IncidentKind::BudgetExceeded,
            format!("went over its budget{}", detail(event)),
        ),
        _ => return None,
    })
}

fn detail(event: &RunEvent) -> String {
    match (event.number("used_bytes"), event.number("budget_bytes")) {
        (Some(used), Some(budget)) => format!(": {} of {}", ByteSize(used), ByteSize(budget)),
        _ => String::new(),
    }
}

fn seconds(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// The GPU an incident concerns: the denial's device, else the replica's first GPU.
fn gpu_of(record: &RunRecord, event: &RunEvent, kind: IncidentKind) -> Option<u32> {
    if kind == IncidentKind::Denial {
        if let Some(device) = event.number("device") {
            return Some(device as u32);
        }
    }
    if matches!(
        kind,
        IncidentKind::Violation | IncidentKind::Blocked | IncidentKind::CrashLoop
    ) {
        return None;
    }
    let label = event.label.as_deref()?;
    let replica = record.replica(label).or_else(|| {
        // Events about a whole process (`failed`, `restart`) name the process.
        record.plan.replicas.iter().find(|r| r.process == label)
    })?;
    replica.gpus.first().map(|placed| placed.index)
}

/// Fills who held GPU `gpu` at the incident. A replica's figure is taken from the last sample
/// before the event; the denied replica's own figure is the ledger's, exact, from the event.
fn held_at(memory: &MemorySeries, event: &RunEvent, gpu: u32, incident: &mut Incident) {
    // Just before the event: an exit's own sample may already show the memory freed.
    let (mut holdings, other) = memory.holdings(gpu, event.time_unix_ms.saturating_sub(1));
    if event.kind == "denial" {
        let label = event.label.as_deref().unwrap_or("");
        let used = event.number("used_bytes").unwrap_or(0);
        match holdings.iter_mut().find(|h| h.label == label) {
            Some(holding) => holding.bytes = used,
            None => holdings.push(Holding {
                label: label.to_string(),
                bytes: used,
                budget_bytes: event.number("limit_bytes").unwrap_or(0),
            }),
        }
    }
    if holdings.is_empty() {
        return;
    }
    let holders = group(&holdings);
    incident.held = Some(held_line(&holders, other, &incident.replica));
    incident.holders = holders;
    incident.other_bytes = other;
}

/// Holdings grouped by process, in plan order; processes holding nothing are left out.
fn group(holdings: &[Holding]) -> Vec<Holder> {
    let mut holders: Vec<Holder> = Vec::new();
    // A replica holding nothing (not started, or gone) is not a holder.
    for holding in holdings.iter().filter(|h| h.bytes > 0) {
        let process = process_of(&holding.label).to_string();
        match holders.iter_mut().find(|h| h.process == process) {
            Some(holder) => {
                holder.replicas += 1;
                holder.bytes += holding.bytes;
                holder.max_bytes = holder.max_bytes.max(holding.bytes);
            }
            None => holders.push(Holder {
                process,
                replicas: 1,
                bytes: holding.bytes,
                max_bytes: holding.bytes,
                budget_bytes: holding.budget_bytes,
            }),
        }
    }
    holders
}

/// `sim 37.1 GiB, learner 23.8 of 24.0 GiB, actor 4 × 2.4 GiB, others 1.0 GiB`.
fn held_line(holders: &[Holder], other: Option<u64>, subject: &str) -> String {
    let subject = process_of(subject);
    let mut parts: Vec<String> = holders
        .iter()
        .map(|holder| {
            let mean = holder.bytes / u64::from(holder.replicas.max(1));
            if holder.replicas == 1 {
                if holder.process == subject && holder.budget_bytes > 0 {
                    format!(
                        "{} {} of {}",
                        holder.process,
                        ByteSize(holder.bytes),
                        ByteSize(holder.budget_bytes)
                    )
                } else {
                    format!("{} {}", holder.process, ByteSize(holder.bytes))
                }
            } else if ByteSize(holder.max_bytes).to_string() == ByteSize(mean).to_string() {
                format!(
                    "{} {} × {}",
                    holder.process,
                    holder.replicas,
                    ByteSize(mean)
                )
            } else {
                format!(
                    "{} {} (×{}, at most {} each)",
                    holder.process,
                    ByteSize(holder.bytes),
                    holder.replicas,
                    ByteSize(holder.max_bytes)
                )
            }
        })
        .collect();
    if let Some(other) = other.filter(|&b| b > 0) {
        parts.push(format!("outside the job {}", ByteSize(other)));
    }
    if parts.is_empty() {
        "nothing".to_string()
    } else {
        parts.join(", ")
    }
}

/// The earlier incident this event follows from, and why.
fn cause_of(
    record: &RunRecord,
    before: &[RunEvent],
    event: &RunEvent,
    incidents: &[Incident],
) -> Option<(usize, String)> {
    let label = event.label.as_deref()?;
    let process = process_of(label);
    // gpuvisor says why: a group restart or a blocked start names the other process.
    if let Some(reason) = event.text("reason") {
        let named = reason.strip_prefix("group:").map(|rest| {
            rest.trim()
                .trim_end_matches(" restarted")
                .trim()
                .to_string()
        });
        let named = named.or_else(|| {
            (event.kind == "blocked")
                .then(|| upstream_named(record, process, reason))
                .flatten()
        });
        if let Some(named) = named {
            if let Some(index) = latest(incidents, |i| process_of(&i.replica) == named) {
                return Some((
                    index,
                    format!("gpuvisor restarted or held it when {named} failed"),
                ));
            }
        }
    }
    // The same replica (or, for process-wide events, process) failed before and has not
    // ended well since: the same life, or lives it was restarted into after that failure.
    let same = |i: &Incident| i.replica == label || process_of(&i.replica) == label;
    if let Some(index) = latest(incidents, same) {
        let earlier = &incidents[index];
        let ended_well = before.iter().any(|e| {
            e.kind == "exit"
                && (e.label.as_deref() == Some(label) || e.process() == Some(label))
                && e.time_unix_ms > earlier.time_unix_ms
                && !crate::report::svg::is_failure_exit(e)
        });
        if !ended_well {
            let restarted = before.iter().any(|e| {
                e.kind == "start"
                    && e.label.as_deref() == Some(label)
                    && e.time_unix_ms > earlier.time_unix_ms
            });
            let because = if restarted {
                format!(
                    "it was restarted after its failure at {} and failed again",
                    earlier.time
                )
            } else if earlier.kind == IncidentKind::Denial {
                "its own allocation was refused just before".to_string()
            } else {
                "of its own failure just before".to_string()
            };
            return Some((index, because));
        }
    }
    // A process it runs after failed and was not ready again (the latest such failure).
    let upstream = upstream_of(record, process);
    let mut best: Option<(usize, String)> = None;
    for (index, incident) in incidents.iter().enumerate() {
        let other = process_of(&incident.replica);
        if !upstream.contains(other) {
            continue;
        }
        let ready_again = before.iter().any(|e| {
            e.kind == "ready"
                && e.label.as_deref().map(process_of) == Some(other)
                && e.time_unix_ms > incident.time_unix_ms
                && e.time_unix_ms + READY_GRACE_MS < event.time_unix_ms
        });
        if !ready_again {
            best = Some((
                index,
                format!(
                    "it runs after {other}, which failed {} earlier",
                    seconds(event.time_unix_ms - incident.time_unix_ms)
                ),
            ));
        }
    }
    best
}

fn latest(incidents: &[Incident], pick: impl Fn(&Incident) -> bool) -> Option<usize> {
    incidents.iter().rposition(pick)
}

/// The upstream process a `blocked` reason names (the first of the process's upstream that
/// appears in it).
fn upstream_named(record: &RunRecord, process: &str, reason: &str) -> Option<String> {
    upstream_of(record, process)
        .into_iter()
        .find(|name| reason.contains(name.as_str()))
}

/// Every process `process` runs after, directly or through others.
fn upstream_of(record: &RunRecord, process: &str) -> BTreeSet<String> {
    let mut found: BTreeSet<String> = BTreeSet::new();
    let mut todo = vec![process.to_string()];
    while let Some(name) = todo.pop() {
        for replica in record.plan.replicas.iter().filter(|r| r.process == name) {
            for upstream in &replica.after {
                if found.insert(upstream.clone()) {
                    todo.push(upstream.clone());
                }
            }
        }
    }
    found.remove(process);
    found
}

/// Groups incidents by the root of their `caused_by` links.
fn chains_of(incidents: &[Incident]) -> Vec<Chain> {
    let root = |mut index: usize| {
        while let Some(parent) = incidents[index].caused_by {
            index = parent;
        }
        index
    };
    let mut chains: Vec<Chain> = Vec::new();
    for (index, incident) in incidents.iter().enumerate() {
        let origin = root(index);
        let replica = incident.replica.clone();
        match chains.iter_mut().find(|c| c.origin == origin) {
            Some(chain) => {
                chain.incidents.push(index);
                if !chain.replicas.contains(&replica) {
                    chain.replicas.push(replica);
                }
            }
            None => chains.push(Chain {
                origin,
                origin_replica: replica.clone(),
                incidents: vec![index],
                replicas: vec![replica],
            }),
        }
    }
    chains
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
