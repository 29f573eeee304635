//! On-disk encodings of Tessera's component store.
//!
//! Owns: the byte layout of every structure the store keeps on a device (the
//! superblock, the write-log record header, the index page, the checkpoint,
//! a snapshot's root table),
//! their common header (magic, format version, length, CRC32C, sequence) and
//! the CRC32C of data blocks. Must not touch: I/O, clocks, async runtimes;
//! callers hand in and get back byte buffers.
//!
//! Invariants:
//! - Every stored structure starts with a [`Header`]: a magic that names the
//!   structure, the format version that wrote it, its length in bytes and a
//!   CRC32C over those bytes (with the CRC field itself taken as zero). A
//!   decoder refuses a buffer whose magic, version, length or CRC is wrong, so a
//!   torn, misdirected or bit-flipped structure is never taken for a good one.
//! - Data blocks are never interpreted here: their CRC32C lives outside the
//!   block (in the log record header and in the index entry), so a block that
//!   lands in the wrong place is caught when it is read through its index.
//! - Versions only grow. Fields that later features need (dedup reference
//!   counts, compressed lengths) already have room: the index entry carries
//!   a kind and a stored length, the checkpoint carries feature flags per
//!   component (snapshots use them: a family and a root table), and readers
//!   refuse versions newer than they know.

use std::fmt;
use tessera_types::checksum::{crc32c, crc32c_append};

pub mod checkpoint;
pub mod index;
pub mod log;
pub mod roots;
pub mod superblock;

pub use checkpoint::{Checkpoint, ComponentRecord, PageRoot, RootTableRef};
pub use index::{EntryKind, IndexEntry, IndexPage, INDEX_ENTRIES};
pub use log::{LogEntry, LogOp, LogRecordHeader, LOG_ENTRIES_MAX};
pub use roots::{root_table_blocks, RootTableBlock, ROOTS_PER_BLOCK};
pub use superblock::{
    DeviceRole, RekeyJournal, Superblock, SuperblockEncryption, WrappedKey, CIPHER_AES256_XTS,
    DATA_KEY_BYTES, FEATURE_ENCRYPTED, SEALED_KEY_BYTES,
};

/// Bytes in one block: the unit of every device area, of allocation and of
/// checksumming. Equal to `tessera_types::BLOCK_BYTES`.
pub const BLOCK: usize = 4096;

/// The format version this code writes. Readers accept every version up to
/// this one.
pub const FORMAT_VERSION: u16 = 2;

/// Bytes of the common header at the start of every stored structure.
pub const HEADER_BYTES: usize = 32;

/// Magic of the superblock (block 0 and 1 of every device).
pub const MAGIC_SUPERBLOCK: u64 = u64::from_le_bytes(*b"TSSUPERB");
/// Magic of a checkpoint in the metadata area of the cache device.
pub const MAGIC_CHECKPOINT: u64 = u64::from_le_bytes(*b"TSCKPOIN");
/// Magic of an index page on a capacity device.
pub const MAGIC_INDEX_PAGE: u64 = u64::from_le_bytes(*b"TSINDEXP");
/// Magic of a block of a snapshot's root table on a capacity device.
pub const MAGIC_ROOT_TABLE: u64 = u64::from_le_bytes(*b"TSROOTTB");
/// Magic of a write-log record header on the cache device.
pub const MAGIC_LOG_RECORD: u64 = u64::from_le_bytes(*b"TSLOGREC");

