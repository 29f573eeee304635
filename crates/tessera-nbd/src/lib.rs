//! Tessera's NBD server: the fixed-newstyle Network Block Device protocol
//! over the [`BlockDevice`](tessera_blockdev::BlockDevice) trait.
//!
//! Owns: the wire format ([`proto`]), option haggling ([`negotiate`]), request
//! checks and error mapping ([`request`]), the export catalog ([`catalog`])
//! and the tokio server ([`server`]).
//! Must not touch: volumes, components, the store or the directory. The
//! server sees only `BlockDevice`s handed out by an [`ExportCatalog`], so the
//! same code serves an in-memory device in tests and a mirrored volume on a
//! host.
//! Invariants:
//! - the protocol modules are pure (no tokio, no clock) and are what the fuzz
//!   targets and property tests run;
//! - malformed input from a client ends in an error reply or a closed
//!   connection, never a panic, and every read from a client is bounded;
//! - MULTI_CONN is advertised because `BlockDevice::flush` is device-wide: a
//!   flush on one connection covers writes acknowledged on every other.

pub mod catalog;
pub mod fuzzing;
mod link;
pub mod negotiate;
pub mod payload;
pub mod proto;
pub mod request;
pub mod server;

pub use catalog::{ExportCatalog, NbdClient, StaticCatalog};
pub use negotiate::TlsOffer;
pub use server::{serve, serve_connection, NbdError, NbdTls, MAX_IN_FLIGHT};
