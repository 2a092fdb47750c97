//! Exported entry points: modules, libraries, kernels and functions, the JIT linker, tensor
//! maps and occupancy.
//!
//! Code is never compiled or run: a loaded module is a handle, its functions and globals are
//! handles and fake addresses looked up by name, and their attributes are those of a typical
//! sm_90 kernel (the values cuBLAS, cuDNN and XLA size their launches from).

use std::ffi::{c_char, c_void, CStr};

use crate::driver::{code, with_driver};
use crate::{objects, put};

/// The attribute cuFuncGetAttribute reports when none was set.
fn default_function_attribute(attribute: i32) -> Option<i32> {
    Some(match attribute {
        0 => 1024,    // max threads per block
        1..=3 => 0,   // static shared, constant and local bytes
        4 => 32,      // registers per thread
        5 | 6 => 90,  // PTX and binary version
        7 => 0,       // cache mode CA
        8 => 232_448, // max dynamic shared memory
        9 => -1,      // preferred shared memory carveout: none
        10..=15 => 0, // cluster attributes
        _ => return None,
    })
}

/// Loads a module and writes its handle (the driver must be initialised, with a context).
unsafe fn load_into(module: *mut *mut c_void) -> i32 {
    let ready = with_driver(|driver| {
        driver
            .current_device()
            .map_or_else(|error| error, |_| code::SUCCESS)
    });
    if ready != code::SUCCESS {
        return ready;
    }
    objects::new_module_into(module.cast())
}

/// The name behind a C string argument.
unsafe fn name<'a>(text: *const c_char) -> Option<&'a [u8]> {
    // SAFETY: the caller passes NULL or a NUL-terminated string.
    (!text.is_null()).then(|| unsafe { CStr::from_ptr(text) }.to_bytes())
}

/// cuModuleLoad: a module from a file (which must exist).
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(module: *mut *mut c_void, path: *const c_char) -> i32 {
    let Some(path) = name(path) else {
        return code::INVALID_VALUE;
    };
    if !std::path::Path::new(&*String::from_utf8_lossy(path)).is_file() {
        return code::FILE_NOT_FOUND;
    }
    load_into(module)
}

/// cuModuleLoadData.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> i32 {
    if image.is_null() {
        return code::INVALID_VALUE;
    }
    load_into(module)
}

/// cuModuleLoadDataEx (JIT options ignored).
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut *mut c_void,
    image: *const c_void,
    _options: u32,
    _option_keys: *mut i32,
    _option_values: *mut *mut c_void,
) -> i32 {
    cuModuleLoadData(module, image)
}

/// cuModuleLoadFatBinary.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    module: *mut *mut c_void,
    fatbin: *const c_void,
) -> i32 {
    cuModuleLoadData(module, fatbin)
}

/// cuModuleUnload.
#[no_mangle]
pub extern "C" fn cuModuleUnload(module: *mut c_void) -> i32 {
    objects::unload_module(module as u64)
}

/// cuModuleGetFunction: the same handle for the same name.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    function: *mut *mut c_void,
    module: *mut c_void,
    symbol: *const c_char,
) -> i32 {
    let Some(symbol) = name(symbol) else {
        return code::INVALID_VALUE;
    };
    match objects::function(module as u64, symbol) {
        Ok(handle) if put(function, handle as *mut c_void) => code::SUCCESS,
        Ok(_) => code::INVALID_VALUE,
        Err(error) => error,
    }
}

/// cuModuleGetGlobal_v2: a fake device address and [`objects::GLOBAL_BYTES`].
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    address: *mut u64,
    bytes: *mut usize,
    module: *mut c_void,
    symbol: *const c_char,
) -> i32 {
    let Some(symbol) = name(symbol) else {
        return code::INVALID_VALUE;
    };
    match objects::global(module as u64, symbol) {
        Ok((found, size)) => {
            put(address, found);
            put(bytes, size);
            code::SUCCESS
        }
        Err(error) => error,
    }
}

