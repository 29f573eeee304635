//! The behaviour every directory backend must show, written once and run
//! against each backend (`tests/embedded.rs`, `tests/etcd.rs`) through
//! [`directory_suite!`]. A backend's test file supplies an async function
//! `make(name, exclusive) -> Option<Env>`; `None` means the backend's tool is
//! missing and the test is skipped (the fixture decides, following
//! `TESSERA_REQUIRE_TOOLS`).

#![allow(dead_code)]

use anyhow::{anyhow, bail, ensure, Context, Result};
use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_directory::keys::{
    self, ComponentStateRecord, DiskGroupRecord, DiskGroupState, HostAddresses, HostDiskGroup,
    HostRecord, Keyspace, VolumeRecord, VolumeState,
};
use tessera_directory::{
    acquire_owner, current_owner, live_hosts, register_host, release_owner, Compare, Directory,
    DirectoryError, Txn, TxnOp, WatchEvent, WatchEventKind, WatchStream,
};
use tessera_types::layout::{ComponentPlacement, ComponentRole, ComponentState, Layout, Mirror};
use tessera_types::policy::Policy;
use tessera_types::{ComponentId, DiskGroupId, Epoch, FaultDomainId, HostId, PolicyName, VolumeId};

/// One test's directory and the names only it uses.
pub struct Env {
    /// The directory under test.
    pub directory: Arc<dyn Directory>,
    /// A key prefix no other test writes under, ending in `/`.
    pub prefix: String,
    /// A cluster name no other test uses.
    pub cluster: String,
    /// Whatever must live as long as the test (temp dirs, guards).
    pub keep: Box<dyn Any + Send>,
}

/// Time to live for the leases the suite lets lapse: short, so the suite is
/// fast, but well above etcd's minimum for the election timeout the fixture
/// sets.
pub const LEASE_TTL: Duration = Duration::from_secs(1);

/// How long the suite waits for a lapsed lease to take effect: the TTL plus
/// etcd's expiry check period (500 ms) plus slack for a loaded machine.
pub const EXPIRY_WAIT: Duration = Duration::from_secs(6);

/// How long the suite waits for one watch event.
pub const EVENT_WAIT: Duration = Duration::from_secs(5);

/// Generates one `#[tokio::test]` per suite case, each calling the backend's
/// fixture `$make`.
#[macro_export]
macro_rules! directory_suite {
    ($make:path) => {
        $crate::directory_suite!(@cases $make;
            kv_revisions, txn_compare_and_swap, txn_lease_attachment, watch_in_order,
            lease_expiry_deletes_keys, lease_keep_alive_and_revoke, concurrent_cas_counter,
            typed_records, typed_watch, owner_contenders, owner_epochs_rise, host_liveness,
            session_ttl_change);
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn watch_after_compaction() {
            if let Some(env) = $make("watch_after_compaction", true).await {
                suite::watch_after_compaction(env).await.unwrap();
            }
        }
    };
    (@cases $make:path; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                if let Some(env) = $make(stringify!($case), false).await {
                    suite::$case(env).await.unwrap();
                }
            }
        )*
    };
}

async fn next_event(watch: &mut WatchStream) -> Result<WatchEvent> {
    tokio::time::timeout(EVENT_WAIT, watch.recv())
        .await
        .map_err(|_| anyhow!("no watch event within {EVENT_WAIT:?}"))?
        .context("watch failed")
}

