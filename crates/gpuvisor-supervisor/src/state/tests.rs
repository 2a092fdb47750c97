//! State-machine tests with fake children: every input is made up, no process runs.

use super::*;
use gpuvisor_core::spec::RestartSpec;

fn member(process: &str, after: &[&str]) -> Member {
    Member {
        process: process.to_string(),
        label: process.to_string(),
        after: after.iter().map(|name| name.to_string()).collect(),
        restart: RestartSpec::default(),
        grace_ms: 1000,
        ready_when_started: true,
        ready_when_exited: false,
        room: Room::Free,
    }
}

/// A `worker` restarted by `policy` up to 10 times, backing off from `initial_ms` to `max_ms`.
fn backing_off(policy: RestartPolicy, initial_ms: u64, max_ms: u64) -> Member {
    let mut worker = member("worker", &[]);
    worker.restart = RestartSpec {
        policy,
        max_restarts: 10,
        window_ms: 1_000_000,
        backoff_initial_ms: initial_ms,
        backoff_max_ms: max_ms,
        ..RestartSpec::default()
    };
    worker
}

fn spawns(actions: &[Action]) -> Vec<usize> {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::Spawn(index) => Some(*index),
            _ => None,
        })
        .collect()
}

fn kinds(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::Event { event, .. } => Some(event.kind().to_string()),
            _ => None,
        })
        .collect()
}

fn exit(index: usize, success: bool) -> Input {
    Input::Exited {
        index,
        success,
        cause: if success { "exit 0" } else { "exit 1" }.into(),
    }
}

#[test]
fn dependants_start_only_after_their_dependencies_are_ready() {
    let mut learner = member("learner", &[]);
    learner.ready_when_started = false; // e.g. waits for a log line
    let mut machine = Machine::new(vec![learner, member("actor", &["learner"])], 7);
    assert_eq!(spawns(&machine.step(0, Input::Tick)), vec![0]);
    assert_eq!(
        spawns(&machine.step(1, Input::Spawned(0))),
        Vec::<usize>::new()
    );
    let actions = machine.step(2, Input::Ready(0));
    assert_eq!(kinds(&actions), vec!["ready"]);
    assert_eq!(spawns(&actions), vec![1]);
}

#[test]
fn an_exit_readiness_waits_for_a_successful_exit() {
    let mut setup = member("setup", &[]);
    setup.ready_when_started = false;
    setup.ready_when_exited = true;
    let mut machine = Machine::new(vec![setup, member("main", &["setup"])], 7);
    machine.step(0, Input::Tick);
    assert!(spawns(&machine.step(1, Input::Spawned(0))).is_empty());
    let actions = machine.step(2, exit(0, true));
    assert_eq!(spawns(&actions), vec![1]);
    assert_eq!(machine.slots()[0].phase, Phase::Done { success: true });
}

#[test]
fn restarts_back_off_exponentially_with_a_cap() {
    let worker = backing_off(RestartPolicy::OnFailure, 100, 500);
    let mut machine = Machine::new(vec![worker], 42);
    machine.step(0, Input::Tick);
    let mut now = 0;
    let mut delays = Vec::new();
    for _ in 0..5 {
        machine.step(now, Input::Spawned(0));
        let actions = machine.step(now, exit(0, false));
        let delay = actions
            .iter()
            .find_map(|action| match action {
                Action::Event { event, .. } if event.kind() == "restart" => {
                    event.fields()["delay_ms"].as_u64()
                }
                _ => None,
            })
            .expect("a restart event");
        delays.push(delay);
        // Nothing starts before the delay is over...
        assert!(spawns(&machine.step(now + delay - 1, Input::Tick)).is_empty());
        assert_eq!(machine.next_deadline(), Some(now + delay));
        // ...and it starts when it is.
        now += delay;
        assert_eq!(spawns(&machine.step(now, Input::Tick)), vec![0]);
    }
    // 100, 200, 400, then capped at 500, each within ±20% jitter (and never above the cap).
    for (delay, base) in delays.iter().zip([100u64, 200, 400, 500, 500]) {
        assert!(
            *delay >= base * 8 / 10 && *delay <= (base * 12 / 10).min(500),
            "{delays:?}"
        );
    }
    assert_eq!(machine.slots()[0].restarts, 5);
}

#[test]
fn a_success_is_not_restarted_on_failure_but_is_with_always() {
    for (policy, restarted) in [
        (RestartPolicy::OnFailure, false),
        (RestartPolicy::Always, true),
    ] {
        let mut worker = member("worker", &[]);
        worker.restart.policy = policy;
        let mut machine = Machine::new(vec![worker, member("other", &[])], 1);
        machine.step(0, Input::Tick);
        machine.step(0, Input::Spawned(0));
        machine.step(0, Input::Spawned(1));
        let actions = machine.step(10, exit(0, true));
        assert_eq!(
            kinds(&actions).contains(&"restart".to_string()),
            restarted,
            "{policy:?}"
        );
    }
}

