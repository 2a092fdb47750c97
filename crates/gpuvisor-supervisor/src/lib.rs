//! The gpuvisor supervisor: runs every replica of a planned job and keeps a record.
//!
//! - [`rundir`]: the run directory (plan, event log, logs, control socket);
//! - [`events`]: the append-only event log;
//! - [`state`]: the restart / readiness / shutdown state machine, as plain data;
//! - [`clock`]: timestamps.

pub mod clock;
pub mod events;
pub mod rundir;
pub mod state;
