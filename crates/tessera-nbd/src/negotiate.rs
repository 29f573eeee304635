//! Option haggling: the handshake as a state machine.
//!
//! Owns: what the server answers to each option, which features a session
//! negotiated (structured replies, `base:allocation`), and when haggling
//! ends (GO, EXPORT_NAME, ABORT).
//! Must not touch: sockets or devices' data; it reads only a device's
//! [`DeviceInfo`] and the catalog. Callers feed it one decoded option header
//! and payload at a time and write out what it appends.
//! Invariants: every option gets exactly one final reply (or the session
//! ends, for EXPORT_NAME of an unknown export); unknown options are answered
//! with `NBD_REP_ERR_UNSUP` and haggling continues; a bounded number of
//! options is accepted per session; where TLS is required, nothing but
//! STARTTLS and ABORT is answered before the upgrade; an export the catalog
//! does not admit the client to is neither listed nor opened
//! (`NBD_REP_ERR_POLICY`).

use crate::catalog::{resolve, ExportCatalog, NbdClient};
use crate::proto::{
    self, decode_option, encode_option_reply, info, opt, rep, tflags, ClientFlags, ClientOption,
    InfoRequest, MetaContextRequest, OptionHeader, BASE_ALLOCATION, BASE_ALLOCATION_ID,
    MAX_PAYLOAD_BYTES, MIN_BLOCK_BYTES,
};
use bytes::{BufMut, BytesMut};
use std::sync::Arc;
use tessera_blockdev::{BlockDevice, DeviceInfo};

/// Most options one session may send before the server gives up on it; far
/// above what any client sends (libnbd sends fewer than ten).
pub const MAX_OPTIONS_PER_SESSION: u32 = 1024;

/// What the server owes a session after haggling: the export and what was
/// negotiated.
pub struct Session {
    /// Canonical export name.
    pub export: String,
    /// The device behind it.
    pub device: Arc<dyn BlockDevice>,
    /// Its geometry as advertised.
    pub info: DeviceInfo,
    /// Transmission flags sent to the client.
    pub flags: u16,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// The context id for `base:allocation`, when the client selected it.
    pub allocation_context: Option<u32>,
}

/// What the caller does after writing out the replies to one option.
pub enum Step {
    /// Read the next option.
    Continue,
    /// Close the connection.
    Close,
    /// Enter transmission.
    Transmit(Box<Session>),
    /// Run the TLS handshake (the ACK is in the output), then call
    /// [`Negotiation::tls_started`] and read the next option over TLS.
    StartTls,
}

/// Whether a server offers TLS (`NBD_OPT_STARTTLS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsOffer {
    /// Not configured: STARTTLS is refused with `NBD_REP_ERR_POLICY`.
    Off,
    /// Clients may upgrade.
    Offered,
    /// Clients must upgrade before anything else (`NBD_REP_ERR_TLS_REQD`).
    Required,
}

/// The handshake state of one connection.
pub struct Negotiation {
    client: ClientFlags,
    structured: bool,
    /// Export named by the last SET_META_CONTEXT and whether it selected
    /// `base:allocation`.
    meta: Option<(String, bool)>,
    options_seen: u32,
    shutting_down: bool,
    peer: NbdClient,
    tls: TlsOffer,
}

/// The transmission flags advertised for a device.
pub fn transmission_flags(info: &DeviceInfo, structured: bool) -> u16 {
    let mut flags = tflags::HAS_FLAGS
        | tflags::SEND_FLUSH
        | tflags::SEND_FUA
        | tflags::CAN_MULTI_CONN
        | tflags::SEND_CACHE;
    if info.read_only {
        flags |= tflags::READ_ONLY;
    } else {
        flags |= tflags::SEND_TRIM | tflags::SEND_WRITE_ZEROES | tflags::SEND_FAST_ZERO;
    }
    if structured {
        flags |= tflags::SEND_DF;
    }
    flags
}

/// Block size constraints `(minimum, preferred, maximum)` for a device: powers
/// of two with minimum <= preferred <= maximum.
pub fn block_sizes(info: &DeviceInfo) -> (u32, u32, u32) {
    let pow2 = |v: u32, fallback: u32| {
        if v.is_power_of_two() {
            v
        } else {
            fallback
        }
    };
    let min = pow2(info.logical_block_bytes, MIN_BLOCK_BYTES).clamp(1, 64 * 1024);
    let preferred = pow2(
        info.preferred_block_bytes,
        proto::DEFAULT_PREFERRED_BLOCK_BYTES,
    )
    .clamp(min.max(512), MAX_PAYLOAD_BYTES);
    (min, preferred, MAX_PAYLOAD_BYTES)
}