/// cuModuleGetLoadingMode: lazy, as torch and current drivers default to.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut i32) -> i32 {
    if put(mode, 2) {
        code::SUCCESS
    } else {
        code::INVALID_VALUE
    }
}

/// cuModuleGetFunctionCount: the functions looked up so far.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunctionCount(count: *mut u32, module: *mut c_void) -> i32 {
    match objects::functions_of(module as u64) {
        Ok(functions) if put(count, functions.len() as u32) => code::SUCCESS,
        Ok(_) => code::INVALID_VALUE,
        Err(error) => error,
    }
}

/// Writes up to `room` handles of `list` to `out`.
unsafe fn write_handles(out: *mut *mut c_void, room: u32, list: &[u64]) -> i32 {
    if out.is_null() {
        return code::INVALID_VALUE;
    }
    for (index, handle) in list.iter().take(room as usize).enumerate() {
        // SAFETY: the caller gave room for `room` handles; index < room.
        unsafe { *out.add(index) = *handle as *mut c_void };
    }
    code::SUCCESS
}

/// cuModuleEnumerateFunctions.
#[no_mangle]
pub unsafe extern "C" fn cuModuleEnumerateFunctions(
    functions: *mut *mut c_void,
    room: u32,
    module: *mut c_void,
) -> i32 {
    match objects::functions_of(module as u64) {
        Ok(list) => write_handles(functions, room, &list),
        Err(error) => error,
    }
}

// ---- libraries (CUDA 12's context-independent modules) and kernels ----

/// cuLibraryLoadData.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut *mut c_void,
    image: *const c_void,
    _jit_keys: *mut i32,
    _jit_values: *mut *mut c_void,
    _jit_count: u32,
    _library_keys: *mut i32,
    _library_values: *mut *mut c_void,
    _library_count: u32,
) -> i32 {
    if image.is_null() {
        return code::INVALID_VALUE;
    }
    objects::new_module_into(library.cast())
}

/// cuLibraryLoadFromFile.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    library: *mut *mut c_void,
    path: *const c_char,
    _jit_keys: *mut i32,
    _jit_values: *mut *mut c_void,
    _jit_count: u32,
    _library_keys: *mut i32,
    _library_values: *mut *mut c_void,
    _library_count: u32,
) -> i32 {
    let Some(path) = name(path) else {
        return code::INVALID_VALUE;
    };
    if !std::path::Path::new(&*String::from_utf8_lossy(path)).is_file() {
        return code::FILE_NOT_FOUND;
    }
    objects::new_module_into(library.cast())
}

/// cuLibraryUnload.
#[no_mangle]
pub extern "C" fn cuLibraryUnload(library: *mut c_void) -> i32 {
    objects::unload_module(library as u64)
}

/// cuLibraryGetKernel: kernels and functions share handles.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(
    kernel: *mut *mut c_void,
    library: *mut c_void,
    symbol: *const c_char,
) -> i32 {
    cuModuleGetFunction(kernel, library, symbol)
}

/// cuLibraryGetModule: a library is its own module.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetModule(module: *mut *mut c_void, library: *mut c_void) -> i32 {
    match objects::functions_of(library as u64) {
        Ok(_) if put(module, library) => code::SUCCESS,
        Ok(_) => code::INVALID_VALUE,
        Err(error) => error,
    }
}

/// cuLibraryGetGlobal.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    address: *mut u64,
    bytes: *mut usize,
    library: *mut c_void,
    symbol: *const c_char,
) -> i32 {
    cuModuleGetGlobal_v2(address, bytes, library, symbol)
}

/// cuLibraryGetManaged.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetManaged(
    address: *mut u64,
    bytes: *mut usize,
    library: *mut c_void,
    symbol: *const c_char,
) -> i32 {
    cuModuleGetGlobal_v2(address, bytes, library, symbol)
}

