use super::*;

const T1: &str = "2026-11-21T23:25:16.123Z";
const T2: &str = "2026-11-21T23:25:16.124Z";

fn line(stamp: &str, stderr: bool, text: &str) -> LogLine {
    LogLine {
        stamp: stamp.to_string(),
        stderr,
        text: text.to_string(),
    }
}

/// A new file with these writes (stamp, stream, carried, fresh), as text.
fn written(writes: &[(&str, Stream, &[u8], &[u8])]) -> String {
    let mut file = Vec::new();
    let mut writer = LogWriter::for_file(0);
    for &(stamp, stream, carried, fresh) in writes {
        writer
            .write(&mut file, stamp, stream, carried, fresh)
            .unwrap();
    }
    String::from_utf8(file).unwrap()
}

#[test]
fn a_run_of_lines_gets_one_marker_and_a_new_one_when_stream_or_time_changes() {
    let text = written(&[
        (T1, Stream::Stdout, b"", b"a\nb\n"),
        (T1, Stream::Stdout, b"c", b"d\n"),
        (T1, Stream::Stderr, b"", b"oops\n"),
        (T2, Stream::Stderr, b"", b"no newline"),
    ]);
    assert_eq!(
        text,
        format!(
            "\x1egpuvisor-log 2\n\x1e{T1} O\na\nb\ncd\n\x1e{T1} E\noops\n\x1e{T2} E\nno newline\n"
        )
    );
    assert_eq!(
        parse(&text),
        [
            line(T1, false, "a"),
            line(T1, false, "b"),
            line(T1, false, "cd"),
            line(T1, true, "oops"),
            line(T2, true, "no newline"),
        ]
    );
}

#[test]
fn a_file_appended_to_gets_no_second_header_but_its_marker_again() {
    let mut file = Vec::new();
    LogWriter::for_file(10)
        .write(&mut file, T1, Stream::Stdout, b"", b"x\n")
        .unwrap();
    assert_eq!(file, format!("\x1e{T1} O\nx\n").into_bytes());
}

#[test]
fn a_child_s_line_starting_with_the_mark_is_escaped_and_read_back_as_written() {
    // At the start of a read, after a newline, at the start of a carried line; one in the
    // middle of a line and one that continues a carried line are left alone.
    let fresh = b"\x1efirst\nmid\x1edle\n\x1e2026-11-21T23:25:16.123Z E\nlast";
    let text = written(&[
        (T1, Stream::Stdout, b"", fresh),
        (T1, Stream::Stdout, b"\x1ecarried", b"\x1e\n"),
        (T1, Stream::Stdout, b"carried", b"\x1e\n"),
    ]);
    assert!(
        text.contains("\n\x1e\x1efirst\nmid\x1edle\n\x1e\x1e2026"),
        "{text:?}"
    );
    let texts: Vec<String> = parse(&text).into_iter().map(|line| line.text).collect();
    assert_eq!(
        texts,
        [
            "\x1efirst",
            "mid\x1edle",
            "\x1e2026-11-21T23:25:16.123Z E",
            "last",
            "\x1ecarried\x1e",
            "carried\x1e"
        ]
    );
    assert!(parse(&text)
        .iter()
        .all(|line| line.stamp == T1 && !line.stderr));
}

#[test]
fn format_1_files_read_as_before() {
    let text = format!("{T1} O step 1\n{T2} E boom\nnot stamped\n");
    assert_eq!(
        parse(&text),
        [
            line(T1, false, "step 1"),
            line(T2, true, "boom"),
            line("", false, "not stamped"),
        ]
    );
}

#[test]
fn in_format_2_a_line_that_looks_stamped_is_the_child_s_text() {
    let text = format!("\x1egpuvisor-log 2\n\x1e{T1} E\n{T2} O nested gpuvisor\n");
    assert_eq!(
        parse(&text),
        [line(T1, true, &format!("{T2} O nested gpuvisor"))]
    );
}

#[test]
fn a_tail_gets_its_time_from_the_marker_above_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.log");
    let mut file = std::fs::File::create(&path).unwrap();
    let mut writer = LogWriter::for_file(0);
    let many: String = (0..2000).map(|n| format!("line {n}\n")).collect();
    writer
        .write(&mut file, T1, Stream::Stderr, b"", b"\x1eescaped\n")
        .unwrap();
    writer
        .write(&mut file, T2, Stream::Stdout, b"", many.as_bytes())
        .unwrap();
    let tail = read_tail(&path, 100).unwrap();
    assert_eq!(tail.last(), Some(&line(T2, false, "line 1999")));
    assert!(tail.iter().all(|line| line.stamp == T2 && !line.stderr));
    assert!(tail.len() > 5);
    let whole = read_tail(&path, 1 << 20).unwrap();
    assert_eq!(whole[0], line(T1, true, "\x1eescaped"));
    assert_eq!(whole.len(), 2001);
}

#[test]
fn a_format_1_tail_keeps_its_own_stamps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.log");
    let text: String = (0..100).map(|n| format!("{T1} O line {n}\n")).collect();
    std::fs::write(&path, text).unwrap();
    let tail = read_tail(&path, 200).unwrap();
    assert_eq!(tail.last(), Some(&line(T1, false, "line 99")));
}

/// A writer that takes at most 5 bytes a call, as a slow pipe or a signal might.
struct Trickle(Vec<u8>);

impl Write for Trickle {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let count = data.len().min(5);
        self.0.extend_from_slice(&data[..count]);
        Ok(count)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn short_writes_are_finished() {
    let mut out = Trickle(Vec::new());
    let written = LogWriter::for_file(0)
        .write(&mut out, T1, Stream::Stdout, b"abc", b"def\nghi")
        .unwrap();
    let expected = format!("\x1egpuvisor-log 2\n\x1e{T1} O\nabcdef\nghi\n");
    assert_eq!(written, expected.len() as u64);
    assert_eq!(out.0, expected.as_bytes());
}