impl Negotiation {
    /// A fresh handshake after the client flags were read.
    pub fn new(client: ClientFlags) -> Self {
        Negotiation {
            client,
            structured: false,
            meta: None,
            options_seen: 0,
            shutting_down: false,
            peer: NbdClient::default(),
            tls: TlsOffer::Off,
        }
    }

    /// The same handshake for `peer`, on a server whose TLS is `tls`.
    pub fn with_peer(mut self, peer: NbdClient, tls: TlsOffer) -> Self {
        self.peer = peer;
        self.tls = tls;
        self
    }

    /// The TLS handshake after STARTTLS finished; the client proved
    /// `certificate` (a name), if it presented one. What was negotiated in
    /// plain text is forgotten, as the protocol asks.
    pub fn tls_started(&mut self, certificate: Option<String>) {
        self.peer.tls = true;
        self.peer.certificate = certificate;
        self.structured = false;
        self.meta = None;
    }

    /// Who the client is, as far as the handshake knows.
    pub fn peer(&self) -> &NbdClient {
        &self.peer
    }

    /// From now on, options other than ABORT are answered with
    /// `NBD_REP_ERR_SHUTDOWN`.
    pub fn shut_down(&mut self) {
        self.shutting_down = true;
    }

    /// Handles one option; appends the replies to `out`.
    pub fn handle(
        &mut self,
        catalog: &dyn ExportCatalog,
        header: OptionHeader,
        data: &[u8],
        out: &mut BytesMut,
    ) -> Step {
        self.options_seen += 1;
        let option = header.option;
        if self.options_seen > MAX_OPTIONS_PER_SESSION {
            tracing::warn!(
                "closing a handshake after {MAX_OPTIONS_PER_SESSION} options without a choice"
            );
            return Step::Close;
        }
        let decoded = match decode_option(option, data) {
            Ok(decoded) => decoded,
            Err(e) => {
                if option == opt::EXPORT_NAME {
                    return Step::Close;
                }
                error_reply(out, option, rep::ERR_INVALID, &e.to_string());
                return Step::Continue;
            }
        };
        if self.shutting_down && !matches!(decoded, ClientOption::Abort) {
            if option == opt::EXPORT_NAME {
                return Step::Close;
            }
            error_reply(
                out,
                option,
                rep::ERR_SHUTDOWN,
                "the server is shutting down",
            );
            return Step::Continue;
        }
        let before_tls = self.tls == TlsOffer::Required && !self.peer.tls;
        if before_tls && !matches!(decoded, ClientOption::Abort | ClientOption::StartTls) {
            if option == opt::EXPORT_NAME {
                return Step::Close;
            }
            error_reply(
                out,
                option,
                rep::ERR_TLS_REQD,
                "this server requires TLS: upgrade with NBD_OPT_STARTTLS first",
            );
            return Step::Continue;
        }
        match decoded {
            ClientOption::StartTls => {
                if self.peer.tls {
                    error_reply(out, option, rep::ERR_INVALID, "TLS is already in use");
                } else if self.tls == TlsOffer::Off {
                    error_reply(
                        out,
                        option,
                        rep::ERR_POLICY,
                        "this server has no TLS certificate configured",
                    );
                } else {
                    encode_option_reply(out, option, rep::ACK, &[]);
                    return Step::StartTls;
                }
                Step::Continue
            }
            ClientOption::Abort => {
                encode_option_reply(out, option, rep::ACK, &[]);
                Step::Close
            }
            ClientOption::List => {
                for name in catalog.list() {
                    if catalog.admits(&name, &self.peer).is_err() {
                        continue;
                    }
                    let mut data = BytesMut::new();
                    data.put_u32(name.len() as u32);
                    data.put_slice(name.as_bytes());
                    if let Some(desc) = catalog.description(&name) {
                        data.put_slice(desc.as_bytes());
                    }
                    encode_option_reply(out, option, rep::SERVER, &data);
                }
                encode_option_reply(out, option, rep::ACK, &[]);
                Step::Continue
            }
            ClientOption::StructuredReply => {
                self.structured = true;
                encode_option_reply(out, option, rep::ACK, &[]);
                Step::Continue
            }
            ClientOption::ListMetaContext(req) => {
                self.meta_context(catalog, option, &req, false, out);
                Step::Continue
            }
            ClientOption::SetMetaContext(req) => {
                self.meta_context(catalog, option, &req, true, out);
                Step::Continue
            }
            ClientOption::Info(req) => {
                self.info(catalog, option, &req, out);
                Step::Continue
            }
            ClientOption::Go(req) => match self.info(catalog, option, &req, out) {
                Some((name, device, info)) => {
                    let session = self.session(name, device, info);
                    encode_option_reply(out, option, rep::ACK, &[]);
                    Step::Transmit(Box::new(session))
                }
                None => Step::Continue,
            },
            ClientOption::ExportName(name) => match self.resolve(catalog, &name) {
                Ok((name, device)) => {
                    let info = device.info();
                    let session = self.session(name, device, info);
                    out.put_u64(session.info.size_bytes);
                    out.put_u16(session.flags);
                    if !self.client.no_zeroes {
                        out.put_bytes(0, 124);
                    }
                    Step::Transmit(Box::new(session))
                }
                Err(_) => Step::Close,
            },
            ClientOption::Unsupported(other) => {
                error_reply(
                    out,
                    option,
                    rep::ERR_UNSUP,
                    &format!("option {other} is not supported"),
                );
                Step::Continue
            }
        }
    }

