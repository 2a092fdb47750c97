//! The validated job model. Everything here has passed [`super::parse_job`]: names are unique,
//! `after` names exist and form no cycle, sizes are positive, CPU-only processes ask for no memory.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use super::{ClusterSpec, NcclSpec, NodeSelector, Span};

/// A whole job file, validated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobSpec {
    /// The job file as the user named it (for diagnostics found after parsing).
    #[serde(skip)]
    pub path: PathBuf,
    /// The text of the job file (for diagnostics found after parsing).
    #[serde(skip)]
    pub source: String,
    /// `[job] name`; defaults to the file stem.
    pub name: String,
    /// How budgets are enforced for the whole job (`[job] enforce`).
    pub enforcement: Enforcement,
    /// The `[gpus]` table.
    pub gpus: GpuSection,
    /// `[job] sample_interval`: how often the supervisor samples GPUs and processes, ms
    /// (default 500, at least 50).
    pub sample_interval_ms: u64,
    /// `[process.NAME]` tables in file order.
    pub processes: Vec<ProcessSpec>,
    /// The `[cluster]` table (defaults when absent): multi-node start-up and node failures.
    #[serde(skip_serializing_if = "ClusterSpec::is_default")]
    pub cluster: ClusterSpec,
    /// The `[nccl]` table (empty when absent): NCCL variables for every GPU replica.
    #[serde(skip_serializing_if = "NcclSpec::is_empty")]
    pub nccl: NcclSpec,
    /// What the file may not mean as written (a size's unit, `on_gpu_use = "kill"` with no
    /// restart policy): said by `plan` and `run`, not refused.
    #[serde(skip)]
    pub warnings: Vec<super::Diagnostic>,
    /// `[job] admission`: refuse what does not fit (default), or queue it.
    #[serde(skip_serializing_if = "Admission::is_all")]
    pub admission: Admission,
}

/// `[job] admission`: what happens to replicas that do not fit when the job starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Admission {
    /// Every replica must fit, or the plan is refused.
    #[default]
    All,
    /// What fits starts; the rest wait for room, in order (docs/queue.md).
    Queue,
}

impl Admission {
    /// The default.
    pub fn is_all(&self) -> bool {
        *self == Admission::All
    }
}

/// How a job's budgets hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Enforcement {
    /// `enforce = "shim"` (default): the CUDA-driver shim enforces each budget and reports it as
    /// the device size, so framework fractions are relative to the budget.
    Shim,
    /// `enforce = "framework"`: only the frameworks' own settings; fractions are relative to the
    /// physical device, and nothing stops a process that ignores them.
    Framework,
}

/// The `[gpus]` table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuSection {
    /// `devices`: which GPUs the job may use, by index or UUID; `None` means all of them.
    pub devices: Option<Vec<DeviceSelector>>,
    /// Where `devices` was written, for errors found at plan time.
    pub devices_span: Option<Span>,
    /// `reserve`: bytes kept free on every GPU (default 0).
    pub reserve_bytes: u64,
    /// `context_overhead`: bytes charged per process per GPU for the CUDA context and friends
    /// (default 500 MiB).
    pub context_overhead_bytes: u64,
    /// `placement`: pack (default) or spread.
    pub placement: Placement,
    /// `headroom_alarm`: an event (and a metric) when a GPU's free memory falls below this
    /// many bytes; `None`: no alarm.
    pub headroom_alarm_bytes: Option<u64>,
}

/// One entry of `[gpus] devices`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceSelector {
    /// A device index as NVML numbers them (PCI bus order).
    Index(u32),
    /// A device UUID (`GPU-...` or `MIG-...`).
    Uuid(String),
}

/// How replicas with a fixed ask are spread over GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Fill the lowest-numbered GPU first.
    Pack,
    /// Put each replica on the GPU with the most memory left.
    Spread,
}

