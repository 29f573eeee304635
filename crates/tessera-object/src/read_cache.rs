//! The host read cache: blocks of the volumes a host coordinates, kept in
//! the RAM of that host. Every write of a volume, from whichever host or
//! path it came (NBD and iSCSI on any host, EXTENDED COPY, UNMAP, WRITE
//! SAME, COMPARE AND WRITE), passes through its owner's [`Coordinator`], so
//! the owner can keep what it reads and know exactly when it changes.
//!
//! Owns: the cached blocks (each a `Bytes` of exactly 4 KiB with a buffer
//! of its own, never a slice of a larger read), their eviction, the budget
//! (changeable while it runs), the change tracking that keeps a read from
//! inserting data a write has since replaced, and the host's counters.
//! Must not touch: components, the clock, the node. Pure bookkeeping: the
//! coordinator looks blocks up, fills what it read from its copies and
//! invalidates what it changes.
//!
//! One [`ReadCache`] per host, shared by every coordinator the host runs;
//! each coordinator holds a [`VolumeCache`] of it, registered with an
//! instance id the cache never hands out again. Entries are keyed by
//! (instance, volume block), so a new owner of a volume (a failover, a
//! resize, a host that took the volume back) starts with nothing cached,
//! and an instance's entries go when its [`VolumeCache`] is dropped or
//! retired ([`VolumeCache::retire`], when its coordinator is superseded or
//! its host stops coordinating it).
//!
//! Exactness: an entry holds what the volume's copies hold, as of every
//! change the coordinator acknowledged. Held by construction:
//! - every change of blocks (write, unmap, zeroing, blocks shared into the
//!   volume) invalidates them once its copies are done with it, before it is
//!   acknowledged (and when it is abandoned half way, on drop:
//!   [`ChangeGuard`]): it raises the instance's change counter, records the
//!   new value for each 1 MiB region it touched (64 slots per instance;
//!   regions that share a slot share the record) and then removes the
//!   entries, under the cache lock;
//! - a read takes a [`ReadTicket`] (the change counter) before it reads its
//!   copies, and inserts a block only if no change recorded for its region
//!   since then, checked under the cache lock. A change that raised the
//!   counter before the ticket was durable on the copies before the read
//!   reached them, so the read saw its data; one that raised it later
//!   either removes the entry after the insert or makes the insert refuse.
//!
//! Memory: at most `budget / READ_CACHE_ENTRY_COST_BYTES` entries, the cost
//! covering the 4 KiB, the entry's slot, its map slot, the shared header of
//! its `Bytes` once a hit hands it out, and its ghost record, so what the
//! cache holds stays within the budget. A budget of 0 disables the cache
//! and frees everything.
//!
//! Eviction: S3-FIFO (Yang et al., SOSP 2023; `tessera_cache::S3Fifo`,
//! shared with the store's content cache), O(1) amortised per block. A
//! new entry enters a small FIFO (a tenth of the entries); one that reaches
//! its end without being read again is dropped and its key remembered in a
//! ghost FIFO, one that was read again moves to the main FIFO. The main
//! FIFO is a CLOCK: an entry at its end that was read since it last passed
//! there (counted up to 3) goes round once more, else it is dropped. A key
//! found in the ghost FIFO when it is inserted again goes straight to the
//! main FIFO. A scan of blocks read once passes through the small FIFO and
//! leaves the main FIFO alone.
//!
//! [`Coordinator`]: crate::Coordinator

use bytes::Bytes;
use parking_lot::Mutex;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tessera_cache::S3Fifo;
use tessera_types::BLOCK_BYTES;

/// Memory one entry takes besides its 4 KiB of data: its slot (64 bytes),
/// its map slot with the map's spare room (up to ~57), the shared header
/// `Bytes` allocates when a hit first hands the block out (32 with the
/// allocator's rounding), the allocator's header of the data buffer (16),
/// a free-slot index (4) and the ghost record of a dropped entry in the
/// ghost FIFO and its map, each with its spare room (up to ~105): ~280,
/// rounded up.
pub const READ_CACHE_ENTRY_OVERHEAD_BYTES: u64 = 320;

/// Budget bytes one entry takes.
pub const READ_CACHE_ENTRY_COST_BYTES: u64 = BLOCK_BYTES + READ_CACHE_ENTRY_OVERHEAD_BYTES;

/// Volume blocks per change-tracking region (1 MiB).
const REGION_BLOCKS: u64 = 256;

