//! The host's control loop: it tells the host's control core
//! ([`tessera_control::HostControl`]) what changed and carries out what the
//! core decides.
//!
//! Owns: turning what the host reads (directory records, host liveness,
//! its own lease, its coordinators' layouts) into the core's events, once
//! per change; the inbox of events from the tasks the loop starts (resyncs
//! ending); and the I/O of every action: owner election and take-over,
//! absence and witness records, resync tasks with their rows on the resync
//! board, rebuilds through placement, rejoining after a lost lease; and,
//! after each turn, starting the fill of every full clone it coordinates
//! that no task of its coordinator runs yet (`host/fill.rs`).
//! Must not touch: the decisions (when to take a volume, to resync, to
//! rebuild): they are the core's, so a simulator can run them without
//! this I/O.
//! Invariant: the core hears of a change before the tick that acts on it,
//! and hears of every coordinator this host starts or stops.

use super::layout_record::DirectoryLayouts;
use super::{lease_check, serial_of, Host, USAGE_TICKS};
use crate::events::EventCode;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tessera_control::{Action, Event, HostControl, ResyncKind};
use tessera_directory::keys::{self, DiskGroupState, VolumeState};
use tessera_object::{
    ComponentIo, Coordinator, HostShared, NewCopyPlace, ResyncError, ResyncReport,
    SnapshotChainLink, SnapshotsHeld,
};
use tessera_types::layout::{ComponentPlacement, ComponentRole, ComponentState};
use tessera_types::{ComponentId, DiskGroupId, Epoch, HostId, VolumeId, BLOCK_BYTES};

/// What the core was last told, to tell it only what changed.
pub(super) struct Reported {
    lease_held: bool,
    live: BTreeSet<HostId>,
    volumes: HashMap<VolumeId, bool>,
    owners: HashMap<VolumeId, (HostId, Epoch)>,
    /// Layout records, by generation.
    layouts: HashMap<VolumeId, u64>,
    /// Coordinators' layouts, by generation.
    coordinator_layouts: HashMap<VolumeId, u64>,
    superseded: HashSet<VolumeId>,
    /// Disk groups reported failed, whole or in part.
    failed_storage: HashMap<(HostId, DiskGroupId), (bool, BTreeSet<ComponentId>)>,
    /// Disk groups reported being evacuated.
    evacuating: BTreeSet<(HostId, DiskGroupId)>,
}

impl Default for Reported {
    fn default() -> Reported {
        // A host starts with the lease it registered with.
        Reported {
            lease_held: true,
            live: BTreeSet::new(),
            volumes: HashMap::new(),
            owners: HashMap::new(),
            layouts: HashMap::new(),
            coordinator_layouts: HashMap::new(),
            superseded: HashSet::new(),
            failed_storage: HashMap::new(),
            evacuating: BTreeSet::new(),
        }
    }
}

/// The core and what it was told, behind one lock the control loop holds
/// only between awaits.
pub(super) struct ControlState {
    pub(super) core: HostControl,
    pub(super) reported: Reported,
    /// Events from tasks the loop started, for the next tick.
    pub(super) inbox: Vec<Event>,
}

/// Ticks between reads of every device's first block (one second).
const PROBE_TICKS: u64 = 2;

/// Ticks between passes that settle write intents (five seconds): a region
/// leaves the record after one to two passes without a change.
const INTENT_TICKS: u64 = 10;

impl Host {
    pub(super) fn lease_held(&self) -> bool {
        self.session
            .lock()
            .as_ref()
            .is_some_and(|s| s.state() != tessera_directory::membership::SessionState::Lost)
    }

