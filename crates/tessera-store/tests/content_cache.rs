//! The content-based read cache: a block stored once and shared by several
//! components (copies by reference) is read from its device once and then
//! served from memory to every component that shares it; and no read ever
//! returns other data than the index says, whatever overwrites, unmaps,
//! deletes, destaging and checkpoints do to the blocks the cache holds,
//! including when their locations are freed and handed out again.
//!
//! Cases of the property test: `PROPTEST_CASES` (default 16 here).

mod common;

use bytes::Bytes;
use common::{bytes_of, payload, Rig};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use tessera_env::{Disk, FaultDisk};
use tessera_store::{ContentCacheStats, DiskGroup, GroupDevices};
use tessera_types::{ComponentId, DiskGroupId, Epoch, Lba};

const E: Epoch = Epoch(1);

fn data(c: u64, from: u64, n: u64, version: u64) -> Bytes {
    bytes_of(
        &(from..from + n)
            .map(|l| payload(c, l, version))
            .collect::<Vec<_>>(),
    )
}

/// The smallest disk group there is: one capacity device of 4096 data
/// blocks, 3072 of them usable by components, so the free-space map hands
/// freed blocks out again after a few thousand block writes.
async fn small_group() -> Arc<DiskGroup> {
    small_group_with(false).await
}

/// As [`small_group`]; with `page_cache`, the host's page cache holds the
/// whole capacity device, so one-block reads are served on the caller's
/// thread by asking it (`Disk::read_at_if_cached`).
async fn small_group_with(page_cache: bool) -> Arc<DiskGroup> {
    let capacity = FaultDisk::new("capacity0", (4096 + 2) * 4096);
    if page_cache {
        capacity.hold_in_cache(0..capacity.size());
    }
    let devices = GroupDevices {
        cache: Arc::new(FaultDisk::new("cache", common::CACHE_BYTES)) as Arc<dyn Disk>,
        capacity: vec![Arc::new(capacity) as Arc<dyn Disk>],
        keys: None,
    };
    DiskGroup::create_on(
        DiskGroupId::new("dg-cbrc").unwrap(),
        devices,
        1 << 20,
        false,
    )
    .await
    .expect("create disk group")
}

fn delta(after: ContentCacheStats, before: ContentCacheStats) -> (u64, u64) {
    (after.hits - before.hits, after.misses - before.misses)
}

/// Eight clones of one image read every block: the first reads each block
/// from the device, the other seven find it in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_clones_of_one_image_read_each_block_from_the_device_once() {
    const N: u64 = 512;
    let rig = Rig::new(2);
    let dg = rig.create().await;
    let clones: Vec<ComponentId> = (1..=8).map(ComponentId).collect();
    for c in &clones {
        dg.create_component(*c, N * 4096, 0).await.unwrap();
    }
    let image = data(1, 0, N, 1);
    dg.write(clones[0], Lba(0), image.clone(), E).await.unwrap();
    for c in &clones[1..] {
        dg.clone_blocks(clones[0], Lba(0), *c, Lba(0), N, E)
            .await
            .unwrap();
    }
    dg.settle().await.unwrap();
    let before = dg.content_cache_stats();
    assert_eq!(
        before.budget_bytes,
        tessera_store::CONTENT_CACHE_BYTES_DEFAULT
    );
    // Each clone reads the image as a guest boots: runs of 1 to 32 blocks
    // (lone reads take the inline path, longer ones the reader threads).
    for (k, c) in clones.iter().enumerate() {
        let mut lba = 0;
        let mut step = 1 + k as u64 % 3;
        while lba < N {
            let n = step.min(N - lba);
            let got = dg.read(*c, Lba(lba), n as u32).await.unwrap();
            assert_eq!(
                got,
                image.slice((lba * 4096) as usize..((lba + n) * 4096) as usize),
                "{c} LBA {lba}"
            );
            lba += n;
            step = step * 2 % 33;
        }
    }
    let after = dg.content_cache_stats();
    let (hits, misses) = delta(after, before);
    assert_eq!(
        misses, N,
        "only the first clone reads the devices: {after:?}"
    );
    assert_eq!(hits, 7 * N, "{after:?}");
    assert!(hits * 8 >= (hits + misses) * 7);
    assert_eq!(after.entries, N);
    assert_eq!(after.bytes_cached, N * 4096);
    assert!(after.memory_bytes <= after.budget_bytes);
}

