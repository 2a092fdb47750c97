//! The gpuvisor GPU simulator: a stand-in `libcuda.so.1` with host-side accounting, so the
//! shim, `gpuvisor exec --simulate` and the tests run on machines with no GPU.
//!
//! - [`config`] reads the simulated machine from the environment (`GPUVISOR_SIM_GPUS`,
//!   `CUDA_VISIBLE_DEVICES`, `GPUVISOR_SIM_CONTEXT_OVERHEAD`);
//! - [`physical`] accounts physical memory, optionally shared by all processes through a state
//!   file (`GPUVISOR_SIM_STATE`), with dead processes' memory reclaimed;
//! - [`driver`] holds the per-process state (contexts, streams, pools);
//! - [`allocations`] is the lock-free-ish hot path of cuMemAlloc/cuMemFree (sharded table,
//!   freed addresses reused); [`process`] caches the pid and resets the driver after fork;
//! - [`api_device`], [`api_memory`] and [`symbols`] are the exported CUDA driver entry points.
//!
//! Memory is never allocated: device pointers are fake addresses that must not be
//! dereferenced. See docs/simulator.md for what is and is not modelled.
//!
//! Every exported function is a C ABI entry point whose pointer arguments follow the CUDA
//! driver API's contract (valid or NULL); that is their safety contract, stated here once.
#![allow(clippy::missing_safety_doc)]

pub mod allocations;
pub mod api_device;
pub mod api_memory;
pub mod config;
pub mod driver;
pub mod nvml;
pub mod physical;
pub mod process;
pub mod symbols;

#[cfg(test)]
mod api_tests;

/// Writes `value` through an out-pointer; false (nothing written) when it is NULL.
///
/// # Safety
/// `pointer` is NULL or valid for a write of `T`, as the driver API requires of callers.
pub(crate) unsafe fn put<T>(pointer: *mut T, value: T) -> bool {
    if pointer.is_null() {
        return false;
    }
    // SAFETY: non-NULL, and valid for writes by this function's contract.
    unsafe { pointer.write(value) };
    true
}
