//! Reaching components from a coordinator: the node's [`ComponentIo`].
//!
//! Owns: the choice between the local replica service (components on this
//! host's disk groups, called through its typed API: no wire encoding, no
//! socket, no copy) and the transport (components elsewhere), and the
//! mapping of replica errors and wire answers to [`ComponentError`].
//! Invariant: an answer that is not understood is an error, never data.

use crate::peers::Peers;
use async_trait::async_trait;
use bytes::Bytes;
use std::sync::Arc;
use tessera_object::{BlockClone, ComponentError, ComponentIo, ComponentStatus, IoClass};
use tessera_replica::{ReplicaError, ReplicaService};
use tessera_store::StoreError;
use tessera_transport::{Transport, TransportError};
use tessera_types::layout::ComponentPlacement;
use tessera_types::{ComponentId, Epoch, HostId, Lba, VolumeId};
use tessera_wire::{ComponentRef, QueueClass, Request, Response, WireErrorKind};

// The coordinator cuts sharing copies into pieces the store accepts whole.
const _: () = assert!(tessera_object::CLONE_BLOCKS_MAX == tessera_store::CLONE_BLOCKS_MAX);

/// Components as seen from one host.
pub struct ClusterComponents {
    host: HostId,
    volume: VolumeId,
    replica: Arc<ReplicaService>,
    transport: Arc<Transport>,
    peers: Arc<Peers>,
}

impl ClusterComponents {
    /// Components of `volume`, reached from `host`.
    pub fn new(
        host: HostId,
        volume: VolumeId,
        replica: Arc<ReplicaService>,
        transport: Arc<Transport>,
        peers: Arc<Peers>,
    ) -> ClusterComponents {
        ClusterComponents {
            host,
            volume,
            replica,
            transport,
            peers,
        }
    }

    fn reference(&self, c: &ComponentPlacement) -> ComponentRef {
        ComponentRef {
            volume: self.volume.clone(),
            id: c.id,
        }
    }

    /// Sends `request` to the host of `c` (never this host: local
    /// components are called through the replica service's typed API).
    async fn send(
        &self,
        c: &ComponentPlacement,
        class: IoClass,
        request: Request,
    ) -> Result<Response, ComponentError> {
        let unreachable = |detail: String| ComponentError::Unreachable {
            component: c.id,
            host: c.host.clone(),
            detail,
        };
        let Some(addr) = self.peers.transport_addr(&c.host) else {
            return Err(unreachable("no address known for the host".into()));
        };
        self.transport
            .call(&c.host, addr, queue_class(class), request)
            .await
            .map_err(|e| unreachable(e.to_string()))
    }

    /// The bytes component `c` holds alone and shares with others (what a
    /// snapshot costs), from its host: (alone, shared).
    pub async fn held_space(&self, c: &ComponentPlacement) -> Result<(u64, u64), ComponentError> {
        if self.is_local(c) {
            return self
                .replica
                .held_space(&self.reference(c))
                .await
                .map(|h| (h.alone_bytes, h.shared_bytes))
                .map_err(|e| local_error(c, e));
        }
        match self
            .send(
                c,
                IoClass::Resync,
                Request::HeldSpace {
                    component: self.reference(c),
                },
            )
            .await?
        {
            Response::Held {
                alone_bytes,
                shared_bytes,
            } => Ok((alone_bytes, shared_bytes)),
            other => Err(unexpected(c, other)),
        }
    }

    /// A query answered by block ranges: `local` (the replica service's
    /// typed call) when `c` is on this host, else `request` to its host.
    async fn ranges(
        &self,
        c: &ComponentPlacement,
        local: impl std::future::Future<Output = Result<Vec<(Lba, u64)>, tessera_replica::ReplicaError>>,
        request: Request,
    ) -> Result<Vec<(Lba, u64)>, ComponentError> {
        if self.is_local(c) {
            return local.await.map_err(|e| local_error(c, e));
        }
        match self.send(c, IoClass::Resync, request).await? {
            Response::Ranges(ranges) => Ok(ranges),
            other => Err(unexpected(c, other)),
        }
    }

