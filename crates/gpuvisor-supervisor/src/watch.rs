//! Policies and stall detection over each [`Snapshot`]: budget exceeded (replicas the shim
//! does not enforce), GPU use by CPU-only replicas and their descendants, per-GPU headroom,
//! and replicas quiet for too long, classified from their CPU and GPU use.
//!
//! Plain data in, findings out: the supervisor loop records the events and carries out the
//! remedies, so every rule is testable without processes.

use std::collections::{HashSet, VecDeque};

use cpu_window::CpuWindow;
use read_progress::ReadProgress;
use std::time::Duration;

use crate::events::Event;
use crate::sample::Snapshot;
use gpuvisor_record::event::{Headroom, Stall};

pub use gpuvisor_core::spec::{BudgetAction, GpuUseAction};

/// One replica's policies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaPolicy {
    /// The shim enforces its budget (then the budget rule is the shim's job, not ours).
    pub shim_enforced: bool,
    /// It was planned CPU-only.
    pub cpu_only: bool,
    /// Its own process keeps its GPU but its descendants must not use one.
    pub children_cpu_only: bool,
    /// Budget exceeded.
    pub on_budget_exceeded: BudgetAction,
    /// GPU use while CPU-only.
    pub on_gpu_use: GpuUseAction,
    /// Quiet this long counts as a stall (`None`: never).
    pub stall_after: Option<Duration>,
}

/// The job's policies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchConfig {
    /// Per replica (index = replica index).
    pub replicas: Vec<ReplicaPolicy>,
    /// Alarm when a GPU's free memory falls below this many bytes.
    pub headroom_alarm_bytes: Option<u64>,
    /// Untracked-memory and physical-reserve alarms ([`crate::physical_watch`]).
    pub physical: crate::physical_watch::PhysicalConfig,
}

pub use crate::stall_class::{
    classify, StallCause, StallClass, StallEvidence, StallKind, ThreadEvidence, ThreadSample,
    CPU_BUSY_PERCENT, GPU_BUSY_PERCENT,
};

/// Classifies a quiet replica from its CPU and GPU use alone.
pub fn classify_stall(evidence: &StallEvidence) -> StallKind {
    classify(evidence).kind
}

pub use crate::stall_source::{NoStallSource, StallSource};

/// Something to do about a finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remedy {
    /// Kill replica `index` and keep it stopped (reason).
    KillReplica(usize, String),
    /// Restart replica `index` (reason).
    RestartReplica(usize, String),
    /// SIGKILL one process.
    KillPid(i32),
}

/// One finding: an event to record, maybe a remedy, and pids to dump Python stacks of.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// The event.
    pub event: Event,
    /// What to do, if anything.
    pub remedy: Option<Remedy>,
    /// A stall of replica `index`: its Python processes to dump (py-spy), if installed.
    pub stall_of: Option<usize>,
}

/// The threads of a quiet replica, sampled every tick from half its `stall_after` on.
#[derive(Debug, Clone)]
struct ThreadWindow {
    start_ms: u64,
    first: Vec<ThreadSample>,
    /// The latest samples (blocking calls are seen only when a sample catches them).
    recent: VecDeque<Vec<ThreadSample>>,
}

/// How many samples a thread window keeps.
const THREAD_SAMPLES: usize = 20;

/// The policy of a replica the job gave none (one added while it runs).
const NO_POLICY: ReplicaPolicy = ReplicaPolicy {
    shim_enforced: false,
    cpu_only: false,
    children_cpu_only: false,
    on_budget_exceeded: BudgetAction::Warn,
    on_gpu_use: GpuUseAction::Warn,
    stall_after: None,
};

/// The policies' memory between ticks.
#[derive(Debug, Default)]
pub struct Watch {
    config: WatchConfig,
    over_budget: Vec<bool>,
    /// Per replica: its class while it is stalled (kept for the rows of later ticks).
    stalled: Vec<Option<StallKind>>,
    gpu_use_reported: HashSet<i32>,
    headroom_low: Vec<bool>,
    /// Per replica with a stall rule: its CPU use over the last 10 s.
    cpu_windows: Vec<CpuWindow>,
    /// Per replica: its processes' indices in the snapshot; kept between ticks so a tick
    /// reuses the lists instead of allocating one per replica.
    members: Vec<Vec<usize>>,
    /// Per replica: its threads since it became half-way quiet (when the window began, the
    /// first sample, then the latest samples).
    thread_windows: Vec<Option<ThreadWindow>>,
    /// Per replica: its reads since it became half-way quiet.
    reads: Vec<Option<ReadProgress>>,
    /// Stalls found so far.
    pub stalls: u64,
    /// Violations (CPU-only GPU use) seen so far, from the GPU source or the shim.
    pub violations: u64,
    /// Policy findings so far (warnings included).
    pub actions: u64,
}

