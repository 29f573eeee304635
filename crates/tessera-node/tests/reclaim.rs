//! Components that stop being needed while their host is down are deleted
//! by that host once it is back (reclaim records): a snapshot deleted, a
//! volume deleted, a copy rebuilt elsewhere after the repair delay. The
//! deletes succeed at once, `host list` shows what waits, and the space
//! comes back when the host returns.

mod fixture;

use fixture::{have, Cluster};
use std::time::{Duration, Instant};
use tessera_directory::keys::SnapshotName;
use tessera_node::control::{ClusterControl, Health, ReclaimPending};
use tessera_types::layout::ComponentPlacement;
use tessera_types::{ComponentId, VolumeId};

const SIZE: u64 = 64 << 20;

/// The placements of a snapshot's components, from a host's view.
async fn snapshot_placements(
    cluster: &Cluster,
    volume: &str,
    name: &str,
) -> Vec<ComponentPlacement> {
    let host = cluster.host("host-1");
    host.refresh_view().await;
    host.snapshot(
        &VolumeId::new(volume).unwrap(),
        &SnapshotName::new(name).unwrap(),
    )
    .expect("snapshot record")
    .layout
    .components()
    .cloned()
    .collect()
}

/// Whether `host`'s store holds component `id`.
fn holds(cluster: &Cluster, host: &str, id: ComponentId) -> bool {
    cluster.host(host).replica().home(id).is_some()
}

/// Components waiting to be reclaimed on `host`, as `host list` shows them.
async fn waiting(cluster: &Cluster, host: &str) -> u64 {
    ClusterControl::hosts(&*cluster.control)
        .await
        .unwrap()
        .into_iter()
        .find(|h| h.id == host)
        .expect("host listed")
        .reclaim_components
}