/// Why a buffer could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The buffer does not hold the expected structure (never written, or
    /// something else landed there).
    #[error("bad magic: expected {expected}, found {found:#018x}")]
    BadMagic {
        /// Name of the expected structure.
        expected: &'static str,
        /// The magic found.
        found: u64,
    },
    /// Written by a newer Tessera.
    #[error("{structure} has format version {found}; this build reads up to {supported}")]
    UnsupportedVersion {
        /// Name of the structure.
        structure: &'static str,
        /// Version found on disk.
        found: u16,
        /// Newest version this build reads.
        supported: u16,
    },
    /// The recorded length does not fit the buffer or the structure.
    #[error("{structure} has bad length {length} (buffer holds {available} bytes)")]
    BadLength {
        /// Name of the structure.
        structure: &'static str,
        /// Length recorded in the header.
        length: u64,
        /// Bytes available.
        available: u64,
    },
    /// The CRC32C does not match: torn or corrupted.
    #[error("{structure} checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum {
        /// Name of the structure.
        structure: &'static str,
        /// CRC recorded in the header.
        stored: u32,
        /// CRC computed over the bytes.
        computed: u32,
    },
    /// A field holds a value no writer produces.
    #[error("{structure}: {problem}")]
    Invalid {
        /// Name of the structure.
        structure: &'static str,
        /// What is wrong.
        problem: String,
    },
}

/// The common header of every stored structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Names the structure.
    pub magic: u64,
    /// Format version of the writer.
    pub version: u16,
    /// Structure-specific kind (the device role, for a superblock).
    pub kind: u16,
    /// Bytes covered by the CRC, header included.
    pub length: u32,
    /// CRC32C over `length` bytes with this field read as zero.
    pub crc: u32,
    /// A sequence number: checkpoint generation, log record sequence, index
    /// page generation.
    pub seq: u64,
}

const CRC_OFFSET: usize = 16;

/// CRC32C of a data block, as stored in log entries and index entries.
pub fn block_crc(data: &[u8]) -> u32 {
    crc32c(data)
}

fn structure_crc(buf: &[u8]) -> u32 {
    let head = crc32c(&buf[..CRC_OFFSET]);
    let zeros = crc32c_append(head, &[0u8; 4]);
    crc32c_append(zeros, &buf[CRC_OFFSET + 4..])
}

/// Writes `header` into `buf[..HEADER_BYTES]` and seals `buf[..header.length]`
/// with its CRC32C. `buf` must be at least `header.length` bytes.
pub fn seal(buf: &mut [u8], mut header: Header) {
    let length = header.length as usize;
    let mut w = Writer::new(&mut buf[..HEADER_BYTES]);
    w.u64(header.magic);
    w.u16(header.version);
    w.u16(header.kind);
    w.u32(header.length);
    w.u32(0);
    w.u32(0);
    w.u64(header.seq);
    header.crc = structure_crc(&buf[..length]);
    buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&header.crc.to_le_bytes());
}

/// Reads and checks the header at the start of `buf`: magic, version, length
/// and CRC32C.
pub fn unseal(buf: &[u8], magic: u64, structure: &'static str) -> Result<Header, FormatError> {
    if buf.len() < HEADER_BYTES {
        return Err(FormatError::BadLength {
            structure,
            length: HEADER_BYTES as u64,
            available: buf.len() as u64,
        });
    }
    let mut r = Reader::new(&buf[..HEADER_BYTES]);
    let header = Header {
        magic: r.u64(),
        version: r.u16(),
        kind: r.u16(),
        length: r.u32(),
        crc: r.u32(),
        seq: {
            r.u32();
            r.u64()
        },
    };
    if header.magic != magic {
        return Err(FormatError::BadMagic {
            expected: structure,
            found: header.magic,
        });
    }
    if header.version == 0 || header.version > FORMAT_VERSION {
        return Err(FormatError::UnsupportedVersion {
            structure,
            found: header.version,
            supported: FORMAT_VERSION,
        });
    }
    let length = header.length as usize;
    if length < HEADER_BYTES || length > buf.len() {
        return Err(FormatError::BadLength {
            structure,
            length: header.length as u64,
            available: buf.len() as u64,
        });
    }
    let computed = structure_crc(&buf[..length]);
    if computed != header.crc {
        return Err(FormatError::BadChecksum {
            structure,
            stored: header.crc,
            computed,
        });
    }
    Ok(header)
}

/// A physical block address: which device of the disk group (0 is the cache
/// device, 1.. the capacity devices) and which block on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BlockLoc {
    /// Device index within the disk group.
    pub device: u8,
    /// Block number on that device (from the device's start).
    pub block: u64,
}

