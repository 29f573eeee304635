//! The NBD wire format: constants, and encoders and decoders for the
//! handshake, the options, requests and replies.
//!
//! Owns: every byte layout the server puts on or takes off the socket.
//! Must not touch: sockets, tasks, clocks or devices; this module is pure so
//! that the fuzz targets and property tests exercise exactly what the server
//! runs.
//! Invariants: decoders never panic on any input and never allocate more than
//! the named limits below allow; every length read from a peer is checked
//! against a limit before it is used.

use bytes::{BufMut, BytesMut};
use thiserror::Error;

/// `NBDMAGIC`, the first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle magic, and the prefix of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Prefix of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Prefix of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Prefix of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Bytes of the server greeting: magic, `IHAVEOPT`, handshake flags.
pub const GREETING_BYTES: usize = 18;
/// Bytes of the client flags that answer the greeting.
pub const CLIENT_FLAGS_BYTES: usize = 4;
/// Bytes of an option header: magic, option, length.
pub const OPTION_HEADER_BYTES: usize = 16;
/// Bytes of a request header.
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Bytes of a simple reply.
pub const SIMPLE_REPLY_BYTES: usize = 16;
/// Bytes of a structured reply chunk header.
pub const CHUNK_HEADER_BYTES: usize = 20;

/// Largest option payload accepted, in bytes. The largest legitimate option
/// carries one 4096-byte export name plus a few queries; anything larger is
/// refused before it is buffered.
pub const MAX_OPTION_DATA_BYTES: u32 = 64 * 1024;
/// Longest string (export name, query, message) the protocol allows, in bytes.
pub const MAX_STRING_BYTES: usize = 4096;
/// Most meta-context queries accepted in one option.
pub const MAX_META_QUERIES: u32 = 128;
/// Most information requests accepted in one `NBD_OPT_INFO`/`NBD_OPT_GO`.
pub const MAX_INFO_REQUESTS: u16 = 64;
/// Largest READ or WRITE payload, in bytes; advertised as the maximum block
/// size, and the bound on the memory one request may pin.
pub const MAX_PAYLOAD_BYTES: u32 = 32 * 1024 * 1024;
/// Smallest block size advertised, in bytes (512e).
pub const MIN_BLOCK_BYTES: u32 = 512;
/// Preferred block size advertised when the device does not say, in bytes.
pub const DEFAULT_PREFERRED_BLOCK_BYTES: u32 = 4096;
/// Longest error message put in an error chunk, in bytes.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 1024;

