//! The decisions of one host about the cluster's volumes, as a state
//! machine: events in, actions out.
//!
//! Owns: what a host decides and when: which ownerless volumes it takes
//! (and after how long), which coordinators it stops (ownership moved, the
//! volume went, its lease was lost), which components it records absent,
//! when a returning copy is resynced, when an absent or failed one is
//! rebuilt elsewhere (at once for a copy whose disk group or capacity
//! device failed: no resync can bring its data back), how long a failed
//! resync waits before it is tried again, and when a component on a disk
//! group being evacuated is moved (one move per volume at a time, and only
//! while every component of the volume is Active, so an evacuation never
//! takes a volume below its protection). [`HostControl`] learns the cluster from [`Event`]s (changes of
//! directory records, its lease, its coordinators' layouts, the ends of the
//! resyncs it started, the time) and answers each with [`Action`]s for the
//! host to carry out.
//!
//! Must not touch: the directory, the network, disks, clocks, threads or
//! randomness. The node feeds it from the directory and runs its actions;
//! a simulator feeds it directly, so a seed replays every decision. Its
//! maps are ordered, so the same events give the same actions in the same
//! order on every run.
//!
//! Invariants (checked on every action it returns, see
//! [`HostControl::handle`]):
//! - while the host's lease is not held it asks for nothing but dropping
//!   its coordinators and rejoining; after [`Event::LeaseLost`] it
//!   coordinates nothing;
//! - it asks to take ownership only of a ready volume with no owner that
//!   it does not coordinate, and to release an owner record only of a
//!   volume it does not coordinate;
//! - it acts on a volume's components (absence, witness, resync, rebuild)
//!   only while it coordinates that volume;
//! - at most one resync of a component runs at a time: a second start
//!   waits for [`Event::ResyncEnded`] of the first;
//! - it asks to move a component off an evacuated disk group only of a
//!   volume it coordinates whose components are all Active.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tessera_types::layout::{ComponentRole, ComponentState, Layout};
use tessera_types::{ComponentId, DiskGroupId, Epoch, HostId, VolumeId};

/// Ticks a volume stays ownerless before a host holding one of its data
/// copies, though not the first, takes it.
pub const HOLDER_TICKS: u32 = 2;
/// Ticks a volume stays ownerless before any live host takes it (so a
/// volume whose data hosts are all gone still gets an owner, which reports
/// it unavailable).
pub const ANY_HOST_TICKS: u32 = 6;

/// The host's settings that shape its decisions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlConfig {
    /// How long a component may stay absent before it is rebuilt elsewhere.
    pub repair_delay: Duration,
    /// How long a component whose resync failed waits before the next
    /// attempt: a host that just stopped still looks live until its lease
    /// lapses, so one lease.
    pub resync_backoff: Duration,
}

/// Why a component is being copied to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResyncKind {
    /// A copy that was away catches up (a delta resync).
    Resync,
    /// A new copy made in place of a lost one is filled.
    Rebuild,
    /// A new copy made to take the place of one on a disk group being
    /// evacuated is filled (the old one serves until it is).
    Evacuate,
}

impl ResyncKind {
    /// The word users see.
    pub fn as_str(self) -> &'static str {
        match self {
            ResyncKind::Resync => "resync",
            ResyncKind::Rebuild => "rebuild",
            ResyncKind::Evacuate => "evacuate",
        }
    }
}

