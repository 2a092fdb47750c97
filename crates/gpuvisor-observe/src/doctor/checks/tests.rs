use std::collections::BTreeMap;

use super::*;
use crate::doctor::facts::GpuProcessFacts;

fn statuses(findings: &[Finding]) -> Vec<(&str, Status)> {
    findings
        .iter()
        .map(|f| (f.check.as_str(), f.status))
        .collect()
}

fn python(packages: &[(&str, &str)], torch_cuda: Option<&str>) -> Python {
    Python::Found(PythonInfo {
        executable: "/venv/bin/python3".into(),
        version: "3.11.9".into(),
        packages: packages
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        torch_cuda: torch_cuda.map(str::to_string),
        torch_hip: None,
        tensorflow_cuda: None,
    })
}

#[test]
fn no_driver_fails_and_says_what_was_not_checked() {
    let findings = check_driver(&Driver::Missing {
        reason: "libnvidia-ml.so.1 cannot be loaded".into(),
    });
    assert_eq!(
        statuses(&findings),
        [("driver", Status::Fail), ("gpus", Status::Skip)]
    );
    assert!(findings[0].fix.as_deref().unwrap().contains("--simulate"));
}

#[test]
fn torch_newer_major_than_driver_fails() {
    let findings = check_python(&python(&[("torch", "2.5.1")], Some("12.4")), Some((11, 8)));
    let torch = findings.iter().find(|f| f.check == "torch").unwrap();
    assert_eq!(torch.status, Status::Fail, "{torch:?}");
    assert!(torch.summary.contains("11.8"));
}

#[test]
fn torch_newer_minor_than_driver_warns_and_older_is_ok() {
    let newer = check_python(&python(&[("torch", "2.5.1")], Some("12.4")), Some((12, 2)));
    assert_eq!(
        newer.iter().find(|f| f.check == "torch").unwrap().status,
        Status::Warn
    );
    let older = check_python(&python(&[("torch", "2.5.1")], Some("12.1")), Some((12, 4)));
    assert_eq!(
        older.iter().find(|f| f.check == "torch").unwrap().status,
        Status::Ok
    );
    let unknown = check_python(&python(&[("torch", "2.5.1")], Some("12.1")), None);
    assert_eq!(
        unknown.iter().find(|f| f.check == "torch").unwrap().status,
        Status::Skip
    );
}

#[test]
fn torch_cpu_build_warns() {
    let findings = check_python(&python(&[("torch", "2.5.1+cpu")], None), Some((12, 4)));
    assert_eq!(
        findings.iter().find(|f| f.check == "torch").unwrap().status,
        Status::Warn
    );
}

#[test]
fn jax_without_plugin_or_with_mismatched_plugin() {
    let none = check_python(
        &python(&[("jax", "0.4.35"), ("jaxlib", "0.4.35")], None),
        Some((12, 4)),
    );
    let jax = none.iter().find(|f| f.check == "jax").unwrap();
    assert_eq!(jax.status, Status::Warn);
    assert!(jax.fix.as_deref().unwrap().contains("jax[cuda12]"));

    let mismatched = check_python(
        &python(
            &[
                ("jax", "0.4.35"),
                ("jaxlib", "0.4.35"),
                ("jax-cuda12-plugin", "0.4.31"),
            ],
            None,
        ),
        Some((12, 4)),
    );
    assert_eq!(
        mismatched.iter().find(|f| f.check == "jax").unwrap().status,
        Status::Fail
    );

    let good = check_python(
        &python(
            &[
                ("jax", "0.4.35"),
                ("jaxlib", "0.4.35"),
                ("jax-cuda12-plugin", "0.4.35"),
            ],
            None,
        ),
        Some((12, 4)),
    );
    assert_eq!(
        good.iter().find(|f| f.check == "jax").unwrap().status,
        Status::Ok
    );

    let cuda13_on_12 = check_python(
        &python(
            &[
                ("jax", "0.8.0"),
                ("jaxlib", "0.8.0"),
                ("jax-cuda13-plugin", "0.8.0"),
            ],
            None,
        ),
        Some((12, 8)),
    );
    assert_eq!(
        cuda13_on_12
            .iter()
            .find(|f| f.check == "jax")
            .unwrap()
            .status,
        Status::Fail
    );

    let old_builtin = check_python(
        &python(
            &[("jax", "0.4.13"), ("jaxlib", "0.4.13+cuda12.cudnn89")],
            None,
        ),
        Some((12, 2)),
    );
    assert_eq!(
        old_builtin
            .iter()
            .find(|f| f.check == "jax")
            .unwrap()
            .status,
        Status::Ok
    );
}

#[test]
fn python_missing_is_a_skip_not_a_failure() {
    let findings = check_python(
        &Python::NotFound {
            interpreter: "python3".into(),
        },
        None,
    );
    assert_eq!(statuses(&findings), [("python", Status::Skip)]);
    let findings = check_python(&Python::TimedOut { seconds: 5 }, None);
    assert_eq!(statuses(&findings), [("python", Status::Skip)]);
}

fn gpu() -> GpuFacts {
    GpuFacts {
        index: 0,
        name: "NVIDIA H100 80GB HBM3".into(),
        total_bytes: 80 * GIB,
        free_bytes: 70 * GIB,
        mig: Some(false),
        persistence: Some(true),
        ecc: Some(true),
        ecc_uncorrected: Some(0),
        compute_mode: Some("default".into()),
        processes: Vec::new(),
    }
}

