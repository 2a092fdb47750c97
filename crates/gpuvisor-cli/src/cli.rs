//! The command line, as clap types. Help text comes from these doc comments.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use clap_complete::Shell;

/// The version `--version` prints: `0.1.0 (git abc1234 2026-11-22)`, the revision and commit
/// date recorded by build.rs (`git unknown` outside a git checkout).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("GPUVISOR_VERSION_DETAIL"),
    ")"
);

/// Share NVIDIA GPUs between processes without out-of-memory crashes: plan per-process
/// memory budgets, start each process with the right settings for its framework, enforce the
/// budgets, and show who holds what.
#[derive(Debug, Parser)]
#[command(
    name = "gpuvisor",
    version = VERSION,
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// gpuvisor's commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the plan for a job file: which GPU each process gets, its budget and its
    /// environment. Starts nothing.
    Plan(PlanArgs),
    /// List the GPUs of this machine (or a simulated set) with memory and the processes
    /// already holding it.
    Gpus(GpusArgs),
    /// Name the failure in a log, a run directory's logs or standard input: the cause, the
    /// evidence lines, the fix and a confidence.
    Explain(ExplainArgs),
    /// Check this machine for what would break a job: driver, GPUs, framework builds,
    /// /dev/shm, free disk and conflicting environment variables.
    Doctor(DoctorArgs),
    /// Run a command under a GPU memory budget: the shim enforces it on the command and every
    /// process it starts; a summary (peak per process, refusals) is printed when it exits.
    Exec(ExecArgs),
    /// Watch a run live: per GPU memory by process against budgets and utilisation, the
    /// process table, events and log tails; restart or stop processes. Without RUN: every
    /// process holding GPU memory on this machine.
    Top(TopArgs),
    /// Internal: how `exec` starts its command (unblocks signals, then execs it).
    #[command(name = "__exec-child", hide = true)]
    ExecChild(ExecChildArgs),
    /// Run a job: start every process with its budget, in dependency order; restart by
    /// policy; stop everything on Ctrl-C. Records everything in a run directory.
    Run(RunArgs),
    /// Render a run as one self-contained HTML page: memory over time per GPU against
    /// budgets, events on a timeline, exits, and what went wrong.
    Report(ReportArgs),
    /// Show the processes of a run (the latest in ./runs by default).
    Ps(PsArgs),
    /// Stop a whole run, or one of its processes.
    Stop(StopArgs),
    /// Restart one process of a run.
    Restart(RestartArgs),
    /// Print the logs of a run's processes merged in time order, each line prefixed with its
    /// replica; `-f` follows them until the run ends.
    Logs(LogsArgs),
    /// Follow the console of a running job (one started with `run --detach`): its output and
    /// gpuvisor's lines until it ends, then its summary; `--tui` for the live view.
    Attach(AttachArgs),
    /// The admission queue of a running job with `admission = "queue"`: list it, or take a
    /// replica out of it.
    Queue(QueueArgs),
    /// Change a running replica's GPU budget (only new allocations see it; lowered below its
    /// use, it keeps its memory and is refused growth).
    Budget(BudgetArgs),
    /// Internal: the per-replica keeper `run` puts between itself and each process.
    #[command(name = "__keeper", hide = true)]
    Keeper(KeeperArgs),
    /// Internal: the per-node agent of a multi-node run (started by `run` through srun).
    #[command(name = "__agent", hide = true)]
    Agent(AgentArgs),
    /// Submit a job to Slurm: write its batch script (one `gpuvisor run` that starts an agent
    /// on every node) and hand it to sbatch, with the sbatch options that follow the job file.
    Submit(SubmitArgs),
    /// Install, list or remove Jupyter kernels that run inside a GPU memory budget (each
    /// kernel starts under `gpuvisor exec`).
    Kernel(KernelArgs),
    /// Write the example job files into a directory (default ./gpuvisor-examples), for
    /// installs without the repository (pip).
    Examples(ExamplesArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to standard
    /// output.
    Completions(CompletionsArgs),
    /// Print gpuvisor's man page (roff) to standard output, or write one page per command
    /// into a directory.
    Man(ManArgs),
}

