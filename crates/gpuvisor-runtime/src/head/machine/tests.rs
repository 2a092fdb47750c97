//! The head's round with a made-up clock: lost and silent nodes, a stalled head, failed
//! nodes, the Ctrl-C escalation and the heartbeats.

use super::*;
use gpuvisor_core::cluster::NodeLayout;
use gpuvisor_core::inventory::simulate;
use gpuvisor_core::plan::plan_node;
use gpuvisor_core::spec::parse_job;
use std::path::Path;

const TIMEOUT: Duration = Duration::from_secs(10);

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Two nodes, n1 and n2, two actors each.
fn round(start: Instant) -> Round {
    let job = parse_job(
        Path::new("job.toml"),
        "[process.actor]\ncommand=[\"a\"]\nreplicas=2\nmemory=\"1GiB\"\n",
    )
    .unwrap();
    let names = vec!["n1".to_string(), "n2".to_string()];
    let plans = (0..2)
        .map(|index| {
            let layout = NodeLayout {
                names: names.clone(),
                index,
            };
            plan_node(&job, &simulate("1x24GiB").unwrap(), &layout).unwrap()
        })
        .collect();
    let nodes = names
        .into_iter()
        .enumerate()
        .map(|(index, name)| Node {
            name,
            agent_pid: 100 + index as u32,
        })
        .collect();
    Round::new(start, nodes, plans, TIMEOUT)
}

fn done(status: u8) -> Input {
    Input::Agent(
        0,
        Some(AgentMsg::Done {
            status,
            rows: Vec::new(),
        }),
    )
}

fn recorded(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::Record(event) => Some(event.kind().to_string()),
            _ => None,
        })
        .collect()
}

fn told(actions: &[Action]) -> Vec<(usize, Request)> {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::Tell(index, request) => Some((*index, request.clone())),
            _ => None,
        })
        .collect()
}

fn stop_all() -> Request {
    Request::Stop { process: None }
}

#[test]
fn a_silent_node_is_lost_after_node_timeout_and_the_others_are_stopped() {
    let t0 = Instant::now();
    let mut round = round(t0);
    // n1 speaks every second; n2 never does. Steps every half second, as the head's loop.
    let mut lost_at = None;
    for half in 1..=30 {
        let now = t0 + secs(half as f64 / 2.0);
        let input = match half % 2 {
            0 => Input::Agent(0, Some(AgentMsg::Ps { rows: Vec::new() })),
            _ => Input::Tick,
        };
        let actions = round.step(now, input);
        if recorded(&actions) == ["node-lost"] {
            assert_eq!(told(&actions), [(0, stop_all())], "n1 is stopped");
            assert!(actions.iter().any(
                |action| matches!(action, Action::Say(line) if line.contains("node n2: no word"))
            ));
            lost_at = Some(now - t0);
            break;
        }
        assert!(recorded(&actions).is_empty(), "{half}: {actions:?}");
    }
    assert_eq!(
        lost_at,
        Some(secs(10.5)),
        "lost at the first step past 10 s"
    );
    assert_eq!(round.over(), [false, true]);
    assert!(round.running(), "n1 still ends its processes");
    round.step(t0 + secs(11.0), done(0));
    assert!(!round.running());
    let end = round.finish();
    assert_eq!(end.failures.len(), 1);
    assert_eq!(end.failures[0].0, "n2");
    let (status, rows) = end.done[1].clone().unwrap();
    assert_eq!(status, 1);
    let labels: Vec<&str> = rows.iter().map(|row| row.label.as_str()).collect();
    assert_eq!(
        labels,
        ["actor[2]", "actor[3]"],
        "its replicas stay in the summary"
    );
    assert!(rows.iter().all(|row| row.cause == "lost with node n2"));
}

#[test]
fn a_head_that_did_not_run_gives_every_node_a_fresh_timeout() {
    let t0 = Instant::now();
    let mut round = round(t0);
    // Ctrl-Z for a minute: the nodes' silence meanwhile is no evidence.
    let actions = round.step(t0 + secs(60.0), Input::Tick);
    assert!(recorded(&actions).is_empty(), "{actions:?}");
    // Still silent a full node_timeout after the head woke (its loop turning again): lost.
    let mut lost = Vec::new();
    for half in 121..=141 {
        let now = t0 + secs(half as f64 / 2.0);
        let kinds = recorded(&round.step(now, Input::Tick));
        if !kinds.is_empty() {
            assert_eq!(now - t0, secs(70.5), "{kinds:?}");
        }
        lost.extend(kinds);
    }
    assert_eq!(lost, ["node-lost", "node-lost"]);
}

