//! NVML entry points for the fixed facts of a device, answered like an H100 SXM5 80GB HBM3
//! in an HGX board seen through PCIe only: identity, PCI, clocks, power, thermals, modes, ECC,
//! MIG (off), peer-to-peer (every pair OK) and NVLink (not supported, as on a card without it).

use std::ffi::c_char;

use super::machine::{bus_id, legacy_bus_id, pci_bus, PCI_DEVICE_ID, PCI_SUBSYSTEM_ID};
use super::{
    device_of, fill_field, guarded, machine, out, out_text, ret, struct_version, with_device,
    Handle,
};
use crate::config::SimDevice;

/// Answers `*value = answer(device)` for the device `handle` names.
///
/// # Safety
/// `value` is NULL or valid for a write of `T`.
unsafe fn device_value<T>(
    handle: Handle,
    value: *mut T,
    answer: impl FnOnce(&SimDevice) -> Result<T, u32>,
) -> u32 {
    with_device(handle, |_, device| {
        let answer = answer(device)?;
        // SAFETY: forwarded from this function's contract.
        unsafe { out(value, answer) }.map(|()| ret::SUCCESS)
    })
}

/// Answers a query with two outputs for the device `handle` names.
///
/// # Safety
/// Both pointers are NULL or valid for a write of `T`.
unsafe fn device_pair<T>(handle: Handle, first: (*mut T, T), second: (*mut T, T)) -> u32 {
    with_device(handle, |_, _| {
        // SAFETY: forwarded from this function's contract.
        unsafe {
            out(first.0, first.1)?;
            out(second.0, second.1)?;
        }
        Ok(ret::SUCCESS)
    })
}

/// Answers a string query for the device `handle` names.
///
/// # Safety
/// `buffer` is NULL or valid for writes of `length` bytes.
unsafe fn device_text(
    handle: Handle,
    buffer: *mut c_char,
    length: u32,
    text: impl FnOnce(&SimDevice) -> Result<String, u32>,
) -> u32 {
    with_device(handle, |_, device| {
        let text = text(device)?;
        // SAFETY: forwarded from this function's contract.
        unsafe { out_text(buffer, length, &text) }
    })
}

