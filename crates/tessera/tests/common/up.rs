//! A real `tessera up` on loopback addresses of its own, driven through
//! the `tessera` CLI, with fio as the client. Each test binary uses part of
//! it.
#![allow(dead_code)]

use super::free_port;
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `tessera up`, stopped when dropped.
pub struct UpCluster {
    child: Child,
    /// Its data directory, removed when dropped.
    _dir: tempfile::TempDir,
    /// The API's URL.
    pub api: String,
    /// The first three octets of its hosts' addresses (host-K is `.K`).
    net: String,
    nbd_port: u16,
}

impl Drop for UpCluster {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl UpCluster {
    /// Starts `tessera up` with 1 GiB hosts and `extra` arguments on
    /// 127.X.`third_octet`.K (each test its own `third_octet`), and waits
    /// until its API answers.
    pub fn start(third_octet: u8, extra: &[&str]) -> UpCluster {
        let dir = tempfile::tempdir().unwrap();
        let octet = 20 + (std::process::id() % 200) as u8;
        let net = format!("127.{octet}.{third_octet}");
        let bind = format!("{net}.1");
        let (api_port, nbd_port) = (free_port(), free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["up", "--host-capacity", "1G"])
            .args(extra)
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
            .expect("tessera up starts");
        let cluster = UpCluster {
            child,
            _dir: dir,
            api: format!("http://{bind}:{api_port}"),
            net,
            nbd_port,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !tessera(&cluster.api, &["status"]).0 {
            assert!(Instant::now() < deadline, "tessera up did not answer");
            std::thread::sleep(Duration::from_millis(200));
        }
        cluster
    }

    /// Creates volume `name` of `size` (with `policy`, or the default) and
    /// waits until it is healthy with an owner; answers its view and its
    /// NBD URI through the owner.
    pub fn create_volume(&self, name: &str, size: &str, policy: Option<&str>) -> (Value, String) {
        let mut args = vec!["volume", "create", name, "--size", size];
        if let Some(p) = policy {
            args.extend(["--policy", p]);
        }
        let (ok, text) = tessera(&self.api, &args);
        assert!(ok, "{text}");
        let view = wait_for(&self.api, name, "an owner and healthy copies", |v| {
            v["owner"].is_string() && v["state"] == "healthy"
        });
        let owner = view["owner"].as_str().unwrap();
        let k: u8 = owner.trim_start_matches("host-").parse().unwrap();
        let uri = format!("nbd://{}.{k}:{}/{name}", self.net, self.nbd_port);
        (view, uri)
    }
}

/// The data copy of an `object show` view on a host other than its owner.
pub fn copy_off_owner(view: &Value) -> Value {
    let owner = view["owner"].as_str().expect("an owner");
    view["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["role"] == "data" && c["host"] != owner)
        .expect("a copy on another host")
        .clone()
}

/// Runs the `tessera` CLI against `api`: whether it succeeded, and what it
/// printed (stdout, then stderr).
pub fn tessera(api: &str, args: &[&str]) -> (bool, String) {
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

/// `tessera object show` of `volume`, as JSON.
pub fn object(api: &str, volume: &str) -> Value {
    let (ok, text) = tessera(api, &["--json", "object", "show", volume]);
    assert!(ok, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// Polls `object show` of `volume` until `ok` holds (90 s at most).
pub fn wait_for(api: &str, volume: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
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

/// fio on NBD `uri`: 4 KiB blocks, 8 deep, over 32 MiB, stopping at the
/// first verify error, then `args`.
pub fn fio(uri: &str, args: &[&str]) -> Command {
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

/// Waits for fio `child` and fails the test, with its output, unless it
/// succeeded.
pub fn expect_success(child: Child, what: &str) {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "fio {what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs fio on NBD `uri` with `args` (a job name, an engine and the URI
/// come first) and answers its JSON report; fails the test if fio fails.
pub fn fio_report(uri: &str, args: &[&str]) -> Value {
    let out = Command::new("fio")
        .args([
            "--name=report",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--output-format=json",
        ])
        .args(args)
        .output()
        .expect("run fio");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The NBD engine may print notes before the report.
    let json = &text[text.find("\n{").map_or(0, |i| i + 1)..];
    serde_json::from_str(json).expect("fio's JSON report")
}
