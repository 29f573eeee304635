//! Scenario tests of the coordinator over in-memory components whose hosts
//! can be cut off and whose blocks can be corrupted, the way a real host's
//! store reports it (checksum errors, stale epochs, unreachable hosts).

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tessera_blockdev::{BlockDevice, BlockError, ExtentKind, WriteFlags, ZeroMode};
use tessera_object::{
    BlockClone, ComponentError, ComponentIo, ComponentStatus, Coordinator, CopyReport, IoClass,
    LayoutRecorder, ResyncProgress, TakenSnapshot, CLONE_BLOCKS_MAX,
};
use tessera_types::dirty::DirtyRecord;
use tessera_types::layout::{
    ComponentPlacement, ComponentRole, ComponentState, Layout, Mirror, STRIPE_UNIT_BYTES,
};
use tessera_types::{
    ComponentId, DiskGroupId, Epoch, FaultDomainId, HostId, Lba, VolumeId, BLOCK_BYTES,
};

#[derive(Default)]
struct Replica {
    blocks: BTreeMap<u64, Vec<u8>>,
    corrupt: HashSet<u64>,
    epoch: Epoch,
    /// A snapshot: refuses every change, as the store's does.
    read_only: bool,
    /// The component a snapshot or clone was made from (making it again
    /// succeeds; making it over another component does not).
    made_from: Option<ComponentId>,
}

/// Components held in memory, keyed by component id (unique across the
/// volumes of a test).
#[derive(Default)]
struct Components {
    replicas: Mutex<HashMap<ComponentId, Replica>>,
    down: Mutex<HashSet<HostId>>,
    written_blocks: Mutex<HashMap<ComponentId, u64>>,
    /// Blocks each component received by sharing, and the calls that did it.
    shared_blocks: Mutex<HashMap<ComponentId, u64>>,
    clone_calls: Mutex<Vec<BlockClone>>,
    /// Hosts whose release cannot share blocks.
    cannot_share: Mutex<HashSet<HostId>>,
    /// Hosts that take this long to share blocks.
    slow_clones: Mutex<HashMap<HostId, std::time::Duration>>,
    /// Calls of `allocated` that succeed before every further one fails
    /// (a source copy lost in the middle of a resync).
    allocated_budget: Mutex<Option<u64>>,
    /// How long each read takes, when set (none: at once).
    read_delay: Mutex<Option<std::time::Duration>>,
    /// Reads under way now, and the most there were at once.
    reads_now: std::sync::atomic::AtomicUsize,
    reads_most: std::sync::atomic::AtomicUsize,
}

