//! The content-based read cache: verified capacity-tier blocks kept in
//! memory, keyed by where they are stored (device and block), not by the
//! component or LBA that asked. A block shared by several LBAs or components
//! (copies by reference: [`crate::DiskGroup::clone_blocks`]) is cached once
//! and serves all of them: eight clones of one image read each block from
//! the device once.
//!
//! Owns: the cached blocks (each a `Bytes` of exactly 4 KiB that owns its
//! buffer alone, never a slice of a larger read), their eviction, the
//! blocks reads are fetching right now (so a second read of a block waits
//! for the first instead of reading it again), and the cache's counters.
//! Must not touch: devices and the state; the read path looks blocks up
//! while it plans under the state lock and inserts what it read and
//! verified, and the free-space map ([`crate::alloc::Allocator`])
//! invalidates.
//!
//! Reads at once: clones booting together read the same blocks at nearly
//! the same moment, and each would miss while the first read of a block is
//! still at the device. A read whose missing blocks are all being fetched
//! by other reads (same location, same CRC) waits for them and gets the
//! verified blocks from those reads (`joined` in the counters); a read that
//! fetches anything fetches all its missing blocks itself and never waits.
//! So no read waits for a read that waits, and a fetch that fails or is
//! dropped ends its waiters' waits, which then read the blocks themselves.
//! A waiter gets bytes that matched the CRC its own plan took from the
//! index, which is all a device read of its own would promise.
//!
//! Memory: at most `budget / (4 KiB + ENTRY_OVERHEAD_BYTES)` entries, the
//! overhead covering the entry's slot, its map slot, the shared header of its
//! `Bytes` and its ghost record (see below), so what the cache holds stays
//! within the budget, plus [`SPARE_MAX`] buffers of dropped entries kept for
//! the next inserts. A budget of 0 disables the cache and frees everything.
//! Measured with random 4 KiB reads over 2 GiB (every read a miss that
//! evicts): a 64 MiB budget raised the process's resident memory by 67 MB
//! at queue depth 1 and 75 to 80 MB at 8 and 32 (the system allocator's
//! slack).
//!
//! Eviction (S3-FIFO: Yang et al., SOSP 2023; `tessera_cache::S3Fifo`), O(1) amortised per block: a
//! new entry enters a small FIFO (a tenth of the entries); an entry that
//! reaches the small FIFO's end without having been read again is dropped
//! and its location remembered in a ghost FIFO, one that was read again
//! moves to the main FIFO. The main FIFO is a CLOCK: an entry at its end
//! that was read since it last passed there (up to 3 times) goes round once
//! more, else it is dropped. A location found in the ghost FIFO when it is
//! inserted again goes straight to the main FIFO. A scan of blocks read once
//! passes through the small FIFO and leaves the main FIFO alone.
//!
//! Invariant: an entry for location L holds exactly the bytes L holds on its
//! device, and L has stayed in use in the free-space map since they were
//! read from it. Held by construction:
//! - capacity blocks are written only right after the free-space map hands
//!   them out (the destager's data blocks, a placed write's blocks, a new
//!   index page's slot pair) or as the alternate slot of an index page,
//!   which is never a data block;
//! - the free-space map removes the entry of every location it hands out
//!   (`allocate`, `allocate_pair`, a free block marked used) before the
//!   caller can write there, and of every location it takes back (`free`);
//!   a device that fails loses all its entries;
//! - a read inserts a block only if it passed its CRC32C and no block went
//!   back to the free-space map between the read's plan (under the state
//!   lock, where the index named L) and the insert (the `released`
//!   generation, checked under the cache lock): L was then in use from the
//!   plan to the insert, so nothing rewrote it, and if it is freed later its
//!   entry is removed then.
//!
//! So a lookup made under the state lock, where the index entry names L
//! with its CRC, returns what the index says the LBA holds. Overwrites,
//! unmaps, component deletes and destaging never change L in place: they
//! point LBAs elsewhere, and L is rewritten only after a checkpoint frees it
//! and the map hands it out again. The entry's CRC is compared with the
//! index's on every hit as a second guard.

