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