/// Polls `check` until it returns true or `limit` passes.
async fn wait_until<F, Fut>(limit: Duration, mut check: F) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if check().await? {
            return Ok(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("condition not met within {limit:?}")
}

/// Values, revisions, deletes and prefix listing.
pub async fn kv_revisions(env: Env) -> Result<()> {
    let d = &*env.directory;
    let p = &env.prefix;
    let a = format!("{p}a");
    let b = format!("{p}b");
    // A neighbour whose name extends the prefix's last component.
    let neighbour = format!("{}x/a", p.trim_end_matches('/'));

    let r1 = d.put(&a, b"one".to_vec(), None).await?;
    let got = d.get(&a).await?.context("a missing")?;
    ensure!(got.value == b"one" && got.create_revision == r1 && got.mod_revision == r1);
    ensure!(got.lease.is_none());

    let r2 = d.put(&a, b"two".to_vec(), None).await?;
    ensure!(r2 > r1, "revisions must grow: {r1} then {r2}");
    let got = d.get(&a).await?.context("a missing")?;
    ensure!(got.value == b"two" && got.create_revision == r1 && got.mod_revision == r2);

    let r3 = d.put(&b, b"bee".to_vec(), None).await?;
    d.put(&neighbour, b"not mine".to_vec(), None).await?;
    ensure!(r3 > r2);
    let listing = d.list(p).await?;
    let keys: Vec<&str> = listing.entries.iter().map(|e| e.key.as_str()).collect();
    ensure!(keys == [a.as_str(), b.as_str()], "listing {keys:?}");
    ensure!(listing.revision >= r3);

    ensure!(
        d.delete(&a).await?,
        "delete of an existing key reports it existed"
    );
    ensure!(!d.delete(&a).await?, "second delete finds nothing");
    ensure!(d.get(&a).await?.is_none());
    ensure!(d.list(&format!("{p}nothing/")).await?.entries.is_empty());

    // A key created again starts a new life.
    let r4 = d.put(&a, b"three".to_vec(), None).await?;
    let got = d.get(&a).await?.context("a missing")?;
    ensure!(got.create_revision == r4 && r4 > r3);
    Ok(())
}

/// Compare-and-swap on absence, mod revision and value; atomic multi-key
/// writes; the failure branch; a conflict is an outcome, not an error.
pub async fn txn_compare_and_swap(env: Env) -> Result<()> {
    let d = &*env.directory;
    let p = &env.prefix;
    let k = format!("{p}k");
    let put = |key: &str, value: &[u8]| TxnOp::Put {
        key: key.to_string(),
        value: value.to_vec(),
        lease: None,
    };

    let create = Txn::new()
        .when([Compare::Absent { key: k.clone() }])
        .and_then([put(&k, b"v1")]);
    let first = d.txn(create.clone()).await?;
    ensure!(first.succeeded);
    let second = d.txn(create).await?;
    ensure!(
        !second.succeeded,
        "creating an existing key must not succeed"
    );
    ensure!(d.get(&k).await?.context("k")?.value == b"v1");

    let current = d.get(&k).await?.context("k")?.mod_revision;
    let stale = Txn::new()
        .when([Compare::ModRevision {
            key: k.clone(),
            revision: current - 1,
        }])
        .and_then([put(&k, b"stale")]);
    ensure!(!d.txn(stale).await?.succeeded);
    let fresh = Txn::new()
        .when([Compare::ModRevision {
            key: k.clone(),
            revision: current,
        }])
        .and_then([put(&k, b"v2")]);
    let fresh = d.txn(fresh).await?;
    ensure!(fresh.succeeded && fresh.revision > current);

    let by_value = |expected: &[u8], new: &[u8]| {
        Txn::new()
            .when([Compare::Value {
                key: k.clone(),
                value: expected.to_vec(),
            }])
            .and_then([put(&k, new)])
    };
    ensure!(!d.txn(by_value(b"v1", b"x")).await?.succeeded);
    ensure!(d.txn(by_value(b"v2", b"v3")).await?.succeeded);
    ensure!(d.get(&k).await?.context("k")?.value == b"v3");

    // Several keys change at one revision, or none do.
    let x = format!("{p}x");
    let y = format!("{p}y");
    let blocked = Txn::new()
        .when([
            Compare::Absent { key: x.clone() },
            Compare::Absent { key: k.clone() },
        ])
        .and_then([
            put(&x, b"1"),
            put(&y, b"1"),
            TxnOp::Delete { key: k.clone() },
        ]);
    let outcome = d.txn(blocked).await?;
    ensure!(!outcome.succeeded);
    ensure!(d.get(&x).await?.is_none() && d.get(&y).await?.is_none());
    ensure!(
        d.get(&k).await?.is_some(),
        "a failed transaction writes nothing"
    );
    let together = Txn::new()
        .when([Compare::Absent { key: x.clone() }])
        .and_then([
            put(&x, b"1"),
            put(&y, b"1"),
            TxnOp::Delete { key: k.clone() },
        ]);
    let outcome = d.txn(together).await?;
    ensure!(outcome.succeeded);
    let gx = d.get(&x).await?.context("x")?;
    let gy = d.get(&y).await?.context("y")?;
    ensure!(gx.mod_revision == outcome.revision && gy.mod_revision == outcome.revision);
    ensure!(d.get(&k).await?.is_none());

    // The failure branch runs when a comparison fails.
    let fallback = Txn::new()
        .when([Compare::Absent { key: x.clone() }])
        .and_then([put(&y, b"then")])
        .or_else([put(&y, b"else")]);
    ensure!(!d.txn(fallback).await?.succeeded);
    ensure!(d.get(&y).await?.context("y")?.value == b"else");

    // Writing one key twice in a branch is refused by both backends.
    let twice = Txn::new().and_then([put(&x, b"1"), put(&x, b"2")]);
    match d.txn(twice).await {
        Err(DirectoryError::InvalidRequest { .. }) => {}
        other => bail!("writing one key twice must be refused, got {other:?}"),
    }
    Ok(())
}

/// Puts attach keys to leases inside transactions; a dead lease is an error.
pub async fn txn_lease_attachment(env: Env) -> Result<()> {
    let d = &*env.directory;
    let p = &env.prefix;
    let lease = d.grant_lease(Duration::from_secs(30)).await?;
    let k = format!("{p}leased");
    let outcome = d
        .txn(
            Txn::new()
                .when([Compare::Absent { key: k.clone() }])
                .and_then([TxnOp::Put {
                    key: k.clone(),
                    value: b"v".to_vec(),
                    lease: Some(lease.id),
                }]),
        )
        .await?;
    ensure!(outcome.succeeded);
    ensure!(d.get(&k).await?.context("k")?.lease == Some(lease.id));
    d.revoke_lease(lease.id).await?;
    ensure!(
        d.get(&k).await?.is_none(),
        "revoking a lease deletes its keys"
    );
    let again = d
        .txn(Txn::new().and_then([TxnOp::Put {
            key: k.clone(),
            value: b"v".to_vec(),
            lease: Some(lease.id),
        }]))
        .await;
    ensure!(
        matches!(again, Err(DirectoryError::LeaseNotFound { .. })),
        "a put on a revoked lease must fail, got {again:?}"
    );
    let plain = d.put(&k, b"v".to_vec(), Some(lease.id)).await;
    ensure!(matches!(plain, Err(DirectoryError::LeaseNotFound { .. })));
    ensure!(d.get(&k).await?.is_none());
    Ok(())
}

/// A watch sees every change under its prefix, in order, with the right
/// revisions, and a second watch replays the same history.
pub async fn watch_in_order(env: Env) -> Result<()> {
    let d = &*env.directory;
    let p = &env.prefix;
    let start = d.list(p).await?.revision;
    let mut live = d.watch(p, 0).await?;
    let outside = format!("{}-other/k", p.trim_end_matches('/'));

    let mut expected = Vec::new();
    let r = d.put(&format!("{p}a"), b"1".to_vec(), None).await?;
    expected.push((WatchEventKind::Put, format!("{p}a"), r));
    d.put(&outside, b"x".to_vec(), None).await?;
    let r = d.put(&format!("{p}b"), b"2".to_vec(), None).await?;
    expected.push((WatchEventKind::Put, format!("{p}b"), r));
    let r = d.put(&format!("{p}a"), b"3".to_vec(), None).await?;
    expected.push((WatchEventKind::Put, format!("{p}a"), r));
    // A delete through a transaction, whose outcome carries its revision.
    let deleted = d
        .txn(Txn::new().and_then([TxnOp::Delete {
            key: format!("{p}a"),
        }]))
        .await?;
    ensure!(deleted.succeeded && deleted.revision > r);
    expected.push((WatchEventKind::Delete, format!("{p}a"), deleted.revision));
    let outcome = d
        .txn(Txn::new().and_then([
            TxnOp::Put {
                key: format!("{p}c"),
                value: b"4".to_vec(),
                lease: None,
            },
            TxnOp::Put {
                key: format!("{p}d"),
                value: b"5".to_vec(),
                lease: None,
            },
        ]))
        .await?;
    expected.push((WatchEventKind::Put, format!("{p}c"), outcome.revision));
    expected.push((WatchEventKind::Put, format!("{p}d"), outcome.revision));

    let mut replay = d.watch(p, start + 1).await?;
    for watch in [&mut live, &mut replay] {
        for (kind, key, revision) in &expected {
            let event = next_event(watch).await?;
            ensure!(
                event.kind == *kind && event.kv.key == *key && event.kv.mod_revision == *revision,
                "expected {kind:?} {key} at {revision}, got {event:?}"
            );
            if *kind == WatchEventKind::Put {
                ensure!(!event.kv.value.is_empty());
            }
        }
    }
    // Nothing else (in particular not the key outside the prefix) is pending.
    let extra = tokio::time::timeout(Duration::from_millis(300), live.recv()).await;
    ensure!(extra.is_err(), "unexpected event {extra:?}");
    Ok(())
}

/// A watch from compacted history reports it; listing again and watching
/// from the listing's revision recovers.
pub async fn watch_after_compaction(env: Env) -> Result<()> {
    let d = &*env.directory;
    let p = &env.prefix;
    let k = format!("{p}k");
    let first = d.put(&k, b"1".to_vec(), None).await?;
    d.put(&k, b"2".to_vec(), None).await?;
    let last = d.put(&k, b"3".to_vec(), None).await?;
    d.compact(last).await?;
    d.compact(last).await?; // again: not an error
    match d.compact(last + 1_000_000_000).await {
        Err(DirectoryError::InvalidRequest { .. }) => {}
        other => bail!("compacting to a future revision must be refused, got {other:?}"),
    }
    let mut stale = d.watch(p, first).await?;
    match tokio::time::timeout(EVENT_WAIT, stale.recv()).await {
        Ok(Err(DirectoryError::Compacted { requested, .. })) => ensure!(requested == first),
        other => bail!("a watch from compacted history must report it, got {other:?}"),
    }
    // The stream stays ended.
    ensure!(matches!(
        stale.recv().await,
        Err(DirectoryError::WatchClosed { .. })
    ));
    let listing = d.list(p).await?;
    ensure!(listing.entries.len() == 1 && listing.entries[0].value == b"3");
    let mut fresh = d.watch(p, listing.revision + 1).await?;
    let r = d.put(&k, b"4".to_vec(), None).await?;
    let event = next_event(&mut fresh).await?;
    ensure!(event.kv.mod_revision == r && event.kv.value == b"4");
    Ok(())
}

/// Keys on a lease that nobody renews vanish after its time to live, and
/// watchers see the delete; keys without the lease stay.
pub async fn lease_expiry_deletes_keys(env: Env) -> Result<()> {
    let d = &*env.directory;
    let p = &env.prefix;
    let lease = d.grant_lease(LEASE_TTL).await?;
    ensure!(lease.ttl >= LEASE_TTL);
    let leased = format!("{p}leased");
    let kept = format!("{p}kept");
    let mut watch = d.watch(p, 0).await?;
    d.put(&leased, b"x".to_vec(), Some(lease.id)).await?;
    d.put(&kept, b"y".to_vec(), None).await?;
    let granted = Instant::now();
    ensure!(d.get(&leased).await?.context("leased")?.lease == Some(lease.id));

    let waited = wait_until(EXPIRY_WAIT, || async {
        Ok(d.get(&leased).await?.is_none())
    })
    .await?;
    ensure!(
        granted.elapsed() >= LEASE_TTL / 2,
        "lease ended after {waited:?}, well before its TTL"
    );
    ensure!(
        d.get(&kept).await?.is_some(),
        "a key without the lease stays"
    );

    let mut seen_delete = false;
    for _ in 0..3 {
        let event = next_event(&mut watch).await?;
        if event.kind == WatchEventKind::Delete {
            ensure!(
                event.kv.key == leased,
                "only the leased key is deleted: {event:?}"
            );
            seen_delete = true;
            break;
        }
    }
    ensure!(seen_delete, "the watcher must see the expiry as a delete");
    let renewed = d.keep_alive(lease.id).await;
    ensure!(
        matches!(renewed, Err(DirectoryError::LeaseNotFound { .. })),
        "an expired lease cannot be renewed, got {renewed:?}"
    );
    Ok(())
}

/// Renewals keep a lease alive past its TTL; revoking ends it at once.
pub async fn lease_keep_alive_and_revoke(env: Env) -> Result<()> {
    let d = &*env.directory;
    let p = &env.prefix;
    let lease = d.grant_lease(LEASE_TTL).await?;
    let k = format!("{p}k");
    d.put(&k, b"x".to_vec(), Some(lease.id)).await?;
    let start = Instant::now();
    while start.elapsed() < LEASE_TTL * 3 {
        d.keep_alive(lease.id).await?;
        tokio::time::sleep(LEASE_TTL / 4).await;
    }
    ensure!(d.get(&k).await?.is_some(), "a renewed lease keeps its keys");
    d.revoke_lease(lease.id).await?;
    ensure!(
        d.get(&k).await?.is_none(),
        "revoking deletes the keys at once"
    );
    ensure!(matches!(
        d.keep_alive(lease.id).await,
        Err(DirectoryError::LeaseNotFound { .. })
    ));
    ensure!(matches!(
        d.revoke_lease(lease.id).await,
        Err(DirectoryError::LeaseNotFound { .. })
    ));
    Ok(())
}

/// Many concurrent read-modify-write loops on one counter lose no update.
pub async fn concurrent_cas_counter(env: Env) -> Result<()> {
    const WRITERS: usize = 6;
    const INCREMENTS: usize = 15;
    const ATTEMPTS_MAX: usize = 1000;
    let key = format!("{}counter", env.prefix);
    env.directory.put(&key, b"0".to_vec(), None).await?;
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let d = env.directory.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut revisions = Vec::new();
            let mut attempts = 0;
            while revisions.len() < INCREMENTS {
                attempts += 1;
                ensure!(attempts < ATTEMPTS_MAX, "too many conflicts");
                let current = d.get(&key).await?.context("counter")?;
                let n: u64 = std::str::from_utf8(&current.value)?.parse()?;
                let outcome = d
                    .txn(
                        Txn::new()
                            .when([Compare::ModRevision {
                                key: key.clone(),
                                revision: current.mod_revision,
                            }])
                            .and_then([TxnOp::Put {
                                key: key.clone(),
                                value: (n + 1).to_string().into_bytes(),
                                lease: None,
                            }]),
                    )
                    .await?;
                if outcome.succeeded {
                    revisions.push(outcome.revision);
                }
            }
            anyhow::Ok(revisions)
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await??);
    }
    let value = env.directory.get(&key).await?.context("counter")?.value;
    ensure!(value == (WRITERS * INCREMENTS).to_string().as_bytes());
    all.sort();
    all.dedup();
    ensure!(
        all.len() == WRITERS * INCREMENTS,
        "each success has its own revision"
    );
    Ok(())
}

