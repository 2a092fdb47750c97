//! The log pump: one thread that waits on every replica's stdout and stderr pipe, reads big
//! chunks, and writes each chunk's whole lines to `logs/<name>[.<replica>].log` as they were
//! read (one `writev`, the time and stream given once per run of lines: the record's
//! [`gpuvisor_record::log_file`] format) and to the terminal queue. A line's unfinished end
//! waits in a small buffer for the rest of it from the same pipe, so lines never interleave.
//! A child is never blocked by the terminal (see [`crate::terminal`]); the files keep every
//! line. Files rotate by size (`x.log` -> `x.log.1` -> ... `x.log.N`).
//!
//! It also watches for readiness lines (a regex per replica) and keeps the tail of each
//! replica's output, handed over when both pipes close, for exit-cause classification.
//!
//! A replica with direct logs (`logs = "direct"`) has no pipes: it writes its own files, and
//! the pump only dates them (see [`direct`]).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use gpuvisor_record::log_file::Stream as Pipe;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::unistd::pipe;
use regex::bytes::Regex;

use crate::clock::{now_unix_ms, rfc3339_ms};
use crate::spawn::StartedOutput;
use crate::terminal::TerminalQueue;
use direct::DirectReplica;
use direct_watch::{DirectLogs, INOTIFY_TOKEN};
use replica_file::ReplicaFile;

mod direct;
mod direct_watch;
mod replica_file;

/// How the log files are kept.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// The `logs/` directory.
    pub dir: PathBuf,
    /// A file is rotated when it grows past this many bytes.
    pub max_file_bytes: u64,
    /// Rotated files kept (`.1` .. `.N`).
    pub keep_rotated: u32,
}

/// What the pump tells the supervisor.
#[derive(Debug, Clone, PartialEq)]
pub enum LogEvent {
    /// A line of `replica` matched its readiness pattern.
    Ready {
        /// The replica.
        replica: usize,
        /// Its life (spawn counter) the line came from.
        generation: u64,
    },
    /// Both pipes of `replica` closed (its process tree is gone or closed them).
    Closed {
        /// The replica.
        replica: usize,
        /// Its life.
        generation: u64,
        /// Its last lines of output (up to [`TAIL_LINES`]).
        tail: Vec<String>,
    },
}

/// How many lines of output are kept for exit-cause classification (torchrun's failure
/// report alone is about 45 lines after the failing rank's own error line).
pub const TAIL_LINES: usize = 100;
const READ_BYTES: usize = 1 << 16;
/// Pipes handled per wake-up at most (the rest stay ready for the next `epoll_wait`).
const EVENTS_PER_WAKE: usize = 256;
/// The epoll token of the wake pipe; a stream's token is its slot in `Pump::streams` + 1.
const WAKE_TOKEN: u64 = 0;
/// How long [`LogPump::finish`] waits for pipes still open.
const FINISH_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

struct Registration {
    replica: usize,
    /// Its log file's stem when the pump was not told at the start (a replica added later).
    stem: Option<String>,
    generation: u64,
    output: StartedOutput,
    ready: Option<Regex>,
}

/// What the supervisor hands the pump thread.
enum Request {
    Register(Registration),
    /// A replica's life ended (direct logs: its last look and its exit-cause tail are due).
    Exited {
        replica: usize,
        generation: u64,
    },
}

/// The handle to the pump thread.
#[derive(Debug)]
pub struct LogPump {
    dir: PathBuf,
    sender: Sender<Request>,
    last_output: Arc<Vec<AtomicU64>>,
    wake: OwnedFd,
    thread: JoinHandle<()>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "Registration({}#{})",
            self.replica, self.generation
        )
    }
}

impl LogPump {
    /// Starts the pump; `file_stems[r]` names replica r's file (`actor.1` -> `logs/actor.1.log`).
    pub fn start(
        config: LogConfig,
        file_stems: Vec<String>,
        terminal: Option<TerminalQueue>,
        events: Box<dyn Fn(LogEvent) + Send>,
    ) -> io::Result<LogPump> {
        let (sender, receiver) = mpsc::channel();
        let dir = config.dir.clone();
        let last_output: Arc<Vec<AtomicU64>> =
            Arc::new(file_stems.iter().map(|_| AtomicU64::new(0)).collect());
        let (wake_read, wake) = pipe()?;
        set_nonblocking(&wake_read)?;
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(&wake_read, EpollEvent::new(EpollFlags::EPOLLIN, WAKE_TOKEN))?;
        let mut pump = Pump {
            config,
            file_stems,
            terminal,
            events,
            last_output: Arc::clone(&last_output),
            replicas: Vec::new(),
            streams: Vec::new(),
            free_slots: Vec::new(),
            open_streams: 0,
            epoll,
            receiver,
            wake: File::from(wake_read),
            buffer: vec![0; READ_BYTES],
            write_failures: Vec::new(),
            direct: DirectLogs::new(),
        };
        let thread = std::thread::Builder::new()
            .name("gpuvisor-logs".into())
            .spawn(move || pump.run())?;
        Ok(LogPump {
            dir,
            sender,
            last_output,
            wake,
            thread,
        })
    }

