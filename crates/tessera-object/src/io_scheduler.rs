//! The host's I/O scheduler: one queue, in front of the volumes this host
//! coordinates, that decides whose operation starts next.
//!
//! Owns: admission of guest operations (each volume a client, with the QoS
//! of its policy: an IOPS and bandwidth limit and an IOPS minimum), of
//! resync and rebuild steps (one background client whose weight the
//! cluster's resync delay multiplier divides) and of the scrubber's chunks
//! (a client with a tenth of a volume's weight), by the mClock rules of
//! [`mclock`]; the timer that wakes operations held back by a limit; the
//! pause between resync steps while guests are busy (the multiplier
//! again), since one resync stream rarely fills the queue by itself, and
//! how many steps one resync runs at once (two, or one while paused).
//! Must not touch: the operations themselves (a caller holds an
//! [`IoPermit`] while its operation runs) or where QoS comes from (the node
//! sets it from the directory).
//!
//! At most [`IoScheduler::depth`] admitted operations run at once; beyond
//! that they wait, and the order in which waiting ones start is where
//! reservations and weights act. Limits act whether or not the host is
//! busy. The scheduler sees the work this host's coordinators start; a
//! replica host's disks also serve the coordinators of other hosts, which
//! schedule their own.
//!
//! Invariants: every admitted operation releases its slot exactly once
//! (when its permit drops, or when its caller gives up while waiting);
//! an operation never waits for a slot while holding another (callers
//! admit before taking range locks and never nest admissions).

pub mod mclock;

use mclock::{ClientSpec, MClock, DEFAULT_WEIGHT};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tessera_env::{Clock, SystemClock};
use tessera_types::policy::VolumeQos;
use tessera_types::VolumeId;
use tokio::sync::oneshot;

/// Operations a host lets run at once by default: more than one client's
/// queue depth (so one busy volume alone is never held back), few enough
/// that when many are busy the order is the scheduler's, not the disks'.
pub const DEFAULT_DEPTH: usize = 64;
/// Highest resync delay multiplier (vSAN's `DOMResyncDelayMultiplier`
/// range).
pub const RESYNC_MULTIPLIER_MAX: u32 = 256;

/// Whose operation it is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IoClient {
    /// A volume's guest I/O.
    Volume(VolumeId),
    /// Resync and rebuild steps of the volumes this host coordinates.
    Resync,
    /// Chunks the host's scrubber checks.
    Scrub,
}

/// The scrubber's share of a busy host: a tenth of one volume's (its passes
/// are paced by their own rate besides).
pub const SCRUB_WEIGHT: u32 = DEFAULT_WEIGHT / 10;

#[derive(Default)]
struct Inner {
    mclock: Option<MClock<IoClient>>,
    /// Callers waiting for their turn, by ticket.
    waiting: HashMap<u64, oneshot::Sender<()>>,
    /// When the armed timer fires, if one is.
    timer_at_ns: Option<u64>,
}

/// Resync steps one resync runs at once while nothing spaces them.
pub const RESYNC_STEPS_AT_ONCE: usize = 2;

/// How recently a guest operation must have started for the host to count
/// as busy, when resync steps are spaced out.
pub const GUEST_BUSY_WINDOW: Duration = Duration::from_secs(1);

/// The scheduler of one host.
pub struct IoScheduler {
    clock: Arc<dyn Clock>,
    inner: Mutex<Inner>,
    myself: Weak<IoScheduler>,
    /// The resync delay multiplier (1: no spacing).
    multiplier: AtomicU32,
    /// When a guest operation was last admitted, in the clock's
    /// nanoseconds (0: never).
    last_guest_ns: AtomicU64,
}

/// A turn to run one operation; the slot frees when it drops.
#[must_use = "the operation's turn ends when the permit drops"]
pub struct IoPermit {
    scheduler: Arc<IoScheduler>,
}

