//! Layouts: where an object's components live.
//!
//! Owns: the [`Layout`] tree (a RAID-0 of stripe columns, each column a
//! RAID-1 mirror of data components, plus witness components), component
//! states, and the quorum rule. Must not touch: how a layout is chosen
//! (`tessera-placement`) or how components are reached (`tessera-object`).
//!
//! Invariants:
//! - every column has the same number of copies and every data component of
//!   a layout has the same `size_bytes` (the column size);
//! - the object is accessible only when more than half of all votes are on
//!   usable components *and* every column has at least one usable copy
//!   ([`Layout::has_quorum`]); with an odd vote total two partitions can never
//!   both be accessible.

use crate::{ComponentId, DiskGroupId, FaultDomainId, HostId, VolumeId, BLOCK_BYTES};
use serde::{Deserialize, Serialize};

/// Bytes of one stripe unit: consecutive bytes of a volume that land on one
/// column before the next column is used. 1 MiB as in vSAN.
pub const STRIPE_UNIT_BYTES: u64 = 1 << 20;

/// What a component holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ComponentRole {
    /// A full copy of one stripe column's data.
    Data,
    /// Votes only, no data: breaks ties between partitions.
    Witness,
}

/// The life of a component, as the object's owner records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ComponentState {
    /// Up to date and receiving every write.
    Active,
    /// Its host is unreachable; changed ranges are tracked for a delta resync.
    Absent,
    /// Reachable again (or newly created) and being brought up to date.
    Resyncing,
    /// Lost for good (device failed, or absent past the repair delay); a
    /// replacement is or will be built elsewhere.
    Degraded,
}

/// One component and where it lives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentPlacement {
    /// Its identity.
    pub id: ComponentId,
    /// Data copy or witness.
    pub role: ComponentRole,
    /// The host that stores it.
    pub host: HostId,
    /// The disk group on that host.
    pub disk_group: DiskGroupId,
    /// The host's fault domain (copied here so quorum checks need no cluster map).
    pub fault_domain: FaultDomainId,
    /// Votes it carries in the quorum rule.
    pub votes: u32,
    /// Bytes of address space (0 for witnesses).
    pub size_bytes: u64,
    /// Its state.
    pub state: ComponentState,
}

/// One stripe column: FTT+1 copies of the same bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mirror {
    /// The copies.
    pub copies: Vec<ComponentPlacement>,
}

/// Where an object's bytes live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// The object.
    pub volume: VolumeId,
    /// The object's size in bytes.
    pub size_bytes: u64,
    /// Bytes per stripe unit.
    pub stripe_unit_bytes: u64,
    /// The stripe columns, in order.
    pub columns: Vec<Mirror>,
    /// Witness components.
    pub witnesses: Vec<ComponentPlacement>,
    /// Raised on every change to the layout, so readers can tell two apart.
    pub generation: u64,
}

