//! Wire versions: the enum is the changelog of the protocol.
//!
//! Owns: which versions this build speaks and how two hosts pick one.
//! Invariant: a version, once released, never changes meaning; a change to
//! any message layout adds a variant here with a line saying what changed,
//! and the decoder keeps reading every version in [`VersionRange::SUPPORTED`].

use std::fmt;

use crate::WireError;

/// A released layout of the host-to-host messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u16)]
pub enum WireVersion {
    /// First version: handshake, component operations with epochs, volume
    /// operations forwarded to the owner, ping.
    V1 = 1,
    /// Adds `CloneBlocks` (one host shares stored blocks between two of its
    /// components, moving no data) and the `NotColocated` error kind that
    /// answers it.
    V2 = 2,
    /// Adds `VolumeRepairCopy` (the owner rewrites a copy's bad blocks,
    /// found by its host's scrubber, from another copy).
    V3 = 3,
    /// Adds `SnapshotComponent` (a read-only point-in-time copy of a
    /// component sharing its stored blocks) and `CloneSnapshot` (a writable
    /// linked clone of such a snapshot), both made on the disk group of the
    /// component they are made from, and `VolumeSnapshot` (the owner takes
    /// a snapshot of a volume on every copy and records it).
    V4 = 4,
    /// Adds `Changed` (the blocks where one component differs from another
    /// of the same disk group, read from the index pages they do not share),
    /// so a rebuilt copy receives each snapshot as what changed since the
    /// one before; and `VolumeHoldWrites`, `VolumeReleaseWrites` and
    /// `VolumeSnapshotHeld`, with which one point in time is taken across
    /// several volumes (a consistency group).
    V5 = 5,
}

impl WireVersion {
    /// The newest version this build speaks.
    pub const CURRENT: WireVersion = WireVersion::V5;
    /// The oldest version this build still speaks.
    pub const OLDEST: WireVersion = WireVersion::V1;

    /// The number carried in frame headers.
    pub fn number(self) -> u16 {
        self as u16
    }

    /// The version with this number, if this build knows it.
    pub fn from_number(number: u16) -> Result<WireVersion, WireError> {
        match number {
            1 => Ok(WireVersion::V1),
            2 => Ok(WireVersion::V2),
            3 => Ok(WireVersion::V3),
            4 => Ok(WireVersion::V4),
            5 => Ok(WireVersion::V5),
            other => Err(WireError::UnsupportedVersion {
                version: other,
                supported: VersionRange::SUPPORTED,
            }),
        }
    }
}

impl fmt::Display for WireVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "wire v{}", self.number())
    }
}

/// The versions one host speaks, both ends inclusive. A peer may announce
/// versions this build has never heard of; only the overlap matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VersionRange {
    /// Oldest version spoken.
    pub min: u16,
    /// Newest version spoken.
    pub max: u16,
}

impl VersionRange {
    /// What this build speaks.
    pub const SUPPORTED: VersionRange = VersionRange {
        min: WireVersion::OLDEST as u16,
        max: WireVersion::CURRENT as u16,
    };

    /// The newest version both ranges contain, or an error naming both ranges
    /// so that the operator sees which host needs upgrading.
    pub fn negotiate(self, theirs: VersionRange) -> Result<WireVersion, WireError> {
        let low = self.min.max(theirs.min);
        let high = self.max.min(theirs.max);
        if low > high || self.min > self.max || theirs.min > theirs.max {
            return Err(WireError::NoCommonVersion { ours: self, theirs });
        }
        // Walk down from the newest common number to one this build knows;
        // bounded by the width of the overlap (at most u16::MAX steps, in
        // practice one).
        let mut candidate = high;
        loop {
            if let Ok(version) = WireVersion::from_number(candidate) {
                return Ok(version);
            }
            if candidate == low {
                return Err(WireError::NoCommonVersion { ours: self, theirs });
            }
            candidate -= 1;
        }
    }
}

impl fmt::Display for VersionRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}..=v{}", self.min, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_newest_common_version() {
        let ours = VersionRange::SUPPORTED;
        let theirs = VersionRange { min: 1, max: 9 };
        assert_eq!(ours.negotiate(theirs).unwrap(), WireVersion::CURRENT);
    }

    #[test]
    fn refuses_disjoint_ranges_naming_both() {
        let ours = VersionRange::SUPPORTED;
        let theirs = VersionRange { min: 7, max: 9 };
        let err = ours.negotiate(theirs).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("v7..=v9"), "{text}");
        assert!(text.contains("v1..=v5"), "{text}");
    }

    #[test]
    fn an_older_peer_gets_the_older_version() {
        let theirs = VersionRange { min: 1, max: 1 };
        assert_eq!(
            VersionRange::SUPPORTED.negotiate(theirs).unwrap(),
            WireVersion::V1
        );
    }

    #[test]
    fn refuses_inverted_range() {
        let theirs = VersionRange { min: 1, max: 0 };
        assert!(VersionRange::SUPPORTED.negotiate(theirs).is_err());
    }
}
