//! The keeper: a tiny process between the supervisor and each replica
//! (`gpuvisor-keeper --parent PID -- COMMAND...`, or `gpuvisor __keeper ...` where no
//! `gpuvisor-keeper` is installed beside `gpuvisor`), so that no process of the job outlives
//! the supervisor, even when it is killed with SIGKILL.
//!
//! It is its own small binary because one is started per replica: exec'ing the whole CLI
//! (relocating it, then forking it) was most of the machine's CPU per replica at start-up.
//!
//! The supervisor starts the keeper as the leader of a new process group. The keeper sets
//! `PR_SET_PDEATHSIG = SIGTERM` on itself (then checks its parent is still the supervisor),
//! makes itself a child subreaper (orphans anywhere in the replica's tree are reparented to it,
//! whatever their process group), starts the command in the keeper's group (so a signal to the
//! group reaches the command) with `posix_spawn` (no copy of the keeper's memory; the spawn
//! attributes give the command an empty signal mask and default actions), and waits for
//! signals:
//! - SIGCHLD: reap. When the command exits, kill what is left of its tree, then exit the same
//!   way the command did (same code, or the same signal), so the supervisor sees the real status.
//! - SIGTERM / SIGINT / ...: if the parent is gone (the parent-death signal), kill the whole tree
//!   and exit; otherwise the signal was for the group (a stop) and the command got it too.

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::spawn::{
    posix_spawn, posix_spawnp, PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags,
};
use nix::sys::prctl;
use nix::sys::resource::{setrlimit, Resource};
use nix::sys::signal::{kill, raise, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{getpid, getppid, Pid};

use crate::{procfs, spawn};

/// The signals the keeper waits for instead of being killed by them.
const WATCHED: [Signal; 7] = [
    Signal::SIGCHLD,
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// The name of the keeper's own binary, installed beside `gpuvisor`.
pub const BINARY: &str = "gpuvisor-keeper";

/// The keeper command (program and leading arguments) for the `gpuvisor` binary at
/// `gpuvisor`: the `gpuvisor-keeper` installed beside it when there is one, else
/// `gpuvisor __keeper` (the same code, dearer to start).
pub fn command_beside(gpuvisor: &Path) -> Vec<OsString> {
    let keeper = gpuvisor.with_file_name(BINARY);
    let executable = std::fs::metadata(&keeper)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0);
    match executable {
        true => vec![keeper.into()],
        false => vec![gpuvisor.into(), "__keeper".into()],
    }
}

/// The keeper binary's `main`: `--parent PID -- COMMAND...`, or a usage line and status 2.
pub fn main() -> ! {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match parse_args(&args) {
        Some((parent, command)) => run(parent, &command),
        None => {
            eprintln!("usage: {BINARY} --parent PID -- COMMAND...");
            eprintln!("hint: gpuvisor starts this itself in front of each replica; run `gpuvisor run JOB.toml`");
            std::process::exit(2);
        }
    }
}

/// Parses `--parent PID -- COMMAND...` (what follows `__keeper`).
pub fn parse_args(args: &[OsString]) -> Option<(i32, Vec<OsString>)> {
    let mut iter = args.iter();
    if iter.next()?.to_str()? != "--parent" {
        return None;
    }
    let parent: i32 = iter.next()?.to_str()?.parse().ok()?;
    if iter.next()?.to_str()? != "--" {
        return None;
    }
    let command: Vec<OsString> = iter.cloned().collect();
    (!command.is_empty()).then_some((parent, command))
}

/// Runs the keeper; never returns. `parent` is the supervisor's pid.
pub fn run(parent: i32, command: &[OsString]) -> ! {
    // Started by posix_spawn: it may inherit ignored stop signals (from a background shell).
    let _ = spawn::reset_signals();
    let mut watched = SigSet::empty();
    for signal in WATCHED {
        watched.add(signal);
    }
    // Blocked here and waited for below; the child gets an empty mask (clear_mask_in_child).
    let _ = watched.thread_block();
    let _ = prctl::set_child_subreaper(true);
    // SIGTERM, not SIGKILL: the keeper must outlive its parent long enough to kill the tree.
    let _ = prctl::set_pdeathsig(Signal::SIGTERM);
    // Checked after setting the death signal: a parent gone before that is seen here.
    if getppid().as_raw() != parent {
        // The supervisor died before we were ready: nothing to keep.
        std::process::exit(137);
    }
    let main = match start(command) {
        Ok(pid) => pid,
        Err(error) => {
            eprintln!(
                "gpuvisor: cannot start `{}`: {}",
                command[0].to_string_lossy(),
                std::io::Error::from(error)
            );
            std::process::exit(if error == Errno::ENOENT { 127 } else { 126 });
        }
    };
    loop {
        let Ok(signal) = watched.wait() else { continue };
        if signal == Signal::SIGCHLD {
            if let Some(status) = reap(main) {
                kill_tree();
                exit_like(status);
            }
        } else if getppid().as_raw() != parent {
            kill_tree();
            std::process::exit(128 + Signal::SIGKILL as i32);
        }
    }
}

/// Starts `command` in the keeper's process group, with an empty signal mask and default
/// actions for the stop signals (the keeper blocks the signals it waits for, and a command
/// started with SIGTERM blocked would outlive every stop until the SIGKILL). Looked up in PATH
/// when it names no directory, as exec does.
fn start(command: &[OsString]) -> Result<Pid, Errno> {
    let mut attr = PosixSpawnAttr::init()?;
    let mut defaults = SigSet::empty();
    for signal in spawn::RESET_SIGNALS {
        defaults.add(signal);
    }
    attr.set_sigdefault(&defaults)?;
    attr.set_sigmask(&SigSet::empty())?;
    attr.set_flags(
        PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF | PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK,
    )?;
    let actions = PosixSpawnFileActions::init()?;
    let args = command
        .iter()
        .map(|arg| c_string(arg))
        .collect::<Result<Vec<_>, _>>()?;
    let env = command_env(std::env::vars_os())?;
    if command[0].as_bytes().contains(&b'/') {
        posix_spawn(command[0].as_os_str(), &actions, &attr, &args, &env)
    } else {
        posix_spawnp(&args[0], &actions, &attr, &args, &env)
    }
}

/// The command's environment: the keeper's, with the dynamic loader's variables the
/// supervisor handed on (`GPUVISOR_KEEPER_LD_PRELOAD`, ...) under their own names.
fn command_env(
    keeper_env: impl Iterator<Item = (OsString, OsString)>,
) -> Result<Vec<CString>, Errno> {
    // A shim preloaded into this keeper (inherited from gpuvisor's own environment) made the
    // keeper the root of the replica's tree (GPUVISOR_ROOT_PID); the root is the command, or
    // `children_cpu_only` would refuse it.
    let me = OsString::from(std::process::id().to_string());
    let keeper_env: Vec<(OsString, OsString)> = keeper_env.collect();
    let replaced: Vec<&str> = keeper_env
        .iter()
        .filter_map(|(name, _)| handed_on(name))
        .collect();
    let mut env = Vec::new();
    for (name, value) in &keeper_env {
        let name = match handed_on(name) {
            Some(original) => OsStr::new(original),
            None if name == "GPUVISOR_ROOT_PID" && *value == me => continue,
            None if name.to_str().is_some_and(|name| replaced.contains(&name)) => continue,
            None => name.as_os_str(),
        };
        let mut pair = name.to_os_string();
        pair.push("=");
        pair.push(value);
        env.push(c_string(&pair)?);
    }
    Ok(env)
}

/// The loader's variable that `name` hands on (`GPUVISOR_KEEPER_LD_PRELOAD`: `LD_PRELOAD`).
fn handed_on(name: &OsStr) -> Option<&'static str> {
    let name = name.to_str()?.strip_prefix(spawn::HANDED_ON)?;
    spawn::LOADER_VARIABLES
        .into_iter()
        .find(|variable| *variable == name)
}

