//! The head of a multi-node run while one round of agents runs, as plain data: what it makes
//! of each agent's message, of `gpuvisor stop`, of a signal and of time passing. The caller
//! ([`super::round`], the head's I/O) owns the sockets, the record and srun; it feeds
//! [`Round::step`] with `now` and one [`Input`] and performs the [`Action`]s it returns, so
//! node loss, node timeouts and the Ctrl-C escalation are tested with a made-up clock;
//! [`after_round`] is the `on_node_failure` policy between rounds.
//!
//! It must not do I/O: no sockets, files, signals nor clock reads of its own.

use std::time::{Duration, Instant};

use gpuvisor_core::plan::Plan;
use gpuvisor_core::spec::NodeFailurePolicy;
use gpuvisor_record::event::NodeDownKind;
use gpuvisor_supervisor::cluster::wire::AgentMsg;
use gpuvisor_supervisor::control::{PsRow, Request};
use gpuvisor_supervisor::events::Event;
use gpuvisor_supervisor::sample::Snapshot;
use gpuvisor_supervisor::supervisor::SummaryRow;
use nix::sys::signal::Signal;

use super::merge::{merge_samples, with_node, Gates};

/// A gap this long between two steps (the caller steps at least every 500 ms) means the head
/// itself was not running.
pub const HEAD_STALL: Duration = Duration::from_secs(2);

/// How often every running agent hears that its head is alive (`HeadMsg::Heartbeat`).
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// The least time between two merged records in `samples/`.
const RECORD_EVERY: Duration = Duration::from_millis(900);

/// What happened.
#[derive(Debug)]
pub enum Input {
    /// Nothing (a wait ran out, or a message of an earlier round): time passed.
    Tick,
    /// Agent `index` sent a message; `None`: its connection closed.
    Agent(usize, Option<AgentMsg>),
    /// `gpuvisor stop` for the whole job (already passed on to the agents by the caller, who
    /// answers control requests).
    StopAll,
    /// The head got a stop signal.
    Signal(Signal),
}

/// What the caller must do, in order.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// Send agent `index` a heartbeat.
    Heartbeat(usize),
    /// Send agent `index` a control request.
    Tell(usize, Request),
    /// Append an agent's event line (its node added) to the run's events.
    Append(String),
    /// Write the head's own event.
    Record(Event),
    /// Say a line on the head's console.
    Say(String),
    /// Append the nodes' merged sample to `samples/`.
    WriteSample(Snapshot),
    /// The nodes' latest samples merged, for `--metrics`.
    Latest(Option<Snapshot>),
    /// Signal srun's agents (the second and later Ctrl-C).
    SignalAgents(Signal),
}

/// How one round ended.
#[derive(Debug, Default)]
pub struct RoundEnd {
    /// Per node: its status and summary rows (a lost node's from its last `ps`).
    pub done: Vec<Option<(u8, Vec<SummaryRow>)>>,
    /// Nodes lost or failed, with why.
    pub failures: Vec<(String, String)>,
    /// A signal or `gpuvisor stop` ended it: its exit status.
    pub stopped_by: Option<u8>,
}

/// One agent's node as the head knows it.
#[derive(Debug, Clone)]
pub struct Node {
    /// Its name.
    pub name: String,
    /// Its agent's pid (on that node).
    pub agent_pid: u32,
}

/// One round of the job over every node.
#[derive(Debug)]
pub struct Round {
    nodes: Vec<Node>,
    plans: Vec<Plan>,
    node_timeout: Duration,
    last_seen: Vec<Instant>,
    ps: Vec<Vec<PsRow>>,
    samples: Vec<Option<Snapshot>>,
    end: RoundEnd,
    /// The node's agent is done, failed or lost: it hears nothing more.
    over: Vec<bool>,
    /// The node's agent went with the head's own Ctrl-C escalation.
    killed: Vec<bool>,
    stopping: bool,
    signals_seen: u32,
    last_record: Option<Instant>,
    gates: Gates,
    last_step: Instant,
    last_heartbeat: Instant,
}

impl Round {
    /// A round starting at `now` on `nodes` (in the order of their `plans`): a node silent
    /// for `node_timeout` is lost.
    pub fn new(now: Instant, nodes: Vec<Node>, plans: Vec<Plan>, node_timeout: Duration) -> Round {
        let count = nodes.len();
        Round {
            gates: Gates::new(&plans),
            nodes,
            plans,
            node_timeout,
            last_seen: vec![now; count],
            ps: vec![Vec::new(); count],
            samples: vec![None; count],
            end: RoundEnd {
                done: vec![None; count],
                failures: Vec::new(),
                stopped_by: None,
            },
            over: vec![false; count],
            killed: vec![false; count],
            stopping: false,
            signals_seen: 0,
            last_record: None,
            last_step: now,
            last_heartbeat: now,
        }
    }

    /// Whether some node's agent still runs.
    pub fn running(&self) -> bool {
        self.over.iter().any(|over| !over)
    }

    /// Each node's last `ps` rows.
    pub fn ps(&self) -> &[Vec<PsRow>] {
        &self.ps
    }

