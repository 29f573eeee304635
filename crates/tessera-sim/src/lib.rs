//! A seeded simulation of a cluster's control plane: the hosts' control
//! cores (`tessera_control::HostControl`, the code the real hosts run) over
//! a simulated directory, clock and network, on one thread, from one `u64`
//! seed. Every failure names its seed and replays exactly.
//!
//! Owns: the simulated world and its fault model, the checks of its
//! invariants, and the report of a run.
//!
//! What is simulated, and how (the fault model):
//! - **Time** moves in ticks of the hosts' control loop (500 ms).
//! - **The directory**: liveness leases that lapse [`LEASE_TICKS`] after
//!   their last renewal (taking their owner records with them), owner
//!   election at the highest epoch + 1, layouts written only by the owner
//!   of the highest epoch (fenced), and a watch per host that may lag: in a
//!   tick a host hears of the directory's changes only with probability
//!   3/4.
//! - **Disk groups** fail while their host stays up (the host writes the
//!   failure into the directory; its copies there are lost; a host that
//!   restarts comes back on a new, empty disk group).
//! - **Hosts** crash (their state is lost; their lease lapses), restart
//!   (a new core, a new lease, everything heard again), and are cut off
//!   from the network (they keep running their core, but renew nothing and
//!   reach neither the directory nor the other hosts) and healed.
//! - **A host's lease as it sees it**: held while its last renewal is less
//!   than the lease less one tick old, as the real host's session reckons
//!   ([`HOST_LEASE_MARGIN_TICKS`]), so it gives up before the directory
//!   lets another host take over.
//! - **Coordinators** are modelled by their layout: absence recorded for
//!   a host that is gone, a resync that ends [`RESYNC_TICKS`] later (and
//!   fails if either end is cut off or down), a rebuild that puts a new copy
//!   on a live host outside the layout.
//!
//! The data path (the real coordinator over simulated copies and network,
//! with write-before-acknowledge, dirty-region recording and epoch fencing
//! at the copies) is simulated by [`data_path`].
//!
//! Invariants checked after every tick of the fault phase (safety):
//! - at most one host that believes it holds its lease coordinates a given
//!   volume;
//! - no two hosts coordinate a volume at the same epoch (components tell
//!   owners apart by epoch alone);
//! - epochs granted to a volume strictly rise;
//! - no host coordinates a volume at an epoch above the highest granted.
//!
//! And at the end of the healing phase (liveness: faults off, every host up
//! and reachable, one failed disk group left in place): every volume is
//! coordinated by exactly one host, the one the directory names owner at
//! that epoch; its layout is the directory's; every copy is Active on a
//! live host, and none is on the failed disk group (its host is live, so
//! only the failure can have moved them).

pub mod data_path;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;
use tessera_control::{Action, ControlConfig, Event, HostControl};
use tessera_env::{Rng, SeededRng};
use tessera_types::layout::{ComponentPlacement, ComponentRole, ComponentState, Layout, Mirror};
use tessera_types::{ComponentId, DiskGroupId, Epoch, FaultDomainId, HostId, VolumeId};

/// Length of a tick of the control loop.
pub const TICK: Duration = Duration::from_millis(500);
/// Ticks a liveness lease lives after its last renewal.
pub const LEASE_TICKS: u64 = 8;
/// Ticks before its lease lapses at which a host stops counting on it.
pub const HOST_LEASE_MARGIN_TICKS: u64 = 1;
/// Ticks a component may stay absent before it is rebuilt elsewhere.
pub const REPAIR_TICKS: u64 = 40;
/// Ticks a resync takes.
pub const RESYNC_TICKS: u64 = 3;

