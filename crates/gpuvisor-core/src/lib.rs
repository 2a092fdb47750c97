//! The pure core of gpuvisor: everything between a job file and the environment a process is
//! started with, with no I/O beyond reading the job file.
//!
//! Data flows one way through these modules:
//!
//! - [`spec`] parses and validates a job file (TOML) into a [`spec::JobSpec`], with
//!   file:line:col errors;
//! - [`inventory`] describes the GPUs a plan is made for (from NVML, or simulated);
//! - [`plan`] places every replica on GPUs and gives it a budget: a pure function
//!   `(JobSpec, Inventory) -> Plan`;
//! - [`env`] turns one planned replica into the exact environment variables its framework
//!   reads.
//!
//! [`cluster`] adds what a job over several nodes needs: Slurm host lists and the node
//! layout that [`plan::plan_node`] plans one node of.
//!
//! [`size`] parses and prints byte sizes ("12GiB", "800MiB", "12GB").

pub mod cluster;
pub mod env;
pub mod inventory;
pub mod plan;
pub mod size;
pub mod spec;