/// Where GPU information comes from.
#[derive(Debug, Args)]
pub struct InventoryArgs {
    /// Use simulated GPUs instead of the real ones, e.g. `2x80GiB`, `h100,h100`,
    /// `a100-40gb:used=10GiB`. Also read from $GPUVISOR_SIMULATE.
    #[arg(long, value_name = "SPEC", env = "GPUVISOR_SIMULATE")]
    pub simulate: Option<String>,
}

/// Arguments of `gpuvisor plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The job file (TOML).
    pub job: PathBuf,
    /// Print the plan as JSON (with every replica's environment).
    #[arg(long, conflicts_with = "env")]
    pub json: bool,
    /// Print `export` lines for one replica, e.g. `learner` or `actor[2]`, to source by hand.
    #[arg(long, value_name = "PROCESS[REPLICA]")]
    pub env: Option<String>,
    /// Plan a job over several nodes, each with the same GPUs: a Slurm host list
    /// (`n1,n2,n3`, `n[1-3]`) or a count (`3`: node0, node1, node2). Shows each node's plan,
    /// the rendezvous worlds and the NCCL variables.
    #[arg(long, value_name = "HOSTLIST|COUNT")]
    pub nodes: Option<String>,
    /// Right-size from a recorded run: print a job-file patch with each process's `memory`
    /// from its measured peak (and `context_overhead` from the measured untracked memory).
    #[arg(long, value_name = "RUN", conflicts_with_all = ["json", "env", "nodes"])]
    pub from_run: Option<PathBuf>,
    /// With --from-run: how much to add to each measured peak.
    #[arg(
        long,
        value_name = "PERCENT",
        default_value = "10%",
        requires = "from_run"
    )]
    pub margin: String,
    /// GPU source.
    #[command(flatten)]
    pub inventory: InventoryArgs,
}

/// Arguments of `gpuvisor gpus`.
#[derive(Debug, Args)]
pub struct GpusArgs {
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
    /// GPU source.
    #[command(flatten)]
    pub inventory: InventoryArgs,
}

