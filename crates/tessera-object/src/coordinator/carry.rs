//! Copies that join or leave a volume together with its snapshots.
//!
//! Owns: [`Coordinator::add_copy_with_snapshots`], which fills a new copy
//! (a rebuild's replacement or an evacuation's new copy) with each snapshot
//! in the order they were taken, takes each snapshot of it as it goes, and
//! only then puts it in the layout, with what changed since the last
//! snapshot left for its resync;
//! [`Coordinator::resync_with_snapshots`], which gives a copy that returns
//! the snapshots taken while it was away before it receives writes again;
//! and [`Coordinator::drop_copy_with_snapshots`], the other half of a move.
//! Must not touch: what the snapshots' records hold beyond their
//! components (changed through the recorder, in the same record as the
//! layout), the choice of the new copy's place (placement's).
//!
//! Invariants:
//! - the new copy's snapshots hold what the surviving copy's snapshots
//!   hold, block for block, and share stored blocks as theirs do: snapshot
//!   `k` is sent only the blocks that changed since snapshot `k - 1`, and
//!   the volume only those that changed since the last snapshot, so a
//!   rebuilt host holds about what the lost one held, not a full copy per
//!   snapshot;
//! - nothing reaches the new copy but this filling until it is in the
//!   layout (it is not in it, so no guest write goes to it), and it enters
//!   the layout under the whole volume's range locks, at the moment its
//!   dirty map is read from the surviving copy: every write after that
//!   reaches it, every write before it is in the map;
//! - no snapshot is taken while a new copy is given the volume's snapshots
//!   (`hold_snapshots`), so it never misses one;
//! - a copy that returns is brought to each snapshot it missed while it is
//!   still out of the layout's writes: it differs from the first only where
//!   its dirty map says (every write since it went away is there), and
//!   from each next one only where the two snapshots differ; its snapshots
//!   are recorded before it receives writes again;
//! - on any failure before it enters the layout, the new copy and the
//!   snapshots made of it are deleted and the layout is unchanged.

use tessera_blockdev::BlockError;
use tessera_types::dirty::RecordedDirty;
use tessera_types::layout::{ComponentPlacement, ComponentRole, ComponentState, Layout};
use tessera_types::{ComponentId, Lba, BLOCK_BYTES};

use super::{bad, Coordinator, ResyncError, ResyncProgress, ResyncReport, RESYNC_STEP_BLOCKS};
use crate::component_io::{SnapshotCopyChange, SnapshotCopyEdit};
use crate::dirty::DirtyRegions;
use std::sync::atomic::Ordering;

/// One snapshot of the volume, as its record lays it out.
#[derive(Debug, Clone)]
pub struct SnapshotChainLink {
    /// The snapshot's number ([`ComponentId::snapshot`] makes its
    /// components' ids).
    pub id: u64,
    /// Its components.
    pub layout: Layout,
}

/// Keeps snapshots of a volume from being taken while a new copy is given
/// the ones it has; see [`Coordinator::hold_snapshots`].
pub struct SnapshotsHeld {
    coordinator: std::sync::Arc<Coordinator>,
}

impl Drop for SnapshotsHeld {
    fn drop(&mut self) {
        self.coordinator
            .copies_joining
            .fetch_sub(1, Ordering::SeqCst);
    }
}

/// Where a new copy goes in the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewCopyPlace {
    /// In place of this lost copy (a rebuild).
    Replacing(ComponentId),
    /// Beside this copy, which keeps serving (an evacuation).
    Beside(ComponentId),
}

impl NewCopyPlace {
    /// The copy already in the layout the new one goes with.
    fn copy(self) -> ComponentId {
        match self {
            NewCopyPlace::Replacing(c) | NewCopyPlace::Beside(c) => c,
        }
    }

    /// How the new copy's snapshot changes a snapshot's record.
    fn edit(self, made: ComponentPlacement) -> SnapshotCopyEdit {
        match self {
            NewCopyPlace::Replacing(_) => SnapshotCopyEdit::Replace(made),
            NewCopyPlace::Beside(_) => SnapshotCopyEdit::AddBeside(made),
        }
    }
}

