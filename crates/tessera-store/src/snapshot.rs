//! Snapshots and linked clones of components.
//!
//! Owns: taking a snapshot (a read-only point in time of a component), making
//! a linked clone of a snapshot (a writable component that starts as the
//! snapshot), and the root tables that record where a snapshot's index pages
//! are. Must not touch: which component is whose snapshot in the cluster,
//! names, schedules (decided above the store).
//!
//! A snapshot copies no data and no index page: it takes the source's page
//! roots, so both map every LBA through the same index pages, and a read
//! costs one index lookup whatever the number of snapshots. The first change
//! either side makes to a shared page gives that side a page of its own
//! (`State::own_page`); blocks are shared by reference and freed when their
//! last page lets go. Deleting any snapshot lets go of its pages only, so
//! snapshots come and go in any order and nothing is ever merged or copied.
//!
//! Invariants:
//! - A snapshot's page roots never change, and are in its root table, which
//!   is written and synced before the log record that creates the snapshot.
//!   So a checkpoint names the table instead of listing the pages, and
//!   replay rebuilds the snapshot from the table alone.
//! - A snapshot is taken of a component whose pages are all committed (no
//!   block waiting in the overlay, no page changed since the last
//!   checkpoint, none being written): the table then names only page copies
//!   that a checkpoint made durable, and that no one overwrites while a
//!   component shares them.

use crate::engine::{PageReadError, Shared};
use crate::index::{RootBlockKey, RootEntry};
use crate::state::{Request, SnapshotTable};
use crate::{DiskGroup, StoreError};
use std::sync::Arc;
use std::time::Duration;
use tessera_env::{AlignedBuf, Disk};
use tessera_format::{
    root_table_blocks, BlockLoc, LogOp, PageRoot, RootTableBlock, RootTableRef, BLOCK,
    ROOTS_PER_BLOCK,
};
use tessera_types::{ComponentId, Epoch, Lba, BLOCK_BYTES};

/// How long a snapshot waits for its source's pages to be committed.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);

/// A snapshot's root table as read back.
pub(crate) struct RootTable {
    pub(crate) family: u64,
    pub(crate) size_bytes: u64,
    pub(crate) allocated: u64,
    pub(crate) roots: Vec<PageRoot>,
    /// The chain's blocks, in order.
    pub(crate) blocks: Vec<BlockLoc>,
}

/// Reads the root table `table` of snapshot `component` from `devices`
/// (device 0 is the cache device, which never holds one). Every block must
/// decode, belong to the snapshot and sit at its place in the chain.
pub(crate) fn read_root_table(
    devices: &[Arc<dyn Disk>],
    table: RootTableRef,
    component: u64,
) -> Result<RootTable, String> {
    let mut out = RootTable {
        family: 0,
        size_bytes: 0,
        allocated: 0,
        roots: Vec::new(),
        blocks: Vec::new(),
    };
    let mut next = Some(table.first);
    for index in 0..table.blocks {
        let Some(loc) = next else {
            return Err(format!(
                "root table of component {component} ends after {index} of {} blocks",
                table.blocks
            ));
        };
        let block = read_table_block(devices, (component, index), loc).map_err(|e| match e {
            PageReadError::Io(e) => format!("root table block {loc}: {e}"),
            PageReadError::Damaged(reason) => reason,
        })?;
        // Blocks are filled in order (see `encode_root_table`), which is
        // what finding a page's block without reading the others relies on.
        if index + 1 < table.blocks && block.roots.len() != ROOTS_PER_BLOCK {
            return Err(format!(
                "root table block {loc} of component {component} holds {} roots, not {ROOTS_PER_BLOCK}",
                block.roots.len()
            ));
        }
        out.family = block.family;
        out.size_bytes = block.size_bytes;
        out.allocated = block.allocated;
        out.roots.extend(block.roots);
        out.blocks.push(loc);
        next = block.next;
    }
    Ok(out)
}

/// Reads block `key.1` of the root table of snapshot `key.0` from `loc`:
/// it must decode and be that block of that snapshot's table.
fn read_table_block(
    devices: &[Arc<dyn Disk>],
    key: RootBlockKey,
    loc: BlockLoc,
) -> Result<RootTableBlock, PageReadError> {
    let (component, index) = key;
    let disk = match loc.device {
        0 => None,
        d => devices.get(d as usize),
    }
    .ok_or_else(|| {
        PageReadError::Damaged(format!("root table block {loc} is on no capacity device"))
    })?;
    let mut buf = AlignedBuf::zeroed(BLOCK);
    disk.read_at(buf.as_mut_slice(), loc.block * BLOCK_BYTES)
        .map_err(PageReadError::Io)?;
    let block = RootTableBlock::decode(buf.as_slice())
        .map_err(|e| PageReadError::Damaged(format!("root table block {loc}: {e}")))?;
    if block.component != component || block.index != index {
        return Err(PageReadError::Damaged(format!(
            "root table block {loc} is block {} of component {}, not block {index} of {component}",
            block.index, block.component
        )));
    }
    Ok(block)
}

