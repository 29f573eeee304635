//! `tessera fault fail-device` on the real `tessera up --fault-injection`:
//! the cache device of the disk group holding a volume's second copy fails
//! under fio; the copy is rebuilt on another host at once (the repair delay
//! is an hour), fio's checked reads of everything written before and during
//! the failure pass afterwards, and `tessera object verify` finds the copies
//! identical. Skips without fio.

mod common;

use common::{free_port, have};
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `tessera up`, stopped when dropped.
struct Up(Child);

impl Drop for Up {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tessera(api: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("--api")
        .arg(api)
        .args(args)
        .output()
        .expect("run tessera");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn object(api: &str, volume: &str) -> Value {
    let (ok, text) = tessera(api, &["--json", "object", "show", volume]);
    assert!(ok, "{text}");
    serde_json::from_str(&text).unwrap()
}

fn wait_for(api: &str, volume: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(view) = std::panic::catch_unwind(|| object(api, volume)) {
            if ok(&view) {
                return view;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {view:#}"
            );
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn fio(uri: &str, args: &[&str]) -> Command {
    let mut command = Command::new("fio");
    command
        .args([
            "--name=check",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--bs=4k",
            "--iodepth=8",
            "--size=32M",
            "--verify_fatal=1",
            "--output-format=terse",
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn expect_success(child: Child, what: &str) {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "fio {what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running `tessera up --fault-injection` with volume `vm` (64 MiB)
/// healthy: its data directory, the process, the API's URL, the volume's
/// view, and its NBD URI through the owner.
fn up_with_volume(third_octet: u8) -> (tempfile::TempDir, Up, String, Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let octet = 20 + (std::process::id() % 200) as u8;
    let bind = format!("127.{octet}.{third_octet}.1");
    let (api_port, nbd_port) = (free_port(), free_port());
    let up = Up(Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["up", "--fault-injection", "--host-capacity", "1G"])
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--bind", &bind])
        .args(["--api-port", &api_port.to_string()])
        .args(["--nbd-port", &nbd_port.to_string()])
        .args(["--iscsi-port", &free_port().to_string()])
        .args(["--transport-port", &free_port().to_string()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("tessera up starts"));
    let api = format!("http://{bind}:{api_port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !tessera(&api, &["status"]).0 {
        assert!(Instant::now() < deadline, "tessera up did not answer");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (ok, text) = tessera(&api, &["volume", "create", "vm", "--size", "64M"]);
    assert!(ok, "{text}");
    let view = wait_for(&api, "vm", "an owner and healthy copies", |v| {
        v["owner"].is_string() && v["state"] == "healthy"
    });
    let owner = view["owner"].as_str().unwrap();
    let k: u8 = owner.trim_start_matches("host-").parse().unwrap();
    let uri = format!("nbd://127.{octet}.{third_octet}.{k}:{nbd_port}/vm");
    (dir, up, api, view, uri)
}

#[test]
fn a_failed_cache_device_has_its_copies_rebuilt_at_once_and_loses_no_data() {
    if !have("fio") {
        return;
    }
    let (_dir, up, api, view, uri) = up_with_volume(77);
    let owner = view["owner"].as_str().unwrap().to_string();
    let lost = view["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["role"] == "data" && c["host"] != owner.as_str())
        .expect("a copy on another host")
        .clone();
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
    let (_dir, up, api, view, uri) = up_with_volume(78);
    let owner = view["owner"].as_str().unwrap();
    let other = view["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["role"] == "data" && c["host"] != owner)
        .expect("a copy on another host")["host"]
        .as_str()
        .unwrap()
        .to_string();
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
