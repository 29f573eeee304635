//! The cluster directory (vSAN's CMMDS): membership, inventory, policies,
//! layouts, component states and owner leases with epochs.
//!
//! Owns: the [`Directory`] trait (a key-value store with revisions,
//! compare-and-swap transactions, ordered watches and leases), its two
//! backends ([`embedded::EmbeddedDirectory`] on a local redb file, used by
//! `tessera up`, and [`etcd::EtcdDirectory`] for multi-host clusters), the
//! typed keyspace ([`keys`]) that names every key Tessera stores, and the
//! protocols built on the trait: host registration with liveness leases
//! ([`membership`]) and owner election with epochs ([`ownership`]).
//!
//! Must not touch: the component store, the object coordinator or the
//! frontends. Those layers receive what they need from here as values and
//! events; this crate never calls them.
//!
//! Invariants every backend keeps (the shared test suite in `tests/` checks
//! them against both):
//! - every change gets a revision, revisions only grow (also across restarts
//!   of the embedded store), and all changes of one transaction share one;
//! - a transaction either applies all its operations or none; a failed
//!   comparison is an outcome (`succeeded: false`), not an error;
//! - a watch delivers every change under its prefix in revision order from
//!   the revision it asked for, or reports an error; it never skips silently;
//! - a key attached to a lease is deleted when the lease expires or is
//!   revoked, and watchers see that delete like any other.

use async_trait::async_trait;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

pub mod embedded;
pub mod etcd;
pub mod keys;
pub mod membership;
pub mod ownership;

pub use embedded::EmbeddedDirectory;
pub use etcd::{EtcdDirectory, EtcdTls};
pub use keys::Keyspace;
pub use membership::{live_hosts, register_host, HostSession, LeaseHeld};
pub use ownership::{acquire_owner, current_owner, release_owner};

/// A point in the directory's history. Every change gets the next revision;
/// `0` never names a change (in [`Directory::watch`] it means "from now").
pub type Revision = u64;

/// Events a watch may buffer for a reader before the reader is declared
/// lagging (embedded backend) or the producer waits (etcd backend).
pub const WATCH_QUEUE_EVENTS_MAX: usize = 4096;

/// An error from the directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectoryError {
    /// The directory cannot be reached or did not answer in time; the
    /// operation may or may not have been applied.
    #[error("directory unavailable: {detail}")]
    Unavailable {
        /// What failed, as the backend reported it.
        detail: String,
    },
    /// The lease does not exist: it expired, was revoked, or was never granted.
    #[error("lease {lease} not found: it expired or was revoked")]
    LeaseNotFound {
        /// The lease asked for.
        lease: LeaseId,
    },
    /// A watch asked for history that is gone. The caller lists the prefix
    /// again and watches from the listing's revision + 1.
    #[error("watch on {prefix:?} from revision {requested}: history up to revision {compacted} was compacted; list again and watch from the listing's revision")]
    Compacted {
        /// The watched prefix.
        prefix: String,
        /// The revision the watch started from.
        requested: Revision,
        /// History up to and including this revision is gone.
        compacted: Revision,
    },
    /// The watcher did not keep up and events were dropped for it; it must
    /// list again.
    #[error("watch on {prefix:?} fell more than {WATCH_QUEUE_EVENTS_MAX} events behind and was cancelled; list again and watch from the listing's revision")]
    WatchLagged {
        /// The watched prefix.
        prefix: String,
    },
    /// The watch ended because the directory was closed or cancelled it.
    #[error("watch on {prefix:?} ended: {reason}")]
    WatchClosed {
        /// The watched prefix.
        prefix: String,
        /// Why.
        reason: String,
    },
    /// A stored value could not be decoded.
    #[error("cannot decode the value stored at {key}: {detail}")]
    Decode {
        /// The key whose value is bad.
        key: String,
        /// What was wrong.
        detail: String,
    },
    /// The request itself is malformed (bad key, one key twice in a
    /// transaction, a name that cannot be a key).
    #[error("invalid directory request: {detail}")]
    InvalidRequest {
        /// What was wrong.
        detail: String,
    },
    /// The embedded store's file failed.
    #[error("directory store {path}: {detail}")]
    Storage {
        /// The store file.
        path: String,
        /// What failed.
        detail: String,
    },
    /// Another host holds a live owner lease on the volume.
    #[error("volume {volume} is owned by host {owner} at {epoch}")]
    OwnerHeld {
        /// The volume.
        volume: String,
        /// The current owner.
        owner: String,
        /// The current owner's epoch.
        epoch: tessera_types::Epoch,
    },
    /// A read-modify-write lost its race more often than its retry bound.
    #[error("gave up on {key} after {attempts} conflicting updates")]
    Contended {
        /// The key fought over.
        key: String,
        /// Attempts made.
        attempts: u32,
    },
}

