//! Tests through the exported entry points, on the process-wide driver: the lock-free hot path
//! of cuMemAlloc_v2/cuMemFree_v2 against context changes and fork. They share one driver, so
//! they take turns (and a fork never happens while another test holds the driver lock).

use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard, Once};

use crate::api_device::{cuCtxCreate_v2, cuCtxDestroy_v2, cuCtxSetCurrent, cuInit};
use crate::api_memory::{cuMemAlloc_v2, cuMemFree_v2};
use crate::driver::{code, ADDRESS_BASE};

extern "C" {
    fn fork() -> i32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn _exit(status: i32) -> !;
}

static TURN: Mutex<()> = Mutex::new(());
static SETUP: Once = Once::new();

/// The shared driver, initialised on two 1 GiB devices; hold the guard for the whole test.
fn driver() -> MutexGuard<'static, ()> {
    let turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    SETUP.call_once(|| {
        // Only these tests read the environment, and only here, before the first cuInit.
        std::env::set_var(crate::config::SIM_GPUS_ENV, "2x1GiB");
    });
    assert_eq!(cuInit(0), code::SUCCESS);
    turn
}

fn new_context(device: i32) -> *mut c_void {
    let mut context = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    assert_eq!(
        unsafe { cuCtxCreate_v2(&mut context, 0, device) },
        code::SUCCESS
    );
    context
}

fn allocate(bytes: usize) -> Result<u64, i32> {
    let mut address = 0u64;
    // SAFETY: a valid out-pointer.
    match unsafe { cuMemAlloc_v2(&mut address, bytes) } {
        code::SUCCESS => Ok(address),
        error => Err(error),
    }
}

fn device_of(address: u64) -> u64 {
    (address - ADDRESS_BASE) >> 40 & 63
}

#[test]
fn the_cached_current_device_follows_context_changes_in_any_thread() {
    let _turn = driver();
    let first = new_context(0);
    let address = allocate(1 << 20).unwrap();
    assert_eq!(device_of(address), 0);
    assert_eq!(cuMemFree_v2(address), code::SUCCESS);
    assert_eq!(cuMemFree_v2(address), code::INVALID_VALUE, "double free");

    // Switching context switches device at once.
    let second = new_context(1);
    let address = allocate(1 << 20).unwrap();
    assert_eq!(device_of(address), 1);
    assert_eq!(cuMemFree_v2(address), code::SUCCESS);

    // Destroyed by another thread while current here: this thread must notice.
    std::thread::scope(|scope| {
        let handle = second as usize;
        scope.spawn(move || assert_eq!(cuCtxDestroy_v2(handle as *mut c_void), code::SUCCESS));
    });
    assert_eq!(allocate(1), Err(code::INVALID_CONTEXT));

    // The stack is [first, second]: replacing the top makes device 0 current again, and
    // popping (set NULL) twice leaves no context.
    assert_eq!(cuCtxSetCurrent(first), code::SUCCESS);
    assert!(allocate(1).is_ok_and(|address| device_of(address) == 0));
    assert_eq!(cuCtxSetCurrent(std::ptr::null_mut()), code::SUCCESS);
    assert!(allocate(1).is_ok_and(|address| device_of(address) == 0));
    assert_eq!(cuCtxSetCurrent(std::ptr::null_mut()), code::SUCCESS);
    assert_eq!(allocate(1), Err(code::INVALID_CONTEXT));
    assert_eq!(cuCtxDestroy_v2(first), code::SUCCESS);
}

