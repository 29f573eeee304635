//! The etcd directory: the [`Directory`] trait on an etcd cluster (the
//! Debian `etcd-server`), for clusters of `tessera node` processes.
//!
//! Owns: the translation between the trait and etcd's v3 API (keys as UTF-8
//! strings, revisions, transactions, watches, leases) and the mapping of
//! etcd's errors onto [`DirectoryError`].
//!
//! Must not touch: key naming (that is [`crate::keys`]) or any policy on
//! top of the primitives; etcd already keeps the invariants the trait
//! promises (ordered watches, lease expiry deleting keys, one revision per
//! transaction), so this module only forwards them faithfully. A watch
//! reader that is slow makes the forwarding task wait (etcd buffers on its
//! side), so a lagging reader never loses events here.

use crate::{
    Compare, Directory, DirectoryError, KeyValue, Lease, LeaseId, Listing, Result, Revision, Txn,
    TxnOp, TxnOutcome, WatchEvent, WatchEventKind, WatchStream, WATCH_QUEUE_EVENTS_MAX,
};
use async_trait::async_trait;
use etcd_client as etcd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// How long connecting to an etcd endpoint may take.
pub const ETCD_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one etcd request may take before it is reported unavailable.
/// Owner leases are seconds long, so a request that takes longer is useless.
pub const ETCD_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The etcd directory backend. Cheap to clone.
///
/// etcd keeps every revision until compacted: run it with
/// `--auto-compaction-mode=revision --auto-compaction-retention=<revisions>`
/// or call [`Directory::compact`] periodically, or its database only grows.
#[derive(Clone)]
pub struct EtcdDirectory {
    client: etcd::Client,
    endpoints: Vec<String>,
}

/// TLS to etcd: the files a host presents and trusts.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdTls {
    /// The CA etcd's server certificate chains to (PEM).
    pub ca_cert: std::path::PathBuf,
    /// The client certificate this host presents (PEM).
    pub cert: std::path::PathBuf,
    /// Its private key (PEM).
    pub key: std::path::PathBuf,
}

impl EtcdTls {
    fn options(&self) -> std::result::Result<etcd::TlsOptions, String> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
        };
        Ok(etcd::TlsOptions::new()
            .ca_certificate(etcd::Certificate::from_pem(read(&self.ca_cert)?))
            .identity(etcd::Identity::from_pem(
                read(&self.cert)?,
                read(&self.key)?,
            )))
    }
}

impl std::fmt::Debug for EtcdDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdDirectory")
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

impl EtcdDirectory {
    /// Connects to the etcd cluster at `endpoints` (`http://host:port`) and
    /// checks that it answers.
    pub async fn connect(endpoints: &[String]) -> Result<EtcdDirectory> {
        Self::connect_with(endpoints, None).await
    }

    /// Connects over TLS (`https://host:port`): the server's certificate
    /// must chain to `tls.ca_cert`, and this client proves `tls.cert`
    /// (etcd started with `--client-cert-auth` admits no client without
    /// one from its trusted CA).
    pub async fn connect_tls(endpoints: &[String], tls: &EtcdTls) -> Result<EtcdDirectory> {
        Self::connect_with(endpoints, Some(tls)).await
    }

    async fn connect_with(endpoints: &[String], tls: Option<&EtcdTls>) -> Result<EtcdDirectory> {
        let mut options = etcd::ConnectOptions::new()
            .with_connect_timeout(ETCD_CONNECT_TIMEOUT)
            .with_timeout(ETCD_REQUEST_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), ETCD_REQUEST_TIMEOUT);
        if let Some(tls) = tls {
            options = options.with_tls(tls.options().map_err(|e| unavailable(endpoints, &e))?);
        }
        let client = etcd::Client::connect(endpoints, Some(options))
            .await
            .map_err(|e| unavailable(endpoints, &e))?;
        let directory = EtcdDirectory {
            client,
            endpoints: endpoints.to_vec(),
        };
        // The channel connects lazily: ask for something so a wrong address
        // fails here, with the endpoints in the message.
        let mut kv = directory.client.kv_client();
        kv.get("/", Some(etcd::GetOptions::new().with_count_only()))
            .await
            .map_err(|e| unavailable(endpoints, &e))?;
        Ok(directory)
    }

    /// The endpoints this client talks to.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    fn map(&self, e: etcd::Error) -> DirectoryError {
        map_error(e, None, &self.endpoints)
    }
}

fn unavailable(endpoints: &[String], e: &dyn std::fmt::Display) -> DirectoryError {
    DirectoryError::Unavailable {
        detail: format!("etcd at {}: {e}", endpoints.join(",")),
    }
}

