//! Keys from the terminal, read by `top` itself rather than by crossterm's event reader.
//!
//! crossterm 0.28's reader loops on `read` while it returns 0 (end of file) or an error other
//! than "would block": when the terminal goes away (tmux kill-session, a dropped SSH session)
//! the view then spun a core forever and never saw that it should close. Here standard input
//! is polled, and a hang-up (`POLLHUP`, `POLLERR`, `POLLNVAL`), end of file (a read of 0
//! bytes) or a read error other than `EINTR` / `EAGAIN` ends the view with
//! [`Wait::Gone`].

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use super::app::Key;

/// What waiting for input gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// Nothing within the time.
    Timeout,
    /// Keys typed (possibly none that `top` knows: the caller redraws anyway).
    Keys(Vec<Key>),
    /// The terminal is gone: why, in words.
    Gone(String),
}

/// Waits up to `timeout` for input on `fd` (the terminal) and reads what is there.
pub fn wait_for_keys(fd: BorrowedFd<'_>, timeout: Duration) -> Wait {
    let timespec = Timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    match poll(&mut fds, Some(&timespec)) {
        Ok(0) => return Wait::Timeout,
        Ok(_) => {}
        Err(rustix::io::Errno::INTR) => return Wait::Timeout,
        Err(error) => return Wait::Gone(format!("polling the terminal failed: {error}")),
    }
    let revents = fds[0].revents();
    if revents.contains(PollFlags::NVAL) {
        return Wait::Gone("the terminal's descriptor is closed".into());
    }
    if !revents.contains(PollFlags::IN) && revents.intersects(PollFlags::HUP | PollFlags::ERR) {
        return Wait::Gone("the terminal hung up".into());
    }
    let mut buffer = [0u8; 1024];
    match rustix::io::read(fd, &mut buffer) {
        // A hung-up terminal reads as end of file (and polls as readable and HUP).
        Ok(0) => Wait::Gone("end of file on the terminal".into()),
        Ok(count) => Wait::Keys(parse_keys(&buffer[..count])),
        Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => Wait::Timeout,
        Err(error) => Wait::Gone(format!("reading the terminal failed: {error}")),
    }
}

/// Where keys come from: standard input when it is a terminal, else `/dev/tty` (as
/// crossterm does, so `top < /dev/null` still reads keys).
#[derive(Debug)]
pub struct KeySource {
    tty: Option<std::fs::File>,
}

impl KeySource {
    /// Standard input, or the controlling terminal when standard input is not one.
    pub fn open() -> io::Result<KeySource> {
        use std::io::IsTerminal;
        if io::stdin().is_terminal() {
            return Ok(KeySource { tty: None });
        }
        let tty = std::fs::File::open("/dev/tty")?;
        Ok(KeySource { tty: Some(tty) })
    }

    /// [`wait_for_keys`] on this source.
    pub fn wait(&self, timeout: Duration) -> Wait {
        match &self.tty {
            Some(tty) => wait_for_keys(tty.as_fd(), timeout),
            None => wait_for_keys(io::stdin().as_fd(), timeout),
        }
    }
}

/// The keys in one read of terminal input (raw mode): printable characters, Enter, Ctrl-C,
/// a lone Esc, and the arrow / paging escape sequences of xterm-like terminals (CSI and SS3
/// forms). Anything else (Alt-combinations, function keys, mouse reports) is skipped.
pub fn parse_keys(bytes: &[u8]) -> Vec<Key> {
    let mut keys = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        match byte {
            0x1b => {
                let (key, used) = escape(&bytes[at..]);
                keys.extend(key);
                at += used;
                continue;
            }
            0x03 => keys.push(Key::CtrlC),
            b'\r' | b'\n' => keys.push(Key::Enter),
            0x00..=0x1f | 0x7f => {}
            _ => {
                // One UTF-8 character (a bad byte is skipped).
                let width = match byte {
                    0xc0..=0xdf => 2,
                    0xe0..=0xef => 3,
                    0xf0..=0xf7 => 4,
                    _ => 1,
                };
                let end = (at + width).min(bytes.len());
                if let Some(c) = std::str::from_utf8(&bytes[at..end])
                    .ok()
                    .and_then(|text| text.chars().next())
                {
                    keys.push(Key::Char(c));
                }
                at = end;
                continue;
            }
        }
        at += 1;
    }
    keys
}

