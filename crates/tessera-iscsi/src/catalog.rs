//! Where targets come from.
//!
//! Owns: the [`TargetCatalog`] trait through which a host plugs targets in
//! and out of the iSCSI server at run time, what a target carries (its SCSI
//! device, the portals every host serves it on, its access list and CHAP
//! secrets), and [`StaticCatalog`], a map for tests, benchmarks and single
//! device servers.
//! Must not touch: volumes, components or the cluster; a catalog hands out
//! [`ScsiTarget`]s and names, nothing else.
//! Invariants:
//! - one target name per volume, `iqn.2026-11.io.tessera:<volume>` (see
//!   [`target_name_for_volume`]), with its data on LUN 0, the same on every
//!   host, so the name survives restarts and a multipath initiator sees one
//!   target through every host's portal;
//! - an empty access list admits every initiator; a non-empty one admits
//!   exactly the names it lists.

use crate::scsi::ScsiTarget;
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Prefix of every target name: a naming authority the project owns,
/// dated when the scheme was fixed (RFC 7143 section 4.2.7.2).
pub const TARGET_NAME_PREFIX: &str = "iqn.2026-11.io.tessera:";

/// The target name of a volume.
pub fn target_name_for_volume(volume: &str) -> String {
    format!("{TARGET_NAME_PREFIX}{volume}")
}

/// One portal a target can be reached through: a host's address and the
/// portal group tag it serves the target under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetPortal {
    /// `host:port` (IPv6 in brackets), as SendTargets advertises it.
    pub address: String,
    /// Target portal group tag (one group per host).
    pub portal_group_tag: u16,
}

/// A user name and secret for one direction of CHAP.
#[derive(Clone, PartialEq, Eq)]
pub struct ChapSecret {
    /// CHAP_N.
    pub user: String,
    /// The shared secret (at least 12 bytes recommended by RFC 7143).
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for ChapSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapSecret")
            .field("user", &self.user)
            .field("secret", &"<hidden>")
            .finish()
    }
}

/// CHAP settings of a target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChapCredentials {
    /// What an initiator must prove; `None` means CHAP is not required.
    pub initiator: Option<ChapSecret>,
    /// What the target proves when the initiator asks (mutual CHAP).
    pub target: Option<ChapSecret>,
}

/// Everything the server needs about one target.
#[derive(Clone)]
pub struct TargetEntry {
    /// The iSCSI name.
    pub name: String,
    /// TargetAlias, if any.
    pub alias: Option<String>,
    /// The SCSI target device.
    pub device: Arc<dyn ScsiTarget>,
    /// Every portal the target is served on (every host's), for SendTargets.
    pub portals: Vec<TargetPortal>,
    /// The portal group tag of this server's portal.
    pub portal_group_tag: u16,
    /// The relative target port of this server's portal (1-based, one per
    /// host), handed to the SCSI side in every nexus.
    pub relative_port: u16,
    /// Initiator names allowed in; empty admits everyone.
    pub allowed_initiators: Vec<String>,
    /// CHAP settings.
    pub chap: ChapCredentials,
    /// Kept alive while a session logged in to the target lasts, and
    /// dropped with it: the catalog's way to know who uses a target (e.g. a
    /// count of a volume's clients). The server never looks inside.
    pub session_hold: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for TargetEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetEntry")
            .field("name", &self.name)
            .field("portals", &self.portals)
            .field("relative_port", &self.relative_port)
            .field("allowed_initiators", &self.allowed_initiators)
            .finish_non_exhaustive()
    }
}

impl TargetEntry {
    /// Whether `initiator` may log in.
    pub fn admits(&self, initiator: &str) -> bool {
        self.allowed_initiators.is_empty()
            || self
                .allowed_initiators
                .iter()
                .any(|a| a.eq_ignore_ascii_case(initiator))
    }
}

/// The set of targets a server offers. Asked at every login and discovery,
/// so a change is visible to the next one.
pub trait TargetCatalog: Send + Sync + 'static {
    /// Target names, in the order SendTargets lists them.
    fn target_names(&self) -> Vec<String>;
    /// The target called `name`.
    fn target(&self, name: &str) -> Option<TargetEntry>;
    /// CHAP settings of discovery sessions (default: none required).
    fn discovery_chap(&self) -> ChapCredentials {
        ChapCredentials::default()
    }
}

/// A catalog held in memory; targets can be added and removed while the
/// server runs.
#[derive(Default)]
pub struct StaticCatalog {
    targets: RwLock<BTreeMap<String, TargetEntry>>,
    discovery_chap: RwLock<ChapCredentials>,
}

impl StaticCatalog {
    /// An empty catalog.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a target.
    pub fn insert(&self, entry: TargetEntry) {
        self.targets.write().insert(entry.name.clone(), entry);
    }

    /// Removes a target; sessions already logged in keep their device.
    pub fn remove(&self, name: &str) -> Option<TargetEntry> {
        self.targets.write().remove(name)
    }

    /// Sets the CHAP settings of discovery sessions.
    pub fn set_discovery_chap(&self, chap: ChapCredentials) {
        *self.discovery_chap.write() = chap;
    }
}

impl TargetCatalog for StaticCatalog {
    fn target_names(&self) -> Vec<String> {
        self.targets.read().keys().cloned().collect()
    }

    fn target(&self, name: &str) -> Option<TargetEntry> {
        // iSCSI names compare case-insensitively (they are stringprep'd to
        // lower case by initiators, RFC 3722).
        let targets = self.targets.read();
        targets.get(name).cloned().or_else(|| {
            targets
                .values()
                .find(|t| t.name.eq_ignore_ascii_case(name))
                .cloned()
        })
    }

    fn discovery_chap(&self) -> ChapCredentials {
        self.discovery_chap.read().clone()
    }
}
