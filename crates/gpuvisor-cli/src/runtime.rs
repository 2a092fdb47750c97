//! Per-run files in /dev/shm (or the temp directory without it), where every user can create
//! files: their names carry a random part, so nobody can create one first (to block the run, or
//! as a symlink that root's processes would write through), and the files the simulator opens
//! by name are created here, exclusively, before anything starts. The directory is sticky, so
//! once a file is ours nobody else can replace it.

use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::failure::Failure;
use crate::safe_path;

/// /dev/shm, or the temp directory without one; refused when another user could rename what
/// gpuvisor creates there.
pub fn dir() -> Result<PathBuf, Failure> {
    let shm = Path::new("/dev/shm");
    let dir = match shm.is_dir() {
        true => shm.to_path_buf(),
        false => std::env::temp_dir(),
    };
    safe_path::check_dir(&dir, true).map_err(|error| {
        Failure::bad_input(format!(
            "refusing to keep gpuvisor's run files in {}: {error}\n  hint: set TMPDIR to a directory only you and root can change",
            dir.display()
        ))
    })
}

/// `dir/{prefix}{random}{suffix}`: a name nobody can guess before it exists.
pub fn unguessable(dir: &Path, prefix: &str, suffix: &str) -> PathBuf {
    dir.join(format!("{prefix}{}{suffix}", safe_path::random_hex()))
}

/// Creates `path` empty and owner-only; fails if anything (a file, a symlink) is there.
pub fn create_private_file(path: &Path) -> io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map(drop)
}

/// Creates the simulator's state file at `path` before anything starts: the simulator opens it
/// by name (and would create it), so nobody else may have put a file or a symlink there.
pub fn create_sim_state(path: &Path) -> Result<(), Failure> {
    create_private_file(path).map_err(|error| {
        Failure::unavailable(format!(
            "cannot create the simulator's state file {}: {error}",
            path.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_private_file_is_new_and_owner_only_and_never_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let path = unguessable(dir.path(), "state-", "-1");
        create_private_file(&path).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_file() && meta.len() == 0);
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(
            create_private_file(&path).is_err(),
            "never an existing file"
        );
        let target = dir.path().join("target");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(create_private_file(&link).is_err());
        assert!(!target.exists(), "nothing is created through a symlink");
    }
}