use crate::state::Source;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tessera_cache::S3Fifo;
use tessera_format::{BlockLoc, BLOCK};

/// Memory one entry takes besides its 4 KiB of data: its slot (56 bytes),
/// its map slot and the map's spare room (up to ~40), the shared header
/// `Bytes` allocates once the block is handed out (32 with the allocator's
/// rounding), the allocator's header of the data buffer (16) and the ghost
/// record of a dropped entry (up to ~48).
pub(crate) const ENTRY_OVERHEAD_BYTES: u64 = 192;

/// Budget bytes one entry takes.
pub(crate) const ENTRY_COST_BYTES: u64 = BLOCK as u64 + ENTRY_OVERHEAD_BYTES;

/// Most entries the tables are sized for up front (64 GiB of blocks).
const RESERVE_ENTRIES_MAX: usize = 1 << 24;

/// Buffers of dropped entries kept for the next inserts (256 KiB, beyond
/// the budget): entries come and go at the rate of device reads, and each
/// one taken from the heap and given back costs an allocation and leaves
/// holes between the blocks that stay.
const SPARE_MAX: usize = 64;

/// A map keyed by packed block locations, with a hash that costs one
/// multiplication (every read that misses does several lookups).
type LocMap<V> = HashMap<u64, V, BuildHasherDefault<LocHasher>>;

/// Hashes a packed location: the device and block bits mixed by a
/// multiplication, high half folded into the low half.
#[derive(Default)]
struct LocHasher(u64);

impl Hasher for LocHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, k: u64) {
        let h = (self.0 ^ k).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = h ^ (h >> 29);
    }
}

/// Counters of a disk group's content-based read cache since it opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ContentCacheStats {
    /// Blocks of client reads served from the cache.
    pub hits: u64,
    /// Blocks of client reads that were being read from a capacity device
    /// for another read, and were handed over by it rather than read again.
    pub joined: u64,
    /// Blocks of client reads read from a capacity device (all of them when
    /// the cache is disabled). Hits, joined and misses add up to the
    /// capacity-tier blocks clients read.
    pub misses: u64,
    /// Blocks inserted after a read from a capacity device.
    pub inserted: u64,
    /// Entries dropped to stay within the budget.
    pub evicted: u64,
    /// Entries dropped because their location was freed or handed out for
    /// new data (or its device failed).
    pub invalidated: u64,
    /// Entries held now.
    pub entries: u64,
    /// Data bytes held now (4 KiB per entry).
    pub bytes_cached: u64,
    /// Memory the entries take now, overhead included (at most the budget).
    pub memory_bytes: u64,
    /// The configured budget in bytes (0: disabled).
    pub budget_bytes: u64,
}

/// What a read planned through the cache does after its plan.
pub(crate) struct Resolved {
    /// Inserts what the read fetches and completes the fetches it leads
    /// (None while the cache is disabled).
    pub(crate) fill: Option<Fill>,
    /// Blocks another read is fetching: (index in the plan, its answer;
    /// None if that read failed, and then this read reads the block).
    pub(crate) waits: Vec<(usize, tokio::sync::oneshot::Receiver<Option<Bytes>>)>,
}

/// A read's part in the cache once it is planned: the `released`
/// generation at its plan, and the fetches of blocks it leads, which end
/// when it fills them or, at the latest, when it is dropped (a failed or
/// abandoned read: its waiters then read the blocks themselves).
pub(crate) struct Fill {
    cache: Arc<ContentCache>,
    ticket: u64,
    /// Locations this read fetches for others too.
    led: Vec<u64>,
    /// Ids of those fetches (allocated in one run at the plan).
    ids: std::ops::Range<u64>,
}

impl Fill {
    /// Inserts verified blocks and hands them to the reads waiting for them
    /// (see [`ContentCache::fill`]).
    pub(crate) fn fill(&mut self, blocks: Vec<(BlockLoc, u32, Bytes)>) {
        let cache = self.cache.clone();
        cache.fill(self, blocks);
    }