    async fn expect_ok(
        &self,
        c: &ComponentPlacement,
        class: IoClass,
        request: Request,
    ) -> Result<(), ComponentError> {
        match self.send(c, class, request).await? {
            Response::Ok => Ok(()),
            other => Err(unexpected(c, other)),
        }
    }

    /// Sends a request that makes a snapshot or a clone of `c` to its host
    /// and expects `Ok`. A host whose release predates the request (wire
    /// v4) is never sent it: the transport refuses it before sending, and
    /// that is answered [`ComponentError::NotShared`] (nothing changed, the
    /// host cannot share its blocks), never `Unreachable`, which would count
    /// a host that is up, and its copy, as gone.
    async fn expect_ok_shared(
        &self,
        c: &ComponentPlacement,
        request: Request,
    ) -> Result<(), ComponentError> {
        let unreachable = |detail: String| ComponentError::Unreachable {
            component: c.id,
            host: c.host.clone(),
            detail,
        };
        let Some(addr) = self.peers.transport_addr(&c.host) else {
            return Err(unreachable("no address known for the host".into()));
        };
        match self
            .transport
            .call(&c.host, addr, QueueClass::Guest, request)
            .await
        {
            Ok(Response::Ok) => Ok(()),
            Ok(other) => Err(unexpected(c, other)),
            Err(e @ TransportError::Encode { .. }) => Err(ComponentError::NotShared {
                component: c.id,
                host: c.host.clone(),
                detail: e.to_string(),
            }),
            Err(e) => Err(unreachable(e.to_string())),
        }
    }
}

/// The component error a wire error kind stands for; `detail` says what
/// happened in the words of the host that failed.
fn component_error(c: &ComponentPlacement, kind: WireErrorKind, detail: String) -> ComponentError {
    match kind {
        WireErrorKind::StaleEpoch { highest } => ComponentError::StaleEpoch {
            component: c.id,
            epoch: Epoch(0),
            highest,
        },
        WireErrorKind::Checksum { lba } => ComponentError::Checksum {
            component: c.id,
            lba,
        },
        WireErrorKind::NoSpace => ComponentError::NoSpace { component: c.id },
        WireErrorKind::NotFound => ComponentError::NotFound {
            component: c.id,
            host: c.host.clone(),
        },
        WireErrorKind::NotColocated => ComponentError::NotShared {
            component: c.id,
            host: c.host.clone(),
            detail,
        },
        _ => ComponentError::Io {
            component: c.id,
            detail,
        },
    }
}

/// A local replica's error as the coordinator sees it.
fn local_error(c: &ComponentPlacement, e: ReplicaError) -> ComponentError {
    if let ReplicaError::Store {
        source: StoreError::StaleEpoch { epoch, highest, .. },
        ..
    } = e
    {
        return ComponentError::StaleEpoch {
            component: c.id,
            epoch,
            highest,
        };
    }
    component_error(c, e.wire_kind(), e.to_string())
}

/// Turns a wire answer that is not the expected one into an error.
fn unexpected(c: &ComponentPlacement, response: Response) -> ComponentError {
    match response {
        Response::Error { kind, message } => component_error(c, kind, message),
        other => ComponentError::Io {
            component: c.id,
            detail: format!("unexpected answer {:?}", other.kind()),
        },
    }
}

#[async_trait]
impl ComponentIo for ClusterComponents {
    fn is_local(&self, c: &ComponentPlacement) -> bool {
        c.host == self.host
    }

    async fn write(
        &self,
        c: &ComponentPlacement,
        lba: Lba,
        data: Bytes,
        epoch: Epoch,
        class: IoClass,
    ) -> Result<(), ComponentError> {
        let component = self.reference(c);
        if self.is_local(c) {
            return self
                .replica
                .write(&component, lba, data, epoch)
                .await
                .map_err(|e| local_error(c, e));
        }
        self.expect_ok(
            c,
            class,
            Request::Write {
                component,
                lba,
                epoch,
                data,
            },
        )
        .await
    }

