//! Bit flips in data and in metadata are all detected and reported with
//! their location; none reaches a caller as data. Covers client reads, the
//! scrubber, mount and the offline check.

mod common;

use common::{bytes_of, decode, payload, Rig};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use tessera_env::FaultDisk;
use tessera_store::{check_devices, DiskGroup, DiskGroupHealth, StoreError};
use tessera_types::{ComponentId, DiskGroupId, Epoch, Lba};

const C: ComponentId = ComponentId(5);
const BLOCKS: u64 = 400;

/// LBA -> byte offset of every payload block of component C on `disk`.
fn find_payloads(disk: &FaultDisk, size: u64) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    for off in (0..size).step_by(4096) {
        if let Ok(Some((c, lba, _))) = decode(&disk.peek(off, 4096)) {
            if c == C.0 {
                out.insert(lba, off);
            }
        }
    }
    out
}

/// Byte offsets of blocks that start with `magic`.
fn find_magic(disk: &FaultDisk, size: u64, magic: &[u8; 8]) -> Vec<u64> {
    (0..size)
        .step_by(4096)
        .filter(|off| disk.peek(*off, 8) == magic)
        .collect()
}

/// Creates component C and writes version 1 of each of its blocks, eight
/// at a time, then lets the destager put them all on the capacity tier.
async fn write_every_block(dg: &DiskGroup) {
    dg.create_component(C, BLOCKS * 4096, 0).await.unwrap();
    for lba in (0..BLOCKS).step_by(8) {
        let data: Vec<Vec<u8>> = (lba..lba + 8).map(|l| payload(C.0, l, 1)).collect();
        dg.write(C, Lba(lba), bytes_of(&data), Epoch(1))
            .await
            .unwrap();
    }
    dg.settle().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_data_bits_are_found_by_reads_and_by_the_scrubber() {
    let rig = Rig::new(2);
    let dg = rig.create().await;
    write_every_block(&dg).await;
    let mut places = BTreeMap::new();
    for (i, d) in rig.capacity.iter().enumerate() {
        for (lba, off) in find_payloads(d, common::CAPACITY_BYTES) {
            places.insert(lba, (i, off));
        }
    }
    assert_eq!(places.len() as u64, BLOCKS, "every block destaged once");
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut flipped = BTreeSet::new();
    while flipped.len() < 60 {
        let lba = rng.gen_range(0..BLOCKS);
        if flipped.insert(lba) {
            let (dev, off) = places[&lba];
            rig.capacity[dev].flip_bit(off + rng.gen_range(0..4096), rng.gen());
        }
    }
    for lba in 0..BLOCKS {
        match dg.read(C, Lba(lba), 1).await {
            Ok(b) => {
                assert!(
                    !flipped.contains(&lba),
                    "LBA {lba}: corrupted data returned"
                );
                assert_eq!(b, payload(C.0, lba, 1));
            }
            Err(StoreError::Checksum { component, lba: at }) => {
                assert_eq!((component, at), (C, Lba(lba)));
                assert!(flipped.contains(&lba), "LBA {lba}: false alarm");
            }
            Err(e) => panic!("LBA {lba}: {e}"),
        }
    }
    // A multi-block read names the first bad block and returns nothing.
    let first = *flipped.iter().next().unwrap();
    let from = first.saturating_sub(3);
    match dg.read(C, Lba(from), 8).await {
        Err(StoreError::Checksum { lba, .. }) => assert_eq!(lba, Lba(first)),
        other => panic!("expected a checksum error, got {other:?}"),
    }
    let report = dg.scrub(0).await.unwrap();
    let found: BTreeSet<u64> = report.bad.iter().map(|b| b.lba.0).collect();
    assert_eq!(
        found, flipped,
        "the scrubber finds exactly the flipped blocks"
    );
    for b in &report.bad {
        let (dev, off) = places[&b.lba.0];
        assert_eq!(
            b.location,
            format!("device {} block {}", dev + 1, off / 4096)
        );
    }
    let p = dg.scrub_progress();
    assert_eq!(
        (p.blocks_done, p.blocks_total, p.errors),
        (BLOCKS, BLOCKS, 60)
    );
    println!(
        "data bit flips: injected 60, detected by reads 60, by scrub {}",
        found.len()
    );
    // A pass started from a position (a pass a restart cut off) checks
    // only what is left and counts the rest as done.
    let from = tessera_store::ScrubCursor {
        component: C,
        lba: Lba(BLOCKS / 2),
    };
    let rest = dg.scrub_from(from, 0).await.unwrap();
    assert_eq!(rest.blocks_checked, BLOCKS / 2);
    let rest_found: BTreeSet<u64> = rest.bad.iter().map(|b| b.lba.0).collect();
    let expected: BTreeSet<u64> = flipped.range(BLOCKS / 2..).copied().collect();
    assert_eq!(rest_found, expected);
    let progress = dg.scrub_progress();
    assert_eq!(
        (progress.blocks_done, progress.blocks_total),
        (BLOCKS, BLOCKS)
    );
    assert_eq!(
        progress.cursor,
        tessera_store::ScrubCursor {
            component: C,
            lba: Lba(BLOCKS)
        }
    );
    // Rewriting a bad block repairs it.
    dg.write(C, Lba(first), bytes_of(&[payload(C.0, first, 2)]), Epoch(1))
        .await
        .unwrap();
    assert_eq!(
        dg.read(C, Lba(first), 1).await.unwrap(),
        payload(C.0, first, 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_index_pages_fail_their_component_with_the_location() {
    let rig = Rig::new(1);
    let dg = rig.create().await;
    dg.create_component(C, BLOCKS * 4096, 0).await.unwrap();
    let other = ComponentId(6);
    dg.create_component(other, BLOCKS * 4096, 0).await.unwrap();
    dg.write(C, Lba(0), bytes_of(&[payload(C.0, 0, 1)]), Epoch(1))
        .await
        .unwrap();
    dg.write(other, Lba(0), bytes_of(&[payload(other.0, 0, 1)]), Epoch(1))
        .await
        .unwrap();
    dg.settle().await.unwrap();
    drop(dg);
    let rig = rig.process_crash();
    // Flip a bit in every index page block of component C (both slots).
    let pages = find_magic(&rig.capacity[0], common::CAPACITY_BYTES, b"TSINDEXP");
    let mut hit = Vec::new();
    for off in pages {
        let body = rig.capacity[0].peek(off + 32, 8);
        if u64::from_le_bytes(body.try_into().unwrap()) == C.0 {
            rig.capacity[0].flip_bit(off + 100, 1);
            hit.push(off / 4096);
        }
    }
    assert!(!hit.is_empty());
    let dg = rig.open().await;
    match dg.read(C, Lba(0), 1).await {
        Err(StoreError::ComponentFailed { component, reason }) => {
            assert_eq!(component, C);
            assert!(
                hit.iter()
                    .any(|b| reason.contains(&format!("device 1 block {b}"))),
                "{reason}"
            );
        }
        other => panic!("expected a failed component, got {other:?}"),
    }
    match dg.health() {
        DiskGroupHealth::Degraded {
            failed_components, ..
        } => assert_eq!(failed_components, vec![C]),
        h => panic!("{h:?}"),
    }
    // The other component is untouched.
    assert_eq!(
        dg.read(other, Lba(0), 1).await.unwrap(),
        payload(other.0, 0, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_block_in_the_write_log_is_reported_not_returned() {
    let rig = Rig::new(1);
    let dg = rig.create().await;
    dg.create_component(C, BLOCKS * 4096, 0).await.unwrap();
    dg.write(C, Lba(9), bytes_of(&[payload(C.0, 9, 1)]), Epoch(1))
        .await
        .unwrap();
    // A later group commit, so the damaged record is known to have been synced.
    dg.write(C, Lba(10), bytes_of(&[payload(C.0, 10, 1)]), Epoch(1))
        .await
        .unwrap();
    drop(dg);
    let rig = rig.process_crash();
    let found = find_payloads(&rig.cache, common::CACHE_BYTES);
    let off = found[&9];
    rig.cache.flip_bit(off + 77, 3);
    let dg = rig.open().await;
    assert!(matches!(
        dg.read(C, Lba(9), 1).await,
        Err(StoreError::Checksum {
            component: C,
            lba: Lba(9)
        })
    ));
    assert_eq!(dg.read(C, Lba(10), 1).await.unwrap(), payload(C.0, 10, 1));
    dg.settle().await.unwrap();
    let report = dg.scrub(0).await.unwrap();
    assert_eq!(report.bad.len(), 1);
    assert_eq!(report.bad[0].lba, Lba(9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_check_lists_every_damaged_block_with_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::file_config(dir.path(), "dg-check");
    let dg = DiskGroup::create(config.clone()).await.unwrap();
    dg.create_component(C, BLOCKS * 4096, 0).await.unwrap();
    for lba in 0..64 {
        dg.write(C, Lba(lba), bytes_of(&[payload(C.0, lba, 1)]), Epoch(1))
            .await
            .unwrap();
    }
    dg.settle().await.unwrap();
    dg.write(C, Lba(100), bytes_of(&[payload(C.0, 100, 1)]), Epoch(1))
        .await
        .unwrap();
    drop(dg);
    let paths = vec![config.cache.path.clone(), config.capacity[0].path.clone()];
    let clean = check_devices(&paths).unwrap();
    assert!(clean.is_clean(), "{clean}");
    assert_eq!(clean.data_blocks, 64);
    assert!(clean.log_records >= 1);
    // Flip one bit in 5 data blocks of the capacity file.
    let mut file = std::fs::read(&paths[1]).unwrap();
    let mut damaged = Vec::new();
    for off in (0..file.len()).step_by(4096) {
        if let Ok(Some((c, lba, _))) = decode(&file[off..off + 4096]) {
            if c == C.0 && lba % 13 == 0 {
                damaged.push((lba, off as u64));
            }
        }
    }
    for (_, off) in &damaged {
        file[*off as usize + 1000] ^= 0x10;
    }
    std::fs::write(&paths[1], &file).unwrap();
    let report = check_devices(&paths).unwrap();
    println!("{report}");
    assert_eq!(report.problems.len(), damaged.len(), "{report}");
    for (lba, off) in damaged {
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.offset == off && p.problem.contains(&format!("LBA {lba}:"))),
            "LBA {lba} at {off} not reported: {report}"
        );
    }
    // The store refuses the damaged blocks too, and still opens.
    let dg = DiskGroup::open(config).await.unwrap();
    assert!(matches!(
        dg.read(C, Lba(13), 1).await,
        Err(StoreError::Checksum { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_errors_fail_the_group_or_the_components_on_the_device() {
    // A capacity device error fails the components with blocks there.
    let rig = Rig::new(2);
    let dg = rig.create().await;
    dg.create_component(C, BLOCKS * 4096, 0).await.unwrap();
    dg.write(C, Lba(0), bytes_of(&[payload(C.0, 0, 1)]), Epoch(1))
        .await
        .unwrap();
    dg.settle().await.unwrap();
    let places: Vec<usize> = (0..2)
        .filter(|i| !find_payloads(&rig.capacity[*i], common::CAPACITY_BYTES).is_empty())
        .collect();
    let dev = places[0];
    rig.capacity[dev].fail_range(0..common::CAPACITY_BYTES, tessera_env::FaultOps::Reads);
    assert!(matches!(
        dg.read(C, Lba(0), 1).await,
        Err(StoreError::ComponentFailed { .. })
    ));
    match dg.health() {
        DiskGroupHealth::Degraded {
            failed_devices,
            failed_components,
        } => {
            assert_eq!(failed_components, vec![C]);
            assert_eq!(failed_devices.len(), 1);
            assert!(failed_devices[0].0.contains(&format!("capacity{dev}")));
        }
        h => panic!("{h:?}"),
    }
    drop(dg);

    // A cache device error fails the whole group.
    let rig = Rig::new(1);
    let dg = rig.create().await;
    dg.create_component(C, BLOCKS * 4096, 0).await.unwrap();
    rig.cache
        .fail_range(0..common::CACHE_BYTES, tessera_env::FaultOps::Writes);
    assert!(matches!(
        dg.write(C, Lba(0), bytes_of(&[payload(C.0, 0, 1)]), Epoch(1))
            .await,
        Err(StoreError::DiskGroupFailed { .. })
    ));
    assert!(matches!(dg.health(), DiskGroupHealth::Failed { .. }));
    assert!(matches!(
        dg.read(C, Lba(0), 1).await,
        Err(StoreError::DiskGroupFailed { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_newest_checkpoint_never_opens_stale_data() {
    let rig = Rig::new(1);
    let dg = rig.create().await;
    dg.create_component(C, BLOCKS * 4096, 0).await.unwrap();
    for version in 1..=3u64 {
        let data: Vec<Vec<u8>> = (0..16).map(|l| payload(C.0, l, version)).collect();
        dg.write(C, Lba(0), bytes_of(&data), Epoch(1))
            .await
            .unwrap();
        dg.settle().await.unwrap();
    }
    drop(dg);
    let rig = rig.process_crash();
    let slots = find_magic(&rig.cache, common::CACHE_BYTES, b"TSCKPOIN");
    let newest = slots
        .iter()
        .max_by_key(|off| u64::from_le_bytes(rig.cache.peek(**off + 24, 8).try_into().unwrap()))
        .copied()
        .unwrap();
    rig.cache.flip_bit(newest + 40, 2);
    match DiskGroup::open_on(DiskGroupId::new("dg-test").unwrap(), rig.devices(), 1 << 20).await {
        Ok(dg) => {
            println!("opened from the older checkpoint and the log");
            let back = dg.read(C, Lba(0), 16).await.unwrap();
            for l in 0..16u64 {
                assert_eq!(
                    &back[(l * 4096) as usize..((l + 1) * 4096) as usize],
                    &payload(C.0, l, 3)[..]
                );
            }
        }
        Err(e) => {
            println!("refused: {e}");
            assert!(matches!(e, StoreError::DiskGroupFailed { .. }), "{e}")
        }
    }
}

/// Reads of file-backed devices go through the group's io_uring when
/// several are in flight (each completed by the kernel when its page is
/// in, or, on devices opened `O_DIRECT`, when the device has read it): a
/// flipped bit there is found the same way, and every other block reads
/// back as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_data_bits_are_found_by_reads_in_flight_together_on_file_devices() {
    flipped_bits_found_by_reads_in_flight(tessera_store::DirectIo::Off).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_data_bits_are_found_by_reads_in_flight_together_on_direct_devices() {
    flipped_bits_found_by_reads_in_flight(tessera_store::DirectIo::All).await;
}

async fn flipped_bits_found_by_reads_in_flight(direct_io: tessera_store::DirectIo) {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let capacity_path = dir.path().join("capacity0.img");
    let config = tessera_store::DiskGroupConfig {
        id: DiskGroupId::new("dg-ring-reads").unwrap(),
        cache: tessera_store::DeviceSpec {
            path: dir.path().join("cache.img"),
            size_bytes: 24 << 20,
        },
        capacity: vec![tessera_store::DeviceSpec {
            path: capacity_path.clone(),
            size_bytes: 32 << 20,
        }],
        index_cache_bytes: 1 << 20,
        content_cache_bytes: tessera_store::CONTENT_CACHE_BYTES_DEFAULT,
        direct_io,
        encryption: None,
    };
    let dg = DiskGroup::open_or_create(config).await.unwrap();
    write_every_block(&dg).await;
    // Where each block lies on the capacity file, and a flipped bit in
    // every seventh.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&capacity_path)
        .unwrap();
    let mut places = BTreeMap::new();
    let mut block = vec![0u8; 4096];
    for off in (0..32u64 << 20).step_by(4096) {
        file.read_exact_at(&mut block, off).unwrap();
        if let Ok(Some((c, lba, _))) = decode(&block) {
            if c == C.0 {
                places.insert(lba, off);
            }
        }
    }
    assert_eq!(places.len() as u64, BLOCKS, "every block destaged once");
    let flipped: BTreeSet<u64> = (0..BLOCKS).step_by(7).collect();
    for &lba in &flipped {
        let at = places[&lba] + 1000;
        let mut byte = [0u8; 1];
        file.read_exact_at(&mut byte, at).unwrap();
        file.write_all_at(&[byte[0] ^ 0x10], at).unwrap();
    }
    // Out of the page cache, so the reads reach the device (a block the
    // page cache holds is read on the caller's thread at once).
    file.sync_all().unwrap();
    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    let reads = (0..BLOCKS).map(|lba| {
        let dg = &dg;
        async move { (lba, dg.read(C, Lba(lba), 1).await) }
    });
    for (lba, read) in futures::future::join_all(reads).await {
        match read {
            Ok(b) => {
                assert!(
                    !flipped.contains(&lba),
                    "LBA {lba}: corrupted data returned"
                );
                assert_eq!(b, payload(C.0, lba, 1), "LBA {lba}");
            }
            Err(StoreError::Checksum { component, lba: at }) => {
                assert_eq!((component, at), (C, Lba(lba)));
                assert!(flipped.contains(&lba), "LBA {lba}: false alarm");
            }
            Err(e) => panic!("LBA {lba}: {e}"),
        }
    }
}
