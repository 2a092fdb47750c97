//! Starting replicas and reaping them, each in one place.
//!
//! Every replica runs in a new process group behind a keeper (see [`crate::keeper`]), started
//! with posix_spawn; the keeper sets its own parent-death signal, and the dynamic loader's
//! variables of the launch reach only the command (see [`LOADER_VARIABLES`]). Without a keeper
//! (tests), the command itself gets setpgid, `PR_SET_PDEATHSIG = SIGKILL` and a clean signal
//! state in the child before exec. Stdout and stderr are pipes read by the log pump, or with
//! [`Output::Files`] the replica's own log files (direct logs); stdin is /dev/null.
//!
//! Reaping happens in one thread ([`Reaper`]) for every child of the supervisor, including
//! orphans reparented to it (the supervisor is a child subreaper). It peeks with
//! `waitid(WNOWAIT)`, kills what is left in a dead keeper's process group, and reaps holding
//! the spawn lock to write, so it never steals the status std's `spawn` waits for when an exec
//! fails; spawns hold it to read, so several can run at once ([`Spawner::spawn_all`]).

use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::prctl;
use nix::sys::signal::{self, SigHandler, SigSet, Signal};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::{setpgid, Pid};

use starters::{Job, Starters};

/// What to run for one replica.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// argv; `argv[0]` is looked up in PATH unless it holds a `/`.
    pub argv: Vec<String>,
    /// Variables to set (`Some`) or remove (`None`) on top of the supervisor's environment.
    pub env: Vec<(String, Option<String>)>,
    /// Working directory.
    pub cwd: Option<PathBuf>,
    /// Where its stdout and stderr go.
    pub output: Output,
}

/// Where a replica's stdout and stderr go.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Output {
    /// Pipes, read by the log pump.
    #[default]
    Pipes,
    /// These files, opened for appending (created 0600): the child writes its log itself.
    Files {
        /// Its stdout.
        stdout: PathBuf,
        /// Its stderr.
        stderr: PathBuf,
    },
}

/// Where a started replica's output is.
#[derive(Debug)]
pub enum StartedOutput {
    /// The read ends of its pipes.
    Pipes {
        /// Its stdout.
        stdout: OwnedFd,
        /// Its stderr.
        stderr: OwnedFd,
    },
    /// Its files, and their lengths before it started (where this life's output begins).
    Files {
        /// Length of the stdout file then.
        stdout_at: u64,
        /// Length of the stderr file then.
        stderr_at: u64,
    },
}

/// A started replica.
#[derive(Debug)]
pub struct Started {
    /// The pid of the keeper (or of the command, without a keeper); also its process group.
    pub pid: i32,
    /// Its output.
    pub output: StartedOutput,
}

/// Starts replicas.
#[derive(Debug, Clone)]
pub struct Spawner {
    /// The keeper command (`[gpuvisor-keeper]`, or `[gpuvisor, __keeper]`); `None` runs
    /// commands directly (their own descendants are then not guaranteed to die with the
    /// supervisor).
    keeper: Option<Vec<OsString>>,
    /// Held to read by every spawn in progress, to write by the reaper while it reaps.
    lock: Arc<RwLock<()>>,
    /// The threads of [`Spawner::spawn_all`], started at its first use.
    starters: Arc<OnceLock<Starters>>,
}

/// How many replicas [`Spawner::spawn_all`] starts at once.
const SPAWN_THREADS: usize = 4;

impl Spawner {
    /// A spawner using `keeper` (program and leading arguments) in front of every command.
    pub fn new(keeper: Option<Vec<OsString>>) -> Spawner {
        Spawner {
            keeper,
            lock: Arc::new(RwLock::new(())),
            starters: Arc::new(OnceLock::new()),
        }
    }

