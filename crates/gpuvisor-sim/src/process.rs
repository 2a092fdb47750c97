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
    #[test]
    fn cached_pid_is_this_process() {
        assert_eq!(super::pid(), std::process::id());
        assert_eq!(super::pid(), std::process::id());
    }
}
