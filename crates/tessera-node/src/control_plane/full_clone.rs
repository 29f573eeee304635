//! Full clones as the control plane makes them: an independent volume,
//! placed by its policy, recorded as being filled from a snapshot.
//!
//! Owns: checking a full clone's request (the source volume and snapshot,
//! the name, the policy, placement, provisioning, and room on each chosen
//! disk group for the data the snapshot holds), creating its components and
//! recording the volume with its layout and its fill (position 0) in one
//! transaction, which also requires the snapshot's record to be the one
//! read.
//! Must not touch: the copy itself: the volume's owner runs it
//! (`host/fill.rs`), so it survives this request, the API process and the
//! owner's own failure.
//! Invariant: a refused request changes nothing: every check comes before
//! the first component is created, and components made for a clone that
//! cannot be recorded are deleted again.

use super::{create_components, internal, reserved_bytes, ControlPlane};
use crate::control::{CloneVolume, ControlError, VolumeView};
use std::collections::BTreeMap;
use std::sync::Arc;
use tessera_directory::keys::{
    self, SnapshotName, SnapshotRecord, VolumeFill, VolumeRecord, VolumeState,
};
use tessera_object::ComponentIo;
use tessera_placement::ClusterMap;
use tessera_types::layout::Layout;
use tessera_types::policy::Policy;
use tessera_types::{format_size, ComponentId, DiskGroupId, HostId, PolicyName, VolumeId};

/// A disk group a full copy would not fit on: where, what it needs beyond
/// its reservation, and what it has free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Shortfall {
    pub(super) host: HostId,
    pub(super) disk_group: DiskGroupId,
    pub(super) needed_bytes: u64,
    pub(super) free_bytes: u64,
}

/// The first disk group of `layout` (a new volume under `policy`) that
/// cannot take its copies' share of `data_bytes` of data, if any: each
/// column's copies are taken to receive an even share of the data (the
/// stripe unit spreads it), less what their reservation already holds;
/// `free` says what a disk group has free (None: unknown, taken as none).
pub(super) fn fill_shortfall(
    layout: &Layout,
    policy: &Policy,
    data_bytes: u64,
    free: impl Fn(&HostId, &DiskGroupId) -> Option<u64>,
) -> Option<Shortfall> {
    let columns = layout.columns.len().max(1) as u64;
    let share = data_bytes.div_ceil(columns);
    let mut needed: BTreeMap<(HostId, DiskGroupId), u64> = BTreeMap::new();
    for copy in layout.columns.iter().flat_map(|m| m.copies.iter()) {
        let data = share.min(copy.size_bytes);
        let reserve =
            tessera_placement::reservation_bytes(copy.size_bytes, policy.space_reservation_pct);
        *needed
            .entry((copy.host.clone(), copy.disk_group.clone()))
            .or_default() += data.saturating_sub(reserve);
    }
    needed.into_iter().find_map(|((host, disk_group), need)| {
        let have = free(&host, &disk_group).unwrap_or(0);
        (need > have).then_some(Shortfall {
            host,
            disk_group,
            needed_bytes: need,
            free_bytes: have,
        })
    })
}