    async fn read(
        &self,
        c: &ComponentPlacement,
        lba: Lba,
        blocks: u32,
        class: IoClass,
    ) -> Result<Bytes, ComponentError> {
        let component = self.reference(c);
        let data = if self.is_local(c) {
            self.replica
                .read(&component, lba, blocks, queue_class(class))
                .await
                .map_err(|e| local_error(c, e))?
        } else {
            match self
                .send(
                    c,
                    class,
                    Request::Read {
                        component,
                        lba,
                        blocks,
                    },
                )
                .await?
            {
                Response::Data(data) => data,
                other => return Err(unexpected(c, other)),
            }
        };
        if data.len() as u64 != blocks as u64 * tessera_types::BLOCK_BYTES {
            return Err(ComponentError::Io {
                component: c.id,
                detail: format!(
                    "read of {blocks} blocks at {lba} returned {} bytes",
                    data.len()
                ),
            });
        }
        Ok(data)
    }

    async fn unmap(
        &self,
        c: &ComponentPlacement,
        lba: Lba,
        blocks: u64,
        epoch: Epoch,
        class: IoClass,
    ) -> Result<(), ComponentError> {
        let component = self.reference(c);
        if self.is_local(c) {
            return self
                .replica
                .unmap(&component, lba, blocks, epoch)
                .await
                .map_err(|e| local_error(c, e));
        }
        self.expect_ok(
            c,
            class,
            Request::Unmap {
                component,
                lba,
                blocks,
                epoch,
            },
        )
        .await
    }

    async fn allocated(
        &self,
        c: &ComponentPlacement,
        from: Lba,
        blocks: u64,
    ) -> Result<Vec<(Lba, u64)>, ComponentError> {
        let component = self.reference(c);
        let request = Request::Allocated {
            component: component.clone(),
            from,
            blocks,
        };
        self.ranges(c, self.replica.allocated(&component, from, blocks), request)
            .await
    }

    async fn changed(
        &self,
        c: &ComponentPlacement,
        base: ComponentId,
        from: Lba,
        blocks: u64,
    ) -> Result<Vec<(Lba, u64)>, ComponentError> {
        let component = self.reference(c);
        let request = Request::Changed {
            component: component.clone(),
            base,
            from,
            blocks,
        };
        self.ranges(
            c,
            self.replica.changed(&component, base, from, blocks),
            request,
        )
        .await
    }

    async fn clone_blocks(&self, clone: &BlockClone) -> Result<(), ComponentError> {
        let c = &clone.target;
        let source = ComponentRef {
            volume: clone.source_volume.clone(),
            id: clone.source.id,
        };
        let target = self.reference(c);
        if self.is_local(c) {
            return self
                .replica
                .clone_blocks(
                    &source,
                    clone.source_lba,
                    &target,
                    clone.target_lba,
                    clone.blocks,
                    clone.epoch,
                )
                .await
                .map_err(|e| match e.wire_kind() {
                    // Refused as malformed, so not carried out: see below.
                    WireErrorKind::Invalid => ComponentError::NotShared {
                        component: c.id,
                        host: c.host.clone(),
                        detail: e.to_string(),
                    },
                    _ => local_error(c, e),
                });
        }
        let request = Request::CloneBlocks {
            source,
            source_lba: clone.source_lba,
            target,
            target_lba: clone.target_lba,
            blocks: clone.blocks,
            epoch: clone.epoch,
        };
        let not_shared = |detail: String| ComponentError::NotShared {
            component: c.id,
            host: c.host.clone(),
            detail,
        };
        let Some(addr) = self.peers.transport_addr(&c.host) else {
            return Err(ComponentError::Unreachable {
                component: c.id,
                host: c.host.clone(),
                detail: "no address known for the host".into(),
            });
        };
        let response = match self
            .transport
            .call(&c.host, addr, QueueClass::Guest, request)
            .await
        {
            Ok(response) => response,
            // The host runs a release older than sharing: nothing was
            // sent, and the data can still be copied.
            Err(e @ TransportError::Encode { .. }) => return Err(not_shared(e.to_string())),
            Err(e) => {
                return Err(ComponentError::Unreachable {
                    component: c.id,
                    host: c.host.clone(),
                    detail: e.to_string(),
                })
            }
        };
        match response {
            Response::Ok => Ok(()),
            // A request the replica refused as malformed (and so did not
            // carry out): copying the data gives the same bytes, where
            // failing the copy would fail a guest's clone.
            Response::Error {
                kind: WireErrorKind::Invalid,
                message,
            } => Err(not_shared(message)),
            other => Err(unexpected(c, other)),
        }
    }

