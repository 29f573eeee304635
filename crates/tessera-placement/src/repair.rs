//! Repairs: which components are lost, and where their replacements go.
//!
//! Owns: [`repair_plan`] (what needs replacing, and whether now or after the
//! repair delay), [`rebuild_target`] (one replacement that keeps every rule of
//! [`crate::check`]), [`apply_rebuild`], and [`evacuate`] (moving everything
//! off a host that is about to leave). Must not touch: timing (the caller
//! owns the clock and the repair delay) or data movement (the coordinator
//! resyncs the replacement from a surviving copy).
//!
//! vSAN's two cases are kept apart: a component on an *absent* host may come
//! back (the host rebooted), so it is rebuilt only after the repair delay; a
//! component whose disk group failed, or whose host or disk group left the
//! map, is gone for good and is rebuilt at once.

use crate::check::{check_layout, fault_domain_votes, has_quorum, LayoutViolation};
use crate::cluster::{reservation_bytes, ClusterMap, DiskGroupHealth};
use crate::error::PlacementError;
use crate::place::{slot_disk_group, slot_host, Slot};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BTreeSet;
use tessera_types::layout::{ComponentPlacement, ComponentRole, ComponentState, Layout};
use tessera_types::policy::Policy;
use tessera_types::{ComponentId, DiskGroupId, FaultDomainId, HostId};

/// Why a component needs a replacement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "cause")]
pub enum RepairCause {
    /// Its host's lease lapsed; the host may come back with the data.
    HostAbsent,
    /// Its host is no longer in the cluster map (decommissioned).
    HostRemoved,
    /// Its disk group failed.
    DiskGroupFailed,
    /// Its disk group is no longer on the host (removed or replaced).
    DiskGroupRemoved,
    /// The coordinator marked it degraded (I/O errors, lost for good).
    ComponentDegraded,
}

/// When to start the rebuild.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RepairTiming {
    /// The data is gone: rebuild now.
    Immediate,
    /// The component may return: rebuild only if it is still absent when the
    /// repair delay (default 60 minutes) has passed; resync it if it returns.
    AfterRepairDelay,
}

impl RepairCause {
    /// When a component lost this way should be rebuilt.
    pub fn timing(&self) -> RepairTiming {
        match self {
            RepairCause::HostAbsent => RepairTiming::AfterRepairDelay,
            _ => RepairTiming::Immediate,
        }
    }
}

/// One component that needs a replacement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Repair {
    /// The lost component.
    pub component: ComponentId,
    /// Its role.
    pub role: ComponentRole,
    /// Its column, for data components.
    pub column: Option<usize>,
    /// Where it was.
    pub host: HostId,
    /// Its disk group.
    pub disk_group: DiskGroupId,
    /// Why it is lost.
    pub cause: RepairCause,
    /// When to rebuild it.
    pub timing: RepairTiming,
}

/// What a layout needs, given the current cluster map.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairPlan {
    /// Whether the object has quorum on its reachable, active components
    /// right now (a majority of votes and a copy of every column).
    pub accessible: bool,
    /// The components to replace, in layout order.
    pub repairs: Vec<Repair>,
}

/// Why `component` cannot serve, or `None` when it is reachable. The host
/// and disk group are checked before the component's own state, so a stale
/// state never hides a lost disk group.
fn loss_cause(map: &ClusterMap, c: &ComponentPlacement) -> Option<RepairCause> {
    let Some(host) = map.host(&c.host) else {
        return Some(RepairCause::HostRemoved);
    };
    let Some(dg) = host.disk_group(&c.disk_group) else {
        return Some(RepairCause::DiskGroupRemoved);
    };
    if dg.health == DiskGroupHealth::Failed {
        return Some(RepairCause::DiskGroupFailed);
    }
    if !host.is_live() {
        return Some(RepairCause::HostAbsent);
    }
    if c.state == ComponentState::Degraded {
        return Some(RepairCause::ComponentDegraded);
    }
    None
}

