//! The virtual memory management API's state: physical allocation handles (`cuMemCreate`)
//! with the reference counts the real driver keeps, and the address ranges mapped onto them.
//!
//! A handle's memory goes away only when its last reference is released (`cuMemRelease`
//! matches `cuMemCreate` and each `cuMemRetainAllocationHandle`) *and* its last mapping is
//! unmapped: NCCL's buffer registration and PyTorch's expandable segments retain and release
//! live memory, and NCCL releases both its retain and its create.

use std::collections::{BTreeMap, HashMap};

use crate::driver::code;

/// A physical allocation.
struct Handle {
    device: usize,
    bytes: u64,
    /// cuMemCreate's reference plus one per retain, minus releases.
    references: u32,
    /// Live mappings of it.
    mappings: u32,
    /// The CUmemAllocationProp it was made with (32 bytes), for
    /// cuMemGetAllocationPropertiesFromHandle.
    properties: [u8; 32],
    /// Imported from another process's export: that process holds (and was charged) the
    /// memory, so nothing is given back here when it goes.
    imported: bool,
}

/// A mapped range.
#[derive(Clone, Copy)]
struct Mapping {
    bytes: u64,
    handle: u64,
}

/// Physical memory that went away: uncharge `bytes` on `device`.
#[derive(Debug, PartialEq, Eq)]
pub struct Freed {
    /// The device ordinal.
    pub device: usize,
    /// Bytes to give back.
    pub bytes: u64,
}

/// The VMM state of one process.
#[derive(Default)]
pub struct Vmm {
    handles: HashMap<u64, Handle>,
    /// Mapped ranges by start address.
    mappings: BTreeMap<u64, Mapping>,
}

impl Vmm {
    /// Records a new handle (its memory already charged).
    pub fn create(&mut self, handle: u64, device: usize, bytes: u64, properties: [u8; 32]) {
        self.handles.insert(
            handle,
            Handle {
                device,
                bytes,
                references: 1,
                mappings: 0,
                properties,
                imported: false,
            },
        );
    }

    /// Records a handle imported from another process (its memory charged there).
    pub fn import(&mut self, handle: u64, device: usize, bytes: u64, properties: [u8; 32]) {
        self.create(handle, device, bytes, properties);
        if let Some(known) = self.handles.get_mut(&handle) {
            known.imported = true;
        }
    }

    /// Whether `handle` is a live handle someone still holds.
    pub fn known(&self, handle: u64) -> bool {
        self.handles
            .get(&handle)
            .is_some_and(|known| known.references > 0)
    }

    /// The device and size of a live handle.
    pub fn handle_device(&self, handle: u64) -> Option<(usize, u64)> {
        self.handles
            .get(&handle)
            .map(|known| (known.device, known.bytes))
    }

    /// The properties a handle was created with.
    pub fn properties(&self, handle: u64) -> Option<[u8; 32]> {
        self.handles
            .get(&handle)
            .filter(|known| known.references > 0)
            .map(|known| known.properties)
    }

    /// Drops `handle` if nothing references or maps it any more.
    fn collect(&mut self, handle: u64) -> Option<Freed> {
        let known = self.handles.get(&handle)?;
        if known.references > 0 || known.mappings > 0 {
            return None;
        }
        let known = self.handles.remove(&handle)?;
        if known.imported {
            return None;
        }
        Some(Freed {
            device: known.device,
            bytes: known.bytes,
        })
    }

    /// cuMemRelease: one reference fewer; the memory goes when nothing holds it.
    pub fn release(&mut self, handle: u64) -> Result<Option<Freed>, i32> {
        match self.handles.get_mut(&handle) {
            Some(known) if known.references > 0 => {
                known.references -= 1;
                Ok(self.collect(handle))
            }
            _ => Err(code::INVALID_HANDLE),
        }
    }

    /// cuMemRetainAllocationHandle: the handle mapped at `address`, one reference more.
    pub fn retain_at(&mut self, address: u64) -> Result<u64, i32> {
        let (_, mapping) = self.mapping_at(address).ok_or(code::INVALID_VALUE)?;
        let known = self
            .handles
            .get_mut(&mapping.handle)
            .ok_or(code::INVALID_VALUE)?;
        known.references += 1;
        Ok(mapping.handle)
    }

