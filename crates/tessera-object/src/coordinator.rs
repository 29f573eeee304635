//! The object coordinator: one volume's I/O, executed by its owner.
//!
//! Owns: the owner's view of the layout (component states), the epoch it
//! writes with, the dirty-region map of every copy that misses writes, the
//! per-column range locks, its part of the host read cache and which copy
//! each read goes to; copies that share stored blocks instead of moving
//! data live in `share`.
//! Must not touch: the store, the transport or the directory directly; it
//! reaches components through [`ComponentIo`] and records layout changes
//! through [`LayoutRecorder`].
//!
//! Invariants:
//! - a write is acknowledged only when every Active or Resyncing copy of each
//!   column it touches has it durable, and the object still has quorum;
//! - a copy that missed a write is never Active: it is Absent (or Degraded)
//!   with the missed blocks in its dirty map, and that state change is
//!   recorded before the write is acknowledged;
//! - the recorded coarse map of a copy that does not receive a change
//!   covers the change before any copy is sent it, so a later owner that
//!   resyncs by the record (`take_over_cached`) misses nothing, even if this
//!   owner dies mid-write; records reach the directory in the order their
//!   contents were taken;
//! - the recorded write intents of a column cover every region a change is
//!   sent to two or more of its copies in, from before the first copy is
//!   sent it until a settling pass after every copy answered, so a later
//!   owner knows where copies may differ (one copy got a change, another
//!   not, when this owner died) and makes them agree there before it reads
//!   from more than one;
//! - reads come only from Active copies (one on this host if there is one,
//!   else the copy each 1 MiB region of the column is assigned to, so each
//!   copy's host caches a part of the volume of its own), and a block that
//!   fails its checksum is served from another copy and rewritten on the
//!   bad one;
//! - the host read cache holds what the copies hold: every change of blocks
//!   invalidates them once its copies are done with it, before it is
//!   acknowledged, and a read inserts nothing a change completed during the
//!   read may have replaced (see [`crate::ReadCache`]);
//! - once a component reports a newer epoch the coordinator is superseded and
//!   refuses all further I/O.

mod carry;
mod share;
mod snapshot;

pub use carry::{CarriedSnapshots, NewCopyPlace, SnapshotChainLink, SnapshotsHeld};
pub use share::{CopyReport, SHARE_STEP_BYTES};
pub use snapshot::snapshot_layout;

use crate::component_io::{ComponentError, ComponentIo, IoClass, LayoutRecorder};
use crate::dirty::DirtyRegions;
use crate::io_scheduler::{IoClient, IoPermit, IoScheduler};
use crate::range_lock::{RangeGuard, RangeLock};
use crate::read_cache::{ReadCache, VolumeCache};
use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use parking_lot::Mutex;
use std::any::Any;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tessera_blockdev::{
    check_compare_and_write, check_range, first_difference, push_extent, BlockDevice, BlockError,
    DeviceInfo, Extent, ExtentKind, SpaceUsage, WriteFlags, ZeroMode,
};
use tessera_types::dirty::{ColumnIntent, ComponentDirty, DirtyRecord, RecordedDirty};
use tessera_types::layout::{ComponentPlacement, ComponentRole, ComponentState, Layout};
use tessera_types::{ComponentId, Epoch, HostId, Lba, BLOCK_BYTES};

/// Blocks copied per resync step: one range-lock hold, bounded so guest
/// writes to the same range wait at most one step.
pub const RESYNC_STEP_BLOCKS: u64 = 256;

/// Resync steps between two records of how far a resync got: the regions
/// it finished leave the copy's recorded map, so an owner that takes over
/// continues the resync instead of starting it again (64 steps: every
/// 64 MiB of dirty space examined).
pub const RESYNC_STEPS_PER_RECORD: u64 = 64;

/// Regions a sequential stream of changes marks ahead of itself in the
/// write intents (see `State::begin_changes`): at most this much more to
/// resync after an owner dies, against one directory record per region.
const INTENT_AHEAD_REGIONS: u64 = 16;

/// Bytes of zeros written per step when zeroing must keep space allocated.
const ZERO_STEP_BYTES: u64 = 1 << 20;

/// Column blocks per read region: a column's copies (when none is on this
/// host) each serve the reads of every n-th 1 MiB region, so the hosts of
/// the copies cache distinct parts of the volume.
const READ_REGION_BLOCKS: u64 = (1 << 20) / BLOCK_BYTES;

/// Counters a user can read about one volume.
#[derive(Debug, Default)]
pub struct ObjectCounters {
    /// Blocks served from another copy after a checksum failure.
    pub checksum_repairs: AtomicU64,
    /// Bytes copied by resyncs and rebuilds.
    pub resynced_bytes: AtomicU64,
    /// Bytes written by clients while some copy was absent.
    pub degraded_write_bytes: AtomicU64,
    /// Bytes copied into the volume by sharing stored blocks
    /// ([`Coordinator::copy_shared`]): no data moved for them.
    pub shared_copy_bytes: AtomicU64,
    /// Blocks (4 KiB) of reads served from the host read cache.
    pub read_cache_hits: AtomicU64,
    /// Blocks of reads the host read cache did not hold, read from a copy
    /// (not counted while the cache is disabled).
    pub read_cache_misses: AtomicU64,
    /// Clients' operations, bytes, errors and latencies.
    pub io: crate::VolumeIoStats,
}

/// Progress of one resync, readable while it runs: every counter moves
/// after each step, not only at the end.
#[derive(Debug, Default)]
pub struct ResyncProgress {
    /// Bytes of dirty address space examined so far.
    pub done_bytes: AtomicU64,
    /// Bytes still dirty.
    pub left_bytes: AtomicU64,
    /// Bytes of data copied so far (holes in the source are unmapped, not
    /// copied): [`ResyncReport::copied_bytes`] while the resync runs.
    pub copied_bytes: AtomicU64,
}

/// What a finished resync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResyncReport {
    /// The component brought up to date.
    pub component: ComponentId,
    /// Bytes of dirty address space examined.
    pub dirty_bytes: u64,
    /// Bytes of data copied (holes in the source are unmapped, not copied).
    pub copied_bytes: u64,
}

/// Why a resync stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResyncError {
    /// The component is not part of the layout or has no data.
    #[error("volume {volume}: component {component} is not a data component of this layout")]
    UnknownComponent {
        /// The volume.
        volume: String,
        /// The component.
        component: ComponentId,
    },
    /// No up-to-date copy to copy from.
    #[error("volume {volume}: no active copy to resync component {component} from")]
    NoSource {
        /// The volume.
        volume: String,
        /// The component.
        component: ComponentId,
    },
    /// A component failed during the copy.
    #[error("volume {volume}: resync of component {component} failed: {source}")]
    Component {
        /// The volume.
        volume: String,
        /// The component being resynced.
        component: ComponentId,
        /// What failed.
        source: ComponentError,
    },
    /// The coordinator lost ownership or quorum.
    #[error("volume {volume}: {reason}")]
    Unavailable {
        /// The volume.
        volume: String,
        /// Why.
        reason: String,
    },
}

struct State {
    /// Shared with the operations under way, which each take the layout
    /// of their turn (a reference, not a copy); changed copy-on-write.
    layout: Arc<Layout>,
    /// Dirty regions per copy that missed writes, in column blocks.
    dirty: HashMap<ComponentId, DirtyRegions>,
    /// The coarse maps of the data copies that are behind, as the next
    /// record will hold them: each covers its copy's `dirty`.
    recorded: BTreeMap<ComponentId, RecordedDirty>,
    /// The coarse maps the last record that succeeded holds: what a later
    /// owner would read.
    durable: BTreeMap<ComponentId, RecordedDirty>,
    /// Write intents per column, as the next record will hold them: every
    /// region with a change under way or one since the last settling pass
    /// (empty maps for columns with fewer than two data copies).
    intents: Vec<RecordedDirty>,
    /// The write intents the last record that succeeded holds, less those a
    /// settling pass is clearing.
    durable_intents: Vec<RecordedDirty>,
    /// Per (column, region) with an intent: how it is in use.
    intent_use: HashMap<(usize, u64), IntentUse>,
    /// Set once a newer owner exists.
    superseded: Option<String>,
}

/// How one region with a write intent is in use.
#[derive(Debug, Default, Clone, Copy)]
struct IntentUse {
    /// Changes under way in it (one that was abandoned before every copy
    /// answered is never counted off, so its region stays recorded).
    under_way: u32,
    /// Whether a change began in it since the last settling pass.
    recent: bool,
}

/// A change's write intents, held from before it is sent to any copy until
/// every copy answered; [`IntentHold::settled`] counts it off. Dropped
/// without that (the change was abandoned with copies yet to answer), its
/// regions stay recorded, for the next owner to reconcile.
struct IntentHold<'a> {
    coordinator: &'a Coordinator,
    spans: Vec<(usize, u64, u64)>,
    settled: bool,
}

impl IntentHold<'_> {
    fn settled(mut self) {
        self.settled = true;
    }
}

impl Drop for IntentHold<'_> {
    fn drop(&mut self) {
        if self.settled && !self.spans.is_empty() {
            self.coordinator.state.lock().end_changes(&self.spans);
        }
    }
}

impl State {
    /// The layout to change (copied first if an operation under way
    /// holds it).
    fn layout_mut(&mut self) -> &mut Layout {
        Arc::make_mut(&mut self.layout)
    }

    /// Column blocks of data copy `id` (None for a witness or a stranger).
    fn column_blocks(&self, id: ComponentId) -> Option<u64> {
        self.layout
            .component(id)
            .filter(|c| c.role == ComponentRole::Data)
            .map(|c| c.size_bytes / BLOCK_BYTES)
    }

    /// `id` is behind: it keeps its maps, or gets empty ones.
    fn behind(&mut self, id: ComponentId) {
        self.dirty.entry(id).or_default();
        if let Some(blocks) = self.column_blocks(id) {
            self.recorded
                .entry(id)
                .or_insert_with(|| RecordedDirty::empty(blocks));
        }
    }

