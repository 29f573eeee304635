//! One host's transport: its listener, its connections to peers, its calls.
//!
//! Owns: the connection pool (one connection per peer and queue class,
//! opened on first use and reopened after a failure) and the rules of a call
//! (fault hooks first, then connection, then the bounded wait for the
//! answer).
//!
//! Invariant: no background task holds the transport itself, so dropping the
//! last handle (or calling [`Transport::shutdown`]) stops the listener and
//! closes every connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tessera_env::SeededRng;
use tessera_types::HostId;
use tessera_wire::{Message, QueueClass, Request, Response};
use tokio::net::TcpSocket;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::{CallFailure, ClientConnection};
use crate::faults::FaultHooks;
use crate::server::{accept_loop, ServerContext};
use crate::stats::{Counters, PeerStats, TransportStats};
use crate::{
    PartitionBehaviour, RequestHandler, TransportConfig, TransportError, CONNECT_ATTEMPTS_PER_CALL,
};

/// Connections a listener lets wait for `accept`.
const LISTEN_BACKLOG: u32 = 1024;

type PoolKey = (HostId, QueueClass);

/// A host's end of the host-to-host RPC. Share it with `Arc`.
pub struct Transport {
    host: HostId,
    local_addr: SocketAddr,
    config: TransportConfig,
    faults: FaultHooks,
    counters: Arc<Counters>,
    pool: Mutex<HashMap<PoolKey, Arc<ClientConnection>>>,
    /// One lock per key, so that concurrent first calls to a peer open one
    /// connection, not many.
    connecting: Mutex<HashMap<PoolKey, Arc<tokio::sync::Mutex<()>>>>,
    shutdown: watch::Sender<bool>,
    /// The listening socket until [`Transport::serve`] hands it to the
    /// accept loop.
    listener: Mutex<Option<tokio::net::TcpListener>>,
    accept_task: Mutex<Option<JoinHandle<()>>>,
    /// The runtime the transport was made on (the host's): connections are
    /// opened there, so their sockets and reader tasks live on the host's
    /// threads whichever runtime a caller runs on.
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("host", &self.host)
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl Transport {
    /// Starts serving `handler` for host `host` on `listen` (port 0 picks a
    /// free port; see [`Transport::local_addr`]). Drops and jitter of the
    /// fault hooks draw from an entropy-seeded generator.
    pub async fn bind(
        host: HostId,
        listen: SocketAddr,
        handler: Arc<dyn RequestHandler>,
        config: TransportConfig,
    ) -> Result<Transport, TransportError> {
        let faults = FaultHooks::new(Arc::new(SeededRng::from_entropy()));
        Transport::bind_with_faults(host, listen, handler, config, faults).await
    }

    /// Like [`Transport::bind`], with a given fault table: share one table
    /// between the transports of an in-process cluster, and seed its
    /// generator so that a test reproduces.
    pub async fn bind_with_faults(
        host: HostId,
        listen: SocketAddr,
        handler: Arc<dyn RequestHandler>,
        config: TransportConfig,
        faults: FaultHooks,
    ) -> Result<Transport, TransportError> {
        let transport = Transport::listen(host, listen, config, faults)?;
        transport.serve(handler)?;
        Ok(transport)
    }

    /// Opens the listening socket without serving yet: calls to peers work
    /// at once, and peers' connections wait in the backlog until
    /// [`Transport::serve`]. For a handler that needs the transport itself
    /// (a coordinator that forwards or mirrors through it).
    pub fn listen(
        host: HostId,
        listen: SocketAddr,
        config: TransportConfig,
        faults: FaultHooks,
    ) -> Result<Transport, TransportError> {
        let bind_error = |source| TransportError::Bind {
            host: host.clone(),
            addr: listen,
            source,
        };
        let socket = if listen.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }
        .map_err(bind_error)?;
        // A restarted host must get its port back while old connections
        // linger in TIME_WAIT.
        socket.set_reuseaddr(true).map_err(bind_error)?;
        socket.bind(listen).map_err(bind_error)?;
        let listener = socket.listen(LISTEN_BACKLOG).map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| bind_error(std::io::Error::other(format!("no async runtime: {e}"))))?;
        let (shutdown, _) = watch::channel(false);
        tracing::info!(%host, %local_addr, "transport listening");
        Ok(Transport {
            host,
            local_addr,
            config,
            faults,
            counters: Arc::new(Counters::default()),
            pool: Mutex::new(HashMap::new()),
            connecting: Mutex::new(HashMap::new()),
            shutdown,
            listener: Mutex::new(Some(listener)),
            accept_task: Mutex::new(None),
            runtime,
        })
    }

    /// Starts answering peers' requests with `handler`. A transport serves
    /// one handler for its whole life: a second call is refused.
    pub fn serve(&self, handler: Arc<dyn RequestHandler>) -> Result<(), TransportError> {
        let Some(listener) = self.listener.lock().take() else {
            return Err(TransportError::AlreadyServing {
                host: self.host.clone(),
            });
        };
        let context = Arc::new(ServerContext {
            host: self.host.clone(),
            handler,
            faults: self.faults.clone(),
            config: self.config.clone(),
            counters: self.counters.clone(),
        });
        let task = tokio::spawn(accept_loop(listener, context, self.shutdown.subscribe()));
        *self.accept_task.lock() = Some(task);
        Ok(())
    }

    /// This host.
    pub fn host(&self) -> &HostId {
        &self.host
    }

    /// The address peers reach this host at.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The settings.
    pub fn config(&self) -> &TransportConfig {
        &self.config
    }

    /// The fault hooks (shared with every transport bound with the same
    /// table).
    pub fn faults(&self) -> &FaultHooks {
        &self.faults
    }

    /// The counters since the transport started.
    pub fn stats(&self) -> TransportStats {
        self.counters.snapshot()
    }

    /// Calls this host made to each peer, with their round trips.
    pub fn peer_stats(&self) -> Vec<PeerStats> {
        self.counters.peer_snapshots()
    }

    /// Sends `request` to host `to` at `addr` in queue `class` and waits for
    /// the answer, at most the configured call timeout.
    pub async fn call(
        &self,
        to: &HostId,
        addr: SocketAddr,
        class: QueueClass,
        request: Request,
    ) -> Result<Response, TransportError> {
        self.call_with_timeout(to, addr, class, request, self.config.call_timeout)
            .await
    }

    /// [`Transport::call`] with a timeout of the caller's choosing (a large
    /// resync read may take longer than a guest write may).
    pub async fn call_with_timeout(
        &self,
        to: &HostId,
        addr: SocketAddr,
        class: QueueClass,
        request: Request,
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        let peer = self.counters.peer(to);
        let started = tokio::time::Instant::now();
        let result = self.call_bounded(to, addr, class, request, timeout).await;
        let outcome = match &result {
            Ok(_) => Ok(()),
            Err(e) => Err(matches!(e, TransportError::Timeout { .. })),
        };
        peer.record(started.elapsed(), outcome);
        result
    }

    async fn call_bounded(
        &self,
        to: &HostId,
        addr: SocketAddr,
        class: QueueClass,
        request: Request,
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        if *self.shutdown.borrow() {
            return Err(TransportError::Shutdown {
                host: self.host.clone(),
            });
        }
        if self.faults.take_injected_failure(&self.host, to) {
            return Err(TransportError::Injected {
                peer: to.clone(),
                addr,
            });
        }
        if self.config.partition_behaviour == PartitionBehaviour::FailFast
            && (self.faults.is_blocked(&self.host, to) || self.faults.is_blocked(to, &self.host))
        {
            return Err(TransportError::Partitioned {
                peer: to.clone(),
                addr,
            });
        }
        let message = Message::Request(request);
        let mut used = None;
        let call = self.call_on_connection(to, addr, class, &message, &mut used);
        let outcome = tokio::time::timeout(timeout, call).await;
        match outcome {
            Ok(result) => result,
            Err(_) => {
                // A connection that stayed silent for a whole timeout may be
                // dead without the kernel knowing (a peer that vanished
                // without a reset), and one whose frame the timeout cut
                // short is closed: the next call opens a new one.
                if let Some((connection, received)) = used {
                    if connection.frames_received() == received || !connection.is_open() {
                        self.forget(&connection, class);
                        tokio::spawn(async move {
                            connection
                                .shut_down("silent for a whole call timeout")
                                .await
                        });
                    }
                }
                Err(TransportError::Timeout {
                    peer: to.clone(),
                    addr,
                    after: timeout,
                })
            }
        }
    }

    async fn call_on_connection(
        &self,
        to: &HostId,
        addr: SocketAddr,
        class: QueueClass,
        message: &Message,
        used: &mut Option<(Arc<ClientConnection>, u64)>,
    ) -> Result<Response, TransportError> {
        let mut last_reason = String::new();
        for _ in 0..CONNECT_ATTEMPTS_PER_CALL {
            let connection = self.connection(to, addr, class).await?;
            *used = Some((connection.clone(), connection.frames_received()));
            match connection
                .call(&self.host, &self.faults, &self.counters, message)
                .await
            {
                Ok(response) => return Ok(response),
                Err(CallFailure::NotSent(reason)) => {
                    self.forget(&connection, class);
                    last_reason = reason;
                }
                Err(CallFailure::Lost(reason)) => {
                    self.forget(&connection, class);
                    return Err(TransportError::ConnectionLost {
                        peer: to.clone(),
                        addr,
                        reason,
                    });
                }
                Err(CallFailure::Encode(source)) => {
                    return Err(TransportError::Encode {
                        peer: to.clone(),
                        addr,
                        source: Box::new(source),
                    })
                }
            }
        }
        Err(TransportError::ConnectionLost {
            peer: to.clone(),
            addr,
            reason: last_reason,
        })
    }

    /// Drops `connection` from the pool (if it is still the pooled one), so
    /// the next call opens a new one.
    fn forget(&self, connection: &Arc<ClientConnection>, class: QueueClass) {
        let mut pool = self.pool.lock();
        let key = (connection.peer.clone(), class);
        if pool
            .get(&key)
            .is_some_and(|pooled| Arc::ptr_eq(pooled, connection))
        {
            pool.remove(&key);
        }
    }

    fn pooled(&self, key: &PoolKey, addr: SocketAddr) -> Option<Arc<ClientConnection>> {
        self.pool
            .lock()
            .get(key)
            .filter(|c| c.addr == addr && c.is_open())
            .cloned()
    }

    async fn connection(
        &self,
        to: &HostId,
        addr: SocketAddr,
        class: QueueClass,
    ) -> Result<Arc<ClientConnection>, TransportError> {
        let key = (to.clone(), class);
        if let Some(connection) = self.pooled(&key, addr) {
            return Ok(connection);
        }
        let lock = self
            .connecting
            .lock()
            .entry(key.clone())
            .or_default()
            .clone();
        let _connecting = lock.lock().await;
        if let Some(connection) = self.pooled(&key, addr) {
            return Ok(connection);
        }
        let (host, peer) = (self.host.clone(), to.clone());
        let (config, faults, counters) = (
            self.config.clone(),
            self.faults.clone(),
            self.counters.clone(),
        );
        let connecting = self.runtime.spawn(async move {
            ClientConnection::connect(&host, &peer, addr, class, &config, &faults, &counters).await
        });
        let connection = Arc::new(connecting.await.map_err(|e| TransportError::Handshake {
            peer: to.clone(),
            addr,
            reason: format!("the connecting task failed: {e}"),
        })??);
        let replaced = self.pool.lock().insert(key, connection.clone());
        if let Some(old) = replaced {
            // The peer moved or the old connection broke: close it so that its
            // reader task ends.
            tokio::spawn(async move { old.shut_down("replaced by a new connection").await });
        }
        Ok(connection)
    }

    /// Stops listening, closes every connection (waiting callers fail) and
    /// waits until the listening port is free again.
    pub async fn shutdown(&self) {
        self.shutdown.send_replace(true);
        self.listener.lock().take();
        let connections: Vec<_> = self.pool.lock().drain().map(|(_, c)| c).collect();
        for connection in connections {
            connection.shut_down("transport shut down").await;
        }
        let task = self.accept_task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
    }
}
