//! The control plane's vocabulary: what the REST API serves and the CLI
//! prints.
//!
//! Owns: the [`ClusterControl`] trait (every management operation a user can
//! ask for) and the JSON views it returns. The REST API is a thin mapping of
//! this trait to HTTP; the node implements it over the directory and the
//! hosts. Must not touch: HTTP details (they live in `api`).
//! Invariant: a refused operation changes nothing, and its [`ControlError`]
//! says why in words a user can act on.

pub use crate::activity_history::ActivityHistoryView;
pub use crate::host::ScrubView;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
pub use tessera_directory::keys::{ApiRole, ApiTokenRecord, AuditRecord, PlainNbd};
pub use tessera_directory::keys::{ClusterSettings, HostSettings, HOST_SETTING_NAMES};
/// What [`VolumeActivity::io`] holds, and the counters it is read from.
pub use tessera_object::{IoKind, IoKindSnapshot, VolumeIoStats};
use tessera_types::layout::{ComponentRole, ComponentState};
use tessera_types::policy::{Policy, VolumeQos};
use tessera_types::{format_size, ComponentId, Epoch};

/// Overall health of a cluster or volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Health {
    /// Everything protected as the policies ask.
    Healthy,
    /// Serving I/O, but with less protection than asked (a copy absent or resyncing).
    Degraded,
    /// Not serving I/O (no quorum or no owner).
    Unavailable,
}

/// Capacity of the datastore, of one host or of one disk group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CapacityView {
    /// Bytes the devices can hold.
    pub total_bytes: u64,
    /// Bytes used by data and metadata.
    pub used_bytes: u64,
    /// Bytes reserved for thick volumes but not yet written.
    pub reserved_bytes: u64,
    /// Bytes a new write can still use.
    pub free_bytes: u64,
    /// Bytes promised to volumes: every data copy at its full size (thin
    /// volumes included), whatever has been written.
    #[serde(default)]
    pub provisioned_bytes: u64,
    /// `provisioned_bytes / total_bytes`: above 1.0 the volumes could
    /// together outgrow the devices (thin provisioning's overcommit).
    #[serde(default)]
    pub overcommit_ratio: f64,
}

impl CapacityView {
    /// Adds `other` to this sum and recomputes the ratio.
    pub fn add(&mut self, other: &CapacityView) {
        self.total_bytes += other.total_bytes;
        self.used_bytes += other.used_bytes;
        self.reserved_bytes += other.reserved_bytes;
        self.free_bytes += other.free_bytes;
        self.provisioned_bytes += other.provisioned_bytes;
        self.overcommit_ratio = overcommit_ratio(self.provisioned_bytes, self.total_bytes);
    }

    /// Percent of the capacity in use (data and reservations), 0-100.
    pub fn used_pct(&self) -> f64 {
        if self.total_bytes == 0 {
            return 0.0;
        }
        100.0 * (self.total_bytes - self.free_bytes.min(self.total_bytes)) as f64
            / self.total_bytes as f64
    }
}

/// Provisioned bytes over capacity, rounded to two decimals (0 with no
/// capacity).
pub fn overcommit_ratio(provisioned_bytes: u64, total_bytes: u64) -> f64 {
    if total_bytes == 0 {
        return 0.0;
    }
    (provisioned_bytes as f64 / total_bytes as f64 * 100.0).round() / 100.0
}

/// Component ids travel as the hex text the tables print (`c0123...`), not
/// as integers, so JSON and tables name a component the same way.
pub mod component_id_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use tessera_types::ComponentId;

    /// Writes `c` followed by 16 hex digits.
    pub fn serialize<S: Serializer>(id: &ComponentId, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(id)
    }

    /// Reads the form [`serialize`] writes (an integer is accepted too).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ComponentId, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Text(String),
            Number(u64),
        }
        match Form::deserialize(d)? {
            Form::Number(n) => Ok(ComponentId(n)),
            Form::Text(t) => {
                let digits = t.strip_prefix('c').unwrap_or(&t);
                u64::from_str_radix(digits, 16)
                    .map(ComponentId)
                    .map_err(|_| serde::de::Error::custom(format!("{t:?} is not a component id")))
            }
        }
    }

    /// The same for a list of ids.
    pub mod list {
        use serde::ser::SerializeSeq;
        use serde::{Deserialize, Deserializer, Serializer};
        use tessera_types::ComponentId;

        /// Writes each id as text.
        pub fn serialize<S: Serializer>(ids: &[ComponentId], s: S) -> Result<S::Ok, S::Error> {
            let mut seq = s.serialize_seq(Some(ids.len()))?;
            for id in ids {
                seq.serialize_element(&id.to_string())?;
            }
            seq.end()
        }

        /// Reads ids written by [`serialize`].
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ComponentId>, D::Error> {
            #[derive(Deserialize)]
            struct One(#[serde(with = "super")] ComponentId);
            Ok(Vec::<One>::deserialize(d)?
                .into_iter()
                .map(|o| o.0)
                .collect())
        }
    }
}

/// One disk group as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DiskGroupView {
    /// Its id.
    pub id: String,
    /// "healthy", "degraded", "failed: <reason>", "evacuating" (being
    /// emptied, components left on it) or "evacuated" (empty, taking no
    /// new components).
    pub health: String,
    /// Its space.
    pub capacity: CapacityView,
    /// Components placed on it (data copies and witnesses), from the
    /// volumes' layouts.
    pub components: u64,
    /// Bytes its capacity devices hold: a block shared by several copies
    /// (EXTENDED COPY inside the datastore) counts once, where `used_bytes`
    /// counts it per copy (each may be overwritten and then needs a block
    /// of its own). Known for the hosts this control plane runs.
    #[serde(default)]
    pub physical_bytes: Option<u64>,
    /// Its index cache (the metadata cache: index pages). Known for the
    /// hosts this control plane runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_cache: Option<IndexCacheView>,
    /// Its encryption at rest; absent for a plaintext disk group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<tessera_directory::keys::DiskGroupEncryption>,
}

/// What `POST /v1/hosts/{id}/rekey` asks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RekeyRequest {
    /// Also rewrite every block under a new data key (in the background);
    /// without it only the data keys are sealed again with the host's
    /// current key encryption key.
    #[serde(default)]
    pub deep: bool,
    /// Only this disk group (default: every encrypted one of the host).
    #[serde(default)]
    pub disk_group: Option<String>,
}

/// One disk group's encryption at rest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EncryptionView {
    /// Its host.
    pub host: String,
    /// The disk group.
    pub disk_group: String,
    /// Its encryption; absent for a plaintext disk group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<tessera_directory::keys::DiskGroupEncryption>,
}

/// A disk group's index cache: its budget, what it holds and its counters
/// since the disk group was opened.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct IndexCacheView {
    /// Memory it may use.
    pub budget_bytes: u64,
    /// Memory its pages use now.
    pub resident_bytes: u64,
    /// Index pages cached now.
    pub resident_pages: u64,
    /// Blocks of snapshots' root tables cached now (each counts as a page
    /// in the budget): where the snapshots' index pages are.
    #[serde(default)]
    pub resident_root_blocks: u64,
    /// Pages changed since the last checkpoint.
    pub dirty_pages: u64,
    /// Pages found in memory.
    pub hits: u64,
    /// Pages waited for while read from disk.
    pub misses: u64,
    /// Pages read ahead of a miss.
    pub prefetched: u64,
    /// Pages dropped to stay within the budget.
    pub evicted: u64,
    /// Pages read ahead after a miss.
    pub prefetch_pages: u64,
}

/// A request to evacuate a host: every disk group, or the one named.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Evacuate {
    /// Only this disk group.
    #[serde(default)]
    pub disk_group: Option<String>,
}

/// A host's evacuation and what is left of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EvacuationView {
    /// The host.
    pub host: String,
    /// Its disk groups being emptied.
    pub disk_groups: Vec<String>,
    /// Components still on them (data copies and witnesses).
    pub components_left: u64,
    /// Bytes of data copies still on them (their volumes' sizes).
    pub bytes_left: u64,
}

