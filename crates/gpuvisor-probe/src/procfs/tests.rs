//! The /proc reader on captured text and on live processes.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;

use super::*;

#[test]
fn a_process_that_is_gone_has_no_children() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    assert!(children(pid).is_empty());
    assert!(descendants(pid).is_empty());
}

#[test]
fn a_stat_line_splits_at_the_last_parenthesis() {
    // Captured from a process that renamed itself `a (b) c` (prctl PR_SET_NAME).
    let text = "4242 (a (b) c) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 9876 1000000 321 18446744073709551615\n";
    let line = StatLine::parse(text).unwrap();
    assert_eq!((line.pid, line.comm), (4242, "a (b) c"));
    assert_eq!(line.state(), Some('S'));
    assert_eq!(line.number(4), Some(17));
    assert_eq!((line.number(14), line.number(15)), (Some(250), Some(50)));
    assert_eq!(line.number(24), Some(321));
    assert_eq!(line.number(2), None);
    assert_eq!(StatLine::parse("4242 no name here"), None);
    assert_eq!(StatLine::parse("x (a) S 1"), None);
    // An empty name (a thread that cleared it) is still a name.
    assert_eq!(StatLine::parse("7 () R 1").map(|line| line.comm), Some(""));
}

#[test]
fn status_and_environ_fields_are_found_by_exact_name() {
    let status = "Name:\tpython3\nThreadsX:\t9\nThreads:\t12\nVmRSS:\t  2048 kB\n";
    assert_eq!(parse_status_field(status, "Threads"), Some("12"));
    assert_eq!(parse_status_field(status, "VmRSS"), Some("2048 kB"));
    assert_eq!(parse_status_field(status, "VmSwap"), None);
    let environ = b"RANKS=9\0LOCAL_RANK=1\0RANK=3\0SLURM_PROCID=5\0";
    assert_eq!(
        parse_environ_value(environ, &["RANK", "SLURM_PROCID"], |v| v
            .parse::<u32>()
            .ok()),
        Some(3)
    );
    assert_eq!(
        parse_environ_value(environ, &["JAX_PROCESS_ID", "SLURM_PROCID"], |v| v
            .parse::<u32>()
            .ok()),
        Some(5)
    );
    assert_eq!(
        parse_environ_value(environ, &["WORLD_SIZE"], |v| Some(v.to_string())),
        None
    );
    // A value that does not parse falls through to the next name.
    assert_eq!(
        parse_environ_value(b"RANK=x\0SLURM_PROCID=5", &["RANK", "SLURM_PROCID"], |v| v
            .parse::<u32>()
            .ok()),
        Some(5)
    );
    assert!(own_thread_count().is_some_and(|threads| threads >= 1));
    let me = std::process::id() as i32;
    assert!(comm(me).is_some_and(|name| !name.is_empty()));
    assert!(exists(me) && pids().contains(&me));
    assert_eq!(
        owner_uid(me),
        Some(std::fs::metadata("/proc/self").unwrap().uid())
    );
    assert!(!exists(i32::MAX) && owner_uid(i32::MAX).is_none());
}

#[test]
fn full_stat_lines_parse() {
    let text = "4242 (a (b) c) R 17 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 9876 1000000 321 18446744073709551615";
    let sample = parse_sample(text).unwrap();
    assert_eq!(sample.pid, 4242);
    assert_eq!(sample.ppid, 17);
    assert_eq!(sample.state, 'R');
    assert_eq!(sample.cpu_ticks, 300);
    assert_eq!((sample.user_ticks, sample.system_ticks), (250, 50));
    assert_eq!(sample.start_ticks, 9876);
    assert_eq!(sample.rss_pages, 321);
    assert_eq!(sample.threads, 3);
}