impl ControlPlane {
    pub(super) async fn full_clone(
        &self,
        volume: &str,
        snapshot: &str,
        request: CloneVolume,
    ) -> Result<VolumeView, ControlError> {
        let name =
            VolumeId::new(&request.name).map_err(|e| ControlError::Invalid(e.to_string()))?;
        let snapshot_name = SnapshotName::new(snapshot).map_err(ControlError::Invalid)?;
        let _guard = self.changes.lock().await;
        let (source_record, _) = self.volume_record(volume).await?;
        let source = source_record.name.clone();
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
        })?;
        let snapshot_revision = taken.mod_revision;
        let taken = taken.value;
        if keys::get(self.directory.as_ref(), &self.keys.volume(&name))
            .await
            .map_err(internal)?
            .is_some()
        {
            return Err(ControlError::Conflict(format!(
                "a volume named {name} already exists"
            )));
        }
        let policy_name = match request.policy.as_deref() {
            Some(p) => PolicyName::new(p).map_err(|e| ControlError::Invalid(e.to_string()))?,
            None => source_record.policy.clone(),
        };
        let policy = keys::get(self.directory.as_ref(), &self.keys.policy(&policy_name))
            .await
            .map_err(internal)?
            .ok_or_else(|| ControlError::NotFound(format!("no policy named {policy_name}")))?
            .value;
        let host = self.via().await?;
        let map = super::cluster_map(self.directory.as_ref(), &self.keys)
            .await
            .map_err(ControlError::Unavailable)?;
        let rng = Arc::clone(&self.rng);
        let mut next_id = move || ComponentId(rng.next_u64() >> 1);
        let layout =
            tessera_placement::place(&policy, &name, taken.size_bytes, &map, &mut next_id)
                .map_err(|e| {
                    let why = e.to_string();
                    let why = why
                        .strip_prefix(&format!("volume {name}: "))
                        .unwrap_or(&why);
                    ControlError::Unsatisfiable(format!(
                        "volume {name} (full clone of {source}@{snapshot_name}, policy {policy_name}): {why}"
                    ))
                })?;
        let state = self.read_state().await?;
        let provisioned: u64 = layout
            .columns
            .iter()
            .flat_map(|m| m.copies.iter())
            .map(|c| c.size_bytes)
            .sum();
        let warnings = Self::check_provisioning(
            &state,
            &self.host_views(&state),
            &format!(
                "volume {name} (full clone of {source}@{snapshot_name}, policy {policy_name})"
            ),
            provisioned,
        )?;
        // The data the snapshot holds must fit where placement put the copies.
        let data_bytes = self.snapshot_data_bytes(&taken).await?;
        if let Some(short) =
            fill_shortfall(&layout, &policy, data_bytes, |h, dg| map_free(&map, h, dg))
        {
            return Err(ControlError::Unsatisfiable(format!(
                "volume {name}: a full copy of {source}@{snapshot_name} ({} of data) needs about {} on disk group {} of host {}, which has {} free; free space there, or clone with a policy that places it elsewhere",
                format_size(data_bytes),
                format_size(short.needed_bytes),
                short.disk_group,
                short.host,
                format_size(short.free_bytes),
            )));
        }
        let components = host.components(&name);
        let created = create_components(components.as_ref(), &name, &layout, &policy).await?;
        let now = self.clock.wall_ms();
        let record = VolumeRecord {
            name: name.clone(),
            size_bytes: taken.size_bytes,
            policy: policy_name.clone(),
            state: VolumeState::Ready,
            created_ms: now,
            reserved_bytes: reserved_bytes(&layout, &policy),
            block_bytes: taken.block_bytes,
            fill: Some(VolumeFill {
                source: source.clone(),
                snapshot: snapshot_name.clone(),
                snapshot_id: taken.id,
                done_bytes: 0,
                copied_bytes: 0,
                rate_bytes_per_s: 0,
                started_ms: now,
                updated_ms: now,
                runs: 0,
                resumed_from_bytes: 0,
                error: None,
            }),
        };
        // The snapshot must still be the one read: a fill never starts from
        // one deleted meanwhile.
        let unchanged = self
            .keys
            .snapshot(&source, &snapshot_name)
            .at_revision(snapshot_revision);
        let recorded = self
            .record_new_volume_when(&record, &layout, vec![unchanged])
            .await;
        match recorded {
            Ok(true) => {}
            outcome => {
                for c in &created {
                    let _ = components.delete(c).await;
                }
                return Err(outcome.err().unwrap_or_else(|| {
                    ControlError::Conflict(format!(
                        "volume {name}: a volume of that name was made, or snapshot {source}@{snapshot_name} changed, meanwhile; nothing was made"
                    ))
                }));
            }
        }
        tracing::info!(volume = %name, from = %source, snapshot = %snapshot_name, policy = %policy_name, data = %format_size(data_bytes), "full clone made; its owner fills it");
        for h in self.hosts.running() {
            h.refresh_view().await;
        }
        self.await_owner(&name).await;
        for w in &warnings {
            tracing::warn!(volume = %name, "{w}");
        }
        let mut view = self.fresh_volume_view(&name).await?;
        view.warnings = warnings;
        Ok(view)
    }

    /// Bytes of data `snapshot` holds (one copy of each column, the first
    /// that answers).
    async fn snapshot_data_bytes(&self, snapshot: &SnapshotRecord) -> Result<u64, ControlError> {
        let host = self.via().await?;
        let components = host.components(&snapshot.volume);
        let mut total = 0;
        for (column, mirror) in snapshot.layout.columns.iter().enumerate() {
            let mut failures = Vec::new();
            let mut found = None;
            for copy in &mirror.copies {
                match components.status(copy).await {
                    Ok(s) => {
                        found = Some(s.allocated_bytes);
                        break;
                    }
                    Err(e) => failures.push(format!("{} on host {}: {e}", copy.id, copy.host)),
                }
            }
            total += found.ok_or_else(|| {
                ControlError::Unavailable(format!(
                    "snapshot {}@{}: no copy of column {column} can be read now ({})",
                    snapshot.volume,
                    snapshot.name,
                    failures.join("; ")
                ))
            })?;
        }
        Ok(total)
    }
}

