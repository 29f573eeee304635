//! The cluster map: what placement knows about the cluster.
//!
//! Owns: the [`ClusterMap`] of hosts (fault domain, liveness, role) and their
//! disk groups (capacity, used and reserved bytes, health), and the rules for
//! which disk group may hold which kind of component. Must not touch: how the
//! map is gathered (the directory builds it from host registrations, leases
//! and store reports) or where components go (the `place` module).
//!
//! Invariants:
//! - host ids are unique and hosts are kept in id order, so every walk over
//!   the map (and therefore every placement) is deterministic;
//! - disk group ids are unique within their host;
//! - a host with no configured fault domain is its own fault domain.
//!
//! Space words: `used_bytes` is what the store has written, `reserved_bytes`
//! is space promised to reserved (thick) components and not yet written, and
//! free space is what is left of the capacity after both.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use tessera_types::layout::{ComponentRole, Layout};
use tessera_types::{DiskGroupId, FaultDomainId, HostId};

/// A disk group whose used plus reserved bytes reach this percentage of its
/// capacity counts as full and gets no new component, not even a thin one:
/// the store needs the rest for its write log and metadata, and a thin
/// component placed there would fail its first writes with "no space".
pub const DISK_GROUP_FULL_PCT: u64 = 95;

/// Whether a host takes part in the cluster right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostLiveness {
    /// Its liveness lease is current.
    Live,
    /// Its lease lapsed: its components are absent and it gets nothing new.
    Absent,
}

/// What a host may store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostRole {
    /// Data and witness components.
    Data,
    /// Witness components only (the witness host of a stretched cluster).
    WitnessOnly,
}

/// Whether a disk group can hold components.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskGroupHealth {
    /// Serving I/O.
    Healthy,
    /// Its cache device or too many capacity devices failed: every component
    /// on it is lost and nothing new goes there.
    Failed,
    /// Being emptied before maintenance: its components still serve until
    /// their owners have moved them, and nothing new goes there.
    Evacuating,
}

/// One disk group as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskGroup {
    /// Its id, unique within its host.
    pub id: DiskGroupId,
    /// Bytes of capacity tier.
    pub capacity_bytes: u64,
    /// Bytes the store has written.
    pub used_bytes: u64,
    /// Bytes promised to reserved components and not yet written.
    pub reserved_bytes: u64,
    /// Whether it can hold components.
    pub health: DiskGroupHealth,
}

impl DiskGroup {
    /// An empty, healthy disk group.
    pub fn new(id: DiskGroupId, capacity_bytes: u64) -> DiskGroup {
        DiskGroup {
            id,
            capacity_bytes,
            used_bytes: 0,
            reserved_bytes: 0,
            health: DiskGroupHealth::Healthy,
        }
    }

    /// Capacity left after used and reserved bytes (0 when overcommitted).
    pub fn free_bytes(&self) -> u64 {
        self.capacity_bytes
            .saturating_sub(self.used_bytes.saturating_add(self.reserved_bytes))
    }

    /// True at or above [`DISK_GROUP_FULL_PCT`] of capacity (a group with no
    /// capacity is always full).
    pub fn is_full(&self) -> bool {
        let taken = self.used_bytes as u128 + self.reserved_bytes as u128;
        taken * 100 >= self.capacity_bytes as u128 * DISK_GROUP_FULL_PCT as u128
    }

    /// Healthy and not full: may take a new component.
    pub fn accepts_components(&self) -> bool {
        self.health == DiskGroupHealth::Healthy && !self.is_full()
    }
}

/// One host as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// Its id.
    pub id: HostId,
    /// The fault domain it fails with.
    pub fault_domain: FaultDomainId,
    /// Whether it is live.
    pub liveness: HostLiveness,
    /// What it may store.
    pub role: HostRole,
    /// Its disk groups.
    pub disk_groups: Vec<DiskGroup>,
}

impl Host {
    /// A live data host with no disk groups, in a fault domain of its own
    /// (named like the host).
    pub fn new(id: HostId) -> Host {
        Host {
            fault_domain: FaultDomainId(id.0.clone()),
            id,
            liveness: HostLiveness::Live,
            role: HostRole::Data,
            disk_groups: Vec::new(),
        }
    }

    /// The same host in fault domain `fault_domain`.
    pub fn in_fault_domain(mut self, fault_domain: FaultDomainId) -> Host {
        self.fault_domain = fault_domain;
        self
    }