/// Handshake flags the server sends.
pub mod handshake_flags {
    /// The server speaks fixed newstyle.
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    /// The server can omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Client flags answering the greeting.
pub mod client_flags {
    /// The client speaks fixed newstyle.
    pub const FIXED_NEWSTYLE: u32 = 1 << 0;
    /// The client does not want the 124 zero bytes.
    pub const NO_ZEROES: u32 = 1 << 1;
}

/// Option numbers.
pub mod opt {
    /// Choose an export and enter transmission (no error reply possible).
    pub const EXPORT_NAME: u32 = 1;
    /// End the negotiation.
    pub const ABORT: u32 = 2;
    /// List exports.
    pub const LIST: u32 = 3;
    /// Withdrawn.
    pub const PEEK_EXPORT: u32 = 4;
    /// Upgrade to TLS.
    pub const STARTTLS: u32 = 5;
    /// Describe an export.
    pub const INFO: u32 = 6;
    /// Describe an export and enter transmission.
    pub const GO: u32 = 7;
    /// Use structured replies.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// List metadata contexts.
    pub const LIST_META_CONTEXT: u32 = 9;
    /// Select metadata contexts.
    pub const SET_META_CONTEXT: u32 = 10;
    /// 64-bit request headers.
    pub const EXTENDED_HEADERS: u32 = 11;
}

/// Option reply types.
pub mod rep {
    /// The option succeeded (or a list ended).
    pub const ACK: u32 = 1;
    /// One export of a list.
    pub const SERVER: u32 = 2;
    /// One piece of export information.
    pub const INFO: u32 = 3;
    /// One metadata context.
    pub const META_CONTEXT: u32 = 4;
    /// Bit set on every error reply.
    pub const ERROR_BIT: u32 = 1 << 31;
    /// Unknown option.
    pub const ERR_UNSUP: u32 = ERROR_BIT | 1;
    /// Forbidden by policy.
    pub const ERR_POLICY: u32 = ERROR_BIT | 2;
    /// Syntactically invalid.
    pub const ERR_INVALID: u32 = ERROR_BIT | 3;
    /// Not on this platform.
    pub const ERR_PLATFORM: u32 = ERROR_BIT | 4;
    /// TLS required.
    pub const ERR_TLS_REQD: u32 = ERROR_BIT | 5;
    /// No such export.
    pub const ERR_UNKNOWN: u32 = ERROR_BIT | 6;
    /// The server is shutting down.
    pub const ERR_SHUTDOWN: u32 = ERROR_BIT | 7;
    /// Block size negotiation required.
    pub const ERR_BLOCK_SIZE_REQD: u32 = ERROR_BIT | 8;
    /// The option payload is too big.
    pub const ERR_TOO_BIG: u32 = ERROR_BIT | 9;
}

/// Information types in `NBD_REP_INFO`.
pub mod info {
    /// Size and transmission flags.
    pub const EXPORT: u16 = 0;
    /// Canonical name.
    pub const NAME: u16 = 1;
    /// Human-readable description.
    pub const DESCRIPTION: u16 = 2;
    /// Block size constraints.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Transmission flags.
pub mod tflags {
    /// Always set.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// The export refuses writes.
    pub const READ_ONLY: u16 = 1 << 1;
    /// FLUSH is supported.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// The FUA flag is supported.
    pub const SEND_FUA: u16 = 1 << 3;
    /// The medium is rotational.
    pub const ROTATIONAL: u16 = 1 << 4;
    /// TRIM is supported.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// WRITE_ZEROES is supported.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// The DF flag on READ is supported.
    pub const SEND_DF: u16 = 1 << 7;
    /// Flush and FUA cover every connection to the export.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    /// RESIZE is supported.
    pub const SEND_RESIZE: u16 = 1 << 9;
    /// CACHE is supported.
    pub const SEND_CACHE: u16 = 1 << 10;
    /// The FAST_ZERO flag is supported.
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Command flags.
pub mod cmd_flags {
    /// Force unit access.
    pub const FUA: u16 = 1 << 0;
    /// WRITE_ZEROES must keep the range allocated.
    pub const NO_HOLE: u16 = 1 << 1;
    /// READ must answer with at most one content chunk.
    pub const DF: u16 = 1 << 2;
    /// BLOCK_STATUS wants one extent only.
    pub const REQ_ONE: u16 = 1 << 3;
    /// WRITE_ZEROES must fail rather than be slow.
    pub const FAST_ZERO: u16 = 1 << 4;
}

/// Command types.
pub mod cmd {
    /// Read.
    pub const READ: u16 = 0;
    /// Write (payload follows the header).
    pub const WRITE: u16 = 1;
    /// Disconnect.
    pub const DISC: u16 = 2;
    /// Flush.
    pub const FLUSH: u16 = 3;
    /// Trim (discard).
    pub const TRIM: u16 = 4;
    /// Prefetch.
    pub const CACHE: u16 = 5;
    /// Write zeroes.
    pub const WRITE_ZEROES: u16 = 6;
    /// Allocation query.
    pub const BLOCK_STATUS: u16 = 7;
}

/// Structured reply chunk types.
pub mod chunk {
    /// Empty final chunk.
    pub const NONE: u16 = 0;
    /// Data at an offset.
    pub const OFFSET_DATA: u16 = 1;
    /// A hole at an offset.
    pub const OFFSET_HOLE: u16 = 2;
    /// Block status descriptors for one context.
    pub const BLOCK_STATUS: u16 = 5;
    /// An error.
    pub const ERROR: u16 = (1 << 15) | 1;
    /// An error at an offset.
    pub const ERROR_OFFSET: u16 = (1 << 15) | 2;
    /// The last chunk of a reply.
    pub const FLAG_DONE: u16 = 1 << 0;
}

/// Error values in replies.
pub mod errno {
    /// Operation not permitted.
    pub const EPERM: u32 = 1;
    /// Input/output error.
    pub const EIO: u32 = 5;
    /// Out of memory.
    pub const ENOMEM: u32 = 12;
    /// Invalid argument.
    pub const EINVAL: u32 = 22;
    /// No space left.
    pub const ENOSPC: u32 = 28;
    /// Value too large.
    pub const EOVERFLOW: u32 = 75;
    /// Operation not supported (FAST_ZERO refusal).
    pub const ENOTSUP: u32 = 95;
    /// Server shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

/// `base:allocation` status flags.
pub mod state {
    /// The extent is not allocated.
    pub const HOLE: u32 = 1 << 0;
    /// The extent reads as zeros.
    pub const ZERO: u32 = 1 << 1;
}

/// The one metadata context this server knows.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The id the server gives `base:allocation` in SET_META_CONTEXT replies.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// A violation of the wire format that ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtoError {
    /// A magic number did not match.
    #[error("bad {what} magic {found:#x}")]
    BadMagic {
        /// Which message.
        what: &'static str,
        /// The value received.
        found: u64,
    },
    /// The client set flags the server does not know.
    #[error("unknown client flags {0:#x}")]
    UnknownClientFlags(u32),
    /// An option payload is longer than [`MAX_OPTION_DATA_BYTES`].
    #[error("option {option} carries {len} bytes, more than the {limit}-byte limit")]
    OptionTooLong {
        /// The option number.
        option: u32,
        /// Its announced length.
        len: u32,
        /// The limit.
        limit: u32,
    },
    /// A WRITE payload is longer than [`MAX_PAYLOAD_BYTES`].
    #[error("write of {len} bytes exceeds the {limit}-byte payload limit")]
    PayloadTooLong {
        /// The announced length.
        len: u32,
        /// The limit.
        limit: u32,
    },
}

/// The greeting the server sends first.
pub fn greeting() -> [u8; GREETING_BYTES] {
    let mut out = [0u8; GREETING_BYTES];
    out[..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    let flags = handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES;
    out[16..18].copy_from_slice(&flags.to_be_bytes());
    out
}

/// Client flags after decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientFlags {
    /// The client speaks fixed newstyle.
    pub fixed_newstyle: bool,
    /// The client does not want the 124 zero bytes.
    pub no_zeroes: bool,
}

/// Decodes the client's answer to the greeting; unknown bits end the session.
pub fn decode_client_flags(buf: &[u8; CLIENT_FLAGS_BYTES]) -> Result<ClientFlags, ProtoError> {
    let raw = u32::from_be_bytes(*buf);
    let known = client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES;
    if raw & !known != 0 {
        return Err(ProtoError::UnknownClientFlags(raw));
    }
    Ok(ClientFlags {
        fixed_newstyle: raw & client_flags::FIXED_NEWSTYLE != 0,
        no_zeroes: raw & client_flags::NO_ZEROES != 0,
    })
}

/// An option header: which option and how many payload bytes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// The option number.
    pub option: u32,
    /// Payload length, at most [`MAX_OPTION_DATA_BYTES`].
    pub len: u32,
}

/// Decodes an option header, refusing bad magic and oversized payloads.
pub fn decode_option_header(buf: &[u8; OPTION_HEADER_BYTES]) -> Result<OptionHeader, ProtoError> {
    let magic = u64::from_be_bytes(take::<8>(buf, 0));
    if magic != IHAVEOPT {
        return Err(ProtoError::BadMagic {
            what: "option",
            found: magic,
        });
    }
    let option = u32::from_be_bytes(take::<4>(buf, 8));
    let len = u32::from_be_bytes(take::<4>(buf, 12));
    if len > MAX_OPTION_DATA_BYTES {
        return Err(ProtoError::OptionTooLong {
            option,
            len,
            limit: MAX_OPTION_DATA_BYTES,
        });
    }
    Ok(OptionHeader { option, len })
}

/// Encodes an option header (used by tests and the fuzz corpus builder).
pub fn encode_option(out: &mut BytesMut, option: u32, data: &[u8]) {
    out.put_u64(IHAVEOPT);
    out.put_u32(option);
    out.put_u32(data.len() as u32);
    out.put_slice(data);
}

/// Copies `N` bytes at `at` out of a slice known to be long enough.
fn take<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[at..at + N]);
    out
}

