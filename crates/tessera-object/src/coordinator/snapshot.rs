//! Snapshots of a volume: one point in time on every copy.
//!
//! Owns: [`Coordinator::snapshot`], which orders a snapshot between the
//! volume's writes and takes it on every data copy, and
//! [`snapshot_layout`], the layout a snapshot's components form. Must not
//! touch: the store (snapshots are taken through
//! [`ComponentIo::snapshot`](crate::ComponentIo::snapshot)), names and
//! records of snapshots (kept above, in the directory).
//!
//! Invariants:
//! - a snapshot holds the whole volume's range locks while it is taken:
//!   every write, unmap or share in flight ends first and none starts until
//!   every copy has its snapshot, so all copies' snapshots hold the same
//!   writes (crash-consistent: an acknowledged write is in it or came after
//!   it, never half of one);
//! - it is taken on the Active data copies only: a copy that is away
//!   (Absent, or lost and waiting for its rebuild) is left out of the
//!   snapshot's layout and given the snapshot when it returns, before it
//!   receives writes again ([`Coordinator::resync_with_snapshots`]); a copy
//!   that is catching up (Resyncing) receives writes but misses some, so a
//!   snapshot then is refused until its resync ends; each column keeps at
//!   least one Active copy in the snapshot;
//! - it is taken at the owner's epoch, so a stale owner cannot take one;
//!   a copy that fails leaves no snapshot on the others (they are deleted
//!   again) and the caller gets the failure.

use futures::future::join_all;
use tessera_blockdev::BlockError;
use tessera_types::layout::{ComponentPlacement, ComponentRole, ComponentState, Layout};
use tessera_types::ComponentId;

use super::{bad, Coordinator};
use crate::component_io::TakenSnapshot;
use crate::range_lock::RangeGuard;
use std::sync::Arc;
use std::time::Duration;

/// The layout of a snapshot of a volume laid out as `volume`: the same
/// columns and stripe unit, each Active data copy replaced by its snapshot
/// (`snapshot_of` names it), no witnesses, no copy that was away. Reads of
/// the snapshot go to any copy of each column: they are identical and
/// never change.
pub fn snapshot_layout(
    volume: &Layout,
    snapshot_of: impl Fn(ComponentId) -> ComponentId,
) -> Layout {
    let mut layout = volume.clone();
    layout.witnesses.clear();
    for column in &mut layout.columns {
        column
            .copies
            .retain(|c| c.role == ComponentRole::Data && c.state == ComponentState::Active);
        for copy in &mut column.copies {
            copy.id = snapshot_of(copy.id);
        }
    }
    layout
}

impl Coordinator {
    /// Takes snapshot number `id`, named `name`, of the volume: on every
    /// data copy, a read-only component that holds what the copy holds now
    /// (its id made from the copy's and `id`: [`ComponentId::snapshot`]),
    /// then records it through the coordinator's recorder, under its epoch,
    /// before any write goes on. Writes to the volume wait meanwhile; it is
    /// refused, and nothing is left behind, unless no copy is Resyncing,
    /// every column has an Active copy, every Active copy takes it and it
    /// is recorded (copies that are away get it when they return). Returns
    /// the snapshot's layout.
    pub async fn snapshot(
        &self,
        name: &str,
        id: u64,
        created_ms: u64,
    ) -> Result<Layout, BlockError> {
        let _guards = self.lock_span(0, self.info.size_bytes).await;
        self.snapshot_while_held(name, id, created_ms).await
    }