impl Components {
    fn check(&self, c: &ComponentPlacement) -> Result<(), ComponentError> {
        if self.down.lock().contains(&c.host) {
            return Err(ComponentError::Unreachable {
                component: c.id,
                host: c.host.clone(),
                detail: "host is down".into(),
            });
        }
        Ok(())
    }
    fn check_epoch(
        r: &Replica,
        c: &ComponentPlacement,
        epoch: Epoch,
    ) -> Result<(), ComponentError> {
        if epoch < r.epoch {
            return Err(ComponentError::StaleEpoch {
                component: c.id,
                epoch,
                highest: r.epoch,
            });
        }
        Ok(())
    }
    /// What a change to a snapshot gets from a host: the store refuses it
    /// (answered `Invalid`, an I/O error naming the component).
    fn check_writable(r: &Replica, c: &ComponentPlacement) -> Result<(), ComponentError> {
        if r.read_only {
            return Err(ComponentError::Io {
                component: c.id,
                detail: format!("component {} is a snapshot: it cannot be written", c.id),
            });
        }
        Ok(())
    }
    /// Makes `made` on the host of `from` holding what `from` holds, as a
    /// snapshot (checked against `from`'s epoch) or as a clone of one.
    fn make(
        &self,
        from: &ComponentPlacement,
        made: ComponentId,
        epoch: Epoch,
        snapshot: bool,
    ) -> Result<(), ComponentError> {
        self.check(from)?;
        if self.cannot_share.lock().contains(&from.host) {
            return Err(ComponentError::NotShared {
                component: from.id,
                host: from.host.clone(),
                detail: "the host's release cannot share blocks".into(),
            });
        }
        let mut all = self.replicas.lock();
        let Some(source) = all.get(&from.id) else {
            return Err(ComponentError::NotFound {
                component: from.id,
                host: from.host.clone(),
            });
        };
        if snapshot {
            Self::check_epoch(source, from, epoch)?;
            Self::check_writable(source, from)?;
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
        // The blocks are shared, so a bad one is bad in both.
        let copy = Replica {
            blocks: source.blocks.clone(),
            corrupt: source.corrupt.clone(),
            epoch: source.epoch.max(epoch),
            read_only: snapshot,
            made_from: Some(from.id),
        };
        all.insert(made, copy);
        Ok(())
    }
    fn contents(&self, id: ComponentId) -> BTreeMap<u64, Vec<u8>> {
        self.replicas
            .lock()
            .get(&id)
            .map(|r| r.blocks.clone())
            .unwrap_or_default()
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
        self.check(c)?;
        let mut all = self.replicas.lock();
        let r = all.entry(c.id).or_default();
        Self::check_epoch(r, c, epoch)?;
        Self::check_writable(r, c)?;
        for (i, chunk) in data.chunks(BLOCK_BYTES as usize).enumerate() {
            r.blocks.insert(lba.0 + i as u64, chunk.to_vec());
            r.corrupt.remove(&(lba.0 + i as u64));
        }
        *self.written_blocks.lock().entry(c.id).or_default() += data.len() as u64 / BLOCK_BYTES;
        Ok(())
    }
    async fn read(
        &self,
        c: &ComponentPlacement,
        lba: Lba,
        blocks: u32,
        _class: IoClass,
    ) -> Result<Bytes, ComponentError> {
        self.check(c)?;
        let delay = *self.read_delay.lock();
        if let Some(delay) = delay {
            let now = self.reads_now.fetch_add(1, Ordering::SeqCst) + 1;
            self.reads_most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            self.reads_now.fetch_sub(1, Ordering::SeqCst);
        }
        let all = self.replicas.lock();
        let empty = Replica::default();
        let r = all.get(&c.id).unwrap_or(&empty);
        let mut out = Vec::new();
        for b in lba.0..lba.0 + blocks as u64 {
            if r.corrupt.contains(&b) {
                return Err(ComponentError::Checksum {
                    component: c.id,
                    lba: Lba(b),
                });
            }
            out.extend_from_slice(
                r.blocks
                    .get(&b)
                    .map(|v| v.as_slice())
                    .unwrap_or(&[0u8; 4096]),
            );
        }
        Ok(Bytes::from(out))
    }
    async fn unmap(
        &self,
        c: &ComponentPlacement,
        lba: Lba,
        blocks: u64,
        epoch: Epoch,
        _class: IoClass,
    ) -> Result<(), ComponentError> {
        self.check(c)?;
        let mut all = self.replicas.lock();
        let r = all.entry(c.id).or_default();
        Self::check_epoch(r, c, epoch)?;
        Self::check_writable(r, c)?;
        for b in lba.0..lba.0 + blocks {
            r.blocks.remove(&b);
        }
        Ok(())
    }
    /// Exactly the blocks whose contents differ, as the store's index
    /// comparison finds them.
    async fn changed(
        &self,
        c: &ComponentPlacement,
        base: ComponentId,
        from: Lba,
        blocks: u64,
    ) -> Result<Vec<(Lba, u64)>, ComponentError> {
        self.check(c)?;
        let all = self.replicas.lock();
        let empty = BTreeMap::new();
        let of = |id: ComponentId| all.get(&id).map_or(&empty, |r| &r.blocks);
        let (a, b) = (of(c.id), of(base));
        let mut runs: Vec<(Lba, u64)> = Vec::new();
        let lbas: std::collections::BTreeSet<u64> = a
            .range(from.0..from.0 + blocks)
            .chain(b.range(from.0..from.0 + blocks))
            .map(|(l, _)| *l)
            .collect();
        for l in lbas.into_iter().filter(|l| a.get(l) != b.get(l)) {
            match runs.last_mut() {
                Some((s, n)) if s.0 + *n == l => *n += 1,
                _ => runs.push((Lba(l), 1)),
            }
        }
        Ok(runs)
    }

    async fn allocated(
        &self,
        c: &ComponentPlacement,
        from: Lba,
        blocks: u64,
    ) -> Result<Vec<(Lba, u64)>, ComponentError> {
        self.check(c)?;
        if let Some(left) = self.allocated_budget.lock().as_mut() {
            if *left == 0 {
                return Err(ComponentError::Unreachable {
                    component: c.id,
                    host: c.host.clone(),
                    detail: "host lost".into(),
                });
            }
            *left -= 1;
        }
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
        self.check(target)?;
        let refuse = |detail: &str| ComponentError::NotShared {
            component: target.id,
            host: target.host.clone(),
            detail: detail.into(),
        };
        if self.cannot_share.lock().contains(&target.host) {
            return Err(refuse("the host's release cannot share blocks"));
        }
        if source.host != target.host || source.disk_group != target.disk_group {
            return Err(refuse("the source is on another disk group"));
        }
        let (s, t, n) = (clone.source_lba.0, clone.target_lba.0, clone.blocks);
        // The store refuses these; a coordinator must never ask.
        assert!(n <= CLONE_BLOCKS_MAX, "{n} blocks in one clone");
        assert!(
            source.id != target.id || s + n <= t || t + n <= s,
            "overlapping ranges of one component"
        );
        let delay = self.slow_clones.lock().get(&target.host).copied();
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let mut all = self.replicas.lock();
        Self::check_epoch(all.entry(target.id).or_default(), target, clone.epoch)?;
        Self::check_writable(&all[&target.id], target)?;
        let from: Vec<Option<Vec<u8>>> = {
            let r = all.entry(source.id).or_default();
            (s..s + n).map(|b| r.blocks.get(&b).cloned()).collect()
        };
        let r = all.get_mut(&target.id).unwrap();
        for (i, block) in from.into_iter().enumerate() {
            let b = t + i as u64;
            r.corrupt.remove(&b);
            match block {
                Some(data) => r.blocks.insert(b, data),
                None => r.blocks.remove(&b),
            };
        }
        *self.shared_blocks.lock().entry(target.id).or_default() += n;
        self.clone_calls.lock().push(clone.clone());
        Ok(())
    }
    async fn fence(&self, c: &ComponentPlacement, epoch: Epoch) -> Result<(), ComponentError> {
        self.check(c)?;
        let mut all = self.replicas.lock();
        let r = all.entry(c.id).or_default();
        Self::check_epoch(r, c, epoch)?;
        r.epoch = epoch;
        Ok(())
    }
    async fn create(&self, c: &ComponentPlacement, _reserve: u64) -> Result<(), ComponentError> {
        self.check(c)?;
        self.replicas.lock().entry(c.id).or_default();
        Ok(())
    }
    async fn resize(&self, c: &ComponentPlacement, _size: u64) -> Result<(), ComponentError> {
        self.check(c)?;
        match self.replicas.lock().get(&c.id) {
            Some(r) => Self::check_writable(r, c),
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
        self.check(c)?;
        let all = self.replicas.lock();
        let r = all.get(&c.id);
        Ok(ComponentStatus {
            epoch: r.map_or(Epoch(0), |r| r.epoch),
            allocated_bytes: r.map_or(0, |r| r.blocks.len() as u64 * BLOCK_BYTES),
            physical_bytes: 0,
        })
    }
}

/// What the coordinator recorded: every layout, and the dirty-region
/// record as the directory would hold it.
#[derive(Default)]
struct Recorded(
    Mutex<Vec<Layout>>,
    Mutex<Option<DirtyRecord>>,
    AtomicBool,
    Mutex<Vec<TakenSnapshot>>,
);

impl Recorded {
    /// The directory's latest layout and dirty-region record.
    fn latest(&self) -> (Layout, Option<DirtyRecord>) {
        (
            self.0.lock().last().cloned().unwrap(),
            self.1.lock().clone(),
        )
    }

    /// Makes every record of dirty regions alone fail (a directory that
    /// cannot be reached).
    fn refuse_dirty(&self) {
        self.2.store(true, Ordering::SeqCst);
    }
}

#[async_trait]
impl LayoutRecorder for Recorded {
    async fn record(&self, layout: &Layout, dirty: &DirtyRecord) -> Result<(), String> {
        self.0.lock().push(layout.clone());
        *self.1.lock() = Some(dirty.clone());
        Ok(())
    }

    async fn record_dirty(&self, dirty: &DirtyRecord) -> Result<(), String> {
        if self.2.load(Ordering::SeqCst) {
            return Err("the directory cannot be reached".into());
        }
        *self.1.lock() = Some(dirty.clone());
        Ok(())
    }

    async fn record_snapshot(&self, snapshot: &TakenSnapshot) -> Result<(), String> {
        let mut taken = self.3.lock();
        if taken.iter().any(|s| s.name == snapshot.name) {
            return Err(format!("a snapshot named {} exists", snapshot.name));
        }
        taken.push(snapshot.clone());
        Ok(())
    }

    async fn record_snapshot_copies(
        &self,
        layout: &Layout,
        dirty: &DirtyRecord,
        changes: &[tessera_object::SnapshotCopyChange],
    ) -> Result<Vec<u64>, String> {
        let mut taken = self.3.lock();
        let gone = tessera_object::SnapshotCopyChange::apply_all(
            changes,
            taken.iter_mut().map(|s| (s.id, &mut s.layout)),
        );
        self.0.lock().push(layout.clone());
        *self.1.lock() = Some(dirty.clone());
        Ok(gone)
    }
}

fn component(id: u64, role: ComponentRole, host: &str, size: u64) -> ComponentPlacement {
    ComponentPlacement {
        id: ComponentId(id),
        role,
        host: HostId(host.into()),
        disk_group: DiskGroupId("dg0".into()),
        fault_domain: FaultDomainId(host.into()),
        votes: 1,
        size_bytes: size,
        state: ComponentState::Active,
    }
}

const SIZE: u64 = 64 << 20;

fn ftt1_layout() -> Layout {
    ftt1_layout_of(SIZE)
}

fn ftt1_layout_of(size: u64) -> Layout {
    Layout {
        volume: VolumeId("vol".into()),
        size_bytes: size,
        stripe_unit_bytes: STRIPE_UNIT_BYTES,
        columns: vec![Mirror {
            copies: vec![
                component(1, ComponentRole::Data, "h1", size),
                component(2, ComponentRole::Data, "h2", size),
            ],
        }],
        witnesses: vec![component(3, ComponentRole::Witness, "h3", 0)],
        generation: 1,
    }
}

async fn setup(layout: Layout) -> (Arc<Components>, Arc<Recorded>, Arc<Coordinator>) {
    let comps = Arc::new(Components::default());
    let rec = Arc::new(Recorded::default());
    let coord = Coordinator::take_over(layout, Epoch(1), 7, comps.clone(), rec.clone())
        .await
        .unwrap();
    (comps, rec, coord)
}

/// The owner after the last one: takes `layout` over at `epoch` with the
/// dirty-region record `dirty` the earlier owners left.
async fn next_owner(
    layout: Layout,
    dirty: Option<DirtyRecord>,
    epoch: Epoch,
    comps: &Arc<Components>,
    rec: &Arc<Recorded>,
) -> Arc<Coordinator> {
    Coordinator::take_over_cached(
        layout,
        dirty,
        epoch,
        7,
        comps.clone(),
        rec.clone(),
        &tessera_object::HostShared::alone(),
    )
    .await
    .unwrap()
}

fn pattern(seed: u8, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| seed.wrapping_add((i % 251) as u8))
            .collect::<Vec<u8>>(),
    )
}

