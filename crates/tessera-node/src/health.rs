//! Health that explains itself: from what the control plane read (hosts,
//! volumes with their components, resyncs, capacity, settings), the list of
//! problems with a stable code, what each affects and what to do.
//!
//! Owns: the rules that raise and clear each [`HealthCode`], and the one
//! rule for a volume's health ([`volume_health`]) that `volume list`,
//! `object show` and `status` all use, so they never disagree.
//! Must not touch: the directory or the hosts (pure: the control plane
//! gathers the inputs), so every rule is tested on plain values.
//! Invariant: a check is raised exactly while its cause holds; the overall
//! health is the worst of the volumes' and the hosts'.

use crate::control::{
    CapacityView, ClusterSettings, Health, HealthCheck, HealthCode, HostView, ResyncView, Severity,
};
use tessera_types::layout::{ComponentState, Layout};
use tessera_types::{format_size, ComponentId, HostId};

/// A volume's health from its layout, its owner and which hosts are up: a
/// component on a host that is down counts as absent whatever the layout
/// last recorded, and an owner on a host that is down is no owner.
/// Returns the health and the owner to show (None when down or missing).
pub fn volume_health<'a>(
    layout: &Layout,
    owner: Option<&'a HostId>,
    host_up: impl Fn(&HostId) -> bool,
) -> (Health, Option<&'a HostId>) {
    let owner = owner.filter(|h| host_up(h));
    let active = |c: &tessera_types::layout::ComponentPlacement| {
        c.state == ComponentState::Active && host_up(&c.host)
    };
    let health = if owner.is_none() || !layout.has_quorum(active) {
        Health::Unavailable
    } else if layout.components().all(active) {
        Health::Healthy
    } else {
        Health::Degraded
    };
    (health, owner)
}

/// The worse of two healths.
pub fn worse(a: Health, b: Health) -> Health {
    use Health::*;
    match (a, b) {
        (Unavailable, _) | (_, Unavailable) => Unavailable,
        (Degraded, _) | (_, Degraded) => Degraded,
        _ => Healthy,
    }
}

/// A component that is not active, as the health rules see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingComponent {
    /// Its id.
    pub id: ComponentId,
    /// Its host.
    pub host: HostId,
    /// Why: absent (host down or failed) or still resyncing.
    pub resyncing: bool,
    /// Seconds until the repair delay ends and a rebuild elsewhere starts,
    /// when the owner runs in this process and is counting.
    pub repair_in_s: Option<u64>,
}

/// One volume as the health rules see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeHealthInput {
    /// Its name.
    pub name: String,
    /// Its health by [`volume_health`].
    pub health: Health,
    /// Its components that are not active.
    pub missing: Vec<MissingComponent>,
}

/// Everything the health rules read.
pub struct HealthInputs<'a> {
    /// Hosts with their disk groups.
    pub hosts: &'a [HostView],
    /// Volumes.
    pub volumes: &'a [VolumeHealthInput],
    /// Resyncs and rebuilds.
    pub resyncs: &'a [ResyncView],
    /// The datastore's capacity.
    pub capacity: &'a CapacityView,
    /// Thresholds.
    pub settings: &'a ClusterSettings,
}

