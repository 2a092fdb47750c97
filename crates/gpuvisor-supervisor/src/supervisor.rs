//! The supervisor's event loop: it owns the [`Machine`], carries out its actions (spawn,
//! signal, record), and turns everything that happens (exits from the reaper, log events,
//! signals, control requests, timers) into its inputs. One thread decides; the others only
//! report to it over one channel.

use std::ffi::OsString;
use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuvisor_core::spec::{RestartPolicy, RestartSpec};
use nix::sys::prctl;
use nix::sys::signal::{killpg, SigSet, Signal};
use nix::unistd::Pid;
use regex::bytes::Regex;
use serde_json::{json, Value};

use crate::cause::{self, Evidence};
use crate::cleanup::{clean_shm, JobFootprint};
use crate::console::{Console, JobTally, Tally};
use crate::control::{self, PsRow, Request};
use crate::events::{Event, EventLog, RecordHealth};
use crate::logs::{LogConfig, LogEvent, LogPump};
use crate::procfs;
use crate::rundir::RunDir;
use crate::spawn::{ExitStatus, Launch, Spawner};
use crate::state::{Action, Input, Machine, Member, Phase, MIN_RESTART_DELAY_MS};
use crate::terminal::TerminalWriter;

/// When a replica counts as ready (its dependants may start).
#[derive(Debug, Clone)]
pub enum Readiness {
    /// As soon as it runs.
    Started,
    /// When a line of its output matches.
    LogLine(Regex),
    /// When something accepts TCP connections on 127.0.0.1 at this port.
    Port(u16),
    /// When it exits with status 0 (a set-up step; it is not restarted then).
    Exit,
}

/// One replica to supervise.
#[derive(Debug, Clone)]
pub struct ReplicaSpec {
    /// Its process's name.
    pub process: String,
    /// Replica number.
    pub replica: u32,
    /// `name` or `name[r]`.
    pub label: String,
    /// Its log file: `logs/<file_stem>.log`.
    pub file_stem: String,
    /// What to run.
    pub launch: Launch,
    /// Processes it waits for.
    pub after: Vec<String>,
    /// Restart policy.
    pub restart: RestartSpec,
    /// The first signal of a stop.
    pub stop_signal: Signal,
    /// Milliseconds from that signal to SIGKILL.
    pub grace_ms: u64,
    /// When it is ready.
    pub readiness: Readiness,
    /// Its GPU budget per GPU (0 for CPU-only), for `ps` and the summary.
    pub budget_bytes: u64,
    /// `logs = "direct"`: it writes its own log files (`logs/<file_stem>.out.log` and
    /// `.err.log`), which the pump only dates; otherwise its output comes through pipes.
    pub direct_logs: bool,
}

/// GPU memory of one replica, from the ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuUsage {
    /// In use now, bytes (on its fullest GPU: budgets are per GPU).
    pub used_bytes: u64,
    /// In use now per GPU (index as the GPU source numbers it), bytes, where it holds any.
    pub used_by_gpu: Vec<(u32, u64)>,
    /// Peak, bytes.
    pub peak_bytes: u64,
    /// Allocations refused so far.
    pub denials: u64,
}

/// What the ledger says, per replica (index = replica), plus events since the last sample.
#[derive(Debug, Clone, Default)]
pub struct GpuSample {
    /// Usage per replica (`None`: not known).
    pub usage: Vec<Option<GpuUsage>>,
    /// Denials, violations... to record.
    pub events: Vec<Event>,
}

mod hooks;
pub use hooks::{EnvChanges, Hooks, NoHooks};

