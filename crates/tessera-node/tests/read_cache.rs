//! The host read cache in a four-host cluster in one process: the owner
//! of a volume serves a second read from its memory and counts it in
//! `host show` and `object show`; a write through another host reaches the
//! owner's coordinator and replaces what it cached; the setting
//! `read_cache_bytes` resizes every host's cache at once and refuses more
//! than half a host's memory.

mod fixture;

use bytes::Bytes;
use fixture::{owner_and_other, Cluster};
use std::sync::Arc;
use tessera_blockdev::{BlockDevice, WriteFlags, ZeroMode};
use tessera_node::control::{ClusterControl, ControlError, UpdateSettings};
use tessera_node::host::Host;

fn host(cluster: &Cluster, id: &str) -> Arc<Host> {
    cluster
        .control
        .hosts()
        .running()
        .into_iter()
        .find(|h| h.id().as_str() == id)
        .expect("the host runs")
}

fn fill(seed: u8, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| seed.wrapping_add((i % 241) as u8) | 1)
            .collect::<Vec<u8>>(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_owner_caches_reads_and_a_write_through_another_host_replaces_them() {
    let cluster = Cluster::start(3600).await;
    let view = cluster.create("rc", 64 << 20).await;
    let (owner_id, other_id) = owner_and_other(&view);
    let owner = host(&cluster, &owner_id);
    let other = host(&cluster, &other_id);
    let start = owner.read_cache().stats();
    assert!(start.budget_bytes > 0, "on by default: {start:?}");
    assert!(start.budget_bytes <= 1 << 30);

    // Through the owner's own handle (as its NBD server has it).
    let local = owner.open_volume("rc").expect("the owner serves rc");
    let data = fill(1, 1 << 20);
    local
        .write(0, data.clone(), WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(local.read(0, 1 << 20).await.unwrap(), data);
    let after_first = owner.read_cache().stats();
    assert_eq!(after_first.hits, start.hits);
    assert!(after_first.misses >= start.misses + 256, "{after_first:?}");
    assert_eq!(local.read(0, 1 << 20).await.unwrap(), data);
    let after_second = owner.read_cache().stats();
    assert_eq!(
        after_second.hits,
        after_first.hits + 256,
        "the second read is served from memory: {after_second:?}"
    );
    assert_eq!(after_second.misses, after_first.misses);
    assert!(after_second.memory_bytes <= after_second.budget_bytes);

    // What `tessera host show --json` and `object show --json` print.
    let shown = cluster.control.host(&owner_id).await.unwrap();
    let cache = shown.read_cache.expect("the owner runs in this process");
    assert!(
        cache.hits >= 256 && cache.cached_bytes >= 1 << 20,
        "{cache:?}"
    );
    assert_eq!(cache.budget_bytes, after_second.budget_bytes);
    let json = serde_json::to_value(&shown).unwrap();
    assert!(
        json["read_cache"]["hit_rate"].as_f64().unwrap() > 0.0,
        "{json}"
    );
    assert!(json["read_cache"]["misses"].as_u64().is_some(), "{json}");
    let object = cluster.control.object("rc").await.unwrap();
    assert!(object.read_cache.hits >= 256, "{:?}", object.read_cache);

    // A write through another host goes to the owner, which drops what it
    // cached before acknowledging; reads through either host see it.
    let remote = other.open_volume("rc").expect("every host serves rc");
    let new = fill(2, 8192);
    remote
        .write(4096, new.clone(), WriteFlags::default())
        .await
        .unwrap();
    let mut expected = data.to_vec();
    expected[4096..12288].copy_from_slice(&new);
    assert_eq!(local.read(0, 1 << 20).await.unwrap(), expected);
    assert_eq!(remote.read(0, 1 << 20).await.unwrap(), expected);
    // Twice more through the owner: from memory, still the new data.
    let hits = owner.read_cache().stats().hits;
    assert_eq!(local.read(0, 16384).await.unwrap(), &expected[..16384]);
    assert_eq!(owner.read_cache().stats().hits, hits + 4);
    // Unmapped through the other host, zeroed through the owner.
    remote.unmap(0, 8192).await.unwrap();
    assert!(local.read(0, 8192).await.unwrap().iter().all(|&b| b == 0));
    remote
        .write_zeroes(8192, 4096, ZeroMode::MayUnmap)
        .await
        .unwrap();
    assert_eq!(
        local.read(8192, 8192).await.unwrap(),
        [vec![0u8; 4096], expected[12288..16384].to_vec()].concat()
    );

    // The setting: 0 empties and disables every host's cache at its next
    // look at the directory; unset, the default comes back.
    let off = cluster
        .control
        .update_settings(UpdateSettings {
            read_cache_bytes: Some(Some(0)),
            ..UpdateSettings::default()
        })
        .await
        .unwrap();
    assert_eq!(off.read_cache_bytes, Some(0));
    owner.refresh_view().await;
    let stats = owner.read_cache().stats();
    assert_eq!((stats.budget_bytes, stats.entries), (0, 0));
    let misses = stats.misses;
    assert_eq!(local.read(0, 16384).await.unwrap().len(), 16384);
    assert_eq!(
        owner.read_cache().stats().misses,
        misses,
        "not counted while off"
    );
    let shown = cluster.control.host(&owner_id).await.unwrap();
    assert_eq!(shown.read_cache.unwrap().budget_bytes, 0);
    cluster
        .control
        .update_settings(UpdateSettings {
            read_cache_bytes: Some(None),
            ..UpdateSettings::default()
        })
        .await
        .unwrap();
    owner.refresh_view().await;
    assert_eq!(owner.read_cache().stats().budget_bytes, start.budget_bytes);

    // More than half the memory is refused, and changes nothing.
    let too_much = owner.memory_bytes() / 2 + 1;
    let err = cluster
        .control
        .update_settings(UpdateSettings {
            read_cache_bytes: Some(Some(too_much)),
            ..UpdateSettings::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ControlError::Invalid(m) if m.contains("at most half of a host's memory")),
        "{err:?}"
    );
    assert_eq!(
        cluster.control.settings().await.unwrap().read_cache_bytes,
        None
    );
    cluster.stop().await;
}
