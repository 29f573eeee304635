//! Full clones end to end, with real clients: a volume is written over NBD
//! (data with holes), a snapshot taken, and a full clone of it made. Once
//! filled, the clone reads back as the snapshot (`qemu-img compare` against
//! its export), its own disk groups hold its blocks (their space grows by
//! the data, its components' physical bytes are the data), it goes its own
//! way when written, and it outlives its source volume and snapshots.
//! While a (throttled) fill goes on, NBD and iSCSI refuse the clone naming
//! the fill, the snapshot and its volume cannot be deleted, the clone
//! cannot be snapshotted, resized or renamed, and deleting it stops the
//! fill and removes it. A fill whose owner host is stopped is taken up by
//! the next owner from the recorded position, and the clone is still
//! exact. Requests the cluster cannot satisfy are refused and change
//! nothing.

mod fixture;

use fixture::{have, Cluster};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tessera_node::control::{
    CloneVolume, ClusterControl, ControlError, CreatePolicy, CreateSnapshot, FillView,
    RenameVolume, ResizeVolume, VolumeView,
};
use tessera_object::{ComponentError, ComponentIo};
use tessera_types::layout::ComponentRole;
use tessera_types::policy::VolumeQos;
use tessera_types::VolumeId;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;

/// Runs `tool args` off the runtime; its success and output.
async fn run(tool: &'static str, args: Vec<String>) -> (bool, String) {
    let out = tokio::task::spawn_blocking(move || {
        Command::new(tool).args(&args).stdin(Stdio::null()).output()
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("{tool} starts: {e}"));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

async fn qemu_img(args: &[&str]) -> (bool, String) {
    run("qemu-img", args.iter().map(|a| a.to_string()).collect()).await
}

/// Whether two NBD exports (or files) hold the same bytes.
async fn same(a: &str, b: &str) -> (bool, String) {
    qemu_img(&["compare", "-f", "raw", "-F", "raw", a, b]).await
}

/// A 64 MiB image whose every word depends on its offset, with zeros at
/// 20-40 MiB and 48-60 MiB (ranges a writer leaves unmapped): 32 MiB of
/// data.
fn image(cluster: &Cluster, name: &str, seed: u32) -> String {
    let path = cluster.dir.path().join(name);
    let mut data: Vec<u8> = (0..(SIZE as u32) / 4)
        .flat_map(|i| (i ^ seed).wrapping_mul(2_654_435_761).to_le_bytes())
        .collect();
    for (from, to) in [(20 * MIB, 40 * MIB), (48 * MIB, 60 * MIB)] {
        data[from as usize..to as usize].fill(0);
    }
    std::fs::write(&path, &data).unwrap();
    path.display().to_string()
}

/// Data bytes of [`image`].
const IMAGE_DATA: u64 = 32 * MIB;

/// Writes `image` onto `uri`, then discards its zero ranges: they are
/// unmapped.
async fn write_image(image: &str, uri: &str) {
    let (ok, out) = qemu_img(&["convert", "-n", "-f", "raw", "-O", "raw", image, uri]).await;
    assert!(ok, "qemu-img convert onto {uri}: {out}");
    fixture::qemu_io(uri, &["discard 20M 20M", "discard 48M 12M"]).await;
}

/// Reads all of `export` through `host` into a file; its bytes.
async fn read_export(cluster: &Cluster, host: &str, export: &str) -> Vec<u8> {
    let path = cluster.dir.path().join(format!("{export}.read.raw"));
    let file = path.display().to_string();
    let uri = cluster.nbd_uri(host, export);
    let (ok, out) = qemu_img(&["convert", "-f", "raw", "-O", "raw", &uri, &file]).await;
    assert!(ok, "qemu-img reads {export}: {out}");
    std::fs::read(&path).unwrap()
}

/// A full clone request.
fn full(name: &str, policy: Option<&str>) -> CloneVolume {
    CloneVolume {
        name: name.into(),
        full: true,
        policy: policy.map(str::to_string),
    }
}

/// A policy of FTT=1 whose volumes may move `mib_s` MiB/s: a fill under it
/// is slow enough to be caught in the middle.
async fn slow_policy(cluster: &Cluster, name: &str, mib_s: u32) {
    cluster
        .control
        .create_policy(CreatePolicy {
            name: name.into(),
            failures_to_tolerate: 1,
            stripe_width: 1,
            space_reservation_pct: 0,
            qos: VolumeQos {
                bandwidth_limit_mib_s: mib_s,
                ..VolumeQos::default()
            },
        })
        .await
        .unwrap();
}

/// Polls `volume`'s view until `ok` holds (two minutes at most: a bound on
/// a stuck cluster, not a measure of speed).
async fn wait_volume(
    cluster: &Cluster,
    volume: &str,
    what: &str,
    ok: impl Fn(&VolumeView) -> bool,
) -> VolumeView {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let view = cluster.control.volume(volume).await.unwrap();
        if ok(&view) {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {view:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `volume`'s fill ended.
async fn wait_filled(cluster: &Cluster, volume: &str) -> VolumeView {
    wait_volume(cluster, volume, "the fill to end", |v| v.fill.is_none()).await
}

/// Waits until `volume`'s fill recorded at least `bytes` done; its fill.
async fn wait_progress(cluster: &Cluster, volume: &str, bytes: u64) -> FillView {
    let view = wait_volume(cluster, volume, "the fill to progress", |v| {
        assert!(
            v.fill.is_some(),
            "the fill ended before it was seen under way"
        );
        v.fill.as_ref().is_some_and(|f| f.done_bytes >= bytes)
    })
    .await;
    view.fill.unwrap()
}

/// Bytes each host's disk group holds once staged writes are destaged.
async fn used_by_host(cluster: &Cluster) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for host in cluster.control.hosts().running() {
        let group = host.replica().disk_groups()[0].clone();
        group.settle().await.unwrap();
        out.push((host.id().to_string(), group.space().used_bytes));
    }
    out.sort();
    out
}

/// Components held by every running host's disk groups.
fn components_stored(cluster: &Cluster) -> usize {
    cluster
        .control
        .hosts()
        .running()
        .iter()
        .flat_map(|h| h.replica().disk_groups().to_vec())
        .map(|g| g.components().len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_clone_holds_the_snapshot_on_blocks_of_its_own_and_outlives_its_source() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    let view = cluster.create("vm", SIZE).await;
    let (owner, other) = fixture::owner_and_other(&view);
    let a = image(&cluster, "a.raw", 0xa);
    write_image(&a, &cluster.nbd_uri(&owner, "vm")).await;
    cluster.snapshot("vm", "s1").await;
    // The volume moves on after its snapshot.
    fixture::qemu_io(&cluster.nbd_uri(&owner, "vm"), &["write -P 0x44 0 4M"]).await;
    let snapshot_bytes = read_export(&cluster, &other, "vm@s1").await;
    assert_eq!(snapshot_bytes, std::fs::read(&a).unwrap());
    // The snapshot's export says where it holds data: a fill (and a
    // backup) skips the rest.
    let (ok, map) = run(
        "nbdinfo",
        vec!["--map".into(), cluster.nbd_uri(&other, "vm@s1")],
    )
    .await;
    if ok {
        assert!(
            map.contains("hole"),
            "the snapshot's unmapped ranges: {map}"
        );
    }
    let before = used_by_host(&cluster).await;

    let made = cluster
        .control
        .clone_volume("vm", "s1", full("copy", None))
        .await
        .unwrap();
    assert_eq!(made.size_bytes, SIZE);
    assert_eq!(made.policy, "default");
    assert!(made.owner.is_some(), "{made:?}");
    let filled = wait_filled(&cluster, "copy").await;
    assert!(filled.owner.is_some(), "{filled:?}");
    assert_eq!(filled.used_bytes, IMAGE_DATA, "only the data was written");

    // Byte for byte the snapshot, from a host that does not own it.
    let (ok, out) = same(
        &cluster.nbd_uri(&other, "copy"),
        &cluster.nbd_uri(&other, "vm@s1"),
    )
    .await;
    assert!(ok, "the clone holds the snapshot: {out}");
    let report = cluster.control.verify_object("copy").await.unwrap();
    assert!(report.identical, "{report:?}");
    assert_eq!(report.compared_bytes, IMAGE_DATA);

    // Its blocks are its own: each disk group holding a copy of it grew by
    // the data (a linked clone would have grown by nothing), and each copy
    // holds about the data on its devices.
    let object = cluster.control.object("copy").await.unwrap();
    let after = used_by_host(&cluster).await;
    let copies: Vec<_> = object
        .components
        .iter()
        .filter(|c| c.role == ComponentRole::Data)
        .collect();
    assert_eq!(copies.len(), 2, "{object:#?}");
    for c in &copies {
        let grew = |list: &[(String, u64)]| list.iter().find(|(h, _)| *h == c.host).unwrap().1;
        let growth = grew(&after).saturating_sub(grew(&before));
        assert!(
            growth >= IMAGE_DATA * 9 / 10,
            "the disk group of {} on {} grew by {growth} bytes for {IMAGE_DATA} of data",
            c.id,
            c.host
        );
        let host = cluster.host(&c.host);
        let io = host.components(&VolumeId::new("copy").unwrap());
        let placement = tessera_types::layout::ComponentPlacement {
            id: c.id,
            role: c.role,
            host: tessera_types::HostId::new(&c.host).unwrap(),
            disk_group: tessera_types::DiskGroupId::new(&c.disk_group).unwrap(),
            fault_domain: tessera_types::FaultDomainId::new(&c.fault_domain).unwrap(),
            votes: c.votes,
            size_bytes: SIZE,
            state: c.state,
        };
        let status = io.status(&placement).await.unwrap();
        assert!(
            status.physical_bytes >= IMAGE_DATA * 9 / 10
                && status.physical_bytes <= IMAGE_DATA * 11 / 10 + MIB,
            "copy {} on {} holds {} bytes physically for {IMAGE_DATA} of data",
            c.id,
            c.host,
            status.physical_bytes
        );
    }

    // Written, the clone and the volume go their own ways.
    fixture::qemu_io(&cluster.nbd_uri(&other, "copy"), &["write -P 0x55 0 1M"]).await;
    fixture::qemu_io(&cluster.nbd_uri(&owner, "vm"), &["write -P 0x66 8M 1M"]).await;
    let (ok, _) = same(
        &cluster.nbd_uri(&other, "copy"),
        &cluster.nbd_uri(&other, "vm@s1"),
    )
    .await;
    assert!(!ok, "the clone took its write");
    let (ok, _) = same(
        &cluster.nbd_uri(&other, "copy"),
        &cluster.nbd_uri(&other, "vm"),
    )
    .await;
    assert!(!ok, "the clone and the volume differ");
    let mut want = snapshot_bytes.clone();
    want[..MIB as usize].fill(0x55);
    assert!(read_export(&cluster, &owner, "copy").await == want);
    assert!(
        read_export(&cluster, &owner, "vm@s1").await == snapshot_bytes,
        "the snapshot is untouched"
    );

    // The source volume goes with its snapshots: the clone stays whole.
    cluster.control.delete_volume("vm", false).await.unwrap();
    for host in [&owner, &other] {
        assert!(
            read_export(&cluster, host, "copy").await == want,
            "the clone through {host} after its source's deletion"
        );
    }
    let report = cluster.control.verify_object("copy").await.unwrap();
    assert!(report.identical, "{report:?}");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clone_being_filled_is_served_to_no_client_holds_its_snapshot_and_can_be_deleted() {
    if !have("qemu-img") || !have("qemu-io") || !have("iscsi-inq") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    let view = cluster.create("vm", SIZE).await;
    let (owner, other) = fixture::owner_and_other(&view);
    fixture::qemu_io(&cluster.nbd_uri(&owner, "vm"), &["write -P 0x11 0 32M"]).await;
    cluster.snapshot("vm", "s1").await;
    slow_policy(&cluster, "slow", 1).await;
    // A thin volume larger than a host: a thick copy of it fits nowhere.
    cluster
        .control
        .create_volume(tessera_node::control::CreateVolume {
            name: "big".into(),
            size_bytes: 2 << 30,
            policy: None,
            block_bytes: None,
        })
        .await
        .unwrap();
    cluster.snapshot("big", "empty").await;
    for (name, ftt, reservation) in [("wide", 2, 0), ("thick", 1, 100)] {
        cluster
            .control
            .create_policy(CreatePolicy {
                name: name.into(),
                failures_to_tolerate: ftt,
                stripe_width: 1,
                space_reservation_pct: reservation,
                qos: VolumeQos::default(),
            })
            .await
            .unwrap();
    }

    // Refusals change nothing.
    let stored = components_stored(&cluster);
    let refused = [
        ("nope", "s1", full("c1", None)),
        ("vm", "nope", full("c1", None)),
        ("vm", "s1", full("vm", None)),
        ("vm", "s1", full("c1", Some("platinum"))),
        ("vm", "s1", full("c1", Some("wide"))),
        ("big", "empty", full("c1", Some("thick"))),
        ("vm", "s1", full("bad/name", None)),
        (
            "vm",
            "s1",
            CloneVolume {
                name: "c1".into(),
                full: false,
                policy: Some("slow".into()),
            },
        ),
    ];
    for (volume, snap, request) in refused {
        let what = format!("{volume}@{snap} as {request:?}");
        let e = cluster
            .control
            .clone_volume(volume, snap, request)
            .await
            .unwrap_err();
        let expected = match (volume, snap) {
            ("nope", _) | (_, "nope") => matches!(e, ControlError::NotFound(_)),
            _ => matches!(
                e,
                ControlError::Conflict(_)
                    | ControlError::NotFound(_)
                    | ControlError::Unsatisfiable(_)
                    | ControlError::Invalid(_)
            ),
        };
        assert!(expected, "{what}: {e:?}");
        eprintln!("refused as expected: {what}: {e}");
    }
    let names: Vec<String> = cluster
        .control
        .volumes()
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(names, ["big", "vm"], "no volume was made");
    assert_eq!(components_stored(&cluster), stored, "no component was left");

    // A fill at 1 MiB/s: 32 s for the snapshot's 32 MiB.
    let made = cluster
        .control
        .clone_volume("vm", "s1", full("copy", Some("slow")))
        .await
        .unwrap();
    let fill = made.fill.clone().expect("a throttled fill is under way");
    assert_eq!(fill.from, "vm@s1");
    assert_eq!(made.policy, "slow");
    let fill = wait_progress(&cluster, "copy", 2 * MIB).await;
    assert!(fill.copied_bytes > 0 && fill.runs == 1, "{fill:?}");
    let listed = cluster.control.volumes().await.unwrap();
    assert!(
        listed.iter().any(|v| v.name == "copy" && v.fill.is_some()),
        "{listed:?}"
    );

    // No client gets it, and it says why.
    for host in [&owner, &other] {
        let (ok, out) = qemu_img(&["info", &cluster.nbd_uri(host, "copy")]).await;
        assert!(!ok, "NBD served a volume being filled: {out}");
        assert!(
            out.contains("being filled from snapshot vm@s1"),
            "NBD through {host} says why: {out}"
        );
        let (ok, out) = run("iscsi-inq", vec![cluster.iscsi_url(host, "copy")]).await;
        assert!(!ok, "iSCSI served a volume being filled: {out}");
        eprintln!("iSCSI through {host} refused: {out}");
        assert!(
            !cluster
                .host(host)
                .attachments()
                .snapshot()
                .contains_key(&VolumeId::new("copy").unwrap()),
            "no client holds it open"
        );
    }

    // What it reads from stays, and it cannot change meanwhile.
    for e in [
        cluster
            .control
            .delete_snapshot("vm", "s1")
            .await
            .unwrap_err(),
        cluster.control.delete_volume("vm", true).await.unwrap_err(),
        cluster
            .control
            .rename_volume(
                "vm",
                RenameVolume {
                    new_name: "vm2".into(),
                },
            )
            .await
            .unwrap_err(),
    ] {
        assert!(matches!(e, ControlError::Conflict(_)), "{e:?}");
        assert!(
            e.to_string().contains("copy (from vm@s1"),
            "names the clone: {e}"
        );
    }
    for e in [
        cluster
            .control
            .create_snapshot(
                "copy",
                CreateSnapshot {
                    name: "x".into(),
                    ..Default::default()
                },
            )
            .await
            .unwrap_err(),
        cluster
            .control
            .resize_volume(
                "copy",
                ResizeVolume {
                    size_bytes: 2 * SIZE,
                },
            )
            .await
            .unwrap_err(),
        cluster
            .control
            .rename_volume(
                "copy",
                RenameVolume {
                    new_name: "copy2".into(),
                },
            )
            .await
            .unwrap_err(),
    ] {
        assert!(matches!(e, ControlError::Conflict(_)), "{e:?}");
        assert!(
            e.to_string()
                .contains("is being filled from snapshot vm@s1"),
            "{e}"
        );
    }
    assert_eq!(cluster.control.snapshots("vm").await.unwrap().len(), 1);

    // Deleted while it fills: the fill stops and nothing of it is left.
    let object = cluster.control.object("copy").await.unwrap();
    cluster.control.delete_volume("copy", false).await.unwrap();
    let gone = cluster.control.volume("copy").await.unwrap_err();
    assert!(matches!(gone, ControlError::NotFound(_)), "{gone:?}");
    let io = cluster
        .host(&other)
        .components(&VolumeId::new("copy").unwrap());
    for c in &object.components {
        let placement = tessera_types::layout::ComponentPlacement {
            id: c.id,
            role: c.role,
            host: tessera_types::HostId::new(&c.host).unwrap(),
            disk_group: tessera_types::DiskGroupId::new(&c.disk_group).unwrap(),
            fault_domain: tessera_types::FaultDomainId::new(&c.fault_domain).unwrap(),
            votes: c.votes,
            size_bytes: if c.role == ComponentRole::Data {
                SIZE
            } else {
                0
            },
            state: c.state,
        };
        let e = io.status(&placement).await.unwrap_err();
        assert!(
            matches!(e, ComponentError::NotFound { .. }),
            "{}: {e}",
            c.id
        );
    }
    // The fill's owner noticed: nothing brings the volume back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(cluster.control.volume("copy").await.is_err());
    assert_eq!(components_stored(&cluster), stored);
    // The snapshot is free to go now.
    cluster.control.delete_snapshot("vm", "s1").await.unwrap();
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_whose_owner_stops_is_taken_up_by_the_next_owner_where_it_was() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    let view = cluster.create("vm", SIZE).await;
    let (owner, _) = fixture::owner_and_other(&view);
    let a = image(&cluster, "a.raw", 0x5eed);
    write_image(&a, &cluster.nbd_uri(&owner, "vm")).await;
    cluster.snapshot("vm", "s1").await;
    slow_policy(&cluster, "slow", 1).await;

    cluster
        .control
        .clone_volume("vm", "s1", full("copy", Some("slow")))
        .await
        .unwrap();
    let first = wait_progress(&cluster, "copy", 4 * MIB).await;
    let filling = cluster.control.volume("copy").await.unwrap();
    let stopped = filling.owner.clone().expect("an owner runs the fill");
    assert_eq!(first.runs, 1, "{first:?}");
    // Its owner goes away as a crashed host would.
    cluster.control.stop_host(&stopped).await.unwrap();
    let taken_up = wait_volume(&cluster, "copy", "another owner to take up the fill", |v| {
        assert!(
            v.fill.is_some(),
            "the fill ended before another owner was seen running it: {v:?}"
        );
        v.owner.as_deref().is_some_and(|o| o != stopped)
            && v.fill.as_ref().is_some_and(|f| f.runs >= 2)
    })
    .await;
    let fill = taken_up.fill.unwrap();
    assert!(
        fill.resumed_from_bytes >= first.done_bytes,
        "the next owner began at {} though {} was recorded done",
        fill.resumed_from_bytes,
        first.done_bytes
    );
    let filled = wait_filled(&cluster, "copy").await;
    assert_eq!(filled.used_bytes, IMAGE_DATA, "{filled:?}");
    // The policy's limit paces clients too: lifted, the checks read at
    // full speed.
    cluster
        .control
        .update_policy(
            "slow",
            tessera_node::control::UpdatePolicy {
                qos: Some(tessera_node::control::QosChange {
                    bandwidth_limit_mib_s: Some(0),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let reader = filled.owner.clone().unwrap();
    let (ok, out) = same(&a, &cluster.nbd_uri(&reader, "copy")).await;
    assert!(
        ok,
        "the clone holds the snapshot after the owner changed: {out}"
    );

    // The stopped host's copy catches up once it is back.
    cluster.control.start_host(&stopped).await.unwrap();
    cluster
        .wait_for("copy", "every copy in sync", |v| {
            v.state == tessera_node::control::Health::Healthy
        })
        .await;
    let report = cluster.control.verify_object("copy").await.unwrap();
    assert!(report.identical, "{report:?}");
    assert_eq!(report.compared_bytes, IMAGE_DATA);
    let (ok, out) = same(&a, &cluster.nbd_uri(&stopped, "copy")).await;
    assert!(ok, "through the host that came back: {out}");
    cluster.stop().await;
}