/// What [`Coordinator::add_copy_with_snapshots`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CarriedSnapshots {
    /// The new copy's snapshots, one per link, in the order given (in
    /// their snapshots' records once it returns).
    pub made: Vec<(u64, ComponentPlacement)>,
    /// The component they were read from, which stays.
    pub source: ComponentId,
    /// Bytes sent to the new copy for its snapshots.
    pub copied_bytes: u64,
    /// Blocks the new copy still misses (what its resync copies).
    pub dirty_blocks: u64,
}

impl Coordinator {
    /// Refuses every snapshot of the volume until the answer is dropped,
    /// once a snapshot under way has been taken and recorded: the list of
    /// snapshots read after this returns is the one a new copy must be
    /// given ([`Coordinator::add_copy_with_snapshots`]).
    pub async fn hold_snapshots(self: &std::sync::Arc<Self>) -> SnapshotsHeld {
        // A snapshot holds the whole volume's range locks until it is
        // recorded: once they are had, none is under way.
        let _settled = self.lock_span(0, self.info.size_bytes).await;
        self.copies_joining.fetch_add(1, Ordering::SeqCst);
        SnapshotsHeld {
            coordinator: std::sync::Arc::clone(self),
        }
    }

    /// Brings copy `id` up to date when it returns: first the snapshots of
    /// `chain` (oldest first, read while `held`) that were taken while it
    /// was away, then what it missed as [`Coordinator::resync`] does.
    /// While it is still out of the layout's writes it is brought to each
    /// such snapshot in turn (the blocks its dirty map lists for the first,
    /// what changed between two snapshots for the next) and its own
    /// snapshot taken; they enter the snapshots' records beside the copy
    /// they were read from. `held` ends once the copy receives writes
    /// again, so no snapshot comes between. A copy that is catching up
    /// already, or that misses no snapshot, is only resynced.
    pub async fn resync_with_snapshots(
        &self,
        id: ComponentId,
        chain: &[SnapshotChainLink],
        held: SnapshotsHeld,
        progress: &ResyncProgress,
    ) -> Result<ResyncReport, ResyncError> {
        let volume = self.info.name.clone();
        let found = {
            let state = self.state.lock();
            state.layout.columns.iter().enumerate().find_map(|(i, m)| {
                m.copies
                    .iter()
                    .find(|c| c.id == id && c.role == ComponentRole::Data)
                    .map(|c| (c.clone(), i))
            })
        };
        let Some((target, column)) = found else {
            return Err(ResyncError::UnknownComponent {
                volume,
                component: id,
            });
        };
        // Only the snapshots taken since it went away are carried: they
        // are the newest ones (none is taken while a copy is Resyncing or
        // being given them). An older one it lacks stays as it is.
        let kept = chain
            .iter()
            .rposition(|link| snapshot_copy(link, column, id).is_some())
            .map_or(0, |i| i + 1);
        let missed = &chain[kept..];
        for link in chain[..kept]
            .iter()
            .filter(|link| snapshot_copy(link, column, id).is_none())
        {
            tracing::warn!(%volume, component = %id, snapshot = link.id, "copy lacks an older snapshot; that snapshot keeps its other copies only");
        }
        if missed.is_empty() || target.state == ComponentState::Resyncing {
            return self.resync_releasing(id, progress, Some(held)).await;
        }
        let source = {
            let state = self.state.lock();
            state.layout.columns[column]
                .copies
                .iter()
                .filter(|c| c.id != id && c.state == ComponentState::Active)
                .find(|c| {
                    missed
                        .iter()
                        .all(|link| snapshot_copy(link, column, c.id).is_some())
                })
                .cloned()
        };
        let Some(source) = source else {
            return Err(ResyncError::NoSource {
                volume,
                component: id,
            });
        };
        let unavailable = |e: BlockError| ResyncError::Unavailable {
            volume: volume.clone(),
            reason: e.to_string(),
        };
        self.io
            .fence(&target, self.epoch)
            .await
            .map_err(|source| ResyncError::Component {
                volume: volume.clone(),
                component: id,
                source,
            })?;
        // What an earlier attempt made of them is made again.
        for link in missed {
            let stale = ComponentPlacement {
                id: id.snapshot(link.id),
                ..target.clone()
            };
            self.io.delete(&stale).await.map_err(|e| {
                unavailable(bad(format!(
                    "deleting {} left by an earlier attempt: {e}",
                    stale.id
                )))
            })?;
        }
        // Where the copy may differ from the volume when the first missed
        // snapshot was taken: every write since it went away is in its
        // dirty map, and so is every write it may hold that the others do
        // not.
        let away: Vec<(Lba, u64)> = self
            .state
            .lock()
            .dirty
            .get(&id)
            .map(|d| d.ranges().map(|(start, n)| (Lba(start), n)).collect())
            .unwrap_or_default();
        let mut made = Vec::new();
        let filled = self
            .fill_snapshots(
                column,
                &source,
                &target,
                missed,
                Some(away),
                progress,
                &mut made,
            )
            .await;
        let recorded = match filled {
            Ok(_) => {
                let changes: Vec<SnapshotCopyChange> = made
                    .iter()
                    .map(|(snapshot, m)| SnapshotCopyChange {
                        snapshot: *snapshot,
                        copy: source.id,
                        edit: SnapshotCopyEdit::AddBeside(m.clone()),
                    })
                    .collect();
                self.record_with_snapshots(&changes).await
            }
            Err(e) => Err(e),
        };
        match recorded {
            Ok(gone) => self.delete_made_of_gone(&made, &gone).await,
            Err(e) => {
                self.delete_unrecorded(&made).await;
                return Err(unavailable(e));
            }
        }
        tracing::info!(%volume, component = %id, snapshots = made.len(), "snapshots taken while the copy was away carried to it");
        self.resync_releasing(id, progress, Some(held)).await
    }