fn map_error(e: etcd::Error, lease: Option<LeaseId>, endpoints: &[String]) -> DirectoryError {
    use tonic::Code;
    match &e {
        etcd::Error::GRpcStatus(status) => {
            let message = status.message();
            if message.contains("lease not found") {
                return DirectoryError::LeaseNotFound {
                    lease: lease.unwrap_or(LeaseId(0)),
                };
            }
            match status.code() {
                Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
                    DirectoryError::InvalidRequest {
                        detail: message.to_string(),
                    }
                }
                _ => unavailable(endpoints, &e),
            }
        }
        etcd::Error::LeaseKeepAliveError(message) if message.contains("not found") => {
            DirectoryError::LeaseNotFound {
                lease: lease.unwrap_or(LeaseId(0)),
            }
        }
        etcd::Error::InvalidArgs(message) => DirectoryError::InvalidRequest {
            detail: message.clone(),
        },
        _ => unavailable(endpoints, &e),
    }
}

fn revision_of(header: Option<&etcd::ResponseHeader>) -> Revision {
    header.map_or(0, |h| h.revision().max(0) as Revision)
}

fn key_value(kv: &etcd::KeyValue) -> Result<KeyValue> {
    let key = kv.key_str().map_err(|e| DirectoryError::Decode {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        detail: format!("key is not UTF-8: {e}"),
    })?;
    Ok(KeyValue {
        key: key.to_string(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision().max(0) as Revision,
        mod_revision: kv.mod_revision().max(0) as Revision,
        lease: (kv.lease() != 0).then_some(LeaseId(kv.lease())),
    })
}

fn put_options(lease: Option<LeaseId>) -> Option<etcd::PutOptions> {
    lease.map(|l| etcd::PutOptions::new().with_lease(l.0))
}

fn txn_op(op: &TxnOp) -> etcd::TxnOp {
    match op {
        TxnOp::Put { key, value, lease } => {
            etcd::TxnOp::put(key.as_str(), value.clone(), put_options(*lease))
        }
        TxnOp::Delete { key } => etcd::TxnOp::delete(key.as_str(), None),
    }
}

fn compare(c: &Compare) -> etcd::Compare {
    use etcd::CompareOp::Equal;
    match c {
        Compare::ModRevision { key, revision } => {
            etcd::Compare::mod_revision(key.as_str(), Equal, *revision as i64)
        }
        // A key that does not exist has create revision 0.
        Compare::Absent { key } => etcd::Compare::create_revision(key.as_str(), Equal, 0),
        Compare::Value { key, value } => etcd::Compare::value(key.as_str(), Equal, value.clone()),
    }
}

fn first_lease(ops: &[TxnOp]) -> Option<LeaseId> {
    ops.iter().find_map(|op| match op {
        TxnOp::Put { lease, .. } => *lease,
        TxnOp::Delete { .. } => None,
    })
}

#[async_trait]
impl Directory for EtcdDirectory {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let mut kv = self.client.kv_client();
        let response = kv.get(key, None).await.map_err(|e| self.map(e))?;
        response.kvs().first().map(key_value).transpose()
    }

    async fn list(&self, prefix: &str) -> Result<Listing> {
        let mut kv = self.client.kv_client();
        let response = kv
            .get(prefix, Some(etcd::GetOptions::new().with_prefix()))
            .await
            .map_err(|e| self.map(e))?;
        let entries = response
            .kvs()
            .iter()
            .map(key_value)
            .collect::<Result<Vec<_>>>()?;
        Ok(Listing {
            entries,
            revision: revision_of(response.header()),
        })
    }

    async fn put(&self, key: &str, value: Vec<u8>, lease: Option<LeaseId>) -> Result<Revision> {
        let mut kv = self.client.kv_client();
        let response = kv
            .put(key, value, put_options(lease))
            .await
            .map_err(|e| map_error(e, lease, &self.endpoints))?;
        Ok(revision_of(response.header()))
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        let mut kv = self.client.kv_client();
        let response = kv.delete(key, None).await.map_err(|e| self.map(e))?;
        Ok(response.deleted() > 0)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        txn.check()?;
        let lease = first_lease(&txn.on_success).or(first_lease(&txn.on_failure));
        let request = etcd::Txn::new()
            .when(txn.compares.iter().map(compare).collect::<Vec<_>>())
            .and_then(txn.on_success.iter().map(txn_op).collect::<Vec<_>>())
            .or_else(txn.on_failure.iter().map(txn_op).collect::<Vec<_>>());
        let mut kv = self.client.kv_client();
        let response = kv
            .txn(request)
            .await
            .map_err(|e| map_error(e, lease, &self.endpoints))?;
        Ok(TxnOutcome {
            succeeded: response.succeeded(),
            revision: revision_of(response.header()),
        })
    }

    async fn watch(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream> {
        let mut options = etcd::WatchOptions::new().with_prefix();
        if from_revision > 0 {
            options = options.with_start_revision(from_revision as i64);
        }
        let mut client = self.client.watch_client();
        let mut stream = client
            .watch(prefix, Some(options))
            .await
            .map_err(|e| self.map(e))?;
        let (tx, rx) = mpsc::channel(WATCH_QUEUE_EVENTS_MAX);
        let watch = WatchStream::new(prefix.to_string(), rx, Arc::new(AtomicBool::new(false)));
        let mut forward = WatchForward {
            prefix: prefix.to_string(),
            requested: from_revision,
            events: tx,
            endpoints: self.endpoints.clone(),
        };
        // Wait until etcd has created the watch, so that with
        // `from_revision == 0` no change after this call can be missed.
        match stream.message().await {
            Ok(Some(response)) => {
                if !forward.deliver(&response).await {
                    return Ok(watch);
                }
            }
            Ok(None) => {
                return Err(DirectoryError::Unavailable {
                    detail: format!("etcd closed the watch on {prefix:?} before creating it"),
                })
            }
            Err(e) => return Err(self.map(e)),
        }
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = forward.events.closed() => return,
                    message = stream.message() => match message {
                        Ok(Some(response)) => {
                            if !forward.deliver(&response).await {
                                return;
                            }
                        }
                        Ok(None) => {
                            forward.fail(DirectoryError::WatchClosed {
                                prefix: forward.prefix.clone(),
                                reason: "etcd ended the watch stream".into(),
                            }).await;
                            return;
                        }
                        Err(e) => {
                            let e = map_error(e, None, &forward.endpoints);
                            forward.fail(e).await;
                            return;
                        }
                    }
                }
            }
        });
        Ok(watch)
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        if ttl.is_zero() {
            return Err(DirectoryError::InvalidRequest {
                detail: "a lease needs a time to live above zero".into(),
            });
        }
        let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let mut lease = self.client.lease_client();
        let response = lease
            .grant(seconds as i64, None)
            .await
            .map_err(|e| self.map(e))?;
        Ok(Lease {
            id: LeaseId(response.id()),
            ttl: Duration::from_secs(response.ttl().max(0) as u64),
        })
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        let mut client = self.client.lease_client();
        // One request and its answer; the client library reports a lease
        // the server no longer knows (TTL <= 0) as an error.
        client
            .keep_alive(lease.0)
            .await
            .map(|_| ())
            .map_err(|e| map_error(e, Some(lease), &self.endpoints))
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        let mut client = self.client.lease_client();
        client
            .revoke(lease.0)
            .await
            .map(|_| ())
            .map_err(|e| map_error(e, Some(lease), &self.endpoints))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let mut kv = self.client.kv_client();
        match kv.compact(revision as i64, None).await {
            Ok(_) => Ok(()),
            Err(etcd::Error::GRpcStatus(status))
                if status.message().contains("has been compacted") =>
            {
                Ok(())
            }
            Err(e) => Err(self.map(e)),
        }
    }
}

