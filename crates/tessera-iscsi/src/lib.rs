//! Tessera's iSCSI target: RFC 7143 sessions carrying the SCSI block
//! commands (SBC-4, SPC-5) and the array offloads hypervisors use (COMPARE
//! AND WRITE, EXTENDED COPY, WRITE SAME, UNMAP, thin-provisioning sense),
//! over the [`BlockDevice`](tessera_blockdev::BlockDevice) trait.
//!
//! Owns: the SCSI command set and its sense data ([`scsi`]), and the iSCSI
//! transport that carries it: PDUs ([`pdu`]), text keys and their
//! negotiation ([`text`]), CHAP ([`chap`]), the login phase ([`login`]), the
//! full-feature phase ([`session`]), the target catalog ([`catalog`]), the
//! tokio server ([`server`]) and the fuzz entry points ([`fuzzing`]).
//! Must not touch: volumes, components, the store or the directory. A logical
//! unit sees only a `BlockDevice` and a [`scsi::UnitEnvironment`] the host
//! gives it, so the same target serves an in-memory device in tests and a
//! mirrored volume on every host.
//! Invariants:
//! - parsing (PDUs, text keys, CDBs, parameter lists) is pure and is what the
//!   fuzz targets run; malformed input ends in a reject, a CHECK CONDITION or
//!   a closed connection, never a panic, and every read from a client is
//!   bounded;
//! - the iSCSI layer never interprets a CDB and the SCSI layer never sees a
//!   PDU: they meet at [`scsi::Command`] and [`scsi::Response`].

pub mod catalog;
pub mod chap;
pub mod fuzzing;
pub mod login;
pub mod pdu;
pub mod scsi;
pub mod server;
pub mod session;
pub mod text;

pub use catalog::{
    parse_target_name, target_name_for_snapshot, target_name_for_volume, ChapCredentials,
    ChapSecret, Initiators, NamedTarget, StaticCatalog, TargetCatalog, TargetEntry, TargetPortal,
};
pub use server::{serve, serve_connection, serve_with, IscsiError, Sessions};
