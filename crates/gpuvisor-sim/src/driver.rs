//! The per-process driver state behind the exported functions: devices, contexts, streams,
//! pools and allocations, and the fake device addresses handed out.
//!
//! One mutex guards it all except the hot path of cuMemAlloc_v2/cuMemFree_v2: those reach the
//! published [`Allocations`] table with no lock (see [`published`] and
//! [`current_device_fast`]), so the simulator costs about what a real driver's cached
//! allocation does, and the shim's added cost can be measured against it. After `fork()` the
//! child finds a state made by another pid and starts fresh (uninitialised), since a real
//! driver's state does not survive a fork either.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::allocations::{Allocations, DeviceAccount, RESERVATION_BASE};
pub use crate::allocations::{ADDRESS_BASE, GRANULARITY};
use crate::config::{self, SimDevice};
use crate::forklock::ForkLock;
use crate::physical::Physical;
use crate::process;
use crate::vmm::{Freed, Vmm};

/// CUresult values the simulator returns.
pub mod code {
    /// No error.
    pub const SUCCESS: i32 = 0;
    /// A bad argument.
    pub const INVALID_VALUE: i32 = 1;
    /// Device memory exhausted.
    pub const OUT_OF_MEMORY: i32 = 2;
    /// cuInit was not called (or failed).
    pub const NOT_INITIALIZED: i32 = 3;
    /// No device is visible.
    pub const NO_DEVICE: i32 = 100;
    /// A device ordinal out of range.
    pub const INVALID_DEVICE: i32 = 101;
    /// No current context, or an unknown one.
    pub const INVALID_CONTEXT: i32 = 201;
    /// A system call failed.
    pub const OPERATING_SYSTEM: i32 = 304;
    /// A file that does not exist (cuModuleLoad, cuLinkAddFile).
    pub const FILE_NOT_FOUND: i32 = 301;
    /// An unknown handle (stream, pool, allocation).
    pub const INVALID_HANDLE: i32 = 400;
    /// A symbol that does not exist.
    pub const NOT_FOUND: i32 = 500;
    /// The driver is shutting down (called from an exit handler after teardown).
    pub const DEINITIALIZED: i32 = 4;
    /// An operation not allowed in the current state (e.g. a capture already running).
    pub const ILLEGAL_STATE: i32 = 401;
    /// Work is still pending (cuStreamQuery, cuEventQuery).
    pub const NOT_READY: i32 = 600;
    /// Peer access was already enabled.
    pub const PEER_ACCESS_ALREADY_ENABLED: i32 = 704;
    /// cuMemHostRegister of a range already registered.
    pub const HOST_MEMORY_ALREADY_REGISTERED: i32 = 712;
    /// cuMemHostUnregister of a range never registered.
    pub const HOST_MEMORY_NOT_REGISTERED: i32 = 713;
    /// Something the simulator does not model.
    pub const NOT_SUPPORTED: i32 = 801;
}

/// A range of device memory: an allocation (cuMemAlloc and friends) or a VMM mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRange {
    /// Its first address.
    pub start: u64,
    /// Its size.
    pub bytes: u64,
    /// The device ordinal.
    pub device: usize,
    /// A VMM mapping (cuMemMap) rather than an allocation: not legacy-IPC capable, and what
    /// cuMemRetainAllocationHandle accepts.
    pub mapped: bool,
}

/// A stream: its device, creation flags and priority.
#[derive(Debug, Clone, Copy)]
pub struct Stream {
    /// The ordinal of the device of the context it was created in.
    pub device: usize,
    /// CU_STREAM_* flags.
    pub flags: u32,
    /// Its priority (lower is more urgent).
    pub priority: i32,
}

/// A context: which device it is on and whether it is the primary one.
#[derive(Debug, Clone, Copy)]
struct Context {
    device: usize,
}

/// The driver state of this process.
pub struct Driver {
    pid: u32,
    /// Bumped on every reset, so thread-local context stacks made before a fork are dropped.
    generation: u64,
    initialized: bool,
    /// Visible devices in ordinal order.
    pub devices: Vec<SimDevice>,
    context_overhead: u64,
    /// Allocations and physical accounting; set by a successful init.
    table: Option<&'static Allocations>,
    contexts: HashMap<u64, Context>,
    primary_retains: HashMap<usize, u32>,
    next_handle: u64,
    next_reservation: u64,
    /// cuMemCreate handles and their mappings.
    pub vmm: Vmm,
    streams: HashMap<u64, Stream>,
    pools: HashMap<u64, usize>,
}