#[test]
fn a_forked_child_starts_uninitialised_with_its_own_pid() {
    let _turn = driver();
    let context = new_context(0);
    let parent_address = allocate(1 << 20).expect("parent allocation");
    // SAFETY: the child runs only the code below and then _exits; this thread holds the
    // driver's turn, so no other test is inside the driver when it forks.
    let child = unsafe { fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        let status = if crate::process::pid() != std::process::id() {
            1
        } else if allocate(1) != Err(code::NOT_INITIALIZED) {
            2 // the parent's state leaked into the child
        } else if cuMemFree_v2(parent_address) != code::NOT_INITIALIZED {
            3
        } else if cuInit(0) != code::SUCCESS || allocate(1) != Err(code::INVALID_CONTEXT) {
            4 // a fresh driver: initialised again, but no context yet
        } else if cuCtxSetCurrent(new_context(0)) != code::SUCCESS || allocate(1).is_err() {
            5
        } else {
            0
        };
        // SAFETY: ends the child without running the test harness's exit handlers.
        unsafe { _exit(status) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child with a valid status pointer.
    assert_eq!(unsafe { waitpid(child, &mut status, 0) }, child);
    assert_eq!(status, 0, "child failed check {}", status >> 8);
    assert_eq!(
        cuMemFree_v2(parent_address),
        code::SUCCESS,
        "parent unaffected"
    );
    assert_eq!(cuCtxDestroy_v2(context), code::SUCCESS);
}

#[test]
fn another_process_imports_an_exported_handle_without_being_charged_for_it() {
    use crate::api_copy::{cuMemExportToShareableHandle, cuMemImportFromShareableHandle};
    use crate::api_memory::{cuMemCreate, cuMemGetInfo_v2, cuMemRelease};
    let _turn = driver();
    let context = new_context(1);
    // CUmemAllocationProp: pinned, POSIX file descriptor handles, on device 1.
    let mut prop = [0u8; 32];
    prop[0..4].copy_from_slice(&1i32.to_le_bytes());
    prop[4..8].copy_from_slice(&1i32.to_le_bytes());
    prop[8..12].copy_from_slice(&1i32.to_le_bytes());
    prop[12..16].copy_from_slice(&1i32.to_le_bytes());
    let mut handle = 0u64;
    // SAFETY: valid out-pointers and a 32-byte CUmemAllocationProp.
    assert_eq!(
        unsafe { cuMemCreate(&mut handle, 2 << 20, prop.as_ptr().cast(), 0) },
        code::SUCCESS
    );
    let mut fd = -1i32;
    // SAFETY: a valid out-pointer for the descriptor.
    assert_eq!(
        unsafe { cuMemExportToShareableHandle((&raw mut fd).cast(), handle, 1, 0) },
        code::SUCCESS
    );
    // SAFETY: the child runs only the code below and then _exits; this thread holds the
    // driver's turn, so no other test is inside the driver when it forks.
    let child = unsafe { fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        // A fresh driver that never saw the export, as in the process NCCL sent the
        // descriptor to.
        let free = || {
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: valid out-pointers.
            unsafe { cuMemGetInfo_v2(&mut free, &mut total) };
            free
        };
        let mut imported = 0u64;
        let status =
            if cuInit(0) != code::SUCCESS || cuCtxSetCurrent(new_context(1)) != code::SUCCESS {
                1
            } else {
                let before = free();
                // SAFETY: a valid out-pointer; the descriptor is inherited and open.
                let result = unsafe {
                    cuMemImportFromShareableHandle(&mut imported, fd as usize as *mut c_void, 1)
                };
                if result != code::SUCCESS {
                    2
                } else if free() != before {
                    3 // the importer was charged for memory the exporter holds
                } else if cuMemRelease(imported) != code::SUCCESS || free() != before {
                    4
                } else {
                    0
                }
            };
        // SAFETY: ends the child without running the test harness's exit handlers.
        unsafe { _exit(status) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child with a valid status pointer.
    assert_eq!(unsafe { waitpid(child, &mut status, 0) }, child);
    assert_eq!(status, 0, "child failed check {}", status >> 8);
    // In the exporting process the descriptor finds the same handle again.
    let mut again = 0u64;
    // SAFETY: a valid out-pointer and our own open descriptor.
    assert_eq!(
        unsafe { cuMemImportFromShareableHandle(&mut again, fd as usize as *mut c_void, 1) },
        code::SUCCESS
    );
    assert_eq!(again, handle);
    assert_eq!(cuMemRelease(again), code::SUCCESS);
    assert_eq!(cuMemRelease(handle), code::SUCCESS);
    assert_eq!(cuCtxDestroy_v2(context), code::SUCCESS);
}