/// Lists the components of `layout` that need a replacement under `map`.
pub fn repair_plan(layout: &Layout, map: &ClusterMap) -> RepairPlan {
    let mut repairs = Vec::new();
    let column_of = |id: ComponentId| {
        layout
            .columns
            .iter()
            .position(|m| m.copies.iter().any(|c| c.id == id))
    };
    for c in layout.components() {
        if let Some(cause) = loss_cause(map, c) {
            repairs.push(Repair {
                component: c.id,
                role: c.role,
                column: column_of(c.id),
                host: c.host.clone(),
                disk_group: c.disk_group.clone(),
                timing: cause.timing(),
                cause,
            });
        }
    }
    let accessible = has_quorum(layout, |c| {
        c.state == ComponentState::Active && loss_cause(map, c).is_none()
    });
    RepairPlan {
        accessible,
        repairs,
    }
}

/// Replaces component `failed` of `layout` with `replacement` and raises the
/// layout's generation. Returns false (and changes nothing) when `failed` is
/// not in the layout.
pub fn apply_rebuild(
    layout: &mut Layout,
    failed: ComponentId,
    replacement: ComponentPlacement,
) -> bool {
    let replaced = match layout.components_mut().find(|c| c.id == failed) {
        Some(c) => {
            *c = replacement;
            true
        }
        None => false,
    };
    if replaced {
        layout.generation = layout.generation.saturating_add(1);
    }
    replaced
}

/// How good a disk group is for a replacement: fewer votes of this layout in
/// its fault domain, not used by the same copy, more free space, lower ids.
type TargetRank = (Reverse<u64>, bool, u64, Reverse<Slot>);

/// Chooses where to rebuild component `failed` of `layout`.
///
/// The replacement has the failed component's role, votes and size, a new id
/// from `next_component_id`, and state [`ComponentState::Resyncing`]. It goes
/// to a live host's healthy, non-full disk group (with the policy's
/// reservation free for data), never to the failed component's own disk
/// group, never to a fault domain holding another copy of the same column,
/// and only where the layout with the replacement keeps every rule of
/// [`check_layout`]. Among those it prefers the fault domain with the fewest
/// votes of this layout, then a disk group the same copy does not use yet,
/// then the most free space.
pub fn rebuild_target(
    policy: &Policy,
    layout: &Layout,
    failed: ComponentId,
    map: &ClusterMap,
    next_component_id: &mut impl FnMut() -> ComponentId,
) -> Result<ComponentPlacement, PlacementError> {
    let volume = layout.volume.clone();
    let Some(lost) = layout.component(failed).cloned() else {
        return Err(PlacementError::UnknownComponent {
            volume,
            component: failed,
        });
    };
    let copies = layout.columns.first().map(|m| m.copies.len()).unwrap_or(0);
    let ftt = u8::try_from(copies.saturating_sub(1)).unwrap_or(u8::MAX);
    check_layout(layout, ftt).map_err(|violation| PlacementError::InvalidLayout {
        volume: volume.clone(),
        violation,
    })?;

    // The column and copy index of a data component.
    let position = layout.columns.iter().enumerate().find_map(|(col, m)| {
        m.copies
            .iter()
            .position(|c| c.id == failed)
            .map(|copy| (col, copy))
    });
    let reserve = match lost.role {
        ComponentRole::Data => reservation_bytes(lost.size_bytes, policy.space_reservation_pct),
        ComponentRole::Witness => 0,
    };
    let column_fault_domains: BTreeSet<&FaultDomainId> = match position {
        Some((col, _)) => layout.columns[col]
            .copies
            .iter()
            .filter(|c| c.id != failed)
            .map(|c| &c.fault_domain)
            .collect(),
        None => BTreeSet::new(),
    };
    let same_copy: BTreeSet<(&HostId, &DiskGroupId)> = match position {
        Some((_, copy)) => layout
            .columns
            .iter()
            .filter_map(|m| m.copies.get(copy))
            .filter(|c| c.id != failed)
            .map(|c| (&c.host, &c.disk_group))
            .collect(),
        None => BTreeSet::new(),
    };
    let votes_before = fault_domain_votes(layout);

    let mut with_room: BTreeSet<&FaultDomainId> = BTreeSet::new();
    let mut holding_column: BTreeSet<FaultDomainId> = BTreeSet::new();
    let mut best: Option<(TargetRank, Slot)> = None;
    for (hi, host) in map.hosts().iter().enumerate() {
        for (di, dg) in host.disk_groups.iter().enumerate() {
            if !host.accepts(lost.role, dg) || dg.free_bytes() < reserve {
                continue;
            }
            if host.id == lost.host && dg.id == lost.disk_group {
                continue;
            }
            with_room.insert(&host.fault_domain);
            if column_fault_domains.contains(&host.fault_domain) {
                holding_column.insert(host.fault_domain.clone());
                continue;
            }
            let slot = (hi, di);
            let candidate = replacement(map, slot, &lost, failed);
            let mut trial = layout.clone();
            apply_rebuild(&mut trial, failed, candidate);
            if check_layout(&trial, ftt).is_err() {
                continue;
            }
            let key = (
                Reverse(votes_before.get(&host.fault_domain).copied().unwrap_or(0)),
                !same_copy.contains(&(&host.id, &dg.id)),
                dg.free_bytes(),
                Reverse(slot),
            );
            if best.as_ref().is_none_or(|(b, _)| key > *b) {
                best = Some((key, slot));
            }
        }
    }
    match best {
        Some((_, slot)) => {
            let mut c = replacement(map, slot, &lost, failed);
            c.id = next_component_id();
            // An id the layout already uses would make two components one.
            if c.id != failed && layout.component(c.id).is_some() {
                return Err(PlacementError::InvalidLayout {
                    volume,
                    violation: LayoutViolation::DuplicateComponent { component: c.id },
                });
            }
            Ok(c)
        }
        None => Err(PlacementError::NoRebuildTarget {
            volume,
            component: failed,
            role: lost.role,
            column: position.map(|(col, _)| col),
            reserve_bytes: reserve,
            fault_domains_with_room: with_room.len(),
            fault_domains_holding_column: holding_column.into_iter().collect(),
        }),
    }
}

