//! The judgement: facts in, findings out. Pure, so every rule here is unit-tested.

use gpuvisor_core::size::ByteSize;

use super::facts::{Driver, Facts, FsUsage, GpuFacts, Python, PythonInfo};
use super::{Finding, Report, Status};

const GIB: u64 = 1 << 30;

/// Variables gpuvisor sets per process from the plan (see gpuvisor-core's env rules): a shell
/// value is replaced for planned processes of the matching framework, and leaks into the
/// others.
const SET_BY_PLAN: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_MODULE_LOADING",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_CLIENT_MEM_FRACTION",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_NVML_BASED_CUDA_CHECK",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "JAX_PLATFORMS",
];

/// Whether doctor reports a shell variable at all.
pub fn is_relevant_env(name: &str) -> bool {
    ["XLA_", "PYTORCH_", "NCCL_", "CUDA_MPS_"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        || SET_BY_PLAN.contains(&name)
        || matches!(name, "LD_PRELOAD" | "TF_GPU_ALLOCATOR")
}

/// All checks, in the order they print.
pub fn run_checks(facts: &Facts) -> Report {
    let mut findings = Vec::new();
    findings.extend(check_driver(&facts.driver));
    for gpu in &facts.gpus {
        findings.extend(check_gpu(gpu, facts.own_uid));
    }
    findings.extend(check_mps(facts.mps_daemon));
    findings.extend(check_python(&facts.python, driver_cuda(&facts.driver)));
    findings.extend(check_shm(facts.shm.as_ref(), facts.shm_leaked));
    for (path, usage) in &facts.disks {
        findings.push(check_disk(&path.display().to_string(), usage.as_ref()));
    }
    findings.extend(check_env(&facts.env));
    Report { findings }
}

fn size(bytes: u64) -> ByteSize {
    ByteSize(bytes)
}

fn driver_cuda(driver: &Driver) -> Option<(u32, u32)> {
    match driver {
        Driver::Nvml { cuda, .. } => *cuda,
        _ => None,
    }
}

/// The driver and its CUDA version.
pub fn check_driver(driver: &Driver) -> Vec<Finding> {
    let finding = match driver {
        Driver::Unknown => return Vec::new(),
        Driver::Nvml { version, cuda } => Finding::new(
            "driver",
            Status::Ok,
            match cuda {
                Some((major, minor)) => {
                    format!("NVIDIA driver {version}, CUDA driver API {major}.{minor}")
                }
                None => format!("NVIDIA driver {version}"),
            },
        ),
        Driver::Simulated { spec } => Finding::new(
            "driver",
            Status::Skip,
            format!("simulated GPUs ({spec}): the driver was not checked"),
        )
        .with_fix("run without --simulate on the GPU machine"),
        Driver::Missing { reason } => {
            Finding::new("driver", Status::Fail, format!("no NVIDIA driver: {reason}"))
                .with_fix("install the NVIDIA driver (nvidia-smi must work); to try a job layout without GPUs, use --simulate 2x80GiB")
        }
    };
    let mut findings = vec![finding];
    if matches!(driver, Driver::Missing { .. }) {
        findings.push(
            Finding::new(
                "gpus",
                Status::Skip,
                "could not check GPUs (memory, MIG, MPS, persistence, ECC, other users' processes): no driver",
            )
            .with_fix("run doctor where the GPUs are, or pass --simulate SPEC"),
        );
    }
    findings
}

/// One GPU: memory, modes and foreign holders.
pub fn check_gpu(gpu: &GpuFacts, own_uid: Option<u32>) -> Vec<Finding> {
    let check = format!("gpu {}", gpu.index);
    let mut findings = Vec::new();
    let mut modes = Vec::new();
    if let Some(ecc) = gpu.ecc {
        modes.push(format!("ECC {}", if ecc { "on" } else { "off" }));
    }
    if let Some(persistence) = gpu.persistence {
        modes.push(format!(
            "persistence {}",
            if persistence { "on" } else { "off" }
        ));
    }
    if let Some(mode) = &gpu.compute_mode {
        modes.push(format!("compute mode {mode}"));
    }
    let modes = if modes.is_empty() {
        String::new()
    } else {
        format!("; {}", modes.join(", "))
    };
    findings.push(Finding::new(
        &check,
        Status::Ok,
        format!(
            "{}: {} total, {} free{modes}",
            gpu.name,
            size(gpu.total_bytes),
            size(gpu.free_bytes)
        ),
    ));
    if gpu.mig == Some(true) {
        findings.push(
            Finding::new(&check, Status::Warn, "MIG mode is on: processes see MIG slices, not the whole GPU")
                .with_fix("list the MIG devices by UUID in [gpus] devices (\"MIG-...\"), one per process; or turn MIG off: sudo nvidia-smi -i N -mig 0"),
        );
    }
    match gpu.compute_mode.as_deref() {
        Some("exclusive-process") => findings.push(
            Finding::new(
                &check,
                Status::Fail,
                "compute mode is exclusive-process: only one process may use this GPU",
            )
            .with_fix(format!(
                "sudo nvidia-smi -i {} -c DEFAULT (or run the processes as MPS clients)",
                gpu.index
            )),
        ),
        Some("prohibited") => findings.push(
            Finding::new(
                &check,
                Status::Fail,
                "compute mode is prohibited: no process may use this GPU",
            )
            .with_fix(format!("sudo nvidia-smi -i {} -c DEFAULT", gpu.index)),
        ),
        _ => {}
    }
    if gpu.persistence == Some(false) {
        findings.push(
            Finding::new(&check, Status::Warn, "persistence mode is off: the driver unloads when idle, so each first CUDA or NVML call takes seconds")
                .with_fix(format!("sudo nvidia-smi -i {} -pm 1 (or run nvidia-persistenced)", gpu.index)),
        );
    }
    if let Some(errors) = gpu.ecc_uncorrected.filter(|&errors| errors > 0) {
        findings.push(
            Finding::new(&check, Status::Fail, format!("{errors} uncorrected ECC errors since the driver loaded: results on this GPU cannot be trusted"))
                .with_fix(format!("drain the GPU and reset it (sudo nvidia-smi -i {} -r) or have it serviced; leave it out with [gpus] devices", gpu.index)),
        );
    }
    let foreign: Vec<_> = gpu
        .processes
        .iter()
        .filter(|process| own_uid.is_none() || process.uid != own_uid)
        .collect();
    if !foreign.is_empty() {
        let held: u64 = foreign.iter().filter_map(|p| p.used_bytes).sum();
        let who: Vec<String> = foreign
            .iter()
            .map(|process| {
                let name = process.name.as_deref().unwrap_or("not visible from here");
                let used = process
                    .used_bytes
                    .map_or("?".to_string(), |bytes| size(bytes).to_string());
                format!("{} ({name}, {used})", process.pid)
            })
            .collect();
        findings.push(
            Finding::new(
                &check,
                Status::Warn,
                format!(
                    "{} {}: {}",
                    if foreign.len() == 1 {
                        "1 process of another user holds".to_string()
                    } else {
                        format!("{} processes of other users hold", foreign.len())
                    },
                    size(held),
                    who.join(", ")
                ),
            )
            .with_fix("plans count only what is left (percentages are of usable memory); keep room with [gpus] reserve or choose other GPUs with [gpus] devices"),
        );
    }
    findings
}

/// The MPS control daemon.
pub fn check_mps(running: Option<bool>) -> Vec<Finding> {
    match running {
        None => vec![Finding::new("mps", Status::Skip, "could not check for an MPS daemon: /proc is not readable")],
        Some(false) => vec![Finding::new("mps", Status::Ok, "no MPS daemon running (processes get their own contexts)")],
        Some(true) => vec![Finding::new("mps", Status::Warn, "an MPS control daemon is running: CUDA processes share one server per GPU, and a fatal fault in one reaches all of them on that GPU")
            .with_fix("fine if intended (per-client limits: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT); otherwise stop it: echo quit | nvidia-cuda-mps-control")],
    }
}

/// Parses "12.4" / "12" into (major, minor).
fn parse_cuda(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |minor| minor.parse().ok())?;
    Some((major, minor))
}

