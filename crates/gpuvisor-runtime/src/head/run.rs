//! The head of a multi-node run: `gpuvisor run JOB` inside a Slurm allocation. It starts one
//! agent per node through srun, hands each the job, collects their plans, runs the preflight
//! (every node reaches every coordinator), and only then lets them start. While the job runs
//! it merges the nodes' events into the run's one `events.jsonl`, answers `ps`/`stop`/
//! `restart`/`sample` on the run's control socket for all nodes, and watches for lost nodes;
//! a lost or failed node stops the job or restarts it, as `[cluster] on_node_failure` says.
//!
//! [`preflight`] is the start-up (agents connect, plan, probe every coordinator), [`round`]
//! the running job's I/O (record, control requests, agents' connections); what the head
//! decides while the job runs (lost and failed nodes, timeouts, the Ctrl-C escalation, gates
//! for `after`) is `gpuvisor_runtime::head`, a state machine the round feeds.

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuvisor_core::cluster::NodeLayout;
use gpuvisor_core::inventory::Inventory;
use gpuvisor_core::plan::{merge_node_plans, plan_node, Plan};
use gpuvisor_core::spec::JobSpec;
use gpuvisor_runtime::head::{after_round, AfterRound, RoundEnd};
use gpuvisor_supervisor::cluster::wire::{self, AgentMsg, HeadMsg, ProbeResult, ProbeTarget};
use gpuvisor_supervisor::control::{self, PsRow, Request};
use gpuvisor_supervisor::events::{Event, EventLog};
use gpuvisor_supervisor::metrics::SharedSnapshot;
use gpuvisor_supervisor::rundir::RunDir;
use gpuvisor_supervisor::sample::Snapshot;
use gpuvisor_supervisor::samples::SampleWriter;
use gpuvisor_supervisor::supervisor::SummaryRow;
use nix::sys::signal::{kill, killpg, SigSet, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use super::RunArgs;
use crate::failure::Failure;
use gpuvisor_runtime::slurm::{head_address, new_token, srun_command, Allocation};

mod preflight;
mod round;

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

/// Runs the job across the allocation's nodes.
pub fn head(args: &RunArgs, job: JobSpec, allocation: Allocation) -> Result<ExitCode, Failure> {
    let srun = which("srun").ok_or_else(|| {
        Failure::unavailable(
            "this is a Slurm allocation (SLURM_JOB_ID is set) but `srun` is not on PATH",
        )
        .with_hint("load Slurm's client tools, or run with --local to use this machine only")
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
    // Held from here, so a port in use is refused before the run directory exists.
    let metrics = args
        .metrics
        .map(super::gpu_source::bind_metrics)
        .transpose()?;
    let run_path = args.run_dir.clone().unwrap_or_else(|| {
        RunDir::default_path(
            Path::new(gpuvisor_supervisor::rundir::DEFAULT_RUNS),
            &job.name,
        )
    });
    let run_path = super::safe_run_dir(&run_path)?;
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
    events.write(&Event::JobStart(gpuvisor_record::event::JobStart {
        job: job.name.clone(),
        pid: std::process::id(),
        replicas: None,
        nodes: Some(nodes.clone()),
        head: Some(head.clone()),
        slurm_job: Some(allocation.job_id.clone()),
    }));
    let (inputs, receiver) = mpsc::channel::<Input>();
    {
        let inputs = inputs.clone();
        std::thread::Builder::new()
            .name("gpuvisor-signals".into())
            .spawn(move || {
                while let Ok(signal) = signals.wait() {
                    if inputs.send(Input::Signal(signal)).is_err() {
                        // The head's loop is over; the signals stay blocked, so this thread
                        // ends the process (SIGTERM must never be ignored), as the
                        // supervisor's does.
                        std::process::exit(128 + signal as i32);
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
    let latest: SharedSnapshot = Arc::default();
    if let Some(listener) = metrics {
        let bound = gpuvisor_supervisor::metrics::serve_on(listener, Arc::clone(&latest)).map_err(
            |error| {
                control::close(&run_dir.socket_path());
                Failure::unavailable(format!("cannot serve metrics: {error}"))
            },
        )?;
        events.write(&Event::Metrics {
            address: bound.to_string(),
        });
        eprintln!("gpuvisor: metrics of every node at http://{bound}/metrics");
    }
    // The live view reads the run directory and the head's control socket, which answers for
    // every node (no local GPU probe: this machine's GPUs are not the job's).
    let mut view = match args.tui {
        true => Some(super::tui::Tui::start(run_dir.path(), true)?),
        false => None,
    };
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
        latest: latest.clone(),
        terminal: view.is_none(),
    };
    let mut round = 0u32;
    let (status, rows, failures) = loop {
        let token = new_token()?;
        let mut command = srun_command(
            &srun,
            nodes.len(),
            &gpuvisor,
            &head,
            &token,
            &args.srun_args,
        );
        if view.is_some() {
            // srun's own messages would tear the live view: they go to srun.log.
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(run_path.join("srun.log"))?;
            command.stdout(log.try_clone()?).stderr(log);
        }
        let mut srun = match command.spawn() {
            Ok(srun) => srun,
            Err(error) => {
                if let Some(view) = view.take() {
                    view.finish();
                }
                events.write(&Event::job_end(1));
                control::close(&run_dir.socket_path());
                return Err(Failure::unavailable(format!(
                    "cannot start {}: {error}",
                    srun.display()
                ))
                .with_hint("check that Slurm's srun works here (`srun --version`)"));
            }
        };
        context.round = round;
        let agents = match context.start_round(round, &token, &mut srun, &receiver) {
            Ok(agents) => agents,
            Err(halt) => {
                // The agents that connected have been let go (their connections closed).
                stop_srun(&mut srun);
                if let Some(view) = view.take() {
                    view.finish();
                }
                let status = match &halt {
                    Halt::Failed(failure) => failure_status(failure),
                    Halt::Stopped(status) => *status,
                };
                // On record before the socket goes: `gpuvisor stop` reads the status once the
                // socket is gone.
                events.write(&Event::job_end(i32::from(status)));
                control::close(&run_dir.socket_path());
                return match halt {
                    Halt::Failed(failure) => Err(failure),
                    Halt::Stopped(status) => {
                        eprintln!(
                            "gpuvisor: stopped during the preflight; {}",
                            if round == 0 {
                                "nothing was started"
                            } else {
                                "the job was not started again"
                            }
                        );
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
        let next = after_round(
            &end,
            job.cluster.on_node_failure,
            round,
            job.cluster.node_restarts,
        );
        let status = match next {
            AfterRound::Restart {
                round: next,
                reason,
            } => {
                round = next;
                context.say(format!(
                    "gpuvisor: restarting the job on every node (restart {round} of {}): {}",
                    job.cluster.node_restarts,
                    if reason.is_empty() {
                        "a node's processes failed"
                    } else {
                        &reason
                    }
                ));
                events.write(&Event::NodeRestart { round, reason });
                continue;
            }
            AfterRound::End(status) => status,
        };
        break (status, rows, end.failures);
    };
    events.write(&Event::job_end(i32::from(status)));
    if let Some(view) = view {
        view.finish();
    }
    for (node, why) in &failures {
        eprintln!("gpuvisor: node {node} failed: {why}");
    }
    control::close(&run_dir.socket_path());
    let record = events.close();
    let status = match status {
        0 if record.incomplete() => 1,
        status => status,
    };
    let outcome = gpuvisor_supervisor::supervisor::Outcome {
        status,
        rows,
        record: record.summary_line(&run_dir.events_path()),
        job: Default::default(),
        makespan_ms: None,
    };
    eprint!("{}", super::render_summary(&outcome));
    Ok(ExitCode::from(status))
}

fn failure_status(failure: &Failure) -> u8 {
    match failure {
        Failure::BadInput(_) => 2,
        Failure::Unavailable(_) => 1,
    }
}

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
    /// The nodes' latest snapshots merged, for `--metrics`.
    latest: SharedSnapshot,
    /// The head may print to the terminal (not while `--tui` draws there).
    terminal: bool,
}

impl Context<'_> {
    /// A line for the terminal, unless the live view owns it (the events it shows say the
    /// same).
    fn say(&self, line: String) {
        if self.terminal {
            eprintln!("{line}");
        }
    }
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

fn abort_all(agents: &mut [Agent], reason: &str) {
    for agent in agents {
        let _ = agent.sender.send(&HeadMsg::Abort {
            reason: reason.to_string(),
        });
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
