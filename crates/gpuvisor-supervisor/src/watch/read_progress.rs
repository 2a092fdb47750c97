//! Whether a quiet replica is still reading: a process that prints nothing while it imports
//! from a cold disk, downloads a checkpoint or maps a dataset is busy, not stalled. The watch
//! asks only for replicas quiet for half their `stall_after` or more, and counts a replica as
//! quiet since the later of its last log line and its last read of [`READ_PROGRESS_BYTES`].

/// Reading at least this much since the last count is progress (a process polling a small
/// status file or a store key reads far less).
pub(super) const READ_PROGRESS_BYTES: u64 = 1 << 20;

/// One replica's reads, from when it became half-way quiet.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ReadProgress {
    /// Its processes' bytes read at the last progress (or the first count).
    bytes: u64,
    /// When it last made progress (ms).
    last_ms: u64,
}

impl ReadProgress {
    /// How long the replica has been quiet, counting reads: `log_quiet_ms` (since its last log
    /// line) or the time since its last progress, whichever is shorter. `read` is its processes'
    /// bytes read now (`None`: not readable, so only the log counts). The first count cannot
    /// show progress: it dates the last read back to the last log line.
    pub(super) fn quiet_ms(
        progress: &mut Option<ReadProgress>,
        log_quiet_ms: u64,
        now: u64,
        read: Option<u64>,
    ) -> u64 {
        let Some(bytes) = read else {
            return log_quiet_ms;
        };
        let state = progress.get_or_insert(ReadProgress {
            bytes,
            last_ms: now.saturating_sub(log_quiet_ms),
        });
        // A process that exited and another that started read less in all: start again there.
        if bytes < state.bytes {
            state.bytes = bytes;
        } else if bytes - state.bytes >= READ_PROGRESS_BYTES {
            *state = ReadProgress {
                bytes,
                last_ms: now,
            };
        }
        log_quiet_ms.min(now.saturating_sub(state.last_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_keep_a_quiet_replica_from_counting_as_quiet() {
        let mut progress = None;
        // Half-way quiet (5 s of log silence), first count: no progress known yet.
        assert_eq!(
            ReadProgress::quiet_ms(&mut progress, 5_000, 10_000, Some(100 << 20)),
            5_000
        );
        // 40 MiB read in the next second (an import from a cold disk): quiet since now.
        assert_eq!(
            ReadProgress::quiet_ms(&mut progress, 6_000, 11_000, Some(140 << 20)),
            0
        );
        // Then only a few KiB a second (polling): quiet again from the last real read.
        assert_eq!(
            ReadProgress::quiet_ms(&mut progress, 9_000, 14_000, Some((140 << 20) + 8192)),
            3_000
        );
        // Unreadable: the log alone counts.
        assert_eq!(
            ReadProgress::quiet_ms(&mut progress, 9_000, 14_000, None),
            9_000
        );
        // Never shorter than the log's silence says.
        let mut fresh = None;
        assert_eq!(
            ReadProgress::quiet_ms(&mut fresh, 1_000, 50_000, Some(1 << 30)),
            1_000
        );
    }
}