    /// The export `name` names, if it exists and admits this client; else
    /// the error reply and its message.
    fn resolve(
        &self,
        catalog: &dyn ExportCatalog,
        name: &str,
    ) -> Result<(String, Arc<dyn BlockDevice>), (u32, String)> {
        let admits = |export: &str| {
            catalog
                .admits(export, &self.peer)
                .map_err(|reason| (rep::ERR_POLICY, reason))
        };
        // Admission comes before opening: a client that may not use the
        // export does not make the host open it.
        if !name.is_empty() {
            admits(name)?;
        }
        let Some((export, device)) = resolve(catalog, name) else {
            return Err((rep::ERR_UNKNOWN, unknown(catalog, name)));
        };
        if name.is_empty() {
            admits(&export)?;
        }
        Ok((export, device))
    }

    fn session(&self, export: String, device: Arc<dyn BlockDevice>, info: DeviceInfo) -> Session {
        let allocation_context = match &self.meta {
            Some((meta_export, true)) if self.structured && meta_export == &export => {
                Some(BASE_ALLOCATION_ID)
            }
            _ => None,
        };
        Session {
            flags: transmission_flags(&info, self.structured),
            export,
            device,
            info,
            structured: self.structured,
            allocation_context,
        }
    }

    /// Answers INFO or GO with the export's information; returns the export
    /// when it exists (the caller then sends the final ACK for GO).
    fn info(
        &mut self,
        catalog: &dyn ExportCatalog,
        option: u32,
        req: &InfoRequest,
        out: &mut BytesMut,
    ) -> Option<(String, Arc<dyn BlockDevice>, DeviceInfo)> {
        let (name, device) = match self.resolve(catalog, &req.name) {
            Ok(found) => found,
            Err((kind, message)) => {
                error_reply(out, option, kind, &message);
                return None;
            }
        };
        let info = device.info();
        let mut data = BytesMut::new();
        data.put_u16(info::EXPORT);
        data.put_u64(info.size_bytes);
        data.put_u16(transmission_flags(&info, self.structured));
        encode_option_reply(out, option, rep::INFO, &data);
        // Block sizes go out whether asked or not: the client learns the
        // payload limit either way, and libnbd always asks.
        let (min, preferred, max) = block_sizes(&info);
        let mut data = BytesMut::new();
        data.put_u16(info::BLOCK_SIZE);
        data.put_u32(min);
        data.put_u32(preferred);
        data.put_u32(max);
        encode_option_reply(out, option, rep::INFO, &data);
        if req.requests.contains(&info::NAME) {
            let mut data = BytesMut::new();
            data.put_u16(info::NAME);
            data.put_slice(name.as_bytes());
            encode_option_reply(out, option, rep::INFO, &data);
        }
        if req.requests.contains(&info::DESCRIPTION) {
            if let Some(desc) = catalog.description(&name) {
                let mut data = BytesMut::new();
                data.put_u16(info::DESCRIPTION);
                data.put_slice(desc.as_bytes());
                encode_option_reply(out, option, rep::INFO, &data);
            }
        }
        if option == opt::INFO {
            encode_option_reply(out, option, rep::ACK, &[]);
        }
        Some((name, device, info))
    }

