//! The tokio server: accepts connections, runs the handshake, then serves
//! requests on one task per connection.
//!
//! Owns: sockets, the in-flight request set of each connection, the output
//! queue, timeouts and shutdown.
//! Must not touch: the byte layouts (in [`crate::proto`]) or the request rules
//! (in [`crate::request`]); it only moves bytes between them and the device.
//! Invariants:
//! - one task owns a connection from socket to device: a request whose
//!   device future completes at once is answered without any hand-off, and
//!   slower ones run concurrently on the same task (at most
//!   [`MAX_IN_FLIGHT`]), so replies go out in completion order;
//! - replies are written by that task alone, in vectored writes, so chunks
//!   of different replies never interleave; while the socket still holds
//!   requests, replies wait (up to `MAX_HELD_REPLIES`) and go out together
//!   once it runs dry, so a busy connection answers in batches and an idle
//!   one at once;
//! - a WRITE payload of at least `OWN_BUFFER_PAYLOAD_BYTES` is read from
//!   the socket straight into a buffer of its own (from [`crate::payload`]),
//!   handed to the device without a copy; the device may keep it;
//! - every read from the peer is bounded: option payloads by
//!   `MAX_OPTION_DATA_BYTES`, write payloads by `MAX_PAYLOAD_BYTES`, the
//!   handshake by [`HANDSHAKE_TIMEOUT`].

use crate::catalog::{ExportCatalog, NbdClient};
use crate::link::Link;
use crate::negotiate::{Negotiation, Session, Step, TlsOffer};
use crate::payload;
use crate::proto::{
    self, decode_client_flags, decode_option_header, decode_request_header,
    encode_block_status_chunk, encode_data_chunk_header, encode_done_chunk, encode_error_chunk,
    encode_simple_reply, errno, ProtoError, RequestHeader, CLIENT_FLAGS_BYTES, MAX_PAYLOAD_BYTES,
    OPTION_HEADER_BYTES, REQUEST_HEADER_BYTES,
};
use crate::request::{
    classify, descriptors, errno_for, error_offset, Command, ExportView, OpKind, Rejection,
    MAX_DESCRIPTORS_PER_REPLY,
};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use std::collections::VecDeque;
use std::future::Future;
use std::io::{self, IoSlice};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tessera_blockdev::{BlockDevice, BlockError, WriteFlags};
use tessera_env::InFlight;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Requests one connection may have at the device at once; further requests
/// wait in the socket. 64 covers 8 jobs x iodepth 8 on one connection.
pub const MAX_IN_FLIGHT: usize = 64;
/// Time a client has to finish option haggling.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once; more are closed at accept.
pub const MAX_CONNECTIONS: usize = 1024;
/// Time connections get to answer in-flight requests at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Pause after a failed accept (e.g. out of file descriptors), so the loop
/// does not spin.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Read buffer growth step, in bytes.
const READ_BUFFER_BYTES: usize = 128 * 1024;
/// Most bytes one read takes into the read buffer: room for several small
/// requests, while little of a large payload that follows a header lands
/// there (it is moved to the payload's own buffer).
const READ_AHEAD_BYTES: usize = 32 * 1024;
/// Most bytes of a large payload taken by one read. Each read lets the
/// kernel acknowledge what it consumed and reopen the window, so a client
/// streaming large writes keeps sending while the server copies instead of
/// waiting for one acknowledgement per payload (measured: 5-10% more
/// 256 KiB writes per second over loopback, server CPU per write unchanged).
const PAYLOAD_READ_BYTES: usize = 32 * 1024;
/// WRITE payloads of at least this many bytes are read into a buffer of
/// their own, exactly their size, which the device receives as is (a
/// memory device keeps its whole-chunk pieces without a copy); smaller
/// ones are split off the shared read buffer.
const OWN_BUFFER_PAYLOAD_BYTES: usize = 64 * 1024;
/// Growth step of the reply header buffer, in bytes.
const HEADER_BUFFER_BYTES: usize = 64 * 1024;
/// Reply bytes queued before the connection stops starting requests and
/// sends: about four 256 KiB reads.
const MAX_QUEUED_REPLY_BYTES: usize = 1024 * 1024;
/// Buffers handed to one vectored write.
const MAX_IOVECS: usize = 64;
/// Replies held back while the socket still has requests to read: they go
/// out together once it has none (or this many are waiting), in one write
/// instead of one each.
const MAX_HELD_REPLIES: usize = 32;

