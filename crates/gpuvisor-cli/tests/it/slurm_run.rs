//! gpuvisor on a real Slurm (tests/slurm/cluster.sh: one node on localhost, or three nodes in
//! network namespaces): `gpuvisor run` inside `salloc` starts one agent per node through srun,
//! sets every process's rendezvous, and a real `jax.distributed` all-gather runs across the
//! three nodes from the variables gpuvisor set; a node whose route to the coordinator is cut
//! stops the job at the preflight, naming the pair; a killed node agent is reported; `gpuvisor
//! submit` runs a job through sbatch. Skipped (saying why) unless GPUVISOR_SLURM_TESTS=1; see
//! docs/slurm-tests.md.

use crate::slurm_cluster;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::wait_until;
use serde_json::Value;
use slurm_cluster::{
    allgather_script, events, jax_python, salloc, write_job, SlurmCluster, RUN_LIMIT,
};

fn gpuvisor() -> &'static str {
    crate::harness::BIN
}

/// The JSON lines a replica printed (its log lines are `TIME O TEXT`).
fn json_lines(log: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    gpuvisor_record::log_file::parse(&text)
        .into_iter()
        .filter(|line| !line.stderr && line.text.starts_with('{'))
        .filter_map(|line| serde_json::from_str(&line.text).ok())
        .collect()
}