/// Every problem of the cluster, worst first.
pub fn checks(inputs: &HealthInputs<'_>) -> Vec<HealthCheck> {
    let mut out = Vec::new();
    let down: Vec<&HostView> = inputs
        .hosts
        .iter()
        .filter(|h| h.state != "present")
        .collect();
    if !down.is_empty() {
        out.push(HealthCheck {
            code: HealthCode::HostDown,
            severity: Severity::Warning,
            summary: format!(
                "{} of {} hosts down: {}",
                down.len(),
                inputs.hosts.len(),
                down.iter()
                    .map(|h| format!("{} ({})", h.id, h.state))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            affects: down.iter().map(|h| h.id.clone()).collect(),
            remedy: "start the host again (`tessera host start HOST` in `tessera up`, else restart its `tessera node`); its copies are then resynced with only the writes they missed".into(),
            seconds_left: None,
        });
    }
    let failed: Vec<String> = inputs
        .hosts
        .iter()
        .flat_map(|h| {
            h.disk_groups
                .iter()
                .filter(|g| g.health.starts_with("failed"))
                .map(move |g| format!("{}/{}", h.id, g.id))
        })
        .collect();
    if !failed.is_empty() {
        out.push(HealthCheck {
            code: HealthCode::DiskGroupFailed,
            severity: Severity::Error,
            summary: format!("{} disk group(s) failed: {}", failed.len(), failed.join(", ")),
            affects: failed,
            remedy: "replace the failed devices; the components on them are rebuilt on other disk groups".into(),
            seconds_left: None,
        });
    }
    let unavailable: Vec<String> = inputs
        .volumes
        .iter()
        .filter(|v| v.health == Health::Unavailable)
        .map(|v| v.name.clone())
        .collect();
    if !unavailable.is_empty() {
        out.push(HealthCheck {
            code: HealthCode::VolumeUnavailable,
            severity: Severity::Error,
            summary: format!(
                "{} volume(s) cannot serve I/O now (no reachable owner or no quorum of copies): {}",
                unavailable.len(),
                unavailable.join(", ")
            ),
            affects: unavailable,
            remedy: "bring back the hosts that hold their copies; a new owner takes over within a few seconds when a quorum is reachable".into(),
            seconds_left: None,
        });
    }
    let absent: Vec<(&VolumeHealthInput, &MissingComponent)> = inputs
        .volumes
        .iter()
        .flat_map(|v| v.missing.iter().map(move |m| (v, m)))
        .filter(|(_, m)| !m.resyncing)
        .collect();
    if !absent.is_empty() {
        let volumes = distinct(absent.iter().map(|(v, _)| v.name.clone()));
        out.push(HealthCheck {
            code: HealthCode::ComponentAbsent,
            severity: Severity::Warning,
            summary: format!(
                "{} component(s) absent in {} volume(s): {}",
                absent.len(),
                volumes.len(),
                absent
                    .iter()
                    .map(|(v, m)| format!("{} of {} on {}", m.id, v.name, m.host))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            affects: volumes,
            remedy: "the volumes run with less protection until the hosts return (delta resync) or the repair delay ends (rebuild elsewhere)".into(),
            seconds_left: None,
        });
        let soonest = absent.iter().filter_map(|(_, m)| m.repair_in_s).min();
        let pending: Vec<String> = absent
            .iter()
            .map(|(v, m)| match m.repair_in_s {
                Some(s) => format!("{} of {}: rebuild in {s}s", m.id, v.name),
                None => format!("{} of {}: rebuild after the repair delay", m.id, v.name),
            })
            .collect();
        out.push(HealthCheck {
            code: HealthCode::RepairDelayPending,
            severity: Severity::Info,
            summary: match soonest {
                Some(s) => format!("the first rebuild starts in {s}s: {}", pending.join(", ")),
                None => format!("rebuilds wait for the repair delay: {}", pending.join(", ")),
            },
            affects: absent.iter().map(|(_, m)| m.id.to_string()).collect(),
            remedy: "start the absent hosts before then to resync only what changed; otherwise the copies are rebuilt on other hosts".into(),
            seconds_left: soonest,
        });
    }
    let running: Vec<&ResyncView> = inputs.resyncs.iter().filter(|r| r.is_running()).collect();
    let resyncing = inputs
        .volumes
        .iter()
        .flat_map(|v| v.missing.iter().map(move |m| (v, m)))
        .filter(|(_, m)| m.resyncing)
        .count();
    if !running.is_empty() || resyncing > 0 {
        let left: u64 = running.iter().map(|r| r.left_bytes).sum();
        let mut affects: Vec<String> = running.iter().map(|r| r.volume.clone()).collect();
        affects.extend(
            inputs
                .volumes
                .iter()
                .filter(|v| v.missing.iter().any(|m| m.resyncing))
                .map(|v| v.name.clone()),
        );
        let affects = distinct(affects.into_iter());
        out.push(HealthCheck {
            code: HealthCode::ResyncRunning,
            severity: Severity::Info,
            summary: format!(
                "{} resync(s) running, {} left to examine",
                running.len().max(resyncing.min(1)),
                format_size(left)
            ),
            affects,
            remedy: "nothing to do: `tessera resync list --watch` shows the progress".into(),
            seconds_left: None,
        });
    }
    let cap = inputs.capacity;
    if cap.total_bytes > 0 {
        let used = cap.used_pct();
        let s = inputs.settings;
        let detail = format!(
            "{:.1}% in use: {} used, {} reserved, {} free of {}",
            used,
            format_size(cap.used_bytes),
            format_size(cap.reserved_bytes),
            format_size(cap.free_bytes),
            format_size(cap.total_bytes)
        );
        if used >= f64::from(s.full_pct) {
            out.push(HealthCheck {
                code: HealthCode::DatastoreFull,
                severity: Severity::Error,
                summary: format!("datastore above {}%: {detail}", s.full_pct),
                affects: vec!["datastore".into()],
                remedy: "add hosts or devices, or delete or trim volumes: thin volumes fail writes when no space is left".into(),
                seconds_left: None,
            });
        } else if used >= f64::from(s.nearly_full_pct) {
            out.push(HealthCheck {
                code: HealthCode::DatastoreNearlyFull,
                severity: Severity::Warning,
                summary: format!("datastore above {}%: {detail}", s.nearly_full_pct),
                affects: vec!["datastore".into()],
                remedy: "add capacity or free space (delete volumes, or let guests discard/UNMAP) before it fills".into(),
                seconds_left: None,
            });
        }
        if cap.provisioned_bytes > cap.total_bytes {
            out.push(HealthCheck {
                code: HealthCode::Overcommitted,
                severity: Severity::Info,
                summary: format!(
                    "{} provisioned on {} of capacity ({:.2}x; the largest allowed is {:.2}x)",
                    format_size(cap.provisioned_bytes),
                    format_size(cap.total_bytes),
                    cap.overcommit_ratio,
                    s.max_overcommit_ratio
                ),
                affects: vec!["datastore".into()],
                remedy: "thin volumes can together outgrow the devices: watch free space, or add capacity".into(),
                seconds_left: None,
            });
        }
    }
    out.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.code.cmp(&b.code)));
    out
}

fn distinct(items: impl Iterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = items.collect();
    v.sort();
    v.dedup();
    v
}
