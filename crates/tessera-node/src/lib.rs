//! A Tessera host as a library.
//!
//! Owns: the wiring of one host (its disk groups behind the replica service,
//! the transport, its directory session, the coordinators of the volumes it
//! owns, its NBD exports: [`host`], its iSCSI targets: [`iscsi`]), the cluster-wide control plane
//! ([`control::ClusterControl`], implemented in [`control_plane`] and served
//! over HTTP by [`api`]) and `tessera up` ([`up`]).
//! Must not touch: on-disk formats, wire encodings, protocol details; it
//! composes the crates below it and adds only policy: when to take
//! ownership, when to resync, when to rebuild.

pub mod activity_history;
pub mod api;
pub mod api_access;
pub mod api_tls;
pub mod attachments;
pub mod components;
pub mod config;
pub mod control;
pub mod control_plane;
pub mod dashboard;
pub mod error;
pub mod events;
pub mod health;
pub mod host;
pub mod iscsi;
pub mod metrics;
pub mod openapi;
pub mod peers;
pub mod resync_board;
pub mod routing;
pub mod snapshot_export;
pub mod up;
pub mod volume_access;

pub use error::NodeError;
