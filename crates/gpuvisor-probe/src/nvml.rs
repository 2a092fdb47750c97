//! The one NVML adapter: [`NvmlGpus`] holds one NVML handle (the only place gpuvisor opens
//! NVML) and reads it into a [`GpuReading`], either as a sampler tick (one query per device)
//! or as a full read (names, MIG, the processes' command names and, for `doctor`, the modes).
//! As a [`GpuSource`] it does the first for the sampler ([`NvmlGpus::for_sampling`]) and the
//! second for `top` ([`NvmlGpus::for_viewing`]).
//!
//! NVML is loaded at run time (nvml-wrapper dlopens libnvidia-ml.so.1), so a binary using this
//! starts on a machine with no driver and can say so. The simulator's stand-in library is
//! opened the same way by path ([`NvmlGpus::open_library`]), so `--simulate` takes the real
//! NVML code path.

use std::collections::HashMap;
use std::path::Path;

use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use crate::gpu_source::{
    ComputeMode, DeviceModes, DeviceReading, GpuProcessReading, GpuReading, GpuSource,
};
use crate::procfs;

/// Why NVML gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum NvmlUnavailable {
    /// The library is not there (no NVIDIA driver).
    #[error("libnvidia-ml.so.1 cannot be loaded")]
    NoLibrary,
    /// NVML answered with an error.
    #[error("{0}")]
    Nvml(NvmlError),
}

impl From<NvmlError> for NvmlUnavailable {
    fn from(error: NvmlError) -> Self {
        match error {
            NvmlError::LibloadingError(_) => NvmlUnavailable::NoLibrary,
            other => NvmlUnavailable::Nvml(other),
        }
    }
}

/// How much a full read asks each GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadDepth {
    /// What the inventory and `top` show: names, memory, utilisation, MIG, processes.
    Inventory,
    /// That and the modes `doctor` checks (persistence, ECC, compute mode).
    WithModes,
}

/// NVML, opened once: every read goes through this one handle.
pub struct NvmlGpus {
    nvml: Nvml,
    /// `nvml`, or `simulator-nvml` when the library is the simulator's stand-in.
    name: &'static str,
    /// (index, uuid, name) per device, read once by [`NvmlGpus::for_sampling`].
    devices: Vec<(u32, String, String)>,
    /// Per device: the newest process-utilisation sample seen (NVML's µs clock).
    last_seen_us: Vec<u64>,
    /// As a [`GpuSource`]: `None`, sampler ticks ([`NvmlGpus::for_sampling`]); else full reads
    /// this deep ([`NvmlGpus::for_viewing`]).
    full_reads: Option<ReadDepth>,
}

impl std::fmt::Debug for NvmlGpus {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "NvmlGpus({}, {} devices)",
            self.name,
            self.devices.len()
        )
    }
}

impl NvmlGpus {
    /// Opens the driver's NVML (libnvidia-ml.so.1).
    pub fn open() -> Result<NvmlGpus, NvmlUnavailable> {
        Ok(NvmlGpus::with(Nvml::init()?, "nvml"))
    }

    /// Opens the NVML library at `library` (the simulator's stand-in, which answers from the
    /// simulated machine its environment names); the source is called `simulator-nvml`.
    pub fn open_library(library: &Path) -> Result<NvmlGpus, NvmlUnavailable> {
        let nvml = Nvml::builder().lib_path(library.as_os_str()).init()?;
        Ok(NvmlGpus::with(nvml, "simulator-nvml"))
    }

    fn with(nvml: Nvml, name: &'static str) -> NvmlGpus {
        NvmlGpus {
            nvml,
            name,
            devices: Vec::new(),
            last_seen_us: Vec::new(),
            full_reads: None,
        }
    }

    /// Ready for a viewer (`top`): every read is a full read of what the inventory shows
    /// (names, utilisation, the processes with their command names), and a failed read says
    /// why ([`GpuSource::try_read`]).
    pub fn for_viewing(mut self) -> NvmlGpus {
        self.full_reads = Some(ReadDepth::Inventory);
        self
    }

    /// Ready for sampler ticks: every device's identity read once. `None` when NVML cannot
    /// count its devices.
    pub fn for_sampling(mut self) -> Option<NvmlGpus> {
        self.full_reads = None;
        let count = self.nvml.device_count().ok()?;
        self.devices = (0..count)
            .filter_map(|index| {
                let device = self.nvml.device_by_index(index).ok()?;
                Some((
                    index,
                    device.uuid().ok()?,
                    device.name().unwrap_or_default(),
                ))
            })
            .collect();
        self.last_seen_us = vec![0; self.devices.len()];
        Some(self)
    }

    /// The driver version (`550.54.15`).
    pub fn driver_version(&self) -> Result<String, NvmlUnavailable> {
        Ok(self.nvml.sys_driver_version()?)
    }

    /// The CUDA version the driver supports, as (major, minor).
    pub fn cuda_version(&self) -> Option<(u32, u32)> {
        // NVML encodes CUDA 12.4 as 12040.
        let raw = u32::try_from(self.nvml.sys_cuda_driver_version().ok()?).ok()?;
        Some((raw / 1000, (raw % 1000) / 10))
    }

