//! Full clones being filled: the owner of a volume whose record carries a
//! fill (`VolumeRecord::fill`) copies the snapshot it names into it,
//! through the volume's coordinator.
//!
//! Owns: the fill task of each such volume this host coordinates (one per
//! coordinator: a new owner, or this host at a new epoch, starts its own);
//! the walk of the snapshot's allocation (ranges it does not map are
//! skipped; the rest is read from any copy of the snapshot on the resync
//! queue and written in pieces of about 1 MiB, on 1 MiB boundaries,
//! skipping pieces that read as zeros); the position and progress kept in
//! the volume's record; the fill's end (the record's fill cleared); and the
//! message frontends give a client that asks for a volume being filled.
//! Must not touch: client I/O (the catalogs refuse a volume being filled,
//! so nothing but its fill writes to it), the snapshot (only read), the
//! decisions of ownership (the control core's).
//! Invariants:
//! - every byte below the recorded position is on every copy of the volume
//!   that receives writes: it was written through the owner's coordinator
//!   (so to every copy, and a copy that misses it is Absent with those
//!   blocks in its dirty map) and acknowledged before the position was
//!   recorded. A later owner starts at the position: nothing below it is
//!   copied again, nothing above it is taken for done;
//! - the position is recorded only under this owner's epoch (the
//!   directory's owner epoch for the volume is still its own), only over
//!   the record it read (compared on its revision), never by a stopping
//!   host, and never moves back: a stale owner records nothing, and a
//!   volume deleted meanwhile is not brought back;
//! - the fill ends (the record's fill cleared) only once the whole address
//!   space is below the position and the coordinator flushed; clients are
//!   served from then on.

use super::Host;
use crate::control::FillView;
use crate::error::FillError;
use crate::snapshot_export::SnapshotDevice;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tessera_blockdev::{BlockDevice, ExtentKind, WriteFlags};
use tessera_directory::keys::{self, VolumeFill, VolumeRecord, VolumeState};
use tessera_object::Coordinator;
use tessera_types::{format_size, VolumeId};

/// Bytes copied per write: the fill reads and writes pieces of at most
/// this, on boundaries of it.
pub const FILL_PIECE_BYTES: u64 = 1 << 20;
/// Address space whose allocation in the snapshot is asked for at once.
const FILL_WINDOW_BYTES: u64 = 64 << 20;
/// How often the position is recorded while the fill goes on.
const FILL_RECORD_EVERY: Duration = Duration::from_secs(1);
/// Pause before a fill that failed is tried again.
const FILL_RETRY: Duration = Duration::from_secs(2);
/// Attempts at recording the position when the record changes under it.
const FILL_RECORD_ATTEMPTS: usize = 5;

/// What a client asking for `record`'s volume is told while it is being
/// filled; None for a volume that is not.
pub fn fill_refusal(record: &VolumeRecord) -> Option<String> {
    let fill = record.fill.as_ref()?;
    let view = FillView::new(fill, record.size_bytes);
    let eta = view
        .eta_s
        .map(|s| format!(", about {s}s left"))
        .unwrap_or_default();
    Some(format!(
        "volume {} is being filled from snapshot {} ({}%: {} of {} done{eta}): it serves clients once the fill ends (`tessera volume show {}` shows the progress)",
        record.name,
        view.from,
        view.percent(),
        format_size(view.done_bytes),
        format_size(record.size_bytes),
        record.name,
    ))
}

/// Where a run of the fill stands, between two records of it.
struct Progress {
    /// Address space done (all of it below is on every copy).
    done: u64,
    /// Data written so far, over every run.
    copied: u64,
    /// Where this run began.
    began_at: u64,
    /// When this run began.
    began: Duration,
    /// When the position was last recorded.
    recorded: Duration,
}

impl Host {
    /// Starts the fill of every volume this host coordinates whose record
    /// says it is being filled, unless its coordinator already runs one.
    pub(super) fn start_fills(self: &Arc<Self>) {
        for (volume, coordinator) in self.owned() {
            let filling = self
                .view
                .volumes
                .read()
                .get(&volume)
                .is_some_and(|r| r.state == VolumeState::Ready && r.fill.is_some());
            if !filling || coordinator.superseded().is_some() {
                continue;
            }
            {
                let mut running = self.fills.lock();
                if running.get(&volume) == Some(&coordinator.epoch()) {
                    continue;
                }
                running.insert(volume.clone(), coordinator.epoch());
            }
            let task = tokio::spawn(fill_task(Arc::downgrade(self), volume, coordinator));
            self.tasks.lock().push(task);
        }
    }