    async fn fence(&self, c: &ComponentPlacement, epoch: Epoch) -> Result<(), ComponentError> {
        let component = self.reference(c);
        if self.is_local(c) {
            return self
                .replica
                .fence(&component, epoch)
                .await
                .map_err(|e| local_error(c, e));
        }
        self.expect_ok(c, IoClass::Guest, Request::Fence { component, epoch })
            .await
    }

    async fn create(
        &self,
        c: &ComponentPlacement,
        reserve_bytes: u64,
    ) -> Result<(), ComponentError> {
        let component = self.reference(c);
        // A witness holds no data but persists its epoch like any component:
        // it is stored as one block.
        let size_bytes = c.size_bytes.max(tessera_types::BLOCK_BYTES);
        if self.is_local(c) {
            return self
                .replica
                .create(&component, Some(&c.disk_group), size_bytes, reserve_bytes)
                .await
                .map_err(|e| local_error(c, e));
        }
        self.expect_ok(
            c,
            IoClass::Guest,
            Request::CreateComponent {
                component,
                size_bytes,
                reserve_bytes,
            },
        )
        .await
    }

    async fn resize(&self, c: &ComponentPlacement, size_bytes: u64) -> Result<(), ComponentError> {
        let component = self.reference(c);
        if self.is_local(c) {
            return self
                .replica
                .resize(&component, size_bytes)
                .await
                .map_err(|e| local_error(c, e));
        }
        self.expect_ok(
            c,
            IoClass::Guest,
            Request::ResizeComponent {
                component,
                size_bytes,
            },
        )
        .await
    }

    async fn delete(&self, c: &ComponentPlacement) -> Result<(), ComponentError> {
        let component = self.reference(c);
        if self.is_local(c) {
            return self
                .replica
                .delete(&component)
                .await
                .map_err(|e| local_error(c, e));
        }
        self.expect_ok(c, IoClass::Guest, Request::DeleteComponent { component })
            .await
    }

    async fn snapshot(
        &self,
        c: &ComponentPlacement,
        snapshot: ComponentId,
        epoch: Epoch,
    ) -> Result<(), ComponentError> {
        let component = self.reference(c);
        if self.is_local(c) {
            return self
                .replica
                .snapshot(&component, snapshot, epoch)
                .await
                .map_err(|e| local_error(c, e));
        }
        self.expect_ok_shared(
            c,
            Request::SnapshotComponent {
                component,
                snapshot,
                epoch,
            },
        )
        .await
    }

    async fn clone_snapshot(
        &self,
        c: &ComponentPlacement,
        clone: ComponentId,
        epoch: Epoch,
    ) -> Result<(), ComponentError> {
        let snapshot = self.reference(c);
        if self.is_local(c) {
            return self
                .replica
                .clone_snapshot(&snapshot, clone, epoch)
                .await
                .map_err(|e| local_error(c, e));
        }
        self.expect_ok_shared(
            c,
            Request::CloneSnapshot {
                snapshot,
                clone,
                epoch,
            },
        )
        .await
    }

    async fn status(&self, c: &ComponentPlacement) -> Result<ComponentStatus, ComponentError> {
        let component = self.reference(c);
        if self.is_local(c) {
            let s = self
                .replica
                .status(&component)
                .map_err(|e| local_error(c, e))?;
            return Ok(ComponentStatus {
                epoch: s.epoch,
                allocated_bytes: s.allocated_bytes,
                physical_bytes: s.physical_bytes,
            });
        }
        match self
            .send(c, IoClass::Guest, Request::ComponentStatus { component })
            .await?
        {
            Response::Status {
                epoch,
                allocated_bytes,
                physical_bytes,
                ..
            } => Ok(ComponentStatus {
                epoch,
                allocated_bytes,
                physical_bytes,
            }),
            other => Err(unexpected(c, other)),
        }
    }
}