    /// One turn of the control loop: tells the core what changed in the
    /// view since the last turn and the time, and carries out its decisions.
    pub(super) async fn control_tick(self: &Arc<Self>, tick: u64) {
        // A device that died while idle is found here, not at its next
        // client I/O: every second, each device's first block is read, in
        // a task of its own, so a device that hangs rather than fails
        // never holds up this loop (and is not probed again meanwhile).
        if tick.is_multiple_of(PROBE_TICKS)
            && !self.probing.swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            let host = Arc::clone(self);
            tokio::spawn(async move {
                for group in host.replica.disk_groups() {
                    group.probe_devices().await;
                }
                host.probing
                    .store(false, std::sync::atomic::Ordering::Release);
            });
        }
        // Write intents of regions that went quiet leave the directory, in
        // a task of its own (one record per volume that had any).
        if tick.is_multiple_of(INTENT_TICKS)
            && !self
                .settling_intents
                .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            let host = Arc::clone(self);
            tokio::spawn(async move {
                let owned: Vec<Arc<Coordinator>> = host.owned.read().values().cloned().collect();
                for c in owned {
                    if let Err(e) = c.settle_intents().await {
                        tracing::debug!(error = %e, "write intents not settled");
                    }
                }
                host.settling_intents
                    .store(false, std::sync::atomic::Ordering::Release);
            });
        }
        // The view is current: the directory mirror follows a watch.
        if self.storage_health_changed() {
            self.publish_usage().await;
        }
        if tick.is_multiple_of(USAGE_TICKS) {
            self.publish_usage().await;
            let owned: Vec<Arc<Coordinator>> = self.owned.read().values().cloned().collect();
            for c in owned {
                c.refresh_space().await;
            }
        }
        // Before anything is attached to the lease this turn: a key
        // attached to the old lease while the session moves would end
        // with it.
        self.follow_lease_setting().await;
        self.publish_attachments().await;
        let mut actions = VecDeque::new();
        {
            let mut state = self.control.lock();
            let mut events = std::mem::take(&mut state.inbox);
            events.extend(self.changes(&mut state.reported));
            events.push(Event::Tick {
                now: self.clock.monotonic(),
            });
            for event in events {
                actions.extend(state.core.handle(event));
            }
        }
        while let Some(action) = actions.pop_front() {
            if let Some(event) = self.carry_out(action).await {
                let mut state = self.control.lock();
                if let Event::Coordinating { volume, layout, .. } = &event {
                    state
                        .reported
                        .coordinator_layouts
                        .insert(volume.clone(), layout.generation);
                }
                actions.extend(state.core.handle(event));
            }
        }
        // Full clones this host coordinates are filled by a task of their
        // own (`host/fill.rs`), which a new owner starts here.
        self.start_fills();
    }

    /// What changed since the core was last told, as events: the lease,
    /// host liveness, volume, owner and layout records, and this host's
    /// coordinators.
    fn changes(&self, reported: &mut Reported) -> Vec<Event> {
        let mut events = Vec::new();
        let held = self.lease_held();
        if held != reported.lease_held {
            reported.lease_held = held;
            events.push(if held {
                Event::LeaseHeld
            } else {
                Event::LeaseLost
            });
        }
        let live: BTreeSet<HostId> = self.peers.live_hosts().into_iter().collect();
        for host in live.symmetric_difference(&reported.live) {
            events.push(Event::HostLiveness {
                host: host.clone(),
                live: live.contains(host),
            });
        }
        reported.live = live;
        let failed: HashMap<(HostId, DiskGroupId), (bool, BTreeSet<ComponentId>)> = self
            .mirror
            .disk_groups
            .lock()
            .values()
            .filter(|g| g.state == DiskGroupState::Failed || !g.failed_components.is_empty())
            .map(|g| {
                let whole = g.state == DiskGroupState::Failed;
                let components = g.failed_components.iter().copied().collect();
                ((g.host.clone(), g.id.clone()), (whole, components))
            })
            .collect();
        for (at, health) in &failed {
            if reported.failed_storage.get(at) != Some(health) {
                events.push(Event::DiskGroupHealth {
                    host: at.0.clone(),
                    disk_group: at.1.clone(),
                    failed: health.0,
                    failed_components: health.1.clone(),
                });
            }
        }
        for at in reported.failed_storage.keys() {
            if !failed.contains_key(at) {
                events.push(Event::DiskGroupHealth {
                    host: at.0.clone(),
                    disk_group: at.1.clone(),
                    failed: false,
                    failed_components: BTreeSet::new(),
                });
            }
        }
        reported.failed_storage = failed;
        let evacuating = self.evacuating_disk_groups();
        for at in evacuating.symmetric_difference(&reported.evacuating) {
            events.push(Event::DiskGroupEvacuating {
                host: at.0.clone(),
                disk_group: at.1.clone(),
                evacuating: evacuating.contains(at),
            });
        }
        reported.evacuating = evacuating;
        report_changes(
            &self.view.volumes.read(),
            &mut reported.volumes,
            |record| record.state == VolumeState::Ready,
            |volume, _, &ready| Event::VolumeRecorded {
                volume: volume.clone(),
                ready,
            },
            |volume| Event::VolumeRemoved { volume },
            &mut events,
        );
        report_changes(
            &self.view.owners.read(),
            &mut reported.owners,
            |record| (record.host.clone(), record.epoch),
            |volume, record, _| Event::OwnerRecorded {
                volume: volume.clone(),
                host: record.host.clone(),
                epoch: record.epoch,
            },
            |volume| Event::OwnerRemoved { volume },
            &mut events,
        );
        report_changes(
            &self.view.layouts.read(),
            &mut reported.layouts,
            |layout| layout.generation,
            |_, layout, _| Event::LayoutRecorded {
                layout: layout.clone(),
            },
            |volume| Event::LayoutRemoved { volume },
            &mut events,
        );
        let owned: Vec<(VolumeId, Arc<Coordinator>)> = self
            .owned
            .read()
            .iter()
            .map(|(v, c)| (v.clone(), Arc::clone(c)))
            .collect();
        for (volume, c) in &owned {
            let layout = c.layout();
            if reported.coordinator_layouts.get(volume) != Some(&layout.generation) {
                reported
                    .coordinator_layouts
                    .insert(volume.clone(), layout.generation);
                events.push(Event::CoordinatorLayout { layout });
            }
            if c.superseded().is_some() && reported.superseded.insert(volume.clone()) {
                events.push(Event::CoordinatorSuperseded {
                    volume: volume.clone(),
                });
            }
        }
        reported
            .coordinator_layouts
            .retain(|v, _| owned.iter().any(|(o, _)| o == v));
        reported
            .superseded
            .retain(|v| owned.iter().any(|(o, _)| o == v));
        events
    }

    /// Carries out one decision of the core; returns what the core should
    /// hear of its outcome, if anything.
    async fn carry_out(self: &Arc<Self>, action: Action) -> Option<Event> {
        let coordinator = |volume: &VolumeId| self.owned.read().get(volume).cloned();
        match action {
            Action::DropAllCoordinators => {
                tracing::error!(host = %self.id, "liveness lease lost: dropping every coordinator");
                let owned = self.owned.read().len();
                self.drop_coordinators();
                self.events.emit(
                    EventCode::LeaseLost,
                    self.id.as_str(),
                    format!("{} lost its liveness lease and stopped coordinating the {owned} volume(s) it owned; other hosts take them over", self.id),
                );
            }
            Action::Rejoin => self.rejoin().await,
            Action::StopCoordinating { volume } => {
                if let Some(c) = self.owned.write().remove(&volume) {
                    // Requests still under way read from the copies from now on.
                    c.forget_cached();
                    self.scheduler.forget_volume(&volume);
                    tracing::info!(host = %self.id, %volume, "no longer coordinating volume");
                }
            }
            Action::TakeOwnership { volume } => return self.take_ownership(&volume).await,
            Action::ReleaseOwnership { volume, epoch } => {
                let record = self.view.owners.read().get(&volume).cloned();
                // Only the record the core saw: deleted if it still holds.
                if let Some(record) = record.filter(|r| r.host == self.id && r.epoch == epoch) {
                    tracing::info!(host = %self.id, %volume, %epoch, "releasing an owner record this host does not act on");
                    if let Err(e) = tessera_directory::release_owner(
                        self.directory.as_ref(),
                        &self.keys,
                        &record,
                    )
                    .await
                    {
                        tracing::warn!(host = %self.id, %volume, error = %e, "could not release ownership");
                    }
                }
            }
            Action::RecordHostAbsent { volume, host } => {
                let c = coordinator(&volume)?;
                tracing::warn!(%volume, %host, "host is absent: its components miss writes until it returns");
                self.events.emit(
                    EventCode::HostAbsent,
                    volume.as_str(),
                    format!("{host} is absent: {volume}'s components on it miss writes until it returns or the repair delay ends"),
                );
                if let Err(e) = c.host_absent(&host).await {
                    tracing::warn!(%volume, %host, error = %e, "could not record absence");
                }
            }
            Action::RecordWitnessPresent { volume, host } => {
                let c = coordinator(&volume)?;
                if let Err(e) = c.witness_present(&host).await {
                    tracing::warn!(%volume, %host, error = %e, "witness not back yet");
                }
            }
            Action::StartResync {
                volume,
                component,
                host,
                kind,
            } => match coordinator(&volume) {
                Some(c) => self.spawn_resync(&volume, &c, component, &host, kind),
                // Stopped coordinating since: the core hears it ended.
                None => {
                    return Some(Event::ResyncEnded {
                        volume,
                        component,
                        ok: false,
                    })
                }
            },
            Action::ResyncWaiting { volume, component } => {
                let c = coordinator(&volume)?;
                self.board
                    .retry_pending(&volume, component, dirty_bytes_of(&c, component));
            }
            Action::Rebuild { volume, component } => {
                let c = coordinator(&volume)?;
                return self.rebuild(&volume, &c, component).await;
            }
            Action::Evacuate { volume, component } => {
                let c = coordinator(&volume)?;
                return self.evacuate(&volume, &c, component).await;
            }
        }
        None
    }

    /// Moves the session to a lease of the time to live the settings ask
    /// for, if it has another (and tries again next turn if it could not).
    async fn follow_lease_setting(&self) {
        let wanted = std::time::Duration::from_millis(
            self.lease_ttl_ms.load(std::sync::atomic::Ordering::Relaxed),
        );
        let Some(session) = self.session.lock().clone() else {
            return;
        };
        if session.ttl() == wanted
            || session.state() == tessera_directory::membership::SessionState::Lost
        {
            return;
        }
        match session.change_ttl(&self.keys, wanted).await {
            Ok(true) => {
                tracing::info!(host = %self.id, ttl_ms = wanted.as_millis() as u64, "liveness lease now has the time to live the settings ask for");
                // The open-volume record moved with it; publish it again in
                // case it changed meanwhile.
                self.attachments_published
                    .store(u64::MAX, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(false) => {
                tracing::debug!(host = %self.id, "liveness lease not moved yet; trying again")
            }
            Err(e) => {
                tracing::warn!(host = %self.id, error = %e, "cannot move to a lease of the new time to live yet")
            }
        }
    }

    /// Registers again with a new lease: a host that was frozen or cut off
    /// comes back as a host without volumes, and owners resync its copies.
    async fn rejoin(&self) {
        let rejoined = tessera_directory::register_host(
            Arc::clone(&self.directory),
            &self.keys,
            self.record.clone(),
            Duration::from_millis(self.lease_ttl_ms.load(std::sync::atomic::Ordering::Relaxed)),
        )
        .await;
        match rejoined {
            Ok(session) => {
                tracing::warn!(host = %self.id, "rejoined the cluster with a new lease");
                self.events.emit(
                    EventCode::Rejoined,
                    self.id.as_str(),
                    format!(
                        "{} registered again with a new lease, owning no volume",
                        self.id
                    ),
                );
                self.read_cache.set_ownership_check(lease_check(&session));
                *self.session.lock() = Some(Arc::new(session));
                // The old lease took the open-volume record with it.
                self.attachments_published
                    .store(u64::MAX, std::sync::atomic::Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(host = %self.id, error = %e, "cannot rejoin yet"),
        }
    }

    /// Becomes `volume`'s owner at a new epoch and starts coordinating it.
    async fn take_ownership(self: &Arc<Self>, volume: &VolumeId) -> Option<Event> {
        let record = self.view.volumes.read().get(volume).cloned()?;
        let lease = self.session.lock().as_ref().map(|s| s.lease())?;
        let owner = match tessera_directory::acquire_owner(
            self.directory.as_ref(),
            &self.keys,
            volume,
            &self.id,
            lease,
        )
        .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(host = %self.id, %volume, error = %e, "did not take ownership");
                return None;
            }
        };
        // Read the layout again: the previous owner may have changed it.
        let layout = match keys::get(self.directory.as_ref(), &self.keys.layout(volume)).await {
            Ok(Some(r)) => r.value,
            _ => self.view.layouts.read().get(volume).cloned()?,
        };
        // What the copies that are behind missed, as the previous owners
        // recorded it (no record: each is resynced whole). Read once this
        // epoch is granted, so no earlier owner can change it any more.
        let dirty = match keys::get(self.directory.as_ref(), &self.keys.dirty_regions(volume)).await
        {
            Ok(r) => r.map(|r| r.value),
            Err(e) => {
                tracing::warn!(host = %self.id, %volume, error = %e, "dirty-region record unreadable; copies that are behind resync whole");
                None
            }
        };
        let recorder = Arc::new(DirectoryLayouts {
            halted: Arc::clone(&self.halted),
            directory: Arc::clone(&self.directory),
            keys: self.keys.clone(),
            volume: volume.clone(),
            epoch: owner.epoch,
            last: parking_lot::Mutex::new(layout.clone()),
            clock: Arc::clone(&self.clock),
            events: Arc::clone(&self.events),
        });
        match Coordinator::take_over_cached(
            layout,
            dirty,
            owner.epoch,
            serial_of(&record),
            self.components(volume),
            recorder,
            &HostShared {
                read_cache: Arc::clone(&self.read_cache),
                scheduler: Arc::clone(&self.scheduler),
            },
        )
        .await
        {
            Ok(c) => {
                tracing::info!(host = %self.id, %volume, epoch = %owner.epoch, "coordinating volume");
                self.events.emit(
                    EventCode::OwnershipTaken,
                    volume.as_str(),
                    format!("{} became {volume}'s owner at {}", self.id, owner.epoch),
                );
                let layout = c.layout();
                self.owned.write().insert(volume.clone(), c);
                self.apply_qos_of(volume);
                Some(Event::Coordinating {
                    volume: volume.clone(),
                    epoch: owner.epoch,
                    layout,
                })
            }
            Err(e) => {
                tracing::warn!(host = %self.id, %volume, error = %e, "could not take over; releasing ownership");
                let _ =
                    tessera_directory::release_owner(self.directory.as_ref(), &self.keys, &owner)
                        .await;
                None
            }
        }
    }

    /// Copies to `component` what it misses (the snapshots taken while it
    /// was away first), as a task with a row on the resync board; the core
    /// hears when it ends.
    fn spawn_resync(
        self: &Arc<Self>,
        volume: &VolumeId,
        coordinator: &Arc<Coordinator>,
        component: ComponentId,
        host: &HostId,
        kind: ResyncKind,
    ) {
        let attempt = self.board.start(volume, component, host, kind.as_str());
        self.events.emit(
            EventCode::ResyncStarted,
            volume.as_str(),
            format!(
                "{} of {volume}'s component {component} on {host} started",
                kind.as_str()
            ),
        );
        let events = Arc::clone(&self.events);
        let copy_host = host.clone();
        let coordinator = Arc::clone(coordinator);
        let volume = volume.clone();
        let weak = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            // No snapshot is taken from here until the copy receives
            // writes, so the list read next has every one it missed.
            let Some((held, chain)) = hold_and_read_snapshots(&weak, &coordinator, &volume).await
            else {
                return;
            };
            let result = match chain {
                Ok(chain) => {
                    coordinator
                        .resync_with_snapshots(component, &chain, held, attempt.progress())
                        .await
                }
                Err(reason) => Err(ResyncError::Unavailable {
                    volume: volume.to_string(),
                    reason,
                }),
            };
            let kind = kind.as_str();
            match &result {
                Ok(report) => {
                    tracing::info!(%volume, %component, copied_bytes = report.copied_bytes, dirty_bytes = report.dirty_bytes, "{kind} finished");
                    events.emit(
                        EventCode::ResyncFinished,
                        volume.as_str(),
                        format!(
                            "{kind} of {volume}'s component {component} on {copy_host} finished: {} copied of {} examined",
                            tessera_types::format_size(report.copied_bytes),
                            tessera_types::format_size(report.dirty_bytes)
                        ),
                    );
                }
                Err(e) => {
                    tracing::warn!(%volume, %component, error = %e, "{kind} stopped");
                    events.emit(
                        EventCode::ResyncFailed,
                        volume.as_str(),
                        format!("{kind} of {volume}'s component {component} on {copy_host} stopped: {e}"),
                    );
                }
            }
            let ok = result.is_ok();
            attempt.finish(&result);
            if let Some(host) = weak.upgrade() {
                host.control.lock().inbox.push(Event::ResyncEnded {
                    volume,
                    component,
                    ok,
                });
            }
        });
        self.tasks.lock().push(task);
    }

    /// Replaces a component that has been away too long (or failed) with a
    /// new one that placement chooses; the core then has it filled.
    async fn rebuild(
        self: &Arc<Self>,
        volume: &VolumeId,
        coordinator: &Arc<Coordinator>,
        lost: ComponentId,
    ) -> Option<Event> {
        if self.carrying.lock().contains(&(volume.clone(), lost)) {
            return None;
        }
        let record = self.view.volumes.read().get(volume).cloned()?;
        let policy =
            match keys::get(self.directory.as_ref(), &self.keys.policy(&record.policy)).await {
                Ok(Some(p)) => p.value,
                _ => return None,
            };
        let map = match crate::control_plane::cluster_map(self.directory.as_ref(), &self.keys).await
        {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(%volume, error = %e, "cannot rebuild: no cluster map");
                return None;
            }
        };
        let layout = coordinator.layout();
        let rng = Arc::clone(&self.rng);
        let mut next_id = move || ComponentId(rng.next_u64() >> 1);
        let target =
            match tessera_placement::rebuild_target(&policy, &layout, lost, &map, &mut next_id) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(%volume, component = %lost, error = %e, "cannot rebuild yet");
                    return None;
                }
            };
        let reserve =
            tessera_placement::reservation_bytes(target.size_bytes, policy.space_reservation_pct);
        let (new_id, new_host, role) = (target.id, target.host.clone(), target.role);
        // Decided with snapshots held: none can be taken between the look
        // and the new copy joining.
        let (held, chain) = self.snapshots_now(volume, coordinator).await?;
        if role == ComponentRole::Data && !chain.is_empty() {
            drop(held);
            let place = NewCopyPlace::Replacing(lost);
            self.spawn_carrying(volume, coordinator, place, target, reserve);
            return None;
        }
        tracing::warn!(%volume, lost = %lost, replacement = %new_id, host = %new_host, "rebuilding a component elsewhere");
        let replaced = coordinator.replace_component(lost, target, reserve).await;
        drop(held);
        if let Err(e) = replaced {
            tracing::warn!(%volume, error = %e, "rebuild could not start");
            return None;
        }
        self.events.emit(
            EventCode::ComponentReplaced,
            volume.as_str(),
            format!(
                "{volume}'s component {lost} is replaced by {new_id} on {new_host}, to be rebuilt"
            ),
        );
        Some(Event::Rebuilt {
            volume: volume.clone(),
            lost,
            replacement: (role == ComponentRole::Data).then_some((new_id, new_host)),
        })
    }
}

