//! What a library asked of the simulator that it does not serve, so drift in a new framework
//! wheel shows up as a readable list rather than an obscure failure.
//!
//! Every name of cuda.h is exported (XLA looks some up by name, and a missing ELF symbol would
//! fail the load); the ones not implemented are stubs generated into `generated.rs` by
//! `scripts/gen-sim-names.py`, answering CUDA_ERROR_NOT_SUPPORTED. With
//! `GPUVISOR_SIM_LOG_UNSERVED=FILE`, each distinct unserved request is appended to FILE once
//! per process, one line each: `entry NAME` (a stub was called), `procaddress NAME VERSION`
//! (cuGetProcAddress found no entry point), `table UUID` (cuGetExportTable, unknown id).
//!
//! Lock-free and allocation-light: this runs inside other people's programs, possibly right
//! after a fork. Lines are written with one `write` on an O_APPEND descriptor, so processes
//! appending to one file do not interleave.

use std::ffi::c_char;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::driver::code;

/// The environment variable naming the file to append to.
pub const LOG_ENV: &str = "GPUVISOR_SIM_LOG_UNSERVED";

extern "C" {
    fn open(path: *const c_char, flags: i32, mode: u32) -> i32;
    fn write(fd: i32, buffer: *const u8, count: usize) -> isize;
    fn close(fd: i32) -> i32;
}
const O_WRONLY: i32 = 0o1;
const O_CREAT: i32 = 0o100;
const O_APPEND: i32 = 0o2000;
const O_CLOEXEC: i32 = 0o2000000;

/// Hashes of what was already written by this process (open addressing, 0 = empty). A full
/// set just writes duplicates, which the readers deduplicate.
static SEEN: [AtomicU64; 1024] = [const { AtomicU64::new(0) }; 1024];
/// The pid SEEN belongs to: a forked child starts its own list.
static SEEN_PID: AtomicU64 = AtomicU64::new(0);

fn first_time(line: &[u8]) -> bool {
    let pid = u64::from(crate::process::pid());
    if SEEN_PID.swap(pid, Ordering::AcqRel) != pid {
        for slot in &SEEN {
            slot.store(0, Ordering::Relaxed);
        }
    }
    // FNV-1a, never 0.
    let hash = line.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    }) | 1;
    let mut index = hash as usize % SEEN.len();
    for _ in 0..SEEN.len() {
        match SEEN[index].compare_exchange(0, hash, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(existing) if existing == hash => return false,
            Err(_) => index = (index + 1) % SEEN.len(),
        }
    }
    true
}

/// Appends `line` (without its newline) to the log file, once per process.
fn record(line: &[u8]) {
    let Some(path) = std::env::var_os(LOG_ENV) else {
        return;
    };
    if !first_time(line) {
        return;
    }
    let mut path_bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).to_vec();
    path_bytes.push(0);
    let mut text = line.to_vec();
    text.push(b'\n');
    // SAFETY: a NUL-terminated path; the descriptor is ours and closed here.
    unsafe {
        let fd = open(
            path_bytes.as_ptr().cast(),
            O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
            0o600,
        );
        if fd >= 0 {
            write(fd, text.as_ptr(), text.len());
            close(fd);
        }
    }
}

/// A stub entry point was called.
pub fn entry(name: &str) -> i32 {
    record(format!("entry {name}").as_bytes());
    code::NOT_SUPPORTED
}

/// cuGetProcAddress found nothing for `name` at `version`.
pub fn procaddress(name: &str, version: i32) {
    record(format!("procaddress {name} {version}").as_bytes());
}

/// cuGetExportTable was asked for an unknown table.
pub fn table(id: &[u8; 16]) {
    let hex: String = id.iter().map(|byte| format!("{byte:02x}")).collect();
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    );
    record(format!("table {uuid}").as_bytes());
}

/// Exported stubs for the names of cuda.h the simulator does not implement. They take no
/// arguments: the C calling convention lets a callee ignore what it was passed.
macro_rules! unserved_stubs {
    ($($name:ident,)*) => {$(
        #[doc = concat!(stringify!($name), ": not simulated (CUDA_ERROR_NOT_SUPPORTED).")]
        #[no_mangle]
        pub extern "C" fn $name() -> i32 {
            crate::unserved::entry(stringify!($name))
        }
    )*};
}

/// The per-thread-stream forms (`_ptsz`, `_ptds`) of implemented entry points: the simulator
/// has one stream semantics, so each jumps to the plain form with its arguments untouched.
macro_rules! stream_forms {
    ($($name:ident => $target:path,)*) => {$(
        #[doc = concat!(stringify!($name), ": the same as ", stringify!($target), ".")]
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            std::arch::naked_asm!("jmp {target}", target = sym $target)
        }
    )*};
}

pub(crate) use {stream_forms, unserved_stubs};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_line_is_new_once() {
        assert!(first_time(b"entry cuTestOnce"));
        assert!(!first_time(b"entry cuTestOnce"));
        assert!(first_time(b"entry cuTestOther"));
    }
}
