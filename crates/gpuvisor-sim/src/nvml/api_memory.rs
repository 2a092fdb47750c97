//! NVML entry points for what changes while programs run: memory in use, utilisation and
//! the processes on a device, all from the simulator's physical table (the state file shared
//! by every process of the simulated machine, or this process's own table without one).

use super::machine::{for_each_process, used_bytes};
use super::{out, physical, ret, struct_version, with_device, Handle};

/// `nvmlMemory_t`, and `nvmlBAR1Memory_t` (the same layout).
#[repr(C)]
pub struct Memory {
    pub(crate) total: u64,
    pub(crate) free: u64,
    pub(crate) used: u64,
}

/// `nvmlMemory_v2_t`: `reserved` (memory the driver and firmware keep) is 0 here.
#[repr(C)]
pub struct MemoryV2 {
    pub(crate) version: u32,
    pub(crate) total: u64,
    pub(crate) reserved: u64,
    pub(crate) free: u64,
    pub(crate) used: u64,
}

/// nvmlDeviceGetMemoryInfo: total, physical use of everyone (foreign + every live process)
/// and the rest free.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: Handle, memory: *mut Memory) -> u32 {
    with_device(device, |machine, device| {
        let used = used_bytes(device, physical(machine));
        let answer = Memory {
            total: device.total_bytes,
            free: device.total_bytes - used,
            used,
        };
        // SAFETY: `memory` is NULL or a writable nvmlMemory_t.
        unsafe { out(memory, answer) }.map(|()| ret::SUCCESS)
    })
}

/// nvmlDeviceGetMemoryInfo_v2: the same figures in the versioned struct.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: Handle, memory: *mut MemoryV2) -> u32 {
    with_device(device, |machine, device| {
        if memory.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL; the caller's struct starts with its version word.
        let version = unsafe { (*memory).version };
        if version != struct_version::<MemoryV2>(2) {
            return Err(ret::ARGUMENT_VERSION_MISMATCH);
        }
        let used = used_bytes(device, physical(machine));
        // SAFETY: a writable v2 struct of the caller's.
        unsafe {
            memory.write(MemoryV2 {
                version,
                total: device.total_bytes,
                reserved: 0,
                free: device.total_bytes - used,
                used,
            })
        };
        Ok(ret::SUCCESS)
    })
}

/// nvmlDeviceGetBAR1MemoryInfo: an H100's 128 GiB aperture, 1 MiB of it mapped.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBAR1MemoryInfo(device: Handle, bar1: *mut Memory) -> u32 {
    with_device(device, |_, _| {
        let (total, used) = (128 << 30, 1 << 20);
        let answer = Memory {
            total,
            free: total - used,
            used,
        };
        // SAFETY: `bar1` is NULL or a writable nvmlBAR1Memory_t.
        unsafe { out(bar1, answer) }.map(|()| ret::SUCCESS)
    })
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct Utilization {
    pub(crate) gpu: u32,
    pub(crate) memory: u32,
}

/// nvmlDeviceGetUtilizationRates: 0% (simulated kernels take no time).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: Handle,
    utilization: *mut Utilization,
) -> u32 {
    with_device(device, |_, _| {
        // SAFETY: `utilization` is NULL or a writable nvmlUtilization_t.
        unsafe { out(utilization, Utilization { gpu: 0, memory: 0 }) }.map(|()| ret::SUCCESS)
    })
}

/// The encoder or decoder: idle, over NVML's usual 167 ms sampling period.
///
/// # Safety
/// Both pointers are NULL or writable.
unsafe fn idle_engine(device: Handle, utilization: *mut u32, period_us: *mut u32) -> u32 {
    with_device(device, |_, _| {
        // SAFETY: forwarded from this function's contract.
        unsafe {
            out(utilization, 0)?;
            out(period_us, 167_000)?;
        }
        Ok(ret::SUCCESS)
    })
}

