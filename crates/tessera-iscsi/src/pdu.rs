//! iSCSI PDUs (RFC 7143 section 11): the 48-byte basic header segment,
//! additional header segments, digests and the padded data segment, and a
//! typed view of every opcode a target sends or receives.
//!
//! Owns: byte layouts and nothing else. Must not touch: sockets, session
//! state or sequence-number rules (those live in [`crate::session`]).
//! Invariants:
//! - decoding is total: any byte string yields a PDU or a [`PduError`],
//!   never a panic;
//! - [`Pdu::to_frame`] followed by [`Pdu::from_frame`] gives back the same
//!   PDU (property-tested), so tests can speak as an initiator with the same
//!   code the target uses;
//! - a frame's data segment is never longer than the limit the reader
//!   passes, checked before any of it is buffered.

use bytes::{BufMut, Bytes, BytesMut};
use tessera_types::checksum::{crc32c, crc32c_append};

/// Size of the basic header segment.
pub const BHS_BYTES: usize = 48;
/// Size of a CRC32C digest on the wire.
pub const DIGEST_BYTES: usize = 4;
/// Largest data segment the 24-bit length field can describe.
pub const MAX_DATA_SEGMENT_BYTES: u32 = (1 << 24) - 1;
/// The tag meaning "no task" / "no transfer" (0xffffffff).
pub const RESERVED_TAG: u32 = u32::MAX;

/// AHS type of an extended CDB (bytes 17 and on of a CDB longer than 16).
const AHS_EXTENDED_CDB: u8 = 1;
/// AHS type of the bidirectional expected read-data length.
const AHS_BIDI_READ_LENGTH: u8 = 2;

/// Opcodes (byte 0, low six bits).
pub mod opcode {
    /// NOP-Out (initiator).
    pub const NOP_OUT: u8 = 0x00;
    /// SCSI Command.
    pub const SCSI_COMMAND: u8 = 0x01;
    /// Task Management Function Request.
    pub const TASK_MGMT_REQUEST: u8 = 0x02;
    /// Login Request.
    pub const LOGIN_REQUEST: u8 = 0x03;
    /// Text Request.
    pub const TEXT_REQUEST: u8 = 0x04;
    /// SCSI Data-Out.
    pub const DATA_OUT: u8 = 0x05;
    /// Logout Request.
    pub const LOGOUT_REQUEST: u8 = 0x06;
    /// SNACK Request.
    pub const SNACK: u8 = 0x10;
    /// NOP-In (target).
    pub const NOP_IN: u8 = 0x20;
    /// SCSI Response.
    pub const SCSI_RESPONSE: u8 = 0x21;
    /// Task Management Function Response.
    pub const TASK_MGMT_RESPONSE: u8 = 0x22;
    /// Login Response.
    pub const LOGIN_RESPONSE: u8 = 0x23;
    /// Text Response.
    pub const TEXT_RESPONSE: u8 = 0x24;
    /// SCSI Data-In.
    pub const DATA_IN: u8 = 0x25;
    /// Logout Response.
    pub const LOGOUT_RESPONSE: u8 = 0x26;
    /// Ready To Transfer.
    pub const R2T: u8 = 0x31;
    /// Asynchronous Message.
    pub const ASYNC_MESSAGE: u8 = 0x32;
    /// Reject.
    pub const REJECT: u8 = 0x3f;
}

/// Reject reasons (RFC 7143 section 11.17.1).
pub mod reject_reason {
    /// Data (payload) digest error.
    pub const DATA_DIGEST_ERROR: u8 = 0x02;
    /// SNACK reject.
    pub const SNACK_REJECT: u8 = 0x03;
    /// Protocol error.
    pub const PROTOCOL_ERROR: u8 = 0x04;
    /// Command not supported.
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x05;
    /// Immediate command reject: too many immediate commands.
    pub const IMMEDIATE_COMMAND_REJECT: u8 = 0x06;
    /// Task in progress.
    pub const TASK_IN_PROGRESS: u8 = 0x07;
    /// Invalid data ack.
    pub const INVALID_DATA_ACK: u8 = 0x08;
    /// Invalid PDU field.
    pub const INVALID_PDU_FIELD: u8 = 0x09;
    /// Long operation reject: out of resources.
    pub const OUT_OF_RESOURCES: u8 = 0x0a;
    /// Waiting for logout.
    pub const WAITING_FOR_LOGOUT: u8 = 0x0c;
}

/// Why bytes are not a PDU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    /// The opcode is not one RFC 7143 defines for this direction.
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The data segment is longer than the receiver accepts.
    #[error("data segment of {len} bytes exceeds the limit of {limit}")]
    DataSegmentTooLong {
        /// Announced length.
        len: u32,
        /// The receiver's limit.
        limit: u32,
    },
    /// The additional header segments are malformed.
    #[error("malformed additional header segment: {0}")]
    BadAhs(&'static str),
    /// The header digest does not match.
    #[error("header digest mismatch (computed {computed:#010x}, received {received:#010x})")]
    HeaderDigest {
        /// CRC32C of the header as received.
        computed: u32,
        /// Digest on the wire.
        received: u32,
    },
    /// A field holds a value the standard forbids.
    #[error("invalid field: {0}")]
    InvalidField(&'static str),
}

/// Which digests a connection negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digests {
    /// CRC32C after the header segments.
    pub header: bool,
    /// CRC32C after the (padded) data segment.
    pub data: bool,
}

/// One PDU as framed on the wire, before its opcode is interpreted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The basic header segment.
    pub bhs: [u8; BHS_BYTES],
    /// The additional header segments, padded to a multiple of 4.
    pub ahs: Bytes,
    /// The data segment, without padding.
    pub data: Bytes,
}

/// The lengths a basic header announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLayout {
    /// Bytes of additional header segments.
    pub ahs_bytes: usize,
    /// Bytes of data (before padding).
    pub data_bytes: usize,
    /// Bytes the whole frame takes on the wire, digests and padding included.
    pub total_bytes: usize,
}

/// What [`Frame::parse`] found.
#[derive(Debug)]
pub enum Parsed {
    /// More bytes are needed; at least this many in total.
    Incomplete(usize),
    /// A whole frame, and the bytes it took.
    Frame(Frame, usize),
    /// A whole frame whose data digest is wrong, and the bytes it took:
    /// the header is sound, so the connection can answer it.
    DataDigestError(Frame, usize),
}

/// Rounds `n` up to a multiple of 4.
pub fn padded(n: usize) -> usize {
    (n + 3) & !3
}

fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

fn get_lun(b: &[u8]) -> [u8; 8] {
    let mut lun = [0u8; 8];
    lun.copy_from_slice(&b[8..16]);
    lun
}

/// Computes the CRC32C digest of the header (and AHS).
pub fn header_digest(bhs: &[u8], ahs: &[u8]) -> u32 {
    crc32c_append(crc32c(bhs), ahs)
}