/// A rebuild or resync copying a clone reads each block once: it neither
/// finds blocks in the content cache nor leaves any there, so copying a
/// volume does not push out what the guests share, and it reads what the
/// index says, logged or destaged, overwritten or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_for_a_rebuild_neither_uses_nor_fills_the_content_cache() {
    const N: u64 = 256;
    let rig = Rig::new(2);
    let dg = rig.create().await;
    let (image, clone) = (ComponentId(1), ComponentId(2));
    for c in [image, clone] {
        dg.create_component(c, N * 4096, 0).await.unwrap();
    }
    let original = data(1, 0, N, 1);
    dg.write(image, Lba(0), original.clone(), E).await.unwrap();
    dg.clone_blocks(image, Lba(0), clone, Lba(0), N, E)
        .await
        .unwrap();
    dg.settle().await.unwrap();
    // A guest of the image warms the cache with its first half.
    dg.read(image, Lba(0), (N / 2) as u32).await.unwrap();
    // The clone's copy changes a few blocks (still in the log).
    let changed = data(2, 8, 4, 2);
    dg.write(clone, Lba(8), changed.clone(), E).await.unwrap();
    let mut expected = original.to_vec();
    expected[8 * 4096..12 * 4096].copy_from_slice(&changed);
    let before = dg.content_cache_stats();
    for start in (0..N).step_by(64) {
        let got = dg.read_for_copy(clone, Lba(start), 64).await.unwrap();
        assert_eq!(
            &got[..],
            &expected[(start * 4096) as usize..((start + 64) * 4096) as usize],
            "LBA {start}"
        );
    }
    let single = dg.read_for_copy(clone, Lba(N - 1), 1).await.unwrap();
    assert_eq!(&single[..], &expected[((N - 1) * 4096) as usize..]);
    let after = dg.content_cache_stats();
    assert_eq!(delta(after, before), (0, 0), "{after:?}");
    assert_eq!(after.entries, before.entries, "{after:?}");
    // A guest read still finds what the image's guest left there.
    dg.read(clone, Lba(16), 16).await.unwrap();
    let guest = delta(dg.content_cache_stats(), after);
    assert_eq!(guest, (16, 0));
}

/// Eight clones boot at once: each reads the image in the same runs at the
/// same time as the others, from a device slow enough that their reads of
/// a run overlap. A read that misses blocks another read is already
/// fetching waits for that read instead of reading them again: every block
/// still comes from the device once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_clones_booting_at_once_read_each_block_from_the_device_once() {
    const N: u64 = 256;
    let rig = Rig::new(1);
    let dg = rig.create().await;
    let clones: Vec<ComponentId> = (1..=8).map(ComponentId).collect();
    for c in &clones {
        dg.create_component(*c, N * 4096, 0).await.unwrap();
    }
    let image = data(1, 0, N, 1);
    dg.write(clones[0], Lba(0), image.clone(), E).await.unwrap();
    for c in &clones[1..] {
        dg.clone_blocks(clones[0], Lba(0), *c, Lba(0), N, E)
            .await
            .unwrap();
    }
    dg.settle().await.unwrap();
    let before = dg.content_cache_stats();
    rig.capacity[0].set_delay(std::time::Duration::from_millis(2));
    let boots: Vec<_> = clones
        .iter()
        .map(|c| {
            let (dg, c, image) = (dg.clone(), *c, image.clone());
            tokio::spawn(async move {
                // Runs of 1, 8 and 32 blocks, the same for every clone.
                let mut lba = 0;
                for step in [1u64, 8, 32].into_iter().cycle() {
                    if lba >= N {
                        break;
                    }
                    let n = step.min(N - lba);
                    let got = dg.read(c, Lba(lba), n as u32).await.unwrap();
                    let want = image.slice((lba * 4096) as usize..((lba + n) * 4096) as usize);
                    assert_eq!(got, want, "{c} LBA {lba}");
                    lba += n;
                }
            })
        })
        .collect();
    for b in boots {
        b.await.unwrap();
    }
    rig.capacity[0].set_delay(std::time::Duration::ZERO);
    let after = dg.content_cache_stats();
    let (hits, misses) = delta(after, before);
    let joined = after.joined - before.joined;
    assert_eq!(
        misses, N,
        "each block is read from the device once: {after:?}"
    );
    assert_eq!(hits + joined, 7 * N, "{after:?}");
    assert!(joined > 0, "no read waited for another: {after:?}");
}

