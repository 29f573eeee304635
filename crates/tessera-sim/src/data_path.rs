//! A seeded simulation of one mirrored volume's data path: the real
//! [`Coordinator`] (mirrored writes, degraded writes with dirty-region
//! maps, take-over by a new owner, delta resync) over simulated copies,
//! network and directory, on one thread from one `u64` seed, with a
//! workload of writes and reads checked against an oracle of what was
//! acknowledged.
//!
//! Owns: the simulated copies' hosts and their fault model (snapshots and
//! clones of copies included, made on the copy's host as the store makes
//! them), the in-memory directory the owners record layouts and
//! dirty-region maps in, the workload and its oracle, and the checks.
//!
//! The volume: FTT=1, two data copies on hosts 0 and 1 and a witness on
//! host 2, 8 MiB (eight 1 MiB dirty regions). Its owner is not on any of
//! them (so it always reads from the copy its region is assigned to, and
//! stale data in either copy shows).
//!
//! The fault model:
//! - **Network**: every operation on a copy is a message that waits a
//!   seeded number of scheduler turns on the way there and back; one that
//!   was sent is delivered even if its sender stops waiting for it. Copies
//!   on a host that is down answer nothing (unreachable).
//! - **Hosts** of copies crash (down; a copy that acknowledged writes
//!   before they were durable loses them) and return; never the host of
//!   the last Active data copy (a volume whose every data copy is behind
//!   waits for an administrator to say which holds its data: not
//!   simulated).
//! - **Owners** are replaced between client requests (their requests
//!   under way finish first): a new owner takes over at the next epoch
//!   from what the directory holds (the layout and the dirty-region maps)
//!   while the old one's resyncs go on, as an owner cut off from the
//!   directory does, until their next record is refused. Owners also die
//!   with client requests and resyncs under way: the changes they had sent
//!   arrive (or are refused by a copy fenced meanwhile), the rest never
//!   leave, so the copies may differ where writes were under way, and the
//!   new owner must find out where from the write intents recorded.
//! - **Directory**: records are fenced by the owner's epoch. Owners settle
//!   their write intents from time to time.
//!
//! The workload: a few client operations per step, writes of 1-4 blocks
//! (each block tagged with its write) and reads, never two at once on the
//! same block; now and then a snapshot of the volume, taken while writes
//! are under way and whichever copies are away (the owner's resyncs give
//! a copy that returns the snapshots it missed, as the node's do), and
//! the deletion of one (its record first, then its components; those on a
//! host that is down are deleted when it returns, as reclaim records do).
//!
//! Checked (safety, every read): a block reads as the last acknowledged
//! write to it, or a later write whose outcome is unknown (it failed).
//! Then, with faults off, every host up and every copy resynced
//! (liveness): every component is Active, both copies hold the same tag in
//! every block, and every block reads as the oracle allows; every snapshot
//! recorded has a copy on both hosts, they hold the same tag in every
//! block, and each block holds what the volume could hold when the
//! snapshot was taken (the last write acknowledged by then, one whose
//! outcome was unknown, or one under way).
//!
//! Protections that can be switched off, each of which must make a seed
//! fail (`tests/seeds.rs`): a copy acknowledging a write only once it is
//! durable (write before acknowledge), the owner's dirty-region maps
//! reaching the directory (dirty-region recording), the owner's write
//! intents reaching it (write-intent recording), copies refusing writes
//! of an older epoch (epoch fencing), and a returning copy given the
//! snapshots it missed (snapshot carrying).

use crate::Violation;
use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tessera_blockdev::{BlockDevice, WriteFlags};
use tessera_env::{Rng, SeededRng};
use tessera_object::{
    BlockClone, ComponentError, ComponentIo, ComponentStatus, Coordinator, HostShared, IoClass,
    LayoutRecorder, ResyncProgress, SnapshotChainLink, TakenSnapshot,
};
use tessera_types::dirty::{DirtyRecord, RecordedDirty};
use tessera_types::layout::{ComponentPlacement, ComponentRole, ComponentState, Layout, Mirror};
use tessera_types::{
    ComponentId, DiskGroupId, Epoch, FaultDomainId, HostId, Lba, VolumeId, BLOCK_BYTES,
};

/// Blocks of the volume: 8 MiB, eight 1 MiB dirty regions.
pub const VOLUME_BLOCKS: u64 = 2048;
/// Hosts of the copies: data on 0 and 1, the witness on 2.
const HOSTS: usize = 3;

/// The shape of a run and the protections in force.
#[derive(Clone, Debug)]
pub struct DataPathConfig {
    /// Steps with faults on.
    pub steps: u64,
    /// Per step, the chance (in 1/1000) of a fault.
    pub fault_per_mille: u64,
    /// A copy acknowledges a write only once it is durable.
    pub write_before_ack: bool,
    /// Owners' dirty-region maps reach the directory as they are.
    pub record_dirty_regions: bool,
    /// Owners' write intents reach the directory as they are.
    pub record_write_intents: bool,
    /// Copies refuse writes of an epoch older than the highest they saw.
    pub epoch_fencing: bool,
    /// Per step, the chance (in 1/1000) of a snapshot; one is deleted a
    /// third as often.
    pub snapshot_per_mille: u64,
    /// A copy that returns is given the snapshots taken while it was away
    /// before it receives writes again.
    pub carry_snapshots: bool,
}

impl Default for DataPathConfig {
    fn default() -> DataPathConfig {
        DataPathConfig {
            steps: 200,
            fault_per_mille: 100,
            write_before_ack: true,
            record_dirty_regions: true,
            record_write_intents: true,
            epoch_fencing: true,
            snapshot_per_mille: 40,
            carry_snapshots: true,
        }
    }
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DataPathReport {
    /// Writes acknowledged.
    pub writes_acknowledged: u64,
    /// Writes that failed (their outcome is unknown).
    pub writes_failed: u64,
    /// Blocks read and checked.
    pub blocks_checked: u64,
    /// Host crashes.
    pub crashes: u64,
    /// Owners that took over.
    pub takeovers: u64,
    /// Resyncs that completed.
    pub resyncs: u64,
    /// Snapshots taken.
    pub snapshots: u64,
    /// Of those, taken while a copy was away (on one copy only).
    pub snapshots_while_away: u64,
    /// Snapshots deleted.
    pub snapshots_deleted: u64,
    /// A digest of everything that happened, to show a replay is exact.
    pub digest: u64,
}

/// One simulated copy.
#[derive(Debug, Default)]
struct Copy {
    host: usize,
    epoch: Epoch,
    /// The tag of each written block.
    blocks: BTreeMap<u64, u64>,
    /// Writes acknowledged but not yet durable: each block with what it
    /// held before, oldest first.
    unsynced: Vec<(u64, Option<u64>)>,
    /// A snapshot: refuses every change, as the store's does.
    read_only: bool,
    /// The component a snapshot or clone was made from, so that making it
    /// again is told apart from a clash with another component.
    made_from: Option<ComponentId>,
}

/// How a copy is made from another on its host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Made {
    /// A read-only point in time of a component.
    Snapshot,
    /// A writable copy of a snapshot.
    Clone,
}