/// A framework built for CUDA `built` against the driver's CUDA `driver`.
fn compare_cuda(
    check: &str,
    what: String,
    built: (u32, u32),
    driver: Option<(u32, u32)>,
    minor_known: bool,
) -> Finding {
    let Some(driver) = driver else {
        return Finding::new(
            check,
            Status::Skip,
            format!("{what}: not compared with the driver (no driver CUDA version)"),
        );
    };
    let driver_text = format!("{}.{}", driver.0, driver.1);
    if built.0 > driver.0 {
        return Finding::new(check, Status::Fail, format!("{what}, but the driver supports CUDA {driver_text} at most: CUDA will not initialise"))
            .with_fix(format!("install a build for CUDA {}.x (e.g. the cu{}x torch wheel, jax[cuda{}]) or upgrade the driver", driver.0, driver.0, driver.0));
    }
    if minor_known && built.0 == driver.0 && built.1 > driver.1 {
        return Finding::new(check, Status::Warn, format!("{what}, newer than the driver's CUDA {driver_text}: runs by minor-version compatibility, but kernels that need PTX JIT fail"))
            .with_fix(format!("upgrade the driver to one for CUDA {}.{} or newer, or install a build for CUDA {driver_text}", built.0, built.1));
    }
    Finding::new(
        check,
        Status::Ok,
        format!("{what}; the driver supports CUDA {driver_text}"),
    )
}

