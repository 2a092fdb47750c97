//! The one reading of the machine's GPUs, and where it comes from behind one trait: NVML on a
//! real machine (or the simulator's NVML stand-in: [`crate::nvml::NvmlGpus`]) and the
//! simulator's shared state file ([`SimSource`]), so the whole sampler is testable without a
//! GPU. `gpus`, `plan`, the sampler, `top` and `doctor` all read a [`GpuReading`]; what each
//! shows is a conversion of it ([`crate::inventory`], and the viewers' own).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// One GPU at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceReading {
    /// The source's index.
    pub index: u32,
    /// `GPU-...`.
    pub uuid: String,
    /// Model name, if known.
    pub name: Option<String>,
    /// Memory size, bytes.
    pub total_bytes: u64,
    /// Memory in use by everyone, bytes (NVML's `used`: without the driver's reserve).
    pub used_bytes: u64,
    /// Memory free, bytes (NVML's `free`; total - free is what anyone can no longer have).
    pub free_bytes: u64,
    /// SM utilisation, percent.
    pub utilization_percent: Option<u32>,
    /// Memory-controller utilisation, percent.
    pub memory_utilization_percent: Option<u32>,
    /// Whether MIG mode is on; read by full reads only (`None` on a sampler tick).
    pub mig_enabled: Option<bool>,
    /// The modes `doctor` checks; read only when asked for.
    pub modes: Option<DeviceModes>,
}

/// A GPU's modes, as `doctor` checks them (each `None` where the driver does not say).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceModes {
    /// Persistence mode.
    pub persistence: Option<bool>,
    /// ECC, currently enabled.
    pub ecc: Option<bool>,
    /// Uncorrected ECC errors since the driver loaded, where ECC is on.
    pub ecc_uncorrected: Option<u64>,
    /// The compute mode.
    pub compute_mode: Option<ComputeMode>,
}

/// Who may create contexts on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeMode {
    /// Any number of processes.
    Default,
    /// One process (NVML's exclusive-thread mode is reported as this too: it is deprecated).
    ExclusiveProcess,
    /// None.
    Prohibited,
}

impl ComputeMode {
    /// `default`, `exclusive-process`, `prohibited`.
    pub fn as_str(self) -> &'static str {
        match self {
            ComputeMode::Default => "default",
            ComputeMode::ExclusiveProcess => "exclusive-process",
            ComputeMode::Prohibited => "prohibited",
        }
    }
}

/// One process holding memory (a context) on one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuProcessReading {
    /// Its pid (in our PID namespace).
    pub pid: i32,
    /// The GPU (source index).
    pub device: u32,
    /// Memory it holds there, bytes; `None` where the driver does not say (in a container).
    pub used_bytes: Option<u64>,
    /// Its SM utilisation there, percent, if the source measures it.
    pub utilization_percent: Option<u32>,
    /// Its command name from /proc; read by full reads only.
    pub name: Option<String>,
}

/// Everything one query returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuReading {
    /// Every GPU.
    pub devices: Vec<DeviceReading>,
    /// Every process with a context on any GPU, device by device.
    pub processes: Vec<GpuProcessReading>,
}

/// A source of GPU figures, for every reader that polls: the supervisor's sampler calls
/// `read` once per tick (one query per device), `top` calls `try_read` once per frame.
pub trait GpuSource: Send {
    /// `nvml`, `simulator`, ...
    fn name(&self) -> &'static str;
    /// The figures now (empty when the source could not read them).
    fn read(&mut self) -> GpuReading;
    /// The figures now, or why the source could not read them (a viewer shows why; the
    /// sampler takes `read`'s empty reading and tries again next tick).
    fn try_read(&mut self) -> Result<GpuReading, String> {
        Ok(self.read())
    }
}

/// The same reading every time: a simulated machine's GPUs as its `--simulate` spec
/// describes them (`top --simulate` without a run: nothing runs on them to change it).
#[derive(Debug, Clone, Default)]
pub struct FixedReading(pub GpuReading);

impl GpuSource for FixedReading {
    fn name(&self) -> &'static str {
        "inventory"
    }
    fn read(&mut self) -> GpuReading {
        self.0.clone()
    }
}

/// No GPU figures (no NVML, no simulator).
#[derive(Debug, Default)]
pub struct NoGpus;

impl GpuSource for NoGpus {
    fn name(&self) -> &'static str {
        "none"
    }
    fn read(&mut self) -> GpuReading {
        GpuReading::default()
    }
}

/// One simulated GPU as the job's inventory describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimDevice {
    /// `GPU-5111a7ed-...`.
    pub uuid: String,
    /// Memory size, bytes.
    pub total_bytes: u64,
    /// Memory used by others (the `used=` part of the simulate spec), bytes.
    pub foreign_bytes: u64,
}

// The simulator's state file layout (crates/gpuvisor-sim/src/physical.rs): 8 header words
// (magic, high-water slot count, ...), then 1024 slots of 1 + 64 little-endian u64 words:
// the owner pid, then bytes held per device.
const SIM_MAGIC: u64 = u64::from_le_bytes(*b"GVSIMST1");
const SIM_HEADER_WORDS: usize = 8;
const SIM_SLOTS: usize = 1024;
const SIM_MAX_DEVICES: usize = 64;
const SIM_SLOT_WORDS: usize = 1 + SIM_MAX_DEVICES;

/// Reads the simulator's shared state file (`GPUVISOR_SIM_STATE`): per-process, per-device
/// usage, like NVML's running compute processes. Utilisation is not simulated (`None`).
#[derive(Debug)]
pub struct SimSource {
    path: PathBuf,
    devices: Vec<SimDevice>,
    file: Option<File>,
    buffer: Vec<u8>,
}