fn host_record(id: &str, fd: &str, port: u16) -> HostRecord {
    let addr = |p: u16| format!("127.0.0.1:{p}").parse().unwrap();
    HostRecord {
        id: HostId::new(id).unwrap(),
        fault_domain: FaultDomainId::new(fd).unwrap(),
        addresses: HostAddresses {
            transport: addr(port),
            nbd: addr(10809),
            iscsi: addr(3260),
            api: addr(9480),
        },
        disk_groups: vec![HostDiskGroup {
            id: DiskGroupId::new("dg0").unwrap(),
            capacity_bytes: 100 << 30,
        }],
        witness_only: false,
    }
}

fn placement(id: u64, host: &str, role: ComponentRole) -> ComponentPlacement {
    ComponentPlacement {
        id: ComponentId(id),
        role,
        host: HostId::new(host).unwrap(),
        disk_group: DiskGroupId::new("dg0").unwrap(),
        fault_domain: FaultDomainId::new(format!("fd-{host}")).unwrap(),
        votes: 1,
        size_bytes: if role == ComponentRole::Data {
            1 << 30
        } else {
            0
        },
        state: ComponentState::Active,
    }
}

/// Every record type goes through its typed key and comes back equal; typed
/// compare-and-swap; bad stored values are decode errors naming the key.
pub async fn typed_records(env: Env) -> Result<()> {
    let d = &*env.directory;
    let ks = Keyspace::new(&env.cluster)?;
    let volume = VolumeId::new("db")?;
    let h1 = host_record("h1", "fd-a", 7001);

    keys::put(d, &ks.host(&h1.id), &h1, None).await?;
    ensure!(keys::get(d, &ks.host(&h1.id)).await?.context("host")?.value == h1);

    let policy = Policy::new(PolicyName::new("gold")?, 1);
    keys::put(d, &ks.policy(&policy.name), &policy, None).await?;
    ensure!(
        keys::get(d, &ks.policy(&policy.name))
            .await?
            .context("policy")?
            .value
            == policy
    );

    let record = VolumeRecord {
        name: volume.clone(),
        size_bytes: 1 << 30,
        policy: policy.name.clone(),
        state: VolumeState::Creating,
        created_ms: 1_700_000_000_000,
        reserved_bytes: 0,
        block_bytes: 512,
        fill: None,
    };
    let outcome = keys::cas(d, &ks.volume(&volume), None, &record, None).await?;
    ensure!(outcome.succeeded);
    ensure!(
        !keys::cas(d, &ks.volume(&volume), None, &record, None)
            .await?
            .succeeded,
        "a second create of the same volume must lose"
    );
    let stored = keys::get(d, &ks.volume(&volume)).await?.context("volume")?;
    let ready = VolumeRecord {
        state: VolumeState::Ready,
        ..record.clone()
    };
    ensure!(
        keys::cas(
            d,
            &ks.volume(&volume),
            Some(stored.mod_revision),
            &ready,
            None
        )
        .await?
        .succeeded
    );
    ensure!(
        !keys::cas(
            d,
            &ks.volume(&volume),
            Some(stored.mod_revision),
            &record,
            None
        )
        .await?
        .succeeded,
        "an update from a stale read must lose"
    );
    ensure!(
        keys::get(d, &ks.volume(&volume))
            .await?
            .context("volume")?
            .value
            .state
            == VolumeState::Ready
    );

    let layout = Layout {
        volume: volume.clone(),
        size_bytes: 1 << 30,
        stripe_unit_bytes: tessera_types::layout::STRIPE_UNIT_BYTES,
        columns: vec![Mirror {
            copies: vec![
                placement(1, "h1", ComponentRole::Data),
                placement(2, "h2", ComponentRole::Data),
            ],
        }],
        witnesses: vec![placement(3, "h3", ComponentRole::Witness)],
        generation: 1,
    };
    keys::put(d, &ks.layout(&volume), &layout, None).await?;
    ensure!(
        keys::get(d, &ks.layout(&volume))
            .await?
            .context("layout")?
            .value
            == layout
    );

    for c in layout.components() {
        let state = ComponentStateRecord {
            volume: volume.clone(),
            component: c.id,
            state: ComponentState::Active,
            dirty_bytes: 0,
            resync: None,
            epoch: Epoch(1),
            updated_ms: 1,
        };
        keys::put(d, &ks.component_state(&volume, c.id), &state, None).await?;
    }
    let states = keys::list(d, &ks.component_states_of(&volume)).await?;
    let ids: Vec<ComponentId> = states.records.iter().map(|r| r.value.component).collect();
    ensure!(
        ids == [ComponentId(1), ComponentId(2), ComponentId(3)],
        "{ids:?}"
    );

    let dg = DiskGroupRecord {
        host: h1.id.clone(),
        id: DiskGroupId::new("dg0")?,
        state: DiskGroupState::Healthy,
        capacity_bytes: 100 << 30,
        used_bytes: 4096,
        reserved_bytes: 0,
        failed_components: Vec::new(),
        encryption: None,
    };
    keys::put(d, &ks.disk_group(&h1.id, &dg.id), &dg, None).await?;
    let dgs = keys::list(d, &ks.disk_groups_of(&h1.id)).await?;
    ensure!(dgs.records.len() == 1 && dgs.records[0].value == dg);

    // Another cluster's keyspace sees none of it.
    let other = Keyspace::new(&format!("{}-other", env.cluster))?;
    ensure!(keys::list(d, &other.volumes()).await?.records.is_empty());

    // A value that is not the record is an error that names the key.
    let bad_key = ks.volume(&VolumeId::new("broken")?);
    d.put(bad_key.as_str(), b"{not json".to_vec(), None).await?;
    match keys::get(d, &bad_key).await {
        Err(DirectoryError::Decode { key, .. }) => ensure!(key == bad_key.as_str()),
        other => bail!("expected a decode error, got {other:?}"),
    }
    match keys::list(d, &ks.volumes()).await {
        Err(DirectoryError::Decode { key, .. }) => ensure!(key == bad_key.as_str()),
        other => bail!("expected a decode error, got {other:?}"),
    }
    Ok(())
}

