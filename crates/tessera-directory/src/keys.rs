//! Every key Tessera stores in the directory, and the record stored there.
//!
//! Owns: the layout of the keyspace under `/tessera/<cluster>/` and the
//! serde records (JSON, so `etcdctl get` and `tessera dump` show text a
//! person can read). Callers name keys only through [`Keyspace`], which hands
//! out typed [`Key`]s and [`Prefix`]es; [`get`], [`put`], [`cas`], [`list`]
//! and [`delete`] read and write them. Nobody else formats key strings.
//!
//! Must not touch: what the records mean to the layers that use them.
//!
//! Invariants:
//! - every key is `/tessera/<cluster>/<kind>/<name>[/<name>]`, and every name
//!   in it is a checked identifier (no `/`), so a prefix never matches a
//!   neighbour (`volumes/a/` is not a prefix of `volumes/ab/...`);
//! - a record type is stored under exactly one kind of key;
//! - records only gain optional fields (`#[serde(default)]`), so an older
//!   value always decodes.
//!
//! The keys:
//!
//! | key | record | lease |
//! |---|---|---|
//! | `hosts/<host>` | [`HostRecord`] | none: inventory outlives the process |
//! | `liveness/<host>` | [`HostLiveness`] | the host's session lease |
//! | `fault-domains/<fd>` | [`FaultDomainRecord`] | none |
//! | `disk-groups/<host>/<dg>` | [`DiskGroupRecord`] | none |
//! | `policies/<name>` | [`Policy`] | none |
//! | `volumes/<volume>` | [`VolumeRecord`] (with [`VolumeFill`] while a full clone is filled) | none |
//! | `layouts/<volume>` | [`Layout`] | none |
//! | `dirty-regions/<volume>` | [`DirtyRecord`] | none: a later owner resyncs by it |
//! | `components/<volume>/<component>` | [`ComponentStateRecord`] | none |
//! | `owners/<volume>` | [`OwnerRecord`] | the owner's lease |
//! | `owner-epochs/<volume>` | [`OwnerEpochRecord`] | none: epochs never go back |
//! | `reservations/<volume>` | [`ReservationRecord`] | none: reservations persist through power loss |
//! | `iscsi-access/<volume>` | [`VolumeAccessRecord`] | none |
//! | `reclaims/<host>/<component>` | [`ReclaimRecord`] | none: the host deletes it once the component is gone |
//! | `api-tokens/<id>` | [`ApiTokenRecord`] | none: deleting it revokes the token |
//! | `audit/<ms:016x>-<sequence:016x>-<nonce>` | [`AuditRecord`] | none: the oldest beyond a bound are deleted |
//! | `events/<ms:016x>-<host>-<sequence:016x>` | [`EventRecord`] | none: the oldest beyond a bound are deleted |

use crate::{
    Compare, Directory, DirectoryError, KeyValue, LeaseId, Result, Revision, TxnOp, TxnOutcome,
    WatchEvent, WatchEventKind,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::marker::PhantomData;
use std::net::SocketAddr;
use tessera_types::dirty::DirtyRecord;
use tessera_types::layout::{ComponentPlacement, ComponentState, Layout};
use tessera_types::policy::Policy;
use tessera_types::{ComponentId, DiskGroupId, Epoch, FaultDomainId, HostId, PolicyName, VolumeId};

/// The root of every key Tessera writes.
pub const ROOT: &str = "/tessera";

/// A key whose value is a `T`.
pub struct Key<T> {
    path: String,
    record: PhantomData<fn() -> T>,
}

impl<T> Clone for Key<T> {
    fn clone(&self) -> Self {
        Key {
            path: self.path.clone(),
            record: PhantomData,
        }
    }
}

impl<T> fmt::Debug for Key<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.path)
    }
}

impl<T> fmt::Display for Key<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path)
    }
}

impl<T> PartialEq for Key<T> {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path
    }
}

impl<T> Eq for Key<T> {}

impl<T> Key<T> {
    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.path
    }

    /// A transaction condition: the key does not exist.
    pub fn absent(&self) -> Compare {
        Compare::Absent {
            key: self.path.clone(),
        }
    }

    /// A transaction condition: the key was last changed at `revision`.
    pub fn at_revision(&self, revision: Revision) -> Compare {
        Compare::ModRevision {
            key: self.path.clone(),
            revision,
        }
    }

    /// A transaction write deleting the key.
    pub fn delete_op(&self) -> TxnOp {
        TxnOp::Delete {
            key: self.path.clone(),
        }
    }
}

impl<T: Serialize> Key<T> {
    /// A transaction write storing `value`, attached to `lease` if given.
    pub fn put_op(&self, value: &T, lease: Option<LeaseId>) -> Result<TxnOp> {
        Ok(TxnOp::Put {
            key: self.path.clone(),
            value: encode(&self.path, value)?,
            lease,
        })
    }

    /// A transaction condition: the key holds exactly `value` (as encoded
    /// by this build).
    pub fn holds(&self, value: &T) -> Result<Compare> {
        Ok(Compare::Value {
            key: self.path.clone(),
            value: encode(&self.path, value)?,
        })
    }
}

/// All keys of one kind (or one kind under one parent), whose values are `T`.
pub struct Prefix<T> {
    path: String,
    record: PhantomData<fn() -> T>,
}

impl<T> Clone for Prefix<T> {
    fn clone(&self) -> Self {
        Prefix {
            path: self.path.clone(),
            record: PhantomData,
        }
    }
}

impl<T> fmt::Debug for Prefix<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Prefix({})", self.path)
    }
}

impl<T> Prefix<T> {
    /// The prefix as stored, ending in `/`.
    pub fn as_str(&self) -> &str {
        &self.path
    }
}

impl<T: DeserializeOwned> Prefix<T> {
    /// Decodes a watch event under this prefix: the record for a put,
    /// `None` for a delete.
    pub fn decode_event(&self, event: &WatchEvent) -> Result<Option<T>> {
        match event.kind {
            WatchEventKind::Put => decode(&event.kv.key, &event.kv.value).map(Some),
            WatchEventKind::Delete => Ok(None),
        }
    }
}

fn encode<T: Serialize>(key: &str, value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| DirectoryError::InvalidRequest {
        detail: format!("cannot encode the record for {key}: {e}"),
    })
}

fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| DirectoryError::Decode {
        key: key.to_string(),
        detail: e.to_string(),
    })
}

/// A record read from the directory, with its key's history.
#[derive(Clone, Debug, PartialEq)]
pub struct Record<T> {
    /// The key it was read from.
    pub key: String,
    /// The decoded value.
    pub value: T,
    /// Revision that created the key.
    pub create_revision: Revision,
    /// Revision of its last change: pass it to [`cas`] to update it only if
    /// nobody changed it since.
    pub mod_revision: Revision,
    /// The lease it is attached to.
    pub lease: Option<LeaseId>,
}

impl<T: DeserializeOwned> Record<T> {
    fn from_kv(kv: KeyValue) -> Result<Record<T>> {
        Ok(Record {
            value: decode(&kv.key, &kv.value)?,
            key: kv.key,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            lease: kv.lease,
        })
    }
}

/// Records under a prefix, read at one revision.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordListing<T> {
    /// The records in key order.
    pub records: Vec<Record<T>>,
    /// The revision they reflect; watch from `revision + 1`.
    pub revision: Revision,
}

/// Reads the record at `key`.
pub async fn get<T: DeserializeOwned>(
    directory: &dyn Directory,
    key: &Key<T>,
) -> Result<Option<Record<T>>> {
    directory
        .get(&key.path)
        .await?
        .map(Record::from_kv)
        .transpose()
}

