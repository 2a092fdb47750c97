//! Exported entry points: initialisation, devices and contexts.

use std::ffi::{c_char, c_void};

use std::sync::atomic::{AtomicBool, Ordering};

use crate::driver::{code, locked, query, with_driver};
use crate::{attributes, config, put};

/// The simulated driver's version ([`config::driver_version`]).
pub fn driver_version() -> i32 {
    config::driver_version()
}

/// Whether the "driver older than its caller" line was printed (once per process).
static OLDER_SAID: AtomicBool = AtomicBool::new(false);

/// Says once, on stderr, when the CUDA runtime (its integrity check carries its version) is
/// newer than the simulated driver, which it may refuse with `cudaErrorInsufficientDriver`, far
/// from the cause. (cuGetProcAddress's version is not used: libraries built for a newer CUDA,
/// NCCL among them, ask with it and work.)
pub fn note_caller_version(version: i32) {
    let driver = driver_version();
    let wanted = version / 10 * 10;
    if wanted > driver && !OLDER_SAID.swap(true, Ordering::Relaxed) {
        eprintln!(
            "gpuvisor-sim: a program built for CUDA {}.{} uses the simulated driver {}.{}\n  hint: set {}={wanted} if it refuses to start",
            wanted / 1000,
            wanted % 1000 / 10,
            driver / 1000,
            driver % 1000 / 10,
            config::DRIVER_VERSION_ENV,
        );
    }
}

/// What the runtime's integrity check hashes per visible device: UUID, PCI domain, bus and
/// device number (28 bytes).
pub fn device_identities() -> Vec<[u8; 28]> {
    let devices = query(|driver| Ok(driver.devices.clone())).unwrap_or_default();
    devices
        .iter()
        .map(|device| {
            let mut record = [0u8; 28];
            record[..16].copy_from_slice(&device.uuid_bytes());
            record[16..20].copy_from_slice(&0i32.to_le_bytes());
            record[20..24].copy_from_slice(&(config::pci_bus(device.index) as i32).to_le_bytes());
            record[24..28].copy_from_slice(&0i32.to_le_bytes());
            record
        })
        .collect()
}

/// cuInit: reads the simulated machine from the environment.
#[no_mangle]
pub extern "C" fn cuInit(_flags: u32) -> i32 {
    locked(|driver| driver.init())
}

/// cuDriverGetVersion.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut i32) -> i32 {
    if put(version, driver_version()) {
        code::SUCCESS
    } else {
        code::INVALID_VALUE
    }
}

/// cuDeviceGetCount.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut i32) -> i32 {
    with_driver(|driver| {
        if put(count, driver.devices.len() as i32) {
            code::SUCCESS
        } else {
            code::INVALID_VALUE
        }
    })
}

/// cuDeviceGet: device handles are ordinals.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut i32, ordinal: i32) -> i32 {
    with_driver(|driver| match driver.device(ordinal) {
        Some(_) if put(device, ordinal) => code::SUCCESS,
        Some(_) => code::INVALID_VALUE,
        None => code::INVALID_DEVICE,
    })
}

/// cuDeviceGetName: a NUL-terminated name, cut to `length`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, length: i32, device: i32) -> i32 {
    with_driver(|driver| {
        let Some(ordinal) = driver.device(device) else {
            return code::INVALID_DEVICE;
        };
        if name.is_null() || length <= 0 {
            return code::INVALID_VALUE;
        }
        let text = driver.devices[ordinal].name();
        let count = text.len().min(length as usize - 1);
        // SAFETY: the caller gave `length` writable bytes; we write count + 1 <= length.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), count);
            *name.add(count) = 0;
        }
        code::SUCCESS
    })
}

/// cuDeviceGetUuid: the 16 bytes of the UUID gpuvisor-core gives the physical device.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], device: i32) -> i32 {
    with_driver(|driver| match driver.device(device) {
        Some(ordinal) if put(uuid, driver.devices[ordinal].uuid_bytes()) => code::SUCCESS,
        Some(_) => code::INVALID_VALUE,
        None => code::INVALID_DEVICE,
    })
}

/// cuDeviceGetUuid_v2 (the same for whole GPUs; it differs only for MIG instances).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], device: i32) -> i32 {
    cuDeviceGetUuid(uuid, device)
}

/// cuDeviceTotalMem_v2: the physical size.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, device: i32) -> i32 {
    with_driver(|driver| match driver.device(device) {
        Some(ordinal) if put(bytes, driver.devices[ordinal].total_bytes as usize) => code::SUCCESS,
        Some(_) => code::INVALID_VALUE,
        None => code::INVALID_DEVICE,
    })
}

/// cuDeviceGetAttribute: an H100's value for every attribute ([`crate::attributes`]).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(value: *mut i32, attribute: i32, device: i32) -> i32 {
    with_driver(|driver| {
        let Some(ordinal) = driver.device(device) else {
            return code::INVALID_DEVICE;
        };
        match attributes::h100(attribute, driver.devices[ordinal].index) {
            Some(answer) if put(value, answer) => code::SUCCESS,
            _ => code::INVALID_VALUE,
        }
    })
}