impl Host {
    /// The snapshots of `volume` as the directory holds them, read once
    /// no snapshot of it can be under way, with the hold that keeps new
    /// ones from being taken until it is dropped; None (after a warning)
    /// when the directory cannot be read.
    async fn snapshots_now(
        &self,
        volume: &VolumeId,
        coordinator: &Arc<Coordinator>,
    ) -> Option<(SnapshotsHeld, Vec<SnapshotChainLink>)> {
        let held = coordinator.hold_snapshots().await;
        match self.snapshot_chain(volume).await {
            Ok(chain) => Some((held, chain)),
            Err(e) => {
                tracing::warn!(%volume, error = %e, "cannot move copies now");
                None
            }
        }
    }

    /// The snapshots of `volume` as the directory holds them now, oldest
    /// first, as a new copy is given them.
    async fn snapshot_chain(&self, volume: &VolumeId) -> Result<Vec<SnapshotChainLink>, String> {
        let mut records: Vec<keys::SnapshotRecord> =
            keys::list(self.directory.as_ref(), &self.keys.snapshots_of(volume))
                .await
                .map_err(|e| format!("reading the snapshots of volume {volume}: {e}"))?
                .records
                .into_iter()
                .map(|r| r.value)
                .collect();
        records.sort_by_key(|r| (r.created_ms, r.id));
        Ok(records
            .into_iter()
            .map(|r| SnapshotChainLink {
                id: r.id,
                layout: r.layout,
            })
            .collect())
    }

