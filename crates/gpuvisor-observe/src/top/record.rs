//! Reading a run directory for `top`: rows from a `ps` reply or from the event log, events
//! worded for the screen, log tails, and the plan's GPUs and budgets.
//!
//! Everything is read as loose JSON (`serde_json::Value`): a field the supervisor adds later
//! is ignored, one it drops shows as `-`, and the screen never fails on a record.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use gpuvisor_record::{label, log_file, Event, EventLine as RecordLine, PlanRecord};
use serde_json::Value;

use super::model::{EventLine, LogLine, ProcessRow, Tone};
use super::render::short_bytes;

/// How much of the end of a file a tail reads.
pub const TAIL_BYTES: u64 = 64 * 1024;

/// One replica of the plan (`plan.json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedReplica {
    /// `name` or `name[r]`.
    pub label: String,
    /// Job-file process name.
    pub process: String,
    /// Replica number.
    pub replica: u32,
    /// Replicas of its process.
    pub replicas: u32,
    /// Its GPUs (NVML indexes).
    pub gpus: Vec<u32>,
    /// Budget per GPU, bytes (0: CPU-only).
    pub budget_bytes: u64,
    /// Its node, in a multi-node run.
    pub node: Option<String>,
}

/// One GPU of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedGpu {
    /// NVML index.
    pub index: u32,
    /// Model name.
    pub name: String,
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Its node, in a multi-node run (GPU indexes repeat from node to node).
    pub node: Option<String>,
}

/// What `top` needs of `plan.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanInfo {
    /// Job name.
    pub job: String,
    /// Its GPUs.
    pub gpus: Vec<PlannedGpu>,
    /// Its replicas, in plan order.
    pub replicas: Vec<PlannedReplica>,
}

/// Reads the parts of a plan (`gpuvisor plan --json`'s data) that `top` shows.
pub fn parse_plan(text: &str) -> Result<PlanInfo, serde_json::Error> {
    let plan = PlanRecord::parse(text)?;
    let gpus = plan
        .gpus
        .into_iter()
        .map(|gpu| PlannedGpu {
            index: gpu.index,
            name: match gpu.name.is_empty() {
                true => "GPU".to_string(),
                false => gpu.name,
            },
            total_bytes: gpu.total_bytes,
            node: gpu.node,
        })
        .collect();
    let replicas = plan
        .replicas
        .into_iter()
        .map(|replica| PlannedReplica {
            label: replica.label(),
            gpus: replica.gpus.iter().map(|gpu| gpu.index).collect(),
            process: replica.process,
            replica: replica.replica,
            replicas: replica.replicas,
            budget_bytes: replica.budget_bytes,
            node: replica.node,
        })
        .collect();
    Ok(PlanInfo {
        job: plan.job,
        gpus,
        replicas,
    })
}

/// The log file of a replica, relative to the run directory (the record's names).
pub fn log_path(process: &str, replica: u32, replicas: u32) -> String {
    format!(
        "logs/{}",
        label::log_file(&label::format(process, replica, replicas))
    )
}

/// Rows from a live `ps` reply's `replicas` array.
pub fn rows_from_ps(replicas: &Value) -> Vec<ProcessRow> {
    replicas
        .as_array()
        .into_iter()
        .flatten()
        .map(|replica| {
            let process = replica["process"].as_str().unwrap_or("?").to_string();
            let label = replica["label"].as_str().unwrap_or(&process).to_string();
            ProcessRow {
                replica: label
                    .ends_with(']')
                    .then(|| replica["replica"].as_u64().map(|r| r as u32))
                    .flatten(),
                key: label,
                name: process,
                pid: replica["pid"].as_u64().map(|pid| pid as u32),
                state: replica["state"].as_str().unwrap_or("?").to_string(),
                gpu_used_bytes: replica["gpu_used_bytes"].as_u64(),
                gpu_peak_bytes: replica["gpu_peak_bytes"].as_u64(),
                budget_bytes: replica["budget_bytes"].as_u64(),
                restarts: replica["restarts"].as_u64().unwrap_or(0) as u32,
                ..ProcessRow::default()
            }
        })
        .collect()
}

