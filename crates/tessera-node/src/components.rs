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
use tessera_types::{Epoch, HostId, Lba, VolumeId};
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
        let class = match class {
            IoClass::Guest => QueueClass::Guest,
            IoClass::Resync => QueueClass::Resync,
        };
        self.transport
            .call(&c.host, addr, class, request)
            .await
            .map_err(|e| unreachable(e.to_string()))
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
                .read(&component, lba, blocks)
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
        if self.is_local(c) {
            return self
                .replica
                .allocated(&component, from, blocks)
                .await
                .map_err(|e| local_error(c, e));
        }
        match self
            .send(
                c,
                IoClass::Resync,
                Request::Allocated {
                    component,
                    from,
                    blocks,
                },
            )
            .await?
        {
            Response::Ranges(ranges) => Ok(ranges),
            other => Err(unexpected(c, other)),
        }
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
