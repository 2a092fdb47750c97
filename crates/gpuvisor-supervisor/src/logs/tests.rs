//! Log pump tests with real child processes writing to real pipes.

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use gpuvisor_record::log_file::{self, LogLine};

use super::*;

/// The child's lines in a log file, through the one parser of the format.
fn read_log(path: &std::path::Path) -> Vec<LogLine> {
    log_file::parse(&std::fs::read_to_string(path).unwrap_or_default())
}

fn pump(dir: &std::path::Path, max_file_bytes: u64) -> (LogPump, mpsc::Receiver<LogEvent>) {
    let (sender, receiver) = mpsc::channel();
    let sender = std::sync::Mutex::new(sender);
    let pump = LogPump::start(
        LogConfig {
            dir: dir.to_path_buf(),
            max_file_bytes,
            keep_rotated: 2,
        },
        vec!["writer".into(), "other.1".into()],
        None,
        Box::new(move |event| {
            let _ = sender.lock().unwrap().send(event);
        }),
    )
    .unwrap();
    (pump, receiver)
}

fn start(pump: &LogPump, replica: usize, script: &str, ready: Option<&str>) {
    let mut child = Command::new("sh")
        .args(["-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap().into();
    let stderr = child.stderr.take().unwrap().into();
    pump.register(
        replica,
        1,
        stdout,
        stderr,
        ready.map(|text| Regex::new(text).unwrap()),
    )
    .unwrap();
    std::thread::spawn(move || child.wait());
}

fn closed(receiver: &mpsc::Receiver<LogEvent>) -> Vec<String> {
    loop {
        match receiver
            .recv_timeout(Duration::from_secs(60))
            .expect("a Closed event")
        {
            LogEvent::Closed { tail, .. } => return tail,
            LogEvent::Ready { .. } => continue,
        }
    }
}

#[test]
fn every_line_of_a_fast_writer_reaches_the_file_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (pump, events) = pump(dir.path(), u64::MAX);
    start(
        &pump,
        0,
        "seq 1 300000; echo oops >&2; printf 'no newline'",
        None,
    );
    let tail = closed(&events);
    pump.finish();
    let text = std::fs::read_to_string(dir.path().join("writer.log")).unwrap();
    let lines = log_file::parse(&text);
    assert_eq!(lines.len(), 300_002);
    let mut numbers = 0u64;
    for line in &lines {
        assert!(line.stamp.ends_with('Z'), "{line:?}");
        if let Some(number) = line.text.parse::<u64>().ok().filter(|_| !line.stderr) {
            numbers += 1;
            assert_eq!(number, numbers, "lines out of order or lost");
        }
    }
    assert_eq!(numbers, 300_000);
    assert!(lines.iter().any(|line| line.stderr && line.text == "oops"));
    // Order holds per stream: stdout's unterminated last line is its last line, while
    // stderr's `oops` may land before or after it (two pipes, read as each is ready).
    let last_out = lines.iter().rfind(|line| !line.stderr);
    assert!(
        last_out.is_some_and(|line| line.text == "no newline"),
        "{last_out:?}"
    );
    assert!(
        text.ends_with('\n'),
        "the unterminated line is ended in the file"
    );
    // Each stream's last line stays a line of its own in the tail.
    assert!(tail.iter().any(|line| line == "no newline"), "{tail:?}");
    assert!(tail.iter().any(|line| line == "oops"), "{tail:?}");
}

#[test]
fn a_stream_s_unterminated_last_line_stays_its_own_line_in_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (pump, events) = pump(dir.path(), u64::MAX);
    // stdout ends without a newline and closes first; stderr writes after it.
    start(
        &pump,
        0,
        "printf 'no newline'; exec 1>&-; sleep 0.2; echo oops >&2",
        None,
    );
    let tail = closed(&events);
    pump.finish();
    assert_eq!(tail[tail.len().saturating_sub(2)..], ["no newline", "oops"]);
}

#[test]
fn a_readiness_line_is_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    let (pump, events) = pump(dir.path(), u64::MAX);
    start(
        &pump,
        1,
        "echo starting; echo 'listening on :8080'; echo 'listening on :8080'",
        Some("listening on :\\d+"),
    );
    let mut ready = 0;
    while let LogEvent::Ready {
        replica,
        generation,
    } = events.recv_timeout(Duration::from_secs(30)).unwrap()
    {
        assert_eq!((replica, generation), (1, 1));
        ready += 1;
    }
    pump.finish();
    assert_eq!(ready, 1);
    assert!(dir.path().join("other.1.log").exists());
}

