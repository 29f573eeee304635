//! The block device that frontends (NBD, iSCSI) serve.
//!
//! Owns: the [`BlockDevice`] trait, its error taxonomy [`BlockError`], the
//! allocation map vocabulary ([`Extent`]) and [`MemoryDevice`], an in-memory
//! thin device used by frontend tests and benchmarks.
//! Must not touch: objects, components, the store, the directory. A frontend
//! sees a volume only through this trait, so the same server code runs over a
//! memory device and over a mirrored volume alike.
//! Invariants every implementation keeps:
//! - byte offsets and lengths are checked against [`DeviceInfo::size_bytes`]
//!   before anything changes ([`check_range`]); a request past the end changes
//!   nothing;
//! - a successful `write` with `fua` (or a later successful `flush`) means the
//!   data is durable;
//! - ranges that were never written, unmapped or zeroed read as zeros.

use async_trait::async_trait;
use bytes::Bytes;
use std::any::Any;

mod memory;
pub use memory::MemoryDevice;

/// What a device is, as a frontend advertises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Export / logical-unit name (the volume name).
    pub name: String,
    /// Size in bytes; a multiple of `logical_block_bytes`.
    pub size_bytes: u64,
    /// Smallest addressable unit (512e).
    pub logical_block_bytes: u32,
    /// Unit that avoids read-modify-write inside the device (4096).
    pub preferred_block_bytes: u32,
    /// Writes, trims and zeroing are refused with [`BlockError::ReadOnly`].
    pub read_only: bool,
    /// Stable 64-bit identifier, used for SCSI NAA designators.
    pub serial: u64,
}

/// Write options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteFlags {
    /// Force unit access: the write is durable when acknowledged.
    pub fua: bool,
}

/// How `write_zeroes` may store the zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroMode {
    /// The range may become unallocated (a hole); it reads as zeros.
    MayUnmap,
    /// The range must stay allocated (NBD `NO_HOLE`): space stays reserved.
    KeepAllocated,
}

/// The state of a range in a device's allocation map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentKind {
    /// Allocated and holding data (which may happen to be zeros).
    Data,
    /// Allocated, known to read as zeros.
    Zero,
    /// Not allocated: reads as zeros and occupies no space.
    Hole,
}

/// A run of bytes with one allocation state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// First byte.
    pub offset: u64,
    /// Length in bytes (> 0).
    pub len: u64,
    /// Its state.
    pub kind: ExtentKind,
}

/// Space used by one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpaceUsage {
    /// Bytes of address space holding data or reserved zeros.
    pub allocated_bytes: u64,
}

/// Errors a block device reports. Frontends map each to one NBD errno and one
/// SCSI sense code; the context (offsets) is for logs and the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    /// The request reaches past the end of the device.
    #[error("{op} of {len} bytes at offset {offset} reaches past the end of the {size_bytes}-byte device")]
    OutOfRange {
        /// Operation name.
        op: &'static str,
        /// First byte requested.
        offset: u64,
        /// Length requested.
        len: u64,
        /// Device size.
        size_bytes: u64,
    },
    /// The datastore could not allocate space for the write.
    #[error("no space left in the datastore for {len} bytes at offset {offset}")]
    NoSpace {
        /// First byte of the refused write.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// The device is read-only.
    #[error("the device is read-only")]
    ReadOnly,
    /// Every copy of a block failed its checksum.
    #[error("checksum mismatch at offset {offset} that no copy could repair")]
    Checksum {
        /// First byte of the bad block.
        offset: u64,
    },
    /// COMPARE AND WRITE found different data.
    #[error("compare failed: first differing byte at offset {offset}")]
    Miscompare {
        /// Offset of the first differing byte, relative to the request start.
        offset: u64,
    },
    /// A device or transport error.
    #[error("I/O error at offset {offset}: {detail}")]
    Io {
        /// Where it happened.
        offset: u64,
        /// What happened.
        detail: String,
    },
    /// The request may or may not have taken effect: the connection to the
    /// host that ran it broke before its answer came. Reading the range
    /// tells which.
    #[error("outcome unknown for the request at offset {offset}: {reason}")]
    OutcomeUnknown {
        /// First byte of the request.
        offset: u64,
        /// What broke.
        reason: String,
    },
    /// The volume cannot serve I/O now (no quorum, no owner, shutting down).
    #[error("volume unavailable: {reason}")]
    Unavailable {
        /// Why.
        reason: String,
    },
    /// The request is malformed beyond range (e.g. CAW buffers of different sizes).
    #[error("invalid request: {reason}")]
    Invalid {
        /// Why.
        reason: String,
    },
}

