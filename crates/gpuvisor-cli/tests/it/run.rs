//! `gpuvisor run`, `ps`, `stop`, `restart` end to end: real processes on the CPU, a simulated
//! GPU inventory for the plan.

use crate::util;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::harness::wait_until;
use gpuvisor_record::log_file;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{Map, Value};
use util::{gpuvisor, Run};

/// A job directory with `job.toml` holding `text`.
fn job(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// A started `gpuvisor run`, killed if a test fails before it ends (its keepers then take
/// the job down with it).
struct Running(Option<Child>);

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0.as_ref().expect("running")
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        self.0.as_mut().expect("running")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `gpuvisor run JOB --run-dir DIR/run --simulate 1x80GiB --quiet EXTRA...`, started.
fn start_run(dir: &Path, job: &Path, extra: &[&str]) -> Running {
    Running(Some(
        gpuvisor()
            .current_dir(dir)
            .arg("run")
            .arg(job)
            .arg("--run-dir")
            .arg(dir.join("run"))
            .args(["--simulate", "1x80GiB", "--quiet"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ))
}

fn finish(mut running: Running) -> Run {
    let child = running.0.take().expect("running");
    child.wait_with_output().unwrap().into()
}

/// The child's stdout lines in a log file's text, through the record's parser of the format.
fn stdout_lines(log: &str) -> impl Iterator<Item = String> {
    log_file::parse(log)
        .into_iter()
        .filter(|line| !line.stderr)
        .map(|line| line.text)
}

fn events(dir: &Path) -> Vec<Map<String, Value>> {
    gpuvisor_supervisor::events::read_events(&dir.join("run/events.jsonl")).unwrap_or_default()
}

fn count(events: &[Map<String, Value>], kind: &str, process: &str) -> usize {
    events
        .iter()
        .filter(|event| {
            event["kind"] == kind && event.get("process").and_then(Value::as_str) == Some(process)
        })
        .count()
}

/// Every descendant of `root`, from /proc.
fn descendants(root: i32) -> Vec<i32> {
    let processes = gpuvisor_supervisor::procfs::all_processes();
    let mut found = vec![root];
    let mut cursor = 0;
    while cursor < found.len() {
        let parent = found[cursor];
        found.extend(processes.iter().filter(|p| p.ppid == parent).map(|p| p.pid));
        cursor += 1;
    }
    found.remove(0);
    found
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

#[test]
fn sigkill_of_gpuvisor_leaves_no_process_of_the_job_and_a_readable_record() {
    let (dir, path) = job(r#"
[process.tree]
command = ["sh", "-c", "sleep 300 & setsid sleep 300 & (trap '' INT TERM HUP; sleep 300) & wait"]
device = "cpu"

[process.escapee]
command = ["sh", "-c", "(setsid sh -c 'sleep 300' &); sleep 300"]
device = "cpu"
"#);
    let mut child = start_run(dir.path(), &path, &[]);
    let supervisor = child.id() as i32;
    // Everything is up: two keepers, their shells, four sleeps (one double-forked away).
    wait_until(
        Duration::from_secs(20),
        "five sleeps under the supervisor",
        || {
            let sleeps = descendants(supervisor)
                .iter()
                .filter(|&&pid| {
                    std::fs::read_to_string(format!("/proc/{pid}/comm"))
                        .is_ok_and(|comm| comm.trim() == "sleep")
                })
                .count();
            if sleeps == 5 {
                Ok(())
            } else {
                Err(format!(
                    "{sleeps} sleeps; the job did not start: {:?}",
                    events(dir.path())
                ))
            }
        },
    );
    let job_pids = descendants(supervisor);
    kill(Pid::from_raw(supervisor), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    let left = || {
        job_pids
            .iter()
            .copied()
            .filter(|&pid| alive(pid))
            .collect::<Vec<_>>()
    };
    wait_until(
        Duration::from_secs(10),
        "every process gone after SIGKILL of gpuvisor",
        || {
            let left = left();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("still running after SIGKILL of gpuvisor: {left:?}"))
            }
        },
    );
    // The record reads back, and `ps` says what happened.
    let record = events(dir.path());
    assert_eq!(count(&record, "start", "tree"), 1);
    let ps = util::run(&["ps", dir.path().join("run").to_str().unwrap()]);
    assert_eq!(ps.code, Some(0), "{}", ps.stderr);
    assert!(
        ps.stdout.contains("gone (supervisor killed)"),
        "{}",
        ps.stdout
    );
}

#[test]
fn ctrl_c_stops_gracefully_and_a_second_one_kills_at_once() {
    let (dir, path) = job(r#"
[process.polite]
command = ["sh", "-c", "trap 'echo bye; exit 0' INT; echo armed; while :; do sleep 0.05; done"]
device = "cpu"

[process.stubborn]
command = ["sh", "-c", "trap '' INT; echo armed; while :; do sleep 0.05; done"]
device = "cpu"

[process.stubborn.stop]
grace = "60s"
"#);
    let child = start_run(dir.path(), &path, &[]);
    let supervisor = Pid::from_raw(child.id() as i32);
    // Both shells must have set their traps (they say so) before the first Ctrl-C: on a loaded
    // machine a signal can otherwise arrive before `trap` ran.
    let armed = |name: &str| {
        std::fs::read_to_string(dir.path().join(format!("run/logs/{name}.log")))
            .is_ok_and(|log| stdout_lines(&log).any(|line| line == "armed"))
    };
    wait_until(Duration::from_secs(20), "both replicas armed", || {
        armed("polite") && armed("stubborn")
    });
    kill(supervisor, Signal::SIGINT).unwrap();
    wait_until(Duration::from_secs(20), "1 exit event(s) of polite", || {
        count(&events(dir.path()), "exit", "polite") == 1
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        count(&events(dir.path()), "exit", "stubborn"),
        0,
        "still in its 60 s grace"
    );
    let second = Instant::now();
    kill(supervisor, Signal::SIGINT).unwrap();
    let run = finish(child);
    assert!(second.elapsed() < Duration::from_secs(10));
    assert_eq!(run.code, Some(130), "stopped by SIGINT: {}", run.stderr);
    let record = events(dir.path());
    let polite_exit = record
        .iter()
        .find(|e| e["kind"] == "exit" && e["process"] == "polite")
        .unwrap();
    assert_eq!(polite_exit["code"], 0);
    let stubborn_exit = record
        .iter()
        .find(|e| e["kind"] == "exit" && e["process"] == "stubborn")
        .unwrap();
    assert_eq!(stubborn_exit["summary"], "stopped (SIGKILL)");
    assert!(
        run.stderr.contains("EXIT CAUSE") && run.stderr.contains("stopped (SIGKILL)"),
        "{}",
        run.stderr
    );
    let log = std::fs::read_to_string(dir.path().join("run/logs/polite.log")).unwrap();
    assert!(stdout_lines(&log).any(|line| line == "bye"), "{log}");
}

#[test]
fn ps_restart_and_stop_talk_to_the_running_supervisor() {
    let (dir, path) = job(r#"
[process.worker]
command = ["sh", "-c", "while :; do sleep 0.05; done"]
replicas = 2
memory = "4GiB"
"#);
    let child = start_run(dir.path(), &path, &[]);
    let run_dir = dir.path().join("run");
    let run_arg = run_dir.to_str().unwrap();
    wait_until(
        Duration::from_secs(20),
        "1 start event(s) of worker[1]",
        || count(&events(dir.path()), "start", "worker[1]") == 1,
    );
    let ps = util::run(&["ps", run_arg, "--json"]);
    let json: Value = serde_json::from_str(&ps.stdout).unwrap_or_else(|_| panic!("{ps:?}"));
    assert_eq!(json["live"], true);
    assert_eq!(json["replicas"][1]["label"], "worker[1]");
    assert_eq!(json["replicas"][1]["budget_bytes"], 4u64 << 30);
    // `pid` is the command's, the keeper's child, `group` its keeper's process group. (Not its
    // name: on a loaded machine the keeper's child can still be between fork and exec, named
    // as the keeper, when `ps` finds it.)
    let pid = json["replicas"][0]["pid"].as_i64().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let parent = status
        .lines()
        .find_map(|line| line.strip_prefix("PPid:"))
        .map(|ppid| ppid.trim().parse::<i64>().unwrap());
    assert_eq!(parent, json["replicas"][0]["group"].as_i64(), "{status}");
    assert_ne!(json["replicas"][0]["group"], json["replicas"][0]["pid"]);
    let table = util::run(&["ps", run_arg]);
    assert!(
        table.stdout.contains("worker[0]") && table.stdout.contains("/ 4.0 GiB"),
        "{}",
        table.stdout
    );
    let typo = util::run(&["restart", run_arg, "wrker"]);
    assert_eq!(typo.code, Some(2));
    assert!(
        typo.stderr.contains("hint: processes are: worker"),
        "{}",
        typo.stderr
    );
    let restarted = util::run(&["restart", run_arg, "worker"]);
    assert_eq!(restarted.code, Some(0));
    assert!(
        restarted
            .stdout
            .starts_with("gpuvisor: restarting worker[0] (pid ")
            && restarted.stdout.contains("), worker[1] (pid "),
        "restart says what it did: {}",
        restarted.stdout
    );
    wait_until(
        Duration::from_secs(20),
        "2 start event(s) of worker[0]",
        || count(&events(dir.path()), "start", "worker[0]") == 2,
    );
    let stopped = util::run(&["stop", run_arg]);
    assert_eq!(stopped.code, Some(0));
    assert!(
        stopped.stdout.starts_with("gpuvisor: stopped job ")
            && stopped.stdout.contains("it ended with status 0"),
        "stop says what it did: {}",
        stopped.stdout
    );
    let run = finish(child);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let after = util::run(&["ps", run_arg]);
    assert!(after.stdout.contains("finished"), "{}", after.stdout);
    assert!(
        after.stdout.contains("PEAK GPU / BUDGET") && after.stdout.contains("0 B / 4.0 GiB"),
        "the recorded peaks, budgets from plan.json: {}",
        after.stdout
    );
    let stopped = util::run(&["stop", run_arg]);
    assert_eq!(
        stopped.code,
        Some(1),
        "a finished run has no socket: {stopped:?}"
    );
}

#[test]
fn a_fast_writer_loses_no_line_in_its_log_file() {
    let (dir, path) = job(r#"
[process.chatty]
command = ["seq", "1", "1000000"]
device = "cpu"
"#);
    let run = finish(start_run(dir.path(), &path, &[]));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let log = std::fs::read_to_string(dir.path().join("run/logs/chatty.log")).unwrap();
    let mut expected = 1u64;
    for line in stdout_lines(&log) {
        assert_eq!(line.parse::<u64>().unwrap(), expected);
        expected += 1;
    }
    assert_eq!(expected, 1_000_001);
}

#[test]
fn a_missing_command_is_refused_before_anything_starts() {
    let (dir, path) = job(r#"
[process.first]
command = ["no-such-program-gpuvisor"]
device = "cpu"

[process.second]
command = ["touch", "second-ran"]
device = "cpu"
after = ["first"]
"#);
    let run = finish(start_run(dir.path(), &path, &[]));
    // Found before anything starts: bad input, nothing created.
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("program `no-such-program-gpuvisor` not found in PATH"),
        "{}",
        run.stderr
    );
    assert!(!dir.path().join("run").exists(), "no run directory");
    assert!(!dir.path().join("second-ran").exists());
}

#[test]
fn every_program_script_and_directory_problem_is_reported_in_one_pass() {
    let (dir, path) = job(r#"
[process.learner]
command = ["pyhton3", "learner.py"]

[process.actor]
command = ["python3", "-u", "actor.py", "--id", "{replica}"]
replicas = 3
device = "cpu"

[process.sim]
command = ["./isaac-sim.sh", "--headless"]
device = "cpu"

[process.tool]
command = ["sh", "-c", "exit 0"]
cwd = "no-such-dir"
device = "cpu"

[process.fine]
command = ["python3", "fine.py"]
device = "cpu"
"#);
    std::fs::write(dir.path().join("fine.py"), "").unwrap();
    std::fs::write(dir.path().join("isaac-sim.sh"), "#!/bin/sh\n").unwrap();
    // A PATH of known content, for the near-name hint: a python3, and /bin for sh.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::write(bin.join("python3"), "#!/bin/sh\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(bin.join("python3"), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Run from elsewhere: paths start from the job file's directory.
    let run = gpuvisor()
        .current_dir("/")
        .env("PATH", format!("{}:/bin:/usr/bin", bin.display()))
        .args(["run", path.to_str().unwrap(), "--simulate", "1x80GiB"])
        .output()
        .unwrap();
    // plan says the same as warnings, and still plans.
    let plan = gpuvisor()
        .env("PATH", format!("{}:/bin:/usr/bin", bin.display()))
        .args(["plan", path.to_str().unwrap(), "--simulate", "1x80GiB"])
        .output()
        .unwrap();
    let plan = Run::from(plan);
    assert_eq!(plan.code, Some(0), "{}", plan.stderr);
    assert_eq!(
        plan.stderr.matches("warning: ").count(),
        4,
        "{}",
        plan.stderr
    );
    assert!(
        plan.stderr
            .contains("`gpuvisor run` refuses to start this job until these are fixed"),
        "{}",
        plan.stderr
    );
    let run = Run::from(run);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    insta::assert_snapshot!(util::redact(&run.stderr, dir.path()));
}

#[test]
fn a_bad_run_directory_is_refused_before_anything_starts() {
    let (dir, path) = job(r#"
[process.marker]
command = ["touch", "started"]
device = "cpu"
"#);
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let unwritable: Run = gpuvisor()
        .current_dir(dir.path())
        .args([
            "run",
            path.to_str().unwrap(),
            "--simulate",
            "1x80GiB",
            "--run-dir",
        ])
        .arg(file.join("run"))
        .output()
        .unwrap()
        .into();
    assert_eq!(unwritable.code, Some(1));
    assert!(
        unwritable
            .stderr
            .contains("cannot create the run directory"),
        "{}",
        unwritable.stderr
    );
    assert!(!dir.path().join("started").exists());
    // A directory that already holds a run is refused too.
    assert_eq!(finish(start_run(dir.path(), &path, &[])).code, Some(0));
    std::fs::remove_file(dir.path().join("started")).unwrap();
    let second = finish(start_run(dir.path(), &path, &[]));
    assert_eq!(second.code, Some(2));
    assert!(
        second.stderr.contains("already holds a run"),
        "{}",
        second.stderr
    );
    assert!(!dir.path().join("started").exists());
}

#[test]
fn readiness_flags_are_checked() {
    let (dir, path) = job("[process.a]\ncommand = [\"true\"]\ndevice = \"cpu\"\n");
    let run = finish(start_run(dir.path(), &path, &["--ready", "b=exit"]));
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("no process `b`"), "{}", run.stderr);
    let ok = finish(start_run(dir.path(), &path, &["--ready", "a=exit"]));
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
}

#[test]
fn the_job_files_ready_key_orders_the_start() {
    // setup must exit 0, then server must print its line, before client starts: client finds
    // both marks or fails.
    let (dir, path) = job(concat!(
        "[process.setup]\ncommand = [\"sh\", \"-c\", \"sleep 0.3; touch setup-done\"]\n",
        "device = \"cpu\"\nready = \"exit\"\n",
        "[process.server]\ncommand = [\"sh\", \"-c\", \"sleep 0.3; touch serving; echo serving on 7; sleep 1\"]\n",
        "device = \"cpu\"\nready = \"log:^serving on \\\\d+$\"\nafter = [\"setup\"]\n",
        "[process.client]\ncommand = [\"sh\", \"-c\", \"test -f setup-done && test -f serving && touch client-ok\"]\n",
        "device = \"cpu\"\nafter = [\"server\"]\n",
    ));
    let run = finish(start_run(dir.path(), &path, &[]));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(dir.path().join("client-ok").exists(), "{}", run.stderr);
    let events = events(dir.path());
    assert_eq!(count(&events, "ready", "server"), 1, "{events:?}");
}

#[test]
fn replicas_feel_sigint_even_when_gpuvisor_was_started_ignoring_it() {
    // A shell starting gpuvisor in the background ignores SIGINT for it; the replicas must
    // not inherit that, or a graceful stop always ends in SIGKILL.
    let (dir, path) = job("[process.sleeper]\ncommand = [\"sleep\", \"300\"]\ndevice = \"cpu\"\n");
    let child = Running(Some(
        gpuvisor_testkit::scrubbed("sh")
            .arg("-c")
            .arg("trap '' INT; exec \"$0\" run \"$1\" --run-dir \"$2\" --simulate 1x80GiB --quiet")
            .arg(crate::harness::BIN)
            .arg(&path)
            .arg(dir.path().join("run"))
            .current_dir(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    wait_until(
        Duration::from_secs(20),
        "1 start event(s) of sleeper",
        || count(&events(dir.path()), "start", "sleeper") == 1,
    );
    let run_dir = dir.path().join("run");
    assert_eq!(
        util::run(&["stop", run_dir.to_str().unwrap()]).code,
        Some(0)
    );
    let run = finish(child);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let record = events(dir.path());
    let exit = record.iter().find(|e| e["kind"] == "exit").unwrap();
    assert_eq!(exit["summary"], "stopped (SIGINT)", "{exit:?}");
}

#[test]
fn the_job_files_restart_table_drives_restarts_and_the_crash_loop() {
    let (dir, path) = job(r#"
[process.flaky]
command = ["sh", "-c", "echo 'RuntimeError: CUDA error: an illegal memory access was encountered' >&2; exit 3"]
device = "cpu"

[process.flaky.restart]
policy = "on-failure"
max_restarts = 2
window = "60s"
backoff = "50ms"
backoff_max = "1s"
"#);
    let run = finish(start_run(dir.path(), &path, &[]));
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let record = events(dir.path());
    assert_eq!(count(&record, "start", "flaky"), 3);
    assert_eq!(count(&record, "restart", "flaky"), 2);
    assert_eq!(count(&record, "crash-loop", "flaky"), 1);
    let exit = record.iter().find(|e| e["kind"] == "exit").unwrap();
    assert_eq!(
        exit["cause"], "cuda-error",
        "the log tail names it: {exit:?}"
    );
    assert!(run.stderr.contains("CUDA error"), "{}", run.stderr);
}

#[test]
fn a_slow_terminal_drops_lines_there_but_never_slows_the_job_or_the_files() {
    let (dir, path) =
        job("[process.chatty]\ncommand = [\"seq\", \"1\", \"300000\"]\ndevice = \"cpu\"\n");
    let mut child = Running(Some(
        gpuvisor()
            .current_dir(dir.path())
            .arg("run")
            .arg(&path)
            .arg("--run-dir")
            .arg(dir.path().join("run"))
            .args(["--simulate", "1x80GiB"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    // A terminal reading 1 KiB every 20 ms: about 50 kB/s, over 45 s for all 2.3 MB of output.
    // The child must be done long before that, however loaded the machine.
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut seen = Vec::new();
        let mut buffer = [0u8; 1024];
        loop {
            match stdout.read(&mut buffer) {
                Ok(0) | Err(_) => return seen,
                Ok(count) => seen.extend_from_slice(&buffer[..count]),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let started = Instant::now();
    wait_until(
        Duration::from_secs(30),
        "chatty's exit (else the child was held up by the terminal)",
        || count(&events(dir.path()), "exit", "chatty") == 1,
    );
    let child_done = started.elapsed();
    let status = child.wait().unwrap();
    let shown = String::from_utf8(reader.join().unwrap()).unwrap();
    assert!(status.success());
    assert!(child_done < Duration::from_secs(30), "{child_done:?}");
    assert!(
        shown.contains("lines not shown here, all are in the log file"),
        "{}",
        &shown[..shown.len().min(500)]
    );
    // What the terminal shows is in order, each line whole: a prefixed number or a drop notice.
    let mut last = 0u64;
    for line in shown.lines() {
        let text = line
            .strip_prefix("chatty | ")
            .unwrap_or_else(|| panic!("unprefixed: {line}"));
        if text.starts_with("[gpuvisor: ") {
            continue;
        }
        let number: u64 = text
            .parse()
            .unwrap_or_else(|_| panic!("a torn line: {line}"));
        assert!(number > last, "{number} after {last}");
        last = number;
    }
    assert_eq!(last, 300_000, "the last line reaches the terminal");
    let log = std::fs::read_to_string(dir.path().join("run/logs/chatty.log")).unwrap();
    assert_eq!(log_file::parse(&log).len(), 300_000);
}

#[test]
fn a_replica_whose_keeper_dies_leaves_nothing_behind() {
    // The keeper is SIGKILLed (as the OOM killer might); its command must not run on alone,
    // while the job goes on (the replica restarts).
    let (dir, path) = job(
        "[process.orphaned]\ncommand = [\"sleep\", \"300\"]\ndevice = \"cpu\"\nrestart = \"always\"\n",
    );
    let child = start_run(dir.path(), &path, &[]);
    wait_until(
        Duration::from_secs(20),
        "1 start event(s) of orphaned",
        || count(&events(dir.path()), "start", "orphaned") == 1,
    );
    let record = events(dir.path());
    let keeper = record.iter().find(|e| e["kind"] == "start").unwrap()["pid"]
        .as_i64()
        .unwrap() as i32;
    let mut sleeper = 0;
    wait_until(Duration::from_secs(10), "the keeper's command", || {
        sleeper = gpuvisor_supervisor::procfs::children(keeper)
            .first()
            .copied()
            .unwrap_or(0);
        sleeper != 0
    });
    kill(Pid::from_raw(keeper), Signal::SIGKILL).unwrap();
    wait_until(
        Duration::from_secs(5),
        "the command to end with its keeper (else it outlived it)",
        || !alive(sleeper),
    );
    wait_until(
        Duration::from_secs(20),
        "2 start event(s) of orphaned",
        || count(&events(dir.path()), "start", "orphaned") == 2,
    );
    let exit = events(dir.path())
        .into_iter()
        .find(|e| e["kind"] == "exit")
        .unwrap();
    assert_eq!(exit["signal"], "SIGKILL");
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let run = finish(child);
    assert_eq!(run.code, Some(143), "{}", run.stderr);
}

#[test]
fn a_cpu_only_job_runs_without_a_gpu_or_simulate() {
    let (dir, path) = job("[process.a]\ncommand = [\"echo\", \"hello\"]\ndevice = \"cpu\"\n");
    let run: Run = gpuvisor()
        .current_dir(dir.path())
        .arg("run")
        .arg(&path)
        .args(["--run-dir", "run"])
        .output()
        .unwrap()
        .into();
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "a | hello\n");
}

/// Names in /dev/shm of files a `run` with this pid created (its ledger and simulator state
/// end in `-<pid>`).
fn shm_files_of_run(pid: u32) -> Vec<String> {
    let suffix = format!("-{pid}");
    std::fs::read_dir("/dev/shm")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("gpuvisor-") && name.ends_with(&suffix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_failure_before_start_exits_2_and_leaves_nothing_behind() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_port = busy.local_addr().unwrap().port().to_string();
    let long = "x".repeat(131_072);
    // Arguments that each fit but together pass ARG_MAX.
    let arg_max: usize = String::from_utf8(
        std::process::Command::new("getconf")
            .arg("ARG_MAX")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    let many = vec![format!("\"{}\"", "y".repeat(100_000)); arg_max / 100_000 + 1].join(", ");
    // (job file's process table after `command`, flags, what stderr must say)
    let cases: Vec<(String, Vec<&str>, Vec<String>)> = vec![
        (
            String::new(),
            vec!["--metrics", &busy_port],
            vec![
                format!("cannot serve --metrics on 127.0.0.1:{busy_port}: Address already in use"),
                "hint: another program listens on port".to_string(),
            ],
        ),
        (
            String::new(),
            vec!["--metrics", "0.0.0.0:0"],
            vec![
                "0.0.0.0:0 is not a loopback address".to_string(),
                "hint: use 127.0.0.1:PORT".to_string(),
            ],
        ),
        (
            "env = { TOKEN = \"ab\\u0000c\" }\n".to_string(),
            Vec::new(),
            vec![
                "job.toml:5:17: `env.TOKEN` in [process.p] holds a NUL byte".to_string(),
                "hint: ".to_string(),
            ],
        ),
        (
            "cwd = \"no-such-directory\"\n".to_string(),
            Vec::new(),
            vec![
                "job.toml:5:7: `cwd` in [process.p]: ".to_string(),
                "no-such-directory does not exist".to_string(),
                "hint: create the directory".to_string(),
            ],
        ),
        (
            "cwd = \"job.toml\"\n".to_string(),
            Vec::new(),
            vec!["job.toml is not a directory".to_string()],
        ),
        (
            format!("env = {{ BIG = \"{long}\" }}\n"),
            Vec::new(),
            vec!["`env.BIG` in [process.p] is 131076 bytes".to_string()],
        ),
        (
            format!("command = [\"touch\", \"started\", {many}]\n"),
            Vec::new(),
            vec![
                "job.toml:4:1: the arguments and environment of [process.p] come to ".to_string(),
                format!("more than the {arg_max} bytes Linux lets a program start with (ARG_MAX)"),
                "hint: put large data in files".to_string(),
            ],
        ),
    ];
    for (extra, flags, expected) in cases {
        let command = match extra.starts_with("command") {
            true => "",
            false => "command = [\"touch\", \"started\"]\n",
        };
        let (dir, path) = job(&format!(
            "[job]\nname = \"pre\"\n\n[process.p]\n{extra}{command}"
        ));
        let parent = dir.path().join("runs");
        std::fs::create_dir(&parent).unwrap();
        let child = gpuvisor()
            .current_dir(dir.path())
            .arg("run")
            .arg(&path)
            .arg("--run-dir")
            .arg(parent.join("run"))
            .args(["--simulate", "1x80GiB", "--quiet"])
            .args(&flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let run: Run = child.wait_with_output().unwrap().into();
        let stderr = &run.stderr[..run.stderr.len().min(2000)];
        assert_eq!(run.code, Some(2), "{flags:?} {extra:.80}: {stderr}");
        for text in &expected {
            assert!(
                stderr.contains(text.as_str()),
                "expected `{text}` in:\n{stderr}"
            );
        }
        assert!(!dir.path().join("started").exists(), "{stderr}");
        let created: Vec<_> = std::fs::read_dir(&parent).unwrap().collect();
        assert!(created.is_empty(), "a run directory was created: {stderr}");
        assert_eq!(shm_files_of_run(pid), Vec::<String>::new(), "{stderr}");
    }
    drop(busy);
}

#[test]
fn logs_follow_a_live_run_merged_and_prefixed_until_it_ends() {
    let (dir, path) = job(r#"
[process.learner]
command = ["sh", "-c", "for i in 1 2 3 4 5 6; do echo learner step $i; sleep 0.2; done"]
device = "cpu"

[process.actor]
command = ["sh", "-c", "for i in 1 2 3; do echo actor step $i >&2; sleep 0.3; done"]
replicas = 2
device = "cpu"
"#);
    let running = start_run(dir.path(), &path, &[]);
    let run_dir = dir.path().join("run");
    wait_until(Duration::from_secs(10), "the control socket", || {
        run_dir.join("control.sock").exists()
    });
    let follower = gpuvisor()
        .args(["logs", run_dir.to_str().unwrap(), "-f"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let run = finish(running);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // It ends by itself once the run has.
    let followed = follower.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&followed.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let of = |prefix: &str| -> Vec<&str> {
        lines
            .iter()
            .filter(|line| line.starts_with(prefix))
            .map(|line| line[prefix.len()..].trim_start_matches(' '))
            .collect()
    };
    let steps = |name: &str, n: usize| -> Vec<String> {
        (1..=n).map(|i| format!("| {name} step {i}")).collect()
    };
    assert_eq!(of("learner "), steps("learner", 6), "{text}");
    assert_eq!(of("actor[0] "), steps("actor", 3), "{text}");
    assert_eq!(of("actor[1] "), steps("actor", 3), "{text}");
    // One replica's last lines, after the run.
    let tail = gpuvisor()
        .args(["logs", run_dir.to_str().unwrap(), "actor[1]", "-n", "2"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&tail.stdout),
        "actor[1] | actor step 2\nactor[1] | actor step 3\n"
    );
}

#[test]
fn logs_reads_a_run_recorded_before_format_2_as_before() {
    // The recorded fixture's log files have a stamp on every line (log file format 1).
    let tail = gpuvisor()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["logs", "tests/fixtures/run-chain", "actor[0]", "-n", "2"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&tail.stdout),
        "actor[0] | 20984 alloc 268435456 rc=0\n\
         actor[0] | ConnectionResetError: [Errno 104] Connection reset by peer\n",
        "{}",
        String::from_utf8_lossy(&tail.stderr)
    );
}

#[test]
fn a_detached_run_goes_on_alone_and_attach_follows_it_to_its_summary() {
    let (dir, path) = job(r#"
[process.learner]
command = ["sh", "-c", "for i in 1 2 3 4 5; do echo learner step $i; sleep 0.4; done"]
device = "cpu"
"#);
    let run_dir = dir.path().join("run");
    let detach = Run::from(
        gpuvisor()
            .current_dir(dir.path())
            .args(["run", path.to_str().unwrap(), "--run-dir"])
            .arg(&run_dir)
            .args(["--simulate", "1x80GiB", "--detach"])
            .output()
            .unwrap(),
    );
    assert_eq!(detach.code, Some(0), "{}", detach.stderr);
    assert!(
        detach.stderr.contains("runs detached") && detach.stderr.contains("gpuvisor attach"),
        "{}",
        detach.stderr
    );
    // It returned while the job runs on (the supervisor removes its socket last).
    assert!(run_dir.join("control.sock").exists(), "the job runs on");
    let attached = Run::from(
        gpuvisor()
            .args(["attach", run_dir.to_str().unwrap()])
            .output()
            .unwrap(),
    );
    assert_eq!(attached.code, Some(0), "{}", attached.stderr);
    for step in 1..=5 {
        assert!(
            attached
                .stdout
                .contains(&format!("learner | learner step {step}\n")),
            "{}",
            attached.stdout
        );
    }
    assert!(
        attached.stdout.contains("gpuvisor: job ok (exit status 0)"),
        "the summary last: {}",
        attached.stdout
    );
    // A job file with a problem is refused in the foreground, and nothing is left.
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[process.x]\ncommand = [\"no-such-program-gpuvisor\"]\n",
    )
    .unwrap();
    let refused = Run::from(
        gpuvisor()
            .current_dir(dir.path())
            .args([
                "run",
                bad.to_str().unwrap(),
                "--run-dir",
                "bad-run",
                "--detach",
            ])
            .args(["--simulate", "1x80GiB"])
            .output()
            .unwrap(),
    );
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("not found in PATH"),
        "{}",
        refused.stderr
    );
    assert!(!dir.path().join("bad-run").exists());
}