/// What the host learns.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Time passed; the host decides. `now` is monotonic and never goes back.
    Tick {
        /// The host's monotonic time.
        now: Duration,
    },
    /// The host's liveness lease lapsed: another host may own its volumes.
    LeaseLost,
    /// The host holds a liveness lease (again).
    LeaseHeld,
    /// Another host's liveness lease is held (`live`) or gone.
    HostLiveness {
        /// The host.
        host: HostId,
        /// Whether its lease is held.
        live: bool,
    },
    /// A disk group's record says what failed in it: the whole group
    /// (`failed`: its cache device, log or checkpoint), or the components
    /// of its failed capacity devices. Empty and false: healthy again (or
    /// the group is gone).
    DiskGroupHealth {
        /// Its host.
        host: HostId,
        /// The disk group.
        disk_group: DiskGroupId,
        /// The whole group failed.
        failed: bool,
        /// Components lost with a failed capacity device.
        failed_components: BTreeSet<ComponentId>,
    },
    /// A disk group is being evacuated (its components are moved off it
    /// before maintenance), or no longer.
    DiskGroupEvacuating {
        /// Its host.
        host: HostId,
        /// The disk group.
        disk_group: DiskGroupId,
        /// Whether it is being evacuated.
        evacuating: bool,
    },
    /// A volume record was written.
    VolumeRecorded {
        /// The volume.
        volume: VolumeId,
        /// Whether it is ready for I/O (not being created or deleted).
        ready: bool,
    },
    /// A volume record was removed.
    VolumeRemoved {
        /// The volume.
        volume: VolumeId,
    },
    /// A volume's owner record was written.
    OwnerRecorded {
        /// The volume.
        volume: VolumeId,
        /// The owning host.
        host: HostId,
        /// The owner's epoch.
        epoch: Epoch,
    },
    /// A volume's owner record was removed (released, or its lease lapsed).
    OwnerRemoved {
        /// The volume.
        volume: VolumeId,
    },
    /// A layout record was written (or is newly known).
    LayoutRecorded {
        /// The layout.
        layout: Layout,
    },
    /// A layout record was removed.
    LayoutRemoved {
        /// The volume.
        volume: VolumeId,
    },
    /// The host now coordinates `volume` at `epoch`, with this layout.
    Coordinating {
        /// The volume.
        volume: VolumeId,
        /// The epoch it took ownership at.
        epoch: Epoch,
        /// The coordinator's layout.
        layout: Layout,
    },
    /// A coordinator of this host changed its layout (a layout with a
    /// generation already known changes nothing).
    CoordinatorLayout {
        /// The coordinator's layout.
        layout: Layout,
    },
    /// A coordinator of this host met a higher epoch: another host owns the
    /// volume now.
    CoordinatorSuperseded {
        /// The volume.
        volume: VolumeId,
    },
    /// A rebuild replaced `lost`; `replacement` names the new data copy to
    /// fill (none for a witness).
    Rebuilt {
        /// The volume.
        volume: VolumeId,
        /// The component replaced.
        lost: ComponentId,
        /// The new data component and its host.
        replacement: Option<(ComponentId, HostId)>,
    },
    /// A step of an evacuation of `component` was carried out: a new copy
    /// `added` to fill (then the old one stays until it is full), or the
    /// old component gone (`added` none).
    Evacuated {
        /// The volume.
        volume: VolumeId,
        /// The component leaving.
        component: ComponentId,
        /// The new data copy and its host, to fill.
        added: Option<(ComponentId, HostId)>,
    },
    /// A resync or rebuild this host started ended.
    ResyncEnded {
        /// The volume.
        volume: VolumeId,
        /// The component copied to.
        component: ComponentId,
        /// Whether it completed.
        ok: bool,
    },
}