/// Two hosts racing for the same volumes: exactly one wins each.
pub async fn owner_contenders(env: Env) -> Result<()> {
    let ks = Keyspace::new(&env.cluster)?;
    let l1 = env.directory.grant_lease(Duration::from_secs(30)).await?;
    let l2 = env.directory.grant_lease(Duration::from_secs(30)).await?;
    let h1 = HostId::new("h1")?;
    let h2 = HostId::new("h2")?;
    for i in 0..8 {
        let volume = VolumeId::new(format!("vol{i}"))?;
        let (a, b) = tokio::join!(
            acquire_owner(&*env.directory, &ks, &volume, &h1, l1.id),
            acquire_owner(&*env.directory, &ks, &volume, &h2, l2.id),
        );
        let winner = match (a, b) {
            (Ok(w), Err(DirectoryError::OwnerHeld { owner, epoch, .. }))
            | (Err(DirectoryError::OwnerHeld { owner, epoch, .. }), Ok(w)) => {
                ensure!(owner == w.host.as_str() && epoch == w.epoch);
                w
            }
            other => bail!("exactly one contender must win volume {volume}: {other:?}"),
        };
        ensure!(winner.epoch == Epoch(1));
        let current = current_owner(&*env.directory, &ks, &volume).await?;
        ensure!(current.as_ref() == Some(&winner));
        // Asking again under the same lease is not a new ownership.
        let again =
            acquire_owner(&*env.directory, &ks, &volume, &winner.host, winner.lease).await?;
        ensure!(again == winner);
    }
    Ok(())
}

