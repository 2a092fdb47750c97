//! **Format 3, direct logs** (`logs = "direct"` in the job file): the child writes its own
//! files and the supervisor only dates what they hold, from outside.
//!
//! ```text
//! logs/<stem>.out.log     the child's stdout, byte for byte (opened O_APPEND as its fd 1)
//! logs/<stem>.err.log     its stderr, byte for byte (fd 2)
//! logs/<stem>.times       written by the supervisor only: when the files grew
//! ```
//!
//! `<stem>.times` is text, one record a line:
//!
//! ```text
//! gpuvisor-times 3                             first line of every times file
//! L 2 2026-11-21T23:25:16.120Z 4096 128        life 2 starts; its output begins at these offsets
//! R O 8192                                     stdout before byte 8192 was rotated out
//! O 2026-11-21T23:25:16.123Z 5120              stdout had reached byte 5120 by then
//! E 2026-11-21T23:25:16.124Z 300               stderr had reached byte 300
//! X 2 2026-11-21T23:25:17.001Z                 life 2 ended (a line it left unended is whole)
//! ```
//!
//! A line is dated by the first `O`/`E` record whose offset covers its newline: the
//! millisecond the supervisor saw it in the file, as format 2 dates a line by when it was read
//! from the pipe. Records of one file come in order, so merging the two streams by the times
//! file gives the order in which their lines appeared. A new times file (the old one renamed
//! `<stem>.times.1` when it grew past 8 MiB or a data file rotated) restates the current life and both live
//! starts (`L`, `R O`, `R E`) right after its header, so a reader needs only the current one.
//!
//! Rotation keeps the child's file descriptor: the oldest whole lines are freed in place (a
//! hole; the file's length does not change, which O_APPEND writers need), keeping about as
//! many bytes live as pipes' rotated files would hold, and `R` says where the live part
//! starts. Nothing is copied, so no `.1` files.
//!
//! No I/O policy here (when to rotate, how often to look): that is the pump's.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::{LogLine, Stream, STAMP_LEN};

/// The first line of every times file.
pub const TIMES_HEADER: &[u8] = b"gpuvisor-times 3\n";
/// A line longer than this is handed on in pieces (as the pump does with format 2).
const LONGEST_LINE: usize = 1 << 16;
/// Data is read back in blocks of this size.
const READ_BLOCK: u64 = 1 << 20;

/// `logs/<stem>.out.log`.
pub fn out_path(dir: &Path, stem: &str) -> PathBuf {
    dir.join(format!("{stem}.out.log"))
}

/// `logs/<stem>.err.log`.
pub fn err_path(dir: &Path, stem: &str) -> PathBuf {
    dir.join(format!("{stem}.err.log"))
}

/// `logs/<stem>.times`.
pub fn times_path(dir: &Path, stem: &str) -> PathBuf {
    dir.join(format!("{stem}.times"))
}

/// The data file of `stream`.
pub fn stream_path(dir: &Path, stem: &str, stream: Stream) -> PathBuf {
    match stream {
        Stream::Stdout => out_path(dir, stem),
        Stream::Stderr => err_path(dir, stem),
    }
}

/// Whether the replica `stem` in `dir` keeps direct logs (its times file exists).
pub fn is_direct(dir: &Path, stem: &str) -> bool {
    times_path(dir, stem).exists()
}

/// Replica `logs/<stem>.log`'s directory and stem when it keeps direct logs instead (the
/// path readers know a replica's log by).
pub fn direct_of(log_path: &Path) -> Option<(PathBuf, String)> {
    let stem = log_path.file_name()?.to_str()?.strip_suffix(".log")?;
    let dir = log_path.parent()?;
    is_direct(dir, stem).then(|| (dir.to_path_buf(), stem.to_string()))
}

