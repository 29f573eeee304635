//! The calling side of one connection to a peer.
//!
//! Owns: the connection's write half (callers write their own frames under a
//! lock: no writer task, no handoff), the frames of calls started under a
//! plug, the table of requests waiting for an answer, and the reader task
//! that hands each response to its caller.
//!
//! A connection's task starts the requests it has read one after another in
//! one plugged poll (`tessera_env::plug`); the copies they send to one peer
//! are queued and written together when that poll ends, in one vectored
//! write, so the peer also reads them with one wake-up. A socket that does
//! not take them all at once, or a write already under way, hands the rest
//! to a task that finishes it.
//!
//! Invariants: a request id is in the waiting table only while its caller
//! waits (a guard removes it on answer, timeout or cancellation); once the
//! connection closes, no caller is left waiting: the reader drains the table
//! and later callers see the connection closed before they send. Frames are
//! written whole, one after the other, under the write half's lock; a
//! queued frame is written by the end of the poll that queued it or by the
//! task it was handed to, or its caller fails with the connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tessera_types::HostId;
use tessera_wire::{
    encode_frame, EncodedFrame, Message, QueueClass, Request, Response, WireErrorKind, WireVersion,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{oneshot, OwnedMutexGuard, Semaphore};
use tokio::task::AbortHandle;

use crate::faults::{FaultHooks, FrameFate};
use crate::io::{
    split_link, split_tcp, write_frame, write_frames_after, write_frames_now, FrameReader,
    LinkReader, LinkWriter, WrittenNow,
};
use crate::stats::{bump, Counters};
use crate::{TransportConfig, TransportError, MAX_IN_FLIGHT_PER_CONNECTION};

/// Request id of the handshake; calls count from 1.
const HELLO_REQUEST_ID: u64 = 0;

#[derive(Default)]
struct Waiting {
    callers: HashMap<u64, oneshot::Sender<Response>>,
    /// Set once the connection is closed, with why.
    closed: Option<String>,
}

/// Why a call on a connection failed.
pub(crate) enum CallFailure {
    /// The connection was already closed; nothing was sent, so the call may
    /// be retried on a new connection.
    NotSent(String),
    /// The connection broke after the request may have been sent.
    Lost(String),
    /// The request cannot be encoded.
    Encode(tessera_wire::WireError),
}

/// One open connection to a peer, for one queue class.
pub(crate) struct ClientConnection {
    pub(crate) peer: HostId,
    pub(crate) addr: SocketAddr,
    class: QueueClass,
    version: WireVersion,
    sending: Arc<Sending>,
    waiting: Arc<Mutex<Waiting>>,
    /// Frames received so far: a call that times out while this did not
    /// move has seen the connection silent for its whole timeout.
    received: Arc<AtomicU64>,
    slots: Semaphore,
    next_id: AtomicU64,
    reader: AbortHandle,
}

impl Drop for ClientConnection {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn close(waiting: &Mutex<Waiting>, reason: String) {
    let mut w = waiting.lock();
    if w.closed.is_none() {
        w.closed = Some(reason);
    }
    // Dropping the senders wakes every caller with "connection lost".
    w.callers.clear();
}

/// The write side of a connection, shared by its callers.
struct Sending {
    stream: Arc<tokio::sync::Mutex<LinkWriter>>,
    /// Frames of calls started under a plug, not yet handed to the stream.
    queued: Mutex<Vec<EncodedFrame>>,
    waiting: Arc<Mutex<Waiting>>,
    counters: Arc<Counters>,
}

impl Sending {
    /// Queues `frame` to be written when the plug open on this thread
    /// closes, with the frames other calls queue before then.
    fn queue_under_plug(self: &Arc<Self>, frame: EncodedFrame) {
        let first = {
            let mut queued = self.queued.lock();
            queued.push(frame);
            queued.len() == 1
        };
        // The first frame of a batch arranges its write; later ones ride
        // along (a batch taken before they came is followed by their own).
        if first {
            let sending = Arc::clone(self);
            if let Err(write) = tessera_env::plug::defer(move || sending.write_queued()) {
                write();
            }
        }
    }

    /// Writes the queued frames, as far as the socket takes them now; the
    /// rest, or all of them when another write holds the stream, goes to a
    /// task that finishes the write.
    fn write_queued(self: Arc<Self>) {
        let frames = std::mem::take(&mut *self.queued.lock());
        if frames.is_empty() {
            return;
        }
        let Ok(mut stream) = Arc::clone(&self.stream).try_lock_owned() else {
            tokio::spawn(async move {
                let stream = Arc::clone(&self.stream).lock_owned().await;
                self.finish(stream, frames, 0).await;
            });
            return;
        };
        if self.waiting.lock().closed.is_some() {
            // Their callers have already failed with the connection.
            return;
        }
        bump(&self.counters.request_writes);
        match write_frames_now(&mut *stream, &frames) {
            Ok(WrittenNow::All) => {}
            Ok(WrittenNow::Part(written)) => {
                tokio::spawn(async move { self.finish(stream, frames, written).await });
            }
            Err(e) => close(&self.waiting, format!("write failed: {e}")),
        }
    }

    /// Writes what is left of `frames` after `written` bytes.
    async fn finish(
        &self,
        mut stream: OwnedMutexGuard<LinkWriter>,
        frames: Vec<EncodedFrame>,
        written: usize,
    ) {
        // A frame cut short by a cancelled call has broken the framing:
        // nothing may follow it (and a frame begun here is finished).
        if written == 0 && self.waiting.lock().closed.is_some() {
            return;
        }
        if written == 0 {
            bump(&self.counters.request_writes);
        }
        if let Err(e) = write_frames_after(&mut *stream, &frames, written).await {
            close(&self.waiting, format!("write failed: {e}"));
        }
    }
}

/// Removes a caller from the waiting table however its call ends.
struct WaitGuard<'a> {
    waiting: &'a Mutex<Waiting>,
    id: u64,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.waiting.lock().callers.remove(&self.id);
    }
}

