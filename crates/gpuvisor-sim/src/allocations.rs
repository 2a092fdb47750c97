//! The hot path of `cuMemAlloc_v2` / `cuMemFree_v2`: the fake addresses handed out, and the
//! physical charge for them, without the driver lock and without system calls.
//!
//! The table is split into [`SHARDS`] shards, each behind its own small lock; a thread
//! allocates from its own shard (threads are spread round-robin), so threads rarely meet.
//! The shard and the device are written into the address itself, so a free goes straight to
//! the right shard whichever thread calls it. Freed addresses are kept per (device, size in
//! granules) and handed out again first, as a real driver's caching allocator does; this
//! also keeps the address space bounded however many allocations a process makes.
//!
//! Address layout: `ADDRESS_BASE + shard << 46 + device << 40 + offset`, so every (shard,
//! device) pair owns a 1 TiB window; the window above the last shard holds reservations
//! (`cuMemAddressReserve`).

use std::cell::{Cell, UnsafeCell};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::config::MAX_DEVICES;
use crate::driver::code;
use crate::physical::Physical;

/// Where fake device addresses start.
pub const ADDRESS_BASE: u64 = 0x7000_0000_0000;
/// Shards of the table (a power of two).
pub const SHARDS: usize = 16;
/// The VMM granularity: allocations take whole granules of address space.
pub const GRANULARITY: u64 = 2 << 20;
const DEVICE_SHIFT: u32 = 40;
const SHARD_SHIFT: u32 = 46;
/// Address space per (shard, device): larger than any device's memory.
const WINDOW: u64 = 1 << DEVICE_SHIFT;
/// Where `cuMemAddressReserve` ranges start (above every shard's windows).
pub const RESERVATION_BASE: u64 = ADDRESS_BASE + ((SHARDS as u64) << SHARD_SHIFT);

/// A device as the table charges it.
#[derive(Debug, Clone, Copy)]
pub struct DeviceAccount {
    /// Index of the physical device (in the state file).
    pub physical_index: usize,
    /// What processes may hold on it: its total minus foreign use.
    pub capacity_bytes: u64,
}

/// A live allocation.
#[derive(Debug, Clone, Copy)]
struct Live {
    device: usize,
    bytes: u64,
    granules: u64,
    /// Charged to a memory pool's reserve, not to the device directly.
    pooled: bool,
}

/// Hashes addresses and free-list keys, whose low 21 bits are mostly zero. SipHash (the
/// std default) is DoS-resistant, which fake addresses do not need, and was the simulator's
/// largest single cost.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u64(&mut self, value: u64) {
        // Fold the granule index down, then multiply: hashbrown takes the bucket from the low
        // bits and a tag from the top 7, and both now depend on the granule index.
        self.0 = (self.0 ^ value ^ (value >> 21)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

type FastMap<V> = HashMap<u64, V, BuildHasherDefault<AddressHasher>>;

/// One shard's state.
#[derive(Default)]
struct ShardState {
    live: FastMap<Live>,
    /// Freed addresses by `granules << 6 | device`.
    free: FastMap<Vec<u64>>,
    /// Next never-used offset per device.
    bump: Vec<u64>,
}

/// A shard: its state behind a spin lock, on its own cache lines.
#[repr(align(128))]
struct Shard {
    busy: AtomicBool,
    state: UnsafeCell<Option<ShardState>>,
}

// SAFETY: `state` is only reached through `Shard::lock`, which gives one thread at a time.
unsafe impl Sync for Shard {}

struct ShardGuard<'a> {
    shard: &'a Shard,
}

impl Shard {
    fn lock(&self) -> ShardGuard<'_> {
        let mut spins = 0u32;
        while self
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // Critical sections are a few hundred instructions; yield if the holder was
            // preempted (threads may outnumber cores).
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        ShardGuard { shard: self }
    }
}

impl ShardGuard<'_> {
    fn state(&mut self) -> &mut ShardState {
        // SAFETY: this guard holds the shard's lock, so no other reference to the state exists.
        unsafe { &mut *self.shard.state.get() }.get_or_insert_with(ShardState::default)
    }
}

impl Drop for ShardGuard<'_> {
    fn drop(&mut self) {
        self.shard.busy.store(false, Ordering::Release);
    }
}

