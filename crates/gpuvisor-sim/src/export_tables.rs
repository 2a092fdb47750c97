//! `cuGetExportTable`: the private tables the CUDA runtime (`libcudart`, also linked into
//! cuBLAS, cuDNN and JAX's PJRT plugin) asks the driver for before it serves any call.
//!
//! Without them every runtime call fails with `cudaErrorNotSupported`. Their layouts are not
//! public: the UUIDs, slots and the integrity check follow ZLUDA's reverse engineering (crate
//! `dark_api` of github.com/vosen/ZLUDA) and what cudart 12.9 / 13.2, cuBLAS 12.9 / 13.4 and
//! CuPy were seen calling (docs/simulator.md). Each table is a static at a stable address:
//! the integrity check hashes those addresses, so they must not move.

use crate::driver::code;
use crate::md2;
use crate::{api_device, objects, put, unserved};
use std::ffi::c_void;

/// A table of `N` pointer-sized slots.
#[repr(C)]
pub struct Table<const N: usize>([*const (); N]);

// SAFETY: the tables are immutable statics holding function addresses and sizes.
unsafe impl<const N: usize> Sync for Table<N> {}

/// Slot 0 of most tables: the table's size in bytes.
const fn size_slot(slots: usize) -> *const () {
    std::ptr::without_provenance(slots * 8)
}

const NULL: *const () = std::ptr::null();

/// CUDART_INTERFACE: module loading from registered fatbins and the primary context.
const CUDART_INTERFACE_ID: [u8; 16] = uuid(0x6bd5fb6c_5bf4_e74a_8987_d93912fd9df9);
/// TOOLS_RUNTIME_CALLBACK_HOOKS: buffers profiling tools would fill.
const CALLBACK_HOOKS_ID: [u8; 16] = uuid(0xa094798c_2e74_2e74_93f2_0800200c0a66);
/// TOOLS_TLS: the current context, as cuBLAS looks it up before each GEMM heuristic.
const TOOLS_TLS_ID: [u8; 16] = uuid(0x42d85a81_23f6_cb47_8298_f6e78a3aecdc);
/// A table ZLUDA does not know: cuBLAS 12.9 / 13.4 ask it for a per-context key.
const CONTEXT_KEY_ID: [u8; 16] = uuid(0x21318c60_9714_3248_8ca6_41ff7324c8f2);
/// CONTEXT_LOCAL_STORAGE: values the runtime keeps per context (no size slot).
const CONTEXT_STORAGE_ID: [u8; 16] = uuid(0xc693336e_1121_df11_a8c3_68f355d89593);
/// CONTEXT_CHECKS.
const CONTEXT_CHECKS_ID: [u8; 16] = uuid(0x263e8860_7cd2_6143_92f6_bbd5006dfa7e);
/// INTEGRITY_CHECK: the runtime's proof that it talks to NVIDIA's driver.
const INTEGRITY_CHECK_ID: [u8; 16] = uuid(0xd4082055_bde6_704b_8d34_ba123c66e1f2);

/// The 16 bytes of a UUID written as one hex number, in memory order.
const fn uuid(value: u128) -> [u8; 16] {
    value.to_be_bytes()
}

static CUDART_INTERFACE: Table<13> = Table([
    size_slot(13),
    load_registered_fatbin as *const (),
    primary_context as *const (),
    NULL,
    NULL,
    NULL,
    load_registered_fatbin_ex as *const (),
    ignore_usize as *const (),
    load_fatbin_header as *const (),
    NULL,
    NULL,
    NULL,
    load_compilers as *const (),
]);

static CALLBACK_HOOKS: Table<7> = Table([
    size_slot(7),
    NULL,
    callback_buffer_large as *const (),
    NULL,
    NULL,
    NULL,
    callback_buffer_small as *const (),
]);

static TOOLS_TLS: Table<4> = Table([size_slot(4), NULL, current_context as *const (), NULL]);

static CONTEXT_KEY: Table<8> = Table([
    size_slot(8),
    NULL,
    NULL,
    NULL,
    context_key as *const (),
    NULL,
    NULL,
    NULL,
]);

static CONTEXT_STORAGE: Table<4> = Table([
    storage_put as *const (),
    storage_delete as *const (),
    storage_get as *const (),
    NULL,
]);

static CONTEXT_CHECKS: Table<4> = Table([
    size_slot(4),
    NULL,
    context_check as *const (),
    zero_u32 as *const (),
]);

static INTEGRITY_CHECK: Table<3> = Table([size_slot(3), integrity_check as *const (), NULL]);