#[test]
fn a_healthy_gpu_is_one_ok_line() {
    assert_eq!(
        statuses(&check_gpu(&gpu(), Some(1000))),
        [("gpu 0", Status::Ok)]
    );
}

#[test]
fn gpu_modes_and_errors() {
    let mut bad = gpu();
    bad.mig = Some(true);
    bad.persistence = Some(false);
    bad.compute_mode = Some("exclusive-process".into());
    bad.ecc_uncorrected = Some(3);
    let findings = check_gpu(&bad, Some(1000));
    let found = statuses(&findings);
    assert_eq!(
        found,
        [
            ("gpu 0", Status::Ok),
            ("gpu 0", Status::Warn),
            ("gpu 0", Status::Fail),
            ("gpu 0", Status::Warn),
            ("gpu 0", Status::Fail)
        ]
    );
}

#[test]
fn other_users_processes_are_named_and_own_ones_are_not() {
    let mut shared = gpu();
    shared.processes = vec![
        GpuProcessFacts {
            pid: 10,
            used_bytes: Some(10 * GIB),
            uid: Some(1000),
            name: Some("python".into()),
        },
        GpuProcessFacts {
            pid: 20,
            used_bytes: Some(30 * GIB),
            uid: Some(1001),
            name: Some("python3".into()),
        },
        GpuProcessFacts {
            pid: 30,
            used_bytes: Some(2 * GIB),
            uid: None,
            name: None,
        },
    ];
    let findings = check_gpu(&shared, Some(1000));
    let warn = findings.iter().find(|f| f.status == Status::Warn).unwrap();
    assert!(
        warn.summary
            .starts_with("2 processes of other users hold 32.0 GiB"),
        "{}",
        warn.summary
    );
    assert!(warn.summary.contains("30 (not visible from here, 2.0 GiB)"));
    assert!(!warn.summary.contains("10 (python"));
}

#[test]
fn shm_small_full_and_leaked() {
    let small = FsUsage {
        total_bytes: 64 << 20,
        available_bytes: 60 << 20,
    };
    assert_eq!(check_shm(Some(&Ok(small)), None)[0].status, Status::Warn);
    let full = FsUsage {
        total_bytes: 32 * GIB,
        available_bytes: GIB / 2,
    };
    assert_eq!(check_shm(Some(&Ok(full)), None)[0].status, Status::Fail);
    let fine = FsUsage {
        total_bytes: 32 * GIB,
        available_bytes: 30 * GIB,
    };
    let findings = check_shm(Some(&Ok(fine)), Some((3, GIB)));
    assert_eq!(
        statuses(&findings),
        [("/dev/shm", Status::Ok), ("/dev/shm", Status::Warn)]
    );
    assert!(findings[1].summary.starts_with("3 torch_* files"));
}

#[test]
fn disk_thresholds() {
    let usage = |avail: u64| FsUsage {
        total_bytes: 1000 * GIB,
        available_bytes: avail,
    };
    assert_eq!(
        check_disk("/data", Ok(&usage(GIB / 2))).status,
        Status::Fail
    );
    assert_eq!(
        check_disk("/data", Ok(&usage(5 * GIB))).status,
        Status::Warn
    );
    assert_eq!(
        check_disk("/data", Ok(&usage(500 * GIB))).status,
        Status::Ok
    );
    assert_eq!(
        check_disk("/nope", Err(&"No such file or directory".to_string())).status,
        Status::Fail
    );
}

#[test]
fn env_conflicts() {
    let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(statuses(&check_env(&[])), [("env", Status::Ok)]);
    let both = check_env(&env(&[
        ("XLA_CLIENT_MEM_FRACTION", ".5"),
        ("XLA_PYTHON_CLIENT_MEM_FRACTION", ".5"),
    ]));
    assert_eq!(both[0].status, Status::Fail);
    let tf = check_env(&env(&[("TF_FORCE_GPU_ALLOW_GROWTH", "1")]));
    assert_eq!(tf[0].status, Status::Fail);
    let torch = check_env(&env(&[
        ("PYTORCH_ALLOC_CONF", "expandable_segments:True"),
        ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128"),
    ]));
    assert_eq!(torch[0].status, Status::Warn);
    assert!(torch[0].summary.contains("differ"));
    let nccl = check_env(&env(&[
        ("NCCL_P2P_DISABLE", "1"),
        ("LD_PRELOAD", "/opt/libvgpu.so"),
    ]));
    assert_eq!(
        statuses(&nccl),
        [
            ("env NCCL_P2P_DISABLE", Status::Warn),
            ("env LD_PRELOAD", Status::Warn)
        ]
    );
}

#[test]
fn relevant_env_names() {
    for name in [
        "XLA_FLAGS",
        "PYTORCH_CUDA_ALLOC_CONF",
        "NCCL_DEBUG",
        "CUDA_VISIBLE_DEVICES",
        "LD_PRELOAD",
        "JAX_PLATFORMS",
    ] {
        assert!(is_relevant_env(name), "{name}");
    }
    for name in ["PATH", "HOME", "CUDA_HOME", "TF_CPP_MIN_LOG_LEVEL"] {
        assert!(!is_relevant_env(name), "{name}");
    }
}
