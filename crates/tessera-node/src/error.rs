//! Errors of a host's life: starting, serving, stopping.
//!
//! Owns: [`NodeError`], which names the host and the part that failed so
//! that a user reading `tessera up`'s output knows what to fix.

use tessera_types::HostId;

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
