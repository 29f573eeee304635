//! The host's copy of the directory records it works from, kept current by
//! one watch of the cluster's keys instead of listings every tick.
//!
//! Owns: loading every record of the cluster in one listing (at start, after
//! a watch ended, and when the control plane asks for a fresh view), then
//! applying each change the watch reports: host records and liveness (to
//! [`crate::peers::Peers`]), volumes, owners, layouts, snapshots and iSCSI
//! access (to the host's `VolumeView`), the cluster settings with this host's
//! own values over them (applied to its caches, scrubber, scheduler, control
//! core and iSCSI units), policies (the QoS of the volumes the
//! host coordinates, set in its I/O scheduler), the disk groups being
//! evacuated (for the control loop), disk group records
//! (their health for the control loop, their space summed as the
//! datastore's), and this host's reclaim records (the components it is to
//! delete, for `host/reclaim.rs`).
//! Must not touch: decisions (the control core's) or writes to the directory.
//! Invariants: a change older than the last full listing is never applied
//! over it (each change carries its revision), and a listing never undoes
//! a newer change (listings and changes take turns); when the watch ends (the
//! directory lost history, the host fell behind, a connection dropped) the
//! host lists once and watches again from that listing, so no change is
//! missed; in steady state the host reads nothing but the watch.

use super::{Host, TICK};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use tessera_directory::keys::{
    ClusterSettings, DiskGroupRecord, EvacuationRecord, HostRecord, HostSettings, OwnerRecord,
    Prefix, ReclaimRecord, SnapshotName, SnapshotRecord, VolumeAccessRecord, VolumeRecord,
};
use tessera_directory::{Keyspace, Revision, WatchEvent, WatchEventKind};
use tessera_iscsi::scsi::environment::DatastoreSpace;
use tessera_types::layout::Layout;
use tessera_types::policy::Policy;
use tessera_types::{DiskGroupId, HostId, PolicyName, VolumeId};
use tokio::sync::watch;

use super::SnapshotKey;

/// What the mirror keeps beside the view: where it stands and the space of
/// each disk group.
#[derive(Default)]
pub(super) struct DirectoryMirror {
    /// Revision of the last full listing applied.
    listed: AtomicU64,
    /// Full listings made (at start, after a watch ended, on request).
    listings: AtomicU64,
    /// Each disk group's record, by key.
    pub(super) disk_groups: Mutex<HashMap<String, DiskGroupRecord>>,
    /// Each policy, by name: what the QoS of a coordinated volume is.
    policies: Mutex<HashMap<PolicyName, Policy>>,
    /// Each host's evacuation, by host.
    evacuations: Mutex<HashMap<HostId, EvacuationRecord>>,
    /// The setting `nearly_full_pct` (0 until the settings are read).
    nearly_full_pct: std::sync::atomic::AtomicU8,
    /// The cluster's settings and this host's own values, as last read.
    settings: Mutex<(ClusterSettings, HostSettings)>,
    /// Held by a full listing from before it reads until the view is
    /// replaced, and by each change applied: a change the watch reports
    /// meanwhile waits, then applies over the listing (or is skipped when
    /// the listing already holds it), instead of being undone by it.
    applying: tokio::sync::Mutex<()>,
}