/// Overwriting, unmapping and deleting one sharer of a cached block never
/// changes what the others read, a read after an overwrite returns the new
/// data, and so it stays while the freed locations are handed out again
/// for new data (many times over the small group's capacity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_to_one_sharer_never_show_through_the_cache() {
    const N: u64 = 512;
    let (a, b, c) = (ComponentId(1), ComponentId(2), ComponentId(3));
    let dg = small_group().await;
    for id in [a, b, c] {
        dg.create_component(id, N * 4096, 0).await.unwrap();
    }
    dg.write(a, Lba(0), data(1, 0, N, 1), E).await.unwrap();
    dg.clone_blocks(a, Lba(0), b, Lba(0), N, E).await.unwrap();
    dg.clone_blocks(a, Lba(0), c, Lba(0), N, E).await.unwrap();
    dg.settle().await.unwrap();
    for id in [a, b, c] {
        assert_eq!(
            dg.read(id, Lba(0), N as u32).await.unwrap(),
            data(1, 0, N, 1)
        );
    }
    assert_eq!(dg.content_cache_stats().entries, N);

    // Overwrite a's first half, unmap the middle of b, delete c.
    dg.write(a, Lba(0), data(1, 0, N / 2, 2), E).await.unwrap();
    assert_eq!(dg.read(a, Lba(0), 4).await.unwrap(), data(1, 0, 4, 2));
    dg.unmap(b, Lba(256), 128, E).await.unwrap();
    dg.delete_component(c).await.unwrap();
    let check = |dg: Arc<DiskGroup>| async move {
        assert_eq!(
            dg.read(a, Lba(0), N as u32).await.unwrap(),
            bytes_of(&[data(1, 0, N / 2, 2), data(1, N / 2, N / 2, 1)].map(|d| d.to_vec()))
        );
        let got = dg.read(b, Lba(0), N as u32).await.unwrap();
        assert_eq!(got.slice(..256 * 4096), data(1, 0, 256, 1));
        assert!(got[256 * 4096..384 * 4096].iter().all(|&x| x == 0));
        assert_eq!(got.slice(384 * 4096..), data(1, 384, 128, 1));
    };
    check(dg.clone()).await;
    dg.settle().await.unwrap();
    check(dg.clone()).await;
    dg.create_component(c, N * 4096, 0).await.unwrap();
    assert!(dg
        .read(c, Lba(0), N as u32)
        .await
        .unwrap()
        .iter()
        .all(|&x| x == 0));

    // Churn: every round overwrites all of a and 64 blocks of b, shares a
    // stretch of a into c, destages and checkpoints, so the blocks read (and
    // cached) in the round before are freed and, as the allocator goes round
    // the device, handed out again for new data.
    let mut written = 0u64;
    for round in 3..20u64 {
        dg.write(a, Lba(0), data(1, 0, N, round), E).await.unwrap();
        dg.write(b, Lba(round % 8), data(2, round % 8, 64, round), E)
            .await
            .unwrap();
        dg.clone_blocks(a, Lba(100), c, Lba(100 + round), 50, E)
            .await
            .unwrap();
        written += N + 64;
        dg.settle().await.unwrap();
        assert_eq!(
            dg.read(a, Lba(0), N as u32).await.unwrap(),
            data(1, 0, N, round)
        );
        let got = dg.read(b, Lba(round % 8), 64).await.unwrap();
        assert_eq!(got, data(2, round % 8, 64, round));
        let got = dg.read(c, Lba(100 + round), 50).await.unwrap();
        assert_eq!(got, data(1, 100, 50, round));
        // Lone reads take the inline path.
        for l in [0, 77, 300, N - 1] {
            assert_eq!(dg.read(a, Lba(l), 1).await.unwrap(), payload(1, l, round));
        }
    }
    assert!(written > 2 * 4096, "the device must have been gone round");
    let s = dg.content_cache_stats();
    assert!(
        s.invalidated > 0,
        "freed locations lose their entries: {s:?}"
    );
    assert!(s.hits > 0, "{s:?}");
}

