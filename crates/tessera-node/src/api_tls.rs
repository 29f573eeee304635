//! The API over HTTPS: a listener that hands axum connections whose TLS
//! handshake is done.
//!
//! Owns: accepting TCP connections for the API, running each TLS
//! handshake on a task of its own (a slow or silent client never holds up
//! the next one), and telling a client that speaks plain HTTP to an HTTPS
//! port what to use instead.
//! Must not touch: routes or credentials (`api`, `api_access`).
//! Invariant: every connection axum serves finished a TLS 1.3 handshake with
//! the host's certificate; nothing is served in plain text on this port.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Time a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed accept (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Handshakes finished but not yet taken by axum.
const READY_CONNECTIONS: usize = 64;
/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// A TCP listener whose connections come out with TLS established.
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    ready_tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    ready_rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    /// Serves TLS with `config` on `tcp`.
    pub fn new(tcp: TcpListener, config: Arc<rustls::ServerConfig>) -> Self {
        let (ready_tx, ready_rx) = mpsc::channel(READY_CONNECTIONS);
        Self {
            tcp,
            acceptor: TlsAcceptor::from(config),
            ready_tx,
            ready_rx,
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                Some(ready) = self.ready_rx.recv() => return ready,
                accepted = self.tcp.accept() => match accepted {
                    Ok((stream, addr)) => {
                        let acceptor = self.acceptor.clone();
                        let ready = self.ready_tx.clone();
                        tokio::spawn(async move {
                            if let Some(tls) = handshake(acceptor, stream, addr).await {
                                let _ = ready.send((tls, addr)).await;
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!("API accept failed: {e}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                },
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// The TLS handshake of one connection; None (and the connection closed)
/// when it fails or the client speaks plain HTTP.
async fn handshake(
    acceptor: TlsAcceptor,
    mut stream: TcpStream,
    addr: SocketAddr,
) -> Option<TlsStream<TcpStream>> {
    let outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let mut first = [0u8; 1];
        if stream.peek(&mut first).await.ok()? == 0 {
            return None;
        }
        if first[0] != TLS_HANDSHAKE_RECORD {
            plain_http_refused(&mut stream).await;
            return None;
        }
        match acceptor.accept(stream).await {
            Ok(tls) => Some(tls),
            Err(e) => {
                tracing::debug!(%addr, "API TLS handshake failed: {e}");
                None
            }
        }
    })
    .await;
    outcome.ok().flatten()
}

/// Answers a plain HTTP request on the HTTPS port with a 400 that says so,
/// in the API's JSON error shape.
async fn plain_http_refused(stream: &mut TcpStream) {
    let body = r#"{"kind":"invalid","message":"the Tessera API is served over HTTPS on this port: use https:// (the CA certificate is tls/ca-cert.pem in the data directory)"}"#;
    let response = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}