/// What the host is asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Stop every coordinator at once: the lease is lost.
    DropAllCoordinators,
    /// Register again with a new lease.
    Rejoin,
    /// Stop coordinating `volume` (requests under way read from the copies).
    StopCoordinating {
        /// The volume.
        volume: VolumeId,
    },
    /// Try to become `volume`'s owner at a new epoch and coordinate it; on
    /// success the host sends [`Event::Coordinating`].
    TakeOwnership {
        /// The volume.
        volume: VolumeId,
    },
    /// The directory names this host `volume`'s owner at `epoch`, but it
    /// does not coordinate it (it stepped down on news older than its own
    /// take-over, or the take-over failed and the release did not reach
    /// the directory): delete that owner record, if it still says so, so
    /// the volume can be taken again.
    ReleaseOwnership {
        /// The volume.
        volume: VolumeId,
        /// The epoch of the record to delete.
        epoch: Epoch,
    },
    /// Record `host`'s components of `volume` absent: they miss writes,
    /// which are tracked for a delta resync.
    RecordHostAbsent {
        /// The volume.
        volume: VolumeId,
        /// The absent host.
        host: HostId,
    },
    /// `host` is back: its witness of `volume` votes again.
    RecordWitnessPresent {
        /// The volume.
        volume: VolumeId,
        /// The returned host.
        host: HostId,
    },
    /// Copy to `component` of `volume` on `host` what it misses; the host
    /// sends [`Event::ResyncEnded`] when it ends.
    StartResync {
        /// The volume.
        volume: VolumeId,
        /// The component to bring up to date.
        component: ComponentId,
        /// Its host.
        host: HostId,
        /// Resync or rebuild.
        kind: ResyncKind,
    },
    /// The resync of `component` waits (its host is away, or a failed
    /// attempt waits out its backoff): shown as waiting, with the bytes it
    /// has to copy.
    ResyncWaiting {
        /// The volume.
        volume: VolumeId,
        /// The component.
        component: ComponentId,
    },
    /// Move `component` of `volume` off the disk group being evacuated that
    /// holds it, without lowering the volume's protection: the host adds a
    /// new copy elsewhere (and sends [`Event::Evacuated`] naming it, to
    /// fill), or, once a full new copy is there, drops the old one (a
    /// witness is replaced at once). Asked for one component of a volume
    /// at a time, and only while every component is Active.
    Evacuate {
        /// The volume.
        volume: VolumeId,
        /// The component to move.
        component: ComponentId,
    },
    /// Replace `component` of `volume` (absent past the repair delay,
    /// Degraded, or on a disk group or device that failed) with a new one
    /// elsewhere; on success the host sends [`Event::Rebuilt`].
    Rebuild {
        /// The volume.
        volume: VolumeId,
        /// The component to replace.
        component: ComponentId,
    },
}

/// A volume's owner as the directory records it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Owner {
    host: HostId,
    epoch: Epoch,
}

/// What failed in one disk group.
#[derive(Clone, Debug, Default)]
struct FailedStorage {
    whole_group: bool,
    components: BTreeSet<ComponentId>,
}

/// A volume this host coordinates.
#[derive(Clone, Debug)]
struct Coordinated {
    epoch: Epoch,
    layout: Layout,
    superseded: bool,
}

type ComponentKey = (VolumeId, ComponentId);

/// The control core of one host. See the module doc.
#[derive(Clone, Debug)]
pub struct HostControl {
    host: HostId,
    config: ControlConfig,
    now: Duration,
    lease_held: bool,
    live: BTreeSet<HostId>,
    /// Volume records: whether each is ready.
    volumes: BTreeMap<VolumeId, bool>,
    owners: BTreeMap<VolumeId, Owner>,
    /// Layout records of the directory.
    layouts: BTreeMap<VolumeId, Layout>,
    /// What failed in each disk group that reported a failure.
    failed_storage: BTreeMap<(HostId, DiskGroupId), FailedStorage>,
    /// Disk groups being evacuated.
    evacuating: BTreeSet<(HostId, DiskGroupId)>,
    coordinating: BTreeMap<VolumeId, Coordinated>,
    /// Ticks each volume has been seen without an owner.
    ownerless_ticks: BTreeMap<VolumeId, u32>,
    /// When each absent component was first seen absent.
    absent_since: BTreeMap<ComponentKey, Duration>,
    /// Components with a resync running.
    resyncing: BTreeSet<ComponentKey>,
    /// When a component whose resync failed may be tried again.
    resync_not_before: BTreeMap<ComponentKey, Duration>,
}

impl HostControl {
    /// The core of `host`, which holds its lease (it has just registered)
    /// and knows nothing of the cluster yet.
    pub fn new(host: HostId, config: ControlConfig) -> HostControl {
        HostControl {
            host,
            config,
            now: Duration::ZERO,
            lease_held: true,
            live: BTreeSet::new(),
            volumes: BTreeMap::new(),
            owners: BTreeMap::new(),
            layouts: BTreeMap::new(),
            failed_storage: BTreeMap::new(),
            evacuating: BTreeSet::new(),
            coordinating: BTreeMap::new(),
            ownerless_ticks: BTreeMap::new(),
            absent_since: BTreeMap::new(),
            resyncing: BTreeSet::new(),
            resync_not_before: BTreeMap::new(),
        }
    }