    /// Puts `new` (chosen by placement; created here with `reserve_bytes`)
    /// in the layout at `place`, giving it first the volume's snapshots
    /// `chain` (oldest first) as another Active copy of its column holds
    /// them: see the module's invariants. On success `new` is in the layout
    /// as Resyncing with only what changed since the last snapshot dirty;
    /// run [`Coordinator::resync`] on it next. `progress` counts the
    /// snapshots' blocks as they are sent. Hold the volume's snapshots
    /// ([`Coordinator::hold_snapshots`]) before reading `chain` and until
    /// this returns.
    pub async fn add_copy_with_snapshots(
        &self,
        place: NewCopyPlace,
        mut new: ComponentPlacement,
        reserve_bytes: u64,
        chain: &[SnapshotChainLink],
        progress: &ResyncProgress,
    ) -> Result<CarriedSnapshots, BlockError> {
        let volume = self.info.name.clone();
        let at = place.copy();
        let (column, source) = {
            let state = self.state.lock();
            let column = state
                .layout
                .columns
                .iter()
                .position(|m| {
                    m.copies
                        .iter()
                        .any(|c| c.id == at && c.role == ComponentRole::Data)
                })
                .ok_or_else(|| {
                    bad(format!(
                        "component {at} is not a data copy of volume {volume}"
                    ))
                })?;
            // The source must hold every snapshot of the chain: a copy added
            // after a snapshot was taken does not. A lost copy is no source;
            // one that is moving still is.
            let usable = |c: &ComponentPlacement| {
                c.state == ComponentState::Active
                    && (c.id != at || matches!(place, NewCopyPlace::Beside(_)))
            };
            let source = state.layout.columns[column]
                .copies
                .iter()
                .filter(|c| usable(c))
                .find(|c| chain.iter().all(|link| snapshot_copy(link, column, c.id).is_some()))
                .cloned()
                .ok_or_else(|| {
                    bad(format!(
                        "volume {volume}: no Active copy of column {column} holds every snapshot to carry"
                    ))
                })?;
            (column, source)
        };
        new.size_bytes = source.size_bytes;
        self.create_fenced(&new, reserve_bytes, "a new copy")
            .await?;
        let mut made = Vec::new();
        let filled = self
            .fill_snapshots(column, &source, &new, chain, None, progress, &mut made)
            .await;
        let result = match filled {
            Ok(copied_bytes) => self
                .enter_behind_last_snapshot(
                    place,
                    &new,
                    &source,
                    chain.last(),
                    &made,
                    &carried_changes(place, column, &source, chain, &made),
                )
                .await
                .map(|dirty_blocks| CarriedSnapshots {
                    made: made.clone(),
                    source: source.id,
                    copied_bytes,
                    dirty_blocks,
                }),
            Err(e) => Err(Unentered(e)),
        };
        let e = match result {
            Ok(carried) => return Ok(carried),
            // In the layout already: it stays, and its resync fills it.
            Err(Entered(e)) => return Err(e),
            Err(Unentered(e)) => e,
        };
        for (_, m) in made.iter().rev() {
            if let Err(e) = self.io.delete(m).await {
                tracing::warn!(%volume, component = %m.id, error = %e, "snapshot of an unfinished new copy not deleted");
            }
        }
        if let Err(e) = self.io.delete(&new).await {
            tracing::warn!(%volume, component = %new.id, error = %e, "unfinished new copy not deleted");
        }
        Err(e)
    }

