//! `CloneBlocks` served from a host's real disk groups (files in a temporary
//! directory): blocks shared within one disk group take no space of their
//! own and keep their data when either side is overwritten; anything the
//! store cannot share is refused with a kind the owner acts on, and changes
//! nothing.

use bytes::Bytes;
use std::sync::Arc;
use tessera_replica::ReplicaService;
use tessera_store::{DeviceSpec, DiskGroup, DiskGroupConfig, CLONE_BLOCKS_MAX};
use tessera_types::{ComponentId, DiskGroupId, Epoch, Lba, VolumeId, BLOCK_BYTES};
use tessera_wire::{ComponentRef, QueueClass, Request, Response, WireErrorKind};

const COMPONENT_BYTES: u64 = 64 << 20;

async fn disk_group(dir: &std::path::Path, name: &str) -> Arc<DiskGroup> {
    DiskGroup::create(DiskGroupConfig {
        id: DiskGroupId::new(name).unwrap(),
        cache: DeviceSpec {
            path: dir.join(format!("{name}-cache")),
            size_bytes: 64 << 20,
        },
        capacity: vec![DeviceSpec {
            path: dir.join(format!("{name}-capacity")),
            size_bytes: 256 << 20,
        }],
        index_cache_bytes: 1 << 20,
        content_cache_bytes: tessera_store::CONTENT_CACHE_BYTES_DEFAULT,
        direct_io: tessera_store::DirectIo::Off,
        encryption: None,
    })
    .await
    .expect("disk group created")
}

fn component(volume: &str, id: u64) -> ComponentRef {
    ComponentRef {
        volume: VolumeId::new(volume).unwrap(),
        id: ComponentId(id),
    }
}

fn pattern(seed: u8, blocks: u64) -> Bytes {
    Bytes::from(
        (0..blocks * BLOCK_BYTES)
            .map(|i| seed.wrapping_add((i % 241) as u8))
            .collect::<Vec<u8>>(),
    )
}

async fn read(service: &ReplicaService, c: &ComponentRef, lba: u64, blocks: u32) -> Bytes {
    match service
        .handle(
            QueueClass::Guest,
            Request::Read {
                component: c.clone(),
                lba: Lba(lba),
                blocks,
            },
        )
        .await
    {
        Response::Data(d) => d,
        other => panic!("read of {c} answered {other:?}"),
    }
}

async fn write(service: &ReplicaService, c: &ComponentRef, lba: u64, data: Bytes) {
    let answer = service
        .handle(
            QueueClass::Guest,
            Request::Write {
                component: c.clone(),
                lba: Lba(lba),
                epoch: Epoch(1),
                data,
            },
        )
        .await;
    assert_eq!(answer, Response::Ok, "write to {c}");
}

fn clone(
    source: &ComponentRef,
    source_lba: u64,
    target: &ComponentRef,
    target_lba: u64,
    blocks: u64,
    epoch: u64,
) -> Request {
    Request::CloneBlocks {
        source: source.clone(),
        source_lba: Lba(source_lba),
        target: target.clone(),
        target_lba: Lba(target_lba),
        blocks,
        epoch: Epoch(epoch),
    }
}

fn kind(response: &Response) -> Option<WireErrorKind> {
    response.error_kind()
}

