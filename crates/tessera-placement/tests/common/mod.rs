//! Cluster maps and policies for the placement tests, built from short specs.

#![allow(dead_code)]

use tessera_placement::{ClusterMap, DiskGroup, Host};
use tessera_types::layout::Layout;
use tessera_types::policy::Policy;
use tessera_types::{ComponentId, DiskGroupId, FaultDomainId, HostId, PolicyName, VolumeId};

pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;

/// A host in its own fault domain with disk groups `dg0..` of the given sizes.
pub fn host(name: &str, dg_bytes: &[u64]) -> Host {
    let mut h = Host::new(HostId(name.into()));
    for (i, &bytes) in dg_bytes.iter().enumerate() {
        h = h.with_disk_group(DiskGroup::new(DiskGroupId(format!("dg{i}")), bytes));
    }
    h
}

/// The same, in fault domain `fd`.
pub fn host_in(name: &str, fd: &str, dg_bytes: &[u64]) -> Host {
    host(name, dg_bytes).in_fault_domain(FaultDomainId(fd.into()))
}

/// `n` hosts `h1..hn`, each its own fault domain with one disk group.
pub fn hosts(n: usize, dg_bytes: u64) -> ClusterMap {
    ClusterMap::new(
        (1..=n)
            .map(|i| host(&format!("h{i}"), &[dg_bytes]))
            .collect(),
    )
    .unwrap()
}

pub fn policy(ftt: u8, width: u8, reservation_pct: u8) -> Policy {
    let mut p = Policy::new(PolicyName("p".into()), ftt);
    p.stripe_width = width;
    p.space_reservation_pct = reservation_pct;
    p
}

pub fn volume(name: &str) -> VolumeId {
    VolumeId(name.into())
}

/// Component ids 1, 2, 3, ...
pub fn ids() -> impl FnMut() -> ComponentId {
    let mut next = 0;
    move || {
        next += 1;
        ComponentId(next)
    }
}

/// One line per column and one for the witnesses: `host/disk group`, with
/// votes when not 1.
pub fn render(layout: &Layout) -> String {
    let name = |c: &tessera_types::layout::ComponentPlacement| {
        if c.votes == 1 {
            format!("{}/{}", c.host, c.disk_group)
        } else {
            format!("{}/{} x{}", c.host, c.disk_group, c.votes)
        }
    };
    let mut lines: Vec<String> = layout
        .columns
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let copies: Vec<String> = m.copies.iter().map(name).collect();
            format!("column {i}: {}", copies.join(", "))
        })
        .collect();
    let w: Vec<String> = layout.witnesses.iter().map(name).collect();
    lines.push(format!("witness: {}", w.join(", ")));
    lines.join("\n")
}
