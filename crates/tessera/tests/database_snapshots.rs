//! A database on a volume, snapshotted while it works: PostgreSQL on ext4
//! on a volume of the real `tessera up` (nbdfuse and a loop device) runs
//! pgbench while snapshots are taken with the CLI every few seconds, without
//! stopping or freezing anything. A linked clone of the last snapshot then
//! mounts (ext4 replays its journal), PostgreSQL starts on it (crash
//! recovery from its WAL), `pg_amcheck` finds nothing wrong and every
//! account row is there. Throughput with and without snapshots is compared
//! by a benchmark, not here.
//!
//! Needs what `filesystem_snapshots.rs` needs, PostgreSQL's server binaries
//! (`/usr/lib/postgresql/*/bin`, Debian's `postgresql`) and the `postgres`
//! user; without them it skips with a message, unless
//! TESSERA_REQUIRE_TOOLS=1, when it fails.

mod common;

use common::mount::{run_ok, Attached};
use common::postgres::{as_postgres, database_test_setup, postgres_dir, recover_and_check, Server};
use common::up::{tessera, UpCluster};
use std::process::{Command, Stdio};

/// pgbench's scale: 100,000 account rows each.
const SCALE: u64 = 4;

#[test]
fn postgres_under_pgbench_snapshotted_and_cloned_recovers_cleanly() {
    let Some((bin, work)) = database_test_setup() else {
        return;
    };
    let cluster = UpCluster::start(63, &[]);
    let (view, uri) = cluster.create_volume("pg", "512M", None);
    let owner = view["owner"].as_str().unwrap().to_string();

    let mut volume = Attached::new(&uri, &work.path().join("vol"), false);
    run_ok(300, "mkfs.ext4", &["-q", "-F", &volume.device]);
    let mnt = work.path().join("vol-mnt");
    volume.mount(&mnt, "rw");
    let data = mnt.join("pgdata");
    postgres_dir(&data);
    let socket = work.path().join("sock");
    postgres_dir(&socket);
    let logs = work.path().join("logs");
    postgres_dir(&logs);
    // initdb syncs what it writes (no -N): a snapshot, like a crash,
    // holds only what was made durable.
    as_postgres(
        &bin.join("initdb"),
        &[
            "-D",
            &data.to_string_lossy(),
            "-A",
            "trust",
            "-U",
            "postgres",
        ],
    );
    let server = Server::start(
        &bin,
        &data,
        &socket,
        common::free_port(),
        &logs.join("pg.log"),
    );
    let pgbench = bin.join("pgbench");
    let scale = SCALE.to_string();
    let mut init = server.connect().to_vec();
    init.extend(["-i", "-q", "-s", &scale, "postgres"]);
    as_postgres(&pgbench, &init);

    // pgbench runs; snapshots are taken under it, nothing stops or waits.
    let mut load = server.connect().to_vec();
    load.extend(["-T", "12", "-c", "4", "-j", "2", "-n", "postgres"]);
    let bench = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(&pgbench)
        .args(&load)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pgbench starts");
    for n in 1..=3 {
        std::thread::sleep(std::time::Duration::from_secs(3));
        let (ok, text) = tessera(
            &cluster.api,
            &["snapshot", "create", "pg", &format!("s{n}")],
        );
        assert!(ok, "snapshot s{n} under pgbench: {text}");
    }
    let out = bench.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "pgbench failed while snapshots were taken: {report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains("tps = "), "{report}");
    eprintln!(
        "pgbench while snapshots were taken: {}",
        report
            .lines()
            .filter(|l| l.contains("tps"))
            .collect::<Vec<_>>()
            .join("; ")
    );

    // A clone of the last snapshot: ext4 replays its journal, PostgreSQL
    // recovers from its WAL, and everything checks out.
    let (ok, text) = tessera(
        &cluster.api,
        &["volume", "clone", "pg-clone", "--from", "pg@s3"],
    );
    assert!(ok, "{text}");
    let other = if owner == "host-1" {
        "host-2"
    } else {
        "host-1"
    };
    let mut clone = Attached::new(
        &cluster.nbd_uri(other, "pg-clone"),
        &work.path().join("clone"),
        false,
    );
    let clone_mnt = work.path().join("clone-mnt");
    clone.mount(&clone_mnt, "rw");
    // The clone's data directory holds the running original's lock file,
    // whose process is alive on this machine: it goes, as when a database
    // is started from a copy of a running one; the rest is as after a crash.
    let recovered = recover_and_check(
        &bin,
        &clone_mnt.join("pgdata"),
        &work.path().join("clone-sock"),
        &logs.join("clone.log"),
        SCALE * 100_000,
    );
    drop(recovered);
    drop(server);
    clone.unmount();
    volume.unmount();
}
