//! The libraries `gpuvisor` carries inside itself (built by `build.rs`): the LD_PRELOAD shim
//! and the GPU simulator. On first use each is written to a cache directory named after their
//! hashes, `$XDG_CACHE_HOME/gpuvisor/<hash>/` (else `~/.cache/gpuvisor/`, else a private temp
//! directory), and every later use checks the file's SHA-256 before trusting it.
//!
//! Files are written under a temporary name and renamed into place, so two `gpuvisor`s
//! starting at once never load a half-written library.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::failure::Failure;
use crate::sha256::sha256_hex;

static SHIM_BYTES: &[u8] = include_bytes!(env!("GPUVISOR_EMBEDDED_SHIM_PATH"));
const SHIM_SHA256: &str = env!("GPUVISOR_EMBEDDED_SHIM_SHA256");
static SIM_BYTES: &[u8] = include_bytes!(env!("GPUVISOR_EMBEDDED_SIM_PATH"));
const SIM_SHA256: &str = env!("GPUVISOR_EMBEDDED_SIM_SHA256");

/// File name of the shim in the cache directory.
pub const SHIM_FILE: &str = "libgpuvisor_shim.so";
/// Directory (inside the cache directory) holding the simulator as `libcuda.so.1`, and as
/// `libnvidia-ml.so.1` (a link: the simulator is also the NVML stand-in).
pub const SIM_DIR: &str = "sim";

/// Where the libraries were written.
#[derive(Debug, Clone)]
pub struct Libraries {
    /// The shim, for LD_PRELOAD.
    pub shim: PathBuf,
    /// The directory holding the simulator as `libcuda.so.1` (for LD_LIBRARY_PATH), when asked.
    pub sim_dir: Option<PathBuf>,
}

/// Writes (or checks) the shim, and the simulator when `with_simulator`, and returns their
/// paths.
pub fn install(with_simulator: bool) -> Result<Libraries, Failure> {
    let key = &sha256_hex(format!("{SHIM_SHA256}{SIM_SHA256}").as_bytes())[..16];
    let mut reasons = Vec::new();
    for base in cache_bases() {
        let dir = base.join(key);
        match install_in(&dir, with_simulator) {
            Ok(libraries) => return Ok(libraries),
            Err(error) => reasons.push(format!("{}: {error}", dir.display())),
        }
    }
    Err(Failure::unavailable(format!(
        "cannot write gpuvisor's shim library to any cache directory ({})\n  hint: set XDG_CACHE_HOME to a writable directory",
        reasons.join("; ")
    )))
}

fn install_in(dir: &Path, with_simulator: bool) -> std::io::Result<Libraries> {
    let shim = dir.join(SHIM_FILE);
    ensure_file(&shim, SHIM_BYTES, SHIM_SHA256)?;
    let sim_dir = if with_simulator {
        let sim_dir = dir.join(SIM_DIR);
        ensure_file(&sim_dir.join("libcuda.so.1"), SIM_BYTES, SIM_SHA256)?;
        ensure_link(&sim_dir.join("libnvidia-ml.so.1"), "libcuda.so.1")?;
        Some(sim_dir)
    } else {
        None
    };
    Ok(Libraries { shim, sim_dir })
}

/// Cache directories to try, best first.
fn cache_bases() -> Vec<PathBuf> {
    let mut bases = Vec::new();
    if let Some(xdg) = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|path| path.is_absolute())
    {
        bases.push(xdg.join("gpuvisor"));
    }
    if let Some(home) = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|path| path.is_absolute())
    {
        bases.push(home.join(".cache").join("gpuvisor"));
    }
    // /proc/self belongs to our effective uid: a per-user name without calling getuid.
    let uid = fs::metadata("/proc/self")
        .map(|meta| meta.uid())
        .unwrap_or(0);
    bases.push(std::env::temp_dir().join(format!("gpuvisor-{uid}")));
    bases
}

/// Makes `path` hold exactly `bytes` (checked by `sha256`), writing it if missing or wrong.
fn ensure_file(path: &Path, bytes: &[u8], sha256: &str) -> std::io::Result<()> {
    if fs::read(path).is_ok_and(|existing| sha256_hex(&existing) == sha256) {
        return Ok(());
    }
    let dir = path.parent().expect("library paths have a directory");
    fs::create_dir_all(dir)?;
    check_private(dir)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |time| time.subsec_nanos());
    let temporary = dir.join(format!(
        ".{}.{}.{nanos}.tmp",
        path.file_name()
            .and_then(|name| name.to_str())
            .unwrap_or("lib"),
        std::process::id()
    ));
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .open(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temporary, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    result
}

/// Makes `path` a symbolic link to `target` (relative to its directory), replacing anything
/// else there by a rename, so a concurrent reader never finds it missing.
fn ensure_link(path: &Path, target: &str) -> std::io::Result<()> {
    if fs::read_link(path).is_ok_and(|existing| existing == Path::new(target)) {
        return Ok(());
    }
    let temporary = path.with_extension(format!("{}.tmp", std::process::id()));
    let _ = fs::remove_file(&temporary);
    std::os::unix::fs::symlink(target, &temporary)?;
    fs::rename(&temporary, path).inspect_err(|_| {
        let _ = fs::remove_file(&temporary);
    })
}

/// Refuses a directory another user could write to: whoever can replace the shim runs code in
/// every process gpuvisor starts.
fn check_private(dir: &Path) -> std::io::Result<()> {
    let meta = fs::metadata(dir)?;
    let own_uid = fs::metadata("/proc/self")
        .map(|meta| meta.uid())
        .unwrap_or(meta.uid());
    if meta.uid() != own_uid {
        return Err(std::io::Error::other(format!(
            "owned by uid {}, not {own_uid}",
            meta.uid()
        )));
    }
    if meta.permissions().mode() & 0o022 != 0 {
        fs::set_permissions(
            dir,
            fs::Permissions::from_mode(meta.permissions().mode() & !0o022),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_once_and_repairs_a_corrupted_copy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("lib.so");
        let bytes = b"pretend library".as_slice();
        let sha = sha256_hex(bytes);
        ensure_file(&path, bytes, &sha).unwrap();
        assert_eq!(fs::read(&path).unwrap(), bytes);
        fs::write(&path, b"half-writ").unwrap();
        ensure_file(&path, bytes, &sha).unwrap();
        assert_eq!(fs::read(&path).unwrap(), bytes);
        let leftovers: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, ["lib.so"]);
    }

    #[test]
    fn the_nvml_name_links_to_the_simulator_and_replaces_anything_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libnvidia-ml.so.1");
        fs::write(&path, b"a stale copy").unwrap();
        for _ in 0..2 {
            ensure_link(&path, "libcuda.so.1").unwrap();
            assert_eq!(fs::read_link(&path).unwrap(), Path::new("libcuda.so.1"));
        }
        let entries: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(entries, ["libnvidia-ml.so.1"]);
    }

    #[test]
    fn embedded_libraries_match_their_hashes() {
        assert_eq!(sha256_hex(SHIM_BYTES), SHIM_SHA256);
        assert_eq!(sha256_hex(SIM_BYTES), SIM_SHA256);
    }
}
