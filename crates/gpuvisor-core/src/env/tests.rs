use std::collections::BTreeMap;

use super::*;
use crate::plan::PlacedDevice;
use crate::size::GIB;

fn replica(framework: Framework, device: DeviceKind, budget_bytes: u64) -> PlannedReplica {
    let gpus = match device {
        DeviceKind::Gpu => vec![PlacedDevice {
            index: 0,
            uuid: "GPU-aaaa".into(),
            total_bytes: 80 * GIB,
        }],
        DeviceKind::Cpu => Vec::new(),
    };
    PlannedReplica {
        process: "p".into(),
        replica: 2,
        replicas: 4,
        framework,
        device,
        preallocate: true,
        children_cpu_only: false,
        gpus,
        budget_bytes,
        footprint_bytes: budget_bytes,
        argv: vec!["true".into()],
        cwd: None,
        user_env: BTreeMap::new(),
        after: Vec::new(),
        node: None,
        nccl_env: BTreeMap::new(),
        rank: None,
    }
}

fn get(vars: &[EnvVar], name: &str) -> Option<Option<String>> {
    vars.iter()
        .find(|var| var.name == name)
        .map(|var| var.value.clone())
}

fn set(vars: &[EnvVar], name: &str) -> Option<String> {
    get(vars, name).flatten()
}

/// One row per framework x mode x device: the variables that must (and must not) be there.
#[test]
fn table_per_framework_mode_and_device() {
    for enforcement in [Enforcement::Shim, Enforcement::Framework] {
        for framework in Framework::ALL {
            let gpu = replica_env(enforcement, &replica(framework, DeviceKind::Gpu, 12 * GIB));
            assert_eq!(
                set(&gpu, "CUDA_VISIBLE_DEVICES").as_deref(),
                Some("GPU-aaaa")
            );
            assert_eq!(
                set(&gpu, "CUDA_DEVICE_ORDER").as_deref(),
                Some("PCI_BUS_ID")
            );
            assert_eq!(
                set(&gpu, "GPUVISOR_BUDGET_BYTES"),
                Some((12 * GIB).to_string())
            );
            assert_eq!(set(&gpu, "GPUVISOR_REPLICA").as_deref(), Some("2"));
            assert_eq!(
                get(&gpu, "JAX_PLATFORMS"),
                None,
                "{framework:?} on GPU must not be forced to CPU"
            );

            let cpu = replica_env(enforcement, &replica(framework, DeviceKind::Cpu, 0));
            assert_eq!(
                set(&cpu, "CUDA_VISIBLE_DEVICES").as_deref(),
                Some(""),
                "{framework:?} CPU-only"
            );
            assert_eq!(get(&cpu, "CUDA_DEVICE_ORDER"), None);
            assert_eq!(get(&cpu, "XLA_PYTHON_CLIENT_MEM_FRACTION"), None);

            match framework {
                Framework::Jax => {
                    let expected = match enforcement {
                        // Under the shim the device is the budget: 12 GiB less 1.2 GiB allowance.
                        Enforcement::Shim => "0.9000",
                        // Otherwise relative to the 80 GiB card: 10.8 / 80.
                        Enforcement::Framework => "0.1350",
                    };
                    assert_eq!(
                        set(&gpu, "XLA_PYTHON_CLIENT_MEM_FRACTION").as_deref(),
                        Some(expected)
                    );
                    assert_eq!(
                        set(&gpu, "XLA_PYTHON_CLIENT_PREALLOCATE").as_deref(),
                        Some("true")
                    );
                    assert_eq!(
                        get(&gpu, "XLA_CLIENT_MEM_FRACTION"),
                        Some(None),
                        "the new name is unset"
                    );
                    assert_eq!(set(&cpu, "JAX_PLATFORMS").as_deref(), Some("cpu"));
                }
                Framework::Torch => {
                    assert_eq!(
                        set(&gpu, "PYTORCH_ALLOC_CONF"),
                        set(&gpu, "PYTORCH_CUDA_ALLOC_CONF")
                    );
                    assert_eq!(
                        set(&gpu, "PYTORCH_ALLOC_CONF").as_deref(),
                        Some(TORCH_ALLOC_CONF)
                    );
                    assert_eq!(
                        set(&cpu, "PYTORCH_NVML_BASED_CUDA_CHECK").as_deref(),
                        Some("1")
                    );
                }
                Framework::Tensorflow => {
                    assert_eq!(
                        set(&gpu, "TF_FORCE_GPU_ALLOW_GROWTH").as_deref(),
                        Some("true")
                    );
                }
                Framework::Cuda | Framework::None => {
                    for name in [
                        "XLA_PYTHON_CLIENT_MEM_FRACTION",
                        "PYTORCH_ALLOC_CONF",
                        "TF_FORCE_GPU_ALLOW_GROWTH",
                    ] {
                        assert_eq!(get(&gpu, name), None, "{framework:?} gets no {name}");
                    }
                }
            }
        }
    }
}