/// Computes the CRC32C digest of a data segment and its padding.
pub fn data_digest(data: &[u8]) -> u32 {
    let pad = [0u8; 3];
    crc32c_append(crc32c(data), &pad[..padded(data.len()) - data.len()])
}

impl Frame {
    /// The layout announced by a basic header.
    pub fn layout(bhs: &[u8; BHS_BYTES], digests: Digests) -> FrameLayout {
        let ahs_bytes = bhs[4] as usize * 4;
        let data_bytes = ((bhs[5] as usize) << 16) | ((bhs[6] as usize) << 8) | bhs[7] as usize;
        let mut total = BHS_BYTES + ahs_bytes;
        if digests.header {
            total += DIGEST_BYTES;
        }
        if data_bytes > 0 {
            total += padded(data_bytes);
            if digests.data {
                total += DIGEST_BYTES;
            }
        }
        FrameLayout {
            ahs_bytes,
            data_bytes,
            total_bytes: total,
        }
    }

    /// Parses one frame from the front of `buf`. A data segment longer than
    /// `max_data` is an error as soon as the header is in, so a reader never
    /// buffers more than it agreed to.
    pub fn parse(buf: &[u8], digests: Digests, max_data: u32) -> Result<Parsed, PduError> {
        let Some(raw) = buf.first_chunk::<BHS_BYTES>() else {
            return Ok(Parsed::Incomplete(BHS_BYTES));
        };
        let layout = Frame::layout(raw, digests);
        let header_end = BHS_BYTES + layout.ahs_bytes;
        if digests.header {
            let Some(wire) = buf.get(header_end..header_end + DIGEST_BYTES) else {
                return Ok(Parsed::Incomplete(header_end + DIGEST_BYTES));
            };
            let received = u32::from_le_bytes([wire[0], wire[1], wire[2], wire[3]]);
            let computed = header_digest(&buf[..BHS_BYTES], &buf[BHS_BYTES..header_end]);
            if received != computed {
                return Err(PduError::HeaderDigest { computed, received });
            }
        }
        if layout.data_bytes as u64 > max_data as u64 {
            return Err(PduError::DataSegmentTooLong {
                len: layout.data_bytes as u32,
                limit: max_data,
            });
        }
        if buf.len() < layout.total_bytes {
            return Ok(Parsed::Incomplete(layout.total_bytes));
        }
        let data_start = header_end + if digests.header { DIGEST_BYTES } else { 0 };
        let data = &buf[data_start..data_start + layout.data_bytes];
        let frame = Frame {
            bhs: *raw,
            ahs: Bytes::copy_from_slice(&buf[BHS_BYTES..header_end]),
            data: Bytes::copy_from_slice(data),
        };
        if digests.data && layout.data_bytes > 0 {
            let at = data_start + padded(layout.data_bytes);
            let wire = &buf[at..at + DIGEST_BYTES];
            let received = u32::from_le_bytes([wire[0], wire[1], wire[2], wire[3]]);
            if received != data_digest(data) {
                return Ok(Parsed::DataDigestError(frame, layout.total_bytes));
            }
        }
        Ok(Parsed::Frame(frame, layout.total_bytes))
    }

    /// Takes one frame off the front of `buf` without copying its data;
    /// `Ok(None)` when more bytes are needed. Checks as [`Frame::parse`].
    pub fn take(
        buf: &mut BytesMut,
        digests: Digests,
        max_data: u32,
    ) -> Result<Option<(Frame, bool)>, PduError> {
        let layout = {
            let Some(raw) = buf.first_chunk::<BHS_BYTES>() else {
                return Ok(None);
            };
            Frame::layout(raw, digests)
        };
        let header_end = BHS_BYTES + layout.ahs_bytes;
        if digests.header {
            let Some(wire) = buf.get(header_end..header_end + DIGEST_BYTES) else {
                return Ok(None);
            };
            let received = u32::from_le_bytes([wire[0], wire[1], wire[2], wire[3]]);
            let computed = header_digest(&buf[..BHS_BYTES], &buf[BHS_BYTES..header_end]);
            if received != computed {
                return Err(PduError::HeaderDigest { computed, received });
            }
        }
        if layout.data_bytes as u64 > max_data as u64 {
            return Err(PduError::DataSegmentTooLong {
                len: layout.data_bytes as u32,
                limit: max_data,
            });
        }
        if buf.len() < layout.total_bytes {
            return Ok(None);
        }
        let whole = buf.split_to(layout.total_bytes).freeze();
        let mut bhs = [0u8; BHS_BYTES];
        bhs.copy_from_slice(&whole[..BHS_BYTES]);
        let data_start = header_end + if digests.header { DIGEST_BYTES } else { 0 };
        let data = whole.slice(data_start..data_start + layout.data_bytes);
        let mut digest_ok = true;
        if digests.data && layout.data_bytes > 0 {
            let at = data_start + padded(layout.data_bytes);
            let wire = &whole[at..at + DIGEST_BYTES];
            let received = u32::from_le_bytes([wire[0], wire[1], wire[2], wire[3]]);
            digest_ok = received == data_digest(&data);
        }
        let frame = Frame {
            bhs,
            ahs: whole.slice(BHS_BYTES..header_end),
            data,
        };
        Ok(Some((frame, digest_ok)))
    }

    /// The header part of the frame on the wire (BHS, AHS, header digest),
    /// with the lengths filled in from `ahs` and `data`.
    pub fn header_bytes(&self, digests: Digests) -> Vec<u8> {
        let mut bhs = self.bhs;
        bhs[4] = (self.ahs.len() / 4) as u8;
        let len = self.data.len() as u32;
        bhs[5] = (len >> 16) as u8;
        bhs[6] = (len >> 8) as u8;
        bhs[7] = len as u8;
        let mut out = Vec::with_capacity(BHS_BYTES + self.ahs.len() + DIGEST_BYTES);
        out.extend_from_slice(&bhs);
        out.extend_from_slice(&self.ahs);
        if digests.header {
            let crc = header_digest(&bhs, &self.ahs);
            out.extend_from_slice(&crc.to_le_bytes());
        }
        out
    }

    /// The bytes after the data segment: padding and data digest.
    pub fn trailer_bytes(&self, digests: Digests) -> Vec<u8> {
        let mut out = vec![0u8; padded(self.data.len()) - self.data.len()];
        if digests.data && !self.data.is_empty() {
            out.extend_from_slice(&data_digest(&self.data).to_le_bytes());
        }
        out
    }

    /// The whole frame as one buffer (tests and small PDUs).
    pub fn to_bytes(&self, digests: Digests) -> Vec<u8> {
        let mut out = self.header_bytes(digests);
        out.extend_from_slice(&self.data);
        out.extend_from_slice(&self.trailer_bytes(digests));
        out
    }

