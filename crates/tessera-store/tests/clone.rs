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
    let clean = check_devices(&paths);
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
    let report = check_devices(&paths);
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
