//! The sampler: one tick reads the GPU source once, the CPU time of the job's own processes
//! (`cpu`), and turns them, with the ledger's figures, into a [`Snapshot`]. Which processes
//! belong to which replica, and their state, parent and resident memory (/proc/PID/stat), come
//! from the trees' discoveries (`trees`), at most every 2 s and only for trees where something
//! may have changed.
//!
//! Every GPU pid is attributed to the replica it descends from by walking its parent chain up
//! to a replica's process group leader (the keeper); the answer is cached per (pid, start
//! time), so a long-lived worker costs one walk in its life. A GPU process born between two
//! discoveries is found through its parent chain at once.
//!
//! A replica's untracked memory is what its tree holds physically (the GPU source's
//! per-process figures, summed) minus what the ledger charged it: contexts, modules, local
//! memory and any allocation path the shim does not hook.

use std::time::{Duration, Instant};

use crate::gpu_source::{GpuReading, GpuSource};
use crate::physical_watch::{PhysicalConfig, PhysicalWatch};
use crate::procfs;
use crate::sample::{GpuShare, GpuStat, ProcessStat, ReplicaStat, Snapshot};
use crate::supervisor::GpuUsage;

/// A map keyed by pid, hashed with foldhash instead of std's SipHash: the sampler looks pids up
/// several times per process per tick, SipHash (built to resist chosen keys) was a tenth of a
/// tick with 1,024 replicas, and pids are not chosen to collide.
type PidMap<V> = std::collections::HashMap<i32, V, foldhash::fast::RandomState>;

/// What the sampler knows of a replica that does not change.
#[derive(Debug, Clone, Default)]
pub struct ReplicaInfo {
    /// Process name.
    pub process: String,
    /// Replica number.
    pub replica: u32,
    /// `name` or `name[r]`.
    pub label: String,
    /// Budget per GPU, bytes.
    pub budget_bytes: u64,
}

/// What changes between ticks, from the supervisor.
#[derive(Debug, Clone, Copy)]
pub struct TickInput<'a> {
    /// Each replica's process group (its keeper's pid) while it runs.
    pub groups: &'a [Option<i32>],
    /// Each replica's ledger figures, when the shim enforces.
    pub ledger: &'a [Option<GpuUsage>],
    /// When each replica last wrote output, Unix ms (0: never).
    pub last_output_unix_ms: &'a [u64],
    /// Now, Unix ms.
    pub now_unix_ms: u64,
}

/// How deep a parent chain is walked before giving up (a loop guard; real chains are short).
const MAX_CHAIN: usize = 64;

/// The sampler's state between ticks.
pub struct Sampler {
    job: String,
    interval: Duration,
    infos: Vec<ReplicaInfo>,
    source: Box<dyn GpuSource>,
    /// Each replica's tree and its members' stat.
    trees: Trees,
    /// The members' CPU time.
    cpu: CpuReads,
    page_bytes: u64,
    /// Scratch map reused every tick, so a tick allocates no new table.
    by_pid: PidMap<usize>,
    /// pid -> (start ticks, replica) for GPU processes.
    attribution: PidMap<(u64, Option<usize>)>,
    /// pid -> (start ticks, command line) for GPU processes.
    commands: PidMap<(u64, String)>,
    /// Untracked-memory and physical-reserve alarms.
    physical: PhysicalWatch,
    /// The last snapshot but one, whose tables the next tick reuses (see [`Sampler::recycle`]).
    spare: Snapshot,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "Sampler({}, {})", self.job, self.source.name())
    }
}

impl Sampler {
    /// A sampler for `infos` (index = replica index) reading GPUs from `source`.
    pub fn new(
        job: &str,
        interval: Duration,
        infos: Vec<ReplicaInfo>,
        source: Box<dyn GpuSource>,
    ) -> Sampler {
        let count = infos.len();
        Sampler {
            job: job.to_string(),
            interval,
            infos,
            source,
            trees: Trees::new(count),
            cpu: CpuReads::new(),
            page_bytes: procfs::page_bytes(),
            by_pid: PidMap::default(),
            attribution: PidMap::default(),
            commands: PidMap::default(),
            physical: PhysicalWatch::default(),
            spare: Snapshot::default(),
        }
    }

