//! Exported entry points: copies, memsets, page-locked host memory, pointer attributes and the
//! address-range side of the VMM API.
//!
//! Device memory holds no data: a copy to the device is discarded, a copy from the device
//! writes zeros into host memory (real writes: the caller's buffer is really filled), a
//! host-to-host copy really copies. Page-locked host memory is real, zeroed host memory, since
//! the caller (PJRT, NCCL, torch's pinned allocator) reads and writes it.

use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::c_void;

use crate::driver::{code, query, with_driver, DeviceRange};
use crate::forklock::ForkLock;
use crate::{objects, put};

/// Page-locked host allocations and registrations: start -> (bytes, allocated by us).
static HOST: ForkLock<HashMap<usize, (usize, bool)>> = ForkLock::new();

const PAGE: usize = 4096;

/// Where an address lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// A device allocation or mapping.
    Device(DeviceRange),
    /// Page-locked host memory: (start, bytes).
    PinnedHost(usize, usize),
    /// Anything else: ordinary host memory.
    Host,
}

fn place(address: u64) -> Place {
    if let Ok(Some(range)) = query(|driver| Ok(driver.device_range(address))) {
        return Place::Device(range);
    }
    if let Some((start, bytes)) = pinned_range(address as usize) {
        return Place::PinnedHost(start, bytes);
    }
    if (crate::objects::GLOBALS_BASE..crate::objects::GLOBALS_END).contains(&address) {
        return Place::Device(DeviceRange {
            start: address,
            bytes: crate::objects::GLOBAL_BYTES as u64,
            device: 0,
            mapped: false,
        });
    }
    Place::Host
}

fn pinned_range(address: usize) -> Option<(usize, usize)> {
    HOST.with(|host| {
        host.iter()
            .find(|(&start, &(bytes, _))| address >= start && address < start + bytes)
            .map(|(&start, &(bytes, _))| (start, bytes))
    })
}

/// Copies `bytes` from `source` to `destination` as the device would: zeros out of device
/// memory, nothing into it, a real copy between host buffers.
unsafe fn copy(destination: u64, source: u64, bytes: usize) -> i32 {
    if bytes == 0 {
        return code::SUCCESS;
    }
    if destination == 0 || source == 0 {
        return code::INVALID_VALUE;
    }
    match (place(destination), place(source)) {
        (Place::Device(..), _) => code::SUCCESS,
        (_, Place::Device(..)) => {
            // SAFETY: the caller gave `bytes` writable bytes of host memory at `destination`.
            unsafe { std::ptr::write_bytes(destination as *mut u8, 0, bytes) };
            code::SUCCESS
        }
        _ => {
            // SAFETY: two host buffers of `bytes` bytes, as the caller promised.
            unsafe { std::ptr::copy(source as *const u8, destination as *mut u8, bytes) };
            code::SUCCESS
        }
    }
}

/// A copy into device memory: the destination must be device memory we know. (Its end is not
/// checked: a VMM range, like PyTorch's expandable segments, is many mappings side by side.)
fn to_device(destination: u64, bytes: usize) -> i32 {
    match place(destination) {
        Place::Device(..) => code::SUCCESS,
        _ if bytes == 0 => code::SUCCESS,
        _ => code::INVALID_VALUE,
    }
}

/// cuMemcpyHtoD_v2: discarded.
#[no_mangle]
pub extern "C" fn cuMemcpyHtoD_v2(destination: u64, _source: *const c_void, bytes: usize) -> i32 {
    to_device(destination, bytes)
}

/// cuMemcpyHtoDAsync_v2.
#[no_mangle]
pub extern "C" fn cuMemcpyHtoDAsync_v2(
    destination: u64,
    source: *const c_void,
    bytes: usize,
    stream: *mut c_void,
) -> i32 {
    objects::stream_operation(stream as u64);
    cuMemcpyHtoD_v2(destination, source, bytes)
}

/// cuMemcpyDtoH_v2: zeros.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    destination: *mut c_void,
    source: u64,
    bytes: usize,
) -> i32 {
    if destination.is_null() && bytes > 0 {
        return code::INVALID_VALUE;
    }
    // SAFETY: the caller gave `bytes` writable bytes at `destination`.
    unsafe { std::ptr::write_bytes(destination.cast::<u8>(), 0, bytes) };
    let _ = source;
    code::SUCCESS
}

