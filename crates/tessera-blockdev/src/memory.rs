//! An in-memory thin block device.
//!
//! Owns: a sparse map of 64 KiB chunks, each tracking its sixteen 4 KiB
//! blocks as data, allocated zeros or holes, split into shards so concurrent
//! I/O on different chunks rarely contends. Unwritten, unmapped and zeroed
//! blocks read as zeros; a chunk holds memory only while one of its blocks is
//! allocated, and a data buffer only while one holds data. Nothing is
//! durable: `flush` only orders. COMPARE AND WRITE takes a device-wide lock
//! that every writer also takes in shared mode, which makes it atomic
//! against all other commands. `copy_from` another memory device (or
//! itself) shares whole chunk buffers by reference, copy on write, so a
//! clone moves no data; [`MemoryDevice::physical_bytes`] counts a shared
//! buffer once across the devices holding it. An optional allocation limit
//! stands in for a datastore running out of space: a command that would
//! allocate blocks past it fails with [`BlockError::NoSpace`] and changes
//! nothing, while writes to blocks already allocated go on. A write keeps
//! the pieces of its data that cover whole chunks as they are (`Bytes` never
//! change, so no copy is needed) when the write is at most
//! `KEEP_MAX_BYTES`; a kept piece holds its whole write buffer in memory
//! until every piece of it is overwritten. Large reads fill buffers that
//! come back to the device once the reader drops them.
//! Invariants: bytes of a chunk's buffer that belong to blocks not holding
//! data are zero, so a read copies a chunk without looking at its blocks; a
//! buffer is written only while this chunk is its sole holder and owns it
//! (a kept piece is copied into an owned buffer first).

use crate::{
    check_compare_and_write, check_range, first_difference, push_extent, BlockDevice, BlockError,
    DeviceInfo, Extent, ExtentKind, SpaceUsage, WriteFlags, ZeroMode,
};
use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::{Mutex, RwLock};
use std::any::Any;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Allocation unit, in bytes.
const BLOCK: u64 = 4096;
/// Blocks per chunk: a 256 KiB request touches four map entries, not 64.
const CHUNK_BLOCKS: u64 = 16;
/// Chunk size, in bytes.
const CHUNK: u64 = BLOCK * CHUNK_BLOCKS;
/// Shards of the chunk map; a power of two well above the worker count.
const SHARDS: usize = 64;
/// Largest write whose whole-chunk pieces are kept by reference rather than
/// copied: a kept piece holds its whole write buffer in memory, so this
/// bounds that buffer to sixteen chunks.
const KEEP_MAX_BYTES: u64 = 16 * CHUNK;

/// Hashes chunk numbers with the splitmix64 finaliser: they are trusted
/// integers, so the DoS resistance of the default SipHash buys nothing.
#[derive(Default)]
struct ChunkHasher(u64);

impl Hasher for ChunkHasher {
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

/// The `CHUNK` bytes of a chunk that holds data. Either kind is shared
/// between chunks (of this or another device) after a copy, until one of
/// them writes.
#[derive(Clone)]
enum ChunkBytes {
    /// A buffer of the device's own, written in place while unshared; the
    /// bytes sit right behind the reference count, one hop from the map
    /// (small random reads mostly miss the cache here).
    Owned(Arc<[u8]>),
    /// A whole-chunk piece of a write's data, kept as the writer handed it
    /// over instead of copied (`Bytes` never change); the first write to
    /// part of the chunk copies it into an owned buffer.
    Kept(Arc<Bytes>),
}

impl ChunkBytes {
    fn bytes(&self) -> &[u8] {
        match self {
            ChunkBytes::Owned(bytes) => bytes,
            ChunkBytes::Kept(bytes) => bytes,
        }
    }

    /// Chunks holding this buffer.
    fn holders(&self) -> usize {
        match self {
            ChunkBytes::Owned(bytes) => Arc::strong_count(bytes),
            ChunkBytes::Kept(bytes) => Arc::strong_count(bytes),
        }
    }
}

/// Sixteen blocks: which hold data, which are allocated zeros.
#[derive(Default, Clone)]
struct Chunk {
    /// `CHUNK` bytes while some block holds data.
    data: Option<ChunkBytes>,
    data_mask: u16,
    zero_mask: u16,
}

impl Chunk {
    fn kind(&self, index: u64) -> ExtentKind {
        let bit = 1u16 << index;
        if self.data_mask & bit != 0 {
            ExtentKind::Data
        } else if self.zero_mask & bit != 0 {
            ExtentKind::Zero
        } else {
            ExtentKind::Hole
        }
    }

