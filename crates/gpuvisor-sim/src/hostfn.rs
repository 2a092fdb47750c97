//! Host functions (`cuLaunchHostFunc`, `cuStreamAddCallback`) run in stream order on a worker
//! thread, as the real driver runs them: PJRT waits for them, so they must run, and never on
//! the caller's thread (the caller may hold a lock the function takes).
//!
//! Kernels never run, so the only work a stream ever waits for is host functions. Each one
//! gets a ticket; an event recorded, or a synchronisation begun, after ticket `n` is complete
//! once the worker has finished ticket `n`. One worker serves every stream, which keeps each
//! stream's order (and is stricter than the hardware across streams). The queue sits behind a
//! fork-safe lock ([`ForkLock`]); a forked child starts with an empty queue and its own worker.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::thread::Thread;
use std::time::Duration;

use crate::forklock::ForkLock;

/// A host function and its argument.
type HostFunction = unsafe extern "C" fn(*mut c_void);

/// The name of the worker thread (a host function that synchronises must not wait for itself).
const WORKER: &str = "gpuvisor-sim-host";

#[derive(Default)]
struct Queue {
    pending: VecDeque<(HostFunction, usize)>,
    /// Tickets handed out, and finished.
    issued: u64,
    finished: u64,
    /// The worker, to wake; None until the first host function (and in a forked child, whose
    /// queue starts fresh: the parent's worker does not exist there).
    worker: Option<Thread>,
}

/// Behind a fork-safe lock: waiting is by polling and parking, never by a condition variable
/// whose mutex a forked child could find held forever.
static QUEUE: ForkLock<Queue> = ForkLock::new();

/// Queues `function(argument)`; returns its ticket.
pub fn enqueue(function: HostFunction, argument: *mut c_void) -> u64 {
    let (ticket, worker) = QUEUE.with(|queue| {
        queue.pending.push_back((function, argument as usize));
        queue.issued += 1;
        (queue.issued, queue.worker.clone())
    });
    match worker {
        Some(worker) => worker.unpark(),
        None => start_worker(),
    }
    ticket
}

fn start_worker() {
    match std::thread::Builder::new()
        .name(WORKER.into())
        .spawn(worker)
    {
        Ok(handle) => {
            let thread = handle.thread().clone();
            QUEUE.with(|queue| queue.worker = Some(thread.clone()));
            thread.unpark();
        }
        // No thread: run what is queued here rather than never.
        Err(_) => {
            while let Some((function, argument)) = QUEUE.with(|queue| queue.pending.pop_front()) {
                // SAFETY: the caller of cuLaunchHostFunc gave a function for this argument.
                unsafe { function(argument as *mut c_void) };
                QUEUE.with(|queue| queue.finished += 1);
            }
        }
    }
}

fn worker() {
    loop {
        match QUEUE.with(|queue| queue.pending.pop_front()) {
            Some((function, argument)) => {
                // A panic cannot come from a C function; the catch keeps the worker alive
                // regardless.
                let _ = std::panic::catch_unwind(|| {
                    // SAFETY: the caller of cuLaunchHostFunc gave a function for this argument.
                    unsafe { function(argument as *mut c_void) }
                });
                QUEUE.with(|queue| queue.finished += 1);
            }
            None => std::thread::park_timeout(Duration::from_millis(50)),
        }
    }
}

/// The ticket of the last host function queued so far (0 when none).
pub fn last_ticket() -> u64 {
    QUEUE.with(|queue| queue.issued)
}

/// Whether ticket `ticket` has finished.
pub fn done(ticket: u64) -> bool {
    QUEUE.with(|queue| queue.finished >= ticket)
}

/// Waits until ticket `ticket` has finished, polling with a growing pause (20 µs to 1 ms).
/// Called from the worker itself (a host function that synchronises), it returns at once
/// rather than wait for itself.
pub fn wait(ticket: u64) {
    if std::thread::current().name() == Some(WORKER) {
        return;
    }
    let mut pause = Duration::from_micros(20);
    while !done(ticket) {
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static RAN: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn count(argument: *mut c_void) {
        RAN.fetch_add(argument as usize, Ordering::SeqCst);
    }

    #[test]
    fn host_functions_run_in_order_and_can_be_waited_for() {
        let first = enqueue(count, std::ptr::without_provenance_mut(1));
        let second = enqueue(count, std::ptr::without_provenance_mut(10));
        assert!(second > first);
        wait(second);
        assert!(done(first) && done(second));
        assert!(RAN.load(Ordering::SeqCst) >= 11);
    }
}