/// A block device: what a frontend serves.
#[async_trait]
pub trait BlockDevice: Send + Sync + 'static {
    /// Geometry and identity.
    fn info(&self) -> DeviceInfo;

    /// Reads `len` bytes at `offset`.
    async fn read(&self, offset: u64, len: u64) -> Result<Bytes, BlockError>;

    /// Writes `data` at `offset`.
    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<(), BlockError>;

    /// Makes every write acknowledged so far durable.
    async fn flush(&self) -> Result<(), BlockError>;

    /// Deallocates a range; it then reads as zeros and its space is returned.
    /// Partial blocks at the edges are zeroed instead.
    async fn unmap(&self, offset: u64, len: u64) -> Result<(), BlockError>;

    /// Makes a range read as zeros.
    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<(), BlockError>;

    /// Atomically: if the bytes at `offset` equal `expected`, writes `new`
    /// (same length); otherwise fails with [`BlockError::Miscompare`] and
    /// changes nothing. Atomic against every other command on the device.
    async fn compare_and_write(
        &self,
        offset: u64,
        expected: Bytes,
        new: Bytes,
    ) -> Result<(), BlockError>;

    /// Copies `len` bytes from `source` at `src_offset` to this device at
    /// `dst_offset`. A device in the same datastore as `source` may share
    /// blocks by reference instead of moving data; the default moves data.
    async fn copy_from(
        &self,
        source: &dyn BlockDevice,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), BlockError> {
        copy_by_data(source, self, src_offset, dst_offset, len).await
    }

    /// The allocation map of `[offset, offset+len)`, as contiguous extents
    /// covering the range in order. May stop early (but not before `offset`
    /// plus one extent) to bound the reply.
    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, BlockError>;

    /// Hints that a range will be read soon. The default does nothing.
    async fn cache(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        check_range(&self.info(), "cache", offset, len)
    }

    /// Space this device uses.
    fn space(&self) -> SpaceUsage;

    /// For implementations that recognise their own kind in `copy_from`.
    fn as_any(&self) -> &dyn Any;
}

/// Bytes moved per step by [`copy_by_data`]: large enough to amortise a round
/// trip, small enough to bound memory per copy.
pub const COPY_CHUNK_BYTES: u64 = 1 << 20;

/// Copies by reading from `source` and writing to `dest` in chunks. Ranges
/// the source's allocation map shows as holes or zeros are not read: the
/// destination's range is zeroed (and may become a hole), so copying a thin
/// volume moves only the data it holds and allocates no space for the rest.
pub async fn copy_by_data(
    source: &dyn BlockDevice,
    dest: &(impl BlockDevice + ?Sized),
    src_offset: u64,
    dst_offset: u64,
    len: u64,
) -> Result<(), BlockError> {
    check_range(&source.info(), "copy (source)", src_offset, len)?;
    check_range(&dest.info(), "copy (destination)", dst_offset, len)?;
    let mut done = 0;
    while done < len {
        let step = (len - done).min(COPY_CHUNK_BYTES);
        let extents = source.block_status(src_offset + done, step).await?;
        // An extent list that does not start where asked is not trusted:
        // the chunk is then copied as data.
        let first = extents
            .first()
            .filter(|e| e.offset == src_offset + done && e.len > 0);
        let (kind, run) = match first {
            Some(e) => (e.kind, e.len.min(step)),
            None => (ExtentKind::Data, step),
        };
        match kind {
            ExtentKind::Data => {
                let data = source.read(src_offset + done, run).await?;
                dest.write(dst_offset + done, data, WriteFlags::default())
                    .await?;
            }
            ExtentKind::Zero | ExtentKind::Hole => {
                dest.write_zeroes(dst_offset + done, run, ZeroMode::MayUnmap)
                    .await?;
            }
        }
        done += run;
    }
    Ok(())
}

/// Checks that `[offset, offset+len)` lies inside the device.
pub fn check_range(
    info: &DeviceInfo,
    op: &'static str,
    offset: u64,
    len: u64,
) -> Result<(), BlockError> {
    match offset.checked_add(len) {
        Some(end) if end <= info.size_bytes => Ok(()),
        _ => Err(BlockError::OutOfRange {
            op,
            offset,
            len,
            size_bytes: info.size_bytes,
        }),
    }
}

/// Checks a COMPARE AND WRITE request: both buffers the same length, the
/// range inside the device.
pub fn check_compare_and_write(
    info: &DeviceInfo,
    offset: u64,
    expected: &[u8],
    new: &[u8],
) -> Result<(), BlockError> {
    if expected.len() != new.len() {
        return Err(BlockError::Invalid {
            reason: format!(
                "compare buffer is {} bytes but write buffer is {}",
                expected.len(),
                new.len()
            ),
        });
    }
    check_range(info, "compare and write", offset, new.len() as u64)
}

/// Index of the first byte at which `a` and `b` differ, if any.
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b.iter()).position(|(x, y)| x != y)
}

/// Appends an extent, merging it with the previous one when both have the
/// same kind and touch.
pub fn push_extent(extents: &mut Vec<Extent>, offset: u64, len: u64, kind: ExtentKind) {
    if len == 0 {
        return;
    }
    if let Some(last) = extents.last_mut() {
        if last.kind == kind && last.offset + last.len == offset {
            last.len += len;
            return;
        }
    }
    extents.push(Extent { offset, len, kind });
}
