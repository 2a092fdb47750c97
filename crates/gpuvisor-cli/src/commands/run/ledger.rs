//! What `run` plugs into the supervisor when the shim enforces budgets: one ledger for the job
//! with one budget group per replica (group index = replica index), the shim's environment
//! for each start, ledger snapshots turned into `ps` figures and `denial` / `violation` events,
//! and the ledger removed at the end.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use gpuvisor_core::inventory::Inventory;
use gpuvisor_core::plan::Plan;
use gpuvisor_core::spec::DeviceKind;
use gpuvisor_ledger::{
    DeviceInfo, EventKind, GroupConfig, Ledger, LimitKind, ENV_CHILDREN_CPU_ONLY, ENV_CPU_ONLY,
    ENV_GROUP, ENV_LEDGER, ENV_ROOT_PID, NO_LIMIT,
};
use gpuvisor_supervisor::events::Event;
use gpuvisor_supervisor::supervisor::{GpuSample, GpuUsage, Hooks};

use crate::failure::Failure;

/// The ledger side of a run.
pub struct LedgerHooks {
    ledger: Option<Ledger>,
    path: PathBuf,
    /// `LD_PRELOAD` for every replica (the shim first); `None` when there is no shim (then only
    /// the ledger exists).
    preload: Option<OsString>,
    /// Extra variables for every replica (the simulator's, with `--simulate`).
    extra_env: Vec<(String, Option<String>)>,
    /// Files to remove at the end (the simulator's state).
    files: Vec<PathBuf>,
    labels: Vec<String>,
    cpu_only: Vec<bool>,
    children_cpu_only: Vec<bool>,
    /// The NVML index of each ledger device, so events name GPUs as everything else does.
    device_gpus: Vec<u32>,
    next_event: u64,
}

impl LedgerHooks {
    /// Creates the ledger at `path` for `plan`: its GPUs, then the machine's other GPUs
    /// (outside `[gpus] devices`), and a group per replica whose limit on each of the
    /// replica's GPUs is its budget and 0 on every other one, so a process that makes another
    /// GPU visible again is refused there instead of escaping its budget.
    pub fn create(
        plan: &Plan,
        inventory: &Inventory,
        path: &Path,
        preload: Option<OsString>,
        extra_env: Vec<(String, Option<String>)>,
        files: Vec<PathBuf>,
    ) -> Result<LedgerHooks, Failure> {
        let planned = plan
            .gpus
            .iter()
            .map(|gpu| (gpu.index, &gpu.uuid, gpu.total_bytes));
        let fenced = inventory
            .gpus
            .iter()
            .filter(|gpu| !plan.gpus.iter().any(|planned| planned.uuid == gpu.uuid))
            .map(|gpu| (gpu.index, &gpu.uuid, gpu.total_bytes));
        let (device_gpus, devices): (Vec<u32>, Vec<DeviceInfo>) = planned
            .chain(fenced)
            .map(|(index, uuid, total_bytes)| {
                let device = DeviceInfo {
                    uuid: uuid.clone(),
                    total_bytes,
                };
                (index, device)
            })
            .unzip();
        let groups: Vec<GroupConfig> = plan
            .replicas
            .iter()
            .map(|replica| {
                let limit_bytes = devices
                    .iter()
                    .map(|device| {
                        if replica.gpus.iter().any(|placed| placed.uuid == device.uuid) {
                            replica.budget_bytes
                        } else {
                            0
                        }
                    })
                    .collect();
                GroupConfig {
                    name: replica.label(),
                    limit_bytes,
                    per_process_limit_bytes: vec![NO_LIMIT; devices.len()],
                    cpu_only: replica.device == DeviceKind::Cpu,
                    children_cpu_only: replica.children_cpu_only,
                }
            })
            .collect();
        let ledger = Ledger::create(path, &devices, &groups).map_err(|error| {
            Failure::unavailable(format!(
                "cannot create the ledger {}: {error}\n  hint: /dev/shm must be writable; or set `enforce = \"framework\"` in [job]",
                path.display()
            ))
        })?;
        Ok(LedgerHooks {
            ledger: Some(ledger),
            path: path.to_path_buf(),
            preload,
            extra_env,
            files,
            labels: plan
                .replicas
                .iter()
                .map(|replica| replica.label())
                .collect(),
            cpu_only: groups.iter().map(|group| group.cpu_only).collect(),
            children_cpu_only: groups.iter().map(|group| group.children_cpu_only).collect(),
            device_gpus,
            next_event: 0,
        })
    }

    /// No ledger (`enforce = "framework"`): only `extra_env` for every replica, and `files` to
    /// remove at the end.
    pub fn env_only(extra_env: Vec<(String, Option<String>)>, files: Vec<PathBuf>) -> LedgerHooks {
        LedgerHooks {
            ledger: None,
            path: PathBuf::new(),
            preload: None,
            extra_env,
            files,
            labels: Vec::new(),
            cpu_only: Vec::new(),
            children_cpu_only: Vec::new(),
            device_gpus: Vec::new(),
            next_event: 0,
        }
    }

    fn label(&self, group: u32) -> String {
        self.labels
            .get(group as usize)
            .cloned()
            .unwrap_or_else(|| format!("group {group}"))
    }

    fn flag(on: bool) -> Option<String> {
        on.then(|| "1".to_string())
    }
}

