//! What crosses nodes when a job runs on several machines (under Slurm): the messages between
//! the head (`gpuvisor run` in the allocation) and the one agent per node ([`wire`]), and the
//! reachability check every node makes before anything starts ([`probe`]).
//!
//! The head and the agents talk over one TCP connection per agent, one JSON object per line.
//! The order of a run:
//!
//! ```text
//! agent -> head   hello      (token, node name)           every agent, within preflight_timeout
//! head  -> agent  assign     (job text, node list, index)
//! agent -> head   planned    (its node's plan, the ports it holds for the worlds it coordinates)
//! head  -> agent  probe      (every coordinator host:port)
//! agent -> head   probed     (per target: reached in N ms, or the error)
//! head  -> agent  start      (coordinators)   or   abort (reason)
//! agent -> head   event*, ps*, heartbeat*, then done (status, summary rows)
//! head  -> agent  control    (stop / restart / ps forwarded from `gpuvisor stop` etc.)
//! ```

pub mod probe;
pub mod wire;
