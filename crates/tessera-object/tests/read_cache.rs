//! The host read cache seen through the coordinator, over in-memory
//! components that count the reads they serve and can hold a read or a
//! write at a chosen point: hits after a read, invalidation by every path
//! that changes blocks, reads that race with writes, the budget against a
//! model, a new owner's empty start, and which copy a read goes to.

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tessera_blockdev::{copy_by_data, BlockDevice, BlockError, WriteFlags, ZeroMode};
use tessera_object::{
    BlockClone, ComponentError, ComponentIo, ComponentStatus, Coordinator, IoClass, LayoutRecorder,
    ReadCache, TakenSnapshot, READ_CACHE_ENTRY_COST_BYTES,
};
use tessera_types::dirty::DirtyRecord;
use tessera_types::layout::{
    ComponentPlacement, ComponentRole, ComponentState, Layout, Mirror, STRIPE_UNIT_BYTES,
};
use tessera_types::{
    ComponentId, DiskGroupId, Epoch, FaultDomainId, HostId, Lba, VolumeId, BLOCK_BYTES,
};
use tokio::sync::{oneshot, Notify};

const B: u64 = BLOCK_BYTES;
const MIB: u64 = 1 << 20;
const SIZE: u64 = 8 * MIB;

/// An operation held at a point of its way through a component until the
/// test lets it go.
struct Hold {
    component: ComponentId,
    lba: u64,
    /// Signalled once the operation is held.
    reached: Arc<Notify>,
    release: oneshot::Receiver<()>,
}

#[derive(Default)]
struct Replica {
    blocks: BTreeMap<u64, Vec<u8>>,
    epoch: Epoch,
    /// A snapshot: refuses every change, as the store's does.
    read_only: bool,
    /// The component a snapshot or clone was made from (making it again
    /// succeeds; making it over another component does not).
    made_from: Option<ComponentId>,
}

impl Replica {
    /// What a change to a snapshot gets from a host: the store refuses it
    /// (answered `Invalid`, an I/O error naming the component).
    fn check_writable(&self, c: &ComponentPlacement) -> Result<(), ComponentError> {
        if self.read_only {
            return Err(ComponentError::Io {
                component: c.id,
                detail: format!("component {} is a snapshot: it cannot be written", c.id),
            });
        }
        Ok(())
    }
}

/// Components in memory. Reads are counted per component; a read can be
/// held after it took its data ([`Components::hold_read`]) and a write
/// before it lands ([`Components::hold_write`]).
#[derive(Default)]
struct Components {
    replicas: Mutex<HashMap<ComponentId, Replica>>,
    reads: Mutex<HashMap<ComponentId, u64>>,
    local: Mutex<HashSet<HostId>>,
    no_space: Mutex<HashSet<ComponentId>>,
    read_hold: Mutex<Option<Hold>>,
    write_hold: Mutex<Option<Hold>>,
}

fn take_hold(slot: &Mutex<Option<Hold>>, c: &ComponentPlacement, lba: Lba) -> Option<Hold> {
    let mut slot = slot.lock();
    if slot
        .as_ref()
        .is_some_and(|h| h.component == c.id && h.lba == lba.0)
    {
        return slot.take();
    }
    None
}

impl Components {
    fn reads_of(&self, id: u64) -> u64 {
        self.reads
            .lock()
            .get(&ComponentId(id))
            .copied()
            .unwrap_or(0)
    }

    fn total_reads(&self) -> u64 {
        self.reads.lock().values().sum()
    }

    /// Holds the next read of `lba` on `component` once it has its data;
    /// returns (held, let it go).
    fn hold_read(&self, component: u64, lba: u64) -> (Arc<Notify>, oneshot::Sender<()>) {
        let (tx, rx) = oneshot::channel();
        let reached = Arc::new(Notify::new());
        *self.read_hold.lock() = Some(Hold {
            component: ComponentId(component),
            lba,
            reached: Arc::clone(&reached),
            release: rx,
        });
        (reached, tx)
    }

