//! Free-space map of the capacity devices, one bit per 4 KiB block.
//!
//! Owns: which data-area blocks are in use. It is derived at mount from the
//! committed index (every mapped entry and every index page slot) and kept in
//! memory; it is never written to disk, so it cannot disagree with the index.
//! Memory: one bit per capacity block (32 KiB per GiB of capacity), set by the
//! device sizes in the configuration, not by the data written.
//! Invariant: a block is handed out only when no committed index page and no
//! in-memory page refers to it; blocks released by an index change go back
//! only after the checkpoint that drops the reference is durable (the caller
//! holds them until then).
//! Invariant: with a content cache attached (the running store's), every
//! block that changes state here loses its cache entry first: a block handed
//! out (`allocate`, `allocate_pair`, a free block marked used) before the
//! caller can write it, a block taken back (`free`) before it can be handed
//! out again (see `crate::content`).

use crate::content::ContentCache;
use std::sync::Arc;
use tessera_format::BlockLoc;

/// What one more reference to a block found while rebuilding the map means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reference {
    /// The block's first reference: now marked used.
    First,
    /// A further reference that sharing allows (the block is shared).
    Extra,
    /// A reference the format forbids: a block of two plain entries, a data
    /// block inside an index page slot, or outside every data area.
    Bad,
}

/// Counts the references of the committed index while the free-space map is
/// rebuilt (at mount and by the offline check). A block may be referenced by
/// any number of shared entries and at most one plain one.
#[derive(Default)]
pub(crate) struct ReferenceCount {
    page_slots: std::collections::HashSet<u64>,
    shared: std::collections::HashSet<u64>,
}

impl ReferenceCount {
    /// Marks an index page slot used; false if it was taken already.
    pub(crate) fn page_slot(&mut self, alloc: &mut Allocator, loc: BlockLoc) -> bool {
        self.page_slots.insert(loc.pack(0));
        alloc.mark_used(loc)
    }

    /// Counts a data block reference of an entry (`shared`: of kind shared).
    pub(crate) fn data(&mut self, alloc: &mut Allocator, loc: BlockLoc, shared: bool) -> Reference {
        let key = loc.pack(0);
        let seen_shared = if shared {
            !self.shared.insert(key)
        } else {
            self.shared.contains(&key)
        };
        if alloc.mark_used(loc) {
            Reference::First
        } else if alloc.contains(loc) && !self.page_slots.contains(&key) && (shared || seen_shared)
        {
            Reference::Extra
        } else {
            Reference::Bad
        }
    }
}

/// Free-space bitmap of one capacity device.
struct DeviceMap {
    device: u8,
    first: u64,
    blocks: u64,
    words: Vec<u64>,
    used: u64,
    /// Where [`Allocator::allocate`] goes on looking.
    cursor: u64,
    /// No block below it is free (a hint [`Allocator::allocate_lowest`]
    /// starts from, lowered by every block freed).
    low: u64,
    failed: bool,
}

/// Where an allocation starts looking on each device.
#[derive(Clone, Copy)]
enum From {
    /// Where the last allocation of this kind stopped.
    Cursor,
    /// At the lowest free block.
    Lowest,
}

/// Free-space maps of all capacity devices.
pub(crate) struct Allocator {
    devices: Vec<DeviceMap>,
    next_device: usize,
    /// The read cache whose entries follow the blocks' states.
    content: Option<Arc<ContentCache>>,
}

impl Allocator {
    /// `areas`: (device index, first data block, data blocks).
    pub(crate) fn new(areas: &[(u8, u64, u64)]) -> Allocator {
        Allocator {
            devices: areas
                .iter()
                .map(|&(device, first, blocks)| DeviceMap {
                    device,
                    first,
                    blocks,
                    words: vec![0; blocks.div_ceil(64) as usize],
                    used: 0,
                    cursor: 0,
                    low: 0,
                    failed: false,
                })
                .collect(),
            next_device: 0,
            content: None,
        }
    }

    /// From now on, blocks handed out or taken back lose their entries in
    /// `cache` (attached once the map is rebuilt at mount).
    pub(crate) fn attach_content_cache(&mut self, cache: Arc<ContentCache>) {
        self.content = Some(cache);
    }

    fn map(&mut self, device: u8) -> Option<&mut DeviceMap> {
        self.devices.iter_mut().find(|d| d.device == device)
    }

    /// Marks `loc` used (at mount). Returns false if it was already used or is
    /// outside every data area: the index refers to it twice or wrongly.
    pub(crate) fn mark_used(&mut self, loc: BlockLoc) -> bool {
        let marked = self.mark_used_quietly(loc);
        if marked {
            if let Some(c) = &self.content {
                c.invalidate([loc]);
            }
        }
        marked
    }