    /// When each replica (index) last wrote anything, Unix milliseconds (0: never); for stall
    /// detection.
    pub fn last_output(&self) -> Arc<Vec<AtomicU64>> {
        Arc::clone(&self.last_output)
    }

    /// The `logs/` directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Hands a started replica's pipes to the pump.
    pub fn register(
        &self,
        replica: usize,
        generation: u64,
        stdout: OwnedFd,
        stderr: OwnedFd,
        ready: Option<Regex>,
    ) -> io::Result<()> {
        self.register_as(replica, None, generation, stdout, stderr, ready)
    }

    /// [`LogPump::register`] for a replica added after the start, whose file is
    /// `logs/<stem>.log`. Its output goes to its file only, not to the terminal (whose
    /// prefixes were fixed at the start).
    pub fn register_as(
        &self,
        replica: usize,
        stem: Option<String>,
        generation: u64,
        stdout: OwnedFd,
        stderr: OwnedFd,
        ready: Option<Regex>,
    ) -> io::Result<()> {
        self.register_output(
            replica,
            stem,
            generation,
            StartedOutput::Pipes { stdout, stderr },
            ready,
        )
    }

    /// Hands a started replica's output to the pump: its pipes, or with direct logs where
    /// its files start.
    pub fn register_output(
        &self,
        replica: usize,
        stem: Option<String>,
        generation: u64,
        output: StartedOutput,
        ready: Option<Regex>,
    ) -> io::Result<()> {
        if let StartedOutput::Pipes { stdout, stderr } = &output {
            set_nonblocking(stdout)?;
            set_nonblocking(stderr)?;
        }
        let registration = Registration {
            replica,
            stem,
            generation,
            output,
            ready,
        };
        self.send(Request::Register(registration));
        Ok(())
    }

    /// Replica `replica`'s life `generation` ended: with direct logs the pump looks at its
    /// files a last time and hands over its tail ([`LogEvent::Closed`]); with pipes that
    /// happens when they close, and this does nothing.
    pub fn exited(&self, replica: usize, generation: u64) {
        self.send(Request::Exited {
            replica,
            generation,
        });
    }

    fn send(&self, request: Request) {
        if self.sender.send(request).is_ok() {
            let _ = nix::unistd::write(&self.wake, b"r");
        }
    }

    /// Waits until every registered pipe has closed, then stops the thread.
    pub fn finish(self) {
        drop(self.sender);
        let _ = nix::unistd::write(&self.wake, b"q");
        let _ = self.thread.join();
    }
}

fn set_nonblocking(fd: &impl AsFd) -> io::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

struct Stream {
    replica: usize,
    generation: u64,
    pipe: Pipe,
    file: File,
    /// The start of a line whose end has not been read yet (no newline in it).
    partial: Vec<u8>,
}

struct Pump {
    config: LogConfig,
    file_stems: Vec<String>,
    terminal: Option<TerminalQueue>,
    events: Box<dyn Fn(LogEvent) + Send>,
    last_output: Arc<Vec<AtomicU64>>,
    replicas: Vec<Option<ReplicaFile>>,
    /// Open pipes by slot (the slot + 1 is its epoll token); `None`: a free slot.
    streams: Vec<Option<Stream>>,
    free_slots: Vec<usize>,
    open_streams: usize,
    /// Every open pipe and the wake pipe: a wake-up costs the ready pipes, not all of them.
    epoll: Epoll,
    receiver: Receiver<Request>,
    wake: File,
    buffer: Vec<u8>,
    /// Failed writes per replica (the first is said on stderr).
    write_failures: Vec<u64>,
    /// Replicas with direct logs, and when they are looked at.
    direct: DirectLogs,
}