    /// Each node's last sample.
    pub fn samples(&self) -> &[Option<Snapshot>] {
        &self.samples
    }

    /// Which nodes' agents are over (they hear nothing more).
    pub fn over(&self) -> &[bool] {
        &self.over
    }

    /// Takes `input` at `now`; returns what to do.
    pub fn step(&mut self, now: Instant, input: Input) -> Vec<Action> {
        let mut actions = Vec::new();
        // Node index, why, event kind.
        let mut failed: Vec<(usize, String, NodeDownKind)> = Vec::new();
        match input {
            Input::Tick => {}
            Input::Agent(index, Some(message)) => {
                self.last_seen[index] = now;
                self.message(now, index, message, &mut actions, &mut failed);
            }
            Input::Agent(index, None) if !self.over[index] => {
                self.over[index] = true;
                let node = &self.nodes[index];
                failed.push((
                    index,
                    format!(
                        "its agent (pid {} on {}) is gone: the connection to it closed",
                        node.agent_pid, node.name
                    ),
                    NodeDownKind::Lost,
                ));
            }
            Input::Agent(_, None) => {}
            Input::StopAll => {
                self.stopping = true;
                self.end.stopped_by.get_or_insert(0);
            }
            // A hang-up after the first signal (the kernel's and the --tui view's for one
            // lost terminal) does not escalate.
            Input::Signal(Signal::SIGHUP) if self.signals_seen > 0 => {}
            Input::Signal(signal) => self.signal(signal, &mut actions),
        }
        // A head that did not run for a while (Ctrl-Z, a stalled machine) heard nothing
        // meanwhile, whatever the nodes sent: their silence is no evidence, and their queued
        // words are still to be read. Every node gets a fresh node_timeout.
        if now.saturating_duration_since(self.last_step) > HEAD_STALL {
            self.last_seen.iter_mut().for_each(|seen| *seen = now);
        }
        self.last_step = now;
        // A node silent for too long is lost (a crashed or partitioned machine may never
        // close its connection).
        for index in 0..self.nodes.len() {
            let silent = now.saturating_duration_since(self.last_seen[index]);
            if !self.over[index] && silent > self.node_timeout {
                self.over[index] = true;
                failed.push((
                    index,
                    format!(
                        "no word from its agent for {:.0} s ([cluster] node_timeout)",
                        self.node_timeout.as_secs_f64()
                    ),
                    NodeDownKind::Lost,
                ));
            }
        }
        for (index, why, kind) in failed {
            self.node_failed(index, why, kind, &mut actions);
        }
        // The agents' proof that their head is alive.
        if now.saturating_duration_since(self.last_heartbeat) >= HEARTBEAT_EVERY {
            self.last_heartbeat = now;
            let running = (0..self.nodes.len()).filter(|&index| !self.over[index]);
            actions.extend(running.map(Action::Heartbeat));
        }
        actions
    }

    /// The round's end: a node that never reported its end has its replicas' rows from its
    /// last `ps` (or its plan), ended with it.
    pub fn finish(mut self) -> RoundEnd {
        for (index, rows) in std::mem::take(&mut self.ps).into_iter().enumerate() {
            if self.end.done[index].is_some() {
                continue;
            }
            let node = &self.nodes[index].name;
            let cause = match self.killed[index] {
                true => format!("killed with node {node}'s agent"),
                false => format!("lost with node {node}"),
            };
            let rows = lost_rows(rows, self.plans.get(index), &cause);
            // Killed by the head's own Ctrl-C escalation: the stop's status, not a fault.
            let status = match self.end.stopped_by {
                Some(status) if self.killed[index] => status,
                _ => 1,
            };
            self.end.done[index] = Some((status, rows));
        }
        self.end
    }

    fn message(
        &mut self,
        now: Instant,
        index: usize,
        message: AgentMsg,
        actions: &mut Vec<Action>,
        failed: &mut Vec<(usize, String, NodeDownKind)>,
    ) {
        match message {
            AgentMsg::Event { line } => {
                actions.push(Action::Append(with_node(&line, &self.nodes[index].name)));
                if let Some((process, ready)) = self.gates.observe(&line) {
                    self.tell_running(Request::Gate { process, ready }, actions);
                }
            }
            AgentMsg::Ps { mut rows } => {
                for row in &mut rows {
                    row.node = Some(self.nodes[index].name.clone());
                }
                self.ps[index] = rows;
            }
            AgentMsg::Sample { sample } => {
                self.samples[index] = serde_json::from_value(sample).ok();
                let names: Vec<String> = self.nodes.iter().map(|node| node.name.clone()).collect();
                let merged = merge_samples(&self.samples, &names);
                // One merged record per second, with every node in it (the rows of samples/
                // are fixed by its first record).
                let due = self
                    .last_record
                    .is_none_or(|last| now.saturating_duration_since(last) >= RECORD_EVERY);
                if due && self.samples.iter().all(Option::is_some) {
                    self.last_record = Some(now);
                    if let Some(merged) = &merged {
                        actions.push(Action::WriteSample(merged.clone()));
                    }
                }
                actions.push(Action::Latest(merged));
            }
            AgentMsg::Done { status, rows } => {
                self.end.done[index] = Some((status, rows));
                self.over[index] = true;
                if status == 1 {
                    let why = "its processes failed (see its events)".to_string();
                    failed.push((index, why, NodeDownKind::Failed));
                }
            }
            AgentMsg::Failed { message, .. } => {
                self.over[index] = true;
                failed.push((index, message, NodeDownKind::Failed));
            }
            _ => {}
        }
    }