impl Host {
    /// Keeps the view current until the host stops: one listing, then the
    /// watch from the listing's revision; a listing again whenever the watch
    /// ends.
    pub(super) async fn follow_directory(weak: Weak<Host>, mut stop: watch::Receiver<bool>) {
        loop {
            let Some(host) = weak.upgrade() else { return };
            let watched = match host.load_directory().await {
                Ok(revision) => host.directory.watch(host.keys.root(), revision + 1).await,
                Err(e) => Err(e),
            };
            drop(host);
            let mut events = match watched {
                Ok(events) => events,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot follow the directory yet");
                    tokio::select! {
                        _ = tokio::time::sleep(TICK) => continue,
                        _ = stop.wait_for(|s| *s) => return,
                    }
                }
            };
            loop {
                let event = tokio::select! {
                    e = events.recv() => e,
                    _ = stop.wait_for(|s| *s) => return,
                };
                let Some(host) = weak.upgrade() else { return };
                match event {
                    Ok(event) => host.apply_change(&event).await,
                    Err(e) => {
                        tracing::info!(host = %host.id, error = %e, "directory watch ended; listing again");
                        break;
                    }
                }
            }
        }
    }

    /// Reads every record of the cluster in one listing and makes the view
    /// what it says, each part replaced at once (readers never see it
    /// half-loaded); returns the listing's revision.
    pub(super) async fn load_directory(&self) -> tessera_directory::Result<Revision> {
        let _applying = self.mirror.applying.lock().await;
        let listing = self.directory.list(self.keys.root()).await?;
        self.mirror.listings.fetch_add(1, Ordering::Relaxed);
        let mut loaded = Loaded::default();
        for kv in listing.entries {
            let put = WatchEvent {
                kind: WatchEventKind::Put,
                kv,
            };
            route(&self.keys, &put, &mut loaded);
        }
        self.peers.update(
            loaded.hosts.into_values().collect(),
            loaded.live.into_iter().collect(),
        );
        *self.view.volumes.write() = loaded.volumes;
        *self.view.owners.write() = loaded.owners;
        *self.view.layouts.write() = loaded.layouts;
        *self.view.iscsi_access.write() = loaded.iscsi_access;
        *self.view.snapshots.write() = loaded.snapshots;
        *self.mirror.disk_groups.lock() = loaded.disk_groups;
        *self.mirror.policies.lock() = loaded.policies;
        *self.mirror.evacuations.lock() = loaded.evacuations;
        let mine = self.keys.reclaims_of(&self.id);
        *self.reclaims.waiting.lock() = loaded
            .reclaims
            .into_iter()
            .filter(|(key, _)| key.starts_with(mine.as_str()))
            .collect();
        self.sum_datastore();
        self.apply_qos();
        let own = loaded.host_settings.remove(&self.id).unwrap_or_default();
        *self.mirror.settings.lock() = (loaded.settings.unwrap_or_default(), own);
        self.apply_settings();
        self.mirror
            .listed
            .fetch_max(listing.revision, Ordering::SeqCst);
        self.targets.prune();
        Ok(listing.revision)
    }

    /// Full listings of the directory made so far.
    pub fn directory_listings(&self) -> u64 {
        self.mirror.listings.load(Ordering::Relaxed)
    }

    /// Applies one change the watch reported, unless a later listing
    /// already holds it.
    async fn apply_change(&self, event: &WatchEvent) {
        let _applying = self.mirror.applying.lock().await;
        if event.kv.mod_revision <= self.mirror.listed.load(Ordering::SeqCst) {
            return;
        }
        route(&self.keys, event, &mut LiveView(self));
        // iSCSI units of volumes and snapshots that went away go at once.
        if event.kv.key.starts_with(self.keys.volumes().as_str())
            || event.kv.key.starts_with(self.keys.snapshots().as_str())
        {
            self.targets.prune();
        }
    }

    /// The datastore's space: every disk group record summed.
    fn sum_datastore(&self) {
        let (used, capacity) = self
            .mirror
            .disk_groups
            .lock()
            .values()
            .fold((0, 0), |(u, c), g| (u + g.used_bytes, c + g.capacity_bytes));
        *self.view.datastore.write() = (capacity > 0).then_some(DatastoreSpace {
            used_bytes: used,
            capacity_bytes: capacity,
            // The thin provisioning soft threshold initiators are told of
            // is the one `tessera health` warns at (the units' own until
            // the settings are read).
            soft_threshold_percent: Some(self.mirror.nearly_full_pct.load(Ordering::Relaxed))
                .filter(|p| *p > 0),
        });
    }

    /// The disk groups being evacuated, by host.
    pub(super) fn evacuating_disk_groups(&self) -> BTreeSet<(HostId, DiskGroupId)> {
        self.mirror
            .evacuations
            .lock()
            .values()
            .flat_map(|r| r.places())
            .collect()
    }

    /// Sets in the host's I/O scheduler the QoS of every volume it
    /// coordinates, as its policy says.
    pub(super) fn apply_qos(&self) {
        let owned: Vec<VolumeId> = self.owned.read().keys().cloned().collect();
        for volume in owned {
            self.apply_qos_of(&volume);
        }
    }

    /// Sets `volume`'s QoS in the host's I/O scheduler from its policy (no
    /// limit or minimum while the policy is unknown).
    pub(super) fn apply_qos_of(&self, volume: &VolumeId) {
        let policy = self
            .view
            .volumes
            .read()
            .get(volume)
            .map(|r| r.policy.clone());
        let qos = policy
            .and_then(|p| self.mirror.policies.lock().get(&p).map(|p| p.qos))
            .unwrap_or_default();
        self.scheduler.set_volume_qos(volume, &qos);
    }

    /// Applies the settings this host follows (the cluster's, with its own
    /// values over them): the read cache's budget, the scrub period, the
    /// repair delay, the lease's time to live (the control loop moves the
    /// session to it), the resync delay multiplier and the VAAI offloads
    /// its iSCSI units offer.
    fn apply_settings(&self) {
        let settings = {
            let (cluster, own) = &*self.mirror.settings.lock();
            cluster.for_host(own)
        };
        *self.view.offloads.write() = tessera_iscsi::scsi::Offloads {
            compare_and_write: settings.vaai_ats,
            extended_copy: settings.vaai_xcopy,
            write_same: settings.vaai_write_same,
            unmap: settings.vaai_unmap,
        };
        self.scrubber.set_period_h(settings.scrub_period_h);
        self.mirror
            .nearly_full_pct
            .store(settings.nearly_full_pct, Ordering::Relaxed);
        self.sum_datastore();
        let repair_delay = std::time::Duration::from_secs(
            settings
                .repair_delay_s
                .unwrap_or(self.config.repair_delay_s),
        );
        self.control.lock().core.set_repair_delay(repair_delay);
        self.lease_ttl_ms.store(
            settings.lease_ttl_ms.unwrap_or(self.config.lease_ttl_ms),
            Ordering::Relaxed,
        );
        self.scheduler
            .set_resync_multiplier(settings.resync_delay_multiplier);
        let budget = settings.read_cache_budget(self.memory_bytes);
        if budget != self.read_cache.budget_bytes() {
            tracing::info!(host = %self.id, budget_bytes = budget, "read cache resized");
            self.read_cache.set_budget(budget);
        }
        // The index caches: the host's budget shared out among its disk
        // groups, and the read-ahead in whole index pages.
        let groups = self.replica.disk_groups();
        let index_bytes = settings
            .index_cache_bytes
            .unwrap_or(self.config.index_cache_bytes)
            / groups.len().max(1) as u64;
        // Whole pages whose address space fits in the window (at least one
        // when read-ahead is on): 4 MiB is 4 pages of 1008 KiB.
        let prefetch_pages = match settings.index_prefetch_bytes {
            0 => 0,
            b => (b / tessera_store::INDEX_PAGE_SPAN_BYTES).max(1),
        };
        for g in groups {
            g.set_index_cache(index_bytes, prefetch_pages);
        }
    }
}

