//! Checkpoints: the committed state of a disk group's metadata.
//!
//! Two slots in the metadata area of the cache device are written in turn;
//! the slot with the higher generation whose CRC holds is the current one, so
//! a checkpoint torn by a crash leaves the previous one in force. A checkpoint
//! records where log replay starts (the log tail) and, for every component,
//! its size, reservation, highest epoch, its family and the location of
//! each of its index pages (which of the page's two slots is current).
//!
//! A snapshot lists no pages here: its pages never change, so their roots
//! live in a root table of their own (see [`crate::roots`]) that the record
//! names, and a checkpoint stays the same size however many snapshots
//! there are. The feature flags word says which extensions follow the
//! fixed part of a record; a record written before snapshots existed has
//! none.

use crate::{seal, unseal, BlockLoc, FormatError, Header, Reader, Writer, BLOCK, FORMAT_VERSION};
use crate::{HEADER_BYTES, MAGIC_CHECKPOINT};

const STRUCTURE: &str = "checkpoint";
const COMPONENT_BYTES: usize = 48;
const PAGE_BYTES: usize = 16;
/// Flag: the component's family follows (8 bytes).
const FLAG_FAMILY: u64 = 1;
/// Flag: the component is a snapshot; its root table follows (16 bytes).
const FLAG_ROOT_TABLE: u64 = 2;
const FLAGS_KNOWN: u64 = FLAG_FAMILY | FLAG_ROOT_TABLE;

/// Where one index page lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRoot {
    /// Page number within the component.
    pub page_no: u64,
    /// First block of the page's two-block slot pair.
    pub loc: BlockLoc,
    /// Which of the two blocks holds the current copy (0 or 1).
    pub slot: u8,
}

/// One component's committed metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentRecord {
    /// Component id.
    pub id: u64,
    /// Logical size in bytes.
    pub size_bytes: u64,
    /// Bytes reserved up front.
    pub reserve_bytes: u64,
    /// Highest owner epoch persisted.
    pub highest_epoch: u64,
    /// The component whose index pages this one may share (snapshots and
    /// clones take their source's): index pages are stamped with it, so a
    /// page read for the wrong family is caught. A component's own id when
    /// it copies no other.
    pub family: u64,
    /// For a snapshot: where its page roots are (it lists no pages).
    pub root_table: Option<RootTableRef>,
    /// Index pages, by page number.
    pub pages: Vec<PageRoot>,
}

/// Where a snapshot's root table is: its first block and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootTableRef {
    /// First block of the chain.
    pub first: BlockLoc,
    /// Blocks in the chain.
    pub blocks: u64,
}

impl ComponentRecord {
    fn flags(&self) -> u64 {
        let mut flags = 0;
        if self.family != self.id {
            flags |= FLAG_FAMILY;
        }
        if self.root_table.is_some() {
            flags |= FLAG_ROOT_TABLE;
        }
        flags
    }

    fn encoded_bytes(&self) -> usize {
        let flags = self.flags();
        COMPONENT_BYTES
            + if flags & FLAG_FAMILY != 0 { 8 } else { 0 }
            + if flags & FLAG_ROOT_TABLE != 0 { 16 } else { 0 }
            + self.pages.len() * PAGE_BYTES
    }
}

/// Decoded checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Checkpoint {
    /// Generation: one more than the checkpoint it replaces.
    pub generation: u64,
    /// Log block (relative to the log start) where replay begins.
    pub log_tail_block: u64,
    /// Sequence of the record expected at the tail.
    pub log_tail_seq: u64,
    /// Components.
    pub components: Vec<ComponentRecord>,
}

impl Checkpoint {
    /// Bytes the encoding takes, rounded up to whole blocks.
    pub fn encoded_bytes(&self) -> usize {
        let raw = HEADER_BYTES
            + 24
            + self
                .components
                .iter()
                .map(ComponentRecord::encoded_bytes)
                .sum::<usize>();
        raw.div_ceil(BLOCK) * BLOCK
    }

