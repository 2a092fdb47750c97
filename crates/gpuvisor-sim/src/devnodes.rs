//! The device nodes of a simulated machine: `/dev/nvidiactl`, `/dev/nvidia-uvm` and
//! `/dev/nvidia<N>` exist when asked with `stat`, `lstat`, `fstatat` or `access`.
//!
//! Frameworks probe for them before loading a driver at all: JAX leaves its CUDA backend out
//! unless one exists (`jax/_src/hardware_utils.py`, `has_visible_nvidia_gpu`). These
//! interpositions take effect when the simulator is preloaded (`gpuvisor --simulate` puts it in
//! `LD_PRELOAD` after the shim); every other path goes to the C library unchanged. Only the
//! x86-64 `struct stat` layout is written.

#![cfg(target_arch = "x86_64")]

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

/// The character-device major number of NVIDIA's driver.
const NVIDIA_MAJOR: u64 = 195;
/// `/dev/nvidiactl`'s minor number.
const CONTROL_MINOR: u64 = 255;
/// The major number `nvidia-uvm` gets (dynamic on real machines; any value will do).
const UVM_MAJOR: u64 = 508;
const S_IFCHR: u32 = 0o020000;
const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;

extern "C" {
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
}

/// The device number of a simulated node at `path`, if it is one.
fn simulated_node(path: &[u8]) -> Option<u64> {
    let name = path.strip_prefix(b"/dev/")?;
    match name {
        b"nvidiactl" => Some(makedev(NVIDIA_MAJOR, CONTROL_MINOR)),
        b"nvidia-uvm" => Some(makedev(UVM_MAJOR, 0)),
        _ => {
            let index: u64 = std::str::from_utf8(name.strip_prefix(b"nvidia")?)
                .ok()?
                .parse()
                .ok()?;
            (index < device_count()).then(|| makedev(NVIDIA_MAJOR, index))
        }
    }
}

/// How many devices the simulated machine has (GPUVISOR_SIM_GPUS, all of them: device nodes
/// do not follow CUDA_VISIBLE_DEVICES).
fn device_count() -> u64 {
    let spec = std::env::var(crate::config::SIM_GPUS_ENV)
        .unwrap_or_else(|_| crate::config::DEFAULT_GPUS.to_string());
    crate::config::parse_devices(&spec).map_or(1, |devices| devices.len() as u64)
}

fn makedev(major: u64, minor: u64) -> u64 {
    ((major & 0xfff) << 8) | (minor & 0xff) | ((major & !0xfff) << 32) | ((minor & !0xff) << 12)
}

/// x86-64 `struct stat` (and `stat64`, the same there).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Stat {
    st_dev: u64,
    st_ino: u64,
    st_nlink: u64,
    st_mode: u32,
    st_uid: u32,
    st_gid: u32,
    pad: i32,
    st_rdev: u64,
    st_size: i64,
    st_blksize: i64,
    st_blocks: i64,
    times: [i64; 6],
    reserved: [i64; 3],
}

/// Fills `out` as a root-owned, world-read-writable character device.
unsafe fn fill(out: *mut Stat, device: u64) -> i32 {
    if out.is_null() {
        return -1;
    }
    let stat = Stat {
        st_dev: 5,
        st_ino: 0x6e76_0000 + (device & 0xffff),
        st_nlink: 1,
        st_mode: S_IFCHR | 0o666,
        st_uid: 0,
        st_gid: 0,
        pad: 0,
        st_rdev: device,
        st_size: 0,
        st_blksize: 4096,
        st_blocks: 0,
        times: [0; 6],
        reserved: [0; 3],
    };
    // SAFETY: the caller passes a struct stat to fill.
    unsafe { out.write(stat) };
    0
}

/// The node a path argument names, if simulated (only absolute paths: relative ones resolve
/// against a directory, which is never /dev here in practice).
unsafe fn node_of(path: *const c_char) -> Option<u64> {
    if path.is_null() {
        return None;
    }
    // SAFETY: the C library's contract: a NUL-terminated path.
    simulated_node(unsafe { CStr::from_ptr(path) }.to_bytes())
}

/// The next definition of `name` (the C library's), looked up once.
macro_rules! next {
    ($cache:ident, $name:expr, $ty:ty) => {{
        static $cache: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
        let mut found = $cache.load(Ordering::Relaxed);
        if found.is_null() {
            // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
            found = unsafe { dlsym(RTLD_NEXT, concat!($name, "\0").as_ptr().cast()) };
            $cache.store(found, Ordering::Relaxed);
        }
        // SAFETY: the C library's function of that name has this type.
        (!found.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, $ty>(found) })
    }};
}

const ENOSYS: i32 = 38;

type StatFn = unsafe extern "C" fn(*const c_char, *mut Stat) -> i32;
type StatAtFn = unsafe extern "C" fn(i32, *const c_char, *mut Stat, i32) -> i32;
type VersionedStatFn = unsafe extern "C" fn(i32, *const c_char, *mut Stat) -> i32;
type VersionedStatAtFn = unsafe extern "C" fn(i32, i32, *const c_char, *mut Stat, i32) -> i32;
type AccessFn = unsafe extern "C" fn(*const c_char, i32) -> i32;
type AccessAtFn = unsafe extern "C" fn(i32, *const c_char, i32, i32) -> i32;

