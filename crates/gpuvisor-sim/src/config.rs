//! The simulated machine as the environment describes it: devices from `GPUVISOR_SIM_GPUS`,
//! the visible subset from `CUDA_VISIBLE_DEVICES`, and the per-context overhead.

/// Devices of the simulated machine (canonical `TOTAL_BYTES[:USED_BYTES]` list or friendly
/// `2x80GiB`, `80GiB,40GiB`).
pub const SIM_GPUS_ENV: &str = "GPUVISOR_SIM_GPUS";
/// Bytes each context costs on its device (a size; default [`DEFAULT_CONTEXT_OVERHEAD`]).
pub const CONTEXT_OVERHEAD_ENV: &str = "GPUVISOR_SIM_CONTEXT_OVERHEAD";
/// Optional file that makes physical usage shared by all processes of one simulated machine.
pub const STATE_ENV: &str = "GPUVISOR_SIM_STATE";
/// The devices used when `GPUVISOR_SIM_GPUS` is not set.
pub const DEFAULT_GPUS: &str = "1x80GiB";
/// Default context overhead: what a lazily loaded CUDA 12 context costs on a real card.
pub const DEFAULT_CONTEXT_OVERHEAD: u64 = 300 << 20;
/// Most devices one simulated machine may have (the same limit as `--simulate`).
pub const MAX_DEVICES: usize = 64;

/// One physical device of the simulated machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimDevice {
    /// Physical index (what NVML would call it).
    pub index: u32,
    /// Memory size in bytes.
    pub total_bytes: u64,
    /// Bytes held by processes outside the simulation (fixed).
    pub foreign_bytes: u64,
}

impl SimDevice {
    /// The UUID gpuvisor-core's `simulated_uuid` gives this device, as 16 bytes.
    pub fn uuid_bytes(&self) -> [u8; 16] {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&[0x51, 0x11, 0xa7, 0xed, 0x00, 0x00, 0x40, 0x00]);
        bytes[8..10].copy_from_slice(&[0x80, 0x00]);
        bytes[10..].copy_from_slice(&(self.index as u64).to_be_bytes()[2..]);
        bytes
    }

    /// The UUID as text, `GPU-5111a7ed-0000-4000-8000-000000000001`.
    pub fn uuid_string(&self) -> String {
        format!("GPU-5111a7ed-0000-4000-8000-{:012x}", self.index)
    }

    /// The name cuDeviceGetName reports.
    pub fn name(&self) -> String {
        format!("gpuvisor simulated GPU {} MiB", self.total_bytes >> 20)
    }
}

/// Parses a byte size: a plain number of bytes, or a number with a binary (KiB..TiB) or
/// decimal (KB..TB) unit; fractions are rounded down.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "tib" | "t" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier);
    }
    let value: f64 = number.parse().ok()?;
    let bytes = value * multiplier as f64;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// Parses a device list: comma-separated `[Nx]SIZE[:USED]` entries.
pub fn parse_devices(spec: &str) -> Result<Vec<SimDevice>, String> {
    let mut devices = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err("an empty device entry".to_string());
        }
        let (device, used) = match entry.split_once(':') {
            Some((device, used)) => {
                let used = used.trim().strip_prefix("used=").unwrap_or(used.trim());
                (
                    device,
                    parse_size(used).ok_or_else(|| format!("bad used size `{used}`"))?,
                )
            }
            None => (entry, 0),
        };
        let (count, size) = match device.split_once(['x', 'X']) {
            Some((count, size))
                if !count.is_empty() && count.bytes().all(|b| b.is_ascii_digit()) =>
            {
                (
                    count
                        .parse::<usize>()
                        .map_err(|_| format!("bad count `{count}`"))?,
                    size,
                )
            }
            _ => (1, device),
        };
        let total_bytes = parse_size(size)
            .filter(|&bytes| bytes > 0)
            .ok_or_else(|| format!("bad device size `{size}`"))?;
        if count == 0 || devices.len() + count > MAX_DEVICES {
            return Err(format!(
                "{} devices (1 to {MAX_DEVICES} are allowed)",
                devices.len() + count
            ));
        }
        for _ in 0..count {
            let index = devices.len() as u32;
            devices.push(SimDevice {
                index,
                total_bytes,
                foreign_bytes: used.min(total_bytes),
            });
        }
    }
    Ok(devices)
}

