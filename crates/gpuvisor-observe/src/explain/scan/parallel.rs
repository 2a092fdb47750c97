//! Matching a log's blocks on several threads, merged in order into one [`Scan`].
//!
//! The reader (the calling thread) cuts the log into blocks of whole lines; workers match each
//! block into a scan of its own, with line numbers counted from the block's start; the reader
//! merges those scans in log order. The merged scan is the one a single pass would have made
//! (hits kept, counts, figures, closest-rule lines), which `merge_is_the_single_pass` checks.
//! A line longer than a block is cut into pieces that belong to one line number, so such a
//! piece, and the block after it, are matched on the reader's scan itself, in order.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use super::{Hit, PatternHits, Role, Row, Scan, BLOCK_BYTES, FIRST_HITS, MAX_ROWS};

/// A block sent to a worker: its place in the log and its bytes.
type Job = (u64, Vec<u8>);
/// A matched block: its place, its buffer (for reuse) and what it held.
type Done<'a> = (u64, Vec<u8>, Scan<'a>);

/// Reads `reader` to the end with `workers` threads matching blocks.
pub(super) fn read_all(
    scan: &mut Scan<'_>,
    mut reader: impl Read,
    workers: usize,
) -> io::Result<()> {
    let compiled = scan.compiled;
    std::thread::scope(|scope| {
        let (job_sender, job_receiver) = mpsc::sync_channel::<Job>(workers);
        let job_receiver = Arc::new(Mutex::new(job_receiver));
        let (done_sender, done_receiver) = mpsc::channel::<Done>();
        for _ in 0..workers {
            let jobs = Arc::clone(&job_receiver);
            let done = done_sender.clone();
            scope.spawn(move || loop {
                // The lock is held only while waiting for the next job.
                let job = jobs
                    .lock()
                    .map_err(|_| ())
                    .and_then(|jobs| jobs.recv().map_err(|_| ()));
                let Ok((place, block)) = job else { return };
                let mut part = Scan::new(compiled);
                part.block(&block);
                if done.send((place, block, part)).is_err() {
                    return;
                }
            });
        }
        drop(done_sender);
        let mut pipeline = Pipeline {
            jobs: Some(job_sender),
            done: done_receiver,
            sent: 0,
            merged: 0,
            waiting: BTreeMap::new(),
            spare: Vec::new(),
            limit: 2 * workers as u64,
        };
        let result = pipeline.feed(scan, &mut reader);
        // Closing the job queue ends the workers; what they still finish is merged or dropped.
        pipeline.jobs = None;
        if result.is_ok() {
            pipeline.drain(scan, 0);
        }
        result
    })
}

struct Pipeline<'a> {
    jobs: Option<SyncSender<Job>>,
    done: Receiver<Done<'a>>,
    /// Blocks sent to the workers, and blocks merged so far.
    sent: u64,
    merged: u64,
    /// Matched blocks that arrived before an earlier one.
    waiting: BTreeMap<u64, (Vec<u8>, Scan<'a>)>,
    /// Buffers back from the workers.
    spare: Vec<Vec<u8>>,
    /// Most blocks in flight (bounds memory).
    limit: u64,
}

impl<'a> Pipeline<'a> {
    fn feed(&mut self, scan: &mut Scan<'a>, reader: &mut impl Read) -> io::Result<()> {
        let mut carry: Vec<u8> = Vec::new();
        // Whether the next block starts a line (the previous one ended with a newline).
        let mut at_line_start = true;
        loop {
            let mut buffer = self.spare.pop().unwrap_or_default();
            buffer.clear();
            buffer.extend_from_slice(&carry);
            buffer.resize(BLOCK_BYTES.max(carry.len()), 0);
            let mut filled = carry.len();
            while filled < buffer.len() {
                match reader.read(&mut buffer[filled..]) {
                    Ok(0) => break,
                    Ok(read) => filled += read,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(error) => return Err(error),
                }
            }
            let end_of_input = filled < buffer.len();
            let cut = match memchr::memrchr(b'\n', &buffer[..filled]) {
                Some(last) if !end_of_input => last + 1,
                // The last block, or a piece of a line longer than a block.
                _ => filled,
            };
            carry.clear();
            carry.extend_from_slice(&buffer[cut..filled]);
            buffer.truncate(cut);
            let ends_line = buffer.last() == Some(&b'\n');
            if at_line_start && ends_line {
                self.send(scan, buffer);
            } else if !buffer.is_empty() {
                // A piece of an over-long line, or the block finishing one: in order, here.
                self.drain(scan, 0);
                scan.block(&buffer);
                self.spare.push(buffer);
            }
            at_line_start = ends_line || (at_line_start && cut == 0);
            if end_of_input {
                return Ok(());
            }
        }
    }

    fn send(&mut self, scan: &mut Scan<'a>, block: Vec<u8>) {
        self.drain(scan, self.limit - 1);
        let jobs = self.jobs.as_ref().expect("open while feeding");
        if let Err(mpsc::SendError((_, block))) = jobs.send((self.sent, block)) {
            // No worker left (they only stop when the queue closes): match it here.
            scan.block(&block);
            return;
        }
        self.sent += 1;
    }

    /// Merges finished blocks in order until at most `in_flight` remain unmerged.
    fn drain(&mut self, scan: &mut Scan<'a>, in_flight: u64) {
        while self.sent - self.merged > in_flight {
            while let Some((block, part)) = self.waiting.remove(&self.merged) {
                scan.merge(part);
                self.spare.push(block);
                self.merged += 1;
                if self.sent - self.merged <= in_flight {
                    return;
                }
            }
            let Ok((place, block, part)) = self.done.recv() else {
                return;
            };
            self.waiting.insert(place, (block, part));
        }
    }
}

