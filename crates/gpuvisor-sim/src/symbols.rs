//! cuGetProcAddress and the error-name functions.
//!
//! cuGetProcAddress takes a base name ("cuMemAlloc") and the CUDA version the caller was built
//! for, and returns the newest revision that version knows ("cuMemAlloc_v2"), from the
//! revision table of cudaTypedefs.h (`generated::VERSIONS`). A revision the simulator does not
//! implement is "not found" (status 1), never an older revision with another signature: the
//! runtime then falls back or goes without. Stream-ordering flags (per-thread default stream)
//! are accepted and ignored: the simulator has one stream semantics for all.

use std::ffi::{c_char, c_void, CStr};

use crate::driver::code;
use crate::{generated, put, unserved};

/// The symbol implementing `base` in its variant number `variant` (0 = the plain name):
/// cuda.h names the n-th revision of an entry point `base_v{n+1}`.
fn variant_symbol(base: &str, variant: usize) -> String {
    if variant == 0 {
        base.to_string()
    } else {
        format!("{base}_v{}", variant + 1)
    }
}

/// The exported function named exactly `name`, if implemented.
pub fn exported(name: &str) -> Option<*mut c_void> {
    generated::implemented(name).map(|address| address.cast_mut().cast())
}

/// What cuGetProcAddress answers for base name `name` at CUDA `version`: the entry point of
/// the newest revision that version knows, else why not (status 1: no such symbol, 2: the
/// version is too old for it).
pub fn resolve(name: &str, version: i32) -> Result<*mut c_void, i32> {
    match generated::VERSIONS.iter().find(|(base, _)| *base == name) {
        Some((_, revisions)) => {
            let Some(variant) = revisions.iter().rposition(|&since| since <= version) else {
                return Err(2);
            };
            exported(&variant_symbol(name, variant)).ok_or(1)
        }
        None => exported(name).ok_or(1),
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
        Ok(address) => {
            put(function, address);
            put(status, 0);
            code::SUCCESS
        }
        Err(why) => {
            if !name.is_empty() {
                unserved::procaddress(name, version);
            }
            put(function, std::ptr::null_mut());
            put(status, why);
            code::NOT_FOUND
        }
    }
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
    fn resolves_the_newest_revision_the_version_knows() {
        assert_eq!(
            resolve("cuMemAlloc", 12000),
            Ok(exported("cuMemAlloc_v2").unwrap())
        );
        assert_eq!(
            resolve("cuCtxCreate", 11040),
            Ok(exported("cuCtxCreate_v3").unwrap())
        );
        assert_eq!(
            resolve("cuCtxCreate", 12080),
            Ok(exported("cuCtxCreate_v4").unwrap())
        );
        assert_eq!(
            resolve("cuGetProcAddress", 11080),
            Ok(exported("cuGetProcAddress").unwrap())
        );
        assert_eq!(
            resolve("cuGetProcAddress", 12000),
            Ok(exported("cuGetProcAddress_v2").unwrap())
        );
        assert_eq!(
            resolve("cuMemCreate", 12000),
            Ok(exported("cuMemCreate").unwrap())
        );
        assert_eq!(
            resolve("cuMemCreate", 9000),
            Err(2),
            "too old for the VMM API"
        );
        assert_eq!(resolve("cuNoSuchThing", 12000), Err(1));
        assert_eq!(
            resolve("cuLaunchKernel", 12000),
            Ok(exported("cuLaunchKernel").unwrap())
        );
    }

    /// cuda-names.txt, the sources and generated.rs agree: every name of cuda.h is exported
    /// exactly once (implemented, or a stub or jump), and every entry point in the sources is
    /// in the lookup. Fails after adding an entry point without `scripts/gen-sim-names.py`.
    #[test]
    fn every_cuda_name_is_exported_once_and_the_lookup_is_current() {
        let names = include_str!("../cuda-names.txt");
        for name in names
            .lines()
            .filter_map(|line| line.strip_prefix("export "))
        {
            let implemented = exported(name).is_some();
            let stubbed = generated::STUBBED.contains(&name);
            assert!(
                implemented != stubbed,
                "{name}: implemented {implemented}, stubbed {stubbed} (run scripts/gen-sim-names.py)"
            );
        }
        let sources = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut pending = vec![sources];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    pending.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                for piece in text.split("extern \"C\" fn ").skip(1) {
                    let name: String = piece
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    let is_entry = name.starts_with("cu")
                        && name[2..].starts_with(|c: char| c.is_ascii_uppercase());
                    if is_entry && !path.ends_with("generated.rs") {
                        assert!(
                            exported(&name).is_some(),
                            "{name} in {} is not in generated.rs (run scripts/gen-sim-names.py)",
                            path.display()
                        );
                    }
                }
            }
        }
    }
}
