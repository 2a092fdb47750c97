//! The one /proc reader of the supervisor, `exec`, `top` and `doctor`: each process's stat
//! line (parent, process group, state, CPU, start time, resident pages), its children (to find
//! a job's whole tree), status, command name and line, environment, and mapped /dev/shm files;
//! [`threads`]: a quiet replica's threads and listening sockets, for the stall classifier.
//!
//! The stat line is parsed in one place ([`StatLine`]): the command name may hold spaces and
//! parentheses, so the fields are counted after its last `)`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs;
use std::path::Path;

pub mod threads;

/// A /proc/PID/stat line split at the command name: the pid, the name, and the fields after
/// it, read lazily (a sampler parses thousands of these per discovery).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatLine<'a> {
    /// Process (or thread) id.
    pub pid: i32,
    /// The command name (`comm`), between the first `(` and the last `)`.
    pub comm: &'a str,
    after_name: &'a str,
}

impl<'a> StatLine<'a> {
    /// Splits the text of /proc/PID/stat (or /proc/PID/task/TID/stat).
    pub fn parse(text: &'a str) -> Option<StatLine<'a>> {
        let pid = text.split(' ').next()?.parse().ok()?;
        let open = text.find('(')?;
        let close = text.rfind(')')?;
        Some(StatLine {
            pid,
            comm: text.get(open + 1..close)?,
            after_name: &text[close + 1..],
        })
    }

    /// The fields after the name, from field 3 (the state letter) on.
    // ASCII splitting: /proc's fields are plain numbers (the name, the only free text, is
    // skipped), and the Unicode-aware split cost twice as much.
    pub fn fields(&self) -> std::str::SplitAsciiWhitespace<'a> {
        self.after_name.split_ascii_whitespace()
    }

    /// Field `number` as proc(5) counts them (3 = state, 14 = utime, ...), if it is a number.
    pub fn number(&self, number: usize) -> Option<u64> {
        self.fields().nth(number.checked_sub(3)?)?.parse().ok()
    }

    /// The state letter (field 3: `R`, `S`, `D`, `Z`, ...).
    pub fn state(&self) -> Option<char> {
        self.fields().next()?.chars().next()
    }
}

/// One line of /proc/PID/stat, the fields gpuvisor uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Process id.
    pub pid: i32,
    /// Parent's pid.
    pub ppid: i32,
    /// Process group.
    pub pgid: i32,
}

/// Parses the text of /proc/PID/stat (the command name may hold spaces and parentheses).
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let line = StatLine::parse(text)?;
    let pid = line.pid;
    let mut fields = line.fields();
    let _state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgid = fields.next()?.parse().ok()?;
    Some(ProcStat { pid, ppid, pgid })
}

/// The stat of `pid`, if it exists.
pub fn stat(pid: i32) -> Option<ProcStat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Every process visible in /proc.
pub fn all_processes() -> Vec<ProcStat> {
    pids().into_iter().filter_map(stat).collect()
}

/// The pid of every process visible in /proc.
pub fn pids() -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .collect()
}

/// Whether `pid` has an entry in /proc (a zombie has one until it is reaped).
pub fn exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The user owning `pid` (its /proc entry's owner), if visible.
pub fn owner_uid(pid: i32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid())
}

/// Processes in one of `groups`, or descended from a process that is (children of reaped
/// parents are reparented to their subreaper, so this is the job's tree as far as it can be
/// seen).
pub fn job_tree(groups: &[i32]) -> Vec<i32> {
    members_of(&all_processes(), groups, &HashSet::new())
}

/// [`job_tree`] when some members are known already (`known`: the sampler's latest view of
/// the job): only the other processes' stat lines are read (with 1,024 replicas, a few hundred
/// instead of every process of the job), and only the members found among them are returned.
pub fn job_tree_beyond(groups: &[i32], known: &HashSet<i32>) -> Vec<i32> {
    let others: Vec<ProcStat> = pids()
        .into_iter()
        .filter(|pid| !known.contains(pid))
        .filter_map(stat)
        .collect();
    members_of(&others, groups, known)
}