/// cuDeviceComputeCapability (deprecated form).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut i32,
    minor: *mut i32,
    device: i32,
) -> i32 {
    with_driver(|driver| match driver.device(device) {
        Some(_) if put(major, 9) && put(minor, 0) => code::SUCCESS,
        Some(_) => code::INVALID_VALUE,
        None => code::INVALID_DEVICE,
    })
}

/// cuDevicePrimaryCtxRetain: the first retain costs the context overhead.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(context: *mut *mut c_void, device: i32) -> i32 {
    with_driver(|driver| {
        let Some(ordinal) = driver.device(device) else {
            return code::INVALID_DEVICE;
        };
        if context.is_null() {
            return code::INVALID_VALUE;
        }
        match driver.retain_primary(ordinal) {
            Ok(handle) => {
                put(context, handle as *mut c_void);
                code::SUCCESS
            }
            Err(error) => error,
        }
    })
}

/// cuDevicePrimaryCtxRelease_v2.
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(device: i32) -> i32 {
    with_driver(|driver| match driver.device(device) {
        Some(ordinal) => driver.release_primary(ordinal),
        None => code::INVALID_DEVICE,
    })
}

/// cuDevicePrimaryCtxRelease (pre-11.0 name).
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease(device: i32) -> i32 {
    cuDevicePrimaryCtxRelease_v2(device)
}

/// cuDevicePrimaryCtxGetState.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    device: i32,
    flags: *mut u32,
    active: *mut i32,
) -> i32 {
    with_driver(|driver| match driver.device(device) {
        Some(ordinal) if put(flags, 0) && put(active, driver.primary_active(ordinal) as i32) => {
            code::SUCCESS
        }
        Some(_) => code::INVALID_VALUE,
        None => code::INVALID_DEVICE,
    })
}

/// cuDevicePrimaryCtxSetFlags_v2: accepted and ignored.
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(device: i32, _flags: u32) -> i32 {
    with_driver(|driver| {
        if driver.device(device).is_some() {
            code::SUCCESS
        } else {
            code::INVALID_DEVICE
        }
    })
}

/// cuCtxCreate_v2: a new context on `device`, made current.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    context: *mut *mut c_void,
    _flags: u32,
    device: i32,
) -> i32 {
    with_driver(|driver| {
        let Some(ordinal) = driver.device(device) else {
            return code::INVALID_DEVICE;
        };
        if context.is_null() {
            return code::INVALID_VALUE;
        }
        match driver.create_context(ordinal) {
            Ok(handle) => {
                put(context, handle as *mut c_void);
                code::SUCCESS
            }
            Err(error) => error,
        }
    })
}

/// cuCtxCreate_v3 (with execution-affinity parameters, ignored).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    context: *mut *mut c_void,
    _params: *mut c_void,
    _count: i32,
    flags: u32,
    device: i32,
) -> i32 {
    cuCtxCreate_v2(context, flags, device)
}

/// cuCtxCreate_v4 (with CUctxCreateParams, ignored).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    context: *mut *mut c_void,
    _params: *mut c_void,
    flags: u32,
    device: i32,
) -> i32 {
    cuCtxCreate_v2(context, flags, device)
}

/// cuCtxDestroy_v2.
#[no_mangle]
pub extern "C" fn cuCtxDestroy_v2(context: *mut c_void) -> i32 {
    with_driver(|driver| driver.destroy_context(context as u64))
}

/// cuCtxSetCurrent (NULL unbinds).
#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(context: *mut c_void) -> i32 {
    with_driver(|driver| {
        let handle = context as u64;
        if handle != 0 && !driver.context_known(handle) {
            return code::INVALID_CONTEXT;
        }
        driver.set_current(handle);
        code::SUCCESS
    })
}

/// cuCtxGetCurrent (NULL when none).
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(context: *mut *mut c_void) -> i32 {
    with_driver(|driver| {
        if put(context, driver.current() as *mut c_void) {
            code::SUCCESS
        } else {
            code::INVALID_VALUE
        }
    })
}

/// cuCtxGetDevice: the current context's device.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut i32) -> i32 {
    with_driver(|driver| match driver.current_device() {
        Ok(ordinal) if put(device, ordinal as i32) => code::SUCCESS,
        Ok(_) => code::INVALID_VALUE,
        Err(error) => error,
    })
}

/// cuCtxPushCurrent_v2.
#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(context: *mut c_void) -> i32 {
    with_driver(|driver| {
        if !driver.context_known(context as u64) {
            return code::INVALID_CONTEXT;
        }
        driver.push_current(context as u64);
        code::SUCCESS
    })
}

/// cuCtxPopCurrent_v2.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(context: *mut *mut c_void) -> i32 {
    with_driver(|driver| match driver.pop_current() {
        0 => code::INVALID_CONTEXT,
        handle => {
            put(context, handle as *mut c_void);
            code::SUCCESS
        }
    })
}