/// An escape sequence at the start of `bytes`: the key it is (if `top` knows it) and its
/// length.
fn escape(bytes: &[u8]) -> (Option<Key>, usize) {
    match bytes.get(1) {
        None => (Some(Key::Esc), 1),
        Some(b'[') => {
            // CSI: parameters, then a final byte in 0x40..=0x7e.
            let Some(end) = bytes[2..]
                .iter()
                .position(|byte| (0x40..=0x7e).contains(byte))
            else {
                return (None, bytes.len());
            };
            let params = &bytes[2..2 + end];
            let key = match (bytes[2 + end], params) {
                (b'A', _) => Some(Key::Up),
                (b'B', _) => Some(Key::Down),
                (b'H', _) => Some(Key::Home),
                (b'F', _) => Some(Key::End),
                (b'~', b"1" | b"7") => Some(Key::Home),
                (b'~', b"4" | b"8") => Some(Key::End),
                (b'~', b"5") => Some(Key::PageUp),
                (b'~', b"6") => Some(Key::PageDown),
                _ => None,
            };
            (key, 3 + end)
        }
        Some(b'O') => {
            let key = match bytes.get(2) {
                Some(b'A') => Some(Key::Up),
                Some(b'B') => Some(Key::Down),
                Some(b'H') => Some(Key::Home),
                Some(b'F') => Some(Key::End),
                _ => None,
            };
            (key, bytes.len().min(3))
        }
        // Esc pressed twice.
        Some(0x1b) => (Some(Key::Esc), 1),
        // Alt + a key: neither is taken (Alt-q must not quit).
        Some(_) => (None, 2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_sequences_parse() {
        assert_eq!(
            parse_keys(b"q\x03\r"),
            [Key::Char('q'), Key::CtrlC, Key::Enter]
        );
        assert_eq!(
            parse_keys(b"\x1b[A\x1b[B\x1bOA\x1b[5~\x1b[6~\x1b[H\x1b[4~"),
            [
                Key::Up,
                Key::Down,
                Key::Up,
                Key::PageUp,
                Key::PageDown,
                Key::Home,
                Key::End
            ]
        );
        assert_eq!(parse_keys(b"\x1b"), [Key::Esc]);
        assert_eq!(parse_keys(b"\x1bq"), [], "Alt-q is not q");
        assert_eq!(parse_keys(b"\x1b[1;5A"), [Key::Up], "Ctrl-Up is Up");
        assert_eq!(parse_keys("é".as_bytes()), [Key::Char('é')]);
        assert_eq!(parse_keys(b"\x1b[M"), [], "an unknown CSI is skipped");
    }

    #[test]
    fn end_of_file_and_a_hang_up_end_the_wait() {
        // A pipe stands in for the terminal: its writer closed is end of file / a hang-up.
        let (reader, writer) = rustix::pipe::pipe().unwrap();
        rustix::io::write(&writer, b"j").unwrap();
        assert_eq!(
            wait_for_keys(reader.as_fd(), Duration::from_millis(10)),
            Wait::Keys(vec![Key::Char('j')])
        );
        assert_eq!(
            wait_for_keys(reader.as_fd(), Duration::from_millis(10)),
            Wait::Timeout
        );
        drop(writer);
        let started = std::time::Instant::now();
        assert!(matches!(
            wait_for_keys(reader.as_fd(), Duration::from_secs(5)),
            Wait::Gone(_)
        ));
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