/// Why an option payload could not be decoded; answered with
/// `NBD_REP_ERR_INVALID` and the message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct OptionSyntaxError(pub String);

/// What the client asked for in `NBD_OPT_INFO` or `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name ("" asks for the default export).
    pub name: String,
    /// Information types requested.
    pub requests: Vec<u16>,
}

/// The payload of `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    /// Export the contexts are for.
    pub export: String,
    /// Queries; empty means "all" for LIST.
    pub queries: Vec<String>,
}

/// A decoded client option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    /// `NBD_OPT_EXPORT_NAME`.
    ExportName(String),
    /// `NBD_OPT_ABORT`.
    Abort,
    /// `NBD_OPT_LIST`.
    List,
    /// `NBD_OPT_INFO`.
    Info(InfoRequest),
    /// `NBD_OPT_GO`.
    Go(InfoRequest),
    /// `NBD_OPT_STRUCTURED_REPLY`.
    StructuredReply,
    /// `NBD_OPT_STARTTLS`.
    StartTls,
    /// `NBD_OPT_LIST_META_CONTEXT`.
    ListMetaContext(MetaContextRequest),
    /// `NBD_OPT_SET_META_CONTEXT`.
    SetMetaContext(MetaContextRequest),
    /// Any option this server does not implement.
    Unsupported(u32),
}

