//! Placing a new volume: policy + cluster map -> layout.
//!
//! Owns: [`place`], the counting rules that decide whether a policy can be
//! satisfied at all, and the choice of disk groups and witness votes. Must
//! not touch: the cluster map (it is read only; the caller records the
//! reservation with [`ClusterMap::reserve_layout`] once the layout is stored).
//!
//! How a layout is built, in order:
//! 1. Count. RAID-1 with FTT=k keeps k+1 copies of every column and needs
//!    2k+1 fault domains that can hold a component: with only 2k, splitting
//!    them into two halves of k would leave neither half a majority, so one
//!    of the two k-sized losses would make the object inaccessible. k+1 of
//!    them must be able to hold data, and the reserved bytes must fit (see
//!    [`components_that_fit`]).
//! 2. Data. Column by column, each copy goes to the fault domain that can
//!    still take the most components of this volume (capped at the columns
//!    left), not yet used by this column; ties go to the disk group not yet
//!    used by the same copy (so a copy's columns run on different disk
//!    groups), then to the most free space. Largest-remaining-capacity first
//!    never strands a placement that the counting rule allows.
//! 3. Votes. Every data component has one vote. While the vote total is even
//!    or the k heaviest fault domains hold half or more of it, one witness
//!    vote goes to the lightest fault domain (a witness host first). This
//!    ends: once every usable fault domain holds the same votes W, k of them
//!    hold kW < (2k+1)W / 2. FTT=0 needs no witness; an even total is made
//!    odd by a second vote on the first data component.
//!
//! Everything is deterministic: ties end on host and disk group ids.

use crate::check::{check_layout, total_votes};
use crate::cluster::{reservation_bytes, ClusterMap, DiskGroup, Host, HostRole};
use crate::error::{CapacityShortfall, PlacementError};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use tessera_types::layout::{
    ComponentPlacement, ComponentRole, ComponentState, Layout, Mirror, STRIPE_UNIT_BYTES,
};
use tessera_types::policy::Policy;
use tessera_types::{ComponentId, DiskGroupId, FaultDomainId, HostId, VolumeId};

/// Largest volume placement accepts: 1 PiB, far beyond any disk group, and
/// small enough that every byte sum over a layout stays inside a u64.
pub const VOLUME_BYTES_MAX: u64 = 1 << 50;

/// A disk group by position in the map: (host index, disk group index).
pub(crate) type Slot = (usize, usize);

pub(crate) fn slot_host(map: &ClusterMap, slot: Slot) -> &Host {
    &map.hosts()[slot.0]
}

pub(crate) fn slot_disk_group(map: &ClusterMap, slot: Slot) -> &DiskGroup {
    &map.hosts()[slot.0].disk_groups[slot.1]
}

/// Disk groups that may take a component of `role`, grouped by fault domain.
pub(crate) fn slots_by_fault_domain(
    map: &ClusterMap,
    role: ComponentRole,
) -> BTreeMap<FaultDomainId, Vec<Slot>> {
    let mut out: BTreeMap<FaultDomainId, Vec<Slot>> = BTreeMap::new();
    for (hi, host) in map.hosts().iter().enumerate() {
        for (di, dg) in host.disk_groups.iter().enumerate() {
            if host.accepts(role, dg) {
                out.entry(host.fault_domain.clone())
                    .or_default()
                    .push((hi, di));
            }
        }
    }
    out
}

/// How many of `width` x `copies` components fit when fault domain `f` can
/// take `fits[f]` of them and no column may have two copies in one fault
/// domain. This is the maximum flow of columns -> fault domains -> capacity;
/// by max-flow/min-cut it equals the minimum over `a` in `0..=width` of
/// `(width - a) * copies + sum(min(a, fits[f]))`.
pub fn components_that_fit(width: usize, copies: usize, fits: &[u64]) -> usize {
    (0..=width)
        .map(|a| {
            let spread: u64 = fits.iter().map(|&f| f.min(a as u64)).sum();
            ((width - a) * copies) as u64 + spread
        })
        .min()
        .unwrap_or(0)
        .min((width * copies) as u64) as usize
}