/// Stores `value` at `key` unconditionally; returns the change's revision.
pub async fn put<T: Serialize>(
    directory: &dyn Directory,
    key: &Key<T>,
    value: &T,
    lease: Option<LeaseId>,
) -> Result<Revision> {
    directory
        .put(&key.path, encode(&key.path, value)?, lease)
        .await
}

/// Deletes the oldest records under `prefix` (keys that sort first) beyond
/// the newest `keep`: how the bounded logs (audit, events) stay bounded.
pub async fn trim_oldest<T: DeserializeOwned>(
    directory: &dyn Directory,
    prefix: &Prefix<T>,
    keep: usize,
) -> Result<()> {
    let listing = directory.list(&prefix.path).await?;
    let excess = listing.entries.len().saturating_sub(keep);
    for entry in listing.entries.into_iter().take(excess) {
        directory.delete(&entry.key).await?;
    }
    Ok(())
}

/// Stores `value` at `key` only if the key is unchanged since `expected`:
/// `None` means "does not exist", `Some(rev)` means "last changed at `rev`"
/// (a [`Record::mod_revision`]). A lost race is `succeeded: false`.
pub async fn cas<T: Serialize>(
    directory: &dyn Directory,
    key: &Key<T>,
    expected: Option<Revision>,
    value: &T,
    lease: Option<LeaseId>,
) -> Result<TxnOutcome> {
    let compare = match expected {
        None => key.absent(),
        Some(revision) => key.at_revision(revision),
    };
    directory
        .txn(
            crate::Txn::new()
                .when([compare])
                .and_then([key.put_op(value, lease)?]),
        )
        .await
}

/// Deletes `key`; returns whether it existed.
pub async fn delete<T>(directory: &dyn Directory, key: &Key<T>) -> Result<bool> {
    directory.delete(&key.path).await
}

/// Reads every record under `prefix`.
pub async fn list<T: DeserializeOwned>(
    directory: &dyn Directory,
    prefix: &Prefix<T>,
) -> Result<RecordListing<T>> {
    let listing = directory.list(&prefix.path).await?;
    Ok(RecordListing {
        records: listing
            .entries
            .into_iter()
            .map(Record::from_kv)
            .collect::<Result<_>>()?,
        revision: listing.revision,
    })
}

/// A change to a record under a watched prefix.
#[derive(Clone, Debug, PartialEq)]
pub enum RecordChange<T> {
    /// The record was created or replaced.
    Put(Record<T>),
    /// The record was deleted (explicitly or with its lease).
    Delete {
        /// The key that went away.
        key: String,
        /// The revision of the delete.
        revision: Revision,
    },
}

/// A watch that decodes the records under a [`Prefix`].
pub struct RecordWatch<T> {
    events: crate::WatchStream,
    record: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for RecordWatch<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RecordWatch({})", self.events.prefix())
    }
}

impl<T: DeserializeOwned> RecordWatch<T> {
    /// The next change. A value that does not decode is reported as
    /// [`DirectoryError::Decode`] and the watch goes on; any other error ends
    /// it (list again and watch from the listing's revision + 1).
    pub async fn recv(&mut self) -> Result<RecordChange<T>> {
        let event = self.events.recv().await?;
        match event.kind {
            WatchEventKind::Put => Ok(RecordChange::Put(Record::from_kv(event.kv)?)),
            WatchEventKind::Delete => Ok(RecordChange::Delete {
                key: event.kv.key,
                revision: event.kv.mod_revision,
            }),
        }
    }
}

/// Watches the records under `prefix` from `from_revision` (`0`: from now).
pub async fn watch<T>(
    directory: &dyn Directory,
    prefix: &Prefix<T>,
    from_revision: Revision,
) -> Result<RecordWatch<T>> {
    Ok(RecordWatch {
        events: directory.watch(&prefix.path, from_revision).await?,
        record: PhantomData,
    })
}

/// The keys of one cluster: everything under `/tessera/<cluster>/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keyspace {
    root: String,
}

impl Keyspace {
    /// The keyspace of the cluster named `cluster` (letters, digits, `.`,
    /// `_`, `-`; starting with a letter or digit).
    pub fn new(cluster: &str) -> Result<Keyspace> {
        // Cluster names follow the same rule as every other name in a key.
        tessera_types::VolumeId::new(cluster).map_err(|_| DirectoryError::InvalidRequest {
            detail: format!(
                "cluster name {cluster:?} cannot be part of a key: use 1 to {} letters, digits, '.', '_' or '-', starting with a letter or digit",
                tessera_types::NAME_BYTES_MAX
            ),
        })?;
        Ok(Keyspace {
            root: format!("{ROOT}/{cluster}/"),
        })
    }

    /// Everything of this cluster (for dumps).
    pub fn root(&self) -> &str {
        &self.root
    }

    fn key<T>(&self, parts: &[&str]) -> Key<T> {
        Key {
            path: format!("{}{}", self.root, parts.join("/")),
            record: PhantomData,
        }
    }

    fn prefix<T>(&self, parts: &[&str]) -> Prefix<T> {
        Prefix {
            path: format!("{}{}/", self.root, parts.join("/")),
            record: PhantomData,
        }
    }

    /// A host's inventory record.
    pub fn host(&self, host: &HostId) -> Key<HostRecord> {
        self.key(&["hosts", host.as_str()])
    }

    /// Every host's inventory record.
    pub fn hosts(&self) -> Prefix<HostRecord> {
        self.prefix(&["hosts"])
    }

    /// A host's liveness key, attached to its session lease.
    pub fn liveness(&self, host: &HostId) -> Key<HostLiveness> {
        self.key(&["liveness", host.as_str()])
    }

    /// The liveness keys of every live host.
    pub fn liveness_all(&self) -> Prefix<HostLiveness> {
        self.prefix(&["liveness"])
    }

    /// A fault domain's record.
    pub fn fault_domain(&self, fault_domain: &FaultDomainId) -> Key<FaultDomainRecord> {
        self.key(&["fault-domains", fault_domain.as_str()])
    }

    /// Every fault domain's record.
    pub fn fault_domains(&self) -> Prefix<FaultDomainRecord> {
        self.prefix(&["fault-domains"])
    }

    /// A disk group's record.
    pub fn disk_group(&self, host: &HostId, disk_group: &DiskGroupId) -> Key<DiskGroupRecord> {
        self.key(&["disk-groups", host.as_str(), disk_group.as_str()])
    }

    /// The disk groups of one host.
    pub fn disk_groups_of(&self, host: &HostId) -> Prefix<DiskGroupRecord> {
        self.prefix(&["disk-groups", host.as_str()])
    }

    /// Every disk group in the cluster.
    pub fn disk_groups(&self) -> Prefix<DiskGroupRecord> {
        self.prefix(&["disk-groups"])
    }

    /// A storage policy.
    pub fn policy(&self, name: &PolicyName) -> Key<Policy> {
        self.key(&["policies", name.as_str()])
    }

    /// Every storage policy.
    pub fn policies(&self) -> Prefix<Policy> {
        self.prefix(&["policies"])
    }

    /// A volume's record.
    pub fn volume(&self, volume: &VolumeId) -> Key<VolumeRecord> {
        self.key(&["volumes", volume.as_str()])
    }

    /// Every volume's record.
    pub fn volumes(&self) -> Prefix<VolumeRecord> {
        self.prefix(&["volumes"])
    }

    /// A volume's layout.
    pub fn layout(&self, volume: &VolumeId) -> Key<Layout> {
        self.key(&["layouts", volume.as_str()])
    }