impl Drop for IoPermit {
    fn drop(&mut self) {
        let mut inner = self.scheduler.inner.lock();
        let Some(m) = inner.mclock.as_mut() else {
            return;
        };
        m.finish();
        if m.waiting() > 0 {
            self.scheduler.start_due(&mut inner, None);
        }
    }
}

/// Takes a waiting caller's ticket back if it gives up before its turn.
struct Waiter {
    scheduler: Arc<IoScheduler>,
    ticket: u64,
    turn: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.turn.is_none() {
            return;
        }
        let mut inner = self.scheduler.inner.lock();
        let Some(m) = inner.mclock.as_mut() else {
            return;
        };
        if m.cancel(self.ticket) {
            inner.waiting.remove(&self.ticket);
        } else {
            // Its turn came as it gave up: hand the slot on.
            m.finish();
            self.scheduler.start_due(&mut inner, None);
        }
    }
}

impl IoScheduler {
    /// A scheduler letting `depth` operations run at once, on the
    /// machine's clock.
    pub fn new(depth: usize) -> Arc<IoScheduler> {
        Self::with_clock(depth, Arc::new(SystemClock::default()))
    }

    /// A scheduler on `clock`.
    pub fn with_clock(depth: usize, clock: Arc<dyn Clock>) -> Arc<IoScheduler> {
        let mut mclock = MClock::new(depth);
        mclock.set_spec(
            IoClient::Scrub,
            ClientSpec {
                weight: SCRUB_WEIGHT,
                ..ClientSpec::default()
            },
        );
        Arc::new_cyclic(|myself| IoScheduler {
            clock,
            inner: Mutex::new(Inner {
                mclock: Some(mclock),
                ..Inner::default()
            }),
            myself: myself.clone(),
            multiplier: AtomicU32::new(1),
            last_guest_ns: AtomicU64::new(0),
        })
    }

    /// A scheduler that admits everything at once (for a coordinator with
    /// no host around it).
    pub fn unlimited() -> Arc<IoScheduler> {
        Arc::new_cyclic(|myself| IoScheduler {
            clock: Arc::new(SystemClock::default()),
            inner: Mutex::new(Inner::default()),
            myself: myself.clone(),
            multiplier: AtomicU32::new(1),
            last_guest_ns: AtomicU64::new(0),
        })
    }

    /// Operations that may run at once (0: no scheduling).
    pub fn depth(&self) -> usize {
        self.inner.lock().mclock.as_ref().map_or(0, |m| m.depth())
    }

    /// Sets `volume`'s quality of service.
    pub fn set_volume_qos(&self, volume: &VolumeId, qos: &VolumeQos) {
        let spec = ClientSpec {
            reservation_ops: qos.iops_minimum,
            weight: DEFAULT_WEIGHT,
            limit_ops: qos.iops_limit,
            limit_bytes: u64::from(qos.bandwidth_limit_mib_s) << 20,
        };
        self.set_spec(IoClient::Volume(volume.clone()), spec);
    }

    /// Forgets a volume this host no longer coordinates.
    pub fn forget_volume(&self, volume: &VolumeId) {
        if let Some(m) = self.inner.lock().mclock.as_mut() {
            m.forget(&IoClient::Volume(volume.clone()));
        }
    }

    /// Sets the resync delay multiplier (1 to [`RESYNC_MULTIPLIER_MAX`]):
    /// resync and rebuild get 1/multiplier of one volume's share of a busy
    /// host (at 1, as much as one volume), and while guests use the host
    /// each resync step is followed by a pause of multiplier - 1 times the
    /// step's duration ([`IoScheduler::resync_pause`]). An idle host gives
    /// them all it has, whatever the multiplier.
    pub fn set_resync_multiplier(&self, multiplier: u32) {
        let multiplier = multiplier.clamp(1, RESYNC_MULTIPLIER_MAX);
        self.multiplier.store(multiplier, Ordering::Relaxed);
        let spec = ClientSpec {
            weight: (DEFAULT_WEIGHT / multiplier).max(1),
            ..ClientSpec::default()
        };
        self.set_spec(IoClient::Resync, spec);
    }