/// Sets errno to ENOSYS when no next definition exists (never on a real C library).
fn missing() -> i32 {
    extern "C" {
        fn __errno_location() -> *mut i32;
    }
    // SAFETY: glibc's thread-local errno.
    unsafe { *__errno_location() = ENOSYS };
    -1
}

macro_rules! stat_like {
    ($($name:ident, $cache:ident;)*) => {$(
        #[doc = concat!(stringify!($name), ": simulated device nodes exist; the rest passes through.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, out: *mut Stat) -> i32 {
            if let Some(device) = node_of(path) {
                return fill(out, device);
            }
            match next!($cache, stringify!($name), StatFn) {
                Some(real) => real(path, out),
                None => missing(),
            }
        }
    )*};
}

stat_like! {
    stat, NEXT_STAT;
    stat64, NEXT_STAT64;
    lstat, NEXT_LSTAT;
    lstat64, NEXT_LSTAT64;
}

macro_rules! stat_at_like {
    ($($name:ident, $cache:ident;)*) => {$(
        #[doc = concat!(stringify!($name), ": simulated device nodes exist; the rest passes through.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(dir: i32, path: *const c_char, out: *mut Stat, flags: i32) -> i32 {
            if let Some(device) = node_of(path) {
                return fill(out, device);
            }
            match next!($cache, stringify!($name), StatAtFn) {
                Some(real) => real(dir, path, out, flags),
                None => missing(),
            }
        }
    )*};
}

stat_at_like! {
    fstatat, NEXT_FSTATAT;
    fstatat64, NEXT_FSTATAT64;
}

macro_rules! versioned_stat_like {
    ($($name:ident, $cache:ident;)*) => {$(
        #[doc = concat!(stringify!($name), " (glibc before 2.33): simulated device nodes exist.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(version: i32, path: *const c_char, out: *mut Stat) -> i32 {
            if let Some(device) = node_of(path) {
                return fill(out, device);
            }
            match next!($cache, stringify!($name), VersionedStatFn) {
                Some(real) => real(version, path, out),
                None => missing(),
            }
        }
    )*};
}

versioned_stat_like! {
    __xstat, NEXT_XSTAT;
    __xstat64, NEXT_XSTAT64;
    __lxstat, NEXT_LXSTAT;
    __lxstat64, NEXT_LXSTAT64;
}

/// __fxstatat64 (glibc before 2.33).
#[no_mangle]
pub unsafe extern "C" fn __fxstatat64(
    version: i32,
    dir: i32,
    path: *const c_char,
    out: *mut Stat,
    flags: i32,
) -> i32 {
    if let Some(device) = node_of(path) {
        return fill(out, device);
    }
    match next!(NEXT_FXSTATAT64, "__fxstatat64", VersionedStatAtFn) {
        Some(real) => real(version, dir, path, out, flags),
        None => missing(),
    }
}

/// access: simulated device nodes exist and are readable and writable.
#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: i32) -> i32 {
    if node_of(path).is_some() {
        return 0;
    }
    match next!(NEXT_ACCESS, "access", AccessFn) {
        Some(real) => real(path, mode),
        None => missing(),
    }
}

/// faccessat: as access.
#[no_mangle]
pub unsafe extern "C" fn faccessat(dir: i32, path: *const c_char, mode: i32, flags: i32) -> i32 {
    if node_of(path).is_some() {
        return 0;
    }
    match next!(NEXT_FACCESSAT, "faccessat", AccessAtFn) {
        Some(real) => real(dir, path, mode, flags),
        None => missing(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_nvidia_nodes_are_simulated() {
        assert_eq!(simulated_node(b"/dev/nvidiactl"), Some(makedev(195, 255)));
        assert_eq!(simulated_node(b"/dev/nvidia0"), Some(makedev(195, 0)));
        assert!(simulated_node(b"/dev/nvidia-uvm").is_some());
        assert_eq!(simulated_node(b"/dev/null"), None);
        assert_eq!(simulated_node(b"/dev/nvidiax"), None);
        assert_eq!(
            simulated_node(b"/dev/nvidia99"),
            None,
            "beyond the device count"
        );
    }

    #[test]
    fn other_paths_pass_through() {
        let mut out = std::mem::MaybeUninit::<Stat>::zeroed();
        assert_eq!(unsafe { stat(c"/".as_ptr(), out.as_mut_ptr()) }, 0);
        assert_eq!(
            unsafe { out.assume_init() }.st_mode & 0o170000,
            0o040000,
            "a directory"
        );
        assert_eq!(
            unsafe { stat(c"/dev/nvidiactl".as_ptr(), out.as_mut_ptr()) },
            0
        );
        assert_eq!(unsafe { out.assume_init() }.st_mode & 0o170000, S_IFCHR);
        assert_eq!(unsafe { access(c"/dev/nvidiactl".as_ptr(), 0) }, 0);
    }
}
