//! An in-memory [`ClusterControl`] for tests of the HTTP mapping and of the
//! CLI that prints its answers: it keeps policies, volumes and host states
//! in maps and refuses what the real control plane refuses (duplicate names,
//! unknown policies, out-of-range values, too little space), with the same
//! error kinds. It has no data path: object trees and verify reports are
//! made up from the records, and a test marks copies divergent by hand.
//! The same file is compiled into the `tessera` CLI's tests.

#![allow(dead_code)]

use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::Mutex;
use tessera_node::api_access;
use tessera_node::control::{
    ApiChange, ApiIdentity, ApiRole, ApiTokenRecord, AuditRecord, CapacityView, CloneVolume,
    ClusterControl, ClusterSettings, ComponentView, ControlError, CreatePolicy, CreateSnapshot,
    CreateToken, CreateVolume, CreatedToken, DiskGroupView, Divergence, EncryptionView, EventView,
    FillView, Health, HostActivity, HostSettings, HostSettingsView, HostView, IscsiAccess,
    IscsiAccessView, ObjectView, ReadCacheView, RekeyRequest, RenameVolume, ResizeVolume,
    ResyncView, RevertVolume, ScrubView, SnapshotView, StatusView, TokenView, UpdateHostSettings,
    UpdatePolicy, UpdateSettings, VerifyReport, VolumeActivity, VolumeView,
};
use tessera_types::layout::{ComponentRole, ComponentState};
use tessera_types::policy::Policy;
use tessera_types::{ComponentId, Epoch, PolicyName, VolumeId, BLOCK_BYTES};

/// Capacity of each of the four hosts.
pub const HOST_CAPACITY_BYTES: u64 = 8 << 30;
/// Hosts, each in its own fault domain.
pub const HOSTS: usize = 4;

#[derive(Clone)]
struct VolumeRecord {
    size_bytes: u64,
    policy: String,
    block_bytes: u32,
    used_bytes: u64,
    divergent: bool,
    first_component: u64,
    /// Set while a full clone is being filled: each look at the volume
    /// moves it half the volume on, so the CLI sees it progress and end.
    fill: Option<FillView>,
}

struct Records {
    policies: BTreeMap<String, Policy>,
    volumes: BTreeMap<String, VolumeRecord>,
    stopped: Vec<bool>,
    next_component: u64,
    resyncs: Vec<ResyncView>,
    iscsi_access: BTreeMap<String, IscsiAccess>,
    settings: ClusterSettings,
    /// Each host's own setting values.
    host_settings: BTreeMap<String, HostSettings>,
    /// Snapshots by (volume, name), in the order taken.
    snapshots: Vec<SnapshotView>,
    /// API tokens, as the directory keeps them.
    tokens: Vec<ApiTokenRecord>,
    /// Tokens made so far (each one's random bytes come from it).
    tokens_made: u64,
    /// The time the tokens see (ms).
    now_ms: u64,
    /// The audit log, oldest first.
    audit: Vec<AuditRecord>,
}

/// The in-memory control plane.
pub struct MemoryControl {
    records: Mutex<Records>,
    /// The admin token it starts with, as `tessera up` writes one.
    admin: String,
}

/// A token's 40 random bytes, made from how many came before it (ids
/// never repeat).
fn token_bytes(made: u64) -> [u8; 40] {
    let mut random = [0x5a; 40];
    random[..8].copy_from_slice(&made.to_be_bytes());
    random[8..16].copy_from_slice(&made.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes());
    random
}

fn host_name(i: usize) -> String {
    format!("host-{}", i + 1)
}

impl MemoryControl {
    /// Four hosts and the policy `default` (FTT=1), as `tessera up` starts.
    pub fn new() -> MemoryControl {
        let mut policies = BTreeMap::new();
        let default = Policy::new(PolicyName::new("default").expect("valid name"), 1);
        policies.insert("default".to_string(), default);
        let admin = api_access::issue(
            "admin",
            ApiRole::Admin,
            token_bytes(0),
            1_000_000,
            None,
            None,
        );
        MemoryControl {
            admin: admin.token,
            records: Mutex::new(Records {
                policies,
                volumes: BTreeMap::new(),
                stopped: vec![false; HOSTS],
                next_component: 1,
                resyncs: Vec::new(),
                iscsi_access: BTreeMap::new(),
                settings: ClusterSettings::default(),
                host_settings: BTreeMap::new(),
                snapshots: Vec::new(),
                tokens: vec![admin.record],
                tokens_made: 1,
                now_ms: 1_000_000,
                audit: Vec::new(),
            }),
        }
    }

