//! The dirty-region record an owner keeps in the directory, so a copy that
//! is away can be brought back by a later owner with a delta resync.
//!
//! Owns: [`RecordedDirty`], a coarse map of the column blocks one copy may
//! have missed (whole regions of at least 1 MiB, at most
//! [`RECORDED_REGIONS_MAX`] per copy, so a record stays a few KiB whatever the
//! volume's size), [`ColumnIntent`], the regions of a column with changes
//! under way (write intents: its copies may differ there if the owner dies),
//! and [`DirtyRecord`], one volume's maps.
//! Must not touch: where the record is stored or when it is written (the
//! coordinator writes it through its layout recorder).
//!
//! Invariants: marking only ever adds blocks; a map answers `covers` for a
//! range only when every block of it is marked; a map that does not fit the
//! component it names (another size, a malformed bit vector) is never
//! trusted: [`RecordedDirty::fits`] says so and the reader resyncs the whole
//! copy instead.

use crate::{ComponentId, VolumeId};
use serde::{Deserialize, Serialize};

/// The most regions one copy's map has: 4,096 bits, 512 bytes of bitmap.
pub const RECORDED_REGIONS_MAX: u64 = 4096;

/// The smallest region: 1 MiB of column blocks.
pub const RECORDED_REGION_MIN_BLOCKS: u64 = 256;

/// Which regions of one copy's column may differ from its Active copies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedDirty {
    /// Column blocks (4 KiB) of the copy.
    pub blocks: u64,
    /// Column blocks per region.
    pub region_blocks: u64,
    /// One bit per region, region `r` in bit `r % 64` of word `r / 64`.
    pub bits: Vec<u64>,
}

impl RecordedDirty {
    /// The region size for a copy of `blocks` column blocks.
    pub fn region_blocks_for(blocks: u64) -> u64 {
        RECORDED_REGION_MIN_BLOCKS.max(blocks.div_ceil(RECORDED_REGIONS_MAX))
    }

    /// Nothing marked, for a copy of `blocks` column blocks.
    pub fn empty(blocks: u64) -> Self {
        let region_blocks = Self::region_blocks_for(blocks);
        let regions = blocks.div_ceil(region_blocks);
        RecordedDirty {
            blocks,
            region_blocks,
            bits: vec![0; regions.div_ceil(64) as usize],
        }
    }

    /// Every block marked: what a copy missed is unknown.
    pub fn whole(blocks: u64) -> Self {
        let mut map = Self::empty(blocks);
        map.mark(0, blocks);
        map
    }

    /// Whether this map was made for a copy of `blocks` column blocks and
    /// is well formed.
    pub fn fits(&self, blocks: u64) -> bool {
        self.blocks == blocks
            && self.region_blocks == Self::region_blocks_for(blocks)
            && self.bits.len() as u64 == self.regions().div_ceil(64)
    }

    fn regions(&self) -> u64 {
        self.blocks.div_ceil(self.region_blocks.max(1))
    }

    /// The regions `[first, end)` blocks `[start, start+count)` touch,
    /// clipped to the copy.
    fn region_span(&self, start: u64, count: u64) -> (u64, u64) {
        let end = start.saturating_add(count).min(self.blocks);
        if count == 0 || start >= end {
            return (0, 0);
        }
        (start / self.region_blocks, end.div_ceil(self.region_blocks))
    }

    fn is_set(&self, region: u64) -> bool {
        self.bits
            .get((region / 64) as usize)
            .is_some_and(|w| w & (1 << (region % 64)) != 0)
    }

    /// Marks every region blocks `[start, start+count)` touch; says whether
    /// a region was added.
    pub fn mark(&mut self, start: u64, count: u64) -> bool {
        let (first, end) = self.region_span(start, count);
        let mut added = false;
        for r in first..end {
            if let Some(w) = self.bits.get_mut((r / 64) as usize) {
                let bit = 1 << (r % 64);
                added |= *w & bit == 0;
                *w |= bit;
            }
        }
        added
    }

    /// Whether no region is marked.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|w| *w == 0)
    }

    /// Whether every block of `[start, start+count)` is marked (blocks past
    /// the copy's end count as marked: no write reaches them).
    pub fn covers(&self, start: u64, count: u64) -> bool {
        let (first, end) = self.region_span(start, count);
        (first..end).all(|r| self.is_set(r))
    }

    /// Clears the regions for which `clean(first_block, blocks)` holds.
    pub fn clear_where(&mut self, mut clean: impl FnMut(u64, u64) -> bool) {
        for r in 0..self.regions() {
            if self.is_set(r) {
                let first = r * self.region_blocks;
                let blocks = self.region_blocks.min(self.blocks - first);
                if clean(first, blocks) {
                    self.bits[(r / 64) as usize] &= !(1 << (r % 64));
                }
            }
        }
    }

    /// The marked block ranges `(start, count)`, neighbours merged, clipped
    /// to the copy.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for r in (0..self.regions()).filter(|&r| self.is_set(r)) {
            let start = r * self.region_blocks;
            let count = self.region_blocks.min(self.blocks - start);
            match out.last_mut() {
                Some((s, c)) if *s + *c == start => *c += count,
                _ => out.push((start, count)),
            }
        }
        out
    }

    /// Marked blocks.
    pub fn marked_blocks(&self) -> u64 {
        self.ranges().iter().map(|(_, c)| c).sum()
    }
}