/// Adds the sampler's figures (`{"cmd":"sample"}`'s snapshot) to rows from `ps`: CPU and RSS
/// of each replica's whole tree, GPU utilisation, GPU memory as the GPU source sees it where
/// the ledger has none, its untracked memory (physical − charged), time since its last output,
/// and its stall class.
pub fn merge_sample(rows: &mut [ProcessRow], snapshot: &Value) {
    for replica in snapshot["replicas"].as_array().into_iter().flatten() {
        let Some(label) = replica["label"].as_str() else {
            continue;
        };
        let Some(row) = rows.iter_mut().find(|row| row.key == label) else {
            continue;
        };
        // A replica that is not running has no tree: its zeros are not figures.
        if !replica["pid"].is_null() {
            row.rss_bytes = replica["rss_bytes"].as_u64().or(row.rss_bytes);
            row.cpu_percent = replica["cpu_percent"]
                .as_f64()
                .map(|cpu| cpu as f32)
                .or(row.cpu_percent);
        }
        row.gpu_util_percent = replica["gpu_utilization_percent"]
            .as_u64()
            .map(|percent| percent.min(100) as u8);
        if row.gpu_used_bytes.is_none() {
            row.gpu_used_bytes = replica["ledger_used_bytes"]
                .as_u64()
                .or_else(|| replica["gpu_bytes"].as_u64().filter(|&bytes| bytes > 0));
        }
        row.untracked_bytes = replica["untracked_bytes"].as_u64();
        row.untracked_alarm = replica["untracked_alarm"].as_bool().unwrap_or(false);
        if let Some(quiet_ms) = replica["quiet_ms"].as_u64() {
            row.since_log_secs = Some(quiet_ms / 1000);
        }
        row.stall = replica["stall"].as_str().map(str::to_string);
    }
}

/// Rows of a run that is not running, folded from its event log over the plan's replicas:
/// the last state each replica reached, its restarts and its last pid.
pub fn rows_from_events(plan: &PlanInfo, events: &[Value]) -> Vec<ProcessRow> {
    let mut rows: BTreeMap<String, ProcessRow> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for planned in &plan.replicas {
        order.push(planned.label.clone());
        rows.insert(
            planned.label.clone(),
            ProcessRow {
                key: planned.label.clone(),
                name: planned.process.clone(),
                replica: (planned.replicas > 1).then_some(planned.replica),
                state: "waiting".to_string(),
                budget_bytes: Some(planned.budget_bytes),
                ..ProcessRow::default()
            },
        );
    }
    let typed = events
        .iter()
        .filter_map(Value::as_object)
        .filter_map(|object| RecordLine::from_object(object).ok());
    for line in typed {
        let event = &line.event;
        if let Event::GpuPeaks { peak_bytes } = event {
            // The peaks the supervisor recorded at the end of the run; every process was gone
            // by then, so each holds nothing now (not `?`).
            for (label, peak) in peak_bytes {
                if let Some(row) = rows.get_mut(label) {
                    row.gpu_peak_bytes = Some(*peak);
                    row.gpu_used_bytes = Some(0);
                }
            }
            continue;
        }
        let Some(label) = event.process() else {
            continue;
        };
        // A process-wide event (`restart actor`) applies to each of its replicas.
        let targets: Vec<String> = order
            .iter()
            .filter(|key| *key == label || rows[*key].name == label)
            .cloned()
            .collect();
        for key in targets {
            let row = rows.get_mut(&key).expect("key from order");
            match event {
                Event::Start { pid, .. } => {
                    row.state = "running".to_string();
                    row.pid = u32::try_from(*pid).ok();
                }
                Event::Exit(exit) => {
                    let failed = exit.code.is_some_and(|code| code != 0)
                        || (exit.signal.is_some() && exit.cause != "stopped");
                    row.state = if failed { "exited (failed)" } else { "exited" }.to_string();
                }
                Event::Restart { restarts, .. } => {
                    row.state = "backoff".to_string();
                    row.restarts = restarts.unwrap_or(row.restarts + 1);
                }
                Event::Failed(_) | Event::CrashLoop(_) => row.state = "failed".to_string(),
                Event::Blocked { .. } => row.state = "blocked".to_string(),
                // admission = "queue": waiting for GPU room, then for its `after`.
                Event::Queued { position, .. } => row.state = format!("queued #{position}"),
                Event::Admitted { .. } => row.state = "waiting".to_string(),
                _ => {}
            }
        }
    }
    order
        .into_iter()
        .filter_map(|key| rows.remove(&key))
        .collect()
}

/// Whether an event log's text ends in a torn line (a killed writer, or an old gpuvisor out
/// of disk): [`parse_events`] skips it, and `top` says so.
pub fn torn_tail(text: &str) -> bool {
    !text.is_empty() && !text.ends_with('\n')
}

/// The JSON objects of an event log's text (bad lines skipped: a killed writer can leave one).
pub fn parse_events(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(Value::is_object)
        .collect()
}

