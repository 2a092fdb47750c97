//! The event log, `events.jsonl`: one JSON object per line, appended and written through to the
//! kernel at once (one `write` per event, no user-space buffer), so the record stays complete
//! and readable when gpuvisor itself is killed. A line is never torn by a full disk: see
//! [`EventLog`] for what happens when the file cannot be written.
//!
//! Every object has `t` (RFC 3339 UTC, milliseconds) and `kind`; the other fields depend on the
//! kind (docs/supervisor.md lists them): `start`, `ready`, `exit`, `restart`, `crash-loop`,
//! `failed`, `stop`, `signal`, `denial`, `violation`, `clean-up`, `job-start`, `job-end`, ...

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::clock::{now_unix_ms, rfc3339_ms};

/// One event: a kind and its fields (the time is added when it is written).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// What happened (`start`, `exit`, ...).
    pub kind: String,
    /// The other fields (written sorted by name, after `t` and `kind`).
    pub fields: Map<String, Value>,
}

impl Event {
    /// An event of this kind with no fields yet.
    pub fn new(kind: impl Into<String>) -> Self {
        Event {
            kind: kind.into(),
            fields: Map::new(),
        }
    }

    /// Adds a field.
    pub fn with(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.fields.insert(name.to_string(), value.into());
        self
    }

    /// A field as text, if present and a string.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.fields.get(name).and_then(Value::as_str)
    }

    /// The line written to `events.jsonl` for this event at `unix_ms`.
    pub fn to_line(&self, unix_ms: u64) -> String {
        // Written by hand so `t` and `kind` lead every line (serde_json's map sorts its keys).
        let mut line = format!(
            "{{\"t\":\"{}\",\"kind\":{}",
            rfc3339_ms(unix_ms),
            Value::String(self.kind.clone())
        );
        for (name, value) in &self.fields {
            line.push(',');
            line.push_str(&Value::String(name.clone()).to_string());
            line.push(':');
            line.push_str(&value.to_string());
        }
        line.push_str("}\n");
        line
    }
}

/// Bytes of pending lines kept in memory while the log cannot be written; beyond it the
/// oldest lines of routine kinds ([`ESSENTIAL`] excepted) are given up, and counted.
const PENDING_CAP_BYTES: usize = 4 << 20;
/// Retries of a failing log at most this often (every event retries otherwise).
const RETRY_EVERY: Duration = Duration::from_millis(500);
/// The space set aside in the run directory for the end of the record: freed at close when
/// the disk is still full, so `job-end` and the events that matter get written.
const RESERVE_BYTES: usize = 64 << 10;
/// The reserve's name in the run directory (removed at close; left only by a killed
/// supervisor).
pub const RESERVE_NAME: &str = ".events-reserve";
/// Kinds never given up for memory while the log cannot be written.
const ESSENTIAL: &[&str] = &[
    "job-start",
    "job-end",
    "failed",
    "crash-loop",
    "blocked",
    "signal-received",
    "control",
    "clean-up",
    "violation",
    "record-gap",
];

/// What became of the record: all zero when every event reached the file in time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordHealth {
    /// Failed write attempts.
    pub failed_writes: u64,
    /// The first error, in words.
    pub error: Option<String>,
    /// Events written late (held in memory while the log could not be written).
    pub written_late: u64,
    /// Events given up: dropped to bound memory, or still unwritten at close.
    pub lost: u64,
    /// Whether `job-end` is among the lost.
    pub end_lost: bool,
}

impl RecordHealth {
    /// Whether events are missing from `events.jsonl`.
    pub fn incomplete(&self) -> bool {
        self.lost > 0
    }

    /// One line for the summary when something went wrong with the record, else None.
    pub fn summary_line(&self, path: &Path) -> Option<String> {
        let error = self.error.as_deref().unwrap_or("unknown error");
        if self.incomplete() {
            Some(format!(
                "record incomplete: {} event{} missing from {}{} ({error}; {} failed write{})",
                self.lost,
                if self.lost == 1 { " is" } else { "s are" },
                path.display(),
                if self.end_lost {
                    ", job-end among them"
                } else {
                    ""
                },
                self.failed_writes,
                if self.failed_writes == 1 { "" } else { "s" },
            ))
        } else if self.failed_writes > 0 {
            Some(format!(
                "record complete, but {} event{} reached {} late ({error}; {} failed write{})",
                self.written_late,
                if self.written_late == 1 { "" } else { "s" },
                path.display(),
                self.failed_writes,
                if self.failed_writes == 1 { "" } else { "s" },
            ))
        } else {
            None
        }
    }
}

