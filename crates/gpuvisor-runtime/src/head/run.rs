//! The head's I/O from start to end: it starts one agent per node through srun, hands each
//! the job, collects their plans, runs the preflight (every node reaches every coordinator),
//! and only then lets them start. While the job runs it merges the nodes' events into the
//! run's one `events.jsonl`, answers `ps`/`stop`/`restart`/`sample` on the run's control
//! socket for all nodes, and watches for lost nodes; a lost or failed node stops the job or
//! restarts it, as `[cluster] on_node_failure` says.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuvisor_core::plan::Plan;
use gpuvisor_core::spec::JobSpec;
use gpuvisor_supervisor::cluster::wire::{self, AgentMsg, HeadMsg, ProbeResult, ProbeTarget};
use gpuvisor_supervisor::control;
use gpuvisor_supervisor::events::{Event, EventLog};
use gpuvisor_supervisor::metrics::SharedSnapshot;
use gpuvisor_supervisor::rundir::RunDir;
use gpuvisor_supervisor::samples::SampleWriter;
use gpuvisor_supervisor::supervisor::SummaryRow;
use nix::sys::signal::{kill, killpg, SigSet, Signal};
use nix::unistd::Pid;

use super::machine::{after_round, AfterRound};
use crate::slurm::{head_address, new_token, srun_command, Allocation};
use crate::RuntimeError;

/// What the head needs of the command line besides the job and the allocation.
#[derive(Debug, Clone)]
pub struct Options {
    /// The job file as given (every agent gets its canonical path and its text).
    pub job_path: PathBuf,
    /// Where the run's record goes; `None`: `runs/JOB-TIME`.
    pub run_dir: Option<PathBuf>,
    /// Where to serve every node's figures (`--metrics`).
    pub metrics: Option<SocketAddr>,
    /// More arguments for srun.
    pub srun_args: Vec<String>,
    /// The simulated GPUs every node plans on (`--simulate`).
    pub simulate: Option<String>,
    /// The agents keep their replicas' output off their console (`--quiet`, `--tui`).
    pub quiet: bool,
    /// The program srun starts on every node as `__agent` (this binary).
    pub gpuvisor: PathBuf,
}

/// What the user sees of the head, the caller's to show.
pub trait Console {
    /// The run's record and control socket exist: the caller may start its live view over
    /// `run`. True when it did: the head then keeps its own lines, srun's and the preflight
    /// table off the terminal (the view's events say the same).
    fn record_ready(&mut self, run: &Path) -> Result<bool, RuntimeError>;
    /// A line for the user.
    fn say(&mut self, line: &str);
    /// Every node's preflight results against every coordinator (`targets`).
    fn preflight(&mut self, targets: &[ProbeTarget], results: &[(String, Vec<ProbeResult>)]);
    /// The job is over (or never started): the live view closes before anything more is
    /// said. Called once, and only after `record_ready` said the view started.
    fn finish_view(&mut self);
}

/// How a multi-node job ended.
#[derive(Debug)]
pub enum Outcome {
    /// Its processes ran (in one or more rounds) and ended.
    Ended {
        /// The exit status, the last round's rows and the record's summary line.
        summary: gpuvisor_supervisor::supervisor::Outcome,
        /// The nodes of the last round that were lost or failed, with why.
        failures: Vec<(String, String)>,
    },
    /// A signal or `gpuvisor stop` ended it during a round's start-up.
    StoppedInPreflight {
        /// The exit status (128 + the signal, or 0 for `gpuvisor stop`).
        status: u8,
        /// The round that was starting: 0 means nothing was ever started.
        round: u32,
    },
}

/// One connected agent.
pub(super) struct Agent {
    pub(super) node: String,
    pub(super) pid: u32,
    pub(super) sender: wire::Sender,
    pub(super) receiver: Option<wire::Receiver>,
}

