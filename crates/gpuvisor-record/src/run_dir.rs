//! The run directory and every path in it, and finding a run from what a user typed.
//!
//! ```text
//! runs/<job>-<YYYYMMDDTHHMMSSZ>/     owner-only (0700)
//!   plan.json        the plan the run was started with (0600)
//!   events.jsonl     the event log (append-only; rotated into events.jsonl.1 ...)
//!   samples/         the memory sample tiers
//!   control.sock     the control socket while the supervisor runs (0600)
//!   supervisor.pid   the supervisor's pid (its claim on the directory)
//!   logs/<name>[.<replica>].log   each replica's stdout and stderr, timestamped (log_file.rs)
//!   nodes/<node>[.<round>]/       a multi-node run: each node's own record, per round
//!   srun.log         a multi-node run under `--tui`: srun's own messages
//! ```
//!
//! Creating and claiming a directory (modes, the exclusive claim) is the supervisor's; this
//! module names the files, writes the plan, and answers "is this a run directory?" once.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The default parent of run directories (`./runs`).
pub const DEFAULT_RUNS: &str = "runs";

/// A run directory: where one run keeps its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir {
    path: PathBuf,
    logs: PathBuf,
}

impl RunDir {
    /// The run directory at `path` (its logs in `path/logs`).
    pub fn at(path: &Path) -> RunDir {
        RunDir {
            path: path.to_path_buf(),
            logs: path.join("logs"),
        }
    }

    /// The same run with its replicas' logs in `logs` (a multi-node run's agents write into
    /// the job's one `logs/`).
    pub fn with_logs(mut self, logs: &Path) -> RunDir {
        self.logs = logs.to_path_buf();
        self
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `events.jsonl`.
    pub fn events_path(&self) -> PathBuf {
        self.path.join("events.jsonl")
    }

    /// `plan.json`.
    pub fn plan_path(&self) -> PathBuf {
        self.path.join("plan.json")
    }

    /// `samples/`.
    pub fn samples_path(&self) -> PathBuf {
        self.path.join("samples")
    }

    /// `control.sock`.
    pub fn socket_path(&self) -> PathBuf {
        self.path.join("control.sock")
    }

    /// `supervisor.pid`.
    pub fn pid_path(&self) -> PathBuf {
        self.path.join("supervisor.pid")
    }

    /// `logs/`.
    pub fn logs_path(&self) -> PathBuf {
        self.logs.clone()
    }

    /// `nodes/NODE` (round 0), `nodes/NODE.ROUND` after a restart: a multi-node run's record
    /// of one node, written by its agent.
    pub fn node_path(&self, node: &str, round: u32) -> PathBuf {
        let name = match round {
            0 => node.to_string(),
            round => format!("{node}.{round}"),
        };
        self.path.join("nodes").join(name)
    }

    /// `srun.log`: srun's own messages while a live view owns the terminal.
    pub fn srun_log_path(&self) -> PathBuf {
        self.path.join("srun.log")
    }

    /// Writes `plan.json`, owner-only, once (an existing plan is an error).
    pub fn write_plan(&self, json: &str) -> io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(self.plan_path())?;
        file.write_all(json.as_bytes())?;
        file.write_all(b"\n")
    }
}

/// Whether `dir` is a run directory: gpuvisor began its record there (`events.jsonl`).
pub fn is_run_dir(dir: &Path) -> bool {
    RunDir::at(dir).events_path().is_file()
}

/// The most recent run under `runs` (by the time its events.jsonl was last written), if any.
pub fn latest_run(runs: &Path) -> Option<PathBuf> {
    fs::read_dir(runs)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let events = RunDir::at(&entry.path()).events_path();
            let modified = fs::metadata(&events)
                .and_then(|meta| meta.modified())
                .ok()?;
            Some((modified, entry.path()))
        })
        .max()
        .map(|(_, path)| path)
}

/// Why a run could not be found (the caller words it for its command).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunNotFound {
    /// Neither the path nor a run of that name under `runs` is a run directory.
    NotARun(PathBuf),
    /// No run was given and `runs` holds none.
    NoRuns(PathBuf),
}

/// The run a user means: `None` or `latest` for the latest run under `runs`, else a path to a
/// run directory, or the name of one under `runs`.
pub fn resolve_run(given: Option<&Path>, runs: &Path) -> Result<PathBuf, RunNotFound> {
    match given {
        None => latest_run(runs).ok_or_else(|| RunNotFound::NoRuns(runs.to_path_buf())),
        Some(latest) if latest == Path::new("latest") && !is_run_dir(latest) => {
            latest_run(runs).ok_or_else(|| RunNotFound::NoRuns(runs.to_path_buf()))
        }
        Some(path) => [path.to_path_buf(), runs.join(path)]
            .into_iter()
            .find(|candidate| is_run_dir(candidate))
            .ok_or_else(|| RunNotFound::NotARun(path.to_path_buf())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_record_is_named_by_its_round_after_the_first() {
        let run = RunDir::at(Path::new("/r"));
        assert_eq!(run.node_path("n1", 0), Path::new("/r/nodes/n1"));
        assert_eq!(run.node_path("n1", 2), Path::new("/r/nodes/n1.2"));
        assert_eq!(run.srun_log_path(), Path::new("/r/srun.log"));
    }

    #[test]
    fn a_run_is_found_by_path_by_name_and_as_the_latest() {
        let parent = tempfile::tempdir().unwrap();
        let runs = parent.path().join("runs");
        for name in ["a", "b"] {
            fs::create_dir_all(runs.join(name)).unwrap();
            fs::write(runs.join(name).join("events.jsonl"), "").unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        fs::create_dir_all(runs.join("empty")).unwrap();
        assert_eq!(resolve_run(None, &runs), Ok(runs.join("b")));
        assert_eq!(
            resolve_run(Some(Path::new("latest")), &runs),
            Ok(runs.join("b"))
        );
        assert_eq!(resolve_run(Some(Path::new("a")), &runs), Ok(runs.join("a")));
        assert_eq!(
            resolve_run(Some(&runs.join("a")), &runs),
            Ok(runs.join("a"))
        );
        assert!(!is_run_dir(&runs.join("empty")));
        assert_eq!(
            resolve_run(Some(Path::new("empty")), &runs),
            Err(RunNotFound::NotARun(PathBuf::from("empty")))
        );
        let nowhere = parent.path().join("nowhere");
        assert_eq!(
            resolve_run(None, &nowhere),
            Err(RunNotFound::NoRuns(nowhere))
        );
    }

    #[test]
    fn the_plan_is_written_owner_only_and_once() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::at(dir.path());
        run.write_plan("{}").unwrap();
        let mode = fs::metadata(run.plan_path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(fs::read_to_string(run.plan_path()).unwrap(), "{}\n");
        assert!(run.write_plan("{}").is_err());
    }
}
