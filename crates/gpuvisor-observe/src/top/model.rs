//! The view model of `gpuvisor top`: plain data that a source fills in and [`super::render`]
//! draws. Nothing here does I/O, so every screen can be built by hand in a test.

use std::collections::VecDeque;

/// How many utilisation samples a GPU keeps for its sparkline (one per tick).
pub const UTIL_HISTORY_LEN: usize = 120;

/// Everything one frame shows, as the source last saw it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopModel {
    /// The title line: the run (`runs/isaac-rl-...`) or `all GPU processes on this machine`.
    pub title: String,
    /// Where the data comes from right now (`live`, `finished run (from its record)`,
    /// `NVML`, `simulated: 2x80GiB`).
    pub source_note: String,
    /// Whether rows belong to a supervised run (restart and stop work) or are machine-wide.
    pub supervised: bool,
    /// One entry per GPU, in index order.
    pub gpus: Vec<GpuView>,
    /// One row per replica (run) or per GPU process (machine-wide).
    pub rows: Vec<ProcessRow>,
    /// The most recent events, oldest first.
    pub events: Vec<EventLine>,
    /// The log tail of the selected row, oldest first (filled by the source for the row the
    /// app asks about).
    pub log_tail: Vec<LogLine>,
    /// What the log tail shows (`logs/actor.2.log`), or why there is none.
    pub log_title: String,
    /// A problem reading the source, shown in the status line (the last good data stays).
    pub warning: Option<String>,
}

/// One GPU: its memory split by holder and its utilisation history.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuView {
    /// NVML index.
    pub index: u32,
    /// Model name.
    pub name: String,
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Memory in use by anyone, bytes, when known (else the sum of the segments is shown).
    pub used_bytes: Option<u64>,
    /// The holders, in plan order (run) or pid order (machine-wide).
    pub segments: Vec<Segment>,
    /// Utilisation samples in percent, oldest first (empty when unknown).
    pub util_history: VecDeque<u8>,
}

/// One holder's share of a GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segment {
    /// Who holds it (`actor[2]`, `python3 (4242)`).
    pub label: String,
    /// Bytes held now.
    pub used_bytes: u64,
    /// Its budget on this GPU, bytes; `None` when it has none (machine-wide view).
    pub budget_bytes: Option<u64>,
}

/// One line of the process table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessRow {
    /// What the row stands for: the replica label (`actor[2]`) or `pid` for a machine-wide row.
    pub key: String,
    /// Job-file process name (run) or command name (machine-wide); restart and stop act on it.
    pub name: String,
    /// Replica number, when the process has replicas.
    pub replica: Option<u32>,
    /// The command's pid while it runs.
    pub pid: Option<u32>,
    /// `running`, `backoff`, `exited (failed)`, ... (machine-wide: `on GPU 0`).
    pub state: String,
    /// GPU memory held now, bytes.
    pub gpu_used_bytes: Option<u64>,
    /// Its budget per GPU, bytes (`None` or 0: none).
    pub budget_bytes: Option<u64>,
    /// Peak GPU memory, bytes.
    pub gpu_peak_bytes: Option<u64>,
    /// GPU memory its tree holds that the ledger never charged (physical − charged), bytes.
    pub untracked_bytes: Option<u64>,
    /// `untracked_bytes` is past the replica's `untracked_alarm`.
    pub untracked_alarm: bool,
    /// GPU utilisation attributed to it, percent.
    pub gpu_util_percent: Option<u8>,
    /// CPU use of its process tree, percent of one core.
    pub cpu_percent: Option<f32>,
    /// Resident memory of its process tree, bytes.
    pub rss_bytes: Option<u64>,
    /// Restarts so far.
    pub restarts: u32,
    /// Seconds since its last log line.
    pub since_log_secs: Option<u64>,
    /// The sampler's stall class while it is quiet too long (`waiting`, `gpu-bound`,
    /// `compiling-or-cpu-bound`).
    pub stall: Option<String>,
}

/// One event of the run, already worded for the screen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventLine {
    /// `HH:MM:SS` (UTC).
    pub time: String,
    /// The event kind (`exit`, `restart`, ...), as the record writes it.
    pub kind: String,
    /// What kind of news it is, which picks the kind's colour.
    pub tone: Tone,
    /// The rest, worded (`actor[2] exit code 1 (cuda-oom)`).
    pub text: String,
}

/// What kind of news an event is, for its colour (told from the typed event, not its kind's
/// text).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Tone {
    /// Neither good nor bad.
    #[default]
    Plain,
    /// Something started or became ready.
    Good,
    /// Worth a look: a restart, a signal, a request, memory the budgets do not cover.
    Notice,
    /// Something ended or was refused.
    Bad,
}

/// One line of a log tail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogLine {
    /// `HH:MM:SS` (UTC), when the line carried gpuvisor's timestamp.
    pub time: String,
    /// Whether it came from stderr.
    pub stderr: bool,
    /// The text.
    pub text: String,
}