    /// Sends `new` each snapshot of `chain` in turn, as what changed since
    /// the one before, and takes its own snapshot after each. The first
    /// is sent whole, or as the blocks `first` lists where `new` may
    /// differ from it. Returns the bytes sent.
    #[allow(clippy::too_many_arguments)]
    async fn fill_snapshots(
        &self,
        column: usize,
        source: &ComponentPlacement,
        new: &ComponentPlacement,
        chain: &[SnapshotChainLink],
        first: Option<Vec<(Lba, u64)>>,
        progress: &ResyncProgress,
        made: &mut Vec<(u64, ComponentPlacement)>,
    ) -> Result<u64, BlockError> {
        let volume = &self.info.name;
        let blocks = source.size_bytes / BLOCK_BYTES;
        let mut copied = 0u64;
        let mut base: Option<ComponentPlacement> = None;
        for link in chain {
            if let Some(reason) = self.superseded() {
                return Err(bad(format!("volume {volume}: {reason}")));
            }
            let from = snapshot_copy(link, column, source.id).expect("source checked to hold it");
            let runs = match (&base, &first) {
                (None, Some(runs)) => Ok(runs.clone()),
                (None, None) => self.io.allocated(&from, Lba(0), blocks).await,
                // A copy that returns differs from each later snapshot only
                // within `first` too: nothing outside it is touched, what
                // the store answers notwithstanding.
                (Some(b), Some(away)) => self
                    .io
                    .changed(&from, b.id, Lba(0), blocks)
                    .await
                    .map(|changed| intersect_runs(&changed, away)),
                (Some(b), None) => self.io.changed(&from, b.id, Lba(0), blocks).await,
            }
            .map_err(|e| {
                bad(format!(
                    "volume {volume}: reading snapshot {} of copy {}: {e}",
                    link.id, source.id
                ))
            })?;
            copied += self
                .copy_snapshot_runs(&from, new, &runs, link.id, progress)
                .await?;
            let snapshot = ComponentPlacement {
                id: new.id.snapshot(link.id),
                state: ComponentState::Active,
                ..new.clone()
            };
            self.io
                .snapshot(new, snapshot.id, self.epoch)
                .await
                .map_err(|e| {
                    bad(format!(
                        "volume {volume}: snapshot {} of the new copy: {e}",
                        link.id
                    ))
                })?;
            made.push((link.id, snapshot));
            base = Some(from);
        }
        Ok(copied)
    }

