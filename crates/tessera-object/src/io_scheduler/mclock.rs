//! The mClock decision, with no I/O and no clock of its own: which waiting
//! operation starts next, and when, given each client's reservation,
//! weight and limits (Gulati, Merchant, Varman: "mClock: Handling
//! Throughput Variability for Hypervisor IO Scheduling", OSDI 2010).
//!
//! Owns: the clients' tags and queues and the count of operations started
//! and not yet finished. Must not touch: time (every call is given `now`),
//! tasks or locks (the async [`super::IoScheduler`] wraps it).
//!
//! Each operation gets three tags when it arrives, in nanoseconds:
//! - **R** (reservation): one [`ClientSpec::reservation_ops`]-th of a
//!   second after the client's previous R tag, or now if later;
//! - **L** (limit): when the client's IOPS and bandwidth limits let it
//!   start, computed like a token bucket with no burst;
//! - **P** (proportion): the previous P tag plus the operation's cost over
//!   the client's weight, or now if later.
//!
//! While fewer than `depth` operations run, the next to start is the queue
//! head with the smallest R tag that is due (a client behind its
//! reservation), else the head with the smallest P tag among those whose
//! L tag is due. An operation started for its reservation takes its cost
//! off the client's later P tags, so reserved work does not count against
//! its share of what is left.
//!
//! Invariants (property-tested): every operation enqueued starts exactly
//! once or is cancelled; a client's operations start in the order they
//! arrived; never more than `depth` run at once; once slots free and time
//! moves, everything waiting starts (a wake time is always given while
//! something waits and a slot is free).

use std::collections::{BTreeMap, VecDeque};

/// Nanoseconds in a second.
const NS: u64 = 1_000_000_000;
/// Bytes an operation may move for the cost of one: bigger operations cost
/// proportionally more of their client's share.
pub const COST_UNIT_BYTES: u64 = 64 * 1024;
/// Weight of a client nobody set.
pub const DEFAULT_WEIGHT: u32 = 1000;

/// What one client may use and is guaranteed. 0 means none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientSpec {
    /// Operations per second served first when the client is behind them.
    pub reservation_ops: u32,
    /// Share of what is left over, relative to the other clients' weights
    /// (at least 1).
    pub weight: u32,
    /// Operations per second the client may not exceed.
    pub limit_ops: u32,
    /// Bytes per second the client may not exceed.
    pub limit_bytes: u64,
}

impl Default for ClientSpec {
    fn default() -> ClientSpec {
        ClientSpec {
            reservation_ops: 0,
            weight: DEFAULT_WEIGHT,
            limit_ops: 0,
            limit_bytes: 0,
        }
    }
}

/// What [`MClock::dispatch`] decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Dispatch {
    /// Tickets of the operations to start now, in order.
    pub start: Vec<u64>,
    /// When to ask again if nothing finishes before: the earliest tag that
    /// is not yet due among the waiting heads. None when nothing waits, or
    /// when every slot is taken (a finish will ask).
    pub wake_at_ns: Option<u64>,
}

#[derive(Debug)]
struct Waiting {
    ticket: u64,
    reserve: u64,
    limit: u64,
    proportion: u64,
    cost: u64,
}

#[derive(Debug, Default)]
struct Client {
    spec: ClientSpec,
    last_reserve: u64,
    last_proportion: u64,
    next_by_ops: u64,
    next_by_bytes: u64,
    queue: VecDeque<Waiting>,
}

/// Operations waiting for their turn, by client, and the count running.
#[derive(Debug)]
pub struct MClock<K: Ord + Clone> {
    depth: usize,
    running: usize,
    /// Operations waiting, over every client.
    queued: usize,
    next_ticket: u64,
    clients: BTreeMap<K, Client>,
}

impl<K: Ord + Clone> MClock<K> {
    /// A scheduler that lets at most `depth` operations run at once.
    pub fn new(depth: usize) -> MClock<K> {
        MClock {
            depth: depth.max(1),
            running: 0,
            queued: 0,
            next_ticket: 0,
            clients: BTreeMap::new(),
        }
    }

    /// Operations that may run at once.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Changes how many operations may run at once; those running finish.
    pub fn set_depth(&mut self, depth: usize) {
        self.depth = depth.max(1);
    }

    /// Operations started and not yet finished.
    pub fn running(&self) -> usize {
        self.running
    }

    /// Operations waiting.
    pub fn waiting(&self) -> usize {
        self.queued
    }

