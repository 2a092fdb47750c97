//! The event ring: refused allocations and CPU-only violations, bounded, oldest overwritten.
//!
//! Writers take a sequence number with one `fetch_add` and write entry `seq % capacity` as a
//! seqlock (stamp 0 while writing, `seq + 1` when done). Readers keep the next sequence number
//! they expect; a gap between it and the oldest entry still in the ring is reported as lost.

use std::sync::atomic::{fence, Ordering};

use crate::account::{Denial, LimitKind, SlotId};
use crate::layout::*;
use crate::ledger::Ledger;

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// An allocation was refused with `CUDA_ERROR_OUT_OF_MEMORY`.
    AllocationDenied {
        /// Ledger device index.
        device: u32,
        /// Bytes requested.
        size_bytes: u64,
        /// Bytes in use (process or group, per `limit_kind`) when refused.
        used_bytes: u64,
        /// The limit that refused it.
        limit_bytes: u64,
        /// Which limit.
        limit_kind: LimitKind,
    },
    /// A CPU-only process tried to initialise CUDA or create a context.
    CpuOnlyViolation {
        /// Its executable (`/proc/self/exe`), possibly truncated to 128 bytes.
        executable: String,
    },
}

/// One entry of the event ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Sequence number (0, 1, 2, ... over the life of the ledger).
    pub seq: u64,
    /// When, nanoseconds since the Unix epoch.
    pub time_unix_ns: u64,
    /// The process.
    pub pid: i32,
    /// Its budget group.
    pub group: u32,
    /// What happened.
    pub kind: EventKind,
}

/// Events read from the ring since some sequence number.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventBatch {
    /// The events, oldest first.
    pub events: Vec<Event>,
    /// Sequence number to pass next time.
    pub next_seq: u64,
    /// Events between the requested sequence number and `next_seq` that were overwritten (or
    /// being rewritten) before they could be read.
    pub lost: u64,
}

