//! The embedded directory: one redb file on the local disk, shared by every
//! host of a `tessera up` cluster running in one process.
//!
//! Owns: the file's tables (keys with their revisions and lease, and the
//! store's own counters), the in-memory lease table, the recent change
//! history that watches replay from, and the live watchers.
//!
//! Must not touch: anything outside its file. Time comes from a
//! [`tessera_env::Clock`], so tests drive lease expiry with a manual clock.
//!
//! Invariants:
//! - every write happens under one mutex, inside one redb write transaction
//!   that also stores the new revision; watchers are fed after the commit
//!   while the mutex is still held, so they see changes in revision order;
//! - the revision is persisted with each change and never goes backwards
//!   across restarts;
//! - leases live in memory only: a lease's holder lives in this process, so
//!   when the file is opened again every key attached to a lease of an
//!   earlier process is deleted (its holder is gone);
//! - history is kept in memory for at most [`HISTORY_EVENTS_MAX`] events;
//!   a watch that starts before the oldest kept change gets
//!   [`DirectoryError::Compacted`], one whose reader lags more than
//!   [`crate::WATCH_QUEUE_EVENTS_MAX`] events gets
//!   [`DirectoryError::WatchLagged`]; neither skips silently.

use crate::{
    Compare, Directory, DirectoryError, KeyValue, Lease, LeaseId, Listing, Result, Revision, Txn,
    TxnOp, TxnOutcome, WatchEvent, WatchEventKind, WatchStream, WATCH_QUEUE_EVENTS_MAX,
};
use async_trait::async_trait;
use parking_lot::Mutex;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tessera_env::Clock;
use tokio::sync::mpsc;

/// Key -> encoded [`StoredValue`].
const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
/// The store's own counters.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_REVISION: &str = "revision";
const META_NEXT_LEASE: &str = "next-lease";

/// Changes kept in memory for watches that start in the past. Older history
/// is dropped and such watches are told to list again.
pub const HISTORY_EVENTS_MAX: usize = 16_384;

/// How often the background task looks for expired leases, in real time.
/// Every operation also expires due leases first, so a manual clock needs no
/// background task to take effect.
pub const LEASE_SWEEP_INTERVAL: Duration = Duration::from_millis(50);

/// How long [`EmbeddedDirectory::open`] waits for an earlier handle to the
/// same file in this process to finish closing, in attempts of
/// [`OPEN_RETRY_INTERVAL`].
const OPEN_ATTEMPTS_MAX: u32 = 100;
const OPEN_RETRY_INTERVAL: Duration = Duration::from_millis(20);

/// Version of the stored value encoding (first byte of every value).
const RECORD_FORMAT_VERSION: u8 = 1;
const RECORD_HEADER_BYTES: usize = 1 + 8 + 8 + 8;

/// A key's stored value and history, as kept in the `kv` table.
#[derive(Clone, Debug, PartialEq, Eq)]
struct StoredValue {
    create_revision: Revision,
    mod_revision: Revision,
    lease: Option<LeaseId>,
    value: Vec<u8>,
}

fn encode_record(record: &StoredValue) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEADER_BYTES + record.value.len());
    out.push(RECORD_FORMAT_VERSION);
    out.extend_from_slice(&record.create_revision.to_le_bytes());
    out.extend_from_slice(&record.mod_revision.to_le_bytes());
    out.extend_from_slice(&record.lease.map_or(0, |l| l.0).to_le_bytes());
    out.extend_from_slice(&record.value);
    out
}

