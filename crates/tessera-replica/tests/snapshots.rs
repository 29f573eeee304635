//! Snapshots and linked clones served from a host's real disk groups (files
//! in a temporary directory), through the typed API a coordinator on the
//! host calls and through the wire requests other hosts send: a snapshot
//! keeps what its component held when it was taken and refuses every change,
//! a clone starts as its snapshot and changes alone, and what the store
//! refuses is answered with a kind the owner acts on.

use bytes::Bytes;
use std::sync::Arc;
use tessera_replica::{ReplicaError, ReplicaService};
use tessera_store::{DeviceSpec, DiskGroup, DiskGroupConfig, StoreError};
use tessera_types::{ComponentId, DiskGroupId, Epoch, Lba, VolumeId, BLOCK_BYTES};
use tessera_wire::{ComponentRef, QueueClass, Request, Response, WireErrorKind};

const COMPONENT_BYTES: u64 = 64 << 20;
const BLOCKS: u64 = 256;

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

fn component(id: u64) -> ComponentRef {
    ComponentRef {
        volume: VolumeId::new("vm-1").unwrap(),
        id: ComponentId(id),
    }
}

fn pattern(seed: u8, blocks: u64) -> Bytes {
    Bytes::from(
        (0..blocks * BLOCK_BYTES)
            .map(|i| seed.wrapping_add((i % 251) as u8))
            .collect::<Vec<u8>>(),
    )
}

async fn read(service: &ReplicaService, c: &ComponentRef) -> Bytes {
    match service
        .handle(
            QueueClass::Guest,
            Request::Read {
                component: c.clone(),
                lba: Lba(0),
                blocks: BLOCKS as u32,
            },
        )
        .await
    {
        Response::Data(d) => d,
        other => panic!("read of {c} answered {other:?}"),
    }
}

fn write(c: &ComponentRef, seed: u8, epoch: u64) -> Request {
    Request::Write {
        component: c.clone(),
        lba: Lba(0),
        epoch: Epoch(epoch),
        data: pattern(seed, BLOCKS),
    }
}

fn snapshot(c: &ComponentRef, id: u64, epoch: u64) -> Request {
    Request::SnapshotComponent {
        component: c.clone(),
        snapshot: ComponentId(id),
        epoch: Epoch(epoch),
    }
}

fn clone(snapshot: &ComponentRef, id: u64, epoch: u64) -> Request {
    Request::CloneSnapshot {
        snapshot: snapshot.clone(),
        clone: ComponentId(id),
        epoch: Epoch(epoch),
    }
}