    /// `id` missed column blocks `[start, start+count)`.
    fn missed(&mut self, id: ComponentId, start: u64, count: u64) {
        self.behind(id);
        if let Some(d) = self.dirty.get_mut(&id) {
            d.insert(start, count);
        }
        if let Some(r) = self.recorded.get_mut(&id) {
            r.mark(start, count);
        }
    }

    /// `id` is behind by what `record` says, or by everything when there
    /// is no record that fits it (what it missed is unknown).
    fn behind_by(&mut self, id: ComponentId, record: Option<&RecordedDirty>) {
        if self.dirty.contains_key(&id) {
            return;
        }
        let Some(blocks) = self.column_blocks(id) else {
            self.dirty.insert(id, DirtyRegions::new());
            return;
        };
        let recorded = record
            .filter(|r| r.fits(blocks))
            .cloned()
            .unwrap_or_else(|| RecordedDirty::whole(blocks));
        let mut exact = DirtyRegions::new();
        for (start, count) in recorded.ranges() {
            exact.insert(start, count);
        }
        self.dirty.insert(id, exact);
        self.recorded.insert(id, recorded);
    }

    /// `id` has everything (or is gone): its maps go.
    fn caught_up(&mut self, id: ComponentId) {
        self.dirty.remove(&id);
        self.recorded.remove(&id);
    }

    /// Whether the directory's maps already cover every `(copy, start,
    /// count)` of `needs`.
    fn durably_covers(&self, needs: &[(ComponentId, u64, u64)]) -> bool {
        needs.iter().all(|&(id, start, count)| {
            self.column_blocks(id).is_none()
                || self
                    .durable
                    .get(&id)
                    .is_some_and(|r| r.covers(start, count))
        })
    }

    fn dirty_record(&self) -> DirtyRecord {
        DirtyRecord {
            volume: self.layout.volume.clone(),
            components: self
                .recorded
                .iter()
                .map(|(&component, regions)| ComponentDirty {
                    component,
                    regions: regions.clone(),
                })
                .collect(),
            intents: self
                .intents
                .iter()
                .enumerate()
                .filter(|(_, r)| !r.is_empty())
                .map(|(column, regions)| ColumnIntent {
                    column: column as u32,
                    regions: regions.clone(),
                })
                .collect(),
        }
    }

    /// `record` reached the directory: it is what a later owner reads.
    fn recorded_as(&mut self, record: DirtyRecord) {
        let mut durable_intents: Vec<RecordedDirty> = self
            .intents
            .iter()
            .map(|r| RecordedDirty::empty(r.blocks))
            .collect();
        for i in &record.intents {
            if let Some(slot) = durable_intents.get_mut(i.column as usize) {
                *slot = i.regions.clone();
            }
        }
        self.durable_intents = durable_intents;
        self.durable = durable_maps(record);
    }

    /// Changes begin in column ranges `spans` `(column, first block,
    /// blocks)`: their regions get intents. A change that enters a region
    /// right after one with an intent (a sequential stream) also marks the
    /// [`INTENT_AHEAD_REGIONS`] regions after it, so a stream costs one
    /// record per that many regions rather than one per region.
    fn begin_changes(&mut self, spans: &[(usize, u64, u64)]) {
        for &(column, start, count) in spans {
            let Some(map) = self.intents.get_mut(column) else {
                continue;
            };
            let regions = regions_of(map, start, count);
            let sequential = regions.start > 0
                && !map.covers(regions.end.saturating_sub(1) * map.region_blocks, 1)
                && map.covers((regions.start - 1) * map.region_blocks, 1);
            map.mark(start, count);
            if sequential {
                let ahead = regions.end * map.region_blocks;
                map.mark(ahead, INTENT_AHEAD_REGIONS * map.region_blocks);
                let last = map.blocks.div_ceil(map.region_blocks);
                for region in regions.end..(regions.end + INTENT_AHEAD_REGIONS).min(last) {
                    self.intent_use.entry((column, region)).or_default().recent = true;
                }
            }
            for region in regions {
                let u = self.intent_use.entry((column, region)).or_default();
                u.under_way += 1;
                u.recent = true;
            }
        }
    }

    /// Changes in `spans` were answered by every copy they were sent to.
    fn end_changes(&mut self, spans: &[(usize, u64, u64)]) {
        for &(column, start, count) in spans {
            let Some(map) = self.intents.get(column) else {
                continue;
            };
            for region in regions_of(map, start, count) {
                if let Some(u) = self.intent_use.get_mut(&(column, region)) {
                    u.under_way = u.under_way.saturating_sub(1);
                }
            }
        }
    }

    /// Gives a column that gained its second data copy a write-intent map
    /// of its size (it had none: one copy cannot differ from another).
    fn fit_intent_maps(&mut self) {
        for (column, fitted) in intent_maps(&self.layout).into_iter().enumerate() {
            if self.intents.get(column).is_some_and(|m| m.blocks == 0) && fitted.blocks > 0 {
                self.intents[column] = fitted.clone();
                self.durable_intents[column] = fitted;
            }
        }
    }

    /// `id` stops receiving writes: changes under way may reach it or not,
    /// so the regions they are in join its maps (a later owner finds them
    /// in its recorded map, in the same record as its new state).
    fn departs(&mut self, id: ComponentId) {
        let Some(column) = self
            .layout
            .columns
            .iter()
            .position(|m| m.copies.iter().any(|c| c.id == id))
        else {
            return;
        };
        let Some(map) = self.intents.get(column) else {
            return;
        };
        let (region_blocks, blocks) = (map.region_blocks, map.blocks);
        let busy: Vec<u64> = self
            .intent_use
            .iter()
            .filter(|((c, _), u)| *c == column && u.under_way > 0)
            .map(|((_, r), _)| *r)
            .collect();
        for r in busy {
            let start = r * region_blocks;
            if start < blocks {
                self.missed(id, start, region_blocks.min(blocks - start));
            }
        }
    }

    /// Whether the directory's write intents cover every span.
    fn intents_durably_cover(&self, spans: &[(usize, u64, u64)]) -> bool {
        spans.iter().all(|&(column, start, count)| {
            self.durable_intents
                .get(column)
                .is_some_and(|r| r.covers(start, count))
        })
    }

    /// Clears the intents of regions with no change under way and none
    /// begun since the last pass, in both the maps to record and the
    /// durable ones (before the record that drops them is written, so no
    /// change counts on it meanwhile). Says whether any went.
    fn settle_intents(&mut self) -> bool {
        let mut cleared = false;
        for (column, map) in self.intents.iter_mut().enumerate() {
            let region_blocks = map.region_blocks;
            let uses = &mut self.intent_use;
            let mut gone = HashSet::new();
            map.clear_where(|first, _| {
                let key = (column, first / region_blocks);
                match uses.get_mut(&key) {
                    Some(u) if u.under_way > 0 || u.recent => {
                        u.recent = false;
                        false
                    }
                    _ => {
                        uses.remove(&key);
                        gone.insert(first);
                        true
                    }
                }
            });
            if let Some(durable) = self.durable_intents.get_mut(column) {
                durable.clear_where(|first, _| gone.contains(&first));
            }
            cleared |= !gone.is_empty();
        }
        cleared
    }

    /// Makes the copies of each column agree where `earlier`'s write
    /// intents say a change may have reached some and not others: the
    /// first Active copy in `reachable` is taken as right, and every other
    /// reachable Active copy is behind by those regions (Absent until a
    /// resync copies them, so no read comes from it), as is every copy
    /// that was Resyncing (`earlier_states`: the layout as recorded).
    /// Where taking a copy out of reads would cost the object its quorum,
    /// the regions are to be copied before the owner serves anything:
    /// those copies are returned, their regions kept as this owner's own
    /// intents (recorded, held) until copied. Says whether a state changed.
    fn reconcile_intents(
        &mut self,
        earlier: &DirtyRecord,
        earlier_states: &HashMap<ComponentId, ComponentState>,
        reachable: &HashSet<ComponentId>,
    ) -> (bool, Vec<InPlaceCopy>) {
        let mut changed = false;
        let mut in_place = Vec::new();
        for (column, mirror) in self.layout.columns.clone().iter().enumerate() {
            let Some(intent) = earlier.intent(column) else {
                continue;
            };
            let data: Vec<&ComponentPlacement> = mirror
                .copies
                .iter()
                .filter(|c| c.role == ComponentRole::Data)
                .collect();
            let Some(blocks) = data.first().map(|c| c.size_bytes / BLOCK_BYTES) else {
                continue;
            };
            // A map that does not fit the column is not trusted: anywhere
            // may differ.
            let intent = if intent.fits(blocks) {
                intent.clone()
            } else {
                RecordedDirty::whole(blocks)
            };
            let source = data
                .iter()
                .find(|c| c.state == ComponentState::Active && reachable.contains(&c.id))
                .copied();
            for c in data.iter().filter(|c| Some(c.id) != source.map(|s| s.id)) {
                // A copy that was Resyncing received changes too, and is
                // behind by the intents (reachable or not). One that was
                // already Absent got the changes under way when it left in
                // its recorded map (`State::departs`); one that was Active
                // and is out of reach is wholly dirty.
                let was = earlier_states.get(&c.id).copied().unwrap_or(c.state);
                if was == ComponentState::Resyncing {
                    for (start, count) in intent.ranges() {
                        self.missed(c.id, start, count);
                    }
                    continue;
                }
                if let (Some(source), ComponentState::Active, true) =
                    (source, c.state, reachable.contains(&c.id))
                {
                    let mut without = Layout::clone(&self.layout);
                    set_state(&mut without, c.id, ComponentState::Absent);
                    if !has_quorum(&without) {
                        let spans: Vec<(usize, u64, u64)> = intent
                            .ranges()
                            .into_iter()
                            .map(|(start, count)| (column, start, count))
                            .collect();
                        self.begin_changes(&spans);
                        in_place.push(InPlaceCopy {
                            source: source.clone(),
                            target: (*c).clone(),
                            spans,
                        });
                        continue;
                    }
                    set_state(self.layout_mut(), c.id, ComponentState::Absent);
                    changed = true;
                    for (start, count) in intent.ranges() {
                        self.missed(c.id, start, count);
                    }
                }
            }
        }
        (changed, in_place)
    }
}