fn decode_record(key: &str, bytes: &[u8]) -> Result<StoredValue> {
    let bad = |detail: String| DirectoryError::Decode {
        key: key.to_string(),
        detail,
    };
    if bytes.len() < RECORD_HEADER_BYTES {
        return Err(bad(format!(
            "stored record is {} bytes, shorter than its {RECORD_HEADER_BYTES}-byte header",
            bytes.len()
        )));
    }
    if bytes[0] != RECORD_FORMAT_VERSION {
        return Err(bad(format!(
            "stored record has format version {}, this build reads {RECORD_FORMAT_VERSION}",
            bytes[0]
        )));
    }
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[at..at + 8]);
        b
    };
    let lease = i64::from_le_bytes(word(17));
    Ok(StoredValue {
        create_revision: u64::from_le_bytes(word(1)),
        mod_revision: u64::from_le_bytes(word(9)),
        lease: (lease != 0).then_some(LeaseId(lease)),
        value: bytes[RECORD_HEADER_BYTES..].to_vec(),
    })
}

fn key_value(key: &str, stored: StoredValue) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: stored.value,
        create_revision: stored.create_revision,
        mod_revision: stored.mod_revision,
        lease: stored.lease,
    }
}

struct LeaseState {
    ttl: Duration,
    /// On the clock's monotonic scale.
    deadline: Duration,
    keys: BTreeSet<String>,
}

struct Watcher {
    prefix: String,
    events: mpsc::Sender<Result<WatchEvent>>,
    lagged: Arc<AtomicBool>,
}

