//! Settings as a user changes them on the real `tessera up`: the VAAI
//! switches turned off cluster-wide reach every host's iSCSI units at once
//! (libiscsi's `iscsi-inq` reads the provisioning and block limits pages
//! through each host, and `iscsi-test-cu` finds UNMAP refused), one host
//! may keep its own value (`settings set --host`), a host keeps it across a
//! restart, and `settings reset` undoes both; values and names that cannot
//! be taken are refused with nothing changed. The liveness lease's time to
//! live changes on every host while fio writes and verifies, without a
//! volume changing owner. Skips without libiscsi's tools (fio).

mod common;

use common::have;
use common::up::{expect_success, fio, object, tessera, UpCluster};
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

/// `iscsi-inq` of VPD page `page` through `url`: its output, or why not.
fn try_vpd(url: &str, page: u8) -> Result<String, String> {
    let out = Command::new("timeout")
        .args(["-k", "5", "30", "iscsi-inq", "-e", "1", "-c"])
        .args([&page.to_string(), url])
        .output()
        .expect("run iscsi-inq");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// `iscsi-inq` of VPD page `page` through `url`, which must answer.
fn vpd(url: &str, page: u8) -> String {
    try_vpd(url, page).unwrap_or_else(|e| panic!("iscsi-inq {page:#x} {url}: {e}"))
}

/// Whether the unit behind `url` offers UNMAP, as its logical block
/// provisioning page says.
fn offers_unmap(url: &str) -> bool {
    let page = vpd(url, 0xB2);
    match (page.contains("lbpu:1"), page.contains("lbpu:0")) {
        (true, false) => true,
        (false, true) => false,
        _ => panic!("no LBPU bit in {page}"),
    }
}

/// Runs libiscsi's UNMAP suite through `url`: passed and skipped tests.
fn unmap_suite(url: &str) -> (u32, u32) {
    let out = Command::new("timeout")
        .args(["-k", "5", "300", "iscsi-test-cu", "--dataloss"])
        .args(["-i", "iqn.2026-11.io.tessera.test:settings"])
        .args(["-t", "SCSI.Unmap", url])
        .output()
        .expect("run iscsi-test-cu");
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!log.contains("FAILED"), "{log}");
    let tests = log
        .lines()
        .filter(|l| l.trim_start().starts_with("Test: "))
        .count() as u32;
    let skipped = log.lines().filter(|l| l.contains("[SKIPPED]")).count() as u32;
    assert!(tests > 0, "no test ran: {log}");
    (tests.saturating_sub(skipped), skipped)
}

