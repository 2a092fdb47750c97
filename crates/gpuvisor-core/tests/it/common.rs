//! Builds [`JobSpec`]s in code for the planner tests, with a rendered job-file text whose spans
//! are real, so plan-time diagnostics point at the right line.

#![allow(dead_code)] // Each test crate uses a different part of the builder.

use std::collections::BTreeMap;
use std::path::PathBuf;

use gpuvisor_core::inventory::{simulated_uuid, Gpu, GpuProcess, Inventory, InventorySource};
use gpuvisor_core::size::{parse_size, MIB};
use gpuvisor_core::spec::{
    Command, DeviceKind, DeviceSelector, Enforcement, Framework, GpuSection, JobSpec, MemoryAsk,
    Placement, ProcessSpec, RestartSpec, Span, StopSpec,
};

/// A job under construction.
#[derive(Debug, Clone)]
pub struct JobBuilder {
    pub name: String,
    pub reserve_bytes: u64,
    pub context_overhead_bytes: u64,
    pub placement: Placement,
    pub devices: Option<Vec<DeviceSelector>>,
    pub processes: Vec<ProcessBuilder>,
}

/// One `[process.NAME]` under construction.
#[derive(Debug, Clone)]
pub struct ProcessBuilder {
    pub name: String,
    pub memory: Option<MemoryAsk>,
    pub device: DeviceKind,
    pub replicas: u32,
    pub gpus: Option<u32>,
    pub framework: Framework,
    pub command: Command,
    pub env: BTreeMap<String, String>,
    pub after: Vec<String>,
}

/// An empty job: no reserve, 500 MiB context overhead, pack.
pub fn job() -> JobBuilder {
    JobBuilder {
        name: "test".to_string(),
        reserve_bytes: 0,
        context_overhead_bytes: 500 * MIB,
        placement: Placement::Pack,
        devices: None,
        processes: Vec::new(),
    }
}

/// `"12GiB"`, `"30%"`, `"rest"`, `"cpu"` (a CPU-only process) or `"none"` (a GPU process with no
/// `memory`).
pub fn parse_memory(memory: &str) -> (DeviceKind, Option<MemoryAsk>) {
    match memory {
        "cpu" => (DeviceKind::Cpu, None),
        "none" => (DeviceKind::Gpu, None),
        "rest" => (DeviceKind::Gpu, Some(MemoryAsk::Rest)),
        pct if pct.ends_with('%') => (
            DeviceKind::Gpu,
            Some(MemoryAsk::Percent(
                pct.trim_end_matches('%').parse().expect("a percent"),
            )),
        ),
        size => (
            DeviceKind::Gpu,
            Some(MemoryAsk::Bytes(parse_size(size).expect("a size"))),
        ),
    }
}

fn memory_text(memory: MemoryAsk) -> String {
    match memory {
        MemoryAsk::Bytes(bytes) => format!("\"{bytes}\""),
        MemoryAsk::Percent(pct) => format!("\"{pct}%\""),
        MemoryAsk::Rest => "\"rest\"".to_string(),
    }
}

impl JobBuilder {
    pub fn reserve(mut self, size: &str) -> Self {
        self.reserve_bytes = parse_size(size).unwrap();
        self
    }

    pub fn overhead(mut self, size: &str) -> Self {
        self.context_overhead_bytes = parse_size(size).unwrap();
        self
    }

    pub fn spread(mut self) -> Self {
        self.placement = Placement::Spread;
        self
    }

    pub fn devices(mut self, devices: Vec<DeviceSelector>) -> Self {
        self.devices = Some(devices);
        self
    }

    /// Adds a process running `python NAME.py --id {replica}` with one replica on one GPU.
    pub fn process(mut self, name: &str, memory: &str) -> Self {
        let (device, memory) = parse_memory(memory);
        self.processes.push(ProcessBuilder {
            name: name.to_string(),
            memory,
            device,
            replicas: 1,
            gpus: None,
            framework: Framework::None,
            command: Command::Argv(vec![
                "python".to_string(),
                format!("{name}.py"),
                "--id".to_string(),
                "{replica}".to_string(),
            ]),
            env: BTreeMap::new(),
            after: Vec::new(),
        });
        self
    }

    fn last(&mut self) -> &mut ProcessBuilder {
        self.processes.last_mut().expect("add a process first")
    }

    /// Replicas of the last process.
    pub fn replicas(mut self, replicas: u32) -> Self {
        self.last().replicas = replicas;
        self
    }