/// Everything the hosts of the copies hold, and the run's randomness.
struct Hosts {
    up: [bool; HOSTS],
    copies: BTreeMap<ComponentId, Copy>,
    rng: SeededRng,
    write_before_ack: bool,
    epoch_fencing: bool,
    log: Vec<String>,
}

impl Hosts {
    fn below(&mut self, n: u64) -> u64 {
        self.rng.next_u64() % n.max(1)
    }

    fn note(&mut self, line: String) {
        self.log.push(line);
    }

    fn reach(&self, c: &ComponentPlacement) -> Result<usize, ComponentError> {
        let host = host_index(&c.host);
        if self.up[host] {
            Ok(host)
        } else {
            Err(ComponentError::Unreachable {
                component: c.id,
                host: c.host.clone(),
                detail: "host is down".into(),
            })
        }
    }

    /// Copy `c`, on a host that is up.
    fn copy(&self, c: &ComponentPlacement) -> Result<&Copy, ComponentError> {
        self.reach(c)?;
        self.copies.get(&c.id).ok_or(ComponentError::NotFound {
            component: c.id,
            host: c.host.clone(),
        })
    }

    /// Stores `tags` at `lba` of `c` (0: a hole), as a copy does.
    fn apply(
        &mut self,
        c: &ComponentPlacement,
        lba: u64,
        tags: &[u64],
        epoch: Epoch,
    ) -> Result<(), ComponentError> {
        self.reach(c)?;
        let (fencing, durable) = (self.epoch_fencing, self.write_before_ack);
        let copy = self.copies.get_mut(&c.id).ok_or(ComponentError::NotFound {
            component: c.id,
            host: c.host.clone(),
        })?;
        if fencing && epoch < copy.epoch {
            return Err(ComponentError::StaleEpoch {
                component: c.id,
                epoch,
                highest: copy.epoch,
            });
        }
        if copy.read_only {
            return Err(read_only(c.id));
        }
        copy.epoch = copy.epoch.max(epoch);
        for (i, &tag) in tags.iter().enumerate() {
            let block = lba + i as u64;
            let before = if tag == 0 {
                copy.blocks.remove(&block)
            } else {
                copy.blocks.insert(block, tag)
            };
            if !durable {
                copy.unsynced.push((block, before));
            }
        }
        Ok(())
    }

    /// Makes `made`, on the host of `from`, a snapshot of `from` or a clone
    /// of the snapshot `from`, holding what `from` holds, as the store does:
    /// a snapshot is checked against `from`'s epoch; making the same one
    /// again succeeds; making one over another component is refused.
    fn make(
        &mut self,
        from: &ComponentPlacement,
        made: ComponentId,
        epoch: Epoch,
        how: Made,
    ) -> Result<(), ComponentError> {
        let host = self.reach(from)?;
        let source = self.copies.get(&from.id).ok_or(ComponentError::NotFound {
            component: from.id,
            host: from.host.clone(),
        })?;
        match how {
            Made::Snapshot if source.read_only => return Err(read_only(from.id)),
            Made::Snapshot if self.epoch_fencing && epoch < source.epoch => {
                return Err(ComponentError::StaleEpoch {
                    component: from.id,
                    epoch,
                    highest: source.epoch,
                })
            }
            Made::Clone if !source.read_only => {
                return Err(ComponentError::Io {
                    component: from.id,
                    detail: format!(
                        "component {} is not a snapshot: only a snapshot can be cloned",
                        from.id
                    ),
                })
            }
            _ => {}
        }
        let is_snapshot = how == Made::Snapshot;
        match self.copies.get(&made) {
            Some(existing)
                if existing.made_from == Some(from.id) && existing.read_only == is_snapshot =>
            {
                return Ok(());
            }
            Some(_) => {
                return Err(ComponentError::Io {
                    component: from.id,
                    detail: format!("component {made} already exists"),
                })
            }
            None => {}
        }
        let copy = Copy {
            host,
            // A snapshot keeps its source's epochs; a clone is a new object
            // whose owners count from `epoch`, as in the store.
            epoch: if is_snapshot {
                source.epoch.max(epoch)
            } else {
                epoch
            },
            blocks: source.blocks.clone(),
            unsynced: Vec::new(),
            read_only: is_snapshot,
            made_from: Some(from.id),
        };
        if is_snapshot {
            // The store commits the source's blocks before it takes the
            // snapshot, so a crash loses none of them from either.
            if let Some(source) = self.copies.get_mut(&from.id) {
                source.unsynced.clear();
            }
        }
        self.copies.insert(made, copy);
        Ok(())
    }

    /// Host `h` crashes: writes its copies acknowledged before they were
    /// durable are lost.
    fn crash(&mut self, h: usize) {
        self.up[h] = false;
        for copy in self.copies.values_mut().filter(|c| c.host == h) {
            for (block, before) in copy.unsynced.drain(..).rev() {
                match before {
                    Some(tag) => copy.blocks.insert(block, tag),
                    None => copy.blocks.remove(&block),
                };
            }
        }
    }

    /// What a copy acknowledged becomes durable (its device synced).
    fn sync_all(&mut self) {
        for copy in self.copies.values_mut() {
            copy.unsynced.clear();
        }
    }
}

/// What a change to a snapshot gets: the error the node gives for the
/// store's refusal (answered `Invalid`, which the coordinator sees as an
/// I/O error naming the component).
fn read_only(component: ComponentId) -> ComponentError {
    ComponentError::Io {
        component,
        detail: format!(
            "component {component} is a snapshot: it cannot be written, unmapped or resized"
        ),
    }
}

fn host_index(h: &HostId) -> usize {
    h.as_str()
        .trim_start_matches("host-")
        .parse()
        .expect("a simulated host")
}

/// The tag a 4 KiB block of data carries (its first 8 bytes).
fn tag_of(block: &[u8]) -> u64 {
    u64::from_le_bytes(block[..8].try_into().expect("a whole block"))
}

fn block_of(tag: u64) -> Bytes {
    let mut b = BytesMut::zeroed(BLOCK_BYTES as usize);
    if tag != 0 {
        for chunk in b.chunks_mut(8) {
            chunk.copy_from_slice(&tag.to_le_bytes());
        }
    }
    b.freeze()
}

