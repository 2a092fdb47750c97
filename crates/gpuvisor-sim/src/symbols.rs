//! cuGetProcAddress and the error-name functions.
//!
//! cuGetProcAddress takes a base name ("cuMemAlloc") and the CUDA version the caller was built
//! for, and returns the newest variant that version knows ("cuMemAlloc_v2"). Stream-ordering
//! flags (per-thread default stream) are accepted and ignored: the simulator has one stream
//! semantics for all.

use std::ffi::{c_char, c_void, CStr};

use crate::api_device::*;
use crate::api_memory::*;
use crate::driver::code;
use crate::put;

/// Base names whose entry point changed with a CUDA version: (base, since version, symbol).
/// The highest `since` not above the caller's version wins.
const VERSIONED: &[(&str, i32, &str)] = &[
    ("cuMemAlloc", 3020, "cuMemAlloc_v2"),
    ("cuMemAllocPitch", 3020, "cuMemAllocPitch_v2"),
    ("cuMemFree", 3020, "cuMemFree_v2"),
    ("cuMemGetInfo", 3020, "cuMemGetInfo_v2"),
    ("cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2"),
    ("cuCtxCreate", 3020, "cuCtxCreate_v2"),
    ("cuCtxCreate", 11040, "cuCtxCreate_v3"),
    ("cuCtxCreate", 12050, "cuCtxCreate_v4"),
    ("cuCtxDestroy", 4000, "cuCtxDestroy_v2"),
    ("cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2"),
    ("cuCtxPopCurrent", 4000, "cuCtxPopCurrent_v2"),
    ("cuStreamDestroy", 4000, "cuStreamDestroy_v2"),
    (
        "cuDevicePrimaryCtxRelease",
        11000,
        "cuDevicePrimaryCtxRelease_v2",
    ),
    (
        "cuDevicePrimaryCtxSetFlags",
        11000,
        "cuDevicePrimaryCtxSetFlags_v2",
    ),
    ("cuDeviceGetUuid", 9020, "cuDeviceGetUuid"),
    ("cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2"),
    ("cuGetProcAddress", 11030, "cuGetProcAddress"),
    ("cuGetProcAddress", 12000, "cuGetProcAddress_v2"),
];

/// The exported function named exactly `name`.
pub fn exported(name: &str) -> Option<*mut c_void> {
    let address = match name {
        "cuInit" => cuInit as *const (),
        "cuDriverGetVersion" => cuDriverGetVersion as *const (),
        "cuDeviceGetCount" => cuDeviceGetCount as *const (),
        "cuDeviceGet" => cuDeviceGet as *const (),
        "cuDeviceGetName" => cuDeviceGetName as *const (),
        "cuDeviceGetUuid" => cuDeviceGetUuid as *const (),
        "cuDeviceGetUuid_v2" => cuDeviceGetUuid_v2 as *const (),
        "cuDeviceTotalMem_v2" => cuDeviceTotalMem_v2 as *const (),
        "cuDeviceGetAttribute" => cuDeviceGetAttribute as *const (),
        "cuDeviceComputeCapability" => cuDeviceComputeCapability as *const (),
        "cuDevicePrimaryCtxRetain" => cuDevicePrimaryCtxRetain as *const (),
        "cuDevicePrimaryCtxRelease" => cuDevicePrimaryCtxRelease as *const (),
        "cuDevicePrimaryCtxRelease_v2" => cuDevicePrimaryCtxRelease_v2 as *const (),
        "cuDevicePrimaryCtxGetState" => cuDevicePrimaryCtxGetState as *const (),
        "cuDevicePrimaryCtxSetFlags_v2" => cuDevicePrimaryCtxSetFlags_v2 as *const (),
        "cuCtxCreate_v2" => cuCtxCreate_v2 as *const (),
        "cuCtxCreate_v3" => cuCtxCreate_v3 as *const (),
        "cuCtxCreate_v4" => cuCtxCreate_v4 as *const (),
        "cuCtxDestroy_v2" => cuCtxDestroy_v2 as *const (),
        "cuCtxSetCurrent" => cuCtxSetCurrent as *const (),
        "cuCtxGetCurrent" => cuCtxGetCurrent as *const (),
        "cuCtxGetDevice" => cuCtxGetDevice as *const (),
        "cuCtxPushCurrent_v2" => cuCtxPushCurrent_v2 as *const (),
        "cuCtxPopCurrent_v2" => cuCtxPopCurrent_v2 as *const (),
        "cuCtxSynchronize" => cuCtxSynchronize as *const (),
        "cuStreamCreate" => cuStreamCreate as *const (),
        "cuStreamDestroy_v2" => cuStreamDestroy_v2 as *const (),
        "cuStreamSynchronize" => cuStreamSynchronize as *const (),
        "cuMemAlloc_v2" => cuMemAlloc_v2 as *const (),
        "cuMemAllocPitch_v2" => cuMemAllocPitch_v2 as *const (),
        "cuMemAllocManaged" => cuMemAllocManaged as *const (),
        "cuMemAllocAsync" => cuMemAllocAsync as *const (),
        "cuMemAllocFromPoolAsync" => cuMemAllocFromPoolAsync as *const (),
        "cuMemFree_v2" => cuMemFree_v2 as *const (),
        "cuMemFreeAsync" => cuMemFreeAsync as *const (),
        "cuMemCreate" => cuMemCreate as *const (),
        "cuMemRelease" => cuMemRelease as *const (),
        "cuMemGetAllocationGranularity" => cuMemGetAllocationGranularity as *const (),
        "cuMemAddressReserve" => cuMemAddressReserve as *const (),
        "cuMemAddressFree" => cuMemAddressFree as *const (),
        "cuMemMap" => cuMemMap as *const (),
        "cuMemUnmap" => cuMemUnmap as *const (),
        "cuMemSetAccess" => cuMemSetAccess as *const (),
        "cuDeviceGetDefaultMemPool" => cuDeviceGetDefaultMemPool as *const (),
        "cuMemPoolCreate" => cuMemPoolCreate as *const (),
        "cuMemPoolDestroy" => cuMemPoolDestroy as *const (),
        "cuMemGetInfo_v2" => cuMemGetInfo_v2 as *const (),
        "cuGetProcAddress" => cuGetProcAddress as *const (),
        "cuGetProcAddress_v2" => cuGetProcAddress_v2 as *const (),
        "cuGetErrorName" => cuGetErrorName as *const (),
        "cuGetErrorString" => cuGetErrorString as *const (),
        "cuGetExportTable" => cuGetExportTable as *const (),
        _ => return None,
    };
    Some(address as *mut c_void)
}

