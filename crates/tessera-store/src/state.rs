//! The disk group's in-memory state and the rules that change it.
//!
//! Owns: the component table, the overlay (blocks logged but not yet on the
//! capacity tier), the index cache, the free-space map, the queue of requests
//! for the log writer and the queue of logged records for the destager.
//! Must not touch: devices. Every function here runs under the state lock and
//! never blocks; when it needs an index page that is not cached it returns
//! [`Need`] with the pages to load, and the caller loads them without the lock
//! and calls again. The same functions serve live operations and log replay,
//! so recovery applies exactly the rules the running store applied.
//!
//! Invariants:
//! - `allocated` of a component counts the LBAs whose latest state is a
//!   stored block (in the overlay, else in the index), so space accounting is
//!   exact at every moment, not only after destaging.
//! - A block referenced by the committed checkpoint is never reused before a
//!   later checkpoint drops the reference (`pending_free`).
//! - A capacity block goes to `pending_free` only when its last index entry
//!   lets go of it: `shares` counts the references beyond the first of every
//!   block that shared entries (copies by reference) point to.
//! - Log records leave the log (the tail moves past them) only when a
//!   checkpoint holds all their effects.
//! - A placed block (a large write stored straight on the capacity tier)
//!   holds one reference to its block from staging until the destager
//!   either hands that reference to the index or drops it (`placed`).

use crate::alloc::Allocator;
use crate::index::{IndexCache, PageKey, RootBlockKey, RootEntry, LBAS_PER_PAGE};
use crate::StoreError;
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use tessera_format::{
    BlockLoc, EntryKind, IndexEntry, IndexPage, LogEntry, LogOp, PageRoot, RootTableRef,
    ROOTS_PER_BLOCK,
};
use tessera_types::{ComponentId, Epoch, Lba, BLOCK_BYTES};

/// A map looked up once per block of a write or a destage, keyed by numbers
/// the store makes (operation numbers, packed block locations): hashed with
/// foldhash, as the index cache is, not with the standard library's SipHash
/// (a keyed hash against floods of chosen keys, which no client chooses
/// here).
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Index pages (and snapshots' root table blocks) to load before an
/// operation can go on.
#[derive(Debug, Default)]
pub(crate) struct Need(
    pub(crate) Vec<Fetch>,
    /// Pages worth reading ahead, which no one waits for.
    pub(crate) Vec<Fetch>,
);

/// Something an operation waits to have read into the index cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Fetch {
    /// An index page, from the block of its committed copy.
    Page(PageKey, BlockLoc),
    /// A block of a snapshot's root table (which names where the
    /// snapshot's pages are), from where it is stored.
    Roots(RootBlockKey, BlockLoc),
}

/// Where a snapshot's page roots are: its root table, written once when it
/// was taken and never changed. They are read into the index cache a block
/// at a time when an operation needs them, so a snapshot keeps only this in
/// memory, whatever its size.
pub(crate) struct SnapshotTable {
    pub(crate) table: RootTableRef,
    /// The table's blocks, in order (the snapshot owns them).
    pub(crate) blocks: Vec<BlockLoc>,
    /// The first page each block of the table holds a root for (a table
    /// lists roots in page order); empty when it lists none.
    pub(crate) first_pages: Vec<u64>,
}

impl SnapshotTable {
    /// The table at `table`, stored in `blocks`, listing `roots` in page
    /// order, [`ROOTS_PER_BLOCK`] to a block (as it is written).
    pub(crate) fn new(table: RootTableRef, blocks: Vec<BlockLoc>, roots: &[PageRoot]) -> Self {
        SnapshotTable {
            table,
            blocks,
            first_pages: roots
                .chunks(ROOTS_PER_BLOCK)
                .map(|chunk| chunk[0].page_no)
                .collect(),
        }
    }

    /// A table that could not be read: it names no pages.
    pub(crate) fn unreadable(table: RootTableRef) -> Self {
        SnapshotTable {
            table,
            blocks: Vec::new(),
            first_pages: Vec::new(),
        }
    }

    /// The blocks of the table that may hold roots of pages
    /// `first..=last`, by their place in the table.
    fn blocks_for(&self, first: u64, last: u64) -> std::ops::Range<u64> {
        let from = self.first_pages.partition_point(|p| *p <= first).max(1) - 1;
        let to = self.first_pages.partition_point(|p| *p <= last);
        (from as u64)..(to.max(from) as u64)
    }
}

/// A component as the running store holds it.
pub(crate) struct Component {
    pub(crate) size_bytes: u64,
    pub(crate) reserve_bytes: u64,
    pub(crate) highest_epoch: u64,
    /// The component whose index pages this one may share (its own id when
    /// it is no snapshot or clone): what its index pages are stamped with.
    pub(crate) family: u64,
    /// A snapshot (read-only): its root table, which it owns. Its roots
    /// never change, so the table stays true, and they are not in `roots`.
    pub(crate) snapshot: Option<SnapshotTable>,
    /// LBAs whose latest state is a stored (or lost) block.
    pub(crate) allocated: u64,
    /// Capacity blocks held: data blocks and index page slots (a
    /// snapshot's root table too).
    pub(crate) physical: u64,
    /// Capacity blocks held per device.
    pub(crate) per_device: BTreeMap<u8, u64>,
    /// Where each index page is (empty for a snapshot: see `snapshot`).
    pub(crate) roots: BTreeMap<u64, RootEntry>,
    /// Serialises unmap, resize and delete against reads and writes of the
    /// component (shared by reads and writes, exclusive for the others).
    pub(crate) lock: Arc<tokio::sync::RwLock<()>>,
    pub(crate) failed: Option<String>,
}

impl Component {
    pub(crate) fn new(
        id: u64,
        size_bytes: u64,
        reserve_bytes: u64,
        highest_epoch: u64,
    ) -> Component {
        Component {
            size_bytes,
            reserve_bytes,
            highest_epoch,
            family: id,
            snapshot: None,
            allocated: 0,
            physical: 0,
            per_device: BTreeMap::new(),
            roots: BTreeMap::new(),
            lock: Arc::new(tokio::sync::RwLock::new(())),
            failed: None,
        }
    }

    pub(crate) fn blocks(&self) -> u64 {
        self.size_bytes / BLOCK_BYTES
    }

    pub(crate) fn hold(&mut self, loc: BlockLoc, n: u64) {
        self.physical += n;
        *self.per_device.entry(loc.device).or_insert(0) += n;
    }

    pub(crate) fn release(&mut self, loc: BlockLoc, n: u64) {
        self.physical = self.physical.saturating_sub(n);
        if let Some(c) = self.per_device.get_mut(&loc.device) {
            *c = c.saturating_sub(n);
        }
    }

