//! `gpuvisor run --simulate --metrics`: the sampler sees the simulated driver's per-process
//! usage, attributes it to replicas, applies the job file's policies and serves metrics.

mod driver;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use driver::{gpuvisor, linked};
use serde_json::Value;

fn scrape(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    Some(reply.split_once("\r\n\r\n")?.1.to_string())
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
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = gpuvisor()
        .current_dir(dir.path())
        .args([
            "run",
            "job.toml",
            "--run-dir",
            "run",
            "--simulate",
            "1x16GiB",
            "--quiet",
        ])
        .args(["--metrics", &port.to_string()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The holder's GPU memory, attributed to it through its shell, shows in the metrics.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut metrics = String::new();
    while Instant::now() < deadline {
        metrics = scrape(port).unwrap_or_default();
        if metrics.contains("gpuvisor_process_gpu_memory_bytes{job=\"job\",process=\"holder\"") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        metrics.contains("gpuvisor_process_gpu_memory_bytes{job=\"job\",process=\"holder\""),
        "{metrics}\n{stderr}"
    );
    // 512 MiB plus the simulated context (300 MiB).
    assert!(
        metrics.contains("gpuvisor_replica_gpu_memory_bytes{job=\"job\",process=\"holder\",replica=\"0\"} 851443712\n"),
        "{metrics}"
    );
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
    assert_eq!(used["seen_by"], "simulator");
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
