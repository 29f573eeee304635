//! Identifier and unit newtypes shared by every Tessera layer.
//!
//! Owns: the words of the storage domain as types (hosts, volumes, components,
//! disk groups, epochs, block addresses) and the geometry constants every
//! layer agrees on. Must not touch: I/O, clocks, randomness, async runtimes.
//! Invariant: a value of one of these types means one thing everywhere; there
//! is no second spelling of "a 4 KiB block address" in the code base.

use serde::{Deserialize, Serialize};
use std::fmt;

pub mod layout;
pub mod policy;

/// Bytes in one store block: the unit of allocation, checksumming and resync.
/// 4 KiB matches the page size of guests and of the capacity devices.
pub const BLOCK_BYTES: u64 = 4096;

/// Bytes in one logical sector as the frontends advertise it (512e): the
/// smallest write a client may issue.
pub const SECTOR_BYTES: u64 = 512;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            /// Wraps a name, checking that it is usable as a key component.
            pub fn new(name: impl Into<String>) -> Result<Self, NameError> {
                let name = name.into();
                validate_name(&name, $prefix)?;
                Ok(Self(name))
            }

            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

id_type!(
    /// A host: one `tessera node` daemon with its local devices.
    HostId,
    "host"
);
id_type!(
    /// A volume: a named block device that clients attach over NBD or iSCSI.
    VolumeId,
    "volume"
);
id_type!(
    /// A disk group: one cache device plus capacity devices on one host.
    DiskGroupId,
    "disk group"
);
id_type!(
    /// A fault domain: hosts that fail together (a rack, a site).
    FaultDomainId,
    "fault domain"
);
id_type!(
    /// A storage policy by name.
    PolicyName,
    "policy"
);

/// Names are used as directory keys, NBD export names and iSCSI target
/// suffixes, so they are limited to characters all three accept.
pub const NAME_BYTES_MAX: usize = 64;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Empty names cannot be addressed.
    #[error("{kind} name must not be empty")]
    Empty {
        /// What was being named.
        kind: &'static str,
    },
    /// Longer than [`NAME_BYTES_MAX`].
    #[error("{kind} name {name:?} is longer than {max} bytes", max = NAME_BYTES_MAX)]
    TooLong {
        /// What was being named.
        kind: &'static str,
        /// The refused name.
        name: String,
    },
    /// Contains a character outside `[A-Za-z0-9._-]` or starts with `.`/`-`.
    #[error("{kind} name {name:?} may contain only letters, digits, '.', '_' and '-', and must start with a letter or digit")]
    BadCharacter {
        /// What was being named.
        kind: &'static str,
        /// The refused name.
        name: String,
    },
}

fn validate_name(name: &str, kind: &'static str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { kind });
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(NameError::TooLong {
            kind,
            name: name.to_string(),
        });
    }
    let first_ok = name.as_bytes()[0].is_ascii_alphanumeric();
    let all_ok = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if !first_ok || !all_ok {
        return Err(NameError::BadCharacter {
            kind,
            name: name.to_string(),
        });
    }
    Ok(())
}

/// A component: one piece of an object (replica, stripe member, witness) on
/// one disk group. Numbered per object; the pair (volume, index) is unique
/// cluster-wide and a rebuilt component gets a new number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ComponentId(pub u64);

impl fmt::Display for ComponentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{:016x}", self.0)
    }
}

/// An owner epoch: raised each time ownership of an object moves. Replicas
/// refuse writes from an epoch lower than the highest they have seen, so a
/// stale owner can never overwrite its successor's data.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The epoch that follows this one.
    pub fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {}", self.0)
    }
}

/// A block address in units of [`BLOCK_BYTES`] within one component or volume.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Lba(pub u64);

impl Lba {
    /// The block that holds byte `offset`.
    pub fn containing(offset: u64) -> Lba {
        Lba(offset / BLOCK_BYTES)
    }

    /// The byte offset of the first byte of this block.
    pub fn byte_offset(self) -> u64 {
        self.0 * BLOCK_BYTES
    }
}

impl fmt::Display for Lba {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LBA {}", self.0)
    }
}

/// Parses a human size such as `10G`, `512MiB`, `4096` (bytes) or `1.5T`.
/// Binary units: `K` = 1024.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(SizeError(text.to_string()));
    }
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(SizeError(text.to_string())),
    };
    let value: f64 = num.parse().map_err(|_| SizeError(text.to_string()))?;
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 / 2.0 {
        return Err(SizeError(text.to_string()));
    }
    Ok(bytes as u64)
}

/// A size that [`parse_size`] could not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read {0:?} as a size: use a number with an optional unit K, M, G or T (binary), e.g. 10G")]
pub struct SizeError(pub String);

/// Formats a byte count for people: `1.5 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_are_checked() {
        assert!(VolumeId::new("vm-disk.01").is_ok());
        assert!(matches!(VolumeId::new(""), Err(NameError::Empty { .. })));
        assert!(matches!(
            VolumeId::new("-x"),
            Err(NameError::BadCharacter { .. })
        ));
        assert!(matches!(
            VolumeId::new("a/b"),
            Err(NameError::BadCharacter { .. })
        ));
        assert!(matches!(
            VolumeId::new("a".repeat(65)),
            Err(NameError::TooLong { .. })
        ));
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("256MiB").unwrap(), 256 << 20);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert!(parse_size("ten").is_err());
        assert!(parse_size("10X").is_err());
        assert!(parse_size("").is_err());
    }

    proptest! {
        #[test]
        fn lba_round_trips(offset in 0u64..(1 << 50)) {
            let lba = Lba::containing(offset);
            prop_assert!(lba.byte_offset() <= offset);
            prop_assert!(offset - lba.byte_offset() < BLOCK_BYTES);
        }
    }
}
