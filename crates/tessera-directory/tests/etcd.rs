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

/// Writes a certificate of `ca` for `name` (a server for 127.0.0.1 when
/// `server`) into `dir`; its (certificate, key) paths.
fn issue(
    ca: &tessera_tls::CertificateAuthority,
    dir: &std::path::Path,
    name: &str,
    server: bool,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let issued = ca
        .issue(&tessera_tls::CertificateRequest {
            name: name.into(),
            ips: if server {
                vec!["127.0.0.1".parse().unwrap()]
            } else {
                Vec::new()
            },
            dns_names: Vec::new(),
            usage: if server {
                tessera_tls::Usage::Server
            } else {
                tessera_tls::Usage::Client
            },
        })
        .unwrap();
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}-key.pem")),
    );
    std::fs::write(&cert, issued.cert_pem).unwrap();
    std::fs::write(&key, issued.key_pem).unwrap();
    (cert, key)
}

/// An etcd that asks for client certificates admits a host presenting one
/// from the cluster CA, and nobody else: not a plain client, not one with a
/// certificate of another CA.
#[tokio::test]
async fn etcd_with_client_certificates_admits_only_hosts_holding_one() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ca = tessera_tls::CertificateAuthority::generate("test")?;
    let other = tessera_tls::CertificateAuthority::generate("other")?;
    let ca_cert = dir.path().join("ca.pem");
    std::fs::write(&ca_cert, ca.cert_pem())?;
    let (cert, key) = issue(&ca, dir.path(), "etcd", true);
    let Some(etcd) = etcd_process::start_with(Some(&etcd_process::EtcdServerTls {
        ca_cert: ca_cert.clone(),
        cert,
        key,
    })) else {
        return Ok(());
    };
    let endpoints = std::slice::from_ref(&etcd.endpoint);
    let (cert, key) = issue(&ca, dir.path(), "host-1", false);
    let host = tessera_directory::EtcdTls {
        ca_cert: ca_cert.clone(),
        cert,
        key,
    };
    let started = Instant::now();
    let directory = loop {
        match EtcdDirectory::connect_tls(endpoints, &host).await {
            Ok(d) => break d,
            Err(e) if started.elapsed() < etcd_process::ETCD_START_WAIT => {
                eprintln!("etcd not ready yet: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => bail!("a host with a certificate of the CA was refused: {e}"),
        }
    };
    use tessera_directory::Directory;
    directory.put("/tls-check", b"yes".to_vec(), None).await?;
    assert_eq!(
        directory.get("/tls-check").await?.map(|kv| kv.value),
        Some(b"yes".to_vec())
    );

    let (cert, key) = issue(&other, dir.path(), "host-2", false);
    let stranger = tessera_directory::EtcdTls { ca_cert, cert, key };
    let refused = EtcdDirectory::connect_tls(endpoints, &stranger).await;
    assert!(
        matches!(refused, Err(DirectoryError::Unavailable { .. })),
        "a certificate of another CA got in: {refused:?}"
    );
    let plain = [etcd.endpoint.replacen("https://", "http://", 1)];
    let refused = EtcdDirectory::connect(&plain).await;
    assert!(
        matches!(refused, Err(DirectoryError::Unavailable { .. })),
        "a client without TLS got in: {refused:?}"
    );
    Ok(())
}