/// A line waiting in memory.
#[derive(Debug)]
struct Pending {
    line: String,
    essential: bool,
    end: bool,
}

#[derive(Debug)]
struct Inner {
    file: File,
    path: PathBuf,
    /// Bytes of whole lines in the file (what a torn write is cut back to).
    len: u64,
    /// A torn write could not be cut back: the next line starts with a newline.
    torn: bool,
    /// Writes fail (since the last time every pending line was written).
    failing: bool,
    pending: VecDeque<Pending>,
    pending_bytes: usize,
    last_try: Option<Instant>,
    health: RecordHealth,
    reserve: Option<PathBuf>,
}

/// The append-only event log of one run.
///
/// A line is written whole or not at all: a short write (a full disk) is cut back to the
/// last whole line. While the file cannot be written, events wait in memory (bounded:
/// routine kinds are given up first, and counted) and are written, in order, as soon as a
/// later write succeeds or at [`EventLog::close`]; the failure is said once on stderr, then
/// counted in [`RecordHealth`], which the summary and exit status report.
#[derive(Debug)]
pub struct EventLog {
    inner: Mutex<Inner>,
}

impl EventLog {
    /// Creates `path` (owner-only); fails if it exists, so two supervisors never share a log.
    /// Sets aside a little space next to it for the end of the record ([`RESERVE_NAME`]).
    pub fn create(path: &Path) -> io::Result<EventLog> {
        let file = OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        let reserve = path.parent().map(|dir| dir.join(RESERVE_NAME));
        let reserve = reserve.filter(|reserve| {
            let made = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(reserve)
                .and_then(|mut file| file.write_all(&[0u8; RESERVE_BYTES]));
            if made.is_err() {
                let _ = std::fs::remove_file(reserve);
            }
            made.is_ok()
        });
        Ok(EventLog {
            inner: Mutex::new(Inner {
                file,
                path: path.to_path_buf(),
                len: 0,
                torn: false,
                failing: false,
                pending: VecDeque::new(),
                pending_bytes: 0,
                last_try: None,
                health: RecordHealth::default(),
                reserve,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Appends `event` stamped now. A failed write never stops the job: the event waits in
    /// memory (see [`EventLog`]).
    pub fn write(&self, event: &Event) {
        let line = event.to_line(now_unix_ms());
        let essential = ESSENTIAL.contains(&event.kind.as_str());
        self.lock().push(line, essential, event.kind == "job-end");
    }

    /// Appends a line written elsewhere (another node's event, already stamped), adding its
    /// newline. Same guarantees as [`EventLog::write`].
    pub fn append_line(&self, line: &str) {
        let essential = ESSENTIAL
            .iter()
            .any(|kind| line.contains(&format!("\"kind\":\"{kind}\"")));
        self.lock().push(format!("{line}\n"), essential, false);
    }

    /// What became of the record so far.
    pub fn health(&self) -> RecordHealth {
        self.lock().health.clone()
    }

    /// Tries now to write what waits in memory; returns how many events still wait.
    pub fn retry(&self) -> usize {
        let mut inner = self.lock();
        if !inner.pending.is_empty() {
            inner.flush();
        }
        inner.pending.len()
    }

    /// Writes what waits in memory, freeing the reserve if the disk is still full, and
    /// returns what became of the record (for the summary). Call it once, after the last
    /// event.
    pub fn close(&self) -> RecordHealth {
        let mut inner = self.lock();
        inner.flush();
        if !inner.pending.is_empty() {
            if let Some(reserve) = inner.reserve.take() {
                let _ = std::fs::remove_file(reserve);
                // What matters first: the oldest routine lines are given up until the rest
                // fits in the space freed (with room to spare for other writers).
                inner.drop_routine(RESERVE_BYTES / 2);
                inner.flush();
                if !inner.pending.is_empty() {
                    inner.drop_routine(0);
                    inner.flush();
                }
            }
        }
        if let Some(reserve) = inner.reserve.take() {
            let _ = std::fs::remove_file(reserve);
        }
        let unwritten = inner.pending.len() as u64;
        inner.health.lost += unwritten;
        inner.health.end_lost |= inner.pending.iter().any(|pending| pending.end);
        inner.pending.clear();
        inner.pending_bytes = 0;
        inner.health.clone()
    }
}

impl Inner {
    fn push(&mut self, line: String, essential: bool, end: bool) {
        self.pending_bytes += line.len();
        self.pending.push_back(Pending {
            line,
            essential,
            end,
        });
        if self.pending.len() > 1 {
            // Already failing: retry now and then, not at every event.
            let due = self
                .last_try
                .is_none_or(|last| last.elapsed() >= RETRY_EVERY);
            if due {
                self.flush();
            }
            if self.pending_bytes > PENDING_CAP_BYTES {
                self.drop_routine(PENDING_CAP_BYTES);
            }
        } else {
            self.flush();
        }
    }

    /// Writes pending lines in order until one fails.
    fn flush(&mut self) {
        self.last_try = Some(Instant::now());
        let mut written = 0u64;
        while let Some(front) = self.pending.front() {
            let line = front.line.clone();
            match self.write_whole(line.as_bytes()) {
                Ok(()) => {
                    let done = self.pending.pop_front().map(|pending| pending.line.len());
                    self.pending_bytes -= done.unwrap_or(0);
                    written += 1;
                }
                Err(error) => {
                    self.failing = true;
                    self.health.failed_writes += 1;
                    if self.health.error.is_none() {
                        self.health.error = Some(error.to_string());
                        let _ = writeln!(
                            io::stderr(),
                            "gpuvisor: cannot write the event log {}: {error}; events wait in memory until it can be written (said once: the summary gives the count)",
                            self.path.display()
                        );
                    }
                    break;
                }
            }
        }
        if self.failing {
            self.health.written_late += written;
            if self.pending.is_empty() {
                self.failing = false;
                self.note_gap();
            }
        }
    }

    /// After a failing spell: a `record-gap` event saying what was late and what was lost.
    fn note_gap(&mut self) {
        let health = &self.health;
        let line = Event::new("record-gap")
            .with("error", health.error.clone().unwrap_or_default())
            .with("failed_writes", health.failed_writes)
            .with("written_late", health.written_late)
            .with("lost", health.lost)
            .to_line(now_unix_ms());
        if self.write_whole(line.as_bytes()).is_err() {
            self.health.failed_writes += 1;
        }
    }

    /// One line, whole or not at all.
    fn write_whole(&mut self, line: &[u8]) -> io::Result<()> {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        if self.torn {
            bytes.push(b'\n');
        }
        bytes.extend_from_slice(line);
        let mut done = 0;
        let result = loop {
            if done == bytes.len() {
                break Ok(());
            }
            match self.file.write(&bytes[done..]) {
                Ok(0) => break Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(count) => done += count,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => break Err(error),
            }
        };
        match result {
            Ok(()) => {
                self.len += done as u64;
                self.torn = false;
                Ok(())
            }
            Err(error) => {
                if done > 0 {
                    // Cut the torn line back; if even that fails, the next line starts on a
                    // line of its own (readers skip the fragment).
                    self.torn = self.file.set_len(self.len).is_err();
                    if self.torn {
                        self.len += done as u64;
                    }
                }
                Err(error)
            }
        }
    }

    /// Gives up the oldest routine lines until pending bytes are at most `cap` (all routine
    /// lines for 0).
    fn drop_routine(&mut self, cap: usize) {
        let mut index = 0;
        while self.pending_bytes > cap && index < self.pending.len() {
            if self.pending[index].essential {
                index += 1;
                continue;
            }
            if let Some(pending) = self.pending.remove(index) {
                self.pending_bytes -= pending.line.len();
                self.health.lost += 1;
            }
        }
    }
}

/// Reads every complete event of an `events.jsonl` as JSON objects. A torn last line (the
/// supervisor killed mid-write) is skipped.
pub fn read_events(path: &Path) -> io::Result<Vec<Map<String, Value>>> {
    let reader = BufReader::new(File::open(path)?);
    let mut events = Vec::new();
    for line in reader.lines() {
        let line = line?;
        if let Ok(Value::Object(object)) = serde_json::from_str::<Value>(&line) {
            events.push(object);
        }
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_with_time_and_kind_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let log = EventLog::create(&path).unwrap();
        log.write(
            &Event::new("start")
                .with("process", "learner")
                .with("pid", 42),
        );
        log.write(&Event::new("exit").with("code", 1));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("{\"t\":\""), "{text}");
        let events = read_events(&path).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["kind"], "start");
        assert_eq!(events[0]["pid"], 42);
        assert_eq!(events[1]["code"], 1);
        assert!(
            EventLog::create(&path).is_err(),
            "a second log on one file is refused"
        );
    }

    #[test]
    fn a_torn_last_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        std::fs::write(&path, "{\"t\":\"x\",\"kind\":\"start\"}\n{\"t\":\"x\",\"ki").unwrap();
        assert_eq!(read_events(&path).unwrap().len(), 1);
    }
}