/// Where the records of a listing or the changes of a watch go, each kind
/// by itself (`None`: the record was deleted).
trait RecordSink {
    fn host(&mut self, id: HostId, record: Option<HostRecord>);
    fn liveness(&mut self, id: HostId, live: bool);
    fn volume(&mut self, name: VolumeId, record: Option<VolumeRecord>);
    fn owner(&mut self, name: VolumeId, record: Option<OwnerRecord>);
    fn layout(&mut self, name: VolumeId, layout: Option<Layout>);
    fn iscsi_access(&mut self, name: VolumeId, access: Option<VolumeAccessRecord>);
    fn snapshot(&mut self, key: SnapshotKey, record: Option<SnapshotRecord>);
    fn disk_group(&mut self, key: &str, record: Option<DiskGroupRecord>);
    fn policy(&mut self, name: PolicyName, record: Option<Policy>);
    fn evacuation(&mut self, host: HostId, record: Option<EvacuationRecord>);
    fn reclaim(&mut self, key: &str, record: Option<ReclaimRecord>);
    fn settings(&mut self, settings: ClusterSettings);
    fn host_settings(&mut self, host: HostId, record: Option<HostSettings>);
}

/// Sends one put or delete to the sink method of its key's kind; keys of
/// other kinds are not kept.
fn route(keys: &Keyspace, event: &WatchEvent, sink: &mut impl RecordSink) {
    let key = event.kv.key.as_str();
    if let Some(name) = under(&keys.hosts(), key) {
        sink.host(HostId(name.to_string()), decoded(&keys.hosts(), event));
    } else if let Some(name) = under(&keys.liveness_all(), key) {
        sink.liveness(HostId(name.to_string()), event.kind == WatchEventKind::Put);
    } else if let Some(name) = under(&keys.volumes(), key) {
        sink.volume(VolumeId(name.to_string()), decoded(&keys.volumes(), event));
    } else if let Some(name) = under(&keys.owners(), key) {
        sink.owner(VolumeId(name.to_string()), decoded(&keys.owners(), event));
    } else if let Some(name) = under(&keys.layouts(), key) {
        sink.layout(VolumeId(name.to_string()), decoded(&keys.layouts(), event));
    } else if let Some(name) = under(&keys.iscsi_accesses(), key) {
        let access = decoded(&keys.iscsi_accesses(), event);
        sink.iscsi_access(VolumeId(name.to_string()), access);
    } else if let Some(rest) = under(&keys.snapshots(), key) {
        let named = rest
            .split_once('/')
            .and_then(|(v, n)| Some((VolumeId::new(v).ok()?, SnapshotName::new(n).ok()?)));
        match named {
            Some(at) => sink.snapshot(at, decoded(&keys.snapshots(), event)),
            None => tracing::warn!(%key, "a snapshot key with a bad name"),
        }
    } else if let Some(name) = under(&keys.evacuations(), key) {
        sink.evacuation(
            HostId(name.to_string()),
            decoded(&keys.evacuations(), event),
        );
    } else if let Some(name) = under(&keys.policies(), key) {
        match PolicyName::new(name) {
            Ok(name) => sink.policy(name, decoded(&keys.policies(), event)),
            Err(e) => tracing::warn!(%key, error = %e, "a policy key with a bad name"),
        }
    } else if under(&keys.reclaims(), key).is_some() {
        sink.reclaim(key, decoded(&keys.reclaims(), event));
    } else if under(&keys.disk_groups(), key).is_some() {
        sink.disk_group(key, decoded(&keys.disk_groups(), event));
    } else if let Some(name) = under(&keys.host_settings_all(), key) {
        let record = decoded(&keys.host_settings_all(), event);
        sink.host_settings(HostId(name.to_string()), record);
    } else if key == keys.settings().as_str() {
        match event.kind {
            WatchEventKind::Put => match serde_json::from_slice(&event.kv.value) {
                Ok(settings) => sink.settings(settings),
                Err(e) => tracing::warn!(%key, error = %e, "cannot read the cluster settings"),
            },
            WatchEventKind::Delete => sink.settings(ClusterSettings::default()),
        }
    }
}

