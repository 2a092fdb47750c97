//! The event log, `events.jsonl`: one JSON object per line, appended and written through to the
//! kernel at once (one `write` per event, no user-space buffer), so the record stays complete
//! and readable when gpuvisor itself is killed.
//!
//! Every object has `t` (RFC 3339 UTC, milliseconds) and `kind`; the other fields depend on the
//! kind (docs/supervisor.md lists them): `start`, `ready`, `exit`, `restart`, `crash-loop`,
//! `failed`, `stop`, `signal`, `denial`, `violation`, `clean-up`, `job-start`, `job-end`, ...

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;

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

/// The append-only event log of one run.
#[derive(Debug)]
pub struct EventLog {
    file: Mutex<File>,
}

impl EventLog {
    /// Creates `path` (owner-only); fails if it exists, so two supervisors never share a log.
    pub fn create(path: &Path) -> io::Result<EventLog> {
        let file = OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        Ok(EventLog {
            file: Mutex::new(file),
        })
    }

    /// Appends `event` stamped now. A failed write is reported on stderr once per event and
    /// otherwise ignored: losing the record must not stop the job.
    pub fn write(&self, event: &Event) {
        let line = event.to_line(now_unix_ms());
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        // One write_all of the whole line: with O_APPEND a line is never interleaved.
        if let Err(error) = file.write_all(line.as_bytes()) {
            eprintln!("gpuvisor: cannot write the event log: {error}");
        }
    }
}

impl EventLog {
    /// Appends a line written elsewhere (another node's event, already stamped), adding its
    /// newline. Same guarantees as [`EventLog::write`].
    pub fn append_line(&self, line: &str) {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Err(error) = file.write_all(&bytes) {
            eprintln!("gpuvisor: cannot write the event log: {error}");
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