/// Defines entry points `fn(device, *mut T) -> u32` answering `VALUE`, an expression of the
/// device (bound to the pattern in parentheses).
macro_rules! device_values {
    ($($(#[$doc:meta])* $name:ident($device:pat) -> $type:ty = $value:expr;)*) => {$(
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name(device: Handle, value: *mut $type) -> u32 {
            // SAFETY: `value` is NULL or writable, as NVML requires of callers.
            unsafe { device_value(device, value, |$device: &SimDevice| Ok($value)) }
        }
    )*};
}

/// Defines entry points that answer NOT_SUPPORTED (once the handle is known to be ours), as a
/// real driver does for what a card lacks; the other arguments are left untouched.
macro_rules! not_supported {
    ($($(#[$doc:meta])* $name:ident($($argument:ident: $type:ty),*);)*) => {$(
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name(device: Handle, $($argument: $type),*) -> u32 {
            with_device(device, |_, _| Err(ret::NOT_SUPPORTED))
        }
    )*};
}

device_values! {
    /// nvmlDeviceGetIndex: the NVML (= physical) index.
    nvmlDeviceGetIndex(d) -> u32 = d.index;

    /// nvmlDeviceGetBrand: NVML_BRAND_NVIDIA (14), what data-centre cards report.
    nvmlDeviceGetBrand(_) -> u32 = 14;

    /// nvmlDeviceGetArchitecture: NVML_DEVICE_ARCH_HOPPER (9).
    nvmlDeviceGetArchitecture(_) -> u32 = 9;

    /// nvmlDeviceGetMinorNumber: the N of `/dev/nvidiaN`, the physical index.
    nvmlDeviceGetMinorNumber(d) -> u32 = d.index;

    /// nvmlDeviceGetBoardId: derived from the bus, as the real driver's ids are.
    nvmlDeviceGetBoardId(d) -> u32 = pci_bus(d.index) << 8;

    /// nvmlDeviceGetMultiGpuBoard: one GPU per board.
    nvmlDeviceGetMultiGpuBoard(_) -> u32 = 0;

    /// nvmlDeviceGetCurrPcieLinkGeneration: PCIe 5.
    nvmlDeviceGetCurrPcieLinkGeneration(_) -> u32 = 5;

    /// nvmlDeviceGetMaxPcieLinkGeneration: PCIe 5.
    nvmlDeviceGetMaxPcieLinkGeneration(_) -> u32 = 5;

    /// nvmlDeviceGetGpuMaxPcieLinkGeneration: PCIe 5.
    nvmlDeviceGetGpuMaxPcieLinkGeneration(_) -> u32 = 5;

    /// nvmlDeviceGetCurrPcieLinkWidth: x16.
    nvmlDeviceGetCurrPcieLinkWidth(_) -> u32 = 16;

    /// nvmlDeviceGetMaxPcieLinkWidth: x16.
    nvmlDeviceGetMaxPcieLinkWidth(_) -> u32 = 16;

    /// nvmlDeviceGetPcieSpeed: 32000 Mbps per lane (PCIe 5).
    nvmlDeviceGetPcieSpeed(_) -> u32 = 32000;

    /// nvmlDeviceGetPcieReplayCounter: no replays.
    nvmlDeviceGetPcieReplayCounter(_) -> u32 = 0;

    /// nvmlDeviceGetNumFans: none.
    nvmlDeviceGetNumFans(_) -> u32 = 0;

    /// nvmlDeviceGetPowerUsage: an idle H100's draw, in milliwatts.
    nvmlDeviceGetPowerUsage(_) -> u32 = 69_000;

    /// nvmlDeviceGetEnforcedPowerLimit.
    nvmlDeviceGetEnforcedPowerLimit(_) -> u32 = POWER_LIMIT_MW;

    /// nvmlDeviceGetPowerManagementLimit.
    nvmlDeviceGetPowerManagementLimit(_) -> u32 = POWER_LIMIT_MW;

    /// nvmlDeviceGetPowerManagementDefaultLimit.
    nvmlDeviceGetPowerManagementDefaultLimit(_) -> u32 = POWER_LIMIT_MW;

    /// nvmlDeviceGetPowerManagementMode: enabled.
    nvmlDeviceGetPowerManagementMode(_) -> u32 = 1;

    /// nvmlDeviceGetCurrentClocksEventReasons: none.
    nvmlDeviceGetCurrentClocksEventReasons(_) -> u64 = 0;

    /// nvmlDeviceGetPerformanceState: P0.
    nvmlDeviceGetPerformanceState(_) -> u32 = 0;

    /// nvmlDeviceGetPersistenceMode: enabled, as on data-centre machines.
    nvmlDeviceGetPersistenceMode(_) -> u32 = 1;

    /// nvmlDeviceGetComputeMode: default (shared).
    nvmlDeviceGetComputeMode(_) -> u32 = 0;

    /// nvmlDeviceGetDisplayMode: no display attached.
    nvmlDeviceGetDisplayMode(_) -> u32 = 0;

    /// nvmlDeviceGetDisplayActive: no display active.
    nvmlDeviceGetDisplayActive(_) -> u32 = 0;

    /// nvmlDeviceGetMemoryErrorCounter: none anywhere.
    nvmlDeviceGetMemoryErrorCounter(_) -> u64 = 0;

    /// nvmlDeviceGetMaxMigDeviceCount: what an H100 could hold (MIG is off, so none exist).
    nvmlDeviceGetMaxMigDeviceCount(_) -> u32 = 7;

    /// nvmlDeviceIsMigDeviceHandle: never (no MIG devices exist).
    nvmlDeviceIsMigDeviceHandle(_) -> u32 = 0;

    /// nvmlDeviceGetMemoryBusWidth: 5120 bits of HBM3.
    nvmlDeviceGetMemoryBusWidth(_) -> u32 = 5120;

    /// nvmlDeviceGetNumGpuCores: 132 SMs × 128.
    nvmlDeviceGetNumGpuCores(_) -> u32 = 16896;
}

not_supported! {
    /// nvmlDeviceGetFanSpeed: an SXM card has no fan of its own.
    nvmlDeviceGetFanSpeed(_speed: *mut u32);

    /// nvmlDeviceGetFanSpeed_v2: no fans.
    nvmlDeviceGetFanSpeed_v2(_fan: u32, _speed: *mut u32);

    /// nvmlDeviceGetGpuInstanceId: not a MIG device.
    nvmlDeviceGetGpuInstanceId(_id: *mut u32);

    /// nvmlDeviceGetComputeInstanceId: not a MIG device.
    nvmlDeviceGetComputeInstanceId(_id: *mut u32);

    /// nvmlDeviceGetCurrentDriverModel: Windows only.
    nvmlDeviceGetCurrentDriverModel(_model: *mut u32);

    /// nvmlDeviceGetDriverModel_v2: Windows only.
    nvmlDeviceGetDriverModel_v2(_current: *mut u32, _pending: *mut u32);

    /// nvmlDeviceGetNvLinkState: no NVLink.
    nvmlDeviceGetNvLinkState(_link: u32, _active: *mut u32);

    /// nvmlDeviceGetNvLinkCapability: no NVLink.
    nvmlDeviceGetNvLinkCapability(_link: u32, _capability: u32, _result: *mut u32);

    /// nvmlDeviceGetNvLinkVersion: no NVLink.
    nvmlDeviceGetNvLinkVersion(_link: u32, _version: *mut u32);

    /// nvmlDeviceGetNvLinkRemotePciInfo_v2: no NVLink.
    nvmlDeviceGetNvLinkRemotePciInfo_v2(_link: u32, _pci: *mut PciInfo);

    /// nvmlDeviceGetNvLinkRemotePciInfo: no NVLink.
    nvmlDeviceGetNvLinkRemotePciInfo(_link: u32, _pci: *mut PciInfoV1);

    /// nvmlDeviceGetNvLinkRemoteDeviceType: no NVLink.
    nvmlDeviceGetNvLinkRemoteDeviceType(_link: u32, _kind: *mut u32);

    /// nvmlDeviceGetGpuFabricInfo: not part of an NVSwitch fabric.
    nvmlDeviceGetGpuFabricInfo(_info: *mut std::ffi::c_void);

    /// nvmlDeviceGetGpuFabricInfoV: not part of an NVSwitch fabric.
    nvmlDeviceGetGpuFabricInfoV(_info: *mut std::ffi::c_void);

    /// nvmlDeviceGetConfComputeMemSizeInfo: confidential computing is off.
    nvmlDeviceGetConfComputeMemSizeInfo(_info: *mut std::ffi::c_void);
}

/// The board serial number: 13 digits, unique per device.
pub fn serial(device: &SimDevice) -> String {
    format!("16549230{:05}", device.index)
}

/// nvmlDeviceGetName: the name `cuDeviceGetName` gives the same device.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(device: Handle, name: *mut c_char, length: u32) -> u32 {
    // SAFETY: `name` is NULL or has `length` writable bytes.
    unsafe { device_text(device, name, length, |d| Ok(d.name())) }
}

/// nvmlDeviceGetUUID: the UUID the driver gives the same device.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(device: Handle, uuid: *mut c_char, length: u32) -> u32 {
    // SAFETY: `uuid` is NULL or has `length` writable bytes.
    unsafe { device_text(device, uuid, length, |d| Ok(d.uuid_string())) }
}

