//! Reading a run directory's pieces.

use serde_json::json;

use crate::top::model::Tone;

use crate::top::record::{
    event_line, parse_events, parse_log_lines, parse_plan, read_tail, rows_from_events,
    rows_from_ps,
};

pub(super) const PLAN: &str = r#"{
  "job": "isaac-rl",
  "gpus": [{"index": 0, "name": "Simulated GPU 80.0 GiB", "total_bytes": 85899345920}],
  "replicas": [
    {"process": "learner", "replica": 0, "replicas": 1, "gpus": [{"index": 0}], "budget_bytes": 25769803776},
    {"process": "actor", "replica": 0, "replicas": 2, "gpus": [{"index": 0}], "budget_bytes": 8589934592},
    {"process": "actor", "replica": 1, "replicas": 2, "gpus": [{"index": 0}], "budget_bytes": 8589934592},
    {"process": "collector", "replica": 0, "replicas": 1, "gpus": [], "budget_bytes": 0}
  ]
}"#;

pub(super) const EVENTS: &str = r#"{"t":"2026-11-22T00:15:00.000Z","kind":"job-start","job":"isaac-rl","pid":100,"replicas":4}
{"t":"2026-11-22T00:15:00.100Z","kind":"start","process":"learner","replica":0,"pid":101,"life":1}
{"t":"2026-11-22T00:15:00.200Z","kind":"start","process":"actor[0]","replica":0,"pid":102,"life":1}
{"t":"2026-11-22T00:15:00.300Z","kind":"start","process":"actor[1]","replica":1,"pid":103,"life":1}
{"t":"2026-11-22T00:16:40.000Z","kind":"exit","process":"actor[1]","replica":1,"life":1,"run_ms":99700,"code":1,"cause":"cuda-oom","summary":"exit code 1"}
{"t":"2026-11-22T00:16:40.010Z","kind":"restart","process":"actor[1]","reason":"policy","delay_ms":2000,"restarts":1}
{"t":"2026-11-22T00:16:42.010Z","kind":"start","process":"actor[1]","replica":1,"pid":104,"life":2}
{"t":"2026-11-22T00:17:00.000Z","kind":"denial","process":"actor[0]","pid":102,"device":0,"size_bytes":2147483648,"used_bytes":7516192768,"limit_bytes":8589934592,"limit":"group"}
{"t":"2026-11-22T00:18:00.000Z","kind":"shutdown","reason":"Ctrl-C"}
{"t":"2026-11-22T00:18:00.500Z","kind":"exit","process":"learner","replica":0,"life":1,"run_ms":180000,"signal":"SIGINT","core_dumped":false,"cause":"stopped","summary":"stopped by SIGINT"}
{"t":"2026-11-22T00:18:00.600Z","kind":"exit","process":"actor[0]","replica":0,"life":1,"run_ms":180000,"signal":"SIGKILL","core_dumped":false,"cause":"oom-killer","summary":"killed by the OOM killer"}
{"t":"2026-11-22T00:18:01.000Z","kind":"job-end","status":1}
not json: a killed writer's half line
"#;

#[test]
fn the_plan_gives_labels_gpus_and_budgets() {
    let plan = parse_plan(PLAN).unwrap();
    assert_eq!(plan.job, "isaac-rl");
    assert_eq!(plan.gpus[0].total_bytes, 80 << 30);
    let labels: Vec<&str> = plan.replicas.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(labels, ["learner", "actor[0]", "actor[1]", "collector"]);
    assert_eq!(plan.replicas[1].gpus, [0]);
    assert_eq!(plan.replicas[3].gpus, Vec::<u32>::new());
    assert_eq!(plan.replicas[0].budget_bytes, 24 << 30);
}

#[test]
fn a_finished_run_is_folded_from_its_events() {
    let plan = parse_plan(PLAN).unwrap();
    let events = parse_events(EVENTS);
    assert_eq!(events.len(), 12, "the half line is skipped");
    let rows = rows_from_events(&plan, &events);
    let summary: Vec<(&str, &str, u32, Option<u32>)> = rows
        .iter()
        .map(|r| (r.key.as_str(), r.state.as_str(), r.restarts, r.pid))
        .collect();
    assert_eq!(
        summary,
        [
            ("learner", "exited", 0, Some(101)),
            ("actor[0]", "exited (failed)", 0, Some(102)),
            ("actor[1]", "running", 1, Some(104)),
            ("collector", "waiting", 0, None),
        ]
    );
    assert_eq!(rows[1].replica, Some(0));
    assert_eq!(rows[0].replica, None);
    assert_eq!(rows[1].budget_bytes, Some(8 << 30));
}

