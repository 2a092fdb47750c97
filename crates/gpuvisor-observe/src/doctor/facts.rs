//! What doctor looked at, as plain data: gathered by [`super::probe`], judged by
//! [`super::checks`]. `None` means "could not be read".

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Everything gathered about the machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Facts {
    /// The driver, or why there is none.
    pub driver: Driver,
    /// The GPUs (empty without a driver).
    pub gpus: Vec<GpuFacts>,
    /// The user running doctor (to tell other users' processes apart).
    pub own_uid: Option<u32>,
    /// Whether an MPS control daemon runs (None: /proc unreadable).
    pub mps_daemon: Option<bool>,
    /// The Python frameworks.
    pub python: Python,
    /// /dev/shm.
    pub shm: Option<Result<FsUsage, String>>,
    /// torch_<pid>_* files in /dev/shm whose creating process is gone: (count, bytes).
    pub shm_leaked: Option<(usize, u64)>,
    /// Free space of the paths asked about.
    pub disks: Vec<(PathBuf, Result<FsUsage, String>)>,
    /// Environment variables that matter to a plan, as set in this shell.
    pub env: Vec<(String, String)>,
}

/// The driver.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Driver {
    /// Not looked at.
    #[default]
    Unknown,
    /// NVML answered.
    Nvml {
        /// e.g. "550.54.15".
        version: String,
        /// The CUDA driver API version, (major, minor), e.g. (12, 4).
        cuda: Option<(u32, u32)>,
    },
    /// A `--simulate` inventory stands in for the GPUs.
    Simulated {
        /// The spec as given.
        spec: String,
    },
    /// No driver (or NVML failed); why.
    Missing {
        /// The reason.
        reason: String,
    },
}

/// One GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GpuFacts {
    /// NVML index.
    pub index: u32,
    /// Marketing name.
    pub name: String,
    /// Total memory.
    pub total_bytes: u64,
    /// Free memory.
    pub free_bytes: u64,
    /// MIG mode on.
    pub mig: Option<bool>,
    /// Persistence mode on.
    pub persistence: Option<bool>,
    /// ECC on.
    pub ecc: Option<bool>,
    /// Uncorrected ECC errors since the driver loaded.
    pub ecc_uncorrected: Option<u64>,
    /// NVML compute mode: "default", "exclusive-process", "prohibited".
    pub compute_mode: Option<String>,
    /// Compute processes holding memory.
    pub processes: Vec<GpuProcessFacts>,
}

/// A process holding GPU memory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GpuProcessFacts {
    /// Pid as the driver reports it.
    pub pid: u32,
    /// Bytes held, when known.
    pub used_bytes: Option<u64>,
    /// Owner, when /proc shows the pid (not for host pids seen from a container).
    pub uid: Option<u32>,
    /// Command name, when visible.
    pub name: Option<String>,
}

/// Size and use of a file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FsUsage {
    /// Size.
    pub total_bytes: u64,
    /// Available to unprivileged users.
    pub available_bytes: u64,
}

impl FsUsage {
    /// Bytes not available.
    pub fn used_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.available_bytes)
    }
}

/// The Python side.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Python {
    /// Not looked at.
    #[default]
    Unknown,
    /// The interpreter is not there.
    NotFound {
        /// The interpreter asked for.
        interpreter: String,
    },
    /// It ran but did not answer usefully.
    Failed {
        /// Why.
        reason: String,
    },
    /// It did not answer in time.
    TimedOut {
        /// The limit.
        seconds: u64,
    },
    /// What it reported.
    Found(PythonInfo),
}

/// What the probe script reports (its JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonInfo {
    /// sys.executable.
    pub executable: String,
    /// e.g. "3.11.9".
    pub version: String,
    /// Installed distributions of interest: name -> version.
    #[serde(default)]
    pub packages: std::collections::BTreeMap<String, String>,
    /// torch.version.cuda read from torch/version.py without importing torch; None for a CPU
    /// build or no torch.
    #[serde(default)]
    pub torch_cuda: Option<String>,
    /// torch.version.hip: set for ROCm builds.
    #[serde(default)]
    pub torch_hip: Option<String>,
    /// tensorflow's build_info cuda_version, read without importing it.
    #[serde(default)]
    pub tensorflow_cuda: Option<String>,
}
