//! Budgets enforced end to end: `gpuvisor exec` + the embedded shim + the simulator, with the
//! C driver client reaching the driver linked, through dlopen/dlsym and through
//! cuGetProcAddress.

use crate::driver;

use driver::{barrier_dir, exec, exec_program, exec_shell, linked, programs, GIB};

const OUT_OF_MEMORY: i32 = 2;

#[test]
fn over_budget_is_refused_with_out_of_memory_on_every_path() {
    for program in programs() {
        let run = exec_program(
            &["--simulate", "1x16GiB", "--mem-per-process", "4GiB"],
            &program.path,
            "init ctx 0 alloc 3GiB alloc 2GiB alloc-managed 2GiB alloc-async 2GiB alloc-pool 2GiB create 2GiB alloc-pitch 1073741824 2 free-all alloc 4GiB",
        );
        let loader = program.loader;
        assert_eq!(run.code, Some(0), "{loader}: {}", run.context());
        assert_eq!(
            run.rcs("alloc"),
            [0, OUT_OF_MEMORY, 0],
            "{loader}: cuMemAlloc over budget, then the whole budget after freeing: {}",
            run.context()
        );
        for path in [
            "alloc-managed",
            "alloc-async",
            "alloc-pool",
            "create",
            "alloc-pitch",
        ] {
            assert_eq!(
                run.rcs(path),
                [OUT_OF_MEMORY],
                "{loader}: {path} over budget: {}",
                run.context()
            );
        }
        let pid = run.lines[0].pid;
        let denials = run.summary["denials"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            denials.len(),
            6,
            "{loader}: every refusal is in the summary: {}",
            run.context()
        );
        assert!(denials.iter().all(|denial| denial["pid"] == pid
            && denial["limit"] == "process"
            && denial["limit_bytes"] == 4 * GIB));
        let process = run.process(pid).unwrap_or_else(|| {
            panic!(
                "{loader}: pid {pid} missing from the summary: {}",
                run.context()
            )
        });
        assert_eq!(process["peak_bytes"][0], 4 * GIB, "{loader}");
        assert!(
            process["command"]
                .as_str()
                .unwrap()
                .contains("init ctx 0 alloc 3GiB"),
            "{loader}: {process}"
        );
    }
}

#[test]
fn under_budget_is_never_refused() {
    let mut script = String::from("init ctx 0 alloc 1GiB alloc 1GiB alloc 1GiB alloc 1GiB free-all create 2GiB create 2GiB free-all alloc-async 4GiB free-all");
    for _ in 0..50 {
        script.push_str(" alloc 4GiB free-last alloc-pool 2GiB alloc-managed 2GiB free-all");
    }
    for program in programs() {
        let run = exec_program(
            &["--simulate", "1x16GiB", "--mem-per-process", "4GiB"],
            &program.path,
            &script,
        );
        let refused: Vec<_> = run.lines.iter().filter(|line| line.rc != 0).collect();
        assert!(
            refused.is_empty(),
            "{}: refused under budget: {refused:?}\n{}",
            program.loader,
            run.context()
        );
        assert_eq!(
            run.lines.len(),
            1 + 1 + 4 + 1 + 2 + 1 + 2 + 50 * 5,
            "{}",
            run.context()
        );
        assert!(run.summary["denials"].as_array().is_some_and(Vec::is_empty));
    }
}

#[test]
fn mem_get_info_and_total_mem_report_the_budget() {
    for program in programs() {
        let run = exec_program(
            &["--simulate", "1x16GiB", "--mem-per-process", "4GiB"],
            &program.path,
            "init ctx 0 total info alloc 1GiB info",
        );
        let infos = run.lines_of("info");
        assert_eq!(infos.len(), 2, "{}: {}", program.loader, run.context());
        assert_eq!(
            (infos[0].value("total"), infos[0].value("free")),
            (Some(4 * GIB), Some(4 * GIB)),
            "{}: {}",
            program.loader,
            run.context()
        );
        assert_eq!(
            (infos[1].value("total"), infos[1].value("free")),
            (Some(4 * GIB), Some(3 * GIB)),
            "{}: {}",
            program.loader,
            run.context()
        );
        assert_eq!(
            run.lines_of("total")[0].values,
            [(4 * GIB).to_string()],
            "{}: cuDeviceTotalMem is the budget too",
            program.loader
        );
    }
    let run = exec_program(
        &["--simulate", "1x16GiB", "--mem", "6GiB"],
        linked(),
        "init ctx 0 info",
    );
    assert_eq!(
        run.lines_of("info")[0].value("total"),
        Some(6 * GIB),
        "a group budget is the device size: {}",
        run.context()
    );
    let run = exec_program(&["--simulate", "1x16GiB"], linked(), "init ctx 0 info");
    assert_eq!(
        run.lines_of("info")[0].value("total"),
        Some(16 * GIB),
        "no budget: the physical size: {}",
        run.context()
    );
}

