//! `gpuvisor logs [RUN] [NAME...] [-f] [-n N]`: the logs of a run's replicas merged in time
//! order, each line behind its `name[replica] |` prefix as `run` prints them; with `-f`, new
//! lines as they come until the run ends (a finished run is printed and `-f` returns).
//!
//! Each log line has its RFC 3339 time (read through the record's one parser of the log
//! files, [`gpuvisor_record::log_file`], either format), so lines of different replicas sort
//! by that; a line without one keeps the time of the line before. The current log files
//! only: rotated ones (`NAME.log.1`, ...) are not merged. A replica with direct logs
//! (`logs = "direct"`: `NAME.out.log`, `NAME.err.log` and their times file) is read through
//! the record's reader of those, its lines dated from the times file.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use gpuvisor_observe::top::record::{log_path, parse_plan, PlannedReplica};
use gpuvisor_record::log_file::direct::{self, DirectReader};
use gpuvisor_record::log_file::LineReader;
use gpuvisor_supervisor::clock::{now_unix_ms, rfc3339_ms};
use gpuvisor_supervisor::rundir::socket_path;

use crate::cli::LogsArgs;
use crate::commands::ps::resolve_run;
use crate::failure::Failure;

/// How often `-f` looks for new lines.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

/// One replica's log file and how far it was read.
struct Source {
    label: String,
    path: PathBuf,
    offset: u64,
    /// The end of the file after its last newline: a line still being written.
    partial: Vec<u8>,
    /// What the file's marker lines said so far.
    reader: LineReader,
    /// The time of the last line read (for lines without one).
    last_time: String,
    /// Direct logs: read through their times file instead (found at the first read).
    direct: Option<DirectReader>,
}

/// A line to print: its time, its place in the read (to keep order among equal times), the
/// replica's index and the text.
type Line = (String, usize, usize, String);

/// Prints the merged logs, and follows them with `-f`.
pub fn logs(args: LogsArgs) -> Result<ExitCode, Failure> {
    let (run, names) = match args.targets.split_first() {
        Some((first, rest)) if gpuvisor_record::is_run_dir(Path::new(first)) => {
            (Some(PathBuf::from(first)), rest.to_vec())
        }
        _ => (None, args.targets.clone()),
    };
    let run = resolve_run(run.as_deref())?;
    show(&run, &names, args.lines, args.follow, None)
}

