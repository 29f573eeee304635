//! Starting a real etcd for tests: one member on free loopback ports with a
//! temporary data directory and raft timings short enough for 1 s leases.
//! Without the binary the caller skips, unless `TESSERA_REQUIRE_TOOLS=1`, in
//! which case it fails.

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tessera_directory::EtcdDirectory;

/// etcd binary; `TESSERA_ETCD` overrides it.
pub const ETCD_DEFAULT: &str = "/usr/bin/etcd";
/// How long etcd may take to start answering.
pub const ETCD_START_WAIT: Duration = Duration::from_secs(20);

/// A running etcd this test process started.
pub struct EtcdProcess {
    /// The etcd process.
    pub child: Child,
    /// Its client URL.
    pub endpoint: String,
    /// Its files (data and log).
    pub dir: PathBuf,
}

impl EtcdProcess {
    /// Kills this etcd (only its PID) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// An address on loopback where nothing listens (for unreachable-server tests).
pub fn unused_endpoint() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

/// Starts etcd, or returns `None` (after printing why) when it is not
/// installed and tools are not required. Its files go to a fresh directory
/// the caller removes.
pub fn start() -> Option<EtcdProcess> {
    start_with(None)
}

/// The files of an etcd that speaks TLS only and asks every client for a
/// certificate signed by `ca_cert`.
pub struct EtcdServerTls {
    /// The CA clients' certificates must chain to.
    pub ca_cert: PathBuf,
    /// etcd's certificate (valid for 127.0.0.1).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

/// [`start`], serving clients over TLS with client certificates when `tls`
/// is given (its client URL is then `https://`).
pub fn start_with(tls: Option<&EtcdServerTls>) -> Option<EtcdProcess> {
    let binary = std::env::var("TESSERA_ETCD").unwrap_or_else(|_| ETCD_DEFAULT.to_string());
    if !Path::new(&binary).exists() {
        if std::env::var("TESSERA_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!("{binary} is missing and TESSERA_REQUIRE_TOOLS=1: install etcd-server");
        }
        eprintln!("skipping etcd tests: {binary} not found (install etcd-server)");
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix("tessera-etcd-")
        .tempdir()
        .expect("temp dir")
        .keep();
    let client_port = free_port();
    let peer_port = free_port();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let client_url = format!("{scheme}://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let log = std::fs::File::create(dir.join("etcd.log")).expect("etcd log file");
    let mut command = Command::new(&binary);
    if let Some(tls) = tls {
        command
            .arg(format!("--cert-file={}", tls.cert.display()))
            .arg(format!("--key-file={}", tls.key.display()))
            .arg(format!("--trusted-ca-file={}", tls.ca_cert.display()))
            .arg("--client-cert-auth");
    }
    let child = command
        .arg("--name=test")
        .arg(format!("--data-dir={}", dir.join("data").display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster=test={peer_url}"))
        // Short raft timings: a one-member cluster elects itself at once, and
        // etcd's minimum lease TTL (1.5 election timeouts) drops well below
        // the 1 s leases the suite uses.
        .arg("--heartbeat-interval=10")
        .arg("--election-timeout=100")
        .arg("--logger=zap")
        .arg("--log-level=error")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start etcd");
    let mut process = EtcdProcess {
        child,
        endpoint: client_url,
        dir,
    };
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", client_port)).is_err() {
        if started.elapsed() > ETCD_START_WAIT {
            process.kill();
            let log = std::fs::read_to_string(process.dir.join("etcd.log")).unwrap_or_default();
            panic!(
                "etcd did not listen on {} within {ETCD_START_WAIT:?}:\n{log}",
                process.endpoint
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(process)
}

/// Connects to `endpoint`, waiting while a just-started etcd elects itself.
pub async fn connect(endpoint: &str) -> EtcdDirectory {
    let started = Instant::now();
    loop {
        match EtcdDirectory::connect(&[endpoint.to_string()]).await {
            Ok(d) => return d,
            Err(e) if started.elapsed() < ETCD_START_WAIT => {
                eprintln!("etcd not ready yet: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("cannot reach etcd at {endpoint}: {e}"),
        }
    }
}