/// The copies as the coordinator reaches them: through the simulated
/// network.
struct SimComponents {
    hosts: Arc<Mutex<Hosts>>,
}

impl SimComponents {
    /// Waits a seeded number of scheduler turns: a message on its way.
    async fn hop(&self) {
        let turns = self.hosts.lock().below(4);
        for _ in 0..turns {
            tokio::task::yield_now().await;
        }
    }

    /// Sends a change to a copy: delivered even if the caller stops
    /// waiting (a message on the wire arrives anyway).
    async fn send(
        &self,
        c: &ComponentPlacement,
        lba: u64,
        tags: Vec<u64>,
        epoch: Epoch,
    ) -> Result<(), ComponentError> {
        let c = c.clone();
        self.deliver(move |hosts| hosts.apply(&c, lba, &tags, epoch))
            .await
    }

    /// Carries `change` to the hosts and its answer back, each way after a
    /// seeded wait; the change is made even if the caller stops waiting.
    async fn deliver<F>(&self, change: F) -> Result<(), ComponentError>
    where
        F: FnOnce(&mut Hosts) -> Result<(), ComponentError> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let hosts = Arc::clone(&self.hosts);
        tokio::spawn(async move {
            let link = SimComponents { hosts };
            link.hop().await;
            let result = change(&mut link.hosts.lock());
            link.hop().await;
            let _ = tx.send(result);
        });
        rx.await.unwrap_or_else(|_| {
            Err(ComponentError::Io {
                component: ComponentId(0),
                detail: "simulation ended".into(),
            })
        })
    }
}

#[async_trait]
impl ComponentIo for SimComponents {
    async fn write(
        &self,
        component: &ComponentPlacement,
        lba: Lba,
        data: Bytes,
        epoch: Epoch,
        _class: IoClass,
    ) -> Result<(), ComponentError> {
        let tags = data.chunks(BLOCK_BYTES as usize).map(tag_of).collect();
        self.send(component, lba.0, tags, epoch).await
    }

    async fn read(
        &self,
        component: &ComponentPlacement,
        lba: Lba,
        blocks: u32,
        _class: IoClass,
    ) -> Result<Bytes, ComponentError> {
        self.hop().await;
        let data = {
            let hosts = self.hosts.lock();
            let copy = hosts.copy(component)?;
            let mut out = BytesMut::with_capacity(blocks as usize * BLOCK_BYTES as usize);
            for b in lba.0..lba.0 + u64::from(blocks) {
                out.extend_from_slice(&block_of(copy.blocks.get(&b).copied().unwrap_or(0)));
            }
            out.freeze()
        };
        self.hop().await;
        Ok(data)
    }

    async fn unmap(
        &self,
        component: &ComponentPlacement,
        lba: Lba,
        blocks: u64,
        epoch: Epoch,
        _class: IoClass,
    ) -> Result<(), ComponentError> {
        self.send(component, lba.0, vec![0; blocks as usize], epoch)
            .await
    }

    async fn allocated(
        &self,
        component: &ComponentPlacement,
        from: Lba,
        blocks: u64,
    ) -> Result<Vec<(Lba, u64)>, ComponentError> {
        self.hop().await;
        let hosts = self.hosts.lock();
        // As the store: a component that is not there is an error, not
        // one that holds nothing.
        let copy = hosts.copy(component)?;
        let mut runs: Vec<(Lba, u64)> = Vec::new();
        for (&b, _) in copy.blocks.range(from.0..from.0 + blocks) {
            match runs.last_mut() {
                Some((start, n)) if start.0 + *n == b => *n += 1,
                _ => runs.push((Lba(b), 1)),
            }
        }
        Ok(runs)
    }

    async fn clone_blocks(&self, clone: &BlockClone) -> Result<(), ComponentError> {
        Err(ComponentError::NotShared {
            component: clone.target.id,
            host: clone.target.host.clone(),
            detail: "the simulated copies share nothing".into(),
        })
    }

    async fn fence(
        &self,
        component: &ComponentPlacement,
        epoch: Epoch,
    ) -> Result<(), ComponentError> {
        self.hop().await;
        let mut hosts = self.hosts.lock();
        hosts.reach(component)?;
        if let Some(copy) = hosts.copies.get_mut(&component.id) {
            copy.epoch = copy.epoch.max(epoch);
        }
        Ok(())
    }

    async fn create(
        &self,
        component: &ComponentPlacement,
        _reserve_bytes: u64,
    ) -> Result<(), ComponentError> {
        let mut hosts = self.hosts.lock();
        let host = hosts.reach(component)?;
        hosts.copies.entry(component.id).or_insert(Copy {
            host,
            ..Copy::default()
        });
        Ok(())
    }

    async fn resize(
        &self,
        component: &ComponentPlacement,
        _size_bytes: u64,
    ) -> Result<(), ComponentError> {
        let hosts = self.hosts.lock();
        hosts.reach(component)?;
        match hosts.copies.get(&component.id) {
            Some(copy) if copy.read_only => Err(read_only(component.id)),
            _ => Ok(()),
        }
    }

    async fn delete(&self, component: &ComponentPlacement) -> Result<(), ComponentError> {
        self.hosts.lock().copies.remove(&component.id);
        Ok(())
    }

    async fn snapshot(
        &self,
        component: &ComponentPlacement,
        snapshot: ComponentId,
        epoch: Epoch,
    ) -> Result<(), ComponentError> {
        let c = component.clone();
        self.deliver(move |hosts| hosts.make(&c, snapshot, epoch, Made::Snapshot))
            .await
    }

    async fn clone_snapshot(
        &self,
        snapshot: &ComponentPlacement,
        clone: ComponentId,
        epoch: Epoch,
    ) -> Result<(), ComponentError> {
        let c = snapshot.clone();
        self.deliver(move |hosts| hosts.make(&c, clone, epoch, Made::Clone))
            .await
    }

    async fn status(
        &self,
        component: &ComponentPlacement,
    ) -> Result<ComponentStatus, ComponentError> {
        let hosts = self.hosts.lock();
        hosts.reach(component)?;
        let copy = hosts.copies.get(&component.id);
        let allocated = copy.map_or(0, |c| c.blocks.len() as u64 * BLOCK_BYTES);
        Ok(ComponentStatus {
            epoch: copy.map_or(Epoch(0), |c| c.epoch),
            allocated_bytes: allocated,
            physical_bytes: allocated,
        })
    }
}

