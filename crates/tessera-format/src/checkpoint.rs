//! Checkpoints: the committed state of a disk group's metadata.
//!
//! Two slots in the metadata area of the cache device are written in turn;
//! the slot with the higher generation whose CRC holds is the current one, so
//! a checkpoint torn by a crash leaves the previous one in force. A checkpoint
//! records where log replay starts (the log tail) and, for every component,
//! its size, reservation, highest epoch, feature flags and the location of
//! each of its index pages (which of the page's two slots is current).

use crate::{seal, unseal, BlockLoc, FormatError, Header, Reader, Writer, BLOCK, FORMAT_VERSION};
use crate::{HEADER_BYTES, MAGIC_CHECKPOINT};

const STRUCTURE: &str = "checkpoint";
const COMPONENT_BYTES: usize = 48;
const PAGE_BYTES: usize = 16;

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
    /// Feature flags (none in version 1; snapshot layers will use them).
    pub flags: u64,
    /// Index pages, by page number.
    pub pages: Vec<PageRoot>,
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
                .map(|c| COMPONENT_BYTES + c.pages.len() * PAGE_BYTES)
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
                w.u64(c.flags);
                w.u64(c.pages.len() as u64);
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
                flags,
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
            components: vec![ComponentRecord {
                id: 7,
                size_bytes: 1 << 30,
                reserve_bytes: 0,
                highest_epoch: 3,
                flags: 0,
                pages: vec![PageRoot {
                    page_no: 4,
                    loc: BlockLoc {
                        device: 1,
                        block: 1000,
                    },
                    slot: 1,
                }],
            }],
        };
        let buf = ck.encode();
        assert_eq!(buf.len() % BLOCK, 0);
        assert!(Checkpoint::length_from_first_block(&buf).unwrap() <= buf.len());
        assert_eq!(Checkpoint::decode(&buf).unwrap(), ck);
    }
}
