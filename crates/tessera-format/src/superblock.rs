//! The superblock: blocks 0 and 1 of every device of a disk group (two copies,
//! so one bad block does not orphan a device).
//!
//! It names the disk group (a random 128-bit identity plus its name), the
//! device's role and index, and where the device's areas lie. Written when
//! the disk group is formatted. A plaintext group's superblocks are never
//! rewritten; an encrypted group's carry its wrapped data key and the state
//! of a rekey, and are rewritten when those change: copy 1 first, synced,
//! then copy 0, each with a higher [`Superblock::sequence`], so a torn write
//! leaves the other copy and readers take the sound copy with the highest
//! sequence.

use crate::{seal, unseal, FormatError, Header, Reader, Writer, BLOCK, FORMAT_VERSION};
use crate::{HEADER_BYTES, MAGIC_SUPERBLOCK};

/// What a device does in its disk group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceRole {
    /// Holds the write log and the checkpoints.
    Cache,
    /// Holds data blocks and index pages.
    Capacity,
}

impl DeviceRole {
    fn code(self) -> u16 {
        match self {
            DeviceRole::Cache => 1,
            DeviceRole::Capacity => 2,
        }
    }
}

/// Longest disk group name stored (matches `tessera_types::NAME_BYTES_MAX`).
pub const GROUP_NAME_BYTES_MAX: usize = 64;

/// Decoded superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Random identity of the disk group, shared by all its devices.
    pub group_uuid: u128,
    /// Disk group name.
    pub group_name: String,
    /// Role of this device.
    pub role: DeviceRole,
    /// Index of this device in the group (0 = cache, 1.. = capacity).
    pub device_index: u8,
    /// Devices in the group.
    pub device_count: u8,
    /// Bytes of the device when formatted.
    pub device_bytes: u64,
    /// Cache device: first block of the metadata (checkpoint) area.
    pub meta_start: u64,
    /// Cache device: blocks of each of the two checkpoint slots.
    pub meta_slot_blocks: u64,
    /// Cache device: first block of the write log.
    pub log_start: u64,
    /// Cache device: blocks of the write log.
    pub log_blocks: u64,
    /// Capacity device: first block of the data area.
    pub data_start: u64,
    /// Capacity device: blocks of the data area.
    pub data_blocks: u64,
    /// Feature bits the group was formatted with ([`FEATURE_ENCRYPTED`];
    /// dedup and compression will set bits here).
    pub features: u64,
    /// Bumped at every rewrite of an encrypted group's superblocks.
    pub sequence: u64,
    /// Set when the group's blocks are encrypted at rest (with
    /// [`FEATURE_ENCRYPTED`] in `features`).
    pub encryption: Option<SuperblockEncryption>,
}

/// Feature bit: every block of the device except the two superblocks is
/// encrypted (see [`SuperblockEncryption`]).
pub const FEATURE_ENCRYPTED: u64 = 1;

/// Feature bits this build knows; a superblock with others is refused.
const FEATURES_KNOWN: u64 = FEATURE_ENCRYPTED;

/// Cipher code of AES-256 in XTS mode over 4 KiB data units, the tweak being
/// the device's index (high 64 bits) and the block number (low 64 bits).
pub const CIPHER_AES256_XTS: u16 = 1;

/// Bytes of a data key: two AES-256 keys (XTS).
pub const DATA_KEY_BYTES: usize = 64;

/// Bytes of a data key sealed by a key encryption key (AES-256-GCM: the key
/// and a 16-byte tag).
pub const SEALED_KEY_BYTES: usize = DATA_KEY_BYTES + 16;

/// A data key sealed by a key encryption key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrappedKey {
    /// Which key encryption key sealed it (a fingerprint, not the key).
    pub kek_id: [u8; 8],
    /// The sealing nonce.
    pub nonce: [u8; 12],
    /// The sealed data key.
    pub sealed: [u8; SEALED_KEY_BYTES],
}

/// Blocks of the device being rewritten under the next key, saved as they
/// were in the rekey journal area before the rewrite began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RekeyJournal {
    /// First block of the device saved.
    pub start: u64,
    /// Blocks saved (at most the journal area).
    pub blocks: u64,
    /// CRC32C of the saved blocks as stored.
    pub crc: u32,
}

/// How an encrypted device's blocks are encrypted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuperblockEncryption {
    /// [`CIPHER_AES256_XTS`].
    pub cipher: u16,
    /// Generation of `key`: 1 at format, one more at each deep rekey.
    pub generation: u32,
    /// The group's data key.
    pub key: WrappedKey,
    /// During a deep rekey, the next data key (generation + 1): blocks of
    /// this device below `rekey_cursor` are encrypted with it.
    pub next: Option<WrappedKey>,
    /// See `next`.
    pub rekey_cursor: u64,
    /// First block of the rekey journal area (at the device's end, outside
    /// every other area).
    pub journal_start: u64,
    /// Blocks of the rekey journal area.
    pub journal_blocks: u64,
    /// Set while a piece of the device is being rewritten.
    pub journal: Option<RekeyJournal>,
}

