//! Stall classes on the pictures of real hangs (docs/supervisor.md, "Stall classes"): the
//! threads, log lines and stacks measured on them, and the watch reading them from its
//! source only while a replica is quiet.

use super::tests::{config, snapshot};
use super::*;

fn thread(pid: i32, tid: i32, name: &str, state: char, ticks: (u64, u64)) -> ThreadSample {
    ThreadSample {
        pid,
        tid,
        name: name.into(),
        state,
        user_ticks: ticks.0,
        system_ticks: ticks.1,
        wchan: if state == 'R' {
            "0".into()
        } else {
            String::new()
        },
        syscall: None,
    }
}

fn blocked(mut sample: ThreadSample, wchan: &str, syscall: i64) -> ThreadSample {
    sample.wchan = wchan.into();
    sample.syscall = Some(syscall);
    sample
}

/// torchrun, 2 ranks, rank 1 asleep before init_process_group: rank 0 (pid 400) inside
/// ncclCommInitRankConfig. gdb: its main thread in ncclSocketAccept <- bootstrapInit (a
/// non-blocking accept, 20,000 failed calls a second), a second thread in ncclSocketAccept <-
/// bootstrapRoot (blocked in accept(2)). /proc over 5 s: main thread R, user 146 -> 158,
/// system 613 -> 819 ticks; thread 553 S in inet_csk_accept, syscall 43. Rank 1 (pid 401)
/// in nanosleep.
fn nccl_bootstrap_waiting() -> (Vec<ThreadSample>, Vec<ThreadSample>) {
    let at = |main: (u64, u64)| {
        vec![
            thread(400, 400, "python", 'R', main),
            blocked(
                thread(400, 553, "python", 'S', (0, 0)),
                "inet_csk_accept",
                43,
            ),
            blocked(
                thread(401, 401, "python", 'S', (110, 15)),
                "hrtimer_nanosleep",
                230,
            ),
        ]
    };
    (at((146, 613)), at((158, 819)))
}

#[test]
fn a_rank_in_nccls_bootstrap_accept_is_waiting_for_peers() {
    let (first, last) = nccl_bootstrap_waiting();
    let threads = ThreadEvidence::from_samples(&first, &[last], 5_000);
    assert_eq!(threads.socket_waits.len(), 1, "{threads:?}");
    assert_eq!(threads.spinning.len(), 1, "{threads:?}");
    let evidence = StallEvidence {
        cpu_percent: 45.0,
        threads: Some(threads),
        ..StallEvidence::default()
    };
    // The CPU-only rule called this compiling.
    assert_eq!(
        classify_stall(&StallEvidence {
            threads: None,
            ..evidence.clone()
        }),
        StallKind::CompilingOrCpuBound
    );
    let class = classify(&evidence);
    assert_eq!(class.kind, StallKind::Waiting);
    assert_eq!(class.cause, Some(StallCause::Peers));
    assert_eq!(class.pids, vec![400]);
    assert!(
        class.because[0].contains("accept(2)"),
        "{:?}",
        class.because
    );
    assert!(
        class.because[1].contains("94% of it in system calls"),
        "{:?}",
        class.because
    );
}

/// torchrun with 3 ranks, rank 2 asleep: rank 1 (pid 30757) is not the bootstrap root, so no
/// thread of it blocks in accept(2); its one thread spins in NCCL's non-blocking accept (user
/// 181 -> 189, system 1254 -> 1377 ticks over 5 s) and it listens on TCP ports 0x9F53 and
/// 0xA2C3 (its bootstrap sockets). As its own replica (one rank per replica) that alone says
/// it waits for peers; without the listening socket the spin is still `waiting`, not a compile.
#[test]
fn a_non_root_rank_spinning_while_it_listens_waits_for_peers() {
    let first = vec![thread(30757, 30757, "python", 'R', (181, 1254))];
    let last = vec![thread(30757, 30757, "python", 'R', (189, 1377))];
    let threads = ThreadEvidence::from_samples(&first, &[last], 5_000);
    assert!(threads.socket_waits.is_empty());
    let evidence = StallEvidence {
        cpu_percent: 26.0,
        threads: Some(threads),
        listening: vec![(30757, 0x9F53), (30757, 0xA2C3)],
        ..StallEvidence::default()
    };
    let class = classify(&evidence);
    assert_eq!(
        (class.kind, class.cause),
        (StallKind::Waiting, Some(StallCause::Peers))
    );
    assert_eq!(class.pids, vec![30757]);
    assert!(
        class.because[0].contains("listens on TCP port 40787"),
        "{:?}",
        class.because
    );
    // The same sockets with the GPU busy: NCCL's sockets stay open after init, and a host
    // spinning on a busy GPU's stream is no rendezvous.
    let busy_gpu = classify(&StallEvidence {
        gpu_utilization_percent: Some(100),
        ..evidence.clone()
    });
    assert_eq!((busy_gpu.kind, busy_gpu.cause), (StallKind::GpuBound, None));
    let unexplained = classify(&StallEvidence {
        listening: Vec::new(),
        ..evidence
    });
    assert_eq!(
        (unexplained.kind, unexplained.cause),
        (StallKind::Waiting, None)
    );
    assert!(
        unexplained.because[0].contains("a polling loop"),
        "{:?}",
        unexplained.because
    );
}