/// The roots one block of a snapshot's root table lists, for the index
/// cache.
pub(crate) fn read_root_block(
    shared: &Shared,
    key: RootBlockKey,
    loc: BlockLoc,
) -> Result<Vec<PageRoot>, PageReadError> {
    read_table_block(&shared.devices, key, loc).map(|b| b.roots)
}

impl Shared {
    /// The page roots the root table of snapshot `c` lists, read from its
    /// blocks (none for a component that is no snapshot, or a snapshot
    /// whose table could not be read when it was opened). A snapshot's
    /// roots never change, so they may be read without the state lock.
    pub(crate) fn snapshot_roots(&self, c: u64) -> Result<Vec<PageRoot>, StoreError> {
        let table = {
            let st = self.state.lock();
            match st
                .components
                .get(&c)
                .and_then(|comp| comp.snapshot.as_ref())
            {
                Some(t) if !t.blocks.is_empty() => t.table,
                _ => return Ok(Vec::new()),
            }
        };
        read_root_table(&self.devices, table, c)
            .map(|t| t.roots)
            .map_err(|reason| StoreError::ComponentFailed {
                component: ComponentId(c),
                reason,
            })
    }
}

/// The encoded blocks of a root table at `blocks`.
fn encode_root_table(
    component: u64,
    family: u64,
    size_bytes: u64,
    allocated: u64,
    roots: &[PageRoot],
    blocks: &[BlockLoc],
) -> Vec<(BlockLoc, AlignedBuf)> {
    let mut chunks: Vec<&[PageRoot]> = roots.chunks(ROOTS_PER_BLOCK).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    chunks
        .iter()
        .enumerate()
        .map(|(i, chunk)| {
            let bytes = RootTableBlock {
                component,
                family,
                size_bytes,
                allocated,
                index: i as u64,
                next: blocks.get(i + 1).copied(),
                roots: chunk.to_vec(),
            }
            .encode();
            let mut buf = AlignedBuf::zeroed(BLOCK);
            buf.as_mut_slice().copy_from_slice(&bytes);
            (blocks[i], buf)
        })
        .collect()
}

/// Writes and syncs a root table.
fn write_root_table(shared: &Shared, writes: &[(BlockLoc, AlignedBuf)]) -> Result<(), String> {
    let mut devices = std::collections::BTreeSet::new();
    for (loc, buf) in writes {
        let disk = shared
            .disk(loc.device)
            .ok_or_else(|| format!("root table block {loc} is on no capacity device"))?;
        disk.write_at(buf.as_slice(), loc.block * BLOCK_BYTES)
            .map_err(|e| format!("capacity device {}: {e}", loc.device))?;
        devices.insert(loc.device);
    }
    for d in devices {
        if let Some(disk) = shared.disk(d) {
            disk.sync()
                .map_err(|e| format!("capacity device {d}: {e}"))?;
        }
    }
    Ok(())
}

/// A component's state that a snapshot copies, once every page of it is
/// committed; None while some are not.
struct Settled {
    family: u64,
    size_bytes: u64,
    allocated: u64,
    highest_epoch: u64,
    roots: Vec<PageRoot>,
}

fn settled(st: &crate::state::State, src: u64) -> Option<Settled> {
    let comp = st.components.get(&src)?;
    if st.overlay.range((src, 0)..(src, u64::MAX)).next().is_some() {
        return None;
    }
    let mut roots = Vec::with_capacity(comp.roots.len());
    for (page_no, root) in &comp.roots {
        let loc = root.loc?;
        if st
            .cache
            .peek(&(src, *page_no))
            .is_some_and(|p| p.is_dirty() || p.pins > 0)
        {
            return None;
        }
        roots.push(PageRoot {
            page_no: *page_no,
            loc,
            slot: root.slot,
        });
    }
    Some(Settled {
        family: comp.family,
        size_bytes: comp.size_bytes,
        allocated: comp.allocated,
        highest_epoch: comp.highest_epoch,
        roots,
    })
}