#[tokio::test]
async fn a_snapshot_keeps_its_point_in_time_and_refuses_changes() {
    let dir = tempfile::tempdir().unwrap();
    let dg0 = disk_group(dir.path(), "dg0").await;
    let service = ReplicaService::new(vec![Arc::clone(&dg0)]);
    let live = component(1);
    service
        .create(&live, None, COMPONENT_BYTES, 0)
        .await
        .unwrap();
    assert_eq!(
        service.handle(QueueClass::Guest, write(&live, 1, 1)).await,
        Response::Ok
    );

    // One through the typed API (and again: idempotent), one through the
    // wire.
    let typed = component(2);
    let wired = component(3);
    service.snapshot(&live, typed.id, Epoch(1)).await.unwrap();
    service.snapshot(&live, typed.id, Epoch(1)).await.unwrap();
    assert_eq!(
        service
            .handle(QueueClass::Guest, snapshot(&live, 3, 1))
            .await,
        Response::Ok
    );
    assert_eq!(
        service
            .handle(QueueClass::Guest, snapshot(&live, 3, 1))
            .await,
        Response::Ok
    );
    assert!(dg0.is_snapshot(typed.id).unwrap());
    assert!(dg0.is_snapshot(wired.id).unwrap());

    // The source changes; the snapshots do not.
    assert_eq!(
        service.handle(QueueClass::Guest, write(&live, 2, 1)).await,
        Response::Ok
    );
    assert_eq!(read(&service, &live).await, pattern(2, BLOCKS));
    assert_eq!(read(&service, &typed).await, pattern(1, BLOCKS));
    assert_eq!(read(&service, &wired).await, pattern(1, BLOCKS));

    // A snapshot refuses writes and unmaps, typed or on the wire, and
    // names itself.
    let err = service
        .write(&typed, Lba(0), pattern(3, 1), Epoch(1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            ReplicaError::Store {
                component,
                source: StoreError::ReadOnly { component: id },
            } if component == &typed && *id == typed.id
        ),
        "{err:?}"
    );
    assert_eq!(err.wire_kind(), WireErrorKind::Invalid);
    let answer = service.handle(QueueClass::Guest, write(&wired, 3, 1)).await;
    assert_eq!(
        answer.error_kind(),
        Some(WireErrorKind::Invalid),
        "{answer:?}"
    );
    let Response::Error { message, .. } = &answer else {
        unreachable!()
    };
    assert!(
        message.contains(&wired.to_string()) && message.contains("is a snapshot"),
        "{message}"
    );
    let unmap = service
        .handle(
            QueueClass::Guest,
            Request::Unmap {
                component: wired.clone(),
                lba: Lba(0),
                blocks: BLOCKS,
                epoch: Epoch(1),
            },
        )
        .await;
    assert_eq!(
        unmap.error_kind(),
        Some(WireErrorKind::Invalid),
        "{unmap:?}"
    );
    assert_eq!(read(&service, &typed).await, pattern(1, BLOCKS));
    assert_eq!(read(&service, &wired).await, pattern(1, BLOCKS));

    // A service started again over the same disk group finds the
    // snapshots where they are.
    let again = ReplicaService::new(vec![Arc::clone(&dg0)]);
    assert_eq!(read(&again, &wired).await, pattern(1, BLOCKS));

    // Deleted like any component.
    assert_eq!(
        service
            .handle(
                QueueClass::Guest,
                Request::DeleteComponent {
                    component: typed.clone()
                }
            )
            .await,
        Response::Ok
    );
    let gone = service
        .handle(
            QueueClass::Guest,
            Request::Read {
                component: typed.clone(),
                lba: Lba(0),
                blocks: 1,
            },
        )
        .await;
    assert_eq!(gone.error_kind(), Some(WireErrorKind::NotFound));
    assert_eq!(read(&service, &wired).await, pattern(1, BLOCKS));
    assert_eq!(read(&service, &live).await, pattern(2, BLOCKS));
}

#[tokio::test]
async fn a_clone_starts_as_its_snapshot_and_changes_alone() {
    let dir = tempfile::tempdir().unwrap();
    let dg0 = disk_group(dir.path(), "dg0").await;
    let service = ReplicaService::new(vec![Arc::clone(&dg0)]);
    let live = component(1);
    let snap = component(2);
    service
        .create(&live, None, COMPONENT_BYTES, 0)
        .await
        .unwrap();
    assert_eq!(
        service.handle(QueueClass::Guest, write(&live, 1, 1)).await,
        Response::Ok
    );
    service.snapshot(&live, snap.id, Epoch(1)).await.unwrap();

    let typed = component(3);
    let wired = component(4);
    service
        .clone_snapshot(&snap, typed.id, Epoch(2))
        .await
        .unwrap();
    service
        .clone_snapshot(&snap, typed.id, Epoch(2))
        .await
        .unwrap();
    assert_eq!(
        service.handle(QueueClass::Guest, clone(&snap, 4, 2)).await,
        Response::Ok
    );
    assert_eq!(
        service.handle(QueueClass::Guest, clone(&snap, 4, 2)).await,
        Response::Ok
    );
    assert!(!dg0.is_snapshot(typed.id).unwrap());
    assert_eq!(read(&service, &typed).await, pattern(1, BLOCKS));
    assert_eq!(read(&service, &wired).await, pattern(1, BLOCKS));

    // Writable, at the epoch it was made with; each changes alone.
    assert_eq!(
        service.handle(QueueClass::Guest, write(&typed, 5, 2)).await,
        Response::Ok
    );
    assert_eq!(
        service.handle(QueueClass::Guest, write(&wired, 6, 2)).await,
        Response::Ok
    );
    assert_eq!(read(&service, &typed).await, pattern(5, BLOCKS));
    assert_eq!(read(&service, &wired).await, pattern(6, BLOCKS));
    assert_eq!(read(&service, &snap).await, pattern(1, BLOCKS));
    assert_eq!(read(&service, &live).await, pattern(1, BLOCKS));
    let stale = service.handle(QueueClass::Guest, write(&typed, 7, 1)).await;
    assert_eq!(
        stale.error_kind(),
        Some(WireErrorKind::StaleEpoch { highest: Epoch(2) })
    );

    // Only a snapshot is cloned.
    let answer = service.handle(QueueClass::Guest, clone(&live, 9, 2)).await;
    assert_eq!(
        answer.error_kind(),
        Some(WireErrorKind::Invalid),
        "{answer:?}"
    );
    let gone = service
        .handle(
            QueueClass::Guest,
            Request::ComponentStatus {
                component: component(9),
            },
        )
        .await;
    assert_eq!(gone.error_kind(), Some(WireErrorKind::NotFound));
}

