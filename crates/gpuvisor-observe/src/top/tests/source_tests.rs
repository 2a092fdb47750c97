//! The sources against a run directory with a fake supervisor socket, and a fake GPU source.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::sync::{Arc, Mutex};

use gpuvisor_probe::{DeviceReading, GpuProcessReading, GpuReading, GpuSource};
use serde_json::{json, Value};

use super::record_tests::{EVENTS, PLAN};
use crate::top::app::Action;
use crate::top::source::{RunSource, TopSource};
use crate::top::MachineSource;

/// A GPU source whose every read is what `read` makes.
struct FakeGpus<F>(F);

impl<F: FnMut() -> Result<GpuReading, String> + Send> GpuSource for FakeGpus<F> {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn read(&mut self) -> GpuReading {
        (self.0)().unwrap_or_default()
    }
    fn try_read(&mut self) -> Result<GpuReading, String> {
        (self.0)()
    }
}

/// One GPU, `index`, of which `used` bytes are in use.
fn device(index: u32, total: u64, used: u64, util: Option<u32>) -> DeviceReading {
    DeviceReading {
        index,
        total_bytes: total,
        used_bytes: used,
        free_bytes: total - used,
        utilization_percent: util,
        ..DeviceReading::default()
    }
}

fn run_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("plan.json"), PLAN).unwrap();
    std::fs::write(dir.path().join("events.jsonl"), EVENTS).unwrap();
    std::fs::create_dir(dir.path().join("logs")).unwrap();
    std::fs::write(
        dir.path().join("logs/actor.1.log"),
        "2026-11-22T00:16:43.000Z O actor 1 up\n2026-11-22T00:16:44.000Z E warning: slow\n",
    )
    .unwrap();
    dir
}

/// Answers `ps` with two replicas (one in this process's own process group, so CPU and RSS
/// have something to read) and records every other request.
/// With `sample`, `{"cmd":"sample"}` gets it as the sampler's snapshot; without, the request
/// is refused as a supervisor without the sampler refuses it.
fn fake_supervisor(socket: &std::path::Path, sample: Option<Value>) -> Arc<Mutex<Vec<Value>>> {
    let listener = UnixListener::bind(socket).unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&requests);
    // The "keeper" of the first replica is this test process: its tree has it.
    let own_group = std::process::id();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                let request: Value = serde_json::from_str(&line).unwrap();
                let reply = if request["cmd"] == "ps" {
                    json!({"ok": true, "job": "isaac-rl", "replicas": [
                        {"process": "learner", "replica": 0, "label": "learner", "state": "running",
                         "pid": 101, "group": own_group, "restarts": 0, "gpu_used_bytes": 20u64 << 30,
                         "gpu_peak_bytes": 21u64 << 30, "budget_bytes": 24u64 << 30},
                        {"process": "actor", "replica": 1, "label": "actor[1]", "state": "running",
                         "pid": 104, "restarts": 1, "gpu_used_bytes": 3u64 << 30,
                         "budget_bytes": 8u64 << 30}
                    ]})
                } else if request["cmd"] == "sample" {
                    match &sample {
                        Some(sample) => json!({"ok": true, "sample": sample}),
                        None => {
                            json!({"ok": false, "error": "bad request: unknown variant `sample`"})
                        }
                    }
                } else if request["process"] == "nope" {
                    json!({"ok": false, "error": "no process `nope` in job isaac-rl\n  hint: processes are: learner, actor"})
                } else {
                    seen.lock().unwrap().push(request.clone());
                    json!({"ok": true})
                };
                let mut stream = &stream;
                writeln!(stream, "{reply}").unwrap();
                line.clear();
            }
        }
    });
    requests
}

