//! The host's iSCSI targets: every ready volume is the target
//! `iqn.2026-11.io.tessera:<volume>` with its data on LUN 0, served on this
//! host's portal and advertised on every host's, so a multipath initiator
//! sees one path per host. Every snapshot of a ready volume is the
//! read-only target `iqn.2026-11.io.tessera:<volume>:<snapshot>` (the
//! snapshot's name escaped into an iSCSI name's characters, see
//! [`target_name_for_snapshot`]), LUN 0, for backups.
//!
//! Owns: [`HostTargets`] (the `TargetCatalog` the iSCSI server asks at every
//! login), [`ReservationTable`] (every volume's SCSI reservations, cached
//! from the directory and kept current by a watch) and the
//! `UnitEnvironment` each logical unit runs in (reservations, ALUA port
//! groups, other volumes and snapshots for EXTENDED COPY, datastore space).
//! Must not touch: SCSI or iSCSI semantics (`tessera-iscsi` owns them, the
//! write protection of a read-only unit among them); the data path (volume
//! units run on the host's `VolumeHandle`, which forwards to the volume's
//! owner; snapshot units on a `SnapshotDevice`, which reads any copy).
//! Invariants:
//! - one logical unit per volume, and per snapshot, per host, kept across
//!   sessions so unit attentions and offload counters outlive a login; a
//!   volume or snapshot deleted (or created again under its name) loses its
//!   unit, so sessions still logged in get LOGICAL UNIT NOT SUPPORTED, and
//!   its name no longer finds a target: discovery leaves it out and a login
//!   to it is refused (target not found);
//! - who may log in (initiator names, CHAP) is a volume's setting in the
//!   directory, the same on every host, read at every login and discovery;
//!   a snapshot's target takes its volume's, and a snapshot whose volume is
//!   not ready has no target, so a snapshot is never more open than its
//!   volume;
//! - a full clone being filled has no target yet: discovery leaves it out
//!   and a login to it is refused as service unavailable (the initiator
//!   may retry), the host's log saying why, with the fill's progress;
//! - a snapshot's unit is read-only: its device says so, and the SCSI layer
//!   reports write protect and refuses every write with DATA PROTECT;
//! - a host's relative target port and portal group tag are its position
//!   (1-based) among the registered hosts sorted by id: the same numbers on
//!   every host;
//! - the owner's host is the active/optimized port group of a volume, every
//!   other live host active/non-optimized, absent hosts unavailable; a
//!   snapshot involves no owner, so every live host is active/optimized;
//! - a volume's reservations change only by compare-and-swap on their key's
//!   revision, so two hosts updating them at once never lose either change;
//!   a host's cache follows the directory's watch, so another host's change
//!   is seen within the watch's delay, and a lost swap re-reads the key at
//!   once. A snapshot's reservations live in the memory of the host serving
//!   the session: nothing can be written through it, so they only order
//!   readers, which need no agreement between hosts.

use crate::host::{serial_of, SnapshotKey, VolumeView};
use crate::peers::Peers;
use crate::routing::HostCatalog;
use crate::snapshot_export::export_name;
use async_trait::async_trait;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tessera_blockdev::BlockDevice;
use tessera_directory::keys::{
    self, HeldReservationRecord, Keyspace, NexusRecord, RegistrationRecord, ReservationRecord,
    SharedAttentionRecord, SnapshotName, SnapshotRecord, VolumeState,
};
use tessera_directory::{Directory, Revision, WatchEventKind};
use tessera_iscsi::catalog::{
    parse_target_name, target_name_for_snapshot, target_name_for_volume, NamedTarget,
};
use tessera_iscsi::scsi::environment::{
    AluaState, DatastoreSpace, EnvironmentError, LocalReservations, Offloads, TargetPortGroup,
    UnitEnvironment, VersionedReservations,
};
use tessera_iscsi::scsi::inquiry::naa_designator;
use tessera_iscsi::scsi::reservations::{
    PersistentReservation, PrType, Registration, SharedAttention,
};
use tessera_iscsi::scsi::{BlockTarget, LogicalUnit, Nexus, ReservationState, UnitSettings};
use tessera_iscsi::{ChapCredentials, ChapSecret, TargetCatalog, TargetEntry, TargetPortal};
use tessera_types::{HostId, VolumeId};