    /// Compares physical use with the ledger's charges under `config` from now on.
    pub fn watch_physical(&mut self, config: PhysicalConfig) {
        self.physical = PhysicalWatch::new(config);
    }

    /// Marks the physical alarms in `snapshot` (a tick's, after the policies) and returns the
    /// events of alarms raised or cleared since the last one.
    pub fn check_physical(&mut self, snapshot: &mut Snapshot) -> Vec<crate::events::Event> {
        self.physical.step(snapshot)
    }

    /// Takes back a snapshot this sampler made (once nobody reads it any more): the next tick
    /// refills its tables instead of allocating new ones.
    pub fn recycle(&mut self, old: Snapshot) {
        self.spare = old;
    }

    /// One tick.
    pub fn tick(&mut self, input: TickInput<'_>) -> Snapshot {
        let now = Instant::now();
        let on_beat = self.cpu.on_beat(now, self.interval);
        if let Some(live) = self.trees.discover(input.groups, now) {
            self.cpu.retain(|pid| live.contains(&pid));
        }
        let gpu = self.source.read();
        // The previous snapshot's tables, handed back by `recycle`, are refilled in place: a
        // tick then allocates no string per replica (names and state keep their buffers).
        let mut processes = std::mem::take(&mut self.spare.processes);
        processes.clear();
        let mut replicas = std::mem::take(&mut self.spare.replicas);
        replicas.resize_with(self.infos.len(), ReplicaStat::default);
        for (index, (row, info)) in replicas.iter_mut().zip(&self.infos).enumerate() {
            let usage = input.ledger.get(index).and_then(Option::as_ref);
            let mut process = std::mem::take(&mut row.process);
            let mut label = std::mem::take(&mut row.label);
            let mut state = std::mem::take(&mut row.state);
            if process != info.process {
                process.clone_from(&info.process);
            }
            if label != info.label {
                label.clone_from(&info.label);
            }
            state.clear();
            let mut by_gpu = std::mem::take(&mut row.by_gpu);
            by_gpu.clear();
            *row = ReplicaStat {
                process,
                replica: info.replica,
                label,
                state,
                by_gpu,
                budget_bytes: info.budget_bytes,
                ledger_used_bytes: usage.map(|u| u.used_bytes),
                denials: usage.map_or(0, |u| u.denials),
                ..ReplicaStat::default()
            };
        }
        let trees = &mut self.trees;
        for (index, tree) in trees.trees.iter_mut().enumerate() {
            let Some(group) = tree.group else { continue };
            // In place: a pid whose schedstat cannot be read any more is gone.
            let mut kept = 0;
            let mut stirred = false;
            for at in 0..tree.pids.len() {
                let pid = tree.pids[at];
                let Some(stat) = trees.info.get(&pid) else {
                    continue;
                };
                let Some(cpu) = self
                    .cpu
                    .rate(pid, stat.threads != 1, now, on_beat, self.interval)
                else {
                    stirred = true;
                    continue;
                };
                stirred |= cpu.ran;
                tree.pids[kept] = pid;
                kept += 1;
                let row = &mut replicas[index];
                if stat.state != 'Z' {
                    row.process_count += 1;
                }
                row.rss_bytes += stat.rss_pages * self.page_bytes;
                row.cpu_percent += cpu.percent;
                if stat.ppid == group && row.pid.is_none() {
                    row.pid = Some(pid);
                }
                processes.push(ProcessStat {
                    pid,
                    ppid: stat.ppid,
                    replica: Some(index),
                    state: stat.state,
                    rss_bytes: stat.rss_pages * self.page_bytes,
                    cpu_percent: cpu.percent,
                    ..ProcessStat::default()
                });
            }
            tree.pids.truncate(kept);
            if stirred {
                tree.stir();
            }
        }
        // pid -> index in `processes`, to add GPU figures to the job's own processes; only
        // when some process holds GPU memory (a CPU-only job then pays no hashing per tick).
        let mut by_pid = std::mem::take(&mut self.by_pid);
        by_pid.clear();
        if !gpu.processes.is_empty() {
            by_pid.extend(processes.iter().enumerate().map(|(at, row)| (row.pid, at)));
        }
        let foreign = self.add_gpu_processes(&gpu, &mut processes, &mut by_pid, &mut replicas);
        self.by_pid = by_pid;
        if !gpu.devices.is_empty() {
            // The processes holding GPU memory, in replica order: each replica below takes its
            // run of them, so attribution is one pass, not replicas x processes.
            let mut holders: Vec<&ProcessStat> = processes
                .iter()
                .filter(|process| process.replica.is_some() && !process.gpus.is_empty())
                .collect();
            holders.sort_by_key(|process| process.replica);
            let mut rest = holders.as_slice();
            for (index, row) in replicas.iter_mut().enumerate() {
                let skip = rest
                    .iter()
                    .take_while(|process| process.replica < Some(index))
                    .count();
                rest = &rest[skip..];
                let count = rest
                    .iter()
                    .take_while(|process| process.replica == Some(index))
                    .count();
                let (own, after) = rest.split_at(count);
                rest = after;
                if let Some(Some(usage)) = input.ledger.get(index) {
                    row.by_gpu = shares(own, usage);
                    row.untracked_bytes =
                        Some(row.by_gpu.iter().map(GpuShare::untracked_bytes).sum());
                }
            }
        }
        for (index, row) in replicas.iter_mut().enumerate() {
            let quiet = input
                .last_output_unix_ms
                .get(index)
                .copied()
                .filter(|&last| last > 0);
            row.quiet_ms = quiet.map(|last| input.now_unix_ms.saturating_sub(last));
        }
        Snapshot {
            time_unix_ms: input.now_unix_ms,
            interval_ms: self.interval.as_millis() as u64,
            job: self.job.clone(),
            gpu_source: self.source.name().to_string(),
            gpus: gpu
                .devices
                .iter()
                .map(|device| GpuStat {
                    index: device.index,
                    uuid: device.uuid.clone(),
                    name: device.name.clone(),
                    total_bytes: device.total_bytes,
                    used_bytes: device.used_bytes,
                    utilization_percent: device.utilization_percent,
                    memory_utilization_percent: device.memory_utilization_percent,
                    headroom_alarm: false,
                    physical_alarm: false,
                    node: None,
                })
                .collect(),
            replicas,
            processes,
            foreign_gpu_processes: foreign,
            counters: Default::default(),
        }
    }