/// cuMemcpyDtoHAsync_v2.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    destination: *mut c_void,
    source: u64,
    bytes: usize,
    stream: *mut c_void,
) -> i32 {
    objects::stream_operation(stream as u64);
    cuMemcpyDtoH_v2(destination, source, bytes)
}

/// cuMemcpyDtoD_v2: nothing to move.
#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(destination: u64, _source: u64, bytes: usize) -> i32 {
    to_device(destination, bytes)
}

/// cuMemcpyDtoDAsync_v2.
#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    destination: u64,
    source: u64,
    bytes: usize,
    stream: *mut c_void,
) -> i32 {
    objects::stream_operation(stream as u64);
    cuMemcpyDtoD_v2(destination, source, bytes)
}

/// cuMemcpy: unified addressing decides the direction.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy(destination: u64, source: u64, bytes: usize) -> i32 {
    copy(destination, source, bytes)
}

/// cuMemcpyAsync.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync(
    destination: u64,
    source: u64,
    bytes: usize,
    stream: *mut c_void,
) -> i32 {
    objects::stream_operation(stream as u64);
    copy(destination, source, bytes)
}

/// cuMemcpyPeer: between devices, nothing to move.
#[no_mangle]
pub extern "C" fn cuMemcpyPeer(
    destination: u64,
    _destination_context: *mut c_void,
    _source: u64,
    _source_context: *mut c_void,
    bytes: usize,
) -> i32 {
    to_device(destination, bytes)
}

/// cuMemcpyPeerAsync.
#[no_mangle]
pub extern "C" fn cuMemcpyPeerAsync(
    destination: u64,
    destination_context: *mut c_void,
    source: u64,
    source_context: *mut c_void,
    bytes: usize,
    stream: *mut c_void,
) -> i32 {
    objects::stream_operation(stream as u64);
    cuMemcpyPeer(
        destination,
        destination_context,
        source,
        source_context,
        bytes,
    )
}

/// CUDA_MEMCPY2D.
#[repr(C)]
pub struct Copy2d {
    source_x_bytes: usize,
    source_y: usize,
    source_kind: u32,
    source_host: *const u8,
    source_device: u64,
    source_array: *mut c_void,
    source_pitch: usize,
    destination_x_bytes: usize,
    destination_y: usize,
    destination_kind: u32,
    destination_host: *mut u8,
    destination_device: u64,
    destination_array: *mut c_void,
    destination_pitch: usize,
    width_bytes: usize,
    height: usize,
}

/// CUmemorytype.
const MEMORY_HOST: u32 = 1;
const MEMORY_DEVICE: u32 = 2;
const MEMORY_UNIFIED: u32 = 4;

/// Row by row, like [`copy`]: zeros into host rows from the device, host rows really copied.
unsafe fn copy_2d(parameters: *const Copy2d) -> i32 {
    if parameters.is_null() {
        return code::INVALID_VALUE;
    }
    // SAFETY: the caller passes a CUDA_MEMCPY2D.
    let p = unsafe { &*parameters };
    let host_or_unified = |kind: u32, host: usize, device: u64| match kind {
        MEMORY_HOST => Some(host),
        MEMORY_UNIFIED if !matches!(place(device), Place::Device(..)) => Some(device as usize),
        MEMORY_DEVICE | MEMORY_UNIFIED => None,
        _ => None,
    };
    if p.source_kind == 3 || p.destination_kind == 3 {
        return code::NOT_SUPPORTED; // CUDA arrays are not simulated
    }
    let Some(destination) = host_or_unified(
        p.destination_kind,
        p.destination_host as usize,
        p.destination_device,
    ) else {
        return code::SUCCESS; // into device memory: discarded
    };
    let source = host_or_unified(p.source_kind, p.source_host as usize, p.source_device);
    for row in 0..p.height {
        let to =
            destination + (p.destination_y + row) * p.destination_pitch + p.destination_x_bytes;
        // SAFETY: the caller describes `height` rows of `width_bytes` bytes in both buffers.
        unsafe {
            match source {
                Some(from) => std::ptr::copy(
                    (from + (p.source_y + row) * p.source_pitch + p.source_x_bytes) as *const u8,
                    to as *mut u8,
                    p.width_bytes,
                ),
                None => std::ptr::write_bytes(to as *mut u8, 0, p.width_bytes),
            }
        }
    }
    code::SUCCESS
}