/// The shape of a run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Hosts in the cluster.
    pub hosts: u8,
    /// FTT=1 volumes (two data copies and a witness each).
    pub volumes: u8,
    /// Ticks with faults on.
    pub fault_ticks: u64,
    /// Ticks with faults off, after which everything must have healed.
    pub heal_ticks: u64,
    /// Per tick, the chance (in 1/1000) of a fault.
    pub fault_per_mille: u64,
    /// How many ticks before its lease lapses a host stops counting on it:
    /// [`HOST_LEASE_MARGIN_TICKS`]; a negative margin (a host that counts
    /// on its lease after the directory dropped it) is a protection
    /// switched off, which the safety checks must catch.
    pub host_lease_margin_ticks: i64,
    /// Grant every owner the same epoch instead of the highest + 1: epoch
    /// fencing switched off, which the safety checks must catch.
    pub same_epoch_for_every_owner: bool,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            hosts: 5,
            volumes: 4,
            fault_ticks: 400,
            heal_ticks: 160,
            fault_per_mille: 60,
            host_lease_margin_ticks: HOST_LEASE_MARGIN_TICKS as i64,
            same_epoch_for_every_owner: false,
        }
    }
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimReport {
    /// Faults injected.
    pub faults: u64,
    /// Ownerships taken.
    pub takeovers: u64,
    /// Resyncs that completed.
    pub resyncs: u64,
    /// Copies rebuilt elsewhere.
    pub rebuilds: u64,
    /// Disk groups that failed.
    pub disk_group_failures: u64,
    /// A digest of everything that happened, to show a replay is exact.
    pub digest: u64,
}

/// A broken invariant, with the seed that replays it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The run's seed.
    pub seed: u64,
    /// The tick at which it was found.
    pub tick: u64,
    /// What broke.
    pub what: String,
    /// The last things that happened.
    pub trace: Vec<String>,
    /// The call that replays it.
    pub replay: &'static str,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} broke an invariant at tick {}: {}",
            self.seed, self.tick, self.what
        )?;
        writeln!(
            f,
            "replay: {}({}, &config); last events:",
            self.replay, self.seed
        )?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// Runs one simulation; the same seed and configuration give the same run.
pub fn run(seed: u64, config: &SimConfig) -> Result<SimReport, Violation> {
    let mut world = World::new(seed, config.clone());
    for _ in 0..config.fault_ticks {
        world.maybe_fault();
        world.step()?;
    }
    world.heal_everything();
    for _ in 0..config.heal_ticks {
        world.step()?;
    }
    world.check_healed()?;
    Ok(world.report)
}

/// The directory's records.
#[derive(Default)]
struct Directory {
    /// Leases: their host and the tick they lapse.
    leases: BTreeMap<u64, (HostId, u64)>,
    next_lease: u64,
    /// Each live host's liveness key, on its newest lease.
    liveness: BTreeMap<HostId, u64>,
    volumes: BTreeSet<VolumeId>,
    /// Owner records, each on its owner's lease.
    owners: BTreeMap<VolumeId, (HostId, Epoch, u64)>,
    highest: BTreeMap<VolumeId, Epoch>,
    layouts: BTreeMap<VolumeId, Layout>,
    /// Hosts whose disk group failed (until they restart on a new one).
    failed_groups: BTreeSet<HostId>,
}

/// What a host has heard of the directory.
#[derive(Default)]
struct Heard {
    live: BTreeSet<HostId>,
    volumes: BTreeSet<VolumeId>,
    owners: BTreeMap<VolumeId, (HostId, Epoch)>,
    layouts: BTreeMap<VolumeId, u64>,
    failed_groups: BTreeSet<HostId>,
    lease_held: bool,
}

struct SimHost {
    id: HostId,
    core: HostControl,
    up: bool,
    cut_off: bool,
    /// Its lease.
    lease: u64,
    /// Tick of the last lease renewal the directory took.
    renewed: u64,
    heard: Heard,
    /// The coordinators it runs: epoch and layout.
    coordinating: BTreeMap<VolumeId, (Epoch, Layout)>,
    /// Layout generations its core has heard from its coordinators.
    coordinator_generations: BTreeMap<VolumeId, u64>,
    /// Resyncs under way: (tick they end, volume, component).
    resyncs: Vec<(u64, VolumeId, ComponentId)>,
}

struct World {
    seed: u64,
    config: SimConfig,
    rng: SeededRng,
    tick: u64,
    directory: Directory,
    hosts: Vec<SimHost>,
    next_component: u64,
    report: SimReport,
    trace: Vec<String>,
}

fn control_config() -> ControlConfig {
    ControlConfig {
        repair_delay: TICK * REPAIR_TICKS as u32,
        resync_backoff: TICK * LEASE_TICKS as u32,
    }
}

fn placement(id: u64, role: ComponentRole, host: &HostId) -> ComponentPlacement {
    ComponentPlacement {
        id: ComponentId(id),
        role,
        host: host.clone(),
        disk_group: DiskGroupId("dg0".into()),
        fault_domain: FaultDomainId(host.0.clone()),
        votes: 1,
        size_bytes: if role == ComponentRole::Data {
            1 << 30
        } else {
            0
        },
        state: ComponentState::Active,
    }
}