/// A budget of 0 disables the cache: every read goes to the device and
/// nothing is held. Changing the budget while the group runs takes effect
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_of_zero_disables_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::file_config(dir.path(), "dg-nocache");
    config.content_cache_bytes = 0;
    let dg = DiskGroup::create(config.clone()).await.unwrap();
    let (x, y) = (ComponentId(1), ComponentId(2));
    dg.create_component(x, 64 * 4096, 0).await.unwrap();
    dg.create_component(y, 64 * 4096, 0).await.unwrap();
    dg.write(x, Lba(0), data(1, 0, 64, 1), E).await.unwrap();
    dg.clone_blocks(x, Lba(0), y, Lba(0), 64, E).await.unwrap();
    dg.settle().await.unwrap();
    for id in [x, y, x] {
        assert_eq!(dg.read(id, Lba(0), 64).await.unwrap(), data(1, 0, 64, 1));
        assert_eq!(dg.read(id, Lba(5), 1).await.unwrap(), payload(1, 5, 1));
    }
    let s = dg.content_cache_stats();
    assert_eq!((s.hits, s.misses, s.inserted), (0, 3 * 65, 0), "{s:?}");
    assert_eq!((s.entries, s.bytes_cached, s.budget_bytes), (0, 0, 0));

    // Turned on, then off again while the group runs.
    dg.set_content_cache_bytes(1 << 20);
    dg.read(x, Lba(0), 64).await.unwrap();
    dg.read(y, Lba(0), 64).await.unwrap();
    let s = dg.content_cache_stats();
    assert_eq!((s.hits, s.entries), (64, 64), "{s:?}");
    dg.set_content_cache_bytes(0);
    dg.read(y, Lba(0), 64).await.unwrap();
    let s = dg.content_cache_stats();
    assert_eq!((s.hits, s.entries, s.bytes_cached), (64, 0, 0), "{s:?}");
    drop(dg);

    // The configured budget holds after a reopen too.
    let dg = DiskGroup::open(config).await.unwrap();
    dg.read(x, Lba(0), 64).await.unwrap();
    dg.read(y, Lba(0), 64).await.unwrap();
    let s = dg.content_cache_stats();
    assert_eq!((s.hits, s.misses, s.entries), (0, 128, 0), "{s:?}");
}

// The property test: random operations on three small components of the
// small group, against a model, with a cache of a few blocks.

const COMPONENTS: u64 = 3;
const BLOCKS: u64 = 384;

#[derive(Debug, Clone)]
enum Op {
    Write {
        c: u64,
        slot: u64,
        n: u64,
    },
    /// Overwrites every component whole: makes the allocator go round, so
    /// freed locations are handed out again.
    Churn,
    Unmap {
        c: u64,
        slot: u64,
        n: u64,
    },
    Clone {
        src: u64,
        from: u64,
        dst: u64,
        to: u64,
        n: u64,
    },
    Read {
        c: u64,
        slot: u64,
        n: u64,
    },
    Settle,
    Recreate {
        c: u64,
    },
}

/// Most operations land on the first blocks of a component, so reads find
/// what earlier reads of sharers cached.
fn at(slot: u64) -> u64 {
    slot % 24
}

fn op() -> impl Strategy<Value = Op> {
    let c = 0..COMPONENTS;
    prop_oneof![
        6 => (c.clone(), any::<u64>(), 1u64..8).prop_map(|(c, slot, n)| Op::Write { c, slot, n }),
        2 => Just(Op::Churn),
        2 => (c.clone(), any::<u64>(), 1u64..8).prop_map(|(c, slot, n)| Op::Unmap { c, slot, n }),
        4 => (c.clone(), any::<u64>(), c.clone(), any::<u64>(), 1u64..16)
            .prop_map(|(src, from, dst, to, n)| Op::Clone { src, from, dst, to, n }),
        12 => (c.clone(), any::<u64>(), 1u64..8).prop_map(|(c, slot, n)| Op::Read { c, slot, n }),
        2 => Just(Op::Settle),
        1 => c.prop_map(|c| Op::Recreate { c }),
    ]
}

fn id(c: u64) -> ComponentId {
    ComponentId(10 + c)
}

type Model = BTreeMap<(u64, u64), (u64, u64, u64)>;

