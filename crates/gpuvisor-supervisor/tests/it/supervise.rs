//! The supervisor with real processes: dependency order and readiness, restarts, group
//! restarts, stops, bad commands, clean-up, the control socket.

use crate::common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::*;
use gpuvisor_core::spec::{RestartPolicy, RestartSpec};
use gpuvisor_supervisor::control::{request, Request};
use gpuvisor_supervisor::supervisor::Readiness;
use regex::bytes::Regex;

#[test]
fn replicas_start_in_dependency_order_with_each_readiness_kind() {
    let _guard = exclusive();
    let (_dir, run) = run_dir();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut setup = shell("setup", "sleep 0.2; exit 0");
    setup.readiness = Readiness::Exit;
    let mut logger = shell("logger", "sleep 0.3; echo 'model loaded, ready'; sleep 2");
    logger.after = vec!["setup".into()];
    logger.readiness = Readiness::LogLine(Regex::new("ready$").unwrap());
    let mut server = shell(
        "server",
        &format!("exec python3 -c \"import socket,time; time.sleep(0.3); s=socket.socket(); s.bind(('127.0.0.1',{port})); s.listen(); time.sleep(2)\""),
    );
    server.after = vec!["logger".into()];
    server.readiness = Readiness::Port(port);
    let mut client = shell("client", "exit 0");
    client.after = vec!["server".into()];
    let (outcome, events) = run_job(vec![client, server, logger, setup], &run);
    assert_eq!(outcome.status, 0, "{events:#?}");
    let order = [
        position(&events, "start", "setup"),
        position(&events, "ready", "setup"),
        position(&events, "start", "logger"),
        position(&events, "ready", "logger"),
        position(&events, "start", "server"),
        position(&events, "ready", "server"),
        position(&events, "start", "client"),
    ];
    assert!(
        order.windows(2).all(|pair| pair[0] < pair[1]),
        "{order:?}\n{events:#?}"
    );
}