/// Where replica `stem`'s live parts start (the last rotation's cuts; `[0, 0]` before any),
/// as the head of its times file restates them.
pub fn live_starts(dir: &Path, stem: &str) -> [u64; 2] {
    let mut starts = [0, 0];
    let Ok(file) = File::open(times_path(dir, stem)) else {
        return starts;
    };
    let mut head = Vec::new();
    if file.take(4096).read_to_end(&mut head).is_err() {
        return starts;
    }
    for raw in head.split(|&byte| byte == b'\n').skip(1).take(3) {
        match std::str::from_utf8(raw).ok().and_then(Record::parse) {
            Some(Record::Rotated { stream, offset }) => starts[slot(stream)] = offset,
            Some(Record::Life { .. }) => {}
            _ => break,
        }
    }
    starts
}

/// One record of a times file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    /// A life starts; its output begins at `out_at` and `err_at`.
    Life {
        /// The life (spawn counter).
        life: u64,
        /// When it started.
        stamp: &'a str,
        /// The stdout file's length then.
        out_at: u64,
        /// The stderr file's length then.
        err_at: u64,
    },
    /// `stream`'s file had reached `offset` bytes by `stamp`.
    Reached {
        /// Which file.
        stream: Stream,
        /// RFC 3339 to the millisecond.
        stamp: &'a str,
        /// Its length.
        offset: u64,
    },
    /// The life ended: a line it left unended is whole.
    End {
        /// The life.
        life: u64,
        /// When its end was seen.
        stamp: &'a str,
    },
    /// `stream`'s bytes before `offset` are rotated out (a hole in the live file).
    Rotated {
        /// Which file.
        stream: Stream,
        /// Where the live part starts.
        offset: u64,
    },
}

impl Record<'_> {
    /// Appends the record's line to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        let _ = match self {
            Record::Life {
                life,
                stamp,
                out_at,
                err_at,
            } => writeln!(out, "L {life} {stamp} {out_at} {err_at}"),
            Record::Reached {
                stream,
                stamp,
                offset,
            } => writeln!(out, "{} {stamp} {offset}", tag(*stream)),
            Record::End { life, stamp } => writeln!(out, "X {life} {stamp}"),
            Record::Rotated { stream, offset } => writeln!(out, "R {} {offset}", tag(*stream)),
        };
    }

    /// A times file's line (without its newline); `None` for the header or a damaged line.
    pub fn parse(line: &str) -> Option<Record<'_>> {
        let mut fields = line.split(' ');
        let kind = fields.next()?;
        let record = match kind {
            "L" => Record::Life {
                life: fields.next()?.parse().ok()?,
                stamp: stamp(fields.next()?)?,
                out_at: fields.next()?.parse().ok()?,
                err_at: fields.next()?.parse().ok()?,
            },
            "O" | "E" => Record::Reached {
                stream: stream_of(kind)?,
                stamp: stamp(fields.next()?)?,
                offset: fields.next()?.parse().ok()?,
            },
            "X" => Record::End {
                life: fields.next()?.parse().ok()?,
                stamp: stamp(fields.next()?)?,
            },
            "R" => Record::Rotated {
                stream: stream_of(fields.next()?)?,
                offset: fields.next()?.parse().ok()?,
            },
            _ => return None,
        };
        fields.next().is_none().then_some(record)
    }
}

fn tag(stream: Stream) -> char {
    match stream {
        Stream::Stdout => 'O',
        Stream::Stderr => 'E',
    }
}

fn stream_of(tag: &str) -> Option<Stream> {
    match tag {
        "O" => Some(Stream::Stdout),
        "E" => Some(Stream::Stderr),
        _ => None,
    }
}

fn stamp(text: &str) -> Option<&str> {
    (text.len() == STAMP_LEN && text.ends_with('Z')).then_some(text)
}

fn slot(stream: Stream) -> usize {
    match stream {
        Stream::Stdout => 0,
        Stream::Stderr => 1,
    }
}

/// Turns records into lines: what has been handed on of each stream and the start of a line
/// whose end is not dated yet.
#[derive(Debug, Default)]
struct Merge {
    consumed: [u64; 2],
    partial: [Vec<u8>; 2],
    /// The time of the last record of each stream (an unended line at a life's end gets it).
    stamp: [String; 2],
    /// The life of the last `L` record (a new times file restates it: no new life).
    life: Option<u64>,
}