/// cuLibraryGetKernelCount.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernelCount(count: *mut u32, library: *mut c_void) -> i32 {
    cuModuleGetFunctionCount(count, library)
}

/// cuLibraryEnumerateKernels.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryEnumerateKernels(
    kernels: *mut *mut c_void,
    room: u32,
    library: *mut c_void,
) -> i32 {
    cuModuleEnumerateFunctions(kernels, room, library)
}

/// cuKernelGetFunction: the kernel's handle is its function's.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(
    function: *mut *mut c_void,
    kernel: *mut c_void,
) -> i32 {
    match objects::function_info(kernel as u64) {
        Ok(_) if put(function, kernel) => code::SUCCESS,
        Ok(_) => code::INVALID_VALUE,
        Err(error) => error,
    }
}

/// cuKernelGetLibrary.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetLibrary(library: *mut *mut c_void, kernel: *mut c_void) -> i32 {
    cuFuncGetModule(library, kernel)
}

/// cuKernelGetName.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetName(text: *mut *const c_char, kernel: *mut c_void) -> i32 {
    cuFuncGetName(text, kernel)
}

/// cuKernelGetAttribute (per device; the same on every simulated device).
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetAttribute(
    value: *mut i32,
    attribute: i32,
    kernel: *mut c_void,
    _device: i32,
) -> i32 {
    cuFuncGetAttribute(value, attribute, kernel)
}

/// cuKernelSetAttribute.
#[no_mangle]
pub extern "C" fn cuKernelSetAttribute(
    attribute: i32,
    value: i32,
    kernel: *mut c_void,
    _device: i32,
) -> i32 {
    cuFuncSetAttribute(kernel, attribute, value)
}

/// cuKernelSetCacheConfig: accepted.
#[no_mangle]
pub extern "C" fn cuKernelSetCacheConfig(kernel: *mut c_void, _config: i32, _device: i32) -> i32 {
    objects::function_info(kernel as u64).map_or_else(|error| error, |_| code::SUCCESS)
}

// ---- functions ----

/// cuFuncGetAttribute: what was set, else a typical sm_90 kernel's value.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    value: *mut i32,
    attribute: i32,
    function: *mut c_void,
) -> i32 {
    let set = match objects::function_attribute(function as u64, attribute) {
        Ok(set) => set,
        Err(error) => return error,
    };
    match set.or_else(|| default_function_attribute(attribute)) {
        Some(answer) if put(value, answer) => code::SUCCESS,
        _ => code::INVALID_VALUE,
    }
}

/// cuFuncSetAttribute.
#[no_mangle]
pub extern "C" fn cuFuncSetAttribute(function: *mut c_void, attribute: i32, value: i32) -> i32 {
    if default_function_attribute(attribute).is_none() {
        return code::INVALID_VALUE;
    }
    objects::set_function_attribute(function as u64, attribute, value)
}

/// cuFuncSetCacheConfig: accepted.
#[no_mangle]
pub extern "C" fn cuFuncSetCacheConfig(function: *mut c_void, _config: i32) -> i32 {
    objects::function_info(function as u64).map_or_else(|error| error, |_| code::SUCCESS)
}

/// cuFuncSetSharedMemConfig: accepted.
#[no_mangle]
pub extern "C" fn cuFuncSetSharedMemConfig(function: *mut c_void, _config: i32) -> i32 {
    cuFuncSetCacheConfig(function, 0)
}

/// cuFuncGetModule.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetModule(module: *mut *mut c_void, function: *mut c_void) -> i32 {
    match objects::function_info(function as u64) {
        Ok((_, owner)) if put(module, owner as *mut c_void) => code::SUCCESS,
        Ok(_) => code::INVALID_VALUE,
        Err(error) => error,
    }
}

