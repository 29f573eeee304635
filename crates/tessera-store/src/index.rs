//! The bounded cache of index pages and the in-memory root of each component.
//!
//! Owns: which index pages are in memory, which are dirty (changed since the
//! last checkpoint) and which are pinned (being written by a checkpoint); and
//! which blocks of snapshots' root tables are in memory (a snapshot keeps no
//! page roots of its own in memory: they are read from its table when a
//! read of it needs them, see `crate::snapshot`).
//! Memory is set by configuration: at most `index_cache_bytes / 4 KiB` clean
//! pages and root table blocks stay cached; dirty and pinned pages cannot be
//! dropped, and the destager checkpoints as soon as they pass half of the
//! budget, which bounds them too.
//! Invariant: a dirty page is never evicted (its changes would be lost before
//! reaching a checkpoint); a page is looked up on disk only through the root
//! entry the last checkpoint committed (or, for a snapshot, its root table,
//! which never changes).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tessera_format::{BlockLoc, IndexPage, PageRoot, INDEX_ENTRIES};

/// LBAs per index page, as a u64.
pub(crate) const LBAS_PER_PAGE: u64 = INDEX_ENTRIES as u64;

/// Fewest pages the cache holds whatever the configuration says: a single
/// large operation must find its pages still cached after loading them.
pub(crate) const CACHE_PAGES_MIN: usize = 256;

/// Memory one cached page takes: its decoded entries plus the map slot and
/// bookkeeping around them (what the configured budget is divided by).
const PAGE_MEMORY_BYTES: u64 =
    (INDEX_ENTRIES * std::mem::size_of::<tessera_format::IndexEntry>() + 128) as u64;

/// Where a component's index page lives on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RootEntry {
    /// First block of the page's slot pair; None until its first checkpoint.
    pub(crate) loc: Option<BlockLoc>,
    /// Which block of the pair holds the committed copy.
    pub(crate) slot: u8,
}

impl RootEntry {
    /// The root a checkpoint or root table lists.
    pub(crate) fn listed(r: &PageRoot) -> RootEntry {
        RootEntry {
            loc: Some(r.loc),
            slot: r.slot,
        }
    }

    /// Block of the committed copy.
    pub(crate) fn current(&self) -> Option<BlockLoc> {
        self.loc.map(|l| BlockLoc {
            device: l.device,
            block: l.block + self.slot as u64,
        })
    }
}

/// One block of a snapshot's root table as cached: its roots in page
/// order, each as (page number, packed location of its slot pair with the
/// committed slot as the flags), 16 bytes a root, so a block of roots takes
/// less memory than a page of entries and counts as one page in the budget.
pub(crate) struct CachedRoots {
    roots: Vec<(u64, u64)>,
    last_use: AtomicU64,
}

impl CachedRoots {
    pub(crate) fn new(roots: &[PageRoot]) -> CachedRoots {
        CachedRoots {
            roots: roots
                .iter()
                .map(|r| (r.page_no, r.loc.pack(r.slot)))
                .collect(),
            last_use: AtomicU64::new(0),
        }
    }

    /// The roots of pages `first..=last` this block holds, in order.
    pub(crate) fn range(
        &self,
        first: u64,
        last: u64,
    ) -> impl Iterator<Item = (u64, RootEntry)> + '_ {
        let from = self.roots.partition_point(|(p, _)| *p < first);
        self.roots[from..]
            .iter()
            .take_while(move |(p, _)| *p <= last)
            .map(|&(p, packed)| {
                let (loc, slot) = BlockLoc::unpack(packed);
                (
                    p,
                    RootEntry {
                        loc: Some(loc),
                        slot,
                    },
                )
            })
    }
}

/// Key of a cached root table block: (snapshot, its place in the table).
pub(crate) type RootBlockKey = (u64, u64);

/// A cached page.
pub(crate) struct CachedPage {
    pub(crate) page: IndexPage,
    /// Changed since the last checkpoint: set and cleared only through the
    /// cache, which counts dirty pages.
    dirty: bool,
    pub(crate) pins: u32,
    last_use: u64,
}

impl CachedPage {
    /// Changed since the last checkpoint.
    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty
    }
}

/// Key of a page: (component, page number).
pub(crate) type PageKey = (u64, u64);

/// Pages read ahead after the one a lookup missed, by default: 4 MiB of
/// address space beyond it (vsanSparse's speculative prefetch is 4 MiB).
pub const INDEX_PREFETCH_PAGES_DEFAULT: u64 = 4;