    /// The opcode.
    pub fn opcode(&self) -> u8 {
        self.bhs[0] & 0x3f
    }

    /// The initiator task tag.
    pub fn itt(&self) -> u32 {
        get32(&self.bhs, 16)
    }
}

/// NOP-Out: a ping from the initiator, or the answer to a NOP-In.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NopOut {
    /// Immediate delivery.
    pub immediate: bool,
    /// LUN (raw).
    pub lun: [u8; 8],
    /// Initiator task tag; 0xffffffff when answering a target ping.
    pub itt: u32,
    /// Target transfer tag; copies a NOP-In's when answering it.
    pub ttt: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// Ping data, echoed back.
    pub data: Bytes,
}

/// SCSI Command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiCommand {
    /// Immediate delivery.
    pub immediate: bool,
    /// No unsolicited Data-Out follows (the F bit).
    pub final_pdu: bool,
    /// Data flows to the initiator.
    pub read: bool,
    /// Data flows from the initiator.
    pub write: bool,
    /// Task attribute (0 untagged, 1 simple, 2 ordered, 3 head of queue, 4 ACA).
    pub attribute: u8,
    /// LUN (raw).
    pub lun: [u8; 8],
    /// Initiator task tag.
    pub itt: u32,
    /// Expected data transfer length (the write direction for a
    /// bidirectional command).
    pub expected_length: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// The whole CDB: 16 bytes plus any extended CDB AHS.
    pub cdb: Bytes,
    /// Expected read length of a bidirectional command (AHS type 2).
    pub bidi_read_length: Option<u32>,
    /// Immediate data.
    pub data: Bytes,
}

/// Task Management Function Request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskMgmtRequest {
    /// Immediate delivery.
    pub immediate: bool,
    /// Function code (1 ABORT TASK ... 8 TASK REASSIGN).
    pub function: u8,
    /// LUN (raw).
    pub lun: [u8; 8],
    /// Initiator task tag of this request.
    pub itt: u32,
    /// Task the function refers to (ABORT TASK).
    pub referenced_tag: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// CmdSN of the referenced task.
    pub ref_cmd_sn: u32,
    /// ExpDataSN (task reassignment).
    pub exp_data_sn: u32,
}

/// Login Request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginRequest {
    /// Transit: the initiator wants to move to `next_stage`.
    pub transit: bool,
    /// Continue: the text goes on in the next PDU.
    pub continue_text: bool,
    /// Current stage (0 security, 1 operational).
    pub current_stage: u8,
    /// Next stage (1 operational, 3 full feature).
    pub next_stage: u8,
    /// Version-max.
    pub version_max: u8,
    /// Version-min.
    pub version_min: u8,
    /// Initiator session ID.
    pub isid: [u8; 6],
    /// Target session identifying handle (0 for a new session).
    pub tsih: u16,
    /// Initiator task tag.
    pub itt: u32,
    /// Connection ID.
    pub cid: u16,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// Text keys.
    pub data: Bytes,
}

/// Text Request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextRequest {
    /// Immediate delivery.
    pub immediate: bool,
    /// Final: the text is complete.
    pub final_pdu: bool,
    /// Continue: the text goes on in the next PDU.
    pub continue_text: bool,
    /// LUN (raw).
    pub lun: [u8; 8],
    /// Initiator task tag.
    pub itt: u32,
    /// Target transfer tag (0xffffffff to start).
    pub ttt: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// Text keys.
    pub data: Bytes,
}

/// SCSI Data-Out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataOut {
    /// Last PDU of the sequence.
    pub final_pdu: bool,
    /// LUN (raw).
    pub lun: [u8; 8],
    /// Initiator task tag of the command.
    pub itt: u32,
    /// The R2T's target transfer tag, or 0xffffffff for unsolicited data.
    pub ttt: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// DataSN within the sequence.
    pub data_sn: u32,
    /// Offset of this data in the command's buffer.
    pub buffer_offset: u32,
    /// The data.
    pub data: Bytes,
}

/// Logout Request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogoutRequest {
    /// Immediate delivery.
    pub immediate: bool,
    /// 0 close the session, 1 close a connection, 2 remove it for recovery.
    pub reason: u8,
    /// Initiator task tag.
    pub itt: u32,
    /// Connection to close (reasons 1 and 2).
    pub cid: u16,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

/// SNACK Request (recognised only to be rejected: error recovery level 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snack {
    /// The header as received.
    pub bhs: [u8; BHS_BYTES],
}

/// NOP-In: the answer to a NOP-Out, or a ping from the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NopIn {
    /// LUN (raw).
    pub lun: [u8; 8],
    /// The NOP-Out's tag, or 0xffffffff for a target ping.
    pub itt: u32,
    /// 0xffffffff unless the target wants an answer.
    pub ttt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Echoed ping data.
    pub data: Bytes,
}

/// Residual of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Residual {
    /// The command moved exactly the expected length.
    #[default]
    None,
    /// The command wanted more than the expected length (O bit).
    Overflow(u32),
    /// The command moved less than the expected length (U bit).
    Underflow(u32),
}

impl Residual {
    /// The residual of a transfer that moved (or wanted) `actual` bytes
    /// against `expected`.
    pub fn of(expected: u32, actual: u64) -> Residual {
        let expected64 = expected as u64;
        if actual > expected64 {
            Residual::Overflow((actual - expected64).min(u32::MAX as u64) as u32)
        } else if actual < expected64 {
            Residual::Underflow((expected64 - actual) as u32)
        } else {
            Residual::None
        }
    }

    fn flags(self) -> u8 {
        match self {
            Residual::None => 0,
            Residual::Overflow(_) => 0x04,
            Residual::Underflow(_) => 0x02,
        }
    }

    fn count(self) -> u32 {
        match self {
            Residual::None => 0,
            Residual::Overflow(n) | Residual::Underflow(n) => n,
        }
    }

    fn from_flags(flags: u8, count: u32) -> Residual {
        if flags & 0x04 != 0 {
            Residual::Overflow(count)
        } else if flags & 0x02 != 0 {
            Residual::Underflow(count)
        } else {
            Residual::None
        }
    }
}

/// SCSI Response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiResponse {
    /// 0x00 command completed at target, 0x01 target failure.
    pub response: u8,
    /// SCSI status byte.
    pub status: u8,
    /// Initiator task tag.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Number of Data-In PDUs sent for the command.
    pub exp_data_sn: u32,
    /// Residual of the (write, or only) direction.
    pub residual: Residual,
    /// Residual of the read direction of a bidirectional command.
    pub bidi_read_residual: Residual,
    /// Sense data (without the 2-byte length prefix the wire adds).
    pub sense: Bytes,
}