/// A cursor over an option payload that turns every short read into a
/// syntax error instead of a panic.
struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(data: &'a [u8]) -> Self {
        Cursor { data, at: 0 }
    }

    fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], OptionSyntaxError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len());
        match end {
            Some(end) => {
                let out = &self.data[self.at..end];
                self.at = end;
                Ok(out)
            }
            None => Err(OptionSyntaxError(format!(
                "option payload too short for {what}"
            ))),
        }
    }

    fn u16(&mut self, what: &str) -> Result<u16, OptionSyntaxError> {
        Ok(u16::from_be_bytes(take::<2>(self.bytes(2, what)?, 0)))
    }

    fn u32(&mut self, what: &str) -> Result<u32, OptionSyntaxError> {
        Ok(u32::from_be_bytes(take::<4>(self.bytes(4, what)?, 0)))
    }

    fn string(&mut self, len: u32, what: &str) -> Result<String, OptionSyntaxError> {
        if len as usize > MAX_STRING_BYTES {
            return Err(OptionSyntaxError(format!(
                "{what} of {len} bytes is longer than {MAX_STRING_BYTES}"
            )));
        }
        let raw = self.bytes(len as usize, what)?;
        let text = std::str::from_utf8(raw)
            .map_err(|_| OptionSyntaxError(format!("{what} is not UTF-8")))?;
        if text.contains('\0') {
            return Err(OptionSyntaxError(format!("{what} contains NUL")));
        }
        Ok(text.to_owned())
    }

    fn finish(&self, what: &str) -> Result<(), OptionSyntaxError> {
        if self.at == self.data.len() {
            Ok(())
        } else {
            Err(OptionSyntaxError(format!(
                "{} trailing bytes after {what}",
                self.data.len() - self.at
            )))
        }
    }
}

/// Decodes an option payload.
pub fn decode_option(option: u32, data: &[u8]) -> Result<ClientOption, OptionSyntaxError> {
    let mut cur = Cursor::new(data);
    let decoded = match option {
        opt::EXPORT_NAME => {
            let name = cur.string(data.len() as u32, "export name")?;
            ClientOption::ExportName(name)
        }
        opt::ABORT => ClientOption::Abort,
        opt::LIST => ClientOption::List,
        opt::STRUCTURED_REPLY => ClientOption::StructuredReply,
        opt::STARTTLS => ClientOption::StartTls,
        opt::INFO | opt::GO => {
            let name_len = cur.u32("export name length")?;
            let name = cur.string(name_len, "export name")?;
            let count = cur.u16("information request count")?;
            if count > MAX_INFO_REQUESTS {
                return Err(OptionSyntaxError(format!(
                    "{count} information requests, more than {MAX_INFO_REQUESTS}"
                )));
            }
            let mut requests = Vec::with_capacity(count as usize);
            for _ in 0..count {
                requests.push(cur.u16("information request")?);
            }
            let request = InfoRequest { name, requests };
            if option == opt::INFO {
                ClientOption::Info(request)
            } else {
                ClientOption::Go(request)
            }
        }
        opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
            let name_len = cur.u32("export name length")?;
            let export = cur.string(name_len, "export name")?;
            let count = cur.u32("query count")?;
            if count > MAX_META_QUERIES {
                return Err(OptionSyntaxError(format!(
                    "{count} meta context queries, more than {MAX_META_QUERIES}"
                )));
            }
            let mut queries = Vec::with_capacity(count as usize);
            for _ in 0..count {
                let len = cur.u32("query length")?;
                queries.push(cur.string(len, "query")?);
            }
            let request = MetaContextRequest { export, queries };
            if option == opt::LIST_META_CONTEXT {
                ClientOption::ListMetaContext(request)
            } else {
                ClientOption::SetMetaContext(request)
            }
        }
        other => return Ok(ClientOption::Unsupported(other)),
    };
    match decoded {
        ClientOption::Abort
        | ClientOption::List
        | ClientOption::StructuredReply
        | ClientOption::StartTls => cur.finish("an option that takes no data")?,
        ClientOption::ExportName(_) | ClientOption::Unsupported(_) => {}
        _ => cur.finish("the option fields")?,
    }
    Ok(decoded)
}

