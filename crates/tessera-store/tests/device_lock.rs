//! A disk group's devices are locked while it is open: a second opener (a
//! second disk group on the same files, in this process or another host's,
//! or the offline check) is refused with `StoreError::DeviceInUse` naming the
//! device, and the devices open again once the first disk group is dropped.

mod common;

use common::{bytes_of, decode, payload};
use std::sync::Arc;
use tessera_env::{FileDisk, FileDiskOptions};
use tessera_store::{check_devices, DiskGroup, DiskGroupConfig, StoreError};
use tessera_types::{ComponentId, Epoch, Lba};

const C: ComponentId = ComponentId(5);

fn in_use_device(result: Result<Arc<DiskGroup>, StoreError>) -> String {
    match result {
        Err(StoreError::DeviceInUse { device }) => device,
        Err(e) => panic!("refused with another error: {e}"),
        Ok(_) => panic!("a second disk group opened devices in use"),
    }
}

fn paths(config: &DiskGroupConfig) -> Vec<std::path::PathBuf> {
    vec![config.cache.path.clone(), config.capacity[0].path.clone()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_disk_group_refuses_a_second_opener_until_it_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::file_config(dir.path(), "dg-lock");
    let dg = DiskGroup::create(config.clone()).await.unwrap();
    dg.create_component(C, 1 << 20, 0).await.unwrap();
    dg.write(C, Lba(3), bytes_of(&[payload(C.0, 3, 1)]), Epoch(1))
        .await
        .unwrap();

    // Every way of opening it again, in this same process, is refused and
    // names the device; the message says why and what to do.
    let cache = config.cache.path.display().to_string();
    assert_eq!(in_use_device(DiskGroup::open(config.clone()).await), cache);
    assert_eq!(
        in_use_device(DiskGroup::open_or_create(config.clone()).await),
        cache
    );
    assert_eq!(
        in_use_device(DiskGroup::create(config.clone()).await),
        cache
    );
    let err = DiskGroup::open(config.clone()).await.err().unwrap();
    let message = err.to_string();
    assert!(message.contains(&cache), "{message}");
    assert!(message.contains("in use by a running host"), "{message}");
    assert!(message.contains("stop that host first"), "{message}");
    match check_devices(&paths(&config)) {
        Err(StoreError::DeviceInUse { device }) => assert_eq!(device, cache),
        Err(e) => panic!("check refused with another error: {e}"),
        Ok(report) => panic!("check ran on devices in service: {report}"),
    }

    // The refused attempts changed nothing: the first still serves.
    dg.write(C, Lba(4), bytes_of(&[payload(C.0, 4, 1)]), Epoch(1))
        .await
        .unwrap();
    dg.settle().await.unwrap();
    drop(dg);

    // Closed: the check runs, and the disk group opens again with its data.
    let report = check_devices(&paths(&config)).unwrap();
    assert!(report.is_clean(), "{report}");
    let dg = DiskGroup::open(config.clone()).await.unwrap();
    for lba in [3, 4] {
        let block = dg.read(C, Lba(lba), 1).await.unwrap();
        assert_eq!(decode(&block).unwrap(), Some((C.0, lba, 1)));
    }
    // And once more after a clean close, as `host stop` then `host start`
    // does in one process.
    drop(dg);
    let dg = DiskGroup::open(config).await.unwrap();
    assert_eq!(dg.components().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capacity_device_in_use_refuses_the_open_and_leaves_the_others_unlocked() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::file_config(dir.path(), "dg-lock-cap");
    drop(DiskGroup::create(config.clone()).await.unwrap());

    // Another opener holds only the capacity device (a check holds it shared).
    let holder = FileDisk::open(
        &config.capacity[0].path,
        FileDiskOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        in_use_device(DiskGroup::open(config.clone()).await),
        config.capacity[0].path.display().to_string()
    );
    // The cache device the refused open had locked was let go at once.
    let cache = FileDisk::open(&config.cache.path, FileDiskOptions::default()).unwrap();
    drop(cache);
    drop(holder);
    let dg = DiskGroup::open(config).await.unwrap();
    assert!(dg.components().is_empty());
}