impl Watch {
    /// A watch over `config`.
    pub fn new(config: WatchConfig) -> Watch {
        let count = config.replicas.len();
        Watch {
            config,
            over_budget: vec![false; count],
            stalled: vec![None; count],
            cpu_windows: vec![CpuWindow::default(); count],
            ..Watch::default()
        }
    }

    /// The policy of replica `index` (defaults when the job gave none): borrowed, as it is
    /// looked up per replica and process every tick.
    fn policy(&self, index: usize) -> &ReplicaPolicy {
        self.config.replicas.get(index).unwrap_or(&NO_POLICY)
    }

    /// Checks one snapshot (marking headroom alarms and stalls in it) and the shim's
    /// `violation` events since the last tick.
    pub fn check(&mut self, snapshot: &mut Snapshot, shim_events: &[Event]) -> Vec<Finding> {
        self.check_with(snapshot, shim_events, &mut NoStallSource)
    }

    /// [`Watch::check`], with what `source` knows of quiet replicas for the stall rule.
    pub fn check_with(
        &mut self,
        snapshot: &mut Snapshot,
        shim_events: &[Event],
        source: &mut dyn StallSource,
    ) -> Vec<Finding> {
        let mut findings = Vec::new();
        // Each replica's processes (indices), in one pass: the checks below are per replica.
        let mut members = std::mem::take(&mut self.members);
        members.resize_with(snapshot.replicas.len(), Vec::new);
        members.iter_mut().for_each(Vec::clear);
        for (at, process) in snapshot.processes.iter().enumerate() {
            if let Some(list) = process.replica.and_then(|index| members.get_mut(index)) {
                list.push(at);
            }
        }
        self.check_headroom(snapshot, &mut findings);
        self.check_budgets(snapshot, &members, &mut findings);
        self.check_gpu_use(snapshot, shim_events, &mut findings);
        self.check_stalls(snapshot, &members, source, &mut findings);
        self.members = members;
        self.actions += findings.iter().filter(|f| f.stall_of.is_none()).count() as u64;
        findings
    }

    fn check_headroom(&mut self, snapshot: &mut Snapshot, findings: &mut Vec<Finding>) {
        let Some(alarm) = self.config.headroom_alarm_bytes else {
            return;
        };
        self.headroom_low.resize(snapshot.gpus.len(), false);
        for (gpu, low_before) in snapshot.gpus.iter_mut().zip(&mut self.headroom_low) {
            let free = gpu.total_bytes.saturating_sub(gpu.used_bytes);
            gpu.headroom_alarm = free < alarm;
            if gpu.headroom_alarm != *low_before {
                *low_before = gpu.headroom_alarm;
                let headroom = Headroom {
                    gpu: gpu.index,
                    uuid: gpu.uuid.clone(),
                    free_bytes: free,
                    alarm_bytes: alarm,
                };
                findings.push(Finding {
                    event: match gpu.headroom_alarm {
                        true => Event::HeadroomLow(headroom),
                        false => Event::HeadroomOk(headroom),
                    },
                    remedy: None,
                    stall_of: None,
                });
            }
        }
    }

