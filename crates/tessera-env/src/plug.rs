//! Work a task defers to the end of its current poll: a plug, as the
//! block layer's, on the thread that polls a connection's requests.
//!
//! Owns: the plug of the current thread, and the work deferred to it. A
//! connection's task starts the requests it has read one after another in
//! one poll (`InFlight`, the NBD server's first polls). A lone write that
//! commits at once is written alone, and the writes the same poll starts
//! next queue behind it. Yielding to the runtime first (`yield_now`) lets
//! them join its group commit, but costs a trip through the scheduler at
//! every lone write: a poll of the reactor, and a sibling worker thread
//! woken to find nothing to do. With the task's poll plugged, the commit
//! is deferred to the end of that poll instead: every request the poll
//! starts is staged by then, and nothing leaves the thread.
//!
//! Must not touch: what the deferred work does.
//!
//! Invariants:
//! - Work deferred to a plug runs exactly once, on the thread that
//!   deferred it, when the outermost plug open on that thread closes (its
//!   guard dropped), in the order it was deferred. While it runs no plug
//!   is open: work it defers is given back, unless it opens a plug of its
//!   own.
//! - A plug lives within one synchronous stretch of one task's poll: its
//!   guard is never held across an `.await` that can suspend, so no other
//!   task's work lands in it and none of its work waits for another task.

use std::cell::RefCell;

/// Work deferred to the plug of this thread.
type Deferred = Box<dyn FnOnce()>;

#[derive(Default)]
struct ThreadPlug {
    /// Plugs open on this thread; only the outermost runs the work.
    depth: usize,
    work: Vec<Deferred>,
}

thread_local! {
    static PLUG: RefCell<ThreadPlug> = RefCell::new(ThreadPlug::default());
}

/// An open plug; the work deferred to it runs when the outermost one is
/// dropped. Never hold it across an `.await` that can suspend.
#[must_use = "the plug closes, and its work runs, when this is dropped"]
pub struct Plug(());

impl Plug {
    /// Opens a plug on this thread (inside one already open, it joins it).
    pub fn open() -> Plug {
        PLUG.with(|p| p.borrow_mut().depth += 1);
        Plug(())
    }
}

impl Drop for Plug {
    fn drop(&mut self) {
        let outermost = PLUG.with(|p| {
            let mut p = p.borrow_mut();
            p.depth -= 1;
            p.depth == 0
        });
        if !outermost {
            return;
        }
        // The work runs with no borrow held, so it may open a plug of its
        // own.
        let work = PLUG.with(|p| std::mem::take(&mut p.borrow_mut().work));
        for w in work {
            w();
        }
    }
}

/// Whether a plug is open on this thread: work deferred now runs when it
/// closes, before the poll of the task that opened it returns.
pub fn is_open() -> bool {
    PLUG.with(|p| p.borrow().depth > 0)
}

/// Defers `work` to the plug open on this thread; gives it back, not run,
/// when none is open.
pub fn defer<F: FnOnce() + 'static>(work: F) -> Result<(), F> {
    PLUG.with(|p| {
        let mut p = p.borrow_mut();
        if p.depth == 0 {
            return Err(work);
        }
        p.work.push(Box::new(work));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn without_a_plug_work_is_given_back() {
        assert!(!is_open());
        let ran = Rc::new(RefCell::new(0));
        let r = Rc::clone(&ran);
        let back = defer(move || *r.borrow_mut() += 1);
        let Err(work) = back else {
            panic!("deferred with no plug open");
        };
        assert_eq!(*ran.borrow(), 0, "given back, not run");
        work();
        assert_eq!(*ran.borrow(), 1);
    }

    #[test]
    fn work_runs_once_in_order_when_the_outermost_plug_closes() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let outer = Plug::open();
        let l = Rc::clone(&log);
        assert!(defer(move || l.borrow_mut().push(1)).is_ok());
        {
            let _inner = Plug::open();
            let l = Rc::clone(&log);
            assert!(defer(move || l.borrow_mut().push(2)).is_ok());
        }
        assert!(log.borrow().is_empty(), "an inner plug runs nothing");
        assert!(is_open());
        drop(outer);
        assert_eq!(*log.borrow(), vec![1, 2]);
        assert!(!is_open());
        // Closed: nothing left to run twice.
        drop(Plug::open());
        assert_eq!(*log.borrow(), vec![1, 2]);
    }

    #[test]
    fn deferred_work_runs_with_no_plug_open_unless_it_opens_one() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let plug = Plug::open();
        let l = Rc::clone(&log);
        assert!(defer(move || {
            l.borrow_mut().push("first");
            assert!(!is_open());
            assert!(defer(|| {}).is_err(), "no plug is open while work runs");
            // A plug opened here is outermost and runs its own work when it
            // closes.
            let l2 = Rc::clone(&l);
            let nested = Plug::open();
            assert!(defer(move || l2.borrow_mut().push("nested")).is_ok());
            drop(nested);
            l.borrow_mut().push("after nested");
        })
        .is_ok());
        drop(plug);
        assert_eq!(*log.borrow(), vec!["first", "nested", "after nested"]);
    }

    #[test]
    fn each_thread_has_its_own_plug() {
        let _plug = Plug::open();
        std::thread::spawn(|| {
            assert!(!is_open());
            assert!(defer(|| {}).is_err());
        })
        .join()
        .expect("thread");
        assert!(is_open());
    }
}
