//! Host membership: registration, liveness through a lease, and the list of
//! live hosts.
//!
//! Owns: the host's session lease and the task that renews it. A host writes
//! its inventory ([`HostRecord`], no lease: it stays while the host is away)
//! and its liveness key ([`HostLiveness`], attached to the session lease).
//! When the host stops renewing (crash, hang, partition) the lease lapses
//! and the liveness key disappears; everyone watching sees the host absent.
//!
//! Must not touch: what absence means for components (the object layer
//! decides about dirty regions, resync and rebuild).
//!
//! Invariants: a [`HostSession`] reports itself lost as soon as the directory
//! says its lease is gone, or when no renewal succeeded for a whole time to
//! live; it never reports live on a lease it cannot prove alive. A session
//! whose time to live changes moves every key of its old lease (liveness,
//! owner keys, open volumes) to a new lease in one transaction that holds
//! only while the old lease does, so the host is never absent on the way
//! and no owner key is left on a lease that then ends; meanwhile
//! [`LeaseHeld`] counts on the shorter of the two leases.

use crate::keys::{self, AttachmentRecord, HostLiveness, HostRecord, Keyspace, OwnerRecord};
use crate::{Directory, DirectoryError, Lease, LeaseId, Result, Txn};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tessera_types::HostId;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Renewals sent per lease time to live: three, so that one lost or slow
/// renewal does not lose the lease.
pub const KEEPALIVES_PER_TTL: u32 = 3;

/// Whether a host's session lease is alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionState {
    /// Renewed within its time to live.
    Live,
    /// Lapsed or revoked: the host counts as absent, and keys attached to
    /// the lease (liveness, owner keys) are gone.
    Lost,
}

/// A registered host's session: renews the lease in the background until it
/// is stopped or dropped. Dropping it stops renewing without revoking (as a
/// crash would: the host disappears after the time to live); [`stop`]
/// revokes the lease so the host disappears at once.
///
/// [`stop`]: HostSession::stop
pub struct HostSession {
    host: HostId,
    current: Mutex<SessionLease>,
    held: LeaseHeld,
    directory: Arc<dyn Directory>,
    state: watch::Receiver<SessionState>,
    /// Shared with the renewer, so a renewer replaced by a new lease's does
    /// not end the session.
    state_tx: Arc<watch::Sender<SessionState>>,
}

/// The lease a session holds now and the task renewing it.
struct SessionLease {
    lease: Lease,
    renewer: JoinHandle<()>,
}

impl std::fmt::Debug for HostSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSession")
            .field("host", &self.host)
            .field("lease", &self.current.lock().lease)
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

impl HostSession {
    /// The registered host.
    pub fn host(&self) -> &HostId {
        &self.host
    }

    /// The session lease (use it for the host's owner keys, so ownership
    /// ends when the host does).
    pub fn lease(&self) -> LeaseId {
        self.current.lock().lease.id
    }

    /// The lease's time to live as granted.
    pub fn ttl(&self) -> Duration {
        self.current.lock().lease.ttl
    }

    /// Tells, at any time, whether the lease is certainly still held.
    pub fn held(&self) -> LeaseHeld {
        self.held.clone()
    }

    /// The session's state now.
    pub fn state(&self) -> SessionState {
        *self.state.borrow()
    }

    /// Waits until the session is lost.
    pub async fn lost(&self) {
        let mut state = self.state.clone();
        // An error means the renewer ended, which it does only when lost.
        let _ = state.wait_for(|s| *s == SessionState::Lost).await;
    }