    /// A copy of one block for [`Fill::fill`] (see
    /// [`ContentCache::own_block`]).
    pub(crate) fn own_block(&self, src: &[u8]) -> Bytes {
        self.cache.own_block(src)
    }

    /// A buffer for one block a read fills, if the cache keeps one (see
    /// [`ContentCache::spare_block`]).
    pub(crate) fn spare_block(&self) -> Option<Vec<u8>> {
        self.cache.spare_block()
    }
}

impl Drop for Fill {
    fn drop(&mut self) {
        let cache = self.cache.clone();
        cache.abandon(self);
    }
}

/// A block some read is fetching from its device, and the reads waiting
/// for it.
struct Flight {
    id: u64,
    crc: u32,
    waiters: Vec<tokio::sync::oneshot::Sender<Option<Bytes>>>,
}

/// A cached block: its CRC as the index had it, and its bytes.
#[derive(Default)]
struct Entry {
    crc: u32,
    data: Bytes,
}

struct Inner {
    /// The entries, by packed location, evicted by the S3-FIFO rule.
    entries: S3Fifo<u64, Entry, BuildHasherDefault<LocHasher>>,
    budget: u64,
    /// Data of entries removed by the operation under way, for
    /// `ContentCache::recycle`.
    dropped: Vec<Bytes>,
    /// Blocks being fetched by a read that others may wait for, by location.
    flights: LocMap<Flight>,
    next_flight: u64,
}

/// The cache of one disk group.
pub(crate) struct ContentCache {
    inner: Mutex<Inner>,
    /// Buffers of exactly 4 KiB for the next inserts (taken without the
    /// cache lock; filled under it).
    spare: Mutex<Vec<Vec<u8>>>,
    /// Bumped every time a block goes back to the free-space map; a read
    /// inserts only if it is what it was when the read was planned.
    released: AtomicU64,
    /// The budget is not 0 (lookups skip the lock otherwise).
    enabled: AtomicBool,
    hits: AtomicU64,
    joined: AtomicU64,
    misses: AtomicU64,
    inserted: AtomicU64,
    evicted: AtomicU64,
    invalidated: AtomicU64,
}

impl ContentCache {
    pub(crate) fn new(budget_bytes: u64) -> ContentCache {
        let cache = ContentCache {
            inner: Mutex::new(Inner {
                entries: S3Fifo::new(),
                budget: 0,
                dropped: Vec::new(),
                flights: LocMap::default(),
                next_flight: 0,
            }),
            spare: Mutex::new(Vec::new()),
            released: AtomicU64::new(0),
            enabled: AtomicBool::new(false),
            hits: AtomicU64::new(0),
            joined: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            inserted: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            invalidated: AtomicU64::new(0),
        };
        cache.set_budget(budget_bytes);
        cache
    }

    /// Changes the budget, dropping entries beyond it (0 drops them all and
    /// disables the cache).
    pub(crate) fn set_budget(&self, bytes: u64) {
        let mut inner = self.inner.lock();
        let capacity = usize::try_from(bytes / ENTRY_COST_BYTES).unwrap_or(usize::MAX);
        inner.budget = bytes;
        let evicted = inner.entries.set_capacity(capacity);
        if inner.entries.is_empty() && capacity > 0 {
            // Give the memory of the slots and maps back.
            inner.entries.compact();
        }
        // Room for every entry from the start: tables that double as the
        // cache fills leave holes between the blocks in the heap (measured:
        // 8 MB more resident for a 64 MiB budget). Untouched until used.
        inner.entries.reserve(capacity.min(RESERVE_ENTRIES_MAX));
        self.recycle(&mut inner);
        if capacity == 0 {
            inner.dropped = Vec::new();
            *self.spare.lock() = Vec::new();
        }
        self.evicted.fetch_add(evicted, Ordering::Relaxed);
        self.enabled.store(capacity > 0, Ordering::Relaxed);
    }