/// The directory's records of the volume.
struct Directory {
    owner_epoch: Epoch,
    layout: Layout,
    dirty: Option<DirtyRecord>,
    record_dirty_regions: bool,
    record_write_intents: bool,
    /// Snapshots recorded, by name.
    snapshots: BTreeMap<String, TakenSnapshot>,
}

/// One owner's way to the directory, fenced by its epoch.
struct SimRecorder {
    directory: Arc<Mutex<Directory>>,
    epoch: Epoch,
}

impl SimRecorder {
    fn store_dirty(d: &mut Directory, dirty: &DirtyRecord) {
        let mut dirty = dirty.clone();
        if !d.record_dirty_regions {
            // The protection switched off: a copy that is behind is
            // recorded as having missed nothing.
            for c in &mut dirty.components {
                c.regions = RecordedDirty::empty(c.regions.blocks);
            }
        }
        if !d.record_write_intents {
            // Switched off: no change is ever recorded as under way.
            dirty.intents.clear();
        }
        d.dirty = Some(dirty);
    }
}

#[async_trait]
impl LayoutRecorder for SimRecorder {
    async fn record(&self, layout: &Layout, dirty: &DirtyRecord) -> Result<(), String> {
        tokio::task::yield_now().await;
        let mut d = self.directory.lock();
        if d.owner_epoch != self.epoch {
            return Err(format!("owned at {} now", d.owner_epoch));
        }
        d.layout = layout.clone();
        Self::store_dirty(&mut d, dirty);
        Ok(())
    }

    async fn record_dirty(&self, dirty: &DirtyRecord) -> Result<(), String> {
        tokio::task::yield_now().await;
        let mut d = self.directory.lock();
        if d.owner_epoch != self.epoch {
            return Err(format!("owned at {} now", d.owner_epoch));
        }
        Self::store_dirty(&mut d, dirty);
        Ok(())
    }

    async fn record_snapshot(&self, snapshot: &TakenSnapshot) -> Result<(), String> {
        tokio::task::yield_now().await;
        let mut d = self.directory.lock();
        if d.owner_epoch != self.epoch {
            return Err(format!("owned at {} now", d.owner_epoch));
        }
        if d.snapshots.contains_key(&snapshot.name) {
            return Err(format!("a snapshot named {} exists", snapshot.name));
        }
        d.snapshots.insert(snapshot.name.clone(), snapshot.clone());
        Ok(())
    }

    async fn record_snapshot_copies(
        &self,
        layout: &Layout,
        dirty: &DirtyRecord,
        changes: &[tessera_object::SnapshotCopyChange],
    ) -> Result<Vec<u64>, String> {
        tokio::task::yield_now().await;
        let mut d = self.directory.lock();
        if d.owner_epoch != self.epoch {
            return Err(format!("owned at {} now", d.owner_epoch));
        }
        let gone = tessera_object::SnapshotCopyChange::apply_all(
            changes,
            d.snapshots.values_mut().map(|s| (s.id, &mut s.layout)),
        );
        d.layout = layout.clone();
        Self::store_dirty(&mut d, dirty);
        Ok(gone)
    }
}

/// What each block may read as.
#[derive(Default)]
struct Expected {
    /// The last acknowledged write (0: never written).
    acknowledged: u64,
    /// Later writes whose outcome is unknown.
    unknown: BTreeSet<u64>,
}

/// What each block of a snapshot may hold: the last write acknowledged
/// when it was taken, one whose outcome was unknown, or one under way
/// (blocks not listed: never written).
type SnapshotOracle = BTreeMap<u64, BTreeSet<u64>>;

/// A client operation under way.
struct InFlight {
    write: bool,
    lba: u64,
    blocks: u64,
    tag: u64,
    task: tokio::task::JoinHandle<Result<Option<Bytes>, String>>,
}

struct World {
    seed: u64,
    config: DataPathConfig,
    hosts: Arc<Mutex<Hosts>>,
    directory: Arc<Mutex<Directory>>,
    owner: Arc<Coordinator>,
    expected: BTreeMap<u64, Expected>,
    in_flight: Vec<InFlight>,
    resyncs: Vec<tokio::task::JoinHandle<bool>>,
    /// Resyncs of owners that were replaced, still running.
    zombies: Vec<tokio::task::JoinHandle<bool>>,
    next_tag: u64,
    step: u64,
    report: DataPathReport,
    /// Snapshots taken, by number, with what their blocks may hold.
    snapshots: BTreeMap<u64, SnapshotOracle>,
    next_snapshot: u64,
    /// Components of deleted snapshots left on hosts that were down.
    reclaims: Vec<ComponentPlacement>,
}

fn placement(id: u64, role: ComponentRole, host: usize) -> ComponentPlacement {
    ComponentPlacement {
        id: ComponentId(id),
        role,
        host: HostId(format!("host-{host}")),
        disk_group: DiskGroupId("dg0".into()),
        fault_domain: FaultDomainId(format!("fd-{host}")),
        votes: 1,
        size_bytes: if role == ComponentRole::Data {
            VOLUME_BLOCKS * BLOCK_BYTES
        } else {
            0
        },
        state: ComponentState::Active,
    }
}

impl World {
    fn violation(&self, what: String) -> Violation {
        let log = &self.hosts.lock().log;
        Violation {
            seed: self.seed,
            tick: self.step,
            what,
            trace: log[log.len().saturating_sub(
                std::env::var("SIM_TRACE")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(60),
            )..]
                .to_vec(),
            replay: "tessera_sim::data_path::run_data_path",
        }
    }

    fn note(&self, line: String) {
        self.hosts.lock().note(line);
    }

    fn below(&self, n: u64) -> u64 {
        self.hosts.lock().below(n)
    }

    /// A new owner takes the volume at the next epoch from the directory.
    async fn take_over(&mut self) -> Result<(), Violation> {
        let (layout, dirty, epoch) = {
            let mut d = self.directory.lock();
            d.owner_epoch = Epoch(d.owner_epoch.0 + 1);
            (d.layout.clone(), d.dirty.clone(), d.owner_epoch)
        };
        let io = Arc::new(SimComponents {
            hosts: Arc::clone(&self.hosts),
        });
        let recorder = Arc::new(SimRecorder {
            directory: Arc::clone(&self.directory),
            epoch,
        });
        match Coordinator::take_over_cached(
            layout,
            dirty,
            epoch,
            1,
            io,
            recorder,
            &HostShared::alone(),
        )
        .await
        {
            Ok(c) => {
                self.owner = c;
                self.report.takeovers += 1;
                self.note(format!("owner at {epoch}: {:?}", self.owner.dirty_bytes()));
                Ok(())
            }
            Err(e) => Err(self.violation(format!("take-over at {epoch} failed: {e}"))),
        }
    }

