//! The CLI's integration tests, one test binary (`cargo test -p gpuvisor-cli --test it`): each
//! former `tests/*.rs` file is a module here, the helpers beside them. One binary links once
//! instead of forty times; tests that must not overlap say so with a lock of their own.
//! Filter by module as by file before: `cargo test -p gpuvisor-cli --test it -- run_booking::`.

// Helpers shared by the test modules.
mod driver;
mod harness;
mod recorded;
mod slurm_cluster;
mod tmux;
mod util;

// The tests, one module per former test file.
mod cluster;
mod completions;
mod doctor;
mod exec;
mod exec_budget;
mod exec_paths;
mod exec_sim;
mod explain;
mod explain_run;
mod gpus;
mod hostile;
mod ledger_damage;
mod nvml_standin;
mod plan;
mod plan_from_run;
mod plan_nodes;
mod record_full;
mod report;
mod run;
mod run_auto;
mod run_booking;
mod run_budget;
mod run_console;
mod run_direct_logs;
mod run_queue;
mod run_sampling;
mod run_sim;
mod sampler_read_cost;
mod slurm;
mod slurm_run;
mod slurm_signals;
mod submit;
mod top;
mod top_live;
mod tui_hangup;
