//! The requests one task serves at once (those of one connection), polled
//! without waking other threads for nothing.
//!
//! Owns: [`InFlight`], a set of futures polled by the task that holds it,
//! yielding each result as it is ready. Must not touch: what the futures
//! do; it only decides when they are polled.
//!
//! Why not `FuturesUnordered` alone: whenever one of its polls has polled
//! every future it holds and all stay pending, it wakes its own task and
//! returns, so that a busy set cannot starve the other tasks of its thread.
//! On tokio's multi-threaded runtime a task that wakes itself while running
//! counts as yielding: it goes to the back of its worker's queue and another
//! worker is woken (an eventfd write, an idle CPU brought up, a context
//! switch) to take it, only to find nothing to do. With one request in
//! flight, as at queue depth 1, every step of every request pays that.
//! [`InFlight`] polls the set again at once instead, a bounded number of
//! times, and only then lets the wake through, so fairness still holds.
//! Each poll is plugged ([`crate::plug`]): what the requests defer to the
//! end of it (a lone write's commit) runs before it returns.
//!
//! Invariants: no wake is lost. A wake that arrives while the set is being
//! polled is recorded and answered by polling again (or, past the bound or
//! after a result, forwarded to the task); any other wake goes straight to
//! the task that last polled.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::stream::{FuturesUnordered, Stream};
use futures::task::AtomicWaker;

/// Times a poll of [`InFlight`] polls its set again, after the set woke
/// itself, before it hands the wake to the task.
const REPOLLS_BEFORE_YIELD: usize = 4;

/// Futures in flight inside one task; a [`Stream`] of their results in
/// the order they finish.
pub struct InFlight<F> {
    set: FuturesUnordered<F>,
    relay: Arc<Relay>,
    waker: Waker,
}

/// The waker the set sees: wakes the task, except while the task is
/// polling the set, when it only notes that the set wants another poll.
#[derive(Default)]
struct Relay {
    task: AtomicWaker,
    polling: AtomicBool,
    woken: AtomicBool,
}

impl Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Noted before `polling` is read: a poller that clears `polling`
        // and then finds `woken` unset has been seen here as not polling,
        // and this wake went to the task.
        self.woken.store(true, SeqCst);
        if !self.polling.load(SeqCst) {
            self.task.wake();
        }
    }
}

impl<F> Default for InFlight<F> {
    fn default() -> Self {
        InFlight::new()
    }
}

impl<F> InFlight<F> {
    /// An empty set.
    pub fn new() -> InFlight<F> {
        let relay = Arc::new(Relay::default());
        let waker = Waker::from(Arc::clone(&relay));
        InFlight {
            set: FuturesUnordered::new(),
            relay,
            waker,
        }
    }

    /// Futures in the set.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether the set holds no future.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Adds a future; it is first polled by the next poll of the set.
    pub fn push(&mut self, future: F) {
        self.set.push(future);
    }
}

/// How a poll of the set ended.
enum Polled {
    /// The caller took a result and asked for no more.
    Stopped,
    /// The set holds no future.
    Empty,
    /// Nothing (more) is ready; the task is woken when something is.
    Pending,
}

impl<F: Future> InFlight<F> {
    /// Hands every result already finished to `each`, in the order they
    /// finished, without waiting for the others; returns how many. The
    /// futures left wake the task when they progress, as after a poll that
    /// found nothing ready. So the requests that finish together (a group
    /// commit's writes, a peer's answers read at once) are answered
    /// together.
    fn drain_finished(&mut self, cx: &mut Context<'_>, mut each: impl FnMut(F::Output)) -> usize {
        let mut taken = 0;
        self.poll_set(cx, |item| {
            each(item);
            taken += 1;
            true
        });
        taken
    }