/// How to supervise.
#[derive(Debug)]
pub struct Options {
    /// The job's name.
    pub job: String,
    /// The keeper command (`[gpuvisor-keeper]` or `[gpuvisor, __keeper]`); `None` starts
    /// commands directly.
    pub keeper: Option<Vec<OsString>>,
    /// Copy output to the terminal.
    pub terminal: bool,
    /// Print a line on stderr for each refusal, violation, stall, restart and failure (see
    /// [`crate::console`]).
    pub console: bool,
    /// Rotate a log file (and `events.jsonl`) past this size.
    pub max_log_bytes: u64,
    /// Rotated log files kept (and rotated event files).
    pub keep_rotated: u32,
    /// Where shared-memory leftovers are looked for.
    pub shm_dir: PathBuf,
    /// How often process trees are sampled (RSS, pids, mapped /dev/shm files).
    pub sample_interval: Duration,
    /// How often the sampler ticks (GPUs, /proc, ledger; policies, stalls, metrics, samples
    /// file): 500 ms by default, 50 ms at the least.
    pub sampler_interval: Duration,
    /// Policies and stall detection.
    pub watch: crate::watch::WatchConfig,
    /// Serve metrics on this listener (`--metrics`), bound with `metrics::bind` before
    /// anything was created, so a port in use is refused first.
    pub metrics: Option<Arc<std::net::TcpListener>>,
    /// `admission = "queue"`: the admission set-up from the plan (replica positions are the
    /// replica list's); `None`: every replica holds its room from the start.
    pub queue: Option<gpuvisor_core::plan::admit::QueueSetup>,
    /// NVML index of each GPU of the plan (names GPUs in `admitted` events).
    pub gpu_indices: Vec<u32>,
    /// Without a queue: the plan's books and each replica's room, kept for live resizing.
    pub holdings: Option<gpuvisor_core::plan::resize::Holdings>,
    /// The run's booking in the host record (machine-wide booking), kept for the run's life
    /// (it goes when dropped) and moved by live resizes.
    pub host_booking: Option<crate::booking::HostBooking>,
}

impl Options {
    /// Defaults for `job`: keeper as given, terminal on, 100 MiB log files, 5 kept.
    pub fn new(job: &str, keeper: Option<Vec<OsString>>) -> Options {
        Options {
            job: job.to_string(),
            keeper,
            terminal: true,
            console: true,
            max_log_bytes: 100 << 20,
            keep_rotated: 5,
            shm_dir: PathBuf::from("/dev/shm"),
            sample_interval: Duration::from_secs(1),
            sampler_interval: Duration::from_millis(500),
            watch: crate::watch::WatchConfig::default(),
            metrics: None,
            queue: None,
            gpu_indices: Vec::new(),
            holdings: None,
            host_booking: None,
        }
    }
}

/// One row of the exit summary (also what a multi-node run's agents send their head).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SummaryRow {
    /// `name` or `name[r]`.
    pub label: String,
    /// Restarts.
    pub restarts: u32,
    /// Last exit cause (or its state if it never exited).
    pub cause: String,
    /// Peak GPU memory, if known.
    pub gpu_peak_bytes: Option<u64>,
    /// Budget.
    pub budget_bytes: u64,
    /// Total time it ran, all lives.
    pub run_ms: u64,
    /// Refusals, violations, stalls and why it ended, from its events.
    #[serde(default)]
    pub seen: Tally,
    /// With queued admission: how long it waited for GPU room, all waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// How the job ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The exit status for gpuvisor: 1 if something failed for good; else 128 + the signal if
    /// a signal stopped the job (130 for Ctrl-C); else 1 if events are missing from the
    /// record (a full disk); else 0.
    pub status: u8,
    /// One row per replica.
    pub rows: Vec<SummaryRow>,
    /// What went wrong with the record (`events.jsonl`), when something did: for the summary.
    pub record: Option<String>,
    /// Why gpuvisor stopped the job, and what a policy did to end it, in words.
    pub job: JobTally,
    /// With queued admission: from the start of the job to the end of its last replica.
    pub makespan_ms: Option<u64>,
}

enum Msg {
    Reaped(i32, ExitStatus),
    Log(LogEvent),
    Signal(Signal),
    Control(control::Incoming),
    PortOpen(usize, u64),
}

#[derive(Default)]
struct Track {
    generation: u64,
    pid: Option<i32>,
    started: Option<Instant>,
    signalled: Option<i32>,
    port_watch: Option<Arc<AtomicBool>>,
    pending_exit: Option<(u64, ExitStatus, Instant)>,
    closed: Option<(u64, Vec<String>)>,
    last_cause: Option<String>,
    run_ms: u64,
    peak_rss: Option<u64>,
    gpu: Option<GpuUsage>,
}