/// This process's driver state, behind a lock a forked child can always take (a child gets a
/// fresh, uninitialised driver, as CUDA state does not survive a fork).
static DRIVER: ForkLock<Slot> = ForkLock::new();
/// Generations handed out, so a child's driver never shares one with its parent's.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

/// The driver state, made on first use.
#[derive(Default)]
struct Slot(Option<Driver>);
/// The initialised driver's table, for the lock-free hot path; null when uninitialised.
static PUBLISHED: AtomicPtr<Allocations> = AtomicPtr::new(std::ptr::null_mut());
/// Bumped whenever a context stops existing, so threads re-check their cached device.
static CONTEXT_EPOCH: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's context stack (top = current) and the driver generation it belongs to.
    static CONTEXT_STACK: RefCell<(u64, Vec<u64>)> = const { RefCell::new((0, Vec::new())) };
    /// This thread's current device as (generation, context epoch, ordinal); generation 0
    /// (never a driver's) means nothing is cached.
    static CURRENT_DEVICE: Cell<(u64, u64, usize)> = const { Cell::new((0, 0, 0)) };
}

/// The initialised driver's allocation table, without taking the lock.
#[inline]
pub fn published() -> Option<&'static Allocations> {
    let table = PUBLISHED.load(Ordering::Acquire);
    // SAFETY: a published table is leaked (never freed), so the reference is 'static.
    unsafe { table.as_ref() }
}

/// Called in the child after `fork()`: the inherited driver state is no longer ours.
pub(crate) fn forget_after_fork() {
    PUBLISHED.store(std::ptr::null_mut(), Ordering::Release);
    CONTEXT_EPOCH.fetch_add(1, Ordering::AcqRel);
}

/// The device of this thread's current context for the hot path: from the thread's cache
/// when no context has gone since it was filled, otherwise looked up under the lock.
#[inline]
pub fn current_device_fast(table: &Allocations) -> Result<usize, i32> {
    let epoch = CONTEXT_EPOCH.load(Ordering::Acquire);
    let (generation, cached_epoch, ordinal) =
        CURRENT_DEVICE.try_with(Cell::get).unwrap_or((0, 0, 0));
    if generation == table.generation && cached_epoch == epoch {
        return Ok(ordinal);
    }
    current_device_slow(table.generation, epoch)
}

#[cold]
fn current_device_slow(generation: u64, epoch: u64) -> Result<usize, i32> {
    query(|driver| {
        if driver.generation != generation {
            return Err(code::NOT_INITIALIZED);
        }
        let ordinal = driver.current_device()?;
        // During thread teardown the cache is gone; the answer still stands.
        let _ = CURRENT_DEVICE.try_with(|cell| cell.set((generation, epoch, ordinal)));
        Ok(ordinal)
    })
}

/// Runs `body` on this process's driver state, initialised or not. `body` must not call back
/// into the driver state.
pub fn locked<R>(body: impl FnOnce(&mut Driver) -> R) -> R {
    DRIVER.with(|slot| {
        let driver = slot.0.get_or_insert_with(|| {
            Driver::fresh(process::pid(), GENERATIONS.fetch_add(1, Ordering::Relaxed))
        });
        body(driver)
    })
}

/// Runs `body` on the initialised driver, or returns CUDA_ERROR_NOT_INITIALIZED.
pub fn with_driver(body: impl FnOnce(&mut Driver) -> i32) -> i32 {
    query(|driver| Ok(body(driver))).unwrap_or_else(|error| error)
}

/// Runs `body` on the initialised driver for a value, or CUDA_ERROR_NOT_INITIALIZED.
pub fn query<T>(body: impl FnOnce(&mut Driver) -> Result<T, i32>) -> Result<T, i32> {
    locked(|driver| {
        if driver.initialized {
            body(driver)
        } else {
            Err(code::NOT_INITIALIZED)
        }
    })
}

impl Driver {
    fn fresh(pid: u32, generation: u64) -> Driver {
        Driver {
            pid,
            generation,
            initialized: false,
            devices: Vec::new(),
            context_overhead: config::DEFAULT_CONTEXT_OVERHEAD,
            table: None,
            contexts: HashMap::new(),
            primary_retains: HashMap::new(),
            next_handle: 1,
            next_reservation: RESERVATION_BASE,
            vmm: Vmm::default(),
            streams: HashMap::new(),
            pools: HashMap::new(),
        }
    }