/// Applies `CUDA_VISIBLE_DEVICES` like the real driver: entries are indices or (prefixes of)
/// UUIDs, the list stops at the first entry that names no device, and a device named twice
/// makes the whole list invalid (no devices). `None` (unset) means all devices.
pub fn visible_devices(all: &[SimDevice], visible: Option<&str>) -> Vec<SimDevice> {
    let Some(visible) = visible else {
        return all.to_vec();
    };
    let mut chosen: Vec<SimDevice> = Vec::new();
    for entry in visible.split(',').map(str::trim) {
        let found = if let Ok(index) = entry.parse::<u32>() {
            all.iter().find(|device| device.index == index)
        } else if entry.len() > 4 && entry.starts_with("GPU-") {
            let mut matches = all
                .iter()
                .filter(|device| device.uuid_string().starts_with(entry));
            match (matches.next(), matches.next()) {
                (Some(device), None) => Some(device),
                _ => None,
            }
        } else {
            None
        };
        match found {
            Some(device) if chosen.contains(device) => return Vec::new(),
            Some(device) => chosen.push(device.clone()),
            None => break,
        }
    }
    chosen
}

/// The environment variable with the driver's CUDA version (an integer like 12080 or 13020),
/// which the driver (`cuDriverGetVersion`) and NVML both report.
pub const DRIVER_VERSION_ENV: &str = "GPUVISOR_SIM_DRIVER_VERSION";
/// The CUDA version reported when [`DRIVER_VERSION_ENV`] is not set: 13.2, which the CUDA 13
/// runtime requires (cudart 13 refuses a driver below 13000) and the CUDA 12 runtimes accept, as
/// a real 13.x driver serves both.
pub const DEFAULT_CUDA_VERSION: i32 = 13020;

/// NVIDIA's PCI vendor id in the low half, the H100 SXM5 80GB device id in the high half.
pub const PCI_DEVICE_ID: u32 = 0x2330_10DE;
/// The subsystem id of an HGX H100 board.
pub const PCI_SUBSYSTEM_ID: u32 = 0x16C1_10DE;

/// A CUDA version as CUDA encodes it: `major * 1000 + minor * 10`, 10000 (10.0) to 99990.
pub fn parse_cuda_version(text: &str) -> Option<i32> {
    text.trim()
        .parse::<i32>()
        .ok()
        .filter(|version| (10_000..100_000).contains(version))
}

static DRIVER_VERSION: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The simulated driver's CUDA version, read from [`DRIVER_VERSION_ENV`] once (an invalid
/// value is said once and the default used).
pub fn driver_version() -> i32 {
    use std::sync::atomic::Ordering;
    let known = DRIVER_VERSION.load(Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    let version = match std::env::var(DRIVER_VERSION_ENV) {
        Ok(text) => parse_cuda_version(&text).unwrap_or_else(|| {
            eprintln!(
                "gpuvisor-sim: {DRIVER_VERSION_ENV}=`{text}` is not a CUDA version like 13020; using {DEFAULT_CUDA_VERSION}"
            );
            DEFAULT_CUDA_VERSION
        }),
        Err(_) => DEFAULT_CUDA_VERSION,
    };
    DRIVER_VERSION.store(version, Ordering::Relaxed);
    version
}

/// The PCI bus of the device with physical index `index`: buses start at 1, as the driver's
/// `CU_DEVICE_ATTRIBUTE_PCI_BUS_ID` answers for the same device.
pub fn pci_bus(index: u32) -> u32 {
    index + 1
}

/// The physical index of the device at a PCI address (the inverse of [`pci_bus`]), if the
/// address can be a simulated device's.
pub fn physical_index_at(address: &PciAddress) -> Option<u32> {
    if address.domain != 0 || address.device != 0 || address.function != 0 {
        return None;
    }
    address.bus.checked_sub(1)
}

/// `00000000:01:00.0`, NVML's bus id form (`nvmlPciInfo_t::busId`).
pub fn bus_id(index: u32) -> String {
    format!("{:08X}:{:02X}:00.0", 0, pci_bus(index))
}

/// `0000:01:00.0`, the legacy form (`busIdLegacy`, and what `cuDeviceGetPCIBusId` gives).
pub fn legacy_bus_id(index: u32) -> String {
    format!("{:04X}:{:02X}:00.0", 0, pci_bus(index))
}

/// A parsed PCI address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciAddress {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u32,
    /// Device number on the bus.
    pub device: u32,
    /// Function number.
    pub function: u32,
}