/// One host as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HostView {
    /// Host id.
    pub id: String,
    /// Fault domain.
    pub fault_domain: String,
    /// "present" (lease alive), "absent" (lease lapsed) or "stopped" (by `host stop`).
    pub state: String,
    /// Host-to-host transport address.
    pub transport_addr: String,
    /// NBD address clients connect to.
    pub nbd_addr: String,
    /// iSCSI portal initiators log in to.
    #[serde(default)]
    pub iscsi_addr: String,
    /// Its disk groups.
    pub disk_groups: Vec<DiskGroupView>,
    /// Volumes this host owns (coordinates).
    pub owned_volumes: Vec<String>,
    /// The sum of its disk groups' space.
    #[serde(default)]
    pub capacity: CapacityView,
    /// Its read cache. Known for the hosts this control plane runs.
    #[serde(default)]
    pub read_cache: Option<ReadCacheView>,
    /// The time to live of its liveness lease now (ms): how long it keeps
    /// its volumes once it stops answering (the setting `lease_ttl_ms`).
    /// Known for the hosts this control plane runs while they are up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ttl_ms: Option<u64>,
    /// Its own values of settings (`tessera settings set --host`); those
    /// it has none of follow the cluster's.
    #[serde(default, skip_serializing_if = "HostSettings::is_empty")]
    pub own_settings: HostSettings,
    /// Components no record names any more that wait for this host to
    /// delete them (it does once it is up: its reclaim records).
    #[serde(default)]
    pub reclaim_components: u64,
    /// Their address space together (what they held at most).
    #[serde(default)]
    pub reclaim_bytes: u64,
}

/// A host's read cache: the blocks of the volumes it owns, in its memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReadCacheView {
    /// Bytes of memory it may take (0: disabled), from the setting
    /// `read_cache_bytes` and the host's memory.
    pub budget_bytes: u64,
    /// Bytes of blocks it holds now.
    pub cached_bytes: u64,
    /// Memory those take, per-block overhead included (at most the budget).
    pub memory_bytes: u64,
    /// Blocks (4 KiB) of reads it served since the host started.
    pub hits: u64,
    /// Blocks of reads it did not hold, read from a copy.
    pub misses: u64,
    /// Hits over hits and misses; None before the first read.
    pub hit_rate: Option<f64>,
    /// The host's memory.
    pub host_memory_bytes: u64,
}

impl ReadCacheView {
    /// The view of `stats` on a host with `host_memory_bytes` of memory.
    pub fn new(stats: &tessera_object::ReadCacheStats, host_memory_bytes: u64) -> ReadCacheView {
        ReadCacheView {
            budget_bytes: stats.budget_bytes,
            cached_bytes: stats.bytes_cached,
            memory_bytes: stats.memory_bytes,
            hits: stats.hits,
            misses: stats.misses,
            hit_rate: stats.hit_rate(),
            host_memory_bytes,
        }
    }
}

/// One volume's reads in its owner's read cache (counted on the hosts this
/// control plane runs, since the owner took the volume over).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct VolumeReadCacheView {
    /// Blocks (4 KiB) of reads served from the cache.
    pub hits: u64,
    /// Blocks of reads read from a copy.
    pub misses: u64,
}

/// A request to create a policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePolicy {
    /// Policy name.
    pub name: String,
    /// Failures to tolerate (0-3).
    pub failures_to_tolerate: u8,
    /// Stripe width (1-12).
    #[serde(default = "one")]
    pub stripe_width: u8,
    /// Object space reservation in percent (0-100).
    #[serde(default)]
    pub space_reservation_pct: u8,
    /// The I/O limits and minimum of each volume (none by default).
    #[serde(default)]
    pub qos: VolumeQos,
}

fn one() -> u8 {
    1
}

/// A request to create a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// Volume name (also its NBD export name).
    pub name: String,
    /// Size in bytes (a multiple of 4096).
    pub size_bytes: u64,
    /// Policy name; `default` when absent.
    #[serde(default)]
    pub policy: Option<String>,
    /// Logical block size the frontends present: 512 ("512e", the default)
    /// or 4096 ("4Kn").
    #[serde(default)]
    pub block_bytes: Option<u32>,
}

/// A request to resize a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResizeVolume {
    /// New size in bytes (growing only).
    pub size_bytes: u64,
}

/// A request to rename a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RenameVolume {
    /// The new name (also its NBD export name and iSCSI target).
    pub new_name: String,
}

/// A change to a policy: the fields given replace the current ones.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdatePolicy {
    /// Failures to tolerate (0-3).
    #[serde(default)]
    pub failures_to_tolerate: Option<u8>,
    /// Stripe width (1-12).
    #[serde(default)]
    pub stripe_width: Option<u8>,
    /// Object space reservation in percent (0-100).
    #[serde(default)]
    pub space_reservation_pct: Option<u8>,
    /// Changes to the I/O limits and minimum; they apply to the policy's
    /// volumes at once, without moving data.
    #[serde(default)]
    pub qos: Option<QosChange>,
}

/// A change to a policy's QoS: the fields given replace the current ones
/// (0 removes a limit or the minimum).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct QosChange {
    /// Operations per second each volume may not exceed.
    #[serde(default)]
    pub iops_limit: Option<u32>,
    /// MiB per second each volume may not exceed.
    #[serde(default)]
    pub bandwidth_limit_mib_s: Option<u32>,
    /// Operations per second each volume keeps however busy its owner is.
    #[serde(default)]
    pub iops_minimum: Option<u32>,
}

/// The cluster settings as the API takes a change to them: the fields
/// given replace the current ones.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSettings {
    /// See [`tessera_directory::keys::ClusterSettings::max_overcommit_ratio`].
    #[serde(default)]
    pub max_overcommit_ratio: Option<f64>,
    /// See [`tessera_directory::keys::ClusterSettings::nearly_full_pct`].
    #[serde(default)]
    pub nearly_full_pct: Option<u8>,
    /// See [`tessera_directory::keys::ClusterSettings::full_pct`].
    #[serde(default)]
    pub full_pct: Option<u8>,
    /// See [`tessera_directory::keys::ClusterSettings::read_cache_bytes`]:
    /// a number of bytes, or `null` for the default.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub read_cache_bytes: Option<Option<u64>>,
    /// See [`tessera_directory::keys::ClusterSettings::scrub_period_h`].
    #[serde(default)]
    pub scrub_period_h: Option<u32>,
    /// See [`tessera_directory::keys::ClusterSettings::resync_delay_multiplier`].
    #[serde(default)]
    pub resync_delay_multiplier: Option<u32>,
    /// See [`tessera_directory::keys::ClusterSettings::index_cache_bytes`]:
    /// a number of bytes, or `null` for each host's configured budget.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub index_cache_bytes: Option<Option<u64>>,
    /// See [`tessera_directory::keys::ClusterSettings::index_prefetch_bytes`].
    #[serde(default)]
    pub index_prefetch_bytes: Option<u64>,
    /// See [`tessera_directory::keys::ClusterSettings::repair_delay_s`]:
    /// seconds, or `null` for each host's configured delay.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub repair_delay_s: Option<Option<u64>>,
    /// See [`tessera_directory::keys::ClusterSettings::lease_ttl_ms`]:
    /// milliseconds, or `null` for each host's configured lease.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub lease_ttl_ms: Option<Option<u64>>,
    /// See [`tessera_directory::keys::ClusterSettings::vaai_ats`].
    #[serde(default)]
    pub vaai_ats: Option<bool>,
    /// See [`tessera_directory::keys::ClusterSettings::vaai_xcopy`].
    #[serde(default)]
    pub vaai_xcopy: Option<bool>,
    /// See [`tessera_directory::keys::ClusterSettings::vaai_write_same`].
    #[serde(default)]
    pub vaai_write_same: Option<bool>,
    /// See [`tessera_directory::keys::ClusterSettings::vaai_unmap`].
    #[serde(default)]
    pub vaai_unmap: Option<bool>,
}

/// A change to one host's own setting values: a value sets the setting for
/// that host alone, `null` makes the host follow the cluster's value again;
/// settings not named keep what they are. Only the settings of
/// [`HostSettings`] may differ per host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateHostSettings {
    /// See [`HostSettings::read_cache_bytes`].
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub read_cache_bytes: Option<Option<u64>>,
    /// See [`HostSettings::index_cache_bytes`].
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub index_cache_bytes: Option<Option<u64>>,
    /// See [`HostSettings::index_prefetch_bytes`].
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub index_prefetch_bytes: Option<Option<u64>>,
    /// See [`HostSettings::scrub_period_h`].
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub scrub_period_h: Option<Option<u32>>,
    /// See [`HostSettings::resync_delay_multiplier`].
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub resync_delay_multiplier: Option<Option<u32>>,
    /// See [`HostSettings::vaai_ats`].
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub vaai_ats: Option<Option<bool>>,
    /// See [`HostSettings::vaai_xcopy`].
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub vaai_xcopy: Option<Option<bool>>,
    /// See [`HostSettings::vaai_write_same`].
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub vaai_write_same: Option<Option<bool>>,
    /// See [`HostSettings::vaai_unmap`].
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub vaai_unmap: Option<Option<bool>>,
}

/// The settings one host follows and which of them are its own.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HostSettingsView {
    /// The host.
    pub host: String,
    /// What the host follows: its own values over the cluster's.
    pub settings: ClusterSettings,
    /// Its own values (the settings it does not follow the cluster in).
    pub own: HostSettings,
}