impl Merge {
    fn apply(&mut self, record: &Record<'_>, data: &[Option<File>; 2], lines: &mut Vec<LogLine>) {
        match *record {
            Record::Life {
                life,
                out_at,
                err_at,
                ..
            } => {
                let new_life = self.life.replace(life) != Some(life);
                for (at, start) in [out_at, err_at].into_iter().enumerate() {
                    if new_life {
                        // The last life's unended line ends with it.
                        self.flush_partial(at, lines);
                    }
                    self.consumed[at] = self.consumed[at].max(start);
                }
            }
            Record::End { .. } => {
                for at in 0..2 {
                    self.flush_partial(at, lines);
                }
            }
            Record::Rotated { stream, offset } => {
                let at = slot(stream);
                if offset > self.consumed[at] {
                    self.partial[at].clear();
                    self.consumed[at] = offset;
                }
            }
            Record::Reached {
                stream,
                stamp,
                offset,
            } => {
                let at = slot(stream);
                self.stamp[at].clear();
                self.stamp[at].push_str(stamp);
                if offset > self.consumed[at] {
                    if let Some(file) = &data[at] {
                        self.take(at, file, offset, lines);
                    }
                }
            }
        }
    }

    /// Reads stream `at` up to `end` and hands on its whole lines.
    fn take(&mut self, at: usize, file: &File, end: u64, lines: &mut Vec<LogLine>) {
        while self.consumed[at] < end {
            let want = (end - self.consumed[at]).min(READ_BLOCK) as usize;
            let mut block = vec![0u8; want];
            let got = match file.read_at(&mut block, self.consumed[at]) {
                Ok(0) | Err(_) => return, // shorter than recorded (a damaged run): stop here
                Ok(got) => got,
            };
            block.truncate(got);
            self.consumed[at] += got as u64;
            let mut rest = block.as_slice();
            while let Some(newline) = memchr::memchr(b'\n', rest) {
                let (line, after) = rest.split_at(newline + 1);
                if self.partial[at].is_empty() {
                    self.push(at, &line[..newline], lines);
                } else {
                    self.partial[at].extend_from_slice(&line[..newline]);
                    let whole = std::mem::take(&mut self.partial[at]);
                    self.push(at, &whole, lines);
                    self.partial[at] = whole;
                    self.partial[at].clear();
                }
                rest = after;
            }
            self.partial[at].extend_from_slice(rest);
            if self.partial[at].len() >= LONGEST_LINE {
                self.flush_partial(at, lines);
            }
        }
    }

    fn flush_partial(&mut self, at: usize, lines: &mut Vec<LogLine>) {
        if !self.partial[at].is_empty() {
            let whole = std::mem::take(&mut self.partial[at]);
            self.push(at, &whole, lines);
        }
    }

    fn push(&self, at: usize, text: &[u8], lines: &mut Vec<LogLine>) {
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        lines.push(LogLine {
            stamp: self.stamp[at].clone(),
            stderr: at == 1,
            text: String::from_utf8_lossy(text).into_owned(),
        });
    }
}

/// Follows one replica's direct logs: every call hands on the lines dated since the last
/// (`gpuvisor logs -f`, the stall watch). A times file replaced by rotation is read again from
/// its start; what was already handed on is not repeated.
#[derive(Debug)]
pub struct DirectReader {
    dir: PathBuf,
    stem: String,
    times: Option<(File, u64)>,
    times_read: u64,
    times_partial: Vec<u8>,
    data: [Option<File>; 2],
    merge: Merge,
}

impl DirectReader {
    /// A reader at the start of replica `stem`'s direct logs in `dir`.
    pub fn new(dir: &Path, stem: &str) -> DirectReader {
        DirectReader {
            dir: dir.to_path_buf(),
            stem: stem.to_string(),
            times: None,
            times_read: 0,
            times_partial: Vec::new(),
            data: [None, None],
            merge: Merge::default(),
        }
    }