    /// Starts a resync of every copy behind whose host is up (as the
    /// owner's control loop does).
    fn start_resyncs(&mut self) {
        if !self.resyncs.is_empty() {
            return;
        }
        let up = self.hosts.lock().up;
        for c in self.owner.components_behind() {
            if c.role != ComponentRole::Data || !up[host_index(&c.host)] {
                continue;
            }
            let owner = Arc::clone(&self.owner);
            let directory = Arc::clone(&self.directory);
            self.note(format!("resync of {} starts", c.id));
            if !self.config.carry_snapshots {
                self.resyncs.push(tokio::spawn(async move {
                    owner.resync(c.id, &ResyncProgress::default()).await.is_ok()
                }));
                continue;
            }
            self.resyncs.push(tokio::spawn(async move {
                // As the node does: no snapshot is taken from here until
                // the copy receives writes, so the chain read next has
                // every one it missed.
                let held = owner.hold_snapshots().await;
                let chain = snapshot_chain(&directory.lock());
                owner
                    .resync_with_snapshots(c.id, &chain, held, &ResyncProgress::default())
                    .await
                    .is_ok()
            }));
        }
    }

    /// Whether a crash of host `h` leaves an Active data copy on a host
    /// that is up.
    fn other_copy_whole(&self, h: usize) -> bool {
        let up = self.hosts.lock().up;
        self.owner.layout().columns[0].copies.iter().any(|c| {
            let host = host_index(&c.host);
            host != h && up[host] && c.state == ComponentState::Active
        })
    }

    /// Host `h` is back (its lease renewed): its witness votes again and
    /// its copies are resynced, as the owner's control loop has it.
    async fn returned(&mut self, h: usize) {
        let host = HostId(format!("host-{h}"));
        let absent_witness = self
            .owner
            .layout()
            .witnesses
            .iter()
            .any(|w| w.host == host && w.state != ComponentState::Active);
        if absent_witness {
            let _ = self.owner.witness_present(&host).await;
        }
        let io = SimComponents {
            hosts: Arc::clone(&self.hosts),
        };
        let (here, elsewhere): (Vec<_>, Vec<_>) = std::mem::take(&mut self.reclaims)
            .into_iter()
            .partition(|c| c.host == host);
        self.reclaims = elsewhere;
        for c in here {
            if io.delete(&c).await.is_err() {
                self.reclaims.push(c);
            }
        }
        self.start_resyncs();
    }

    /// Takes a snapshot while the client operations under way go on.
    async fn take_snapshot(&mut self) {
        self.next_snapshot += 1;
        let id = self.next_snapshot;
        let mut oracle: SnapshotOracle = self
            .expected
            .iter()
            .map(|(&b, e)| {
                let mut may = e.unknown.clone();
                may.insert(e.acknowledged);
                (b, may)
            })
            .collect();
        for f in self.in_flight.iter().filter(|f| f.write) {
            for b in f.lba..f.lba + f.blocks {
                oracle
                    .entry(b)
                    .or_insert_with(|| BTreeSet::from([0]))
                    .insert(f.tag);
            }
        }
        match self.owner.snapshot(&format!("s{id}"), id, self.step).await {
            Ok(layout) => {
                let copies = layout.components().count();
                self.note(format!("snapshot {id} taken on {copies} copies"));
                self.report.snapshots += 1;
                if copies < 2 {
                    self.report.snapshots_while_away += 1;
                }
                self.snapshots.insert(id, oracle);
            }
            Err(e) => self.note(format!("snapshot {id} not taken: {e}")),
        }
    }

    /// Deletes a snapshot as the control plane does: its record, then its
    /// components (those on a host that is down once it returns).
    async fn delete_snapshot(&mut self) {
        let taken: Vec<u64> = self.snapshots.keys().copied().collect();
        if taken.is_empty() {
            return;
        }
        let id = taken[self.below(taken.len() as u64) as usize];
        let record = {
            let mut d = self.directory.lock();
            let name = d
                .snapshots
                .iter()
                .find(|(_, s)| s.id == id)
                .map(|(n, _)| n.clone());
            name.and_then(|n| d.snapshots.remove(&n))
        };
        self.snapshots.remove(&id);
        let Some(record) = record else { return };
        self.report.snapshots_deleted += 1;
        self.note(format!("snapshot {id} deleted"));
        let io = SimComponents {
            hosts: Arc::clone(&self.hosts),
        };
        for c in record.layout.components() {
            if io.delete(c).await.is_err() || !self.hosts.lock().up[host_index(&c.host)] {
                self.reclaims.push(c.clone());
            }
        }
    }

    async fn fault(&mut self) -> Result<(), Violation> {
        match self.below(6) {
            0 | 1 => {
                let h = self.below(HOSTS as u64) as usize;
                let up = self.hosts.lock().up[h];
                if up && !self.other_copy_whole(h) {
                    self.note(format!("host-{h} stays up: the other copy is behind"));
                } else if up {
                    self.hosts.lock().crash(h);
                    self.report.crashes += 1;
                    self.note(format!("host-{h} crashes"));
                    // Its lease lapses: the owner records its copies absent.
                    let _ = self.owner.host_absent(&HostId(format!("host-{h}"))).await;
                } else {
                    self.hosts.lock().up[h] = true;
                    self.note(format!("host-{h} returns"));
                    self.returned(h).await;
                }
            }
            2 => {
                // The owner is replaced between client requests, without
                // learning it at once: its resyncs go on, as those of an
                // owner cut off from the directory do, until their next
                // record is refused.
                self.settle_clients().await?;
                self.zombies.append(&mut self.resyncs);
                self.note("owner replaced".into());
                self.take_over().await?;
                self.start_resyncs();
            }
            3 => {
                // The owner dies with requests and resyncs under way: what
                // it sent arrives, nothing more leaves it, and its clients
                // see their requests fail.
                for f in &self.in_flight {
                    f.task.abort();
                }
                for r in self.resyncs.drain(..) {
                    r.abort();
                }
                self.note("owner dies".into());
                self.collect(true).await?;
                self.take_over().await?;
                self.start_resyncs();
            }
            4 => {
                if let Err(e) = self.owner.settle_intents().await {
                    self.note(format!("write intents not settled: {e}"));
                }
            }
            _ => {
                self.hosts.lock().sync_all();
            }
        }
        Ok(())
    }