/// A piece of a volume range mapped onto one column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnExtent {
    /// Column index.
    pub column: usize,
    /// Byte offset inside the column's components.
    pub component_offset: u64,
    /// Byte offset inside the request buffer.
    pub buffer_offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Layout {
    /// Every component, data and witness.
    pub fn components(&self) -> impl Iterator<Item = &ComponentPlacement> {
        self.columns
            .iter()
            .flat_map(|m| m.copies.iter())
            .chain(self.witnesses.iter())
    }

    /// Mutable access to every component.
    pub fn components_mut(&mut self) -> impl Iterator<Item = &mut ComponentPlacement> {
        self.columns
            .iter_mut()
            .flat_map(|m| m.copies.iter_mut())
            .chain(self.witnesses.iter_mut())
    }

    /// The component with `id`, if it is part of this layout.
    pub fn component(&self, id: ComponentId) -> Option<&ComponentPlacement> {
        self.components().find(|c| c.id == id)
    }

    /// Sum of all votes.
    pub fn total_votes(&self) -> u32 {
        self.components().map(|c| c.votes).sum()
    }

    /// Bytes each data component holds for a volume of `size_bytes` over
    /// `width` columns: whole stripe units, so every column has the same size.
    pub fn column_bytes(size_bytes: u64, width: usize, stripe_unit_bytes: u64) -> u64 {
        let width = width.max(1) as u64;
        let stripe_bytes = width * stripe_unit_bytes;
        size_bytes.div_ceil(stripe_bytes) * stripe_unit_bytes
    }

    /// The vSAN rule: accessible when more than half of the votes are on
    /// components for which `usable` holds, and every column has a usable copy.
    pub fn has_quorum(&self, usable: impl Fn(&ComponentPlacement) -> bool) -> bool {
        let total = self.total_votes();
        let present: u32 = self
            .components()
            .filter(|c| usable(c))
            .map(|c| c.votes)
            .sum();
        let whole_copy = self.columns.iter().all(|m| m.copies.iter().any(&usable));
        2 * present > total && whole_copy
    }

    /// Splits the volume byte range `[offset, offset+len)` into per-column
    /// pieces, in volume order.
    pub fn map_range(&self, offset: u64, len: u64) -> Vec<ColumnExtent> {
        let width = self.columns.len().max(1) as u64;
        let unit = self.stripe_unit_bytes.max(BLOCK_BYTES);
        let mut out = Vec::new();
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let unit_index = pos / unit;
            let within = pos % unit;
            let step = (unit - within).min(end - pos);
            let column = (unit_index % width) as usize;
            let row = unit_index / width;
            out.push(ColumnExtent {
                column,
                component_offset: row * unit + within,
                buffer_offset: pos - offset,
                len: step,
            });
            pos += step;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn placement(id: u64, role: ComponentRole, fd: &str, votes: u32) -> ComponentPlacement {
        ComponentPlacement {
            id: ComponentId(id),
            role,
            host: HostId(format!("h{id}")),
            disk_group: DiskGroupId("dg0".into()),
            fault_domain: FaultDomainId(fd.into()),
            votes,
            size_bytes: 0,
            state: ComponentState::Active,
        }
    }

    fn ftt1() -> Layout {
        Layout {
            volume: VolumeId("v".into()),
            size_bytes: 1 << 30,
            stripe_unit_bytes: STRIPE_UNIT_BYTES,
            columns: vec![Mirror {
                copies: vec![
                    placement(1, ComponentRole::Data, "a", 1),
                    placement(2, ComponentRole::Data, "b", 1),
                ],
            }],
            witnesses: vec![placement(3, ComponentRole::Witness, "c", 1)],
            generation: 1,
        }
    }

    #[test]
    fn quorum_needs_majority_and_a_whole_copy() {
        let layout = ftt1();
        assert!(layout.has_quorum(|_| true));
        assert!(layout.has_quorum(|c| c.id != ComponentId(1)));
        assert!(layout.has_quorum(|c| c.id != ComponentId(3)));
        // One vote of three is no majority.
        assert!(!layout.has_quorum(|c| c.id == ComponentId(3)));
        // Both data copies without the witness: majority and copies.
        assert!(layout.has_quorum(|c| c.role == ComponentRole::Data));
        // Witness and nothing else: no copy of the data.
        assert!(!layout.has_quorum(|c| c.role == ComponentRole::Witness));
    }

    proptest! {
        #[test]
        fn map_range_covers_request_exactly(width in 1usize..5, offset in 0u64..(64 << 20), len in 1u64..(8 << 20)) {
            let mut layout = ftt1();
            layout.columns = (0..width).map(|_| layout.columns[0].clone()).collect();
            let pieces = layout.map_range(offset, len);
            let mut expect = 0;
            for p in &pieces {
                prop_assert_eq!(p.buffer_offset, expect);
                prop_assert!(p.column < width);
                prop_assert!(p.len > 0);
                expect += p.len;
            }
            prop_assert_eq!(expect, len);
        }
    }
}
