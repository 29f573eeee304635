//! Errors of a host's life: starting, serving, stopping.
//!
//! Owns: [`NodeError`], which names the host and the part that failed so
//! that a user reading `tessera up`'s output knows what to fix.

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
