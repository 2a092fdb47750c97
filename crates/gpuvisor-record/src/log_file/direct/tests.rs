use super::*;

const T1: &str = "2026-11-21T23:25:16.123Z";
const T2: &str = "2026-11-21T23:25:16.124Z";
const T3: &str = "2026-11-21T23:25:16.125Z";

/// A replica's direct logs: data appended to its files, records to its times file.
struct Logs {
    dir: tempfile::TempDir,
}

impl Logs {
    fn new() -> Logs {
        let logs = Logs {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::write(times_path(logs.dir.path(), "r"), TIMES_HEADER).unwrap();
        logs
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Appends `bytes` to the stream's file; its new length.
    fn write(&self, stream: Stream, bytes: &[u8]) -> u64 {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(stream_path(self.path(), "r", stream))
            .unwrap();
        file.write_all(bytes).unwrap();
        file.metadata().unwrap().len()
    }

    fn record(&self, record: Record<'_>) {
        use std::io::Write;
        let mut text = Vec::new();
        record.write_to(&mut text);
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(times_path(self.path(), "r"))
            .unwrap();
        file.write_all(&text).unwrap();
    }

    fn reached(&self, stream: Stream, stamp: &str, bytes: &[u8]) {
        let offset = self.write(stream, bytes);
        self.record(Record::Reached {
            stream,
            stamp,
            offset,
        });
    }
}

fn texts(lines: &[LogLine]) -> Vec<(String, bool, String)> {
    lines
        .iter()
        .map(|line| (line.stamp.clone(), line.stderr, line.text.clone()))
        .collect()
}

fn owned(rows: &[(&str, bool, &str)]) -> Vec<(String, bool, String)> {
    rows.iter()
        .map(|(stamp, stderr, text)| (stamp.to_string(), *stderr, text.to_string()))
        .collect()
}

#[test]
fn records_read_back_as_written() {
    for record in [
        Record::Life {
            life: 3,
            stamp: T1,
            out_at: 10,
            err_at: 0,
        },
        Record::Reached {
            stream: Stream::Stderr,
            stamp: T2,
            offset: 12345,
        },
        Record::Rotated {
            stream: Stream::Stdout,
            offset: 4096,
        },
    ] {
        let mut text = Vec::new();
        record.write_to(&mut text);
        let line = std::str::from_utf8(&text).unwrap();
        assert_eq!(Record::parse(line.trim_end()), Some(record), "{line}");
    }
    assert_eq!(Record::parse("gpuvisor-times 3"), None);
    assert_eq!(Record::parse("O 2026-11-21T23:25:16.123Z"), None);
    assert_eq!(Record::parse("O 2026-11-21T23:25:16.123Z 5 extra"), None);
}

#[test]
fn lines_of_both_streams_merge_in_the_order_they_were_seen_with_their_times() {
    let logs = Logs::new();
    logs.reached(Stream::Stdout, T1, b"a\nb\npart");
    logs.reached(Stream::Stderr, T2, b"oops\n");
    logs.reached(Stream::Stdout, T3, b"ial\n");
    assert_eq!(
        texts(&parse_direct(logs.path(), "r")),
        owned(&[
            (T1, false, "a"),
            (T1, false, "b"),
            (T2, true, "oops"),
            (T3, false, "partial"),
        ])
    );
}

#[test]
fn a_follower_gets_each_line_once_and_only_once_it_is_dated() {
    let logs = Logs::new();
    let mut reader = DirectReader::new(logs.path(), "r");
    assert!(reader.read_new().is_empty());
    logs.reached(Stream::Stdout, T1, b"one\n");
    logs.write(Stream::Stdout, b"two\n"); // not dated yet
    assert_eq!(texts(&reader.read_new()), owned(&[(T1, false, "one")]));
    assert!(reader.read_new().is_empty());
    logs.reached(Stream::Stdout, T2, b"three\n");
    assert_eq!(
        texts(&reader.read_new()),
        owned(&[(T2, false, "two"), (T2, false, "three")])
    );
}

#[test]
fn a_new_life_ends_the_last_ones_unended_line_and_a_rotated_times_file_repeats_nothing() {
    let logs = Logs::new();
    let mut reader = DirectReader::new(logs.path(), "r");
    logs.reached(Stream::Stdout, T1, b"first\nno newline at exit");
    let out_at = logs.write(Stream::Stdout, b"");
    logs.record(Record::Life {
        life: 2,
        stamp: T2,
        out_at,
        err_at: 0,
    });
    logs.reached(Stream::Stdout, T2, b"second life\n");
    assert_eq!(
        texts(&reader.read_new()),
        owned(&[
            (T1, false, "first"),
            (T1, false, "no newline at exit"),
            (T2, false, "second life"),
        ])
    );
    // A line half written when the times file rotates stays one line.
    logs.reached(Stream::Stdout, T2, b"half ");
    assert!(reader.read_new().is_empty());
    // The times file rotates: the new one restates the life and the live starts.
    let path = times_path(logs.path(), "r");
    std::fs::rename(&path, path.with_extension("times.1")).unwrap();
    std::fs::write(&path, TIMES_HEADER).unwrap();
    let live = logs.write(Stream::Stdout, b"");
    logs.record(Record::Life {
        life: 2,
        stamp: T2,
        out_at,
        err_at: 0,
    });
    logs.record(Record::Rotated {
        stream: Stream::Stdout,
        offset: 0,
    });
    logs.record(Record::Reached {
        stream: Stream::Stdout,
        stamp: T2,
        offset: live,
    });
    logs.reached(Stream::Stdout, T3, b"and after\n");
    assert_eq!(
        texts(&reader.read_new()),
        owned(&[(T3, false, "half and after")])
    );
}

#[test]
fn rotated_out_bytes_are_skipped() {
    let logs = Logs::new();
    logs.reached(Stream::Stdout, T1, b"old 1\nold 2\n");
    let cut = logs.write(Stream::Stdout, b"");
    logs.record(Record::Rotated {
        stream: Stream::Stdout,
        offset: cut,
    });
    logs.reached(Stream::Stdout, T2, b"new\n");
    let fresh = DirectReader::new(logs.path(), "r").read_new();
    // A reader from the start reads the old lines' records first, then skips to the cut.
    assert_eq!(
        texts(&fresh).last().unwrap(),
        &(T2.to_string(), false, "new".to_string())
    );
}

#[test]
fn a_tail_has_whole_lines_of_the_life_asked_for() {
    let logs = Logs::new();
    logs.reached(Stream::Stdout, T1, b"life one\n");
    let out_at = logs.write(Stream::Stdout, b"");
    logs.record(Record::Life {
        life: 2,
        stamp: T2,
        out_at,
        err_at: 0,
    });
    logs.reached(Stream::Stdout, T2, b"aaaaaaaaaa\nbbb\n");
    logs.reached(Stream::Stderr, T3, b"Traceback\n");
    let tail = read_tail_direct(logs.path(), "r", 10, [out_at, 0]).unwrap();
    assert_eq!(
        texts(&tail),
        owned(&[(T2, false, "bbb"), (T3, true, "Traceback")])
    );
    let life = read_tail_direct(logs.path(), "r", 1 << 20, [out_at, 0]).unwrap();
    assert_eq!(life.len(), 3, "{life:?}");
    let all = read_tail_direct(logs.path(), "r", 1 << 20, [0, 0]).unwrap();
    assert_eq!(all[0].text, "life one");
}
