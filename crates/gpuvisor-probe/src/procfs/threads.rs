//! What the supervisor's stall classifier reads of a quiet replica's processes in /proc: each
//! thread's name, state, user/system CPU, wait channel and blocking system call, the TCP
//! ports they listen on, and how much they have read (to tell a quiet process that is
//! loading from one that is stuck). Read only at a stall (and the ticks just before it),
//! never on a healthy job's ticks.

use std::fs;

use super::StatLine;

/// One thread of a replica's tree at one moment (/proc/PID/task/TID/{stat,wchan,syscall}).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadSample {
    /// Its process.
    pub pid: i32,
    /// Its thread id.
    pub tid: i32,
    /// Its name (`comm`: `python`, `pt_tcpstore_uv`, `py_xla_execute`, ...).
    pub name: String,
    /// State letter.
    pub state: char,
    /// User CPU time, clock ticks.
    pub user_ticks: u64,
    /// System CPU time, clock ticks.
    pub system_ticks: u64,
    /// The kernel function it sleeps in (`wchan`; empty while it runs).
    pub wchan: String,
    /// The system call it is blocked in (`None`: running, or not readable).
    pub syscall: Option<i64>,
}

/// Every thread of `pid` now: name, state, CPU split, wait channel and blocking system call
/// (/proc/PID/task/TID/{stat,wchan,syscall}; a thread that goes away meanwhile is skipped).
pub fn threads(pid: i32) -> Vec<ThreadSample> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| {
            let tid: i32 = task.file_name().to_str()?.parse().ok()?;
            let dir = task.path();
            let mut sample = parse_thread_stat(&fs::read_to_string(dir.join("stat")).ok()?)?;
            sample.pid = pid;
            sample.tid = tid;
            sample.wchan = fs::read_to_string(dir.join("wchan")).unwrap_or_default();
            sample.syscall = fs::read_to_string(dir.join("syscall"))
                .ok()
                .and_then(|text| text.split_whitespace().next()?.parse().ok());
            Some(sample)
        })
        .collect()
}

/// The TCP ports these processes listen on: (pid, port), from their socket descriptors
/// (/proc/PID/fd) matched against the listening sockets of their network namespace
/// (/proc/PID/net/tcp and tcp6, state `0A`).
pub fn listening_ports(pids: &[i32]) -> Vec<(i32, u16)> {
    let Some(&first) = pids.first() else {
        return Vec::new();
    };
    let mut listening = Vec::new();
    for table in ["tcp", "tcp6"] {
        if let Ok(text) = fs::read_to_string(format!("/proc/{first}/net/{table}")) {
            listening.extend(parse_listening(&text));
        }
    }
    let mut found = Vec::new();
    for &pid in pids {
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.filter_map(Result::ok) {
            let Ok(target) = fs::read_link(fd.path()) else {
                continue;
            };
            let inode = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok());
            if let Some((_, port)) = inode.and_then(|i: u64| listening.iter().find(|l| l.0 == i)) {
                found.push((pid, *port));
            }
        }
    }
    found
}

/// (inode, local port) of the listening sockets in the text of /proc/net/tcp or tcp6.
pub fn parse_listening(text: &str) -> Vec<(u64, u16)> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.get(3) != Some(&"0A") {
                return None;
            }
            let port = u16::from_str_radix(fields.get(1)?.rsplit(':').next()?, 16).ok()?;
            Some((fields.get(9)?.parse().ok()?, port))
        })
        .collect()
}

/// Name, state and user/system ticks from a thread's stat line.
pub fn parse_thread_stat(text: &str) -> Option<ThreadSample> {
    let line = StatLine::parse(text)?;
    Some(ThreadSample {
        name: line.comm.to_string(),
        state: line.state()?,
        user_ticks: line.number(14)?,
        system_ticks: line.number(15)?,
        ..Default::default()
    })
}

/// Bytes `pid` has read so far (/proc/PID/io): `rchar`, what read(2) and friends returned
/// (page cache and sockets included), plus `read_bytes`, what came from storage (page faults of
/// mapped files, such as the shared libraries an import maps, count only here). `None` where
/// the file is not readable (another user's process without ptrace rights, or gone).
pub fn read_progress_bytes(pid: i32) -> Option<u64> {
    parse_io(&fs::read_to_string(format!("/proc/{pid}/io")).ok()?)
}

/// [`read_progress_bytes`]'s parser: `rchar` + `read_bytes` of an io file.
pub fn parse_io(text: &str) -> Option<u64> {
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|value| value.trim().parse::<u64>().ok())
    };
    Some(field("rchar")?.saturating_add(field("read_bytes").unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_show_their_name_state_and_wait() {
        let stat = "77 (pt_tcpstore (uv)) S 1 77 77 0 -1 0 0 0 0 0 1234 567 0 0";
        let sample = parse_thread_stat(stat).unwrap();
        assert_eq!(sample.name, "pt_tcpstore (uv)");
        assert_eq!(
            (sample.state, sample.user_ticks, sample.system_ticks),
            ('S', 1234, 567)
        );
        // A sleeping child: its one thread, asleep in the kernel.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut seen = Vec::new();
        for _ in 0..200 {
            seen = threads(pid);
            if seen
                .first()
                .is_some_and(|t| t.name == "sleep" && t.state == 'S')
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!((seen[0].pid, seen[0].tid), (pid, pid));
        assert_eq!(seen[0].name, "sleep");
        assert!(threads(pid).is_empty());
    }

    #[test]
    fn listening_sockets_are_found_by_inode() {
        // /proc/net/tcp of torch rank 1 in NCCL's bootstrap (its sockets 83868358, 83868359).
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 020200C0:9F53 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 83868358 1 0000000000000000 100 0 0 10 0
   1: 020200C0:A2C3 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 83868359 1 0000000000000000 100 0 0 10 0
   2: 0100007F:D431 0100007F:07E8 01 00000000:00000000 00:00000000 00000000     0        0 83868337 1 0000000000000000 20 4 30 10 -1
";
        assert_eq!(
            parse_listening(table),
            vec![(83868358, 0x9F53), (83868359, 0xA2C3)]
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id() as i32;
        assert!(listening_ports(&[me]).contains(&(me, port)));
    }

    #[test]
    fn io_progress_is_rchar_plus_read_bytes() {
        let text = "rchar: 1048576\nwchar: 12\nsyscr: 40\nsyscw: 1\nread_bytes: 4096\nwrite_bytes: 0\ncancelled_write_bytes: 0\n";
        assert_eq!(parse_io(text), Some(1_052_672));
        assert_eq!(parse_io("wchar: 3\n"), None);
        // Our own process can always read its own.
        assert!(read_progress_bytes(std::process::id() as i32).is_some());
    }
}