    /// Every volume's layout.
    pub fn layouts(&self) -> Prefix<Layout> {
        self.prefix(&["layouts"])
    }

    /// The dirty-region maps of a volume's copies that are behind, written
    /// by its owner with the layout.
    pub fn dirty_regions(&self, volume: &VolumeId) -> Key<DirtyRecord> {
        self.key(&["dirty-regions", volume.as_str()])
    }

    /// The state of one component of a volume.
    pub fn component_state(
        &self,
        volume: &VolumeId,
        component: ComponentId,
    ) -> Key<ComponentStateRecord> {
        self.key(&["components", volume.as_str(), &component.to_string()])
    }

    /// The component states of one volume.
    pub fn component_states_of(&self, volume: &VolumeId) -> Prefix<ComponentStateRecord> {
        self.prefix(&["components", volume.as_str()])
    }

    /// Every component state in the cluster.
    pub fn component_states(&self) -> Prefix<ComponentStateRecord> {
        self.prefix(&["components"])
    }

    /// A volume's owner lease key.
    pub fn owner(&self, volume: &VolumeId) -> Key<OwnerRecord> {
        self.key(&["owners", volume.as_str()])
    }

    /// Every volume's owner.
    pub fn owners(&self) -> Prefix<OwnerRecord> {
        self.prefix(&["owners"])
    }

    /// The highest owner epoch ever granted for a volume.
    pub fn owner_epoch(&self, volume: &VolumeId) -> Key<OwnerEpochRecord> {
        self.key(&["owner-epochs", volume.as_str()])
    }

    /// A volume's SCSI reservations.
    pub fn reservation(&self, volume: &VolumeId) -> Key<ReservationRecord> {
        self.key(&["reservations", volume.as_str()])
    }

    /// Every volume's SCSI reservations.
    pub fn reservations(&self) -> Prefix<ReservationRecord> {
        self.prefix(&["reservations"])
    }

    /// Who may log in to a volume's iSCSI target.
    pub fn iscsi_access(&self, volume: &VolumeId) -> Key<VolumeAccessRecord> {
        self.key(&["iscsi-access", volume.as_str()])
    }

    /// Every volume's iSCSI access settings.
    pub fn iscsi_accesses(&self) -> Prefix<VolumeAccessRecord> {
        self.prefix(&["iscsi-access"])
    }

    /// The cluster's settings (one record; absent means every default).
    pub fn settings(&self) -> Key<ClusterSettings> {
        self.key(&["settings"])
    }

    /// One host's own values of the settings that may differ per host.
    pub fn host_settings(&self, host: &HostId) -> Key<HostSettings> {
        self.key(&["host-settings", host.as_str()])
    }

    /// Every host's own setting values.
    pub fn host_settings_all(&self) -> Prefix<HostSettings> {
        self.prefix(&["host-settings"])
    }

    /// The volumes a host's clients have open, held under the host's lease.
    pub fn attachments(&self, host: &HostId) -> Key<AttachmentRecord> {
        self.key(&["attachments", host.as_str()])
    }

    /// Every host's open volumes.
    pub fn attachments_all(&self) -> Prefix<AttachmentRecord> {
        self.prefix(&["attachments"])
    }

    /// Where the scrub pass of a host's disk group is, so a restarted host
    /// goes on from there.
    pub fn scrub_position(&self, host: &HostId, disk_group: &DiskGroupId) -> Key<ScrubPosition> {
        self.key(&["scrub-positions", host.as_str(), disk_group.as_str()])
    }

    /// The scrub positions of one host's disk groups.
    pub fn scrub_positions_of(&self, host: &HostId) -> Prefix<ScrubPosition> {
        self.prefix(&["scrub-positions", host.as_str()])
    }

    /// The disk groups of a host being evacuated.
    pub fn evacuation(&self, host: &HostId) -> Key<EvacuationRecord> {
        self.key(&["evacuations", host.as_str()])
    }

    /// Every host's evacuation.
    pub fn evacuations(&self) -> Prefix<EvacuationRecord> {
        self.prefix(&["evacuations"])
    }

    /// A snapshot of a volume.
    pub fn snapshot(&self, volume: &VolumeId, name: &SnapshotName) -> Key<SnapshotRecord> {
        self.key(&["snapshots", volume.as_str(), name.as_str()])
    }

    /// The snapshots of one volume.
    pub fn snapshots_of(&self, volume: &VolumeId) -> Prefix<SnapshotRecord> {
        self.prefix(&["snapshots", volume.as_str()])
    }

    /// Every volume's snapshots.
    pub fn snapshots(&self) -> Prefix<SnapshotRecord> {
        self.prefix(&["snapshots"])
    }

    /// An API token's record (its secret's hash, role and lifetime).
    pub fn api_token(&self, id: &str) -> Key<ApiTokenRecord> {
        self.key(&["api-tokens", id])
    }

    /// Every API token's record.
    pub fn api_tokens(&self) -> Prefix<ApiTokenRecord> {
        self.prefix(&["api-tokens"])
    }

    /// One entry of the API's audit log: `at_ms`, then the writer's own
    /// sequence, so the log lists oldest first (and one writer's entries of
    /// the same millisecond in order), then a nonce that keeps two writers
    /// apart.
    pub fn audit_entry(&self, at_ms: u64, sequence: u64, nonce: u32) -> Key<AuditRecord> {
        self.key(&[
            "audit",
            &format!("{at_ms:016x}-{sequence:016x}-{nonce:08x}"),
        ])
    }

    /// The API's audit log.
    pub fn audit_log(&self) -> Prefix<AuditRecord> {
        self.prefix(&["audit"])
    }

    /// One entry of the cluster's event log: `at_ms`, then the host that
    /// wrote it and its own sequence, so the log lists oldest first and one
    /// host's entries of the same millisecond in order.
    pub fn event_entry(&self, at_ms: u64, host: &str, sequence: u64) -> Key<EventRecord> {
        self.key(&["events", &format!("{at_ms:016x}-{host}-{sequence:016x}")])
    }

    /// The cluster's event log.
    pub fn event_log(&self) -> Prefix<EventRecord> {
        self.prefix(&["events"])
    }

    /// A component that no record names any more, to be deleted by its
    /// host.
    pub fn reclaim(&self, host: &HostId, component: ComponentId) -> Key<ReclaimRecord> {
        self.key(&["reclaims", host.as_str(), &component.to_string()])
    }

    /// The components one host is to delete.
    pub fn reclaims_of(&self, host: &HostId) -> Prefix<ReclaimRecord> {
        self.prefix(&["reclaims", host.as_str()])
    }

    /// Every host's components to delete.
    pub fn reclaims(&self) -> Prefix<ReclaimRecord> {
        self.prefix(&["reclaims"])
    }

    /// A transaction write scheduling the deletion of `placement` (a
    /// component of `volume`) on its host.
    pub fn reclaim_op(
        &self,
        volume: &VolumeId,
        placement: &ComponentPlacement,
        reason: ReclaimReason,
        scheduled_ms: u64,
    ) -> Result<TxnOp> {
        let record = ReclaimRecord::of(volume, placement, reason, scheduled_ms);
        self.reclaim(&placement.host, placement.id)
            .put_op(&record, None)
    }
}

/// What a holder of an API token may do; each role may do what the ones
/// before it may.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum ApiRole {
    /// Reads every view (status, hosts, volumes, snapshots, resyncs).
    Viewer,
    /// Also manages volumes: creates, resizes, renames, deletes, snapshots,
    /// clones and reverts them, sets their access, verifies their copies.
    Operator,
    /// Also manages the cluster: hosts, disk groups, policies, settings,
    /// faults and API tokens.
    Admin,
}

