//! Encryption at rest, seen from outside the store: what lies on the
//! devices, which keys open a group, and that corruption is still caught.

mod common;

use bytes::Bytes;
use common::{bytes_of, decode, payload, Rig};
use std::collections::BTreeSet;
use tessera_env::Disk;
use tessera_store::{AtRestKeys, DiskGroup, KeyEncryptionKey, StoreError};
use tessera_types::{ComponentId, DiskGroupId, Epoch, Lba};

const C: ComponentId = ComponentId(9);
const BLOCKS: u64 = 512;

/// The payload blocks written: small writes through the log and 256 KiB
/// writes placed straight on the capacity devices.
async fn write_known_pattern(dg: &DiskGroup) -> BTreeSet<Vec<u8>> {
    dg.create_component(C, BLOCKS * 4096, 0).await.unwrap();
    let mut written = BTreeSet::new();
    for lba in 0..64 {
        let block = payload(C.0, lba, 1);
        written.insert(block.clone());
        dg.write(C, Lba(lba), Bytes::from(block), Epoch(1))
            .await
            .unwrap();
    }
    for start in (64..BLOCKS).step_by(64) {
        let blocks: Vec<Vec<u8>> = (start..start + 64).map(|l| payload(C.0, l, 1)).collect();
        written.extend(blocks.iter().cloned());
        dg.write(C, Lba(start), bytes_of(&blocks), Epoch(1))
            .await
            .unwrap();
    }
    written
}

/// 4 KiB blocks of the images (at every 512-byte offset) that equal one
/// of `blocks`.
fn found_in(images: &[Vec<u8>], blocks: &BTreeSet<Vec<u8>>) -> usize {
    images
        .iter()
        .map(|img| {
            (0..img.len().saturating_sub(4095))
                .step_by(512)
                .filter(|&o| blocks.contains(&img[o..o + 4096]))
                .count()
        })
        .sum()
}

