//! The per-process driver state behind the exported functions: devices, contexts, streams,
//! pools and allocations, and the fake device addresses handed out.
//!
//! One mutex guards it all; the simulator is about accounting, not speed. After `fork()` the
//! child finds a state made by another pid and starts fresh (uninitialised), since a real
//! driver's state does not survive a fork either.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::config::{self, SimDevice};
use crate::physical::Physical;

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
    /// An unknown handle (stream, pool, allocation).
    pub const INVALID_HANDLE: i32 = 400;
    /// A symbol that does not exist.
    pub const NOT_FOUND: i32 = 500;
    /// Something the simulator does not model.
    pub const NOT_SUPPORTED: i32 = 801;
}

/// Where fake device addresses start (device `d` gets its own 1 TiB window above this).
const ADDRESS_BASE: u64 = 0x7000_0000_0000;
/// The VMM granularity cuMemGetAllocationGranularity reports and cuMemCreate requires.
pub const GRANULARITY: u64 = 2 << 20;

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
    physical: Option<Physical>,
    slot: Option<usize>,
    contexts: HashMap<u64, Context>,
    primary_retains: HashMap<usize, u32>,
    next_handle: u64,
    next_address: Vec<u64>,
    allocations: HashMap<u64, (usize, u64)>,
    vmm_handles: HashMap<u64, (usize, u64)>,
    streams: HashMap<u64, usize>,
    pools: HashMap<u64, usize>,
}

static DRIVER: Mutex<Option<Driver>> = Mutex::new(None);

thread_local! {
    /// This thread's context stack (top = current) and the driver generation it belongs to.
    static CONTEXT_STACK: RefCell<(u64, Vec<u64>)> = const { RefCell::new((0, Vec::new())) };
}

/// Locks the driver state, resetting it if it was made by another process (before a fork).
pub fn lock() -> MutexGuard<'static, Option<Driver>> {
    let mut guard = DRIVER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let pid = std::process::id();
    if guard.as_ref().is_none_or(|driver| driver.pid != pid) {
        let generation = guard.as_ref().map_or(1, |driver| driver.generation + 1);
        *guard = Some(Driver::fresh(pid, generation));
    }
    guard
}

/// Runs `body` on the initialised driver, or returns CUDA_ERROR_NOT_INITIALIZED.
pub fn with_driver(body: impl FnOnce(&mut Driver) -> i32) -> i32 {
    let mut guard = lock();
    match guard.as_mut() {
        Some(driver) if driver.initialized => body(driver),
        _ => code::NOT_INITIALIZED,
    }
}