impl UpdateHostSettings {
    /// `current` (a host's own values) with this change applied, or why it
    /// is refused: each value must be one the cluster setting of that name
    /// could take (checked against `cluster` on a host of `memory_bytes`).
    pub fn apply(
        &self,
        cluster: &ClusterSettings,
        current: &HostSettings,
        memory_bytes: u64,
    ) -> Result<HostSettings, ControlError> {
        let values = UpdateSettings {
            read_cache_bytes: self.read_cache_bytes.flatten().map(Some),
            index_cache_bytes: self.index_cache_bytes.flatten().map(Some),
            index_prefetch_bytes: self.index_prefetch_bytes.flatten(),
            scrub_period_h: self.scrub_period_h.flatten(),
            resync_delay_multiplier: self.resync_delay_multiplier.flatten(),
            vaai_ats: self.vaai_ats.flatten(),
            vaai_xcopy: self.vaai_xcopy.flatten(),
            vaai_write_same: self.vaai_write_same.flatten(),
            vaai_unmap: self.vaai_unmap.flatten(),
            ..UpdateSettings::default()
        };
        values.apply(cluster, memory_bytes)?;
        fn change<T: Copy>(to: Option<Option<T>>, own: &mut Option<T>) {
            if let Some(value) = to {
                *own = value;
            }
        }
        let mut next = current.clone();
        change(self.read_cache_bytes, &mut next.read_cache_bytes);
        change(self.index_cache_bytes, &mut next.index_cache_bytes);
        change(self.index_prefetch_bytes, &mut next.index_prefetch_bytes);
        change(self.scrub_period_h, &mut next.scrub_period_h);
        change(
            self.resync_delay_multiplier,
            &mut next.resync_delay_multiplier,
        );
        change(self.vaai_ats, &mut next.vaai_ats);
        change(self.vaai_xcopy, &mut next.vaai_xcopy);
        change(self.vaai_write_same, &mut next.vaai_write_same);
        change(self.vaai_unmap, &mut next.vaai_unmap);
        Ok(next)
    }
}

/// A field that may be `null`: present (`Some`, holding `None` for `null`)
/// or, through `#[serde(default)]`, absent (`None`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// A CHAP user name and secret, as the API takes them.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChapCredential {
    /// User name (CHAP_N).
    pub user: String,
    /// Secret: 12 to 255 characters.
    pub secret: String,
}

impl std::fmt::Debug for ChapCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapCredential")
            .field("user", &self.user)
            .field("secret", &"<hidden>")
            .finish()
    }
}

/// Who may log in to a volume's iSCSI target (on every host). Replaces the
/// previous settings as a whole.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IscsiAccess {
    /// Initiator names allowed in; empty admits every initiator.
    #[serde(default)]
    pub allowed_initiators: Vec<String>,
    /// Credentials an initiator must prove (one-way CHAP).
    #[serde(default)]
    pub initiator_chap: Option<ChapCredential>,
    /// Credentials the target proves when the initiator asks (mutual CHAP);
    /// needs `initiator_chap`.
    #[serde(default)]
    pub target_chap: Option<ChapCredential>,
    /// NBD clients admitted, by the name their TLS client certificate
    /// proves (1 to 64 characters).
    #[serde(default)]
    pub nbd_clients: Vec<String>,
    /// Where NBD clients without a certificate may connect from while the
    /// settings name nobody: `loopback` (the default), `anywhere` or
    /// `nowhere`.
    #[serde(default)]
    pub plain_nbd: Option<PlainNbd>,
}

/// Body of `POST /v1/volumes/{name}/snapshots`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// The snapshot's name: 1 to 64 letters, digits, `.`, `_` or `-`.
    pub name: String,
    /// Other volumes to take a snapshot of, of the same name, at the same
    /// point in time (a consistency group: a database and its log on
    /// separate volumes). Every write acknowledged before the snapshot is
    /// in all of them; none made after it is in any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group: Vec<String>,
}

/// Body of `POST /v1/volumes/{volume}/snapshots/{snapshot}/clones`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CloneVolume {
    /// The new volume's name.
    pub name: String,
    /// A full clone: an independent volume, placed wherever its policy's
    /// placement puts it, that its owner fills with a copy of the
    /// snapshot in the background (it serves no client until the fill
    /// ends) and that shares no stored block with it. Without it, a
    /// linked clone: made at once on the snapshot's disk groups, sharing
    /// its blocks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub full: bool,
    /// The policy of a full clone (the source volume's when absent). A
    /// linked clone keeps its source's policy: naming another is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

/// Body of `POST /v1/volumes/{name}/revert`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RevertVolume {
    /// The snapshot the volume goes back to.
    pub to: String,
}

/// What deleting a snapshot did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SnapshotDeleted {
    /// The volume.
    pub volume: String,
    /// The snapshot deleted.
    pub name: String,
    /// Its components deleted now.
    pub deleted_components: u32,
    /// Its components on hosts out of reach, by host: each host deletes
    /// them once it is back.
    #[serde(default)]
    pub reclaim_pending: Vec<ReclaimPending>,
}

/// Components waiting for one host to delete them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReclaimPending {
    /// The host.
    pub host: String,
    /// How many of its components wait.
    pub components: u32,
}

/// A snapshot of a volume, as shown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SnapshotView {
    /// The volume.
    pub volume: String,
    /// The snapshot's name.
    pub name: String,
    /// The read-only NBD export that serves it (`volume@snapshot`).
    pub export: String,
    /// The read-only iSCSI target that serves it (LUN 0): the volume's
    /// target name, `:` and the snapshot's name, upper case letters and `_`
    /// escaped (`iqn.2026-11.io.tessera:vm1:before-upgrade`).
    #[serde(default)]
    pub iscsi_target: String,
    /// When it was taken (ms since the Unix epoch).
    pub created_ms: u64,
    /// The volume's size when it was taken.
    pub size_bytes: u64,
    /// The owner epoch that took it.
    pub epoch: u64,
    /// Its components, one per data copy of the volume.
    pub components: Vec<SnapshotComponentView>,
    /// The other volumes of its consistency group (their snapshots of the
    /// same name hold the same point in time).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group: Vec<String>,
    /// Bytes of data only this snapshot holds, per copy: what deleting it
    /// gives back. Shown by `snapshot list` (counted from one copy's index;
    /// absent when no copy could be reached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_alone_bytes: Option<u64>,
    /// Bytes of data it shares with the volume, other snapshots or clones,
    /// per copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_shared_bytes: Option<u64>,
}

/// One component of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SnapshotComponentView {
    /// The component.
    pub id: String,
    /// Its host.
    pub host: String,
    /// Its disk group.
    pub disk_group: String,
}

/// A volume's iSCSI access settings, as shown (secrets never are).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct IscsiAccessView {
    /// Volume name.
    pub volume: String,
    /// Its target name.
    pub target: String,
    /// Initiator names allowed in; empty admits every initiator.
    pub allowed_initiators: Vec<String>,
    /// CHAP user an initiator must log in as, if CHAP is required.
    pub chap_user: Option<String>,
    /// CHAP user the target answers as in mutual CHAP.
    pub target_chap_user: Option<String>,
    /// NBD clients admitted by certificate name.
    #[serde(default)]
    pub nbd_clients: Vec<String>,
    /// Where NBD clients without a certificate may connect from while the
    /// settings name nobody.
    #[serde(default)]
    pub plain_nbd: PlainNbd,
}

/// One volume as `volume list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VolumeView {
    /// Name.
    pub name: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Policy name.
    pub policy: String,
    /// Logical block size the frontends present (512 or 4096).
    #[serde(default = "tessera_directory::keys::default_block_bytes")]
    pub block_bytes: u32,
    /// Health.
    pub state: Health,
    /// Bytes of the volume's address space holding data (one copy).
    pub used_bytes: u64,
    /// Host coordinating it, if any.
    pub owner: Option<String>,
    /// The owner's epoch.
    pub epoch: Option<Epoch>,
    /// Clients (NBD connections, iSCSI sessions) that have it open now.
    #[serde(default)]
    pub open_by: u32,
    /// The I/O limits and minimum its policy gives it (its owner enforces
    /// them).
    #[serde(default, skip_serializing_if = "VolumeQos::is_unlimited")]
    pub qos: VolumeQos,
    /// What the request that returned this view should make the user
    /// think about (e.g. the datastore is now overcommitted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Set while the volume is a full clone being filled from a snapshot
    /// (it serves no client meanwhile); absent for an ordinary volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fill: Option<FillView>,
}

