//! The store's worker threads: the log writer and the log syncers (group
//! commit) and the destager (capacity tier, index updates, checkpoints).
//!
//! Owns: all writes to devices while the disk group runs. Must not touch:
//! admission rules (in `state`). The log writer takes every request queued
//! since its last write, writes them as consecutive records with one
//! positional write and hands the batch to the syncers without waiting for
//! its sync: the next batch is written while the previous one's `fdatasync`
//! runs. A syncer's `fdatasync` covers every batch written before it began;
//! batches are acknowledged strictly in log order, so the number of syncs per
//! write falls as the queue grows and no write waits for a sync that began
//! before it was written. A lone request (nothing else queued, written or
//! syncing) is committed on its caller's thread instead, its records
//! written durable on their own (`O_DSYNC`) with no `fdatasync`.
//!
//! The destager copies logged blocks to newly allocated capacity blocks
//! (never over a block the committed index points to; several writes in
//! flight), updates the index pages in the cache, and checkpoints: dirty
//! pages to their alternate slots, capacity devices synced, then the
//! checkpoint record, then the log tail moves and replaced blocks become
//! free.
//!
//! A placed write's data is written without a flush: the commit that holds
//! its record syncs the capacity devices it went to (one sync per device
//! shared by the commits waiting on it) beside the record's own write or
//! sync, so the two flushes overlap where they used to follow each other.
//! A power cut can then leave the record durable without its data; no later
//! record vouches for it (a batch counts as durable, for the "first
//! sequence not yet durable" later records carry, only once both are), and
//! recovery ends the log there (`recovery::placed_data_sound`).
//!
//! Invariants: a request is acknowledged only after an `fdatasync` that began
//! after its record was written returned, or after the durable write of its
//! record returned, and, for placed data, after a sync of its devices that
//! began after the data was written returned (unless the test-only
//! `ack_before_durable` switch is on, which exists to prove the crash tests
//! can fail); a checkpoint's log tail never passes the durable head.

use crate::index::{CachedRoots, RootEntry, LBAS_PER_PAGE};
use crate::state::{Fetch, LoggedRecord, Request, State, WrittenBatch};
use crate::StoreError;
use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_env::{AlignedBuf, Disk, DiskError, WriteDone};
use tessera_format::{
    BlockLoc, Checkpoint, ComponentRecord, EntryKind, IndexEntry, IndexPage, LogEntry, LogOp,
    LogRecordHeader, PageRoot, BLOCK, LOG_ENTRIES_MAX,
};

/// Most blocks (headers and data) one group commit writes: bounds the
/// latency a write waits behind others and the buffer the log writer builds.
pub(crate) const COMMIT_BLOCKS_MAX: u64 = 1024;

/// Most data held in memory for blocks that are logged but not yet on the
/// capacity tier, in bytes: past it the log writer waits for the destager,
/// so memory stays bounded whatever the size of the cache device (blocks
/// still waiting for the log are bounded by the clients' queue depth).
pub(crate) const OVERLAY_BYTES_MAX: u64 = 128 << 20;

/// Threads writing index pages during a checkpoint (the device queue depth
/// the checkpoint uses). Kept low: every page write in flight delays the
/// write log's next sync, which waits for the device to drain.
const CHECKPOINT_WRITERS: usize = 2;

/// Threads writing one destage pass's runs (the device queue depth the
/// destager uses): capacity blocks come from a free map with holes, so a pass
/// is many short writes, and one at a time they would bound write IOPS at the
/// device's queue-depth-1 rate.
const DESTAGE_WRITERS: usize = 8;

/// Blocks the destager moves per pass (one allocation, one set of writes).
pub(crate) const DESTAGE_BATCH_BLOCKS: usize = 512;

/// Longest logged blocks wait for the destager to gather a full pass.
pub(crate) const DESTAGE_GATHER: Duration = Duration::from_millis(20);

/// Longest a change waits in the index cache before a checkpoint, in time.
/// A checkpoint writes every dirty index page, and random writes dirty
/// nearly all of them within a second (2 GiB of data is ~2,000 pages), so
/// the page writes of one-second checkpoints came to a quarter of the client
/// writes at queue depth 1. Other triggers bound what waiting costs: a
/// checkpoint also runs when the log is half full, when half the index cache
/// is dirty, when freed blocks reach 1/16 of the group, and whenever a copy
/// by reference or `settle` asks for one. Measured (3 alternated pairs, 6 s
/// each): queue depth 8 writes 27.0k -> 29.9k IOPS, queue depth 1 7.5k ->
/// 7.9k.
pub(crate) const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);

/// Threads syncing the write log: up to this many `fdatasync` calls run at
/// once, each covering the batches written before it began. Measured at
/// queue depth 8 on the test machine: one syncer 14-15k IOPS, two 21-22k,
/// four 23-25k (a write then rarely waits for a free syncer).
pub(crate) const LOG_SYNCERS: usize = 4;

/// Most log blocks written and not yet synced: the writer lays out the next
/// group commits while a sync runs, up to this much. Recovery looks this far
/// (plus one commit) past the durable head for records of commits that were
/// in flight (see `recovery::clear_unsynced_records`).
pub(crate) const UNSYNCED_BLOCKS_MAX: u64 = 2 * COMMIT_BLOCKS_MAX;

/// How long a worker sleeps waiting for work before looking at the stop flag.
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// Where the areas of the devices lie.
#[derive(Debug, Clone)]
pub(crate) struct Geometry {
    pub(crate) meta_start: u64,
    pub(crate) meta_slot_blocks: u64,
    pub(crate) log_start: u64,
    pub(crate) log_blocks: u64,
    /// (device, first data block, data blocks) of each capacity device.
    pub(crate) areas: Vec<(u8, u64, u64)>,
}

/// Scrub progress, readable while a scrub runs.
#[derive(Default)]
pub(crate) struct ScrubCounters {
    pub(crate) running: AtomicBool,
    pub(crate) done: AtomicU64,
    pub(crate) total: AtomicU64,
    pub(crate) errors: AtomicU64,
    /// The next block the running (or last) pass checks.
    pub(crate) cursor: Mutex<crate::scrub::ScrubCursor>,
}

/// Capacity device `device` of a group's devices (device 0 is the cache
/// device, never a capacity device).
fn capacity_disk(devices: &[Arc<dyn Disk>], device: u8) -> Option<&Arc<dyn Disk>> {
    match device {
        0 => None,
        d => devices.get(d as usize),
    }
}

/// What the API and the workers share.
pub(crate) struct Shared {
    pub(crate) devices: Vec<Arc<dyn Disk>>,
    pub(crate) geo: Geometry,
    pub(crate) state: Mutex<State>,
    pub(crate) log_work: Condvar,
    /// Signalled when the log writer hands a written batch to the syncer.
    pub(crate) sync_work: Condvar,
    pub(crate) destage_work: Condvar,
    pub(crate) log_space: Condvar,
    pub(crate) stop: AtomicBool,
    pub(crate) ack_before_durable: AtomicBool,
    /// Reads of the capacity devices in flight, inline or on reader threads
    /// (see `DiskGroup::fetch`).
    pub(crate) reads_in_flight: std::sync::atomic::AtomicUsize,
    /// Whether guests' one-block reads ask the page cache first.
    pub(crate) page_probe: crate::page_probe::PageProbe,
    /// Whether a guest's read that goes to a device reads the blocks
    /// around it into the page cache too.
    pub(crate) read_around: crate::read_around::ReadAround,
    /// Placed writes between their block allocation and their
    /// acknowledgement (see `DiskGroup::write_placed`): while any is, no
    /// commit is made on a caller's thread ([`can_commit_inline`]).
    pub(crate) placed_in_flight: std::sync::atomic::AtomicUsize,
    /// Threads that read the capacity devices for clients (and write the
    /// blocks of placed writes).
    pub(crate) readers: crate::device_threads::DeviceThreads,
    /// Threads that write capacity blocks with the destager and the
    /// checkpoint.
    pub(crate) writers: crate::device_threads::DeviceThreads,
    /// The syncs of placed data the commits share, one per device (by
    /// device index).
    pub(crate) placed_syncs: Vec<crate::shared_sync::SharedSync>,
    pub(crate) scrub: ScrubCounters,
    /// Verified capacity blocks kept in memory (see `crate::content`).
    pub(crate) content: Arc<crate::content::ContentCache>,
    /// Where a lone commit's durable write is submitted without blocking
    /// its caller's thread; `None` where the cache device cannot take
    /// writes that way (one in memory), the kernel has no io_uring
    /// or the group was opened outside a runtime: the caller writes it
    /// itself.
    pub(crate) ring: Option<tessera_env::IoRing>,
}