/// nvmlDeviceGetSerial.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: Handle,
    serial_number: *mut c_char,
    length: u32,
) -> u32 {
    // SAFETY: `serial_number` is NULL or has `length` writable bytes.
    unsafe { device_text(device, serial_number, length, |d| Ok(serial(d))) }
}

/// nvmlDeviceGetBoardPartNumber.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBoardPartNumber(
    device: Handle,
    part: *mut c_char,
    length: u32,
) -> u32 {
    // SAFETY: `part` is NULL or has `length` writable bytes.
    unsafe { device_text(device, part, length, |_| Ok("692-2G520-0200-000".into())) }
}

/// nvmlDeviceGetVbiosVersion.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetVbiosVersion(
    device: Handle,
    version: *mut c_char,
    length: u32,
) -> u32 {
    // SAFETY: `version` is NULL or has `length` writable bytes.
    unsafe { device_text(device, version, length, |_| Ok("96.00.99.00.01".into())) }
}

/// nvmlDeviceGetInforomVersion: OEM and ECC objects; the power object is absent on H100.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetInforomVersion(
    device: Handle,
    object: u32,
    version: *mut c_char,
    length: u32,
) -> u32 {
    // SAFETY: `version` is NULL or has `length` writable bytes.
    unsafe {
        device_text(device, version, length, |_| match object {
            0 => Ok("2.1".into()),
            1 => Ok("7.16".into()),
            2 => Err(ret::NOT_SUPPORTED),
            _ => Err(ret::INVALID_ARGUMENT),
        })
    }
}

