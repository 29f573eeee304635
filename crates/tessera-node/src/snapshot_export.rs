//! Read-only exports of snapshots, `volume@snapshot`, for backups and for
//! looking at a point in time without touching the volume.
//!
//! Owns: [`SnapshotDevice`], a `BlockDevice` over a snapshot's components
//! (its record's layout) that reads each piece from a copy of its column,
//! trying the others when one fails, and answers block status from the
//! same copies' allocation (unmapped ranges are holes, so a backup or a
//! full clone's fill skips them); and the names a snapshot is served
//! under: its NBD export name and its iSCSI target name.
//! Must not touch: the volume's owner or coordinator: a snapshot never
//! changes, so any host reads it from any copy, with no ordering to keep.
//! Invariant: nothing is ever written through it (`BlockError::ReadOnly`).

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use std::any::Any;
use std::sync::Arc;
use tessera_blockdev::{
    check_range, push_extent, BlockDevice, BlockError, DeviceInfo, Extent, ExtentKind, SpaceUsage,
    WriteFlags, ZeroMode,
};
use tessera_directory::keys::SnapshotRecord;
use tessera_object::{ComponentIo, IoClass};
use tessera_types::{HostId, Lba, BLOCK_BYTES};

/// Separates a volume's name from its snapshot's in an export name.
pub const SNAPSHOT_SEPARATOR: char = '@';

/// The export name of a snapshot.
pub fn export_name(record: &SnapshotRecord) -> String {
    format!("{}{SNAPSHOT_SEPARATOR}{}", record.volume, record.name)
}

/// The iSCSI target name of snapshot `snapshot` of `volume`: the volume's
/// target name, `:` and the snapshot's name with upper case letters and
/// `_` escaped (see `tessera_iscsi::target_name_for_snapshot`).
pub fn iscsi_target_name(volume: &str, snapshot: &str) -> String {
    tessera_iscsi::target_name_for_snapshot(volume, snapshot)
}

/// Bytes read from one copy per request.
const READ_BYTES_MAX: u64 = 1 << 20;

/// A snapshot served read-only.
pub struct SnapshotDevice {
    info: DeviceInfo,
    record: SnapshotRecord,
    io: Arc<dyn ComponentIo>,
    /// The host serving it: its own copy is read first.
    host: HostId,
    /// The queue its reads travel on: a client's, or the resync queue for
    /// a copy made in the background (a full clone's fill).
    class: IoClass,
}

impl SnapshotDevice {
    /// The snapshot `record`, read through `io` from `host`.
    pub fn new(record: SnapshotRecord, io: Arc<dyn ComponentIo>, host: HostId) -> SnapshotDevice {
        SnapshotDevice {
            info: DeviceInfo {
                name: export_name(&record),
                size_bytes: record.size_bytes,
                logical_block_bytes: record.block_bytes,
                preferred_block_bytes: BLOCK_BYTES as u32,
                read_only: true,
                serial: record.id,
            },
            record,
            io,
            host,
            class: IoClass::Guest,
        }
    }

    /// The same device reading on the resync queue, so a copy made in the
    /// background never delays clients' I/O on the transport.
    pub fn for_background_copy(mut self) -> SnapshotDevice {
        self.class = IoClass::Resync;
        self
    }

    /// The snapshot's record.
    pub fn record(&self) -> &SnapshotRecord {
        &self.record
    }

    /// The copies of `column`, this host's first.
    fn copies(&self, column: usize) -> Vec<&tessera_types::layout::ComponentPlacement> {
        let mut copies: Vec<_> = self.record.layout.columns[column].copies.iter().collect();
        copies.sort_by_key(|c| c.host != self.host);
        copies
    }

    /// Runs of allocated blocks of `column` within `[first, first+count)`,
    /// from the first copy that answers (every copy of a snapshot holds the
    /// same).
    async fn allocated_in_column(
        &self,
        column: usize,
        first: u64,
        count: u64,
    ) -> Result<Vec<(Lba, u64)>, BlockError> {
        let mut failures = Vec::new();
        for copy in self.copies(column) {
            match self.io.allocated(copy, Lba(first), count).await {
                Ok(runs) => return Ok(runs),
                Err(e) => failures.push(e.to_string()),
            }
        }
        Err(BlockError::Unavailable {
            reason: format!(
                "snapshot {}: the allocation of column {column} could not be read from any copy: {}",
                self.info.name,
                failures.join("; ")
            ),
        })
    }

