//! Sampler tests on real process trees, with GPU usage in a simulator state file.

use super::*;
use crate::gpu_source::{SimDevice, SimSource};
use std::process::{Child, Command};

/// Writes a simulator state file (its layout: 8 header words, slots of 1 + 64 words).
fn write_state(path: &std::path::Path, slots: &[(i32, &[u64])]) {
    let mut words = vec![0u64; 8 + 1024 * 65];
    words[0] = u64::from_le_bytes(*b"GVSIMST1");
    words[1] = slots.len() as u64;
    for (slot, (pid, bytes)) in slots.iter().enumerate() {
        let base = 8 + slot * 65;
        words[base] = *pid as u64;
        for (device, value) in bytes.iter().enumerate() {
            words[base + 1 + device] = *value;
        }
    }
    let raw: Vec<u8> = words.iter().flat_map(|word| word.to_le_bytes()).collect();
    std::fs::write(path, raw).unwrap();
}

fn devices() -> Vec<SimDevice> {
    (0..2)
        .map(|index| SimDevice {
            uuid: format!("GPU-{index}"),
            total_bytes: 80 << 30,
            foreign_bytes: 0,
        })
        .collect()
}

fn info(label: &str) -> ReplicaInfo {
    ReplicaInfo {
        process: label.into(),
        replica: 0,
        label: label.into(),
        budget_bytes: 1 << 30,
    }
}