#[tokio::test]
async fn blocks_are_shared_within_a_disk_group_and_refused_across_them() {
    let dir = tempfile::tempdir().unwrap();
    let dg0 = disk_group(dir.path(), "dg0").await;
    let dg1 = disk_group(dir.path(), "dg1").await;
    let service = ReplicaService::new(vec![Arc::clone(&dg0), Arc::clone(&dg1)]);
    let gold = component("gold", 1);
    let copy = component("vm-1", 2);
    let far = component("vm-2", 3);
    for (c, group) in [(&gold, &dg0), (&copy, &dg0), (&far, &dg1)] {
        service
            .create(c, Some(group.id()), COMPONENT_BYTES, 0)
            .await
            .unwrap_or_else(|e| panic!("create {c}: {e}"));
    }
    let blocks = 2048;
    let data = pattern(7, blocks);
    // Writes are at most 4 MiB each.
    for at in (0..blocks).step_by(1024) {
        let piece = data.slice((at * BLOCK_BYTES) as usize..((at + 1024) * BLOCK_BYTES) as usize);
        write(&service, &gold, at, piece).await;
    }
    dg0.settle().await.unwrap();
    let before = dg0.space();

    // Into another volume's component on the same disk group.
    let answer = service
        .handle(QueueClass::Guest, clone(&gold, 0, &copy, 100, blocks, 1))
        .await;
    assert_eq!(answer, Response::Ok);
    assert_eq!(read(&service, &copy, 100, blocks as u32).await, data);
    // Within one component, to a range that does not overlap.
    let answer = service
        .handle(QueueClass::Guest, clone(&gold, 0, &gold, 4096, blocks, 1))
        .await;
    assert_eq!(answer, Response::Ok);
    assert_eq!(read(&service, &gold, 4096, blocks as u32).await, data);
    dg0.settle().await.unwrap();
    let after = dg0.space();
    let copied = 2 * blocks * BLOCK_BYTES;
    assert!(
        after.physical_bytes - before.physical_bytes < copied / 8,
        "sharing {copied} bytes took {} bytes of the devices",
        after.physical_bytes - before.physical_bytes
    );

    // Copy on write: overwriting the source leaves both copies as they were.
    write(&service, &gold, 0, pattern(9, 16)).await;
    assert_eq!(
        read(&service, &copy, 100, 16).await,
        data.slice(..(16 * BLOCK_BYTES) as usize)
    );
    assert_eq!(
        read(&service, &gold, 4096, 16).await,
        data.slice(..(16 * BLOCK_BYTES) as usize)
    );

    // Across disk groups: refused, nothing changes.
    let answer = service
        .handle(QueueClass::Guest, clone(&gold, 0, &far, 0, 16, 1))
        .await;
    assert_eq!(
        kind(&answer),
        Some(WireErrorKind::NotColocated),
        "{answer:?}"
    );
    let Response::Error { message, .. } = &answer else {
        unreachable!()
    };
    assert!(
        message.contains("dg0") && message.contains("dg1"),
        "{message}"
    );
    assert_eq!(
        read(&service, &far, 0, 16).await,
        Bytes::from(vec![0u8; 16 * 4096])
    );
    // A source this host does not hold, a target it does not hold.
    let elsewhere = component("gold", 99);
    let answer = service
        .handle(QueueClass::Guest, clone(&elsewhere, 0, &copy, 0, 16, 1))
        .await;
    assert_eq!(
        kind(&answer),
        Some(WireErrorKind::NotColocated),
        "{answer:?}"
    );
    let answer = service
        .handle(QueueClass::Guest, clone(&gold, 0, &elsewhere, 0, 16, 1))
        .await;
    assert_eq!(kind(&answer), Some(WireErrorKind::NotFound), "{answer:?}");
}

#[tokio::test]
async fn what_the_store_refuses_is_answered_as_for_writes_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let dg0 = disk_group(dir.path(), "dg0").await;
    let service = ReplicaService::new(vec![Arc::clone(&dg0)]);
    let gold = component("gold", 1);
    let copy = component("vm-1", 2);
    for c in [&gold, &copy] {
        service
            .create(c, None, COMPONENT_BYTES, 0)
            .await
            .unwrap_or_else(|e| panic!("create {c}: {e}"));
    }
    write(&service, &gold, 0, pattern(3, 64)).await;
    let fence = service
        .handle(
            QueueClass::Guest,
            Request::Fence {
                component: copy.clone(),
                epoch: Epoch(5),
            },
        )
        .await;
    assert_eq!(fence, Response::Ok);

    let stale = service
        .handle(QueueClass::Guest, clone(&gold, 0, &copy, 0, 64, 4))
        .await;
    assert_eq!(
        kind(&stale),
        Some(WireErrorKind::StaleEpoch { highest: Epoch(5) })
    );
    let past_the_end = service
        .handle(
            QueueClass::Guest,
            clone(&gold, 0, &copy, COMPONENT_BYTES / BLOCK_BYTES - 8, 64, 5),
        )
        .await;
    assert_eq!(kind(&past_the_end), Some(WireErrorKind::OutOfRange));
    let overlapping = service
        .handle(QueueClass::Guest, clone(&gold, 0, &gold, 32, 64, 5))
        .await;
    assert_eq!(kind(&overlapping), Some(WireErrorKind::Invalid));
    let too_many = service
        .handle(
            QueueClass::Guest,
            clone(&gold, 0, &copy, 0, CLONE_BLOCKS_MAX + 1, 5),
        )
        .await;
    assert_eq!(kind(&too_many), Some(WireErrorKind::Invalid));
    assert_eq!(
        read(&service, &copy, 0, 64).await,
        Bytes::from(vec![0u8; 64 * 4096]),
        "a refused copy changed the target"
    );
    assert_eq!(
        read(&service, &gold, 32, 32).await,
        pattern(3, 64).slice(32 * 4096..)
    );
}