#[tokio::test]
async fn writes_reach_every_copy_and_unaligned_writes_merge() {
    let (comps, _rec, coord) = setup(ftt1_layout()).await;
    coord
        .write(0, pattern(1, 8192), WriteFlags::default())
        .await
        .unwrap();
    coord
        .write(1000, pattern(9, 100), WriteFlags::default())
        .await
        .unwrap();
    let got = coord.read(0, 8192).await.unwrap();
    let mut expect = pattern(1, 8192).to_vec();
    expect[1000..1100].copy_from_slice(&pattern(9, 100));
    assert_eq!(&got[..], &expect[..]);
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );
    // Witness holds no data.
    assert!(comps.contents(ComponentId(3)).is_empty());
}

#[tokio::test]
async fn absent_copy_gets_delta_resync_of_only_changed_blocks() {
    let (comps, rec, coord) = setup(ftt1_layout()).await;
    for i in 0..64u64 {
        coord
            .write(i * 65536, pattern(i as u8, 4096), WriteFlags::default())
            .await
            .unwrap();
    }
    comps.down.lock().insert(HostId("h2".into()));
    // The first write notices the host is gone and carries on degraded.
    let mut written_while_away = 0;
    for i in 0..10u64 {
        coord
            .write(
                i * 131072 + 4096,
                pattern(100 + i as u8, 4096),
                WriteFlags::default(),
            )
            .await
            .unwrap();
        written_while_away += 4096;
    }
    let layout = coord.layout();
    assert_eq!(layout.columns[0].copies[1].state, ComponentState::Absent);
    assert!(rec
        .0
        .lock()
        .iter()
        .any(|l| l.columns[0].copies[1].state == ComponentState::Absent));
    assert_eq!(
        coord.dirty_bytes(),
        vec![(ComponentId(2), written_while_away)]
    );
    comps.down.lock().clear();
    let progress = ResyncProgress::default();
    let report = coord.resync(ComponentId(2), &progress).await.unwrap();
    assert_eq!(report.copied_bytes, written_while_away);
    // The live counters end where the report does.
    assert_eq!(
        progress
            .copied_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
        report.copied_bytes
    );
    assert_eq!(
        progress
            .left_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert_eq!(
        coord.layout().columns[0].copies[1].state,
        ComponentState::Active
    );
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );
    assert!(coord.dirty_bytes().is_empty());
}

/// The owner dies while a copy is away; the next owner reads the layout
/// and the dirty-region record the first one left, and resyncs the copy's
/// recorded regions only (1 MiB each), not the whole copy.
#[tokio::test]
async fn a_new_owner_resyncs_only_the_regions_its_predecessor_recorded() {
    let (comps, rec, first) = setup(ftt1_layout()).await;
    // The whole volume holds data before the copy leaves.
    for i in 0..(SIZE >> 20) {
        first
            .write(i << 20, pattern(i as u8, 1 << 20), WriteFlags::default())
            .await
            .unwrap();
    }
    // Time passes: the write intents of those writes settle.
    first.settle_intents().await.unwrap();
    first.settle_intents().await.unwrap();
    comps.down.lock().insert(HostId("h2".into()));
    // While it is away: 3 MiB at 8 MiB, and one 4 KiB write at 40 MiB.
    first
        .write(8 << 20, pattern(200, 3 << 20), WriteFlags::default())
        .await
        .unwrap();
    first
        .write(40 << 20, pattern(201, 4096), WriteFlags::default())
        .await
        .unwrap();
    let (layout, dirty) = rec.latest();
    assert_eq!(layout.columns[0].copies[1].state, ComponentState::Absent);
    let dirty = dirty.expect("a dirty-region record");
    assert_eq!(
        dirty.get(ComponentId(2)).unwrap().ranges(),
        vec![(2048, 768), (10240, 256)],
        "the record holds the 1 MiB regions written while the copy was away"
    );
    // The first owner is gone; the copy's host is back.
    drop(first);
    comps.down.lock().clear();
    let second = next_owner(layout.clone(), Some(dirty), Epoch(2), &comps, &rec).await;
    assert_eq!(second.dirty_bytes(), vec![(ComponentId(2), 4 << 20)]);
    let report = second
        .resync(ComponentId(2), &ResyncProgress::default())
        .await
        .unwrap();
    assert_eq!(report.copied_bytes, 4 << 20);
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );
    // Caught up: the copy has no entry left in the record.
    let (_, dirty) = rec.latest();
    assert!(dirty.unwrap().components.is_empty());
    // Without a record, a new owner knows nothing and resyncs everything.
    comps.down.lock().insert(HostId("h2".into()));
    second
        .write(0, pattern(9, 4096), WriteFlags::default())
        .await
        .unwrap();
    comps.down.lock().clear();
    let (layout, _) = rec.latest();
    let third = Coordinator::take_over(layout, Epoch(3), 7, comps.clone(), rec.clone())
        .await
        .unwrap();
    assert_eq!(third.dirty_bytes(), vec![(ComponentId(2), SIZE)]);
}

/// An owner tries to resync a copy whose host still looks alive but cannot
/// be reached: the attempt fails and leaves the copy recorded as it was
/// (Absent), so the next owner resyncs only what the copy missed, not the
/// regions of writes that were under way shortly before it left.
#[tokio::test]
async fn a_resync_that_cannot_reach_its_copy_leaves_it_recorded_absent() {
    let (comps, rec, first) = setup(ftt1_layout()).await;
    // Written just before the copy leaves: the write intents of these
    // regions are still recorded.
    write_every_mib(&first, 8 << 20, 1 << 20).await;
    comps.down.lock().insert(HostId("h2".into()));
    first
        .write(40 << 20, pattern(201, 1 << 20), WriteFlags::default())
        .await
        .unwrap();
    let progress = ResyncProgress::default();
    let err = first.resync(ComponentId(2), &progress).await.unwrap_err();
    assert!(err.to_string().contains("unreachable"), "{err}");
    let (layout, dirty) = rec.latest();
    assert_eq!(
        layout.columns[0].copies[1].state,
        ComponentState::Absent,
        "a copy no resync reached is recorded as away"
    );
    drop(first);
    comps.down.lock().clear();
    let second = next_owner(layout, dirty, Epoch(2), &comps, &rec).await;
    assert_eq!(second.dirty_bytes(), vec![(ComponentId(2), 1 << 20)]);
    let report = second
        .resync(ComponentId(2), &ResyncProgress::default())
        .await
        .unwrap();
    assert_eq!(report.copied_bytes, 1 << 20);
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );
}

/// Writes `len` bytes at the start of every 1 MiB region of a
/// `size`-byte volume.
async fn write_every_mib(coord: &Coordinator, size: u64, len: usize) {
    for i in 0..(size >> 20) {
        coord
            .write(i << 20, pattern(i as u8, len), WriteFlags::default())
            .await
            .unwrap();
    }
}

/// A resync records how far it got: when it stops half way (its source
/// lost), the next owner continues from the last record instead of
/// starting again.
#[tokio::test]
async fn a_new_owner_continues_a_resync_from_where_the_last_record_left_it() {
    const BIG: u64 = 256 << 20;
    let (comps, rec, first) = setup(ftt1_layout_of(BIG)).await;
    comps.down.lock().insert(HostId("h2".into()));
    // One block in every 1 MiB region while the copy is away.
    write_every_mib(&first, BIG, 4096).await;
    // Time passes: the write intents of the first write (sent to both
    // copies) settle.
    first.settle_intents().await.unwrap();
    first.settle_intents().await.unwrap();
    comps.down.lock().clear();
    // The source goes after 100 resync steps.
    *comps.allocated_budget.lock() = Some(100);
    let progress = ResyncProgress::default();
    first
        .resync(ComponentId(2), &progress)
        .await
        .expect_err("the source is lost half way");
    *comps.allocated_budget.lock() = None;
    // Each step copied one dirty 4 KiB block.
    assert_eq!(progress.done_bytes.load(Ordering::Relaxed), 100 * 4096);
    let (layout, dirty) = rec.latest();
    drop(first);
    let second = next_owner(layout, dirty, Epoch(2), &comps, &rec).await;
    // The last record was taken when step 64 ended: 64 regions were done.
    assert_eq!(
        second.dirty_bytes(),
        vec![(ComponentId(2), BIG - (64 << 20))]
    );
    let report = second
        .resync(ComponentId(2), &ResyncProgress::default())
        .await
        .unwrap();
    // The record is coarse: whole regions to examine, but only the
    // blocks the source holds are copied.
    assert_eq!(report.dirty_bytes, BIG - (64 << 20));
    assert_eq!(report.copied_bytes, (256 - 64) * 4096);
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );
}