/// Waits until `root` has a descendant whose command line is `command`.
fn find_descendant(root: i32, command: &str) -> i32 {
    for _ in 0..300 {
        if let Some(pid) = procfs::descendants(root)
            .into_iter()
            .find(|&pid| procfs::cmdline(pid) == command)
        {
            return pid;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no `{command}` below {root}");
}

/// A sampler of one replica labelled `label`, ticking every 100 ms, with no GPU source.
fn without_gpus(label: &str) -> Sampler {
    Sampler::new(
        "job",
        Duration::from_millis(100),
        vec![info(label)],
        Box::new(crate::gpu_source::NoGpus),
    )
}

/// A tree whose command (the root's child) spins, and a sampler for it as one replica.
fn busy_tree() -> (i32, Killed, Sampler) {
    let (root, guard) = shell("sh -c 'while :; do :; done' & wait");
    find_descendant(root, "sh -c while :; do :; done");
    (root, guard, without_gpus("busy"))
}

/// One tick's input for a job of one CPU-only replica (`groups`: its root).
fn one_replica(groups: &[Option<i32>], now_unix_ms: u64) -> TickInput<'_> {
    TickInput {
        groups,
        ledger: &[None],
        last_output_unix_ms: &[0],
        now_unix_ms,
    }
}

/// `sh -c script`, killed with its tree when the guard drops.
fn shell(script: &str) -> (i32, Killed) {
    let child = Command::new("sh").args(["-c", script]).spawn().unwrap();
    (child.id() as i32, Killed(vec![child]))
}

struct Killed(Vec<Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let pid = child.id() as i32;
            for descendant in procfs::descendants(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(descendant),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn gpu_processes_count_toward_the_replica_they_descend_from() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // A replica whose GPU worker is a grandchild, and a process of no replica.
    let replica = Command::new("sh")
        .args(["-c", "sh -c 'sleep 31; true' & wait"])
        .spawn()
        .unwrap();
    let stranger = Command::new("sleep").arg("32").spawn().unwrap();
    let root = replica.id() as i32;
    let stranger_pid = stranger.id() as i32;
    let _guard = Killed(vec![replica, stranger]);
    let worker = find_descendant(root, "sleep 31");
    write_state(
        &state,
        &[(worker, &[3 << 20, 1 << 20]), (stranger_pid, &[0, 5 << 20])],
    );
    let source = SimSource::new(state, devices());
    let mut sampler = Sampler::new(
        "job",
        Duration::from_millis(100),
        vec![info("a"), info("idle")],
        Box::new(source),
    );
    let groups = [Some(root), None];
    // The ledger charged "a" 1 MiB on each GPU, where its tree holds 3 and 1 MiB; "idle" has
    // no ledger figure.
    let charged = GpuUsage {
        used_bytes: 1 << 20,
        used_by_gpu: vec![(0, 1 << 20), (1, 1 << 20)],
        ..GpuUsage::default()
    };
    let snapshot = sampler.tick(TickInput {
        groups: &groups,
        ledger: &[Some(charged.clone()), None],
        last_output_unix_ms: &[0, 0],
        now_unix_ms: 1,
    });
    assert_eq!(snapshot.gpu_source, "simulator");
    assert_eq!(snapshot.gpus[0].used_bytes, 3 << 20);
    assert_eq!(snapshot.gpus[1].used_bytes, 6 << 20);
    let a = &snapshot.replicas[0];
    assert_eq!(a.gpu_bytes, 4 << 20, "{snapshot:#?}");
    // The shells and the worker; the root stands for the keeper, which is left out.
    assert!(a.process_count >= 2, "{a:?}");
    assert!(a.rss_bytes > 0);
    assert_eq!(snapshot.replicas[1].gpu_bytes, 0);
    // Physical minus charged on each GPU (not the sum of both less the fullest GPU's charge);
    // unknown without a ledger figure.
    assert_eq!(a.untracked_bytes, Some(2 << 20));
    let share = |gpu, physical_bytes, charged_bytes| GpuShare {
        gpu,
        physical_bytes,
        charged_bytes,
    };
    assert_eq!(
        a.by_gpu,
        vec![share(0, 3 << 20, 1 << 20), share(1, 1 << 20, 1 << 20)]
    );
    assert_eq!(snapshot.replicas[1].untracked_bytes, None);
    let row = snapshot.processes.iter().find(|p| p.pid == worker).unwrap();
    assert_eq!(row.replica, Some(0));
    assert_eq!(row.gpus, vec![0, 1]);
    assert_eq!(row.gpu_bytes_by_gpu, vec![3 << 20, 1 << 20]);
    assert_eq!(row.command, "sleep 31");
    assert_eq!(snapshot.foreign_gpu_processes.len(), 1);
    assert_eq!(snapshot.foreign_gpu_processes[0].pid, stranger_pid);
    assert_eq!(snapshot.foreign_gpu_processes[0].command, "sleep 32");
    // Handed back, the snapshot's tables are refilled by the next tick to the same figures.
    let first = snapshot.clone();
    sampler.recycle(snapshot);
    let again = sampler.tick(TickInput {
        groups: &groups,
        ledger: &[Some(charged), None],
        last_output_unix_ms: &[0, 0],
        now_unix_ms: 2,
    });
    let figures = |row: &ReplicaStat| {
        let named = (row.process.clone(), row.label.clone(), row.state.clone());
        (
            named,
            row.gpu_bytes,
            row.by_gpu.clone(),
            row.untracked_bytes,
        )
    };
    let rows = |snapshot: &Snapshot| snapshot.replicas.iter().map(figures).collect::<Vec<_>>();
    assert_eq!(rows(&again), rows(&first));
    let pids = |snapshot: &Snapshot| snapshot.processes.iter().map(|p| p.pid).collect::<Vec<_>>();
    assert_eq!(pids(&again), pids(&first));
}

#[test]
fn a_worker_born_after_discovery_is_found_through_its_parent_chain() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (root, _guard) = shell("sh -c 'sleep 33; true' & wait");
    let worker = find_descendant(root, "sleep 33");
    let source = SimSource::new(state.clone(), devices());
    let mut sampler = Sampler::new(
        "job",
        Duration::from_millis(100),
        vec![info("a")],
        Box::new(source),
    );
    // The tree as discovered knows only the worker's parent: the worker must be found by
    // walking up its parent chain.
    let parent = procfs::stat(worker).unwrap().ppid;
    assert_ne!(parent, root);
    sampler.trees.trees[0] = trees::Tree::known(root, vec![parent]);
    sampler.trees.set_discovered(Instant::now());
    write_state(&state, &[(worker, &[7 << 20])]);
    let snapshot = sampler.tick(TickInput {
        groups: &[Some(root)],
        ledger: &[None],
        last_output_unix_ms: &[0],
        now_unix_ms: 1,
    });
    assert_eq!(snapshot.replicas[0].gpu_bytes, 7 << 20, "{snapshot:#?}");
    assert!(sampler.trees.trees[0].pids.contains(&worker));
    // Cached: the same answer without a walk, and the worker is now a tracked member.
    let start = procfs::stat_sample(worker).unwrap().start_ticks;
    assert_eq!(sampler.attribution.get(&worker), Some(&(start, Some(0))));
}

#[test]
fn cpu_use_of_a_busy_tree_is_measured() {
    // The root stands for the keeper; the busy loop is its child, the replica's command.
    let (root, _guard, mut sampler) = busy_tree();
    let groups = [Some(root)];
    let input = |now| one_replica(&groups, now);
    sampler.tick(input(1));
    std::thread::sleep(CPU_READ_EVERY + Duration::from_millis(100));
    let snapshot = sampler.tick(input(2));
    // Some of a core: what a crowded machine gives a busy loop varies (17% seen at a load
    // average of 8 on 2 cores), but a sleeping tree shows 0.
    assert!(snapshot.replicas[0].cpu_percent > 0.0, "{snapshot:#?}");
    let command = snapshot.replicas[0]
        .pid
        .expect("the command below the root");
    assert_eq!(procfs::stat(command).unwrap().ppid, root);
}

#[test]
fn cpu_time_is_read_at_most_every_500_ms_and_its_rate_carried_between() {
    let (root, _guard, mut sampler) = busy_tree();
    let groups = [Some(root)];
    let input = |now| one_replica(&groups, now);
    sampler.tick(input(1));
    assert_eq!(sampler.cpu.beats, 1, "the first tick reads");
    std::thread::sleep(Duration::from_millis(100));
    sampler.tick(input(2));
    assert_eq!(sampler.cpu.beats, 1, "100 ms later: no read");
    std::thread::sleep(CPU_READ_EVERY);
    let measured = sampler.tick(input(3));
    assert_eq!(sampler.cpu.beats, 2, "after 600 ms: a read");
    // Some of a core (a crowded machine gives a busy loop what it can; a sleeping tree shows 0).
    assert!(measured.replicas[0].cpu_percent > 0.0, "{measured:#?}");
    // The next 100 ms tick repeats the measured rate rather than reporting 0.
    std::thread::sleep(Duration::from_millis(100));
    let between = sampler.tick(input(4));
    assert_eq!(sampler.cpu.beats, 2);
    assert_eq!(
        between.replicas[0].cpu_percent,
        measured.replicas[0].cpu_percent
    );
    assert_eq!(
        between.replicas[0].process_count,
        measured.replicas[0].process_count
    );
}

#[test]
fn cpu_time_is_read_every_tick_at_intervals_of_500_ms_or_more() {
    let mut sampler = Sampler::new(
        "job",
        CPU_READ_EVERY,
        vec![info("idle")],
        Box::new(crate::gpu_source::NoGpus),
    );
    let input = TickInput {
        groups: &[None],
        ledger: &[None],
        last_output_unix_ms: &[0],
        now_unix_ms: 1,
    };
    sampler.tick(input);
    // Half an interval of slack: a tick 250 ms early still reads.
    std::thread::sleep(Duration::from_millis(260));
    sampler.tick(input);
    assert_eq!(sampler.cpu.beats, 2);
}

#[test]
fn a_quiet_tree_is_reread_only_on_its_turn_and_a_stirred_one_at_the_next_discovery() {
    // The root stands for the keeper; the two sleepers are its tree, and never run again.
    let (root, _guard) = shell("sleep 40 & sleep 41 & wait");
    find_descendant(root, "sleep 40");
    find_descendant(root, "sleep 41");
    let groups = [Some(root)];
    let mut trees = trees::Trees::new(1);
    let start = Instant::now();
    let at = |seconds: u64| start + Duration::from_secs(seconds);
    assert!(trees.discover(&groups, at(0)).is_some());
    assert_eq!((trees.trees_read, trees.trees[0].pids.len()), (1, 2));
    // Due every 2 s, but nothing in the tree ran: no read until its turn, one in five.
    for seconds in [2, 4, 6] {
        trees.discover(&groups, at(seconds));
        assert_eq!(trees.trees_read, 1, "at {seconds} s");
    }
    trees.discover(&groups, at(8));
    assert_eq!(trees.trees_read, 2, "its turn");
    // Between two discoveries nothing is read, stirred or not.
    trees.trees[0].stir();
    trees.discover(&groups, at(9));
    assert_eq!(trees.trees_read, 2);
    trees.discover(&groups, at(10));
    assert_eq!((trees.trees_read, trees.trees[0].pids.len()), (3, 2));
    // A new life is read at once.
    trees.discover(&[None], at(11));
    assert!(trees.trees[0].pids.is_empty());
    trees.discover(&groups, at(11));
    assert_eq!((trees.trees_read, trees.trees[0].pids.len()), (4, 2));
}

#[test]
fn a_child_forked_by_a_member_is_found_at_the_next_discovery() {
    let (root, _guard) = shell("sh -c 'sleep 0.3; sleep 43 & wait' & wait");
    let member = find_descendant(root, "sh -c sleep 0.3; sleep 43 & wait");
    let mut sampler = without_gpus("a");
    let groups = [Some(root)];
    let input = TickInput {
        groups: &groups,
        ledger: &[None],
        last_output_unix_ms: &[0],
        now_unix_ms: 1,
    };
    let first = sampler.tick(input);
    assert!(first.processes.iter().any(|process| process.pid == member));
    let sleeper = find_descendant(root, "sleep 43");
    // The member ran (it forked): its tree is read again at the next discovery, 2 s on, not
    // at its quiet turn 10 s on.
    let deadline = Instant::now() + trees::DISCOVER_EVERY + Duration::from_millis(1500);
    while Instant::now() < deadline {
        let snapshot = sampler.tick(input);
        if snapshot
            .processes
            .iter()
            .any(|process| process.pid == sleeper)
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "sleep 43 ({sleeper}) not found: {:?}",
        sampler.trees.trees[0]
    );
}

#[test]
fn a_process_whose_cpu_time_did_not_move_is_read_every_2_s() {
    let sleeper = Command::new("sleep").arg("44").spawn().unwrap();
    let pid = sleeper.id() as i32;
    let _guard = Killed(vec![sleeper]);
    let mut cpu = cpu::CpuReads::new();
    let interval = Duration::from_millis(100);
    let start = Instant::now();
    let at = |millis: u64| start + Duration::from_millis(millis);
    let mut reads_at = Vec::new();
    for millis in (0..=4000).step_by(500) {
        let before = cpu.reads;
        let usage = cpu
            .rate(pid, false, at(millis), true, interval)
            .expect("alive");
        assert_eq!(usage.percent, 0.0);
        if cpu.reads > before {
            reads_at.push(millis);
        }
    }
    // Read twice 500 ms apart (it did not move), then every 2 s.
    assert_eq!(reads_at, [0, 500, 2500]);
    // Off the beat: never read.
    assert!(cpu.rate(pid, false, at(9000), false, interval).is_some());
    assert_eq!(cpu.reads, 3);
}

#[test]
fn cpu_use_of_a_process_with_threads_counts_them_all() {
    // This test process: the test runs on a thread of its own, the main thread waits, and a
    // third thread spins. /proc/PID/schedstat would show only the waiting main thread.
    let pid = std::process::id() as i32;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinner = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    let mut cpu = cpu::CpuReads::new();
    let interval = Duration::from_millis(100);
    cpu.rate(pid, true, Instant::now(), true, interval)
        .expect("alive");
    // Long enough for a few 10 ms clock ticks even on a crowded machine.
    std::thread::sleep(Duration::from_millis(800));
    let usage = cpu
        .rate(pid, true, Instant::now(), true, interval)
        .expect("alive");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    spinner.join().unwrap();
    // A spinning thread gets at least a few % of a core even at a load of 20 on 2 cores; the
    // main thread's wake-ups alone are far below that.
    assert!(usage.percent > 3.0 && usage.ran, "{usage:?}");
}
