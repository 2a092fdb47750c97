//! The machine-wide view (`gpuvisor top` without RUN): every process holding GPU memory, like
//! nvitop, with arrivals and departures as its events.

use std::collections::{BTreeMap, VecDeque};
use std::time::SystemTime;

use super::app::Action;
use super::model::{EventLine, GpuView, ProcessRow, Segment, Tone, TopModel};
use super::procfs::ProcStats;
use gpuvisor_probe::GpuSource;

use super::source::{push_util, read_samples, TopSource, EVENTS_KEPT};

/// Every process holding GPU memory on this machine, read from its GPU source each poll.
pub struct MachineSource {
    gpus: Box<dyn GpuSource>,
    note: String,
    procs: ProcStats,
    util: BTreeMap<u32, VecDeque<u8>>,
    seen: BTreeMap<u32, String>,
    events: Vec<EventLine>,
}

impl MachineSource {
    /// A source over `gpus`; `note` says where its figures come from (`NVML`,
    /// `simulated: 2x80GiB`).
    pub fn new(gpus: Box<dyn GpuSource>, note: String) -> Self {
        Self {
            gpus,
            note,
            procs: ProcStats::default(),
            util: BTreeMap::new(),
            seen: BTreeMap::new(),
            events: Vec::new(),
        }
    }
}

impl TopSource for MachineSource {
    fn poll(&mut self, _selected: Option<&str>) -> TopModel {
        let mut model = TopModel {
            title: "all GPU processes on this machine".to_string(),
            source_note: self.note.clone(),
            log_title: "none: processes not started by gpuvisor run have no log here".to_string(),
            ..TopModel::default()
        };
        let samples = match read_samples(self.gpus.as_mut()) {
            Ok(samples) => samples,
            Err(why) => {
                model.warning = Some(why);
                Vec::new()
            }
        };
        let mut rows: BTreeMap<u32, ProcessRow> = BTreeMap::new();
        for sample in &samples {
            let history = self.util.entry(sample.index).or_default();
            push_util(history, sample.util_percent);
            let mut processes = sample.processes.clone();
            processes.sort_by_key(|p| p.pid);
            model.gpus.push(GpuView {
                index: sample.index,
                name: sample.name.clone(),
                total_bytes: sample.total_bytes,
                used_bytes: sample.used_bytes,
                segments: processes
                    .iter()
                    .map(|p| Segment {
                        label: format!("{} ({})", p.name.as_deref().unwrap_or("?"), p.pid),
                        used_bytes: p.used_bytes.unwrap_or(0),
                        budget_bytes: None,
                    })
                    .collect(),
                util_history: history.clone(),
            });
            for process in processes {
                let row = rows.entry(process.pid).or_insert_with(|| ProcessRow {
                    key: process.pid.to_string(),
                    name: process.name.clone().unwrap_or_else(|| "?".to_string()),
                    pid: Some(process.pid),
                    state: "on GPU".to_string(),
                    ..ProcessRow::default()
                });
                row.state.push_str(&format!(" {}", sample.index));
                if let Some(bytes) = process.used_bytes {
                    *row.gpu_used_bytes.get_or_insert(0) += bytes;
                }
            }
        }
        for row in rows.values_mut() {
            let pid = row.pid.unwrap_or(0);
            // Only the GPU processes are read, not all of /proc.
            let stat = gpuvisor_probe::procfs::stat_sample(pid as i32);
            if let Some(stat) = stat {
                let (cpu, rss) = self.procs.figures(pid, stat.cpu_ticks, stat.rss_pages);
                row.cpu_percent = cpu;
                row.rss_bytes = Some(rss);
            }
        }
        // Arrivals and departures are the events of a machine-wide view.
        let clock = utc_clock(SystemTime::now());
        for row in rows.values() {
            let pid = row.pid.unwrap_or(0);
            if !self.seen.contains_key(&pid) {
                self.events.push(EventLine {
                    time: clock.clone(),
                    kind: "start".to_string(),
                    tone: Tone::Good,
                    text: format!("{} pid {pid} holds GPU memory", row.name),
                });
            }
        }
        let gone: Vec<(u32, String)> = self
            .seen
            .iter()
            .filter(|(pid, _)| !rows.contains_key(pid))
            .map(|(pid, name)| (*pid, name.clone()))
            .collect();
        for (pid, name) in gone {
            self.events.push(EventLine {
                time: clock.clone(),
                kind: "exit".to_string(),
                tone: Tone::Bad,
                text: format!("{name} pid {pid} released the GPU"),
            });
        }
        self.seen = rows
            .iter()
            .map(|(pid, row)| (*pid, row.name.clone()))
            .collect();
        let excess = self.events.len().saturating_sub(EVENTS_KEPT);
        self.events.drain(..excess);
        model.events = self.events.clone();
        model.rows = rows.into_values().collect();
        model
    }

    fn act(&mut self, _action: &Action) -> Result<String, String> {
        Err("no run: restart and stop need `gpuvisor top RUN`".to_string())
    }
}

/// `HH:MM:SS` UTC of a time.
fn utc_clock(time: SystemTime) -> String {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let day = secs % 86_400;
    format!("{:02}:{:02}:{:02}", day / 3600, day / 60 % 60, day % 60)
}