    fn allocated(&self) -> u64 {
        (self.data_mask | self.zero_mask).count_ones() as u64
    }

    /// The chunk's bytes, writable: a buffer shared with another chunk or
    /// kept from a write is first copied into one of the chunk's own.
    fn buffer(&mut self) -> &mut [u8] {
        let data = self
            .data
            .get_or_insert_with(|| ChunkBytes::Owned(Arc::from(vec![0u8; CHUNK as usize])));
        if let ChunkBytes::Kept(kept) = data {
            *data = ChunkBytes::Owned(Arc::from(&kept[..]));
        }
        match data {
            ChunkBytes::Owned(bytes) => Arc::make_mut(bytes),
            ChunkBytes::Kept(_) => unreachable!("a kept piece was just copied"),
        }
    }

    /// Zeros the bytes of a block that stops holding data.
    fn clear_block(&mut self, index: u64) {
        if self.data.is_some() {
            let at = (index * BLOCK) as usize;
            self.buffer()[at..at + BLOCK as usize].fill(0);
        }
    }

    /// Makes every block hold data, taken from `data` (`CHUNK` bytes)
    /// without a copy; returns the buffer the chunk held before, to be
    /// dropped outside the shard lock.
    fn keep(&mut self, data: Bytes) -> Option<ChunkBytes> {
        self.data_mask = u16::MAX;
        self.zero_mask = 0;
        self.data.replace(ChunkBytes::Kept(Arc::new(data)))
    }
}

type ChunkMap = HashMap<u64, Chunk, BuildHasherDefault<ChunkHasher>>;

/// The device lock an allocating command holds while it runs.
enum AllocationGuard<'a> {
    Shared {
        _held: parking_lot::RwLockReadGuard<'a, ()>,
    },
    Exclusive {
        _held: parking_lot::RwLockWriteGuard<'a, ()>,
    },
}

/// Buffers of large reads, given back when every `Bytes` cut from them is
/// dropped (a frontend drops a reply once it is sent) and reused by later
/// reads: such a buffer is still mapped, and usually still in cache, where a
/// new allocation of that size goes back and forth to the kernel through
/// the allocator and is faulted in page by page.
#[derive(Default)]
struct ReadBuffers {
    free: Mutex<Vec<Vec<u8>>>,
}

/// Reads of at least this many bytes get a reused buffer; smaller ones are
/// cheap to allocate.
const REUSED_READ_MIN_BYTES: usize = CHUNK as usize;
/// Most bytes of free read buffers a device keeps, and the largest buffer
/// it keeps.
const REUSED_READ_MAX_BYTES: usize = 8 << 20;

impl ReadBuffers {
    /// An empty buffer with room for exactly `len` bytes.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock();
        match free.iter().rposition(|b| b.capacity() == len) {
            Some(at) => free.remove(at),
            None => Vec::with_capacity(len),
        }
    }

    fn give_back(&self, mut buffer: Vec<u8>) {
        let mut free = self.free.lock();
        let held: usize = free.iter().map(Vec::capacity).sum();
        if held + buffer.capacity() <= REUSED_READ_MAX_BYTES {
            buffer.clear();
            free.push(buffer);
        }
    }
}

/// A read's buffer while `Bytes` point into it.
struct ReadBuffer {
    bytes: Vec<u8>,
    home: Arc<ReadBuffers>,
}

impl AsRef<[u8]> for ReadBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for ReadBuffer {
    fn drop(&mut self) {
        self.home.give_back(std::mem::take(&mut self.bytes));
    }
}

