//! Identifier and unit newtypes shared by every Tessera layer.
//!
//! Owns: the words of the storage domain as types (hosts, volumes, components,
//! disk groups, epochs, block addresses) and the geometry constants every
//! layer agrees on. Must not touch: I/O, clocks, randomness, async runtimes.
//! Invariant: a value of one of these types means one thing everywhere; there
//! is no second spelling of "a 4 KiB block address" in the code base.

use serde::{Deserialize, Serialize};
use std::fmt;

pub mod checksum;
pub mod dirty;
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
        #[derive(
            Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
            schemars::JsonSchema,
        )]
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

impl ComponentId {
    /// The id of snapshot number `snapshot` of this component: a fixed mix
    /// of the two (63 bits, like every component id), so every host names
    /// a snapshot's components alike without asking anyone.
    pub fn snapshot(self, snapshot: u64) -> ComponentId {
        // SplitMix64's finaliser over both: neighbouring numbers land far
        // apart, so a snapshot's id collides with no copy's in practice.
        let mut z = self.0 ^ snapshot.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ComponentId((z ^ (z >> 31)) >> 1)
    }
}

impl fmt::Display for ComponentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{:016x}", self.0)
    }
}

/// An owner epoch: raised each time ownership of an object moves. Replicas
/// refuse writes from an epoch lower than the highest they have seen, so a
/// stale owner can never overwrite its successor's data.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
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

/// Units [`parse_size`] reads, as (suffix, power of two). Binary, and
/// case-insensitive: `K`, `KB` and `KiB` all mean 1024 bytes.
const SIZE_UNITS: [(&str, u32); 14] = [
    ("", 0),
    ("b", 0),
    ("k", 10),
    ("kb", 10),
    ("kib", 10),
    ("m", 20),
    ("mb", 20),
    ("mib", 20),
    ("g", 30),
    ("gb", 30),
    ("gib", 30),
    ("t", 40),
    ("tb", 40),
    ("tib", 40),
];

/// Parses a human size such as `10G`, `512MiB`, `4096` (bytes) or `1.5T`
/// into a byte count.
///
/// The number is a whole number or a decimal fraction (`1.5`, never `.5`
/// or `1.`), the unit one of `K`, `M`, `G`, `T` (binary: `K` = 1024; `KB`,
/// `KiB` and `B` suffixes are read too, in any case). The arithmetic is
/// exact, on the decimal digits as typed: `1.5G` is 1610612736 bytes, and a
/// value that is not a whole number of bytes (`1.5`, `0.1K` = 102.4 bytes)
/// is refused rather than rounded. Zero is a size (callers that need a
/// positive one say so); a negative size or one beyond `u64::MAX` bytes is
/// refused. Each refusal is its own [`SizeError`] naming what was typed.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let typed = || text.to_string();
    let t = text.trim();
    if let Some(rest) = t.strip_prefix('-') {
        // A readable size after the sign: say what is wrong with it, which
        // is the sign; anything else is simply unreadable.
        return match parse_size(rest) {
            Err(SizeError::Unreadable(_) | SizeError::Negative(_)) => {
                Err(SizeError::Unreadable(typed()))
            }
            _ => Err(SizeError::Negative(typed())),
        };
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    // Digits before a point, and digits after it if there is one.
    let well_formed = !whole.is_empty()
        && (!number.contains('.') || !fraction.is_empty())
        && !fraction.contains('.');
    let unit = unit.trim().to_ascii_lowercase();
    let shift = SIZE_UNITS
        .iter()
        .find(|(suffix, _)| *suffix == unit)
        .map(|&(_, shift)| shift);
    let Some(shift) = shift.filter(|_| well_formed) else {
        return Err(SizeError::Unreadable(typed()));
    };
    // The typed digits as one integer, least significant digit first, times
    // the unit: the value is this integer scaled down by 10^(fraction digits).
    let mut digits: Vec<u8> = whole
        .bytes()
        .chain(fraction.bytes())
        .rev()
        .map(|b| b - b'0')
        .collect();
    let mut carry: u64 = 0;
    for digit in &mut digits {
        // digit * 2^40 + carry stays far below u64::MAX: carry < 2^40.
        let v = u64::from(*digit) * (1u64 << shift) + carry;
        *digit = (v % 10) as u8;
        carry = v / 10;
    }
    while carry > 0 {
        digits.push((carry % 10) as u8);
        carry /= 10;
    }
    let (fraction_digits, whole_digits) = digits.split_at(fraction.len());
    // Too large first: a size beyond the largest is wrong whatever its fraction.
    let whole_bytes = whole_digits.iter().rev().try_fold(0u64, |acc, &d| {
        acc.checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(d)))
            .ok_or_else(|| SizeError::TooLarge(typed()))
    })?;
    if fraction_digits.iter().any(|&d| d != 0) {
        // Least significant first: drop the trailing zeros, then reverse.
        let significant: Vec<u8> = fraction_digits
            .iter()
            .copied()
            .skip_while(|&d| d == 0)
            .collect();
        let fraction_text: String = significant
            .iter()
            .rev()
            .map(|&d| char::from(b'0' + d))
            .collect();
        return Err(SizeError::NotWholeBytes {
            typed: typed(),
            bytes: format!("{whole_bytes}.{fraction_text}"),
            has_unit: shift > 0,
        });
    }
    Ok(whole_bytes)
}

