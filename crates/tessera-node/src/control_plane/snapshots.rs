//! Snapshots of volumes as the control plane manages them: taking one (by
//! the volume's owner, wherever it runs), listing, deleting.
//!
//! Owns: checking a request (names, the volume, duplicates), handing the
//! snapshot to the owner (through a volume handle: locally or over the
//! transport), the views, deleting a snapshot's components and record, and
//! making a new volume from a snapshot (a linked clone: each copy's
//! snapshot cloned on its own disk group, a witness beside the source's; a
//! full clone is made in `full_clone.rs`), and refusing to delete a
//! snapshot a full clone is being filled from.
//! Must not touch: ordering a snapshot against writes (the owner's
//! coordinator does it, and records the snapshot under its epoch).
//! Invariant: a snapshot's record goes in the same transaction that
//! schedules the deletion (a reclaim record on its host) of every one of
//! its components that could not be deleted at once, so no component is
//! ever left unnamed: its host deletes it once back.

use super::{internal, ControlPlane};
use crate::control::{
    CloneVolume, ControlError, CreateSnapshot, ReclaimPending, RevertVolume, SnapshotComponentView,
    SnapshotDeleted, SnapshotView, VolumeView,
};
use tessera_blockdev::BlockError;
use tessera_directory::keys::VolumeRecord;
use tessera_directory::keys::{self, ReclaimReason, SnapshotName, SnapshotRecord, VolumeState};
use tessera_object::{ComponentError, ComponentIo};
use tessera_types::layout::{ComponentPlacement, ComponentRole, ComponentState, Layout};
use tessera_types::{ComponentId, Epoch, VolumeId};

/// How a snapshot is shown.
pub(super) fn snapshot_view(r: &SnapshotRecord) -> SnapshotView {
    SnapshotView {
        volume: r.volume.to_string(),
        name: r.name.to_string(),
        export: crate::snapshot_export::export_name(r),
        iscsi_target: crate::snapshot_export::iscsi_target_name(r.volume.as_str(), r.name.as_str()),
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
        group: r.group.iter().map(ToString::to_string).collect(),
        held_alone_bytes: None,
        held_shared_bytes: None,
    }
}