impl ApiRole {
    /// The role's name, as the CLI and the API write it.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiRole::Viewer => "viewer",
            ApiRole::Operator => "operator",
            ApiRole::Admin => "admin",
        }
    }

    /// Whether this role may do what `needed` may.
    pub fn allows(self, needed: ApiRole) -> bool {
        self >= needed
    }
}

impl fmt::Display for ApiRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ApiRole {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<ApiRole, String> {
        match s {
            "viewer" => Ok(ApiRole::Viewer),
            "operator" => Ok(ApiRole::Operator),
            "admin" => Ok(ApiRole::Admin),
            other => Err(format!(
                "no role named {other:?}: the roles are viewer, operator and admin"
            )),
        }
    }
}

/// An API token: who holds it (a name for people to read), what it may do
/// and until when. Only a hash of its secret is kept, so the directory's
/// contents let no one call the API; deleting the record revokes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiTokenRecord {
    /// Its id: the public part of the token, which finds this record.
    pub id: String,
    /// What it is for (`admin` for the one `tessera up` makes).
    pub name: String,
    /// What it may do.
    pub role: ApiRole,
    /// The BLAKE3 hash of its secret, in hex.
    pub secret_hash: String,
    /// When it was made (ms since the Unix epoch).
    pub created_ms: u64,
    /// When it stops being accepted (ms since the Unix epoch); never if
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
    /// The token that made it (its id), if a token did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
}

/// One change asked of the API, as the audit log keeps it: who asked (the
/// token, never its secret), what, when and how it ended. Request bodies are
/// not kept: they may carry secrets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AuditRecord {
    /// When the answer was given (ms since the Unix epoch).
    pub at_ms: u64,
    /// The token that asked; None when no token was accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_id: Option<String>,
    /// Its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_name: Option<String>,
    /// Its role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<ApiRole>,
    /// The HTTP method.
    pub method: String,
    /// The path asked for.
    pub path: String,
    /// The HTTP status answered.
    pub status: u16,
}

/// Something the cluster did on its own, and why, as its event log keeps
/// it (changes asked of the API are in the audit log).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventRecord {
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
    /// A stable code (`OWNERSHIP_TAKEN`, `RESYNC_FINISHED`, ...).
    pub code: String,
    /// The host that did it or saw it.
    pub host: String,
    /// What it concerns: a volume, a host or a disk group.
    pub subject: String,
    /// What happened and why, in a sentence.
    pub message: String,
}

/// Why a component is to be reclaimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReclaimReason {
    /// Its snapshot was deleted while its host was out of reach.
    SnapshotDeleted,
    /// Its volume was deleted while its host was out of reach.
    VolumeDeleted,
    /// It left its volume's layout (or a snapshot's): a rebuild or an
    /// evacuation put another copy in its place, or a revert replaced it.
    Replaced,
}

impl fmt::Display for ReclaimReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReclaimReason::SnapshotDeleted => "snapshot deleted",
            ReclaimReason::VolumeDeleted => "volume deleted",
            ReclaimReason::Replaced => "replaced",
        })
    }
}

/// A component that no layout or snapshot record names any more, waiting
/// for its host to delete it and free its space. Written in the same
/// transaction that takes the component out of the last record naming it;
/// deleted by the component's host once the component is gone from its
/// store. Component ids are never reused, so deleting by id is safe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReclaimRecord {
    /// The host holding the component.
    pub host: HostId,
    /// Its disk group there.
    pub disk_group: DiskGroupId,
    /// The volume it belonged to.
    pub volume: VolumeId,
    /// The component.
    pub component: ComponentId,
    /// Bytes of address space it had (0 for a witness).
    pub size_bytes: u64,
    /// Why it is no longer needed.
    pub reason: ReclaimReason,
    /// When its deletion was scheduled (ms since the Unix epoch).
    pub scheduled_ms: u64,
}

impl ReclaimRecord {
    /// The record scheduling the deletion of `placement`, a component of
    /// `volume`.
    pub fn of(
        volume: &VolumeId,
        placement: &ComponentPlacement,
        reason: ReclaimReason,
        scheduled_ms: u64,
    ) -> ReclaimRecord {
        ReclaimRecord {
            host: placement.host.clone(),
            disk_group: placement.disk_group.clone(),
            volume: volume.clone(),
            component: placement.id,
            size_bytes: placement.size_bytes,
            reason,
            scheduled_ms,
        }
    }
}

/// A snapshot's name: 1 to 64 characters of letters, digits, `.`, `_` and
/// `-`, not starting with `.` (it is a directory key segment and part of
/// the export name `volume@snapshot`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SnapshotName(String);

impl SnapshotName {
    /// Checks `name`.
    pub fn new(name: &str) -> std::result::Result<SnapshotName, String> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && !name.starts_with('.')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if ok {
            Ok(SnapshotName(name.to_string()))
        } else {
            Err(format!(
                "snapshot name {name:?}: use 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'"
            ))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SnapshotName {
    type Error = String;
    fn try_from(s: String) -> std::result::Result<SnapshotName, String> {
        SnapshotName::new(&s)
    }
}

impl From<SnapshotName> for String {
    fn from(n: SnapshotName) -> String {
        n.0
    }
}

impl std::fmt::Display for SnapshotName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A snapshot of a volume: a crash-consistent point in time its owner took
/// on every data copy between two of its writes, and the components that
/// hold it (read-only, each on the disk group of the copy it was taken of).
/// Written by the owner that took it, under its epoch; removed by the
/// control plane when the snapshot is deleted, after its components.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRecord {
    /// The volume.
    pub volume: VolumeId,
    /// The snapshot's name, unique among the volume's snapshots.
    pub name: SnapshotName,
    /// Its number, unique in the cluster: each of its components' ids is
    /// made from it and the id of the copy it was taken of.
    pub id: u64,
    /// When it was taken (ms since the Unix epoch).
    pub created_ms: u64,
    /// The volume's size when it was taken.
    pub size_bytes: u64,
    /// The volume's logical block size.
    pub block_bytes: u32,
    /// The owner epoch that took it.
    pub epoch: Epoch,
    /// Its components: the volume's columns, each copy replaced by its
    /// snapshot, no witnesses.
    pub layout: Layout,
    /// The other volumes of its consistency group: their snapshots of the
    /// same name hold the same point in time. Empty for a snapshot of one
    /// volume.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group: Vec<VolumeId>,
}

/// Where a scheduled scrub pass of one disk group is: the next block it
/// checks (components in id order, each one's blocks in order). Written by
/// the host as the pass goes and removed when it ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrubPosition {
    /// The host.
    pub host: HostId,
    /// The disk group.
    pub disk_group: DiskGroupId,
    /// The component the pass is in.
    pub component: ComponentId,
    /// The next block of it to check.
    pub lba: u64,
}

/// Disk groups of one host being emptied before maintenance (vSAN's
/// maintenance mode with full data migration): nothing new is placed on
/// them, and each volume's owner moves its components off them one at a
/// time, copying each to its new place before the old one goes. Written
/// and removed by the control plane.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvacuationRecord {
    /// The host.
    pub host: HostId,
    /// Its disk groups being emptied.
    pub disk_groups: Vec<DiskGroupId>,
    /// When the evacuation was asked for (ms since the Unix epoch).
    pub started_ms: u64,
}

impl EvacuationRecord {
    /// Each disk group being evacuated, with its host.
    pub fn places(&self) -> impl Iterator<Item = (HostId, DiskGroupId)> + '_ {
        self.disk_groups
            .iter()
            .map(|dg| (self.host.clone(), dg.clone()))
    }
}

