//! The cluster's history as a user reads it from `tessera events` on the
//! real `tessera up`: a volume's owner taken at an epoch, a policy made
//! through the CLI (with who made it), a copy's host stopped while fio
//! writes (the owner records the copy absent), and the resync that brings the
//! copy back when the host starts, in that order; `--follow` prints the
//! resync's end as it happens; and a repair delay shortened live rebuilds
//! an absent copy at once. Skips without fio.

mod common;

use common::have;
use common::up::{copy_off_owner, expect_success, fio, object, tessera, UpCluster};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn events_tell_what_the_cluster_did_in_order_and_follow_prints_them_as_they_happen() {
    if !have("fio") {
        return;
    }
    let up = UpCluster::start(91, &[]);
    let (view, uri) = up.create_volume("vm1", "64M", None);
    let owner = view["owner"].as_str().unwrap().to_string();
    let away = copy_off_owner(&object(&up.api, "vm1"))["host"]
        .as_str()
        .unwrap()
        .to_string();
    let (ok, text) = tessera(&up.api, &["policy", "create", "gold", "--ftt", "1"]);
    assert!(ok, "{text}");

    // Follow from here on.
    let token_file = up.data_dir.join("admin.token");
    let mut follow = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["--api", &up.api, "events", "--follow", "--limit", "1"])
        .env("TESSERA_TOKEN_FILE", &token_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stdout = follow.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });

    let (ok, text) = tessera(&up.api, &["host", "stop", &away]);
    assert!(ok, "{text}");
    expect_success(
        fio(&uri, &["--rw=write", "--size=4M"]).spawn().unwrap(),
        "writes while a copy is away",
    );
    let (ok, text) = tessera(&up.api, &["host", "start", &away]);
    assert!(ok, "{text}");

    let deadline = Instant::now() + Duration::from_secs(90);
    let mut followed = Vec::new();
    while !followed
        .iter()
        .any(|l: &String| l.contains("RESYNC_FINISHED") && l.contains("vm1"))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => followed.push(line),
            Err(_) => panic!(
                "--follow printed no RESYNC_FINISHED in 90 s:\n{}",
                followed.join("\n")
            ),
        }
    }
    let _ = follow.kill();
    let _ = follow.wait();
    let followed = followed.join("\n");
    for code in ["COMPONENT_ABSENT", "RESYNC_STARTED"] {
        assert!(
            followed.contains(code),
            "--follow printed {code}:\n{followed}"
        );
    }

    let (ok, text) = tessera(&up.api, &["--json", "events", "--limit", "1000"]);
    assert!(ok, "{text}");
    let events: Vec<Value> = serde_json::from_str(&text).unwrap();
    let position = |what: &dyn Fn(&Value) -> bool, name: &str| {
        events
            .iter()
            .position(what)
            .unwrap_or_else(|| panic!("no {name} in {events:#?}"))
    };
    let code_on = |code: &'static str, subject: &'static str| {
        move |e: &Value| e["code"] == code && e["subject"] == subject
    };
    let taken = position(&code_on("OWNERSHIP_TAKEN", "vm1"), "owner taken");
    assert_eq!(events[taken]["host"], owner.as_str());
    assert!(
        events[taken]["message"]
            .as_str()
            .unwrap()
            .contains("at epoch"),
        "{:#}",
        events[taken]
    );
    let policy = position(
        &|e: &Value| e["code"] == "API_CHANGE" && e["subject"] == "/v1/policies",
        "the policy made",
    );
    assert_eq!(events[policy]["by"], "admin (admin)");
    let stop_path = format!("/v1/hosts/{away}/stop");
    let stopped = position(
        &|e: &Value| e["code"] == "API_CHANGE" && e["subject"] == stop_path.as_str(),
        "the host stopped",
    );
    let absent = position(&code_on("COMPONENT_ABSENT", "vm1"), "copy absent");
    assert!(
        events[absent]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("on {away} is absent (was active)")),
        "{:#}",
        events[absent]
    );
    let started = position(&code_on("RESYNC_STARTED", "vm1"), "resync started");
    let finished = position(&code_on("RESYNC_FINISHED", "vm1"), "resync finished");
    assert!(
        events[finished]["message"]
            .as_str()
            .unwrap()
            .contains("4.0 MiB copied"),
        "{:#}",
        events[finished]
    );
    assert!(
        taken < policy
            && policy < stopped
            && stopped < started
            && absent < started
            && started < finished,
        "in order: {events:#?}"
    );
    // Reads are not events, and a refused change is not one either.
    let (ok, _) = tessera(&up.api, &["policy", "create", "gold", "--ftt", "1"]);
    assert!(!ok, "a second policy named gold is refused");
    let (ok, text) = tessera(&up.api, &["--json", "events", "--limit", "1000"]);
    assert!(ok, "{text}");
    let after: Vec<Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(
        after
            .iter()
            .filter(|e| e["subject"] == "/v1/policies")
            .count(),
        1,
        "{after:#?}"
    );
}

