//! The superblock: blocks 0 and 1 of every device of a disk group (two copies,
//! so one bad block does not orphan a device).
//!
//! It names the disk group (a random 128-bit identity plus its name), the
//! device's role and index, and where the device's areas lie. Written once
//! when the disk group is formatted; never rewritten in place afterwards.

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
    /// Feature bits the group was formatted with (none defined in version 1;
    /// dedup and compression will set bits here).
    pub features: u64,
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
                seq: 0,
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
        if r.remaining() < 8 * 8 {
            return Err(FormatError::BadLength {
                structure: STRUCTURE,
                length: header.length as u64,
                available: buf.len() as u64,
            });
        }
        Ok(Superblock {
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
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let sb = Superblock {
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
        };
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
    }
}
