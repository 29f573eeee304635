//! What the control plane says is true: a four-host cluster in one process,
//! walked through create, resize, a host stop, resync and restart, with
//! `volume list`, `object show`, `status` and `host list` checked against
//! each other at every step; health checks raised by their causes and
//! cleared when the causes go; thin-provisioning limits; and a volume that a
//! real NBD client has open, which a delete refuses unless forced.

mod fixture;

use fixture::{have, Cluster};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tessera_node::control::{
    ClusterControl, ControlError, CreatePolicy, CreateVolume, Health, HealthCode, ResizeVolume,
    StatusView, UpdatePolicy, UpdateSettings,
};

/// Every view of `volume` names the same health, owner and epoch.
async fn assert_views_agree(cluster: &Cluster, volume: &str) -> StatusView {
    let control = &cluster.control;
    // Read twice around the status so that a change in between is not
    // taken for a disagreement.
    for _ in 0..20 {
        let listed = control.volumes().await.unwrap();
        let status = control.status().await.unwrap();
        let object = control.object(volume).await.unwrap();
        let one = control.volume(volume).await.unwrap();
        let listed = listed.into_iter().find(|v| v.name == volume).unwrap();
        let in_status = status.volumes.iter().find(|v| v.name == volume).unwrap();
        let same = [
            (listed.state, &listed.owner, listed.epoch),
            (in_status.state, &in_status.owner, in_status.epoch),
            (object.state, &object.owner, object.epoch),
            (one.state, &one.owner, one.epoch),
        ]
        .windows(2)
        .all(|w| w[0] == w[1]);
        if same {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("views of {volume} keep disagreeing");
}

/// Changes the cluster settings, which must be accepted.
async fn set(cluster: &Cluster, change: UpdateSettings) {
    cluster.control.update_settings(change).await.unwrap();
}

/// The codes of the checks the cluster raises now.
async fn raised(cluster: &Cluster) -> Vec<HealthCode> {
    codes(&cluster.control.status().await.unwrap())
}

fn codes(status: &StatusView) -> Vec<HealthCode> {
    status.checks.iter().map(|c| c.code).collect()
}

async fn wait_status(
    cluster: &Cluster,
    what: &str,
    ok: impl Fn(&StatusView) -> bool,
) -> StatusView {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = cluster.control.status().await.unwrap();
        if ok(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {s:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn list_object_status_and_hosts_agree_through_create_resize_stop_and_resync() {
    let cluster = Cluster::start(3600).await;
    let control = &cluster.control;

    // A create answers with the volume as it serves: owned and healthy.
    let created = control
        .create_volume(CreateVolume {
            name: "vm1".into(),
            size_bytes: 64 << 20,
            policy: None,
            block_bytes: None,
        })
        .await
        .unwrap();
    assert_eq!(created.state, Health::Healthy, "{created:?}");
    assert!(
        created.owner.is_some() && created.epoch.is_some(),
        "{created:?}"
    );
    let status = assert_views_agree(&cluster, "vm1").await;
    assert_eq!(status.health, Health::Healthy, "{status:#?}");
    assert!(status.checks.is_empty(), "{:#?}", status.checks);

    // Components and provisioned bytes per disk group come from the layouts.
    let object = control.object("vm1").await.unwrap();
    let hosts = ClusterControl::hosts(control.as_ref()).await.unwrap();
    let components: u64 = hosts
        .iter()
        .flat_map(|h| h.disk_groups.iter())
        .map(|g| g.components)
        .sum();
    assert_eq!(components, object.components.len() as u64, "{hosts:#?}");
    for c in &object.components {
        let group = hosts
            .iter()
            .find(|h| h.id == c.host)
            .and_then(|h| h.disk_groups.iter().find(|g| g.id == c.disk_group))
            .unwrap();
        assert!(group.components >= 1, "{c:?} not counted: {group:?}");
    }
    assert_eq!(status.capacity.provisioned_bytes, 2 * (64 << 20));

    // A resize to the same size changes nothing, not even the epoch.
    let same = control
        .resize_volume(
            "vm1",
            ResizeVolume {
                size_bytes: 64 << 20,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (same.owner.clone(), same.epoch),
        (created.owner.clone(), created.epoch)
    );
    // A real resize answers with the new owner in place.
    let grown = control
        .resize_volume(
            "vm1",
            ResizeVolume {
                size_bytes: 128 << 20,
            },
        )
        .await
        .unwrap();
    assert_eq!(grown.size_bytes, 128 << 20);
    assert_eq!(grown.state, Health::Healthy, "{grown:?}");
    assert!(grown.owner.is_some(), "{grown:?}");
    let status = assert_views_agree(&cluster, "vm1").await;
    assert_eq!(status.capacity.provisioned_bytes, 2 * (128 << 20));

    // Writes show as used bytes in the volume and in the disk groups at once.
    let (owner, other) = fixture::owner_and_other(&control.object("vm1").await.unwrap());
    if have("nbdcopy") {
        let data = cluster.dir.path().join("data");
        std::fs::write(&data, vec![0x5au8; 16 << 20]).unwrap();
        fixture::run(
            "nbdcopy",
            &[data.to_str().unwrap(), &cluster.nbd_uri(&owner, "vm1")],
        );
        let status = assert_views_agree(&cluster, "vm1").await;
        let vm1 = status.volumes.iter().find(|v| v.name == "vm1").unwrap();
        assert_eq!(vm1.used_bytes, 16 << 20, "{vm1:?}");
        assert!(
            status.capacity.used_bytes >= 2 * (16 << 20),
            "two copies of 16 MiB are used: {:?}",
            status.capacity
        );
    }

    // A stopped copy host: every view says degraded at once, with the
    // checks that explain it and the time left before a rebuild.
    let copy_host = control
        .object("vm1")
        .await
        .unwrap()
        .components
        .iter()
        .find(|c| c.host != owner && c.role == tessera_types::layout::ComponentRole::Data)
        .map(|c| c.host.clone())
        .unwrap_or(other);
    control.stop_host(&copy_host).await.unwrap();
    let status = assert_views_agree(&cluster, "vm1").await;
    let vm1 = status.volumes.iter().find(|v| v.name == "vm1").unwrap();
    assert_eq!(vm1.state, Health::Degraded, "{vm1:?}");
    assert_eq!(status.health, Health::Degraded);
    let status = wait_status(&cluster, "the repair countdown", |s| {
        s.checks
            .iter()
            .any(|c| c.code == HealthCode::RepairDelayPending && c.seconds_left.is_some())
    })
    .await;
    for code in [HealthCode::HostDown, HealthCode::ComponentAbsent] {
        assert!(
            codes(&status).contains(&code),
            "{code:?}: {:#?}",
            status.checks
        );
    }
    let down = status
        .checks
        .iter()
        .find(|c| c.code == HealthCode::HostDown)
        .unwrap();
    assert_eq!(down.affects, vec![copy_host.clone()]);
    assert!(!down.remedy.is_empty());
    let pending = status
        .checks
        .iter()
        .find(|c| c.code == HealthCode::RepairDelayPending)
        .unwrap();
    let left = pending.seconds_left.expect("time left");
    assert!((3000..=3600).contains(&left), "{pending:?}");

    // Back: the checks clear when the cause goes.
    control.start_host(&copy_host).await.unwrap();
    let status = wait_status(&cluster, "health to return", |s| {
        s.health == Health::Healthy && s.checks.is_empty()
    })
    .await;
    assert_views_agree(&cluster, "vm1").await;
    assert!(status.hosts.iter().all(|h| h.state == "present"));

    // The owner's host stopping: no view keeps naming it.
    control.stop_host(&owner).await.unwrap();
    let status = assert_views_agree(&cluster, "vm1").await;
    let vm1 = status.volumes.iter().find(|v| v.name == "vm1").unwrap();
    assert_ne!(vm1.owner.as_deref(), Some(owner.as_str()), "{vm1:?}");
    assert_ne!(vm1.state, Health::Healthy, "{vm1:?}");
    let moved = cluster
        .wait_for("vm1", "a new owner", |v| v.owner.is_some())
        .await;
    assert_ne!(moved.owner.as_deref(), Some(owner.as_str()));
    assert_views_agree(&cluster, "vm1").await;
    control.start_host(&owner).await.unwrap();
    wait_status(&cluster, "health to return", |s| {
        s.health == Health::Healthy
    })
    .await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thin_provisioning_is_limited_by_the_overcommit_setting_and_watched_by_thresholds() {
    let cluster = Cluster::start(3600).await;
    let control = &cluster.control;
    let total = control.status().await.unwrap().capacity.total_bytes;
    assert!(total > 0);

    // Up to the capacity: no word. Past it: created, with a warning and the
    // OVERCOMMITTED check. Past the setting: refused with the numbers.
    let quiet = control
        .create_volume(CreateVolume {
            name: "small".into(),
            size_bytes: 256 << 20,
            policy: None,
            block_bytes: None,
        })
        .await
        .unwrap();
    assert!(quiet.warnings.is_empty(), "{quiet:?}");
    let big = total / 2 / (1 << 20) * (1 << 20);
    let warned = control
        .create_volume(CreateVolume {
            name: "big".into(),
            size_bytes: big,
            policy: None,
            block_bytes: None,
        })
        .await
        .unwrap();
    assert!(
        warned.warnings.iter().any(|w| w.contains("overcommitted")),
        "{warned:?}"
    );
    let status = control.status().await.unwrap();
    assert!(codes(&status).contains(&HealthCode::Overcommitted));
    assert!(
        status.capacity.overcommit_ratio > 1.0,
        "{:?}",
        status.capacity
    );
    let before = control.volumes().await.unwrap();
    let refused = control
        .create_volume(CreateVolume {
            name: "huge".into(),
            size_bytes: 1 << 40,
            policy: None,
            block_bytes: None,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ControlError::Unsatisfiable(_)),
        "{refused:?}"
    );
    let text = refused.to_string();
    assert!(
        text.contains("largest overcommit allowed (4.00x)") && text.contains("TiB"),
        "{text}"
    );
    assert_eq!(
        control.volumes().await.unwrap(),
        before,
        "a refusal changes nothing"
    );
    let grow_refused = control
        .resize_volume(
            "small",
            ResizeVolume {
                size_bytes: 1 << 40,
            },
        )
        .await
        .unwrap_err();
    assert!(
        grow_refused.to_string().contains("overcommit"),
        "{grow_refused}"
    );

    // The setting moves the limit; a bad value is refused and changes nothing.
    let bad = control
        .update_settings(UpdateSettings {
            max_overcommit_ratio: Some(-1.0),
            ..UpdateSettings::default()
        })
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("max_overcommit_ratio"), "{bad}");
    set(
        &cluster,
        UpdateSettings {
            max_overcommit_ratio: Some(1.0),
            ..UpdateSettings::default()
        },
    )
    .await;
    let refused = control
        .create_volume(CreateVolume {
            name: "more".into(),
            size_bytes: 64 << 20,
            policy: None,
            block_bytes: None,
        })
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("(1.00x)"), "{refused}");

    // Reservations count as used: a thick volume crosses a low threshold.
    control.delete_volume("big", false).await.unwrap();
    set(
        &cluster,
        UpdateSettings {
            max_overcommit_ratio: Some(4.0),
            ..UpdateSettings::default()
        },
    )
    .await;
    control
        .create_policy(CreatePolicy {
            name: "thick".into(),
            failures_to_tolerate: 1,
            stripe_width: 1,
            space_reservation_pct: 100,
            qos: Default::default(),
        })
        .await
        .unwrap();
    control
        .create_volume(CreateVolume {
            name: "db".into(),
            size_bytes: total / 8 / (1 << 20) * (1 << 20),
            policy: Some("thick".into()),
            block_bytes: None,
        })
        .await
        .unwrap();
    assert!(!codes(&control.status().await.unwrap()).contains(&HealthCode::DatastoreNearlyFull));
    set(
        &cluster,
        UpdateSettings {
            nearly_full_pct: Some(10),
            full_pct: Some(90),
            ..UpdateSettings::default()
        },
    )
    .await;
    assert!(raised(&cluster)
        .await
        .contains(&HealthCode::DatastoreNearlyFull));
    set(
        &cluster,
        UpdateSettings {
            full_pct: Some(20),
            ..UpdateSettings::default()
        },
    )
    .await;
    assert!(raised(&cluster).await.contains(&HealthCode::DatastoreFull));
    set(
        &cluster,
        UpdateSettings {
            nearly_full_pct: Some(80),
            full_pct: Some(95),
            ..UpdateSettings::default()
        },
    )
    .await;
    let status = control.status().await.unwrap();
    assert!(
        !codes(&status).contains(&HealthCode::DatastoreNearlyFull)
            && !codes(&status).contains(&HealthCode::DatastoreFull),
        "{:#?}",
        status.checks
    );

    // A policy in use can be neither changed nor deleted; unused it can.
    let in_use = control.delete_policy("thick").await.unwrap_err();
    assert!(in_use.to_string().contains("db"), "{in_use}");
    let change = control
        .update_policy(
            "thick",
            UpdatePolicy {
                failures_to_tolerate: Some(0),
                ..UpdatePolicy::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        change.to_string().contains("used by volume(s) db"),
        "{change}"
    );
    control.delete_volume("db", false).await.unwrap();
    let changed = control
        .update_policy(
            "thick",
            UpdatePolicy {
                space_reservation_pct: Some(50),
                ..UpdatePolicy::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(changed.space_reservation_pct, 50);
    assert_eq!(control.policy("thick").await.unwrap(), changed);
    control.delete_policy("thick").await.unwrap();
    assert!(matches!(
        control.policy("thick").await,
        Err(ControlError::NotFound(_))
    ));
    assert!(control.delete_policy("default").await.is_err());
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_open_volume_is_deleted_only_by_force_and_its_client_fails_at_once() {
    // Debian's python3 has libnbd's bindings (whichever python3 is first
    // on the PATH may not).
    const PYTHON: &str = "/usr/bin/python3";
    let bindings = Command::new(PYTHON)
        .args(["-c", "import nbd"])
        .status()
        .is_ok_and(|s| s.success());
    if !bindings && !have("libnbd-python-bindings") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    let control = &cluster.control;
    let view = cluster.create("vm1", 64 << 20).await;
    let (_, other) = fixture::owner_and_other(&view);
    // A real NBD client through a host that does not own the volume: it
    // holds the connection until told to write.
    let script = format!(
        "import nbd, sys\nh = nbd.NBD()\nh.connect_uri({:?})\nsys.stdin.readline()\nh.pwrite(b'x' * 4096, 0)\nprint('written')\n",
        cluster.nbd_uri(&other, "vm1")
    );
    let mut client = Command::new(PYTHON)
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while control.volume("vm1").await.unwrap().open_by == 0 {
        assert!(Instant::now() < deadline, "the client never showed as open");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused = control.delete_volume("vm1", false).await.unwrap_err();
    assert!(matches!(refused, ControlError::Conflict(_)), "{refused:?}");
    assert!(
        refused.to_string().contains("open by 1 client") && refused.to_string().contains(&other),
        "{refused}"
    );
    assert!(
        control.volume("vm1").await.is_ok(),
        "a refusal changes nothing"
    );
    let rename = control
        .rename_volume(
            "vm1",
            tessera_node::control::RenameVolume {
                new_name: "vm2".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(rename.to_string().contains("open by 1 client"), "{rename}");

    control.delete_volume("vm1", true).await.unwrap();
    let started = Instant::now();
    client.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = client.wait_with_output().unwrap();
    let waited = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the write after a forced delete failed"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("written"),
        "{stderr}"
    );
    // Before, a client waited for an owner that never came (15 s) first.
    assert!(
        waited < Duration::from_secs(8),
        "the client's error took {waited:?}: {stderr}"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renamed_volume_keeps_its_data_copies_and_access_under_the_new_name() {
    if !have("nbdcopy") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    let control = &cluster.control;
    let before = cluster.create("vm1", 32 << 20).await;
    cluster.create("other", 4 << 20).await;
    let (owner, _) = fixture::owner_and_other(&before);
    let data = cluster.dir.path().join("data");
    let pattern: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&data, &pattern).unwrap();
    fixture::run(
        "nbdcopy",
        &[data.to_str().unwrap(), &cluster.nbd_uri(&owner, "vm1")],
    );

    let taken = control
        .rename_volume(
            "vm1",
            tessera_node::control::RenameVolume {
                new_name: "other".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(taken.to_string().contains("already exists"), "{taken}");
    let bad = control
        .rename_volume(
            "vm1",
            tessera_node::control::RenameVolume {
                new_name: "no/slash".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(bad, ControlError::Invalid(_)), "{bad:?}");

    let renamed = control
        .rename_volume(
            "vm1",
            tessera_node::control::RenameVolume {
                new_name: "db1".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(renamed.name, "db1");
    assert_eq!(renamed.state, Health::Healthy, "{renamed:?}");
    assert!(
        renamed.epoch > before.epoch,
        "the epoch keeps rising: {renamed:?} after {before:?}"
    );
    assert!(matches!(
        control.volume("vm1").await,
        Err(ControlError::NotFound(_))
    ));
    let object = control.object("db1").await.unwrap();
    let ids = |o: &tessera_node::control::ObjectView| {
        o.components.iter().map(|c| c.id).collect::<Vec<_>>()
    };
    assert_eq!(ids(&object), ids(&before), "the same copies serve it");

    // The data reads back through any host under the new name, and writes go on.
    let back = cluster.dir.path().join("back");
    fixture::run(
        "nbdcopy",
        &[&cluster.nbd_uri("host-4", "db1"), back.to_str().unwrap()],
    );
    let read = std::fs::read(&back).unwrap();
    assert_eq!(&read[..pattern.len()], &pattern[..]);
    assert!(read[pattern.len()..].iter().all(|&b| b == 0));
    fixture::run(
        "nbdcopy",
        &[data.to_str().unwrap(), &cluster.nbd_uri("host-2", "db1")],
    );
    let verify = control.verify_object("db1").await.unwrap();
    assert!(verify.identical, "{verify:?}");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_volume_without_a_quorum_is_unavailable_in_every_view_until_its_hosts_return() {
    let cluster = Cluster::start(3600).await;
    let control = &cluster.control;
    let view = cluster.create("vm1", 16 << 20).await;
    let data_hosts: Vec<String> = view
        .components
        .iter()
        .filter(|c| c.role == tessera_types::layout::ComponentRole::Data)
        .map(|c| c.host.clone())
        .collect();
    assert_eq!(data_hosts.len(), 2, "{view:#?}");
    for h in &data_hosts {
        control.stop_host(h).await.unwrap();
    }
    let status = assert_views_agree(&cluster, "vm1").await;
    let vm1 = status.volumes.iter().find(|v| v.name == "vm1").unwrap();
    assert_eq!(vm1.state, Health::Unavailable, "{vm1:?}");
    assert_eq!(status.health, Health::Unavailable);
    let unavailable = status
        .checks
        .iter()
        .find(|c| c.code == HealthCode::VolumeUnavailable)
        .unwrap_or_else(|| panic!("{:#?}", status.checks));
    assert_eq!(unavailable.affects, vec!["vm1".to_string()]);
    assert_eq!(
        status.checks[0].code,
        HealthCode::VolumeUnavailable,
        "errors first"
    );
    let health = control.health().await.unwrap();
    assert!(
        health
            .checks
            .iter()
            .any(|c| c.code == HealthCode::VolumeUnavailable),
        "{:#?}",
        health.checks
    );

    for h in &data_hosts {
        control.start_host(h).await.unwrap();
    }
    wait_status(&cluster, "every check to clear", |s| {
        s.health == Health::Healthy && s.checks.is_empty()
    })
    .await;
    assert_views_agree(&cluster, "vm1").await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_iscsi_session_holds_its_volume_open_and_a_forced_delete_fails_its_next_write_at_once() {
    if !have("iscsi-inq") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    let Some(client) = fixture::libiscsi_client(cluster.dir.path(), "hold_session") else {
        return;
    };
    let control = &cluster.control;
    cluster.create("esx1", 16 << 20).await;
    let url = cluster.iscsi_url("host-3", "esx1");
    fixture::wait_for_target(&url).await;
    let mut session = Command::new(&client)
        .arg(&url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while control.volume("esx1").await.unwrap().open_by == 0 {
        assert!(
            Instant::now() < deadline,
            "the session never showed as open"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused = control.delete_volume("esx1", false).await.unwrap_err();
    assert!(
        refused.to_string().contains("open by 1 client") && refused.to_string().contains("host-3"),
        "{refused}"
    );
    control.delete_volume("esx1", true).await.unwrap();
    let started = Instant::now();
    session.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = session.wait_with_output().unwrap();
    let waited = started.elapsed();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "the write is refused: {said}");
    // LOGICAL UNIT NOT SUPPORTED: ILLEGAL REQUEST, 25h/00h.
    assert!(said.contains("sense key 0x5 asc 0x25"), "{said}");
    assert!(
        waited < Duration::from_secs(8),
        "the refusal took {waited:?}"
    );
    assert_eq!(
        control.volumes().await.unwrap().len(),
        0,
        "the volume is gone"
    );
    cluster.stop().await;
}
