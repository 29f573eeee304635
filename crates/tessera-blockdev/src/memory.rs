//! An in-memory thin block device.
//!
//! Owns: a sparse map of 4 KiB blocks split into shards, so concurrent I/O on
//! different blocks rarely contends. Unwritten, unmapped and zeroed blocks
//! hold no memory and read as zeros. Nothing is durable: `flush` only orders.
//! COMPARE AND WRITE takes a device-wide lock that every writer also takes in
//! shared mode, which makes it atomic against all other commands.

use crate::{
    check_range, first_difference, push_extent, BlockDevice, BlockError, DeviceInfo, Extent,
    ExtentKind, SpaceUsage, WriteFlags, ZeroMode,
};
use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::any::Any;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

const BLOCK: u64 = 4096;
/// Shards of the block map; a power of two well above the worker count.
const SHARDS: usize = 64;
/// Consecutive blocks kept in one shard (64 KiB), so a large request takes
/// one lock per 16 blocks instead of one per block.
const SHARD_RUN_BLOCKS: u64 = 16;

/// Hashes block numbers with the splitmix64 finaliser: block numbers are
/// trusted integers, so the DoS resistance of the default SipHash buys
/// nothing and costs a third of a large request's time.
#[derive(Default)]
struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type BlockMap = HashMap<u64, Stored, BuildHasherDefault<BlockHasher>>;

/// How a stored block reads.
enum Stored {
    Data(Box<[u8]>),
    /// Zeroed with `KeepAllocated`: allocated, reads as zeros.
    Zero,
}

/// A thin device held in memory.
pub struct MemoryDevice {
    info: DeviceInfo,
    shards: Vec<Mutex<BlockMap>>,
    allocated_blocks: AtomicU64,
    /// Writers take it shared; COMPARE AND WRITE takes it exclusively.
    atomicity: RwLock<()>,
}

impl MemoryDevice {
    /// A device of `size_bytes` (rounded down to 512 bytes), initially all holes.
    pub fn new(name: impl Into<String>, size_bytes: u64) -> Self {
        let name = name.into();
        let serial = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        MemoryDevice {
            info: DeviceInfo {
                name,
                size_bytes: size_bytes / 512 * 512,
                logical_block_bytes: 512,
                preferred_block_bytes: 4096,
                read_only: false,
                serial,
            },
            shards: (0..SHARDS)
                .map(|_| Mutex::new(BlockMap::default()))
                .collect(),
            allocated_blocks: AtomicU64::new(0),
            atomicity: RwLock::new(()),
        }
    }

    /// The same device, refusing writes.
    pub fn read_only(mut self) -> Self {
        self.info.read_only = true;
        self
    }

    fn shard_index(block: u64) -> usize {
        ((block / SHARD_RUN_BLOCKS) as usize) & (SHARDS - 1)
    }