/// nvmlDeviceGetInforomImageVersion.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetInforomImageVersion(
    device: Handle,
    version: *mut c_char,
    length: u32,
) -> u32 {
    // SAFETY: `version` is NULL or has `length` writable bytes.
    unsafe { device_text(device, version, length, |_| Ok("G520.0200.00.05".into())) }
}

/// nvmlDeviceGetCudaComputeCapability: 9.0.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: Handle,
    major: *mut i32,
    minor: *mut i32,
) -> u32 {
    // SAFETY: both are NULL or writable.
    unsafe { device_pair(device, (major, 9), (minor, 0)) }
}

/// `nvmlPciInfo_t` (the layout of `_v3`).
#[repr(C)]
pub struct PciInfo {
    pub(crate) bus_id_legacy: [u8; 16],
    pub(crate) domain: u32,
    pub(crate) bus: u32,
    pub(crate) device: u32,
    pub(crate) pci_device_id: u32,
    pub(crate) pci_subsystem_id: u32,
    pub(crate) bus_id: [u8; 32],
}

/// The layout of the unversioned and `_v2` calls: a 16-byte bus id and four reserved words.
#[repr(C)]
pub struct PciInfoV1 {
    pub(crate) bus_id: [u8; 16],
    pub(crate) domain: u32,
    pub(crate) bus: u32,
    pub(crate) device: u32,
    pub(crate) pci_device_id: u32,
    pub(crate) pci_subsystem_id: u32,
    pub(crate) reserved: [u32; 4],
}

/// `nvmlPciInfoExt_v1_t`.
#[repr(C)]
pub struct PciInfoExtV1 {
    pub(crate) version: u32,
    pub(crate) domain: u32,
    pub(crate) bus: u32,
    pub(crate) device: u32,
    pub(crate) pci_device_id: u32,
    pub(crate) pci_subsystem_id: u32,
    pub(crate) base_class: u32,
    pub(crate) sub_class: u32,
    pub(crate) bus_id: [u8; 32],
}

/// The `nvmlPciInfo_t` of a device.
pub fn pci_info(device: &SimDevice) -> PciInfo {
    let mut info = PciInfo {
        bus_id_legacy: [0; 16],
        domain: 0,
        bus: pci_bus(device.index),
        device: 0,
        pci_device_id: PCI_DEVICE_ID,
        pci_subsystem_id: PCI_SUBSYSTEM_ID,
        bus_id: [0; 32],
    };
    fill_field(&mut info.bus_id_legacy, &legacy_bus_id(device.index));
    fill_field(&mut info.bus_id, &bus_id(device.index));
    info
}