/// Pause before a reservation watch that ended is started again.
const WATCH_RETRY: Duration = Duration::from_millis(500);

/// Every volume's reservations, as this host last saw them.
pub struct ReservationTable {
    directory: Arc<dyn Directory>,
    keys: Keyspace,
    entries: RwLock<HashMap<VolumeId, (Revision, Arc<ReservationState>)>>,
}

impl ReservationTable {
    /// An empty table; [`ReservationTable::follow`] fills it.
    pub fn new(directory: Arc<dyn Directory>, keys: Keyspace) -> Self {
        ReservationTable {
            directory,
            keys,
            entries: RwLock::new(HashMap::new()),
        }
    }

    /// Keeps the table current until `stop` turns true: reads every
    /// reservation, then applies the directory's changes as they come.
    pub async fn follow(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = self.follow_once() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(WATCH_RETRY) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    async fn follow_once(&self) {
        let prefix = self.keys.reservations();
        let listing = match keys::list(self.directory.as_ref(), &prefix).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read reservations");
                return;
            }
        };
        {
            let mut entries = self.entries.write();
            entries.clear();
            for r in listing.records {
                if let Some(volume) = volume_of_key(&r.key) {
                    entries.insert(volume, (r.mod_revision, Arc::new(from_record(r.value))));
                }
            }
        }
        let mut watch = match self
            .directory
            .watch(prefix.as_str(), listing.revision + 1)
            .await
        {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!(error = %e, "cannot watch reservations");
                return;
            }
        };
        loop {
            let event = match watch.recv().await {
                Ok(event) => event,
                Err(e) => {
                    tracing::debug!(error = %e, "reservation watch ended");
                    return;
                }
            };
            let Some(volume) = volume_of_key(&event.kv.key) else {
                continue;
            };
            let revision = event.kv.mod_revision;
            let state = match event.kind {
                WatchEventKind::Put => match prefix.decode_event(&event) {
                    Ok(Some(record)) => Some(from_record(record)),
                    _ => continue,
                },
                WatchEventKind::Delete => None,
            };
            self.apply(volume, revision, state);
        }
    }

    /// Applies a change seen at `revision`, unless a newer one is known.
    fn apply(&self, volume: VolumeId, revision: Revision, state: Option<ReservationState>) {
        let mut entries = self.entries.write();
        if entries.get(&volume).is_some_and(|(r, _)| *r >= revision) {
            return;
        }
        match state {
            Some(state) => {
                entries.insert(volume, (revision, Arc::new(state)));
            }
            None => {
                entries.remove(&volume);
            }
        }
    }

    /// The reservations of `volume` (none: version 0).
    pub fn get(&self, volume: &VolumeId) -> VersionedReservations {
        match self.entries.read().get(volume) {
            Some((revision, state)) => VersionedReservations {
                version: *revision,
                state: Arc::clone(state),
            },
            None => VersionedReservations {
                version: 0,
                state: Arc::new(ReservationState::default()),
            },
        }
    }

    /// The reservations of `volume` read from the directory now (the cache
    /// takes them too).
    pub async fn read_now(
        &self,
        volume: &VolumeId,
    ) -> Result<VersionedReservations, EnvironmentError> {
        self.refresh(volume).await?;
        Ok(self.get(volume))
    }

    async fn refresh(&self, volume: &VolumeId) -> Result<(), EnvironmentError> {
        match keys::get(self.directory.as_ref(), &self.keys.reservation(volume)).await {
            Ok(Some(r)) => self.apply(volume.clone(), r.mod_revision, Some(from_record(r.value))),
            Ok(None) => {
                self.entries.write().remove(volume);
            }
            Err(e) => {
                return Err(EnvironmentError::Unavailable(format!(
                    "volume {volume}: {e}"
                )))
            }
        }
        Ok(())
    }

    /// Stores `state` if the reservations are still at `version`.
    pub async fn store(
        &self,
        volume: &VolumeId,
        version: u64,
        state: ReservationState,
    ) -> Result<bool, EnvironmentError> {
        let key = self.keys.reservation(volume);
        let expected = (version != 0).then_some(version);
        let outcome = keys::cas(
            self.directory.as_ref(),
            &key,
            expected,
            &to_record(&state),
            None,
        )
        .await
        .map_err(|e| EnvironmentError::Unavailable(format!("volume {volume}: {e}")))?;
        if outcome.succeeded {
            self.apply(volume.clone(), outcome.revision, Some(state));
            return Ok(true);
        }
        // Another host got there first: read its change now rather than
        // waiting for the watch, so the caller's retry starts from it.
        self.refresh(volume).await?;
        Ok(false)
    }
}