/// What disk group `disk_group` of `host` has free in `map`.
fn map_free(map: &ClusterMap, host: &HostId, disk_group: &DiskGroupId) -> Option<u64> {
    map.disk_group(host, disk_group).map(|d| d.free_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_types::layout::{ComponentPlacement, ComponentRole, ComponentState, Mirror};
    use tessera_types::FaultDomainId;

    fn copy(host: &str, size: u64) -> ComponentPlacement {
        ComponentPlacement {
            id: ComponentId(1),
            role: ComponentRole::Data,
            host: HostId::new(host).unwrap(),
            disk_group: DiskGroupId::new("dg0").unwrap(),
            fault_domain: FaultDomainId::new(host).unwrap(),
            votes: 1,
            size_bytes: size,
            state: ComponentState::Active,
        }
    }

    fn layout(columns: Vec<Vec<ComponentPlacement>>) -> Layout {
        let size = columns.iter().map(|c| c[0].size_bytes).sum();
        Layout {
            volume: VolumeId::new("copy").unwrap(),
            size_bytes: size,
            stripe_unit_bytes: 1 << 20,
            columns: columns
                .into_iter()
                .map(|copies| Mirror { copies })
                .collect(),
            witnesses: Vec::new(),
            generation: 1,
        }
    }

    fn policy(reservation: u8) -> Policy {
        Policy {
            space_reservation_pct: reservation,
            ..Policy::new(PolicyName::new("p").unwrap(), 1)
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_full_copy_is_refused_where_a_copy_lacks_room_for_its_share_of_the_data() {
        let l = layout(vec![vec![copy("h1", 64 * MIB), copy("h2", 64 * MIB)]]);
        let free = |room: u64| {
            move |h: &HostId, _: &DiskGroupId| Some(if h.as_str() == "h2" { room } else { 1 << 30 })
        };
        assert_eq!(
            fill_shortfall(&l, &policy(0), 40 * MIB, free(40 * MIB)),
            None
        );
        assert_eq!(
            fill_shortfall(&l, &policy(0), 40 * MIB, free(39 * MIB)),
            Some(Shortfall {
                host: HostId::new("h2").unwrap(),
                disk_group: DiskGroupId::new("dg0").unwrap(),
                needed_bytes: 40 * MIB,
                free_bytes: 39 * MIB,
            })
        );
        // What a thick copy reserved is already its own.
        assert_eq!(fill_shortfall(&l, &policy(100), 40 * MIB, free(0)), None);
        // No data, nothing needed; an unknown disk group has no room.
        assert_eq!(fill_shortfall(&l, &policy(0), 0, |_, _| None), None);
        assert!(fill_shortfall(&l, &policy(0), MIB, |_, _| None).is_some());
    }

    #[test]
    fn striped_copies_each_take_an_even_share_and_two_on_one_disk_group_add_up() {
        let l = layout(vec![vec![copy("h1", 32 * MIB)], vec![copy("h1", 32 * MIB)]]);
        // 40 MiB over two columns: 20 MiB each, both on h1's dg0.
        let short = fill_shortfall(&l, &policy(0), 40 * MIB, |_, _| Some(39 * MIB)).unwrap();
        assert_eq!(short.needed_bytes, 40 * MIB);
        assert_eq!(
            fill_shortfall(&l, &policy(0), 40 * MIB, |_, _| Some(40 * MIB)),
            None
        );
    }
}