/// Closes the connection if a call is cancelled (its caller's timeout, a
/// dropped future) in the middle of writing its frame: the peer would read
/// the next frame's bytes as the rest of this one.
struct CutShortGuard<'a> {
    waiting: &'a Mutex<Waiting>,
    armed: bool,
}

impl CutShortGuard<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for CutShortGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            close(
                self.waiting,
                "a call was cancelled in the middle of sending its frame".into(),
            );
        }
    }
}

impl ClientConnection {
    /// Connects to `peer` at `addr` and performs the handshake.
    pub(crate) async fn connect(
        local: &HostId,
        peer: &HostId,
        addr: SocketAddr,
        class: QueueClass,
        config: &TransportConfig,
        faults: &FaultHooks,
        counters: &Arc<Counters>,
    ) -> Result<ClientConnection, TransportError> {
        let connect_error = |source| TransportError::Connect {
            peer: peer.clone(),
            addr,
            source,
        };
        let stream = tokio::time::timeout(config.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| connect_error(std::io::ErrorKind::TimedOut.into()))?
            .map_err(connect_error)?;
        stream.set_nodelay(true).map_err(connect_error)?;
        let (read_half, mut write_half) = match &config.tls {
            None => split_tcp(stream),
            Some(tls) => {
                let connector = tokio_rustls::TlsConnector::from(Arc::clone(&tls.client));
                let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
                let stream =
                    tokio::time::timeout(config.connect_timeout, connector.connect(name, stream))
                        .await
                        .map_err(|_| connect_error(std::io::ErrorKind::TimedOut.into()))?
                        .map_err(|e| TransportError::Handshake {
                            peer: peer.clone(),
                            addr,
                            reason: format!("TLS: {e}"),
                        })?;
                split_link(stream)
            }
        };
        let mut reader = FrameReader::new(read_half);

        let handshake = async {
            let hello = Message::Request(Request::Hello {
                versions: config.versions,
                host: local.clone(),
            });
            let frame = encode_frame(WireVersion::CURRENT, HELLO_REQUEST_ID, class, &hello)
                .map_err(|source| TransportError::Encode {
                    peer: peer.clone(),
                    addr,
                    source: Box::new(source),
                })?;
            match faults.fate(local, peer) {
                FrameFate::Drop => bump(&counters.frames_lost_to_faults),
                FrameFate::Deliver(delay) => {
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    write_frame(&mut write_half, &frame)
                        .await
                        .map_err(connect_error)?;
                }
            }
            loop {
                let frame = reader
                    .next()
                    .await
                    .map_err(|e| TransportError::Handshake {
                        peer: peer.clone(),
                        addr,
                        reason: e.to_string(),
                    })?
                    .ok_or_else(|| TransportError::Handshake {
                        peer: peer.clone(),
                        addr,
                        reason: "connection closed during the handshake".into(),
                    })?;
                if faults.is_blocked(peer, local) {
                    bump(&counters.frames_lost_to_faults);
                    continue;
                }
                return match frame.message {
                    Message::Response(Response::HelloOk { version, host }) => {
                        if &host != peer {
                            return Err(TransportError::WrongHost {
                                peer: peer.clone(),
                                addr,
                                actual: host,
                            });
                        }
                        Ok(version)
                    }
                    Message::Response(Response::Error {
                        kind: WireErrorKind::NoCommonVersion { supported },
                        ..
                    }) => Err(TransportError::VersionMismatch {
                        peer: peer.clone(),
                        addr,
                        ours: config.versions,
                        theirs: supported,
                    }),
                    other => Err(TransportError::Handshake {
                        peer: peer.clone(),
                        addr,
                        reason: format!("expected HelloOk, got {}", other.kind()),
                    }),
                };
            }
        };
        // The caller's timeout bounds the handshake too; this one keeps a
        // silent peer from holding a connection slot for the whole call.
        let version = tokio::time::timeout(config.connect_timeout, handshake)
            .await
            .map_err(|_| TransportError::Timeout {
                peer: peer.clone(),
                addr,
                after: config.connect_timeout,
            })??;

        let waiting = Arc::new(Mutex::new(Waiting::default()));
        let received = Arc::new(AtomicU64::new(0));
        let reader = tokio::spawn(read_responses(
            reader,
            waiting.clone(),
            received.clone(),
            local.clone(),
            peer.clone(),
            faults.clone(),
            counters.clone(),
        ))
        .abort_handle();
        bump(&counters.connections_opened);
        Ok(ClientConnection {
            peer: peer.clone(),
            addr,
            class,
            version,
            sending: Arc::new(Sending {
                stream: Arc::new(tokio::sync::Mutex::new(write_half)),
                queued: Mutex::new(Vec::new()),
                waiting: Arc::clone(&waiting),
                counters: Arc::clone(counters),
            }),
            waiting,
            received,
            slots: Semaphore::new(MAX_IN_FLIGHT_PER_CONNECTION),
            next_id: AtomicU64::new(HELLO_REQUEST_ID + 1),
            reader,
        })
    }