fn volume_of_key(key: &str) -> Option<VolumeId> {
    VolumeId::new(key.rsplit('/').next()?).ok()
}

fn nexus_record(n: &Nexus) -> NexusRecord {
    NexusRecord {
        initiator_port: n.initiator_port.clone(),
        relative_port: n.relative_port,
    }
}

fn nexus_of(n: NexusRecord) -> Nexus {
    Nexus {
        initiator_port: n.initiator_port,
        relative_port: n.relative_port,
    }
}

fn to_record(s: &ReservationState) -> ReservationRecord {
    ReservationRecord {
        generation: s.generation,
        registrations: s
            .registrations
            .iter()
            .map(|r| RegistrationRecord {
                nexus: nexus_record(&r.nexus),
                key: r.key,
            })
            .collect(),
        reservation: s.reservation.as_ref().map(|r| HeldReservationRecord {
            holder: nexus_record(&r.holder),
            type_code: r.kind.code(),
        }),
        legacy_holder: s.legacy_holder.as_ref().map(nexus_record),
        persist_through_power_loss: s.persist_through_power_loss,
        attentions: s
            .attentions
            .iter()
            .map(|a| SharedAttentionRecord {
                sequence: a.sequence,
                nexus: a.nexus.as_ref().map(nexus_record),
                except: a.except.as_ref().map(nexus_record),
                asc: a.code.0,
                ascq: a.code.1,
            })
            .collect(),
    }
}

fn from_record(r: ReservationRecord) -> ReservationState {
    ReservationState {
        generation: r.generation,
        registrations: r
            .registrations
            .into_iter()
            .map(|g| Registration {
                nexus: nexus_of(g.nexus),
                key: g.key,
            })
            .collect(),
        reservation: r.reservation.and_then(|h| {
            let kind = PrType::from_code(h.type_code);
            if kind.is_none() {
                tracing::warn!(
                    type_code = h.type_code,
                    "ignoring a stored reservation of unknown type"
                );
            }
            Some(PersistentReservation {
                holder: nexus_of(h.holder),
                kind: kind?,
            })
        }),
        legacy_holder: r.legacy_holder.map(nexus_of),
        persist_through_power_loss: r.persist_through_power_loss,
        attentions: r
            .attentions
            .into_iter()
            .map(|a| SharedAttention {
                sequence: a.sequence,
                nexus: a.nexus.map(nexus_of),
                except: a.except.map(nexus_of),
                code: (a.asc, a.ascq),
            })
            .collect(),
    }
}

/// What one volume's logical unit sees of the cluster.
struct VolumeEnvironment {
    volume: VolumeId,
    host: HostId,
    view: Arc<VolumeView>,
    peers: Arc<Peers>,
    exports: Arc<HostCatalog>,
    reservations: Arc<ReservationTable>,
}

#[async_trait]
impl UnitEnvironment for VolumeEnvironment {
    async fn reservations(&self) -> Result<VersionedReservations, EnvironmentError> {
        Ok(self.reservations.get(&self.volume))
    }

    async fn reservations_now(&self) -> Result<VersionedReservations, EnvironmentError> {
        self.reservations.read_now(&self.volume).await
    }

    async fn store_reservations(
        &self,
        version: u64,
        state: ReservationState,
    ) -> Result<bool, EnvironmentError> {
        self.reservations.store(&self.volume, version, state).await
    }

    fn port_groups(&self) -> Vec<TargetPortGroup> {
        let owner = self
            .view
            .owners
            .read()
            .get(&self.volume)
            .map(|o| o.host.clone());
        port_groups(&self.peers, &self.host, |h| owner.as_ref() == Some(h))
    }