fn now_unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl Ledger {
    fn write_event(&self, fill: impl FnOnce(&EventRecord)) -> u64 {
        let seq = self.header().event_next_seq.fetch_add(1, Ordering::AcqRel);
        let rec = self.event((seq % self.event_capacity as u64) as usize);
        rec.stamp.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        fill(rec);
        rec.stamp.store(seq + 1, Ordering::Release);
        seq
    }

    /// Records a refused allocation (and counts it in the slot and group). Returns its sequence
    /// number.
    pub fn record_denial(
        &self,
        slot: SlotId,
        pid: i32,
        device: usize,
        size_bytes: u64,
        denial: &Denial,
    ) -> u64 {
        self.slot(slot.index as usize)
            .denied_count
            .fetch_add(1, Ordering::Relaxed);
        if slot.group < self.group_count {
            self.group(slot.group as usize)
                .denied_count
                .fetch_add(1, Ordering::Relaxed);
        }
        let time = now_unix_ns();
        self.write_event(|rec| {
            rec.kind.store(EVENT_DENIED, Ordering::Relaxed);
            rec.pid.store(pid as u32, Ordering::Relaxed);
            rec.group.store(slot.group, Ordering::Relaxed);
            rec.device.store(device as u32, Ordering::Relaxed);
            let kind = match denial.limit_kind {
                LimitKind::Process => 0,
                LimitKind::Group => 1,
            };
            rec.limit_kind.store(kind, Ordering::Relaxed);
            rec.time_unix_ns.store(time, Ordering::Relaxed);
            rec.size_bytes.store(size_bytes, Ordering::Relaxed);
            rec.used_bytes.store(denial.used_bytes, Ordering::Relaxed);
            rec.limit_bytes.store(denial.limit_bytes, Ordering::Relaxed);
            for w in &rec.exe {
                w.store(0, Ordering::Relaxed);
            }
        })
    }

    /// Records that a CPU-only process tried to use CUDA, and flags its slot if it has one.
    /// Returns the event's sequence number.
    pub fn record_cpu_only_violation(
        &self,
        slot: Option<SlotId>,
        group: u32,
        pid: i32,
        executable: &[u8],
    ) -> u64 {
        if let Some(slot) = slot {
            self.slot(slot.index as usize)
                .flags
                .fetch_or(SLOT_FLAG_CPU_ONLY_VIOLATION, Ordering::Relaxed);
        }
        let time = now_unix_ns();
        let exe: [u64; EVENT_EXE_LEN / 8] = pack_words(executable);
        self.write_event(|rec| {
            rec.kind.store(EVENT_CPU_ONLY_VIOLATION, Ordering::Relaxed);
            rec.pid.store(pid as u32, Ordering::Relaxed);
            rec.group.store(group, Ordering::Relaxed);
            rec.device.store(0, Ordering::Relaxed);
            rec.limit_kind.store(0, Ordering::Relaxed);
            rec.time_unix_ns.store(time, Ordering::Relaxed);
            rec.size_bytes.store(0, Ordering::Relaxed);
            rec.used_bytes.store(0, Ordering::Relaxed);
            rec.limit_bytes.store(0, Ordering::Relaxed);
            for (dst, src) in rec.exe.iter().zip(exe) {
                dst.store(src, Ordering::Relaxed);
            }
        })
    }

    /// Sequence number the next event will get.
    pub fn next_event_seq(&self) -> u64 {
        self.header().event_next_seq.load(Ordering::Acquire)
    }

    /// Events with sequence number `>= since`, oldest first (pass the previous batch's
    /// `next_seq` to read incrementally).
    pub fn events_since(&self, since: u64) -> EventBatch {
        let next = self.next_event_seq();
        let capacity = self.event_capacity as u64;
        let oldest = next.saturating_sub(capacity).max(since.min(next));
        let mut batch = EventBatch {
            events: Vec::new(),
            next_seq: next,
            lost: oldest - since.min(oldest),
        };
        for seq in oldest..next {
            match self.read_event(seq) {
                Some(e) => batch.events.push(e),
                None => batch.lost += 1,
            }
        }
        batch
    }

    fn read_event(&self, seq: u64) -> Option<Event> {
        let rec = self.event((seq % self.event_capacity as u64) as usize);
        let stamp = rec.stamp.load(Ordering::Acquire);
        if stamp != seq + 1 {
            return None;
        }
        let kind = rec.kind.load(Ordering::Relaxed);
        let pid = rec.pid.load(Ordering::Relaxed) as i32;
        let group = rec.group.load(Ordering::Relaxed);
        let time_unix_ns = rec.time_unix_ns.load(Ordering::Relaxed);
        let device = rec.device.load(Ordering::Relaxed);
        let limit_kind = rec.limit_kind.load(Ordering::Relaxed);
        let size_bytes = rec.size_bytes.load(Ordering::Relaxed);
        let used_bytes = rec.used_bytes.load(Ordering::Relaxed);
        let limit_bytes = rec.limit_bytes.load(Ordering::Relaxed);
        let exe: Vec<u64> = rec.exe.iter().map(|w| w.load(Ordering::Relaxed)).collect();
        fence(Ordering::Acquire);
        if rec.stamp.load(Ordering::Relaxed) != stamp {
            return None;
        }
        let kind = match kind {
            EVENT_DENIED => EventKind::AllocationDenied {
                device,
                size_bytes,
                used_bytes,
                limit_bytes,
                limit_kind: if limit_kind == 1 {
                    LimitKind::Group
                } else {
                    LimitKind::Process
                },
            },
            EVENT_CPU_ONLY_VIOLATION => EventKind::CpuOnlyViolation {
                executable: unpack_words(&exe),
            },
            _ => return None,
        };
        Some(Event {
            seq,
            time_unix_ns,
            pid,
            group,
            kind,
        })
    }
}