/// nvmlDeviceGetPciInfo_v3.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: Handle, pci: *mut PciInfo) -> u32 {
    // SAFETY: `pci` is NULL or a writable nvmlPciInfo_t.
    unsafe { device_value(device, pci, |d| Ok(pci_info(d))) }
}

/// nvmlDeviceGetPciInfo_v2 (the older, 52-byte layout).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(device: Handle, pci: *mut PciInfoV1) -> u32 {
    // SAFETY: `pci` is NULL or a writable struct of the old layout.
    unsafe {
        device_value(device, pci, |d| {
            let info = pci_info(d);
            Ok(PciInfoV1 {
                bus_id: info.bus_id_legacy,
                domain: info.domain,
                bus: info.bus,
                device: info.device,
                pci_device_id: info.pci_device_id,
                pci_subsystem_id: info.pci_subsystem_id,
                reserved: [0; 4],
            })
        })
    }
}

/// nvmlDeviceGetPciInfo (the oldest ABI: the 52-byte layout).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(device: Handle, pci: *mut PciInfoV1) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetPciInfo_v2(device, pci) }
}

/// nvmlDeviceGetPciInfoExt: a 3D controller (class 3, subclass 2), as compute GPUs are.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfoExt(device: Handle, pci: *mut PciInfoExtV1) -> u32 {
    with_device(device, |_, d| {
        if pci.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL; the caller's struct starts with its version word.
        let version = unsafe { (*pci).version };
        if version != struct_version::<PciInfoExtV1>(1) {
            return Err(ret::ARGUMENT_VERSION_MISMATCH);
        }
        let info = pci_info(d);
        // SAFETY: a writable v1 struct of the caller's.
        unsafe {
            pci.write(PciInfoExtV1 {
                version,
                domain: info.domain,
                bus: info.bus,
                device: info.device,
                pci_device_id: info.pci_device_id,
                pci_subsystem_id: info.pci_subsystem_id,
                base_class: 3,
                sub_class: 2,
                bus_id: info.bus_id,
            })
        };
        Ok(ret::SUCCESS)
    })
}

/// nvmlDeviceGetPcieThroughput: no traffic (TX = 0, RX = 1 counters), in KB/s.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: Handle,
    counter: u32,
    value: *mut u32,
) -> u32 {
    // SAFETY: `value` is NULL or writable.
    unsafe {
        device_value(device, value, |_| match counter {
            0 | 1 => Ok(0),
            _ => Err(ret::INVALID_ARGUMENT),
        })
    }
}

/// GPU temperature at idle, in degrees C.
const TEMPERATURE_C: u32 = 33;

/// nvmlDeviceGetTemperature: the GPU sensor (0) only.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: Handle,
    sensor: u32,
    temperature: *mut u32,
) -> u32 {
    // SAFETY: `temperature` is NULL or writable.
    unsafe {
        device_value(device, temperature, |_| match sensor {
            0 => Ok(TEMPERATURE_C),
            _ => Err(ret::INVALID_ARGUMENT),
        })
    }
}

/// `nvmlTemperature_v1_t`.
#[repr(C)]
pub struct TemperatureV1 {
    pub(crate) version: u32,
    pub(crate) sensor_type: u32,
    pub(crate) temperature: i32,
}

/// nvmlDeviceGetTemperatureV: the versioned form of nvmlDeviceGetTemperature.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureV(
    device: Handle,
    temperature: *mut TemperatureV1,
) -> u32 {
    with_device(device, |_, _| {
        if temperature.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL and the caller's writable v1 struct (the version is checked first).
        unsafe {
            if (*temperature).version != struct_version::<TemperatureV1>(1) {
                return Err(ret::ARGUMENT_VERSION_MISMATCH);
            }
            if (*temperature).sensor_type != 0 {
                return Err(ret::INVALID_ARGUMENT);
            }
            (*temperature).temperature = TEMPERATURE_C as i32;
        }
        Ok(ret::SUCCESS)
    })
}

