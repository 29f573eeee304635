//! The metadata (index) cache of every disk group as an operator sees and
//! steers it on the real `tessera up`: `host show --json` gives each disk
//! group's budget, resident pages, hits, misses, read-ahead and evictions;
//! `settings set index_cache_bytes` and `index_prefetch_bytes` change them
//! on every host while volumes serve (fio writes and reads one meanwhile),
//! `default` goes back to the configured budget, and values out of range
//! are refused and change nothing. Skips without fio.

mod common;

use common::have;
use common::up::{expect_success, fio, tessera, UpCluster};
use serde_json::Value;
use std::time::{Duration, Instant};

/// The index cache of every disk group of every host.
fn index_caches(api: &str) -> Vec<Value> {
    let (ok, text) = tessera(api, &["--json", "host", "list"]);
    assert!(ok, "{text}");
    let hosts: Value = serde_json::from_str(&text).unwrap();
    hosts
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|h| h["disk_groups"].as_array().unwrap().clone())
        .map(|d| d["index_cache"].clone())
        .collect()
}

/// Waits until every disk group's index cache satisfies `ok` (settings
/// reach the hosts through the directory's watch).
fn wait_caches(api: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let caches = index_caches(api);
        if !caches.is_empty() && caches.iter().all(&ok) {
            return caches;
        }
        assert!(Instant::now() < deadline, "{what}: {caches:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_index_cache_is_shown_per_disk_group_and_resized_live_by_a_setting() {
    if !have("fio") {
        return;
    }
    let up = UpCluster::start(71, &[]);
    let api = up.api.clone();
    let (_, uri) = up.create_volume("vm", "1G", None);
    let write = fio(&uri, &["--rw=randwrite", "--size=1G", "--io_size=64M"])
        .spawn()
        .unwrap();
    expect_success(write, "writing the volume");

    // Shown for every disk group, with the configured budget (32 MiB for
    // `tessera up`'s one disk group per host) and read-ahead (4 pages).
    let before = wait_caches(&api, "index caches shown", |c| {
        c["budget_bytes"].as_u64().is_some_and(|b| b > 31 << 20) && c["prefetch_pages"] == 4
    });
    assert!(before
        .iter()
        .any(|c| c["resident_pages"].as_u64() > Some(0)));

    // Smaller and without read-ahead, live, while fio reads.
    let (ok, text) = tessera(&api, &["settings", "set", "index_cache_bytes", "2M"]);
    assert!(ok, "{text}");
    let (ok, text) = tessera(&api, &["settings", "set", "index_prefetch_bytes", "0"]);
    assert!(ok, "{text}");
    wait_caches(&api, "the new budget on every host", |c| {
        c["budget_bytes"].as_u64().is_some_and(|b| b <= 2 << 20) && c["prefetch_pages"] == 0
    });
    let read = fio(&uri, &["--rw=randread", "--size=1G", "--io_size=32M"])
        .spawn()
        .unwrap();
    expect_success(read, "reading the volume");
    let after = index_caches(&api);
    for c in &after {
        assert!(
            c["resident_bytes"].as_u64() <= c["budget_bytes"].as_u64(),
            "{c}"
        );
    }
    let total = |key: &str| -> u64 { after.iter().map(|c| c[key].as_u64().unwrap()).sum() };
    assert!(total("hits") > 0 && total("misses") > 0, "{after:#?}");
    let (ok, text) = tessera(&api, &["settings", "show"]);
    assert!(
        ok && text.contains("index_cache_bytes")
            && text.contains("2.0 MiB")
            && text.contains("index_prefetch_bytes"),
        "{text}"
    );
    let (ok, text) = tessera(&api, &["host", "list"]);
    assert!(
        ok && text.contains("INDEX CACHE") && text.contains("HIT RATE"),
        "{text}"
    );

    // Out of range: refused, nothing changes.
    for (name, value, says) in [
        (
            "index_cache_bytes",
            "4K",
            "index_cache_bytes must be between",
        ),
        (
            "index_prefetch_bytes",
            "1G",
            "index_prefetch_bytes must be between",
        ),
        ("index_cache_bytes", "lots", "a size"),
    ] {
        let (ok, text) = tessera(&api, &["settings", "set", name, value]);
        assert!(!ok && text.contains(says), "{name} {value}: {text}");
    }
    let (_, text) = tessera(&api, &["--json", "settings", "show"]);
    let settings: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(settings["index_cache_bytes"], 2 << 20);
    assert_eq!(settings["index_prefetch_bytes"], 0);

    // Back to the configured budget and the default read-ahead.
    let (ok, text) = tessera(&api, &["settings", "set", "index_cache_bytes", "default"]);
    assert!(ok, "{text}");
    let (ok, text) = tessera(&api, &["settings", "set", "index_prefetch_bytes", "4M"]);
    assert!(ok, "{text}");
    wait_caches(&api, "the configured budget again", |c| {
        c["budget_bytes"].as_u64().is_some_and(|b| b > 31 << 20) && c["prefetch_pages"] == 4
    });
}