/// Runs the job to its end: starts every replica in dependency order, restarts and stops by
/// policy, records everything in `run_dir`, serves the control socket, cleans up. Returns when
/// every replica is done (or stopped).
///
/// It owns the process's children while it runs: it reaps every child (waitid on all), makes
/// the process a child subreaper, blocks SIGINT / SIGTERM / SIGHUP in the calling thread (the
/// one that must stay alive: keepers die with it), and at the end kills any child left. Call
/// it once at a time per process, from a process that starts no other children meanwhile.
pub fn supervise(
    replicas: Vec<ReplicaSpec>,
    run_dir: &RunDir,
    options: Options,
    hooks: &mut dyn Hooks,
) -> std::io::Result<Outcome> {
    // Signals are taken by one thread; block them before any thread exists so all inherit it.
    let mut signals = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signals.add(signal);
    }
    signals.thread_block()?;
    // Orphans anywhere below us come to us, to be killed and reaped, not to init.
    prctl::set_child_subreaper(true)?;
    let console = Console::start(
        replicas.iter().map(|spec| spec.label.clone()).collect(),
        options.console,
    )?;
    let events = EventLog::create(&run_dir.events_path())?
        .rotating(options.max_log_bytes, options.keep_rotated)
        .with_console(console.feeder());
    let (sender, receiver) = mpsc::channel::<Msg>();
    {
        let sender = sender.clone();
        std::thread::Builder::new()
            .name("gpuvisor-signals".into())
            .spawn(move || {
                while let Ok(signal) = signals.wait() {
                    if sender.send(Msg::Signal(signal)).is_err() {
                        // The job is over and its record written; whatever the process does
                        // now (waiting on a terminal view, printing its summary) must not
                        // make it deaf: the signals stay blocked, so this thread ends it.
                        std::process::exit(128 + signal as i32);
                    }
                }
            })?;
    }
    let spawner = Spawner::new(options.keeper.clone());
    let reaper_stop = Arc::new(AtomicBool::new(false));
    let reaper = {
        let (exit_sender, exit_receiver) = mpsc::channel();
        let reaper = spawner.reaper();
        let stop = Arc::clone(&reaper_stop);
        let forward = sender.clone();
        let handle = std::thread::Builder::new()
            .name("gpuvisor-reaper".into())
            .spawn(move || reaper.run(exit_sender, &stop))?;
        std::thread::Builder::new()
            .name("gpuvisor-exits".into())
            .spawn(move || {
                for (pid, status) in exit_receiver {
                    if forward.send(Msg::Reaped(pid, status)).is_err() {
                        return;
                    }
                }
            })?;
        handle
    };
    let terminal = options.terminal.then(|| {
        TerminalWriter::start(
            replicas.iter().map(|spec| spec.label.clone()).collect(),
            10_000,
        )
    });
    let pump = {
        let sender = std::sync::Mutex::new(sender.clone());
        LogPump::start(
            LogConfig {
                dir: run_dir.logs_path(),
                max_file_bytes: options.max_log_bytes,
                keep_rotated: options.keep_rotated,
            },
            replicas.iter().map(|spec| spec.file_stem.clone()).collect(),
            terminal.as_ref().map(TerminalWriter::queue),
            Box::new(move |event| {
                let _ = sender
                    .lock()
                    .unwrap_or_else(|poison| poison.into_inner())
                    .send(Msg::Log(event));
            }),
        )?
    };
    {
        let (control_sender, control_receiver) = mpsc::channel::<control::Incoming>();
        control::serve(&run_dir.socket_path(), control_sender)?;
        let sender = sender.clone();
        std::thread::Builder::new()
            .name("gpuvisor-requests".into())
            .spawn(move || {
                for incoming in control_receiver {
                    if sender.send(Msg::Control(incoming)).is_err() {
                        return;
                    }
                }
            })?;
    }
    let latest: crate::metrics::SharedSnapshot = Arc::default();
    let metrics_address = match &options.metrics {
        Some(listener) => Some(crate::metrics::serve_on(
            Arc::clone(listener),
            Arc::clone(&latest),
        )?),
        None => None,
    };
    let sampler_interval = options.sampler_interval.max(Duration::from_millis(50));
    let mut sampler = crate::sampler::Sampler::new(
        &options.job,
        sampler_interval,
        replicas
            .iter()
            .map(|spec| crate::sampler::ReplicaInfo {
                process: spec.process.clone(),
                replica: spec.replica,
                label: spec.label.clone(),
                budget_bytes: spec.budget_bytes,
            })
            .collect(),
        hooks
            .gpu_source()
            .unwrap_or_else(|| Box::new(crate::gpu_source::NoGpus)),
    );
    sampler.watch_physical(options.watch.physical.clone());
    let samples = match crate::samples::SampleWriter::create(&run_dir.path().join("samples")) {
        Ok(writer) => Some(writer),
        Err(error) => {
            eprintln!("gpuvisor: cannot record samples: {error}");
            None
        }
    };
    let members = replicas
        .iter()
        .enumerate()
        .map(|(index, spec)| member_of(spec, queue::room_of(options.queue.as_ref(), index)))
        .collect();
    let (admission, queued_events) = queue::start(&options, &replicas);
    let holdings = options.holdings.clone().filter(|_| admission.is_none());
    let seed = crate::clock::now_unix_ms() ^ u64::from(std::process::id());
    let options_watch = options.watch.clone();
    let last_output = pump.last_output();
    let mut run = Run {
        machine: Machine::new(members, seed),
        tracks: (0..replicas.len()).map(|_| Track::default()).collect(),
        specs: replicas,
        events,
        spawner,
        pump,
        sender,
        hooks,
        options,
        epoch: Instant::now(),
        footprint: JobFootprint::default(),
        oom_kills: cause::cgroup_oom_kills(),
        memory_limit: cause::memory_limit_bytes(),
        interrupts: 0,
        first_signal: None,
        latest,
        sampler,
        watch: crate::watch::Watch::new(options_watch),
        last_output,
        shim_events: Vec::new(),
        samples,
        run_path: run_dir.path().to_path_buf(),
        py_spy: crate::stacks::find_py_spy(),
        scans: 0,
        shm_seen: Default::default(),
        maps_read: Default::default(),
        admission,
        holdings,
        makespan_ms: None,
        added: Vec::new(),
        tick_inputs: Default::default(),
        exiting: Default::default(),
        replica_of_pid: Default::default(),
    };
    run.events
        .write(&Event::JobStart(gpuvisor_record::event::JobStart {
            job: run.options.job.clone(),
            pid: std::process::id(),
            replicas: Some(run.specs.len()),
            nodes: None,
            head: None,
            slurm_job: None,
        }));
    note_short_backoffs(&run.specs, &run.events);
    run.act_on_queue(queued_events, &mut Vec::new());
    if let Some(address) = metrics_address {
        run.events.write(&Event::Metrics {
            address: address.to_string(),
        });
    }
    let mut status = run.main_loop(&receiver);
    if let (0, Some(signal)) = (status, run.first_signal) {
        // Stopped by a signal with nothing failed: say so, as shells do (130 for SIGINT).
        status = 128 + signal as u8;
    }
    let (status, record) = run.finish_job(&receiver, status);
    reaper_stop.store(true, Ordering::SeqCst);
    let _ = reaper.join();
    let mut rows = run.summary_rows();
    let makespan_ms = run.makespan_ms;
    let Run { pump, .. } = run;
    pump.finish();
    if let Some(terminal) = terminal {
        terminal.finish();
    }
    // After the output's last lines, so what is held is said next to the summary.
    let (tallies, job) = console.finish();
    for (row, tally) in rows.iter_mut().zip(tallies) {
        row.seen = tally;
    }
    control::close(&run_dir.socket_path());
    Ok(Outcome {
        status,
        rows,
        record: record.summary_line(&run_dir.events_path()),
        job,
        makespan_ms,
    })
}