/// Address space one index page maps, in bytes.
pub const INDEX_PAGE_SPAN_BYTES: u64 = LBAS_PER_PAGE * tessera_types::BLOCK_BYTES;

/// What the index cache did, for operators (counts since the disk group
/// was opened).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexCacheStats {
    /// Memory the cache may use (its budget).
    pub budget_bytes: u64,
    /// Pages cached now.
    pub resident_pages: u64,
    /// Memory the cached pages and root table blocks take.
    pub resident_bytes: u64,
    /// Blocks of snapshots' root tables cached now (each counts as a page
    /// in the budget).
    pub resident_root_blocks: u64,
    /// Cached pages changed since the last checkpoint (never evicted).
    pub dirty_pages: u64,
    /// Pages operations found in memory.
    pub hits: u64,
    /// Pages operations had to wait for while they were read from disk.
    pub misses: u64,
    /// Pages read ahead of a miss (the pages after it, within the
    /// prefetch window).
    pub prefetched: u64,
    /// Clean pages dropped to stay within the budget.
    pub evicted: u64,
    /// Pages read ahead after a miss.
    pub prefetch_pages: u64,
}

/// The cache.
pub(crate) struct IndexCache {
    /// Looked up for every block of every I/O: hashed with foldhash, not
    /// the standard library's SipHash (a keyed hash against floods of
    /// chosen keys; these keys are page numbers).
    pages: HashMap<PageKey, CachedPage, foldhash::fast::RandomState>,
    /// Blocks of snapshots' root tables, sharing the budget with pages.
    roots: HashMap<RootBlockKey, CachedRoots, foldhash::fast::RandomState>,
    capacity: usize,
    /// Use order of pages and root blocks together (root blocks are looked
    /// up under a shared borrow, hence atomic).
    clock: AtomicU64,
    /// Pages read ahead after a miss.
    pub(crate) prefetch_pages: u64,
    /// Pages the operations that completed used (found cached or read).
    pub(crate) used: std::sync::atomic::AtomicU64,
    /// Pages read from disk, on demand or ahead.
    pub(crate) read: std::sync::atomic::AtomicU64,
    /// Of those, read ahead.
    pub(crate) prefetched: std::sync::atomic::AtomicU64,
    evicted: u64,
    /// Pages with `dirty` set: asked before every destage and checkpoint
    /// decision, so kept rather than counted.
    dirty_pages: usize,
}

