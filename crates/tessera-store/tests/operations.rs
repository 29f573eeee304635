//! The store's operations as the replica service uses them: data round
//! trips, thin allocation, unmap and zeroing, epochs, space, components,
//! recovery after a clean stop and after a crash, and what a write keeps
//! in memory.

mod common;

use common::{bytes_of, payload, Rig};
use std::time::Duration;
use tessera_store::{DiskGroupHealth, StoreError};
use tessera_types::{ComponentId, Epoch, Lba};

const C: ComponentId = ComponentId(7);
const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_read_back_and_unwritten_blocks_read_as_zeros() {
    let rig = Rig::new(2);
    let dg = rig.create().await;
    dg.create_component(C, 8 * MIB, 0).await.unwrap();
    dg.create_component(C, 8 * MIB, 0).await.unwrap();
    assert!(matches!(
        dg.create_component(C, 16 * MIB, 0).await,
        Err(StoreError::ComponentExists { .. })
    ));
    dg.write(
        C,
        Lba(3),
        bytes_of(&[payload(7, 3, 1), payload(7, 4, 1)]),
        Epoch(1),
    )
    .await
    .unwrap();
    let back = dg.read(C, Lba(2), 4).await.unwrap();
    assert_eq!(&back[..4096], &[0u8; 4096][..]);
    assert_eq!(&back[4096..8192], &payload(7, 3, 1)[..]);
    assert_eq!(&back[8192..12288], &payload(7, 4, 1)[..]);
    assert_eq!(&back[12288..], &[0u8; 4096][..]);
    assert_eq!(
        dg.allocated(C, Lba(0), 2048).await.unwrap(),
        vec![(Lba(3), 2)]
    );
    let space = dg.component_space(C).unwrap();
    assert_eq!(space.allocated_bytes, 8192);
    assert_eq!(space.logical_bytes, 8 * MIB);

    // After destaging the data comes from the capacity tier.
    dg.settle().await.unwrap();
    assert_eq!(dg.read(C, Lba(4), 1).await.unwrap(), payload(7, 4, 1));
    assert_eq!(dg.component_space(C).unwrap().physical_bytes, 8192 + 8192);

    // Unmap and zeroing give space back at once and read as zeros.
    dg.unmap(C, Lba(3), 1, Epoch(1)).await.unwrap();
    dg.write_zeroes(C, Lba(4), 1, Epoch(1)).await.unwrap();
    assert_eq!(dg.component_space(C).unwrap().allocated_bytes, 0);
    assert!(dg.read(C, Lba(3), 2).await.unwrap().iter().all(|&b| b == 0));
    assert!(dg.allocated(C, Lba(0), 2048).await.unwrap().is_empty());
    dg.settle().await.unwrap();
    assert_eq!(dg.component_space(C).unwrap().physical_bytes, 0);
    assert!(matches!(
        dg.read(C, Lba(2048), 1).await,
        Err(StoreError::OutOfRange { .. })
    ));
    assert!(matches!(
        dg.write(C, Lba(0), bytes::Bytes::from(vec![1u8; 100]), Epoch(1))
            .await,
        Err(StoreError::Misaligned { .. })
    ));
    assert_eq!(dg.health(), DiskGroupHealth::Healthy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_fence_stale_owners_and_persist() {
    let rig = Rig::new(1);
    let dg = rig.create().await;
    dg.create_component(C, 4 * MIB, 0).await.unwrap();
    dg.write(C, Lba(0), bytes_of(&[payload(7, 0, 1)]), Epoch(3))
        .await
        .unwrap();
    assert_eq!(dg.epoch(C).unwrap(), Epoch(3));
    dg.fence(C, Epoch(5)).await.unwrap();
    let err = dg
        .write(C, Lba(0), bytes_of(&[payload(7, 0, 2)]), Epoch(4))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::StaleEpoch {
            component: C,
            epoch: Epoch(4),
            highest: Epoch(5)
        }
    ));
    assert!(matches!(
        dg.unmap(C, Lba(0), 1, Epoch(4)).await,
        Err(StoreError::StaleEpoch { .. })
    ));
    assert!(matches!(
        dg.fence(C, Epoch(4)).await,
        Err(StoreError::StaleEpoch { .. })
    ));
    assert_eq!(dg.read(C, Lba(0), 1).await.unwrap(), payload(7, 0, 1));
    drop(dg);
    let rig = rig.power_cut(1);
    let dg = rig.open().await;
    assert_eq!(dg.epoch(C).unwrap(), Epoch(5));
    assert_eq!(dg.read(C, Lba(0), 1).await.unwrap(), payload(7, 0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn space_runs_out_cleanly_and_comes_back() {
    let rig = Rig::new(1);
    let dg = rig.create().await;
    let cap = dg.space().capacity_bytes;
    // A reservation larger than the group is refused.
    assert!(matches!(
        dg.create_component(ComponentId(1), 2 * cap, 2 * cap).await,
        Err(StoreError::NoSpaceForReservation { .. })
    ));
    // A thin component larger than the group fills it, then fails cleanly.
    dg.create_component(C, 4 * cap, 0).await.unwrap();
    let chunk = 64u64;
    let mut lba = 0u64;
    let first_failure = loop {
        let blocks: Vec<Vec<u8>> = (0..chunk).map(|i| payload(7, lba + i, 1)).collect();
        match dg.write(C, Lba(lba), bytes_of(&blocks), Epoch(1)).await {
            Ok(()) => lba += chunk,
            Err(StoreError::NoSpace { component, lba: at }) => {
                assert_eq!(component, C);
                break at;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    };
    assert!(first_failure.0 >= lba);
    let before = dg.component_space(C).unwrap();
    assert_eq!(
        before.allocated_bytes,
        lba * 4096,
        "a refused write changes nothing"
    );
    // Overwrites of allocated blocks still work when the group is full.
    dg.write(C, Lba(0), bytes_of(&[payload(7, 0, 2)]), Epoch(1))
        .await
        .unwrap();
    // Unmap gives space back at once.
    dg.unmap(C, Lba(0), lba, Epoch(1)).await.unwrap();
    assert_eq!(dg.component_space(C).unwrap().allocated_bytes, 0);
    dg.write(C, Lba(lba), bytes_of(&[payload(7, lba, 3)]), Epoch(1))
        .await
        .unwrap();
    dg.settle().await.unwrap();
    assert_eq!(dg.read(C, Lba(lba), 1).await.unwrap(), payload(7, lba, 3));
    // Deleting frees everything, reservations too.
    dg.delete_component(C).await.unwrap();
    dg.create_component(ComponentId(2), cap / 2, cap / 2)
        .await
        .unwrap();
    let s = dg.space();
    assert_eq!(s.reserved_bytes, cap / 2);
    assert!(matches!(
        dg.read(C, Lba(0), 1).await,
        Err(StoreError::NoSuchComponent { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_shrinks_away_data_and_everything_survives_reopen() {
    let rig = Rig::new(2);
    let dg = rig.create().await;
    dg.create_component(C, 4 * MIB, 0).await.unwrap();
    for l in [0u64, 300, 900] {
        dg.write(C, Lba(l), bytes_of(&[payload(7, l, 1)]), Epoch(1))
            .await
            .unwrap();
    }
    dg.settle().await.unwrap();
    dg.resize_component(C, 2 * MIB).await.unwrap();
    assert_eq!(dg.component_space(C).unwrap().allocated_bytes, 2 * 4096);
    dg.resize_component(C, 4 * MIB).await.unwrap();
    assert!(dg
        .read(C, Lba(900), 1)
        .await
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    dg.write(C, Lba(1000), bytes_of(&[payload(7, 1000, 1)]), Epoch(2))
        .await
        .unwrap();
    // Physical space follows destaging, which is timing-dependent; the rest
    // must survive exactly.
    let logical = |dg: &tessera_store::DiskGroup| {
        dg.components()
            .into_iter()
            .map(|c| (c.id, c.size_bytes, c.highest_epoch, c.space.allocated_bytes))
            .collect::<Vec<_>>()
    };
    let summary = logical(&dg);
    drop(dg);
    // Reopen from a clean stop (no settle: the last write is only in the log).
    let dg = rig.process_crash().open().await;
    assert_eq!(logical(&dg), summary);
    assert_eq!(dg.read(C, Lba(300), 1).await.unwrap(), payload(7, 300, 1));
    assert_eq!(dg.read(C, Lba(1000), 1).await.unwrap(), payload(7, 1000, 1));
    assert_eq!(
        dg.allocated(C, Lba(0), 1024).await.unwrap(),
        vec![(Lba(0), 1), (Lba(300), 1), (Lba(1000), 1)]
    );
}

/// The replica service shares one `Arc<DiskGroup>` between tasks on a
/// multi-threaded runtime: the group must be `Send + Sync` and every future
/// of its API `Send`.
#[test]
fn the_api_is_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>(_: &T) {}
    send_sync::<tessera_store::DiskGroup>();
    send_sync::<StoreError>();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let rig = Rig::new(1);
        let dg = rig.create().await;
        let data = bytes_of(&[payload(7, 0, 1)]);
        send(&dg.create_component(C, MIB, 0));
        send(&dg.write(C, Lba(0), data, Epoch(1)));
        send(&dg.read(C, Lba(0), 1));
        send(&dg.unmap(C, Lba(0), 1, Epoch(1)));
        send(&dg.write_zeroes(C, Lba(0), 1, Epoch(1)));
        send(&dg.fence(C, Epoch(1)));
        send(&dg.flush());
        send(&dg.allocated(C, Lba(0), 1));
        send(&dg.resize_component(C, MIB));
        send(&dg.delete_component(C));
        send(&dg.scrub(0));
        send(&dg.settle());
    });
}

/// A write keeps only its own bytes: 4 KiB writes cut from one 128 KiB
/// buffer (as from a network read) leave no reference to that buffer in
/// the store, while their blocks wait in the write log for destaging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_write_holds_only_its_own_bytes() {
    let rig = Rig::new(1);
    let dg = rig.create().await;
    dg.create_component(C, 8 * MIB, 0).await.unwrap();
    let blocks: Vec<Vec<u8>> = (0..32).map(|l| payload(C.0, l, 1)).collect();
    let big = bytes_of(&blocks);
    // One Bytes slice per write, then a write of two blocks from the middle.
    for l in 0..30u64 {
        let slice = big.slice((l * 4096) as usize..((l + 1) * 4096) as usize);
        dg.write(C, Lba(l), slice, Epoch(1)).await.unwrap();
    }
    dg.write(C, Lba(30), big.slice(30 * 4096..), Epoch(1))
        .await
        .unwrap();
    // Blocks are destaged at the earliest 20 ms after they are logged; the
    // last write's blocks are still in the overlay here, and every slice
    // was let go.
    assert!(big.is_unique(), "the store still holds the caller's buffer");
    assert_eq!(dg.read(C, Lba(0), 32).await.unwrap(), big);
    dg.settle().await.unwrap();
    assert_eq!(dg.read(C, Lba(0), 32).await.unwrap(), big);
}

/// A connection polls the requests it has read one after another in one
/// task. Writes started that way share group commits (one write and one
/// sync of the log for many), and reads all complete, rather than each
/// request being committed or read alone while the rest of the queue waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_started_together_by_one_task_share_group_commits() {
    let rig = Rig::new(1);
    let dg = rig.create().await;
    dg.create_component(C, 8 * MIB, 0).await.unwrap();
    const ROUNDS: u64 = 20;
    const QUEUE: u64 = 16;
    let before = dg.log_stats();
    for round in 0..ROUNDS {
        let writes = (0..QUEUE).map(|i| {
            let lba = round * QUEUE + i;
            dg.write(C, Lba(lba), bytes_of(&[payload(C.0, lba, 2)]), Epoch(1))
        });
        for r in futures::future::join_all(writes).await {
            r.unwrap();
        }
    }
    let stats = dg.log_stats();
    let commits = stats.group_commits - before.group_commits;
    assert!(
        commits <= ROUNDS * 3,
        "{} writes in queues of {QUEUE} took {commits} group commits",
        ROUNDS * QUEUE
    );
    dg.settle().await.unwrap();
    let reads = (0..ROUNDS * QUEUE).map(|lba| dg.read(C, Lba(lba), 1));
    for (lba, r) in futures::future::join_all(reads)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(r.unwrap(), payload(C.0, lba as u64, 2), "LBA {lba}");
    }
}

/// On files, whose log device takes writes through the group's io_uring,
/// the writes that queue behind a commit in flight are committed from its
/// completion as the next durable commit: under eight writers at once no
/// log sync runs (the log writer and its syncers are never woken), writes
/// still share commits, and every acknowledged write reads back, and again
/// after the process dies without closing the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_queued_behind_a_commit_are_committed_from_its_completion() {
    const WRITERS: u64 = 8;
    const EACH: u64 = 60;
    let dir = tempfile::tempdir().unwrap();
    let config = common::file_config(dir.path(), "dg-chained");
    let dg = tessera_store::DiskGroup::open_or_create(config.clone())
        .await
        .unwrap();
    dg.create_component(C, 8 * MIB, 0).await.unwrap();
    let before = dg.log_stats();
    let writers = (0..WRITERS).map(|w| {
        let dg = dg.clone();
        tokio::spawn(async move {
            for i in 0..EACH {
                let lba = w * EACH + i;
                dg.write(C, Lba(lba), bytes_of(&[payload(C.0, lba, 2)]), Epoch(1))
                    .await
                    .unwrap();
            }
        })
    });
    for w in futures::future::join_all(writers).await {
        w.unwrap();
    }
    let after = dg.log_stats();
    let (commits, durable, syncs) = (
        after.group_commits - before.group_commits,
        after.durable_commits - before.durable_commits,
        after.syncs - before.syncs,
    );
    let writes = WRITERS * EACH;
    assert_eq!(
        syncs, 0,
        "{commits} commits of {writes} writes took {syncs} log syncs"
    );
    assert_eq!(
        durable, commits,
        "{durable} of {commits} commits written durable"
    );
    assert!(commits < writes, "{writes} writes took {commits} commits");
    for lba in 0..writes {
        assert_eq!(
            dg.read(C, Lba(lba), 1).await.unwrap(),
            payload(C.0, lba, 2),
            "LBA {lba}"
        );
    }
    // Gone without a settle or a close: the log holds every write.
    drop(dg);
    let dg = tessera_store::DiskGroup::open_or_create(config)
        .await
        .unwrap();
    for lba in 0..writes {
        assert_eq!(
            dg.read(C, Lba(lba), 1).await.unwrap(),
            payload(C.0, lba, 2),
            "LBA {lba} after reopening"
        );
    }
}

/// Polled the way the servers poll a connection's requests (one
/// `InFlight` set, whose polls are plugged), the writes a poll starts all
/// go out in the first one's group commit: it is deferred to the end of
/// that poll, with no yield to the runtime in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_started_in_one_plugged_poll_share_one_group_commit_and_all_read_back() {
    use futures::StreamExt;
    let rig = Rig::new(1);
    let dg = rig.create().await;
    dg.create_component(C, 8 * MIB, 0).await.unwrap();
    const ROUNDS: u64 = 20;
    const QUEUE: u64 = 16;
    let before = dg.log_stats();
    for round in 0..ROUNDS {
        let mut set = tessera_env::InFlight::new();
        for i in 0..QUEUE {
            let lba = round * QUEUE + i;
            let dg = dg.clone();
            set.push(async move {
                dg.write(C, Lba(lba), bytes_of(&[payload(C.0, lba, 4)]), Epoch(1))
                    .await
            });
        }
        // The first poll starts all of them and, as it ends, writes their
        // commit (this rig's log device has no ring: the write is made
        // before the poll returns). Yielding instead, it would not have
        // been written yet.
        let committed = dg.log_stats().group_commits;
        assert!(futures::poll!(set.next()).is_pending());
        assert_eq!(
            dg.log_stats().group_commits,
            committed + 1,
            "round {round}: the first poll ended without writing the commit"
        );
        while let Some(r) = set.next().await {
            r.unwrap();
        }
    }
    let commits = dg.log_stats().group_commits - before.group_commits;
    assert_eq!(
        commits,
        ROUNDS,
        "{} writes in queues of {QUEUE} took {commits} group commits",
        ROUNDS * QUEUE
    );
    // Alone in a plugged poll, a write is committed at once, by itself.
    let before = dg.log_stats();
    let mut set = tessera_env::InFlight::new();
    let lone = dg.clone();
    set.push(async move {
        lone.write(C, Lba(1000), bytes_of(&[payload(C.0, 1000, 4)]), Epoch(1))
            .await
    });
    set.next().await.expect("one write").unwrap();
    let after = dg.log_stats();
    assert_eq!(after.group_commits, before.group_commits + 1);
    assert_eq!(after.durable_commits, before.durable_commits + 1);
    dg.settle().await.unwrap();
    // Reads polled the same way, from the devices (the rig's page cache
    // holds nothing, and none of these was read before): a queue of them,
    // and one alone, which decides at the end of the poll to read on the
    // polling thread.
    let queued: Vec<u64> = (0..QUEUE).map(|i| i * 17).collect();
    for lbas in [queued, vec![1000]] {
        let queue = lbas.len();
        let mut set = tessera_env::InFlight::new();
        for lba in lbas {
            let dg = dg.clone();
            set.push(async move { (lba, dg.read(C, Lba(lba), 1).await) });
        }
        let mut answered = 0;
        while let Some((lba, r)) = set.next().await {
            assert_eq!(r.unwrap(), payload(C.0, lba, 4), "LBA {lba}");
            answered += 1;
        }
        assert_eq!(answered, queue);
    }
    for lba in (0..ROUNDS * QUEUE).chain([1000]) {
        assert_eq!(
            dg.read(C, Lba(lba), 1).await.unwrap(),
            payload(C.0, lba, 4),
            "LBA {lba}"
        );
    }
}

/// While a large write's data is on its way to the capacity device, a small
/// write is not committed on its caller's thread (which would block a
/// runtime thread serving a connection behind the large write's device
/// traffic) but by the log writer and a syncer; it is acknowledged without
/// waiting for the large write, and both read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_writes_are_not_committed_inline_while_a_placed_write_is_in_flight() {
    let rig = Rig::new(1);
    let dg = rig.create().await;
    dg.create_component(C, 8 * MIB, 0).await.unwrap();
    // A lone small write is committed inline, durable on its own.
    let before = dg.log_stats();
    dg.write(C, Lba(0), bytes_of(&[payload(C.0, 0, 1)]), Epoch(1))
        .await
        .unwrap();
    assert_eq!(dg.log_stats().durable_commits, before.durable_commits + 1);

    rig.capacity[0].slow_writes_in(0..common::CAPACITY_BYTES, Duration::from_secs(2));
    const LARGE_LBA: u64 = 1024;
    let large: Vec<Vec<u8>> = (0..64).map(|i| payload(C.0, LARGE_LBA + i, 1)).collect();
    let large = tokio::spawn({
        let dg = dg.clone();
        async move {
            dg.write(C, Lba(LARGE_LBA), bytes_of(&large), Epoch(1))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = dg.log_stats();
    dg.write(C, Lba(1), bytes_of(&[payload(C.0, 1, 1)]), Epoch(1))
        .await
        .unwrap();
    let after = dg.log_stats();
    assert!(!large.is_finished(), "the large write's data is still held");
    assert_eq!(
        after.durable_commits, before.durable_commits,
        "the small write was committed on its caller's thread"
    );
    assert!(after.group_commits > before.group_commits);
    large.await.unwrap().unwrap();
    assert_eq!(dg.log_stats().placed_writes, before.placed_writes + 1);
    for lba in (0..2).chain(LARGE_LBA..LARGE_LBA + 64) {
        assert_eq!(
            dg.read(C, Lba(lba), 1).await.unwrap(),
            payload(C.0, lba, 1),
            "LBA {lba}"
        );
    }
}

/// A write whose caller gives up after its first poll (a client that
/// disconnects) was already staged: it still reaches the log, and the
/// writes after it are not held up behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_dropped_after_its_first_poll_still_lands_and_blocks_nothing() {
    let rig = Rig::new(1);
    let dg = rig.create().await;
    dg.create_component(C, 8 * MIB, 0).await.unwrap();
    for round in 0..50u64 {
        let mut dropped =
            Box::pin(dg.write(C, Lba(round), bytes_of(&[payload(C.0, round, 3)]), Epoch(1)));
        let first = futures::poll!(dropped.as_mut());
        drop(dropped);
        let next = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            dg.write(
                C,
                Lba(100 + round),
                bytes_of(&[payload(C.0, 100 + round, 3)]),
                Epoch(1),
            ),
        )
        .await;
        next.expect("a write after a dropped one hung").unwrap();
        // Staged at its first poll unless it had to load index pages first.
        if first.is_pending() {
            let back = dg.read(C, Lba(round), 1).await.unwrap();
            assert!(
                back == payload(C.0, round, 3) || back.iter().all(|&b| b == 0),
                "LBA {round} holds neither the dropped write nor zeros"
            );
        }
    }
    dg.settle().await.unwrap();
}

/// The nice value of each thread of this process, by thread name.
fn thread_nice_values() -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_string();
        // Fields after the name: state is field 3, nice field 19.
        let nice = stat[close + 2..]
            .split(' ')
            .nth(16)
            .and_then(|v| v.parse().ok())
            .unwrap();
        out.push((name, nice));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destaging_runs_at_a_lower_cpu_priority_than_serving() {
    let rig = Rig::new(1);
    let dg = rig.create().await;
    dg.create_component(C, 8 * MIB, 0).await.unwrap();
    dg.write(C, Lba(0), bytes_of(&[payload(7, 0, 1)]), Epoch(1))
        .await
        .unwrap();
    // This test's own thread runs at the process's priority.
    let process = i64::from(tessera_env::background::this_thread_nice().unwrap());
    let background = (process + tessera_env::background::BACKGROUND_NICE_OFFSET as i64).min(19);
    let threads = thread_nice_values();
    let mut seen = (0, 0);
    for (name, nice) in &threads {
        match name.as_str() {
            "store-destage" | "store-write" => {
                assert_eq!(*nice, background, "{name} yields to serving threads");
                seen.0 += 1;
            }
            "store-log" | "store-sync" | "store-read" => {
                assert_eq!(*nice, process, "{name} serves clients at full priority");
                seen.1 += 1;
            }
            _ => {}
        }
    }
    assert!(seen.0 > 0 && seen.1 > 0, "threads found: {threads:?}");
}