/// What cuGetProcAddress returns for base name `name` at CUDA `version`.
pub fn resolve(name: &str, version: i32) -> Option<*mut c_void> {
    let versioned = VERSIONED
        .iter()
        .filter(|(base, since, _)| *base == name && *since <= version)
        .max_by_key(|(_, since, _)| *since);
    match versioned {
        Some((_, _, symbol)) => exported(symbol),
        None if VERSIONED.iter().any(|(base, ..)| *base == name) => None,
        None => exported(name),
    }
}

/// cuGetProcAddress (CUDA 11.3 form).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    function: *mut *mut c_void,
    version: i32,
    _flags: u64,
) -> i32 {
    cuGetProcAddress_v2(symbol, function, version, _flags, std::ptr::null_mut())
}

/// cuGetProcAddress_v2 (CUDA 12 form, with a status: 0 found, 1 no such symbol, 2 version too
/// old).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    function: *mut *mut c_void,
    version: i32,
    _flags: u64,
    status: *mut i32,
) -> i32 {
    if symbol.is_null() || function.is_null() {
        return code::INVALID_VALUE;
    }
    // SAFETY: the caller passes a NUL-terminated symbol name.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    match resolve(name, version) {
        Some(address) => {
            put(function, address);
            put(status, 0);
            code::SUCCESS
        }
        None => {
            put(function, std::ptr::null_mut());
            let known = VERSIONED.iter().any(|(base, ..)| *base == name);
            put(status, if known { 2 } else { 1 });
            code::NOT_FOUND
        }
    }
}

/// cuGetExportTable: private runtime tables are not simulated.
#[no_mangle]
pub extern "C" fn cuGetExportTable(_table: *mut *const c_void, _id: *const c_void) -> i32 {
    code::NOT_SUPPORTED
}

/// (name, description) of the codes the simulator knows.
fn error_text(result: i32) -> Option<(&'static CStr, &'static CStr)> {
    Some(match result {
        0 => (c"CUDA_SUCCESS", c"no error"),
        1 => (c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
        2 => (c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
        3 => (c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
        4 => (c"CUDA_ERROR_DEINITIALIZED", c"driver shutting down"),
        100 => (
            c"CUDA_ERROR_NO_DEVICE",
            c"no CUDA-capable device is detected",
        ),
        101 => (c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
        201 => (c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
        304 => (
            c"CUDA_ERROR_OPERATING_SYSTEM",
            c"OS call failed or operation not supported on this OS",
        ),
        400 => (c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
        500 => (c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
        801 => (c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
        999 => (c"CUDA_ERROR_UNKNOWN", c"unknown error"),
        _ => return None,
    })
}

/// cuGetErrorName.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(result: i32, name: *mut *const c_char) -> i32 {
    match error_text(result) {
        Some((text, _)) if put(name, text.as_ptr()) => code::SUCCESS,
        _ => {
            put(name, std::ptr::null());
            code::INVALID_VALUE
        }
    }
}

/// cuGetErrorString.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(result: i32, description: *mut *const c_char) -> i32 {
    match error_text(result) {
        Some((_, text)) if put(description, text.as_ptr()) => code::SUCCESS,
        _ => {
            put(description, std::ptr::null());
            code::INVALID_VALUE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_the_newest_variant_the_version_knows() {
        assert_eq!(resolve("cuMemAlloc", 12000), exported("cuMemAlloc_v2"));
        assert_eq!(resolve("cuCtxCreate", 11040), exported("cuCtxCreate_v3"));
        assert_eq!(resolve("cuCtxCreate", 12080), exported("cuCtxCreate_v4"));
        assert_eq!(
            resolve("cuGetProcAddress", 11080),
            exported("cuGetProcAddress")
        );
        assert_eq!(
            resolve("cuGetProcAddress", 12000),
            exported("cuGetProcAddress_v2")
        );
        assert_eq!(resolve("cuMemCreate", 12000), exported("cuMemCreate"));
        assert!(resolve("cuMemAlloc", 2000).is_none());
        assert!(resolve("cuLaunchKernel", 12000).is_none());
    }
}