/// Appends an option reply.
pub fn encode_option_reply(out: &mut BytesMut, option: u32, reply: u32, data: &[u8]) {
    out.reserve(20 + data.len());
    out.put_u64(OPTION_REPLY_MAGIC);
    out.put_u32(option);
    out.put_u32(reply);
    out.put_u32(data.len() as u32);
    out.put_slice(data);
}

/// A request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// Command flags.
    pub flags: u16,
    /// Command type.
    pub command: u16,
    /// The client's handle, echoed in the reply.
    pub cookie: u64,
    /// First byte.
    pub offset: u64,
    /// Length in bytes.
    pub len: u32,
}

impl RequestHeader {
    /// Payload bytes that follow this header on the wire.
    pub fn payload_bytes(&self) -> u32 {
        if self.command == cmd::WRITE {
            self.len
        } else {
            0
        }
    }
}

/// Decodes a request header; bad magic ends the connection.
pub fn decode_request_header(
    buf: &[u8; REQUEST_HEADER_BYTES],
) -> Result<RequestHeader, ProtoError> {
    let magic = u32::from_be_bytes(take::<4>(buf, 0));
    if magic != REQUEST_MAGIC {
        return Err(ProtoError::BadMagic {
            what: "request",
            found: magic as u64,
        });
    }
    Ok(RequestHeader {
        flags: u16::from_be_bytes(take::<2>(buf, 4)),
        command: u16::from_be_bytes(take::<2>(buf, 6)),
        cookie: u64::from_be_bytes(take::<8>(buf, 8)),
        offset: u64::from_be_bytes(take::<8>(buf, 16)),
        len: u32::from_be_bytes(take::<4>(buf, 24)),
    })
}

/// Encodes a request header (clients, tests and the fuzz corpus).
pub fn encode_request_header(out: &mut BytesMut, h: &RequestHeader) {
    out.put_u32(REQUEST_MAGIC);
    out.put_u16(h.flags);
    out.put_u16(h.command);
    out.put_u64(h.cookie);
    out.put_u64(h.offset);
    out.put_u32(h.len);
}

/// Appends a simple reply header.
pub fn encode_simple_reply(out: &mut BytesMut, cookie: u64, error: u32) {
    out.put_u32(SIMPLE_REPLY_MAGIC);
    out.put_u32(error);
    out.put_u64(cookie);
}

/// Appends a structured reply chunk header.
pub fn encode_chunk_header(out: &mut BytesMut, flags: u16, kind: u16, cookie: u64, len: u32) {
    out.put_u32(STRUCTURED_REPLY_MAGIC);
    out.put_u16(flags);
    out.put_u16(kind);
    out.put_u64(cookie);
    out.put_u32(len);
}

/// Appends a final `NBD_REPLY_TYPE_NONE` chunk.
pub fn encode_done_chunk(out: &mut BytesMut, cookie: u64) {
    encode_chunk_header(out, chunk::FLAG_DONE, chunk::NONE, cookie, 0);
}

/// Appends the header of a final `OFFSET_DATA` chunk for `data_len` bytes at
/// `offset`; the caller sends the data right after it.
pub fn encode_data_chunk_header(out: &mut BytesMut, cookie: u64, offset: u64, data_len: u32) {
    encode_chunk_header(
        out,
        chunk::FLAG_DONE,
        chunk::OFFSET_DATA,
        cookie,
        data_len + 8,
    );
    out.put_u64(offset);
}