#[test]
fn torchs_init_timeout_line_means_peers_never_came() {
    let log = "2026-11-25T08:26:53.100Z E torch.distributed.DistBackendError: Failed to \
               initialize NCCL communicator timed out after 5000 ms\n";
    let evidence = StallEvidence {
        log: crate::stall_class::scan_log(log, 0),
        ..StallEvidence::default()
    };
    let class = classify(&evidence);
    assert_eq!(
        (class.kind, class.cause),
        (StallKind::Waiting, Some(StallCause::Peers))
    );
    assert!(class.because[0].starts_with("peers did not join in time: torch.distributed"));
}

/// A real XLA compile (JAX 0.10.2, a jit of 3,000 unrolled ops; py-spy: the main thread in
/// XLA's GPU HLO passes): over 5 s the main thread R, user 545 -> 714 ticks, system 23 -> 23.
/// Then the same CPU picture with the S4 fault: the first jit's all-reduce held on GPU 0
/// (GPUVISOR_SIM_STALL=all_reduce@0) while the next jit compiles; the simulator's line says
/// the kernel is held.
#[test]
fn a_held_collective_outranks_a_compile_on_the_cpu() {
    let first = vec![thread(500, 500, "python", 'R', (545, 23))];
    let last = vec![thread(500, 500, "python", 'R', (714, 23))];
    let threads = ThreadEvidence::from_samples(&first, &[last], 5_000);
    assert_eq!(threads.computing.len(), 1);
    assert!(threads.spinning.is_empty() && threads.socket_waits.is_empty());
    let log = "2026-11-25T08:29:00.000Z E gpuvisor-sim: stalling `all_reduce_start_fusion` \
               (launch 1 of `all_reduce` on GPU 0) for 60.000 s until unix ms 1000060000 \
               (GPUVISOR_SIM_STALL)\n";
    let compiling = StallEvidence {
        cpu_percent: 34.0,
        threads: Some(threads),
        ..StallEvidence::default()
    };
    assert_eq!(classify(&compiling).kind, StallKind::CompilingOrCpuBound);
    let held = StallEvidence {
        log: crate::stall_class::scan_log(log, 1_000_000_000),
        ..compiling.clone()
    };
    let class = classify(&held);
    assert_eq!(
        (class.kind, class.cause),
        (StallKind::Waiting, Some(StallCause::Collective))
    );
    assert!(
        class.because[0].contains("all_reduce_start_fusion"),
        "{:?}",
        class.because
    );
    // Once released, the line no longer counts.
    let released = crate::stall_class::scan_log(log, 1_000_060_001);
    assert_eq!(released.simulated_stall, None);
}

#[test]
fn torchs_watchdog_line_means_a_stuck_collective() {
    let log = "2026-11-25T08:00:00.000Z E [rank1]:[E1125 08:00:00.000 ProcessGroupNCCL.cpp:700] \
               [PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught collective operation \
               timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1048576) ran for 4000 \
               milliseconds before timing out.\n";
    let signals = crate::stall_class::scan_log(log, 0);
    assert!(signals
        .collective_timeout
        .as_deref()
        .unwrap()
        .starts_with("[rank1]"));
    let class = classify(&StallEvidence {
        log: signals,
        ..StallEvidence::default()
    });
    assert_eq!(class.cause, Some(StallCause::Collective));
}