/// The largest free space among disk groups that may hold data, and where.
fn largest_free(
    map: &ClusterMap,
    data: &BTreeMap<FaultDomainId, Vec<Slot>>,
) -> (u64, Option<(HostId, DiskGroupId)>) {
    let mut best: Option<(u64, Slot)> = None;
    for &slot in data.values().flatten() {
        let free = slot_disk_group(map, slot).free_bytes();
        if best.is_none_or(|(b, _)| free > b) {
            best = Some((free, slot));
        }
    }
    match best {
        Some((free, slot)) => (
            free,
            Some((
                slot_host(map, slot).id.clone(),
                slot_disk_group(map, slot).id.clone(),
            )),
        ),
        None => (0, None),
    }
}

/// Places a new volume of `size_bytes` under `policy`.
///
/// Returns a layout whose data components are `size_bytes` split over the
/// policy's stripe width ([`Layout::column_bytes`]) and whose witnesses make
/// the votes work, with ids from `next_component_id`, every component
/// [`ComponentState::Active`] and generation 1. Refuses with the reason when
/// the cluster cannot satisfy the policy.
pub fn place(
    policy: &Policy,
    volume: &VolumeId,
    size_bytes: u64,
    map: &ClusterMap,
    next_component_id: &mut impl FnMut() -> ComponentId,
) -> Result<Layout, PlacementError> {
    policy.validate()?;
    if size_bytes == 0 {
        return Err(PlacementError::EmptyVolume {
            volume: volume.clone(),
        });
    }
    if size_bytes > VOLUME_BYTES_MAX {
        return Err(PlacementError::VolumeTooLarge {
            volume: volume.clone(),
            size_bytes,
        });
    }
    let ftt = policy.failures_to_tolerate;
    let copies = policy.copies();
    let width = usize::from(policy.stripe_width);
    let column_bytes = Layout::column_bytes(size_bytes, width, STRIPE_UNIT_BYTES);
    let reserve = reservation_bytes(column_bytes, policy.space_reservation_pct);

    let witness_slots = slots_by_fault_domain(map, ComponentRole::Witness);
    let needed = 2 * usize::from(ftt) + 1;
    if witness_slots.len() < needed {
        return Err(PlacementError::NotEnoughFaultDomains {
            ftt,
            needed,
            usable: witness_slots.len(),
            total: map.fault_domains().len(),
        });
    }
    let data_slots = slots_by_fault_domain(map, ComponentRole::Data);
    if data_slots.len() < copies {
        return Err(PlacementError::NotEnoughDataFaultDomains {
            ftt,
            copies,
            usable: data_slots.len(),
        });
    }
    let shortfall = |fit: usize| {
        let (largest_free_bytes, largest_free_at) = largest_free(map, &data_slots);
        PlacementError::CapacityShortfall(Box::new(CapacityShortfall {
            volume: volume.clone(),
            size_bytes,
            reservation_pct: policy.space_reservation_pct,
            stripe_width: width,
            copies,
            component_reserve_bytes: reserve,
            components_needed: width * copies,
            components_fit: fit,
            largest_free_bytes,
            largest_free_at,
        }))
    };
    if reserve > 0 {
        let fits: Vec<u64> = data_slots
            .values()
            .map(|slots| {
                // Saturating: a disk group reporting absurd capacity must
                // not wrap the count around.
                slots.iter().fold(0u64, |room, &s| {
                    room.saturating_add(slot_disk_group(map, s).free_bytes() / reserve)
                })
            })
            .collect();
        let fit = components_that_fit(width, copies, &fits);
        if fit < width * copies {
            return Err(shortfall(fit));
        }
    }

    let columns = choose_data_slots(map, &data_slots, width, copies, column_bytes, reserve)
        .ok_or_else(|| shortfall(0))?;
    let witnesses = if ftt == 0 {
        Vec::new()
    } else {
        choose_witness_votes(map, &witness_slots, &columns, usize::from(ftt))
    };

    let component = |slot: Slot, role, votes, size_bytes, id| {
        let host = slot_host(map, slot);
        ComponentPlacement {
            id,
            role,
            host: host.id.clone(),
            disk_group: host.disk_groups[slot.1].id.clone(),
            fault_domain: host.fault_domain.clone(),
            votes,
            size_bytes,
            state: ComponentState::Active,
        }
    };
    let mut layout = Layout {
        volume: volume.clone(),
        size_bytes,
        stripe_unit_bytes: STRIPE_UNIT_BYTES,
        columns: columns
            .iter()
            .map(|slots| Mirror {
                copies: slots
                    .iter()
                    .map(|&s| {
                        component(s, ComponentRole::Data, 1, column_bytes, next_component_id())
                    })
                    .collect(),
            })
            .collect(),
        witnesses: witnesses
            .iter()
            .map(|&(s, votes)| component(s, ComponentRole::Witness, votes, 0, next_component_id()))
            .collect(),
        generation: 1,
    };
    if total_votes(&layout).is_multiple_of(2) {
        // Only FTT=0 gets here (witness votes fix the parity otherwise): a
        // second vote on one component keeps the total odd without a witness
        // that could not add any protection.
        if let Some(first) = layout
            .columns
            .first_mut()
            .and_then(|m| m.copies.first_mut())
        {
            first.votes += 1;
        }
    }
    // Fail stop: a layout that breaks a rule never leaves placement.
    check_layout(&layout, ftt).map_err(|violation| PlacementError::InvalidLayout {
        volume: volume.clone(),
        violation,
    })?;
    Ok(layout)
}

