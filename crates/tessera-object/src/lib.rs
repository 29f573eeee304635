//! The object layer: what a volume's owner does with its layout.
//!
//! Owns: [`Coordinator`] (mirrored writes, verified reads with repair,
//! degraded I/O with dirty-region tracking, delta resync, component
//! replacement, epoch fencing, copies that share stored blocks),
//! [`DirtyRegions`] and [`RangeLock`], and the host read cache
//! ([`ReadCache`]) and I/O scheduler ([`IoScheduler`]) every coordinator
//! of a host shares.
//! Must not touch: the store, the transport, the directory. Components are
//! reached through [`ComponentIo`], layout changes are recorded through
//! [`LayoutRecorder`]; the node implements both.
//! A [`Coordinator`] is a `BlockDevice`, which is all a frontend sees.

mod component_io;
mod coordinator;
mod dirty;
pub mod io_scheduler;
mod io_stats;
mod range_lock;
mod read_cache;

pub use component_io::{
    BlockClone, ComponentError, ComponentIo, ComponentStatus, IoClass, LayoutRecorder,
    SnapshotCopyChange, SnapshotCopyEdit, TakenSnapshot, CLONE_BLOCKS_MAX,
};
pub use coordinator::{
    snapshot_layout, CarriedSnapshots, Coordinator, CopyReport, HostShared, NewCopyPlace,
    ObjectCounters, ResyncError, ResyncProgress, ResyncReport, SnapshotChainLink, SnapshotsHeld,
    RESYNC_STEP_BLOCKS, SHARE_STEP_BYTES,
};
pub use dirty::{DirtyRegions, DIRTY_RANGES_MAX};
pub use io_scheduler::{IoClient, IoPermit, IoScheduler};
pub use io_stats::{IoKind, IoKindSnapshot, VolumeIoSnapshot, VolumeIoStats, LATENCY_BOUNDS_US};
pub use range_lock::{RangeGuard, RangeLock};
pub use read_cache::{
    ChangeGuard, OwnershipCheck, ReadCache, ReadCacheStats, ReadTicket, VolumeCache,
    READ_CACHE_ENTRY_COST_BYTES, READ_CACHE_ENTRY_OVERHEAD_BYTES,
};