    /// Leaves the cluster: stops renewing and revokes the lease, deleting the
    /// liveness key (and any owner keys on the lease) now.
    pub async fn stop(&self) -> Result<()> {
        let lease = {
            let current = self.current.lock();
            current.renewer.abort();
            current.lease.id
        };
        match self.directory.revoke_lease(lease).await {
            Ok(()) | Err(DirectoryError::LeaseNotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Moves the session to a new lease of `ttl`: grants it, moves the
    /// host's liveness key, its owner keys and its open-volume record to it
    /// in one transaction (which holds only if none of them changed since
    /// read, so only while the old lease lives), then revokes the old lease.
    /// Answers whether it moved: false when the time to live is already
    /// `ttl`, or when a key changed meanwhile (nothing changed then; ask
    /// again). The caller must not attach keys to the session's lease while
    /// this runs, or they would end with the old lease.
    pub async fn change_ttl(&self, keys: &Keyspace, ttl: Duration) -> Result<bool> {
        let old = self.current.lock().lease;
        if ttl == old.ttl {
            return Ok(false);
        }
        let asked = tokio::time::Instant::now();
        let lease = self.directory.grant_lease(ttl).await?;
        // From the moment the keys may move, they live no longer than the
        // new lease promises (counted from when it was asked for); the old
        // lease's renewals lift this again if they stay where they are.
        self.held.restart(asked, lease.ttl);
        let moved = self.move_keys(keys, old.id, lease.id).await;
        if !matches!(moved, Ok(true)) {
            let _ = self.directory.revoke_lease(lease.id).await;
            return moved;
        }
        let renewer = tokio::spawn(renew_session(
            self.directory.clone(),
            self.host.clone(),
            lease,
            self.state_tx.clone(),
            self.held.clone(),
        ));
        {
            let mut current = self.current.lock();
            current.renewer.abort();
            *current = SessionLease { lease, renewer };
        }
        match self.directory.revoke_lease(old.id).await {
            Ok(()) | Err(DirectoryError::LeaseNotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(host = %self.host, lease = %old.id, error = %e, "cannot revoke the old session lease; it lapses on its own")
            }
        }
        tracing::info!(host = %self.host, lease = %lease.id, ttl_ms = lease.ttl.as_millis() as u64, "session moved to a lease with a new time to live");
        Ok(true)
    }

    /// The transaction of [`HostSession::change_ttl`]: every key of this
    /// host on lease `from` put again on lease `to`, if none changed.
    async fn move_keys(&self, keys: &Keyspace, from: LeaseId, to: LeaseId) -> Result<bool> {
        let d = self.directory.as_ref();
        let liveness_key = keys.liveness(&self.host);
        let Some(liveness) = keys::get(d, &liveness_key).await? else {
            return Ok(false);
        };
        if liveness.value.lease != from {
            return Ok(false);
        }
        let mut compares = vec![liveness_key.at_revision(liveness.mod_revision)];
        let mut ops = vec![liveness_key.put_op(
            &HostLiveness {
                host: self.host.clone(),
                lease: to,
            },
            Some(to),
        )?];
        for owner in keys::list(d, &keys.owners()).await?.records {
            if owner.value.host != self.host || owner.value.lease != from {
                continue;
            }
            let key = keys.owner(&owner.value.volume);
            compares.push(key.at_revision(owner.mod_revision));
            ops.push(key.put_op(
                &OwnerRecord {
                    lease: to,
                    ..owner.value
                },
                Some(to),
            )?);
        }
        let attachments_key = keys.attachments(&self.host);
        if let Some(open) = keys::get::<AttachmentRecord>(d, &attachments_key).await? {
            if open.lease == Some(from) {
                compares.push(attachments_key.at_revision(open.mod_revision));
                ops.push(attachments_key.put_op(&open.value, Some(to))?);
            }
        }
        let outcome = d.txn(Txn::new().when(compares).and_then(ops)).await?;
        Ok(outcome.succeeded)
    }
}

impl Drop for HostSession {
    fn drop(&mut self) {
        self.current.lock().renewer.abort();
    }
}

/// Whether a session's lease is certainly still held: until its time to
/// live has passed since the last renewal was *sent* (the directory counts
/// from when it received it, later), no other host can have taken the keys
/// bound to the lease, such as the host's owner keys. Cheap to ask often.
#[derive(Clone, Debug)]
pub struct LeaseHeld {
    base: tokio::time::Instant,
    /// Nanoseconds after `base` until which the lease is held.
    until_nanos: Arc<std::sync::atomic::AtomicU64>,
}

/// Time kept off the end of the lease, for clocks that drift and a
/// directory that expires leases a little early.
const LEASE_HELD_MARGIN: Duration = Duration::from_millis(500);

impl LeaseHeld {
    fn new(sent: tokio::time::Instant, ttl: Duration) -> LeaseHeld {
        let held = LeaseHeld {
            base: sent,
            until_nanos: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        };
        held.renewed(sent, ttl);
        held
    }

    fn until(&self, sent: tokio::time::Instant, ttl: Duration) -> u64 {
        (sent + ttl.saturating_sub(LEASE_HELD_MARGIN))
            .saturating_duration_since(self.base)
            .as_nanos() as u64
    }

    fn renewed(&self, sent: tokio::time::Instant, ttl: Duration) {
        self.until_nanos
            .fetch_max(self.until(sent, ttl), std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts from a new lease asked for at `asked`, whose time to live may
    /// be shorter than the old one's: held no longer than it promises.
    fn restart(&self, asked: tokio::time::Instant, ttl: Duration) {
        self.until_nanos
            .fetch_min(self.until(asked, ttl), std::sync::atomic::Ordering::Relaxed);
    }

    /// True while the lease is certainly held.
    pub fn now(&self) -> bool {
        let elapsed = tokio::time::Instant::now()
            .saturating_duration_since(self.base)
            .as_nanos() as u64;
        elapsed < self.until_nanos.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Registers `record`'s host: grants a session lease of `ttl`, writes the
/// host's inventory record and its liveness key (attached to the lease), and
/// starts renewing the lease.
pub async fn register_host(
    directory: Arc<dyn Directory>,
    keys: &Keyspace,
    record: HostRecord,
    ttl: Duration,
) -> Result<HostSession> {
    let asked = tokio::time::Instant::now();
    let lease = directory.grant_lease(ttl).await?;
    let held = LeaseHeld::new(asked, lease.ttl);
    let host = record.id.clone();
    let written = async {
        keys::put(&*directory, &keys.host(&host), &record, None).await?;
        let liveness = HostLiveness {
            host: host.clone(),
            lease: lease.id,
        };
        keys::put(
            &*directory,
            &keys.liveness(&host),
            &liveness,
            Some(lease.id),
        )
        .await
    }
    .await;
    if let Err(e) = written {
        let _ = directory.revoke_lease(lease.id).await;
        return Err(e);
    }
    let (state_tx, state) = watch::channel(SessionState::Live);
    let state_tx = Arc::new(state_tx);
    let renewer = tokio::spawn(renew_session(
        directory.clone(),
        host.clone(),
        lease,
        state_tx.clone(),
        held.clone(),
    ));
    tracing::info!(%host, lease = %lease.id, ttl_ms = lease.ttl.as_millis() as u64, "host registered");
    Ok(HostSession {
        host,
        current: Mutex::new(SessionLease { lease, renewer }),
        held,
        directory,
        state,
        state_tx,
    })
}

async fn renew_session(
    directory: Arc<dyn Directory>,
    host: HostId,
    lease: Lease,
    state: Arc<watch::Sender<SessionState>>,
    held: LeaseHeld,
) {
    let interval = lease.ttl / KEEPALIVES_PER_TTL;
    let mut last_renewed = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(interval).await;
        let sent = tokio::time::Instant::now();
        match directory.keep_alive(lease.id).await {
            Ok(()) => {
                last_renewed = tokio::time::Instant::now();
                held.renewed(sent, lease.ttl);
            }
            Err(DirectoryError::LeaseNotFound { .. }) => {
                tracing::warn!(%host, lease = %lease.id, "session lease lapsed; host is absent");
                let _ = state.send(SessionState::Lost);
                return;
            }
            Err(e) => {
                if last_renewed.elapsed() >= lease.ttl {
                    tracing::warn!(%host, lease = %lease.id, error = %e, "no renewal within the lease's time to live; host is absent");
                    let _ = state.send(SessionState::Lost);
                    return;
                }
                tracing::warn!(%host, lease = %lease.id, error = %e, "renewing session lease failed; retrying");
            }
        }
    }
}

/// The hosts whose liveness key exists, in name order.
pub async fn live_hosts(directory: &dyn Directory, keys: &Keyspace) -> Result<Vec<HostId>> {
    Ok(keys::list(directory, &keys.liveness_all())
        .await?
        .records
        .into_iter()
        .map(|r| r.value.host)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lease_is_held_until_its_time_to_live_after_the_renewal_was_sent() {
        let sent = tokio::time::Instant::now();
        // Held for 900 ms less the margin.
        let held = LeaseHeld::new(sent, LEASE_HELD_MARGIN + Duration::from_millis(400));
        assert!(held.now());
        tokio::time::sleep(Duration::from_millis(450)).await;
        assert!(!held.now(), "no renewal: no longer certainly held");
        held.renewed(
            tokio::time::Instant::now(),
            LEASE_HELD_MARGIN + Duration::from_secs(5),
        );
        assert!(held.now());
        // A renewal answered late (sent earlier) never shortens it.
        held.renewed(sent, LEASE_HELD_MARGIN);
        assert!(held.clone().now());
    }
}
