//! iSCSI on a four-host cluster in one process, driven by real initiators:
//! libiscsi's conformance suite against a mirrored volume, its multipath
//! suite across the owner's host and another host, qemu-img through
//! `iscsi://`, the identity every host reports for the same volume, and
//! snapshots served as read-only targets open to whom their volume admits.

mod fixture;

use fixture::{have, libiscsi_client, owner_and_other, run, wait_for_target, Cluster};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tessera_node::control::{
    ChapCredential, ClusterControl, ControlError, CreateSnapshot, IscsiAccess,
};

/// Runs `iscsi-test-cu` (verbose, so every test's outcome is printed) and
/// returns its log, also kept at `log`.
async fn conformance(tests: &str, urls: &[String], log: &Path) -> String {
    for url in urls {
        wait_for_target(url).await;
    }
    let mut args = vec!["--dataloss".to_string(), "-t".into(), tests.into()];
    args.extend(urls.iter().cloned());
    let out = tokio::task::spawn_blocking(move || {
        Command::new("iscsi-test-cu")
            .args(&args)
            .output()
            .expect("iscsi-test-cu starts")
    })
    .await
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(log, &text).unwrap();
    text
}

/// Per-suite counts (passed, failed, skipped) from a verbose log, counted
/// strictly: a skip is not a pass, and a test that prints FAILED failed
/// even when CUnit let it pass.
fn suite_counts(log: &str, suite: &str) -> (u32, u32, u32) {
    let mut counts = (0, 0, 0);
    let mut in_suite = false;
    let mut state: Option<char> = None;
    let close = |state: &mut Option<char>, counts: &mut (u32, u32, u32)| {
        match state.take() {
            Some('p') => counts.0 += 1,
            Some('f') => counts.1 += 1,
            Some('s') => counts.2 += 1,
            _ => {}
        };
    };
    for line in log.lines() {
        if let Some(name) = line.strip_prefix("Suite: ") {
            if in_suite {
                close(&mut state, &mut counts);
            }
            in_suite = name.trim() == suite;
            continue;
        }
        if !in_suite {
            continue;
        }
        if line.trim_start().starts_with("Test: ") {
            close(&mut state, &mut counts);
            state = Some('p');
        }
        if line.starts_with("Run Summary") {
            close(&mut state, &mut counts);
            in_suite = false;
        }
        if line.contains("FAILED") {
            state = Some('f');
        } else if line.contains("SKIPPED") && state != Some('f') {
            state = Some('s');
        }
    }
    if in_suite {
        close(&mut state, &mut counts);
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multipath_io_passes_through_the_owner_and_a_non_owner_host() {
    if !have("iscsi-test-cu") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    let (owner, other) = owner_and_other(&cluster.create("mp", 64 << 20).await);
    let dir = tempfile::tempdir().unwrap();
    let log = conformance(
        "ALL.MultipathIO",
        &[
            cluster.iscsi_url(&owner, "mp"),
            cluster.iscsi_url(&other, "mp"),
        ],
        &dir.path().join("multipath.log"),
    )
    .await;
    assert_eq!(suite_counts(&log, "MultipathIO"), (4, 0, 0), "{log}");
    cluster.stop().await;
}

/// Writes `mib` MiB of a fixed pattern to `write_url` with `qemu-img
/// convert`, then checks with `qemu-img compare` through `read_url` that the
/// volume holds it (and zeros past it).
async fn qemu_img_round_trip(dir: &Path, mib: u64, write_url: String, read_url: String) {
    let source = dir.join("source.raw");
    let data: Vec<u8> = (0..(mib << 20))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&source, &data).unwrap();
    let source = source.to_str().unwrap().to_string();
    wait_for_target(&write_url).await;
    wait_for_target(&read_url).await;
    tokio::task::spawn_blocking(move || {
        run(
            "qemu-img",
            &[
                "convert", "-n", "-f", "raw", "-O", "raw", &source, &write_url,
            ],
        );
        // The volume may be larger than the image: compare checks that the
        // rest reads as zeros.
        let text = run(
            "qemu-img",
            &["compare", "-f", "raw", "-F", "raw", &source, &read_url],
        );
        assert!(text.contains("Images are identical"), "{text}");
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn qemu_img_round_trips_through_iscsi_and_every_host_names_the_volume_alike() {
    if !have("qemu-img") || !have("iscsi-inq") || !have("iscsi-readcapacity16") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    let (owner, other) = owner_and_other(&cluster.create("img", 128 << 20).await);
    let dir = tempfile::tempdir().unwrap();
    qemu_img_round_trip(
        dir.path(),
        48,
        cluster.iscsi_url(&other, "img"),
        cluster.iscsi_url(&owner, "img"),
    )
    .await;

    let mut designators = Vec::new();
    for host in [&owner, &other] {
        let url = cluster.iscsi_url(host, "img");
        let text = run("iscsi-inq", &["-e", "1", "-c", "131", &url]);
        // iscsi-inq prints the binary NAA designator as text, so compare
        // the T10 vendor designator, which carries the same serial.
        assert!(text.contains("Designator Type:(3) NAA"), "{text}");
        let t10 = text
            .lines()
            .find(|l| l.contains("Designator:[TESSERA "))
            .unwrap_or_else(|| panic!("no T10 designator through {host}:\n{text}"));
        designators.push(t10.to_string());
        let pages = run("iscsi-inq", &["-e", "1", "-c", "0", &url]);
        for page in ["0x00", "0x80", "0x83", "0xb0", "0xb1", "0xb2"] {
            assert!(pages.contains(page), "VPD {page} missing:\n{pages}");
        }
        let capacity = run("iscsi-readcapacity16", &[&url]);
        assert!(
            capacity.contains("LOGICAL BLOCK LENGTH IN BYTES:512"),
            "{capacity}"
        );
        assert!(
            capacity.contains("LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT:3"),
            "{capacity}"
        );
        assert!(capacity.contains("LBPME:1 LBPRZ:1"), "{capacity}");
        assert!(
            capacity.contains(&format!("Total size:{}", 128u64 << 20)),
            "{capacity}"
        );
    }
    assert_eq!(
        designators[0], designators[1],
        "hosts name one volume differently"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_conformance_suite_passes_on_a_mirrored_volume() {
    if !have("iscsi-test-cu") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    let view = cluster.create("conf", 64 << 20).await;
    let owner = view.owner.clone().expect("an owner");
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("all.log");
    let log = conformance("ALL", &[cluster.iscsi_url(&owner, "conf")], &log_path).await;
    for suite in [
        "CompareAndWrite",
        "ExtendedCopy",
        "ReceiveCopyResults",
        "WriteSame10",
        "WriteSame16",
        "Unmap",
        "Inquiry",
        "ReadCapacity16",
        "ReportSupportedOpcodes",
        "ProutRegister",
        "ProutReserve",
        "PrinReadKeys",
        "iSCSIcmdsn",
        "iSCSIResiduals",
        "iSCSITMF",
    ] {
        let (passed, failed, skipped) = suite_counts(&log, suite);
        assert!(
            passed > 0 && failed == 0 && skipped == 0,
            "{suite}: {passed} passed, {failed} failed, {skipped} skipped\n{log}"
        );
    }
    // The offloads the suite asked for are counted, as esxtop would show.
    let offloads = cluster.control.object("conf").await.unwrap().offloads;
    assert!(
        offloads.ats > 0
            && offloads.ats_miscompare > 0
            && offloads.clone_commands > 0
            && offloads.zero_blocks > 0
            && offloads.delete_blocks > 0,
        "{offloads:?}"
    );
    // The data the suite wrote went through the owner to both copies.
    let report = cluster
        .control
        .verify_object("conf")
        .await
        .expect("verify runs");
    assert!(report.identical, "{report:?}");
    cluster.stop().await;
}

/// Runs `iscsi-inq` as `initiator` with `env`, bounded in time; true when
/// it logged in and got an answer.
fn inquiry_succeeds(initiator: &str, url: &str, env: &[(&str, &str)]) -> bool {
    Command::new("timeout")
        .args(["-k", "5", "30", "iscsi-inq", "-i", initiator, url])
        .envs(env.iter().copied())
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chap_and_initiator_lists_decide_who_logs_in_on_every_host() {
    if !have("iscsi-inq") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    cluster.create("sec", 16 << 20).await;
    for host in ["host-1", "host-3"] {
        wait_for_target(&cluster.iscsi_url(host, "sec")).await;
    }
    let allowed = "iqn.2026-11.test:allowed";
    let chap = |user: &str, secret: &str| {
        Some(ChapCredential {
            user: user.into(),
            secret: secret.into(),
        })
    };
    // Settings that would weaken CHAP are refused and change nothing.
    for bad in [
        IscsiAccess {
            initiator_chap: chap("alice", "short"),
            ..Default::default()
        },
        IscsiAccess {
            initiator_chap: chap("alice", "same-secret-both"),
            target_chap: chap("tessera", "same-secret-both"),
            ..Default::default()
        },
        IscsiAccess {
            target_chap: chap("tessera", "target-secret-12"),
            ..Default::default()
        },
        IscsiAccess {
            allowed_initiators: vec!["not an iqn".into()],
            ..Default::default()
        },
    ] {
        let refused = cluster.control.set_iscsi_access("sec", bad).await;
        assert!(
            matches!(refused, Err(ControlError::Invalid(_))),
            "{refused:?}"
        );
    }
    let open = cluster.control.iscsi_access("sec").await.unwrap();
    assert!(open.allowed_initiators.is_empty() && open.chap_user.is_none());

    let view = cluster
        .control
        .set_iscsi_access(
            "sec",
            IscsiAccess {
                allowed_initiators: vec![allowed.into()],
                initiator_chap: chap("alice", "alice-secret-12"),
                target_chap: chap("tessera", "target-secret-12"),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(view.chap_user.as_deref(), Some("alice"));
    for host in ["host-1", "host-3"] {
        let url = cluster.iscsi_url(host, "sec");
        let with = |auth: &str| url.replacen("iscsi://", &format!("iscsi://{auth}@"), 1);
        // Every host learns the settings on its next look at the directory.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        while inquiry_succeeds(allowed, &url, &[]) {
            assert!(
                std::time::Instant::now() < deadline,
                "{host} still admits without CHAP"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        let right = with("alice%alice-secret-12");
        assert!(
            inquiry_succeeds(allowed, &right, &[]),
            "{host}: right secret refused"
        );
        assert!(
            !inquiry_succeeds(allowed, &with("alice%wrong-secret-00"), &[]),
            "{host}: wrong secret admitted"
        );
        assert!(
            !inquiry_succeeds("iqn.2026-11.test:other", &right, &[]),
            "{host}: an initiator not on the list was admitted"
        );
        let target = |secret: &'static str| {
            [
                ("LIBISCSI_CHAP_TARGET_USERNAME", "tessera"),
                ("LIBISCSI_CHAP_TARGET_PASSWORD", secret),
            ]
        };
        assert!(
            inquiry_succeeds(allowed, &right, &target("target-secret-12")),
            "{host}: mutual CHAP refused"
        );
        assert!(
            !inquiry_succeeds(allowed, &right, &target("not-the-target")),
            "{host}: the initiator accepted a wrong target answer"
        );
    }
    cluster.stop().await;
}

/// A volume created with 4096-byte blocks (4Kn) presents them through every
/// host and both frontends; data round trips through qemu-img, and GET LBA
/// STATUS passes libiscsi's whole suite (its single-block test needs one
/// logical block per physical block).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_4kn_volume_presents_4096_byte_blocks_through_every_host_and_frontend() {
    if !have("qemu-img") || !have("iscsi-readcapacity16") || !have("iscsi-test-cu") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    let view = cluster
        .create_with_blocks("fourk", 64 << 20, Some(4096))
        .await;
    assert_eq!(
        cluster.control.volumes().await.unwrap()[0].block_bytes,
        4096
    );
    let (owner, other) = owner_and_other(&view);
    for host in [&owner, &other] {
        let url = cluster.iscsi_url(host, "fourk");
        wait_for_target(&url).await;
        let capacity = run("iscsi-readcapacity16", &[&url]);
        for line in [
            "LOGICAL BLOCK LENGTH IN BYTES:4096",
            "LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT:0",
            "LBPME:1 LBPRZ:1",
        ] {
            assert!(
                capacity.contains(line),
                "{line} through {host}:\n{capacity}"
            );
        }
    }
    if have("nbdinfo") {
        let info = run("nbdinfo", &["--json", &cluster.nbd_uri(&other, "fourk")]);
        assert!(info.contains("\"block_size_minimum\": 4096"), "{info}");
    }
    let dir = tempfile::tempdir().unwrap();
    qemu_img_round_trip(
        dir.path(),
        16,
        cluster.iscsi_url(&other, "fourk"),
        cluster.iscsi_url(&owner, "fourk"),
    )
    .await;
    let log_path = dir.path().join("lbastatus.log");
    let url = cluster.iscsi_url(&owner, "fourk");
    let log = conformance("SCSI.GetLBAStatus", &[url], &log_path).await;
    assert_eq!(suite_counts(&log, "GetLBAStatus"), (3, 0, 0), "{log}");
    // A block size no frontend can present is refused, and nothing is made.
    let refused = cluster
        .control
        .create_volume(tessera_node::control::CreateVolume {
            name: "odd".into(),
            size_bytes: 64 << 20,
            policy: None,
            block_bytes: Some(1024),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, ControlError::Invalid(m) if m.contains("512 (512e) or 4096 (4Kn)")),
        "{refused}"
    );
    assert_eq!(cluster.control.volumes().await.unwrap().len(), 1);
    cluster.stop().await;
}

/// Runs `tool args` as it is, bounded in time: whether it succeeded, and
/// its output.
fn outcome(tool: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("timeout")
        .args(["-k", "5", "60", tool])
        .args(args)
        .output()
        .expect("timeout starts");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The target names SendTargets gives `initiator` at `host`'s portal.
fn discovered(cluster: &Cluster, host: &str, initiator: &str) -> Vec<String> {
    let portal = format!(
        "iscsi://{}:{}",
        cluster.host_ip(host),
        cluster.config.iscsi_port
    );
    let text = run("iscsi-ls", &["-i", initiator, &portal]);
    text.lines()
        .filter_map(|l| l.strip_prefix("Target:"))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Waits (up to 15 s: hosts apply directory changes on their next look)
/// until `done` holds.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A raw image of `size` bytes whose every 4-byte word depends on `seed`.
fn pattern(dir: &Path, seed: u32, size: u64) -> String {
    let path = dir.join(format!("pattern-{seed:x}.raw"));
    let data: Vec<u8> = (0..(size as u32) / 4)
        .flat_map(|i| (i ^ seed).wrapping_mul(2_654_435_761).to_le_bytes())
        .collect();
    std::fs::write(&path, data).unwrap();
    path.display().to_string()
}

/// A volume is written with pattern A, snapshotted, then written with B.
/// The snapshot's target (`<volume's target>:<escaped name>`) is found by
/// discovery on every host, reads A while the volume reads B, reports
/// write protect and refuses writes with DATA PROTECT / WRITE PROTECTED
/// (libiscsi's read-only suite, EXTENDED COPY into it, qemu-img), admits
/// exactly whom its volume admits, and is gone once the snapshot is
/// deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_is_a_read_only_target_that_admits_whom_its_volume_admits() {
    for tool in [
        "qemu-img",
        "iscsi-ls",
        "iscsi-inq",
        "iscsi-readcapacity16",
        "iscsi-test-cu",
    ] {
        if !have(tool) {
            return;
        }
    }
    const SIZE: u64 = 32 << 20;
    let cluster = Cluster::start(3600).await;
    let (owner, other) = owner_and_other(&cluster.create("vm", SIZE).await);
    let dir = tempfile::tempdir().unwrap();
    let a = pattern(dir.path(), 0xa, SIZE);
    let b = pattern(dir.path(), 0xb, SIZE);
    let volume = |host: &str| cluster.iscsi_url(host, "vm");
    wait_for_target(&volume(&other)).await;
    run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            &a,
            &volume(&other),
        ],
    );

    // Upper case letters and '_' are escaped: `:` and the letter in lower
    // case, `:-`.
    let taken = cluster
        .control
        .create_snapshot(
            "vm",
            CreateSnapshot {
                name: "Before_B".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let iqn = "iqn.2026-11.io.tessera:vm::before:-:b";
    assert_eq!(taken.iscsi_target, iqn);
    run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            &b,
            &volume(&owner),
        ],
    );
    let snapshot = |host: &str| {
        format!(
            "iscsi://{}:{}/{iqn}/0",
            cluster.host_ip(host),
            cluster.config.iscsi_port
        )
    };
    wait_for_target(&snapshot(&other)).await;

    // (1) Discovery on any host lists the volume and its snapshot, each
    // with every host's portal; the snapshot presents itself as one.
    let anyone = "iqn.2026-11.test:backup";
    for host in [&owner, &other] {
        let names = discovered(&cluster, host, anyone);
        assert!(
            names.contains(&"iqn.2026-11.io.tessera:vm".to_string()) && names.contains(&iqn.into()),
            "{host}: {names:?}"
        );
    }
    let inquiry = run("iscsi-inq", &[&snapshot(&other)]);
    assert!(inquiry.contains("SNAPSHOT"), "{inquiry}");
    let capacity = run("iscsi-readcapacity16", &[&snapshot(&owner)]);
    assert!(
        capacity.contains(&format!("Total size:{SIZE}")),
        "{capacity}"
    );

    // (2) The snapshot reads A through the owner's host and another; the
    // volume reads B.
    for host in [&owner, &other] {
        let same = run(
            "qemu-img",
            &["compare", "-f", "raw", "-F", "raw", &a, &snapshot(host)],
        );
        assert!(same.contains("Images are identical"), "{host}: {same}");
    }
    let same = run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", &b, &volume(&other)],
    );
    assert!(same.contains("Images are identical"), "{same}");

    // (3) Writes are refused. libiscsi's read-only suite runs only on a
    // unit whose MODE SENSE reports write protect (a skip would count
    // against it) and checks WRITE(10/12/16), WRITE SAME(10/16) with and
    // without UNMAP, and UNMAP for DATA PROTECT.
    let log = conformance(
        "SCSI.ReadOnly",
        &[snapshot(&other)],
        &dir.path().join("readonly.log"),
    )
    .await;
    assert_eq!(suite_counts(&log, "ReadOnly"), (1, 0, 0), "{log}");
    // EXTENDED COPY into the snapshot, sent to it: DATA PROTECT, WRITE
    // PROTECTED (0x27/0x00), exactly.
    if let Some(xcopy) = libiscsi_client(dir.path(), "xcopy_range") {
        let (ok, text) = outcome(
            xcopy.to_str().unwrap(),
            &[&snapshot(&owner), "0", &volume(&owner), "0", "8"],
        );
        assert!(!ok, "EXTENDED COPY into a snapshot succeeded: {text}");
        assert!(
            text.contains("DATA PROTECTION(7)") && text.contains("WRITE_PROTECTED(0x2700)"),
            "{text}"
        );
    }
    // qemu-img sees write protect and does not open it for writing.
    let (ok, text) = outcome(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            &b,
            &snapshot(&other),
        ],
    );
    assert!(!ok, "qemu-img wrote into a snapshot: {text}");
    assert!(text.contains("write protected"), "{text}");
    let same = run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", &a, &snapshot(&owner)],
    );
    assert!(same.contains("Images are identical"), "{same}");

    // (4) The volume's access settings hold for its snapshot.
    let allowed = "iqn.2026-11.test:allowed";
    let stranger = "iqn.2026-11.test:stranger";
    cluster
        .control
        .set_iscsi_access(
            "vm",
            IscsiAccess {
                allowed_initiators: vec![allowed.into()],
                initiator_chap: Some(ChapCredential {
                    user: "backup".into(),
                    secret: "backup-secret-12".into(),
                }),
                target_chap: None,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    for host in [&owner, &other] {
        let with = |auth: &str| snapshot(host).replacen("iscsi://", &format!("iscsi://{auth}@"), 1);
        eventually(&format!("{host} hides the snapshot from strangers"), || {
            !discovered(&cluster, host, stranger).contains(&iqn.into())
        })
        .await;
        assert!(
            discovered(&cluster, host, stranger).is_empty(),
            "{host} shows a stranger targets"
        );
        assert!(discovered(&cluster, host, allowed).contains(&iqn.into()));
        let right = with("backup%backup-secret-12");
        assert!(
            !inquiry_succeeds(allowed, &snapshot(host), &[]),
            "{host}: the snapshot admits without CHAP"
        );
        assert!(
            !inquiry_succeeds(allowed, &with("backup%wrong-secret-00"), &[]),
            "{host}: the snapshot admits a wrong secret"
        );
        assert!(
            !inquiry_succeeds(stranger, &right, &[]),
            "{host}: the snapshot admits an initiator not on the list"
        );
        assert!(
            inquiry_succeeds(allowed, &right, &[]),
            "{host}: the snapshot refuses its volume's initiator"
        );
    }

    // (5) Deleted, the snapshot leaves discovery and a login to it is
    // refused: the target is not found. The volume stays.
    cluster
        .control
        .delete_snapshot("vm", "Before_B")
        .await
        .unwrap();
    let right = snapshot(&other).replacen("iscsi://", "iscsi://backup%backup-secret-12@", 1);
    for host in [&owner, &other] {
        eventually(&format!("{host} forgets the snapshot"), || {
            !discovered(&cluster, host, allowed).contains(&iqn.into())
        })
        .await;
        assert!(
            discovered(&cluster, host, allowed).contains(&"iqn.2026-11.io.tessera:vm".into()),
            "{host} lost the volume"
        );
    }
    let (ok, text) = outcome("iscsi-inq", &["-i", allowed, &right]);
    assert!(!ok, "a login to a deleted snapshot succeeded: {text}");
    assert!(text.to_ascii_lowercase().contains("not found"), "{text}");
    cluster.stop().await;
}

/// `nbdinfo ARGS`, bounded in time: whether it succeeded, and what it said.
fn nbdinfo(args: &[&str]) -> (bool, String) {
    let out = Command::new("timeout")
        .args(["-k", "5", "30", "nbdinfo"])
        .args(args)
        .output()
        .expect("nbdinfo starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// One access record decides who uses a volume on both frontends: a record
/// that names initiators keeps every NBD client out, loopback included, and
/// hides the export from their list; naming an NBD client admits it by the
/// certificate the cluster CA gave it, over TLS only; a record that names
/// only NBD clients keeps every initiator out. Snapshots follow their volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_access_record_decides_who_uses_a_volume_over_nbd_and_iscsi() {
    if !have("iscsi-inq") || !have("nbdinfo") {
        return;
    }
    let cluster = Cluster::start(3600).await;
    cluster.create("guarded", 16 << 20).await;
    cluster.snapshot("guarded", "s1").await;
    let url = cluster.iscsi_url("host-2", "guarded");
    wait_for_target(&url).await;
    let plain = cluster.nbd_uri("host-2", "guarded");
    let list = plain.trim_end_matches("guarded").to_string();
    let certificates = cluster.config.data_dir.join("tls").join("client");
    let tls = |export: &str| {
        format!(
            "{}?tls-certificates={}",
            cluster
                .nbd_uri("host-2", export)
                .replacen("nbd://", "nbds://", 1),
            certificates.display()
        )
    };
    let size = (16u64 << 20).to_string();
    let opens = |uri: &str| {
        let (ok, text) = nbdinfo(&["--size", uri]);
        ok && text.trim() == size
    };
    let listed = |uri: &str| {
        nbdinfo(&["--list", "--json", uri])
            .1
            .contains("\"guarded\"")
    };
    // Open: plain clients from this machine and clients with a cluster
    // certificate.
    assert!(opens(&plain), "plain loopback client refused");
    assert!(opens(&tls("guarded")), "TLS client refused");
    assert!(listed(&list));

    let allowed = "iqn.2026-11.test:allowed";
    let set = |access: IscsiAccess| cluster.control.set_iscsi_access("guarded", access);
    set(IscsiAccess {
        allowed_initiators: vec![allowed.into()],
        ..Default::default()
    })
    .await
    .unwrap();
    eventually("the plain client is refused", || !opens(&plain)).await;
    let (_, said) = nbdinfo(&["--size", &plain]);
    assert!(said.contains("policy"), "{said}");
    assert!(
        !opens(&tls("guarded")),
        "a certificate the record does not name got in"
    );
    assert!(!listed(&list), "the export is still listed");
    assert!(
        !opens(&plain.replacen("guarded", "guarded@s1", 1)),
        "the snapshot got in"
    );
    assert!(inquiry_succeeds(allowed, &url, &[]));

    // Naming the local client's certificate admits it over TLS, and only
    // over TLS.
    let view = set(IscsiAccess {
        allowed_initiators: vec![allowed.into()],
        nbd_clients: vec![tessera_node::up::LOCAL_CLIENT_NAME.into()],
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(view.nbd_clients, [tessera_node::up::LOCAL_CLIENT_NAME]);
    eventually("the named client gets in", || opens(&tls("guarded"))).await;
    assert!(
        opens(&tls("guarded@s1")),
        "the snapshot does not admit the named client"
    );
    assert!(!opens(&plain));
    assert!(!inquiry_succeeds("iqn.2026-11.test:stranger", &url, &[]));

    // A record naming only NBD clients keeps every initiator out.
    set(IscsiAccess {
        nbd_clients: vec![tessera_node::up::LOCAL_CLIENT_NAME.into()],
        ..Default::default()
    })
    .await
    .unwrap();
    eventually("the initiator is kept out", || {
        !inquiry_succeeds(allowed, &url, &[])
    })
    .await;
    assert!(opens(&tls("guarded")));

    // Bad names are refused and change nothing.
    let refused = set(IscsiAccess {
        nbd_clients: vec![String::new()],
        ..Default::default()
    })
    .await;
    assert!(
        matches!(refused, Err(ControlError::Invalid(_))),
        "{refused:?}"
    );
    assert!(opens(&tls("guarded")));

    // Opened again: everyone on this machine is back.
    set(IscsiAccess::default()).await.unwrap();
    eventually("the plain client is back", || opens(&plain)).await;
    assert!(inquiry_succeeds(allowed, &url, &[]));
    cluster.stop().await;
}
