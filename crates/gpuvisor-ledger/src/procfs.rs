//! Process identity from /proc: start time (so a reused pid is not mistaken for the process
//! that registered), state (a zombie holds no GPU memory) and name.

use std::io::Read;

/// What the ledger needs to know about a process, read from `/proc/PID/stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessIdentity {
    /// Process id.
    pub pid: i32,
    /// Start time: field 22 of `/proc/PID/stat` (clock ticks after boot). Together with the pid
    /// it names one process for the life of the machine.
    pub start_time: u64,
    /// State letter (field 3): `R`, `S`, `Z`, ...
    pub state: u8,
    /// Process name (`comm`, field 2), NUL-padded.
    pub name: [u8; 16],
}

/// Reads the identity of `pid` (`0` = the calling process) from /proc.
///
/// Returns `None` if the process does not exist or /proc cannot be read. No heap allocation
/// (the shim calls this on its refusal path): the path and the text live on the stack; one
/// open and one read, no scan of other processes.
pub fn read_identity(pid: i32) -> Option<ProcessIdentity> {
    let mut buf = [0u8; 1024];
    let len = read_stat(pid, &mut buf)?;
    parse_stat(&buf[..len])
}

/// Reads `/proc/PID/stat` (`pid` 0 = self) into `buf`; returns the length read.
fn read_stat(pid: i32, buf: &mut [u8; 1024]) -> Option<usize> {
    let mut path = [0u8; 32];
    let path_len = stat_path(pid, &mut path);
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(&path[..path_len]));
    read_into(path, buf)
}

/// Whether the `/proc/PID/stat` text describes a process that has exited: state `X`, or a
/// zombie (`Z`) with no thread left but the leader. A thread-group leader that called
/// `pthread_exit` is shown as `Z` too while its other threads run on (and hold GPU memory);
/// field 20 (num_threads) tells them apart.
pub(crate) fn has_exited(text: &[u8]) -> Option<bool> {
    let close = text.iter().rposition(|b| *b == b')')?;
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    // Field 3 is the state; field 20 is 17 fields further on.
    let threads: u64 = fields.nth(16)?.parse().ok()?;
    Some(state == b'X' || (state == b'Z' && threads <= 1))
}

/// Writes `/proc/PID/stat` (`/proc/self/stat` for pid 0) into `out`; returns its length.
fn stat_path(pid: i32, out: &mut [u8; 32]) -> usize {
    let mut len = 0;
    let mut push = |bytes: &[u8]| {
        out[len..len + bytes.len()].copy_from_slice(bytes);
        len += bytes.len();
    };
    push(b"/proc/");
    if pid <= 0 {
        push(b"self");
    } else {
        let mut digits = [0u8; 10];
        let mut n = pid as u32;
        let mut i = digits.len();
        while n > 0 || i == digits.len() {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
        push(&digits[i..]);
    }
    push(b"/stat");
    len
}

fn read_into(path: &std::path::Path, buf: &mut [u8]) -> Option<usize> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
    }
    Some(len)
}

/// Parses the text of `/proc/PID/stat`.
///
/// The name (field 2) is in parentheses and may itself contain spaces and parentheses, so the
/// fields after it are counted from the *last* `)`.
pub fn parse_stat(text: &[u8]) -> Option<ProcessIdentity> {
    let open = text.iter().position(|b| *b == b'(')?;
    let close = text.iter().rposition(|b| *b == b')')?;
    if close < open {
        return None;
    }
    let pid = std::str::from_utf8(&text[..open])
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let mut name = [0u8; 16];
    for (dst, src) in name.iter_mut().zip(&text[open + 1..close]) {
        *dst = *src;
    }
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    // Field 3 is the state; field 22 is 19 fields further on.
    let state = *fields.next()?.as_bytes().first()?;
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(ProcessIdentity {
        pid,
        start_time,
        state,
        name,
    })
}

/// Whether the process that registered as (`pid`, `start_time`) is still running.
///
/// `kill(pid, 0)` first (cheap; ESRCH = gone), then the start time and state from /proc: a
/// different start time means the pid was reused, `X` or a zombie with no other thread left
/// means it has exited (a zombie holds no GPU memory; see [`has_exited`]). If the pid exists but its /proc entry cannot be read (no /proc, hidden by
/// `hidepid`, or it exited between the two checks) the answer is "alive": reclaiming a live
/// process would be worse than keeping a dead one until the next scan.
pub fn is_alive(pid: i32, start_time: u64) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 sends nothing; it only checks that the pid exists.
    let rc = unsafe { crate::sys::kill(pid, 0) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(crate::sys::EPERM) {
        return false;
    }
    let mut buf = [0u8; 1024];
    let Some(len) = read_stat(pid, &mut buf) else {
        return true;
    };
    let text = &buf[..len];
    match (parse_stat(text), has_exited(text)) {
        (Some(id), Some(exited)) => id.start_time == start_time && !exited,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_spaces_and_parens() {
        let text = b"4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n";
        let id = parse_stat(text).expect("parses");
        assert_eq!(id.pid, 4242);
        assert_eq!(id.state, b'S');
        assert_eq!(id.start_time, 987654);
        assert_eq!(&id.name[..15], b"my (odd) name\0\0");
    }

    #[test]
    fn reads_self_and_detects_reuse() {
        let me = read_identity(0).expect("/proc/self/stat");
        // SAFETY: getpid has no preconditions.
        assert_eq!(me.pid, unsafe { crate::sys::getpid() });
        assert!(is_alive(me.pid, me.start_time));
        assert!(
            !is_alive(me.pid, me.start_time + 1),
            "other start time = reused pid"
        );
        assert!(!is_alive(i32::MAX - 7, 1));
    }

    #[test]
    fn stat_paths() {
        let mut buf = [0u8; 32];
        let n = stat_path(0, &mut buf);
        assert_eq!(&buf[..n], b"/proc/self/stat");
        let n = stat_path(4194304, &mut buf);
        assert_eq!(&buf[..n], b"/proc/4194304/stat");
        let n = stat_path(7, &mut buf);
        assert_eq!(&buf[..n], b"/proc/7/stat");
    }

    #[test]
    fn a_zombie_leader_with_live_threads_has_not_exited() {
        let stat = |state: &str, threads: u32| {
            format!("77 (py) {state} 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 {threads} 0 987654 1000 10")
        };
        assert_eq!(
            has_exited(stat("Z", 1).as_bytes()),
            Some(true),
            "a real zombie"
        );
        assert_eq!(has_exited(stat("X", 1).as_bytes()), Some(true));
        // main() called pthread_exit; a worker thread still runs and holds GPU memory.
        assert_eq!(has_exited(stat("Z", 3).as_bytes()), Some(false));
        assert_eq!(has_exited(stat("S", 3).as_bytes()), Some(false));
        let id = parse_stat(stat("Z", 3).as_bytes()).unwrap();
        assert_eq!(
            id.start_time, 987654,
            "the fields line up with parse_stat's"
        );
    }

    #[test]
    fn truncated_stat_is_none() {
        assert!(parse_stat(b"12 (x) S 1 2 3").is_none());
        assert!(parse_stat(b"garbage").is_none());
    }
}