    /// Makes `made` holding what `from` holds, as a snapshot (checked
    /// against `from`'s epoch) or as a clone of one.
    fn make(
        &self,
        from: &ComponentPlacement,
        made: ComponentId,
        epoch: Epoch,
        snapshot: bool,
    ) -> Result<(), ComponentError> {
        let mut all = self.replicas.lock();
        let Some(source) = all.get(&from.id) else {
            return Err(ComponentError::NotFound {
                component: from.id,
                host: from.host.clone(),
            });
        };
        if snapshot {
            if epoch < source.epoch {
                return Err(ComponentError::StaleEpoch {
                    component: from.id,
                    epoch,
                    highest: source.epoch,
                });
            }
            source.check_writable(from)?;
        } else if !source.read_only {
            return Err(ComponentError::Io {
                component: from.id,
                detail: format!("component {} is not a snapshot", from.id),
            });
        }
        if let Some(existing) = all.get(&made) {
            if existing.made_from == Some(from.id) && existing.read_only == snapshot {
                return Ok(());
            }
            return Err(ComponentError::Io {
                component: from.id,
                detail: format!("component {made} already exists"),
            });
        }
        let copy = Replica {
            blocks: source.blocks.clone(),
            epoch: source.epoch.max(epoch),
            read_only: snapshot,
            made_from: Some(from.id),
        };
        all.insert(made, copy);
        Ok(())
    }

    /// Holds the next write of `lba` on `component` before it lands.
    fn hold_write(&self, component: u64, lba: u64) -> (Arc<Notify>, oneshot::Sender<()>) {
        let (tx, rx) = oneshot::channel();
        let reached = Arc::new(Notify::new());
        *self.write_hold.lock() = Some(Hold {
            component: ComponentId(component),
            lba,
            reached: Arc::clone(&reached),
            release: rx,
        });
        (reached, tx)
    }
}

#[async_trait]
impl ComponentIo for Components {
    async fn write(
        &self,
        c: &ComponentPlacement,
        lba: Lba,
        data: Bytes,
        epoch: Epoch,
        _class: IoClass,
    ) -> Result<(), ComponentError> {
        if let Some(hold) = take_hold(&self.write_hold, c, lba) {
            hold.reached.notify_one();
            let _ = hold.release.await;
        }
        if self.no_space.lock().contains(&c.id) {
            return Err(ComponentError::NoSpace { component: c.id });
        }
        let mut all = self.replicas.lock();
        let r = all.entry(c.id).or_default();
        if epoch < r.epoch {
            return Err(ComponentError::StaleEpoch {
                component: c.id,
                epoch,
                highest: r.epoch,
            });
        }
        r.check_writable(c)?;
        for (i, chunk) in data.chunks(B as usize).enumerate() {
            r.blocks.insert(lba.0 + i as u64, chunk.to_vec());
        }
        Ok(())
    }

    async fn read(
        &self,
        c: &ComponentPlacement,
        lba: Lba,
        blocks: u32,
        _class: IoClass,
    ) -> Result<Bytes, ComponentError> {
        *self.reads.lock().entry(c.id).or_default() += 1;
        let data = {
            let all = self.replicas.lock();
            let mut out = Vec::with_capacity(blocks as usize * B as usize);
            for b in lba.0..lba.0 + blocks as u64 {
                match all.get(&c.id).and_then(|r| r.blocks.get(&b)) {
                    Some(v) => out.extend_from_slice(v),
                    None => out.extend_from_slice(&[0u8; B as usize]),
                }
            }
            Bytes::from(out)
        };
        if let Some(hold) = take_hold(&self.read_hold, c, lba) {
            hold.reached.notify_one();
            let _ = hold.release.await;
        }
        Ok(data)
    }

    async fn unmap(
        &self,
        c: &ComponentPlacement,
        lba: Lba,
        blocks: u64,
        _epoch: Epoch,
        _class: IoClass,
    ) -> Result<(), ComponentError> {
        let mut all = self.replicas.lock();
        let r = all.entry(c.id).or_default();
        r.check_writable(c)?;
        for b in lba.0..lba.0 + blocks {
            r.blocks.remove(&b);
        }
        Ok(())
    }

    async fn allocated(
        &self,
        c: &ComponentPlacement,
        from: Lba,
        blocks: u64,
    ) -> Result<Vec<(Lba, u64)>, ComponentError> {
        let all = self.replicas.lock();
        let mut runs: Vec<(Lba, u64)> = Vec::new();
        if let Some(r) = all.get(&c.id) {
            for (&b, _) in r.blocks.range(from.0..from.0 + blocks) {
                match runs.last_mut() {
                    Some((s, n)) if s.0 + *n == b => *n += 1,
                    _ => runs.push((Lba(b), 1)),
                }
            }
        }
        Ok(runs)
    }