#[test]
fn a_crash_loop_is_given_up_and_ends_the_job() {
    let mut worker = member("worker", &[]);
    worker.restart = RestartSpec {
        policy: RestartPolicy::Always,
        max_restarts: 2,
        window_ms: 10_000,
        backoff_initial_ms: 10,
        backoff_max_ms: 10,
        ..RestartSpec::default()
    };
    let mut machine = Machine::new(vec![worker], 3);
    machine.step(0, Input::Tick);
    let mut now = 0;
    let mut all = Vec::new();
    for _ in 0..3 {
        machine.step(now, Input::Spawned(0));
        all.extend(machine.step(now + 1, exit(0, false)));
        // Past the shortest restart delay (MIN_RESTART_DELAY_MS).
        now += 200;
        machine.step(now, Input::Tick);
    }
    let kinds = kinds(&all);
    assert_eq!(kinds.iter().filter(|kind| *kind == "restart").count(), 2);
    assert!(kinds.contains(&"crash-loop".to_string()), "{kinds:?}");
    assert!(all.contains(&Action::Finish(1)), "{all:?}");
    assert_eq!(machine.slots()[0].phase, Phase::Failed);
}

#[test]
fn a_zero_backoff_waits_the_shortest_restart_delay() {
    let mut worker = member("worker", &[]);
    worker.restart = RestartSpec {
        policy: RestartPolicy::Always,
        max_restarts: 1_000,
        backoff_initial_ms: 0,
        backoff_max_ms: 0,
        ..RestartSpec::default()
    };
    let mut machine = Machine::new(vec![worker], 3);
    machine.step(0, Input::Tick);
    machine.step(0, Input::Spawned(0));
    let actions = machine.step(1, exit(0, false));
    let delay = actions.iter().find_map(|action| match action {
        Action::Event { event, .. } if event.kind() == "restart" => {
            event.fields()["delay_ms"].as_u64()
        }
        _ => None,
    });
    assert_eq!(delay, Some(super::MIN_RESTART_DELAY_MS));
    assert!(
        !machine.step(50, Input::Tick).contains(&Action::Spawn(0)),
        "not before the shortest delay"
    );
    assert!(machine.step(101, Input::Tick).contains(&Action::Spawn(0)));
}

#[test]
fn restarts_outside_the_window_do_not_count_towards_a_crash_loop() {
    let mut worker = member("worker", &[]);
    worker.restart = RestartSpec {
        policy: RestartPolicy::Always,
        max_restarts: 1,
        window_ms: 1000,
        backoff_initial_ms: 10,
        backoff_max_ms: 10,
        ..RestartSpec::default()
    };
    let mut machine = Machine::new(vec![worker], 3);
    machine.step(0, Input::Tick);
    for round in 0..4u64 {
        let now = round * 5000;
        machine.step(now, Input::Spawned(0));
        let actions = machine.step(now + 1, exit(0, false));
        assert!(
            kinds(&actions).contains(&"restart".to_string()),
            "round {round}"
        );
        machine.step(now + 100, Input::Tick);
    }
}

#[test]
fn a_group_restart_stops_dependants_and_starts_them_after_the_leader_is_ready() {
    let mut learner = member("learner", &[]);
    learner.restart = RestartSpec {
        policy: RestartPolicy::OnFailure,
        restart_dependents: true,
        backoff_initial_ms: 50,
        backoff_max_ms: 50,
        ..RestartSpec::default()
    };
    let actors = (0..2).map(|replica| {
        let mut actor = member("actor", &["learner"]);
        actor.label = format!("actor[{replica}]");
        actor
    });
    let sidecar = member("sidecar", &[]);
    let mut members = vec![learner];
    members.extend(actors);
    members.push(sidecar);
    let mut machine = Machine::new(members, 9);
    machine.step(0, Input::Tick);
    machine.step(0, Input::Spawned(0));
    machine.step(0, Input::Spawned(3));
    let started = machine.step(1, Input::Tick);
    assert!(
        started.is_empty(),
        "actors were spawned with the learner's readiness: {started:?}"
    );
    machine.step(1, Input::Spawned(1));
    machine.step(1, Input::Spawned(2));
    // The learner dies: the actors are stopped, the sidecar is left alone.
    let actions = machine.step(100, exit(0, false));
    assert!(
        actions.contains(&Action::Stop(1)) && actions.contains(&Action::Stop(2)),
        "{actions:?}"
    );
    assert!(!actions.contains(&Action::Stop(3)));
    machine.step(110, exit(1, false));
    machine.step(110, exit(2, false));
    assert_eq!(machine.slots()[1].phase, Phase::Waiting);
    // The learner comes back after its backoff; then the actors follow.
    let actions = machine.step(200, Input::Tick);
    assert_eq!(spawns(&actions), vec![0]);
    let actions = machine.step(201, Input::Spawned(0));
    assert_eq!(spawns(&actions), vec![1, 2]);
    assert_eq!(machine.slots()[1].restarts, 1);
}