    /// Starts `launch`. Fails before forking when the command cannot be found or run, with a
    /// message that says which and why.
    pub fn spawn(&self, launch: &Launch) -> io::Result<Started> {
        let program = resolve_command(launch)?;
        let mut command = match &self.keeper {
            Some(keeper) => {
                let mut command = Command::new(&keeper[0]);
                command
                    .args(&keeper[1..])
                    .arg("--parent")
                    .arg(std::process::id().to_string())
                    .arg("--")
                    .arg(&program)
                    .args(&launch.argv[1..]);
                command
            }
            None => {
                let mut command = Command::new(&program);
                command.args(&launch.argv[1..]);
                command
            }
        };
        for (name, value) in &launch.env {
            match value {
                Some(value) if self.keeper.is_some() && LOADER_VARIABLES.contains(&&**name) => {
                    command
                        .env_remove(name)
                        .env(format!("{HANDED_ON}{name}"), value)
                }
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        if let Some(cwd) = &launch.cwd {
            command.current_dir(cwd);
        }
        command.stdin(Stdio::null());
        let files_at = match &launch.output {
            Output::Pipes => {
                command.stdout(Stdio::piped()).stderr(Stdio::piped());
                None
            }
            Output::Files { stdout, stderr } => {
                let (stdout, stdout_at) = open_output(stdout)?;
                let (stderr, stderr_at) = open_output(stderr)?;
                command.stdout(stdout).stderr(stderr);
                Some((stdout_at, stderr_at))
            }
        };
        if self.keeper.is_some() {
            // The keeper sets its own parent-death signal and signal state, so this spawn needs
            // no pre_exec and std can use posix_spawn (vfork): much cheaper per replica.
            command.process_group(0);
        } else {
            install_pre_exec(&mut command, Signal::SIGKILL);
        }
        let _guard = self
            .lock
            .read()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut child = command.spawn()?;
        let output = match files_at {
            None => StartedOutput::Pipes {
                stdout: child.stdout.take().expect("piped stdout").into(),
                stderr: child.stderr.take().expect("piped stderr").into(),
            },
            Some((stdout_at, stderr_at)) => StartedOutput::Files {
                stdout_at,
                stderr_at,
            },
        };
        Ok(Started {
            pid: child.id() as i32,
            output,
        })
    }

    /// Starts every launch of `launches`, several at a time; the results in the same order.
    /// `spawn` returns once the child has exec'd, and on a busy machine the child waits for a
    /// CPU first: one at a time, 1,024 replicas spent most of their start-up in that wait.
    /// Without a keeper, one at a time: a command's own parent-death signal would follow the
    /// starter thread.
    pub fn spawn_all(&self, launches: &[Launch]) -> Vec<io::Result<Started>> {
        if launches.len() < 2 || self.keeper.is_none() {
            return launches.iter().map(|launch| self.spawn(launch)).collect();
        }
        let starters = self.starters.get_or_init(|| Starters::new(SPAWN_THREADS));
        let (reply, replies) = std::sync::mpsc::channel();
        let mut results: Vec<Option<io::Result<Started>>> = launches.iter().map(|_| None).collect();
        for (at, launch) in launches.iter().enumerate() {
            let (spawner, launch, reply) = (self.clone(), launch.clone(), reply.clone());
            let job: Job = Box::new(move || {
                let _ = reply.send((at, spawner.spawn(&launch)));
            });
            // No starter thread left: run it here.
            if let Err(job) = starters.run(job) {
                job();
            }
        }
        drop(reply);
        for (at, result) in replies {
            results[at] = Some(result);
        }
        results
            .into_iter()
            .map(|result| result.unwrap_or_else(|| Err(io::Error::other("its start was lost"))))
            .collect()
    }

    /// The reaper for children started by this spawner.
    pub fn reaper(&self) -> Reaper {
        Reaper {
            lock: Arc::clone(&self.lock),
        }
    }
}

/// The dynamic loader's variables: a launch's are handed to the keeper as
/// `GPUVISOR_KEEPER_NAME` and set by it for the command only. The keeper needs no preloaded
/// library, and loading the shim and the simulator (preloaded into every replica with
/// `--simulate`) was a fifth of each keeper's start-up.
pub(crate) const LOADER_VARIABLES: [&str; 2] = ["LD_PRELOAD", "LD_LIBRARY_PATH"];
/// The prefix of a variable the keeper hands on (see [`LOADER_VARIABLES`]).
pub(crate) const HANDED_ON: &str = "GPUVISOR_KEEPER_";

/// Signals a replica must feel at their default action: a shell that started gpuvisor in the
/// background ignores SIGINT and SIGQUIT, and ignored signals survive exec.
pub(crate) const RESET_SIGNALS: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

#[allow(unsafe_code)]
fn install_pre_exec(command: &mut Command, death_signal: Signal) {
    // SAFETY: the closure runs in the forked child before exec and only makes system calls
    // (setpgid, prctl, sigaction), all async-signal-safe; it allocates nothing, takes no lock.
    unsafe {
        command.pre_exec(move || {
            setpgid(Pid::from_raw(0), Pid::from_raw(0)).map_err(io::Error::from)?;
            prctl::set_pdeathsig(death_signal).map_err(io::Error::from)?;
            reset_signals()
        });
    }
}

/// In a forked child before exec: default actions for the stop signals and an empty signal
/// mask (std keeps the parent's mask, and the supervisor and the keeper block the signals they
/// wait for). Only async-signal-safe calls.
#[allow(unsafe_code)]
pub fn reset_signals() -> io::Result<()> {
    for signal in RESET_SIGNALS {
        // SAFETY: installing SIG_DFL runs no handler code; sigaction is async-signal-safe.
        unsafe { signal::signal(signal, SigHandler::SigDfl) }.map_err(io::Error::from)?;
    }
    signal::sigprocmask(
        signal::SigmaskHow::SIG_SETMASK,
        Some(&SigSet::empty()),
        None,
    )
    .map_err(io::Error::from)
}

/// Opens a direct log file for a child's stdout or stderr: appending, so that every write
/// lands at the end whatever else appends (a restart's new life, a rotation's hole), and its
/// length now.
fn open_output(path: &Path) -> io::Result<(std::fs::File, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("cannot open its log file {}: {error}", path.display()),
            )
        })?;
    let length = file.metadata()?.len();
    Ok((file, length))
}