    /// Holds every write to the volume under `hold`: those under way end
    /// first, none starts until [`Coordinator::release_writes`] or until
    /// `ttl` passes (so a requester that vanishes cannot stop the volume
    /// for longer). Returns once held. A consistency group's snapshot holds
    /// all its volumes, then takes each one's with
    /// [`Coordinator::snapshot_held`]: no write to one comes after a write
    /// to another that the snapshots leave out.
    pub async fn hold_writes(self: &Arc<Self>, hold: u64, ttl: Duration) -> Result<(), BlockError> {
        self.check_usable()?;
        if self.write_holds.lock().contains_key(&hold) {
            return Ok(());
        }
        let guards = self.lock_span(0, self.info.size_bytes).await;
        self.write_holds.lock().insert(
            hold,
            WriteHold {
                _guards: guards,
                in_use: false,
            },
        );
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(ttl).await;
            loop {
                let Some(c) = weak.upgrade() else { return };
                {
                    let mut holds = c.write_holds.lock();
                    match holds.get(&hold) {
                        None => return,
                        Some(h) if !h.in_use => {
                            holds.remove(&hold);
                            tracing::warn!(volume = %c.info.name, %hold, "hold of writes expired before it was released");
                            return;
                        }
                        // A snapshot is being taken under it: it ends first.
                        Some(_) => {}
                    }
                }
                drop(c);
                tokio::time::sleep(HOLD_RECHECK).await;
            }
        });
        Ok(())
    }

    /// Ends hold `hold`; false if it had ended already.
    pub fn release_writes(&self, hold: u64) -> bool {
        self.write_holds.lock().remove(&hold).is_some()
    }

    /// [`Coordinator::snapshot`] while `hold` holds the volume's writes
    /// (it keeps holding them); refused if the hold has ended.
    pub async fn snapshot_held(
        &self,
        hold: u64,
        name: &str,
        id: u64,
        created_ms: u64,
    ) -> Result<Layout, BlockError> {
        {
            let mut holds = self.write_holds.lock();
            let Some(h) = holds.get_mut(&hold) else {
                return Err(bad(format!(
                    "volume {}: its writes are no longer held (the hold expired or its owner changed)",
                    self.info.name
                )));
            };
            h.in_use = true;
        }
        let taken = self.snapshot_while_held(name, id, created_ms).await;
        if let Some(h) = self.write_holds.lock().get_mut(&hold) {
            h.in_use = false;
        }
        taken
    }

    /// Takes the snapshot; the caller holds the whole volume's range locks.
    async fn snapshot_while_held(
        &self,
        name: &str,
        id: u64,
        created_ms: u64,
    ) -> Result<Layout, BlockError> {
        let snapshot_of = |c: ComponentId| c.snapshot(id);
        self.check_usable()?;
        if self
            .copies_joining
            .load(std::sync::atomic::Ordering::SeqCst)
            > 0
        {
            return Err(bad(format!(
                "volume {}: a copy is being given the volume's snapshots (a rebuild, an evacuation or a copy that returned); take the snapshot once it has them",
                self.info.name
            )));
        }
        let (layout, epoch) = {
            let state = self.state.lock();
            (state.layout.clone(), self.epoch())
        };
        let data = || {
            layout
                .columns
                .iter()
                .flat_map(|m| m.copies.iter())
                .filter(|c| c.role == ComponentRole::Data)
        };
        if let Some(behind) = data().find(|c| c.state == ComponentState::Resyncing) {
            return Err(bad(format!(
                "volume {}: copy {} on host {} is catching up on what it missed (Resyncing); take the snapshot once its resync has finished",
                self.info.name, behind.id, behind.host
            )));
        }
        if let Some(column) = layout.columns.iter().position(|m| {
            !m.copies
                .iter()
                .any(|c| c.role == ComponentRole::Data && c.state == ComponentState::Active)
        }) {
            return Err(bad(format!(
                "volume {}: column {column} has no Active copy to take the snapshot on",
                self.info.name
            )));
        }
        let copies: Vec<&ComponentPlacement> = data()
            .filter(|c| c.state == ComponentState::Active)
            .collect();
        let away: Vec<String> = data()
            .filter(|c| c.state != ComponentState::Active)
            .map(|c| format!("{} on host {}", c.id, c.host))
            .collect();
        if !away.is_empty() {
            tracing::info!(volume = %self.info.name, snapshot = %name, away = %away.join(", "), "snapshot taken without the copies that are away; they get it when they return");
        }
        let results = join_all(
            copies
                .iter()
                .map(|c| self.io.snapshot(c, snapshot_of(c.id), epoch)),
        )
        .await;
        let mut failed: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
            .collect();
        let taken = snapshot_layout(&layout, snapshot_of);
        if failed.is_empty() {
            let record = TakenSnapshot {
                name: name.to_string(),
                id,
                created_ms,
                epoch,
                layout: taken.clone(),
            };
            if let Err(e) = self.recorder.record_snapshot(&record).await {
                failed.push(format!("not recorded: {e}"));
            }
        }
        if !failed.is_empty() {
            // Leave no partial snapshot: delete what the other copies made.
            let made: Vec<ComponentPlacement> = copies
                .iter()
                .zip(&results)
                .filter(|(_, r)| r.is_ok())
                .map(|(c, _)| ComponentPlacement {
                    id: snapshot_of(c.id),
                    ..(*c).clone()
                })
                .collect();
            for m in &made {
                if let Err(e) = self.io.delete(m).await {
                    tracing::warn!(volume = %self.info.name, component = %m.id, error = %e, "could not delete part of a failed snapshot");
                }
            }
            return Err(bad(format!(
                "volume {}: snapshot not taken: {}",
                self.info.name,
                failed.join("; ")
            )));
        }
        Ok(taken)
    }
}

/// How often an expired hold looks again whether the snapshot taken under
/// it has ended.
const HOLD_RECHECK: Duration = Duration::from_millis(50);

/// A hold of every write to a volume.
pub(super) struct WriteHold {
    /// The whole volume's range locks.
    _guards: Vec<RangeGuard>,
    /// A snapshot is being taken under it: it does not expire meanwhile.
    in_use: bool,
}
