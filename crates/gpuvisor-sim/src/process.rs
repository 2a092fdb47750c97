//! This process's id, cached: `getpid()` is a system call, and the driver needs the pid on
//! every call (to notice a fork, and to tell its own slot from others'). A `pthread_atfork`
//! child handler refreshes the cache and tells the driver to start over, as CUDA state does
//! not survive a fork.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

extern "C" {
    fn getpid() -> i32;
    fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> i32;
}

/// The cached pid; 0 until the first call.
static PID: AtomicU32 = AtomicU32::new(0);
static REGISTER: Once = Once::new();

/// This process's id, without a system call after the first.
#[inline]
pub fn pid() -> u32 {
    let pid = PID.load(Ordering::Relaxed);
    if pid != 0 {
        return pid;
    }
    first_pid()
}

#[cold]
fn first_pid() -> u32 {
    REGISTER.call_once(|| {
        // SAFETY: registers a plain function; glibc keeps it until the library is unloaded.
        // Registered before the pid is cached, so no fork can slip between the two unnoticed.
        unsafe { pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { getpid() } as u32;
    PID.store(pid, Ordering::Relaxed);
    pid
}

/// Runs in the child right after `fork()` (only the forking thread exists there).
extern "C" fn after_fork_in_child() {
    // SAFETY: getpid has no preconditions and is async-signal-safe.
    PID.store(unsafe { getpid() } as u32, Ordering::Relaxed);
    crate::driver::forget_after_fork();
}

#[cfg(test)]
mod tests {
    use crate::api_device::{cuCtxSetCurrent, cuDevicePrimaryCtxRetain, cuInit};
    use crate::api_memory::{cuMemAlloc_v2, cuMemFree_v2};
    use crate::driver::code;

    extern "C" {
        fn fork() -> i32;
        fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
        fn _exit(status: i32) -> !;
    }

    /// cuInit, the primary context of device 0 made current, one allocation.
    fn init_and_allocate() -> Result<u64, i32> {
        let mut context = std::ptr::null_mut();
        let mut address = 0u64;
        // SAFETY: valid out-pointers, as the driver API requires.
        let results = unsafe {
            [
                cuInit(0),
                cuDevicePrimaryCtxRetain(&mut context, 0),
                cuCtxSetCurrent(context),
                cuMemAlloc_v2(&mut address, 1 << 20),
            ]
        };
        match results.into_iter().find(|&result| result != code::SUCCESS) {
            Some(error) => Err(error),
            None => Ok(address),
        }
    }

    #[test]
    fn cached_pid_is_this_process() {
        assert_eq!(super::pid(), std::process::id());
        assert_eq!(super::pid(), std::process::id());
    }

    /// The only test that uses the process-wide driver (the others build their own).
    #[test]
    fn a_forked_child_starts_uninitialised_with_its_own_pid() {
        let parent_address = init_and_allocate().expect("parent set-up");
        // SAFETY: the child runs only the code below (no locks held by other threads are
        // needed: the driver lock is free, as this is the only test using it) and then _exits.
        let child = unsafe { fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            let mut address = 0u64;
            // SAFETY: a valid out-pointer.
            let status = if super::pid() != std::process::id() {
                1
            } else if unsafe { cuMemAlloc_v2(&mut address, 1) } != code::NOT_INITIALIZED {
                2 // the parent's state leaked into the child
            } else if cuMemFree_v2(parent_address) != code::NOT_INITIALIZED {
                3
            } else if init_and_allocate().is_err() {
                4 // cuInit again must give a working driver
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
    }
}
