//! Counters of one transport, for the metrics endpoint and the dashboard.
//!
//! Owns: monotonically increasing counts, updated with relaxed atomics on
//! the data path (a count may lag a concurrent call by a moment; it never
//! goes backwards).

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tessera_types::HostId;

/// Live counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) connections_opened: AtomicU64,
    pub(crate) connections_accepted: AtomicU64,
    pub(crate) requests_served: AtomicU64,
    pub(crate) answer_writes: AtomicU64,
    pub(crate) request_writes: AtomicU64,
    pub(crate) frames_lost_to_faults: AtomicU64,
    pub(crate) connections_closed_malformed: AtomicU64,
    /// Calls by the peer called (a host's peers are few: one entry each);
    /// the transport's call totals are their sums.
    peers: Mutex<BTreeMap<HostId, Arc<PeerCounters>>>,
}

/// Calls to one peer.
#[derive(Debug, Default)]
pub(crate) struct PeerCounters {
    calls: AtomicU64,
    call_errors: AtomicU64,
    timeouts: AtomicU64,
    round_trip_ns: AtomicU64,
}

impl PeerCounters {
    /// Counts a call that took `elapsed`: an answer (`Ok`), or a failure
    /// (timed out or not).
    pub(crate) fn record(&self, elapsed: Duration, outcome: Result<(), bool>) {
        bump(&self.calls);
        match outcome {
            Ok(()) => {
                let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
                self.round_trip_ns.fetch_add(ns, Ordering::Relaxed);
            }
            Err(timed_out) => {
                bump(&self.call_errors);
                if timed_out {
                    bump(&self.timeouts);
                }
            }
        }
    }
}

/// Calls this host made to one peer since it started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerStats {
    /// The peer.
    pub peer: HostId,
    /// Calls made to it, failed ones included.
    pub calls: u64,
    /// Those that failed (timeouts included).
    pub call_errors: u64,
    /// Those that timed out.
    pub timeouts: u64,
    /// The round trips of the calls it answered, added up: with
    /// `calls - call_errors` their mean.
    pub round_trip_ns: u64,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    /// The counters of calls to `peer`.
    pub(crate) fn peer(&self, peer: &HostId) -> Arc<PeerCounters> {
        let mut peers = self.peers.lock();
        // Every call asks: the peer's name is copied only the first time.
        if let Some(known) = peers.get(peer) {
            return Arc::clone(known);
        }
        Arc::clone(peers.entry(peer.clone()).or_default())
    }

    /// Calls to each peer, by peer.
    pub(crate) fn peer_snapshots(&self) -> Vec<PeerStats> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        self.peers
            .lock()
            .iter()
            .map(|(peer, c)| PeerStats {
                peer: peer.clone(),
                calls: get(&c.calls),
                call_errors: get(&c.call_errors),
                timeouts: get(&c.timeouts),
                round_trip_ns: get(&c.round_trip_ns),
            })
            .collect()
    }

    pub(crate) fn snapshot(&self) -> TransportStats {
        let peers = self.peer_snapshots();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TransportStats {
            calls: peers.iter().map(|p| p.calls).sum(),
            call_errors: peers.iter().map(|p| p.call_errors).sum(),
            timeouts: peers.iter().map(|p| p.timeouts).sum(),
            connections_opened: get(&self.connections_opened),
            connections_accepted: get(&self.connections_accepted),
            requests_served: get(&self.requests_served),
            answer_writes: get(&self.answer_writes),
            request_writes: get(&self.request_writes),
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
    /// Writes to peers' sockets that carried this host's calls: the calls
    /// a connection's task starts in one poll share one.
    pub request_writes: u64,
    /// Frames this host did not send or did not accept because of a fault
    /// hook (drop probability, partition, isolation).
    pub frames_lost_to_faults: u64,
    /// Incoming connections closed for a malformed frame or a protocol
    /// violation.
    pub connections_closed_malformed: u64,
}
