//! What callers see when etcd itself goes away: this binary starts its own
//! etcd (not the suite's shared one) and kills it in the middle. A watch
//! ends with an error instead of going quiet, requests fail as unavailable
//! within their timeout, and a host session declares itself lost once no
//! renewal succeeded for a whole time to live.

mod etcd_process;

use anyhow::{anyhow, bail, ensure, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_directory::keys::{HostAddresses, HostRecord, Keyspace};
use tessera_directory::membership::SessionState;
use tessera_directory::{register_host, Directory, DirectoryError};
use tessera_types::{FaultDomainId, HostId};

/// Longest a caller may wait to learn etcd is gone: the request timeout
/// plus connection setup, with slack for a loaded machine.
const NOTICE_WAIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_etcd_ends_watches_requests_and_sessions_with_errors() -> Result<()> {
    // Dropping the process (also on failure) kills it and removes its files.
    let Some(mut etcd) = etcd_process::start() else {
        return Ok(());
    };
    let directory: Arc<dyn Directory> = Arc::new(etcd_process::connect(&etcd.endpoint).await);
    let keys = Keyspace::new("faults")?;
    let addr = "127.0.0.1:1".parse()?;
    let record = HostRecord {
        id: HostId::new("h1")?,
        fault_domain: FaultDomainId::new("fd1")?,
        addresses: HostAddresses {
            transport: addr,
            nbd: addr,
            iscsi: addr,
            api: addr,
        },
        disk_groups: Vec::new(),
        witness_only: false,
    };
    let ttl = Duration::from_secs(1);
    let session = register_host(directory.clone(), &keys, record, ttl).await?;
    let mut watch = directory.watch("/faults/", 0).await?;
    directory.put("/faults/a", b"1".to_vec(), None).await?;
    let event = tokio::time::timeout(NOTICE_WAIT, watch.recv()).await??;
    ensure!(event.kv.key == "/faults/a");

    let killed = Instant::now();
    etcd.kill();

    match tokio::time::timeout(NOTICE_WAIT, watch.recv()).await {
        Ok(Err(DirectoryError::Unavailable { .. } | DirectoryError::WatchClosed { .. })) => {}
        Ok(other) => bail!("a watch on a dead etcd must end with an error, got {other:?}"),
        Err(_) => bail!("the watch stayed silent for {NOTICE_WAIT:?} after etcd died"),
    }
    match tokio::time::timeout(NOTICE_WAIT, directory.put("/faults/b", b"2".to_vec(), None)).await {
        Ok(Err(DirectoryError::Unavailable { .. })) => {}
        other => bail!("a put to a dead etcd must be unavailable, got {other:?}"),
    }
    tokio::time::timeout(NOTICE_WAIT, session.lost())
        .await
        .map_err(|_| anyhow!("the session did not declare itself lost"))?;
    ensure!(session.state() == SessionState::Lost);
    // Lost only once a whole TTL passed since the last renewal answered
    // (which may be well before the kill, when a renewal was slow): never
    // while the lease is still certainly held, that is within a TTL (less
    // a margin) of when that renewal was sent.
    ensure!(
        !session.held().now(),
        "a session is lost only after a whole TTL without renewal (lost {:?} after the kill)",
        killed.elapsed()
    );
    Ok(())
}
