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
//! - one target name per snapshot, its volume's target name, `:` and the
//!   snapshot's name escaped into the characters an iSCSI name may hold
//!   (see [`target_name_for_snapshot`]); volume names hold no `:`, so the
//!   first `:` after the prefix always separates the two, and
//!   [`parse_target_name`] gives back exactly the names that were encoded;
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

/// Separates a volume's name from its snapshot's in a snapshot's target
/// name. Volume names never hold it.
pub const SNAPSHOT_TARGET_SEPARATOR: char = ':';

/// Starts an escape in the snapshot part of a target name: `:` and a lower
/// case letter stand for that letter in upper case, `:-` for `_`.
const ESCAPE: char = ':';

/// The target name of snapshot `snapshot` of `volume`:
/// `iqn.2026-11.io.tessera:<volume>:<snapshot, escaped>`.
///
/// An iSCSI name holds only lower case letters, digits, `.`, `-` and `:`
/// (RFC 3722 folds case), while a snapshot's name may also hold upper case
/// letters and `_`. Those two are escaped with `:`, which snapshot names
/// never hold: `A`..`Z` becomes `:a`..`:z` and `_` becomes `:-`; every
/// other character stays, so a name of lower case letters, digits, `.` and
/// `-` reads as itself (`vm1@before-upgrade` is
/// `iqn.2026-11.io.tessera:vm1:before-upgrade`, `vm1@Nightly_2` is
/// `iqn.2026-11.io.tessera:vm1::nightly:-2`). At most 23 + 64 + 1 + 128 =
/// 216 bytes, within the 223 an iSCSI name may have.
pub fn target_name_for_snapshot(volume: &str, snapshot: &str) -> String {
    let mut name = target_name_for_volume(volume);
    name.push(SNAPSHOT_TARGET_SEPARATOR);
    for c in snapshot.chars() {
        match c {
            'A'..='Z' => {
                name.push(ESCAPE);
                name.push(c.to_ascii_lowercase());
            }
            '_' => {
                name.push(ESCAPE);
                name.push('-');
            }
            c => name.push(c),
        }
    }
    name
}

/// What a target name names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamedTarget {
    /// A volume, by its name as the initiator spelled it (initiators may
    /// fold case: match it without regard to case).
    Volume(String),
    /// A snapshot of a volume.
    Snapshot {
        /// The volume's name as the initiator spelled it (match it without
        /// regard to case).
        volume: String,
        /// The snapshot's name, exactly (its escapes decoded).
        snapshot: String,
    },
}

/// The volume or snapshot `name` stands for (see
/// [`target_name_for_volume`] and [`target_name_for_snapshot`]); `None`
/// when it is not a name this scheme makes: another prefix, an empty part,
/// a character an escaped snapshot name never holds, or an unknown escape.
pub fn parse_target_name(name: &str) -> Option<NamedTarget> {
    let prefix = name.get(..TARGET_NAME_PREFIX.len())?;
    if !prefix.eq_ignore_ascii_case(TARGET_NAME_PREFIX) {
        return None;
    }
    let rest = &name[TARGET_NAME_PREFIX.len()..];
    let Some((volume, escaped)) = rest.split_once(SNAPSHOT_TARGET_SEPARATOR) else {
        return (!rest.is_empty()).then(|| NamedTarget::Volume(rest.to_string()));
    };
    if volume.is_empty() || escaped.is_empty() {
        return None;
    }
    // Case folded by the initiator or not, the escaped part means the same:
    // it is made of lower case characters only.
    let escaped = escaped.to_ascii_lowercase();
    let mut snapshot = String::with_capacity(escaped.len());
    let mut chars = escaped.chars();
    while let Some(c) = chars.next() {
        match c {
            ESCAPE => match chars.next()? {
                '-' => snapshot.push('_'),
                l @ 'a'..='z' => snapshot.push(l.to_ascii_uppercase()),
                _ => return None,
            },
            'a'..='z' | '0'..='9' | '.' | '-' => snapshot.push(c),
            _ => return None,
        }
    }
    Some(NamedTarget::Snapshot {
        volume: volume.to_string(),
        snapshot,
    })
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
    /// Initiators allowed in.
    pub initiators: Initiators,
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
            .field("initiators", &self.initiators)
            .finish_non_exhaustive()
    }
}