    /// One run of the fill of `volume` by `coordinator`, from the recorded
    /// position to the end.
    async fn fill(
        &self,
        volume: &VolumeId,
        coordinator: &Arc<Coordinator>,
    ) -> Result<(), FillError> {
        let record = keys::get(self.directory.as_ref(), &self.keys.volume(volume))
            .await
            .map_err(|e| FillError::Record {
                volume: volume.clone(),
                from: "its snapshot".into(),
                reason: e.to_string(),
            })?
            .map(|r| r.value);
        let Some((record, fill)) = record.and_then(|r| {
            let fill = r.fill.clone()?;
            (r.state == VolumeState::Ready).then_some((r, fill))
        }) else {
            return Err(FillError::NotHere {
                volume: volume.clone(),
                from: "its snapshot".into(),
                reason: "the volume is not being filled".into(),
            });
        };
        let from = format!("{}@{}", fill.source, fill.snapshot);
        let snapshot = self
            .snapshot(&fill.source, &fill.snapshot)
            .filter(|s| s.id == fill.snapshot_id)
            .ok_or_else(|| FillError::SnapshotGone {
                volume: volume.clone(),
                from: from.clone(),
            })?;
        let size = record.size_bytes.min(snapshot.size_bytes);
        let source = SnapshotDevice::new(snapshot, self.components(&fill.source), self.id.clone())
            .for_background_copy();
        let now = self.clock.monotonic();
        let mut progress = Progress {
            done: fill.done_bytes,
            copied: fill.copied_bytes,
            began_at: fill.done_bytes,
            began: now,
            recorded: now,
        };
        // This run is recorded as it begins: `volume show` says where it
        // took up the fill.
        let runs = fill.runs + 1;
        let began_at = progress.began_at;
        self.update_fill(volume, coordinator, &fill, &from, |f| {
            f.runs = runs;
            f.resumed_from_bytes = began_at;
            f.error = None;
        })
        .await?;
        tracing::info!(host = %self.id, %volume, %from, position = progress.done, run = runs, "filling a full clone");
        while progress.done < size {
            let window_end = (progress.done + FILL_WINDOW_BYTES).min(size);
            self.still_filling(volume, coordinator, &fill, &from)?;
            let extents = source
                .block_status(progress.done, window_end - progress.done)
                .await
                .map_err(|e| FillError::Read {
                    volume: volume.clone(),
                    from: from.clone(),
                    offset: progress.done,
                    reason: e.to_string(),
                })?;
            for extent in extents.iter().filter(|e| e.kind == ExtentKind::Data) {
                let end = extent.offset + extent.len;
                let mut at = extent.offset.max(progress.done);
                while at < end {
                    let piece_end = ((at / FILL_PIECE_BYTES + 1) * FILL_PIECE_BYTES).min(end);
                    self.still_filling(volume, coordinator, &fill, &from)?;
                    self.copy_piece(volume, coordinator, &source, &from, at, piece_end - at)
                        .await
                        .map(|copied| progress.copied += copied)?;
                    at = piece_end;
                    progress.done = at;
                    self.record_progress(volume, coordinator, &fill, &from, &mut progress)
                        .await?;
                }
            }
            progress.done = window_end;
            self.record_progress(volume, coordinator, &fill, &from, &mut progress)
                .await?;
        }
        coordinator.flush().await.map_err(|e| FillError::Write {
            volume: volume.clone(),
            from: from.clone(),
            offset: size,
            reason: e.to_string(),
        })?;
        // The end: the fill leaves the record, and the volume is an
        // ordinary one from the next look at the directory on.
        let copied = progress.copied;
        self.update_fill_then(volume, coordinator, &fill, &from, |record| {
            record.fill = None;
        })
        .await?;
        tracing::info!(host = %self.id, %volume, %from, copied_bytes = copied, "full clone filled: it serves clients now");
        Ok(())
    }