/// With nothing to space them (multiplier 1), a resync runs two steps at
/// once, and every region still arrives.
#[tokio::test]
async fn a_resync_reads_the_source_of_two_steps_at_once() {
    const BIG: u64 = 16 << 20;
    let (comps, _rec, coord) = setup(ftt1_layout_of(BIG)).await;
    comps.down.lock().insert(HostId("h2".into()));
    write_every_mib(&coord, BIG, 8192).await;
    comps.down.lock().clear();
    *comps.read_delay.lock() = Some(std::time::Duration::from_millis(20));
    let progress = ResyncProgress::default();
    let report = coord.resync(ComponentId(2), &progress).await.unwrap();
    assert_eq!(report.copied_bytes, 16 * 8192);
    assert_eq!(comps.reads_most.load(Ordering::SeqCst), 2);
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );
    assert_eq!(coord.dirty_bytes(), vec![]);
}

/// A degraded write whose dirty region cannot be recorded is refused
/// before any copy has it: a later owner could not know to resync it.
#[tokio::test]
async fn a_degraded_write_is_refused_untouched_when_its_dirty_region_cannot_be_recorded() {
    let (comps, rec, coord) = setup(ftt1_layout()).await;
    comps.down.lock().insert(HostId("h2".into()));
    coord
        .write(0, pattern(1, 4096), WriteFlags::default())
        .await
        .unwrap();
    rec.refuse_dirty();
    // Inside the recorded region: needs no new record, succeeds.
    coord
        .write(8192, pattern(2, 4096), WriteFlags::default())
        .await
        .unwrap();
    let before = comps.contents(ComponentId(1));
    let err = coord
        .write(32 << 20, pattern(3, 4096), WriteFlags::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("recording dirty regions"), "{err}");
    assert_eq!(comps.contents(ComponentId(1)), before, "no copy has it");
}

#[tokio::test]
async fn checksum_failure_is_served_from_the_other_copy_and_repaired() {
    let (comps, _rec, coord) = setup(ftt1_layout()).await;
    coord
        .write(0, pattern(5, 16384), WriteFlags::default())
        .await
        .unwrap();
    comps
        .replicas
        .lock()
        .get_mut(&ComponentId(1))
        .unwrap()
        .corrupt
        .insert(2);
    for _ in 0..4 {
        assert_eq!(coord.read(0, 16384).await.unwrap(), pattern(5, 16384));
    }
    assert!(
        comps.replicas.lock()[&ComponentId(1)].corrupt.is_empty(),
        "bad block rewritten"
    );
    // Both copies bad: an error, never data.
    comps
        .replicas
        .lock()
        .get_mut(&ComponentId(1))
        .unwrap()
        .corrupt
        .insert(3);
    comps
        .replicas
        .lock()
        .get_mut(&ComponentId(2))
        .unwrap()
        .corrupt
        .insert(3);
    let err = coord.read(12288, 4096).await.unwrap_err();
    assert_eq!(err, BlockError::Checksum { offset: 12288 });
}

#[tokio::test]
async fn losing_quorum_stops_writes() {
    let (comps, _rec, coord) = setup(ftt1_layout()).await;
    comps.down.lock().insert(HostId("h2".into()));
    coord
        .write(0, pattern(1, 4096), WriteFlags::default())
        .await
        .unwrap();
    coord.host_absent(&HostId("h3".into())).await.unwrap();
    let err = coord
        .write(0, pattern(2, 4096), WriteFlags::default())
        .await
        .unwrap_err();
    assert!(matches!(err, BlockError::Unavailable { .. }), "{err}");
}

#[tokio::test]
async fn a_newer_owner_fences_the_old_one() {
    let layout = ftt1_layout();
    let comps = Arc::new(Components::default());
    let rec = Arc::new(Recorded::default());
    let old = Coordinator::take_over(layout.clone(), Epoch(1), 7, comps.clone(), rec.clone())
        .await
        .unwrap();
    old.write(0, pattern(1, 4096), WriteFlags::default())
        .await
        .unwrap();
    let new = Coordinator::take_over(layout, Epoch(2), 7, comps.clone(), rec.clone())
        .await
        .unwrap();
    new.write(0, pattern(2, 4096), WriteFlags::default())
        .await
        .unwrap();
    let err = old
        .write(0, pattern(3, 4096), WriteFlags::default())
        .await
        .unwrap_err();
    assert!(matches!(err, BlockError::Unavailable { .. }));
    assert!(old.superseded().is_some());
    assert_eq!(new.read(0, 4096).await.unwrap(), pattern(2, 4096));
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );
    // An older owner cannot take over again.
    assert!(
        Coordinator::take_over(ftt1_layout(), Epoch(1), 7, comps, rec)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn compare_and_write_and_block_status() {
    let (_comps, _rec, coord) = setup(ftt1_layout()).await;
    coord
        .write(8192, pattern(1, 512), WriteFlags::default())
        .await
        .unwrap();
    let err = coord
        .compare_and_write(8192, pattern(2, 512), pattern(3, 512))
        .await
        .unwrap_err();
    assert_eq!(err, BlockError::Miscompare { offset: 0 });
    coord
        .compare_and_write(8192, pattern(1, 512), pattern(3, 512))
        .await
        .unwrap();
    assert_eq!(coord.read(8192, 512).await.unwrap(), pattern(3, 512));
    let map = coord.block_status(0, 32768).await.unwrap();
    assert_eq!(
        map.iter()
            .map(|e| (e.offset, e.len, e.kind))
            .collect::<Vec<_>>(),
        vec![
            (0, 8192, ExtentKind::Hole),
            (8192, 4096, ExtentKind::Data),
            (12288, 20480, ExtentKind::Hole),
        ]
    );
    coord
        .write_zeroes(8192, 4096, ZeroMode::MayUnmap)
        .await
        .unwrap();
    let map = coord.block_status(0, 32768).await.unwrap();
    assert_eq!(map.len(), 1);
    assert_eq!(map[0].kind, ExtentKind::Hole);
}

#[tokio::test]
async fn rebuild_replaces_a_lost_copy_and_copies_allocated_data() {
    let (comps, _rec, coord) = setup(ftt1_layout()).await;
    coord
        .write(0, pattern(4, 65536), WriteFlags::default())
        .await
        .unwrap();
    comps.down.lock().insert(HostId("h2".into()));
    coord
        .write(65536, pattern(6, 4096), WriteFlags::default())
        .await
        .unwrap();
    let new = component(9, ComponentRole::Data, "h4", SIZE);
    coord
        .replace_component(ComponentId(2), new, 0)
        .await
        .unwrap();
    let report = coord
        .resync(ComponentId(9), &ResyncProgress::default())
        .await
        .unwrap();
    assert_eq!(
        report.copied_bytes,
        65536 + 4096,
        "only allocated data moves"
    );
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(9))
    );
    assert!(coord.layout().component(ComponentId(2)).is_none());
}

