//! The run record: what gpuvisor writes into a run directory and every reader reads back.
//!
//! This crate owns the formats, not the policy of writing them: the typed [`Event`] of
//! `events.jsonl` (tagged by `kind`, the field names every recorded run already has), the line
//! format (`t` and `kind` first, then the fields sorted by name), reading an event log back
//! across its rotated files, `plan.json` read back ([`PlanRecord`]), the replica label
//! ([`label`]), the run directory's paths and how a run is found ([`run_dir`]), the sample
//! tiers' records ([`samples`]), the replicas' log files ([`log_file`]), and the control
//! protocol's requests, replies and client ([`control`]). Adding an event kind is one variant
//! of [`Event`]; the compiler then finds every writer and reader that must say something
//! about it.
//!
//! It depends on serde and memchr (the log files' line scan) alone: no process, signal or GPU
//! code (no nix, no libc), so every crate that writes or reads a run (supervisor, cluster head
//! and agent, `ps`, `top`, `report`, `explain`) can use it.

pub mod control;
pub mod event;
pub mod event_log;
pub mod label;
pub mod log_file;
pub mod plan;
pub mod run_dir;
pub mod samples;

pub use event::{Event, RestartReason};
pub use event_log::{event_files, read_events, read_record, EventLine, RecordRead};
pub use plan::{PlanRecord, PlanReplica};
pub use run_dir::{is_run_dir, latest_run, resolve_run, RunDir, RunNotFound};
