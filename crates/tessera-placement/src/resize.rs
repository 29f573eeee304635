//! Growing a placed volume in place.
//!
//! Owns: [`resize_layout`], the check that every data component can grow on
//! the disk group it already lives on. Must not touch: data movement (a
//! grown component only gains address space, which reads as zeroes like any
//! unwritten range) or placement of new components (a volume keeps its
//! components when it grows).
//!
//! Rules: volumes only grow (a guest file system would lose data if its block
//! device shrank under it); every component must be reachable, because a copy
//! that misses the new size could not serve the new range later; a reserved
//! volume needs the extra reservation free on each disk group, summed over
//! the volume's components there.

use crate::check::check_layout;
use crate::cluster::{reservation_bytes, ClusterMap, DiskGroupHealth};
use crate::error::PlacementError;
use crate::place::VOLUME_BYTES_MAX;
use std::collections::BTreeMap;
use tessera_types::layout::{ComponentRole, Layout};
use tessera_types::policy::Policy;
use tessera_types::{DiskGroupId, HostId};

/// The layout of `layout`'s volume grown to `new_size_bytes` under `policy`:
/// the same components with the new column size and the generation raised.
/// The same size returns the layout unchanged.
pub fn resize_layout(
    policy: &Policy,
    layout: &Layout,
    new_size_bytes: u64,
    map: &ClusterMap,
) -> Result<Layout, PlacementError> {
    policy.validate()?;
    let volume = layout.volume.clone();
    let copies = layout.columns.first().map(|m| m.copies.len()).unwrap_or(0);
    let ftt = u8::try_from(copies.saturating_sub(1)).unwrap_or(u8::MAX);
    check_layout(layout, ftt).map_err(|violation| PlacementError::InvalidLayout {
        volume: volume.clone(),
        violation,
    })?;
    if new_size_bytes < layout.size_bytes {
        return Err(PlacementError::ShrinkRefused {
            volume,
            size_bytes: layout.size_bytes,
            new_size_bytes,
        });
    }
    if new_size_bytes > VOLUME_BYTES_MAX {
        return Err(PlacementError::VolumeTooLarge {
            volume,
            size_bytes: new_size_bytes,
        });
    }
    if new_size_bytes == layout.size_bytes {
        return Ok(layout.clone());
    }
    for c in layout.components() {
        let reachable = map.host(&c.host).is_some_and(|h| {
            h.is_live()
                && h.disk_group(&c.disk_group)
                    .is_some_and(|d| d.health != DiskGroupHealth::Failed)
        });
        if !reachable {
            return Err(PlacementError::ResizeNeedsEveryComponent {
                volume,
                component: c.id,
                host: c.host.clone(),
            });
        }
    }
    let width = layout.columns.len();
    let old_column = layout.columns[0].copies.first().map_or(0, |c| c.size_bytes);
    let new_column = Layout::column_bytes(new_size_bytes, width, layout.stripe_unit_bytes);
    let pct = policy.space_reservation_pct;
    let extra_each =
        reservation_bytes(new_column, pct).saturating_sub(reservation_bytes(old_column, pct));
    let mut extra: BTreeMap<(&HostId, &DiskGroupId), u64> = BTreeMap::new();
    for c in layout
        .components()
        .filter(|c| c.role == ComponentRole::Data)
    {
        let e = extra.entry((&c.host, &c.disk_group)).or_insert(0);
        *e = e.saturating_add(extra_each);
    }
    for ((host, dg), needed_bytes) in extra {
        let free_bytes = map.disk_group(host, dg).map_or(0, |d| d.free_bytes());
        if needed_bytes > free_bytes {
            return Err(PlacementError::GrowthShortfall {
                volume,
                new_size_bytes,
                host: host.clone(),
                disk_group: dg.clone(),
                needed_bytes,
                free_bytes,
            });
        }
    }
    let mut grown = layout.clone();
    grown.size_bytes = new_size_bytes;
    for c in grown.components_mut() {
        if c.role == ComponentRole::Data {
            c.size_bytes = new_column;
        }
    }
    grown.generation = grown.generation.saturating_add(1);
    Ok(grown)
}