    /// The host this core decides for.
    pub fn host(&self) -> &HostId {
        &self.host
    }

    /// Volumes this host coordinates, with their epochs.
    pub fn coordinating(&self) -> impl Iterator<Item = (&VolumeId, Epoch)> {
        self.coordinating.iter().map(|(v, c)| (v, c.epoch))
    }

    /// Whether a resync of `component` of `volume` is running.
    pub fn is_resyncing(&self, volume: &VolumeId, component: ComponentId) -> bool {
        self.resyncing.contains(&(volume.clone(), component))
    }

    /// Changes how long a component may stay absent before it is rebuilt
    /// elsewhere; components already absent count from when they went
    /// absent, so a shorter delay may start their rebuilds at the next tick.
    pub fn set_repair_delay(&mut self, repair_delay: Duration) {
        self.config.repair_delay = repair_delay;
    }

    /// How long from `now` until `component` of `volume` is rebuilt
    /// elsewhere if it stays absent; None unless this host coordinates the
    /// volume and counts the component's repair delay.
    pub fn repair_in(
        &self,
        volume: &VolumeId,
        component: ComponentId,
        now: Duration,
    ) -> Option<Duration> {
        let since = self.absent_since.get(&(volume.clone(), component))?;
        let at = *since + self.config.repair_delay;
        Some(at.saturating_sub(now))
    }

    /// Learns `event` and answers with what the host should do, in order.
    ///
    /// # Panics
    /// If an action would break an invariant of the module doc: that is a
    /// bug in this module, and the simulator's runs are there to find it.
    pub fn handle(&mut self, event: Event) -> Vec<Action> {
        let actions = self.apply(event);
        for action in &actions {
            self.check(action);
        }
        actions
    }

