//! The NVML stand-in: the same library installed as `libnvidia-ml.so.1` answers NVML calls
//! like an H100 machine with the simulator's devices, so gpuvisor's inventory, sampler, `top`
//! and `doctor`, nvitop, gpustat and the frameworks' NVML probes run against the simulator.
//!
//! glibc loads one object for both names (same inode), so NVML and the driver share one state:
//! memory in use and the running processes come from the same physical table the driver
//! charges (the shared state file, or this process's own table without one). NVML lists every
//! physical device whatever `CUDA_VISIBLE_DEVICES` says, as the real NVML does.
//!
//! - [`machine`] holds the pure parts (devices, versions, bus ids, process lists);
//! - [`api_system`] initialisation, versions, counts and handles;
//! - [`api_device`] the fixed facts of a device (PCI, clocks, power, modes);
//! - [`api_memory`] memory, utilisation and running processes.
//!
//! Every entry point returns an `nvmlReturn_t` and never unwinds into its caller.

pub mod api_device;
pub mod api_memory;
pub mod api_system;
pub mod machine;

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use crate::config::{SimDevice, MAX_DEVICES};
use crate::physical::Physical;
use machine::Machine;

/// nvmlReturn_t values.
pub mod ret {
    /// The call succeeded.
    pub const SUCCESS: u32 = 0;
    /// nvmlInit was not called (or every init was shut down).
    pub const UNINITIALIZED: u32 = 1;
    /// A bad argument (NULL output, unknown handle, bad enum value).
    pub const INVALID_ARGUMENT: u32 = 2;
    /// The device does not support the query.
    pub const NOT_SUPPORTED: u32 = 3;
    /// No device, or nothing to report.
    pub const NOT_FOUND: u32 = 6;
    /// The caller's buffer is too small; the size needed is written back.
    pub const INSUFFICIENT_SIZE: u32 = 7;
    /// The machine is misconfigured (an invalid `GPUVISOR_SIM_GPUS`).
    pub const DRIVER_NOT_LOADED: u32 = 9;
    /// A versioned struct of a version this library does not know.
    pub const ARGUMENT_VERSION_MISMATCH: u32 = 25;
    /// An internal error (a panic caught at the boundary).
    pub const UNKNOWN: u32 = 999;
}

/// A device handle points at one of these; callers never look inside.
#[repr(C)]
pub struct DeviceRecord {
    index: u32,
}

/// One record per possible device: handles are stable addresses for the process's lifetime.
static RECORDS: [DeviceRecord; MAX_DEVICES] = records();

const fn records() -> [DeviceRecord; MAX_DEVICES] {
    let mut records = [const { DeviceRecord { index: 0 } }; MAX_DEVICES];
    let mut index = 0;
    while index < MAX_DEVICES {
        records[index].index = index as u32;
        index += 1;
    }
    records
}

/// `nvmlDevice_t`.
pub type Handle = *mut c_void;

/// The handle of the device with NVML index `index`.
pub fn handle_of(index: u32) -> Handle {
    std::ptr::from_ref(&RECORDS[index as usize])
        .cast_mut()
        .cast()
}

/// Balance of nvmlInit and nvmlShutdown calls: NVML counts them.
static INIT_COUNT: AtomicU32 = AtomicU32::new(0);
/// The machine, read from the environment at the first nvmlInit and kept (leaked).
static MACHINE: AtomicPtr<Machine> = AtomicPtr::new(std::ptr::null_mut());
/// This process's mapping of the shared state file, made on first need.
static STATE_TABLE: AtomicPtr<Physical> = AtomicPtr::new(std::ptr::null_mut());

/// Publishes `machine` unless one is already there; the one in use either way.
fn install(machine: Machine) -> &'static Machine {
    let fresh = Box::into_raw(Box::new(machine));
    match MACHINE.compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: just published from a leaked Box; never freed.
        Ok(_) => unsafe { &*fresh },
        Err(current) => {
            // SAFETY: `fresh` came from Box::into_raw above and was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: a published machine is leaked, never freed.
            unsafe { &*current }
        }
    }
}

/// nvmlInit: reads the machine once per process and counts the init.
fn init() -> u32 {
    if MACHINE.load(Ordering::Acquire).is_null() {
        match Machine::from_environment() {
            Ok(machine) => {
                install(machine);
            }
            Err(reason) => {
                eprintln!("gpuvisor-sim (NVML): {reason}");
                return ret::DRIVER_NOT_LOADED;
            }
        }
    }
    INIT_COUNT.fetch_add(1, Ordering::AcqRel);
    ret::SUCCESS
}