    /// Starts an operation of `client` at once, without queueing it, when
    /// that cannot change any decision: nothing waits, a slot is free, and
    /// the client has neither a limit nor a reservation (its share only
    /// matters once operations wait, and then a client coming to the queue
    /// starts level with those waiting). True if it started; call
    /// [`MClock::finish`] when it ends.
    pub fn try_start_now(&mut self, client: &K) -> bool {
        if self.queued > 0 || self.running >= self.depth {
            return false;
        }
        let free = self.clients.get(client).is_none_or(|c| {
            c.spec.limit_ops == 0 && c.spec.limit_bytes == 0 && c.spec.reservation_ops == 0
        });
        if free {
            self.running += 1;
        }
        free
    }

    /// Sets what `client` may use; operations already waiting keep their
    /// tags.
    pub fn set_spec(&mut self, client: K, spec: ClientSpec) {
        self.clients.entry(client).or_default().spec = ClientSpec {
            weight: spec.weight.max(1),
            ..spec
        };
    }

    /// Forgets `client`'s spec once nothing of it waits.
    pub fn forget(&mut self, client: &K) {
        if self.clients.get(client).is_some_and(|c| c.queue.is_empty()) {
            self.clients.remove(client);
        }
    }

    /// Queues an operation of `client` moving `bytes` that arrives at
    /// `now_ns`; answers its ticket.
    pub fn enqueue(&mut self, client: K, bytes: u64, now_ns: u64) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        // A client that comes back from idle starts level with the busiest
        // waiting client's share, not far behind it (which would let it
        // take every slot until it caught up).
        let floor = self
            .clients
            .values()
            .filter_map(|c| c.queue.front().map(|w| w.proportion))
            .min()
            .unwrap_or(0)
            .max(now_ns);
        let c = self.clients.entry(client).or_default();
        let spec = c.spec;
        let cost = 1 + bytes / COST_UNIT_BYTES;
        let reserve = if spec.reservation_ops == 0 {
            u64::MAX
        } else {
            let r = (c.last_reserve + NS / u64::from(spec.reservation_ops)).max(now_ns);
            c.last_reserve = r;
            r
        };
        let limit = now_ns.max(c.next_by_ops).max(c.next_by_bytes);
        if spec.limit_ops != 0 {
            c.next_by_ops = limit + NS / u64::from(spec.limit_ops);
        }
        if spec.limit_bytes != 0 {
            c.next_by_bytes =
                limit + (bytes as u128 * NS as u128 / spec.limit_bytes as u128) as u64;
        }
        let start = if c.queue.is_empty() {
            c.last_proportion.max(floor)
        } else {
            c.last_proportion.max(now_ns)
        };
        let proportion = start + cost * NS / u64::from(spec.weight);
        c.last_proportion = proportion;
        self.queued += 1;
        c.queue.push_back(Waiting {
            ticket,
            reserve,
            limit,
            proportion,
            cost,
        });
        ticket
    }

    /// Takes a waiting operation out of its queue (its caller gave up);
    /// true if it was waiting.
    pub fn cancel(&mut self, ticket: u64) -> bool {
        for c in self.clients.values_mut() {
            if let Some(i) = c.queue.iter().position(|w| w.ticket == ticket) {
                c.queue.remove(i);
                self.queued -= 1;
                return true;
            }
        }
        false
    }

    /// An operation started earlier has finished.
    pub fn finish(&mut self) {
        self.running = self.running.saturating_sub(1);
    }

    /// Starts what may start at `now_ns`.
    pub fn dispatch(&mut self, now_ns: u64) -> Dispatch {
        let mut out = Dispatch::default();
        while self.running < self.depth {
            let Some(key) = self.pick(now_ns) else { break };
            let c = self.clients.get_mut(&key).expect("picked client exists");
            let w = c.queue.pop_front().expect("picked client has a head");
            self.queued -= 1;
            if w.reserve <= now_ns {
                let credit = w.cost * NS / u64::from(c.spec.weight);
                for later in c.queue.iter_mut() {
                    later.proportion = later.proportion.saturating_sub(credit);
                }
                c.last_proportion = c.last_proportion.saturating_sub(credit);
            }
            self.running += 1;
            out.start.push(w.ticket);
        }
        if self.running < self.depth {
            out.wake_at_ns = self
                .clients
                .values()
                .filter_map(|c| c.queue.front())
                .map(|w| w.reserve.min(w.limit))
                .filter(|&t| t > now_ns)
                .min();
        }
        out
    }

    /// The client whose head starts next, if any may.
    fn pick(&self, now_ns: u64) -> Option<K> {
        let heads = || {
            self.clients
                .iter()
                .filter_map(|(k, c)| c.queue.front().map(|w| (k, w)))
        };
        if let Some((k, _)) = heads()
            .filter(|(_, w)| w.reserve <= now_ns)
            .min_by_key(|(_, w)| w.reserve)
        {
            return Some(k.clone());
        }
        heads()
            .filter(|(_, w)| w.limit <= now_ns)
            .min_by_key(|(_, w)| w.proportion)
            .map(|(k, _)| k.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs `ops` operations per client, each lasting `service_ns`, for
    /// `seconds`, every client always keeping `queue` operations waiting;
    /// answers how many each started.
    fn saturate(
        specs: &[ClientSpec],
        depth: usize,
        service_ns: u64,
        queue: usize,
        bytes: u64,
        seconds: u64,
    ) -> Vec<u64> {
        let mut m = MClock::new(depth);
        for (i, s) in specs.iter().enumerate() {
            m.set_spec(i, *s);
        }
        let mut owner = BTreeMap::new();
        let mut started = vec![0u64; specs.len()];
        let mut finishing: Vec<u64> = Vec::new();
        let mut now = 0;
        for i in 0..specs.len() {
            for _ in 0..queue {
                owner.insert(m.enqueue(i, bytes, now), i);
            }
        }
        while now < seconds * NS {
            let d = m.dispatch(now);
            for t in d.start {
                let i = owner[&t];
                started[i] += 1;
                finishing.push(now + service_ns);
                owner.insert(m.enqueue(i, bytes, now), i);
            }
            finishing.sort_unstable();
            let next_finish = finishing.first().copied();
            let next = match (next_finish, d.wake_at_ns) {
                (Some(f), Some(w)) => f.min(w),
                (Some(f), None) => f,
                (None, Some(w)) => w,
                (None, None) => break,
            };
            now = next.max(now + 1);
            while finishing.first().is_some_and(|&f| f <= now) {
                finishing.remove(0);
                m.finish();
            }
        }
        started
    }

    #[test]
    fn a_limited_client_gets_its_limit_and_no_more_while_a_neighbour_runs_free() {
        let limited = ClientSpec {
            limit_ops: 2000,
            ..ClientSpec::default()
        };
        let started = saturate(&[limited, ClientSpec::default()], 16, 100_000, 32, 4096, 5);
        assert!((9_900..=10_001).contains(&started[0]), "{started:?}");
        // The host does 16 operations per 100 µs; the rest go to the other.
        assert!(started[1] > 700_000, "{started:?}");
    }

    #[test]
    fn a_bandwidth_limit_holds_bytes_per_second() {
        let limited = ClientSpec {
            limit_bytes: 10 << 20,
            ..ClientSpec::default()
        };
        let started = saturate(&[limited], 8, 100_000, 16, 256 * 1024, 4);
        // 40 MiB over 256 KiB operations.
        assert!((159..=161).contains(&started[0]), "{started:?}");
    }

    #[test]
    fn a_reservation_is_kept_while_eight_neighbours_saturate_the_host() {
        let reserved = ClientSpec {
            reservation_ops: 1000,
            ..ClientSpec::default()
        };
        let mut specs = vec![reserved];
        specs.extend(std::iter::repeat_n(ClientSpec::default(), 8));
        // 4 slots of 2 ms: the host does 2,000 operations a second, so an
        // equal share would be 222 each.
        let started = saturate(&specs, 4, 2_000_000, 16, 4096, 5);
        assert!(started[0] >= 4_950, "{started:?}");
    }

    #[test]
    fn weights_share_what_is_left_in_proportion() {
        let heavy = ClientSpec {
            weight: 3000,
            ..ClientSpec::default()
        };
        let started = saturate(&[heavy, ClientSpec::default()], 4, 1_000_000, 8, 4096, 5);
        let ratio = started[0] as f64 / started[1] as f64;
        assert!((2.8..3.2).contains(&ratio), "{started:?}");
    }

    #[test]
    fn a_client_back_from_idle_does_not_take_every_slot() {
        let mut m = MClock::new(1);
        let mut now = 0;
        // Client 0 has been busy alone for a while: its P tags are ahead.
        for _ in 0..10_000 {
            let t = m.enqueue(0u8, 4096, now);
            assert_eq!(m.dispatch(now).start, vec![t]);
            m.finish();
            now += 1_000;
        }
        for _ in 0..10 {
            m.enqueue(0u8, 4096, now);
            m.enqueue(1u8, 4096, now);
        }
        let mut order = Vec::new();
        for _ in 0..20 {
            let d = m.dispatch(now);
            order.extend(d.start);
            m.finish();
        }
        // Tickets of client 1 are the odd ones after the busy run.
        let first_ten_of_one = order[..10].iter().filter(|t| *t % 2 == 1).count();
        assert!((4..=6).contains(&first_ten_of_one), "{order:?}");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Enqueue { client: u8, bytes: u32 },
        Dispatch,
        Finish,
        Cancel { nth: u8 },
        Advance { ns: u32 },
        Spec { client: u8, r: u16, w: u16, l: u16 },
        TryStart { client: u8 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..4, 0u32..1 << 20).prop_map(|(client, bytes)| Op::Enqueue { client, bytes }),
            Just(Op::Dispatch),
            Just(Op::Finish),
            any::<u8>().prop_map(|nth| Op::Cancel { nth }),
            (0u32..5_000_000).prop_map(|ns| Op::Advance { ns }),
            (0u8..4, 0u16..3000, 0u16..500, 0u16..3000).prop_map(|(client, r, w, l)| Op::Spec {
                client,
                r,
                w,
                l
            }),
            (0u8..4).prop_map(|client| Op::TryStart { client }),
        ]
    }

    proptest! {
        #[test]
        fn every_operation_starts_once_in_its_clients_order_and_depth_holds(
            depth in 1usize..6,
            ops in proptest::collection::vec(op(), 1..300),
        ) {
            let mut m = MClock::new(depth);
            let mut now = 0u64;
            // Waiting operations: ticket and client.
            let mut waiting: Vec<(u64, u8)> = Vec::new();
            let mut started = std::collections::BTreeSet::new();
            let mut last_started: BTreeMap<u8, u64> = BTreeMap::new();
            let mut running = 0usize;
            let mut check = |m: &mut MClock<u8>, now: u64, waiting: &mut Vec<(u64, u8)>, running: &mut usize| -> Result<Option<u64>, TestCaseError> {
                let d = m.dispatch(now);
                for t in d.start {
                    let i = waiting.iter().position(|w| w.0 == t).expect("a started ticket was waiting");
                    let (ticket, client) = waiting.remove(i);
                    prop_assert!(started.insert(ticket), "ticket {ticket} started twice");
                    if let Some(prev) = last_started.insert(client, ticket) {
                        prop_assert!(prev < ticket, "client {client} out of order");
                    }
                    *running += 1;
                }
                prop_assert!(*running <= m.depth());
                prop_assert_eq!(m.running(), *running);
                prop_assert_eq!(m.waiting(), waiting.len());
                if let Some(at) = d.wake_at_ns {
                    prop_assert!(at > now);
                }
                Ok(d.wake_at_ns)
            };
            for o in ops {
                match o {
                    Op::Enqueue { client, bytes } => {
                        let t = m.enqueue(client, u64::from(bytes), now);
                        waiting.push((t, client));
                    }
                    Op::Dispatch => {
                        check(&mut m, now, &mut waiting, &mut running)?;
                    }
                    Op::Finish => {
                        if running > 0 {
                            running -= 1;
                            m.finish();
                        }
                    }
                    Op::Cancel { nth } => {
                        if !waiting.is_empty() {
                            let (t, _) = waiting.remove(nth as usize % waiting.len());
                            prop_assert!(m.cancel(t));
                        }
                    }
                    Op::Advance { ns } => now += u64::from(ns),
                    Op::TryStart { client } => {
                        let before = running;
                        if m.try_start_now(&client) {
                            prop_assert!(waiting.is_empty(), "started past waiting operations");
                            running += 1;
                        }
                        prop_assert!(running <= m.depth().max(before));
                        prop_assert_eq!(m.running(), running);
                    }
                    Op::Spec { client, r, w, l } => m.set_spec(client, ClientSpec {
                        reservation_ops: u32::from(r),
                        weight: u32::from(w),
                        limit_ops: u32::from(l),
                        limit_bytes: 0,
                    }),
                }
            }
            // Liveness: with time moving and slots freed, everything starts.
            for _ in 0..100_000 {
                if waiting.is_empty() {
                    break;
                }
                while running > 0 {
                    running -= 1;
                    m.finish();
                }
                let wake = check(&mut m, now, &mut waiting, &mut running)?;
                now = wake.unwrap_or(now + 1).max(now + 1);
            }
            prop_assert!(waiting.is_empty(), "{} never started", waiting.len());
        }
    }
}