    /// Blocks its reservation holds beyond what it has written.
    pub(crate) fn reserve_shortfall(&self) -> u64 {
        (self.reserve_bytes / BLOCK_BYTES).saturating_sub(self.allocated)
    }

    /// Index page roots the checkpoint lists for it (a snapshot's are in
    /// its root table instead).
    pub(crate) fn listed_roots(&self) -> u64 {
        if self.snapshot.is_some() {
            0
        } else {
            self.roots.len() as u64
        }
    }
}

/// What an operation would add to a component (see `State::growth`).
#[derive(Default)]
struct Growth {
    /// LBAs that map nothing yet (the component's `allocated` grows).
    new_lbas: u64,
    /// LBAs that need a block of their own: unmapped ones, and those whose
    /// block is shared (with a snapshot, a clone or a copy by reference),
    /// which an overwrite must leave to the others.
    new_blocks: u64,
    /// The first of those.
    first_new: Option<u64>,
    new_pages: BTreeSet<u64>,
}

/// A block in the overlay: logged (or queued for the log), not yet destaged.
#[derive(Clone)]
pub(crate) struct Pending {
    /// Operation number: the destager applies the block only if the overlay
    /// still holds this operation (no later write or unmap replaced it).
    pub(crate) op: u64,
    /// A slice of the store's own copy of the write (exactly the write's
    /// bytes: see `DiskGroup::write`), never of the caller's buffer.
    pub(crate) data: Bytes,
    pub(crate) crc: u32,
    /// The log record holding it was damaged: the data is lost.
    pub(crate) lost: bool,
    /// A placed write: the block is already stored at this location (and
    /// `data` is empty), only its log entry waits for the destager.
    pub(crate) placed: Option<BlockLoc>,
    /// Destaging it will take a block without letting one go: the LBA held
    /// no block of its own (unmapped, or a block other entries share) when
    /// the overlay first took it. Counted in `State::overlay_new`.
    pub(crate) new_block: bool,
}

/// A request waiting for the log writer.
pub(crate) struct Request {
    pub(crate) entries: Vec<LogEntry>,
    /// Data of the write entries, in order.
    pub(crate) data: Vec<Bytes>,
    /// (component, lba, op) of the write entries, in order.
    pub(crate) writes: Vec<(u64, u64, u64)>,
    /// Registered as not yet applied once logged (unmap, resize, delete).
    pub(crate) token: Option<u64>,
    pub(crate) done: Option<tokio::sync::oneshot::Sender<Result<(), StoreError>>>,
}

/// A group commit whose records are written to the log but not yet synced:
/// its requests are acknowledged by the sync that follows the write.
pub(crate) struct WrittenBatch {
    /// Sequence of the batch's first record.
    pub(crate) first_seq: u64,
    /// Its records, in log order.
    pub(crate) records: Vec<LoggedRecord>,
    /// (token, sequence, virtual block) of unmap, resize and delete entries.
    pub(crate) tokens: Vec<(u64, u64, u64)>,
    /// Log blocks the batch takes, gaps before a record that starts over at
    /// block 0 included.
    pub(crate) blocks: u64,
    /// Where the log's head is once the batch is durable.
    pub(crate) end: (u64, u64),
    pub(crate) reqs: Vec<Request>,
    /// Capacity devices holding the batch's placed data: its sync syncs
    /// them too before the batch is durable.
    pub(crate) flush: Vec<u8>,
}

/// A record that is durable in the log.
pub(crate) struct LoggedRecord {
    pub(crate) seq: u64,
    pub(crate) vstart: u64,
    pub(crate) writes: Vec<(u64, u64, u64)>,
}

/// Where a block of a read comes from.
pub(crate) enum Source {
    Zero,
    /// In the overlay (logged, not yet destaged), with its CRC32C.
    Memory(Bytes, u32),
    /// On a capacity device, with its CRC32C.
    Disk(BlockLoc, u32),
    /// In the content cache: a capacity block verified when it was read
    /// (see `crate::content`).
    Cached(Bytes),
    Lost,
}

pub(crate) struct State {
    pub(crate) components: BTreeMap<u64, Component>,
    pub(crate) overlay: BTreeMap<(u64, u64), Pending>,
    pub(crate) cache: IndexCache,
    pub(crate) alloc: Allocator,
    pub(crate) pending_free: Vec<BlockLoc>,
    /// Blocks a running checkpoint frees once it is durable (taken from
    /// `pending_free`).
    pub(crate) freeing: u64,
    /// References beyond the first to each shared capacity block (packed
    /// location). A block absent here has one reference (or none, if free).
    /// A reference is held by an index page instance (a page's slot pair),
    /// not by each component that shares the page.
    pub(crate) shares: crate::shares::ShareCounts,
    /// Components beyond the first whose roots point to each index page
    /// slot pair (packed location of its first block): snapshots and clones
    /// share their source's pages until one of them changes a page, which
    /// then gets a pair of its own (see [`State::own_page`]). A pair absent
    /// here belongs to one component.
    pub(crate) page_shares: FastMap<u64, u32>,
    /// Overlay blocks whose destaging takes a new block (see
    /// [`Pending::new_block`]).
    pub(crate) overlay_new: u64,
    /// Index page roots that have no slot pair yet (taken at the next
    /// checkpoint).
    pub(crate) new_roots: u64,
    /// Blocks a destage pass took and has not yet put in the index.
    pub(crate) destage_inflight: u64,
    /// Placed blocks not yet in the index nor let go, by operation number,
    /// with their CRC32C. Each holds one reference to its block: taken by
    /// the allocator when a live write placed it, or by replay.
    pub(crate) placed: FastMap<u64, (BlockLoc, u32)>,
    /// Recovery only: blocks that placed writes still ahead in the log name
    /// (packed location). See [`ReplayHold`].
    pub(crate) replay_holds: HashMap<u64, ReplayHold>,
    pub(crate) queue: VecDeque<Request>,
    pub(crate) destage: VecDeque<LoggedRecord>,
    /// Write blocks in `destage` (logged, not yet on the capacity tier).
    pub(crate) destage_blocks: u64,
    /// When `destage` last became non-empty: the destager gathers records
    /// for a full pass until [`crate::engine::DESTAGE_GATHER`] past this.
    pub(crate) destage_since: Option<std::time::Instant>,
    /// Most such blocks held in memory before the log writer (or replay)
    /// waits for the destager.
    pub(crate) overlay_cap_blocks: u64,
    pub(crate) unapplied: BTreeMap<u64, (u64, u64)>,
    /// Log positions as ever-growing block counters (the device position is
    /// the counter modulo the log size). `vhead`/`head_seq` is the durable
    /// head: every record before it is synced. Checkpoints and `settle` only
    /// look at the durable head.
    pub(crate) vhead: u64,
    pub(crate) head_seq: u64,
    /// Where the log writer places its next record: ahead of the durable
    /// head by the batches written and waiting for their sync.
    pub(crate) written_vhead: u64,
    pub(crate) written_seq: u64,
    /// A group commit is being laid out and written (by the log writer, or
    /// inline by a lone request's caller): no one else may write the log.
    pub(crate) log_writing: bool,
    /// Group commits written and not yet synced, in log order.
    pub(crate) unsynced: VecDeque<WrittenBatch>,
    /// Log blocks those batches take.
    pub(crate) unsynced_blocks: u64,
    /// Syncers inside `fdatasync`.
    pub(crate) syncs_running: usize,
    /// Sequence from which written batches are not covered by a sync that
    /// has begun (the next syncer takes them).
    pub(crate) sync_uncovered_seq: u64,
    /// Group commit counters (see [`crate::LogStats`]).
    pub(crate) log_stats: crate::LogStats,
    pub(crate) vtail: u64,
    pub(crate) tail_seq: u64,
    pub(crate) checkpoint_gen: u64,
    pub(crate) checkpoints_done: u64,
    pub(crate) checkpoint_wanted: bool,
    pub(crate) failed: Option<String>,
    pub(crate) failed_devices: BTreeMap<u8, String>,
    pub(crate) next_op: u64,
    /// Every write operation numbered up to this has its log record
    /// durable. Operations are numbered in log order (staged and queued
    /// under one lock), so one number says it for all of them.
    pub(crate) durable_op: u64,
    pub(crate) next_token: u64,
    /// Capacity blocks usable by components (the rest is headroom for
    /// copy-on-write destaging).
    pub(crate) usable_blocks: u64,
    /// Index pages the checkpoint area can list.
    pub(crate) roots_max: u64,
    /// Writes staged by the record being replayed (recovery only).
    pub(crate) replay_writes: Vec<(u64, u64, u64)>,
}