#[tokio::test]
async fn concurrent_overlapping_writes_leave_identical_copies() {
    let (comps, _rec, coord) = setup(ftt1_layout()).await;
    let mut tasks = Vec::new();
    for i in 0..32u8 {
        let coord = coord.clone();
        tasks.push(tokio::spawn(async move {
            let off = (i as u64 % 4) * 1000;
            coord
                .write(off, pattern(i, 6000), WriteFlags::default())
                .await
                .unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );
}

#[tokio::test]
async fn striped_layout_round_trips() {
    let mut layout = ftt1_layout();
    let col = SIZE / 2;
    layout.columns = vec![
        Mirror {
            copies: vec![
                component(1, ComponentRole::Data, "h1", col),
                component(2, ComponentRole::Data, "h2", col),
            ],
        },
        Mirror {
            copies: vec![
                component(4, ComponentRole::Data, "h2", col),
                component(5, ComponentRole::Data, "h1", col),
            ],
        },
    ];
    let (_comps, _rec, coord) = setup(layout).await;
    let data = pattern(3, 3 << 20);
    coord
        .write(512 * 1024, data.clone(), WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(coord.read(512 * 1024, 3 << 20).await.unwrap(), data);
}

#[tokio::test]
async fn a_bad_block_met_under_a_range_lock_does_not_deadlock() {
    let (comps, _rec, coord) = setup(ftt1_layout()).await;
    coord
        .write(0, pattern(5, 8192), WriteFlags::default())
        .await
        .unwrap();
    comps
        .replicas
        .lock()
        .get_mut(&ComponentId(1))
        .unwrap()
        .corrupt
        .insert(0);
    comps
        .replicas
        .lock()
        .get_mut(&ComponentId(2))
        .unwrap()
        .corrupt
        .remove(&0);
    // A partial write reads the bad block (read-modify-write) with the range
    // locked; COMPARE AND WRITE compares it with the range locked.
    for _ in 0..2 {
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            coord.write(100, pattern(7, 10), WriteFlags::default()),
        )
        .await
        .expect("no deadlock")
        .unwrap();
    }
    comps
        .replicas
        .lock()
        .get_mut(&ComponentId(2))
        .unwrap()
        .corrupt
        .insert(1);
    let current = coord.read(4096, 512).await.unwrap();
    comps
        .replicas
        .lock()
        .get_mut(&ComponentId(1))
        .unwrap()
        .corrupt
        .insert(1);
    comps
        .replicas
        .lock()
        .get_mut(&ComponentId(2))
        .unwrap()
        .corrupt
        .remove(&1);
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        coord.compare_and_write(4096, current, pattern(8, 512)),
    )
    .await
    .expect("no deadlock")
    .unwrap();
    assert_eq!(coord.read(4096, 512).await.unwrap(), pattern(8, 512));
}

/// An FTT=1 volume `name` with data copies `(id, host, disk group)` and a
/// witness `(id, host)`.
fn mirrored(name: &str, copies: [(u64, &str, &str); 2], witness: (u64, &str)) -> Layout {
    let data = |(id, host, dg): (u64, &str, &str)| ComponentPlacement {
        disk_group: DiskGroupId(dg.into()),
        ..component(id, ComponentRole::Data, host, SIZE)
    };
    Layout {
        volume: VolumeId(name.into()),
        size_bytes: SIZE,
        stripe_unit_bytes: STRIPE_UNIT_BYTES,
        columns: vec![Mirror {
            copies: copies.map(data).to_vec(),
        }],
        witnesses: vec![component(witness.0, ComponentRole::Witness, witness.1, 0)],
        generation: 1,
    }
}

fn written(comps: &Components, id: u64) -> u64 {
    comps
        .written_blocks
        .lock()
        .get(&ComponentId(id))
        .copied()
        .unwrap_or(0)
}

fn shared(comps: &Components, id: u64) -> u64 {
    comps
        .shared_blocks
        .lock()
        .get(&ComponentId(id))
        .copied()
        .unwrap_or(0)
}

const MIB: u64 = 1 << 20;

#[tokio::test]
async fn a_copy_inside_a_volume_shares_blocks_moves_no_data_and_keeps_them_apart() {
    let (comps, _rec, coord) = setup(ftt1_layout()).await;
    let data = pattern(1, (20 * MIB) as usize);
    coord
        .write(0, data.clone(), WriteFlags::default())
        .await
        .unwrap();
    // A hole in the source, over data the target held before: the copy
    // makes the target a hole too.
    coord.unmap(8 * MIB, MIB).await.unwrap();
    coord
        .write(40 * MIB, pattern(2, MIB as usize), WriteFlags::default())
        .await
        .unwrap();
    let written_before = (written(&comps, 1), written(&comps, 2));

    let report = coord
        .copy_shared(&coord, 0, 32 * MIB, 20 * MIB)
        .await
        .unwrap();
    assert_eq!(
        report,
        CopyReport {
            shared_bytes: 20 * MIB,
            copied_bytes: 0
        }
    );
    assert_eq!(
        (written(&comps, 1), written(&comps, 2)),
        written_before,
        "no data was written"
    );
    let blocks = 20 * MIB / BLOCK_BYTES;
    assert_eq!((shared(&comps, 1), shared(&comps, 2)), (blocks, blocks));
    // Each copy got the range in clones of at most the limit, concurrently.
    assert_eq!(
        comps.clone_calls.lock().len() as u64,
        2 * blocks.div_ceil(CLONE_BLOCKS_MAX)
    );
    assert!(comps
        .clone_calls
        .lock()
        .iter()
        .all(|c| c.source.id == c.target.id && c.epoch == Epoch(1)));
    assert_eq!(
        coord.counters().shared_copy_bytes.load(Ordering::Relaxed),
        20 * MIB
    );

    let mut expect = data.to_vec();
    expect[(8 * MIB) as usize..(9 * MIB) as usize].fill(0);
    assert_eq!(coord.read(32 * MIB, 20 * MIB).await.unwrap(), expect);
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );
    let map = coord.block_status(40 * MIB, MIB).await.unwrap();
    assert_eq!(map[0].kind, ExtentKind::Hole);

    // Copy on write: new data on either side leaves the other as it was.
    coord
        .write(0, pattern(9, (4 * MIB) as usize), WriteFlags::default())
        .await
        .unwrap();
    coord
        .write(48 * MIB, pattern(7, MIB as usize), WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(
        coord.read(32 * MIB, 4 * MIB).await.unwrap(),
        data.slice(..(4 * MIB) as usize)
    );
    assert_eq!(
        coord.read(16 * MIB, MIB).await.unwrap(),
        data.slice((16 * MIB) as usize..(17 * MIB) as usize)
    );
}

#[tokio::test]
async fn unaligned_edges_are_copied_as_data_and_only_the_middle_is_shared() {
    let (comps, _rec, coord) = setup(ftt1_layout()).await;
    let data = pattern(3, (2 * MIB) as usize);
    coord
        .write(0, data.clone(), WriteFlags::default())
        .await
        .unwrap();
    // Both offsets 1000 bytes into a block: 3096 bytes of head, whole
    // blocks, then what is left of the last block.
    let len = MIB + 5000;
    let report = coord
        .copy_shared(&coord, 1000, 8 * MIB + 1000, len)
        .await
        .unwrap();
    let middle = (len - 3096) / BLOCK_BYTES * BLOCK_BYTES;
    assert_eq!(report.shared_bytes, middle);
    assert_eq!(report.copied_bytes, len - middle);
    assert_eq!(
        coord.read(8 * MIB + 1000, len).await.unwrap(),
        data.slice(1000..(1000 + len) as usize)
    );
    // Offsets that never line up with blocks on both sides: all data.
    let calls = comps.clone_calls.lock().len();
    let report = coord
        .copy_shared(&coord, 0, 16 * MIB + 512, MIB)
        .await
        .unwrap();
    assert_eq!(report.shared_bytes, 0);
    assert_eq!(comps.clone_calls.lock().len(), calls);
    assert_eq!(
        coord.read(16 * MIB + 512, MIB).await.unwrap(),
        data.slice(..MIB as usize)
    );
    // Overlapping ranges of one volume are never shared.
    let report = coord.copy_shared(&coord, 0, 4096, 8192).await.unwrap();
    assert_eq!(report.shared_bytes, 0);
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );
}

#[tokio::test]
async fn a_copy_counts_as_a_write_for_absent_copies_and_resync_catches_them_up() {
    let (comps, rec, coord) = setup(ftt1_layout()).await;
    let data = pattern(4, (4 * MIB) as usize);
    coord
        .write(0, data.clone(), WriteFlags::default())
        .await
        .unwrap();
    // The host of one copy goes away without anyone noticing yet.
    comps.down.lock().insert(HostId("h2".into()));
    let report = coord
        .copy_shared(&coord, 0, 32 * MIB, 2 * MIB)
        .await
        .unwrap();
    assert_eq!(report.shared_bytes, 2 * MIB);
    let layout = coord.layout();
    assert_eq!(layout.columns[0].copies[1].state, ComponentState::Absent);
    assert!(
        rec.0
            .lock()
            .iter()
            .any(|l| l.columns[0].copies[1].state == ComponentState::Absent),
        "recorded before the copy was acknowledged"
    );
    assert_eq!(coord.dirty_bytes(), vec![(ComponentId(2), 2 * MIB)]);
    // Now known absent: the next copy skips it and leaves its range dirty.
    let report = coord
        .copy_shared(&coord, 2 * MIB, 40 * MIB, 2 * MIB)
        .await
        .unwrap();
    assert_eq!(report.shared_bytes, 2 * MIB);
    assert_eq!(coord.dirty_bytes(), vec![(ComponentId(2), 4 * MIB)]);
    assert_eq!(
        coord
            .counters()
            .degraded_write_bytes
            .load(Ordering::Relaxed),
        2 * MIB
    );
    comps.down.lock().clear();
    let resync = coord
        .resync(ComponentId(2), &ResyncProgress::default())
        .await
        .unwrap();
    assert_eq!(resync.copied_bytes, 4 * MIB);
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );
    assert_eq!(
        coord.read(40 * MIB, 2 * MIB).await.unwrap(),
        data.slice((2 * MIB) as usize..)
    );
}