impl DiskGroup {
    /// Takes a snapshot `dst` of component `src`: a read-only component
    /// holding what `src` holds now, sharing every index page and block
    /// with it. Writes to `src` wait while it is taken (they are ordered
    /// before or after it); the caller orders it against writes in flight
    /// elsewhere. Taking the same snapshot again succeeds and changes
    /// nothing.
    pub async fn snapshot_component(
        &self,
        src: ComponentId,
        dst: ComponentId,
        epoch: Epoch,
    ) -> Result<(), StoreError> {
        if let Some(done) = self.copy_exists(src, dst, true)? {
            return done;
        }
        let lock = {
            let st = self.shared().state.lock();
            st.check_writable(src)?;
            st.check_epoch(src, epoch)?;
            st.component(src)?.lock.clone()
        };
        // One destage pass and checkpoint before the source's writes are
        // made to wait, so the one under the lock has only what arrives
        // meanwhile: the pause clients see is that one.
        self.checkpoint_once(SETTLE_TIMEOUT).await?;
        let _guard = lock.write().await;
        // Bring the source's pages to the capacity tier and into a
        // checkpoint: its writes wait on the lock meanwhile.
        let deadline = std::time::Instant::now() + SETTLE_TIMEOUT;
        let (source, blocks) = loop {
            {
                let mut st = self.shared().state.lock();
                st.check_group()?;
                st.check_epoch(src, epoch)?;
                if st.components.contains_key(&dst.0) {
                    return Err(StoreError::ComponentExists {
                        component: dst,
                        size_bytes: st.components[&dst.0].size_bytes,
                    });
                }
                if let Some(source) = settled(&st, src.0) {
                    let n = root_table_blocks(source.roots.len());
                    if st.components.len() as u64 >= crate::COMPONENTS_MAX
                        || st.committed_blocks() + n as u64 > st.usable_blocks
                    {
                        return Err(StoreError::NoSpace {
                            component: dst,
                            lba: tessera_types::Lba(0),
                        });
                    }
                    let Some(blocks) = st.alloc.allocate(n) else {
                        return Err(StoreError::NoSpace {
                            component: dst,
                            lba: tessera_types::Lba(0),
                        });
                    };
                    break (source, blocks);
                }
                // A checkpoint request makes the destager move what is
                // logged now (without waiting to gather more) and then
                // checkpoint.
                st.checkpoint_wanted = true;
                self.shared().destage_work.notify_all();
            }
            if std::time::Instant::now() > deadline {
                return Err(StoreError::DiskGroupFailed {
                    reason: format!(
                        "component {src}: its pages were not committed within {SETTLE_TIMEOUT:?}; snapshot {dst} not taken"
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let writes = encode_root_table(
            dst.0,
            source.family,
            source.size_bytes,
            source.allocated,
            &source.roots,
            &blocks,
        );
        let shared = self.shared().clone();
        let written = tokio::task::spawn_blocking(move || write_root_table(&shared, &writes))
            .await
            .map_err(|e| StoreError::DiskGroupFailed {
                reason: format!("root table task failed: {e}"),
            })?;
        let table = RootTableRef {
            first: blocks[0],
            blocks: blocks.len() as u64,
        };
        let rx = {
            let mut st = self.shared().state.lock();
            if let Err(reason) = written {
                st.alloc.free_all(&blocks);
                return Err(StoreError::DiskGroupFailed { reason });
            }
            if let Err(e) = st.check_group() {
                st.alloc.free_all(&blocks);
                return Err(e);
            }
            let snapshot = SnapshotTable::new(table, blocks, &source.roots);
            st.add_copy(
                dst.0,
                source.family,
                source.size_bytes,
                source.allocated,
                &source.roots,
                Some(snapshot),
                source.highest_epoch.max(epoch.0),
            );
            self.log_copy(&mut st, LogOp::Snapshot, dst, table, epoch, src)
        };
        Self::wait(rx).await
    }

    /// Has the destager run one destage pass and checkpoint, and waits for
    /// the checkpoint (at most `timeout`).
    async fn checkpoint_once(&self, timeout: Duration) -> Result<(), StoreError> {
        let deadline = std::time::Instant::now() + timeout;
        let target = {
            let mut st = self.shared().state.lock();
            st.check_group()?;
            st.checkpoint_wanted = true;
            st.checkpoints_done + 1
        };
        self.shared().destage_work.notify_all();
        loop {
            {
                let st = self.shared().state.lock();
                st.check_group()?;
                if st.checkpoints_done >= target || std::time::Instant::now() > deadline {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Makes `dst` a linked clone of the snapshot `snapshot`: a writable
    /// component that holds what the snapshot holds, sharing its pages and
    /// blocks until it changes them. Instant: nothing is copied. Making the
    /// same clone again succeeds and changes nothing.
    pub async fn clone_component(
        &self,
        snapshot: ComponentId,
        dst: ComponentId,
        epoch: Epoch,
    ) -> Result<(), StoreError> {
        if let Some(done) = self.copy_exists(snapshot, dst, false)? {
            return done;
        }
        let not_a_snapshot = || {
            StoreError::Config(format!(
                "component {snapshot} is not a snapshot: only a snapshot can be cloned"
            ))
        };
        // The snapshot's roots, from its table (held read-locked, so it is
        // not deleted meanwhile).
        let lock = self.component_lock(snapshot)?;
        let _guard = lock.read().await;
        if !self.is_snapshot(snapshot)? {
            return Err(not_a_snapshot());
        }
        let shared = self.shared().clone();
        let roots = tokio::task::spawn_blocking(move || shared.snapshot_roots(snapshot.0))
            .await
            .map_err(|e| StoreError::DiskGroupFailed {
                reason: format!("root table task failed: {e}"),
            })??;
        let rx = {
            let mut st = self.shared().state.lock();
            st.check_group()?;
            let comp = st.component(snapshot)?;
            let Some(table) = comp.snapshot.as_ref().map(|t| t.table) else {
                return Err(not_a_snapshot());
            };
            if st.components.len() as u64 >= crate::COMPONENTS_MAX
                || st.roots_total() + roots.len() as u64 > st.roots_max
            {
                return Err(StoreError::NoSpace {
                    component: dst,
                    lba: tessera_types::Lba(0),
                });
            }
            if st.components.contains_key(&dst.0) {
                return Err(StoreError::ComponentExists {
                    component: dst,
                    size_bytes: st.components[&dst.0].size_bytes,
                });
            }
            let (family, size_bytes, allocated) = (comp.family, comp.size_bytes, comp.allocated);
            st.add_copy(
                dst.0, family, size_bytes, allocated, &roots, None,
                // A clone is a new object: its owners count epochs from `epoch`.
                epoch.0,
            );
            self.log_copy(&mut st, LogOp::Clone, dst, table, epoch, snapshot)
        };
        Self::wait(rx).await
    }

    /// Queues the log record that makes `dst` a snapshot or clone (`op`) of
    /// `source` from the root table `table`; the receiver answers once it
    /// is durable.
    fn log_copy(
        &self,
        st: &mut crate::state::State,
        op: LogOp,
        dst: ComponentId,
        table: RootTableRef,
        epoch: Epoch,
        source: ComponentId,
    ) -> tokio::sync::oneshot::Receiver<Result<(), StoreError>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let entry = crate::engine::op_entry(
            op,
            dst.0,
            0,
            table.blocks,
            epoch.0,
            table.first.pack(0),
            source.0,
        );
        Self::enqueue(
            st,
            self.shared(),
            Request {
                entries: vec![entry],
                data: Vec::new(),
                writes: Vec::new(),
                token: None,
                done: Some(tx),
            },
        );
        rx
    }

    /// Runs of blocks within `[from, from + blocks)` where component `id`
    /// may hold other data than component `base` of the same disk group, in
    /// order, as (first LBA, block count): what a copy that holds `base`
    /// must be sent to hold `id`. Never leaves out a block that differs. A
    /// snapshot and the snapshot or volume taken after it compare in the
    /// index pages the writes between them changed, not in the whole index.
    pub async fn changed(
        &self,
        base: ComponentId,
        id: ComponentId,
        from: Lba,
        blocks: u64,
    ) -> Result<Vec<(Lba, u64)>, StoreError> {
        // Both read-locked (in id order, as every taker of two does), so
        // neither is deleted or snapshotted meanwhile.
        let (first, second) = if base.0 <= id.0 {
            (base, id)
        } else {
            (id, base)
        };
        let first_lock = self.component_lock(first)?;
        let second_lock = self.component_lock(second)?;
        let _first = first_lock.read().await;
        let _second = if first != second {
            Some(second_lock.read().await)
        } else {
            None
        };
        let end = {
            let st = self.shared().state.lock();
            let (b, c) = (st.component(base)?, st.component(id)?);
            from.0
                .saturating_add(blocks)
                .min(c.blocks().max(b.blocks()))
        };
        let mut runs: Vec<(Lba, u64)> = Vec::new();
        self.per_cached_chunk(
            from.0,
            end,
            "compare components",
            |st, s, e| {
                st.component(base)?;
                st.component(id)?;
                Ok(st.missing_changed_pages(base.0, id.0, s, e))
            },
            |st, s, e| st.changed_runs(base.0, id.0, s, e, &mut runs),
        )
        .await?;
        Ok(runs)
    }

    /// Whether `id` is a snapshot.
    pub fn is_snapshot(&self, id: ComponentId) -> Result<bool, StoreError> {
        let st = self.shared().state.lock();
        Ok(st.component(id)?.snapshot.is_some())
    }

    /// `Some(Ok)` when `dst` already is a snapshot (or, for `!snapshot`, a
    /// clone) of the same family and size as `src`: the request was done
    /// before. `Some(Err)` when `dst` is something else.
    fn copy_exists(
        &self,
        src: ComponentId,
        dst: ComponentId,
        snapshot: bool,
    ) -> Result<Option<Result<(), StoreError>>, StoreError> {
        let st = self.shared().state.lock();
        st.check_group()?;
        let Some(existing) = st.components.get(&dst.0) else {
            return Ok(None);
        };
        let same = st.components.get(&src.0).is_some_and(|s| {
            s.family == existing.family
                && s.size_bytes == existing.size_bytes
                && existing.snapshot.is_some() == snapshot
        });
        Ok(Some(if same {
            Ok(())
        } else {
            Err(StoreError::ComponentExists {
                component: dst,
                size_bytes: existing.size_bytes,
            })
        }))
    }
}

impl DiskGroup {
    /// Checks, with the disk group paused, that every block's reference
    /// count matches what references it: each index page instance (a slot
    /// pair shared by snapshots and clones counts once, a page changed in
    /// memory counts as its own) and each placed write not yet destaged;
    /// that every referenced block is marked used and none waits to be
    /// freed; and that each shared pair's share count matches the
    /// components that list it. Reads every index page: for tests and
    /// diagnosis, not for a busy disk group. Returns what disagrees.
    pub async fn audit_references(&self) -> Result<(), String> {
        let shared = self.shared().clone();
        tokio::task::spawn_blocking(move || audit(&shared))
            .await
            .map_err(|e| format!("audit task failed: {e}"))?
    }
}

fn audit(shared: &Shared) -> Result<(), String> {
    use std::collections::HashMap;
    // Snapshots' roots, from their tables (the disk group is paused: none
    // is taken or deleted meanwhile).
    let snapshots: Vec<u64> = {
        let st = shared.state.lock();
        st.components
            .iter()
            .filter(|(_, c)| c.snapshot.is_some() && c.failed.is_none())
            .map(|(id, _)| *id)
            .collect()
    };
    let mut table_roots = HashMap::new();
    for c in snapshots {
        let roots = shared
            .snapshot_roots(c)
            .map_err(|e| format!("snapshot {c}: {e}"))?;
        table_roots.insert(
            c,
            roots
                .into_iter()
                .map(|r| (r.page_no, RootEntry::listed(&r)))
                .collect::<std::collections::BTreeMap<_, _>>(),
        );
    }
    let st = shared.state.lock();
    let mut refs: HashMap<u64, u32> = HashMap::new();
    let mut pair_users: HashMap<u64, u32> = HashMap::new();
    let mut seen_pairs = std::collections::HashSet::new();
    let mut problems = Vec::new();
    for (&c, comp) in &st.components {
        if comp.failed.is_some() {
            continue;
        }
        let roots = table_roots.get(&c).unwrap_or(&comp.roots);
        for (&page_no, root) in roots {
            if let Some(loc) = root.loc {
                *pair_users.entry(loc.pack(0)).or_insert(0) += 1;
                for b in [
                    loc,
                    BlockLoc {
                        device: loc.device,
                        block: loc.block + 1,
                    },
                ] {
                    if !st.alloc.is_used(b) {
                        problems.push(format!("component {c} page {page_no}: slot {b} is free"));
                    }
                }
                if !seen_pairs.insert(loc.pack(0)) {
                    continue;
                }
            }
            let page = match st.cache.peek(&(c, page_no)) {
                Some(p) => p.page.clone(),
                None => match root.current() {
                    None => continue,
                    Some(at) => shared
                        .read_page((c, page_no), at, comp.family)
                        .map_err(|_| format!("component {c} page {page_no} unreadable"))?,
                },
            };
            for e in &page.entries {
                if let Some(b) = e.block() {
                    *refs.entry(b.pack(0)).or_insert(0) += 1;
                }
            }
        }
        if let Some(table) = &comp.snapshot {
            for b in &table.blocks {
                *refs.entry(b.pack(0)).or_insert(0) += 1;
            }
        }
    }
    for (loc, _) in st.placed.values() {
        *refs.entry(loc.pack(0)).or_insert(0) += 1;
    }
    let pending: std::collections::HashSet<u64> =
        st.pending_free.iter().map(|l| l.pack(0)).collect();
    for (&key, &n) in &refs {
        let loc = BlockLoc::unpack(key).0;
        let counted = 1 + st.shares.extra(loc);
        if counted != n {
            problems.push(format!("block {loc}: {n} references, counted {counted}"));
        }
        if !st.alloc.is_used(loc) || pending.contains(&key) {
            problems.push(format!("block {loc}: referenced but free or being freed"));
        }
    }
    for (loc, extra) in st.shares.iter() {
        if !refs.contains_key(&loc.pack(0)) {
            problems.push(format!(
                "block {loc}: counted {extra} extra references, has none"
            ));
        }
    }
    for (&key, &users) in &pair_users {
        let counted = 1 + st.page_shares.get(&key).copied().unwrap_or(0);
        if counted != users {
            problems.push(format!(
                "index page pair {}: {users} components list it, counted {counted}",
                BlockLoc::unpack(key).0
            ));
        }
    }
    for &key in st.page_shares.keys() {
        if !pair_users.contains_key(&key) {
            problems.push(format!(
                "index page pair {}: shared but unlisted",
                BlockLoc::unpack(key).0
            ));
        }
    }
    match problems.len() {
        0 => Ok(()),
        n => Err(format!("{n} problems: {}", problems[..n.min(8)].join("; "))),
    }
}

/// What a snapshot or clone holds: blocks no other component references,
/// and blocks it shares with others (its source, other snapshots, clones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldSpace {
    /// Bytes of blocks only this component references: what deleting it
    /// gives back (with its own index pages).
    pub alone_bytes: u64,
    /// Bytes of blocks it references together with other components.
    pub shared_bytes: u64,
}

impl DiskGroup {
    /// The bytes `id` holds alone and shares, counted from its index pages
    /// (which are read: a few milliseconds per GiB of the component's
    /// address space that holds data).
    pub async fn held_space(&self, id: ComponentId) -> Result<HeldSpace, StoreError> {
        let shared = self.shared().clone();
        tokio::task::spawn_blocking(move || held_space(&shared, id))
            .await
            .map_err(|e| StoreError::DiskGroupFailed {
                reason: format!("space task failed: {e}"),
            })?
    }
}

fn held_space(shared: &Shared, id: ComponentId) -> Result<HeldSpace, StoreError> {
    let (mut roots, family, snapshot) = {
        let st = shared.state.lock();
        let comp = st.component(id)?;
        (
            comp.roots.iter().map(|(p, r)| (*p, *r)).collect::<Vec<_>>(),
            comp.family,
            comp.snapshot.is_some(),
        )
    };
    if snapshot {
        roots = shared
            .snapshot_roots(id.0)?
            .into_iter()
            .map(|r| (r.page_no, RootEntry::listed(&r)))
            .collect();
    }
    let mut held = HeldSpace::default();
    for (page_no, root) in roots {
        // A page the component changed in memory is read from the cache;
        // a committed one from its slot pair (outside the lock).
        let cached = {
            let st = shared.state.lock();
            st.cache.peek(&(id.0, page_no)).map(|p| p.page.clone())
        };
        let page = match (cached, root.current()) {
            (Some(p), _) => p,
            (None, Some(at)) => shared.read_page((id.0, page_no), at, family).map_err(|_| {
                StoreError::ComponentFailed {
                    component: id,
                    reason: format!("index page {page_no} unreadable"),
                }
            })?,
            (None, None) => continue,
        };
        let st = shared.state.lock();
        let pair_shared = root
            .loc
            .is_some_and(|l| st.page_shares.contains_key(&l.pack(0)));
        for e in &page.entries {
            if let Some(b) = e.block() {
                if pair_shared || st.shares.is_shared(b) {
                    held.shared_bytes += BLOCK_BYTES;
                } else {
                    held.alone_bytes += BLOCK_BYTES;
                }
            }
        }
    }
    Ok(held)
}