#[test]
fn a_failure_without_restart_stops_the_job_and_nothing_further_starts() {
    let mut machine = Machine::new(
        vec![member("a", &[]), member("b", &[]), member("c", &["a"])],
        5,
    );
    let actions = machine.step(0, Input::Tick);
    assert_eq!(spawns(&actions), vec![0, 1]);
    let actions = machine.step(1, Input::SpawnFailed(0, "command `nope` not found".into()));
    assert!(kinds(&actions).contains(&"failed".to_string()));
    assert!(spawns(&actions).is_empty(), "c must not start: {actions:?}");
    assert!(actions.contains(&Action::Stop(1)));
    assert_eq!(machine.slots()[2].phase, Phase::Stopped);
    let actions = machine.step(2, exit(1, false));
    assert!(actions.contains(&Action::Finish(1)), "{actions:?}");
}

#[test]
fn shutdown_goes_in_reverse_dependency_order_with_sigkill_after_grace() {
    let mut machine = Machine::new(
        vec![
            member("sim", &[]),
            member("learner", &["sim"]),
            member("actor", &["learner"]),
        ],
        5,
    );
    machine.step(0, Input::Tick);
    machine.step(0, Input::Spawned(0));
    machine.step(0, Input::Spawned(1));
    machine.step(0, Input::Spawned(2));
    let actions = machine.step(10, Input::Shutdown("SIGINT".into()));
    assert_eq!(
        actions
            .iter()
            .filter(|a| matches!(a, Action::Stop(_)))
            .collect::<Vec<_>>(),
        vec![&Action::Stop(2)]
    );
    // The actor ignores the signal: SIGKILL after its grace (1 s).
    assert!(!machine.step(500, Input::Tick).contains(&Action::Kill(2)));
    assert!(machine.step(1010, Input::Tick).contains(&Action::Kill(2)));
    let actions = machine.step(1020, exit(2, false));
    assert_eq!(actions, vec![Action::Stop(1)]);
    machine.step(1030, exit(1, true));
    let actions = machine.step(1040, exit(0, true));
    assert!(actions.contains(&Action::Finish(0)), "{actions:?}");
}

#[test]
fn a_second_interrupt_kills_everything_at_once() {
    let mut machine = Machine::new(vec![member("a", &[]), member("b", &["a"])], 5);
    machine.step(0, Input::Tick);
    machine.step(0, Input::Spawned(0));
    machine.step(0, Input::Spawned(1));
    machine.step(1, Input::Shutdown("SIGINT".into()));
    let actions = machine.step(2, Input::Escalate);
    assert!(
        actions.contains(&Action::Kill(0)) && actions.contains(&Action::Kill(1)),
        "{actions:?}"
    );
}

#[test]
fn stopping_and_restarting_one_process_leaves_the_others_running() {
    let mut machine = Machine::new(vec![member("a", &[]), member("b", &[])], 5);
    machine.step(0, Input::Tick);
    machine.step(0, Input::Spawned(0));
    machine.step(0, Input::Spawned(1));
    let actions = machine.step(1, Input::RestartProcess("a".into()));
    assert!(actions.contains(&Action::Stop(0)));
    let actions = machine.step(2, exit(0, false));
    assert_eq!(spawns(&actions), vec![0]);
    assert_eq!(machine.slots()[0].restarts, 1);
    machine.step(3, Input::Spawned(0));
    let actions = machine.step(4, Input::StopProcess("b".into()));
    assert!(actions.contains(&Action::Stop(1)));
    let actions = machine.step(5, exit(1, false));
    assert!(
        !kinds(&actions).contains(&"failed".to_string()),
        "a requested stop is no failure"
    );
    assert_eq!(machine.slots()[1].phase, Phase::Stopped);
    assert!(!machine.shutting_down());
}

#[test]
fn an_ends_job_process_ends_the_job_when_it_exits() {
    let mut main = member("main", &[]);
    main.restart.ends_job = true;
    let mut machine = Machine::new(vec![main, member("server", &[])], 5);
    machine.step(0, Input::Tick);
    machine.step(0, Input::Spawned(0));
    machine.step(0, Input::Spawned(1));
    let actions = machine.step(1, exit(0, true));
    assert!(actions.contains(&Action::Stop(1)), "{actions:?}");
    let actions = machine.step(2, exit(1, false));
    assert!(actions.contains(&Action::Finish(0)), "{actions:?}");
}

