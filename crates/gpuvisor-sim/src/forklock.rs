//! A lock that a forked child can always take.
//!
//! The simulator runs inside other people's programs, which fork (multiprocessing, joblib,
//! DataLoader workers). A mutex held by another thread at the moment of `fork()` stays locked
//! forever in the child. This lock records the holder's pid instead: a child sees a pid that is
//! not its own, knows the holder does not exist in its address space, and takes the lock over,
//! starting from fresh data (the old data may be half-updated, so it is leaked, never read or
//! dropped). Critical sections are short; waiters spin, then yield.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::process;

/// Data of type `T`, private to one process, behind a fork-safe lock.
pub struct ForkLock<T> {
    /// The pid of the holder; 0 when free.
    holder: AtomicU32,
    /// The pid the data belongs to; 0 before the first use.
    owner: UnsafeCell<u32>,
    data: UnsafeCell<Option<T>>,
}

// SAFETY: the data is only reached through `with`, which gives one thread at a time.
unsafe impl<T: Send> Sync for ForkLock<T> {}

impl<T: Default> ForkLock<T> {
    /// An empty lock; the data is made on first use.
    pub const fn new() -> ForkLock<T> {
        ForkLock {
            holder: AtomicU32::new(0),
            owner: UnsafeCell::new(0),
            data: UnsafeCell::new(None),
        }
    }

    /// Runs `body` on this process's data. `body` must not call back into the same lock.
    pub fn with<R>(&self, body: impl FnOnce(&mut T) -> R) -> R {
        let pid = process::pid();
        let mut spins = 0u32;
        loop {
            match self
                .holder
                .compare_exchange_weak(0, pid, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => break,
                // Held by a thread of the parent we were forked from: it does not exist here.
                Err(other) if other != 0 && other != pid => {
                    if self
                        .holder
                        .compare_exchange(other, pid, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        break;
                    }
                }
                Err(_) => {}
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: this thread holds the lock, so it alone reaches `owner` and `data`.
        let (owner, data) = unsafe { (&mut *self.owner.get(), &mut *self.data.get()) };
        if *owner != pid {
            // Made by the parent (or never made): leak it, it may be half-updated.
            if let Some(old) = data.take() {
                std::mem::forget(old);
            }
            *owner = pid;
        }
        let result = body(data.get_or_insert_with(T::default));
        self.holder.store(0, Ordering::Release);
        result
    }
}

impl<T: Default> Default for ForkLock<T> {
    fn default() -> ForkLock<T> {
        ForkLock::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_take_turns() {
        static COUNTER: ForkLock<u64> = ForkLock::new();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        COUNTER.with(|count| *count += 1);
                    }
                });
            }
        });
        assert_eq!(COUNTER.with(|count| *count), 4000);
    }

    #[test]
    fn a_lock_held_by_another_pid_is_taken_over_with_fresh_data() {
        let lock: ForkLock<Vec<u32>> = ForkLock::new();
        lock.with(|data| data.push(7));
        // As a forked child would find it: held by a thread of the parent, data of the parent.
        lock.holder.store(process::pid() + 1, Ordering::Relaxed);
        unsafe { *lock.owner.get() = process::pid() + 1 };
        assert!(lock.with(|data| data.is_empty()));
    }
}