/// Parses `[domain:]bus:device[.function]` in hex, any case (NVML accepts 4- and 8-digit
/// domains alike).
pub fn parse_bus_id(text: &str) -> Option<PciAddress> {
    let text = text.trim();
    let (rest, function) = match text.rsplit_once('.') {
        Some((rest, function)) => (rest, hex(function, 1)?),
        None => (text, 0),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let (domain, bus, device) = match parts.as_slice() {
        [domain, bus, device] => (hex(domain, 8)?, hex(bus, 2)?, hex(device, 2)?),
        [bus, device] => (0, hex(bus, 2)?, hex(device, 2)?),
        _ => return None,
    };
    Some(PciAddress {
        domain,
        bus,
        device,
        function,
    })
}

/// A hex number of 1 to `digits` digits.
fn hex(text: &str, digits: usize) -> Option<u32> {
    if text.is_empty() || text.len() > digits || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_canonical_and_friendly_forms() {
        let devices = parse_devices("85899345920,42949672960:1073741824").unwrap();
        assert_eq!(devices[0].total_bytes, 80 << 30);
        assert_eq!(devices[1].foreign_bytes, 1 << 30);
        assert_eq!(parse_devices("2x80GiB").unwrap().len(), 2);
        let devices = parse_devices("80GiB, 40GiB:used=10GiB").unwrap();
        assert_eq!(
            (devices[1].total_bytes, devices[1].foreign_bytes),
            (40 << 30, 10 << 30)
        );
        for bad in ["", "0x80GiB", "80Gibbons", "2x", "65x1GiB", "0"] {
            assert!(parse_devices(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn uuid_matches_core_format() {
        let device = SimDevice {
            index: 0x2a,
            total_bytes: 1,
            foreign_bytes: 0,
        };
        let hex: String = device
            .uuid_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let expected = device.uuid_string().replace('-', "");
        assert_eq!(format!("GPU{hex}"), expected);
        assert_eq!(
            device.uuid_string(),
            "GPU-5111a7ed-0000-4000-8000-00000000002a"
        );
    }

    #[test]
    fn visible_devices_follow_the_driver_rules() {
        let all = parse_devices("4x1GiB").unwrap();
        let indices = |list: Vec<SimDevice>| list.iter().map(|d| d.index).collect::<Vec<_>>();
        assert_eq!(indices(visible_devices(&all, None)), [0, 1, 2, 3]);
        assert_eq!(indices(visible_devices(&all, Some(""))), Vec::<u32>::new());
        assert_eq!(indices(visible_devices(&all, Some("2,0"))), [2, 0]);
        assert_eq!(indices(visible_devices(&all, Some("1,7,2"))), [1]);
        assert_eq!(
            indices(visible_devices(
                &all,
                Some("GPU-5111a7ed-0000-4000-8000-000000000003")
            )),
            [3]
        );
        assert_eq!(
            indices(visible_devices(&all, Some("1,1"))),
            Vec::<u32>::new()
        );
    }
}