/// One `[process.NAME]` table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessSpec {
    /// The table's name (`learner` in `[process.learner]`).
    pub name: String,
    /// Where the `[process.NAME]` table starts.
    pub span: Span,
    /// What to run; `{replica}` is substituted per replica.
    pub command: Command,
    /// Where `command` was written: `run` checks its program and script before anything
    /// starts and points here.
    pub command_span: Span,
    /// Working directory (relative paths are relative to the job file's directory; not set:
    /// the job file's directory).
    pub cwd: Option<PathBuf>,
    /// Where `cwd` was written (or the table, if not written): `run` checks the directory
    /// exists before anything starts and points here when it does not.
    pub cwd_span: Span,
    /// Extra environment; `{replica}` is substituted in values. Wins over generated variables.
    pub env: BTreeMap<String, String>,
    /// How many copies to run (>= 1).
    pub replicas: u32,
    /// Which framework's settings to generate.
    pub framework: Framework,
    /// GPU or CPU-only.
    pub device: DeviceKind,
    /// Devices per replica (>= 1; ignored for CPU-only processes).
    pub gpus_per_replica: u32,
    /// Where `gpus` was written (or the table, if not written).
    pub gpus_span: Span,
    /// Memory per replica per GPU; `None` for CPU-only processes.
    pub memory: Option<MemoryAsk>,
    /// Where `memory` was written (or the table, if not written).
    pub memory_span: Span,
    /// `memory = "auto"` (with `admission = "queue"`): `memory` is then an equal share of the
    /// GPU among the job's GPU processes, the cap of replica 0, which runs first; the others
    /// wait and are admitted at its measured peak plus 10% (docs/queue.md).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub auto_memory: bool,
    /// JAX only: whether XLA preallocates its pool (default true, as JAX does).
    pub preallocate: bool,
    /// Keep the GPU for this replica's own process but refuse CUDA to every process it spawns
    /// (scenario S2: collector workers). Default false.
    pub children_cpu_only: bool,
    /// When its dependants (`after`) may start (default: as soon as it runs).
    pub ready: ReadyWhen,
    /// `logs = "direct"`: it writes its own log files, which gpuvisor only dates (default
    /// false: its output comes through pipes).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub direct_logs: bool,
    /// Names of processes this one waits for.
    pub after: Vec<String>,
    /// The `restart` section.
    pub restart: RestartSpec,
    /// The `stop` section.
    pub stop: StopSpec,
    /// Runtime policies: `on_budget_exceeded`, `on_gpu_use`, `stall_after`, `untracked_alarm`.
    pub watch: WatchSpec,
    /// `nodes`: which nodes of a multi-node job run this process (default all); `replicas`
    /// copies run on each. Ignored on one machine.
    #[serde(skip_serializing_if = "NodeSelector::is_all")]
    pub nodes: NodeSelector,
    /// Where `nodes` was written (or the table, if not written).
    #[serde(skip)]
    pub nodes_span: Span,
    /// `distributed`: the process's replicas over all its nodes form one rendezvous world
    /// (ranks, world size, coordinator in their environment). Default false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub distributed: bool,
}

/// A process's runtime policies (checked by the supervisor's sampler).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WatchSpec {
    /// `on_budget_exceeded`: what to do when its GPU memory passes its budget and the shim
    /// does not enforce it (default warn).
    pub on_budget_exceeded: BudgetAction,
    /// `on_gpu_use`: what to do when a CPU-only process (or, with `children_cpu_only`, a
    /// child) uses a GPU (default warn).
    pub on_gpu_use: GpuUseAction,
    /// `stall_after`: quiet (no output) this long counts as a stall, ms; `None`: never.
    pub stall_after_ms: Option<u64>,
    /// `untracked_alarm`: GPU memory its tree holds that the ledger never charged, past which
    /// an `untracked-memory` event is recorded, bytes; `None`: the default, max(10% of the
    /// budget, 512 MiB).
    pub untracked_alarm_bytes: Option<u64>,
}

/// What to do when a replica's GPU memory passes its budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BudgetAction {
    /// Record an event (the default).
    #[default]
    Warn,
    /// Kill the replica (SIGKILL) and keep it stopped.
    Kill,
    /// Stop it and start it again (counts as a restart).
    Restart,
}

/// What to do when a CPU-only process uses a GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuUseAction {
    /// Record an event (the default).
    #[default]
    Warn,
    /// Kill the offending process (SIGKILL).
    Kill,
}

