//! One replica's log file for one life: runs of lines written straight from the pump's read
//! buffer in the record's log format ([`gpuvisor_record::log_file`]), size-based rotation,
//! the readiness match, and the tail kept for exit-cause classification.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use gpuvisor_record::log_file::{LogWriter, Stream};
use regex::bytes::Regex;

/// How much of a replica's last output is kept for its exit cause.
pub(super) const TAIL_KEEP_BYTES: usize = 16 << 10;

/// One replica's output state (reset for each life).
pub(super) struct ReplicaFile {
    pub(super) generation: u64,
    file: File,
    writer: LogWriter,
    pub(super) path: PathBuf,
    file_bytes: u64,
    /// Its pipes still open.
    pub(super) open_streams: u8,
    ready: Option<Regex>,
    pub(super) tail: Vec<u8>,
}

/// What [`ReplicaFile::write_lines`] did.
pub(super) struct Written {
    /// This write matched the readiness pattern (the first time).
    pub(super) ready: bool,
    /// The write to the file failed.
    pub(super) error: Option<io::Error>,
}

impl ReplicaFile {
    /// Opens (appends to) `path` for a life of the replica.
    pub(super) fn open(
        path: PathBuf,
        generation: u64,
        ready: Option<Regex>,
    ) -> io::Result<ReplicaFile> {
        let file = open_log(&path)?;
        let file_bytes = file.metadata().map(|meta| meta.len()).unwrap_or(0);
        Ok(ReplicaFile {
            generation,
            file,
            writer: LogWriter::for_file(file_bytes),
            path,
            file_bytes,
            open_streams: 2,
            ready,
            tail: Vec::new(),
        })
    }

    /// Writes whole lines of one stream, read at `stamp`: `carried` (the start of a line from
    /// an earlier read, no newline in it) then `fresh`; a last line without its newline is
    /// ended. Rotates the file when it has grown past `max_file_bytes`.
    pub(super) fn write_lines(
        &mut self,
        stream: Stream,
        carried: &[u8],
        fresh: &[u8],
        stamp: &str,
        (max_file_bytes, keep_rotated): (u64, u32),
    ) -> Written {
        let ends_line = fresh.last().or(carried.last()) == Some(&b'\n');
        let ready = self.match_ready(carried, fresh);
        let error = match self
            .writer
            .write(&mut self.file, stamp, stream, carried, fresh)
        {
            Ok(written) => {
                self.file_bytes += written;
                None
            }
            Err(error) => Some(error),
        };
        self.keep_tail(carried, fresh, ends_line);
        if self.file_bytes > max_file_bytes {
            self.rotate(keep_rotated);
        }
        Written { ready, error }
    }

    /// Whether a line of these matches the readiness pattern (then it is not looked for again).
    fn match_ready(&mut self, carried: &[u8], fresh: &[u8]) -> bool {
        let Some(pattern) = &self.ready else {
            return false;
        };
        let found = super::matches_ready(pattern, carried, fresh);
        if found {
            self.ready = None;
        }
        found
    }

    fn keep_tail(&mut self, carried: &[u8], fresh: &[u8], ends_line: bool) {
        if fresh.len() >= TAIL_KEEP_BYTES {
            self.tail.clear();
            self.tail
                .extend_from_slice(&fresh[fresh.len() - TAIL_KEEP_BYTES..]);
        } else {
            self.tail.extend_from_slice(carried);
            self.tail.extend_from_slice(fresh);
            if self.tail.len() > 2 * TAIL_KEEP_BYTES {
                self.tail.drain(..self.tail.len() - TAIL_KEEP_BYTES);
            }
        }
        // An unterminated last line (a stream's end) is ended here too, so the other stream's
        // next line does not run on from it in the exit-cause tail.
        if !ends_line {
            self.tail.push(b'\n');
        }
    }

    /// `x.log` -> `x.log.1`, `x.log.1` -> `x.log.2`, ...; the oldest beyond `keep` is removed.
    /// The new file starts with its own header and marker.
    fn rotate(&mut self, keep: u32) {
        let numbered = |n: u32| PathBuf::from(format!("{}.{n}", self.path.display()));
        if keep == 0 {
            let _ = fs::remove_file(&self.path);
        } else {
            let _ = fs::remove_file(numbered(keep));
            for n in (1..keep).rev() {
                let _ = fs::rename(numbered(n), numbered(n + 1));
            }
            let _ = fs::rename(&self.path, numbered(1));
        }
        match open_log(&self.path) {
            Ok(file) => {
                self.file = file;
                self.file_bytes = 0;
                self.writer = LogWriter::for_file(0);
            }
            Err(error) => eprintln!("gpuvisor: cannot reopen {}: {error}", self.path.display()),
        }
    }
}

fn open_log(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}
