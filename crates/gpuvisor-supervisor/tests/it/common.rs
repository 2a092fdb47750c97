//! Helpers for the supervisor's process tests: replicas built in code (no job file), the
//! crate's own keeper binary, and a lock so only one supervisor reaps in this test process.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use gpuvisor_core::spec::RestartSpec;
use gpuvisor_supervisor::events::read_events;
use gpuvisor_supervisor::rundir::RunDir;
use gpuvisor_supervisor::spawn::Launch;
use gpuvisor_supervisor::supervisor::{
    supervise, NoHooks, Options, Outcome, Readiness, ReplicaSpec,
};
use nix::sys::signal::Signal;
use serde_json::{Map, Value};

static ONE_SUPERVISOR: Mutex<()> = Mutex::new(());

/// Only one supervisor per test process at a time: it reaps every child of the process.
pub fn exclusive() -> MutexGuard<'static, ()> {
    ONE_SUPERVISOR
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
}

/// A replica running `sh -c script`, ready when started, no restart, 2 s grace.
pub fn shell(process: &str, script: &str) -> ReplicaSpec {
    ReplicaSpec {
        process: process.to_string(),
        replica: 0,
        label: process.to_string(),
        file_stem: process.to_string(),
        launch: Launch {
            argv: vec!["sh".into(), "-c".into(), script.to_string()],
            env: Vec::new(),
            cwd: None,
            output: Default::default(),
        },
        after: Vec::new(),
        restart: RestartSpec::default(),
        stop_signal: Signal::SIGINT,
        grace_ms: 2000,
        readiness: Readiness::Started,
        budget_bytes: 0,
        direct_logs: false,
    }
}

/// Options for tests: the crate's keeper, no terminal copy, fast sampling.
pub fn options() -> Options {
    let mut options = Options::new(
        "test",
        Some(vec![env!("CARGO_BIN_EXE_gpuvisor-test-keeper").into()]),
    );
    options.terminal = false;
    options.sample_interval = Duration::from_millis(100);
    options
}

/// A fresh run directory.
pub fn run_dir() -> (tempfile::TempDir, RunDir) {
    let parent = tempfile::tempdir().unwrap();
    let run = RunDir::create(&parent.path().join("run")).unwrap();
    (parent, run)
}

/// Supervises `replicas` to the end; returns the outcome and the events.
pub fn run_job(replicas: Vec<ReplicaSpec>, run: &RunDir) -> (Outcome, Vec<Map<String, Value>>) {
    let outcome = supervise(replicas, run, options(), &mut NoHooks).unwrap();
    (outcome, read_events(&run.events_path()).unwrap())
}

/// Position of the first event of `kind` about `process`.
pub fn position(events: &[Map<String, Value>], kind: &str, process: &str) -> usize {
    events
        .iter()
        .position(|event| {
            event["kind"] == kind && event.get("process").and_then(Value::as_str) == Some(process)
        })
        .unwrap_or_else(|| panic!("no {kind} event for {process} in {events:#?}"))
}

/// Events of `kind` about `process`.
pub fn all<'a>(
    events: &'a [Map<String, Value>],
    kind: &str,
    process: &str,
) -> Vec<&'a Map<String, Value>> {
    events
        .iter()
        .filter(|event| {
            event["kind"] == kind && event.get("process").and_then(Value::as_str) == Some(process)
        })
        .collect()
}

pub use gpuvisor_testkit::wait_until;

/// Whether a process with this pid exists (and is not a zombie).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// A temp path for a marker file.
pub fn marker(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}
