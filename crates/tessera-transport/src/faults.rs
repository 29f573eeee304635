//! Fault hooks: network faults between named hosts, set through an API.
//!
//! Owns: the table of link faults (delay with jitter, drop probability,
//! blocked links, "fail the next N calls") and the seeded randomness that
//! decides drops and jitter. The kernel on our test machines has no netem, so
//! tests (and later the REST API) shape the network here.
//!
//! Must not touch: sockets. The transport asks this table what to do with
//! each frame and does it.
//!
//! Where each fault applies (so that one table shared by every host of an
//! in-process cluster never applies a fault twice):
//! - delay and drop: by the sending host, to every frame it sends on the
//!   link `from -> to` (requests and responses alike);
//! - blocked links and isolated hosts: by both ends, which is idempotent;
//! - "fail next N": by the calling host, before anything is sent.
//!
//! In a multi-process cluster each host has its own table: set delays and
//! drop probabilities on the sending host; a partition or isolation works
//! when set on either end (the receiving end discards what it gets).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tessera_env::Rng;
use tessera_types::HostId;

/// Faults on one direction of one link.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinkFaults {
    /// Added to every frame sent on the link.
    pub delay: Duration,
    /// A further delay drawn uniformly from `0..=jitter` per frame.
    pub jitter: Duration,
    /// Probability in `0.0..=1.0` that a frame is silently lost.
    pub drop_probability: f64,
    /// Every frame on the link is lost (a partition).
    pub blocked: bool,
    /// The next this many calls on the link fail at once with
    /// [`crate::TransportError::Injected`].
    pub fail_next: u32,
}

impl LinkFaults {
    fn is_clear(&self) -> bool {
        *self == LinkFaults::default()
    }
}

/// What to do with one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameFate {
    /// Send it after this delay (zero: at once).
    Deliver(Duration),
    /// Lose it.
    Drop,
}

#[derive(Default)]
struct Table {
    links: HashMap<(HostId, HostId), LinkFaults>,
    isolated: HashSet<HostId>,
}

impl Table {
    fn is_clear(&self) -> bool {
        self.links.is_empty() && self.isolated.is_empty()
    }
}

struct Shared {
    table: Mutex<Table>,
    /// Mirrors `!table.is_clear()` so that the data path pays one atomic
    /// load, not a lock, while no fault is set.
    active: AtomicBool,
    rng: Arc<dyn Rng>,
}

/// A handle on a fault table. Cloning shares the table: give one handle to
/// every transport of an in-process cluster so that a test sets a fault once.
#[derive(Clone)]
pub struct FaultHooks {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FaultHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultHooks")
            .field("links", &self.links())
            .field("isolated", &self.shared.table.lock().isolated)
            .finish()
    }
}

impl FaultHooks {
    /// An empty table whose drops and jitter come from `rng` (seed it, so a
    /// failing test reproduces).
    pub fn new(rng: Arc<dyn Rng>) -> FaultHooks {
        FaultHooks {
            shared: Arc::new(Shared {
                table: Mutex::new(Table::default()),
                active: AtomicBool::new(false),
                rng,
            }),
        }
    }

    fn edit<T>(&self, change: impl FnOnce(&mut Table) -> T) -> T {
        let mut table = self.shared.table.lock();
        let out = change(&mut table);
        table.links.retain(|_, faults| !faults.is_clear());
        self.shared
            .active
            .store(!table.is_clear(), Ordering::Release);
        out
    }

    fn edit_link(&self, from: &HostId, to: &HostId, change: impl FnOnce(&mut LinkFaults)) {
        self.edit(|table| change(table.links.entry((from.clone(), to.clone())).or_default()));
    }

    /// Replaces every fault on the link `from -> to`.
    pub fn set_link(&self, from: &HostId, to: &HostId, faults: LinkFaults) {
        self.edit_link(from, to, |link| *link = faults);
    }

    /// The faults on the link `from -> to`.
    pub fn link(&self, from: &HostId, to: &HostId) -> LinkFaults {
        self.shared
            .table
            .lock()
            .links
            .get(&(from.clone(), to.clone()))
            .cloned()
            .unwrap_or_default()
    }

    /// Every link with a fault, for display.
    pub fn links(&self) -> Vec<(HostId, HostId, LinkFaults)> {
        let table = self.shared.table.lock();
        let mut out: Vec<_> = table
            .links
            .iter()
            .map(|((from, to), faults)| (from.clone(), to.clone(), faults.clone()))
            .collect();
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out
    }

    /// Delays every frame `from -> to` by `fixed` plus up to `jitter`.
    pub fn set_delay(&self, from: &HostId, to: &HostId, fixed: Duration, jitter: Duration) {
        self.edit_link(from, to, |link| {
            link.delay = fixed;
            link.jitter = jitter;
        });
    }

    /// Loses each frame `from -> to` with `probability` (clamped to 0..=1).
    pub fn set_drop_probability(&self, from: &HostId, to: &HostId, probability: f64) {
        let p = if probability.is_nan() {
            0.0
        } else {
            probability.clamp(0.0, 1.0)
        };
        self.edit_link(from, to, |link| link.drop_probability = p);
    }

    /// Blocks both directions between `a` and `b`.
    pub fn partition(&self, a: &HostId, b: &HostId) {
        self.partition_one_way(a, b);
        self.partition_one_way(b, a);
    }