    async fn clone_blocks(&self, clone: &BlockClone) -> Result<(), ComponentError> {
        let (source, target) = (&clone.source, &clone.target);
        if source.host != target.host || source.disk_group != target.disk_group {
            return Err(ComponentError::NotShared {
                component: target.id,
                host: target.host.clone(),
                detail: "the source is on another disk group".into(),
            });
        }
        let mut all = self.replicas.lock();
        let from: Vec<Option<Vec<u8>>> = {
            let r = all.entry(source.id).or_default();
            (clone.source_lba.0..clone.source_lba.0 + clone.blocks)
                .map(|b| r.blocks.get(&b).cloned())
                .collect()
        };
        let r = all.entry(target.id).or_default();
        r.check_writable(target)?;
        for (i, block) in from.into_iter().enumerate() {
            let b = clone.target_lba.0 + i as u64;
            match block {
                Some(data) => r.blocks.insert(b, data),
                None => r.blocks.remove(&b),
            };
        }
        Ok(())
    }

    async fn fence(&self, c: &ComponentPlacement, epoch: Epoch) -> Result<(), ComponentError> {
        let mut all = self.replicas.lock();
        let r = all.entry(c.id).or_default();
        if epoch < r.epoch {
            return Err(ComponentError::StaleEpoch {
                component: c.id,
                epoch,
                highest: r.epoch,
            });
        }
        r.epoch = epoch;
        Ok(())
    }

    async fn create(&self, c: &ComponentPlacement, _reserve: u64) -> Result<(), ComponentError> {
        self.replicas.lock().entry(c.id).or_default();
        Ok(())
    }

    async fn resize(&self, c: &ComponentPlacement, _size: u64) -> Result<(), ComponentError> {
        match self.replicas.lock().get(&c.id) {
            Some(r) => r.check_writable(c),
            None => Ok(()),
        }
    }

    async fn delete(&self, c: &ComponentPlacement) -> Result<(), ComponentError> {
        self.replicas.lock().remove(&c.id);
        Ok(())
    }

    async fn snapshot(
        &self,
        c: &ComponentPlacement,
        snapshot: ComponentId,
        epoch: Epoch,
    ) -> Result<(), ComponentError> {
        self.make(c, snapshot, epoch, true)
    }

    async fn clone_snapshot(
        &self,
        snapshot: &ComponentPlacement,
        clone: ComponentId,
        epoch: Epoch,
    ) -> Result<(), ComponentError> {
        self.make(snapshot, clone, epoch, false)
    }

    async fn status(&self, c: &ComponentPlacement) -> Result<ComponentStatus, ComponentError> {
        let all = self.replicas.lock();
        let r = all.get(&c.id);
        Ok(ComponentStatus {
            epoch: r.map_or(Epoch(0), |r| r.epoch),
            allocated_bytes: r.map_or(0, |r| r.blocks.len() as u64 * B),
            physical_bytes: 0,
        })
    }

    fn is_local(&self, c: &ComponentPlacement) -> bool {
        self.local.lock().contains(&c.host)
    }
}

#[derive(Default)]
struct Recorded;

#[async_trait]
impl LayoutRecorder for Recorded {
    async fn record(&self, _layout: &Layout, _dirty: &DirtyRecord) -> Result<(), String> {
        Ok(())
    }

    async fn record_dirty(&self, _dirty: &DirtyRecord) -> Result<(), String> {
        Ok(())
    }

    async fn record_snapshot(&self, _snapshot: &TakenSnapshot) -> Result<(), String> {
        Ok(())
    }

    async fn record_snapshot_copies(
        &self,
        _layout: &Layout,
        _dirty: &DirtyRecord,
        changes: &[tessera_object::SnapshotCopyChange],
    ) -> Result<Vec<u64>, String> {
        // No snapshot is ever recorded here.
        Ok(changes.iter().map(|c| c.snapshot).collect())
    }
}

fn placement(id: u64, role: ComponentRole, host: &str, dg: &str) -> ComponentPlacement {
    ComponentPlacement {
        id: ComponentId(id),
        role,
        host: HostId(host.into()),
        disk_group: DiskGroupId(dg.into()),
        fault_domain: FaultDomainId(host.into()),
        votes: 1,
        size_bytes: if role == ComponentRole::Data { SIZE } else { 0 },
        state: ComponentState::Active,
    }
}

/// An FTT=1 volume `name`: data copies `ids` on h1 and h2 (disk group
/// `dg`), a witness on h3.
fn mirrored(name: &str, ids: [u64; 3], dg: &str) -> Layout {
    Layout {
        volume: VolumeId(name.into()),
        size_bytes: SIZE,
        stripe_unit_bytes: STRIPE_UNIT_BYTES,
        columns: vec![Mirror {
            copies: vec![
                placement(ids[0], ComponentRole::Data, "h1", dg),
                placement(ids[1], ComponentRole::Data, "h2", dg),
            ],
        }],
        witnesses: vec![placement(ids[2], ComponentRole::Witness, "h3", dg)],
        generation: 1,
    }
}

