//! The serving side: accepting connections and answering their requests.
//!
//! Owns: the accept loop, the handshake a new connection must pass, and one
//! task per connection that reads requests and serves them concurrently
//! inside itself (no task per request), so a slow request (a resync read, a
//! flush) never holds back the ones behind it. That task alone writes the
//! answers: those ready at the same moment go out in one vectored write.
//!
//! Invariants: a connection serves requests only after a successful `Hello`;
//! at most [`MAX_IN_FLIGHT_PER_CONNECTION`] requests of one connection run at
//! once (the task stops reading until one ends); a malformed frame or a
//! protocol violation closes the connection and is logged with the peer.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::stream::StreamExt;
use tessera_env::InFlight;
use tessera_types::HostId;
use tessera_wire::{
    encode_frame, EncodedFrame, Message, QueueClass, Request, Response, WireErrorKind, WireVersion,
};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::faults::{FaultHooks, FrameFate};
use crate::io::{
    split_link, split_tcp, write_frames, FrameReader, LinkReader, LinkWriter,
    HANDSHAKE_FRAME_BYTES_MAX,
};
use crate::stats::{bump, Counters};
use crate::{RequestHandler, TransportConfig, MAX_IN_FLIGHT_PER_CONNECTION};

/// What every served connection needs.
pub(crate) struct ServerContext {
    pub(crate) host: HostId,
    pub(crate) handler: Arc<dyn RequestHandler>,
    pub(crate) faults: FaultHooks,
    pub(crate) config: TransportConfig,
    pub(crate) counters: Arc<Counters>,
}

/// Accepts connections until `shutdown` turns true.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    context: Arc<ServerContext>,
    mut shutdown: watch::Receiver<bool>,
) {
    let for_connections = shutdown.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => {
                    tokio::spawn(serve_connection(stream, remote, context.clone(), for_connections.clone()));
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait a little
                    // rather than spin, and keep serving the open connections.
                    tracing::warn!(host = %context.host, error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = stopped(&mut shutdown) => break,
        }
    }
}

/// Resolves once the transport shuts down.
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // An error means the transport is gone, which is a shutdown too.
    let _ = shutdown.wait_for(|down| *down).await;
}

type SharedWriter = Arc<tokio::sync::Mutex<LinkWriter>>;

/// The frame answering `request_id`, once any delay the fault hooks ask
/// for has passed; `None` when they drop it.
async fn response_frame(
    context: &ServerContext,
    peer: &HostId,
    version: WireVersion,
    request_id: u64,
    class: QueueClass,
    response: Response,
) -> Option<EncodedFrame> {
    let message = Message::Response(response);
    let frame = match encode_frame(version, request_id, class, &message) {
        Ok(frame) => frame,
        Err(e) => {
            // The handler built an answer too large for one frame: tell the
            // caller rather than leave it waiting for its timeout.
            tracing::error!(host = %context.host, %peer, error = %e, "response cannot be encoded");
            let error = Message::Response(Response::error(
                WireErrorKind::Io,
                format!("host {} cannot send the response: {e}", context.host),
            ));
            encode_frame(version, request_id, class, &error).ok()?
        }
    };
    match context.faults.fate(&context.host, peer) {
        FrameFate::Drop => {
            bump(&context.counters.frames_lost_to_faults);
            None
        }
        FrameFate::Deliver(delay) => {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Some(frame)
        }
    }
}

/// Sends one answer (the handshake's).
async fn send_response(
    writer: &SharedWriter,
    context: &ServerContext,
    peer: &HostId,
    version: WireVersion,
    request_id: u64,
    class: QueueClass,
    response: Response,
) {
    let frame = response_frame(context, peer, version, request_id, class, response).await;
    send_responses(writer, context, peer, &mut frame.into_iter().collect()).await;
}

/// Sends the answers in `out` (and empties it) with as few writes as
/// their size allows.
async fn send_responses(
    writer: &SharedWriter,
    context: &ServerContext,
    peer: &HostId,
    out: &mut Vec<EncodedFrame>,
) {
    if out.is_empty() {
        return;
    }
    let mut w = writer.lock().await;
    bump(&context.counters.answer_writes);
    if let Err(e) = write_frames(&mut *w, out).await {
        tracing::debug!(host = %context.host, %peer, error = %e, "responses not sent");
    }
    out.clear();
}