/// Results of directory operations.
pub type Result<T, E = DirectoryError> = std::result::Result<T, E>;

/// Which directory a host uses, as written in its configuration.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "backend", rename_all = "kebab-case")]
pub enum DirectoryConfig {
    /// A local redb file shared by every host in this process (`tessera up`).
    Embedded {
        /// The directory file.
        path: std::path::PathBuf,
    },
    /// An etcd cluster (`tessera node`).
    Etcd {
        /// Client URLs, e.g. `https://127.0.0.1:2379`.
        endpoints: Vec<String>,
        /// TLS with a client certificate (`https://` endpoints).
        #[serde(default)]
        tls: Option<EtcdTls>,
    },
}

/// Opens the directory `config` names. `clock` drives the embedded
/// backend's lease expiry (etcd keeps its own time).
pub async fn open(
    config: &DirectoryConfig,
    clock: Arc<dyn tessera_env::Clock>,
) -> Result<Arc<dyn Directory>> {
    Ok(match config {
        DirectoryConfig::Embedded { path } => Arc::new(EmbeddedDirectory::open(path, clock).await?),
        DirectoryConfig::Etcd {
            endpoints,
            tls: None,
        } => Arc::new(EtcdDirectory::connect(endpoints).await?),
        DirectoryConfig::Etcd {
            endpoints,
            tls: Some(tls),
        } => Arc::new(EtcdDirectory::connect_tls(endpoints, tls).await?),
    })
}

/// A lease: keys attached to it are deleted when it is revoked or when no
/// keep-alive reached the directory for its time to live.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct LeaseId(pub i64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// A granted lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Its identity.
    pub id: LeaseId,
    /// How long it lives without a keep-alive, as the directory granted it
    /// (etcd rounds up to whole seconds).
    pub ttl: Duration,
}

/// A stored key with its value and history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value (empty in delete events).
    pub value: Vec<u8>,
    /// Revision of the change that created the key (0 in delete events).
    pub create_revision: Revision,
    /// Revision of the last change to the key (for a delete event: the
    /// revision of the delete).
    pub mod_revision: Revision,
    /// The lease the key is attached to, if any.
    pub lease: Option<LeaseId>,
}

/// The keys under a prefix, read at one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    /// Keys in ascending order.
    pub entries: Vec<KeyValue>,
    /// The revision the listing reflects; watch from `revision + 1` to see
    /// every later change.
    pub revision: Revision,
}

/// A condition a transaction checks before writing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The key exists and was last changed at exactly this revision.
    ModRevision {
        /// The key.
        key: String,
        /// Its expected mod revision.
        revision: Revision,
    },
    /// The key does not exist.
    Absent {
        /// The key.
        key: String,
    },
    /// The key exists and holds exactly this value.
    Value {
        /// The key.
        key: String,
        /// Its expected value.
        value: Vec<u8>,
    },
}

/// A write inside a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOp {
    /// Store `value` at `key`, attached to `lease` if given (a put without a
    /// lease detaches the key from any lease it had).
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
        /// The lease to attach to.
        lease: Option<LeaseId>,
    },
    /// Delete `key` if it exists.
    Delete {
        /// The key.
        key: String,
    },
}

impl TxnOp {
    /// The key the operation writes.
    pub fn key(&self) -> &str {
        match self {
            TxnOp::Put { key, .. } | TxnOp::Delete { key } => key,
        }
    }
}

/// A compare-and-swap transaction: if every comparison holds, apply
/// `on_success`, else apply `on_failure`; either way atomically, at one
/// revision. A key may be written at most once per branch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    /// Conditions, all of which must hold.
    pub compares: Vec<Compare>,
    /// Writes applied when they hold.
    pub on_success: Vec<TxnOp>,
    /// Writes applied when one does not.
    pub on_failure: Vec<TxnOp>,
}

impl Txn {
    /// An empty transaction.
    pub fn new() -> Txn {
        Txn::default()
    }

    /// Adds conditions.
    pub fn when(mut self, compares: impl IntoIterator<Item = Compare>) -> Txn {
        self.compares.extend(compares);
        self
    }

