//! The gpuvisor runtime: what it takes to start and enforce a planned job on this node, and
//! the cluster head's decisions when it does so over several nodes.
//!
//! - [`launch`] is a replica's whole environment, in one function;
//! - [`prestart`] is what is checked before anything starts (working directories, programs,
//!   scripts), every problem at once;
//! - [`book`] plans against what other runs on this machine booked and books the plan's
//!   room (or waits for it);
//! - [`replicas`] are the supervisor's replicas for a planned job (command, working
//!   directory, environment, policies) and the checks a start would fail late on;
//! - [`enforce`] is the ledger side of a run: one budget group per replica, the fence of zero
//!   limits on every other GPU, the ledger read back into `ps` figures and record events;
//!   [`exec_sampler`] is `exec`'s read-back of its one command's processes (both read the
//!   ledger one way, [`enforce::guarded`]); [`exec`] is `gpuvisor exec` on all of these (one
//!   command as one replica, behind the supervisor's keeper, no restart policy);
//! - [`run_files`] are the per-run files in /dev/shm (ledger, simulator state), named so
//!   nobody can plant them first; [`safe_path`] says which directories may hold what other
//!   processes load or trust;
//! - [`slurm`] is what a run needs of Slurm (the allocation, the head's address, the srun
//!   that starts one agent per node);
//! - [`head`] is the multi-node head ([`head::run`]: srun, the agents, the preflight, the
//!   merged record and control socket), its decisions while a round runs as a state machine
//!   (`Round::step(now, input)`) and [`head::merge`], what it makes of the nodes' messages;
//!   [`agent`] is a node's side of a multi-node run (`gpuvisor __agent`); both are given what
//!   is the binary's ([`head::Console`], [`agent::NodeSupport`]);
//! - [`sampling`] is what the run's sampler gets besides the ledger: the GPU source the binary
//!   opened (gpuvisor-probe's `sampler_source`), each replica's watch policies, and the
//!   `--metrics` listener.
//!
//! It plans nothing (`gpuvisor-core` does), and it never prints to the terminal nor parses
//! arguments: that is the binary's, and it must not depend on the binary or clap, nor open
//! NVML (the GPUs it is given are an `Inventory`; of gpuvisor-probe it uses the `GpuSource`
//! trait, whose source the binary opens through gpuvisor-probe's `sampler_source`, and the
//! /proc reader). The libraries every replica loads (the shim, the simulator) are embedded
//! in the binary, which passes their paths in. What must reach the user comes back as values
//! (events, [`RuntimeError`], the head's [`head::Outcome`]) or through a console the caller
//! gives.

pub mod agent;
pub mod book;
pub mod enforce;
mod error;
pub mod exec;
pub mod exec_sampler;
pub mod head;
pub mod launch;
pub mod prestart;
pub mod replicas;
pub mod run_files;
pub mod safe_path;
pub mod sampling;
pub mod slurm;

pub use error::{hint_line, RuntimeError};

/// The agents' secret (a multi-node run's): set for the agent alone, and removed from every
/// replica's environment.
pub const AGENT_TOKEN_ENV: &str = "GPUVISOR_AGENT_TOKEN";