#[test]
fn a_group_budget_is_shared_across_forked_children() {
    // 1 GiB in the parent, then 3 forked children ask for 2 GiB twice each and hold it until
    // all have asked: of the six asks exactly four fit in the 10 GiB group, whatever the order.
    let barrier = barrier_dir("fork");
    let script = format!("init ctx 0 alloc 1GiB spawn 3 init ctx 0 alloc 2GiB alloc 2GiB touch-pid {0} wait-count {0} 3", barrier.display());
    let run = exec_program(
        &["--simulate", "1x16GiB", "--mem", "10GiB"],
        linked(),
        &script,
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    let parent = run.lines[0].pid;
    let child_asks: Vec<i32> = run
        .lines_of("alloc")
        .iter()
        .filter(|line| line.pid != parent)
        .map(|line| line.rc)
        .collect();
    assert_eq!(child_asks.len(), 6, "{}", run.context());
    assert_eq!(
        child_asks.iter().filter(|&&rc| rc == 0).count(),
        4,
        "{}",
        run.context()
    );
    assert_eq!(
        child_asks.iter().filter(|&&rc| rc == OUT_OF_MEMORY).count(),
        2,
        "{}",
        run.context()
    );
    let denials = run.summary["denials"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        denials.len() == 2
            && denials
                .iter()
                .all(|denial| denial["limit"] == "group" && denial["limit_bytes"] == 10 * GIB),
        "{}",
        run.context()
    );
    assert_eq!(
        run.processes().len(),
        4,
        "parent and three children are listed: {}",
        run.context()
    );
}

#[test]
fn a_group_budget_is_shared_across_execd_processes() {
    // Four separately exec'd clients (children of a shell) ask for 3 GiB each and hold it:
    // three fit in 10 GiB, the fourth is refused.
    let barrier = barrier_dir("exec");
    let run = exec_shell(
        &["--simulate", "1x16GiB", "--mem", "10GiB"],
        r#"for i in 1 2 3 4; do "$P" init ctx 0 alloc 3GiB touch-pid "$D" wait-count "$D" 4 & done; wait"#,
        &barrier,
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    let mut rcs = run.rcs("alloc");
    rcs.sort();
    assert_eq!(rcs, [0, 0, 0, OUT_OF_MEMORY], "{}", run.context());
}

#[test]
fn per_process_budgets_are_independent() {
    let barrier = barrier_dir("per-process");
    let run = exec_shell(
        &["--simulate", "1x16GiB", "--mem-per-process", "4GiB"],
        r#"for i in 1 2 3; do "$P" init ctx 0 alloc 4GiB touch-pid "$D" wait-count "$D" 3 alloc 1MiB & done; wait"#,
        &barrier,
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    let allocs = run.lines_of("alloc");
    let full: Vec<i32> = allocs
        .iter()
        .filter(|line| line.argument == (4 * GIB).to_string())
        .map(|line| line.rc)
        .collect();
    let extra: Vec<i32> = allocs
        .iter()
        .filter(|line| line.argument == (1u64 << 20).to_string())
        .map(|line| line.rc)
        .collect();
    assert_eq!(
        full,
        [0, 0, 0],
        "each process gets its whole budget at once: {}",
        run.context()
    );
    assert_eq!(
        extra,
        [OUT_OF_MEMORY; 3],
        "and not a byte more: {}",
        run.context()
    );
    let peaks: Vec<u64> = run
        .processes()
        .iter()
        .filter_map(|process| process["peak_bytes"][0].as_u64())
        .filter(|&peak| peak > 0)
        .collect();
    assert_eq!(peaks, [4 * GIB; 3], "{}", run.context());
}

#[test]
fn a_cpu_only_process_is_refused_and_recorded() {
    for program in programs() {
        let run = exec_program(
            &["--simulate", "1x16GiB", "--cpu-only"],
            &program.path,
            "init ctx 0 alloc 1GiB",
        );
        assert_eq!(run.code, Some(0), "{}: {}", program.loader, run.context());
        let pid = run.lines[0].pid;
        let ctx = run.rcs("ctx");
        assert!(
            run.rcs("init") != [0] || ctx != [0],
            "{}: CUDA was not refused: {}",
            program.loader,
            run.context()
        );
        assert_ne!(
            run.rcs("alloc"),
            [0],
            "{}: {}",
            program.loader,
            run.context()
        );
        let process = run.process(pid).unwrap_or_else(|| {
            panic!(
                "{}: pid {pid} not recorded: {}",
                program.loader,
                run.context()
            )
        });
        assert_eq!(process["cpu_only_violation"], true, "{}", program.loader);
        assert!(
            process["command"].as_str().unwrap().contains("driver-"),
            "{}: {process}",
            program.loader
        );
    }
}

#[test]
fn children_cpu_only_refuses_the_children_and_lists_them() {
    let run = exec_program(
        &[
            "--simulate",
            "1x16GiB",
            "--mem",
            "4GiB",
            "--children-cpu-only",
        ],
        linked(),
        "init ctx 0 alloc 1GiB spawn 8 init ctx 0 alloc 1GiB",
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    let parent = run.lines[0].pid;
    let (mine, theirs): (Vec<_>, Vec<_>) = run
        .lines_of("alloc")
        .into_iter()
        .partition(|line| line.pid == parent);
    assert_eq!(
        mine.iter().map(|line| line.rc).collect::<Vec<_>>(),
        [0],
        "the root keeps the GPU: {}",
        run.context()
    );
    assert!(
        theirs.len() == 8 && theirs.iter().all(|line| line.rc != 0),
        "children are refused: {}",
        run.context()
    );
    let violators: Vec<i64> = run
        .processes()
        .iter()
        .filter(|process| process["cpu_only_violation"] == true)
        .filter_map(|process| process["pid"].as_i64())
        .collect();
    let mut children: Vec<i64> = theirs.iter().map(|line| line.pid as i64).collect();
    children.sort();
    assert_eq!(violators, children, "{}", run.context());
    for child in children {
        let command = run.process(child as i32).unwrap()["command"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(command.contains("driver-linked"), "a violator is named by its command line or executable path, not a bare name: {command}");
        assert!(command.contains('/'), "{command}");
    }
}

#[test]
fn a_killed_process_has_its_usage_reclaimed() {
    let barrier = barrier_dir("killed");
    let run = exec_shell(
        &["--simulate", "1x16GiB", "--mem", "10GiB"],
        r#""$P" init ctx 0 alloc 8GiB kill-self; "$P" init ctx 0 alloc 8GiB"#,
        &barrier,
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert_eq!(
        run.rcs("alloc"),
        [0, 0],
        "the SIGKILLed process's 8 GiB came back: {}",
        run.context()
    );
}

fn damaged_ledger_passes_through(damage: &str) {
    let barrier = barrier_dir("damaged");
    let script = format!(r#"{damage}; "$P" init ctx 0 alloc 6GiB alloc 100GiB; echo "exit $?""#);
    let run = exec_shell(
        &["--simulate", "1x16GiB", "--mem-per-process", "4GiB"],
        &script,
        &barrier,
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert!(
        run.stdout.contains("exit 0"),
        "the program ran to its end: {}",
        run.context()
    );
    assert_eq!(
        run.rcs("alloc"),
        [0, OUT_OF_MEMORY],
        "budget not enforced, the driver's own OOM still there: {}",
        run.context()
    );
    let program_stderr = run.program_stderr();
    let shim_lines: Vec<&str> = program_stderr
        .lines()
        .filter(|line| line.starts_with("gpuvisor-shim:"))
        .collect();
    assert_eq!(shim_lines.len(), 1, "one clear line: {}", run.context());
    assert_eq!(run.summary["ledger_damaged"], true, "{}", run.context());
    // gpuvisor says what happened, once, when it happened.
    let said: Vec<&str> = program_stderr
        .lines()
        .filter(|line| line.starts_with("gpuvisor: the ledger "))
        .collect();
    assert_eq!(said.len(), 1, "{}", run.context());
    assert!(
        !run.summary["ledger_problems"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{}",
        run.context()
    );
}

#[test]
fn a_corrupt_ledger_makes_the_shim_pass_through() {
    damaged_ledger_passes_through(
        r#"printf 'this is not a ledger' | dd of="$GPUVISOR_LEDGER" conv=notrunc 2>/dev/null"#,
    );
}

#[test]
fn a_truncated_ledger_makes_the_shim_pass_through() {
    damaged_ledger_passes_through(r#"truncate -s 100 "$GPUVISOR_LEDGER""#);
}

/// Scenario S1 in miniature: three processes that size themselves like XLA (75% of the device
/// total the driver reports) and hold their memory together.
const S1_SCRIPT: &str = r#"for i in 1 2 3; do "$P" init ctx 0 prealloc 0.75 touch-pid "$D" wait-count "$D" 3 & done; wait"#;

#[test]
fn s1_preallocating_processes_all_fit_under_mem_per_process() {
    let barrier = barrier_dir("s1");
    let run = exec_shell(
        &["--simulate", "1x16GiB", "--mem-per-process", "4GiB"],
        S1_SCRIPT,
        &barrier,
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    let preallocs = run.lines_of("prealloc");
    assert_eq!(
        preallocs.iter().map(|line| line.rc).collect::<Vec<_>>(),
        [0, 0, 0],
        "{}",
        run.context()
    );
    assert!(
        preallocs
            .iter()
            .all(|line| line.value("total") == Some(4 * GIB)
                && line.argument == (3 * GIB).to_string()),
        "each sized itself from a 4 GiB device: {}",
        run.context()
    );
}

#[test]
fn s1_without_gpuvisor_the_second_preallocation_fails() {
    // The same three processes on the same simulated card, without the shim: the first takes
    // 75% of 16 GiB and the others find the card full.
    let barrier = barrier_dir("s1-bare");
    // Not in the barrier directory: its entries are counted.
    let state = driver::scratch().join(format!("s1-sim-state-{}", std::process::id()));
    let script = format!(
        r#"export LD_PRELOAD= GPUVISOR_LEDGER= GPUVISOR_SIM_STATE='{}'; for i in 1 2 3; do "$P" init ctx 0 prealloc 0.75 touch-pid "$D" wait-count "$D" 3 & done; wait"#,
        state.display()
    );
    let run = exec_shell(&["--simulate", "1x16GiB"], &script, &barrier);
    // Per process, the rc where the card turned out full: its preallocation's, or already its
    // context's (when another process preallocated first, as a real driver answers cuCtxCreate).
    let contexts = run.lines_of("ctx");
    let mut rcs: Vec<i32> = run
        .lines_of("prealloc")
        .iter()
        .map(|prealloc| {
            contexts
                .iter()
                .find(|ctx| ctx.pid == prealloc.pid && ctx.rc != 0)
                .map_or(prealloc.rc, |ctx| ctx.rc)
        })
        .collect();
    rcs.sort();
    assert_eq!(rcs, [0, OUT_OF_MEMORY, OUT_OF_MEMORY], "{}", run.context());
}

#[test]
fn budgets_hold_per_gpu_with_several_gpus_in_any_order() {
    // --gpu 2,0: ordinal 0 is GPU 2 (an 8 GiB card), ordinal 1 is GPU 0.
    let run = exec_program(
        &[
            "--simulate",
            "2x16GiB,8GiB",
            "--gpu",
            "2,0",
            "--mem-per-process",
            "4GiB",
        ],
        linked(),
        "init count ctx 1 info alloc 4GiB alloc 1MiB ctx 0 uuid info alloc 4GiB alloc 1MiB",
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert_eq!(run.lines_of("count")[0].values, ["2"]);
    assert_eq!(
        run.lines_of("uuid")[0].values,
        ["GPU-5111a7ed-0000-4000-8000-000000000002"]
    );
    assert!(
        run.lines_of("info")
            .iter()
            .all(|line| line.value("total") == Some(4 * GIB)),
        "{}",
        run.context()
    );
    assert_eq!(
        run.rcs("alloc"),
        [0, OUT_OF_MEMORY, 0, OUT_OF_MEMORY],
        "{}",
        run.context()
    );
    assert_eq!(run.summary["gpus"], serde_json::json!([2, 0]));
    let process = run.process(run.lines[0].pid).unwrap();
    assert_eq!(
        process["peak_bytes"],
        serde_json::json!([4 * GIB, 4 * GIB]),
        "{}",
        run.context()
    );
    let devices: Vec<u64> = run.summary["denials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|denial| denial["device"].as_u64().unwrap())
        .collect();
    assert_eq!(
        devices,
        [1, 0],
        "denials name the ledger device (position in --gpu)"
    );
}

#[test]
fn a_gpu_outside_the_job_is_fenced_off() {
    // The command resets CUDA_VISIBLE_DEVICES to GPU 1, which `--gpu 0` did not give it: the
    // ledger knows GPU 1 with a zero budget, so nothing can be allocated there.
    let program = linked().to_str().unwrap();
    let run = exec(
        &["--simulate", "2x16GiB", "--gpu", "0", "--mem", "4GiB"],
        &[
            "env",
            "CUDA_VISIBLE_DEVICES=GPU-5111a7ed-0000-4000-8000-000000000001",
            program,
            "init",
            "ctx",
            "0",
            "uuid",
            "info",
            "alloc",
            "1MiB",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert_eq!(
        run.lines_of("uuid")[0].values,
        ["GPU-5111a7ed-0000-4000-8000-000000000001"]
    );
    assert_eq!(
        run.lines_of("info")[0].value("total"),
        Some(0),
        "{}",
        run.context()
    );
    assert_eq!(run.rcs("alloc"), [OUT_OF_MEMORY], "{}", run.context());
    assert_eq!(run.summary["gpus"], serde_json::json!([0]));
    let denial = &run.summary["denials"][0];
    assert_eq!(
        denial["device"], 1,
        "the fenced GPU follows the job's in the ledger"
    );
    assert_eq!(denial["limit_bytes"], 0, "{}", run.context());
}

/// Waits (in the script) until `$D/NAME` exists.
fn wait_for(name: &str) -> String {
    format!(r#"while [ ! -e "$D/{name}" ]; do sleep 0.02; done"#)
}

#[test]
fn random_bytes_across_the_ledger_are_reported_and_never_a_storm_of_false_refusals() {
    // Issue 14 item 4: random bytes over the file made every later allocation fail and the
    // summary print "8519680.0 TiB in use".
    let barrier = barrier_dir("random-bytes");
    let script = format!(
        r#""$P" init ctx 0 alloc 1GiB touch "$D/a" wait-file "$D/b" alloc 1GiB alloc 1GiB alloc 1GiB &
{}
dd if=/dev/urandom of="$GPUVISOR_LEDGER" bs=$(stat -c %s "$GPUVISOR_LEDGER") count=1 conv=notrunc 2>/dev/null
sleep 0.3; touch "$D/b"; wait"#,
        wait_for("a")
    );
    let run = exec_shell(
        &["--simulate", "1x16GiB", "--mem", "2GiB"],
        &script,
        &barrier,
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert_eq!(
        run.rcs("alloc"),
        [0, 0, 0, 0],
        "no false refusal after the damage: {}",
        run.context()
    );
    let shim_lines = run
        .program_stderr()
        .lines()
        .filter(|line| line.starts_with("gpuvisor-shim:"))
        .count();
    assert!(
        shim_lines <= 1,
        "at most one line from the shim: {}",
        run.context()
    );
    assert_eq!(run.summary["ledger_damaged"], true, "{}", run.context());
    let problems = run.summary["ledger_problems"].as_array().unwrap();
    assert!(!problems.is_empty(), "{}", run.context());
    assert!(
        run.stderr.contains("gpuvisor: the ledger ") && run.stderr.contains(" was damaged: "),
        "a console line when it happened: {}",
        run.context()
    );
    // No absurd figure: peaks are the last sound ones (1 GiB), never random bytes.
    for process in run.processes() {
        for peak in process["peak_bytes"].as_array().unwrap() {
            assert!(peak.as_u64().unwrap() <= 16 * GIB, "{}", run.context());
        }
    }
    assert!(run.summary["denials_total"].as_u64().unwrap() < 1 << 40);
}

#[test]
fn an_overwritten_header_leaves_running_processes_enforced_and_says_so() {
    // Issue 14 item 4: new processes ran unlimited while the summary said "the shim let every
    // call through" for processes that were still enforced.
    let barrier = barrier_dir("header");
    let script = format!(
        r#""$P" init ctx 0 alloc 1GiB touch "$D/a" wait-file "$D/b" alloc 2GiB &
{}
printf 'XXXXXXXXXXXXXXXX' | dd of="$GPUVISOR_LEDGER" bs=1 seek=96 conv=notrunc 2>/dev/null
sleep 0.3; "$P" init ctx 0 alloc 3GiB; touch "$D/b"; wait"#,
        wait_for("a")
    );
    let run = exec_shell(
        &["--simulate", "1x16GiB", "--mem-per-process", "2GiB"],
        &script,
        &barrier,
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert_eq!(
        run.rcs("alloc"),
        [0, 0, OUT_OF_MEMORY],
        "the new process ran unlimited, the running one kept its budget: {}",
        run.context()
    );
    let shim_lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|line| line.starts_with("gpuvisor-shim:"))
        .collect();
    assert_eq!(shim_lines.len(), 1, "{}", run.context());
    assert!(shim_lines[0].contains("checksum"), "{}", run.context());
    assert_eq!(run.summary["ledger_damaged"], true);
    let consequence = run.summary["ledger_consequence"].as_str().unwrap();
    assert!(
        consequence.contains("start from now on")
            && consequence.contains("already running keep their budget"),
        "{consequence}"
    );
    assert_eq!(run.summary["unenforced"], serde_json::json!([]));
    assert_eq!(run.summary["denials_total"], 1, "{}", run.context());
}