/// The table for `id`, if the simulator serves it.
fn table(id: &[u8; 16]) -> Option<*const c_void> {
    let address: *const c_void = match *id {
        CUDART_INTERFACE_ID => std::ptr::from_ref(&CUDART_INTERFACE).cast(),
        CALLBACK_HOOKS_ID => std::ptr::from_ref(&CALLBACK_HOOKS).cast(),
        TOOLS_TLS_ID => std::ptr::from_ref(&TOOLS_TLS).cast(),
        CONTEXT_KEY_ID => std::ptr::from_ref(&CONTEXT_KEY).cast(),
        CONTEXT_STORAGE_ID => std::ptr::from_ref(&CONTEXT_STORAGE).cast(),
        CONTEXT_CHECKS_ID => std::ptr::from_ref(&CONTEXT_CHECKS).cast(),
        INTEGRITY_CHECK_ID => std::ptr::from_ref(&INTEGRITY_CHECK).cast(),
        _ => return None,
    };
    Some(address)
}

/// cuGetExportTable: a served table, or CUDA_ERROR_INVALID_VALUE (the real driver's answer
/// for an id it does not know), recorded for GPUVISOR_SIM_LOG_UNSERVED.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(out: *mut *const c_void, id: *const [u8; 16]) -> i32 {
    if out.is_null() || id.is_null() {
        return code::INVALID_VALUE;
    }
    // SAFETY: the caller passes a CUuuid (16 bytes).
    let id = unsafe { *id };
    match table(&id) {
        Some(address) => {
            put(out, address);
            code::SUCCESS
        }
        None => {
            unserved::table(&id);
            code::INVALID_VALUE
        }
    }
}

// ---- CUDART_INTERFACE ----

unsafe extern "C" fn load_registered_fatbin(
    module: *mut u64,
    _fatbin_wrapper: *const c_void,
) -> i32 {
    objects::new_module_into(module)
}

unsafe extern "C" fn load_registered_fatbin_ex(
    module: *mut u64,
    _fatbin_wrapper: *const c_void,
    _extra: *mut c_void,
    _more: *mut c_void,
    _flags: u32,
) -> i32 {
    objects::new_module_into(module)
}

unsafe extern "C" fn load_fatbin_header(
    _fatbin_header: *const c_void,
    module: *mut u64,
    _extra: *mut c_void,
    _more: *mut c_void,
    _flags: u32,
) -> i32 {
    objects::new_module_into(module)
}

unsafe extern "C" fn primary_context(context: *mut *mut c_void, device: i32) -> i32 {
    api_device::cuDevicePrimaryCtxRetain(context, device)
}

extern "C" fn ignore_usize(_value: usize) -> i32 {
    code::SUCCESS
}

extern "C" fn load_compilers() -> i32 {
    code::SUCCESS
}

// ---- TOOLS_RUNTIME_CALLBACK_HOOKS ----

/// Zeroed buffers the runtime may write into (no tool reads them).
struct HookBuffer<const N: usize>(std::cell::UnsafeCell<[u32; N]>);

// SAFETY: the runtime writes these buffers; nothing in the simulator reads them.
unsafe impl<const N: usize> Sync for HookBuffer<N> {}

static LARGE_HOOKS: HookBuffer<1024> = HookBuffer(std::cell::UnsafeCell::new([0; 1024]));
static SMALL_HOOKS: HookBuffer<14> = HookBuffer(std::cell::UnsafeCell::new([0; 14]));

unsafe extern "C" fn callback_buffer_large(buffer: *mut *mut c_void, count: *mut usize) -> i32 {
    put(buffer, LARGE_HOOKS.0.get().cast());
    put(count, 1024);
    code::SUCCESS
}

unsafe extern "C" fn callback_buffer_small(buffer: *mut *mut c_void, count: *mut usize) -> i32 {
    put(buffer, SMALL_HOOKS.0.get().cast());
    put(count, 14);
    code::SUCCESS
}

// ---- TOOLS_TLS and the per-context key ----

/// The current context; 0 (success) even when there is none, or cuBLAS gives up.
unsafe extern "C" fn current_context(context: *mut *mut c_void) -> i32 {
    let mut current = std::ptr::null_mut();
    if api_device::cuCtxGetCurrent(&mut current) != code::SUCCESS {
        current = std::ptr::null_mut();
    }
    put(context, current);
    0
}

/// A key unique per context: its handle.
unsafe extern "C" fn context_key(context: *mut c_void, key: *mut u64) -> i32 {
    put(key, context as u64);
    0
}

// ---- CONTEXT_LOCAL_STORAGE ----

unsafe extern "C" fn storage_put(
    context: *mut c_void,
    key: *mut c_void,
    value: *mut c_void,
    destructor: Option<objects::StorageDestructor>,
) -> i32 {
    objects::storage_put(context_or_current(context), key as u64, value, destructor)
}

unsafe extern "C" fn storage_delete(context: *mut c_void, key: *mut c_void) -> i32 {
    objects::storage_delete(context_or_current(context), key as u64)
}

unsafe extern "C" fn storage_get(
    value: *mut *mut c_void,
    context: *mut c_void,
    key: *mut c_void,
) -> i32 {
    match objects::storage_get(context_or_current(context), key as u64) {
        Some(stored) => {
            put(value, stored);
            code::SUCCESS
        }
        None => code::INVALID_HANDLE,
    }
}

