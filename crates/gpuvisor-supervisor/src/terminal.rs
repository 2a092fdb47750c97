//! The terminal side of the logs: a bounded queue of output chunks and one writer thread that
//! prints each line behind a `name[replica] |` prefix (coloured only on a TTY).
//!
//! The pump never waits for the terminal: when the queue is full, the OLDEST queued lines make
//! room for the new ones (the log files keep them all), counted per replica; the writer prints
//! the count the next time it gets to that replica. Dropping the oldest keeps the end of the
//! output, where a traceback is, on the screen.

use std::collections::VecDeque;
use std::io::{self, IsTerminal, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Complete lines of one replica's output.
#[derive(Debug)]
struct Chunk {
    replica: usize,
    bytes: Vec<u8>,
}

#[derive(Debug, Default)]
struct Queue {
    chunks: VecDeque<Chunk>,
    lines: usize,
    dropped: Vec<u64>,
    closed: bool,
}

/// The sending side, held by the log pump.
#[derive(Debug, Clone)]
pub struct TerminalQueue {
    shared: Arc<(Mutex<Queue>, Condvar)>,
    capacity_lines: usize,
}

/// The writer thread.
#[derive(Debug)]
pub struct TerminalWriter {
    queue: TerminalQueue,
    thread: JoinHandle<()>,
}

impl TerminalQueue {
    /// Queues `parts` (together complete lines, `lines` of them) of `replica`; when the queue
    /// is full, drops the oldest queued chunks to make room. Never blocks on the terminal.
    pub fn push(&self, replica: usize, lines: usize, parts: &[&[u8]]) {
        let (lock, ready) = &*self.shared;
        let mut queue = lock.lock().unwrap_or_else(|poison| poison.into_inner());
        while queue.lines + lines > self.capacity_lines {
            let Some(oldest) = queue.chunks.pop_front() else {
                break;
            };
            let oldest_lines = bytecount_lines(&oldest.bytes);
            queue.lines = queue.lines.saturating_sub(oldest_lines);
            if queue.dropped.len() <= oldest.replica {
                queue.dropped.resize(oldest.replica + 1, 0);
            }
            queue.dropped[oldest.replica] += oldest_lines as u64;
        }
        queue.lines += lines;
        queue.chunks.push_back(Chunk {
            replica,
            bytes: parts.concat(),
        });
        ready.notify_one();
    }

    /// Lines dropped so far for each replica.
    pub fn dropped(&self) -> Vec<u64> {
        let queue = self
            .shared
            .0
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        queue.dropped.clone()
    }
}

impl TerminalWriter {
    /// Starts a writer printing to stdout with these replica labels; `capacity_lines` bounds
    /// the queue.
    pub fn start(labels: Vec<String>, capacity_lines: usize) -> TerminalWriter {
        let queue = TerminalQueue {
            shared: Arc::new((Mutex::new(Queue::default()), Condvar::new())),
            capacity_lines,
        };
        let color = io::stdout().is_terminal() && color_supported();
        let width = labels.iter().map(|label| label.len()).max().unwrap_or(0);
        let prefixes: Vec<Vec<u8>> = labels
            .iter()
            .enumerate()
            .map(|(index, label)| prefix(label, width, color.then_some(index)))
            .collect();
        let shared = Arc::clone(&queue.shared);
        let thread = std::thread::Builder::new()
            .name("gpuvisor-terminal".into())
            .spawn(move || write_loop(&shared, &prefixes))
            .expect("start the terminal thread");
        TerminalWriter { queue, thread }
    }

    /// The queue to push to.
    pub fn queue(&self) -> TerminalQueue {
        self.queue.clone()
    }

    /// Prints what is queued, then stops the thread.
    pub fn finish(self) {
        {
            let (lock, ready) = &*self.queue.shared;
            lock.lock()
                .unwrap_or_else(|poison| poison.into_inner())
                .closed = true;
            ready.notify_one();
        }
        let _ = self.thread.join();
    }
}

/// Lines in a chunk of complete lines.
fn bytecount_lines(bytes: &[u8]) -> usize {
    memchr::memchr_iter(b'\n', bytes).count()
}

fn prefix(label: &str, width: usize, color: Option<usize>) -> Vec<u8> {
    const COLORS: [u8; 6] = [36, 33, 32, 35, 34, 31];
    let padded = format!("{label:<width$} | ");
    match color {
        Some(index) => {
            format!("\x1b[{}m{padded}\x1b[0m", COLORS[index % COLORS.len()]).into_bytes()
        }
        None => padded.into_bytes(),
    }
}

fn write_loop(shared: &(Mutex<Queue>, Condvar), prefixes: &[Vec<u8>]) {
    let (lock, ready) = shared;
    let stdout = io::stdout();
    let mut out = io::BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut reported = vec![0u64; prefixes.len()];
    loop {
        let (batch, dropped, closed) = {
            let mut queue = lock.lock().unwrap_or_else(|poison| poison.into_inner());
            while queue.chunks.is_empty() && !queue.closed {
                queue = ready
                    .wait(queue)
                    .unwrap_or_else(|poison| poison.into_inner());
            }
            let batch: Vec<Chunk> = queue.chunks.drain(..).collect();
            queue.lines = 0;
            (batch, queue.dropped.clone(), queue.closed)
        };
        for (replica, &count) in dropped.iter().enumerate() {
            if count > reported[replica] && replica < prefixes.len() {
                let _ = out.write_all(&prefixes[replica]);
                let _ = writeln!(
                    out,
                    "[gpuvisor: {} lines not shown here, all are in the log file]",
                    count - reported[replica]
                );
                reported[replica] = count;
            }
        }
        for chunk in batch {
            let Some(prefix) = prefixes.get(chunk.replica) else {
                continue;
            };
            for line in chunk.bytes.split_inclusive(|&byte| byte == b'\n') {
                let _ = out.write_all(prefix);
                let _ = out.write_all(line);
            }
        }
        let _ = out.flush();
        if closed
            && lock
                .lock()
                .map(|queue| queue.chunks.is_empty())
                .unwrap_or(true)
        {
            return;
        }
    }
}

/// gpuvisor's one colour policy (the run's prefixes, `top`): colours only where the terminal
/// has them, and never when `NO_COLOR` is set to anything (no-color.org) or `TERM` is `dumb` or
/// unset. Callers also check that their stream is a terminal.
pub fn color_supported() -> bool {
    color_wanted(
        std::env::var("NO_COLOR").ok().as_deref(),
        std::env::var("TERM").ok().as_deref(),
    )
}

/// [`color_supported`] for given values of `NO_COLOR` and `TERM`.
pub fn color_wanted(no_color: Option<&str>, term: Option<&str>) -> bool {
    let no_color = no_color.is_some_and(|value| !value.is_empty());
    let term = term.unwrap_or_default();
    !no_color && !term.is_empty() && term != "dumb"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_the_oldest_lines_and_counts_instead_of_blocking() {
        let queue = TerminalQueue {
            shared: Arc::new((Mutex::new(Queue::default()), Condvar::new())),
            capacity_lines: 3,
        };
        queue.push(0, 2, &[b"a\n", b"b\n"]);
        queue.push(1, 2, &[b"c\nd\n"]);
        // Replica 0's older chunk made room for replica 1's; then 1's for the newest line.
        assert_eq!(queue.dropped(), vec![2]);
        queue.push(0, 2, &[b"e\nf", b"\n"]);
        assert_eq!(queue.dropped(), vec![2, 2]);
        let state = queue.shared.0.lock().unwrap();
        assert_eq!(state.lines, 2);
        let kept: Vec<&[u8]> = state
            .chunks
            .iter()
            .map(|chunk| chunk.bytes.as_slice())
            .collect();
        assert_eq!(kept, [b"e\nf\n".as_slice()], "the newest lines stay");
    }

    #[test]
    fn prefixes_are_aligned_and_plain_without_a_tty() {
        assert_eq!(prefix("actor[1]", 8, None), b"actor[1] | ".to_vec());
        assert_eq!(prefix("sim", 8, None), b"sim      | ".to_vec());
        assert!(prefix("sim", 3, Some(0)).starts_with(b"\x1b["));
    }
}