/// cuFuncGetName.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetName(text: *mut *const c_char, function: *mut c_void) -> i32 {
    match objects::function_info(function as u64) {
        Ok((found, _)) if put(text, found) => code::SUCCESS,
        Ok(_) => code::INVALID_VALUE,
        Err(error) => error,
    }
}

/// cuFuncLoad: functions are always loaded.
#[no_mangle]
pub extern "C" fn cuFuncLoad(function: *mut c_void) -> i32 {
    cuFuncSetCacheConfig(function, 0)
}

/// cuFuncIsLoaded: loaded.
#[no_mangle]
pub unsafe extern "C" fn cuFuncIsLoaded(state: *mut i32, function: *mut c_void) -> i32 {
    match objects::function_info(function as u64) {
        Ok(_) if put(state, 1) => code::SUCCESS,
        Ok(_) => code::INVALID_VALUE,
        Err(error) => error,
    }
}

// ---- the JIT linker ----

/// A cubin the linker hands back: an ELF header's first bytes, enough to be loaded again here.
static LINKED_CUBIN: [u8; 64] = {
    let mut image = [0u8; 64];
    image[0] = 0x7f;
    image[1] = b'E';
    image[2] = b'L';
    image[3] = b'F';
    image
};

/// cuLinkCreate_v2.
#[no_mangle]
pub unsafe extern "C" fn cuLinkCreate_v2(
    _options: u32,
    _option_keys: *mut i32,
    _option_values: *mut *mut c_void,
    state: *mut *mut c_void,
) -> i32 {
    if put(state, objects::new_link() as *mut c_void) {
        code::SUCCESS
    } else {
        code::INVALID_VALUE
    }
}

/// cuLinkAddData_v2: accepted.
#[no_mangle]
pub extern "C" fn cuLinkAddData_v2(
    state: *mut c_void,
    _kind: i32,
    data: *mut c_void,
    _bytes: usize,
    _name: *const c_char,
    _options: u32,
    _option_keys: *mut i32,
    _option_values: *mut *mut c_void,
) -> i32 {
    if state.is_null() || data.is_null() {
        return code::INVALID_VALUE;
    }
    code::SUCCESS
}

/// cuLinkAddFile_v2: accepted when the file exists.
#[no_mangle]
pub unsafe extern "C" fn cuLinkAddFile_v2(
    state: *mut c_void,
    _kind: i32,
    path: *const c_char,
    _options: u32,
    _option_keys: *mut i32,
    _option_values: *mut *mut c_void,
) -> i32 {
    let Some(path) = name(path) else {
        return code::INVALID_VALUE;
    };
    if state.is_null() {
        return code::INVALID_VALUE;
    }
    if std::path::Path::new(&*String::from_utf8_lossy(path)).is_file() {
        code::SUCCESS
    } else {
        code::FILE_NOT_FOUND
    }
}

/// cuLinkComplete: a placeholder cubin, owned by the simulator.
#[no_mangle]
pub unsafe extern "C" fn cuLinkComplete(
    state: *mut c_void,
    cubin: *mut *const c_void,
    bytes: *mut usize,
) -> i32 {
    if state.is_null() {
        return code::INVALID_VALUE;
    }
    put(cubin, LINKED_CUBIN.as_ptr().cast());
    put(bytes, LINKED_CUBIN.len());
    code::SUCCESS
}

/// cuLinkDestroy.
#[no_mangle]
pub extern "C" fn cuLinkDestroy(state: *mut c_void) -> i32 {
    if state.is_null() {
        code::INVALID_VALUE
    } else {
        code::SUCCESS
    }
}

// ---- tensor maps ----

/// Writes an opaque 128-byte tensor map (zeros: nothing reads it on the device here).
unsafe fn blank_tensor_map(map: *mut [u64; 16]) -> i32 {
    if put(map, [0; 16]) {
        code::SUCCESS
    } else {
        code::INVALID_VALUE
    }
}