    fn resolve_designator(&self, designator: &[u8]) -> Option<Arc<dyn BlockDevice>> {
        resolve_designator(&self.view, &self.exports, designator)
    }

    fn datastore_space(&self) -> Option<DatastoreSpace> {
        *self.view.datastore.read()
    }

    fn offloads(&self) -> Offloads {
        *self.view.offloads.read()
    }
}

/// The ready volume or the snapshot whose unit has NAA designator
/// `designator` (a volume's serial, a snapshot's number), for EXTENDED
/// COPY: a snapshot resolves too, as a source (a restore) or as a
/// destination the copy then finds read-only.
fn resolve_designator(
    view: &VolumeView,
    exports: &HostCatalog,
    designator: &[u8],
) -> Option<Arc<dyn BlockDevice>> {
    let volume = view
        .volumes
        .read()
        .values()
        .find(|v| v.serves_clients() && naa_designator(serial_of(v))[..] == *designator)
        .map(|v| v.name.to_string());
    if let Some(volume) = volume {
        return exports
            .open_handle(&volume, false)
            .map(|h| h as Arc<dyn BlockDevice>);
    }
    let snapshot = view
        .snapshots
        .read()
        .values()
        .find(|s| naa_designator(s.id)[..] == *designator)
        .cloned()?;
    Some(exports.open_snapshot(snapshot))
}

/// What one snapshot's logical unit sees of the cluster.
struct SnapshotEnvironment {
    host: HostId,
    view: Arc<VolumeView>,
    peers: Arc<Peers>,
    exports: Arc<HostCatalog>,
    /// Kept here, not in the directory: see the module's invariants.
    reservations: LocalReservations,
}

#[async_trait]
impl UnitEnvironment for SnapshotEnvironment {
    async fn reservations(&self) -> Result<VersionedReservations, EnvironmentError> {
        Ok(self.reservations.current())
    }

    async fn store_reservations(
        &self,
        version: u64,
        state: ReservationState,
    ) -> Result<bool, EnvironmentError> {
        Ok(self.reservations.store(version, state))
    }

    fn port_groups(&self) -> Vec<TargetPortGroup> {
        // Any host reads a snapshot from any copy, its own first: no host
        // is better placed than another.
        let peers = &self.peers;
        port_groups(peers, &self.host, |h| peers.is_live(h) || *h == self.host)
    }

    fn resolve_designator(&self, designator: &[u8]) -> Option<Arc<dyn BlockDevice>> {
        resolve_designator(&self.view, &self.exports, designator)
    }

    fn datastore_space(&self) -> Option<DatastoreSpace> {
        // Nothing is ever allocated through a snapshot's unit.
        None
    }

    fn offloads(&self) -> Offloads {
        *self.view.offloads.read()
    }
}

/// One port group per registered host, as `host` sees them: those
/// `optimized` names are active/optimized, other live hosts (and `host`
/// itself) active/non-optimized, absent ones unavailable.
fn port_groups(
    peers: &Peers,
    host: &HostId,
    optimized: impl Fn(&HostId) -> bool,
) -> Vec<TargetPortGroup> {
    peers
        .records()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let port = port_number(i);
            let live = peers.is_live(&h.id) || h.id == *host;
            let state = if optimized(&h.id) {
                AluaState::ActiveOptimized
            } else if live {
                AluaState::ActiveNonOptimized
            } else {
                AluaState::Unavailable
            };
            TargetPortGroup {
                id: port,
                state,
                ports: vec![port],
            }
        })
        .collect()
}

/// Relative target port / portal group tag of the host at `index` in the
/// sorted host list.
fn port_number(index: usize) -> u16 {
    u16::try_from(index + 1).unwrap_or(u16::MAX)
}

/// The logical unit of a volume or snapshot on this host, and what it was
/// made for (a volume's serial, a snapshot's number): a unit whose volume
/// or snapshot was created again under its name is not reused.
struct ServedUnit {
    serial: u64,
    target: Arc<BlockTarget>,
    unit: Arc<LogicalUnit>,
}

/// How a snapshot's unit names its product in INQUIRY, so an initiator's
/// device list tells it from a volume.
const SNAPSHOT_PRODUCT: &str = "SNAPSHOT";