/// Change-tracking slots per instance: region `r` records in slot
/// `r % REGION_SLOTS`.
const REGION_SLOTS: usize = 64;

/// (instance, volume block).
type Key = (u64, u64);

/// A multiplicative hash for the two integers of a key: cheaper than the
/// default SipHash, and the keys come from the coordinator, not from a
/// client that could choose them to collide (a client chooses blocks, but
/// only of its own volume, and a collision costs it time, never data).
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let h = (self.0 ^ (self.0 >> 32)).wrapping_mul(0xd6e8_feb8_6659_fd93);
        h ^ (h >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(26) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// The entries, evicted by the S3-FIFO rule.
type Entries = S3Fifo<Key, Bytes, BuildHasherDefault<KeyHasher>>;

/// Counters of a host's read cache since it started, and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadCacheStats {
    /// Blocks (4 KiB) of reads served from the cache.
    pub hits: u64,
    /// Blocks of reads the cache did not hold, read from a copy (not
    /// counted while the cache is disabled).
    pub misses: u64,
    /// Blocks inserted after a read from a copy.
    pub inserted: u64,
    /// Blocks a read did not insert because a change of their region
    /// completed while the read ran.
    pub refused: u64,
    /// Entries dropped to stay within the budget.
    pub evicted: u64,
    /// Entries dropped because their blocks changed, or their coordinator
    /// went.
    pub invalidated: u64,
    /// Entries held now.
    pub entries: u64,
    /// Data bytes held now (4 KiB per entry).
    pub bytes_cached: u64,
    /// Memory the entries take now, overhead included (at most the budget).
    pub memory_bytes: u64,
    /// The budget in bytes (0: disabled).
    pub budget_bytes: u64,
    /// Coordinators registered now.
    pub volumes: u64,
}

impl ReadCacheStats {
    /// Hits over hits and misses; None before the first read.
    pub fn hit_rate(&self) -> Option<f64> {
        let total = self.hits + self.misses;
        (total > 0).then(|| self.hits as f64 / total as f64)
    }
}

struct Inner {
    entries: Entries,
    budget: u64,
}

/// Whether this host still certainly owns what it owns: no other host can
/// have become the owner of one of its volumes while this holds (the node
/// answers it from its liveness lease, to which its owner keys are bound).
pub type OwnershipCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// The read cache of one host.
pub struct ReadCache {
    inner: Mutex<Inner>,
    /// Consulted before every lookup and fill: a host that may have lost
    /// its volumes to another owner (its lease may have lapsed) serves no
    /// block from memory, since the new owner may have changed it.
    ownership: parking_lot::RwLock<Option<OwnershipCheck>>,
    /// The budget is not 0.
    enabled: AtomicBool,
    next_instance: AtomicU64,
    volumes: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    inserted: AtomicU64,
    refused: AtomicU64,
    evicted: AtomicU64,
    invalidated: AtomicU64,
}

impl ReadCache {
    /// A cache of at most `budget_bytes` (0: disabled).
    pub fn new(budget_bytes: u64) -> Arc<ReadCache> {
        let cache = ReadCache {
            inner: Mutex::new(Inner {
                entries: Entries::new(),
                budget: 0,
            }),
            ownership: parking_lot::RwLock::new(None),
            enabled: AtomicBool::new(false),
            next_instance: AtomicU64::new(1),
            volumes: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            inserted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            invalidated: AtomicU64::new(0),
        };
        cache.set_budget(budget_bytes);
        Arc::new(cache)
    }

    /// A cache that holds nothing until given a budget.
    pub fn disabled() -> Arc<ReadCache> {
        ReadCache::new(0)
    }

    /// Changes the budget, dropping entries beyond it (0 drops them all and
    /// disables the cache).
    pub fn set_budget(&self, bytes: u64) {
        let mut inner = self.inner.lock();
        let capacity = usize::try_from(bytes / READ_CACHE_ENTRY_COST_BYTES).unwrap_or(usize::MAX);
        inner.budget = bytes;
        let evicted = inner.entries.set_capacity(capacity);
        if inner.entries.slots() > 2 * capacity + 1024 {
            // Shrunk well below what it held: give the slots back.
            inner.entries.compact();
        }
        inner.entries.take_dropped().for_each(drop);
        self.enabled.store(capacity > 0, Ordering::SeqCst);
        drop(inner);
        self.evicted.fetch_add(evicted, Ordering::Relaxed);
    }

    /// The budget in bytes (0: disabled).
    pub fn budget_bytes(&self) -> u64 {
        self.inner.lock().budget
    }

