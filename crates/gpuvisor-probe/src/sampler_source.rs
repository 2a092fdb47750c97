//! A run's GPU source for its sampler, chosen once per run (the binary asks; gpuvisor-runtime
//! hands it to the supervisor): NVML through the one adapter ([`NvmlGpus`]), or with
//! `--simulate` the simulator's NVML stand-in (its `libnvidia-ml.so.1`, which answers from
//! the simulated machine's shared physical table), so the per-process figures the sampler
//! sums per replica take the real NVML path on CPU too; its state file read directly
//! ([`SimSource`]) where the stand-in cannot be opened.

use crate::gpu_source::{GpuSource, NoGpus, SimDevice, SimSource};
use crate::{procfs, NvmlGpus};

/// Opens the simulator's NVML stand-in in `sim_dir` for the simulated machine of `inventory`
/// whose physical table is `state`. `None` (the caller reads the state file instead) when
/// this process already runs other threads: the stand-in reads the machine from the
/// environment, and changing the environment is only sound single-threaded.
fn open_standin(
    sim_dir: &std::path::Path,
    state: &std::path::Path,
    inventory: &gpuvisor_core::inventory::Inventory,
) -> Option<NvmlGpus> {
    if procfs::own_thread_count() != Some(1) {
        return None;
    }
    // Sound: no other thread exists to read the environment meanwhile (checked above).
    std::env::set_var(
        gpuvisor_core::inventory::SIM_GPUS_ENV,
        inventory.sim_env_value(),
    );
    std::env::set_var(SIM_STATE_ENV, state);
    NvmlGpus::open_library(&sim_dir.join("libnvidia-ml.so.1"))
        .ok()?
        .for_sampling()
}

/// The simulator's state file as the GPU source, for `--simulate`.
pub fn simulator_source(
    state: std::path::PathBuf,
    inventory: &gpuvisor_core::inventory::Inventory,
) -> SimSource {
    let devices = inventory
        .gpus
        .iter()
        .map(|gpu| SimDevice {
            uuid: gpu.uuid.clone(),
            total_bytes: gpu.total_bytes,
            foreign_bytes: gpu.total_bytes.saturating_sub(gpu.free_bytes),
        })
        .collect();
    SimSource::new(state, devices)
}

/// The simulator's state file variable (the stand-in reads it).
const SIM_STATE_ENV: &str = "GPUVISOR_SIM_STATE";

/// The sampler's GPU source: with `--simulate` (`sim_state` given) the simulator's NVML
/// stand-in in `sim_dir` (or its state file read directly when the stand-in cannot be
/// opened), else NVML, else none.
pub fn sampler_source(
    sim_state: Option<std::path::PathBuf>,
    sim_dir: Option<&std::path::Path>,
    inventory: &gpuvisor_core::inventory::Inventory,
) -> Box<dyn GpuSource> {
    match sim_state {
        Some(state) => match sim_dir.and_then(|dir| open_standin(dir, &state, inventory)) {
            Some(source) => Box::new(source),
            None => Box::new(simulator_source(state, inventory)),
        },
        None => match NvmlGpus::open().ok().and_then(NvmlGpus::for_sampling) {
            Some(source) => Box::new(source),
            None => Box::new(NoGpus),
        },
    }
}