async fn read_all(dg: &DiskGroup) {
    let data = dg.read(C, Lba(0), BLOCKS as u32).await.unwrap();
    for lba in 0..BLOCKS {
        let block = &data[(lba * 4096) as usize..((lba + 1) * 4096) as usize];
        assert_eq!(decode(block).unwrap(), Some((C.0, lba, 1)), "LBA {lba}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_block_written_to_an_encrypted_group_lies_on_its_devices() {
    // The same writes on a plaintext group leave them all on the devices:
    // the scan finds what is there.
    let plain = Rig::new(2);
    let dg = plain.create().await;
    let written = write_known_pattern(&dg).await;
    dg.settle().await.unwrap();
    drop(dg);
    assert!(found_in(&plain.raw_images(), &written) >= written.len());

    let rig = Rig::encrypted(2);
    let dg = rig.create().await;
    let written = write_known_pattern(&dg).await;
    // Destaged to the capacity devices and still in the log.
    dg.settle().await.unwrap();
    read_all(&dg).await;
    drop(dg);
    assert_eq!(found_in(&rig.raw_images(), &written), 0);
    // Nor any shorter piece of them: the name of the group's data in
    // every block header is not in clear either.
    let marker = &written.iter().next().unwrap()[..24];
    for img in rig.raw_images() {
        assert!(!img.windows(24).any(|w| w == marker));
    }

    let next = rig.power_cut(7);
    let dg = next.open().await;
    read_all(&dg).await;
}

/// On files, whose devices take writes past the page cache, an encrypted
/// group's 256 KiB writes go through its io_uring as copies encrypted in
/// one pass (a plaintext group's go as they lie): what lands on the files
/// is ciphertext, and it reads back before it is destaged, after, and
/// after the group is opened again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_writes_to_an_encrypted_group_on_files_are_ciphertext_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::file_config(dir.path(), "dg-enc-files");
    config.encryption = Some(AtRestKeys::new(KeyEncryptionKey::generate().unwrap()));
    let dg = DiskGroup::open_or_create(config.clone()).await.unwrap();
    let written = write_known_pattern(&dg).await;
    read_all(&dg).await;
    dg.settle().await.unwrap();
    read_all(&dg).await;
    drop(dg);
    let images: Vec<Vec<u8>> = ["cache", "cap0"]
        .iter()
        .map(|f| std::fs::read(dir.path().join(f)).unwrap())
        .collect();
    assert_eq!(found_in(&images, &written), 0);
    let dg = DiskGroup::open_or_create(config).await.unwrap();
    read_all(&dg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_group_opens_only_with_the_key_that_sealed_its_data_key() {
    let rig = Rig::encrypted(1);
    let dg = rig.create().await;
    write_known_pattern(&dg).await;
    dg.flush().await.unwrap();
    drop(dg);
    let sealed_by = rig.keys.as_ref().unwrap().current.id();

    let mut without = rig.process_crash();
    without.keys = None;
    let err = DiskGroup::open_on(
        DiskGroupId::new("dg-test").unwrap(),
        without.devices(),
        1 << 20,
    )
    .await
    .err()
    .expect("opened without its key");
    assert!(matches!(err, StoreError::Encryption(_)), "{err}");
    assert!(err.to_string().contains(&sealed_by.to_string()), "{err}");

    let mut wrong = rig.process_crash();
    wrong.keys = Some(AtRestKeys::new(KeyEncryptionKey::generate().unwrap()));
    let err = DiskGroup::open_on(
        DiskGroupId::new("dg-test").unwrap(),
        wrong.devices(),
        1 << 20,
    )
    .await
    .err()
    .expect("opened with another key");
    assert!(err.to_string().contains(&sealed_by.to_string()), "{err}");

    // A key moved to the retired list still opens what it sealed.
    let mut retired = rig.process_crash();
    retired.keys = Some(AtRestKeys {
        current: KeyEncryptionKey::generate().unwrap(),
        retired: vec![rig.keys.as_ref().unwrap().current.clone()],
    });
    let dg = retired.open().await;
    read_all(&dg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_in_encrypted_data_is_a_checksum_error_not_data() {
    let rig = Rig::encrypted(1);
    let dg = rig.create().await;
    write_known_pattern(&dg).await;
    dg.settle().await.unwrap();
    drop(dg);
    // Flip one bit in every block the capacity device holds, once the
    // index pages are in memory and with no content cache: each data
    // block decrypts to a garbled block.
    let rig = rig.process_crash();
    let dg = rig.open().await;
    read_all(&dg).await;
    dg.set_content_cache_bytes(0);
    let cap = &rig.capacity[0];
    let before = cap.peek(0, cap.size() as usize);
    let mut flipped = 0;
    for off in (2 * 4096..cap.size()).step_by(4096) {
        if before[off as usize..off as usize + 4096]
            .iter()
            .any(|b| *b != 0)
        {
            cap.flip_bit(off + 100, 3);
            flipped += 1;
        }
    }
    assert!(flipped > 0);
    let mut bad = 0;
    for lba in 64..BLOCKS {
        match dg.read(C, Lba(lba), 1).await {
            Err(StoreError::Checksum { lba: at, .. }) => {
                assert_eq!(at, Lba(lba));
                bad += 1;
            }
            Ok(data) => panic!("LBA {lba} read despite a flipped bit: {:?}", decode(&data)),
            Err(e) => panic!("LBA {lba}: {e}"),
        }
    }
    assert_eq!(bad, BLOCKS - 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_rekey_rewrites_every_stored_block_while_the_group_serves() {
    let rig = Rig::encrypted(2);
    let keys = rig.keys.clone().unwrap();
    let dg = rig.create().await;
    write_known_pattern(&dg).await;
    dg.settle().await.unwrap();
    let before = rig.raw_images();
    assert_eq!(dg.encryption().unwrap().generation, 1);
    dg.set_rekey_rate(32 << 20);
    dg.start_deep_rekey(&keys).await.unwrap();
    let again = dg.start_deep_rekey(&keys).await.unwrap_err().to_string();
    assert!(again.contains("already under way"), "{again}");
    // Writes go on while it runs; progress only grows.
    let mut rewritten = BTreeSet::new();
    let mut last_done = 0;
    let mut lba = 0;
    while let Some(p) = dg.encryption().unwrap().rekey {
        assert!(
            p.done_bytes >= last_done && p.done_bytes <= p.total_bytes,
            "{p:?}"
        );
        last_done = p.done_bytes;
        dg.write(C, Lba(lba), Bytes::from(payload(C.0, lba, 2)), Epoch(1))
            .await
            .unwrap();
        rewritten.insert(lba);
        lba = (lba + 37) % BLOCKS;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(!rewritten.is_empty());
    assert!(last_done > 0);
    assert_eq!(dg.encryption().unwrap().generation, 2);
    let data = dg.read(C, Lba(0), BLOCKS as u32).await.unwrap();
    for lba in 0..BLOCKS {
        let version = if rewritten.contains(&lba) { 2 } else { 1 };
        let block = &data[(lba * 4096) as usize..((lba + 1) * 4096) as usize];
        assert_eq!(
            decode(block).unwrap(),
            Some((C.0, lba, version)),
            "LBA {lba}"
        );
    }
    dg.settle().await.unwrap();
    drop(dg);
    // No block the devices held before is still there as it was.
    let after = rig.raw_images();
    for (dev, (b, a)) in before.iter().zip(&after).enumerate() {
        let unchanged = (2..b.len() / 4096)
            .filter(|i| {
                let r = i * 4096..(i + 1) * 4096;
                b[r.clone()].iter().any(|x| *x != 0) && b[r.clone()] == a[r]
            })
            .count();
        assert_eq!(unchanged, 0, "device {dev}: blocks left under the old key");
    }
    let dg = rig.process_crash().open().await;
    assert_eq!(dg.encryption().unwrap().generation, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_check_reads_an_encrypted_group_with_its_key_only() {
    let dir = tempfile::tempdir().unwrap();
    let kek = KeyEncryptionKey::generate().unwrap();
    let mut config = common::file_config(dir.path(), "dg-check");
    config.encryption = Some(AtRestKeys::new(kek.clone()));
    let paths = [config.cache.path.clone(), config.capacity[0].path.clone()];
    let dg = DiskGroup::create(config).await.unwrap();
    write_known_pattern(&dg).await;
    dg.settle().await.unwrap();
    drop(dg);
    let report =
        tessera_store::check_encrypted_devices(&paths, Some(&AtRestKeys::new(kek.clone())))
            .unwrap();
    assert!(report.is_clean(), "{report}");
    assert!(report.data_blocks >= BLOCKS, "{report}");
    let without = tessera_store::check_devices(&paths).unwrap();
    assert!(!without.is_clean());
    assert!(without.to_string().contains("encrypted"), "{without}");
}
