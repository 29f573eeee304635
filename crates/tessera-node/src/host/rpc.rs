//! Requests other hosts send this one: volume I/O forwarded to the owner
//! (served by the coordinator this host runs for the volume) and component
//! operations (served by the replica service).
//!
//! Owns: dispatching a wire request to the coordinator or the replica.
//! Must not touch: decoding (the transport's) or what the operations do.
//! Invariant: volume I/O is served only by a coordinator this host runs
//! now; otherwise the answer is `NotOwner`, and the sender looks again.

use super::Owned;
use async_trait::async_trait;
use std::sync::Arc;
use tessera_object::Coordinator;
use tessera_replica::ReplicaService;
use tessera_transport::RequestHandler;
use tessera_types::{HostId, VolumeId};
use tessera_wire::{QueueClass, Request, Response, WireErrorKind};

/// The host's answer to the transport's requests.
pub(super) struct HostHandler {
    pub(super) replica: Arc<ReplicaService>,
    pub(super) owned: Owned,
}

impl HostHandler {
    fn coordinator(&self, volume: &VolumeId) -> Result<Arc<Coordinator>, Response> {
        self.owned.read().get(volume).cloned().ok_or_else(|| {
            Response::error(
                WireErrorKind::NotOwner,
                format!("this host does not own volume {volume}"),
            )
        })
    }
}

#[async_trait]
impl RequestHandler for HostHandler {
    async fn handle(&self, _from: HostId, class: QueueClass, request: Request) -> Response {
        let volume = match &request {
            Request::VolumeRead { volume, .. }
            | Request::VolumeWrite { volume, .. }
            | Request::VolumeFlush { volume }
            | Request::VolumeUnmap { volume, .. }
            | Request::VolumeWriteZeroes { volume, .. }
            | Request::VolumeCompareAndWrite { volume, .. }
            | Request::VolumeBlockStatus { volume, .. }
            | Request::VolumeRepairCopy { volume, .. }
            | Request::VolumeSnapshot { volume, .. }
            | Request::VolumeHoldWrites { volume, .. }
            | Request::VolumeReleaseWrites { volume, .. }
            | Request::VolumeSnapshotHeld { volume, .. } => volume.clone(),
            Request::Ping => return Response::Pong,
            _ => return self.replica.handle(class, request).await,
        };
        match self.coordinator(&volume) {
            Ok(c) => crate::routing::execute(&c, request).await,
            Err(response) => response,
        }
    }
}