#[test]
fn a_live_run_reads_the_socket_and_sends_restarts() {
    let dir = run_dir();
    let requests = fake_supervisor(&dir.path().join("control.sock"), None);
    let gpus = Box::new(FakeGpus(|| {
        Ok(GpuReading {
            devices: vec![device(0, 25 << 30, 25 << 30, Some(64))],
            processes: Vec::new(),
        })
    }));
    let mut source = RunSource::new(dir.path().to_path_buf(), Some(gpus));
    let model = source.poll(Some("actor[1]"));
    assert_eq!(model.source_note, "live");
    assert!(model.warning.is_none(), "{:?}", model.warning);
    let keys: Vec<&str> = model.rows.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["learner", "actor[1]"]);
    // RSS of the replica's tree: this test process at least.
    assert!(model.rows[0].rss_bytes.unwrap() > 1 << 20);
    assert_eq!(model.rows[1].rss_bytes, None, "no group, no figure");
    assert!(model.rows[1].since_log_secs.unwrap() < 60);
    // The GPU: the plan's device, the probe's figures, one segment per GPU replica.
    let gpu = &model.gpus[0];
    assert_eq!(gpu.total_bytes, 80 << 30);
    assert_eq!(gpu.used_bytes, Some(25 << 30));
    assert_eq!(gpu.util_history.back(), Some(&64));
    let segments: Vec<(&str, u64, Option<u64>)> = gpu
        .segments
        .iter()
        .map(|s| (s.label.as_str(), s.used_bytes, s.budget_bytes))
        .collect();
    assert_eq!(
        segments,
        [
            ("learner", 20 << 30, Some(24 << 30)),
            ("actor[0]", 0, Some(8 << 30)),
            ("actor[1]", 3 << 30, Some(8 << 30)),
        ],
        "the CPU-only collector holds no segment"
    );
    assert_eq!(model.log_title, "logs/actor.1.log");
    assert_eq!(model.log_tail.len(), 2);
    assert!(model.log_tail[1].stderr);
    assert_eq!(model.events.last().unwrap().kind, "job-end");

    // A second poll at once: too soon for a CPU figure; the util history grows.
    let model = source.poll(Some("learner"));
    assert_eq!(model.rows[0].cpu_percent, None);
    assert_eq!(model.gpus[0].util_history.len(), 2);
    // Later, with CPU burnt in between: a figure, measured from the first poll.
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(150) {
        std::hint::black_box((0..1000u64).sum::<u64>());
    }
    let model = source.poll(Some("learner"));
    let cpu = model.rows[0].cpu_percent.expect("a CPU figure");
    assert!(cpu > 0.0, "a busy loop in this tree: {cpu}%");
    assert_eq!(model.log_title, "logs/learner.log (none yet)");

    assert_eq!(
        source.act(&Action::Restart("actor".into())),
        Ok("restart of actor requested".into())
    );
    assert_eq!(
        source.act(&Action::Stop("learner".into())),
        Ok("stop of learner requested".into())
    );
    assert_eq!(
        source.act(&Action::Restart("nope".into())),
        Err("no process `nope` in job isaac-rl".into())
    );
    assert_eq!(
        *requests.lock().unwrap(),
        [
            json!({"cmd": "restart", "process": "actor"}),
            json!({"cmd": "stop", "process": "learner"})
        ]
    );
}