impl Directory {
    /// A new lease for `host` until `until`, carrying its liveness key.
    fn grant(&mut self, host: &HostId, until: u64) -> u64 {
        self.next_lease += 1;
        self.leases.insert(self.next_lease, (host.clone(), until));
        self.liveness.insert(host.clone(), self.next_lease);
        self.next_lease
    }

    /// The owner records as hosts read them.
    fn owner_view(&self) -> BTreeMap<VolumeId, (HostId, Epoch)> {
        self.owners
            .iter()
            .map(|(v, (h, e, _))| (v.clone(), (h.clone(), *e)))
            .collect()
    }
}

impl World {
    fn new(seed: u64, config: SimConfig) -> World {
        let rng = SeededRng::new(seed);
        let ids: Vec<HostId> = (1..=config.hosts)
            .map(|k| HostId(format!("host-{k}")))
            .collect();
        let mut directory = Directory::default();
        let mut next_component = 1;
        for v in 1..=config.volumes {
            let volume = VolumeId(format!("vol-{v}"));
            // Three distinct hosts, chosen by the seed.
            let mut chosen: Vec<HostId> = Vec::new();
            while chosen.len() < 3 {
                let h = ids[(rng.next_u64() % ids.len() as u64) as usize].clone();
                if !chosen.contains(&h) {
                    chosen.push(h);
                }
            }
            let mut id = || {
                next_component += 1;
                next_component
            };
            let layout = Layout {
                volume: volume.clone(),
                size_bytes: 1 << 30,
                stripe_unit_bytes: 1 << 20,
                columns: vec![Mirror {
                    copies: vec![
                        placement(id(), ComponentRole::Data, &chosen[0]),
                        placement(id(), ComponentRole::Data, &chosen[1]),
                    ],
                }],
                witnesses: vec![placement(id(), ComponentRole::Witness, &chosen[2])],
                generation: 1,
            };
            directory.volumes.insert(volume.clone());
            directory.layouts.insert(volume, layout);
        }
        let hosts = ids
            .into_iter()
            .map(|id| {
                let lease = directory.grant(&id, LEASE_TICKS);
                SimHost::new(id, lease, 0)
            })
            .collect();
        World {
            seed,
            config,
            rng,
            tick: 0,
            directory,
            hosts,
            next_component,
            report: SimReport::default(),
            trace: Vec::new(),
        }
    }

    fn note(&mut self, line: String) {
        // FNV-1a over the trace: two runs with the same digest did the same.
        let mut h = self.report.digest ^ 0xcbf2_9ce4_8422_2325;
        for b in line.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        self.report.digest = h;
        self.trace.push(format!("t{} {line}", self.tick));
        if self.trace.len() > 60 {
            self.trace.remove(0);
        }
    }

    fn violation(&self, what: String) -> Violation {
        Violation {
            seed: self.seed,
            tick: self.tick,
            what,
            trace: self.trace.clone(),
            replay: "tessera_sim::run",
        }
    }

    fn chance(&self, per_mille: u64) -> bool {
        self.rng.next_u64() % 1000 < per_mille
    }

    /// Perhaps one fault: a crash, a restart, a cut or a heal.
    fn maybe_fault(&mut self) {
        if !self.chance(self.config.fault_per_mille) {
            return;
        }
        let i = (self.rng.next_u64() % self.hosts.len() as u64) as usize;
        let kind = self.rng.next_u64() % 5;
        let (up, cut_off) = (self.hosts[i].up, self.hosts[i].cut_off);
        let line = match (kind, up, cut_off) {
            (0, true, _) => {
                self.hosts[i].up = false;
                self.hosts[i].coordinating.clear();
                format!("fault: {} crashes", self.hosts[i].id)
            }
            (1, false, _) => {
                self.restart(i);
                format!("fault: {} restarts", self.hosts[i].id)
            }
            (2, true, false) => {
                self.hosts[i].cut_off = true;
                format!("fault: {} is cut off", self.hosts[i].id)
            }
            (3, _, true) => {
                self.hosts[i].cut_off = false;
                format!("fault: {} is reachable again", self.hosts[i].id)
            }
            (4, true, _) if !self.directory.failed_groups.contains(&self.hosts[i].id) => {
                // The host stays up and says so (its record is written by
                // the host itself, so only while it reaches the directory).
                if self.hosts[i].cut_off {
                    return;
                }
                self.directory
                    .failed_groups
                    .insert(self.hosts[i].id.clone());
                self.report.disk_group_failures += 1;
                format!("fault: the disk group of {} fails", self.hosts[i].id)
            }
            _ => return,
        };
        self.report.faults += 1;
        self.note(line);
    }

