//! Per-volume QoS on the real `tessera up`, seen by fio: a policy's IOPS
//! limit holds a volume to it, `volume list` shows it, and lifting the
//! limit on the policy frees the volume at once, while it is in use.
//! Skips without fio.

mod common;

use common::have;
use common::up::{fio_report, tessera, UpCluster};
use serde_json::Value;

/// Random 4 KiB writes, 16 deep, for `seconds` on NBD `uri`; answers the
/// IOPS fio measured.
fn write_iops(uri: &str, seconds: u32) -> f64 {
    let report = fio_report(
        uri,
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            "--size=32M",
            "--time_based",
            &format!("--runtime={seconds}"),
        ],
    );
    report["jobs"][0]["write"]["iops"].as_f64().unwrap()
}

#[test]
fn an_iops_limit_holds_a_volume_to_it_and_lifting_it_frees_the_volume_at_once() {
    if !have("fio") {
        return;
    }
    let up = UpCluster::start(79, &[]);
    let api = up.api.clone();
    let (ok, text) = tessera(
        &api,
        &[
            "policy",
            "create",
            "capped",
            "--ftt",
            "1",
            "--iops-limit",
            "300",
        ],
    );
    assert!(ok, "{text}");
    // A minimum above the limit is refused by name and changes nothing.
    let (ok, text) = tessera(&api, &["policy", "set", "capped", "--iops-minimum", "400"]);
    assert!(
        !ok && text.contains("the IOPS minimum (400) cannot be above the IOPS limit (300)"),
        "{text}"
    );
    let (_view, uri) = up.create_volume("db", "64M", Some("capped"));
    let (ok, text) = tessera(&api, &["volume", "list"]);
    assert!(ok && text.contains("max 300 IOPS"), "{text}");

    // Noise on a shared machine can only slow fio down: the upper bound is
    // the limit's; the lower one only says the volume was not stalled.
    let capped = write_iops(&uri, 5);
    assert!(
        (150.0..=315.0).contains(&capped),
        "{capped:.0} IOPS under a 300 IOPS limit"
    );

    // Lifted on the policy while the volume is in use: its owner hears it.
    let (ok, text) = tessera(&api, &["policy", "set", "capped", "--iops-limit", "0"]);
    assert!(ok, "{text}");
    let (ok, text) = tessera(&api, &["--json", "volume", "show", "db"]);
    assert!(ok, "{text}");
    let view: Value = serde_json::from_str(&text).unwrap();
    assert!(view.get("qos").is_none(), "no QoS left: {view:#}");
    std::thread::sleep(std::time::Duration::from_secs(1));
    let free = write_iops(&uri, 5);
    eprintln!("300 IOPS limit: {capped:.0} IOPS; lifted: {free:.0} IOPS");
    assert!(
        free > 2.0 * capped,
        "{free:.0} IOPS after lifting the limit, {capped:.0} under it"
    );
    drop(up);
}