/// The replacement for `lost` on `slot`, still carrying the old id (the new
/// one is drawn only for the winner, so ids are not burnt on candidates).
fn replacement(
    map: &ClusterMap,
    slot: Slot,
    lost: &ComponentPlacement,
    id: ComponentId,
) -> ComponentPlacement {
    let host = slot_host(map, slot);
    ComponentPlacement {
        id,
        role: lost.role,
        host: host.id.clone(),
        disk_group: slot_disk_group(map, slot).id.clone(),
        fault_domain: host.fault_domain.clone(),
        votes: lost.votes,
        size_bytes: lost.size_bytes,
        state: ComponentState::Resyncing,
    }
}

/// One component moving to a new place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentMove {
    /// The component that leaves.
    pub from: ComponentId,
    /// Its replacement.
    pub to: ComponentPlacement,
}

/// Plans moving every component of `layout` off `host` before it leaves
/// (vSAN's maintenance mode with full data migration), by rebuilding each
/// as if the host were gone, one after the other on the updated layout.
/// Returns the moves in order, or the first component that has nowhere to
/// go (then the host cannot leave without reducing the volume's protection).
pub fn evacuate(
    policy: &Policy,
    layout: &Layout,
    host: &HostId,
    map: &ClusterMap,
    next_component_id: &mut impl FnMut() -> ComponentId,
) -> Result<Vec<ComponentMove>, PlacementError> {
    let mut without = map.clone();
    if let Some(h) = without.host_mut(host) {
        h.liveness = crate::cluster::HostLiveness::Absent;
    }
    let leaving: Vec<ComponentId> = layout
        .components()
        .filter(|c| &c.host == host)
        .map(|c| c.id)
        .collect();
    let mut working = layout.clone();
    let mut moves = Vec::with_capacity(leaving.len());
    for id in leaving {
        let to = rebuild_target(policy, &working, id, &without, next_component_id)?;
        apply_rebuild(&mut working, id, to.clone());
        moves.push(ComponentMove { from: id, to });
    }
    Ok(moves)
}
