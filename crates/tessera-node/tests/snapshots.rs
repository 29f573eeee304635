//! Snapshots of volumes end to end, with real clients: qemu-img writes a
//! volume over NBD, a snapshot is taken while fio writes and verifies, the
//! snapshot's read-only export `volume@snapshot` reads back exactly what
//! the volume held when it was taken (qemu-img compare, from a host that is
//! not the owner), writes to it are refused, the copies' snapshots are
//! identical (also by `object verify`), a linked clone of it diverges on its
//! own and outlives its source, and deleting a snapshot (or its volume)
//! deletes its components.

mod fixture;

use fixture::{have, Cluster};
use std::process::{Command, Stdio};
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
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, ControlError::Invalid(_)), "{e}");
    let e = cluster
        .control
        .create_snapshot("nope", CreateSnapshot { name: "x".into() })
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
