//! An idle cluster reads nothing from the directory: each host follows one
//! watch of the cluster's keys instead of listing them every tick, and
//! still sees hosts leave and volumes change through it.

use async_trait::async_trait;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_directory::{
    Directory, EmbeddedDirectory, Lease, LeaseId, Listing, Result, Revision, Txn, TxnOutcome,
    WatchStream,
};
use tessera_env::SystemClock;
use tessera_node::control::{ClusterControl, CreateVolume};
use tessera_node::up::{self, UpConfig};

/// The embedded directory, counting the reads made of it.
struct CountingDirectory {
    inner: EmbeddedDirectory,
    lists: AtomicU64,
    gets: AtomicU64,
    watches: AtomicU64,
}

#[async_trait]
impl Directory for CountingDirectory {
    async fn get(&self, key: &str) -> Result<Option<tessera_directory::KeyValue>> {
        self.gets.fetch_add(1, Ordering::Relaxed);
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Listing> {
        self.lists.fetch_add(1, Ordering::Relaxed);
        self.inner.list(prefix).await
    }
    async fn put(&self, key: &str, value: Vec<u8>, lease: Option<LeaseId>) -> Result<Revision> {
        self.inner.put(key, value, lease).await
    }
    async fn delete(&self, key: &str) -> Result<bool> {
        self.inner.delete(key).await
    }
    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        self.inner.txn(txn).await
    }
    async fn watch(&self, prefix: &str, from_revision: Revision) -> Result<WatchStream> {
        self.watches.fetch_add(1, Ordering::Relaxed);
        self.inner.watch(prefix, from_revision).await
    }
    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        self.inner.grant_lease(ttl).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        self.inner.keep_alive(lease).await
    }
    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.inner.revoke_lease(lease).await
    }
    async fn compact(&self, revision: Revision) -> Result<()> {
        self.inner.compact(revision).await
    }
}

impl CountingDirectory {
    fn reads(&self) -> (u64, u64) {
        (
            self.lists.load(Ordering::Relaxed),
            self.gets.load(Ordering::Relaxed),
        )
    }
}

async fn wait_until(what: &str, mut ok: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_cluster_reads_nothing_from_the_directory_and_still_sees_changes() {
    let dir = tempfile::tempdir().unwrap();
    let seed = std::process::id();
    let config = UpConfig {
        data_dir: dir.path().to_path_buf(),
        bind: Ipv4Addr::new(127, 30 + (seed % 150) as u8, (seed / 150 % 250) as u8, 1),
        hosts: 4,
        api_port: 20_000 + (seed % 20_000) as u16,
        nbd_port: 20_001 + (seed % 20_000) as u16,
        transport_port: 20_002 + (seed % 20_000) as u16,
        iscsi_port: 20_003 + (seed % 20_000) as u16,
        repair_delay_s: 3600,
        host_capacity_bytes: 1 << 30,
        fault_injection: false,
        kek_file: None,
    };
    let directory = Arc::new(CountingDirectory {
        inner: EmbeddedDirectory::open(
            &dir.path().join("directory.redb"),
            Arc::new(SystemClock::default()),
        )
        .await
        .unwrap(),
        lists: AtomicU64::new(0),
        gets: AtomicU64::new(0),
        watches: AtomicU64::new(0),
    });
    let control = up::start_on(&config, Arc::clone(&directory) as Arc<dyn Directory>)
        .await
        .expect("cluster starts");
    control
        .create_volume(CreateVolume {
            name: "idle".into(),
            size_bytes: 64 << 20,
            policy: None,
            block_bytes: None,
        })
        .await
        .unwrap();
    wait_until("an owner", async || {
        control.volume("idle").await.unwrap().owner.is_some()
    })
    .await;
    // Settle past a few ticks, then count over one idle minute (120 ticks
    // of every host's control loop).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = directory.reads();
    let watches = directory.watches.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let after = directory.reads();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (0, 0),
        "directory lists and gets over one idle minute"
    );
    assert_eq!(directory.watches.load(Ordering::Relaxed), watches);

    // Changes still reach every host, through the watch: a new volume gets
    // an owner, and a host that stops is seen gone by the others.
    control
        .create_volume(CreateVolume {
            name: "later".into(),
            size_bytes: 64 << 20,
            policy: None,
            block_bytes: None,
        })
        .await
        .unwrap();
    wait_until("an owner of the new volume", async || {
        control.volume("later").await.unwrap().owner.is_some()
    })
    .await;
    let owner = control.volume("idle").await.unwrap().owner.unwrap();
    control.stop_host(&owner).await.unwrap();
    wait_until("another owner after the owner stopped", async || {
        control
            .volume("idle")
            .await
            .unwrap()
            .owner
            .is_some_and(|o| o != owner)
    })
    .await;
    control.hosts().stop_all().await;
}