/// How long a consistency group's snapshot may hold a volume's writes: if
/// the control plane that asked is gone by then, the owner lets them go.
const GROUP_HOLD_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// Refuses to make copies of snapshot `taken` while it has fewer copies
/// in a column than `volume` (its volume's layout) has: it was taken while
/// a copy was away, and the copy gets it when it returns. What is made of
/// it (a linked clone's or a reverted volume's copies) would have fewer
/// copies than its policy asks.
fn refuse_short_snapshot(
    taken: &SnapshotRecord,
    volume: &Layout,
    what: &str,
) -> Result<(), ControlError> {
    let data = |m: &tessera_types::layout::Mirror| {
        m.copies
            .iter()
            .filter(|c| c.role == ComponentRole::Data)
            .count()
    };
    for (i, (held, wanted)) in taken.layout.columns.iter().zip(&volume.columns).enumerate() {
        let (held, wanted) = (data(held), data(wanted));
        if held < wanted {
            return Err(ControlError::Conflict(format!(
                "snapshot {} of volume {} has {held} of {wanted} copies in column {i}: it was taken while a copy was away, and gets its copy when that copy returns and catches up; it can be {what} then (a full clone can be made now)",
                taken.name, taken.volume
            )));
        }
    }
    Ok(())
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
        let key = self.snapshot_may_be_taken(&record, &name).await?;
        if !request.group.is_empty() {
            return self.take_group_snapshot(record, name, &request.group).await;
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

    /// The key of snapshot `name` of `record`'s volume, if one may be
    /// taken: the volume is ready and has none of that name.
    async fn snapshot_may_be_taken(
        &self,
        record: &VolumeRecord,
        name: &SnapshotName,
    ) -> Result<keys::Key<SnapshotRecord>, ControlError> {
        let volume = &record.name;
        super::refuse_while_filling(record, "take a snapshot of it")?;
        if record.state != VolumeState::Ready {
            return Err(ControlError::Conflict(format!(
                "volume {volume} is {:?}: a snapshot is taken of a ready volume",
                record.state
            )));
        }
        let key = self.keys.snapshot(volume, name);
        if keys::get(self.directory.as_ref(), &key)
            .await
            .map_err(internal)?
            .is_some()
        {
            return Err(ControlError::Conflict(format!(
                "volume {volume} already has a snapshot named {name}"
            )));
        }
        Ok(key)
    }

    /// Takes snapshot `name` of `first` and of the volumes of `group` at
    /// one point in time: every volume's writes are held (in name order,
    /// so two groups never wait on each other), then each one's snapshot
    /// is taken, then the writes go on. All or nothing: a volume that
    /// cannot be held or snapshotted leaves no snapshot on the others.
    async fn take_group_snapshot(
        &self,
        first: VolumeRecord,
        name: SnapshotName,
        group: &[String],
    ) -> Result<SnapshotView, ControlError> {
        let mut members = vec![first.name.clone()];
        for v in group {
            let (record, _) = self.volume_record(v).await?;
            if members.contains(&record.name) {
                return Err(ControlError::Invalid(format!(
                    "volume {v} is named twice in the consistency group"
                )));
            }
            self.snapshot_may_be_taken(&record, &name).await?;
            members.push(record.name);
        }
        members.sort();
        let host = self.via().await?;
        let mut handles = Vec::new();
        for v in &members {
            let handle = host.open_volume(v.as_str()).ok_or_else(|| {
                ControlError::Unavailable(format!("volume {v} is not served yet"))
            })?;
            handles.push((v.clone(), handle));
        }
        let hold = self.rng.next_u64();
        let created_ms = self.clock.wall_ms();
        let mut held = Vec::new();
        let mut taken: Vec<VolumeId> = Vec::new();
        let mut failure = None;
        for (v, handle) in &handles {
            match handle.hold_writes(hold, GROUP_HOLD_TTL).await {
                Ok(()) => held.push(handle),
                Err(e) => {
                    failure = Some(format!("volume {v}: writes not held: {e}"));
                    break;
                }
            }
        }
        if failure.is_none() {
            for (v, handle) in &handles {
                let id = self.rng.next_u64();
                match handle.snapshot_held(hold, &name, id, created_ms).await {
                    Ok(()) => taken.push(v.clone()),
                    Err(e) => {
                        failure = Some(format!("volume {v}: {e}"));
                        break;
                    }
                }
            }
        }
        for handle in held {
            if let Err(e) = handle.release_writes(hold).await {
                tracing::warn!(error = %e, "a consistency group's hold was not released; it expires on its own");
            }
        }
        if let Some(failure) = failure {
            // All or nothing: the snapshots already taken go again.
            for v in &taken {
                let key = self.keys.snapshot(v, &name);
                if let Ok(Some(r)) = keys::get(self.directory.as_ref(), &key).await {
                    if let Err(e) = self.retire_snapshot(&r).await {
                        tracing::warn!(volume = %v, snapshot = %name, error = %e, "a group's snapshot not deleted again");
                    }
                }
            }
            return Err(ControlError::Conflict(format!(
                "consistency group snapshot {name} not taken: {failure}"
            )));
        }
        // Each record names the others of its group.
        let mut views = Vec::new();
        for v in &members {
            let key = self.keys.snapshot(v, &name);
            let mut record = keys::get(self.directory.as_ref(), &key)
                .await
                .map_err(internal)?
                .ok_or_else(|| {
                    ControlError::Internal(format!(
                        "snapshot {name} of volume {v} was taken but its record is missing"
                    ))
                })?;
            record.value.group = members.iter().filter(|m| *m != v).cloned().collect();
            let put = key.put_op(&record.value, None).map_err(internal)?;
            let done = self
                .directory
                .txn(
                    tessera_directory::Txn::new()
                        .when([key.at_revision(record.mod_revision)])
                        .and_then([put]),
                )
                .await
                .map_err(internal)?;
            if !done.succeeded {
                tracing::warn!(volume = %v, snapshot = %name, "snapshot changed while its group was recorded");
            }
            views.push(snapshot_view(&record.value));
        }
        for h in self.hosts.running() {
            h.refresh_view().await;
        }
        let first = views
            .into_iter()
            .find(|view| view.volume == first.name.as_str())
            .expect("the first volume is a member");
        Ok(first)
    }

    pub(super) async fn list_snapshots(
        &self,
        volume: &str,
    ) -> Result<Vec<SnapshotView>, ControlError> {
        let (record, _) = self.volume_record(volume).await?;
        let mut records = self.snapshot_records(&record.name).await?;
        records.sort_by(|a, b| (a.created_ms, &a.name).cmp(&(b.created_ms, &b.name)));
        let host = self.via().await?;
        let components = host.components(&record.name);
        let mut views = Vec::with_capacity(records.len());
        for r in &records {
            let mut view = snapshot_view(r);
            // Every copy holds the same: the first that answers counts.
            for c in r.layout.components() {
                if let Ok((alone, shared)) = components.held_space(c).await {
                    view.held_alone_bytes = Some(alone);
                    view.held_shared_bytes = Some(shared);
                    break;
                }
            }
            views.push(view);
        }
        Ok(views)
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
    ) -> Result<SnapshotDeleted, ControlError> {
        let name = snapshot_name(name)?;
        let volume = VolumeId::new(volume).map_err(|e| ControlError::Invalid(e.to_string()))?;
        let _guard = self.changes.lock().await;
        let key = self.keys.snapshot(&volume, &name);
        let entry = keys::get(self.directory.as_ref(), &key)
            .await
            .map_err(internal)?
            .ok_or_else(|| {
                ControlError::NotFound(format!("volume {volume} has no snapshot named {name}"))
            })?;
        // A full clone being filled from it reads it until the fill ends.
        let state = self.read_state().await?;
        if let Some(refusal) = super::fills_from(&state, &volume, Some(&name), "deleted") {
            return Err(refusal);
        }
        let deleted = self.retire_snapshot(&entry).await?;
        for h in self.hosts.running() {
            h.refresh_view().await;
        }
        Ok(deleted)
    }

    /// Deletes a snapshot: its components that can be deleted now, then its
    /// record in one transaction with a reclaim record for each of the
    /// others (their hosts delete them once back). Refused, changing no
    /// record, when the snapshot's record changed since `entry` was read.
    async fn retire_snapshot(
        &self,
        entry: &keys::Record<SnapshotRecord>,
    ) -> Result<SnapshotDeleted, ControlError> {
        let record = &entry.value;
        let key = self.keys.snapshot(&record.volume, &record.name);
        let (deleted, missed) = self
            .delete_components(&record.volume, record.layout.components())
            .await?;
        let now = self.clock.wall_ms();
        let mut ops = vec![key.delete_op()];
        let mut pending: std::collections::BTreeMap<String, u32> = Default::default();
        for (c, why) in &missed {
            tracing::info!(volume = %record.volume, snapshot = %record.name, component = %c.id, host = %c.host, reason = %why, "snapshot component left for its host to reclaim");
            ops.push(
                self.keys
                    .reclaim_op(&record.volume, c, ReclaimReason::SnapshotDeleted, now)
                    .map_err(internal)?,
            );
            *pending.entry(c.host.to_string()).or_default() += 1;
        }
        let done = self
            .directory
            .txn(
                tessera_directory::Txn::new()
                    .when([key.at_revision(entry.mod_revision)])
                    .and_then(ops),
            )
            .await
            .map_err(internal)?;
        if !done.succeeded {
            return Err(ControlError::Conflict(format!(
                "snapshot {} of volume {} changed while it was being deleted (a copy joined or left); delete it again",
                record.name, record.volume
            )));
        }
        Ok(SnapshotDeleted {
            volume: record.volume.to_string(),
            name: record.name.to_string(),
            deleted_components: deleted,
            reclaim_pending: pending
                .into_iter()
                .map(|(host, components)| ReclaimPending { host, components })
                .collect(),
        })
    }

    /// Deletes `placements`, components of `volume` (one already gone
    /// counts as deleted): how many went, and those whose hosts could not
    /// delete them now, with why.
    pub(super) async fn delete_components<'a>(
        &self,
        volume: &VolumeId,
        placements: impl IntoIterator<Item = &'a ComponentPlacement>,
    ) -> Result<(u32, Vec<(ComponentPlacement, String)>), ControlError> {
        let host = self.via().await?;
        let components = host.components(volume);
        let mut deleted = 0;
        let mut missed = Vec::new();
        for c in placements {
            match components.delete(c).await {
                Ok(()) | Err(ComponentError::NotFound { .. }) => deleted += 1,
                Err(e) => missed.push((c.clone(), e.to_string())),
            }
        }
        Ok((deleted, missed))
    }

    pub(super) async fn clone_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
        request: CloneVolume,
    ) -> Result<VolumeView, ControlError> {
        if request.full {
            return self.full_clone(volume, snapshot, request).await;
        }
        let name =
            VolumeId::new(&request.name).map_err(|e| ControlError::Invalid(e.to_string()))?;
        let snapshot_name = snapshot_name(snapshot)?;
        let source = VolumeId::new(volume).map_err(|e| ControlError::Invalid(e.to_string()))?;
        let _guard = self.changes.lock().await;
        let taken = keys::get(
            self.directory.as_ref(),
            &self.keys.snapshot(&source, &snapshot_name),
        )
        .await
        .map_err(internal)?
        .ok_or_else(|| {
            ControlError::NotFound(format!(
                "volume {volume} has no snapshot named {snapshot_name}"
            ))
        })?
        .value;
        let (source_record, source_layout) = self.volume_record(volume).await?;
        refuse_short_snapshot(&taken, &source_layout, "cloned")?;
        // A linked clone's copies sit beside the snapshot's: its policy is
        // the source's.
        if let Some(policy) = request
            .policy
            .as_deref()
            .filter(|p| *p != source_record.policy.as_str())
        {
            return Err(ControlError::Invalid(format!(
                "volume {name}: a linked clone keeps the policy of volume {volume} ({}), not {policy}: its copies share the snapshot's blocks on their disk groups; make a full clone to choose the policy",
                source_record.policy
            )));
        }
        if keys::get(self.directory.as_ref(), &self.keys.volume(&name))
            .await
            .map_err(internal)?
            .is_some()
        {
            return Err(ControlError::Conflict(format!(
                "a volume named {name} already exists"
            )));
        }
        // The clone's copies are clones of the snapshot's, on their disk
        // groups (where the blocks they share are); its witnesses are new,
        // beside the source's, so it has the source's protection.
        let fresh = |c: &ComponentPlacement| ComponentPlacement {
            id: ComponentId(self.rng.next_u64() >> 1),
            state: ComponentState::Active,
            ..c.clone()
        };
        let mut pairs = Vec::new();
        let mut layout = Layout {
            volume: name.clone(),
            generation: 1,
            witnesses: source_layout.witnesses.iter().map(fresh).collect(),
            ..taken.layout.clone()
        };
        for column in &mut layout.columns {
            for copy in &mut column.copies {
                let made = fresh(copy);
                pairs.push((copy.clone(), made.clone()));
                *copy = made;
            }
        }
        let host = self.via().await?;
        let components = host.components(&name);
        let mut made: Vec<ComponentPlacement> = Vec::new();
        let mut failure = None;
        for (from, to) in &pairs {
            match components.clone_snapshot(from, to.id, Epoch(0)).await {
                Ok(()) => made.push(to.clone()),
                Err(e) => {
                    failure = Some(format!(
                        "cloning snapshot component {} on host {}: {e}",
                        from.id, from.host
                    ));
                    break;
                }
            }
        }
        for w in layout
            .witnesses
            .iter()
            .filter(|w| w.role == ComponentRole::Witness)
        {
            if failure.is_some() {
                break;
            }
            match components.create(w, 0).await {
                Ok(()) => made.push(w.clone()),
                Err(e) => failure = Some(format!("witness on host {}: {e}", w.host)),
            }
        }
        let record = VolumeRecord {
            name: name.clone(),
            size_bytes: taken.size_bytes,
            policy: source_record.policy.clone(),
            state: VolumeState::Ready,
            created_ms: self.clock.wall_ms(),
            reserved_bytes: 0,
            block_bytes: taken.block_bytes,
            fill: None,
        };
        let recorded = match failure {
            Some(reason) => Err(ControlError::Unavailable(format!(
                "volume {name}: {reason}"
            ))),
            None => match self.record_new_volume(&record, &layout).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(ControlError::Conflict(format!(
                    "a volume named {name} already exists"
                ))),
                Err(e) => Err(e),
            },
        };
        if let Err(e) = recorded {
            // Nothing half made is left behind.
            for c in &made {
                let _ = components.delete(c).await;
            }
            return Err(e);
        }
        tracing::info!(volume = %name, from = %source, snapshot = %snapshot_name, "volume cloned from a snapshot");
        for h in self.hosts.running() {
            h.refresh_view().await;
        }
        self.await_owner(&name).await;
        self.fresh_volume_view(&name).await
    }

    pub(super) async fn revert_to_snapshot(
        &self,
        volume: &str,
        request: RevertVolume,
    ) -> Result<VolumeView, ControlError> {
        let snapshot_name = snapshot_name(&request.to)?;
        let _guard = self.changes.lock().await;
        let (record, layout) = self.volume_record(volume).await?;
        let taken = keys::get(
            self.directory.as_ref(),
            &self.keys.snapshot(&record.name, &snapshot_name),
        )
        .await
        .map_err(internal)?
        .ok_or_else(|| {
            ControlError::NotFound(format!(
                "volume {volume} has no snapshot named {snapshot_name}"
            ))
        })?
        .value;
        let state = self.read_state().await?;
        let (open, on) = self.open_by(&state, &record.name);
        if open > 0 {
            return Err(ControlError::Conflict(format!(
                "volume {volume} is open by {open} client(s) through {}: disconnect them before reverting it (what they wrote since the snapshot would vanish under them)",
                on.join(", ")
            )));
        }
        if taken.size_bytes != record.size_bytes {
            return Err(ControlError::Conflict(format!(
                "volume {volume} was resized since snapshot {snapshot_name} was taken; clone the snapshot instead"
            )));
        }
        refuse_short_snapshot(&taken, &layout, "reverted to")?;
        // New copies, each a clone of a snapshot copy on its disk group,
        // replace the volume's; its witnesses stay.
        let host = self.via().await?;
        let components = host.components(&record.name);
        let mut reverted = Layout {
            witnesses: layout.witnesses.clone(),
            generation: layout.generation + 1,
            ..taken.layout.clone()
        };
        let mut made: Vec<ComponentPlacement> = Vec::new();
        let mut failure = None;
        for column in &mut reverted.columns {
            for copy in &mut column.copies {
                let from = copy.clone();
                copy.id = ComponentId(self.rng.next_u64() >> 1);
                match components.clone_snapshot(&from, copy.id, Epoch(0)).await {
                    Ok(()) => made.push(copy.clone()),
                    Err(e) => {
                        failure.get_or_insert(format!(
                            "cloning snapshot component {} on host {}: {e}",
                            from.id, from.host
                        ));
                    }
                }
            }
        }
        // The owner steps down, and its epoch is passed at once, so nothing
        // it still does is recorded over the new layout; the next owner
        // takes the new copies over.
        let owner =
            tessera_directory::current_owner(self.directory.as_ref(), &self.keys, &record.name)
                .await
                .map_err(internal)?;
        let epoch = keys::get(
            self.directory.as_ref(),
            &self.keys.owner_epoch(&record.name),
        )
        .await
        .map_err(internal)?
        .map_or(Epoch(0), |r| r.value.epoch);
        let recorded = match failure {
            Some(reason) => Err(ControlError::Unavailable(format!(
                "volume {volume}: {reason}"
            ))),
            None => {
                let mut ops = vec![
                    self.keys
                        .layout(&record.name)
                        .put_op(&reverted, None)
                        .map_err(internal)?,
                    self.keys
                        .owner_epoch(&record.name)
                        .put_op(
                            &keys::OwnerEpochRecord {
                                volume: record.name.clone(),
                                epoch: Epoch(epoch.0 + 1),
                            },
                            None,
                        )
                        .map_err(internal)?,
                    self.keys.dirty_regions(&record.name).delete_op(),
                ];
                if owner.is_some() {
                    ops.push(self.keys.owner(&record.name).delete_op());
                }
                // The replaced copies go with the layout that named them:
                // deleted below, or by their hosts once back.
                let now = self.clock.wall_ms();
                for c in layout.columns.iter().flat_map(|m| m.copies.iter()) {
                    ops.push(
                        self.keys
                            .reclaim_op(&record.name, c, ReclaimReason::Replaced, now)
                            .map_err(internal)?,
                    );
                }
                self.directory
                    .txn(tessera_directory::Txn::new().and_then(ops))
                    .await
                    .map(|_| ())
                    .map_err(internal)
            }
        };
        if let Err(e) = recorded {
            for c in &made {
                let _ = components.delete(c).await;
            }
            return Err(e);
        }
        if let Some(owner) = &owner {
            for h in self.hosts.running() {
                if h.id() == &owner.host {
                    h.forget_cached(&record.name);
                }
            }
        }
        // The copies that held what is now undone go.
        for c in layout.columns.iter().flat_map(|m| m.copies.iter()) {
            if let Err(e) = components.delete(c).await {
                tracing::warn!(volume = %volume, component = %c.id, host = %c.host, error = %e, "replaced copy not deleted");
            }
        }
        tracing::info!(volume = %volume, snapshot = %snapshot_name, "volume reverted to a snapshot");
        for h in self.hosts.running() {
            h.refresh_view().await;
        }
        self.await_owner(&record.name).await;
        self.fresh_volume_view(&record.name).await
    }
}