impl SimSource {
    /// A reader of the state file at `path` (it may not exist yet: the first simulated
    /// process creates it) for these devices.
    pub fn new(path: PathBuf, devices: Vec<SimDevice>) -> SimSource {
        SimSource {
            path,
            devices,
            file: None,
            buffer: Vec::new(),
        }
    }

    /// The live slots: (pid, bytes per device).
    fn slots(&mut self) -> Vec<(i32, Vec<u64>)> {
        if self.file.is_none() {
            self.file = File::open(&self.path).ok();
        }
        let Some(file) = &self.file else {
            return Vec::new();
        };
        let mut header = [0u8; SIM_HEADER_WORDS * 8];
        if file.read_exact_at(&mut header, 0).is_err() || word(&header, 0) != SIM_MAGIC {
            return Vec::new();
        }
        // Only the slots ever claimed are read (the high-water mark bounds them).
        let high_water = (word(&header, 1) as usize).min(SIM_SLOTS);
        let device_count = self.devices.len().min(SIM_MAX_DEVICES);
        self.buffer.resize(high_water * SIM_SLOT_WORDS * 8, 0);
        if file
            .read_exact_at(&mut self.buffer, (SIM_HEADER_WORDS * 8) as u64)
            .is_err()
        {
            return Vec::new();
        }
        (0..high_water)
            .filter_map(|slot| {
                let base = slot * SIM_SLOT_WORDS;
                let pid = i32::try_from(word(&self.buffer, base)).ok()?;
                if pid <= 0 || !exists(pid) {
                    return None;
                }
                let bytes = (0..device_count)
                    .map(|device| word(&self.buffer, base + 1 + device))
                    .collect();
                Some((pid, bytes))
            })
            .collect()
    }
}

/// Whether `pid` exists: one `kill(pid, 0)`, no /proc read per slot per tick. (A zombie
/// counts until its parent reaps it; the supervisor reaps at once.)
fn exists(pid: i32) -> bool {
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(error) => error == nix::errno::Errno::EPERM,
    }
}

fn word(bytes: &[u8], index: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[index * 8..index * 8 + 8]);
    u64::from_le_bytes(raw)
}

impl GpuSource for SimSource {
    fn name(&self) -> &'static str {
        "simulator"
    }

    fn read(&mut self) -> GpuReading {
        let slots = self.slots();
        let mut devices: Vec<DeviceReading> = self
            .devices
            .iter()
            .enumerate()
            .map(|(index, device)| DeviceReading {
                index: index as u32,
                uuid: device.uuid.clone(),
                name: Some("simulated GPU".into()),
                total_bytes: device.total_bytes,
                used_bytes: device.foreign_bytes,
                free_bytes: device.total_bytes.saturating_sub(device.foreign_bytes),
                ..DeviceReading::default()
            })
            .collect();
        let mut processes = Vec::new();
        for (pid, bytes) in slots {
            for (device, &used_bytes) in bytes.iter().enumerate() {
                if used_bytes == 0 {
                    continue;
                }
                let reading = &mut devices[device];
                reading.used_bytes = reading.used_bytes.saturating_add(used_bytes);
                reading.free_bytes = reading.free_bytes.saturating_sub(used_bytes);
                processes.push(GpuProcessReading {
                    pid,
                    device: device as u32,
                    used_bytes: Some(used_bytes),
                    ..GpuProcessReading::default()
                });
            }
        }
        GpuReading { devices, processes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a state file as the simulator lays it out.
    fn state_file(path: &std::path::Path, slots: &[(u64, &[u64])]) {
        let mut words = vec![0u64; SIM_HEADER_WORDS + SIM_SLOTS * SIM_SLOT_WORDS];
        words[0] = SIM_MAGIC;
        words[1] = slots.len() as u64;
        for (slot, (pid, bytes)) in slots.iter().enumerate() {
            let base = SIM_HEADER_WORDS + slot * SIM_SLOT_WORDS;
            words[base] = *pid;
            for (device, value) in bytes.iter().enumerate() {
                words[base + 1 + device] = *value;
            }
        }
        let raw: Vec<u8> = words.iter().flat_map(|word| word.to_le_bytes()).collect();
        std::fs::write(path, raw).unwrap();
    }

    #[test]
    fn live_slots_become_processes_and_device_usage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let me = std::process::id() as u64;
        // A dead pid (beyond pid_max) must not count, as in the simulator.
        state_file(&path, &[(me, &[100, 0, 7]), (4_194_999, &[1 << 30, 0, 0])]);
        let devices = (0..3)
            .map(|index| SimDevice {
                uuid: format!("GPU-{index}"),
                total_bytes: 1000,
                foreign_bytes: 10,
            })
            .collect();
        let mut source = SimSource::new(path, devices);
        let reading = source.read();
        let used: Vec<u64> = reading.devices.iter().map(|d| d.used_bytes).collect();
        assert_eq!(used, vec![110, 10, 17]);
        let free: Vec<u64> = reading.devices.iter().map(|d| d.free_bytes).collect();
        assert_eq!(free, vec![890, 990, 983]);
        assert_eq!(reading.processes.len(), 2);
        assert_eq!(reading.processes[0].pid, me as i32);
        assert_eq!(reading.processes[1].device, 2);
    }

    #[test]
    fn a_missing_state_file_is_foreign_use_only() {
        let mut source = SimSource::new(
            PathBuf::from("/nonexistent/state"),
            vec![SimDevice {
                uuid: "GPU-0".into(),
                total_bytes: 1000,
                foreign_bytes: 5,
            }],
        );
        let reading = source.read();
        assert_eq!(reading.devices[0].used_bytes, 5);
        assert!(reading.processes.is_empty());
    }
}
