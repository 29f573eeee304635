//! The cluster's event log: what hosts did on their own and why (an owner
//! taken at an epoch, a host found absent, a resync or rebuild started and
//! ended, a lease lost), kept in the directory beside the API's audit log,
//! and the two read together as one history (`GET /v1/events`).
//!
//! Owns: the `events/` records a host writes ([`EventLog`]), their codes
//! ([`EventCode`]), keeping them bounded, and the merge of events with the
//! changes asked of the API ([`history`], pure).
//! Must not touch: the decisions themselves: a host records what it did
//! after doing it, and a failure to record is logged, never returned, so
//! the log can never stop an action it describes.
//! Invariants: each host's events list in the order it wrote them (the key
//! holds the time, the host and its own sequence); the log keeps the newest
//! [`EVENTS_KEEP`].

use crate::control::{AuditRecord, EventView};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tessera_directory::keys::{self, EventRecord};
use tessera_directory::{Directory, Keyspace};
use tessera_env::Clock;
use tessera_types::HostId;

/// Events the log keeps.
pub const EVENTS_KEEP: usize = 10_000;
/// Events a host writes between two trims of the log.
const TRIM_EVERY: u64 = 64;

/// What happened, as a stable code scripts can match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventCode {
    /// The host lost its liveness lease and dropped every volume it owned.
    LeaseLost,
    /// The host registered again after losing its lease.
    Rejoined,
    /// The host became a volume's owner at a new epoch.
    OwnershipTaken,
    /// An owner found a host of its volume's components absent.
    HostAbsent,
    /// A component's owner recorded it absent (its host is gone).
    ComponentAbsent,
    /// A component was recorded lost for good (to be rebuilt elsewhere).
    ComponentDegraded,
    /// A component was recorded back and being brought up to date.
    ComponentResyncing,
    /// A component was recorded up to date again.
    ComponentActive,
    /// A resync, rebuild or evacuation copy started.
    ResyncStarted,
    /// It brought its component up to date.
    ResyncFinished,
    /// It stopped before that (it is retried).
    ResyncFailed,
    /// A component was replaced by a new one elsewhere, to be filled.
    ComponentReplaced,
}

impl EventCode {
    /// Its code.
    pub fn as_str(self) -> &'static str {
        match self {
            EventCode::LeaseLost => "LEASE_LOST",
            EventCode::Rejoined => "REJOINED",
            EventCode::OwnershipTaken => "OWNERSHIP_TAKEN",
            EventCode::HostAbsent => "HOST_ABSENT",
            EventCode::ComponentAbsent => "COMPONENT_ABSENT",
            EventCode::ComponentDegraded => "COMPONENT_DEGRADED",
            EventCode::ComponentResyncing => "COMPONENT_RESYNCING",
            EventCode::ComponentActive => "COMPONENT_ACTIVE",
            EventCode::ResyncStarted => "RESYNC_STARTED",
            EventCode::ResyncFinished => "RESYNC_FINISHED",
            EventCode::ResyncFailed => "RESYNC_FAILED",
            EventCode::ComponentReplaced => "COMPONENT_REPLACED",
        }
    }
}

/// The code of a change asked of the API in [`history`].
pub const API_CHANGE: &str = "API_CHANGE";

/// One host's writer of events.
pub struct EventLog {
    directory: Arc<dyn Directory>,
    keys: Keyspace,
    clock: Arc<dyn Clock>,
    host: HostId,
    sequence: AtomicU64,
}

impl EventLog {
    /// A writer for `host`.
    pub fn new(
        directory: Arc<dyn Directory>,
        keys: Keyspace,
        clock: Arc<dyn Clock>,
        host: HostId,
    ) -> EventLog {
        EventLog {
            directory,
            keys,
            clock,
            host,
            sequence: AtomicU64::new(0),
        }
    }

    /// Records `code` about `subject` in the background: the caller never
    /// waits for the directory. Its place in the host's order is taken now.
    pub fn emit(self: &Arc<Self>, code: EventCode, subject: &str, message: String) {
        let at_ms = self.clock.wall_ms();
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let record = EventRecord {
            at_ms,
            code: code.as_str().to_string(),
            host: self.host.to_string(),
            subject: subject.to_string(),
            message,
        };
        let log = Arc::clone(self);
        tokio::spawn(async move { log.write(sequence, record).await });
    }

    async fn write(&self, sequence: u64, record: EventRecord) {
        let key = self
            .keys
            .event_entry(record.at_ms, self.host.as_str(), sequence);
        let written = async {
            keys::put(self.directory.as_ref(), &key, &record, None).await?;
            if sequence.is_multiple_of(TRIM_EVERY) {
                keys::trim_oldest(self.directory.as_ref(), &self.keys.event_log(), EVENTS_KEEP)
                    .await?;
            }
            Ok::<_, tessera_directory::DirectoryError>(())
        };
        if let Err(e) = written.await {
            tracing::warn!(host = %self.host, code = %record.code, error = %e, "could not record an event");
        }
    }
}

/// The cluster's history: `events` and the changes asked of the API that
/// succeeded (`changes`), oldest first, the newest `limit` of them.
pub fn history(
    events: Vec<EventRecord>,
    changes: Vec<AuditRecord>,
    limit: usize,
) -> Vec<EventView> {
    let mut all: Vec<EventView> = events
        .into_iter()
        .map(|e| EventView {
            at_ms: e.at_ms,
            code: e.code,
            host: Some(e.host),
            subject: e.subject,
            message: e.message,
            by: None,
        })
        .chain(
            changes
                .into_iter()
                .filter(|c| (200..300).contains(&c.status))
                .map(|c| EventView {
                    at_ms: c.at_ms,
                    code: API_CHANGE.to_string(),
                    host: None,
                    message: format!("{} {} answered {}", c.method, c.path, c.status),
                    subject: c.path,
                    by: Some(match (c.token_name, c.role) {
                        (Some(name), Some(role)) => format!("{name} ({role})"),
                        (Some(name), None) => name,
                        _ => "an unknown caller".to_string(),
                    }),
                }),
        )
        .collect();
    // Stable: a host's events of one millisecond keep their order.
    all.sort_by_key(|e| e.at_ms);
    let skip = all.len().saturating_sub(limit);
    all.split_off(skip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_directory::keys::ApiRole;

    fn event(at_ms: u64, code: &str) -> EventRecord {
        EventRecord {
            at_ms,
            code: code.into(),
            host: "host-1".into(),
            subject: "vm1".into(),
            message: "m".into(),
        }
    }

    fn change(at_ms: u64, status: u16) -> AuditRecord {
        AuditRecord {
            at_ms,
            token_id: Some("0123456789abcdef".into()),
            token_name: Some("ops".into()),
            role: Some(ApiRole::Operator),
            method: "PATCH".into(),
            path: "/v1/settings".into(),
            status,
        }
    }

    #[test]
    fn history_interleaves_by_time_keeps_only_done_changes_and_the_newest() {
        let events = vec![event(10, "A"), event(30, "B"), event(30, "C")];
        let changes = vec![change(20, 200), change(25, 403), change(40, 204)];
        let all = history(events.clone(), changes.clone(), 100);
        let codes: Vec<_> = all.iter().map(|e| e.code.as_str()).collect();
        assert_eq!(codes, ["A", API_CHANGE, "B", "C", API_CHANGE]);
        assert_eq!(all[1].by.as_deref(), Some("ops (operator)"));
        assert_eq!(all[1].message, "PATCH /v1/settings answered 200");
        let newest = history(events, changes, 2);
        assert_eq!(newest.len(), 2);
        assert_eq!(newest[0].code, "C");
    }
}