impl IndexCache {
    pub(crate) fn new(bytes: u64) -> IndexCache {
        IndexCache {
            pages: HashMap::default(),
            roots: HashMap::default(),
            capacity: capacity_for(bytes),
            clock: AtomicU64::new(0),
            prefetch_pages: INDEX_PREFETCH_PAGES_DEFAULT,
            used: Default::default(),
            read: Default::default(),
            prefetched: Default::default(),
            evicted: 0,
            dirty_pages: 0,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Changes the budget; pages beyond it are dropped at once (clean ones:
    /// dirty and pinned pages wait for the next checkpoint).
    pub(crate) fn set_budget(&mut self, bytes: u64) {
        self.capacity = capacity_for(bytes);
        self.evict();
    }

    pub(crate) fn stats(&self) -> IndexCacheStats {
        use std::sync::atomic::Ordering::Relaxed;
        let read = self.read.load(Relaxed);
        let prefetched = self.prefetched.load(Relaxed);
        let misses = read.saturating_sub(prefetched);
        IndexCacheStats {
            budget_bytes: self.capacity as u64 * PAGE_MEMORY_BYTES,
            resident_pages: self.pages.len() as u64,
            resident_bytes: self.len() as u64 * PAGE_MEMORY_BYTES,
            resident_root_blocks: self.roots.len() as u64,
            dirty_pages: self.dirty_count() as u64,
            // A page read on demand is then used by the operation that
            // waited for it: what it used beyond those it found cached.
            hits: self.used.load(Relaxed).saturating_sub(misses),
            misses,
            prefetched,
            evicted: self.evicted,
            prefetch_pages: self.prefetch_pages,
        }
    }

    pub(crate) fn contains(&self, key: &PageKey) -> bool {
        self.pages.contains_key(key)
    }

    /// Pages and root table blocks cached.
    fn len(&self) -> usize {
        self.pages.len() + self.roots.len()
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Relaxed) + 1
    }

    pub(crate) fn get(&mut self, key: &PageKey) -> Option<&mut CachedPage> {
        let now = self.tick();
        let page = self.pages.get_mut(key)?;
        page.last_use = now;
        Some(page)
    }

    /// A cached page about to be changed: marked used and dirty.
    pub(crate) fn get_to_change(&mut self, key: &PageKey) -> Option<&mut CachedPage> {
        let now = self.tick();
        let page = self.pages.get_mut(key)?;
        page.last_use = now;
        if !page.dirty {
            page.dirty = true;
            self.dirty_pages += 1;
        }
        Some(page)
    }

    /// A cached page whose changes are written (or dropped): marked used
    /// and clean.
    pub(crate) fn get_to_clean(&mut self, key: &PageKey) -> Option<&mut CachedPage> {
        let now = self.tick();
        let page = self.pages.get_mut(key)?;
        page.last_use = now;
        if page.dirty {
            page.dirty = false;
            self.dirty_pages -= 1;
        }
        Some(page)
    }

    /// A cached root table block, marked as used.
    pub(crate) fn roots(&self, key: &RootBlockKey) -> Option<&CachedRoots> {
        let block = self.roots.get(key)?;
        block.last_use.store(self.tick(), Relaxed);
        Some(block)
    }

    /// Caches a root table block read from disk.
    pub(crate) fn insert_roots(&mut self, key: RootBlockKey, block: CachedRoots) {
        block.last_use.store(self.tick(), Relaxed);
        self.roots.entry(key).or_insert(block);
        self.evict();
    }

    pub(crate) fn peek(&self, key: &PageKey) -> Option<&CachedPage> {
        self.pages.get(key)
    }

    /// Inserts a page read from disk (kept if one is already cached: the
    /// cached copy may be newer) or a new empty page (`dirty`).
    pub(crate) fn insert(&mut self, key: PageKey, page: IndexPage, dirty: bool) {
        let now = self.tick();
        if let std::collections::hash_map::Entry::Vacant(slot) = self.pages.entry(key) {
            slot.insert(CachedPage {
                page,
                dirty,
                pins: 0,
                last_use: now,
            });
            self.dirty_pages += usize::from(dirty);
        }
        self.evict();
    }

    pub(crate) fn remove(&mut self, key: &PageKey) -> Option<CachedPage> {
        let page = self.pages.remove(key)?;
        self.dirty_pages -= usize::from(page.dirty);
        Some(page)
    }

    /// Drops a component's pages and root table blocks.
    pub(crate) fn remove_component(&mut self, component: u64) {
        self.pages.retain(|k, _| k.0 != component);
        self.roots.retain(|k, _| k.0 != component);
        self.dirty_pages = self.pages.values().filter(|p| p.dirty).count();
    }

    pub(crate) fn dirty_keys(&self) -> Vec<PageKey> {
        let mut keys: Vec<PageKey> = self
            .pages
            .iter()
            .filter(|(_, p)| p.dirty)
            .map(|(k, _)| *k)
            .collect();
        keys.sort();
        keys
    }

    pub(crate) fn dirty_count(&self) -> usize {
        debug_assert_eq!(
            self.dirty_pages,
            self.pages.values().filter(|p| p.dirty).count()
        );
        self.dirty_pages
    }

    /// Drops clean pages beyond the budget.
    pub(crate) fn trim(&mut self) {
        self.evict();
    }

    /// Drops least recently used clean, unpinned pages down to 7/8 of the
    /// budget, so evictions come in batches rather than on every insert;
    /// root table blocks go only when no such page is left, as each one
    /// finds up to 251 pages.
    fn evict(&mut self) {
        if self.len() <= self.capacity {
            return;
        }
        let target = self.capacity * 7 / 8;
        // (is a root block, last use, key)
        let mut clean: Vec<(bool, u64, (u64, u64))> = self
            .pages
            .iter()
            .filter(|(_, p)| !p.dirty && p.pins == 0)
            .map(|(k, p)| (false, p.last_use, *k))
            .chain(
                self.roots
                    .iter()
                    .map(|(k, r)| (true, r.last_use.load(Relaxed), *k)),
            )
            .collect();
        clean.sort_unstable();
        let excess = self.len().saturating_sub(target);
        for (root_block, _, k) in clean.into_iter().take(excess) {
            if root_block {
                self.roots.remove(&k);
            } else {
                self.pages.remove(&k);
            }
            self.evicted += 1;
        }
    }
}

/// Pages a budget of `bytes` holds (never fewer than [`CACHE_PAGES_MIN`]).
fn capacity_for(bytes: u64) -> usize {
    ((bytes / PAGE_MEMORY_BYTES) as usize).max(CACHE_PAGES_MIN)
}
