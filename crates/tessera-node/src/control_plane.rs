//! The cluster's control plane: [`ClusterControl`] over the directory and
//! the hosts of this process.
//!
//! Owns: policy and volume life cycles (validation, placement, component
//! creation, records), the views `status` and `object show` print (a full
//! clone's fill progress among them), copy verification, and
//! stopping/starting hosts in `tessera up`.
//! Must not touch: I/O paths. Volume I/O belongs to the owners'
//! coordinators (a full clone's fill too: `host/fill.rs`); this module only
//! reads components to compare them.
//! Invariants: a refused request changes nothing: every check happens
//! before the first write, and a volume whose components could not all be
//! created has the created ones deleted again. While a full clone is
//! filled, the snapshot it copies and that snapshot's volume are neither
//! deleted nor renamed, and the clone is neither snapshotted, resized nor
//! renamed (each refusal names the fill).

use crate::control::*;
use crate::health::{volume_health, worse, HealthInputs, MissingComponent, VolumeHealthInput};
use crate::host::Host;
use crate::peers::Peers;
use crate::resync_board::ResyncBoard;
use async_trait::async_trait;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tessera_directory::keys::{self, VolumeRecord, VolumeState};
use tessera_directory::{Directory, Keyspace};
use tessera_env::{Clock, Rng, SeededRng, SystemClock};
use tessera_object::ComponentIo;
use tessera_placement::{ClusterMap, DiskGroupHealth, HostLiveness};
use tessera_types::layout::{ComponentPlacement, ComponentRole, ComponentState, Layout};
use tessera_types::policy::Policy;
use tessera_types::{
    format_size, ComponentId, DiskGroupId, HostId, PolicyName, VolumeId, BLOCK_BYTES,
};

/// Logical block sizes a volume may present: 512e and 4Kn.
const VOLUME_BLOCK_SIZES: [u32; 2] = [512, 4096];

/// Bytes compared per read by `object verify`.
const VERIFY_STEP_BLOCKS: u64 = 256;
/// Divergences listed before `object verify` stops listing.
const DIVERGENCES_SHOWN_MAX: usize = 32;

/// How long a create or resize waits for the volume to get an owner.
const OWNER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How a host slot in this process is started again after `host stop`.
pub type HostStarter =
    Arc<dyn Fn() -> futures::future::BoxFuture<'static, Result<Arc<Host>, String>> + Send + Sync>;

/// One host of this process.
pub struct HostSlot {
    /// Host id.
    pub id: HostId,
    /// The running host, or None while stopped.
    pub host: Mutex<Option<Arc<Host>>>,
    /// Starts it again (only in `tessera up`).
    pub starter: Option<HostStarter>,
    /// The last stopped instance, until every reference to it is gone: its
    /// devices must be closed before a new instance opens them.
    pub stopped: Mutex<Option<std::sync::Weak<tessera_replica::ReplicaService>>>,
}

/// How long `host start` waits for the stopped instance to release its devices.
const HOST_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// The hosts of this process.
pub struct HostSet {
    slots: Vec<HostSlot>,
}

impl HostSet {
    /// A single host that cannot be stopped through the API.
    pub fn single(host: Arc<Host>) -> HostSet {
        HostSet {
            slots: vec![HostSlot {
                id: host.id().clone(),
                host: Mutex::new(Some(host)),
                starter: None,
                stopped: Mutex::new(None),
            }],
        }
    }

    /// Hosts that can be stopped and started (tessera up).
    pub fn new(slots: Vec<HostSlot>) -> HostSet {
        HostSet { slots }
    }

    /// A running host, preferring the first.
    pub fn any(&self) -> Option<Arc<Host>> {
        self.slots.iter().find_map(|s| s.host.lock().clone())
    }

    /// Every running host.
    pub fn running(&self) -> Vec<Arc<Host>> {
        self.slots
            .iter()
            .filter_map(|s| s.host.lock().clone())
            .collect()
    }

    fn slot(&self, id: &str) -> Option<&HostSlot> {
        self.slots.iter().find(|s| s.id.as_str() == id)
    }

    /// Stops every host cleanly.
    pub async fn stop_all(&self) {
        for slot in &self.slots {
            let host = slot.host.lock().take();
            if let Some(h) = host {
                h.stop(true).await;
            }
        }
    }
}

/// The control plane.
pub struct ControlPlane {
    directory: Arc<dyn Directory>,
    keys: Keyspace,
    cluster: String,
    hosts: HostSet,
    board: Arc<ResyncBoard>,
    clock: Arc<dyn Clock>,
    rng: Arc<dyn Rng>,
    /// Serialises volume and policy changes made through this API.
    changes: tokio::sync::Mutex<()>,
    /// Seals CHAP secrets before they reach the directory.
    secrets: Option<Arc<tessera_tls::SecretsKey>>,
    /// Audit entries written since start (the log is trimmed every so
    /// many).
    audit_appends: std::sync::atomic::AtomicU64,
    /// The last hour of what clients did to the volumes this process's
    /// hosts own (the dashboard's charts).
    history: parking_lot::Mutex<crate::activity_history::ActivityHistory>,
}

mod audit;
mod full_clone;
mod snapshots;
mod tokens;
pub use tokens::AdminTokenFile;

/// Compares every Active copy of each column of `layout` (the volume's, or
/// its `snapshot`'s) where any copy holds data, into `report`.
async fn compare_copies(
    components: &dyn ComponentIo,
    name: &str,
    layout: &Layout,
    snapshot: Option<&str>,
    report: &mut VerifyReport,
) -> Result<(), ControlError> {
    for (column, mirror) in layout.columns.iter().enumerate() {
        let copies: Vec<_> = mirror
            .copies
            .iter()
            .filter(|c| {
                let ok = c.state == ComponentState::Active;
                if !ok {
                    report
                        .skipped
                        .push(format!("component {} on {} is {:?}", c.id, c.host, c.state));
                }
                ok
            })
            .collect();
        if copies.len() < 2 {
            continue;
        }
        let blocks = copies[0].size_bytes / BLOCK_BYTES;
        // Compare where any copy holds data; elsewhere all read as zeros.
        let mut ranges = tessera_object::DirtyRegions::new();
        for c in &copies {
            let runs = components
                .allocated(c, tessera_types::Lba(0), blocks)
                .await
                .map_err(|e| ControlError::Unavailable(format!("volume {name}: {e}")))?;
            for (lba, n) in runs {
                ranges.insert(lba.0, n);
            }
        }
        for (start, count) in ranges.ranges().collect::<Vec<_>>() {
            let mut pos = start;
            while pos < start + count {
                let step = (start + count - pos).min(VERIFY_STEP_BLOCKS);
                let mut first: Option<bytes::Bytes> = None;
                for c in &copies {
                    let data = components
                        .read(
                            c,
                            tessera_types::Lba(pos),
                            step as u32,
                            tessera_object::IoClass::Resync,
                        )
                        .await
                        .map_err(|e| ControlError::Unavailable(format!("volume {name}: {e}")))?;
                    match &first {
                        None => first = Some(data),
                        Some(f) if *f != data => {
                            report.identical = false;
                            if report.divergences.len() < DIVERGENCES_SHOWN_MAX {
                                report.divergences.push(Divergence {
                                    column,
                                    component_offset: pos * BLOCK_BYTES,
                                    len: step * BLOCK_BYTES,
                                    components: copies.iter().map(|c| c.id).collect(),
                                    snapshot: snapshot.map(str::to_string),
                                });
                            }
                        }
                        Some(_) => {}
                    }
                }
                report.compared_bytes += step * BLOCK_BYTES;
                pos += step;
            }
        }
    }
    Ok(())
}

/// Creates every component of `layout` (a new volume `name` under
/// `policy`, data copies with the policy's reservation) on its host; when
/// one cannot be made, deletes those made before it and says why.
async fn create_components(
    components: &dyn ComponentIo,
    name: &VolumeId,
    layout: &Layout,
    policy: &Policy,
) -> Result<Vec<ComponentPlacement>, ControlError> {
    let mut created = Vec::new();
    for c in layout.components() {
        let reserve = if c.role == ComponentRole::Data {
            tessera_placement::reservation_bytes(c.size_bytes, policy.space_reservation_pct)
        } else {
            0
        };
        if let Err(e) = components.create(c, reserve).await {
            for done in &created {
                let _ = components.delete(done).await;
            }
            return Err(match e {
                tessera_object::ComponentError::NoSpace { .. } => {
                    ControlError::Unsatisfiable(format!(
                        "volume {name}: host {} has no space for a component of {}",
                        c.host,
                        format_size(c.size_bytes)
                    ))
                }
                other => ControlError::Unavailable(format!("volume {name}: {other}")),
            });
        }
        created.push(c.clone());
    }
    Ok(created)
}

/// Bytes `layout`'s data copies reserve up front under `policy`.
fn reserved_bytes(layout: &Layout, policy: &Policy) -> u64 {
    layout
        .columns
        .iter()
        .flat_map(|m| m.copies.iter())
        .map(|c| tessera_placement::reservation_bytes(c.size_bytes, policy.space_reservation_pct))
        .sum()
}

fn internal(e: impl std::fmt::Display) -> ControlError {
    ControlError::Unavailable(format!("directory: {e}"))
}

