//! `gpuvisor run --simulate --metrics`: the sampler sees the simulated driver's per-process
//! usage (through NVML: the simulator's stand-in `libnvidia-ml.so.1`, loaded by nvml-wrapper as
//! on a real machine), attributes it to replicas, applies the job file's policies and serves
//! metrics; memory the shim never sees (a simulated context) shows as untracked everywhere.

use crate::driver;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use driver::{gpuvisor, linked};
use serde_json::Value;

const GIB: u64 = 1 << 30;

fn scrape(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    Some(reply.split_once("\r\n\r\n")?.1.to_string())
}

/// A free loopback port for `--metrics`.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `job.toml` in `dir` on one simulated 16 GiB GPU, recording into `dir/run`, with
/// metrics on `port` and this extra environment.
fn start(dir: &Path, port: u16, env: &[(&str, &str)]) -> Child {
    gpuvisor()
        .current_dir(dir)
        .envs(env.iter().copied())
        .args([
            "run",
            "job.toml",
            "--run-dir",
            "run",
            "--simulate",
            "1x16GiB",
        ])
        .args(["--quiet", "--metrics", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Scrapes `port` until `done` holds or 30 s pass; the last scrape.
fn scrape_until(port: u16, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut metrics = String::new();
    while Instant::now() < deadline {
        metrics = scrape(port).unwrap_or_default();
        if done(&metrics) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    metrics
}

/// Waits for the run to end; its exit status and stderr.
fn finish(child: Child) -> (std::process::ExitStatus, String) {
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status, stderr)
}

#[test]
fn policies_act_on_simulated_gpu_use_and_metrics_show_it() {
    let dir = tempfile::tempdir().unwrap();
    let program = linked().display().to_string();
    let job = format!(
        r#"
[job]
enforce = "framework"
sample_interval = "100ms"

[gpus]
headroom_alarm = "15GiB"

[process.holder]
command = ["sh", "-c", "echo up; {program} init ctx 0 alloc 512MiB sleep 6000"]
framework = "cuda"
memory = "1GiB"

[process.trainer]
command = ["sh", "-c", "{program} init ctx 0 alloc 2GiB sleep 30000"]
framework = "cuda"
memory = "1GiB"
on_budget_exceeded = "kill"

[process.collector]
command = ["sh", "-c", "{program} init ctx 0 alloc 256MiB sleep 30000; true"]
device = "cpu"
env = {{ CUDA_VISIBLE_DEVICES = "0" }}
on_gpu_use = "kill"
"#
    );
    std::fs::write(dir.path().join("job.toml"), job).unwrap();
    let port = free_port();
    let child = start(dir.path(), port, &[]);
    // The holder's GPU memory, attributed to it through its shell, shows in the metrics: once
    // its allocation is made (the context alone, 300 MiB, can show a sample earlier).
    let holder_total = "gpuvisor_replica_gpu_memory_bytes{job=\"job\",process=\"holder\",replica=\"0\"} 851443712\n";
    let metrics = scrape_until(port, |metrics| {
        metrics.contains("gpuvisor_process_gpu_memory_bytes{job=\"job\",process=\"holder\"")
            && metrics.contains(holder_total)
    });
    let (status, stderr) = finish(child);
    assert!(
        metrics.contains("gpuvisor_process_gpu_memory_bytes{job=\"job\",process=\"holder\""),
        "{metrics}\n{stderr}"
    );
    // 512 MiB plus the simulated context (300 MiB).
    assert!(metrics.contains(holder_total), "{metrics}");
    assert!(status.code().is_some(), "{stderr}");
    let events =
        gpuvisor_supervisor::events::read_events(&dir.path().join("run/events.jsonl")).unwrap();
    let find = |kind: &str, process: &str| -> Option<&serde_json::Map<String, Value>> {
        events
            .iter()
            .find(|event| event["kind"] == kind && event["process"] == process)
    };
    let over = find("budget-exceeded", "trainer").unwrap_or_else(|| panic!("{events:#?}"));
    assert_eq!(over["action"], "kill");
    assert_eq!(over["budget_bytes"], 1u64 << 30);
    assert_eq!(over["used_bytes"], (2u64 << 30) + (300 << 20));
    assert!(find("stop", "trainer").is_some(), "{events:#?}");
    let used = find("gpu-use", "collector").unwrap_or_else(|| panic!("{events:#?}"));
    // Seen through NVML: the simulator's stand-in, loaded by nvml-wrapper.
    assert_eq!(used["seen_by"], "simulator-nvml");
    assert!(
        used["command"].as_str().unwrap().contains("alloc 256MiB"),
        "{used:?}"
    );
    assert!(find("budget-exceeded", "holder").is_none());
    assert!(
        events
            .iter()
            .any(|event| event["kind"] == "headroom-low" && event["gpu"] == 0),
        "{events:#?}"
    );
    // The samples record has the holder's usage.
    let (header, records) =
        gpuvisor_supervisor::samples::read_samples(&dir.path().join("run/samples")).unwrap();
    assert_eq!(header.replicas, vec!["holder", "trainer", "collector"]);
    assert!(records
        .iter()
        .any(|record| record.replicas[0].gpu_bytes == 851443712));
}

fn ps(run: &Path, json: bool) -> String {
    let mut command = gpuvisor();
    command.arg("ps").arg(run);
    if json {
        command.arg("--json");
    }
    let output = command.output().unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn untracked_memory_fires_its_event_and_shows_in_metrics_ps_samples_explain_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let program = linked().display().to_string();
    // 16 GiB, 8 GiB reserved: the plan may use 8. The holder charges 1 GiB of its 2 GiB budget
    // and its context holds 8 GiB more, physically: 9 GiB used, 7 free, below the reserve.
    let job = format!(
        r#"
[job]
sample_interval = "100ms"

[gpus]
reserve = "8GiB"

[process.holder]
command = ["{program}", "init", "ctx", "0", "alloc", "1GiB", "sleep", "30000"]
framework = "cuda"
memory = "2GiB"
"#
    );
    std::fs::write(dir.path().join("job.toml"), job).unwrap();
    let port = free_port();
    let child = start(
        dir.path(),
        port,
        &[("GPUVISOR_SIM_CONTEXT_OVERHEAD", "8GiB")],
    );
    let run = dir.path().join("run");
    let untracked_line =
        "gpuvisor_replica_untracked_bytes{job=\"job\",process=\"holder\",replica=\"0\"} 8589934592\n";
    let metrics = scrape_until(port, |metrics| {
        metrics.contains(untracked_line)
            && metrics.contains("gpuvisor_gpu_physical_alarm{job=\"job\",gpu=\"0\"")
    });
    let table = ps(&run, false);
    let json: Value = serde_json::from_str(&ps(&run, true)).unwrap_or(Value::Null);
    let _ = gpuvisor().arg("stop").arg(&run).output();
    let (status, stderr) = finish(child);
    assert!(status.code().is_some(), "{stderr}");

    // Metrics: physical 9 GiB, charged 1 GiB, 8 GiB untracked, past the 512 MiB default.
    assert!(metrics.contains(untracked_line), "{metrics}\n{stderr}");
    assert!(
        metrics.contains(
            "gpuvisor_replica_untracked_alarm{job=\"job\",process=\"holder\",replica=\"0\"} 1\n"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpuvisor_replica_gpu_memory_bytes{job=\"job\",process=\"holder\",replica=\"0\"} 9663676416\n"),
        "{metrics}"
    );
    assert!(
        metrics.lines().any(|line| line
            .starts_with("gpuvisor_gpu_physical_alarm{job=\"job\",gpu=\"0\"")
            && line.ends_with(" 1")),
        "{metrics}"
    );
    // ps: the column, and the figure in --json.
    assert!(table.contains("UNTRACKED"), "{table}");
    assert!(table.contains("8.0 GiB (alarm)"), "{table}");
    assert_eq!(json["replicas"][0]["untracked_bytes"], 8 * GIB, "{json}");
    assert_eq!(json["replicas"][0]["untracked_alarm"], true, "{json}");

    // Events: the replica's untracked memory, and the card below its reserve with the budget held.
    let events = gpuvisor_supervisor::events::read_events(&run.join("events.jsonl")).unwrap();
    let untracked = events
        .iter()
        .find(|event| event["kind"] == "untracked-memory")
        .unwrap_or_else(|| panic!("{events:#?}"));
    assert_eq!(untracked["process"], "holder");
    assert_eq!(untracked["untracked_bytes"], 8 * GIB);
    assert_eq!(untracked["charged_bytes"], GIB);
    assert_eq!(untracked["threshold_bytes"], 512u64 << 20);
    let card = events
        .iter()
        .find(|event| event["kind"] == "physical-memory-low")
        .unwrap_or_else(|| panic!("{events:#?}"));
    assert_eq!(card["free_bytes"], 7 * GIB);
    assert_eq!(card["reserve_bytes"], 8 * GIB);

    // Samples keep the figure.
    let (_, records) = gpuvisor_supervisor::samples::read_samples(&run.join("samples")).unwrap();
    assert!(
        records
            .iter()
            .any(|record| record.replicas[0].untracked_bytes == Some(8 * GIB)),
        "{records:?}"
    );

    // explain RUN names the alarms; the report draws the untracked band and lists the peak.
    let explain = gpuvisor().arg("explain").arg(&run).output().unwrap();
    let explained = String::from_utf8_lossy(&explain.stdout);
    assert!(
        explained.contains("untracked memory:")
            && explained.contains("holder: up to 8.0 GiB of GPU memory the ledger never charged")
            && explained.contains("past its untracked_alarm 512.0 MiB"),
        "{explained}"
    );
    assert!(
        explained.contains("GPU 0: 7.0 GiB free, below the plan's reserve 8.0 GiB"),
        "{explained}"
    );
    let page = dir.path().join("report.html");
    let report = gpuvisor()
        .arg("report")
        .arg(&run)
        .arg("-o")
        .arg(&page)
        .output()
        .unwrap();
    assert_eq!(report.status.code(), Some(0), "{report:?}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("<title>untracked: the job&#39;s memory beyond the ledger (contexts, modules, unhooked): peak 8.0 GiB"),
        "the band of untracked memory in the memory chart"
    );
    assert!(
        html.contains("<b class=\"over\">8.0 GiB</b>"),
        "the peak, past its alarm"
    );
    assert!(html.contains("Memory the ledger never charged"));
}
