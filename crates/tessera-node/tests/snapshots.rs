//! Snapshots of volumes end to end, with real clients: qemu-img writes a
//! volume over NBD, a snapshot is taken while fio writes and verifies, the
//! snapshot's read-only export `volume@snapshot` reads back exactly what
//! the volume held when it was taken (qemu-img compare, from a host that is
//! not the owner), writes to it are refused, the copies' snapshots are
//! identical (also by `object verify`), a linked clone of it diverges on its
//! own and outlives its source, and deleting a snapshot (or its volume)
//! deletes its components. A copy rebuilt elsewhere carries every
//! snapshot; snapshots taken while a copy is away reach it when it returns.

mod fixture;

use fixture::{have, Cluster};
use std::process::{Command, Stdio};
use std::sync::Arc;
use tessera_node::control::{
    CloneVolume, ClusterControl, ControlError, CreateSnapshot, RevertVolume,
};
use tessera_object::{ComponentError, ComponentIo, IoClass};
use tessera_types::{Lba, VolumeId};

const SIZE: u64 = 64 << 20;

/// A raw image of the volume's size whose every 4-byte word depends on
/// `seed`.
fn image(cluster: &Cluster, name: &str, seed: u32) -> String {
    let path = cluster.dir.path().join(name);
    let data: Vec<u8> = (0..(SIZE as u32) / 4)
        .flat_map(|i| (i ^ seed).wrapping_mul(2_654_435_761).to_le_bytes())
        .collect();
    std::fs::write(&path, &data).unwrap();
    path.display().to_string()
}

