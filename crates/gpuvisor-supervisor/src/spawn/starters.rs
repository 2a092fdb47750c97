//! The threads that start replicas several at a time ([`super::Spawner::spawn_all`]), kept
//! for the spawner's life. A child's parent-death signal is tied to the thread that started it:
//! threads that ended after each batch would send every keeper they started a SIGTERM (which
//! the keeper ignores while its parent process lives, but a signal all the same).

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

/// One start to run on a starter thread.
pub type Job = Box<dyn FnOnce() + Send>;

/// The starter threads; they end once this is dropped and their queue is empty.
#[derive(Debug)]
pub struct Starters {
    jobs: Mutex<Sender<Job>>,
}

impl Starters {
    /// `count` threads waiting for jobs (fewer when the system refuses more threads).
    pub fn new(count: usize) -> Starters {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..count {
            let queue = Arc::clone(&queue);
            let _ = std::thread::Builder::new()
                .name("gpuvisor-start".into())
                .spawn(move || serve(&queue));
        }
        Starters {
            jobs: Mutex::new(jobs),
        }
    }

    /// Queues `job`; it comes back when no starter thread is left to run it.
    pub fn run(&self, job: Job) -> Result<(), Job> {
        let jobs = self
            .jobs
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        jobs.send(job).map_err(|refused| refused.0)
    }
}

fn serve(queue: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let queue = queue.lock().unwrap_or_else(|poison| poison.into_inner());
            queue.recv()
        };
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}