/// Regions a new owner copies from `source` to `target` before it serves:
/// the copies may differ there and `target` cannot leave reads without
/// costing the object its quorum.
struct InPlaceCopy {
    source: ComponentPlacement,
    target: ComponentPlacement,
    spans: Vec<(usize, u64, u64)>,
}

/// The regions of `map` that blocks `[start, start+count)` touch.
fn regions_of(map: &RecordedDirty, start: u64, count: u64) -> std::ops::Range<u64> {
    let first = start / map.region_blocks;
    let end = (start + count.max(1))
        .min(map.blocks)
        .div_ceil(map.region_blocks);
    first..end.max(first)
}

/// Empty write-intent maps for `layout`: one per column, sized to its
/// copies (zero blocks for a column with fewer than two data copies, which
/// never needs them).
fn intent_maps(layout: &Layout) -> Vec<RecordedDirty> {
    layout
        .columns
        .iter()
        .map(|m| {
            let data: Vec<&ComponentPlacement> = m
                .copies
                .iter()
                .filter(|c| c.role == ComponentRole::Data)
                .collect();
            let blocks = if data.len() >= 2 {
                data[0].size_bytes / BLOCK_BYTES
            } else {
                0
            };
            RecordedDirty::empty(blocks)
        })
        .collect()
}

/// One volume's coordinator.
pub struct Coordinator {
    info: DeviceInfo,
    epoch: Epoch,
    io: Arc<dyn ComponentIo>,
    recorder: Arc<dyn LayoutRecorder>,
    state: Mutex<State>,
    /// One lock per column, in column block units.
    columns: Vec<Arc<RangeLock>>,
    /// Held while a record is written, so records reach the directory in
    /// the order their contents were taken.
    record_turn: tokio::sync::Mutex<()>,
    /// Holds of every write to the volume, by name (a consistency group's
    /// snapshot holds each of its volumes while it is taken).
    write_holds: Mutex<HashMap<u64, snapshot::WriteHold>>,
    /// New copies being given the volume's snapshots: no snapshot is taken
    /// meanwhile (the new copy would miss it).
    copies_joining: AtomicU64,
    /// This coordinator's part of the host read cache.
    cache: VolumeCache,
    /// The host's I/O scheduler: guest operations and resync steps wait
    /// their turn there.
    scheduler: Arc<IoScheduler>,
    /// Who this volume's guest operations are to the scheduler.
    client: IoClient,
    allocated_bytes: AtomicU64,
    counters: ObjectCounters,
}

/// What every coordinator of a host shares.
#[derive(Clone)]
pub struct HostShared {
    /// The host's read cache.
    pub read_cache: Arc<ReadCache>,
    /// The host's I/O scheduler.
    pub scheduler: Arc<IoScheduler>,
}

impl HostShared {
    /// No cache and no scheduling: a coordinator with no host around it.
    pub fn alone() -> HostShared {
        HostShared {
            read_cache: ReadCache::disabled(),
            scheduler: IoScheduler::unlimited(),
        }
    }
}

fn bad(reason: impl Into<String>) -> BlockError {
    BlockError::Unavailable {
        reason: reason.into(),
    }
}

impl Coordinator {
    /// Takes over `layout` as its owner at `epoch`: fences every reachable
    /// component so older owners can no longer write, and marks unreachable
    /// ones Absent with everything dirty (what they missed is unknown).
    /// Caches nothing and knows no earlier owner's dirty-region record (see
    /// [`Coordinator::take_over_cached`]).
    pub async fn take_over(
        layout: Layout,
        epoch: Epoch,
        serial: u64,
        io: Arc<dyn ComponentIo>,
        recorder: Arc<dyn LayoutRecorder>,
    ) -> Result<Arc<Coordinator>, BlockError> {
        Self::take_over_cached(
            layout,
            None,
            epoch,
            serial,
            io,
            recorder,
            &HostShared::alone(),
        )
        .await
    }

    /// [`Coordinator::take_over`] with the dirty-region record `dirty` the
    /// earlier owners left (a copy the layout says is behind and that has
    /// an entry there resyncs only the entry's regions), a part of the
    /// host read cache of its own (it starts empty, whatever an earlier
    /// owner cached) and the host's I/O scheduler, both from `host`.
    pub async fn take_over_cached(
        layout: Layout,
        dirty: Option<DirtyRecord>,
        epoch: Epoch,
        serial: u64,
        io: Arc<dyn ComponentIo>,
        recorder: Arc<dyn LayoutRecorder>,
        host: &HostShared,
    ) -> Result<Arc<Coordinator>, BlockError> {
        let info = DeviceInfo {
            name: layout.volume.to_string(),
            size_bytes: layout.size_bytes,
            logical_block_bytes: 512,
            preferred_block_bytes: BLOCK_BYTES as u32,
            read_only: false,
            serial,
        };
        let layout_volume = layout.volume.clone();
        let columns = (0..layout.columns.len())
            .map(|_| Arc::new(RangeLock::default()))
            .collect();
        let coordinator = Arc::new(Coordinator {
            info,
            epoch,
            io,
            recorder,
            state: Mutex::new(State {
                intents: intent_maps(&layout),
                durable_intents: intent_maps(&layout),
                intent_use: HashMap::new(),
                layout: Arc::new(layout),
                dirty: HashMap::new(),
                recorded: BTreeMap::new(),
                durable: BTreeMap::new(),
                superseded: None,
            }),
            columns,
            record_turn: tokio::sync::Mutex::new(()),
            write_holds: Mutex::new(HashMap::new()),
            copies_joining: AtomicU64::new(0),
            cache: host.read_cache.volume(),
            scheduler: Arc::clone(&host.scheduler),
            client: IoClient::Volume(layout_volume),
            allocated_bytes: AtomicU64::new(0),
            counters: ObjectCounters::default(),
        });
        coordinator.fence_all(dirty.as_ref()).await?;
        coordinator.refresh_space().await;
        Ok(coordinator)
    }

    async fn fence_all(&self, earlier: Option<&DirtyRecord>) -> Result<(), BlockError> {
        let components: Vec<ComponentPlacement> = self.layout().components().cloned().collect();
        let results = join_all(
            components
                .iter()
                .map(|c| async move { (c, self.io.fence(c, self.epoch).await) }),
        )
        .await;
        let (changed, in_place) = {
            let mut state = self.state.lock();
            let mut changed = false;
            let reachable: HashSet<ComponentId> = results
                .iter()
                .filter(|(_, r)| r.is_ok())
                .map(|(c, _)| c.id)
                .collect();
            for (c, result) in results {
                let stale = state
                    .layout
                    .component(c.id)
                    .is_some_and(|p| p.state != ComponentState::Active);
                // A copy that was behind already missed at most what the
                // earlier owners recorded for it (with the changes under
                // way when it fell behind; a Resyncing one also the write
                // intents, `reconcile_intents`); one that was Active and is
                // out of reach may have missed writes they never finished,
                // so all of it is dirty.
                let record = earlier.and_then(|e| e.get(c.id)).filter(|_| stale);
                match result {
                    Ok(()) if !stale => {}
                    Ok(()) => state.behind_by(c.id, record),
                    Err(ComponentError::StaleEpoch { highest, .. }) => {
                        state.superseded = Some(format!(
                            "volume {} is owned at {highest}, newer than ours ({})",
                            self.info.name, self.epoch
                        ));
                    }
                    Err(_) => {
                        state.behind_by(c.id, record);
                        if set_state(state.layout_mut(), c.id, ComponentState::Absent) {
                            changed = true;
                        }
                    }
                }
            }
            if let Some(reason) = &state.superseded {
                return Err(bad(reason.clone()));
            }
            let mut in_place = Vec::new();
            if let Some(earlier) = earlier {
                let states: HashMap<ComponentId, ComponentState> =
                    components.iter().map(|c| (c.id, c.state)).collect();
                let (more, copies) = state.reconcile_intents(earlier, &states, &reachable);
                changed |= more;
                in_place = copies;
            }
            (changed, in_place)
        };
        if changed || !in_place.is_empty() {
            self.record().await?;
        }
        for copy in in_place {
            self.copy_in_place(copy).await?;
        }
        Ok(())
    }

    /// Copies the regions of `copy` before this owner serves anything (no
    /// client request can overlap), then lets their intents settle. A
    /// target that fails is behind by what is left (Absent); a source that
    /// fails fails the take-over, the intents still recorded for the next.
    async fn copy_in_place(&self, copy: InPlaceCopy) -> Result<(), BlockError> {
        tracing::info!(volume = %self.info.name, source = %copy.source.id, target = %copy.target.id, regions = copy.spans.len(), "copying the regions the last owner had writes under way in");
        for (i, &(_, start, count)) in copy.spans.iter().enumerate() {
            let mut at = start;
            while at < start + count {
                let n = RESYNC_STEP_BLOCKS.min(start + count - at);
                match self.copy_range(&copy.source, &copy.target, at, n).await {
                    Ok(bytes) => {
                        self.counters
                            .resynced_bytes
                            .fetch_add(bytes, Ordering::Relaxed);
                    }
                    Err((failed, e)) if failed == copy.target.id => {
                        tracing::warn!(volume = %self.info.name, component = %failed, error = %e, "copy failed while its regions were made to agree; it is behind by them");
                        let left: Vec<(u64, u64)> = std::iter::once((at, start + count - at))
                            .chain(copy.spans[i + 1..].iter().map(|&(_, s, c)| (s, c)))
                            .collect();
                        for (s, c) in left {
                            self.mark_missed(&[failed], s, c);
                        }
                        self.state.lock().end_changes(&copy.spans);
                        return self.record().await;
                    }
                    Err((failed, e)) => {
                        return Err(bad(format!(
                            "volume {}: reading copy {failed} to make the copies agree where writes were under way: {e}",
                            self.info.name
                        )));
                    }
                }
                at += n;
            }
        }
        self.state.lock().end_changes(&copy.spans);
        Ok(())
    }