/// nvmlDeviceGetTemperatureThreshold: shutdown, slowdown, memory max, GPU max.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: Handle,
    threshold: u32,
    temperature: *mut u32,
) -> u32 {
    // SAFETY: `temperature` is NULL or writable.
    unsafe {
        device_value(device, temperature, |_| match threshold {
            0 => Ok(92),
            1 => Ok(89),
            2 => Ok(95),
            3 => Ok(87),
            4..=7 => Err(ret::NOT_SUPPORTED),
            _ => Err(ret::INVALID_ARGUMENT),
        })
    }
}

/// Power limit of an H100 SXM5, in milliwatts.
const POWER_LIMIT_MW: u32 = 700_000;

/// nvmlDeviceGetPowerManagementLimitConstraints: 200 W to 700 W.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    device: Handle,
    min: *mut u32,
    max: *mut u32,
) -> u32 {
    // SAFETY: both are NULL or writable.
    unsafe { device_pair(device, (min, 200_000), (max, POWER_LIMIT_MW)) }
}

/// An H100 SXM5's clock in MHz for an `nvmlClockType_t` (graphics, SM, memory, video).
fn clock_mhz(clock: u32) -> Result<u32, u32> {
    match clock {
        0 | 1 => Ok(1980),
        2 => Ok(2619),
        3 => Ok(1545),
        _ => Err(ret::INVALID_ARGUMENT),
    }
}

/// nvmlDeviceGetClockInfo: clocks at their maximum (the simulator is never idle-clocked).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(device: Handle, clock: u32, mhz: *mut u32) -> u32 {
    // SAFETY: `mhz` is NULL or writable.
    unsafe { device_value(device, mhz, |_| clock_mhz(clock)) }
}

/// nvmlDeviceGetMaxClockInfo.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: Handle,
    clock: u32,
    mhz: *mut u32,
) -> u32 {
    // SAFETY: `mhz` is NULL or writable.
    unsafe { device_value(device, mhz, |_| clock_mhz(clock)) }
}

/// nvmlDeviceGetClock: every clock id (current, application target/default, boost max) the same.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClock(
    device: Handle,
    clock: u32,
    clock_id: u32,
    mhz: *mut u32,
) -> u32 {
    // SAFETY: `mhz` is NULL or writable.
    unsafe {
        device_value(device, mhz, |_| match clock_id {
            0..=3 => clock_mhz(clock),
            _ => Err(ret::INVALID_ARGUMENT),
        })
    }
}

/// nvmlDeviceGetCurrentClocksThrottleReasons (the older name).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: Handle,
    reasons: *mut u64,
) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetCurrentClocksEventReasons(device, reasons) }
}

/// nvmlDeviceGetPowerState (the deprecated name of the performance state).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerState(device: Handle, state: *mut u32) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetPerformanceState(device, state) }
}

/// nvmlDeviceGetEccMode: on, and on after reboot.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: Handle,
    current: *mut u32,
    pending: *mut u32,
) -> u32 {
    // SAFETY: both are NULL or writable.
    unsafe { device_pair(device, (current, 1), (pending, 1)) }
}

/// nvmlDeviceGetTotalEccErrors: none, of either type and counter.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: Handle,
    error_type: u32,
    counter_type: u32,
    count: *mut u64,
) -> u32 {
    // SAFETY: `count` is NULL or writable.
    unsafe {
        device_value(device, count, |_| match (error_type, counter_type) {
            (0 | 1, 0 | 1) => Ok(0),
            _ => Err(ret::INVALID_ARGUMENT),
        })
    }
}

/// nvmlDeviceGetRemappedRows: none remapped, nothing pending, no failure.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: Handle,
    corrected: *mut u32,
    uncorrected: *mut u32,
    pending: *mut u32,
    failed: *mut u32,
) -> u32 {
    with_device(device, |_, _| {
        // SAFETY: all are NULL or writable.
        unsafe {
            out(corrected, 0)?;
            out(uncorrected, 0)?;
            out(pending, 0)?;
            out(failed, 0)?;
        }
        Ok(ret::SUCCESS)
    })
}

