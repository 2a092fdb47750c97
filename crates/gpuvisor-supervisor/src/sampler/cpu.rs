//! CPU use of the job's processes, from /proc/PID/schedstat (kept open, re-read with one
//! `pread`: far cheaper for the kernel than /proc/PID/stat). That file counts the main thread
//! only, so a process with more threads is read from /proc/PID/stat instead (user + system
//! time of all its threads, in 10 ms clock ticks).
//!
//! CPU time is read on a beat of at most [`CPU_READ_EVERY`] (every tick when the interval is
//! at least that): CPU use is a rate and its only consumer, the stall classifier, averages it
//! over 10 s. A process whose CPU time did not move at its last read is read again only after
//! [`IDLE_READ_EVERY`]: a sleeping replica then costs a quarter of the reads, and the rate
//! measured when it is next read covers the whole time since. Between reads a process's last
//! measured rate is repeated.

use std::time::{Duration, Instant};

use super::PidMap;
use crate::procfs::{self, StatReader};

/// The shortest time between two reads of the members' CPU time.
pub const CPU_READ_EVERY: Duration = Duration::from_millis(500);
/// How often a process whose CPU time did not move at its last read is read.
pub const IDLE_READ_EVERY: Duration = Duration::from_secs(2);

/// One process's last read.
#[derive(Debug, Clone, Copy)]
struct Track {
    /// CPU time, ns.
    ns: u64,
    at: Instant,
    /// % of a core over the interval before `at`.
    rate: f32,
    /// `ns` did not move over that interval.
    idle: bool,
    /// Read from /proc/PID/stat (all threads), not schedstat.
    threaded: bool,
}

/// What [`CpuReads::rate`] found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuUse {
    /// % of a core, measured at the process's last read.
    pub percent: f32,
    /// Read now, and its CPU time moved since its previous read: it ran.
    pub ran: bool,
}

/// The CPU reads of every process, between ticks.
#[derive(Debug)]
pub struct CpuReads {
    sched: StatReader,
    /// /proc/PID/stat of processes with more than one thread.
    stat: StatReader,
    tracks: PidMap<Track>,
    /// The start of the last tick on the beat.
    beat: Option<Instant>,
    /// Ticks on the beat so far.
    pub beats: u64,
    /// Reads of /proc/PID/schedstat so far.
    pub reads: u64,
}

impl CpuReads {
    /// Nothing read yet.
    pub fn new() -> CpuReads {
        CpuReads {
            sched: StatReader::for_file("schedstat"),
            stat: StatReader::new(),
            tracks: PidMap::default(),
            beat: None,
            beats: 0,
            reads: 0,
        }
    }

    /// Whether the tick starting at `now` is on the beat (reads CPU time). Half an interval of
    /// slack, so ticks that run a little early still read on the beat rather than one late.
    pub fn on_beat(&mut self, now: Instant, interval: Duration) -> bool {
        let on = self
            .beat
            .is_none_or(|last| now.duration_since(last) + interval / 2 >= CPU_READ_EVERY);
        if on {
            self.beat = Some(now);
            self.beats += 1;
        }
        on
    }

    /// `pid`'s CPU use: read now when the tick is on the beat and the process is due (see the
    /// module's doc), else its last rate. `threaded`: it has more than one thread. `None`: it
    /// is gone.
    pub fn rate(
        &mut self,
        pid: i32,
        threaded: bool,
        now: Instant,
        on_beat: bool,
        interval: Duration,
    ) -> Option<CpuUse> {
        // A read from the other file is not comparable: start over.
        let last = self
            .tracks
            .get(&pid)
            .copied()
            .filter(|last| last.threaded == threaded);
        let due = on_beat
            && last.is_none_or(|last| {
                !last.idle || now.duration_since(last.at) + interval / 2 >= IDLE_READ_EVERY
            });
        if !due {
            let percent = last.map_or(0.0, |last| last.rate);
            return Some(CpuUse {
                percent,
                ran: false,
            });
        }
        self.reads += 1;
        let ns = match threaded {
            true => self
                .stat
                .read(pid)
                .map(|stat| stat.cpu_ticks * (1_000_000_000 / procfs::TICKS_PER_SECOND)),
            false => self.sched.read_with(pid, procfs::parse_schedstat_ns),
        };
        let Some(ns) = ns else {
            self.tracks.remove(&pid);
            return None;
        };
        let (rate, ran) = match last {
            Some(last) => {
                let elapsed_s = now.duration_since(last.at).as_secs_f32();
                let moved = ns.saturating_sub(last.ns);
                let rate = match elapsed_s > 0.0 {
                    true => moved as f32 / 1e9 / elapsed_s * 100.0,
                    false => 0.0,
                };
                (rate, moved > 0)
            }
            None => (0.0, false),
        };
        let idle = last.is_some() && !ran;
        self.tracks.insert(
            pid,
            Track {
                ns,
                at: now,
                rate,
                idle,
                threaded,
            },
        );
        Some(CpuUse { percent: rate, ran })
    }

    /// Forgets the processes for which `keep` is false.
    pub fn retain(&mut self, keep: impl Fn(i32) -> bool) {
        self.tracks.retain(|pid, _| keep(*pid));
        self.sched.retain(&keep);
        self.stat.retain(keep);
    }
}