    /// The admin token it starts with.
    pub fn admin_token(&self) -> &str {
        &self.admin
    }

    /// A token with `role` (expiring `expires_in_ms` from now, if given),
    /// as `tessera token create` makes one.
    pub fn token(&self, role: ApiRole, expires_in_ms: Option<u64>) -> String {
        let mut r = self.records.lock().expect("records lock");
        let random = token_bytes(r.tokens_made);
        r.tokens_made += 1;
        let expires = expires_in_ms.map(|ms| r.now_ms + ms);
        let issued = api_access::issue(role.as_str(), role, random, r.now_ms, expires, None);
        r.tokens.push(issued.record);
        issued.token
    }

    /// Moves the tokens' clock on.
    pub fn advance_ms(&self, ms: u64) {
        self.records.lock().expect("records lock").now_ms += ms;
    }

    /// Marks the copies of `volume` as holding different bytes.
    pub fn make_divergent(&self, volume: &str) {
        let mut r = self.records.lock().expect("records lock");
        if let Some(v) = r.volumes.get_mut(volume) {
            v.divergent = true;
        }
    }

    /// Records that `volume` had `used_bytes` written.
    pub fn set_used(&self, volume: &str, used_bytes: u64) {
        let mut r = self.records.lock().expect("records lock");
        if let Some(v) = r.volumes.get_mut(volume) {
            v.used_bytes = used_bytes;
        }
    }

    /// Adds a resync to the list `resyncs` answers.
    pub fn add_resync(&self, resync: ResyncView) {
        self.records
            .lock()
            .expect("records lock")
            .resyncs
            .push(resync);
    }

    /// Replaces the list `resyncs` answers.
    pub fn set_resyncs(&self, resyncs: Vec<ResyncView>) {
        self.records.lock().expect("records lock").resyncs = resyncs;
    }

    fn host_index(&self, host: &str) -> Result<usize, ControlError> {
        (0..HOSTS)
            .find(|&i| host_name(i) == host)
            .ok_or_else(|| ControlError::NotFound(format!("no host named {host:?}")))
    }
}

impl Default for MemoryControl {
    fn default() -> Self {
        MemoryControl::new()
    }
}

fn reserved(r: &Records) -> u64 {
    r.volumes
        .values()
        .map(|v| {
            let p = &r.policies[&v.policy];
            v.size_bytes / 100 * u64::from(p.space_reservation_pct) * p.copies() as u64
        })
        .sum()
}

fn volume_view(name: &str, v: &VolumeRecord, stopped: &[bool]) -> VolumeView {
    let degraded = stopped.iter().take(2).any(|&s| s);
    VolumeView {
        name: name.to_string(),
        size_bytes: v.size_bytes,
        policy: v.policy.clone(),
        block_bytes: v.block_bytes,
        state: if degraded {
            Health::Degraded
        } else {
            Health::Healthy
        },
        used_bytes: v.used_bytes,
        owner: Some(host_name(if stopped[0] { 1 } else { 0 })),
        epoch: Some(Epoch(if stopped[0] { 2 } else { 1 })),
        open_by: 0,
        qos: Default::default(),
        warnings: Vec::new(),
        fill: v.fill.clone(),
    }
}