impl Watcher {
    /// Queues `event`; false when the watcher is gone or fell behind (then it
    /// is marked lagging and must be dropped).
    fn offer(&self, event: &WatchEvent) -> bool {
        if !event.kv.key.starts_with(&self.prefix) {
            return !self.events.is_closed();
        }
        match self.events.try_send(Ok(event.clone())) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.lagged.store(true, Ordering::SeqCst);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

struct State {
    /// The revision of the last change.
    revision: Revision,
    /// Every change at or below this revision may be missing from `history`.
    compacted: Revision,
    history: VecDeque<WatchEvent>,
    watchers: Vec<Watcher>,
    leases: HashMap<LeaseId, LeaseState>,
    next_lease: i64,
}

impl State {
    /// Records committed changes and hands them to the watchers.
    fn publish(&mut self, events: Vec<WatchEvent>) {
        for event in &events {
            self.watchers.retain(|w| w.offer(event));
        }
        for event in events {
            if self.history.len() == HISTORY_EVENTS_MAX {
                if let Some(old) = self.history.pop_front() {
                    self.compacted = self.compacted.max(old.kv.mod_revision);
                }
            }
            self.history.push_back(event);
        }
    }

    /// Moves `key` from the lease it had to the one it has now.
    fn relink_lease(&mut self, key: &str, old: Option<LeaseId>, new: Option<LeaseId>) {
        if old == new {
            return;
        }
        if let Some(state) = old.and_then(|l| self.leases.get_mut(&l)) {
            state.keys.remove(key);
        }
        if let Some(state) = new.and_then(|l| self.leases.get_mut(&l)) {
            state.keys.insert(key.to_string());
        }
    }
}

struct Inner {
    db: Database,
    path: PathBuf,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    /// The earliest lease deadline in nanoseconds of the clock (`u64::MAX`
    /// without leases), so reads can tell without the state lock whether a
    /// lease is due; the lock may be held by a writer waiting on fsync.
    earliest_deadline_ns: AtomicU64,
}

/// The embedded directory backend. Cheap to clone; all clones share one file.
#[derive(Clone)]
pub struct EmbeddedDirectory {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EmbeddedDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedDirectory")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

impl EmbeddedDirectory {
    /// Opens (or creates) the directory file at `path`. Keys attached to
    /// leases of an earlier process are deleted. Must be called inside a
    /// tokio runtime: a background task expires leases on time.
    pub async fn open(path: impl AsRef<Path>, clock: Arc<dyn Clock>) -> Result<EmbeddedDirectory> {
        let path = path.as_ref().to_path_buf();
        let inner = run_blocking(move || Inner::open(path, clock)).await?;
        let inner = Arc::new(inner);
        tokio::spawn(sweep_leases(Arc::downgrade(&inner)));
        Ok(EmbeddedDirectory { inner })
    }

    /// The file this directory lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Expires every lease whose time to live has passed on the clock. The
    /// background task does this every [`LEASE_SWEEP_INTERVAL`]; tests with a
    /// manual clock call it to see expiry at once.
    pub async fn expire_leases(&self) -> Result<()> {
        self.expire_due().await
    }

    async fn expire_due(&self) -> Result<()> {
        if !self.inner.has_due_lease() {
            return Ok(());
        }
        let inner = self.inner.clone();
        run_blocking(move || {
            let mut state = inner.state.lock();
            inner.expire_locked(&mut state)
        })
        .await
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Inner) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        run_blocking(move || work(&inner)).await
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| DirectoryError::Unavailable {
            detail: format!("directory worker failed: {e}"),
        })?
}

async fn sweep_leases(inner: Weak<Inner>) {
    let mut tick = tokio::time::interval(LEASE_SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        if strong.has_due_lease() {
            let result = run_blocking(move || {
                let mut state = strong.state.lock();
                strong.expire_locked(&mut state)
            })
            .await;
            if let Err(e) = result {
                tracing::warn!(error = %e, "expiring directory leases failed");
            }
        }
    }
}

fn storage_error(path: &Path) -> impl Fn(&dyn std::fmt::Display) -> DirectoryError + '_ {
    move |e| DirectoryError::Storage {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

impl Inner {
    fn open(path: PathBuf, clock: Arc<dyn Clock>) -> Result<Inner> {
        let shown = path.clone();
        let err = storage_error(&shown);
        let mut attempt = 0;
        let db = loop {
            match Database::create(&path) {
                Ok(db) => break db,
                Err(redb::DatabaseError::DatabaseAlreadyOpen) if attempt < OPEN_ATTEMPTS_MAX => {
                    attempt += 1;
                    std::thread::sleep(OPEN_RETRY_INTERVAL);
                }
                Err(e) => return Err(err(&e)),
            }
        };
        let wtx = db.begin_write().map_err(|e| err(&e))?;
        let (revision, next_lease) = {
            let mut meta = wtx.open_table(META).map_err(|e| err(&e))?;
            let mut kv = wtx.open_table(KV).map_err(|e| err(&e))?;
            let mut revision = meta
                .get(META_REVISION)
                .map_err(|e| err(&e))?
                .map_or(1, |v| v.value());
            let next_lease = meta
                .get(META_NEXT_LEASE)
                .map_err(|e| err(&e))?
                .map_or(1, |v| v.value());
            // Leases lived in the previous process; their holders are gone.
            let mut orphans = Vec::new();
            for entry in kv.iter().map_err(|e| err(&e))? {
                let (key, value) = entry.map_err(|e| err(&e))?;
                let stored = decode_record(key.value(), value.value())?;
                if stored.lease.is_some() {
                    orphans.push(key.value().to_string());
                }
            }
            if !orphans.is_empty() {
                revision += 1;
                for key in &orphans {
                    kv.remove(key.as_str()).map_err(|e| err(&e))?;
                }
                meta.insert(META_REVISION, revision).map_err(|e| err(&e))?;
                tracing::info!(
                    keys = orphans.len(),
                    "deleted keys attached to leases of an earlier process"
                );
            }
            (revision, next_lease as i64)
        };
        wtx.commit().map_err(|e| err(&e))?;
        Ok(Inner {
            db,
            clock,
            state: Mutex::new(State {
                revision,
                compacted: revision,
                history: VecDeque::new(),
                watchers: Vec::new(),
                leases: HashMap::new(),
                next_lease,
            }),
            path,
            earliest_deadline_ns: AtomicU64::new(u64::MAX),
        })
    }

    fn err(&self) -> impl Fn(&dyn std::fmt::Display) -> DirectoryError + '_ {
        storage_error(&self.path)
    }

    fn has_due_lease(&self) -> bool {
        nanos(self.clock.monotonic()) >= self.earliest_deadline_ns.load(Ordering::SeqCst)
    }

    /// Publishes the earliest deadline after the lease table changed.
    fn note_deadlines(&self, state: &State) {
        let earliest = state
            .leases
            .values()
            .map(|l| nanos(l.deadline))
            .min()
            .unwrap_or(u64::MAX);
        self.earliest_deadline_ns.store(earliest, Ordering::SeqCst);
    }

    /// Deletes the keys of every lease past its deadline, one revision per
    /// lease (as etcd does).
    fn expire_locked(&self, state: &mut State) -> Result<()> {
        let now = self.clock.monotonic();
        let mut due: Vec<LeaseId> = state
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        due.sort();
        for id in due {
            if let Some(lease) = state.leases.remove(&id) {
                self.note_deadlines(state);
                tracing::debug!(lease = %id, keys = lease.keys.len(), "lease expired");
                self.delete_keys_locked(state, lease.keys)?;
            }
        }
        Ok(())
    }

    fn delete_keys_locked(&self, state: &mut State, keys: BTreeSet<String>) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let ops: Vec<TxnOp> = keys.into_iter().map(|key| TxnOp::Delete { key }).collect();
        self.apply_locked(state, &[], &ops, &[]).map(|_| ())
    }

    /// Runs one transaction under the state lock; returns the outcome and
    /// how many keys it changed.
    fn commit(&self, txn: &Txn) -> Result<(TxnOutcome, usize)> {
        txn.check()?;
        let mut state = self.state.lock();
        self.expire_locked(&mut state)?;
        self.apply_locked(&mut state, &txn.compares, &txn.on_success, &txn.on_failure)
    }

    fn apply_locked(
        &self,
        state: &mut State,
        compares: &[Compare],
        on_success: &[TxnOp],
        on_failure: &[TxnOp],
    ) -> Result<(TxnOutcome, usize)> {
        let err = self.err();
        let wtx = self.db.begin_write().map_err(|e| err(&e))?;
        let revision = state.revision + 1;
        let mut events = Vec::new();
        let mut relinks = Vec::new();
        let succeeded;
        {
            let mut kv = wtx.open_table(KV).map_err(|e| err(&e))?;
            let mut holds = true;
            for compare in compares {
                let key = match compare {
                    Compare::ModRevision { key, .. }
                    | Compare::Absent { key }
                    | Compare::Value { key, .. } => key,
                };
                let current = match kv.get(key.as_str()).map_err(|e| err(&e))? {
                    Some(bytes) => Some(decode_record(key, bytes.value())?),
                    None => None,
                };
                holds &= match (compare, &current) {
                    (Compare::ModRevision { revision, .. }, Some(c)) => c.mod_revision == *revision,
                    (Compare::Absent { .. }, None) => true,
                    (Compare::Value { value, .. }, Some(c)) => &c.value == value,
                    _ => false,
                };
            }
            succeeded = holds;
            let ops = if succeeded { on_success } else { on_failure };
            for op in ops {
                if let TxnOp::Put {
                    lease: Some(lease), ..
                } = op
                {
                    if !state.leases.contains_key(lease) {
                        return Err(DirectoryError::LeaseNotFound { lease: *lease });
                    }
                }
            }
            for op in ops {
                let key = op.key();
                let previous = match kv.get(key).map_err(|e| err(&e))? {
                    Some(bytes) => Some(decode_record(key, bytes.value())?),
                    None => None,
                };
                match op {
                    TxnOp::Put { value, lease, .. } => {
                        let stored = StoredValue {
                            create_revision: previous
                                .as_ref()
                                .map_or(revision, |p| p.create_revision),
                            mod_revision: revision,
                            lease: *lease,
                            value: value.clone(),
                        };
                        kv.insert(key, encode_record(&stored).as_slice())
                            .map_err(|e| err(&e))?;
                        relinks.push((key.to_string(), previous.and_then(|p| p.lease), *lease));
                        events.push(WatchEvent {
                            kind: WatchEventKind::Put,
                            kv: key_value(key, stored),
                        });
                    }
                    TxnOp::Delete { .. } => {
                        let Some(previous) = previous else { continue };
                        kv.remove(key).map_err(|e| err(&e))?;
                        relinks.push((key.to_string(), previous.lease, None));
                        events.push(WatchEvent {
                            kind: WatchEventKind::Delete,
                            kv: KeyValue {
                                key: key.to_string(),
                                value: Vec::new(),
                                create_revision: 0,
                                mod_revision: revision,
                                lease: None,
                            },
                        });
                    }
                }
            }
            if !events.is_empty() {
                let mut meta = wtx.open_table(META).map_err(|e| err(&e))?;
                meta.insert(META_REVISION, revision).map_err(|e| err(&e))?;
            }
        }
        if events.is_empty() {
            wtx.abort().map_err(|e| err(&e))?;
        } else {
            wtx.commit().map_err(|e| err(&e))?;
            state.revision = revision;
            for (key, old, new) in relinks {
                state.relink_lease(&key, old, new);
            }
        }
        let changed = events.len();
        state.publish(events);
        Ok((
            TxnOutcome {
                succeeded,
                revision: state.revision,
            },
            changed,
        ))
    }

    /// Registers a watcher, replaying kept history from `from_revision`.
    fn watch(&self, prefix: &str, from_revision: Revision) -> WatchStream {
        let (tx, rx) = mpsc::channel(WATCH_QUEUE_EVENTS_MAX);
        let lagged = Arc::new(AtomicBool::new(false));
        let stream = WatchStream::new(prefix.to_string(), rx, lagged.clone());
        let mut state = self.state.lock();
        let from = if from_revision == 0 {
            state.revision + 1
        } else {
            from_revision
        };
        if from <= state.compacted {
            let _ = tx.try_send(Err(DirectoryError::Compacted {
                prefix: prefix.to_string(),
                requested: from,
                compacted: state.compacted,
            }));
            return stream;
        }
        let watcher = Watcher {
            prefix: prefix.to_string(),
            events: tx,
            lagged,
        };
        let caught_up = state
            .history
            .iter()
            .filter(|e| e.kv.mod_revision >= from)
            .all(|e| watcher.offer(e));
        if caught_up {
            state.watchers.push(watcher);
        }
        stream
    }

    fn read<T>(
        &self,
        work: impl FnOnce(&redb::ReadOnlyTable<&str, &[u8]>) -> Result<T>,
    ) -> Result<T> {
        let err = self.err();
        let rtx = self.db.begin_read().map_err(|e| err(&e))?;
        let table = rtx.open_table(KV).map_err(|e| err(&e))?;
        work(&table)
    }

    fn read_revision(&self, rtx: &redb::ReadTransaction) -> Result<Revision> {
        let err = self.err();
        let meta = rtx.open_table(META).map_err(|e| err(&e))?;
        Ok(meta
            .get(META_REVISION)
            .map_err(|e| err(&e))?
            .map_or(1, |v| v.value()))
    }
}

#[async_trait]
impl Directory for EmbeddedDirectory {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.expire_due().await?;
        let err = self.inner.err();
        self.inner
            .read(|table| match table.get(key).map_err(|e| err(&e))? {
                Some(bytes) => Ok(Some(key_value(key, decode_record(key, bytes.value())?))),
                None => Ok(None),
            })
    }