    /// Frames received so far.
    pub(crate) fn frames_received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Whether the connection can still carry calls.
    pub(crate) fn is_open(&self) -> bool {
        self.waiting.lock().closed.is_none()
    }

    /// Closes the connection: waiting callers fail, the peer sees the end.
    pub(crate) async fn shut_down(&self, reason: &str) {
        close(&self.waiting, reason.to_string());
        self.reader.abort();
        let _ = self.sending.stream.lock().await.shutdown().await;
    }

    /// Sends `request` and waits for its answer (no timeout here: the
    /// transport bounds the whole call).
    pub(crate) async fn call(
        &self,
        local: &HostId,
        faults: &FaultHooks,
        counters: &Counters,
        request: &Message,
    ) -> Result<Response, CallFailure> {
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| CallFailure::NotSent("connection closed".into()))?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame =
            encode_frame(self.version, id, self.class, request).map_err(CallFailure::Encode)?;
        let (tx, rx) = oneshot::channel();
        {
            let mut w = self.waiting.lock();
            if let Some(reason) = &w.closed {
                return Err(CallFailure::NotSent(reason.clone()));
            }
            w.callers.insert(id, tx);
        }
        let _guard = WaitGuard {
            waiting: &self.waiting,
            id,
        };
        match faults.fate(local, &self.peer) {
            FrameFate::Drop => bump(&counters.frames_lost_to_faults),
            FrameFate::Deliver(delay) if delay.is_zero() && tessera_env::plug::is_open() => {
                self.sending.queue_under_plug(frame);
            }
            FrameFate::Deliver(delay) => {
                if delay > Duration::ZERO {
                    tokio::time::sleep(delay).await;
                }
                let mut writer = self.sending.stream.lock().await;
                // A frame cut short by an earlier cancelled call has broken
                // the stream's framing: nothing may follow it.
                if let Some(reason) = self.waiting.lock().closed.clone() {
                    return Err(CallFailure::NotSent(reason));
                }
                let cut_short = CutShortGuard {
                    waiting: &self.waiting,
                    armed: true,
                };
                bump(&counters.request_writes);
                let written = write_frame(&mut *writer, &frame).await;
                cut_short.disarm();
                if let Err(e) = written {
                    let reason = format!("write failed: {e}");
                    close(&self.waiting, reason.clone());
                    return Err(CallFailure::Lost(reason));
                }
            }
        }
        rx.await.map_err(|_| {
            CallFailure::Lost(
                self.waiting
                    .lock()
                    .closed
                    .clone()
                    .unwrap_or_else(|| "connection closed".into()),
            )
        })
    }
}

/// Hands each response to its caller until the stream ends.
async fn read_responses(
    mut reader: FrameReader<LinkReader>,
    waiting: Arc<Mutex<Waiting>>,
    received: Arc<AtomicU64>,
    local: HostId,
    peer: HostId,
    faults: FaultHooks,
    counters: Arc<Counters>,
) {
    let reason = loop {
        match reader.next().await {
            Ok(Some(frame)) => {
                received.fetch_add(1, Ordering::Relaxed);
                if faults.is_blocked(&peer, &local) {
                    bump(&counters.frames_lost_to_faults);
                    continue;
                }
                match frame.message {
                    Message::Response(response) => {
                        let caller = waiting.lock().callers.remove(&frame.header.request_id);
                        // No caller: it gave up (timeout) before the answer came.
                        if let Some(caller) = caller {
                            let _ = caller.send(response);
                        }
                    }
                    Message::Request(request) => {
                        break format!(
                            "peer sent a {} request on a calling connection",
                            request.kind()
                        );
                    }
                }
            }
            Ok(None) => break "peer closed the connection".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    tracing::debug!(%peer, %reason, "connection closed");
    close(&waiting, reason);
}