/// Where the fill of a full clone stands, as its owner last recorded it
/// (about once a second).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FillView {
    /// The snapshot copied, as `VOLUME@SNAPSHOT`.
    pub from: String,
    /// Bytes of the address space done: everything below is on every copy.
    pub done_bytes: u64,
    /// Bytes of the address space left.
    pub left_bytes: u64,
    /// Bytes of data copied so far (unmapped ranges are skipped).
    pub copied_bytes: u64,
    /// Address space per second of the current run, since it began.
    pub rate_bytes_per_s: u64,
    /// Seconds left at that rate; null when unknown.
    #[serde(default)]
    pub eta_s: Option<u64>,
    /// When the clone was made (ms since the Unix epoch).
    pub started_ms: u64,
    /// Runs so far, the current one included: a new owner (or a retry
    /// after a failure) continues from the recorded position.
    pub runs: u32,
    /// The position the current run began at (0 for the first).
    pub resumed_from_bytes: u64,
    /// Why the last attempt stopped, while a retry waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl FillView {
    /// The view of `fill`, a volume of `size_bytes` being filled.
    pub fn new(fill: &tessera_directory::keys::VolumeFill, size_bytes: u64) -> FillView {
        let left = size_bytes.saturating_sub(fill.done_bytes);
        FillView {
            from: format!("{}@{}", fill.source, fill.snapshot),
            done_bytes: fill.done_bytes,
            left_bytes: left,
            copied_bytes: fill.copied_bytes,
            rate_bytes_per_s: fill.rate_bytes_per_s,
            eta_s: (fill.rate_bytes_per_s > 0).then(|| left.div_ceil(fill.rate_bytes_per_s)),
            started_ms: fill.started_ms,
            runs: fill.runs,
            resumed_from_bytes: fill.resumed_from_bytes,
            error: fill.error.clone(),
        }
    }

    /// Percent of the address space done, 0-100 (rounded down, so 100
    /// only once all of it is).
    pub fn percent(&self) -> u64 {
        let total = self.done_bytes + self.left_bytes;
        if total == 0 {
            return 100;
        }
        (u128::from(self.done_bytes) * 100 / u128::from(total)) as u64
    }
}

/// One component as `object show` prints it (like RVC's object info).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ComponentView {
    /// Component id.
    #[serde(with = "component_id_text")]
    #[schemars(with = "String")]
    pub id: ComponentId,
    /// Data copy or witness.
    pub role: ComponentRole,
    /// Stripe column for data components.
    pub column: Option<usize>,
    /// Host.
    pub host: String,
    /// Disk group.
    pub disk_group: String,
    /// Fault domain.
    pub fault_domain: String,
    /// State.
    pub state: ComponentState,
    /// Votes.
    pub votes: u32,
    /// Bytes of address space holding data (None when unreachable).
    pub allocated_bytes: Option<u64>,
    /// Bytes still to resync.
    pub dirty_bytes: u64,
}

/// The component tree of one volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ObjectView {
    /// Volume name.
    pub volume: String,
    /// Size.
    pub size_bytes: u64,
    /// Policy.
    pub policy: String,
    /// Health.
    pub state: Health,
    /// Owner host.
    pub owner: Option<String>,
    /// Owner epoch.
    pub epoch: Option<Epoch>,
    /// Layout generation.
    pub generation: u64,
    /// Components.
    pub components: Vec<ComponentView>,
    /// SCSI offloads initiators asked of the volume (esxtop's VAAI columns),
    /// counted on the hosts this control plane runs.
    #[serde(default)]
    pub offloads: OffloadView,
    /// Its reads in its owner's read cache.
    #[serde(default)]
    pub read_cache: VolumeReadCacheView,
}

/// Offload counters of one volume, like esxtop's VAAI columns.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct OffloadView {
    /// COMPARE AND WRITE commands (ATS).
    pub ats: u64,
    /// ATS commands that miscompared.
    pub ats_miscompare: u64,
    /// EXTENDED COPY commands (CLONE).
    pub clone_commands: u64,
    /// Blocks read by EXTENDED COPY with this volume the source.
    pub clone_read_blocks: u64,
    /// Blocks written by EXTENDED COPY with this volume the destination.
    pub clone_write_blocks: u64,
    /// Bytes written into the volume by sharing stored blocks (EXTENDED
    /// COPY inside the datastore): no data moved for them.
    #[serde(default)]
    pub clone_shared_bytes: u64,
    /// Blocks zeroed by WRITE SAME (ZERO).
    pub zero_blocks: u64,
    /// Blocks deallocated by UNMAP or WRITE SAME with UNMAP (DELETE).
    pub delete_blocks: u64,
    /// Writes refused for lack of datastore space.
    pub out_of_space: u64,
}

/// One entry of the cluster's history (`GET /v1/events`): something a host
/// did on its own, or a change asked of the API that succeeded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventView {
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
    /// A stable code: `OWNERSHIP_TAKEN`, `HOST_ABSENT`, `COMPONENT_ABSENT`,
    /// `COMPONENT_RESYNCING`, `COMPONENT_ACTIVE`, `COMPONENT_DEGRADED`,
    /// `RESYNC_STARTED`, `RESYNC_FINISHED`, `RESYNC_FAILED`,
    /// `COMPONENT_REPLACED`, `LEASE_LOST`, `REJOINED`, or `API_CHANGE`.
    pub code: String,
    /// The host that did it (none for a change asked of the API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// What it concerns: a volume, a host, or the API path changed.
    pub subject: String,
    /// What happened and why.
    pub message: String,
    /// Who asked, for a change asked of the API: the token's name and role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// What one host's transport and write logs did since it started
/// (`GET /v1/activity/hosts`, the metrics endpoint).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HostActivity {
    /// The host.
    pub host: String,
    /// Calls it made to other hosts (round trips), failed ones included.
    pub transport_calls: u64,
    /// Those that failed (timeouts included).
    pub transport_call_errors: u64,
    /// Those that timed out.
    pub transport_timeouts: u64,
    /// Requests of other hosts it answered.
    pub transport_requests_served: u64,
    /// Each disk group's write log.
    pub disk_groups: Vec<DiskGroupLogActivity>,
    /// Its calls to each other host, with their round trips.
    #[serde(default)]
    pub peers: Vec<PeerActivity>,
}

/// The calls one host made to another since it started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PeerActivity {
    /// The host called.
    pub peer: String,
    /// Calls (round trips) made to it, failed ones included.
    pub calls: u64,
    /// Those that failed (timeouts included).
    pub call_errors: u64,
    /// Those that timed out.
    pub timeouts: u64,
    /// The answered calls' round trips added up, in nanoseconds: over
    /// `calls - call_errors`, their mean.
    pub round_trip_ns: u64,
}

/// One disk group's write log since it opened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiskGroupLogActivity {
    /// The disk group.
    pub disk_group: String,
    /// Group commits written to its log.
    pub group_commits: u64,
    /// Syncs of its log device (one covers every commit before it).
    pub log_syncs: u64,
    /// Group commits written durable on their own, needing no sync (a
    /// commit made while nothing else was in flight).
    pub durable_commits: u64,
    /// Large writes stored straight on the capacity tier, past the log.
    pub placed_writes: u64,
    /// Bytes those writes held.
    pub placed_bytes: u64,
}

/// What clients did to one volume, counted by its owner since it took the
/// volume (`GET /v1/activity`, the metrics endpoint, `tessera top`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeActivity {
    /// The volume.
    pub volume: String,
    /// Its owner, where these were counted.
    pub owner: String,
    /// NBD connections and iSCSI sessions that have it open, on every host
    /// this API serves.
    pub clients: u32,
    /// Operations, bytes, errors and latency per kind of operation.
    pub io: Vec<IoKindSnapshot>,
    /// Blocks (4 KiB) read from the owner's read cache.
    pub read_cache_hits: u64,
    /// Blocks read from a copy because the read cache did not hold them.
    pub read_cache_misses: u64,
    /// Blocks served from another copy after a checksum failure.
    pub checksum_repairs: u64,
    /// Bytes copied into its components by resyncs and rebuilds.
    pub resynced_bytes: u64,
    /// Bytes written while some copy was absent.
    pub degraded_write_bytes: u64,
    /// Its SCSI offload (VAAI) counters, on every host this API serves.
    pub offloads: OffloadView,
}

/// A byte range where copies disagree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Divergence {
    /// Stripe column.
    pub column: usize,
    /// Byte offset inside the column's components.
    pub component_offset: u64,
    /// Length of the differing block run.
    pub len: u64,
    /// Components that were compared.
    #[serde(with = "component_id_text::list")]
    #[schemars(with = "Vec<String>")]
    pub components: Vec<ComponentId>,
    /// The snapshot whose copies differ; absent for the volume itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// The result of comparing all copies of a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VerifyReport {
    /// Volume name.
    pub volume: String,
    /// True when every active copy holds the same bytes.
    pub identical: bool,
    /// Bytes compared per copy.
    pub compared_bytes: u64,
    /// Copies that were not compared (absent, resyncing) and why.
    pub skipped: Vec<String>,
    /// The volume's snapshots whose copies were compared too.
    #[serde(default)]
    pub snapshots: Vec<String>,
    /// Where copies differ (first entries only).
    pub divergences: Vec<Divergence>,
}