    /// Encodes into whole blocks.
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = vec![0u8; self.encoded_bytes()];
        let length = {
            let mut w = Writer::at(&mut buf, HEADER_BYTES);
            w.u64(self.log_tail_block);
            w.u64(self.log_tail_seq);
            w.u64(self.components.len() as u64);
            for c in &self.components {
                w.u64(c.id);
                w.u64(c.size_bytes);
                w.u64(c.reserve_bytes);
                w.u64(c.highest_epoch);
                let flags = c.flags();
                w.u64(flags);
                w.u64(c.pages.len() as u64);
                if flags & FLAG_FAMILY != 0 {
                    w.u64(c.family);
                }
                if let Some(t) = c.root_table {
                    w.u64(t.first.pack(0));
                    w.u64(t.blocks);
                }
                for p in &c.pages {
                    w.u64(p.page_no);
                    w.u64(p.loc.pack(p.slot));
                }
            }
            w.pos()
        };
        seal(
            &mut buf,
            Header {
                magic: MAGIC_CHECKPOINT,
                version: FORMAT_VERSION,
                kind: 0,
                length: length as u32,
                crc: 0,
                seq: self.generation,
            },
        );
        buf
    }

    /// Bytes to read to decode the checkpoint whose first block is `first`
    /// (from its header), or an error if the first block is not a checkpoint.
    pub fn length_from_first_block(first: &[u8]) -> Result<usize, FormatError> {
        let mut r = Reader::new(first);
        let magic = r.u64();
        if magic != MAGIC_CHECKPOINT {
            return Err(FormatError::BadMagic {
                expected: STRUCTURE,
                found: magic,
            });
        }
        r.u16();
        r.u16();
        Ok(r.u32() as usize)
    }

    /// Decodes and checks.
    pub fn decode(buf: &[u8]) -> Result<Checkpoint, FormatError> {
        let header = unseal(buf, MAGIC_CHECKPOINT, STRUCTURE)?;
        let body = &buf[..header.length as usize];
        let mut r = Reader::at(body, HEADER_BYTES);
        let log_tail_block = r.u64();
        let log_tail_seq = r.u64();
        let count = r.u64() as usize;
        let mut components = Vec::new();
        for i in 0..count {
            if r.remaining() < COMPONENT_BYTES {
                return Err(FormatError::Invalid {
                    structure: STRUCTURE,
                    problem: format!("component {i} of {count} is cut short"),
                });
            }
            let id = r.u64();
            let size_bytes = r.u64();
            let reserve_bytes = r.u64();
            let highest_epoch = r.u64();
            let flags = r.u64();
            let pages_count = r.u64() as usize;
            if flags & !FLAGS_KNOWN != 0 {
                return Err(FormatError::Invalid {
                    structure: STRUCTURE,
                    problem: format!("component {id} has unknown flags {flags:#x}"),
                });
            }
            let extension = if flags & FLAG_FAMILY != 0 { 8 } else { 0 }
                + if flags & FLAG_ROOT_TABLE != 0 { 16 } else { 0 };
            if r.remaining() < extension {
                return Err(FormatError::Invalid {
                    structure: STRUCTURE,
                    problem: format!("component {id} is cut short"),
                });
            }
            let family = if flags & FLAG_FAMILY != 0 {
                r.u64()
            } else {
                id
            };
            let root_table = if flags & FLAG_ROOT_TABLE != 0 {
                let (first, _) = BlockLoc::unpack(r.u64());
                let blocks = r.u64();
                if pages_count != 0 {
                    return Err(FormatError::Invalid {
                        structure: STRUCTURE,
                        problem: format!(
                            "snapshot {id} lists {pages_count} pages besides its root table"
                        ),
                    });
                }
                Some(RootTableRef { first, blocks })
            } else {
                None
            };
            if r.remaining() / PAGE_BYTES < pages_count {
                return Err(FormatError::Invalid {
                    structure: STRUCTURE,
                    problem: format!("component {id} lists {pages_count} pages that do not fit"),
                });
            }
            let mut pages = Vec::with_capacity(pages_count);
            for _ in 0..pages_count {
                let page_no = r.u64();
                let (loc, slot) = BlockLoc::unpack(r.u64());
                if slot > 1 {
                    return Err(FormatError::Invalid {
                        structure: STRUCTURE,
                        problem: format!("component {id} page {page_no} has slot {slot}"),
                    });
                }
                pages.push(PageRoot { page_no, loc, slot });
            }
            components.push(ComponentRecord {
                id,
                size_bytes,
                reserve_bytes,
                highest_epoch,
                family,
                root_table,
                pages,
            });
        }
        Ok(Checkpoint {
            generation: header.seq,
            log_tail_block,
            log_tail_seq,
            components,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let ck = Checkpoint {
            generation: 9,
            log_tail_block: 100,
            log_tail_seq: 55,
            components: vec![
                ComponentRecord {
                    id: 7,
                    size_bytes: 1 << 30,
                    reserve_bytes: 0,
                    highest_epoch: 3,
                    family: 7,
                    root_table: None,
                    pages: vec![PageRoot {
                        page_no: 4,
                        loc: BlockLoc {
                            device: 1,
                            block: 1000,
                        },
                        slot: 1,
                    }],
                },
                ComponentRecord {
                    id: 8,
                    size_bytes: 1 << 30,
                    reserve_bytes: 0,
                    highest_epoch: 3,
                    family: 7,
                    root_table: Some(RootTableRef {
                        first: BlockLoc {
                            device: 2,
                            block: 77,
                        },
                        blocks: 3,
                    }),
                    pages: Vec::new(),
                },
                ComponentRecord {
                    id: 9,
                    size_bytes: 1 << 20,
                    reserve_bytes: 4096,
                    highest_epoch: 1,
                    family: 7,
                    root_table: None,
                    pages: Vec::new(),
                },
            ],
        };
        let buf = ck.encode();
        assert_eq!(buf.len() % BLOCK, 0);
        assert!(Checkpoint::length_from_first_block(&buf).unwrap() <= buf.len());
        assert_eq!(Checkpoint::decode(&buf).unwrap(), ck);
    }
}
