//! Reference counts of shared capacity blocks.
//!
//! Owns: for every capacity block more than one index entry (or page
//! instance, or placed write) references, how many references it has
//! beyond the first. A block absent here has one reference, or none if the
//! free-space map shows it free. Must not touch: the free-space map or the
//! index (the state's `add_ref` and `drop_ref` decide with both).
//!
//! Memory is bounded by the capacity, not by how much is shared or by how
//! many snapshots share it: one byte per block of a chunk of
//! [`CHUNK_BLOCKS`] blocks in which some block is shared (allocated when
//! its first block becomes shared, dropped when its last stops being), so
//! at most one byte per 4 KiB of capacity (256 MiB per TiB), and nothing
//! for capacity that holds no shared block. A count past 254 goes to a small
//! map of its own (a block shared by hundreds of snapshots' pages).
//!
//! Invariant: a chunk's `shared` is the number of its nonzero counters; no
//! chunk with `shared == 0` is kept; a counter is [`OVERFLOW`] exactly when
//! the block's count is in `overflow`.

use crate::state::FastMap;
use tessera_format::BlockLoc;

/// Blocks one chunk of counters covers (64 MiB of capacity, 16 KiB of
/// counters).
pub(crate) const CHUNK_BLOCKS: u64 = 16384;

/// A counter's value meaning "the count is in the overflow map".
const OVERFLOW: u8 = u8::MAX;

struct Chunk {
    counts: Box<[u8]>,
    /// Nonzero counters.
    shared: u32,
}

/// References beyond the first of every shared block.
#[derive(Default)]
pub(crate) struct ShareCounts {
    chunks: FastMap<(u8, u64), Chunk>,
    overflow: FastMap<u64, u32>,
}

fn place(loc: BlockLoc) -> ((u8, u64), usize) {
    (
        (loc.device, loc.block / CHUNK_BLOCKS),
        (loc.block % CHUNK_BLOCKS) as usize,
    )
}

impl ShareCounts {
    /// References of `loc` beyond the first (0 for a block not shared).
    pub(crate) fn extra(&self, loc: BlockLoc) -> u32 {
        let (key, i) = place(loc);
        match self.chunks.get(&key).map(|c| c.counts[i]) {
            None | Some(0) => 0,
            Some(OVERFLOW) => self.overflow.get(&loc.pack(0)).copied().unwrap_or(0),
            Some(n) => n as u32,
        }
    }

    /// Whether `loc` has more than one reference.
    pub(crate) fn is_shared(&self, loc: BlockLoc) -> bool {
        self.extra(loc) > 0
    }

    /// One more reference beyond the first to `loc`.
    pub(crate) fn add(&mut self, loc: BlockLoc) {
        let (key, i) = place(loc);
        let chunk = self.chunks.entry(key).or_insert_with(|| Chunk {
            counts: vec![0u8; CHUNK_BLOCKS as usize].into_boxed_slice(),
            shared: 0,
        });
        match chunk.counts[i] {
            0 => {
                chunk.counts[i] = 1;
                chunk.shared += 1;
            }
            OVERFLOW => *self.overflow.entry(loc.pack(0)).or_insert(0) += 1,
            n if n + 1 == OVERFLOW => {
                chunk.counts[i] = OVERFLOW;
                self.overflow.insert(loc.pack(0), OVERFLOW as u32);
            }
            n => chunk.counts[i] = n + 1,
        }
    }

    /// Lets go of one reference beyond the first to `loc`; false (and
    /// nothing changes) when it has none beyond the first.
    pub(crate) fn release(&mut self, loc: BlockLoc) -> bool {
        let (key, i) = place(loc);
        let Some(chunk) = self.chunks.get_mut(&key) else {
            return false;
        };
        match chunk.counts[i] {
            0 => return false,
            OVERFLOW => {
                let packed = loc.pack(0);
                let n = self
                    .overflow
                    .get_mut(&packed)
                    .expect("an overflowed count is in the map");
                *n -= 1;
                if *n < OVERFLOW as u32 {
                    chunk.counts[i] = *n as u8;
                    self.overflow.remove(&packed);
                }
            }
            n => chunk.counts[i] = n - 1,
        }
        if chunk.counts[i] == 0 {
            chunk.shared -= 1;
            if chunk.shared == 0 {
                self.chunks.remove(&key);
            }
        }
        true
    }

    /// Every shared block with its references beyond the first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (BlockLoc, u32)> + '_ {
        self.chunks
            .iter()
            .flat_map(move |(&(device, chunk_no), chunk)| {
                chunk
                    .counts
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| **n > 0)
                    .map(move |(i, _)| {
                        let loc = BlockLoc {
                            device,
                            block: chunk_no * CHUNK_BLOCKS + i as u64,
                        };
                        (loc, self.extra(loc))
                    })
            })
    }

    /// Memory the counters take.
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.chunks.len() as u64 * (CHUNK_BLOCKS + 64) + self.overflow.len() as u64 * 24
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// Against a plain map of counts: every add and release agrees,
        /// counts past the byte's range included, and chunks go when their
        /// last shared block does.
        #[test]
        fn counts_agree_with_a_map(ops in proptest::collection::vec((any::<bool>(), 0u8..2, 0u64..40_000, 1usize..300), 1..200)) {
            let mut shares = ShareCounts::default();
            let mut model: BTreeMap<(u8, u64), u32> = BTreeMap::new();
            for (add, device, block, times) in ops {
                let loc = BlockLoc { device, block };
                for _ in 0..times {
                    if add {
                        shares.add(loc);
                        *model.entry((device, block)).or_insert(0) += 1;
                    } else {
                        let had = model.get(&(device, block)).copied().unwrap_or(0) > 0;
                        prop_assert_eq!(shares.release(loc), had);
                        if had {
                            let n = model.get_mut(&(device, block)).unwrap();
                            *n -= 1;
                            if *n == 0 {
                                model.remove(&(device, block));
                            }
                        }
                    }
                }
                prop_assert_eq!(shares.extra(loc), model.get(&(device, block)).copied().unwrap_or(0));
            }
            let listed: BTreeMap<(u8, u64), u32> = shares.iter().map(|(l, n)| ((l.device, l.block), n)).collect();
            prop_assert_eq!(&listed, &model);
            let chunks: std::collections::BTreeSet<(u8, u64)> = model.keys().map(|(d, b)| (*d, b / CHUNK_BLOCKS)).collect();
            prop_assert_eq!(shares.chunks.len(), chunks.len());
            for chunk in shares.chunks.values() {
                prop_assert_eq!(chunk.shared as usize, chunk.counts.iter().filter(|n| **n > 0).count());
            }
        }
    }
}