/// Where a resync or rebuild stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ResyncState {
    /// Copying now.
    Running,
    /// The last attempt failed and the owner will try again: it waits for
    /// the copy's host to return, or a lease before retrying.
    Waiting,
    /// Finished: the copy is up to date.
    Done,
    /// The last attempt failed and no retry is pending.
    Failed,
}

impl ResyncState {
    /// The word the tables print (the JSON's too).
    pub fn as_str(self) -> &'static str {
        match self {
            ResyncState::Running => "running",
            ResyncState::Waiting => "waiting",
            ResyncState::Done => "done",
            ResyncState::Failed => "failed",
        }
    }
}

/// One resync or rebuild of one component: the current attempt's progress
/// (a retry replaces the attempt before it, so a component appears once).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ResyncView {
    /// Volume.
    pub volume: String,
    /// Component being brought up to date, as the tables print it
    /// (`c` and 16 hex digits).
    #[serde(with = "component_id_text")]
    #[schemars(with = "String")]
    pub component: ComponentId,
    /// Its host.
    pub host: String,
    /// "resync" (delta after a host returned) or "rebuild" (new copy).
    pub kind: String,
    /// Where it stands.
    pub state: ResyncState,
    /// Why the last attempt failed; kept while a retry waits or runs,
    /// null once one succeeds.
    #[serde(default)]
    pub error: Option<String>,
    /// Attempts made, the current one included.
    #[serde(default = "one_attempt")]
    pub attempts: u32,
    /// Bytes of dirty address space the current attempt examined.
    pub done_bytes: u64,
    /// Bytes still to examine.
    pub left_bytes: u64,
    /// Bytes of data the current attempt copied (holes are not copied),
    /// counted as they are copied.
    pub copied_bytes: u64,
    /// Examination rate of the current attempt in bytes per second, from
    /// its start.
    pub rate_bytes_per_s: u64,
    /// Seconds left at that rate while running; null when unknown (not
    /// running, or nothing examined yet).
    #[serde(default)]
    pub eta_s: Option<u64>,
}

fn one_attempt() -> u32 {
    1
}

/// How bad a health check is.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Severity {
    /// Worth knowing; nothing is at risk yet.
    Info,
    /// Less protection or less room than asked for.
    Warning,
    /// Data is unreachable or soon will be.
    Error,
}

/// The stable codes of health checks, like `ceph health detail`'s.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HealthCode {
    /// A host's lease lapsed or it was stopped: its components miss writes.
    HostDown,
    /// A disk group failed: its components must be rebuilt elsewhere.
    DiskGroupFailed,
    /// Devices or components of a disk group failed; the rest serves.
    DiskGroupDegraded,
    /// Components of volumes are absent: the volumes run with less protection.
    ComponentAbsent,
    /// Absent components will be rebuilt elsewhere when the repair delay ends.
    RepairDelayPending,
    /// Copies are being brought up to date.
    ResyncRunning,
    /// Volumes cannot serve I/O.
    VolumeUnavailable,
    /// Datastore use crossed the nearly-full threshold.
    DatastoreNearlyFull,
    /// Datastore use crossed the full threshold: thin volumes may fail writes.
    DatastoreFull,
    /// More bytes are provisioned than the devices hold.
    Overcommitted,
    /// Hosts have their own values of settings: they do not all behave
    /// alike (vSAN's "advanced configuration in sync" check).
    SettingsDiffer,
}

/// One problem the cluster has: what, how bad, what it affects, what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HealthCheck {
    /// Stable code, for scripts and alerts.
    pub code: HealthCode,
    /// How bad it is.
    pub severity: Severity,
    /// One line saying what is wrong, with numbers.
    pub summary: String,
    /// The hosts, disk groups, volumes or components it concerns.
    pub affects: Vec<String>,
    /// What the user can do about it (or what the cluster will do).
    pub remedy: String,
    /// For `REPAIR_DELAY_PENDING`: seconds until the rebuild starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_left: Option<u64>,
}

/// Overall health with the checks that explain it (`tessera health`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HealthReport {
    /// Overall health: the worst of the volumes' and hosts'.
    pub health: Health,
    /// Every problem found, worst first; empty when healthy.
    pub checks: Vec<HealthCheck>,
}

impl ResyncView {
    /// True while the resync or rebuild is still moving data.
    pub fn is_running(&self) -> bool {
        self.state == ResyncState::Running
    }
}

/// Everything `tessera status` shows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StatusView {
    /// Cluster name.
    pub cluster: String,
    /// Overall health: the worst of the volumes' and hosts'.
    pub health: Health,
    /// Datastore capacity.
    pub capacity: CapacityView,
    /// Hosts.
    pub hosts: Vec<HostView>,
    /// Volumes.
    pub volumes: Vec<VolumeView>,
    /// Resyncs and rebuilds (running ones first, then recent ones).
    pub resyncs: Vec<ResyncView>,
    /// What is wrong and what to do, worst first.
    #[serde(default)]
    pub checks: Vec<HealthCheck>,
}

/// Why a control operation was refused.
#[derive(
    Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(tag = "kind", content = "message", rename_all = "kebab-case")]
pub enum ControlError {
    /// No such policy, volume or host (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// The name is taken, or the object is in a state that forbids it (HTTP 409).
    #[error("{0}")]
    Conflict(String),
    /// Malformed request: bad name, size, range (HTTP 400).
    #[error("{0}")]
    Invalid(String),
    /// The cluster cannot satisfy the policy or has no space (HTTP 422).
    #[error("{0}")]
    Unsatisfiable(String),
    /// The directory or hosts needed are not reachable now (HTTP 503).
    #[error("{0}")]
    Unavailable(String),
    /// A bug or an unexpected failure (HTTP 500).
    #[error("{0}")]
    Internal(String),
    /// No credential, or one the cluster does not accept (HTTP 401).
    #[error("{0}")]
    Unauthenticated(String),
    /// A credential whose role may not do this (HTTP 403).
    #[error("{0}")]
    Forbidden(String),
}

