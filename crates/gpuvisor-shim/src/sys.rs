//! The few libc functions the shim calls, declared by hand: the shim depends on libc at most
//! (it is built with plain `rustc`, no crates).

use std::os::raw::{c_char, c_int, c_void};

/// `RTLD_NOW` from `<dlfcn.h>`.
pub const RTLD_NOW: c_int = 0x2;
/// `RTLD_GLOBAL` from `<dlfcn.h>`.
pub const RTLD_GLOBAL: c_int = 0x100;
/// `RTLD_NOLOAD` from `<dlfcn.h>`.
pub const RTLD_NOLOAD: c_int = 0x4;
/// `RTLD_NEXT` from `<dlfcn.h>` (glibc: -1).
pub const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
/// `PROT_READ | PROT_WRITE`.
pub const PROT_READ_WRITE: c_int = 0x3;
/// `MAP_PRIVATE`.
pub const MAP_PRIVATE: c_int = 0x02;
/// `MAP_FIXED`.
pub const MAP_FIXED: c_int = 0x10;
/// `MAP_ANONYMOUS`.
pub const MAP_ANONYMOUS: c_int = 0x20;
/// `MAP_NORESERVE`.
pub const MAP_NORESERVE: c_int = 0x4000;
/// `MADV_HUGEPAGE`: back with transparent huge pages where the system allows it.
pub const MADV_HUGEPAGE: c_int = 14;
/// `MAP_FAILED`.
pub const MAP_FAILED: *mut c_void = !0usize as *mut c_void;

extern "C" {
    /// dlopen(3).
    pub fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    /// dlvsym(3): a versioned lookup; how the shim finds libc's own `dlsym`.
    pub fn dlvsym(
        handle: *mut c_void,
        symbol: *const c_char,
        version: *const c_char,
    ) -> *mut c_void;
    /// getenv(3).
    pub fn getenv(name: *const c_char) -> *const c_char;
    /// setenv(3).
    pub fn setenv(name: *const c_char, value: *const c_char, overwrite: c_int) -> c_int;
    /// getpid(2).
    pub fn getpid() -> i32;
    /// pthread_atfork(3).
    pub fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> c_int;
    /// mmap(2).
    pub fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: i64,
    ) -> *mut c_void;
    /// madvise(2).
    pub fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
    /// write(2).
    pub fn write(fd: c_int, buf: *const c_void, count: usize) -> isize;
    /// readlink(2).
    pub fn readlink(path: *const c_char, buf: *mut c_char, size: usize) -> isize;
}

/// Writes one line to stderr with a single write(2) (no allocation, no locks), prefixed with
/// `gpuvisor-shim: `.
pub fn stderr_line(message: &str) {
    stderr_bytes(message.as_bytes())
}

/// [`stderr_line`] for bytes that need not be UTF-8 (a path).
pub fn stderr_bytes(message: &[u8]) {
    let mut buf = [0u8; 512];
    let prefix = b"gpuvisor-shim: ";
    let mut len = 0;
    for part in [prefix.as_slice(), message] {
        let n = part.len().min(buf.len() - 1 - len);
        buf[len..len + n].copy_from_slice(&part[..n]);
        len += n;
    }
    buf[len] = b'\n';
    // SAFETY: buf is valid for len + 1 bytes; a short or failed write to stderr is ignored.
    unsafe {
        write(2, buf.as_ptr() as *const c_void, len + 1);
    }
}

/// Reads an environment variable as bytes (None if unset). Not allocation-free: call only on
/// slow paths (initialisation).
pub fn env_bytes(name: &std::ffi::CStr) -> Option<Vec<u8>> {
    // SAFETY: name is NUL-terminated; getenv returns NULL or a NUL-terminated string that we
    // copy at once.
    unsafe {
        let value = getenv(name.as_ptr());
        if value.is_null() {
            None
        } else {
            Some(std::ffi::CStr::from_ptr(value).to_bytes().to_vec())
        }
    }
}