/// An event worded for the screen.
pub fn event_line(event: &Value) -> EventLine {
    typed_event_line(event).0
}

/// An event worded for the screen, and the typed event it is (`None` for a kind this
/// gpuvisor does not know).
fn typed_event_line(event: &Value) -> (EventLine, Option<Event>) {
    let text_of = |value: &Value| -> String {
        match value {
            Value::String(text) => text.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        }
    };
    let time = clock_of(event["t"].as_str().unwrap_or_default());
    let typed = event
        .as_object()
        .and_then(|object| RecordLine::from_object(object).ok());
    let Some(line) = typed else {
        // A kind this gpuvisor does not know (a newer one's): who it is about.
        let line = EventLine {
            time,
            kind: text_of(&event["kind"]),
            tone: Tone::Plain,
            text: text_of(&event["process"]),
        };
        return (line, None);
    };
    let text = worded(&line.event, &text_of);
    let worded_line = EventLine {
        time,
        kind: line.event.kind().to_string(),
        tone: tone_of(&line.event),
        text: text.lines().next().unwrap_or_default().to_string(),
    };
    (worded_line, Some(line.event))
}

/// What kind of news `event` is.
fn tone_of(event: &Event) -> Tone {
    match event {
        Event::Exit(_)
        | Event::Failed(_)
        | Event::CrashLoop(_)
        | Event::Denial { .. }
        | Event::Violation { .. }
        | Event::Blocked { .. } => Tone::Bad,
        Event::Restart { .. }
        | Event::Shutdown { .. }
        | Event::Signal(_)
        | Event::SignalReceived { .. }
        | Event::Control { .. }
        | Event::UntrackedMemory { .. }
        | Event::PhysicalMemoryLow { .. } => Tone::Notice,
        Event::Start { .. } | Event::Ready { .. } | Event::JobStart(_) => Tone::Good,
        _ => Tone::Plain,
    }
}

/// One event in words for the screen.
fn worded(event: &Event, text_of: &dyn Fn(&Value) -> String) -> String {
    let process = event.process().unwrap_or_default().to_string();
    match event {
        Event::JobStart(start) => format!("job {} (pid {})", start.job, start.pid),
        Event::Start { pid, .. } => format!("{process} pid {pid}"),
        Event::Exit(exit) => {
            let how = match (&exit.summary, &exit.signal, exit.code) {
                (summary, _, _) if !summary.is_empty() => summary.clone(),
                (_, Some(signal), _) => format!("signal {signal}"),
                (_, None, code) => {
                    format!("code {}", code.map_or(String::new(), |c| c.to_string()))
                }
            };
            format!("{process} {how} ({})", exit.cause)
        }
        Event::Restart {
            reason, delay_ms, ..
        } => format!(
            "{process} in {} ms ({reason})",
            delay_ms.map_or(String::new(), |ms| ms.to_string())
        ),
        Event::CrashLoop(gave_up) | Event::Failed(gave_up) => {
            format!("{process}: {}", gave_up.reason)
        }
        Event::Blocked { reason, .. } => format!("{process}: {reason}"),
        Event::Shutdown { reason } => reason.clone(),
        Event::Signal(sent) => format!("{} to {process}", sent.signal),
        Event::SignalReceived { signal } => signal.clone(),
        Event::Control { cmd, .. } => format!("{} {process}", text_of(cmd)).trim_end().to_string(),
        Event::Denial {
            pid,
            size_bytes,
            used_bytes,
            limit_bytes,
            ..
        } => format!(
            "{process} pid {pid}: {} refused ({} of {} used)",
            short_bytes(*size_bytes),
            short_bytes(*used_bytes),
            short_bytes(*limit_bytes),
        ),
        Event::Violation {
            pid, executable, ..
        } => format!("{process} pid {pid} ({executable}) tried CUDA"),
        Event::UntrackedMemory {
            untracked_bytes,
            threshold_bytes,
            ..
        } => format!(
            "{process}: {} on the GPU the ledger never charged (over {})",
            short_bytes(*untracked_bytes),
            short_bytes(*threshold_bytes),
        ),
        Event::PhysicalMemoryLow {
            gpu, cleared: true, ..
        } => format!("GPU {gpu}: free memory back above the reserve"),
        Event::PhysicalMemoryLow {
            gpu,
            free_bytes,
            reserve_bytes,
            ..
        } => format!(
            "GPU {gpu}: {} free, below the {} reserve, with every budget held",
            short_bytes(*free_bytes),
            short_bytes(*reserve_bytes),
        ),
        Event::CleanUp(clean_up) => {
            let removed = serde_json::to_value(&clean_up.removed).unwrap_or_default();
            format!("{} {}", clean_up.what, text_of(&removed))
        }
        Event::JobEnd(end) => format!("status {}", end.status),
        _ => process,
    }
}