    /// Starts a few client operations on blocks no operation under way
    /// touches.
    fn start_clients(&mut self) {
        for _ in 0..1 + self.below(3) {
            let blocks = 1 + self.below(4);
            let lba = self.below(VOLUME_BLOCKS - blocks);
            let busy = self
                .in_flight
                .iter()
                .any(|f| f.lba < lba + blocks && lba < f.lba + f.blocks);
            if busy {
                continue;
            }
            let owner = Arc::clone(&self.owner);
            let offset = lba * BLOCK_BYTES;
            if self.below(3) < 2 {
                self.next_tag += 1;
                let tag = self.next_tag;
                let mut data = BytesMut::new();
                for _ in 0..blocks {
                    data.extend_from_slice(&block_of(tag));
                }
                let data = data.freeze();
                self.note(format!("write {tag} at {lba}+{blocks}"));
                let task = tokio::spawn(async move {
                    owner
                        .write(offset, data, WriteFlags::default())
                        .await
                        .map(|_| None)
                        .map_err(|e| e.to_string())
                });
                self.in_flight.push(InFlight {
                    write: true,
                    lba,
                    blocks,
                    tag,
                    task,
                });
            } else {
                let task = tokio::spawn(async move {
                    owner
                        .read(offset, blocks * BLOCK_BYTES)
                        .await
                        .map(Some)
                        .map_err(|e| e.to_string())
                });
                self.in_flight.push(InFlight {
                    write: false,
                    lba,
                    blocks,
                    tag: 0,
                    task,
                });
            }
        }
    }

    /// Checks a read's blocks against the oracle.
    fn check_read(&mut self, lba: u64, data: &[u8], what: &str) -> Result<(), Violation> {
        for (i, block) in data.chunks(BLOCK_BYTES as usize).enumerate() {
            let b = lba + i as u64;
            let tag = tag_of(block);
            let e = self.expected.entry(b).or_default();
            self.report.blocks_checked += 1;
            if tag != e.acknowledged && !e.unknown.contains(&tag) {
                let (ack, unknown) = (e.acknowledged, e.unknown.clone());
                return Err(self.violation(format!(
                    "{what}: block {b} reads as write {tag}, but the last acknowledged write to it is {ack} (unknown outcome: {unknown:?})"
                )));
            }
        }
        Ok(())
    }

    /// Takes in the client operations that ended.
    async fn collect(&mut self, all: bool) -> Result<(), Violation> {
        let mut i = 0;
        while i < self.in_flight.len() {
            if !all && !self.in_flight[i].task.is_finished() {
                i += 1;
                continue;
            }
            let f = self.in_flight.swap_remove(i);
            let result = f.task.await.unwrap_or_else(|e| {
                Err(if e.is_cancelled() {
                    "its owner died".to_string()
                } else {
                    format!("task ended: {e}")
                })
            });
            match (f.write, result) {
                (true, Ok(_)) => {
                    self.report.writes_acknowledged += 1;
                    self.note(format!("write {} acknowledged", f.tag));
                    for b in f.lba..f.lba + f.blocks {
                        let e = self.expected.entry(b).or_default();
                        e.acknowledged = f.tag;
                        e.unknown.clear();
                    }
                }
                (true, Err(why)) => {
                    self.report.writes_failed += 1;
                    self.note(format!("write {} failed: {why}", f.tag));
                    for b in f.lba..f.lba + f.blocks {
                        self.expected.entry(b).or_default().unknown.insert(f.tag);
                    }
                }
                (false, Ok(Some(data))) => self.check_read(f.lba, &data, "a read")?,
                (false, _) => {}
            }
        }
        Ok(())
    }

    /// Lets every client operation under way end.
    async fn settle_clients(&mut self) -> Result<(), Violation> {
        self.collect(true).await
    }

    async fn take_in_resyncs(&mut self, all: bool) {
        let mut i = 0;
        while i < self.resyncs.len() {
            if !all && !self.resyncs[i].is_finished() {
                i += 1;
                continue;
            }
            let r = self.resyncs.swap_remove(i);
            if r.await.unwrap_or(false) {
                self.report.resyncs += 1;
                self.note("resync done".into());
            }
        }
    }

    async fn step(&mut self) -> Result<(), Violation> {
        self.step += 1;
        if self.below(1000) < self.config.fault_per_mille {
            self.fault().await?;
        }
        let chance = self.below(3000);
        if chance < self.config.snapshot_per_mille {
            self.delete_snapshot().await;
        } else if chance < 4 * self.config.snapshot_per_mille {
            self.take_snapshot().await;
        }
        self.start_clients();
        for _ in 0..1 + self.below(12) {
            tokio::task::yield_now().await;
        }
        self.collect(false).await?;
        self.take_in_resyncs(false).await;
        self.check_active_copies_agree()
    }

    /// The copies the owner reads from (Active) hold the same in every
    /// block no client write under way touches: reads of a block do not
    /// depend on the copy they go to, and a snapshot taken now is the same
    /// on both.
    fn check_active_copies_agree(&self) -> Result<(), Violation> {
        let layout = self.owner.layout();
        let active: Vec<ComponentId> = layout.columns[0]
            .copies
            .iter()
            .filter(|c| c.state == ComponentState::Active)
            .map(|c| c.id)
            .collect();
        let [first, second] = active[..] else {
            return Ok(());
        };
        let differs = {
            let h = self.hosts.lock();
            let (Some(a), Some(b)) = (h.copies.get(&first), h.copies.get(&second)) else {
                return Ok(());
            };
            (0..VOLUME_BLOCKS)
                .find(|block| {
                    a.blocks.get(block) != b.blocks.get(block)
                        && !self
                            .in_flight
                            .iter()
                            .any(|f| f.write && f.lba <= *block && *block < f.lba + f.blocks)
                })
                .map(|block| {
                    (
                        block,
                        a.blocks.get(&block).copied(),
                        b.blocks.get(&block).copied(),
                    )
                })
        };
        match differs {
            Some((block, a, b)) => Err(self.violation(format!(
                "copies {first} and {second} are both Active but differ at block {block}: {a:?} and {b:?}"
            ))),
            None => Ok(()),
        }
    }