    async fn list(&self, prefix: &str) -> Result<Listing> {
        self.expire_due().await?;
        let inner = &self.inner;
        let err = inner.err();
        let rtx = inner.db.begin_read().map_err(|e| err(&e))?;
        let revision = inner.read_revision(&rtx)?;
        let table = rtx.open_table(KV).map_err(|e| err(&e))?;
        let mut entries = Vec::new();
        for entry in table.range(prefix..).map_err(|e| err(&e))? {
            let (key, value) = entry.map_err(|e| err(&e))?;
            let key = key.value();
            if !key.starts_with(prefix) {
                break;
            }
            entries.push(key_value(key, decode_record(key, value.value())?));
        }
        Ok(Listing { entries, revision })
    }

    async fn put(&self, key: &str, value: Vec<u8>, lease: Option<LeaseId>) -> Result<Revision> {
        let txn = Txn::new().and_then([TxnOp::Put {
            key: key.to_string(),
            value,
            lease,
        }]);
        let (outcome, _) = self.blocking(move |inner| inner.commit(&txn)).await?;
        Ok(outcome.revision)
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        let txn = Txn::new().and_then([TxnOp::Delete {
            key: key.to_string(),
        }]);
        let (_, changed) = self.blocking(move |inner| inner.commit(&txn)).await?;
        Ok(changed > 0)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        let (outcome, _) = self.blocking(move |inner| inner.commit(&txn)).await?;
        Ok(outcome)
    }