fn host_views(r: &Records) -> Vec<HostView> {
    (0..HOSTS)
        .map(|i| HostView {
            id: host_name(i),
            fault_domain: format!("fd-{}", i + 1),
            state: if r.stopped[i] { "stopped" } else { "present" }.to_string(),
            transport_addr: format!("127.0.0.{}:9500", i + 1),
            nbd_addr: format!("127.0.0.{}:10809", i + 1),
            iscsi_addr: format!("127.0.0.{}:3260", i + 1),
            disk_groups: vec![DiskGroupView {
                id: "dg-1".to_string(),
                health: "healthy".to_string(),
                capacity: CapacityView {
                    total_bytes: HOST_CAPACITY_BYTES,
                    used_bytes: 0,
                    reserved_bytes: 0,
                    free_bytes: HOST_CAPACITY_BYTES,
                    ..CapacityView::default()
                },
                components: 0,
                physical_bytes: Some(0),
                index_cache: None,
                encryption: None,
            }],
            owned_volumes: if i == usize::from(r.stopped[0]) {
                r.volumes.keys().cloned().collect()
            } else {
                Vec::new()
            },
            capacity: CapacityView {
                total_bytes: HOST_CAPACITY_BYTES,
                free_bytes: HOST_CAPACITY_BYTES,
                ..CapacityView::default()
            },
            reclaim_components: 0,
            reclaim_bytes: 0,
            read_cache: (!r.stopped[i]).then_some(ReadCacheView {
                budget_bytes: 64 << 20,
                cached_bytes: 4 << 20,
                memory_bytes: 1024 * 4416,
                hits: 300,
                misses: 100,
                hit_rate: Some(0.75),
                host_memory_bytes: 16 << 30,
            }),
            lease_ttl_ms: (!r.stopped[i]).then_some(r.settings.lease_ttl_ms.unwrap_or(4_000)),
            own_settings: r
                .host_settings
                .get(&host_name(i))
                .cloned()
                .unwrap_or_default(),
        })
        .collect()
}

#[async_trait]
impl ClusterControl for MemoryControl {
    async fn status(&self) -> Result<StatusView, ControlError> {
        let r = self.records.lock().expect("records lock");
        let total = HOST_CAPACITY_BYTES * HOSTS as u64;
        let used: u64 = r.volumes.values().map(|v| v.used_bytes * 2).sum();
        let reserved = reserved(&r);
        let volumes: Vec<VolumeView> = r
            .volumes
            .iter()
            .map(|(n, v)| volume_view(n, v, &r.stopped))
            .collect();
        let health = if r.stopped.iter().any(|&s| s) {
            Health::Degraded
        } else {
            Health::Healthy
        };
        Ok(StatusView {
            cluster: "tessera".to_string(),
            health,
            capacity: CapacityView {
                total_bytes: total,
                used_bytes: used,
                reserved_bytes: reserved,
                free_bytes: total.saturating_sub(used + reserved),
                ..CapacityView::default()
            },
            hosts: host_views(&r),
            volumes,
            resyncs: r.resyncs.clone(),
            checks: Vec::new(),
        })
    }

    async fn hosts(&self) -> Result<Vec<HostView>, ControlError> {
        Ok(host_views(&self.records.lock().expect("records lock")))
    }

    async fn create_policy(&self, request: CreatePolicy) -> Result<Policy, ControlError> {
        let name = PolicyName::new(request.name.clone())
            .map_err(|e| ControlError::Invalid(e.to_string()))?;
        let policy = Policy {
            failures_to_tolerate: request.failures_to_tolerate,
            stripe_width: request.stripe_width,
            space_reservation_pct: request.space_reservation_pct,
            ..Policy::new(name, request.failures_to_tolerate)
        };
        policy
            .validate()
            .map_err(|e| ControlError::Invalid(e.to_string()))?;
        let needed = 2 * usize::from(policy.failures_to_tolerate) + 1;
        if needed > HOSTS {
            return Err(ControlError::Unsatisfiable(format!(
                "policy {}: FTT={} with RAID-1 needs {needed} fault domains, cluster has {HOSTS}",
                request.name, policy.failures_to_tolerate
            )));
        }
        let mut r = self.records.lock().expect("records lock");
        if r.policies.contains_key(&request.name) {
            return Err(ControlError::Conflict(format!(
                "policy {} already exists",
                request.name
            )));
        }
        r.policies.insert(request.name, policy.clone());
        Ok(policy)
    }

    async fn policies(&self) -> Result<Vec<Policy>, ControlError> {
        let r = self.records.lock().expect("records lock");
        Ok(r.policies.values().cloned().collect())
    }

