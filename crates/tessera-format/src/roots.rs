//! Root tables: where a snapshot's index pages are.
//!
//! A snapshot's index pages never change, so instead of listing them in
//! every checkpoint (whose size would then grow with the number of
//! snapshots) its page roots are written once, when it is taken, into a
//! chain of blocks on a capacity device, and the checkpoint names the
//! chain's first block. Each block holds up to [`ROOTS_PER_BLOCK`] roots,
//! the snapshot and family it belongs to, the snapshot's size and mapped
//! blocks, its place in the chain and the next block's location, under the
//! common header: a block that is torn, misdirected or belongs to another
//! snapshot is refused.

use crate::{seal, unseal, BlockLoc, FormatError, Header, PageRoot, Reader, Writer, BLOCK};
use crate::{FORMAT_VERSION, HEADER_BYTES, MAGIC_ROOT_TABLE};

const STRUCTURE: &str = "root table";
const BODY_START: usize = HEADER_BYTES + 48;
const ROOT_BYTES: usize = 16;
/// "No next block".
const NO_NEXT: u64 = u64::MAX;

/// Page roots one block of a root table holds.
pub const ROOTS_PER_BLOCK: usize = (BLOCK - BODY_START) / ROOT_BYTES;

/// Blocks a root table of `roots` page roots takes (at least one: an empty
/// snapshot still has a table that names it).
pub fn root_table_blocks(roots: usize) -> usize {
    roots.div_ceil(ROOTS_PER_BLOCK).max(1)
}

/// One block of a root table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootTableBlock {
    /// The snapshot the table belongs to.
    pub component: u64,
    /// Its family (what its index pages are stamped with).
    pub family: u64,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Its LBAs that map a block.
    pub allocated: u64,
    /// Place of this block in the chain, from 0.
    pub index: u64,
    /// The next block of the chain.
    pub next: Option<BlockLoc>,
    /// Page roots, in page order across the chain.
    pub roots: Vec<PageRoot>,
}

impl RootTableBlock {
    /// Encodes into one block.
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = vec![0u8; BLOCK];
        let length = {
            let mut w = Writer::at(&mut buf, HEADER_BYTES);
            w.u64(self.component);
            w.u64(self.family);
            w.u64(self.size_bytes);
            w.u64(self.allocated);
            w.u64(self.next.map_or(NO_NEXT, |l| l.pack(0)));
            w.u32(self.roots.len().min(ROOTS_PER_BLOCK) as u32);
            w.u32(0);
            for r in self.roots.iter().take(ROOTS_PER_BLOCK) {
                w.u64(r.page_no);
                w.u64(r.loc.pack(r.slot));
            }
            w.pos()
        };
        seal(
            &mut buf,
            Header {
                magic: MAGIC_ROOT_TABLE,
                version: FORMAT_VERSION,
                kind: 0,
                length: length as u32,
                crc: 0,
                seq: self.index,
            },
        );
        buf
    }

    /// Decodes and checks one block.
    pub fn decode(buf: &[u8]) -> Result<RootTableBlock, FormatError> {
        let buf = &buf[..buf.len().min(BLOCK)];
        let header = unseal(buf, MAGIC_ROOT_TABLE, STRUCTURE)?;
        let body = &buf[..header.length as usize];
        if body.len() < BODY_START {
            return Err(FormatError::Invalid {
                structure: STRUCTURE,
                problem: format!("{} bytes are too few", body.len()),
            });
        }
        let mut r = Reader::at(body, HEADER_BYTES);
        let component = r.u64();
        let family = r.u64();
        let size_bytes = r.u64();
        let allocated = r.u64();
        let next = match r.u64() {
            NO_NEXT => None,
            raw => Some(BlockLoc::unpack(raw).0),
        };
        let count = r.u32() as usize;
        r.u32();
        if count > ROOTS_PER_BLOCK || r.remaining() < count * ROOT_BYTES {
            return Err(FormatError::Invalid {
                structure: STRUCTURE,
                problem: format!("{count} roots do not fit"),
            });
        }
        let mut roots = Vec::with_capacity(count);
        for _ in 0..count {
            let page_no = r.u64();
            let (loc, slot) = BlockLoc::unpack(r.u64());
            if slot > 1 {
                return Err(FormatError::Invalid {
                    structure: STRUCTURE,
                    problem: format!("page {page_no} has slot {slot}"),
                });
            }
            roots.push(PageRoot { page_no, loc, slot });
        }
        Ok(RootTableBlock {
            component,
            family,
            size_bytes,
            allocated,
            index: header.seq,
            next,
            roots,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(component: u64, family: u64, size_bytes: u64, allocated: u64, index: u64, next: Option<(u8, u32)>, roots in proptest::collection::vec(any::<(u64, u8, u32, bool)>(), 0..=ROOTS_PER_BLOCK)) {
            let block = RootTableBlock {
                component,
                family,
                size_bytes,
                allocated,
                index,
                next: next.map(|(device, block)| BlockLoc { device, block: block as u64 }),
                roots: roots
                    .into_iter()
                    .map(|(page_no, device, block, slot)| PageRoot {
                        page_no,
                        loc: BlockLoc { device, block: block as u64 },
                        slot: slot as u8,
                    })
                    .collect(),
            };
            prop_assert_eq!(RootTableBlock::decode(&block.encode()).unwrap(), block);
        }

        #[test]
        fn refuses_damage_and_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..BLOCK), flip in 0usize..BLOCK) {
            // Garbage never decodes (and never panics).
            prop_assert!(RootTableBlock::decode(&bytes).is_err());
            // One flipped bit in a sound block is caught.
            let block = RootTableBlock {
                component: 3,
                family: 3,
                size_bytes: 1 << 20,
                allocated: 1,
                index: 0,
                next: None,
                roots: vec![PageRoot { page_no: 1, loc: BlockLoc { device: 1, block: 9 }, slot: 1 }],
            };
            let mut buf = block.encode();
            buf[flip] ^= 1;
            prop_assert!(RootTableBlock::decode(&buf).is_err() || flip >= BODY_START + ROOT_BYTES);
        }
    }

    #[test]
    fn a_table_of_many_roots_takes_whole_blocks() {
        assert_eq!(root_table_blocks(0), 1);
        assert_eq!(root_table_blocks(ROOTS_PER_BLOCK), 1);
        assert_eq!(root_table_blocks(ROOTS_PER_BLOCK + 1), 2);
    }
}
