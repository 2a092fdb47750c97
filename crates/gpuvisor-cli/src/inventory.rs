//! The GPU inventory of this machine: NVML when there is a driver, the simulator's otherwise.
//!
//! NVML is loaded at run time (nvml-wrapper dlopens libnvidia-ml.so.1), so this binary starts
//! on a machine with no driver and can say so.

use gpuvisor_core::inventory::{simulate, Gpu, GpuProcess, Inventory, InventorySource};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use crate::failure::Failure;

/// The inventory from `--simulate SPEC` when given, else from NVML.
pub fn load_inventory(simulate_spec: Option<&str>) -> Result<Inventory, Failure> {
    match simulate_spec {
        Some(spec) => simulate(spec).map_err(Failure::bad_input),
        // One line: this is the normal answer on a machine without a GPU.
        None => nvml_inventory().map_err(|error| {
            let reason = match error {
                NvmlError::LibloadingError(_) => "libnvidia-ml.so.1 cannot be loaded".to_string(),
                other => other.to_string(),
            };
            Failure::unavailable(format!(
                "no NVIDIA driver ({reason}); pass --simulate 2x80GiB to use simulated GPUs"
            ))
        }),
    }
}

/// Reads every GPU from NVML.
pub fn nvml_inventory() -> Result<Inventory, NvmlError> {
    nvml_inventory_with(&Nvml::init()?)
}

/// Reads every GPU from an NVML handle already open (`top` keeps one across ticks).
pub fn nvml_inventory_with(nvml: &Nvml) -> Result<Inventory, NvmlError> {
    let driver_version = nvml.sys_driver_version().ok();
    let count = nvml.device_count()?;
    let mut gpus = Vec::with_capacity(count as usize);
    for index in 0..count {
        let device = nvml.device_by_index(index)?;
        let memory = device.memory_info()?;
        // MIG queries fail with NotSupported on GPUs without MIG: that means "off".
        let mig_enabled = device
            .mig_mode()
            .map(|mode| mode.current == 1)
            .unwrap_or(false);
        let processes = device
            .running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .map(|process| GpuProcess {
                pid: process.pid,
                used_bytes: match process.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                },
                name: process_name(process.pid),
            })
            .collect();
        gpus.push(Gpu {
            index,
            uuid: device.uuid()?,
            name: device.name()?,
            total_bytes: memory.total,
            free_bytes: memory.free,
            mig_enabled,
            processes,
        });
    }
    Ok(Inventory {
        source: InventorySource::Nvml,
        driver_version,
        gpus,
    })
}

/// The command name of `pid` from /proc, if visible (it is not for host pids seen from inside
/// a container).
fn process_name(pid: u32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.trim_end().to_string())
}