#[test]
fn a_stat_reader_rereads_and_forgets_the_dead() {
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut reader = StatReader::new();
    let first = reader.read(pid).unwrap();
    assert_eq!(first.ppid, std::process::id() as i32);
    assert_eq!(reader.read(pid).unwrap().start_ticks, first.start_ticks);
    let mut sched = StatReader::for_file("schedstat");
    assert!(sched.read_with(pid, parse_schedstat_ns).is_some());
    let mut children = StatReader::for_file("children");
    assert_eq!(children.read_with(pid, parse_pids), Some(Vec::new()));
    let me = std::process::id() as i32;
    assert!(children.read_with(me, parse_pids).is_some());
    // Right after the fork the child may not have exec'd yet.
    let mut command = String::new();
    for _ in 0..200 {
        command = cmdline(pid);
        if command == "sleep 30" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(command, "sleep 30");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(reader.read(pid), None);
    assert_eq!(reader.open_files(), 0);
    assert!(!alive(pid));
}

#[test]
fn stat_lines_with_odd_names_parse() {
    let text = "4242 (my (odd) name) S 17 4242 4242 0 -1 4194560 100 0 0 0";
    assert_eq!(
        parse_stat(text),
        Some(ProcStat {
            pid: 4242,
            ppid: 17,
            pgid: 4242
        })
    );
    assert_eq!(parse_stat("garbage"), None);
}

#[test]
fn descendants_are_found_through_every_level() {
    // shell -> (inner shell -> sleep), sleep: three descendants on two levels.
    let mut child = std::process::Command::new("sh")
        .args(["-c", "sh -c 'sleep 5; true' & sleep 5 & wait"])
        .spawn()
        .unwrap();
    let shell = child.id() as i32;
    let mut found = Vec::new();
    for _ in 0..200 {
        found = descendants(shell);
        if found.len() >= 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let grandchildren = found
        .iter()
        .filter(|&&pid| stat(pid).is_some_and(|s| s.ppid != shell))
        .count();
    for pid in found.iter().chain([&shell]) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = child.wait();
    assert_eq!(found.len(), 3, "{found:?}");
    assert_eq!(grandchildren, 1, "{found:?}");
}

#[test]
fn this_process_is_visible() {
    let me = std::process::id() as i32;
    assert_eq!(stat(me).map(|stat| stat.pid), Some(me));
    assert!(rss_bytes(me).unwrap() > 0);
}

#[test]
fn stat_fields_count_from_the_end_of_the_name() {
    // A name with a space and a parenthesis, as a process can choose.
    let text = "4242 (my (odd) name) S 1 4240 4240 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 12345 1000000 777 18446744073709551615";
    let sample = parse_sample(text).unwrap();
    assert_eq!(sample.pgid, 4240);
    assert_eq!(sample.cpu_ticks, 300);
    assert_eq!(sample.rss_pages, 777);
    assert!(parse_sample("garbage").is_none());
    // And on this very process.
    let own = std::fs::read_to_string("/proc/self/stat").unwrap();
    let sample = parse_sample(&own).unwrap();
    assert_eq!(sample.pid, std::process::id() as i32);
    assert!(sample.rss_pages > 0);
}

#[test]
fn a_process_tree_is_walked_through_children_lists() {
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let me = std::process::id() as i32;
    let found = tree(me);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(found[0].pid, me, "the root comes first");
    assert!(
        found.iter().any(|sample| sample.pid == child.id() as i32),
        "the child is in the tree: {found:?}"
    );
    assert!(tree(i32::MAX).is_empty(), "no such process");
}

#[test]
fn a_job_tree_is_its_groups_and_everything_below_them() {
    let process = |pid, ppid, pgid| ProcStat { pid, ppid, pgid };
    let processes = [
        process(1, 0, 1),
        process(30, 20, 30), // left its group (setsid), below a member: in
        process(10, 1, 10),  // a keeper: group 10
        process(11, 10, 10), // its command
        process(20, 11, 10), // a worker
        process(40, 30, 40), // below that one: in
        process(50, 1, 50),  // someone else's
        process(51, 50, 50), // and its child
        process(60, 1, 60),  // another keeper
    ];
    let mut members = members_of(&processes, &[10, 60], &HashSet::new());
    members.sort_unstable();
    assert_eq!(members, vec![10, 11, 20, 30, 40, 60]);
    assert!(members_of(&processes, &[], &HashSet::new()).is_empty());
}

#[test]
fn a_large_job_tree_has_every_keeper_and_command() {
    // 1,024 keepers, each with its command.
    let processes: Vec<ProcStat> = (0..1024)
        .flat_map(|replica| {
            let keeper = 10_000 + replica * 2;
            [
                ProcStat {
                    pid: keeper,
                    ppid: 1,
                    pgid: keeper,
                },
                ProcStat {
                    pid: keeper + 1,
                    ppid: keeper,
                    pgid: keeper,
                },
            ]
        })
        .collect();
    let groups: Vec<i32> = (0..1024).map(|replica| 10_000 + replica * 2).collect();
    assert_eq!(members_of(&processes, &groups, &HashSet::new()).len(), 2048);
}

#[test]
fn known_members_are_searched_below_but_not_returned() {
    // The sampler knows the keeper (10) and its command (11); their stat is not read (not in
    // the list), and a worker of the command and its child are still found.
    let process = |pid, ppid, pgid| ProcStat { pid, ppid, pgid };
    let others = [
        process(20, 11, 20), // a worker in its own group, below the known command
        process(21, 20, 20), // its child
        process(50, 1, 50),  // someone else's
    ];
    let known: HashSet<i32> = [10, 11].into_iter().collect();
    let mut found = members_of(&others, &[10], &known);
    found.sort_unstable();
    assert_eq!(found, vec![20, 21]);
    assert!(members_of(&others, &[10], &HashSet::new()).is_empty());
}