/// Task Management Function Response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskMgmtResponse {
    /// Response code (0 function complete, 1 task does not exist, ...).
    pub response: u8,
    /// Initiator task tag of the request.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// Login Response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginResponse {
    /// Transit to `next_stage`.
    pub transit: bool,
    /// The text goes on in the next PDU.
    pub continue_text: bool,
    /// Current stage.
    pub current_stage: u8,
    /// Next stage.
    pub next_stage: u8,
    /// Version-max.
    pub version_max: u8,
    /// Version-active.
    pub version_active: u8,
    /// Initiator session ID (copied).
    pub isid: [u8; 6],
    /// Target session identifying handle.
    pub tsih: u16,
    /// Initiator task tag.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Status-Class.
    pub status_class: u8,
    /// Status-Detail.
    pub status_detail: u8,
    /// Text keys.
    pub data: Bytes,
}

/// Text Response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextResponse {
    /// The text is complete.
    pub final_pdu: bool,
    /// The text goes on in the next PDU.
    pub continue_text: bool,
    /// LUN (raw).
    pub lun: [u8; 8],
    /// Initiator task tag.
    pub itt: u32,
    /// 0xffffffff when final; otherwise a tag the initiator returns.
    pub ttt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Text keys.
    pub data: Bytes,
}

/// SCSI Data-In.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataIn {
    /// Last PDU of the sequence.
    pub final_pdu: bool,
    /// Status is carried here (the S bit); then `final_pdu` is set too.
    pub status: Option<u8>,
    /// LUN (raw).
    pub lun: [u8; 8],
    /// Initiator task tag.
    pub itt: u32,
    /// StatSN (meaningful with status).
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// DataSN.
    pub data_sn: u32,
    /// Offset of this data in the command's buffer.
    pub buffer_offset: u32,
    /// Residual (with status only).
    pub residual: Residual,
    /// The data.
    pub data: Bytes,
}

/// Logout Response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogoutResponse {
    /// 0 closed, 1 CID not found, 2 recovery not supported, 3 cleanup failed.
    pub response: u8,
    /// Initiator task tag.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Time2Wait, seconds.
    pub time_to_wait: u16,
    /// Time2Retain, seconds.
    pub time_to_retain: u16,
}

/// Ready To Transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct R2t {
    /// LUN (raw).
    pub lun: [u8; 8],
    /// Initiator task tag of the command.
    pub itt: u32,
    /// Target transfer tag the Data-Outs must carry.
    pub ttt: u32,
    /// StatSN (not advanced).
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// R2TSN within the command.
    pub r2t_sn: u32,
    /// Offset of the requested data.
    pub buffer_offset: u32,
    /// Bytes requested.
    pub desired_length: u32,
}

/// Asynchronous Message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsyncMessage {
    /// LUN (raw).
    pub lun: [u8; 8],
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// AsyncEvent (1 = the target requests a logout).
    pub event: u8,
    /// AsyncVCode.
    pub vcode: u8,
    /// Parameter1..3.
    pub parameters: [u16; 3],
    /// Sense data or vendor data.
    pub data: Bytes,
}

/// Reject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// Reason code ([`reject_reason`]).
    pub reason: u8,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// DataSN/R2TSN (SNACK rejects).
    pub data_sn: u32,
    /// The header of the rejected PDU.
    pub header: Bytes,
}

/// Every PDU, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pdu {
    /// NOP-Out.
    NopOut(NopOut),
    /// SCSI Command.
    ScsiCommand(ScsiCommand),
    /// Task Management Function Request.
    TaskMgmtRequest(TaskMgmtRequest),
    /// Login Request.
    LoginRequest(LoginRequest),
    /// Text Request.
    TextRequest(TextRequest),
    /// SCSI Data-Out.
    DataOut(DataOut),
    /// Logout Request.
    LogoutRequest(LogoutRequest),
    /// SNACK Request.
    Snack(Snack),
    /// NOP-In.
    NopIn(NopIn),
    /// SCSI Response.
    ScsiResponse(ScsiResponse),
    /// Task Management Function Response.
    TaskMgmtResponse(TaskMgmtResponse),
    /// Login Response.
    LoginResponse(LoginResponse),
    /// Text Response.
    TextResponse(TextResponse),
    /// SCSI Data-In.
    DataIn(DataIn),
    /// Logout Response.
    LogoutResponse(LogoutResponse),
    /// Ready To Transfer.
    R2t(R2t),
    /// Asynchronous Message.
    AsyncMessage(AsyncMessage),
    /// Reject.
    Reject(Reject),
}

/// Splits the AHS area into (type, payload) pairs.
fn ahs_segments(ahs: &[u8]) -> Result<Vec<(u8, &[u8])>, PduError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < ahs.len() {
        if ahs.len() - at < 4 {
            return Err(PduError::BadAhs("truncated segment header"));
        }
        let len = get16(ahs, at) as usize;
        let kind = ahs[at + 2];
        // AHSLength counts the AHS-specific bytes, which begin with the
        // reserved byte right after the type.
        let start = at + 3;
        let end = start + len;
        if len == 0 || end > ahs.len() {
            return Err(PduError::BadAhs("segment longer than the AHS area"));
        }
        out.push((kind, &ahs[start + 1..end]));
        at = padded(end);
    }
    Ok(out)
}

fn push_ahs(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    let len = payload.len() + 1;
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.push(kind);
    out.push(0);
    out.extend_from_slice(payload);
    out.resize(padded(out.len()), 0);
}