    fn set_spec(&self, client: IoClient, spec: ClientSpec) {
        if let Some(m) = self.inner.lock().mclock.as_mut() {
            m.set_spec(client, spec);
        }
    }

    fn now_ns(&self) -> u64 {
        self.clock.monotonic().as_nanos() as u64
    }

    /// The pause after a resync step that took `step`: multiplier - 1
    /// times the step while a guest operation started within
    /// [`GUEST_BUSY_WINDOW`], none on a host no guest uses (vSAN's
    /// `DOMResyncDelayMultiplier`: the delay between resync operations).
    pub fn resync_pause(&self, step: Duration) -> Duration {
        if !self.resync_spaced() {
            return Duration::ZERO;
        }
        step.saturating_mul(self.multiplier.load(Ordering::Relaxed) - 1)
    }

    /// Resync steps one resync may run at once: [`RESYNC_STEPS_AT_ONCE`]
    /// while nothing spaces them (multiplier 1, or no guest busy), so that
    /// one step's read of its source overlaps another's durable write on
    /// the target instead of each waiting for the other's round trips; one
    /// while the multiplier spaces them, so a pause follows each step.
    pub fn resync_steps_at_once(&self) -> usize {
        if self.resync_spaced() {
            1
        } else {
            RESYNC_STEPS_AT_ONCE
        }
    }

    /// The multiplier spaces resync steps now: above 1, and a guest
    /// operation started within [`GUEST_BUSY_WINDOW`].
    fn resync_spaced(&self) -> bool {
        let last = self.last_guest_ns.load(Ordering::Relaxed);
        self.multiplier.load(Ordering::Relaxed) > 1
            && last != 0
            && self.now_ns().saturating_sub(last) < GUEST_BUSY_WINDOW.as_nanos() as u64
    }

    /// The host's clock, for callers that time their steps.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Waits for `client`'s turn to run an operation moving `bytes`.
    /// The client is cloned, and a channel made, only when the operation
    /// has to queue: the common case allocates nothing.
    pub async fn admit(&self, client: &IoClient, bytes: u64) -> IoPermit {
        let scheduler = self.myself.upgrade().expect("a scheduler in use is alive");
        if matches!(client, IoClient::Volume(_)) {
            self.last_guest_ns
                .store(self.now_ns().max(1), Ordering::Relaxed);
        }
        let (ticket, rx) = {
            let mut inner = self.inner.lock();
            let now = self.now_ns();
            let Some(m) = inner.mclock.as_mut() else {
                return IoPermit { scheduler };
            };
            // The common case on a host that is not saturated: no queue,
            // no limit, nothing to decide.
            if m.try_start_now(client) {
                return IoPermit { scheduler };
            }
            let ticket = m.enqueue(client.clone(), bytes, now);
            let (tx, rx) = oneshot::channel();
            inner.waiting.insert(ticket, tx);
            if self.start_due(&mut inner, Some(ticket)) {
                return IoPermit { scheduler };
            }
            (ticket, rx)
        };
        let mut waiter = Waiter {
            scheduler: Arc::clone(&scheduler),
            ticket,
            turn: Some(rx),
        };
        if let Some(turn) = waiter.turn.as_mut() {
            // The sender only goes away with its ticket started or
            // cancelled, and only this waiter cancels it.
            let _ = turn.await;
        }
        waiter.turn = None;
        IoPermit { scheduler }
    }

