//! What `gpuvisor exec` learned about the processes it ran: sampled from the ledger while
//! they run (slots are freed when a process is reclaimed, so peaks and command lines are kept
//! here), then printed as a table or JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use gpuvisor_core::size::ByteSize;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use gpuvisor_ledger::layout::MAGIC;
use gpuvisor_ledger::{EventKind, Ledger, LimitKind};
use serde::Serialize;

use crate::table::Table;

/// One process seen in the ledger.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessRecord {
    /// Process id.
    pub pid: i32,
    /// Its command line (from /proc while it ran), or its name when it was never seen alive.
    pub command: String,
    /// Highest bytes charged, per device of the job.
    pub peak_bytes: Vec<u64>,
    /// Allocations refused.
    pub denied_count: u64,
    /// Tried CUDA while CPU-only.
    pub cpu_only_violation: bool,
    /// Whether `command` is only the 15-byte process name (its command line was never read).
    #[serde(skip)]
    name_only: bool,
}

/// A refused allocation.
#[derive(Debug, Clone, Serialize)]
pub struct Denial {
    /// Process id.
    pub pid: i32,
    /// Device index in the job (position in `--gpu`).
    pub device: u32,
    /// Bytes asked for.
    pub size_bytes: u64,
    /// Bytes in use under the limit that refused it.
    pub used_bytes: u64,
    /// That limit.
    pub limit_bytes: u64,
    /// `process` or `group`.
    pub limit: &'static str,
}

/// Everything the summary prints.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The command as given.
    pub command: Vec<String>,
    /// Its exit status as gpuvisor exits with it (128 + signal when killed).
    pub exit_status: i32,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    /// Seconds it ran.
    pub seconds: f64,
    /// The GPUs of the job (NVML indices).
    pub gpus: Vec<u32>,
    /// Every process that registered with the ledger or was refused, by pid.
    pub processes: Vec<ProcessRecord>,
    /// Refused allocations, oldest first.
    pub denials: Vec<Denial>,
    /// Denials overwritten in the ledger's event ring before they were read.
    pub events_lost: u64,
    /// The ledger file was truncated or overwritten during the run (usage after that unknown).
    pub ledger_damaged: bool,
}

/// Collects samples of one ledger.
#[derive(Debug)]
pub struct Monitor {
    /// The ledger file as opened at the start (its inode, even if the path is replaced), and its
    /// size then; `None` once it was found damaged.
    file: Option<(File, u64)>,
    damaged: bool,
    /// Command lines known without /proc: the direct child's (it may exit between samples).
    known_commands: BTreeMap<i32, String>,
    processes: BTreeMap<(i32, u64), ProcessRecord>,
    denials: Vec<Denial>,
    next_event: u64,
    events_lost: u64,
}

/// The command line of `pid`, space-joined, if it is still readable.
fn command_line(pid: i32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let words: Vec<String> = raw
        .split(|&byte| byte == 0)
        .filter(|word| !word.is_empty())
        .map(|word| String::from_utf8_lossy(word).into_owned())
        .collect();
    (!words.is_empty()).then(|| words.join(" "))
}

impl Monitor {
    /// A monitor of the ledger file at `path` (just created).
    pub fn watching(path: &Path) -> Monitor {
        let file = File::open(path).ok().and_then(|file| {
            let length = file.metadata().ok()?.len();
            Some((file, length))
        });
        Monitor {
            file,
            damaged: false,
            known_commands: BTreeMap::new(),
            processes: BTreeMap::new(),
            denials: Vec::new(),
            next_event: 0,
            events_lost: 0,
        }
    }

    /// Records the command line of `pid` (the child gpuvisor started).
    pub fn know_command(&mut self, pid: i32, command: &[String]) {
        self.known_commands.insert(pid, command.join(" "));
    }

    /// Whether the ledger file still has its size and magic. Someone truncating it would make
    /// reading the mapping fault (SIGBUS), so a damaged ledger is not read again.
    fn intact(&mut self) -> bool {
        let Some((file, length)) = &self.file else {
            return false;
        };
        let mut magic = [0u8; 8];
        let intact = file.metadata().is_ok_and(|meta| meta.len() >= *length)
            && file.read_exact_at(&mut magic, 0).is_ok()
            && magic == MAGIC;
        if !intact {
            self.file = None;
            self.damaged = true;
        }
        intact
    }