/// The repair delay is a live setting: with a copy's host stopped, the
/// health check counts down the default hour; `settings set repair_delay_s
/// 2` makes the owner rebuild the copy elsewhere at once, with the data fio
/// wrote, and the volume is healthy again while the host is still down.
#[test]
fn a_shorter_repair_delay_set_live_rebuilds_an_absent_copy_at_once() {
    if !have("fio") {
        return;
    }
    let up = UpCluster::start(99, &[]);
    let (view, uri) = up.create_volume("vm2", "64M", None);
    let owner = view["owner"].as_str().unwrap().to_string();
    let away = copy_off_owner(&object(&up.api, "vm2"));
    let away_host = away["host"].as_str().unwrap().to_string();
    let written = fio(&uri, &["--rw=write", "--size=8M", "--do_verify=0"])
        .spawn()
        .unwrap();
    expect_success(written, "fio writes");
    let (ok, out) = tessera(&up.api, &["host", "stop", &away_host]);
    assert!(ok, "{out}");

    // Absent, with the default hour to go.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, text) = tessera(&up.api, &["--json", "health"]);
        assert!(ok, "{text}");
        let health: Value = serde_json::from_str(&text).unwrap();
        let pending = health["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["code"] == "REPAIR_DELAY_PENDING" && c["seconds_left"].is_u64())
            .cloned();
        if let Some(check) = pending {
            let left = check["seconds_left"].as_u64().unwrap();
            assert!((3000..=3600).contains(&left), "{check}");
            break;
        }
        assert!(Instant::now() < deadline, "no countdown: {text}");
        std::thread::sleep(Duration::from_millis(300));
    }

    let (ok, out) = tessera(&up.api, &["settings", "set", "repair_delay_s", "2"]);
    assert!(ok, "{out}");
    let (ok, out) = tessera(&up.api, &["settings", "get", "repair_delay_s"]);
    assert!(ok && out.contains("2s"), "{out}");
    let (ok, out) = tessera(&up.api, &["settings", "set", "repair_delay_s", "999999999"]);
    assert!(!ok && out.contains("must be between"), "{out}");

    let rebuilt = common::up::wait_for(&up.api, "vm2", "a copy rebuilt elsewhere", |v| {
        v["state"] == "healthy"
            && v["components"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|c| c["role"] == "data")
                .all(|c| c["host"] != away_host.as_str() && c["state"] == "active")
    });
    assert_eq!(rebuilt["owner"], owner.as_str(), "{rebuilt:#}");
    // The new copy holds what the owner's does, fio's 8 MiB included.
    let (ok, out) = tessera(&up.api, &["--json", "object", "verify", "vm2"]);
    assert!(ok, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["identical"], true, "{report:#}");
    let allocated: Vec<u64> = rebuilt["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["role"] == "data")
        .map(|c| c["allocated_bytes"].as_u64().unwrap_or(0))
        .collect();
    assert!(allocated.iter().all(|b| *b >= 8 << 20), "{rebuilt:#}");
}