    async fn update_policy(
        &self,
        name: &str,
        change: UpdatePolicy,
    ) -> Result<Policy, ControlError> {
        let mut r = self.records.lock().expect("records lock");
        let in_use = r.volumes.values().any(|v| v.policy == name);
        let current = r
            .policies
            .get(name)
            .cloned()
            .ok_or_else(|| ControlError::NotFound(format!("no policy named {name}")))?;
        let next = change.apply(&current)?;
        let only_qos = Policy {
            qos: current.qos,
            ..next.clone()
        } == current;
        if in_use && !only_qos {
            return Err(ControlError::Conflict(format!(
                "policy {name} is used by volumes"
            )));
        }
        r.policies.insert(name.to_string(), next.clone());
        Ok(next)
    }

    async fn delete_policy(&self, name: &str) -> Result<(), ControlError> {
        let mut r = self.records.lock().expect("records lock");
        if r.volumes.values().any(|v| v.policy == name) {
            return Err(ControlError::Conflict(format!(
                "policy {name} is used by volumes"
            )));
        }
        r.policies
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| ControlError::NotFound(format!("no policy named {name}")))
    }

    async fn settings(&self) -> Result<ClusterSettings, ControlError> {
        Ok(self.records.lock().expect("records lock").settings.clone())
    }

    async fn update_settings(
        &self,
        change: UpdateSettings,
    ) -> Result<ClusterSettings, ControlError> {
        let mut r = self.records.lock().expect("records lock");
        r.settings = change.apply(&r.settings, 16 << 30)?;
        Ok(r.settings.clone())
    }

    async fn host_settings(&self, id: &str) -> Result<HostSettingsView, ControlError> {
        let host = self.host(id).await?;
        let r = self.records.lock().expect("records lock");
        let own = r.host_settings.get(&host.id).cloned().unwrap_or_default();
        Ok(HostSettingsView {
            settings: r.settings.for_host(&own),
            host: host.id,
            own,
        })
    }

    async fn update_host_settings(
        &self,
        id: &str,
        change: UpdateHostSettings,
    ) -> Result<HostSettingsView, ControlError> {
        let host = self.host(id).await?;
        let mut r = self.records.lock().expect("records lock");
        let current = r.host_settings.get(&host.id).cloned().unwrap_or_default();
        let own = change.apply(&r.settings, &current, 16 << 30)?;
        r.host_settings.insert(host.id.clone(), own.clone());
        Ok(HostSettingsView {
            settings: r.settings.for_host(&own),
            host: host.id,
            own,
        })
    }

    async fn create_volume(&self, request: CreateVolume) -> Result<VolumeView, ControlError> {
        VolumeId::new(request.name.clone()).map_err(|e| ControlError::Invalid(e.to_string()))?;
        if request.size_bytes == 0 || !request.size_bytes.is_multiple_of(BLOCK_BYTES) {
            return Err(ControlError::Invalid(format!(
                "volume {}: size {} is not a positive multiple of {BLOCK_BYTES} bytes",
                request.name, request.size_bytes
            )));
        }
        let mut r = self.records.lock().expect("records lock");
        let policy_name = request.policy.unwrap_or_else(|| "default".to_string());
        let Some(policy) = r.policies.get(&policy_name).cloned() else {
            return Err(ControlError::NotFound(format!(
                "volume {}: no policy named {policy_name:?}",
                request.name
            )));
        };
        if r.volumes.contains_key(&request.name) {
            return Err(ControlError::Conflict(format!(
                "volume {} already exists",
                request.name
            )));
        }
        let wanted = request.size_bytes / 100
            * u64::from(policy.space_reservation_pct)
            * policy.copies() as u64;
        let free = HOST_CAPACITY_BYTES * HOSTS as u64 - reserved(&r);
        if wanted > free {
            return Err(ControlError::Unsatisfiable(format!(
                "volume {}: reserving {wanted} bytes needs more than the {free} bytes free",
                request.name
            )));
        }
        let first_component = r.next_component;
        r.next_component += 3;
        let record = VolumeRecord {
            size_bytes: request.size_bytes,
            policy: policy_name,
            block_bytes: request.block_bytes.unwrap_or(512),
            used_bytes: 0,
            divergent: false,
            first_component,
            fill: None,
        };
        let view = volume_view(&request.name, &record, &r.stopped);
        r.volumes.insert(request.name, record);
        Ok(view)
    }

    async fn volume(&self, name: &str) -> Result<VolumeView, ControlError> {
        let mut r = self.records.lock().expect("records lock");
        let stopped = r.stopped.clone();
        let v = r
            .volumes
            .get_mut(name)
            .ok_or_else(|| ControlError::NotFound(format!("no volume named {name}")))?;
        let size = v.size_bytes;
        if let Some(f) = v.fill.as_mut() {
            f.done_bytes = (f.done_bytes + size / 2).min(size);
            f.left_bytes = size - f.done_bytes;
            f.copied_bytes = f.done_bytes;
            v.used_bytes = f.copied_bytes;
            f.rate_bytes_per_s = size / 2;
            f.eta_s = Some(1);
            f.runs = 1;
        }
        if v.fill.as_ref().is_some_and(|f| f.left_bytes == 0) {
            v.fill = None;
        }
        Ok(volume_view(name, v, &stopped))
    }

    async fn volumes(&self) -> Result<Vec<VolumeView>, ControlError> {
        let r = self.records.lock().expect("records lock");
        Ok(r.volumes
            .iter()
            .map(|(n, v)| volume_view(n, v, &r.stopped))
            .collect())
    }

    async fn resize_volume(
        &self,
        name: &str,
        request: ResizeVolume,
    ) -> Result<VolumeView, ControlError> {
        let mut r = self.records.lock().expect("records lock");
        let stopped = r.stopped.clone();
        let v = r
            .volumes
            .get_mut(name)
            .ok_or_else(|| ControlError::NotFound(format!("no volume named {name:?}")))?;
        if request.size_bytes < v.size_bytes || !request.size_bytes.is_multiple_of(BLOCK_BYTES) {
            return Err(ControlError::Invalid(format!(
                "volume {name}: new size {} must be a multiple of {BLOCK_BYTES} bytes and not below {}",
                request.size_bytes, v.size_bytes
            )));
        }
        v.size_bytes = request.size_bytes;
        Ok(volume_view(name, v, &stopped))
    }

    async fn rename_volume(
        &self,
        name: &str,
        request: RenameVolume,
    ) -> Result<VolumeView, ControlError> {
        VolumeId::new(request.new_name.clone())
            .map_err(|e| ControlError::Invalid(e.to_string()))?;
        let mut r = self.records.lock().expect("records lock");
        if r.volumes.contains_key(&request.new_name) {
            return Err(ControlError::Conflict(format!(
                "a volume named {} already exists",
                request.new_name
            )));
        }
        let v = r
            .volumes
            .remove(name)
            .ok_or_else(|| ControlError::NotFound(format!("no volume named {name}")))?;
        let view = volume_view(&request.new_name, &v, &r.stopped);
        r.volumes.insert(request.new_name, v);
        Ok(view)
    }

    async fn delete_volume(&self, name: &str, _force: bool) -> Result<(), ControlError> {
        let mut r = self.records.lock().expect("records lock");
        r.volumes
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| ControlError::NotFound(format!("no volume named {name:?}")))
    }

    async fn set_iscsi_access(
        &self,
        name: &str,
        access: IscsiAccess,
    ) -> Result<IscsiAccessView, ControlError> {
        access.check(name)?;
        let mut r = self.records.lock().expect("records lock");
        if !r.volumes.contains_key(name) {
            return Err(ControlError::NotFound(format!("no volume named {name:?}")));
        }
        r.iscsi_access.insert(name.to_string(), access);
        Ok(access_view(name, r.iscsi_access.get(name)))
    }

    async fn iscsi_access(&self, name: &str) -> Result<IscsiAccessView, ControlError> {
        let r = self.records.lock().expect("records lock");
        if !r.volumes.contains_key(name) {
            return Err(ControlError::NotFound(format!("no volume named {name:?}")));
        }
        Ok(access_view(name, r.iscsi_access.get(name)))
    }

    async fn create_snapshot(
        &self,
        volume: &str,
        request: CreateSnapshot,
    ) -> Result<SnapshotView, ControlError> {
        let mut r = self.records.lock().expect("records lock");
        let size_bytes = r
            .volumes
            .get(volume)
            .ok_or_else(|| ControlError::NotFound(format!("no volume named {volume:?}")))?
            .size_bytes;
        if r.snapshots
            .iter()
            .any(|s| s.volume == volume && s.name == request.name)
        {
            return Err(ControlError::Conflict(format!(
                "volume {volume} already has a snapshot named {}",
                request.name
            )));
        }
        let view = SnapshotView {
            volume: volume.to_string(),
            name: request.name.clone(),
            export: format!("{volume}@{}", request.name),
            iscsi_target: tessera_node::snapshot_export::iscsi_target_name(volume, &request.name),
            created_ms: r.snapshots.len() as u64,
            size_bytes,
            epoch: 1,
            components: Vec::new(),
            group: request.group.clone(),
            held_alone_bytes: None,
            held_shared_bytes: None,
        };
        r.snapshots.push(view.clone());
        Ok(view)
    }

    async fn snapshots(&self, volume: &str) -> Result<Vec<SnapshotView>, ControlError> {
        let r = self.records.lock().expect("records lock");
        if !r.volumes.contains_key(volume) {
            return Err(ControlError::NotFound(format!(
                "no volume named {volume:?}"
            )));
        }
        Ok(r.snapshots
            .iter()
            .filter(|s| s.volume == volume)
            .cloned()
            .collect())
    }

    async fn delete_snapshot(
        &self,
        volume: &str,
        name: &str,
    ) -> Result<tessera_node::control::SnapshotDeleted, ControlError> {
        let mut r = self.records.lock().expect("records lock");
        let before = r.snapshots.len();
        r.snapshots
            .retain(|s| !(s.volume == volume && s.name == name));
        if r.snapshots.len() == before {
            return Err(ControlError::NotFound(format!(
                "volume {volume} has no snapshot named {name}"
            )));
        }
        Ok(tessera_node::control::SnapshotDeleted {
            volume: volume.to_string(),
            name: name.to_string(),
            ..Default::default()
        })
    }

    async fn revert_volume(
        &self,
        volume: &str,
        request: RevertVolume,
    ) -> Result<VolumeView, ControlError> {
        {
            let r = self.records.lock().expect("records lock");
            if !r
                .snapshots
                .iter()
                .any(|s| s.volume == volume && s.name == request.to)
            {
                return Err(ControlError::NotFound(format!(
                    "volume {volume} has no snapshot named {}",
                    request.to
                )));
            }
        }
        self.volume(volume).await
    }

    async fn clone_volume(
        &self,
        volume: &str,
        snapshot: &str,
        request: CloneVolume,
    ) -> Result<VolumeView, ControlError> {
        let size_bytes = {
            let r = self.records.lock().expect("records lock");
            r.snapshots
                .iter()
                .find(|s| s.volume == volume && s.name == snapshot)
                .ok_or_else(|| {
                    ControlError::NotFound(format!(
                        "volume {volume} has no snapshot named {snapshot}"
                    ))
                })?
                .size_bytes
        };
        let name = request.name.clone();
        let mut view = self
            .create_volume(CreateVolume {
                name: request.name,
                size_bytes,
                policy: request.policy,
                block_bytes: None,
            })
            .await?;
        if request.full {
            let fill = FillView {
                from: format!("{volume}@{snapshot}"),
                done_bytes: 0,
                left_bytes: size_bytes,
                copied_bytes: 0,
                rate_bytes_per_s: 0,
                eta_s: None,
                started_ms: 0,
                runs: 0,
                resumed_from_bytes: 0,
                error: None,
            };
            let mut r = self.records.lock().expect("records lock");
            if let Some(v) = r.volumes.get_mut(&name) {
                v.fill = Some(fill.clone());
            }
            view.fill = Some(fill);
        }
        Ok(view)
    }

    async fn object(&self, name: &str) -> Result<ObjectView, ControlError> {
        let r = self.records.lock().expect("records lock");
        let v = r
            .volumes
            .get(name)
            .ok_or_else(|| ControlError::NotFound(format!("no volume named {name:?}")))?;
        let view = volume_view(name, v, &r.stopped);
        let component = |k: u64, role: ComponentRole, host: usize| ComponentView {
            id: ComponentId(v.first_component + k),
            role,
            column: (role == ComponentRole::Data).then_some(0),
            host: host_name(host),
            disk_group: "dg-1".to_string(),
            fault_domain: format!("fd-{}", host + 1),
            state: if r.stopped[host] {
                ComponentState::Absent
            } else {
                ComponentState::Active
            },
            votes: 1,
            allocated_bytes: if r.stopped[host] {
                None
            } else if role == ComponentRole::Data {
                Some(v.used_bytes)
            } else {
                Some(0)
            },
            dirty_bytes: 0,
        };
        Ok(ObjectView {
            volume: name.to_string(),
            size_bytes: v.size_bytes,
            policy: v.policy.clone(),
            state: view.state,
            owner: view.owner,
            epoch: view.epoch,
            generation: 1,
            offloads: Default::default(),
            read_cache: Default::default(),
            components: vec![
                component(0, ComponentRole::Data, 0),
                component(1, ComponentRole::Data, 1),
                component(2, ComponentRole::Witness, 2),
            ],
        })
    }

    async fn verify_object(&self, name: &str) -> Result<VerifyReport, ControlError> {
        let r = self.records.lock().expect("records lock");
        let v = r
            .volumes
            .get(name)
            .ok_or_else(|| ControlError::NotFound(format!("no volume named {name:?}")))?;
        let copies = vec![
            ComponentId(v.first_component),
            ComponentId(v.first_component + 1),
        ];
        Ok(VerifyReport {
            volume: name.to_string(),
            identical: !v.divergent,
            compared_bytes: v.size_bytes,
            skipped: Vec::new(),
            snapshots: Vec::new(),
            divergences: if v.divergent {
                vec![Divergence {
                    column: 0,
                    component_offset: 8192,
                    len: 4096,
                    components: copies,
                    snapshot: None,
                }]
            } else {
                Vec::new()
            },
        })
    }

    async fn events(&self, limit: usize) -> Result<Vec<EventView>, ControlError> {
        // No host acts here: the history is the changes asked of it.
        let changes = self.audit(usize::MAX).await?;
        Ok(tessera_node::events::history(Vec::new(), changes, limit))
    }

    async fn host_activity(&self) -> Result<Vec<HostActivity>, ControlError> {
        // No host runs here.
        Ok(Vec::new())
    }

    async fn activity(&self) -> Result<Vec<VolumeActivity>, ControlError> {
        // This control plane serves no I/O: nothing was done to any volume.
        Ok(Vec::new())
    }

    async fn activity_history(
        &self,
        after_ms: Option<u64>,
    ) -> Result<tessera_node::control::ActivityHistoryView, ControlError> {
        Ok(tessera_node::activity_history::ActivityHistory::default().view(after_ms))
    }

    async fn resyncs(&self) -> Result<Vec<ResyncView>, ControlError> {
        Ok(self.records.lock().expect("records lock").resyncs.clone())
    }

    async fn scrubs(&self) -> Result<Vec<ScrubView>, ControlError> {
        let r = self.records.lock().expect("records lock");
        Ok((0..HOSTS)
            .filter(|&i| !r.stopped[i])
            .map(|i| ScrubView {
                host: format!("host-{}", i + 1),
                disk_group: "dg0".into(),
                state: "idle".into(),
                next_pass_in_s: Some(600),
                ..ScrubView::default()
            })
            .collect())
    }

    async fn encryption(&self) -> Result<Vec<EncryptionView>, ControlError> {
        Ok((0..HOSTS)
            .map(|i| EncryptionView {
                host: format!("host-{}", i + 1),
                disk_group: "dg-1".into(),
                encryption: None,
            })
            .collect())
    }

    async fn rekey(
        &self,
        host: &str,
        _request: RekeyRequest,
    ) -> Result<Vec<EncryptionView>, ControlError> {
        self.host_index(host)?;
        Err(ControlError::Invalid(format!(
            "host {host} has no key encryption key ([encryption] kek_file); its disk groups are not encrypted"
        )))
    }

    async fn scrub_now(&self, host: &str) -> Result<Vec<ScrubView>, ControlError> {
        let i = self.host_index(host)?;
        if self.records.lock().expect("records lock").stopped[i] {
            return Err(ControlError::Conflict(format!("host {host} is stopped")));
        }
        Ok(vec![ScrubView {
            host: host.into(),
            disk_group: "dg0".into(),
            state: "running".into(),
            ..ScrubView::default()
        }])
    }

    async fn stop_host(&self, host: &str) -> Result<(), ControlError> {
        let i = self.host_index(host)?;
        let mut r = self.records.lock().expect("records lock");
        if r.stopped[i] {
            return Err(ControlError::Conflict(format!(
                "host {host} is already stopped"
            )));
        }
        r.stopped[i] = true;
        Ok(())
    }

    async fn start_host(&self, host: &str) -> Result<(), ControlError> {
        let i = self.host_index(host)?;
        let mut r = self.records.lock().expect("records lock");
        if !r.stopped[i] {
            return Err(ControlError::Conflict(format!(
                "host {host} is not stopped"
            )));
        }
        r.stopped[i] = false;
        Ok(())
    }

    async fn authenticate(&self, token: &str) -> Result<ApiIdentity, ControlError> {
        let r = self.records.lock().expect("records lock");
        let refused =
            |why: api_access::Refusal| ControlError::Unauthenticated(why.message().into());
        let (id, secret) = api_access::parse(token).ok_or(refused(if token.is_empty() {
            api_access::Refusal::Missing
        } else {
            api_access::Refusal::Unknown
        }))?;
        let record = r
            .tokens
            .iter()
            .find(|t| t.id == id)
            .ok_or(refused(api_access::Refusal::Unknown))?;
        let role = api_access::check(record, secret, r.now_ms).map_err(refused)?;
        Ok(ApiIdentity {
            token_id: record.id.clone(),
            name: record.name.clone(),
            role,
        })
    }

    async fn create_token(
        &self,
        by: Option<&ApiIdentity>,
        request: CreateToken,
    ) -> Result<CreatedToken, ControlError> {
        if request.name.is_empty() {
            return Err(ControlError::Invalid("a token needs a name".into()));
        }
        let mut r = self.records.lock().expect("records lock");
        let random = token_bytes(r.tokens_made);
        r.tokens_made += 1;
        let expires = request.expires_in_s.map(|s| r.now_ms + s * 1000);
        let issued = api_access::issue(
            &request.name,
            request.role,
            random,
            r.now_ms,
            expires,
            by.map(|i| i.token_id.clone()),
        );
        r.tokens.push(issued.record.clone());
        Ok(CreatedToken {
            token: issued.token,
            view: TokenView::of(&issued.record),
        })
    }

    async fn tokens(&self) -> Result<Vec<TokenView>, ControlError> {
        let r = self.records.lock().expect("records lock");
        Ok(r.tokens.iter().map(TokenView::of).collect())
    }

    async fn record_change(&self, change: ApiChange) -> Result<(), ControlError> {
        let mut r = self.records.lock().expect("records lock");
        let at_ms = r.now_ms;
        r.audit.push(change.into_record(at_ms));
        Ok(())
    }

    async fn audit(&self, limit: usize) -> Result<Vec<AuditRecord>, ControlError> {
        let r = self.records.lock().expect("records lock");
        Ok(r.audit[r.audit.len().saturating_sub(limit)..].to_vec())
    }

    async fn revoke_token(&self, id: &str) -> Result<(), ControlError> {
        let mut r = self.records.lock().expect("records lock");
        let before = r.tokens.len();
        r.tokens.retain(|t| t.id != id);
        if r.tokens.len() == before {
            return Err(ControlError::NotFound(format!("no API token with id {id}")));
        }
        Ok(())
    }
}

fn access_view(name: &str, access: Option<&IscsiAccess>) -> IscsiAccessView {
    IscsiAccessView {
        volume: name.to_string(),
        target: format!("iqn.2026-11.io.tessera:{name}"),
        allowed_initiators: access
            .map(|a| a.allowed_initiators.clone())
            .unwrap_or_default(),
        chap_user: access.and_then(|a| a.initiator_chap.as_ref().map(|c| c.user.clone())),
        target_chap_user: access.and_then(|a| a.target_chap.as_ref().map(|c| c.user.clone())),
        nbd_clients: access.map(|a| a.nbd_clients.clone()).unwrap_or_default(),
        plain_nbd: access.and_then(|a| a.plain_nbd).unwrap_or_default(),
    }
}