/// Every management operation, as the REST API exposes it.
#[async_trait]
pub trait ClusterControl: Send + Sync + 'static {
    /// Health, capacity, hosts, volumes, resyncs.
    async fn status(&self) -> Result<StatusView, ControlError>;
    /// Hosts with their disk groups.
    async fn hosts(&self) -> Result<Vec<HostView>, ControlError>;
    /// One host.
    async fn host(&self, id: &str) -> Result<HostView, ControlError> {
        self.hosts()
            .await?
            .into_iter()
            .find(|h| h.id == id)
            .ok_or_else(|| ControlError::NotFound(format!("no host named {id}")))
    }
    /// Overall health and the checks that explain it.
    async fn health(&self) -> Result<HealthReport, ControlError> {
        let status = self.status().await?;
        Ok(HealthReport {
            health: status.health,
            checks: status.checks,
        })
    }
    /// The cluster settings.
    async fn settings(&self) -> Result<ClusterSettings, ControlError>;
    /// Changes the cluster settings; refuses values out of range.
    async fn update_settings(
        &self,
        change: UpdateSettings,
    ) -> Result<ClusterSettings, ControlError>;
    /// The settings host `id` follows, and its own values.
    async fn host_settings(&self, id: &str) -> Result<HostSettingsView, ControlError>;
    /// Changes host `id`'s own setting values; refuses values out of range
    /// and hosts that do not exist.
    async fn update_host_settings(
        &self,
        id: &str,
        change: UpdateHostSettings,
    ) -> Result<HostSettingsView, ControlError>;
    /// Creates a policy; refuses a duplicate name or out-of-range values.
    async fn create_policy(&self, request: CreatePolicy) -> Result<Policy, ControlError>;
    /// All policies.
    async fn policies(&self) -> Result<Vec<Policy>, ControlError>;
    /// One policy.
    async fn policy(&self, name: &str) -> Result<Policy, ControlError> {
        self.policies()
            .await?
            .into_iter()
            .find(|p| p.name.as_str() == name)
            .ok_or_else(|| ControlError::NotFound(format!("no policy named {name}")))
    }
    /// Changes a policy. A QoS change applies at once to the volumes that
    /// use it; any other change is refused while volumes use the policy
    /// (their data would have to move or their reservations be remade).
    async fn update_policy(&self, name: &str, change: UpdatePolicy)
        -> Result<Policy, ControlError>;
    /// Deletes a policy no volume uses.
    async fn delete_policy(&self, name: &str) -> Result<(), ControlError>;
    /// Creates a volume: placement, components on their hosts, an owner.
    async fn create_volume(&self, request: CreateVolume) -> Result<VolumeView, ControlError>;
    /// All volumes.
    async fn volumes(&self) -> Result<Vec<VolumeView>, ControlError>;
    /// One volume.
    async fn volume(&self, name: &str) -> Result<VolumeView, ControlError> {
        self.volumes()
            .await?
            .into_iter()
            .find(|v| v.name == name)
            .ok_or_else(|| ControlError::NotFound(format!("no volume named {name}")))
    }
    /// Grows a volume.
    async fn resize_volume(
        &self,
        name: &str,
        request: ResizeVolume,
    ) -> Result<VolumeView, ControlError>;
    /// Renames a volume that no client has open: its data, copies and
    /// settings stay; its NBD export and iSCSI target take the new name.
    async fn rename_volume(
        &self,
        name: &str,
        request: RenameVolume,
    ) -> Result<VolumeView, ControlError>;
    /// Deletes a volume and its components. A volume that clients have
    /// open is refused unless `force`; with `force` their next request
    /// fails at once.
    async fn delete_volume(&self, name: &str, force: bool) -> Result<(), ControlError>;
    /// Sets who may log in to a volume's iSCSI target.
    async fn set_iscsi_access(
        &self,
        name: &str,
        access: IscsiAccess,
    ) -> Result<IscsiAccessView, ControlError>;
    /// Shows who may log in to a volume's iSCSI target.
    async fn iscsi_access(&self, name: &str) -> Result<IscsiAccessView, ControlError>;
    /// Takes a snapshot of a volume: a crash-consistent point in time on
    /// every copy, taken by its owner between two writes while clients go
    /// on (their writes wait for it).
    async fn create_snapshot(
        &self,
        volume: &str,
        request: CreateSnapshot,
    ) -> Result<SnapshotView, ControlError>;
    /// A volume's snapshots, oldest first.
    async fn snapshots(&self, volume: &str) -> Result<Vec<SnapshotView>, ControlError>;
    /// Deletes a snapshot and frees what it alone holds; the volume and its
    /// other snapshots are untouched.
    /// Components whose hosts are out of reach are deleted by their hosts
    /// once back (reclaim records); the answer says how many wait.
    async fn delete_snapshot(
        &self,
        volume: &str,
        name: &str,
    ) -> Result<SnapshotDeleted, ControlError>;
    /// Takes a volume back to one of its snapshots: what was written since
    /// is gone; the snapshot and the others stay. Refused while a client
    /// has the volume open.
    async fn revert_volume(
        &self,
        volume: &str,
        request: RevertVolume,
    ) -> Result<VolumeView, ControlError>;
    /// Makes a new volume from a snapshot. A linked clone is made at once:
    /// it holds what the snapshot holds and shares its stored blocks until
    /// it is written. A full clone (`full`) is an independent volume placed
    /// by its policy, answered at once while its owner fills it with a copy
    /// of the snapshot in the background (`fill` in its view; no client is
    /// served until the fill ends). Deleting the snapshot or its volume
    /// leaves either clone whole (refused while a full clone is filled from
    /// it).
    async fn clone_volume(
        &self,
        volume: &str,
        snapshot: &str,
        request: CloneVolume,
    ) -> Result<VolumeView, ControlError>;
    /// The component tree of a volume.
    async fn object(&self, name: &str) -> Result<ObjectView, ControlError>;
    /// Compares every active copy of a volume block by block.
    async fn verify_object(&self, name: &str) -> Result<VerifyReport, ControlError>;
    /// The cluster's history, oldest first: the newest `limit` entries.
    async fn events(&self, limit: usize) -> Result<Vec<EventView>, ControlError>;
    /// What each host of this API did: transport round trips and write
    /// logs.
    async fn host_activity(&self) -> Result<Vec<HostActivity>, ControlError>;
    /// What clients did to each volume this API's hosts own, by name.
    async fn activity(&self) -> Result<Vec<VolumeActivity>, ControlError>;
    /// The rates of the sampled intervals that ended after `after_ms` (the
    /// last hour with None), oldest first.
    async fn activity_history(
        &self,
        after_ms: Option<u64>,
    ) -> Result<ActivityHistoryView, ControlError>;
    /// Resyncs and rebuilds, running and recent.
    async fn resyncs(&self) -> Result<Vec<ResyncView>, ControlError>;
    /// Each disk group's scrubbing, on every host this API serves.
    async fn scrubs(&self) -> Result<Vec<ScrubView>, ControlError>;
    /// Starts a scrub pass of every disk group of `host` now; answers its
    /// rows.
    async fn scrub_now(&self, host: &str) -> Result<Vec<ScrubView>, ControlError>;
    /// Every disk group's encryption at rest, as its host last reported it.
    async fn encryption(&self) -> Result<Vec<EncryptionView>, ControlError>;
    /// Rekeys `host`'s encrypted disk groups with the key files of its
    /// configuration (shallow: the data keys sealed again; deep: also every
    /// block rewritten under new data keys, in the background).
    async fn rekey(
        &self,
        host: &str,
        request: RekeyRequest,
    ) -> Result<Vec<EncryptionView>, ControlError>;
    /// Stops one host's services, as a failure would (only in `tessera up`).
    async fn stop_host(&self, host: &str) -> Result<(), ControlError>;
    /// Starts a stopped host again (only in `tessera up`).
    async fn start_host(&self, host: &str) -> Result<(), ControlError>;
    /// Starts emptying `host`'s disk groups (only `disk_group` when given)
    /// before maintenance: nothing new is placed on them, and each volume's
    /// owner moves its components off them one at a time, copying each to
    /// its new place before dropping the old one. Refused, changing
    /// nothing, when the rest of the cluster cannot hold what they hold.
    async fn evacuate(
        &self,
        host: &str,
        disk_group: Option<&str>,
    ) -> Result<EvacuationView, ControlError> {
        let _ = disk_group;
        Err(ControlError::Invalid(format!(
            "host {host} cannot be evacuated here"
        )))
    }
    /// Ends `host`'s evacuation: its disk groups take new components
    /// again (what was moved off stays where it went).
    async fn end_evacuation(&self, host: &str) -> Result<(), ControlError> {
        Err(ControlError::Invalid(format!(
            "host {host} cannot be evacuated here"
        )))
    }
    /// Injects a fault into one host (only on hosts whose configuration
    /// accepts fault injection: test clusters).
    async fn inject_fault(&self, host: &str, fault: InjectFault) -> Result<(), ControlError> {
        let _ = fault;
        Err(ControlError::Invalid(format!(
            "host {host} does not accept fault injection here"
        )))
    }
    /// Who presents `token` (`tsn_<id>_<secret>`), and what they may do;
    /// `Unauthenticated` for anything the cluster does not accept.
    async fn authenticate(&self, token: &str) -> Result<ApiIdentity, ControlError>;
    /// Makes an API token; its secret is in the answer and nowhere else.
    /// `by` is the token that asked, if one did.
    async fn create_token(
        &self,
        by: Option<&ApiIdentity>,
        request: CreateToken,
    ) -> Result<CreatedToken, ControlError>;
    /// Every API token, without secrets.
    async fn tokens(&self) -> Result<Vec<TokenView>, ControlError>;
    /// Revokes a token: it is refused from now on.
    async fn revoke_token(&self, id: &str) -> Result<(), ControlError>;
    /// Keeps one change asked of the API (and how it ended) in the audit
    /// log.
    async fn record_change(&self, change: ApiChange) -> Result<(), ControlError>;
    /// The latest `limit` entries of the audit log, oldest first.
    async fn audit(&self, limit: usize) -> Result<Vec<AuditRecord>, ControlError>;
}

/// A change asked of the API, for the audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiChange {
    /// Who asked: None when no token was accepted.
    pub identity: Option<ApiIdentity>,
    /// The HTTP method.
    pub method: String,
    /// The path.
    pub path: String,
    /// The status answered.
    pub status: u16,
}

impl ApiChange {
    /// The audit log's entry for this change, answered at `at_ms`.
    pub fn into_record(self, at_ms: u64) -> AuditRecord {
        AuditRecord {
            at_ms,
            token_id: self.identity.as_ref().map(|i| i.token_id.clone()),
            token_name: self.identity.as_ref().map(|i| i.name.clone()),
            role: self.identity.map(|i| i.role),
            method: self.method,
            path: self.path,
            status: self.status,
        }
    }
}

/// Who called the API, as their token says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiIdentity {
    /// The token's id.
    pub token_id: String,
    /// Its name.
    pub name: String,
    /// What it may do.
    pub role: ApiRole,
}

/// Body of `POST /v1/tokens`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// What it is for, for people to read: 1 to 64 letters, digits, `.`,
    /// `_`, `-` or `@`.
    pub name: String,
    /// What it may do.
    pub role: ApiRole,
    /// Seconds until it stops being accepted; never if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_s: Option<u64>,
}