/// One copy's entry in a [`DirtyRecord`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentDirty {
    /// The copy.
    pub component: ComponentId,
    /// What it may have missed.
    pub regions: RecordedDirty,
}

/// The regions of one column (stripe) that changes were under way in:
/// the owner had sent them to some copies and not yet heard every copy's
/// answer, so if it died the column's copies may differ there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnIntent {
    /// The column, counted from 0 in the layout's order.
    pub column: u32,
    /// The regions, on the scale of a copy of the column.
    pub regions: RecordedDirty,
}

/// The dirty-region maps of one volume's copies that are behind, as its
/// owner last recorded them: a copy that is Absent or Resyncing in the
/// layout and has an entry here missed at most the entry's regions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirtyRecord {
    /// The volume.
    pub volume: VolumeId,
    /// One entry per copy that is behind, ordered by component.
    pub components: Vec<ComponentDirty>,
    /// Write intents: per column, the regions changes may have been under
    /// way in, ordered by column. A later owner makes the copies agree
    /// there before it reads from more than one of them. Records written
    /// before write intents existed have none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub intents: Vec<ColumnIntent>,
}

impl DirtyRecord {
    /// The recorded map of `component`, if it has one.
    pub fn get(&self, component: ComponentId) -> Option<&RecordedDirty> {
        self.components
            .iter()
            .find(|c| c.component == component)
            .map(|c| &c.regions)
    }

    /// The write intents of `column`, if it has any.
    pub fn intent(&self, column: usize) -> Option<&RecordedDirty> {
        self.intents
            .iter()
            .find(|c| c.column as usize == column)
            .map(|c| &c.regions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn regions_are_at_least_one_mib_and_at_most_4096_per_copy() {
        assert_eq!(RecordedDirty::region_blocks_for(65_536), 256);
        assert_eq!(RecordedDirty::region_blocks_for(1 << 28), (1 << 28) / 4096);
        let map = RecordedDirty::whole(1 << 28);
        assert_eq!(map.bits.len(), 64);
        assert!(map.fits(1 << 28));
        assert!(!map.fits(1 << 27));
    }

    #[test]
    fn a_record_reads_back_from_json() {
        let mut regions = RecordedDirty::empty(10_000);
        regions.mark(300, 1);
        let record = DirtyRecord {
            volume: VolumeId("vm".into()),
            components: vec![ComponentDirty {
                component: ComponentId(7),
                regions,
            }],
            intents: Vec::new(),
        };
        let text = serde_json::to_string(&record).unwrap();
        let back: DirtyRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(back, record);
        assert_eq!(back.get(ComponentId(7)).unwrap().ranges(), vec![(256, 256)]);
        // A record without write intents leaves the field out, and one
        // written before they existed reads as having none.
        assert!(!text.contains("intents"));
        let mut with = record.clone();
        let mut regions = RecordedDirty::empty(10_000);
        regions.mark(9_999, 1);
        with.intents.push(ColumnIntent { column: 1, regions });
        let back: DirtyRecord =
            serde_json::from_str(&serde_json::to_string(&with).unwrap()).unwrap();
        assert_eq!(back.intent(1).unwrap().ranges(), vec![(9_984, 16)]);
        assert!(back.intent(0).is_none());
    }

    proptest! {
        /// Every marked block is covered and listed, and clearing removes
        /// exactly the regions asked for.
        #[test]
        fn marks_cover_what_was_marked(
            blocks in 1u64..5_000_000,
            marks in proptest::collection::vec((0u64..5_000_000, 1u64..3_000), 0..40),
        ) {
            let mut map = RecordedDirty::empty(blocks);
            for &(s, c) in &marks {
                map.mark(s, c);
            }
            let ranges = map.ranges();
            for &(s, c) in &marks {
                prop_assert!(map.covers(s, c));
                let end = (s + c).min(blocks);
                for b in [s, end.saturating_sub(1)] {
                    if s <= b && b < end {
                        prop_assert!(ranges.iter().any(|&(rs, rc)| rs <= b && b < rs + rc));
                    }
                }
            }
            prop_assert_eq!(map.marked_blocks(), ranges.iter().map(|r| r.1).sum::<u64>());
            prop_assert!(ranges.iter().all(|&(s, c)| s + c <= blocks));
            let region = map.region_blocks;
            map.clear_where(|first, _| (first / region).is_multiple_of(2));
            prop_assert!(map.ranges().iter().all(|&(s, c)| !(s / region).is_multiple_of(2) && c <= region));
            map.clear_where(|_, _| true);
            prop_assert_eq!(map.marked_blocks(), 0);
        }
    }
}
