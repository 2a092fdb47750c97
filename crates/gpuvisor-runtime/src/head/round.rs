//! The head while the job runs: the nodes' messages merged into the run's record, control
//! requests answered for every node, lost and failed nodes noticed.

use std::process::Child;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use gpuvisor_supervisor::cluster::wire::{AgentMsg, HeadMsg};
use gpuvisor_supervisor::control::{self, PsRow, Request};
use gpuvisor_supervisor::events::Event;
use gpuvisor_supervisor::sample::Snapshot;
use nix::sys::signal::killpg;
use nix::unistd::Pid;
use serde_json::{json, Value};

use super::machine::{Action, Input as RoundInput, Node, Round, RoundEnd};
use super::merge::merge_samples;
use super::run::{Agent, Context, Input};
use crate::hint_line;

impl Context<'_> {
    /// Runs the round to its end: merges events, answers control requests, watches nodes.
    pub(super) fn supervise_round(
        &mut self,
        mut agents: Vec<Agent>,
        inputs: &Sender<Input>,
        receiver: &Receiver<Input>,
        srun: &mut Child,
    ) -> RoundEnd {
        for (index, agent) in agents.iter_mut().enumerate() {
            let Some(mut from) = agent.receiver.take() else {
                continue;
            };
            let inputs = inputs.clone();
            let round = self.round;
            std::thread::spawn(move || loop {
                let message = from.recv::<AgentMsg>().ok().flatten();
                let end = message.is_none();
                if inputs
                    .send(Input::FromAgent(round, index, message))
                    .is_err()
                    || end
                {
                    return;
                }
            });
        }
        let nodes = agents
            .iter()
            .map(|agent| Node {
                name: agent.node.clone(),
                agent_pid: agent.pid,
            })
            .collect();
        let node_timeout = Duration::from_millis(self.job.cluster.node_timeout_ms);
        let mut machine = Round::new(Instant::now(), nodes, self.plans.clone(), node_timeout);
        while machine.running() {
            let input = match receiver.recv_timeout(Duration::from_millis(500)) {
                Ok(input) => Some(input),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let input = match input {
                None => RoundInput::Tick,
                // A round's late messages (a closed connection after its `done`) must not
                // count against the next round.
                Some(Input::FromAgent(round, _, _)) if round != self.round => RoundInput::Tick,
                Some(Input::FromAgent(_, index, message)) => RoundInput::Agent(index, message),
                Some(Input::Control((request, reply))) => {
                    let answer = self.control(
                        &request,
                        &mut agents,
                        machine.ps(),
                        machine.samples(),
                        machine.over(),
                    );
                    let _ = reply.send(answer);
                    match request {
                        Request::Stop { process: None } => RoundInput::StopAll,
                        _ => RoundInput::Tick,
                    }
                }
                Some(Input::Signal(signal)) => RoundInput::Signal(signal),
            };
            for action in machine.step(Instant::now(), input) {
                self.perform(action, &mut agents, srun);
            }
        }
        let _ = srun.try_wait();
        machine.finish()
    }

    /// Does what the round's state machine decided.
    fn perform(&mut self, action: Action, agents: &mut [Agent], srun: &Child) {
        match action {
            Action::Heartbeat(index) => {
                let _ = agents[index].sender.send(&HeadMsg::Heartbeat);
            }
            Action::Tell(index, request) => {
                let _ = agents[index].sender.send(&HeadMsg::Control { request });
            }
            Action::Append(line) => self.events.append_line(&line),
            Action::Record(event) => self.events.write(&event),
            Action::Say(line) => self.say(line),
            Action::WriteSample(sample) => {
                if let Some(writer) = self.sample_writer.as_mut() {
                    let _ = writer.append(&sample);
                }
            }
            // What `--metrics` serves.
            Action::Latest(sample) => {
                *self
                    .latest
                    .lock()
                    .unwrap_or_else(|poison| poison.into_inner()) = sample;
            }
            Action::SignalAgents(signal) => {
                let _ = killpg(Pid::from_raw(srun.id() as i32), signal);
            }
        }
    }

    /// Answers a control request for the whole job.
    pub(super) fn control(
        &self,
        request: &Request,
        agents: &mut [Agent],
        ps: &[Vec<PsRow>],
        samples: &[Option<Snapshot>],
        over: &[bool],
    ) -> Value {
        match request {
            Request::Ps => {
                let rows: Vec<&PsRow> = ps.iter().flatten().collect();
                json!({ "ok": true, "job": self.job.name, "replicas": rows, "nodes": self.nodes })
            }
            Request::Sample => {
                json!({ "ok": true, "sample": merge_samples(samples, &agents.iter().map(|agent| agent.node.clone()).collect::<Vec<_>>()) })
            }
            Request::Stop {
                process: Some(process),
            }
            | Request::Restart { process }
                if self.job.process(process).is_none() =>
            {
                control::error_reply(&hint_line(
                    format!("no process `{}` in job {}", process, self.job.name),
                    format!(
                        "processes are: {}",
                        self.job
                            .processes
                            .iter()
                            .map(|p| p.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ))
            }
            _ => {
                self.events.write(&Event::control(
                    serde_json::to_value(request).unwrap_or(Value::Null),
                    None,
                ));
                // Only the nodes that run the process get it (the others would refuse it).
                let hosts = |agent: &Agent, name: &str| {
                    self.plans.iter().any(|plan| {
                        plan.node.as_deref() == Some(agent.node.as_str())
                            && plan.replicas.iter().any(|replica| replica.process == name)
                    })
                };
                for (index, agent) in agents.iter_mut().enumerate() {
                    let wanted = match request {
                        Request::Stop {
                            process: Some(name),
                        }
                        | Request::Restart { process: name } => hosts(agent, name),
                        _ => true,
                    };
                    if wanted && !over[index] {
                        let _ = agent.sender.send(&HeadMsg::Control {
                            request: request.clone(),
                        });
                    }
                }
                json!({ "ok": true })
            }
        }
    }
}