#[test]
fn jax_fraction_keeps_an_allowance_for_small_budgets() {
    let small = replica(Framework::Jax, DeviceKind::Gpu, GIB);
    // 1 GiB budget: allowance is the 256 MiB floor, so 768/1024.
    assert_eq!(jax_mem_fraction(Enforcement::Shim, &small), 0.75);
    let mut multi = replica(Framework::Jax, DeviceKind::Gpu, 8 * GIB);
    multi.gpus.push(PlacedDevice {
        index: 1,
        uuid: "GPU-bbbb".into(),
        total_bytes: 40 * GIB,
    });
    // Framework mode uses the smallest of its cards: 7.2 / 40.
    assert_eq!(jax_mem_fraction(Enforcement::Framework, &multi), 0.18);
    let vars = replica_env(Enforcement::Shim, &multi);
    assert_eq!(
        set(&vars, "CUDA_VISIBLE_DEVICES").as_deref(),
        Some("GPU-aaaa,GPU-bbbb")
    );
}

#[test]
fn preallocate_off_and_children_cpu_only() {
    let mut jax = replica(Framework::Jax, DeviceKind::Gpu, 4 * GIB);
    jax.preallocate = false;
    assert_eq!(
        set(
            &replica_env(Enforcement::Shim, &jax),
            "XLA_PYTHON_CLIENT_PREALLOCATE"
        )
        .as_deref(),
        Some("false")
    );
    let mut torch = replica(Framework::Torch, DeviceKind::Gpu, 4 * GIB);
    assert_eq!(
        get(
            &replica_env(Enforcement::Shim, &torch),
            "PYTORCH_NVML_BASED_CUDA_CHECK"
        ),
        None
    );
    torch.children_cpu_only = true;
    assert_eq!(
        set(
            &replica_env(Enforcement::Shim, &torch),
            "PYTORCH_NVML_BASED_CUDA_CHECK"
        )
        .as_deref(),
        Some("1")
    );
}

#[test]
fn user_env_wins_and_is_last() {
    let mut jax = replica(Framework::Jax, DeviceKind::Gpu, 4 * GIB);
    jax.user_env
        .insert("XLA_PYTHON_CLIENT_MEM_FRACTION".into(), "0.5".into());
    jax.user_env.insert("SEED".into(), "2".into());
    let vars = replica_env(Enforcement::Shim, &jax);
    assert_eq!(
        vars.iter()
            .filter(|var| var.name == "XLA_PYTHON_CLIENT_MEM_FRACTION")
            .count(),
        1
    );
    assert_eq!(
        set(&vars, "XLA_PYTHON_CLIENT_MEM_FRACTION").as_deref(),
        Some("0.5")
    );
    assert_eq!(
        vars.last().map(|var| var.name.as_str()),
        Some("XLA_PYTHON_CLIENT_MEM_FRACTION")
    );
}

#[test]
fn caveats_only_where_the_environment_cannot_cap() {
    for framework in Framework::ALL {
        let replica = replica(framework, DeviceKind::Gpu, GIB);
        assert_eq!(enforcement_caveat(Enforcement::Shim, &replica), None);
        let caveat = enforcement_caveat(Enforcement::Framework, &replica);
        assert_eq!(
            caveat.is_none(),
            framework == Framework::Jax,
            "{framework:?}"
        );
    }
}

#[test]
fn shell_exports_quote_and_unset() {
    let vars = vec![
        EnvVar {
            name: "A".into(),
            value: Some("GPU-1,GPU-2".into()),
            why: String::new(),
        },
        EnvVar {
            name: "B".into(),
            value: Some(String::new()),
            why: String::new(),
        },
        EnvVar {
            name: "C".into(),
            value: Some("it's".into()),
            why: String::new(),
        },
        EnvVar {
            name: "D".into(),
            value: None,
            why: String::new(),
        },
    ];
    assert_eq!(
        shell_exports(&vars),
        "export A=GPU-1,GPU-2\nexport B=''\nexport C='it'\\''s'\nunset D\n"
    );
}

#[test]
fn node_and_nccl_vars_only_when_planned() {
    let plain = replica(Framework::Torch, DeviceKind::Gpu, 12 * GIB);
    let vars = replica_env(Enforcement::Shim, &plain);
    assert!(vars
        .iter()
        .all(|var| var.name != "GPUVISOR_NODE" && !var.name.starts_with("NCCL_")));

    let mut on_node = plain.clone();
    on_node.node = Some("n2".into());
    on_node.nccl_env = BTreeMap::from([
        ("NCCL_P2P_DISABLE".to_string(), "1".to_string()),
        ("NCCL_IB_DISABLE".to_string(), "0".to_string()),
    ]);
    on_node
        .user_env
        .insert("NCCL_P2P_DISABLE".to_string(), "0".to_string());
    let vars = replica_env(Enforcement::Shim, &on_node);
    assert_eq!(set(&vars, "GPUVISOR_NODE").as_deref(), Some("n2"));
    let why = |name: &str| {
        vars.iter()
            .filter(|var| var.name == name)
            .map(|var| var.why.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        why("NCCL_P2P_DISABLE"),
        ["from the job file"],
        "user env wins, once"
    );
    assert_eq!(set(&vars, "NCCL_P2P_DISABLE").as_deref(), Some("0"));
    // "0" is not what the ib-off preset sets, so it came from [nccl] env.
    assert_eq!(why("NCCL_IB_DISABLE"), ["[nccl] env"]);
}