    fn mark_used_quietly(&mut self, loc: BlockLoc) -> bool {
        let Some(d) = self.map(loc.device) else {
            return false;
        };
        if loc.block < d.first || loc.block >= d.first + d.blocks {
            return false;
        }
        let i = loc.block - d.first;
        let (w, b) = ((i / 64) as usize, i % 64);
        if d.words[w] & (1 << b) != 0 {
            return false;
        }
        d.words[w] |= 1 << b;
        d.used += 1;
        true
    }

    /// True if `loc` is marked used.
    pub(crate) fn is_used(&self, loc: BlockLoc) -> bool {
        self.devices.iter().any(|d| {
            d.device == loc.device
                && loc.block >= d.first
                && loc.block < d.first + d.blocks
                && d.words[((loc.block - d.first) / 64) as usize]
                    & (1 << ((loc.block - d.first) % 64))
                    != 0
        })
    }

    /// True if `loc` lies in a data area.
    pub(crate) fn contains(&self, loc: BlockLoc) -> bool {
        self.devices.iter().any(|d| {
            d.device == loc.device && loc.block >= d.first && loc.block < d.first + d.blocks
        })
    }

    /// Returns `loc` to the free pool.
    pub(crate) fn free(&mut self, loc: BlockLoc) {
        self.free_all(&[loc]);
    }

    /// Returns blocks to the free pool.
    pub(crate) fn free_all(&mut self, locs: &[BlockLoc]) {
        if locs.is_empty() {
            return;
        }
        if let Some(c) = &self.content {
            c.release(locs.iter().copied());
        }
        for loc in locs {
            self.clear(*loc);
        }
    }

    fn clear(&mut self, loc: BlockLoc) {
        if let Some(d) = self.map(loc.device) {
            if loc.block >= d.first && loc.block < d.first + d.blocks {
                let i = loc.block - d.first;
                let (w, b) = ((i / 64) as usize, i % 64);
                if d.words[w] & (1 << b) != 0 {
                    d.words[w] &= !(1 << b);
                    d.used -= 1;
                    d.low = d.low.min(i);
                }
            }
        }
    }

    /// Hands out `n` blocks, preferring runs on one device (so a large write
    /// becomes few large device writes): each device's blocks in turn from
    /// where the last call stopped, rotating devices between calls.
    pub(crate) fn allocate(&mut self, n: usize) -> Option<Vec<BlockLoc>> {
        self.allocate_from(n, From::Cursor)
    }

    /// Hands out `n` blocks, the lowest free ones of each device first,
    /// rotating devices between calls: blocks freed by the last checkpoint
    /// are taken again before untouched ones. For the destager's blocks,
    /// which go through the host's page cache: a block written and freed
    /// not long ago most likely still has its page there, which the write
    /// then fills in place, where a block not written for a while (or ever)
    /// makes the kernel find a new page for it, and a host whose cached
    /// data wanders over the whole device keeps taking fresh memory (on a
    /// virtual machine, each page faulted in from the hypervisor at first
    /// touch). The data set's blocks also stay together at the low end of
    /// the device.
    pub(crate) fn allocate_lowest(&mut self, n: usize) -> Option<Vec<BlockLoc>> {
        self.allocate_from(n, From::Lowest)
    }