/// Largest block number a [`BlockLoc`] packs (48 bits: 1 EiB of 4 KiB blocks).
pub const BLOCK_NUMBER_MAX: u64 = (1 << 48) - 1;

impl BlockLoc {
    /// Packs into 64 bits: device in the top byte, block in the low 48 bits;
    /// bits 48..56 are left for the caller (`flags`).
    pub fn pack(self, flags: u8) -> u64 {
        ((self.device as u64) << 56) | ((flags as u64) << 48) | (self.block & BLOCK_NUMBER_MAX)
    }

    /// Unpacks what [`BlockLoc::pack`] made, with its flags.
    pub fn unpack(raw: u64) -> (BlockLoc, u8) {
        (
            BlockLoc {
                device: (raw >> 56) as u8,
                block: raw & BLOCK_NUMBER_MAX,
            },
            (raw >> 48) as u8,
        )
    }
}

impl fmt::Display for BlockLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {} block {}", self.device, self.block)
    }
}

/// Little-endian writer over a byte slice. Panics only if the caller's own
/// layout arithmetic is wrong (never on data read from a device).
pub(crate) struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }
    pub(crate) fn at(buf: &'a mut [u8], pos: usize) -> Self {
        Writer { buf, pos }
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }
    pub(crate) fn u8(&mut self, v: u8) {
        self.bytes(&[v]);
    }
    pub(crate) fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    pub(crate) fn u128(&mut self, v: u128) {
        self.bytes(&v.to_le_bytes());
    }
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }
}

/// Little-endian reader over a byte slice whose length the caller checked.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    pub(crate) fn at(buf: &'a [u8], pos: usize) -> Self {
        Reader { buf, pos }
    }
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        if self.pos + N <= self.buf.len() {
            out.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        }
        self.pos += N;
        out
    }
    pub(crate) fn bytes(&mut self, n: usize) -> &'a [u8] {
        let end = (self.pos + n).min(self.buf.len());
        let start = self.pos.min(end);
        self.pos += n;
        &self.buf[start..end]
    }
    pub(crate) fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    pub(crate) fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    pub(crate) fn u128(&mut self) -> u128 {
        u128::from_le_bytes(self.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_flipped_bit_is_caught(len in HEADER_BYTES..512usize, seed: u64, bit in 0usize..4096) {
            let mut buf = vec![0u8; len];
            for (i, b) in buf.iter_mut().enumerate().skip(HEADER_BYTES) {
                *b = (seed.wrapping_mul(i as u64 + 1) >> 7) as u8;
            }
            seal(&mut buf, Header { magic: MAGIC_INDEX_PAGE, version: FORMAT_VERSION, kind: 0, length: len as u32, crc: 0, seq: seed });
            prop_assert!(unseal(&buf, MAGIC_INDEX_PAGE, "test").is_ok());
            let bit = bit % (len * 8);
            buf[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(unseal(&buf, MAGIC_INDEX_PAGE, "test").is_err());
        }

        #[test]
        fn block_locations_round_trip(device: u8, block in 0..=BLOCK_NUMBER_MAX, flags: u8) {
            let loc = BlockLoc { device, block };
            prop_assert_eq!(BlockLoc::unpack(loc.pack(flags)), (loc, flags));
        }
    }

    #[test]
    fn newer_versions_are_refused() {
        let mut buf = vec![0u8; 64];
        seal(
            &mut buf,
            Header {
                magic: MAGIC_LOG_RECORD,
                version: FORMAT_VERSION + 1,
                kind: 0,
                length: 64,
                crc: 0,
                seq: 1,
            },
        );
        assert!(matches!(
            unseal(&buf, MAGIC_LOG_RECORD, "log record"),
            Err(FormatError::UnsupportedVersion { .. })
        ));
        assert!(matches!(
            unseal(&buf, MAGIC_INDEX_PAGE, "index page"),
            Err(FormatError::BadMagic { .. })
        ));
    }
}
