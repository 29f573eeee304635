//! Human output: the API's views as aligned tables and trees.
//!
//! Owns: the words and layout of every table the CLI prints. Must not
//! touch: the network, the process's exit; each function takes a view and
//! returns text, so it is tested without a cluster.
//! Invariant: sizes are printed with [`format_size`] (binary units), a value
//! the API did not know is printed as `-` (or `unknown` for bytes of an
//! unreachable data copy), never as a made-up zero.

use crate::table::Table;
use std::collections::BTreeMap;
use tessera_node::control::{
    AuditRecord, CapacityView, ClusterSettings, ComponentView, CreatedToken, EncryptionView,
    EvacuationView, EventView, FillView, Health, HealthCheck, HealthCode, HealthReport,
    HostSettingsView, HostView, IscsiAccessView, ObjectView, ResyncState, ResyncView, ScrubView,
    Severity, SnapshotDeleted, SnapshotView, StatusView, TokenView, VerifyReport, VolumeView,
};
use tessera_types::format_size;
use tessera_types::layout::{ComponentRole, ComponentState};
use tessera_types::policy::{FaultTolerance, Policy, VolumeQos};
use tessera_types::Epoch;

/// The word for a health value.
pub fn health(h: Health) -> &'static str {
    match h {
        Health::Healthy => "healthy",
        Health::Degraded => "degraded",
        Health::Unavailable => "unavailable",
    }
}

fn component_state(s: ComponentState) -> &'static str {
    match s {
        ComponentState::Active => "active",
        ComponentState::Absent => "absent",
        ComponentState::Resyncing => "resyncing",
        ComponentState::Degraded => "degraded",
    }
}

fn fault_tolerance(f: FaultTolerance) -> &'static str {
    match f {
        FaultTolerance::Raid1 => "RAID-1",
    }
}

fn owner(owner: &Option<String>, epoch: Option<Epoch>) -> (String, String) {
    (
        owner.clone().unwrap_or_else(|| "-".to_string()),
        epoch.map_or_else(|| "-".to_string(), |e| e.0.to_string()),
    )
}

fn capacity_line(c: &CapacityView) -> String {
    format!(
        "{} total, {} used, {} reserved, {} free; {} provisioned ({:.2}x overcommit)",
        format_size(c.total_bytes),
        format_size(c.used_bytes),
        format_size(c.reserved_bytes),
        format_size(c.free_bytes),
        format_size(c.provisioned_bytes),
        c.overcommit_ratio
    )
}

fn severity(s: Severity) -> &'static str {
    match s {
        Severity::Info => "INFO",
        Severity::Warning => "WARN",
        Severity::Error => "ERROR",
    }
}

fn code(c: HealthCode) -> String {
    serde_json::to_value(c)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{c:?}"))
}

/// One line per check: severity, code, summary.
fn check_lines(checks: &[HealthCheck]) -> String {
    checks
        .iter()
        .map(|c| {
            format!(
                "  [{}] {}: {}\n",
                severity(c.severity),
                code(c.code),
                c.summary
            )
        })
        .collect()
}

/// `tessera health`: overall health, then each check with what it affects
/// and what to do.
pub fn health_report(r: &HealthReport) -> String {
    let mut out = format!("health: {}\n", health(r.health));
    if r.checks.is_empty() {
        out.push_str("no problems found\n");
    }
    for c in &r.checks {
        out.push_str(&format!(
            "\n[{}] {}: {}\n",
            severity(c.severity),
            code(c.code),
            c.summary
        ));
        if let Some(s) = c.seconds_left {
            out.push_str(&format!("    time left: {}\n", eta_text(s)));
        }
        if !c.affects.is_empty() {
            out.push_str(&format!("    affects: {}\n", c.affects.join(", ")));
        }
        out.push_str(&format!("    remedy: {}\n", c.remedy));
    }
    out
}

