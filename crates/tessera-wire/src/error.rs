//! Decoding and encoding errors.
//!
//! Owns: [`WireError`], what went wrong with bytes from a peer. Every variant
//! says which field or frame was bad so that a log line is enough to find the
//! sender's bug; the transport closes the connection on any of them.

use tessera_types::NameError;

use crate::VersionRange;

/// Bytes that are not a valid frame or message, or a message too large to send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The frame does not start with [`crate::MAGIC`]: the peer is not a
    /// Tessera host or the stream lost its framing.
    #[error("frame starts with {found:02x?}, not the Tessera magic: not a Tessera peer or the stream lost its framing")]
    BadMagic {
        /// The first four bytes received.
        found: [u8; 4],
    },
    /// The header announces more bytes than any frame may hold.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge {
        /// Announced or attempted frame length.
        len: u64,
        /// [`crate::MAX_FRAME_BYTES`].
        max: usize,
    },
    /// Header and payload do not match their CRC32C: corrupted in flight.
    #[error("frame for request {request_id} fails its CRC32C (carried {carried:08x}, computed {computed:08x})")]
    BadChecksum {
        /// Request id from the (possibly corrupt) header.
        request_id: u64,
        /// CRC in the header.
        carried: u32,
        /// CRC of the bytes received.
        computed: u32,
    },
    /// Reserved header bytes are not zero.
    #[error("frame for request {request_id} has non-zero reserved header bytes")]
    ReservedBits {
        /// Request id from the header.
        request_id: u64,
    },
    /// A message kind this version does not define.
    #[error("unknown message kind {kind:#06x}")]
    UnknownKind {
        /// The kind number.
        kind: u16,
    },
    /// A queue class this version does not define.
    #[error("unknown queue class {class}")]
    UnknownQueueClass {
        /// The class number.
        class: u8,
    },
    /// A frame or handshake in a version this build does not speak.
    #[error("wire version {version} is not spoken by this build (it speaks {supported})")]
    UnsupportedVersion {
        /// The version received.
        version: u16,
        /// What this build speaks.
        supported: VersionRange,
    },
    /// A message of a kind the connection's wire version does not carry:
    /// the peer runs an older release. Refused before anything is sent.
    #[error("{kind} needs wire v{since} or newer, but this connection speaks wire v{version}: the peer runs an older release")]
    KindNotInVersion {
        /// The message kind.
        kind: &'static str,
        /// The connection's version.
        version: u16,
        /// The first version that carries the kind.
        since: u16,
    },
    /// The two hosts speak no common version.
    #[error("no common wire version: this host speaks {ours}, the peer speaks {theirs}; upgrade the older host")]
    NoCommonVersion {
        /// This host's versions.
        ours: VersionRange,
        /// The peer's versions.
        theirs: VersionRange,
    },
    /// The payload ends before a field.
    #[error("{kind} message truncated: field {field} needs {need} bytes, {have} left")]
    Truncated {
        /// Message kind being decoded.
        kind: &'static str,
        /// The field that did not fit.
        field: &'static str,
        /// Bytes the field needs.
        need: u64,
        /// Bytes left in the payload.
        have: usize,
    },
    /// The payload has bytes after the last field.
    #[error("{kind} message has {extra} bytes after its last field")]
    TrailingBytes {
        /// Message kind being decoded.
        kind: &'static str,
        /// Unread bytes.
        extra: usize,
    },
    /// A name field is not a valid host or volume name.
    #[error("{kind} message field {field}: {source}")]
    BadName {
        /// Message kind being decoded.
        kind: &'static str,
        /// The field.
        field: &'static str,
        /// Why the name was refused.
        source: NameError,
    },
    /// A text field is not UTF-8.
    #[error("{kind} message field {field} is not UTF-8")]
    BadText {
        /// Message kind being decoded.
        kind: &'static str,
        /// The field.
        field: &'static str,
    },
    /// An enumerated field holds a value this version does not define.
    #[error("{kind} message field {field} has unknown value {value}")]
    BadTag {
        /// Message kind being decoded.
        kind: &'static str,
        /// The field.
        field: &'static str,
        /// The value received.
        value: u64,
    },
    /// A field is longer than its limit (a text longer than
    /// [`crate::ERROR_MESSAGE_BYTES_MAX`], for example).
    #[error("{kind} message field {field} is {len} bytes, limit {max}")]
    FieldTooLong {
        /// Message kind being encoded or decoded.
        kind: &'static str,
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
}
