//! CPU and resident memory from /proc, for rows the sampler does not cover (a supervisor
//! without it, the machine-wide view).

use std::collections::HashMap;
use std::time::Instant;

/// CPU and resident memory per process group or pid, from /proc, with CPU as the change of
/// CPU time between two polls.
#[derive(Debug, Default)]
pub struct ProcStats {
    last: HashMap<u32, (u64, Instant)>,
}

/// One process's figures from /proc/PID/stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The process.
    pub pid: u32,
    /// Its process group.
    pub pgrp: u32,
    /// User + system CPU time, clock ticks.
    pub cpu_ticks: u64,
    /// Resident pages.
    pub rss_pages: u64,
}

/// Parses /proc/PID/stat (the command name may hold spaces and parentheses: fields are
/// counted after the last `)`).
pub fn parse_proc_stat(pid: u32, text: &str) -> Option<ProcStat> {
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state(3) ppid(4) pgrp(5) ... utime(14) stime(15) ... rss(24).
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    Some(ProcStat {
        pid,
        pgrp: field(5)? as u32,
        cpu_ticks: field(14)? + field(15)?,
        rss_pages: field(24)?,
    })
}

impl ProcStats {
    /// `root` and every process below it, found through the kernel's children lists
    /// (`/proc/PID/task/TID/children`), so only the tree's own files are read, not all of
    /// /proc. Processes that vanish while read are skipped.
    pub fn tree(root: u32) -> Vec<ProcStat> {
        let mut found = Vec::new();
        let mut pending = vec![root];
        // A bound against a pid reused into a loop while we walk.
        while let Some(pid) = pending.pop().filter(|_| found.len() < 100_000) {
            let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some(stat) = parse_proc_stat(pid, &text) else {
                continue;
            };
            found.push(stat);
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for task in tasks.flatten() {
                let children = std::fs::read_to_string(task.path().join("children"));
                pending.extend(
                    children
                        .iter()
                        .flat_map(|text| text.split_whitespace())
                        .filter_map(|child| child.parse::<u32>().ok()),
                );
            }
        }
        found
    }

    /// CPU percent of one core and resident bytes for `key` (a pid or a process group)
    /// whose processes now use `cpu_ticks` and `rss_pages` in total. CPU needs two polls.
    pub fn figures(&mut self, key: u32, cpu_ticks: u64, rss_pages: u64) -> (Option<f32>, u64) {
        let now = Instant::now();
        let rss_bytes = rss_pages * rustix::param::page_size() as u64;
        let previous = self.last.get(&key).copied();
        let cpu = previous.and_then(|(ticks, then)| {
            let seconds = now.duration_since(then).as_secs_f32();
            // A group that lost processes can go down in total: no figure then. Under 0.1 s
            // (two polls in a row, as --once does) 10 ms clock ticks say nothing.
            (seconds >= 0.1 && cpu_ticks >= ticks).then(|| {
                let hz = rustix::param::clock_ticks_per_second() as f32;
                (cpu_ticks - ticks) as f32 / hz / seconds * 100.0
            })
        });
        // The baseline moves only when a figure was taken (or the total went down), so polls
        // in quick succession measure from the last real one.
        if cpu.is_some() || previous.is_none_or(|(ticks, _)| cpu_ticks < ticks) {
            self.last.insert(key, (cpu_ticks, now));
        }
        (cpu, rss_bytes)
    }
}
