//! The index cache (the store's metadata cache): its budget holds however
//! many pages there are, a smaller budget set live drops pages at once, a
//! miss reads the pages after it too, beside it (a scan then misses once
//! per window, not once per page), and its counters say so.

mod common;

use common::{bytes_of, payload, Rig};
use tessera_types::{ComponentId, Epoch, Lba};

/// LBAs per index page.
const PAGE_LBAS: u64 = 252;
/// Pages written (one block each): more than the smallest budget holds.
const PAGES: u64 = 600;

/// Reads one block of every page in order, at a client's pace (read-ahead
/// runs beside the reads: a scan faster than the device outruns it).
async fn scan(dg: &tessera_store::DiskGroup) {
    for p in 0..PAGES {
        let got = dg
            .read(ComponentId(1), Lba(p * PAGE_LBAS), 1)
            .await
            .unwrap();
        assert_eq!(&got[..], &payload(1, p * PAGE_LBAS, 1)[..]);
        tokio::time::sleep(std::time::Duration::from_micros(500)).await;
    }
}

#[test]
fn a_scan_misses_once_per_prefetch_window_and_the_budget_holds_live() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let rig = Rig::new(1);
            let dg = rig.create().await;
            dg.create_component(ComponentId(1), PAGES * PAGE_LBAS * 4096, 0)
                .await
                .unwrap();
            for p in 0..PAGES {
                let lba = p * PAGE_LBAS;
                dg.write(
                    ComponentId(1),
                    Lba(lba),
                    bytes_of(&[payload(1, lba, 1)]),
                    Epoch(1),
                )
                .await
                .unwrap();
            }
            dg.settle().await.unwrap();
            // The smallest budget: pages beyond it go at once.
            dg.set_index_cache(0, 0);
            let start = dg.index_cache_stats();
            assert!(start.resident_pages <= 256, "{start:?}");
            assert!(start.evicted >= PAGES - 256, "{start:?}");

            // Without read-ahead, a scan misses on nearly every page.
            scan(&dg).await;
            let plain = dg.index_cache_stats();
            let plain_misses = plain.misses - start.misses;
            assert!(plain_misses >= PAGES - 256, "{plain:?}");
            assert_eq!(plain.prefetched, start.prefetched);

            // With 4 pages read ahead, about one miss per 5 pages.
            dg.set_index_cache(0, 4);
            scan(&dg).await;
            let ahead = dg.index_cache_stats();
            let ahead_misses = ahead.misses - plain.misses;
            assert!(
                ahead_misses * 4 <= plain_misses + 8,
                "read-ahead: {ahead_misses} misses, without: {plain_misses}"
            );
            assert!(ahead.prefetched > plain.prefetched, "{ahead:?}");
            assert!(ahead.hits > plain.hits, "{ahead:?}");
            assert!(ahead.resident_pages <= 256, "{ahead:?}");

            // A budget for every page: a second scan finds them all.
            dg.set_index_cache(64 << 20, 4);
            scan(&dg).await;
            let warm = dg.index_cache_stats();
            scan(&dg).await;
            let again = dg.index_cache_stats();
            assert_eq!(again.misses, warm.misses, "{again:?}");
            assert_eq!(again.hits - warm.hits, PAGES);
            // The budget in whole pages' memory.
            assert!(
                again.budget_bytes <= 64 << 20 && again.budget_bytes > 63 << 20,
                "{again:?}"
            );
            assert!(again.resident_pages >= PAGES, "{again:?}");
        })
}

