//! The on-disk (in-/dev/shm) layout of a ledger: a header followed by four arrays of fixed-size
//! records. Every field that changes after creation is an atomic, so processes share it without
//! locks; records are 64-byte aligned so hot counters of different groups/slots do not share
//! cache lines.
//!
//! ```text
//! offset 0        Header            magic, version, sizes, counts, offsets, event sequence
//! devices_offset  DeviceRecord × D  uuid (text + 16 raw bytes), physical total bytes
//! groups_offset   GroupRecord  × G  limits per device, policy flags, used/peak per device
//! slots_offset    SlotRecord   × S  owner (state|pid), start time, group, used/peak, counters
//! events_offset   EventRecord  × E  ring: stamp (seq+1), kind, pid, device, sizes, executable
//! ```

use std::sync::atomic::{AtomicU32, AtomicU64};

/// First 8 bytes of every ledger file.
pub const MAGIC: [u8; 8] = *b"GPUVLDG\0";
/// Layout version; bumped on any change to the records below.
pub const LAYOUT_VERSION: u32 = 2;
/// Most devices one ledger describes (per-device arrays in groups and slots are this long).
pub const MAX_DEVICES: usize = 16;
/// Limit value meaning "no limit".
pub const NO_LIMIT: u64 = u64::MAX;
/// Upper bound on slots and events, to reject absurd headers of corrupt files.
pub const MAX_RECORDS: u32 = 1 << 20;
/// Longest group name kept (bytes, UTF-8, NUL-padded).
pub const GROUP_NAME_LEN: usize = 48;
/// Longest executable path kept in an event (bytes, NUL-padded).
pub const EVENT_EXE_LEN: usize = 128;
/// Longest process name (`comm`) kept in a slot.
pub const SLOT_NAME_LEN: usize = 16;

/// Group policy flag: every process of the group is refused the GPU.
pub const GROUP_FLAG_CPU_ONLY: u32 = 1;
/// Group policy flag: the group's root process may use the GPU, its descendants may not.
pub const GROUP_FLAG_CHILDREN_CPU_ONLY: u32 = 2;

/// Slot flag: the process tried to use CUDA while CPU-only.
pub const SLOT_FLAG_CPU_ONLY_VIOLATION: u32 = 1;
/// Slot flag: the process found the ledger damaged and stopped enforcing its budget.
pub const SLOT_FLAG_FAILED_OPEN: u32 = 2;

/// Slot owner word: 0 = free; otherwise `state << 32 | pid`.
pub const SLOT_FREE: u64 = 0;
/// Slot state: being filled in by its new owner.
pub const SLOT_STATE_CLAIMING: u64 = 1;
/// Slot state: owned by a (presumably) live process.
pub const SLOT_STATE_LIVE: u64 = 2;
/// Slot state: being reclaimed after its process died.
pub const SLOT_STATE_RECLAIMING: u64 = 3;
/// Slot state: its process died and its charges went back to the group, but its record (pid,
/// name, peaks, refusals) stays until the supervisor has read it ([`crate::Ledger::release_exited`])
/// or a new process needs the slot (then counted in [`Header::exited_overwritten`]).
pub const SLOT_STATE_EXITED: u64 = 4;

/// Largest value any byte counter (limit, use, peak) may plausibly hold: 1 PiB, more GPU memory
/// than any machine has. A larger value can only be damage (random bytes are above it with
/// probability 1 - 2^-14).
pub const PLAUSIBLE_BYTES: u64 = 1 << 50;
/// Largest plausible event or refusal count (2^40: a million refusals a second for 12 days).
pub const PLAUSIBLE_COUNT: u64 = 1 << 40;

/// How long a refusal waits before scanning its group for dead processes again (nanoseconds of
/// `CLOCK_MONOTONIC`): the scan costs a system call or two per process of the group, so it is
/// done at most this often per group whatever the rate of refusals.
pub const RECLAIM_INTERVAL_NS: u64 = 100_000_000;

/// Event kind: an allocation was refused.
pub const EVENT_DENIED: u32 = 1;
/// Event kind: a CPU-only process tried to use CUDA.
pub const EVENT_CPU_ONLY_VIOLATION: u32 = 2;

/// Packs a slot owner word.
pub const fn owner_word(state: u64, pid: i32) -> u64 {
    (state << 32) | (pid as u32 as u64)
}