async fn owner(
    comps: &Arc<Components>,
    cache: &Arc<ReadCache>,
    layout: Layout,
    epoch: u64,
) -> Arc<Coordinator> {
    Coordinator::take_over_cached(
        layout,
        None,
        Epoch(epoch),
        7,
        comps.clone(),
        Arc::new(Recorded),
        &tessera_object::HostShared {
            read_cache: Arc::clone(cache),
            scheduler: tessera_object::IoScheduler::unlimited(),
        },
    )
    .await
    .unwrap()
}

/// Components, a cache of 16 MiB and a coordinator of volume "vol".
async fn setup() -> (Arc<Components>, Arc<ReadCache>, Arc<Coordinator>) {
    let comps = Arc::new(Components::default());
    let cache = ReadCache::new(16 * MIB);
    let coord = owner(&comps, &cache, mirrored("vol", [1, 2, 3], "dg0"), 1).await;
    (comps, cache, coord)
}

fn pattern(seed: u8, len: u64) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| seed.wrapping_add((i % 251) as u8) | 1)
            .collect::<Vec<u8>>(),
    )
}

async fn write(coord: &Coordinator, offset: u64, data: Bytes) {
    coord
        .write(offset, data, WriteFlags::default())
        .await
        .unwrap();
}

/// Writes `data` at `offset`, reads it twice and checks the second read
/// was served from the cache alone.
async fn cached(comps: &Components, coord: &Coordinator, offset: u64, data: Bytes) {
    let len = data.len() as u64;
    write(coord, offset, data.clone()).await;
    assert_eq!(coord.read(offset, len).await.unwrap(), data);
    let before = comps.total_reads();
    assert_eq!(coord.read(offset, len).await.unwrap(), data);
    assert_eq!(comps.total_reads(), before, "the second read is a hit");
}

#[tokio::test]
async fn a_second_read_is_served_from_the_cache_and_counted() {
    let (comps, cache, coord) = setup().await;
    write(&coord, 0, pattern(1, 64 * 1024)).await;
    assert_eq!(
        coord.read(0, 64 * 1024).await.unwrap(),
        pattern(1, 64 * 1024)
    );
    let after_first = comps.total_reads();
    assert!(after_first > 0);
    let s = cache.stats();
    assert_eq!((s.hits, s.misses, s.entries), (0, 16, 16));
    // Unaligned inside the cached range: no copy is read.
    assert_eq!(
        coord.read(100, 10_000).await.unwrap(),
        pattern(1, 64 * 1024).slice(100..10_100)
    );
    assert_eq!(comps.total_reads(), after_first);
    let s = cache.stats();
    assert_eq!((s.hits, s.misses), (3, 16));
    assert_eq!(s.bytes_cached, 16 * B);
    assert!(s.memory_bytes <= s.budget_bytes);
    let counters = coord.counters();
    assert_eq!(counters.read_cache_hits.load(Ordering::Relaxed), 3);
    assert_eq!(counters.read_cache_misses.load(Ordering::Relaxed), 16);
    // Part cached, part not: only the missing run is read.
    let before = comps.total_reads();
    let data = coord.read(60 * 1024, 8 * 1024).await.unwrap();
    assert_eq!(&data[..4096], &pattern(1, 64 * 1024)[60 * 1024..]);
    assert!(data[4096..].iter().all(|&b| b == 0));
    assert_eq!(comps.total_reads(), before + 1);
}

#[tokio::test]
async fn one_block_reads_are_counted_and_a_hit_reads_no_copy() {
    let (comps, cache, coord) = setup().await;
    write(&coord, 8192, pattern(4, 4096)).await;
    assert_eq!(coord.read(8192, 4096).await.unwrap(), pattern(4, 4096));
    let after_miss = comps.total_reads();
    for _ in 0..3 {
        assert_eq!(coord.read(8192, 4096).await.unwrap(), pattern(4, 4096));
    }
    assert_eq!(comps.total_reads(), after_miss, "hits read no copy");
    let s = cache.stats();
    assert_eq!((s.hits, s.misses, s.entries), (3, 1, 1));
    let counters = coord.counters();
    assert_eq!(counters.read_cache_hits.load(Ordering::Relaxed), 3);
    assert_eq!(counters.read_cache_misses.load(Ordering::Relaxed), 1);
    // A write of the block replaces what a one-block read returns.
    write(&coord, 8192, pattern(5, 4096)).await;
    assert_eq!(coord.read(8192, 4096).await.unwrap(), pattern(5, 4096));
    assert_eq!(cache.stats().misses, 2);
}