#[test]
fn dependants_of_a_process_that_ended_unready_are_blocked_and_the_job_fails() {
    let mut server = member("server", &[]);
    server.ready_when_started = false;
    let mut machine = Machine::new(vec![server, member("client", &["server"])], 5);
    machine.step(0, Input::Tick);
    machine.step(0, Input::Spawned(0));
    let actions = machine.step(1, exit(0, true));
    assert!(
        kinds(&actions).contains(&"blocked".to_string()),
        "{actions:?}"
    );
    assert!(actions.contains(&Action::Finish(1)), "{actions:?}");
}

#[test]
fn a_process_after_one_on_another_node_waits_for_its_gate() {
    // The learner runs on another node: the actor here waits until the head says it is ready.
    let mut machine = Machine::new(vec![member("actor", &["learner"]), member("sim", &[])], 7);
    assert_eq!(spawns(&machine.step(0, Input::Tick)), vec![1]);
    assert!(spawns(&machine.step(1, Input::Tick)).is_empty());
    let actions = machine.step(2, Input::Gate("learner".into(), true));
    assert_eq!(kinds(&actions), vec!["gate"]);
    assert_eq!(spawns(&actions), vec![0]);
    // A gate for a process this node does not wait for changes nothing.
    assert!(machine
        .step(3, Input::Gate("other".into(), true))
        .is_empty());
}

// A tick with nothing new and nothing due is answered without a pass over the replicas
// (`Machine::settled`): these check that what time alone makes due still happens.

#[test]
fn a_backoff_ends_on_time_after_many_idle_ticks() {
    let worker = backing_off(RestartPolicy::Always, 1000, 1000);
    let mut machine = Machine::new(vec![worker, member("other", &[])], 3);
    machine.step(0, Input::Tick);
    machine.step(0, Input::Spawned(0));
    machine.step(0, Input::Spawned(1));
    machine.step(10, exit(0, false));
    let Phase::Backoff { until } = machine.slots()[0].phase else {
        panic!("not backing off: {:?}", machine.slots()[0].phase);
    };
    assert_eq!(machine.next_deadline(), Some(until));
    for now in (11..until).step_by(7) {
        assert!(machine.step(now, Input::Tick).is_empty(), "at {now}");
    }
    assert_eq!(spawns(&machine.step(until, Input::Tick)), vec![0]);
    // Started again: no deadline left, and idle ticks stay idle.
    assert_eq!(machine.next_deadline(), None);
    assert!(machine.step(until + 1, Input::Tick).is_empty());
}

#[test]
fn a_grace_period_ends_in_sigkill_after_idle_ticks() {
    let mut machine = Machine::new(vec![member("worker", &[])], 3);
    machine.step(0, Input::Tick);
    machine.step(0, Input::Spawned(0));
    machine.step(0, Input::StopProcess("worker".into()));
    assert_eq!(machine.next_deadline(), Some(1000));
    for now in 1..1000 {
        assert!(!machine.step(now, Input::Tick).contains(&Action::Kill(0)));
    }
    assert!(machine.step(1000, Input::Tick).contains(&Action::Kill(0)));
    assert_eq!(machine.next_deadline(), None);
}

#[test]
fn a_chain_of_blocked_replicas_is_blocked_to_its_end_by_ticks() {
    // Listed so that one pass blocks only the first of the chain: each later pass blocks the
    // next, so the ticks after a pass that did something must not be skipped.
    let mut server = member("server", &[]);
    server.ready_when_started = false;
    let mut machine = Machine::new(
        vec![
            member("c", &["b"]),
            member("b", &["a"]),
            member("a", &["server"]),
            server,
        ],
        5,
    );
    machine.step(0, Input::Tick);
    machine.step(0, Input::Spawned(3));
    let mut blocked = kinds(&machine.step(1, exit(3, true)));
    let mut now = 2;
    while !machine.slots().iter().all(|slot| slot.phase.is_final()) && now < 10 {
        blocked.extend(kinds(&machine.step(now, Input::Tick)));
        now += 1;
    }
    assert_eq!(
        blocked.iter().filter(|kind| *kind == "blocked").count(),
        3,
        "{blocked:?}"
    );
    assert!(blocked.contains(&"job-end".to_string()), "{blocked:?}");
}

#[test]
fn an_added_replica_starts_at_the_next_tick() {
    let mut machine = Machine::new(vec![member("worker", &[])], 3);
    machine.step(0, Input::Tick);
    machine.step(0, Input::Spawned(0));
    assert!(machine.step(1, Input::Tick).is_empty());
    let index = machine.add(member("worker", &[]));
    assert_eq!(spawns(&machine.step(2, Input::Tick)), vec![index]);
}