/// cuTensorMapEncodeTiled.
#[no_mangle]
pub unsafe extern "C" fn cuTensorMapEncodeTiled(
    map: *mut [u64; 16],
    _data_type: i32,
    rank: u32,
    _global_address: *mut c_void,
    _global_dims: *const u64,
    _global_strides: *const u64,
    _box_dims: *const u32,
    _element_strides: *const u32,
    _interleave: i32,
    _swizzle: i32,
    _l2_promotion: i32,
    _out_of_bounds_fill: i32,
) -> i32 {
    if !(1..=5).contains(&rank) {
        return code::INVALID_VALUE;
    }
    blank_tensor_map(map)
}

/// cuTensorMapEncodeIm2col.
#[no_mangle]
pub unsafe extern "C" fn cuTensorMapEncodeIm2col(
    map: *mut [u64; 16],
    _data_type: i32,
    rank: u32,
    _global_address: *mut c_void,
    _global_dims: *const u64,
    _global_strides: *const u64,
    _lower_corner: *const i32,
    _upper_corner: *const i32,
    _channels: u32,
    _pixels: u32,
    _element_strides: *const u32,
    _interleave: i32,
    _swizzle: i32,
    _l2_promotion: i32,
    _out_of_bounds_fill: i32,
) -> i32 {
    if !(3..=5).contains(&rank) {
        return code::INVALID_VALUE;
    }
    blank_tensor_map(map)
}

/// cuTensorMapReplaceAddress: accepted.
#[no_mangle]
pub extern "C" fn cuTensorMapReplaceAddress(map: *mut c_void, _address: *mut c_void) -> i32 {
    if map.is_null() {
        code::INVALID_VALUE
    } else {
        code::SUCCESS
    }
}

// ---- occupancy (an H100: 2048 threads, 32 blocks and 228 KiB of shared memory per SM) ----

/// Blocks of `block_threads` threads using `shared_bytes` each that fit on one SM.
fn blocks_per_sm(block_threads: i32, shared_bytes: usize) -> i32 {
    if !(1..=1024).contains(&block_threads) {
        return 0;
    }
    let by_threads = 2048 / block_threads;
    let by_shared = if shared_bytes == 0 {
        32
    } else {
        (233_472 / (shared_bytes + 1024)) as i32
    };
    by_threads.min(by_shared).min(32)
}

/// cuOccupancyMaxActiveBlocksPerMultiprocessor.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    blocks: *mut i32,
    function: *mut c_void,
    block_threads: i32,
    shared_bytes: usize,
) -> i32 {
    if function.is_null() || !put(blocks, blocks_per_sm(block_threads, shared_bytes)) {
        return code::INVALID_VALUE;
    }
    code::SUCCESS
}

/// cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    blocks: *mut i32,
    function: *mut c_void,
    block_threads: i32,
    shared_bytes: usize,
    _flags: u32,
) -> i32 {
    cuOccupancyMaxActiveBlocksPerMultiprocessor(blocks, function, block_threads, shared_bytes)
}

/// cuOccupancyMaxPotentialBlockSize: the largest block within the limit (shared memory per
/// block taken as `shared_bytes`; the size callback is not called).
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSize(
    min_grid: *mut i32,
    block_size: *mut i32,
    function: *mut c_void,
    _shared_for_size: *mut c_void,
    shared_bytes: usize,
    limit: i32,
) -> i32 {
    if function.is_null() {
        return code::INVALID_VALUE;
    }
    let size = if limit > 0 { limit.min(1024) } else { 1024 };
    put(block_size, size);
    put(min_grid, 132 * blocks_per_sm(size, shared_bytes).max(1));
    code::SUCCESS
}

/// cuOccupancyMaxPotentialBlockSizeWithFlags.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    min_grid: *mut i32,
    block_size: *mut i32,
    function: *mut c_void,
    shared_for_size: *mut c_void,
    shared_bytes: usize,
    limit: i32,
    _flags: u32,
) -> i32 {
    cuOccupancyMaxPotentialBlockSize(
        min_grid,
        block_size,
        function,
        shared_for_size,
        shared_bytes,
        limit,
    )
}