    /// Starts what is due now, waking each caller whose turn it is; true
    /// if `mine` (the caller's own ticket) started. Arms the timer for
    /// the next tag that falls due.
    fn start_due(&self, inner: &mut Inner, mine: Option<u64>) -> bool {
        let now = self.now_ns();
        let Some(m) = inner.mclock.as_mut() else {
            return false;
        };
        let due = m.dispatch(now);
        let mut started_mine = false;
        for ticket in due.start {
            let Some(tx) = inner.waiting.remove(&ticket) else {
                continue;
            };
            if Some(ticket) == mine {
                started_mine = true;
            } else {
                // A waiter that is gone gives its slot back from its drop.
                let _ = tx.send(());
            }
        }
        if let Some(at) = due.wake_at_ns {
            if inner
                .timer_at_ns
                .is_none_or(|armed| at < armed || armed <= now)
            {
                inner.timer_at_ns = Some(at);
                self.arm_timer(at - now);
            }
        }
        started_mine
    }

    fn arm_timer(&self, after_ns: u64) {
        let weak = self.myself.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_nanos(after_ns)).await;
            let Some(scheduler) = weak.upgrade() else {
                return;
            };
            let mut inner = scheduler.inner.lock();
            if inner.timer_at_ns.is_some_and(|at| at <= scheduler.now_ns()) {
                inner.timer_at_ns = None;
            }
            scheduler.start_due(&mut inner, None);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    fn volume(name: &str) -> VolumeId {
        VolumeId::new(name).unwrap()
    }

    #[tokio::test]
    async fn a_limit_spaces_operations_and_a_permit_frees_its_slot() {
        let s = IoScheduler::new(2);
        s.set_volume_qos(
            &volume("slow"),
            &VolumeQos {
                iops_limit: 200,
                ..VolumeQos::default()
            },
        );
        let began = Instant::now();
        for _ in 0..41 {
            drop(s.admit(&IoClient::Volume(volume("slow")), 4096).await);
        }
        // 40 intervals of 5 ms; a timer may fire late, never early.
        assert!(
            began.elapsed() >= Duration::from_millis(195),
            "{:?}",
            began.elapsed()
        );
        assert_eq!(s.inner.lock().mclock.as_ref().unwrap().running(), 0);
    }

    #[tokio::test]
    async fn resync_steps_are_spaced_by_the_multiplier_only_while_guests_are_busy() {
        let s = IoScheduler::new(4);
        let step = Duration::from_millis(10);
        assert_eq!(s.resync_pause(step), Duration::ZERO, "no guest yet");
        assert_eq!(s.resync_steps_at_once(), RESYNC_STEPS_AT_ONCE);
        s.set_resync_multiplier(6);
        assert_eq!(s.resync_pause(step), Duration::ZERO, "an idle host");
        assert_eq!(s.resync_steps_at_once(), RESYNC_STEPS_AT_ONCE);
        drop(s.admit(&IoClient::Volume(volume("a")), 4096).await);
        assert_eq!(s.resync_pause(step), Duration::from_millis(50));
        assert_eq!(
            s.resync_steps_at_once(),
            1,
            "each step followed by its pause"
        );
        s.set_resync_multiplier(1);
        assert_eq!(s.resync_pause(step), Duration::ZERO);
        assert_eq!(s.resync_steps_at_once(), RESYNC_STEPS_AT_ONCE);
    }

    #[tokio::test]
    async fn callers_beyond_the_depth_wait_and_one_that_gives_up_frees_nothing_twice() {
        let s = IoScheduler::new(1);
        let held = s.admit(&IoClient::Resync, 1 << 20).await;
        let gave_up = tokio::time::timeout(
            Duration::from_millis(20),
            s.admit(&IoClient::Volume(volume("a")), 4096),
        )
        .await;
        assert!(gave_up.is_err(), "the only slot was taken");
        let ran = Arc::new(AtomicUsize::new(0));
        let waiting = {
            let (s, ran) = (Arc::clone(&s), Arc::clone(&ran));
            tokio::spawn(async move {
                let _p = s.admit(&IoClient::Volume(volume("b")), 4096).await;
                ran.fetch_add(1, Ordering::SeqCst);
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        drop(held);
        waiting.await.unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        let inner = s.inner.lock();
        let m = inner.mclock.as_ref().unwrap();
        assert_eq!((m.running(), m.waiting()), (0, 0));
    }
}