impl Pump {
    fn run(&mut self) {
        let mut accepting = true;
        let mut finishing_since = None;
        let mut ready = vec![EpollEvent::empty(); EVENTS_PER_WAKE];
        let mut stamp = Stamp::default();
        loop {
            if accepting {
                accepting = self.accept();
            }
            if !accepting {
                // Every process is gone by now; a pipe still open after a while is held by
                // something outside the job (it inherited it): stop waiting for it.
                let since = *finishing_since.get_or_insert_with(std::time::Instant::now);
                if self.open_streams == 0 || since.elapsed() > FINISH_WAIT {
                    return;
                }
            }
            let timeout: u16 = if self.direct.look_pending() { 1 } else { 500 };
            let count = match self.epoll.wait(&mut ready, timeout) {
                Ok(count) => count,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(error) => {
                    eprintln!("gpuvisor: waiting for the log pipes failed: {error}");
                    return;
                }
            };
            stamp.update();
            for event in &ready[..count] {
                let token = event.data();
                if token == INOTIFY_TOKEN {
                    self.direct.take_events();
                    continue;
                }
                if token == WAKE_TOKEN {
                    let mut drain = [0u8; 64];
                    while matches!((&self.wake).read(&mut drain), Ok(n) if n > 0) {}
                    continue;
                }
                let slot = (token - 1) as usize;
                if self.streams.get(slot).is_some_and(Option::is_some) && !self.drain(slot, &stamp)
                {
                    self.close_slot(slot, &stamp);
                }
            }
            self.look_at_direct(&stamp, !accepting);
        }
    }

    /// Looks at the direct logs that are due ([`DirectLogs::due`]).
    fn look_at_direct(&mut self, stamp: &Stamp, ending: bool) {
        for replica in self.direct.due(ending) {
            let grew = self.look(replica, stamp);
            self.direct.looked(replica, grew);
        }
        self.direct.rearm(&self.epoll);
    }

    /// One look at replica `replica`'s direct logs; whether they grew.
    fn look(&mut self, replica: usize, stamp: &Stamp) -> bool {
        let terminal = terminal_of(&self.terminal, &self.file_stems, replica);
        let Some(log) = self.direct.get_mut(replica) else {
            return false;
        };
        let limits = (self.config.max_file_bytes, self.config.keep_rotated);
        let look = match terminal {
            Some(terminal) => {
                let mut echo = |carried: &[u8], fresh: &[u8]| {
                    let lines = memchr::memchr_iter(b'\n', fresh).count();
                    terminal.push(replica, lines, &[carried, fresh]);
                };
                log.look(&stamp.text, limits, Some(&mut echo))
            }
            None => log.look(&stamp.text, limits, None),
        };
        if look.grew {
            if let Some(last) = self.last_output.get(replica) {
                last.store(stamp.unix_ms, Ordering::Relaxed);
            }
        }
        if look.ready {
            (self.events)(LogEvent::Ready {
                replica,
                generation: log.generation,
            });
        }
        if let Some(problem) = look.problem {
            self.say_once(replica, &problem);
        }
        look.grew
    }

    /// Says `problem` (a write that failed) on stderr, once per replica and run, not per read
    /// nor per life: a full disk under fast restarts would otherwise print a line for each.
    fn say_once(&mut self, replica: usize, problem: &str) {
        if self.write_failures.len() <= replica {
            self.write_failures.resize(replica + 1, 0);
        }
        self.write_failures[replica] += 1;
        if self.write_failures[replica] == 1 {
            let _ = writeln!(io::stderr(), "gpuvisor: {problem}");
        }
    }

    /// A direct replica's life ended: a last look, then its tail to the supervisor.
    fn direct_exited(&mut self, replica: usize, generation: u64) {
        let current = self
            .direct
            .get_mut(replica)
            .is_some_and(|log| log.generation == generation);
        if !current {
            return;
        }
        let mut stamp = Stamp::default();
        stamp.update();
        self.look(replica, &stamp);
        let Some(mut log) = self.direct.remove(replica) else {
            return;
        };
        let ready = match terminal_of(&self.terminal, &self.file_stems, replica) {
            Some(terminal) => log.end_lines(Some(&mut |carried: &[u8], fresh: &[u8]| {
                terminal.push(replica, 1, &[carried, fresh]);
            })),
            None => log.end_lines(None),
        };
        if ready {
            (self.events)(LogEvent::Ready {
                replica,
                generation,
            });
        }
        let tail = log.tail(replica_file::TAIL_KEEP_BYTES as u64);
        let tail = tail[tail.len().saturating_sub(TAIL_LINES)..].to_vec();
        (self.events)(LogEvent::Closed {
            replica,
            generation,
            tail,
        });
    }

