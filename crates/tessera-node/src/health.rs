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
    let degraded: Vec<String> = inputs
        .hosts
        .iter()
        .flat_map(|h| {
            h.disk_groups
                .iter()
                .filter(|g| g.health.starts_with("degraded"))
                .map(move |g| format!("{}/{} ({})", h.id, g.id, g.health))
        })
        .collect();
    if !degraded.is_empty() {
        out.push(HealthCheck {
            code: HealthCode::DiskGroupDegraded,
            severity: Severity::Warning,
            summary: format!(
                "{} disk group(s) degraded: {}",
                degraded.len(),
                degraded.join(", ")
            ),
            affects: degraded,
            remedy:
                "replace the failed device; components on it are rebuilt from their other copies"
                    .into(),
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
    let own: Vec<(&str, Vec<&str>)> = inputs
        .hosts
        .iter()
        .filter(|h| !h.own_settings.is_empty())
        .map(|h| (h.id.as_str(), h.own_settings.names()))
        .collect();
    if !own.is_empty() {
        out.push(HealthCheck {
            code: HealthCode::SettingsDiffer,
            severity: Severity::Info,
            summary: format!(
                "{} of {} hosts have their own values of settings: {}",
                own.len(),
                inputs.hosts.len(),
                own.iter()
                    .map(|(h, names)| format!("{h} ({})", names.join(", ")))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            affects: own.iter().map(|(h, _)| h.to_string()).collect(),
            remedy: "nothing to do if those hosts are meant to differ; else `tessera settings reset NAME --host HOST` makes a host follow the cluster's value again (`tessera settings list --host HOST` shows which values are its own)".into(),
            seconds_left: None,
        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{DiskGroupView, ResyncState};
    use tessera_types::layout::{ComponentPlacement, ComponentRole};

    fn host(id: &str, state: &str, group_health: &str) -> HostView {
        HostView {
            id: id.into(),
            fault_domain: id.into(),
            state: state.into(),
            transport_addr: String::new(),
            nbd_addr: String::new(),
            iscsi_addr: String::new(),
            disk_groups: vec![DiskGroupView {
                id: "dg0".into(),
                health: group_health.into(),
                capacity: CapacityView::default(),
                components: 0,
                physical_bytes: None,
                index_cache: None,
                encryption: None,
            }],
            owned_volumes: Vec::new(),
            capacity: CapacityView::default(),
            read_cache: None,
            lease_ttl_ms: None,
            own_settings: Default::default(),
            reclaim_components: 0,
            reclaim_bytes: 0,
        }
    }

    fn capacity(total: u64, used: u64, provisioned: u64) -> CapacityView {
        CapacityView {
            total_bytes: total,
            used_bytes: used,
            reserved_bytes: 0,
            free_bytes: total - used,
            provisioned_bytes: provisioned,
            overcommit_ratio: crate::control::overcommit_ratio(provisioned, total),
        }
    }

    fn run(
        hosts: &[HostView],
        volumes: &[VolumeHealthInput],
        resyncs: &[ResyncView],
        cap: CapacityView,
    ) -> Vec<HealthCode> {
        checks(&HealthInputs {
            hosts,
            volumes,
            resyncs,
            capacity: &cap,
            settings: &ClusterSettings::default(),
        })
        .into_iter()
        .map(|c| c.code)
        .collect()
    }

    fn volume(health: Health, missing: Vec<MissingComponent>) -> VolumeHealthInput {
        VolumeHealthInput {
            name: "vm1".into(),
            health,
            missing,
        }
    }

    fn missing(resyncing: bool, repair_in_s: Option<u64>) -> MissingComponent {
        MissingComponent {
            id: ComponentId(7),
            host: HostId::new("host-2").expect("id"),
            resyncing,
            repair_in_s,
        }
    }

    #[test]
    fn a_healthy_cluster_has_no_checks() {
        let hosts = [host("host-1", "present", "healthy")];
        let vols = [volume(Health::Healthy, vec![])];
        assert!(run(&hosts, &vols, &[], capacity(100, 10, 50)).is_empty());
    }

    #[test]
    fn each_cause_raises_its_code_and_only_while_it_holds() {
        let ok = [host("host-1", "present", "healthy")];
        let cap = capacity(1000, 10, 100);
        let cases: Vec<(
            Vec<HostView>,
            Vec<VolumeHealthInput>,
            CapacityView,
            HealthCode,
        )> = vec![
            (
                vec![host("host-2", "stopped", "healthy")],
                vec![],
                cap,
                HealthCode::HostDown,
            ),
            (
                vec![host("host-2", "absent", "healthy")],
                vec![],
                cap,
                HealthCode::HostDown,
            ),
            (
                vec![host("host-1", "present", "failed: log damaged")],
                vec![],
                cap,
                HealthCode::DiskGroupFailed,
            ),
            (
                vec![host(
                    "host-1",
                    "present",
                    "degraded: 1 device(s), 0 component(s) failed",
                )],
                vec![],
                cap,
                HealthCode::DiskGroupDegraded,
            ),
            (
                ok.to_vec(),
                vec![volume(Health::Unavailable, vec![])],
                cap,
                HealthCode::VolumeUnavailable,
            ),
            (
                ok.to_vec(),
                vec![volume(Health::Degraded, vec![missing(false, Some(30))])],
                cap,
                HealthCode::ComponentAbsent,
            ),
            (
                ok.to_vec(),
                vec![volume(Health::Degraded, vec![missing(false, Some(30))])],
                cap,
                HealthCode::RepairDelayPending,
            ),
            (
                ok.to_vec(),
                vec![volume(Health::Degraded, vec![missing(true, None)])],
                cap,
                HealthCode::ResyncRunning,
            ),
            (
                ok.to_vec(),
                vec![],
                capacity(1000, 850, 100),
                HealthCode::DatastoreNearlyFull,
            ),
            (
                vec![HostView {
                    own_settings: crate::control::HostSettings {
                        vaai_unmap: Some(false),
                        ..Default::default()
                    },
                    ..host("host-2", "present", "healthy")
                }],
                vec![],
                cap,
                HealthCode::SettingsDiffer,
            ),
            (
                ok.to_vec(),
                vec![],
                capacity(1000, 960, 100),
                HealthCode::DatastoreFull,
            ),
            (
                ok.to_vec(),
                vec![],
                capacity(1000, 10, 1500),
                HealthCode::Overcommitted,
            ),
        ];
        for (hosts, vols, cap, code) in cases {
            let raised = run(&hosts, &vols, &[], cap);
            assert!(raised.contains(&code), "{code:?} not raised: {raised:?}");
            let cleared = run(
                &ok,
                &[volume(Health::Healthy, vec![])],
                &[],
                capacity(1000, 10, 100),
            );
            assert!(!cleared.contains(&code), "{code:?} stays: {cleared:?}");
        }
    }

    #[test]
    fn full_replaces_nearly_full_and_errors_come_first() {
        let hosts = [host("host-2", "stopped", "healthy")];
        let vols = [volume(Health::Unavailable, vec![])];
        let codes = run(&hosts, &vols, &[], capacity(1000, 990, 100));
        assert!(codes.contains(&HealthCode::DatastoreFull));
        assert!(!codes.contains(&HealthCode::DatastoreNearlyFull));
        assert_eq!(codes[0], HealthCode::VolumeUnavailable, "{codes:?}");
    }

    #[test]
    fn the_repair_countdown_names_the_soonest_rebuild() {
        let vols = [volume(
            Health::Degraded,
            vec![missing(false, Some(90)), missing(false, Some(30))],
        )];
        let all = checks(&HealthInputs {
            hosts: &[],
            volumes: &vols,
            resyncs: &[],
            capacity: &CapacityView::default(),
            settings: &ClusterSettings::default(),
        });
        let pending = all
            .iter()
            .find(|c| c.code == HealthCode::RepairDelayPending)
            .expect("raised");
        assert_eq!(pending.seconds_left, Some(30));
        assert!(pending.summary.contains("in 30s"), "{}", pending.summary);
    }

    #[test]
    fn a_running_resync_raises_resync_running_with_what_is_left() {
        let resync = ResyncView {
            volume: "vm1".into(),
            component: ComponentId(7),
            host: "host-2".into(),
            kind: "resync".into(),
            state: ResyncState::Running,
            error: None,
            attempts: 1,
            done_bytes: 0,
            left_bytes: 4 << 20,
            copied_bytes: 0,
            rate_bytes_per_s: 0,
            eta_s: None,
        };
        let all = checks(&HealthInputs {
            hosts: &[],
            volumes: &[],
            resyncs: std::slice::from_ref(&resync),
            capacity: &CapacityView::default(),
            settings: &ClusterSettings::default(),
        });
        let running = all
            .iter()
            .find(|c| c.code == HealthCode::ResyncRunning)
            .expect("raised");
        assert!(running.summary.contains("4.0 MiB"), "{}", running.summary);
        assert_eq!(running.affects, vec!["vm1".to_string()]);
    }

    fn placement(id: u64, host: &str, role: ComponentRole) -> ComponentPlacement {
        ComponentPlacement {
            id: ComponentId(id),
            role,
            host: HostId::new(host).expect("id"),
            disk_group: tessera_types::DiskGroupId::new("dg0").expect("id"),
            fault_domain: tessera_types::FaultDomainId::new(host).expect("id"),
            votes: 1,
            size_bytes: 1 << 20,
            state: ComponentState::Active,
        }
    }

    fn mirror_with_witness() -> Layout {
        Layout {
            volume: tessera_types::VolumeId::new("vm1").expect("name"),
            size_bytes: 1 << 20,
            stripe_unit_bytes: 1 << 20,
            columns: vec![tessera_types::layout::Mirror {
                copies: vec![
                    placement(1, "host-1", ComponentRole::Data),
                    placement(2, "host-2", ComponentRole::Data),
                ],
            }],
            witnesses: vec![placement(3, "host-3", ComponentRole::Witness)],
            generation: 1,
        }
    }

    #[test]
    fn a_component_on_a_host_that_is_down_is_absent_whatever_the_layout_says() {
        let layout = mirror_with_witness();
        let owner = HostId::new("host-1").expect("id");
        let all_up = |_: &HostId| true;
        assert_eq!(
            volume_health(&layout, Some(&owner), all_up),
            (Health::Healthy, Some(&owner))
        );
        let host2_down = |h: &HostId| h.as_str() != "host-2";
        assert_eq!(
            volume_health(&layout, Some(&owner), host2_down),
            (Health::Degraded, Some(&owner))
        );
        // The owner's host down: no owner is shown and I/O waits for a new one.
        let host1_down = |h: &HostId| h.as_str() != "host-1";
        assert_eq!(
            volume_health(&layout, Some(&owner), host1_down),
            (Health::Unavailable, None)
        );
        // Two of three votes gone: no quorum even with an owner.
        let two_down = |h: &HostId| h.as_str() == "host-1";
        assert_eq!(
            volume_health(&layout, Some(&owner), two_down).0,
            Health::Unavailable
        );
        assert_eq!(volume_health(&layout, None, all_up).0, Health::Unavailable);
    }

    proptest::proptest! {
        /// Space checks follow the thresholds exactly: FULL at or above
        /// full_pct, NEARLY_FULL between the two, neither below; and
        /// OVERCOMMITTED exactly when more is provisioned than exists.
        #[test]
        fn space_checks_follow_their_thresholds(
            total in 1u64..(1 << 50),
            used_permille in 0u64..=1000,
            provisioned in 0u64..(1 << 52),
            nearly in 1u8..99,
            gap in 1u8..50,
        ) {
            let full = (u16::from(nearly) + u16::from(gap)).min(100) as u8;
            let used = total / 1000 * used_permille;
            let cap = capacity(total, used, provisioned);
            let settings = ClusterSettings {
                nearly_full_pct: nearly,
                full_pct: full,
                ..ClusterSettings::default()
            };
            let codes: Vec<HealthCode> = checks(&HealthInputs {
                hosts: &[],
                volumes: &[],
                resyncs: &[],
                capacity: &cap,
                settings: &settings,
            })
            .into_iter()
            .map(|c| c.code)
            .collect();
            let pct = cap.used_pct();
            proptest::prop_assert_eq!(
                codes.contains(&HealthCode::DatastoreFull),
                pct >= f64::from(full)
            );
            proptest::prop_assert_eq!(
                codes.contains(&HealthCode::DatastoreNearlyFull),
                pct >= f64::from(nearly) && pct < f64::from(full)
            );
            proptest::prop_assert_eq!(
                codes.contains(&HealthCode::Overcommitted),
                provisioned > total
            );
        }
    }
}