/// The targets one host offers.
pub struct HostTargets {
    host: HostId,
    view: Arc<VolumeView>,
    peers: Arc<Peers>,
    exports: Arc<HostCatalog>,
    reservations: Arc<ReservationTable>,
    settings: UnitSettings,
    served: Mutex<HashMap<VolumeId, ServedUnit>>,
    served_snapshots: Mutex<HashMap<SnapshotKey, ServedUnit>>,
    /// Opens the CHAP secrets the directory keeps sealed.
    secrets: Option<Arc<tessera_tls::SecretsKey>>,
}

impl HostTargets {
    /// Targets over the host's view of the volumes.
    pub fn new(
        host: HostId,
        view: Arc<VolumeView>,
        peers: Arc<Peers>,
        exports: Arc<HostCatalog>,
        reservations: Arc<ReservationTable>,
    ) -> Self {
        HostTargets {
            host,
            view,
            peers,
            exports,
            reservations,
            settings: UnitSettings::default(),
            served: Mutex::new(HashMap::new()),
            served_snapshots: Mutex::new(HashMap::new()),
            secrets: None,
        }
    }

    /// The same targets opening sealed CHAP secrets with `secrets`.
    pub fn with_secrets(mut self, secrets: Option<Arc<tessera_tls::SecretsKey>>) -> Self {
        self.secrets = secrets;
        self
    }

    /// Drops the units of volumes and snapshots that are gone or were
    /// created again (and of snapshots whose volume is no longer ready), so
    /// sessions still using them answer LOGICAL UNIT NOT SUPPORTED.
    pub fn prune(&self) {
        // What is current is read first and the view's locks let go before
        // the units' maps are locked: `served` takes them in the other order
        // (a unit's device is opened under its map's lock).
        let ready: HashMap<VolumeId, u64> = self
            .view
            .volumes
            .read()
            .values()
            .filter(|v| v.state == VolumeState::Ready)
            .map(|v| (v.name.clone(), serial_of(v)))
            .collect();
        let snapshots: HashMap<SnapshotKey, u64> = self
            .view
            .snapshots
            .read()
            .iter()
            .filter(|(key, _)| ready.contains_key(&key.0))
            .map(|(key, s)| (key.clone(), s.id))
            .collect();
        self.served.lock().retain(|name, served| {
            let current = ready.get(name) == Some(&served.serial);
            if !current {
                served.target.remove_unit(0);
                tracing::info!(host = %self.host, volume = %name, "iSCSI unit removed");
            }
            current
        });
        self.served_snapshots.lock().retain(|key, served| {
            let current = snapshots.get(key) == Some(&served.serial);
            if !current {
                served.target.remove_unit(0);
                tracing::info!(
                    host = %self.host,
                    volume = %key.0,
                    snapshot = %key.1,
                    "iSCSI unit of a snapshot removed"
                );
            }
            current
        });
    }

    /// The offload counters of `volume`'s unit on this host, if it has one.
    pub fn counters(&self, volume: &VolumeId) -> Option<tessera_iscsi::scsi::VaaiCounters> {
        self.served.lock().get(volume).map(|s| s.unit.counters())
    }

    fn served(&self, volume: &VolumeId) -> Option<Arc<BlockTarget>> {
        let record = self.view.volumes.read().get(volume).cloned()?;
        if !record.serves_clients() {
            return None;
        }
        let serial = serial_of(&record);
        let mut served = self.served.lock();
        if let Some(s) = served.get(volume) {
            if s.serial == serial {
                return Some(Arc::clone(&s.target));
            }
            s.target.remove_unit(0);
        }
        let device: Arc<dyn BlockDevice> = self.exports.open_handle(volume.as_str(), false)?;
        let environment = Arc::new(VolumeEnvironment {
            volume: volume.clone(),
            host: self.host.clone(),
            view: Arc::clone(&self.view),
            peers: Arc::clone(&self.peers),
            exports: Arc::clone(&self.exports),
            reservations: Arc::clone(&self.reservations),
        });
        let unit = Arc::new(LogicalUnit::new(device, environment, self.settings.clone()));
        let target = Arc::new(BlockTarget::new());
        target.insert_unit(0, Arc::clone(&unit));
        served.insert(
            volume.clone(),
            ServedUnit {
                serial,
                target: Arc::clone(&target),
                unit,
            },
        );
        Some(target)
    }