/// TLS on an NBD server (`NBD_OPT_STARTTLS`).
#[derive(Clone)]
pub struct NbdTls {
    /// The server's TLS settings: its certificate, and the CA client
    /// certificates must come from (a client that presents one is known
    /// by the name it proves).
    pub config: Arc<rustls::ServerConfig>,
    /// Clients must upgrade before anything else; otherwise plain clients
    /// are served too, as far as the catalog admits them.
    pub required: bool,
}

impl std::fmt::Debug for NbdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdTls")
            .field("required", &self.required)
            .finish_non_exhaustive()
    }
}

/// Why a connection or the server ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    /// The socket failed.
    #[error("NBD connection with {peer}: {source}")]
    Io {
        /// The client address.
        peer: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The client broke the protocol; the connection was dropped.
    #[error("NBD client {peer} broke the protocol: {source}")]
    Protocol {
        /// The client address.
        peer: String,
        /// What it did.
        #[source]
        source: ProtoError,
    },
    /// The client did not finish the handshake in time.
    #[error("NBD client {peer} did not finish the handshake within {HANDSHAKE_TIMEOUT:?}")]
    HandshakeTimeout {
        /// The client address.
        peer: String,
    },
    /// The listener failed.
    #[error("NBD listener: {0}")]
    Listener(#[source] io::Error),
}

/// Serves NBD on `listener` until `shutdown` completes, then lets open
/// connections answer what they have in flight (up to [`SHUTDOWN_GRACE`]).
/// With `tls`, clients may (or must) upgrade with `NBD_OPT_STARTTLS`.
pub async fn serve(
    listener: TcpListener,
    catalog: Arc<dyn ExportCatalog>,
    tls: Option<NbdTls>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), NbdError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        tracing::warn!("NBD accept failed: {e}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                while connections.try_join_next().is_some() {}
                if connections.len() >= MAX_CONNECTIONS {
                    tracing::warn!("refusing NBD client {peer}: {MAX_CONNECTIONS} connections open");
                    continue;
                }
                let catalog = catalog.clone();
                let tls = tls.clone();
                let mut stop = stop_rx.clone();
                connections.spawn(async move {
                    let stopped = async move {
                        let _ = stop.wait_for(|s| *s).await;
                    };
                    if let Err(e) = serve_connection(stream, catalog, tls, stopped).await {
                        tracing::info!("{e}");
                    }
                });
            }
        }
    }
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            "{} NBD connections still busy after {SHUTDOWN_GRACE:?}; closing them",
            connections.len()
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// Serves one accepted connection: handshake, then transmission until the
/// client disconnects or `shutdown` completes.
pub async fn serve_connection(
    stream: TcpStream,
    catalog: Arc<dyn ExportCatalog>,
    tls: Option<NbdTls>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), NbdError> {
    let address = stream.peer_addr().ok();
    let peer = address
        .map(|a| a.to_string())
        .unwrap_or_else(|| "unknown peer".into());
    let client = NbdClient {
        address: address.map(|a| a.ip()),
        ..NbdClient::default()
    };
    let _ = stream.set_nodelay(true);
    tokio::pin!(shutdown);
    let handshake = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        handshake(stream, &*catalog, tls.as_ref(), client),
    );
    let (link, session) = tokio::select! {
        outcome = handshake => match outcome {
            Err(_) => return Err(NbdError::HandshakeTimeout { peer }),
            Ok(Err(Failure::Io(e))) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e.with_peer(peer)),
            Ok(Ok(None)) => return Ok(()),
            Ok(Ok(Some(attached))) => attached,
        },
        _ = &mut shutdown => return Ok(()),
    };
    tracing::debug!(
        "NBD client {peer} attached to export {:?} ({} bytes, flags {:#x}, {})",
        session.export,
        session.info.size_bytes,
        session.flags,
        if matches!(link, Link::Tls(_)) {
            "TLS"
        } else {
            "plain"
        }
    );
    let mut conn = Connection::new(link, session);
    match conn.run(shutdown).await {
        Ok(()) => {
            conn.link.shutdown().await;
            Ok(())
        }
        Err(Failure::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e.with_peer(peer)),
    }
}

/// A failure before the peer's address is attached.
enum Failure {
    Io(io::Error),
    Protocol(ProtoError),
}

