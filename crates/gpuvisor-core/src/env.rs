//! Environment rules: from one planned replica to the exact variables its framework reads.
//!
//! (Being written: see the table in this module once it lands.)

use crate::plan::PlannedReplica;
use crate::spec::Enforcement;

/// One environment variable gpuvisor sets, with the reason (shown by `plan --env`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EnvVar {
    /// Variable name.
    pub name: String,
    /// Value.
    pub value: String,
    /// Why it is set, in a few words.
    pub why: String,
}

/// The variables for `replica` under `enforcement`, user `env` applied last.
pub fn replica_env(enforcement: Enforcement, replica: &PlannedReplica) -> Vec<EnvVar> {
    let _ = (enforcement, replica);
    Vec::new()
}