/// Cluster-wide settings a user may change. Every field has a default, so
/// a record written before a field existed still reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    /// The largest ratio of provisioned bytes (every copy of every volume at
    /// its full size) to the datastore's capacity that a new volume or a
    /// resize may bring the cluster to; beyond it the request is refused.
    #[serde(default = "default_max_overcommit_ratio")]
    pub max_overcommit_ratio: f64,
    /// Percent of the datastore's capacity in use at which the health
    /// check `DATASTORE_NEARLY_FULL` warns.
    #[serde(default = "default_nearly_full_pct")]
    pub nearly_full_pct: u8,
    /// Percent in use at which `DATASTORE_FULL` is raised as an error
    /// (thin volumes may soon fail writes).
    #[serde(default = "default_full_pct")]
    pub full_pct: u8,
    /// Bytes of RAM each host gives its read cache (the blocks of the
    /// volumes it owns). None: [`default_read_cache_bytes`] of the host's
    /// memory; 0 disables the cache. A host never gives it more than half
    /// its memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_cache_bytes: Option<u64>,
    /// Hours in which each host's scrubber verifies every stored block of
    /// its disk groups once (a pass is paced to take about that long); 0
    /// turns the scheduled scrub off.
    #[serde(default = "default_scrub_period_h")]
    pub scrub_period_h: u32,
    /// How much resync and rebuild yield to guest I/O on a busy owner, 1
    /// to [`RESYNC_DELAY_MULTIPLIER_MAX`] (vSAN's
    /// `DOMResyncDelayMultiplier`): they get 1/multiplier of one volume's
    /// share of the host's I/O scheduler. An idle host gives them all it
    /// has whatever the multiplier.
    #[serde(default = "default_resync_delay_multiplier")]
    pub resync_delay_multiplier: u32,
    /// Bytes of RAM each host gives its index caches (the metadata cache:
    /// the index pages of its disk groups, which map every volume's,
    /// snapshot's and clone's blocks; shared out evenly among its disk
    /// groups). None: each host's configured `index_cache_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_cache_bytes: Option<u64>,
    /// Address space whose index pages are read ahead after an index cache
    /// miss (vsanSparse's speculative prefetch); 0 turns read-ahead off.
    #[serde(default = "default_index_prefetch_bytes")]
    pub index_prefetch_bytes: u64,
    /// Seconds a component may stay absent (its host down, its disk group
    /// unreachable) before its volume's owner rebuilds it elsewhere, like
    /// vSAN's `ClomRepairDelay`; a host that returns sooner gets a delta
    /// resync instead. Applied live, also to components already absent.
    /// None: each host's configured `repair_delay_s` (60 minutes unless its
    /// configuration says otherwise); at most [`REPAIR_DELAY_MAX_S`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_delay_s: Option<u64>,
    /// Milliseconds a host that stops answering the directory keeps its
    /// volumes (its liveness lease's time to live): shorter fails over
    /// sooner, longer rides out longer pauses. Applied live: each host
    /// moves its keys to a lease of the new time to live without letting
    /// go of its volumes. None: each host's configured `lease_ttl_ms`;
    /// [`LEASE_TTL_MIN_MS`] to [`LEASE_TTL_MAX_MS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ttl_ms: Option<u64>,
    /// Whether iSCSI units offer COMPARE AND WRITE (VAAI ATS, the
    /// hardware-assisted lock; ESXi's `HardwareAcceleratedLocking`).
    #[serde(default = "offered")]
    pub vaai_ats: bool,
    /// Whether iSCSI units offer EXTENDED COPY (VAAI XCOPY, clones made by
    /// shared blocks; ESXi's `HardwareAcceleratedMove`).
    #[serde(default = "offered")]
    pub vaai_xcopy: bool,
    /// Whether iSCSI units offer WRITE SAME (VAAI block zeroing; ESXi's
    /// `HardwareAcceleratedInit`).
    #[serde(default = "offered")]
    pub vaai_write_same: bool,
    /// Whether iSCSI units offer UNMAP (VAAI space reclamation; ESXi's
    /// `EnableBlockDelete`). NBD's TRIM and WRITE_ZEROES are not affected.
    #[serde(default = "offered")]
    pub vaai_unmap: bool,
}

/// One host's own values of the settings that may differ per host (what a
/// host does with its memory, its disks and its iSCSI units); a setting it
/// has no value for follows [`ClusterSettings`]. The datastore's thresholds,
/// the overcommit limit and the repair delay are the cluster's alone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HostSettings {
    /// See [`ClusterSettings::read_cache_bytes`] (a number of bytes here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_cache_bytes: Option<u64>,
    /// See [`ClusterSettings::index_cache_bytes`] (a number of bytes here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_cache_bytes: Option<u64>,
    /// See [`ClusterSettings::index_prefetch_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_prefetch_bytes: Option<u64>,
    /// See [`ClusterSettings::scrub_period_h`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub_period_h: Option<u32>,
    /// See [`ClusterSettings::resync_delay_multiplier`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync_delay_multiplier: Option<u32>,
    /// See [`ClusterSettings::vaai_ats`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vaai_ats: Option<bool>,
    /// See [`ClusterSettings::vaai_xcopy`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vaai_xcopy: Option<bool>,
    /// See [`ClusterSettings::vaai_write_same`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vaai_write_same: Option<bool>,
    /// See [`ClusterSettings::vaai_unmap`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vaai_unmap: Option<bool>,
}

impl HostSettings {
    /// Whether the host has no value of its own (it follows the cluster in
    /// everything).
    pub fn is_empty(&self) -> bool {
        *self == HostSettings::default()
    }

    /// The names of the settings this host has its own values of.
    pub fn names(&self) -> Vec<&'static str> {
        let set = [
            self.read_cache_bytes.is_some(),
            self.index_cache_bytes.is_some(),
            self.index_prefetch_bytes.is_some(),
            self.scrub_period_h.is_some(),
            self.resync_delay_multiplier.is_some(),
            self.vaai_ats.is_some(),
            self.vaai_xcopy.is_some(),
            self.vaai_write_same.is_some(),
            self.vaai_unmap.is_some(),
        ];
        HOST_SETTING_NAMES
            .into_iter()
            .zip(set)
            .filter_map(|(name, set)| set.then_some(name))
            .collect()
    }
}

/// The settings a host may have its own value of, as [`HostSettings`]
/// names its fields.
pub const HOST_SETTING_NAMES: [&str; 9] = [
    "read_cache_bytes",
    "index_cache_bytes",
    "index_prefetch_bytes",
    "scrub_period_h",
    "resync_delay_multiplier",
    "vaai_ats",
    "vaai_xcopy",
    "vaai_write_same",
    "vaai_unmap",
];

impl ClusterSettings {
    /// The settings a host with `own` values follows: its values where it
    /// has them, the cluster's elsewhere.
    pub fn for_host(&self, own: &HostSettings) -> ClusterSettings {
        let mut s = self.clone();
        if let Some(b) = own.read_cache_bytes {
            s.read_cache_bytes = Some(b);
        }
        if let Some(b) = own.index_cache_bytes {
            s.index_cache_bytes = Some(b);
        }
        s.index_prefetch_bytes = own.index_prefetch_bytes.unwrap_or(s.index_prefetch_bytes);
        s.scrub_period_h = own.scrub_period_h.unwrap_or(s.scrub_period_h);
        s.resync_delay_multiplier = own
            .resync_delay_multiplier
            .unwrap_or(s.resync_delay_multiplier);
        s.vaai_ats = own.vaai_ats.unwrap_or(s.vaai_ats);
        s.vaai_xcopy = own.vaai_xcopy.unwrap_or(s.vaai_xcopy);
        s.vaai_write_same = own.vaai_write_same.unwrap_or(s.vaai_write_same);
        s.vaai_unmap = own.vaai_unmap.unwrap_or(s.vaai_unmap);
        s
    }
}