/// The Python frameworks' CUDA builds against the driver.
pub fn check_python(python: &Python, driver: Option<(u32, u32)>) -> Vec<Finding> {
    let info = match python {
        Python::Unknown => return Vec::new(),
        Python::NotFound { interpreter } => {
            return vec![Finding::new(
                "python",
                Status::Skip,
                format!("could not check the frameworks' CUDA builds: `{interpreter}` not found"),
            )
            .with_fix(
                "pass --python /path/to/venv/bin/python to check the environment the job uses",
            )]
        }
        Python::Failed { reason } => {
            return vec![Finding::new(
                "python",
                Status::Skip,
                format!("could not check the frameworks: {reason}"),
            )]
        }
        Python::TimedOut { seconds } => {
            return vec![Finding::new(
            "python",
            Status::Skip,
            format!("could not check the frameworks: python did not answer in {seconds} s"),
        )
        .with_fix(
            "retry with --python-timeout 30 (a cold file-system cache makes the first start slow)",
        )]
        }
        Python::Found(info) => info,
    };
    let mut findings = vec![Finding::new(
        "python",
        Status::Ok,
        format!("Python {} at {}", info.version, info.executable),
    )];
    findings.extend(check_torch(info, driver));
    findings.extend(check_jax(info, driver));
    findings.extend(check_tensorflow(info, driver));
    if !["torch", "jax", "jaxlib", "tensorflow"]
        .iter()
        .any(|name| info.packages.contains_key(*name))
    {
        findings.push(Finding::new(
            "frameworks",
            Status::Ok,
            "no jax, torch or tensorflow in this Python",
        ));
    }
    findings
}

fn check_torch(info: &PythonInfo, driver: Option<(u32, u32)>) -> Option<Finding> {
    let version = info.packages.get("torch")?;
    Some(match info.torch_cuda.as_deref().and_then(parse_cuda) {
        Some(built) => compare_cuda(
            "torch",
            format!("torch {version} built for CUDA {}.{}", built.0, built.1),
            built,
            driver,
            true,
        ),
        None if info.torch_hip.is_some() => Finding::new("torch", Status::Fail, format!("torch {version} is a ROCm (AMD) build: it cannot use NVIDIA GPUs"))
            .with_fix("install a CUDA build: pip install torch --index-url https://download.pytorch.org/whl/cu124 (pick the CUDA version the driver supports)"),
        None => Finding::new("torch", Status::Warn, format!("torch {version} is a CPU-only build (torch.version.cuda is None)"))
            .with_fix("install a CUDA build: pip install torch --index-url https://download.pytorch.org/whl/cu124 (pick the CUDA version the driver supports)"),
    })
}