/// Epochs rise across every change of owner, including one caused by a
/// lapsed lease, and never go back.
pub async fn owner_epochs_rise(env: Env) -> Result<()> {
    let d = &*env.directory;
    let ks = Keyspace::new(&env.cluster)?;
    let volume = VolumeId::new("db")?;
    let h1 = HostId::new("h1")?;
    let h2 = HostId::new("h2")?;
    let long1 = d.grant_lease(Duration::from_secs(30)).await?;
    let long2 = d.grant_lease(Duration::from_secs(30)).await?;

    let first = acquire_owner(d, &ks, &volume, &h1, long1.id).await?;
    ensure!(first.epoch == Epoch(1));
    ensure!(release_owner(d, &ks, &first).await?);
    ensure!(!release_owner(d, &ks, &first).await?, "released twice");
    let second = acquire_owner(d, &ks, &volume, &h2, long2.id).await?;
    ensure!(second.epoch == Epoch(2));
    // A stale release cannot remove the successor.
    ensure!(!release_owner(d, &ks, &first).await?);
    ensure!(current_owner(d, &ks, &volume).await? == Some(second.clone()));

    // h2's owner lease lapses (nobody renews it): h1 takes over at epoch 3.
    d.revoke_lease(long2.id).await?;
    let short = d.grant_lease(LEASE_TTL).await?;
    let third = acquire_owner(d, &ks, &volume, &h2, short.id).await?;
    ensure!(third.epoch == Epoch(3));
    match acquire_owner(d, &ks, &volume, &h1, long1.id).await {
        Err(DirectoryError::OwnerHeld { owner, epoch, .. }) => {
            ensure!(owner == "h2" && epoch == Epoch(3))
        }
        other => bail!("a live owner must keep the volume, got {other:?}"),
    }
    wait_until(EXPIRY_WAIT, || async {
        Ok(current_owner(d, &ks, &volume).await?.is_none())
    })
    .await?;
    let fourth = acquire_owner(d, &ks, &volume, &h1, long1.id).await?;
    ensure!(
        fourth.epoch == Epoch(4),
        "after a lapsed lease the next owner gets epoch + 1, got {}",
        fourth.epoch
    );

    // A host whose lease is gone cannot take ownership.
    d.revoke_lease(long1.id).await?;
    match acquire_owner(d, &ks, &volume, &h2, long1.id).await {
        Err(DirectoryError::LeaseNotFound { .. }) => {}
        other => bail!("acquiring with a dead lease must fail, got {other:?}"),
    }
    Ok(())
}