/// The processes of `processes` in one of `groups` or below a member, where `known` are
/// members too (not listed in `processes`, not returned). In one pass over the processes and
/// one over the members (a set of the groups, each process's children by parent), not a pass
/// over every process per member (with 1,024 replicas, millions of comparisons per scan).
pub fn members_of(processes: &[ProcStat], groups: &[i32], known: &HashSet<i32>) -> Vec<i32> {
    let groups: HashSet<i32> = groups.iter().copied().collect();
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for process in processes {
        children.entry(process.ppid).or_default().push(process.pid);
    }
    let mut found: Vec<i32> = processes
        .iter()
        .filter(|process| groups.contains(&process.pgid))
        .map(|process| process.pid)
        .collect();
    let mut seen: HashSet<i32> = found.iter().chain(known).copied().collect();
    // Breadth first from every member: the known ones and those found so far.
    let mut queue: VecDeque<i32> = known.iter().chain(&found).copied().collect();
    while let Some(parent) = queue.pop_front() {
        for &child in children.get(&parent).map_or(&[][..], Vec::as_slice) {
            if seen.insert(child) {
                found.push(child);
                queue.push_back(child);
            }
        }
    }
    found
}

/// Every descendant of `pid`, following each thread's children lists (no scan of all of
/// /proc: a keeper does this when its command exits).
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    let mut stack = vec![pid];
    while let Some(parent) = stack.pop() {
        for child in children(parent) {
            if !found.contains(&child) {
                found.push(child);
                stack.push(child);
            }
        }
    }
    found
}

/// `root` and every process below it, with their stat lines, found through the kernel's
/// children lists (only the tree's own files are read, not all of /proc); the root first.
/// Processes that vanish while read are skipped.
pub fn tree(root: i32) -> Vec<ProcSample> {
    let mut found = Vec::new();
    let mut pending = vec![root];
    // A bound against a pid reused into a loop while we walk.
    while let Some(pid) = pending.pop().filter(|_| found.len() < 100_000) {
        let Some(sample) = stat_sample(pid) else {
            continue;
        };
        found.push(sample);
        pending.extend(children(pid));
    }
    found
}

/// Direct children of `pid`: from every thread's /proc/PID/task/TID/children (a child belongs
/// to the thread that forked it), falling back to a scan of /proc where the kernel has no
/// children lists. A process that is gone has none: no scan (with 1,024 replicas exiting, a
/// scan per gone keeper per tick was a million /proc reads a tick and stalled the shutdown).
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let lists: Vec<String> = tasks
        .filter_map(Result::ok)
        .filter_map(|task| fs::read_to_string(task.path().join("children")).ok())
        .collect();
    if Path::new(&format!("/proc/{pid}/task/{pid}/children")).exists() {
        return lists
            .iter()
            .flat_map(|text| text.split_whitespace())
            .filter_map(|word| word.parse().ok())
            .collect();
    }
    all_processes()
        .into_iter()
        .filter(|process| process.ppid == pid)
        .map(|process| process.pid)
        .collect()
}

/// Direct children of a single-threaded `pid` (its one children list: 3 system calls), or of
/// any process through [`children`].
pub fn children_of(pid: i32, threads: u32) -> Vec<i32> {
    if threads != 1 {
        return children(pid);
    }
    match fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) {
        Ok(text) => text
            .split_whitespace()
            .filter_map(|word| word.parse().ok())
            .collect(),
        Err(_) => children(pid),
    }
}

/// Resident memory of `pid` in bytes (VmRSS).
pub fn rss_bytes(pid: i32) -> Option<u64> {
    let kib: u64 = status_field(&format!("/proc/{pid}/status"), "VmRSS")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// How many threads this process runs (`Threads:` in /proc/self/status).
pub fn own_thread_count() -> Option<u64> {
    status_field("/proc/self/status", "Threads")?.parse().ok()
}

/// The value of `name:` in the status file at `path`, trimmed (`1`, `123 kB`).
fn status_field(path: &str, name: &str) -> Option<String> {
    let status = fs::read_to_string(path).ok()?;
    parse_status_field(&status, name).map(str::to_string)
}

/// The value of `name:` in the text of a /proc status file, trimmed.
pub fn parse_status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(':')?;
        Some(value.trim())
    })
}

