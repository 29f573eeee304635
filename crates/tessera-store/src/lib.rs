//! The component store: Tessera's local engine for one disk group (one cache
//! device and 1..7 capacity devices), in the role of vSAN's LSOM.
//!
//! Owns: every byte a host keeps for the components placed on a disk group:
//! the write log on the cache device (group commit), the capacity tier
//! (thin, 4 KiB allocation, space reservation), the per-component index with
//! a CRC32C per block, the read cache of capacity blocks, checkpoints, crash
//! recovery, scrubbing and offline checks. Must not touch: the network, the
//! directory, placement decisions; the replica service above calls the
//! async API of [`DiskGroup`].
//!
//! The three promises the coordinator relies on:
//! - an acknowledged write (`write`, `unmap`, `write_zeroes`, `fence`, and
//!   component create/resize/delete) survives a crash of the process or of
//!   the machine: it is acknowledged only after the `fdatasync` of the log
//!   record that holds it;
//! - a read never returns data that fails its CRC32C: it returns
//!   [`StoreError::Checksum`] with the component and LBA instead;
//! - space is accounted exactly: a write that needs a new block when the disk
//!   group has none fails with [`StoreError::NoSpace`] and changes nothing;
//!   unmapped and zeroed blocks give their space back at once.
//!
//! Blocks can be shared by reference between LBAs and components of one disk
//! group ([`DiskGroup::clone_blocks`], the copy EXTENDED COPY asks for): a
//! shared block is freed when its last reference goes, and overwriting one
//! LBA never changes another that shares its old block.
//!
//! Reads go through a content-based read cache of verified capacity blocks
//! keyed by where they are stored, not by who asked (`content`): a block
//! shared by several LBAs or components is read from its device once and
//! then served from memory to all of them, even when they read it at the
//! same moment. Its entries follow the
//! free-space map, so a read from it returns what the index says or nothing
//! ([`DiskGroupConfig::content_cache_bytes`], [`DiskGroup::content_cache_stats`]).
//!
//! The on-disk format and the recovery procedure are described in
//! `docs/STORE.md`; the byte layouts are in `tessera-format`.

mod alloc;
mod at_rest;
mod check;
mod content;
mod device_threads;
mod engine;
mod error;
mod group;
mod index;
mod page_probe;
mod read_around;
mod recovery;
mod scrub;
mod shared_sync;
mod shares;
mod snapshot;
mod state;

pub use at_rest::{
    AtRestKeys, EncryptionStatus, KekId, KeyEncryptionKey, RekeyProgress, KEK_BYTES,
    REKEY_BYTES_PER_SECOND_DEFAULT, REKEY_PIECE_BLOCKS,
};
pub use check::{check_devices, check_encrypted_devices, CheckProblem, CheckReport};
pub use content::ContentCacheStats;
pub use error::StoreError;
pub use group::{
    ComponentSpace, ComponentSummary, DeviceSpec, DirectIo, DiskGroup, DiskGroupConfig,
    DiskGroupHealth, DiskGroupSpace, GroupDevices, LogStats,
};
pub use index::{IndexCacheStats, INDEX_PAGE_SPAN_BYTES, INDEX_PREFETCH_PAGES_DEFAULT};
pub use recovery::COMPONENTS_MAX;
pub use scrub::{BadBlock, ScrubCursor, ScrubProgress, ScrubReport};
pub use snapshot::HeldSpace;

/// Most blocks [`DiskGroup::clone_blocks`] shares in one call: bounds the log
/// entries (56 bytes each) one request holds.
pub const CLONE_BLOCKS_MAX: u64 = 4096;

/// Default budget of a disk group's content-based read cache, in bytes
/// ([`DiskGroupConfig::content_cache_bytes`]): 64 MiB, about 15,000 blocks.
pub const CONTENT_CACHE_BYTES_DEFAULT: u64 = 64 << 20;

/// Writes of at least this many bytes bypass the write log (placed
/// writes): their blocks go straight to newly allocated capacity blocks and
/// are synced there, and only a record naming where they lie goes through
/// the log, as ZFS does with indirect writes. Sequential data then reaches
/// each device once instead of twice (log, then destage) and never waits in
/// memory for the destager. Smaller writes gain more from group commit.
pub const PLACED_WRITE_BYTES_MIN: u64 = 64 << 10;

/// Largest write accepted in one call, in bytes: bounds the log space and
/// memory one request holds (the replica service splits larger ones).
pub const WRITE_BYTES_MAX: u64 = 4 << 20;
