//! Counters of one transport, for the metrics endpoint and the dashboard.
//!
//! Owns: monotonically increasing counts, updated with relaxed atomics on
//! the data path (a count may lag a concurrent call by a moment; it never
//! goes backwards).

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) calls: AtomicU64,
    pub(crate) call_errors: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) connections_opened: AtomicU64,
    pub(crate) connections_accepted: AtomicU64,
    pub(crate) requests_served: AtomicU64,
    pub(crate) answer_writes: AtomicU64,
    pub(crate) frames_lost_to_faults: AtomicU64,
    pub(crate) connections_closed_malformed: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> TransportStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TransportStats {
            calls: get(&self.calls),
            call_errors: get(&self.call_errors),
            timeouts: get(&self.timeouts),
            connections_opened: get(&self.connections_opened),
            connections_accepted: get(&self.connections_accepted),
            requests_served: get(&self.requests_served),
            answer_writes: get(&self.answer_writes),
            frames_lost_to_faults: get(&self.frames_lost_to_faults),
            connections_closed_malformed: get(&self.connections_closed_malformed),
        }
    }
}

/// A copy of a transport's counters since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Calls made to peers.
    pub calls: u64,
    /// Calls that ended with a transport error (timeouts included).
    pub call_errors: u64,
    /// Calls that ended with a timeout.
    pub timeouts: u64,
    /// Connections this host opened to peers (handshake completed).
    pub connections_opened: u64,
    /// Connections peers opened to this host (handshake completed).
    pub connections_accepted: u64,
    /// Requests this host's handler answered.
    pub requests_served: u64,
    /// Writes to peers' sockets that carried those answers: answers ready
    /// together (a group commit acknowledges many writes at once) share one.
    pub answer_writes: u64,
    /// Frames this host did not send or did not accept because of a fault
    /// hook (drop probability, partition, isolation).
    pub frames_lost_to_faults: u64,
    /// Incoming connections closed for a malformed frame or a protocol
    /// violation.
    pub connections_closed_malformed: u64,
}