    fn meta_context(
        &mut self,
        catalog: &dyn ExportCatalog,
        option: u32,
        req: &MetaContextRequest,
        set: bool,
        out: &mut BytesMut,
    ) {
        if !self.structured {
            error_reply(
                out,
                option,
                rep::ERR_INVALID,
                "metadata contexts need structured replies first",
            );
            return;
        }
        let export = match self.resolve(catalog, &req.export) {
            Ok((export, _)) => export,
            Err((kind, message)) => {
                error_reply(out, option, kind, &message);
                return;
            }
        };
        let selected = if set {
            req.queries.iter().any(|q| q == BASE_ALLOCATION)
        } else {
            req.queries.is_empty()
                || req
                    .queries
                    .iter()
                    .any(|q| q == BASE_ALLOCATION || q == "base:")
        };
        if selected {
            let id = if set { BASE_ALLOCATION_ID } else { 0 };
            let mut data = BytesMut::new();
            data.put_u32(id);
            data.put_slice(BASE_ALLOCATION.as_bytes());
            encode_option_reply(out, option, rep::META_CONTEXT, &data);
        }
        if set {
            self.meta = Some((export, selected));
        }
        encode_option_reply(out, option, rep::ACK, &[]);
    }
}

fn error_reply(out: &mut BytesMut, option: u32, kind: u32, message: &str) {
    encode_option_reply(out, option, kind, message.as_bytes());
}

