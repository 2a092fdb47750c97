//! How the runtime fails: what failed, and whose it is to fix (the binary turns this into
//! its message, its `hint:` line and its exit status).

/// A runtime step that could not be done.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Something the user controls is not acceptable (a directory anyone could change): the
    /// caller refuses to start anything.
    #[error("{what}")]
    Refused {
        /// What was refused, and why.
        what: String,
        /// How the user fixes it, when there is more to say than what was refused.
        hint: Option<String>,
    },
    /// The job file asks for what cannot be started (said at its line, with a hint).
    #[error(transparent)]
    Job(#[from] gpuvisor_core::spec::Diagnostic),
    /// The job does not plan (or no longer fits): bad input, said with its own hints.
    #[error(transparent)]
    Plan(#[from] gpuvisor_core::plan::PlanError),
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Something the run needs could not be made or read (a full /dev/shm, an I/O error).
    #[error("{what}")]
    Unavailable {
        /// What could not be done, with the cause.
        what: String,
        /// How the user may fix it, when there is something to say.
        hint: Option<String>,
    },
}

impl RuntimeError {
    /// The hint for the user, if there is one.
    pub fn hint(&self) -> Option<&str> {
        match self {
            RuntimeError::Refused { hint, .. } | RuntimeError::Unavailable { hint, .. } => {
                hint.as_deref()
            }
            RuntimeError::Plan(_) | RuntimeError::Io(_) | RuntimeError::Job(_) => None,
        }
    }

    /// Whether this is the user's to fix (exit 2: nothing was started), not the system's.
    pub fn is_bad_input(&self) -> bool {
        match self {
            RuntimeError::Refused { .. } | RuntimeError::Plan(_) | RuntimeError::Job(_) => true,
            RuntimeError::Unavailable { .. } | RuntimeError::Io(_) => false,
        }
    }

    /// What failed, then its hint on a line of its own (`  hint: ...`), as the binary says it:
    /// for an agent, whose head says it for the node.
    pub fn with_hint_line(&self) -> String {
        match self.hint() {
            Some(hint) => hint_line(self, hint),
            None => self.to_string(),
        }
    }
}

/// `what` with the line `  hint: HINT` after it: how every failure the user reads ends.
pub fn hint_line(what: impl std::fmt::Display, hint: impl std::fmt::Display) -> String {
    format!("{what}\n  hint: {hint}")
}