#[test]
fn files_rotate_by_size_and_keep_every_line() {
    let dir = tempfile::tempdir().unwrap();
    let (pump, events) = pump(dir.path(), 200_000);
    start(&pump, 0, "seq 1 200000", None);
    closed(&events);
    pump.finish();
    assert!(
        dir.path().join("writer.log.1").exists(),
        "the file was rotated"
    );
    assert!(
        !dir.path().join("writer.log.3").exists(),
        "only 2 rotated files are kept"
    );
    // Oldest first, what is kept is one unbroken run of lines ending with the last one.
    let mut numbers = Vec::new();
    for name in ["writer.log.2", "writer.log.1", "writer.log"] {
        let path = dir.path().join(name);
        let text = std::fs::read(&path).unwrap_or_default();
        assert!(
            text.is_empty() || text.starts_with(log_file::HEADER),
            "{name} starts with its own header and marker"
        );
        numbers.extend(read_log(&path).iter().map(|line| {
            assert!(!line.stamp.is_empty(), "{name}: {line:?}");
            line.text.parse::<u64>().unwrap()
        }));
    }
    assert_eq!(numbers.last(), Some(&200_000));
    assert!(
        numbers.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "a line went missing"
    );
    assert!(numbers.len() < 200_000, "the oldest file was dropped");
}

#[test]
fn an_endless_line_is_written_in_pieces_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (pump, events) = pump(dir.path(), u64::MAX);
    start(
        &pump,
        0,
        "head -c 200000 /dev/zero | tr '\\0' x; echo; echo after",
        None,
    );
    closed(&events);
    pump.finish();
    let lines = read_log(&dir.path().join("writer.log"));
    let xs: usize = lines
        .iter()
        .map(|line| line.text.bytes().filter(|&b| b == b'x').count())
        .sum();
    assert_eq!(xs, 200_000);
    assert!(lines.len() >= 3, "cut at least once");
    assert_eq!(lines.last().map(|line| line.text.as_str()), Some("after"));
}

/// What child `child` writes as line `number` of `stream` (`O` or `E`): its own name, then
/// letters up to a length from a fixed sequence; every 40th line is longer than a pipe's
/// buffer (64 KiB) and than the pump's reads; every 7th starts with the byte that starts the
/// file's marker lines (0x1e), which the file must escape. The `awk` in [`MIXED_WRITER`]
/// makes the same.
fn mixed_line(child: usize, stream: char, number: usize) -> String {
    let length = if number % 40 == 0 {
        70_000 + number
    } else {
        number * 7919 % 300
    };
    let alphabet = "abcdefghijklmnopqrstuvwxyz";
    let filler: String = alphabet.chars().cycle().take(length).collect();
    let mark = if number % 7 == 0 { "\x1e" } else { "" };
    format!("{mark}{child}:{stream}:{number}:{filler}")
}

const MIXED_LINES: usize = 160;

/// Writes lines 1..=MIXED_LINES to stdout, every third also to stderr, then one more line on
/// each stream without its newline, and exits.
const MIXED_WRITER: &str = r#"awk -v child="$1" -v count="$2" '
function mixed(stream, number,   length_, filler, mark) {
    length_ = (number % 40 == 0) ? 70000 + number : (number * 7919) % 300
    filler = "abcdefghijklmnopqrstuvwxyz"
    while (length(filler) < length_) filler = filler filler
    mark = (number % 7 == 0) ? sprintf("%c", 30) : ""
    return mark child ":" stream ":" number ":" substr(filler, 1, length_)
}
BEGIN {
    for (number = 1; number <= count; number++) {
        printf "%s\n", mixed("O", number)
        if (number % 3 == 0) printf "%s\n", mixed("E", number) > "/dev/stderr"
    }
    printf "%s", mixed("O", count + 1)
    printf "%s", mixed("E", count + 1) > "/dev/stderr"
}'"#;

/// The text of every line of `stream` in a log file's lines, in file order.
fn stream_lines(lines: &[LogLine], stream: char) -> Vec<&str> {
    lines
        .iter()
        .filter(|line| line.stderr == (stream == 'E'))
        .map(|line| line.text.as_str())
        .collect()
}

#[test]
fn sixty_four_children_of_mixed_line_lengths_lose_no_byte_and_keep_order() {
    let children = 64;
    let dir = tempfile::tempdir().unwrap();
    let (sender, events) = mpsc::channel();
    let sender = std::sync::Mutex::new(sender);
    let pump = LogPump::start(
        LogConfig {
            dir: dir.path().to_path_buf(),
            max_file_bytes: u64::MAX,
            keep_rotated: 1,
        },
        (0..children)
            .map(|child| format!("mixed.{child}"))
            .collect(),
        None,
        Box::new(move |event| {
            let _ = sender.lock().unwrap().send(event);
        }),
    )
    .unwrap();
    for child in 0..children {
        let script = format!("set -- {child} {MIXED_LINES}; {MIXED_WRITER}");
        start(&pump, child, &script, None);
    }
    for _ in 0..children {
        closed(&events);
    }
    pump.finish();
    for child in 0..children {
        let text = read_log(&dir.path().join(format!("mixed.{child}.log")));
        assert_mixed_lines(child, &text);
    }
}