/// Arguments of `gpuvisor explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// A log file, a run directory (or its name under runs/), or `-` for standard input
    /// (the default when input is piped).
    #[arg(value_name = "FILE|RUN|-")]
    pub input: Option<String>,
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `gpuvisor doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
    /// A path whose free disk space to check (repeatable); default: the current directory.
    #[arg(long = "path", value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// The Python interpreter whose frameworks (jax, torch, tensorflow) to check.
    #[arg(long, value_name = "PYTHON", default_value = "python3")]
    pub python: String,
    /// Seconds to wait for the Python check.
    #[arg(long, value_name = "SECONDS", default_value_t = 8)]
    pub python_timeout: u64,
    /// GPU source.
    #[command(flatten)]
    pub inventory: InventoryArgs,
}

/// Arguments of `gpuvisor exec`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  gpuvisor exec --mem-per-process 12GiB -- python parallel.py\n  gpuvisor exec --simulate 1x80GiB --mem 20GiB -- ./train.sh"
)]
pub struct ExecArgs {
    /// Budget shared by the command and all its descendants, per GPU (e.g. `24GiB`).
    #[arg(long, value_name = "SIZE", conflicts_with = "mem_per_process")]
    pub mem: Option<String>,
    /// Budget for each process of the tree on its own, per GPU (e.g. `12GiB`).
    #[arg(long, value_name = "SIZE")]
    pub mem_per_process: Option<String>,
    /// GPU(s) to run on, by index (comma-separated for several).
    #[arg(long, value_name = "N", value_delimiter = ',', default_value = "0")]
    pub gpu: Vec<u32>,
    /// Refuse CUDA to the command and all its descendants, and list those that try.
    #[arg(long, conflicts_with_all = ["children_cpu_only", "mem", "mem_per_process"])]
    pub cpu_only: bool,
    /// The command may use the GPU; the processes it starts may not (listed if they try).
    #[arg(long)]
    pub children_cpu_only: bool,
    /// Framework whose settings the command gets: jax, torch, tensorflow, cuda or none.
    #[arg(long, value_name = "F", default_value = "none")]
    pub framework: String,
    /// Print the summary as one line of JSON (on stderr) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// GPU source.
    #[command(flatten)]
    pub inventory: InventoryArgs,
    /// The command and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
}

/// Arguments of `gpuvisor top`.
#[derive(Debug, Args)]
#[command(
    after_help = "Keys: ↑/↓ select, s sort, r restart, k stop (both ask first), Enter log focus, ? help, q quit.\nExamples:\n  gpuvisor top                      every GPU process on this machine\n  gpuvisor top runs/isaac-rl-20261122T001500Z\n  gpuvisor top --simulate 2x80GiB --once"
)]
pub struct TopArgs {
    /// The run directory, or its name under ./runs (default: the whole machine, like nvitop).
    pub run: Option<String>,
    /// Print one frame as text and exit (the terminal's size, else 120x40).
    #[arg(long)]
    pub once: bool,
    /// Milliseconds between refreshes.
    #[arg(long = "interval", value_name = "MS", default_value_t = 500)]
    pub interval_ms: u64,
    /// GPU source.
    #[command(flatten)]
    pub inventory: InventoryArgs,
}

/// Arguments of the internal `gpuvisor __exec-child`.
#[derive(Debug, Args)]
pub struct ExecChildArgs {
    /// The command and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
}

/// Arguments of `gpuvisor kernel`.
#[derive(Debug, Args)]
pub struct KernelArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: KernelAction,
}

/// `gpuvisor kernel` actions.
#[derive(Debug, Subcommand)]
pub enum KernelAction {
    /// Write a Jupyter kernelspec whose kernel runs under `gpuvisor exec --mem SIZE`: the
    /// kernel and whatever it spawns share the budget and see it as the device size.
    #[command(
        after_help = "Examples:\n  gpuvisor kernel install --mem 8GiB --framework torch\n  gpuvisor kernel install --mem 20GiB --gpu 1 --name big --python .venv/bin/python"
    )]
    Install(KernelInstallArgs),
    /// List the kernelspecs gpuvisor wrote.
    List(KernelListArgs),
    /// Remove a kernelspec gpuvisor wrote.
    Remove(KernelRemoveArgs),
}

/// Arguments of `gpuvisor kernel install`.
#[derive(Debug, Args)]
pub struct KernelInstallArgs {
    /// Budget of the kernel and all its descendants, per GPU (e.g. `8GiB`).
    #[arg(long, value_name = "SIZE")]
    pub mem: String,
    /// Kernel name (lower-case letters, digits, `.`, `_`, `-`); default `gpuvisor-<SIZE>`.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The name notebooks show; default `Python (SIZE on GPU N, gpuvisor)`.
    #[arg(long, value_name = "TEXT")]
    pub display_name: Option<String>,
    /// GPU(s) the kernel runs on, by index (comma-separated for several).
    #[arg(long, value_name = "N", value_delimiter = ',', default_value = "0")]
    pub gpu: Vec<u32>,
    /// Framework whose settings the kernel gets: jax, torch, tensorflow, cuda or none.
    #[arg(long, value_name = "F", default_value = "none")]
    pub framework: String,
    /// The Python interpreter (with ipykernel) the kernel runs.
    #[arg(long, value_name = "PYTHON", default_value = "python3")]
    pub python: String,
    /// Install under PREFIX/share/jupyter/kernels instead of the user's Jupyter data
    /// directory.
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<PathBuf>,
    /// GPU source (a simulated set is written into the kernel's command).
    #[command(flatten)]
    pub inventory: InventoryArgs,
}

/// Arguments of `gpuvisor kernel list`.
#[derive(Debug, Args)]
pub struct KernelListArgs {
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
    /// Look under PREFIX/share/jupyter/kernels instead of the user's Jupyter data directory.
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<PathBuf>,
}

/// Arguments of `gpuvisor kernel remove`.
#[derive(Debug, Args)]
pub struct KernelRemoveArgs {
    /// The kernel's name.
    pub name: String,
    /// Look under PREFIX/share/jupyter/kernels instead of the user's Jupyter data directory.
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<PathBuf>,
}

/// Arguments of `gpuvisor run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The job file (TOML).
    pub job: PathBuf,
    /// The run directory (default: ./runs/<job>-<UTC time>/). Must be new or empty.
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// When a process counts as ready for the processes `after` it, overriding the job file's
    /// `ready`: `NAME=started` (default),
    /// `NAME=log:REGEX` (a line of its output matches), `NAME=port:PORT` (127.0.0.1:PORT
    /// accepts connections) or `NAME=exit` (it exited with status 0). Repeatable.
    #[arg(long, value_name = "NAME=WHEN")]
    pub ready: Vec<String>,
    /// Do not copy the processes' output to the terminal (the log files still get it all).
    #[arg(long, short)]
    pub quiet: bool,
    /// Serve OpenMetrics / Prometheus metrics at http://ADDR/metrics: `PORT` (on 127.0.0.1)
    /// or a loopback `HOST:PORT`.
    #[arg(long, value_name = "ADDR", value_parser = crate::commands::run::parse_metrics_address)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Show the job's live view (`gpuvisor top`) instead of its output; `q` or Ctrl-C stops
    /// the job.
    #[arg(long, conflicts_with = "quiet")]
    pub tui: bool,
    /// Start the job and return: it runs on without this terminal, its console in
    /// RUN/console.log (`gpuvisor attach RUN` follows it, `gpuvisor stop RUN` stops it).
    #[arg(long, conflicts_with = "tui")]
    pub detach: bool,
    /// When other runs on this machine booked the room the job needs, wait until they end
    /// instead of refusing (docs/queue.md, machine-wide booking).
    #[arg(long, conflicts_with = "detach")]
    pub wait: bool,
    /// Internal: this is a detached run (its console goes to RUN/console.log).
    #[arg(long, hide = true)]
    pub detached: bool,
    /// Inside a Slurm allocation, run on this machine only instead of starting one agent per
    /// node through srun.
    #[arg(long)]
    pub local: bool,
    /// Under Slurm, an extra argument for the srun that starts the agents (repeatable), e.g.
    /// `--srun-arg=--mpi=none`.
    #[arg(long = "srun-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub srun_args: Vec<String>,
    /// GPU source.
    #[command(flatten)]
    pub inventory: InventoryArgs,
}