#[test]
fn a_finished_runs_rows_show_the_recorded_peaks() {
    let plan = parse_plan(PLAN).unwrap();
    let mut events = parse_events(EVENTS);
    events.push(json!({"t": "2026-11-22T00:18:01.000Z", "kind": "gpu-peaks",
                       "peak_bytes": {"learner": 3221225472u64, "actor[1]": 1073741824u64}}));
    let rows = rows_from_events(&plan, &events);
    let peaks: Vec<Option<u64>> = rows.iter().map(|r| r.gpu_peak_bytes).collect();
    assert_eq!(peaks, [Some(3 << 30), None, Some(1 << 30), None]);
    let used: Vec<Option<u64>> = rows.iter().map(|r| r.gpu_used_bytes).collect();
    assert_eq!(
        used,
        [Some(0), None, Some(0), None],
        "nothing held after the end"
    );
}

#[test]
fn events_are_worded_for_the_screen() {
    let events = parse_events(EVENTS);
    let lines: Vec<String> = events
        .iter()
        .map(event_line)
        .map(|e| format!("{} {} {}", e.time, e.kind, e.text))
        .collect();
    assert_eq!(lines[0], "00:15:00 job-start job isaac-rl (pid 100)");
    assert_eq!(lines[4], "00:16:40 exit actor[1] exit code 1 (cuda-oom)");
    assert_eq!(lines[5], "00:16:40 restart actor[1] in 2000 ms (policy)");
    assert_eq!(
        lines[7],
        "00:17:00 denial actor[0] pid 102: 2.0G refused (7.0G of 8.0G used)"
    );
    assert_eq!(lines[8], "00:18:00 shutdown Ctrl-C");
    assert_eq!(lines[11], "00:18:01 job-end status 1");
}

#[test]
fn an_events_colour_comes_from_its_typed_kind() {
    let tones: Vec<Tone> = parse_events(EVENTS)
        .iter()
        .map(|event| event_line(event).tone)
        .collect();
    // job-start, exit, restart, denial, shutdown, job-end.
    let picked = [tones[0], tones[4], tones[5], tones[7], tones[8], tones[11]];
    use Tone::*;
    assert_eq!(picked, [Good, Bad, Notice, Bad, Notice, Plain]);
    let unknown = json!({"t": "2026-11-22T00:18:02.000Z", "kind": "from-a-newer-gpuvisor"});
    assert_eq!(event_line(&unknown).tone, Plain);
    assert_eq!(event_line(&unknown).kind, "from-a-newer-gpuvisor");
}

#[test]
fn a_replicas_repeated_refusals_are_one_line_with_a_count_and_a_span() {
    let denial = |t: &str, process: &str| {
        json!({"t": t, "kind": "denial", "process": process, "pid": 102,
               "size_bytes": 2147483648u64, "used_bytes": 7516192768u64,
               "limit_bytes": 8589934592u64})
    };
    let mut events: Vec<serde_json::Value> = (0..16)
        .map(|n| denial(&format!("2026-11-22T00:17:{:02}.500Z", n), "actor[0]"))
        .collect();
    events.insert(1, denial("2026-11-22T00:17:01.000Z", "actor[1]"));
    events.push(
        json!({"t": "2026-11-22T00:17:20.000Z", "kind": "exit", "process": "actor[0]",
                       "summary": "exit code 1", "cause": "cuda-oom"}),
    );
    events.push(denial("2026-11-22T00:17:30.000Z", "actor[0]"));
    let lines: Vec<String> = super::super::record::event_lines(&events)
        .iter()
        .map(|e| format!("{} {} {}", e.time, e.kind, e.text))
        .collect();
    assert_eq!(
        lines,
        [
            "00:17:00 denial actor[0] pid 102: 2.0G refused (7.0G of 8.0G used) ×16 in 15.0 s, until 00:17:15",
            "00:17:01 denial actor[1] pid 102: 2.0G refused (7.0G of 8.0G used)",
            "00:17:20 exit actor[0] exit code 1 (cuda-oom)",
            "00:17:30 denial actor[0] pid 102: 2.0G refused (7.0G of 8.0G used)",
        ]
    );
}