    /// GPUs per replica of the last process.
    pub fn gpus(mut self, gpus: u32) -> Self {
        self.last().gpus = Some(gpus);
        self
    }

    pub fn framework(mut self, framework: Framework) -> Self {
        self.last().framework = framework;
        self
    }

    pub fn shell(mut self, script: &str) -> Self {
        self.last().command = Command::Shell(script.to_string());
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.last().env.insert(name.to_string(), value.to_string());
        self
    }

    pub fn after(mut self, name: &str) -> Self {
        self.last().after.push(name.to_string());
        self
    }

    /// Renders the job file text and the validated spec with spans into it.
    pub fn build(self) -> JobSpec {
        let mut source = format!("[job]\nname = \"{}\"\n\n[gpus]\n", self.name);
        let span_of_line = |source: &mut String, line: String| -> Span {
            let start = source.len();
            source.push_str(&line);
            let span = Span::from_range(source, start, source.len());
            source.push('\n');
            span
        };
        let devices_span = self.devices.as_ref().map(|devices| {
            let items: Vec<String> = devices
                .iter()
                .map(|device| match device {
                    DeviceSelector::Index(index) => index.to_string(),
                    DeviceSelector::Uuid(uuid) => format!("\"{uuid}\""),
                })
                .collect();
            span_of_line(&mut source, format!("devices = [{}]", items.join(", ")))
        });
        source.push_str(&format!("reserve = \"{}\"\n", self.reserve_bytes));
        let mut processes = Vec::new();
        for process in self.processes {
            source.push('\n');
            let span = span_of_line(&mut source, format!("[process.{}]", process.name));
            source.push_str("command = [\"python\"]\n");
            let memory_span = match process.memory {
                Some(memory) => {
                    span_of_line(&mut source, format!("memory = {}", memory_text(memory)))
                }
                None => span,
            };
            if process.device == DeviceKind::Cpu {
                source.push_str("device = \"cpu\"\n");
            }
            if process.replicas != 1 {
                source.push_str(&format!("replicas = {}\n", process.replicas));
            }
            let gpus_span = match process.gpus {
                Some(gpus) => span_of_line(&mut source, format!("gpus = {gpus}")),
                None => span,
            };
            processes.push(ProcessSpec {
                name: process.name,
                span,
                command: process.command,
                command_span: span,
                cwd: None,
                cwd_span: span,
                env: process.env,
                replicas: process.replicas,
                framework: process.framework,
                device: process.device,
                gpus_per_replica: process.gpus.unwrap_or(1),
                gpus_span,
                memory: process.memory,
                memory_span,
                auto_memory: false,
                preallocate: true,
                children_cpu_only: false,
                ready: gpuvisor_core::spec::ReadyWhen::Started,
                direct_logs: false,
                after: process.after,
                restart: RestartSpec::default(),
                stop: StopSpec::default(),
                watch: Default::default(),
                nodes: Default::default(),
                nodes_span: span,
                distributed: false,
            });
        }
        JobSpec {
            path: PathBuf::from("job.toml"),
            source,
            name: self.name,
            enforcement: Enforcement::Shim,
            gpus: GpuSection {
                devices: self.devices,
                devices_span,
                reserve_bytes: self.reserve_bytes,
                context_overhead_bytes: self.context_overhead_bytes,
                placement: self.placement,
                headroom_alarm_bytes: None,
            },
            sample_interval_ms: 500,
            processes,
            cluster: Default::default(),
            nccl: Default::default(),
            warnings: Vec::new(),
            admission: Default::default(),
        }
    }
}

/// An inventory of GPUs with the given (total, used) bytes; used memory is held by a made-up
/// foreign process (pid 4242 + index).
pub fn inventory(devices: &[(u64, u64)]) -> Inventory {
    let gpus = devices
        .iter()
        .enumerate()
        .map(|(index, &(total_bytes, used_bytes))| {
            let index = index as u32;
            Gpu {
                index,
                uuid: simulated_uuid(index),
                name: format!("Test GPU {index}"),
                total_bytes,
                free_bytes: total_bytes - used_bytes.min(total_bytes),
                mig_enabled: false,
                processes: if used_bytes > 0 {
                    vec![GpuProcess {
                        pid: 4242 + index,
                        used_bytes: Some(used_bytes),
                        name: Some("foreign".to_string()),
                    }]
                } else {
                    Vec::new()
                },
            }
        })
        .collect();
    Inventory {
        source: InventorySource::Simulated("test".to_string()),
        driver_version: None,
        gpus,
    }
}