/// The events worded for the screen, a replica's repeated refusals folded into one line with
/// their count and time span (`actor[0] pid 102: 2.0G refused (7.0G of 8.0G used) ×16 in
/// 14.1 s, until 00:17:14`): an actor retrying at its budget is one line, not 48. Another
/// event of that replica (its exit, a restart) ends the fold.
pub fn event_lines(events: &[Value]) -> Vec<EventLine> {
    struct Fold {
        at: usize,
        count: u64,
        first_ms: u64,
        last_ms: u64,
        last_time: String,
    }
    let mut lines: Vec<EventLine> = Vec::new();
    let mut folds: BTreeMap<String, Fold> = BTreeMap::new();
    let finish = |fold: Fold, lines: &mut Vec<EventLine>| {
        if fold.count > 1 {
            let span = fold.last_ms.saturating_sub(fold.first_ms) as f64 / 1000.0;
            lines[fold.at].text.push_str(&format!(
                " ×{} in {span:.1} s, until {}",
                fold.count, fold.last_time
            ));
        }
    };
    for event in events {
        let (line, typed) = typed_event_line(event);
        let process = event["process"].as_str().unwrap_or("").to_string();
        let ms = event["t"].as_str().map_or(0, time_ms);
        if !matches!(typed, Some(Event::Denial { .. })) {
            if let Some(fold) = folds.remove(&process) {
                finish(fold, &mut lines);
            }
            lines.push(line);
            continue;
        }
        match folds.get_mut(&process) {
            Some(fold) => {
                fold.count += 1;
                fold.last_ms = ms;
                fold.last_time = line.time;
            }
            None => {
                folds.insert(
                    process,
                    Fold {
                        at: lines.len(),
                        count: 1,
                        first_ms: ms,
                        last_ms: ms,
                        last_time: line.time.clone(),
                    },
                );
                lines.push(line);
            }
        }
    }
    for fold in std::mem::take(&mut folds).into_values() {
        finish(fold, &mut lines);
    }
    lines
}

/// Milliseconds of the day of an RFC 3339 time (enough for a span within a run).
fn time_ms(rfc3339: &str) -> u64 {
    let field = |range: std::ops::Range<usize>| -> u64 {
        rfc3339
            .get(range)
            .and_then(|text| text.parse().ok())
            .unwrap_or(0)
    };
    let day = field(8..10);
    ((day * 24 + field(11..13)) * 60 + field(14..16)) * 60_000
        + field(17..19) * 1000
        + field(20..23)
}

/// `HH:MM:SS` of an RFC 3339 time (`2026-11-21T23:25:16.123Z`), or "" when it is not one.
fn clock_of(rfc3339: &str) -> String {
    match rfc3339.get(11..19) {
        Some(clock) if rfc3339.as_bytes().get(10) == Some(&b'T') => clock.to_string(),
        _ => String::new(),
    }
}

/// The lines of a replica's log file's text for the screen: the time of day and the stream,
/// through the record's one parser of the log files (either format); lines gpuvisor did not
/// date are shown as they are, without a time.
pub fn parse_log_lines(text: &str) -> Vec<LogLine> {
    log_file::parse(text).into_iter().map(screen_line).collect()
}

/// The last lines in the last `max_bytes` of a replica's log file, for the screen (each dated
/// by the marker above it, also when that marker is above the bytes read).
pub fn read_log_tail(path: &Path, max_bytes: u64) -> std::io::Result<Vec<LogLine>> {
    Ok(log_file::read_tail(path, max_bytes)?
        .into_iter()
        .map(screen_line)
        .collect())
}

fn screen_line(line: log_file::LogLine) -> LogLine {
    LogLine {
        time: clock_of(&line.stamp),
        stderr: line.stderr,
        text: line.text,
    }
}

/// The last `max_bytes` of a file as text, starting at a line boundary (the first, partial
/// line is dropped when the read did not start at the beginning).
pub fn read_tail(path: &Path, max_bytes: u64) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let length = file.metadata()?.len();
    let start = length.saturating_sub(max_bytes);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::with_capacity((length - start) as usize);
    file.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if start == 0 {
        return Ok(text);
    }
    Ok(match text.split_once('\n') {
        Some((_, rest)) => rest.to_string(),
        None => String::new(),
    })
}
