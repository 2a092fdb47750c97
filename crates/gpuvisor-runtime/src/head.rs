//! The head of a multi-node run: `gpuvisor run JOB` inside a Slurm allocation, from srun to
//! the exit summary's figures.
//!
//! - [`run`](run()) is the whole head: sockets, srun, the run's record, the start-up
//!   (`preflight.rs`: agents connect, plan, probe every coordinator) and each running round's
//!   I/O (`round.rs`: record, control requests, the agents' connections);
//! - `machine.rs` is what the head decides while a round runs (lost and failed nodes,
//!   timeouts, the Ctrl-C escalation, gates for `after`), as a state machine
//!   ([`Round::step`]) that does no I/O and is tested with a made-up clock; [`after_round`]
//!   is the `on_node_failure` policy between rounds;
//! - [`merge`] is what the head makes of the nodes' messages (their events and samples).
//!
//! It never writes to the terminal: what the user sees goes through the caller's
//! [`Console`] (lines, the preflight table, its live view), and the end comes back as an
//! [`Outcome`] or a [`RuntimeError`](crate::RuntimeError) for the binary to print.

mod machine;
pub mod merge;
mod preflight;
mod round;
mod run;

pub use machine::{
    after_round, lost_rows, Action, AfterRound, Input, Node, Round, RoundEnd, HEAD_STALL,
    HEARTBEAT_EVERY,
};
pub use run::{run, Console, Options, Outcome};
