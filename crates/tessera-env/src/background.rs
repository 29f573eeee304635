//! The CPU priority of threads that do background work: destaging,
//! checkpoint writes, deep rekeys. They yield the CPU to the threads that
//! serve guests.
//!
//! Owns: the nice value such a thread takes. Must not touch: what the
//! thread does, or any other thread's priority.
//!
//! Why: on a host with few cores a guest's request crosses several
//! threads, each woken in turn (the connection's, the second copy's, the
//! device's completion), and each wake-up that lands on a core busy with
//! a destage pass waited for that pass's time slice: `perf sched` of
//! `tessera up` under 4 KiB writes at QD 1 put the destager's and the
//! capacity writers' threads among what delayed them. At a lower priority
//! the scheduler lets a woken serving thread run first. Background work
//! still gets the CPU the serving threads leave, and a write log that
//! fills waits for it: the serving threads then wait too, and yield.
//!
//! Invariant: only the calling thread's priority changes, only downwards
//! (an unprivileged process may lower its priority, not raise it back),
//! and once per thread however often it asks; a refusal leaves it as it
//! was, which changes nothing else.

use std::cell::Cell;

thread_local! {
    /// Whether this thread already runs as background work.
    static LOWERED: Cell<bool> = const { Cell::new(false) };
}

/// How much lower than the process a background thread runs: nice 10,
/// about a tenth of the CPU a serving thread at nice 0 gets when both want
/// it.
pub const BACKGROUND_NICE_OFFSET: i32 = 10;

/// The highest nice value Linux allows.
const NICE_MAX: i32 = 19;

/// Lowers the calling thread's CPU priority to that of background work
/// (its nice value raised by [`BACKGROUND_NICE_OFFSET`], at most 19). Best
/// effort: where the system refuses, the thread runs on at the priority it
/// had.
pub fn run_this_thread_as_background() {
    if LOWERED.with(|l| l.replace(true)) {
        return;
    }
    let tid = rustix::thread::gettid();
    let Ok(nice) = rustix::process::getpriority_process(Some(tid)) else {
        return;
    };
    let lowered = (nice + BACKGROUND_NICE_OFFSET).min(NICE_MAX);
    if lowered > nice {
        let _ = rustix::process::setpriority_process(Some(tid), lowered);
    }
}

/// The calling thread's nice value, where the system says it.
pub fn this_thread_nice() -> Option<i32> {
    rustix::process::getpriority_process(Some(rustix::thread::gettid())).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_background_thread_runs_lower_and_leaves_others_as_they_were() {
        let Some(before) = this_thread_nice() else {
            eprintln!("the system does not say a thread's priority: nothing to test");
            return;
        };
        let lowered = std::thread::spawn(|| {
            run_this_thread_as_background();
            this_thread_nice()
        })
        .join()
        .expect("thread");
        assert_eq!(
            lowered,
            Some((before + BACKGROUND_NICE_OFFSET).min(NICE_MAX)),
            "the background thread runs at a lower priority"
        );
        assert_eq!(this_thread_nice(), Some(before), "no other thread changes");
        // Asked twice, it is lowered once.
        let twice = std::thread::spawn(|| {
            run_this_thread_as_background();
            run_this_thread_as_background();
            this_thread_nice()
        })
        .join()
        .expect("thread");
        assert_eq!(twice, lowered);
    }
}
