//! A consistent-enough copy of the whole ledger for the supervisor (`top`, metrics, reports).
//! Each counter is read atomically; the snapshot as a whole is not one instant, which is fine
//! for display every 100-500 ms.

use std::sync::atomic::Ordering;

use crate::events::Event;
use crate::layout::*;
use crate::ledger::{DeviceInfo, Ledger};

/// Usage of one budget group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupUsage {
    /// Group index (what `GPUVISOR_GROUP` names).
    pub index: u32,
    /// Group name.
    pub name: String,
    /// Limit for the whole group per device ([`NO_LIMIT`] = none).
    pub limit_bytes: Vec<u64>,
    /// Limit per process per device ([`NO_LIMIT`] = none).
    pub per_process_limit_bytes: Vec<u64>,
    /// Bytes charged per device.
    pub used_bytes: Vec<u64>,
    /// Highest charge seen per device.
    pub peak_bytes: Vec<u64>,
    /// Policy: every process is CPU-only.
    pub cpu_only: bool,
    /// Policy: descendants of the root process are CPU-only.
    pub children_cpu_only: bool,
    /// Allocations refused.
    pub denied_count: u64,
}

/// Usage of one registered process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessUsage {
    /// Slot index.
    pub slot: u32,
    /// Process id.
    pub pid: i32,
    /// Start time (field 22 of /proc/PID/stat).
    pub start_time: u64,
    /// Process name (`comm`).
    pub name: String,
    /// Budget group.
    pub group: u32,
    /// Bytes charged per device.
    pub used_bytes: Vec<u64>,
    /// Highest charge per device.
    pub peak_bytes: Vec<u64>,
    /// Contexts created or primary contexts retained.
    pub contexts: u64,
    /// Tried to use CUDA while CPU-only.
    pub cpu_only_violation: bool,
    /// Allocations refused.
    pub denied_count: u64,
    /// Allocations not tracked for freeing (pointer table full).
    pub untracked_count: u64,
    /// The process has exited (its charges went back to its group; this is its record).
    pub exited: bool,
    /// The process found the ledger damaged and stopped enforcing its budget.
    pub failed_open: bool,
    /// The slot's owner word when read (opaque; [`Ledger::release_exited`] frees only the
    /// record that was read).
    pub claim: u64,
}

/// Everything in the ledger at (about) one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The device table.
    pub devices: Vec<DeviceInfo>,
    /// Every group.
    pub groups: Vec<GroupUsage>,
    /// Every live registered process.
    pub processes: Vec<ProcessUsage>,
    /// Events still in the ring, oldest first.
    pub events: Vec<Event>,
    /// Sequence number of the next event.
    pub next_event_seq: u64,
    /// Events overwritten before this snapshot (`next_event_seq - events.len()` at most).
    pub events_lost: u64,
    /// Times a counter would have gone below zero and was clamped.
    pub underflow_repairs: u64,
    /// Allocations shims could not track for freeing.
    pub untracked_allocations: u64,
}

fn load_all(counters: &[std::sync::atomic::AtomicU64], n: usize) -> Vec<u64> {
    counters[..n]
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect()
}

/// One group's usage, the most on any one device: what the supervisor samples every tick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupTotals {
    /// Bytes charged, the most on any one device.
    pub used_bytes: u64,
    /// Highest charge seen, the most on any one device.
    pub peak_bytes: u64,
    /// Allocations refused.
    pub denied_count: u64,
}

impl Ledger {
    /// `group`'s totals (all zero for an unknown group): a few atomic loads, where
    /// [`Ledger::snapshot`] also copies every slot and event (too much every 100 ms).
    pub fn group_totals(&self, group: u32) -> GroupTotals {
        if group >= self.group_count {
            return GroupTotals::default();
        }
        let n = self.device_count as usize;
        let g = self.group(group as usize);
        let most = |counters: &[std::sync::atomic::AtomicU64]| {
            counters[..n]
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .max()
                .unwrap_or(0)
        };
        GroupTotals {
            used_bytes: most(&g.used_bytes),
            peak_bytes: most(&g.peak_bytes),
            denied_count: g.denied_count.load(Ordering::Relaxed),
        }
    }