    fn check_budgets(
        &mut self,
        snapshot: &Snapshot,
        members: &[Vec<usize>],
        findings: &mut Vec<Finding>,
    ) {
        for (index, replica) in snapshot.replicas.iter().enumerate() {
            let policy = self.policy(index);
            if policy.shim_enforced || policy.cpu_only || replica.budget_bytes == 0 {
                continue;
            }
            let on_budget_exceeded = policy.on_budget_exceeded;
            // The budget is per GPU: the most the tree holds on any one GPU.
            let mut per_gpu: Vec<(u32, u64)> = Vec::new();
            for process in members[index].iter().map(|&at| &snapshot.processes[at]) {
                // Per GPU where the source says so; else the total spread evenly (hand-made
                // snapshots, older records).
                let even = process.gpu_bytes / process.gpus.len().max(1) as u64;
                for (at, &gpu) in process.gpus.iter().enumerate() {
                    let share = process.gpu_bytes_by_gpu.get(at).copied().unwrap_or(even);
                    match per_gpu.iter_mut().find(|(g, _)| *g == gpu) {
                        Some((_, bytes)) => *bytes += share,
                        None => per_gpu.push((gpu, share)),
                    }
                }
            }
            let Some(&(gpu, used)) = per_gpu.iter().max_by_key(|(_, bytes)| *bytes) else {
                self.over_budget.resize(snapshot.replicas.len(), false);
                self.over_budget[index] = false;
                continue;
            };
            self.over_budget.resize(snapshot.replicas.len(), false);
            let over = used > replica.budget_bytes;
            if over && !self.over_budget[index] {
                let action = on_budget_exceeded;
                let reason = format!(
                    "GPU memory {used} bytes on GPU {gpu} is over its budget of {} bytes",
                    replica.budget_bytes
                );
                findings.push(Finding {
                    event: Event::BudgetExceeded {
                        process: replica.label.clone(),
                        replica: replica.replica,
                        gpu,
                        used_bytes: used,
                        budget_bytes: replica.budget_bytes,
                        action: serde_json::to_value(action).unwrap_or_default(),
                    },
                    remedy: match action {
                        BudgetAction::Warn => None,
                        BudgetAction::Kill => Some(Remedy::KillReplica(index, reason)),
                        BudgetAction::Restart => Some(Remedy::RestartReplica(index, reason)),
                    },
                    stall_of: None,
                });
            }
            self.over_budget[index] = over;
        }
    }

    fn check_gpu_use(
        &mut self,
        snapshot: &Snapshot,
        shim_events: &[Event],
        findings: &mut Vec<Finding>,
    ) {
        let mut present = HashSet::new();
        for process in &snapshot.processes {
            let Some(index) = process.replica else {
                continue;
            };
            let policy = self.policy(index);
            let own = snapshot.replicas[index].pid == Some(process.pid);
            let forbidden = policy.cpu_only || (policy.children_cpu_only && !own);
            if process.gpu_bytes == 0 || !forbidden {
                continue;
            }
            present.insert(process.pid);
            if !self.gpu_use_reported.insert(process.pid) {
                continue;
            }
            let replica = &snapshot.replicas[index];
            findings.push(self.gpu_use_finding(
                index,
                &replica.label,
                process.pid,
                &process.command,
                snapshot.gpu_source.as_str(),
                Some(process.gpu_bytes),
            ));
        }
        for event in shim_events {
            let Event::Violation {
                process: label,
                pid,
                executable,
            } = event
            else {
                continue;
            };
            let pid = *pid;
            let Some(index) = snapshot.replicas.iter().position(|r| r.label == *label) else {
                continue;
            };
            present.insert(pid);
            if pid == 0 || !self.gpu_use_reported.insert(pid) {
                continue;
            }
            let command = crate::procfs::cmdline(pid);
            let command = if command.is_empty() {
                executable.clone()
            } else {
                command
            };
            findings.push(self.gpu_use_finding(index, label, pid, &command, "shim", None));
        }
        // A pid reported once is reported again only after it has left the GPU.
        self.gpu_use_reported.retain(|pid| present.contains(pid));
    }

    fn gpu_use_finding(
        &mut self,
        index: usize,
        label: &str,
        pid: i32,
        command: &str,
        seen_by: &str,
        bytes: Option<u64>,
    ) -> Finding {
        self.violations += 1;
        let action = self.policy(index).on_gpu_use;
        Finding {
            event: Event::GpuUse {
                process: label.to_string(),
                pid,
                command: command.to_string(),
                seen_by: seen_by.to_string(),
                action: serde_json::to_value(action).unwrap_or_default(),
                used_bytes: bytes,
            },
            remedy: (action == GpuUseAction::Kill).then_some(Remedy::KillPid(pid)),
            stall_of: None,
        }
    }