/// Runs `qemu-img args` off the runtime; its success and output.
async fn qemu_img(args: Vec<String>) -> (bool, String) {
    let out = tokio::task::spawn_blocking(move || {
        Command::new("qemu-img")
            .args(&args)
            .stdin(Stdio::null())
            .output()
    })
    .await
    .unwrap()
    .expect("qemu-img starts");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

async fn write_image(image: &str, uri: &str) {
    let (ok, out) = qemu_img(
        ["convert", "-n", "-f", "raw", "-O", "raw", image, uri]
            .map(String::from)
            .to_vec(),
    )
    .await;
    assert!(ok, "qemu-img convert onto {uri}: {out}");
}

async fn same(image: &str, uri: &str) -> (bool, String) {
    qemu_img(
        ["compare", "-f", "raw", "-F", "raw", image, uri]
            .map(String::from)
            .to_vec(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_taken_under_writes_reads_back_as_the_volume_was_and_refuses_changes() {
    if !have("qemu-img") || !have("fio") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    let view = cluster.create("vm", SIZE).await;
    let owner = view.owner.clone().unwrap();
    let other = ["host-1", "host-2", "host-3", "host-4"]
        .into_iter()
        .find(|h| *h != owner)
        .unwrap();
    let a = image(&cluster, "a.raw", 0xa);
    let b = image(&cluster, "b.raw", 0xb);
    write_image(&a, &cluster.nbd_uri(other, "vm")).await;

    // Taken while fio writes and verifies the second half of the volume:
    // the clients only wait, and its checks pass.
    let writer = fixture::fio_verify(
        &cluster.nbd_uri(&owner, "vm"),
        "randwrite",
        32 << 20,
        32 << 20,
        6,
    );
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let taken = cluster
        .control
        .create_snapshot(
            "vm",
            CreateSnapshot {
                name: "before-b".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    fixture::expect_fio_success(writer).await;
    assert_eq!(taken.export, "vm@before-b");
    assert_eq!(taken.components.len(), 2, "one per copy: {taken:?}");
    assert_eq!(taken.size_bytes, SIZE);

    // The first half still holds image a at the snapshot; b goes on top.
    write_image(&b, &cluster.nbd_uri(other, "vm")).await;
    let (ok, out) = same(&b, &cluster.nbd_uri(&owner, "vm")).await;
    assert!(ok, "the volume holds b: {out}");
    // Read from a host that is not the owner: the first half is a's.
    let snapshot = cluster.nbd_uri(other, "vm@before-b");
    let copied = cluster.dir.path().join("snap.raw").display().to_string();
    let (ok, out) = qemu_img(
        ["convert", "-f", "raw", "-O", "raw", &snapshot, &copied]
            .map(String::from)
            .to_vec(),
    )
    .await;
    assert!(ok, "qemu-img reads the snapshot's export: {out}");
    let got = std::fs::read(&copied).unwrap();
    let want = std::fs::read(&a).unwrap();
    assert_eq!(got.len() as u64, SIZE);
    assert!(
        got[..(SIZE / 2) as usize] == want[..(SIZE / 2) as usize],
        "the snapshot's first half is image a"
    );
    // A write to the snapshot's export is refused.
    let (ok, out) = qemu_img(
        ["convert", "-n", "-f", "raw", "-O", "raw", &b, &snapshot]
            .map(String::from)
            .to_vec(),
    )
    .await;
    assert!(!ok, "a write to a snapshot must be refused: {out}");
    let (ok, _) = same(&b, &snapshot).await;
    assert!(!ok, "the snapshot did not change");

    // Every copy's snapshot holds the same bytes.
    let host = cluster.host(other);
    let io = host.components(&VolumeId::new("vm").unwrap());
    let mut contents = Vec::new();
    for c in &cluster.control.snapshots("vm").await.unwrap()[0].components {
        let placement = taken_placement(&cluster, "vm", "before-b", &c.id).await;
        let mut bytes = Vec::new();
        for step in 0..SIZE / (4 << 20) {
            let data = io
                .read(&placement, Lba(step * 1024), 1024, IoClass::Guest)
                .await
                .unwrap();
            bytes.extend_from_slice(&data);
        }
        contents.push(bytes);
    }
    assert_eq!(contents.len(), 2);
    assert!(contents[0] == contents[1], "the copies' snapshots differ");
    assert!(contents[0][..(SIZE / 2) as usize] == want[..(SIZE / 2) as usize]);

    // `object verify` compares every snapshot's copies too.
    let report = cluster.control.verify_object("vm").await.unwrap();
    assert!(report.identical, "{report:?}");
    assert_eq!(report.snapshots, ["before-b"]);

    // A linked clone holds the snapshot at once and then goes its own way.
    let clone = cluster
        .control
        .clone_volume(
            "vm",
            "before-b",
            CloneVolume {
                name: "vm-clone".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(clone.size_bytes, SIZE);
    assert!(clone.owner.is_some(), "{clone:?}");
    let (ok, out) = same(&copied, &cluster.nbd_uri(other, "vm-clone")).await;
    assert!(ok, "the clone holds the snapshot: {out}");
    let c = image(&cluster, "c.raw", 0xc);
    write_image(&c, &cluster.nbd_uri(&owner, "vm-clone")).await;
    let (ok, out) = same(&c, &cluster.nbd_uri(other, "vm-clone")).await;
    assert!(ok, "the clone holds what was written to it: {out}");
    let (ok, out) = same(&copied, &snapshot).await;
    assert!(ok, "the snapshot is untouched by its clone: {out}");
    let (ok, out) = same(&b, &cluster.nbd_uri(other, "vm")).await;
    assert!(ok, "the volume is untouched by the clone: {out}");
    let e = cluster
        .control
        .clone_volume(
            "vm",
            "before-b",
            CloneVolume {
                name: "vm-clone".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, ControlError::Conflict(_)), "{e}");
    let e = cluster
        .control
        .clone_volume(
            "vm",
            "nope",
            CloneVolume {
                name: "other".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, ControlError::NotFound(_)), "{e}");

    // Reverted, the volume holds the snapshot again; not while a client
    // has it open.
    let writer = fixture::fio_verify(
        &cluster.nbd_uri(&owner, "vm"),
        "randwrite",
        32 << 20,
        32 << 20,
        4,
    );
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let e = cluster
        .control
        .revert_volume(
            "vm",
            RevertVolume {
                to: "before-b".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, ControlError::Conflict(_)), "{e}");
    fixture::expect_fio_success(writer).await;
    let reverted = cluster
        .control
        .revert_volume(
            "vm",
            RevertVolume {
                to: "before-b".into(),
            },
        )
        .await
        .unwrap();
    assert!(reverted.owner.is_some(), "{reverted:?}");
    let (ok, out) = same(&copied, &cluster.nbd_uri(other, "vm")).await;
    assert!(ok, "the reverted volume holds the snapshot: {out}");
    let report = cluster.control.verify_object("vm").await.unwrap();
    assert!(report.identical, "{report:?}");
    write_image(&b, &cluster.nbd_uri(other, "vm")).await;
    let (ok, out) = same(&copied, &snapshot).await;
    assert!(ok, "the snapshot outlives a revert to it: {out}");

    // Bad requests change nothing.
    let e = cluster
        .control
        .create_snapshot(
            "vm",
            CreateSnapshot {
                name: "before-b".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, ControlError::Conflict(_)), "{e}");
    let e = cluster
        .control
        .create_snapshot(
            "vm",
            CreateSnapshot {
                name: "no/slash".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, ControlError::Invalid(_)), "{e}");
    let e = cluster
        .control
        .create_snapshot(
            "nope",
            CreateSnapshot {
                name: "x".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, ControlError::NotFound(_)), "{e}");
    let e = cluster
        .control
        .delete_snapshot("vm", "nope")
        .await
        .unwrap_err();
    assert!(matches!(e, ControlError::NotFound(_)), "{e}");
    assert_eq!(cluster.control.snapshots("vm").await.unwrap().len(), 1);

    // Deleting it deletes its components; the volume stays as it is.
    let placements = placements_of(&cluster, "vm", "before-b").await;
    cluster
        .control
        .delete_snapshot("vm", "before-b")
        .await
        .unwrap();
    assert!(cluster.control.snapshots("vm").await.unwrap().is_empty());
    for p in &placements {
        let gone = io.status(p).await.unwrap_err();
        assert!(matches!(gone, ComponentError::NotFound { .. }), "{gone}");
    }
    assert!(host.open_volume("vm").is_some());
    let (ok, out) = same(&b, &cluster.nbd_uri(other, "vm")).await;
    assert!(ok, "the volume still holds b: {out}");
    let report = cluster.control.verify_object("vm").await.unwrap();
    assert!(report.identical, "{report:?}");

    // A volume's delete takes its snapshots with it.
    let again = cluster
        .control
        .create_snapshot(
            "vm",
            CreateSnapshot {
                name: "last".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let placements = placements_of(&cluster, "vm", "last").await;
    assert_eq!(placements.len(), again.components.len());
    cluster.control.delete_volume("vm", false).await.unwrap();
    for p in &placements {
        assert!(
            io.status(p).await.is_err(),
            "snapshot component {} left",
            p.id
        );
    }
    // The clone outlives its snapshot and its volume, whole.
    let (ok, out) = same(&c, &cluster.nbd_uri(other, "vm-clone")).await;
    assert!(ok, "the clone after its source's deletion: {out}");
    let report = cluster.control.verify_object("vm-clone").await.unwrap();
    assert!(report.identical, "{report:?}");
    cluster.stop().await;
}

/// Every byte component `placement` holds, read through `io`.
async fn component_bytes(
    io: &dyn ComponentIo,
    placement: &tessera_types::layout::ComponentPlacement,
) -> Vec<u8> {
    let mut got = Vec::new();
    for step in 0..SIZE / (4 << 20) {
        let data = io
            .read(placement, Lba(step * 1024), 1024, IoClass::Guest)
            .await
            .unwrap();
        got.extend_from_slice(&data);
    }
    got
}

/// The placements of a snapshot's components, from the directory's record.
async fn placements_of(
    cluster: &Cluster,
    volume: &str,
    name: &str,
) -> Vec<tessera_types::layout::ComponentPlacement> {
    let host = cluster.host("host-1");
    host.refresh_view().await;
    let record = host
        .snapshot(
            &VolumeId::new(volume).unwrap(),
            &tessera_directory::keys::SnapshotName::new(name).unwrap(),
        )
        .expect("snapshot record");
    record.layout.components().cloned().collect()
}

async fn taken_placement(
    cluster: &Cluster,
    volume: &str,
    name: &str,
    id: &str,
) -> tessera_types::layout::ComponentPlacement {
    placements_of(cluster, volume, name)
        .await
        .into_iter()
        .find(|p| p.id.to_string() == id)
        .expect("component of the snapshot")
}

/// Reads the whole of `export` (a volume or `volume@snapshot`) into a file
/// of the test's directory; its bytes.
async fn read_export(cluster: &Cluster, host: &str, export: &str) -> Vec<u8> {
    let path = cluster.dir.path().join(format!("{export}.raw"));
    let file = path.display().to_string();
    let (ok, out) = qemu_img(
        [
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &cluster.nbd_uri(host, export),
            &file,
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(ok, "qemu-img reads {export}: {out}");
    std::fs::read(&path).unwrap()
}

/// Bytes a disk group holds once its staged writes are destaged.
async fn used_after_settling(
    host: &tessera_node::host::Host,
    id: tessera_types::ComponentId,
) -> u64 {
    let group = host
        .replica()
        .home(id)
        .expect("disk group of the component");
    group.settle().await.unwrap();
    group.space().used_bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_rebuilt_elsewhere_carries_every_snapshot_and_shares_blocks_as_before() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    // Two seconds of absence make a rebuild.
    let cluster = Cluster::start(2).await;
    let view = cluster.create("vm", SIZE).await;
    let owner = view.owner.clone().unwrap();
    let uri = cluster.nbd_uri(&owner, "vm");
    // Each snapshot a few changes after the one before: new data, and a
    // range discarded (a snapshot must also carry holes).
    fixture::qemu_io(&uri, &["write -P 0x11 0 64M"]).await;
    cluster.snapshot("vm", "s1").await;
    fixture::qemu_io(&uri, &["write -P 0x22 8M 8M", "discard 40M 4M"]).await;
    cluster.snapshot("vm", "s2").await;
    fixture::qemu_io(&uri, &["write -P 0x33 20M 4M", "write -P 0x34 40M 1M"]).await;
    cluster.snapshot("vm", "s3").await;
    fixture::qemu_io(&uri, &["write -P 0x44 30M 2M", "discard 0 1M"]).await;
    let mut want = Vec::new();
    for export in ["vm@s1", "vm@s2", "vm@s3", "vm"] {
        want.push(read_export(&cluster, &owner, export).await);
    }
    assert!(want[0] != want[1] && want[1] != want[2] && want[2] != want[3]);
    // Each snapshot holds alone what was overwritten or discarded after it
    // and no later snapshot keeps: s1 the 8 MiB s2 rewrote and the 4 MiB
    // it discarded; s2 and s3 nothing (what came after them rewrote only
    // blocks older snapshots share).
    let held = |cluster: &Cluster| {
        let control = Arc::clone(&cluster.control);
        async move {
            control
                .snapshots("vm")
                .await
                .unwrap()
                .iter()
                .map(|s| (s.held_alone_bytes, s.held_shared_bytes))
                .collect::<Vec<_>>()
        }
    };
    const MIB: u64 = 1 << 20;
    let before = held(&cluster).await;
    assert_eq!(
        before,
        [
            (Some(12 * MIB), Some(52 * MIB)),
            (Some(0), Some(60 * MIB)),
            (Some(0), Some(61 * MIB)),
        ]
    );

    // The copy that is not on the owner goes away for good.
    let lost = fixture::data_copy(&view, false);
    let source = fixture::data_copy(&view, true);
    cluster.control.stop_host(&lost.host).await.unwrap();
    let rebuilt = cluster
        .wait_for("vm", "a rebuilt copy", |v| {
            v.state == tessera_node::control::Health::Healthy
                && v.components.iter().all(|c| c.id != lost.id)
        })
        .await;
    let new = rebuilt
        .components
        .iter()
        .find(|c| {
            c.role == tessera_types::layout::ComponentRole::Data
                && c.host != owner
                && c.host != lost.host
        })
        .expect("a new copy on a third host")
        .clone();

    // Every snapshot names the new copy's snapshot instead of the lost one.
    for name in ["s1", "s2", "s3"] {
        let placements = placements_of(&cluster, "vm", name).await;
        assert_eq!(placements.len(), 2, "{name}: {placements:?}");
        assert!(
            placements.iter().all(|p| p.host.to_string() != lost.host),
            "{name} still names the lost host: {placements:?}"
        );
        assert!(
            placements.iter().any(|p| p.host.to_string() == new.host),
            "{name} names no copy on the new host: {placements:?}"
        );
    }
    // The new copy's snapshots and volume hold exactly what they held.
    let host = cluster.host(&new.host);
    let io = host.components(&VolumeId::new("vm").unwrap());
    for (name, want) in ["s1", "s2", "s3"].iter().zip(&want) {
        let placement = placements_of(&cluster, "vm", name)
            .await
            .into_iter()
            .find(|p| p.host.to_string() == new.host)
            .unwrap();
        let got = component_bytes(io.as_ref(), &placement).await;
        assert!(got == *want, "the new copy of {name} differs");
    }
    let report = cluster.control.verify_object("vm").await.unwrap();
    assert!(report.identical, "{report:?}");
    assert_eq!(report.snapshots, ["s1", "s2", "s3"]);
    // Once the snapshots were carried, its resync copied only what changed
    // since the last one (2 MiB written, 1 MiB discarded), not the volume.
    let resyncs = cluster.control.resyncs().await.unwrap();
    let resync = resyncs
        .iter()
        .find(|r| r.component == new.id)
        .expect("the new copy's resync on the board");
    assert_eq!(resync.kind, "rebuild");
    assert!(
        resync.done_bytes <= 4 << 20 && resync.copied_bytes <= 3 << 20,
        "{resync:?}"
    );
    // Blocks are shared as on the surviving copy: the new host holds what
    // the source holds (about 80 MiB) to within 1%, not a copy per
    // snapshot (over 200 MiB).
    let source_used = used_after_settling(&cluster.host(&owner), source.id).await;
    let new_used = used_after_settling(&host, new.id).await;
    assert!(
        new_used.abs_diff(source_used) <= source_used / 100,
        "the rebuilt copy holds {new_used} bytes, its source {source_used}"
    );
    // With the original copy gone too, the snapshots read from the new one.
    cluster.control.stop_host(&owner).await.unwrap();
    let reader = rebuilt
        .components
        .iter()
        .map(|c| c.host.clone())
        .find(|h| *h != owner && *h != new.host)
        .unwrap_or_else(|| new.host.clone());
    for (export, want) in ["vm@s1", "vm@s2", "vm@s3"].iter().zip(&want) {
        let got = read_export(&cluster, &reader, export).await;
        assert!(got == *want, "{export} read from the new copy differs");
    }
    assert_eq!(
        held(&cluster).await,
        before,
        "the new copy's snapshots hold as much"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshots_taken_while_a_copy_is_away_reach_it_when_it_returns() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    use tessera_types::layout::ComponentState;
    // The host is away for less than the repair delay: its copy returns.
    let cluster = Cluster::start(600).await;
    let view = cluster.create("vm", SIZE).await;
    let owner = view.owner.clone().unwrap();
    let uri = cluster.nbd_uri(&owner, "vm");
    fixture::qemu_io(&uri, &["write -P 0x11 0 64M"]).await;
    cluster.snapshot("vm", "s0").await;
    let away = fixture::data_copy(&view, false);
    cluster.control.stop_host(&away.host).await.unwrap();
    cluster
        .wait_for("vm", "the copy recorded away", |v| {
            v.components
                .iter()
                .any(|c| c.id == away.id && c.state == ComponentState::Absent)
        })
        .await;

    // Snapshots go on while it is away, on the copy that stays.
    fixture::qemu_io(&uri, &["write -P 0x22 8M 8M", "discard 40M 4M"]).await;
    let s1 = cluster.snapshot("vm", "s1").await;
    assert_eq!(s1.components.len(), 1, "{s1:?}");
    assert_eq!(s1.components[0].host, owner);
    fixture::qemu_io(&uri, &["write -P 0x33 20M 4M", "write -P 0x34 40M 1M"]).await;
    cluster.snapshot("vm", "s2").await;
    fixture::qemu_io(&uri, &["write -P 0x44 30M 2M", "discard 0 1M"]).await;
    // Made from a snapshot with one copy, a linked clone would have one:
    // refused, and nothing is made.
    let refused = cluster
        .control
        .clone_volume(
            "vm",
            "s1",
            CloneVolume {
                name: "early".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, ControlError::Conflict(m) if m.contains("1 of 2 copies")),
        "{refused:?}"
    );
    assert!(cluster.control.volume("early").await.is_err());
    let mut want = Vec::new();
    for export in ["vm@s0", "vm@s1", "vm@s2", "vm"] {
        want.push(read_export(&cluster, &owner, export).await);
    }
    assert!(want[0] != want[1] && want[1] != want[2] && want[2] != want[3]);

    // Back, the copy is given s1 and s2 before it catches up.
    cluster.control.start_host(&away.host).await.unwrap();
    cluster
        .wait_for("vm", "the copy back in sync", |v| {
            v.state == tessera_node::control::Health::Healthy
        })
        .await;
    let host = cluster.host(&away.host);
    let io = host.components(&VolumeId::new("vm").unwrap());
    for (name, want) in ["s0", "s1", "s2"].iter().zip(&want) {
        let placements = placements_of(&cluster, "vm", name).await;
        assert_eq!(placements.len(), 2, "{name}: {placements:?}");
        let placement = placements
            .into_iter()
            .find(|p| p.host.to_string() == away.host)
            .unwrap_or_else(|| panic!("{name} names no copy on {}", away.host));
        let got = component_bytes(io.as_ref(), &placement).await;
        assert!(got == *want, "the returned copy's {name} differs");
    }
    let report = cluster.control.verify_object("vm").await.unwrap();
    assert!(report.identical, "{report:?}");
    assert_eq!(report.snapshots, ["s0", "s1", "s2"]);
    // Only what changed while it was away was copied: at most the 20 MiB
    // its dirty map holds for s1 and again for the volume, and the 5 MiB
    // between s1 and s2; not the volume and each snapshot whole (192 MiB).
    let resync = cluster
        .control
        .resyncs()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.component == away.id)
        .expect("the copy's resync on the board");
    assert!(resync.copied_bytes <= 45 << 20, "{resync:?}");

    // Now whole, s1 clones; with the owner's host gone, every snapshot
    // reads from the copy that was away.
    cluster
        .control
        .clone_volume(
            "vm",
            "s1",
            CloneVolume {
                name: "late".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    cluster.control.stop_host(&owner).await.unwrap();
    for (export, want) in ["vm@s0", "vm@s1", "vm@s2"].iter().zip(&want) {
        let got = read_export(&cluster, &away.host, export).await;
        assert!(got == *want, "{export} read from the returned copy differs");
    }
    cluster.stop().await;
}