    /// Reads whole blocks `[start, end)` of the snapshot.
    async fn read_aligned(&self, start: u64, end: u64) -> Result<BytesMut, BlockError> {
        let mut out = BytesMut::zeroed((end - start) as usize);
        for piece in self.record.layout.map_range(start, end - start) {
            let mut done = 0;
            while done < piece.len {
                let len = (piece.len - done).min(READ_BYTES_MAX);
                let at = piece.component_offset + done;
                let data = self.read_column(piece.column, at, len).await?;
                let to = (piece.buffer_offset + done) as usize;
                out[to..to + len as usize].copy_from_slice(&data);
                done += len;
            }
        }
        Ok(out)
    }

    /// `len` bytes at `offset` of column `column`, from the first copy that
    /// answers (this host's first).
    async fn read_column(&self, column: usize, offset: u64, len: u64) -> Result<Bytes, BlockError> {
        let mut failures = Vec::new();
        for copy in self.copies(column) {
            match self
                .io
                .read(
                    copy,
                    Lba(offset / BLOCK_BYTES),
                    (len / BLOCK_BYTES) as u32,
                    self.class,
                )
                .await
            {
                Ok(data) => return Ok(data),
                Err(e) => failures.push(e.to_string()),
            }
        }
        Err(BlockError::Unavailable {
            reason: format!(
                "snapshot {}: no copy of column {column} could be read: {}",
                self.info.name,
                failures.join("; ")
            ),
        })
    }
}

#[async_trait]
impl BlockDevice for SnapshotDevice {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    async fn read(&self, offset: u64, len: u64) -> Result<Bytes, BlockError> {
        check_range(&self.info, "read", offset, len)?;
        if len == 0 {
            return Ok(Bytes::new());
        }
        let start = offset / BLOCK_BYTES * BLOCK_BYTES;
        let end = (offset + len).div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        let blocks = self.read_aligned(start, end).await?.freeze();
        let skip = (offset - start) as usize;
        Ok(blocks.slice(skip..skip + len as usize))
    }

    async fn write(
        &self,
        _offset: u64,
        _data: Bytes,
        _flags: WriteFlags,
    ) -> Result<(), BlockError> {
        Err(BlockError::ReadOnly)
    }

    async fn flush(&self) -> Result<(), BlockError> {
        Ok(())
    }

    async fn unmap(&self, _offset: u64, _len: u64) -> Result<(), BlockError> {
        Err(BlockError::ReadOnly)
    }

    async fn write_zeroes(
        &self,
        _offset: u64,
        _len: u64,
        _mode: ZeroMode,
    ) -> Result<(), BlockError> {
        Err(BlockError::ReadOnly)
    }

    async fn compare_and_write(
        &self,
        _offset: u64,
        _expected: Bytes,
        _new: Bytes,
    ) -> Result<(), BlockError> {
        Err(BlockError::ReadOnly)
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, BlockError> {
        check_range(&self.info, "block status", offset, len)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        // Whole blocks, as the copies' allocation is kept; each piece of
        // the range from a copy of its column.
        let start = offset / BLOCK_BYTES * BLOCK_BYTES;
        let end = (offset + len).div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        let mut extents: Vec<Extent> = Vec::new();
        for piece in self.record.layout.map_range(start, end - start) {
            let first = piece.component_offset / BLOCK_BYTES;
            let count = piece.len / BLOCK_BYTES;
            let runs = self.allocated_in_column(piece.column, first, count).await?;
            let piece_start = start + piece.buffer_offset;
            let mut pos = first;
            for (lba, run) in runs {
                let (rs, re) = (lba.0.max(first), (lba.0 + run).min(first + count));
                if rs >= re {
                    continue;
                }
                if rs > pos {
                    push_extent(
                        &mut extents,
                        piece_start + (pos - first) * BLOCK_BYTES,
                        (rs - pos) * BLOCK_BYTES,
                        ExtentKind::Hole,
                    );
                }
                push_extent(
                    &mut extents,
                    piece_start + (rs - first) * BLOCK_BYTES,
                    (re - rs) * BLOCK_BYTES,
                    ExtentKind::Data,
                );
                pos = re;
            }
            if pos < first + count {
                push_extent(
                    &mut extents,
                    piece_start + (pos - first) * BLOCK_BYTES,
                    (first + count - pos) * BLOCK_BYTES,
                    ExtentKind::Hole,
                );
            }
        }
        // Clipped to the bytes asked for.
        let stop = offset + len;
        Ok(extents
            .into_iter()
            .filter_map(|e| {
                let (s, t) = (e.offset.max(offset), (e.offset + e.len).min(stop));
                (s < t).then_some(Extent {
                    offset: s,
                    len: t - s,
                    kind: e.kind,
                })
            })
            .collect())
    }

    fn space(&self) -> SpaceUsage {
        SpaceUsage::default()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