    /// Blocks frames `from -> to` only: `to` still reaches `from`, but gets
    /// no answers.
    pub fn partition_one_way(&self, from: &HostId, to: &HostId) {
        self.edit_link(from, to, |link| link.blocked = true);
    }

    /// Unblocks both directions between `a` and `b` (other faults stay).
    pub fn heal(&self, a: &HostId, b: &HostId) {
        self.edit_link(a, b, |link| link.blocked = false);
        self.edit_link(b, a, |link| link.blocked = false);
    }

    /// Blocks all traffic to and from `host`.
    pub fn isolate(&self, host: &HostId) {
        self.edit(|table| table.isolated.insert(host.clone()));
    }

    /// Ends [`FaultHooks::isolate`] for `host`.
    pub fn rejoin(&self, host: &HostId) {
        self.edit(|table| table.isolated.remove(host));
    }

    /// Makes the next `count` calls `from -> to` fail at once.
    pub fn fail_next(&self, from: &HostId, to: &HostId, count: u32) {
        self.edit_link(from, to, |link| link.fail_next = count);
    }

    /// Removes every fault.
    pub fn clear(&self) {
        self.edit(|table| *table = Table::default());
    }

    fn active(&self) -> bool {
        self.shared.active.load(Ordering::Acquire)
    }

    /// Whether frames `from -> to` are blocked by a partition or isolation.
    pub fn is_blocked(&self, from: &HostId, to: &HostId) -> bool {
        if !self.active() {
            return false;
        }
        let table = self.shared.table.lock();
        table.isolated.contains(from)
            || table.isolated.contains(to)
            || table
                .links
                .get(&(from.clone(), to.clone()))
                .is_some_and(|l| l.blocked)
    }

    /// Consumes one injected failure of the link `from -> to`, if any is left.
    pub(crate) fn take_injected_failure(&self, from: &HostId, to: &HostId) -> bool {
        if !self.active() {
            return false;
        }
        self.edit(
            |table| match table.links.get_mut(&(from.clone(), to.clone())) {
                Some(link) if link.fail_next > 0 => {
                    link.fail_next -= 1;
                    true
                }
                _ => false,
            },
        )
    }

    /// Decides the fate of one frame the host `from` sends to `to`.
    pub fn fate(&self, from: &HostId, to: &HostId) -> FrameFate {
        if !self.active() {
            return FrameFate::Deliver(Duration::ZERO);
        }
        if self.is_blocked(from, to) {
            return FrameFate::Drop;
        }
        let link = self.link(from, to);
        if link.drop_probability > 0.0 && self.uniform() < link.drop_probability {
            return FrameFate::Drop;
        }
        let mut delay = link.delay;
        if !link.jitter.is_zero() {
            let extra = link.jitter.as_nanos() as f64 * self.uniform();
            delay += Duration::from_nanos(extra as u64);
        }
        FrameFate::Deliver(delay)
    }

    /// A uniform draw in `0.0..1.0`.
    fn uniform(&self) -> f64 {
        (self.shared.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_env::SeededRng;

    fn host(name: &str) -> HostId {
        HostId::new(name).unwrap()
    }

    #[test]
    fn faults_apply_per_direction() {
        let hooks = FaultHooks::new(Arc::new(SeededRng::new(1)));
        let (a, b) = (host("a"), host("b"));
        hooks.partition_one_way(&a, &b);
        assert_eq!(hooks.fate(&a, &b), FrameFate::Drop);
        assert_eq!(hooks.fate(&b, &a), FrameFate::Deliver(Duration::ZERO));
        hooks.heal(&a, &b);
        assert!(hooks.links().is_empty(), "healed links leave no entry");
        assert!(!hooks.active());
    }

    #[test]
    fn fail_next_counts_down() {
        let hooks = FaultHooks::new(Arc::new(SeededRng::new(1)));
        let (a, b) = (host("a"), host("b"));
        hooks.fail_next(&a, &b, 2);
        assert!(hooks.take_injected_failure(&a, &b));
        assert!(!hooks.take_injected_failure(&b, &a));
        assert!(hooks.take_injected_failure(&a, &b));
        assert!(!hooks.take_injected_failure(&a, &b));
    }

    #[test]
    fn isolation_blocks_every_link_of_the_host() {
        let hooks = FaultHooks::new(Arc::new(SeededRng::new(1)));
        let (a, b, c) = (host("a"), host("b"), host("c"));
        hooks.isolate(&a);
        assert!(hooks.is_blocked(&a, &b) && hooks.is_blocked(&c, &a));
        assert!(!hooks.is_blocked(&b, &c));
        hooks.rejoin(&a);
        assert!(!hooks.is_blocked(&a, &b));
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let hooks = FaultHooks::new(Arc::new(SeededRng::new(7)));
        let (a, b) = (host("a"), host("b"));
        hooks.set_delay(&a, &b, Duration::from_millis(5), Duration::from_millis(2));
        for _ in 0..1000 {
            let FrameFate::Deliver(d) = hooks.fate(&a, &b) else {
                panic!("dropped without a drop probability");
            };
            assert!(d >= Duration::from_millis(5) && d <= Duration::from_millis(7));
        }
    }
}