impl Failure {
    fn with_peer(self, peer: String) -> NbdError {
        match self {
            Failure::Io(source) => NbdError::Io { peer, source },
            Failure::Protocol(source) => NbdError::Protocol { peer, source },
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

impl From<ProtoError> for Failure {
    fn from(e: ProtoError) -> Self {
        Failure::Protocol(e)
    }
}

/// The handshake: option haggling in plain text, then (after STARTTLS) over
/// TLS; the stream and session to transmit on, or None when the client
/// went away without choosing an export.
async fn handshake(
    mut stream: TcpStream,
    catalog: &dyn ExportCatalog,
    tls: Option<&NbdTls>,
    client: NbdClient,
) -> Result<Option<(Link, Session)>, Failure> {
    stream.write_all(&proto::greeting()).await?;
    let mut flags = [0u8; CLIENT_FLAGS_BYTES];
    stream.read_exact(&mut flags).await?;
    let offer = match tls {
        None => TlsOffer::Off,
        Some(tls) if tls.required => TlsOffer::Required,
        Some(_) => TlsOffer::Offered,
    };
    let mut negotiation = Negotiation::new(decode_client_flags(&flags)?).with_peer(client, offer);
    match haggle(&mut stream, &mut negotiation, catalog).await? {
        Step::Transmit(session) => return Ok(Some((Link::Plain(stream), *session))),
        Step::StartTls => {}
        Step::Close | Step::Continue => return Ok(None),
    }
    // The negotiation asks for TLS only when the server offers it.
    let Some(tls) = tls else {
        return Ok(None);
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&tls.config));
    let mut stream = acceptor.accept(stream).await?;
    negotiation.tls_started(tessera_tls::peer_name(stream.get_ref().1));
    match haggle(&mut stream, &mut negotiation, catalog).await? {
        Step::Transmit(session) => {
            let (tcp, connection) = stream.into_inner();
            Ok(Some((Link::tls(tcp, connection), *session)))
        }
        Step::StartTls | Step::Close | Step::Continue => Ok(None),
    }
}

/// Reads and answers options until one ends this stage of the handshake
/// (never returns [`Step::Continue`]).
async fn haggle<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    negotiation: &mut Negotiation,
    catalog: &dyn ExportCatalog,
) -> Result<Step, Failure> {
    let mut data = Vec::new();
    let mut out = BytesMut::new();
    loop {
        let mut header = [0u8; OPTION_HEADER_BYTES];
        stream.read_exact(&mut header).await?;
        let header = decode_option_header(&header)?;
        data.resize(header.len as usize, 0);
        stream.read_exact(&mut data).await?;
        out.clear();
        let step = negotiation.handle(catalog, header, &data, &mut out);
        stream.write_all(&out).await?;
        stream.flush().await?;
        if !matches!(step, Step::Continue) {
            return Ok(step);
        }
    }
}

/// What a device call produced.
enum Outcome {
    Data(Bytes),
    Done,
    Extents(Vec<(u32, u32)>),
}

/// A finished request, ready to be answered.
struct Completion {
    cookie: u64,
    command: Command,
    result: Result<Outcome, BlockError>,
}

/// Replies waiting for the socket: small headers are packed into one buffer,
/// read data rides along as the device's own `Bytes` (no copy).
struct OutQueue {
    head: BytesMut,
    chunks: VecDeque<Bytes>,
    /// Bytes in `chunks`.
    chunk_bytes: usize,
    /// Replies queued since the last write.
    held: usize,
}

impl OutQueue {
    fn new() -> Self {
        OutQueue {
            head: BytesMut::with_capacity(HEADER_BUFFER_BYTES),
            chunks: VecDeque::new(),
            chunk_bytes: 0,
            held: 0,
        }
    }

    /// Where the next reply's header goes; called once per reply.
    fn header(&mut self) -> &mut BytesMut {
        self.held += 1;
        if self.head.capacity() - self.head.len() < 4096 {
            self.head.reserve(HEADER_BUFFER_BYTES);
        }
        &mut self.head
    }

    fn data(&mut self, data: Bytes) {
        self.seal();
        if !data.is_empty() {
            self.chunk_bytes += data.len();
            self.chunks.push_back(data);
        }
    }

    fn seal(&mut self) {
        if !self.head.is_empty() {
            let sealed = self.head.split().freeze();
            self.chunk_bytes += sealed.len();
            self.chunks.push_back(sealed);
        }
    }