/// Every byte child `child` of [`MIXED_WRITER`] wrote is in `lines`, in order per stream; a
/// line longer than a read is in pieces that, joined, are the line, and every line the child
/// wrote starts a line read back.
fn assert_mixed_lines(child: usize, lines: &[LogLine]) {
    for stream in ['O', 'E'] {
        let numbers =
            (1..=MIXED_LINES + 1).filter(|n| stream == 'O' || n % 3 == 0 || *n == MIXED_LINES + 1);
        let expected: Vec<String> = numbers.map(|n| mixed_line(child, stream, n)).collect();
        let written = stream_lines(lines, stream);
        let (written_bytes, expected_bytes) = (written.concat(), expected.concat());
        let first_difference = written_bytes
            .bytes()
            .zip(expected_bytes.bytes())
            .position(|(got, wanted)| got != wanted);
        assert!(
            written_bytes == expected_bytes,
            "child {child}, stream {stream}: bytes lost, added or out of order ({} bytes \
             written, {} expected, first difference at {first_difference:?})",
            written_bytes.len(),
            expected_bytes.len()
        );
        let mut starts = std::collections::HashSet::new();
        let mut at = 0;
        for piece in &written {
            starts.insert(at);
            at += piece.len();
        }
        let mut at = 0;
        for line in &expected {
            assert!(
                starts.contains(&at),
                "child {child}, stream {stream}: a line does not start a line of the file"
            );
            at += line.len();
        }
    }
}

// Direct logs (`logs = "direct"`): the child writes its files itself, the pump dates them.

/// Starts `script` with its stdout and stderr on replica `stem`'s direct log files, as the
/// spawner does, and registers it as life `life`; waits for it to exit, then tells the pump.
fn start_direct(
    pump: &LogPump,
    replica: usize,
    stem: &str,
    life: u64,
    script: &str,
    ready: Option<&str>,
) -> std::thread::JoinHandle<()> {
    use gpuvisor_record::log_file::direct;
    let open = |path: std::path::PathBuf| {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        let length = file.metadata().unwrap().len();
        (file, length)
    };
    let (stdout, stdout_at) = open(direct::out_path(pump.dir(), stem));
    let (stderr, stderr_at) = open(direct::err_path(pump.dir(), stem));
    let mut child = Command::new("sh")
        .args(["-c", script])
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    pump.register_output(
        replica,
        Some(stem.to_string()),
        life,
        StartedOutput::Files {
            stdout_at,
            stderr_at,
        },
        ready.map(|text| Regex::new(text).unwrap()),
    )
    .unwrap();
    let (sender, exited) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = child.wait();
        let _ = sender.send(());
    });
    exited.recv().unwrap();
    pump.exited(replica, life);
    waiter
}

fn direct_lines(dir: &std::path::Path, stem: &str) -> Vec<LogLine> {
    gpuvisor_record::log_file::direct::parse_direct(dir, stem)
}

#[test]
fn direct_logs_date_every_line_of_a_fast_writer_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (pump, events) = pump(dir.path(), u64::MAX);
    start_direct(
        &pump,
        0,
        "writer",
        1,
        "seq 1 300000; echo oops >&2; printf 'no newline'",
        None,
    );
    let tail = closed(&events);
    pump.finish();
    assert!(
        !dir.path().join("writer.log").exists(),
        "no pumped file for a direct replica"
    );
    let lines = direct_lines(dir.path(), "writer");
    assert_eq!(
        lines.len(),
        300_002,
        "{:?}",
        &lines[lines.len().saturating_sub(3)..]
    );
    let numbers: Vec<u64> = lines
        .iter()
        .inspect(|line| assert!(line.stamp.ends_with('Z'), "{line:?}"))
        .filter(|line| !line.stderr)
        .filter_map(|line| line.text.parse().ok())
        .collect();
    assert!(
        numbers.iter().copied().eq(1..=300_000),
        "lines lost or out of order"
    );
    assert_eq!(
        lines.iter().rfind(|line| !line.stderr).unwrap().text,
        "no newline"
    );
    assert!(lines.iter().any(|line| line.stderr && line.text == "oops"));
    assert!(tail.iter().any(|line| line == "no newline"), "{tail:?}");
    assert!(tail.iter().any(|line| line == "oops"), "{tail:?}");
}