    /// Whether the budget holds at least one entry.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    /// Serves and takes blocks only while `check` holds (see
    /// [`OwnershipCheck`]); without one, always.
    pub fn set_ownership_check(&self, check: OwnershipCheck) {
        *self.ownership.write() = Some(check);
    }

    /// Whether blocks may be served and taken now.
    fn owner_certain(&self) -> bool {
        self.ownership.read().as_ref().is_none_or(|check| check())
    }

    /// Registers a coordinator: its entries are keyed by an instance id
    /// never handed out again, and go when the handle is dropped.
    pub fn volume(self: &Arc<Self>) -> VolumeCache {
        let instance = self.next_instance.fetch_add(1, Ordering::Relaxed);
        self.volumes.fetch_add(1, Ordering::Relaxed);
        VolumeCache {
            cache: Arc::clone(self),
            instance,
            changes: AtomicU64::new(0),
            changed: std::array::from_fn(|_| AtomicU64::new(0)),
            retired: AtomicBool::new(false),
        }
    }

    /// Counters and what the cache holds now.
    pub fn stats(&self) -> ReadCacheStats {
        let (entries, budget) = {
            let inner = self.inner.lock();
            (inner.entries.len() as u64, inner.budget)
        };
        ReadCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            inserted: self.inserted.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
            invalidated: self.invalidated.load(Ordering::Relaxed),
            entries,
            bytes_cached: entries * BLOCK_BYTES,
            memory_bytes: entries * READ_CACHE_ENTRY_COST_BYTES,
            budget_bytes: budget,
            volumes: self.volumes.load(Ordering::Relaxed),
        }
    }

    /// Drops the entries of `instance` for blocks `[first, first+count)`.
    fn remove_range(&self, instance: u64, first: u64, count: u64) {
        let mut inner = self.inner.lock();
        if inner.entries.is_empty() {
            return;
        }
        let dropped = if count > inner.entries.len() as u64 {
            // Fewer entries than blocks: look at the entries.
            let end = first.saturating_add(count);
            inner
                .entries
                .remove_where(|(i, b)| *i == instance && (first..end).contains(b))
        } else {
            (first..first + count)
                .filter(|&b| inner.entries.remove(&(instance, b)))
                .count() as u64
        };
        inner.entries.take_dropped().for_each(drop);
        drop(inner);
        self.invalidated.fetch_add(dropped, Ordering::Relaxed);
    }

    /// Drops every entry of `instance`.
    fn remove_instance(&self, instance: u64) {
        self.remove_range(instance, 0, u64::MAX);
    }
}

/// When a read began, for [`VolumeCache::fill`]: the instance's change
/// counter before the read reached any copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadTicket(u64);

/// One coordinator's part of its host's [`ReadCache`]: its blocks, keyed
/// by an instance id of its own, and the record of its changes.
pub struct VolumeCache {
    cache: Arc<ReadCache>,
    instance: u64,
    /// Raised by every change of the volume's blocks.
    changes: AtomicU64,
    /// The `changes` value of the latest change per region slot.
    changed: [AtomicU64; REGION_SLOTS],
    /// Set when the coordinator stops serving: nothing is looked up or
    /// inserted any more.
    retired: AtomicBool,
}

impl VolumeCache {
    /// The id its entries are keyed by, never handed out again by its cache.
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// The host's cache.
    pub fn host_cache(&self) -> &Arc<ReadCache> {
        &self.cache
    }

    /// Whether lookups and fills do anything now.
    pub fn enabled(&self) -> bool {
        self.cache.enabled() && !self.retired.load(Ordering::SeqCst)
    }

    /// Takes the ticket a read passes to [`VolumeCache::fill`]; take it
    /// before reading any copy.
    pub fn ticket(&self) -> ReadTicket {
        ReadTicket(self.changes.load(Ordering::SeqCst))
    }

    /// The cached blocks of `[first, first+count)`, None for each block not
    /// held; counted as hits and misses of the host's cache.
    pub fn lookup(&self, first: u64, count: u64) -> Vec<Option<Bytes>> {
        if !self.enabled() || !self.cache.owner_certain() {
            return vec![None; count as usize];
        }
        let found: Vec<Option<Bytes>> = {
            let mut inner = self.cache.inner.lock();
            (first..first + count)
                .map(|b| inner.entries.get(&(self.instance, b)).cloned())
                .collect()
        };
        let hits = found.iter().filter(|b| b.is_some()).count() as u64;
        self.cache.hits.fetch_add(hits, Ordering::Relaxed);
        self.cache.misses.fetch_add(count - hits, Ordering::Relaxed);
        found
    }

