//! A replica's log file (`logs/<name>[.<replica>].log`): its format, written by the
//! supervisor's log pump ([`LogWriter`]) and read back by `gpuvisor logs`, `top`'s log pane and
//! the stall watch ([`LineReader`], [`parse`], [`read_tail`]). Nothing else writes or parses
//! these files.
//!
//! **Format 2** (this one). The child's lines are in the file as it wrote them; the time each
//! was read and its stream are given once per run of lines by a *marker line* above them:
//!
//! ```text
//! \x1egpuvisor-log 2                 first line of every file (also of a rotated one)
//! \x1e2026-11-21T23:25:16.123Z O     the lines below, up to the next marker: stdout, read then
//! step 1
//! step 2
//! \x1e2026-11-21T23:25:16.124Z E     a new marker when the stream or the millisecond changes
//! Traceback (most recent call last):
//! ```
//!
//! A line's time and stream are those of the nearest marker above it. Marker lines start with
//! the byte 0x1e (ASCII record separator), which no text log starts a line with; a child's own
//! line that does is written with one more 0x1e in front (`\x1e\x1e...`), which readers remove.
//! Writing a chunk of lines is then one `writev` of the bytes as read, with no per-line copy.
//!
//! **Format 1** (gpuvisor before issue 21): every line behind its own stamp and stream,
//! `2026-11-21T23:25:16.123Z O text`. Readers take both: a file is format 2 from its first
//! marker line on.
//!
//! No I/O policy here (when to rotate, what to do when a write fails): that is the pump's.

use std::fs::File;
use std::io::{self, IoSlice, Read, Seek, SeekFrom, Write};
use std::path::Path;

/// The first byte of every marker line (ASCII RS).
pub const MARK: u8 = 0x1e;
/// The first line of a format-2 file.
pub const HEADER: &[u8] = b"\x1egpuvisor-log 2\n";
/// Length of a stamp: `2026-11-21T23:25:16.123Z`.
pub const STAMP_LEN: usize = 24;

/// Which pipe a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The child's standard output (`O`).
    Stdout,
    /// Its standard error (`E`).
    Stderr,
}

impl Stream {
    fn tag(self) -> u8 {
        match self {
            Stream::Stdout => b'O',
            Stream::Stderr => b'E',
        }
    }
}

/// Writes runs of lines to one log file in format 2; one per open file (a new one after
/// rotation, so the new file starts with its own header and marker).
#[derive(Debug)]
pub struct LogWriter {
    header_due: bool,
    /// The stamp and stream of the marker above the end of the file; `None`: the next write
    /// starts with a marker.
    last: Option<([u8; STAMP_LEN], Stream)>,
    /// The header and marker of the write being made (kept for its capacity).
    lead: Vec<u8>,
}

impl LogWriter {
    /// A writer appending to a file that is `length` bytes long now (0: a new file, which gets
    /// the header first).
    pub fn for_file(length: u64) -> LogWriter {
        LogWriter {
            header_due: length == 0,
            last: None,
            lead: Vec::with_capacity(HEADER.len() + STAMP_LEN + 4),
        }
    }

    /// Writes lines of `stream` read at `stamp` (RFC 3339 to the millisecond, UTC): the bytes of
    /// `carried` then `fresh`, which together are whole lines; `carried` holds no newline (the
    /// start of a line from an earlier read). A last line without its newline gets one. One
    /// `writev` unless a line starts with [`MARK`]. Returns the bytes written.
    pub fn write(
        &mut self,
        out: &mut impl Write,
        stamp: &str,
        stream: Stream,
        carried: &[u8],
        fresh: &[u8],
    ) -> io::Result<u64> {
        self.lead.clear();
        if self.header_due {
            self.lead.extend_from_slice(HEADER);
        }
        let stamp_bytes: [u8; STAMP_LEN] = stamp
            .as_bytes()
            .try_into()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "not a stamp"))?;
        if self.last != Some((stamp_bytes, stream)) {
            self.lead.push(MARK);
            self.lead.extend_from_slice(&stamp_bytes);
            self.lead.extend_from_slice(&[b' ', stream.tag(), b'\n']);
        }
        let ends_line = match fresh.last().or(carried.last()) {
            Some(&last) => last == b'\n',
            None => return Ok(0),
        };
        let newline: &[u8] = if ends_line { b"" } else { b"\n" };
        let result =
            if memchr::memchr(MARK, carried).is_none() && memchr::memchr(MARK, fresh).is_none() {
                let mut slices = [
                    IoSlice::new(&self.lead),
                    IoSlice::new(carried),
                    IoSlice::new(fresh),
                    IoSlice::new(newline),
                ];
                write_all_vectored(out, &mut slices)
            } else {
                let mut slices = vec![IoSlice::new(&self.lead)];
                escaped_slices(carried, fresh, &mut slices);
                slices.push(IoSlice::new(newline));
                write_all_vectored(out, &mut slices)
            };
        match result {
            Ok(written) => {
                self.header_due = false;
                self.last = Some((stamp_bytes, stream));
                Ok(written)
            }
            Err(error) => {
                // What reached the file is unknown: the next write states its marker again.
                self.last = None;
                Err(error)
            }
        }
    }
}

/// `carried` + `fresh` as slices with a [`MARK`] put before every line that starts with one.
fn escaped_slices<'a>(carried: &'a [u8], fresh: &'a [u8], slices: &mut Vec<IoSlice<'a>>) {
    const ESCAPE: &[u8] = &[MARK];
    // `carried` is at most the start of one line.
    if carried.first() == Some(&MARK) {
        slices.push(IoSlice::new(ESCAPE));
    }
    slices.push(IoSlice::new(carried));
    let mut from = 0;
    for at in memchr::memchr_iter(MARK, fresh) {
        let line_start = match at {
            0 => carried.is_empty(),
            _ => fresh[at - 1] == b'\n',
        };
        if line_start {
            slices.push(IoSlice::new(&fresh[from..at]));
            slices.push(IoSlice::new(ESCAPE));
            from = at;
        }
    }
    slices.push(IoSlice::new(&fresh[from..]));
}

fn write_all_vectored(out: &mut impl Write, mut slices: &mut [IoSlice<'_>]) -> io::Result<u64> {
    let mut written = 0u64;
    // Empty slices would make a zero-byte write look like a full disk.
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match out.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(count) => {
                written += count as u64;
                IoSlice::advance_slices(&mut slices, count);
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(written)
}

mod read;

pub use read::{parse, read_tail, Line, LineReader, LogLine};

#[cfg(test)]
mod tests;

pub mod direct;
