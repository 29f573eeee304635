//! `tessera host evacuate` on the real `tessera up` (four hosts): a host
//! holding a copy of a volume is emptied while fio writes to it, each
//! component copied elsewhere before the old one goes; fio's checked reads
//! of what was written before and during the move pass, the copies compare
//! identical, and the host shows as evacuated until the evacuation ends.
//! A snapshot taken before moves with its copy: it still reads as the
//! volume was, none of its components stays behind, and its copies compare
//! identical. Evacuating a second host, which would leave nowhere for the
//! copies, is refused and changes nothing. Skips without fio.

mod common;

use common::have;
use common::up::{copy_off_owner, expect_success, fio, tessera, wait_for, UpCluster};
use serde_json::Value;

fn disk_group_health(api: &str, host: &str) -> String {
    let (ok, text) = tessera(api, &["--json", "host", "show", host]);
    assert!(ok, "{text}");
    let view: Value = serde_json::from_str(&text).unwrap();
    view["disk_groups"][0]["health"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn an_evacuated_host_is_emptied_without_losing_data_and_a_second_is_refused() {
    if !have("fio") {
        return;
    }
    let up = UpCluster::start(81, &[]);
    let api = up.api.clone();
    let (view, uri) = up.create_volume("vm", "64M", None);
    let owner = view["owner"].as_str().unwrap().to_string();
    let leaving = copy_off_owner(&view)["host"].as_str().unwrap().to_string();
    let first_half = ["--rw=write", "--verify=pattern", "--verify_pattern=0x71%o"];
    let written = fio(&uri, &first_half).arg("--do_verify=0").spawn().unwrap();
    expect_success(written, "writing the first half");
    let (ok, text) = tessera(&api, &["snapshot", "create", "vm", "before"]);
    assert!(ok, "{text}");

    let during = fio(
        &uri,
        &[
            "--rw=randrw",
            "--offset=32M",
            "--verify=crc32c",
            "--time_based",
            "--runtime=6",
            "--verify_backlog=256",
            "--verify_state_save=0",
        ],
    )
    .spawn()
    .unwrap();
    let (ok, text) = tessera(&api, &["host", "evacuate", &leaving]);
    assert!(ok, "{text}");
    assert!(
        text.starts_with(&format!(
            "evacuating {leaving} (dg0): 1 component(s), 64.0 MiB"
        )),
        "{text}"
    );
    let moved = wait_for(&api, "vm", "nothing left on the evacuated host", |v| {
        v["state"] == "healthy"
            && v["components"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["host"] != leaving.as_str())
    });
    expect_success(during, "during the evacuation");
    let data_copies = moved["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["role"] == "data")
        .count();
    assert_eq!(data_copies, 2, "two copies again: {moved:#}");
    let read = fio(&uri, &first_half).arg("--verify_only").spawn().unwrap();
    expect_success(read, "reading back the first half");
    let (ok, text) = tessera(&api, &["object", "verify", "vm"]);
    assert!(ok && text.contains("before"), "{text}");
    // The snapshot moved with the copy, and still holds the first half.
    let (ok, text) = tessera(&api, &["--json", "snapshot", "list", "vm"]);
    assert!(ok, "{text}");
    let snapshots: Value = serde_json::from_str(&text).unwrap();
    let components = snapshots[0]["components"].as_array().unwrap();
    assert_eq!(components.len(), 2, "{snapshots:#}");
    assert!(
        components.iter().all(|c| c["host"] != leaving.as_str()),
        "a snapshot component stayed on the evacuated host: {snapshots:#}"
    );
    let snapshot_uri = format!("{uri}@before");
    let read = fio(&snapshot_uri, &first_half)
        .arg("--verify_only")
        .spawn()
        .unwrap();
    expect_success(read, "reading the first half from the snapshot");
    let (ok, text) = tessera(&api, &["resync", "list"]);
    assert!(ok && text.contains("evacuate"), "{text}");
    assert_eq!(disk_group_health(&api, &leaving), "evacuated");

    // Two hosts left cannot hold two copies and a witness.
    let (ok, text) = tessera(&api, &["host", "evacuate", &owner]);
    assert!(
        !ok && text.contains(&format!("host {owner} cannot be evacuated")),
        "{text}"
    );
    assert_eq!(disk_group_health(&api, &owner), "healthy");

    let (ok, text) = tessera(&api, &["host", "evacuate", &leaving, "--end"]);
    assert!(ok, "{text}");
    assert_eq!(disk_group_health(&api, &leaving), "healthy");
    let (ok, text) = tessera(&api, &["host", "evacuate", &leaving, "--end"]);
    assert!(!ok && text.contains("is not being evacuated"), "{text}");
    drop(up);
}