    /// Copies `runs` (column blocks) of snapshot component `from` (of
    /// snapshot `snapshot`) to `to`, in resync steps that wait their turn
    /// behind guest I/O. Returns the bytes of data copied.
    async fn copy_snapshot_runs(
        &self,
        from: &ComponentPlacement,
        to: &ComponentPlacement,
        runs: &[(Lba, u64)],
        snapshot: u64,
        progress: &ResyncProgress,
    ) -> Result<u64, BlockError> {
        let volume = &self.info.name;
        let total: u64 = runs.iter().map(|(_, n)| n).sum();
        progress
            .left_bytes
            .fetch_add(total * BLOCK_BYTES, Ordering::Relaxed);
        let mut copied = 0;
        for &(lba, n) in runs {
            let mut at = lba.0;
            while at < lba.0 + n {
                if let Some(reason) = self.superseded() {
                    return Err(bad(format!("volume {volume}: {reason}")));
                }
                let step = (lba.0 + n - at).min(RESYNC_STEP_BLOCKS);
                let turn = self
                    .scheduler
                    .admit(&crate::io_scheduler::IoClient::Resync, step * BLOCK_BYTES)
                    .await;
                let bytes = self
                    .copy_range(from, to, at, step)
                    .await
                    .map_err(|(c, e)| {
                        bad(format!(
                            "volume {volume}: carrying snapshot {snapshot} (component {c}): {e}"
                        ))
                    })?;
                drop(turn);
                copied += bytes;
                progress.copied_bytes.fetch_add(bytes, Ordering::Relaxed);
                progress
                    .done_bytes
                    .fetch_add(step * BLOCK_BYTES, Ordering::Relaxed);
                progress
                    .left_bytes
                    .fetch_sub(step * BLOCK_BYTES, Ordering::Relaxed);
                at += step;
            }
        }
        Ok(copied)
    }

    /// Puts `new` at `place`, under the whole volume's range locks, with
    /// the blocks where `source` differs from its `last` snapshot (all it
    /// holds when there is none) left dirty, and its snapshots `made` in
    /// their records, in one record. Returns those blocks.
    async fn enter_behind_last_snapshot(
        &self,
        place: NewCopyPlace,
        new: &ComponentPlacement,
        source: &ComponentPlacement,
        last: Option<&SnapshotChainLink>,
        made: &[(u64, ComponentPlacement)],
        changes: &[SnapshotCopyChange],
    ) -> Result<u64, EnterError> {
        let volume = self.info.name.clone();
        let _guards = self.lock_span(0, self.info.size_bytes).await;
        self.check_usable().map_err(Unentered)?;
        let blocks = source.size_bytes / BLOCK_BYTES;
        let runs = match last {
            Some(link) => {
                self.io
                    .changed(source, source.id.snapshot(link.id), Lba(0), blocks)
                    .await
            }
            None => self.io.allocated(source, Lba(0), blocks).await,
        }
        .map_err(|e| {
            Unentered(bad(format!(
                "volume {volume}: what copy {} changed since its last snapshot: {e}",
                source.id
            )))
        })?;
        let dirty_blocks = runs.iter().map(|(_, n)| n).sum();
        {
            let mut state = self.state.lock();
            let at = place.copy();
            let column = state
                .layout_mut()
                .columns
                .iter_mut()
                .find(|m| m.copies.iter().any(|c| c.id == at))
                .ok_or_else(|| {
                    Unentered(bad(format!(
                        "component {at} is no longer part of volume {volume}"
                    )))
                })?;
            let entering = ComponentPlacement {
                state: ComponentState::Resyncing,
                role: ComponentRole::Data,
                size_bytes: source.size_bytes,
                ..new.clone()
            };
            match place {
                NewCopyPlace::Replacing(lost) => {
                    for slot in column.copies.iter_mut().filter(|c| c.id == lost) {
                        *slot = entering.clone();
                    }
                    state.caught_up(lost);
                }
                NewCopyPlace::Beside(_) => column.copies.push(entering),
            }
            let column_blocks = state.column_blocks(new.id).unwrap_or(blocks);
            let mut recorded = RecordedDirty::empty(column_blocks);
            let mut exact = DirtyRegions::new();
            for (lba, n) in &runs {
                recorded.mark(lba.0, *n);
                exact.insert(lba.0, *n);
            }
            state.dirty.insert(new.id, exact);
            state.recorded.insert(new.id, recorded);
            state.fit_intent_maps();
        }
        let gone = self.record_with_snapshots(changes).await.map_err(Entered)?;
        self.delete_made_of_gone(made, &gone).await;
        Ok(dirty_blocks)
    }

