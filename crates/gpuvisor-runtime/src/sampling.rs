//! What a run's sampler is given besides the ledger: the GPU source, handed over beside the
//! run's hooks ([`WithSource`]), and each replica's watch policies and physical alarms from
//! the job file ([`watch_config`]), and the `--metrics` listener its figures are served on
//! ([`bind_metrics`]). Which source a run samples (NVML, the simulator's NVML stand-in, its
//! state file) is gpuvisor-probe's choice (`sampler_source`), which the binary makes for it
//! (see the crate doc).

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use gpuvisor_core::plan::admit::Seat;
use gpuvisor_core::plan::{Plan, PlannedReplica};
use gpuvisor_core::spec::{DeviceKind, Enforcement, JobSpec};
use gpuvisor_probe::gpu_source::GpuSource;
use gpuvisor_supervisor::events::Event;
use gpuvisor_supervisor::physical_watch::{default_untracked_alarm, PhysicalConfig, ReplicaLimits};
use gpuvisor_supervisor::supervisor::{EnvChanges, GpuSample, Hooks};
use gpuvisor_supervisor::watch::{ReplicaPolicy, WatchConfig};

use crate::RuntimeError;

/// The run's hooks (ledger, environment) plus the GPU source handed to the sampler.
pub struct WithSource<H> {
    /// The hooks everything else is delegated to.
    pub inner: H,
    /// Taken by the supervisor at the start.
    pub source: Option<Box<dyn GpuSource>>,
}

impl<H: Hooks> Hooks for WithSource<H> {
    fn before_spawn(&mut self, index: usize) -> std::io::Result<Vec<(String, Option<String>)>> {
        self.inner.before_spawn(index)
    }
    fn sample(&mut self) -> GpuSample {
        self.inner.sample()
    }
    fn gpu_source(&mut self) -> Option<Box<dyn GpuSource>> {
        self.source.take()
    }
    fn finish(&mut self) -> Vec<Event> {
        self.inner.finish()
    }
    fn admit(&mut self, index: usize, seat: &Seat) -> std::io::Result<Option<EnvChanges>> {
        self.inner.admit(index, seat)
    }
    fn add(&mut self, replica: &PlannedReplica) -> std::io::Result<EnvChanges> {
        self.inner.add(replica)
    }
    fn resize(&mut self, index: usize, seat: &Seat) -> std::io::Result<()> {
        self.inner.resize(index, seat)
    }
    fn peak_bytes(&mut self, index: usize) -> Option<u64> {
        self.inner.peak_bytes(index)
    }
}

/// Policies per replica (plan order) from the job file, with the physical alarms' thresholds:
/// each replica's `untracked_alarm` (default max(10% of its budget, 512 MiB); none for
/// CPU-only replicas) and each planned GPU's reserve.
pub fn watch_config(job: &JobSpec, plan: &Plan) -> WatchConfig {
    let (replicas, limits) = plan
        .replicas
        .iter()
        .map(|replica| {
            let process = job.process(&replica.process);
            let watch = process.map(|process| process.watch).unwrap_or_default();
            let cpu_only = replica.device == DeviceKind::Cpu;
            let policy = ReplicaPolicy {
                shim_enforced: plan.enforcement == Enforcement::Shim,
                cpu_only,
                children_cpu_only: replica.children_cpu_only,
                on_budget_exceeded: watch.on_budget_exceeded,
                on_gpu_use: watch.on_gpu_use,
                stall_after: watch.stall_after_ms.map(Duration::from_millis),
            };
            let default = default_untracked_alarm(replica.budget_bytes);
            let limits = ReplicaLimits {
                untracked_alarm_bytes: (!cpu_only)
                    .then(|| watch.untracked_alarm_bytes.unwrap_or(default)),
            };
            (policy, limits)
        })
        .unzip();
    let reserves = plan
        .gpus
        .iter()
        .map(|gpu| (gpu.index, gpu.reserve_bytes))
        .collect();
    WatchConfig {
        replicas,
        headroom_alarm_bytes: job.gpus.headroom_alarm_bytes,
        physical: PhysicalConfig {
            replicas: limits,
            reserves,
        },
    }
}

/// Listens on `--metrics ADDR` before anything is created, so a port in use is bad input that
/// leaves nothing behind.
pub fn bind_metrics(address: SocketAddr) -> Result<Arc<TcpListener>, RuntimeError> {
    let listener = gpuvisor_supervisor::metrics::bind(address, false).map_err(|error| {
        let port = address.port();
        let hint = match error.kind() {
            std::io::ErrorKind::AddrInUse => format!(
                "another program listens on port {port} (`ss -ltnp 'sport = :{port}'` shows which); pick a free port, or --metrics 0 for any (the `metrics` event in events.jsonl names it)"
            ),
            _ => "use a loopback address of this machine, e.g. --metrics 9400".to_string(),
        };
        RuntimeError::Refused {
            what: format!("cannot serve --metrics on {address}: {error}"),
            hint: Some(hint),
        }
    })?;
    Ok(Arc::new(listener))
}
