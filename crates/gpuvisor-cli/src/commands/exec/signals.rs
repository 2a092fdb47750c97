//! Forwarding termination signals from `gpuvisor exec` to its child.
//!
//! The signals are blocked in every thread of gpuvisor and taken with `sigwait` by one thread,
//! which passes them on. A child inherits the signal mask, and unblocking them around the spawn
//! would let a signal kill gpuvisor between fork and exec; so the child is started as
//! `gpuvisor __exec-child -- CMD`, which restores default actions and an empty mask in itself
//! (the supervisor's `spawn::reset_signals`) and execs CMD.
//! SIGINT from a terminal already reaches the child (same foreground process group), so it is
//! forwarded only when gpuvisor is not attached to a terminal, to avoid a double Ctrl-C.

use std::io::IsTerminal;

use nix::sys::signal::{kill, SigSet, Signal};
use nix::unistd::Pid;

/// The signals gpuvisor passes on instead of dying from them.
const FORWARDED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

fn forwarded_set() -> SigSet {
    let mut set = SigSet::empty();
    for signal in FORWARDED {
        set.add(signal);
    }
    set
}

/// Blocks the forwarded signals in this thread (and the threads it starts afterwards). Called
/// first thing, so threads a library starts later (NVML) block them too.
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