/// Why [`parse_size`] refused a size; each names the text as typed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Not a number with an optional unit.
    #[error("cannot read {0:?} as a size: use a number with an optional binary unit K, M, G or T (K = 1024), e.g. 4096, 512K, 10G or 1.5T")]
    Unreadable(String),
    /// A minus sign in front.
    #[error("{0:?}: a size cannot be negative")]
    Negative(String),
    /// More bytes than a `u64` holds.
    #[error("{0:?} is too large: the largest size is {max} bytes (16 EiB less one byte)", max = u64::MAX)]
    TooLarge(String),
    /// A fraction that does not come to a whole number of bytes.
    #[error("{typed:?} is {bytes} bytes, not a whole number of bytes{}", if *.has_unit {
        "; write it in a smaller unit or in bytes"
    } else {
        "; a fraction needs a unit K, M, G or T, e.g. 1.5G"
    })]
    NotWholeBytes {
        /// The size as typed.
        typed: String,
        /// Its exact value in bytes, as a decimal fraction.
        bytes: String,
        /// Whether a unit was given (a fraction of bytes has none).
        has_unit: bool,
    },
}

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
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("10 GiB").unwrap(), 10 << 30);
        assert_eq!(parse_size("256MiB").unwrap(), 256 << 20);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert_eq!(parse_size("1.5G").unwrap(), 1_610_612_736);
        assert_eq!(parse_size("1.5T").unwrap(), 3 << 39);
        assert_eq!(
            parse_size("1.50000000000000000000000000000000000000000G").unwrap(),
            1_610_612_736,
            "trailing zeros of the fraction change nothing"
        );
        assert_eq!(
            parse_size("0.0009765625K").unwrap(),
            1,
            "2^-10 K is one byte"
        );
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert_eq!(parse_size("16777215T").unwrap(), u64::MAX - ((1 << 40) - 1));
    }

    #[test]
    fn unreadable_sizes_name_the_forms() {
        for text in [
            "ten", "10X", "", " ", "G", ".5G", "1.G", "1.2.3", "1e3", "+5G", "--5",
        ] {
            let e = parse_size(text).expect_err(text);
            assert_eq!(e, SizeError::Unreadable(text.to_string()), "{text:?}");
            assert!(
                e.to_string().contains("e.g. 4096, 512K, 10G or 1.5T"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_negative_size_says_so() {
        for text in ["-5G", "-1", "-0.5K", " -5G"] {
            let e = parse_size(text).expect_err(text);
            assert_eq!(e, SizeError::Negative(text.to_string()));
        }
        assert_eq!(
            parse_size("-5G").unwrap_err().to_string(),
            "\"-5G\": a size cannot be negative"
        );
    }

    #[test]
    fn an_overflowing_size_names_the_largest() {
        for text in [
            "18446744073709551616",
            "99999999T",
            "16777216T",
            "17179869184G",
            "99999999.1T",
            "999999999999999999999999999999999999999999",
        ] {
            let e = parse_size(text).expect_err(text);
            assert_eq!(e, SizeError::TooLarge(text.to_string()));
        }
        assert_eq!(
            parse_size("99999999T").unwrap_err().to_string(),
            "\"99999999T\" is too large: the largest size is 18446744073709551615 bytes (16 EiB less one byte)"
        );
    }

    #[test]
    fn a_fraction_of_a_byte_is_refused_with_the_exact_value() {
        let e = parse_size("1.5").unwrap_err();
        assert_eq!(
            e.to_string(),
            "\"1.5\" is 1.5 bytes, not a whole number of bytes; a fraction needs a unit K, M, G or T, e.g. 1.5G"
        );
        let e = parse_size("0.1K").unwrap_err();
        assert_eq!(
            e.to_string(),
            "\"0.1K\" is 102.4 bytes, not a whole number of bytes; write it in a smaller unit or in bytes"
        );
        assert!(matches!(
            parse_size("1.1G"),
            Err(SizeError::NotWholeBytes { bytes, .. }) if bytes == "1181116006.4"
        ));
        assert!(matches!(
            parse_size("0.00000000000000000000000000000000000000000001T"),
            Err(SizeError::NotWholeBytes { bytes, .. }) if bytes.starts_with("0.000000000000000000000000000000010995")
        ));
    }

    /// `bytes` written exactly in the unit 2^shift: the whole units, then
    /// the remainder as a terminating decimal fraction (2^-shift has
    /// `shift` decimal digits).
    fn exact_decimal(bytes: u64, shift: u32) -> String {
        let whole = bytes >> shift;
        let mask = (1u64 << shift) - 1;
        let mut rest = bytes & mask;
        if rest == 0 {
            return whole.to_string();
        }
        let mut fraction = String::new();
        while rest != 0 {
            rest *= 10;
            fraction.push(char::from(b'0' + (rest >> shift) as u8));
            rest &= mask;
        }
        format!("{whole}.{fraction}")
    }

    const UNITS: [(&str, u32); 5] = [("", 0), ("K", 10), ("M", 20), ("G", 30), ("T", 40)];

    proptest! {
        #[test]
        fn an_exact_decimal_in_any_unit_parses_back_to_the_same_bytes(
            bytes in any::<u64>(),
            unit in 0usize..UNITS.len(),
        ) {
            let (suffix, shift) = UNITS[unit];
            let text = format!("{}{suffix}", exact_decimal(bytes, shift));
            prop_assert_eq!(parse_size(&text), Ok(bytes), "{}", text);
        }

        #[test]
        fn a_whole_count_of_units_is_exact_or_too_large(
            count in any::<u64>(),
            unit in 0usize..UNITS.len(),
        ) {
            let (suffix, shift) = UNITS[unit];
            let text = format!("{count}{suffix}");
            let expected = count
                .checked_mul(1 << shift)
                .ok_or(SizeError::TooLarge(text.clone()));
            prop_assert_eq!(parse_size(&text), expected);
        }

        #[test]
        fn what_format_size_prints_for_halves_parses_back(
            units in 1u64..1024,
            half in any::<bool>(),
            unit in 1usize..UNITS.len(),
        ) {
            // What `tessera volume list` prints ("2.5 GiB") is accepted as a
            // size when it is exact, as whole and half units are.
            let (_, shift) = UNITS[unit];
            let bytes = (units << shift) + if half { 1 << (shift - 1) } else { 0 };
            let printed = format_size(bytes);
            prop_assert_eq!(parse_size(&printed), Ok(bytes), "{}", printed);
        }

        #[test]
        fn any_text_is_parsed_or_refused_without_panicking(text in ".{0,40}") {
            let _ = parse_size(&text);
        }
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