/// How good a fault domain is for the next copy: room for this volume
/// (capped at the columns left), whether its best disk group is unused by
/// the same copy, that disk group's free space after this volume, and the
/// disk group itself (lower ids win ties).
type FaultDomainRank = (u64, bool, u64, Reverse<Slot>);

/// Chooses the disk group of every data component: `width` columns of
/// `copies` slots, or `None` if the greedy runs out of room (which the
/// counting rule in [`place`] rules out beforehand).
fn choose_data_slots(
    map: &ClusterMap,
    data_slots: &BTreeMap<FaultDomainId, Vec<Slot>>,
    width: usize,
    copies: usize,
    column_bytes: u64,
    reserve: u64,
) -> Option<Vec<Vec<Slot>>> {
    // Space this volume already took per disk group: reserved bytes decide
    // whether another component fits, planned bytes (the full component,
    // thin or not) steer the balance so one volume spreads out.
    let mut reserved: BTreeMap<Slot, u64> = BTreeMap::new();
    let mut planned: BTreeMap<Slot, u64> = BTreeMap::new();
    let mut copy_slots: Vec<BTreeSet<Slot>> = vec![BTreeSet::new(); copies];
    let mut columns = Vec::with_capacity(width);
    for column in 0..width {
        let columns_left = (width - column) as u64;
        let mut used_fault_domains: BTreeSet<&FaultDomainId> = BTreeSet::new();
        let mut chosen = Vec::with_capacity(copies);
        for copy_slots_j in copy_slots.iter_mut() {
            let mut best: Option<(FaultDomainRank, &FaultDomainId, Slot)> = None;
            for (fd, slots) in data_slots {
                if used_fault_domains.contains(fd) {
                    continue;
                }
                let mut room = 0u64;
                let mut best_slot: Option<(bool, u64, Reverse<Slot>)> = None;
                for &s in slots {
                    let free = slot_disk_group(map, s).free_bytes();
                    let left = free.saturating_sub(reserved.get(&s).copied().unwrap_or(0));
                    if left < reserve {
                        continue;
                    }
                    room = room.saturating_add(left.checked_div(reserve).unwrap_or(columns_left));
                    let key = (
                        !copy_slots_j.contains(&s),
                        free.saturating_sub(planned.get(&s).copied().unwrap_or(0)),
                        Reverse(s),
                    );
                    if best_slot.is_none_or(|b| key > b) {
                        best_slot = Some(key);
                    }
                }
                let Some((fresh, balance, rs)) = best_slot else {
                    continue;
                };
                let key = (room.min(columns_left), fresh, balance, rs);
                if best.as_ref().is_none_or(|(b, _, _)| key > *b) {
                    best = Some((key, fd, rs.0));
                }
            }
            let (_, fd, slot) = best?;
            used_fault_domains.insert(fd);
            copy_slots_j.insert(slot);
            let r = reserved.entry(slot).or_insert(0);
            *r = r.saturating_add(reserve);
            let p = planned.entry(slot).or_insert(0);
            *p = p.saturating_add(column_bytes);
            chosen.push(slot);
        }
        columns.push(chosen);
    }
    Some(columns)
}

