//! The head's start-up: the agents connect (each hello on a thread of its own), plan their
//! nodes, and probe every coordinator; only then are they told to start.

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::process::Child;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use gpuvisor_core::cluster::NodeLayout;
use gpuvisor_core::inventory::Inventory;
use gpuvisor_core::plan::{merge_node_plans, plan_node};
use gpuvisor_supervisor::cluster::wire::{self, AgentMsg, HeadMsg, ProbeResult, ProbeTarget};
use gpuvisor_supervisor::control::{self, Request};
use gpuvisor_supervisor::events::Event;
use serde_json::{json, Value};

use super::run::{abort_all, let_go, unavailable, Agent, Context, Halt, Input};
use crate::{hint_line, RuntimeError};

impl Context<'_> {
    /// Agents connect, plan and pass the preflight; Ok: they are told to start.
    pub(super) fn start_round(
        &mut self,
        round: u32,
        token: &str,
        srun: &mut Child,
        inputs: &Receiver<Input>,
    ) -> Result<Vec<Agent>, Halt> {
        let timeout = Duration::from_millis(self.job.cluster.preflight_timeout_ms);
        let mut agents = self.accept_agents(token, srun, timeout, inputs)?;
        match self.plan_and_probe(round, &mut agents, timeout, inputs) {
            Ok(()) => Ok(agents),
            Err(halt) => {
                // The agents end quietly; the head says why, once.
                abort_all(&mut agents, "the job did not start");
                Err(halt)
            }
        }
    }

    /// The agents plan their nodes and probe the coordinators; Ok: they were told to start.
    pub(super) fn plan_and_probe(
        &mut self,
        round: u32,
        agents: &mut [Agent],
        timeout: Duration,
        inputs: &Receiver<Input>,
    ) -> Result<(), Halt> {
        // Plans.
        let record = gpuvisor_record::RunDir::at(self.run_path);
        for (index, agent) in agents.iter_mut().enumerate() {
            agent.sender.send(&HeadMsg::Assign {
                job_path: self.job_path.to_path_buf(),
                job_source: self.job_source.to_string(),
                nodes: self.nodes.to_vec(),
                index,
                record: record.node_path(&agent.node, round),
                logs: record.logs_path(),
                simulate: self.options.simulate.clone(),
                quiet: self.options.quiet,
            })?;
        }
        let mut plans = Vec::new();
        let mut ports: BTreeMap<String, (String, u16)> = BTreeMap::new();
        for agent in agents.iter_mut() {
            match self.recv_within(agent, timeout, inputs)? {
                AgentMsg::Planned {
                    inventory,
                    ports: held,
                } => {
                    let inventory: Inventory =
                        serde_json::from_value(inventory).map_err(|error| {
                            unavailable(format!(
                                "{}: its GPU list does not read: {error}",
                                agent.node
                            ))
                        })?;
                    let layout = NodeLayout {
                        names: self.nodes.to_vec(),
                        index: plans.len(),
                    };
                    // The agent planned the same job on the same GPUs already; this cannot
                    // fail unless the two disagree.
                    let plan = plan_node(self.job, &inventory, &layout).map_err(|error| {
                        unavailable(format!(
                            "{}: the head cannot plan the node the agent planned: {error}",
                            agent.node
                        ))
                    })?;
                    for (world, port) in held {
                        ports.insert(world, (agent.node.clone(), port));
                    }
                    plans.push(plan);
                }
                AgentMsg::Failed { message, bad_input } => {
                    let text = format!("node {} could not plan its share: {message}", agent.node);
                    abort_all(agents, &text);
                    return Err(Halt::Failed(if bad_input {
                        RuntimeError::Refused {
                            what: text,
                            hint: None,
                        }
                    } else {
                        unavailable(text)
                    }));
                }
                other => {
                    return Err(Halt::Failed(unavailable(format!(
                        "{}: unexpected message before its plan: {other:?}",
                        agent.node
                    ))))
                }
            }
        }
        if !self.plan_written {
            let merged = merge_node_plans(plans.clone());
            let json = serde_json::to_string_pretty(&merged)
                .map_err(|error| unavailable(error.to_string()))?;
            // Owner-only, as every plan.json (the record's writer).
            record.write_plan(&json)?;
            self.plan_written = true;
        }
        self.plans = plans;
        // Preflight: every node reaches every coordinator.
        let targets: Vec<ProbeTarget> = ports
            .iter()
            .map(|(world, (host, port))| ProbeTarget {
                world: world.clone(),
                host: host.clone(),
                port: *port,
            })
            .collect();
        let probe_ms = self.job.cluster.preflight_timeout_ms;
        for agent in agents.iter_mut() {
            agent.sender.send(&HeadMsg::Probe {
                targets: targets.clone(),
                timeout_ms: probe_ms,
            })?;
        }
        let mut results: Vec<(String, Vec<ProbeResult>)> = Vec::new();
        for agent in agents.iter_mut() {
            match self.recv_within(agent, timeout + Duration::from_secs(5), inputs)? {
                AgentMsg::Probed { results: probed } => results.push((agent.node.clone(), probed)),
                other => {
                    return Err(Halt::Failed(unavailable(format!(
                        "{}: unexpected message instead of its preflight results: {other:?}",
                        agent.node
                    ))))
                }
            }
        }
        if !targets.is_empty() && !self.viewed {
            self.console.preflight(&targets, &results);
        }
        let unreachable: Vec<Value> =
            results
                .iter()
                .flat_map(|(node, probed)| {
                    probed.iter().filter(|result| result.error.is_some()).map(move |result| {
                    json!({
                        "node": node,
                        "world": result.target.world,
                        "coordinator": format!("{}:{}", result.target.host, result.target.port),
                        "error": result.error,
                    })
                })
                })
                .collect();
        self.events.write(
            &{
                let preflight = gpuvisor_record::event::Preflight {
                    nodes: Some(self.nodes.to_vec()),
                    coordinators: Some(targets
                        .iter()
                        .map(|target| json!({"world": target.world, "host": target.host, "port": target.port}))
                        .collect()),
                    unreachable: Some(unreachable.clone()),
                    reason: None,
                };
                match unreachable.is_empty() {
                    true => Event::Preflight(preflight),
                    false => Event::PreflightFailed(preflight),
                }
            },
        );
        if !unreachable.is_empty() {
            let pairs: Vec<String> = unreachable
                .iter()
                .map(|pair| {
                    format!(
                        "  {} cannot reach {}'s coordinator at {}: {}",
                        pair["node"].as_str().unwrap_or("?"),
                        pair["world"].as_str().unwrap_or("?"),
                        pair["coordinator"].as_str().unwrap_or("?"),
                        pair["error"].as_str().unwrap_or("?")
                    )
                })
                .collect();
            let what = format!(
                "preflight failed: {} unreachable node-coordinator pair{}; nothing was started\n{}",
                pairs.len(),
                if pairs.len() == 1 { "" } else { "s" },
                pairs.join("\n")
            );
            abort_all(agents, "preflight failed");
            return Err(Halt::Failed(RuntimeError::Unavailable { what, hint: Some("the processes would hang at their first collective; check the routes and firewalls between these nodes (and NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME if the nodes have several networks)".to_string()) }));
        }
        let coordinators: BTreeMap<String, ProbeTarget> = targets
            .into_iter()
            .map(|target| (target.world.clone(), target))
            .collect();
        for agent in agents.iter_mut() {
            agent.sender.send(&HeadMsg::Start {
                coordinators: coordinators.clone(),
            })?;
        }
        Ok(())
    }

    /// Waits for one agent per node (within `timeout`), checking each one's token and node.
    pub(super) fn accept_agents(
        &self,
        token: &str,
        srun: &mut Child,
        timeout: Duration,
        inputs: &Receiver<Input>,
    ) -> Result<Vec<Agent>, Halt> {
        let deadline = Instant::now() + timeout;
        let mut by_node: BTreeMap<String, Agent> = BTreeMap::new();
        // Agents this round's token let in but no node of the step is waiting for.
        let mut refused: Vec<String> = Vec::new();
        let (hellos, greeted) = mpsc::channel::<Option<Agent>>();
        self.listener.set_nonblocking(true)?;
        loop {
            while let Ok(hello) = greeted.try_recv() {
                let Some(agent) = hello else { continue };
                if by_node.contains_key(&agent.node) {
                    refused.push(format!(
                        "a second agent for {} (pid {}) was refused",
                        agent.node, agent.pid
                    ));
                } else if !self.nodes.contains(&agent.node) {
                    refused.push(format!(
                        "an agent (pid {}) calls its node `{}`, which is not a node of this step (SLURMD_NODENAME, else the host name)",
                        agent.pid, agent.node
                    ));
                } else {
                    by_node.insert(agent.node.clone(), agent);
                }
            }
            if by_node.len() == self.nodes.len() {
                break;
            }
            if let Some(status) = self.interrupted(inputs) {
                let_go(&mut by_node);
                return Err(Halt::Stopped(status));
            }
            if let Some(status) = srun.try_wait()? {
                let_go(&mut by_node);
                let missing = self.missing(&by_node);
                return Err(Halt::Failed(self.preflight_failure(hint_line(
                    format!("srun ended ({status}) before the agents of {} connected; its error is above", missing.join(", ")),
                    format!("check that the allocation still holds these nodes (squeue, sinfo) and that {} exists on every node",
                    self.options.gpuvisor.display()),
                ))));
            }
            if Instant::now() >= deadline {
                let_go(&mut by_node);
                let missing = self.missing(&by_node);
                let pairs: Vec<String> = missing
                    .iter()
                    .map(|node| {
                        format!(
                            "  {node}: no agent reached the head at {} within {:.0} s",
                            self.head,
                            timeout.as_secs_f64()
                        )
                    })
                    .collect();
                let pairs: Vec<String> = pairs
                    .into_iter()
                    .chain(refused.iter().map(|why| format!("  {why}")))
                    .collect();
                return Err(Halt::Failed(self.preflight_failure(hint_line(
                    format!(
                        "preflight failed: {} of {} nodes never connected; nothing was started\n{}",
                        missing.len(),
                        self.nodes.len(),
                        pairs.join("\n"),
                    ),
                    format!("the nodes must reach this machine at {} (set GPUVISOR_HEAD_ADDRESS to pick another address); raise [cluster] preflight_timeout if srun is slow to start", self.head),
                ))));
            }
            match self.listener.accept() {
                Ok((stream, _)) => {
                    // Each connection says who it is on a thread of its own: a silent or
                    // slow stray connection must not hold up the agents behind it.
                    let hellos = hellos.clone();
                    let token = token.to_string();
                    std::thread::spawn(move || {
                        let _ = hellos.send(hello(stream, &token));
                    });
                }
                // Nothing pending; or a connection that failed before it was accepted (accept(2)
                // passes such network errors on): neither concerns the agents.
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        self.events.write(&Event::NodesJoined {
            agents: by_node
                .values()
                .map(|agent| json!({"node": agent.node, "pid": agent.pid}))
                .collect(),
        });
        // In the step's node order.
        Ok(self
            .nodes
            .iter()
            .filter_map(|node| by_node.remove(node))
            .collect())
    }

    /// Takes the signals and control requests that came during the start-up: a signal or a
    /// `stop` of the whole job ends it (Some: the exit status); the rest are answered, as
    /// nothing runs yet.
    pub(super) fn interrupted(&self, inputs: &Receiver<Input>) -> Option<u8> {
        while let Ok(input) = inputs.try_recv() {
            match input {
                Input::Signal(signal) => {
                    self.events.write(&Event::signal_only(signal.as_str()));
                    return Some(128 + signal as i32 as u8);
                }
                Input::Control((request, reply)) => {
                    let answer = match request {
                        Request::Stop { process: None } => {
                            self.events.write(&Event::control(
                                serde_json::to_value(&request).unwrap_or(Value::Null),
                                None,
                            ));
                            let _ = reply.send(json!({ "ok": true }));
                            return Some(0);
                        }
                        Request::Ps => json!({
                            "ok": true, "job": self.job.name, "replicas": [], "nodes": self.nodes
                        }),
                        Request::Sample => json!({ "ok": true, "sample": null }),
                        _ => control::error_reply(&hint_line(
                            format!("job {} is still in its preflight: nothing runs yet", self.job.name),
                            "retry once its processes have started, or `gpuvisor stop` the whole job",
                        )),
                    };
                    let _ = reply.send(answer);
                }
                // A previous round's late word; that round is over.
                Input::FromAgent(..) => {}
            }
        }
        None
    }

    /// The next message of one agent within `timeout`, or the start-up's end by a signal or
    /// `gpuvisor stop` (checked every 200 ms while it waits).
    pub(super) fn recv_within(
        &self,
        agent: &mut Agent,
        timeout: Duration,
        inputs: &Receiver<Input>,
    ) -> Result<AgentMsg, Halt> {
        let deadline = Instant::now() + timeout;
        let receiver = agent
            .receiver
            .as_mut()
            .expect("receivers are taken only when the round runs");
        let message = loop {
            if let Some(status) = self.interrupted(inputs) {
                return Err(Halt::Stopped(status));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            receiver.set_timeout(Some(
                left.clamp(Duration::from_millis(1), Duration::from_millis(200)),
            ))?;
            match receiver.recv::<AgentMsg>() {
                Err(error)
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) && !left.is_zero() => {}
                other => break other,
            }
        };
        receiver.set_timeout(None)?;
        match message {
            Ok(Some(message)) => Ok(message),
            Ok(None) => Err(Halt::Failed(unavailable(format!(
                "the agent on {} (pid {}) went away during start-up; its error is above",
                agent.node, agent.pid
            )))),
            Err(error) => Err(Halt::Failed(unavailable(format!(
                "the agent on {} did not answer within {:.0} s: {error}",
                agent.node,
                timeout.as_secs_f64()
            )))),
        }
    }

    pub(super) fn missing(&self, joined: &BTreeMap<String, Agent>) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|node| !joined.contains_key(*node))
            .cloned()
            .collect()
    }

    pub(super) fn preflight_failure(&self, text: String) -> RuntimeError {
        self.events
            .write(&Event::PreflightFailed(gpuvisor_record::event::Preflight {
                nodes: None,
                coordinators: None,
                unreachable: None,
                reason: Some(text.clone()),
            }));
        unavailable(text)
    }
}

/// Reads an agent's hello; None for a connection that is not one of this round's agents.
pub(super) fn hello(stream: TcpStream, token: &str) -> Option<Agent> {
    stream.set_nonblocking(false).ok()?;
    let (sender, mut receiver) = wire::split(stream).ok()?;
    receiver.set_timeout(Some(Duration::from_secs(5))).ok()?;
    match receiver.recv::<AgentMsg>() {
        Ok(Some(AgentMsg::Hello {
            token: given,
            node,
            pid,
        })) if given == token => {
            receiver.set_timeout(None).ok()?;
            Some(Agent {
                node,
                pid,
                sender,
                receiver: Some(receiver),
            })
        }
        _ => None,
    }
}