#[tokio::test]
async fn what_cannot_be_snapshotted_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let dg0 = disk_group(dir.path(), "dg0").await;
    let dg1 = disk_group(dir.path(), "dg1").await;
    let service = ReplicaService::new(vec![Arc::clone(&dg0), Arc::clone(&dg1)]);
    let live = component(1);
    let far = component(2);
    service
        .create(&live, Some(dg0.id()), COMPONENT_BYTES, 0)
        .await
        .unwrap();
    service
        .create(&far, Some(dg1.id()), COMPONENT_BYTES, 0)
        .await
        .unwrap();
    assert_eq!(
        service.handle(QueueClass::Guest, write(&live, 1, 1)).await,
        Response::Ok
    );
    assert_eq!(
        service
            .handle(
                QueueClass::Guest,
                Request::Fence {
                    component: live.clone(),
                    epoch: Epoch(5),
                }
            )
            .await,
        Response::Ok
    );

    // A stale owner takes no snapshot.
    let stale = service
        .handle(QueueClass::Guest, snapshot(&live, 3, 4))
        .await;
    assert_eq!(
        stale.error_kind(),
        Some(WireErrorKind::StaleEpoch { highest: Epoch(5) }),
        "{stale:?}"
    );
    let err = service.snapshot(&live, ComponentId(3), Epoch(4)).await;
    assert!(
        matches!(
            err,
            Err(ReplicaError::Store {
                source: StoreError::StaleEpoch { .. },
                ..
            })
        ),
        "{err:?}"
    );
    // Of a component this host does not hold.
    let missing = service
        .handle(QueueClass::Guest, snapshot(&component(8), 3, 5))
        .await;
    assert_eq!(missing.error_kind(), Some(WireErrorKind::NotFound));
    let missing = service
        .handle(QueueClass::Guest, clone(&component(8), 3, 5))
        .await;
    assert_eq!(missing.error_kind(), Some(WireErrorKind::NotFound));
    // Onto a number another disk group of the host holds: a second
    // component of that number is never made.
    let taken = service
        .handle(QueueClass::Guest, snapshot(&live, far.id.0, 5))
        .await;
    assert_eq!(
        taken.error_kind(),
        Some(WireErrorKind::Invalid),
        "{taken:?}"
    );
    assert!(!dg0.components().iter().any(|c| c.id == far.id));
    // Onto a writable component of its own disk group.
    let own = component(6);
    service
        .create(&own, Some(dg0.id()), COMPONENT_BYTES, 0)
        .await
        .unwrap();
    let taken = service
        .handle(QueueClass::Guest, snapshot(&live, own.id.0, 5))
        .await;
    assert_eq!(
        taken.error_kind(),
        Some(WireErrorKind::Invalid),
        "{taken:?}"
    );
    assert!(!dg0.is_snapshot(own.id).unwrap());

    // None of it made a component.
    let status = service
        .handle(
            QueueClass::Guest,
            Request::ComponentStatus {
                component: component(3),
            },
        )
        .await;
    assert_eq!(status.error_kind(), Some(WireErrorKind::NotFound));
    assert_eq!(read(&service, &live).await, pattern(1, BLOCKS));
}