    /// Clears the write intents of regions no change began in since the
    /// last pass and none is under way in, and records the rest. The
    /// owner's host runs a pass every few seconds: an intent costs a
    /// directory record when its region is first changed after a quiet
    /// spell, and a later owner resyncs what is left recorded.
    pub async fn settle_intents(&self) -> Result<(), BlockError> {
        self.record_maps("write intents", |state| {
            state.superseded.is_none() && state.settle_intents()
        })
        .await
    }

    /// Clears the write intents of every region with no change under way
    /// and records the rest: a clean hand-over (its host stopping, its
    /// clients gone), after which the next owner has nothing to reconcile
    /// but what was still under way.
    pub async fn release_intents(&self) -> Result<(), BlockError> {
        {
            let mut state = self.state.lock();
            for u in state.intent_use.values_mut() {
                u.recent = false;
            }
        }
        self.settle_intents().await
    }

    /// Column blocks with write intents now, per column (for tests and
    /// the API).
    pub fn intent_blocks(&self) -> Vec<u64> {
        self.state
            .lock()
            .intents
            .iter()
            .map(|r| r.marked_blocks())
            .collect()
    }

    /// Waits for this volume's turn in the host's I/O scheduler to run a
    /// guest operation moving `bytes`; the turn lasts while the permit is
    /// held. Taken before any range lock, once per client operation.
    pub async fn guest_turn(&self, bytes: u64) -> IoPermit {
        self.scheduler.admit(&self.client, bytes).await
    }

    /// The owner's current layout.
    pub fn layout(&self) -> Layout {
        Layout::clone(&self.state.lock().layout)
    }

    /// The epoch this coordinator writes with.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Counters for the API.
    pub fn counters(&self) -> &ObjectCounters {
        &self.counters
    }

    /// The host clock's monotonic time, for callers that time clients'
    /// operations into [`ObjectCounters::io`].
    pub fn monotonic(&self) -> std::time::Duration {
        self.scheduler.clock().monotonic()
    }

    /// This coordinator's part of the host read cache.
    pub fn read_cache(&self) -> &VolumeCache {
        &self.cache
    }

    /// Drops what the host read cache holds for this coordinator and caches
    /// nothing more: its host stopped coordinating the volume (requests
    /// still under way finish reading from the copies).
    pub fn forget_cached(&self) {
        self.cache.retire();
    }

    /// Dirty bytes per component that is behind.
    pub fn dirty_bytes(&self) -> Vec<(ComponentId, u64)> {
        let state = self.state.lock();
        let mut out: Vec<_> = state
            .dirty
            .iter()
            .map(|(id, d)| (*id, d.blocks() * BLOCK_BYTES))
            .collect();
        out.sort();
        out
    }

    /// Whether another owner has taken over.
    pub fn superseded(&self) -> Option<String> {
        self.state.lock().superseded.clone()
    }

    /// Whether the object has quorum now.
    pub fn accessible(&self) -> bool {
        let state = self.state.lock();
        state.superseded.is_none() && has_quorum(&state.layout)
    }

    /// Marks every component on `host` Absent (the host's liveness lapsed).
    pub async fn host_absent(&self, host: &HostId) -> Result<(), BlockError> {
        let changed = {
            let mut state = self.state.lock();
            let ids: Vec<ComponentId> = state
                .layout
                .components()
                .filter(|c| &c.host == host && c.state != ComponentState::Degraded)
                .map(|c| c.id)
                .collect();
            let mut changed = false;
            for id in ids {
                let receiving = state.layout.component(id).is_some_and(receives_writes);
                changed |= set_state(state.layout_mut(), id, ComponentState::Absent);
                state.behind(id);
                if receiving {
                    state.departs(id);
                }
            }
            changed
        };
        if changed {
            self.record().await?;
        }
        Ok(())
    }

    /// Witness components on `host` count again (its host is back). Data
    /// components come back through [`Coordinator::resync`].
    pub async fn witness_present(&self, host: &HostId) -> Result<(), BlockError> {
        let changed = {
            let mut state = self.state.lock();
            let ids: Vec<ComponentId> = state
                .layout
                .witnesses
                .iter()
                .filter(|c| &c.host == host && c.state == ComponentState::Absent)
                .map(|c| c.id)
                .collect();
            let mut changed = false;
            for id in ids {
                changed |= set_state(state.layout_mut(), id, ComponentState::Active);
                state.caught_up(id);
            }
            changed
        };
        if changed {
            let witness = self
                .layout()
                .witnesses
                .iter()
                .find(|c| &c.host == host)
                .cloned();
            if let Some(w) = witness {
                self.io
                    .fence(&w, self.epoch)
                    .await
                    .map_err(|e| bad(e.to_string()))?;
            }
            self.record().await?;
        }
        Ok(())
    }

    /// Components that are behind (Absent or Resyncing with dirty blocks, or
    /// Degraded), with their hosts.
    pub fn components_behind(&self) -> Vec<ComponentPlacement> {
        let state = self.state.lock();
        state
            .layout
            .components()
            .filter(|c| c.state != ComponentState::Active)
            .cloned()
            .collect()
    }

    /// Replaces lost component `old` with `new` (already chosen by placement):
    /// creates it, adds it as Resyncing with every block dirty, and drops the
    /// old one from the layout. Run [`Coordinator::resync`] on `new` next.
    pub async fn replace_component(
        &self,
        old: ComponentId,
        mut new: ComponentPlacement,
        reserve_bytes: u64,
    ) -> Result<(), BlockError> {
        self.create_fenced(&new, reserve_bytes, "replacement component")
            .await?;
        {
            let mut state = self.state.lock();
            let mut replaced = false;
            for mirror in state.layout_mut().columns.iter_mut() {
                if let Some(slot) = mirror.copies.iter_mut().find(|c| c.id == old) {
                    new.state = ComponentState::Resyncing;
                    new.size_bytes = slot.size_bytes;
                    *slot = new.clone();
                    replaced = true;
                }
            }
            if !replaced {
                if let Some(slot) = state
                    .layout_mut()
                    .witnesses
                    .iter_mut()
                    .find(|c| c.id == old)
                {
                    new.state = ComponentState::Active;
                    *slot = new.clone();
                    replaced = true;
                }
            }
            if !replaced {
                return Err(BlockError::Invalid {
                    reason: format!("component {old} is not part of volume {}", self.info.name),
                });
            }
            state.caught_up(old);
            if new.role == ComponentRole::Data {
                state.behind_by(new.id, None);
            }
        }
        self.record().await
    }

    /// Creates component `new` on its host, reserving `reserve_bytes`, and
    /// fences it at this owner's epoch; `what` names it in errors.
    async fn create_fenced(
        &self,
        new: &ComponentPlacement,
        reserve_bytes: u64,
        what: &str,
    ) -> Result<(), BlockError> {
        self.io
            .create(new, reserve_bytes)
            .await
            .map_err(|e| bad(format!("creating {what}: {e}")))?;
        self.io
            .fence(new, self.epoch)
            .await
            .map_err(|e| bad(format!("fencing {what}: {e}")))
    }

    /// Adds `new` (already chosen by placement) as a further copy of the
    /// column holding data component `beside`: creates it, and adds it as
    /// Resyncing with every block dirty, so it receives every write from
    /// now on. `beside` keeps serving. Run [`Coordinator::resync`] on `new`
    /// next, then [`Coordinator::drop_copy`] on `beside` to move it.
    pub async fn add_copy(
        &self,
        beside: ComponentId,
        mut new: ComponentPlacement,
        reserve_bytes: u64,
    ) -> Result<(), BlockError> {
        let size_bytes = {
            let state = self.state.lock();
            state
                .layout
                .columns
                .iter()
                .flat_map(|m| m.copies.iter())
                .find(|c| c.id == beside)
                .map(|c| c.size_bytes)
        };
        let Some(size_bytes) = size_bytes else {
            return Err(BlockError::Invalid {
                reason: format!(
                    "component {beside} is not a data copy of volume {}",
                    self.info.name
                ),
            });
        };
        new.size_bytes = size_bytes;
        self.create_fenced(&new, reserve_bytes, "a new copy")
            .await?;
        {
            let mut state = self.state.lock();
            let Some(mirror) = state
                .layout_mut()
                .columns
                .iter_mut()
                .find(|m| m.copies.iter().any(|c| c.id == beside))
            else {
                return Err(bad(format!(
                    "component {beside} left volume {} meanwhile",
                    self.info.name
                )));
            };
            new.state = ComponentState::Resyncing;
            new.role = ComponentRole::Data;
            mirror.copies.push(new.clone());
            state.behind_by(new.id, None);
            state.fit_intent_maps();
        }
        self.record().await
    }

    /// Drops data copy `id` from the layout (its blocks stay on its host
    /// until the caller deletes the component). Refused unless another
    /// Active copy of its column stays.
    pub async fn drop_copy(&self, id: ComponentId) -> Result<(), BlockError> {
        {
            let mut state = self.state.lock();
            let volume = &self.info.name;
            let Some(mirror) = state
                .layout_mut()
                .columns
                .iter_mut()
                .find(|m| m.copies.iter().any(|c| c.id == id))
            else {
                return Err(BlockError::Invalid {
                    reason: format!("component {id} is not a data copy of volume {volume}"),
                });
            };
            let others_active = mirror
                .copies
                .iter()
                .filter(|c| c.id != id && c.state == ComponentState::Active)
                .count();
            if others_active == 0 {
                return Err(BlockError::Invalid {
                    reason: format!(
                        "component {id} is the only Active copy of its column of volume {volume}"
                    ),
                });
            }
            mirror.copies.retain(|c| c.id != id);
            state.caught_up(id);
        }
        self.record().await
    }

