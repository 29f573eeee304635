//! The control plane's vocabulary: what the REST API serves and the CLI
//! prints.
//!
//! Owns: the [`ClusterControl`] trait (every management operation a user can
//! ask for) and the JSON views it returns. The REST API is a thin mapping of
//! this trait to HTTP; the node implements it over the directory and the
//! hosts. Must not touch: HTTP details (they live in `api`).
//! Invariant: a refused operation changes nothing, and its [`ControlError`]
//! says why in words a user can act on.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tessera_types::layout::{ComponentRole, ComponentState};
use tessera_types::policy::Policy;
use tessera_types::{ComponentId, Epoch};

/// Overall health of a cluster or volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Health {
    /// Everything protected as the policies ask.
    Healthy,
    /// Serving I/O, but with less protection than asked (a copy absent or resyncing).
    Degraded,
    /// Not serving I/O (no quorum or no owner).
    Unavailable,
}

/// Capacity of the datastore or of one disk group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapacityView {
    /// Bytes the devices can hold.
    pub total_bytes: u64,
    /// Bytes used by data and metadata.
    pub used_bytes: u64,
    /// Bytes reserved for thick volumes but not yet written.
    pub reserved_bytes: u64,
    /// Bytes a new write can still use.
    pub free_bytes: u64,
}

/// One disk group as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskGroupView {
    /// Its id.
    pub id: String,
    /// "healthy", "degraded" or "failed: <reason>".
    pub health: String,
    /// Its space.
    pub capacity: CapacityView,
    /// Components stored on it.
    pub components: u64,
    /// Bytes its capacity devices hold: a block shared by several copies
    /// (EXTENDED COPY inside the datastore) counts once, where `used_bytes`
    /// counts it per copy (each may be overwritten and then needs a block
    /// of its own). Known for the hosts this control plane runs.
    #[serde(default)]
    pub physical_bytes: Option<u64>,
}

/// One host as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// A request to create a policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
}

fn one() -> u8 {
    1
}

/// A request to create a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResizeVolume {
    /// New size in bytes (growing only).
    pub size_bytes: u64,
}

/// A CHAP user name and secret, as the API takes them.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// A volume's iSCSI access settings, as shown (secrets never are).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// One volume as `volume list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// One component as `object show` prints it (like RVC's object info).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentView {
    /// Component id.
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// Offload counters of one volume, like esxtop's VAAI columns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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

/// A byte range where copies disagree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Divergence {
    /// Stripe column.
    pub column: usize,
    /// Byte offset inside the column's components.
    pub component_offset: u64,
    /// Length of the differing block run.
    pub len: u64,
    /// Components that were compared.
    pub components: Vec<ComponentId>,
}

/// The result of comparing all copies of a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Volume name.
    pub volume: String,
    /// True when every active copy holds the same bytes.
    pub identical: bool,
    /// Bytes compared per copy.
    pub compared_bytes: u64,
    /// Copies that were not compared (absent, resyncing) and why.
    pub skipped: Vec<String>,
    /// Where copies differ (first entries only).
    pub divergences: Vec<Divergence>,
}

/// A running or finished resync or rebuild.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncView {
    /// Volume.
    pub volume: String,
    /// Component being brought up to date.
    pub component: ComponentId,
    /// Its host.
    pub host: String,
    /// "resync" (delta after a host returned) or "rebuild" (new copy).
    pub kind: String,
    /// "running", "done" or "failed: <reason>".
    pub state: String,
    /// Bytes of dirty address space examined so far.
    pub done_bytes: u64,
    /// Bytes still to examine.
    pub left_bytes: u64,
    /// Bytes of data actually copied.
    pub copied_bytes: u64,
    /// Examination rate in bytes per second.
    pub rate_bytes_per_s: u64,
}

/// Everything `tessera status` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// Why a control operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
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
}

/// Every management operation, as the REST API exposes it.
#[async_trait]
pub trait ClusterControl: Send + Sync + 'static {
    /// Health, capacity, hosts, volumes, resyncs.
    async fn status(&self) -> Result<StatusView, ControlError>;
    /// Hosts with their disk groups.
    async fn hosts(&self) -> Result<Vec<HostView>, ControlError>;
    /// Creates a policy; refuses a duplicate name or out-of-range values.
    async fn create_policy(&self, request: CreatePolicy) -> Result<Policy, ControlError>;
    /// All policies.
    async fn policies(&self) -> Result<Vec<Policy>, ControlError>;
    /// Creates a volume: placement, components on their hosts, an owner.
    async fn create_volume(&self, request: CreateVolume) -> Result<VolumeView, ControlError>;
    /// All volumes.
    async fn volumes(&self) -> Result<Vec<VolumeView>, ControlError>;
    /// Grows a volume.
    async fn resize_volume(
        &self,
        name: &str,
        request: ResizeVolume,
    ) -> Result<VolumeView, ControlError>;
    /// Deletes a volume and its components.
    async fn delete_volume(&self, name: &str) -> Result<(), ControlError>;
    /// Sets who may log in to a volume's iSCSI target.
    async fn set_iscsi_access(
        &self,
        name: &str,
        access: IscsiAccess,
    ) -> Result<IscsiAccessView, ControlError>;
    /// Shows who may log in to a volume's iSCSI target.
    async fn iscsi_access(&self, name: &str) -> Result<IscsiAccessView, ControlError>;
    /// The component tree of a volume.
    async fn object(&self, name: &str) -> Result<ObjectView, ControlError>;
    /// Compares every active copy of a volume block by block.
    async fn verify_object(&self, name: &str) -> Result<VerifyReport, ControlError>;
    /// Resyncs and rebuilds, running and recent.
    async fn resyncs(&self) -> Result<Vec<ResyncView>, ControlError>;
    /// Stops one host's services, as a failure would (only in `tessera up`).
    async fn stop_host(&self, host: &str) -> Result<(), ControlError>;
    /// Starts a stopped host again (only in `tessera up`).
    async fn start_host(&self, host: &str) -> Result<(), ControlError>;
}

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