/// Registered hosts are live while their session renews; a crashed host's
/// liveness key disappears after the TTL, a stopped host's at once; the
/// inventory record stays.
pub async fn host_liveness(env: Env) -> Result<()> {
    let d = env.directory.clone();
    let ks = Keyspace::new(&env.cluster)?;
    let s1 = register_host(d.clone(), &ks, host_record("h1", "fd-a", 7001), LEASE_TTL).await?;
    let s2 = register_host(d.clone(), &ks, host_record("h2", "fd-b", 7002), LEASE_TTL).await?;
    let s3 = register_host(d.clone(), &ks, host_record("h3", "fd-c", 7003), LEASE_TTL).await?;
    let names = |hosts: Vec<HostId>| hosts.into_iter().map(|h| h.0).collect::<Vec<_>>();
    ensure!(names(live_hosts(&*d, &ks).await?) == ["h1", "h2", "h3"]);

    // Renewal keeps them live well past the TTL.
    tokio::time::sleep(LEASE_TTL * 3).await;
    ensure!(names(live_hosts(&*d, &ks).await?) == ["h1", "h2", "h3"]);
    ensure!(s1.state() == tessera_directory::membership::SessionState::Live);

    // h2 crashes: it stops renewing and disappears after its TTL.
    drop(s2);
    let crashed = Instant::now();
    wait_until(EXPIRY_WAIT, || async {
        Ok(names(live_hosts(&*d, &ks).await?) == ["h1", "h3"])
    })
    .await?;
    ensure!(crashed.elapsed() >= LEASE_TTL / 3, "h2 vanished too early");
    let inventory = keys::list(&*d, &ks.hosts()).await?;
    ensure!(
        inventory.records.len() == 3,
        "an absent host keeps its inventory"
    );

    // h3 leaves cleanly: gone at once.
    s3.stop().await?;
    ensure!(names(live_hosts(&*d, &ks).await?) == ["h1"]);

    // Someone revokes h1's lease: its session notices.
    d.revoke_lease(s1.lease()).await?;
    tokio::time::timeout(EXPIRY_WAIT, s1.lost())
        .await
        .map_err(|_| anyhow!("the session did not notice its lease was gone"))?;
    ensure!(live_hosts(&*d, &ks).await?.is_empty());
    Ok(())
}

