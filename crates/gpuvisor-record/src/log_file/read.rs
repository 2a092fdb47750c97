//! Reading log files back, both formats (see the module above).

use super::*;

/// How far above a tail [`read_tail`] looks for the marker that dates its first lines.
const MARKER_LOOKBACK: u64 = 1 << 20;

/// A line of the child's output, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// When gpuvisor read it (`2026-11-21T23:25:16.123Z`); empty when the file does not say
    /// (a line above a tail's first marker, or not written by gpuvisor).
    pub stamp: String,
    /// From standard error.
    pub stderr: bool,
    /// The line as the child wrote it, without its newline.
    pub text: String,
}

/// A line borrowed from the reader and the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line<'a> {
    /// As [`LogLine::stamp`].
    pub stamp: &'a str,
    /// As [`LogLine::stderr`].
    pub stderr: bool,
    /// As [`LogLine::text`].
    pub text: &'a str,
}

impl Line<'_> {
    /// An owned copy.
    pub fn to_owned(&self) -> LogLine {
        LogLine {
            stamp: self.stamp.to_string(),
            stderr: self.stderr,
            text: self.text.to_string(),
        }
    }
}

/// Reads a log file's lines in order, keeping what the markers said; feed it every line (with
/// or without its newline), marker lines included.
#[derive(Debug, Clone, Default)]
pub struct LineReader {
    /// Seen a format-2 line: from here on lines are the child's text as it is.
    format_2: bool,
    stamp: String,
    stderr: bool,
}

impl LineReader {
    /// A reader at the start of a file (or of a tail).
    pub fn new() -> LineReader {
        LineReader::default()
    }

    /// The child's line `raw` stands for, or `None` for a header or marker line.
    pub fn read<'a>(&'a mut self, raw: &'a str) -> Option<Line<'a>> {
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        if let Some(rest) = raw.strip_prefix(MARK as char) {
            self.format_2 = true;
            if rest.starts_with(MARK as char) {
                // A child's line that starts with the mark itself, escaped.
                return Some(Line {
                    stamp: &self.stamp,
                    stderr: self.stderr,
                    text: rest,
                });
            }
            if let Some((stamp, stderr)) = marker(rest) {
                self.stamp.clear();
                self.stamp.push_str(stamp);
                self.stderr = stderr;
            }
            // The header, or a marker kind this reader does not know: not a line of the child.
            return None;
        }
        if !self.format_2 {
            if let Some((stamp, stderr, text)) = format_1(raw) {
                return Some(Line {
                    stamp,
                    stderr,
                    text,
                });
            }
        }
        Some(Line {
            stamp: &self.stamp,
            stderr: self.stderr,
            text: raw,
        })
    }
}

/// `2026-11-21T23:25:16.123Z O` -> (stamp, stderr).
fn marker(rest: &str) -> Option<(&str, bool)> {
    let (stamp, stream) = rest.split_at_checked(STAMP_LEN)?;
    if !is_stamp(stamp) {
        return None;
    }
    match stream.split(' ').nth(1) {
        Some("O") => Some((stamp, false)),
        Some("E") => Some((stamp, true)),
        _ => None,
    }
}

/// A format-1 line, `2026-11-21T23:25:16.123Z O text` -> (stamp, stderr, text).
fn format_1(line: &str) -> Option<(&str, bool, &str)> {
    let stamp = line.get(..STAMP_LEN)?;
    if !is_stamp(stamp) {
        return None;
    }
    match line.get(STAMP_LEN..STAMP_LEN + 3)? {
        " O " => Some((stamp, false, &line[STAMP_LEN + 3..])),
        " E " => Some((stamp, true, &line[STAMP_LEN + 3..])),
        _ => None,
    }
}

fn is_stamp(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == STAMP_LEN
        && bytes[4] == b'-'
        && bytes[10] == b'T'
        && bytes[19] == b'.'
        && bytes[23] == b'Z'
}

/// Every line of the child in a log file's text (either format), in file order.
pub fn parse(text: &str) -> Vec<LogLine> {
    let mut reader = LineReader::new();
    text.lines()
        .filter_map(|raw| reader.read(raw).map(|line| line.to_owned()))
        .collect()
}

/// The child's last lines in the last `max_bytes` of a log file (the first, cut line dropped),
/// each with its time and stream: the marker that dates the first of them is looked for above
/// the tail (up to 1 MiB up).
///
/// For a replica with direct logs (format 3: `path`'s stem has a times file beside it), the
/// last lines of both its streams, merged.
pub fn read_tail(path: &Path, max_bytes: u64) -> io::Result<Vec<LogLine>> {
    if let Some((dir, stem)) = super::direct::direct_of(path) {
        return super::direct::read_tail_direct(&dir, &stem, max_bytes, [0, 0]);
    }
    let mut file = File::open(path)?;
    let length = file.metadata()?.len();
    let start = length.saturating_sub(max_bytes);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::with_capacity((length - start) as usize);
    (&mut file).take(max_bytes).read_to_end(&mut bytes)?;
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if start > 0 {
        text = match text.split_once('\n') {
            Some((_, rest)) => rest.to_string(),
            None => String::new(),
        };
    }
    let mut reader = LineReader::new();
    if start > 0 && !text.starts_with(MARK as char) {
        let first_line_at = length - text.len() as u64;
        if let Some(marker) = marker_above(&mut file, first_line_at)? {
            reader.read(&marker);
        }
    }
    Ok(text
        .lines()
        .filter_map(|raw| reader.read(raw).map(|line| line.to_owned()))
        .collect())
}

/// The nearest marker line that ends at or before `offset` (a line start), if the file is in
/// format 2 and one is within [`MARKER_LOOKBACK`].
fn marker_above(file: &mut File, offset: u64) -> io::Result<Option<String>> {
    let mut first = [0u8; 1];
    file.seek(SeekFrom::Start(0))?;
    if file.read(&mut first)? == 0 || first[0] != MARK {
        return Ok(None); // format 1: every line has its own stamp
    }
    let from = offset.saturating_sub(MARKER_LOOKBACK);
    file.seek(SeekFrom::Start(from))?;
    let mut above = Vec::new();
    (&mut *file).take(offset - from).read_to_end(&mut above)?;
    // A marker line starts the file or follows a newline; the escaped child's line (two marks)
    // is not one.
    let mut end = above.len();
    while let Some(at) = memchr::memrchr(MARK, &above[..end]) {
        end = at;
        let line_start = at == 0 && from == 0 || at > 0 && above[at - 1] == b'\n';
        if !line_start || above.get(at + 1) == Some(&MARK) {
            continue;
        }
        let line_end = memchr::memchr(b'\n', &above[at..]).map_or(above.len(), |n| at + n);
        let line = String::from_utf8_lossy(&above[at..line_end]);
        if marker(&line[1..]).is_some() {
            return Ok(Some(line.into_owned()));
        }
    }
    Ok(None)
}