/// The transport queue (and the replica's read path) of an I/O class.
fn queue_class(class: IoClass) -> QueueClass {
    match class {
        IoClass::Guest => QueueClass::Guest,
        IoClass::Resync => QueueClass::Resync,
    }
}

#[cfg(test)]
mod tests {
    //! Snapshots and clones reached from one host: of a component on the
    //! host itself (the replica's typed API) and of one on a peer (the wire,
    //! over real loopback transports), and a peer whose release predates
    //! them, which is never sent the request.

    use super::*;
    use tessera_directory::keys::{HostAddresses, HostRecord};
    use tessera_store::{DeviceSpec, DiskGroup, DiskGroupConfig};
    use tessera_transport::{RequestHandler, TransportConfig};
    use tessera_types::layout::{ComponentRole, ComponentState};
    use tessera_types::{DiskGroupId, FaultDomainId, BLOCK_BYTES};
    use tessera_wire::VersionRange;

    const BLOCKS: u32 = 64;

    /// A host's replica service answering its transport.
    struct Serve(Arc<ReplicaService>);

    #[async_trait]
    impl RequestHandler for Serve {
        async fn handle(&self, _from: HostId, class: QueueClass, request: Request) -> Response {
            self.0.handle(class, request).await
        }
    }

    struct TestHost {
        id: HostId,
        replica: Arc<ReplicaService>,
        transport: Arc<Transport>,
    }