fn check_jax(info: &PythonInfo, driver: Option<(u32, u32)>) -> Vec<Finding> {
    let Some(jax) = info.packages.get("jax") else {
        return Vec::new();
    };
    let jaxlib = info.packages.get("jaxlib");
    let plugins: Vec<(&String, &String, u32)> = info
        .packages
        .iter()
        .filter_map(|(name, version)| {
            let major = name
                .strip_prefix("jax-cuda")?
                .strip_suffix("-plugin")?
                .parse()
                .ok()?;
            Some((name, version, major))
        })
        .collect();
    let jaxlib_text = jaxlib.map_or("no jaxlib".to_string(), |v| format!("jaxlib {v}"));
    // jaxlib before the plugin split carried CUDA itself ("0.4.13+cuda12.cudnn89").
    let builtin_cuda = jaxlib.and_then(|v| {
        let tail = v.split_once("+cuda")?.1;
        let major: String = tail.chars().take_while(char::is_ascii_digit).collect();
        major.parse::<u32>().ok()
    });
    if plugins.is_empty() && builtin_cuda.is_none() {
        return vec![Finding::new(
            "jax",
            Status::Warn,
            format!("jax {jax} with {jaxlib_text} has no CUDA plugin: it will run on the CPU"),
        )
        .with_fix("pip install -U \"jax[cuda12]\" (jax[cuda13] for CUDA 13 drivers)")];
    }
    let mut findings = Vec::new();
    for (name, version, major) in &plugins {
        // The plugin must be exactly jaxlib's version, or jax ignores it.
        let jaxlib_base = jaxlib.map(|v| v.split('+').next().unwrap_or(v));
        if jaxlib_base.is_some_and(|base| base != version.as_str()) {
            findings.push(
                Finding::new("jax", Status::Fail, format!("{name} {version} does not match {jaxlib_text}: jax will not load the plugin and runs on the CPU"))
                    .with_fix(format!("pip install -U \"jax[cuda{major}]\" so jax, jaxlib and the plugin share one version")),
            );
            continue;
        }
        findings.push(compare_cuda(
            "jax",
            format!("jax {jax} with {name} {version} (CUDA {major})"),
            (*major, 0),
            driver,
            false,
        ));
    }
    if let Some(major) = builtin_cuda {
        findings.push(compare_cuda(
            "jax",
            format!("jax {jax} with {jaxlib_text} (CUDA {major} built in)"),
            (major, 0),
            driver,
            false,
        ));
    }
    findings
}

fn check_tensorflow(info: &PythonInfo, driver: Option<(u32, u32)>) -> Option<Finding> {
    let version = info.packages.get("tensorflow")?;
    Some(match info.tensorflow_cuda.as_deref().and_then(parse_cuda) {
        Some(built) => compare_cuda(
            "tensorflow",
            format!(
                "tensorflow {version} built for CUDA {}.{}",
                built.0, built.1
            ),
            built,
            driver,
            true,
        ),
        None => Finding::new(
            "tensorflow",
            Status::Warn,
            format!("tensorflow {version} reports no CUDA build: it will run on the CPU"),
        )
        .with_fix("pip install \"tensorflow[and-cuda]\""),
    })
}

/// /dev/shm: size, use and leaked files of dead processes.
pub fn check_shm(
    shm: Option<&Result<FsUsage, String>>,
    leaked: Option<(usize, u64)>,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    match shm {
        None => {}
        Some(Err(reason)) => findings.push(Finding::new(
            "/dev/shm",
            Status::Skip,
            format!("could not check /dev/shm: {reason}"),
        )),
        Some(Ok(usage)) => {
            let used_percent = if usage.total_bytes == 0 {
                100.0
            } else {
                usage.used_bytes() as f64 * 100.0 / usage.total_bytes as f64
            };
            let summary = format!(
                "{} total, {} used ({used_percent:.1}%)",
                size(usage.total_bytes),
                size(usage.used_bytes())
            );
            let finding = if usage.total_bytes < GIB {
                Finding::new("/dev/shm", Status::Warn, format!("{summary}: too small for DataLoader workers or torch.multiprocessing (containers default to 64 MiB)"))
                    .with_fix("docker run --shm-size=16g (Kubernetes: an emptyDir with medium: Memory at /dev/shm)")
            } else if used_percent >= 95.0 {
                Finding::new("/dev/shm", Status::Fail, format!("{summary}: nearly full"))
                    .with_fix("remove leaked files of finished runs (ls -la /dev/shm; torch_* and sem.mp-* of dead processes)")
            } else if used_percent >= 80.0 {
                Finding::new("/dev/shm", Status::Warn, format!("{summary}: filling up"))
                    .with_fix("check for leaked torch_* and sem.mp-* files of finished runs (ls -la /dev/shm)")
            } else {
                Finding::new("/dev/shm", Status::Ok, summary)
            };
            findings.push(finding);
        }
    }
    if let Some((count, bytes)) = leaked.filter(|(count, _)| *count > 0) {
        findings.push(
            Finding::new("/dev/shm", Status::Warn, format!("{count} torch_* file{} of exited processes hold {}", if count == 1 { "" } else { "s" }, size(bytes)))
                .with_fix("once no job of yours is running: rm /dev/shm/torch_<pid>_* for pids that are gone (gpuvisor run removes its own job's after it ends)"),
        );
    }
    findings
}

