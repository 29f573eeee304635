//! Write-log records on the cache device.
//!
//! A record is one header block followed by the data blocks of its write
//! entries, in entry order, written with one positional write (a placed
//! write's data is already on the capacity tier: its entry names where). The header
//! lists up to [`LOG_ENTRIES_MAX`] entries (56 bytes each): the operation, the
//! component, the LBA, a block count, the owner epoch, an argument, and for a
//! write the CRC32C of its data block. The data CRCs live in the header, not
//! in the data blocks, so a data block is stored exactly as the client sent it.
//!
//! Records carry a sequence number that grows by one per record; recovery
//! accepts the next record only if its header is sound, its sequence is the
//! expected one and every data block matches its CRC. The first record that
//! fails is the torn tail: it was never acknowledged (acknowledgement waits for
//! the whole record to be synced), so it is discarded.

use crate::{seal, unseal, FormatError, Header, Reader, Writer, BLOCK, FORMAT_VERSION};
use crate::{HEADER_BYTES, MAGIC_LOG_RECORD};

/// Entries in one record header.
pub const LOG_ENTRIES_MAX: usize = 72;

const ENTRY_BYTES: usize = 56;
const BODY_START: usize = HEADER_BYTES + 16;
const STRUCTURE: &str = "log record";
const _: () = assert!(BODY_START + LOG_ENTRIES_MAX * ENTRY_BYTES <= BLOCK);

/// What a log entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogOp {
    /// One data block for `lba`, with its CRC32C; the block follows.
    Write {
        /// CRC32C of the data block.
        crc: u32,
    },
    /// `count` blocks from `lba` unmapped.
    Unmap,
    /// `count` blocks from `lba` zeroed (stored as nothing, like unmap).
    WriteZeroes,
    /// The component's highest epoch raised to `epoch`.
    Fence,
    /// Component created with `arg` bytes and `arg2` reserved bytes.
    Create,
    /// Component deleted.
    Delete,
    /// Component resized to `arg` bytes.
    Resize,
    /// `lba` now references the stored block at `arg` (a [`crate::BlockLoc`]
    /// packed with flags 0), whose data has CRC32C `crc`: a copy by
    /// reference. `arg2` names the component the block was copied from (for
    /// the offline check's report). No data block follows.
    Share {
        /// CRC32C of the shared block's data.
        crc: u32,
    },
    /// `lba` now holds the block written straight to the capacity tier at
    /// `arg` (a [`crate::BlockLoc`] packed with flags 0), whose data has
    /// CRC32C `crc`: a large write that bypassed the log. The block was
    /// synced before this record was written. No data block follows.
    Place {
        /// CRC32C of the placed block's data.
        crc: u32,
    },
    /// Component `component` created as a read-only point in time of
    /// `arg2` (its snapshot): its index page roots are the `count` blocks of
    /// the root table starting at `arg` (a [`crate::BlockLoc`] packed with
    /// flags 0), written and synced before this record. It shares every
    /// index page (and so every block) with the source.
    Snapshot,
    /// Component `component` created as a writable copy of the snapshot
    /// `arg2` (a linked clone), from the snapshot's root table at `arg`
    /// (`count` blocks): it shares every index page with the snapshot until
    /// it changes one.
    Clone,
}

impl LogOp {
    fn code(self) -> u16 {
        match self {
            LogOp::Write { .. } => 1,
            LogOp::Unmap => 2,
            LogOp::WriteZeroes => 3,
            LogOp::Fence => 4,
            LogOp::Create => 5,
            LogOp::Delete => 6,
            LogOp::Resize => 7,
            LogOp::Share { .. } => 8,
            LogOp::Place { .. } => 9,
            LogOp::Snapshot => 10,
            LogOp::Clone => 11,
        }
    }
}

/// One entry of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEntry {
    /// The operation.
    pub op: LogOp,
    /// Component it applies to.
    pub component: u64,
    /// First LBA.
    pub lba: u64,
    /// Blocks (1 for a write).
    pub count: u64,
    /// Owner epoch that issued it.
    pub epoch: u64,
    /// Size in bytes for create and resize; the packed block for share;
    /// the root table's first block for snapshot and clone.
    pub arg: u64,
    /// Reserved bytes for create; the source component for share, snapshot
    /// and clone.
    pub arg2: u64,
}

/// Decoded record header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecordHeader {
    /// Record sequence number.
    pub seq: u64,
    /// The first sequence that was not yet durable when this record was
    /// written: the first record of its own group commit, or of an earlier
    /// commit whose sync was still running. Every record before it was
    /// synced, so recovery can tell a torn tail (damage to a record no later
    /// record vouches for) from damage to a record that was already synced
    /// (a later record names a higher sequence here). Logs written when one
    /// commit was in flight at a time hold the first record of the record's
    /// own commit, which fits the same rule.
    pub batch_first_seq: u64,
    /// Entries.
    pub entries: Vec<LogEntry>,
}