/// nvmlDeviceGetMigMode: disabled, and disabled after reset.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: Handle,
    current: *mut u32,
    pending: *mut u32,
) -> u32 {
    // SAFETY: both are NULL or writable.
    unsafe { device_pair(device, (current, 0), (pending, 0)) }
}

/// nvmlDeviceGetMigDeviceHandleByIndex: MIG is off, so there is none.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: Handle,
    _index: u32,
    _mig: *mut Handle,
) -> u32 {
    with_device(device, |_, _| Err(ret::NOT_FOUND))
}

/// nvmlDeviceGetDeviceHandleFromMigDeviceHandle: no handle is a MIG device's.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    _mig: Handle,
    _device: *mut Handle,
) -> u32 {
    guarded(|| {
        machine()?;
        Err(ret::INVALID_ARGUMENT)
    })
}

/// nvmlDeviceGetDriverModel: Windows only.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDriverModel(
    device: Handle,
    current: *mut u32,
    pending: *mut u32,
) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetDriverModel_v2(device, current, pending) }
}

/// Runs `body` on the two devices `first` and `second` name, guarded.
fn with_two_devices(
    first: Handle,
    second: Handle,
    body: impl FnOnce(&SimDevice, &SimDevice) -> Result<u32, u32>,
) -> u32 {
    guarded(|| {
        let machine = machine()?;
        body(device_of(machine, first)?, device_of(machine, second)?)
    })
}

/// nvmlDeviceGetP2PStatus: NVML_P2P_STATUS_OK for every pair and capability (NCCL fails its
/// init on any other answer).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetP2PStatus(
    first: Handle,
    second: Handle,
    capability: u32,
    status: *mut u32,
) -> u32 {
    with_two_devices(first, second, |_, _| {
        if capability > 6 {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: `status` is NULL or writable.
        unsafe { out(status, 0) }.map(|()| ret::SUCCESS)
    })
}

/// nvmlDeviceGetTopologyCommonAncestor: the device itself (internal), else a host bridge.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    first: Handle,
    second: Handle,
    level: *mut u32,
) -> u32 {
    with_two_devices(first, second, |one, other| {
        let ancestor = if one.index == other.index { 0 } else { 30 };
        // SAFETY: `level` is NULL or writable.
        unsafe { out(level, ancestor) }.map(|()| ret::SUCCESS)
    })
}

/// `nvmlFieldValue_t`.
#[repr(C)]
pub struct FieldValue {
    pub(crate) field_id: u32,
    pub(crate) scope_id: u32,
    pub(crate) timestamp: i64,
    pub(crate) latency_usec: i64,
    pub(crate) value_type: u32,
    pub(crate) nvml_return: u32,
    pub(crate) value: u64,
}

/// nvmlDeviceGetFieldValues: the call succeeds and every field answers NOT_SUPPORTED, as a
/// real driver does for fields a card lacks (the NVLink, fabric and counter fields callers
/// ask for).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: Handle,
    count: i32,
    values: *mut FieldValue,
) -> u32 {
    with_device(device, |_, _| {
        let Ok(count) = usize::try_from(count) else {
            return Err(ret::INVALID_ARGUMENT);
        };
        if values.is_null() && count > 0 {
            return Err(ret::INVALID_ARGUMENT);
        }
        for position in 0..count {
            // SAFETY: the caller gives `count` writable entries with their ids filled in.
            let entry = unsafe { &mut *values.add(position) };
            entry.timestamp = 0;
            entry.latency_usec = 0;
            entry.value_type = 0;
            entry.nvml_return = ret::NOT_SUPPORTED;
            entry.value = 0;
        }
        Ok(ret::SUCCESS)
    })
}
