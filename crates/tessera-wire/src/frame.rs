//! Frames: the unit a connection carries.
//!
//! Owns: the fixed header and its checks. Layout, little endian:
//!
//! | bytes  | field                                          |
//! |--------|------------------------------------------------|
//! | 0..4   | magic `TSWR`                                   |
//! | 4..6   | wire version                                   |
//! | 6..8   | message kind ([`MessageKind`])                 |
//! | 8..16  | request id (a response repeats its request's)  |
//! | 16     | queue class ([`QueueClass`])                   |
//! | 17..20 | reserved, zero                                 |
//! | 20..24 | payload length                                 |
//! | 24..28 | CRC32C of bytes 0..24 followed by the payload  |
//!
//! Invariant: [`decode_frame`] consumes bytes only once a whole frame has
//! arrived, checks magic, length bound and CRC before decoding the payload,
//! and never panics on any input.

use bytes::{Buf, Bytes, BytesMut};
use tessera_types::checksum::{crc32c, crc32c_append};

use crate::codec::{check_kind_in_version, decode_payload, encode_payload, PayloadWriter};
use crate::message::{Message, MessageKind, QueueClass};
use crate::{WireError, WireVersion};

/// First four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"TSWR";

/// Bytes in a frame header.
pub const HEADER_BYTES: usize = 28;

/// Largest data buffer one message should carry: callers split larger I/O
/// (a forwarded 32 MiB NBD read becomes four requests). 8 MiB covers the
/// largest stripe unit a coordinator writes in one request.
pub const MAX_DATA_BYTES: usize = 8 << 20;

/// Largest frame, header included: two [`MAX_DATA_BYTES`] buffers (COMPARE
/// AND WRITE carries two) plus room for the other fields. It bounds what a
/// broken or malicious peer can make a host buffer per connection.
pub const MAX_FRAME_BYTES: usize = 2 * MAX_DATA_BYTES + (64 << 10);

/// Largest payload: [`MAX_FRAME_BYTES`] minus the header.
pub const MAX_PAYLOAD_BYTES: usize = MAX_FRAME_BYTES - HEADER_BYTES;

/// Where the CRC sits in the header; it covers the bytes before it.
const CRC_OFFSET: usize = 24;

/// The fixed part of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Wire version the sender encoded the payload in.
    pub version: u16,
    /// Which message the payload holds.
    pub kind: MessageKind,
    /// Matches a response to its request.
    pub request_id: u64,
    /// The queue the frame travels in.
    pub class: QueueClass,
    /// Bytes of payload after the header.
    pub payload_len: u32,
}

/// A decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Its header.
    pub header: FrameHeader,
    /// Its message.
    pub message: Message,
}

/// An encoded frame as a list of chunks, header first, ready for one
/// vectored write. Large data buffers are shared with the message, not copied.
#[derive(Clone, Debug)]
pub struct EncodedFrame {
    chunks: Vec<Bytes>,
    len: usize,
}

impl EncodedFrame {
    /// The chunks in order.
    pub fn chunks(&self) -> &[Bytes] {
        &self.chunks
    }

    /// Total bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the frame is empty (never: a frame has at least its header).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The frame as one contiguous buffer (copies; for tests and fuzzing).
    pub fn to_bytes(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.len);
        for chunk in &self.chunks {
            out.extend_from_slice(chunk);
        }
        out.freeze()
    }
}