#[tokio::test]
async fn a_disabled_cache_holds_nothing_and_a_budget_turns_it_on_live() {
    let comps = Arc::new(Components::default());
    let cache = ReadCache::disabled();
    let coord = owner(&comps, &cache, mirrored("vol", [1, 2, 3], "dg0"), 1).await;
    write(&coord, 0, pattern(1, 8192)).await;
    coord.read(0, 8192).await.unwrap();
    coord.read(0, 8192).await.unwrap();
    assert_eq!(comps.total_reads(), 2);
    let s = cache.stats();
    assert_eq!((s.hits, s.misses, s.entries, s.budget_bytes), (0, 0, 0, 0));
    cache.set_budget(MIB);
    coord.read(0, 8192).await.unwrap();
    coord.read(0, 8192).await.unwrap();
    assert_eq!(comps.total_reads(), 3);
    assert_eq!(cache.stats().hits, 2);
    cache.set_budget(0);
    assert_eq!(cache.stats().entries, 0);
}

#[tokio::test]
async fn a_write_invalidates() {
    let (comps, _cache, coord) = setup().await;
    cached(&comps, &coord, 0, pattern(1, 16384)).await;
    write(&coord, 4096, pattern(2, 8192)).await;
    let data = coord.read(0, 16384).await.unwrap();
    assert_eq!(&data[..4096], &pattern(1, 16384)[..4096]);
    assert_eq!(&data[4096..12288], &pattern(2, 8192)[..]);
    assert_eq!(&data[12288..], &pattern(1, 16384)[12288..]);
}

#[tokio::test]
async fn an_unaligned_write_invalidates_the_blocks_it_merges_into() {
    let (comps, _cache, coord) = setup().await;
    cached(&comps, &coord, 0, pattern(1, 16384)).await;
    write(&coord, 4000, pattern(2, 200)).await;
    let mut expected = pattern(1, 16384).to_vec();
    expected[4000..4200].copy_from_slice(&pattern(2, 200));
    assert_eq!(coord.read(0, 16384).await.unwrap(), expected);
}

#[tokio::test]
async fn an_unmap_invalidates() {
    let (comps, _cache, coord) = setup().await;
    cached(&comps, &coord, 0, pattern(1, 16384)).await;
    coord.unmap(2048, 8192).await.unwrap();
    let mut expected = pattern(1, 16384).to_vec();
    expected[2048..10240].fill(0);
    assert_eq!(coord.read(0, 16384).await.unwrap(), expected);
}

#[tokio::test]
async fn write_zeroes_invalidates_in_both_modes() {
    for mode in [ZeroMode::MayUnmap, ZeroMode::KeepAllocated] {
        let (comps, _cache, coord) = setup().await;
        cached(&comps, &coord, 0, pattern(1, 16384)).await;
        coord.write_zeroes(1000, 12000, mode).await.unwrap();
        let mut expected = pattern(1, 16384).to_vec();
        expected[1000..13000].fill(0);
        assert_eq!(coord.read(0, 16384).await.unwrap(), expected, "{mode:?}");
    }
}

#[tokio::test]
async fn compare_and_write_invalidates_and_compares_with_what_the_copies_hold() {
    let (comps, _cache, coord) = setup().await;
    cached(&comps, &coord, 0, pattern(1, 8192)).await;
    coord
        .compare_and_write(512, pattern(1, 8192).slice(512..1024), pattern(2, 512))
        .await
        .unwrap();
    let mut expected = pattern(1, 8192).to_vec();
    expected[512..1024].copy_from_slice(&pattern(2, 512));
    assert_eq!(coord.read(0, 8192).await.unwrap(), expected);
    // The old contents no longer compare equal.
    let err = coord
        .compare_and_write(512, pattern(1, 8192).slice(512..1024), pattern(3, 512))
        .await
        .unwrap_err();
    assert!(matches!(err, BlockError::Miscompare { .. }), "{err:?}");
}