/// The hosts the health check `SETTINGS_DIFFER` names, if it is raised.
fn settings_differ(api: &str) -> Option<Vec<String>> {
    let (ok, text) = tessera(api, &["--json", "health"]);
    assert!(ok, "{text}");
    let health: Value = serde_json::from_str(&text).unwrap();
    let check = health["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["code"] == "SETTINGS_DIFFER")?;
    assert_eq!(check["severity"], "info", "{check}");
    Some(
        check["affects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_str().unwrap().to_string())
            .collect(),
    )
}

/// `tessera --json settings get NAME [--host HOST]`.
fn setting(api: &str, name: &str, host: Option<&str>) -> Value {
    let mut args = vec!["--json", "settings", "get", name];
    if let Some(h) = host {
        args.extend(["--host", h]);
    }
    let (ok, text) = tessera(api, &args);
    assert!(ok, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// Waits until `offers_unmap` is `on` through each of `urls` (10 s).
fn wait_unmap(urls: &[&String], on: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for url in urls {
        while offers_unmap(url) != on {
            assert!(
                Instant::now() < deadline,
                "UNMAP still {} through {url}",
                if on { "off" } else { "on" }
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[test]
fn vaai_switches_apply_live_on_every_host_and_one_host_may_keep_its_own() {
    if !have("iscsi-inq") || !have("iscsi-test-cu") {
        return;
    }
    let up = UpCluster::start(101, &[]);
    up.create_volume("vm1", "64M", None);
    // Every host serves the volume's target under this name.
    let target = "iqn.2026-11.io.tessera:vm1";
    let (ok, text) = tessera(&up.api, &["--json", "host", "list"]);
    assert!(ok, "{text}");
    let hosts: Value = serde_json::from_str(&text).unwrap();
    let urls: Vec<(String, String)> = hosts
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["iscsi_addr"].as_str().is_some_and(|a| !a.is_empty()))
        .map(|h| {
            (
                h["id"].as_str().unwrap().to_string(),
                format!("iscsi://{}/{target}/0", h["iscsi_addr"].as_str().unwrap()),
            )
        })
        .collect();
    assert!(urls.len() >= 2, "{hosts:#}");
    let every: Vec<&String> = urls.iter().map(|(_, u)| u).collect();
    wait_unmap(&every, true);
    let (passed, _) = unmap_suite(every[0]);
    assert!(passed > 0, "UNMAP offered, its tests run");

    // Off for the cluster: every host's unit stops offering it.
    let (ok, text) = tessera(&up.api, &["settings", "set", "vaai_unmap", "off"]);
    assert!(ok, "{text}");
    assert!(text.contains("vaai_unmap"), "{text}");
    wait_unmap(&every, false);
    let limits = vpd(every[1], 0xB0);
    let (passed, skipped) = unmap_suite(every[1]);
    assert_eq!(passed, 0, "UNMAP refused, its tests skipped\n{limits}");
    assert!(skipped > 0);

    // One host keeps offering it.
    let (special, special_url) = &urls[0];
    let others: Vec<&String> = urls[1..].iter().map(|(_, u)| u).collect();
    let (ok, text) = tessera(
        &up.api,
        &["settings", "set", "vaai_unmap", "on", "--host", special],
    );
    assert!(ok, "{text}");
    assert!(text.contains(&format!("host {special}")), "{text}");
    wait_unmap(&[special_url], true);
    wait_unmap(&others, false);
    assert_eq!(setting(&up.api, "vaai_unmap", Some(special)), true);
    assert_eq!(setting(&up.api, "vaai_unmap", Some(&urls[1].0)), false);
    assert_eq!(setting(&up.api, "vaai_unmap", None), false);
    let (ok, text) = tessera(&up.api, &["settings", "list", "--host", special]);
    assert!(ok, "{text}");
    let row = text.lines().find(|l| l.starts_with("vaai_unmap")).unwrap();
    assert!(
        row.contains("on") && row.contains(&format!("host {special}")),
        "{text}"
    );
    let row = text.lines().find(|l| l.starts_with("vaai_ats")).unwrap();
    assert!(row.contains("cluster"), "{text}");
    // The cluster's list and health say which host differs, and in what.
    let (ok, text) = tessera(&up.api, &["settings", "list"]);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!("{special} has its own vaai_unmap")),
        "{text}"
    );
    assert_eq!(settings_differ(&up.api), Some(vec![special.clone()]));

    // Refused, with nothing changed: a setting that is the cluster's
    // alone, a value that is not one, a host there is not, a cache larger
    // than half a host's memory.
    let refusals: [(&[&str], &str); 5] = [
        (
            &[
                "settings",
                "set",
                "max_overcommit_ratio",
                "2",
                "--host",
                special,
            ],
            "same on every host",
        ),
        (&["settings", "set", "vaai_unmap", "maybe"], "on or off"),
        (
            &["settings", "set", "vaai_ats", "off", "--host", "host-9"],
            "no host named host-9",
        ),
        (
            &[
                "settings",
                "set",
                "read_cache_bytes",
                "100T",
                "--host",
                special,
            ],
            "at most half",
        ),
        (
            &["settings", "set", "vaai_nothing", "off"],
            "no setting named",
        ),
    ];
    for (args, says) in refusals {
        let (ok, text) = tessera(&up.api, args);
        assert!(!ok && text.contains(says), "{args:?}: {text}");
    }
    let (ok, text) = tessera(&up.api, &["--json", "settings", "list", "--host", special]);
    assert!(ok, "{text}");
    let view: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        view["own"],
        serde_json::json!({ "vaai_unmap": true }),
        "{view:#}"
    );

    // Its own value survives the host's restart.
    for verb in ["stop", "start"] {
        let (ok, text) = tessera(&up.api, &["host", verb, special]);
        assert!(ok, "{text}");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while try_vpd(special_url, 0xB2).is_err() {
        assert!(
            Instant::now() < deadline,
            "{special} does not serve iSCSI again"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    wait_unmap(&[special_url], true);

    // Reset: the host follows the cluster, then the cluster its default.
    let (ok, text) = tessera(
        &up.api,
        &["settings", "reset", "vaai_unmap", "--host", special],
    );
    assert!(ok, "{text}");
    wait_unmap(&[special_url], false);
    assert_eq!(settings_differ(&up.api), None);
    let (ok, text) = tessera(&up.api, &["settings", "list"]);
    assert!(ok && !text.contains("has its own"), "{text}");
    let (ok, text) = tessera(&up.api, &["settings", "reset", "vaai_unmap"]);
    assert!(ok, "{text}");
    wait_unmap(&every, true);
    assert_eq!(setting(&up.api, "vaai_unmap", None), true);
}

/// Each present host's lease time to live, as `host list` shows it.
fn leases(api: &str) -> Vec<(String, Option<u64>)> {
    let (ok, text) = tessera(api, &["--json", "host", "list"]);
    assert!(ok, "{text}");
    let hosts: Value = serde_json::from_str(&text).unwrap();
    hosts
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["state"] == "present")
        .map(|h| {
            (
                h["id"].as_str().unwrap().to_string(),
                h["lease_ttl_ms"].as_u64(),
            )
        })
        .collect()
}

/// Waits until every present host's lease has `ms` (10 s).
fn wait_leases(api: &str, ms: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = leases(api);
        if now.len() >= 2 && now.iter().all(|(_, l)| *l == Some(ms)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "leases still {now:?}, not {ms} ms"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_new_lease_time_to_live_applies_live_and_no_volume_changes_owner() {
    if !have("fio") {
        return;
    }
    let up = UpCluster::start(103, &[]);
    let (view, uri) = up.create_volume("vm1", "64M", None);
    let (owner, epoch) = (view["owner"].clone(), view["epoch"].clone());
    assert!(owner.is_string() && epoch.is_u64(), "{view:#}");
    wait_leases(&up.api, 4_000);
    let writer = fio(
        &uri,
        &[
            "--rw=randwrite",
            "--verify=crc32c",
            "--do_verify=1",
            "--loops=3",
        ],
    )
    .spawn()
    .unwrap();
    let (ok, text) = tessera(&up.api, &["settings", "set", "lease_ttl_ms", "1500"]);
    assert!(ok, "{text}");
    wait_leases(&up.api, 1_500);
    let (ok, text) = tessera(&up.api, &["settings", "set", "lease_ttl_ms", "100"]);
    assert!(!ok && text.contains("must be between 500"), "{text}");
    // Renewed at the new pace: still every host present well past 1.5 s.
    std::thread::sleep(Duration::from_secs(4));
    wait_leases(&up.api, 1_500);
    expect_success(writer, "writes and verifies across the lease change");
    let after = object(&up.api, "vm1");
    assert_eq!(after["owner"], owner, "{after:#}");
    assert_eq!(after["epoch"], epoch, "{after:#}");
    let (ok, text) = tessera(&up.api, &["--json", "events", "--limit", "200"]);
    assert!(ok, "{text}");
    assert!(!text.contains("LEASE_LOST"), "{text}");
    let (ok, text) = tessera(&up.api, &["settings", "reset", "lease_ttl_ms"]);
    assert!(ok, "{text}");
    wait_leases(&up.api, 4_000);
}