const STRUCTURE: &str = "superblock";

impl Superblock {
    /// Encodes into one block.
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = vec![0u8; BLOCK];
        let name = self.group_name.as_bytes();
        let name_len = name.len().min(GROUP_NAME_BYTES_MAX);
        let length = {
            let mut w = Writer::at(&mut buf, HEADER_BYTES);
            w.u128(self.group_uuid);
            w.u8(self.device_index);
            w.u8(self.device_count);
            w.u8(name_len as u8);
            w.u8(0);
            let mut padded = [0u8; GROUP_NAME_BYTES_MAX];
            padded[..name_len].copy_from_slice(&name[..name_len]);
            w.bytes(&padded);
            for v in [
                self.device_bytes,
                self.meta_start,
                self.meta_slot_blocks,
                self.log_start,
                self.log_blocks,
                self.data_start,
                self.data_blocks,
                self.features,
            ] {
                w.u64(v);
            }
            if let Some(e) = &self.encryption {
                w.u16(e.cipher);
                w.u16(0);
                w.u32(e.generation);
                encode_key(&mut w, Some(&e.key));
                encode_key(&mut w, e.next.as_ref());
                w.u64(e.rekey_cursor);
                w.u64(e.journal_start);
                w.u64(e.journal_blocks);
                let j = e.journal.unwrap_or(RekeyJournal {
                    start: 0,
                    blocks: 0,
                    crc: 0,
                });
                w.u8(e.journal.is_some() as u8);
                w.u8(0);
                w.u16(0);
                w.u32(j.crc);
                w.u64(j.start);
                w.u64(j.blocks);
            }
            w.pos()
        };
        seal(
            &mut buf,
            Header {
                magic: MAGIC_SUPERBLOCK,
                version: FORMAT_VERSION,
                kind: self.role.code(),
                length: length as u32,
                crc: 0,
                seq: self.sequence,
            },
        );
        buf
    }

    /// Decodes and checks one block.
    pub fn decode(buf: &[u8]) -> Result<Superblock, FormatError> {
        let header = unseal(buf, MAGIC_SUPERBLOCK, STRUCTURE)?;
        let role = match header.kind {
            1 => DeviceRole::Cache,
            2 => DeviceRole::Capacity,
            other => {
                return Err(FormatError::Invalid {
                    structure: STRUCTURE,
                    problem: format!("unknown device role {other}"),
                })
            }
        };
        let mut r = Reader::at(&buf[..header.length as usize], HEADER_BYTES);
        let group_uuid = r.u128();
        let device_index = r.u8();
        let device_count = r.u8();
        let name_len = (r.u8() as usize).min(GROUP_NAME_BYTES_MAX);
        r.u8();
        let name = r.bytes(GROUP_NAME_BYTES_MAX);
        let group_name = String::from_utf8_lossy(&name[..name_len.min(name.len())]).into_owned();
        let short = || FormatError::BadLength {
            structure: STRUCTURE,
            length: header.length as u64,
            available: buf.len() as u64,
        };
        if r.remaining() < 8 * 8 {
            return Err(short());
        }
        let mut sb = Superblock {
            group_uuid,
            group_name,
            role,
            device_index,
            device_count,
            device_bytes: r.u64(),
            meta_start: r.u64(),
            meta_slot_blocks: r.u64(),
            log_start: r.u64(),
            log_blocks: r.u64(),
            data_start: r.u64(),
            data_blocks: r.u64(),
            features: r.u64(),
            sequence: header.seq,
            encryption: None,
        };
        if sb.features & !FEATURES_KNOWN != 0 {
            return Err(FormatError::Invalid {
                structure: STRUCTURE,
                problem: format!(
                    "unknown feature bits {:#x}; a newer build formatted this device",
                    sb.features & !FEATURES_KNOWN
                ),
            });
        }
        if sb.features & FEATURE_ENCRYPTED != 0 {
            if r.remaining() < ENCRYPTION_BYTES {
                return Err(short());
            }
            let cipher = r.u16();
            r.u16();
            let generation = r.u32();
            let key = decode_key(&mut r).ok_or_else(|| FormatError::Invalid {
                structure: STRUCTURE,
                problem: "encrypted, but holds no data key".into(),
            })?;
            let next = decode_key(&mut r);
            let rekey_cursor = r.u64();
            let journal_start = r.u64();
            let journal_blocks = r.u64();
            let journaled = r.u8() != 0;
            r.u8();
            r.u16();
            let crc = r.u32();
            let start = r.u64();
            let blocks = r.u64();
            if cipher != CIPHER_AES256_XTS {
                return Err(FormatError::Invalid {
                    structure: STRUCTURE,
                    problem: format!("unknown cipher {cipher}"),
                });
            }
            if journaled && blocks > journal_blocks {
                return Err(FormatError::Invalid {
                    structure: STRUCTURE,
                    problem: format!(
                        "rekey journal of {blocks} blocks exceeds its area of {journal_blocks}"
                    ),
                });
            }
            sb.encryption = Some(SuperblockEncryption {
                cipher,
                generation,
                key,
                next,
                rekey_cursor,
                journal_start,
                journal_blocks,
                journal: journaled.then_some(RekeyJournal { start, blocks, crc }),
            });
        }
        Ok(sb)
    }
}