/// nvmlShutdown: one init fewer.
fn shutdown() -> u32 {
    match INIT_COUNT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| {
        count.checked_sub(1)
    }) {
        Ok(_) => ret::SUCCESS,
        Err(_) => ret::UNINITIALIZED,
    }
}

/// The machine, when NVML is initialised.
fn machine() -> Result<&'static Machine, u32> {
    let machine = MACHINE.load(Ordering::Acquire);
    if INIT_COUNT.load(Ordering::Acquire) == 0 || machine.is_null() {
        return Err(ret::UNINITIALIZED);
    }
    // SAFETY: a published machine is leaked, never freed.
    Ok(unsafe { &*machine })
}

/// The device a handle names, or INVALID_ARGUMENT for anything that is not one of ours.
fn device_of(machine: &'static Machine, handle: Handle) -> Result<&'static SimDevice, u32> {
    let base = RECORDS.as_ptr() as usize;
    let offset = (handle as usize).wrapping_sub(base);
    let size = std::mem::size_of::<DeviceRecord>();
    if offset % size != 0 {
        return Err(ret::INVALID_ARGUMENT);
    }
    machine.device(offset / size).ok_or(ret::INVALID_ARGUMENT)
}

/// The physical table NVML reads: the shared state file when there is one (mapped on first
/// need), else this process's own driver table (only its own use), else none.
fn physical(machine: &Machine) -> Option<&'static Physical> {
    let Some(path) = machine.state_path.as_deref() else {
        return crate::driver::published().map(|table| &table.physical);
    };
    let mapped = STATE_TABLE.load(Ordering::Acquire);
    if !mapped.is_null() {
        // SAFETY: a published table is leaked, never freed.
        return Some(unsafe { &*mapped });
    }
    let fresh = Box::into_raw(Box::new(Physical::open(Some(path))));
    match STATE_TABLE.compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: just published from a leaked Box; never freed.
        Ok(_) => Some(unsafe { &*fresh }),
        // Another thread mapped it first; ours stays leaked (a mapping, never unmapped anyway).
        // SAFETY: a published table is leaked, never freed.
        Err(current) => Some(unsafe { &*current }),
    }
}

/// Runs an entry point's body: its error code on `Err`, UNKNOWN if it panicked (a panic must
/// not unwind into C).
fn guarded(body: impl FnOnce() -> Result<u32, u32>) -> u32 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(code) | Err(code)) => code,
        Err(_) => ret::UNKNOWN,
    }
}

/// Runs `body` on the device `handle` names, guarded.
fn with_device(
    handle: Handle,
    body: impl FnOnce(&'static Machine, &'static SimDevice) -> Result<u32, u32>,
) -> u32 {
    guarded(|| {
        let machine = machine()?;
        let device = device_of(machine, handle)?;
        body(machine, device)
    })
}

/// Writes `value` through `pointer`; INVALID_ARGUMENT when it is NULL.
///
/// # Safety
/// `pointer` is NULL or valid for a write of `T`, as NVML requires of callers.
unsafe fn out<T>(pointer: *mut T, value: T) -> Result<(), u32> {
    // SAFETY: forwarded from this function's contract.
    if unsafe { crate::put(pointer, value) } {
        Ok(())
    } else {
        Err(ret::INVALID_ARGUMENT)
    }
}

/// Copies `text` and a NUL into `buffer` of `length` bytes: INSUFFICIENT_SIZE (nothing
/// written) when it does not fit, as NVML does.
///
/// # Safety
/// `buffer` is NULL or valid for writes of `length` bytes.
unsafe fn out_text(buffer: *mut c_char, length: u32, text: &str) -> Result<u32, u32> {
    if buffer.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    if (length as usize) < text.len() + 1 {
        return Err(ret::INSUFFICIENT_SIZE);
    }
    // SAFETY: `buffer` has `length` > text.len() writable bytes by this function's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buffer.cast::<u8>(), text.len());
        *buffer.add(text.len()) = 0;
    }
    Ok(ret::SUCCESS)
}

/// Fills a fixed-size C string field (truncating, always NUL-terminated).
fn fill_field(field: &mut [u8], text: &str) {
    field.fill(0);
    let count = text.len().min(field.len().saturating_sub(1));
    field[..count].copy_from_slice(&text.as_bytes()[..count]);
}

/// The version word of a versioned NVML struct: its size, and the version in the top byte.
const fn struct_version<T>(version: u32) -> u32 {
    std::mem::size_of::<T>() as u32 | version << 24
}

#[cfg(test)]
mod tests;