/// `text` for a C call; a NUL inside it cannot be passed on (the kernel would cut it there).
fn c_string(text: &OsStr) -> Result<CString, Errno> {
    CString::new(text.as_bytes()).map_err(|_| Errno::EINVAL)
}

/// Reaps every exited child; the main command's status when it is among them.
fn reap(main: Pid) -> Option<WaitStatus> {
    let mut main_status = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return main_status,
            Ok(status) => {
                if status.pid() == Some(main) {
                    main_status = Some(status);
                }
            }
        }
    }
}

/// SIGKILLs every descendant of this keeper (orphans are reparented to it, so this is the
/// whole tree), until nothing is left, reaping as it goes. Only descendants: a keeper started
/// by hand inside someone else's process group must not kill that group.
fn kill_tree() {
    let me = getpid().as_raw();
    for _round in 0..50 {
        let left = procfs::descendants(me);
        if left.is_empty() {
            return;
        }
        for pid in &left {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Ok(_) => continue,
                Err(_) => break,
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Exits with the command's status: its code, or death by its signal (without a core file).
fn exit_like(status: WaitStatus) -> ! {
    match status {
        WaitStatus::Exited(_, code) => std::process::exit(code),
        WaitStatus::Signaled(_, signal, _) => {
            let _ = setrlimit(Resource::RLIMIT_CORE, 0, 0);
            // Default disposition and unblocked, so raising it ends this process the same way.
            let mut only = SigSet::empty();
            only.add(signal);
            let _ = only.thread_unblock();
            let _ = raise(signal);
            std::process::exit(128 + signal as i32)
        }
        _ => std::process::exit(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_small_keeper_beside_gpuvisor_is_preferred_when_it_can_run() {
        let dir = tempfile::tempdir().unwrap();
        let gpuvisor = dir.path().join("gpuvisor");
        let fallback = vec![OsString::from(&gpuvisor), "__keeper".into()];
        assert_eq!(command_beside(&gpuvisor), fallback, "none beside it");
        let keeper = dir.path().join(BINARY);
        std::fs::write(&keeper, "").unwrap();
        assert_eq!(command_beside(&gpuvisor), fallback, "not executable");
        std::fs::set_permissions(&keeper, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(command_beside(&gpuvisor), vec![OsString::from(&keeper)]);
    }

    #[test]
    fn the_command_gets_the_loader_variables_handed_on_under_their_own_names() {
        let env = [
            ("PATH", "/bin"),
            ("LD_PRELOAD", "/inherited.so"),
            ("GPUVISOR_KEEPER_LD_PRELOAD", "/shim.so"),
            ("GPUVISOR_KEEPER_HOME", "/not-handed-on"),
            ("GPUVISOR_ROOT_PID", "1"),
        ];
        let env = env
            .iter()
            .map(|(name, value)| (OsString::from(name), OsString::from(value)));
        let got: Vec<String> = command_env(env)
            .unwrap()
            .into_iter()
            .map(|pair| pair.into_string().unwrap())
            .collect();
        assert_eq!(
            got,
            [
                "PATH=/bin",
                "LD_PRELOAD=/shim.so",
                "GPUVISOR_KEEPER_HOME=/not-handed-on",
                // Another process's root, not this keeper's: kept.
                "GPUVISOR_ROOT_PID=1",
            ]
        );
    }
}