/// cuMemcpy2D_v2.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2(parameters: *const Copy2d) -> i32 {
    copy_2d(parameters)
}

/// cuMemcpy2DUnaligned_v2.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(parameters: *const Copy2d) -> i32 {
    copy_2d(parameters)
}

/// cuMemcpy2DAsync_v2.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(parameters: *const Copy2d, stream: *mut c_void) -> i32 {
    objects::stream_operation(stream as u64);
    copy_2d(parameters)
}

/// Memsets on device memory: nothing to write.
macro_rules! memsets {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[doc = concat!(stringify!($name), ": device memory holds no data.")]
        #[no_mangle]
        pub extern "C" fn $name(destination: u64, $($arg: $ty),*) -> i32 {
            $(let _ = $arg;)*
            if destination == 0 {
                return code::INVALID_VALUE;
            }
            code::SUCCESS
        }
    )*};
}

memsets! {
    cuMemsetD8_v2(value: u8, count: usize);
    cuMemsetD16_v2(value: u16, count: usize);
    cuMemsetD32_v2(value: u32, count: usize);
    cuMemsetD2D8_v2(pitch: usize, value: u8, width: usize, height: usize);
    cuMemsetD2D16_v2(pitch: usize, value: u16, width: usize, height: usize);
    cuMemsetD2D32_v2(pitch: usize, value: u32, width: usize, height: usize);
}

/// Stream-ordered memsets: a stream operation on device memory.
macro_rules! async_memsets {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[doc = concat!(stringify!($name), ": device memory holds no data.")]
        #[no_mangle]
        pub extern "C" fn $name(destination: u64, $($arg: $ty,)* stream: *mut c_void) -> i32 {
            $(let _ = $arg;)*
            if destination == 0 {
                return code::INVALID_VALUE;
            }
            objects::stream_operation(stream as u64);
            code::SUCCESS
        }
    )*};
}

async_memsets! {
    cuMemsetD8Async(value: u8, count: usize);
    cuMemsetD16Async(value: u16, count: usize);
    cuMemsetD32Async(value: u32, count: usize);
    cuMemsetD2D8Async(pitch: usize, value: u8, width: usize, height: usize);
    cuMemsetD2D16Async(pitch: usize, value: u16, width: usize, height: usize);
    cuMemsetD2D32Async(pitch: usize, value: u32, width: usize, height: usize);
}

// ---- page-locked host memory ----

/// cuMemHostAlloc: real, zeroed, page-aligned host memory.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pointer: *mut *mut c_void,
    bytes: usize,
    _flags: u32,
) -> i32 {
    if pointer.is_null() || bytes == 0 {
        return code::INVALID_VALUE;
    }
    let Ok(layout) = Layout::from_size_align(bytes, PAGE) else {
        return code::OUT_OF_MEMORY;
    };
    // SAFETY: a non-zero size.
    let memory = unsafe { std::alloc::alloc_zeroed(layout) };
    if memory.is_null() {
        return code::OUT_OF_MEMORY;
    }
    HOST.with(|host| host.insert(memory as usize, (bytes, true)));
    put(pointer, memory.cast());
    code::SUCCESS
}

/// cuMemAllocHost_v2.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pointer: *mut *mut c_void, bytes: usize) -> i32 {
    cuMemHostAlloc(pointer, bytes, 0)
}

/// cuMemFreeHost.
#[no_mangle]
pub extern "C" fn cuMemFreeHost(pointer: *mut c_void) -> i32 {
    let found = HOST.with(|host| match host.get(&(pointer as usize)) {
        Some(&(bytes, true)) => {
            host.remove(&(pointer as usize));
            Some(bytes)
        }
        _ => None,
    });
    match found.and_then(|bytes| Layout::from_size_align(bytes, PAGE).ok()) {
        Some(layout) => {
            // SAFETY: allocated by cuMemHostAlloc with this layout, freed once.
            unsafe { std::alloc::dealloc(pointer.cast(), layout) };
            code::SUCCESS
        }
        None => code::INVALID_VALUE,
    }
}

