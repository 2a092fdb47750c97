//! The head of a multi-node run: `gpuvisor run JOB` inside a Slurm allocation. It starts one
//! agent per node through srun, hands each the job, collects their plans, runs the preflight
//! (every node reaches every coordinator), and only then lets them start. While the job runs
//! it merges the nodes' events into the run's one `events.jsonl`, answers `ps`/`stop`/
//! `restart`/`sample` on the run's control socket for all nodes, and watches for lost nodes;
//! a lost or failed node stops the job or restarts it, as `[cluster] on_node_failure` says.

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use gpuvisor_core::cluster::NodeLayout;
use gpuvisor_core::inventory::Inventory;
use gpuvisor_core::plan::{merge_node_plans, plan_node, Plan};
use gpuvisor_core::spec::{JobSpec, NodeFailurePolicy};
use gpuvisor_supervisor::cluster::wire::{self, AgentMsg, HeadMsg, ProbeResult, ProbeTarget};
use gpuvisor_supervisor::control::{self, PsRow, Request};
use gpuvisor_supervisor::events::{Event, EventLog};
use gpuvisor_supervisor::rundir::RunDir;
use gpuvisor_supervisor::sample::Snapshot;
use gpuvisor_supervisor::samples::SampleWriter;
use gpuvisor_supervisor::supervisor::SummaryRow;
use nix::sys::signal::{kill, killpg, SigSet, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use super::slurm::{head_address, new_token, srun_command, Allocation};
use super::RunArgs;
use crate::failure::Failure;

/// One connected agent.
struct Agent {
    node: String,
    pid: u32,
    sender: wire::Sender,
    receiver: Option<wire::Receiver>,
}

/// What the head's loop waits for.
enum Input {
    /// Round, agent index, message (None: its connection closed). A round's late messages
    /// (a closed connection after its `done`) must not count against the next round.
    FromAgent(u32, usize, Option<AgentMsg>),
    Control(control::Incoming),
    Signal(Signal),
}

/// Why a round's start-up (connect, plan, preflight) ended before its processes started.
enum Halt {
    /// It failed: the error to print.
    Failed(Failure),
    /// A signal or `gpuvisor stop` ended it: the exit status.
    Stopped(u8),
}

impl From<Failure> for Halt {
    fn from(failure: Failure) -> Self {
        Halt::Failed(failure)
    }
}

impl From<std::io::Error> for Halt {
    fn from(error: std::io::Error) -> Self {
        Halt::Failed(error.into())
    }
}

/// How one round (one srun of agents) ended.
struct RoundEnd {
    /// Per node: its status and summary rows, if it finished.
    done: Vec<Option<(u8, Vec<SummaryRow>)>>,
    /// Nodes lost or failed, with why.
    failures: Vec<(String, String)>,
    /// A signal or `gpuvisor stop` ended it.
    stopped_by: Option<u8>,
}

/// Runs the job across the allocation's nodes.
pub fn head(args: &RunArgs, job: JobSpec, allocation: Allocation) -> Result<ExitCode, Failure> {
    let srun = which("srun").ok_or_else(|| {
        Failure::unavailable(
            "this is a Slurm allocation (SLURM_JOB_ID is set) but `srun` is not on PATH\n  hint: load Slurm's client tools, or run with --local to use this machine only",
        )
    })?;
    // Signals go to one thread of ours; block them before any thread exists.
    let mut signals = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signals.add(signal);
    }
    signals.thread_block().map_err(Failure::unavailable)?;
    let nodes = allocation.nodes.clone();
    let address = head_address(&nodes[0])?;
    let listener = TcpListener::bind((address, 0)).map_err(|error| {
        Failure::unavailable(format!(
            "cannot listen for the agents on {address}: {error}"
        ))
    })?;
    let head = listener.local_addr()?.to_string();
    let run_path = args.run_dir.clone().unwrap_or_else(|| {
        RunDir::default_path(
            Path::new(gpuvisor_supervisor::rundir::DEFAULT_RUNS),
            &job.name,
        )
    });
    let run_dir = RunDir::create(&run_path).map_err(Failure::bad_input)?;
    let run_path = std::fs::canonicalize(run_dir.path())?;
    let events = EventLog::create(&run_dir.events_path())?;
    let job_path = std::fs::canonicalize(&args.job)?;
    let job_source = std::fs::read_to_string(&job_path)?;
    eprintln!(
        "gpuvisor: running job {} on {} node{} ({}) through srun; record in {}",
        job.name,
        nodes.len(),
        if nodes.len() == 1 { "" } else { "s" },
        nodes.join(", "),
        run_dir.path().display()
    );
    events.write(
        &Event::new("job-start")
            .with("job", job.name.clone())
            .with("pid", std::process::id())
            .with("nodes", nodes.clone())
            .with("head", head.clone())
            .with("slurm_job", allocation.job_id.clone()),
    );
    let (inputs, receiver) = mpsc::channel::<Input>();
    {
        let inputs = inputs.clone();
        std::thread::Builder::new()
            .name("gpuvisor-signals".into())
            .spawn(move || {
                while let Ok(signal) = signals.wait() {
                    if inputs.send(Input::Signal(signal)).is_err() {
                        return;
                    }
                }
            })?;
    }
    let (control_sender, control_receiver) = mpsc::channel();
    let _control = control::serve(&run_dir.socket_path(), control_sender)?;
    {
        let inputs = inputs.clone();
        std::thread::spawn(move || {
            for incoming in control_receiver {
                if inputs.send(Input::Control(incoming)).is_err() {
                    return;
                }
            }
        });
    }
    let gpuvisor = std::env::current_exe()?;
    let mut context = Context {
        job: &job,
        args,
        nodes: &nodes,
        run_path: &run_path,
        job_path: &job_path,
        job_source: &job_source,
        events: &events,
        listener: &listener,
        head: &head,
        plan_written: false,
        plans: Vec::new(),
        round: 0,
        sample_writer: SampleWriter::create(&run_path.join("samples")).ok(),
    };
    let mut round = 0u32;
    let (status, rows) = loop {
        let token = new_token()?;
        let mut srun = match srun_command(
            &srun,
            nodes.len(),
            &gpuvisor,
            &head,
            &token,
            &args.srun_args,
        )
        .spawn()
        {
            Ok(srun) => srun,
            Err(error) => {
                let _ = std::fs::remove_file(run_dir.socket_path());
                events.write(&Event::new("job-end").with("status", 1));
                return Err(Failure::unavailable(format!(
                    "cannot start {}: {error}\n  hint: check that Slurm's srun works here (`srun --version`)",
                    srun.display()
                )));
            }
        };
        context.round = round;
        let agents = match context.start_round(round, &token, &mut srun, &receiver) {
            Ok(agents) => agents,
            Err(halt) => {
                // The agents that connected have been let go (their connections closed).
                stop_srun(&mut srun);
                let _ = std::fs::remove_file(run_dir.socket_path());
                return match halt {
                    Halt::Failed(failure) => {
                        events
                            .write(&Event::new("job-end").with("status", failure_status(&failure)));
                        Err(failure)
                    }
                    Halt::Stopped(status) => {
                        eprintln!(
                            "gpuvisor: stopped during the preflight; {}",
                            if round == 0 {
                                "nothing was started"
                            } else {
                                "the job was not started again"
                            }
                        );
                        events.write(&Event::new("job-end").with("status", status));
                        Ok(ExitCode::from(status))
                    }
                };
            }
        };
        let end = context.supervise_round(agents, &inputs, &receiver, &mut srun);
        stop_srun(&mut srun);
        let rows: Vec<SummaryRow> = end
            .done
            .iter()
            .flatten()
            .flat_map(|(_, rows)| rows.clone())
            .collect();
        let failed =
            !end.failures.is_empty() || end.done.iter().flatten().any(|(status, _)| *status == 1);
        let restartable = job.cluster.on_node_failure == NodeFailurePolicy::Restart
            && end.stopped_by.is_none()
            && failed
            && round < job.cluster.node_restarts;
        if restartable {
            round += 1;
            let reason = end
                .failures
                .iter()
                .map(|(node, why)| format!("{node}: {why}"))
                .collect::<Vec<_>>()
                .join("; ");
            eprintln!(
                "gpuvisor: restarting the job on every node (restart {round} of {}): {}",
                job.cluster.node_restarts,
                if reason.is_empty() {
                    "a node's processes failed"
                } else {
                    &reason
                }
            );
            events.write(
                &Event::new("node-restart")
                    .with("round", round)
                    .with("reason", reason),
            );
            continue;
        }
        let status = if failed {
            1
        } else if let Some(status) = end.stopped_by {
            status
        } else {
            end.done
                .iter()
                .flatten()
                .map(|(status, _)| *status)
                .max()
                .unwrap_or(0)
        };
        for (node, why) in &end.failures {
            eprintln!("gpuvisor: node {node} failed: {why}");
        }
        break (status, rows);
    };
    events.write(&Event::new("job-end").with("status", status));
    let _ = std::fs::remove_file(run_dir.socket_path());
    let outcome = gpuvisor_supervisor::supervisor::Outcome { status, rows };
    eprint!("{}", super::render_summary(&outcome));
    Ok(ExitCode::from(status))
}

