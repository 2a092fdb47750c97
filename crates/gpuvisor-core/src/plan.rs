//! The budget planner: a pure, deterministic function from a job and an inventory to a plan.
//!
//! Memory model, per GPU:
//!
//! ```text
//! usable    = total - reserve - foreign        (foreign = total - free when planning)
//! footprint = budget + context_overhead        (per process per GPU)
//! sum of footprints <= usable                  (never over-committed)
//! ```
//!
//! Only the GPUs allowed by `[gpus] devices` (all of them when absent) are used, in index order.
//! Memory held by anyone when the plan is made counts as foreign; the plan warns with the pids
//! of the processes that hold it (and about 1 GiB or more that no listed process holds; less
//! than that is the driver's own and only shows in the arithmetic).
//!
//! - `memory = "12GiB"`: budget = 12 GiB (what the process may allocate; what it sees as its
//!   device under the shim); its context overhead is charged on top.
//! - `memory = "30%"`: footprint = 30% of that GPU's usable memory (rounded down to a byte), so
//!   budget = footprint - overhead; a GPU where that is not positive cannot take the replica. A
//!   multi-GPU replica gets the same budget on each of its GPUs: the smallest of the per-GPU
//!   budgets, its footprint (budget + overhead) charged on each.
//! - `memory = "rest"` (also a GPU process that gives no `memory`): what is left on that GPU
//!   after the fixed asks, shared equally among that GPU's rest-takers, budget = share -
//!   overhead, at least [`MIN_REST_BUDGET_BYTES`].
//! - CPU-only processes get no GPU, budget 0 and footprint 0.
//!
//! Order of placement:
//!
//! 1. Fixed asks (bytes and percent), in file order, replicas in order. `pack` takes the k
//!    lowest-index GPUs with room (k = `gpus` per replica); `spread` takes the k GPUs with the
//!    most memory left (ties: lowest index). "Room" means the footprint fits in what is left.
//! 2. Rest-takers, in file order, replicas in order: each goes to the k GPUs where its
//!    prospective share, (left after fixed asks) / (rest-takers there + 1), is largest (ties:
//!    lowest index). A GPU whose prospective share would be below `MIN_REST_BUDGET_BYTES` +
//!    overhead is skipped, so every share placed stays above the minimum.
//! 3. Rest budgets. On its own, a GPU's share is `floor(left / takers)`. Rest-takers linked
//!    through multi-GPU rest-takers (GPUs a and b share a component when some rest-taker uses
//!    both) all get the same share: the smallest per-GPU share in their component. So every
//!    rest-taker on a GPU gets an equal share, a multi-GPU rest-taker gets the same share on
//!    each of its GPUs, and no GPU is over-committed (memory a smaller share leaves unused stays
//!    free). With only single-GPU rest-takers each GPU is independent.
//!
//! The placed devices of a replica are listed in index order. A job that does not fit is a
//! [`PlanError::Infeasible`] that shows each GPU's arithmetic and a hint; a job that names
//! devices this machine lacks (or wants more GPUs per replica than it may use) is a
//! [`PlanError::Spec`] pointing into the job file. The same input always gives the same plan
//! (no hash-map order anywhere in it).

mod devices;
mod explain;
mod hint;
mod place;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use crate::inventory::Inventory;
use crate::spec::{DeviceKind, Diagnostic, Enforcement, Framework, JobSpec};

/// The smallest budget a `rest` share may leave a process; below it the plan is refused.
pub const MIN_REST_BUDGET_BYTES: u64 = 256 << 20;

/// A job placed on GPUs, with a budget for every replica.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// The job's name.
    pub job: String,
    /// How budgets are enforced.
    pub enforcement: Enforcement,
    /// Every GPU the job may use, with its arithmetic.
    pub gpus: Vec<PlannedGpu>,
    /// Every replica of every process, in file order then replica order.
    pub replicas: Vec<PlannedReplica>,
    /// Things the user should know (foreign processes holding memory, ...).
    pub warnings: Vec<String>,
}

/// One GPU's arithmetic in a plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedGpu {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Model name.
    pub name: String,
    /// Physical memory.
    pub total_bytes: u64,
    /// Kept free by `[gpus] reserve`.
    pub reserve_bytes: u64,
    /// Held by processes outside the job when the plan was made.
    pub foreign_bytes: u64,
    /// total - reserve - foreign.
    pub usable_bytes: u64,
    /// Sum of the footprints (budget + context overhead) of the replicas placed here.
    pub committed_bytes: u64,
}

/// One replica of one process, placed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedReplica {
    /// The process's name.
    pub process: String,
    /// 0-based replica number.
    pub replica: u32,
    /// How many replicas the process has (for `name[replica]` display: a single replica shows
    /// as `name`).
    pub replicas: u32,
    /// Its framework.
    pub framework: Framework,
    /// GPU or CPU-only.
    pub device: DeviceKind,
    /// JAX: whether XLA preallocates.
    pub preallocate: bool,
    /// Refuse CUDA to its descendants.
    pub children_cpu_only: bool,
    /// Its GPUs (empty for CPU-only).
    pub gpus: Vec<PlacedDevice>,
    /// What it may allocate on each of its GPUs (0 for CPU-only).
    pub budget_bytes: u64,
    /// budget + context overhead, charged on each of its GPUs (0 for CPU-only).
    pub footprint_bytes: u64,
    /// Its argv with `{replica}` substituted (`["/bin/sh", "-c", ...]` for shell commands).
    pub argv: Vec<String>,
    /// Working directory.
    pub cwd: Option<PathBuf>,
    /// The user's `env`, `{replica}` substituted.
    pub user_env: BTreeMap<String, String>,
    /// Processes it waits for.
    pub after: Vec<String>,
}

/// A device as a replica sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlacedDevice {
    /// NVML index.
    pub index: u32,
    /// UUID (what CUDA_VISIBLE_DEVICES gets).
    pub uuid: String,
    /// Physical memory of the device.
    pub total_bytes: u64,
}

impl PlannedReplica {
    /// `name` for a single-replica process, `name[3]` otherwise.
    pub fn label(&self) -> String {
        if self.replicas > 1 {
            format!("{}[{}]", self.process, self.replica)
        } else {
            self.process.clone()
        }
    }
}

/// Why a job cannot be planned on an inventory.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// The job does not fit: the arithmetic for each GPU is in the message.
    #[error("{message}\n  hint: {hint}")]
    Infeasible {
        /// What does not fit, with the per-GPU arithmetic.
        message: String,
        /// What to change.
        hint: String,
    },
    /// The job file asks for something this inventory cannot have (a device that does not
    /// exist, more GPUs per replica than exist); points into the job file.
    #[error("{0}")]
    Spec(Box<Diagnostic>),
}

/// Places every replica of `job` on the GPUs of `inventory` and gives each a budget.
/// Deterministic: the same input gives the same plan.
pub fn plan(job: &JobSpec, inventory: &Inventory) -> Result<Plan, PlanError> {
    place::plan(job, inventory)
}
