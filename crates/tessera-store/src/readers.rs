//! The store's reader threads: a fixed set of threads that run client reads
//! of the capacity devices.
//!
//! Owns: the queue of reads waiting for a thread. Must not touch: the state
//! (reads are planned under the state lock before they get here; a job only
//! reads devices and checks CRCs). A thread that finishes a read takes the
//! next queued one without going to sleep, and the number of threads bounds
//! the queue depth client reads put on the devices (the runtime's blocking
//! pool would grow a thread per concurrent read instead).
//!
//! Invariant: every job submitted before `stop` runs; `stop` returns once the
//! threads have exited.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Threads reading for clients: the deepest device queue client reads reach.
pub(crate) const READER_THREADS: usize = 32;

type Job = Box<dyn FnOnce() + Send + 'static>;

struct Queue {
    jobs: VecDeque<Job>,
    stopping: bool,
}

/// A fixed pool of reader threads.
pub(crate) struct ReaderPool {
    queue: Arc<(Mutex<Queue>, Condvar)>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl ReaderPool {
    /// Starts `threads` reader threads.
    pub(crate) fn start(threads: usize) -> std::io::Result<ReaderPool> {
        let pool = ReaderPool {
            queue: Arc::new((
                Mutex::new(Queue {
                    jobs: VecDeque::new(),
                    stopping: false,
                }),
                Condvar::new(),
            )),
            threads: Mutex::new(Vec::new()),
        };
        for _ in 0..threads.max(1) {
            let q = pool.queue.clone();
            let started = std::thread::Builder::new()
                .name("store-read".into())
                .spawn(move || run_reader(&q));
            match started {
                Ok(handle) => pool.threads.lock().push(handle),
                Err(e) => {
                    pool.stop();
                    return Err(e);
                }
            }
        }
        Ok(pool)
    }

    /// Queues a read; a sleeping thread is woken only if none is free.
    pub(crate) fn submit(&self, job: Job) {
        let (lock, work) = &*self.queue;
        lock.lock().jobs.push_back(job);
        work.notify_one();
    }

    /// Runs the queued jobs, then stops and joins the threads.
    pub(crate) fn stop(&self) {
        let (lock, work) = &*self.queue;
        lock.lock().stopping = true;
        work.notify_all();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

fn run_reader(queue: &(Mutex<Queue>, Condvar)) {
    let (lock, work) = queue;
    loop {
        let job = {
            let mut q = lock.lock();
            loop {
                if let Some(job) = q.jobs.pop_front() {
                    break job;
                }
                if q.stopping {
                    return;
                }
                work.wait(&mut q);
            }
        };
        job();
    }
}