/// The ledger header at offset 0.
#[repr(C)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`LAYOUT_VERSION`].
    pub layout_version: u32,
    /// `size_of::<Header>()` of the writer.
    pub header_size: u32,
    /// Size of the whole file in bytes.
    pub total_size: u64,
    /// Number of device records.
    pub device_count: u32,
    /// Number of group records.
    pub group_count: u32,
    /// Number of process slots.
    pub slot_count: u32,
    /// Number of event records in the ring.
    pub event_capacity: u32,
    /// Offset of the device array.
    pub devices_offset: u64,
    /// Offset of the group array.
    pub groups_offset: u64,
    /// Offset of the slot array.
    pub slots_offset: u64,
    /// Offset of the event ring.
    pub events_offset: u64,
    /// `size_of` of each record kind, checked on open.
    pub record_sizes: [u32; 4],
    /// pid of the gpuvisor process that created the ledger.
    pub creator_pid: u32,
    /// Reserved, zero.
    pub reserved0: u32,
    /// Creation time, nanoseconds since the Unix epoch.
    pub created_unix_ns: u64,
    /// Sequence number the next event gets (monotonic; slot = seq % capacity).
    pub event_next_seq: AtomicU64,
    /// Times a counter would have gone below zero and was clamped (should stay 0).
    pub underflow_repairs: AtomicU64,
    /// Allocations the shims could not track for freeing (pointer table full).
    pub untracked_allocations: AtomicU64,
    /// Slot claims ever made; its low 24 bits are the generation stamped into a slot's owner
    /// word, so a stale reclaimer cannot free a slot re-claimed by a reused pid.
    pub claims_total: AtomicU64,
    /// Checksum of everything above `event_next_seq` and of the device table (written once at
    /// creation; see [`crate::Ledger::check`]).
    pub header_check: u64,
    /// Records of exited processes overwritten by a new process before the supervisor read
    /// them (their pid, peaks and refusals are missing from summaries; the totals are not).
    pub exited_overwritten: AtomicU64,
    /// Processes that stopped enforcing their budget after finding the ledger damaged.
    pub failed_open: AtomicU64,
    /// Reserved for future counters.
    pub reserved: u64,
}

/// One GPU the job uses.
#[repr(C)]
pub struct DeviceRecord {
    /// UUID text, e.g. `GPU-5111a7ed-0000-4000-8000-000000000001`, NUL-padded.
    pub uuid_text: [u8; 48],
    /// The same UUID as the 16 raw bytes `cuDeviceGetUuid` returns.
    pub uuid_raw: [u8; 16],
    /// Physical memory of the card in bytes.
    pub total_bytes: u64,
    /// Reserved, zero.
    pub reserved: [u64; 7],
}

/// A budget group: one process, or a whole process tree.
#[repr(C, align(64))]
pub struct GroupRecord {
    /// Limit for the whole group per device ([`NO_LIMIT`] = none).
    pub limit_bytes: [AtomicU64; MAX_DEVICES],
    /// Limit for each process of the group per device ([`NO_LIMIT`] = none).
    pub per_process_limit_bytes: [AtomicU64; MAX_DEVICES],
    /// Bytes charged to the group per device.
    pub used_bytes: [AtomicU64; MAX_DEVICES],
    /// Highest `used_bytes` seen per device.
    pub peak_bytes: [AtomicU64; MAX_DEVICES],
    /// `GROUP_FLAG_*` bits.
    pub flags: AtomicU32,
    /// Reserved, zero.
    pub reserved0: u32,
    /// Allocations refused in this group.
    pub denied_count: AtomicU64,
    /// Group name, UTF-8, NUL-padded.
    pub name: [u8; GROUP_NAME_LEN],
    /// Checksum of the limits, flags, name and index (rewritten with every limit change).
    pub check: AtomicU64,
    /// `CLOCK_MONOTONIC` nanoseconds of the last scan of this group for dead processes by a
    /// refusal (0 = never), so refusals scan at most once per [`RECLAIM_INTERVAL_NS`].
    pub last_reclaim_ns: AtomicU64,
}

/// A process slot.
#[repr(C, align(64))]
pub struct SlotRecord {
    /// `state << 32 | pid`, [`SLOT_FREE`] when free.
    pub owner: AtomicU64,
    /// Process start time (field 22 of /proc/PID/stat, clock ticks since boot).
    pub start_time: AtomicU64,
    /// Group index.
    pub group: AtomicU32,
    /// `SLOT_FLAG_*` bits.
    pub flags: AtomicU32,
    /// Contexts created or primary contexts retained.
    pub contexts: AtomicU64,
    /// Allocations refused.
    pub denied_count: AtomicU64,
    /// Allocations passed through without tracking (pointer table full).
    pub untracked_count: AtomicU64,
    /// Process name (`comm`), NUL-padded, as two words so it can be written atomically.
    pub name: [AtomicU64; SLOT_NAME_LEN / 8],
    /// Bytes charged per device.
    pub used_bytes: [AtomicU64; MAX_DEVICES],
    /// Highest `used_bytes` per device.
    pub peak_bytes: [AtomicU64; MAX_DEVICES],
}