    /// Puts new copy `target` of `volume` at `place` (a rebuild's or an
    /// evacuation's) with the volume's snapshots, as a task with a row on
    /// the resync board (no snapshot is taken meanwhile, and the snapshots
    /// are copied before the copy enters the layout); once it is in the
    /// layout the core hears [`Event::Rebuilt`] or [`Event::Evacuated`] and
    /// resyncs what changed since the last snapshot. A new copy for the
    /// same place already under way is left alone.
    fn spawn_carrying(
        self: &Arc<Self>,
        volume: &VolumeId,
        coordinator: &Arc<Coordinator>,
        place: NewCopyPlace,
        target: ComponentPlacement,
        reserve: u64,
    ) {
        let (at, kind) = match place {
            NewCopyPlace::Replacing(lost) => (lost, ResyncKind::Rebuild),
            NewCopyPlace::Beside(leaving) => (leaving, ResyncKind::Evacuate),
        };
        if !self.carrying.lock().insert((volume.clone(), at)) {
            return;
        }
        tracing::warn!(%volume, copy = %at, new = %target.id, host = %target.host, "{}: a new copy with the volume's snapshots", kind.as_str());
        let attempt = self
            .board
            .start(volume, target.id, &target.host, kind.as_str());
        let coordinator = Arc::clone(coordinator);
        let volume = volume.clone();
        let weak = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            let (new_id, new_host) = (target.id, target.host.clone());
            // No snapshot is taken from here on, so the list read next is
            // every snapshot the new copy must hold.
            let Some((held, chain)) = hold_and_read_snapshots(&weak, &coordinator, &volume).await
            else {
                return;
            };
            let result = match chain {
                Ok(chain) => {
                    coordinator
                        .add_copy_with_snapshots(place, target, reserve, &chain, attempt.progress())
                        .await
                }
                Err(reason) => Err(tessera_blockdev::BlockError::Unavailable { reason }),
            };
            drop(held);
            let report = match &result {
                Ok(carried) => {
                    tracing::info!(%volume, copy = %at, new = %new_id, copied_bytes = carried.copied_bytes, dirty_blocks = carried.dirty_blocks, "snapshots carried to the new copy");
                    Ok(ResyncReport {
                        component: new_id,
                        dirty_bytes: carried.dirty_blocks * BLOCK_BYTES,
                        copied_bytes: carried.copied_bytes,
                    })
                }
                Err(e) => {
                    tracing::warn!(%volume, copy = %at, error = %e, "new copy with snapshots stopped");
                    Err(ResyncError::Unavailable {
                        volume: volume.to_string(),
                        reason: e.to_string(),
                    })
                }
            };
            attempt.finish(&report);
            let Some(host) = weak.upgrade() else { return };
            host.carrying.lock().remove(&(volume.clone(), at));
            if result.is_ok() {
                let added = Some((new_id, new_host));
                host.control.lock().inbox.push(match place {
                    NewCopyPlace::Replacing(lost) => Event::Rebuilt {
                        volume,
                        lost,
                        replacement: added,
                    },
                    NewCopyPlace::Beside(component) => Event::Evacuated {
                        volume,
                        component,
                        added,
                    },
                });
            }
        });
        self.tasks.lock().push(task);
    }

    /// One step of moving `component` of `volume` off the disk group being
    /// evacuated that holds it: a witness is replaced at once; a data copy
    /// gets a new copy elsewhere beside it (filled by a resync the core
    /// starts), and once its column has as many full copies off evacuated
    /// disk groups as the policy asks, the old copy is dropped and
    /// deleted. Does nothing while a copy of its column is not Active.
    async fn evacuate(
        self: &Arc<Self>,
        volume: &VolumeId,
        coordinator: &Arc<Coordinator>,
        component: ComponentId,
    ) -> Option<Event> {
        if self.carrying.lock().contains(&(volume.clone(), component)) {
            return None;
        }
        let layout = coordinator.layout();
        let leaving = layout.component(component)?.clone();
        let record = self.view.volumes.read().get(volume).cloned()?;
        let policy =
            match keys::get(self.directory.as_ref(), &self.keys.policy(&record.policy)).await {
                Ok(Some(p)) => p.value,
                _ => return None,
            };
        let evacuating = self.evacuating_disk_groups();
        let stays = |c: &ComponentPlacement| {
            c.state == ComponentState::Active
                && !evacuating.contains(&(c.host.clone(), c.disk_group.clone()))
        };
        let done = |added: Option<(ComponentId, HostId)>| {
            Some(Event::Evacuated {
                volume: volume.clone(),
                component,
                added,
            })
        };
        if leaving.role == ComponentRole::Data {
            let column = layout
                .columns
                .iter()
                .find(|m| m.copies.iter().any(|c| c.id == component))?;
            if column
                .copies
                .iter()
                .any(|c| c.state != ComponentState::Active)
            {
                return None;
            }
            let full = column
                .copies
                .iter()
                .filter(|c| c.id != component && stays(c))
                .count();
            if full >= policy.copies() {
                // Its snapshots leave with it: the new copy has its own.
                let (_held, chain) = self.snapshots_now(volume, coordinator).await?;
                let snapshots = match coordinator
                    .drop_copy_with_snapshots(component, &chain)
                    .await
                {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(%volume, %component, error = %e, "evacuated copy not dropped");
                        return None;
                    }
                };
                tracing::info!(%volume, %component, host = %leaving.host, snapshots = snapshots.len(), "evacuated copy dropped");
                for s in snapshots.iter().chain(std::iter::once(&leaving)) {
                    self.delete_left_component(volume, s).await;
                }
                return done(None);
            }
        }
        let map = match crate::control_plane::cluster_map(self.directory.as_ref(), &self.keys).await
        {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(%volume, error = %e, "cannot evacuate: no cluster map");
                return None;
            }
        };
        let rng = Arc::clone(&self.rng);
        let mut next_id = move || ComponentId(rng.next_u64() >> 1);
        let target = match tessera_placement::rebuild_target(
            &policy,
            &layout,
            component,
            &map,
            &mut next_id,
        ) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(%volume, %component, error = %e, "nowhere to evacuate to yet");
                return None;
            }
        };
        let (new_id, new_host) = (target.id, target.host.clone());
        if leaving.role == ComponentRole::Witness {
            if let Err(e) = coordinator.replace_component(component, target, 0).await {
                tracing::warn!(%volume, %component, error = %e, "witness not moved");
                return None;
            }
            tracing::info!(%volume, %component, to = %new_host, "evacuated witness moved");
            self.delete_left_component(volume, &leaving).await;
            return done(None);
        }
        let reserve =
            tessera_placement::reservation_bytes(target.size_bytes, policy.space_reservation_pct);
        let (held, chain) = self.snapshots_now(volume, coordinator).await?;
        if !chain.is_empty() {
            drop(held);
            let place = NewCopyPlace::Beside(component);
            self.spawn_carrying(volume, coordinator, place, target, reserve);
            return None;
        }
        let added = coordinator.add_copy(component, target, reserve).await;
        drop(held);
        if let Err(e) = added {
            tracing::warn!(%volume, %component, error = %e, "no copy added for an evacuation");
            return None;
        }
        tracing::info!(%volume, leaving = %component, new = %new_id, host = %new_host, "copying a component off an evacuated disk group");
        done(Some((new_id, new_host)))
    }

    /// Deletes a component the layout no longer holds from its host; one
    /// that cannot be deleted now only keeps its space.
    async fn delete_left_component(&self, volume: &VolumeId, c: &ComponentPlacement) {
        if let Err(e) = self.components(volume).delete(c).await {
            tracing::warn!(%volume, component = %c.id, host = %c.host, error = %e, "component left behind by an evacuation not deleted");
        }
    }
}