    /// Faults off: every host up, every copy resynced; then the copies
    /// must agree with each other and with the oracle.
    async fn heal(&mut self) -> Result<(), Violation> {
        self.settle_clients().await?;
        for z in self.zombies.drain(..) {
            let _ = z.await;
        }
        {
            let mut h = self.hosts.lock();
            h.up = [true; HOSTS];
            h.sync_all();
        }
        self.note("every host up".into());
        for h in 0..HOSTS {
            self.returned(h).await;
        }
        for _ in 0..20 {
            self.take_in_resyncs(true).await;
            if self.owner.components_behind().is_empty() {
                break;
            }
            self.start_resyncs();
        }
        self.take_in_resyncs(true).await;
        let layout = self.owner.layout();
        if let Some(c) = layout
            .components()
            .find(|c| c.state != ComponentState::Active)
        {
            return Err(self.violation(format!(
                "after healing, component {} is {:?}",
                c.id, c.state
            )));
        }
        let copies: Vec<ComponentId> = layout.columns[0].copies.iter().map(|c| c.id).collect();
        let blocks: Vec<BTreeMap<u64, u64>> = {
            let h = self.hosts.lock();
            copies
                .iter()
                .map(|id| {
                    h.copies
                        .get(id)
                        .map(|c| c.blocks.clone())
                        .unwrap_or_default()
                })
                .collect()
        };
        if let Some(b) = (0..VOLUME_BLOCKS).find(|b| blocks[0].get(b) != blocks[1].get(b)) {
            return Err(self.violation(format!(
                "after healing, the copies differ at block {b}: {:?} and {:?}",
                blocks[0].get(&b),
                blocks[1].get(&b)
            )));
        }
        let everything = self.owner.read(0, VOLUME_BLOCKS * BLOCK_BYTES).await;
        match everything {
            Ok(data) => self.check_read(0, &data, "the read after healing")?,
            Err(e) => return Err(self.violation(format!("the read after healing failed: {e}"))),
        }
        self.check_snapshots(&copies)
    }