#[tokio::test]
async fn copies_between_volumes_share_only_where_every_copy_has_a_source_beside_it() {
    let comps = Arc::new(Components::default());
    let rec = Arc::new(Recorded::default());
    let open = |layout: Layout| {
        let (comps, rec) = (comps.clone(), rec.clone());
        async move {
            Coordinator::take_over(layout, Epoch(1), 7, comps, rec)
                .await
                .unwrap()
        }
    };
    let gold = open(mirrored(
        "gold",
        [(1, "h1", "dg0"), (2, "h2", "dg0")],
        (3, "h3"),
    ))
    .await;
    // Same hosts and disk groups, in the other order.
    let alike = open(mirrored(
        "alike",
        [(12, "h2", "dg0"), (11, "h1", "dg0")],
        (13, "h3"),
    ))
    .await;
    // One copy on a host without a copy of the source.
    let elsewhere = open(mirrored(
        "elsewhere",
        [(21, "h1", "dg0"), (22, "h4", "dg0")],
        (23, "h3"),
    ))
    .await;
    // One copy on another disk group of the source's host.
    let other_group = open(mirrored(
        "other-group",
        [(31, "h1", "dg0"), (32, "h2", "dg1")],
        (33, "h3"),
    ))
    .await;
    let data = pattern(5, (6 * MIB) as usize);
    gold.write(0, data.clone(), WriteFlags::default())
        .await
        .unwrap();

    let report = alike.copy_shared(&gold, 0, MIB, 6 * MIB).await.unwrap();
    assert_eq!(report.shared_bytes, 6 * MIB);
    assert!(comps
        .clone_calls
        .lock()
        .iter()
        .all(|c| { c.source_volume.as_str() == "gold" && c.source.host == c.target.host }));
    assert_eq!(
        (written(&comps, 11), written(&comps, 12)),
        (0, 0),
        "no data was written"
    );
    for target in [&elsewhere, &other_group] {
        let calls = comps.clone_calls.lock().len();
        let report = target.copy_shared(&gold, 0, MIB, 6 * MIB).await.unwrap();
        assert_eq!(
            report,
            CopyReport {
                shared_bytes: 0,
                copied_bytes: 6 * MIB
            }
        );
        assert_eq!(comps.clone_calls.lock().len(), calls, "nothing half shared");
    }
    for target in [&alike, &elsewhere, &other_group] {
        assert_eq!(target.read(MIB, 6 * MIB).await.unwrap(), data);
        let layout = target.layout();
        let ids: Vec<ComponentId> = layout.columns[0].copies.iter().map(|c| c.id).collect();
        assert_eq!(comps.contents(ids[0]), comps.contents(ids[1]));
        assert!(layout
            .components()
            .all(|c| c.state == ComponentState::Active));
    }
}

