//! A finished (or interrupted) run read back from its run directory: the plan it started with
//! (`plan.json`), its events (`events.jsonl`) and, when the run recorded them, its memory
//! samples (`samples/`). Older runs have no samples; everything built on this works without.

use std::io;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use gpuvisor_record::{read_record, Event, RecordRead};
use gpuvisor_supervisor::samples::{read_samples, Header, Record};

/// Why a run directory cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RunRecordError {
    /// A file the record needs is missing or unreadable.
    #[error("cannot read {path}: {source}\n  hint: give a run directory written by `gpuvisor run` (it holds plan.json and events.jsonl)")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// `plan.json` is not a plan.
    #[error("{path} is not a gpuvisor plan: {reason}\n  hint: the run directory may come from another gpuvisor version; `gpuvisor explain` on its logs still works")]
    BadPlan {
        /// The file.
        path: PathBuf,
        /// What serde said.
        reason: String,
    },
}

/// The plan of a run (`plan.json` read back): gpuvisor-record's.
pub use gpuvisor_record::plan::{PlacedGpu, PlanGpu, PlanRecord as RunPlan, PlanReplica};

/// One event of `events.jsonl`, with its time parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEvent {
    /// Milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    /// What happened (events of kinds this gpuvisor does not know are not read).
    pub event: Event,
    /// The `process` field: a replica label (`actor[2]`) or, for a few kinds, a process name.
    pub label: Option<String>,
    /// Every field, as written.
    pub fields: Map<String, Value>,
}

impl RunEvent {
    /// A field as text.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.fields.get(name).and_then(Value::as_str)
    }

    /// A field as a number.
    pub fn number(&self, name: &str) -> Option<u64> {
        self.fields.get(name).and_then(Value::as_u64)
    }

    /// Whether a replica's process started.
    pub fn is_start(&self) -> bool {
        matches!(self.event, Event::Start { .. })
    }

    /// Whether a replica's process ended.
    pub fn is_exit(&self) -> bool {
        matches!(self.event, Event::Exit(_))
    }

    /// The process name of [`RunEvent::label`] (`actor` for `actor[2]`).
    pub fn process(&self) -> Option<&str> {
        self.label.as_deref().map(process_of)
    }
}

pub use gpuvisor_record::label::process_of;

/// The memory samples of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSamples {
    /// What the rows are.
    pub header: Header,
    /// Records in time order.
    pub records: Vec<Record>,
}

/// A run directory, read.
#[derive(Debug, Clone)]
pub struct RunRecord {
    /// The directory.
    pub dir: PathBuf,
    /// Its plan.
    pub plan: RunPlan,
    /// Its events, in the order written.
    pub events: Vec<RunEvent>,
    /// Its samples, when it has any.
    pub samples: Option<RunSamples>,
    /// Lines of `events.jsonl` that are not whole events (`file:line`), skipped: a torn
    /// last line when the supervisor was killed mid-write.
    pub skipped: Vec<String>,
}

impl RunRecord {
    /// Reads `dir/plan.json`, `dir/events.jsonl` and (if present) `dir/samples/`.
    pub fn load(dir: &Path) -> Result<RunRecord, RunRecordError> {
        let run = gpuvisor_record::RunDir::at(dir);
        let plan_path = run.plan_path();
        let text =
            std::fs::read_to_string(&plan_path).map_err(|source| RunRecordError::Unreadable {
                path: plan_path.clone(),
                source,
            })?;
        let plan = RunPlan::parse(&text).map_err(|error| RunRecordError::BadPlan {
            path: plan_path.clone(),
            reason: error.to_string(),
        })?;
        let events_path = run.events_path();
        let read = read_record(&events_path).map_err(|source| RunRecordError::Unreadable {
            path: events_path,
            source,
        })?;
        let skipped = read.skipped;
        let events = read
            .events
            .into_iter()
            .filter_map(RunEvent::from_fields)
            .collect();
        // Samples are optional: an older run, or one stopped before the first tick, has none.
        let samples = read_samples(&run.samples_path())
            .ok()
            .filter(|(_, records)| !records.is_empty())
            .map(|(header, records)| RunSamples { header, records });
        Ok(RunRecord {
            dir: dir.to_path_buf(),
            plan,
            events,
            samples,
            skipped,
        })
    }

    /// A note when lines of the record were skipped (see [`RunRecord::skipped`]).
    pub fn note(&self) -> Option<String> {
        RecordRead {
            events: Vec::new(),
            skipped: self.skipped.clone(),
        }
        .note()
    }

    /// The plan's replica with this label.
    pub fn replica(&self, label: &str) -> Option<&PlanReplica> {
        self.plan.replica(label)
    }