    /// A copy of one 4 KiB block for [`ContentCache::fill`]: a buffer of
    /// exactly 4 KiB of its own, never a slice of the read's buffer, taken
    /// from the spare buffers of dropped entries when there is one.
    pub(crate) fn own_block(&self, src: &[u8]) -> Bytes {
        let mut v = self
            .spare_block()
            .unwrap_or_else(|| Vec::with_capacity(BLOCK));
        v.clear();
        v.extend_from_slice(src);
        debug_assert_eq!(v.capacity(), BLOCK);
        Bytes::from(v)
    }

    /// The buffer of a dropped entry, if one is kept: exactly one 4 KiB
    /// block long (its old bytes), for a read that fills it and gives it
    /// to [`ContentCache::fill`] as it is.
    pub(crate) fn spare_block(&self) -> Option<Vec<u8>> {
        self.spare.lock().pop()
    }

    /// Keeps the buffers of the entries just removed that nothing else
    /// holds, up to [`SPARE_MAX`]; the rest are dropped.
    fn recycle(&self, inner: &mut Inner) {
        let Inner {
            entries, dropped, ..
        } = inner;
        let removed: Vec<Bytes> = entries.take_dropped().map(|e| e.data).collect();
        if dropped.is_empty() && removed.is_empty() {
            return;
        }
        let mut spare = self.spare.lock();
        for b in dropped.drain(..).chain(removed) {
            if spare.len() < SPARE_MAX && b.len() == BLOCK && b.is_unique() {
                let v = Vec::from(b);
                if v.capacity() == BLOCK {
                    spare.push(v);
                }
            }
        }
    }

    /// Looks the capacity blocks of a read plan up: each found becomes
    /// [`Source::Cached`]. The caller holds the state lock and planned the
    /// sources under it. Of the blocks not found, those another read is
    /// fetching are waited for if the read would fetch nothing itself
    /// (`Resolved::waits`); otherwise the read fetches them all and others
    /// may wait for the ones nobody was fetching (`Fill`). So a read that
    /// fetches never waits, and no two reads wait for each other.
    pub(crate) fn resolve(self: &Arc<Self>, plan: &mut [Source]) -> Resolved {
        let disk = plan
            .iter()
            .filter(|s| matches!(s, Source::Disk(..)))
            .count() as u64;
        if !self.enabled.load(Ordering::Relaxed) {
            self.misses.fetch_add(disk, Ordering::Relaxed);
            return Resolved {
                fill: None,
                waits: Vec::new(),
            };
        }
        let mut fill = Fill {
            cache: self.clone(),
            ticket: self.released.load(Ordering::Acquire),
            led: Vec::new(),
            ids: 0..0,
        };
        let mut waits = Vec::new();
        if disk == 0 {
            return Resolved {
                fill: Some(fill),
                waits,
            };
        }
        let (mut hits, mut fetched) = (0, 0);
        {
            let mut inner = self.inner.lock();
            let mut missed = Vec::new();
            for (i, s) in plan.iter_mut().enumerate() {
                if let Source::Disk(loc, crc) = *s {
                    match inner.lookup(loc.pack(0), crc) {
                        Some(data) => {
                            *s = Source::Cached(data);
                            hits += 1;
                        }
                        None => missed.push((i, loc.pack(0), crc)),
                    }
                }
            }
            let all_in_flight = !missed.is_empty()
                && missed
                    .iter()
                    .all(|(_, key, crc)| inner.flights.get(key).is_some_and(|f| f.crc == *crc));
            if all_in_flight {
                for (i, key, _) in missed {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    if let Some(f) = inner.flights.get_mut(&key) {
                        f.waiters.push(tx);
                    }
                    waits.push((i, rx));
                }
            } else {
                fetched = missed.len() as u64;
                let first = inner.next_flight;
                for (_, key, crc) in missed {
                    if inner.flights.contains_key(&key) {
                        // Fetched by another read too (or twice in this one).
                        continue;
                    }
                    let id = inner.next_flight;
                    inner.next_flight += 1;
                    inner.flights.insert(
                        key,
                        Flight {
                            id,
                            crc,
                            waiters: Vec::new(),
                        },
                    );
                    fill.led.push(key);
                }
                fill.ids = first..inner.next_flight;
            }
            self.recycle(&mut inner);
        }
        self.hits.fetch_add(hits, Ordering::Relaxed);
        self.misses.fetch_add(fetched, Ordering::Relaxed);
        Resolved {
            fill: Some(fill),
            waits,
        }
    }