    /// Deletes the snapshots `made` of a returning copy that were not
    /// recorded. Their ids are the same at every attempt, so one a later
    /// owner made again (it fenced the copy first, so the snapshot has its
    /// newer epoch) is left alone, and an owner that learned it was
    /// superseded leaves them all to the next (which deletes what it does
    /// not record before it makes its own).
    async fn delete_unrecorded(&self, made: &[(u64, ComponentPlacement)]) {
        let volume = &self.info.name;
        for (_, m) in made.iter().rev() {
            if self.superseded().is_some() {
                return;
            }
            if let Ok(status) = self.io.status(m).await {
                if status.epoch > self.epoch {
                    continue;
                }
            }
            if let Err(e) = self.io.delete(m).await {
                tracing::warn!(%volume, component = %m.id, error = %e, "snapshot of a returning copy not deleted");
            }
        }
    }

    /// Deletes what was made of the snapshots `gone` (deleted while a copy
    /// was given them): nothing names it.
    async fn delete_made_of_gone(&self, made: &[(u64, ComponentPlacement)], gone: &[u64]) {
        let volume = &self.info.name;
        for (snapshot, m) in made.iter().filter(|(s, _)| gone.contains(s)) {
            if let Err(e) = self.io.delete(m).await {
                tracing::warn!(%volume, %snapshot, component = %m.id, error = %e, "snapshot of a deleted snapshot not deleted");
            }
        }
    }

    /// Drops data copy `id` from the layout as [`Coordinator::drop_copy`]
    /// does, and its snapshots (of `chain`) from their records, in one
    /// record. Returns the components that left with it (its snapshots),
    /// for the caller to delete with the copy.
    pub async fn drop_copy_with_snapshots(
        &self,
        id: ComponentId,
        chain: &[SnapshotChainLink],
    ) -> Result<Vec<ComponentPlacement>, BlockError> {
        let volume = self.info.name.clone();
        let column = {
            let mut state = self.state.lock();
            let Some(column) = state
                .layout
                .columns
                .iter()
                .position(|m| m.copies.iter().any(|c| c.id == id))
            else {
                return Err(bad(format!(
                    "component {id} is not a data copy of volume {volume}"
                )));
            };
            let mirror = &mut state.layout_mut().columns[column];
            if !mirror
                .copies
                .iter()
                .any(|c| c.id != id && c.state == ComponentState::Active)
            {
                return Err(bad(format!(
                    "component {id} is the only Active copy of its column of volume {volume}"
                )));
            }
            mirror.copies.retain(|c| c.id != id);
            state.caught_up(id);
            column
        };
        let leaving: Vec<ComponentPlacement> = chain
            .iter()
            .filter_map(|link| snapshot_copy(link, column, id))
            .collect();
        let changes: Vec<SnapshotCopyChange> = chain
            .iter()
            .filter(|link| snapshot_copy(link, column, id).is_some())
            .map(|link| SnapshotCopyChange {
                snapshot: link.id,
                copy: id,
                edit: SnapshotCopyEdit::Remove,
            })
            .collect();
        self.record_with_snapshots(&changes).await?;
        Ok(leaving)
    }

    /// Records the layout (its generation raised) and the dirty-region
    /// maps with `changes` to the snapshots' records; answers the
    /// snapshots of `changes` that have no record any more.
    async fn record_with_snapshots(
        &self,
        changes: &[SnapshotCopyChange],
    ) -> Result<Vec<u64>, BlockError> {
        let _turn = self.record_turn.lock().await;
        let (layout, dirty) = {
            let mut state = self.state.lock();
            state.layout_mut().generation += 1;
            (state.layout.clone(), state.dirty_record())
        };
        let gone = self
            .recorder
            .record_snapshot_copies(&layout, &dirty, changes)
            .await
            .map_err(|e| bad(format!("volume {}: recording layout: {e}", self.info.name)))?;
        self.state.lock().recorded_as(dirty);
        Ok(gone)
    }
}

