//! `logs = "direct"` end to end: processes write their own log files, and every view of the
//! output (the terminal copy, readiness by a log line, the exit cause, `gpuvisor logs`)
//! reads them back through the times file the supervisor keeps.

use crate::util::{gpuvisor, Run};

const JOB: &str = r#"
[process.server]
command = ["sh", "-c", "echo booting; sleep 0.3; echo 'listening on 8080' >&2; sleep 5; echo bye"]
device = "cpu"
logs = "direct"
ready = "log:listening on \\d+"

[process.actor]
command = ["sh", "-c", "for i in 1 2 3; do echo actor step $i; sleep 0.1; done; printf 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.' >&2; if [ {replica} = 0 ]; then touch zero-wrote; sleep 5; else while [ ! -e zero-wrote ]; do sleep 0.05; done; exit 1; fi"]
replicas = 2
device = "cpu"
logs = "direct"
after = ["server"]
"#;

#[test]
fn direct_logs_are_copied_to_the_terminal_dated_matched_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.toml");
    std::fs::write(&job, JOB).unwrap();
    let run_dir = dir.path().join("run");
    let run: Run = gpuvisor()
        .args(["run", job.to_str().unwrap(), "--run-dir"])
        .arg(&run_dir)
        .args(["--simulate", "1x24GiB"])
        .output()
        .unwrap()
        .into();
    assert_eq!(run.code, Some(1), "{run:?}");
    let logs = run_dir.join("logs");
    for stem in ["server", "actor.0", "actor.1"] {
        for file in ["out.log", "err.log", "times"] {
            assert!(
                logs.join(format!("{stem}.{file}")).exists(),
                "{stem}.{file}"
            );
        }
        assert!(
            !logs.join(format!("{stem}.log")).exists(),
            "no pumped file for {stem}"
        );
    }
    // The terminal copy, the last (unended) line included.
    for line in [
        "server   | listening on 8080",
        "actor[1] | actor step 3",
        "actor[0] | torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "actor[1] | torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    ] {
        assert!(run.stdout.contains(line), "`{line}` in\n{}", run.stdout);
    }
    // The actors started once the server's stderr said it listens (after `booting`).
    let events = std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap();
    let at = |kind: &str, process: &str| {
        let (kind, process) = (
            format!(r#""kind":"{kind}""#),
            format!(r#""process":"{process}""#),
        );
        events
            .lines()
            .position(|line| line.contains(&kind) && line.contains(&process))
            .unwrap_or_else(|| panic!("no {kind} of {process} in\n{events}"))
    };
    assert!(at("ready", "server") < at("start", "actor[0]"), "{events}");
    // actor[1] fails once actor[0] has written its (unended) last line; actor[0] is stopped
    // with the job. actor[1]'s exit cause comes from the tail the pump read back.
    let exit = events
        .lines()
        .find(|line| line.contains(r#""kind":"exit""#) && line.contains(r#""process":"actor[1]""#))
        .unwrap_or_else(|| panic!("no exit of actor[1] in\n{events}"));
    assert!(exit.contains(r#""cause":"cuda-oom""#), "{exit}");
    // `gpuvisor logs` merges the replicas' dated lines.
    let all: Run = gpuvisor()
        .arg("logs")
        .arg(&run_dir)
        .output()
        .unwrap()
        .into();
    assert_eq!(all.code, Some(0), "{all:?}");
    let server: Vec<&str> = all
        .stdout
        .lines()
        .filter(|line| line.starts_with("server "))
        .collect();
    assert_eq!(
        server,
        ["server   | booting", "server   | listening on 8080"],
        "{}",
        all.stdout
    );
    let tail: Run = gpuvisor()
        .arg("logs")
        .arg(&run_dir)
        .args(["actor[1]", "-n", "2"])
        .output()
        .unwrap()
        .into();
    assert_eq!(
        tail.stdout,
        "actor[1] | actor step 3\nactor[1] | torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n",
        "{tail:?}"
    );
}