/// Sum of the `n` largest values.
fn heaviest(loads: &BTreeMap<&FaultDomainId, u64>, n: usize) -> u64 {
    let mut v: Vec<u64> = loads.values().copied().collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v.iter().take(n).sum()
}

/// Chooses witness votes per fault domain, then one disk group per witness.
fn choose_witness_votes(
    map: &ClusterMap,
    witness_slots: &BTreeMap<FaultDomainId, Vec<Slot>>,
    columns: &[Vec<Slot>],
    ftt: usize,
) -> Vec<(Slot, u32)> {
    let mut loads: BTreeMap<&FaultDomainId, u64> = witness_slots.keys().map(|f| (f, 0)).collect();
    let data_hosts: BTreeSet<usize> = columns.iter().flatten().map(|s| s.0).collect();
    for &slot in columns.iter().flatten() {
        let fd = &slot_host(map, slot).fault_domain;
        if let Some(load) = loads.get_mut(fd) {
            *load += 1;
        }
    }
    let has_witness_host = |fd: &FaultDomainId| {
        witness_slots[fd]
            .iter()
            .any(|&s| slot_host(map, s).role == HostRole::WitnessOnly)
    };
    let most_free = |fd: &FaultDomainId| {
        witness_slots[fd]
            .iter()
            .map(|&s| slot_disk_group(map, s).free_bytes())
            .max()
            .unwrap_or(0)
    };
    // Each step raises the lightest fault domain by one vote, so after at
    // most (fault domains x heaviest load) steps all are level, and one more
    // fixes the parity (see the module comment).
    let heaviest_load = loads.values().copied().max().unwrap_or(0);
    let step_limit = loads.len() as u64 * (heaviest_load + 1) + 1;
    let mut extra: BTreeMap<&FaultDomainId, u32> = BTreeMap::new();
    for _ in 0..step_limit {
        let total: u64 = loads.values().sum();
        if total % 2 == 1 && 2 * heaviest(&loads, ftt) < total {
            break;
        }
        let Some((&fd, _)) = loads
            .iter()
            .min_by_key(|(fd, &load)| (load, !has_witness_host(fd), Reverse(most_free(fd)), *fd))
        else {
            break;
        };
        if let Some(load) = loads.get_mut(fd) {
            *load += 1;
        }
        *extra.entry(fd).or_insert(0) += 1;
    }
    extra
        .into_iter()
        .filter_map(|(fd, votes)| {
            let slot = witness_slots[fd].iter().copied().max_by_key(|&s| {
                (
                    slot_host(map, s).role == HostRole::WitnessOnly,
                    !data_hosts.contains(&s.0),
                    slot_disk_group(map, s).free_bytes(),
                    Reverse(s),
                )
            })?;
            Some((slot, votes))
        })
        .collect()
}
