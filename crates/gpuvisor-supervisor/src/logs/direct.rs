//! Direct logs (`logs = "direct"`): the child's stdout and stderr are its own log files
//! (opened by the spawner), so no byte of its output passes through the supervisor. The pump
//! only looks at the files when inotify says they changed (when: [`super::direct_watch`]), at most once per
//! [`LOOK_EVERY`], and dates what they hold in the replica's times file (the record's
//! [`gpuvisor_record::log_file::direct`] format). It reads the bytes back only where something
//! needs them: a readiness pattern not matched yet, the terminal, the exit-cause tail.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuvisor_record::log_file::direct::{self, Record, TIMES_HEADER};
use gpuvisor_record::log_file::Stream;
use nix::fcntl::{fallocate, FallocateFlags};
use regex::bytes::Regex;

use super::matches_ready;

/// How long changes gather before the pump looks (inotify's events wait and merge meanwhile):
/// a line's time is at most this much after it was written, and a chatty child costs the
/// supervisor one look per this interval, not one per write.
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(2);
/// A times file past this size starts again (the old one kept as `.times.1`).
const TIMES_MAX_BYTES: u64 = 8 << 20;
/// Rotation cuts at the last line end within this many bytes of the file's end (or, in a
/// line longer than that, at a multiple of 4 KiB).
const CUT_LOOKBACK: u64 = 1 << 16;

/// Where lines read back go (the terminal): a run's unfinished start of a line from an
/// earlier read, then whole lines.
pub(super) type Echo<'a> = &'a mut dyn FnMut(&[u8], &[u8]);

/// Bytes of a stream read back from where the last look left off, handed on in whole lines.
#[derive(Debug, Default)]
struct Cursor {
    at: u64,
    partial: Vec<u8>,
}

impl Cursor {
    /// Reads `file` from the cursor to `end`; `lines` gets each run of whole lines (an unended
    /// line longer than 64 KiB is handed on as it is).
    fn read(&mut self, file: &File, end: u64, mut lines: impl FnMut(&[u8], &[u8])) {
        let mut block = vec![0u8; 1 << 16];
        while self.at < end {
            let want = ((end - self.at) as usize).min(block.len());
            let got = match file.read_at(&mut block[..want], self.at) {
                Ok(0) | Err(_) => return,
                Ok(got) => got,
            };
            self.at += got as u64;
            let fresh = &block[..got];
            match memchr::memrchr(b'\n', fresh) {
                Some(last) => {
                    lines(&self.partial, &fresh[..=last]);
                    self.partial.clear();
                    self.partial.extend_from_slice(&fresh[last + 1..]);
                }
                None => {
                    self.partial.extend_from_slice(fresh);
                    if self.partial.len() >= 1 << 16 {
                        lines(&self.partial, b"\n");
                        self.partial.clear();
                    }
                }
            }
        }
    }
}

/// One of a replica's two direct log files.
#[derive(Debug)]
struct Output {
    path: PathBuf,
    /// Opened read-write: read back, and holes punched at rotation (never written).
    file: File,
    /// Its length at the last look.
    seen: u64,
    /// Where its live part starts (the last rotation's cut).
    live_start: u64,
    /// The time of the last record of it (restated in a new times file).
    last_stamp: String,
    /// Rotation failed once (said once): not tried again.
    cannot_rotate: bool,
    ready: Cursor,
    echo: Cursor,
}

/// A replica with direct logs, for one life.
#[derive(Debug)]
pub(super) struct DirectReplica {
    pub(super) generation: u64,
    dir: PathBuf,
    stem: String,
    outputs: [Output; 2],
    times: File,
    times_bytes: u64,
    /// Where this life's output starts in each file.
    pub(super) life_start: [u64; 2],
    life_stamp: String,
    ready: Option<Regex>,
    /// The records of one look, written with one `write`.
    pending: Vec<u8>,
}

/// What one look at a replica found.
#[derive(Debug, Default)]
pub(super) struct Look {
    /// Its files grew.
    pub(super) grew: bool,
    /// A line matched its readiness pattern (the first time).
    pub(super) ready: bool,
    /// A problem to say once (rotation or the times file failed).
    pub(super) problem: Option<String>,
}