    fn restart(&mut self, i: usize) {
        let id = self.hosts[i].id.clone();
        // It comes back on a new device: an empty, healthy disk group.
        self.directory.failed_groups.remove(&id);
        let lease = self.directory.grant(&id, self.tick + LEASE_TICKS);
        self.hosts[i] = SimHost::new(id, lease, self.tick);
    }

    /// Faults off: every host up and reachable, and every failed disk
    /// group but one replaced; the one left must lose its copies to the
    /// other hosts (with five hosts and three copies a volume, there is
    /// always room).
    fn heal_everything(&mut self) {
        let mut failed_kept = false;
        for i in 0..self.hosts.len() {
            let failed = self.directory.failed_groups.contains(&self.hosts[i].id);
            if !self.hosts[i].up || (failed && failed_kept) {
                self.restart(i);
            } else if failed {
                failed_kept = true;
            }
            self.hosts[i].cut_off = false;
        }
        self.note("faults off: every host up and reachable".into());
    }

    /// One tick of the world: leases lapse, then every host runs its loop.
    fn step(&mut self) -> Result<(), Violation> {
        self.tick += 1;
        let tick = self.tick;
        let lapsed: Vec<(u64, HostId)> = self
            .directory
            .leases
            .iter()
            .filter(|(_, (_, until))| *until <= tick)
            .map(|(lease, (h, _))| (*lease, h.clone()))
            .collect();
        for (lease, host) in lapsed {
            self.directory.leases.remove(&lease);
            self.directory.liveness.retain(|_, l| *l != lease);
            self.directory.owners.retain(|_, (_, _, l)| *l != lease);
            self.note(format!("directory: lease {lease} of {host} lapsed"));
        }
        for i in 0..self.hosts.len() {
            if self.hosts[i].up {
                self.host_turn(i)?;
            }
        }
        self.check_safety()
    }

    fn host_lease_held(&self, i: usize) -> bool {
        let h = &self.hosts[i];
        let margin = self.config.host_lease_margin_ticks;
        (self.tick as i64) < h.renewed as i64 + LEASE_TICKS as i64 - margin
    }

    fn host_turn(&mut self, i: usize) -> Result<(), Violation> {
        let tick = self.tick;
        // Renew the lease while the directory still has it.
        let lease = self.hosts[i].lease;
        if !self.hosts[i].cut_off {
            if let Some((_, until)) = self.directory.leases.get_mut(&lease) {
                *until = tick + LEASE_TICKS;
                self.hosts[i].renewed = tick;
            }
        }
        let mut events = Vec::new();
        let held = self.host_lease_held(i);
        if held != self.hosts[i].heard.lease_held {
            self.hosts[i].heard.lease_held = held;
            events.push(if held {
                Event::LeaseHeld
            } else {
                Event::LeaseLost
            });
        }
        // The watch: heard this tick, or later.
        if !self.hosts[i].cut_off && self.chance(750) {
            events.extend(self.changes_for(i));
        }
        // Resyncs that end now.
        let (ended, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.hosts[i].resyncs)
            .into_iter()
            .partition(|(at, _, _)| *at <= tick);
        self.hosts[i].resyncs = running;
        for (_, volume, component) in ended {
            let ok = self.finish_resync(i, &volume, component);
            events.push(Event::ResyncEnded {
                volume,
                component,
                ok,
            });
        }
        // The coordinators' layouts.
        let layouts: Vec<Layout> = self.hosts[i]
            .coordinating
            .values()
            .map(|(_, l)| l.clone())
            .collect();
        for layout in layouts {
            let known = self.hosts[i]
                .coordinator_generations
                .insert(layout.volume.clone(), layout.generation);
            if known != Some(layout.generation) {
                events.push(Event::CoordinatorLayout { layout });
            }
        }
        events.push(Event::Tick {
            now: TICK * tick as u32,
        });
        let mut actions = Vec::new();
        for event in events {
            actions.extend(self.hosts[i].core.handle(event));
        }
        while !actions.is_empty() {
            let action = actions.remove(0);
            let follow = self.carry_out(i, action)?;
            if let Some(event) = follow {
                actions.extend(self.hosts[i].core.handle(event));
            }
        }
        Ok(())
    }