/// Default of the VAAI switches: every offload offered.
fn offered() -> bool {
    true
}

/// The shortest [`ClusterSettings::lease_ttl_ms`]: half a second.
pub const LEASE_TTL_MIN_MS: u64 = 500;

/// The longest [`ClusterSettings::lease_ttl_ms`]: five minutes.
pub const LEASE_TTL_MAX_MS: u64 = 300_000;

/// The longest [`ClusterSettings::repair_delay_s`]: a week.
pub const REPAIR_DELAY_MAX_S: u64 = 7 * 24 * 3600;

/// Default [`ClusterSettings::index_prefetch_bytes`]: 4 MiB.
pub fn default_index_prefetch_bytes() -> u64 {
    4 << 20
}

/// The largest [`ClusterSettings::index_prefetch_bytes`].
pub const INDEX_PREFETCH_MAX_BYTES: u64 = 256 << 20;

/// The smallest [`ClusterSettings::index_cache_bytes`].
pub const INDEX_CACHE_MIN_BYTES: u64 = 1 << 20;

/// Default [`ClusterSettings::resync_delay_multiplier`]: resync counts as
/// much as one busy volume.
pub fn default_resync_delay_multiplier() -> u32 {
    1
}

/// The largest [`ClusterSettings::resync_delay_multiplier`].
pub const RESYNC_DELAY_MULTIPLIER_MAX: u32 = 256;

/// Default [`ClusterSettings::scrub_period_h`]: every block once a week.
pub fn default_scrub_period_h() -> u32 {
    168
}

/// The longest [`ClusterSettings::scrub_period_h`]: a year.
pub const SCRUB_PERIOD_MAX_H: u32 = 8760;

/// Default [`ClusterSettings::max_overcommit_ratio`].
pub fn default_max_overcommit_ratio() -> f64 {
    4.0
}

/// Default [`ClusterSettings::nearly_full_pct`].
pub fn default_nearly_full_pct() -> u8 {
    80
}

/// Default [`ClusterSettings::full_pct`].
pub fn default_full_pct() -> u8 {
    95
}

/// The largest default read cache of a host (1 GiB).
pub const READ_CACHE_DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// The read cache of a host with `memory_bytes` of memory when
/// [`ClusterSettings::read_cache_bytes`] is not set: 0.4% of the memory,
/// at most [`READ_CACHE_DEFAULT_MAX_BYTES`], in whole 4 KiB blocks.
pub fn default_read_cache_bytes(memory_bytes: u64) -> u64 {
    let bytes = (memory_bytes / 1000 * 4).min(READ_CACHE_DEFAULT_MAX_BYTES);
    bytes - bytes % 4096
}

impl ClusterSettings {
    /// The read cache budget of a host with `memory_bytes` of memory: the
    /// setting, at most half the memory, or the default for that memory.
    pub fn read_cache_budget(&self, memory_bytes: u64) -> u64 {
        match self.read_cache_bytes {
            Some(bytes) => bytes.min(memory_bytes / 2),
            None => default_read_cache_bytes(memory_bytes),
        }
    }
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            max_overcommit_ratio: default_max_overcommit_ratio(),
            nearly_full_pct: default_nearly_full_pct(),
            full_pct: default_full_pct(),
            read_cache_bytes: None,
            index_cache_bytes: None,
            index_prefetch_bytes: default_index_prefetch_bytes(),
            scrub_period_h: default_scrub_period_h(),
            resync_delay_multiplier: default_resync_delay_multiplier(),
            repair_delay_s: None,
            lease_ttl_ms: None,
            vaai_ats: true,
            vaai_xcopy: true,
            vaai_write_same: true,
            vaai_unmap: true,
        }
    }
}

/// The volumes that clients of one host have open (NBD connections and
/// iSCSI sessions), kept under the host's lease so it vanishes with the host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentRecord {
    /// The host.
    pub host: HostId,
    /// Open volumes and how many clients have each open.
    pub volumes: std::collections::BTreeMap<VolumeId, u32>,
}

/// A CHAP user name and secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChapRecord {
    /// CHAP_N.
    pub user: String,
    /// The shared secret: sealed with the cluster's secrets key
    /// (`sealed-v1:...`, purpose [`chap_purpose`]) where the cluster has
    /// one, else as given.
    pub secret: String,
}

/// What a CHAP secret of `side` (`initiator` or `target`) is sealed for:
/// the same for every volume, so a renamed volume keeps its secrets.
pub fn chap_purpose(side: &str) -> String {
    format!("chap {side} secret")
}

impl fmt::Debug for ChapRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChapRecord")
            .field("user", &self.user)
            .field("secret", &"<hidden>")
            .finish()
    }
}

/// Who may use a volume, on both frontends and every host: its iSCSI
/// target (and its snapshots' targets) and its NBD export (and its
/// snapshots' exports). A record that names anyone (an initiator, a CHAP
/// user or an NBD client) admits nobody else on either frontend, loopback
/// included.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeAccessRecord {
    /// The volume.
    pub volume: VolumeId,
    /// Initiator names allowed in; empty admits every initiator unless the
    /// record names NBD clients.
    #[serde(default)]
    pub allowed_initiators: Vec<String>,
    /// What an initiator must prove (CHAP); none: no CHAP.
    #[serde(default)]
    pub initiator_chap: Option<ChapRecord>,
    /// What the target proves when the initiator asks (mutual CHAP).
    #[serde(default)]
    pub target_chap: Option<ChapRecord>,
    /// NBD clients admitted, by the name their TLS client certificate
    /// (signed by the cluster CA) proves.
    #[serde(default)]
    pub nbd_clients: Vec<String>,
    /// Where NBD clients without a client certificate may connect from,
    /// while the record names nobody.
    #[serde(default)]
    pub plain_nbd: PlainNbd,
}

impl VolumeAccessRecord {
    /// Whether the record names who may connect (then nobody else may).
    pub fn names_anyone(&self) -> bool {
        !self.allowed_initiators.is_empty()
            || self.initiator_chap.is_some()
            || !self.nbd_clients.is_empty()
    }
}

/// Where a volume admits NBD clients that prove no name (plain NBD, or TLS
/// without a client certificate).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum PlainNbd {
    /// Only from the serving host itself (127.0.0.0/8, ::1): what a local
    /// hypervisor or `tessera up`'s tools use.
    #[default]
    Loopback,
    /// From any address: for networks where every machine that can reach
    /// the hosts may use the volume.
    Anywhere,
    /// From nowhere: only clients with a certificate.
    Nowhere,
}

/// An I_T nexus as reservations name it: an initiator port and a relative
/// target port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NexusRecord {
    /// `<initiator name>,i,0x<ISID>`.
    pub initiator_port: String,
    /// Relative target port identifier (one per host).
    pub relative_port: u16,
}

/// One registration of a persistent reservation key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistrationRecord {
    /// Who registered.
    pub nexus: NexusRecord,
    /// The reservation key.
    pub key: u64,
}

/// The persistent reservation held on a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldReservationRecord {
    /// The nexus holding it.
    pub holder: NexusRecord,
    /// The SPC-5 reservation type code.
    pub type_code: u8,
}