/// The message of the error reply to an export that cannot be opened: the
/// catalog's reason when it knows the name, else that there is none.
fn unknown(catalog: &dyn ExportCatalog, name: &str) -> String {
    catalog
        .refusal(name)
        .unwrap_or_else(|| format!("no export named {name:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::StaticCatalog;
    use crate::proto::{decode_option_header, encode_option};
    use tessera_blockdev::MemoryDevice;

    fn catalog() -> StaticCatalog {
        StaticCatalog::single("vol", Arc::new(MemoryDevice::new("vol", 1 << 20)))
    }

    fn run(
        n: &mut Negotiation,
        c: &dyn ExportCatalog,
        option: u32,
        data: &[u8],
    ) -> (Step, Vec<u32>) {
        run_with_replies(n, c, option, data).0
    }

    /// [`run`], with the payload of every reply too.
    fn run_with_replies(
        n: &mut Negotiation,
        c: &dyn ExportCatalog,
        option: u32,
        data: &[u8],
    ) -> ((Step, Vec<u32>), Vec<Vec<u8>>) {
        let mut wire = BytesMut::new();
        encode_option(&mut wire, option, data);
        let header = decode_option_header(wire[..16].try_into().unwrap()).unwrap();
        let mut out = BytesMut::new();
        let step = n.handle(c, header, &wire[16..], &mut out);
        let mut payloads = Vec::new();
        let mut at = 0;
        while at < out.len() {
            let len = u32::from_be_bytes(out[at + 16..at + 20].try_into().unwrap()) as usize;
            payloads.push(out[at + 20..at + 20 + len].to_vec());
            at += 20 + len;
        }
        // Collect the reply types.
        let mut kinds = Vec::new();
        let mut at = 0;
        while at < out.len() {
            let kind = u32::from_be_bytes(out[at + 12..at + 16].try_into().unwrap());
            let len = u32::from_be_bytes(out[at + 16..at + 20].try_into().unwrap()) as usize;
            kinds.push(kind);
            at += 20 + len;
        }
        ((step, kinds), payloads)
    }

    fn flags() -> ClientFlags {
        ClientFlags {
            fixed_newstyle: true,
            no_zeroes: true,
        }
    }

    #[test]
    fn unknown_option_is_unsupported_and_haggling_continues() {
        let c = catalog();
        let mut n = Negotiation::new(flags());
        let (step, kinds) = run(&mut n, &c, 0x4242, b"junk");
        assert!(matches!(step, Step::Continue));
        assert_eq!(kinds, vec![rep::ERR_UNSUP]);
        let (step, kinds) = run(&mut n, &c, opt::LIST, &[]);
        assert!(matches!(step, Step::Continue));
        assert_eq!(kinds, vec![rep::SERVER, rep::ACK]);
    }

    #[test]
    fn go_with_base_allocation_gives_a_session_with_its_context() {
        let c = catalog();
        let mut n = Negotiation::new(flags());
        let (_, kinds) = run(&mut n, &c, opt::STRUCTURED_REPLY, &[]);
        assert_eq!(kinds, vec![rep::ACK]);
        let mut q = BytesMut::new();
        q.put_u32(0);
        q.put_u32(2);
        q.put_u32(13);
        q.put_slice(b"qemu:whatever");
        q.put_u32(15);
        q.put_slice(b"base:allocation");
        let (_, kinds) = run(&mut n, &c, opt::SET_META_CONTEXT, &q);
        assert_eq!(kinds, vec![rep::META_CONTEXT, rep::ACK]);
        let mut go = BytesMut::new();
        go.put_u32(0);
        go.put_u16(1);
        go.put_u16(info::NAME);
        let (step, kinds) = run(&mut n, &c, opt::GO, &go);
        assert_eq!(kinds, vec![rep::INFO, rep::INFO, rep::INFO, rep::ACK]);
        let Step::Transmit(session) = step else {
            panic!("GO did not enter transmission")
        };
        assert_eq!(session.export, "vol");
        assert_eq!(session.allocation_context, Some(BASE_ALLOCATION_ID));
        assert!(session.structured);
        assert_ne!(session.flags & tflags::CAN_MULTI_CONN, 0);
    }

    #[test]
    fn meta_context_without_structured_replies_is_invalid() {
        let c = catalog();
        let mut n = Negotiation::new(flags());
        let mut q = BytesMut::new();
        q.put_u32(0);
        q.put_u32(0);
        let (_, kinds) = run(&mut n, &c, opt::LIST_META_CONTEXT, &q);
        assert_eq!(kinds, vec![rep::ERR_INVALID]);
    }

    #[test]
    fn unknown_export_is_an_error_for_go_and_a_close_for_export_name() {
        let c = catalog();
        let mut n = Negotiation::new(flags());
        let mut go = BytesMut::new();
        go.put_u32(4);
        go.put_slice(b"nope");
        go.put_u16(0);
        let (step, kinds) = run(&mut n, &c, opt::GO, &go);
        assert!(matches!(step, Step::Continue));
        assert_eq!(kinds, vec![rep::ERR_UNKNOWN]);
        let (step, _) = run(&mut n, &c, opt::EXPORT_NAME, b"nope");
        assert!(matches!(step, Step::Close));
    }

    fn go(name: &str) -> BytesMut {
        let mut go = BytesMut::new();
        go.put_u32(name.len() as u32);
        go.put_slice(name.as_bytes());
        go.put_u16(0);
        go
    }

    #[test]
    fn where_tls_is_required_only_starttls_and_abort_are_answered_before_it() {
        let c = catalog();
        let mut n = Negotiation::new(flags()).with_peer(NbdClient::default(), TlsOffer::Required);
        for option in [opt::LIST, opt::STRUCTURED_REPLY] {
            let (step, kinds) = run(&mut n, &c, option, &[]);
            assert!(matches!(step, Step::Continue));
            assert_eq!(kinds, vec![rep::ERR_TLS_REQD]);
        }
        let (_, kinds) = run(&mut n, &c, opt::GO, &go("vol"));
        assert_eq!(kinds, vec![rep::ERR_TLS_REQD]);
        let (step, _) = run(&mut n, &c, opt::EXPORT_NAME, b"vol");
        assert!(matches!(step, Step::Close));

        let mut n = Negotiation::new(flags()).with_peer(NbdClient::default(), TlsOffer::Required);
        let (step, kinds) = run(&mut n, &c, opt::STARTTLS, &[]);
        assert!(matches!(step, Step::StartTls));
        assert_eq!(kinds, vec![rep::ACK]);
        n.tls_started(Some("alice".into()));
        assert_eq!(n.peer().certificate.as_deref(), Some("alice"));
        let (_, kinds) = run(&mut n, &c, opt::STARTTLS, &[]);
        assert_eq!(
            kinds,
            vec![rep::ERR_INVALID],
            "a second STARTTLS is invalid"
        );
        let (step, _) = run(&mut n, &c, opt::GO, &go("vol"));
        assert!(matches!(step, Step::Transmit(_)));
    }

    #[test]
    fn starttls_on_a_server_without_tls_is_refused_by_policy() {
        let c = catalog();
        let mut n = Negotiation::new(flags());
        let (step, kinds) = run(&mut n, &c, opt::STARTTLS, &[]);
        assert!(matches!(step, Step::Continue));
        assert_eq!(kinds, vec![rep::ERR_POLICY]);
        let (_, kinds) = run(&mut n, &c, opt::STARTTLS, b"x");
        assert_eq!(kinds, vec![rep::ERR_INVALID], "STARTTLS takes no data");
    }

    /// Admits `vol` only to clients proving `alice`.
    struct AliceOnly(StaticCatalog);

    impl ExportCatalog for AliceOnly {
        fn list(&self) -> Vec<String> {
            self.0.list()
        }
        fn open(&self, name: &str) -> Option<Arc<dyn BlockDevice>> {
            self.0.open(name)
        }
        fn admits(&self, _name: &str, client: &NbdClient) -> Result<(), String> {
            match client.certificate.as_deref() {
                Some("alice") => Ok(()),
                _ => Err("only alice".into()),
            }
        }
    }

    #[test]
    fn an_export_a_client_is_not_admitted_to_is_not_listed_nor_opened() {
        let c = AliceOnly(catalog());
        let mut n = Negotiation::new(flags());
        let (_, kinds) = run(&mut n, &c, opt::LIST, &[]);
        assert_eq!(kinds, vec![rep::ACK], "listed nothing");
        let ((_, kinds), payloads) = run_with_replies(&mut n, &c, opt::GO, &go("vol"));
        assert_eq!(kinds, vec![rep::ERR_POLICY]);
        assert_eq!(payloads[0], b"only alice");
        // The default export is checked too.
        let (_, kinds) = run(&mut n, &c, opt::GO, &go(""));
        assert_eq!(kinds, vec![rep::ERR_POLICY]);
        let (step, _) = run(&mut n, &c, opt::EXPORT_NAME, b"vol");
        assert!(matches!(step, Step::Close));

        let mut n = Negotiation::new(flags()).with_peer(
            NbdClient {
                tls: true,
                certificate: Some("alice".into()),
                ..NbdClient::default()
            },
            TlsOffer::Offered,
        );
        let (_, kinds) = run(&mut n, &c, opt::LIST, &[]);
        assert_eq!(kinds, vec![rep::SERVER, rep::ACK]);
        let (step, _) = run(&mut n, &c, opt::GO, &go("vol"));
        assert!(matches!(step, Step::Transmit(_)));
    }

    /// A catalog with one export that exists but cannot be opened now.
    struct Refusing;

    impl ExportCatalog for Refusing {
        fn list(&self) -> Vec<String> {
            Vec::new()
        }
        fn open(&self, _name: &str) -> Option<Arc<dyn BlockDevice>> {
            None
        }
        fn refusal(&self, name: &str) -> Option<String> {
            (name == "busy").then(|| "busy is being filled (40% done)".to_string())
        }
    }

    #[test]
    fn an_export_refused_for_now_says_why_and_an_unknown_one_says_it_is_unknown() {
        let mut n = Negotiation::new(flags());
        for (name, said) in [
            ("busy", "busy is being filled (40% done)"),
            ("nope", "no export named \"nope\""),
        ] {
            let mut go = BytesMut::new();
            go.put_u32(name.len() as u32);
            go.put_slice(name.as_bytes());
            go.put_u16(0);
            let ((step, kinds), payloads) = run_with_replies(&mut n, &Refusing, opt::GO, &go);
            assert!(matches!(step, Step::Continue));
            assert_eq!(kinds, vec![rep::ERR_UNKNOWN]);
            assert_eq!(String::from_utf8_lossy(&payloads[0]), said);
        }
    }

    #[test]
    fn too_many_options_close_the_session() {
        let c = catalog();
        let mut n = Negotiation::new(flags());
        for _ in 0..MAX_OPTIONS_PER_SESSION {
            let (step, _) = run(&mut n, &c, opt::STRUCTURED_REPLY, &[]);
            assert!(matches!(step, Step::Continue));
        }
        let (step, _) = run(&mut n, &c, opt::STRUCTURED_REPLY, &[]);
        assert!(matches!(step, Step::Close));
    }
}