/// The command name of `pid` (/proc/PID/comm), if visible (it is not for host pids seen from
/// inside a container).
pub fn comm(pid: i32) -> Option<String> {
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.trim_end().to_string())
}

/// The value of the first of `names` in `pid`'s environment (/proc/PID/environ, as it was at
/// exec) that `parse` accepts, if the environment is readable.
pub fn environ_value<T>(pid: i32, names: &[&str], parse: impl Fn(&str) -> Option<T>) -> Option<T> {
    let raw = fs::read(format!("/proc/{pid}/environ")).ok()?;
    parse_environ_value(&raw, names, parse)
}

/// The value of the first of `names` that `parse` accepts, in the text of /proc/PID/environ
/// (NUL-separated `NAME=value`; values that are not UTF-8 are skipped).
pub fn parse_environ_value<T>(
    raw: &[u8],
    names: &[&str],
    parse: impl Fn(&str) -> Option<T>,
) -> Option<T> {
    let variables: Vec<&[u8]> = raw.split(|&byte| byte == 0).collect();
    names.iter().find_map(|name| {
        variables.iter().find_map(|variable| {
            let value = variable.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
            parse(std::str::from_utf8(value).ok()?)
        })
    })
}

/// Files under /dev/shm that `pid` has mapped (POSIX semaphores and torch shared tensors are
/// mmapped, so this names the shared-memory objects a process uses).
pub fn mapped_shm(pid: i32) -> Vec<String> {
    let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    let mut found: Vec<String> = maps
        .lines()
        .filter_map(|line| line.find("/dev/shm/").map(|at| &line[at..]))
        .map(|path| path.trim_end_matches(" (deleted)").to_string())
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The fields of /proc/PID/stat the sampler uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcSample {
    /// Process id.
    pub pid: i32,
    /// Parent's pid.
    pub ppid: i32,
    /// Process group.
    pub pgid: i32,
    /// State letter (`R`, `S`, `D`, `Z`, ...).
    pub state: char,
    /// User + system CPU time, clock ticks (USER_HZ, 100 per second on Linux).
    pub cpu_ticks: u64,
    /// User CPU time, clock ticks.
    pub user_ticks: u64,
    /// System CPU time, clock ticks.
    pub system_ticks: u64,
    /// Start time after boot, clock ticks: with the pid, it names one process (pids are reused).
    pub start_ticks: u64,
    /// Resident pages.
    pub rss_pages: u64,
    /// Threads.
    pub threads: u32,
}

/// Clock ticks per second in /proc (USER_HZ: fixed at 100 for user space on Linux).
pub const TICKS_PER_SECOND: u64 = 100;

/// Parses the text of /proc/PID/stat into the sampler's fields.
pub fn parse_sample(text: &str) -> Option<ProcSample> {
    let line = StatLine::parse(text)?;
    let pid = line.pid;
    // Walked once in place (no Vec of fields): the sampler parses every member's stat at
    // each discovery, thousands of times with 1,024 replicas.
    let mut fields = line.fields();
    let mut next = |skip: usize| fields.nth(skip);
    let state = next(0)?.chars().next()?;
    let ppid = next(0)?.parse().ok()?;
    let pgid = next(0)?.parse().ok()?;
    let utime: u64 = next(8)?.parse().ok()?; // field 11 after the name
    let stime: u64 = next(0)?.parse().ok()?;
    let threads = next(4)?.parse::<u64>().ok()? as u32; // 17
    let start_ticks = next(1)?.parse().ok()?; // 19
    let rss_pages = next(1)?.parse().ok()?; // 21
    Some(ProcSample {
        pid,
        state,
        ppid,
        pgid,
        cpu_ticks: utime + stime,
        user_ticks: utime,
        system_ticks: stime,
        start_ticks,
        rss_pages,
        threads,
    })
}

/// The sampler's fields of `pid`'s stat, if it exists (one open/read/close).
pub fn stat_sample(pid: i32) -> Option<ProcSample> {
    parse_sample(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    stat_sample(pid).is_some_and(|sample| !matches!(sample.state, 'Z' | 'X'))
}

/// Reads one /proc/PID file (`stat`, `schedstat`) of many processes repeatedly, cheaply: each
/// file stays open and is re-read from offset 0 (one `pread` per process per tick instead of
/// open/read/close). An open file keeps naming its process: once that process is gone the
/// read fails, so a reused pid is never mistaken for it.
#[derive(Debug)]
pub struct StatReader {
    /// The file under /proc/PID/; `children` means the main thread's children list.
    name: &'static str,
    files: std::collections::HashMap<i32, fs::File>,
    buffer: Vec<u8>,
}

impl Default for StatReader {
    fn default() -> StatReader {
        StatReader::new()
    }
}

impl StatReader {
    /// A reader of /proc/PID/stat.
    pub fn new() -> StatReader {
        StatReader::for_file("stat")
    }

    /// A reader of /proc/PID/`name`; `children` reads /proc/PID/task/PID/children (the main
    /// thread's children: a process's whole list only when it has one thread).
    pub fn for_file(name: &'static str) -> StatReader {
        StatReader {
            name,
            files: std::collections::HashMap::new(),
            buffer: vec![0; 1024],
        }
    }

    /// The stat of `pid` now; `None` (and the file closed) when it is gone.
    pub fn read(&mut self, pid: i32) -> Option<ProcSample> {
        self.read_with(pid, parse_sample)
    }

    /// The file of `pid` now, parsed by `parse`; `None` (and the file closed) when it is gone
    /// or does not parse.
    pub fn read_with<T>(&mut self, pid: i32, parse: impl Fn(&str) -> Option<T>) -> Option<T> {
        use std::os::unix::fs::FileExt;
        let name = self.name;
        let file = match self.files.entry(pid) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let path = match name {
                    "children" => format!("/proc/{pid}/task/{pid}/children"),
                    _ => format!("/proc/{pid}/{name}"),
                };
                entry.insert(fs::File::open(path).ok()?)
            }
        };
        // An empty read is a valid answer (no children); a gone process is a read error.
        let parsed = match file.read_at(&mut self.buffer, 0) {
            Ok(count) => std::str::from_utf8(&self.buffer[..count])
                .ok()
                .and_then(parse),
            Err(_) => None,
        };
        if parsed.is_none() {
            self.files.remove(&pid);
        }
        parsed
    }

    /// Closes the files of pids not in `keep`.
    pub fn retain(&mut self, keep: impl Fn(i32) -> bool) {
        self.files.retain(|pid, _| keep(*pid));
    }

    /// Files held open.
    pub fn open_files(&self) -> usize {
        self.files.len()
    }
}

/// The pids of a children list.
pub fn parse_pids(text: &str) -> Option<Vec<i32>> {
    Some(
        text.split_whitespace()
            .filter_map(|word| word.parse().ok())
            .collect(),
    )
}

/// CPU time in nanoseconds from the text of /proc/PID/schedstat (its first field): far
/// cheaper for the kernel to produce than /proc/PID/stat.
pub fn parse_schedstat_ns(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// The command line of `pid`, arguments joined by spaces (empty if unreadable).
pub fn cmdline(pid: i32) -> String {
    let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return String::new();
    };
    let words: Vec<String> = raw
        .split(|&byte| byte == 0)
        .filter(|word| !word.is_empty())
        .map(|word| String::from_utf8_lossy(word).into_owned())
        .collect();
    words.join(" ")
}

/// The kernel's page size in bytes (the first mapping's `KernelPageSize` in this process's
/// smaps; 4096 if unreadable). Called once.
pub fn page_bytes() -> u64 {
    fs::read_to_string("/proc/self/smaps")
        .ok()
        .and_then(|text| {
            let line = text
                .lines()
                .find(|line| line.starts_with("KernelPageSize:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests;