/// Finds the program `launch` runs, as exec would, or says why it cannot be run.
pub fn resolve_command(launch: &Launch) -> io::Result<PathBuf> {
    let Some(name) = launch.argv.first().filter(|name| !name.is_empty()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the command is empty",
        ));
    };
    let candidates: Vec<PathBuf> = if name.contains('/') {
        let path = Path::new(name);
        vec![match (&launch.cwd, path.is_relative()) {
            (Some(cwd), true) => cwd.join(path),
            _ => path.to_path_buf(),
        }]
    } else {
        let path_var = launch
            .env
            .iter()
            .find(|(variable, _)| variable == "PATH")
            .and_then(|(_, value)| value.clone())
            .or_else(|| std::env::var("PATH").ok())
            .unwrap_or_default();
        path_var
            .split(':')
            .filter(|dir| !dir.is_empty())
            .map(|dir| Path::new(dir).join(name))
            .collect()
    };
    let mut not_executable = None;
    for candidate in candidates {
        let Ok(meta) = std::fs::metadata(&candidate) else {
            continue;
        };
        if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
            return Ok(candidate);
        }
        not_executable.get_or_insert(candidate);
    }
    Err(match not_executable {
        Some(path) => io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("`{}` is not an executable file (hint: chmod +x it, or run it through its interpreter)", path.display()),
        ),
        None if name.contains('/') => io::Error::new(
            io::ErrorKind::NotFound,
            format!("command `{name}` does not exist (hint: check the path in `command`; relative paths start from `cwd`)"),
        ),
        None => io::Error::new(
            io::ErrorKind::NotFound,
            format!("command `{name}` not found in PATH (hint: install it or give its full path in `command`)"),
        ),
    })
}

/// How a reaped process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// exit(code).
    Code(i32),
    /// Killed by this signal; `core` if it dumped core.
    Signal {
        /// The signal number.
        signal: i32,
        /// A core file was written.
        core: bool,
    },
}

impl ExitStatus {
    /// Exit code 0.
    pub fn success(self) -> bool {
        self == ExitStatus::Code(0)
    }
}

/// Reaps every child of the supervisor, in one thread.
#[derive(Debug)]
pub struct Reaper {
    lock: Arc<RwLock<()>>,
}

impl Reaper {
    /// Sends `(pid, status)` for every child that ends, until `stop` is set while no child
    /// is left, or `sender`'s receiver is gone.
    pub fn run(self, sender: Sender<(i32, ExitStatus)>, stop: &AtomicBool) {
        loop {
            // Peek without reaping: the pid stays a zombie until we hold the spawn lock.
            let peeked = waitid(Id::All, WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT);
            let pid = match peeked {
                Ok(status) => match status.pid() {
                    Some(pid) => pid,
                    None => continue,
                },
                Err(Errno::ECHILD) => {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                Err(_) => continue,
            };
            // Still a zombie, so its pid cannot have been reused: if it led a process group
            // (a keeper), whatever is left in that group lost its keeper (say the keeper was
            // OOM-killed) and goes with it.
            if crate::procfs::stat(pid.as_raw()).is_some_and(|stat| stat.pgid == stat.pid) {
                let _ = nix::sys::signal::killpg(pid, Signal::SIGKILL);
            }
            let status = {
                let _guard = self
                    .lock
                    .write()
                    .unwrap_or_else(|poison| poison.into_inner());
                waitpid(pid, Some(WaitPidFlag::WNOHANG))
            };
            let status = match status {
                Ok(WaitStatus::Exited(_, code)) => ExitStatus::Code(code),
                Ok(WaitStatus::Signaled(_, signal, core)) => ExitStatus::Signal {
                    signal: signal as i32,
                    core,
                },
                _ => continue, // std reaped it (a failed exec), or not an exit
            };
            if sender.send((pid.as_raw(), status)).is_err() {
                return;
            }
        }
    }
}

mod starters;

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(argv: &[&str], cwd: Option<&Path>) -> Launch {
        Launch {
            output: Output::Pipes,
            argv: argv.iter().map(|arg| arg.to_string()).collect(),
            env: Vec::new(),
            cwd: cwd.map(Path::to_path_buf),
        }
    }

    #[test]
    fn commands_are_found_as_exec_would_or_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("run.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        // Not executable yet.
        let error = resolve_command(&launch(&["./run.sh"], Some(dir.path()))).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
        assert!(
            error.to_string().contains("not an executable file"),
            "{error}"
        );
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Relative to the replica's cwd.
        assert_eq!(
            resolve_command(&launch(&["./run.sh"], Some(dir.path()))).unwrap(),
            script
        );
        // Through PATH, the replica's own PATH first.
        let mut through_path = launch(&["run.sh"], None);
        through_path
            .env
            .push(("PATH".into(), Some(dir.path().display().to_string())));
        assert_eq!(resolve_command(&through_path).unwrap(), script);
        let missing = resolve_command(&launch(&["no-such-gpuvisor-command"], None)).unwrap_err();
        assert!(
            missing.to_string().contains("not found in PATH"),
            "{missing}"
        );
        assert!(resolve_command(&launch(&[""], None)).is_err());
    }
}
