//! The store's errors: each names the component and LBA (or device) a user
//! needs to act on it, so the coordinator can repair from another copy.

use tessera_env::DiskError;
use tessera_types::{ComponentId, Epoch, Lba};

/// Why a store operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The component is not on this disk group.
    #[error("component {component} does not exist on this disk group")]
    NoSuchComponent {
        /// The component.
        component: ComponentId,
    },
    /// Created again with a different size.
    #[error("component {component} already exists with {size_bytes} bytes")]
    ComponentExists {
        /// The component.
        component: ComponentId,
        /// Its current size.
        size_bytes: u64,
    },
    /// The range runs past the component's end.
    #[error(
        "component {component}: {blocks} blocks from {lba} run past its end ({size_bytes} bytes)"
    )]
    OutOfRange {
        /// The component.
        component: ComponentId,
        /// First LBA asked for.
        lba: Lba,
        /// Blocks asked for.
        blocks: u64,
        /// Component size.
        size_bytes: u64,
    },
    /// Data is not whole 4 KiB blocks, or a size is not a multiple of 4 KiB.
    #[error("component {component} at {lba}: {problem}")]
    Misaligned {
        /// The component.
        component: ComponentId,
        /// The LBA.
        lba: Lba,
        /// What is wrong.
        problem: String,
    },
    /// Nothing is stored at the block (never written, or unmapped).
    #[error("component {component} at {lba}: no data stored there")]
    NotStored {
        /// The component.
        component: ComponentId,
        /// The LBA.
        lba: Lba,
    },
    /// A write or fence from an owner older than the one installed.
    #[error("component {component}: {epoch} is older than the highest persisted ({highest})")]
    StaleEpoch {
        /// The component.
        component: ComponentId,
        /// The refused epoch.
        epoch: Epoch,
        /// The highest epoch persisted.
        highest: Epoch,
    },
    /// A snapshot is a point in time: nothing changes it.
    #[error("component {component} is a snapshot: it cannot be written, unmapped or resized")]
    ReadOnly {
        /// The snapshot.
        component: ComponentId,
    },
    /// The disk group has no space for the blocks this write would allocate.
    #[error("component {component} at {lba}: no space left in the disk group")]
    NoSpace {
        /// The component.
        component: ComponentId,
        /// First LBA that needed a new block.
        lba: Lba,
    },
    /// A reservation larger than the free space.
    #[error("component {component}: cannot reserve {requested} bytes, {free} bytes free")]
    NoSpaceForReservation {
        /// The component.
        component: ComponentId,
        /// Bytes asked for.
        requested: u64,
        /// Bytes free.
        free: u64,
    },
    /// Stored data failed its CRC32C: the block must be repaired from another
    /// copy. No data is returned.
    #[error("component {component} at {lba}: checksum mismatch")]
    Checksum {
        /// The component.
        component: ComponentId,
        /// The bad block.
        lba: Lba,
    },
    /// The component lives on a failed capacity device or its index is
    /// damaged.
    #[error("component {component} has failed: {reason}")]
    ComponentFailed {
        /// The component.
        component: ComponentId,
        /// Why.
        reason: String,
    },
    /// The whole disk group has failed (cache device error, metadata damage).
    #[error("disk group has failed: {reason}")]
    DiskGroupFailed {
        /// Why.
        reason: String,
    },
    /// A device could not be used (opening, formatting, recovering).
    #[error("device error: {0}")]
    Device(#[from] DiskError),
    /// The devices do not hold a disk group this build can open.
    #[error("{device}: {problem}")]
    BadDevice {
        /// The device.
        device: String,
        /// What is wrong.
        problem: String,
    },
    /// A device is held open by another opener: a running host serving the
    /// disk group (in this process or another) or a `tessera store check`
    /// reading it. A disk group's devices are locked while it is open and
    /// unlocked when it is dropped.
    #[error(
        "{device} is in use by a running host (a disk group's devices are locked while it is \
         open): stop that host first"
    )]
    DeviceInUse {
        /// The device (its path).
        device: String,
    },
    /// The configuration cannot work.
    #[error("bad disk group configuration: {0}")]
    Config(String),
    /// An encrypted disk group's keys cannot be used: the key encryption key
    /// that sealed its data key is not held, a key file is unreadable, or a
    /// sealed key fails its check.
    #[error("encryption at rest: {0}")]
    Encryption(String),
    /// A deep rekey was asked for while one is under way.
    #[error("a deep rekey of this disk group is already under way")]
    RekeyUnderWay,
}