/// When a process counts as ready, so the processes `after` it may start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadyWhen {
    /// `ready = "started"` (default): as soon as it runs.
    Started,
    /// `ready = "log:REGEX"`: when a line of its output matches the regex.
    LogLine(String),
    /// `ready = "port:PORT"`: when something accepts TCP connections on 127.0.0.1:PORT.
    Port(u16),
    /// `ready = "exit"`: when it exits with status 0 (a set-up step).
    Exit,
}

/// What a process runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Command {
    /// `command = ["python", "train.py"]`: run directly, no shell.
    Argv(Vec<String>),
    /// `command = "python train.py | tee log"` with `shell = true`: run by `/bin/sh -c`.
    Shell(String),
}

/// The framework whose environment variables a process gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Framework {
    /// JAX / XLA.
    Jax,
    /// PyTorch.
    Torch,
    /// TensorFlow.
    Tensorflow,
    /// Plain CUDA (a simulator, a C++ program).
    Cuda,
    /// Nothing framework-specific (the default).
    None,
}

impl Framework {
    /// Every framework, in the order the job file documents them.
    pub const ALL: [Framework; 5] = [
        Framework::Jax,
        Framework::Torch,
        Framework::Tensorflow,
        Framework::Cuda,
        Framework::None,
    ];

    /// The name used in job files and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Framework::Jax => "jax",
            Framework::Torch => "torch",
            Framework::Tensorflow => "tensorflow",
            Framework::Cuda => "cuda",
            Framework::None => "none",
        }
    }
}

/// Whether a process gets a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKind {
    /// It runs on GPUs (the default).
    Gpu,
    /// It must never open a CUDA context.
    Cpu,
}

/// How much GPU memory one replica asks for on each of its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryAsk {
    /// An absolute budget in bytes (`12GiB`): what the process may allocate; its context is
    /// charged on top.
    Bytes(u64),
    /// A share of the GPU's usable memory (`30%`), in (0, 100]: the process's whole footprint,
    /// context included.
    Percent(f64),
    /// An equal share of what is left on the GPU after the fixed asks (`rest`).
    Rest,
}

/// When a process is restarted after it exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// Never (default).
    No,
    /// After a non-zero exit or a signal.
    OnFailure,
    /// After any exit.
    Always,
}

/// `restart = "on-failure"` or a `[process.NAME.restart]` table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RestartSpec {
    /// `policy`.
    pub policy: RestartPolicy,
    /// `max_restarts` within `window` before the process is declared crash-looping (default 5).
    pub max_restarts: u32,
    /// `window` in milliseconds (default 60 s).
    pub window_ms: u64,
    /// `backoff` first delay in milliseconds (default 1 s).
    pub backoff_initial_ms: u64,
    /// `backoff_max` cap in milliseconds (default 60 s).
    pub backoff_max_ms: u64,
    /// `restart_dependents`: restart the processes that are `after` this one with it (default false).
    pub restart_dependents: bool,
    /// `ends_job`: this process's exit (after its restarts are spent) ends the job (default false).
    pub ends_job: bool,
}

impl Default for RestartSpec {
    fn default() -> Self {
        RestartSpec {
            policy: RestartPolicy::No,
            max_restarts: 5,
            window_ms: 60_000,
            backoff_initial_ms: 1_000,
            backoff_max_ms: 60_000,
            restart_dependents: false,
            ends_job: false,
        }
    }
}

/// The `[process.NAME.stop]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StopSpec {
    /// `signal`: the first signal sent to the process group (default `SIGINT`).
    pub signal: String,
    /// `grace`: milliseconds between that signal and SIGKILL (default 10 s).
    pub grace_ms: u64,
}

impl Default for StopSpec {
    fn default() -> Self {
        StopSpec {
            signal: "SIGINT".to_string(),
            grace_ms: 10_000,
        }
    }
}

impl JobSpec {
    /// The process called `name`, if any.
    pub fn process(&self, name: &str) -> Option<&ProcessSpec> {
        self.processes.iter().find(|process| process.name == name)
    }
}
