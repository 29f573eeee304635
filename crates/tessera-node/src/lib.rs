//! A Tessera host as a library.
//!
//! Owns: the wiring of one host (its disk groups behind the replica service,
//! the transport, its directory session, the coordinators of the volumes it
//! owns, its NBD exports) and the cluster-wide control plane
//! ([`control::ClusterControl`], served over HTTP by [`api`]).
//! Must not touch: on-disk formats, wire encodings, protocol details; it
//! composes the crates below it and adds only policy: when to take
//! ownership, when to resync, when to rebuild.

pub mod api;
pub mod control;
