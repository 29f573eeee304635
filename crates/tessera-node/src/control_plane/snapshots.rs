//! Snapshots of volumes as the control plane manages them: taking one (by
//! the volume's owner, wherever it runs), listing, deleting.
//!
//! Owns: checking a request (names, the volume, duplicates), handing the
//! snapshot to the owner (through a volume handle: locally or over the
//! transport), the views, and deleting a snapshot's components and record.
//! Must not touch: ordering a snapshot against writes (the owner's
//! coordinator does it, and records the snapshot under its epoch).
//! Invariant: a snapshot's record goes only after every one of its
//! components is gone (a host that is down keeps the record, and the
//! delete can be asked again), so no component is ever left unnamed.

use super::{internal, ControlPlane};
use crate::control::{ControlError, CreateSnapshot, SnapshotComponentView, SnapshotView};
use tessera_blockdev::BlockError;
use tessera_directory::keys::{self, SnapshotName, SnapshotRecord, VolumeState};
use tessera_object::{ComponentError, ComponentIo};
use tessera_types::VolumeId;

/// How a snapshot is shown.
pub(super) fn snapshot_view(r: &SnapshotRecord) -> SnapshotView {
    SnapshotView {
        volume: r.volume.to_string(),
        name: r.name.to_string(),
        export: crate::snapshot_export::export_name(r),
        created_ms: r.created_ms,
        size_bytes: r.size_bytes,
        epoch: r.epoch.0,
        components: r
            .layout
            .components()
            .map(|c| SnapshotComponentView {
                id: c.id.to_string(),
                host: c.host.to_string(),
                disk_group: c.disk_group.to_string(),
            })
            .collect(),
    }
}

fn snapshot_name(name: &str) -> Result<SnapshotName, ControlError> {
    SnapshotName::new(name).map_err(ControlError::Invalid)
}

impl ControlPlane {
    pub(super) async fn take_snapshot(
        &self,
        volume: &str,
        request: CreateSnapshot,
    ) -> Result<SnapshotView, ControlError> {
        let name = snapshot_name(&request.name)?;
        let _guard = self.changes.lock().await;
        let (record, _) = self.volume_record(volume).await?;
        if record.state != VolumeState::Ready {
            return Err(ControlError::Conflict(format!(
                "volume {volume} is {:?}: a snapshot is taken of a ready volume",
                record.state
            )));
        }
        let key = self.keys.snapshot(&record.name, &name);
        if keys::get(self.directory.as_ref(), &key)
            .await
            .map_err(internal)?
            .is_some()
        {
            return Err(ControlError::Conflict(format!(
                "volume {volume} already has a snapshot named {name}"
            )));
        }
        let id = self.rng.next_u64();
        let created_ms = self.clock.wall_ms();
        let host = self.via().await?;
        let handle = host.open_volume(volume).ok_or_else(|| {
            ControlError::Unavailable(format!("volume {volume} is not served yet"))
        })?;
        handle
            .snapshot(&name, id, created_ms)
            .await
            .map_err(|e| match e {
                BlockError::Invalid { reason } => ControlError::Conflict(reason),
                other => ControlError::Unavailable(format!("volume {volume}: {other}")),
            })?;
        let taken = keys::get(self.directory.as_ref(), &key)
            .await
            .map_err(internal)?
            .ok_or_else(|| {
                ControlError::Internal(format!(
                    "snapshot {name} of volume {volume} was taken but its record is missing"
                ))
            })?;
        for h in self.hosts.running() {
            h.refresh_view().await;
        }
        Ok(snapshot_view(&taken.value))
    }

    pub(super) async fn list_snapshots(
        &self,
        volume: &str,
    ) -> Result<Vec<SnapshotView>, ControlError> {
        let (record, _) = self.volume_record(volume).await?;
        let mut records = self.snapshot_records(&record.name).await?;
        records.sort_by(|a, b| (a.created_ms, &a.name).cmp(&(b.created_ms, &b.name)));
        Ok(records.iter().map(snapshot_view).collect())
    }

    pub(super) async fn snapshot_records(
        &self,
        volume: &VolumeId,
    ) -> Result<Vec<SnapshotRecord>, ControlError> {
        Ok(
            keys::list(self.directory.as_ref(), &self.keys.snapshots_of(volume))
                .await
                .map_err(internal)?
                .records
                .into_iter()
                .map(|v| v.value)
                .collect(),
        )
    }

    pub(super) async fn remove_snapshot(
        &self,
        volume: &str,
        name: &str,
    ) -> Result<(), ControlError> {
        let name = snapshot_name(name)?;
        let volume = VolumeId::new(volume).map_err(|e| ControlError::Invalid(e.to_string()))?;
        let _guard = self.changes.lock().await;
        let key = self.keys.snapshot(&volume, &name);
        let record = keys::get(self.directory.as_ref(), &key)
            .await
            .map_err(internal)?
            .ok_or_else(|| {
                ControlError::NotFound(format!("volume {volume} has no snapshot named {name}"))
            })?
            .value;
        self.delete_snapshot_components(&record).await?;
        keys::delete(self.directory.as_ref(), &key)
            .await
            .map_err(internal)?;
        for h in self.hosts.running() {
            h.refresh_view().await;
        }
        Ok(())
    }

    /// Deletes every component of a snapshot (one already gone counts as
    /// deleted); fails, naming them, when some could not be reached.
    pub(super) async fn delete_snapshot_components(
        &self,
        record: &SnapshotRecord,
    ) -> Result<(), ControlError> {
        let host = self.via().await?;
        let components = host.components(&record.volume);
        let mut missed = Vec::new();
        for c in record.layout.components() {
            match components.delete(c).await {
                Ok(()) | Err(ComponentError::NotFound { .. }) => {}
                Err(e) => missed.push(format!("{} on host {}: {e}", c.id, c.host)),
            }
        }
        if missed.is_empty() {
            Ok(())
        } else {
            Err(ControlError::Unavailable(format!(
                "snapshot {} of volume {}: components could not be deleted ({}); delete it again once their hosts are back",
                record.name,
                record.volume,
                missed.join("; ")
            )))
        }
    }
}
