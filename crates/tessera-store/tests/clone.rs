//! Copies by reference (`DiskGroup::clone_blocks`, what EXTENDED COPY asks
//! for): the copy reads back like a data copy, uses no capacity blocks,
//! keeps its data when either side is overwritten or unmapped, survives
//! restarts and crashes, passes the offline check, and refuses bad requests
//! without changing anything.

mod common;

use common::{bytes_of, payload, Rig};
use tessera_store::{check_devices, DiskGroup, StoreError, CLONE_BLOCKS_MAX};
use tessera_types::{ComponentId, Epoch, Lba};

const SRC: ComponentId = ComponentId(11);
const DST: ComponentId = ComponentId(12);
const MIB: u64 = 1 << 20;
const BLOCKS: u64 = 512;

fn written(c: ComponentId, from: u64, n: u64, version: u64) -> bytes::Bytes {
    bytes_of(
        &(from..from + n)
            .map(|l| payload(c.0, l, version))
            .collect::<Vec<_>>(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_by_reference_shares_blocks_and_each_side_changes_alone() {
    let rig = Rig::new(2);
    let dg = rig.create().await;
    dg.create_component(SRC, 8 * MIB, 0).await.unwrap();
    dg.create_component(DST, 8 * MIB, 0).await.unwrap();
    // 256 blocks of data with a hole in the middle, written just now (still
    // in the write log: the copy must wait for them to be committed).
    dg.write(SRC, Lba(0), written(SRC, 0, 100, 1), Epoch(1))
        .await
        .unwrap();
    dg.write(SRC, Lba(150), written(SRC, 150, 106, 1), Epoch(1))
        .await
        .unwrap();
    // The destination held other data, which the copy replaces (and the
    // hole of the source becomes a hole of the destination).
    dg.write(DST, Lba(100), written(DST, 100, 50, 9), Epoch(1))
        .await
        .unwrap();
    dg.settle().await.unwrap();
    let physical_before = dg.space().physical_bytes;

    dg.clone_blocks(SRC, Lba(0), DST, Lba(0), 256, Epoch(1))
        .await
        .unwrap();
    let src = dg.read(SRC, Lba(0), 256).await.unwrap();
    assert_eq!(dg.read(DST, Lba(0), 256).await.unwrap(), src);
    assert_eq!(
        dg.allocated(DST, Lba(0), BLOCKS).await.unwrap(),
        vec![(Lba(0), 100), (Lba(150), 106)]
    );
    assert_eq!(dg.component_space(DST).unwrap().allocated_bytes, 206 * 4096);
    dg.settle().await.unwrap();
    // No data block was used: the destination's 50 old blocks were freed,
    // so the disk group holds less than before.
    let after = dg.space().physical_bytes;
    assert!(
        after <= physical_before - 50 * 4096 + 4 * 4096,
        "physical {physical_before} -> {after}"
    );

    // Overwriting the source leaves the copy as it was, and the reverse.
    dg.write(SRC, Lba(10), written(SRC, 10, 5, 2), Epoch(1))
        .await
        .unwrap();
    dg.write(DST, Lba(200), written(DST, 200, 1, 3), Epoch(1))
        .await
        .unwrap();
    dg.settle().await.unwrap();
    let d = dg.read(DST, Lba(10), 1).await.unwrap();
    assert_eq!(d, payload(SRC.0, 10, 1));
    assert_eq!(
        dg.read(SRC, Lba(10), 1).await.unwrap(),
        payload(SRC.0, 10, 2)
    );
    assert_eq!(
        dg.read(SRC, Lba(200), 1).await.unwrap(),
        payload(SRC.0, 200, 1)
    );
    assert_eq!(
        dg.read(DST, Lba(200), 1).await.unwrap(),
        payload(DST.0, 200, 3)
    );

    // Unmapping both returns every block; one side alone returns none.
    let shared_physical = dg.space().physical_bytes;
    dg.unmap(SRC, Lba(0), BLOCKS, Epoch(1)).await.unwrap();
    dg.settle().await.unwrap();
    assert_eq!(dg.read(DST, Lba(0), 1).await.unwrap(), payload(SRC.0, 0, 1));
    // Only the 6 blocks the source alone held come back.
    assert_eq!(
        dg.space().physical_bytes,
        shared_physical - 6 * 4096 - 2 * 2 * 4096
    );
    dg.unmap(DST, Lba(0), BLOCKS, Epoch(1)).await.unwrap();
    dg.settle().await.unwrap();
    assert_eq!(dg.space().physical_bytes, 0);
    assert_eq!(dg.component_space(DST).unwrap().allocated_bytes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_within_one_component_survive_restarts_and_power_cuts() {
    let mut rig = Rig::new(1);
    let mut dg = rig.create().await;
    dg.create_component(SRC, 8 * MIB, 0).await.unwrap();
    dg.write(SRC, Lba(0), written(SRC, 0, 64, 1), Epoch(1))
        .await
        .unwrap();
    // A chain: 0..64 -> 100..164 -> 200..264, then the middle overwritten.
    dg.clone_blocks(SRC, Lba(0), SRC, Lba(100), 64, Epoch(1))
        .await
        .unwrap();
    dg.clone_blocks(SRC, Lba(100), SRC, Lba(200), 64, Epoch(1))
        .await
        .unwrap();
    dg.write(SRC, Lba(100), written(SRC, 100, 32, 2), Epoch(1))
        .await
        .unwrap();
    let expect = |lba: u64| -> Vec<u8> {
        match lba {
            0..64 => payload(SRC.0, lba, 1),
            100..132 => payload(SRC.0, lba, 2),
            132..164 => payload(SRC.0, lba - 100, 1),
            200..264 => payload(SRC.0, lba - 200, 1),
            _ => vec![0u8; 4096],
        }
    };
    for round in 0..3u64 {
        // The acknowledged copies are in the log only (no checkpoint since
        // the last one): the crash replays them over the committed index.
        rig = match round {
            0 => rig.process_crash(),
            1 => rig.power_cut(7),
            _ => {
                dg.settle().await.unwrap();
                rig.process_crash()
            }
        };
        drop(dg);
        dg = rig.open().await;
        let all = dg.read(SRC, Lba(0), 300).await.unwrap();
        for lba in 0..300u64 {
            assert_eq!(
                &all[(lba * 4096) as usize..((lba + 1) * 4096) as usize],
                &expect(lba)[..],
                "round {round} LBA {lba}"
            );
        }
        assert_eq!(
            dg.component_space(SRC).unwrap().allocated_bytes,
            (64 + 64 + 64) * 4096
        );
    }
    // Settled, the disk group holds 64 + 32 data blocks and two index page
    // slots (every LBA here is in page 0 and 1).
    dg.settle().await.unwrap();
    assert_eq!(dg.space().physical_bytes, (96 + 2 * 2) * 4096);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_copies_are_refused_and_change_nothing() {
    let rig = Rig::new(1);
    let dg = rig.create().await;
    dg.create_component(SRC, 2 * MIB, 0).await.unwrap();
    dg.create_component(DST, 2 * MIB, 0).await.unwrap();
    dg.write(SRC, Lba(0), written(SRC, 0, 16, 1), Epoch(5))
        .await
        .unwrap();
    dg.fence(DST, Epoch(5)).await.unwrap();
    let cases: Vec<(ComponentId, u64, ComponentId, u64, u64, u64, &str)> = vec![
        (SRC, 0, SRC, 8, 16, 5, "overlap"),
        (SRC, 500, DST, 0, 16, 5, "source out of range"),
        (SRC, 0, DST, 510, 16, 5, "destination out of range"),
        (SRC, 0, DST, 0, 16, 4, "stale epoch"),
        (SRC, 0, ComponentId(99), 0, 16, 5, "no such component"),
        (SRC, 0, DST, 0, CLONE_BLOCKS_MAX + 1, 5, "too large"),
    ];
    for (s, sl, d, dl, n, epoch, what) in cases {
        let r = dg
            .clone_blocks(s, Lba(sl), d, Lba(dl), n, Epoch(epoch))
            .await;
        match (what, &r) {
            ("overlap" | "too large", Err(StoreError::Misaligned { .. }))
            | (_, Err(StoreError::OutOfRange { .. }))
            | ("stale epoch", Err(StoreError::StaleEpoch { .. }))
            | ("no such component", Err(StoreError::NoSuchComponent { .. })) => {}
            _ => panic!("{what}: {r:?}"),
        }
        assert_eq!(
            dg.component_space(DST).unwrap().allocated_bytes,
            0,
            "{what}"
        );
        assert_eq!(
            dg.read(SRC, Lba(0), 16).await.unwrap(),
            written(SRC, 0, 16, 1)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_check_accepts_shared_blocks_and_finds_damage_in_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::file_config(dir.path(), "dg-clone");
    let dg = DiskGroup::create(config.clone()).await.unwrap();
    dg.create_component(SRC, 4 * MIB, 0).await.unwrap();
    dg.create_component(DST, 4 * MIB, 0).await.unwrap();
    dg.write(SRC, Lba(0), written(SRC, 0, 32, 1), Epoch(1))
        .await
        .unwrap();
    dg.clone_blocks(SRC, Lba(0), DST, Lba(0), 32, Epoch(1))
        .await
        .unwrap();
    dg.clone_blocks(SRC, Lba(0), SRC, Lba(500), 32, Epoch(1))
        .await
        .unwrap();
    dg.settle().await.unwrap();
    drop(dg);
    let paths = vec![config.cache.path.clone(), config.capacity[0].path.clone()];
    let clean = check_devices(&paths).unwrap();
    assert!(clean.is_clean(), "{clean}");
    assert_eq!(clean.data_blocks, 32, "shared blocks count once");

    // Reopened, the references are counted again: dropping two of the three
    // keeps the data; dropping the last frees it.
    let dg = DiskGroup::open(config.clone()).await.unwrap();
    dg.unmap(SRC, Lba(0), 1024, Epoch(1)).await.unwrap();
    dg.settle().await.unwrap();
    assert_eq!(
        dg.read(DST, Lba(0), 32).await.unwrap(),
        written(SRC, 0, 32, 1)
    );
    drop(dg);

    // A bit flipped in a shared block is reported for the entry that still
    // references it.
    let mut file = std::fs::read(&paths[1]).unwrap();
    let mut hit = None;
    for off in (0..file.len()).step_by(4096) {
        if let Ok(Some((c, 3, 1))) = common::decode(&file[off..off + 4096]) {
            if c == SRC.0 {
                hit = Some(off);
            }
        }
    }
    let off = hit.expect("the shared block of LBA 3 is on the capacity device");
    file[off + 2000] ^= 1;
    std::fs::write(&paths[1], &file).unwrap();
    let report = check_devices(&paths).unwrap();
    assert_eq!(report.problems.len(), 1, "{report}");
    assert!(report.problems[0].problem.contains("LBA 3"), "{report}");
    let dg = DiskGroup::open(config).await.unwrap();
    assert!(matches!(
        dg.read(DST, Lba(3), 1).await,
        Err(StoreError::Checksum {
            component: DST,
            lba: Lba(3)
        })
    ));
}

/// What the power-cut test knows: per source LBA the versions issued and the
/// last acknowledged; per destination LBA the oldest source version an
/// acknowledged copy may have left there.
#[derive(Default)]
struct CopyLedger {
    src_acked: std::collections::BTreeMap<u64, u64>,
    src_issued: std::collections::BTreeMap<u64, Vec<u64>>,
    dst_floor: std::collections::BTreeMap<u64, u64>,
}

const CUT_BLOCKS: u64 = 1024;
const CUT_WRITERS: u64 = 2;
const CUT_CHUNK: u64 = 64;

async fn source_writer(
    dg: std::sync::Arc<DiskGroup>,
    w: u64,
    seed: u64,
    first_version: u64,
    ledger: std::sync::Arc<parking_lot::Mutex<CopyLedger>>,
) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ w);
    let mut version = first_version + w;
    loop {
        let lba = rng.gen_range(0..CUT_BLOCKS / CUT_WRITERS) * CUT_WRITERS + w;
        ledger
            .lock()
            .src_issued
            .entry(lba)
            .or_default()
            .push(version);
        let data = bytes_of(&[payload(SRC.0, lba, version)]);
        if dg.write(SRC, Lba(lba), data, Epoch(1)).await.is_err() {
            return;
        }
        ledger.lock().src_acked.insert(lba, version);
        version += CUT_WRITERS;
    }
}

async fn copier(
    dg: std::sync::Arc<DiskGroup>,
    seed: u64,
    ledger: std::sync::Arc<parking_lot::Mutex<CopyLedger>>,
    copies: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    loop {
        let start = rng.gen_range(0..CUT_BLOCKS / CUT_CHUNK) * CUT_CHUNK;
        // Every source write acknowledged before the copy began is in it.
        let floor: Vec<u64> = {
            let l = ledger.lock();
            (start..start + CUT_CHUNK)
                .map(|x| l.src_acked.get(&x).copied().unwrap_or(0))
                .collect()
        };
        if dg
            .clone_blocks(SRC, Lba(start), DST, Lba(start), CUT_CHUNK, Epoch(1))
            .await
            .is_err()
        {
            return;
        }
        let mut l = ledger.lock();
        for (i, f) in floor.into_iter().enumerate() {
            l.dst_floor.insert(start + i as u64, f);
        }
        copies.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Checks one block against the ledger: it must be a source block of this
/// LBA, of a version issued, not older than `floor`; zeros only if nothing
/// was acknowledged there. Returns the version found (0 for zeros).
fn judge(
    ledger: &CopyLedger,
    what: &str,
    lba: u64,
    block: &[u8],
    floor: u64,
) -> Result<u64, String> {
    if block.iter().all(|&b| b == 0) {
        return if floor == 0 {
            Ok(0)
        } else {
            Err(format!(
                "{what} LBA {lba}: lost (zeros, version {floor} acknowledged)"
            ))
        };
    }
    match common::decode(block) {
        Ok(Some((c, l, v))) if c == SRC.0 && l == lba => {
            if !ledger
                .src_issued
                .get(&lba)
                .is_some_and(|vs| vs.contains(&v))
            {
                Err(format!("{what} LBA {lba}: version {v} was never written"))
            } else if v < floor {
                Err(format!(
                    "{what} LBA {lba}: version {v} older than acknowledged {floor}"
                ))
            } else {
                Ok(v)
            }
        }
        other => Err(format!("{what} LBA {lba}: torn or foreign block {other:?}")),
    }
}

/// Power cuts at random moments while source writes and copies by reference
/// run together: afterwards every acknowledged write and copy is there, every
/// block is whole and is a version that was written, and once settled the
/// disk group holds no block that nothing references.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_during_copies_lose_no_acknowledged_copy() {
    use rand::{Rng, SeedableRng};
    let cycles: u64 = std::env::var("TESSERA_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed_c0b1);
    let mut rig = Rig::new(1);
    let dg = rig.create().await;
    dg.create_component(SRC, CUT_BLOCKS * 4096, 0)
        .await
        .unwrap();
    dg.create_component(DST, CUT_BLOCKS * 4096, 0)
        .await
        .unwrap();
    drop(dg);
    let mut ledger = CopyLedger::default();
    let (mut copies_acked, mut problems) = (0u64, Vec::new());
    for cycle in 0..cycles {
        let dg = rig.open().await;
        let shared = std::sync::Arc::new(parking_lot::Mutex::new(std::mem::take(&mut ledger)));
        let copies = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut tasks = Vec::new();
        for w in 0..CUT_WRITERS {
            tasks.push(tokio::spawn(source_writer(
                dg.clone(),
                w,
                rng.gen(),
                (cycle + 1) * 1_000_000,
                shared.clone(),
            )));
        }
        tasks.push(tokio::spawn(copier(
            dg.clone(),
            rng.gen(),
            shared.clone(),
            copies.clone(),
        )));
        tokio::time::sleep(std::time::Duration::from_millis(rng.gen_range(20..120))).await;
        let next = rig.power_cut(rng.gen());
        for t in tasks {
            let _ = t.await;
        }
        drop(dg);
        rig = next;
        ledger = std::sync::Arc::try_unwrap(shared)
            .ok()
            .map(|m| m.into_inner())
            .unwrap_or_default();
        copies_acked += copies.load(std::sync::atomic::Ordering::Relaxed);
        let dg = rig.open().await;
        let src = dg.read(SRC, Lba(0), CUT_BLOCKS as u32).await.unwrap();
        let dst = dg.read(DST, Lba(0), CUT_BLOCKS as u32).await.unwrap();
        for lba in 0..CUT_BLOCKS {
            let at = (lba * 4096) as usize..((lba + 1) * 4096) as usize;
            let floor = ledger.src_acked.get(&lba).copied().unwrap_or(0);
            match judge(&ledger, "source", lba, &src[at.clone()], floor) {
                Ok(v) if v > 0 => {
                    ledger.src_acked.insert(lba, v);
                }
                Ok(_) => {}
                Err(p) => problems.push(format!("cycle {cycle}: {p}")),
            }
            let floor = ledger.dst_floor.get(&lba).copied().unwrap_or(0);
            match judge(&ledger, "copy", lba, &dst[at], floor) {
                Ok(v) if v > 0 => {
                    ledger.dst_floor.insert(lba, v);
                }
                Ok(_) => {}
                Err(p) => problems.push(format!("cycle {cycle}: {p}")),
            }
        }
        if cycle + 1 == cycles {
            // Settled: one block per distinct (LBA, version) still held.
            dg.settle().await.unwrap();
            let (mut held, mut pages) = (std::collections::BTreeSet::new(), 0);
            for table in [&ledger.src_acked, &ledger.dst_floor] {
                let mut mapped_pages = std::collections::BTreeSet::new();
                for (lba, v) in table.iter().filter(|(_, v)| **v > 0) {
                    held.insert((*lba, *v));
                    mapped_pages.insert(lba / 252);
                }
                pages += 2 * mapped_pages.len() as u64;
            }
            let physical = dg.space().physical_bytes / 4096;
            if physical != held.len() as u64 + pages {
                problems.push(format!(
                    "{physical} blocks in use, {} data blocks and {pages} page slots expected",
                    held.len()
                ));
            }
        }
        drop(dg);
    }
    eprintln!("{cycles} power cuts, {copies_acked} copies of {CUT_CHUNK} blocks acknowledged");
    assert!(copies_acked > 0, "no copy was acknowledged");
    assert!(problems.is_empty(), "{problems:#?}");
}
