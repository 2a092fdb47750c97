//! Clean-up of shared memory a job's processes left in /dev/shm, by the safe rule of
//! facts.md: after the job's whole process tree has exited, remove the job user's `sem.mp-*`
//! (multiprocessing semaphores) and `torch_*` (torch shared tensors) files whose creating
//! process is gone, and only those that belong to this job:
//! - a file some process of the job had mapped (seen in its /proc/PID/maps while it ran), or
//! - a `torch_<pid>_...` file whose pid was a process of the job.
//!
//! Files of other users, other jobs, or other kinds are never touched.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What the job's processes were seen holding while it ran.
#[derive(Debug, Default, Clone)]
pub struct JobFootprint {
    /// Every pid seen in the job's process tree.
    pub pids: BTreeSet<i32>,
    /// Every /dev/shm path seen mapped by one of them.
    pub mapped: BTreeSet<PathBuf>,
}

/// A file that was removed, or could not be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// The file.
    pub path: PathBuf,
    /// Why it was the job's.
    pub reason: String,
    /// The error, if removing it failed.
    pub error: Option<String>,
}

/// Removes the job's leftovers from `shm_dir` (normally /dev/shm) owned by `uid`.
pub fn clean_shm(shm_dir: &Path, uid: u32, footprint: &JobFootprint) -> Vec<Removal> {
    let Ok(entries) = fs::read_dir(shm_dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_file() || meta.uid() != uid {
            continue;
        }
        let creator = torch_pid(&name);
        let is_kind = name.starts_with("sem.mp-") || creator.is_some();
        if !is_kind {
            continue;
        }
        let reason = if footprint.mapped.contains(&path) {
            "mapped by a process of the job".to_string()
        } else if let Some(pid) = creator.filter(|pid| footprint.pids.contains(pid)) {
            format!("created by pid {pid} of the job")
        } else {
            continue;
        };
        if creator.is_some_and(pid_alive) {
            continue; // its creator still runs (a reused pid, or not ours after all)
        }
        let error = fs::remove_file(&path).err().map(|error| error.to_string());
        removed.push(Removal {
            path,
            reason,
            error,
        });
    }
    removed.sort_by(|a, b| a.path.cmp(&b.path));
    removed
}

/// The creating pid in `torch_<pid>_<rand>_<n>`.
fn torch_pid(name: &str) -> Option<i32> {
    name.strip_prefix("torch_")?.split('_').next()?.parse().ok()
}

fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_jobs_own_objects_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let uid = nix::unistd::getuid().as_raw();
        let dead_pid = 99_999_999; // above pid_max: never alive
        let files = [
            "sem.mp-ours".to_string(),
            "sem.mp-foreign".to_string(),
            format!("torch_{dead_pid}_abc_0"),
            "torch_12345678_other_0".to_string(),
            "unrelated-ours".to_string(),
        ];
        for name in &files {
            fs::write(dir.path().join(name), b"x").unwrap();
        }
        let footprint = JobFootprint {
            pids: [dead_pid].into_iter().collect(),
            mapped: [
                dir.path().join("sem.mp-ours"),
                dir.path().join("unrelated-ours"),
            ]
            .into_iter()
            .collect(),
        };
        let removed = clean_shm(dir.path(), uid, &footprint);
        let names: Vec<String> = removed
            .iter()
            .map(|removal| {
                removal
                    .path
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(
            names,
            vec!["sem.mp-ours".to_string(), format!("torch_{dead_pid}_abc_0")]
        );
        assert!(dir.path().join("sem.mp-foreign").exists());
        assert!(dir.path().join("torch_12345678_other_0").exists());
        assert!(
            dir.path().join("unrelated-ours").exists(),
            "only sem.mp-* and torch_* are ours to remove"
        );
        // Another user's files are never touched.
        assert!(clean_shm(dir.path(), uid + 1, &footprint).is_empty());
    }

    #[test]
    fn a_torch_file_of_a_live_creator_stays() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id() as i32;
        let name = format!("torch_{me}_x_0");
        fs::write(dir.path().join(&name), b"x").unwrap();
        let footprint = JobFootprint {
            pids: [me].into_iter().collect(),
            mapped: BTreeSet::new(),
        };
        assert!(clean_shm(dir.path(), nix::unistd::getuid().as_raw(), &footprint).is_empty());
    }
}