/// `context`, or the current one when NULL (0 when there is none).
fn context_or_current(context: *mut c_void) -> u64 {
    if !context.is_null() {
        return context as u64;
    }
    let mut current = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    if unsafe { api_device::cuCtxGetCurrent(&mut current) } != code::SUCCESS {
        return 0;
    }
    current as u64
}

// ---- CONTEXT_CHECKS ----

unsafe extern "C" fn context_check(
    _context: *mut c_void,
    result: *mut u32,
    _detail: *mut *mut c_void,
) -> i32 {
    put(result, 0);
    code::SUCCESS
}

extern "C" fn zero_u32() -> u32 {
    0
}

// ---- INTEGRITY_CHECK ----

/// The key of the runtime's HMAC-MD2 (ZLUDA's `dark_api`).
const INTEGRITY_KEY: [u8; 16] = [
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
];

extern "C" {
    fn pthread_self() -> usize;
}

/// The runtime calls this with its version, then +1 and +2; the last digit picks the answer.
unsafe extern "C" fn integrity_check(version: u32, unix_seconds: u64, out: *mut [u64; 2]) -> i32 {
    if out.is_null() {
        return code::INVALID_VALUE;
    }
    api_device::note_caller_version(version as i32);
    let driver_version = api_device::driver_version() as u32;
    let answer = match version % 10 {
        0 => [0x3341_181c_03cb_675c, 0x8ed3_83aa_1f4c_d1e8],
        1 => [0x1841_181c_03cb_675c, 0x8ed3_83aa_1f4c_d1e8],
        _ => {
            let digest = integrity_digest(driver_version, version, unix_seconds);
            let (low, high) = digest.split_at(8);
            [
                u64::from_le_bytes(low.try_into().unwrap_or_default()),
                u64::from_le_bytes(high.try_into().unwrap_or_default()),
            ]
        }
    };
    put(out, answer);
    code::SUCCESS
}

/// HMAC-MD2 over this process, the two tables, and every visible device.
fn integrity_digest(driver_version: u32, version: u32, unix_seconds: u64) -> [u8; 16] {
    let mut record = [0u8; 48];
    // SAFETY: pthread_self has no preconditions.
    let thread = unsafe { pthread_self() } as u32;
    let fields: [&[u8]; 8] = [
        &driver_version.to_le_bytes(),
        &version.to_le_bytes(),
        &crate::process::pid().to_le_bytes(),
        &thread.to_le_bytes(),
        &(std::ptr::from_ref(&CUDART_INTERFACE) as u64).to_le_bytes(),
        &(std::ptr::from_ref(&INTEGRITY_CHECK) as u64).to_le_bytes(),
        &(integrity_check as *const () as u64).to_le_bytes(),
        &unix_seconds.to_le_bytes(),
    ];
    let mut at = 0;
    for field in fields {
        record[at..at + field.len()].copy_from_slice(field);
        at += field.len();
    }
    let devices = api_device::device_identities();
    let mut parts: Vec<&[u8]> = vec![&record];
    parts.extend(devices.iter().map(|device| &device[..]));
    md2::hmac(&INTEGRITY_KEY, &parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_served_by_id_and_unknown_ids_refused() {
        let mut out = std::ptr::null();
        for id in [
            CUDART_INTERFACE_ID,
            CALLBACK_HOOKS_ID,
            TOOLS_TLS_ID,
            CONTEXT_KEY_ID,
            CONTEXT_STORAGE_ID,
            CONTEXT_CHECKS_ID,
            INTEGRITY_CHECK_ID,
        ] {
            assert_eq!(unsafe { cuGetExportTable(&mut out, &id) }, code::SUCCESS);
            assert!(!out.is_null());
        }
        let unknown = uuid(0xf8cff951_2146_8b4e_b9e2_fb469e7c0dd9);
        assert_eq!(
            unsafe { cuGetExportTable(&mut out, &unknown) },
            code::INVALID_VALUE
        );
    }

    #[test]
    fn uuids_are_in_memory_order() {
        assert_eq!(
            CONTEXT_KEY_ID,
            [
                0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24,
                0xc8, 0xf2
            ]
        );
    }

    #[test]
    fn sizes_sit_in_slot_zero() {
        assert_eq!(CUDART_INTERFACE.0[0] as usize, 13 * 8);
        assert_eq!(INTEGRITY_CHECK.0[0] as usize, 3 * 8);
    }

    #[test]
    fn integrity_answers_follow_the_last_digit() {
        let mut out = [0u64; 2];
        unsafe { integrity_check(12090, 1_700_000_000, &mut out) };
        assert_eq!(out, [0x3341_181c_03cb_675c, 0x8ed3_83aa_1f4c_d1e8]);
        unsafe { integrity_check(12091, 1_700_000_000, &mut out) };
        assert_eq!(out[0], 0x1841_181c_03cb_675c);
        let mut first = [0u64; 2];
        unsafe { integrity_check(12092, 1_700_000_000, &mut first) };
        unsafe { integrity_check(12092, 1_700_000_001, &mut out) };
        assert_ne!(first, out, "the time is part of the message");
    }
}