    /// Counts the blocks a read waited for: `joined` came from the read it
    /// waited for, `fetched` had to be read after all (that read failed).
    pub(crate) fn count_waited(&self, joined: u64, fetched: u64) {
        self.joined.fetch_add(joined, Ordering::Relaxed);
        self.misses.fetch_add(fetched, Ordering::Relaxed);
    }

    /// Inserts blocks a read read from their devices and verified against
    /// their CRC32C: (location, CRC, the 4 KiB), and hands them to the reads
    /// waiting for them. Inserts nothing if a block went back to the
    /// free-space map since the read was planned.
    pub(crate) fn fill(&self, fill: &mut Fill, blocks: Vec<(BlockLoc, u32, Bytes)>) {
        if blocks.is_empty() {
            return;
        }
        let (mut inserted, mut evicted) = (0, 0);
        {
            let mut inner = self.inner.lock();
            let current = self.released.load(Ordering::Acquire) == fill.ticket;
            for (loc, crc, data) in blocks {
                debug_assert_eq!(data.len(), BLOCK);
                let key = loc.pack(0);
                if inner
                    .flights
                    .get(&key)
                    .is_some_and(|f| fill.ids.contains(&f.id))
                {
                    if let Some(f) = inner.flights.remove(&key) {
                        for w in f.waiters {
                            let _ = w.send(Some(data.clone()));
                        }
                    }
                }
                if !current || inner.entries.capacity() == 0 || inner.entries.contains(&key) {
                    inner.dropped.push(data);
                    continue;
                }
                evicted += inner.entries.insert(key, Entry { crc, data });
                inserted += 1;
            }
            self.recycle(&mut inner);
        }
        self.inserted.fetch_add(inserted, Ordering::Relaxed);
        self.evicted.fetch_add(evicted, Ordering::Relaxed);
    }

    /// Ends the flights a read led and did not complete: their waiters read
    /// the blocks themselves.
    fn abandon(&self, fill: &mut Fill) {
        if fill.led.is_empty() {
            return;
        }
        let mut inner = self.inner.lock();
        for key in fill.led.drain(..) {
            if inner
                .flights
                .get(&key)
                .is_some_and(|f| fill.ids.contains(&f.id))
            {
                if let Some(f) = inner.flights.remove(&key) {
                    for w in f.waiters {
                        let _ = w.send(None);
                    }
                }
            }
        }
    }

    /// Drops the entries of locations the free-space map hands out for new
    /// data. The caller holds the state lock.
    pub(crate) fn invalidate(&self, locs: impl IntoIterator<Item = BlockLoc>) {
        let mut inner = self.inner.lock();
        let mut dropped = 0;
        for loc in locs {
            dropped += u64::from(inner.entries.remove(&loc.pack(0)));
        }
        self.recycle(&mut inner);
        drop(inner);
        self.invalidated.fetch_add(dropped, Ordering::Relaxed);
    }

    /// Records that locations went back to the free-space map and drops
    /// their entries. The caller holds the state lock and calls this before
    /// the map can hand them out again.
    pub(crate) fn release(&self, locs: impl IntoIterator<Item = BlockLoc>) {
        let mut inner = self.inner.lock();
        self.released.fetch_add(1, Ordering::AcqRel);
        let mut dropped = 0;
        for loc in locs {
            dropped += u64::from(inner.entries.remove(&loc.pack(0)));
        }
        self.recycle(&mut inner);
        drop(inner);
        self.invalidated.fetch_add(dropped, Ordering::Relaxed);
    }