    /// Copies `len` bytes at `offset` of the snapshot into the volume,
    /// unless they read as zeros (the new volume reads zeros there already);
    /// answers the bytes written.
    async fn copy_piece(
        &self,
        volume: &VolumeId,
        coordinator: &Arc<Coordinator>,
        source: &SnapshotDevice,
        from: &str,
        offset: u64,
        len: u64,
    ) -> Result<u64, FillError> {
        let data = source
            .read(offset, len)
            .await
            .map_err(|e| FillError::Read {
                volume: volume.clone(),
                from: from.to_string(),
                offset,
                reason: e.to_string(),
            })?;
        if data.iter().all(|&b| b == 0) {
            return Ok(0);
        }
        // The volume's own turn in the host's I/O scheduler: its policy's
        // limits pace the fill, and it shares the host with other volumes
        // by weight.
        let _turn = coordinator.guest_turn(len).await;
        coordinator
            .write(offset, data, WriteFlags { fua: false })
            .await
            .map_err(|e| FillError::Write {
                volume: volume.clone(),
                from: from.to_string(),
                offset,
                reason: e.to_string(),
            })?;
        Ok(len)
    }

    /// Records the position, the data copied and the pace, when the last
    /// record is old enough.
    async fn record_progress(
        &self,
        volume: &VolumeId,
        coordinator: &Arc<Coordinator>,
        fill: &VolumeFill,
        from: &str,
        progress: &mut Progress,
    ) -> Result<(), FillError> {
        let now = self.clock.monotonic();
        if now.saturating_sub(progress.recorded) < FILL_RECORD_EVERY {
            return Ok(());
        }
        let elapsed = now.saturating_sub(progress.began).as_secs_f64();
        let rate = if elapsed > 0.0 {
            ((progress.done - progress.began_at) as f64 / elapsed) as u64
        } else {
            0
        };
        let (done, copied, wall) = (progress.done, progress.copied, self.clock.wall_ms());
        self.update_fill(volume, coordinator, fill, from, |f| {
            f.done_bytes = done;
            f.copied_bytes = copied;
            f.rate_bytes_per_s = rate;
            f.updated_ms = wall;
            f.error = None;
        })
        .await?;
        progress.recorded = now;
        Ok(())
    }

