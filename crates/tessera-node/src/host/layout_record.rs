//! Where an owner's layout changes and dirty-region maps go: the
//! directory, fenced by epoch.
//!
//! Owns: [`DirectoryLayouts`], the `LayoutRecorder` each coordinator of
//! this host is given.
//! Must not touch: what a layout change means (the coordinator's).
//! Invariants: a layout, dirty-region or snapshot record is written only
//! while the directory still names the recorder's epoch as the volume's
//! highest, and never by a stopping host; a snapshot record never replaces
//! another of the same name; a component that a change takes out of the
//! layout (or out of a snapshot record) gets a reclaim record on its host
//! in the same transaction, so its host deletes it even if it is out of
//! reach now.

use crate::events::{EventCode, EventLog};
use async_trait::async_trait;
use std::sync::Arc;
use tessera_directory::keys::{self, ReclaimReason};
use tessera_directory::{Directory, Keyspace};
use tessera_env::Clock;
use tessera_object::{LayoutRecorder, SnapshotCopyChange, TakenSnapshot};
use tessera_types::dirty::DirtyRecord;
use tessera_types::layout::{ComponentRole, ComponentState, Layout};
use tessera_types::VolumeId;

/// Records an owner's layout changes in the directory, but only while the
/// directory still names this epoch as the volume's highest: a stale owner
/// can never overwrite its successor's layout.
pub(super) struct DirectoryLayouts {
    /// Set when the host stops: a stopping host records nothing, as a
    /// crashed one could not, so its last writes are never acknowledged on
    /// the strength of a layout change its successor would not see.
    pub(super) halted: Arc<std::sync::atomic::AtomicBool>,
    pub(super) directory: Arc<dyn Directory>,
    pub(super) keys: Keyspace,
    pub(super) volume: VolumeId,
    pub(super) epoch: tessera_types::Epoch,
    /// The layout as last recorded (at first, as read at take-over): a
    /// component it has and the next one lacks is to be reclaimed.
    pub(super) last: parking_lot::Mutex<Layout>,
    /// Dates reclaim records.
    pub(super) clock: Arc<dyn Clock>,
    /// Hears each component's change of state once it is recorded.
    pub(super) events: Arc<EventLog>,
}

impl DirectoryLayouts {
    /// Writes `puts` in one transaction, if this epoch is still the
    /// volume's highest and the host is not stopping.
    async fn put_fenced(&self, puts: Vec<tessera_directory::TxnOp>) -> Result<(), String> {
        self.put_fenced_when(Vec::new(), puts).await
    }

    /// [`DirectoryLayouts::put_fenced`], if `compares` hold too.
    async fn put_fenced_when(
        &self,
        compares: Vec<tessera_directory::Compare>,
        puts: Vec<tessera_directory::TxnOp>,
    ) -> Result<(), String> {
        if self.halted.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(format!(
                "host coordinating volume {} is stopping",
                self.volume
            ));
        }
        let epoch_key = self.keys.owner_epoch(&self.volume);
        let holds = epoch_key
            .holds(&keys::OwnerEpochRecord {
                volume: self.volume.clone(),
                epoch: self.epoch,
            })
            .map_err(|e| e.to_string())?;
        let outcome = self
            .directory
            .txn(
                tessera_directory::Txn::new()
                    .when(std::iter::once(holds).chain(compares))
                    .and_then(puts),
            )
            .await
            .map_err(|e| e.to_string())?;
        if outcome.succeeded {
            Ok(())
        } else {
            Err(format!(
                "volume {} is now owned at a newer epoch than {}",
                self.volume, self.epoch
            ))
        }
    }

    /// Reclaim records for the components of `before` that `after` no
    /// longer has.
    fn reclaims_between(
        &self,
        before: &Layout,
        after: &Layout,
    ) -> Result<Vec<tessera_directory::TxnOp>, String> {
        let now = self.clock.wall_ms();
        before
            .components()
            .filter(|c| after.component(c.id).is_none())
            .map(|c| {
                self.keys
                    .reclaim_op(&self.volume, c, ReclaimReason::Replaced, now)
                    .map_err(|e| e.to_string())
            })
            .collect()
    }

    /// Tells the event log of each component whose state `after` (as
    /// recorded) changed from `before`.
    fn tell_state_changes(&self, before: &Layout, after: &Layout) {
        for c in after.components() {
            let Some(was) = before.component(c.id).map(|b| b.state) else {
                continue;
            };
            if was == c.state {
                continue;
            }
            let code = match c.state {
                ComponentState::Active => EventCode::ComponentActive,
                ComponentState::Absent => EventCode::ComponentAbsent,
                ComponentState::Resyncing => EventCode::ComponentResyncing,
                ComponentState::Degraded => EventCode::ComponentDegraded,
            };
            self.events.emit(
                code,
                self.volume.as_str(),
                format!(
                    "{}'s {} {} on {} is {} (was {}), layout generation {}",
                    self.volume,
                    match c.role {
                        ComponentRole::Data => "copy",
                        ComponentRole::Witness => "witness",
                    },
                    c.id,
                    c.host,
                    state_word(c.state),
                    state_word(was),
                    after.generation
                ),
            );
        }
    }

    fn dirty_put(&self, dirty: &DirtyRecord) -> Result<tessera_directory::TxnOp, String> {
        self.keys
            .dirty_regions(&self.volume)
            .put_op(dirty, None)
            .map_err(|e| e.to_string())
    }
}