    /// Adds the GPU figures: to the job's processes, to newly found descendants (attributed by
    /// their parent chain), or to the foreign list.
    fn add_gpu_processes(
        &mut self,
        gpu: &GpuReading,
        processes: &mut Vec<ProcessStat>,
        by_pid: &mut PidMap<usize>,
        replicas: &mut [ReplicaStat],
    ) -> Vec<ProcessStat> {
        let mut foreign: Vec<ProcessStat> = Vec::new();
        let mut seen: Vec<i32> = Vec::new();
        for reading in &gpu.processes {
            seen.push(reading.pid);
            let at = match by_pid.get(&reading.pid) {
                Some(&at) => Some(at),
                None => {
                    let Some(stat) = procfs::stat_sample(reading.pid) else {
                        continue;
                    };
                    let replica = self.attribute(reading.pid, stat.start_ticks, stat.ppid);
                    let row = ProcessStat {
                        pid: reading.pid,
                        ppid: stat.ppid,
                        replica,
                        state: stat.state,
                        rss_bytes: stat.rss_pages * self.page_bytes,
                        ..ProcessStat::default()
                    };
                    match replica {
                        Some(index) => {
                            // A descendant born since the last discovery: track it from now.
                            self.trees.adopt(index, reading.pid, stat);
                            replicas[index].process_count += 1;
                            replicas[index].rss_bytes += row.rss_bytes;
                            by_pid.insert(reading.pid, processes.len());
                            processes.push(row);
                            Some(processes.len() - 1)
                        }
                        None => {
                            if !foreign.iter().any(|p| p.pid == reading.pid) {
                                foreign.push(row);
                            }
                            None
                        }
                    }
                }
            };
            let target = match at {
                Some(at) => &mut processes[at],
                None => match foreign.iter_mut().find(|p| p.pid == reading.pid) {
                    Some(row) => row,
                    None => continue,
                },
            };
            // Memory the driver does not show (in a container) counts as none.
            let used_bytes = reading.used_bytes.unwrap_or(0);
            target.gpu_bytes += used_bytes;
            match target.gpus.iter().position(|&gpu| gpu == reading.device) {
                Some(at) => target.gpu_bytes_by_gpu[at] += used_bytes,
                None => {
                    target.gpus.push(reading.device);
                    target.gpu_bytes_by_gpu.push(used_bytes);
                }
            }
            if let Some(percent) = reading.utilization_percent {
                target.gpu_utilization_percent =
                    Some(target.gpu_utilization_percent.unwrap_or(0) + percent);
            }
            if target.command.is_empty() {
                target.command = self.command(reading.pid);
            }
            if let Some(index) = target.replica {
                let row = &mut replicas[index];
                row.gpu_bytes += used_bytes;
                if let Some(percent) = reading.utilization_percent {
                    row.gpu_utilization_percent =
                        Some((row.gpu_utilization_percent.unwrap_or(0) + percent).min(100));
                }
            }
        }
        // Forget GPU processes that are gone.
        self.attribution.retain(|pid, _| seen.contains(pid));
        self.commands.retain(|pid, _| seen.contains(pid));
        foreign
    }