impl TargetEntry {
    /// Whether `initiator` may log in.
    pub fn admits(&self, initiator: &str) -> bool {
        match &self.initiators {
            Initiators::Any => true,
            Initiators::Only(names) => names.iter().any(|a| a.eq_ignore_ascii_case(initiator)),
        }
    }
}

/// Which initiators may log in to a target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Initiators {
    /// Every initiator (CHAP, when set, still applies).
    #[default]
    Any,
    /// Only these names (compared without case); nobody when empty, e.g.
    /// a volume whose access record admits only NBD clients.
    Only(Vec<String>),
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
    /// Why `name`, a target the catalog knows but does not serve now, is
    /// refused: a login to it is answered "service unavailable" (the
    /// initiator may retry later) rather than "target not found", and the
    /// reason is logged. None for a name it does not know.
    fn refusal(&self, _name: &str) -> Option<String> {
        None
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn snapshot(volume: &str, snapshot: &str) -> Option<NamedTarget> {
        Some(NamedTarget::Snapshot {
            volume: volume.into(),
            snapshot: snapshot.into(),
        })
    }

    #[test]
    fn snapshot_names_an_iscsi_name_can_hold_read_as_themselves() {
        assert_eq!(
            target_name_for_snapshot("vm1", "before-upgrade.2"),
            "iqn.2026-11.io.tessera:vm1:before-upgrade.2"
        );
        assert_eq!(
            target_name_for_snapshot("vm1", "Nightly_2"),
            "iqn.2026-11.io.tessera:vm1::nightly:-2"
        );
        assert_eq!(
            parse_target_name("iqn.2026-11.io.tessera:vm1:before-upgrade.2"),
            snapshot("vm1", "before-upgrade.2")
        );
        assert_eq!(
            parse_target_name("IQN.2026-11.IO.TESSERA:VM1::NIGHTLY:-2"),
            snapshot("VM1", "Nightly_2")
        );
        assert_eq!(
            parse_target_name("iqn.2026-11.io.tessera:Vm_1"),
            Some(NamedTarget::Volume("Vm_1".into()))
        );
    }

    #[test]
    fn names_the_scheme_never_makes_name_nothing() {
        for name in [
            "iqn.2026-11.io.tessera:",
            "iqn.2026-11.io.tessera::snap",
            "iqn.2026-11.io.tessera:vm:",
            "iqn.2026-11.io.tessera:vm:a:",
            "iqn.2026-11.io.tessera:vm:a:1",
            "iqn.2026-11.io.tessera:vm:a::",
            "iqn.2026-11.io.tessera:vm:a_b",
            "iqn.2026-11.io.tessera:vm:a@b",
            "iqn.2026-11.io.other:vm",
            "iqn.2026-11",
        ] {
            assert_eq!(parse_target_name(name), None, "{name}");
        }
    }

    proptest! {
        #[test]
        fn every_snapshot_name_round_trips_through_a_valid_iscsi_name(
            volume in "[A-Za-z0-9][A-Za-z0-9._-]{0,63}",
            name in "[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}",
        ) {
            let target = target_name_for_snapshot(&volume, &name);
            prop_assert!(target.len() <= 223);
            let (_, escaped) = target[TARGET_NAME_PREFIX.len()..].split_once(':').unwrap();
            prop_assert!(escaped
                .chars()
                .all(|c| matches!(c, 'a'..='z' | '0'..='9' | '.' | '-' | ':')));
            prop_assert_eq!(parse_target_name(&target), snapshot(&volume, &name));
            // Initiators may fold the whole name to lower case.
            prop_assert_eq!(
                parse_target_name(&target.to_ascii_lowercase()),
                snapshot(&volume.to_ascii_lowercase(), &name)
            );
        }
    }
}
