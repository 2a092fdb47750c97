//! Where `top`'s data comes from, behind [`TopSource`]: a run directory ([`RunSource`]: the
//! supervisor's control socket while it runs, its record after) or the whole machine
//! ([`MachineSource`]: every process holding GPU memory, like nvitop).
//!
//! GPU figures come from a gpuvisor-probe [`GpuSource`] the caller opens (NVML for viewing, or
//! the simulated inventory as a fixed reading), its readings turned into samples by
//! [`gpu_samples_of_reading`]; CPU and resident memory come from /proc (gpuvisor-probe's
//! reader) here.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use gpuvisor_core::inventory::GpuProcess;
use gpuvisor_probe::{GpuReading, GpuSource};
use gpuvisor_record::control::{self, Request};
use serde_json::Value;

use super::app::Action;
use super::model::{GpuView, Segment, TopModel, UTIL_HISTORY_LEN};
use super::procfs::ProcStats;
use super::record::{
    event_lines, log_path, merge_sample, parse_events, parse_plan, read_log_tail, read_tail,
    rows_from_events, rows_from_ps, torn_tail, PlanInfo, TAIL_BYTES,
};

/// How many events the screen keeps.
pub(super) const EVENTS_KEPT: usize = 200;
/// How many log lines a tail keeps.
const LOG_LINES_KEPT: usize = 500;

/// A source of frames for `top`.
pub trait TopSource {
    /// Reads the current state; `selected` is the row whose log tail to include.
    fn poll(&mut self, selected: Option<&str>) -> TopModel;
    /// Carries out a restart or stop; the answer is the status-line message.
    fn act(&mut self, action: &Action) -> Result<String, String>;
}

/// One GPU as a probe sees it right now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSample {
    /// NVML index.
    pub index: u32,
    /// Model name.
    pub name: String,
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Memory in use by anyone, bytes.
    pub used_bytes: Option<u64>,
    /// Utilisation in percent, when the probe can read it.
    pub util_percent: Option<u8>,
    /// The processes holding memory on it.
    pub processes: Vec<GpuProcess>,
    /// Its node, in a multi-node run's merged sample.
    pub node: Option<String>,
}

/// One frame's GPU samples from `source`; a failed read is said in the status line.
pub(super) fn read_samples(source: &mut dyn GpuSource) -> Result<Vec<GpuSample>, String> {
    source
        .try_read()
        .map(|reading| gpu_samples_of_reading(&reading))
}

/// Sends one request to a supervisor's control socket and reads its one-line JSON reply.
pub fn control_request(socket: &Path, request: &Request) -> std::io::Result<Value> {
    // A supervisor busy stopping a job answers late; the UI must not freeze for long.
    control::request_within(socket, request, Duration::from_secs(3))
}

pub(super) fn push_util(history: &mut VecDeque<u8>, sample: Option<u8>) {
    if let Some(percent) = sample {
        if history.len() == UTIL_HISTORY_LEN {
            history.pop_front();
        }
        history.push_back(percent);
    }
}

fn seconds_since(modified: std::io::Result<SystemTime>) -> Option<u64> {
    let modified = modified.ok()?;
    Some(
        SystemTime::now()
            .duration_since(modified)
            .unwrap_or_default()
            .as_secs(),
    )
}

/// A run directory: live through its control socket while the supervisor answers, else from
/// its record (plan.json, events.jsonl, logs/).
pub struct RunSource {
    run: PathBuf,
    gpus: Option<Box<dyn GpuSource>>,
    plan: Option<PlanInfo>,
    procs: ProcStats,
    util: BTreeMap<(Option<String>, u32), VecDeque<u8>>,
    events_cache: (Option<FileStamp>, Vec<Value>, bool),
}

/// A file's length and modification time: when both are unchanged, so is its tail.
type FileStamp = (u64, Option<SystemTime>);

impl RunSource {
    /// A source over `run`; `gpus` adds per-GPU usage and utilisation when given.
    pub fn new(run: PathBuf, gpus: Option<Box<dyn GpuSource>>) -> Self {
        Self {
            run,
            gpus,
            plan: None,
            procs: ProcStats::default(),
            util: BTreeMap::new(),
            events_cache: (None, Vec::new(), false),
        }
    }

    /// The tail of the event log, parsed again only when the file has grown or changed.
    fn events(&mut self) -> Vec<Value> {
        let path = gpuvisor_record::RunDir::at(&self.run).events_path();
        let stamp = std::fs::metadata(&path)
            .ok()
            .map(|meta| (meta.len(), meta.modified().ok()));
        if stamp.is_none() || stamp != self.events_cache.0 {
            let text = read_tail(&path, TAIL_BYTES * 4).unwrap_or_default();
            self.events_cache = (stamp, parse_events(&text), torn_tail(&text));
        }
        self.events_cache.1.clone()
    }