/// A listing being loaded, installed once complete.
#[derive(Default)]
struct Loaded {
    hosts: HashMap<HostId, HostRecord>,
    live: HashSet<HostId>,
    volumes: HashMap<VolumeId, VolumeRecord>,
    owners: HashMap<VolumeId, OwnerRecord>,
    layouts: HashMap<VolumeId, Layout>,
    iscsi_access: HashMap<VolumeId, VolumeAccessRecord>,
    snapshots: HashMap<SnapshotKey, SnapshotRecord>,
    disk_groups: HashMap<String, DiskGroupRecord>,
    policies: HashMap<PolicyName, Policy>,
    evacuations: HashMap<HostId, EvacuationRecord>,
    reclaims: HashMap<String, ReclaimRecord>,
    settings: Option<ClusterSettings>,
    host_settings: HashMap<HostId, HostSettings>,
}

/// Puts `value` at `key` of `map`, or removes the key for `None`.
fn set<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>, key: K, value: Option<V>) {
    match value {
        Some(v) => map.insert(key, v),
        None => map.remove(&key),
    };
}

impl RecordSink for Loaded {
    fn host(&mut self, id: HostId, record: Option<HostRecord>) {
        set(&mut self.hosts, id, record);
    }
    fn liveness(&mut self, id: HostId, live: bool) {
        if live {
            self.live.insert(id);
        }
    }
    fn volume(&mut self, name: VolumeId, record: Option<VolumeRecord>) {
        set(&mut self.volumes, name, record);
    }
    fn owner(&mut self, name: VolumeId, record: Option<OwnerRecord>) {
        set(&mut self.owners, name, record);
    }
    fn layout(&mut self, name: VolumeId, layout: Option<Layout>) {
        set(&mut self.layouts, name, layout);
    }
    fn iscsi_access(&mut self, name: VolumeId, access: Option<VolumeAccessRecord>) {
        set(&mut self.iscsi_access, name, access);
    }
    fn snapshot(&mut self, key: SnapshotKey, record: Option<SnapshotRecord>) {
        set(&mut self.snapshots, key, record);
    }
    fn disk_group(&mut self, key: &str, record: Option<DiskGroupRecord>) {
        set(&mut self.disk_groups, key.to_string(), record);
    }
    fn policy(&mut self, name: PolicyName, record: Option<Policy>) {
        set(&mut self.policies, name, record);
    }
    fn evacuation(&mut self, host: HostId, record: Option<EvacuationRecord>) {
        set(&mut self.evacuations, host, record);
    }
    fn reclaim(&mut self, key: &str, record: Option<ReclaimRecord>) {
        set(&mut self.reclaims, key.to_string(), record);
    }
    fn settings(&mut self, settings: ClusterSettings) {
        self.settings = Some(settings);
    }
    fn host_settings(&mut self, host: HostId, record: Option<HostSettings>) {
        set(&mut self.host_settings, host, record);
    }
}