    fn allocate_from(&mut self, n: usize, from: From) -> Option<Vec<BlockLoc>> {
        if (self.free_blocks() as usize) < n {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        let count = self.devices.len();
        for k in 0..count {
            let di = (self.next_device + k) % count;
            let d = &mut self.devices[di];
            if d.failed {
                continue;
            }
            // From the lowest possibly free block to the end (nothing below
            // it is free), or from the cursor round the whole device.
            let (mut i, span) = match from {
                From::Lowest => (d.low, d.blocks - d.low.min(d.blocks)),
                From::Cursor => (d.cursor, d.blocks),
            };
            let mut scanned = 0u64;
            while out.len() < n && d.used < d.blocks && scanned < span {
                let (w, b) = ((i / 64) as usize, i % 64);
                if d.words[w] == u64::MAX && b == 0 && i + 64 <= d.blocks {
                    i = (i + 64) % d.blocks;
                    scanned += 64;
                    continue;
                }
                if d.words[w] & (1 << b) == 0 {
                    d.words[w] |= 1 << b;
                    d.used += 1;
                    out.push(BlockLoc {
                        device: d.device,
                        block: d.first + i,
                    });
                }
                i = (i + 1) % d.blocks;
                scanned += 1;
            }
            match from {
                // Every block below where the scan stopped is used now.
                From::Lowest => d.low = (d.low + scanned.min(span)).min(d.blocks),
                From::Cursor => d.cursor = i,
            }
            if out.len() == n {
                self.next_device = (di + 1) % count;
                if let Some(c) = &self.content {
                    c.invalidate(out.iter().copied());
                }
                return Some(out);
            }
        }
        // None of these was handed out: back to free without a trace.
        for loc in out {
            self.clear(loc);
        }
        None
    }

    /// Hands out two adjacent blocks on one device (an index page slot pair).
    pub(crate) fn allocate_pair(&mut self) -> Option<BlockLoc> {
        let count = self.devices.len();
        for k in 0..count {
            let di = (self.next_device + k) % count;
            let d = &mut self.devices[di];
            if d.failed || d.blocks < 2 || d.blocks - d.used < 2 {
                continue;
            }
            for step in 0..d.blocks - 1 {
                let i = (d.cursor + step) % (d.blocks - 1);
                let free = |x: u64| d.words[(x / 64) as usize] & (1 << (x % 64)) == 0;
                if free(i) && free(i + 1) {
                    for x in [i, i + 1] {
                        d.words[(x / 64) as usize] |= 1 << (x % 64);
                    }
                    d.used += 2;
                    d.cursor = (i + 2) % d.blocks;
                    let loc = BlockLoc {
                        device: d.device,
                        block: d.first + i,
                    };
                    if let Some(c) = &self.content {
                        c.invalidate([
                            loc,
                            BlockLoc {
                                device: loc.device,
                                block: loc.block + 1,
                            },
                        ]);
                    }
                    return Some(loc);
                }
            }
        }
        None
    }

    /// Stops handing out blocks of a failed device; its blocks lose their
    /// cache entries.
    pub(crate) fn fail_device(&mut self, device: u8) {
        if let Some(d) = self.map(device) {
            d.failed = true;
        }
        if let Some(c) = &self.content {
            c.drop_device(device);
        }
    }

    /// Whether every capacity device failed: nothing can be stored or read.
    pub(crate) fn all_failed(&self) -> bool {
        self.devices.iter().all(|d| d.failed)
    }

    /// Blocks free on healthy devices.
    pub(crate) fn free_blocks(&self) -> u64 {
        self.devices
            .iter()
            .filter(|d| !d.failed)
            .map(|d| d.blocks - d.used)
            .sum()
    }

    /// Blocks in use: data blocks, index page slots and blocks waiting for a
    /// checkpoint to free them.
    pub(crate) fn used_blocks(&self) -> u64 {
        self.devices.iter().map(|d| d.used).sum()
    }

    /// Data-area blocks of all devices.
    pub(crate) fn total_blocks(&self) -> u64 {
        self.devices.iter().map(|d| d.blocks).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    proptest! {
        #[test]
        fn never_hands_out_a_used_block(ops in proptest::collection::vec((1usize..40, any::<bool>(), any::<bool>()), 1..60)) {
            let mut a = Allocator::new(&[(1, 10, 100), (2, 2, 70)]);
            let mut held: Vec<BlockLoc> = Vec::new();
            let mut set = HashSet::new();
            for (n, free, lowest) in ops {
                let allocated = if lowest { a.allocate_lowest(n) } else { a.allocate(n) };
                if free && !held.is_empty() {
                    if let Some(locs) = allocated {
                        a.free_all(&locs);
                    }
                    let loc = held.swap_remove(n % held.len());
                    set.remove(&loc);
                    a.free(loc);
                } else if let Some(locs) = allocated {
                    for l in locs {
                        prop_assert!(set.insert(l), "{l} handed out twice");
                        held.push(l);
                    }
                } else {
                    prop_assert!(a.free_blocks() < n as u64);
                }
                prop_assert_eq!(a.used_blocks(), held.len() as u64);
            }
        }
    }

    #[test]
    fn the_lowest_free_blocks_go_first_and_freed_ones_come_back_before_untouched_ones() {
        let mut a = Allocator::new(&[(1, 10, 1000)]);
        let first = a.allocate_lowest(300).expect("room");
        assert_eq!(first[0].block, 10);
        assert_eq!(first[299].block, 309);
        // Freed blocks in the middle are taken again before any above.
        a.free_all(&[first[7], first[100], first[101]]);
        let again = a.allocate_lowest(4).expect("room");
        let blocks: Vec<u64> = again.iter().map(|l| l.block).collect();
        assert_eq!(blocks, vec![17, 110, 111, 310]);
        // The cursor of large writes is its own: it goes on from its start.
        let large = a.allocate(5).expect("room");
        assert_eq!(large[0].block, 311);
        // Full up to the end, then nothing more.
        let rest = a.allocate_lowest(a.free_blocks() as usize).expect("room");
        assert_eq!(rest.last().expect("some").block, 1009);
        assert!(a.allocate_lowest(1).is_none());
        a.free(BlockLoc {
            device: 1,
            block: 500,
        });
        assert_eq!(a.allocate_lowest(1).expect("one")[0].block, 500);
    }
}
