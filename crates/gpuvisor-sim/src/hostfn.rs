//! Host functions (`cuLaunchHostFunc`, `cuStreamAddCallback`) run in stream order on a worker
//! thread, as the real driver runs them: PJRT waits for them, so they must run, and never on
//! the caller's thread (the caller may hold a lock the function takes).
//!
//! Kernels never run, so the only work a stream ever waits for is host functions. Each one
//! gets a ticket; an event recorded, or a synchronisation begun, after ticket `n` is complete
//! once the worker has finished ticket `n`. One worker serves every stream, which keeps each
//! stream's order (and is stricter than the hardware across streams).

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::{Condvar, Mutex};

use crate::process;

/// A host function and its argument.
type HostFunction = unsafe extern "C" fn(*mut c_void);

#[derive(Default)]
struct Queue {
    /// The pid this queue (and its worker) belongs to.
    pid: u32,
    pending: VecDeque<(HostFunction, usize)>,
    /// Tickets handed out, and finished.
    issued: u64,
    finished: u64,
    worker_started: bool,
}

static QUEUE: Mutex<Option<Queue>> = Mutex::new(None);
static CHANGED: Condvar = Condvar::new();

/// Runs `body` on this process's queue. After a fork the parent's queue (and worker) are gone.
fn with_queue<R>(body: impl FnOnce(&mut Queue) -> R) -> R {
    let mut guard = QUEUE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let pid = process::pid();
    if guard.as_ref().is_none_or(|queue| queue.pid != pid) {
        *guard = Some(Queue {
            pid,
            ..Queue::default()
        });
    }
    body(guard.as_mut().expect("the queue was just made"))
}

/// Queues `function(argument)`; returns its ticket.
pub fn enqueue(function: HostFunction, argument: *mut c_void) -> u64 {
    let (ticket, start_worker) = with_queue(|queue| {
        queue.pending.push_back((function, argument as usize));
        queue.issued += 1;
        let start = !queue.worker_started;
        queue.worker_started = true;
        (queue.issued, start)
    });
    if start_worker {
        let spawned = std::thread::Builder::new()
            .name("gpuvisor-sim-host".into())
            .spawn(worker);
        if spawned.is_err() {
            // No thread: run what is queued here rather than never.
            with_queue(|queue| queue.worker_started = false);
            drain_here();
        }
    }
    CHANGED.notify_all();
    ticket
}

fn drain_here() {
    while let Some((function, argument)) = with_queue(|queue| queue.pending.pop_front()) {
        // SAFETY: the caller of cuLaunchHostFunc gave a function for this argument.
        unsafe { function(argument as *mut c_void) };
        with_queue(|queue| queue.finished += 1);
    }
}

fn worker() {
    let pid = process::pid();
    loop {
        let next = {
            let mut guard = QUEUE
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            loop {
                match guard.as_mut() {
                    Some(queue) if queue.pid == pid => {
                        if let Some(next) = queue.pending.pop_front() {
                            break next;
                        }
                    }
                    _ => return,
                }
                guard = CHANGED
                    .wait(guard)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        };
        let (function, argument) = next;
        // A panic cannot come from a C function; the catch keeps the worker alive regardless.
        let _ = std::panic::catch_unwind(|| {
            // SAFETY: the caller of cuLaunchHostFunc gave a function for this argument.
            unsafe { function(argument as *mut c_void) }
        });
        with_queue(|queue| queue.finished += 1);
        CHANGED.notify_all();
    }
}

/// The ticket of the last host function queued so far (0 when none).
pub fn last_ticket() -> u64 {
    with_queue(|queue| queue.issued)
}

/// Whether ticket `ticket` has finished.
pub fn done(ticket: u64) -> bool {
    with_queue(|queue| queue.finished >= ticket)
}

/// Waits until ticket `ticket` has finished. Called from the worker itself (a host function
/// that synchronises), it returns at once rather than wait for itself.
pub fn wait(ticket: u64) {
    if std::thread::current().name() == Some("gpuvisor-sim-host") {
        return;
    }
    let mut guard = QUEUE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    loop {
        match guard.as_ref() {
            Some(queue) if queue.pid == process::pid() && queue.finished < ticket => {}
            _ => return,
        }
        guard = CHANGED
            .wait(guard)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
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
