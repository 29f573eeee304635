//! The API's audit log: every change asked of the API, who asked, when and
//! how it ended, kept in the directory.
//!
//! Owns: the `audit/` records and keeping them bounded (the oldest beyond
//! [`AUDIT_KEEP`] are deleted). Must not touch: HTTP (the API hands in what
//! it answered) or request bodies, which may carry secrets and are never
//! kept.
//! Invariant: an entry is written before the answer it describes leaves the
//! API, so a client that saw an answer finds it in the log.

use super::{internal, ControlPlane};
use crate::control::{ApiChange, ControlError};
use std::sync::atomic::Ordering;
use tessera_directory::keys::{self, AuditRecord};

/// Entries the audit log keeps.
pub const AUDIT_KEEP: usize = 10_000;
/// Entries written between two trims of the log.
const TRIM_EVERY: u64 = 64;

impl ControlPlane {
    pub(super) async fn keep_change(&self, change: ApiChange) -> Result<(), ControlError> {
        let at_ms = self.clock.wall_ms();
        let record = change.into_record(at_ms);
        let sequence = self.audit_appends.fetch_add(1, Ordering::Relaxed);
        let key = self
            .keys
            .audit_entry(at_ms, sequence, self.rng.next_u64() as u32);
        keys::put(self.directory.as_ref(), &key, &record, None)
            .await
            .map_err(internal)?;
        if sequence.is_multiple_of(TRIM_EVERY) {
            self.trim_audit(AUDIT_KEEP).await?;
        }
        Ok(())
    }

    /// Deletes the oldest entries beyond `keep`.
    pub(super) async fn trim_audit(&self, keep: usize) -> Result<(), ControlError> {
        keys::trim_oldest(self.directory.as_ref(), &self.keys.audit_log(), keep)
            .await
            .map_err(internal)
    }

    pub(super) async fn audit_entries(
        &self,
        limit: usize,
    ) -> Result<Vec<AuditRecord>, ControlError> {
        let listing = keys::list(self.directory.as_ref(), &self.keys.audit_log())
            .await
            .map_err(internal)?;
        let skip = listing.records.len().saturating_sub(limit);
        Ok(listing
            .records
            .into_iter()
            .skip(skip)
            .map(|r| r.value)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{ApiIdentity, ClusterControl};
    use crate::control_plane::HostSet;
    use tessera_directory::keys::ApiRole;

    async fn control_plane(dir: &std::path::Path) -> ControlPlane {
        let directory = crate::host::open_directory(
            &crate::config::DirectoryConfig::Embedded {
                path: dir.join("directory.redb"),
            },
            std::sync::Arc::new(tessera_env::SystemClock::default()),
        )
        .await
        .expect("directory");
        ControlPlane::new(
            directory,
            "audit-test",
            HostSet::new(Vec::new()),
            std::sync::Arc::default(),
        )
    }

    fn change(path: &str) -> ApiChange {
        ApiChange {
            identity: Some(ApiIdentity {
                token_id: "0123456789abcdef".into(),
                name: "ops".into(),
                role: ApiRole::Operator,
            }),
            method: "POST".into(),
            path: path.into(),
            status: 201,
        }
    }

    #[tokio::test]
    async fn the_log_keeps_changes_in_order_and_the_newest_when_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let control = control_plane(dir.path()).await;
        for i in 0..5 {
            control
                .record_change(change(&format!("/v1/volumes/v{i}/resize")))
                .await
                .unwrap();
        }
        let paths = |entries: Vec<AuditRecord>| -> Vec<String> {
            entries.into_iter().map(|e| e.path).collect()
        };
        assert_eq!(
            paths(control.audit(3).await.unwrap()),
            [
                "/v1/volumes/v2/resize",
                "/v1/volumes/v3/resize",
                "/v1/volumes/v4/resize"
            ]
        );
        let all = control.audit(usize::MAX).await.unwrap();
        assert_eq!(all.len(), 5);
        assert_eq!(all[0].token_name.as_deref(), Some("ops"));
        control.trim_audit(2).await.unwrap();
        assert_eq!(
            paths(control.audit(usize::MAX).await.unwrap()),
            ["/v1/volumes/v3/resize", "/v1/volumes/v4/resize"]
        );
        // The log outlives the control plane that wrote it.
        drop(control);
        let again = control_plane(dir.path()).await;
        again
            .record_change(change("/v1/volumes/v5/resize"))
            .await
            .unwrap();
        assert_eq!(again.audit(usize::MAX).await.unwrap().len(), 3);
    }
}