    /// The target of snapshot `record`, its unit made at the first call.
    fn served_snapshot(&self, record: &SnapshotRecord) -> Arc<BlockTarget> {
        let key = (record.volume.clone(), record.name.clone());
        let mut served = self.served_snapshots.lock();
        if let Some(s) = served.get(&key) {
            if s.serial == record.id {
                return Arc::clone(&s.target);
            }
            s.target.remove_unit(0);
        }
        let device: Arc<dyn BlockDevice> = self.exports.open_snapshot(record.clone());
        let environment = Arc::new(SnapshotEnvironment {
            host: self.host.clone(),
            view: Arc::clone(&self.view),
            peers: Arc::clone(&self.peers),
            exports: Arc::clone(&self.exports),
            reservations: LocalReservations::default(),
        });
        let settings = UnitSettings {
            product: SNAPSHOT_PRODUCT.into(),
            ..self.settings.clone()
        };
        let unit = Arc::new(LogicalUnit::new(device, environment, settings));
        let target = Arc::new(BlockTarget::new());
        target.insert_unit(0, Arc::clone(&unit));
        served.insert(
            key,
            ServedUnit {
                serial: record.id,
                target: Arc::clone(&target),
                unit,
            },
        );
        target
    }

    /// The ready volume an initiator's spelling of its name stands for:
    /// initiators fold names to lower case while volume names may have
    /// upper case letters, so they are matched without regard to case.
    fn ready_volume(&self, spelled: &str) -> Option<VolumeId> {
        self.view
            .volumes
            .read()
            .values()
            .find(|v| v.serves_clients() && v.name.as_str().eq_ignore_ascii_case(spelled))
            .map(|v| v.name.clone())
    }

    /// The entry of a target of `volume` (the volume's own or one of its
    /// snapshots'): every host's portal, this host's port, and the
    /// volume's access settings, whichever of them the target serves.
    fn entry(
        &self,
        volume: &VolumeId,
        name: String,
        alias: String,
        device: Arc<BlockTarget>,
        session_hold: Option<Arc<dyn std::any::Any + Send + Sync>>,
    ) -> TargetEntry {
        let hosts = self.peers.records();
        let portals = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| TargetPortal {
                address: h.addresses.iscsi.to_string(),
                portal_group_tag: port_number(i),
            })
            .collect();
        let own = port_number(hosts.iter().position(|h| h.id == self.host).unwrap_or(0));
        let access = self.view.iscsi_access.read().get(volume).cloned();
        let mut initiators = crate::volume_access::iscsi_initiators(access.as_ref());
        let mut unreadable = false;
        let mut secret = |c: &keys::ChapRecord, side: &str| {
            let opened = match &self.secrets {
                Some(key) => key.open(&keys::chap_purpose(side), &c.secret),
                None if c.secret.starts_with(tessera_tls::SEALED_PREFIX) => Err(
                    tessera_tls::TlsError::Config("this host has no secrets key".into()),
                ),
                None => Ok(c.secret.clone()),
            };
            match opened {
                Ok(secret) => Some(ChapSecret {
                    user: c.user.clone(),
                    secret: secret.into_bytes(),
                }),
                Err(e) => {
                    unreadable = true;
                    tracing::error!(%volume, "volume {volume}: its {side} CHAP secret cannot be read, so its target admits nobody: {e}");
                    None
                }
            }
        };
        let chap = ChapCredentials {
            initiator: access
                .as_ref()
                .and_then(|a| a.initiator_chap.as_ref())
                .and_then(|c| secret(c, "initiator")),
            target: access
                .as_ref()
                .and_then(|a| a.target_chap.as_ref())
                .and_then(|c| secret(c, "target")),
        };
        if unreadable {
            // A secret that cannot be read must not turn into no CHAP.
            initiators = tessera_iscsi::Initiators::Only(Vec::new());
        }
        TargetEntry {
            name,
            alias: Some(alias),
            device,
            portals,
            portal_group_tag: own,
            relative_port: own,
            initiators,
            chap,
            session_hold,
        }
    }
}

