//! One host: its disk groups, replica service, transport, directory session,
//! the coordinators of the volumes it owns, its NBD exports and its iSCSI
//! targets.
//!
//! Owns: starting and stopping all of these; the host's view of the
//! directory (kept by one watch: `directory_mirror`); its control loop,
//! which every [`TICK`] tells the host's control core
//! (`tessera_control::HostControl`) what changed and carries out what it
//! decides (`control_loop`); the requests other hosts send (`rpc`); the
//! fills of the full clones it coordinates (`fill`); and the
//! host read cache every coordinator it runs shares, sized by the cluster
//! setting `read_cache_bytes` (applied as soon as the setting changes).
//! Must not touch: I/O logic (the coordinator's) or on-disk formats.
//! Invariants: a host serves I/O for a volume only while its liveness lease
//! is held and the directory names it owner at the coordinator's epoch; a
//! host that loses its lease drops every coordinator at once; a coordinator
//! the host drops leaves nothing in its read cache.

mod control_loop;
mod directory_mirror;
mod fill;
mod layout_record;
mod reclaim;
mod rpc;
mod scrub;

pub use fill::{fill_refusal, FILL_PIECE_BYTES};
pub use scrub::{ScrubView, SCRUB_MIN_RATE, SCRUB_NOW_RATE};

use crate::attachments::Attachments;
use crate::components::ClusterComponents;
use crate::config::{DirectoryConfig, HostConfig};
use crate::error::{FaultError, NodeError, RekeyError};
use crate::iscsi::{HostTargets, ReservationTable};
use crate::peers::Peers;
use crate::resync_board::ResyncBoard;
use crate::routing::{HostCatalog, VolumeHandle};
use control_loop::ControlState;
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tessera_control::{ControlConfig, HostControl};
use tessera_directory::keys::{
    self, DiskGroupEncryption, DiskGroupRecord, DiskGroupState, HostAddresses, HostDiskGroup,
    HostRecord, OwnerRecord, RekeyState, VolumeRecord,
};
use tessera_directory::{Directory, EmbeddedDirectory, EtcdDirectory, HostSession, Keyspace};
use tessera_env::{Clock, FailSwitch, Rng, SeededRng, SwitchedDisk, SystemClock};
use tessera_iscsi::scsi::environment::DatastoreSpace;
use tessera_object::{Coordinator, IoScheduler, ReadCache};
use tessera_replica::ReplicaService;
use tessera_store::{DeviceSpec, DiskGroup};
use tessera_transport::{Transport, TransportConfig};
use tessera_types::layout::Layout;
use tessera_types::{ComponentId, DiskGroupId, HostId, VolumeId};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often the control loop looks at the directory.
pub const TICK: Duration = Duration::from_millis(500);

/// Ticks between refreshes of disk group usage in the directory.
const USAGE_TICKS: u64 = 4;

/// The memory a host is taken to have when it cannot read its own (no
/// `/proc/meminfo`): the read cache's default and limit follow from it.
const FALLBACK_MEMORY_BYTES: u64 = 16 << 30;

/// This machine's memory (`MemTotal` of `/proc/meminfo`), or
/// [`FALLBACK_MEMORY_BYTES`] when it cannot be read.
pub fn host_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| parse_mem_total(&text))
        .unwrap_or(FALLBACK_MEMORY_BYTES)
}

/// Bytes of `MemTotal:  N kB` in the text of `/proc/meminfo`.
fn parse_mem_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// Coordinators of the volumes a host owns, shared with its request handler.
pub type Owned = Arc<RwLock<HashMap<VolumeId, Arc<Coordinator>>>>;

/// A snapshot as the view keys it: its volume and its name.
pub type SnapshotKey = (VolumeId, keys::SnapshotName);

/// What the host knows of the cluster's volumes, kept current by the directory
/// watch (`host/directory_mirror.rs`).
#[derive(Default)]
pub struct VolumeView {
    /// Volume records.
    pub volumes: RwLock<HashMap<VolumeId, VolumeRecord>>,
    /// Owner records.
    pub owners: RwLock<HashMap<VolumeId, OwnerRecord>>,
    /// Layouts.
    pub layouts: RwLock<HashMap<VolumeId, Layout>>,
    /// Space of every disk group together, for the thin-provisioning
    /// threshold frontends report.
    pub datastore: RwLock<Option<DatastoreSpace>>,
    /// Who may log in to each volume's iSCSI target.
    pub iscsi_access: RwLock<HashMap<VolumeId, keys::VolumeAccessRecord>>,
    /// Snapshots, by volume and name.
    pub snapshots: RwLock<HashMap<SnapshotKey, keys::SnapshotRecord>>,
    /// The VAAI offloads this host's iSCSI units offer (the settings
    /// `vaai_*`).
    pub offloads: RwLock<tessera_iscsi::scsi::Offloads>,
}