/// Says once per process (on stderr and as a `backoff-clamped` event) that its `backoff` is
/// below [`MIN_RESTART_DELAY_MS`], which restarts wait instead.
fn note_short_backoffs(specs: &[ReplicaSpec], events: &EventLog) {
    let mut said: Vec<&str> = Vec::new();
    for spec in specs {
        let restart = &spec.restart;
        if restart.policy == RestartPolicy::No
            || restart.backoff_initial_ms >= MIN_RESTART_DELAY_MS
            || said.contains(&spec.process.as_str())
        {
            continue;
        }
        said.push(&spec.process);
        let _ = writeln!(
            std::io::stderr(),
            "gpuvisor: backoff of [process.{}] is {} ms; restarts wait at least {MIN_RESTART_DELAY_MS} ms",
            spec.process, restart.backoff_initial_ms
        );
        events.write(&Event::BackoffClamped {
            process: spec.process.clone(),
            backoff_ms: restart.backoff_initial_ms,
            min_ms: MIN_RESTART_DELAY_MS,
        });
    }
}

fn member_of(spec: &ReplicaSpec, room: crate::state::Room) -> Member {
    Member {
        process: spec.process.clone(),
        label: spec.label.clone(),
        after: spec.after.clone(),
        restart: spec.restart.clone(),
        grace_ms: spec.grace_ms,
        ready_when_started: matches!(spec.readiness, Readiness::Started),
        ready_when_exited: matches!(spec.readiness, Readiness::Exit),
        room,
    }
}