impl Pdu {
    /// Interprets a frame.
    pub fn from_frame(frame: Frame) -> Result<Pdu, PduError> {
        let b = &frame.bhs;
        let immediate = b[0] & 0x40 != 0;
        let f = b[1];
        let final_bit = f & 0x80 != 0;
        let lun = get_lun(b);
        let itt = get32(b, 16);
        let data = frame.data;
        let op = b[0] & 0x3f;
        if op != opcode::SCSI_COMMAND && !frame.ahs.is_empty() {
            ahs_segments(&frame.ahs)?;
        }
        Ok(match op {
            opcode::NOP_OUT => Pdu::NopOut(NopOut {
                immediate,
                lun,
                itt,
                ttt: get32(b, 20),
                cmd_sn: get32(b, 24),
                exp_stat_sn: get32(b, 28),
                data,
            }),
            opcode::SCSI_COMMAND => {
                let mut cdb = b[32..48].to_vec();
                let mut bidi_read_length = None;
                for (kind, payload) in ahs_segments(&frame.ahs)? {
                    match kind {
                        AHS_EXTENDED_CDB => cdb.extend_from_slice(payload),
                        AHS_BIDI_READ_LENGTH if payload.len() == 4 => {
                            bidi_read_length = Some(get32(payload, 0))
                        }
                        AHS_BIDI_READ_LENGTH => {
                            return Err(PduError::BadAhs(
                                "bidirectional read length is not 4 bytes",
                            ))
                        }
                        _ => return Err(PduError::BadAhs("unknown AHS type")),
                    }
                }
                Pdu::ScsiCommand(ScsiCommand {
                    immediate,
                    final_pdu: final_bit,
                    read: f & 0x40 != 0,
                    write: f & 0x20 != 0,
                    attribute: f & 0x07,
                    lun,
                    itt,
                    expected_length: get32(b, 20),
                    cmd_sn: get32(b, 24),
                    exp_stat_sn: get32(b, 28),
                    cdb: Bytes::from(cdb),
                    bidi_read_length,
                    data,
                })
            }
            opcode::TASK_MGMT_REQUEST => Pdu::TaskMgmtRequest(TaskMgmtRequest {
                immediate,
                function: f & 0x7f,
                lun,
                itt,
                referenced_tag: get32(b, 20),
                cmd_sn: get32(b, 24),
                exp_stat_sn: get32(b, 28),
                ref_cmd_sn: get32(b, 32),
                exp_data_sn: get32(b, 36),
            }),
            opcode::LOGIN_REQUEST => {
                let mut isid = [0u8; 6];
                isid.copy_from_slice(&b[8..14]);
                Pdu::LoginRequest(LoginRequest {
                    transit: final_bit,
                    continue_text: f & 0x40 != 0,
                    current_stage: (f >> 2) & 3,
                    next_stage: f & 3,
                    version_max: b[2],
                    version_min: b[3],
                    isid,
                    tsih: get16(b, 14),
                    itt,
                    cid: get16(b, 20),
                    cmd_sn: get32(b, 24),
                    exp_stat_sn: get32(b, 28),
                    data,
                })
            }
            opcode::TEXT_REQUEST => Pdu::TextRequest(TextRequest {
                immediate,
                final_pdu: final_bit,
                continue_text: f & 0x40 != 0,
                lun,
                itt,
                ttt: get32(b, 20),
                cmd_sn: get32(b, 24),
                exp_stat_sn: get32(b, 28),
                data,
            }),
            opcode::DATA_OUT => Pdu::DataOut(DataOut {
                final_pdu: final_bit,
                lun,
                itt,
                ttt: get32(b, 20),
                exp_stat_sn: get32(b, 28),
                data_sn: get32(b, 36),
                buffer_offset: get32(b, 40),
                data,
            }),
            opcode::LOGOUT_REQUEST => Pdu::LogoutRequest(LogoutRequest {
                immediate,
                reason: f & 0x7f,
                itt,
                cid: get16(b, 20),
                cmd_sn: get32(b, 24),
                exp_stat_sn: get32(b, 28),
            }),
            opcode::SNACK => {
                let mut bhs = *b;
                bhs[4..8].fill(0);
                Pdu::Snack(Snack { bhs })
            }
            opcode::NOP_IN => Pdu::NopIn(NopIn {
                lun,
                itt,
                ttt: get32(b, 20),
                stat_sn: get32(b, 24),
                exp_cmd_sn: get32(b, 28),
                max_cmd_sn: get32(b, 32),
                data,
            }),
            opcode::SCSI_RESPONSE => {
                let sense = if data.len() >= 2 {
                    let len = (get16(&data, 0) as usize).min(data.len() - 2);
                    data.slice(2..2 + len)
                } else {
                    Bytes::new()
                };
                Pdu::ScsiResponse(ScsiResponse {
                    response: b[2],
                    status: b[3],
                    itt,
                    stat_sn: get32(b, 24),
                    exp_cmd_sn: get32(b, 28),
                    max_cmd_sn: get32(b, 32),
                    exp_data_sn: get32(b, 36),
                    bidi_read_residual: Residual::from_flags(f >> 2, get32(b, 40)),
                    residual: Residual::from_flags(f, get32(b, 44)),
                    sense,
                })
            }
            opcode::TASK_MGMT_RESPONSE => Pdu::TaskMgmtResponse(TaskMgmtResponse {
                response: b[2],
                itt,
                stat_sn: get32(b, 24),
                exp_cmd_sn: get32(b, 28),
                max_cmd_sn: get32(b, 32),
            }),
            opcode::LOGIN_RESPONSE => {
                let mut isid = [0u8; 6];
                isid.copy_from_slice(&b[8..14]);
                Pdu::LoginResponse(LoginResponse {
                    transit: final_bit,
                    continue_text: f & 0x40 != 0,
                    current_stage: (f >> 2) & 3,
                    next_stage: f & 3,
                    version_max: b[2],
                    version_active: b[3],
                    isid,
                    tsih: get16(b, 14),
                    itt,
                    stat_sn: get32(b, 24),
                    exp_cmd_sn: get32(b, 28),
                    max_cmd_sn: get32(b, 32),
                    status_class: b[36],
                    status_detail: b[37],
                    data,
                })
            }
            opcode::TEXT_RESPONSE => Pdu::TextResponse(TextResponse {
                final_pdu: final_bit,
                continue_text: f & 0x40 != 0,
                lun,
                itt,
                ttt: get32(b, 20),
                stat_sn: get32(b, 24),
                exp_cmd_sn: get32(b, 28),
                max_cmd_sn: get32(b, 32),
                data,
            }),
            opcode::DATA_IN => {
                let has_status = f & 0x01 != 0;
                Pdu::DataIn(DataIn {
                    final_pdu: final_bit || has_status,
                    status: has_status.then_some(b[3]),
                    lun,
                    itt,
                    stat_sn: if has_status { get32(b, 24) } else { 0 },
                    exp_cmd_sn: get32(b, 28),
                    max_cmd_sn: get32(b, 32),
                    data_sn: get32(b, 36),
                    buffer_offset: get32(b, 40),
                    residual: if has_status {
                        Residual::from_flags(f, get32(b, 44))
                    } else {
                        Residual::None
                    },
                    data,
                })
            }
            opcode::LOGOUT_RESPONSE => Pdu::LogoutResponse(LogoutResponse {
                response: b[2],
                itt,
                stat_sn: get32(b, 24),
                exp_cmd_sn: get32(b, 28),
                max_cmd_sn: get32(b, 32),
                time_to_wait: get16(b, 40),
                time_to_retain: get16(b, 42),
            }),
            opcode::R2T => Pdu::R2t(R2t {
                lun,
                itt,
                ttt: get32(b, 20),
                stat_sn: get32(b, 24),
                exp_cmd_sn: get32(b, 28),
                max_cmd_sn: get32(b, 32),
                r2t_sn: get32(b, 36),
                buffer_offset: get32(b, 40),
                desired_length: get32(b, 44),
            }),
            opcode::ASYNC_MESSAGE => Pdu::AsyncMessage(AsyncMessage {
                lun,
                stat_sn: get32(b, 24),
                exp_cmd_sn: get32(b, 28),
                max_cmd_sn: get32(b, 32),
                event: b[36],
                vcode: b[37],
                parameters: [get16(b, 38), get16(b, 40), get16(b, 42)],
                data,
            }),
            opcode::REJECT => Pdu::Reject(Reject {
                reason: b[2],
                stat_sn: get32(b, 24),
                exp_cmd_sn: get32(b, 28),
                max_cmd_sn: get32(b, 32),
                data_sn: get32(b, 36),
                header: data,
            }),
            other => return Err(PduError::UnknownOpcode(other)),
        })
    }

