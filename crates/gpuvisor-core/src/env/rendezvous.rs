//! The rendezvous variables of a replica of a `distributed` process: who it is in its world
//! and where the coordinator listens, in the names each framework reads.
//!
//! | who | variables |
//! |---|---|
//! | every distributed replica | `GPUVISOR_RANK`, `GPUVISOR_WORLD_SIZE`, `GPUVISOR_LOCAL_RANK`, `GPUVISOR_LOCAL_WORLD_SIZE`, `GPUVISOR_NODE_RANK`, `GPUVISOR_COORDINATOR` (`host:port`) |
//! | JAX | `JAX_COORDINATOR_ADDRESS` (`host:port`), `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`; on GPUs `JAX_LOCAL_DEVICE_IDS` |
//! | PyTorch | `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `MASTER_ADDR`, `MASTER_PORT` (what `init_process_group("env://")` reads) |
//! | under Slurm | `SLURM_PROCID`, `SLURM_LOCALID`, `SLURM_NTASKS`, `SLURM_NPROCS` rewritten to the rank, local rank and world size |
//!
//! **JAX reads only the coordinator address from the environment** (facts.md:
//! `JAX_COORDINATOR_ADDRESS`, `JAX_LOCAL_DEVICE_IDS`, `JAX_COORDINATOR_PORT`). A program
//! either passes the other two itself,
//! `jax.distributed.initialize(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
//! process_id=int(os.environ["JAX_PROCESS_ID"]))`, or calls `jax.distributed.initialize()`
//! with no arguments under Slurm: JAX's Slurm detection then fills them from `SLURM_NTASKS` and
//! `SLURM_PROCID`. Every process gpuvisor starts inside one srun task inherits that task's
//! `SLURM_PROCID`, so without the rewrite they would all claim the same id; with it they agree
//! with gpuvisor's ranks. `JAX_LOCAL_DEVICE_IDS` is the replica's own devices (`0`, or `0,1`
//! for two GPUs) because its `CUDA_VISIBLE_DEVICES` shows only those, whereas the Slurm
//! detection would pick device number `SLURM_LOCALID`.

use crate::plan::PlannedReplica;
use crate::spec::{DeviceKind, Framework};

use super::EnvVar;

/// Where a world's coordinator listens: rank 0's node, on a port chosen when the job starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coordinator {
    /// Host name or address of rank 0's node.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl Coordinator {
    /// `host:port` (`[host]:port` for an IPv6 address).
    pub fn address(&self) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// The rendezvous variables of `replica` (module doc); empty when it has no rank (its process
/// is not `distributed`). `under_slurm`: the replica runs inside a Slurm step, whose
/// `SLURM_PROCID`-style variables are rewritten to match its rank. A variable the replica's
/// job-file `env` sets is left out: the user's value wins, as in [`super::replica_env`].
pub fn rendezvous_env(
    replica: &PlannedReplica,
    coordinator: &Coordinator,
    under_slurm: bool,
) -> Vec<EnvVar> {
    let Some(rank) = &replica.rank else {
        return Vec::new();
    };
    let mut vars = Vec::new();
    let mut set = |name: &str, value: String, why: String| {
        vars.push(EnvVar {
            name: name.to_string(),
            value: Some(value),
            why,
        })
    };
    let world = &rank.world;
    let address = coordinator.address();
    set(
        "GPUVISOR_RANK",
        rank.rank.to_string(),
        format!("its rank in the `{world}` world"),
    );
    set(
        "GPUVISOR_WORLD_SIZE",
        rank.world_size.to_string(),
        format!("replicas of `{world}` over all its nodes"),
    );
    set(
        "GPUVISOR_LOCAL_RANK",
        rank.local_rank.to_string(),
        "its rank among the world's replicas on this node".to_string(),
    );
    set(
        "GPUVISOR_LOCAL_WORLD_SIZE",
        rank.local_world_size.to_string(),
        "the world's replicas on each node".to_string(),
    );
    set(
        "GPUVISOR_NODE_RANK",
        rank.node_rank.to_string(),
        "this node's index among the world's nodes".to_string(),
    );
    set(
        "GPUVISOR_COORDINATOR",
        address.clone(),
        "where rank 0's coordinator listens".to_string(),
    );
    match replica.framework {
        Framework::Jax => {
            set(
                "JAX_COORDINATOR_ADDRESS",
                address.clone(),
                "jax.distributed.initialize() reads the coordinator from here".to_string(),
            );
            set(
                "JAX_NUM_PROCESSES",
                rank.world_size.to_string(),
                "not read by jax: pass num_processes= from it (or rely on SLURM_NTASKS)"
                    .to_string(),
            );
            set(
                "JAX_PROCESS_ID",
                rank.rank.to_string(),
                "not read by jax: pass process_id= from it (or rely on SLURM_PROCID)".to_string(),
            );
            if replica.device == DeviceKind::Gpu {
                let ids: Vec<String> = (0..replica.gpus.len()).map(|id| id.to_string()).collect();
                set(
                    "JAX_LOCAL_DEVICE_IDS",
                    ids.join(","),
                    "its own GPUs (CUDA_VISIBLE_DEVICES shows only those), not device SLURM_LOCALID"
                        .to_string(),
                );
            }
        }
        Framework::Torch => {
            let why = |what: &str| format!("torch env:// start-up: {what}");
            set("RANK", rank.rank.to_string(), why("global rank"));
            set(
                "LOCAL_RANK",
                rank.local_rank.to_string(),
                why("rank on this node"),
            );
            set("WORLD_SIZE", rank.world_size.to_string(), why("world size"));
            set(
                "LOCAL_WORLD_SIZE",
                rank.local_world_size.to_string(),
                why("processes per node"),
            );
            set("GROUP_RANK", rank.node_rank.to_string(), why("node rank"));
            set(
                "MASTER_ADDR",
                coordinator.host.clone(),
                why("rank 0's host"),
            );
            set(
                "MASTER_PORT",
                coordinator.port.to_string(),
                why("rank 0's port"),
            );
        }
        Framework::Tensorflow | Framework::Cuda | Framework::None => {}
    }
    if under_slurm {
        let why = |what: &str| {
            format!("rewritten to its {what}: every process of one srun task inherits the task's value, so jax's Slurm detection would give them all the same one")
        };
        set("SLURM_PROCID", rank.rank.to_string(), why("rank"));
        set(
            "SLURM_LOCALID",
            rank.local_rank.to_string(),
            why("local rank"),
        );
        set(
            "SLURM_NTASKS",
            rank.world_size.to_string(),
            why("world size"),
        );
        set(
            "SLURM_NPROCS",
            rank.world_size.to_string(),
            why("world size (older name)"),
        );
    }
    vars.retain(|var| !replica.user_env.contains_key(&var.name));
    vars
}