    /// Block `b` if it is cached, as [`VolumeCache::lookup`] of one block
    /// (and counted the same way), without a list: most guest reads are of
    /// one block.
    pub fn lookup_one(&self, b: u64) -> Option<Bytes> {
        if !self.enabled() || !self.cache.owner_certain() {
            return None;
        }
        let found = self
            .cache
            .inner
            .lock()
            .entries
            .get(&(self.instance, b))
            .cloned();
        let counter = match found {
            Some(_) => &self.cache.hits,
            None => &self.cache.misses,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Inserts blocks read from a copy: `data` holds whole blocks from
    /// `first` on, read after `ticket` was taken. A block whose region
    /// changed since the ticket is not inserted (the read may have seen the
    /// data from before the change); each inserted block is a copy of its
    /// own 4 KiB. Returns how many blocks were inserted.
    pub fn fill(&self, ticket: ReadTicket, first: u64, data: &[u8]) -> u64 {
        if !self.enabled() || data.is_empty() || !self.cache.owner_certain() {
            return 0;
        }
        debug_assert!((data.len() as u64).is_multiple_of(BLOCK_BYTES));
        let count = data.len() as u64 / BLOCK_BYTES;
        // Copies made outside the cache lock, for the blocks that look
        // current; checked again under it. One block (most reads) needs no
        // list of them.
        let mut copies = data
            .chunks_exact(BLOCK_BYTES as usize)
            .enumerate()
            .map(|(i, chunk)| (first + i as u64, chunk))
            .filter(|(b, _)| self.current(ticket, *b))
            .map(|(b, chunk)| (b, Bytes::copy_from_slice(chunk)));
        if count == 1 {
            let one: Option<(u64, Bytes)> = copies.next();
            let stale = u64::from(one.is_none());
            return self.insert_copies(ticket, one, stale);
        }
        let blocks: Vec<(u64, Bytes)> = copies.collect();
        let stale = count - blocks.len() as u64;
        self.insert_copies(ticket, blocks, stale)
    }

    /// Inserts `blocks` (copies of their own, made for a read that took
    /// `ticket`) whose regions did not change since, counting `stale`
    /// blocks already left out as refused. Returns how many went in.
    fn insert_copies(
        &self,
        ticket: ReadTicket,
        blocks: impl IntoIterator<Item = (u64, Bytes)>,
        stale: u64,
    ) -> u64 {
        let (mut inserted, mut refused, mut evicted) = (0, stale, 0);
        {
            let mut inner = self.cache.inner.lock();
            let retired = self.retired.load(Ordering::SeqCst);
            for (b, block) in blocks {
                let key = (self.instance, b);
                if retired || inner.entries.capacity() == 0 || !self.current(ticket, b) {
                    refused += 1;
                    continue;
                }
                if inner.entries.contains(&key) {
                    continue;
                }
                evicted += inner.entries.insert(key, block);
                inserted += 1;
            }
            inner.entries.take_dropped().for_each(drop);
        }
        self.cache.inserted.fetch_add(inserted, Ordering::Relaxed);
        self.cache.refused.fetch_add(refused, Ordering::Relaxed);
        self.cache.evicted.fetch_add(evicted, Ordering::Relaxed);
        inserted
    }

    /// True if no change of block `b`'s region was recorded after `ticket`.
    fn current(&self, ticket: ReadTicket, b: u64) -> bool {
        self.changed[Self::slot(b)].load(Ordering::SeqCst) <= ticket.0
    }

    fn slot(b: u64) -> usize {
        ((b / REGION_BLOCKS) % REGION_SLOTS as u64) as usize
    }

    /// Records a change of blocks `[first, first+count)` that is done on
    /// the copies (or abandoned) and drops their entries. Call it before
    /// the change is acknowledged.
    pub fn invalidate(&self, first: u64, count: u64) {
        if count == 0 {
            return;
        }
        let seq = self.changes.fetch_add(1, Ordering::SeqCst) + 1;
        let r0 = first / REGION_BLOCKS;
        let r1 = (first + count - 1) / REGION_BLOCKS;
        if r1 - r0 + 1 >= REGION_SLOTS as u64 {
            for c in &self.changed {
                c.fetch_max(seq, Ordering::SeqCst);
            }
        } else {
            for r in r0..=r1 {
                self.changed[(r % REGION_SLOTS as u64) as usize].fetch_max(seq, Ordering::SeqCst);
            }
        }
        self.cache.remove_range(self.instance, first, count);
    }

    /// A guard that invalidates blocks `[first, first+count)` when dropped:
    /// take it before a change reaches any copy, and keep it until the
    /// change is settled, so the blocks are invalidated after the copies
    /// have it, on every path out (an error, or a caller that stops
    /// waiting).
    #[must_use = "the blocks are invalidated when the guard is dropped"]
    pub fn change(&self, first: u64, count: u64) -> ChangeGuard<'_> {
        ChangeGuard {
            cache: self,
            first,
            count,
        }
    }

    /// Drops every entry and caches nothing more: the coordinator stopped
    /// serving (superseded, or its host no longer coordinates the volume).
    pub fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
        self.cache.remove_instance(self.instance);
    }
}