    /// Drops every entry of a failed device.
    pub(crate) fn drop_device(&self, device: u8) {
        let mut inner = self.inner.lock();
        let dropped = inner
            .entries
            .remove_where(|k| BlockLoc::unpack(*k).0.device == device);
        self.recycle(&mut inner);
        drop(inner);
        self.invalidated.fetch_add(dropped, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> ContentCacheStats {
        let (entries, budget) = {
            let inner = self.inner.lock();
            (inner.entries.len() as u64, inner.budget)
        };
        ContentCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            joined: self.joined.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            inserted: self.inserted.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
            invalidated: self.invalidated.load(Ordering::Relaxed),
            entries,
            bytes_cached: entries * BLOCK as u64,
            memory_bytes: entries * ENTRY_COST_BYTES,
            budget_bytes: budget,
        }
    }

    /// True if `loc` has an entry (tests).
    #[cfg(test)]
    pub(crate) fn contains(&self, loc: BlockLoc) -> bool {
        self.inner.lock().entries.contains(&loc.pack(0))
    }
}

impl Inner {
    fn lookup(&mut self, key: u64, crc: u32) -> Option<Bytes> {
        let (stored, data) = {
            let entry = self.entries.get(&key)?;
            (entry.crc, entry.data.clone())
        };
        if stored != crc {
            // The index names this location with another CRC: the
            // invariant broke. Never serve it.
            debug_assert!(false, "content cache entry with a stale CRC");
            self.entries.remove(&key);
            return None;
        }
        Some(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::Allocator;
    use proptest::prelude::*;
    use std::sync::Arc;

    fn loc(block: u64) -> BlockLoc {
        BlockLoc { device: 1, block }
    }

    fn block(tag: u64) -> (Bytes, u32) {
        let mut b = vec![0u8; BLOCK];
        b[..8].copy_from_slice(&tag.to_le_bytes());
        let crc = tessera_format::block_crc(&b);
        (Bytes::from(b), crc)
    }

    fn cache(budget: u64) -> Arc<ContentCache> {
        Arc::new(ContentCache::new(budget))
    }

    /// The part of a read planned now, leading nothing.
    fn planned(c: &Arc<ContentCache>) -> Fill {
        Fill {
            cache: c.clone(),
            ticket: c.released.load(Ordering::Acquire),
            led: Vec::new(),
            ids: 0..0,
        }
    }

    /// Inserts a block as a read that fetched it would.
    fn fill_one(c: &Arc<ContentCache>, l: BlockLoc, tag: u64) {
        let (b, crc) = block(tag);
        planned(c).fill(vec![(l, crc, b)]);
    }

    /// A lone read: the block if the cache has it (the read's fetch, if it
    /// leads one, ends with it).
    fn read(c: &Arc<ContentCache>, l: BlockLoc, tag: u64) -> Option<Bytes> {
        let (_, crc) = block(tag);
        let mut plan = vec![Source::Disk(l, crc)];
        let resolved = c.resolve(&mut plan);
        assert!(resolved.waits.is_empty());
        match plan.pop() {
            Some(Source::Cached(b)) => Some(b),
            _ => None,
        }
    }

    #[test]
    fn a_hit_returns_the_block_and_counts() {
        let c = cache(1 << 20);
        assert!(read(&c, loc(5), 7).is_none());
        fill_one(&c, loc(5), 7);
        let b = read(&c, loc(5), 7).expect("hit");
        assert_eq!(b, block(7).0);
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.inserted, s.entries), (1, 1, 1, 1));
        assert_eq!(s.bytes_cached, BLOCK as u64);
        assert_eq!(s.budget_bytes, 1 << 20);
    }