/// cuMemHostRegister_v2: remembers the range as page-locked.
#[no_mangle]
pub extern "C" fn cuMemHostRegister_v2(pointer: *mut c_void, bytes: usize, _flags: u32) -> i32 {
    if pointer.is_null() || bytes == 0 {
        return code::INVALID_VALUE;
    }
    if pinned_range(pointer as usize).is_some() {
        return code::HOST_MEMORY_ALREADY_REGISTERED;
    }
    HOST.with(|host| host.insert(pointer as usize, (bytes, false)));
    code::SUCCESS
}

/// cuMemHostUnregister.
#[no_mangle]
pub extern "C" fn cuMemHostUnregister(pointer: *mut c_void) -> i32 {
    HOST.with(|host| match host.get(&(pointer as usize)) {
        Some(&(_, false)) => {
            host.remove(&(pointer as usize));
            code::SUCCESS
        }
        _ => code::HOST_MEMORY_NOT_REGISTERED,
    })
}

/// cuMemHostGetDevicePointer_v2: the same address (unified addressing).
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    device_pointer: *mut u64,
    pointer: *mut c_void,
    _flags: u32,
) -> i32 {
    match pinned_range(pointer as usize) {
        Some(_) if put(device_pointer, pointer as u64) => code::SUCCESS,
        _ => code::INVALID_VALUE,
    }
}

/// cuMemHostGetFlags.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut u32, pointer: *mut c_void) -> i32 {
    match pinned_range(pointer as usize) {
        Some(_) if put(flags, 0) => code::SUCCESS,
        _ => code::INVALID_VALUE,
    }
}

// ---- pointer attributes ----

/// One CUpointer_attribute of `address`, written to `data`.
unsafe fn pointer_attribute(data: *mut c_void, attribute: i32, address: u64) -> i32 {
    if data.is_null() {
        return code::INVALID_VALUE;
    }
    let where_ = place(address);
    let (start, bytes, device) = match where_ {
        Place::Device(range) => (range.start, range.bytes, range.device as i32),
        Place::PinnedHost(start, bytes) => (start as u64, bytes as u64, 0),
        // Memory the driver never saw: the real driver refuses most questions about it.
        Place::Host => return code::INVALID_VALUE,
    };
    let on_device = matches!(where_, Place::Device(..));
    let context = query(|driver| Ok(driver.current())).unwrap_or(0);
    match attribute {
        // CONTEXT
        1 => put(data.cast::<u64>(), context),
        // MEMORY_TYPE: device 2, host 1
        2 => put(data.cast::<u32>(), if on_device { 2 } else { 1 }),
        // DEVICE_POINTER, HOST_POINTER (pinned memory only)
        3 => put(data.cast::<u64>(), address),
        4 if !on_device => put(data.cast::<u64>(), address),
        4 => return code::INVALID_VALUE,
        // P2P tokens, SYNC_MEMOPS
        5 => put(data.cast::<[u64; 2]>(), [0, 0]),
        6 => put(data.cast::<u32>(), 1),
        // BUFFER_ID
        7 => put(data.cast::<u64>(), start),
        // IS_MANAGED
        8 => put(data.cast::<u32>(), 0),
        // DEVICE_ORDINAL
        9 => put(data.cast::<i32>(), device),
        // IS_LEGACY_CUDA_IPC_CAPABLE: cuMemAlloc'd memory is, VMM mappings are not (NCCL's
        // buffer registration takes the VMM path, retain and properties, only for the latter)
        10 => put(
            data.cast::<u32>(),
            matches!(where_, Place::Device(range) if !range.mapped) as u32,
        ),
        // RANGE_START_ADDR, RANGE_SIZE
        11 => put(data.cast::<u64>(), start),
        12 => put(data.cast::<usize>(), bytes as usize),
        // MAPPED
        13 => put(data.cast::<u32>(), 1),
        // ALLOWED_HANDLE_TYPES
        14 => put(data.cast::<u64>(), 0),
        // IS_GPU_DIRECT_RDMA_CAPABLE
        15 => put(data.cast::<u32>(), 1),
        // ACCESS_FLAGS: read-write
        16 => put(data.cast::<u32>(), 0),
        // MEMPOOL_HANDLE
        17 => put(data.cast::<u64>(), 0),
        // MAPPING_SIZE, MAPPING_BASE_ADDR
        18 => put(data.cast::<usize>(), bytes as usize),
        19 => put(data.cast::<u64>(), start),
        // MEMORY_BLOCK_ID
        20 => put(data.cast::<u64>(), start),
        _ => return code::INVALID_VALUE,
    };
    code::SUCCESS
}