    /// The replica `pid` descends from: its parent chain up to a replica's group leader.
    fn attribute(&mut self, pid: i32, start_ticks: u64, ppid: i32) -> Option<usize> {
        if let Some(&(start, replica)) = self.attribution.get(&pid) {
            if start == start_ticks {
                return replica;
            }
        }
        let mut replica = None;
        let mut cursor = pid;
        let mut parent = ppid;
        for _ in 0..MAX_CHAIN {
            if let Some(index) = self.trees.replica_of(cursor) {
                replica = Some(index);
                break;
            }
            if parent <= 1 {
                break;
            }
            // An ancestor already attributed answers for the rest of the chain.
            if let Some(&(_, Some(index))) = self.attribution.get(&parent) {
                replica = Some(index);
                break;
            }
            cursor = parent;
            parent = match procfs::stat(cursor) {
                Some(stat) => stat.ppid,
                None => break,
            };
        }
        self.attribution.insert(pid, (start_ticks, replica));
        replica
    }

    fn command(&mut self, pid: i32) -> String {
        if let Some((_, command)) = self.commands.get(&pid) {
            return command.clone();
        }
        let command = procfs::cmdline(pid);
        let start = procfs::stat_sample(pid).map(|s| s.start_ticks).unwrap_or(0);
        self.commands.insert(pid, (start, command.clone()));
        command
    }
}

/// A replica's memory per GPU: what its processes (`own`) hold there against what the ledger
/// charged it there. A ledger figure without a per-GPU split (one number) is compared with
/// the tree's whole physical use, on the first GPU it holds memory on.
fn shares(own: &[&ProcessStat], usage: &GpuUsage) -> Vec<GpuShare> {
    let mut shares: Vec<GpuShare> = Vec::new();
    for process in own {
        for (&gpu, &bytes) in process.gpus.iter().zip(&process.gpu_bytes_by_gpu) {
            share_on(&mut shares, gpu).physical_bytes += bytes;
        }
    }
    if usage.used_by_gpu.is_empty() {
        let physical: u64 = shares.iter().map(|share| share.physical_bytes).sum();
        let gpu = shares.first().map_or(0, |share| share.gpu);
        shares.clear();
        // Nothing held and nothing charged (a CPU-only replica): no share, and no allocation.
        if physical > 0 || usage.used_bytes > 0 {
            shares.push(GpuShare {
                gpu,
                physical_bytes: physical,
                charged_bytes: usage.used_bytes,
            });
        }
    } else {
        for &(gpu, bytes) in &usage.used_by_gpu {
            share_on(&mut shares, gpu).charged_bytes = bytes;
        }
    }
    shares.retain(|share| share.physical_bytes > 0 || share.charged_bytes > 0);
    shares.sort_by_key(|share| share.gpu);
    shares
}

/// The share of `gpu` in `shares`, added (empty) when missing.
fn share_on(shares: &mut Vec<GpuShare>, gpu: u32) -> &mut GpuShare {
    let at = match shares.iter().position(|share| share.gpu == gpu) {
        Some(at) => at,
        None => {
            shares.push(GpuShare {
                gpu,
                ..GpuShare::default()
            });
            shares.len() - 1
        }
    };
    &mut shares[at]
}

mod cpu;
#[cfg(test)]
mod tests;
mod trees;

use cpu::CpuReads;
pub use cpu::CPU_READ_EVERY;
use trees::Trees;