impl Drop for VolumeCache {
    fn drop(&mut self) {
        self.cache.remove_instance(self.instance);
        self.cache.volumes.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Invalidates a range of a [`VolumeCache`] when dropped
/// ([`VolumeCache::change`]).
pub struct ChangeGuard<'a> {
    cache: &'a VolumeCache,
    first: u64,
    count: u64,
}

impl Drop for ChangeGuard<'_> {
    fn drop(&mut self) {
        self.cache.invalidate(self.first, self.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(seed: u8) -> Vec<u8> {
        vec![seed; BLOCK_BYTES as usize]
    }

    fn blocks(seeds: &[u8]) -> Vec<u8> {
        seeds.iter().flat_map(|s| block(*s)).collect()
    }

    fn budget(entries: u64) -> u64 {
        entries * READ_CACHE_ENTRY_COST_BYTES
    }

    #[test]
    fn a_host_that_may_have_lost_its_volumes_serves_and_takes_nothing() {
        let cache = ReadCache::new(budget(16));
        let owner = Arc::new(AtomicBool::new(true));
        let check = Arc::clone(&owner);
        cache.set_ownership_check(Arc::new(move || check.load(Ordering::SeqCst)));
        let v = cache.volume();
        assert_eq!(v.fill(v.ticket(), 0, &blocks(&[1])), 1);
        assert!(v.lookup(0, 1)[0].is_some());
        // The lease may have lapsed: another host may own the volume now
        // and have changed block 0.
        owner.store(false, Ordering::SeqCst);
        assert_eq!(v.lookup(0, 1), vec![None]);
        assert_eq!(v.fill(v.ticket(), 1, &blocks(&[2])), 0);
        owner.store(true, Ordering::SeqCst);
        assert_eq!(v.lookup(1, 1), vec![None]);
    }

    #[test]
    fn a_fill_is_found_and_counted() {
        let cache = ReadCache::new(budget(16));
        let v = cache.volume();
        assert_eq!(v.lookup(10, 2), vec![None, None]);
        let t = v.ticket();
        assert_eq!(v.fill(t, 10, &blocks(&[1, 2])), 2);
        let found = v.lookup(9, 3);
        assert_eq!(found[0], None);
        assert_eq!(found[1].as_deref(), Some(&block(1)[..]));
        assert_eq!(found[2].as_deref(), Some(&block(2)[..]));
        let s = cache.stats();
        assert_eq!((s.hits, s.misses, s.inserted, s.entries), (2, 3, 2, 2));
        assert_eq!(s.bytes_cached, 2 * BLOCK_BYTES);
        assert!(s.memory_bytes <= s.budget_bytes);
        assert_eq!(s.hit_rate(), Some(0.4));
    }

    #[test]
    fn an_entry_owns_exactly_its_block() {
        let cache = ReadCache::new(budget(16));
        let v = cache.volume();
        let data = Bytes::from(blocks(&[1, 2, 3, 4]));
        v.fill(v.ticket(), 0, &data);
        let one = v.lookup(2, 1).remove(0).unwrap();
        assert_eq!(one.len(), BLOCK_BYTES as usize);
        // Not a view of the read's buffer.
        let inside = data.as_ptr_range();
        assert!(!inside.contains(&one.as_ptr()));
    }

    #[test]
    fn a_change_after_the_ticket_refuses_the_fill_of_its_region_only() {
        let cache = ReadCache::new(budget(4096));
        let v = cache.volume();
        let t = v.ticket();
        v.invalidate(5, 1);
        // Same 1 MiB region: refused; another region: inserted.
        assert_eq!(v.fill(t, 0, &blocks(&[1, 1])), 0);
        assert_eq!(v.fill(t, REGION_BLOCKS, &blocks(&[2])), 1);
        // A ticket taken after the change fills.
        assert_eq!(v.fill(v.ticket(), 0, &blocks(&[3])), 1);
        assert_eq!(cache.stats().refused, 2);
    }

    #[test]
    fn a_change_drops_entries_and_a_guard_drops_them_on_its_way_out() {
        let cache = ReadCache::new(budget(4096));
        let v = cache.volume();
        v.fill(v.ticket(), 0, &blocks(&[1, 2, 3, 4]));
        v.invalidate(1, 2);
        let found: Vec<bool> = v.lookup(0, 4).iter().map(Option::is_some).collect();
        assert_eq!(found, vec![true, false, false, true]);
        {
            let _guard = v.change(3, 1);
            assert!(v.lookup(3, 1)[0].is_some(), "dropped only when settled");
        }
        assert!(v.lookup(3, 1)[0].is_none());
        // A range wider than what is held looks at the entries instead.
        v.fill(v.ticket(), 1000, &blocks(&[5]));
        v.invalidate(0, u64::MAX / 2);
        assert_eq!(cache.stats().entries, 0);
    }

    #[test]
    fn instances_are_apart_and_go_with_their_handles() {
        let cache = ReadCache::new(budget(64));
        let a = cache.volume();
        let b = cache.volume();
        assert_ne!(a.instance(), b.instance());
        a.fill(a.ticket(), 0, &blocks(&[1]));
        assert!(b.lookup(0, 1)[0].is_none());
        b.fill(b.ticket(), 0, &blocks(&[2]));
        assert_eq!(cache.stats().volumes, 2);
        drop(a);
        let s = cache.stats();
        assert_eq!((s.entries, s.volumes), (1, 1));
        b.retire();
        assert_eq!(cache.stats().entries, 0);
        assert_eq!(b.fill(b.ticket(), 0, &blocks(&[3])), 0);
        assert!(b.lookup(0, 1)[0].is_none());
        let c = cache.volume();
        assert!(c.instance() > b.instance(), "ids are never reused");
    }

    #[test]
    fn the_budget_bounds_entries_and_changes_live() {
        let cache = ReadCache::new(budget(100));
        let v = cache.volume();
        for b in 0..1000u64 {
            v.fill(v.ticket(), b, &block(b as u8));
            let s = cache.stats();
            assert!(s.memory_bytes <= s.budget_bytes, "{s:?}");
        }
        assert_eq!(cache.stats().entries, 100);
        cache.set_budget(budget(10) + 5);
        assert_eq!(cache.stats().entries, 10);
        cache.set_budget(0);
        let s = cache.stats();
        assert_eq!((s.entries, s.budget_bytes), (0, 0));
        assert!(!v.enabled());
        assert_eq!(v.fill(v.ticket(), 0, &block(1)), 0);
        cache.set_budget(budget(5));
        assert_eq!(v.fill(v.ticket(), 0, &block(1)), 1);
    }

    #[test]
    fn blocks_read_again_survive_a_scan() {
        let cache = ReadCache::new(budget(100));
        let v = cache.volume();
        // A working set read twice.
        for b in 0..50u64 {
            v.fill(v.ticket(), b, &block(1));
            v.lookup(b, 1);
        }
        // A scan of blocks read once, ten times the cache.
        for b in 1000..2000u64 {
            v.fill(v.ticket(), b, &block(2));
        }
        let kept = v.lookup(0, 50).iter().filter(|b| b.is_some()).count();
        assert!(kept >= 45, "the scan pushed out {} of 50", 50 - kept);
    }

    #[test]
    fn shrinking_compacts_and_keeps_the_order() {
        let cache = ReadCache::new(budget(5000));
        let v = cache.volume();
        for b in 0..5000u64 {
            v.fill(v.ticket(), b, &block(b as u8));
        }
        for b in 4990..5000u64 {
            v.lookup(b, 1);
        }
        cache.set_budget(budget(20));
        assert!(cache.inner.lock().entries.slots() <= 20);
        for b in 4990..5000u64 {
            assert_eq!(
                v.lookup(b, 1)[0].as_deref(),
                Some(&block(b as u8)[..]),
                "block {b} was read again and stays"
            );
        }
        for b in 6000..6100u64 {
            v.fill(v.ticket(), b, &block(0));
            let s = cache.stats();
            assert!(s.entries <= 20, "{s:?}");
        }
    }
}