    /// Brings component `id` up to date: it receives every new write from now
    /// on, and its dirty ranges are copied from an Active copy of its column.
    /// On success it is Active again.
    pub async fn resync(
        &self,
        id: ComponentId,
        progress: &ResyncProgress,
    ) -> Result<ResyncReport, ResyncError> {
        self.resync_releasing(id, progress, None).await
    }

    /// [`Coordinator::resync`], ending `held` once `id` receives writes
    /// (its Resyncing state recorded): a snapshot taken from then on is
    /// taken on it too.
    pub(crate) async fn resync_releasing(
        &self,
        id: ComponentId,
        progress: &ResyncProgress,
        held: Option<carry::SnapshotsHeld>,
    ) -> Result<ResyncReport, ResyncError> {
        let volume = self.info.name.clone();
        let (target, column) = {
            let mut state = self.state.lock();
            let found =
                state.layout.columns.iter().enumerate().find_map(|(i, m)| {
                    m.copies.iter().find(|c| c.id == id).map(|c| (c.clone(), i))
                });
            let Some((target, column)) = found else {
                return Err(ResyncError::UnknownComponent {
                    volume,
                    component: id,
                });
            };
            state.behind(id);
            let dirty_blocks = state.dirty.get(&id).map_or(0, |d| d.blocks());
            progress
                .left_bytes
                .store(dirty_blocks * BLOCK_BYTES, Ordering::Relaxed);
            (target, column)
        };
        let fail = |source: ComponentError| ResyncError::Component {
            volume: volume.clone(),
            component: id,
            source,
        };
        // Reached first: a copy whose host cannot be reached (its liveness
        // lease not yet lapsed) stays recorded as away, so a later owner
        // resyncs it by what it missed, not also by every region a write
        // was recently under way in (what it takes a Resyncing copy to be
        // behind by).
        self.io.fence(&target, self.epoch).await.map_err(fail)?;
        // It receives writes only once the directory says it does: until
        // then a write that skips it records the region it misses, and a
        // later owner that finds it Resyncing takes it as behind by every
        // change under way.
        self.record_entering(id, ComponentState::Resyncing)
            .await
            .map_err(|e| ResyncError::Unavailable {
                volume: volume.clone(),
                reason: e.to_string(),
            })?;
        drop(held);
        let dirty_total = self.dirty_blocks(id) * BLOCK_BYTES;
        progress.left_bytes.store(dirty_total, Ordering::Relaxed);
        let mut copied = 0u64;
        let mut steps = 0u64;
        // Steps in flight; each range claimed lies before `cursor`, where
        // the next claim looks from.
        let mut running = FuturesUnordered::new();
        let mut cursor = 0u64;
        loop {
            if let Some(reason) = self.superseded() {
                return Err(ResyncError::Unavailable { volume, reason });
            }
            while running.len() < self.scheduler.resync_steps_at_once() {
                let next = {
                    let state = self.state.lock();
                    let dirty = state.dirty.get(&id);
                    // Past the last range, start again from the first only
                    // once nothing is in flight: a range marked again
                    // behind the cursor (a write the copy missed) is never
                    // one a running step holds.
                    dirty
                        .and_then(|d| d.first_from(cursor, RESYNC_STEP_BLOCKS))
                        .or_else(|| {
                            dirty
                                .filter(|_| running.is_empty())
                                .and_then(|d| d.first(RESYNC_STEP_BLOCKS))
                        })
                };
                let Some((start, count)) = next else { break };
                cursor = start + count;
                running.push(self.resync_step(id, column, &target, start, count, progress));
            }
            let Some(step) = running.next().await else {
                break;
            };
            copied += step?;
            steps += 1;
            // A step still in flight waits, holding its range, while the
            // cursor is recorded: a directory write every 64 steps.
            if steps.is_multiple_of(RESYNC_STEPS_PER_RECORD) {
                self.record_resync_cursor(id).await;
            }
        }
        {
            let mut state = self.state.lock();
            state.caught_up(id);
            set_state(state.layout_mut(), id, ComponentState::Active);
        }
        self.record().await.map_err(|e| ResyncError::Unavailable {
            volume: volume.clone(),
            reason: e.to_string(),
        })?;
        Ok(ResyncReport {
            component: id,
            dirty_bytes: dirty_total,
            copied_bytes: copied,
        })
    }

    /// One step of `id`'s resync: `[start, start + count)` of its column
    /// copied from an Active copy in its turn behind guest I/O (as the
    /// scheduler's weights say, before it holds any guest write back),
    /// under the range's lock, which also covers taking the range out of
    /// the dirty map (or, when the target failed, marking it missed), so a
    /// write the target misses meanwhile is never forgotten. While guests
    /// use the host, the multiplier's pause follows, with the range and
    /// the turn released. Returns the bytes of data copied.
    async fn resync_step(
        &self,
        id: ComponentId,
        column: usize,
        target: &ComponentPlacement,
        start: u64,
        count: u64,
        progress: &ResyncProgress,
    ) -> Result<u64, ResyncError> {
        let turn = self
            .scheduler
            .admit(&IoClient::Resync, count * BLOCK_BYTES)
            .await;
        let began = self.scheduler.clock().monotonic();
        let guard = self.columns[column].lock(start, start + count).await;
        let volume = &self.info.name;
        let Some(source) = self.pick_source(column, id) else {
            return Err(ResyncError::NoSource {
                volume: volume.clone(),
                component: id,
            });
        };
        let step = match self.copy_range(&source, target, start, count).await {
            Ok(bytes) => {
                progress.copied_bytes.fetch_add(bytes, Ordering::Relaxed);
                self.counters
                    .resynced_bytes
                    .fetch_add(bytes, Ordering::Relaxed);
                let mut state = self.state.lock();
                if let Some(d) = state.dirty.get_mut(&id) {
                    d.remove(start, count);
                    progress
                        .left_bytes
                        .store(d.blocks() * BLOCK_BYTES, Ordering::Relaxed);
                }
                progress
                    .done_bytes
                    .fetch_add(count * BLOCK_BYTES, Ordering::Relaxed);
                Ok(bytes)
            }
            Err((failed, e)) => {
                if failed == id {
                    self.mark_missed(&[id], start, count);
                    let _ = self.record().await;
                }
                Err(ResyncError::Component {
                    volume: volume.clone(),
                    component: id,
                    source: e,
                })
            }
        };
        drop(guard);
        drop(turn);
        let took = self.scheduler.clock().monotonic().saturating_sub(began);
        let pause = self.scheduler.resync_pause(took);
        if step.is_ok() && !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        step
    }

    /// Drops from `id`'s recorded map the regions its resync has finished,
    /// and records the map. A failure only means a later owner copies those
    /// regions again.
    async fn record_resync_cursor(&self, id: ComponentId) {
        {
            let mut state = self.state.lock();
            let State {
                dirty, recorded, ..
            } = &mut *state;
            if let (Some(exact), Some(map)) = (dirty.get(&id), recorded.get_mut(&id)) {
                map.clear_where(|first, blocks| !exact.any_in(first, blocks));
            }
        }
        if let Err(e) = self.record_dirty(|_| false).await {
            tracing::debug!(volume = %self.info.name, component = %id, error = %e, "resync progress not recorded");
        }
    }

    /// Rewrites column blocks `[lba, lba+blocks)` of copy `id` from an
    /// Active copy of its column (its host's scrubber found them bad):
    /// under the column's range lock, so no write comes between the read of
    /// the good copy and the rewrite. A copy that is not Active is left
    /// alone (it receives no reads, and its resync rewrites what it
    /// missed). Answers the blocks rewritten.
    pub async fn repair_copy(
        &self,
        id: ComponentId,
        lba: Lba,
        blocks: u64,
    ) -> Result<u64, BlockError> {
        self.check_usable()?;
        let found = {
            let state = self.state.lock();
            state
                .layout
                .columns
                .iter()
                .enumerate()
                .find_map(|(i, m)| m.copies.iter().find(|c| c.id == id).map(|c| (c.clone(), i)))
        };
        let Some((target, column)) = found else {
            return Err(BlockError::Invalid {
                reason: format!(
                    "component {id} is not a data copy of volume {}",
                    self.info.name
                ),
            });
        };
        let end = lba
            .0
            .checked_add(blocks)
            .filter(|&e| e <= target.size_bytes / BLOCK_BYTES);
        let Some(end) = end.filter(|_| blocks > 0) else {
            return Err(BlockError::Invalid {
                reason: format!(
                    "volume {}: blocks {}..+{blocks} are not inside component {id}",
                    self.info.name, lba.0
                ),
            });
        };
        if target.state != ComponentState::Active {
            return Ok(0);
        }
        let _guard = self.columns[column].lock(lba.0, end).await;
        let source = self.pick_source(column, id).ok_or_else(|| {
            bad(format!(
                "volume {}: no other active copy to repair component {id} from",
                self.info.name
            ))
        })?;
        self.copy_range(&source, &target, lba.0, blocks)
            .await
            .map_err(|(failed, e)| {
                bad(format!(
                    "volume {}: repairing component {id} at block {}: component {failed}: {e}",
                    self.info.name, lba.0
                ))
            })?;
        self.counters
            .checksum_repairs
            .fetch_add(blocks, Ordering::Relaxed);
        tracing::warn!(volume = %self.info.name, component = %id, host = %target.host, lba = lba.0, blocks, from = %source.id, "rewrote blocks a scrub found bad");
        Ok(blocks)
    }

    fn dirty_blocks(&self, id: ComponentId) -> u64 {
        self.state.lock().dirty.get(&id).map_or(0, |d| d.blocks())
    }

    fn pick_source(&self, column: usize, not: ComponentId) -> Option<ComponentPlacement> {
        let state = self.state.lock();
        state.layout.columns[column]
            .copies
            .iter()
            .find(|c| c.id != not && c.state == ComponentState::Active)
            .cloned()
    }