    async fn watch(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream> {
        let prefix = prefix.to_string();
        self.blocking(move |inner| Ok(inner.watch(&prefix, from_revision)))
            .await
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        if ttl.is_zero() {
            return Err(DirectoryError::InvalidRequest {
                detail: "a lease needs a time to live above zero".into(),
            });
        }
        self.blocking(move |inner| {
            let err = inner.err();
            let mut state = inner.state.lock();
            let id = LeaseId(state.next_lease);
            let wtx = inner.db.begin_write().map_err(|e| err(&e))?;
            {
                let mut meta = wtx.open_table(META).map_err(|e| err(&e))?;
                meta.insert(META_NEXT_LEASE, id.0 as u64 + 1)
                    .map_err(|e| err(&e))?;
            }
            wtx.commit().map_err(|e| err(&e))?;
            state.next_lease += 1;
            state.leases.insert(
                id,
                LeaseState {
                    ttl,
                    deadline: inner.clock.monotonic() + ttl,
                    keys: BTreeSet::new(),
                },
            );
            inner.note_deadlines(&state);
            Ok(Lease { id, ttl })
        })
        .await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        self.expire_due().await?;
        self.blocking(move |inner| {
            let now = inner.clock.monotonic();
            let mut state = inner.state.lock();
            match state.leases.get_mut(&lease) {
                // A lease past its deadline is dead even if no sweep ran yet.
                Some(l) if l.deadline > now => {
                    l.deadline = now + l.ttl;
                    inner.note_deadlines(&state);
                    Ok(())
                }
                _ => Err(DirectoryError::LeaseNotFound { lease }),
            }
        })
        .await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.expire_due().await?;
        self.blocking(move |inner| {
            let mut state = inner.state.lock();
            let Some(l) = state.leases.remove(&lease) else {
                return Err(DirectoryError::LeaseNotFound { lease });
            };
            inner.note_deadlines(&state);
            inner.delete_keys_locked(&mut state, l.keys)
        })
        .await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.blocking(move |inner| {
            let mut state = inner.state.lock();
            if revision > state.revision {
                return Err(DirectoryError::InvalidRequest {
                    detail: format!(
                        "cannot compact to revision {revision}: the directory is at revision {}",
                        state.revision
                    ),
                });
            }
            while state
                .history
                .front()
                .is_some_and(|e| e.kv.mod_revision < revision)
            {
                state.history.pop_front();
            }
            state.compacted = state.compacted.max(revision.saturating_sub(1));
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn records_round_trip(create in any::<u64>(), modr in any::<u64>(), lease in any::<i64>(), value in proptest::collection::vec(any::<u8>(), 0..64)) {
            let record = StoredValue {
                create_revision: create,
                mod_revision: modr,
                lease: (lease != 0).then_some(LeaseId(lease)),
                value,
            };
            prop_assert_eq!(decode_record("k", &encode_record(&record))?, record);
        }

        #[test]
        fn damaged_records_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            match decode_record("k", &bytes) {
                Ok(r) => prop_assert_eq!(encode_record(&r), bytes),
                Err(DirectoryError::Decode { key, .. }) => prop_assert_eq!(key, "k"),
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            }
        }
    }
}
