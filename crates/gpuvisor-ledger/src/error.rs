//! Errors of the ledger API (hand-written `Display`: the crate has no dependencies).

use std::fmt;
use std::path::PathBuf;

/// Everything that can go wrong creating, opening or using a ledger.
///
/// Each message says what failed and the number that broke it, then a `hint:` with the fix.
#[derive(Debug)]
pub enum LedgerError {
    /// A system call on the ledger file failed.
    Io {
        /// What was being done ("create", "open", "map", ...).
        op: &'static str,
        /// The ledger file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file does not start with the ledger magic: not a ledger, or overwritten.
    BadMagic {
        /// The ledger file.
        path: PathBuf,
    },
    /// The file was written by a different layout version of gpuvisor.
    VersionMismatch {
        /// The ledger file.
        path: PathBuf,
        /// Version found in the header.
        found: u32,
        /// Version this build understands.
        expected: u32,
    },
    /// The file is shorter (or longer) than its header says, or its header is inconsistent.
    Corrupt {
        /// The ledger file.
        path: PathBuf,
        /// What is inconsistent, with the numbers.
        detail: String,
    },
    /// The configuration passed to [`crate::Ledger::create`] is not valid.
    InvalidConfig {
        /// What is wrong, with the numbers.
        detail: String,
    },
    /// Every process slot is taken by a live process.
    NoFreeSlot {
        /// Number of slots in the ledger.
        slots: u32,
    },
    /// A group index outside the ledger's groups.
    UnknownGroup {
        /// The index asked for.
        group: u32,
        /// Number of groups in the ledger.
        groups: u32,
    },
}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LedgerError::Io { op, path, source } => write!(
                f,
                "ledger {op} failed for {}: {source}\nhint: check that /dev/shm is mounted and writable, and that the file belongs to you",
                path.display()
            ),
            LedgerError::BadMagic { path } => write!(
                f,
                "{} is not a gpuvisor ledger (bad magic)\nhint: GPUVISOR_LEDGER must name the file gpuvisor created for this job",
                path.display()
            ),
            LedgerError::VersionMismatch { path, found, expected } => write!(
                f,
                "ledger {} has layout version {found}, this build reads version {expected}\nhint: run the job and its processes with the same gpuvisor build",
                path.display()
            ),
            LedgerError::Corrupt { path, detail } => write!(
                f,
                "ledger {} is corrupt or truncated: {detail}\nhint: restart the job so gpuvisor writes a fresh ledger",
                path.display()
            ),
            LedgerError::InvalidConfig { detail } => {
                write!(f, "invalid ledger configuration: {detail}\nhint: this is a gpuvisor bug if it came from a job file")
            }
            LedgerError::NoFreeSlot { slots } => write!(
                f,
                "all {slots} ledger process slots are held by live processes\nhint: create the ledger with more slots (CreateOptions::max_processes)"
            ),
            LedgerError::UnknownGroup { group, groups } => write!(
                f,
                "budget group {group} does not exist (the ledger has {groups} groups)\nhint: GPUVISOR_GROUP must be an index below {groups}"
            ),
        }
    }
}

impl std::error::Error for LedgerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LedgerError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