    fn socket(&self) -> PathBuf {
        gpuvisor_record::RunDir::at(&self.run).socket_path()
    }

    fn plan(&mut self) -> Result<&PlanInfo, String> {
        if self.plan.is_none() {
            let path = gpuvisor_record::RunDir::at(&self.run).plan_path();
            let text = std::fs::read_to_string(&path)
                .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
            let plan = parse_plan(&text)
                .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
            self.plan = Some(plan);
        }
        Ok(self.plan.as_ref().expect("just set"))
    }
}

impl TopSource for RunSource {
    fn poll(&mut self, selected: Option<&str>) -> TopModel {
        let mut model = TopModel {
            title: self.run.display().to_string(),
            supervised: true,
            ..TopModel::default()
        };
        let plan = match self.plan() {
            Ok(plan) => plan.clone(),
            Err(why) => {
                model.warning = Some(why);
                PlanInfo::default()
            }
        };
        let events = self.events();
        let live = control_request(&self.socket(), &Request::Ps)
            .ok()
            .filter(|reply| reply["ok"] == true);
        // The sampler's snapshot, where the supervisor has one (older ones refuse the request).
        let snapshot = live
            .as_ref()
            .and_then(|_| control_request(&self.socket(), &Request::Sample).ok())
            .filter(|reply| reply["ok"] == true)
            .map(|mut reply| reply["sample"].take())
            .filter(|sample| sample["replicas"].as_array().is_some_and(|r| !r.is_empty()));
        model.rows = match &live {
            Some(reply) => {
                let mut rows = rows_from_ps(&reply["replicas"]);
                if let Some(snapshot) = &snapshot {
                    merge_sample(&mut rows, snapshot);
                    model.source_note = "live, sampled".to_string();
                } else {
                    model.source_note = "live".to_string();
                }
                rows
            }
            None => {
                model.source_note = "not running: from its record".to_string();
                if self.events_cache.2 {
                    model.warning.get_or_insert_with(|| {
                        "the record's last line is torn (the supervisor was killed mid-write): skipped".to_string()
                    });
                }
                // The event tail may have lost a run's first events; restarts then count
                // from there.
                rows_from_events(&plan, &events)
            }
        };

        // CPU and RSS of each replica's process group (its keeper's), when it runs.
        let groups = live.as_ref().map(|reply| {
            reply["replicas"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| Some((r["label"].as_str()?.to_string(), r["group"].as_u64()?)))
                .collect::<HashMap<String, u64>>()
        });
        // Without the sampler's figures, CPU and RSS come from /proc here.
        let groups = groups.filter(|groups| !groups.is_empty() && snapshot.is_none());
        if let Some(groups) = groups {
            for row in &mut model.rows {
                let Some(&group) = groups.get(&row.key) else {
                    continue;
                };
                // The keeper (the group's leader) and everything below it.
                let tree = gpuvisor_probe::procfs::tree(group as i32);
                if tree.is_empty() {
                    continue;
                }
                let ticks = tree.iter().map(|stat| stat.cpu_ticks).sum();
                let pages = tree.iter().map(|stat| stat.rss_pages).sum();
                let (cpu, rss) = self.procs.figures(group as u32, ticks, pages);
                row.cpu_percent = cpu;
                row.rss_bytes = Some(rss);
            }
        }

        // The sampler knows when the tree last printed; without it, the log file's time.
        for row in model
            .rows
            .iter_mut()
            .filter(|row| row.since_log_secs.is_none())
        {
            if let Some(planned) = plan.replicas.iter().find(|p| p.label == row.key) {
                let path = self.run.join(log_path(
                    &planned.process,
                    planned.replica,
                    planned.replicas,
                ));
                row.since_log_secs =
                    seconds_since(std::fs::metadata(&path).and_then(|m| m.modified()));
            }
        }

        // The supervisor samples the GPUs itself (NVML or the simulator); read them here only
        // when it does not.
        let from_snapshot = snapshot.as_ref().map(gpu_samples_of_snapshot);
        let samples = match from_snapshot {
            Some(samples) if !samples.is_empty() => samples,
            _ => match self.gpus.as_mut().map(|gpus| read_samples(gpus.as_mut())) {
                Some(Ok(samples)) => samples,
                Some(Err(why)) => {
                    model.warning.get_or_insert(why);
                    Vec::new()
                }
                None => Vec::new(),
            },
        };
        for gpu in &plan.gpus {
            let sample = samples
                .iter()
                .find(|s| s.index == gpu.index && s.node == gpu.node);
            let history = self.util.entry((gpu.node.clone(), gpu.index)).or_default();
            push_util(history, sample.and_then(|s| s.util_percent));
            let segments = plan
                .replicas
                .iter()
                .filter(|replica| {
                    replica.gpus.contains(&gpu.index)
                        && replica.node == gpu.node
                        && replica.budget_bytes > 0
                })
                .map(|replica| {
                    let used = model
                        .rows
                        .iter()
                        .find(|row| row.key == replica.label)
                        .and_then(|row| row.gpu_used_bytes)
                        .unwrap_or(0);
                    Segment {
                        label: replica.label.clone(),
                        // The ledger's figure is the replica's total; spread it over its GPUs.
                        used_bytes: used / replica.gpus.len().max(1) as u64,
                        budget_bytes: Some(replica.budget_bytes),
                    }
                })
                .collect();
            model.gpus.push(GpuView {
                index: gpu.index,
                name: match &gpu.node {
                    Some(node) => format!("{} on {node}", gpu.name),
                    None => gpu.name.clone(),
                },
                total_bytes: gpu.total_bytes,
                used_bytes: sample.and_then(|s| s.used_bytes),
                segments,
                util_history: history.clone(),
            });
        }

        let mut lines = event_lines(&events);
        model.events = lines.split_off(lines.len().saturating_sub(EVENTS_KEPT));

        let selected = selected.and_then(|key| plan.replicas.iter().find(|p| p.label == key));
        match selected {
            Some(planned) => {
                let relative = log_path(&planned.process, planned.replica, planned.replicas);
                match read_log_tail(&self.run.join(&relative), TAIL_BYTES) {
                    Ok(mut lines) => {
                        lines.drain(..lines.len().saturating_sub(LOG_LINES_KEPT));
                        model.log_tail = lines;
                        model.log_title = relative;
                    }
                    Err(_) => model.log_title = format!("{relative} (none yet)"),
                }
            }
            None => model.log_title = "no process selected".to_string(),
        }
        model
    }