/// A volume's SCSI reservations, shared by every host and path: whichever
/// host an initiator reaches sees the same registrations and holder.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationRecord {
    /// PRGENERATION.
    pub generation: u32,
    /// Registrations in registration order.
    pub registrations: Vec<RegistrationRecord>,
    /// The persistent reservation.
    #[serde(default)]
    pub reservation: Option<HeldReservationRecord>,
    /// The RESERVE(6) holder.
    #[serde(default)]
    pub legacy_holder: Option<NexusRecord>,
    /// APTPL as last registered.
    #[serde(default)]
    pub persist_through_power_loss: bool,
    /// The latest unit attentions every host raises for its nexuses.
    #[serde(default)]
    pub attentions: Vec<SharedAttentionRecord>,
}

/// A unit attention raised through one path for nexuses on every host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedAttentionRecord {
    /// Its place in the volume's sequence of attentions.
    pub sequence: u64,
    /// The nexus it is for; every nexus when absent.
    #[serde(default)]
    pub nexus: Option<NexusRecord>,
    /// The nexus it is not for.
    #[serde(default)]
    pub except: Option<NexusRecord>,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
}

/// Where a host can be reached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostAddresses {
    /// Host-to-host transport (component I/O, resync).
    pub transport: SocketAddr,
    /// NBD server.
    pub nbd: SocketAddr,
    /// iSCSI target portal.
    pub iscsi: SocketAddr,
    /// Management REST API.
    pub api: SocketAddr,
}

/// A disk group as the host's inventory lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostDiskGroup {
    /// Its identity.
    pub id: DiskGroupId,
    /// Bytes of capacity tier it offers.
    pub capacity_bytes: u64,
}

/// A host's inventory: who it is, where it lives and what it offers. Written
/// when the host registers; kept while the host is absent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    /// Its identity.
    pub id: HostId,
    /// The fault domain it belongs to.
    pub fault_domain: FaultDomainId,
    /// Where it listens.
    pub addresses: HostAddresses,
    /// Its disk groups.
    pub disk_groups: Vec<HostDiskGroup>,
    /// Holds witness components only (no data).
    #[serde(default)]
    pub witness_only: bool,
}

/// Present while a host is alive: attached to the host's session lease, so
/// it disappears when the host stops sending keep-alives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostLiveness {
    /// The host.
    pub host: HostId,
    /// The session lease the key is attached to.
    pub lease: LeaseId,
}

/// A fault domain: hosts that fail together.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultDomainRecord {
    /// Its identity.
    pub id: FaultDomainId,
    /// What it is, for people ("rack 3", "site B").
    #[serde(default)]
    pub description: String,
}

/// Health of a disk group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskGroupState {
    /// Serving I/O.
    Healthy,
    /// A device reports errors; components are being moved off.
    Degraded,
    /// Lost: its components are rebuilt elsewhere.
    Failed,
    /// Being emptied on request before removal.
    Evacuating,
}

/// A disk group's state and space.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskGroupRecord {
    /// The host it is on.
    pub host: HostId,
    /// Its identity.
    pub id: DiskGroupId,
    /// Its health.
    pub state: DiskGroupState,
    /// Bytes of capacity tier.
    pub capacity_bytes: u64,
    /// Bytes in use (unique blocks after dedup and compression, plus metadata).
    pub used_bytes: u64,
    /// Bytes promised to thick volumes but not yet written.
    #[serde(default)]
    pub reserved_bytes: u64,
    /// Components lost with a failed capacity device (every component of
    /// the group is lost when `state` is `Failed`); owners rebuild them
    /// elsewhere at once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_components: Vec<ComponentId>,
    /// Its encryption at rest; absent for a plaintext disk group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<DiskGroupEncryption>,
}

/// A disk group's encryption at rest, as its host reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiskGroupEncryption {
    /// The cipher ("aes-256-xts").
    pub cipher: String,
    /// Fingerprint of the key encryption key that seals its data key.
    pub kek_id: String,
    /// Generation of its data key: 1 when formatted, one more per deep
    /// rekey.
    pub generation: u32,
    /// The deep rekey under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rekey: Option<RekeyState>,
}

/// Progress of a deep rekey.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RekeyState {
    /// Bytes of the disk group's devices already under the new data key.
    pub done_bytes: u64,
    /// Bytes to rewrite in all.
    pub total_bytes: u64,
    /// Pace (0 while unknown).
    pub bytes_per_second: u64,
}

/// Where a volume is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeState {
    /// Its layout and components are being made.
    Creating,
    /// Usable.
    Ready,
    /// Its components are being removed.
    Deleting,
}

/// A volume: what a client attaches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// Its name (also the NBD export name).
    pub name: VolumeId,
    /// Size in bytes.
    pub size_bytes: u64,
    /// The storage policy it follows.
    pub policy: PolicyName,
    /// Where it is in its life.
    pub state: VolumeState,
    /// When it was created, in wall-clock milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// Bytes reserved up front (the policy's space reservation x size x
    /// copies); 0 for a thin volume.
    #[serde(default)]
    pub reserved_bytes: u64,
    /// Logical block size the frontends present: 512 (over 4 KiB physical
    /// blocks, "512e") or 4096 ("4Kn"). Records written before the choice
    /// existed are 512e.
    #[serde(default = "default_block_bytes")]
    pub block_bytes: u32,
    /// Set while the volume is a full clone being filled from a snapshot:
    /// its owner copies the snapshot into it, and no client is served
    /// until the fill ends and this is cleared (in the same write that
    /// records the fill's last position). Absent for every other volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fill: Option<VolumeFill>,
}

impl VolumeRecord {
    /// Whether clients may open the volume: it is ready and not being
    /// filled.
    pub fn serves_clients(&self) -> bool {
        self.state == VolumeState::Ready && self.fill.is_none()
    }
}

/// Where the fill of a full clone stands: which snapshot it copies, and
/// how far its owner got. Written by the control plane when the clone is
/// made (position 0), then only by the volume's owner under its epoch as
/// the copy goes (about once a second), and cleared by it once the whole
/// address space is copied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeFill {
    /// The volume whose snapshot is copied.
    pub source: VolumeId,
    /// The snapshot copied.
    pub snapshot: SnapshotName,
    /// The snapshot's id: one deleted and taken again under the same name
    /// is another snapshot, and is not read.
    pub snapshot_id: u64,
    /// The position: every byte of the address space below it is on every
    /// copy of the volume. A new owner continues from here.
    pub done_bytes: u64,
    /// Bytes of data copied below the position (unmapped ranges of the
    /// snapshot, and ranges reading as zeros, are skipped).
    #[serde(default)]
    pub copied_bytes: u64,
    /// The current run's pace: address space per second since it began.
    #[serde(default)]
    pub rate_bytes_per_s: u64,
    /// When the clone was made (ms since the Unix epoch).
    pub started_ms: u64,
    /// When the position was last recorded (ms since the Unix epoch).
    #[serde(default)]
    pub updated_ms: u64,
    /// Runs of the fill so far, the current one included: one per owner
    /// (or retry after a failure) that took it up.
    #[serde(default)]
    pub runs: u32,
    /// The position the current run began at (0 for the first).
    #[serde(default)]
    pub resumed_from_bytes: u64,
    /// Why the last attempt stopped, while a retry waits; cleared once the
    /// fill moves on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Logical block size of a volume that does not name one (512e).
pub fn default_block_bytes() -> u32 {
    512
}

/// Progress of bringing a component up to date.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncProgress {
    /// Bytes copied so far.
    pub bytes_done: u64,
    /// Bytes to copy in total.
    pub bytes_total: u64,
}

