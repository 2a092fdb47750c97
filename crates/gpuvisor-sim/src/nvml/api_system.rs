//! NVML entry points: initialisation, error strings, versions, device counts and handles.

use std::ffi::{c_char, CStr};

use super::machine::Machine;
use super::{guarded, handle_of, machine, out, out_text, ret, struct_version, Handle};

/// nvmlInit_v2.
#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> u32 {
    guarded(|| Ok(super::init()))
}

/// nvmlInit (the pre-v2 name: the same here).
#[no_mangle]
pub extern "C" fn nvmlInit() -> u32 {
    nvmlInit_v2()
}

/// nvmlInitWithFlags: the flags (no-GPU and no-attach modes) change nothing here.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: u32) -> u32 {
    nvmlInit_v2()
}

/// nvmlShutdown.
#[no_mangle]
pub extern "C" fn nvmlShutdown() -> u32 {
    guarded(|| Ok(super::shutdown()))
}

/// nvmlErrorString: a static description of `result` (never NULL).
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: u32) -> *const c_char {
    let text: &'static CStr = match result {
        ret::SUCCESS => c"Success",
        ret::UNINITIALIZED => c"Uninitialized",
        ret::INVALID_ARGUMENT => c"Invalid Argument",
        ret::NOT_SUPPORTED => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        ret::NOT_FOUND => c"Not Found",
        ret::INSUFFICIENT_SIZE => c"Insufficient Size",
        8 => c"Insufficient External Power",
        ret::DRIVER_NOT_LOADED => c"Driver Not Loaded",
        10 => c"Timeout",
        13 => c"Function Not Found",
        15 => c"GPU is lost",
        ret::ARGUMENT_VERSION_MISMATCH => c"Version Mismatch",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

/// nvmlSystemGetDriverVersion: the display driver matching the CUDA version.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: u32) -> u32 {
    // SAFETY: the caller gives `length` writable bytes.
    guarded(|| unsafe { out_text(version, length, machine()?.driver_version()) })
}

/// nvmlSystemGetNVMLVersion: `<CUDA major>.<driver version>`, as NVML spells it.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: u32) -> u32 {
    guarded(|| {
        let machine = machine()?;
        let text = format!(
            "{}.{}",
            machine.cuda_version / 1000,
            machine.driver_version()
        );
        // SAFETY: the caller gives `length` writable bytes.
        unsafe { out_text(version, length, &text) }
    })
}

/// nvmlSystemGetCudaDriverVersion: the CUDA version (13020 = 13.2).
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut i32) -> u32 {
    // SAFETY: `version` is NULL or writable.
    guarded(|| unsafe { out(version, machine()?.cuda_version).map(|()| ret::SUCCESS) })
}

/// nvmlSystemGetCudaDriverVersion_v2 (the same value).
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut i32) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { nvmlSystemGetCudaDriverVersion(version) }
}

/// nvmlSystemGetProcessName: the process's command name from /proc.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetProcessName(pid: u32, name: *mut c_char, length: u32) -> u32 {
    guarded(|| {
        machine()?;
        let comm =
            std::fs::read_to_string(format!("/proc/{pid}/comm")).map_err(|_| ret::NOT_FOUND)?;
        // SAFETY: the caller gives `length` writable bytes.
        unsafe { out_text(name, length, comm.trim_end()) }
    })
}

/// `nvmlSystemConfComputeSettings_v1_t`.
#[repr(C)]
pub struct ConfComputeSettingsV1 {
    pub(crate) version: u32,
    pub(crate) environment: u32,
    pub(crate) cc_feature: u32,
    pub(crate) dev_tools_mode: u32,
    pub(crate) multi_gpu_mode: u32,
}

/// nvmlSystemGetConfComputeSettings: confidential computing off, as on an H100 outside a CC
/// VM (NCCL reads `ccFeature`).
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetConfComputeSettings(
    settings: *mut ConfComputeSettingsV1,
) -> u32 {
    guarded(|| {
        machine()?;
        if settings.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL; the caller's struct starts with its version word.
        let version = unsafe { (*settings).version };
        if version != struct_version::<ConfComputeSettingsV1>(1) {
            return Err(ret::ARGUMENT_VERSION_MISMATCH);
        }
        // SAFETY: a v1 struct of the caller's, writable.
        unsafe {
            settings.write(ConfComputeSettingsV1 {
                version,
                environment: 0,
                cc_feature: 0,
                dev_tools_mode: 0,
                multi_gpu_mode: 0,
            })
        };
        Ok(ret::SUCCESS)
    })
}

