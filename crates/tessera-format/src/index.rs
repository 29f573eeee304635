//! Index pages: a component's map from LBA to stored block, 252 LBAs per page.
//!
//! Page `n` of a component covers LBAs `n * 252 .. (n + 1) * 252`. Each page
//! lives in a pair of blocks on a capacity device and is written alternately
//! to the two (never over the copy the last checkpoint points to), so a torn
//! page write cannot damage the committed index.
//!
//! An entry has a kind: a plain block of its own, a block shared with other
//! entries (a copy made by reference: EXTENDED COPY, later clones and
//! snapshots), and reserved kinds for a block shared by fingerprint and a
//! compressed block; and a stored length (less than 4 KiB once compressed).
//! A block may be referenced by any number of shared entries but by at most
//! one plain entry: the store counts references at mount and frees a block
//! only when the last one goes.

use crate::{seal, unseal, BlockLoc, FormatError, Header, Reader, Writer, BLOCK, FORMAT_VERSION};
use crate::{HEADER_BYTES, MAGIC_INDEX_PAGE};

/// LBAs mapped by one index page.
pub const INDEX_ENTRIES: usize = 252;

const ENTRY_BYTES: usize = 16;
const BODY_START: usize = HEADER_BYTES + 16;
const STRUCTURE: &str = "index page";

/// What an index entry points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EntryKind {
    /// Never written, unmapped or zeroed: reads as zeros, takes no space.
    #[default]
    Unmapped,
    /// A whole 4 KiB block of its own.
    Plain,
    /// The data was lost (its log record was damaged before it reached the
    /// capacity tier): reads fail with a checksum error until rewritten.
    Lost,
    /// A whole 4 KiB block that other entries may reference too (a copy by
    /// reference); freed when its last reference goes.
    Shared,
}

impl EntryKind {
    fn code(self) -> u8 {
        match self {
            EntryKind::Unmapped => 0,
            EntryKind::Plain => 1,
            EntryKind::Lost => 2,
            EntryKind::Shared => 3,
        }
    }
}

/// One LBA's mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexEntry {
    /// What the entry points to.
    pub kind: EntryKind,
    /// Where the block is.
    pub loc: BlockLoc,
    /// Bytes stored (4096 for a plain block).
    pub stored_len: u16,
    /// CRC32C of the block's 4096 bytes of data.
    pub crc: u32,
}

impl IndexEntry {
    /// An entry for a plain block.
    pub fn plain(loc: BlockLoc, crc: u32) -> IndexEntry {
        IndexEntry {
            kind: EntryKind::Plain,
            loc,
            stored_len: BLOCK as u16,
            crc,
        }
    }

    /// An entry for a block shared by reference.
    pub fn shared(loc: BlockLoc, crc: u32) -> IndexEntry {
        IndexEntry {
            kind: EntryKind::Shared,
            ..IndexEntry::plain(loc, crc)
        }
    }

    /// The block this entry holds a reference to, if any.
    pub fn block(&self) -> Option<BlockLoc> {
        matches!(self.kind, EntryKind::Plain | EntryKind::Shared).then_some(self.loc)
    }

    /// True when the LBA has a stored block.
    pub fn is_mapped(&self) -> bool {
        self.kind != EntryKind::Unmapped
    }
}

/// Decoded index page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexPage {
    /// Component the page belongs to.
    pub component: u64,
    /// Page number within the component.
    pub page_no: u64,
    /// Checkpoint generation that wrote this copy.
    pub generation: u64,
    /// One entry per LBA.
    pub entries: Vec<IndexEntry>,
}

impl IndexPage {
    /// An empty page.
    pub fn empty(component: u64, page_no: u64) -> IndexPage {
        IndexPage {
            component,
            page_no,
            generation: 0,
            entries: vec![IndexEntry::default(); INDEX_ENTRIES],
        }
    }

    /// Encodes into one block.
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = vec![0u8; BLOCK];
        let length = {
            let mut w = Writer::at(&mut buf, HEADER_BYTES);
            w.u64(self.component);
            w.u64(self.page_no);
            for e in self.entries.iter().take(INDEX_ENTRIES) {
                w.u8(e.kind.code());
                w.u8(e.loc.device);
                w.u16(e.stored_len);
                w.u32(e.crc);
                w.u64(e.loc.block);
            }
            BODY_START + INDEX_ENTRIES * ENTRY_BYTES
        };
        seal(
            &mut buf,
            Header {
                magic: MAGIC_INDEX_PAGE,
                version: FORMAT_VERSION,
                kind: 0,
                length: length as u32,
                crc: 0,
                seq: self.generation,
            },
        );
        buf
    }

    /// Decodes and checks one block.
    pub fn decode(buf: &[u8]) -> Result<IndexPage, FormatError> {
        let header = unseal(buf, MAGIC_INDEX_PAGE, STRUCTURE)?;
        if (header.length as usize) < BODY_START + INDEX_ENTRIES * ENTRY_BYTES {
            return Err(FormatError::BadLength {
                structure: STRUCTURE,
                length: header.length as u64,
                available: buf.len() as u64,
            });
        }
        let mut r = Reader::at(buf, HEADER_BYTES);
        let component = r.u64();
        let page_no = r.u64();
        let mut entries = Vec::with_capacity(INDEX_ENTRIES);
        for slot in 0..INDEX_ENTRIES {
            let kind = match r.u8() {
                0 => EntryKind::Unmapped,
                1 => EntryKind::Plain,
                2 => EntryKind::Lost,
                3 => EntryKind::Shared,
                other => {
                    return Err(FormatError::Invalid {
                        structure: STRUCTURE,
                        problem: format!("entry {slot} has unknown kind {other}"),
                    })
                }
            };
            let device = r.u8();
            let stored_len = r.u16();
            let crc = r.u32();
            let block = r.u64();
            entries.push(IndexEntry {
                kind,
                loc: BlockLoc { device, block },
                stored_len,
                crc,
            });
        }
        Ok(IndexPage {
            component,
            page_no,
            generation: header.seq,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(component: u64, page_no: u64, generation: u64, seeds in proptest::collection::vec(any::<(bool, u8, u32, u32)>(), INDEX_ENTRIES)) {
            let mut page = IndexPage::empty(component, page_no);
            page.generation = generation;
            for (i, (e, (mapped, device, block, crc))) in page.entries.iter_mut().zip(seeds).enumerate() {
                if mapped {
                    let loc = BlockLoc { device, block: block as u64 };
                    *e = if i % 3 == 0 { IndexEntry::shared(loc, crc) } else { IndexEntry::plain(loc, crc) };
                }
            }
            prop_assert_eq!(IndexPage::decode(&page.encode()).unwrap(), page);
        }
    }
}