    /// Reads the ledger once and merges what it shows.
    pub fn sample(&mut self, ledger: &Ledger) {
        if !self.intact() {
            return;
        }
        let snapshot = ledger.snapshot();
        for process in snapshot.processes {
            let record = self
                .processes
                .entry((process.pid, process.start_time))
                .or_insert_with(|| ProcessRecord {
                    pid: process.pid,
                    command: String::new(),
                    peak_bytes: vec![0; process.peak_bytes.len()],
                    denied_count: 0,
                    cpu_only_violation: false,
                    name_only: false,
                });
            if record.command.is_empty() || record.name_only {
                record.command = self
                    .known_commands
                    .get(&process.pid)
                    .cloned()
                    .or_else(|| command_line(process.pid))
                    .unwrap_or_default();
            }
            if record.command.is_empty() {
                record.command = process.name.clone();
                record.name_only = true;
            }
            for (peak, seen) in record.peak_bytes.iter_mut().zip(&process.peak_bytes) {
                *peak = (*peak).max(*seen);
            }
            record.denied_count = record.denied_count.max(process.denied_count);
            record.cpu_only_violation |= process.cpu_only_violation;
        }
        let batch = ledger.events_since(self.next_event);
        self.next_event = batch.next_seq;
        self.events_lost += batch.lost;
        for event in batch.events {
            match event.kind {
                EventKind::AllocationDenied {
                    device,
                    size_bytes,
                    used_bytes,
                    limit_bytes,
                    limit_kind,
                } => {
                    let limit = match limit_kind {
                        LimitKind::Process => "process",
                        LimitKind::Group => "group",
                    };
                    self.denials.push(Denial {
                        pid: event.pid,
                        device,
                        size_bytes,
                        used_bytes,
                        limit_bytes,
                        limit,
                    });
                }
                EventKind::CpuOnlyViolation { executable } => {
                    let known = self
                        .processes
                        .values_mut()
                        .find(|record| record.pid == event.pid);
                    match known {
                        Some(record) => {
                            record.cpu_only_violation = true;
                            // The executable's path says more than the 15-byte name.
                            if record.name_only && !executable.is_empty() {
                                record.command = executable;
                                record.name_only = false;
                            }
                        }
                        None => {
                            let command = self
                                .known_commands
                                .get(&event.pid)
                                .cloned()
                                .or_else(|| command_line(event.pid))
                                .unwrap_or(executable);
                            let record = ProcessRecord {
                                pid: event.pid,
                                command,
                                peak_bytes: Vec::new(),
                                denied_count: 0,
                                cpu_only_violation: true,
                                name_only: false,
                            };
                            self.processes.insert((event.pid, 0), record);
                        }
                    }
                }
            }
        }
    }

    /// The summary, once the command has exited.
    pub fn finish(
        self,
        command: Vec<String>,
        gpus: Vec<u32>,
        exit_status: i32,
        signal: Option<i32>,
        elapsed: Duration,
    ) -> Summary {
        let mut processes: Vec<ProcessRecord> = self.processes.into_values().collect();
        for record in &mut processes {
            let denied = self
                .denials
                .iter()
                .filter(|denial| denial.pid == record.pid)
                .count() as u64;
            record.denied_count = record.denied_count.max(denied);
        }
        processes.sort_by_key(|record| record.pid);
        Summary {
            command,
            exit_status,
            signal,
            seconds: elapsed.as_secs_f64(),
            gpus,
            processes,
            denials: self.denials,
            events_lost: self.events_lost,
            ledger_damaged: self.damaged,
        }
    }
}

impl Summary {
    /// The human summary (for stderr).
    pub fn render(&self) -> String {
        let status = match self.signal {
            Some(signal) => format!(
                "was killed by signal {signal} (exit status {})",
                self.exit_status
            ),
            None => format!("exited with status {}", self.exit_status),
        };
        let mut out = format!(
            "gpuvisor: `{}` {status} after {:.1} s\n",
            self.command.join(" "),
            self.seconds
        );
        let gpu_processes: Vec<&ProcessRecord> = self
            .processes
            .iter()
            .filter(|record| {
                !record.cpu_only_violation || record.peak_bytes.iter().any(|&bytes| bytes > 0)
            })
            .collect();
        if gpu_processes.is_empty() {
            out.push_str("  no process used a GPU\n");
        } else {
            let peak_header = match self.gpus.as_slice() {
                [gpu] => format!("PEAK (GPU {gpu})"),
                gpus => format!(
                    "PEAK (GPUs {})",
                    gpus.iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            };
            let mut table = Table::new(&["PID", &peak_header, "DENIED", "COMMAND"]);
            for record in gpu_processes {
                let peaks: Vec<String> = record
                    .peak_bytes
                    .iter()
                    .map(|bytes| ByteSize(*bytes).to_string())
                    .collect();
                table.row(vec![
                    record.pid.to_string(),
                    peaks.join(", "),
                    record.denied_count.to_string(),
                    record.command.clone(),
                ]);
            }
            out.push_str(&table.render("  "));
        }
        if !self.denials.is_empty() {
            out.push_str(&format!("  denied allocations: {}\n", self.denials.len()));
            for denial in self.denials.iter().take(10) {
                out.push_str(&format!(
                    "    pid {}: {} refused on GPU {} ({} in use of a {} {} limit)\n",
                    denial.pid,
                    ByteSize(denial.size_bytes),
                    self.gpus
                        .get(denial.device as usize)
                        .copied()
                        .unwrap_or(denial.device),
                    ByteSize(denial.used_bytes),
                    ByteSize(denial.limit_bytes),
                    denial.limit
                ));
            }
            if self.denials.len() > 10 {
                out.push_str(&format!("    ... and {} more\n", self.denials.len() - 10));
            }
        }
        let violators: Vec<&ProcessRecord> = self
            .processes
            .iter()
            .filter(|record| record.cpu_only_violation)
            .collect();
        if !violators.is_empty() {
            out.push_str(&format!(
                "  CPU-only violations: {} process(es) tried to use CUDA and were refused\n",
                violators.len()
            ));
            for record in violators {
                out.push_str(&format!("    pid {}: {}\n", record.pid, record.command));
            }
        }
        if self.ledger_damaged {
            out.push_str("  the ledger file was truncated or overwritten during the run: usage after that is unknown, and the shim let every call through\n");
        }
        if self.events_lost > 0 {
            out.push_str(&format!(
                "  ({} events were lost: the ledger's event ring overflowed)\n",
                self.events_lost
            ));
        }
        out
    }
}