/// Free space on one path.
pub fn check_disk(path: &str, usage: Result<&FsUsage, &String>) -> Finding {
    let check = format!("disk {path}");
    let usage = match usage {
        Ok(usage) => usage,
        Err(reason) => {
            return Finding::new(
                check,
                Status::Fail,
                format!("cannot check {path}: {reason}"),
            )
            .with_fix("create the path or pass an existing one with --path")
        }
    };
    let free_percent = if usage.total_bytes == 0 {
        0.0
    } else {
        usage.available_bytes as f64 * 100.0 / usage.total_bytes as f64
    };
    let summary = format!(
        "{} free of {} ({free_percent:.1}%)",
        size(usage.available_bytes),
        size(usage.total_bytes)
    );
    if usage.available_bytes < GIB {
        Finding::new(
            check,
            Status::Fail,
            format!("{summary}: checkpoints and caches will fail with \"No space left on device\""),
        )
        .with_fix(format!(
            "free space on {path} or point checkpoints and caches elsewhere"
        ))
    } else if usage.available_bytes < 10 * GIB || free_percent < 5.0 {
        Finding::new(
            check,
            Status::Warn,
            format!("{summary}: little room for checkpoints"),
        )
        .with_fix(format!("free space on {path} before a long run"))
    } else {
        Finding::new(check, Status::Ok, summary)
    }
}

/// Shell variables that would fight a plan.
pub fn check_env(env: &[(String, String)]) -> Vec<Finding> {
    let get = |name: &str| {
        env.iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    let mut findings = Vec::new();
    if let (Some(_), Some(_)) = (
        get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
        get("XLA_CLIENT_MEM_FRACTION"),
    ) {
        findings.push(
            Finding::new("env", Status::Fail, "both XLA_PYTHON_CLIENT_MEM_FRACTION and XLA_CLIENT_MEM_FRACTION are set: jax refuses to start (ValueError)")
                .with_fix("unset one: unset XLA_CLIENT_MEM_FRACTION"),
        );
    }
    if let Some(value) =
        get("TF_FORCE_GPU_ALLOW_GROWTH").filter(|v| !matches!(*v, "true" | "false"))
    {
        findings.push(
            Finding::new("env", Status::Fail, format!("TF_FORCE_GPU_ALLOW_GROWTH={value:?}: TensorFlow accepts exactly \"true\" or \"false\""))
                .with_fix("export TF_FORCE_GPU_ALLOW_GROWTH=true"),
        );
    }
    if let (Some(new), Some(old)) = (get("PYTORCH_ALLOC_CONF"), get("PYTORCH_CUDA_ALLOC_CONF")) {
        if new != old {
            findings.push(
                Finding::new("env", Status::Warn, format!("PYTORCH_ALLOC_CONF={new:?} and PYTORCH_CUDA_ALLOC_CONF={old:?} differ: recent torch reads the first, older torch only the second"))
                    .with_fix("give both the same value"),
            );
        }
    }
    for (name, value) in env {
        let finding = if name == "LD_PRELOAD" {
            Finding::new(format!("env {name}"), Status::Warn, format!("LD_PRELOAD={value:?} is set: another interposer under gpuvisor's shim double-counts or hides allocations"))
                .with_fix("unset LD_PRELOAD in the shell that runs gpuvisor; per-process preloads go in the job file's env")
        } else if name == "CUDA_VISIBLE_DEVICES" {
            Finding::new(format!("env {name}"), Status::Warn, format!("CUDA_VISIBLE_DEVICES={value:?} is set: gpuvisor gives each process its own value, but frameworks in processes it does not plan see this one"))
                .with_fix("unset it and choose GPUs with [gpus] devices in the job file")
        } else if SET_BY_PLAN.contains(&name.as_str()) {
            Finding::new(format!("env {name}"), Status::Warn, format!("{name}={value:?} is set: gpuvisor sets it for processes of the matching framework, every other process inherits this value"))
                .with_fix(format!("unset {name}; put per-process values in the job file's env"))
        } else {
            Finding::new(format!("env {name}"), Status::Warn, format!("{name}={value:?} is set and reaches every process gpuvisor starts"))
                .with_fix(format!("if only some processes need it, unset {name} and set it in their [process.NAME] env"))
        };
        findings.push(finding);
    }
    if findings.is_empty() {
        findings.push(Finding::new(
            "env",
            Status::Ok,
            "no XLA_*, PYTORCH_*, NCCL_*, CUDA_VISIBLE_DEVICES or LD_PRELOAD set in this shell",
        ));
    }
    findings
}

#[cfg(test)]
mod tests;
