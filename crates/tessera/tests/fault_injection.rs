//! `tessera fault fail-device` on the real `tessera up --fault-injection`:
//! the cache device of the disk group holding a volume's second copy fails
//! under fio; the copy is rebuilt on another host at once (the repair delay
//! is an hour), fio's checked reads of everything written before and during
//! the failure pass afterwards, and `tessera object verify` finds the copies
//! identical. Skips without fio.

mod common;

use common::have;
use common::up::{copy_off_owner, expect_success, fio, fio_report, tessera, wait_for, UpCluster};
use serde_json::Value;
use std::time::{Duration, Instant};

/// A running `tessera up --fault-injection` with volume `vm` (64 MiB)
/// healthy: the cluster, the volume's view, and its NBD URI through the
/// owner.
fn up_with_volume(third_octet: u8) -> (UpCluster, Value, String) {
    let cluster = UpCluster::start(third_octet, &["--fault-injection"]);
    let (view, uri) = cluster.create_volume("vm", "64M", None);
    (cluster, view, uri)
}

#[test]
fn a_failed_cache_device_has_its_copies_rebuilt_at_once_and_loses_no_data() {
    if !have("fio") {
        return;
    }
    let (up, view, uri) = up_with_volume(77);
    let api = up.api.clone();
    let owner = view["owner"].as_str().unwrap().to_string();
    let lost = copy_off_owner(&view);
    let lost_host = lost["host"].as_str().unwrap();

    // Written and checked before the failure, then random writes with
    // checked reads while the device fails under them.
    // The second half carries a mark and its offset in every block, so the
    // read-back after the rebuild compares every byte.
    let second_half = [
        "--rw=write",
        "--offset=32M",
        "--verify=pattern",
        "--verify_pattern=0x5a%o",
    ];
    let before = fio(&uri, &second_half)
        .arg("--do_verify=0")
        .spawn()
        .unwrap();
    expect_success(before, "writing the second half");
    let during = fio(
        &uri,
        &[
            "--rw=randrw",
            "--verify=crc32c",
            "--time_based",
            "--runtime=10",
            "--verify_backlog=256",
            "--verify_state_save=0",
        ],
    )
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let (ok, text) = tessera(&api, &["fault", "fail-device", lost_host, "--device", "0"]);
    assert!(ok, "{text}");
    assert_eq!(
        text,
        format!("cache device of {lost_host}'s disk group dg0 fails from now on\n")
    );
    let rebuilt = wait_for(&api, "vm", "the lost copy rebuilt elsewhere", |v| {
        v["state"] == "healthy"
            && v["components"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["id"] != lost["id"])
    });
    expect_success(during, "during the failure");
    assert!(
        rebuilt["components"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["host"] != lost_host),
        "nothing placed on the failed disk group: {rebuilt:#}"
    );
    let after = fio(&uri, &second_half)
        .arg("--verify_only")
        .spawn()
        .unwrap();
    expect_success(after, "reading back the second half");
    let (ok, text) = tessera(&api, &["object", "verify", "vm"]);
    assert!(ok, "{text}");
    // A device that does not exist is refused and changes nothing.
    let (ok, text) = tessera(&api, &["fault", "fail-device", &owner, "--device", "9"]);
    assert!(!ok && text.contains("no device 9"), "{text}");
    drop(up);
}