    fn act(&mut self, action: &Action) -> Result<String, String> {
        let (request, done) = match action {
            Action::Restart(process) => (
                Request::Restart {
                    process: process.clone(),
                },
                format!("restart of {process} requested"),
            ),
            Action::Stop(process) => (
                Request::Stop {
                    process: Some(process.clone()),
                },
                format!("stop of {process} requested"),
            ),
            Action::None | Action::Quit => return Ok(String::new()),
        };
        let reply = control_request(&self.socket(), &request)
            .map_err(|error| format!("the run is not running (control socket: {error})"))?;
        if reply["ok"] == true {
            Ok(done)
        } else {
            let error = reply["error"].as_str().unwrap_or("the supervisor refused");
            Err(error.lines().next().unwrap_or(error).to_string())
        }
    }
}

/// The GPUs of a probe's reading as samples; used memory is what is no longer free.
pub fn gpu_samples_of_reading(reading: &GpuReading) -> Vec<GpuSample> {
    reading
        .devices
        .iter()
        .map(|device| GpuSample {
            index: device.index,
            name: device.name.clone().unwrap_or_default(),
            total_bytes: device.total_bytes,
            used_bytes: Some(device.total_bytes.saturating_sub(device.free_bytes)),
            util_percent: device
                .utilization_percent
                .map(|percent| percent.min(100) as u8),
            processes: reading
                .processes_on(device.index)
                .map(|process| process.to_process())
                .collect(),
            node: None,
        })
        .collect()
}

/// The GPUs of a sampler snapshot (`{"cmd":"sample"}`), as probe samples.
pub fn gpu_samples_of_snapshot(snapshot: &Value) -> Vec<GpuSample> {
    snapshot["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|gpu| {
            Some(GpuSample {
                index: gpu["index"].as_u64()? as u32,
                name: gpu["name"].as_str().unwrap_or_default().to_string(),
                total_bytes: gpu["total_bytes"].as_u64().unwrap_or(0),
                used_bytes: gpu["used_bytes"].as_u64(),
                util_percent: gpu["utilization_percent"]
                    .as_u64()
                    .map(|percent| percent.min(100) as u8),
                processes: Vec::new(),
                node: gpu["node"].as_str().map(str::to_string),
            })
        })
        .collect()
}