#[async_trait]
impl LayoutRecorder for DirectoryLayouts {
    async fn record(&self, layout: &Layout, dirty: &DirtyRecord) -> Result<(), String> {
        let put = self
            .keys
            .layout(&self.volume)
            .put_op(layout, None)
            .map_err(|e| e.to_string())?;
        let before = self.last.lock().clone();
        let mut puts = vec![put, self.dirty_put(dirty)?];
        puts.extend(self.reclaims_between(&before, layout)?);
        self.put_fenced(puts).await?;
        *self.last.lock() = layout.clone();
        self.tell_state_changes(&before, layout);
        Ok(())
    }

    async fn record_dirty(&self, dirty: &DirtyRecord) -> Result<(), String> {
        self.put_fenced(vec![self.dirty_put(dirty)?]).await
    }

    async fn record_snapshot(&self, snapshot: &TakenSnapshot) -> Result<(), String> {
        let name = keys::SnapshotName::new(&snapshot.name)?;
        let volume = keys::get(self.directory.as_ref(), &self.keys.volume(&self.volume))
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("volume {} is gone", self.volume))?
            .value;
        let key = self.keys.snapshot(&self.volume, &name);
        let record = keys::SnapshotRecord {
            volume: self.volume.clone(),
            name: name.clone(),
            id: snapshot.id,
            created_ms: snapshot.created_ms,
            size_bytes: snapshot.layout.size_bytes,
            block_bytes: volume.block_bytes,
            epoch: snapshot.epoch,
            layout: snapshot.layout.clone(),
            group: Vec::new(),
        };
        let put = key.put_op(&record, None).map_err(|e| e.to_string())?;
        match self.put_fenced_when(vec![key.absent()], vec![put]).await {
            Ok(()) => Ok(()),
            Err(e) => {
                let exists = keys::get(self.directory.as_ref(), &key)
                    .await
                    .ok()
                    .flatten()
                    .is_some();
                Err(if exists {
                    format!("volume {} already has a snapshot named {name}", self.volume)
                } else {
                    e
                })
            }
        }
    }

    async fn record_snapshot_copies(
        &self,
        layout: &Layout,
        dirty: &DirtyRecord,
        changes: &[SnapshotCopyChange],
    ) -> Result<Vec<u64>, String> {
        let layout_put = self
            .keys
            .layout(&self.volume)
            .put_op(layout, None)
            .map_err(|e| e.to_string())?;
        // Each snapshot record is rewritten only as read: one deleted or
        // changed meanwhile makes the transaction fail, and it is read
        // again.
        let mut last_error = String::new();
        let before = self.last.lock().clone();
        for _ in 0..CARRY_ATTEMPTS {
            let listing = keys::list(
                self.directory.as_ref(),
                &self.keys.snapshots_of(&self.volume),
            )
            .await
            .map_err(|e| e.to_string())?;
            let mut compares = Vec::new();
            let mut puts = vec![layout_put.clone(), self.dirty_put(dirty)?];
            puts.extend(self.reclaims_between(&before, layout)?);
            let mut gone: Vec<u64> = changes.iter().map(|c| c.snapshot).collect();
            for entry in listing.records {
                let mut record = entry.value;
                let taken = record.layout.clone();
                let mine: Vec<&SnapshotCopyChange> =
                    changes.iter().filter(|c| c.snapshot == record.id).collect();
                if mine.is_empty() {
                    continue;
                }
                let mut changed = false;
                for c in mine {
                    if c.apply(&mut record.layout) {
                        changed = true;
                        gone.retain(|s| *s != c.snapshot);
                    }
                }
                if changed {
                    // A copy's snapshot that leaves the record with it is
                    // reclaimed on its host.
                    puts.extend(self.reclaims_between(&taken, &record.layout)?);
                    let key = self.keys.snapshot(&self.volume, &record.name);
                    compares.push(key.at_revision(entry.mod_revision));
                    puts.push(key.put_op(&record, None).map_err(|e| e.to_string())?);
                }
            }
            match self.put_fenced_when(compares, puts).await {
                Ok(()) => {
                    *self.last.lock() = layout.clone();
                    return Ok(gone);
                }
                Err(e) => last_error = e,
            }
        }
        Err(last_error)
    }
}

/// How many times a copy's snapshots are put in (or taken out of) their
/// records while snapshots are being deleted meanwhile.
const CARRY_ATTEMPTS: usize = 5;

/// A component state as events say it.
fn state_word(state: ComponentState) -> &'static str {
    match state {
        ComponentState::Active => "active",
        ComponentState::Absent => "absent",
        ComponentState::Resyncing => "resyncing",
        ComponentState::Degraded => "degraded",
    }
}