    /// The lock of `block`'s shard, reusing `held` when it is already that
    /// shard's: a run of blocks in one shard takes the lock once.
    fn lock_for<'h, 'a>(
        &'a self,
        held: &'h mut Option<(usize, MutexGuard<'a, BlockMap>)>,
        block: u64,
    ) -> &'h mut MutexGuard<'a, BlockMap> {
        let index = Self::shard_index(block);
        if held.as_ref().is_some_and(|(i, _)| *i != index) {
            *held = None;
        }
        &mut held
            .get_or_insert_with(|| (index, self.shards[index].lock()))
            .1
    }

    fn writable(&self) -> Result<(), BlockError> {
        if self.info.read_only {
            Err(BlockError::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// Each output byte is written once (copied or zero-filled), so a large
    /// read does not pay for zeroing a buffer it then overwrites.
    fn read_now(&self, offset: u64, len: u64) -> Bytes {
        let mut out = BytesMut::with_capacity(len as usize);
        let mut held = None;
        let mut pos = offset;
        while pos < offset + len {
            let block = pos / BLOCK;
            let within = (pos % BLOCK) as usize;
            let step = (BLOCK - within as u64).min(offset + len - pos) as usize;
            match self.lock_for(&mut held, block).get(&block) {
                Some(Stored::Data(data)) => out.extend_from_slice(&data[within..within + step]),
                _ => out.put_bytes(0, step),
            }
            pos += step as u64;
        }
        out.freeze()
    }

    fn write_now(&self, offset: u64, data: &[u8]) {
        let mut held = None;
        let mut pos = offset;
        let end = offset + data.len() as u64;
        while pos < end {
            let block = pos / BLOCK;
            let within = (pos % BLOCK) as usize;
            let step = (BLOCK - within as u64).min(end - pos) as usize;
            let src = &data[(pos - offset) as usize..(pos - offset) as usize + step];
            let shard = self.lock_for(&mut held, block);
            match shard.get_mut(&block) {
                Some(Stored::Data(existing)) => {
                    existing[within..within + step].copy_from_slice(src)
                }
                Some(slot @ Stored::Zero) => {
                    let mut fresh = vec![0u8; BLOCK as usize].into_boxed_slice();
                    fresh[within..within + step].copy_from_slice(src);
                    *slot = Stored::Data(fresh);
                }
                None => {
                    let mut fresh = vec![0u8; BLOCK as usize].into_boxed_slice();
                    fresh[within..within + step].copy_from_slice(src);
                    shard.insert(block, Stored::Data(fresh));
                    self.allocated_blocks.fetch_add(1, Ordering::Relaxed);
                }
            }
            pos += step as u64;
        }
    }

    /// Whole blocks become holes (or allocated zeros); partial edges are zeroed.
    fn zero_now(&self, offset: u64, len: u64, mode: ZeroMode) {
        let end = offset + len;
        let mut held = None;
        let mut pos = offset;
        while pos < end {
            let block = pos / BLOCK;
            let within = pos % BLOCK;
            let step = (BLOCK - within).min(end - pos);
            let shard = self.lock_for(&mut held, block);
            if step == BLOCK {
                let replaced = match mode {
                    ZeroMode::MayUnmap => shard.remove(&block),
                    ZeroMode::KeepAllocated => shard.insert(block, Stored::Zero),
                };
                match (replaced.is_some(), mode) {
                    (true, ZeroMode::MayUnmap) => {
                        self.allocated_blocks.fetch_sub(1, Ordering::Relaxed);
                    }
                    (false, ZeroMode::KeepAllocated) => {
                        self.allocated_blocks.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            } else if let Some(Stored::Data(existing)) = shard.get_mut(&block) {
                existing[within as usize..(within + step) as usize].fill(0);
            }
            pos += step;
        }
    }
}

#[async_trait]
impl BlockDevice for MemoryDevice {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    async fn read(&self, offset: u64, len: u64) -> Result<Bytes, BlockError> {
        check_range(&self.info, "read", offset, len)?;
        Ok(self.read_now(offset, len))
    }

    async fn write(&self, offset: u64, data: Bytes, _flags: WriteFlags) -> Result<(), BlockError> {
        self.writable()?;
        check_range(&self.info, "write", offset, data.len() as u64)?;
        let _shared = self.atomicity.read();
        self.write_now(offset, &data);
        Ok(())
    }

    async fn flush(&self) -> Result<(), BlockError> {
        Ok(())
    }

    async fn unmap(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        self.writable()?;
        check_range(&self.info, "unmap", offset, len)?;
        let _shared = self.atomicity.read();
        self.zero_now(offset, len, ZeroMode::MayUnmap);
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<(), BlockError> {
        self.writable()?;
        check_range(&self.info, "write zeroes", offset, len)?;
        let _shared = self.atomicity.read();
        self.zero_now(offset, len, mode);
        Ok(())
    }

    async fn compare_and_write(
        &self,
        offset: u64,
        expected: Bytes,
        new: Bytes,
    ) -> Result<(), BlockError> {
        self.writable()?;
        if expected.len() != new.len() {
            return Err(BlockError::Invalid {
                reason: format!(
                    "compare buffer is {} bytes but write buffer is {}",
                    expected.len(),
                    new.len()
                ),
            });
        }
        check_range(&self.info, "compare and write", offset, new.len() as u64)?;
        let _exclusive = self.atomicity.write();
        let current = self.read_now(offset, new.len() as u64);
        if let Some(at) = first_difference(&current, &expected) {
            return Err(BlockError::Miscompare { offset: at as u64 });
        }
        self.write_now(offset, &new);
        Ok(())
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, BlockError> {
        check_range(&self.info, "block status", offset, len)?;
        let mut extents = Vec::new();
        let end = offset + len;
        let mut held = None;
        let mut pos = offset;
        while pos < end {
            let block = pos / BLOCK;
            let step = (BLOCK - pos % BLOCK).min(end - pos);
            let kind = match self.lock_for(&mut held, block).get(&block) {
                Some(Stored::Data(_)) => ExtentKind::Data,
                Some(Stored::Zero) => ExtentKind::Zero,
                None => ExtentKind::Hole,
            };
            push_extent(&mut extents, pos, step, kind);
            pos += step;
        }
        Ok(extents)
    }

    fn space(&self) -> SpaceUsage {
        SpaceUsage {
            allocated_bytes: self.allocated_blocks.load(Ordering::Relaxed) * BLOCK,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;
    use proptest::prelude::*;

    #[test]
    fn reads_back_writes_and_holes_read_zero() {
        let dev = MemoryDevice::new("t", 1 << 20);
        block_on(async {
            dev.write(4000, Bytes::from(vec![7u8; 200]), WriteFlags::default())
                .await
                .unwrap();
            let got = dev.read(3990, 220).await.unwrap();
            assert!(got[..10].iter().all(|&b| b == 0));
            assert!(got[10..210].iter().all(|&b| b == 7));
            assert!(got[210..].iter().all(|&b| b == 0));
            assert_eq!(dev.space().allocated_bytes, 2 * BLOCK);
            let map = dev.block_status(0, 16384).await.unwrap();
            assert_eq!(
                map,
                vec![
                    Extent {
                        offset: 0,
                        len: 8192,
                        kind: ExtentKind::Data
                    },
                    Extent {
                        offset: 8192,
                        len: 8192,
                        kind: ExtentKind::Hole
                    },
                ]
            );
            dev.unmap(0, 8192).await.unwrap();
            assert_eq!(dev.space().allocated_bytes, 0);
        });
    }

    #[test]
    fn past_the_end_changes_nothing() {
        let dev = MemoryDevice::new("t", 8192);
        block_on(async {
            let err = dev
                .write(8000, Bytes::from(vec![1u8; 512]), WriteFlags::default())
                .await
                .unwrap_err();
            assert!(matches!(err, BlockError::OutOfRange { .. }));
            assert_eq!(dev.space().allocated_bytes, 0);
            assert!(dev.read(u64::MAX, 2).await.is_err());
        });
    }

    #[test]
    fn compare_and_write_reports_first_difference() {
        let dev = MemoryDevice::new("t", 8192);
        block_on(async {
            let mut expected = vec![0u8; 512];
            expected[100] = 1;
            let err = dev
                .compare_and_write(0, Bytes::from(expected), Bytes::from(vec![9u8; 512]))
                .await
                .unwrap_err();
            assert_eq!(err, BlockError::Miscompare { offset: 100 });
            dev.compare_and_write(0, Bytes::from(vec![0u8; 512]), Bytes::from(vec![9u8; 512]))
                .await
                .unwrap();
            assert_eq!(dev.read(0, 512).await.unwrap(), Bytes::from(vec![9u8; 512]));
        });
    }

    proptest! {
        /// The device agrees with a flat byte array under random operations,
        /// and allocation equals the blocks the model has touched with data.
        #[test]
        fn agrees_with_flat_model(ops in proptest::collection::vec((0u8..4, 0u64..65536, 1u64..9000, any::<u8>()), 1..60)) {
            let size = 65536u64;
            let dev = MemoryDevice::new("m", size);
            let mut model = vec![0u8; size as usize];
            block_on(async {
                for (kind, offset, len, byte) in ops {
                    let len = len.min(size - offset);
                    if len == 0 { continue; }
                    match kind {
                        0 => {
                            dev.write(offset, Bytes::from(vec![byte; len as usize]), WriteFlags::default()).await.unwrap();
                            model[offset as usize..(offset + len) as usize].fill(byte);
                        }
                        1 => {
                            dev.unmap(offset, len).await.unwrap();
                            model[offset as usize..(offset + len) as usize].fill(0);
                        }
                        2 => {
                            dev.write_zeroes(offset, len, ZeroMode::KeepAllocated).await.unwrap();
                            model[offset as usize..(offset + len) as usize].fill(0);
                        }
                        _ => {
                            let got = dev.read(offset, len).await.unwrap();
                            assert_eq!(&got[..], &model[offset as usize..(offset + len) as usize]);
                        }
                    }
                }
                let all = dev.read(0, size).await.unwrap();
                assert_eq!(&all[..], &model[..]);
                let map = dev.block_status(0, size).await.unwrap();
                let covered: u64 = map.iter().map(|e| e.len).sum();
                assert_eq!(covered, size);
                for e in map.iter().filter(|e| e.kind == ExtentKind::Hole) {
                    assert!(model[e.offset as usize..(e.offset + e.len) as usize].iter().all(|&b| b == 0));
                }
            });
        }
    }
}