/// A block that placed-write entries ahead of replay name. Before replay
/// starts, every such block the committed index leaves free is marked used
/// (the hold owns that mark), so nothing replay does meanwhile (destage
/// passes, checkpoints) can hand it out and overwrite the data the entry
/// vouches for: in the running store, the block was free until that write
/// took it. When its last reference goes while entries still ahead name it,
/// the block goes back to the hold instead of to the free-space map.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplayHold {
    /// Placed entries ahead of replay that name the block.
    pub(crate) remaining: u32,
    /// The hold owns the block's used mark (it has no other reference).
    pub(crate) owned: bool,
}

/// Capacity blocks kept back from components so the destager can always
/// write a block before the checkpoint frees the one it replaces.
pub(crate) const HEADROOM_BLOCKS_MIN: u64 = 1024;

impl State {
    pub(crate) fn check_group(&self) -> Result<(), StoreError> {
        match &self.failed {
            Some(reason) => Err(StoreError::DiskGroupFailed {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    pub(crate) fn component(&self, id: ComponentId) -> Result<&Component, StoreError> {
        self.check_group()?;
        let c = self
            .components
            .get(&id.0)
            .ok_or(StoreError::NoSuchComponent { component: id })?;
        if let Some(reason) = &c.failed {
            return Err(StoreError::ComponentFailed {
                component: id,
                reason: reason.clone(),
            });
        }
        Ok(c)
    }

    pub(crate) fn check_range(
        &self,
        id: ComponentId,
        lba: Lba,
        blocks: u64,
    ) -> Result<(), StoreError> {
        let c = self.component(id)?;
        if lba.0.checked_add(blocks).is_none_or(|end| end > c.blocks()) {
            return Err(StoreError::OutOfRange {
                component: id,
                lba,
                blocks,
                size_bytes: c.size_bytes,
            });
        }
        Ok(())
    }

    /// Fails for a snapshot, which nothing may change.
    pub(crate) fn check_writable(&self, id: ComponentId) -> Result<(), StoreError> {
        if self.component(id)?.snapshot.is_some() {
            return Err(StoreError::ReadOnly { component: id });
        }
        Ok(())
    }

    pub(crate) fn check_epoch(&self, id: ComponentId, epoch: Epoch) -> Result<(), StoreError> {
        let c = self.component(id)?;
        if epoch.0 < c.highest_epoch {
            return Err(StoreError::StaleEpoch {
                component: id,
                epoch,
                highest: Epoch(c.highest_epoch),
            });
        }
        Ok(())
    }

    /// Takes one more reference to `loc`, which an index entry is about to
    /// point to. A block the free-space map shows as free becomes used with
    /// this one reference: log replay can meet a share whose block every
    /// committed entry has since let go (a later record in the log drops the
    /// share again).
    pub(crate) fn add_ref(&mut self, loc: BlockLoc) {
        if !self.alloc.mark_used(loc) {
            self.shares.add(loc);
        }
    }

    /// Lets go of one reference to `loc`; the last one frees the block after
    /// the next checkpoint.
    pub(crate) fn drop_ref(&mut self, loc: BlockLoc) {
        if self.shares.release(loc) {
            return;
        }
        match self.replay_holds.get_mut(&loc.pack(0)) {
            Some(hold) if hold.remaining > 0 => hold.owned = true,
            _ => self.pending_free.push(loc),
        }
    }

    /// Takes the reference a replayed placed entry holds to `loc`: the
    /// hold's mark if it owns one, else one more reference.
    pub(crate) fn take_replayed_ref(&mut self, loc: BlockLoc) {
        if let Some(hold) = self.replay_holds.get_mut(&loc.pack(0)) {
            hold.remaining = hold.remaining.saturating_sub(1);
            if hold.owned {
                hold.owned = false;
                return;
            }
        }
        self.add_ref(loc);
    }

    /// Blocks the disk group has committed: what the capacity devices hold
    /// (data blocks, index page slots and root tables, less what a
    /// checkpoint is about to free and what a destage pass is placing), what
    /// the overlay's blocks will take once destaged, the index pages still
    /// to be placed, and reservations not yet written. A block shared by
    /// several components, snapshots or copies counts once.
    pub(crate) fn committed_blocks(&self) -> u64 {
        let held = self
            .alloc
            .used_blocks()
            .saturating_sub(self.pending_free.len() as u64 + self.freeing + self.destage_inflight);
        held + self.overlay_new
            + 2 * self.new_roots
            + self
                .components
                .values()
                .map(|c| c.reserve_shortfall())
                .sum::<u64>()
    }

    /// Blocks the disk group holds for data written: committed blocks less
    /// reservations.
    pub(crate) fn written_blocks(&self) -> u64 {
        let reserved: u64 = self
            .components
            .values()
            .map(|c| c.reserve_shortfall())
            .sum();
        self.committed_blocks().saturating_sub(reserved)
    }

    /// Index page roots the checkpoint lists.
    pub(crate) fn roots_total(&self) -> u64 {
        self.components.values().map(|c| c.listed_roots()).sum()
    }

    /// Puts a block in the overlay, replacing what it held for the LBA.
    pub(crate) fn overlay_insert(&mut self, key: (u64, u64), pending: Pending) {
        if pending.new_block {
            self.overlay_new += 1;
        }
        if let Some(old) = self.overlay.insert(key, pending) {
            if old.new_block {
                self.overlay_new -= 1;
            }
        }
    }

    /// Takes a block out of the overlay.
    pub(crate) fn overlay_remove(&mut self, key: &(u64, u64)) -> Option<Pending> {
        let old = self.overlay.remove(key)?;
        if old.new_block {
            self.overlay_new -= 1;
        }
        Some(old)
    }

    /// Adds a root with no slot pair yet for page `page_no` of `c`, unless
    /// the page has one.
    pub(crate) fn add_new_root(&mut self, c: u64, page_no: u64) {
        if let Some(comp) = self.components.get_mut(&c) {
            if let std::collections::btree_map::Entry::Vacant(v) = comp.roots.entry(page_no) {
                v.insert(RootEntry { loc: None, slot: 0 });
                self.new_roots += 1;
            }
        }
    }

    /// Whether page `page_no` of `c` is a slot pair other components share.
    pub(crate) fn page_shared(&self, c: u64, page_no: u64) -> bool {
        self.components
            .get(&c)
            .and_then(|comp| comp.roots.get(&page_no))
            .and_then(|r| r.loc)
            .is_some_and(|loc| self.page_shares.contains_key(&loc.pack(0)))
    }

    /// Makes the cached page `key` its component's own before the component
    /// changes it: if its slot pair is shared with other components
    /// (snapshots, clones), the component lets go of the pair (the others
    /// keep it unchanged) and the page gets a pair of its own at the next
    /// checkpoint; every block the page maps gets one more reference, the
    /// new page's, and the page's plain entries become shared ones (a block
    /// has at most one plain entry). Does nothing for a page the component
    /// alone holds. The page must be cached.
    pub(crate) fn own_page(&mut self, key: PageKey) {
        let Some(loc) = self
            .components
            .get(&key.0)
            .and_then(|comp| comp.roots.get(&key.1))
            .and_then(|r| r.loc)
        else {
            return;
        };
        let packed = loc.pack(0);
        match self.page_shares.get_mut(&packed) {
            None => return,
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                self.page_shares.remove(&packed);
            }
        }
        let blocks: Vec<BlockLoc> = match self.cache.get_to_change(&key) {
            Some(p) => {
                for e in p.page.entries.iter_mut() {
                    if e.kind == EntryKind::Plain {
                        e.kind = EntryKind::Shared;
                    }
                }
                p.page.entries.iter().filter_map(|e| e.block()).collect()
            }
            None => Vec::new(),
        };
        for b in blocks {
            self.add_ref(b);
        }
        if let Some(comp) = self.components.get_mut(&key.0) {
            comp.roots.insert(key.1, RootEntry { loc: None, slot: 0 });
            comp.release(loc, 2);
        }
        self.new_roots += 1;
    }

    /// Adds `dst`, a snapshot or clone whose index page roots are `roots`
    /// (every one with a slot pair, shared from here on), of family
    /// `family`, `size_bytes` and `allocated` mapped LBAs. A snapshot owns
    /// its root table (`snapshot`); a clone lists its roots in checkpoints.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add_copy(
        &mut self,
        dst: u64,
        family: u64,
        size_bytes: u64,
        allocated: u64,
        roots: &[PageRoot],
        snapshot: Option<SnapshotTable>,
        epoch: u64,
    ) {
        let mut comp = Component::new(dst, size_bytes, 0, epoch);
        comp.family = family;
        comp.allocated = allocated;
        for r in roots {
            // A snapshot's roots stay in its table, read when needed.
            if snapshot.is_none() {
                comp.roots.insert(r.page_no, RootEntry::listed(r));
            }
            comp.hold(r.loc, 2);
            *self.page_shares.entry(r.loc.pack(0)).or_insert(0) += 1;
        }
        if let Some(table) = &snapshot {
            for b in &table.blocks {
                comp.hold(*b, 1);
            }
        }
        comp.snapshot = snapshot;
        self.components.insert(dst, comp);
    }

    /// Calls `f` with the root of every page of `first..=last` of component
    /// `c` that has one, in page order. A snapshot's roots are read from the
    /// cached blocks of its root table: when some are not cached, nothing is
    /// called and the error names the blocks to load.
    pub(crate) fn for_each_root(
        &self,
        c: u64,
        first: u64,
        last: u64,
        mut f: impl FnMut(u64, RootEntry),
    ) -> Result<(), Vec<Fetch>> {
        let Some(comp) = self.components.get(&c) else {
            return Ok(());
        };
        let Some(table) = &comp.snapshot else {
            for (&page_no, root) in comp.roots.range(first..=last) {
                f(page_no, *root);
            }
            return Ok(());
        };
        let blocks = table.blocks_for(first, last);
        let missing: Vec<Fetch> = blocks
            .clone()
            .filter(|i| self.cache.roots(&(c, *i)).is_none())
            .filter_map(|i| {
                let at = *table.blocks.get(i as usize)?;
                Some(Fetch::Roots((c, i), at))
            })
            .collect();
        if !missing.is_empty() {
            return Err(missing);
        }
        for i in blocks {
            if let Some(cached) = self.cache.roots(&(c, i)) {
                for (page_no, root) in cached.range(first, last) {
                    f(page_no, root);
                }
            }
        }
        Ok(())
    }

    /// The root of page `page_no` of `c` if it is known without reading
    /// anything (a snapshot's from a cached block of its root table).
    pub(crate) fn cached_root(&self, c: u64, page_no: u64) -> Option<RootEntry> {
        let mut found = None;
        self.for_each_root(c, page_no, page_no, |_, r| found = Some(r))
            .ok()?;
        found
    }

    /// The roots of pages `first..=last` of `c` by page, or the root table
    /// blocks to load first (see [`State::for_each_root`]).
    pub(crate) fn roots_of(
        &self,
        c: u64,
        first: u64,
        last: u64,
    ) -> Result<BTreeMap<u64, RootEntry>, Vec<Fetch>> {
        let mut roots = BTreeMap::new();
        self.for_each_root(c, first, last, |p, r| {
            roots.insert(p, r);
        })?;
        Ok(roots)
    }

    /// Pages of `[start, end)` of component `c` that must be loaded first.
    pub(crate) fn missing_pages(&self, c: u64, start: u64, end: u64) -> Need {
        let mut need = Need::default();
        if !self.components.contains_key(&c) || end <= start {
            return need;
        }
        let (first, last) = (start / LBAS_PER_PAGE, (end - 1) / LBAS_PER_PAGE);
        // Every page of the range that exists is used: a page not yet
        // checkpointed is always in memory.
        let mut used = 0;
        let roots = self.for_each_root(c, first, last, |page_no, root| {
            used += 1;
            if let Some(loc) = root.current() {
                if !self.cache.contains(&(c, page_no)) {
                    need.0.push(Fetch::Page((c, page_no), loc));
                }
            }
        });
        if let Err(tables) = roots {
            // A snapshot: where its pages are comes first.
            need.0 = tables;
            return need;
        }
        if need.0.is_empty() {
            self.cache
                .used
                .fetch_add(used, std::sync::atomic::Ordering::Relaxed);
        } else if self.cache.prefetch_pages > 0 {
            // A miss: the pages after it are read too, beside it (no one
            // waits for them), as the next operations of a scan want them.
            // (A snapshot's whose roots are not cached are left for later.)
            let _ = self.for_each_root(
                c,
                last + 1,
                last + self.cache.prefetch_pages,
                |page_no, root| {
                    if let Some(loc) = root.current() {
                        if !self.cache.contains(&(c, page_no)) {
                            need.1.push(Fetch::Page((c, page_no), loc));
                        }
                    }
                },
            );
        }
        need
    }

    /// The index entry of `(c, lba)`; the page must be cached if it exists.
    fn index_entry(&self, c: u64, lba: u64) -> IndexEntry {
        let page_no = lba / LBAS_PER_PAGE;
        match self.cache.peek(&(c, page_no)) {
            Some(p) => p.page.entries[(lba % LBAS_PER_PAGE) as usize],
            None => IndexEntry::default(),
        }
    }

    fn is_mapped(&self, c: u64, lba: u64) -> bool {
        self.overlay.contains_key(&(c, lba)) || self.index_entry(c, lba).is_mapped()
    }

    /// What giving LBAs `lbas` of component `id` a block each would add:
    /// the LBAs that hold none yet, and the index pages that do not exist.
    fn growth(
        &self,
        id: ComponentId,
        lbas: impl Iterator<Item = u64>,
    ) -> Result<Growth, StoreError> {
        let comp = self.component(id)?;
        let mut g = Growth::default();
        for l in lbas {
            if !self.is_mapped(id.0, l) {
                g.new_lbas += 1;
            }
            if self.needs_block(id.0, l) {
                g.new_blocks += 1;
                g.first_new.get_or_insert(l);
            }
            let page_no = l / LBAS_PER_PAGE;
            if !comp.roots.contains_key(&page_no) {
                g.new_pages.insert(page_no);
            }
        }
        Ok(g)
    }

    /// Whether writing `(c, lba)` needs a new block: it holds none of its
    /// own in the overlay, and in the index it maps nothing or a block that
    /// other entries share (which must stay as it is for them). Pages must
    /// be cached.
    fn needs_block(&self, c: u64, lba: u64) -> bool {
        if self.overlay.contains_key(&(c, lba)) {
            return false;
        }
        match self.index_entry(c, lba).block() {
            None => true,
            Some(loc) => self.shares.is_shared(loc) || self.page_shared(c, lba / LBAS_PER_PAGE),
        }
    }

    /// Fails with `NoSpace` (naming the first LBA that needs a block)
    /// unless the disk group can take `growth`: a write to a block that
    /// snapshots or copies share needs a block of its own, and is refused
    /// here, cleanly, rather than when it is destaged.
    fn check_space(&self, id: ComponentId, growth: &Growth) -> Result<(), StoreError> {
        let Some(first_new) = growth.first_new.or_else(|| {
            (!growth.new_pages.is_empty())
                .then(|| growth.new_pages.first().copied().unwrap_or(0) * LBAS_PER_PAGE)
        }) else {
            return Ok(());
        };
        let comp = self.component(id)?;
        let new_pages = growth.new_pages.len() as u64;
        // A reservation already counts the blocks it will be written into.
        let reserved = comp.reserve_shortfall().min(growth.new_lbas);
        let after =
            self.committed_blocks() + growth.new_blocks.saturating_sub(reserved) + 2 * new_pages;
        let roots_after = self.roots_total() + new_pages;
        if after > self.usable_blocks || roots_after > self.roots_max {
            return Err(StoreError::NoSpace {
                component: id,
                lba: Lba(first_new),
            });
        }
        Ok(())
    }

    /// Plans a copy by reference of `blocks` LBAs from `(src, src_lba)` to
    /// `(dst, dst_lba)`: one log entry per source block (a share of its
    /// stored block, or an unmap of a run of holes). Returns `Ok(None)` when
    /// a source block is not yet in a committed checkpoint (still in the
    /// overlay, or in an index page changed since the last checkpoint): only
    /// a block the committed index references is known to be durable and to
    /// stay where it is, so the caller must wait for a checkpoint. Pages of
    /// both ranges must be cached.
    pub(crate) fn plan_clone(
        &self,
        src: ComponentId,
        src_lba: Lba,
        dst: ComponentId,
        dst_lba: Lba,
        blocks: u64,
        epoch: Epoch,
    ) -> Result<Option<Vec<LogEntry>>, StoreError> {
        let (s, d) = (src.0, dst.0);
        if self
            .overlay
            .range((s, src_lba.0)..(s, src_lba.0 + blocks))
            .next()
            .is_some()
        {
            return Ok(None);
        }
        self.component(src)?;
        let (first, last) = (
            src_lba.0 / LBAS_PER_PAGE,
            (src_lba.0 + blocks - 1) / LBAS_PER_PAGE,
        );
        let mut settled = true;
        let roots = self.for_each_root(s, first, last, |page_no, _| {
            settled &= self
                .cache
                .peek(&(s, page_no))
                .is_some_and(|p| !p.is_dirty() && p.pins == 0);
        });
        if roots.is_err() || !settled {
            return Ok(None);
        }
        self.component(dst)?;
        let mut entries = Vec::new();
        let mut shared_lbas = Vec::new();
        for i in 0..blocks {
            let (sl, dl) = (src_lba.0 + i, dst_lba.0 + i);
            let e = self.index_entry(s, sl);
            match e.kind {
                EntryKind::Unmapped => {
                    match entries.last_mut() {
                        Some(LogEntry {
                            op: LogOp::Unmap,
                            lba,
                            count,
                            ..
                        }) if *lba + *count == dl => *count += 1,
                        _ => entries.push(crate::engine::op_entry(
                            LogOp::Unmap,
                            d,
                            dl,
                            1,
                            epoch.0,
                            0,
                            0,
                        )),
                    }
                    continue;
                }
                EntryKind::Lost => {
                    return Err(StoreError::Checksum {
                        component: src,
                        lba: Lba(sl),
                    })
                }
                EntryKind::Plain | EntryKind::Shared => {}
            }
            shared_lbas.push(dl);
            entries.push(crate::engine::op_entry(
                LogOp::Share { crc: e.crc },
                d,
                dl,
                1,
                epoch.0,
                e.loc.pack(0),
                s,
            ));
        }
        let mut growth = self.growth(dst, shared_lbas.into_iter())?;
        // A copy by reference takes no block, only the pages to map it.
        growth.new_blocks = 0;
        growth.first_new = None;
        self.check_space(dst, &growth)?;
        Ok(Some(entries))
    }

    /// Fails with `NoSpace` unless `n` blocks from `lba` could be written
    /// now; changes nothing. Pages must be cached.
    pub(crate) fn check_write_space(
        &self,
        id: ComponentId,
        lba: Lba,
        n: u64,
    ) -> Result<(), StoreError> {
        self.component(id)?;
        // With room for the most the write could take (a new block for
        // every LBA, new pages for all of them) the answer needs no look at
        // each block: a placed write asks this before its data goes out, and
        // its staging checks the space again, block by block.
        let pages = n.div_ceil(LBAS_PER_PAGE) + 1;
        if self.committed_blocks() + n + 2 * pages <= self.usable_blocks
            && self.roots_total() + pages <= self.roots_max
        {
            return Ok(());
        }
        let growth = self.growth(id, lba.0..lba.0 + n)?;
        self.check_space(id, &growth)
    }

    /// Puts blocks of a write into the overlay with its accounting. Checks
    /// space first and changes nothing when there is none. Pages must be
    /// cached (see [`State::missing_pages`]).
    pub(crate) fn stage_write(
        &mut self,
        id: ComponentId,
        lba: Lba,
        blocks: &[(Bytes, u32, bool)],
        epoch: Epoch,
        check_space: bool,
    ) -> Result<Vec<u64>, StoreError> {
        let pending = blocks.iter().map(|(data, crc, lost)| Pending {
            op: 0,
            data: data.clone(),
            crc: *crc,
            lost: *lost,
            placed: None,
            new_block: false,
        });
        self.stage(id, lba, pending, epoch, check_space)
    }

    /// Puts the blocks of a placed write (already stored at their
    /// locations, with these CRCs) into the overlay with its accounting,
    /// and registers the reference each holds to its block (which the
    /// caller took: see `placed`). Checks space first and changes nothing
    /// when there is none. Pages must be cached.
    pub(crate) fn stage_placed(
        &mut self,
        id: ComponentId,
        lba: Lba,
        blocks: &[(BlockLoc, u32)],
        epoch: Epoch,
        check_space: bool,
    ) -> Result<Vec<u64>, StoreError> {
        let pending = blocks.iter().map(|(loc, crc)| Pending {
            op: 0,
            data: Bytes::new(),
            crc: *crc,
            lost: false,
            placed: Some(*loc),
            new_block: false,
        });
        let ops = self.stage(id, lba, pending, epoch, check_space)?;
        for (op, placed) in ops.iter().zip(blocks) {
            self.placed.insert(*op, *placed);
        }
        Ok(ops)
    }

    fn stage(
        &mut self,
        id: ComponentId,
        lba: Lba,
        blocks: impl ExactSizeIterator<Item = Pending>,
        epoch: Epoch,
        check_space: bool,
    ) -> Result<Vec<u64>, StoreError> {
        let c = id.0;
        let n = blocks.len() as u64;
        let growth = self.growth(id, lba.0..lba.0 + n)?;
        if check_space {
            self.check_space(id, &growth)?;
        }
        let mut ops = Vec::with_capacity(n as usize);
        for (i, mut pending) in blocks.enumerate() {
            let op = self.next_op;
            self.next_op += 1;
            let key = (c, lba.0 + i as u64);
            pending.op = op;
            // A placed block is on the capacity tier already; any other
            // takes a block when destaged unless the LBA has one of its own
            // to give back (or the overlay already counted one for it).
            pending.new_block = pending.placed.is_none()
                && match self.overlay.get(&key) {
                    Some(old) => old.new_block,
                    None => self.needs_block(c, key.1),
                };
            self.overlay_insert(key, pending);
            ops.push(op);
        }
        if let Some(comp) = self.components.get_mut(&c) {
            comp.allocated += growth.new_lbas;
            comp.highest_epoch = comp.highest_epoch.max(epoch.0);
        }
        for p in growth.new_pages {
            self.add_new_root(c, p);
        }
        Ok(ops)
    }

    /// Unmaps `[start, end)` of component `c`: drops overlay blocks and index
    /// entries, frees their blocks (after the next checkpoint) and adjusts the
    /// accounting. Idempotent, so a caller may apply a range in chunks and
    /// replay may apply it again.
    pub(crate) fn unmap_range(&mut self, c: u64, start: u64, end: u64) -> Result<(), Need> {
        if !self.components.contains_key(&c) || end <= start {
            return Ok(());
        }
        let need = self.missing_pages(c, start, end);
        if !need.0.is_empty() {
            return Err(need);
        }
        let keys: Vec<(u64, u64)> = self
            .overlay
            .range((c, start)..(c, end))
            .map(|(k, _)| *k)
            .collect();
        let mut unmapped = 0u64;
        let mut in_overlay = BTreeSet::new();
        for k in keys {
            self.overlay_remove(&k);
            unmapped += 1;
            in_overlay.insert(k.1);
        }
        let (first, last) = (start / LBAS_PER_PAGE, (end - 1) / LBAS_PER_PAGE);
        let pages: Vec<u64> = match self.components.get(&c) {
            Some(comp) => comp.roots.range(first..=last).map(|(p, _)| *p).collect(),
            None => Vec::new(),
        };
        let mut freed = Vec::new();
        for page_no in pages {
            let base = page_no * LBAS_PER_PAGE;
            let lo = start.max(base);
            let hi = end.min(base + LBAS_PER_PAGE);
            let changes = self.cache.peek(&(c, page_no)).is_some_and(|p| {
                p.page.entries[(lo - base) as usize..(hi - base) as usize]
                    .iter()
                    .any(|e| e.is_mapped())
            });
            if !changes {
                continue;
            }
            self.own_page((c, page_no));
            // `changes` said at least one entry here is cleared.
            let Some(cached) = self.cache.get_to_change(&(c, page_no)) else {
                continue;
            };
            for l in lo..hi {
                let e = &mut cached.page.entries[(l - base) as usize];
                if e.is_mapped() {
                    if !in_overlay.contains(&l) {
                        unmapped += 1;
                    }
                    if let Some(loc) = e.block() {
                        freed.push(loc);
                    }
                    *e = IndexEntry::default();
                }
            }
        }
        if let Some(comp) = self.components.get_mut(&c) {
            comp.allocated = comp.allocated.saturating_sub(unmapped);
            for loc in &freed {
                comp.release(*loc, 1);
            }
        }
        for loc in freed {
            self.drop_ref(loc);
        }
        Ok(())
    }

    /// Points `(c, lba)` at the stored block `loc` (CRC `crc`) by reference,
    /// replacing whatever the LBA held: a block copied by reference. The new
    /// reference is taken before the old one is dropped, so applying the
    /// same share twice (log replay over a checkpoint that already holds it)
    /// changes nothing. The page must be cached or absent from the roots.
    pub(crate) fn apply_share(
        &mut self,
        c: u64,
        lba: u64,
        loc: BlockLoc,
        crc: u32,
        epoch: u64,
    ) -> Result<(), Need> {
        if !self.components.contains_key(&c) {
            return Ok(());
        }
        let need = self.missing_pages(c, lba, lba + 1);
        if !need.0.is_empty() {
            return Err(need);
        }
        let page_no = lba / LBAS_PER_PAGE;
        let key = (c, page_no);
        if !self.cache.contains(&key) {
            self.cache.insert(key, IndexPage::empty(c, page_no), true);
            self.add_new_root(c, page_no);
        }
        self.own_page(key);
        let was_mapped = self.is_mapped(c, lba);
        self.overlay_remove(&(c, lba));
        self.add_ref(loc);
        let slot = (lba % LBAS_PER_PAGE) as usize;
        let old = match self.cache.get_to_change(&key) {
            Some(p) => {
                let old = p.page.entries[slot];
                p.page.entries[slot] = IndexEntry::shared(loc, crc);
                old
            }
            None => return Ok(()),
        };
        if let Some(comp) = self.components.get_mut(&c) {
            if !was_mapped {
                comp.allocated += 1;
            }
            comp.highest_epoch = comp.highest_epoch.max(epoch);
            comp.hold(loc, 1);
            if let Some(old_loc) = old.block() {
                comp.release(old_loc, 1);
            }
        }
        if let Some(old_loc) = old.block() {
            self.drop_ref(old_loc);
        }
        Ok(())
    }

    /// Where each block of a read comes from. Pages must be cached.
    pub(crate) fn plan_read(
        &mut self,
        id: ComponentId,
        lba: Lba,
        blocks: u64,
    ) -> Result<Vec<Source>, StoreError> {
        let c = id.0;
        let mut out = Vec::with_capacity(blocks as usize);
        for l in lba.0..lba.0 + blocks {
            if let Some(p) = self.overlay.get(&(c, l)) {
                out.push(match (p.lost, p.placed) {
                    (true, _) => Source::Lost,
                    (false, Some(loc)) => Source::Disk(loc, p.crc),
                    (false, None) => Source::Memory(p.data.clone(), p.crc),
                });
                continue;
            }
            let page_no = l / LBAS_PER_PAGE;
            let e = match self.cache.get(&(c, page_no)) {
                Some(p) => p.page.entries[(l % LBAS_PER_PAGE) as usize],
                None => IndexEntry::default(),
            };
            out.push(match e.kind {
                EntryKind::Unmapped => Source::Zero,
                EntryKind::Plain | EntryKind::Shared => Source::Disk(e.loc, e.crc),
                EntryKind::Lost => Source::Lost,
            });
        }
        Ok(out)
    }

    /// Appends the runs of allocated blocks of `[start, end)` of `c` to `runs`
    /// (merging with the last run). Pages must be cached.
    pub(crate) fn allocated_runs(&self, c: u64, start: u64, end: u64, runs: &mut Vec<(Lba, u64)>) {
        if !self.components.contains_key(&c) || end <= start {
            return;
        }
        let (first, last) = (start / LBAS_PER_PAGE, (end - 1) / LBAS_PER_PAGE);
        // With the pages cached, a page exists exactly when it is cached
        // (see `missing_pages`), which is what a snapshot whose roots were
        // dropped meanwhile falls back on.
        let pages: Vec<u64> = match self.roots_of(c, first, last) {
            Ok(roots) => roots.into_keys().collect(),
            Err(_) => (first..=last)
                .filter(|p| self.cache.contains(&(c, *p)))
                .collect(),
        };
        for page_no in pages {
            let base = page_no * LBAS_PER_PAGE;
            for l in start.max(base)..end.min(base + LBAS_PER_PAGE) {
                if self.is_mapped(c, l) {
                    match runs.last_mut() {
                        Some((s, n)) if s.0 + *n == l => *n += 1,
                        _ => runs.push((Lba(l), 1)),
                    }
                }
            }
        }
    }

    /// Pages of `[start, end)` that [`State::changed_runs`] must read: those
    /// of `base` and `c` whose slot pairs differ, where one of them has a
    /// committed copy not cached.
    pub(crate) fn missing_changed_pages(&self, base: u64, c: u64, start: u64, end: u64) -> Need {
        let mut need = Need::default();
        if end <= start {
            return need;
        }
        let (first, last) = (start / LBAS_PER_PAGE, (end - 1) / LBAS_PER_PAGE);
        if !self.components.contains_key(&base) || !self.components.contains_key(&c) {
            return need;
        }
        let (base_roots, roots) = match (
            self.roots_of(base, first, last),
            self.roots_of(c, first, last),
        ) {
            (Ok(b), Ok(r)) => (b, r),
            (b, r) => {
                need.0 = b.err().into_iter().chain(r.err()).flatten().collect();
                return need;
            }
        };
        for page_no in base_roots.keys().chain(roots.keys()) {
            let (b, r) = (base_roots.get(page_no), roots.get(page_no));
            if same_pair(b, r) {
                continue;
            }
            for (id, root) in [(base, b), (c, r)] {
                if let Some(loc) = root.and_then(RootEntry::current) {
                    if !self.cache.contains(&(id, *page_no)) {
                        need.0.push(Fetch::Page((id, *page_no), loc));
                    }
                }
            }
        }
        need.0.sort();
        need.0.dedup();
        need
    }

    /// Appends to `runs` (merging with the last run) the LBAs of `[start,
    /// end)` where `c` may hold other data than `base`: mapped to another
    /// block or mapped in one only, or with a write still staged for either.
    /// Pages both share (one slot pair, unchanged since) are skipped whole,
    /// so two snapshots a few writes apart compare in a few page reads.
    /// Never leaves out an LBA that differs; may name one that does not (a
    /// staged write of the same data). Pages of [`State::missing_changed_pages`]
    /// must be cached.
    pub(crate) fn changed_runs(
        &self,
        base: u64,
        c: u64,
        start: u64,
        end: u64,
        runs: &mut Vec<(Lba, u64)>,
    ) {
        if end <= start {
            return;
        }
        if !self.components.contains_key(&base) || !self.components.contains_key(&c) {
            return;
        }
        let (first, last) = (start / LBAS_PER_PAGE, (end - 1) / LBAS_PER_PAGE);
        let (Ok(base_roots), Ok(roots)) = (
            self.roots_of(base, first, last),
            self.roots_of(c, first, last),
        ) else {
            // The caller had the roots cached: should a snapshot's have been
            // dropped meanwhile, the whole range is named (never too little).
            match runs.last_mut() {
                Some((s, n)) if s.0 + *n == start => *n += end - start,
                _ => runs.push((Lba(start), end - start)),
            }
            return;
        };
        let staged: BTreeSet<u64> = self
            .overlay
            .keys()
            .filter(|(id, l)| (*id == base || *id == c) && (start..end).contains(l))
            .map(|(_, l)| *l)
            .collect();
        let mut push = |l: u64| match runs.last_mut() {
            Some((s, n)) if s.0 + *n == l => *n += 1,
            _ => runs.push((Lba(l), 1)),
        };
        for page_no in first..=last {
            let base_lba = page_no * LBAS_PER_PAGE;
            let (from, to) = (start.max(base_lba), end.min(base_lba + LBAS_PER_PAGE));
            let shared = same_pair(base_roots.get(&page_no), roots.get(&page_no));
            for l in from..to {
                let differs = staged.contains(&l)
                    || (!shared && {
                        let (a, b) = (self.index_entry(base, l), self.index_entry(c, l));
                        a.kind == EntryKind::Lost
                            || b.kind == EntryKind::Lost
                            || a.block() != b.block()
                    });
                if differs {
                    push(l);
                }
            }
        }
    }

    /// Removes a component from the table with its cached pages; the caller
    /// frees its blocks once it has read the pages that were not cached.
    /// Pages whose slot pair other components share (a snapshot's, a
    /// clone's) stay with them: the component only lets go of its share, and
    /// they are left out of the returned roots and pages, so the caller
    /// frees only what the component alone held (its root table too, for a
    /// snapshot).
    ///
    /// A snapshot's roots are not in memory: `table_roots` are those its
    /// root table lists, read by the caller (a snapshot's never change).
    pub(crate) fn take_component(
        &mut self,
        c: u64,
        table_roots: Vec<PageRoot>,
    ) -> Option<(Component, Vec<IndexPage>)> {
        let mut comp = self.components.remove(&c)?;
        if comp.snapshot.is_some() {
            comp.roots = table_roots
                .into_iter()
                .map(|r| (r.page_no, RootEntry::listed(&r)))
                .collect();
        }
        let mut kept_shared = Vec::new();
        for (page_no, root) in &comp.roots {
            match root.loc {
                None => self.new_roots = self.new_roots.saturating_sub(1),
                Some(loc) => {
                    let packed = loc.pack(0);
                    match self.page_shares.get_mut(&packed) {
                        Some(n) if *n > 1 => *n -= 1,
                        Some(_) => {
                            self.page_shares.remove(&packed);
                        }
                        None => continue,
                    }
                    kept_shared.push(*page_no);
                }
            }
        }
        for page_no in kept_shared {
            comp.roots.remove(&page_no);
        }
        let mut cached = Vec::new();
        for page_no in comp.roots.keys() {
            if let Some(p) = self.cache.remove(&(c, *page_no)) {
                cached.push(p.page);
            }
        }
        self.cache.remove_component(c);
        let keys: Vec<(u64, u64)> = self
            .overlay
            .range((c, 0)..(c, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            self.overlay_remove(&k);
        }
        Some((comp, cached))
    }

    /// Fails a capacity device: no more allocation there, and every component
    /// holding blocks on it fails; the last one fails the disk group.
    pub(crate) fn fail_capacity_device(&mut self, device: u8, reason: &str) {
        self.alloc.fail_device(device);
        self.failed_devices
            .entry(device)
            .or_insert_with(|| reason.to_string());
        for comp in self.components.values_mut() {
            let holds = comp.per_device.get(&device).copied().unwrap_or(0) > 0
                || comp
                    .roots
                    .values()
                    .any(|r| r.loc.is_some_and(|l| l.device == device));
            if holds && comp.failed.is_none() {
                comp.failed = Some(format!("capacity device {device} failed: {reason}"));
            }
        }
        // With no capacity device left (the index lives there too) every
        // component is lost, including those whose blocks were all still
        // in the log.
        if self.alloc.all_failed() {
            self.fail_group(format!(
                "every capacity device failed (device {device}: {reason})"
            ));
        }
    }

    /// Where the checkpoint tail can move: the oldest record whose effects are
    /// not all applied, as (virtual block, sequence).
    pub(crate) fn applied_tail(&self) -> (u64, u64) {
        let mut tail = (self.vhead, self.head_seq);
        if let Some(r) = self.destage.front() {
            if r.seq < tail.1 {
                tail = (r.vstart, r.seq);
            }
        }
        for &(seq, vpos) in self.unapplied.values() {
            if seq < tail.1 {
                tail = (vpos, seq);
            }
        }
        tail
    }

    /// Fails waiting requests because the disk group is closing.
    pub(crate) fn fail_group_quietly(&mut self, reason: &str) {
        let unsynced: Vec<Request> = self.take_unsynced_requests();
        for mut r in self.queue.drain(..).chain(unsynced) {
            if let Some(done) = r.done.take() {
                let _ = done.send(Err(StoreError::DiskGroupFailed {
                    reason: reason.to_string(),
                }));
            }
        }
    }

    /// Marks the disk group failed; every waiting request gets the error.
    pub(crate) fn fail_group(&mut self, reason: String) {
        if self.failed.is_none() {
            tracing::error!(%reason, "disk group failed");
            self.failed = Some(reason.clone());
        }
        let unsynced: Vec<Request> = self.take_unsynced_requests();
        for mut r in self.queue.drain(..).chain(unsynced) {
            if let Some(done) = r.done.take() {
                let _ = done.send(Err(StoreError::DiskGroupFailed {
                    reason: reason.clone(),
                }));
            }
        }
    }

    /// Removes the batches written but not yet synced and returns their
    /// requests (to be failed: nothing acknowledges them any more).
    fn take_unsynced_requests(&mut self) -> Vec<Request> {
        self.unsynced_blocks = 0;
        self.unsynced.drain(..).flat_map(|b| b.reqs).collect()
    }
}

/// Whether two components' roots of one page name the same committed slot
/// pair and copy (or neither has the page): their entries are then equal.
fn same_pair(a: Option<&RootEntry>, b: Option<&RootEntry>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => a.loc.is_some() && a == b,
        _ => false,
    }
}