/// Bytes of the encryption fields after the version 1 fields.
const ENCRYPTION_BYTES: usize = 8 + 2 * (1 + 8 + 12 + SEALED_KEY_BYTES) + 3 * 8 + 8 + 2 * 8;

fn encode_key(w: &mut Writer<'_>, key: Option<&WrappedKey>) {
    match key {
        Some(k) => {
            w.u8(1);
            w.bytes(&k.kek_id);
            w.bytes(&k.nonce);
            w.bytes(&k.sealed);
        }
        None => {
            w.u8(0);
            w.bytes(&[0u8; 8 + 12 + SEALED_KEY_BYTES]);
        }
    }
}

fn decode_key(r: &mut Reader<'_>) -> Option<WrappedKey> {
    let present = r.u8() != 0;
    let mut k = WrappedKey {
        kek_id: [0; 8],
        nonce: [0; 12],
        sealed: [0; SEALED_KEY_BYTES],
    };
    k.kek_id.copy_from_slice(r.bytes(8));
    k.nonce.copy_from_slice(r.bytes(12));
    k.sealed.copy_from_slice(r.bytes(SEALED_KEY_BYTES));
    present.then_some(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plaintext capacity device's superblock.
    fn capacity_device() -> Superblock {
        Superblock {
            group_uuid: 0x1234_5678_9abc_def0_1122_3344_5566_7788,
            group_name: "dg-a".into(),
            role: DeviceRole::Capacity,
            device_index: 2,
            device_count: 3,
            device_bytes: 1 << 30,
            meta_start: 0,
            meta_slot_blocks: 0,
            log_start: 0,
            log_blocks: 0,
            data_start: 2,
            data_blocks: (1 << 18) - 2,
            features: 0,
            sequence: 0,
            encryption: None,
        }
    }

    #[test]
    fn round_trips() {
        let sb = capacity_device();
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
    }

    #[test]
    fn an_encrypted_superblock_round_trips_with_its_rekey_state() {
        let key = |b: u8| WrappedKey {
            kek_id: [b; 8],
            nonce: [b + 1; 12],
            sealed: [b + 2; SEALED_KEY_BYTES],
        };
        let mut sb = Superblock {
            group_uuid: 7,
            group_name: "dg-e".into(),
            role: DeviceRole::Cache,
            device_index: 0,
            device_count: 2,
            device_bytes: 1 << 30,
            meta_start: 2,
            meta_slot_blocks: 10,
            log_start: 22,
            log_blocks: 1000,
            data_start: 0,
            data_blocks: 0,
            features: FEATURE_ENCRYPTED,
            sequence: 9,
            encryption: Some(SuperblockEncryption {
                cipher: CIPHER_AES256_XTS,
                generation: 3,
                key: key(1),
                next: None,
                rekey_cursor: 0,
                journal_start: 1022,
                journal_blocks: 256,
                journal: None,
            }),
        };
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        let e = sb.encryption.as_mut().unwrap();
        e.next = Some(key(50));
        e.rekey_cursor = 4000;
        e.journal = Some(RekeyJournal {
            start: 3744,
            blocks: 256,
            crc: 0xdead_beef,
        });
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
    }

    #[test]
    fn unknown_features_and_oversized_journals_are_refused() {
        let mut sb = Superblock {
            features: 1 << 9,
            sequence: 1,
            ..capacity_device()
        };
        assert!(Superblock::decode(&sb.encode()).is_err());
        sb.features = FEATURE_ENCRYPTED;
        sb.encryption = Some(SuperblockEncryption {
            cipher: CIPHER_AES256_XTS,
            generation: 1,
            key: WrappedKey {
                kek_id: [1; 8],
                nonce: [2; 12],
                sealed: [3; SEALED_KEY_BYTES],
            },
            next: None,
            rekey_cursor: 0,
            journal_start: 102,
            journal_blocks: 16,
            journal: Some(RekeyJournal {
                start: 2,
                blocks: 17,
                crc: 0,
            }),
        });
        assert!(Superblock::decode(&sb.encode()).is_err());
    }
}