    /// Whether `coordinator` still runs `fill` of `volume` here: it is this
    /// host's coordinator of the volume, not superseded, and the view still
    /// has the volume being filled from the same snapshot.
    fn still_filling(
        &self,
        volume: &VolumeId,
        coordinator: &Arc<Coordinator>,
        fill: &VolumeFill,
        from: &str,
    ) -> Result<(), FillError> {
        let not_here = |reason: &str| FillError::NotHere {
            volume: volume.clone(),
            from: from.to_string(),
            reason: reason.to_string(),
        };
        if self.halted.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(not_here("the host is stopping"));
        }
        let current = self
            .owned
            .read()
            .get(volume)
            .is_some_and(|c| Arc::ptr_eq(c, coordinator));
        if !current || coordinator.superseded().is_some() {
            return Err(not_here("this host no longer coordinates the volume"));
        }
        let filling = self.view.volumes.read().get(volume).is_some_and(|r| {
            r.state == VolumeState::Ready
                && r.fill
                    .as_ref()
                    .is_some_and(|f| f.snapshot_id == fill.snapshot_id)
        });
        if !filling {
            return Err(not_here("the volume was deleted or its fill ended"));
        }
        Ok(())
    }

    /// Changes the fill in `volume`'s record with `change`, under
    /// `coordinator`'s epoch.
    async fn update_fill(
        &self,
        volume: &VolumeId,
        coordinator: &Arc<Coordinator>,
        fill: &VolumeFill,
        from: &str,
        change: impl Fn(&mut VolumeFill),
    ) -> Result<(), FillError> {
        self.update_fill_then(volume, coordinator, fill, from, |record| {
            if let Some(f) = record.fill.as_mut() {
                change(f);
            }
        })
        .await
    }

    /// Changes `volume`'s record with `change` (while it is still being
    /// filled from `fill`'s snapshot), only if the directory still names
    /// `coordinator`'s epoch as the volume's highest and the record is the
    /// one read; a record changed meanwhile is read again.
    async fn update_fill_then(
        &self,
        volume: &VolumeId,
        coordinator: &Arc<Coordinator>,
        fill: &VolumeFill,
        from: &str,
        change: impl Fn(&mut VolumeRecord),
    ) -> Result<(), FillError> {
        let not_here = |reason: String| FillError::NotHere {
            volume: volume.clone(),
            from: from.to_string(),
            reason,
        };
        let failed = |reason: String| FillError::Record {
            volume: volume.clone(),
            from: from.to_string(),
            reason,
        };
        let epoch = coordinator.epoch();
        for _ in 0..FILL_RECORD_ATTEMPTS {
            if self.halted.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(not_here("the host is stopping".into()));
            }
            let key = self.keys.volume(volume);
            let Some(read) = keys::get(self.directory.as_ref(), &key)
                .await
                .map_err(|e| failed(e.to_string()))?
            else {
                return Err(not_here("the volume was deleted".into()));
            };
            let mut record = read.value;
            let ours = record.state == VolumeState::Ready
                && record
                    .fill
                    .as_ref()
                    .is_some_and(|f| f.snapshot_id == fill.snapshot_id);
            if !ours {
                return Err(not_here(
                    "the volume is being deleted or its fill ended".into(),
                ));
            }
            let before = record.fill.as_ref().map_or(0, |f| f.done_bytes);
            change(&mut record);
            if record.fill.as_ref().is_some_and(|f| f.done_bytes < before) {
                return Err(not_here(format!(
                    "the recorded position ({before}) is past this run's"
                )));
            }
            let holds = self
                .keys
                .owner_epoch(volume)
                .holds(&keys::OwnerEpochRecord {
                    volume: volume.clone(),
                    epoch,
                })
                .map_err(|e| failed(e.to_string()))?;
            let put = key
                .put_op(&record, None)
                .map_err(|e| failed(e.to_string()))?;
            let outcome = self
                .directory
                .txn(
                    tessera_directory::Txn::new()
                        .when([holds, key.at_revision(read.mod_revision)])
                        .and_then([put]),
                )
                .await
                .map_err(|e| failed(e.to_string()))?;
            if outcome.succeeded {
                return Ok(());
            }
            let now = keys::get(self.directory.as_ref(), &self.keys.owner_epoch(volume))
                .await
                .map_err(|e| failed(e.to_string()))?
                .map(|r| r.value.epoch);
            if now != Some(epoch) {
                return Err(not_here(format!(
                    "the volume is owned at another epoch than {epoch} now"
                )));
            }
        }
        Err(failed("its record kept changing".into()))
    }
}

/// Runs the fill of `volume` on `coordinator` until it ends or is no
/// longer this host's to run; a run that fails is tried again from the
/// recorded position after [`FILL_RETRY`], its reason in the record.
async fn fill_task(weak: Weak<Host>, volume: VolumeId, coordinator: Arc<Coordinator>) {
    let epoch = coordinator.epoch();
    loop {
        let Some(host) = weak.upgrade() else { return };
        match host.fill(&volume, &coordinator).await {
            Ok(()) => break,
            Err(e @ FillError::NotHere { .. }) => {
                tracing::info!(host = %host.id, %volume, reason = %e, "fill stopped here");
                break;
            }
            Err(e) => {
                let fill = host
                    .view
                    .volumes
                    .read()
                    .get(&volume)
                    .and_then(|r| r.fill.clone());
                let Some(fill) = fill else { break };
                let from = format!("{}@{}", fill.source, fill.snapshot);
                // A failure because the volume went (deleted while its
                // writes were under way) or moved is no failure of the fill.
                if let Err(gone) = host.still_filling(&volume, &coordinator, &fill, &from) {
                    tracing::info!(host = %host.id, %volume, reason = %gone, "fill stopped here");
                    break;
                }
                tracing::warn!(host = %host.id, %volume, error = %e, "fill stopped; trying again from the recorded position");
                let reason = e.to_string();
                let recorded = host.update_fill(&volume, &coordinator, &fill, &from, |f| {
                    f.error = Some(reason.clone());
                });
                if let Err(e) = recorded.await {
                    tracing::debug!(%volume, error = %e, "the fill's failure was not recorded");
                }
            }
        }
        drop(host);
        tokio::time::sleep(FILL_RETRY).await;
    }
    if let Some(host) = weak.upgrade() {
        let mut running = host.fills.lock();
        if running.get(&volume) == Some(&epoch) {
            running.remove(&volume);
        }
    }
}