#[test]
fn the_physical_alarms_are_worded_for_the_screen() {
    let events = parse_events(concat!(
        r#"{"t":"2026-11-22T00:17:30.000Z","kind":"untracked-memory","process":"sim","replica":0,"physical_bytes":12884901888,"charged_bytes":8589934592,"untracked_bytes":4294967296,"threshold_bytes":536870912}"#,
        "\n",
        r#"{"t":"2026-11-22T00:17:31.000Z","kind":"physical-memory-low","gpu":0,"uuid":"GPU-0","free_bytes":1073741824,"reserve_bytes":2147483648,"untracked_bytes":4294967296}"#,
        "\n",
        r#"{"t":"2026-11-22T00:17:40.000Z","kind":"physical-memory-low","gpu":0,"uuid":"GPU-0","free_bytes":3221225472,"reserve_bytes":2147483648,"cleared":true}"#,
    ));
    let lines: Vec<String> = events.iter().map(|e| event_line(e).text).collect();
    assert_eq!(
        lines,
        [
            "sim: 4.0G on the GPU the ledger never charged (over 512M)",
            "GPU 0: 1.0G free, below the 2.0G reserve, with every budget held",
            "GPU 0: free memory back above the reserve",
        ]
    );
}

#[test]
fn ps_replies_become_rows() {
    let reply = json!([
        {"process": "actor", "replica": 1, "label": "actor[1]", "state": "running", "pid": 4242,
         "group": 4240, "restarts": 1, "gpu_used_bytes": 1073741824, "gpu_peak_bytes": 2147483648u64,
         "budget_bytes": 8053063680u64, "uptime_ms": 5321, "last_exit": "exit code 1"},
        {"process": "learner", "replica": 0, "label": "learner", "state": "backoff", "pid": null,
         "restarts": 3, "budget_bytes": 0}
    ]);
    let rows = rows_from_ps(&reply);
    assert_eq!(rows[0].key, "actor[1]");
    assert_eq!(rows[0].name, "actor");
    assert_eq!(rows[0].replica, Some(1));
    assert_eq!(rows[0].pid, Some(4242));
    assert_eq!(rows[0].gpu_used_bytes, Some(1 << 30));
    assert_eq!(rows[0].gpu_peak_bytes, Some(2 << 30));
    assert_eq!(rows[0].restarts, 1);
    assert_eq!(rows[1].replica, None);
    assert_eq!(rows[1].pid, None);
    assert_eq!(rows[1].gpu_used_bytes, None);
    assert_eq!(rows[1].state, "backoff");
}

#[test]
fn log_lines_lose_the_date_and_keep_the_stream() {
    let lines = parse_log_lines(
        "2026-11-21T23:25:16.123Z O step 1\n2026-11-21T23:25:17.000Z E Traceback (most recent call last):\nplain line\n",
    );
    assert_eq!(lines.len(), 3);
    assert_eq!(
        (
            lines[0].time.as_str(),
            lines[0].stderr,
            lines[0].text.as_str()
        ),
        ("23:25:16", false, "step 1")
    );
    assert_eq!(
        (lines[1].time.as_str(), lines[1].stderr),
        ("23:25:17", true)
    );
    assert_eq!(lines[1].text, "Traceback (most recent call last):");
    assert_eq!(
        (lines[2].time.as_str(), lines[2].text.as_str()),
        ("", "plain line")
    );
}

#[test]
fn format_2_log_lines_take_the_time_and_stream_of_their_marker() {
    let lines = parse_log_lines(
        "\x1egpuvisor-log 2\n\x1e2026-11-21T23:25:16.123Z O\nstep 1\nstep 2\n\x1e2026-11-21T23:25:17.000Z E\nboom\n",
    );
    let seen: Vec<(&str, bool, &str)> = lines
        .iter()
        .map(|line| (line.time.as_str(), line.stderr, line.text.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("23:25:16", false, "step 1"),
            ("23:25:16", false, "step 2"),
            ("23:25:17", true, "boom")
        ]
    );
}

#[test]
fn a_tail_starts_at_a_line_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.log");
    let text: String = (0..1000).map(|n| format!("line {n}\n")).collect();
    std::fs::write(&path, &text).unwrap();
    let tail = read_tail(&path, 100).unwrap();
    assert!(tail.len() <= 100);
    assert!(tail.starts_with("line "), "{tail:?}");
    assert!(tail.ends_with("line 999\n"));
    assert_eq!(read_tail(&path, 1 << 20).unwrap(), text);
}

#[test]
fn a_queued_replica_shows_its_place_then_waits_once_admitted() {
    let plan = parse_plan(PLAN).unwrap();
    let queued = r#"{"t":"2026-11-22T00:15:00.000Z","kind":"queued","process":"actor[1]","replica":1,"position":2}"#;
    let events = parse_events(queued);
    assert_eq!(rows_from_events(&plan, &events)[2].state, "queued #2");
    let admitted = format!(
        "{queued}\n{}",
        r#"{"t":"2026-11-22T00:15:09.000Z","kind":"admitted","process":"actor[1]","replica":1,"gpus":[0],"budget_bytes":8589934592,"waited_ms":9000}"#
    );
    let events = parse_events(&admitted);
    assert_eq!(rows_from_events(&plan, &events)[2].state, "waiting");
}