/// A thin device held in memory.
pub struct MemoryDevice {
    info: DeviceInfo,
    shards: Vec<Mutex<ChunkMap>>,
    read_buffers: Arc<ReadBuffers>,
    allocated_blocks: AtomicU64,
    /// Writers take it shared; COMPARE AND WRITE takes it exclusively, and
    /// so does every allocating command while an allocation limit is set
    /// (counting the blocks it needs and allocating them is one step).
    atomicity: RwLock<()>,
    /// Most blocks the device may hold allocated.
    allocation_limit: Option<u64>,
}

/// Splits `[offset, end)` into pieces that stay inside one chunk:
/// `(chunk number, offset within the chunk, length)`.
fn chunk_pieces(offset: u64, end: u64) -> impl Iterator<Item = (u64, u64, u64)> {
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let chunk = pos / CHUNK;
        let within = pos % CHUNK;
        let step = (CHUNK - within).min(end - pos);
        pos += step;
        Some((chunk, within, step))
    })
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
                .map(|_| Mutex::new(ChunkMap::default()))
                .collect(),
            read_buffers: Arc::default(),
            allocated_blocks: AtomicU64::new(0),
            atomicity: RwLock::new(()),
            allocation_limit: None,
        }
    }

    /// The same device, allocating at most `bytes` (rounded up to whole
    /// 4 KiB blocks): what a thin volume meets when its datastore is full.
    pub fn with_allocation_limit(mut self, bytes: u64) -> Self {
        self.allocation_limit = Some(bytes.div_ceil(BLOCK));
        self
    }

    /// Blocks touched by `[offset, offset + len)` not allocated yet.
    fn unallocated_blocks(&self, offset: u64, len: u64) -> u64 {
        let mut count = 0;
        for (chunk, within, step) in chunk_pieces(offset, offset + len) {
            let shard = self.shard(chunk).lock();
            let entry = shard.get(&chunk);
            count += (within / BLOCK..(within + step).div_ceil(BLOCK))
                .filter(|&index| entry.is_none_or(|c| c.kind(index) == ExtentKind::Hole))
                .count() as u64;
        }
        count
    }

    /// Blocks a `copy_from` would add, net, following its own plan: whole
    /// chunks are replaced by the source's, everything else is written.
    fn copy_needs(&self, source: &MemoryDevice, src_offset: u64, dst_offset: u64, len: u64) -> u64 {
        let overlapping = std::ptr::eq(source, self)
            && src_offset < dst_offset + len
            && dst_offset < src_offset + len;
        if overlapping || src_offset % CHUNK != dst_offset % CHUNK {
            return self.unallocated_blocks(dst_offset, len);
        }
        let mut needed = 0;
        for (chunk, within, step) in chunk_pieces(dst_offset, dst_offset + len) {
            if step == CHUNK {
                let src_chunk = (src_offset + chunk * CHUNK - dst_offset) / CHUNK;
                let incoming = source
                    .shard(src_chunk)
                    .lock()
                    .get(&src_chunk)
                    .map_or(0, Chunk::allocated);
                let present = self
                    .shard(chunk)
                    .lock()
                    .get(&chunk)
                    .map_or(0, Chunk::allocated);
                needed += incoming.saturating_sub(present);
            } else {
                needed += self.unallocated_blocks(chunk * CHUNK + within, step);
            }
        }
        needed
    }

    /// Takes the lock an allocating command runs under and checks that the
    /// `needed` blocks (computed under it) fit in the allocation limit.
    fn allocating<'a>(
        &'a self,
        offset: u64,
        len: u64,
        needed: impl FnOnce() -> u64,
    ) -> Result<AllocationGuard<'a>, BlockError> {
        let Some(limit) = self.allocation_limit else {
            return Ok(AllocationGuard::Shared {
                _held: self.atomicity.read(),
            });
        };
        let guard = self.atomicity.write();
        let allocated = self.allocated_blocks.load(Ordering::Relaxed);
        if allocated + needed() > limit {
            return Err(BlockError::NoSpace { offset, len });
        }
        Ok(AllocationGuard::Exclusive { _held: guard })
    }

    /// The same device with 4096-byte logical blocks ("4Kn") instead of
    /// 512-byte ones over 4 KiB physical blocks ("512e"). The size must be
    /// a multiple of 4096.
    pub fn with_4k_logical_blocks(mut self) -> Self {
        self.info.logical_block_bytes = 4096;
        self
    }

    /// The same device, refusing writes.
    pub fn read_only(mut self) -> Self {
        self.info.read_only = true;
        self
    }

    /// The shard of a chunk, by a hash of its number: streams that run in
    /// step at distances that are multiples of the shard count (4 fio jobs
    /// 256 MiB apart) would otherwise take the same locks in turn.
    fn shard(&self, chunk: u64) -> &Mutex<ChunkMap> {
        let mut hasher = ChunkHasher::default();
        hasher.write_u64(chunk);
        &self.shards[(hasher.finish() >> 58) as usize & (SHARDS - 1)]
    }

    fn writable(&self) -> Result<(), BlockError> {
        if self.info.read_only {
            Err(BlockError::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// Each output byte is written once (copied or zero-filled).
    fn read_now(&self, offset: u64, len: u64) -> Bytes {
        let len = len as usize;
        if !(REUSED_READ_MIN_BYTES..=REUSED_READ_MAX_BYTES).contains(&len) {
            let mut out = BytesMut::with_capacity(len);
            self.read_into(offset, len as u64, &mut out);
            return out.freeze();
        }
        let mut out = self.read_buffers.take(len);
        self.read_into(offset, len as u64, &mut out);
        Bytes::from_owner(ReadBuffer {
            bytes: out,
            home: self.read_buffers.clone(),
        })
    }

    /// Appends the `len` bytes at `offset` to `out`.
    fn read_into(&self, offset: u64, len: u64, out: &mut impl BufMut) {
        for (chunk, within, step) in chunk_pieces(offset, offset + len) {
            let shard = self.shard(chunk).lock();
            match shard.get(&chunk).and_then(|c| c.data.as_ref()) {
                Some(data) => {
                    out.put_slice(&data.bytes()[within as usize..(within + step) as usize])
                }
                None => out.put_bytes(0, step as usize),
            }
        }
    }

    /// Pieces of `data` that cover a whole chunk are kept by reference when
    /// `data` is at most [`KEEP_MAX_BYTES`]; the rest is copied.
    fn write_now(&self, offset: u64, data: &Bytes) {
        let keep = data.len() as u64 <= KEEP_MAX_BYTES;
        let mut added = 0u64;
        for (chunk, within, step) in chunk_pieces(offset, offset + data.len() as u64) {
            let src_at = (chunk * CHUNK + within - offset) as usize;
            let src = &data[src_at..src_at + step as usize];
            let mut shard = self.shard(chunk).lock();
            let entry = shard.entry(chunk).or_default();
            let before = entry.allocated();
            let replaced = if keep && step == CHUNK {
                entry.keep(data.slice(src_at..src_at + CHUNK as usize))
            } else {
                entry.buffer()[within as usize..(within + step) as usize].copy_from_slice(src);
                for index in within / BLOCK..(within + step).div_ceil(BLOCK) {
                    let bit = 1u16 << index;
                    entry.zero_mask &= !bit;
                    entry.data_mask |= bit;
                }
                None
            };
            added += entry.allocated() - before;
            drop(shard);
            drop(replaced);
        }
        self.allocated_blocks.fetch_add(added, Ordering::Relaxed);
    }

    /// Whole blocks become holes (or allocated zeros); partial edges are zeroed.
    fn zero_now(&self, offset: u64, len: u64, mode: ZeroMode) {
        let (mut added, mut removed) = (0u64, 0u64);
        for (chunk, within, step) in chunk_pieces(offset, offset + len) {
            let mut shard = self.shard(chunk).lock();
            if mode == ZeroMode::MayUnmap && !shard.contains_key(&chunk) {
                continue;
            }
            let entry = shard.entry(chunk).or_default();
            let before = entry.allocated();
            let end = within + step;
            let mut pos = within;
            while pos < end {
                let index = pos / BLOCK;
                let block_end = ((index + 1) * BLOCK).min(end);
                let bit = 1u16 << index;
                if pos % BLOCK == 0 && block_end - pos == BLOCK {
                    if entry.data_mask & bit != 0 {
                        entry.clear_block(index);
                    }
                    entry.data_mask &= !bit;
                    match mode {
                        ZeroMode::MayUnmap => entry.zero_mask &= !bit,
                        ZeroMode::KeepAllocated => entry.zero_mask |= bit,
                    }
                } else if entry.data_mask & bit != 0 {
                    entry.buffer()[pos as usize..block_end as usize].fill(0);
                }
                pos = block_end;
            }
            let after = entry.allocated();
            if entry.data_mask == 0 {
                entry.data = None;
            }
            if after == 0 {
                shard.remove(&chunk);
            }
            if after > before {
                added += after - before;
            } else {
                removed += before - after;
            }
        }
        self.allocated_blocks.fetch_add(added, Ordering::Relaxed);
        self.allocated_blocks.fetch_sub(removed, Ordering::Relaxed);
    }
}

impl MemoryDevice {
    /// Bytes of data this device keeps in memory, a buffer shared with other
    /// chunks counted as its share: summed over the devices of one
    /// datastore, the memory their data really takes.
    pub fn physical_bytes(&self) -> u64 {
        let mut total = 0u64;
        for shard in &self.shards {
            for chunk in shard.lock().values() {
                if let Some(data) = &chunk.data {
                    let blocks = chunk.data_mask.count_ones() as u64;
                    total += blocks * BLOCK / data.holders() as u64;
                }
            }
        }
        total
    }

    /// Makes chunk `dst_chunk` of this device hold what chunk `src_chunk` of
    /// `source` holds, sharing its buffer.
    fn share_chunk(&self, source: &MemoryDevice, src_chunk: u64, dst_chunk: u64) {
        let copied = source
            .shard(src_chunk)
            .lock()
            .get(&src_chunk)
            .cloned()
            .unwrap_or_default();
        let added = copied.allocated();
        let mut shard = self.shard(dst_chunk).lock();
        let removed = if added == 0 {
            shard.remove(&dst_chunk).map_or(0, |c| c.allocated())
        } else {
            shard.insert(dst_chunk, copied).map_or(0, |c| c.allocated())
        };
        drop(shard);
        self.allocated_blocks.fetch_add(added, Ordering::Relaxed);
        self.allocated_blocks.fetch_sub(removed, Ordering::Relaxed);
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
        let len = data.len() as u64;
        check_range(&self.info, "write", offset, len)?;
        let _guard = self.allocating(offset, len, || self.unallocated_blocks(offset, len))?;
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
        let _guard = self.allocating(offset, len, || match mode {
            ZeroMode::MayUnmap => 0,
            ZeroMode::KeepAllocated => self.unallocated_blocks(offset, len),
        })?;
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
        check_compare_and_write(&self.info, offset, &expected, &new)?;
        let _exclusive = self.atomicity.write();
        let len = new.len() as u64;
        let current = self.read_now(offset, len);
        if let Some(at) = first_difference(&current, &expected) {
            return Err(BlockError::Miscompare { offset: at as u64 });
        }
        if let Some(limit) = self.allocation_limit {
            let needed = self.unallocated_blocks(offset, len);
            if self.allocated_blocks.load(Ordering::Relaxed) + needed > limit {
                return Err(BlockError::NoSpace { offset, len });
            }
        }
        self.write_now(offset, &new);
        Ok(())
    }

    /// From another memory device (or this one), whole chunks at the same
    /// offset within a chunk on both sides are shared by reference; the
    /// ragged edges are copied.
    async fn copy_from(
        &self,
        source: &dyn BlockDevice,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), BlockError> {
        let Some(memory) = source.as_any().downcast_ref::<MemoryDevice>() else {
            return crate::copy_by_data(source, self, src_offset, dst_offset, len).await;
        };
        self.writable()?;
        check_range(&memory.info, "copy (source)", src_offset, len)?;
        check_range(&self.info, "copy (destination)", dst_offset, len)?;
        let _guard = self.allocating(dst_offset, len, || {
            self.copy_needs(memory, src_offset, dst_offset, len)
        })?;
        let overlapping = std::ptr::eq(memory, self)
            && src_offset < dst_offset + len
            && dst_offset < src_offset + len;
        if overlapping || src_offset % CHUNK != dst_offset % CHUNK {
            let data = memory.read_now(src_offset, len);
            self.write_now(dst_offset, &data);
            return Ok(());
        }
        for (chunk, within, step) in chunk_pieces(dst_offset, dst_offset + len) {
            let at = chunk * CHUNK + within - dst_offset;
            if step == CHUNK {
                self.share_chunk(memory, (src_offset + at) / CHUNK, chunk);
            } else {
                let data = memory.read_now(src_offset + at, step);
                self.write_now(dst_offset + at, &data);
            }
        }
        Ok(())
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, BlockError> {
        check_range(&self.info, "block status", offset, len)?;
        let mut extents = Vec::new();
        for (chunk, within, step) in chunk_pieces(offset, offset + len) {
            let shard = self.shard(chunk).lock();
            let entry = shard.get(&chunk);
            let end = within + step;
            let mut pos = within;
            while pos < end {
                let index = pos / BLOCK;
                let block_end = ((index + 1) * BLOCK).min(end);
                let kind = entry.map_or(ExtentKind::Hole, |c| c.kind(index));
                push_extent(&mut extents, chunk * CHUNK + pos, block_end - pos, kind);
                pos = block_end;
            }
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
    fn a_data_copy_moves_only_what_the_source_holds() {
        let source = MemoryDevice::new("s", 4 << 20);
        let dest = MemoryDevice::new("d", 4 << 20);
        block_on(async {
            let data = |b: u8, n: u64| Bytes::from(vec![b; n as usize]);
            source
                .write(8 * BLOCK, data(7, 3 * BLOCK), WriteFlags::default())
                .await
                .unwrap();
            // Old data in the destination must not survive under the holes.
            dest.write(0, data(9, 2 << 20), WriteFlags::default())
                .await
                .unwrap();
            crate::copy_by_data(&source, &dest, 0, 0, 3 << 20)
                .await
                .unwrap();
            assert_eq!(
                dest.read(0, 3 << 20).await.unwrap(),
                source.read(0, 3 << 20).await.unwrap()
            );
            assert_eq!(dest.space().allocated_bytes, 3 * BLOCK);
        });
    }

    #[test]
    fn allocation_limit_refuses_only_writes_that_need_space() {
        let dev = MemoryDevice::new("t", 1 << 20).with_allocation_limit(3 * BLOCK);
        let source = MemoryDevice::new("s", 1 << 20);
        block_on(async {
            let data = |b: u8, n: u64| Bytes::from(vec![b; n as usize]);
            dev.write(0, data(1, 2 * BLOCK), WriteFlags::default())
                .await
                .unwrap();
            // Two more blocks do not fit; nothing of the write lands.
            let refused = dev
                .write(2 * BLOCK, data(2, 2 * BLOCK), WriteFlags::default())
                .await;
            assert_eq!(
                refused,
                Err(BlockError::NoSpace {
                    offset: 2 * BLOCK,
                    len: 2 * BLOCK
                })
            );
            assert_eq!(dev.space().allocated_bytes, 2 * BLOCK);
            assert!(dev
                .read(2 * BLOCK, 2 * BLOCK)
                .await
                .unwrap()
                .iter()
                .all(|&b| b == 0));
            // Allocated blocks stay writable, and one more block fits.
            dev.write(100, data(3, 8000), WriteFlags::default())
                .await
                .unwrap();
            dev.write(2 * BLOCK, data(4, 512), WriteFlags::default())
                .await
                .unwrap();
            let full = dev
                .compare_and_write(3 * BLOCK, data(0, 512), data(5, 512))
                .await;
            assert!(matches!(full, Err(BlockError::NoSpace { .. })));
            let zeros = dev
                .write_zeroes(3 * BLOCK, BLOCK, ZeroMode::KeepAllocated)
                .await;
            assert!(matches!(zeros, Err(BlockError::NoSpace { .. })));
            source
                .write(0, data(6, CHUNK), WriteFlags::default())
                .await
                .unwrap();
            let copy = dev.copy_from(&source, 0, CHUNK, CHUNK).await;
            assert!(matches!(copy, Err(BlockError::NoSpace { .. })));
            // A copy of holes needs nothing; space given back is usable.
            dev.copy_from(&source, 2 * CHUNK, CHUNK, CHUNK)
                .await
                .unwrap();
            dev.unmap(0, 2 * BLOCK).await.unwrap();
            dev.write(3 * BLOCK, data(7, 2 * BLOCK), WriteFlags::default())
                .await
                .unwrap();
            assert_eq!(dev.space().allocated_bytes, 3 * BLOCK);
        });
    }

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
    fn whole_chunks_of_a_write_are_kept_and_later_writes_leave_the_writer_buffer_alone() {
        let dev = MemoryDevice::new("t", 8 * CHUNK);
        block_on(async {
            // Ragged at both ends: two whole chunks in the middle are kept.
            let payload = Bytes::from(vec![3u8; (3 * CHUNK) as usize]);
            let at = CHUNK / 2;
            dev.write(at, payload.clone(), WriteFlags::default())
                .await
                .unwrap();
            assert_eq!(dev.space().allocated_bytes, 3 * CHUNK);
            assert_eq!(dev.physical_bytes(), 3 * CHUNK);
            // A partial write, a zeroed block and an unmapped block inside
            // kept chunks change the device, not the caller's buffer.
            dev.write(
                CHUNK + 100,
                Bytes::from(vec![9u8; 50]),
                WriteFlags::default(),
            )
            .await
            .unwrap();
            dev.write_zeroes(2 * CHUNK, BLOCK, ZeroMode::KeepAllocated)
                .await
                .unwrap();
            dev.unmap(2 * CHUNK + BLOCK, BLOCK).await.unwrap();
            assert!(payload.iter().all(|&b| b == 3));
            let mut model = vec![0u8; (8 * CHUNK) as usize];
            model[at as usize..(at + 3 * CHUNK) as usize].fill(3);
            model[(CHUNK + 100) as usize..(CHUNK + 150) as usize].fill(9);
            model[(2 * CHUNK) as usize..(2 * CHUNK + 2 * BLOCK) as usize].fill(0);
            assert_eq!(&dev.read(0, 8 * CHUNK).await.unwrap()[..], &model[..]);
            assert_eq!(dev.space().allocated_bytes, 3 * CHUNK - BLOCK);
            let map = dev.block_status(2 * CHUNK, 3 * BLOCK).await.unwrap();
            let kinds: Vec<ExtentKind> = map.iter().map(|e| e.kind).collect();
            assert_eq!(
                kinds,
                vec![ExtentKind::Zero, ExtentKind::Hole, ExtentKind::Data]
            );
            // A copy shares a kept chunk like any other.
            let other = MemoryDevice::new("o", 8 * CHUNK);
            other.copy_from(&dev, CHUNK, 0, CHUNK).await.unwrap();
            assert_eq!(
                other.read(0, CHUNK).await.unwrap(),
                dev.read(CHUNK, CHUNK).await.unwrap()
            );
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

    #[test]
    fn copy_between_devices_shares_chunks_and_copies_on_write() {
        let size = 8 * CHUNK;
        let a = MemoryDevice::new("a", size);
        let b = MemoryDevice::new("b", size);
        block_on(async {
            a.write(
                0,
                Bytes::from(vec![5u8; (4 * CHUNK) as usize]),
                WriteFlags::default(),
            )
            .await
            .unwrap();
            assert_eq!(a.physical_bytes(), 4 * CHUNK);
            b.copy_from(&a, 0, 2 * CHUNK, 4 * CHUNK).await.unwrap();
            assert_eq!(
                b.read(2 * CHUNK, 4 * CHUNK).await.unwrap(),
                a.read(0, 4 * CHUNK).await.unwrap()
            );
            assert_eq!(b.space().allocated_bytes, 4 * CHUNK);
            // Shared: the two devices together still hold one copy.
            assert_eq!(a.physical_bytes() + b.physical_bytes(), 4 * CHUNK);
            b.write(
                2 * CHUNK,
                Bytes::from(vec![9u8; 512]),
                WriteFlags::default(),
            )
            .await
            .unwrap();
            assert!(a.read(0, 512).await.unwrap().iter().all(|&x| x == 5));
            assert!(b
                .read(2 * CHUNK, 512)
                .await
                .unwrap()
                .iter()
                .all(|&x| x == 9));
            // Unaligned copies move data, holes and all.
            b.copy_from(&a, 100, 7 * CHUNK + 12, 1000).await.unwrap();
            assert!(b
                .read(7 * CHUNK + 12, 1000)
                .await
                .unwrap()
                .iter()
                .all(|&x| x == 5));
            let err = b.copy_from(&a, size - 10, 0, 20).await.unwrap_err();
            assert!(matches!(err, BlockError::OutOfRange { .. }));
        });
    }

    proptest! {
        /// Copies within one device agree with `copy_within` on a flat model,
        /// and shared buffers never count for more than the data they hold.
        #[test]
        fn self_copies_agree_with_flat_model(ops in proptest::collection::vec((any::<bool>(), 0u64..(4 * CHUNK), 0u64..(4 * CHUNK), 1u64..(2 * CHUNK), any::<u8>()), 1..40)) {
            let size = 4 * CHUNK;
            let dev = MemoryDevice::new("c", size);
            let mut model = vec![0u8; size as usize];
            block_on(async {
                for (copy, from, to, len, byte) in ops {
                    if copy {
                        let len = len.min(size - from).min(size - to);
                        if len == 0 { continue; }
                        dev.copy_from(&dev, from, to, len).await.unwrap();
                        model.copy_within(from as usize..(from + len) as usize, to as usize);
                    } else {
                        let len = len.min(size - from);
                        dev.write(from, Bytes::from(vec![byte; len as usize]), WriteFlags::default()).await.unwrap();
                        model[from as usize..(from + len) as usize].fill(byte);
                    }
                }
                let all = dev.read(0, size).await.unwrap();
                assert_eq!(&all[..], &model[..]);
                assert!(dev.physical_bytes() <= dev.space().allocated_bytes);
            });
        }

        /// The device agrees with a flat byte array under random operations,
        /// its allocation map with a per-block model, and its space with the
        /// blocks that model holds allocated.
        #[test]
        fn agrees_with_flat_model(ops in proptest::collection::vec((0u8..4, 0u64..(3 * CHUNK), 1u64..(CHUNK + 9000), any::<u8>()), 1..60)) {
            let size = 3 * CHUNK;
            let dev = MemoryDevice::new("m", size);
            let mut model = vec![0u8; size as usize];
            // Per 4 KiB block: what the allocation map must say.
            let mut kinds = vec![ExtentKind::Hole; (size / BLOCK) as usize];
            let whole = |offset: u64, len: u64| (offset.div_ceil(BLOCK)..(offset + len) / BLOCK).map(|b| b as usize);
            block_on(async {
                for (kind, offset, len, byte) in ops {
                    let len = len.min(size - offset);
                    if len == 0 { continue; }
                    match kind {
                        0 => {
                            dev.write(offset, Bytes::from(vec![byte; len as usize]), WriteFlags::default()).await.unwrap();
                            model[offset as usize..(offset + len) as usize].fill(byte);
                            for b in offset / BLOCK..(offset + len).div_ceil(BLOCK) {
                                kinds[b as usize] = ExtentKind::Data;
                            }
                        }
                        1 => {
                            dev.unmap(offset, len).await.unwrap();
                            model[offset as usize..(offset + len) as usize].fill(0);
                            for b in whole(offset, len) {
                                kinds[b] = ExtentKind::Hole;
                            }
                        }
                        2 => {
                            dev.write_zeroes(offset, len, ZeroMode::KeepAllocated).await.unwrap();
                            model[offset as usize..(offset + len) as usize].fill(0);
                            for b in whole(offset, len) {
                                kinds[b] = ExtentKind::Zero;
                            }
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
                for e in &map {
                    for b in e.offset / BLOCK..(e.offset + e.len) / BLOCK {
                        assert_eq!(kinds[b as usize], e.kind, "block {}", b);
                    }
                }
                let allocated = kinds.iter().filter(|k| **k != ExtentKind::Hole).count() as u64;
                assert_eq!(dev.space().allocated_bytes, allocated * BLOCK);
            });
        }
    }
}