/// cuOccupancyAvailableDynamicSMemPerBlock.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    shared_bytes: *mut usize,
    function: *mut c_void,
    blocks: i32,
    _block_threads: i32,
) -> i32 {
    if function.is_null() || blocks <= 0 {
        return code::INVALID_VALUE;
    }
    let per_block = (233_472 / blocks as usize)
        .saturating_sub(1024)
        .min(232_448);
    put(shared_bytes, per_block);
    code::SUCCESS
}

/// The cluster size a CUlaunchConfig asks for (attribute 4, cluster dimension), 1 if none.
unsafe fn cluster_size(config: *const c_void) -> u32 {
    // CUlaunchConfig: 7 u32 (grid, block, shared memory), the stream at 32, the attributes at 40
    // and their count at 48; a CUlaunchAttribute is 72 bytes: its id, then a 64-byte value.
    // SAFETY: the caller passes a CUlaunchConfig.
    let (attributes, count) = unsafe {
        (
            *config.cast::<u8>().add(40).cast::<*const u8>(),
            *config.cast::<u8>().add(48).cast::<u32>(),
        )
    };
    if attributes.is_null() {
        return 1;
    }
    for index in 0..count as usize {
        // SAFETY: `count` attributes of 72 bytes each.
        let attribute = unsafe { attributes.add(index * 72) };
        // SAFETY: the id is the first u32 of the attribute, the dimension three u32 at 8.
        unsafe {
            if *attribute.cast::<u32>() == 4 {
                let dims = attribute.add(8).cast::<u32>();
                return (*dims).max(1) * (*dims.add(1)).max(1) * (*dims.add(2)).max(1);
            }
        }
    }
    1
}

/// cuOccupancyMaxActiveClusters: 132 SMs shared by clusters of the requested size.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveClusters(
    clusters: *mut i32,
    function: *mut c_void,
    config: *const c_void,
) -> i32 {
    if function.is_null() || config.is_null() {
        return code::INVALID_VALUE;
    }
    let size = cluster_size(config);
    if size > 16 {
        put(clusters, 0);
        return code::SUCCESS;
    }
    put(clusters, (132 / size) as i32);
    code::SUCCESS
}

/// cuOccupancyMaxPotentialClusterSize: 8, the portable maximum.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialClusterSize(
    size: *mut i32,
    function: *mut c_void,
    config: *const c_void,
) -> i32 {
    if function.is_null() || config.is_null() || !put(size, 8) {
        return code::INVALID_VALUE;
    }
    code::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occupancy_follows_threads_and_shared_memory() {
        assert_eq!(blocks_per_sm(256, 0), 8);
        assert_eq!(blocks_per_sm(32, 0), 32);
        assert_eq!(blocks_per_sm(1024, 100_000), 2);
        assert_eq!(blocks_per_sm(2048, 0), 0);
    }

    #[test]
    fn functions_answer_set_attributes_over_defaults() {
        let mut module: *mut c_void = std::ptr::null_mut();
        assert_eq!(
            unsafe { objects::new_module_into(std::ptr::from_mut(&mut module).cast()) },
            code::SUCCESS
        );
        let mut function = std::ptr::null_mut();
        assert_eq!(
            unsafe { cuModuleGetFunction(&mut function, module, c"k".as_ptr()) },
            code::SUCCESS
        );
        let mut value = 0;
        unsafe { cuFuncGetAttribute(&mut value, 4, function) };
        assert_eq!(value, 32);
        assert_eq!(cuFuncSetAttribute(function, 8, 1000), code::SUCCESS);
        unsafe { cuFuncGetAttribute(&mut value, 8, function) };
        assert_eq!(value, 1000);
        assert_eq!(cuFuncSetAttribute(function, 99, 1), code::INVALID_VALUE);
    }
}