impl LogRecordHeader {
    /// Data blocks that follow the header.
    pub fn data_blocks(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e.op, LogOp::Write { .. }))
            .count()
    }

    /// Blocks of the whole record, header included.
    pub fn record_blocks(&self) -> usize {
        1 + self.data_blocks()
    }

    /// Encodes into the first block of `buf`.
    pub fn encode_into(&self, buf: &mut [u8]) {
        let buf = &mut buf[..BLOCK];
        buf.fill(0);
        let length = {
            let mut w = Writer::at(buf, HEADER_BYTES);
            w.u32(self.entries.len() as u32);
            w.u32(self.record_blocks() as u32);
            w.u64(self.batch_first_seq);
            for e in self.entries.iter().take(LOG_ENTRIES_MAX) {
                w.u16(e.op.code());
                w.u16(0);
                w.u32(match e.op {
                    LogOp::Write { crc } | LogOp::Share { crc } | LogOp::Place { crc } => crc,
                    _ => 0,
                });
                w.u64(e.component);
                w.u64(e.lba);
                w.u64(e.count);
                w.u64(e.epoch);
                w.u64(e.arg);
                w.u64(e.arg2);
            }
            w.pos()
        };
        seal(
            buf,
            Header {
                magic: MAGIC_LOG_RECORD,
                version: FORMAT_VERSION,
                kind: 0,
                length: length as u32,
                crc: 0,
                seq: self.seq,
            },
        );
    }

    /// Decodes and checks a header block.
    pub fn decode(buf: &[u8]) -> Result<LogRecordHeader, FormatError> {
        let buf = &buf[..buf.len().min(BLOCK)];
        let header = unseal(buf, MAGIC_LOG_RECORD, STRUCTURE)?;
        let body = &buf[..header.length as usize];
        let mut r = Reader::at(body, HEADER_BYTES);
        let count = r.u32() as usize;
        let record_blocks = r.u32() as usize;
        let batch_first_seq = r.u64();
        if count > LOG_ENTRIES_MAX || body.len() < BODY_START + count * ENTRY_BYTES {
            return Err(FormatError::Invalid {
                structure: STRUCTURE,
                problem: format!("{count} entries do not fit"),
            });
        }
        let mut entries = Vec::with_capacity(count);
        for i in 0..count {
            let code = r.u16();
            r.u16();
            let crc = r.u32();
            let op = match code {
                1 => LogOp::Write { crc },
                2 => LogOp::Unmap,
                3 => LogOp::WriteZeroes,
                4 => LogOp::Fence,
                5 => LogOp::Create,
                6 => LogOp::Delete,
                7 => LogOp::Resize,
                8 => LogOp::Share { crc },
                9 => LogOp::Place { crc },
                10 => LogOp::Snapshot,
                11 => LogOp::Clone,
                other => {
                    return Err(FormatError::Invalid {
                        structure: STRUCTURE,
                        problem: format!("entry {i} has unknown operation {other}"),
                    })
                }
            };
            entries.push(LogEntry {
                op,
                component: r.u64(),
                lba: r.u64(),
                count: r.u64(),
                epoch: r.u64(),
                arg: r.u64(),
                arg2: r.u64(),
            });
        }
        let out = LogRecordHeader {
            seq: header.seq,
            batch_first_seq,
            entries,
        };
        if out.record_blocks() != record_blocks {
            return Err(FormatError::Invalid {
                structure: STRUCTURE,
                problem: format!(
                    "header says {record_blocks} blocks, entries need {}",
                    out.record_blocks()
                ),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let header = LogRecordHeader {
            seq: 77,
            batch_first_seq: 75,
            entries: vec![
                LogEntry {
                    op: LogOp::Write { crc: 0xdead_beef },
                    component: 3,
                    lba: 9,
                    count: 1,
                    epoch: 4,
                    arg: 0,
                    arg2: 0,
                },
                LogEntry {
                    op: LogOp::Create,
                    component: 5,
                    lba: 0,
                    count: 0,
                    epoch: 0,
                    arg: 1 << 30,
                    arg2: 1 << 20,
                },
                LogEntry {
                    op: LogOp::Share { crc: 0x1234_5678 },
                    component: 6,
                    lba: 12,
                    count: 1,
                    epoch: 4,
                    arg: crate::BlockLoc {
                        device: 2,
                        block: 4099,
                    }
                    .pack(0),
                    arg2: 5,
                },
                LogEntry {
                    op: LogOp::Place { crc: 0x0bad_cafe },
                    component: 6,
                    lba: 13,
                    count: 1,
                    epoch: 4,
                    arg: crate::BlockLoc {
                        device: 1,
                        block: 77,
                    }
                    .pack(0),
                    arg2: 0,
                },
            ],
        };
        let mut buf = vec![0u8; BLOCK];
        header.encode_into(&mut buf);
        assert_eq!(LogRecordHeader::decode(&buf).unwrap(), header);
        // A share entry carries no data block.
        assert_eq!(header.record_blocks(), 2);
        buf[100] ^= 4;
        assert!(LogRecordHeader::decode(&buf).is_err());
    }
}