thread_local! {
    /// This thread's shard (usize::MAX until its first allocation).
    static HOME_SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

/// This thread's shard (shard 0 during thread teardown, when its storage is gone).
fn home_shard() -> usize {
    HOME_SHARD
        .try_with(|home| {
            let shard = home.get();
            if shard != usize::MAX {
                return shard;
            }
            let shard = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
            home.set(shard);
            shard
        })
        .unwrap_or(0)
}

/// The allocation table of one initialised driver (one process, one generation).
pub struct Allocations {
    /// The driver generation this table belongs to.
    pub generation: u64,
    /// Physical accounting, and this process's slot in it.
    pub physical: Physical,
    /// This process's slot.
    pub slot: usize,
    /// The visible devices, by ordinal.
    pub devices: Box<[DeviceAccount]>,
    shards: [Shard; SHARDS],
}

impl Allocations {
    /// An empty table for `devices` (at most [`MAX_DEVICES`]).
    pub fn new(
        generation: u64,
        physical: Physical,
        slot: usize,
        devices: Box<[DeviceAccount]>,
    ) -> Allocations {
        assert!(devices.len() <= MAX_DEVICES);
        Allocations {
            generation,
            physical,
            slot,
            devices,
            shards: std::array::from_fn(|_| Shard {
                busy: AtomicBool::new(false),
                state: UnsafeCell::new(None),
            }),
        }
    }

    /// Charges `bytes` of physical memory on `ordinal`; false when the device is full.
    pub fn charge(&self, ordinal: usize, bytes: u64) -> bool {
        let device = self.devices[ordinal];
        self.physical.reserve(
            self.slot,
            device.physical_index,
            bytes,
            device.capacity_bytes,
        )
    }

    /// Gives back `bytes` on `ordinal`.
    pub fn uncharge(&self, ordinal: usize, bytes: u64) {
        self.physical
            .unreserve(self.slot, self.devices[ordinal].physical_index, bytes);
    }

    /// Physical memory in use on `ordinal` by every live process (foreign use excluded).
    pub fn used_bytes(&self, ordinal: usize) -> u64 {
        self.physical.used(self.devices[ordinal].physical_index)
    }

    /// cuMemAlloc: charges `bytes` on `ordinal` and returns a fake address for them.
    pub fn allocate(&self, ordinal: usize, bytes: u64) -> Result<u64, i32> {
        self.allocate_as(ordinal, bytes, false)
    }

    /// A fake address for `bytes` a memory pool already holds (nothing charged here).
    pub fn allocate_pooled(&self, ordinal: usize, bytes: u64) -> Result<u64, i32> {
        self.allocate_as(ordinal, bytes, true)
    }

    fn allocate_as(&self, ordinal: usize, bytes: u64, pooled: bool) -> Result<u64, i32> {
        if bytes == 0 {
            return Err(code::INVALID_VALUE);
        }
        if ordinal >= self.devices.len() {
            return Err(code::INVALID_DEVICE);
        }
        if !pooled && !self.charge(ordinal, bytes) {
            return Err(code::OUT_OF_MEMORY);
        }
        let granules = bytes.div_ceil(GRANULARITY);
        let shard = home_shard();
        let mut guard = self.shards[shard].lock();
        let state = guard.state();
        let reused = state
            .free
            .get_mut(&(granules << 6 | ordinal as u64))
            .and_then(Vec::pop);
        let address = match reused {
            Some(address) => address,
            None => {
                if state.bump.len() <= ordinal {
                    state.bump.resize(ordinal + 1, 0);
                }
                let offset = state.bump[ordinal];
                let span = granules.saturating_mul(GRANULARITY);
                if span > WINDOW - offset {
                    // Only after more than 1 TiB of distinct live sizes in one thread.
                    drop(guard);
                    if !pooled {
                        self.uncharge(ordinal, bytes);
                    }
                    return Err(code::OUT_OF_MEMORY);
                }
                state.bump[ordinal] = offset + span;
                ADDRESS_BASE
                    + ((shard as u64) << SHARD_SHIFT)
                    + ((ordinal as u64) << DEVICE_SHIFT)
                    + offset
            }
        };
        let live = Live {
            device: ordinal,
            bytes,
            granules,
            pooled,
        };
        state.live.insert(address, live);
        Ok(address)
    }

    /// The live allocation holding `address` (any byte of it): (base, bytes, device).
    /// Allocations start on a granule, so this looks at each granule start below `address`.
    pub fn range_of(&self, address: u64) -> Option<(u64, u64, usize)> {
        let offset = address.checked_sub(ADDRESS_BASE)?;
        let shard = (offset >> SHARD_SHIFT) as usize;
        if shard >= SHARDS {
            return None;
        }
        let window_start = ADDRESS_BASE + ((offset >> DEVICE_SHIFT) << DEVICE_SHIFT);
        let device = ((offset >> DEVICE_SHIFT) & 63) as usize;
        let mut guard = self.shards[shard].lock();
        let state = guard.state();
        // Nothing was ever handed out at or above the window's bump offset.
        if address - window_start >= state.bump.get(device).copied().unwrap_or(0) {
            return None;
        }
        let mut base = address - (address - ADDRESS_BASE) % GRANULARITY;
        loop {
            if let Some(live) = state.live.get(&base) {
                return (address < base + live.bytes.max(1)).then_some((
                    base,
                    live.bytes,
                    live.device,
                ));
            }
            if base < window_start + GRANULARITY {
                return None;
            }
            base -= GRANULARITY;
        }
    }

    /// cuMemFree: takes `address` back and uncharges it; INVALID_VALUE when it is not live.
    /// A pooled allocation is not uncharged: its (device, bytes) are returned for its pool.
    pub fn free(&self, address: u64) -> Result<Option<(usize, u64)>, i32> {
        let Some(shard) = address
            .checked_sub(ADDRESS_BASE)
            .map(|offset| (offset >> SHARD_SHIFT) as usize)
            .filter(|&shard| shard < SHARDS)
        else {
            return Err(code::INVALID_VALUE);
        };
        let live = {
            let mut guard = self.shards[shard].lock();
            let state = guard.state();
            let Some(live) = state.live.remove(&address) else {
                return Err(code::INVALID_VALUE);
            };
            state
                .free
                .entry(live.granules << 6 | live.device as u64)
                .or_default()
                .push(address);
            live
        };
        if live.pooled {
            return Ok(Some((live.device, live.bytes)));
        }
        self.uncharge(live.device, live.bytes);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Allocations {
        let physical = Physical::open(None);
        let slot = physical.claim(crate::process::pid()).unwrap();
        let device = DeviceAccount {
            physical_index: 0,
            capacity_bytes: 1 << 30,
        };
        Allocations::new(1, physical, slot, vec![device, device].into_boxed_slice())
    }

    #[test]
    fn freed_addresses_are_reused_for_the_same_size_and_device_only() {
        let table = table();
        let first = table.allocate(0, 3 << 20).unwrap();
        assert_eq!(table.free(first), Ok(None));
        assert_eq!(table.allocate(0, 4 << 20).unwrap(), first, "same granules");
        let other_size = table.allocate(0, 1).unwrap();
        let other_device = table.allocate(1, 4 << 20).unwrap();
        assert_ne!(other_size, first);
        assert_ne!(other_device, first);
        assert_eq!((other_device - ADDRESS_BASE) >> DEVICE_SHIFT & 63, 1);
        assert_eq!(table.used_bytes(0), (4 << 20) + 1 + (4 << 20));
    }

    #[test]
    fn free_refuses_unknown_and_double_frees_and_uncharges_exactly() {
        let table = table();
        let address = table.allocate(0, 5).unwrap();
        assert_eq!(table.free(address + 1), Err(code::INVALID_VALUE));
        assert_eq!(table.free(0), Err(code::INVALID_VALUE));
        assert_eq!(table.free(u64::MAX), Err(code::INVALID_VALUE));
        assert_eq!(table.free(address), Ok(None));
        assert_eq!(table.free(address), Err(code::INVALID_VALUE));
        assert_eq!(table.used_bytes(0), 0);
    }

    #[test]
    fn threads_allocate_from_their_own_shards_and_free_each_others() {
        let table = table();
        let addresses: Vec<u64> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        for _ in 0..1000 {
                            let address = table.allocate(0, 1 << 20).unwrap();
                            assert_eq!(table.free(address), Ok(None));
                        }
                        table.allocate(0, 1 << 20).unwrap()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let mut distinct = addresses.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 4, "live addresses are unique");
        assert_eq!(table.used_bytes(0), 4 << 20);
        // Free from another thread than the one that allocated.
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for address in &addresses {
                    assert_eq!(table.free(*address), Ok(None));
                }
            });
        });
        assert_eq!(table.used_bytes(0), 0);
    }
}