/// Why a new copy did not enter the layout as planned, and whether it is
/// in it all the same (its layout could not be recorded).
enum EnterError {
    Unentered(BlockError),
    Entered(BlockError),
}
use EnterError::{Entered, Unentered};

/// The snapshot component of data copy `copy` in column `column` of
/// `link`'s layout, if the snapshot has one there.
fn snapshot_copy(
    link: &SnapshotChainLink,
    column: usize,
    copy: ComponentId,
) -> Option<ComponentPlacement> {
    let id = copy.snapshot(link.id);
    link.layout
        .columns
        .get(column)?
        .copies
        .iter()
        .find(|c| c.id == id)
        .cloned()
}

/// The blocks both `a` and `b` list (each sorted runs of blocks that do
/// not overlap), as sorted runs.
fn intersect_runs(a: &[(Lba, u64)], b: &[(Lba, u64)]) -> Vec<(Lba, u64)> {
    let (mut i, mut j) = (0, 0);
    let mut out: Vec<(Lba, u64)> = Vec::new();
    while i < a.len() && j < b.len() {
        let (a_start, a_end) = (a[i].0 .0, a[i].0 .0 + a[i].1);
        let (b_start, b_end) = (b[j].0 .0, b[j].0 .0 + b[j].1);
        let (start, end) = (a_start.max(b_start), a_end.min(b_end));
        if start < end {
            out.push((Lba(start), end - start));
        }
        if a_end <= b_end {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// How the snapshots `made` of a new copy at `place` change their records:
/// each takes the place of (or joins) the copy's own snapshot where the
/// snapshot has one, and joins `source`'s where it was taken while the
/// copy was away.
fn carried_changes(
    place: NewCopyPlace,
    column: usize,
    source: &ComponentPlacement,
    chain: &[SnapshotChainLink],
    made: &[(u64, ComponentPlacement)],
) -> Vec<SnapshotCopyChange> {
    made.iter()
        .map(|(snapshot, m)| {
            let has_copy = chain
                .iter()
                .find(|link| link.id == *snapshot)
                .is_some_and(|link| snapshot_copy(link, column, place.copy()).is_some());
            if has_copy {
                SnapshotCopyChange {
                    snapshot: *snapshot,
                    copy: place.copy(),
                    edit: place.edit(m.clone()),
                }
            } else {
                SnapshotCopyChange {
                    snapshot: *snapshot,
                    copy: source.id,
                    edit: SnapshotCopyEdit::AddBeside(m.clone()),
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(runs: &[(Lba, u64)]) -> std::collections::BTreeSet<u64> {
        runs.iter().flat_map(|(l, n)| l.0..l.0 + n).collect()
    }

    #[test]
    fn intersected_runs_list_exactly_the_blocks_both_list() {
        type Runs<'a> = &'a [(u64, u64)];
        let cases: [(Runs, Runs); 4] = [
            (&[(0, 10), (20, 5)], &[(5, 20)]),
            (&[(0, 1)], &[(1, 1)]),
            (&[(3, 4), (9, 1), (12, 30)], &[(0, 4), (6, 7), (40, 8)]),
            (&[], &[(0, 100)]),
        ];
        for (a, b) in cases {
            let a: Vec<(Lba, u64)> = a.iter().map(|&(l, n)| (Lba(l), n)).collect();
            let b: Vec<(Lba, u64)> = b.iter().map(|&(l, n)| (Lba(l), n)).collect();
            let got = intersect_runs(&a, &b);
            let want: std::collections::BTreeSet<u64> =
                blocks(&a).intersection(&blocks(&b)).copied().collect();
            assert_eq!(blocks(&got), want, "{a:?} and {b:?}");
            assert!(got.windows(2).all(|w| w[0].0 .0 + w[0].1 <= w[1].0 .0));
        }
    }
}