    fn apply(&mut self, event: Event) -> Vec<Action> {
        match event {
            Event::Tick { now } => {
                self.now = self.now.max(now);
                return self.tick();
            }
            Event::LeaseLost => {
                self.lease_held = false;
                if !self.coordinating.is_empty() {
                    self.coordinating.clear();
                    return vec![Action::DropAllCoordinators];
                }
            }
            Event::LeaseHeld => self.lease_held = true,
            Event::HostLiveness { host, live } => {
                if live {
                    self.live.insert(host);
                } else {
                    self.live.remove(&host);
                }
            }
            Event::DiskGroupHealth {
                host,
                disk_group,
                failed,
                failed_components,
            } => {
                if failed || !failed_components.is_empty() {
                    self.failed_storage.insert(
                        (host, disk_group),
                        FailedStorage {
                            whole_group: failed,
                            components: failed_components,
                        },
                    );
                } else {
                    self.failed_storage.remove(&(host, disk_group));
                }
            }
            Event::DiskGroupEvacuating {
                host,
                disk_group,
                evacuating,
            } => {
                if evacuating {
                    self.evacuating.insert((host, disk_group));
                } else {
                    self.evacuating.remove(&(host, disk_group));
                }
            }
            Event::VolumeRecorded { volume, ready } => {
                self.volumes.insert(volume, ready);
            }
            Event::VolumeRemoved { volume } => {
                self.volumes.remove(&volume);
                self.ownerless_ticks.remove(&volume);
            }
            Event::OwnerRecorded {
                volume,
                host,
                epoch,
            } => {
                self.ownerless_ticks.remove(&volume);
                self.owners.insert(volume, Owner { host, epoch });
            }
            Event::OwnerRemoved { volume } => {
                self.owners.remove(&volume);
            }
            Event::LayoutRecorded { layout } => {
                self.layouts.insert(layout.volume.clone(), layout);
            }
            Event::LayoutRemoved { volume } => {
                self.layouts.remove(&volume);
            }
            Event::Coordinating {
                volume,
                epoch,
                layout,
            } => {
                if !self.lease_held {
                    // Taken over while the lease lapsed: it must not serve.
                    return vec![Action::StopCoordinating { volume }];
                }
                self.ownerless_ticks.remove(&volume);
                // The host wrote this owner record itself; the directory's
                // news of it may come after the next tick.
                self.owners.insert(
                    volume.clone(),
                    Owner {
                        host: self.host.clone(),
                        epoch,
                    },
                );
                self.coordinating.insert(
                    volume,
                    Coordinated {
                        epoch,
                        layout,
                        superseded: false,
                    },
                );
            }
            Event::CoordinatorLayout { layout } => {
                if let Some(c) = self.coordinating.get_mut(&layout.volume) {
                    if layout.generation > c.layout.generation {
                        c.layout = layout;
                    }
                }
            }
            Event::CoordinatorSuperseded { volume } => {
                if let Some(c) = self.coordinating.get_mut(&volume) {
                    c.superseded = true;
                }
            }
            Event::Rebuilt {
                volume,
                lost,
                replacement,
            } => {
                self.absent_since.remove(&(volume.clone(), lost));
                if let Some((component, host)) = replacement {
                    if self.lease_held && self.coordinating.contains_key(&volume) {
                        return self.start_resync(&volume, component, &host, ResyncKind::Rebuild);
                    }
                }
            }
            Event::Evacuated {
                volume,
                component: _,
                added,
            } => {
                if let Some((component, host)) = added {
                    if self.lease_held && self.coordinating.contains_key(&volume) {
                        return self.start_resync(&volume, component, &host, ResyncKind::Evacuate);
                    }
                }
            }
            Event::ResyncEnded {
                volume,
                component,
                ok,
            } => {
                let key = (volume, component);
                self.resyncing.remove(&key);
                if ok {
                    self.resync_not_before.remove(&key);
                } else {
                    self.resync_not_before
                        .insert(key, self.now + self.config.resync_backoff);
                }
            }
        }
        Vec::new()
    }

    /// The decisions of one tick.
    fn tick(&mut self) -> Vec<Action> {
        let mut actions = Vec::new();
        if !self.lease_held {
            if !self.coordinating.is_empty() {
                self.coordinating.clear();
                actions.push(Action::DropAllCoordinators);
            }
            actions.push(Action::Rejoin);
            return actions;
        }
        // Stop coordinating volumes deleted, owned elsewhere now, or whose
        // coordinator met a higher epoch.
        let stopped: Vec<VolumeId> = self
            .coordinating
            .iter()
            .filter(|(volume, c)| {
                let ready = self.volumes.get(*volume).copied().unwrap_or(false);
                let ours = self
                    .owners
                    .get(*volume)
                    .is_some_and(|o| o.host == self.host && o.epoch == c.epoch);
                !(ready && ours && !c.superseded)
            })
            .map(|(volume, _)| volume.clone())
            .collect();
        for volume in &stopped {
            self.coordinating.remove(volume);
            actions.push(Action::StopCoordinating {
                volume: volume.clone(),
            });
        }
        let ready: Vec<VolumeId> = self
            .volumes
            .iter()
            .filter(|(_, ready)| **ready)
            .map(|(v, _)| v.clone())
            .collect();
        for volume in ready {
            if self.coordinating.contains_key(&volume) {
                self.maintain(&volume, &mut actions);
            } else {
                match self.owners.get(&volume) {
                    None => {
                        if self.should_take(&volume) {
                            actions.push(Action::TakeOwnership { volume });
                        }
                    }
                    // Stepped down this tick: the record naming this host
                    // is likely old news, replaced soon.
                    Some(owner) if owner.host == self.host && !stopped.contains(&volume) => {
                        let epoch = owner.epoch;
                        self.ownerless_ticks.remove(&volume);
                        actions.push(Action::ReleaseOwnership { volume, epoch });
                    }
                    Some(_) => {
                        self.ownerless_ticks.remove(&volume);
                    }
                }
            }
        }
        // Forget what belongs to volumes no longer coordinated here.
        let coordinating = &self.coordinating;
        self.absent_since
            .retain(|(v, _), _| coordinating.contains_key(v));
        actions
    }