    /// Copies column blocks `[start, start+count)`: allocated runs are read
    /// and written, holes are unmapped. Returns the bytes of data copied, or
    /// which component failed.
    async fn copy_range(
        &self,
        source: &ComponentPlacement,
        target: &ComponentPlacement,
        start: u64,
        count: u64,
    ) -> Result<u64, (ComponentId, ComponentError)> {
        let runs = self
            .io
            .allocated(source, Lba(start), count)
            .await
            .map_err(|e| (source.id, e))?;
        let mut copied = 0;
        let mut pos = start;
        for (lba, run) in runs
            .into_iter()
            .chain(std::iter::once((Lba(start + count), 0)))
        {
            let run_start = lba.0.max(start);
            let run_end = (lba.0 + run).min(start + count);
            if run_start > pos {
                self.io
                    .unmap(
                        target,
                        Lba(pos),
                        run_start - pos,
                        self.epoch,
                        IoClass::Resync,
                    )
                    .await
                    .map_err(|e| (target.id, e))?;
            }
            if run_end > run_start {
                let data = self
                    .io
                    .read(
                        source,
                        Lba(run_start),
                        (run_end - run_start) as u32,
                        IoClass::Resync,
                    )
                    .await
                    .map_err(|e| (source.id, e))?;
                copied += data.len() as u64;
                self.io
                    .write(target, Lba(run_start), data, self.epoch, IoClass::Resync)
                    .await
                    .map_err(|e| (target.id, e))?;
            }
            pos = pos.max(run_end);
        }
        Ok(copied)
    }

    /// Sums the allocated bytes of one Active copy per column.
    pub async fn refresh_space(&self) {
        let sources: Vec<ComponentPlacement> = {
            let state = self.state.lock();
            state
                .layout
                .columns
                .iter()
                .filter_map(|m| {
                    m.copies
                        .iter()
                        .find(|c| c.state == ComponentState::Active)
                        .cloned()
                })
                .collect()
        };
        let mut total = 0;
        for c in sources {
            if let Ok(status) = self.io.status(&c).await {
                total += status.allocated_bytes;
            }
        }
        self.allocated_bytes.store(total, Ordering::Relaxed);
    }

    /// Records the layout (its generation raised) with the dirty-region
    /// maps.
    async fn record(&self) -> Result<(), BlockError> {
        let _turn = self.record_turn.lock().await;
        let (layout, dirty) = {
            let mut state = self.state.lock();
            state.layout_mut().generation += 1;
            (state.layout.clone(), state.dirty_record())
        };
        self.recorder
            .record(&layout, &dirty)
            .await
            .map_err(|e| bad(format!("volume {}: recording layout: {e}", self.info.name)))?;
        self.state.lock().recorded_as(dirty);
        Ok(())
    }

    /// Records the layout with copy `id` in `state`, then puts it in that
    /// state here, in one turn of the records: no record in between says
    /// otherwise, and the copy's new state takes effect (for a copy that
    /// starts to receive writes, that it receives them) only once recorded.
    async fn record_entering(&self, id: ComponentId, to: ComponentState) -> Result<(), BlockError> {
        let _turn = self.record_turn.lock().await;
        let (layout, dirty) = {
            let mut state = self.state.lock();
            state.layout_mut().generation += 1;
            let mut layout = Layout::clone(&state.layout);
            set_state(&mut layout, id, to);
            (layout, state.dirty_record())
        };
        self.recorder
            .record(&layout, &dirty)
            .await
            .map_err(|e| bad(format!("volume {}: recording layout: {e}", self.info.name)))?;
        let mut state = self.state.lock();
        state.recorded_as(dirty);
        set_state(state.layout_mut(), id, to);
        Ok(())
    }

    /// Makes sure the directory's dirty-region maps cover every `(copy,
    /// start, count)` of `needs` (already marked in the maps to record) and
    /// its write intents every column range of `spans` (already begun):
    /// writes one record unless a record that did already succeeded.
    async fn record_intents_covering(
        &self,
        needs: &[(ComponentId, u64, u64)],
        spans: &[(usize, u64, u64)],
    ) -> Result<(), BlockError> {
        let done =
            |state: &State| state.durably_covers(needs) && state.intents_durably_cover(spans);
        if done(&self.state.lock()) {
            return Ok(());
        }
        self.record_dirty(done).await
    }

    /// Writes the dirty-region maps alone, unless `done` says the record
    /// that succeeded meanwhile holds what the caller needs.
    async fn record_dirty(&self, done: impl Fn(&State) -> bool) -> Result<(), BlockError> {
        self.record_maps("dirty regions", |state| !done(state))
            .await
    }

    /// Writes the dirty-region maps and write intents alone, in its turn,
    /// if `prepare` (run on the state in that turn) says so.
    async fn record_maps(
        &self,
        what: &str,
        prepare: impl FnOnce(&mut State) -> bool,
    ) -> Result<(), BlockError> {
        let _turn = self.record_turn.lock().await;
        let dirty = {
            let mut state = self.state.lock();
            if !prepare(&mut state) {
                return Ok(());
            }
            state.dirty_record()
        };
        self.recorder
            .record_dirty(&dirty)
            .await
            .map_err(|e| bad(format!("volume {}: recording {what}: {e}", self.info.name)))?;
        self.state.lock().recorded_as(dirty);
        Ok(())
    }

    fn check_usable(&self) -> Result<(), BlockError> {
        let state = self.state.lock();
        if let Some(reason) = &state.superseded {
            return Err(bad(reason.clone()));
        }
        if !has_quorum(&state.layout) {
            return Err(bad(format!(
                "volume {} has lost quorum: too few of its components are reachable",
                self.info.name
            )));
        }
        Ok(())
    }

    /// Locks the column ranges touched by volume bytes `[offset, offset+len)`,
    /// widened to whole blocks, in column order (so two requests never wait
    /// on each other in a cycle).
    async fn lock_span(&self, offset: u64, len: u64) -> Vec<RangeGuard> {
        let spans = self.column_spans(offset, len);
        let mut guards = Vec::with_capacity(spans.len());
        for (column, s, e) in spans {
            guards.push(self.columns[column].lock(s, e).await);
        }
        guards
    }

    /// The column block ranges `(column, first, end)` that volume bytes
    /// `[offset, offset+len)` touch, widened to whole blocks, one per
    /// column, in column order.
    fn column_spans(&self, offset: u64, len: u64) -> Vec<(usize, u64, u64)> {
        let start = offset / BLOCK_BYTES * BLOCK_BYTES;
        let end = (offset + len).div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        let pieces = self.state.lock().layout.map_range(start, end - start);
        let mut per_column: Vec<(usize, u64, u64)> = Vec::new();
        for p in pieces {
            let b0 = p.component_offset / BLOCK_BYTES;
            let b1 = (p.component_offset + p.len) / BLOCK_BYTES;
            match per_column.iter_mut().find(|(c, _, _)| *c == p.column) {
                Some((_, s, e)) => {
                    *s = (*s).min(b0);
                    *e = (*e).max(b1);
                }
                None => per_column.push((p.column, b0, b1)),
            }
        }
        per_column.sort();
        per_column
    }

    /// Reads whole blocks `[start, end)` of the volume (byte offsets
    /// aligned): the blocks the host read cache holds from it, the others
    /// from the copies, which then fill the cache.
    async fn read_aligned(&self, start: u64, end: u64) -> Result<Bytes, BlockError> {
        if !self.cache.enabled() {
            return self.read_copies(start, end).await;
        }
        let first = start / BLOCK_BYTES;
        let count = (end - start) / BLOCK_BYTES;
        // Before any copy is read: a change that completes from now on
        // keeps this read from inserting what it replaced.
        let ticket = self.cache.ticket();
        let found = if count == 1 {
            // Most guest reads: a hit is the cached block itself (shared,
            // not copied); a miss goes the way of any read that found
            // nothing, with no list built (an empty one allocates nothing).
            match self.cache.lookup_one(first) {
                Some(block) => {
                    self.counters
                        .read_cache_hits
                        .fetch_add(1, Ordering::Relaxed);
                    return Ok(block);
                }
                None => Vec::new(),
            }
        } else {
            self.cache.lookup(first, count)
        };
        let hits = found.iter().filter(|b| b.is_some()).count() as u64;
        self.counters
            .read_cache_hits
            .fetch_add(hits, Ordering::Relaxed);
        self.counters
            .read_cache_misses
            .fetch_add(count - hits, Ordering::Relaxed);
        if hits == 0 {
            let data = self.read_copies(start, end).await?;
            self.cache.fill(ticket, first, &data);
            return Ok(data);
        }
        // Runs of blocks not held: (index of the first, blocks).
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (i, b) in found.iter().enumerate() {
            if b.is_none() {
                let i = i as u64;
                match runs.last_mut() {
                    Some((s, n)) if *s + *n == i => *n += 1,
                    _ => runs.push((i, 1)),
                }
            }
        }
        let reads = join_all(runs.iter().map(|&(i, n)| {
            self.read_copies(start + i * BLOCK_BYTES, start + (i + n) * BLOCK_BYTES)
        }))
        .await;
        let mut fetched = runs.into_iter().zip(reads);
        let mut out = BytesMut::with_capacity((end - start) as usize);
        let mut i = 0;
        while i < count {
            if let Some(block) = &found[i as usize] {
                out.extend_from_slice(block);
                i += 1;
                continue;
            }
            let ((at, n), data) = fetched.next().expect("a read for every run not held");
            debug_assert_eq!(at, i);
            let data = data?;
            self.cache.fill(ticket, first + at, &data);
            out.extend_from_slice(&data);
            i += n;
        }
        Ok(out.freeze())
    }

