//! The store's device threads: fixed sets of threads that run blocking
//! device I/O, one set for client reads of the capacity devices and one for
//! the destager's and the checkpoint's capacity writes.
//!
//! Owns: the queue of jobs waiting for a thread. Must not touch: the state
//! (I/O is planned under the state lock before it gets here; a job only
//! reads or writes devices and checks CRCs). A thread that finishes a job
//! takes the next queued one without going to sleep, and the number of
//! threads bounds the queue depth the set puts on the devices (the runtime's
//! blocking pool would grow a thread per concurrent read instead, and
//! spawning threads for each destage pass cost a thread creation every few
//! client writes).
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

/// Threads writing capacity blocks for the destager and the checkpoint,
/// besides the worker thread that asks (see `engine::write_parallel`).
pub(crate) const WRITER_THREADS: usize = 7;

/// Whom a set of device threads works for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// Clients waiting for the answer.
    Serving,
    /// The destager and the checkpoint: at a lower CPU priority
    /// ([`tessera_env::background`]).
    Background,
}

/// A fixed set of device threads.
pub(crate) struct DeviceThreads {
    queue: Arc<(Mutex<Queue>, Condvar)>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl DeviceThreads {
    /// Starts `threads` threads called `name`, doing `work`.
    pub(crate) fn start(name: &str, threads: usize, work: Work) -> std::io::Result<DeviceThreads> {
        let pool = DeviceThreads {
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
                .name(name.into())
                .spawn(move || {
                    if work == Work::Background {
                        tessera_env::background::run_this_thread_as_background();
                    }
                    run_jobs(&q)
                });
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

    /// Queues a job; a sleeping thread is woken only if none is free.
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

fn run_jobs(queue: &(Mutex<Queue>, Condvar)) {
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