/// `tessera fault corrupt-block` flips a bit in a stored block of one copy;
/// `tessera scrub start` on that copy's host finds it and the owner
/// rewrites it from the other copy, with no client reading the volume;
/// `tessera scrub list` shows it and the copies compare identical.
#[test]
fn a_scrub_asked_for_finds_a_flipped_bit_and_the_block_is_rewritten() {
    if !have("fio") {
        return;
    }
    let (up, view, uri) = up_with_volume(78);
    let api = up.api.clone();
    let other = copy_off_owner(&view)["host"].as_str().unwrap().to_string();
    let write = fio(&uri, &["--rw=write", "--size=8M", "--do_verify=0"])
        .spawn()
        .unwrap();
    expect_success(write, "writing 8 MiB");
    let corrupt = |block: &str| {
        tessera(
            &api,
            &[
                "fault",
                "corrupt-block",
                &other,
                "--volume",
                "vm",
                "--block",
                block,
            ],
        )
    };
    let (ok, text) = corrupt("100");
    assert!(ok, "{text}");
    let (ok, text) = tessera(&api, &["scrub", "start", &other]);
    assert!(ok && text.contains("started"), "{text}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let row = loop {
        let (ok, text) = tessera(&api, &["--json", "scrub", "list"]);
        assert!(ok, "{text}");
        let rows: Value = serde_json::from_str(&text).unwrap();
        let row = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["host"] == other.as_str() && r["passes"].as_u64() >= Some(1))
            .cloned();
        if let Some(row) = row {
            break row;
        }
        assert!(Instant::now() < deadline, "no scrub pass ended: {rows:#}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(row["bad_blocks"], 1, "{row:#}");
    assert_eq!(row["repaired_blocks"], 1, "{row:#}");
    assert_eq!(row["unrepaired_blocks"], 0, "{row:#}");
    let (ok, text) = tessera(&api, &["scrub", "list"]);
    assert!(
        ok && text.contains("REPAIRED") && text.contains(&other),
        "{text}"
    );
    let (ok, text) = tessera(&api, &["object", "verify", "vm"]);
    assert!(ok, "{text}");
    // A block never written is refused by name and changes nothing.
    let (ok, text) = corrupt("9000");
    assert!(!ok && text.contains("no data stored"), "{text}");
    drop(up);
}

/// Mean latency in milliseconds of 4 KiB random writes, one at a time, for
/// two seconds on NBD `uri`.
fn write_latency_ms(uri: &str) -> f64 {
    let report = fio_report(
        uri,
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=1",
            "--size=32M",
            "--time_based",
            "--runtime=2",
        ],
    );
    report["jobs"][0]["write"]["clat_ns"]["mean"]
        .as_f64()
        .unwrap()
        / 1e6
}

/// `tessera fault delay`, `partition` and `heal` on the link between a
/// volume's owner and the host of its other copy: a delay shows in every
/// acknowledged write (each waits for both copies) and goes with `heal`;
/// under a partition writes go on with one copy, the cut-off copy is
/// marked absent, and once healed it is resynced and fio reads back every
/// byte. Bad faults are refused by name.
#[test]
fn network_faults_slow_and_cut_a_copy_and_healing_brings_it_back() {
    if !have("fio") {
        return;
    }
    let (up, view, uri) = up_with_volume(80);
    let api = up.api.clone();
    let owner = view["owner"].as_str().unwrap().to_string();
    let copy = copy_off_owner(&view);
    let other = copy["host"].as_str().unwrap();

    let (ok, text) = tessera(
        &api,
        &["fault", "delay", &owner, "--peer", other, "--ms", "100"],
    );
    assert!(ok, "{text}");
    assert_eq!(
        text,
        format!("frames {owner} sends to {other} wait 100 ms from now on\n")
    );
    let slowed = write_latency_ms(&uri);
    assert!(slowed >= 100.0, "{slowed:.1} ms with a 100 ms delay");
    let (ok, text) = tessera(&api, &["fault", "heal", &owner]);
    assert!(ok, "{text}");
    let healed = write_latency_ms(&uri);
    assert!(healed < 50.0, "{healed:.1} ms after healing");

    let (ok, text) = tessera(&api, &["fault", "partition", &owner, "--peer", other]);
    assert!(ok, "{text}");
    assert_eq!(
        text,
        format!("{owner} and {other} no longer reach each other\n")
    );
    let pattern = ["--rw=write", "--verify=pattern", "--verify_pattern=0x3c%o"];
    let written = fio(&uri, &pattern).arg("--do_verify=0").spawn().unwrap();
    expect_success(written, "writing under the partition");
    let cut = wait_for(&api, "vm", "the cut-off copy absent", |v| {
        v["components"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["id"] == copy["id"] && c["state"] != "active")
    });
    assert_eq!(cut["state"], "degraded", "{cut:#}");
    let (ok, text) = tessera(&api, &["fault", "heal", &owner]);
    assert!(ok, "{text}");
    wait_for(&api, "vm", "the copy resynced", |v| v["state"] == "healthy");
    let read = fio(&uri, &pattern).arg("--verify_only").spawn().unwrap();
    expect_success(read, "reading back after healing");
    let (ok, text) = tessera(&api, &["object", "verify", "vm"]);
    assert!(ok, "{text}");

    let (ok, text) = tessera(
        &api,
        &["fault", "delay", &owner, "--peer", "host-9", "--ms", "1"],
    );
    assert!(!ok && text.contains("host-9 is not another host"), "{text}");
    let (ok, text) = tessera(&api, &["fault", "delay", &owner, "--ms", "70000"]);
    assert!(!ok && text.contains("at most 60000 ms"), "{text}");
    let (ok, text) = tessera(&api, &["fault", "drop", &owner, "--percent", "101"]);
    assert!(!ok && text.contains("0 to 100 percent"), "{text}");
    drop(up);
}
