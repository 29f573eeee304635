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
    /// Its data directory (host-K's devices in `host-K/`).
    pub data_dir: std::path::PathBuf,
    nbd_port: u16,
    /// How it was started, to start it again the same way.
    launch: Launch,
    log_path: std::path::PathBuf,
}

/// The arguments of one `tessera up` but its data directory.
#[derive(Clone)]
struct Launch {
    extra: Vec<String>,
    bind: String,
    api_port: u16,
    nbd_port: u16,
    iscsi_port: u16,
    transport_port: u16,
}

impl Launch {
    fn spawn(&self, data_dir: &std::path::Path, log_path: &std::path::Path) -> Child {
        // Appended to: a start again after a kill keeps what came before.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .unwrap();
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .arg("up")
            .args(if self.extra.iter().any(|a| a == "--host-capacity") {
                &[][..]
            } else {
                &["--host-capacity", "1G"][..]
            })
            .args(&self.extra)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--bind", &self.bind])
            .args(["--api-port", &self.api_port.to_string()])
            .args(["--nbd-port", &self.nbd_port.to_string()])
            .args(["--iscsi-port", &self.iscsi_port.to_string()])
            .args(["--transport-port", &self.transport_port.to_string()])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("tessera up starts")
    }
}

/// The last 20 lines of a log.
fn log_tail(log_path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(log_path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Waits up to 60 s for the API at `api` to answer `tessera status`:
/// `Ok` once it does, `Err` with the exit status if `child` ended first.
/// Panics with the log's end past the deadline.
fn wait_until_answering(
    child: &mut Child,
    api: &str,
    log_path: &std::path::Path,
) -> Result<(), std::process::ExitStatus> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if tessera(api, &["status"]).0 {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "tessera up did not answer in 60 s; its log:\n{}",
                log_tail(log_path)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
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
    /// until its API answers. A start that ends at once (a port taken
    /// between choosing it and binding it) is tried again on other ports;
    /// a failure shows the end of its log.
    pub fn start(third_octet: u8, extra: &[&str]) -> UpCluster {
        let dir = tempfile::tempdir().unwrap();
        let octet = 20 + (std::process::id() % 200) as u8;
        let net = format!("127.{octet}.{third_octet}");
        let bind = format!("{net}.1");
        let log_path = dir.path().join("up.log");
        for attempt in 1..=3 {
            let launch = Launch {
                extra: extra.iter().map(|a| a.to_string()).collect(),
                bind: bind.clone(),
                api_port: free_port(),
                nbd_port: free_port(),
                iscsi_port: free_port(),
                transport_port: free_port(),
            };
            let data_dir = dir.path().join(format!("data-{attempt}"));
            let mut child = launch.spawn(&data_dir, &log_path);
            let api = format!("https://{bind}:{}", launch.api_port);
            // `tessera up` writes its admin token there at its first start.
            remember_token_file(&api, &data_dir.join("admin.token"));
            match wait_until_answering(&mut child, &api, &log_path) {
                Ok(()) => {
                    return UpCluster {
                        child,
                        data_dir,
                        _dir: dir,
                        api,
                        net,
                        nbd_port: launch.nbd_port,
                        launch,
                        log_path,
                    };
                }
                Err(status) => {
                    assert!(
                        attempt < 3,
                        "tessera up ended ({status}) at each of 3 starts; its log:\n{}",
                        log_tail(&log_path)
                    );
                    eprintln!(
                        "tessera up ended ({status}); starting it again:\n{}",
                        log_tail(&log_path)
                    );
                }
            }
        }
        unreachable!("the third start either answers or fails the test")
    }

    /// kill -9 of the whole process, every host at once with nothing
    /// flushed or closed, then `tessera up` again on the same data
    /// directory, addresses and ports; returns once its API answers.
    pub fn kill_and_restart(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        self.child = self.launch.spawn(&self.data_dir, &self.log_path);
        if let Err(status) = wait_until_answering(&mut self.child, &self.api, &self.log_path) {
            panic!(
                "tessera up ended ({status}) when started again after kill -9; its log:\n{}",
                log_tail(&self.log_path)
            );
        }
    }

    /// The NBD URI of `export` (a volume, or `volume@snapshot`) through
    /// `host` (host-K).
    pub fn nbd_uri(&self, host: &str, export: &str) -> String {
        let k: u8 = host.trim_start_matches("host-").parse().unwrap();
        format!("nbd://{}.{k}:{}/{export}", self.net, self.nbd_port)
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

/// The admin token file of each cluster this test process started, by
/// API URL.
static TOKEN_FILES: std::sync::Mutex<Vec<(String, std::path::PathBuf)>> =
    std::sync::Mutex::new(Vec::new());

/// Notes that the cluster at `api` keeps its admin token in `path`.
pub fn remember_token_file(api: &str, path: &std::path::Path) {
    let mut files = TOKEN_FILES.lock().unwrap();
    files.retain(|(a, _)| a != api);
    files.push((api.to_string(), path.to_path_buf()));
}

/// Runs the `tessera` CLI against `api` (with its admin token, if this
/// process started it): whether it succeeded, and what it printed
/// (stdout, then stderr).
pub fn tessera(api: &str, args: &[&str]) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tessera"));
    command.arg("--api").arg(api).args(args);
    if let Some((_, path)) = TOKEN_FILES.lock().unwrap().iter().find(|(a, _)| a == api) {
        command.env("TESSERA_TOKEN_FILE", path);
    }
    let out = command.output().expect("run tessera");
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