/// Snapshots keep their page roots in their root tables, not in memory:
/// reads of many snapshots through the smallest budget bring the tables'
/// blocks and the pages in and out of the cache together, read what each
/// snapshot held, and stay within the budget; after a restart, and after
/// deletes in any order, the same holds and every reference is accounted.
#[test]
fn snapshots_read_their_roots_through_the_cache_and_stay_within_its_budget() {
    const SNAPSHOTS: u64 = 24;
    /// Pages overwritten between two snapshots (each one's copy is then
    /// the snapshot's alone).
    const CHANGED: u64 = 3;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let rig = Rig::new(1);
    let volume = ComponentId(1);
    let snapshot = |s: u64| ComponentId(100 + s);
    // The version of page `p`'s first block that snapshot `s` holds: page p
    // is rewritten as version s + 1 in the interval after snapshot s when
    // p % SNAPSHOTS is among that interval's CHANGED pages.
    let changed_in = |s: u64, p: u64| (0..CHANGED).any(|k| p == (s * 7 + k * 131) % PAGES);
    let version_in = move |s: u64, p: u64| {
        (0..s)
            .filter(|&i| changed_in(i, p))
            .max()
            .map_or(1, |i| i + 2)
    };
    let check_all = |dg: std::sync::Arc<tessera_store::DiskGroup>, snapshots: Vec<u64>| async move {
        for &s in &snapshots {
            for p in (0..PAGES).step_by(7) {
                let lba = p * PAGE_LBAS;
                let got = dg.read(snapshot(s), Lba(lba), 1).await.unwrap();
                assert_eq!(
                    &got[..],
                    &payload(1, lba, version_in(s, p))[..],
                    "snapshot {s} page {p}"
                );
            }
            let stats = dg.index_cache_stats();
            assert!(
                stats.resident_pages + stats.resident_root_blocks <= 256,
                "{stats:?}"
            );
        }
    };
    let rig = rt.block_on(async {
        let dg = rig.create().await;
        dg.create_component(volume, PAGES * PAGE_LBAS * 4096, 0)
            .await
            .unwrap();
        let write = |dg: std::sync::Arc<tessera_store::DiskGroup>, p: u64, version: u64| async move {
            let lba = p * PAGE_LBAS;
            dg.write(volume, Lba(lba), bytes_of(&[payload(1, lba, version)]), Epoch(1))
                .await
                .unwrap();
        };
        for p in 0..PAGES {
            write(dg.clone(), p, 1).await;
        }
        // The smallest budget (256 pages): less than one snapshot's pages,
        // and its root table takes three blocks.
        dg.set_index_cache(0, 0);
        for s in 0..SNAPSHOTS {
            dg.snapshot_component(volume, snapshot(s), Epoch(1))
                .await
                .unwrap();
            for p in (0..PAGES).filter(|&p| changed_in(s, p)) {
                write(dg.clone(), p, s + 2).await;
            }
        }
        dg.settle().await.unwrap();
        let before = dg.index_cache_stats();
        check_all(dg.clone(), (0..SNAPSHOTS).collect()).await;
        let after = dg.index_cache_stats();
        assert!(after.misses > before.misses, "{after:?}");
        dg.audit_references().await.unwrap();
        // A linked clone of a snapshot whose roots are not cached.
        dg.set_index_cache(0, 0);
        dg.clone_component(snapshot(5), ComponentId(50), Epoch(1))
            .await
            .unwrap();
        let lba = 7 * PAGE_LBAS;
        let got = dg.read(ComponentId(50), Lba(lba), 1).await.unwrap();
        assert_eq!(&got[..], &payload(1, lba, version_in(5, 7))[..]);
        dg.settle().await.unwrap();
        let next = rig.process_crash();
        drop(dg);
        next
    });
    rt.block_on(async {
        // Opened again: the roots are found from the tables the checkpoint
        // names.
        let dg = rig.open().await;
        dg.set_index_cache(0, 0);
        check_all(dg.clone(), (0..SNAPSHOTS).collect()).await;
        // Delete every other snapshot, oldest last; the rest read the same.
        let mut deleted = Vec::new();
        for s in (0..SNAPSHOTS).rev().step_by(2) {
            dg.delete_component(snapshot(s)).await.unwrap();
            deleted.push(s);
        }
        dg.audit_references().await.unwrap();
        let kept: Vec<u64> = (0..SNAPSHOTS).filter(|s| !deleted.contains(s)).collect();
        check_all(dg.clone(), kept.clone()).await;
        for s in kept {
            dg.delete_component(snapshot(s)).await.unwrap();
        }
        dg.delete_component(ComponentId(50)).await.unwrap();
        dg.settle().await.unwrap();
        dg.audit_references().await.unwrap();
        // Only the volume is left: its pages and blocks alone.
        assert_eq!(dg.space().used_bytes, (PAGES + 2 * PAGES) * 4096);
    });
}