    /// One reference more on a live handle (an import of it).
    pub fn retain_handle(&mut self, handle: u64) -> Result<(), i32> {
        match self.handles.get_mut(&handle) {
            Some(known) if known.references > 0 => {
                known.references += 1;
                Ok(())
            }
            _ => Err(code::INVALID_HANDLE),
        }
    }

    /// cuMemMap: maps `bytes` at `address` onto a live handle.
    pub fn map(&mut self, address: u64, bytes: u64, handle: u64) -> i32 {
        if bytes == 0 || self.overlaps(address, bytes) {
            return code::INVALID_VALUE;
        }
        match self.handles.get_mut(&handle) {
            Some(known) if known.references > 0 => {
                known.mappings += 1;
                self.mappings.insert(address, Mapping { bytes, handle });
                code::SUCCESS
            }
            _ => code::INVALID_HANDLE,
        }
    }

    /// cuMemUnmap: unmaps every mapping inside `[address, address + bytes)`; returns the
    /// memory that went away with them.
    pub fn unmap(&mut self, address: u64, bytes: u64) -> Result<Vec<Freed>, i32> {
        let end = address.saturating_add(bytes);
        let starts: Vec<u64> = self
            .mappings
            .range(address..end)
            .map(|(&start, _)| start)
            .collect();
        if starts.is_empty() {
            return Err(code::INVALID_VALUE);
        }
        let mut freed = Vec::new();
        for start in starts {
            let Some(mapping) = self.mappings.remove(&start) else {
                continue;
            };
            if let Some(known) = self.handles.get_mut(&mapping.handle) {
                known.mappings = known.mappings.saturating_sub(1);
            }
            freed.extend(self.collect(mapping.handle));
        }
        Ok(freed)
    }

    fn overlaps(&self, address: u64, bytes: u64) -> bool {
        let end = address.saturating_add(bytes);
        self.mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&start, mapping)| start + mapping.bytes > address)
    }

    fn mapping_at(&self, address: u64) -> Option<(u64, Mapping)> {
        self.mappings
            .range(..=address)
            .next_back()
            .filter(|(&start, mapping)| address < start + mapping.bytes)
            .map(|(&start, mapping)| (start, *mapping))
    }

    /// The mapped range holding `address`: (start, bytes, device).
    pub fn range_of(&self, address: u64) -> Option<(u64, u64, usize)> {
        let (start, mapping) = self.mapping_at(address)?;
        let device = self.handles.get(&mapping.handle)?.device;
        Some((start, mapping.bytes, device))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB2: u64 = 2 << 20;

    #[test]
    fn memory_goes_with_the_last_reference_and_the_last_mapping() {
        let mut vmm = Vmm::default();
        vmm.create(7, 0, 2 * MIB2, [0; 32]);
        assert_eq!(vmm.map(0x1000_0000, 2 * MIB2, 7), code::SUCCESS);
        assert_eq!(
            vmm.retain_at(0x1000_0000 + 5).unwrap(),
            7,
            "the same handle value"
        );
        assert_eq!(vmm.release(7), Ok(None), "the retain still holds it");
        assert_eq!(vmm.release(7), Ok(None), "still mapped");
        assert_eq!(
            vmm.release(7),
            Err(code::INVALID_HANDLE),
            "no reference left"
        );
        assert_eq!(
            vmm.unmap(0x1000_0000, 2 * MIB2),
            Ok(vec![Freed {
                device: 0,
                bytes: 2 * MIB2
            }])
        );
        assert!(!vmm.known(7));
    }

    #[test]
    fn ranges_and_overlaps() {
        let mut vmm = Vmm::default();
        vmm.create(1, 1, MIB2, [0; 32]);
        assert_eq!(vmm.map(0x2000_0000, MIB2, 1), code::SUCCESS);
        assert_eq!(vmm.map(0x2000_0000 + 4096, MIB2, 1), code::INVALID_VALUE);
        assert_eq!(vmm.range_of(0x2000_0000 + 10), Some((0x2000_0000, MIB2, 1)));
        assert_eq!(vmm.range_of(0x2000_0000 + MIB2), None);
        assert_eq!(vmm.unmap(0x3000_0000, MIB2), Err(code::INVALID_VALUE));
        assert_eq!(vmm.release(1), Ok(None), "still mapped");
        assert_eq!(vmm.unmap(0x2000_0000, MIB2).unwrap().len(), 1);
    }
}