#[tokio::test]
async fn blocks_shared_into_the_volume_invalidate() {
    let (comps, cache, coord) = setup().await;
    // Same hosts and disk group: the blocks are shared, no data moves.
    let source = owner(&comps, &cache, mirrored("src", [11, 12, 13], "dg0"), 1).await;
    write(&source, 0, pattern(9, 2 * MIB)).await;
    cached(&comps, &coord, MIB, pattern(1, 2 * MIB)).await;
    let report = coord.copy_shared(&source, 0, MIB, 2 * MIB).await.unwrap();
    assert_eq!(report.shared_bytes, 2 * MIB);
    assert_eq!(coord.read(MIB, 2 * MIB).await.unwrap(), pattern(9, 2 * MIB));
    // A copy inside the volume, unaligned edges included.
    cached(&comps, &coord, 4 * MIB, pattern(3, MIB)).await;
    coord
        .copy_shared(&coord, MIB + 100, 4 * MIB + 100, MIB - 200)
        .await
        .unwrap();
    let mut expected = pattern(3, MIB).to_vec();
    expected[100..MIB as usize - 100]
        .copy_from_slice(&pattern(9, 2 * MIB)[100..MIB as usize - 100]);
    assert_eq!(coord.read(4 * MIB, MIB).await.unwrap(), expected);
}

#[tokio::test]
async fn a_copy_that_moves_the_data_invalidates() {
    let (comps, cache, coord) = setup().await;
    // Another disk group: nothing can be shared, everything is copied.
    let source = owner(&comps, &cache, mirrored("src", [11, 12, 13], "dg1"), 1).await;
    write(&source, 0, pattern(9, MIB)).await;
    cached(&comps, &coord, 0, pattern(1, MIB)).await;
    let report = coord.copy_shared(&source, 0, 0, MIB).await.unwrap();
    assert_eq!(report.copied_bytes, MIB);
    assert_eq!(coord.read(0, MIB).await.unwrap(), pattern(9, MIB));
    // EXTENDED COPY between datastores: the default copy by data.
    cached(&comps, &coord, 0, pattern(2, MIB)).await;
    copy_by_data(source.as_ref(), coord.as_ref(), 0, 0, MIB)
        .await
        .unwrap();
    assert_eq!(coord.read(0, MIB).await.unwrap(), pattern(9, MIB));
    coord
        .copy_from(source.as_ref(), 4096, 0, 8192)
        .await
        .unwrap();
    assert_eq!(
        coord.read(0, 8192).await.unwrap(),
        pattern(9, MIB).slice(4096..12288)
    );
}

#[tokio::test]
async fn a_failed_write_leaves_nothing_stale() {
    let (comps, _cache, coord) = setup().await;
    cached(&comps, &coord, 0, pattern(1, 8192)).await;
    // The copy on h2 has no space: the write fails, after h1 took it.
    comps.no_space.lock().insert(ComponentId(2));
    let err = coord
        .write(0, pattern(2, 8192), WriteFlags::default())
        .await
        .unwrap_err();
    assert!(matches!(err, BlockError::NoSpace { .. }), "{err:?}");
    // What the readable copy holds now, not what was cached.
    assert_eq!(coord.read(0, 8192).await.unwrap(), pattern(2, 8192));
}

#[tokio::test]
async fn a_read_that_raced_a_write_inserts_nothing_older_than_the_write() {
    let (comps, cache, coord) = setup().await;
    write(&coord, 0, pattern(1, 4096)).await;
    // A read takes the old block from copy 1 (region 0 reads there) and is
    // held before it can insert it.
    let (reached, release) = comps.hold_read(1, 0);
    let reader = {
        let coord = Arc::clone(&coord);
        tokio::spawn(async move { coord.read(0, 4096).await.unwrap() })
    };
    reached.notified().await;
    // A write completes and is acknowledged meanwhile.
    write(&coord, 0, pattern(2, 4096)).await;
    release.send(()).unwrap();
    // The racing read may return either; it must not have cached the old.
    let raced = reader.await.unwrap();
    assert_eq!(raced, pattern(1, 4096));
    assert_eq!(cache.stats().refused, 1);
    assert_eq!(cache.stats().entries, 0);
    assert_eq!(coord.read(0, 4096).await.unwrap(), pattern(2, 4096));
    assert_eq!(coord.read(0, 4096).await.unwrap(), pattern(2, 4096));
}