    /// Whether cuInit succeeded.
    pub fn initialized(&self) -> bool {
        self.initialized
    }

    /// cuInit: reads the environment once per process.
    pub fn init(&mut self) -> i32 {
        if self.initialized {
            return code::SUCCESS;
        }
        let spec = std::env::var(config::SIM_GPUS_ENV)
            .unwrap_or_else(|_| config::DEFAULT_GPUS.to_string());
        let all = match config::parse_devices(&spec) {
            Ok(all) => all,
            Err(reason) => {
                eprintln!(
                    "gpuvisor-sim: {}=`{spec}` is invalid: {reason}",
                    config::SIM_GPUS_ENV
                );
                return code::INVALID_VALUE;
            }
        };
        if let Ok(text) = std::env::var(config::CONTEXT_OVERHEAD_ENV) {
            match config::parse_size(&text) {
                Some(bytes) => self.context_overhead = bytes,
                None => eprintln!(
                    "gpuvisor-sim: {}=`{text}` is not a size; using 300MiB",
                    config::CONTEXT_OVERHEAD_ENV
                ),
            }
        }
        self.devices =
            config::visible_devices(&all, std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref());
        if self.devices.is_empty() {
            return code::NO_DEVICE;
        }
        let physical = Physical::open(std::env::var(config::STATE_ENV).ok().as_deref());
        let table = self.attach(physical);
        PUBLISHED.store(std::ptr::from_ref(table).cast_mut(), Ordering::Release);
        self.initialized = true;
        code::SUCCESS
    }

