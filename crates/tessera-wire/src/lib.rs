//! Tessera's host-to-host wire: the messages hosts exchange, how they are
//! framed, and which wire version both ends speak.
//!
//! Owns: the [`Request`] and [`Response`] messages (component operations the
//! replica service serves, volume operations a non-owner frontend forwards to
//! the owner, the handshake and liveness probes), the frame that carries them
//! ([`encode_frame`], [`decode_frame`]) and the version negotiation
//! ([`VersionRange::negotiate`]).
//!
//! Must not touch: sockets, timers, runtimes. This crate is pure so that the
//! transport, the simulator and fuzzers share one codec.
//!
//! Invariants:
//! - Every frame is a fixed [`HEADER_BYTES`]-byte header (magic, wire version,
//!   message kind, request id, queue class, payload length, CRC32C of header
//!   and payload) followed by the payload; all integers are little endian.
//! - Decoding never panics and never allocates more than the input holds:
//!   every length is checked against [`MAX_FRAME_BYTES`] and against the bytes
//!   actually present, and bad input comes back as a [`WireError`].
//! - Data buffers travel as [`bytes::Bytes`]: decoding slices them out of the
//!   received frame, encoding hands large ones to the socket as separate
//!   chunks, so a 1 MiB write is not copied by the codec.
//! - The header layout and the handshake messages (`Hello`, `HelloOk`,
//!   `Error`) are the same in every wire version, so two hosts of different
//!   releases can always tell each other which versions they speak.
//! - Every other kind belongs to the version that introduced it
//!   ([`MessageKind::since`]) and is neither encoded nor decoded on a
//!   connection that negotiated an older one: a newer host never sends an
//!   older peer what it cannot read.

mod codec;
mod error;
mod frame;
mod message;
mod version;

pub use error::WireError;
pub use frame::{
    decode_frame, encode_frame, frame_bytes_needed, EncodedFrame, Frame, FrameHeader, HEADER_BYTES,
    MAGIC, MAX_DATA_BYTES, MAX_FRAME_BYTES, MAX_PAYLOAD_BYTES,
};
pub use message::{
    ComponentRef, Extent, ExtentKind, Message, MessageKind, QueueClass, Request, Response,
    WireErrorKind, ERROR_MESSAGE_BYTES_MAX,
};
pub use version::{VersionRange, WireVersion};