    /// Lays the PDU out as a frame; lengths are filled in on output.
    pub fn to_frame(&self) -> Frame {
        let mut b = [0u8; BHS_BYTES];
        let mut ahs = Vec::new();
        let mut data = Bytes::new();
        let imm = |i: bool| if i { 0x40 } else { 0 };
        match self {
            Pdu::NopOut(p) => {
                b[0] = opcode::NOP_OUT | imm(p.immediate);
                b[1] = 0x80;
                b[8..16].copy_from_slice(&p.lun);
                put32(&mut b, 16, p.itt);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 24, p.cmd_sn);
                put32(&mut b, 28, p.exp_stat_sn);
                data = p.data.clone();
            }
            Pdu::ScsiCommand(p) => {
                b[0] = opcode::SCSI_COMMAND | imm(p.immediate);
                b[1] = (if p.final_pdu { 0x80 } else { 0 })
                    | (if p.read { 0x40 } else { 0 })
                    | (if p.write { 0x20 } else { 0 })
                    | (p.attribute & 7);
                b[8..16].copy_from_slice(&p.lun);
                put32(&mut b, 16, p.itt);
                put32(&mut b, 20, p.expected_length);
                put32(&mut b, 24, p.cmd_sn);
                put32(&mut b, 28, p.exp_stat_sn);
                let head = p.cdb.len().min(16);
                b[32..32 + head].copy_from_slice(&p.cdb[..head]);
                if p.cdb.len() > 16 {
                    push_ahs(&mut ahs, AHS_EXTENDED_CDB, &p.cdb[16..]);
                }
                if let Some(len) = p.bidi_read_length {
                    push_ahs(&mut ahs, AHS_BIDI_READ_LENGTH, &len.to_be_bytes());
                }
                data = p.data.clone();
            }
            Pdu::TaskMgmtRequest(p) => {
                b[0] = opcode::TASK_MGMT_REQUEST | imm(p.immediate);
                b[1] = 0x80 | (p.function & 0x7f);
                b[8..16].copy_from_slice(&p.lun);
                put32(&mut b, 16, p.itt);
                put32(&mut b, 20, p.referenced_tag);
                put32(&mut b, 24, p.cmd_sn);
                put32(&mut b, 28, p.exp_stat_sn);
                put32(&mut b, 32, p.ref_cmd_sn);
                put32(&mut b, 36, p.exp_data_sn);
            }
            Pdu::LoginRequest(p) => {
                b[0] = opcode::LOGIN_REQUEST | 0x40;
                b[1] = (if p.transit { 0x80 } else { 0 })
                    | (if p.continue_text { 0x40 } else { 0 })
                    | ((p.current_stage & 3) << 2)
                    | (p.next_stage & 3);
                b[2] = p.version_max;
                b[3] = p.version_min;
                b[8..14].copy_from_slice(&p.isid);
                put16(&mut b, 14, p.tsih);
                put32(&mut b, 16, p.itt);
                put16(&mut b, 20, p.cid);
                put32(&mut b, 24, p.cmd_sn);
                put32(&mut b, 28, p.exp_stat_sn);
                data = p.data.clone();
            }
            Pdu::TextRequest(p) => {
                b[0] = opcode::TEXT_REQUEST | imm(p.immediate);
                b[1] =
                    (if p.final_pdu { 0x80 } else { 0 }) | (if p.continue_text { 0x40 } else { 0 });
                b[8..16].copy_from_slice(&p.lun);
                put32(&mut b, 16, p.itt);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 24, p.cmd_sn);
                put32(&mut b, 28, p.exp_stat_sn);
                data = p.data.clone();
            }
            Pdu::DataOut(p) => {
                b[0] = opcode::DATA_OUT;
                b[1] = if p.final_pdu { 0x80 } else { 0 };
                b[8..16].copy_from_slice(&p.lun);
                put32(&mut b, 16, p.itt);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 28, p.exp_stat_sn);
                put32(&mut b, 36, p.data_sn);
                put32(&mut b, 40, p.buffer_offset);
                data = p.data.clone();
            }
            Pdu::LogoutRequest(p) => {
                b[0] = opcode::LOGOUT_REQUEST | imm(p.immediate);
                b[1] = 0x80 | (p.reason & 0x7f);
                put32(&mut b, 16, p.itt);
                put16(&mut b, 20, p.cid);
                put32(&mut b, 24, p.cmd_sn);
                put32(&mut b, 28, p.exp_stat_sn);
            }
            Pdu::Snack(p) => {
                b = p.bhs;
                b[4..8].fill(0);
            }
            Pdu::NopIn(p) => {
                b[0] = opcode::NOP_IN;
                b[1] = 0x80;
                b[8..16].copy_from_slice(&p.lun);
                put32(&mut b, 16, p.itt);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                data = p.data.clone();
            }
            Pdu::ScsiResponse(p) => {
                b[0] = opcode::SCSI_RESPONSE;
                b[1] = 0x80 | p.residual.flags() | (p.bidi_read_residual.flags() << 2);
                b[2] = p.response;
                b[3] = p.status;
                put32(&mut b, 16, p.itt);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                put32(&mut b, 36, p.exp_data_sn);
                put32(&mut b, 40, p.bidi_read_residual.count());
                put32(&mut b, 44, p.residual.count());
                if !p.sense.is_empty() {
                    let mut d = BytesMut::with_capacity(2 + p.sense.len());
                    d.put_u16(p.sense.len() as u16);
                    d.extend_from_slice(&p.sense);
                    data = d.freeze();
                }
            }
            Pdu::TaskMgmtResponse(p) => {
                b[0] = opcode::TASK_MGMT_RESPONSE;
                b[1] = 0x80;
                b[2] = p.response;
                put32(&mut b, 16, p.itt);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
            }
            Pdu::LoginResponse(p) => {
                b[0] = opcode::LOGIN_RESPONSE;
                b[1] = (if p.transit { 0x80 } else { 0 })
                    | (if p.continue_text { 0x40 } else { 0 })
                    | ((p.current_stage & 3) << 2)
                    | (p.next_stage & 3);
                b[2] = p.version_max;
                b[3] = p.version_active;
                b[8..14].copy_from_slice(&p.isid);
                put16(&mut b, 14, p.tsih);
                put32(&mut b, 16, p.itt);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                b[36] = p.status_class;
                b[37] = p.status_detail;
                data = p.data.clone();
            }
            Pdu::TextResponse(p) => {
                b[0] = opcode::TEXT_RESPONSE;
                b[1] =
                    (if p.final_pdu { 0x80 } else { 0 }) | (if p.continue_text { 0x40 } else { 0 });
                b[8..16].copy_from_slice(&p.lun);
                put32(&mut b, 16, p.itt);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                data = p.data.clone();
            }
            Pdu::DataIn(p) => {
                b[0] = opcode::DATA_IN;
                b[1] = if p.final_pdu || p.status.is_some() {
                    0x80
                } else {
                    0
                };
                if let Some(status) = p.status {
                    b[1] |= 0x01 | p.residual.flags();
                    b[3] = status;
                    put32(&mut b, 24, p.stat_sn);
                    put32(&mut b, 44, p.residual.count());
                }
                b[8..16].copy_from_slice(&p.lun);
                put32(&mut b, 16, p.itt);
                put32(&mut b, 20, RESERVED_TAG);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                put32(&mut b, 36, p.data_sn);
                put32(&mut b, 40, p.buffer_offset);
                data = p.data.clone();
            }
            Pdu::LogoutResponse(p) => {
                b[0] = opcode::LOGOUT_RESPONSE;
                b[1] = 0x80;
                b[2] = p.response;
                put32(&mut b, 16, p.itt);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                put16(&mut b, 40, p.time_to_wait);
                put16(&mut b, 42, p.time_to_retain);
            }
            Pdu::R2t(p) => {
                b[0] = opcode::R2T;
                b[1] = 0x80;
                b[8..16].copy_from_slice(&p.lun);
                put32(&mut b, 16, p.itt);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                put32(&mut b, 36, p.r2t_sn);
                put32(&mut b, 40, p.buffer_offset);
                put32(&mut b, 44, p.desired_length);
            }
            Pdu::AsyncMessage(p) => {
                b[0] = opcode::ASYNC_MESSAGE;
                b[1] = 0x80;
                b[8..16].copy_from_slice(&p.lun);
                put32(&mut b, 16, RESERVED_TAG);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                b[36] = p.event;
                b[37] = p.vcode;
                put16(&mut b, 38, p.parameters[0]);
                put16(&mut b, 40, p.parameters[1]);
                put16(&mut b, 42, p.parameters[2]);
                data = p.data.clone();
            }
            Pdu::Reject(p) => {
                b[0] = opcode::REJECT;
                b[1] = 0x80;
                b[2] = p.reason;
                put32(&mut b, 16, RESERVED_TAG);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                put32(&mut b, 36, p.data_sn);
                data = p.header.clone();
            }
        }
        let len = data.len() as u32;
        b[4] = (ahs.len() / 4) as u8;
        b[5] = (len >> 16) as u8;
        b[6] = (len >> 8) as u8;
        b[7] = len as u8;
        Frame {
            bhs: b,
            ahs: Bytes::from(ahs),
            data,
        }
    }

    /// The whole PDU on the wire.
    pub fn to_bytes(&self, digests: Digests) -> Vec<u8> {
        self.to_frame().to_bytes(digests)
    }

    /// Parses one whole PDU from `buf` (tests and fuzzing): the PDU and the
    /// bytes it took, `None` when `buf` is short.
    pub fn parse(
        buf: &[u8],
        digests: Digests,
        max_data: u32,
    ) -> Result<Option<(Pdu, usize)>, PduError> {
        match Frame::parse(buf, digests, max_data)? {
            Parsed::Incomplete(_) => Ok(None),
            Parsed::DataDigestError(..) => Err(PduError::InvalidField("data digest")),
            Parsed::Frame(frame, used) => Ok(Some((Pdu::from_frame(frame)?, used))),
        }
    }
}