/// A running host.
pub struct Host {
    /// Its configuration.
    pub config: HostConfig,
    id: HostId,
    directory: Arc<dyn Directory>,
    keys: Keyspace,
    replica: Arc<ReplicaService>,
    transport: Arc<Transport>,
    peers: Arc<Peers>,
    session: Mutex<Option<Arc<HostSession>>>,
    /// The liveness lease's time to live the settings ask for (ms); the
    /// control loop moves the session to it.
    lease_ttl_ms: std::sync::atomic::AtomicU64,
    owned: Owned,
    view: Arc<VolumeView>,
    board: Arc<ResyncBoard>,
    clock: Arc<dyn Clock>,
    /// What this host does on its own, for the cluster's event log.
    events: Arc<crate::events::EventLog>,
    rng: Arc<dyn Rng>,
    /// The host's decisions (`tessera_control`) and what it was told.
    control: Mutex<ControlState>,
    /// Where the view stands against the directory.
    mirror: directory_mirror::Mirror,
    /// The components this host is to delete (its reclaim records).
    reclaims: reclaim::Reclaims,
    /// Each disk group's health and encryption as last written to the
    /// directory.
    published_health: Mutex<Vec<PublishedGroup>>,
    /// A probe of the devices is under way (see the control loop).
    probing: std::sync::atomic::AtomicBool,
    /// Set while a pass settles the write intents of the volumes it owns.
    settling_intents: std::sync::atomic::AtomicBool,
    /// Fault injection's switches of each disk group's devices: the cache
    /// device first, then the capacity devices (tripped only when the
    /// configuration accepts fault injection).
    device_switches: HashMap<DiskGroupId, Vec<FailSwitch>>,
    /// What this host registers in the directory (again after losing its lease).
    record: HostRecord,
    /// Set first thing when the host stops.
    halted: Arc<std::sync::atomic::AtomicBool>,
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The volumes whose fill (a full clone being filled from a snapshot)
    /// a task of this host runs, with the epoch of the coordinator it runs
    /// on (`host/fill.rs`).
    fills: Mutex<HashMap<VolumeId, tessera_types::Epoch>>,
    /// Lost copies whose replacements are being given the volume's
    /// snapshots (a rebuild that carries snapshots runs as a task; the
    /// core asks again every tick meanwhile).
    carrying: Mutex<HashSet<(VolumeId, ComponentId)>>,
    /// The iSCSI targets this host serves.
    targets: Arc<HostTargets>,
    /// Volumes its clients have open.
    attachments: Arc<Attachments>,
    /// The attachments generation last written to the directory.
    attachments_published: std::sync::atomic::AtomicU64,
    /// The read cache the coordinators of this host share.
    read_cache: Arc<ReadCache>,
    /// The I/O scheduler the coordinators of this host share.
    scheduler: Arc<IoScheduler>,
    /// Verifies the stored blocks of its disk groups on a schedule.
    scrubber: scrub::Scrubber,
    /// This machine's memory, which sizes the read cache.
    memory_bytes: u64,
    /// The volumes this host serves, as its NBD server and iSCSI targets
    /// open them.
    catalog: Arc<HostCatalog>,
}

/// Opens the directory a configuration names.
pub async fn open_directory(
    config: &DirectoryConfig,
    clock: Arc<dyn Clock>,
) -> Result<Arc<dyn Directory>, String> {
    match config {
        DirectoryConfig::Embedded { path } => EmbeddedDirectory::open(path, clock)
            .await
            .map(|d| Arc::new(d) as Arc<dyn Directory>)
            .map_err(|e| format!("embedded directory {}: {e}", path.display())),
        DirectoryConfig::Etcd { endpoints, tls } => match tls {
            Some(tls) => EtcdDirectory::connect_tls(endpoints, tls).await,
            None => EtcdDirectory::connect(endpoints).await,
        }
        .map(|d| Arc::new(d) as Arc<dyn Directory>)
        .map_err(|e| format!("etcd at {}: {e}", endpoints.join(","))),
    }
}