    /// Whether this host should try to own the ownerless `volume` now: the
    /// first live host holding an active data copy at once, other hosts
    /// holding one after [`HOLDER_TICKS`], any live host after
    /// [`ANY_HOST_TICKS`].
    fn should_take(&mut self, volume: &VolumeId) -> bool {
        let Some(layout) = self.layouts.get(volume) else {
            return false;
        };
        let ticks = self.ownerless_ticks.entry(volume.clone()).or_default();
        *ticks += 1;
        let ticks = *ticks;
        let data_hosts: Vec<&HostId> = layout
            .columns
            .iter()
            .flat_map(|m| m.copies.iter())
            .filter(|c| c.state == ComponentState::Active)
            .map(|c| &c.host)
            .filter(|h| **h == self.host || self.live.contains(*h))
            .collect();
        let preferred = data_hosts.first() == Some(&&self.host);
        let holder = data_hosts.contains(&&self.host);
        preferred || (holder && ticks >= HOLDER_TICKS) || ticks >= ANY_HOST_TICKS
    }

    /// Reacts to the hosts of a coordinated volume's components leaving and
    /// returning.
    fn maintain(&mut self, volume: &VolumeId, actions: &mut Vec<Action>) {
        let layout = self.coordinating[volume].layout.clone();
        let mut absent_hosts = BTreeSet::new();
        for c in layout.components() {
            let live = c.host == self.host || self.live.contains(&c.host);
            let key = (volume.clone(), c.id);
            if self.storage_failed(&c.host, &c.disk_group, c.id) {
                // Its data is gone with the device: no resync can bring it
                // back, and waiting out the repair delay only leaves the
                // volume with one copy fewer for longer.
                self.absent_since.remove(&key);
                actions.push(Action::Rebuild {
                    volume: volume.clone(),
                    component: c.id,
                });
                continue;
            }
            match (c.state, live) {
                (ComponentState::Active | ComponentState::Resyncing, false) => {
                    absent_hosts.insert(c.host.clone());
                }
                (ComponentState::Absent, true) if c.role == ComponentRole::Witness => {
                    self.absent_since.remove(&key);
                    actions.push(Action::RecordWitnessPresent {
                        volume: volume.clone(),
                        host: c.host.clone(),
                    });
                }
                (ComponentState::Absent | ComponentState::Resyncing, true) => {
                    self.absent_since.remove(&key);
                    actions.extend(self.start_resync(volume, c.id, &c.host, ResyncKind::Resync));
                }
                (ComponentState::Absent, false) => {
                    // A failed resync of it is tried again when its host returns.
                    actions.push(Action::ResyncWaiting {
                        volume: volume.clone(),
                        component: c.id,
                    });
                    let since = *self.absent_since.entry(key).or_insert(self.now);
                    if self.now.saturating_sub(since) >= self.config.repair_delay {
                        actions.push(Action::Rebuild {
                            volume: volume.clone(),
                            component: c.id,
                        });
                    }
                }
                (ComponentState::Degraded, _) => actions.push(Action::Rebuild {
                    volume: volume.clone(),
                    component: c.id,
                }),
                _ => {}
            }
        }
        let whole = absent_hosts.is_empty()
            && layout.components().all(|c| {
                c.state == ComponentState::Active
                    && !self.storage_failed(&c.host, &c.disk_group, c.id)
            })
            && !self.resyncing.iter().any(|(v, _)| v == volume);
        for host in absent_hosts {
            actions.push(Action::RecordHostAbsent {
                volume: volume.clone(),
                host,
            });
        }
        // One move at a time, and only from a whole volume, so an
        // evacuation never takes a volume below its protection.
        if whole {
            if let Some(c) = layout.components().find(|c| {
                self.evacuating
                    .contains(&(c.host.clone(), c.disk_group.clone()))
            }) {
                actions.push(Action::Evacuate {
                    volume: volume.clone(),
                    component: c.id,
                });
            }
        }
    }