/// cuPointerGetAttribute.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: i32,
    address: u64,
) -> i32 {
    pointer_attribute(data, attribute, address)
}

/// cuPointerGetAttributes: each attribute that cannot be answered is zeroed, as the driver
/// does for memory it does not know.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    count: u32,
    attributes: *const i32,
    data: *mut *mut c_void,
    address: u64,
) -> i32 {
    if attributes.is_null() || data.is_null() {
        return code::INVALID_VALUE;
    }
    let unknown = matches!(place(address), Place::Host);
    for index in 0..count as usize {
        // SAFETY: `count` attributes and as many output pointers.
        let (attribute, out) = unsafe { (*attributes.add(index), *data.add(index)) };
        if out.is_null() {
            continue;
        }
        if unknown || pointer_attribute(out, attribute, address) != code::SUCCESS {
            // SAFETY: every attribute's value fits in 8 bytes except the P2P tokens (16),
            // which are not asked for here with an unknown pointer; zero the common width.
            match attribute {
                // MEMORY_TYPE of unknown memory: 0 (unregistered host memory)
                2 | 6 | 8 | 10 | 13 | 15 | 16 => unsafe { *out.cast::<u32>() = 0 },
                9 => unsafe { *out.cast::<i32>() = -2 },
                _ => unsafe { *out.cast::<u64>() = 0 },
            }
        }
    }
    code::SUCCESS
}

/// cuPointerSetAttribute: accepted for known memory.
#[no_mangle]
pub extern "C" fn cuPointerSetAttribute(
    _value: *const c_void,
    _attribute: i32,
    address: u64,
) -> i32 {
    match place(address) {
        Place::Host => code::INVALID_VALUE,
        _ => code::SUCCESS,
    }
}

/// cuMemGetAddressRange_v2: the allocation or mapping holding `address`.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut u64,
    bytes: *mut usize,
    address: u64,
) -> i32 {
    match place(address) {
        Place::Device(DeviceRange {
            start, bytes: size, ..
        }) => {
            put(base, start);
            put(bytes, size as usize);
            code::SUCCESS
        }
        _ => code::NOT_FOUND,
    }
}

// ---- the VMM API's lookups ----

/// cuMemRetainAllocationHandle: the same handle value cuMemCreate gave, one reference more.
#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut u64,
    address: *mut c_void,
) -> i32 {
    with_driver(|driver| match driver.vmm.retain_at(address as u64) {
        Ok(found) if put(handle, found) => code::SUCCESS,
        Ok(_) => code::INVALID_VALUE,
        Err(error) => error,
    })
}

/// cuMemGetAllocationPropertiesFromHandle: the properties it was created with.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    properties: *mut [u8; 32],
    handle: u64,
) -> i32 {
    with_driver(|driver| match driver.vmm.properties(handle) {
        Some(stored) if put(properties, stored) => code::SUCCESS,
        Some(_) => code::INVALID_VALUE,
        None => code::INVALID_HANDLE,
    })
}

/// cuMemGetAccess: read and write on every device.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: *mut u64,
    _location: *const c_void,
    address: u64,
) -> i32 {
    match place(address) {
        Place::Device(..) if put(flags, 3) => code::SUCCESS,
        _ => code::INVALID_VALUE,
    }
}

// ---- shareable handles (POSIX file descriptors) ----

extern "C" {
    fn memfd_create(name: *const std::ffi::c_char, flags: u32) -> i32;
    fn close(fd: i32) -> i32;
}
const MFD_CLOEXEC: u32 = 1;
/// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.
const HANDLE_TYPE_FD: i32 = 1;

/// Exported handles by the inode of the descriptor that stands for them.
static EXPORTED: ForkLock<HashMap<u64, u64>> = ForkLock::new();

/// The inode of descriptor `fd`, without taking ownership of it.
fn inode(fd: i32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    if fd < 0 {
        return None;
    }
    borrowed(fd).metadata().ok().map(|metadata| metadata.ino())
}

