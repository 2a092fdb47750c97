//! The observation side of gpuvisor: what happened, what is happening, and whether the machine
//! is fit to run a job.
//!
//! - [`explain`] names known failures in logs and tracebacks from a knowledge base kept as data
//!   (`rules/failures.toml`, compiled into the binary), with the evidence lines, the cause, the
//!   fix and a confidence. It streams: a log of any size is read once, in bounded memory.
//! - [`doctor`] checks the machine: driver and CUDA versions, each GPU's modes and foreign
//!   memory holders, the CUDA builds of the Python frameworks, /dev/shm, free disk, and
//!   environment variables that would fight a plan. Each finding is ok / warn / fail / could not
//!   check, with its fix.
//!
//! Later this crate also holds the live sampler, `gpuvisor top` and the HTML run report; they
//! share the run-directory reading that `explain` starts with.

pub mod doctor;
pub mod explain;
pub mod report;
pub mod run_explain;
pub mod run_memory;
pub mod run_record;
pub mod size_text;