/// The cluster map placement needs: hosts, their fault domains, liveness and
/// disk group space, from the directory.
pub async fn cluster_map(directory: &dyn Directory, keys: &Keyspace) -> Result<ClusterMap, String> {
    let groups = keys::list(directory, &keys.disk_groups())
        .await
        .map_err(|e| e.to_string())?;
    let records = keys::list(directory, &keys.hosts())
        .await
        .map_err(|e| e.to_string())?;
    let evacuating: HashSet<(HostId, DiskGroupId)> = keys::list(directory, &keys.evacuations())
        .await
        .map_err(|e| e.to_string())?
        .records
        .iter()
        .flat_map(|r| r.value.places())
        .collect();
    let peers = Peers::default();
    peers.update(
        records.records.into_iter().map(|r| r.value).collect(),
        tessera_directory::live_hosts(directory, keys)
            .await
            .map_err(|e| e.to_string())?,
    );
    let mut hosts = Vec::new();
    for record in peers.records() {
        let mut host = tessera_placement::Host::new(record.id.clone())
            .in_fault_domain(record.fault_domain.clone())
            .with_liveness(if peers.is_live(&record.id) {
                HostLiveness::Live
            } else {
                HostLiveness::Absent
            });
        if record.witness_only {
            host = host.witness_only();
        }
        for g in groups.records.iter().filter(|g| g.value.host == record.id) {
            let mut dg =
                tessera_placement::DiskGroup::new(g.value.id.clone(), g.value.capacity_bytes);
            dg.used_bytes = g.value.used_bytes;
            dg.reserved_bytes = g.value.reserved_bytes;
            if g.value.state == keys::DiskGroupState::Failed {
                dg.health = DiskGroupHealth::Failed;
            } else if evacuating.contains(&(record.id.clone(), g.value.id.clone())) {
                dg.health = DiskGroupHealth::Evacuating;
            }
            host = host.with_disk_group(dg);
        }
        hosts.push(host);
    }
    ClusterMap::new(hosts).map_err(|e| e.to_string())
}

impl ControlPlane {
    /// A volume's SCSI offload counters, added up over the hosts this
    /// process runs (each counts the commands that came through its portal).
    fn offloads(&self, volume: &VolumeId) -> OffloadView {
        let running = self.hosts.running();
        let mut offloads = running
            .iter()
            .filter_map(|h| h.offload_counters(volume))
            .fold(OffloadView::default(), |sum, c| OffloadView {
                ats: sum.ats + c.ats,
                ats_miscompare: sum.ats_miscompare + c.ats_miscompare,
                clone_commands: sum.clone_commands + c.clone_commands,
                clone_read_blocks: sum.clone_read_blocks + c.clone_read_blocks,
                clone_write_blocks: sum.clone_write_blocks + c.clone_write_blocks,
                clone_shared_bytes: 0,
                zero_blocks: sum.zero_blocks + c.zero_blocks,
                delete_blocks: sum.delete_blocks + c.delete_blocks,
                out_of_space: sum.out_of_space + c.out_of_space,
            });
        // Sharing happens on the owner's coordinator, whichever host's
        // portal the EXTENDED COPY came through.
        offloads.clone_shared_bytes = running
            .iter()
            .flat_map(|h| h.owned())
            .filter(|(v, _)| v == volume)
            .map(|(_, c)| c.counters().shared_copy_bytes.load(Ordering::Relaxed))
            .sum();
        offloads
    }

    /// A control plane for `cluster` over `directory` and this process's hosts.
    pub fn new(
        directory: Arc<dyn Directory>,
        cluster: &str,
        hosts: HostSet,
        board: Arc<ResyncBoard>,
    ) -> ControlPlane {
        ControlPlane {
            directory,
            keys: Keyspace::new(cluster).unwrap_or_else(|_| {
                Keyspace::new("tessera").expect("the default cluster name is valid")
            }),
            cluster: cluster.to_string(),
            hosts,
            board,
            clock: Arc::new(SystemClock::default()),
            rng: Arc::new(SeededRng::from_entropy()),
            changes: tokio::sync::Mutex::new(()),
            secrets: None,
            audit_appends: std::sync::atomic::AtomicU64::new(0),
            history: Default::default(),
        }
    }

