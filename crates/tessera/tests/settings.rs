//! Settings as a user changes them on the real `tessera up`: the VAAI
//! switches turned off cluster-wide reach every host's iSCSI units at once
//! (libiscsi's `iscsi-inq` reads the provisioning and block limits pages
//! through each host, and `iscsi-test-cu` finds UNMAP refused), one host
//! may keep its own value (`settings set --host`), a host keeps it across a
//! restart, and `settings reset` undoes both; values and names that cannot
//! be taken are refused with nothing changed. Skips without libiscsi's
//! tools.

mod common;

use common::have;
use common::up::{tessera, UpCluster};
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

/// `iscsi-inq` of VPD page `page` through `url`.
fn vpd(url: &str, page: u8) -> String {
    let out = Command::new("timeout")
        .args([
            "-k",
            "5",
            "30",
            "iscsi-inq",
            "-e",
            "1",
            "-c",
            &page.to_string(),
            url,
        ])
        .output()
        .expect("run iscsi-inq");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "iscsi-inq {page:#x} {url}: {text}");
    text
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
    loop {
        let inq = Command::new("timeout")
            .args([
                "-k",
                "5",
                "30",
                "iscsi-inq",
                "-e",
                "1",
                "-c",
                "178",
                special_url,
            ])
            .output()
            .expect("run iscsi-inq");
        if inq.status.success() {
            break;
        }
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
    let (ok, text) = tessera(&up.api, &["settings", "reset", "vaai_unmap"]);
    assert!(ok, "{text}");
    wait_unmap(&every, true);
    assert_eq!(setting(&up.api, "vaai_unmap", None), true);
}