impl Hooks for LedgerHooks {
    fn before_spawn(&mut self, index: usize) -> std::io::Result<Vec<(String, Option<String>)>> {
        let mut env = self.extra_env.clone();
        let Some(ledger) = &self.ledger else {
            return Ok(env);
        };
        // A restarted replica starts from zero: what its dead processes held is returned.
        ledger.reclaim_dead_in_group(index as u32);
        if let Some(preload) = &self.preload {
            env.push((
                "LD_PRELOAD".into(),
                Some(preload.to_string_lossy().into_owned()),
            ));
        }
        env.push((ENV_LEDGER.into(), Some(self.path.display().to_string())));
        env.push((ENV_GROUP.into(), Some(index.to_string())));
        env.push((ENV_ROOT_PID.into(), None));
        env.push((ENV_CPU_ONLY.into(), Self::flag(self.cpu_only[index])));
        env.push((
            ENV_CHILDREN_CPU_ONLY.into(),
            Self::flag(self.children_cpu_only[index]),
        ));
        Ok(env)
    }

    fn sample(&mut self) -> GpuSample {
        let Some(ledger) = &self.ledger else {
            return GpuSample::default();
        };
        // Per-group totals only: a whole snapshot (every slot and event) each tick was a
        // quarter of the sampler's cost at 100 ms.
        let usage = (0..ledger.group_count() as u32)
            .map(|group| {
                let totals = ledger.group_totals(group);
                Some(GpuUsage {
                    used_bytes: totals.used_bytes,
                    peak_bytes: totals.peak_bytes,
                    denials: totals.denied_count,
                })
            })
            .collect();
        let batch = ledger.events_since(self.next_event);
        self.next_event = batch.next_seq;
        let mut events: Vec<Event> = batch
            .events
            .iter()
            .map(|event| match &event.kind {
                EventKind::AllocationDenied {
                    device,
                    size_bytes,
                    used_bytes,
                    limit_bytes,
                    limit_kind,
                } => Event::new("denial")
                    .with("process", self.label(event.group))
                    .with("pid", event.pid)
                    .with(
                        "device",
                        self.device_gpus
                            .get(*device as usize)
                            .copied()
                            .unwrap_or(*device),
                    )
                    .with("size_bytes", *size_bytes)
                    .with("used_bytes", *used_bytes)
                    .with("limit_bytes", *limit_bytes)
                    .with(
                        "limit",
                        match limit_kind {
                            LimitKind::Process => "process",
                            LimitKind::Group => "replica",
                        },
                    ),
                EventKind::CpuOnlyViolation { executable } => Event::new("violation")
                    .with("process", self.label(event.group))
                    .with("pid", event.pid)
                    .with("executable", executable.clone()),
            })
            .collect();
        if batch.lost > 0 {
            events.push(Event::new("ledger-events-lost").with("count", batch.lost));
        }
        GpuSample { usage, events }
    }

    fn finish(&mut self) -> Vec<Event> {
        for file in &self.files {
            let _ = std::fs::remove_file(file);
        }
        let Some(ledger) = self.ledger.take() else {
            return Vec::new();
        };
        let event = Event::new("clean-up")
            .with("what", "ledger")
            .with("path", self.path.display().to_string());
        match ledger.remove() {
            Ok(()) => vec![event],
            Err(error) => vec![event.with("error", error.to_string())],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuvisor_core::inventory::simulate;
    use gpuvisor_core::spec::parse_job;

    fn plan() -> Plan {
        let job = parse_job(
            Path::new("job.toml"),
            "[process.learner]\ncommand = [\"x\"]\nmemory = \"8GiB\"\n\n[process.worker]\ncommand = [\"y\"]\ndevice = \"cpu\"\n",
        )
        .unwrap();
        gpuvisor_core::plan::plan(&job, &simulate("1x80GiB").unwrap()).unwrap()
    }

    #[test]
    fn the_ledger_gets_a_group_per_replica_and_denials_become_events() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger");
        let mut hooks = LedgerHooks::create(
            &plan(),
            &simulate("1x80GiB").unwrap(),
            &path,
            Some("/lib/shim.so".into()),
            Vec::new(),
            Vec::new(),
        )
        .unwrap();
        let env = hooks.before_spawn(1).unwrap();
        let value = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
        assert_eq!(value("GPUVISOR_GROUP"), Some(Some("1".into())));
        assert_eq!(
            value("GPUVISOR_CPU_ONLY"),
            Some(Some("1".into())),
            "the worker is CPU-only"
        );
        assert!(value("LD_PRELOAD")
            .unwrap()
            .unwrap()
            .starts_with("/lib/shim.so"));
        // A process of the learner's group goes over its 8 GiB budget.
        let ledger = Ledger::open(&path).unwrap();
        let slot = ledger.register_current_process(0).unwrap();
        ledger.charge(slot, 0, 6 << 30).unwrap();
        let denial = ledger.charge(slot, 0, 4 << 30).unwrap_err();
        ledger.record_denial(slot, 4242, 0, 4 << 30, &denial);
        let sample = hooks.sample();
        let learner = sample.usage[0].unwrap();
        assert_eq!(learner.used_bytes, 6 << 30);
        assert_eq!(learner.denials, 1);
        assert_eq!(sample.events.len(), 1);
        assert_eq!(sample.events[0].kind, "denial");
        assert_eq!(sample.events[0].text("process"), Some("learner"));
        assert!(
            hooks.sample().events.is_empty(),
            "each event is reported once"
        );
        let end = hooks.finish();
        assert_eq!(end[0].kind, "clean-up");
        assert!(!path.exists(), "the ledger is removed at the end");
    }
}
