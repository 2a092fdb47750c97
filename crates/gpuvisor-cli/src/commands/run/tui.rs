//! `gpuvisor run --tui`: the job's live view (`gpuvisor top` over its run directory) in place
//! of the plain prefixed output. The view runs on its own thread; the supervisor keeps the
//! main thread, as it must (keepers die with it).
//!
//! In raw mode Ctrl-C reaches the view as a key, not as SIGINT: the view then asks the
//! supervisor to stop the job over the control socket, as Ctrl-C does for a plain `run`. `q`
//! asks first. When the job ends the view closes and the summary is printed as usual.
//!
//! When the terminal goes away (tmux kill-session, a dropped SSH session: a hang-up, end of
//! file or an I/O error on it) the view ends and raises SIGHUP in this process, so the
//! supervisor stops the job as it does for a hang-up from the kernel and exits with 129;
//! nothing waits on a terminal that is gone.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use gpuvisor_observe::top::terminal::{restore_terminal, run_interactive, LoopEnd, LoopOptions};
use gpuvisor_observe::top::RunSource;
use gpuvisor_supervisor::control::{request, Request};
use gpuvisor_supervisor::rundir::socket_path;
use nix::sys::signal::{SigSet, Signal};

use crate::failure::Failure;

/// Refuses `--tui` before anything starts when there is no terminal to draw on.
pub fn check_terminal() -> Result<(), Failure> {
    if std::io::stdout().is_terminal() && std::io::stdin().is_terminal() {
        Ok(())
    } else {
        Err(Failure::bad_input("--tui needs a terminal on standard input and output").with_hint("drop --tui (output then goes to the terminal or the log files), or watch the run from another terminal with `gpuvisor top RUN`"))
    }
}

/// How long [`Tui::finish`] waits for the view to restore the terminal.
const FINISH_WAIT: Duration = Duration::from_secs(2);

/// The view's thread and the flag that closes it.
pub struct Tui {
    finished: Arc<AtomicBool>,
    thread: JoinHandle<()>,
    done: mpsc::Receiver<()>,
}

/// A line on stderr that cannot fail (stderr may be the terminal that went away, and
/// `eprintln!` panics when it cannot write).
fn note(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

impl Tui {
    /// Starts the view over `run`. Call it right before supervising.
    pub fn start(run: &Path, simulated: bool) -> Result<Tui, Failure> {
        // The supervisor takes these signals on one thread of its own; the view's thread must
        // not take them either, so they are blocked before it exists (it inherits the mask).
        let mut signals = SigSet::empty();
        for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            signals.add(signal);
        }
        signals
            .thread_block()
            .map_err(|error| Failure::unavailable(format!("blocking signals: {error}")))?;
        let finished = Arc::new(AtomicBool::new(false));
        let options = LoopOptions {
            interval: Duration::from_millis(500),
            finished: Some(Arc::clone(&finished)),
            quit_stops_job: true,
        };
        let run: PathBuf = run.to_path_buf();
        let (done_sender, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("gpuvisor-tui".into())
            .spawn(move || {
                let gpus = if simulated {
                    None
                } else {
                    super::super::top::nvml_if_available()
                };
                let mut source = RunSource::new(run.clone(), gpus);
                match run_interactive(&mut source, &options) {
                    Ok(LoopEnd::Finished) => {}
                    Ok(LoopEnd::Quit) => {
                        note("gpuvisor: stopping the job (Ctrl-C again kills it)");
                        let _ = request(&socket_path(&run), &Request::Stop { process: None });
                    }
                    Ok(LoopEnd::TerminalGone(why)) => {
                        note(&format!(
                            "gpuvisor: the terminal went away ({why}); stopping the job as on SIGHUP"
                        ));
                        // To the process, not this thread (which blocks it): the supervisor's
                        // signal thread takes it (a second SIGHUP, the kernel's, does not
                        // escalate to SIGKILL).
                        let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGHUP);
                    }
                    Err(error) => {
                        note(&format!(
                            "gpuvisor: the terminal view failed ({error}); the job goes on, watch it with `gpuvisor top {}`",
                            run.display()
                        ));
                    }
                }
                let _ = done_sender.send(());
            })?;
        Ok(Tui {
            finished,
            thread,
            done,
        })
    }

    /// Closes the view (the job has ended) and waits for the terminal to be restored, at
    /// most [`FINISH_WAIT`]: a view that does not end by then is left behind (the process is
    /// about to exit) after one more attempt to restore the terminal from here.
    pub fn finish(self) {
        self.finished.store(true, Ordering::SeqCst);
        match self.done.recv_timeout(FINISH_WAIT) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = self.thread.join();
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                restore_terminal();
                note("gpuvisor: the terminal view did not close; leaving it");
            }
        }
    }
}