#[test]
fn a_sampled_run_takes_the_sampler_s_figures() {
    let dir = run_dir();
    let sample = json!({
        "time_unix_ms": 1, "interval_ms": 500, "job": "isaac-rl", "gpu_source": "simulator",
        "gpus": [{"index": 0, "uuid": "GPU-0", "name": "Simulated GPU 80.0 GiB",
                  "total_bytes": 80u64 << 30, "used_bytes": 31u64 << 30,
                  "utilization_percent": 77, "headroom_alarm": false}],
        "replicas": [
            {"process": "learner", "replica": 0, "label": "learner", "state": "running",
             "pid": 101, "process_count": 3, "rss_bytes": 2u64 << 30, "cpu_percent": 150.5,
             "gpu_bytes": 21u64 << 30, "gpu_utilization_percent": 60,
             "ledger_used_bytes": 20u64 << 30, "budget_bytes": 24u64 << 30, "denials": 0,
             "untracked_bytes": 3u64 << 30, "untracked_alarm": true,
             "quiet_ms": 720_000, "stall": "waiting"},
            {"process": "actor", "replica": 1, "label": "actor[1]", "state": "backoff",
             "pid": null, "process_count": 0, "rss_bytes": 0, "cpu_percent": 0.0,
             "gpu_bytes": 0, "gpu_utilization_percent": null, "ledger_used_bytes": null,
             "budget_bytes": 8u64 << 30, "denials": 2, "quiet_ms": 3000, "stall": null}
        ],
        "processes": [], "foreign_gpu_processes": [],
        "counters": {"denials": 2, "violations": 0, "restarts": 1, "stalls": 1, "policy_actions": 0}
    });
    fake_supervisor(&dir.path().join("control.sock"), Some(sample));
    // The GPUs are not read here: the snapshot has them.
    let gpus = Box::new(FakeGpus(|| -> Result<GpuReading, String> {
        panic!("GPUs read")
    }));
    let mut source = RunSource::new(dir.path().to_path_buf(), Some(gpus));
    let model = source.poll(None);
    assert_eq!(model.source_note, "live, sampled");
    let learner = &model.rows[0];
    assert_eq!(learner.rss_bytes, Some(2 << 30));
    assert_eq!(learner.cpu_percent, Some(150.5));
    assert_eq!(learner.gpu_util_percent, Some(60));
    assert_eq!(
        learner.gpu_used_bytes,
        Some(20 << 30),
        "the ledger's figure from ps stays"
    );
    assert_eq!(learner.since_log_secs, Some(720));
    assert_eq!(learner.stall.as_deref(), Some("waiting"));
    assert_eq!(learner.untracked_bytes, Some(3 << 30));
    assert!(learner.untracked_alarm);
    let actor = &model.rows[1];
    assert_eq!(
        actor.rss_bytes, None,
        "not running: its zeros are not figures"
    );
    assert_eq!(actor.cpu_percent, None);
    assert_eq!(actor.since_log_secs, Some(3));
    assert_eq!(actor.untracked_bytes, None, "no ledger: nothing to compare");
    assert_eq!(model.gpus[0].used_bytes, Some(31 << 30));
    assert_eq!(model.gpus[0].util_history.back(), Some(&77));
    let text = crate::top::render_to_text(&crate::top::TopApp::new(model, false), 120, 30);
    assert!(text.contains("stall: waiting"), "{text}");
    assert!(text.contains("12m"), "quiet for 720 s:\n{text}");
    assert!(text.contains("UNTRK"), "{text}");
    assert!(
        text.contains("3.0G"),
        "the learner's untracked memory:\n{text}"
    );
}

#[test]
fn a_finished_run_reads_its_record() {
    let dir = run_dir();
    let mut source = RunSource::new(dir.path().to_path_buf(), None);
    let model = source.poll(None);
    assert_eq!(model.source_note, "not running: from its record");
    assert_eq!(model.rows.len(), 4);
    assert_eq!(model.rows[1].state, "exited (failed)");
    assert_eq!(model.gpus[0].util_history.len(), 0);
    assert_eq!(model.events.len(), 12);
    let error = source.act(&Action::Stop("learner".into())).unwrap_err();
    assert!(error.starts_with("the run is not running"), "{error}");
}

#[test]
fn a_torn_last_line_of_a_finished_run_is_skipped_with_a_warning() {
    let dir = run_dir();
    let mut source = RunSource::new(dir.path().to_path_buf(), None);
    assert_eq!(source.poll(None).warning, None);
    let mut events = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join("events.jsonl"))
        .unwrap();
    std::io::Write::write_all(&mut events, b"{\"t\":\"2026-").unwrap();
    let mut source = RunSource::new(dir.path().to_path_buf(), None);
    let model = source.poll(None);
    assert_eq!(model.events.len(), 12, "the whole events are all shown");
    assert!(model.warning.unwrap().contains("last line is torn"));
}