/// Arguments of `gpuvisor __keeper`.
#[derive(Debug, Args)]
pub struct KeeperArgs {
    /// The supervisor's pid.
    #[arg(long)]
    pub parent: i32,
    /// The command to keep.
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// Arguments of `gpuvisor __agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The head's address, HOST:PORT.
    #[arg(long)]
    pub head: String,
}

/// Arguments of `gpuvisor submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The job file (TOML).
    pub job: PathBuf,
    /// The run directory (default: ./runs/<job>-<UTC time>/); the batch script and Slurm's
    /// output file go there too.
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// Print the batch script and the sbatch command instead of submitting.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not copy the processes' output to Slurm's output file (the logs keep it all).
    #[arg(long, short)]
    pub quiet: bool,
    /// An extra argument for the srun that starts the agents (repeatable), passed on to
    /// `run --srun-arg`.
    #[arg(long = "srun-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub srun_args: Vec<String>,
    /// GPU source (passed on to `run` on the nodes).
    #[command(flatten)]
    pub inventory: InventoryArgs,
    /// Options for sbatch, after the job file and gpuvisor's own options, e.g.
    /// `--nodes=3 --gres=gpu:8 --time=2:00:00` (a `--` before them is accepted too).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "SBATCH ARGS"
    )]
    pub sbatch: Vec<String>,
}

/// Arguments of `gpuvisor ps`.
#[derive(Debug, Args)]
pub struct PsArgs {
    /// The run directory (default: the latest run in ./runs).
    pub run: Option<PathBuf>,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `gpuvisor stop`. Stopping a whole job waits until it is down.
#[derive(Debug, Args)]
pub struct StopArgs {
    /// `[RUN] [PROCESS]`: the run directory (default: the latest in ./runs) and the process to
    /// stop (default: the whole job). A single argument naming a directory is the run.
    #[arg(num_args = 0..=2, value_name = "RUN|PROCESS")]
    pub targets: Vec<String>,
}

/// Arguments of `gpuvisor restart`.
#[derive(Debug, Args)]
pub struct RestartArgs {
    /// `[RUN] PROCESS`: the run directory (default: the latest in ./runs) and the process.
    #[arg(num_args = 1..=2, required = true, value_name = "RUN|PROCESS")]
    pub targets: Vec<String>,
}

/// Arguments of `gpuvisor logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// `[RUN] [NAME...]`: the run directory (default: the latest in ./runs), then processes
    /// (`actor`: all its replicas) or replicas (`actor[2]`); none: every replica.
    #[arg(value_name = "RUN|NAME")]
    pub targets: Vec<String>,
    /// Keep printing new lines as they are written, until the run ends.
    #[arg(long, short)]
    pub follow: bool,
    /// Only the last N lines (of the merged logs) first.
    #[arg(long, short = 'n', value_name = "N")]
    pub lines: Option<usize>,
}