fn eta_text(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    if h > 0 {
        format!("{h}h{m:02}m{s:02}s")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}

/// `tessera settings show`.
/// Each setting: its name, value, default and meaning.
fn setting_rows(s: &ClusterSettings) -> Vec<Vec<String>> {
    let read_cache_default = "0.4% of each host's memory, at most 1.0 GiB";
    let mut rows = Vec::new();
    let d = ClusterSettings::default();
    rows.push(vec![
        "max_overcommit_ratio".into(),
        format!("{:.2}", s.max_overcommit_ratio),
        format!("{:.2}", d.max_overcommit_ratio),
        "largest provisioned/capacity ratio a create or resize may reach".into(),
    ]);
    rows.push(vec![
        "nearly_full_pct".into(),
        format!("{}%", s.nearly_full_pct),
        format!("{}%", d.nearly_full_pct),
        "use at which DATASTORE_NEARLY_FULL warns and iSCSI initiators hear of the thin provisioning soft threshold".into(),
    ]);
    rows.push(vec![
        "full_pct".into(),
        format!("{}%", s.full_pct),
        format!("{}%", d.full_pct),
        "use at which DATASTORE_FULL is an error".into(),
    ]);
    rows.push(vec![
        "read_cache_bytes".into(),
        match s.read_cache_bytes {
            None => "default".to_string(),
            Some(0) => "0 (off)".to_string(),
            Some(b) => format_size(b),
        },
        read_cache_default.into(),
        "RAM each host gives the blocks of the volumes it owns; 0 disables".into(),
    ]);
    rows.push(vec![
        "index_cache_bytes".into(),
        match s.index_cache_bytes {
            None => "default".to_string(),
            Some(b) => format_size(b),
        },
        "each host's configured budget".into(),
        "RAM each host gives the index pages of its disk groups (the metadata cache)".into(),
    ]);
    rows.push(vec![
        "index_prefetch_bytes".into(),
        match s.index_prefetch_bytes {
            0 => "0 (off)".to_string(),
            b => format_size(b),
        },
        format_size(d.index_prefetch_bytes),
        "address space whose index pages are read ahead after a miss; 0 turns it off".into(),
    ]);
    rows.push(vec![
        "repair_delay_s".into(),
        match s.repair_delay_s {
            None => "default".to_string(),
            Some(0) => "0 (at once)".to_string(),
            Some(secs) => format!("{secs}s"),
        },
        "each host's configured delay (3600s unless set)".into(),
        "seconds a component may stay absent before it is rebuilt elsewhere; 0 rebuilds at once"
            .into(),
    ]);
    rows.push(vec![
        "lease_ttl_ms".into(),
        match s.lease_ttl_ms {
            None => "default".to_string(),
            Some(ms) => format!("{ms} ms"),
        },
        "each host's configured lease (4000 ms unless set)".into(),
        "how long a host that stops answering keeps its volumes before others take them over"
            .into(),
    ]);
    rows.push(vec![
        "resync_delay_multiplier".into(),
        s.resync_delay_multiplier.to_string(),
        d.resync_delay_multiplier.to_string(),
        "how much resync and rebuild yield to guest I/O on a busy host (1-256)".into(),
    ]);
    rows.push(vec![
        "scrub_period_h".into(),
        match s.scrub_period_h {
            0 => "0 (off)".to_string(),
            h => format!("{h}h"),
        },
        format!("{}h", d.scrub_period_h),
        "hours in which every stored block is verified once; 0 turns it off".into(),
    ]);
    let switches = [
        (
            "vaai_ats",
            s.vaai_ats,
            "iSCSI units offer COMPARE AND WRITE (ATS locking)",
        ),
        (
            "vaai_xcopy",
            s.vaai_xcopy,
            "iSCSI units offer EXTENDED COPY (clones by shared blocks)",
        ),
        (
            "vaai_write_same",
            s.vaai_write_same,
            "iSCSI units offer WRITE SAME (block zeroing)",
        ),
        (
            "vaai_unmap",
            s.vaai_unmap,
            "iSCSI units offer UNMAP (space reclamation)",
        ),
    ];
    for (name, on, meaning) in switches {
        rows.push(vec![
            name.into(),
            on_off(on).into(),
            "on".into(),
            meaning.into(),
        ]);
    }
    rows
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// `tessera settings list`: every setting with its value, default and
/// meaning.
pub fn settings(s: &ClusterSettings) -> String {
    let mut t = Table::new(&["SETTING", "VALUE", "DEFAULT", "MEANING"]);
    for row in setting_rows(s) {
        t.row(row);
    }
    t.render()
}

/// Under `tessera settings list`: the hosts that do not follow the cluster
/// in everything, and in what (nothing when all do).
pub fn hosts_own_settings(hosts: &[HostView]) -> String {
    let mut out = String::new();
    for h in hosts.iter().filter(|h| !h.own_settings.is_empty()) {
        out.push_str(&format!(
            "{} has its own {} (tessera settings list --host {})\n",
            h.id,
            h.own_settings.names().join(", "),
            h.id
        ));
    }
    if out.is_empty() {
        out
    } else {
        format!("\n{out}")
    }
}

/// `tessera settings get NAME`: that setting's row, or None for a name
/// there is no setting of.
pub fn setting(s: &ClusterSettings, name: &str) -> Option<String> {
    let row = setting_rows(s).into_iter().find(|r| r[0] == name)?;
    let mut t = Table::new(&["SETTING", "VALUE", "DEFAULT", "MEANING"]);
    t.row(row);
    Some(t.render())
}

/// Each setting a host follows, with where its value comes from.
fn host_setting_rows(view: &HostSettingsView) -> Vec<Vec<String>> {
    let own = view.own.names();
    setting_rows(&view.settings)
        .into_iter()
        .map(|mut row| {
            let source = if own.contains(&row[0].as_str()) {
                format!("host {}", view.host)
            } else {
                "cluster".to_string()
            };
            row.insert(2, source);
            row
        })
        .collect()
}

/// A table of settings rows with where each value comes from.
fn host_settings_table(rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut t = Table::new(&["SETTING", "VALUE", "FROM", "DEFAULT", "MEANING"]);
    for row in rows {
        t.row(row);
    }
    t.render()
}

/// `tessera settings list --host HOST`: every setting the host follows,
/// with where its value comes from (the host's own or the cluster's).
pub fn host_settings(view: &HostSettingsView) -> String {
    host_settings_table(host_setting_rows(view))
}

/// `tessera settings get NAME --host HOST`: that setting's row, or None
/// for a name there is no setting of.
pub fn host_setting(view: &HostSettingsView, name: &str) -> Option<String> {
    let row = host_setting_rows(view).into_iter().find(|r| r[0] == name)?;
    Some(host_settings_table([row]))
}

/// The names of the settings, in the order `list` shows them.
pub fn setting_names() -> Vec<String> {
    setting_rows(&ClusterSettings::default())
        .into_iter()
        .map(|r| r[0].clone())
        .collect()
}

/// `tessera status`.
pub fn status(s: &StatusView) -> String {
    let mut out = format!(
        "cluster {}: {}\ncapacity: {}\n",
        s.cluster,
        health(s.health),
        capacity_line(&s.capacity)
    );
    if !s.checks.is_empty() {
        out.push_str(&format!(
            "checks ({}; `tessera health` says what to do):\n",
            s.checks.len()
        ));
        out.push_str(&check_lines(&s.checks));
    }
    out.push_str(&format!("\nHOSTS ({})\n", s.hosts.len()));
    out.push_str(&host_table(&s.hosts));
    out.push_str(&format!("\nVOLUMES ({})\n", s.volumes.len()));
    out.push_str(&or_none(volumes(&s.volumes), s.volumes.is_empty()));
    let running = s.resyncs.iter().filter(|r| r.is_running()).count();
    out.push_str(&format!("\nRESYNCS ({running} running)\n"));
    out.push_str(&or_none(resyncs(&s.resyncs), s.resyncs.is_empty()));
    out
}

fn or_none(table: String, empty: bool) -> String {
    if empty {
        "(none)\n".to_string()
    } else {
        table
    }
}

fn host_table(hosts: &[HostView]) -> String {
    let mut t = Table::new(&[
        "HOST",
        "FAULT DOMAIN",
        "STATE",
        "TRANSPORT",
        "NBD",
        "ISCSI",
        "DISK GROUPS",
        "USED",
        "FREE",
        "PROVISIONED",
        "TOTAL",
        "OWNED VOLUMES",
        "LEASE",
    ]);
    for h in hosts {
        let used: u64 = h.disk_groups.iter().map(|d| d.capacity.used_bytes).sum();
        let total: u64 = h.disk_groups.iter().map(|d| d.capacity.total_bytes).sum();
        let free: u64 = h.disk_groups.iter().map(|d| d.capacity.free_bytes).sum();
        let provisioned: u64 = h
            .disk_groups
            .iter()
            .map(|d| d.capacity.provisioned_bytes)
            .sum();
        t.row(vec![
            h.id.clone(),
            h.fault_domain.clone(),
            h.state.clone(),
            h.transport_addr.clone(),
            h.nbd_addr.clone(),
            h.iscsi_addr.clone(),
            h.disk_groups.len().to_string(),
            format_size(used),
            format_size(free),
            format_size(provisioned),
            format_size(total),
            h.owned_volumes.len().to_string(),
            h.lease_ttl_ms
                .map_or_else(|| "-".to_string(), |ms| format!("{ms} ms")),
        ]);
    }
    t.render()
}

/// `tessera host list`: the hosts, then every disk group.
pub fn hosts(hosts: &[HostView]) -> String {
    let mut out = host_table(hosts);
    let mut groups = Table::new(&[
        "HOST",
        "DISK GROUP",
        "HEALTH",
        "COMPONENTS",
        "USED",
        "PHYSICAL",
        "RESERVED",
        "FREE",
        "PROVISIONED",
        "OVERCOMMIT",
        "TOTAL",
    ]);
    for h in hosts {
        for d in &h.disk_groups {
            groups.row(vec![
                h.id.clone(),
                d.id.clone(),
                d.health.clone(),
                d.components.to_string(),
                format_size(d.capacity.used_bytes),
                d.physical_bytes.map_or("-".to_string(), format_size),
                format_size(d.capacity.reserved_bytes),
                format_size(d.capacity.free_bytes),
                format_size(d.capacity.provisioned_bytes),
                format!("{:.2}x", d.capacity.overcommit_ratio),
                format_size(d.capacity.total_bytes),
            ]);
        }
    }
    if !groups.is_empty() {
        out.push('\n');
        out.push_str(&groups.render());
    }
    if hosts.iter().any(|h| h.reclaim_components > 0) {
        out.push('\n');
        out.push_str(&reclaims(hosts));
    }
    if hosts.iter().any(|h| h.read_cache.is_some()) {
        out.push('\n');
        out.push_str(&read_caches(hosts));
    }
    if hosts
        .iter()
        .any(|h| h.disk_groups.iter().any(|d| d.index_cache.is_some()))
    {
        out.push('\n');
        out.push_str(&index_caches(hosts));
    }
    out
}

/// Components that no record names any more, waiting for their hosts to
/// delete them.
fn reclaims(hosts: &[HostView]) -> String {
    let mut t = Table::new(&["HOST", "STATE", "TO RECLAIM", "SPACE"]);
    for h in hosts.iter().filter(|h| h.reclaim_components > 0) {
        t.row(vec![
            h.id.clone(),
            h.state.clone(),
            format!("{} component(s)", h.reclaim_components),
            format!("up to {}", format_size(h.reclaim_bytes)),
        ]);
    }
    format!(
        "components to reclaim (deleted by their hosts once up):\n{}",
        t.render()
    )
}

/// `tessera snapshot delete`: what was deleted, and what waits for hosts
/// out of reach.
pub fn snapshot_deleted(d: &SnapshotDeleted) -> String {
    let mut out = format!("deleted snapshot {} of volume {}\n", d.name, d.volume);
    for p in &d.reclaim_pending {
        out.push_str(&format!(
            "{} component(s) wait for host {} to be back, which then deletes them and frees their space\n",
            p.components, p.host
        ));
    }
    out
}

/// The index cache (metadata cache) of every disk group this control
/// plane runs.
fn index_caches(hosts: &[HostView]) -> String {
    let mut t = Table::new(&[
        "HOST",
        "DISK GROUP",
        "INDEX CACHE",
        "BUDGET",
        "PAGES",
        "HITS",
        "MISSES",
        "READ AHEAD",
        "EVICTED",
        "HIT RATE",
    ]);
    for h in hosts {
        for d in &h.disk_groups {
            let Some(c) = &d.index_cache else {
                continue;
            };
            let looked = c.hits + c.misses;
            t.row(vec![
                h.id.clone(),
                d.id.clone(),
                format_size(c.resident_bytes),
                format_size(c.budget_bytes),
                c.resident_pages.to_string(),
                c.hits.to_string(),
                c.misses.to_string(),
                format!("{} ({} pages)", c.prefetched, c.prefetch_pages),
                c.evicted.to_string(),
                if looked == 0 {
                    "-".to_string()
                } else {
                    format!("{:.1}%", c.hits as f64 * 100.0 / looked as f64)
                },
            ]);
        }
    }
    t.render()
}

/// The read cache of every host this control plane runs.
fn read_caches(hosts: &[HostView]) -> String {
    let mut t = Table::new(&[
        "HOST",
        "READ CACHE",
        "BUDGET",
        "CACHED",
        "HITS",
        "MISSES",
        "HIT RATE",
    ]);
    for h in hosts {
        let Some(c) = &h.read_cache else {
            continue;
        };
        t.row(vec![
            h.id.clone(),
            if c.budget_bytes > 0 { "on" } else { "off" }.to_string(),
            format_size(c.budget_bytes),
            format_size(c.cached_bytes),
            c.hits.to_string(),
            c.misses.to_string(),
            c.hit_rate
                .map_or("-".to_string(), |r| format!("{:.1}%", r * 100.0)),
        ]);
    }
    t.render()
}

/// The lines printed after `host evacuate` or `disk-group evacuate`.
pub fn evacuation(e: &EvacuationView) -> String {
    format!(
        "evacuating {} ({}): {} component(s), {} of data copies to move; \
         `tessera host show {}` and `tessera resync list --watch` show the progress\n",
        e.host,
        e.disk_groups.join(", "),
        e.components_left,
        format_size(e.bytes_left),
        e.host
    )
}

/// `tessera policy list`.
pub fn policies(policies: &[Policy]) -> String {
    let mut t = Table::new(&[
        "NAME",
        "FTT",
        "METHOD",
        "STRIPE WIDTH",
        "SPACE RESERVATION",
        "CHECKSUM",
        "QOS",
    ]);
    for p in policies {
        t.row(policy_row(p));
    }
    t.render()
}

fn policy_row(p: &Policy) -> Vec<String> {
    vec![
        p.name.to_string(),
        p.failures_to_tolerate.to_string(),
        fault_tolerance(p.fault_tolerance).to_string(),
        p.stripe_width.to_string(),
        format!("{}%", p.space_reservation_pct),
        if p.checksum { "on" } else { "off" }.to_string(),
        qos(&p.qos),
    ]
}

/// A volume's QoS in a few words: its limits and minimum, or "-".
fn qos(q: &VolumeQos) -> String {
    let mut parts = Vec::new();
    if q.iops_limit != 0 {
        parts.push(format!("max {} IOPS", q.iops_limit));
    }
    if q.bandwidth_limit_mib_s != 0 {
        parts.push(format!("max {} MiB/s", q.bandwidth_limit_mib_s));
    }
    if q.iops_minimum != 0 {
        parts.push(format!("min {} IOPS", q.iops_minimum));
    }
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(", ")
    }
}

/// The line printed after `policy create`.
pub fn policy_created(p: &Policy) -> String {
    format!(
        "created policy {}: FTT={}, {}, {} copies, stripe width {}, {}% space reservation\n",
        p.name,
        p.failures_to_tolerate,
        fault_tolerance(p.fault_tolerance),
        p.copies(),
        p.stripe_width,
        p.space_reservation_pct
    )
}

/// `tessera volume list`: a row per volume, then a line per full clone
/// being filled with its progress.
pub fn volumes(volumes: &[VolumeView]) -> String {
    let mut t = Table::new(&[
        "NAME", "SIZE", "POLICY", "BLOCK", "STATE", "USED", "OWNER", "EPOCH", "CLIENTS", "QOS",
    ]);
    for v in volumes {
        let (owner, epoch) = owner(&v.owner, v.epoch);
        t.row(vec![
            v.name.clone(),
            format_size(v.size_bytes),
            v.policy.clone(),
            block_format(v.block_bytes).to_string(),
            match &v.fill {
                Some(f) => format!("filling {}%", f.percent()),
                None => health(v.state).to_string(),
            },
            format_size(v.used_bytes),
            owner,
            epoch,
            v.open_by.to_string(),
            qos(&v.qos),
        ]);
    }
    let mut out = t.render();
    let filling: Vec<&VolumeView> = volumes.iter().filter(|v| v.fill.is_some()).collect();
    if !filling.is_empty() {
        out.push('\n');
        for v in filling {
            if let Some(f) = &v.fill {
                out.push_str(&fill_progress(&v.name, f));
                out.push('\n');
            }
        }
    }
    out
}

/// One line saying where the fill of full clone `name` stands.
pub fn fill_progress(name: &str, f: &FillView) -> String {
    let mut line = format!(
        "{name} is being filled from {}: {}%, {} of {} done, {} copied",
        f.from,
        f.percent(),
        format_size(f.done_bytes),
        format_size(f.done_bytes + f.left_bytes),
        format_size(f.copied_bytes),
    );
    if f.rate_bytes_per_s > 0 {
        line.push_str(&format!(", {}/s", format_size(f.rate_bytes_per_s)));
    }
    if let Some(eta) = f.eta_s {
        line.push_str(&format!(", about {} left", eta_text(eta)));
    }
    if f.runs > 1 {
        line.push_str(&format!(
            " (run {}, taken up at {})",
            f.runs,
            format_size(f.resumed_from_bytes)
        ));
    }
    if let Some(e) = &f.error {
        line.push_str(&format!("; retrying after: {e}"));
    }
    line
}

/// What `volume clone --full` prints once the clone is made: the volume,
/// and that it is being filled.
pub fn fill_started(v: &VolumeView) -> String {
    let mut out = volume_changed("cloned", v);
    if let Some(f) = &v.fill {
        out.push_str(&format!(
            "full clone of {}: it is being filled in the background and serves clients once filled; `tessera volume show {}` shows the progress\n",
            f.from, v.name
        ));
    }
    out
}

/// What `volume clone --full` prints once the fill of `v` ended (`from`:
/// the snapshot it copied, as the last progress it saw said). The data a
/// just-filled clone holds is what was copied.
pub fn fill_done(v: &VolumeView, from: Option<&str>) -> String {
    match from {
        Some(from) => format!(
            "volume {} is filled: a full copy of {from}, {} of data; it serves clients now\n",
            v.name,
            format_size(v.used_bytes),
        ),
        None => format!("volume {} is filled; it serves clients now\n", v.name),
    }
}

/// `tessera snapshot list`.
pub fn snapshots(snapshots: &[SnapshotView]) -> String {
    if snapshots.is_empty() {
        return "no snapshots\n".to_string();
    }
    let mut t = Table::new(&[
        "NAME",
        "TAKEN (UTC)",
        "SIZE",
        "EPOCH",
        "COPIES",
        "HELD ALONE",
        "SHARED",
        "EXPORT",
        "GROUP",
        "ISCSI TARGET",
    ]);
    for s in snapshots {
        t.row(vec![
            s.name.clone(),
            utc(s.created_ms),
            format_size(s.size_bytes),
            s.epoch.to_string(),
            s.components.len().to_string(),
            s.held_alone_bytes.map_or("?".to_string(), format_size),
            s.held_shared_bytes.map_or("?".to_string(), format_size),
            s.export.clone(),
            if s.group.is_empty() {
                "-".to_string()
            } else {
                s.group.join(",")
            },
            s.iscsi_target.clone(),
        ]);
    }
    t.render()
}

/// The line printed after `snapshot create`.
pub fn snapshot_taken(s: &SnapshotView) -> String {
    format!(
        "took snapshot {} of volume {} ({}, {} copies, epoch {}) at {} UTC; read it at NBD export {} or iSCSI target {}, LUN 0\n",
        s.name,
        s.volume,
        format_size(s.size_bytes),
        s.components.len(),
        s.epoch,
        utc(s.created_ms),
        s.export,
        s.iscsi_target
    ) + &if s.group.is_empty() {
        String::new()
    } else {
        format!(
            "at the same point in time as its snapshots of {}\n",
            s.group.join(", ")
        )
    }
}

/// `tessera token list`.
pub fn tokens(tokens: &[TokenView]) -> String {
    if tokens.is_empty() {
        return "no API tokens\n".to_string();
    }
    let mut t = Table::new(&[
        "ID",
        "NAME",
        "ROLE",
        "MADE (UTC)",
        "EXPIRES (UTC)",
        "MADE BY",
    ]);
    for k in tokens {
        t.row(vec![
            k.id.clone(),
            k.name.clone(),
            k.role.to_string(),
            utc(k.created_ms),
            k.expires_ms.map_or("never".to_string(), utc),
            k.created_by.clone().unwrap_or_else(|| "-".to_string()),
        ]);
    }
    t.render()
}

/// `tessera audit`: oldest first.
pub fn audit(entries: &[AuditRecord]) -> String {
    if entries.is_empty() {
        return "no changes asked of the API yet\n".to_string();
    }
    let mut t = Table::new(&["TIME (UTC)", "TOKEN", "ROLE", "REQUEST", "ANSWER"]);
    for e in entries {
        let who = match (&e.token_name, &e.token_id) {
            (Some(name), Some(id)) => format!("{name} ({id})"),
            _ => "no accepted token".to_string(),
        };
        t.row(vec![
            utc(e.at_ms),
            who,
            e.role.map_or("-".to_string(), |r| r.to_string()),
            format!("{} {}", e.method, e.path),
            e.status.to_string(),
        ]);
    }
    t.render()
}

/// `tessera events`: the history, oldest first (`header`: with the
/// column titles, which `--follow` prints once). Columns have fixed widths,
/// so the lines `--follow` adds later line up with the first ones.
pub fn events(entries: &[EventView], header: bool) -> String {
    if entries.is_empty() && header {
        return "no events yet\n".to_string();
    }
    let line = |time: &str, code: &str, host: &str, subject: &str, what: &str| {
        format!("{time:<19}  {code:<19}  {host:<7}  {subject:<24}  {what}\n")
    };
    let mut out = String::new();
    if header {
        out.push_str(&line("TIME (UTC)", "EVENT", "HOST", "SUBJECT", "WHAT"));
    }
    for e in entries {
        let what = match &e.by {
            Some(by) => format!("{} (by {by})", e.message),
            None => e.message.clone(),
        };
        out.push_str(&line(
            &utc(e.at_ms),
            &e.code,
            e.host.as_deref().unwrap_or("-"),
            &e.subject,
            &what,
        ));
    }
    out
}

/// What `tessera token create` prints: the token, this once.
pub fn token_created(t: &CreatedToken) -> String {
    format!(
        "made token {} ({} role, id {}, {}):\n{}\nIt is shown this once: give it to its holder (TESSERA_TOKEN, or a file only they can read named by TESSERA_TOKEN_FILE); `tessera token revoke {}` ends it.\n",
        t.view.name,
        t.view.role,
        t.view.id,
        t.view
            .expires_ms
            .map_or("until revoked".to_string(), |ms| format!("until {} UTC", utc(ms))),
        t.token,
        t.view.id
    )
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS` (UTC).
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// How a volume presents its blocks: "512e" (512-byte logical blocks over
/// 4 KiB physical ones) or "4Kn".
fn block_format(block_bytes: u32) -> &'static str {
    if block_bytes == 4096 {
        "4Kn"
    } else {
        "512e"
    }
}

/// The line printed after `volume create` or `volume resize`.
pub fn volume_changed(verb: &str, v: &VolumeView) -> String {
    let (owner, epoch) = owner(&v.owner, v.epoch);
    let mut out = format!(
        "{verb} volume {}: {}, policy {}, {}, {}, owner {owner} (epoch {epoch})\n",
        v.name,
        format_size(v.size_bytes),
        v.policy,
        block_format(v.block_bytes),
        health(v.state)
    );
    for w in &v.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}

fn component_row(prefix: &str, c: &ComponentView) -> Vec<String> {
    let role = match c.role {
        ComponentRole::Data => "component",
        ComponentRole::Witness => "witness",
    };
    vec![
        format!("{prefix}{role} {}", c.id),
        c.host.clone(),
        c.disk_group.clone(),
        c.fault_domain.clone(),
        component_state(c.state).to_string(),
        c.votes.to_string(),
        match (c.role, c.allocated_bytes) {
            (_, Some(bytes)) => format_size(bytes),
            // A witness holds votes, not data.
            (ComponentRole::Witness, None) => "-".to_string(),
            (ComponentRole::Data, None) => "unknown".to_string(),
        },
        if c.dirty_bytes == 0 {
            "-".to_string()
        } else {
            format_size(c.dirty_bytes)
        },
    ]
}

/// `tessera object show`: the component tree in the shape of RVC's object
/// info. A volume striped over several columns is a RAID-0 of RAID-1
/// mirrors; each mirror lists its copies; witnesses hang off the object.
pub fn object(o: &ObjectView) -> String {
    let (owner, epoch) = owner(&o.owner, o.epoch);
    let mut out = format!(
        "volume {}: {}, policy {}, {}, owner {owner} (epoch {epoch}), layout generation {}\n\n",
        o.volume,
        format_size(o.size_bytes),
        o.policy,
        health(o.state),
        o.generation
    );
    let mut columns: BTreeMap<Option<usize>, Vec<&ComponentView>> = BTreeMap::new();
    let mut witnesses = Vec::new();
    for c in &o.components {
        match c.role {
            ComponentRole::Data => columns.entry(c.column).or_default().push(c),
            ComponentRole::Witness => witnesses.push(c),
        }
    }
    let mut t = Table::new(&[
        "TREE",
        "HOST",
        "DISK GROUP",
        "FAULT DOMAIN",
        "STATE",
        "VOTES",
        "BYTES",
        "TO RESYNC",
    ]);
    let striped = columns.len() > 1;
    let indent = if striped {
        t.row(vec![format!("RAID-0 ({} columns)", columns.len())]);
        "  "
    } else {
        ""
    };
    for (column, copies) in &columns {
        let title = match column {
            Some(k) => format!("{indent}RAID-1 column {k}"),
            None => format!("{indent}RAID-1 (column unknown)"),
        };
        t.row(vec![title]);
        for c in copies {
            t.row(component_row(&format!("{indent}  "), c));
        }
    }
    for w in witnesses {
        t.row(component_row("", w));
    }
    out.push_str(&t.render());
    let f = &o.offloads;
    out.push_str(&format!(
        "\noffloads: ATS {} ({} miscompared), CLONE {} commands ({} blocks read, {} written, \
         {} shared), ZERO {} blocks, DELETE {} blocks, out of space {}\n",
        f.ats,
        f.ats_miscompare,
        f.clone_commands,
        f.clone_read_blocks,
        f.clone_write_blocks,
        format_size(f.clone_shared_bytes),
        f.zero_blocks,
        f.delete_blocks,
        f.out_of_space
    ));
    let c = &o.read_cache;
    out.push_str(&format!(
        "read cache: {} hits, {} misses (blocks of 4 KiB read through the owner)\n",
        c.hits, c.misses
    ));
    out
}

/// `tessera volume access`.
pub fn iscsi_access(a: &IscsiAccessView) -> String {
    let initiators = if a.allowed_initiators.is_empty() {
        "every initiator".to_string()
    } else {
        a.allowed_initiators.join(", ")
    };
    let chap = match (&a.chap_user, &a.target_chap_user) {
        (None, _) => "no CHAP".to_string(),
        (Some(u), None) => format!("CHAP as {u}"),
        (Some(u), Some(t)) => format!("mutual CHAP as {u}, target answers as {t}"),
    };
    let named =
        !a.allowed_initiators.is_empty() || a.chap_user.is_some() || !a.nbd_clients.is_empty();
    let initiators = if named && a.allowed_initiators.is_empty() && a.chap_user.is_none() {
        "no initiator (the settings name only NBD clients)".to_string()
    } else {
        initiators
    };
    let plain = match a.plain_nbd {
        _ if named => "none",
        tessera_node::control::PlainNbd::Loopback => "from the serving host (loopback)",
        tessera_node::control::PlainNbd::Anywhere => "from anywhere",
        tessera_node::control::PlainNbd::Nowhere => "none",
    };
    let certificates = if a.nbd_clients.is_empty() && !named {
        "any certificate of the cluster CA".to_string()
    } else if a.nbd_clients.is_empty() {
        "none".to_string()
    } else {
        a.nbd_clients.join(", ")
    };
    format!(
        "volume {}: target {}, LUN 0\niSCSI admits: {initiators}\nauthentication: {chap}\n\
         NBD admits: {certificates} (over TLS); clients without a certificate: {plain}\n",
        a.volume, a.target
    )
}

/// `tessera object verify`.
pub fn verify(r: &VerifyReport) -> String {
    let verdict = if r.identical {
        "copies identical"
    } else {
        "copies DIFFER"
    };
    let mut out = format!(
        "volume {}: {verdict} ({} compared per copy)\n",
        r.volume,
        format_size(r.compared_bytes)
    );
    if !r.snapshots.is_empty() {
        out.push_str(&format!(
            "snapshots compared too: {}\n",
            r.snapshots.join(", ")
        ));
    }
    for s in &r.skipped {
        out.push_str(&format!("skipped: {s}\n"));
    }
    if !r.divergences.is_empty() {
        let mut t = Table::new(&["SNAPSHOT", "COLUMN", "OFFSET", "LENGTH", "COMPONENTS"]);
        for d in &r.divergences {
            t.row(vec![
                d.snapshot.clone().unwrap_or_else(|| "-".to_string()),
                d.column.to_string(),
                format!("byte {}", d.component_offset),
                format_size(d.len),
                d.components
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
            ]);
        }
        out.push('\n');
        out.push_str(&t.render());
    }
    out
}

/// Percent of the work done, rounded down; 100 when there was nothing to do.
pub fn percent_done(done_bytes: u64, left_bytes: u64) -> u64 {
    let total = u128::from(done_bytes) + u128::from(left_bytes);
    if total == 0 {
        return 100;
    }
    (u128::from(done_bytes) * 100 / total) as u64
}

/// Time left, as `1h02m`, `3m05s` or `12s`; `-` when unknown.
pub fn eta(seconds: Option<u64>) -> String {
    match seconds {
        None => "-".to_string(),
        Some(s) if s >= 3600 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        Some(s) if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        Some(s) => format!("{s}s"),
    }
}

/// `tessera resync list`: one row per resync or rebuild of a component,
/// with the current attempt's progress. The last failure's reason is
/// printed on a line under the table, so one long reason does not stretch
/// every column.
pub fn resyncs(resyncs: &[ResyncView]) -> String {
    let mut t = Table::new(&[
        "VOLUME",
        "COMPONENT",
        "HOST",
        "KIND",
        "STATE",
        "PROGRESS",
        "DONE",
        "LEFT",
        "COPIED",
        "RATE",
        "ETA",
    ]);
    let mut reasons = String::new();
    for r in resyncs {
        let ended_badly = matches!(r.state, ResyncState::Failed | ResyncState::Waiting);
        if let Some(error) = &r.error {
            // While a retry runs, the error is the attempt before it's.
            let failed_attempt = if r.is_running() {
                r.attempts.saturating_sub(1)
            } else {
                r.attempts
            };
            if r.state != ResyncState::Done {
                reasons.push_str(&format!(
                    "{} {} on {}: attempt {failed_attempt} failed: {error}\n",
                    r.volume, r.component, r.host
                ));
            }
        }
        t.row(vec![
            r.volume.clone(),
            r.component.to_string(),
            r.host.clone(),
            r.kind.clone(),
            r.state.as_str().to_string(),
            if ended_badly {
                "-".to_string()
            } else {
                format!("{}%", percent_done(r.done_bytes, r.left_bytes))
            },
            format_size(r.done_bytes),
            format_size(r.left_bytes),
            format_size(r.copied_bytes),
            if ended_badly {
                "-".to_string()
            } else {
                format!("{}/s", format_size(r.rate_bytes_per_s))
            },
            eta(r.eta_s),
        ]);
    }
    let mut out = t.render();
    if !reasons.is_empty() {
        out.push('\n');
        out.push_str(&reasons);
    }
    out
}

/// `tessera scrub list`.
pub fn scrubs(rows: &[ScrubView]) -> String {
    let mut t = Table::new(&[
        "HOST",
        "DISK GROUP",
        "STATE",
        "PROGRESS",
        "CHECKED",
        "BAD",
        "REPAIRED",
        "UNREPAIRED",
        "RATE",
        "PASSES",
        "NEXT",
    ]);
    let mut errors = String::new();
    for r in rows {
        if let Some(e) = &r.error {
            errors.push_str(&format!(
                "{} {}: last pass stopped: {e}\n",
                r.host, r.disk_group
            ));
        }
        t.row(vec![
            r.host.clone(),
            r.disk_group.clone(),
            r.state.clone(),
            format!(
                "{}%",
                percent_done(
                    r.checked_blocks,
                    r.total_blocks.saturating_sub(r.checked_blocks)
                )
            ),
            format_size(r.checked_blocks * tessera_types::BLOCK_BYTES),
            r.bad_blocks.to_string(),
            r.repaired_blocks.to_string(),
            r.unrepaired_blocks.to_string(),
            format!(
                "{}/s",
                format_size(r.rate_blocks_per_s * tessera_types::BLOCK_BYTES)
            ),
            r.passes.to_string(),
            r.next_pass_in_s.map_or("-".to_string(), eta_text),
        ]);
    }
    let mut out = t.render();
    out.push_str(&errors);
    out
}

/// `tessera encryption list`: each disk group's encryption at rest.
pub fn encryption(rows: &[EncryptionView]) -> String {
    let mut t = Table::new(&[
        "HOST",
        "DISK GROUP",
        "ENCRYPTION",
        "KEY ENCRYPTION KEY",
        "DATA KEY",
        "DEEP REKEY",
    ]);
    for r in rows {
        match &r.encryption {
            None => t.row(vec![
                r.host.clone(),
                r.disk_group.clone(),
                "none".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]),
            Some(e) => t.row(vec![
                r.host.clone(),
                r.disk_group.clone(),
                e.cipher.clone(),
                e.kek_id.clone(),
                format!("generation {}", e.generation),
                match e.rekey {
                    None => "-".into(),
                    Some(p) => {
                        let left = p.total_bytes.saturating_sub(p.done_bytes);
                        format!(
                            "{}% at {}/s, {} left",
                            percent_done(p.done_bytes, left),
                            format_size(p.bytes_per_second),
                            eta((p.bytes_per_second > 0).then(|| left / p.bytes_per_second))
                        )
                    }
                },
            ]),
        }
    }
    t.render()
}

#[cfg(test)]
mod tests {

    #[test]
    fn snapshot_times_are_shown_as_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_795_651_873_000), "2026-11-26 00:11:13");
        assert_eq!(utc(951_868_799_000), "2000-02-29 23:59:59");
    }

    use super::*;
    use proptest::prelude::*;
    use tessera_node::control::{DiskGroupView, Divergence, ReadCacheView};
    use tessera_types::{ComponentId, PolicyName};

    fn copy(id: u64, column: Option<usize>, host: &str, state: ComponentState) -> ComponentView {
        ComponentView {
            id: ComponentId(id),
            role: if column.is_some() {
                ComponentRole::Data
            } else {
                ComponentRole::Witness
            },
            column,
            host: host.to_string(),
            disk_group: "dg-1".to_string(),
            fault_domain: format!("fd-{host}"),
            state,
            votes: 1,
            allocated_bytes: if state == ComponentState::Absent {
                None
            } else {
                Some(1 << 20)
            },
            dirty_bytes: if state == ComponentState::Resyncing {
                4096
            } else {
                0
            },
        }
    }

    fn object_view(components: Vec<ComponentView>) -> ObjectView {
        ObjectView {
            volume: "vol1".to_string(),
            size_bytes: 10 << 30,
            policy: "default".to_string(),
            state: Health::Degraded,
            owner: Some("host-1".to_string()),
            epoch: Some(Epoch(3)),
            generation: 2,
            components,
            offloads: Default::default(),
            read_cache: Default::default(),
        }
    }

    #[test]
    fn a_mirror_prints_as_raid1_with_its_copies_and_the_witness_beside_it() {
        let text = object(&object_view(vec![
            copy(1, Some(0), "host-1", ComponentState::Active),
            copy(2, Some(0), "host-2", ComponentState::Absent),
            copy(3, None, "host-3", ComponentState::Active),
        ]));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "volume vol1: 10.0 GiB, policy default, degraded, owner host-1 (epoch 3), layout generation 2"
        );
        assert!(lines[2].starts_with("TREE"), "{text}");
        assert_eq!(lines[3], "RAID-1 column 0");
        assert!(
            lines[4].starts_with("  component c0000000000000001  host-1"),
            "{text}"
        );
        assert!(
            lines[4].contains("active") && lines[4].contains("1.0 MiB"),
            "{text}"
        );
        assert!(
            lines[5].contains("absent") && lines[5].contains("unknown"),
            "{text}"
        );
        assert!(lines[6].starts_with("witness c0000000000000003"), "{text}");
        assert!(!text.contains("RAID-0"), "one column is not a stripe");
        assert!(
            text.contains("offloads: ATS 0 (0 miscompared), CLONE 0 commands"),
            "{text}"
        );
    }

    #[test]
    fn a_striped_object_prints_raid0_over_one_mirror_per_column() {
        let text = object(&object_view(vec![
            copy(1, Some(0), "host-1", ComponentState::Active),
            copy(2, Some(0), "host-2", ComponentState::Active),
            copy(3, Some(1), "host-3", ComponentState::Active),
            copy(4, Some(1), "host-4", ComponentState::Resyncing),
            copy(5, None, "host-5", ComponentState::Active),
        ]));
        let tree: Vec<&str> = text
            .lines()
            .skip(3)
            .take_while(|l| !l.is_empty())
            .map(|l| l.split("  host-").next().unwrap_or(l).trim_end())
            .collect();
        assert_eq!(
            tree,
            [
                "RAID-0 (2 columns)",
                "  RAID-1 column 0",
                "    component c0000000000000001",
                "    component c0000000000000002",
                "  RAID-1 column 1",
                "    component c0000000000000003",
                "    component c0000000000000004",
                "witness c0000000000000005",
            ]
        );
        assert!(
            text.contains("4.0 KiB"),
            "bytes to resync are shown: {text}"
        );
    }

    #[test]
    fn verify_names_where_copies_differ() {
        let mut report = VerifyReport {
            volume: "vol1".to_string(),
            identical: true,
            compared_bytes: 1 << 30,
            skipped: vec!["c0000000000000003 on host-3: absent".to_string()],
            snapshots: Vec::new(),
            divergences: Vec::new(),
        };
        assert_eq!(
            verify(&report),
            "volume vol1: copies identical (1.0 GiB compared per copy)\n\
             skipped: c0000000000000003 on host-3: absent\n"
        );
        report.identical = false;
        report.divergences.push(Divergence {
            column: 0,
            component_offset: 8192,
            len: 4096,
            components: vec![ComponentId(1), ComponentId(2)],
            snapshot: None,
        });
        let text = verify(&report);
        assert!(text.contains("copies DIFFER"), "{text}");
        assert!(
            text.contains("0       byte 8192  4.0 KiB  c0000000000000001 c0000000000000002"),
            "{text}"
        );
    }

    #[test]
    fn a_full_clone_being_filled_shows_its_progress_in_the_list_and_when_made() {
        let fill = FillView {
            from: "vm@s1".to_string(),
            done_bytes: 48 << 20,
            left_bytes: 16 << 20,
            copied_bytes: 20 << 20,
            rate_bytes_per_s: 8 << 20,
            eta_s: Some(2),
            started_ms: 0,
            runs: 2,
            resumed_from_bytes: 16 << 20,
            error: None,
        };
        let v = VolumeView {
            name: "copy".to_string(),
            size_bytes: 64 << 20,
            policy: "default".to_string(),
            block_bytes: 512,
            state: Health::Healthy,
            used_bytes: 20 << 20,
            owner: Some("host-2".to_string()),
            epoch: Some(Epoch(3)),
            open_by: 0,
            qos: VolumeQos::default(),
            warnings: Vec::new(),
            fill: Some(fill.clone()),
        };
        assert_eq!(
            volumes(std::slice::from_ref(&v)),
            "NAME  SIZE      POLICY   BLOCK  STATE        USED      OWNER   EPOCH  CLIENTS  QOS\n\
             copy  64.0 MiB  default  512e   filling 75%  20.0 MiB  host-2  3      0        -\n\
             \n\
             copy is being filled from vm@s1: 75%, 48.0 MiB of 64.0 MiB done, 20.0 MiB copied, 8.0 MiB/s, about 2s left (run 2, taken up at 16.0 MiB)\n"
        );
        let started = fill_started(&v);
        assert!(
            started.starts_with("cloned volume copy: 64.0 MiB, policy default, 512e, healthy, owner host-2 (epoch 3)\nfull clone of vm@s1: it is being filled in the background"),
            "{started}"
        );
        let failing = FillView {
            error: Some("volume copy: reading snapshot vm@s1 at byte 0: no copy".to_string()),
            ..fill.clone()
        };
        assert!(fill_progress("copy", &failing)
            .ends_with("; retrying after: volume copy: reading snapshot vm@s1 at byte 0: no copy"));
        assert_eq!(
            fill_done(&v, Some("vm@s1")),
            "volume copy is filled: a full copy of vm@s1, 20.0 MiB of data; it serves clients now\n"
        );
    }

    #[test]
    fn volume_list_shows_size_policy_state_used_and_owner() {
        let v = VolumeView {
            name: "vol1".to_string(),
            size_bytes: 10 << 30,
            policy: "default".to_string(),
            block_bytes: 512,
            state: Health::Healthy,
            used_bytes: 3 << 20,
            owner: None,
            epoch: None,
            open_by: 1,
            qos: VolumeQos {
                iops_limit: 2000,
                bandwidth_limit_mib_s: 0,
                iops_minimum: 500,
            },
            warnings: Vec::new(),
            fill: None,
        };
        assert_eq!(
            volumes(std::slice::from_ref(&v)),
            "NAME  SIZE      POLICY   BLOCK  STATE    USED     OWNER  EPOCH  CLIENTS  QOS\n\
             vol1  10.0 GiB  default  512e   healthy  3.0 MiB  -      -      1        max 2000 IOPS, min 500 IOPS\n"
        );
    }

    #[test]
    fn policies_show_every_setting() {
        let mut p = Policy::new(PolicyName::new("gold").expect("name"), 2);
        p.stripe_width = 3;
        p.space_reservation_pct = 50;
        let text = policies(&[p.clone()]);
        assert_eq!(
            text.lines().nth(1),
            Some("gold  2    RAID-1  3             50%                on        -")
        );
        assert_eq!(
            policy_created(&p),
            "created policy gold: FTT=2, RAID-1, 3 copies, stripe width 3, 50% space reservation\n"
        );
    }

    #[test]
    fn hosts_list_their_disk_groups() {
        let h = HostView {
            id: "host-1".to_string(),
            fault_domain: "fd-1".to_string(),
            state: "present".to_string(),
            transport_addr: "127.0.0.1:9500".to_string(),
            nbd_addr: "127.0.0.1:10809".to_string(),
            iscsi_addr: "127.0.0.1:3260".to_string(),
            disk_groups: vec![DiskGroupView {
                id: "dg-1".to_string(),
                health: "healthy".to_string(),
                capacity: CapacityView {
                    total_bytes: 8 << 30,
                    used_bytes: 1 << 30,
                    reserved_bytes: 0,
                    free_bytes: 7 << 30,
                    provisioned_bytes: 12 << 30,
                    overcommit_ratio: 1.5,
                },
                components: 4,
                physical_bytes: Some(512 << 20),
                index_cache: None,
                encryption: None,
            }],
            owned_volumes: vec!["vol1".to_string()],
            capacity: CapacityView::default(),
            reclaim_components: 2,
            reclaim_bytes: 128 << 20,
            read_cache: Some(ReadCacheView {
                budget_bytes: 64 << 20,
                cached_bytes: 3 << 20,
                memory_bytes: 768 * 4416,
                hits: 1200,
                misses: 400,
                hit_rate: Some(0.75),
                host_memory_bytes: 16 << 30,
            }),
            lease_ttl_ms: Some(4_000),
            own_settings: Default::default(),
        };
        let text = hosts(&[h]);
        assert!(
            text.contains("host-1  present  2 component(s)  up to 128.0 MiB"),
            "{text}"
        );
        assert!(
            text.contains("host-1  on          64.0 MiB  3.0 MiB  1200  400     75.0%"),
            "{text}"
        );
        assert!(
            text.contains("host-1  fd-1          present  127.0.0.1:9500  127.0.0.1:10809  127.0.0.1:3260  1            1.0 GiB  7.0 GiB  12.0 GiB     8.0 GiB  1"),
            "{text}"
        );
        assert!(
            text.contains(
                "host-1  dg-1        healthy  4           1.0 GiB  512.0 MiB  0 B       7.0 GiB  12.0 GiB     1.50x       8.0 GiB"
            ),
            "{text}"
        );
    }

    fn resync(state: ResyncState) -> ResyncView {
        ResyncView {
            volume: "vol1".to_string(),
            component: ComponentId(2),
            host: "host-2".to_string(),
            kind: "resync".to_string(),
            state,
            error: None,
            attempts: 1,
            done_bytes: 3 << 20,
            left_bytes: 1 << 20,
            copied_bytes: 512 << 10,
            rate_bytes_per_s: 1 << 19,
            eta_s: Some(2),
        }
    }

    #[test]
    fn resync_progress_has_done_left_copied_rate_and_time_left() {
        let text = resyncs(&[resync(ResyncState::Running)]);
        assert_eq!(
            text.lines().nth(1),
            Some("vol1    c0000000000000002  host-2  resync  running  75%       3.0 MiB  1.0 MiB  512.0 KiB  512.0 KiB/s  2s")
        );
        let unknown = ResyncView {
            eta_s: None,
            ..resync(ResyncState::Running)
        };
        assert!(resyncs(&[unknown])
            .lines()
            .nth(1)
            .unwrap()
            .ends_with("512.0 KiB/s  -"));
    }

    #[test]
    fn a_failed_resync_keeps_its_reason_out_of_the_table() {
        let r = ResyncView {
            error: Some("host-2 is unreachable: connection refused".to_string()),
            eta_s: None,
            ..resync(ResyncState::Failed)
        };
        let text = resyncs(&[r]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].contains("  failed  -  "), "{text}");
        assert!(!lines[1].contains("unreachable"), "{text}");
        assert_eq!(
            lines[3],
            "vol1 c0000000000000002 on host-2: attempt 1 failed: host-2 is unreachable: connection refused"
        );
    }

    #[test]
    fn a_retry_names_the_attempt_that_failed_and_success_prints_no_reason() {
        let retry = ResyncView {
            attempts: 3,
            error: Some("connection refused".to_string()),
            ..resync(ResyncState::Running)
        };
        let text = resyncs(&[retry]);
        assert!(
            text.lines().nth(1).unwrap().contains("  running  75%"),
            "{text}"
        );
        assert!(
            text.ends_with("host-2: attempt 2 failed: connection refused\n"),
            "{text}"
        );
        let waiting = ResyncView {
            attempts: 3,
            error: Some("connection refused".to_string()),
            ..resync(ResyncState::Waiting)
        };
        assert!(resyncs(&[waiting]).contains("  waiting  -  "));
        let done = ResyncView {
            attempts: 3,
            ..resync(ResyncState::Done)
        };
        assert_eq!(resyncs(&[done]).lines().count(), 2);
    }

    #[test]
    fn eta_reads_in_hours_minutes_seconds() {
        assert_eq!(eta(Some(0)), "0s");
        assert_eq!(eta(None), "-");
        assert_eq!(eta(Some(4)), "4s");
        assert_eq!(eta(Some(185)), "3m05s");
        assert_eq!(eta(Some(3720)), "1h02m");
    }

    proptest! {
        #[test]
        fn percent_done_is_within_0_to_100_and_grows_with_done(done in any::<u64>(), left in any::<u64>()) {
            let p = percent_done(done, left);
            prop_assert!(p <= 100);
            if left == 0 {
                prop_assert_eq!(p, 100);
            }
            if let Some(more) = done.checked_add(1) {
                if let Some(less_left) = left.checked_sub(1) {
                    prop_assert!(percent_done(more, less_left) >= p);
                }
            }
        }
    }

    #[test]
    fn health_names_each_problem_with_its_code_what_it_affects_and_a_remedy() {
        let report = HealthReport {
            health: Health::Degraded,
            checks: vec![HealthCheck {
                code: HealthCode::RepairDelayPending,
                severity: Severity::Info,
                summary: "the first rebuild starts in 3599s".to_string(),
                affects: vec!["c0000000000000002".to_string()],
                remedy: "start the host".to_string(),
                seconds_left: Some(3599),
            }],
        };
        let text = health_report(&report);
        assert!(text.starts_with("health: degraded\n"), "{text}");
        assert!(
            text.contains("[INFO] REPAIR_DELAY_PENDING: the first rebuild starts in 3599s"),
            "{text}"
        );
        assert!(text.contains("time left: 59m59s"), "{text}");
        assert!(text.contains("affects: c0000000000000002"), "{text}");
        assert!(text.contains("remedy: start the host"), "{text}");
    }
}
