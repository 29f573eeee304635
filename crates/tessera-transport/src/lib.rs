//! Tessera's host-to-host RPC over TCP (vSAN's RDT).
//!
//! Owns: one [`Transport`] per host. It listens on a TCP address and serves
//! the requests peers send through a [`RequestHandler`]; it calls peers with
//! [`Transport::call`], keeping one connection per peer and [`QueueClass`]
//! so that bulk resync traffic never queues in front of guest I/O; and it
//! carries the [`FaultHooks`] that tests use to delay, drop and partition
//! traffic between named hosts.
//!
//! Must not touch: what requests mean (the replica service and the object
//! coordinator own that), placement, the directory. Frames and messages come
//! from `tessera-wire`.
//!
//! Invariants:
//! - Every connection starts with a `Hello` that negotiates the wire version;
//!   a peer with no common version is refused with both ranges in the error.
//!   A request of a kind newer than the negotiated version (`CloneBlocks` to
//!   a wire v1 peer) fails with [`TransportError::Encode`] before anything
//!   is sent, and the connection carries on: callers fall back to what the
//!   older peer speaks.
//! - Many requests are in flight per connection (at most
//!   [`MAX_IN_FLIGHT_PER_CONNECTION`]), matched to responses by request id;
//!   a server handles the requests of one connection concurrently, so a slow
//!   operation does not hold back the others.
//! - Every call ends within its timeout, with a response or a
//!   [`TransportError`] naming the peer and its address.
//! - A malformed frame closes its connection; it never panics the host.
//! - The data path avoids handing a request from task to task: the caller
//!   writes its own frame with one vectored write (the calls one task starts
//!   in one plugged poll share one, written when that poll ends), and data
//!   buffers travel as shared `Bytes` from the socket buffer to the handler.

mod client;
mod error;
mod faults;
mod io;
mod server;
mod stats;
mod transport;

use std::time::Duration;

use async_trait::async_trait;
use tessera_types::HostId;

pub use error::TransportError;
pub use faults::{FaultHooks, FrameFate, LinkFaults};
pub use stats::{PeerStats, TransportStats};
pub use tessera_wire::{QueueClass, Request, Response, VersionRange, WireErrorKind};
pub use transport::Transport;

/// Requests one connection may have outstanding: callers beyond it wait for
/// a slot, and a server stops reading the connection until one frees up, so
/// a flood from one peer cannot take unbounded memory.
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 256;

/// Attempts per call to get a working connection: a cached connection found
/// closed before anything was sent on it is replaced once.
pub const CONNECT_ATTEMPTS_PER_CALL: usize = 2;

/// Serves the requests peers send to this host.
#[async_trait]
pub trait RequestHandler: Send + Sync + 'static {
    /// Handles one request from host `from`, sent in queue `class`, and
    /// returns its answer. Failures are answers too (`Response::Error`).
    /// Called concurrently.
    async fn handle(&self, from: HostId, class: QueueClass, request: Request) -> Response;
}

/// What a partitioned call does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PartitionBehaviour {
    /// Frames are silently lost and the caller's timeout fires, as in a real
    /// partition.
    #[default]
    Drop,
    /// The caller gets [`TransportError::Partitioned`] at once (quicker
    /// tests of what happens after a partition).
    FailFast,
}

/// Settings of a transport.
#[derive(Clone, Debug)]
pub struct TransportConfig {
    /// How long a call may take, connecting included, before it fails with
    /// [`TransportError::Timeout`].
    pub call_timeout: Duration,
    /// How long a TCP connect and the handshake may take (within the call
    /// timeout); a server waits twice this for a new connection's `Hello`.
    pub connect_timeout: Duration,
    /// What a partitioned call does.
    pub partition_behaviour: PartitionBehaviour,
    /// Wire versions this host offers and accepts. Defaults to every version
    /// this build speaks; tests narrow it to check refusals.
    pub versions: VersionRange,
    /// TLS between hosts (none: plain TCP).
    pub tls: Option<TransportTls>,
}

/// TLS between hosts: each host proves a certificate of the cluster CA, on
/// both ends of every connection, and accepts only peers that prove one.
#[derive(Clone)]
pub struct TransportTls {
    /// What a host proves when a peer connects to it, asking the peer for a
    /// certificate of the cluster CA (required).
    pub server: std::sync::Arc<rustls::ServerConfig>,
    /// What a host proves when it connects, and the CA it trusts.
    pub client: std::sync::Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for TransportTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportTls").finish_non_exhaustive()
    }
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            // Below the 5-7 s within which a mirrored write must give up on an
            // absent replica and carry on degraded.
            call_timeout: Duration::from_secs(4),
            connect_timeout: Duration::from_secs(2),
            partition_behaviour: PartitionBehaviour::Drop,
            versions: VersionRange::SUPPORTED,
            tls: None,
        }
    }
}