    /// Every GPU in full: identity, memory, utilisation, MIG mode, the processes holding
    /// memory with their command names, and with [`ReadDepth::WithModes`] the modes `doctor`
    /// checks. Fails when a device cannot be named or measured.
    pub fn read_full(&self, depth: ReadDepth) -> Result<GpuReading, NvmlUnavailable> {
        let mut reading = GpuReading::default();
        for index in 0..self.nvml.device_count()? {
            let device = self.nvml.device_by_index(index)?;
            let memory = device.memory_info()?;
            let utilization = device.utilization_rates().ok();
            reading.devices.push(DeviceReading {
                index,
                uuid: device.uuid()?,
                name: Some(device.name()?),
                total_bytes: memory.total,
                used_bytes: memory.used,
                free_bytes: memory.free,
                utilization_percent: utilization.as_ref().map(|u| u.gpu),
                memory_utilization_percent: utilization.as_ref().map(|u| u.memory),
                // NotSupported on GPUs without MIG: that means "off".
                mig_enabled: Some(
                    device
                        .mig_mode()
                        .map(|mode| mode.current == 1)
                        .unwrap_or(false),
                ),
                modes: (depth == ReadDepth::WithModes).then(|| modes(&device)),
            });
            for process in device.running_compute_processes().unwrap_or_default() {
                reading.processes.push(GpuProcessReading {
                    pid: process.pid as i32,
                    device: index,
                    used_bytes: used_bytes(process.used_gpu_memory),
                    utilization_percent: None,
                    // Not visible for host pids seen from inside a container.
                    name: procfs::comm(process.pid as i32),
                });
            }
        }
        Ok(reading)
    }
}

/// The modes `doctor` checks; each unknown where the driver does not say.
fn modes(device: &Device<'_>) -> DeviceModes {
    let ecc = device.is_ecc_enabled().ok();
    DeviceModes {
        persistence: device.is_in_persistent_mode().ok(),
        ecc: ecc.as_ref().map(|state| state.currently_enabled),
        ecc_uncorrected: ecc.filter(|state| state.currently_enabled).and_then(|_| {
            device
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .ok()
        }),
        compute_mode: device.compute_mode().ok().map(|mode| {
            use nvml_wrapper::enum_wrappers::device::ComputeMode as Nvml;
            match mode {
                Nvml::Default => ComputeMode::Default,
                Nvml::ExclusiveThread | Nvml::ExclusiveProcess => ComputeMode::ExclusiveProcess,
                Nvml::Prohibited => ComputeMode::Prohibited,
            }
        }),
    }
}

fn used_bytes(used: UsedGpuMemory) -> Option<u64> {
    match used {
        UsedGpuMemory::Used(bytes) => Some(bytes),
        UsedGpuMemory::Unavailable => None,
    }
}

impl GpuSource for NvmlGpus {
    fn name(&self) -> &'static str {
        self.name
    }

    /// A sampler tick, or for a viewer a full read (empty if it failed).
    fn read(&mut self) -> GpuReading {
        self.try_read().unwrap_or_default()
    }

    fn try_read(&mut self) -> Result<GpuReading, String> {
        match self.full_reads {
            Some(depth) => self
                .read_full(depth)
                .map_err(|error| format!("NVML read failed: {error}")),
            None => Ok(self.tick()),
        }
    }
}

impl NvmlGpus {
    /// One sampler tick: per device memory, utilisation, running compute processes and, where
    /// the driver keeps them, per-process utilisation samples since the last tick.
    fn tick(&mut self) -> GpuReading {
        let mut reading = GpuReading::default();
        for (slot, (index, uuid, name)) in self.devices.iter().enumerate() {
            let Ok(device) = self.nvml.device_by_index(*index) else {
                continue;
            };
            let Ok(memory) = device.memory_info() else {
                continue;
            };
            let utilization = device.utilization_rates().ok();
            reading.devices.push(DeviceReading {
                index: *index,
                uuid: uuid.clone(),
                name: Some(name.clone()),
                total_bytes: memory.total,
                used_bytes: memory.used,
                free_bytes: memory.free,
                utilization_percent: utilization.as_ref().map(|u| u.gpu),
                memory_utilization_percent: utilization.as_ref().map(|u| u.memory),
                mig_enabled: None,
                modes: None,
            });
            // Samples since the last tick; a pid's newest sample wins.
            let mut sm_by_pid: HashMap<u32, u32> = HashMap::new();
            if let Ok(samples) = device.process_utilization_stats(self.last_seen_us[slot]) {
                let mut newest = self.last_seen_us[slot];
                for sample in samples {
                    newest = newest.max(sample.timestamp);
                    sm_by_pid.insert(sample.pid, sample.sm_util);
                }
                self.last_seen_us[slot] = newest;
            }
            for process in device.running_compute_processes().unwrap_or_default() {
                reading.processes.push(GpuProcessReading {
                    pid: process.pid as i32,
                    device: *index,
                    used_bytes: used_bytes(process.used_gpu_memory),
                    // No sample since the last tick: it ran no kernel, so 0 rather than unknown.
                    utilization_percent: Some(sm_by_pid.get(&process.pid).copied().unwrap_or(0)),
                    name: None,
                });
            }
        }
        reading
    }
}