#[test]
fn a_closed_connection_is_a_lost_node_and_a_failed_node_stops_the_job() {
    let t0 = Instant::now();
    let mut round = round(t0);
    let actions = round.step(t0 + secs(0.5), Input::Agent(1, None));
    assert_eq!(recorded(&actions), ["node-lost"]);
    assert_eq!(told(&actions), [(0, stop_all())]);
    // Once stopping, a second failure is recorded but says and stops nothing more.
    let actions = round.step(t0 + secs(1.0), done(1));
    assert_eq!(recorded(&actions), ["node-failed"]);
    assert!(told(&actions).is_empty());
    assert!(!actions
        .iter()
        .any(|action| matches!(action, Action::Say(_))));
    let end = round.finish();
    assert_eq!(end.failures.len(), 2);
    assert_eq!(end.stopped_by, None);
}

#[test]
fn ctrl_c_stops_then_terminates_then_kills_and_agents_killed_so_are_not_lost() {
    let t0 = Instant::now();
    let mut round = round(t0);
    let first = round.step(t0, Input::Signal(Signal::SIGINT));
    assert_eq!(recorded(&first), ["signal"]);
    assert_eq!(told(&first), [(0, stop_all()), (1, stop_all())]);
    // The terminal's hang-up after a Ctrl-C does not escalate.
    assert!(round.step(t0, Input::Signal(Signal::SIGHUP)).is_empty());
    let second = round.step(t0, Input::Signal(Signal::SIGINT));
    assert!(second.contains(&Action::SignalAgents(Signal::SIGTERM)));
    let third = round.step(t0, Input::Signal(Signal::SIGINT));
    assert!(third.contains(&Action::SignalAgents(Signal::SIGKILL)));
    // Their connections close: the stop asked for, not a lost node.
    assert!(recorded(&round.step(t0, Input::Agent(0, None))).is_empty());
    assert!(recorded(&round.step(t0, Input::Agent(1, None))).is_empty());
    let end = round.finish();
    assert!(end.failures.is_empty());
    assert_eq!(end.stopped_by, Some(130));
    let (status, rows) = end.done[0].clone().unwrap();
    assert_eq!(status, 130, "the stop's status, not a fault");
    assert!(rows[0].cause.starts_with("killed with node n1"));
}

#[test]
fn running_agents_hear_a_heartbeat_every_second() {
    let t0 = Instant::now();
    let mut round = round(t0);
    let beats = |actions: &[Action]| {
        actions
            .iter()
            .filter(|action| matches!(action, Action::Heartbeat(_)))
            .count()
    };
    assert_eq!(beats(&round.step(t0 + secs(0.5), Input::Tick)), 0);
    assert_eq!(beats(&round.step(t0 + secs(1.0), done(0))), 1, "n2 only");
    assert_eq!(beats(&round.step(t0 + secs(1.5), Input::Tick)), 0);
    assert_eq!(beats(&round.step(t0 + secs(2.0), Input::Tick)), 1);
}

#[test]
fn a_lost_node_restarts_the_job_while_restarts_are_left_and_a_stop_never_does() {
    let lost = RoundEnd {
        done: vec![Some((0, Vec::new())), Some((1, Vec::new()))],
        failures: vec![("n2".to_string(), "the connection closed".to_string())],
        stopped_by: None,
    };
    assert_eq!(
        after_round(&lost, NodeFailurePolicy::Restart, 0, 3),
        AfterRound::Restart {
            round: 1,
            reason: "n2: the connection closed".to_string()
        }
    );
    assert_eq!(
        after_round(&lost, NodeFailurePolicy::Restart, 3, 3),
        AfterRound::End(1),
        "no restarts left"
    );
    assert_eq!(
        after_round(&lost, NodeFailurePolicy::Stop, 0, 3),
        AfterRound::End(1)
    );
    let stopped = RoundEnd {
        stopped_by: Some(130),
        failures: Vec::new(),
        done: vec![Some((130, Vec::new())), Some((0, Vec::new()))],
    };
    assert_eq!(
        after_round(&stopped, NodeFailurePolicy::Restart, 0, 3),
        AfterRound::End(130)
    );
    let clean = RoundEnd {
        done: vec![Some((0, Vec::new())), Some((3, Vec::new()))],
        ..RoundEnd::default()
    };
    assert_eq!(
        after_round(&clean, NodeFailurePolicy::Restart, 0, 3),
        AfterRound::End(3),
        "the nodes' worst status"
    );
}
