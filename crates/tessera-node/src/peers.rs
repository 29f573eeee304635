//! What a host knows of the others: addresses and liveness, refreshed from
//! the directory by the host's control loop.
//!
//! Owns: a snapshot of host records and live hosts. Readers never wait on
//! the directory; a stale snapshot only delays failure detection by one
//! refresh.

use parking_lot::RwLock;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use tessera_directory::keys::HostRecord;
use tessera_types::HostId;

/// Host records and liveness.
#[derive(Default)]
pub struct Peers {
    records: RwLock<HashMap<HostId, HostRecord>>,
    live: RwLock<HashSet<HostId>>,
}

impl Peers {
    /// Replaces the snapshot.
    pub fn update(&self, records: Vec<HostRecord>, live: Vec<HostId>) {
        *self.records.write() = records.into_iter().map(|r| (r.id.clone(), r)).collect();
        *self.live.write() = live.into_iter().collect();
    }

    /// Adds or replaces one host's record.
    pub fn set_record(&self, record: HostRecord) {
        self.records.write().insert(record.id.clone(), record);
    }

    /// Forgets one host's record.
    pub fn remove_record(&self, host: &HostId) {
        self.records.write().remove(host);
    }

    /// Records whether `host`'s liveness lease is held.
    pub fn set_live(&self, host: HostId, live: bool) {
        if live {
            self.live.write().insert(host);
        } else {
            self.live.write().remove(&host);
        }
    }

    /// The transport address of `host`.
    pub fn transport_addr(&self, host: &HostId) -> Option<SocketAddr> {
        self.records.read().get(host).map(|r| r.addresses.transport)
    }

    /// Whether `host`'s liveness lease is held.
    pub fn is_live(&self, host: &HostId) -> bool {
        self.live.read().contains(host)
    }

    /// The hosts whose liveness lease is held.
    pub fn live_hosts(&self) -> Vec<HostId> {
        self.live.read().iter().cloned().collect()
    }

    /// Every known host record.
    pub fn records(&self) -> Vec<HostRecord> {
        let mut out: Vec<HostRecord> = self.records.read().values().cloned().collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}