/// An API token as listed: everything but its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TokenView {
    /// Its id (the part of the token after `tsn_` and before the secret).
    pub id: String,
    /// What it is for.
    pub name: String,
    /// What it may do.
    pub role: ApiRole,
    /// When it was made (ms since the Unix epoch).
    pub created_ms: u64,
    /// When it stops being accepted (ms since the Unix epoch), if ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
    /// The id of the token that made it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
}

impl TokenView {
    /// The view of a token's record.
    pub fn of(record: &ApiTokenRecord) -> TokenView {
        TokenView {
            id: record.id.clone(),
            name: record.name.clone(),
            role: record.role,
            created_ms: record.created_ms,
            expires_ms: record.expires_ms,
            created_by: record.created_by.clone(),
        }
    }
}

/// Answer of `POST /v1/tokens`: the token, shown this once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CreatedToken {
    /// What its holder presents (`Authorization: Bearer <token>`).
    pub token: String,
    /// The token as listed.
    #[serde(flatten)]
    pub view: TokenView,
}

/// A fault to inject into a host, for testing how the cluster copes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum InjectFault {
    /// A device of a disk group fails from now on (every read, write and
    /// sync returns an I/O error), as a device that dies does.
    FailDevice {
        /// The disk group, e.g. dg0.
        disk_group: String,
        /// 0 for the cache device, 1 and up for the capacity devices.
        device: usize,
    },
    /// One bit of a stored 4 KiB block of the volume's copy on the host
    /// flips, past every checksum, as a latent media error does: reads and
    /// scrubs of that copy find it.
    CorruptBlock {
        /// The volume.
        volume: String,
        /// The block (4 KiB) in the copy's address space.
        block: u64,
    },
    /// Frames the host sends to `peer` (to every other host when absent)
    /// wait `delay_ms`, plus up to `jitter_ms` more drawn per frame, before
    /// they leave: a slow or distant link. Replaces the link's delay.
    NetworkDelay {
        /// The other host; every other host when absent.
        #[serde(default)]
        peer: Option<String>,
        /// Fixed delay per frame, at most 60,000.
        delay_ms: u64,
        /// Further random delay per frame, at most 60,000.
        #[serde(default)]
        jitter_ms: u64,
    },
    /// Frames the host sends to `peer` (every other host when absent) are
    /// lost, each with `percent` chance: a lossy link (calls time out and
    /// are retried as on a real network).
    NetworkDrop {
        /// The other host; every other host when absent.
        #[serde(default)]
        peer: Option<String>,
        /// Chance of loss per frame, 0 to 100.
        percent: u8,
    },
    /// Nothing passes between the host and `peer` (every other host when
    /// absent), either way: a network partition of the data path.
    Partition {
        /// The other host; every other host when absent.
        #[serde(default)]
        peer: Option<String>,
    },
    /// Ends every network fault set on the host (delays, losses and
    /// partitions it set).
    NetworkHeal,
}

/// The longest delay or jitter a network fault may add to a frame.
pub const NETWORK_DELAY_MAX_MS: u64 = 60_000;

impl IscsiAccess {
    /// Checks the settings for `volume`: initiator names that are iSCSI
    /// names, CHAP secrets of 12 to 255 characters, mutual CHAP only on top
    /// of one-way CHAP and never with the same secret both ways (a
    /// reflection attack would then succeed).
    pub fn check(&self, volume: &str) -> Result<(), ControlError> {
        let invalid = |why: String| Err(ControlError::Invalid(format!("volume {volume}: {why}")));
        for name in &self.allowed_initiators {
            let lower = name.to_ascii_lowercase();
            let well_formed = ["iqn.", "eui.", "naa."]
                .iter()
                .any(|p| lower.starts_with(p))
                && name.len() <= 223
                && !name.chars().any(|c| c.is_whitespace() || c == ',');
            if !well_formed {
                return invalid(format!(
                    "{name:?} is not an iSCSI initiator name (iqn., eui. or naa., at most 223 characters)"
                ));
            }
        }
        for name in &self.nbd_clients {
            if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
                return invalid(format!(
                    "{name:?} is not an NBD client name (1 to 64 characters, as its certificate names it)"
                ));
            }
        }
        for (which, c) in [
            ("initiator", &self.initiator_chap),
            ("target", &self.target_chap),
        ] {
            if let Some(c) = c {
                if c.user.is_empty() || c.user.len() > 255 {
                    return invalid(format!(
                        "the {which} CHAP user must have 1 to 255 characters"
                    ));
                }
                if !(12..=255).contains(&c.secret.len()) {
                    return invalid(format!(
                        "the {which} CHAP secret must have 12 to 255 characters, not {}",
                        c.secret.len()
                    ));
                }
            }
        }
        match (&self.initiator_chap, &self.target_chap) {
            (None, Some(_)) => invalid("mutual CHAP needs initiator CHAP too".into()),
            (Some(i), Some(t)) if i.secret == t.secret => {
                invalid("the initiator and target CHAP secrets must differ".into())
            }
            _ => Ok(()),
        }
    }
}

impl UpdateSettings {
    /// `current` with this change applied, or why the change is refused
    /// (nothing is changed then). `memory_bytes` is the memory of the host
    /// that checks the change: a read cache may take at most half of it.
    pub fn apply(
        &self,
        current: &ClusterSettings,
        memory_bytes: u64,
    ) -> Result<ClusterSettings, ControlError> {
        let mut next = current.clone();
        if let Some(bytes) = self.read_cache_bytes {
            if let Some(b) = bytes {
                if b > memory_bytes / 2 {
                    return Err(ControlError::Invalid(format!(
                        "read_cache_bytes may be at most half of a host's memory ({} bytes, {} of {}), not {b} bytes",
                        memory_bytes / 2,
                        format_size(memory_bytes / 2),
                        format_size(memory_bytes),
                    )));
                }
            }
            next.read_cache_bytes = bytes;
        }
        if let Some(bytes) = self.index_cache_bytes {
            if let Some(b) = bytes {
                let min = tessera_directory::keys::INDEX_CACHE_MIN_BYTES;
                if b < min || b > memory_bytes / 2 {
                    return Err(ControlError::Invalid(format!(
                        "index_cache_bytes must be between {} and half of a host's memory ({}), not {b} bytes",
                        format_size(min),
                        format_size(memory_bytes / 2),
                    )));
                }
            }
            next.index_cache_bytes = bytes;
        }
        if let Some(b) = self.index_prefetch_bytes {
            let max = tessera_directory::keys::INDEX_PREFETCH_MAX_BYTES;
            if b > max {
                return Err(ControlError::Invalid(format!(
                    "index_prefetch_bytes must be between 0 (off) and {}, not {b} bytes",
                    format_size(max)
                )));
            }
            next.index_prefetch_bytes = b;
        }
        if let Some(r) = self.max_overcommit_ratio {
            if !r.is_finite() || !(0.1..=100.0).contains(&r) {
                return Err(ControlError::Invalid(format!(
                    "max_overcommit_ratio must be between 0.1 and 100, not {r}"
                )));
            }
            next.max_overcommit_ratio = r;
        }
        if let Some(h) = self.scrub_period_h {
            if h > tessera_directory::keys::SCRUB_PERIOD_MAX_H {
                return Err(ControlError::Invalid(format!(
                    "scrub_period_h must be between 0 (off) and {} (a year), not {h}",
                    tessera_directory::keys::SCRUB_PERIOD_MAX_H
                )));
            }
            next.scrub_period_h = h;
        }
        if let Some(m) = self.resync_delay_multiplier {
            let max = tessera_directory::keys::RESYNC_DELAY_MULTIPLIER_MAX;
            if !(1..=max).contains(&m) {
                return Err(ControlError::Invalid(format!(
                    "resync_delay_multiplier must be between 1 and {max}, not {m}"
                )));
            }
            next.resync_delay_multiplier = m;
        }
        if let Some(delay) = self.repair_delay_s {
            let max = tessera_directory::keys::REPAIR_DELAY_MAX_S;
            if let Some(s) = delay.filter(|s| *s > max) {
                return Err(ControlError::Invalid(format!(
                    "repair_delay_s must be between 0 (rebuild at once) and {max} (a week), not {s}"
                )));
            }
            next.repair_delay_s = delay;
        }
        if let Some(ttl) = self.lease_ttl_ms {
            let (min, max) = (
                tessera_directory::keys::LEASE_TTL_MIN_MS,
                tessera_directory::keys::LEASE_TTL_MAX_MS,
            );
            if let Some(ms) = ttl.filter(|ms| !(min..=max).contains(ms)) {
                return Err(ControlError::Invalid(format!(
                    "lease_ttl_ms must be between {min} and {max} (five minutes), not {ms}"
                )));
            }
            next.lease_ttl_ms = ttl;
        }
        let switches = [
            (self.vaai_ats, &mut next.vaai_ats),
            (self.vaai_xcopy, &mut next.vaai_xcopy),
            (self.vaai_write_same, &mut next.vaai_write_same),
            (self.vaai_unmap, &mut next.vaai_unmap),
        ];
        for (change, setting) in switches {
            if let Some(on) = change {
                *setting = on;
            }
        }
        if let Some(p) = self.nearly_full_pct {
            next.nearly_full_pct = p;
        }
        if let Some(p) = self.full_pct {
            next.full_pct = p;
        }
        if !(1..=100).contains(&next.nearly_full_pct)
            || !(1..=100).contains(&next.full_pct)
            || next.nearly_full_pct >= next.full_pct
        {
            return Err(ControlError::Invalid(format!(
                "thresholds must satisfy 1 <= nearly_full_pct < full_pct <= 100, not {} and {}",
                next.nearly_full_pct, next.full_pct
            )));
        }
        Ok(next)
    }
}