/// Adds to `events` what changed in `current` since `reported`, which
/// then matches it: `put` for each record new or changed (as `summary`
/// tells them apart), `gone` for each record removed.
fn report_changes<V, S: PartialEq>(
    current: &HashMap<VolumeId, V>,
    reported: &mut HashMap<VolumeId, S>,
    summary: impl Fn(&V) -> S,
    put: impl Fn(&VolumeId, &V, &S) -> Event,
    gone: impl Fn(VolumeId) -> Event,
    events: &mut Vec<Event>,
) {
    for (volume, record) in current {
        let now = summary(record);
        if reported.get(volume) != Some(&now) {
            events.push(put(volume, record, &now));
            reported.insert(volume.clone(), now);
        }
    }
    reported.retain(|volume, _| {
        let keep = current.contains_key(volume);
        if !keep {
            events.push(gone(volume.clone()));
        }
        keep
    });
}

/// Bytes of `component` still to copy from its column's other copies.
fn dirty_bytes_of(coordinator: &Coordinator, component: ComponentId) -> u64 {
    coordinator
        .dirty_bytes()
        .into_iter()
        .find(|(id, _)| *id == component)
        .map_or(0, |(_, bytes)| bytes)
}

/// Holds off new snapshots of `volume` (see [`Coordinator::hold_snapshots`]),
/// then reads the ones it has from the directory, oldest first; None once
/// the host is gone.
async fn hold_and_read_snapshots(
    host: &std::sync::Weak<Host>,
    coordinator: &Arc<Coordinator>,
    volume: &VolumeId,
) -> Option<(SnapshotsHeld, Result<Vec<SnapshotChainLink>, String>)> {
    let held = coordinator.hold_snapshots().await;
    let host = host.upgrade()?;
    let chain = host.snapshot_chain(volume).await;
    Some((held, chain))
}