impl<'a> Scan<'a> {
    /// Appends what `later` saw in the block after everything this scan has seen; `later`
    /// counted its lines from 1 and started at the start of a line.
    fn merge(&mut self, later: Scan<'a>) {
        let offset = self.newlines;
        let shift = |line: u64| if line == 0 { 0 } else { line + offset };
        for (index, hits) in later.hits.into_iter().enumerate() {
            let role = self.compiled.patterns[index].role;
            let saturates = !matches!(role, Role::Anchor | Role::Figure(_));
            self.hits[index].append(hits, offset, saturates);
        }
        for (mine, theirs) in self.rows.iter_mut().zip(later.rows) {
            let room = MAX_ROWS.saturating_sub(mine.len());
            mine.extend(theirs.into_iter().take(room).map(|row| Row {
                line: row.line + offset,
                ..row
            }));
        }
        for (mine, theirs) in self.figures.iter_mut().zip(later.figures) {
            if let Some(mut value) = theirs {
                value.line += offset;
                *mine = Some(value);
            }
        }
        for rule in 0..self.anchor_lines.len() {
            self.anchor_lines[rule] += later.anchor_lines[rule];
            self.near_lines[rule] += later.near_lines[rule];
            if later.last_anchor_line[rule] != 0 {
                self.last_anchor_line[rule] = shift(later.last_anchor_line[rule]);
            }
            if later.last_near_line[rule] != 0 {
                self.last_near_line[rule] = shift(later.last_near_line[rule]);
            }
        }
        for (mine, theirs) in self.near_first.iter_mut().zip(later.near_first) {
            if mine.is_none() {
                *mine = theirs.map(|hit| Hit {
                    line: hit.line + offset,
                    ..hit
                });
            }
        }
        self.newlines += later.newlines;
        self.bytes += later.bytes;
        self.ended_with_newline = later.ended_with_newline;
    }
}

impl PatternHits {
    /// Appends a later block's hits, as if recorded one by one after these: the kept ones are
    /// replayed (the first few, then the ring of last ones ends with the latest), and the count
    /// adds up; a pattern that stops at its first few stops here too.
    fn append(&mut self, later: PatternHits, offset: u64, saturates: bool) {
        let total = self.count + later.count;
        for hit in later.first.into_iter().chain(later.last) {
            if saturates && self.count >= FIRST_HITS as u64 {
                break;
            }
            self.record(hit.line + offset, &hit.text);
        }
        if !saturates {
            self.count = total;
        }
    }
}

/// Threads for matching: the cores there are (at most 4), or `GPUVISOR_EXPLAIN_THREADS`.
pub(super) fn workers() -> usize {
    std::env::var("GPUVISOR_EXPLAIN_THREADS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(usize::from)
                .unwrap_or(1)
                .min(4)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explain::rules::{parse_rules, BUILTIN_RULES};
    use crate::explain::scan::Compiled;

    /// Everything a scan hands on, as text.
    fn state(scan: &Scan) -> String {
        format!(
            "{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{}",
            scan.hits,
            scan.figures,
            scan.rows,
            scan.anchor_lines,
            scan.near_lines,
            scan.near_first,
            (scan.bytes, scan.lines(), scan.ended_with_newline),
            scan.hits.iter().map(|hits| hits.count).sum::<u64>(),
        )
    }

    /// The rules' own test logs, failures and near misses, spread between ordinary lines over
    /// several blocks, with lines longer than a block among them.
    fn mixed_log() -> Vec<u8> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/logs");
        let mut failures = Vec::new();
        for rule in std::fs::read_dir(dir).unwrap() {
            for file in std::fs::read_dir(rule.unwrap().path()).unwrap() {
                failures.push(std::fs::read(file.unwrap().path()).unwrap());
            }
        }
        failures.sort();
        let mut log = Vec::new();
        for (round, failure) in failures.iter().cycle().take(2 * failures.len()).enumerate() {
            for step in 0..(round % 5) * 150 {
                log.extend_from_slice(
                    format!("step {step} | loss 0.{round}{step} | [collector-1] CUDA ok\n")
                        .as_bytes(),
                );
            }
            if round % 40 == 5 {
                // A line longer than a block, with a failure inside it, not ending the block.
                log.extend(std::iter::repeat_n(b'x', BLOCK_BYTES + 17));
                log.extend_from_slice(b" CUDA out of memory. Tried to allocate 2.00 GiB\n");
            }
            log.extend_from_slice(failure);
            log.push(b'\n');
        }
        log
    }

    #[test]
    fn merge_is_the_single_pass() {
        let compiled = Compiled::new(&parse_rules(BUILTIN_RULES).unwrap()).unwrap();
        let log = mixed_log();
        assert!(log.len() > 4 * BLOCK_BYTES, "{} bytes", log.len());
        let mut single = Scan::new(&compiled);
        single.read_all_here(&log[..]).unwrap();
        for workers in [2, 3] {
            // A reader that returns little at a time, as a pipe does.
            let mut parallel = Scan::new(&compiled);
            read_all(&mut parallel, Trickle(&log[..]), workers).unwrap();
            assert_eq!(state(&single), state(&parallel), "{workers} workers");
        }
        // Without a final newline too.
        let cut = &log[..log.len() - 3];
        let mut single = Scan::new(&compiled);
        single.read_all_here(cut).unwrap();
        let mut parallel = Scan::new(&compiled);
        read_all(&mut parallel, cut, 2).unwrap();
        assert_eq!(state(&single), state(&parallel));
    }

    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = out.len().min(self.0.len()).min(70_000);
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }
}