    fn is_empty(&self) -> bool {
        self.head.is_empty() && self.chunks.is_empty()
    }

    fn queued_bytes(&self) -> usize {
        self.head.len() + self.chunk_bytes
    }

    /// Writes as much as the socket takes without waiting; `Ok(false)` when
    /// the socket is full.
    fn write_now(&mut self, stream: &mut Link) -> io::Result<bool> {
        self.held = 0;
        self.seal();
        if !stream.flush_now()? {
            return Ok(false);
        }
        while !self.chunks.is_empty() {
            let slices: Vec<IoSlice<'_>> = self
                .chunks
                .iter()
                .take(MAX_IOVECS)
                .map(|c| IoSlice::new(c))
                .collect();
            match stream.try_write_vectored(&slices) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    fn advance(&mut self, mut n: usize) {
        self.chunk_bytes -= n.min(self.chunk_bytes);
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                return;
            };
            if front.len() <= n {
                n -= front.len();
                self.chunks.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
}

/// The transmission phase of one connection.
struct Connection {
    link: Link,
    device: Arc<dyn BlockDevice>,
    view: ExportView,
    rbuf: BytesMut,
    /// A WRITE header whose payload has not fully arrived.
    pending: Option<RequestHeader>,
    /// The pending WRITE's own payload buffer, when it is large enough to
    /// get one: the socket is read straight into it.
    payload: Option<payload::PayloadBuffer>,
    out: OutQueue,
    inflight: InFlight<BoxFuture<'static, Completion>>,
    shutting_down: bool,
}

impl Connection {
    fn new(link: Link, session: Session) -> Self {
        Connection {
            link,
            view: ExportView {
                size: session.info.size_bytes,
                read_only: session.info.read_only,
                structured: session.structured,
                allocation_context: session.allocation_context,
            },
            device: session.device,
            rbuf: BytesMut::with_capacity(READ_BUFFER_BYTES),
            pending: None,
            payload: None,
            out: OutQueue::new(),
            inflight: InFlight::new(),
            shutting_down: false,
        }
    }

    async fn run(&mut self, shutdown: impl Future<Output = ()>) -> Result<(), Failure> {
        tokio::pin!(shutdown);
        let mut closing = false;
        // The last read found the socket empty.
        let mut drained = true;
        loop {
            closing |= self.start_requests().await?;
            let want_read = !closing && self.inflight.len() < MAX_IN_FLIGHT;
            // While requests keep arriving, replies wait for the socket to
            // run dry: a loaded server answers in batches (fewer writes and
            // fewer wake-ups of the client), an idle one at once.
            let send = drained || !want_read || self.out.held >= MAX_HELD_REPLIES;
            let unsent = !self.out.is_empty() || self.link.wants_write();
            if send && unsent {
                self.out.write_now(&mut self.link)?;
            }
            let unsent = !self.out.is_empty() || self.link.wants_write();
            if closing && self.inflight.is_empty() && !unsent {
                return Ok(());
            }
            // The rest of the current frame's payload.
            let missing = self
                .pending
                .map(|h| {
                    let have = self
                        .payload
                        .as_ref()
                        .map_or(self.rbuf.len(), |p| p.filled());
                    (h.payload_bytes() as usize).saturating_sub(have)
                })
                .unwrap_or(0);
            if want_read && self.payload.is_none() {
                // Room for the rest of a small frame, or a read ahead. Once
                // the payloads handed to the device are dropped the buffer
                // is unique again and `reserve` reuses it instead of
                // allocating.
                let wanted = missing.max(READ_AHEAD_BYTES);
                if self.rbuf.capacity() - self.rbuf.len() < wanted {
                    self.rbuf.reserve(wanted.max(READ_BUFFER_BYTES));
                }
            }
            let has_output = send && unsent;
            tokio::select! {
                biased;
                Some(done) = self.inflight.next(), if !self.inflight.is_empty() => {
                    self.complete(done);
                    // Requests that finished together (a group commit's
                    // writes, a peer's answers read at once) are answered
                    // with one write to the socket, not one each: a write
                    // to a loopback socket runs the receiver's network
                    // stack and wakes it.
                    for done in self.inflight.take_finished().await {
                        self.complete(done);
                    }
                }
                ready = self.link.writable(), if has_output => {
                    ready?;
                    self.out.write_now(&mut self.link)?;
                }
                ready = self.link.readable(), if want_read => {
                    ready?;
                    // A large payload is read into its own buffer up to its
                    // end and no further, a piece at a time; otherwise a
                    // bounded read ahead, so little of a large payload lands
                    // in the shared buffer and has to be moved out.
                    let read = match self.payload.as_mut() {
                        Some(payload) => self
                            .link
                            .try_read_buf(&mut payload.tail().limit(missing.min(PAYLOAD_READ_BYTES))),
                        None => self.link.try_read_buf(
                            &mut (&mut self.rbuf).limit(missing.max(READ_AHEAD_BYTES)),
                        ),
                    };
                    match read {
                        Ok((0, _)) => closing = true,
                        Ok((_, empty)) => drained = empty,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => drained = true,
                        Err(e) => return Err(e.into()),
                    }
                }
                _ = &mut shutdown, if !self.shutting_down => {
                    self.shutting_down = true;
                    closing = true;
                }
            }
        }
    }

    /// Starts every complete request in the read buffer (up to the in-flight
    /// bound); returns true when the client asked to disconnect.
    async fn start_requests(&mut self) -> Result<bool, Failure> {
        // Plugged: a lone write's commit waits for the end of this loop, so
        // the writes started after it share its group commit. Nothing here
        // suspends (the first polls return at once).
        let _plug = tessera_env::Plug::open();
        while self.inflight.len() < MAX_IN_FLIGHT {
            if self.out.queued_bytes() >= MAX_QUEUED_REPLY_BYTES {
                // Send before copying more: replies go out while their data
                // is still in cache, and the client works while we copy.
                if !self.out.write_now(&mut self.link)? {
                    return Ok(false);
                }
            }
            let Some((header, payload)) = self.next_request()? else {
                return Ok(false);
            };
            if self.shutting_down {
                self.reject(
                    &header,
                    Rejection {
                        errno: errno::ESHUTDOWN,
                        message: "the server is shutting down".into(),
                    },
                );
                continue;
            }
            match classify(&header, &self.view) {
                Ok(Command::Disconnect) => return Ok(true),
                Ok(command) => {
                    let mut fut = execute(self.device.clone(), header.cookie, command, payload);
                    match futures::poll!(&mut fut) {
                        Poll::Ready(done) => self.complete(done),
                        Poll::Pending => self.inflight.push(fut),
                    }
                }
                Err(rejection) => self.reject(&header, rejection),
            }
        }
        Ok(false)
    }

    /// Takes the next whole request (header and, for WRITE, payload) off
    /// the read buffer.
    fn next_request(&mut self) -> Result<Option<(RequestHeader, Bytes)>, Failure> {
        let header = match self.pending.take() {
            Some(h) => h,
            None => {
                let Some(raw) = self.rbuf.get(..REQUEST_HEADER_BYTES) else {
                    return Ok(None);
                };
                let mut buf = [0u8; REQUEST_HEADER_BYTES];
                buf.copy_from_slice(raw);
                let h = decode_request_header(&buf)?;
                self.rbuf.advance(REQUEST_HEADER_BYTES);
                if h.payload_bytes() > MAX_PAYLOAD_BYTES {
                    return Err(ProtoError::PayloadTooLong {
                        len: h.len,
                        limit: MAX_PAYLOAD_BYTES,
                    }
                    .into());
                }
                h
            }
        };
        let need = header.payload_bytes() as usize;
        if let Some(payload) = self.payload.take() {
            if payload.filled() == need {
                return Ok(Some((header, payload::freeze(payload))));
            }
            self.payload = Some(payload);
        } else if self.rbuf.len() >= need {
            let payload = self.rbuf.split_to(need).freeze();
            return Ok(Some((header, payload)));
        } else if need >= OWN_BUFFER_PAYLOAD_BYTES {
            // Everything buffered belongs to this payload: at most a read
            // ahead, moved once.
            let mut payload = payload::buffer(need);
            payload.extend_from_slice(&self.rbuf);
            self.rbuf.clear();
            self.payload = Some(payload);
        }
        self.pending = Some(header);
        Ok(None)
    }

    fn reject(&mut self, header: &RequestHeader, rejection: Rejection) {
        tracing::debug!(
            "NBD request {:#x} refused: {}",
            header.cookie,
            rejection.message
        );
        let out = self.out.header();
        if self.view.structured {
            encode_error_chunk(
                out,
                header.cookie,
                rejection.errno,
                &rejection.message,
                None,
            );
        } else {
            encode_simple_reply(out, header.cookie, rejection.errno);
        }
    }

    fn complete(&mut self, done: Completion) {
        let structured = self.view.structured;
        let cookie = done.cookie;
        match (done.command, done.result) {
            (Command::Read { offset, len }, Ok(Outcome::Data(data)))
                if data.len() == len as usize =>
            {
                if !structured {
                    encode_simple_reply(self.out.header(), cookie, 0);
                    self.out.data(data);
                } else if len == 0 {
                    encode_done_chunk(self.out.header(), cookie);
                } else {
                    encode_data_chunk_header(self.out.header(), cookie, offset, len);
                    self.out.data(data);
                }
            }
            (Command::Read { offset, len }, Ok(Outcome::Data(data))) => {
                let err = BlockError::Io {
                    offset,
                    detail: format!("device returned {} bytes for a {len}-byte read", data.len()),
                };
                self.fail(cookie, OpKind::Read, &err, None);
            }
            (Command::Read { offset, len }, Err(err)) => {
                let at = error_offset(&err, offset, len);
                self.fail(cookie, OpKind::Read, &err, at);
            }
            (Command::BlockStatus { context, .. }, Ok(Outcome::Extents(d))) => {
                encode_block_status_chunk(self.out.header(), cookie, context, &d);
            }
            (_, Ok(_)) => encode_simple_reply(self.out.header(), cookie, 0),
            (command, Err(err)) => {
                let op = match command {
                    Command::Write { .. } | Command::WriteZeroes { .. } => OpKind::Write,
                    Command::Trim { .. } => OpKind::Trim,
                    Command::Flush => OpKind::Flush,
                    _ => OpKind::Read,
                };
                self.fail(cookie, op, &err, None);
            }
        }
    }

    fn fail(&mut self, cookie: u64, op: OpKind, err: &BlockError, offset: Option<u64>) {
        let code = errno_for(op, err, self.shutting_down);
        tracing::debug!("NBD request {cookie:#x} failed with error {code}: {err}");
        let out = self.out.header();
        if self.view.structured {
            encode_error_chunk(out, cookie, code, &err.to_string(), offset);
        } else {
            encode_simple_reply(out, cookie, code);
        }
    }
}

/// Runs one command against the device.
fn execute(
    device: Arc<dyn BlockDevice>,
    cookie: u64,
    command: Command,
    payload: Bytes,
) -> BoxFuture<'static, Completion> {
    async move {
        let result = match command {
            Command::Read { offset, len } => {
                device.read(offset, len as u64).await.map(Outcome::Data)
            }
            Command::Write { offset, fua, .. } => device
                .write(offset, payload, WriteFlags { fua })
                .await
                .map(|()| Outcome::Done),
            Command::Flush => device.flush().await.map(|()| Outcome::Done),
            Command::Trim { offset, len, fua } => {
                let trimmed = device.unmap(offset, len as u64).await;
                durable(&*device, trimmed, fua).await
            }
            Command::Cache { offset, len } => device
                .cache(offset, len as u64)
                .await
                .map(|()| Outcome::Done),
            Command::WriteZeroes {
                offset,
                len,
                fua,
                mode,
                ..
            } => {
                let zeroed = device.write_zeroes(offset, len as u64, mode).await;
                durable(&*device, zeroed, fua).await
            }
            Command::BlockStatus {
                offset,
                len,
                req_one,
                ..
            } => {
                let max = if req_one {
                    1
                } else {
                    MAX_DESCRIPTORS_PER_REPLY
                };
                device
                    .block_status(offset, len as u64)
                    .await
                    .map(|extents| Outcome::Extents(descriptors(&extents, offset, len, max)))
            }
            Command::Disconnect => Ok(Outcome::Done),
        };
        Completion {
            cookie,
            command,
            result,
        }
    }
    .boxed()
}

/// FUA on TRIM and WRITE_ZEROES: the trait has no flag for them, so a
/// device-wide flush follows.
async fn durable(
    device: &dyn BlockDevice,
    result: Result<(), BlockError>,
    fua: bool,
) -> Result<Outcome, BlockError> {
    result?;
    if fua {
        device.flush().await?;
    }
    Ok(Outcome::Done)
}