    async fn host(dir: &std::path::Path, name: &str, versions: VersionRange) -> TestHost {
        let group = DiskGroup::create(DiskGroupConfig {
            id: DiskGroupId::new("dg0").unwrap(),
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
        .expect("disk group created");
        let replica = Arc::new(ReplicaService::new(vec![group]));
        let id = HostId::new(name).unwrap();
        let transport = Transport::bind(
            id.clone(),
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(Serve(Arc::clone(&replica))),
            TransportConfig {
                versions,
                ..TransportConfig::default()
            },
        )
        .await
        .expect("transport bound");
        TestHost {
            id,
            replica,
            transport: Arc::new(transport),
        }
    }

    fn record(h: &TestHost) -> HostRecord {
        let at = h.transport.local_addr();
        HostRecord {
            id: h.id.clone(),
            fault_domain: FaultDomainId::new(h.id.as_str()).unwrap(),
            addresses: HostAddresses {
                transport: at,
                nbd: at,
                iscsi: at,
                api: at,
            },
            disk_groups: Vec::new(),
            witness_only: false,
        }
    }

    fn placement(id: u64, host: &TestHost) -> ComponentPlacement {
        ComponentPlacement {
            id: ComponentId(id),
            role: ComponentRole::Data,
            host: host.id.clone(),
            disk_group: DiskGroupId::new("dg0").unwrap(),
            fault_domain: FaultDomainId::new(host.id.as_str()).unwrap(),
            votes: 1,
            size_bytes: 16 << 20,
            state: ComponentState::Active,
        }
    }

    fn pattern(seed: u8) -> Bytes {
        Bytes::from(
            (0..u64::from(BLOCKS) * BLOCK_BYTES)
                .map(|i| seed.wrapping_add((i % 251) as u8))
                .collect::<Vec<u8>>(),
        )
    }

    async fn read(io: &ClusterComponents, c: &ComponentPlacement) -> Bytes {
        io.read(c, Lba(0), BLOCKS, IoClass::Guest)
            .await
            .unwrap_or_else(|e| panic!("read of {}: {e}", c.id))
    }

    /// Snapshot, check the point in time and the refusal of writes, clone,
    /// write the clone: the same whether `on` is the calling host or not.
    async fn snapshot_and_clone(io: &ClusterComponents, on: &TestHost, first: u64) {
        let live = placement(first, on);
        let snap = placement(first + 1, on);
        let clone = placement(first + 2, on);
        io.create(&live, 0).await.unwrap();
        io.write(&live, Lba(0), pattern(1), Epoch(1), IoClass::Guest)
            .await
            .unwrap();
        io.snapshot(&live, snap.id, Epoch(1)).await.unwrap();
        io.snapshot(&live, snap.id, Epoch(1)).await.unwrap();
        io.write(&live, Lba(0), pattern(2), Epoch(1), IoClass::Guest)
            .await
            .unwrap();
        assert_eq!(read(io, &snap).await, pattern(1));
        assert_eq!(read(io, &live).await, pattern(2));

        // A snapshot refuses changes, naming itself.
        let err = io
            .write(&snap, Lba(0), pattern(3), Epoch(1), IoClass::Guest)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ComponentError::Io { component, detail }
                if *component == snap.id && detail.contains("is a snapshot")),
            "{err:?}"
        );
        let err = io
            .unmap(&snap, Lba(0), 1, Epoch(1), IoClass::Guest)
            .await
            .unwrap_err();
        assert!(matches!(err, ComponentError::Io { .. }), "{err:?}");

        io.clone_snapshot(&snap, clone.id, Epoch(1)).await.unwrap();
        io.clone_snapshot(&snap, clone.id, Epoch(1)).await.unwrap();
        assert_eq!(read(io, &clone).await, pattern(1));
        io.write(&clone, Lba(0), pattern(4), Epoch(1), IoClass::Guest)
            .await
            .unwrap();
        assert_eq!(read(io, &clone).await, pattern(4));
        assert_eq!(read(io, &snap).await, pattern(1));

        // A stale owner takes no snapshot.
        io.fence(&live, Epoch(5)).await.unwrap();
        let err = io
            .snapshot(&live, ComponentId(first + 3), Epoch(4))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                ComponentError::StaleEpoch {
                    highest: Epoch(5),
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn snapshots_and_clones_of_local_and_remote_components() {
        let dir = tempfile::tempdir().unwrap();
        let here = host(dir.path(), "h1", VersionRange::SUPPORTED).await;
        let peer = host(dir.path(), "h2", VersionRange::SUPPORTED).await;
        let peers = Arc::new(Peers::default());
        peers.set_record(record(&peer));
        let io = ClusterComponents::new(
            here.id.clone(),
            VolumeId::new("vol").unwrap(),
            Arc::clone(&here.replica),
            Arc::clone(&here.transport),
            peers,
        );

        snapshot_and_clone(&io, &here, 10).await;
        snapshot_and_clone(&io, &peer, 20).await;
        // Each was made on the host of the component it was made from.
        for id in [11, 12] {
            assert!(here.replica.home(ComponentId(id)).is_some());
            assert!(peer.replica.home(ComponentId(id)).is_none());
        }
        for id in [21, 22] {
            assert!(peer.replica.home(ComponentId(id)).is_some());
            assert!(here.replica.home(ComponentId(id)).is_none());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_older_than_snapshots_is_never_sent_one() {
        let dir = tempfile::tempdir().unwrap();
        let here = host(dir.path(), "h1", VersionRange::SUPPORTED).await;
        let old = host(dir.path(), "h2", VersionRange { min: 1, max: 3 }).await;
        let peers = Arc::new(Peers::default());
        peers.set_record(record(&old));
        let io = ClusterComponents::new(
            here.id.clone(),
            VolumeId::new("vol").unwrap(),
            Arc::clone(&here.replica),
            Arc::clone(&here.transport),
            peers,
        );
        let live = placement(1, &old);
        io.create(&live, 0).await.unwrap();

        for err in [
            io.snapshot(&live, ComponentId(2), Epoch(1)).await,
            io.clone_snapshot(&live, ComponentId(3), Epoch(1)).await,
        ] {
            match err {
                Err(ComponentError::NotShared {
                    component, detail, ..
                }) => {
                    assert_eq!(component, live.id);
                    assert!(detail.contains("older release"), "{detail}");
                }
                other => panic!("expected NotShared, got {other:?}"),
            }
        }
        // The peer is up and still answers what it speaks; nothing was made.
        io.status(&live).await.unwrap();
        assert!(old.replica.home(ComponentId(2)).is_none());
        assert!(old.replica.home(ComponentId(3)).is_none());
    }
}
