//! Which directories gpuvisor may put files in that other processes load or trust: every
//! directory from `/` down must belong to root or to us and be writable by nobody else, so no
//! other user can rename, replace or add anything on the way (OpenSSH's `safe_path` rule). A
//! sticky world-writable directory such as /tmp is allowed only above a directory of ours:
//! the sticky bit keeps others from renaming or removing what we own there.

use std::fmt;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

/// Why a directory is not safe.
#[derive(Debug)]
pub enum UnsafePath {
    /// `component` (on the way to the directory) could be changed by another user.
    Unsafe {
        /// The directory another user could change.
        component: PathBuf,
        /// Why (its owner, its mode).
        why: String,
    },
    /// The directory could not be looked at.
    Io {
        /// What could not be looked at.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
}

impl fmt::Display for UnsafePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnsafePath::Unsafe { component, why } => write!(f, "{} {why}", component.display()),
            UnsafePath::Io { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

/// Our effective uid: the owner every file we create gets.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Checks `dir` and every directory above it; gives its canonical path, which is what callers
/// must use from then on (a symlink on the way could be pointed elsewhere later; the
/// directories it resolved to cannot). With `ours_below`, `dir` itself may be sticky and
/// world-writable because the caller is about to create its own directory in it.
pub fn check_dir(dir: &Path, ours_below: bool) -> Result<PathBuf, UnsafePath> {
    let io_error = |path: &Path| {
        let path = path.to_path_buf();
        move |error| UnsafePath::Io { path, error }
    };
    let absolute = std::path::absolute(dir).map_err(io_error(dir))?;
    check_symlinks(&absolute)?;
    let canonical = absolute.canonicalize().map_err(io_error(&absolute))?;
    let me = euid();
    // The owner of the directory below the one looked at: a sticky directory protects only
    // what we own in it.
    let mut child_owner = ours_below.then_some(me);
    for directory in canonical.ancestors() {
        let meta = directory.symlink_metadata().map_err(io_error(directory))?;
        let unsafe_because = |why: String| UnsafePath::Unsafe {
            component: directory.to_path_buf(),
            why,
        };
        if !meta.is_dir() {
            // canonicalize resolved it a moment ago: someone is changing the path under us.
            return Err(unsafe_because("is no longer a directory".into()));
        }
        let mode = meta.mode() & 0o7777;
        if meta.uid() != 0 && meta.uid() != me {
            return Err(unsafe_because(format!(
                "is owned by {}, mode {mode:04o}",
                describe_uid(meta.uid())
            )));
        }
        let sticky_over_ours = mode & 0o1000 != 0 && child_owner == Some(me);
        if mode & 0o022 != 0 && !sticky_over_ours {
            return Err(unsafe_because(format!(
                "is writable by {}, mode {mode:04o}, owner {}",
                if mode & 0o002 != 0 {
                    "others"
                } else {
                    "its group"
                },
                describe_uid(meta.uid())
            )));
        }
        child_owner = Some(meta.uid());
    }
    Ok(canonical)
}

/// Refuses a symlink on the way that another user owns: they could point it at a directory of
/// root's and have gpuvisor write its files there.
fn check_symlinks(absolute: &Path) -> Result<(), UnsafePath> {
    let me = euid();
    let mut prefix = PathBuf::new();
    for component in absolute.components() {
        prefix.push(component);
        if !matches!(component, Component::Normal(_)) {
            continue;
        }
        let Ok(meta) = prefix.symlink_metadata() else {
            break; // a missing component is canonicalize's error to report
        };
        if meta.file_type().is_symlink() && meta.uid() != 0 && meta.uid() != me {
            return Err(UnsafePath::Unsafe {
                component: prefix,
                why: format!("is a symlink owned by {}", describe_uid(meta.uid())),
            });
        }
    }
    Ok(())
}

/// `alice (uid 1001)`, or `uid 1001` for a uid with no name.
pub fn describe_uid(uid: u32) -> String {
    match nix::unistd::User::from_uid(uid.into()) {
        Ok(Some(user)) => format!("{} (uid {uid})", user.name),
        _ => format!("uid {uid}"),
    }
}

/// Creates `dir` (and what is missing above it) owner-only, after checking that the part that
/// exists is safe, and checks the result; gives the canonical path.
pub fn create_private_dir(dir: &Path) -> Result<PathBuf, UnsafePath> {
    let dir = &std::path::absolute(dir).map_err(|error| UnsafePath::Io {
        path: dir.to_path_buf(),
        error,
    })?;
    let existing = dir
        .ancestors()
        .find(|ancestor| ancestor.is_dir())
        .unwrap_or(Path::new("/"));
    if existing != dir {
        check_dir(existing, true)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|error| UnsafePath::Io {
                path: dir.to_path_buf(),
                error,
            })?;
    }
    check_dir(dir, false)
}

/// The run directory, made owner-only and checked from `/` down, by its canonical path: the
/// supervisor (often root) writes its record and control socket there, and another user who
/// could change a directory on the way could redirect or replace them.
pub fn private_run_dir(path: &Path) -> Result<PathBuf, crate::RuntimeError> {
    create_private_dir(path).map_err(|error| match error {
        UnsafePath::Unsafe { component, why } => crate::RuntimeError::Refused {
            what: format!(
                "refusing the run directory {}: {} {why}",
                path.display(),
                component.display()
            ),
            hint: Some("give --run-dir a place only you and root can change".to_string()),
        },
        UnsafePath::Io { error, .. } => crate::RuntimeError::Unavailable {
            what: format!(
                "cannot create the run directory {}: {error}",
                path.display()
            ),
            hint: Some("choose a writable place with --run-dir DIR".to_string()),
        },
    })
}

/// A fresh 16-hex-digit string nobody else can predict (the std hasher's keys are seeded from
/// the OS's random source).
pub fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |time| time.as_nanos()),
    );
    format!("{:016x}", hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_group_or_world_writable_directory_on_the_way_is_refused() {
        let top = tempfile::tempdir().unwrap();
        let inner = top.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        assert!(check_dir(&inner, false).is_ok());
        chmod(&top.path().join("a"), 0o777);
        let error = check_dir(&inner, false).unwrap_err().to_string();
        assert!(
            error.contains("/a is writable by others, mode 0777"),
            "{error}"
        );
        chmod(&top.path().join("a"), 0o775);
        let error = check_dir(&inner, false).unwrap_err().to_string();
        assert!(
            error.contains("is writable by its group, mode 0775"),
            "{error}"
        );
    }

    #[test]
    fn a_sticky_directory_is_fine_only_above_our_own() {
        let top = tempfile::tempdir().unwrap();
        let shared = top.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        chmod(&shared, 0o1777);
        let ours = shared.join("ours");
        std::fs::create_dir(&ours).unwrap();
        assert!(check_dir(&ours, false).is_ok());
        assert!(check_dir(&shared, true).is_ok());
        let error = check_dir(&shared, false).unwrap_err().to_string();
        assert!(error.contains("writable by others, mode 1777"), "{error}");
    }

    #[test]
    fn the_canonical_path_is_given_back() {
        let top = tempfile::tempdir().unwrap();
        let real = top.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, top.path().join("link")).unwrap();
        let checked = check_dir(&top.path().join("link"), false).unwrap();
        assert_eq!(checked, real.canonicalize().unwrap());
    }

    #[test]
    fn a_private_directory_is_created_owner_only() {
        let top = tempfile::tempdir().unwrap();
        let dir = create_private_dir(&top.path().join("x/y")).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert_ne!(random_hex(), random_hex());
    }
}