/// Encodes `message` as one frame.
pub fn encode_frame(
    version: WireVersion,
    request_id: u64,
    class: QueueClass,
    message: &Message,
) -> Result<EncodedFrame, WireError> {
    if !message.kind().is_handshake() {
        check_kind_in_version(message.kind(), version)?;
    }
    let mut payload = PayloadWriter::new();
    encode_payload(message, &mut payload)?;
    let payload_len = payload.len();
    if payload_len > MAX_PAYLOAD_BYTES {
        return Err(WireError::FrameTooLarge {
            len: (payload_len + HEADER_BYTES) as u64,
            max: MAX_FRAME_BYTES,
        });
    }
    let payload = payload.finish();

    let mut header = [0u8; HEADER_BYTES];
    header[0..4].copy_from_slice(&MAGIC);
    header[4..6].copy_from_slice(&version.number().to_le_bytes());
    header[6..8].copy_from_slice(&message.kind().number().to_le_bytes());
    header[8..16].copy_from_slice(&request_id.to_le_bytes());
    header[16] = class.number();
    header[20..24].copy_from_slice(&(payload_len as u32).to_le_bytes());
    let mut crc = crc32c(&header[..CRC_OFFSET]);
    for chunk in &payload {
        crc = crc32c_append(crc, chunk);
    }
    header[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());

    let mut chunks = Vec::with_capacity(payload.len() + 1);
    chunks.push(Bytes::copy_from_slice(&header));
    chunks.extend(payload);
    Ok(EncodedFrame {
        chunks,
        len: HEADER_BYTES + payload_len,
    })
}

/// Total length of the frame at the start of `buf`, once its header has
/// arrived, so that a reader can reserve room for the whole frame at once.
/// Does not validate anything but the length bound.
pub fn frame_bytes_needed(buf: &[u8]) -> Result<Option<usize>, WireError> {
    if buf.len() < HEADER_BYTES {
        return Ok(None);
    }
    let payload_len = u32::from_le_bytes([buf[20], buf[21], buf[22], buf[23]]) as usize;
    if payload_len > MAX_PAYLOAD_BYTES {
        return Err(WireError::FrameTooLarge {
            len: (payload_len + HEADER_BYTES) as u64,
            max: MAX_FRAME_BYTES,
        });
    }
    Ok(Some(HEADER_BYTES + payload_len))
}

/// Decodes the frame at the start of `buf`.
///
/// Returns `Ok(None)` when `buf` does not yet hold a whole frame (nothing is
/// consumed), `Ok(Some(frame))` after removing the frame's bytes from `buf`,
/// or an error for bytes that can never become a valid frame; after an error
/// the stream has lost its framing and the connection must be closed.
pub fn decode_frame(buf: &mut BytesMut) -> Result<Option<Frame>, WireError> {
    if buf.len() >= MAGIC.len() && buf[..MAGIC.len()] != MAGIC {
        let mut found = [0u8; 4];
        found.copy_from_slice(&buf[..4]);
        return Err(WireError::BadMagic { found });
    }
    let Some(total) = frame_bytes_needed(buf)? else {
        return Ok(None);
    };
    if buf.len() < total {
        return Ok(None);
    }
    let header_bytes = &buf[..HEADER_BYTES];
    let le16 = |at: usize| u16::from_le_bytes([header_bytes[at], header_bytes[at + 1]]);
    let version = le16(4);
    let kind_number = le16(6);
    let mut id = [0u8; 8];
    id.copy_from_slice(&header_bytes[8..16]);
    let request_id = u64::from_le_bytes(id);
    let class_number = header_bytes[16];
    let reserved = &header_bytes[17..20];
    let carried = u32::from_le_bytes([
        header_bytes[24],
        header_bytes[25],
        header_bytes[26],
        header_bytes[27],
    ]);
    let computed = crc32c_append(
        crc32c(&header_bytes[..CRC_OFFSET]),
        &buf[HEADER_BYTES..total],
    );
    if carried != computed {
        return Err(WireError::BadChecksum {
            request_id,
            carried,
            computed,
        });
    }
    if reserved.iter().any(|&b| b != 0) {
        return Err(WireError::ReservedBits { request_id });
    }
    let kind = MessageKind::from_number(kind_number)?;
    let class = QueueClass::from_number(class_number)?;

    let mut frame = buf.split_to(total);
    frame.advance(HEADER_BYTES);
    let payload = frame.freeze();
    let payload_len = payload.len() as u32;
    let message = decode_payload(kind, version, payload)?;
    Ok(Some(Frame {
        header: FrameHeader {
            version,
            kind,
            request_id,
            class,
            payload_len,
        },
        message,
    }))
}