    fn signal(&mut self, signal: Signal, actions: &mut Vec<Action>) {
        self.signals_seen += 1;
        self.stopping = true;
        self.end.stopped_by.get_or_insert(128 + signal as i32 as u8);
        actions.push(Action::Record(Event::signal_only(signal.as_str())));
        match self.signals_seen {
            1 => self.tell_running(Request::Stop { process: None }, actions),
            2 => {
                actions.push(Action::Say(
                    "gpuvisor: stopping the agents now (again to kill them)".into(),
                ));
                actions.push(Action::SignalAgents(Signal::SIGTERM));
            }
            _ => actions.push(Action::SignalAgents(Signal::SIGKILL)),
        }
    }

    fn node_failed(
        &mut self,
        index: usize,
        why: String,
        kind: NodeDownKind,
        actions: &mut Vec<Action>,
    ) {
        let node = self.nodes[index].name.clone();
        // From the second Ctrl-C on, the head itself signals srun's agents: their connections
        // closing is the stop asked for, not a lost node.
        if kind == NodeDownKind::Lost && self.signals_seen >= 2 {
            self.killed[index] = true;
            return;
        }
        actions.push(Action::Record(kind.event(node.clone(), why.clone())));
        if !self.stopping {
            actions.push(Action::Say(format!(
                "gpuvisor: node {node}: {why}; stopping the other nodes"
            )));
        }
        self.end.failures.push((node, why));
        if !self.stopping {
            self.stopping = true;
            self.tell_running(Request::Stop { process: None }, actions);
        }
    }

    /// `request` for every node whose agent still runs.
    fn tell_running(&self, request: Request, actions: &mut Vec<Action>) {
        for index in (0..self.nodes.len()).filter(|&index| !self.over[index]) {
            actions.push(Action::Tell(index, request.clone()));
        }
    }
}

/// What the head does once a round ended.
#[derive(Debug, PartialEq, Eq)]
pub enum AfterRound {
    /// Start the whole job again on every node as round `round`, because of `reason` (each
    /// lost or failed node with why; empty when a node's processes failed).
    Restart {
        /// The next round's number (1 after the first restart).
        round: u32,
        /// Why, node by node.
        reason: String,
    },
    /// The job is over with this exit status.
    End(u8),
}

/// The `[cluster] on_node_failure` policy after round `round` ended as `end`: a lost or failed
/// node restarts the job when the policy says so, it was not stopped, and restarts are left;
/// otherwise the job ends (1 for a failure, a stop's status, else the nodes' worst).
pub fn after_round(
    end: &RoundEnd,
    policy: NodeFailurePolicy,
    round: u32,
    node_restarts: u32,
) -> AfterRound {
    let failed =
        !end.failures.is_empty() || end.done.iter().flatten().any(|(status, _)| *status == 1);
    if policy == NodeFailurePolicy::Restart
        && end.stopped_by.is_none()
        && failed
        && round < node_restarts
    {
        let reason = end
            .failures
            .iter()
            .map(|(node, why)| format!("{node}: {why}"))
            .collect::<Vec<_>>()
            .join("; ");
        return AfterRound::Restart {
            round: round + 1,
            reason,
        };
    }
    AfterRound::End(match (failed, end.stopped_by) {
        (true, _) => 1,
        (false, Some(status)) => status,
        (false, None) => end
            .done
            .iter()
            .flatten()
            .map(|(status, _)| *status)
            .max()
            .unwrap_or(0),
    })
}

/// The summary rows of a node that never reported its end: from its last `ps`, or from its
/// plan when it went before its first `ps` (its replicas must not vanish from the summary).
pub fn lost_rows(ps: Vec<PsRow>, plan: Option<&Plan>, cause: &str) -> Vec<SummaryRow> {
    if ps.is_empty() {
        return plan
            .map(|plan| {
                plan.replicas
                    .iter()
                    .map(|replica| SummaryRow {
                        label: replica.label(),
                        restarts: 0,
                        cause: cause.to_string(),
                        gpu_peak_bytes: None,
                        budget_bytes: replica.budget_bytes,
                        run_ms: 0,
                        seen: Default::default(),
                        wait_ms: None,
                    })
                    .collect()
            })
            .unwrap_or_default();
    }
    ps.into_iter()
        .map(|row| SummaryRow {
            label: row.label,
            restarts: row.restarts,
            cause: cause.to_string(),
            gpu_peak_bytes: row.gpu_peak_bytes,
            budget_bytes: row.budget_bytes,
            run_ms: row.uptime_ms.unwrap_or(0),
            seen: Default::default(),
            wait_ms: None,
        })
        .collect()
}

#[cfg(test)]
mod tests;