    /// Makes this driver's allocation table over `physical` (claiming this process's slot).
    /// The table is leaked: the lock-free hot path may still hold it when a fork resets us.
    fn attach(&mut self, physical: Physical) -> &'static Allocations {
        // With every slot held by live processes, share slot 0 rather than fail.
        let slot = physical.claim(self.pid).unwrap_or(0);
        let accounts = self
            .devices
            .iter()
            .map(|device| DeviceAccount {
                physical_index: device.index as usize,
                capacity_bytes: device.total_bytes - device.foreign_bytes,
            })
            .collect();
        let table = Box::leak(Box::new(Allocations::new(
            self.generation,
            physical,
            slot,
            accounts,
        )));
        self.table = Some(table);
        table
    }

    fn table(&self) -> &'static Allocations {
        self.table
            .expect("the driver is initialised before it accounts memory")
    }

    fn handle(&mut self) -> u64 {
        self.next_handle += 1;
        0x5151_0000 + self.next_handle * 16
    }

    /// The ordinal `device` if it is a visible device.
    pub fn device(&self, device: i32) -> Option<usize> {
        usize::try_from(device)
            .ok()
            .filter(|&ordinal| ordinal < self.devices.len())
    }

    /// Physical device memory in use on `ordinal` by everyone (foreign + all live processes).
    pub fn used_bytes(&mut self, ordinal: usize) -> u64 {
        let foreign = self.devices[ordinal].foreign_bytes;
        foreign.saturating_add(self.table().used_bytes(ordinal))
    }

    /// Charges `bytes` of physical memory on `ordinal`; false if the device is full.
    fn charge(&mut self, ordinal: usize, bytes: u64) -> bool {
        self.table().charge(ordinal, bytes)
    }

    fn uncharge(&mut self, ordinal: usize, bytes: u64) {
        self.table().uncharge(ordinal, bytes);
    }

    /// The handle of `ordinal`'s primary context.
    pub fn primary_handle(ordinal: usize) -> u64 {
        0x5150_0000 + ordinal as u64 * 16
    }

    /// cuDevicePrimaryCtxRetain: the first retain charges the context overhead.
    pub fn retain_primary(&mut self, ordinal: usize) -> Result<u64, i32> {
        let retains = self.primary_retains.get(&ordinal).copied().unwrap_or(0);
        if retains == 0 && !self.charge(ordinal, self.context_overhead) {
            return Err(code::OUT_OF_MEMORY);
        }
        self.primary_retains.insert(ordinal, retains + 1);
        let handle = Self::primary_handle(ordinal);
        self.contexts.insert(handle, Context { device: ordinal });
        Ok(handle)
    }

    /// cuDevicePrimaryCtxRelease: the last release gives the overhead back.
    pub fn release_primary(&mut self, ordinal: usize) -> i32 {
        match self.primary_retains.get(&ordinal).copied() {
            Some(1) => {
                self.primary_retains.remove(&ordinal);
                self.uncharge(ordinal, self.context_overhead);
                code::SUCCESS
            }
            Some(retains) if retains > 1 => {
                self.primary_retains.insert(ordinal, retains - 1);
                code::SUCCESS
            }
            _ => code::INVALID_CONTEXT,
        }
    }

    /// Whether `ordinal`'s primary context is active (retained).
    pub fn primary_active(&self, ordinal: usize) -> bool {
        self.primary_retains.contains_key(&ordinal)
    }

    /// cuCtxCreate: a new context, charged, pushed as current.
    pub fn create_context(&mut self, ordinal: usize) -> Result<u64, i32> {
        if !self.charge(ordinal, self.context_overhead) {
            return Err(code::OUT_OF_MEMORY);
        }
        let handle = self.handle();
        self.contexts.insert(handle, Context { device: ordinal });
        self.push_current(handle);
        Ok(handle)
    }

    /// cuCtxDestroy: forgets the context and gives its overhead back.
    pub fn destroy_context(&mut self, handle: u64) -> i32 {
        if handle & 0xffff_0000 == 0x5150_0000 {
            return code::INVALID_CONTEXT; // primary contexts are released, not destroyed
        }
        match self.contexts.remove(&handle) {
            Some(context) => {
                CONTEXT_EPOCH.fetch_add(1, Ordering::AcqRel);
                self.uncharge(context.device, self.context_overhead);
                self.with_stack(|stack| stack.retain(|&current| current != handle));
                code::SUCCESS
            }
            None => code::INVALID_CONTEXT,
        }
    }

    /// The device of context `handle`.
    pub fn context_device(&self, handle: u64) -> Result<usize, i32> {
        self.contexts
            .get(&handle)
            .map(|context| context.device)
            .ok_or(code::INVALID_CONTEXT)
    }

    /// Whether `handle` is a live context.
    pub fn context_known(&self, handle: u64) -> bool {
        self.contexts.contains_key(&handle)
    }

    /// Runs `body` on this thread's context stack. Exit handlers may call the driver after
    /// this thread's storage is gone (torch's do): the thread then has no context (the default
    /// answer), rather than a panic that would abort the program.
    fn with_stack<T: Default>(&self, body: impl FnOnce(&mut Vec<u64>) -> T) -> T {
        CONTEXT_STACK
            .try_with(|cell| {
                let mut cell = cell.borrow_mut();
                if cell.0 != self.generation {
                    *cell = (self.generation, Vec::new());
                }
                // The current context may change: drop this thread's cached device.
                let _ = CURRENT_DEVICE.try_with(|cached| cached.set((0, 0, 0)));
                body(&mut cell.1)
            })
            .unwrap_or_default()
    }

    /// This thread's current context (0 when none).
    pub fn current(&self) -> u64 {
        self.with_stack(|stack| stack.last().copied().unwrap_or(0))
    }

    /// cuCtxSetCurrent: replaces the top of the stack (0 pops it).
    pub fn set_current(&self, handle: u64) {
        self.with_stack(|stack| {
            stack.pop();
            if handle != 0 {
                stack.push(handle);
            }
        });
    }

    /// cuCtxPushCurrent.
    pub fn push_current(&self, handle: u64) {
        self.with_stack(|stack| stack.push(handle));
    }

    /// cuCtxPopCurrent: the popped context (0 when the stack was empty).
    pub fn pop_current(&self) -> u64 {
        self.with_stack(|stack| stack.pop().unwrap_or(0))
    }

    /// The device of the current context, or CUDA_ERROR_INVALID_CONTEXT.
    pub fn current_device(&self) -> Result<usize, i32> {
        self.contexts
            .get(&self.current())
            .map(|context| context.device)
            .ok_or(code::INVALID_CONTEXT)
    }

    /// Allocates `bytes` of fake device memory on `ordinal`.
    pub fn allocate(&mut self, ordinal: usize, bytes: u64) -> Result<u64, i32> {
        self.table().allocate(ordinal, bytes)
    }

    /// Frees an address [`Driver::allocate`] returned.
    pub fn free(&mut self, address: u64) -> i32 {
        match self.table().free(address) {
            Ok(_) => code::SUCCESS,
            Err(error) => error,
        }
    }

    /// cuMemCreate: a physical allocation handle of `bytes` on `ordinal`, made with the
    /// CUmemAllocationProp `properties`.
    pub fn create_physical(
        &mut self,
        ordinal: usize,
        bytes: u64,
        properties: [u8; 32],
    ) -> Result<u64, i32> {
        if bytes == 0 || bytes % GRANULARITY != 0 {
            return Err(code::INVALID_VALUE);
        }
        if !self.charge(ordinal, bytes) {
            return Err(code::OUT_OF_MEMORY);
        }
        let handle = self.handle();
        self.vmm.create(handle, ordinal, bytes, properties);
        Ok(handle)
    }

    /// What another process needs to import `handle`: its device's physical index, its size
    /// and its properties.
    pub fn export_record(&self, handle: u64) -> Option<(u32, u64, [u8; 32])> {
        let (ordinal, bytes) = self.vmm.handle_device(handle)?;
        let properties = self.vmm.properties(handle)?;
        Some((self.devices.get(ordinal)?.index, bytes, properties))
    }

    /// cuMemImportFromShareableHandle of another process's export: a handle of this process
    /// to the same memory, which that process holds and was charged for.
    pub fn import_physical(
        &mut self,
        physical_index: u32,
        bytes: u64,
        properties: [u8; 32],
    ) -> Result<u64, i32> {
        let ordinal = self
            .devices
            .iter()
            .position(|device| device.index == physical_index)
            .ok_or(code::INVALID_DEVICE)?;
        let handle = self.handle();
        self.vmm.import(handle, ordinal, bytes, properties);
        Ok(handle)
    }

    fn give_back(&mut self, freed: impl IntoIterator<Item = Freed>) {
        for freed in freed {
            self.uncharge(freed.device, freed.bytes);
        }
    }

    /// cuMemRelease: one reference fewer; uncharged when nothing holds or maps it.
    pub fn release_physical(&mut self, handle: u64) -> i32 {
        match self.vmm.release(handle) {
            Ok(freed) => {
                self.give_back(freed);
                code::SUCCESS
            }
            Err(error) => error,
        }
    }

    /// cuMemUnmap: uncharges handles that nothing holds any more.
    pub fn unmap(&mut self, address: u64, bytes: u64) -> i32 {
        match self.vmm.unmap(address, bytes) {
            Ok(freed) => {
                self.give_back(freed);
                code::SUCCESS
            }
            Err(error) => error,
        }
    }

    /// Whether `handle` is a live cuMemCreate handle.
    pub fn physical_known(&self, handle: u64) -> bool {
        self.vmm.known(handle)
    }

    /// The device allocation or mapping holding `address`.
    pub fn device_range(&self, address: u64) -> Option<DeviceRange> {
        let mapped = |(start, bytes, device)| DeviceRange {
            start,
            bytes,
            device,
            mapped: true,
        };
        let allocated = |(start, bytes, device)| DeviceRange {
            start,
            bytes,
            device,
            mapped: false,
        };
        self.vmm.range_of(address).map(mapped).or_else(|| {
            self.table
                .and_then(|table| table.range_of(address))
                .map(allocated)
        })
    }

    /// Reserves a range of fake virtual addresses (cuMemAddressReserve); nothing is charged.
    pub fn reserve_addresses(&mut self, bytes: u64) -> u64 {
        let address = self.next_reservation;
        self.next_reservation += bytes.div_ceil(GRANULARITY) * GRANULARITY;
        address
    }

    /// cuStreamCreate: a stream on the current context's device.
    pub fn create_stream(&mut self, flags: u32, priority: i32) -> Result<u64, i32> {
        let device = self.current_device()?;
        let handle = self.handle();
        self.streams.insert(
            handle,
            Stream {
                device,
                flags,
                priority,
            },
        );
        Ok(handle)
    }

    /// A stream's details (the legacy and per-thread streams are on the current context).
    pub fn stream(&self, handle: u64) -> Result<Stream, i32> {
        match handle {
            0..=2 => Ok(Stream {
                device: self.current_device()?,
                flags: 0,
                priority: 0,
            }),
            _ => self
                .streams
                .get(&handle)
                .copied()
                .ok_or(code::INVALID_HANDLE),
        }
    }

    /// cuStreamDestroy.
    pub fn destroy_stream(&mut self, handle: u64) -> i32 {
        if self.streams.remove(&handle).is_some() {
            code::SUCCESS
        } else {
            code::INVALID_HANDLE
        }
    }

    /// The device a stream works on (the legacy/per-thread streams use the current context).
    pub fn stream_device(&self, handle: u64) -> Result<usize, i32> {
        self.stream(handle).map(|stream| stream.device)
    }

    /// A memory pool handle on `ordinal` (the default pool is one per device).
    pub fn pool(&mut self, ordinal: usize, default: bool) -> u64 {
        if default {
            let handle = 0x5152_0000 + ordinal as u64 * 16;
            self.pools.insert(handle, ordinal);
            return handle;
        }
        let handle = self.handle();
        self.pools.insert(handle, ordinal);
        handle
    }

    /// The device a pool lives on.
    pub fn pool_device(&self, handle: u64) -> Result<usize, i32> {
        self.pools.get(&handle).copied().ok_or(code::INVALID_HANDLE)
    }

    /// cuMemPoolDestroy.
    pub fn destroy_pool(&mut self, handle: u64) -> i32 {
        if self.pools.remove(&handle).is_some() {
            code::SUCCESS
        } else {
            code::INVALID_HANDLE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver of its own (private physical table) with two 1 GiB devices.
    fn driver() -> Driver {
        let mut driver = Driver::fresh(process::pid(), 1000 + rand_generation());
        driver.devices = config::parse_devices("2x1GiB").unwrap();
        driver.context_overhead = 100 << 20;
        driver.attach(Physical::open(None));
        driver.initialized = true;
        driver
    }

    /// Distinct generations keep thread-local context stacks of different tests apart.
    fn rand_generation() -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    #[test]
    fn primary_context_costs_its_overhead_once_until_the_last_release() {
        let mut driver = driver();
        let context = driver.retain_primary(1).unwrap();
        assert_eq!(driver.retain_primary(1).unwrap(), context);
        assert_eq!(driver.used_bytes(1), 100 << 20);
        assert_eq!(driver.used_bytes(0), 0);
        assert_eq!(driver.release_primary(1), code::SUCCESS);
        assert_eq!(driver.used_bytes(1), 100 << 20);
        assert_eq!(driver.release_primary(1), code::SUCCESS);
        assert_eq!(driver.used_bytes(1), 0);
        assert_eq!(driver.release_primary(1), code::INVALID_CONTEXT);
    }

    #[test]
    fn allocations_need_a_current_context_and_fail_when_the_device_is_full() {
        let mut driver = driver();
        assert_eq!(driver.current_device(), Err(code::INVALID_CONTEXT));
        let context = driver.create_context(0).unwrap();
        assert_eq!(driver.current(), context);
        assert_eq!(driver.current_device(), Ok(0));
        let room = (1 << 30) - (100 << 20);
        let address = driver.allocate(0, room).unwrap();
        assert_eq!(driver.allocate(0, 1), Err(code::OUT_OF_MEMORY));
        assert_eq!(driver.allocate(0, 0), Err(code::INVALID_VALUE));
        assert_eq!(driver.free(address), code::SUCCESS);
        assert_eq!(
            driver.free(address),
            code::INVALID_VALUE,
            "a double free is refused"
        );
        assert_eq!(driver.destroy_context(context), code::SUCCESS);
        assert_eq!(driver.used_bytes(0), 0);
        assert_eq!(
            driver.current(),
            0,
            "a destroyed context is no longer current"
        );
    }

    #[test]
    fn vmm_handles_charge_at_creation_in_whole_granules() {
        let mut driver = driver();
        assert_eq!(
            driver.create_physical(0, GRANULARITY + 1, [0; 32]),
            Err(code::INVALID_VALUE)
        );
        let handle = driver.create_physical(0, 4 * GRANULARITY, [0; 32]).unwrap();
        assert!(driver.physical_known(handle));
        assert_eq!(driver.used_bytes(0), 4 * GRANULARITY);
        assert_eq!(driver.release_physical(handle), code::SUCCESS);
        assert_eq!(driver.release_physical(handle), code::INVALID_HANDLE);
        assert_eq!(driver.used_bytes(0), 0);
    }

    #[test]
    fn addresses_are_distinct_and_device_specific() {
        let mut driver = driver();
        driver.create_context(1).unwrap();
        let first = driver.allocate(1, 3).unwrap();
        let second = driver.allocate(1, 3).unwrap();
        assert_ne!(first, second);
        assert_eq!((first - ADDRESS_BASE) >> 40 & 63, 1, "device 1's window");
    }
}