impl Shared {
    pub(crate) fn cache_disk(&self) -> &Arc<dyn Disk> {
        &self.devices[0]
    }

    pub(crate) fn disk(&self, device: u8) -> Option<&Arc<dyn Disk>> {
        capacity_disk(&self.devices, device)
    }

    /// Reads one index page's committed copy; the page must be stamped with
    /// `family` (the component's own id, or its source's for a snapshot or
    /// clone, whose pages it may share).
    pub(crate) fn read_page(
        &self,
        key: (u64, u64),
        loc: BlockLoc,
        family: u64,
    ) -> Result<IndexPage, PageReadError> {
        let disk = self.disk(loc.device).ok_or_else(|| {
            PageReadError::Damaged(format!(
                "index page refers to unknown device {}",
                loc.device
            ))
        })?;
        let mut buf = AlignedBuf::zeroed(BLOCK);
        disk.read_at(buf.as_mut_slice(), loc.block * BLOCK as u64)
            .map_err(PageReadError::Io)?;
        let page = IndexPage::decode(buf.as_slice())
            .map_err(|e| PageReadError::Damaged(format!("index page {} at {loc}: {e}", key.1)))?;
        if page.component != family || page.page_no != key.1 {
            return Err(PageReadError::Damaged(format!(
                "index page {} at {loc} holds component {} page {} (misdirected write)",
                key.1, page.component, page.page_no
            )));
        }
        Ok(page)
    }