    /// Reads whole blocks `[start, end)` of the volume from the copies. A
    /// range inside one column (every 4 KiB read) is the copy's answer as it
    /// came, not copied.
    async fn read_copies(&self, start: u64, end: u64) -> Result<Bytes, BlockError> {
        let pieces = self.state.lock().layout.map_range(start, end - start);
        if let [p] = pieces.as_slice() {
            return self
                .read_column(
                    p.column,
                    p.component_offset / BLOCK_BYTES,
                    p.len / BLOCK_BYTES,
                )
                .await;
        }
        let reads = join_all(pieces.iter().map(|p| {
            self.read_column(
                p.column,
                p.component_offset / BLOCK_BYTES,
                p.len / BLOCK_BYTES,
            )
        }))
        .await;
        let mut out = BytesMut::with_capacity((end - start) as usize);
        for r in reads {
            out.extend_from_slice(&r?);
        }
        Ok(out.freeze())
    }

    /// Reads column blocks from one Active copy, falling back to the others,
    /// and repairs copies whose checksum failed.
    async fn read_column(
        &self,
        column: usize,
        block: u64,
        count: u64,
    ) -> Result<Bytes, BlockError> {
        let copies = self.readable_copies(column, block);
        if copies.is_empty() {
            return Err(bad(format!(
                "volume {}: no readable copy of column {column}",
                self.info.name
            )));
        }
        let mut checksum_failed: Vec<ComponentPlacement> = Vec::new();
        let mut last_error = None;
        for c in copies.iter() {
            match self
                .io
                .read(c, Lba(block), count as u32, IoClass::Guest)
                .await
            {
                Ok(data) => {
                    if !checksum_failed.is_empty() {
                        self.repair(column, block, count, &checksum_failed).await;
                    }
                    return Ok(data);
                }
                Err(ComponentError::Checksum { .. }) => checksum_failed.push(c.clone()),
                Err(ComponentError::StaleEpoch { highest, .. }) => {
                    return Err(self.superseded_by(highest));
                }
                Err(e) => {
                    last_error = Some(e.to_string());
                    self.mark_missed(&[c.id], 0, 0);
                    let _ = self.record().await;
                }
            }
        }
        if !checksum_failed.is_empty() && count > 1 {
            // Each copy has some bad block: assemble the range block by block.
            let mut out = BytesMut::with_capacity((count * BLOCK_BYTES) as usize);
            for b in block..block + count {
                let one = Box::pin(self.read_column(column, b, 1)).await?;
                out.extend_from_slice(&one);
            }
            return Ok(out.freeze());
        }
        if !checksum_failed.is_empty() {
            let offset = self.volume_offset(column, block);
            tracing::error!(volume = %self.info.name, offset, "every copy of a block failed its checksum");
            return Err(BlockError::Checksum { offset });
        }
        Err(bad(format!(
            "volume {}: no copy of column {column} could be read: {}",
            self.info.name,
            last_error.unwrap_or_default()
        )))
    }

    /// Rewrites good data over copies that failed their checksum, under the
    /// range lock so a concurrent client write cannot be overwritten by it.
    /// When the range is locked (by a write whose read-modify-write or
    /// COMPARE AND WRITE found the bad block, or by any other writer), the
    /// repair is left to the next read or the scrubber rather than waiting,
    /// which could wait on ourselves.
    async fn repair(
        &self,
        column: usize,
        block: u64,
        count: u64,
        bad_copies: &[ComponentPlacement],
    ) {
        let Some(_guard) = self.columns[column].try_lock(block, block + count) else {
            return;
        };
        let Some(good) = self
            .readable_copies(column, block)
            .iter()
            .find(|c| !bad_copies.iter().any(|b| b.id == c.id))
            .cloned()
        else {
            return;
        };
        let Ok(data) = self
            .io
            .read(&good, Lba(block), count as u32, IoClass::Guest)
            .await
        else {
            return;
        };
        for c in bad_copies {
            if self
                .io
                .write(c, Lba(block), data.clone(), self.epoch, IoClass::Guest)
                .await
                .is_ok()
            {
                self.counters
                    .checksum_repairs
                    .fetch_add(count, Ordering::Relaxed);
                tracing::warn!(volume = %self.info.name, component = %c.id, block, count, "repaired blocks that failed their checksum");
            }
        }
    }

    fn volume_offset(&self, column: usize, block: u64) -> u64 {
        let layout = self.state.lock().layout.clone();
        let unit = layout.stripe_unit_bytes.max(BLOCK_BYTES);
        let width = layout.columns.len().max(1) as u64;
        let byte = block * BLOCK_BYTES;
        let row = byte / unit;
        row * unit * width + column as u64 * unit + byte % unit
    }

    /// The Active copies of `column` in the order a read of column block
    /// `block` tries them: a copy on this host first, else the copy the
    /// block's 1 MiB region is assigned to (region `r` to the `r mod n`-th
    /// Active copy), then the others.
    fn readable_copies(&self, column: usize, block: u64) -> ReadableCopies {
        let layout = Arc::clone(&self.state.lock().layout);
        let mut order: Vec<usize> = layout.columns[column]
            .copies
            .iter()
            .enumerate()
            .filter(|(_, c)| c.state == ComponentState::Active)
            .map(|(i, _)| i)
            .collect();
        if order.len() > 1 {
            let copies = &layout.columns[column].copies;
            let first = order
                .iter()
                .position(|&i| self.io.is_local(&copies[i]))
                .unwrap_or(((block / READ_REGION_BLOCKS) % order.len() as u64) as usize);
            order.rotate_left(first);
        }
        ReadableCopies {
            layout,
            column,
            order,
        }
    }

    fn superseded_by(&self, highest: Epoch) -> BlockError {
        let reason = format!(
            "volume {} is owned at {highest}, newer than ours ({})",
            self.info.name, self.epoch
        );
        self.state.lock().superseded = Some(reason.clone());
        self.cache.retire();
        bad(reason)
    }

    /// Records that `ids` missed column blocks `[start, start+count)`:
    /// they become Absent (if they were receiving writes) and the range dirty.
    fn mark_missed(&self, ids: &[ComponentId], start: u64, count: u64) {
        let mut state = self.state.lock();
        for &id in ids {
            let current = state.layout.component(id).map(|c| c.state);
            state.missed(id, start, count);
            if matches!(
                current,
                Some(ComponentState::Active | ComponentState::Resyncing)
            ) {
                set_state(state.layout_mut(), id, ComponentState::Absent);
                state.departs(id);
            }
        }
    }

    /// Writes whole blocks at aligned volume offset `start`; the caller holds
    /// the range locks.
    async fn write_aligned(&self, start: u64, data: Bytes) -> Result<(), BlockError> {
        let len = data.len() as u64;
        self.apply(start, len, CopyChange::Write(data)).await
    }

    /// Unmaps whole blocks at aligned volume offset `start`.
    async fn unmap_aligned(&self, start: u64, len: u64) -> Result<(), BlockError> {
        self.apply(start, len, CopyChange::Unmap).await
    }

    /// Makes `change` on every copy that receives writes, for each column
    /// piece of `[start, start+len)`, and settles the outcome: copies that
    /// failed become Absent with the range dirty, absent copies get the
    /// range dirty, and the result is acknowledged only with quorum and a
    /// copy per column. The copies are those of the layout when the change
    /// starts, borrowed from it, not copied.
    async fn apply(&self, start: u64, len: u64, change: CopyChange) -> Result<(), BlockError> {
        self.check_usable()?;
        // Dropped on the way out, once the copies are done with the change
        // (or it was abandoned), before it is acknowledged.
        let _invalidate = self
            .cache
            .change(start / BLOCK_BYTES, len.div_ceil(BLOCK_BYTES));
        let (pieces, layout, skipped, intents) = {
            let mut state = self.state.lock();
            let pieces = state.layout.map_range(start, len);
            let layout = Arc::clone(&state.layout);
            let targets = |column: usize| &layout.columns[column].copies;
            // Copies that do not receive the change miss it: marked in the
            // same turn as the targets are read, so a resync that makes such
            // a copy Resyncing afterwards finds these blocks dirty.
            let mut skipped = Vec::new();
            let mut spans = Vec::new();
            for p in &pieces {
                let block = p.component_offset / BLOCK_BYTES;
                let count = p.len / BLOCK_BYTES;
                for c in targets(p.column).iter().filter(|c| !receives_writes(c)) {
                    state.missed(c.id, block, count);
                    skipped.push((c.id, block, count));
                }
                if targets(p.column)
                    .iter()
                    .filter(|c| receives_writes(c))
                    .count()
                    >= 2
                {
                    spans.push((p.column, block, count));
                }
            }
            state.begin_changes(&spans);
            let intents = IntentHold {
                coordinator: self,
                spans,
                settled: false,
            };
            (pieces, layout, skipped, intents)
        };
        // Recorded before any copy has the change: an owner that dies with
        // the change on some copies leaves a record that names it, as a
        // region a copy missed or one the copies may differ in.
        if let Err(e) = self.record_intents_covering(&skipped, &intents.spans).await {
            // Nothing was sent: no copy can differ from another by it.
            intents.settled();
            return Err(e);
        }
        let mut calls = Vec::new();
        for p in &pieces {
            let block = p.component_offset / BLOCK_BYTES;
            let count = p.len / BLOCK_BYTES;
            for c in layout.columns[p.column]
                .copies
                .iter()
                .filter(|c| receives_writes(c))
            {
                let fut = match &change {
                    CopyChange::Write(data) => {
                        let piece = data
                            .slice(p.buffer_offset as usize..(p.buffer_offset + p.len) as usize);
                        self.io
                            .write(c, Lba(block), piece, self.epoch, IoClass::Guest)
                    }
                    CopyChange::Unmap => {
                        self.io
                            .unmap(c, Lba(block), count, self.epoch, IoClass::Guest)
                    }
                };
                let local = self.io.is_local(c);
                calls.push((local, async move { (c, p.column, block, count, fut.await) }));
            }
        }
        // Copies on other hosts first: `join_all` polls in order, and the
        // first poll of a local copy may block this thread until its write
        // is durable; a remote copy's first poll only sends its request.
        calls.sort_by_key(|(local, _)| *local);
        let results = join_all(calls.into_iter().map(|(_, call)| call)).await;
        intents.settled();
        let mut state_changed = false;
        let mut acked_columns = vec![false; layout.columns.len()];
        let mut failure: Option<BlockError> = None;
        for (c, column, block, count, result) in results {
            match result {
                Ok(()) => acked_columns[column] = true,
                Err(ComponentError::StaleEpoch { highest, .. }) => {
                    failure = Some(self.superseded_by(highest));
                }
                Err(ComponentError::NoSpace { .. }) => {
                    failure.get_or_insert(BlockError::NoSpace { offset: start, len });
                    self.mark_missed(&[c.id], block, count);
                    state_changed = true;
                }
                Err(e) => {
                    tracing::warn!(volume = %self.info.name, component = %c.id, host = %c.host, error = %e, "copy missed a write; continuing degraded");
                    self.mark_missed(&[c.id], block, count);
                    state_changed = true;
                }
            }
        }
        if !skipped.is_empty() || state_changed {
            // Some copy misses this change, whether it was away already or
            // failed it just now.
            self.counters
                .degraded_write_bytes
                .fetch_add(len, Ordering::Relaxed);
        }
        if state_changed {
            self.record().await?;
        }
        if let Some(e) = failure {
            return Err(e);
        }
        let touched: Vec<usize> = pieces.iter().map(|p| p.column).collect();
        if touched.iter().any(|&c| !acked_columns[c]) {
            return Err(bad(format!(
                "volume {}: no copy of the data acknowledged the write at offset {start}",
                self.info.name
            )));
        }
        self.check_usable()
    }
}