/// Waits until `host` holds none of `ids` and has no reclaim record left.
async fn until_reclaimed(cluster: &Cluster, host: &str, ids: &[ComponentId]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left: Vec<&ComponentId> = ids.iter().filter(|id| holds(cluster, host, **id)).collect();
        let records = waiting(cluster, host).await;
        if left.is_empty() && records == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{host} still holds {left:?} with {records} reclaim record(s)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads `range` of `export` through `host` (read-only: a snapshot's
/// export refuses writers) and checks every byte is `pattern`.
async fn reads_pattern(cluster: &Cluster, host: &str, export: &str, pattern: &str, range: &str) {
    let uri = cluster.nbd_uri(host, export);
    let read = format!("read -P {pattern} {range}");
    let out = tokio::task::spawn_blocking(move || {
        fixture::run("qemu-io", &["-r", "-f", "raw", "-c", &read, &uri])
    })
    .await
    .unwrap();
    assert!(
        !out.to_lowercase().contains("fail"),
        "{export} {range} is not {pattern}: {out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_deleted_while_a_host_is_down_is_reclaimed_when_it_returns() {
    if !have("qemu-io") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    let view = cluster.create("vm", SIZE).await;
    let owner = view.owner.clone().unwrap();
    let uri = cluster.nbd_uri(&owner, "vm");
    fixture::qemu_io(&uri, &["write -P 0x11 0 16M"]).await;
    cluster.snapshot("vm", "s1").await;
    fixture::qemu_io(&uri, &["write -P 0x22 0 16M"]).await;
    cluster.snapshot("vm", "s2").await;
    fixture::qemu_io(&uri, &["write -P 0x33 0 8M"]).await;

    // The copy that is not on the owner's host goes away for a while.
    let away = fixture::data_copy(&view, false).host;
    let s1 = snapshot_placements(&cluster, "vm", "s1").await;
    let s1_away = s1.iter().find(|p| p.host.as_str() == away).unwrap().id;
    let s2_away = snapshot_placements(&cluster, "vm", "s2")
        .await
        .into_iter()
        .find(|p| p.host.as_str() == away)
        .unwrap()
        .id;
    assert!(holds(&cluster, &away, s1_away));
    cluster.control.stop_host(&away).await.unwrap();

    // The delete succeeds and says what waits for whom.
    let deleted = cluster.control.delete_snapshot("vm", "s1").await.unwrap();
    assert_eq!(deleted.deleted_components as usize, s1.len() - 1);
    assert_eq!(
        deleted.reclaim_pending,
        [ReclaimPending {
            host: away.clone(),
            components: 1
        }]
    );
    let left: Vec<String> = cluster
        .control
        .snapshots("vm")
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(left, ["s2"]);
    assert_eq!(waiting(&cluster, &away).await, 1);
    // The others' components are gone already.
    for p in s1.iter().filter(|p| p.host.as_str() != away) {
        assert!(!holds(&cluster, p.host.as_str(), p.id), "{p:?} left");
    }

    // Back, the host deletes it (and its record); the rest stays whole.
    cluster.control.start_host(&away).await.unwrap();
    until_reclaimed(&cluster, &away, &[s1_away]).await;
    assert!(holds(&cluster, &away, s2_away), "s2 lost its component");
    cluster
        .wait_for("vm", "the copy back in sync", |v| {
            v.state == Health::Healthy
        })
        .await;
    reads_pattern(&cluster, &away, "vm@s2", "0x22", "0 16M").await;
    reads_pattern(&cluster, &away, "vm", "0x33", "0 8M").await;
    reads_pattern(&cluster, &away, "vm", "0x22", "8M 8M").await;
    let report = cluster.control.verify_object("vm").await.unwrap();
    assert!(report.identical, "{report:?}");
    assert_eq!(report.snapshots, ["s2"]);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_volume_deleted_while_a_host_is_down_leaves_nothing_on_it_once_back() {
    if !have("qemu-io") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    let view = cluster.create("gone", SIZE).await;
    let owner = view.owner.clone().unwrap();
    fixture::qemu_io(&cluster.nbd_uri(&owner, "gone"), &["write -P 0x44 0 8M"]).await;
    cluster.snapshot("gone", "s").await;
    let away = fixture::data_copy(&view, false).host;
    let mut on_away: Vec<ComponentId> = view
        .components
        .iter()
        .filter(|c| c.host == away)
        .map(|c| c.id)
        .collect();
    on_away.extend(
        snapshot_placements(&cluster, "gone", "s")
            .await
            .into_iter()
            .filter(|p| p.host.as_str() == away)
            .map(|p| p.id),
    );
    assert!(on_away.len() >= 2, "a copy and its snapshot: {on_away:?}");
    for id in &on_away {
        assert!(holds(&cluster, &away, *id));
    }
    cluster.control.stop_host(&away).await.unwrap();
    cluster.control.delete_volume("gone", false).await.unwrap();
    assert_eq!(waiting(&cluster, &away).await, on_away.len() as u64);

    cluster.control.start_host(&away).await.unwrap();
    until_reclaimed(&cluster, &away, &on_away).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_rebuilt_elsewhere_is_reclaimed_from_its_returning_host() {
    if !have("qemu-io") {
        return;
    }
    // Two seconds of absence make a rebuild.
    let cluster = Cluster::start(2).await;
    let view = cluster.create("vm", SIZE).await;
    let owner = view.owner.clone().unwrap();
    fixture::qemu_io(&cluster.nbd_uri(&owner, "vm"), &["write -P 0x55 0 32M"]).await;
    let lost = fixture::data_copy(&view, false);
    let group = cluster
        .host(&lost.host)
        .replica()
        .home(lost.id)
        .expect("the copy's disk group");
    group.settle().await.unwrap();
    let before = group.space().used_bytes;
    assert!(before >= 32 << 20, "the copy holds its data: {before}");
    drop(group);
    cluster.control.stop_host(&lost.host).await.unwrap();
    cluster
        .wait_for("vm", "a rebuilt copy", |v| {
            v.state == Health::Healthy && v.components.iter().all(|c| c.id != lost.id)
        })
        .await;
    assert!(waiting(&cluster, &lost.host).await >= 1);

    cluster.control.start_host(&lost.host).await.unwrap();
    until_reclaimed(&cluster, &lost.host, &[lost.id]).await;
    let host = cluster.host(&lost.host);
    let group = host
        .replica()
        .disk_groups()
        .iter()
        .find(|g| g.id().as_str() == lost.disk_group)
        .expect("the disk group")
        .clone();
    group.settle().await.unwrap();
    let after = group.space().used_bytes;
    assert!(
        after + (24 << 20) <= before,
        "its space came back: {before} bytes before, {after} after"
    );
    reads_pattern(&cluster, &owner, "vm", "0x55", "0 32M").await;
    cluster.stop().await;
}