    /// The same host, holding witness components only.
    pub fn witness_only(mut self) -> Host {
        self.role = HostRole::WitnessOnly;
        self
    }

    /// The same host with liveness `liveness`.
    pub fn with_liveness(mut self, liveness: HostLiveness) -> Host {
        self.liveness = liveness;
        self
    }

    /// The same host with one more disk group.
    pub fn with_disk_group(mut self, disk_group: DiskGroup) -> Host {
        self.disk_groups.push(disk_group);
        self
    }

    /// True when its lease is current.
    pub fn is_live(&self) -> bool {
        self.liveness == HostLiveness::Live
    }

    /// The disk group `id` on this host.
    pub fn disk_group(&self, id: &DiskGroupId) -> Option<&DiskGroup> {
        self.disk_groups.iter().find(|d| &d.id == id)
    }

    /// True when a component of `role` may go to `disk_group` of this host,
    /// space reservations aside.
    pub fn accepts(&self, role: ComponentRole, disk_group: &DiskGroup) -> bool {
        let role_ok = match role {
            ComponentRole::Data => self.role == HostRole::Data,
            ComponentRole::Witness => true,
        };
        self.is_live() && role_ok && disk_group.accepts_components()
    }
}

/// Why a cluster map was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterMapError {
    /// Two hosts with one id.
    #[error("host {host} appears twice in the cluster map")]
    DuplicateHost {
        /// The repeated host.
        host: HostId,
    },
    /// Two disk groups with one id on one host.
    #[error("host {host} lists disk group {disk_group} twice")]
    DuplicateDiskGroup {
        /// The host.
        host: HostId,
        /// The repeated disk group.
        disk_group: DiskGroupId,
    },
}

/// Hosts, their fault domains and disk groups: the input of placement.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<Host>", into = "Vec<Host>")]
pub struct ClusterMap {
    hosts: Vec<Host>,
}

impl TryFrom<Vec<Host>> for ClusterMap {
    type Error = ClusterMapError;

    fn try_from(hosts: Vec<Host>) -> Result<Self, Self::Error> {
        ClusterMap::new(hosts)
    }
}

impl From<ClusterMap> for Vec<Host> {
    fn from(map: ClusterMap) -> Self {
        map.hosts
    }
}

impl ClusterMap {
    /// A map of `hosts`, refusing duplicate host or disk group ids.
    pub fn new(mut hosts: Vec<Host>) -> Result<ClusterMap, ClusterMapError> {
        hosts.sort_by(|a, b| a.id.cmp(&b.id));
        for pair in hosts.windows(2) {
            if pair[0].id == pair[1].id {
                return Err(ClusterMapError::DuplicateHost {
                    host: pair[0].id.clone(),
                });
            }
        }
        for host in &hosts {
            let mut seen = BTreeSet::new();
            for dg in &host.disk_groups {
                if !seen.insert(&dg.id) {
                    return Err(ClusterMapError::DuplicateDiskGroup {
                        host: host.id.clone(),
                        disk_group: dg.id.clone(),
                    });
                }
            }
        }
        Ok(ClusterMap { hosts })
    }

    /// Every host, in id order.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The host `id`.
    pub fn host(&self, id: &HostId) -> Option<&Host> {
        self.hosts
            .binary_search_by(|h| h.id.cmp(id))
            .ok()
            .map(|i| &self.hosts[i])
    }

    /// The host `id`, to update its liveness or disk groups.
    pub fn host_mut(&mut self, id: &HostId) -> Option<&mut Host> {
        match self.hosts.binary_search_by(|h| h.id.cmp(id)) {
            Ok(i) => Some(&mut self.hosts[i]),
            Err(_) => None,
        }
    }

    /// The disk group `disk_group` of host `host`.
    pub fn disk_group(&self, host: &HostId, disk_group: &DiskGroupId) -> Option<&DiskGroup> {
        self.host(host).and_then(|h| h.disk_group(disk_group))
    }

    /// The disk group `disk_group` of host `host`, to update its space or health.
    pub fn disk_group_mut(
        &mut self,
        host: &HostId,
        disk_group: &DiskGroupId,
    ) -> Option<&mut DiskGroup> {
        self.host_mut(host)
            .and_then(|h| h.disk_groups.iter_mut().find(|d| &d.id == disk_group))
    }

