//! The handful of libc functions the ledger needs, declared by hand so the crate has no
//! dependencies (it is also compiled with plain `rustc` by the CLI's build script).

use std::os::raw::{c_int, c_void};

/// `PROT_READ` from `<sys/mman.h>`.
pub const PROT_READ: c_int = 0x1;
/// `PROT_WRITE` from `<sys/mman.h>`.
pub const PROT_WRITE: c_int = 0x2;
/// `MAP_SHARED` from `<sys/mman.h>`.
pub const MAP_SHARED: c_int = 0x01;
/// `MAP_FAILED` from `<sys/mman.h>`.
pub const MAP_FAILED: *mut c_void = !0usize as *mut c_void;
/// `O_NONBLOCK` from `<fcntl.h>` (Linux).
pub const O_NONBLOCK: c_int = 0o4000;
/// `O_NOCTTY` from `<fcntl.h>` (Linux).
pub const O_NOCTTY: c_int = 0o400;
/// `EPERM` from `<errno.h>`.
pub const EPERM: i32 = 1;

/// `CLOCK_MONOTONIC` from `<time.h>`.
pub const CLOCK_MONOTONIC: c_int = 1;

/// `struct timespec` (64-bit Linux).
#[repr(C)]
pub struct Timespec {
    /// Seconds.
    pub tv_sec: i64,
    /// Nanoseconds.
    pub tv_nsec: i64,
}

extern "C" {
    /// clock_gettime(2): answered by the vDSO on Linux, without entering the kernel.
    pub fn clock_gettime(clock: c_int, tp: *mut Timespec) -> c_int;
    /// mmap(2).
    pub fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        offset: i64,
    ) -> *mut c_void;
    /// munmap(2).
    pub fn munmap(addr: *mut c_void, len: usize) -> c_int;
    /// kill(2); signal 0 only probes existence.
    pub fn kill(pid: i32, sig: c_int) -> c_int;
    /// getpid(2).
    pub fn getpid() -> i32;
}

/// `CLOCK_MONOTONIC` in nanoseconds (the same clock in every process of the machine). No
/// system call on Linux (vDSO), no allocation.
pub fn monotonic_ns() -> u64 {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    if unsafe { clock_gettime(CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}