    fn check_stalls(
        &mut self,
        snapshot: &mut Snapshot,
        members: &[Vec<usize>],
        source: &mut dyn StallSource,
        findings: &mut Vec<Finding>,
    ) {
        let now = snapshot.time_unix_ms;
        self.thread_windows.resize(snapshot.replicas.len(), None);
        self.reads.resize(snapshot.replicas.len(), None);
        let interval = snapshot.interval_ms.max(1);
        self.stalled.resize(snapshot.replicas.len(), None);
        self.cpu_windows
            .resize(snapshot.replicas.len(), CpuWindow::default());
        for (index, own) in members.iter().enumerate().take(snapshot.replicas.len()) {
            let replica = &snapshot.replicas[index];
            // Only replicas with a stall rule need their CPU history.
            let stall_after = self
                .config
                .replicas
                .get(index)
                .and_then(|policy| policy.stall_after);
            // CPU use integrated over time (monotonic even when processes come and go); each
            // tick's figure covers the time since the previous tick.
            let window = &mut self.cpu_windows[index];
            if stall_after.is_some() {
                window.record(now, replica.cpu_percent, interval);
            }
            let (Some(stall_after), Some(quiet_ms), Some(_)) =
                (stall_after, replica.quiet_ms, replica.pid)
            else {
                self.stalled[index] = None;
                self.thread_windows[index] = None;
                continue;
            };
            let stall_ms = stall_after.as_millis() as u64;
            if quiet_ms < stall_ms / 2 {
                self.stalled[index] = None;
                self.thread_windows[index] = None;
                self.reads[index] = None;
                continue;
            }
            // Half-way quiet: sample its threads every tick until it stalls, so the stall is
            // classified from what they did over a window (CPU split, blocking calls seen),
            // and count its reads, which are progress until then (docs/supervisor.md, "Stall
            // classes").
            let mut quiet_or_reading_ms = quiet_ms;
            if self.stalled[index].is_none() {
                let pids: Vec<i32> = own.iter().map(|&at| snapshot.processes[at].pid).collect();
                let read = source.read_progress(&pids);
                quiet_or_reading_ms =
                    ReadProgress::quiet_ms(&mut self.reads[index], quiet_ms, now, read);
                let sample = source.threads(&pids);
                match &mut self.thread_windows[index] {
                    Some(window) => {
                        window.recent.push_back(sample);
                        if window.recent.len() > THREAD_SAMPLES {
                            window.recent.pop_front();
                        }
                    }
                    window @ None => {
                        *window = Some(ThreadWindow {
                            start_ms: now,
                            first: sample.clone(),
                            recent: VecDeque::from([sample]),
                        })
                    }
                }
            }
            if quiet_or_reading_ms < stall_ms {
                self.stalled[index] = None;
                continue;
            }
            if let Some(kind) = self.stalled[index] {
                snapshot.replicas[index].stall = Some(kind.name().to_string());
                continue;
            }
            // Averaged only here, where a stall is judged (the window is a walk over its points).
            let cpu_percent = self.cpu_windows[index]
                .average()
                .unwrap_or(replica.cpu_percent);
            let mut evidence = StallEvidence {
                cpu_percent,
                gpu_utilization_percent: replica.gpu_utilization_percent,
                ..StallEvidence::default()
            };
            for process in own.iter().map(|&at| &snapshot.processes[at]) {
                match process.state {
                    'R' => evidence.running += 1,
                    'D' => evidence.disk_wait += 1,
                    _ => {}
                }
            }
            if let Some(window) = &self.thread_windows[index] {
                let samples: Vec<Vec<ThreadSample>> = window.recent.iter().cloned().collect();
                let span = now.saturating_sub(window.start_ms);
                let threads = ThreadEvidence::from_samples(&window.first, &samples, span);
                evidence.threads = (threads.threads > 0).then_some(threads);
            }
            if evidence
                .threads
                .as_ref()
                .is_some_and(|t| !t.spinning.is_empty())
            {
                let pids: Vec<i32> = own.iter().map(|&at| snapshot.processes[at].pid).collect();
                evidence.listening = source.listening(&pids);
            }
            evidence.log = crate::stall_class::scan_log(&source.log_tail(index), now);
            let class = classify(&evidence);
            snapshot.replicas[index].stall = Some(class.kind.name().to_string());
            self.stalled[index] = Some(class.kind);
            self.stalls += 1;
            let replica = &snapshot.replicas[index];
            let waiting = (!class.pids.is_empty()).then(|| {
                class
                    .pids
                    .iter()
                    .map(|&pid| serde_json::json!({"pid": pid, "rank": source.rank(pid)}))
                    .collect()
            });
            let mut missing = source.not_available();
            if evidence.gpu_utilization_percent.is_none() {
                missing.push("gpu utilisation".into());
            }
            let event = Event::Stall(Stall {
                process: replica.label.clone(),
                replica: replica.replica,
                class: class.kind.name().to_string(),
                cause: class.cause.map(|cause| StallCause::name(cause).to_string()),
                quiet_ms,
                cpu_percent: (cpu_percent * 10.0).round() / 10.0,
                running: evidence.running,
                disk_wait: evidence.disk_wait,
                processes: replica.process_count,
                because: class.because.clone(),
                gpu_utilization_percent: evidence.gpu_utilization_percent,
                pids: waiting,
                not_available: missing,
                stacks: None,
            });
            findings.push(Finding {
                event,
                remedy: None,
                stall_of: Some(index),
            });
        }
    }
}

mod cpu_window;
mod read_progress;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod stall_tests;