    /// Every fault domain with the hosts in it.
    pub fn fault_domains(&self) -> BTreeMap<&FaultDomainId, Vec<&Host>> {
        let mut out: BTreeMap<&FaultDomainId, Vec<&Host>> = BTreeMap::new();
        for host in &self.hosts {
            out.entry(&host.fault_domain).or_default().push(host);
        }
        out
    }

    /// Records the reservations of a freshly placed layout, so that the next
    /// placement (before the stores report again) sees the space as taken.
    /// Components on hosts or disk groups missing from the map are skipped.
    pub fn reserve_layout(&mut self, layout: &Layout, space_reservation_pct: u8) {
        for c in layout.components() {
            if c.role != ComponentRole::Data {
                continue;
            }
            let reserve = reservation_bytes(c.size_bytes, space_reservation_pct);
            if let Some(dg) = self.disk_group_mut(&c.host, &c.disk_group) {
                dg.reserved_bytes = dg.reserved_bytes.saturating_add(reserve);
            }
        }
    }
}

/// Bytes reserved up front for a data component of `component_bytes` under a
/// space reservation of `pct` percent (rounded up, so 100 % is the whole
/// component and any non-zero percentage reserves at least a byte).
pub fn reservation_bytes(component_bytes: u64, pct: u8) -> u64 {
    let pct = u128::from(pct.min(100));
    let bytes = (u128::from(component_bytes) * pct).div_ceil(100);
    // Never above component_bytes, which is a u64.
    bytes as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dg(name: &str, capacity: u64) -> DiskGroup {
        DiskGroup::new(DiskGroupId(name.into()), capacity)
    }

    #[test]
    fn host_is_its_own_fault_domain_by_default() {
        let h = Host::new(HostId("h1".into()));
        assert_eq!(h.fault_domain, FaultDomainId("h1".into()));
        let h = h.in_fault_domain(FaultDomainId("rack-a".into()));
        assert_eq!(h.fault_domain.as_str(), "rack-a");
    }

    #[test]
    fn duplicates_are_refused() {
        let a = Host::new(HostId("a".into()));
        assert_eq!(
            ClusterMap::new(vec![a.clone(), a.clone()]),
            Err(ClusterMapError::DuplicateHost {
                host: HostId("a".into())
            })
        );
        let b = a.with_disk_group(dg("d", 10)).with_disk_group(dg("d", 10));
        assert!(matches!(
            ClusterMap::new(vec![b]),
            Err(ClusterMapError::DuplicateDiskGroup { .. })
        ));
    }

    #[test]
    fn full_and_free_follow_used_and_reserved() {
        let mut d = dg("d", 1000);
        assert_eq!(d.free_bytes(), 1000);
        assert!(d.accepts_components());
        d.used_bytes = 900;
        d.reserved_bytes = 49;
        assert_eq!(d.free_bytes(), 51);
        assert!(!d.is_full());
        d.reserved_bytes = 50;
        assert!(d.is_full());
        d.used_bytes = 5000;
        assert_eq!(d.free_bytes(), 0);
        assert!(dg("empty", 0).is_full());
        d = dg("d", 1000);
        d.health = DiskGroupHealth::Failed;
        assert!(!d.accepts_components());
    }

    #[test]
    fn reservation_rounds_up() {
        assert_eq!(reservation_bytes(1000, 0), 0);
        assert_eq!(reservation_bytes(1000, 100), 1000);
        assert_eq!(reservation_bytes(1000, 33), 330);
        assert_eq!(reservation_bytes(1001, 50), 501);
        assert_eq!(reservation_bytes(u64::MAX, 100), u64::MAX);
        assert_eq!(reservation_bytes(1, 1), 1);
    }

    #[test]
    fn map_round_trips_through_json_and_rejects_duplicates() {
        let map = ClusterMap::new(vec![
            Host::new(HostId("b".into())).with_disk_group(dg("d0", 10)),
            Host::new(HostId("a".into())).witness_only(),
        ])
        .unwrap();
        assert_eq!(map.hosts()[0].id.as_str(), "a");
        let text = serde_json::to_string(&map).unwrap();
        let back: ClusterMap = serde_json::from_str(&text).unwrap();
        assert_eq!(back, map);
        let dup = format!("[{0},{0}]", serde_json::to_string(&map.hosts()[0]).unwrap());
        assert!(serde_json::from_str::<ClusterMap>(&dup).is_err());
    }
}
