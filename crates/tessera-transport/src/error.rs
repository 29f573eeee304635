//! Transport errors.
//!
//! Owns: [`TransportError`], why a call got no answer. Every variant names
//! the peer host and its address. An answer that reports a failure (a stale
//! epoch, a checksum error) is not a transport error: it arrives as
//! `Response::Error` and the caller decides.

use std::net::SocketAddr;
use std::time::Duration;

use tessera_types::HostId;
use tessera_wire::{VersionRange, WireError};

/// A call that got no answer, or a transport that could not start.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The listening socket could not be opened.
    #[error("host {host} cannot listen on {addr}: {source}")]
    Bind {
        /// This host.
        host: HostId,
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The TCP connection could not be made.
    #[error("cannot connect to host {peer} at {addr}: {source}")]
    Connect {
        /// The peer.
        peer: HostId,
        /// Its address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// No answer within the call timeout (the peer is slow, dead, or
    /// partitioned away).
    #[error("call to host {peer} at {addr} got no answer within {after:?}")]
    Timeout {
        /// The peer.
        peer: HostId,
        /// Its address.
        addr: SocketAddr,
        /// The timeout that expired.
        after: Duration,
    },
    /// A fault hook partitions this host from the peer and the transport is
    /// set to fail such calls at once.
    #[error("host {peer} at {addr} is partitioned from this host (fault hook)")]
    Partitioned {
        /// The peer.
        peer: HostId,
        /// Its address.
        addr: SocketAddr,
    },
    /// A "fail next N calls" fault hook failed this call.
    #[error("call to host {peer} at {addr} failed by a fault hook")]
    Injected {
        /// The peer.
        peer: HostId,
        /// Its address.
        addr: SocketAddr,
    },
    /// The connection broke while the call was in flight; the request may or
    /// may not have been executed.
    #[error("connection to host {peer} at {addr} lost: {reason}")]
    ConnectionLost {
        /// The peer.
        peer: HostId,
        /// Its address.
        addr: SocketAddr,
        /// What broke it.
        reason: String,
    },
    /// The two hosts speak no common wire version.
    #[error("host {peer} at {addr} speaks wire versions {theirs}, this host {ours}: upgrade the older host")]
    VersionMismatch {
        /// The peer.
        peer: HostId,
        /// Its address.
        addr: SocketAddr,
        /// What this host offered.
        ours: VersionRange,
        /// What the peer speaks.
        theirs: VersionRange,
    },
    /// The peer answered the handshake with something else than expected.
    #[error("handshake with host {peer} at {addr} failed: {reason}")]
    Handshake {
        /// The peer.
        peer: HostId,
        /// Its address.
        addr: SocketAddr,
        /// What was wrong.
        reason: String,
    },
    /// The address belongs to another host than the one called (stale
    /// address in the directory, or a reused port).
    #[error("{addr} answered as host {actual}, not as host {peer}")]
    WrongHost {
        /// The host that was called.
        peer: HostId,
        /// The address called.
        addr: SocketAddr,
        /// The host that answered.
        actual: HostId,
    },
    /// The request cannot be encoded (too large for one frame).
    #[error("request to host {peer} at {addr} cannot be sent: {source}")]
    Encode {
        /// The peer.
        peer: HostId,
        /// Its address.
        addr: SocketAddr,
        /// Why (boxed: it is rare and large).
        source: Box<WireError>,
    },
    /// [`crate::Transport::serve`] was called a second time.
    #[error("transport of host {host} already serves a handler")]
    AlreadyServing {
        /// This host.
        host: HostId,
    },
    /// This host's transport has been shut down.
    #[error("transport of host {host} is shut down")]
    Shutdown {
        /// This host.
        host: HostId,
    },
}

impl TransportError {
    /// The peer the failed call was for, if the error concerns a call.
    pub fn peer(&self) -> Option<&HostId> {
        match self {
            TransportError::Bind { .. }
            | TransportError::AlreadyServing { .. }
            | TransportError::Shutdown { .. } => None,
            TransportError::Connect { peer, .. }
            | TransportError::Timeout { peer, .. }
            | TransportError::Partitioned { peer, .. }
            | TransportError::Injected { peer, .. }
            | TransportError::ConnectionLost { peer, .. }
            | TransportError::VersionMismatch { peer, .. }
            | TransportError::Handshake { peer, .. }
            | TransportError::WrongHost { peer, .. }
            | TransportError::Encode { peer, .. } => Some(peer),
        }
    }

    /// Whether the request may have been executed by the peer although no
    /// answer came back (so a retry must be idempotent).
    pub fn may_have_executed(&self) -> bool {
        matches!(
            self,
            TransportError::Timeout { .. } | TransportError::ConnectionLost { .. }
        )
    }
}
