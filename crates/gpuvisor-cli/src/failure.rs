//! How a command fails, and the exit status each kind of failure gets.
//!
//! Exit statuses: 0 success; 1 something outside the user's input is missing or broke (no GPU
//! driver, an I/O error); 2 bad input (a job file, a size, an argument) — nothing was started.
//!
//! Every message says what failed, then, on its own line, `hint:` with the fix:
//! `Failure::bad_input(what).with_hint(fix)` is the one way the binary writes that line.

use std::fmt::Display;
use std::process::ExitCode;

/// A command's failure.
#[derive(Debug)]
pub enum Failure {
    /// The user's input is wrong; exit 2. The message may carry its own `hint:` lines.
    BadInput(String),
    /// Something the command needs is not there or failed; exit 1.
    Unavailable(String),
}

impl Failure {
    /// Bad input with this message.
    pub fn bad_input(message: impl Display) -> Self {
        Failure::BadInput(message.to_string())
    }

    /// An unavailable resource with this message.
    pub fn unavailable(message: impl Display) -> Self {
        Failure::Unavailable(message.to_string())
    }

    /// The same failure with `hint` (how the user fixes it) on a line of its own after what
    /// failed.
    pub fn with_hint(self, hint: impl Display) -> Self {
        match self {
            Failure::BadInput(message) => Failure::BadInput(hinted(message, hint)),
            Failure::Unavailable(message) => Failure::Unavailable(hinted(message, hint)),
        }
    }

    /// Prints the failure to stderr and gives the exit status.
    pub fn report(self) -> ExitCode {
        let (message, code) = match self {
            Failure::BadInput(message) => (message, 2),
            Failure::Unavailable(message) => (message, 1),
        };
        eprintln!("error: {message}");
        ExitCode::from(code)
    }
}

/// `message` with the line `  hint: HINT` after it (the libraries' one builder, so a failure
/// the runtime words and one the binary words end alike).
pub use gpuvisor_runtime::hint_line as hinted;

impl From<gpuvisor_runtime::RuntimeError> for Failure {
    fn from(error: gpuvisor_runtime::RuntimeError) -> Self {
        match error.is_bad_input() {
            true => Failure::BadInput(error.with_hint_line()),
            false => Failure::Unavailable(error.with_hint_line()),
        }
    }
}

impl From<std::io::Error> for Failure {
    fn from(error: std::io::Error) -> Self {
        Failure::Unavailable(error.to_string())
    }
}