#[test]
fn a_job_over_three_nodes_gets_its_rendezvous_and_all_gathers_with_jax() {
    let Some(python) = jax_python() else {
        return;
    };
    let Some(cluster) = SlurmCluster::up(3) else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    // Two JAX processes per node in one world (so one srun task holds two processes: the case
    // where SLURM_PROCID would be wrong), once told through JAX_* (explicit) and once through
    // jax's own Slurm detection over the SLURM_* gpuvisor rewrote (auto); plus a torch-style
    // world on the last two nodes that records its variables.
    let job = write_job(
        dir,
        &format!(
            r#"
[job]
name = "gather"

[cluster]
preflight_timeout = "30s"

[nccl]
presets = ["debug", "p2p-off"]

[process.explicit]
command = ["{python}", "{script}", "--mode", "explicit", "--timeout", "60"]
framework = "jax"
device = "cpu"
replicas = 2
distributed = true

[process.auto]
command = ["{python}", "{script}", "--mode", "auto", "--timeout", "60"]
framework = "jax"
device = "cpu"
replicas = 2
distributed = true
after = ["explicit"]

[process.trainer]
command = ["sh", "-c", "env | grep -E '^(RANK|LOCAL_RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|GROUP_RANK|GPUVISOR_NODE|NCCL_P2P_DISABLE)=' | sort > {dir}/trainer.{{replica}}"]
framework = "torch"
memory = "1GiB"
nodes = "rest"
distributed = true
"#,
            python = python.display(),
            script = allgather_script().display(),
            dir = dir.display(),
        ),
    );
    let run = dir.join("run");
    let started = Instant::now();
    let output = cluster.output(
        &mut salloc(
            &cluster,
            3,
            &[
                "run",
                job.to_str().unwrap(),
                "--simulate",
                "1x24GiB",
                "--run-dir",
                run.to_str().unwrap(),
            ],
        ),
        RUN_LIMIT,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!(
        "slurm: gpuvisor run over 3 nodes (jax all-gathers) took {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stderr}\n{}",
        cluster.log_tails()
    );
    assert!(
        stderr.contains("on 3 nodes (n1, n2, n3) through srun"),
        "{stderr}"
    );
    assert!(
        stderr.contains("preflight (every node to every coordinator)"),
        "{stderr}"
    );

    for (world, processes) in [("explicit", 6u64), ("auto", 6)] {
        let mut ids = BTreeSet::new();
        let mut hosts = BTreeSet::new();
        let expected: Vec<u64> = (0..processes).map(|id| id * 101).collect();
        for replica in 0..processes {
            let log = run.join("logs").join(format!("{world}.{replica}.log"));
            let records = json_lines(&log);
            assert_eq!(records.len(), 1, "{}: {records:?}", log.display());
            let record = &records[0];
            assert_eq!(record["num_processes"], processes, "{record}");
            assert_eq!(
                record["process_id"], replica,
                "the process id is the rank: {record}"
            );
            assert_eq!(record["gathered"], serde_json::json!(expected), "{record}");
            ids.insert(record["process_id"].as_u64().unwrap());
            hosts.insert(record["host"].as_str().unwrap().to_string());
            // Replicas 0,1 on n1, 2,3 on n2, 4,5 on n3.
            assert_eq!(record["host"], format!("n{}", replica / 2 + 1), "{record}");
        }
        assert_eq!(ids.len() as u64, processes);
        assert_eq!(hosts.len(), 3);
    }
    // torch world: one per node on n2 and n3, master on n2.
    let mut ports = BTreeSet::new();
    for rank in 0..2 {
        let env = std::fs::read_to_string(dir.join(format!("trainer.{rank}"))).unwrap();
        assert!(env.contains(&format!("RANK={rank}\n")), "{env}");
        assert!(env.contains("LOCAL_RANK=0\n"), "{env}");
        assert!(env.contains(&format!("GROUP_RANK={rank}\n")), "{env}");
        assert!(env.contains("WORLD_SIZE=2\n"), "{env}");
        assert!(env.contains("MASTER_ADDR=n2\n"), "{env}");
        assert!(
            env.contains(&format!("GPUVISOR_NODE=n{}\n", rank + 2)),
            "{env}"
        );
        assert!(env.contains("NCCL_P2P_DISABLE=1\n"), "{env}");
        ports.insert(
            env.lines()
                .find(|line| line.starts_with("MASTER_PORT="))
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(ports.len(), 1, "{ports:?}");

    // One record of all nodes.
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan["nodes"], serde_json::json!(["n1", "n2", "n3"]));
    let events = events(&run);
    let starts: Vec<&Value> = events.iter().filter(|e| e["kind"] == "start").collect();
    assert_eq!(starts.len(), 6 + 6 + 2);
    let preflight = events.iter().find(|e| e["kind"] == "preflight").unwrap();
    assert_eq!(preflight["coordinators"].as_array().unwrap().len(), 3);
    let ps = crate::harness::gpuvisor()
        .arg("ps")
        .arg(&run)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&ps.stdout);
    assert!(table.contains("NODE"), "{table}");
    assert!(
        table
            .lines()
            .any(|line| line.starts_with("trainer[1]") && line.contains("n3")),
        "{table}"
    );
}

#[test]
fn a_node_cut_off_from_the_coordinator_fails_the_preflight_and_nothing_starts() {
    let Some(cluster) = SlurmCluster::up(3) else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let job = write_job(
        dir,
        &format!(
            r#"
[cluster]
preflight_timeout = "5s"

[process.learner]
command = ["touch", "{marker}"]
framework = "jax"
device = "cpu"
distributed = true
"#,
            marker = dir.join("started").display()
        ),
    );
    // n3 loses its route to n1, where the coordinator will listen.
    let n1 = "10.213.0.11/32";
    cluster.stdout_of(
        cluster
            .node_command("n3", "ip")
            .args(["route", "add", "unreachable", n1]),
        Duration::from_secs(10),
    );
    let run = dir.join("run");
    let output = cluster.output(
        &mut salloc(
            &cluster,
            3,
            &[
                "run",
                job.to_str().unwrap(),
                "--run-dir",
                run.to_str().unwrap(),
            ],
        ),
        RUN_LIMIT,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr
            .contains("preflight failed: 1 unreachable node-coordinator pair; nothing was started"),
        "{stderr}"
    );
    assert!(
        stderr.contains("n3 cannot reach learner's coordinator at n1:"),
        "{stderr}"
    );
    assert!(stderr.contains("No route to host"), "{stderr}");
    assert!(stderr.contains("hint: "), "{stderr}");
    assert!(!dir.join("started").exists(), "no process started");
    let events = events(&run);
    let failed = events
        .iter()
        .find(|e| e["kind"] == "preflight-failed")
        .expect("a preflight-failed event");
    let pairs = failed["unreachable"].as_array().unwrap();
    assert_eq!(pairs.len(), 1, "{failed}");
    assert_eq!(pairs[0]["node"], "n3");
    assert_eq!(pairs[0]["world"], "learner");
    assert!(!events.iter().any(|e| e["kind"] == "start"));
    // No agent is left behind on any node.
    for node in ["n1", "n2", "n3"] {
        assert!(
            cluster.node_pids_named(node, "gpuvisor").is_empty(),
            "{node} still runs gpuvisor"
        );
    }
}

/// Starts `gpuvisor run JOB --quiet` in `salloc -N3` in the background and waits until
/// `replicas` replicas have started; returns it and the pid of node `node`'s agent.
// The caller waits for the child; a panic on the way ends the test (and the cluster's Drop
// tears everything down).
#[allow(clippy::zombie_processes)]
fn start_on_three(
    cluster: &SlurmCluster,
    job: &Path,
    run: &Path,
    replicas: usize,
    node: &str,
) -> (std::process::Child, i64) {
    let mut child = salloc(
        cluster,
        3,
        &[
            "run",
            job.to_str().unwrap(),
            "--quiet",
            "--run-dir",
            run.to_str().unwrap(),
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let deadline = Instant::now() + RUN_LIMIT;
    loop {
        let events = events(run);
        if events.iter().filter(|e| e["kind"] == "start").count() == replicas {
            let joined = events.iter().find(|e| e["kind"] == "nodes-joined").unwrap();
            let agent = joined["agents"]
                .as_array()
                .unwrap()
                .iter()
                .find(|agent| agent["node"] == node)
                .unwrap()["pid"]
                .as_i64()
                .unwrap();
            return (child, agent);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the job did not start: {events:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_killed_node_agent_is_reported_and_the_job_stops() {
    let Some(cluster) = SlurmCluster::up(3) else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let job = write_job(
        dir,
        "[process.worker]\ncommand = [\"sleep\", \"120\"]\ndevice = \"cpu\"\nreplicas = 2\n",
    );
    let run = dir.join("run");
    let (child, agent) = start_on_three(&cluster, &job, &run, 6, "n2");
    let workers_on_n2 = cluster.node_pids_named("n2", "sleep");
    assert_eq!(workers_on_n2.len(), 2, "two workers on n2");
    Command::new("kill")
        .args(["-9", &agent.to_string()])
        .status()
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("node n2: its agent (pid {agent} on n2) is gone")),
        "{stderr}"
    );
    assert!(stderr.contains("lost with node n2"), "{stderr}");
    let events = events(&run);
    let lost = events.iter().find(|e| e["kind"] == "node-lost").unwrap();
    assert_eq!(lost["node"], "n2");
    assert_eq!(events.last().unwrap()["kind"], "job-end");
    // The lost agent's workers went with it; the other nodes' were stopped.
    for node in ["n1", "n2", "n3"] {
        assert!(
            cluster.node_pids_named(node, "sleep").is_empty(),
            "{node} still runs a worker"
        );
    }
}

#[test]
fn submit_runs_a_job_through_sbatch() {
    let Some(cluster) = SlurmCluster::up(1) else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let job = write_job(
        dir,
        "[job]\nname = \"sub\"\n\n[process.hello]\ncommand = [\"sh\", \"-c\", \"echo hello from $GPUVISOR_NODE\"]\nmemory = \"1GiB\"\n",
    );
    let run = dir.join("run");
    let mut submit = cluster.command(gpuvisor());
    submit
        .args([
            "submit",
            job.to_str().unwrap(),
            "--simulate",
            "1x24GiB",
            "--run-dir",
        ])
        .arg(&run)
        .args(["--", "--nodes=1"]);
    let stdout = cluster.stdout_of(&mut submit, RUN_LIMIT);
    let job_id: u64 = stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("a job id: {stdout}"));
    wait_until(RUN_LIMIT, "the batch job's job-end", || {
        if events(&run).iter().any(|e| e["kind"] == "job-end") {
            return Ok(());
        }
        let out = run.join(format!("slurm-{job_id}.out"));
        Err(format!(
            "the batch job did not end: {}\n{}",
            std::fs::read_to_string(out).unwrap_or_default(),
            cluster.log_tails()
        ))
    });
    let end = events(&run).into_iter().last().unwrap();
    assert_eq!(end["status"], 0, "{end}");
    assert!(run.join("job.sbatch").is_file());
    let log = std::fs::read_to_string(run.join("logs/hello.log")).unwrap();
    assert!(log.contains("hello from localhost"), "{log}");
}

#[test]
fn with_restart_a_killed_node_agent_restarts_the_job_through_a_new_srun() {
    let Some(cluster) = SlurmCluster::up(3) else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let stop_now = dir.join("stop-now");
    let job = write_job(
        dir,
        &format!(
            "[cluster]\non_node_failure = \"restart\"\nnode_restarts = 1\n\n\
             [process.worker]\ncommand = [\"sh\", \"-c\", \"test -e {stop} && exit 0; exec sleep 120\"]\ndevice = \"cpu\"\n",
            stop = stop_now.display()
        ),
    );
    let run = dir.join("run");
    let (child, agent) = start_on_three(&cluster, &job, &run, 3, "n3");
    // The second round's workers end at once, so the restarted job finishes well.
    std::fs::write(&stop_now, "").unwrap();
    Command::new("kill")
        .args(["-9", &agent.to_string()])
        .status()
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("restarting the job on every node (restart 1 of 1)"),
        "{stderr}"
    );
    let events = events(&run);
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|kind| **kind == "preflight").count(),
        2,
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&"node-lost") && kinds.contains(&"node-restart"),
        "{kinds:?}"
    );
    assert!(
        run.join("nodes/n3.1").is_dir(),
        "the second round's record of n3"
    );
}