    /// Samples this process's volume activity into the history every
    /// [`crate::activity_history::SAMPLE_INTERVAL`] until the control plane
    /// is dropped.
    pub fn start_activity_sampling(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let control = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(crate::activity_history::SAMPLE_INTERVAL);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(control) = control.upgrade() else {
                    return;
                };
                // Counters are read in memory: this cannot fail or wait on
                // another host.
                if let Ok(sample) = control.activity().await {
                    let at_ms = control.clock.wall_ms();
                    control.history.lock().record(at_ms, sample);
                }
            }
        })
    }

    /// The same control plane sealing the secrets it keeps in the
    /// directory (CHAP secrets) with `secrets`.
    pub fn with_secrets(mut self, secrets: Option<Arc<tessera_tls::SecretsKey>>) -> Self {
        self.secrets = secrets;
        self
    }

    /// The hosts of this process.
    pub fn hosts(&self) -> &HostSet {
        &self.hosts
    }

    /// A running host of this process to reach components through, with a
    /// fresh view of the other hosts' addresses.
    async fn via(&self) -> Result<Arc<Host>, ControlError> {
        let host = self.hosts.any().ok_or_else(|| {
            ControlError::Unavailable("no host is running in this process".into())
        })?;
        host.refresh_peers().await;
        Ok(host)
    }

    /// Records a new volume and its layout in one transaction, if no volume
    /// of its name exists; false if one does.
    async fn record_new_volume(
        &self,
        record: &VolumeRecord,
        layout: &Layout,
    ) -> Result<bool, ControlError> {
        self.record_new_volume_when(record, layout, Vec::new())
            .await
    }

    /// [`ControlPlane::record_new_volume`], if `compares` hold too.
    async fn record_new_volume_when(
        &self,
        record: &VolumeRecord,
        layout: &Layout,
        compares: Vec<tessera_directory::Compare>,
    ) -> Result<bool, ControlError> {
        let name = &record.name;
        let txn = tessera_directory::Txn::new()
            .when(std::iter::once(self.keys.volume(name).absent()).chain(compares))
            .and_then([
                self.keys
                    .volume(name)
                    .put_op(record, None)
                    .map_err(internal)?,
                self.keys
                    .layout(name)
                    .put_op(layout, None)
                    .map_err(internal)?,
            ]);
        Ok(self.directory.txn(txn).await.map_err(internal)?.succeeded)
    }

    async fn volume_record(&self, name: &str) -> Result<(VolumeRecord, Layout), ControlError> {
        let volume = VolumeId::new(name).map_err(|e| ControlError::Invalid(e.to_string()))?;
        let record = keys::get(self.directory.as_ref(), &self.keys.volume(&volume))
            .await
            .map_err(internal)?
            .ok_or_else(|| ControlError::NotFound(format!("no volume named {name}")))?;
        let layout = keys::get(self.directory.as_ref(), &self.keys.layout(&volume))
            .await
            .map_err(internal)?
            .ok_or_else(|| ControlError::NotFound(format!("volume {name} has no layout")))?;
        Ok((record.value, layout.value))
    }

    /// Reads everything the views are made of, once, so that every view of
    /// one answer (and `volume list`, `object show` and `status`) agrees.
    async fn read_state(&self) -> Result<ClusterState, ControlError> {
        let d = self.directory.as_ref();
        let hosts = keys::list(d, &self.keys.hosts()).await.map_err(internal)?;
        let live = tessera_directory::live_hosts(d, &self.keys)
            .await
            .map_err(internal)?;
        let groups = keys::list(d, &self.keys.disk_groups())
            .await
            .map_err(internal)?;
        let owners = keys::list(d, &self.keys.owners()).await.map_err(internal)?;
        let volumes = keys::list(d, &self.keys.volumes())
            .await
            .map_err(internal)?;
        let layouts = keys::list(d, &self.keys.layouts())
            .await
            .map_err(internal)?;
        let attachments = keys::list(d, &self.keys.attachments_all())
            .await
            .map_err(internal)?;
        let policies = keys::list(d, &self.keys.policies())
            .await
            .map_err(internal)?;
        let evacuations = keys::list(d, &self.keys.evacuations())
            .await
            .map_err(internal)?;
        let reclaims = keys::list(d, &self.keys.reclaims())
            .await
            .map_err(internal)?;
        let settings = keys::get(d, &self.keys.settings())
            .await
            .map_err(internal)?
            .map(|r| r.value)
            .unwrap_or_default();
        let own_prefix = self.keys.host_settings_all();
        let host_settings = keys::list(d, &own_prefix)
            .await
            .map_err(internal)?
            .records
            .into_iter()
            .filter_map(|r| {
                let host = r.key.strip_prefix(own_prefix.as_str())?;
                Some((HostId(host.to_string()), r.value))
            })
            .collect();
        let stopped_here: HashSet<HostId> = self
            .hosts
            .slots
            .iter()
            .filter(|s| s.host.lock().is_none())
            .map(|s| s.id.clone())
            .collect();
        Ok(ClusterState {
            hosts: hosts.records.into_iter().map(|r| r.value).collect(),
            live: live.into_iter().collect(),
            stopped_here,
            groups: groups.records.into_iter().map(|r| r.value).collect(),
            owners: owners
                .records
                .into_iter()
                .map(|r| (r.value.volume.clone(), r.value))
                .collect(),
            volumes: volumes.records.into_iter().map(|r| r.value).collect(),
            layouts: layouts
                .records
                .into_iter()
                .map(|r| (r.value.volume.clone(), r.value))
                .collect(),
            attachments: attachments.records.into_iter().map(|r| r.value).collect(),
            policies: policies
                .records
                .into_iter()
                .map(|r| (r.value.name.clone(), r.value))
                .collect(),
            evacuating: evacuations
                .records
                .iter()
                .flat_map(|r| r.value.places())
                .collect(),
            settings,
            host_settings,
            reclaims: reclaims.records.into_iter().map(|r| r.value).collect(),
        })
    }

    /// Clients that have `volume` open: counted live on the hosts of this
    /// process, from the directory for the others.
    fn open_by(&self, state: &ClusterState, volume: &VolumeId) -> (u32, Vec<String>) {
        let mut count = 0;
        let mut hosts = Vec::new();
        let running = self.hosts.running();
        for h in &running {
            let n = h.attachments().count(volume);
            if n > 0 {
                count += n;
                hosts.push(h.id().to_string());
            }
        }
        for record in &state.attachments {
            if running.iter().any(|h| h.id() == &record.host) || !state.host_up(&record.host) {
                continue;
            }
            if let Some(&n) = record.volumes.get(volume) {
                count += n;
                hosts.push(record.host.to_string());
            }
        }
        (count, hosts)
    }

    /// The view of one volume; `via` reaches its components (None when no
    /// host runs here: used bytes are then unknown and shown as 0).
    async fn volume_view(
        &self,
        state: &ClusterState,
        via: Option<&Arc<Host>>,
        record: &VolumeRecord,
        layout: &Layout,
    ) -> VolumeView {
        let owner = state.owners.get(&record.name);
        let (health, shown_owner) =
            volume_health(layout, owner.map(|o| &o.host), |h| state.host_up(h));
        let mut used = 0;
        if let Some(host) = via {
            let components = host.components(&record.name);
            for mirror in &layout.columns {
                for c in mirror
                    .copies
                    .iter()
                    .filter(|c| c.state == ComponentState::Active && state.host_up(&c.host))
                {
                    if let Ok(s) = components.status(c).await {
                        used += s.allocated_bytes;
                        break;
                    }
                }
            }
        }
        VolumeView {
            name: record.name.to_string(),
            size_bytes: record.size_bytes,
            policy: record.policy.to_string(),
            block_bytes: record.block_bytes,
            state: health,
            used_bytes: used,
            owner: shown_owner.map(|h| h.to_string()),
            epoch: shown_owner.and(owner).map(|o| o.epoch),
            open_by: self.open_by(state, &record.name).0,
            qos: state
                .policies
                .get(&record.policy)
                .map(|p| p.qos)
                .unwrap_or_default(),
            warnings: Vec::new(),
            fill: record
                .fill
                .as_ref()
                .map(|f| FillView::new(f, record.size_bytes)),
        }
    }

    /// Every volume's view, sorted by name.
    async fn volume_views(&self, state: &ClusterState) -> Vec<VolumeView> {
        // One fresh view of the hosts serves every volume of the listing.
        let via = self.via().await.ok();
        let mut out = Vec::new();
        for r in &state.volumes {
            if let Some(layout) = state.layouts.get(&r.name) {
                out.push(self.volume_view(state, via.as_ref(), r, layout).await);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The memory a change of the caches' settings is checked against: the
    /// hosts of this process share the machine whose memory bounds the
    /// read cache; with none here, this process's machine.
    fn checking_memory(&self) -> u64 {
        self.hosts
            .any()
            .map_or_else(crate::host::host_memory_bytes, |h| h.memory_bytes())
    }

    /// One read of the cluster and the registered host named `id` in it.
    async fn state_of_host(&self, id: &str) -> Result<(ClusterState, HostId), ControlError> {
        let state = self.read_state().await?;
        let host = state
            .hosts
            .iter()
            .find(|h| h.id.as_str() == id)
            .map(|h| h.id.clone())
            .ok_or_else(|| ControlError::NotFound(format!("no host named {id}")))?;
        Ok((state, host))
    }

    /// Every host's view with its disk groups: space read live from the
    /// hosts of this process, from their last report for the others;
    /// components and provisioned bytes from the volumes' layouts.
    fn host_views(&self, state: &ClusterState) -> Vec<HostView> {
        let mut placed: HashMap<(HostId, DiskGroupId), (u64, u64)> = HashMap::new();
        for layout in state.layouts.values() {
            for c in layout.components() {
                let e = placed
                    .entry((c.host.clone(), c.disk_group.clone()))
                    .or_default();
                e.0 += 1;
                if c.role == ComponentRole::Data {
                    e.1 += c.size_bytes;
                }
            }
        }
        let mut out = Vec::new();
        for h in &state.hosts {
            let running = self
                .hosts
                .slot(h.id.as_str())
                .and_then(|slot| slot.host.lock().clone());
            let host_state = if state.stopped_here.contains(&h.id) {
                "stopped"
            } else if state.live.contains(&h.id) {
                "present"
            } else {
                "absent"
            };
            let mut capacity = CapacityView::default();
            let disk_groups: Vec<DiskGroupView> = state
                .groups
                .iter()
                .filter(|g| g.host == h.id)
                .map(|g| {
                    let live = running.as_ref().and_then(|host| {
                        host.replica()
                            .disk_groups()
                            .iter()
                            .find(|d| d.id() == &g.id)
                            .map(|d| (d.space(), d.health(), d.index_cache_stats()))
                    });
                    let (components, provisioned) = placed
                        .get(&(h.id.clone(), g.id.clone()))
                        .copied()
                        .unwrap_or_default();
                    let (total, used, reserved, failed) = match &live {
                        Some((space, health, _)) => (
                            space.capacity_bytes,
                            space.used_bytes,
                            space.reserved_bytes,
                            matches!(health, tessera_store::DiskGroupHealth::Failed { .. }),
                        ),
                        None => (
                            g.capacity_bytes,
                            g.used_bytes,
                            g.reserved_bytes,
                            g.state == keys::DiskGroupState::Failed,
                        ),
                    };
                    let view = DiskGroupView {
                        id: g.id.to_string(),
                        health: match (&live, failed) {
                            (
                                Some((_, tessera_store::DiskGroupHealth::Failed { reason }, _)),
                                _,
                            ) => {
                                format!("failed: {reason}")
                            }
                            (_, true) => "failed".into(),
                            (
                                Some((
                                    _,
                                    tessera_store::DiskGroupHealth::Degraded {
                                        failed_devices,
                                        failed_components,
                                    },
                                    _,
                                )),
                                _,
                            ) => format!(
                                "degraded: {} device(s), {} component(s) failed",
                                failed_devices.len(),
                                failed_components.len()
                            ),
                            _ if state.evacuating.contains(&(h.id.clone(), g.id.clone())) => {
                                if components > 0 {
                                    "evacuating".into()
                                } else {
                                    "evacuated".into()
                                }
                            }
                            _ => "healthy".into(),
                        },
                        capacity: CapacityView {
                            total_bytes: total,
                            used_bytes: used,
                            reserved_bytes: reserved,
                            free_bytes: total.saturating_sub(used + reserved),
                            provisioned_bytes: provisioned,
                            overcommit_ratio: overcommit_ratio(provisioned, total),
                        },
                        components,
                        physical_bytes: live.as_ref().map(|(space, _, _)| space.physical_bytes),
                        index_cache: live.as_ref().map(|(_, _, i)| IndexCacheView {
                            budget_bytes: i.budget_bytes,
                            resident_bytes: i.resident_bytes,
                            resident_pages: i.resident_pages,
                            resident_root_blocks: i.resident_root_blocks,
                            dirty_pages: i.dirty_pages,
                            hits: i.hits,
                            misses: i.misses,
                            prefetched: i.prefetched,
                            evicted: i.evicted,
                            prefetch_pages: i.prefetch_pages,
                        }),
                        encryption: g.encryption.clone(),
                    };
                    capacity.add(&view.capacity);
                    view
                })
                .collect();
            let mut owned_volumes: Vec<String> = state
                .owners
                .values()
                .filter(|o| o.host == h.id && state.host_up(&h.id))
                .map(|o| o.volume.to_string())
                .collect();
            owned_volumes.sort();
            let read_cache = running
                .as_ref()
                .map(|host| ReadCacheView::new(&host.read_cache().stats(), host.memory_bytes()));
            let (reclaim_components, reclaim_bytes) = state
                .reclaims
                .iter()
                .filter(|r| r.host == h.id)
                .fold((0, 0), |(n, b), r| (n + 1, b + r.size_bytes));
            out.push(HostView {
                reclaim_components,
                reclaim_bytes,
                id: h.id.to_string(),
                fault_domain: h.fault_domain.to_string(),
                state: host_state.into(),
                transport_addr: h.addresses.transport.to_string(),
                nbd_addr: h.addresses.nbd.to_string(),
                iscsi_addr: h.addresses.iscsi.to_string(),
                disk_groups,
                owned_volumes,
                capacity,
                read_cache,
                lease_ttl_ms: running.as_ref().and_then(|host| host.lease_ttl_ms()),
                own_settings: state.host_settings.get(&h.id).cloned().unwrap_or_default(),
            });
        }
        out
    }

    /// The datastore's capacity: every disk group that has not failed.
    fn datastore_capacity(hosts: &[HostView]) -> CapacityView {
        let mut capacity = CapacityView::default();
        for g in hosts.iter().flat_map(|h| h.disk_groups.iter()) {
            if !g.health.starts_with("failed") {
                capacity.add(&g.capacity);
            }
        }
        capacity
    }

    /// What the health rules need of each volume.
    fn volume_health_inputs(&self, state: &ClusterState) -> Vec<VolumeHealthInput> {
        let running = self.hosts.running();
        let mut out = Vec::new();
        for r in &state.volumes {
            let Some(layout) = state.layouts.get(&r.name) else {
                continue;
            };
            let owner = state.owners.get(&r.name);
            let (health, _) = volume_health(layout, owner.map(|o| &o.host), |h| state.host_up(h));
            let owner_here = owner.and_then(|o| running.iter().find(|h| h.id() == &o.host));
            let missing = layout
                .components()
                .filter(|c| c.state != ComponentState::Active || !state.host_up(&c.host))
                .map(|c| MissingComponent {
                    id: c.id,
                    host: c.host.clone(),
                    resyncing: c.state == ComponentState::Resyncing && state.host_up(&c.host),
                    repair_in_s: owner_here
                        .and_then(|h| h.repair_in(&r.name, c.id))
                        .map(|d| d.as_secs()),
                })
                .collect();
            out.push(VolumeHealthInput {
                name: r.name.to_string(),
                health,
                missing,
            });
        }
        out
    }

    /// Provisioned bytes after adding `extra`, against the datastore's
    /// capacity: refused beyond the setting's ratio, warned beyond 1.0.
    fn check_provisioning(
        state: &ClusterState,
        hosts: &[HostView],
        what: &str,
        extra: u64,
    ) -> Result<Vec<String>, ControlError> {
        let capacity = Self::datastore_capacity(hosts);
        let after = capacity.provisioned_bytes + extra;
        let ratio = overcommit_ratio(after, capacity.total_bytes);
        let max = state.settings.max_overcommit_ratio;
        if capacity.total_bytes == 0 || after as f64 > max * capacity.total_bytes as f64 {
            return Err(ControlError::Unsatisfiable(format!(
                "{what}: {} more would provision {} on a datastore of {} ({ratio:.2}x), beyond the largest overcommit allowed ({max:.2}x); add capacity, or raise it with `tessera settings set max_overcommit_ratio N`",
                format_size(extra),
                format_size(after),
                format_size(capacity.total_bytes),
            )));
        }
        let mut warnings = Vec::new();
        if after > capacity.total_bytes {
            warnings.push(format!(
                "the datastore is overcommitted: {} provisioned on {} ({ratio:.2}x); thin volumes can together outgrow it",
                format_size(after),
                format_size(capacity.total_bytes)
            ));
        }
        if capacity.used_pct() >= f64::from(state.settings.nearly_full_pct) {
            warnings.push(format!(
                "the datastore is {:.1}% full ({} free)",
                capacity.used_pct(),
                format_size(capacity.free_bytes)
            ));
        }
        Ok(warnings)
    }

    /// Waits (bounded) until a host that is up owns `volume`, so the view
    /// a create or resize returns shows the volume as it will serve I/O.
    async fn await_owner(&self, volume: &VolumeId) {
        let deadline = tokio::time::Instant::now() + OWNER_WAIT;
        loop {
            for h in self.hosts.running() {
                h.refresh_view().await;
            }
            if let Ok(state) = self.read_state().await {
                if state
                    .owners
                    .get(volume)
                    .is_some_and(|o| state.host_up(&o.host))
                {
                    return;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Names of the volumes that follow `policy`.
    async fn volumes_using(&self, policy: &PolicyName) -> Result<Vec<String>, ControlError> {
        Ok(self
            .read_state()
            .await?
            .volumes
            .iter()
            .filter(|v| &v.policy == policy)
            .map(|v| v.name.to_string())
            .collect())
    }

    /// The view of one volume as it is now.
    async fn fresh_volume_view(&self, name: &VolumeId) -> Result<VolumeView, ControlError> {
        let state = self.read_state().await?;
        let (record, layout) = state.volume(name)?;
        let via = self.via().await.ok();
        Ok(self.volume_view(&state, via.as_ref(), record, layout).await)
    }
}

/// Refuses a change of `record`'s volume (`what`: "resize it") while it
/// is a full clone being filled.
fn refuse_while_filling(record: &VolumeRecord, what: &str) -> Result<(), ControlError> {
    match &record.fill {
        Some(fill) => {
            let view = FillView::new(fill, record.size_bytes);
            Err(ControlError::Conflict(format!(
                "volume {} is being filled from snapshot {} ({}% done): {what} once the fill ends",
                record.name,
                view.from,
                view.percent()
            )))
        }
        None => Ok(()),
    }
}

/// The refusal to let snapshot `snapshot` of `volume` (any of its
/// snapshots when None) be `what` ("deleted") while a full clone is filled
/// from it, naming the clone; None when no fill reads from it.
fn fills_from(
    state: &ClusterState,
    volume: &VolumeId,
    snapshot: Option<&keys::SnapshotName>,
    what: &str,
) -> Option<ControlError> {
    let mut clones: Vec<String> = state
        .volumes
        .iter()
        .filter_map(|r| {
            let fill = r.fill.as_ref()?;
            let reads = &fill.source == volume && snapshot.is_none_or(|s| &fill.snapshot == s);
            reads.then(|| {
                let view = FillView::new(fill, r.size_bytes);
                format!(
                    "{} (from {}, {}% filled)",
                    r.name,
                    view.from,
                    view.percent()
                )
            })
        })
        .collect();
    if clones.is_empty() {
        return None;
    }
    clones.sort();
    let subject = match snapshot {
        Some(s) => format!("snapshot {s} of volume {volume}"),
        None => format!("volume {volume}"),
    };
    Some(ControlError::Conflict(format!(
        "{subject} cannot be {what} while a full clone is being filled from it: {}; wait for the fill to end (`tessera volume show`), or delete the clone",
        clones.join(", ")
    )))
}

/// What the control plane read of the cluster for one answer.
struct ClusterState {
    hosts: Vec<keys::HostRecord>,
    live: HashSet<HostId>,
    stopped_here: HashSet<HostId>,
    groups: Vec<keys::DiskGroupRecord>,
    owners: BTreeMap<VolumeId, keys::OwnerRecord>,
    volumes: Vec<VolumeRecord>,
    layouts: BTreeMap<VolumeId, Layout>,
    attachments: Vec<keys::AttachmentRecord>,
    policies: BTreeMap<PolicyName, Policy>,
    /// Disk groups being evacuated.
    evacuating: HashSet<(HostId, DiskGroupId)>,
    settings: ClusterSettings,
    /// Each host's own setting values, for the hosts that have any.
    host_settings: HashMap<HostId, HostSettings>,
    /// Components waiting for their hosts to delete them.
    reclaims: Vec<keys::ReclaimRecord>,
}

impl ClusterState {
    /// A volume's record and layout as read.
    fn volume(&self, name: &VolumeId) -> Result<(&VolumeRecord, &Layout), ControlError> {
        let record = self
            .volumes
            .iter()
            .find(|r| &r.name == name)
            .ok_or_else(|| ControlError::NotFound(format!("no volume named {name}")))?;
        let layout = self
            .layouts
            .get(name)
            .ok_or_else(|| ControlError::NotFound(format!("volume {name} has no layout")))?;
        Ok((record, layout))
    }

    /// A host is up while its lease is alive and it was not stopped here.
    fn host_up(&self, id: &HostId) -> bool {
        !self.stopped_here.contains(id) && self.live.contains(id)
    }
}

#[async_trait]
impl ClusterControl for ControlPlane {
    async fn status(&self) -> Result<StatusView, ControlError> {
        let state = self.read_state().await?;
        let hosts = self.host_views(&state);
        let volumes = self.volume_views(&state).await;
        let capacity = Self::datastore_capacity(&hosts);
        let worst_volume = volumes.iter().map(|v| v.state).fold(Health::Healthy, worse);
        let host_health = if hosts.iter().all(|h| h.state == "present") {
            Health::Healthy
        } else {
            Health::Degraded
        };
        let resyncs = self.board.views();
        let volume_inputs = self.volume_health_inputs(&state);
        let checks = crate::health::checks(&HealthInputs {
            hosts: &hosts,
            volumes: &volume_inputs,
            resyncs: &resyncs,
            capacity: &capacity,
            settings: &state.settings,
        });
        Ok(StatusView {
            cluster: self.cluster.clone(),
            health: worse(worst_volume, host_health),
            capacity,
            hosts,
            volumes,
            resyncs,
            checks,
        })
    }

    async fn hosts(&self) -> Result<Vec<HostView>, ControlError> {
        let state = self.read_state().await?;
        Ok(self.host_views(&state))
    }

    async fn settings(&self) -> Result<ClusterSettings, ControlError> {
        Ok(self.read_state().await?.settings)
    }

    async fn update_settings(
        &self,
        change: UpdateSettings,
    ) -> Result<ClusterSettings, ControlError> {
        let _guard = self.changes.lock().await;
        let current = self.read_state().await?.settings;
        let next = change.apply(&current, self.checking_memory())?;
        keys::put(self.directory.as_ref(), &self.keys.settings(), &next, None)
            .await
            .map_err(internal)?;
        tracing::info!(?next, "cluster settings changed");
        Ok(next)
    }

    async fn host_settings(&self, id: &str) -> Result<HostSettingsView, ControlError> {
        let (state, host) = self.state_of_host(id).await?;
        let own = state.host_settings.get(&host).cloned().unwrap_or_default();
        Ok(HostSettingsView {
            settings: state.settings.for_host(&own),
            host: host.to_string(),
            own,
        })
    }

    async fn update_host_settings(
        &self,
        id: &str,
        change: UpdateHostSettings,
    ) -> Result<HostSettingsView, ControlError> {
        let _guard = self.changes.lock().await;
        let (state, host) = self.state_of_host(id).await?;
        let current = state.host_settings.get(&host).cloned().unwrap_or_default();
        let own = change.apply(&state.settings, &current, self.checking_memory())?;
        let key = self.keys.host_settings(&host);
        let d = self.directory.as_ref();
        if own.is_empty() {
            d.delete(key.as_str()).await.map_err(internal)?;
        } else {
            keys::put(d, &key, &own, None).await.map_err(internal)?;
        }
        tracing::info!(%host, ?own, "host settings changed");
        Ok(HostSettingsView {
            settings: state.settings.for_host(&own),
            host: host.to_string(),
            own,
        })
    }

    async fn update_policy(
        &self,
        name: &str,
        change: UpdatePolicy,
    ) -> Result<Policy, ControlError> {
        let policy_name =
            PolicyName::new(name).map_err(|e| ControlError::Invalid(e.to_string()))?;
        let _guard = self.changes.lock().await;
        let current = keys::get(self.directory.as_ref(), &self.keys.policy(&policy_name))
            .await
            .map_err(internal)?
            .ok_or_else(|| ControlError::NotFound(format!("no policy named {name}")))?;
        let next = change.apply(&current.value)?;
        if next == current.value {
            return Ok(next);
        }
        // QoS applies to volumes already in use at once (their owners hear
        // of it); anything else would need their data rebuilt.
        let only_qos = Policy {
            qos: current.value.qos,
            ..next.clone()
        } == current.value;
        let users = self.volumes_using(&policy_name).await?;
        if !users.is_empty() && !only_qos {
            let what = if change.changes_layout(&current.value) {
                "failures to tolerate and stripe width set how many copies and columns their data has"
            } else {
                "the space reservation was made when their components were created"
            };
            return Err(ControlError::Conflict(format!(
                "policy {name} is used by volume(s) {}: {what}; create a new policy for new volumes instead",
                users.join(", ")
            )));
        }
        let outcome = keys::cas(
            self.directory.as_ref(),
            &self.keys.policy(&policy_name),
            Some(current.mod_revision),
            &next,
            None,
        )
        .await
        .map_err(internal)?;
        if !outcome.succeeded {
            return Err(ControlError::Conflict(format!(
                "policy {name} changed meanwhile; try again"
            )));
        }
        Ok(next)
    }

    async fn delete_policy(&self, name: &str) -> Result<(), ControlError> {
        let policy_name =
            PolicyName::new(name).map_err(|e| ControlError::Invalid(e.to_string()))?;
        if name == "default" {
            return Err(ControlError::Conflict(
                "the policy default serves volumes created without --policy: it can be changed but not deleted".into(),
            ));
        }
        let _guard = self.changes.lock().await;
        if keys::get(self.directory.as_ref(), &self.keys.policy(&policy_name))
            .await
            .map_err(internal)?
            .is_none()
        {
            return Err(ControlError::NotFound(format!("no policy named {name}")));
        }
        let users = self.volumes_using(&policy_name).await?;
        if !users.is_empty() {
            return Err(ControlError::Conflict(format!(
                "policy {name} is used by volume(s) {}: delete them first",
                users.join(", ")
            )));
        }
        self.directory
            .txn(
                tessera_directory::Txn::new()
                    .and_then([self.keys.policy(&policy_name).delete_op()]),
            )
            .await
            .map_err(internal)?;
        Ok(())
    }

    async fn create_policy(&self, request: CreatePolicy) -> Result<Policy, ControlError> {
        let name =
            PolicyName::new(&request.name).map_err(|e| ControlError::Invalid(e.to_string()))?;
        let policy = Policy {
            name: name.clone(),
            failures_to_tolerate: request.failures_to_tolerate,
            fault_tolerance: Default::default(),
            stripe_width: request.stripe_width,
            space_reservation_pct: request.space_reservation_pct,
            checksum: true,
            qos: request.qos,
        };
        policy
            .validate()
            .map_err(|e| ControlError::Invalid(e.to_string()))?;
        let _guard = self.changes.lock().await;
        let outcome = keys::cas(
            self.directory.as_ref(),
            &self.keys.policy(&name),
            None,
            &policy,
            None,
        )
        .await
        .map_err(internal)?;
        if !outcome.succeeded {
            return Err(ControlError::Conflict(format!(
                "a policy named {name} already exists"
            )));
        }
        Ok(policy)
    }

    async fn policies(&self) -> Result<Vec<Policy>, ControlError> {
        let list = keys::list(self.directory.as_ref(), &self.keys.policies())
            .await
            .map_err(internal)?;
        Ok(list.records.into_iter().map(|r| r.value).collect())
    }

    async fn create_volume(&self, request: CreateVolume) -> Result<VolumeView, ControlError> {
        let name =
            VolumeId::new(&request.name).map_err(|e| ControlError::Invalid(e.to_string()))?;
        if request.size_bytes == 0 || !request.size_bytes.is_multiple_of(BLOCK_BYTES) {
            return Err(ControlError::Invalid(format!(
                "volume {name}: size must be a positive multiple of 4096 bytes, not {}",
                request.size_bytes
            )));
        }
        let block_bytes = request
            .block_bytes
            .unwrap_or(tessera_directory::keys::default_block_bytes());
        if !VOLUME_BLOCK_SIZES.contains(&block_bytes) {
            return Err(ControlError::Invalid(format!(
                "volume {name}: block size must be 512 (512e) or 4096 (4Kn), not {block_bytes}"
            )));
        }
        let policy_name = PolicyName::new(request.policy.as_deref().unwrap_or("default"))
            .map_err(|e| ControlError::Invalid(e.to_string()))?;
        let _guard = self.changes.lock().await;
        let policy = keys::get(self.directory.as_ref(), &self.keys.policy(&policy_name))
            .await
            .map_err(internal)?
            .ok_or_else(|| ControlError::NotFound(format!("no policy named {policy_name}")))?
            .value;
        if keys::get(self.directory.as_ref(), &self.keys.volume(&name))
            .await
            .map_err(internal)?
            .is_some()
        {
            return Err(ControlError::Conflict(format!(
                "a volume named {name} already exists"
            )));
        }
        let host = self.via().await?;
        let map = cluster_map(self.directory.as_ref(), &self.keys)
            .await
            .map_err(ControlError::Unavailable)?;
        let rng = Arc::clone(&self.rng);
        let mut next_id = move || ComponentId(rng.next_u64() >> 1);
        let layout =
            tessera_placement::place(&policy, &name, request.size_bytes, &map, &mut next_id)
                .map_err(|e| ControlError::Unsatisfiable(e.to_string()))?;
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
            &format!("volume {name} (policy {})", policy.name),
            provisioned,
        )?;
        let components = host.components(&name);
        let created = create_components(components.as_ref(), &name, &layout, &policy).await?;
        let reserved = reserved_bytes(&layout, &policy);
        let record = VolumeRecord {
            name: name.clone(),
            size_bytes: request.size_bytes,
            policy: policy_name,
            state: VolumeState::Ready,
            created_ms: self.clock.wall_ms(),
            reserved_bytes: reserved,
            block_bytes,
            fill: None,
        };
        if !self.record_new_volume(&record, &layout).await? {
            for c in &created {
                let _ = components.delete(c).await;
            }
            return Err(ControlError::Conflict(format!(
                "a volume named {name} already exists"
            )));
        }
        tracing::info!(volume = %name, size = %format_size(request.size_bytes), policy = %record.policy, "volume created");
        // Hosts in this process serve the volume at once, so a client may
        // attach through any of them as soon as the create returns; hosts
        // elsewhere learn of it at their next look at the directory.
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

    async fn volumes(&self) -> Result<Vec<VolumeView>, ControlError> {
        let state = self.read_state().await?;
        Ok(self.volume_views(&state).await)
    }

    async fn volume(&self, name: &str) -> Result<VolumeView, ControlError> {
        let volume = VolumeId::new(name).map_err(|e| ControlError::Invalid(e.to_string()))?;
        self.fresh_volume_view(&volume).await
    }

    async fn resize_volume(
        &self,
        name: &str,
        request: ResizeVolume,
    ) -> Result<VolumeView, ControlError> {
        let _guard = self.changes.lock().await;
        let (mut record, layout) = self.volume_record(name).await?;
        refuse_while_filling(&record, "resize it")?;
        if request.size_bytes < record.size_bytes {
            return Err(ControlError::Invalid(format!(
                "volume {name}: shrinking from {} to {} is not supported (data would be lost)",
                format_size(record.size_bytes),
                format_size(request.size_bytes)
            )));
        }
        if request.size_bytes == record.size_bytes {
            // Nothing to change: the owner keeps serving at its epoch.
            return self.fresh_volume_view(&record.name).await;
        }
        if !request.size_bytes.is_multiple_of(BLOCK_BYTES) {
            return Err(ControlError::Invalid(format!(
                "volume {name}: size must be a multiple of 4096 bytes"
            )));
        }
        let policy = keys::get(self.directory.as_ref(), &self.keys.policy(&record.policy))
            .await
            .map_err(internal)?
            .ok_or_else(|| ControlError::NotFound(format!("policy {} is gone", record.policy)))?
            .value;
        let host = self.via().await?;
        let map = cluster_map(self.directory.as_ref(), &self.keys)
            .await
            .map_err(ControlError::Unavailable)?;
        let new_layout =
            tessera_placement::resize_layout(&policy, &layout, request.size_bytes, &map)
                .map_err(|e| ControlError::Unsatisfiable(e.to_string()))?;
        let data_bytes = |l: &Layout| -> u64 {
            l.columns
                .iter()
                .flat_map(|m| m.copies.iter())
                .map(|c| c.size_bytes)
                .sum()
        };
        let state = self.read_state().await?;
        let warnings = Self::check_provisioning(
            &state,
            &self.host_views(&state),
            &format!("volume {}", record.name),
            data_bytes(&new_layout).saturating_sub(data_bytes(&layout)),
        )?;
        let components = host.components(&record.name);
        for c in new_layout.columns.iter().flat_map(|m| m.copies.iter()) {
            components
                .resize(c, c.size_bytes)
                .await
                .map_err(|e| ControlError::Unavailable(format!("volume {name}: {e}")))?;
        }
        record.size_bytes = request.size_bytes;
        // The owner steps down (its epoch no longer matches a fresh takeover)
        // and the next owner serves the new size.
        let owner =
            tessera_directory::current_owner(self.directory.as_ref(), &self.keys, &record.name)
                .await
                .map_err(internal)?;
        let mut ops = vec![
            self.keys
                .volume(&record.name)
                .put_op(&record, None)
                .map_err(internal)?,
            self.keys
                .layout(&record.name)
                .put_op(&new_layout, None)
                .map_err(internal)?,
        ];
        if owner.is_some() {
            ops.push(self.keys.owner(&record.name).delete_op());
        }
        self.directory
            .txn(tessera_directory::Txn::new().and_then(ops))
            .await
            .map_err(internal)?;
        if let Some(owner) = &owner {
            // The next owner may write before the one stepping down notices
            // (its next control tick): what it cached must not be served
            // meanwhile. Hosts of other processes notice on their own.
            for host in self.hosts.running() {
                if host.id() == &owner.host {
                    host.forget_cached(&record.name);
                }
            }
        }
        self.await_owner(&record.name).await;
        let mut view = self.fresh_volume_view(&record.name).await?;
        view.warnings = warnings;
        Ok(view)
    }

    async fn rename_volume(
        &self,
        name: &str,
        request: RenameVolume,
    ) -> Result<VolumeView, ControlError> {
        let new_name =
            VolumeId::new(&request.new_name).map_err(|e| ControlError::Invalid(e.to_string()))?;
        let _guard = self.changes.lock().await;
        let (mut record, mut layout) = self.volume_record(name).await?;
        let old = record.name.clone();
        if new_name == old {
            return self.fresh_volume_view(&old).await;
        }
        refuse_while_filling(&record, "rename it")?;
        let state = self.read_state().await?;
        // A fill names its source volume: it would lose its snapshot.
        if let Some(refusal) = fills_from(&state, &old, None, "renamed") {
            return Err(refusal);
        }
        let (open, on) = self.open_by(&state, &old);
        if open > 0 {
            return Err(ControlError::Conflict(format!(
                "volume {name} is open by {open} client(s) through {}: its NBD export and iSCSI target change name, so disconnect them first",
                on.join(", ")
            )));
        }
        let d = self.directory.as_ref();
        // Replicas refuse writes from an epoch below the highest they saw:
        // the epoch count moves with the volume.
        let epoch = keys::get(d, &self.keys.owner_epoch(&old))
            .await
            .map_err(internal)?
            .map(|r| r.value);
        let access = keys::get(d, &self.keys.iscsi_access(&old))
            .await
            .map_err(internal)?
            .map(|r| r.value);
        // A copy that is behind keeps its delta resync under the new name.
        let mut dirty = keys::get(d, &self.keys.dirty_regions(&old))
            .await
            .map_err(internal)?
            .map(|r| r.value);
        // With no client attached, a live owner has no change under way:
        // its write intents (and any it inherited, which it turned into
        // dirty-region maps at take-over) name no region where the copies
        // differ, and the next owner need not resync them.
        let owned = keys::get(d, &self.keys.owner(&old))
            .await
            .map_err(internal)?
            .is_some();
        if let Some(dirty) = dirty.as_mut().filter(|_| owned) {
            dirty.intents.clear();
        }
        record.name = new_name.clone();
        layout.volume = new_name.clone();
        let mut ops = vec![
            self.keys
                .volume(&new_name)
                .put_op(&record, None)
                .map_err(internal)?,
            self.keys
                .layout(&new_name)
                .put_op(&layout, None)
                .map_err(internal)?,
            self.keys.volume(&old).delete_op(),
            self.keys.layout(&old).delete_op(),
            self.keys.dirty_regions(&old).delete_op(),
            self.keys.owner(&old).delete_op(),
            self.keys.owner_epoch(&old).delete_op(),
            self.keys.reservation(&old).delete_op(),
            self.keys.iscsi_access(&old).delete_op(),
        ];
        if let Some(mut epoch) = epoch {
            epoch.volume = new_name.clone();
            ops.push(
                self.keys
                    .owner_epoch(&new_name)
                    .put_op(&epoch, None)
                    .map_err(internal)?,
            );
        }
        if let Some(mut dirty) = dirty {
            dirty.volume = new_name.clone();
            ops.push(
                self.keys
                    .dirty_regions(&new_name)
                    .put_op(&dirty, None)
                    .map_err(internal)?,
            );
        }
        if let Some(mut access) = access {
            access.volume = new_name.clone();
            ops.push(
                self.keys
                    .iscsi_access(&new_name)
                    .put_op(&access, None)
                    .map_err(internal)?,
            );
        }
        let outcome = d
            .txn(
                tessera_directory::Txn::new()
                    .when([self.keys.volume(&new_name).absent()])
                    .and_then(ops),
            )
            .await
            .map_err(internal)?;
        if !outcome.succeeded {
            return Err(ControlError::Conflict(format!(
                "a volume named {new_name} already exists"
            )));
        }
        tracing::info!(from = %old, to = %new_name, "volume renamed");
        self.await_owner(&new_name).await;
        self.fresh_volume_view(&new_name).await
    }

    async fn delete_volume(&self, name: &str, force: bool) -> Result<(), ControlError> {
        let _guard = self.changes.lock().await;
        let (mut record, layout) = self.volume_record(name).await?;
        let state = self.read_state().await?;
        // A full clone being filled from one of its snapshots needs it
        // until the fill ends (forced or not: it is no client's).
        if let Some(refusal) = fills_from(&state, &record.name, None, "deleted") {
            return Err(refusal);
        }
        let (open, on) = self.open_by(&state, &record.name);
        if open > 0 && !force {
            return Err(ControlError::Conflict(format!(
                "volume {name} is open by {open} client(s) (NBD connections or iSCSI sessions) through {}: disconnect them first, or delete with --force (their next request then fails)",
                on.join(", ")
            )));
        }
        if open > 0 {
            tracing::warn!(volume = %name, clients = open, "deleting a volume that clients have open (forced)");
        }
        record.state = VolumeState::Deleting;
        keys::put(
            self.directory.as_ref(),
            &self.keys.volume(&record.name),
            &record,
            None,
        )
        .await
        .map_err(internal)?;
        let (_, mut missed) = self
            .delete_components(&record.name, layout.components())
            .await?;
        // Its snapshots go with it (linked clones made of them stay).
        let mut ops = Vec::new();
        for snapshot in self.snapshot_records(&record.name).await? {
            let (_, left) = self
                .delete_components(&record.name, snapshot.layout.components())
                .await?;
            missed.extend(left);
            ops.push(self.keys.snapshot(&record.name, &snapshot.name).delete_op());
        }
        // What could not be deleted now, its hosts delete once back: the
        // records that named it go in the same transaction.
        let now = self.clock.wall_ms();
        for (c, _) in &missed {
            ops.push(
                self.keys
                    .reclaim_op(&record.name, c, keys::ReclaimReason::VolumeDeleted, now)
                    .map_err(internal)?,
            );
        }
        ops.extend([
            self.keys.volume(&record.name).delete_op(),
            self.keys.layout(&record.name).delete_op(),
            self.keys.dirty_regions(&record.name).delete_op(),
            self.keys.owner(&record.name).delete_op(),
            self.keys.owner_epoch(&record.name).delete_op(),
            self.keys.reservation(&record.name).delete_op(),
            self.keys.iscsi_access(&record.name).delete_op(),
        ]);
        self.directory
            .txn(tessera_directory::Txn::new().and_then(ops))
            .await
            .map_err(internal)?;
        if !missed.is_empty() {
            let left: Vec<String> = missed
                .iter()
                .map(|(c, why)| format!("{} on {}: {why}", c.id, c.host))
                .collect();
            tracing::info!(volume = %name, "components left for their hosts to reclaim: {}", left.join("; "));
        }
        // Hosts of this process fail the volume's clients at once; others
        // at their next look at the directory.
        for h in self.hosts.running() {
            h.refresh_view().await;
        }
        Ok(())
    }

    async fn set_iscsi_access(
        &self,
        name: &str,
        access: IscsiAccess,
    ) -> Result<IscsiAccessView, ControlError> {
        access.check(name)?;
        let _guard = self.changes.lock().await;
        let (record, _) = self.volume_record(name).await?;
        let chap = |c: &Option<ChapCredential>, side: &str| -> Result<_, ControlError> {
            let Some(c) = c else {
                return Ok(None);
            };
            let secret = match &self.secrets {
                Some(key) => key
                    .seal(&keys::chap_purpose(side), &c.secret)
                    .map_err(|e| ControlError::Internal(e.to_string()))?,
                None => c.secret.clone(),
            };
            Ok(Some(keys::ChapRecord {
                user: c.user.clone(),
                secret,
            }))
        };
        let stored = keys::VolumeAccessRecord {
            volume: record.name.clone(),
            allowed_initiators: access.allowed_initiators.clone(),
            initiator_chap: chap(&access.initiator_chap, "initiator")?,
            target_chap: chap(&access.target_chap, "target")?,
            nbd_clients: access.nbd_clients.clone(),
            plain_nbd: access.plain_nbd.unwrap_or_default(),
        };
        keys::put(
            self.directory.as_ref(),
            &self.keys.iscsi_access(&record.name),
            &stored,
            None,
        )
        .await
        .map_err(internal)?;
        // Hosts in this process apply it to the next login at once.
        for h in self.hosts.running() {
            h.refresh_view().await;
        }
        Ok(iscsi_access_view(name, Some(&stored)))
    }

    async fn iscsi_access(&self, name: &str) -> Result<IscsiAccessView, ControlError> {
        let (record, _) = self.volume_record(name).await?;
        let stored = keys::get(
            self.directory.as_ref(),
            &self.keys.iscsi_access(&record.name),
        )
        .await
        .map_err(internal)?;
        Ok(iscsi_access_view(name, stored.as_ref().map(|r| &r.value)))
    }

    async fn create_snapshot(
        &self,
        volume: &str,
        request: CreateSnapshot,
    ) -> Result<SnapshotView, ControlError> {
        self.take_snapshot(volume, request).await
    }

    async fn snapshots(&self, volume: &str) -> Result<Vec<SnapshotView>, ControlError> {
        self.list_snapshots(volume).await
    }

    async fn delete_snapshot(
        &self,
        volume: &str,
        name: &str,
    ) -> Result<SnapshotDeleted, ControlError> {
        self.remove_snapshot(volume, name).await
    }

    async fn clone_volume(
        &self,
        volume: &str,
        snapshot: &str,
        request: CloneVolume,
    ) -> Result<VolumeView, ControlError> {
        self.clone_snapshot(volume, snapshot, request).await
    }

    async fn revert_volume(
        &self,
        volume: &str,
        request: RevertVolume,
    ) -> Result<VolumeView, ControlError> {
        self.revert_to_snapshot(volume, request).await
    }

    async fn object(&self, name: &str) -> Result<ObjectView, ControlError> {
        // Record, layout, owner and host liveness from one read, as every
        // other view takes them.
        let volume = VolumeId::new(name).map_err(|e| ControlError::Invalid(e.to_string()))?;
        let state = self.read_state().await?;
        let (record, layout) = state.volume(&volume)?;
        let (record, layout) = (record.clone(), layout.clone());
        let owner = state.owners.get(&record.name).cloned();
        let (health, shown_owner) = volume_health(&layout, owner.as_ref().map(|o| &o.host), |h| {
            state.host_up(h)
        });
        let dirty: BTreeMap<ComponentId, u64> = self
            .hosts
            .running()
            .iter()
            .flat_map(|h| h.owned())
            .filter(|(v, _)| v == &record.name)
            .flat_map(|(_, c)| c.dirty_bytes())
            .collect();
        let host = self.via().await?;
        let components = host.components(&record.name);
        let mut views = Vec::new();
        let mut placed: Vec<(Option<usize>, ComponentPlacement)> = Vec::new();
        for (i, m) in layout.columns.iter().enumerate() {
            placed.extend(m.copies.iter().map(|c| (Some(i), c.clone())));
        }
        placed.extend(layout.witnesses.iter().map(|c| (None, c.clone())));
        for (column, c) in &placed {
            let (column, c) = (*column, c);
            let allocated = if c.role == ComponentRole::Data {
                components.status(c).await.ok().map(|s| s.allocated_bytes)
            } else {
                None
            };
            views.push(ComponentView {
                id: c.id,
                role: c.role,
                column,
                host: c.host.to_string(),
                disk_group: c.disk_group.to_string(),
                fault_domain: c.fault_domain.to_string(),
                state: c.state,
                votes: c.votes,
                allocated_bytes: allocated,
                dirty_bytes: dirty.get(&c.id).copied().unwrap_or(0),
            });
        }
        let offloads = self.offloads(&record.name);
        let read_cache = self
            .hosts
            .running()
            .iter()
            .flat_map(|h| h.owned())
            .filter(|(v, _)| v == &record.name)
            .fold(VolumeReadCacheView::default(), |sum, (_, c)| {
                let counters = c.counters();
                VolumeReadCacheView {
                    hits: sum.hits + counters.read_cache_hits.load(Ordering::Relaxed),
                    misses: sum.misses + counters.read_cache_misses.load(Ordering::Relaxed),
                }
            });
        Ok(ObjectView {
            volume: record.name.to_string(),
            size_bytes: record.size_bytes,
            policy: record.policy.to_string(),
            state: health,
            owner: shown_owner.map(|h| h.to_string()),
            epoch: shown_owner.and(owner.as_ref()).map(|o| o.epoch),
            generation: layout.generation,
            components: views,
            offloads,
            read_cache,
        })
    }

    async fn verify_object(&self, name: &str) -> Result<VerifyReport, ControlError> {
        let (record, layout) = self.volume_record(name).await?;
        let host = self.via().await?;
        let components = host.components(&record.name);
        let mut report = VerifyReport {
            volume: name.to_string(),
            identical: true,
            compared_bytes: 0,
            skipped: Vec::new(),
            snapshots: Vec::new(),
            divergences: Vec::new(),
        };
        compare_copies(components.as_ref(), name, &layout, None, &mut report).await?;
        // Every snapshot's copies hold the same point in time.
        let mut snapshots = self.snapshot_records(&record.name).await?;
        snapshots.sort_by(|a, b| (a.created_ms, &a.name).cmp(&(b.created_ms, &b.name)));
        for s in snapshots {
            compare_copies(
                components.as_ref(),
                name,
                &s.layout,
                Some(s.name.as_str()),
                &mut report,
            )
            .await?;
            report.snapshots.push(s.name.to_string());
        }
        Ok(report)
    }

    async fn events(&self, limit: usize) -> Result<Vec<EventView>, ControlError> {
        let events = keys::list(self.directory.as_ref(), &self.keys.event_log())
            .await
            .map_err(internal)?
            .records
            .into_iter()
            .map(|r| r.value)
            .collect();
        let changes = self.audit_entries(usize::MAX).await?;
        Ok(crate::events::history(events, changes, limit))
    }

    async fn host_activity(&self) -> Result<Vec<HostActivity>, ControlError> {
        let mut out: Vec<HostActivity> = self
            .hosts
            .running()
            .iter()
            .map(|h| {
                let t = h.transport().stats();
                HostActivity {
                    host: h.id().to_string(),
                    transport_calls: t.calls,
                    transport_call_errors: t.call_errors,
                    transport_timeouts: t.timeouts,
                    transport_requests_served: t.requests_served,
                    disk_groups: h
                        .replica()
                        .disk_groups()
                        .iter()
                        .map(|g| {
                            let log = g.log_stats();
                            DiskGroupLogActivity {
                                disk_group: g.id().to_string(),
                                group_commits: log.group_commits,
                                log_syncs: log.syncs,
                                durable_commits: log.durable_commits,
                                placed_writes: log.placed_writes,
                                placed_bytes: log.placed_blocks * tessera_types::BLOCK_BYTES,
                            }
                        })
                        .collect(),
                    peers: h
                        .transport()
                        .peer_stats()
                        .into_iter()
                        .map(|p| PeerActivity {
                            peer: p.peer.to_string(),
                            calls: p.calls,
                            call_errors: p.call_errors,
                            timeouts: p.timeouts,
                            round_trip_ns: p.round_trip_ns,
                        })
                        .collect(),
                }
            })
            .collect();
        out.sort_by(|a, b| a.host.cmp(&b.host));
        Ok(out)
    }

    async fn activity(&self) -> Result<Vec<VolumeActivity>, ControlError> {
        let running = self.hosts.running();
        let mut out: Vec<VolumeActivity> = running
            .iter()
            .flat_map(|h| {
                let owner = h.id().to_string();
                h.owned()
                    .into_iter()
                    .map(move |(v, c)| (owner.clone(), v, c))
            })
            .map(|(owner, volume, c)| {
                let counters = c.counters();
                let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
                VolumeActivity {
                    volume: volume.to_string(),
                    owner,
                    clients: running.iter().map(|h| h.attachments().count(&volume)).sum(),
                    io: counters.io.snapshot(),
                    read_cache_hits: load(&counters.read_cache_hits),
                    read_cache_misses: load(&counters.read_cache_misses),
                    checksum_repairs: load(&counters.checksum_repairs),
                    resynced_bytes: load(&counters.resynced_bytes),
                    degraded_write_bytes: load(&counters.degraded_write_bytes),
                    offloads: self.offloads(&volume),
                }
            })
            .collect();
        out.sort_by(|a, b| a.volume.cmp(&b.volume));
        Ok(out)
    }

    async fn activity_history(
        &self,
        after_ms: Option<u64>,
    ) -> Result<ActivityHistoryView, ControlError> {
        Ok(self.history.lock().view(after_ms))
    }

    async fn resyncs(&self) -> Result<Vec<ResyncView>, ControlError> {
        Ok(self.board.views())
    }

    async fn scrubs(&self) -> Result<Vec<ScrubView>, ControlError> {
        Ok(self
            .hosts
            .running()
            .iter()
            .flat_map(|h| h.scrubs())
            .collect())
    }

    async fn scrub_now(&self, host: &str) -> Result<Vec<ScrubView>, ControlError> {
        let slot = self.hosts.slot(host).ok_or_else(|| {
            ControlError::NotFound(format!("no host named {host} in this process"))
        })?;
        let running = slot.host.lock().clone();
        let Some(running) = running else {
            return Err(ControlError::Conflict(format!("host {host} is stopped")));
        };
        running.scrub_now();
        Ok(running.scrubs())
    }

    async fn encryption(&self) -> Result<Vec<EncryptionView>, ControlError> {
        let state = self.read_state().await?;
        Ok(state
            .groups
            .iter()
            .map(|g| EncryptionView {
                host: g.host.to_string(),
                disk_group: g.id.to_string(),
                encryption: g.encryption.clone(),
            })
            .collect())
    }

    async fn rekey(
        &self,
        host: &str,
        request: RekeyRequest,
    ) -> Result<Vec<EncryptionView>, ControlError> {
        let slot = self.hosts.slot(host).ok_or_else(|| {
            ControlError::NotFound(format!(
                "no host named {host} in this process (a host rekeys through its own API)"
            ))
        })?;
        let running = slot.host.lock().clone();
        let Some(running) = running else {
            return Err(ControlError::Conflict(format!("host {host} is stopped")));
        };
        let disk_group = request
            .disk_group
            .as_deref()
            .map(DiskGroupId::new)
            .transpose()
            .map_err(|e| ControlError::Invalid(e.to_string()))?;
        let done = running
            .rekey(request.deep, disk_group.as_ref())
            .await
            .map_err(|e| match e {
                crate::error::RekeyError::Store {
                    source: tessera_store::StoreError::RekeyUnderWay,
                    ..
                } => ControlError::Conflict(e.to_string()),
                crate::error::RekeyError::NoDiskGroup { .. } => {
                    ControlError::NotFound(e.to_string())
                }
                _ => ControlError::Invalid(e.to_string()),
            })?;
        Ok(done
            .into_iter()
            .map(|(dg, e)| EncryptionView {
                host: host.to_string(),
                disk_group: dg.to_string(),
                encryption: Some(e),
            })
            .collect())
    }

    async fn evacuate(
        &self,
        host: &str,
        disk_group: Option<&str>,
    ) -> Result<EvacuationView, ControlError> {
        let host_id = HostId::new(host).map_err(|e| ControlError::Invalid(e.to_string()))?;
        let _guard = self.changes.lock().await;
        let state = self.read_state().await?;
        if !state.hosts.iter().any(|h| h.id == host_id) {
            return Err(ControlError::NotFound(format!("no host named {host}")));
        }
        let groups: Vec<DiskGroupId> = state
            .groups
            .iter()
            .filter(|g| g.host == host_id)
            .map(|g| g.id.clone())
            .filter(|id| disk_group.is_none_or(|dg| id.as_str() == dg))
            .collect();
        if groups.is_empty() {
            return Err(ControlError::NotFound(format!(
                "host {host} has no disk group {}",
                disk_group.unwrap_or("at all")
            )));
        }
        let current = keys::get(self.directory.as_ref(), &self.keys.evacuation(&host_id))
            .await
            .map_err(internal)?;
        let mut all: Vec<DiskGroupId> = current
            .as_ref()
            .map(|r| r.value.disk_groups.clone())
            .unwrap_or_default();
        for g in groups {
            if !all.contains(&g) {
                all.push(g);
            }
        }
        all.sort();
        // Every component on those disk groups must have somewhere to go,
        // each taking its space from what the ones before it left.
        let mut map = cluster_map(self.directory.as_ref(), &self.keys)
            .await
            .map_err(ControlError::Unavailable)?;
        for dg in &all {
            if let Some(d) = map.disk_group_mut(&host_id, dg) {
                if d.health == DiskGroupHealth::Healthy {
                    d.health = DiskGroupHealth::Evacuating;
                }
            }
        }
        let leaving = |c: &ComponentPlacement| c.host == host_id && all.contains(&c.disk_group);
        let (mut components_left, mut bytes_left) = (0u64, 0u64);
        let mut next = 0u64;
        let mut next_id = || {
            next += 1;
            ComponentId(u64::MAX / 2 - next)
        };
        for record in &state.volumes {
            let Some(layout) = state.layouts.get(&record.name) else {
                continue;
            };
            let Some(policy) = state.policies.get(&record.policy) else {
                continue;
            };
            let mut working = layout.clone();
            for c in layout.components().filter(|c| leaving(c)) {
                components_left += 1;
                if c.role == ComponentRole::Data {
                    bytes_left += c.size_bytes;
                }
                let target = tessera_placement::rebuild_target(
                    policy,
                    &working,
                    c.id,
                    &map,
                    &mut next_id,
                )
                .map_err(|e| {
                    ControlError::Unsatisfiable(format!(
                        "host {host} cannot be evacuated: component {} of volume {} has nowhere to go: {e}",
                        c.id, record.name
                    ))
                })?;
                if target.role == ComponentRole::Data {
                    if let Some(d) = map.disk_group_mut(&target.host, &target.disk_group) {
                        d.used_bytes += target.size_bytes;
                    }
                }
                tessera_placement::apply_rebuild(&mut working, c.id, target);
            }
        }
        let record = keys::EvacuationRecord {
            host: host_id.clone(),
            disk_groups: all.clone(),
            started_ms: current
                .as_ref()
                .map_or_else(|| self.clock.wall_ms(), |r| r.value.started_ms),
        };
        keys::put(
            self.directory.as_ref(),
            &self.keys.evacuation(&host_id),
            &record,
            None,
        )
        .await
        .map_err(internal)?;
        Ok(EvacuationView {
            host: host.to_string(),
            disk_groups: all.iter().map(|d| d.to_string()).collect(),
            components_left,
            bytes_left,
        })
    }

    async fn end_evacuation(&self, host: &str) -> Result<(), ControlError> {
        let host_id = HostId::new(host).map_err(|e| ControlError::Invalid(e.to_string()))?;
        let _guard = self.changes.lock().await;
        let key = self.keys.evacuation(&host_id);
        if keys::get(self.directory.as_ref(), &key)
            .await
            .map_err(internal)?
            .is_none()
        {
            return Err(ControlError::Conflict(format!(
                "host {host} is not being evacuated"
            )));
        }
        self.directory
            .delete(key.as_str())
            .await
            .map_err(internal)?;
        Ok(())
    }

    async fn inject_fault(&self, host: &str, fault: InjectFault) -> Result<(), ControlError> {
        let slot = self.hosts.slot(host).ok_or_else(|| {
            ControlError::NotFound(format!("no host named {host} in this process"))
        })?;
        let running = slot.host.lock().clone();
        let Some(running) = running else {
            return Err(ControlError::Conflict(format!("host {host} is stopped")));
        };
        match fault {
            InjectFault::FailDevice { disk_group, device } => {
                let disk_group = tessera_types::DiskGroupId::new(disk_group)
                    .map_err(|e| ControlError::Invalid(e.to_string()))?;
                running
                    .fail_device(&disk_group, device)
                    .map_err(fault_error)
            }
            InjectFault::CorruptBlock { volume, block } => {
                let volume =
                    VolumeId::new(&volume).map_err(|e| ControlError::Invalid(e.to_string()))?;
                running
                    .damage_block(&volume, tessera_types::Lba(block))
                    .await
                    .map(|_| ())
                    .map_err(fault_error)
            }
            InjectFault::NetworkDelay {
                peer,
                delay_ms,
                jitter_ms,
            } => {
                let max = crate::control::NETWORK_DELAY_MAX_MS;
                if delay_ms > max || jitter_ms > max {
                    return Err(ControlError::Invalid(format!(
                        "a network delay and its jitter must be at most {max} ms each, not {delay_ms} and {jitter_ms}"
                    )));
                }
                running
                    .delay_frames(
                        peer.as_deref(),
                        std::time::Duration::from_millis(delay_ms),
                        std::time::Duration::from_millis(jitter_ms),
                    )
                    .map_err(fault_error)
            }
            InjectFault::NetworkDrop { peer, percent } => {
                if percent > 100 {
                    return Err(ControlError::Invalid(format!(
                        "a loss must be 0 to 100 percent, not {percent}"
                    )));
                }
                running
                    .drop_frames(peer.as_deref(), f64::from(percent) / 100.0)
                    .map_err(fault_error)
            }
            InjectFault::Partition { peer } => {
                running.partition(peer.as_deref()).map_err(fault_error)
            }
            InjectFault::NetworkHeal => running.heal_network().map_err(fault_error),
        }
    }

    async fn authenticate(&self, token: &str) -> Result<ApiIdentity, ControlError> {
        self.authenticate_token(token).await
    }

    async fn create_token(
        &self,
        by: Option<&ApiIdentity>,
        request: CreateToken,
    ) -> Result<CreatedToken, ControlError> {
        self.make_token(by, request).await
    }

    async fn tokens(&self) -> Result<Vec<TokenView>, ControlError> {
        self.token_views().await
    }

    async fn revoke_token(&self, id: &str) -> Result<(), ControlError> {
        self.remove_token(id).await
    }

    async fn record_change(&self, change: crate::control::ApiChange) -> Result<(), ControlError> {
        self.keep_change(change).await
    }

    async fn audit(&self, limit: usize) -> Result<Vec<crate::control::AuditRecord>, ControlError> {
        self.audit_entries(limit).await
    }

    async fn stop_host(&self, host: &str) -> Result<(), ControlError> {
        let slot = self.hosts.slot(host).ok_or_else(|| {
            ControlError::NotFound(format!("no host named {host} in this process"))
        })?;
        if slot.starter.is_none() {
            return Err(ControlError::Invalid(
                "hosts can be stopped through the API only in `tessera up`".into(),
            ));
        }
        let running = slot.host.lock().take();
        match running {
            Some(h) => {
                h.stop(false).await;
                *slot.stopped.lock() = Some(Arc::downgrade(h.replica()));
                Ok(())
            }
            None => Err(ControlError::Conflict(format!(
                "host {host} is already stopped"
            ))),
        }
    }

    async fn start_host(&self, host: &str) -> Result<(), ControlError> {
        let slot = self.hosts.slot(host).ok_or_else(|| {
            ControlError::NotFound(format!("no host named {host} in this process"))
        })?;
        let Some(starter) = slot.starter.clone() else {
            return Err(ControlError::Invalid(
                "hosts can be started through the API only in `tessera up`".into(),
            ));
        };
        if slot.host.lock().is_some() {
            return Err(ControlError::Conflict(format!(
                "host {host} is already running"
            )));
        }
        let previous = slot.stopped.lock().take();
        let deadline = tokio::time::Instant::now() + HOST_RELEASE_WAIT;
        let restarting = previous.is_some();
        if let Some(previous) = previous {
            while previous.strong_count() > 0 {
                if tokio::time::Instant::now() >= deadline {
                    *slot.stopped.lock() = Some(previous);
                    return Err(ControlError::Unavailable(format!(
                        "host {host} is still releasing its devices; try again"
                    )));
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        // The stopped host's store threads may hold its devices a moment
        // after its last handle went: a restart waits for them.
        let started = loop {
            match starter().await {
                Ok(host) => break host,
                Err(e)
                    if restarting
                        && e.contains("in use by a running host")
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => return Err(ControlError::Unavailable(e)),
            }
        };
        *slot.host.lock() = Some(started);
        Ok(())
    }
}

fn iscsi_access_view(name: &str, stored: Option<&keys::VolumeAccessRecord>) -> IscsiAccessView {
    IscsiAccessView {
        volume: name.to_string(),
        target: tessera_iscsi::target_name_for_volume(name),
        allowed_initiators: stored
            .map(|s| s.allowed_initiators.clone())
            .unwrap_or_default(),
        chap_user: stored.and_then(|s| s.initiator_chap.as_ref().map(|c| c.user.clone())),
        target_chap_user: stored.and_then(|s| s.target_chap.as_ref().map(|c| c.user.clone())),
        nbd_clients: stored.map(|s| s.nbd_clients.clone()).unwrap_or_default(),
        plain_nbd: stored.map(|s| s.plain_nbd).unwrap_or_default(),
    }
}

/// What a refused fault injection tells the API's caller.
fn fault_error(e: crate::error::FaultError) -> ControlError {
    use crate::error::FaultError;
    match e {
        FaultError::NotAccepted { .. } | FaultError::Store { .. } => {
            ControlError::Invalid(e.to_string())
        }
        FaultError::NoSuchDevice { .. }
        | FaultError::NoCopy { .. }
        | FaultError::NoSuchPeer { .. } => ControlError::NotFound(e.to_string()),
    }
}