#[test]
fn threads_in_the_stall_window_come_from_the_source() {
    #[derive(Default)]
    struct Fake {
        calls: usize,
    }
    impl StallSource for Fake {
        fn threads(&mut self, pids: &[i32]) -> Vec<ThreadSample> {
            self.calls += 1;
            assert_eq!(pids, [21]);
            let (first, last) = nccl_bootstrap_waiting();
            let mut picked = if self.calls == 1 { first } else { last };
            picked.retain(|t| t.pid == 400);
            picked.iter_mut().for_each(|t| t.pid = 21);
            picked
        }
        fn listening(&mut self, _pids: &[i32]) -> Vec<(i32, u16)> {
            Vec::new()
        }
        fn log_tail(&mut self, index: usize) -> String {
            assert_eq!(index, 1);
            String::new()
        }
        fn rank(&mut self, pid: i32) -> Option<u32> {
            (pid == 21).then_some(0)
        }
        fn not_available(&self) -> Vec<String> {
            vec!["py-spy (Python and native stacks)".into()]
        }
    }
    let mut watch = Watch::new(config(BudgetAction::Warn, GpuUseAction::Warn));
    let mut fake = Fake::default();
    // Quiet 1 s: not yet half of stall_after (5 s), nothing read.
    let mut early = snapshot(0);
    early.replicas[1].quiet_ms = Some(1_000);
    assert!(watch.check_with(&mut early, &[], &mut fake).is_empty());
    assert_eq!(fake.calls, 0);
    let mut half = snapshot(2_000);
    half.replicas[1].quiet_ms = Some(3_000);
    assert!(watch.check_with(&mut half, &[], &mut fake).is_empty());
    let mut late = snapshot(7_000);
    late.replicas[1].quiet_ms = Some(8_000);
    late.replicas[1].cpu_percent = 45.0;
    let findings = watch.check_with(&mut late, &[], &mut fake);
    let stall = &findings
        .iter()
        .find(|f| f.event.kind() == "stall")
        .unwrap()
        .event;
    assert_eq!(stall.fields()["class"], "waiting");
    assert_eq!(stall.fields()["cause"], "peers");
    assert_eq!(stall.fields()["pids"][0]["rank"], 0);
    assert_eq!(
        stall.fields()["not_available"][0],
        "py-spy (Python and native stacks)"
    );
    assert_eq!(fake.calls, 2);
    // Stalled: no more reads, no second event in the same quiet spell.
    let mut later = snapshot(8_000);
    later.replicas[1].quiet_ms = Some(9_000);
    assert!(watch
        .check_with(&mut later, &[], &mut fake)
        .iter()
        .all(|f| f.event.kind() != "stall"));
    assert_eq!(fake.calls, 2);
}

/// torchrun's launcher importing torch from a venv that fell out of the page cache (seen in
/// CI on a fresh machine: 10.5 s without a line, in disk wait): it reads hundreds of MiB, so
/// it is loading, not stalled; once its reads stop, the quiet time counts from the last one.
#[test]
fn a_quiet_replica_that_keeps_reading_is_not_stalled() {
    #[derive(Default)]
    struct Reading {
        bytes: u64,
    }
    impl StallSource for Reading {
        fn threads(&mut self, _pids: &[i32]) -> Vec<ThreadSample> {
            vec![thread(21, 21, "python", 'D', (50, 400))]
        }
        fn not_available(&self) -> Vec<String> {
            Vec::new()
        }
        fn read_progress(&mut self, pids: &[i32]) -> Option<u64> {
            assert_eq!(pids, [21]);
            Some(self.bytes)
        }
    }
    let stalls = |findings: Vec<Finding>| {
        findings
            .iter()
            .filter(|f| f.event.kind() == "stall")
            .count()
    };
    let mut watch = Watch::new(config(BudgetAction::Warn, GpuUseAction::Warn));
    let mut source = Reading { bytes: 10 << 20 };
    // stall_after is 5 s. Half-way quiet: the first count.
    let mut tick = |at: u64, quiet: u64, bytes: u64, source: &mut Reading| {
        source.bytes = bytes;
        let mut shot = snapshot(at);
        shot.replicas[1].quiet_ms = Some(quiet);
        stalls(watch.check_with(&mut shot, &[], source))
    };
    assert_eq!(tick(2_000, 3_000, 10 << 20, &mut source), 0);
    // Past stall_after without a line, but 200 MiB read since: not a stall.
    assert_eq!(tick(5_000, 6_000, 210 << 20, &mut source), 0);
    assert_eq!(tick(8_000, 9_000, 400 << 20, &mut source), 0);
    // The reads stop (a few KiB a tick): quiet from the last read at 8 s, so a stall once
    // 5 s have passed since then, not before.
    assert_eq!(tick(11_000, 12_000, (400 << 20) + 4096, &mut source), 0);
    assert_eq!(tick(13_500, 14_500, (400 << 20) + 8192, &mut source), 1);
}

