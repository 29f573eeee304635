//! `tessera volume clone --full` on the real `tessera up` (four hosts),
//! driven through the `tessera` CLI with fio as the client: fio writes a
//! pattern into half a volume, a snapshot is taken, and a full clone of it
//! is made under a throttled policy. The command waits, printing the fill's
//! progress, and ends once the clone is filled; fio's checked reads of the
//! clone find the pattern. A second clone made with `--no-wait` answers at
//! once, shows as filling in `volume list` and `--json volume show`, keeps
//! its snapshot from being deleted (the message names it) and is refused
//! to an NBD client; once filled it serves clients and reads back as the
//! snapshot. Usage mistakes exit 2 and refusals 1. Skips without fio.

mod common;

use common::have;
use common::up::{fio, tessera, UpCluster};
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

fn volume(api: &str, name: &str) -> Value {
    let (ok, text) = tessera(api, &["--json", "volume", "show", name]);
    assert!(ok, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// Checked sequential reads of the first 32 MiB of `uri`: the pattern fio
/// wrote into the source before its snapshot.
fn expect_pattern(uri: &str, what: &str) {
    let out = fio(
        uri,
        &[
            "--rw=write",
            "--verify=pattern",
            "--verify_pattern=0x71%o",
            "--verify_only",
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{what}: fio's checked reads failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_full_clone_is_filled_with_progress_shown_and_serves_clients_once_filled() {
    if !have("fio") || !have("qemu-img") {
        return;
    }
    let up = UpCluster::start(83, &[]);
    let api = up.api.clone();
    let (view, uri) = up.create_volume("vm", "64M", None);
    let owner = view["owner"].as_str().unwrap().to_string();
    let written = fio(
        &uri,
        &[
            "--rw=write",
            "--verify=pattern",
            "--verify_pattern=0x71%o",
            "--do_verify=0",
        ],
    )
    .output()
    .unwrap();
    assert!(written.status.success(), "{written:?}");
    let (ok, text) = tessera(&api, &["snapshot", "create", "vm", "s1"]);
    assert!(ok, "{text}");
    // What fio writes now is not in the snapshot, nor in its clones.
    let after = fio(&uri, &["--rw=write", "--buffer_pattern=0x5a", "--size=4M"])
        .output()
        .unwrap();
    assert!(after.status.success(), "{after:?}");
    let (ok, text) = tessera(
        &api,
        &[
            "policy",
            "create",
            "slow",
            "--ftt",
            "1",
            "--bandwidth-limit",
            "8",
        ],
    );
    assert!(ok, "{text}");

    // Usage mistakes are caught before anything is sent.
    for args in [
        &["volume", "clone", "x", "--from", "vm@s1", "--no-wait"][..],
        &[
            "volume", "clone", "x", "--from", "vm@s1", "--policy", "slow",
        ],
        &["volume", "clone", "x", "--from", "vm", "--full"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .arg("--api")
            .arg(&api)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
    // Refusals exit 1 with the API's reason.
    for (args, said) in [
        (
            &["volume", "clone", "x", "--from", "nope@s1", "--full"][..],
            "no volume named nope",
        ),
        (
            &["volume", "clone", "x", "--from", "vm@nope", "--full"],
            "has no snapshot named nope",
        ),
        (
            &["volume", "clone", "vm", "--from", "vm@s1", "--full"],
            "already exists",
        ),
        (
            &[
                "volume", "clone", "x", "--from", "vm@s1", "--full", "--policy", "gold",
            ],
            "no policy named gold",
        ),
    ] {
        let (ok, text) = tessera(&api, args);
        assert!(!ok && text.contains(said), "{args:?}: {text}");
    }

    // Waits by default, one progress line per change (stdout is a pipe):
    // 32 MiB at 8 MiB/s.
    let (ok, text) = tessera(
        &api,
        &[
            "volume", "clone", "copy", "--from", "vm@s1", "--full", "--policy", "slow",
        ],
    );
    assert!(ok, "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0]
            .starts_with("cloned volume copy: 64.0 MiB, policy slow, 512e, healthy, owner host-"),
        "{text}"
    );
    assert!(lines[1].starts_with("full clone of vm@s1:"), "{text}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("copy is being filled from vm@s1: ")),
        "the progress is shown: {text}"
    );
    assert!(
        text.contains(
            "volume copy is filled: a full copy of vm@s1, 32.0 MiB of data; it serves clients now"
        ),
        "{text}"
    );
    let copy = volume(&api, "copy");
    assert!(copy.get("fill").is_none(), "{copy:#}");
    assert_eq!(copy["used_bytes"], 32 << 20, "{copy:#}");
    expect_pattern(&up.nbd_uri(&owner, "copy"), "the filled clone");
    let (ok, text) = tessera(&api, &["object", "verify", "copy"]);
    assert!(ok, "{text}");

    // --no-wait answers at once; the clone shows as filling meanwhile.
    let (ok, text) = tessera(
        &api,
        &[
            "volume",
            "clone",
            "copy2",
            "--from",
            "vm@s1",
            "--full",
            "--policy",
            "slow",
            "--no-wait",
        ],
    );
    assert!(ok, "{text}");
    assert!(text.contains("full clone of vm@s1"), "{text}");
    let (ok, list) = tessera(&api, &["volume", "list"]);
    assert!(ok, "{list}");
    assert!(list.contains("filling "), "{list}");
    assert!(
        list.contains("copy2 is being filled from vm@s1: "),
        "{list}"
    );
    let shown = volume(&api, "copy2");
    assert_eq!(shown["fill"]["from"], "vm@s1", "{shown:#}");
    let (ok, text) = tessera(&api, &["snapshot", "delete", "vm", "s1"]);
    assert!(!ok && text.contains("copy2 (from vm@s1"), "{text}");
    let refused = Command::new("qemu-img")
        .args(["info", &up.nbd_uri(&owner, "copy2")])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "NBD served a clone being filled");
    assert!(
        said.contains("is being filled from snapshot vm@s1"),
        "{said}"
    );

    let deadline = Instant::now() + Duration::from_secs(120);
    while volume(&api, "copy2").get("fill").is_some() {
        assert!(Instant::now() < deadline, "the fill of copy2 never ended");
        std::thread::sleep(Duration::from_millis(500));
    }
    expect_pattern(
        &up.nbd_uri(&owner, "copy2"),
        "the clone filled without waiting",
    );
    // Filled, it holds its snapshot no more.
    let (ok, text) = tessera(&api, &["snapshot", "delete", "vm", "s1"]);
    assert!(ok, "{text}");
    let (ok, text) = tessera(&api, &["volume", "delete", "vm"]);
    assert!(ok, "{text}");
    expect_pattern(&up.nbd_uri(&owner, "copy"), "a clone after its source went");
}