    /// Starts dating a direct replica's new life.
    fn add_direct(
        &mut self,
        replica: usize,
        generation: u64,
        ready: Option<Regex>,
        stem: String,
        starts: [u64; 2],
    ) {
        let mut stamp = Stamp::default();
        stamp.update();
        let dir = &self.config.dir;
        match DirectReplica::open(dir, &stem, generation, starts, &stamp.text, ready) {
            Ok(log) => self.direct.add(replica, log, &self.epoll),
            Err(error) => {
                eprintln!("gpuvisor: cannot date the log files of {stem}: {error}");
                self.direct.remove(replica);
            }
        }
    }

    fn close_slot(&mut self, slot: usize, stamp: &Stamp) {
        let Some(stream) = self.streams[slot].take() else {
            return;
        };
        let _ = self.epoll.delete(&stream.file);
        self.free_slots.push(slot);
        self.open_streams -= 1;
        self.close_stream(stream, stamp);
    }

    /// Takes new registrations; false once the supervisor has hung up.
    fn accept(&mut self) -> bool {
        loop {
            match self.receiver.try_recv() {
                Ok(Request::Register(registration)) => self.add(registration),
                Ok(Request::Exited {
                    replica,
                    generation,
                }) => self.direct_exited(replica, generation),
                Err(mpsc::TryRecvError::Empty) => return true,
                Err(mpsc::TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn add(&mut self, registration: Registration) {
        let replica = registration.replica;
        if self.replicas.len() <= replica {
            self.replicas.resize_with(replica + 1, || None);
        }
        let stem = self
            .file_stems
            .get(replica)
            .cloned()
            .or(registration.stem)
            .unwrap_or_else(|| format!("replica-{replica}"));
        let (stdout, stderr) = match registration.output {
            StartedOutput::Files {
                stdout_at,
                stderr_at,
            } => {
                let (generation, ready) = (registration.generation, registration.ready);
                return self.add_direct(replica, generation, ready, stem, [stdout_at, stderr_at]);
            }
            StartedOutput::Pipes { stdout, stderr } => (stdout, stderr),
        };
        let path = self.config.dir.join(format!("{stem}.log"));
        match ReplicaFile::open(path.clone(), registration.generation, registration.ready) {
            Ok(file) => self.replicas[replica] = Some(file),
            Err(error) => {
                eprintln!(
                    "gpuvisor: cannot open the log file {}: {error}",
                    path.display()
                );
                return;
            }
        }
        for (fd, pipe) in [(stdout, Pipe::Stdout), (stderr, Pipe::Stderr)] {
            let slot = self.free_slots.pop().unwrap_or_else(|| {
                self.streams.push(None);
                self.streams.len() - 1
            });
            let event = EpollEvent::new(EpollFlags::EPOLLIN, slot as u64 + 1);
            if let Err(error) = self.epoll.add(&fd, event) {
                eprintln!("gpuvisor: cannot watch an output pipe of replica {replica}: {error}");
                self.free_slots.push(slot);
                continue;
            }
            self.open_streams += 1;
            self.streams[slot] = Some(Stream {
                replica,
                generation: registration.generation,
                pipe,
                file: File::from(fd),
                partial: Vec::new(),
            });
        }
    }

    /// Reads what the stream in `slot` has; false at end of file.
    fn drain(&mut self, slot: usize, stamp: &Stamp) -> bool {
        // Both moved out for the loop, so the read data can be written without copying it
        // first and the stream's state changed while `self` writes.
        let Some(mut stream) = self.streams[slot].take() else {
            return true;
        };
        let mut buffer = std::mem::take(&mut self.buffer);
        let mut open = true;
        for _ in 0..4 {
            match (&stream.file).read(&mut buffer) {
                Ok(0) => {
                    open = false;
                    break;
                }
                Ok(count) => {
                    if let Some(last) = self.last_output.get(stream.replica) {
                        last.store(stamp.unix_ms, Ordering::Relaxed);
                    }
                    self.take_chunk(&mut stream, &buffer[..count], stamp);
                    if count < buffer.len() {
                        break;
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    open = false;
                    break;
                }
            }
        }
        self.buffer = buffer;
        self.streams[slot] = Some(stream);
        open
    }

    /// Writes the whole lines of what was pending of the stream's last line and `fresh`
    /// together, and keeps the unfinished rest for the next read.
    fn take_chunk(&mut self, stream: &mut Stream, fresh: &[u8], stamp: &Stamp) {
        match memchr::memrchr(b'\n', fresh) {
            Some(end) => {
                let (lines, rest) = fresh.split_at(end + 1);
                self.write_lines(stream, lines, stamp);
                stream.partial.clear(); // keeps its capacity
                stream.partial.extend_from_slice(rest);
            }
            None => {
                stream.partial.extend_from_slice(fresh);
                // A line longer than a read is written in pieces rather than held forever.
                if stream.partial.len() >= READ_BYTES {
                    self.write_lines(stream, b"", stamp);
                    stream.partial.clear();
                }
            }
        }
    }

    /// Writes `stream.partial` then `fresh` (together whole lines; a final line without `\n`
    /// gets one) to the file and the terminal.
    fn write_lines(&mut self, stream: &Stream, fresh: &[u8], stamp: &Stamp) {
        let replica = stream.replica;
        let Some(Some(log)) = self.replicas.get_mut(replica) else {
            return;
        };
        let carried = stream.partial.as_slice();
        let limits = (self.config.max_file_bytes, self.config.keep_rotated);
        let written = log.write_lines(stream.pipe, carried, fresh, &stamp.text, limits);
        if written.ready {
            (self.events)(LogEvent::Ready {
                replica,
                generation: log.generation,
            });
        }
        if let Some(error) = written.error {
            let problem = format!(
                "cannot write {}: {error} (further lines of this replica may be lost; said once)",
                log.path.display()
            );
            self.say_once(replica, &problem);
        }
        if let Some(terminal) = terminal_of(&self.terminal, &self.file_stems, replica) {
            // Counted here only: without a terminal, lines are never counted one by one.
            let ends_line = fresh.last().or(carried.last()) == Some(&b'\n');
            let lines = memchr::memchr_iter(b'\n', fresh).count() + usize::from(!ends_line);
            let newline: &[u8] = if ends_line { b"" } else { b"\n" };
            terminal.push(replica, lines, &[carried, fresh, newline]);
        }
    }

    fn close_stream(&mut self, mut stream: Stream, stamp: &Stamp) {
        if !stream.partial.is_empty() {
            self.write_lines(&stream, b"", stamp);
            stream.partial.clear();
        }
        let Some(slot) = self.replicas.get_mut(stream.replica) else {
            return;
        };
        let Some(log) = slot else { return };
        if log.generation != stream.generation {
            return; // a pipe of an earlier life, still held open by a straggler
        }
        log.open_streams -= 1;
        if log.open_streams == 0 {
            let log = slot.take().expect("present");
            let text = String::from_utf8_lossy(&log.tail);
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(TAIL_LINES)..]
                .iter()
                .map(|line| line.to_string())
                .collect();
            (self.events)(LogEvent::Closed {
                replica: stream.replica,
                generation: log.generation,
                tail,
            });
        }
    }
}

/// The terminal replica `replica`'s lines go to: replicas added after the start have none
/// (the terminal's prefixes, one per `file_stems` entry, were fixed then).
fn terminal_of<'a>(
    terminal: &'a Option<TerminalQueue>,
    file_stems: &[String],
    replica: usize,
) -> Option<&'a TerminalQueue> {
    terminal.as_ref().filter(|_| replica < file_stems.len())
}

/// Whether a line of `carried` + `fresh` (whole lines) matches `pattern`.
fn matches_ready(pattern: &Regex, carried: &[u8], fresh: &[u8]) -> bool {
    let matches = |line: &[u8]| {
        // Without its line ending, so `ready$` means what it says.
        let text = line.strip_suffix(b"\n").unwrap_or(line);
        pattern.is_match(text.strip_suffix(b"\r").unwrap_or(text))
    };
    let first_end = memchr::memchr(b'\n', fresh).map_or(fresh.len(), |end| end + 1);
    let first_matches = if carried.is_empty() {
        matches(&fresh[..first_end])
    } else {
        matches(&[carried, &fresh[..first_end]].concat())
    };
    first_matches
        || fresh[first_end..]
            .split_inclusive(|&byte| byte == b'\n')
            .any(matches)
}

/// The time of the lines read in one wake-up, formatted once per millisecond.
#[derive(Default)]
struct Stamp {
    unix_ms: u64,
    text: String,
}

impl Stamp {
    fn update(&mut self) {
        let unix_ms = now_unix_ms();
        if unix_ms != self.unix_ms || self.text.is_empty() {
            self.unix_ms = unix_ms;
            self.text = rfc3339_ms(unix_ms);
        }
    }
}

#[cfg(test)]
mod tests;