/// `py-spy dump --native` of torch rank 0 waiting for rank 1 (torch 2.15, NCCL 2.30), first
/// frames.
const PY_SPY_BOOTSTRAP: &str = "\
Process 32737: python -u tests/frameworks/multigpu_worker.py torch
Python v3.11.7 (/root/.pyenv/versions/3.11.7/bin/python3.11)

Thread 32737 (active): \"MainThread\"
    accept (libc.so.6)
    ncclOsSocketTryAccept (linux.cc:190)
    socketProgressState (socket.cc:425)
    ncclSocketAccept (socket.cc:529)
    bootstrapInit (bootstrap.cc:792)
    ncclCommInitRankFunc (init.cc:1916)
    ncclCommInitRankConfig (init.cc:2679)
    c10d::nccl2::ProcessGroupNCCL::init (libtorch_cuda.so)
    init_process_group (torch/distributed/distributed_c10d.py:2721)
    torch_checks (multigpu_worker.py:82)
";

#[test]
fn a_host_spinning_on_a_busy_gpu_is_gpu_bound() {
    // The CUDA driver's default wait spins and yields (sched_yield) while the GPU works.
    let first = vec![thread(600, 600, "python", 'R', (100, 100))];
    let last = vec![thread(600, 600, "python", 'R', (150, 400))];
    let class = classify(&StallEvidence {
        cpu_percent: 70.0,
        gpu_utilization_percent: Some(95),
        threads: Some(ThreadEvidence::from_samples(&first, &[last], 5_000)),
        ..StallEvidence::default()
    });
    assert_eq!((class.kind, class.cause), (StallKind::GpuBound, None));
}

#[test]
fn native_stacks_name_what_a_thread_waits_for() {
    let (cause, line) = crate::stall_class::stack_cause(PY_SPY_BOOTSTRAP).unwrap();
    assert_eq!(cause, StallCause::Peers);
    assert_eq!(
        line,
        "Thread 32737 (active): \"MainThread\": accept <- ncclOsSocketTryAccept <- \
         socketProgressState <- ncclSocketAccept <- bootstrapInit <- ncclCommInitRankFunc"
    );
    let idle = "Thread 1 (idle): \"MainThread\"\n    sleep (time.py:1)\n";
    assert_eq!(crate::stall_class::stack_cause(idle), None);
}

#[test]
fn a_thread_runnable_in_every_sample_is_busy_on_a_loaded_machine() {
    // `while :; do :; done` got 20% of a core at a load average of 23 on 2 cores: under
    // the busy threshold of the tree, but runnable in every sample.
    let at = |ticks| vec![thread(700, 700, "sh", 'R', (ticks, 0))];
    let samples = vec![at(10), at(13), at(16), at(20)];
    let threads = ThreadEvidence::from_samples(&at(10), &samples, 5_000);
    assert_eq!(threads.computing.len(), 1, "{threads:?}");
    let class = classify(&StallEvidence {
        cpu_percent: 20.5,
        threads: Some(threads),
        ..StallEvidence::default()
    });
    assert_eq!(class.kind, StallKind::CompilingOrCpuBound);
    // Asleep in one sample: not busy.
    let mut napping = samples.clone();
    napping[1][0].state = 'S';
    let threads = ThreadEvidence::from_samples(&at(10), &napping, 5_000);
    assert!(threads.computing.is_empty(), "{threads:?}");
}