    /// The results already finished, in the order they finished, taken
    /// without waiting for the others (see [`InFlight::drain_finished`]):
    /// a connection answers them with one write to its socket.
    pub async fn take_finished(&mut self) -> Vec<F::Output> {
        let mut finished = Vec::new();
        std::future::poll_fn(|cx| {
            self.drain_finished(cx, |done| finished.push(done));
            Poll::Ready(())
        })
        .await;
        finished
    }

    /// Polls the set, handing each result to `take` until it says stop
    /// (false) or nothing is ready. At most as many results as the set
    /// held: none is added meanwhile.
    fn poll_set(
        &mut self,
        cx: &mut Context<'_>,
        mut take: impl FnMut(F::Output) -> bool,
    ) -> Polled {
        // Work the requests defer (a lone write's commit) runs when this
        // poll ends, once every request it polls has been staged.
        let _plug = crate::Plug::open();
        let relay = &self.relay;
        relay.task.register(cx.waker());
        let mut inner = Context::from_waker(&self.waker);
        let mut repolls = 0;
        loop {
            relay.polling.store(true, SeqCst);
            // Wakes from before this point are in the set's queue already:
            // the poll below sees them.
            relay.woken.store(false, SeqCst);
            let polled = Pin::new(&mut self.set).poll_next(&mut inner);
            relay.polling.store(false, SeqCst);
            let woken = relay.woken.swap(false, SeqCst);
            let ended = match polled {
                Poll::Ready(Some(item)) => {
                    if take(item) {
                        // Polled again at once: a wake noted meanwhile is
                        // seen then.
                        continue;
                    }
                    Polled::Stopped
                }
                Poll::Ready(None) => Polled::Empty,
                Poll::Pending if !woken => return Polled::Pending,
                Poll::Pending if repolls == REPOLLS_BEFORE_YIELD => {
                    relay.task.wake();
                    return Polled::Pending;
                }
                Poll::Pending => {
                    repolls += 1;
                    continue;
                }
            };
            if woken {
                // The caller may poll again for the next result, but need
                // not: the wake must not be lost.
                relay.task.wake();
            }
            return ended;
        }
    }
}