/// Moves one etcd watch's responses into a [`WatchStream`]'s queue.
struct WatchForward {
    prefix: String,
    requested: Revision,
    events: mpsc::Sender<Result<WatchEvent>>,
    endpoints: Vec<String>,
}

impl WatchForward {
    /// Queues a response's events; false when the watch is over.
    async fn deliver(&mut self, response: &etcd::WatchResponse) -> bool {
        if response.compact_revision() > 0 {
            let compacted = (response.compact_revision() as Revision).saturating_sub(1);
            self.fail(DirectoryError::Compacted {
                prefix: self.prefix.clone(),
                requested: self.requested,
                compacted,
            })
            .await;
            return false;
        }
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let item = key_value(kv).map(|kv| WatchEvent {
                kind: match event.event_type() {
                    etcd::EventType::Put => WatchEventKind::Put,
                    etcd::EventType::Delete => WatchEventKind::Delete,
                },
                kv,
            });
            let failed = item.is_err();
            if self.events.send(item).await.is_err() || failed {
                return false;
            }
        }
        if response.canceled() {
            let reason = if response.cancel_reason().is_empty() {
                "etcd cancelled the watch".to_string()
            } else {
                format!("etcd cancelled the watch: {}", response.cancel_reason())
            };
            self.fail(DirectoryError::WatchClosed {
                prefix: self.prefix.clone(),
                reason,
            })
            .await;
            return false;
        }
        true
    }

    async fn fail(&self, error: DirectoryError) {
        let _ = self.events.send(Err(error)).await;
    }
}