    /// Whether `component` on `host`'s `disk_group` was lost with its disk
    /// group or capacity device.
    fn storage_failed(
        &self,
        host: &HostId,
        disk_group: &DiskGroupId,
        component: ComponentId,
    ) -> bool {
        self.failed_storage
            .get(&(host.clone(), disk_group.clone()))
            .is_some_and(|f| f.whole_group || f.components.contains(&component))
    }

    /// Starts a resync of `component` unless one runs or a failed one waits
    /// out its backoff.
    fn start_resync(
        &mut self,
        volume: &VolumeId,
        component: ComponentId,
        host: &HostId,
        kind: ResyncKind,
    ) -> Vec<Action> {
        let key = (volume.clone(), component);
        if self
            .resync_not_before
            .get(&key)
            .is_some_and(|&t| self.now < t)
        {
            return vec![Action::ResyncWaiting {
                volume: volume.clone(),
                component,
            }];
        }
        if !self.resyncing.insert(key) {
            return Vec::new();
        }
        vec![Action::StartResync {
            volume: volume.clone(),
            component,
            host: host.clone(),
            kind,
        }]
    }

    /// Asserts the module's invariants of one action just returned.
    fn check(&self, action: &Action) {
        match action {
            Action::DropAllCoordinators | Action::Rejoin => {
                assert!(
                    self.coordinating.is_empty(),
                    "{}: coordinators left after {action:?}",
                    self.host
                );
            }
            Action::StopCoordinating { volume } => assert!(
                !self.coordinating.contains_key(volume),
                "{}: {volume} still coordinated after {action:?}",
                self.host
            ),
            Action::TakeOwnership { volume } => {
                assert!(self.lease_held, "{}: {action:?} without a lease", self.host);
                assert!(
                    !self.coordinating.contains_key(volume) && !self.owners.contains_key(volume),
                    "{}: {action:?} of a volume with an owner",
                    self.host
                );
                assert!(
                    self.volumes.get(volume) == Some(&true),
                    "{}: {action:?} of a volume not ready",
                    self.host
                );
            }
            Action::ReleaseOwnership { volume, .. } => {
                assert!(self.lease_held, "{}: {action:?} without a lease", self.host);
                assert!(
                    !self.coordinating.contains_key(volume),
                    "{}: {action:?} of a volume it coordinates",
                    self.host
                );
            }
            Action::RecordHostAbsent { volume, .. }
            | Action::RecordWitnessPresent { volume, .. }
            | Action::ResyncWaiting { volume, .. }
            | Action::Rebuild { volume, .. } => {
                assert!(self.lease_held, "{}: {action:?} without a lease", self.host);
                assert!(
                    self.coordinating.contains_key(volume),
                    "{}: {action:?} of a volume not coordinated here",
                    self.host
                );
            }
            Action::Evacuate { volume, component } => {
                assert!(self.lease_held, "{}: {action:?} without a lease", self.host);
                let layout = self.coordinating.get(volume).map(|c| &c.layout);
                assert!(
                    layout.is_some_and(|l| l
                        .components()
                        .all(|c| c.state == ComponentState::Active)
                        && l.component(*component).is_some()),
                    "{}: {action:?} of a volume not coordinated here or not whole",
                    self.host
                );
                assert!(
                    self.coordinating.contains_key(volume),
                    "{}: {action:?} of a volume not coordinated here",
                    self.host
                );
            }
            Action::StartResync {
                volume, component, ..
            } => {
                assert!(self.lease_held, "{}: {action:?} without a lease", self.host);
                assert!(
                    self.coordinating.contains_key(volume),
                    "{}: {action:?} of a volume not coordinated here",
                    self.host
                );
                assert!(
                    self.resyncing.contains(&(volume.clone(), *component)),
                    "{}: {action:?} not recorded as running",
                    self.host
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
