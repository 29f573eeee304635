//! A database whose log is on another volume, snapshotted as one point in
//! time: PostgreSQL keeps its data on one volume of the real `tessera up`
//! and its WAL on a second (`initdb --waldir`), both ext4 over nbdfuse and
//! a loop device. While pgbench runs, `tessera snapshot create pg-data NAME
//! --group pg-wal` takes both volumes' snapshots at once, without stopping
//! anything. Linked clones of the two snapshots then mount, PostgreSQL
//! starts on them (crash recovery: the data files must be no newer than the
//! WAL that describes them), `pg_amcheck` finds nothing wrong and every
//! account row is there. A group naming a missing volume, or the volume
//! twice, is refused and takes no snapshot.
//!
//! Needs what `database_snapshots.rs` needs; skips without it unless
//! TESSERA_REQUIRE_TOOLS=1.

mod common;

use common::mount::{run_ok, Attached};
use common::postgres::{as_postgres, database_test_setup, postgres_dir, recover_and_check, Server};
use common::up::{tessera, UpCluster};
use serde_json::Value;
use std::process::{Command, Stdio};

/// pgbench's scale: 100,000 account rows each.
const SCALE: u64 = 2;

#[test]
fn postgres_with_its_wal_on_another_volume_recovers_from_a_group_snapshot() {
    let Some((bin, work)) = database_test_setup() else {
        return;
    };
    let cluster = UpCluster::start(69, &[]);
    let (view, data_uri) = cluster.create_volume("pg-data", "384M", None);
    let (_, wal_uri) = cluster.create_volume("pg-wal", "256M", None);
    let owner = view["owner"].as_str().unwrap().to_string();

    let mut data_volume = Attached::new(&data_uri, &work.path().join("data"), false);
    let mut wal_volume = Attached::new(&wal_uri, &work.path().join("wal"), false);
    run_ok(300, "mkfs.ext4", &["-q", "-F", &data_volume.device]);
    run_ok(300, "mkfs.ext4", &["-q", "-F", &wal_volume.device]);
    let data_mnt = work.path().join("data-mnt");
    let wal_mnt = work.path().join("wal-mnt");
    data_volume.mount(&data_mnt, "rw");
    wal_volume.mount(&wal_mnt, "rw");
    let pgdata = data_mnt.join("pgdata");
    let pgwal = wal_mnt.join("pgwal");
    postgres_dir(&pgdata);
    postgres_dir(&pgwal);
    let socket = work.path().join("sock");
    postgres_dir(&socket);
    let logs = work.path().join("logs");
    postgres_dir(&logs);
    as_postgres(
        &bin.join("initdb"),
        &[
            "-D",
            &pgdata.to_string_lossy(),
            "--waldir",
            &pgwal.to_string_lossy(),
            "-A",
            "trust",
            "-U",
            "postgres",
        ],
    );
    let server = Server::start(
        &bin,
        &pgdata,
        &socket,
        common::free_port(),
        &logs.join("pg.log"),
    );
    let pgbench = bin.join("pgbench");
    let scale = SCALE.to_string();
    let mut init = server.connect().to_vec();
    init.extend(["-i", "-q", "-s", &scale, "postgres"]);
    as_postgres(&pgbench, &init);

    // Bad groups change nothing.
    for (args, says) in [
        (
            &["snapshot", "create", "pg-data", "bad", "--group", "nope"][..],
            "no volume named",
        ),
        (
            &["snapshot", "create", "pg-data", "bad", "--group", "pg-data"][..],
            "named twice",
        ),
    ] {
        let (ok, text) = tessera(&cluster.api, args);
        assert!(!ok && text.contains(says), "{args:?}: {text}");
    }
    for volume in ["pg-data", "pg-wal"] {
        let (ok, text) = tessera(&cluster.api, &["snapshot", "list", volume]);
        assert!(ok && text.contains("no snapshots"), "{volume}: {text}");
    }

    let mut load = server.connect().to_vec();
    load.extend(["-T", "10", "-c", "4", "-j", "2", "-n", "postgres"]);
    let bench = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(&pgbench)
        .args(&load)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pgbench starts");
    for n in 1..=2 {
        std::thread::sleep(std::time::Duration::from_secs(3));
        let name = format!("g{n}");
        let (ok, text) = tessera(
            &cluster.api,
            &["snapshot", "create", "pg-data", &name, "--group", "pg-wal"],
        );
        assert!(ok, "group snapshot {name} under pgbench: {text}");
        assert!(
            text.contains("at the same point in time as its snapshots of pg-wal"),
            "{text}"
        );
    }
    let out = bench.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "pgbench failed while group snapshots were taken: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Each volume's snapshot names the other of its group.
    let (ok, text) = tessera(&cluster.api, &["--json", "snapshot", "list", "pg-wal"]);
    assert!(ok, "{text}");
    let listed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed:#}");
    assert_eq!(listed[1]["name"], "g2");
    assert_eq!(listed[1]["group"], serde_json::json!(["pg-data"]));
    let (ok, text) = tessera(&cluster.api, &["snapshot", "list", "pg-data"]);
    assert!(
        ok && text.contains("GROUP") && text.contains("pg-wal"),
        "{text}"
    );

    // Clones of the last group snapshot start as after a crash of both.
    for (clone, from) in [("data-clone", "pg-data@g2"), ("wal-clone", "pg-wal@g2")] {
        let (ok, text) = tessera(&cluster.api, &["volume", "clone", clone, "--from", from]);
        assert!(ok, "{text}");
    }
    let other = if owner == "host-1" {
        "host-2"
    } else {
        "host-1"
    };
    let mut data_clone = Attached::new(
        &cluster.nbd_uri(other, "data-clone"),
        &work.path().join("data-clone"),
        false,
    );
    let mut wal_clone = Attached::new(
        &cluster.nbd_uri(other, "wal-clone"),
        &work.path().join("wal-clone"),
        false,
    );
    let data_clone_mnt = work.path().join("data-clone-mnt");
    let wal_clone_mnt = work.path().join("wal-clone-mnt");
    data_clone.mount(&data_clone_mnt, "rw");
    wal_clone.mount(&wal_clone_mnt, "rw");
    let clone_pgdata = data_clone_mnt.join("pgdata");
    // pg_wal is a link to the original's WAL directory: it is pointed at
    // the clone's, as when a database is moved with its log.
    let link = clone_pgdata.join("pg_wal");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(wal_clone_mnt.join("pgwal"), &link).unwrap();
    run_ok(
        30,
        "chown",
        &["-h", "postgres:postgres", &link.to_string_lossy()],
    );
    let recovered = recover_and_check(
        &bin,
        &clone_pgdata,
        &work.path().join("clone-sock"),
        &logs.join("clone.log"),
        SCALE * 100_000,
    );
    drop(recovered);
    drop(server);
    data_clone.unmount();
    wal_clone.unmount();
    data_volume.unmount();
    wal_volume.unmount();
}