async fn serve_connection(
    stream: TcpStream,
    remote: SocketAddr,
    context: Arc<ServerContext>,
    mut shutdown: watch::Receiver<bool>,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%remote, error = %e, "cannot set TCP_NODELAY");
    }
    let (read_half, write_half) = match &context.config.tls {
        None => split_tcp(stream),
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&tls.server));
            let accepted =
                tokio::time::timeout(context.config.connect_timeout * 2, acceptor.accept(stream))
                    .await;
            match accepted {
                Ok(Ok(stream)) => split_link(stream),
                Ok(Err(e)) => {
                    // A peer without a certificate of the cluster CA, or
                    // something that is not a host at all.
                    tracing::warn!(host = %context.host, %remote, error = %e, "refused a connection: TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(host = %context.host, %remote, "no TLS handshake in time; closing");
                    return;
                }
            }
        }
    };
    let writer: SharedWriter = Arc::new(tokio::sync::Mutex::new(write_half));
    let mut reader = FrameReader::new(read_half);
    reader.set_limit(HANDSHAKE_FRAME_BYTES_MAX);

    // Twice the caller's own handshake limit: a caller that gives up sees
    // its timeout, not a connection closed under it.
    let handshake = tokio::time::timeout(
        context.config.connect_timeout * 2,
        handshake(&mut reader, &writer, &context, remote),
    )
    .await;
    let (peer, version) = match handshake {
        Ok(Some(done)) => done,
        Ok(None) => {
            let _ = writer.lock().await.shutdown().await;
            return;
        }
        Err(_) => {
            tracing::debug!(host = %context.host, %remote, "no Hello in time; closing");
            let _ = writer.lock().await.shutdown().await;
            return;
        }
    };

    reader.set_limit(tessera_wire::MAX_FRAME_BYTES);
    // The requests being served, polled by this task: no task is spawned
    // per request, so a request and its answer cost no hand-off between
    // threads. They still run concurrently: a slow one (a resync read, a
    // flush) does not hold back the ones behind it. Answers that are ready
    // together (a group commit acknowledges many writes at once) go out
    // together, in one vectored write instead of one each.
    let mut serving = InFlight::new();
    let mut out: Vec<EncodedFrame> = Vec::new();
    loop {
        if !out.is_empty() {
            for answer in serving.take_finished().await {
                out.extend(answer);
            }
            send_responses(&writer, &context, &peer, &mut out).await;
        }
        let full = serving.len() >= MAX_IN_FLIGHT_PER_CONNECTION;
        let next = tokio::select! {
            // Every frame that has arrived is taken before the requests are
            // polled: the writes among them are then staged in one poll of
            // the set, and share the group commit of the first (deferred to
            // the end of that poll, see `tessera_env::plug`).
            biased;
            // Reading a frame is cancel-safe: bytes read stay in the
            // reader's buffer for the next call.
            next = reader.next(), if !full => next,
            Some(answer) = serving.next(), if !serving.is_empty() => {
                out.extend(answer);
                continue;
            }
            _ = stopped(&mut shutdown) => break,
        };
        let frame = match next {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(host = %context.host, %peer, %remote, error = %e, "closing connection");
                bump(&context.counters.connections_closed_malformed);
                break;
            }
        };
        if context.faults.is_blocked(&peer, &context.host) {
            bump(&context.counters.frames_lost_to_faults);
            continue;
        }
        let request = match frame.message {
            Message::Request(Request::Hello { .. }) | Message::Response(_) => {
                tracing::warn!(
                    host = %context.host, %peer, %remote, kind = %frame.header.kind,
                    "protocol violation: unexpected message; closing connection"
                );
                bump(&context.counters.connections_closed_malformed);
                break;
            }
            Message::Request(request) => request,
        };
        let context = context.clone();
        let peer = peer.clone();
        let header = frame.header;
        serving.push(async move {
            let response = match request {
                Request::Ping => Response::Pong,
                request => {
                    let response = context
                        .handler
                        .handle(peer.clone(), header.class, request)
                        .await;
                    bump(&context.counters.requests_served);
                    response
                }
            };
            response_frame(
                &context,
                &peer,
                version,
                header.request_id,
                header.class,
                response,
            )
            .await
        });
    }
    // Requests already read are answered before the connection closes,
    // unless the transport is shutting down.
    if !*shutdown.borrow() {
        while let Some(answer) = serving.next().await {
            out.extend(answer);
        }
    }
    send_responses(&writer, &context, &peer, &mut out).await;
    let _ = writer.lock().await.shutdown().await;
}

/// Reads the `Hello`, negotiates the version and answers. `None` when the
/// connection must close.
async fn handshake(
    reader: &mut FrameReader<LinkReader>,
    writer: &SharedWriter,
    context: &ServerContext,
    remote: SocketAddr,
) -> Option<(HostId, WireVersion)> {
    loop {
        let frame = match reader.next().await {
            Ok(Some(frame)) => frame,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(host = %context.host, %remote, error = %e, "bad handshake; closing");
                bump(&context.counters.connections_closed_malformed);
                return None;
            }
        };
        let Message::Request(Request::Hello { versions, host }) = frame.message else {
            tracing::warn!(
                host = %context.host, %remote, kind = %frame.header.kind,
                "connection did not start with Hello; closing"
            );
            bump(&context.counters.connections_closed_malformed);
            return None;
        };
        if context.faults.is_blocked(&host, &context.host) {
            bump(&context.counters.frames_lost_to_faults);
            continue;
        }
        let id = frame.header.request_id;
        let class = frame.header.class;
        return match context.config.versions.negotiate(versions) {
            Ok(version) => {
                let ok = Response::HelloOk {
                    version,
                    host: context.host.clone(),
                };
                send_response(writer, context, &host, version, id, class, ok).await;
                bump(&context.counters.connections_accepted);
                Some((host, version))
            }
            Err(e) => {
                tracing::warn!(host = %context.host, peer = %host, %remote, error = %e, "refusing peer");
                let refusal = Response::error(
                    WireErrorKind::NoCommonVersion {
                        supported: context.config.versions,
                    },
                    format!("host {}: {e}", context.host),
                );
                // The refusal goes out in the oldest layout this build
                // speaks; handshake messages are the same in every version.
                send_response(
                    writer,
                    context,
                    &host,
                    WireVersion::OLDEST,
                    id,
                    class,
                    refusal,
                )
                .await;
                None
            }
        };
    }
}