#[test]
fn direct_logs_of_sixty_four_children_of_mixed_line_lengths_lose_no_byte_and_keep_order() {
    let children = 64;
    let dir = tempfile::tempdir().unwrap();
    let (sender, events) = mpsc::channel();
    let sender = std::sync::Mutex::new(sender);
    let pump = LogPump::start(
        LogConfig {
            dir: dir.path().to_path_buf(),
            max_file_bytes: u64::MAX,
            keep_rotated: 1,
        },
        Vec::new(),
        None,
        Box::new(move |event| {
            let _ = sender.lock().unwrap().send(event);
        }),
    )
    .unwrap();
    let starters: Vec<_> = (0..children)
        .map(|child| {
            let pump = &pump;
            let script = format!("set -- {child} {MIXED_LINES}; {MIXED_WRITER}");
            let stem = format!("mixed.{child}");
            std::thread::scope(|scope| {
                scope
                    .spawn(move || start_direct(pump, child, &stem, 1, &script, None))
                    .join()
                    .unwrap()
            })
        })
        .collect();
    for _ in 0..children {
        closed(&events);
    }
    pump.finish();
    drop(starters);
    for child in 0..children {
        assert_mixed_lines(child, &direct_lines(dir.path(), &format!("mixed.{child}")));
    }
}

#[test]
fn direct_logs_report_a_readiness_line_once() {
    let dir = tempfile::tempdir().unwrap();
    let (pump, events) = pump(dir.path(), u64::MAX);
    start_direct(
        &pump,
        1,
        "other.1",
        1,
        "echo starting; sleep 0.05; echo 'listening on :8080' >&2; echo 'listening on :8080'",
        Some("listening on :\\d+"),
    );
    let mut ready = 0;
    while let LogEvent::Ready {
        replica,
        generation,
    } = events.recv_timeout(Duration::from_secs(30)).unwrap()
    {
        assert_eq!((replica, generation), (1, 1));
        ready += 1;
    }
    pump.finish();
    assert_eq!(ready, 1);
}

#[test]
fn direct_logs_rotate_by_size_in_place_keep_the_descriptor_and_free_the_space() {
    let dir = tempfile::tempdir().unwrap();
    // 200,000-byte files and 2 kept: about 400,000 to 600,000 live bytes.
    let (pump, events) = pump(dir.path(), 200_000);
    // Slow enough that the pump looks (and rotates) many times while it writes.
    start_direct(
        &pump,
        0,
        "writer",
        1,
        "i=0; while [ $i -lt 40 ]; do seq $((i*5000+1)) $((i*5000+5000)); i=$((i+1)); sleep 0.01; done",
        None,
    );
    closed(&events);
    pump.finish();
    let path = dir.path().join("writer.out.log");
    let live = std::fs::metadata(&path).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        live.len(),
        1_288_895,
        "the file keeps its length (seq 1 200000's bytes)"
    );
    assert!(
        live.blocks() * 512 <= 600_000 + 2 * 65_536,
        "the oldest lines' space is freed: {} bytes allocated for {}",
        live.blocks() * 512,
        live.len()
    );
    assert!(
        !dir.path().join("writer.out.log.1").exists(),
        "nothing is copied"
    );
    // What is live: one unbroken run of whole, dated lines ending with the last one.
    let lines = direct_lines(dir.path(), "writer");
    assert!(lines.iter().all(|line| !line.stamp.is_empty()));
    let numbers: Vec<u64> = lines
        .iter()
        .map(|line| line.text.parse::<u64>().unwrap())
        .collect();
    assert_eq!(numbers.last(), Some(&200_000));
    assert!(
        numbers.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "a line went missing"
    );
    let live_bytes: usize = lines.iter().map(|line| line.text.len() + 1).sum();
    assert!(
        (400_000..=600_000 + 65_536).contains(&live_bytes),
        "about two files' worth stays: {live_bytes} bytes"
    );
}

#[test]
fn a_direct_replica_s_tail_is_its_last_life_s() {
    let dir = tempfile::tempdir().unwrap();
    let (pump, events) = pump(dir.path(), u64::MAX);
    start_direct(
        &pump,
        0,
        "writer",
        1,
        "echo first life; echo its error >&2",
        None,
    );
    let first = closed(&events);
    start_direct(&pump, 0, "writer", 2, "echo second life", None);
    let second = closed(&events);
    pump.finish();
    assert_eq!(first, ["first life", "its error"]);
    assert_eq!(second, ["second life"]);
    let texts: Vec<String> = direct_lines(dir.path(), "writer")
        .into_iter()
        .map(|line| line.text)
        .collect();
    assert_eq!(texts, ["first life", "its error", "second life"]);
}