fn failure_status(failure: &Failure) -> u8 {
    match failure {
        Failure::BadInput(_) => 2,
        Failure::Unavailable(_) => 1,
    }
}

/// A gap this long between two turns of the head's loop (which turns at least every 500 ms)
/// means the head itself was not running.
const HEAD_STALL: Duration = Duration::from_secs(2);

/// Everything a round needs.
struct Context<'a> {
    job: &'a JobSpec,
    args: &'a RunArgs,
    nodes: &'a [String],
    run_path: &'a Path,
    job_path: &'a Path,
    job_source: &'a str,
    events: &'a EventLog,
    listener: &'a TcpListener,
    head: &'a str,
    plan_written: bool,
    plans: Vec<Plan>,
    /// The current round (0, then 1 after the first restart...).
    round: u32,
    /// The job's `samples/`: the nodes' snapshots merged, once every node has sent one.
    sample_writer: Option<SampleWriter>,
}

impl Context<'_> {
    /// Agents connect, plan and pass the preflight; Ok: they are told to start.
    fn start_round(
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
    fn plan_and_probe(
        &mut self,
        round: u32,
        agents: &mut [Agent],
        timeout: Duration,
        inputs: &Receiver<Input>,
    ) -> Result<(), Halt> {
        // Plans.
        for (index, agent) in agents.iter_mut().enumerate() {
            let suffix = if round == 0 {
                String::new()
            } else {
                format!(".{round}")
            };
            agent.sender.send(&HeadMsg::Assign {
                job_path: self.job_path.to_path_buf(),
                job_source: self.job_source.to_string(),
                nodes: self.nodes.to_vec(),
                index,
                record: self
                    .run_path
                    .join("nodes")
                    .join(format!("{}{suffix}", agent.node)),
                logs: self.run_path.join("logs"),
                simulate: self.args.inventory.simulate.clone(),
                quiet: self.args.quiet || self.args.tui,
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
                            Failure::unavailable(format!(
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
                        Failure::unavailable(format!(
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
                        Failure::bad_input(text)
                    } else {
                        Failure::unavailable(text)
                    }));
                }
                other => {
                    return Err(Halt::Failed(Failure::unavailable(format!(
                        "{}: unexpected message before its plan: {other:?}",
                        agent.node
                    ))))
                }
            }
        }
        if !self.plan_written {
            let merged = merge_node_plans(plans.clone());
            let json = serde_json::to_string_pretty(&merged).map_err(Failure::unavailable)?;
            std::fs::write(self.run_path.join("plan.json"), json + "\n")?;
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
                    return Err(Halt::Failed(Failure::unavailable(format!(
                        "{}: unexpected message instead of its preflight results: {other:?}",
                        agent.node
                    ))))
                }
            }
        }
        if !targets.is_empty() {
            eprint!("{}", preflight_table(&targets, &results));
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
            &Event::new(if unreachable.is_empty() { "preflight" } else { "preflight-failed" })
                .with("nodes", self.nodes.to_vec())
                .with(
                    "coordinators",
                    targets
                        .iter()
                        .map(|target| json!({"world": target.world, "host": target.host, "port": target.port}))
                        .collect::<Vec<_>>(),
                )
                .with("unreachable", unreachable.clone()),
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
            let text = format!(
                "preflight failed: {} unreachable node-coordinator pair{}; nothing was started\n{}\n  hint: the processes would hang at their first collective; check the routes and firewalls between these nodes (and NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME if the nodes have several networks)",
                pairs.len(),
                if pairs.len() == 1 { "" } else { "s" },
                pairs.join("\n")
            );
            abort_all(agents, "preflight failed");
            return Err(Halt::Failed(Failure::unavailable(text)));
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
    fn accept_agents(
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
                return Err(Halt::Failed(self.preflight_failure(format!(
                    "srun ended ({status}) before the agents of {} connected; its error is above\n  hint: check that the allocation still holds these nodes (squeue, sinfo) and that {} exists on every node",
                    missing.join(", "),
                    std::env::current_exe().map(|path| path.display().to_string()).unwrap_or_default()
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
                return Err(Halt::Failed(self.preflight_failure(format!(
                    "preflight failed: {} of {} nodes never connected; nothing was started\n{}\n  hint: the nodes must reach this machine at {} (set GPUVISOR_HEAD_ADDRESS to pick another address); raise [cluster] preflight_timeout if srun is slow to start",
                    missing.len(),
                    self.nodes.len(),
                    pairs.join("\n"),
                    self.head
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
        self.events.write(
            &Event::new("nodes-joined").with(
                "agents",
                by_node
                    .values()
                    .map(|agent| json!({"node": agent.node, "pid": agent.pid}))
                    .collect::<Vec<_>>(),
            ),
        );
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
    fn interrupted(&self, inputs: &Receiver<Input>) -> Option<u8> {
        while let Ok(input) = inputs.try_recv() {
            match input {
                Input::Signal(signal) => {
                    self.events
                        .write(&Event::new("signal").with("signal", signal.as_str()));
                    return Some(128 + signal as i32 as u8);
                }
                Input::Control((request, reply)) => {
                    let answer = match request {
                        Request::Stop { process: None } => {
                            self.events.write(&Event::new("control").with(
                                "cmd",
                                serde_json::to_value(&request).unwrap_or(Value::Null),
                            ));
                            let _ = reply.send(json!({ "ok": true }));
                            return Some(0);
                        }
                        Request::Ps => json!({
                            "ok": true, "job": self.job.name, "replicas": [], "nodes": self.nodes
                        }),
                        Request::Sample => json!({ "ok": true, "sample": null }),
                        _ => control::error_reply(&format!(
                            "job {} is still in its preflight: nothing runs yet\n  hint: retry once its processes have started, or `gpuvisor stop` the whole job",
                            self.job.name
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
    fn recv_within(
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
            Ok(None) => Err(Halt::Failed(Failure::unavailable(format!(
                "the agent on {} (pid {}) went away during start-up; its error is above",
                agent.node, agent.pid
            )))),
            Err(error) => Err(Halt::Failed(Failure::unavailable(format!(
                "the agent on {} did not answer within {:.0} s: {error}",
                agent.node,
                timeout.as_secs_f64()
            )))),
        }
    }

    fn missing(&self, joined: &BTreeMap<String, Agent>) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|node| !joined.contains_key(*node))
            .cloned()
            .collect()
    }

    fn preflight_failure(&self, text: String) -> Failure {
        self.events
            .write(&Event::new("preflight-failed").with("reason", text.clone()));
        Failure::unavailable(text)
    }

    /// Runs the round to its end: merges events, answers control requests, watches nodes.
    fn supervise_round(
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
        let count = agents.len();
        let node_timeout = Duration::from_millis(self.job.cluster.node_timeout_ms);
        let mut last_seen = vec![Instant::now(); count];
        let mut ps: Vec<Vec<PsRow>> = vec![Vec::new(); count];
        let mut samples: Vec<Option<Snapshot>> = vec![None; count];
        let mut end = RoundEnd {
            done: vec![None; count],
            failures: Vec::new(),
            stopped_by: None,
        };
        let mut over = vec![false; count];
        let mut killed = vec![false; count];
        let mut stopping = false;
        let mut signals_seen = 0;
        let mut last_record = Instant::now() - Duration::from_secs(1);
        let mut gates = Gates::new(&self.plans);
        let mut last_turn = Instant::now();
        while over.iter().any(|over| !over) {
            let input = match receiver.recv_timeout(Duration::from_millis(500)) {
                Ok(input) => Some(input),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let mut failed_node = None;
            match input {
                Some(Input::FromAgent(round, _, _)) if round != self.round => {}
                Some(Input::FromAgent(_, index, Some(message))) => {
                    last_seen[index] = Instant::now();
                    match message {
                        AgentMsg::Event { line } => {
                            self.events
                                .append_line(&with_node(&line, &agents[index].node));
                            if let Some((process, ready)) = gates.observe(&line) {
                                broadcast(&mut agents, &over, &Request::Gate { process, ready });
                            }
                        }
                        AgentMsg::Ps { mut rows } => {
                            for row in &mut rows {
                                row.node = Some(agents[index].node.clone());
                            }
                            ps[index] = rows
                        }
                        AgentMsg::Sample { sample } => {
                            samples[index] = serde_json::from_value(sample).ok();
                            // One merged record per second, with every node in it (the rows
                            // of samples/ are fixed by its first record).
                            if last_record.elapsed() >= Duration::from_millis(900)
                                && samples.iter().all(Option::is_some)
                            {
                                last_record = Instant::now();
                                let nodes: Vec<String> =
                                    agents.iter().map(|agent| agent.node.clone()).collect();
                                if let (Some(writer), Some(merged)) =
                                    (self.sample_writer.as_mut(), merge_samples(&samples, &nodes))
                                {
                                    let _ = writer.append(&merged);
                                }
                            }
                        }
                        AgentMsg::Done { status, rows } => {
                            end.done[index] =
                                Some((status, rows.into_iter().map(Into::into).collect()));
                            over[index] = true;
                            if status == 1 {
                                failed_node = Some((
                                    index,
                                    "its processes failed (see its events)".to_string(),
                                    "node-failed",
                                ));
                            }
                        }
                        AgentMsg::Failed { message, .. } => {
                            over[index] = true;
                            failed_node = Some((index, message, "node-failed"));
                        }
                        _ => {}
                    }
                }
                Some(Input::FromAgent(_, index, None)) if !over[index] => {
                    over[index] = true;
                    failed_node = Some((
                        index,
                        format!(
                            "its agent (pid {} on {}) is gone: the connection to it closed",
                            agents[index].pid, agents[index].node
                        ),
                        "node-lost",
                    ));
                }
                Some(Input::FromAgent(_, _, None)) => {}
                Some(Input::Control((request, reply))) => {
                    let answer = self.control(&request, &mut agents, &ps, &samples, &over);
                    if matches!(request, Request::Stop { process: None }) {
                        stopping = true;
                        end.stopped_by.get_or_insert(0);
                    }
                    let _ = reply.send(answer);
                }
                Some(Input::Signal(signal)) => {
                    signals_seen += 1;
                    stopping = true;
                    end.stopped_by.get_or_insert(128 + signal as i32 as u8);
                    self.events
                        .write(&Event::new("signal").with("signal", signal.as_str()));
                    match signals_seen {
                        1 => broadcast(&mut agents, &over, &Request::Stop { process: None }),
                        2 => {
                            eprintln!("gpuvisor: stopping the agents now (again to kill them)");
                            let _ = killpg(Pid::from_raw(srun.id() as i32), Signal::SIGTERM);
                        }
                        _ => {
                            let _ = killpg(Pid::from_raw(srun.id() as i32), Signal::SIGKILL);
                        }
                    }
                }
                None => {}
            }
            // A head that did not run for a while (Ctrl-Z, a stalled machine) heard nothing
            // meanwhile, whatever the nodes sent: their silence is no evidence, and their
            // queued words are still to be read. Every node gets a fresh node_timeout.
            if last_turn.elapsed() > HEAD_STALL {
                last_seen.iter_mut().for_each(|seen| *seen = Instant::now());
            }
            last_turn = Instant::now();
            // A node silent for too long is lost (a crashed or partitioned machine may never
            // close its connection).
            for index in 0..count {
                if !over[index] && last_seen[index].elapsed() > node_timeout {
                    over[index] = true;
                    failed_node = Some((
                        index,
                        format!(
                            "no word from its agent for {:.0} s ([cluster] node_timeout)",
                            node_timeout.as_secs_f64()
                        ),
                        "node-lost",
                    ));
                }
            }
            if let Some((index, why, kind)) = failed_node {
                let node = agents[index].node.clone();
                // From the second Ctrl-C on, the head itself signals srun's agents: their
                // connections closing is the stop asked for, not a lost node.
                if kind == "node-lost" && signals_seen >= 2 {
                    killed[index] = true;
                    continue;
                }
                self.events.write(
                    &Event::new(kind)
                        .with("node", node.clone())
                        .with("reason", why.clone()),
                );
                if !stopping {
                    eprintln!("gpuvisor: node {node}: {why}; stopping the other nodes");
                }
                end.failures.push((node, why));
                if !stopping {
                    stopping = true;
                    broadcast(&mut agents, &over, &Request::Stop { process: None });
                }
            }
        }
        let _ = srun.try_wait();
        // A lost node's replicas never reported their end: they went with it.
        for (index, rows) in ps.into_iter().enumerate() {
            if end.done[index].is_none() {
                let cause = if killed[index] {
                    format!("killed with node {}'s agent", agents[index].node)
                } else {
                    format!("lost with node {}", agents[index].node)
                };
                let rows = lost_rows(rows, self.plans.get(index), &cause);
                // Killed by the head's own Ctrl-C escalation: the stop's status, not a fault.
                let status = match end.stopped_by {
                    Some(status) if killed[index] => status,
                    _ => 1,
                };
                end.done[index] = Some((status, rows));
            }
        }
        end
    }

    /// Answers a control request for the whole job.
    fn control(
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
                control::error_reply(&format!(
                    "no process `{}` in job {}\n  hint: processes are: {}",
                    process,
                    self.job.name,
                    self.job
                        .processes
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            }
            _ => {
                self.events.write(
                    &Event::new("control")
                        .with("cmd", serde_json::to_value(request).unwrap_or(Value::Null)),
                );
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

/// Which processes are ready job-wide, for the nodes that wait for processes running
/// elsewhere (`after` across nodes). Fed every node's events; says when a process that some
/// replica waits for becomes ready on every node (or stops being so, after a restart).
struct Gates {
    /// Label -> (process, ready now).
    replicas: BTreeMap<String, (String, bool)>,
    /// Processes something waits for -> whether the nodes were last told it is ready.
    told: BTreeMap<String, bool>,
}

impl Gates {
    fn new(plans: &[Plan]) -> Gates {
        let replicas = plans
            .iter()
            .flat_map(|plan| &plan.replicas)
            .map(|replica| (replica.label(), (replica.process.clone(), false)))
            .collect();
        let told = plans
            .iter()
            .flat_map(|plan| &plan.replicas)
            .flat_map(|replica| replica.after.iter().cloned())
            .map(|name| (name, false))
            .collect();
        Gates { replicas, told }
    }

    /// Takes one event line; Some((process, ready)) when the nodes must hear of a change.
    fn observe(&mut self, line: &str) -> Option<(String, bool)> {
        let event: Value = serde_json::from_str(line).ok()?;
        let label = event.get("process")?.as_str()?;
        let ready = match event.get("kind")?.as_str()? {
            "ready" => true,
            "restart" | "crash-loop" | "failed" => false,
            _ => return None,
        };
        let (process, state) = self.replicas.get_mut(label)?;
        *state = ready;
        let process = process.clone();
        let told = self.told.get_mut(&process)?;
        let all_ready = self
            .replicas
            .values()
            .filter(|(name, _)| name == &process)
            .all(|(_, ready)| *ready);
        if *told == all_ready {
            return None;
        }
        *told = all_ready;
        Some((process, all_ready))
    }
}

/// The summary rows of a node that never reported its end: from its last `ps`, or from its
/// plan when it went before its first `ps` (its replicas must not vanish from the summary).
fn lost_rows(ps: Vec<PsRow>, plan: Option<&Plan>, cause: &str) -> Vec<SummaryRow> {
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
        })
        .collect()
}

/// Reads an agent's hello; None for a connection that is not one of this round's agents.
fn hello(stream: TcpStream, token: &str) -> Option<Agent> {
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

/// Tells the agents that joined that the job will not start (they end quietly).
fn let_go(joined: &mut BTreeMap<String, Agent>) {
    for agent in joined.values_mut() {
        let _ = agent.sender.send(&HeadMsg::Abort {
            reason: "the job did not start".to_string(),
        });
    }
}

fn abort_all(agents: &mut [Agent], reason: &str) {
    for agent in agents {
        let _ = agent.sender.send(&HeadMsg::Abort {
            reason: reason.to_string(),
        });
    }
}

fn broadcast(agents: &mut [Agent], over: &[bool], request: &Request) {
    for (index, agent) in agents.iter_mut().enumerate() {
        if !over[index] {
            let _ = agent.sender.send(&HeadMsg::Control {
                request: request.clone(),
            });
        }
    }
}

/// An agent's event line with its node added; the node's own `job-start`/`job-end` become
/// `node-start`/`node-end` (the job's are the head's).
pub(crate) fn with_node(line: &str, node: &str) -> String {
    match serde_json::from_str::<Value>(line) {
        Ok(Value::Object(mut object)) => {
            if let Some(kind) = object.get_mut("kind") {
                match kind.as_str() {
                    Some("job-start") => *kind = "node-start".into(),
                    Some("job-end") => *kind = "node-end".into(),
                    _ => {}
                }
            }
            // Rebuilt so `t` and `kind` still lead the line.
            let mut text = String::from("{");
            let mut first = true;
            let mut push = |name: &str, value: &Value| {
                if !first {
                    text.push(',');
                }
                first = false;
                text.push_str(&Value::String(name.to_string()).to_string());
                text.push(':');
                text.push_str(&value.to_string());
            };
            for name in ["t", "kind"] {
                if let Some(value) = object.get(name) {
                    push(name, value);
                }
            }
            push("node", &Value::String(node.to_string()));
            for (name, value) in &object {
                if name != "t" && name != "kind" && name != "node" {
                    push(name, value);
                }
            }
            text.push('}');
            text
        }
        _ => line.to_string(),
    }
}

/// The nodes' latest samples as one: GPUs and replicas in node order (the merged plan's
/// order), each GPU marked with its node.
fn merge_samples(samples: &[Option<Snapshot>], nodes: &[String]) -> Option<Snapshot> {
    let mut merged: Option<Snapshot> = None;
    for (sample, node) in samples.iter().zip(nodes) {
        let Some(sample) = sample else { continue };
        let target = merged.get_or_insert_with(|| Snapshot {
            time_unix_ms: sample.time_unix_ms,
            interval_ms: sample.interval_ms,
            job: sample.job.clone(),
            gpu_source: sample.gpu_source.clone(),
            ..Snapshot::default()
        });
        target.time_unix_ms = target.time_unix_ms.max(sample.time_unix_ms);
        for gpu in &sample.gpus {
            let mut gpu = gpu.clone();
            gpu.node = Some(node.clone());
            target.gpus.push(gpu);
        }
        target.replicas.extend(sample.replicas.iter().cloned());
        target.processes.extend(sample.processes.iter().cloned());
        target
            .foreign_gpu_processes
            .extend(sample.foreign_gpu_processes.iter().cloned());
    }
    merged
}

/// The per-node preflight table.
fn preflight_table(targets: &[ProbeTarget], results: &[(String, Vec<ProbeResult>)]) -> String {
    let mut header = vec!["NODE".to_string()];
    header.extend(
        targets
            .iter()
            .map(|target| format!("{} @ {}:{}", target.world, target.host, target.port)),
    );
    let mut table =
        crate::table::Table::new(&header.iter().map(String::as_str).collect::<Vec<_>>());
    for (node, probed) in results {
        let mut row = vec![node.clone()];
        for target in targets {
            let cell = match probed.iter().find(|result| &result.target == target) {
                Some(ProbeResult { ms: Some(ms), .. }) => format!("ok {ms} ms"),
                Some(ProbeResult {
                    error: Some(error), ..
                }) => format!("FAILED: {error}"),
                _ => "?".to_string(),
            };
            row.push(cell);
        }
        table.row(row);
    }
    format!(
        "gpuvisor: preflight (every node to every coordinator):\n{}",
        table.render("  ")
    )
}

/// Lets srun end (it does once every agent has), else ends it.
fn stop_srun(srun: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = srun.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let group = Pid::from_raw(srun.id() as i32);
    let _ = killpg(group, Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = srun.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = kill(group, Signal::SIGKILL);
    let _ = killpg(group, Signal::SIGKILL);
    let _ = srun.wait();
}

/// A program on PATH.
fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_ready_job_wide_when_every_replica_on_every_node_is() {
        use gpuvisor_core::inventory::simulate;
        use gpuvisor_core::spec::parse_job;
        let job = parse_job(
            Path::new("job.toml"),
            "[process.learner]\ncommand=[\"l\"]\nreplicas=2\nnodes=\"first\"\ndevice=\"cpu\"\n\
             [process.actor]\ncommand=[\"a\"]\nnodes=\"rest\"\ndevice=\"cpu\"\nafter=[\"learner\"]\n",
        )
        .unwrap();
        let inventory = simulate("1x24GiB").unwrap();
        let names = vec!["n1".to_string(), "n2".to_string()];
        let plans: Vec<Plan> = (0..2)
            .map(|index| {
                let layout = NodeLayout {
                    names: names.clone(),
                    index,
                };
                plan_node(&job, &inventory, &layout).unwrap()
            })
            .collect();
        let mut gates = Gates::new(&plans);
        let event =
            |kind: &str, label: &str| format!(r#"{{"t":"x","kind":"{kind}","process":"{label}"}}"#);
        assert_eq!(gates.observe(&event("ready", "learner[0]")), None);
        assert_eq!(
            gates.observe(&event("ready", "actor")),
            None,
            "nothing waits for actors"
        );
        assert_eq!(
            gates.observe(&event("ready", "learner[1]")),
            Some(("learner".to_string(), true))
        );
        assert_eq!(
            gates.observe(&event("ready", "learner[1]")),
            None,
            "told once"
        );
        assert_eq!(
            gates.observe(&event("restart", "learner[0]")),
            Some(("learner".to_string(), false))
        );
    }

    #[test]
    fn a_node_lost_before_its_first_ps_still_has_its_replicas_in_the_summary() {
        use gpuvisor_core::inventory::simulate;
        use gpuvisor_core::spec::parse_job;
        let job = parse_job(
            Path::new("job.toml"),
            "[process.actor]\ncommand=[\"a\"]\nreplicas=2\nmemory=\"1GiB\"\n",
        )
        .unwrap();
        let layout = NodeLayout {
            names: vec!["n1".to_string(), "n2".to_string()],
            index: 1,
        };
        let plan = plan_node(&job, &simulate("1x24GiB").unwrap(), &layout).unwrap();
        let rows = lost_rows(Vec::new(), Some(&plan), "lost with node n2");
        let labels: Vec<&str> = rows.iter().map(|row| row.label.as_str()).collect();
        assert_eq!(labels, ["actor[2]", "actor[3]"]);
        assert!(rows.iter().all(|row| row.cause == "lost with node n2"));
        assert!(rows.iter().all(|row| row.budget_bytes > 0));
    }

    #[test]
    fn agent_events_carry_their_node_and_keep_time_and_kind_first() {
        let line =
            r#"{"t":"2026-11-22T03:00:00.000Z","kind":"start","process":"actor[2]","pid":7}"#;
        let merged = with_node(line, "n2");
        assert_eq!(
            merged,
            r#"{"t":"2026-11-22T03:00:00.000Z","kind":"start","node":"n2","pid":7,"process":"actor[2]"}"#
        );
        let start = with_node(r#"{"t":"x","kind":"job-start","job":"rl"}"#, "n1");
        assert!(start.contains(r#""kind":"node-start""#), "{start}");
        assert_eq!(with_node("not json", "n1"), "not json");
    }
}