#[test]
fn a_directory_without_a_plan_warns_and_still_draws() {
    let dir = tempfile::tempdir().unwrap();
    let mut source = RunSource::new(dir.path().to_path_buf(), None);
    let model = source.poll(None);
    assert!(model.warning.unwrap().contains("plan.json"));
    assert!(model.rows.is_empty());
}

#[test]
fn machine_wide_rows_come_and_go_with_events() {
    let own = std::process::id();
    let tick = Arc::new(Mutex::new(0));
    let ticks = Arc::clone(&tick);
    let gpus = Box::new(FakeGpus(move || {
        let n = *ticks.lock().unwrap();
        let mut processes = vec![GpuProcessReading {
            pid: own as i32,
            used_bytes: Some(5 << 30),
            name: Some("python3".into()),
            ..GpuProcessReading::default()
        }];
        if n == 0 {
            processes.push(GpuProcessReading {
                pid: 999_999_999,
                ..GpuProcessReading::default()
            });
        }
        Ok(GpuReading {
            devices: vec![DeviceReading {
                name: Some("GPU".into()),
                ..device(0, 80 << 30, 6 << 30, None)
            }],
            processes,
        })
    }));
    let mut source = MachineSource::new(gpus, "simulated".into());
    let model = source.poll(None);
    assert!(!model.supervised);
    assert_eq!(model.rows.len(), 2);
    assert_eq!(model.rows[0].pid, Some(own));
    assert_eq!(model.rows[0].state, "on GPU 0");
    assert_eq!(model.rows[0].gpu_used_bytes, Some(5 << 30));
    assert!(
        model.rows[0].rss_bytes.is_some(),
        "this process is in /proc"
    );
    assert_eq!(model.rows[1].rss_bytes, None, "that pid is not");
    assert_eq!(
        model.gpus[0].segments[0].label,
        "python3 (".to_string() + &own.to_string() + ")"
    );
    assert_eq!(model.events.len(), 2);
    *tick.lock().unwrap() = 1;
    std::thread::sleep(std::time::Duration::from_millis(120));
    let model = source.poll(None);
    assert_eq!(model.rows.len(), 1);
    assert!(model.rows[0].cpu_percent.is_some());
    let last = model.events.last().unwrap();
    assert_eq!(last.kind, "exit");
    assert_eq!(last.text, "? pid 999999999 released the GPU");
    assert!(source.act(&Action::Stop("python3".into())).is_err());
}

#[test]
fn a_probe_reading_becomes_samples_with_used_as_total_minus_free() {
    use crate::top::source::gpu_samples_of_reading;
    let reading = GpuReading {
        devices: vec![DeviceReading {
            index: 3,
            uuid: "GPU-3".into(),
            name: Some("NVIDIA L4".into()),
            total_bytes: 1000,
            used_bytes: 100,
            free_bytes: 850,
            utilization_percent: Some(140),
            ..DeviceReading::default()
        }],
        processes: vec![GpuProcessReading {
            pid: 77,
            device: 3,
            used_bytes: None,
            utilization_percent: Some(9),
            name: Some("python3".into()),
        }],
    };
    let samples = gpu_samples_of_reading(&reading);
    assert_eq!(samples.len(), 1);
    let sample = &samples[0];
    assert_eq!((sample.index, sample.name.as_str()), (3, "NVIDIA L4"));
    // What nobody else can have: the driver's reserve counts as used.
    assert_eq!(sample.used_bytes, Some(150));
    assert_eq!(sample.util_percent, Some(100), "capped");
    assert_eq!(
        sample.processes,
        vec![gpuvisor_core::inventory::GpuProcess {
            pid: 77,
            used_bytes: None,
            name: Some("python3".into())
        }]
    );
    assert_eq!(sample.node, None);
}