impl DirectReplica {
    /// Starts dating replica `stem`'s life `generation`, whose output starts at `starts`
    /// (the files' lengths before it ran; anything beyond was written by this life).
    pub(super) fn open(
        dir: &Path,
        stem: &str,
        generation: u64,
        starts: [u64; 2],
        stamp: &str,
        ready: Option<Regex>,
    ) -> io::Result<DirectReplica> {
        // A restart after a rotation: the live parts start where the times file says.
        let live_starts = direct::live_starts(dir, stem);
        let open = |stream: Stream, start: u64| -> io::Result<Output> {
            let path = direct::stream_path(dir, stem, stream);
            let file = OpenOptions::new().read(true).write(true).open(&path)?;
            Ok(Output {
                path,
                file,
                seen: start,
                live_start: live_starts[stream as usize],
                last_stamp: stamp.to_string(),
                cannot_rotate: false,
                ready: Cursor {
                    at: start,
                    partial: Vec::new(),
                },
                echo: Cursor {
                    at: start,
                    partial: Vec::new(),
                },
            })
        };
        let outputs = [
            open(Stream::Stdout, starts[0])?,
            open(Stream::Stderr, starts[1])?,
        ];
        let times_path = direct::times_path(dir, stem);
        let times = open_times(&times_path)?;
        let times_bytes = times.metadata()?.len();
        let mut replica = DirectReplica {
            generation,
            dir: dir.to_path_buf(),
            stem: stem.to_string(),
            outputs,
            times,
            times_bytes,
            life_start: starts,
            life_stamp: stamp.to_string(),
            ready,
            pending: Vec::new(),
        };
        if times_bytes == 0 {
            replica.pending.extend_from_slice(TIMES_HEADER);
        }
        // What a straggler of the last life wrote after its last look is dated now, then the
        // new life begins where the files end.
        for (stream, start) in [(Stream::Stdout, starts[0]), (Stream::Stderr, starts[1])] {
            if start == 0 {
                continue;
            }
            Record::Reached {
                stream,
                stamp,
                offset: start,
            }
            .write_to(&mut replica.pending);
        }
        replica.life_record();
        replica.flush()?;
        Ok(replica)
    }

    fn life_record(&mut self) {
        Record::Life {
            life: self.generation,
            stamp: &self.life_stamp,
            out_at: self.life_start[0],
            err_at: self.life_start[1],
        }
        .write_to(&mut self.pending);
    }

    /// Looks at both files: dates what they gained, matches readiness, hands new lines to
    /// `echo` (when there is a terminal), rotates a file past `max_file_bytes`.
    pub(super) fn look(
        &mut self,
        stamp: &str,
        (max_file_bytes, keep_rotated): (u64, u32),
        mut echo: Option<Echo<'_>>,
    ) -> Look {
        let mut look = Look::default();
        let mut rotate = [false; 2];
        for (at, stream) in [(0, Stream::Stdout), (1, Stream::Stderr)] {
            let output = &mut self.outputs[at];
            let Ok(length) = output.file.metadata().map(|meta| meta.len()) else {
                continue;
            };
            if length <= output.seen {
                continue;
            }
            output.seen = length;
            output.last_stamp.clear();
            output.last_stamp.push_str(stamp);
            look.grew = true;
            Record::Reached {
                stream,
                stamp,
                offset: length,
            }
            .write_to(&mut self.pending);
            if let Some(pattern) = &self.ready {
                let mut found = false;
                output.ready.read(&output.file, length, |carried, fresh| {
                    found = found || matches_ready(pattern, carried, fresh);
                });
                if found {
                    self.ready = None;
                    look.ready = true;
                }
            }
            if let Some(echo) = echo.as_deref_mut() {
                output.echo.read(&output.file, length, &mut *echo);
            }
            // Pipes' rotation keeps the current file and `keep` older ones.
            let window = max_file_bytes.saturating_mul(u64::from(keep_rotated) + 1);
            rotate[at] = !output.cannot_rotate && length - output.live_start > window;
        }
        for (at, due) in rotate.into_iter().enumerate() {
            if due {
                if let Err(error) = self.rotate(at, max_file_bytes, keep_rotated) {
                    self.outputs[at].cannot_rotate = true;
                    look.problem = Some(format!(
                        "cannot rotate {}: {error} (it grows past its size limit; said once)",
                        self.outputs[at].path.display()
                    ));
                }
            }
        }
        if self.times_bytes + self.pending.len() as u64 > TIMES_MAX_BYTES {
            if let Err(error) = self.rotate_times(keep_rotated) {
                look.problem = Some(format!("cannot rotate the times file: {error}"));
            }
        }
        if let Err(error) = self.flush() {
            look.problem = Some(format!(
                "cannot write {}: {error}",
                direct::times_path(&self.dir, &self.stem).display()
            ));
        }
        look
    }

