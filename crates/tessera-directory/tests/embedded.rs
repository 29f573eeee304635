//! The shared directory suite against the embedded (redb) backend, plus what
//! only the embedded backend promises: revisions and data survive a restart,
//! leases of an earlier process end at reopen, lease expiry follows the
//! injected clock, and a reader that falls behind is told so.

mod suite;

use anyhow::{bail, ensure, Context, Result};
use std::sync::Arc;
use std::time::Duration;
use suite::Env;
use tessera_directory::{Directory, DirectoryError, EmbeddedDirectory, WatchEventKind};
use tessera_env::{Clock, ManualClock, SystemClock};

async fn make(name: &str, _exclusive: bool) -> Option<Env> {
    let dir = tempfile::tempdir().expect("temp dir");
    let directory = EmbeddedDirectory::open(
        dir.path().join("directory.redb"),
        Arc::new(SystemClock::default()),
    )
    .await
    .expect("open embedded directory");
    Some(Env {
        directory: Arc::new(directory),
        prefix: format!("/test/{name}/"),
        cluster: name.replace('_', "-"),
        keep: Box::new(dir),
    })
}

directory_suite!(make);

#[tokio::test]
async fn revisions_and_data_survive_restart_and_leases_do_not() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("directory.redb");
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::default());
    let (last, kept_created) = {
        let d = EmbeddedDirectory::open(&path, clock.clone()).await?;
        let lease = d.grant_lease(Duration::from_secs(60)).await?;
        let r = d.put("/k/kept", b"kept".to_vec(), None).await?;
        d.put("/k/leased", b"leased".to_vec(), Some(lease.id))
            .await?;
        let last = d.put("/k/kept", b"kept2".to_vec(), None).await?;
        (last, r)
    };
    let d = EmbeddedDirectory::open(&path, clock.clone()).await?;
    let kept = d
        .get("/k/kept")
        .await?
        .context("kept key lost in restart")?;
    ensure!(
        kept.value == b"kept2" && kept.mod_revision == last && kept.create_revision == kept_created
    );
    ensure!(
        d.get("/k/leased").await?.is_none(),
        "a key on a lease of the previous process must be gone"
    );
    // Removing it was a change: the revision moved past the last one.
    let listing = d.list("/k/").await?;
    ensure!(listing.revision > last);
    let next = d.put("/k/new", b"n".to_vec(), None).await?;
    ensure!(
        next > listing.revision,
        "revisions keep growing after a restart"
    );
    // History from before the restart is gone, and the watch says so.
    let mut watch = d.watch("/k/", last).await?;
    match watch.recv().await {
        Err(DirectoryError::Compacted { .. }) => {}
        other => bail!(
            "a watch into the previous process's history must report compaction, got {other:?}"
        ),
    }
    // Lease ids are not reused after a restart.
    let fresh = d.grant_lease(Duration::from_secs(5)).await?;
    ensure!(fresh.id.0 > 1);
    Ok(())
}

#[tokio::test]
async fn lease_expiry_follows_the_injected_clock() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::default();
    let d = EmbeddedDirectory::open(dir.path().join("d.redb"), Arc::new(clock.clone())).await?;
    let lease = d.grant_lease(Duration::from_secs(10)).await?;
    d.put("/m/k", b"v".to_vec(), Some(lease.id)).await?;
    let mut watch = d.watch("/m/", 0).await?;

    // Real time passing does nothing; clock time up to the TTL does nothing.
    tokio::time::sleep(Duration::from_millis(200)).await;
    clock.advance(Duration::from_secs(9));
    d.expire_leases().await?;
    ensure!(d.get("/m/k").await?.is_some());
    d.keep_alive(lease.id).await?;
    clock.advance(Duration::from_secs(9));
    ensure!(d.get("/m/k").await?.is_some(), "a renewal restarts the TTL");

    clock.advance(Duration::from_secs(2));
    ensure!(
        d.get("/m/k").await?.is_none(),
        "past the TTL the key is gone"
    );
    let event = tokio::time::timeout(Duration::from_secs(2), watch.recv()).await??;
    ensure!(event.kind == WatchEventKind::Delete && event.kv.key == "/m/k");
    ensure!(matches!(
        d.keep_alive(lease.id).await,
        Err(DirectoryError::LeaseNotFound { .. })
    ));
    Ok(())
}

#[tokio::test]
async fn a_reader_that_falls_behind_is_told_to_list_again() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = EmbeddedDirectory::open(dir.path().join("d.redb"), Arc::new(SystemClock::default()))
        .await?;
    let mut slow = d.watch("/w/", 0).await?;
    let ops = (0..tessera_directory::WATCH_QUEUE_EVENTS_MAX + 10)
        .map(|i| tessera_directory::TxnOp::Put {
            key: format!("/w/{i:05}"),
            value: b"x".to_vec(),
            lease: None,
        })
        .collect::<Vec<_>>();
    d.txn(tessera_directory::Txn::new().and_then(ops)).await?;
    let mut delivered = 0;
    loop {
        match slow.recv().await {
            Ok(_) => delivered += 1,
            Err(DirectoryError::WatchLagged { prefix }) => {
                ensure!(prefix == "/w/");
                break;
            }
            Err(e) => bail!("expected a lag report, got {e}"),
        }
    }
    ensure!(delivered == tessera_directory::WATCH_QUEUE_EVENTS_MAX);
    // Listing again gives everything.
    ensure!(d.list("/w/").await?.entries.len() == tessera_directory::WATCH_QUEUE_EVENTS_MAX + 10);
    Ok(())
}

#[tokio::test]
async fn a_file_that_cannot_be_a_database_is_a_storage_error() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("garbage.redb");
    std::fs::write(&path, vec![0x5a; 8192])?;
    match EmbeddedDirectory::open(&path, Arc::new(SystemClock::default())).await {
        Err(DirectoryError::Storage { path: p, .. }) => ensure!(p.contains("garbage.redb")),
        other => bail!("expected a storage error, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn a_configuration_names_the_backend() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let text = format!(
        r#"{{"backend":"embedded","path":{:?}}}"#,
        dir.path().join("d.redb")
    );
    let config: tessera_directory::DirectoryConfig = serde_json::from_str(&text)?;
    let d = tessera_directory::open(&config, Arc::new(SystemClock::default())).await?;
    let r = d.put("/c/k", b"v".to_vec(), None).await?;
    ensure!(d.get("/c/k").await?.context("k")?.mod_revision == r);
    let etcd: tessera_directory::DirectoryConfig =
        serde_json::from_str(r#"{"backend":"etcd","endpoints":["http://127.0.0.1:2379"]}"#)?;
    ensure!(
        matches!(etcd, tessera_directory::DirectoryConfig::Etcd { ref endpoints, .. } if endpoints.len() == 1)
    );
    Ok(())
}
