//! `gpuvisor plan` end to end on the example job files, through simulated GPUs.

use crate::util;

use std::fs;

use util::{redact, run};

#[test]
fn learner_actors_sim_on_one_h100() {
    let run = run(&[
        "plan",
        "examples/learner-actors-sim.toml",
        "--simulate",
        "h100",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    insta::assert_snapshot!(run.stdout);
}

#[test]
fn parallel_seeds_on_one_h100() {
    let run = run(&["plan", "examples/parallel-seeds.toml", "--simulate", "h100"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    insta::assert_snapshot!(run.stdout);
}

#[test]
fn distributed_job_over_eight_gpus() {
    let run = run(&[
        "plan",
        "examples/distributed-8gpu.toml",
        "--simulate",
        "8xh100",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    insta::assert_snapshot!(run.stdout);
}

#[test]
fn collectors_stay_on_the_cpu() {
    let run = run(&["plan", "examples/collectors-cpu.toml", "--simulate", "l4"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    insta::assert_snapshot!(run.stdout);
}

#[test]
fn every_example_plans_on_eight_h100s() {
    for entry in fs::read_dir(util::repo_root().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|ext| ext.to_str()) != Some("toml") {
            continue;
        }
        let run = run(&[
            "plan",
            path.to_str().unwrap(),
            "--simulate",
            "8xh100",
            "--json",
        ]);
        assert_eq!(run.code, Some(0), "{}: {}", path.display(), run.stderr);
        let json: serde_json::Value = serde_json::from_str(&run.stdout).expect("valid JSON");
        let replicas = json["replicas"].as_array().expect("replicas");
        assert!(!replicas.is_empty(), "{}", path.display());
        assert_eq!(json["env"].as_array().map(Vec::len), Some(replicas.len()));
    }
}

#[test]
fn json_plan_is_deterministic_and_carries_env() {
    let args = [
        "plan",
        "examples/learner-actors-sim.toml",
        "--simulate",
        "h100",
        "--json",
    ];
    let first = run(&args);
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    assert_eq!(first.stdout, run(&args).stdout);
    let json: serde_json::Value = serde_json::from_str(&first.stdout).unwrap();
    let learner = json["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["replica"] == "learner")
        .expect("learner env");
    let names: Vec<&str> = learner["vars"]
        .as_array()
        .unwrap()
        .iter()
        .map(|var| var["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"XLA_PYTHON_CLIENT_MEM_FRACTION"),
        "{names:?}"
    );
    assert!(names.contains(&"CUDA_VISIBLE_DEVICES"), "{names:?}");
}

#[test]
fn env_export_lines_for_one_replica() {
    // The simulator's directory goes before this process's LD_LIBRARY_PATH (cargo's).
    let run: util::Run = util::gpuvisor()
        .env_remove("LD_LIBRARY_PATH")
        .args([
            "plan",
            "examples/learner-actors-sim.toml",
            "--simulate",
            "h100",
            "--env",
            "actor[1]",
        ])
        .output()
        .unwrap()
        .into();
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    insta::assert_snapshot!(run.stdout);
    assert!(
        run.stdout.contains("export GPUVISOR_REPLICA=1\n"),
        "{}",
        run.stdout
    );
}

#[test]
fn env_selector_errors_name_the_choices() {
    let base = [
        "plan",
        "examples/learner-actors-sim.toml",
        "--simulate",
        "h100",
        "--env",
    ];
    for (selector, expected) in [
        ("actor", "`actor` has 4 replicas"),
        ("actor[9]", "`actor` has no replica 9"),
        ("critic", "no process `critic`"),
        ("actor[x]", "is not a number"),
    ] {
        let run = run(&[&base[..], &[selector]].concat());
        assert_eq!(run.code, Some(2), "{selector}: {}", run.stderr);
        assert!(run.stderr.contains(expected), "{selector}: {}", run.stderr);
        assert!(run.stderr.contains("hint:"), "{selector}: {}", run.stderr);
    }
}

#[test]
fn infeasible_job_shows_the_arithmetic_and_exits_2() {
    let run = run(&[
        "plan",
        "examples/parallel-seeds.toml",
        "--simulate",
        "24GiB",
    ]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stdout.is_empty(),
        "nothing is printed as a plan: {}",
        run.stdout
    );
    insta::assert_snapshot!(run.stderr);
}

#[test]
fn bad_job_file_is_located_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("typo.toml");
    fs::write(
        &job,
        "[process.learner]\ncommand = [\"python\", \"learn.py\"]\nmemroy = \"30%\"\n",
    )
    .unwrap();
    let run = run(&["plan", job.to_str().unwrap(), "--simulate", "h100"]);
    assert_eq!(run.code, Some(2));
    insta::assert_snapshot!(redact(&run.stderr, dir.path()));
}

#[test]
fn missing_job_file_exits_2() {
    let run = run(&["plan", "no/such/job.toml", "--simulate", "h100"]);
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("no/such/job.toml"), "{}", run.stderr);
}

#[test]
fn no_driver_without_simulate_exits_1() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return;
    }
    let run = run(&["plan", "examples/learner-actors-sim.toml"]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("--simulate"), "{}", run.stderr);
}

/// `export` / `unset` lines of `plan --env` as (name, value), quotes undone.
fn planned_env(stdout: &str) -> Vec<(String, Option<String>)> {
    stdout
        .lines()
        .filter_map(|line| {
            if let Some(name) = line.strip_prefix("unset ") {
                return Some((name.to_string(), None));
            }
            let (name, value) = line.strip_prefix("export ")?.split_once('=')?;
            let value = match value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
                Some(quoted) => quoted.replace(r"'\''", "'"),
                None => value.to_string(),
            };
            Some((name.to_string(), Some(value)))
        })
        .collect()
}

#[test]
fn plan_env_is_the_environment_a_replica_really_gets() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.toml");
    fs::write(
        &job,
        "[process.learner]\ncommand = [\"env\"]\nmemory = \"8GiB\"\n\n[process.worker]\ncommand = [\"env\"]\ndevice = \"cpu\"\nreplicas = 2\nenv = { MY_SETTING = \"it's mine\" }\n",
    )
    .unwrap();
    let job = job.to_str().unwrap();
    let run_dir = dir.path().join("run");
    let started = run(&[
        "run",
        job,
        "--simulate",
        "1x80GiB",
        "--quiet",
        "--run-dir",
        run_dir.to_str().unwrap(),
    ]);
    assert_eq!(started.code, Some(0), "{}", started.stderr);
    // What run makes when it starts (its cache, its files in /dev/shm) plan names.
    let placeholder = regex::Regex::new("<(cache|ledger|sim-state)>").unwrap();
    for (selector, log) in [("learner", "learner.log"), ("worker[1]", "worker.1.log")] {
        let plan = run(&["plan", job, "--simulate", "1x80GiB", "--env", selector]);
        assert_eq!(plan.code, Some(0), "{}", plan.stderr);
        let planned = planned_env(&plan.stdout);
        let log = fs::read_to_string(run_dir.join("logs").join(log)).unwrap();
        // Each line the replica wrote is `NAME=VALUE`.
        let lines = gpuvisor_record::log_file::parse(&log);
        let real: std::collections::BTreeMap<&str, &str> = lines
            .iter()
            .filter_map(|line| line.text.split_once('='))
            .collect();
        for (name, value) in &planned {
            let got = real.get(name.as_str()).copied();
            match value {
                // The shim marks the replica's first process itself, once it runs.
                None if name == "GPUVISOR_ROOT_PID" => {
                    assert!(got.is_some_and(|pid| pid.parse::<u32>().is_ok()), "{got:?}")
                }
                None => assert_eq!(got, None, "{selector}: {name} is unset"),
                Some(value) => {
                    let pattern = placeholder
                        .split(value)
                        .map(regex::escape)
                        .collect::<Vec<_>>()
                        .join("[^:]+");
                    let exact = regex::Regex::new(&format!("^{pattern}$")).unwrap();
                    let got = got.unwrap_or_else(|| panic!("{selector}: no {name} in\n{log}"));
                    assert!(
                        exact.is_match(got),
                        "{selector}: {name}={got}, planned {value}"
                    );
                }
            }
        }
        // And nothing gpuvisor sets is missing from the plan.
        for name in real.keys().filter(|name| {
            name.starts_with("GPUVISOR_")
                || name.starts_with("CUDA_")
                || name.starts_with("XLA_")
                || **name == "LD_PRELOAD"
        }) {
            assert!(
                planned.iter().any(|(planned, _)| planned == name),
                "{selector}: {name} is set but `plan --env` does not say so:\n{}",
                plan.stdout
            );
        }
    }
}