impl UpdatePolicy {
    /// `current` with this change applied and validated.
    pub fn apply(&self, current: &Policy) -> Result<Policy, ControlError> {
        let mut next = current.clone();
        if let Some(f) = self.failures_to_tolerate {
            next.failures_to_tolerate = f;
        }
        if let Some(w) = self.stripe_width {
            next.stripe_width = w;
        }
        if let Some(r) = self.space_reservation_pct {
            next.space_reservation_pct = r;
        }
        if let Some(q) = self.qos {
            let qos = &mut next.qos;
            qos.iops_limit = q.iops_limit.unwrap_or(qos.iops_limit);
            qos.bandwidth_limit_mib_s =
                q.bandwidth_limit_mib_s.unwrap_or(qos.bandwidth_limit_mib_s);
            qos.iops_minimum = q.iops_minimum.unwrap_or(qos.iops_minimum);
        }
        next.validate()
            .map_err(|e| ControlError::Invalid(e.to_string()))?;
        Ok(next)
    }

    /// True when the change would give volumes a different layout (more or
    /// fewer copies or columns), which moves data.
    pub fn changes_layout(&self, current: &Policy) -> bool {
        self.failures_to_tolerate
            .is_some_and(|f| f != current.failures_to_tolerate)
            || self.stripe_width.is_some_and(|w| w != current.stripe_width)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_s_own_values_are_checked_like_the_cluster_s_and_null_lets_them_go() {
        let parse = |text: &str| serde_json::from_str::<UpdateHostSettings>(text).unwrap();
        let cluster = ClusterSettings {
            vaai_unmap: false,
            ..ClusterSettings::default()
        };
        let memory = 8u64 << 30;
        let own = parse(r#"{"vaai_unmap":true,"scrub_period_h":24}"#)
            .apply(&cluster, &HostSettings::default(), memory)
            .unwrap();
        assert_eq!(own.names(), ["scrub_period_h", "vaai_unmap"]);
        let follows = cluster.for_host(&own);
        assert!(follows.vaai_unmap && follows.scrub_period_h == 24);
        assert_eq!(
            follows.vaai_ats, cluster.vaai_ats,
            "not its own: the cluster's"
        );
        // Out of range as the cluster setting would be: refused, unchanged.
        for bad in [
            r#"{"resync_delay_multiplier":0}"#,
            r#"{"read_cache_bytes":8589934592}"#,
            r#"{"index_prefetch_bytes":1099511627776}"#,
        ] {
            assert!(matches!(
                parse(bad).apply(&cluster, &own, memory),
                Err(ControlError::Invalid(_))
            ));
        }
        // A setting that is the cluster's alone is not a field here.
        for alone in [
            r#"{"repair_delay_s":5}"#,
            r#"{"full_pct":90}"#,
            r#"{"lease_ttl_ms":1000}"#,
        ] {
            assert!(serde_json::from_str::<UpdateHostSettings>(alone).is_err());
        }
        // null: back to the cluster's value; absent: kept.
        let back = parse(r#"{"vaai_unmap":null}"#)
            .apply(&cluster, &own, memory)
            .unwrap();
        assert_eq!(back.names(), ["scrub_period_h"]);
        assert!(!cluster.for_host(&back).vaai_unmap);
    }

    #[test]
    fn the_lease_setting_takes_half_a_second_to_five_minutes_or_the_default() {
        let parse = |text: &str| serde_json::from_str::<UpdateSettings>(text).unwrap();
        let current = ClusterSettings::default();
        let set = parse(r#"{"lease_ttl_ms":1500}"#)
            .apply(&current, 1 << 30)
            .unwrap();
        assert_eq!(set.lease_ttl_ms, Some(1500));
        for bad in [499, 300_001] {
            let err = parse(&format!(r#"{{"lease_ttl_ms":{bad}}}"#))
                .apply(&set, 1 << 30)
                .unwrap_err();
            assert_eq!(
                err,
                ControlError::Invalid(format!(
                    "lease_ttl_ms must be between 500 and 300000 (five minutes), not {bad}"
                ))
            );
        }
        let reset = parse(r#"{"lease_ttl_ms":null}"#)
            .apply(&set, 1 << 30)
            .unwrap();
        assert_eq!(reset.lease_ttl_ms, None);
    }

    #[test]
    fn the_read_cache_setting_is_set_reset_to_its_default_or_refused() {
        let parse = |text: &str| serde_json::from_str::<UpdateSettings>(text).unwrap();
        assert_eq!(parse("{}").read_cache_bytes, None);
        assert_eq!(
            parse(r#"{"read_cache_bytes":null}"#).read_cache_bytes,
            Some(None)
        );
        assert_eq!(
            parse(r#"{"read_cache_bytes":1048576}"#).read_cache_bytes,
            Some(Some(1 << 20))
        );
        assert!(serde_json::from_str::<UpdateSettings>(r#"{"read_cache":1}"#).is_err());
        let memory = 8u64 << 30;
        let set = parse(r#"{"read_cache_bytes":1048576}"#)
            .apply(&ClusterSettings::default(), memory)
            .unwrap();
        assert_eq!(set.read_cache_bytes, Some(1 << 20));
        // Other fields given alongside still apply; absent it stays.
        let unchanged = parse(r#"{"full_pct":90}"#).apply(&set, memory).unwrap();
        assert_eq!(unchanged.read_cache_bytes, Some(1 << 20));
        let reset = parse(r#"{"read_cache_bytes":null}"#)
            .apply(&set, memory)
            .unwrap();
        assert_eq!(reset.read_cache_bytes, None);
        let half = parse(&format!(r#"{{"read_cache_bytes":{}}}"#, memory / 2))
            .apply(&set, memory)
            .unwrap();
        assert_eq!(half.read_cache_bytes, Some(memory / 2));
        let err = parse(&format!(r#"{{"read_cache_bytes":{}}}"#, memory / 2 + 1))
            .apply(&set, memory)
            .unwrap_err();
        assert_eq!(
            err,
            ControlError::Invalid(
                "read_cache_bytes may be at most half of a host's memory (4294967296 bytes, 4.0 GiB of 8.0 GiB), not 4294967297 bytes"
                    .into()
            )
        );
    }

    #[test]
    fn the_scrub_period_is_set_turned_off_or_refused_past_a_year() {
        let parse = |text: &str| serde_json::from_str::<UpdateSettings>(text).unwrap();
        let current = ClusterSettings::default();
        assert_eq!(current.scrub_period_h, 168, "a week by default");
        let set = parse(r#"{"scrub_period_h":24}"#)
            .apply(&current, 8 << 30)
            .unwrap();
        assert_eq!(set.scrub_period_h, 24);
        let off = parse(r#"{"scrub_period_h":0}"#)
            .apply(&set, 8 << 30)
            .unwrap();
        assert_eq!(off.scrub_period_h, 0);
        let err = parse(r#"{"scrub_period_h":8761}"#)
            .apply(&set, 8 << 30)
            .unwrap_err();
        assert_eq!(
            err,
            ControlError::Invalid(
                "scrub_period_h must be between 0 (off) and 8760 (a year), not 8761".into()
            )
        );
        assert!(serde_json::from_str::<UpdateSettings>(r#"{"scrub_period_h":-1}"#).is_err());
    }

    #[test]
    fn the_resync_delay_multiplier_is_set_or_refused_outside_1_to_256() {
        let parse = |text: &str| serde_json::from_str::<UpdateSettings>(text).unwrap();
        let current = ClusterSettings::default();
        assert_eq!(current.resync_delay_multiplier, 1);
        let slower = parse(r#"{"resync_delay_multiplier":64}"#)
            .apply(&current, 1 << 30)
            .unwrap();
        assert_eq!(slower.resync_delay_multiplier, 64);
        for refused in [0, 257] {
            let err = parse(&format!(r#"{{"resync_delay_multiplier":{refused}}}"#))
                .apply(&current, 1 << 30)
                .unwrap_err();
            assert_eq!(
                err,
                ControlError::Invalid(format!(
                    "resync_delay_multiplier must be between 1 and 256, not {refused}"
                ))
            );
        }
    }
}