impl Host {
    /// Starts a host: opens its disk groups, binds its transport and NBD
    /// listener, registers in the directory and starts its control loop.
    pub async fn start(
        config: HostConfig,
        directory: Arc<dyn Directory>,
        board: Arc<ResyncBoard>,
    ) -> Result<Arc<Host>, NodeError> {
        config.check().map_err(NodeError::Config)?;
        let id = config.id.clone();
        let keys = Keyspace::new(&config.cluster).map_err(|source| NodeError::Directory {
            host: id.clone(),
            source,
        })?;
        let mut groups = Vec::new();
        let mut device_switches = HashMap::new();
        for dg in &config.disk_groups {
            let store_config = tessera_store::DiskGroupConfig {
                id: dg.id.clone(),
                cache: DeviceSpec {
                    path: dg.cache.path.clone(),
                    size_bytes: dg.cache.size_bytes,
                },
                capacity: dg
                    .capacity
                    .iter()
                    .map(|d| DeviceSpec {
                        path: d.path.clone(),
                        size_bytes: d.size_bytes,
                    })
                    .collect(),
                index_cache_bytes: config.index_cache_bytes
                    / config.disk_groups.len().max(1) as u64,
                content_cache_bytes: tessera_store::CONTENT_CACHE_BYTES_DEFAULT,
                direct_io: if config.direct_io {
                    tessera_store::DirectIo::All
                } else {
                    tessera_store::DirectIo::Log
                },
                encryption: config
                    .encryption
                    .as_ref()
                    .map(|e| e.keys())
                    .transpose()
                    .map_err(|e| NodeError::Config(format!("host {id}: encryption: {e}")))?,
            };
            // Behind switches only where fault injection is on: the
            // devices of a production host are never one call away from
            // failing on request.
            let switches: Vec<FailSwitch> = (0..=dg.capacity.len())
                .map(|_| FailSwitch::default())
                .collect();
            let mut next = switches.clone().into_iter();
            let group = if config.fault_injection {
                DiskGroup::open_or_create_wrapped(store_config, |device| {
                    let switch = next.next().unwrap_or_default();
                    Arc::new(SwitchedDisk::new(device, switch))
                })
                .await
            } else {
                DiskGroup::open_or_create(store_config).await
            }
            .map_err(|source| NodeError::Store {
                host: id.clone(),
                disk_group: dg.id.to_string(),
                source,
            })?;
            device_switches.insert(dg.id.clone(), switches);
            groups.push(group);
        }
        let replica = Arc::new(ReplicaService::new(groups));
        let owned: Owned = Arc::default();
        let handler = Arc::new(rpc::HostHandler {
            replica: Arc::clone(&replica),
            owned: Arc::clone(&owned),
        });
        let transport = Transport::bind(
            id.clone(),
            config.transport_addr,
            handler,
            TransportConfig {
                tls: config
                    .tls
                    .as_ref()
                    .filter(|t| t.transport)
                    .map(|t| t.transport())
                    .transpose()
                    .map_err(|e| NodeError::Config(format!("host {id}: transport TLS: {e}")))?,
                ..TransportConfig::default()
            },
        )
        .await
        .map_err(|e| NodeError::Serve {
            host: id.clone(),
            what: "transport",
            detail: e.to_string(),
        })?;
        let transport = Arc::new(transport);
        let nbd_tls = config
            .tls
            .as_ref()
            .map(|t| t.nbd())
            .transpose()
            .map_err(|e| NodeError::Config(format!("host {id}: TLS: {e}")))?;
        let nbd_listener = tokio::net::TcpListener::bind(config.nbd_addr)
            .await
            .map_err(|e| NodeError::Serve {
                host: id.clone(),
                what: "NBD listener",
                detail: format!("{}: {e}", config.nbd_addr),
            })?;
        let iscsi_listener = tokio::net::TcpListener::bind(config.iscsi_portal())
            .await
            .map_err(|e| NodeError::Serve {
                host: id.clone(),
                what: "iSCSI portal",
                detail: format!("{}: {e}", config.iscsi_portal()),
            })?;
        let record = HostRecord {
            id: id.clone(),
            fault_domain: config.fault_domain(),
            addresses: HostAddresses {
                transport: transport.local_addr(),
                nbd: config.nbd_addr,
                iscsi: config.iscsi_portal(),
                api: config
                    .api_addr
                    .unwrap_or_else(|| SocketAddr::new(config.nbd_addr.ip(), 9480)),
            },
            disk_groups: replica
                .disk_groups()
                .iter()
                .map(|g| HostDiskGroup {
                    id: g.id().clone(),
                    capacity_bytes: g.space().capacity_bytes,
                })
                .collect(),
            witness_only: false,
        };
        let dir_error = |source| NodeError::Directory {
            host: id.clone(),
            source,
        };
        // The settings size the caches and the lease at once; every
        // refresh applies changes.
        let memory_bytes = host_memory_bytes();
        let own_settings = keys::get(directory.as_ref(), &keys.host_settings(&id))
            .await
            .ok()
            .flatten()
            .map(|r| r.value)
            .unwrap_or_default();
        let settings = keys::get(directory.as_ref(), &keys.settings())
            .await
            .ok()
            .flatten()
            .map(|r| r.value)
            .unwrap_or_default()
            .for_host(&own_settings);
        let lease_ttl_ms = settings.lease_ttl_ms.unwrap_or(config.lease_ttl_ms);
        let session = tessera_directory::register_host(
            Arc::clone(&directory),
            &keys,
            record.clone(),
            Duration::from_millis(lease_ttl_ms),
        )
        .await
        .map_err(dir_error)?;
        let (stop, _) = watch::channel(false);
        let view = Arc::new(VolumeView::default());
        let peers = Arc::new(Peers::default());
        let attachments = Arc::new(Attachments::default());
        let catalog = Arc::new(HostCatalog::new(
            id.clone(),
            Arc::clone(&replica),
            Arc::clone(&owned),
            Arc::clone(&view),
            Arc::clone(&peers),
            Arc::clone(&transport),
            Arc::clone(&attachments),
        ));
        let reservations = Arc::new(ReservationTable::new(Arc::clone(&directory), keys.clone()));
        let targets = Arc::new(
            HostTargets::new(
                id.clone(),
                Arc::clone(&view),
                Arc::clone(&peers),
                Arc::clone(&catalog),
                Arc::clone(&reservations),
            )
            .with_secrets(config.secrets().map_err(NodeError::Config)?),
        );
        let read_cache = ReadCache::new(settings.read_cache_budget(memory_bytes));
        // Blocks are served from memory only while no other host can have
        // taken over this host's volumes: its owner keys live on its lease.
        read_cache.set_ownership_check(lease_check(&session));
        let scheduler = IoScheduler::new(tessera_object::io_scheduler::DEFAULT_DEPTH);
        scheduler.set_resync_multiplier(settings.resync_delay_multiplier);
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::default());
        let events = Arc::new(crate::events::EventLog::new(
            Arc::clone(&directory),
            keys.clone(),
            Arc::clone(&clock),
            id.clone(),
        ));
        let host = Arc::new(Host {
            id: id.clone(),
            directory,
            keys,
            events,
            replica,
            transport,
            peers,
            session: Mutex::new(Some(Arc::new(session))),
            lease_ttl_ms: std::sync::atomic::AtomicU64::new(lease_ttl_ms),
            owned,
            view,
            board,
            clock,
            rng: Arc::new(SeededRng::from_entropy()),
            control: Mutex::new(ControlState {
                core: HostControl::new(
                    id.clone(),
                    ControlConfig {
                        repair_delay: Duration::from_secs(config.repair_delay_s),
                        resync_backoff: Duration::from_millis(config.lease_ttl_ms),
                    },
                ),
                reported: Default::default(),
                inbox: Vec::new(),
            }),
            mirror: Default::default(),
            reclaims: Default::default(),
            published_health: Mutex::new(Vec::new()),
            probing: std::sync::atomic::AtomicBool::new(false),
            settling_intents: std::sync::atomic::AtomicBool::new(false),
            device_switches,
            record,
            halted: Arc::default(),
            stop,
            tasks: Mutex::new(Vec::new()),
            fills: Mutex::new(HashMap::new()),
            carrying: Mutex::new(HashSet::new()),
            targets: Arc::clone(&targets),
            attachments,
            attachments_published: std::sync::atomic::AtomicU64::new(u64::MAX),
            read_cache,
            scheduler,
            scrubber: scrub::Scrubber::new(settings.scrub_period_h),
            memory_bytes,
            catalog: Arc::clone(&catalog),
            config,
        });
        host.publish_usage().await;
        if let Err(e) = host.load_directory().await {
            tracing::warn!(host = %id, error = %e, "cannot read the directory yet");
        }
        let follow_directory = tokio::spawn(Host::follow_directory(
            Arc::downgrade(&host),
            host.stop.subscribe(),
        ));
        let mut stop_rx = host.stop.subscribe();
        let nbd = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            };
            if let Err(e) = tessera_nbd::serve(nbd_listener, catalog, nbd_tls, shutdown).await {
                tracing::error!(error = %e, "NBD server stopped");
            }
        });
        let mut stop_rx = host.stop.subscribe();
        let iscsi = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            };
            if let Err(e) = tessera_iscsi::serve(iscsi_listener, targets, shutdown).await {
                tracing::error!(error = %e, "iSCSI server stopped");
            }
        });
        let follow = tokio::spawn(reservations.follow(host.stop.subscribe()));
        let scrub = tokio::spawn(scrub::run(Arc::downgrade(&host), host.stop.subscribe()));
        let weak = Arc::downgrade(&host);
        let mut stop_rx = host.stop.subscribe();
        let control = tokio::spawn(async move {
            let mut tick: u64 = 0;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(TICK) => {}
                    _ = stop_rx.wait_for(|s| *s) => break,
                }
                let Some(host) = weak.upgrade() else { break };
                host.control_tick(tick).await;
                host.reclaim_due();
                tick += 1;
            }
        });
        host.tasks
            .lock()
            .extend([nbd, iscsi, follow, follow_directory, control, scrub]);
        tracing::info!(host = %id, nbd = %host.config.nbd_addr, iscsi = %host.config.iscsi_portal(), transport = %host.transport.local_addr(), "host started");
        Ok(host)
    }

    /// Host id.
    pub fn id(&self) -> &HostId {
        &self.id
    }

    /// The replica service (this host's disk groups).
    pub fn replica(&self) -> &Arc<ReplicaService> {
        &self.replica
    }

    /// The transport (for fault hooks and statistics).
    pub fn transport(&self) -> &Arc<Transport> {
        &self.transport
    }

    /// The SCSI offload counters of `volume`'s logical unit on this host.
    pub fn offload_counters(&self, volume: &VolumeId) -> Option<tessera_iscsi::scsi::VaaiCounters> {
        self.targets.counters(volume)
    }

    /// Coordinators this host runs.
    pub fn owned(&self) -> Vec<(VolumeId, Arc<Coordinator>)> {
        let mut out: Vec<_> = self
            .owned
            .read()
            .iter()
            .map(|(v, c)| (v.clone(), Arc::clone(c)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The read cache of the volumes this host owns.
    pub fn read_cache(&self) -> &Arc<ReadCache> {
        &self.read_cache
    }

    /// The memory of the machine this host runs on, which sizes its read
    /// cache.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// The record of snapshot `name` of `volume`, as this host's view of
    /// the directory has it.
    pub fn snapshot(
        &self,
        volume: &VolumeId,
        name: &keys::SnapshotName,
    ) -> Option<keys::SnapshotRecord> {
        self.view
            .snapshots
            .read()
            .get(&(volume.clone(), name.clone()))
            .cloned()
    }

    /// A handle on a ready volume, as this host's NBD server and iSCSI
    /// targets have it: requests go to the volume's owner, wherever it is.
    /// Not counted as a client of the volume.
    pub fn open_volume(&self, name: &str) -> Option<Arc<VolumeHandle>> {
        self.catalog.open_handle(name, false)
    }

    /// Drops every coordinator, and what the read cache holds for them.
    /// Stops serving `volume`'s blocks from the host read cache: its
    /// ownership is moving to another host.
    pub fn forget_cached(&self, volume: &VolumeId) {
        if let Some(c) = self.owned.read().get(volume) {
            c.forget_cached();
        }
    }

    fn drop_coordinators(&self) {
        for (_, c) in self.owned.write().drain() {
            c.forget_cached();
        }
    }

    /// What this host knows of the other hosts.
    pub fn peers(&self) -> &Arc<Peers> {
        &self.peers
    }

    /// Component access from this host for `volume`.
    pub fn components(&self, volume: &VolumeId) -> Arc<ClusterComponents> {
        Arc::new(ClusterComponents::new(
            self.id.clone(),
            volume.clone(),
            Arc::clone(&self.replica),
            Arc::clone(&self.transport),
            Arc::clone(&self.peers),
        ))
    }

    /// Stops the host. With `clean`, its lease is revoked so others take
    /// over at once; without, it vanishes as a crashed host would and others
    /// notice when its lease lapses.
    pub async fn stop(&self, clean: bool) {
        self.halted.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.stop.send(true);
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
        if clean {
            // A clean hand-over: the next owners need not reconcile the
            // regions written lately, only what is still under way.
            let owned: Vec<Arc<Coordinator>> = self.owned.read().values().cloned().collect();
            for c in owned {
                if let Err(e) = c.release_intents().await {
                    tracing::debug!(host = %self.id, error = %e, "write intents not released");
                }
            }
        }
        self.drop_coordinators();
        let session = self.session.lock().take();
        if let Some(session) = session {
            if clean {
                if let Err(e) = session.stop().await {
                    tracing::warn!(host = %self.id, error = %e, "could not revoke the host's lease");
                }
            }
        }
        self.transport.shutdown().await;
        for group in self.replica.disk_groups() {
            if let Err(e) = group.flush().await {
                tracing::warn!(host = %self.id, disk_group = %group.id(), error = %e, "flush at stop failed");
            }
        }
        tracing::info!(host = %self.id, clean, "host stopped");
    }

    /// Makes a device of one of this host's disk groups fail from now on,
    /// as a device that dies does (fault injection: refused unless the
    /// host's configuration accepts it). `device` 0 is the cache device,
    /// 1 and up the capacity devices in order.
    pub fn fail_device(&self, disk_group: &DiskGroupId, device: usize) -> Result<(), FaultError> {
        if !self.config.fault_injection {
            return Err(FaultError::NotAccepted {
                host: self.id.clone(),
            });
        }
        let switch = self
            .device_switches
            .get(disk_group)
            .and_then(|s| s.get(device))
            .ok_or_else(|| FaultError::NoSuchDevice {
                host: self.id.clone(),
                disk_group: disk_group.clone(),
                device,
            })?;
        tracing::warn!(host = %self.id, %disk_group, device, "fault injected: device fails from now on");
        switch.trip();
        Ok(())
    }

    /// The hosts a network fault of this host applies to: `peer`, or every
    /// other host of the cluster when `None`.
    fn fault_peers(&self, peer: Option<&str>) -> Result<Vec<HostId>, FaultError> {
        if !self.config.fault_injection {
            return Err(FaultError::NotAccepted {
                host: self.id.clone(),
            });
        }
        let others: Vec<HostId> = self
            .peers
            .records()
            .into_iter()
            .map(|r| r.id)
            .filter(|id| *id != self.id)
            .collect();
        match peer {
            None => Ok(others),
            Some(p) => others
                .into_iter()
                .find(|id| id.as_str() == p)
                .map(|id| vec![id])
                .ok_or_else(|| FaultError::NoSuchPeer {
                    host: self.id.clone(),
                    peer: p.to_string(),
                }),
        }
    }

    /// Delays every frame this host sends to `peer` (every other host when
    /// `None`) by `delay` plus up to `jitter` (fault injection).
    pub fn delay_frames(
        &self,
        peer: Option<&str>,
        delay: Duration,
        jitter: Duration,
    ) -> Result<(), FaultError> {
        let peers = self.fault_peers(peer)?;
        let faults = self.transport.faults();
        for p in &peers {
            faults.set_delay(&self.id, p, delay, jitter);
        }
        tracing::warn!(host = %self.id, ?peers, ?delay, ?jitter, "fault injected: frames delayed");
        Ok(())
    }

    /// Loses each frame this host sends to `peer` (every other host when
    /// `None`) with `probability` (fault injection).
    pub fn drop_frames(&self, peer: Option<&str>, probability: f64) -> Result<(), FaultError> {
        let peers = self.fault_peers(peer)?;
        let faults = self.transport.faults();
        for p in &peers {
            faults.set_drop_probability(&self.id, p, probability);
        }
        tracing::warn!(host = %self.id, ?peers, probability, "fault injected: frames lost");
        Ok(())
    }

    /// Cuts the data path between this host and `peer` (every other host
    /// when `None`), both ways (fault injection).
    pub fn partition(&self, peer: Option<&str>) -> Result<(), FaultError> {
        let peers = self.fault_peers(peer)?;
        let faults = self.transport.faults();
        for p in &peers {
            faults.partition(&self.id, p);
        }
        tracing::warn!(host = %self.id, ?peers, "fault injected: partitioned");
        Ok(())
    }

    /// Ends every network fault set on this host.
    pub fn heal_network(&self) -> Result<(), FaultError> {
        self.fault_peers(None)?;
        self.transport.faults().clear();
        tracing::warn!(host = %self.id, "network faults healed");
        Ok(())
    }

    /// The directory this host works with, and its cluster's keys there.
    pub fn directory(&self) -> (&Arc<dyn Directory>, &Keyspace) {
        (&self.directory, &self.keys)
    }

    /// Starts a scrub pass of every disk group of this host now (at
    /// [`SCRUB_NOW_RATE`]), in place of a scheduled pass under way; bad
    /// blocks it finds are rewritten by their volumes' owners.
    pub fn scrub_now(&self) {
        tracing::info!(host = %self.id, "scrub pass asked for");
        self.scrubber.request_now();
    }

    /// Each disk group's scrubbing: the pass under way or the last one,
    /// repairs, and when the next scheduled pass starts.
    pub fn scrubs(&self) -> Vec<ScrubView> {
        self.scrubber.views(self, self.clock.monotonic())
    }

    /// Flips one bit of the stored copy of block `lba` of `volume`'s copy
    /// on this host (the first, if it has several), past every checksum:
    /// a latent media error, for hosts that accept fault injection.
    /// Answers the component and where the block is stored.
    pub async fn damage_block(
        &self,
        volume: &VolumeId,
        lba: tessera_types::Lba,
    ) -> Result<(ComponentId, String), FaultError> {
        if !self.config.fault_injection {
            return Err(FaultError::NotAccepted {
                host: self.id.clone(),
            });
        }
        let component = self
            .view
            .layouts
            .read()
            .get(volume)
            .and_then(|l| {
                l.components()
                    .find(|c| {
                        c.host == self.id && c.role == tessera_types::layout::ComponentRole::Data
                    })
                    .map(|c| c.id)
            })
            .ok_or_else(|| FaultError::NoCopy {
                host: self.id.clone(),
                volume: volume.clone(),
            })?;
        let group = self
            .replica
            .home(component)
            .ok_or_else(|| FaultError::NoCopy {
                host: self.id.clone(),
                volume: volume.clone(),
            })?;
        let location = group
            .damage_block(component, lba)
            .await
            .map_err(|e| FaultError::Store {
                host: self.id.clone(),
                reason: e.to_string(),
            })?;
        Ok((component, location))
    }

    /// How long until the repair delay of an absent component of a volume
    /// this host owns ends (and a rebuild elsewhere starts); None when this
    /// host is not counting for it.
    pub fn repair_in(&self, volume: &VolumeId, component: ComponentId) -> Option<Duration> {
        self.control
            .lock()
            .core
            .repair_in(volume, component, self.clock.monotonic())
    }

    /// Volumes this host's clients (NBD connections, iSCSI sessions) have open.
    pub fn attachments(&self) -> &Arc<Attachments> {
        &self.attachments
    }

    /// Writes the volumes this host's clients have open to the directory,
    /// under the host's lease, when they changed since the last write.
    async fn publish_attachments(&self) {
        use std::sync::atomic::Ordering;
        let generation = self.attachments.generation();
        if self.attachments_published.load(Ordering::Relaxed) == generation {
            return;
        }
        let Some(lease) = self.session.lock().as_ref().map(|s| s.lease()) else {
            return;
        };
        let record = keys::AttachmentRecord {
            host: self.id.clone(),
            volumes: self.attachments.snapshot(),
        };
        let key = self.keys.attachments(&self.id);
        match keys::put(self.directory.as_ref(), &key, &record, Some(lease)).await {
            Ok(_) => self
                .attachments_published
                .store(generation, Ordering::Relaxed),
            Err(e) => {
                tracing::debug!(host = %self.id, error = %e, "could not publish open volumes")
            }
        }
    }

    /// Reads host addresses and liveness from the directory now.
    pub async fn refresh_peers(&self) {
        let directory = self.directory.as_ref();
        if let (Ok(hosts), Ok(live)) = (
            keys::list(directory, &self.keys.hosts()).await,
            tessera_directory::live_hosts(directory, &self.keys).await,
        ) {
            self.peers
                .update(hosts.records.into_iter().map(|r| r.value).collect(), live);
        }
    }

    /// Reads the whole view from the directory now, in one listing,
    /// rather than waiting for the watch's news (the control plane calls it
    /// after a change it made, so the next request sees it).
    pub async fn refresh_view(&self) {
        if let Err(e) = self.load_directory().await {
            tracing::debug!(host = %self.id, error = %e, "cannot read the directory now");
        }
    }

    /// Writes this host's disk group usage and health to the directory
    /// (placement reads the space, owners the health).
    async fn publish_usage(&self) {
        let mut published = Vec::new();
        for group in self.replica.disk_groups() {
            let space = group.space();
            let (state, failed_components) = storage_health(&group.health());
            let record = DiskGroupRecord {
                host: self.id.clone(),
                id: group.id().clone(),
                state,
                capacity_bytes: space.capacity_bytes,
                used_bytes: space.used_bytes,
                reserved_bytes: space.reserved_bytes,
                failed_components,
                encryption: encryption_record(group),
            };
            let key = self.keys.disk_group(&self.id, group.id());
            match keys::put(self.directory.as_ref(), &key, &record, None).await {
                Ok(_) => {
                    published.push((record.state, record.failed_components, record.encryption))
                }
                Err(e) => {
                    tracing::debug!(host = %self.id, error = %e, "could not publish disk group usage");
                    return;
                }
            }
        }
        *self.published_health.lock() = published;
    }

    /// Whether a disk group's health changed since it was last written to
    /// the directory: a failure is published at the next tick, not with
    /// the next usage refresh.
    fn storage_health_changed(&self) -> bool {
        let now: Vec<_> = self
            .replica
            .disk_groups()
            .iter()
            .map(|g| {
                let (state, failed) = storage_health(&g.health());
                (state, failed, encryption_record(g))
            })
            .collect();
        *self.published_health.lock() != now
    }

    /// Rekeys this host's encrypted disk groups (or only `disk_group`) with
    /// the key files of its configuration, read now: a shallow rekey seals
    /// each data key with the current key encryption key; a deep one also
    /// starts rewriting every block under a new data key in the background.
    /// Plaintext disk groups are left as they are. Answers what each disk
    /// group's encryption is now.
    pub async fn rekey(
        &self,
        deep: bool,
        disk_group: Option<&DiskGroupId>,
    ) -> Result<Vec<(DiskGroupId, DiskGroupEncryption)>, RekeyError> {
        let host = self.id.clone();
        let Some(encryption) = &self.config.encryption else {
            return Err(RekeyError::NoKeys { host });
        };
        let keys = encryption.keys().map_err(|problem| RekeyError::KeyFiles {
            host: host.clone(),
            problem,
        })?;
        let groups: Vec<_> = self
            .replica
            .disk_groups()
            .iter()
            .filter(|g| disk_group.is_none_or(|d| g.id() == d))
            .cloned()
            .collect();
        if let (Some(disk_group), true) = (disk_group, groups.is_empty()) {
            return Err(RekeyError::NoDiskGroup {
                host,
                disk_group: disk_group.clone(),
            });
        }
        let mut out = Vec::new();
        for g in groups {
            if g.encryption().is_none() {
                continue;
            }
            let done = if deep {
                g.start_deep_rekey(&keys).await.map(|_| ())
            } else {
                g.rewrap_keys(&keys).await.map(|_| ())
            };
            done.map_err(|source| RekeyError::Store {
                host: host.clone(),
                disk_group: g.id().clone(),
                source,
            })?;
            tracing::info!(host = %self.id, disk_group = %g.id(), deep, "rekey");
            if let Some(e) = encryption_record(&g) {
                out.push((g.id().clone(), e));
            }
        }
        if out.is_empty() {
            return Err(RekeyError::NothingEncrypted { host });
        }
        self.publish_usage().await;
        Ok(out)
    }
}

/// What the directory record of a disk group says of its health and
/// encryption.
type PublishedGroup = (
    DiskGroupState,
    Vec<ComponentId>,
    Option<DiskGroupEncryption>,
);

/// A disk group's encryption as its directory record says it.
fn encryption_record(group: &DiskGroup) -> Option<DiskGroupEncryption> {
    group.encryption().map(|e| DiskGroupEncryption {
        cipher: "aes-256-xts".into(),
        kek_id: e.kek_id.to_string(),
        generation: e.generation,
        rekey: e.rekey.map(|r| RekeyState {
            done_bytes: r.done_bytes,
            total_bytes: r.total_bytes,
            bytes_per_second: r.bytes_per_second,
        }),
    })
}

/// A disk group's health as its directory record says it: the state, and
/// the components its failed capacity devices took.
fn storage_health(health: &tessera_store::DiskGroupHealth) -> (DiskGroupState, Vec<ComponentId>) {
    match health {
        tessera_store::DiskGroupHealth::Healthy => (DiskGroupState::Healthy, Vec::new()),
        tessera_store::DiskGroupHealth::Degraded {
            failed_components, ..
        } => (DiskGroupState::Degraded, failed_components.clone()),
        tessera_store::DiskGroupHealth::Failed { .. } => (DiskGroupState::Failed, Vec::new()),
    }
}

/// A stable serial for a volume's SCSI/NBD identity: the same on every host
/// (so SCSI NAA designators match across paths), different for a volume
/// deleted and created again under the same name.
pub(crate) fn serial_of(volume: &VolumeRecord) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ volume.created_ms;
    for b in volume.name.as_str().bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Runs one host from a configuration file until `shutdown` completes.
pub async fn run_config_file(
    path: &std::path::Path,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), NodeError> {
    let config = HostConfig::from_file(path).map_err(NodeError::Config)?;
    let directory = open_directory(&config.directory, Arc::new(SystemClock::default()))
        .await
        .map_err(NodeError::Config)?;
    let board = Arc::new(ResyncBoard::default());
    let host = Host::start(config.clone(), Arc::clone(&directory), Arc::clone(&board)).await?;
    let api = match config.api_addr {
        Some(addr) => {
            let listener =
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| NodeError::Serve {
                        host: config.id.clone(),
                        what: "API listener",
                        detail: format!("{addr}: {e}"),
                    })?;
            let control = Arc::new(
                crate::control_plane::ControlPlane::new(
                    directory,
                    &config.cluster,
                    crate::control_plane::HostSet::single(Arc::clone(&host)),
                    board,
                )
                .with_secrets(config.secrets().map_err(NodeError::Config)?),
            );
            control.start_activity_sampling();
            // The host that serves the API gives a new cluster its first
            // admin token, beside its configuration file.
            let token_file = crate::up::admin_token_path(
                path.parent().unwrap_or_else(|| std::path::Path::new(".")),
            );
            match control
                .write_first_admin_token(&token_file)
                .await
                .map_err(NodeError::Config)?
            {
                crate::control_plane::AdminTokenFile::Written(p) => {
                    tracing::warn!(path = %p.display(), "the cluster's first admin token written")
                }
                other => tracing::info!(?other, "admin token"),
            }
            let tls = config
                .tls
                .as_ref()
                .map(|t| t.server())
                .transpose()
                .map_err(|e| NodeError::Config(format!("host {}: TLS: {e}", config.id)))?;
            Some(tokio::spawn(async move {
                let served = match tls {
                    Some(tls) => {
                        crate::api::serve_tls(listener, tls, control, std::future::pending()).await
                    }
                    None => crate::api::serve(listener, control, std::future::pending()).await,
                };
                if let Err(e) = served {
                    tracing::error!(error = %e, "API server stopped");
                }
            }))
        }
        None => None,
    };
    shutdown.await;
    if let Some(api) = api {
        api.abort();
    }
    host.stop(true).await;
    Ok(())
}

impl Host {
    /// The time to live of the host's liveness lease now (ms), while it
    /// has one.
    pub fn lease_ttl_ms(&self) -> Option<u64> {
        let session = self.session.lock();
        Some(session.as_ref()?.ttl().as_millis() as u64)
    }
}

/// The read cache's ownership check for a session: its lease is certainly
/// held.
fn lease_check(session: &HostSession) -> tessera_object::OwnershipCheck {
    let held = session.held();
    Arc::new(move || held.now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_bytes() {
        let text = "MemTotal:       24421012 kB\nMemFree:         4096 kB\n";
        assert_eq!(parse_mem_total(text), Some(24_421_012 * 1024));
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: lots kB\n"), None);
        assert!(host_memory_bytes() > 0);
    }
}