    /// Loads pages and root table blocks into the cache; a page is inserted
    /// only if its root still points where it was read from (a checkpoint
    /// may have moved it), a root table block only if its snapshot still
    /// has it there. Failures fail the component (damaged page or table)
    /// or the device (I/O error). `ahead`: the pages are read ahead of need
    /// (counted as such).
    pub(crate) fn load_pages_blocking(
        &self,
        need: &[Fetch],
        ahead: bool,
    ) -> Result<(), StoreError> {
        for fetch in need {
            let (c, loc, result) = match *fetch {
                Fetch::Page(key, loc) => {
                    let family = self
                        .state
                        .lock()
                        .components
                        .get(&key.0)
                        .map_or(key.0, |c| c.family);
                    let result = self.read_page(key, loc, family);
                    let mut st = self.state.lock();
                    let result = result.map(|page| {
                        if st.cached_root(key.0, key.1).and_then(|r| r.current()) == Some(loc)
                            && !st.cache.contains(&key)
                        {
                            st.cache.insert(key, page, false);
                        }
                        st.cache.read.fetch_add(1, Ordering::Relaxed);
                        if ahead {
                            st.cache.prefetched.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                    (key.0, loc, result)
                }
                Fetch::Roots(key, loc) => {
                    let result = crate::snapshot::read_root_block(self, key, loc);
                    let mut st = self.state.lock();
                    let result = result.map(|roots| {
                        let current = st
                            .components
                            .get(&key.0)
                            .and_then(|c| c.snapshot.as_ref())
                            .and_then(|t| t.blocks.get(key.1 as usize));
                        if current == Some(&loc) {
                            st.cache.insert_roots(key, CachedRoots::new(&roots));
                        }
                    });
                    (key.0, loc, result)
                }
            };
            let mut st = self.state.lock();
            match result {
                Ok(()) => {}
                Err(PageReadError::Io(e)) => {
                    st.fail_capacity_device(loc.device, &e.to_string());
                    return Err(StoreError::ComponentFailed {
                        component: tessera_types::ComponentId(c),
                        reason: e.to_string(),
                    });
                }
                Err(PageReadError::Damaged(reason)) => {
                    if let Some(comp) = st.components.get_mut(&c) {
                        comp.failed.get_or_insert(reason.clone());
                    }
                    return Err(StoreError::ComponentFailed {
                        component: tessera_types::ComponentId(c),
                        reason,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Why an index page could not be read.
pub(crate) enum PageReadError {
    Io(DiskError),
    Damaged(String),
}

/// Blocks a batch of requests takes in the log.
fn request_blocks(r: &Request) -> u64 {
    r.data.len() as u64 + r.entries.len().div_ceil(LOG_ENTRIES_MAX).max(1) as u64
}

struct PlannedRecord {
    header: LogRecordHeader,
    vstart: u64,
    data: Vec<bytes::Bytes>,
    writes: Vec<(u64, u64, u64)>,
    tokens: Vec<u64>,
}

/// The log writer thread: lays out and writes group commits; the log syncer
/// makes them durable and acknowledges them.
///
/// The writer does not wait for the previous commit's sync: while the syncer
/// runs `fdatasync` for batch N, the writer already writes batch N+1 (and
/// more, up to [`UNSYNCED_BLOCKS_MAX`] blocks), and the syncer's next sync
/// covers every batch written meanwhile. Each record header carries the first
/// sequence that was not yet durable when it was written, so recovery can
/// tell a record that was synced and damaged later (a record written after
/// it names a later sequence) from the torn tail of commits in flight.
pub(crate) fn run_log_writer(shared: Arc<Shared>) {
    loop {
        let mut st = shared.state.lock();
        loop {
            if shared.stop.load(Ordering::Acquire) {
                st.fail_group_quietly("disk group closed");
                shared.sync_work.notify_all();
                return;
            }
            if let Some(reason) = st.failed.clone() {
                // Requests that raced with the failure get the error too.
                st.fail_group(reason);
                shared.log_work.wait_for(&mut st, IDLE_WAIT);
                continue;
            }
            if st.queue.is_empty() || st.log_writing {
                shared.log_work.wait_for(&mut st, IDLE_WAIT);
            } else if st.destage_blocks > st.overlay_cap_blocks {
                shared.destage_work.notify_all();
                shared.log_space.wait_for(&mut st, IDLE_WAIT);
            } else if st.unsynced_blocks >= UNSYNCED_BLOCKS_MAX {
                shared.log_space.wait_for(&mut st, IDLE_WAIT);
            } else {
                break;
            }
        }
        let mut reqs: Vec<Request> = Vec::new();
        take_queued(&mut st, &mut reqs, COMMIT_BLOCKS_MAX);
        st.log_writing = true;
        let (_st, written) = write_batch(&shared, st, reqs, LogWrite::Plain);
        if written.is_some() {
            shared.sync_work.notify_one();
        }
    }
}

/// True when a request can be committed on the caller's own thread
/// ([`commit_inline`]): nothing else is being written, waiting to be
/// written or being synced, so the caller would otherwise only wake the log
/// writer and a syncer and wait for both. The caller then sets
/// `log_writing` under the same lock.
///
/// Without a ring, never while a placed write is in flight: the commit's
/// blocking durable write then waits behind large data writes in the
/// device's queue (1.5 ms for a 4 KiB commit behind six 256 KiB writes,
/// measured on a virtio disk), and a caller's thread is a runtime thread
/// serving a whole connection, whose next requests (the next large writes
/// among them) would not even be read meanwhile: a stream of large writes
/// then reaches the devices about one at a time. The log writer and a
/// syncer commit it instead, off the runtime. With the group's ring the
/// caller never waits for the device, so a placed write's own record (its
/// data already durable) commits inline too, without the two thread
/// hand-offs.
pub(crate) fn can_commit_inline(shared: &Shared, st: &State) -> bool {
    !st.log_writing && st.queue.is_empty() && inline_allowed(shared, st)
}

/// What a commit on a runtime thread needs besides a log nobody else is
/// writing: no placed write ahead of it in the device's queue unless the
/// ring submits it, nothing written and waiting for a sync, room in the
/// log, and the group open and healthy.
fn inline_allowed(shared: &Shared, st: &State) -> bool {
    (shared.ring.is_some() || shared.placed_in_flight.load(Ordering::Acquire) == 0)
        && st.unsynced.is_empty()
        && st.syncs_running == 0
        && st.failed.is_none()
        && st.destage_blocks <= st.overlay_cap_blocks
        // Never wait for log space on a caller's thread.
        && (st.written_vhead - st.vtail) * 2 < shared.geo.log_blocks
        && !shared.ack_before_durable.load(Ordering::Relaxed)
        && !shared.stop.load(Ordering::Acquire)
}

/// Moves requests from the head of the queue into `reqs` while the batch
/// stays within `max_blocks` (a batch always takes at least one).
fn take_queued(st: &mut State, reqs: &mut Vec<Request>, max_blocks: u64) {
    let mut blocks: u64 = reqs.iter().map(request_blocks).sum();
    while let Some(r) = st.queue.front() {
        let rb = request_blocks(r);
        if !reqs.is_empty() && blocks + rb > max_blocks {
            break;
        }
        blocks += rb;
        if let Some(r) = st.queue.pop_front() {
            reqs.push(r);
        }
    }
}

/// Writes one request, with the requests that queued behind it since it
/// was staged, as one group commit on the calling thread, with the layout
/// and records the log writer would give it: this saves the two thread
/// hand-offs to the log writer and a syncer, each of which costs about as
/// much as the write itself on a fast device. Nothing else is unsynced (see
/// [`can_commit_inline`]), so the batch is written durable on its own
/// ([`Disk::write_durable_at`]) and acknowledged without an `fdatasync`:
/// one system call where the write and the sync took two, and the device's
/// cache flush issued from the write's completion. With the group's ring
/// the write is submitted and this returns at once: the ring's reaper
/// finishes and acknowledges the batch when the device answers, so the
/// caller's runtime thread never waits for the device. Requests that arrive
/// meanwhile queue behind it, and the completion commits them the same way
/// as the next batch ([`commit_queued_inline`]), so under load one durable
/// write follows another from the runtime, with no thread woken for them;
/// they go to the log writer and a syncer only where an inline commit
/// cannot take them. The caller set `log_writing`.
pub(crate) fn commit_inline(shared: &Arc<Shared>, req: Request) {
    let mut st = shared.state.lock();
    let mut reqs = vec![req];
    // Followers only while the whole batch surely fits in the log's free
    // half (room for a record that starts over at the log's beginning
    // included), so the caller never waits for log space.
    let used = st.written_vhead - st.vtail;
    let room = (shared.geo.log_blocks / 2).saturating_sub(used);
    take_queued(&mut st, &mut reqs, room.min(COMMIT_BLOCKS_MAX));
    let Some(ring) = &shared.ring else {
        let (st, written) = write_batch(shared, st, reqs, LogWrite::Durable);
        acknowledge_inline(shared, st, written);
        return;
    };
    let Some(mut batch) = lay_out_batch(shared, st, reqs) else {
        return;
    };
    let [(offset, buf)]: [(u64, AlignedBuf); 1] =
        match record_writes(shared, &batch.records).try_into() {
            Ok(one) => one,
            Err(writes) => {
                // A batch that wraps around the log's end: two writes, which
                // must both be durable before it is; written here, as
                // without a ring.
                let result = write_records(shared, &writes, LogWrite::Durable)
                    .map_err(|e| format!("cache device: {e}"))
                    .and_then(|()| sync_placed(shared, &batch.flush));
                let (st, written) = finish_batch(
                    shared,
                    shared.state.lock(),
                    batch,
                    result,
                    AfterBatch::WakeWriter,
                );
                acknowledge_inline(shared, st, written);
                return;
            }
        };
    let len = buf.len() as u64;
    let flush = std::mem::take(&mut batch.flush);
    let commit = Arc::new(RingCommit {
        shared: Arc::clone(shared),
        left: Mutex::new(RingCommitLeft {
            parts: if flush.is_empty() { 1 } else { 2 },
            result: Ok(()),
            batch: Some(batch),
        }),
    });
    if !flush.is_empty() {
        // The placed data's syncs run beside the record's durable write: a
        // record found durable without its data is cut off by recovery
        // (see `recovery::placed_data_sound`), and neither is acknowledged
        // before both end.
        let (for_sync, synced) = (Arc::clone(shared), Arc::clone(&commit));
        shared.readers.submit(Box::new(move || {
            synced.ended(sync_placed(&for_sync, &flush));
        }));
    }
    let on_done: WriteDone = Box::new(move |result| {
        let name = commit.shared.cache_disk().name();
        commit.ended(result.map_err(|e| {
            format!(
                "cache device: {}",
                DiskError::from_io(&name, "write", offset, len, &e)
            )
        }));
    });
    // The thread goes back to serving at once; the write's completion
    // acknowledges the batch from the ring's reaper, on the runtime.
    if let Err((buf, on_done)) = ring.write_durable(shared.cache_disk(), buf, offset, on_done) {
        let result = shared.cache_disk().write_durable_at(buf.as_slice(), offset);
        on_done(result.map_err(|e| std::io::Error::new(e.kind, e.message)));
    }
}

/// A lone batch committed through the ring: its record's durable write and
/// the syncs of the devices holding its placed data run at once, and the
/// last of them to end finishes the batch.
struct RingCommit {
    shared: Arc<Shared>,
    left: Mutex<RingCommitLeft>,
}

struct RingCommitLeft {
    /// Parts still running: the record's write, and the placed data's syncs.
    parts: usize,
    /// The first failure among the parts that ended.
    result: Result<(), String>,
    batch: Option<LaidOutBatch>,
}

impl RingCommit {
    /// One part ended; the last one finishes and acknowledges the batch,
    /// then commits what queued behind it.
    fn ended(&self, result: Result<(), String>) {
        let (batch, result) = {
            let mut left = self.left.lock();
            if let (Ok(()), Err(e)) = (&left.result, result) {
                left.result = Err(e);
            }
            left.parts = left.parts.saturating_sub(1);
            if left.parts > 0 {
                return;
            }
            (
                left.batch.take(),
                std::mem::replace(&mut left.result, Ok(())),
            )
        };
        let Some(batch) = batch else {
            return;
        };
        let shared = &self.shared;
        let (st, written) = finish_batch(
            shared,
            shared.state.lock(),
            batch,
            result,
            AfterBatch::KeepLog,
        );
        let kept = written.is_some();
        acknowledge_inline(shared, st, written);
        if kept {
            commit_queued_inline(shared);
        }
    }
}

/// After an inline batch written through the ring was acknowledged, with
/// `log_writing` still held: commits the requests that queued behind it as
/// the next inline batch, on this thread, when an inline commit may take
/// them; otherwise lets go of the log, and the log writer takes them.
fn commit_queued_inline(shared: &Arc<Shared>) {
    let mut st = shared.state.lock();
    if inline_allowed(shared, &st) {
        if let Some(req) = st.queue.pop_front() {
            drop(st);
            commit_inline(shared, req);
            return;
        }
    }
    st.log_writing = false;
    if !st.queue.is_empty() {
        shared.log_work.notify_one();
    }
}

/// Acknowledges a batch committed durable by [`commit_inline`].
fn acknowledge_inline(
    shared: &Shared,
    mut st: parking_lot::MutexGuard<'_, State>,
    written: Option<u64>,
) {
    let Some(first_seq) = written else {
        return;
    };
    // The log writer waited for `log_writing`: this batch is the only one
    // written and not yet acknowledged, and it leaves `unsynced` here, so no
    // syncer ever sees it.
    debug_assert_eq!(st.unsynced.len(), 1);
    st.log_stats.durable_commits += 1;
    drop(acknowledge_durable(shared, st, first_seq));
}

/// Who writes the log after a batch: whoever the queue wakes (the log
/// writer), or the batch's own writer, which keeps `log_writing` to commit
/// what queued behind it ([`commit_queued_inline`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum AfterBatch {
    WakeWriter,
    KeepLog,
}

/// How a group commit's records are written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LogWrite {
    /// Plain writes; a syncer makes them durable.
    Plain,
    /// Each write durable on its own when it returns.
    Durable,
}

/// A group commit laid out in the log (its place and sequences taken) and
/// not yet written.
struct LaidOutBatch {
    records: Vec<PlannedRecord>,
    reqs: Vec<Request>,
    first_seq: u64,
    vend: u64,
    end_seq: u64,
    blocks: u64,
    /// Another batch was being synced when this one was laid out.
    overlapped: bool,
    /// Capacity devices holding the batch's placed data, which must be
    /// synced before the batch is durable ([`placed_devices`]).
    flush: Vec<u8>,
}

/// Lays out `reqs` as the next group commit and writes it; the batch then
/// waits for a sync ([`sync_and_acknowledge`]). The caller set
/// `log_writing`; this clears it once the batch is written (or failed).
/// Returns the lock and the batch's first sequence if it was written.
fn write_batch<'a>(
    shared: &'a Shared,
    st: parking_lot::MutexGuard<'a, State>,
    reqs: Vec<Request>,
    how: LogWrite,
) -> (parking_lot::MutexGuard<'a, State>, Option<u64>) {
    let Some(mut batch) = lay_out_batch(shared, st, reqs) else {
        return (shared.state.lock(), None);
    };
    if shared.ack_before_durable.load(Ordering::Relaxed) {
        for r in batch.reqs.iter_mut() {
            if let Some(done) = r.done.take() {
                let _ = done.send(Ok(()));
            }
        }
    }
    let result = write_records(shared, &record_writes(shared, &batch.records), how)
        .map_err(|e| format!("cache device: {e}"));
    // A batch written durable on its own is acknowledged without a syncer:
    // its placed data is synced here (a syncer syncs the others').
    let result = match how {
        LogWrite::Durable => result.and_then(|()| sync_placed(shared, &batch.flush)),
        LogWrite::Plain => result,
    };
    finish_batch(
        shared,
        shared.state.lock(),
        batch,
        result,
        AfterBatch::WakeWriter,
    )
}

/// Takes the next place and sequences in the log for `reqs` (waiting for
/// log space if the tail is too close) and releases the lock. `None` when
/// the group failed or closed meanwhile: the requests got the error and
/// `log_writing` is cleared.
fn lay_out_batch(
    shared: &Shared,
    mut st: parking_lot::MutexGuard<'_, State>,
    mut reqs: Vec<Request>,
) -> Option<LaidOutBatch> {
    let log_blocks = shared.geo.log_blocks;
    // Lay the records out; wait for log space if the tail is too close.
    let records = loop {
        // Every sequence from the durable head on may still be lost.
        let not_durable = st.head_seq;
        let records = plan_records(
            &mut reqs,
            st.written_vhead,
            st.written_seq,
            not_durable,
            log_blocks,
        );
        let vend = records
            .last()
            .map(|r| r.vstart + r.header.record_blocks() as u64)
            .unwrap_or(st.written_vhead);
        if vend - st.vtail <= log_blocks {
            break Some((records, vend));
        }
        if st.failed.is_some() || shared.stop.load(Ordering::Acquire) {
            break None;
        }
        st.checkpoint_wanted = true;
        shared.destage_work.notify_all();
        shared.log_space.wait_for(&mut st, IDLE_WAIT);
    };
    let Some((records, vend)) = records else {
        let reason = st
            .failed
            .clone()
            .unwrap_or_else(|| "disk group closed".into());
        st.log_writing = false;
        drop(st);
        fail_requests(reqs, &reason);
        return None;
    };
    let first_seq = st.written_seq;
    let end_seq = records
        .last()
        .map(|r| r.header.seq + 1)
        .unwrap_or(first_seq);
    let blocks = vend - st.written_vhead;
    st.written_vhead = vend;
    st.written_seq = end_seq;
    let overlapped = !st.unsynced.is_empty() || st.syncs_running > 0;
    drop(st);
    let flush = placed_devices(&reqs);
    Some(LaidOutBatch {
        records,
        reqs,
        first_seq,
        vend,
        end_seq,
        blocks,
        overlapped,
        flush,
    })
}

/// Records the end of a laid-out batch's write, under the lock: written,
/// it waits for a sync among the unsynced batches; failed, it fails the
/// group and its requests. Clears `log_writing`, except for a batch written
/// with [`AfterBatch::KeepLog`] that was written. Returns the lock and the
/// batch's first sequence if it was written.
fn finish_batch<'a>(
    shared: &'a Shared,
    mut st: parking_lot::MutexGuard<'a, State>,
    batch: LaidOutBatch,
    result: Result<(), String>,
    after: AfterBatch,
) -> (parking_lot::MutexGuard<'a, State>, Option<u64>) {
    let LaidOutBatch {
        records,
        reqs,
        first_seq,
        vend,
        end_seq,
        blocks: batch_blocks,
        overlapped,
        flush,
    } = batch;
    // Read once: the log is kept exactly when the batch is taken as
    // written below (a `stop` seen set by one read and not by another would
    // leave `log_writing` held with nobody to commit or clear it).
    let stands = result.is_ok() && st.failed.is_none() && !shared.stop.load(Ordering::Acquire);
    if !(after == AfterBatch::KeepLog && stands) {
        st.log_writing = false;
        // Requests that queued while this batch was written are the
        // writer's (a wake-up with nothing queued would only cost two
        // context switches).
        if !st.queue.is_empty() {
            shared.log_work.notify_one();
        }
    }
    match result {
        Ok(()) if stands => {
            let mut tokens = Vec::new();
            let mut logged = Vec::with_capacity(records.len());
            for r in records {
                for t in &r.tokens {
                    tokens.push((*t, r.header.seq, r.vstart));
                }
                logged.push(LoggedRecord {
                    seq: r.header.seq,
                    vstart: r.vstart,
                    writes: r.writes,
                });
            }
            st.unsynced_blocks += batch_blocks;
            st.unsynced.push_back(WrittenBatch {
                first_seq,
                records: logged,
                tokens,
                blocks: batch_blocks,
                end: (vend, end_seq),
                reqs,
                flush,
            });
            st.log_stats.group_commits += 1;
            if overlapped {
                st.log_stats.overlapped_commits += 1;
            }
            (st, Some(first_seq))
        }
        Ok(()) => {
            // The syncer may have stopped: nothing will acknowledge it.
            let reason = st
                .failed
                .clone()
                .unwrap_or_else(|| "disk group closed".into());
            drop(st);
            fail_requests(reqs, &reason);
            (shared.state.lock(), None)
        }
        Err(reason) => {
            st.fail_group(reason.clone());
            drop(st);
            fail_requests(reqs, &reason);
            (shared.state.lock(), None)
        }
    }
}

/// A log syncer thread ([`LOG_SYNCERS`] of them): one `fdatasync` covers
/// every batch the writer finished before it began; then those batches'
/// records go to the destager and their requests are acknowledged, strictly
/// in log order. A syncer starts as soon as written batches are not covered
/// by a sync already running, so a write waits for one sync after its own
/// write, not for the end of a sync that began before it. A sync that
/// finishes before an earlier one also acknowledges the earlier one's
/// batches: it began after they were written, so it covers them.
pub(crate) fn run_log_syncer(shared: Arc<Shared>) {
    loop {
        let mut st = shared.state.lock();
        let target = loop {
            if let Some(b) = st.unsynced.back() {
                if b.first_seq >= st.sync_uncovered_seq {
                    break b.first_seq;
                }
            } else if shared.stop.load(Ordering::Acquire) {
                return;
            }
            if shared.stop.load(Ordering::Acquire) && st.syncs_running == 0 {
                // Batches already covered by a finished sync are gone; the
                // rest were failed when the disk group closed.
                return;
            }
            shared.sync_work.wait_for(&mut st, IDLE_WAIT);
        };
        drop(sync_and_acknowledge(&shared, st, target));
    }
}

/// Runs one `fdatasync` covering every batch up to the one that starts at
/// `target` (all written before it begins), with, beside it on a device
/// thread, the syncs of the capacity devices that hold those batches'
/// placed data; then hands their records to the destager and acknowledges
/// their requests in log order.
fn sync_and_acknowledge<'a>(
    shared: &'a Arc<Shared>,
    mut st: parking_lot::MutexGuard<'a, State>,
    target: u64,
) -> parking_lot::MutexGuard<'a, State> {
    st.sync_uncovered_seq = target + 1;
    st.syncs_running += 1;
    let flush = each_once(
        st.unsynced
            .iter()
            .take_while(|b| b.first_seq <= target)
            .flat_map(|b| b.flush.iter().copied()),
    );
    drop(st);
    let placed = (!flush.is_empty()).then(|| {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let for_sync = Arc::clone(shared);
        shared.readers.submit(Box::new(move || {
            let _ = tx.send(sync_placed(&for_sync, &flush));
        }));
        rx
    });
    let result = shared
        .cache_disk()
        .sync()
        .map_err(|e| format!("cache device: {e}"));
    let placed = placed.map_or(Ok(()), |rx| {
        rx.recv()
            .unwrap_or_else(|_| Err("a device thread stopped".into()))
    });
    let mut st = shared.state.lock();
    st.syncs_running -= 1;
    st.log_stats.syncs += 1;
    if let Err(reason) = result.and(placed) {
        st.fail_group(reason);
        shared.log_space.notify_all();
        return st;
    }
    acknowledge_durable(shared, st, target)
}

/// The capacity devices that hold placed data of `reqs`, each once. A
/// placed write's blocks are written without a flush of their device
/// (`DiskGroup::write_placed`): its record is durable only once these
/// devices are synced too, by a sync begun after the data was written,
/// which any sync begun once the record is laid out is.
fn placed_devices(reqs: &[Request]) -> Vec<u8> {
    each_once(
        reqs.iter()
            .flat_map(|r| r.entries.iter())
            .filter(|e| matches!(e.op, LogOp::Place { .. }))
            .map(|e| BlockLoc::unpack(e.arg).0.device),
    )
}

/// The devices of `devices`, each once, in the order first named (a
/// disk group has a handful, so a scan beats a set).
fn each_once(devices: impl Iterator<Item = u8>) -> Vec<u8> {
    let mut once: Vec<u8> = Vec::new();
    for d in devices {
        if !once.contains(&d) {
            once.push(d);
        }
    }
    once
}

/// Syncs capacity devices holding a batch's placed data, each with a sync
/// shared by every commit that waits on the same device meanwhile
/// (`shared_sync`). Returns the reason the disk group fails when one
/// cannot be synced: the kernel may have dropped what it could not write,
/// so the batch must not be acknowledged.
fn sync_placed(shared: &Shared, devices: &[u8]) -> Result<(), String> {
    for &d in devices {
        let Some(disk) = shared.disk(d) else {
            return Err(format!("no capacity device {d} for placed data"));
        };
        let synced = match shared.placed_syncs.get(d as usize) {
            Some(syncs) => syncs.sync(disk.as_ref()),
            None => disk.sync(),
        };
        synced.map_err(|e| format!("capacity device: {e}"))?;
    }
    Ok(())
}

/// Hands the records of every batch up to the one that starts at `target`,
/// all durable now, to the destager and acknowledges their requests in log
/// order.
fn acknowledge_durable<'a>(
    shared: &'a Shared,
    mut st: parking_lot::MutexGuard<'a, State>,
    target: u64,
) -> parking_lot::MutexGuard<'a, State> {
    let mut done: Vec<Request> = Vec::new();
    let destage_was_empty = st.destage.is_empty();
    while st.unsynced.front().is_some_and(|b| b.first_seq <= target) {
        let Some(batch) = st.unsynced.pop_front() else {
            break;
        };
        st.unsynced_blocks = st.unsynced_blocks.saturating_sub(batch.blocks);
        (st.vhead, st.head_seq) = batch.end;
        for (token, seq, vstart) in batch.tokens {
            st.unapplied.insert(token, (seq, vstart));
        }
        for r in batch.records {
            st.durable_op = r.writes.iter().map(|w| w.2).fold(st.durable_op, u64::max);
            st.destage_blocks += r.writes.len() as u64;
            st.destage.push_back(r);
        }
        done.extend(batch.reqs);
    }
    if !done.is_empty() {
        // The destager wakes once to start gathering, then when a pass is
        // due; not on every sync.
        let started = destage_was_empty && !st.destage.is_empty();
        if started {
            st.destage_since = Some(Instant::now());
        }
        if started || destage_due(shared, &st) {
            shared.destage_work.notify_all();
        }
        shared.log_space.notify_all();
    }
    // Batches written during this sync may wait for a free syncer.
    if st
        .unsynced
        .back()
        .is_some_and(|b| b.first_seq >= st.sync_uncovered_seq)
    {
        shared.sync_work.notify_one();
    }
    drop(st);
    for mut r in done {
        if let Some(done) = r.done.take() {
            let _ = done.send(Ok(()));
        }
    }
    shared.state.lock()
}

fn fail_requests(reqs: Vec<Request>, reason: &str) {
    for mut r in reqs {
        if let Some(done) = r.done.take() {
            let _ = done.send(Err(StoreError::DiskGroupFailed {
                reason: reason.to_string(),
            }));
        }
    }
}

/// Splits the requests' entries into records and places them in the log: a
/// record never wraps, it starts over at the log's beginning instead.
fn plan_records(
    reqs: &mut [Request],
    vhead: u64,
    first_seq: u64,
    not_durable: u64,
    log_blocks: u64,
) -> Vec<PlannedRecord> {
    let mut out: Vec<PlannedRecord> = Vec::new();
    let mut cur = PlannedRecord {
        header: LogRecordHeader {
            seq: first_seq,
            batch_first_seq: not_durable,
            entries: Vec::new(),
        },
        vstart: 0,
        data: Vec::new(),
        writes: Vec::new(),
        tokens: Vec::new(),
    };
    for r in reqs.iter() {
        let mut data = r.data.iter();
        let mut writes = r.writes.iter();
        for (i, e) in r.entries.iter().enumerate() {
            if cur.header.entries.len() == LOG_ENTRIES_MAX {
                let seq = cur.header.seq + 1;
                out.push(std::mem::replace(
                    &mut cur,
                    PlannedRecord {
                        header: LogRecordHeader {
                            seq,
                            batch_first_seq: not_durable,
                            entries: Vec::new(),
                        },
                        vstart: 0,
                        data: Vec::new(),
                        writes: Vec::new(),
                        tokens: Vec::new(),
                    },
                ));
            }
            cur.header.entries.push(*e);
            if matches!(e.op, LogOp::Write { .. }) {
                if let Some(d) = data.next() {
                    cur.data.push(d.clone());
                }
            }
            if matches!(e.op, LogOp::Write { .. } | LogOp::Place { .. }) {
                if let Some(w) = writes.next() {
                    cur.writes.push(*w);
                }
            }
            if i + 1 == r.entries.len() {
                if let Some(t) = r.token {
                    cur.tokens.push(t);
                }
            }
        }
    }
    if !cur.header.entries.is_empty() {
        out.push(cur);
    }
    let mut v = vhead;
    for r in out.iter_mut() {
        let b = r.header.record_blocks() as u64;
        if v % log_blocks + b > log_blocks {
            v += log_blocks - v % log_blocks;
        }
        r.vstart = v;
        v += b;
    }
    out
}

/// Writes the log writes of a batch ([`record_writes`]); the syncer makes
/// them durable, unless `how` says each write is.
fn write_records(
    shared: &Shared,
    writes: &[(u64, AlignedBuf)],
    how: LogWrite,
) -> Result<(), DiskError> {
    let disk = shared.cache_disk();
    for (offset, buf) in writes {
        let offset = *offset;
        match how {
            LogWrite::Plain => disk.write_at(buf.as_slice(), offset)?,
            LogWrite::Durable => disk.write_durable_at(buf.as_slice(), offset)?,
        }
    }
    Ok(())
}

/// The device writes that put `records` in the log: one per run of records
/// that are adjacent in it (a run ends where the log wraps), as (offset on
/// the cache device, bytes).
fn record_writes(shared: &Shared, records: &[PlannedRecord]) -> Vec<(u64, AlignedBuf)> {
    let log_blocks = shared.geo.log_blocks;
    let mut writes = Vec::with_capacity(1);
    let mut i = 0;
    while i < records.len() {
        let mut j = i + 1;
        while j < records.len()
            && records[j].vstart
                == records[j - 1].vstart + records[j - 1].header.record_blocks() as u64
            && !records[j].vstart.is_multiple_of(log_blocks)
        {
            j += 1;
        }
        let total: usize = records[i..j].iter().map(|r| r.header.record_blocks()).sum();
        // Built by appending: only header blocks are zeroed before use.
        let mut buf = AlignedBuf::with_capacity(total * BLOCK);
        for r in &records[i..j] {
            let at = buf.len();
            buf.extend_zeroed(BLOCK);
            r.header
                .encode_into(&mut buf.as_mut_slice()[at..at + BLOCK]);
            for d in &r.data {
                buf.extend_from_slice(&d[..BLOCK]);
            }
        }
        let offset = (shared.geo.log_start + records[i].vstart % log_blocks) * BLOCK as u64;
        writes.push((offset, buf));
        i = j;
    }
    writes
}

/// One block the destager moves.
struct DestageItem {
    c: u64,
    lba: u64,
    op: u64,
    /// (virtual block, sequence) of the log record that holds it.
    record: (u64, u64),
    /// Its data is read back from the log: see `destage_pass`.
    from_log: bool,
    data: Option<bytes::Bytes>,
    crc: u32,
    lost: bool,
    loc: Option<BlockLoc>,
    /// A placed block: `loc` is where it is already stored, and the item
    /// holds the reference `State::placed` registered for it.
    placed: bool,
}

/// The destager thread.
pub(crate) fn run_destager(shared: Arc<Shared>) {
    let mut last_checkpoint = Instant::now();
    loop {
        let mut st = shared.state.lock();
        loop {
            if shared.stop.load(Ordering::Acquire) || st.failed.is_some() {
                return;
            }
            if st.checkpoint_wanted || destage_due(&shared, &st) {
                break;
            }
            if last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL && checkpoint_useful(&st) {
                break;
            }
            let wait = match st.destage_since {
                Some(since) if !st.destage.is_empty() => DESTAGE_GATHER
                    .saturating_sub(since.elapsed())
                    .min(IDLE_WAIT),
                _ => IDLE_WAIT,
            };
            shared.destage_work.wait_for(&mut st, wait);
        }
        drop(st);
        if let Err(e) = destage_pass(&shared) {
            shared.state.lock().fail_group(e);
            return;
        }
        let st = shared.state.lock();
        let log_used = st.vhead - st.vtail;
        let due = st.checkpoint_wanted
            || log_used * 2 > shared.geo.log_blocks
            || st.cache.dirty_count() * 2 > st.cache.capacity()
            || st.pending_free.len() as u64 > st.usable_blocks / 16
            || (last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL && checkpoint_useful(&st));
        drop(st);
        if due {
            if let Err(e) = checkpoint(&shared) {
                shared.state.lock().fail_group(e);
                return;
            }
            last_checkpoint = Instant::now();
        }
    }
}

/// True when the logged blocks waiting for the destager should move now: a
/// full pass is waiting, they have waited [`DESTAGE_GATHER`], or something
/// waits for them (memory, log space). Gathering keeps a trickle of writes
/// from costing a destage pass (a capacity write, an index update, a wake-up)
/// each, and gives the allocator runs of adjacent blocks to fill.
fn destage_due(shared: &Shared, st: &State) -> bool {
    if st.destage.is_empty() {
        return false;
    }
    st.destage_blocks >= DESTAGE_BATCH_BLOCKS as u64
        || st
            .destage_since
            .is_none_or(|since| since.elapsed() >= DESTAGE_GATHER)
        || st.destage_blocks * 2 > st.overlay_cap_blocks
        || (st.written_vhead - st.vtail) * 4 > shared.geo.log_blocks
}

fn checkpoint_useful(st: &State) -> bool {
    st.cache.dirty_count() > 0 || st.applied_tail().1 != st.tail_seq || !st.pending_free.is_empty()
}

/// Moves up to [`DESTAGE_BATCH_BLOCKS`] logged blocks to the capacity tier.
pub(crate) fn destage_pass(shared: &Shared) -> Result<(), String> {
    let mut st = shared.state.lock();
    let mut taken = 0usize;
    let mut items: Vec<DestageItem> = Vec::new();
    for r in st.destage.iter() {
        if taken > 0 && items.len() + r.writes.len() > DESTAGE_BATCH_BLOCKS {
            break;
        }
        taken += 1;
        for &(c, lba, op) in &r.writes {
            items.push(DestageItem {
                c,
                lba,
                op,
                record: (r.vstart, r.seq),
                from_log: false,
                data: None,
                crc: 0,
                lost: false,
                loc: None,
                placed: false,
            });
        }
    }
    if taken == 0 {
        return Ok(());
    }
    // Keep the blocks the overlay still holds for this operation, and the
    // ones a later write replaced in memory before that write was durable:
    // if the later write is lost in a crash, this block is what the LBA
    // holds, so the index must get it before the log tail passes its
    // record. Skipping it (as a block replaced by a durable write is
    // skipped) lost acknowledged writes in the power-cut test. Its data now
    // lives only in the log.
    for it in items.iter_mut() {
        // A placed block needs no data: only its index entry moves.
        if let Some(&(loc, crc)) = st.placed.get(&it.op) {
            it.loc = Some(loc);
            it.crc = crc;
            it.placed = true;
            continue;
        }
        let ok = st
            .components
            .get(&it.c)
            .is_some_and(|comp| comp.failed.is_none());
        if let (true, Some(p)) = (ok, st.overlay.get(&(it.c, it.lba))) {
            if p.op == it.op {
                it.crc = p.crc;
                if p.lost {
                    it.lost = true;
                } else {
                    it.data = Some(p.data.clone());
                }
            } else if p.op > st.durable_op {
                it.from_log = true;
            }
        }
    }
    if items.iter().any(|it| it.from_log) {
        drop(st);
        read_back_from_log(shared, &mut items)?;
        st = shared.state.lock();
    }
    let live = items.iter().filter(|it| it.data.is_some()).count();
    let locs = if live > 0 {
        // Blocks freed not long ago first: their pages are likely still in
        // the page cache, which the destager writes through.
        match st.alloc.allocate_lowest(live) {
            Some(l) => l,
            None => {
                drop(st);
                // Replaced blocks come back only with a checkpoint.
                checkpoint(shared)?;
                st = shared.state.lock();
                match st.alloc.allocate_lowest(live) {
                    Some(l) => l,
                    None => return Err("capacity devices are full: cannot destage".into()),
                }
            }
        }
    } else {
        Vec::new()
    };
    st.destage_inflight += live as u64;
    let mut locs = locs.into_iter();
    for it in items.iter_mut() {
        if it.data.is_some() {
            it.loc = locs.next();
        }
    }
    drop(st);

    // Data to the capacity devices, runs of adjacent blocks as one write.
    let mut order: Vec<usize> = (0..items.len())
        .filter(|&i| items[i].loc.is_some() && items[i].data.is_some())
        .collect();
    order.sort_by_key(|&i| items[i].loc);
    let mut runs: Vec<(BlockLoc, Vec<Bytes>)> = Vec::new();
    let mut k = 0;
    while k < order.len() {
        let first = items[order[k]].loc.unwrap_or_default();
        let mut n = 1;
        while k + n < order.len() {
            let l = items[order[k + n]].loc.unwrap_or_default();
            if l.device == first.device && l.block == first.block + n as u64 {
                n += 1;
            } else {
                break;
            }
        }
        // Every block of the run has its data (`order` keeps only those),
        // each written from where it lies: no copy into one buffer.
        let pieces = order[k..k + n]
            .iter()
            .filter_map(|&idx| items[idx].data.as_ref().map(|d| d.slice(..BLOCK)))
            .collect();
        runs.push((first, pieces));
        k += n;
    }
    let failed_devices = write_parallel(shared, runs, DESTAGE_WRITERS);

    // Index pages, then the index update under the lock.
    let mut attempts = 0;
    loop {
        let need = {
            let mut st = shared.state.lock();
            for (d, reason) in &failed_devices {
                st.fail_capacity_device(*d, reason);
            }
            let mut need = Vec::new();
            // One look per run of adjacent LBAs (a placed write's blocks
            // come in order), not per block.
            for (c, start, end) in lba_runs(&items) {
                need.extend(st.missing_pages(c, start, end).0);
            }
            need.sort();
            need.dedup();
            if need.is_empty() || attempts > 3 {
                // Blocks whose page could not be brought in stay in the
                // overlay and their records stay queued: the next pass
                // retries them (blocks already applied are skipped then).
                st.destage_inflight = st.destage_inflight.saturating_sub(live as u64);
                if apply_destage(&mut st, &items) {
                    for _ in 0..taken {
                        if let Some(r) = st.destage.pop_front() {
                            st.destage_blocks =
                                st.destage_blocks.saturating_sub(r.writes.len() as u64);
                        }
                    }
                    if st.destage.is_empty() {
                        st.destage_since = None;
                    }
                }
                shared.log_space.notify_all();
                return Ok(());
            }
            need
        };
        attempts += 1;
        // A failed page load fails its component; the apply skips it.
        let _ = shared.load_pages_blocking(&need, false);
    }
}

/// The items' LBAs as runs `(component, first, end)` of adjacent LBAs of
/// one component, in the items' order.
fn lba_runs(items: &[DestageItem]) -> Vec<(u64, u64, u64)> {
    let mut runs: Vec<(u64, u64, u64)> = Vec::new();
    for it in items {
        match runs.last_mut() {
            Some((c, _, end)) if *c == it.c && *end == it.lba => *end += 1,
            _ => runs.push((it.c, it.lba, it.lba + 1)),
        }
    }
    runs
}

/// Fills the items marked `from_log` with their data as their log record
/// holds it (the record's last write to that LBA, which is what replaying
/// the record would leave). A block whose CRC fails is destaged as lost.
fn read_back_from_log(shared: &Shared, items: &mut [DestageItem]) -> Result<(), String> {
    let mut records: Vec<(u64, u64)> = items
        .iter()
        .filter(|it| it.from_log)
        .map(|it| it.record)
        .collect();
    records.dedup();
    for (vstart, seq) in records {
        let rec = crate::recovery::read_record(shared.cache_disk(), &shared.geo, vstart, seq)
            .ok_or_else(|| {
                format!(
                    "cache device: write log record {seq} at log block {} cannot be read back for destaging",
                    vstart % shared.geo.log_blocks
                )
            })?;
        for it in items
            .iter_mut()
            .filter(|it| it.from_log && it.record == (vstart, seq))
        {
            let writes = rec
                .header
                .entries
                .iter()
                .filter_map(|e| match e.op {
                    LogOp::Write { crc } => Some((e.component, e.lba, crc)),
                    _ => None,
                })
                .enumerate();
            let Some((k, (_, _, crc))) =
                writes.filter(|(_, w)| (w.0, w.1) == (it.c, it.lba)).last()
            else {
                // The record passed its CRC but lacks the write memory says
                // it holds: destaging on would drop an acknowledged block.
                return Err(format!(
                    "cache device: write log record {seq} does not hold the write of component {} LBA {} it was logged with",
                    it.c, it.lba
                ));
            };
            it.crc = crc;
            match (rec.data.get(k), rec.sound.get(k)) {
                (Some(block), Some(true)) => it.data = Some(block.clone()),
                _ => it.lost = true,
            }
        }
    }
    Ok(())
}

/// Applies destaged blocks to the index. Returns false if some block had to
/// stay in the log because its index page was not cached.
fn apply_destage(st: &mut State, items: &[DestageItem]) -> bool {
    let mut complete = true;
    for it in items {
        let pending = st.overlay.get(&(it.c, it.lba)).map(|p| p.op);
        let current = pending == Some(it.op);
        // Replaced in memory by a write that is not durable yet: the index
        // takes this block all the same (see `destage_pass`), and the
        // overlay keeps the newer one.
        let under_unsynced = pending.is_some_and(|op| op != it.op && op > st.durable_op);
        let keep = current || under_unsynced;
        let usable = st.components.get(&it.c).is_some_and(|c| c.failed.is_none());
        let lost = keep && it.lost;
        if !keep || !usable || (it.loc.is_none() && !lost) {
            // A placed block replaced or unmapped before it reached the
            // index: its record may still be replayed after a crash, so it
            // is let go like any index reference (free after the next
            // checkpoint), never handed out again at once.
            if let Some(loc) = it.loc {
                if !it.placed {
                    st.alloc.free(loc);
                } else if st.placed.remove(&it.op).is_some() {
                    st.drop_ref(loc);
                }
            }
            if current && !usable {
                st.overlay_remove(&(it.c, it.lba));
            }
            continue;
        }
        let page_no = it.lba / LBAS_PER_PAGE;
        let key = (it.c, page_no);
        let root = st
            .components
            .get(&it.c)
            .and_then(|c| c.roots.get(&page_no))
            .copied();
        if !st.cache.contains(&key) {
            if root.and_then(|r| r.loc).is_some() {
                // The page could not be loaded: leave the block in the log
                // (a placed block keeps its reference for the next pass).
                if let (Some(loc), false) = (it.loc, it.placed) {
                    st.alloc.free(loc);
                }
                complete = false;
                continue;
            }
            st.cache.insert(key, IndexPage::empty(it.c, page_no), true);
            st.add_new_root(it.c, page_no);
        }
        st.own_page(key);
        let slot = (it.lba % LBAS_PER_PAGE) as usize;
        let new_entry = match it.loc {
            Some(loc) => IndexEntry::plain(loc, it.crc),
            None => IndexEntry {
                kind: EntryKind::Lost,
                ..Default::default()
            },
        };
        let old = match st.cache.get_to_change(&key) {
            Some(p) => {
                let old = p.page.entries[slot];
                p.page.entries[slot] = new_entry;
                old
            }
            None => continue,
        };
        if let Some(c) = st.components.get_mut(&it.c) {
            if let Some(old_loc) = old.block() {
                c.release(old_loc, 1);
            }
            if let Some(loc) = it.loc {
                c.hold(loc, 1);
            }
        }
        if let Some(old_loc) = old.block() {
            st.drop_ref(old_loc);
        }
        if it.placed {
            // Its reference now belongs to the index entry.
            st.placed.remove(&it.op);
        }
        if current {
            st.overlay_remove(&(it.c, it.lba));
        }
    }
    complete
}

/// Writes runs of blocks to the capacity devices with up to `threads`
/// writes in flight (the calling thread and the capacity writer threads), so
/// scattered writes reach the device together instead of one round trip
/// each. Returns the devices that failed, with the error.
fn write_parallel(
    shared: &Shared,
    runs: Vec<(BlockLoc, Vec<Bytes>)>,
    threads: usize,
) -> Vec<(u8, String)> {
    let threads = threads.min(runs.len());
    let work = Arc::new(CapacityWrites {
        devices: shared.devices.clone(),
        runs,
        next: AtomicUsize::new(0),
    });
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 1..threads {
        let (work, tx) = (work.clone(), tx.clone());
        shared.writers.submit(Box::new(move || {
            let _ = tx.send(work.write_remaining());
        }));
    }
    // A job that dies without answering then ends `recv` instead of hanging.
    drop(tx);
    let mut failed = work.write_remaining();
    for _ in 1..threads {
        match rx.recv() {
            Ok(f) => failed.extend(f),
            Err(_) => failed.push((0, "a capacity writer thread stopped".into())),
        }
    }
    failed
}

/// One set of capacity writes shared by the threads that carry it out.
struct CapacityWrites {
    devices: Vec<Arc<dyn Disk>>,
    /// Each run's blocks, in order, as pieces written together.
    runs: Vec<(BlockLoc, Vec<Bytes>)>,
    next: AtomicUsize,
}

impl CapacityWrites {
    /// Takes runs not yet started until none is left; returns the devices
    /// that failed.
    fn write_remaining(&self) -> Vec<(u8, String)> {
        let mut failed = Vec::new();
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some((loc, pieces)) = self.runs.get(i) else {
                return failed;
            };
            let result = match capacity_disk(&self.devices, loc.device) {
                Some(disk) => disk.write_pieces_at(pieces, loc.block * BLOCK as u64),
                None => continue,
            };
            if let Err(e) = result {
                failed.push((loc.device, e.to_string()));
            }
        }
    }
}

/// Writes a checkpoint; see the module doc for the order of writes.
pub(crate) fn checkpoint(shared: &Shared) -> Result<(), String> {
    let log_blocks = shared.geo.log_blocks;
    let mut st = shared.state.lock();
    st.check_group().map_err(|e| e.to_string())?;
    let generation = st.checkpoint_gen + 1;
    let (vtail, tail_seq) = st.applied_tail();

    // Drop pages that map nothing and have nothing waiting in the overlay.
    let ids: Vec<u64> = st.components.keys().copied().collect();
    for c in &ids {
        let pages: Vec<(u64, RootEntry)> = match st.components.get(c) {
            Some(comp) if comp.failed.is_none() => {
                comp.roots.iter().map(|(p, r)| (*p, *r)).collect()
            }
            _ => continue,
        };
        for (page_no, root) in pages {
            let base = page_no * LBAS_PER_PAGE;
            let waiting = st
                .overlay
                .range((*c, base)..(*c, base + LBAS_PER_PAGE))
                .next()
                .is_some();
            if waiting {
                continue;
            }
            let empty = match st.cache.peek(&(*c, page_no)) {
                Some(p) => {
                    p.is_dirty() && p.pins == 0 && p.page.entries.iter().all(|e| !e.is_mapped())
                }
                None => root.loc.is_none(),
            };
            if !empty {
                continue;
            }
            st.cache.remove(&(*c, page_no));
            if root.loc.is_none() {
                st.new_roots = st.new_roots.saturating_sub(1);
            }
            if let Some(comp) = st.components.get_mut(c) {
                comp.roots.remove(&page_no);
                if let Some(loc) = root.loc {
                    comp.release(loc, 2);
                }
            }
            if let Some(loc) = root.loc {
                st.pending_free.push(loc);
                st.pending_free.push(BlockLoc {
                    device: loc.device,
                    block: loc.block + 1,
                });
            }
        }
    }

    // Snapshot dirty pages into their alternate slots.
    let mut page_writes: Vec<(BlockLoc, Vec<u8>, (u64, u64))> = Vec::new();
    for key in st.cache.dirty_keys() {
        let Some(comp) = st.components.get(&key.0) else {
            st.cache.remove(&key);
            continue;
        };
        if comp.failed.is_some() {
            // A failed component is rebuilt elsewhere; its changes are not
            // written, and must not keep the cache dirty forever.
            st.cache.get_to_clean(&key);
            continue;
        }
        let root = comp
            .roots
            .get(&key.1)
            .copied()
            .unwrap_or(RootEntry { loc: None, slot: 0 });
        let family = comp.family;
        // A changed page never sits in a shared pair (`State::own_page`
        // gave it one of its own first), so the other slot is free to take.
        let (loc, slot) = match root.loc {
            Some(loc) => (loc, 1 - root.slot),
            None => match st.alloc.allocate_pair() {
                Some(loc) => {
                    if let Some(comp) = st.components.get_mut(&key.0) {
                        comp.hold(loc, 2);
                    }
                    st.new_roots = st.new_roots.saturating_sub(1);
                    (loc, 0)
                }
                None => return Err("capacity devices are full: no room for an index page".into()),
            },
        };
        if let Some(comp) = st.components.get_mut(&key.0) {
            comp.roots.insert(
                key.1,
                RootEntry {
                    loc: Some(loc),
                    slot,
                },
            );
        }
        if let Some(p) = st.cache.get_to_clean(&key) {
            p.page.generation = generation;
            p.page.component = family;
            p.pins += 1;
            page_writes.push((
                BlockLoc {
                    device: loc.device,
                    block: loc.block + slot as u64,
                },
                p.page.encode(),
                key,
            ));
        }
    }
    let frees = std::mem::take(&mut st.pending_free);
    st.freeing += frees.len() as u64;
    let ck = Checkpoint {
        generation,
        log_tail_block: vtail % log_blocks,
        log_tail_seq: tail_seq,
        components: st
            .components
            .iter()
            .map(|(id, c)| ComponentRecord {
                id: *id,
                size_bytes: c.size_bytes,
                reserve_bytes: c.reserve_bytes,
                highest_epoch: c.highest_epoch,
                family: c.family,
                root_table: c.snapshot.as_ref().map(|t| t.table),
                pages: c
                    .roots
                    .iter()
                    .filter(|_| c.snapshot.is_none())
                    .filter_map(|(p, r)| {
                        r.loc.map(|loc| PageRoot {
                            page_no: *p,
                            loc,
                            slot: r.slot,
                        })
                    })
                    .collect(),
            })
            .collect(),
    };
    st.checkpoint_wanted = false;
    drop(st);

    // Index pages are scattered 4 KiB writes: several threads keep the
    // devices busy instead of paying one device round trip per page. Each
    // page is copied aligned, so a device opened `O_DIRECT` writes it as it
    // is instead of copying it again.
    let mut runs: Vec<(BlockLoc, Vec<Bytes>)> = page_writes
        .iter()
        .map(|(loc, bytes, _)| (*loc, vec![AlignedBuf::copy_of(bytes).into_bytes()]))
        .collect();
    runs.sort_by_key(|r| r.0);
    let mut failed_devices = write_parallel(shared, runs, CHECKPOINT_WRITERS);
    for (d, _, _) in &shared.geo.areas {
        if let Some(disk) = shared.disk(*d) {
            if let Err(e) = disk.sync() {
                failed_devices.push((*d, e.to_string()));
            }
        }
    }
    let encoded = ck.encode();
    let slot_bytes = shared.geo.meta_slot_blocks * BLOCK as u64;
    if encoded.len() as u64 > slot_bytes {
        return Err(format!(
            "checkpoint of {} bytes does not fit its {} byte slot",
            encoded.len(),
            slot_bytes
        ));
    }
    let buf = AlignedBuf::copy_of(&encoded);
    let offset =
        (shared.geo.meta_start + (generation % 2) * shared.geo.meta_slot_blocks) * BLOCK as u64;
    let cache = shared.cache_disk();
    cache
        .write_at(buf.as_slice(), offset)
        .and_then(|_| cache.sync())
        .map_err(|e| format!("cache device: {e}"))?;

    let mut st = shared.state.lock();
    for (d, reason) in failed_devices {
        st.fail_capacity_device(d, &reason);
    }
    for (_, _, key) in &page_writes {
        if let Some(p) = st.cache.get(key) {
            p.pins = p.pins.saturating_sub(1);
        }
    }
    // The pages just written are clean: the cache comes back within its
    // budget (it may have been lowered while they were dirty).
    st.cache.trim();
    st.alloc.free_all(&frees);
    st.freeing = st.freeing.saturating_sub(frees.len() as u64);
    st.vtail = vtail;
    st.tail_seq = tail_seq;
    st.checkpoint_gen = generation;
    st.checkpoints_done += 1;
    shared.log_space.notify_all();
    Ok(())
}

/// Builds the log entry of a component operation.
pub(crate) fn op_entry(
    op: LogOp,
    c: u64,
    lba: u64,
    count: u64,
    epoch: u64,
    arg: u64,
    arg2: u64,
) -> LogEntry {
    LogEntry {
        op,
        component: c,
        lba,
        count,
        epoch,
        arg,
        arg2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(c: u64, lba: u64) -> DestageItem {
        DestageItem {
            c,
            lba,
            op: lba,
            record: (0, 0),
            from_log: false,
            data: None,
            crc: 0,
            lost: false,
            loc: None,
            placed: true,
        }
    }

    #[test]
    fn lba_runs_join_adjacent_blocks_of_one_component_only() {
        let items: Vec<DestageItem> = [(1, 8), (1, 9), (1, 10), (1, 12), (2, 13), (2, 14), (1, 15)]
            .into_iter()
            .map(|(c, lba)| item(c, lba))
            .collect();
        assert_eq!(
            lba_runs(&items),
            vec![(1, 8, 11), (1, 12, 13), (2, 13, 15), (1, 15, 16)]
        );
        assert!(lba_runs(&[]).is_empty());
    }
}