/// One entry of the event ring (a seqlock: `stamp` is 0 while being written, `seq + 1` after).
#[repr(C, align(64))]
pub struct EventRecord {
    /// 0 while written; `seq + 1` once complete.
    pub stamp: AtomicU64,
    /// `EVENT_*`.
    pub kind: AtomicU32,
    /// Process id.
    pub pid: AtomicU32,
    /// Ledger device index (denials).
    pub device: AtomicU32,
    /// 0 = per-process limit, 1 = group limit (denials).
    pub limit_kind: AtomicU32,
    /// Time, nanoseconds since the Unix epoch.
    pub time_unix_ns: AtomicU64,
    /// Requested bytes (denials).
    pub size_bytes: AtomicU64,
    /// Bytes in use when refused (denials).
    pub used_bytes: AtomicU64,
    /// The limit that refused (denials).
    pub limit_bytes: AtomicU64,
    /// Group index.
    pub group: AtomicU32,
    /// Reserved, zero.
    pub reserved0: AtomicU32,
    /// Executable path (violations), NUL-padded.
    pub exe: [AtomicU64; EVENT_EXE_LEN / 8],
}

/// [`GroupRecord::check`] while the supervisor changes the group's limits. Bytes of `0xff`
/// over a group read as this, but their limits then read "no limit" (no false refusal) and
/// their counters fail the bounds.
pub const GROUP_CHECK_CHANGING: u64 = u64::MAX;

/// A checksum of words (not cryptographic: it catches overwrites and random bytes, not an
/// attacker who can write the file, who could write any budget anyway).
pub fn checksum(words: impl IntoIterator<Item = u64>) -> u64 {
    let mut h: u64 = 0x6770_7576_6973_6f72; // "gpuvisor"
    for w in words {
        h = (h ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 29;
    }
    // Never the "changing" marker.
    h.min(GROUP_CHECK_CHANGING - 1)
}

/// Rounds `n` up to a multiple of 64.
pub const fn align64(n: usize) -> usize {
    (n + 63) & !63
}

/// Byte offsets of each array, computed from the counts (the header must agree).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// Device array.
    pub devices: usize,
    /// Group array.
    pub groups: usize,
    /// Slot array.
    pub slots: usize,
    /// Event ring.
    pub events: usize,
    /// Whole file.
    pub total: usize,
}

impl Offsets {
    /// Layout for the given counts.
    pub fn compute(devices: u32, groups: u32, slots: u32, events: u32) -> Offsets {
        let d = align64(std::mem::size_of::<Header>());
        let g = align64(d + devices as usize * std::mem::size_of::<DeviceRecord>());
        let s = align64(g + groups as usize * std::mem::size_of::<GroupRecord>());
        let e = align64(s + slots as usize * std::mem::size_of::<SlotRecord>());
        let total = align64(e + events as usize * std::mem::size_of::<EventRecord>());
        Offsets {
            devices: d,
            groups: g,
            slots: s,
            events: e,
            total,
        }
    }
}

/// Record sizes as stored in [`Header::record_sizes`].
pub fn record_sizes() -> [u32; 4] {
    [
        std::mem::size_of::<DeviceRecord>() as u32,
        std::mem::size_of::<GroupRecord>() as u32,
        std::mem::size_of::<SlotRecord>() as u32,
        std::mem::size_of::<EventRecord>() as u32,
    ]
}

/// Packs bytes into NUL-padded words (truncating), for atomically written text fields.
pub fn pack_words<const N: usize>(text: &[u8]) -> [u64; N] {
    let mut words = [0u64; N];
    for (i, b) in text.iter().take(N * 8).enumerate() {
        words[i / 8] |= (*b as u64) << ((i % 8) * 8);
    }
    words
}

/// Unpacks NUL-padded words into a string (lossy UTF-8).
pub fn unpack_words(words: &[u64]) -> String {
    let mut bytes = Vec::with_capacity(words.len() * 8);
    for w in words {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    text_from_padded(&bytes)
}

/// A NUL-padded byte field as a string (lossy UTF-8).
pub fn text_from_padded(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}
