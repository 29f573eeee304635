//! Deleting the components this host holds that no record names any more:
//! those its reclaim records (`reclaims/<host>/<component>`) list.
//!
//! Owns: the host's waiting reclaim records (kept by the directory mirror
//! from its listing and its watch, never read again by themselves), and the
//! passes that delete each one's component from the local store, then the
//! record; a failed deletion is tried again later, backing off.
//! Must not touch: deciding what to reclaim (a record is written in the
//! same transaction that takes the component out of the last layout or
//! snapshot record naming it, by the control plane or the volume's owner),
//! or any other host's components.
//! Invariants: a component that the host's view of a layout or snapshot
//! record still names is never deleted (it is tried again once the view
//! caught up); a record goes only after its component is gone from the
//! store (one already gone counts as deleted); passes read nothing from the
//! directory, they only delete the records they finished.

use super::Host;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tessera_directory::keys::{self, ReclaimRecord};
use tessera_types::ComponentId;
use tessera_wire::ComponentRef;
use tokio::time::Instant;

/// The first wait before a failed reclaim is tried again; it doubles with
/// each failure, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two tries of one reclaim.
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The host's waiting reclaims and how their tries went.
#[derive(Default)]
pub(super) struct Reclaims {
    /// This host's reclaim records, by key, as the mirror last saw them.
    pub(super) waiting: Mutex<HashMap<String, ReclaimRecord>>,
    /// Records whose last try failed: failures so far and when to try
    /// again.
    retries: Mutex<HashMap<String, (u32, Instant)>>,
    /// A pass is under way.
    running: AtomicBool,
}

/// Why a component was not reclaimed this time.
#[derive(Debug, thiserror::Error)]
enum ReclaimError {
    /// The host's view still has a record naming the component.
    #[error("component {0} is still named by a layout or snapshot record")]
    StillNamed(ComponentId),
    /// The store could not delete it.
    #[error("deleting component {component}: {detail}")]
    Store {
        component: ComponentId,
        detail: String,
    },
    /// The directory did not take the record's deletion.
    #[error("deleting the reclaim record of component {component}: {detail}")]
    Directory {
        component: ComponentId,
        detail: String,
    },
}

impl Host {
    /// The reclaim records waiting for this host, as its view has them.
    pub fn reclaims_waiting(&self) -> Vec<ReclaimRecord> {
        let mut out: Vec<ReclaimRecord> = self.reclaims.waiting.lock().values().cloned().collect();
        out.sort_by_key(|r| r.component);
        out
    }

    /// Starts a pass over the reclaims that are due, in a task of its own,
    /// unless one is under way (called every control tick).
    pub(super) fn reclaim_due(self: &Arc<Self>) {
        if self.halted.load(Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        let due: Vec<(String, ReclaimRecord)> = {
            let waiting = self.reclaims.waiting.lock();
            let retries = self.reclaims.retries.lock();
            waiting
                .iter()
                .filter(|(key, _)| retries.get(*key).is_none_or(|(_, at)| *at <= now))
                .map(|(k, r)| (k.clone(), r.clone()))
                .collect()
        };
        if due.is_empty() || self.reclaims.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            for (key, record) in due {
                let Some(host) = weak.upgrade() else { return };
                if host.halted.load(Ordering::SeqCst) {
                    break;
                }
                match host.reclaim(&record).await {
                    Ok(()) => {
                        tracing::info!(host = %host.id, volume = %record.volume, component = %record.component, reason = %record.reason, "component reclaimed");
                        host.reclaims.waiting.lock().remove(&key);
                        host.reclaims.retries.lock().remove(&key);
                    }
                    Err(e) => {
                        let mut retries = host.reclaims.retries.lock();
                        let entry = retries.entry(key).or_insert((0, Instant::now()));
                        let wait = RETRY_FIRST
                            .saturating_mul(1 << entry.0.min(6))
                            .min(RETRY_MAX);
                        entry.0 += 1;
                        entry.1 = Instant::now() + wait;
                        tracing::debug!(host = %host.id, error = %e, retry_in = ?wait, "component not reclaimed yet");
                    }
                }
            }
            if let Some(host) = weak.upgrade() {
                host.reclaims.running.store(false, Ordering::Release);
            }
        });
    }

    /// Deletes `record`'s component from this host's store, then the
    /// record.
    async fn reclaim(&self, record: &ReclaimRecord) -> Result<(), ReclaimError> {
        let id = record.component;
        if self.names(id) {
            return Err(ReclaimError::StillNamed(id));
        }
        self.replica
            .delete(&ComponentRef {
                volume: record.volume.clone(),
                id,
            })
            .await
            .map_err(|e| ReclaimError::Store {
                component: id,
                detail: e.to_string(),
            })?;
        keys::delete(self.directory.as_ref(), &self.keys.reclaim(&self.id, id))
            .await
            .map_err(|e| ReclaimError::Directory {
                component: id,
                detail: e.to_string(),
            })?;
        Ok(())
    }

    /// Whether a layout or snapshot record of this host's view names `id`.
    fn names(&self, id: ComponentId) -> bool {
        self.view
            .layouts
            .read()
            .values()
            .any(|l| l.component(id).is_some())
            || self
                .view
                .snapshots
                .read()
                .values()
                .any(|s| s.layout.component(id).is_some())
    }
}