/// The Active copies of a column in the order a read tries them, in the
/// layout of the read's turn (see [`Coordinator::readable_copies`]).
struct ReadableCopies {
    layout: Arc<Layout>,
    column: usize,
    order: Vec<usize>,
}

impl ReadableCopies {
    fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    fn iter(&self) -> impl Iterator<Item = &ComponentPlacement> {
        let copies = &self.layout.columns[self.column].copies;
        self.order.iter().map(move |&i| &copies[i])
    }
}

/// What [`Coordinator::apply`] does to each copy.
enum CopyChange {
    /// Writes these bytes (the whole range's).
    Write(Bytes),
    /// Unmaps the range.
    Unmap,
}

/// Whether copy `c` receives writes (it is Active, or Resyncing and so
/// given every change while its dirty ranges are copied).
fn receives_writes(c: &ComponentPlacement) -> bool {
    matches!(c.state, ComponentState::Active | ComponentState::Resyncing)
}

fn durable_maps(record: DirtyRecord) -> BTreeMap<ComponentId, RecordedDirty> {
    record
        .components
        .into_iter()
        .map(|c| (c.component, c.regions))
        .collect()
}

fn set_state(layout: &mut Layout, id: ComponentId, state: ComponentState) -> bool {
    for c in layout.components_mut() {
        if c.id == id && c.state != state {
            c.state = state;
            return true;
        }
    }
    false
}

fn has_quorum(layout: &Layout) -> bool {
    layout.has_quorum(|c| c.state == ComponentState::Active)
}

#[async_trait]
impl BlockDevice for Coordinator {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    async fn read(&self, offset: u64, len: u64) -> Result<Bytes, BlockError> {
        check_range(&self.info, "read", offset, len)?;
        if len == 0 {
            return Ok(Bytes::new());
        }
        if let Some(reason) = self.superseded() {
            return Err(bad(reason));
        }
        let start = offset / BLOCK_BYTES * BLOCK_BYTES;
        let end = (offset + len).div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        let blocks = self.read_aligned(start, end).await?;
        let skip = (offset - start) as usize;
        Ok(blocks.slice(skip..skip + len as usize))
    }

    async fn write(&self, offset: u64, data: Bytes, _flags: WriteFlags) -> Result<(), BlockError> {
        check_range(&self.info, "write", offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let _guards = self.lock_span(offset, data.len() as u64).await;
        self.write_locked(offset, data).await
    }

    async fn flush(&self) -> Result<(), BlockError> {
        // Every acknowledged write is already durable on every active copy.
        self.check_usable()
    }

    async fn unmap(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        check_range(&self.info, "unmap", offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let _guards = self.lock_span(offset, len).await;
        self.zero_locked(offset, len).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<(), BlockError> {
        check_range(&self.info, "write zeroes", offset, len)?;
        if len == 0 {
            return Ok(());
        }
        match mode {
            ZeroMode::MayUnmap => {
                let _guards = self.lock_span(offset, len).await;
                self.zero_locked(offset, len).await
            }
            ZeroMode::KeepAllocated => {
                let mut done = 0;
                while done < len {
                    let step = (len - done).min(ZERO_STEP_BYTES);
                    let zeros = Bytes::from(vec![0u8; step as usize]);
                    self.write(offset + done, zeros, WriteFlags::default())
                        .await?;
                    done += step;
                }
                Ok(())
            }
        }
    }

    async fn compare_and_write(
        &self,
        offset: u64,
        expected: Bytes,
        new: Bytes,
    ) -> Result<(), BlockError> {
        check_compare_and_write(&self.info, offset, &expected, &new)?;
        let _guards = self.lock_span(offset, new.len() as u64).await;
        let current = self.read(offset, new.len() as u64).await?;
        if let Some(at) = first_difference(&current, &expected) {
            return Err(BlockError::Miscompare { offset: at as u64 });
        }
        self.write_locked(offset, new).await
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, BlockError> {
        check_range(&self.info, "block status", offset, len)?;
        self.check_usable()?;
        let start = offset / BLOCK_BYTES * BLOCK_BYTES;
        let end = (offset + len).div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        let pieces = self.state.lock().layout.map_range(start, end - start);
        let mut extents = Vec::new();
        for p in pieces {
            let b0 = p.component_offset / BLOCK_BYTES;
            let Some(copy) = self.readable_copies(p.column, b0).iter().next().cloned() else {
                return Err(bad(format!("volume {}: no readable copy", self.info.name)));
            };
            let count = p.len / BLOCK_BYTES;
            let runs = self
                .io
                .allocated(&copy, Lba(b0), count)
                .await
                .map_err(|e| BlockError::Io {
                    offset: start + p.buffer_offset,
                    detail: e.to_string(),
                })?;
            let piece_start = start + p.buffer_offset;
            let mut pos = b0;
            for (lba, run) in runs {
                let rs = lba.0.max(b0);
                let re = (lba.0 + run).min(b0 + count);
                if rs >= re {
                    continue;
                }
                if rs > pos {
                    push_extent(
                        &mut extents,
                        piece_start + (pos - b0) * BLOCK_BYTES,
                        (rs - pos) * BLOCK_BYTES,
                        ExtentKind::Hole,
                    );
                }
                push_extent(
                    &mut extents,
                    piece_start + (rs - b0) * BLOCK_BYTES,
                    (re - rs) * BLOCK_BYTES,
                    ExtentKind::Data,
                );
                pos = re;
            }
            if pos < b0 + count {
                push_extent(
                    &mut extents,
                    piece_start + (pos - b0) * BLOCK_BYTES,
                    (b0 + count - pos) * BLOCK_BYTES,
                    ExtentKind::Hole,
                );
            }
        }
        Ok(clip_extents(extents, offset, offset + len))
    }

    fn space(&self) -> SpaceUsage {
        SpaceUsage {
            allocated_bytes: self.allocated_bytes.load(Ordering::Relaxed),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Coordinator {
    /// A write with the range locks held: partial blocks at the edges are
    /// merged with their current contents first.
    async fn write_locked(&self, offset: u64, data: Bytes) -> Result<(), BlockError> {
        let len = data.len() as u64;
        let start = offset / BLOCK_BYTES * BLOCK_BYTES;
        let end = (offset + len).div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        if start == offset && end == offset + len {
            return self.write_aligned(start, data).await;
        }
        let mut merged = BytesMut::zeroed((end - start) as usize);
        let head_partial = offset != start;
        let tail_partial = !(offset + len).is_multiple_of(BLOCK_BYTES);
        if head_partial {
            let head = self.read_aligned(start, start + BLOCK_BYTES).await?;
            merged[..BLOCK_BYTES as usize].copy_from_slice(&head);
        }
        if tail_partial && (end - BLOCK_BYTES > start || !head_partial) {
            let tail = self.read_aligned(end - BLOCK_BYTES, end).await?;
            let at = (end - BLOCK_BYTES - start) as usize;
            merged[at..].copy_from_slice(&tail);
        }
        let at = (offset - start) as usize;
        merged[at..at + len as usize].copy_from_slice(&data);
        self.write_aligned(start, merged.freeze()).await
    }

    /// Unmaps whole blocks and writes zeros over partial edges, with the
    /// range locks held.
    async fn zero_locked(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        let end = offset + len;
        let inner_start = offset.div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        let inner_end = end / BLOCK_BYTES * BLOCK_BYTES;
        if inner_start >= inner_end {
            return self
                .write_locked(offset, Bytes::from(vec![0u8; len as usize]))
                .await;
        }
        if offset < inner_start {
            self.write_locked(
                offset,
                Bytes::from(vec![0u8; (inner_start - offset) as usize]),
            )
            .await?;
        }
        self.unmap_aligned(inner_start, inner_end - inner_start)
            .await?;
        if inner_end < end {
            self.write_locked(
                inner_end,
                Bytes::from(vec![0u8; (end - inner_end) as usize]),
            )
            .await?;
        }
        Ok(())
    }
}

/// Cuts block-aligned extents down to `[start, end)`.
fn clip_extents(extents: Vec<Extent>, start: u64, end: u64) -> Vec<Extent> {
    let mut out = Vec::new();
    for e in extents {
        let s = e.offset.max(start);
        let t = (e.offset + e.len).min(end);
        if s < t {
            push_extent(&mut out, s, t - s, e.kind);
        }
    }
    out
}