    #[test]
    fn a_budget_of_zero_holds_nothing() {
        let c = cache(0);
        fill_one(&c, loc(5), 7);
        assert!(read(&c, loc(5), 7).is_none());
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.inserted, s.entries), (0, 1, 0, 0));
    }

    #[test]
    fn a_fill_planned_before_a_release_is_refused() {
        let c = cache(1 << 20);
        let mut before = planned(&c);
        c.release([loc(99)]);
        let (b, crc) = block(1);
        before.fill(vec![(loc(5), crc, b)]);
        assert!(!c.contains(loc(5)));
        fill_one(&c, loc(5), 1);
        assert!(c.contains(loc(5)));
    }

    #[test]
    fn the_free_space_map_invalidates_what_it_hands_out_and_takes_back() {
        let cache = cache(1 << 20);
        let mut a = Allocator::new(&[(1, 10, 64)]);
        a.attach_content_cache(cache.clone());
        let locs = a.allocate(64).expect("blocks");
        for (i, l) in locs.iter().enumerate() {
            fill_one(&cache, *l, i as u64);
        }
        assert_eq!(cache.stats().entries, 64);
        // Freed: gone at once.
        a.free(locs[3]);
        assert!(!cache.contains(locs[3]));
        // Handed out again: a fill that slipped in after the free (planned
        // before it) was refused, and the hand-out drops any entry anyway.
        cache.inner.lock().entries.insert(
            locs[3].pack(0),
            Entry {
                crc: 0,
                data: block(0).0,
            },
        );
        let again = a.allocate(1).expect("one block");
        assert_eq!(again, vec![locs[3]]);
        assert!(!cache.contains(locs[3]));
        // A pair for an index page, and a free block marked used.
        a.free(locs[10]);
        a.free(locs[11]);
        cache.inner.lock().entries.insert(
            locs[10].pack(0),
            Entry {
                crc: 0,
                data: block(0).0,
            },
        );
        cache.inner.lock().entries.insert(
            locs[11].pack(0),
            Entry {
                crc: 0,
                data: block(0).0,
            },
        );
        let pair = a.allocate_pair().expect("pair");
        assert_eq!(pair, locs[10]);
        assert!(!cache.contains(locs[10]) && !cache.contains(locs[11]));
        a.free(locs[20]);
        cache.inner.lock().entries.insert(
            locs[20].pack(0),
            Entry {
                crc: 0,
                data: block(0).0,
            },
        );
        assert!(a.mark_used(locs[20]));
        assert!(!cache.contains(locs[20]));
        assert_eq!(cache.stats().entries, 64 - 4);
    }

    #[test]
    fn a_device_failure_drops_its_entries() {
        let c = cache(1 << 20);
        fill_one(
            &c,
            BlockLoc {
                device: 1,
                block: 3,
            },
            1,
        );
        fill_one(
            &c,
            BlockLoc {
                device: 2,
                block: 3,
            },
            2,
        );
        c.drop_device(1);
        assert_eq!(c.stats().entries, 1);
        assert!(c.contains(BlockLoc {
            device: 2,
            block: 3
        }));
    }

    #[test]
    fn blocks_read_again_survive_a_scan() {
        // 100 entries: a hot set of 20 read twice, then a scan of 1000
        // blocks read once.
        let c = cache(100 * ENTRY_COST_BYTES);
        for k in 0..20 {
            fill_one(&c, loc(k), k);
            assert!(read(&c, loc(k), k).is_some());
        }
        for k in 1000..2000 {
            fill_one(&c, loc(k), k);
        }
        let kept = (0..20).filter(|&k| c.contains(loc(k))).count();
        assert_eq!(kept, 20, "the hot set was flushed by a scan");
        assert!(c.stats().entries <= 100);
    }

    #[test]
    fn a_block_dropped_before_its_second_read_comes_back_to_stay() {
        // The small FIFO holds 10: a block read again only after 50 others
        // were inserted is remembered as a ghost and, inserted again, stays.
        let c = cache(100 * ENTRY_COST_BYTES);
        fill_one(&c, loc(0), 0);
        for k in 1..200 {
            fill_one(&c, loc(k), k);
        }
        assert!(!c.contains(loc(0)));
        fill_one(&c, loc(0), 0);
        for k in 200..400 {
            fill_one(&c, loc(k), k);
        }
        assert!(c.contains(loc(0)), "a ghost hit goes to the main FIFO");
    }

    #[test]
    fn shrinking_the_budget_evicts_and_zero_frees_everything() {
        let c = cache(100 * ENTRY_COST_BYTES);
        for k in 0..100 {
            fill_one(&c, loc(k), k);
        }
        assert_eq!(c.stats().entries, 100);
        c.set_budget(10 * ENTRY_COST_BYTES);
        assert_eq!(c.stats().entries, 10);
        c.set_budget(0);
        let s = c.stats();
        assert_eq!((s.entries, s.evicted), (0, 100));
        assert!(c.inner.lock().entries.slots() == 0);
    }

    #[test]
    fn a_read_of_a_block_another_read_is_fetching_waits_for_it() {
        let c = cache(1 << 20);
        let (b, crc) = block(3);
        // The first read fetches, the second waits, the third (which also
        // needs a block nobody fetches) fetches both itself.
        let mut first = vec![Source::Disk(loc(1), crc)];
        let mut leader = c.resolve(&mut first).fill.expect("enabled");
        let mut second = vec![Source::Zero, Source::Disk(loc(1), crc)];
        let mut waiting = c.resolve(&mut second);
        assert_eq!(waiting.waits.len(), 1);
        assert_eq!(waiting.waits[0].0, 1);
        let mut third = vec![Source::Disk(loc(1), crc), Source::Disk(loc(2), crc)];
        let other = c.resolve(&mut third);
        assert!(other.waits.is_empty());
        assert_eq!(
            other.fill.as_ref().map(|f| f.led.clone()),
            Some(vec![loc(2).pack(0)])
        );
        leader.fill(vec![(loc(1), crc, b.clone())]);
        let (_, rx) = waiting.waits.pop().expect("a wait");
        assert_eq!(rx.blocking_recv().ok().flatten(), Some(b));
        assert!(c.contains(loc(1)));
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.joined), (0, 3, 0));
        // The third read's fetch of loc(2) ends when it is dropped.
        let mut fourth = vec![Source::Disk(loc(2), crc)];
        let mut waiting = c.resolve(&mut fourth);
        assert_eq!(waiting.waits.len(), 1);
        drop(other);
        let (_, rx) = waiting.waits.pop().expect("a wait");
        assert_eq!(rx.blocking_recv().ok().flatten(), None);
        assert!(c.inner.lock().flights.is_empty());
    }

    #[test]
    fn a_wait_needs_the_same_crc() {
        let c = cache(1 << 20);
        let (_, crc) = block(3);
        let mut first = vec![Source::Disk(loc(1), crc)];
        let _leader = c.resolve(&mut first);
        let mut second = vec![Source::Disk(loc(1), crc ^ 1)];
        assert!(c.resolve(&mut second).waits.is_empty());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Fill(u64),
        Read(u64),
        Invalidate(u64),
        Budget(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u64..64).prop_map(Op::Fill),
            6 => (0u64..64).prop_map(Op::Read),
            2 => (0u64..64).prop_map(Op::Invalidate),
            1 => (0u64..24).prop_map(Op::Budget),
        ]
    }

    proptest! {
        /// Whatever the order of fills, reads, invalidations and budget
        /// changes: a hit returns what was filled for that location, the
        /// entries stay within the budget, and the FIFOs and the map agree.
        #[test]
        fn the_cache_stays_consistent_and_within_budget(ops in proptest::collection::vec(op(), 1..400)) {
            let c = cache(8 * ENTRY_COST_BYTES);
            let mut budget = 8u64;
            let mut version: HashMap<u64, u64> = HashMap::new();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Fill(k) => {
                        // A location is filled again only after it was
                        // invalidated (as the free-space map ensures).
                        if !c.contains(loc(k)) {
                            let v = n as u64;
                            version.insert(k, v);
                            fill_one(&c, loc(k), k << 32 | v);
                        }
                    }
                    Op::Read(k) => {
                        if let Some(&v) = version.get(&k) {
                            if let Some(b) = read(&c, loc(k), k << 32 | v) {
                                prop_assert_eq!(b, block(k << 32 | v).0);
                            }
                        }
                    }
                    Op::Invalidate(k) => {
                        c.invalidate([loc(k)]);
                        prop_assert!(!c.contains(loc(k)));
                    }
                    Op::Budget(b) => {
                        budget = b;
                        c.set_budget(b * ENTRY_COST_BYTES);
                    }
                }
                let inner = c.inner.lock();
                prop_assert!(inner.entries.len() as u64 <= budget);
                prop_assert!(inner.entries.check().is_ok(), "{:?}", inner.entries.check());
            }
        }
    }
}