    /// The lines dated since the last call, in the order they appeared.
    pub fn read_new(&mut self) -> Vec<LogLine> {
        let mut lines = Vec::new();
        let path = times_path(&self.dir, &self.stem);
        let inode = std::fs::metadata(&path).ok().map(|meta| meta.ino());
        if self.times.as_ref().map(|(_, ino)| *ino) != inode {
            // New (or rotated): read it from the start.
            self.times = File::open(&path).ok().zip(inode);
            self.times_read = 0;
            self.times_partial.clear();
        }
        for stream in [Stream::Stdout, Stream::Stderr] {
            if self.data[slot(stream)].is_none() {
                self.data[slot(stream)] =
                    File::open(stream_path(&self.dir, &self.stem, stream)).ok();
            }
        }
        let Some((times, _)) = &mut self.times else {
            return lines;
        };
        let mut fresh = Vec::new();
        if times.seek(SeekFrom::Start(self.times_read)).is_err()
            || times.read_to_end(&mut fresh).is_err()
        {
            return lines;
        }
        self.times_read += fresh.len() as u64;
        self.times_partial.extend_from_slice(&fresh);
        let Some(end) = memchr::memrchr(b'\n', &self.times_partial) else {
            return lines;
        };
        let complete: Vec<u8> = self.times_partial.drain(..=end).collect();
        for raw in complete.split(|&byte| byte == b'\n') {
            if let Some(record) = std::str::from_utf8(raw).ok().and_then(Record::parse) {
                self.merge.apply(&record, &self.data, &mut lines);
            }
        }
        lines
    }
}

/// Every dated line of replica `stem`'s direct logs (the live part), in order.
pub fn parse_direct(dir: &Path, stem: &str) -> Vec<LogLine> {
    DirectReader::new(dir, stem).read_new()
}

/// The offset of the first line that starts at or after `from` (the file's length if none).
fn line_start_at_or_after(file: &File, from: u64) -> u64 {
    let mut before = [0u8; 1];
    if file.read_at(&mut before, from - 1).ok() == Some(1) && before[0] == b'\n' {
        return from;
    }
    let mut at = from;
    let mut block = vec![0u8; 1 << 16];
    loop {
        match file.read_at(&mut block, at) {
            Ok(0) | Err(_) => return at,
            Ok(got) => match memchr::memchr(b'\n', &block[..got]) {
                Some(newline) => return at + newline as u64 + 1,
                None => at += got as u64,
            },
        }
    }
}

/// The last lines in the last `max_bytes` of each of replica `stem`'s streams, with their
/// times, from offsets `since` on (a life's start; `[0, 0]`: any). A cut first line is
/// dropped; lines not dated yet are not included.
pub fn read_tail_direct(
    dir: &Path,
    stem: &str,
    max_bytes: u64,
    since: [u64; 2],
) -> io::Result<Vec<LogLine>> {
    let mut times = File::open(times_path(dir, stem))?;
    let data = [
        File::open(out_path(dir, stem)).ok(),
        File::open(err_path(dir, stem)).ok(),
    ];
    let mut merge = Merge {
        consumed: live_starts(dir, stem),
        ..Merge::default()
    };
    for at in 0..2 {
        let Some(file) = &data[at] else { continue };
        let length = file.metadata().map_or(0, |meta| meta.len());
        let start = merge.consumed[at].max(since[at]);
        let from = length.saturating_sub(max_bytes).max(start);
        merge.consumed[at] = if from > start {
            line_start_at_or_after(file, from)
        } else {
            from
        };
    }
    // Enough of the times file to date that much of both streams: records are about 35 bytes
    // for at least one line each, so a times tail as long as the data tail is always enough.
    let times_length = times.metadata()?.len();
    let times_from = times_length.saturating_sub(max_bytes.saturating_mul(2).max(1 << 16));
    times.seek(SeekFrom::Start(times_from))?;
    let mut text = Vec::new();
    times.read_to_end(&mut text)?;
    let mut records = text.split(|&byte| byte == b'\n');
    if times_from > 0 {
        records.next(); // cut
    }
    let mut lines = Vec::new();
    for raw in records {
        let Some(record) = std::str::from_utf8(raw).ok().and_then(Record::parse) else {
            continue;
        };
        if let Record::Life { out_at, err_at, .. } = record {
            if out_at < merge.consumed[0] && err_at < merge.consumed[1] {
                continue; // an earlier life, before the tail
            }
        }
        merge.apply(&record, &data, &mut lines);
    }
    Ok(lines)
}

#[cfg(test)]
mod tests;
