//! The text evidence of a stall: hang lines in a replica's log (torch's and NCCL's timeouts,
//! the simulator's stall line) and what a `py-spy dump --native` says a thread waits for.
//! Pure functions over text, shared by the stall classifier, exit causes and `explain RUN`.

use gpuvisor_record::log_file::LineReader;

use crate::stall_class::StallCause;

/// What the replica's log says about a hang.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogSignals {
    /// A collective timed out (torch's watchdog, NCCL): the line.
    pub collective_timeout: Option<String>,
    /// A communicator or rendezvous timed out waiting for peers: the line.
    pub peer_timeout: Option<String>,
    /// The simulator holds a kernel back now (GPUVISOR_SIM_STALL): its line.
    pub simulated_stall: Option<String>,
}

/// Lines that say a collective timed out: ProcessGroupNCCL's watchdog ("Watchdog caught
/// collective operation timeout: WorkNCCL(...) ran for N milliseconds before timing out",
/// "[PG ... Rank N] ... Operation timed out after N ms"), NCCL's own "NCCL WARN ... timeout".
const COLLECTIVE_TIMEOUT: [&str; 3] = [
    "Watchdog caught collective operation timeout",
    "Operation timed out after",
    "collective operation timed out",
];
/// Lines that say peers never came: torch's communicator init ("Failed to initialize NCCL
/// communicator timed out after N ms", eager init with a timeout), the TCPStore ("Timed out
/// after N seconds waiting for clients. M/W clients joined."), torch's flight recorder ("are
/// the lagging ranks that caused this timeout. They never joined any collectives"),
/// jax.distributed's coordination service (Barrier timed out ... DEADLINE_EXCEEDED).
const PEER_TIMEOUT: [&str; 5] = [
    "Failed to initialize NCCL communicator timed out",
    "waiting for clients",
    "They never joined any collectives",
    "NCCL timeout when waiting for nonblocking call",
    "Barrier timed out",
];

/// Whether `line` says a collective timed out (`Collective`) or peers never came (`Peers`).
pub fn timeout_kind(line: &str) -> Option<StallCause> {
    if COLLECTIVE_TIMEOUT.iter().any(|p| line.contains(p)) {
        Some(StallCause::Collective)
    } else if PEER_TIMEOUT.iter().any(|p| line.contains(p)) {
        Some(StallCause::Peers)
    } else {
        None
    }
}

/// The simulator's line when it starts holding a kernel back (stall.rs): `gpuvisor-sim:
/// stalling `KERNEL` (...) for SECONDS s until unix ms UNIX_MS (GPUVISOR_SIM_STALL)`.
const SIM_STALL_PREFIX: &str = "gpuvisor-sim: stalling `";

/// Scans a log's tail (a replica's log file, either format, read through the record's one
/// parser of them; or plain text) for hang lines; a simulated stall counts while `now_unix_ms`
/// is before its release.
pub fn scan_log(text: &str, now_unix_ms: u64) -> LogSignals {
    let mut signals = LogSignals::default();
    let mut reader = LineReader::new();
    for raw in text.lines() {
        let Some(line) = reader.read(raw) else {
            continue; // a marker line
        };
        let line = line.text;
        match timeout_kind(line) {
            Some(StallCause::Collective) => signals.collective_timeout = Some(clip(line)),
            Some(StallCause::Peers) => signals.peer_timeout = Some(clip(line)),
            None => {}
        }
        if let Some(at) = line.find(SIM_STALL_PREFIX) {
            let release = line[at..]
                .split("until unix ms ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|ms| ms.parse::<u64>().ok());
            signals.simulated_stall = match release {
                Some(release) if release > now_unix_ms => Some(clip(&line[at..])),
                _ => None,
            };
        }
    }
    signals
}

fn clip(line: &str) -> String {
    const MAX: usize = 300;
    match line.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line.to_string(),
    }
}

/// Native frames that say what a thread waits for, in a `py-spy dump --native` (innermost
/// frame first): NCCL's bootstrap and socket handshake and torch's TCPStore wait for peers;
/// a host wait on a stream or event waits for the GPU, which on a quiet GPU means a kernel
/// that does not end (a stuck collective; XLA's autotuner shows it as
/// `xla::Tuner::ProfileCandidate` -> `CudaStream::BlockHostUntilDone` -> `cuStreamSynchronize`).
const STACK_MARKERS: [(&str, StallCause); 10] = [
    ("bootstrapInit", StallCause::Peers),
    ("bootstrapRoot", StallCause::Peers),
    ("ncclSocketAccept", StallCause::Peers),
    ("ncclSocketConnect", StallCause::Peers),
    ("c10d::TCPStore::", StallCause::Peers),
    ("cuStreamSynchronize", StallCause::Collective),
    ("cuEventSynchronize", StallCause::Collective),
    ("cuCtxSynchronize", StallCause::Collective),
    ("BlockHostUntilDone", StallCause::Collective),
    ("ncclCommWatchdog", StallCause::Collective),
];

/// What a `py-spy dump --native` says a replica waits for: the cause and the thread's line
/// (`Thread N ... : FRAME <- CALLER <- ...`, its first frames), from the first thread with a
/// known frame.
pub fn stack_cause(dump: &str) -> Option<(StallCause, String)> {
    let mut thread = "";
    let mut frames: Vec<&str> = Vec::new();
    let mut found: Option<(StallCause, String)> = None;
    let mut finish = |thread: &str, frames: &[&str]| {
        if found.is_some() {
            return;
        }
        let hit = frames.iter().find_map(|frame| {
            STACK_MARKERS
                .iter()
                .find(|(marker, _)| frame.contains(marker))
                .map(|(_, cause)| *cause)
        });
        if let Some(cause) = hit {
            let names: Vec<&str> = frames
                .iter()
                .take(6)
                .map(|frame| frame.split(" (").next().unwrap_or(frame))
                .collect();
            found = Some((cause, format!("{}: {}", thread.trim(), names.join(" <- "))));
        }
    };
    for line in dump.lines() {
        if line.starts_with("Thread ") {
            finish(thread, &frames);
            thread = line;
            frames.clear();
        } else if line.starts_with("    ") && !thread.is_empty() {
            frames.push(line.trim());
        }
    }
    finish(thread, &frames);
    found
}

/// The first compiler frame of a `py-spy dump --native` (XLA's GPU compiler, its autotuner,
/// jax's compile step), if any: a compile in the stack is no proof of `compiling` (the S4
/// hang shows one, blocked behind a stuck collective).
pub fn stack_compile_frame(dump: &str) -> Option<String> {
    const COMPILE: [&str; 4] = [
        "AutotunerPass",
        "GpuCompiler::",
        "backend_compile",
        "torch/_inductor/",
    ];
    dump.lines()
        .map(str::trim)
        .find(|frame| COMPILE.iter().any(|marker| frame.contains(marker)))
        .map(|frame| frame.split(" (").next().unwrap_or(frame).to_string())
}