/// The flat LUN number an initiator addressed: SAM-5 peripheral (00b) or
/// flat-space (01b) addressing, single level. Anything else maps to a
/// number no unit has, so the SCSI side answers LOGICAL UNIT NOT SUPPORTED.
pub fn lun_number(lun: [u8; 8]) -> u64 {
    let single_level = lun[2..].iter().all(|&b| b == 0);
    match lun[0] >> 6 {
        0b00 if single_level && lun[0] == 0 => lun[1] as u64,
        0b01 if single_level => (((lun[0] & 0x3f) as u64) << 8) | lun[1] as u64,
        _ => u64::from_be_bytes(lun),
    }
}

/// The 8-byte LUN field for a LUN number below 16384 (peripheral addressing
/// below 256, flat space above).
pub fn lun_field(lun: u64) -> [u8; 8] {
    let mut out = [0u8; 8];
    if lun < 256 {
        out[1] = lun as u8;
    } else if lun < 0x4000 {
        out[0] = 0x40 | (lun >> 8) as u8;
        out[1] = lun as u8;
    } else {
        out = lun.to_be_bytes();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from)
    }

    fn residual() -> impl Strategy<Value = Residual> {
        prop_oneof![
            Just(Residual::None),
            any::<u32>().prop_map(Residual::Overflow),
            any::<u32>().prop_map(Residual::Underflow),
        ]
    }

    fn pdu() -> impl Strategy<Value = Pdu> {
        prop_oneof![
            (
                any::<bool>(),
                any::<[u8; 8]>(),
                any::<[u32; 4]>(),
                bytes(64)
            )
                .prop_map(|(immediate, lun, n, data)| Pdu::NopOut(NopOut {
                    immediate,
                    lun,
                    itt: n[0],
                    ttt: n[1],
                    cmd_sn: n[2],
                    exp_stat_sn: n[3],
                    data
                })),
            (
                any::<[bool; 4]>(),
                0u8..8,
                any::<[u8; 8]>(),
                any::<[u32; 4]>(),
                proptest::collection::vec(any::<u8>(), 16..40),
                proptest::option::of(any::<u32>()),
                bytes(64)
            )
                .prop_map(|(f, attribute, lun, n, cdb, bidi, data)| {
                    Pdu::ScsiCommand(ScsiCommand {
                        immediate: f[0],
                        final_pdu: f[1],
                        read: f[2],
                        write: f[3],
                        attribute,
                        lun,
                        itt: n[0],
                        expected_length: n[1],
                        cmd_sn: n[2],
                        exp_stat_sn: n[3],
                        cdb: Bytes::from(cdb),
                        bidi_read_length: bidi,
                        data,
                    })
                }),
            (
                any::<bool>(),
                0u8..0x80,
                any::<[u8; 8]>(),
                any::<[u32; 6]>()
            )
                .prop_map(|(immediate, function, lun, n)| Pdu::TaskMgmtRequest(
                    TaskMgmtRequest {
                        immediate,
                        function,
                        lun,
                        itt: n[0],
                        referenced_tag: n[1],
                        cmd_sn: n[2],
                        exp_stat_sn: n[3],
                        ref_cmd_sn: n[4],
                        exp_data_sn: n[5],
                    }
                )),
            (
                any::<[bool; 2]>(),
                0u8..4,
                0u8..4,
                any::<[u8; 6]>(),
                any::<u16>(),
                any::<[u32; 3]>(),
                bytes(64)
            )
                .prop_map(|(f, csg, nsg, isid, tsih, n, data)| {
                    Pdu::LoginRequest(LoginRequest {
                        transit: f[0],
                        continue_text: f[1],
                        current_stage: csg,
                        next_stage: nsg,
                        version_max: 0,
                        version_min: 0,
                        isid,
                        tsih,
                        itt: n[0],
                        cid: tsih.wrapping_add(1),
                        cmd_sn: n[1],
                        exp_stat_sn: n[2],
                        data,
                    })
                }),
            (
                any::<bool>(),
                any::<[u8; 8]>(),
                any::<[u32; 5]>(),
                bytes(100)
            )
                .prop_map(|(final_pdu, lun, n, data)| Pdu::DataOut(DataOut {
                    final_pdu,
                    lun,
                    itt: n[0],
                    ttt: n[1],
                    exp_stat_sn: n[2],
                    data_sn: n[3],
                    buffer_offset: n[4],
                    data,
                })),
            (
                any::<u8>(),
                any::<[u32; 5]>(),
                residual(),
                residual(),
                bytes(40)
            )
                .prop_map(|(status, n, residual, bidi, sense)| Pdu::ScsiResponse(
                    ScsiResponse {
                        response: status & 1,
                        status,
                        itt: n[0],
                        stat_sn: n[1],
                        exp_cmd_sn: n[2],
                        max_cmd_sn: n[3],
                        exp_data_sn: n[4],
                        residual,
                        bidi_read_residual: bidi,
                        sense,
                    }
                )),
            (
                proptest::option::of(any::<u8>()),
                any::<bool>(),
                any::<[u8; 8]>(),
                any::<[u32; 6]>(),
                residual(),
                bytes(100)
            )
                .prop_map(|(status, final_pdu, lun, n, residual, data)| {
                    Pdu::DataIn(DataIn {
                        final_pdu: final_pdu || status.is_some(),
                        status,
                        lun,
                        itt: n[0],
                        stat_sn: if status.is_some() { n[1] } else { 0 },
                        exp_cmd_sn: n[2],
                        max_cmd_sn: n[3],
                        data_sn: n[4],
                        buffer_offset: n[5],
                        residual: if status.is_some() {
                            residual
                        } else {
                            Residual::None
                        },
                        data,
                    })
                }),
            (any::<[u8; 8]>(), any::<[u32; 8]>()).prop_map(|(lun, n)| Pdu::R2t(R2t {
                lun,
                itt: n[0],
                ttt: n[1],
                stat_sn: n[2],
                exp_cmd_sn: n[3],
                max_cmd_sn: n[4],
                r2t_sn: n[5],
                buffer_offset: n[6],
                desired_length: n[7],
            })),
            (any::<u8>(), any::<[u32; 4]>()).prop_map(|(reason, n)| Pdu::Reject(Reject {
                reason,
                stat_sn: n[0],
                exp_cmd_sn: n[1],
                max_cmd_sn: n[2],
                data_sn: n[3],
                header: Bytes::from(vec![7u8; 48]),
            })),
        ]
    }

    proptest! {
        #[test]
        fn every_pdu_survives_a_round_trip(
            pdu in pdu(),
            header in any::<bool>(),
            data in any::<bool>(),
        ) {
            let digests = Digests { header, data };
            let wire = pdu.to_bytes(digests);
            prop_assert_eq!(wire.len() % 4, 0);
            let (back, used) = Pdu::parse(&wire, digests, MAX_DATA_SEGMENT_BYTES)
                .expect("decodes")
                .expect("complete");
            prop_assert_eq!(used, wire.len());
            prop_assert_eq!(back, pdu);
        }

        #[test]
        fn any_prefix_is_incomplete_or_an_error_never_a_panic(
            raw in proptest::collection::vec(any::<u8>(), 0..200),
            header in any::<bool>(),
        ) {
            let digests = Digests { header, data: header };
            if let Ok(Some((_, used))) = Pdu::parse(&raw, digests, 8192) {
                prop_assert!(used <= raw.len());
            }
        }
    }

    #[test]
    fn a_flipped_header_bit_fails_the_header_digest() {
        let digests = Digests {
            header: true,
            data: true,
        };
        let nop = Pdu::NopOut(NopOut {
            immediate: true,
            lun: [0; 8],
            itt: 1,
            ttt: RESERVED_TAG,
            cmd_sn: 5,
            exp_stat_sn: 0,
            data: Bytes::from_static(b"ping"),
        });
        let mut wire = nop.to_bytes(digests);
        wire[20] ^= 1;
        assert!(matches!(
            Frame::parse(&wire, digests, 8192),
            Err(PduError::HeaderDigest { .. })
        ));
        let mut wire = nop.to_bytes(digests);
        wire[BHS_BYTES + DIGEST_BYTES] ^= 1;
        assert!(matches!(
            Frame::parse(&wire, digests, 8192),
            Ok(Parsed::DataDigestError(..))
        ));
    }

    #[test]
    fn an_oversized_data_segment_is_refused_from_the_header_alone() {
        let mut bhs = [0u8; BHS_BYTES];
        bhs[0] = opcode::SCSI_COMMAND;
        bhs[5] = 0x01; // 65536 bytes
        assert_eq!(
            Frame::parse(&bhs, Digests::default(), 8192).unwrap_err(),
            PduError::DataSegmentTooLong {
                len: 65536,
                limit: 8192
            }
        );
    }

    #[test]
    fn extended_cdb_travels_in_an_ahs() {
        let cmd = ScsiCommand {
            immediate: false,
            final_pdu: true,
            read: true,
            write: false,
            attribute: 1,
            lun: lun_field(0),
            itt: 9,
            expected_length: 512,
            cmd_sn: 1,
            exp_stat_sn: 1,
            cdb: Bytes::from((0u8..32).collect::<Vec<_>>()),
            bidi_read_length: None,
            data: Bytes::new(),
        };
        let frame = Pdu::ScsiCommand(cmd.clone()).to_frame();
        assert_eq!(frame.bhs[4], 5, "17 bytes of AHS-specific data, padded");
        assert_eq!(&frame.ahs[..4], &[0, 17, 1, 0]);
    }

    #[test]
    fn lun_numbers_round_trip_through_the_lun_field() {
        for lun in [0u64, 1, 255, 256, 0x3fff] {
            assert_eq!(lun_number(lun_field(lun)), lun);
        }
        assert_ne!(lun_number([0x80, 0, 0, 0, 0, 0, 0, 0]), 0);
    }

    #[test]
    fn residual_compares_both_ways() {
        assert_eq!(Residual::of(512, 1024), Residual::Overflow(512));
        assert_eq!(Residual::of(10000, 512), Residual::Underflow(9488));
        assert_eq!(Residual::of(512, 512), Residual::None);
    }
}