    /// What changed in the directory since host `i` last heard.
    fn changes_for(&mut self, i: usize) -> Vec<Event> {
        let mut events = Vec::new();
        let live: BTreeSet<HostId> = self.directory.liveness.keys().cloned().collect();
        let owners = self.directory.owner_view();
        let heard = &mut self.hosts[i].heard;
        for host in live.symmetric_difference(&heard.live) {
            events.push(Event::HostLiveness {
                host: host.clone(),
                live: live.contains(host),
            });
        }
        heard.live = live;
        for volume in self.directory.volumes.difference(&heard.volumes) {
            events.push(Event::VolumeRecorded {
                volume: volume.clone(),
                ready: true,
            });
        }
        heard.volumes = self.directory.volumes.clone();
        for (volume, (host, epoch)) in &owners {
            if heard.owners.get(volume) != Some(&(host.clone(), *epoch)) {
                events.push(Event::OwnerRecorded {
                    volume: volume.clone(),
                    host: host.clone(),
                    epoch: *epoch,
                });
            }
        }
        for volume in heard.owners.keys() {
            if !owners.contains_key(volume) {
                events.push(Event::OwnerRemoved {
                    volume: volume.clone(),
                });
            }
        }
        heard.owners = owners;
        for host in self
            .directory
            .failed_groups
            .symmetric_difference(&heard.failed_groups)
        {
            events.push(Event::DiskGroupHealth {
                host: host.clone(),
                disk_group: DiskGroupId("dg0".into()),
                failed: self.directory.failed_groups.contains(host),
                failed_components: BTreeSet::new(),
            });
        }
        heard.failed_groups = self.directory.failed_groups.clone();
        for (volume, layout) in &self.directory.layouts {
            if heard.layouts.insert(volume.clone(), layout.generation) != Some(layout.generation) {
                events.push(Event::LayoutRecorded {
                    layout: layout.clone(),
                });
            }
        }
        events
    }

    /// Writes a coordinator's layout to the directory if it still holds
    /// the highest epoch (the real recorder's fencing) and can reach it.
    fn record(&mut self, i: usize, volume: &VolumeId) {
        let Some((epoch, layout)) = self.hosts[i].coordinating.get(volume).cloned() else {
            return;
        };
        if self.hosts[i].cut_off || self.directory.highest.get(volume) != Some(&epoch) {
            return;
        }
        self.directory.layouts.insert(volume.clone(), layout);
    }

    fn finish_resync(&mut self, i: usize, volume: &VolumeId, component: ComponentId) -> bool {
        let Some((_, layout)) = self.hosts[i].coordinating.get(volume) else {
            return false;
        };
        let Some(target) = layout.component(component).map(|c| c.host.clone()) else {
            return false;
        };
        let target_ok = self
            .hosts
            .iter()
            .any(|h| h.id == target && h.up && !h.cut_off)
            && !self.directory.failed_groups.contains(&target);
        let ok = target_ok && !self.hosts[i].cut_off;
        if ok {
            let (_, layout) = self.hosts[i].coordinating.get_mut(volume).unwrap();
            for c in layout.components_mut() {
                if c.id == component {
                    c.state = ComponentState::Active;
                }
            }
            layout.generation += 1;
            self.record(i, volume);
            self.report.resyncs += 1;
        }
        let id = self.hosts[i].id.clone();
        self.note(format!(
            "{id}: resync of {volume}/{component} ended ok={ok}"
        ));
        ok
    }