/// A session's time to live changes while the host stays live: its
/// liveness key, owner key and open-volume record move to the new lease
/// (the owner record naming it, its epoch kept), the old lease is revoked,
/// the new one is renewed past its own time to live, and when the host
/// crashes its keys go after the new time to live; a key another writer
/// changed meanwhile makes the change refuse with nothing moved.
pub async fn session_ttl_change(env: Env) -> Result<()> {
    let d = env.directory.clone();
    let ks = Keyspace::new(&env.cluster)?;
    let host = HostId("h1".into());
    let session = register_host(
        d.clone(),
        &ks,
        host_record("h1", "fd-a", 7001),
        LEASE_TTL * 4,
    )
    .await?;
    let old = session.lease();
    let volume = VolumeId::new("v1")?;
    let owned = acquire_owner(&*d, &ks, &volume, &host, old).await?;
    let open = keys::AttachmentRecord {
        host: host.clone(),
        volumes: [(volume.clone(), 1)].into_iter().collect(),
    };
    keys::put(&*d, &ks.attachments(&host), &open, Some(old)).await?;
    // Another host's owner key on a lease of its own stays where it is.
    let other_lease = d.grant_lease(LEASE_TTL * 10).await?;
    let other = VolumeId::new("v2")?;
    acquire_owner(&*d, &ks, &other, &HostId("h2".into()), other_lease.id).await?;

    ensure!(
        !session.change_ttl(&ks, LEASE_TTL * 4).await?,
        "same TTL: no move"
    );
    ensure!(session.change_ttl(&ks, LEASE_TTL).await?);
    let new = session.lease();
    ensure!(new != old && session.ttl() == LEASE_TTL);
    let owner = keys::get(&*d, &ks.owner(&volume)).await?.context("owner")?;
    ensure!(owner.value.lease == new && owner.lease == Some(new));
    ensure!(
        owner.value.epoch == owned.epoch,
        "ownership moved without a new epoch"
    );
    let liveness = keys::get(&*d, &ks.liveness(&host))
        .await?
        .context("liveness")?;
    ensure!(liveness.value.lease == new && liveness.lease == Some(new));
    let attached = keys::get(&*d, &ks.attachments(&host))
        .await?
        .context("open")?;
    ensure!(attached.lease == Some(new) && attached.value == open);
    let untouched = keys::get(&*d, &ks.owner(&other)).await?.context("other")?;
    ensure!(untouched.lease == Some(other_lease.id));
    ensure!(d.keep_alive(old).await.is_err(), "the old lease is revoked");
    // Acquiring again under the new lease is the same ownership.
    ensure!(acquire_owner(&*d, &ks, &volume, &host, new).await?.epoch == owned.epoch);

    // Renewed past its own time to live.
    tokio::time::sleep(LEASE_TTL * 3).await;
    ensure!(session.state() == tessera_directory::membership::SessionState::Live);
    ensure!(session.held().now());
    ensure!(keys::get(&*d, &ks.owner(&volume)).await?.is_some());

    // A key changed by another writer between the read and the move: the
    // move refuses, and everything stays on the lease it was on.
    let before = session.lease();
    let moved = {
        let change = session.change_ttl(&ks, LEASE_TTL * 2);
        keys::put(&*d, &ks.attachments(&host), &open, Some(before)).await?;
        change.await?
    };
    // Depending on the order, the move either saw the new revision or not;
    // either way every key sits on the session's lease.
    let now = session.lease();
    ensure!(moved == (now != before));
    for lease in [
        keys::get(&*d, &ks.owner(&volume))
            .await?
            .context("owner")?
            .lease,
        keys::get(&*d, &ks.liveness(&host))
            .await?
            .context("liveness")?
            .lease,
        keys::get(&*d, &ks.attachments(&host))
            .await?
            .context("open")?
            .lease,
    ] {
        ensure!(lease == Some(now), "a key left on another lease");
    }

    // The host crashes: its keys go after the time to live it has now.
    let ttl = session.ttl();
    drop(session);
    let crashed = Instant::now();
    wait_until(EXPIRY_WAIT, || async {
        Ok(keys::get(&*d, &ks.owner(&volume)).await?.is_none())
    })
    .await?;
    ensure!(
        crashed.elapsed() >= ttl / 3,
        "the owner key vanished too early"
    );
    ensure!(live_hosts(&*d, &ks).await?.is_empty());
    Ok(())
}