#[test]
fn a_failing_process_is_restarted_with_growing_delays_then_given_up_as_a_crash_loop() {
    let _guard = exclusive();
    let (_dir, run) = run_dir();
    let mut flaky = shell("flaky", "echo trying; exit 3");
    flaky.restart = RestartSpec {
        policy: RestartPolicy::OnFailure,
        max_restarts: 3,
        window_ms: 60_000,
        backoff_initial_ms: 100,
        backoff_max_ms: 10_000,
        ..RestartSpec::default()
    };
    let started = Instant::now();
    let (outcome, events) = run_job(vec![flaky], &run);
    assert_eq!(outcome.status, 1);
    let restarts = all(&events, "restart", "flaky");
    let delays: Vec<u64> = restarts
        .iter()
        .map(|event| event["delay_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(delays.len(), 3, "{events:#?}");
    assert!(
        delays[0] >= 80 && delays[0] <= 120 && delays[1] >= 160 && delays[2] >= 320,
        "{delays:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(delays.iter().sum()));
    assert_eq!(all(&events, "start", "flaky").len(), 4);
    let exits = all(&events, "exit", "flaky");
    assert_eq!(exits[0]["code"], 3);
    assert_eq!(exits[0]["summary"], "exit code 3");
    position(&events, "crash-loop", "flaky");
    assert_eq!(outcome.rows[0].restarts, 3);
}

#[test]
fn when_the_learner_dies_its_actors_restart_with_it() {
    let _guard = exclusive();
    let (dir, run) = run_dir();
    let died_once = marker(&dir, "died-once");
    let mut learner = shell(
        "learner",
        &format!(
            "if [ -e {0} ]; then sleep 1.5; exit 0; fi; touch {0}; sleep 0.4; exit 1",
            died_once.display()
        ),
    );
    learner.restart = RestartSpec {
        policy: RestartPolicy::OnFailure,
        restart_dependents: true,
        backoff_initial_ms: 50,
        backoff_max_ms: 50,
        ..RestartSpec::default()
    };
    let mut actors = Vec::new();
    for replica in 0..2 {
        let mut actor = shell("actor", "trap 'exit 0' INT; while :; do sleep 0.05; done");
        actor.replica = replica;
        actor.label = format!("actor[{replica}]");
        actor.file_stem = format!("actor.{replica}");
        actor.after = vec!["learner".into()];
        actor.grace_ms = 1000;
        actors.push(actor);
    }
    let mut specs = vec![learner];
    specs.extend(actors);
    // The learner's second life ends the job normally: stop the actors then.
    specs[0].restart.ends_job = true;
    let (outcome, events) = run_job(specs, &run);
    assert_eq!(outcome.status, 0, "{events:#?}");
    for actor in ["actor[0]", "actor[1]"] {
        assert_eq!(
            all(&events, "start", actor).len(),
            2,
            "{actor} starts twice: {events:#?}"
        );
        let group = all(&events, "restart", actor);
        assert_eq!(group[0]["reason"], "group: learner restarted");
    }
    // The actors' second start follows the learner's second start.
    let learner_starts: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, event)| event["kind"] == "start" && event["process"] == "learner")
        .map(|(index, _)| index)
        .collect();
    let actor_restart = events
        .iter()
        .enumerate()
        .filter(|(_, event)| event["kind"] == "start" && event["process"] == "actor[0]")
        .map(|(index, _)| index)
        .nth(1)
        .unwrap();
    assert!(actor_restart > learner_starts[1]);
}

#[test]
fn a_missing_command_fails_its_process_and_nothing_further_starts() {
    let _guard = exclusive();
    let (_dir, run) = run_dir();
    let mut missing = shell("missing", "");
    missing.launch.argv = vec!["/no/such/program".into()];
    let mut after = shell("after", "exit 0");
    after.after = vec!["missing".into()];
    let (outcome, events) = run_job(vec![missing, after], &run);
    assert_eq!(outcome.status, 1);
    let failed = &all(&events, "failed", "missing")[0];
    assert!(
        failed["reason"]
            .as_str()
            .unwrap()
            .contains("/no/such/program` does not exist"),
        "{failed:?}"
    );
    assert!(all(&events, "start", "after").is_empty());
    assert_eq!(outcome.rows[0].cause, "not started");
}

#[test]
fn a_replica_starts_with_no_signal_blocked() {
    // The keeper waits for signals with them blocked; a command that inherited that mask
    // would ignore every graceful stop until the SIGKILL.
    let _guard = exclusive();
    let (_dir, run) = run_dir();
    let probe = shell("probe", "grep '^SigBlk:' /proc/self/status");
    let (outcome, events) = run_job(vec![probe], &run);
    assert_eq!(outcome.status, 0, "{events:#?}");
    let log = std::fs::read_to_string(run.logs_path().join("probe.log")).unwrap();
    let lines = gpuvisor_record::log_file::parse(&log);
    assert!(
        lines
            .iter()
            .any(|line| !line.stderr && line.text == "SigBlk:\t0000000000000000"),
        "{log}"
    );
}

#[test]
fn the_loaders_variables_reach_the_command_but_not_its_keeper() {
    // The keeper needs no preloaded library: it gets the launch's LD_* variables under
    // another name and sets them for the command alone.
    let _guard = exclusive();
    let (_dir, run) = run_dir();
    let script = "echo \"command: $LD_LIBRARY_PATH\"; tr '\\0' '\\n' < /proc/$PPID/environ | grep LD_LIBRARY_PATH";
    let mut probe = shell("loader", script);
    probe
        .launch
        .env
        .push(("LD_LIBRARY_PATH".into(), Some("/gpuvisor-test-libs".into())));
    let (outcome, events) = run_job(vec![probe], &run);
    assert_eq!(outcome.status, 0, "{events:#?}");
    let log = std::fs::read_to_string(run.logs_path().join("loader.log")).unwrap();
    let stdout: Vec<String> = gpuvisor_record::log_file::parse(&log)
        .into_iter()
        .filter(|line| !line.stderr)
        .map(|line| line.text)
        .collect();
    assert!(
        stdout
            .iter()
            .any(|text| text == "command: /gpuvisor-test-libs"),
        "{log}"
    );
    assert!(
        stdout
            .iter()
            .any(|text| text == "GPUVISOR_KEEPER_LD_LIBRARY_PATH=/gpuvisor-test-libs"),
        "{log}"
    );
    assert!(
        !stdout
            .iter()
            .any(|text| text.starts_with("LD_LIBRARY_PATH=")),
        "{log}"
    );
}

#[test]
fn a_stop_is_graceful_in_reverse_order_and_forced_after_the_grace_period() {
    let _guard = exclusive();
    let (_dir, run) = run_dir();
    let polite = shell(
        "polite",
        "trap 'echo bye; exit 0' INT; while :; do sleep 0.05; done",
    );
    // Ignores SIGINT: gets SIGKILL after 300 ms.
    let mut stubborn = shell("stubborn", "trap '' INT; while :; do sleep 0.05; done");
    stubborn.after = vec!["polite".into()];
    stubborn.grace_ms = 300;
    let socket = run.socket_path();
    let stopper = std::thread::spawn(move || {
        wait_until(Duration::from_secs(10), "the control socket", || {
            socket.exists()
        });
        std::thread::sleep(Duration::from_millis(500));
        request(&socket, &Request::Stop { process: None }).unwrap()
    });
    let (outcome, events) = run_job(vec![polite, stubborn], &run);
    assert_eq!(stopper.join().unwrap()["ok"], true);
    assert_eq!(outcome.status, 0);
    let signals: Vec<(String, String)> = events
        .iter()
        .filter(|event| event["kind"] == "signal")
        .map(|event| {
            (
                event["process"].as_str().unwrap().to_string(),
                event["signal"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("stubborn", "SIGINT"),
        ("stubborn", "SIGKILL"),
        ("polite", "SIGINT"),
    ]
    .iter()
    .map(|(process, signal)| (process.to_string(), signal.to_string()))
    .collect();
    assert_eq!(signals, expected);
    assert_eq!(
        all(&events, "exit", "stubborn")[0]["summary"],
        "stopped (SIGKILL)"
    );
    assert_eq!(all(&events, "exit", "polite")[0]["code"], 0);
    let log = std::fs::read_to_string(run.logs_path().join("polite.log")).unwrap();
    let lines = gpuvisor_record::log_file::parse(&log);
    assert!(
        lines.iter().any(|line| !line.stderr && line.text == "bye"),
        "{log}"
    );
}

#[test]
fn the_control_socket_lists_restarts_and_stops_processes() {
    let _guard = exclusive();
    let (_dir, run) = run_dir();
    let worker = shell("worker", "while :; do sleep 0.05; done");
    let mut other = shell("other", "while :; do sleep 0.05; done");
    other.budget_bytes = 1 << 30;
    let socket = run.socket_path();
    let client = std::thread::spawn(move || {
        wait_until(Duration::from_secs(10), "the control socket", || {
            socket.exists()
        });
        let running = |reply: &serde_json::Value| {
            reply["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .all(|row| row["state"] == "running")
        };
        wait_until(Duration::from_secs(10), "every replica running", || {
            running(&request(&socket, &Request::Ps).unwrap())
        });
        let ps = request(&socket, &Request::Ps).unwrap();
        let unknown = request(
            &socket,
            &Request::Restart {
                process: "wrker".into(),
            },
        )
        .unwrap();
        let restarted = request(
            &socket,
            &Request::Restart {
                process: "worker".into(),
            },
        )
        .unwrap();
        wait_until(
            Duration::from_secs(10),
            "worker restarted and running",
            || {
                let reply = request(&socket, &Request::Ps).unwrap();
                reply["replicas"][0]["restarts"] == 1 && running(&reply)
            },
        );
        let stop_one = request(
            &socket,
            &Request::Stop {
                process: Some("worker".into()),
            },
        )
        .unwrap();
        wait_until(Duration::from_secs(10), "worker stopped", || {
            request(&socket, &Request::Ps).unwrap()["replicas"][0]["state"] == "stopped"
        });
        let still = request(&socket, &Request::Ps).unwrap();
        request(&socket, &Request::Stop { process: None }).unwrap();
        (ps, unknown, restarted, stop_one, still)
    });
    let (outcome, events) = run_job(vec![worker, other], &run);
    let (ps, unknown, restarted, stop_one, still) = client.join().unwrap();
    assert_eq!(outcome.status, 0);
    let rows = ps["replicas"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows[0]["pid"].as_i64().unwrap() > 0);
    assert_eq!(rows[1]["budget_bytes"], 1u64 << 30);
    assert!(rows[0]["uptime_ms"].as_u64().is_some());
    assert_eq!(unknown["ok"], false);
    assert!(unknown["error"]
        .as_str()
        .unwrap()
        .contains("hint: processes are: worker, other"));
    assert_eq!(restarted["ok"], true);
    assert_eq!(stop_one["ok"], true);
    assert_eq!(
        still["replicas"][1]["state"], "running",
        "stopping one process leaves the other"
    );
    assert_eq!(all(&events, "start", "worker").len(), 2);
    assert!(
        !run.socket_path().exists(),
        "the socket is removed at the end"
    );
}

#[test]
fn the_jobs_own_shared_memory_leftovers_are_removed_and_nothing_else() {
    let _guard = exclusive();
    let (_dir, run) = run_dir();
    let tag = format!("gvtest{}", std::process::id());
    let foreign = format!("/dev/shm/sem.mp-{tag}-foreign");
    std::fs::write(&foreign, b"x").unwrap();
    let torch = shell(
        "torch",
        &format!("echo x > /dev/shm/torch_$$_{tag}_0; sleep 0.6"),
    );
    let sem = shell(
        "sem",
        &format!("exec python3 -c \"import mmap,os,time; f=open('/dev/shm/sem.mp-{tag}-ours','w+b'); f.write(bytes(64)); f.flush(); m=mmap.mmap(f.fileno(),64); time.sleep(0.6); os._exit(0)\""),
    );
    let (outcome, events) = run_job(vec![torch, sem], &run);
    assert_eq!(outcome.status, 0, "{events:#?}");
    let clean = events
        .iter()
        .find(|event| event["kind"] == "clean-up" && event["what"] == "shared memory")
        .unwrap_or_else(|| panic!("no clean-up event: {events:#?}"));
    let removed: Vec<&str> = clean["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|file| file["path"].as_str().unwrap())
        .collect();
    assert_eq!(removed.len(), 2, "{removed:?}");
    assert!(removed
        .iter()
        .any(|path| path.ends_with(&format!("sem.mp-{tag}-ours"))));
    assert!(removed
        .iter()
        .any(|path| path.contains("/torch_") && path.ends_with(&format!("_{tag}_0"))));
    for path in removed {
        assert!(!std::path::Path::new(path).exists());
    }
    assert!(
        std::path::Path::new(&foreign).exists(),
        "another job's semaphore stays"
    );
    std::fs::remove_file(&foreign).unwrap();
}

#[test]
fn several_replicas_start_at_once_behind_their_keepers_with_results_in_order() {
    use gpuvisor_supervisor::spawn::{Launch, Spawner};
    use nix::sys::wait::{waitpid, WaitStatus};
    let _guard = exclusive();
    let spawner = Spawner::new(Some(
        vec![env!("CARGO_BIN_EXE_gpuvisor-test-keeper").into()],
    ));
    let launch = |argv: &[&str]| Launch {
        argv: argv.iter().map(|arg| arg.to_string()).collect(),
        env: Vec::new(),
        cwd: None,
        output: Default::default(),
    };
    let mut launches: Vec<Launch> = (0..6)
        .map(|code| launch(&["sh", "-c", &format!("exit {code}")]))
        .collect();
    launches.insert(2, launch(&["no-such-gpuvisor-command"]));
    let results = spawner.spawn_all(&launches);
    assert_eq!(results.len(), 7);
    let missing = results[2].as_ref().unwrap_err();
    assert!(
        missing.to_string().contains("not found in PATH"),
        "{missing}"
    );
    let codes: Vec<i32> = results
        .into_iter()
        .filter_map(Result::ok)
        .map(
            |started| match waitpid(nix::unistd::Pid::from_raw(started.pid), None).unwrap() {
                WaitStatus::Exited(_, code) => code,
                other => panic!("{other:?}"),
            },
        )
        .collect();
    // Each keeper exits as its command did: the order of the launches is kept.
    assert_eq!(codes, [0, 1, 2, 3, 4, 5]);
}