/// The host's view itself, for changes one at a time.
struct LiveView<'h>(&'h Host);

impl RecordSink for LiveView<'_> {
    fn host(&mut self, id: HostId, record: Option<HostRecord>) {
        match record {
            Some(r) => self.0.peers.set_record(r),
            None => self.0.peers.remove_record(&id),
        }
    }
    fn liveness(&mut self, id: HostId, live: bool) {
        self.0.peers.set_live(id, live);
    }
    fn volume(&mut self, name: VolumeId, record: Option<VolumeRecord>) {
        set(&mut self.0.view.volumes.write(), name, record);
    }
    fn owner(&mut self, name: VolumeId, record: Option<OwnerRecord>) {
        set(&mut self.0.view.owners.write(), name, record);
    }
    fn layout(&mut self, name: VolumeId, layout: Option<Layout>) {
        set(&mut self.0.view.layouts.write(), name, layout);
    }
    fn iscsi_access(&mut self, name: VolumeId, access: Option<VolumeAccessRecord>) {
        set(&mut self.0.view.iscsi_access.write(), name, access);
    }
    fn snapshot(&mut self, key: SnapshotKey, record: Option<SnapshotRecord>) {
        set(&mut self.0.view.snapshots.write(), key, record);
    }
    fn disk_group(&mut self, key: &str, record: Option<DiskGroupRecord>) {
        set(
            &mut self.0.mirror.disk_groups.lock(),
            key.to_string(),
            record,
        );
        self.0.sum_datastore();
    }
    fn policy(&mut self, name: PolicyName, record: Option<Policy>) {
        set(&mut self.0.mirror.policies.lock(), name, record);
        self.0.apply_qos();
    }
    fn evacuation(&mut self, host: HostId, record: Option<EvacuationRecord>) {
        set(&mut self.0.mirror.evacuations.lock(), host, record);
    }
    fn reclaim(&mut self, key: &str, record: Option<ReclaimRecord>) {
        // Only this host's: the others are their hosts' business.
        if key.starts_with(self.0.keys.reclaims_of(&self.0.id).as_str()) {
            set(&mut self.0.reclaims.waiting.lock(), key.to_string(), record);
        }
    }
    fn settings(&mut self, settings: ClusterSettings) {
        self.0.mirror.settings.lock().0 = settings;
        self.0.apply_settings();
    }
    fn host_settings(&mut self, host: HostId, record: Option<HostSettings>) {
        // Only this host's: the others follow their own.
        if host == self.0.id {
            self.0.mirror.settings.lock().1 = record.unwrap_or_default();
            self.0.apply_settings();
        }
    }
}

/// The rest of `key` after `prefix`, if the key is directly under it.
fn under<'k, T>(prefix: &Prefix<T>, key: &'k str) -> Option<&'k str> {
    key.strip_prefix(prefix.as_str())
}

/// The record a put stores, or None for a delete (and for a value that does
/// not decode, which is logged: the view keeps no half-read record).
fn decoded<T: serde::de::DeserializeOwned>(prefix: &Prefix<T>, event: &WatchEvent) -> Option<T> {
    match prefix.decode_event(event) {
        Ok(record) => record,
        Err(e) => {
            tracing::warn!(key = %event.kv.key, error = %e, "cannot read a directory record");
            None
        }
    }
}

/// Shared with the host: the mirror's state.
pub(super) type Mirror = Arc<DirectoryMirror>;