    fn carry_out(&mut self, i: usize, action: Action) -> Result<Option<Event>, Violation> {
        let id = self.hosts[i].id.clone();
        self.note(format!("{id}: {action:?}"));
        match action {
            Action::DropAllCoordinators => self.hosts[i].coordinating.clear(),
            Action::Rejoin => {
                if !self.hosts[i].cut_off {
                    self.hosts[i].lease = self.directory.grant(&id, self.tick + LEASE_TICKS);
                    self.hosts[i].renewed = self.tick;
                }
            }
            Action::StopCoordinating { volume } => {
                self.hosts[i].coordinating.remove(&volume);
                self.hosts[i].coordinator_generations.remove(&volume);
            }
            Action::TakeOwnership { volume } => {
                let lease = self.hosts[i].lease;
                if self.hosts[i].cut_off
                    || self.directory.owners.contains_key(&volume)
                    || !self.directory.leases.contains_key(&lease)
                {
                    return Ok(None);
                }
                let highest = self
                    .directory
                    .highest
                    .get(&volume)
                    .copied()
                    .unwrap_or_default();
                let epoch = if self.config.same_epoch_for_every_owner {
                    Epoch(1)
                } else {
                    Epoch(highest.0 + 1)
                };
                if epoch <= highest && !self.config.same_epoch_for_every_owner {
                    return Err(self.violation(format!(
                        "{volume}: epoch {epoch:?} granted after {highest:?}"
                    )));
                }
                self.directory.highest.insert(volume.clone(), epoch);
                self.directory
                    .owners
                    .insert(volume.clone(), (id.clone(), epoch, lease));
                let layout = self.directory.layouts[&volume].clone();
                self.hosts[i]
                    .coordinating
                    .insert(volume.clone(), (epoch, layout.clone()));
                self.hosts[i]
                    .coordinator_generations
                    .insert(volume.clone(), layout.generation);
                self.report.takeovers += 1;
                return Ok(Some(Event::Coordinating {
                    volume,
                    epoch,
                    layout,
                }));
            }
            Action::ReleaseOwnership { volume, epoch } => {
                let names_us = self
                    .directory
                    .owners
                    .get(&volume)
                    .is_some_and(|(h, e, _)| *h == id && *e == epoch);
                if !self.hosts[i].cut_off && names_us {
                    self.directory.owners.remove(&volume);
                }
            }
            Action::RecordHostAbsent { volume, host } => {
                self.change_layout(i, &volume, |l| {
                    for c in l.components_mut() {
                        if c.host == host
                            && matches!(c.state, ComponentState::Active | ComponentState::Resyncing)
                        {
                            c.state = ComponentState::Absent;
                        }
                    }
                });
            }
            Action::RecordWitnessPresent { volume, host } => {
                self.change_layout(i, &volume, |l| {
                    for c in l.witnesses.iter_mut() {
                        if c.host == host {
                            c.state = ComponentState::Active;
                        }
                    }
                });
            }
            Action::StartResync {
                volume, component, ..
            } => {
                self.change_layout(i, &volume, |l| {
                    for c in l.components_mut() {
                        if c.id == component && c.state == ComponentState::Absent {
                            c.state = ComponentState::Resyncing;
                        }
                    }
                });
                let at = self.tick + RESYNC_TICKS;
                self.hosts[i].resyncs.push((at, volume, component));
            }
            Action::ResyncWaiting { .. } => {}
            Action::Rebuild { volume, component } => return Ok(self.rebuild(i, &volume, component)),
            // No disk group of the simulated cluster is ever evacuated.
            Action::Evacuate { .. } => {
                return Err(self.violation(format!("{id}: {action:?} with nothing evacuated")))
            }
        }
        Ok(None)
    }

    fn change_layout(&mut self, i: usize, volume: &VolumeId, f: impl FnOnce(&mut Layout)) {
        if let Some((_, layout)) = self.hosts[i].coordinating.get_mut(volume) {
            let before = layout.clone();
            f(layout);
            if *layout != before {
                layout.generation += 1;
                self.record(i, volume);
            }
        }
    }

    /// Puts a new copy in place of `lost` on a live host outside the
    /// layout, if there is one the coordinator can reach.
    fn rebuild(&mut self, i: usize, volume: &VolumeId, lost: ComponentId) -> Option<Event> {
        if self.hosts[i].cut_off {
            return None;
        }
        let (_, layout) = self.hosts[i].coordinating.get(volume)?;
        let used: BTreeSet<HostId> = layout.components().map(|c| c.host.clone()).collect();
        let role = layout.component(lost)?.role;
        let target = self
            .directory
            .liveness
            .keys()
            .find(|h| !used.contains(*h) && !self.directory.failed_groups.contains(*h))?
            .clone();
        self.next_component += 1;
        let mut new = placement(self.next_component, role, &target);
        new.state = match role {
            ComponentRole::Data => ComponentState::Resyncing,
            ComponentRole::Witness => ComponentState::Active,
        };
        let new_id = new.id;
        self.change_layout(i, volume, |l| {
            for c in l.components_mut() {
                if c.id == lost {
                    *c = new.clone();
                }
            }
        });
        self.report.rebuilds += 1;
        Some(Event::Rebuilt {
            volume: volume.clone(),
            lost,
            replacement: (role == ComponentRole::Data).then_some((new_id, target)),
        })
    }