/// What the head's loop waits for.
pub(super) enum Input {
    /// Round, agent index, message (None: its connection closed). A round's late messages
    /// (a closed connection after its `done`) must not count against the next round.
    FromAgent(u32, usize, Option<AgentMsg>),
    Control(control::Incoming),
    Signal(Signal),
}

/// Why a round's start-up (connect, plan, preflight) ended before its processes started.
pub(super) enum Halt {
    /// It failed: the error to return.
    Failed(RuntimeError),
    /// A signal or `gpuvisor stop` ended it: the exit status.
    Stopped(u8),
}

impl From<RuntimeError> for Halt {
    fn from(error: RuntimeError) -> Self {
        Halt::Failed(error)
    }
}

impl From<std::io::Error> for Halt {
    fn from(error: std::io::Error) -> Self {
        Halt::Failed(error.into())
    }
}

/// Runs `job` across the allocation's nodes to its end.
pub fn run(
    job: &JobSpec,
    allocation: &Allocation,
    options: &Options,
    console: &mut dyn Console,
) -> Result<Outcome, RuntimeError> {
    let srun = which("srun").ok_or_else(|| RuntimeError::Unavailable {
        what: "this is a Slurm allocation (SLURM_JOB_ID is set) but `srun` is not on PATH"
            .to_string(),
        hint: Some(
            "load Slurm's client tools, or run with --local to use this machine only".to_string(),
        ),
    })?;
    // Signals go to one thread of ours; block them before any thread exists.
    let mut signals = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signals.add(signal);
    }
    signals
        .thread_block()
        .map_err(|error| unavailable(error.to_string()))?;
    let nodes = allocation.nodes.clone();
    let address = head_address(&nodes[0])?;
    let listener = TcpListener::bind((address, 0)).map_err(|error| {
        unavailable(format!(
            "cannot listen for the agents on {address}: {error}"
        ))
    })?;
    let head = listener.local_addr()?.to_string();
    // Held from here, so a port in use is refused before the run directory exists.
    let metrics = options
        .metrics
        .map(crate::sampling::bind_metrics)
        .transpose()?;
    let run_path = options.run_dir.clone().unwrap_or_else(|| {
        RunDir::default_path(
            Path::new(gpuvisor_supervisor::rundir::DEFAULT_RUNS),
            &job.name,
        )
    });
    let run_path = crate::safe_path::private_run_dir(&run_path)?;
    let run_dir = RunDir::create(&run_path).map_err(|error| RuntimeError::Refused {
        what: error.to_string(),
        hint: None,
    })?;
    let run_path = std::fs::canonicalize(run_dir.path())?;
    let events = EventLog::create(&run_dir.events_path())?;
    let job_path = std::fs::canonicalize(&options.job_path)?;
    let job_source = std::fs::read_to_string(&job_path)?;
    console.say(&format!(
        "gpuvisor: running job {} on {} node{} ({}) through srun; record in {}",
        job.name,
        nodes.len(),
        if nodes.len() == 1 { "" } else { "s" },
        nodes.join(", "),
        run_dir.path().display()
    ));
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
                unavailable(format!("cannot serve metrics: {error}"))
            },
        )?;
        events.write(&Event::Metrics {
            address: bound.to_string(),
        });
        console.say(&format!(
            "gpuvisor: metrics of every node at http://{bound}/metrics"
        ));
    }
    // A live view reads the run directory and the head's control socket, which answers for
    // every node.
    let viewed = console.record_ready(run_dir.path())?;
    let mut context = Context {
        job,
        options,
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
        sample_writer: SampleWriter::create(&gpuvisor_record::RunDir::at(&run_path).samples_path())
            .ok(),
        latest: latest.clone(),
        console,
        viewed,
    };
    let mut round = 0u32;
    let (status, rows, failures) = loop {
        let token = new_token()?;
        let mut command = srun_command(
            &srun,
            nodes.len(),
            &options.gpuvisor,
            &head,
            &token,
            &options.srun_args,
        );
        if viewed {
            // srun's own messages would tear the live view: they go to srun.log.
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(gpuvisor_record::RunDir::at(&run_path).srun_log_path())?;
            command.stdout(log.try_clone()?).stderr(log);
        }
        let mut srun = match command.spawn() {
            Ok(srun) => srun,
            Err(error) => {
                context.finish_view();
                events.write(&Event::job_end(1));
                control::close(&run_dir.socket_path());
                return Err(RuntimeError::Unavailable {
                    what: format!("cannot start {}: {error}", srun.display()),
                    hint: Some("check that Slurm's srun works here (`srun --version`)".into()),
                });
            }
        };
        context.round = round;
        let agents = match context.start_round(round, &token, &mut srun, &receiver) {
            Ok(agents) => agents,
            Err(halt) => {
                // The agents that connected have been let go (their connections closed).
                stop_srun(&mut srun);
                context.finish_view();
                let status = match &halt {
                    Halt::Failed(error) if error.is_bad_input() => 2,
                    Halt::Failed(_) => 1,
                    Halt::Stopped(status) => *status,
                };
                // On record before the socket goes: `gpuvisor stop` reads the status once the
                // socket is gone.
                events.write(&Event::job_end(i32::from(status)));
                control::close(&run_dir.socket_path());
                return match halt {
                    Halt::Failed(error) => Err(error),
                    Halt::Stopped(status) => Ok(Outcome::StoppedInPreflight { status, round }),
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
    context.finish_view();
    control::close(&run_dir.socket_path());
    let record = events.close();
    let status = match status {
        0 if record.incomplete() => 1,
        status => status,
    };
    Ok(Outcome::Ended {
        summary: gpuvisor_supervisor::supervisor::Outcome {
            status,
            rows,
            record: record.summary_line(&run_dir.events_path()),
            job: Default::default(),
            makespan_ms: None,
        },
        failures,
    })
}

/// Something the head needs failed (exit 1), with no more to say than what.
pub(super) fn unavailable(what: String) -> RuntimeError {
    RuntimeError::Unavailable { what, hint: None }
}

/// Everything a round needs.
pub(super) struct Context<'a> {
    pub(super) job: &'a JobSpec,
    pub(super) options: &'a Options,
    pub(super) nodes: &'a [String],
    pub(super) run_path: &'a Path,
    pub(super) job_path: &'a Path,
    pub(super) job_source: &'a str,
    pub(super) events: &'a EventLog,
    pub(super) listener: &'a TcpListener,
    pub(super) head: &'a str,
    pub(super) plan_written: bool,
    pub(super) plans: Vec<Plan>,
    /// The current round (0, then 1 after the first restart...).
    pub(super) round: u32,
    /// The job's `samples/`: the nodes' snapshots merged, once every node has sent one.
    pub(super) sample_writer: Option<SampleWriter>,
    /// The nodes' latest snapshots merged, for `--metrics`.
    pub(super) latest: SharedSnapshot,
    pub(super) console: &'a mut dyn Console,
    /// The caller's live view shows the run (the head keeps off the terminal) until
    /// [`Context::finish_view`].
    pub(super) viewed: bool,
}

impl Context<'_> {
    /// A line for the terminal, unless the live view owns it (the events it shows say the
    /// same).
    pub(super) fn say(&mut self, line: String) {
        if !self.viewed {
            self.console.say(&line);
        }
    }

    /// Closes the caller's live view, if it runs.
    fn finish_view(&mut self) {
        if std::mem::take(&mut self.viewed) {
            self.console.finish_view();
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

pub(super) fn abort_all(agents: &mut [Agent], reason: &str) {
    for agent in agents {
        let _ = agent.sender.send(&HeadMsg::Abort {
            reason: reason.to_string(),
        });
    }
}

/// Tells the agents that joined that the job will not start (they end quietly).
pub(super) fn let_go(joined: &mut BTreeMap<String, Agent>) {
    for agent in joined.values_mut() {
        let _ = agent.sender.send(&HeadMsg::Abort {
            reason: "the job did not start".to_string(),
        });
    }
}