    /// Reads the whole ledger.
    pub fn snapshot(&self) -> Snapshot {
        let n = self.device_count as usize;
        let groups = (0..self.group_count)
            .map(|i| {
                let g = self.group(i as usize);
                let flags = g.flags.load(Ordering::Relaxed);
                GroupUsage {
                    index: i,
                    name: text_from_padded(&g.name),
                    limit_bytes: load_all(&g.limit_bytes, n),
                    per_process_limit_bytes: load_all(&g.per_process_limit_bytes, n),
                    used_bytes: load_all(&g.used_bytes, n),
                    peak_bytes: load_all(&g.peak_bytes, n),
                    cpu_only: flags & GROUP_FLAG_CPU_ONLY != 0,
                    children_cpu_only: flags & GROUP_FLAG_CHILDREN_CPU_ONLY != 0,
                    denied_count: g.denied_count.load(Ordering::Relaxed),
                }
            })
            .collect();
        let processes = self.processes_in(&[SLOT_STATE_LIVE]);
        let batch = self.events_since(0);
        let h = self.header();
        Snapshot {
            devices: self.devices(),
            groups,
            processes,
            events: batch.events,
            next_event_seq: batch.next_seq,
            events_lost: batch.lost,
            underflow_repairs: h.underflow_repairs.load(Ordering::Relaxed),
            untracked_allocations: h.untracked_allocations.load(Ordering::Relaxed),
        }
    }

    /// Records of processes that have exited since their slot was last released (see
    /// [`SLOT_STATE_EXITED`]): read them, then free their slots with
    /// [`Ledger::release_exited`]. Together with [`Snapshot::processes`] read just before, every
    /// process that ever registered is seen once, however briefly it lived.
    pub fn exited_processes(&self) -> Vec<ProcessUsage> {
        self.processes_in(&[SLOT_STATE_EXITED])
    }

    /// Records of exited processes overwritten by new ones before they were read.
    pub fn exited_overwritten(&self) -> u64 {
        self.header().exited_overwritten.load(Ordering::Relaxed)
    }

    /// Allocations refused in every group together: exact, unlike a count of the events read
    /// (the ring keeps only the latest [`crate::CreateOptions::event_capacity`]).
    pub fn denied_total(&self) -> u64 {
        (0..self.group_count as usize)
            .map(|i| self.group(i).denied_count.load(Ordering::Relaxed))
            .fold(0u64, u64::saturating_add)
    }

    fn processes_in(&self, states: &[u64]) -> Vec<ProcessUsage> {
        let n = self.device_count as usize;
        (0..self.slot_count as usize)
            .filter_map(|i| {
                let (owner, pid) = self.slot_owner(i);
                if owner == SLOT_FREE || !states.contains(&crate::account::owner_state(owner)) {
                    return None;
                }
                let s = self.slot(i);
                let name: Vec<u64> = s.name.iter().map(|w| w.load(Ordering::Relaxed)).collect();
                Some(ProcessUsage {
                    slot: i as u32,
                    pid,
                    start_time: s.start_time.load(Ordering::Relaxed),
                    name: unpack_words(&name),
                    group: s.group.load(Ordering::Relaxed),
                    used_bytes: load_all(&s.used_bytes, n),
                    peak_bytes: load_all(&s.peak_bytes, n),
                    contexts: s.contexts.load(Ordering::Relaxed),
                    cpu_only_violation: s.flags.load(Ordering::Relaxed)
                        & SLOT_FLAG_CPU_ONLY_VIOLATION
                        != 0,
                    denied_count: s.denied_count.load(Ordering::Relaxed),
                    untracked_count: s.untracked_count.load(Ordering::Relaxed),
                    exited: crate::account::owner_state(owner) == SLOT_STATE_EXITED,
                    failed_open: s.flags.load(Ordering::Relaxed) & SLOT_FLAG_FAILED_OPEN != 0,
                    claim: owner,
                })
            })
            .collect()
    }
}