#[tokio::test]
async fn a_read_that_filled_during_a_write_is_dropped_when_the_write_is_acknowledged() {
    let (comps, cache, coord) = setup().await;
    write(&coord, 0, pattern(1, 4096)).await;
    // The write is held before it lands on copy 1.
    let (reached, release) = comps.hold_write(1, 0);
    let writer = {
        let coord = Arc::clone(&coord);
        tokio::spawn(async move { write(&coord, 0, pattern(2, 4096)).await })
    };
    reached.notified().await;
    // A read meanwhile reads copy 1 (old data) and inserts it.
    assert_eq!(coord.read(0, 4096).await.unwrap(), pattern(1, 4096));
    assert_eq!(cache.stats().entries, 1);
    release.send(()).unwrap();
    writer.await.unwrap();
    assert_eq!(
        cache.stats().entries,
        0,
        "dropped before the acknowledgement"
    );
    assert_eq!(coord.read(0, 4096).await.unwrap(), pattern(2, 4096));
}

#[tokio::test]
async fn an_abandoned_write_still_invalidates() {
    let (comps, cache, coord) = setup().await;
    cached(&comps, &coord, 0, pattern(1, 4096)).await;
    // Copy 2 takes the write, copy 1's is held; the caller stops waiting.
    let (reached, _release) = comps.hold_write(1, 0);
    let writer = {
        let coord = Arc::clone(&coord);
        tokio::spawn(async move { write(&coord, 0, pattern(2, 4096)).await })
    };
    reached.notified().await;
    writer.abort();
    let _ = writer.await;
    assert_eq!(cache.stats().entries, 0);
}

#[tokio::test]
async fn a_new_owner_sees_nothing_the_old_one_cached() {
    let comps = Arc::new(Components::default());
    let cache = ReadCache::new(16 * MIB);
    let layout = mirrored("vol", [1, 2, 3], "dg0");
    let old = owner(&comps, &cache, layout.clone(), 1).await;
    write(&old, 0, pattern(1, 65536)).await;
    old.read(0, 65536).await.unwrap();
    assert_eq!(cache.stats().entries, 16);
    let new = owner(&comps, &cache, layout, 2).await;
    assert_ne!(old.read_cache().instance(), new.read_cache().instance());
    let hits = cache.stats().hits;
    let reads = comps.total_reads();
    assert_eq!(new.read(0, 65536).await.unwrap(), pattern(1, 65536));
    assert_eq!(cache.stats().hits, hits, "nothing of the old owner's");
    assert!(comps.total_reads() > reads);
    // The old owner learns it was superseded at its next write and drops
    // what it cached; a dropped coordinator takes its entries along.
    old.write(0, pattern(2, 4096), WriteFlags::default())
        .await
        .unwrap_err();
    assert_eq!(cache.stats().entries, 16, "only the new owner's");
    assert!(old.read(0, 4096).await.is_err());
    drop(old);
    drop(new);
    let s = cache.stats();
    assert_eq!((s.entries, s.volumes), (0, 0));
}

#[tokio::test]
async fn a_host_that_stops_coordinating_forgets_what_it_cached() {
    let (comps, cache, coord) = setup().await;
    cached(&comps, &coord, 0, pattern(1, 8192)).await;
    coord.forget_cached();
    assert_eq!(cache.stats().entries, 0);
    let reads = comps.total_reads();
    coord.read(0, 8192).await.unwrap();
    coord.read(0, 8192).await.unwrap();
    assert_eq!(comps.total_reads(), reads + 2);
    assert_eq!(cache.stats().entries, 0);
}

#[tokio::test]
async fn reads_go_to_a_local_copy_else_to_the_copy_of_their_region() {
    let (comps, _cache, coord) = setup().await;
    cache_off(&coord);
    write(&coord, 0, pattern(1, 4 * MIB)).await;
    // No copy on this host: region r of the column is read from copy r mod 2.
    coord.read(0, 4 * MIB).await.unwrap();
    assert_eq!((comps.reads_of(1), comps.reads_of(2)), (2, 2));
    coord.read(MIB + 4096, 4096).await.unwrap();
    coord.read(3 * MIB, 4096).await.unwrap();
    assert_eq!((comps.reads_of(1), comps.reads_of(2)), (2, 4));
    // A copy on this host serves every read.
    comps.local.lock().insert(HostId("h2".into()));
    coord.read(0, 4 * MIB).await.unwrap();
    assert_eq!((comps.reads_of(1), comps.reads_of(2)), (2, 8));
}

/// Stops `coord` from using the cache, so every read reaches a copy.
fn cache_off(coord: &Coordinator) {
    coord.forget_cached();
}

#[derive(Debug, Clone)]
enum Op {
    Write { at: u64, len: u64, seed: u8 },
    Unmap { at: u64, len: u64 },
    Zero { at: u64, len: u64, keep: bool },
    CompareAndWrite { block: u64, seed: u8 },
    Read { at: u64, len: u64 },
    Budget { entries: u64 },
}