    /// The first and last event times (ms), if any event.
    pub fn span_ms(&self) -> Option<(u64, u64)> {
        let first = self.events.iter().map(|e| e.time_unix_ms).min()?;
        let mut last = self.events.iter().map(|e| e.time_unix_ms).max()?;
        if let Some(samples) = &self.samples {
            last = last.max(samples.records.last().map_or(0, |r| r.time_unix_ms));
        }
        Some((first, last))
    }

    /// The job's exit status from `job-end`, or None when the supervisor did not end normally.
    pub fn end_status(&self) -> Option<i64> {
        self.events.iter().find_map(|e| match &e.event {
            Event::JobEnd(end) => Some(i64::from(end.status)),
            _ => None,
        })
    }

    /// The lives of a replica: (start, end) ms; `end` None while it ran when the record ends.
    pub fn lives(&self, label: &str) -> Vec<(u64, Option<u64>)> {
        let mut lives: Vec<(u64, Option<u64>)> = Vec::new();
        for event in &self.events {
            if event.label.as_deref() != Some(label) {
                continue;
            }
            match event.event {
                Event::Start { .. } => lives.push((event.time_unix_ms, None)),
                Event::Exit(_) => {
                    if let Some(life) = lives.last_mut().filter(|life| life.1.is_none()) {
                        life.1 = Some(event.time_unix_ms);
                    }
                }
                _ => {}
            }
        }
        lives
    }
}

impl RunEvent {
    /// An event from one line of `events.jsonl`; None for a line that is not an event.
    pub fn from_line(line: &str) -> Option<RunEvent> {
        match serde_json::from_str(line).ok()? {
            Value::Object(fields) => RunEvent::from_fields(fields),
            _ => None,
        }
    }

    /// An event from its JSON object (`t` and `kind` required).
    pub fn from_fields(fields: Map<String, Value>) -> Option<RunEvent> {
        parse_event(fields)
    }
}

fn parse_event(mut fields: Map<String, Value>) -> Option<RunEvent> {
    let time_unix_ms = parse_rfc3339_ms(fields.get("t")?.as_str()?)?;
    let event = serde_json::from_value(Value::Object(fields.clone())).ok()?;
    let label = fields
        .get("process")
        .and_then(Value::as_str)
        .map(str::to_string);
    fields.remove("t");
    fields.remove("kind");
    Some(RunEvent {
        time_unix_ms,
        event,
        label,
        fields,
    })
}

/// `YYYY-MM-DDTHH:MM:SS[.mmm]Z` as Unix ms (the event log's only format).
pub fn parse_rfc3339_ms(text: &str) -> Option<u64> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut date_parts = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (
        date_parts.next()??,
        date_parts.next()??,
        date_parts.next()??,
    );
    let (clock, millis) = match time.split_once('.') {
        Some((clock, fraction)) => {
            let digits: String = fraction.chars().take(3).collect();
            let scale = 10i64.pow(3 - digits.len() as u32);
            (clock, digits.parse::<i64>().ok()? * scale)
        }
        None => (time, 0),
    };
    let mut clock_parts = clock.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hour, minute, second) = (
        clock_parts.next()??,
        clock_parts.next()??,
        clock_parts.next()??,
    );
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let shifted_month = (month + 9) % 12;
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let ms = ((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + millis;
    u64::try_from(ms).ok()
}

/// Unix ms as `HH:MM:SS.mmm` (UTC), for timelines within a run.
pub fn clock_ms(unix_ms: u64) -> String {
    let of_day = unix_ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        of_day / 3_600_000,
        of_day / 60_000 % 60,
        of_day / 1000 % 60,
        of_day % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuvisor_supervisor::clock::rfc3339_ms;

    #[test]
    fn event_times_round_trip() {
        for ms in [0, 951_782_400_123, 1_795_307_757_203, 4_102_444_799_999] {
            assert_eq!(
                parse_rfc3339_ms(&rfc3339_ms(ms)),
                Some(ms),
                "{}",
                rfc3339_ms(ms)
            );
        }
        assert_eq!(
            parse_rfc3339_ms("2026-11-22T00:35:57Z"),
            Some(1_795_307_757_000)
        );
        assert_eq!(parse_rfc3339_ms("2026-13-22T00:35:57Z"), None);
        assert_eq!(parse_rfc3339_ms("yesterday"), None);
        assert_eq!(clock_ms(1_795_307_757_203), "00:35:57.203");
    }

    #[test]
    fn labels_follow_the_event_log() {
        let replica = |replicas| PlanReplica {
            process: "actor".into(),
            replica: 2,
            replicas,
            device: "gpu".into(),
            gpus: vec![],
            budget_bytes: 0,
            after: vec![],
            node: None,
        };
        assert_eq!(replica(4).label(), "actor[2]");
        assert_eq!(replica(1).label(), "actor");
        assert_eq!(process_of("actor[2]"), "actor");
    }
}
