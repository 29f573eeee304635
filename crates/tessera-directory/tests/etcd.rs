//! The shared directory suite against a real etcd (Debian `etcd-server`).
//!
//! One etcd process serves the whole test binary: each test gets its own
//! key prefix and cluster name. The process runs on free loopback ports with
//! a temporary data directory; a small watchdog process kills exactly that
//! etcd (by PID) and removes its directory when this test binary exits.
//! Without `/usr/bin/etcd` the tests are skipped with a message, unless
//! `TESSERA_REQUIRE_TOOLS=1`, in which case they fail.

mod suite;

use anyhow::{bail, Result};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use suite::Env;
use tessera_directory::{DirectoryError, EtcdDirectory};
use tokio::sync::RwLock;

/// etcd binary; `TESSERA_ETCD` overrides it.
const ETCD_DEFAULT: &str = "/usr/bin/etcd";
/// How long etcd may take to start answering.
const ETCD_START_WAIT: Duration = Duration::from_secs(20);

struct EtcdServer {
    endpoint: String,
}

static ETCD: OnceLock<Option<EtcdServer>> = OnceLock::new();

/// Compaction is cluster-wide in etcd: the test that compacts runs alone,
/// the others share this lock.
static HISTORY: OnceLock<Arc<RwLock<()>>> = OnceLock::new();

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn start_etcd() -> Option<EtcdServer> {
    let binary = std::env::var("TESSERA_ETCD").unwrap_or_else(|_| ETCD_DEFAULT.to_string());
    if !Path::new(&binary).exists() {
        if std::env::var("TESSERA_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!("{binary} is missing and TESSERA_REQUIRE_TOOLS=1: install etcd-server");
        }
        eprintln!("skipping etcd tests: {binary} not found (install etcd-server)");
        return None;
    }
    let data = tempfile::Builder::new()
        .prefix("tessera-etcd-")
        .tempdir()
        .expect("temp dir")
        .keep();
    let client_port = free_port();
    let peer_port = free_port();
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let log = std::fs::File::create(data.join("etcd.log")).expect("etcd log file");
    let child = Command::new(&binary)
        .arg("--name=test")
        .arg(format!("--data-dir={}", data.join("data").display()))
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
    let etcd_pid = child.id();
    // Statics are never dropped: a watchdog ends this etcd (only its PID)
    // and removes its files once the test binary is gone.
    let watchdog = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "while kill -0 {test} 2>/dev/null; do sleep 0.2; done; kill {etcd_pid}; sleep 1; kill -9 {etcd_pid} 2>/dev/null; rm -rf '{dir}'",
            test = std::process::id(),
            dir = data.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the etcd watchdog");
    // It outlives this process on purpose; nothing here waits for it.
    std::mem::forget(watchdog);
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", client_port)).is_err() {
        if started.elapsed() > ETCD_START_WAIT {
            let log = std::fs::read_to_string(data.join("etcd.log")).unwrap_or_default();
            panic!("etcd did not listen on {client_url} within {ETCD_START_WAIT:?}:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::mem::forget(child);
    Some(EtcdServer {
        endpoint: client_url,
    })
}

async fn make(name: &str, exclusive: bool) -> Option<Env> {
    let server = ETCD.get_or_init(start_etcd).as_ref()?;
    let history = HISTORY.get_or_init(|| Arc::new(RwLock::new(()))).clone();
    let guard: Box<dyn std::any::Any + Send> = if exclusive {
        Box::new(history.write_owned().await)
    } else {
        Box::new(history.read_owned().await)
    };
    // etcd may still be electing itself right after it starts listening.
    let started = Instant::now();
    let directory = loop {
        match EtcdDirectory::connect(std::slice::from_ref(&server.endpoint)).await {
            Ok(d) => break d,
            Err(e) if started.elapsed() < ETCD_START_WAIT => {
                eprintln!("etcd not ready yet: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("cannot reach etcd at {}: {e}", server.endpoint),
        }
    };
    Some(Env {
        directory: Arc::new(directory),
        prefix: format!("/test/{name}/"),
        cluster: name.replace('_', "-"),
        keep: guard,
    })
}

directory_suite!(make);

#[tokio::test]
async fn an_unreachable_etcd_is_reported_unavailable() -> Result<()> {
    // A port nobody listens on.
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let started = Instant::now();
    match EtcdDirectory::connect(std::slice::from_ref(&endpoint)).await {
        Err(DirectoryError::Unavailable { detail }) => {
            assert!(detail.contains(&endpoint), "{detail}");
        }
        other => bail!("expected unavailable, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(15));
    Ok(())
}