/// Prints the merged logs of `names` (all: empty) in `run`, the last `lines` of them, then
/// with `follow` new lines until the run ends. `console`: a file of gpuvisor's own lines
/// (a detached run's console) merged in as they come, unprefixed.
pub(crate) fn show(
    run: &Path,
    names: &[String],
    lines: Option<usize>,
    follow: bool,
    console: Option<PathBuf>,
) -> Result<ExitCode, Failure> {
    let plan_path = run.join("plan.json");
    let plan = std::fs::read_to_string(&plan_path)
        .ok()
        .and_then(|text| parse_plan(&text).ok())
        .ok_or_else(|| {
            Failure::unavailable(format!(
                "cannot read {}: the run's plan names its log files",
                plan_path.display()
            ))
        })?;
    let replicas = select(&plan.replicas, names, &plan.job)?;
    let width = replicas.iter().map(|r| r.label.len()).max().unwrap_or(0);
    let mut sources: Vec<Source> = replicas
        .iter()
        .map(|replica| Source {
            label: format!("{:<width$} | ", replica.label),
            path: run.join(log_path(
                &replica.process,
                replica.replica,
                replica.replicas,
            )),
            offset: 0,
            partial: Vec::new(),
            reader: LineReader::new(),
            last_time: String::new(),
            direct: None,
        })
        .collect();
    sources.extend(console.map(|path| Source {
        label: String::new(),
        path,
        offset: 0,
        partial: Vec::new(),
        reader: LineReader::new(),
        last_time: String::new(),
        direct: None,
    }));
    let mut first = read_new(&mut sources);
    if let Some(keep) = lines {
        first.drain(..first.len().saturating_sub(keep));
    }
    if !print(&sources, first) || !follow {
        return Ok(ExitCode::SUCCESS);
    }
    loop {
        // Read after checking, so the last lines of a run that just ended are printed.
        let ended = !socket_path(run).exists();
        let lines = read_new(&mut sources);
        if !print(&sources, lines) {
            return Ok(ExitCode::SUCCESS);
        }
        if ended {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(FOLLOW_EVERY);
    }
}

/// The replicas `names` pick (all for none), in plan order; an unknown name is bad input.
fn select<'plan>(
    replicas: &'plan [PlannedReplica],
    names: &[String],
    job: &str,
) -> Result<Vec<&'plan PlannedReplica>, Failure> {
    if names.is_empty() {
        return Ok(replicas.iter().collect());
    }
    for name in names {
        if !replicas
            .iter()
            .any(|r| &r.process == name || &r.label == name)
        {
            let mut known: Vec<&str> = replicas.iter().map(|r| r.process.as_str()).collect();
            known.dedup();
            return Err(
                Failure::bad_input(format!("no process or replica `{name}` in job {job}"))
                    .with_hint(format!(
                        "processes are: {} (a replica is NAME[N])",
                        known.join(", ")
                    )),
            );
        }
    }
    Ok(replicas
        .iter()
        .filter(|r| {
            names
                .iter()
                .any(|name| &r.process == name || &r.label == name)
        })
        .collect())
}

/// The complete lines written since the last read, merged by time.
fn read_new(sources: &mut [Source]) -> Vec<Line> {
    let mut lines = Vec::new();
    let now = rfc3339_ms(now_unix_ms());
    for (index, source) in sources.iter_mut().enumerate() {
        if source.direct.is_none() && !source.label.is_empty() {
            source.direct =
                direct::direct_of(&source.path).map(|(dir, stem)| DirectReader::new(&dir, &stem));
        }
        if let Some(reader) = &mut source.direct {
            for line in reader.read_new() {
                lines.push((line.stamp, lines.len(), index, line.text));
            }
            continue;
        }
        let Ok(mut file) = File::open(&source.path) else {
            continue;
        };
        let length = file.metadata().map(|meta| meta.len()).unwrap_or(0);
        if length < source.offset {
            // Rotated: the file starts again.
            source.offset = 0;
            source.partial.clear();
            source.reader = LineReader::new();
        }
        if file.seek(SeekFrom::Start(source.offset)).is_err() {
            continue;
        }
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_err() {
            continue;
        }
        source.offset += bytes.len() as u64;
        source.partial.extend_from_slice(&bytes);
        let Some(end) = source.partial.iter().rposition(|&byte| byte == b'\n') else {
            continue;
        };
        let complete: Vec<u8> = source.partial.drain(..=end).collect();
        for raw in String::from_utf8_lossy(&complete).lines() {
            let Some(line) = source.reader.read(raw) else {
                continue; // a marker line
            };
            match line.stamp {
                // A console line: it sorts where it was read.
                "" if source.label.is_empty() => source.last_time.clone_from(&now),
                "" => {}
                stamp => {
                    source.last_time.clear();
                    source.last_time.push_str(stamp);
                }
            }
            lines.push((
                source.last_time.clone(),
                lines.len(),
                index,
                line.text.to_string(),
            ));
        }
    }
    lines.sort();
    lines
}

/// Prints the lines; false when stdout is gone (a closed pipe: `logs | head`).
fn print(sources: &[Source], lines: Vec<Line>) -> bool {
    if lines.is_empty() {
        return true;
    }
    let mut text = String::new();
    for (_, _, index, line) in lines {
        text.push_str(&sources[index].label);
        text.push_str(&line);
        text.push('\n');
    }
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_ok()
}