/// `nvmlConfComputeSystemState_t`.
#[repr(C)]
pub struct ConfComputeSystemState {
    pub(crate) environment: u32,
    pub(crate) cc_feature: u32,
    pub(crate) dev_tools_mode: u32,
}

/// nvmlSystemGetConfComputeState (the pre-12.4 form NCCL falls back to): off.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetConfComputeState(state: *mut ConfComputeSystemState) -> u32 {
    guarded(|| {
        machine()?;
        let off = ConfComputeSystemState {
            environment: 0,
            cc_feature: 0,
            dev_tools_mode: 0,
        };
        // SAFETY: `state` is NULL or writable.
        unsafe { out(state, off) }.map(|()| ret::SUCCESS)
    })
}

/// nvmlDeviceGetCount_v2: every physical device (`CUDA_VISIBLE_DEVICES` does not apply).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut u32) -> u32 {
    // SAFETY: `count` is NULL or writable.
    guarded(|| unsafe { out(count, machine()?.devices.len() as u32).map(|()| ret::SUCCESS) })
}

/// nvmlDeviceGetCount.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut u32) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

/// Writes the handle of the device `find` picks, or NOT_FOUND.
///
/// # Safety
/// `device` is NULL or writable.
unsafe fn found_handle(device: *mut Handle, find: impl FnOnce(&Machine) -> Option<u32>) -> u32 {
    guarded(|| {
        let machine = machine()?;
        let index = find(machine).ok_or(ret::NOT_FOUND)?;
        // SAFETY: forwarded from this function's contract.
        unsafe { out(device, handle_of(index)) }.map(|()| ret::SUCCESS)
    })
}

/// nvmlDeviceGetHandleByIndex_v2.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: u32, device: *mut Handle) -> u32 {
    guarded(|| {
        let machine = machine()?;
        if machine.device(index as usize).is_none() {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: `device` is NULL or writable.
        unsafe { out(device, handle_of(index)) }.map(|()| ret::SUCCESS)
    })
}

/// nvmlDeviceGetHandleByIndex.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(index: u32, device: *mut Handle) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// Reads a C string argument; None for NULL or text that is not UTF-8.
///
/// # Safety
/// `text` is NULL or a NUL-terminated string.
unsafe fn text_argument<'a>(text: *const c_char) -> Option<&'a str> {
    if text.is_null() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated by this function's contract.
    unsafe { CStr::from_ptr(text) }.to_str().ok()
}

/// nvmlDeviceGetHandleByUUID.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut Handle,
) -> u32 {
    // SAFETY: `uuid` is NULL or a C string.
    let Some(uuid) = (unsafe { text_argument(uuid) }) else {
        return ret::INVALID_ARGUMENT;
    };
    // SAFETY: `device` is NULL or writable.
    unsafe { found_handle(device, |machine| Some(machine.device_by_uuid(uuid)?.index)) }
}

/// nvmlDeviceGetHandleByPciBusId_v2: `0000:01:00.0` and `00000000:01:00.0` alike.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut Handle,
) -> u32 {
    // SAFETY: `bus_id` is NULL or a C string.
    let Some(bus_id) = (unsafe { text_argument(bus_id) }) else {
        return ret::INVALID_ARGUMENT;
    };
    if super::machine::parse_bus_id(bus_id).is_none() {
        return ret::INVALID_ARGUMENT;
    }
    // SAFETY: `device` is NULL or writable.
    unsafe {
        found_handle(device, |machine| {
            Some(machine.device_by_bus_id(bus_id)?.index)
        })
    }
}

/// nvmlDeviceGetHandleByPciBusId.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    device: *mut Handle,
) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(bus_id, device) }
}

/// nvmlDeviceGetHandleBySerial.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    device: *mut Handle,
) -> u32 {
    // SAFETY: `serial` is NULL or a C string.
    let Some(serial) = (unsafe { text_argument(serial) }) else {
        return ret::INVALID_ARGUMENT;
    };
    // SAFETY: `device` is NULL or writable.
    unsafe {
        found_handle(device, |machine| {
            let found = machine
                .devices
                .iter()
                .find(|d| super::api_device::serial(d) == serial);
            Some(found?.index)
        })
    }
}