/// nvmlDeviceGetEncoderUtilization: idle.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: Handle,
    utilization: *mut u32,
    period_us: *mut u32,
) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { idle_engine(device, utilization, period_us) }
}

/// nvmlDeviceGetDecoderUtilization: idle.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: Handle,
    utilization: *mut u32,
    period_us: *mut u32,
) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { idle_engine(device, utilization, period_us) }
}

/// `nvmlProcessInfo_v1_t` (the unversioned calls).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessInfoV1 {
    /// Process id.
    pub pid: u32,
    /// Bytes it holds on the device.
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_t` / `nvmlProcessInfo_v2_t` (the `_v2` and `_v3` calls).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Process id.
    pub pid: u32,
    /// Bytes it holds on the device.
    pub used_gpu_memory: u64,
    /// The GPU instance, 0xFFFFFFFF without MIG.
    pub gpu_instance_id: u32,
    /// The compute instance, 0xFFFFFFFF without MIG.
    pub compute_instance_id: u32,
}

/// Instance ids of a process on a GPU without MIG.
const NO_INSTANCE: u32 = u32::MAX;

impl From<(u32, u64)> for ProcessInfoV1 {
    fn from((pid, used_gpu_memory): (u32, u64)) -> Self {
        ProcessInfoV1 {
            pid,
            used_gpu_memory,
        }
    }
}

impl From<(u32, u64)> for ProcessInfo {
    fn from((pid, used_gpu_memory): (u32, u64)) -> Self {
        ProcessInfo {
            pid,
            used_gpu_memory,
            gpu_instance_id: NO_INSTANCE,
            compute_instance_id: NO_INSTANCE,
        }
    }
}

/// Which processes a listing asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Processes with a compute context: every live process holding memory.
    Compute,
    /// Graphics and MPS clients: there are none on the simulator.
    None,
}

/// The `*infoCount` protocol of the process listings: on entry the room in `infos` (NULL:
/// none), on return how many processes there are; INSUFFICIENT_SIZE when they do not fit.
///
/// # Safety
/// `count` is NULL or valid for reads and writes; `infos` is NULL or has `*count` writable
/// entries.
unsafe fn running_processes<T: From<(u32, u64)>>(
    device: Handle,
    count: *mut u32,
    infos: *mut T,
    kind: Kind,
) -> u32 {
    with_device(device, |machine, device| {
        if count.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL and readable by this function's contract.
        let offered = unsafe { *count } as usize;
        let room = if infos.is_null() { 0 } else { offered };
        let total = match kind {
            Kind::Compute => {
                for_each_process(device, physical(machine), |position, pid, bytes| {
                    if position < room {
                        // SAFETY: position < room = the caller's number of entries.
                        unsafe { infos.add(position).write(T::from((pid, bytes))) };
                    }
                })
            }
            Kind::None => 0,
        };
        // SAFETY: non-NULL and writable by this function's contract.
        unsafe { *count = total as u32 };
        if total > room {
            Err(ret::INSUFFICIENT_SIZE)
        } else {
            Ok(ret::SUCCESS)
        }
    })
}

/// Defines process listings `fn(device, *mut count, *mut INFO) -> u32` of one kind.
macro_rules! process_lists {
    ($($(#[$doc:meta])* $name:ident($info:ty) = $kind:expr;)*) => {$(
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name(device: Handle, count: *mut u32, infos: *mut $info) -> u32 {
            // SAFETY: the caller follows the `*infoCount` protocol, as NVML requires.
            unsafe { running_processes(device, count, infos, $kind) }
        }
    )*};
}

process_lists! {
    /// nvmlDeviceGetComputeRunningProcesses_v3: every live process holding memory on the device,
    /// with what it holds physically (allocations, contexts, pool reserves).
    nvmlDeviceGetComputeRunningProcesses_v3(ProcessInfo) = Kind::Compute;

    /// nvmlDeviceGetComputeRunningProcesses_v2.
    nvmlDeviceGetComputeRunningProcesses_v2(ProcessInfo) = Kind::Compute;

    /// nvmlDeviceGetComputeRunningProcesses (the v1 layout).
    nvmlDeviceGetComputeRunningProcesses(ProcessInfoV1) = Kind::Compute;

    /// nvmlDeviceGetGraphicsRunningProcesses_v3: none.
    nvmlDeviceGetGraphicsRunningProcesses_v3(ProcessInfo) = Kind::None;

    /// nvmlDeviceGetGraphicsRunningProcesses_v2: none.
    nvmlDeviceGetGraphicsRunningProcesses_v2(ProcessInfo) = Kind::None;

    /// nvmlDeviceGetGraphicsRunningProcesses: none.
    nvmlDeviceGetGraphicsRunningProcesses(ProcessInfoV1) = Kind::None;

    /// nvmlDeviceGetMPSComputeRunningProcesses_v3: none (no MPS server).
    nvmlDeviceGetMPSComputeRunningProcesses_v3(ProcessInfo) = Kind::None;

    /// nvmlDeviceGetMPSComputeRunningProcesses_v2: none.
    nvmlDeviceGetMPSComputeRunningProcesses_v2(ProcessInfo) = Kind::None;

    /// nvmlDeviceGetMPSComputeRunningProcesses: none.
    nvmlDeviceGetMPSComputeRunningProcesses(ProcessInfoV1) = Kind::None;
}

/// `nvmlProcessDetail_v1_t`.
#[repr(C)]
pub struct ProcessDetailV1 {
    pub(crate) pid: u32,
    pub(crate) used_gpu_memory: u64,
    pub(crate) gpu_instance_id: u32,
    pub(crate) compute_instance_id: u32,
    pub(crate) used_gpu_cc_protected_memory: u64,
}

impl From<(u32, u64)> for ProcessDetailV1 {
    fn from((pid, used_gpu_memory): (u32, u64)) -> Self {
        ProcessDetailV1 {
            pid,
            used_gpu_memory,
            gpu_instance_id: NO_INSTANCE,
            compute_instance_id: NO_INSTANCE,
            used_gpu_cc_protected_memory: 0,
        }
    }
}

/// `nvmlProcessDetailList_v1_t`.
#[repr(C)]
pub struct ProcessDetailListV1 {
    pub(crate) version: u32,
    pub(crate) mode: u32,
    pub(crate) entries: u32,
    pub(crate) processes: *mut ProcessDetailV1,
}

/// nvmlDeviceGetRunningProcessDetailList: the compute processes (mode 0 or 3 = all), none for
/// graphics (1) and MPS (2). Exported also because nvitop picks the process struct layout by
/// whether this function exists.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRunningProcessDetailList(
    device: Handle,
    list: *mut ProcessDetailListV1,
) -> u32 {
    if list.is_null() {
        return ret::INVALID_ARGUMENT;
    }
    // SAFETY: non-NULL; the caller's struct starts with its version word.
    let (version, mode) = unsafe { ((*list).version, (*list).mode) };
    if version != struct_version::<ProcessDetailListV1>(1) {
        return ret::ARGUMENT_VERSION_MISMATCH;
    }
    let kind = match mode {
        0 | 3 => Kind::Compute,
        1 | 2 => Kind::None,
        _ => return ret::INVALID_ARGUMENT,
    };
    // SAFETY: the entries count and array are the caller's, as the `*infoCount` protocol wants.
    unsafe {
        running_processes(
            device,
            std::ptr::addr_of_mut!((*list).entries),
            (*list).processes,
            kind,
        )
    }
}

/// nvmlDeviceGetProcessUtilization: NOT_FOUND, NVML's answer when no process has a sample
/// since `last_seen` (simulated kernels take no time).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: Handle,
    _samples: *mut std::ffi::c_void,
    count: *mut u32,
    _last_seen: u64,
) -> u32 {
    with_device(device, |_, _| {
        if count.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL and writable per NVML's contract.
        unsafe { *count = 0 };
        Err(ret::NOT_FOUND)
    })
}