    /// Frees output `at`'s oldest whole lines in place, so that about `keep` files' worth
    /// (`max_file_bytes` each) stays live: the bytes pipes' rotation would keep in `.1` ..
    /// `.N`, without copying them. The child keeps its descriptor and writes at the end.
    fn rotate(&mut self, at: usize, max_file_bytes: u64, keep: u32) -> io::Result<()> {
        let output = &mut self.outputs[at];
        let target = output
            .seen
            .saturating_sub(max_file_bytes.saturating_mul(u64::from(keep)));
        let cut = line_cut(&output.file, output.live_start, target);
        if cut <= output.live_start {
            return Ok(());
        }
        // A hole: the file keeps its length (O_APPEND writes still land at its end), the
        // blocks go back to the file system.
        fallocate(
            &output.file,
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            output.live_start as i64,
            (cut - output.live_start) as i64,
        )?;
        output.live_start = cut;
        // The new live start goes at the top of a new times file, where readers look for it.
        self.rotate_times(keep)
    }

    /// `<stem>.times` -> `.times.1` ...; the new one restates the life and the live starts.
    fn rotate_times(&mut self, keep: u32) -> io::Result<()> {
        let path = direct::times_path(&self.dir, &self.stem);
        // This look's records go to the old file first.
        self.flush()?;
        let numbered = |n: u32| PathBuf::from(format!("{}.{n}", path.display()));
        let keep = keep.max(1);
        let _ = fs::remove_file(numbered(keep));
        for n in (1..keep).rev() {
            let _ = fs::rename(numbered(n), numbered(n + 1));
        }
        fs::rename(&path, numbered(1))?;
        self.times = open_times(&path)?;
        self.times_bytes = 0;
        self.pending.extend_from_slice(TIMES_HEADER);
        self.life_record();
        for (at, stream) in [(0, Stream::Stdout), (1, Stream::Stderr)] {
            Record::Rotated {
                stream,
                offset: self.outputs[at].live_start,
            }
            .write_to(&mut self.pending);
        }
        // What is live already is dated by its last look (a reader of this file alone would
        // otherwise date it by the next one).
        for (at, stream) in [(0, Stream::Stdout), (1, Stream::Stderr)] {
            let output = &self.outputs[at];
            Record::Reached {
                stream,
                stamp: &output.last_stamp,
                offset: output.seen.max(output.live_start),
            }
            .write_to(&mut self.pending);
        }
        self.flush()
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let result = self.times.write_all(&self.pending);
        self.times_bytes += self.pending.len() as u64;
        self.pending.clear();
        result
    }

    /// The life ended: the start of a line it did not end goes to `echo` (and is matched
    /// against the readiness pattern) as an ended line.
    pub(super) fn end_lines(&mut self, echo: Option<Echo<'_>>) -> bool {
        let mut ready = false;
        for output in &mut self.outputs {
            if let Some(pattern) = &self.ready {
                let partial = std::mem::take(&mut output.ready.partial);
                ready |= !partial.is_empty() && matches_ready(pattern, &partial, b"\n");
            }
        }
        if let Some(echo) = echo {
            for output in &mut self.outputs {
                let partial = std::mem::take(&mut output.echo.partial);
                if !partial.is_empty() {
                    echo(&partial, b"\n");
                }
            }
        }
        if ready {
            self.ready = None;
        }
        let stamp = (&self.outputs[0].last_stamp)
            .max(&self.outputs[1].last_stamp)
            .clone();
        Record::End {
            life: self.generation,
            stamp: &stamp,
        }
        .write_to(&mut self.pending);
        let _ = self.flush();
        ready
    }

    /// This life's last lines (up to `max_bytes` of each stream), for its exit cause.
    pub(super) fn tail(&self, max_bytes: u64) -> Vec<String> {
        direct::read_tail_direct(&self.dir, &self.stem, max_bytes, self.life_start)
            .map(|lines| lines.into_iter().map(|line| line.text).collect())
            .unwrap_or_default()
    }

    /// The files inotify is to watch.
    pub(super) fn paths(&self) -> [&Path; 2] {
        [&self.outputs[0].path, &self.outputs[1].path]
    }
}

/// Where to cut `file` for rotation: after its last line end before `end` (so that the live
/// part starts with a whole line). The hole frees the whole blocks before the cut; the bytes
/// of a partial block are zeroed in place.
fn line_cut(file: &File, live_start: u64, end: u64) -> u64 {
    let from = end.saturating_sub(CUT_LOOKBACK).max(live_start);
    let mut block = vec![0u8; (end - from) as usize];
    match file.read_exact_at(&mut block, from) {
        Ok(()) => match memchr::memrchr(b'\n', &block) {
            Some(newline) => from + newline as u64 + 1,
            None => end / 4096 * 4096,
        },
        Err(_) => live_start,
    }
}

fn open_times(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}
