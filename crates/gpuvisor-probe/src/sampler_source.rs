//! The sampler's GPU source, chosen once per run (here, beside the binary's other NVML use;
//! gpuvisor-runtime hands it to the supervisor): NVML through gpuvisor-probe's adapter, or
//! with `--simulate` the simulator's NVML stand-in (its `libnvidia-ml.so.1`, which answers
//! from the simulated machine's shared physical table), so the per-process figures the
//! sampler sums per replica take the real NVML path on CPU too; its state file read directly
//! where the stand-in cannot be opened.

use gpuvisor_probe::gpu_source::{GpuSource, NoGpus, SimDevice, SimSource};
use gpuvisor_probe::{procfs, NvmlGpus};

use crate::failure::Failure;

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

/// The sampler's GPU source: with `--simulate` the simulator's NVML stand-in in `sim_dir`
/// (or its state file read directly when the stand-in cannot be opened), else NVML, else none.
pub fn gpu_source(
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

/// `--metrics ADDR`: `HOST:PORT`, or a bare `PORT` on 127.0.0.1; a loopback address only
/// (checked with the arguments, before anything is created).
pub fn parse_metrics_address(text: &str) -> Result<std::net::SocketAddr, String> {
    let address = match text.parse::<u16>() {
        Ok(port) => std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Err(_) => text.parse().map_err(|_| {
            format!("`{text}` is not PORT or HOST:PORT\n  hint: --metrics 9400 serves on 127.0.0.1:9400")
        })?,
    };
    if !address.ip().is_loopback() {
        return Err(format!(
            "{address} is not a loopback address\n  hint: use 127.0.0.1:PORT (or just PORT); the metrics name your processes and are not authenticated"
        ));
    }
    Ok(address)
}

/// Listens on `--metrics ADDR` before anything is created, so a port in use is bad input that
/// leaves nothing behind.
pub fn bind_metrics(
    address: std::net::SocketAddr,
) -> Result<std::sync::Arc<std::net::TcpListener>, Failure> {
    let listener = gpuvisor_supervisor::metrics::bind(address, false).map_err(|error| {
        let port = address.port();
        let hint = match error.kind() {
            std::io::ErrorKind::AddrInUse => format!(
                "another program listens on port {port} (`ss -ltnp 'sport = :{port}'` shows which); pick a free port, or --metrics 0 for any (the `metrics` event in events.jsonl names it)"
            ),
            _ => "use a loopback address of this machine, e.g. --metrics 9400".to_string(),
        };
        Failure::bad_input(format!(
            "cannot serve --metrics on {address}: {error}\n  hint: {hint}"
        ))
    })?;
    Ok(std::sync::Arc::new(listener))
}
