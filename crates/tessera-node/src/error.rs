//! Errors of a host's life: starting, serving, stopping.
//!
//! Owns: [`NodeError`], which names the host and the part that failed so
//! that a user reading `tessera up`'s output knows what to fix; the
//! refusals of fault injection ([`FaultError`]); and why a full clone's
//! fill stopped ([`FillError`]), naming the volume and its snapshot.

use tessera_types::{DiskGroupId, HostId, VolumeId};

/// Why a host (or `tessera up`) could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The configuration is unusable.
    #[error("bad configuration: {0}")]
    Config(String),
    /// A disk group could not be opened or created.
    #[error("host {host}: disk group {disk_group}: {source}")]
    Store {
        /// The host.
        host: HostId,
        /// The disk group.
        disk_group: String,
        /// What the store said.
        source: tessera_store::StoreError,
    },
    /// The directory refused or could not be reached.
    #[error("host {host}: directory: {source}")]
    Directory {
        /// The host.
        host: HostId,
        /// What the directory said.
        source: tessera_directory::DirectoryError,
    },
    /// A listener could not be bound or a server failed.
    #[error("host {host}: {what}: {detail}")]
    Serve {
        /// The host.
        host: HostId,
        /// Which service.
        what: &'static str,
        /// What failed.
        detail: String,
    },
}

/// Why a host could not rekey its disk groups.
#[derive(Debug, thiserror::Error)]
pub enum RekeyError {
    /// The host's configuration names no key encryption key.
    #[error(
        "host {host} has no key encryption key ([encryption] kek_file); its disk groups are not encrypted"
    )]
    NoKeys {
        /// The host.
        host: HostId,
    },
    /// A key file could not be read.
    #[error("host {host}: {problem}")]
    KeyFiles {
        /// The host.
        host: HostId,
        /// What is wrong with the file.
        problem: String,
    },
    /// The disk group asked for is not on the host.
    #[error("host {host} has no disk group {disk_group}")]
    NoDiskGroup {
        /// The host.
        host: HostId,
        /// The disk group asked for.
        disk_group: DiskGroupId,
    },
    /// None of the disk groups asked for is encrypted.
    #[error(
        "host {host}: no encrypted disk group to rekey (disk groups formatted before encryption was configured stay plaintext)"
    )]
    NothingEncrypted {
        /// The host.
        host: HostId,
    },
    /// The store refused or failed.
    #[error("host {host} disk group {disk_group}: {source}")]
    Store {
        /// The host.
        host: HostId,
        /// The disk group.
        disk_group: DiskGroupId,
        /// Why.
        source: tessera_store::StoreError,
    },
}

/// Why a fault could not be injected into a host.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// The host's configuration does not accept fault injection.
    #[error(
        "host {host} does not accept fault injection (fault_injection is off in its configuration)"
    )]
    NotAccepted {
        /// The host.
        host: HostId,
    },
    /// No such device.
    #[error("host {host} has no device {device} in disk group {disk_group} (0 is the cache device, 1 and up the capacity devices)")]
    NoSuchDevice {
        /// The host.
        host: HostId,
        /// The disk group named.
        disk_group: DiskGroupId,
        /// The device index named.
        device: usize,
    },
    /// The host holds no data copy of the volume named.
    #[error("host {host} holds no data copy of volume {volume}")]
    NoCopy {
        /// The host.
        host: HostId,
        /// The volume named.
        volume: VolumeId,
    },
    /// The peer named is not a host of the cluster, or is the host itself.
    #[error("host {host}: {peer} is not another host of the cluster")]
    NoSuchPeer {
        /// The host.
        host: HostId,
        /// The peer named.
        peer: String,
    },
    /// The store refused the fault (e.g. nothing stored at the block).
    #[error("host {host}: {reason}")]
    Store {
        /// The host.
        host: HostId,
        /// What the store said.
        reason: String,
    },
}

/// Why the fill of a full clone stopped (see `host/fill.rs`). Each names
/// the volume being filled and the snapshot it copies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FillError {
    /// The fill is no longer this host's to run: another host owns the
    /// volume now, or the volume was deleted or its fill ended.
    #[error("volume {volume}: the fill from {from} is no longer run here: {reason}")]
    NotHere {
        /// The volume being filled.
        volume: VolumeId,
        /// The snapshot copied, as `VOLUME@SNAPSHOT`.
        from: String,
        /// What changed.
        reason: String,
    },
    /// The snapshot the volume is filled from is not in this host's view
    /// (deleted, or taken again under its name).
    #[error("volume {volume}: snapshot {from} it is filled from is gone")]
    SnapshotGone {
        /// The volume being filled.
        volume: VolumeId,
        /// The snapshot copied, as `VOLUME@SNAPSHOT`.
        from: String,
    },
    /// The snapshot could not be read.
    #[error("volume {volume}: reading snapshot {from} at byte {offset}: {reason}")]
    Read {
        /// The volume being filled.
        volume: VolumeId,
        /// The snapshot copied, as `VOLUME@SNAPSHOT`.
        from: String,
        /// Where.
        offset: u64,
        /// What failed.
        reason: String,
    },
    /// The volume refused a write of the fill.
    #[error("volume {volume}: writing the copy of {from} at byte {offset}: {reason}")]
    Write {
        /// The volume being filled.
        volume: VolumeId,
        /// The snapshot copied, as `VOLUME@SNAPSHOT`.
        from: String,
        /// Where.
        offset: u64,
        /// What failed.
        reason: String,
    },
    /// The fill's position could not be recorded in the directory.
    #[error("volume {volume}: recording the position of the fill from {from}: {reason}")]
    Record {
        /// The volume being filled.
        volume: VolumeId,
        /// The snapshot copied, as `VOLUME@SNAPSHOT`.
        from: String,
        /// What failed.
        reason: String,
    },
}