/// One component's state, as the volume's owner last recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentStateRecord {
    /// The volume.
    pub volume: VolumeId,
    /// The component.
    pub component: ComponentId,
    /// Its state.
    pub state: ComponentState,
    /// Bytes written while it was absent, waiting for a delta resync.
    #[serde(default)]
    pub dirty_bytes: u64,
    /// Resync progress while resyncing.
    #[serde(default)]
    pub resync: Option<ResyncProgress>,
    /// The owner epoch that wrote this record.
    pub epoch: Epoch,
    /// When it was written, in wall-clock milliseconds.
    pub updated_ms: u64,
}

/// A volume's owner: the host coordinating its I/O. Attached to the owner's
/// lease, so it disappears when the owner stops renewing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRecord {
    /// The volume.
    pub volume: VolumeId,
    /// The owning host.
    pub host: HostId,
    /// The owner's epoch: replicas reject writes from any lower epoch.
    pub epoch: Epoch,
    /// The lease the key is attached to.
    pub lease: LeaseId,
}

/// The highest epoch ever granted for a volume. Kept without a lease, so
/// epochs keep rising after an owner key vanished with its lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerEpochRecord {
    /// The volume.
    pub volume: VolumeId,
    /// The highest epoch granted.
    pub epoch: Epoch,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ks() -> Keyspace {
        Keyspace::new("lab").unwrap()
    }

    #[test]
    fn keys_have_the_documented_shape() {
        let v = VolumeId::new("db").unwrap();
        let h = HostId::new("h1").unwrap();
        assert_eq!(ks().volume(&v).as_str(), "/tessera/lab/volumes/db");
        assert_eq!(ks().owner(&v).as_str(), "/tessera/lab/owners/db");
        assert_eq!(
            ks().owner_epoch(&v).as_str(),
            "/tessera/lab/owner-epochs/db"
        );
        assert_eq!(ks().liveness(&h).as_str(), "/tessera/lab/liveness/h1");
        assert_eq!(
            ks().component_state(&v, ComponentId(7)).as_str(),
            "/tessera/lab/components/db/c0000000000000007"
        );
        assert_eq!(
            ks().disk_group(&h, &DiskGroupId::new("dg0").unwrap())
                .as_str(),
            "/tessera/lab/disk-groups/h1/dg0"
        );
        assert_eq!(
            ks().reclaim(&h, ComponentId(7)).as_str(),
            "/tessera/lab/reclaims/h1/c0000000000000007"
        );
        assert!(ks()
            .reclaim(&h, ComponentId(7))
            .as_str()
            .starts_with(ks().reclaims_of(&h).as_str()));
        assert!(Keyspace::new("a/b").is_err());
        assert!(Keyspace::new("").is_err());
    }

    proptest! {
        /// A per-parent prefix never matches the keys of a neighbour whose
        /// name merely starts with the same letters.
        #[test]
        fn prefixes_do_not_leak_into_neighbours(a in "[a-z][a-z0-9]{0,6}", b in "[a-z][a-z0-9]{0,6}", c in 0u64..1000) {
            prop_assume!(a != b);
            let va = VolumeId::new(a).unwrap();
            let vb = VolumeId::new(b).unwrap();
            let key = ks().component_state(&vb, ComponentId(c));
            prop_assert!(!key.as_str().starts_with(ks().component_states_of(&va).as_str()));
            prop_assert!(key.as_str().starts_with(ks().component_states_of(&vb).as_str()));
            prop_assert!(key.as_str().starts_with(ks().component_states().as_str()));
            prop_assert!(!ks().volume(&vb).as_str().starts_with(ks().layouts().as_str()));
        }
    }

    #[test]
    fn the_read_cache_setting_reads_old_records_and_resolves_per_host() {
        // A record written before the setting existed: the default.
        let old: ClusterSettings = serde_json::from_str(
            r#"{"max_overcommit_ratio":4.0,"nearly_full_pct":80,"full_pct":95}"#,
        )
        .unwrap();
        assert_eq!(old, ClusterSettings::default());
        // Unset, it is not written, so older hosts still read the record.
        let text = serde_json::to_string(&old).unwrap();
        assert!(!text.contains("read_cache_bytes"), "{text}");
        let gib = 1u64 << 30;
        // 0.4% of the memory in whole blocks, at most 1 GiB.
        assert_eq!(old.read_cache_budget(16 * gib), 68_718_592);
        assert_eq!(old.read_cache_budget(512 * gib), gib);
        assert_eq!(old.read_cache_budget(0), 0);
        let set = ClusterSettings {
            read_cache_bytes: Some(3 * gib),
            ..ClusterSettings::default()
        };
        let back: ClusterSettings =
            serde_json::from_str(&serde_json::to_string(&set).unwrap()).unwrap();
        assert_eq!(back, set);
        // Never more than half a host's memory; 0 disables.
        assert_eq!(set.read_cache_budget(64 * gib), 3 * gib);
        assert_eq!(set.read_cache_budget(4 * gib), 2 * gib);
        let off = ClusterSettings {
            read_cache_bytes: Some(0),
            ..ClusterSettings::default()
        };
        assert_eq!(off.read_cache_budget(64 * gib), 0);
        assert!(serde_json::from_str::<ClusterSettings>(r#"{"read_cache":1}"#).is_err());
    }

    #[test]
    fn reclaim_records_round_trip_and_refuse_unknown_fields() {
        let record = ReclaimRecord {
            host: HostId::new("h2").unwrap(),
            disk_group: DiskGroupId::new("dg0").unwrap(),
            volume: VolumeId::new("db").unwrap(),
            component: ComponentId(9),
            size_bytes: 1 << 20,
            reason: ReclaimReason::SnapshotDeleted,
            scheduled_ms: 5,
        };
        let text = String::from_utf8(encode("k", &record).unwrap()).unwrap();
        assert!(text.contains(r#""reason":"snapshot-deleted""#), "{text}");
        assert_eq!(
            decode::<ReclaimRecord>("k", text.as_bytes()).unwrap(),
            record
        );
        let extra = text.replacen('{', r#"{"why":"x","#, 1);
        assert!(decode::<ReclaimRecord>("k", extra.as_bytes()).is_err());
    }

    #[test]
    fn records_are_readable_json() {
        let record = VolumeRecord {
            name: VolumeId::new("db").unwrap(),
            size_bytes: 1 << 30,
            policy: PolicyName::new("default").unwrap(),
            state: VolumeState::Ready,
            created_ms: 5,
            reserved_bytes: 0,
            block_bytes: 512,
            fill: None,
        };
        let text = String::from_utf8(encode("k", &record).unwrap()).unwrap();
        assert!(!text.contains("fill"), "no fill, no field: {text}");
        assert!(text.contains(r#""state":"ready""#), "{text}");
        assert!(text.contains(r#""name":"db""#), "{text}");
        let back: VolumeRecord = decode("k", text.as_bytes()).unwrap();
        assert_eq!(back, record);
        // Optional fields may be missing in values written by older builds.
        let old = r#"{"name":"db","size_bytes":1,"policy":"p","state":"creating","created_ms":0}"#;
        let back: VolumeRecord = decode("k", old.as_bytes()).unwrap();
        assert_eq!(back.reserved_bytes, 0);
        match decode::<VolumeRecord>("/tessera/lab/volumes/db", b"{") {
            Err(DirectoryError::Decode { key, .. }) => assert_eq!(key, "/tessera/lab/volumes/db"),
            other => panic!("expected a decode error, got {other:?}"),
        }
    }
}