impl TargetCatalog for HostTargets {
    fn target_names(&self) -> Vec<String> {
        let volumes = self.view.volumes.read();
        let ready = |name: &VolumeId| volumes.get(name).is_some_and(|v| v.serves_clients());
        let mut names: Vec<String> = volumes
            .values()
            .filter(|v| ready(&v.name))
            .map(|v| target_name_for_volume(v.name.as_str()))
            .collect();
        names.extend(
            self.view
                .snapshots
                .read()
                .values()
                .filter(|s| ready(&s.volume))
                .map(|s| target_name_for_snapshot(s.volume.as_str(), s.name.as_str())),
        );
        // The same order on every host, whatever order its maps hold.
        names.sort();
        names
    }

    fn target(&self, name: &str) -> Option<TargetEntry> {
        match parse_target_name(name)? {
            NamedTarget::Volume(spelled) => {
                let volume = self.ready_volume(&spelled)?;
                let target = self.served(&volume)?;
                // A session that logs in holds this, which counts it among
                // the volume's clients while it lasts.
                let hold = Arc::new(self.exports.attach(&volume));
                Some(self.entry(
                    &volume,
                    target_name_for_volume(volume.as_str()),
                    volume.to_string(),
                    target,
                    Some(hold),
                ))
            }
            NamedTarget::Snapshot { volume, snapshot } => {
                // Only a ready volume's snapshots are served: its access
                // settings are the ones they take.
                let volume = self.ready_volume(&volume)?;
                let snapshot = SnapshotName::new(&snapshot).ok()?;
                let record = self
                    .view
                    .snapshots
                    .read()
                    .get(&(volume.clone(), snapshot))
                    .cloned()?;
                let target = self.served_snapshot(&record);
                // Sessions of a snapshot are not the volume's clients (as
                // with its NBD export): deleting the snapshot or the volume
                // ends them, and their next command fails.
                Some(self.entry(
                    &volume,
                    target_name_for_snapshot(volume.as_str(), record.name.as_str()),
                    export_name(&record),
                    target,
                    None,
                ))
            }
        }
    }

    fn refusal(&self, name: &str) -> Option<String> {
        let NamedTarget::Volume(spelled) = parse_target_name(name)? else {
            return None;
        };
        let volumes = self.view.volumes.read();
        let record = volumes
            .values()
            .find(|v| v.name.as_str().eq_ignore_ascii_case(&spelled))?;
        crate::host::fill_refusal(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_survive_the_trip_through_the_directory_record() {
        let a = Nexus {
            initiator_port: "iqn.1994-05.com.redhat:a,i,0x23d000000001".into(),
            relative_port: 1,
        };
        let b = Nexus {
            initiator_port: "iqn.1994-05.com.redhat:b,i,0x23d000000002".into(),
            relative_port: 2,
        };
        let state = ReservationState {
            generation: 7,
            registrations: vec![
                Registration {
                    nexus: a.clone(),
                    key: 0xabc,
                },
                Registration {
                    nexus: b.clone(),
                    key: 0xdef,
                },
            ],
            reservation: Some(PersistentReservation {
                holder: b,
                kind: PrType::ExclusiveAccessRegistrantsOnly,
            }),
            legacy_holder: Some(a.clone()),
            persist_through_power_loss: true,
            attentions: vec![
                SharedAttention {
                    sequence: 4,
                    nexus: None,
                    except: Some(a.clone()),
                    code: (0x29, 0x03),
                },
                SharedAttention {
                    sequence: 5,
                    nexus: Some(a),
                    except: None,
                    code: (0x2A, 0x04),
                },
            ],
        };
        let json = serde_json::to_vec(&to_record(&state)).unwrap();
        let back: ReservationRecord = serde_json::from_slice(&json).unwrap();
        assert_eq!(from_record(back), state);
    }

    #[test]
    fn a_stored_reservation_of_unknown_type_is_dropped_not_misread() {
        let record = ReservationRecord {
            generation: 1,
            registrations: vec![],
            reservation: Some(HeldReservationRecord {
                holder: NexusRecord {
                    initiator_port: "x".into(),
                    relative_port: 1,
                },
                type_code: 2,
            }),
            legacy_holder: None,
            persist_through_power_loss: false,
            attentions: vec![],
        };
        assert_eq!(from_record(record).reservation, None);
    }
}