/// What an exported descriptor holds, for an import in another process (NCCL's P2P transport
/// passes it over a Unix socket): a tag, the device's physical index, the size, the
/// properties.
const RECORD_TAG: &[u8; 8] = b"gvsimh1\n";
const RECORD_BYTES: usize = 8 + 4 + 8 + 32;

/// Descriptor `fd`, borrowed (the caller keeps it open).
fn borrowed(fd: i32) -> std::mem::ManuallyDrop<std::fs::File> {
    use std::os::unix::io::FromRawFd;
    // SAFETY: the caller's open descriptor, wrapped without taking ownership (ManuallyDrop
    // never closes it).
    std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// cuMemExportToShareableHandle: a new descriptor (a memfd) standing for the handle. Imports in
/// the same process find the handle again by the descriptor's inode; another process reads
/// the handle's device, size and properties from the memfd and gets a handle of its own to
/// the same memory (which this process holds: kernels do not run, so no data is shared).
#[no_mangle]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: u64,
    kind: i32,
    _flags: u64,
) -> i32 {
    if shareable.is_null() {
        return code::INVALID_VALUE;
    }
    if kind != HANDLE_TYPE_FD {
        return code::NOT_SUPPORTED;
    }
    let found = query(|driver| {
        driver
            .physical_known(handle)
            .then(|| driver.export_record(handle))
            .flatten()
            .ok_or(code::INVALID_HANDLE)
    });
    let (physical_index, bytes, properties) = match found {
        Ok(found) => found,
        Err(error) => return error,
    };
    // SAFETY: a NUL-terminated name; the new descriptor is handed to the caller.
    let fd = unsafe { memfd_create(c"gpuvisor-sim-handle".as_ptr(), MFD_CLOEXEC) };
    let Some(node) = (fd >= 0).then(|| inode(fd)).flatten() else {
        return code::OPERATING_SYSTEM;
    };
    let mut record = Vec::with_capacity(RECORD_BYTES);
    record.extend_from_slice(RECORD_TAG);
    record.extend_from_slice(&physical_index.to_le_bytes());
    record.extend_from_slice(&bytes.to_le_bytes());
    record.extend_from_slice(&properties);
    {
        use std::os::unix::fs::FileExt;
        if borrowed(fd).write_all_at(&record, 0).is_err() {
            // SAFETY: our own new descriptor, not handed out.
            unsafe { close(fd) };
            return code::OPERATING_SYSTEM;
        }
    }
    EXPORTED.with(|exported| exported.insert(node, handle));
    put(shareable.cast::<i32>(), fd);
    code::SUCCESS
}

/// cuMemImportFromShareableHandle: the handle a descriptor of this process stands for, one
/// reference more (as a new handle to the same memory would hold).
#[no_mangle]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    shareable: *mut c_void,
    kind: i32,
) -> i32 {
    if kind != HANDLE_TYPE_FD {
        return code::NOT_SUPPORTED;
    }
    if handle.is_null() {
        return code::INVALID_VALUE;
    }
    let fd = shareable as usize as i32;
    let Some(node) = inode(fd) else {
        return code::INVALID_VALUE;
    };
    if let Some(found) = EXPORTED.with(|exported| exported.get(&node).copied()) {
        return with_driver(|driver| match driver.vmm.retain_handle(found) {
            Ok(()) if put(handle, found) => code::SUCCESS,
            Ok(()) => code::INVALID_VALUE,
            Err(error) => error,
        });
    }
    // Another process's export: its record.
    let mut record = [0u8; RECORD_BYTES];
    {
        use std::os::unix::fs::FileExt;
        if borrowed(fd).read_exact_at(&mut record, 0).is_err() || &record[..8] != RECORD_TAG {
            return code::INVALID_VALUE;
        }
    }
    let physical_index = u32::from_le_bytes(record[8..12].try_into().expect("4 bytes"));
    let bytes = u64::from_le_bytes(record[12..20].try_into().expect("8 bytes"));
    let properties: [u8; 32] = record[20..].try_into().expect("32 bytes");
    with_driver(
        |driver| match driver.import_physical(physical_index, bytes, properties) {
            Ok(imported) if put(handle, imported) => code::SUCCESS,
            Ok(_) => code::INVALID_VALUE,
            Err(error) => error,
        },
    )
}
