//! Scenario tests of the coordinator over in-memory components whose hosts
//! can be cut off and whose blocks can be corrupted, the way a real host's
//! store reports it (checksum errors, stale epochs, unreachable hosts).

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use tessera_blockdev::{BlockDevice, BlockError, ExtentKind, WriteFlags, ZeroMode};
use tessera_object::{
    ComponentError, ComponentIo, ComponentStatus, Coordinator, IoClass, LayoutRecorder,
    ResyncProgress,
};
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
}

/// Components held in memory, keyed by component id.
#[derive(Default)]
struct Components {
    replicas: Mutex<HashMap<ComponentId, Replica>>,
    down: Mutex<HashSet<HostId>>,
    written_blocks: Mutex<HashMap<ComponentId, u64>>,
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
        self.check(c)?;
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
        self.check(c)
    }
    async fn delete(&self, c: &ComponentPlacement) -> Result<(), ComponentError> {
        self.replicas.lock().remove(&c.id);
        Ok(())
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

#[derive(Default)]
struct Recorded(Mutex<Vec<Layout>>);

#[async_trait]
impl LayoutRecorder for Recorded {
    async fn record(&self, layout: &Layout) -> Result<(), String> {
        self.0.lock().push(layout.clone());
        Ok(())
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
    Layout {
        volume: VolumeId("vol".into()),
        size_bytes: SIZE,
        stripe_unit_bytes: STRIPE_UNIT_BYTES,
        columns: vec![Mirror {
            copies: vec![
                component(1, ComponentRole::Data, "h1", SIZE),
                component(2, ComponentRole::Data, "h2", SIZE),
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
