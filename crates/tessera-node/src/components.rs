//! Reaching components from a coordinator: the node's [`ComponentIo`].
//!
//! Owns: the choice between the local replica service (components on this
//! host's disk groups, called directly: no socket, no copy) and the
//! transport (components elsewhere), and the mapping of wire answers to
//! [`ComponentError`].
//! Invariant: an answer that is not understood is an error, never data.

use crate::peers::Peers;
use async_trait::async_trait;
use bytes::Bytes;
use std::sync::Arc;
use tessera_object::{BlockClone, ComponentError, ComponentIo, ComponentStatus, IoClass};
use tessera_replica::ReplicaService;
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

    async fn send(
        &self,
        c: &ComponentPlacement,
        class: IoClass,
        request: Request,
    ) -> Result<Response, ComponentError> {
        if c.host == self.host {
            return Ok(self.replica.handle(request).await);
        }
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

/// Turns a wire answer that is not the expected one into an error.
fn unexpected(c: &ComponentPlacement, response: Response) -> ComponentError {
    match response {
        Response::Error { kind, message } => match kind {
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
            _ => ComponentError::Io {
                component: c.id,
                detail: message,
            },
        },
        other => ComponentError::Io {
            component: c.id,
            detail: format!("unexpected answer {:?}", other.kind()),
        },
    }
}

#[async_trait]
impl ComponentIo for ClusterComponents {
    async fn write(
        &self,
        c: &ComponentPlacement,
        lba: Lba,
        data: Bytes,
        epoch: Epoch,
        class: IoClass,
    ) -> Result<(), ComponentError> {
        let component = self.reference(c);
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
            Response::Data(data)
                if data.len() as u64 == blocks as u64 * tessera_types::BLOCK_BYTES =>
            {
                Ok(data)
            }
            other => Err(unexpected(c, other)),
        }
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
        let request = Request::CloneBlocks {
            source: ComponentRef {
                volume: clone.source_volume.clone(),
                id: clone.source.id,
            },
            source_lba: clone.source_lba,
            target: self.reference(c),
            target_lba: clone.target_lba,
            blocks: clone.blocks,
            epoch: clone.epoch,
        };
        let not_shared = |detail: String| ComponentError::NotShared {
            component: c.id,
            host: c.host.clone(),
            detail,
        };
        let response = if c.host == self.host {
            self.replica.handle(request).await
        } else {
            let Some(addr) = self.peers.transport_addr(&c.host) else {
                return Err(ComponentError::Unreachable {
                    component: c.id,
                    host: c.host.clone(),
                    detail: "no address known for the host".into(),
                });
            };
            match self
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
            }
        };
        match response {
            Response::Ok => Ok(()),
            // Not co-located, or a request the replica refused as malformed
            // (and so did not carry out): copying the data gives the same
            // bytes, where failing the copy would fail a guest's clone.
            Response::Error {
                kind: WireErrorKind::NotColocated | WireErrorKind::Invalid,
                message,
            } => Err(not_shared(message)),
            other => Err(unexpected(c, other)),
        }
    }

    async fn fence(&self, c: &ComponentPlacement, epoch: Epoch) -> Result<(), ComponentError> {
        let component = self.reference(c);
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
        if c.host == self.host {
            return match self
                .replica
                .create(&component, Some(&c.disk_group), size_bytes, reserve_bytes)
                .await
            {
                Response::Ok => Ok(()),
                other => Err(unexpected(c, other)),
            };
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
        self.expect_ok(c, IoClass::Guest, Request::DeleteComponent { component })
            .await
    }

    async fn status(&self, c: &ComponentPlacement) -> Result<ComponentStatus, ComponentError> {
        let component = self.reference(c);
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