/// The part of the volume the model covers: 3 MiB, three read regions.
const SPAN: u64 = 3 * MIB;

fn op() -> impl Strategy<Value = Op> {
    let range = (0..SPAN - 1, 1..96 * 1024u64).prop_map(|(at, len)| (at, len.min(SPAN - at)));
    prop_oneof![
        3 => (range.clone(), any::<u8>()).prop_map(|((at, len), seed)| Op::Write { at, len, seed }),
        1 => range.clone().prop_map(|(at, len)| Op::Unmap { at, len }),
        1 => (range.clone(), any::<bool>()).prop_map(|((at, len), keep)| Op::Zero { at, len, keep }),
        1 => (0..SPAN / B, any::<u8>()).prop_map(|(block, seed)| Op::CompareAndWrite { block, seed }),
        6 => range.prop_map(|(at, len)| Op::Read { at, len }),
        1 => (0..64u64).prop_map(|entries| Op::Budget { entries }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random changes and reads against a model of the volume: every read
    /// returns what the model holds, and the cache never holds more than
    /// its budget.
    #[test]
    fn reads_match_a_model_and_the_budget_holds(ops in proptest::collection::vec(op(), 1..80)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let comps = Arc::new(Components::default());
            let cache = ReadCache::new(32 * READ_CACHE_ENTRY_COST_BYTES);
            let coord = owner(&comps, &cache, mirrored("vol", [1, 2, 3], "dg0"), 1).await;
            let mut model = vec![0u8; SPAN as usize];
            for op in ops {
                match op {
                    Op::Write { at, len, seed } => {
                        let data = pattern(seed, len);
                        model[at as usize..(at + len) as usize].copy_from_slice(&data);
                        write(&coord, at, data).await;
                    }
                    Op::Unmap { at, len } => {
                        coord.unmap(at, len).await.unwrap();
                        model[at as usize..(at + len) as usize].fill(0);
                    }
                    Op::Zero { at, len, keep } => {
                        let mode = if keep { ZeroMode::KeepAllocated } else { ZeroMode::MayUnmap };
                        coord.write_zeroes(at, len, mode).await.unwrap();
                        model[at as usize..(at + len) as usize].fill(0);
                    }
                    Op::CompareAndWrite { block, seed } => {
                        let at = (block * B) as usize;
                        let current = Bytes::copy_from_slice(&model[at..at + B as usize]);
                        let new = pattern(seed, B);
                        coord.compare_and_write(at as u64, current, new.clone()).await.unwrap();
                        model[at..at + B as usize].copy_from_slice(&new);
                    }
                    Op::Read { at, len } => {
                        let got = coord.read(at, len).await.unwrap();
                        assert!(
                            got[..] == model[at as usize..(at + len) as usize],
                            "read of {len} at {at} differs from the model"
                        );
                    }
                    Op::Budget { entries } => {
                        cache.set_budget(entries * READ_CACHE_ENTRY_COST_BYTES + entries);
                    }
                }
                let s = cache.stats();
                assert!(s.memory_bytes <= s.budget_bytes, "{s:?}");
                assert!(s.entries * READ_CACHE_ENTRY_COST_BYTES <= s.budget_bytes, "{s:?}");
            }
            let all = coord.read(0, SPAN).await.unwrap();
            assert!(all[..] == model[..], "the whole span differs from the model");
        });
    }
}

/// Reads and writes of overlapping ranges at once, many rounds: once every
/// write is acknowledged, every block reads as the last write to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reads_and_writes_end_with_the_last_write() {
    let (_comps, _cache, coord) = setup().await;
    for round in 0..20u8 {
        let mut tasks = Vec::new();
        for k in 0..4u64 {
            let c = Arc::clone(&coord);
            tasks.push(tokio::spawn(async move {
                for i in 0..8u64 {
                    let _ = c.read((k * 3 + i) * 4096, 64 * 1024).await.unwrap();
                }
            }));
        }
        let c = Arc::clone(&coord);
        let writer = tokio::spawn(async move {
            for i in 0..16u64 {
                write(&c, i * 4096, pattern(round.wrapping_add(i as u8), 4096)).await;
            }
        });
        writer.await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        for i in 0..16u64 {
            let got = tokio::time::timeout(Duration::from_secs(5), coord.read(i * 4096, 4096))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                got,
                pattern(round.wrapping_add(i as u8), 4096),
                "round {round} block {i}"
            );
        }
    }
}