    /// Every snapshot recorded has a copy of `copies` (the volume's), and
    /// they hold the same, as its oracle allows.
    fn check_snapshots(&self, copies: &[ComponentId]) -> Result<(), Violation> {
        let chain = snapshot_chain(&self.directory.lock());
        for link in &chain {
            let mut named: Vec<ComponentId> = link.layout.components().map(|c| c.id).collect();
            named.sort();
            let mut want: Vec<ComponentId> = copies.iter().map(|c| c.snapshot(link.id)).collect();
            want.sort();
            if named != want {
                return Err(self.violation(format!(
                    "after healing, snapshot {} names {named:?}, not a snapshot of each copy ({want:?})",
                    link.id
                )));
            }
            let blocks: Vec<BTreeMap<u64, u64>> = {
                let h = self.hosts.lock();
                match want
                    .iter()
                    .map(|id| h.copies.get(id).map(|c| c.blocks.clone()))
                    .collect::<Option<Vec<_>>>()
                {
                    Some(b) => b,
                    None => {
                        drop(h);
                        return Err(self.violation(format!(
                            "after healing, a component of snapshot {} is missing",
                            link.id
                        )));
                    }
                }
            };
            let oracle = self.snapshots.get(&link.id);
            for b in 0..VOLUME_BLOCKS {
                let (first, second) = (
                    blocks[0].get(&b).copied().unwrap_or(0),
                    blocks[1].get(&b).copied().unwrap_or(0),
                );
                if first != second {
                    return Err(self.violation(format!(
                        "after healing, the copies of snapshot {} differ at block {b}: {first} and {second}",
                        link.id
                    )));
                }
                let allowed = oracle
                    .and_then(|o| o.get(&b))
                    .is_some_and(|may| may.contains(&first))
                    || (first == 0 && oracle.is_some_and(|o| !o.contains_key(&b)));
                if !allowed {
                    return Err(self.violation(format!(
                        "snapshot {} holds write {first} at block {b}, which it may not: {:?}",
                        link.id,
                        oracle.and_then(|o| o.get(&b))
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Runs one simulation of the data path; the same seed and configuration
/// give the same run.
pub fn run_data_path(seed: u64, config: &DataPathConfig) -> Result<DataPathReport, Violation> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime for the simulation");
    let config = config.clone();
    runtime.block_on(async move {
        let hosts = Arc::new(Mutex::new(Hosts {
            up: [true; HOSTS],
            copies: BTreeMap::new(),
            rng: SeededRng::new(seed),
            write_before_ack: config.write_before_ack,
            epoch_fencing: config.epoch_fencing,
            log: Vec::new(),
        }));
        let layout = Layout {
            volume: VolumeId("vol".into()),
            size_bytes: VOLUME_BLOCKS * BLOCK_BYTES,
            stripe_unit_bytes: VOLUME_BLOCKS * BLOCK_BYTES,
            columns: vec![Mirror {
                copies: vec![
                    placement(1, ComponentRole::Data, 0),
                    placement(2, ComponentRole::Data, 1),
                ],
            }],
            witnesses: vec![placement(3, ComponentRole::Witness, 2)],
            generation: 1,
        };
        {
            let mut h = hosts.lock();
            for c in layout.components() {
                h.copies.insert(
                    c.id,
                    Copy {
                        host: host_index(&c.host),
                        ..Copy::default()
                    },
                );
            }
        }
        let directory = Arc::new(Mutex::new(Directory {
            owner_epoch: Epoch(0),
            layout,
            dirty: None,
            record_dirty_regions: config.record_dirty_regions,
            record_write_intents: config.record_write_intents,
            snapshots: BTreeMap::new(),
        }));
        let first = {
            let io = Arc::new(SimComponents {
                hosts: Arc::clone(&hosts),
            });
            let layout = directory.lock().layout.clone();
            directory.lock().owner_epoch = Epoch(1);
            let recorder = Arc::new(SimRecorder {
                directory: Arc::clone(&directory),
                epoch: Epoch(1),
            });
            Coordinator::take_over(layout, Epoch(1), 1, io, recorder)
                .await
                .expect("the first owner")
        };
        let mut world = World {
            seed,
            config: config.clone(),
            hosts,
            directory,
            owner: first,
            expected: BTreeMap::new(),
            in_flight: Vec::new(),
            resyncs: Vec::new(),
            zombies: Vec::new(),
            next_tag: 0,
            step: 0,
            report: DataPathReport::default(),
            snapshots: BTreeMap::new(),
            next_snapshot: 0,
            reclaims: Vec::new(),
        };
        for _ in 0..config.steps {
            world.step().await?;
        }
        world.heal().await?;
        let digest = {
            let h = world.hosts.lock();
            h.log.iter().fold(0xcbf2_9ce4_8422_2325u64, |acc, line| {
                line.bytes()
                    .fold(acc, |a, b| (a ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
            })
        };
        world.report.digest = digest;
        Ok(world.report)
    })
}

/// The snapshots the directory holds, oldest first, as a copy is given
/// them.
fn snapshot_chain(d: &Directory) -> Vec<SnapshotChainLink> {
    let mut chain: Vec<SnapshotChainLink> = d
        .snapshots
        .values()
        .map(|s| SnapshotChainLink {
            id: s.id,
            layout: s.layout.clone(),
        })
        .collect();
    chain.sort_by_key(|l| l.id);
    chain
}

#[cfg(test)]
mod tests {
    //! The simulated copies' snapshots and clones behave as the store's:
    //! a point in time that refuses changes, a writable copy of one, both
    //! idempotent, and subject to the hosts' faults like any operation.

    use super::*;

    fn world(write_before_ack: bool) -> SimComponents {
        let mut copies = BTreeMap::new();
        copies.insert(
            ComponentId(1),
            Copy {
                host: 0,
                ..Copy::default()
            },
        );
        SimComponents {
            hosts: Arc::new(Mutex::new(Hosts {
                up: [true; HOSTS],
                copies,
                rng: SeededRng::new(1),
                write_before_ack,
                epoch_fencing: true,
                log: Vec::new(),
            })),
        }
    }

    fn run<F: std::future::Future<Output = ()>>(f: F) {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(f);
    }

    fn data(tag: u64, blocks: u64) -> Bytes {
        let mut b = BytesMut::new();
        for _ in 0..blocks {
            b.extend_from_slice(&block_of(tag));
        }
        b.freeze()
    }

    async fn tags(io: &SimComponents, c: &ComponentPlacement) -> Vec<u64> {
        let data = io.read(c, Lba(0), 4, IoClass::Guest).await.unwrap();
        data.chunks(BLOCK_BYTES as usize).map(tag_of).collect()
    }

    #[test]
    fn a_snapshot_keeps_its_point_in_time_and_a_clone_changes_alone() {
        run(async {
            let io = world(true);
            let live = placement(1, ComponentRole::Data, 0);
            let snap = placement(2, ComponentRole::Data, 0);
            let clone = placement(3, ComponentRole::Data, 0);
            io.write(&live, Lba(0), data(7, 4), Epoch(1), IoClass::Guest)
                .await
                .unwrap();
            io.snapshot(&live, snap.id, Epoch(1)).await.unwrap();
            io.snapshot(&live, snap.id, Epoch(1)).await.unwrap();
            io.write(&live, Lba(0), data(8, 2), Epoch(1), IoClass::Guest)
                .await
                .unwrap();
            assert_eq!(tags(&io, &live).await, [8, 8, 7, 7]);
            assert_eq!(tags(&io, &snap).await, [7, 7, 7, 7]);

            for refused in [
                io.write(&snap, Lba(0), data(9, 1), Epoch(1), IoClass::Guest)
                    .await,
                io.unmap(&snap, Lba(0), 1, Epoch(1), IoClass::Guest).await,
                io.resize(&snap, 0).await,
            ] {
                assert!(
                    matches!(&refused, Err(ComponentError::Io { component, detail })
                        if *component == snap.id && detail.contains("is a snapshot")),
                    "{refused:?}"
                );
            }
            assert_eq!(tags(&io, &snap).await, [7, 7, 7, 7]);

            io.clone_snapshot(&snap, clone.id, Epoch(2)).await.unwrap();
            io.clone_snapshot(&snap, clone.id, Epoch(2)).await.unwrap();
            io.unmap(&clone, Lba(3), 1, Epoch(2), IoClass::Guest)
                .await
                .unwrap();
            assert_eq!(tags(&io, &clone).await, [7, 7, 7, 0]);
            assert_eq!(tags(&io, &snap).await, [7, 7, 7, 7]);
            assert_eq!(io.status(&clone).await.unwrap().epoch, Epoch(2));
        });
    }

    #[test]
    fn what_the_store_refuses_the_simulation_refuses() {
        run(async {
            let io = world(true);
            let live = placement(1, ComponentRole::Data, 0);
            let snap = placement(2, ComponentRole::Data, 0);
            io.fence(&live, Epoch(5)).await.unwrap();
            let stale = io.snapshot(&live, snap.id, Epoch(4)).await;
            assert!(
                matches!(
                    stale,
                    Err(ComponentError::StaleEpoch {
                        highest: Epoch(5),
                        ..
                    })
                ),
                "{stale:?}"
            );
            // Only a snapshot is cloned; nothing is made over another
            // component.
            let not_a_snapshot = io.clone_snapshot(&live, ComponentId(3), Epoch(5)).await;
            assert!(
                matches!(not_a_snapshot, Err(ComponentError::Io { .. })),
                "{not_a_snapshot:?}"
            );
            io.snapshot(&live, snap.id, Epoch(5)).await.unwrap();
            let onto_snapshot = io.clone_snapshot(&snap, live.id, Epoch(5)).await;
            assert!(
                matches!(onto_snapshot, Err(ComponentError::Io { .. })),
                "{onto_snapshot:?}"
            );
            let of_a_snapshot = io.snapshot(&snap, ComponentId(4), Epoch(5)).await;
            assert!(
                matches!(of_a_snapshot, Err(ComponentError::Io { .. })),
                "{of_a_snapshot:?}"
            );
            let missing = placement(9, ComponentRole::Data, 0);
            let gone = io.snapshot(&missing, ComponentId(10), Epoch(5)).await;
            assert!(
                matches!(gone, Err(ComponentError::NotFound { .. })),
                "{gone:?}"
            );
            assert!(!io.hosts.lock().copies.contains_key(&ComponentId(3)));
            assert!(!io.hosts.lock().copies.contains_key(&ComponentId(4)));
        });
    }

    #[test]
    fn a_snapshot_of_a_host_that_is_down_is_not_taken_and_one_taken_survives_a_crash() {
        run(async {
            // Writes acknowledged before they are durable: a crash loses
            // them from the copy, but not from a snapshot taken since (the
            // store commits a component's blocks before it takes one).
            let io = world(false);
            let live = placement(1, ComponentRole::Data, 0);
            let snap = placement(2, ComponentRole::Data, 0);
            io.write(&live, Lba(0), data(7, 4), Epoch(1), IoClass::Guest)
                .await
                .unwrap();
            io.snapshot(&live, snap.id, Epoch(1)).await.unwrap();
            io.hosts.lock().crash(0);
            let down = io.snapshot(&live, ComponentId(3), Epoch(1)).await;
            assert!(
                matches!(down, Err(ComponentError::Unreachable { .. })),
                "{down:?}"
            );
            let down = io.clone_snapshot(&snap, ComponentId(3), Epoch(1)).await;
            assert!(
                matches!(down, Err(ComponentError::Unreachable { .. })),
                "{down:?}"
            );
            io.hosts.lock().up[0] = true;
            assert_eq!(tags(&io, &live).await, [7, 7, 7, 7]);
            assert_eq!(tags(&io, &snap).await, [7, 7, 7, 7]);
            assert!(!io.hosts.lock().copies.contains_key(&ComponentId(3)));
        });
    }
}
