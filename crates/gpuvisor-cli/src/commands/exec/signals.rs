//! Forwarding termination signals from `gpuvisor exec` to its child.
//!
//! The signals are blocked in every thread of gpuvisor and taken with `sigwait` by one thread,
//! which passes them on; the child starts with an empty signal mask (std resets it at spawn).
//! SIGINT from a terminal already reaches the child (same foreground process group), so it is
//! forwarded only when gpuvisor is not attached to a terminal, to avoid a double Ctrl-C.

use std::io::IsTerminal;

use nix::sys::signal::{kill, SigSet, Signal};
use nix::unistd::Pid;

/// The signals gpuvisor passes on instead of dying from them.
const FORWARDED: [Signal; 4] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT];

fn forwarded_set() -> SigSet {
    let mut set = SigSet::empty();
    for signal in FORWARDED {
        set.add(signal);
    }
    set
}

/// Blocks the forwarded signals in this thread (and the threads it starts afterwards). Call
/// before spawning the child, so a signal arriving in between is not lost.
pub fn block() -> nix::Result<()> {
    forwarded_set().thread_block()
}

/// Starts the thread that forwards signals to `child` until the process exits.
pub fn forward_to(child: u32) {
    let interactive = std::io::stdin().is_terminal();
    let set = forwarded_set();
    std::thread::spawn(move || loop {
        let Ok(signal) = set.wait() else { return };
        if signal == Signal::SIGINT && interactive {
            continue;
        }
        let _ = kill(Pid::from_raw(child as i32), signal);
    });
}