async fn check_read(
    dg: &DiskGroup,
    model: &Model,
    c: u64,
    lba: u64,
    n: u64,
) -> Result<(), TestCaseError> {
    let got = dg
        .read(id(c), Lba(lba), n as u32)
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    for i in 0..n {
        let b = &got[(i * 4096) as usize..((i + 1) * 4096) as usize];
        match model.get(&(c, lba + i)) {
            Some(&(pc, pl, v)) => prop_assert!(
                b == &payload(pc, pl, v)[..],
                "{} LBA {} should hold {:?}",
                id(c),
                lba + i,
                (pc, pl, v)
            ),
            None => prop_assert!(
                b.iter().all(|&x| x == 0),
                "{} LBA {} should read zeros",
                id(c),
                lba + i
            ),
        }
    }
    Ok(())
}

async fn run(
    budget_blocks: u64,
    page_cache: bool,
    ops: Vec<Op>,
) -> Result<ContentCacheStats, TestCaseError> {
    let dg = small_group_with(page_cache).await;
    // Budget for a few entries (each 4 KiB plus its overhead).
    dg.set_content_cache_bytes(budget_blocks * (4096 + 192));
    for c in 0..COMPONENTS {
        dg.create_component(id(c), BLOCKS * 4096, 0).await.unwrap();
    }
    let mut model = Model::new();
    let mut version = 0u64;
    let fail = |e: tessera_store::StoreError| TestCaseError::fail(e.to_string());
    for op in ops {
        match op {
            Op::Write { c, slot, n } => {
                let lba = at(slot);
                version += 1;
                dg.write(id(c), Lba(lba), data(id(c).0, lba, n, version), E)
                    .await
                    .map_err(fail)?;
                for i in 0..n {
                    model.insert((c, lba + i), (id(c).0, lba + i, version));
                }
            }
            Op::Churn => {
                version += 1;
                for c in 0..COMPONENTS {
                    dg.write(id(c), Lba(0), data(id(c).0, 0, BLOCKS, version), E)
                        .await
                        .map_err(fail)?;
                    for l in 0..BLOCKS {
                        model.insert((c, l), (id(c).0, l, version));
                    }
                }
            }
            Op::Unmap { c, slot, n } => {
                let lba = at(slot);
                dg.unmap(id(c), Lba(lba), n, E).await.map_err(fail)?;
                for i in 0..n {
                    model.remove(&(c, lba + i));
                }
            }
            Op::Clone {
                src,
                from,
                dst,
                to,
                n,
            } => {
                let (from, to) = (at(from), at(to));
                let r = dg
                    .clone_blocks(id(src), Lba(from), id(dst), Lba(to), n, E)
                    .await;
                if src == dst && from < to + n && to < from + n {
                    prop_assert!(r.is_err(), "an overlapping copy must be refused");
                    continue;
                }
                r.map_err(fail)?;
                for i in 0..n {
                    match model.get(&(src, from + i)).copied() {
                        Some(p) => model.insert((dst, to + i), p),
                        None => model.remove(&(dst, to + i)),
                    };
                }
            }
            Op::Read { c, slot, n } => check_read(&dg, &model, c, at(slot), n).await?,
            Op::Settle => dg.settle().await.map_err(fail)?,
            Op::Recreate { c } => {
                dg.delete_component(id(c)).await.map_err(fail)?;
                dg.create_component(id(c), BLOCKS * 4096, 0)
                    .await
                    .map_err(fail)?;
                model.retain(|k, _| k.0 != c);
            }
        }
        let s = dg.content_cache_stats();
        prop_assert!(s.entries <= budget_blocks, "{:?}", s);
    }
    dg.settle().await.map_err(fail)?;
    for c in 0..COMPONENTS {
        check_read(&dg, &model, c, 0, BLOCKS).await?;
        check_read(&dg, &model, c, 0, 32).await?;
    }
    Ok(dg.content_cache_stats())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(16),
        ..ProptestConfig::default()
    })]

    /// Every read equals the model while a cache of 1 to 12 blocks evicts
    /// (or one that holds everything keeps entries long), and locations it
    /// held are freed and handed out again; with the page cache holding
    /// the device too, where a block read from it takes the buffer of an
    /// evicted entry for the next.
    #[test]
    fn reads_through_a_tiny_cache_agree_with_the_model(
        budget_blocks in prop_oneof![3 => 1u64..12, 1 => Just(4096u64)],
        page_cache in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..100),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let s = rt.block_on(run(budget_blocks, page_cache, ops))?;
        prop_assert!(s.entries <= budget_blocks);
    }
}