    fn check_safety(&self) -> Result<(), Violation> {
        for volume in &self.directory.volumes {
            // Components tell owners apart by epoch alone: two coordinators
            // at one epoch could both write.
            let mut epochs: BTreeMap<Epoch, &HostId> = BTreeMap::new();
            for h in self.hosts.iter().filter(|h| h.up) {
                if let Some((epoch, _)) = h.coordinating.get(volume) {
                    if let Some(other) = epochs.insert(*epoch, &h.id) {
                        return Err(self.violation(format!(
                            "{volume} coordinated by {other} and {} at the same epoch {epoch:?}",
                            h.id
                        )));
                    }
                }
            }
            let believers: Vec<(HostId, Epoch)> = (0..self.hosts.len())
                .filter(|&i| self.hosts[i].up && self.host_lease_held(i))
                .filter_map(|i| {
                    let h = &self.hosts[i];
                    h.coordinating.get(volume).map(|(e, _)| (h.id.clone(), *e))
                })
                .collect();
            if believers.len() > 1 {
                return Err(self.violation(format!(
                    "{volume} coordinated at once by hosts that each count on their lease: {believers:?}"
                )));
            }
            let highest = self
                .directory
                .highest
                .get(volume)
                .copied()
                .unwrap_or_default();
            for h in self.hosts.iter().filter(|h| h.up) {
                if let Some((epoch, _)) = h.coordinating.get(volume) {
                    if *epoch > highest {
                        return Err(self.violation(format!(
                            "{} coordinates {volume} at {epoch:?}, above the highest granted {highest:?}",
                            h.id
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    fn check_healed(&self) -> Result<(), Violation> {
        for volume in &self.directory.volumes {
            let coordinators: Vec<&SimHost> = self
                .hosts
                .iter()
                .filter(|h| h.coordinating.contains_key(volume))
                .collect();
            let [host] = coordinators.as_slice() else {
                let owner = self.directory.owners.get(volume);
                let leases: Vec<String> = self
                    .hosts
                    .iter()
                    .map(|h| format!("{} lease {} renewed t{}", h.id, h.lease, h.renewed))
                    .collect();
                return Err(self.violation(format!(
                    "after healing, {volume} is coordinated by {} hosts (owner record {owner:?}; {leases:?}; live leases {:?})",
                    coordinators.len(),
                    self.directory.leases
                )));
            };
            let (epoch, layout) = &host.coordinating[volume];
            let owner = self.directory.owner_view().get(volume).cloned();
            if owner != Some((host.id.clone(), *epoch)) {
                return Err(self.violation(format!(
                    "after healing, {} coordinates {volume} at {epoch:?} but the directory names {owner:?}",
                    host.id
                )));
            }
            if self.directory.layouts.get(volume) != Some(layout) {
                return Err(self.violation(format!(
                    "after healing, the directory's layout of {volume} is not its coordinator's"
                )));
            }
            for c in layout.components() {
                if self.directory.failed_groups.contains(&c.host) {
                    return Err(self.violation(format!(
                        "after healing, component {} of {volume} is still on the failed disk group of {}",
                        c.id, c.host
                    )));
                }
                let live = self.directory.liveness.contains_key(&c.host);
                if c.state != ComponentState::Active || !live {
                    return Err(self.violation(format!(
                        "after healing, component {} of {volume} on {} is {:?} (host live: {live})",
                        c.id, c.host, c.state
                    )));
                }
            }
        }
        Ok(())
    }
}

impl SimHost {
    fn new(id: HostId, lease: u64, tick: u64) -> SimHost {
        SimHost {
            core: HostControl::new(id.clone(), control_config()),
            id,
            up: true,
            cut_off: false,
            lease,
            renewed: tick,
            heard: Heard {
                lease_held: true,
                ..Heard::default()
            },
            coordinating: BTreeMap::new(),
            coordinator_generations: BTreeMap::new(),
            resyncs: Vec::new(),
        }
    }
}