#[tokio::test]
async fn a_host_that_cannot_share_gets_the_data_and_stays_active() {
    let (comps, _rec, coord) = setup(ftt1_layout()).await;
    let data = pattern(6, (3 * MIB) as usize);
    coord
        .write(0, data.clone(), WriteFlags::default())
        .await
        .unwrap();
    comps.cannot_share.lock().insert(HostId("h2".into()));
    let report = coord
        .copy_shared(&coord, 0, 16 * MIB, 3 * MIB)
        .await
        .unwrap();
    assert_eq!(
        report,
        CopyReport {
            shared_bytes: 0,
            copied_bytes: 3 * MIB
        }
    );
    assert_eq!(coord.read(16 * MIB, 3 * MIB).await.unwrap(), data);
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );
    assert!(coord.dirty_bytes().is_empty());
    assert!(coord
        .layout()
        .components()
        .all(|c| c.state == ComponentState::Active));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_to_the_source_during_a_copy_never_split_the_target_copies() {
    let (comps, _rec, coord) = setup(ftt1_layout()).await;
    coord
        .write(0, pattern(1, MIB as usize), WriteFlags::default())
        .await
        .unwrap();
    // One copy's host shares slowly: without the source locked, a write
    // to the source would land between the two copies' clones.
    comps
        .slow_clones
        .lock()
        .insert(HostId("h2".into()), std::time::Duration::from_millis(30));
    for round in 0..5u8 {
        let copier = {
            let coord = coord.clone();
            tokio::spawn(async move { coord.copy_shared(&coord, 0, 32 * MIB, MIB).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        coord
            .write(0, pattern(10 + round, MIB as usize), WriteFlags::default())
            .await
            .unwrap();
        copier.await.unwrap().unwrap();
        assert_eq!(
            comps.contents(ComponentId(1)),
            comps.contents(ComponentId(2)),
            "round {round}: the target copies diverged"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_in_opposite_directions_between_two_volumes_do_not_wait_on_each_other() {
    let comps = Arc::new(Components::default());
    let rec = Arc::new(Recorded::default());
    let a = Coordinator::take_over(
        mirrored("a", [(1, "h1", "dg0"), (2, "h2", "dg0")], (3, "h3")),
        Epoch(1),
        7,
        comps.clone(),
        rec.clone(),
    )
    .await
    .unwrap();
    let b = Coordinator::take_over(
        mirrored("b", [(11, "h1", "dg0"), (12, "h2", "dg0")], (13, "h3")),
        Epoch(1),
        8,
        comps.clone(),
        rec.clone(),
    )
    .await
    .unwrap();
    comps
        .slow_clones
        .lock()
        .insert(HostId("h1".into()), std::time::Duration::from_millis(2));
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let (from, to) = if i % 2 == 0 {
            (a.clone(), b.clone())
        } else {
            (b.clone(), a.clone())
        };
        tasks.push(tokio::spawn(async move {
            to.copy_shared(&from, (i % 4) * MIB, (i % 3) * MIB, 4 * MIB)
                .await
        }));
    }
    for t in tasks {
        tokio::time::timeout(std::time::Duration::from_secs(20), t)
            .await
            .expect("no deadlock")
            .unwrap()
            .unwrap();
    }
}

#[tokio::test]
async fn a_superseded_owner_cannot_copy() {
    let layout = ftt1_layout();
    let comps = Arc::new(Components::default());
    let rec = Arc::new(Recorded::default());
    let old = Coordinator::take_over(layout.clone(), Epoch(1), 7, comps.clone(), rec.clone())
        .await
        .unwrap();
    old.write(0, pattern(1, MIB as usize), WriteFlags::default())
        .await
        .unwrap();
    let _new = Coordinator::take_over(layout, Epoch(2), 7, comps.clone(), rec)
        .await
        .unwrap();
    let err = old.copy_shared(&old, 0, 8 * MIB, MIB).await.unwrap_err();
    assert!(matches!(err, BlockError::Unavailable { .. }), "{err}");
    assert!(old.superseded().is_some());
    assert!(comps.contents(ComponentId(1)).keys().all(|&b| b < 256));
}

/// Writes leave write intents in the directory while they are under way
/// and a little after; an owner that dies with a write on one copy and not
/// the other leaves the next owner enough to make the copies agree: it
/// takes one copy out of reads and resyncs only the regions with intents,
/// or, when that would cost quorum, copies them before it serves.
#[tokio::test]
async fn a_new_owner_makes_the_copies_agree_where_writes_were_under_way() {
    let (comps, rec, first) = setup(ftt1_layout()).await;
    first
        .write(8 << 20, pattern(1, 4096), WriteFlags::default())
        .await
        .unwrap();
    first
        .write(40 << 20, pattern(2, 8192), WriteFlags::default())
        .await
        .unwrap();
    let layout = ftt1_layout();
    let dirty = rec
        .1
        .lock()
        .clone()
        .expect("a record with the write intents");
    assert_eq!(
        dirty.intent(0).unwrap().ranges(),
        vec![(2048, 256), (10240, 256)],
        "the 1 MiB regions written are recorded before the copies get the writes"
    );
    // Intents settle: the first pass keeps regions written since the last
    // one, the second clears them.
    first.settle_intents().await.unwrap();
    assert_eq!(first.intent_blocks(), vec![512]);
    first.settle_intents().await.unwrap();
    assert_eq!(first.intent_blocks(), vec![0]);
    assert!(rec.1.lock().as_ref().unwrap().intents.is_empty());

    // A write reaches copy 1 only and its owner dies.
    first
        .write(8 << 20, pattern(3, 4096), WriteFlags::default())
        .await
        .unwrap();
    let dirty = rec.1.lock().clone().unwrap();
    let c1 = layout.columns[0].copies[0].clone();
    comps
        .write(&c1, Lba(2048), pattern(4, 4096), Epoch(1), IoClass::Guest)
        .await
        .unwrap();
    drop(first);
    assert_ne!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );
    let second = next_owner(layout.clone(), Some(dirty.clone()), Epoch(2), &comps, &rec).await;
    assert_eq!(
        second.dirty_bytes(),
        vec![(ComponentId(2), 1 << 20)],
        "only the region with an intent is behind"
    );
    assert_eq!(
        second.layout().columns[0].copies[1].state,
        ComponentState::Absent
    );
    // Reads come from the copy taken as right, again and again.
    for _ in 0..3 {
        assert_eq!(second.read(8 << 20, 4096).await.unwrap(), pattern(4, 4096));
    }
    second
        .resync(ComponentId(2), &ResyncProgress::default())
        .await
        .unwrap();
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );

    // The same death with the witness's host down: taking copy 2 out of
    // reads would cost quorum, so the new owner copies the region before it
    // serves and both copies stay Active.
    comps
        .write(&c1, Lba(2048), pattern(5, 4096), Epoch(2), IoClass::Guest)
        .await
        .unwrap();
    drop(second);
    comps.down.lock().insert(HostId("h3".into()));
    let (layout, _) = rec.latest();
    let third = next_owner(layout, Some(dirty), Epoch(3), &comps, &rec).await;
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(2))
    );
    let layout = third.layout();
    assert!(layout.columns[0]
        .copies
        .iter()
        .all(|c| c.state == ComponentState::Active));
    assert_eq!(third.dirty_bytes(), vec![(ComponentId(3), 0)]);
    // Until copied, its regions stayed recorded as this owner's intents.
    assert_eq!(third.intent_blocks(), vec![256]);
}

/// A sequential stream of writes marks write intents ahead of itself, so
/// it records one change of intents per 16 regions, not one per region.
#[tokio::test]
async fn sequential_writes_mark_intents_ahead_of_themselves() {
    let (_comps, _rec, coord) = setup(ftt1_layout()).await;
    for i in 0..4u64 {
        coord
            .write(i << 20, pattern(i as u8, 1 << 20), WriteFlags::default())
            .await
            .unwrap();
    }
    // Region 0, then region 1 (after a marked one) with the 16 after it.
    assert_eq!(coord.intent_blocks(), vec![18 * 256]);
    // A write far away marks only its own region.
    coord
        .write(60 << 20, pattern(9, 4096), WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(coord.intent_blocks(), vec![19 * 256]);
}

/// Writes of block `i` with seed `i + round`, `count` of them at once.
async fn write_round(coord: &Arc<Coordinator>, round: u8, count: u64) {
    let writes = (0..count).map(|i| {
        let coord = Arc::clone(coord);
        async move {
            coord
                .write(
                    i * 4096,
                    pattern(round.wrapping_add(i as u8), 4096),
                    WriteFlags::default(),
                )
                .await
        }
    });
    for result in futures::future::join_all(writes).await {
        result.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_is_one_point_in_time_on_every_copy_between_writes_in_flight() {
    let (comps, rec, coord) = setup(ftt1_layout()).await;
    write_round(&coord, 1, 64).await;
    // Writes of round 2 run while the snapshot is taken: each lands wholly
    // before it on both copies, or wholly after.
    let racing = {
        let coord = Arc::clone(&coord);
        tokio::spawn(async move { write_round(&coord, 2, 64).await })
    };
    tokio::task::yield_now().await;
    let layout = coord.snapshot("s1", 77, 1_000).await.unwrap();
    racing.await.unwrap();
    // Round 3 starts after it returned: none of it is in the snapshot.
    write_round(&coord, 3, 64).await;
    let copies: Vec<ComponentId> = layout.columns[0].copies.iter().map(|c| c.id).collect();
    assert_eq!(
        copies,
        [ComponentId(1).snapshot(77), ComponentId(2).snapshot(77)]
    );
    assert!(layout.witnesses.is_empty());
    let (first, second) = (comps.contents(copies[0]), comps.contents(copies[1]));
    assert_eq!(first, second, "the copies' snapshots are one point in time");
    for i in 0..64u64 {
        let block = &first[&i];
        let round1 = pattern(1u8.wrapping_add(i as u8), 4096);
        let round2 = pattern(2u8.wrapping_add(i as u8), 4096);
        assert!(
            block[..] == round1[..] || block[..] == round2[..],
            "block {i} holds neither round 1 nor round 2"
        );
    }
    // The volume holds round 3; the snapshot refuses changes.
    assert_eq!(comps.contents(ComponentId(1))[&5][..], pattern(8, 4096)[..]);
    let snapshot_copy = layout.columns[0].copies[0].clone();
    assert!(comps
        .write(
            &snapshot_copy,
            Lba(0),
            pattern(9, 4096),
            Epoch(1),
            IoClass::Guest
        )
        .await
        .is_err());
    // Recorded under the owner's epoch.
    let recorded = rec.3.lock().clone();
    assert_eq!(recorded.len(), 1);
    assert_eq!(
        (recorded[0].name.as_str(), recorded[0].id, recorded[0].epoch),
        ("s1", 77, Epoch(1))
    );
    assert_eq!(recorded[0].layout, layout);
    // The same name again: refused, and its components are deleted again.
    let err = coord.snapshot("s1", 78, 2_000).await.unwrap_err();
    assert!(err.to_string().contains("not recorded"), "{err}");
    assert!(comps.contents(ComponentId(1).snapshot(78)).is_empty());
}

#[tokio::test]
async fn a_snapshot_taken_while_a_copy_is_away_reaches_it_before_it_takes_writes_again() {
    let (comps, rec, coord) = setup(ftt1_layout()).await;
    let (h2, copy) = (HostId("h2".into()), ComponentId(2));
    for (block, seed) in [(0u64, 1u8), (1, 2), (2, 3)] {
        coord
            .write(block * 4096, pattern(seed, 4096), WriteFlags::default())
            .await
            .unwrap();
    }
    let mut chain = Vec::new();
    let s1 = coord.snapshot("s1", 1, 0).await.unwrap();
    chain.push(tessera_object::SnapshotChainLink { id: 1, layout: s1 });
    comps.down.lock().insert(h2.clone());
    coord.host_absent(&h2).await.unwrap();
    // Away: snapshots go on, on the copy that stays.
    coord
        .write(0, pattern(4, 4096), WriteFlags::default())
        .await
        .unwrap();
    coord.unmap(4096, 4096).await.unwrap();
    let s2 = coord.snapshot("s2", 2, 0).await.unwrap();
    let ids: Vec<ComponentId> = s2.components().map(|c| c.id).collect();
    assert_eq!(ids, [ComponentId(1).snapshot(2)]);
    chain.push(tessera_object::SnapshotChainLink { id: 2, layout: s2 });
    coord
        .write(8192, pattern(5, 4096), WriteFlags::default())
        .await
        .unwrap();
    let s3 = coord.snapshot("s3", 3, 0).await.unwrap();
    chain.push(tessera_object::SnapshotChainLink { id: 3, layout: s3 });
    coord
        .write(0, pattern(6, 4096), WriteFlags::default())
        .await
        .unwrap();
    assert!(comps.contents(copy.snapshot(2)).is_empty());

    // Back: it is given s2 and s3, then catches up.
    comps.down.lock().remove(&h2);
    let held = coord.hold_snapshots().await;
    let progress = ResyncProgress::default();
    coord
        .resync_with_snapshots(copy, &chain, held, &progress)
        .await
        .unwrap();
    for n in [1u64, 2, 3] {
        assert_eq!(
            comps.contents(copy.snapshot(n)),
            comps.contents(ComponentId(1).snapshot(n)),
            "snapshot {n}"
        );
    }
    assert_eq!(comps.contents(copy), comps.contents(ComponentId(1)));
    assert_eq!(
        coord.layout().component(copy).unwrap().state,
        ComponentState::Active
    );
    // The records of s2 and s3 name it now; s1's is as it was.
    for s in rec.3.lock().iter() {
        let ids: Vec<ComponentId> = s.layout.components().map(|c| c.id).collect();
        assert_eq!(
            ids,
            [ComponentId(1).snapshot(s.id), copy.snapshot(s.id)],
            "{}",
            s.name
        );
    }
    // Snapshots are taken on both copies again.
    let s4 = coord.snapshot("s4", 4, 0).await.unwrap();
    assert_eq!(s4.components().count(), 2);
}

#[tokio::test]
async fn a_snapshot_is_refused_while_a_copy_catches_up_and_leaves_nothing() {
    let (comps, rec, coord) = setup(ftt1_layout()).await;
    coord
        .write(0, pattern(1, 4096), WriteFlags::default())
        .await
        .unwrap();
    // A new copy receives writes but misses what came before.
    coord
        .add_copy(
            ComponentId(2),
            component(9, ComponentRole::Data, "h4", SIZE),
            0,
        )
        .await
        .unwrap();
    let err = coord.snapshot("s", 5, 0).await.unwrap_err();
    assert!(err.to_string().contains("Resyncing"), "{err}");
    assert!(rec.3.lock().is_empty());
    for c in [1, 2, 9] {
        assert!(comps.contents(ComponentId(c).snapshot(5)).is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_keeps_every_write_out_until_released_or_expired() {
    let (comps, _rec, coord) = setup(ftt1_layout()).await;
    coord
        .write(0, pattern(1, 4096), WriteFlags::default())
        .await
        .unwrap();
    coord
        .hold_writes(9, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    let write = |seed: u8| {
        let coord = Arc::clone(&coord);
        tokio::spawn(async move {
            coord
                .write(0, pattern(seed, 4096), WriteFlags::default())
                .await
        })
    };
    let held = write(2);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!held.is_finished(), "a write went on under the hold");
    // A snapshot under the hold holds what was written before it.
    coord.snapshot_held(9, "g", 5, 0).await.unwrap();
    let snapshot = ComponentId(1).snapshot(5);
    assert_eq!(comps.contents(snapshot)[&0][..], pattern(1, 4096)[..]);
    assert!(coord.release_writes(9));
    assert!(!coord.release_writes(9), "released once");
    held.await.unwrap().unwrap();
    assert_eq!(comps.contents(ComponentId(1))[&0][..], pattern(2, 4096)[..]);
    // A hold nobody releases ends by itself, and no snapshot is taken
    // under it any more.
    coord
        .hold_writes(10, std::time::Duration::from_millis(300))
        .await
        .unwrap();
    let late = write(3);
    tokio::time::timeout(std::time::Duration::from_secs(10), late)
        .await
        .expect("the hold expired")
        .unwrap()
        .unwrap();
    let err = coord.snapshot_held(10, "h", 6, 0).await.unwrap_err();
    assert!(err.to_string().contains("no longer held"), "{err}");
}

#[tokio::test]
async fn a_rebuilt_copy_is_given_every_snapshot_before_it_joins() {
    let (comps, rec, coord) = setup(ftt1_layout()).await;
    let mut chain = Vec::new();
    for (n, seed) in [(1u64, 10u8), (2, 20)] {
        coord
            .write(n * 8192, pattern(seed, 8192), WriteFlags::default())
            .await
            .unwrap();
        let layout = coord.snapshot(&format!("s{n}"), n, 0).await.unwrap();
        chain.push(tessera_object::SnapshotChainLink { id: n, layout });
    }
    coord
        .write(0, pattern(30, 4096), WriteFlags::default())
        .await
        .unwrap();
    comps.down.lock().insert(HostId("h2".into()));
    let new = component(9, ComponentRole::Data, "h4", SIZE);
    let carried = coord
        .add_copy_with_snapshots(
            tessera_object::NewCopyPlace::Replacing(ComponentId(2)),
            new,
            0,
            &chain,
            &ResyncProgress::default(),
        )
        .await
        .unwrap();
    assert_eq!(carried.source, ComponentId(1));
    assert_eq!(carried.made.len(), 2);
    // Each snapshot of the new copy holds what the survivor's holds.
    for n in [1u64, 2] {
        assert_eq!(
            comps.contents(ComponentId(9).snapshot(n)),
            comps.contents(ComponentId(1).snapshot(n)),
            "snapshot {n}"
        );
    }
    // It joined as Resyncing with only the write after the last snapshot
    // left to copy; the snapshots' records name it.
    assert_eq!(carried.dirty_blocks, 1);
    let joined = coord.layout().component(ComponentId(9)).cloned().unwrap();
    assert_eq!(joined.state, ComponentState::Resyncing);
    let report = coord
        .resync(ComponentId(9), &ResyncProgress::default())
        .await
        .unwrap();
    assert_eq!(report.copied_bytes, 4096);
    assert_eq!(
        comps.contents(ComponentId(1)),
        comps.contents(ComponentId(9))
    );
    for s in rec.3.lock().iter() {
        let ids: Vec<ComponentId> = s.layout.components().map(|c| c.id).collect();
        assert_eq!(
            ids,
            [ComponentId(1).snapshot(s.id), ComponentId(9).snapshot(s.id)]
        );
    }
}

#[tokio::test]
async fn no_snapshot_is_taken_while_a_new_copy_is_given_the_snapshots() {
    let (_comps, rec, coord) = setup(ftt1_layout()).await;
    let held = coord.hold_snapshots().await;
    let err = coord.snapshot("s", 3, 0).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("take the snapshot once it has them"),
        "{err}"
    );
    assert!(rec.3.lock().is_empty());
    drop(held);
    coord.snapshot("s", 3, 0).await.unwrap();
    assert_eq!(rec.3.lock().len(), 1);
}