/// Appends a final error chunk; `offset` (inside the request) selects
/// `ERROR_OFFSET`. The message is cut at a character boundary to fit
/// [`MAX_ERROR_MESSAGE_BYTES`].
pub fn encode_error_chunk(
    out: &mut BytesMut,
    cookie: u64,
    error: u32,
    message: &str,
    offset: Option<u64>,
) {
    let mut cut = message.len().min(MAX_ERROR_MESSAGE_BYTES);
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let message = &message[..cut];
    let (kind, extra) = match offset {
        Some(_) => (chunk::ERROR_OFFSET, 8),
        None => (chunk::ERROR, 0),
    };
    let len = 6 + message.len() as u32 + extra;
    encode_chunk_header(out, chunk::FLAG_DONE, kind, cookie, len);
    out.put_u32(error);
    out.put_u16(message.len() as u16);
    out.put_slice(message.as_bytes());
    if let Some(offset) = offset {
        out.put_u64(offset);
    }
}

/// Appends a final `BLOCK_STATUS` chunk: `(length, flags)` descriptors for
/// one context. `descriptors` must not be empty.
pub fn encode_block_status_chunk(
    out: &mut BytesMut,
    cookie: u64,
    context_id: u32,
    descriptors: &[(u32, u32)],
) {
    let len = 4 + 8 * descriptors.len() as u32;
    encode_chunk_header(out, chunk::FLAG_DONE, chunk::BLOCK_STATUS, cookie, len);
    out.put_u32(context_id);
    for &(length, flags) in descriptors {
        out.put_u32(length);
        out.put_u32(flags);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn greeting_is_magic_then_fixed_newstyle() {
        let g = greeting();
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(u16::from_be_bytes([g[16], g[17]]), 3);
    }

    #[test]
    fn oversized_option_is_refused_before_buffering() {
        let mut buf = BytesMut::new();
        buf.put_u64(IHAVEOPT);
        buf.put_u32(opt::GO);
        buf.put_u32(u32::MAX);
        let header: [u8; 16] = buf[..].try_into().unwrap();
        assert!(matches!(
            decode_option_header(&header),
            Err(ProtoError::OptionTooLong { .. })
        ));
    }

    #[test]
    fn go_payload_round_trips() {
        let mut data = BytesMut::new();
        data.put_u32(3);
        data.put_slice(b"vol");
        data.put_u16(2);
        data.put_u16(info::NAME);
        data.put_u16(info::BLOCK_SIZE);
        assert_eq!(
            decode_option(opt::GO, &data).unwrap(),
            ClientOption::Go(InfoRequest {
                name: "vol".into(),
                requests: vec![info::NAME, info::BLOCK_SIZE]
            })
        );
        // One byte short: a syntax error, not a panic.
        assert!(decode_option(opt::GO, &data[..data.len() - 1]).is_err());
    }

    #[test]
    fn error_chunk_message_is_cut_on_a_char_boundary() {
        let mut out = BytesMut::new();
        let message = "é".repeat(MAX_ERROR_MESSAGE_BYTES);
        encode_error_chunk(&mut out, 7, errno::EIO, &message, Some(4096));
        let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        assert_eq!(out.len(), CHUNK_HEADER_BYTES + len);
        let msg_len = u16::from_be_bytes(out[24..26].try_into().unwrap()) as usize;
        assert!(msg_len <= MAX_ERROR_MESSAGE_BYTES);
        assert!(std::str::from_utf8(&out[26..26 + msg_len]).is_ok());
    }

    proptest! {
        #[test]
        fn request_header_round_trips(flags: u16, command: u16, cookie: u64, offset: u64, len: u32) {
            let h = RequestHeader { flags, command, cookie, offset, len };
            let mut out = BytesMut::new();
            encode_request_header(&mut out, &h);
            let buf: [u8; REQUEST_HEADER_BYTES] = out[..].try_into().unwrap();
            prop_assert_eq!(decode_request_header(&buf).unwrap(), h);
        }

        #[test]
        fn option_decoding_never_panics(option in 0u32..16, data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_option(option, &data);
        }

        #[test]
        fn meta_context_payload_round_trips(export in "[a-z]{0,12}", queries in proptest::collection::vec("[a-z:]{0,20}", 0..5)) {
            let mut data = BytesMut::new();
            data.put_u32(export.len() as u32);
            data.put_slice(export.as_bytes());
            data.put_u32(queries.len() as u32);
            for q in &queries {
                data.put_u32(q.len() as u32);
                data.put_slice(q.as_bytes());
            }
            let decoded = decode_option(opt::SET_META_CONTEXT, &data).unwrap();
            prop_assert_eq!(decoded, ClientOption::SetMetaContext(MetaContextRequest { export, queries }));
        }
    }
}