impl<F: Future> Stream for InFlight<F> {
    type Item = F::Output;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        let this = self.get_mut();
        let mut taken = None;
        match this.poll_set(cx, |item| {
            taken = Some(item);
            false
        }) {
            Polled::Stopped => Poll::Ready(taken),
            Polled::Empty => Poll::Ready(None),
            Polled::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wakes of the task polling the set.
    #[derive(Default)]
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    #[test]
    fn a_set_whose_futures_all_wait_does_not_wake_its_task() {
        let counter = Arc::new(CountingWaker::default());
        let waker = Waker::from(Arc::clone(&counter));
        let mut cx = Context::from_waker(&waker);
        let (tx, rx) = futures::channel::oneshot::channel::<u32>();
        let mut set = InFlight::new();
        set.push(rx);
        assert!(Pin::new(&mut set).poll_next(&mut cx).is_pending());
        // `FuturesUnordered` alone would have woken the task here.
        assert_eq!(counter.0.load(SeqCst), 0);
        tx.send(7).unwrap();
        assert_eq!(counter.0.load(SeqCst), 1, "the answer wakes the task");
        match Pin::new(&mut set).poll_next(&mut cx) {
            Poll::Ready(Some(Ok(7))) => {}
            other => panic!("expected the answer, got {other:?}"),
        }
        assert!(set.is_empty());
    }

    #[test]
    fn results_finished_together_are_taken_together_without_a_wake() {
        let counter = Arc::new(CountingWaker::default());
        let waker = Waker::from(Arc::clone(&counter));
        let mut cx = Context::from_waker(&waker);
        let mut set = InFlight::new();
        let mut answers = Vec::new();
        for _ in 0..4 {
            let (tx, rx) = futures::channel::oneshot::channel::<u32>();
            answers.push(Some(tx));
            set.push(rx);
        }
        assert!(Pin::new(&mut set).poll_next(&mut cx).is_pending());
        // Three of four finish before the task looks again.
        for (i, tx) in answers.iter_mut().enumerate().take(3) {
            tx.take().unwrap().send(i as u32).unwrap();
        }
        let woken = counter.0.load(SeqCst);
        let mut taken = Vec::new();
        assert_eq!(set.drain_finished(&mut cx, |r| taken.push(r.unwrap())), 3);
        taken.sort();
        assert_eq!(taken, vec![0, 1, 2], "every finished result, in one call");
        assert_eq!(counter.0.load(SeqCst), woken, "no wake of its own task");
        assert_eq!(set.len(), 1);
        // Nothing ready: nothing taken, and the last answer still wakes it.
        assert_eq!(
            set.drain_finished(&mut cx, |_| panic!("nothing is ready")),
            0
        );
        answers[3].take().unwrap().send(3).unwrap();
        assert_eq!(
            counter.0.load(SeqCst),
            woken + 1,
            "the answer wakes the task"
        );
        let mut last = Vec::new();
        assert_eq!(set.drain_finished(&mut cx, |r| last.push(r.unwrap())), 1);
        assert_eq!(last, vec![3]);
        assert!(set.is_empty());
    }

    #[test]
    fn a_future_that_keeps_waking_itself_lets_the_task_yield() {
        // Always pending, always waking itself: the set must not spin on it
        // forever, and must not lose its wakes either.
        struct Restless(usize);
        impl Future for Restless {
            type Output = ();
            fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                self.0 += 1;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
        let counter = Arc::new(CountingWaker::default());
        let waker = Waker::from(Arc::clone(&counter));
        let mut cx = Context::from_waker(&waker);
        let mut set = InFlight::new();
        set.push(Restless(0));
        assert!(Pin::new(&mut set).poll_next(&mut cx).is_pending());
        assert_eq!(
            counter.0.load(SeqCst),
            1,
            "the task was woken to poll again"
        );
    }

    #[test]
    fn results_come_in_the_order_the_futures_finish_across_threads() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut set = InFlight::new();
            let mut answers = Vec::new();
            for i in 0..3usize {
                let (tx, rx) = futures::channel::oneshot::channel::<()>();
                answers.push(tx);
                set.push(async move {
                    rx.await.unwrap();
                    i
                });
            }
            // All three polled and waiting: the order the set yields them in
            // is the order they finish, not the order they were added.
            assert!(futures::poll!(set.next()).is_pending());
            // Finished in the order 1, 2, 0, from another thread, whether
            // the set is being polled meanwhile or not.
            let mut answers: Vec<_> = answers.into_iter().map(Some).collect();
            let answerer = std::thread::spawn(move || {
                for i in [1, 2, 0] {
                    answers[i].take().unwrap().send(()).unwrap();
                }
            });
            let mut order = Vec::new();
            while let Some(i) = set.next().await {
                order.push(i);
            }
            answerer.join().unwrap();
            assert_eq!(order, vec![1, 2, 0]);
        });
    }

    #[test]
    fn answers_from_other_threads_are_never_lost() {
        // Many requests answered from another thread while the set is being
        // polled: every answer arrives (a lost wake would hang the test).
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        runtime.block_on(async {
            let (jobs, queue) =
                std::sync::mpsc::channel::<futures::channel::oneshot::Sender<u32>>();
            let answerer = std::thread::spawn(move || {
                for (n, tx) in queue.into_iter().enumerate() {
                    let _ = tx.send(n as u32);
                }
            });
            let mut set = InFlight::new();
            let mut answered = 0;
            for _ in 0..20_000 {
                let (tx, rx) = futures::channel::oneshot::channel();
                jobs.send(tx).unwrap();
                set.push(rx);
                if set.len() >= 8 {
                    set.next().await.unwrap().unwrap();
                    answered += 1;
                }
            }
            drop(jobs);
            while let Some(answer) = set.next().await {
                answer.unwrap();
                answered += 1;
            }
            assert_eq!(answered, 20_000);
            answerer.join().unwrap();
        });
    }
}
