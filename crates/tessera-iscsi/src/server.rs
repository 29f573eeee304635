//! The tokio server: accepts connections, runs the login phase, then the
//! full-feature phase on one task per connection.
//!
//! Owns: sockets, the running SCSI commands of each connection (so an ABORT
//! TASK can drop one), the output queue, session reinstatement, timeouts,
//! target pings and shutdown.
//! Must not touch: byte layouts ([`crate::pdu`]), login rules
//! ([`crate::login`]) or sequence rules ([`crate::session`]); it moves
//! bytes between them and the SCSI target.
//! Invariants:
//! - one task owns a connection from socket to SCSI target, and PDUs go out
//!   in the order the session produced them, so StatSN rises on the wire;
//! - every read is bounded: login PDUs by [`MAX_LOGIN_DATA_BYTES`] and
//!   [`LOGIN_TIMEOUT`], later PDUs by the MaxRecvDataSegmentLength we
//!   declared, and the number of tasks by the CmdSN window;
//! - a connection that ends (logout, error, reinstatement, shutdown) drops
//!   its running commands and tells the SCSI target the nexus ended before
//!   a login reinstating the same session proceeds.

use crate::catalog::TargetCatalog;
use crate::login::{LoggedIn, Login, LoginStep};
use crate::pdu::{reject_reason, Digests, Frame, Pdu, PduError};
use crate::scsi::{Nexus, Response, ScsiTarget};
use crate::session::{Action, FullFeature, MAX_TASKS};
use crate::text::TargetLimits;
use bytes::{Buf, Bytes, BytesMut};
use futures::future::{AbortHandle, Abortable, BoxFuture};
use futures::{FutureExt, StreamExt};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_env::InFlight;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Time an initiator has to complete the login phase.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest data segment of a login PDU accepted, in bytes (well above the
/// 8 KiB default, for long CHAP values).
pub const MAX_LOGIN_DATA_BYTES: u32 = 64 * 1024;
/// Connections served at once; more are closed at accept.
pub const MAX_CONNECTIONS: usize = 1024;
/// Time connections get to answer in-flight commands at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Pause after a failed accept, so the loop does not spin.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Idle time after which the target pings the initiator (NOP-In).
pub const PING_INTERVAL: Duration = Duration::from_secs(15);
/// Time an initiator has to answer a ping before the connection is
/// considered dead.
pub const PING_TIMEOUT: Duration = Duration::from_secs(30);
/// Time a reinstating login waits for the old connection to wind down.
pub const REINSTATE_WAIT: Duration = Duration::from_secs(10);
/// Read buffer growth step, in bytes.
const READ_BUFFER_BYTES: usize = 1024 * 1024;
/// Smallest free space kept in the read buffer before a read, in bytes.
const READ_SPARE_BYTES: usize = 64 * 1024;
/// Output bytes queued before the connection stops reading new requests.
const MAX_QUEUED_OUTPUT_BYTES: usize = 8 * 1024 * 1024;
/// Buffers handed to one vectored write (Linux takes up to 1024).
const MAX_IOVECS: usize = 256;
/// Allocation step of the buffer that gathers headers and small data.
const OUT_SMALL_BYTES: usize = 64 * 1024;
/// Data segments up to this size are copied next to their header rather
/// than queued as a slice of their own.
const OUT_COPY_DATA_BYTES: usize = 512;
/// A header with its digest and largest AHS we send: below this spare
/// capacity the gathering buffer is replaced rather than grown.
const BHS_WITH_DIGEST_BYTES: usize = 256;

/// Why a connection or the server ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum IscsiError {
    /// The socket failed.
    #[error("iSCSI connection with {peer}: {source}")]
    Io {
        /// The initiator's address.
        peer: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The initiator broke the protocol; the connection was dropped.
    #[error("iSCSI initiator {peer} broke the protocol: {source}")]
    Protocol {
        /// The initiator's address.
        peer: String,
        /// What it did.
        #[source]
        source: PduError,
    },
    /// The initiator did not finish logging in.
    #[error("iSCSI initiator {peer} did not finish login within {LOGIN_TIMEOUT:?}")]
    LoginTimeout {
        /// The initiator's address.
        peer: String,
    },
    /// The initiator stopped answering pings.
    #[error("iSCSI initiator {peer} did not answer a ping within {PING_TIMEOUT:?}")]
    PingTimeout {
        /// The initiator's address.
        peer: String,
    },
}

/// Sessions open on this server, for TSIH assignment and reinstatement.
#[derive(Default)]
pub struct Sessions {
    next_tsih: AtomicU16,
    open: Mutex<HashMap<SessionKey, OpenSession>>,
}

/// Initiator name (lower case), ISID and target name: what identifies a
/// session for reinstatement.
type SessionKey = (String, [u8; 6], String);

struct OpenSession {
    id: u64,
    stop: watch::Sender<bool>,
    ended: watch::Receiver<bool>,
}

impl Sessions {
    fn allocate_tsih(&self) -> u16 {
        loop {
            let t = self.next_tsih.fetch_add(1, Ordering::Relaxed);
            if t != 0 {
                return t;
            }
        }
    }
}

/// Serves iSCSI on `listener` until `shutdown` completes, then lets open
/// connections answer what they have in flight (up to [`SHUTDOWN_GRACE`]).
pub async fn serve(
    listener: TcpListener,
    catalog: Arc<dyn TargetCatalog>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), IscsiError> {
    serve_with(listener, catalog, TargetLimits::default(), shutdown).await
}

/// [`serve`] with explicit target limits.
pub async fn serve_with(
    listener: TcpListener,
    catalog: Arc<dyn TargetCatalog>,
    limits: TargetLimits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), IscsiError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let sessions = Arc::new(Sessions::default());
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        tracing::warn!("iSCSI accept failed: {e}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                while connections.try_join_next().is_some() {}
                if connections.len() >= MAX_CONNECTIONS {
                    tracing::warn!("refusing iSCSI initiator {peer}: {MAX_CONNECTIONS} connections open");
                    continue;
                }
                let catalog = catalog.clone();
                let sessions = sessions.clone();
                let mut stop = stop_rx.clone();
                connections.spawn(async move {
                    let stopped = async move {
                        let _ = stop.wait_for(|s| *s).await;
                    };
                    if let Err(e) = serve_connection(stream, catalog, sessions, limits, stopped).await {
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
            "{} iSCSI connections still busy after {SHUTDOWN_GRACE:?}; closing them",
            connections.len()
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// A failure before the peer's address is attached.
enum Failure {
    Io(io::Error),
    Protocol(PduError),
    PingTimeout,
}

impl Failure {
    fn with_peer(self, peer: String) -> IscsiError {
        match self {
            Failure::Io(source) => IscsiError::Io { peer, source },
            Failure::Protocol(source) => IscsiError::Protocol { peer, source },
            Failure::PingTimeout => IscsiError::PingTimeout { peer },
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

fn quiet(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    )
}

/// Serves one accepted connection: login, then the full-feature phase
/// until logout, an error or `shutdown`.
pub async fn serve_connection(
    mut stream: TcpStream,
    catalog: Arc<dyn TargetCatalog>,
    sessions: Arc<Sessions>,
    limits: TargetLimits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), IscsiError> {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "unknown peer".into());
    let _ = stream.set_nodelay(true);
    tokio::pin!(shutdown);
    let tsih = sessions.allocate_tsih();
    let login = tokio::time::timeout(LOGIN_TIMEOUT, login(&mut stream, &*catalog, limits, tsih));
    let logged_in = tokio::select! {
        outcome = login => match outcome {
            Err(_) => return Err(IscsiError::LoginTimeout { peer }),
            Ok(Err(Failure::Io(e))) if quiet(&e) => return Ok(()),
            Ok(Err(e)) => return Err(e.with_peer(peer)),
            Ok(Ok(None)) => return Ok(()),
            Ok(Ok(Some(l))) => l,
        },
        _ = &mut shutdown => return Ok(()),
    };
    let nexus = Nexus {
        initiator_port: format!(
            "{},i,0x{}",
            logged_in.initiator_name,
            logged_in
                .isid
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        ),
        relative_port: logged_in
            .target
            .as_ref()
            .map(|t| t.relative_port)
            .unwrap_or(0),
    };
    tracing::debug!(
        "iSCSI initiator {peer} logged in as {} ({:?} session{}), {:?}",
        nexus.initiator_port,
        logged_in.session_type,
        logged_in
            .target
            .as_ref()
            .map(|t| format!(" to {}", t.name))
            .unwrap_or_default(),
        logged_in.params
    );
    // Session reinstatement: a login with the ISID of an open session ends
    // that session first (RFC 7143 section 6.3.5).
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let (ended_tx, ended_rx) = watch::channel(false);
    let key = (
        logged_in.initiator_name.to_ascii_lowercase(),
        logged_in.isid,
        logged_in
            .target
            .as_ref()
            .map(|t| t.name.clone())
            .unwrap_or_default(),
    );
    let id = rand::random::<u64>();
    let previous = sessions.open.lock().insert(
        key.clone(),
        OpenSession {
            id,
            stop: stop_tx,
            ended: ended_rx,
        },
    );
    if let Some(old) = previous {
        let _ = old.stop.send(true);
        let mut ended = old.ended;
        let _ = tokio::time::timeout(REINSTATE_WAIT, ended.wait_for(|e| *e)).await;
    }
    let target = logged_in.target.as_ref().map(|t| t.device.clone());
    let mut conn = Connection::new(&stream, &logged_in, nexus.clone(), target.clone());
    let reinstated = async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    };
    let outcome = conn.run(&*catalog, shutdown, reinstated).await;
    let told = conn.nexus_ended;
    drop(conn);
    if let Some(target) = target.as_ref().filter(|_| !told) {
        target.nexus_ended(&nexus).await;
    }
    {
        let mut open = sessions.open.lock();
        if open.get(&key).map(|s| s.id) == Some(id) {
            open.remove(&key);
        }
    }
    let _ = ended_tx.send(true);
    match outcome {
        Ok(()) => {
            let _ = stream.shutdown().await;
            Ok(())
        }
        Err(Failure::Io(e)) if quiet(&e) => Ok(()),
        Err(e) => Err(e.with_peer(peer)),
    }
}

async fn write_pdu(stream: &mut TcpStream, pdu: &Pdu) -> io::Result<()> {
    stream.write_all(&pdu.to_bytes(Digests::default())).await
}

async fn login(
    stream: &mut TcpStream,
    catalog: &dyn TargetCatalog,
    limits: TargetLimits,
    tsih: u16,
) -> Result<Option<LoggedIn>, Failure> {
    let mut login = Login::new(limits, tsih, MAX_TASKS);
    let mut buf = BytesMut::with_capacity(8192);
    loop {
        let (frame, digest_ok) = loop {
            match Frame::take(&mut buf, Digests::default(), MAX_LOGIN_DATA_BYTES) {
                Ok(Some(f)) => break f,
                Ok(None) => {}
                Err(e) => return Err(Failure::Protocol(e)),
            }
            if stream.read_buf(&mut buf).await? == 0 {
                return Ok(None);
            }
        };
        if !digest_ok {
            return Ok(None);
        }
        let request = match Pdu::from_frame(frame) {
            Ok(Pdu::LoginRequest(r)) => r,
            Ok(_) | Err(_) => {
                // Anything but a Login Request before the full-feature
                // phase is a protocol error that ends the connection.
                return Err(Failure::Protocol(PduError::InvalidField(
                    "a PDU other than Login Request during login",
                )));
            }
        };
        match login.handle(catalog, request) {
            LoginStep::Continue(pdu) => write_pdu(stream, &pdu).await?,
            LoginStep::Refuse(pdu, _) => {
                write_pdu(stream, &pdu).await?;
                let _ = stream.shutdown().await;
                return Ok(None);
            }
            LoginStep::Complete(pdu, logged_in) => {
                write_pdu(stream, &pdu).await?;
                if !buf.is_empty() {
                    return Err(Failure::Protocol(PduError::InvalidField(
                        "PDUs sent before the final Login Response",
                    )));
                }
                return Ok(Some(*logged_in));
            }
        }
    }
}

/// What a running future produced.
enum Done {
    Command(u32, Response),
    Aborted,
    Reset(u32),
    /// The nexus ended; the actions that were to follow it (the logout
    /// response) go out now.
    NexusEnded(Vec<Action>),
}

/// PDUs waiting for the socket. Headers, trailers and small data segments
/// are appended to one contiguous buffer (`small`), so a run of responses
/// costs no allocation per PDU and goes out as one slice of one vectored
/// write; larger data segments stay the SCSI target's own `Bytes` (no
/// copy).
struct OutQueue {
    chunks: VecDeque<Bytes>,
    /// Bytes not yet moved to `chunks`; always after every chunk.
    small: BytesMut,
    bytes: usize,
}

impl OutQueue {
    fn new() -> Self {
        OutQueue {
            chunks: VecDeque::new(),
            small: BytesMut::with_capacity(OUT_SMALL_BYTES),
            bytes: 0,
        }
    }

    /// Moves the small bytes gathered so far behind the queued chunks.
    fn seal(&mut self) {
        if !self.small.is_empty() {
            let sealed = self.small.split().freeze();
            self.chunks.push_back(sealed);
        }
        if self.small.capacity() < BHS_WITH_DIGEST_BYTES {
            self.small = BytesMut::with_capacity(OUT_SMALL_BYTES);
        }
    }

    fn push_small(&mut self, bytes: &[u8]) {
        self.bytes += bytes.len();
        self.small.extend_from_slice(bytes);
    }

    fn pdu(&mut self, pdu: &Pdu, digests: Digests) {
        let frame = pdu.to_frame();
        self.push_small(&frame.header_bytes(digests));
        if frame.data.len() <= OUT_COPY_DATA_BYTES {
            self.push_small(&frame.data);
        } else {
            self.seal();
            self.bytes += frame.data.len();
            self.chunks.push_back(frame.data.clone());
        }
        let trailer = frame.trailer_bytes(digests);
        self.push_small(&trailer);
    }

    fn is_empty(&self) -> bool {
        self.chunks.is_empty() && self.small.is_empty()
    }

    /// Writes what the socket takes without waiting; `Ok(false)` when full.
    fn write_now(&mut self, stream: &TcpStream) -> io::Result<bool> {
        self.seal();
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
        self.bytes -= n.min(self.bytes);
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

/// The full-feature phase of one connection.
struct Connection<'a> {
    stream: &'a TcpStream,
    session: FullFeature,
    target: Option<Arc<dyn ScsiTarget>>,
    digests: Digests,
    max_data: u32,
    rbuf: BytesMut,
    out: OutQueue,
    running: InFlight<BoxFuture<'static, Done>>,
    aborts: HashMap<u32, AbortHandle>,
    closing: bool,
    /// The SCSI target was told the nexus ended (at logout).
    nexus_ended: bool,
}

impl<'a> Connection<'a> {
    fn new(
        stream: &'a TcpStream,
        logged_in: &LoggedIn,
        nexus: Nexus,
        target: Option<Arc<dyn ScsiTarget>>,
    ) -> Self {
        let session = FullFeature::new(logged_in, nexus);
        let params = *session.params();
        Connection {
            stream,
            digests: Digests {
                header: params.header_digest,
                data: params.data_digest,
            },
            max_data: params.target_max_recv_data_segment_length,
            session,
            target,
            rbuf: BytesMut::with_capacity(READ_BUFFER_BYTES),
            out: OutQueue::new(),
            running: InFlight::new(),
            aborts: HashMap::new(),
            closing: false,
            nexus_ended: false,
        }
    }

    async fn run(
        &mut self,
        catalog: &dyn TargetCatalog,
        shutdown: impl Future<Output = ()>,
        reinstated: impl Future<Output = ()>,
    ) -> Result<(), Failure> {
        tokio::pin!(shutdown);
        tokio::pin!(reinstated);
        let mut last_heard = Instant::now();
        let mut ping_sent: Option<Instant> = None;
        let mut ticker = tokio::time::interval(PING_INTERVAL / 3);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut draining = false;
        loop {
            if !self.closing {
                self.receive_buffered(catalog)?;
            }
            if !self.out.is_empty() {
                self.out.write_now(self.stream)?;
            }
            if self.closing && self.out.is_empty() {
                return Ok(());
            }
            if draining && self.running.is_empty() && self.out.is_empty() {
                return Ok(());
            }
            let want_read = !self.closing && !draining && self.out.bytes < MAX_QUEUED_OUTPUT_BYTES;
            if want_read && self.rbuf.capacity() - self.rbuf.len() < READ_SPARE_BYTES {
                self.rbuf.reserve(READ_BUFFER_BYTES);
            }
            let has_output = !self.out.is_empty();
            tokio::select! {
                biased;
                Some(done) = self.running.next(), if !self.running.is_empty() => {
                    self.finished(done);
                    // Commands that finished together are answered with
                    // one write to the socket, not one each.
                    for done in self.running.take_finished().await {
                        self.finished(done);
                    }
                }
                ready = self.stream.writable(), if has_output => {
                    ready?;
                    self.out.write_now(self.stream)?;
                }
                ready = self.stream.readable(), if want_read => {
                    ready?;
                    match self.stream.try_read_buf(&mut self.rbuf) {
                        Ok(0) => return Ok(()),
                        Ok(_) => {
                            last_heard = Instant::now();
                            ping_sent = None;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                _ = ticker.tick() => {
                    if let Some(at) = ping_sent {
                        if at.elapsed() >= PING_TIMEOUT && self.session.ping_outstanding() {
                            return Err(Failure::PingTimeout);
                        }
                    } else if last_heard.elapsed() >= PING_INTERVAL && self.running.is_empty() {
                        if let Some(ping) = self.session.ping() {
                            self.out.pdu(&ping, self.digests);
                            ping_sent = Some(Instant::now());
                        }
                    }
                }
                _ = &mut shutdown, if !draining => draining = true,
                _ = &mut reinstated => {
                    tracing::info!("iSCSI session of {} reinstated by a new login; closing the old connection",
                        self.session.nexus().initiator_port);
                    return Ok(());
                }
            }
        }
    }

    /// Handles every whole PDU in the read buffer.
    fn receive_buffered(&mut self, catalog: &dyn TargetCatalog) -> Result<(), Failure> {
        while !self.closing {
            let (frame, digest_ok) = match Frame::take(&mut self.rbuf, self.digests, self.max_data)
            {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(()),
                Err(e @ PduError::DataSegmentTooLong { .. }) => {
                    let mut bhs = [0u8; crate::pdu::BHS_BYTES];
                    bhs.copy_from_slice(&self.rbuf[..crate::pdu::BHS_BYTES]);
                    let actions = self
                        .session
                        .unparseable(&bhs, reject_reason::PROTOCOL_ERROR);
                    self.apply(actions);
                    self.closing = true;
                    tracing::info!("iSCSI: {e}; closing the connection");
                    return Ok(());
                }
                Err(e) => return Err(Failure::Protocol(e)),
            };
            if !digest_ok {
                let actions = self.session.data_digest_error(&frame.bhs);
                self.apply(actions);
                continue;
            }
            let bhs = frame.bhs;
            let actions = match Pdu::from_frame(frame) {
                Ok(pdu) => self.session.receive(pdu, catalog),
                Err(PduError::UnknownOpcode(_)) => self
                    .session
                    .unparseable(&bhs, reject_reason::COMMAND_NOT_SUPPORTED),
                Err(_) => self
                    .session
                    .unparseable(&bhs, reject_reason::INVALID_PDU_FIELD),
            };
            self.apply(actions);
        }
        Ok(())
    }

    fn apply(&mut self, actions: Vec<Action>) {
        let mut actions = actions.into_iter();
        while let Some(action) = actions.next() {
            match action {
                Action::Send(pdu) => self.out.pdu(&pdu, self.digests),
                Action::Execute(command) => {
                    let Some(target) = self.target.clone() else {
                        continue;
                    };
                    let itt = command.tag;
                    let (handle, registration) = AbortHandle::new_pair();
                    self.aborts.insert(itt, handle);
                    let work =
                        Abortable::new(async move { target.execute(command).await }, registration);
                    let mut fut = async move {
                        match work.await {
                            Ok(response) => Done::Command(itt, response),
                            Err(_) => Done::Aborted,
                        }
                    }
                    .boxed();
                    match (&mut fut).now_or_never() {
                        Some(done) => self.finished(done),
                        None => self.running.push(fut),
                    }
                }
                Action::Abort(itt) => {
                    if let Some(handle) = self.aborts.remove(&itt) {
                        handle.abort();
                    }
                }
                Action::Reset { itt, reset } => {
                    let Some(target) = self.target.clone() else {
                        let actions = self.session.reset_done(itt);
                        self.apply(actions);
                        continue;
                    };
                    let nexus = self.session.nexus().clone();
                    self.running.push(
                        async move {
                            target.reset(&nexus, reset).await;
                            Done::Reset(itt)
                        }
                        .boxed(),
                    );
                }
                Action::EndNexus => {
                    self.nexus_ended = true;
                    let Some(target) = self.target.clone() else {
                        continue;
                    };
                    // State the nexus held (a RESERVE(6)) may live in the
                    // directory: release it before the logout is answered,
                    // so the initiator never sees it still held.
                    let nexus = self.session.nexus().clone();
                    let rest: Vec<Action> = actions.collect();
                    self.running.push(
                        async move {
                            target.nexus_ended(&nexus).await;
                            Done::NexusEnded(rest)
                        }
                        .boxed(),
                    );
                    return;
                }
                Action::Close => self.closing = true,
            }
        }
    }

    fn finished(&mut self, done: Done) {
        let actions = match done {
            Done::Command(itt, response) => {
                self.aborts.remove(&itt);
                self.session.complete(itt, response)
            }
            Done::Aborted => return,
            Done::Reset(itt) => self.session.reset_done(itt),
            Done::NexusEnded(rest) => rest,
        };
        self.apply(actions);
    }
}

impl Drop for Connection<'_> {
    fn drop(&mut self) {
        for (_, handle) in self.aborts.drain() {
            handle.abort();
        }
        let counters = self.session.counters();
        tracing::debug!(
            "iSCSI connection of {} ended: {} commands, {} rejects",
            self.session.nexus().initiator_port,
            counters.commands,
            counters.rejects
        );
    }
}
