//! Where the watch gets what it knows of a quiet replica beyond the snapshot
//! ([`StallSource`]), and the live source: the threads and listening sockets of its
//! processes from /proc, the tail of its log in the run directory, ranks from the
//! processes' environments.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::procfs::{self, threads};
use crate::stall_class::ThreadSample;
use gpuvisor_record::log_file::{self, direct};

/// The distributed rank of `pid` from its environment (`RANK`, else `JAX_PROCESS_ID`,
/// `OMPI_COMM_WORLD_RANK`, `SLURM_PROCID`), if it is readable and set.
pub fn rank(pid: i32) -> Option<u32> {
    procfs::environ_value(
        pid,
        &[
            "RANK",
            "JAX_PROCESS_ID",
            "OMPI_COMM_WORLD_RANK",
            "SLURM_PROCID",
        ],
        |value| value.parse().ok(),
    )
}

/// Where the watch gets what it knows of a quiet replica beyond the snapshot: read only for
/// replicas quiet for half their `stall_after` or more, so a healthy job costs nothing.
pub trait StallSource {
    /// Every thread of these processes now.
    fn threads(&mut self, pids: &[i32]) -> Vec<ThreadSample>;
    /// What this source cannot see (for the event's `not_available`).
    fn not_available(&self) -> Vec<String>;
    // What a source that cannot see something returns by default: nothing found.
    /// The TCP ports these processes listen on: (pid, port).
    fn listening(&mut self, _pids: &[i32]) -> Vec<(i32, u16)> {
        Vec::new()
    }
    /// The tail of replica `index`'s log.
    fn log_tail(&mut self, _index: usize) -> String {
        String::new()
    }
    /// The distributed rank of `pid`, if its environment says.
    fn rank(&mut self, _pid: i32) -> Option<u32> {
        None
    }
    /// Bytes these processes have read so far, all together (`None`: not known). A quiet
    /// replica that keeps reading is loading, not stalled.
    fn read_progress(&mut self, _pids: &[i32]) -> Option<u64> {
        None
    }
}

/// No evidence beyond the snapshot (hand-made snapshots, tests of other rules).
#[derive(Debug, Default)]
pub struct NoStallSource;

impl StallSource for NoStallSource {
    fn threads(&mut self, _pids: &[i32]) -> Vec<ThreadSample> {
        Vec::new()
    }
    fn not_available(&self) -> Vec<String> {
        vec!["threads".into(), "log".into()]
    }
}

/// How much of a log's end is read for hang lines.
const LOG_TAIL_BYTES: u64 = 64 * 1024;

/// Evidence from /proc and the run directory.
#[derive(Debug)]
pub struct ProcStallSource<'a> {
    /// The run directory (its `logs/`).
    pub run_dir: &'a Path,
    /// Per replica: its log's name in `logs/` (without `.log`).
    pub file_stems: Vec<&'a str>,
    /// Whether py-spy is installed (the stacks it dumps are files beside the event).
    pub py_spy: bool,
}

impl StallSource for ProcStallSource<'_> {
    fn threads(&mut self, pids: &[i32]) -> Vec<ThreadSample> {
        pids.iter().flat_map(|&pid| threads::threads(pid)).collect()
    }

    fn listening(&mut self, pids: &[i32]) -> Vec<(i32, u16)> {
        threads::listening_ports(pids)
    }

    fn log_tail(&mut self, index: usize) -> String {
        let Some(stem) = self.file_stems.get(index) else {
            return String::new();
        };
        let path = self.run_dir.join("logs").join(format!("{stem}.log"));
        if direct::direct_of(&path).is_some() {
            // Direct logs: both streams' lines (merged by the record's reader), as plain text.
            return log_file::read_tail(&path, LOG_TAIL_BYTES)
                .unwrap_or_default()
                .into_iter()
                .map(|line| line.text + "\n")
                .collect();
        }
        read_tail(&path, LOG_TAIL_BYTES)
    }

    fn rank(&mut self, pid: i32) -> Option<u32> {
        rank(pid)
    }

    fn read_progress(&mut self, pids: &[i32]) -> Option<u64> {
        pids.iter()
            .filter_map(|&pid| threads::read_progress_bytes(pid))
            .reduce(u64::saturating_add)
    }

    fn not_available(&self) -> Vec<String> {
        if self.py_spy {
            Vec::new()
        } else {
            vec!["py-spy (Python and native stacks)".into()]
        }
    }
}

/// The last `bytes` of a file, from a line start (empty if unreadable).
pub fn read_tail(path: &Path, bytes: u64) -> String {
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let length = file.metadata().map(|meta| meta.len()).unwrap_or(0);
    let start = length.saturating_sub(bytes);
    if file.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut raw = Vec::new();
    let _ = file.take(bytes).read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    match (start > 0, text.find('\n')) {
        (true, Some(at)) => text[at + 1..].to_string(),
        _ => text.into_owned(),
    }
}
