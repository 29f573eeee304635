//! Entry points shared by the cargo-fuzz targets in `fuzz/` and the stable
//! test that replays their corpus: raw client bytes in, the same decoders
//! and state machines the server runs, invariants asserted.
//!
//! Owns: nothing but the drivers. Must not touch: sockets or tasks.
//! Invariant: for any input these functions return; a panic here is a bug in
//! the protocol code (or a broken invariant, asserted below).

use crate::catalog::{NbdClient, StaticCatalog};
use crate::negotiate::{Negotiation, Step, TlsOffer};
use crate::proto::{
    decode_client_flags, decode_option_header, decode_request_header, CLIENT_FLAGS_BYTES,
    MAX_PAYLOAD_BYTES, OPTION_HEADER_BYTES, REQUEST_HEADER_BYTES,
};
use crate::request::{classify, Command, ExportView};
use bytes::BytesMut;
use std::sync::Arc;
use tessera_blockdev::MemoryDevice;

/// Size of the export the drivers serve, in bytes.
pub const FUZZ_EXPORT_BYTES: u64 = 1 << 20;

/// Feeds `data` to the handshake as a client would send it: client flags,
/// then options. Once an export is chosen the rest goes to [`requests_with`].
pub fn handshake(data: &[u8]) {
    let catalog = StaticCatalog::single(
        "fuzz",
        Arc::new(MemoryDevice::new("fuzz", FUZZ_EXPORT_BYTES)),
    );
    let Some((flags, mut rest)) = data.split_first_chunk::<CLIENT_FLAGS_BYTES>() else {
        return;
    };
    let Ok(flags) = decode_client_flags(flags) else {
        return;
    };
    // Every TLS stance of a server, picked by the input; a STARTTLS is
    // taken as a finished handshake, so the options after it run as they
    // would over TLS.
    let offer = [TlsOffer::Off, TlsOffer::Offered, TlsOffer::Required][data.len() % 3];
    let mut negotiation = Negotiation::new(flags).with_peer(NbdClient::default(), offer);
    let mut out = BytesMut::new();
    loop {
        let Some((header, after)) = rest.split_first_chunk::<OPTION_HEADER_BYTES>() else {
            return;
        };
        let Ok(header) = decode_option_header(header) else {
            return;
        };
        let Some((payload, after)) = after.split_at_checked(header.len as usize) else {
            return;
        };
        rest = after;
        out.clear();
        match negotiation.handle(&catalog, header, payload, &mut out) {
            Step::Continue => check_option_replies(&out),
            Step::Close => return,
            Step::StartTls => {
                check_option_replies(&out);
                negotiation.tls_started(None);
            }
            Step::Transmit(session) => {
                assert_eq!(session.info.size_bytes, FUZZ_EXPORT_BYTES);
                if session.allocation_context.is_some() {
                    assert!(
                        session.structured,
                        "base:allocation without structured replies"
                    );
                }
                let view = ExportView {
                    size: session.info.size_bytes,
                    read_only: session.info.read_only,
                    structured: session.structured,
                    allocation_context: session.allocation_context,
                };
                requests_with(rest, &view);
                return;
            }
        }
    }
}

/// Every option reply is well framed: magic, and a length that matches.
fn check_option_replies(out: &[u8]) {
    let mut at = 0;
    while at < out.len() {
        assert!(out.len() - at >= 20, "truncated option reply");
        let len = u32::from_be_bytes([out[at + 16], out[at + 17], out[at + 18], out[at + 19]]);
        at += 20 + len as usize;
    }
    assert_eq!(at, out.len(), "option reply length mismatch");
}

/// Feeds `data` to the request parser: the first byte picks the session
/// (read-only, structured, base:allocation), the rest is request headers
/// each followed by its WRITE payload.
pub fn requests(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let structured = mode & 2 != 0;
    let view = ExportView {
        size: FUZZ_EXPORT_BYTES,
        read_only: mode & 1 != 0,
        structured,
        allocation_context: (structured && mode & 4 != 0).then_some(1),
    };
    requests_with(rest, &view);
}

/// The request loop of [`requests`] on a given session.
pub fn requests_with(mut data: &[u8], view: &ExportView) {
    while let Some((raw, rest)) = data.split_first_chunk::<REQUEST_HEADER_BYTES>() {
        let Ok(header) = decode_request_header(raw) else {
            return;
        };
        if header.payload_bytes() > MAX_PAYLOAD_BYTES {
            return;
        }
        let Some((_payload, rest)) = rest.split_at_checked(header.payload_bytes() as usize) else {
            return;
        };
        data = rest;
        match classify(&header, view) {
            Ok(Command::Disconnect) => return,
            Ok(command) => check_accepted(&command, view),
            Err(rejection) => assert_ne!(rejection.errno, 0),
        }
    }
}

fn check_accepted(command: &Command, view: &ExportView) {
    let range = match *command {
        Command::Read { offset, len } | Command::Cache { offset, len } => Some((offset, len)),
        Command::Write { offset, len, .. }
        | Command::Trim { offset, len, .. }
        | Command::WriteZeroes { offset, len, .. } => {
            assert!(!view.read_only, "write accepted on a read-only export");
            Some((offset, len))
        }
        Command::BlockStatus { offset, len, .. } => {
            assert!(view.allocation_context.is_some());
            Some((offset, len))
        }
        Command::Flush | Command::Disconnect => None,
    };
    if let Some((offset, len)) = range {
        assert!(
            offset + len as u64 <= view.size,
            "accepted a request past the end"
        );
    }
}