impl Driver {
    fn fresh(pid: u32, generation: u64) -> Driver {
        Driver {
            pid,
            generation,
            initialized: false,
            devices: Vec::new(),
            context_overhead: config::DEFAULT_CONTEXT_OVERHEAD,
            physical: None,
            slot: None,
            contexts: HashMap::new(),
            primary_retains: HashMap::new(),
            next_handle: 1,
            next_address: Vec::new(),
            allocations: HashMap::new(),
            vmm_handles: HashMap::new(),
            streams: HashMap::new(),
            pools: HashMap::new(),
        }
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
        self.next_address = (0..self.devices.len() as u64)
            .map(|ordinal| ADDRESS_BASE + (ordinal << 40))
            .collect();
        self.initialized = true;
        code::SUCCESS
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

    fn physical(&mut self) -> (&Physical, usize) {
        let physical = self.physical.get_or_insert_with(|| {
            Physical::open(std::env::var(config::STATE_ENV).ok().as_deref())
        });
        let slot = match self.slot {
            Some(slot) => slot,
            None => {
                let slot = physical.claim(self.pid).unwrap_or(0);
                self.slot = Some(slot);
                slot
            }
        };
        (physical, slot)
    }

    /// Physical device memory in use on `ordinal` by everyone (foreign + all live processes).
    pub fn used_bytes(&mut self, ordinal: usize) -> u64 {
        let (physical_index, foreign) = (
            self.devices[ordinal].index as usize,
            self.devices[ordinal].foreign_bytes,
        );
        let (physical, _) = self.physical();
        foreign.saturating_add(physical.used(physical_index))
    }

    /// Charges `bytes` of physical memory on `ordinal`; false if the device is full.
    fn charge(&mut self, ordinal: usize, bytes: u64) -> bool {
        let device = &self.devices[ordinal];
        let (physical_index, capacity) = (
            device.index as usize,
            device.total_bytes - device.foreign_bytes,
        );
        let (physical, slot) = self.physical();
        physical.reserve(slot, physical_index, bytes, capacity)
    }

    fn uncharge(&mut self, ordinal: usize, bytes: u64) {
        let physical_index = self.devices[ordinal].index as usize;
        let (physical, slot) = self.physical();
        physical.unreserve(slot, physical_index, bytes);
    }

    /// The handle of `ordinal`'s primary context.
    fn primary_handle(ordinal: usize) -> u64 {
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
                self.uncharge(context.device, self.context_overhead);
                self.with_stack(|stack| stack.retain(|&current| current != handle));
                code::SUCCESS
            }
            None => code::INVALID_CONTEXT,
        }
    }

    /// Whether `handle` is a live context.
    pub fn context_known(&self, handle: u64) -> bool {
        self.contexts.contains_key(&handle)
    }

    fn with_stack<T>(&self, body: impl FnOnce(&mut Vec<u64>) -> T) -> T {
        CONTEXT_STACK.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.0 != self.generation {
                *cell = (self.generation, Vec::new());
            }
            body(&mut cell.1)
        })
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
        if bytes == 0 {
            return Err(code::INVALID_VALUE);
        }
        if !self.charge(ordinal, bytes) {
            return Err(code::OUT_OF_MEMORY);
        }
        let address = self.next_address[ordinal];
        self.next_address[ordinal] += bytes.div_ceil(GRANULARITY) * GRANULARITY;
        self.allocations.insert(address, (ordinal, bytes));
        Ok(address)
    }

    /// Frees an address [`Driver::allocate`] returned.
    pub fn free(&mut self, address: u64) -> i32 {
        match self.allocations.remove(&address) {
            Some((ordinal, bytes)) => {
                self.uncharge(ordinal, bytes);
                code::SUCCESS
            }
            None => code::INVALID_VALUE,
        }
    }

    /// cuMemCreate: a physical allocation handle of `bytes` on `ordinal`.
    pub fn create_physical(&mut self, ordinal: usize, bytes: u64) -> Result<u64, i32> {
        if bytes == 0 || bytes % GRANULARITY != 0 {
            return Err(code::INVALID_VALUE);
        }
        if !self.charge(ordinal, bytes) {
            return Err(code::OUT_OF_MEMORY);
        }
        let handle = self.handle();
        self.vmm_handles.insert(handle, (ordinal, bytes));
        Ok(handle)
    }

    /// cuMemRelease.
    pub fn release_physical(&mut self, handle: u64) -> i32 {
        match self.vmm_handles.remove(&handle) {
            Some((ordinal, bytes)) => {
                self.uncharge(ordinal, bytes);
                code::SUCCESS
            }
            None => code::INVALID_HANDLE,
        }
    }

    /// Whether `handle` is a live cuMemCreate handle.
    pub fn physical_known(&self, handle: u64) -> bool {
        self.vmm_handles.contains_key(&handle)
    }

    /// Reserves a range of fake virtual addresses (cuMemAddressReserve); nothing is charged.
    pub fn reserve_addresses(&mut self, bytes: u64) -> u64 {
        let ordinal = self.next_address.len() - 1;
        let address = self.next_address[ordinal] + (1 << 39);
        self.next_address[ordinal] += bytes.div_ceil(GRANULARITY) * GRANULARITY;
        address
    }

    /// cuStreamCreate: a stream on the current context's device.
    pub fn create_stream(&mut self) -> Result<u64, i32> {
        let device = self.current_device()?;
        let handle = self.handle();
        self.streams.insert(handle, device);
        Ok(handle)
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
        match handle {
            0..=2 => self.current_device(),
            _ => self
                .streams
                .get(&handle)
                .copied()
                .ok_or(code::INVALID_HANDLE),
        }
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
        let mut driver = Driver::fresh(std::process::id(), 1000 + rand_generation());
        driver.devices = config::parse_devices("2x1GiB").unwrap();
        driver.next_address = vec![ADDRESS_BASE, ADDRESS_BASE + (1 << 40)];
        driver.context_overhead = 100 << 20;
        driver.physical = Some(Physical::open(None));
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
            driver.create_physical(0, GRANULARITY + 1),
            Err(code::INVALID_VALUE)
        );
        let handle = driver.create_physical(0, 4 * GRANULARITY).unwrap();
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
        assert!(first >= ADDRESS_BASE + (1 << 40), "device 1's window");
    }
}