    /// Adds writes for when the conditions hold.
    pub fn and_then(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Txn {
        self.on_success.extend(ops);
        self
    }

    /// Adds writes for when a condition fails.
    pub fn or_else(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Txn {
        self.on_failure.extend(ops);
        self
    }

    /// Refuses a branch that writes one key twice (etcd refuses it too, so
    /// both backends behave alike).
    pub(crate) fn check(&self) -> Result<()> {
        for branch in [&self.on_success, &self.on_failure] {
            let mut seen = std::collections::BTreeSet::new();
            for op in branch {
                if !seen.insert(op.key()) {
                    return Err(DirectoryError::InvalidRequest {
                        detail: format!("transaction writes key {} twice", op.key()),
                    });
                }
            }
        }
        Ok(())
    }
}

/// What a transaction did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnOutcome {
    /// Whether every comparison held (and `on_success` was applied).
    pub succeeded: bool,
    /// The directory's revision after the transaction.
    pub revision: Revision,
}

/// Kind of change a watch reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchEventKind {
    /// The key was created or overwritten.
    Put,
    /// The key was deleted (explicitly or by its lease ending).
    Delete,
}

/// One change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    /// Put or delete.
    pub kind: WatchEventKind,
    /// The key after the change (for a delete: key and the delete's revision).
    pub kv: KeyValue,
}

/// The receiving end of a watch. Events arrive in revision order; the first
/// error ends the stream, and any gap is reported as an error (never skipped).
/// Dropping it cancels the watch.
pub struct WatchStream {
    prefix: String,
    events: mpsc::Receiver<Result<WatchEvent>>,
    lagged: Arc<AtomicBool>,
    ended: bool,
}

impl fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchStream")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl WatchStream {
    /// A stream fed by a backend through `events`; the backend sets `lagged`
    /// before dropping its sender when the reader fell behind.
    pub(crate) fn new(
        prefix: String,
        events: mpsc::Receiver<Result<WatchEvent>>,
        lagged: Arc<AtomicBool>,
    ) -> WatchStream {
        WatchStream {
            prefix,
            events,
            lagged,
            ended: false,
        }
    }

    /// The watched prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The next change, or the error that ended the watch. After an error
    /// every call returns [`DirectoryError::WatchClosed`].
    pub async fn recv(&mut self) -> Result<WatchEvent> {
        if self.ended {
            return Err(self.closed("the watch already reported an error"));
        }
        let item = match self.events.recv().await {
            Some(item) => item,
            None if self.lagged.load(Ordering::SeqCst) => Err(DirectoryError::WatchLagged {
                prefix: self.prefix.clone(),
            }),
            None => Err(self.closed("the directory was closed")),
        };
        if item.is_err() {
            self.ended = true;
        }
        item
    }

    fn closed(&self, reason: &str) -> DirectoryError {
        DirectoryError::WatchClosed {
            prefix: self.prefix.clone(),
            reason: reason.to_string(),
        }
    }
}

/// The directory: a key-value store with revisions, transactions, watches and
/// leases. Shared as `Arc<dyn Directory>` by every part of a host.
#[async_trait]
pub trait Directory: Send + Sync {
    /// The key's current value, if it exists.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;

    /// Every key starting with `prefix`, in key order, at one revision.
    async fn list(&self, prefix: &str) -> Result<Listing>;

    /// Stores `value` at `key` (attached to `lease` if given); returns the
    /// change's revision. Fails with [`DirectoryError::LeaseNotFound`] if the
    /// lease is gone.
    async fn put(&self, key: &str, value: Vec<u8>, lease: Option<LeaseId>) -> Result<Revision>;

    /// Deletes `key`; returns whether it existed.
    async fn delete(&self, key: &str) -> Result<bool>;

    /// Runs a compare-and-swap transaction.
    async fn txn(&self, txn: Txn) -> Result<TxnOutcome>;

    /// Watches every key starting with `prefix`, delivering changes from
    /// revision `from_revision` on (`0`: changes after this call). The watch
    /// is established when this returns. History that is gone is reported on
    /// the stream as [`DirectoryError::Compacted`].
    async fn watch(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream>;

    /// Grants a lease that lives `ttl` without keep-alives.
    async fn grant_lease(&self, ttl: Duration) -> Result<Lease>;

    /// Restarts the lease's time to live. Fails with
    /// [`DirectoryError::LeaseNotFound`] once it has expired.
    async fn keep_alive(&self, lease: LeaseId) -> Result<()>;

    /// Ends the lease now, deleting its keys.
    async fn revoke_lease(&self, lease: LeaseId) -> Result<()>;

    /// Discards history before `revision`; watches starting earlier fail
    /// with [`DirectoryError::Compacted`]. Compacting an already compacted
    /// revision is not an error.
    async fn compact(&self, revision: Revision) -> Result<()>;
}