/// A typed watch decodes puts, reports deletes, and survives a bad value.
pub async fn typed_watch(env: Env) -> Result<()> {
    let d = &*env.directory;
    let ks = Keyspace::new(&env.cluster)?;
    let start = keys::list(d, &ks.volumes()).await?;
    ensure!(start.records.is_empty());
    let mut watch = keys::watch(d, &ks.volumes(), start.revision + 1).await?;
    let volume = VolumeId::new("web")?;
    let record = VolumeRecord {
        name: volume.clone(),
        size_bytes: 4 << 30,
        policy: PolicyName::new("default")?,
        state: VolumeState::Ready,
        created_ms: 7,
        reserved_bytes: 0,
        block_bytes: 512,
        fill: None,
    };
    let put = keys::put(d, &ks.volume(&volume), &record, None).await?;
    let broken = ks.volume(&VolumeId::new("broken")?);
    d.put(broken.as_str(), b"[]".to_vec(), None).await?;
    keys::delete(d, &ks.volume(&volume)).await?;
    match next_record(&mut watch).await? {
        Ok(keys::RecordChange::Put(r)) => ensure!(r.value == record && r.mod_revision == put),
        other => bail!("expected the volume's put, got {other:?}"),
    }
    match next_record(&mut watch).await? {
        Err(DirectoryError::Decode { key, .. }) => ensure!(key == broken.as_str()),
        other => bail!("expected a decode error for the bad value, got {other:?}"),
    }
    match next_record(&mut watch).await? {
        Ok(keys::RecordChange::Delete { key, revision }) => {
            ensure!(key == ks.volume(&volume).as_str() && revision > put)
        }
        other => bail!("expected the volume's delete, got {other:?}"),
    }
    Ok(())
}

async fn next_record(
    watch: &mut keys::RecordWatch<VolumeRecord>,
) -> Result<Result<keys::RecordChange<VolumeRecord>, DirectoryError>> {
    tokio::time::timeout(EVENT_WAIT, watch.recv())
        .await
        .map_err(|_| anyhow!("no typed event within {EVENT_WAIT:?}"))
}