struct Run<'hooks> {
    machine: Machine,
    tracks: Vec<Track>,
    specs: Vec<ReplicaSpec>,
    events: EventLog,
    spawner: Spawner,
    pump: LogPump,
    sender: Sender<Msg>,
    hooks: &'hooks mut dyn Hooks,
    options: Options,
    epoch: Instant,
    footprint: JobFootprint,
    oom_kills: Option<u64>,
    memory_limit: Option<u64>,
    interrupts: u32,
    first_signal: Option<Signal>,
    /// The sampler's latest picture (served by `{"cmd":"sample"}` and the metrics).
    latest: crate::metrics::SharedSnapshot,
    sampler: crate::sampler::Sampler,
    watch: crate::watch::Watch,
    /// When each replica last wrote output (from the log pump).
    last_output: Arc<Vec<std::sync::atomic::AtomicU64>>,
    /// Shim `violation` events since the last sampler tick (for the GPU-use policy).
    shim_events: Vec<Event>,
    samples: Option<crate::samples::SampleWriter>,
    run_path: PathBuf,
    py_spy: Option<PathBuf>,
    /// Footprint scans so far (every 10th also scans process groups).
    scans: u64,
    /// Candidate shm files with when they were first seen, and pids whose maps were read.
    shm_seen: std::collections::BTreeMap<PathBuf, Instant>,
    maps_read: std::collections::HashSet<i32>,
    /// The admission queue (`admission = "queue"`).
    admission: Option<crate::admission::Queue>,
    /// Without a queue: the books live resizing keeps (`gpuvisor budget`).
    holdings: Option<gpuvisor_core::plan::resize::Holdings>,
    /// Set when the machine finishes, for queued jobs.
    makespan_ms: Option<u64>,
    /// Names of the processes added while the job runs (`gpuvisor queue add`).
    added: Vec<String>,
    /// The sampler's inputs, refilled each tick.
    tick_inputs: sample_loop::TickInputs,
    /// Replicas whose exit waits to be classified ([`Track::pending_exit`] is set): the
    /// event loop looks at these on each wake-up, not at every replica.
    exiting: std::collections::BTreeSet<usize>,
    /// Each running replica's index by its keeper's pid (what the reaper reports).
    replica_of_pid: std::collections::HashMap<i32, usize>,
}

/// How long an exit waits for the replica's pipes to close (to read its last lines).
const TAIL_WAIT: Duration = Duration::from_millis(500);

mod budget;
mod main_loop;
mod queue;
mod sample_loop;
mod start;
