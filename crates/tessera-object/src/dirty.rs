//! Dirty-region maps: which blocks of a component changed while it was away.
//!
//! Owns: a set of block ranges with merge-on-insert, bounded in memory.
//! Must not touch: I/O. Invariant: every block written to a column while one
//! of its copies was absent is inside that copy's map until a resync has
//! copied it (over-approximation is allowed, loss is not): when the number of
//! ranges passes [`DIRTY_RANGES_MAX`], neighbouring ranges are merged, which
//! only ever adds blocks.

use std::collections::BTreeMap;

/// Ranges kept before coarsening; bounds memory to a few tens of MiB per
/// absent component whatever the write pattern.
pub const DIRTY_RANGES_MAX: usize = 1 << 20;

/// A set of block ranges `[start, end)` in units of 4 KiB blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyRegions {
    /// start -> end, non-overlapping, non-adjacent.
    ranges: BTreeMap<u64, u64>,
    limit: usize,
}

impl Default for DirtyRegions {
    fn default() -> Self {
        Self::new()
    }
}

impl DirtyRegions {
    /// An empty map with the default bound.
    pub fn new() -> Self {
        Self::with_limit(DIRTY_RANGES_MAX)
    }

    /// An empty map that coarsens past `limit` ranges.
    pub fn with_limit(limit: usize) -> Self {
        DirtyRegions {
            ranges: BTreeMap::new(),
            limit: limit.max(1),
        }
    }

    /// A map holding every block of `[0, blocks)`: a full resync.
    pub fn whole(blocks: u64) -> Self {
        let mut map = Self::new();
        map.insert(0, blocks);
        map
    }

    /// Marks `[start, start+count)` dirty.
    pub fn insert(&mut self, start: u64, count: u64) {
        if count == 0 {
            return;
        }
        let mut start = start;
        let mut end = start + count;
        // Absorb a range that starts before us and touches us.
        if let Some((&s, &e)) = self.ranges.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.ranges.remove(&s);
            }
        }
        // Absorb every range that starts inside or right after us.
        while let Some((&s, &e)) = self.ranges.range(start..=end).next() {
            end = end.max(e);
            self.ranges.remove(&s);
        }
        self.ranges.insert(start, end);
        if self.ranges.len() > self.limit {
            self.coarsen();
        }
    }

    /// Removes `[start, start+count)` (copied by a resync).
    pub fn remove(&mut self, start: u64, count: u64) {
        let end = start + count;
        let overlapping: Vec<(u64, u64)> = self
            .ranges
            .range(..end)
            .filter(|(_, &e)| e > start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in overlapping {
            self.ranges.remove(&s);
            if s < start {
                self.ranges.insert(s, start);
            }
            if e > end {
                self.ranges.insert(end, e);
            }
        }
        if self.ranges.len() > self.limit {
            self.coarsen();
        }
    }

    /// Whether block `block` is dirty.
    pub fn contains(&self, block: u64) -> bool {
        self.ranges
            .range(..=block)
            .next_back()
            .is_some_and(|(_, &e)| e > block)
    }

    /// Whether any block of `[start, start+count)` is dirty.
    pub fn any_in(&self, start: u64, count: u64) -> bool {
        let end = start.saturating_add(count);
        count > 0
            && self
                .ranges
                .range(..end)
                .next_back()
                .is_some_and(|(_, &e)| e > start)
    }

    /// Total dirty blocks.
    pub fn blocks(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    /// Number of ranges held.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// No dirty blocks.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The ranges as `(start, count)`, in order.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&s, &e)| (s, e - s))
    }

    /// The first range, split to at most `max_blocks`.
    pub fn first(&self, max_blocks: u64) -> Option<(u64, u64)> {
        self.ranges
            .iter()
            .next()
            .map(|(&s, &e)| (s, (e - s).min(max_blocks.max(1))))
    }

    /// The first dirty range at or after block `from` (a range that
    /// begins before `from` and reaches past it counts from `from`), split
    /// to at most `max_blocks`.
    pub fn first_from(&self, from: u64, max_blocks: u64) -> Option<(u64, u64)> {
        let straddling = self
            .ranges
            .range(..from)
            .next_back()
            .filter(|(_, &e)| e > from)
            .map(|(_, &e)| (from, e));
        straddling
            .or_else(|| self.ranges.range(from..).next().map(|(&s, &e)| (s, e)))
            .map(|(s, e)| (s, (e - s).min(max_blocks.max(1))))
    }

    /// Halves the number of ranges by merging each pair of neighbours (and
    /// the gap between them): more blocks to resync, bounded memory.
    fn coarsen(&mut self) {
        while self.ranges.len() > self.limit {
            let old: Vec<(u64, u64)> = self.ranges.iter().map(|(&s, &e)| (s, e)).collect();
            self.ranges.clear();
            for pair in old.chunks(2) {
                let start = pair[0].0;
                let end = pair[pair.len() - 1].1;
                self.ranges.insert(start, end);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        /// The map agrees with a set of blocks, and never loses a dirty block
        /// even when coarsening.
        #[test]
        fn agrees_with_block_set(ops in proptest::collection::vec((any::<bool>(), 0u64..512, 1u64..40), 1..200), limit in 1usize..16) {
            let mut exact = DirtyRegions::new();
            let mut bounded = DirtyRegions::with_limit(limit);
            let mut model = BTreeSet::new();
            for (insert, start, count) in ops {
                if insert {
                    exact.insert(start, count);
                    bounded.insert(start, count);
                    model.extend(start..start + count);
                } else {
                    exact.remove(start, count);
                    bounded.remove(start, count);
                    for b in start..start + count { model.remove(&b); }
                }
                prop_assert!(bounded.len() <= limit);
            }
            prop_assert_eq!(exact.blocks(), model.len() as u64);
            for from in [0u64, 1, 7, 100, 333, 511, 600] {
                let first = model.range(from..).next().copied();
                let got = exact.first_from(from, 5);
                prop_assert_eq!(got.map(|(s, _)| s), first);
                if let Some((s, n)) = got {
                    prop_assert!((1..=5).contains(&n));
                    prop_assert!((s..s + n).all(|b| model.contains(&b)));
                }
            }
            for b in 0..600 {
                prop_assert_eq!(exact.contains(b), model.contains(&b));
                prop_assert_eq!(exact.any_in(b, 7), (b..b + 7).any(|x| model.contains(&x)));
                if model.contains(&b) { prop_assert!(bounded.contains(b)); }
            }
            // Ranges are ordered, non-overlapping and non-adjacent.
            let ranges: Vec<_> = exact.ranges().collect();
            for w in ranges.windows(2) {
                prop_assert!(w[0].0 + w[0].1 < w[1].0);
            }
        }
    }
}