/// Arguments of `gpuvisor attach`.
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The run directory (default: the latest in ./runs).
    pub run: Option<PathBuf>,
    /// The live view (`gpuvisor top RUN`) instead of the console.
    #[arg(long)]
    pub tui: bool,
}

/// Arguments of `gpuvisor queue`.
#[derive(Debug, Args)]
pub struct QueueArgs {
    #[command(subcommand)]
    pub action: QueueAction,
}

/// What to do with the queue.
#[derive(Debug, Subcommand)]
pub enum QueueAction {
    /// Append a replica to the run: it joins the back of the queue and starts when its
    /// budget fits (a CPU-only one starts at once).
    Add {
        /// The run directory (default: the latest run in ./runs).
        run: Option<PathBuf>,
        /// Its budget per GPU, e.g. 20GiB.
        #[arg(long, value_name = "SIZE")]
        mem: Option<String>,
        /// How many GPUs (distinct) it needs.
        #[arg(long, default_value_t = 1)]
        gpus: u32,
        /// Which framework's settings it gets.
        #[arg(long, default_value = "none", value_parser = ["jax", "torch", "tensorflow", "cuda", "none"])]
        framework: String,
        /// CPU-only: no GPU, no room needed.
        #[arg(long, conflicts_with_all = ["mem", "gpus"])]
        cpu: bool,
        /// The name its replicas are counted under: NAME[0], NAME[1], ...
        #[arg(long, default_value = "added")]
        name: String,
        /// The command, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// List the replicas waiting for GPU room, in order, and each GPU's books.
    Ls {
        /// The run directory (default: the latest run in ./runs).
        run: Option<PathBuf>,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Take a queued replica out of the queue (it is stopped where it waits).
    Rm {
        /// `[RUN] REPLICA`: the run directory (default: the latest in ./runs) and the replica's
        /// label, e.g. `seed[7]`.
        #[arg(num_args = 1..=2, required = true, value_name = "RUN|REPLICA")]
        targets: Vec<String>,
    },
}

/// Arguments of `gpuvisor budget`.
#[derive(Debug, Args)]
pub struct BudgetArgs {
    /// `[RUN] REPLICA SIZE`: the run directory (default: the latest in ./runs), the replica
    /// (`actor[2]`, or `learner` for a process of one replica) and its new budget per GPU.
    #[arg(num_args = 2..=3, required = true, value_name = "RUN|REPLICA|SIZE")]
    pub targets: Vec<String>,
}

/// Arguments of `gpuvisor report`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  gpuvisor report runs/isaac-rl-20261121T093000Z\n  gpuvisor report -o /tmp/run.html    # the latest run in ./runs"
)]
pub struct ReportArgs {
    /// The run directory (default: the latest run in ./runs).
    pub run: Option<PathBuf>,
    /// Where to write the page (default: RUN/report.html; `-` for standard output).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Arguments of `gpuvisor examples`.
#[derive(Debug, Args)]
pub struct ExamplesArgs {
    /// Where to write them (created if missing).
    #[arg(default_value = "gpuvisor-examples")]
    pub dir: PathBuf,
}

/// Arguments of `gpuvisor completions`.
#[derive(Debug, Args)]
#[command(
    after_help = "Install, e.g.:\n  bash: gpuvisor completions bash > ~/.local/share/bash-completion/completions/gpuvisor\n  zsh:  gpuvisor completions zsh > ~/.zfunc/_gpuvisor   (with fpath+=~/.zfunc before compinit)\n  fish: gpuvisor completions fish > ~/.config/fish/completions/gpuvisor.fish"
)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: Shell,
}

/// Arguments of `gpuvisor man`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  gpuvisor man | man -l -\n  gpuvisor man --dir ~/.local/share/man/man1"
)]
pub struct ManArgs {
    /// Write gpuvisor.1 and one page per command (gpuvisor-run.1, ...) into this directory
    /// instead of printing gpuvisor.1.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}
