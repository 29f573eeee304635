//! The shared directory suite against a real etcd (Debian `etcd-server`).
//!
//! One etcd process serves the whole test binary: each test gets its own
//! key prefix and cluster name. A small watchdog process kills exactly that
//! etcd (by PID) and removes its directory when this test binary exits, since
//! a static is never dropped.

mod etcd_process;
mod suite;

use anyhow::{bail, Result};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use suite::Env;
use tessera_directory::{DirectoryError, EtcdDirectory};
use tokio::sync::RwLock;

/// The client URL of this binary's etcd, or `None` when etcd is missing.
static ETCD: OnceLock<Option<String>> = OnceLock::new();

/// Compaction is cluster-wide in etcd: the test that compacts runs alone,
/// the others share this lock.
static HISTORY: OnceLock<Arc<RwLock<()>>> = OnceLock::new();

fn start_shared_etcd() -> Option<String> {
    let process = etcd_process::start()?;
    let watchdog = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "while kill -0 {test} 2>/dev/null; do sleep 0.2; done; kill {etcd}; sleep 1; kill -9 {etcd} 2>/dev/null; rm -rf '{dir}'",
            test = std::process::id(),
            etcd = process.child.id(),
            dir = process.dir.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the etcd watchdog");
    let endpoint = process.endpoint.clone();
    // Both outlive this process's statics on purpose: the watchdog ends etcd.
    std::mem::forget(watchdog);
    std::mem::forget(process);
    Some(endpoint)
}

async fn make(name: &str, exclusive: bool) -> Option<Env> {
    let endpoint = ETCD.get_or_init(start_shared_etcd).as_ref()?;
    let history = HISTORY.get_or_init(|| Arc::new(RwLock::new(()))).clone();
    let guard: Box<dyn std::any::Any + Send> = if exclusive {
        Box::new(history.write_owned().await)
    } else {
        Box::new(history.read_owned().await)
    };
    let directory = etcd_process::connect(endpoint).await;
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
    let endpoint = etcd_process::unused_endpoint();
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
