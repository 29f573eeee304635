//! The replica service: component operations on a host's own disk groups.
//!
//! Owns: the mapping from a component to the disk group that stores it, and
//! the translation of wire requests into store operations and of store
//! errors into wire errors.
//! Must not touch: placement decisions or layouts. It does what owners ask,
//! and its only judgement is the store's epoch fence: a write from an epoch
//! lower than the highest the component has seen is refused.
//! Invariant: a component lives on exactly one disk group of this host; a
//! create for a component that exists elsewhere on the host goes to that
//! disk group (idempotent), never to a second one. Blocks are shared
//! (`CloneBlocks`) only between components of one disk group; any other
//! pair is answered `NotColocated` and nothing changes.

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use tessera_store::{DiskGroup, StoreError};
use tessera_types::{ComponentId, DiskGroupId, Epoch, Lba};
use tessera_wire::{ComponentRef, Request, Response, WireErrorKind};

/// A host's disk groups, serving component requests.
pub struct ReplicaService {
    groups: Vec<Arc<DiskGroup>>,
    /// Which disk group holds each component.
    homes: RwLock<HashMap<ComponentId, usize>>,
}

impl ReplicaService {
    /// Serves `groups`, learning which components each already holds.
    pub fn new(groups: Vec<Arc<DiskGroup>>) -> ReplicaService {
        let mut homes = HashMap::new();
        for (i, g) in groups.iter().enumerate() {
            for c in g.components() {
                homes.insert(c.id, i);
            }
        }
        ReplicaService {
            groups,
            homes: RwLock::new(homes),
        }
    }

    /// The disk groups served.
    pub fn disk_groups(&self) -> &[Arc<DiskGroup>] {
        &self.groups
    }

    /// The disk group holding `id`, if any.
    pub fn home(&self, id: ComponentId) -> Option<Arc<DiskGroup>> {
        let homes = self.homes.read();
        homes.get(&id).map(|&i| Arc::clone(&self.groups[i]))
    }

    fn group_for(&self, component: &ComponentRef) -> Result<Arc<DiskGroup>, Response> {
        self.home(component.id).ok_or_else(|| {
            Response::error(
                WireErrorKind::NotFound,
                format!("{component} does not exist on this host"),
            )
        })
    }

    /// Picks the disk group for a new component: `wanted` if named and
    /// present, else the healthy one with the most free space.
    fn place_new(&self, wanted: Option<&DiskGroupId>) -> Option<usize> {
        if let Some(w) = wanted {
            if let Some(i) = self.groups.iter().position(|g| g.id() == w) {
                return Some(i);
            }
        }
        (0..self.groups.len()).max_by_key(|&i| self.groups[i].space().free_bytes)
    }

    /// Creates a component on the disk group `disk_group` (or the emptiest
    /// one). Idempotent.
    pub async fn create(
        &self,
        component: &ComponentRef,
        disk_group: Option<&DiskGroupId>,
        size_bytes: u64,
        reserve_bytes: u64,
    ) -> Response {
        let index = match self.homes.read().get(&component.id) {
            Some(&i) => Some(i),
            None => self.place_new(disk_group),
        };
        let Some(index) = index else {
            return Response::error(WireErrorKind::NoSpace, "this host has no disk group");
        };
        match self.groups[index]
            .create_component(component.id, size_bytes, reserve_bytes)
            .await
        {
            Ok(()) => {
                self.homes.write().insert(component.id, index);
                Response::Ok
            }
            Err(e) => store_error(component, e),
        }
    }

    /// Serves one component request. Requests that are not component
    /// operations are answered `Invalid`.
    pub async fn handle(&self, request: Request) -> Response {
        match request {
            Request::CreateComponent {
                component,
                size_bytes,
                reserve_bytes,
            } => {
                self.create(&component, None, size_bytes, reserve_bytes)
                    .await
            }
            Request::DeleteComponent { component } => {
                let group = match self.group_for(&component) {
                    Ok(g) => g,
                    // Already gone: deleting is idempotent.
                    Err(_) => return Response::Ok,
                };
                match group.delete_component(component.id).await {
                    Ok(()) | Err(StoreError::NoSuchComponent { .. }) => {
                        self.homes.write().remove(&component.id);
                        Response::Ok
                    }
                    Err(e) => store_error(&component, e),
                }
            }
            Request::ResizeComponent {
                component,
                size_bytes,
            } => {
                self.with_group(&component, |g| async move {
                    g.resize_component(component.id, size_bytes)
                        .await
                        .map(|_| Response::Ok)
                })
                .await
            }
            Request::Write {
                component,
                lba,
                epoch,
                data,
            } => {
                self.with_group(&component, |g| async move {
                    g.write(component.id, lba, data, epoch)
                        .await
                        .map(|_| Response::Ok)
                })
                .await
            }
            Request::Read {
                component,
                lba,
                blocks,
            } => {
                self.with_group(&component, |g| async move {
                    g.read(component.id, lba, blocks).await.map(Response::Data)
                })
                .await
            }
            Request::Unmap {
                component,
                lba,
                blocks,
                epoch,
            } => {
                self.with_group(&component, |g| async move {
                    g.unmap(component.id, lba, blocks, epoch)
                        .await
                        .map(|_| Response::Ok)
                })
                .await
            }
            Request::WriteZeroes {
                component,
                lba,
                blocks,
                epoch,
            } => {
                self.with_group(&component, |g| async move {
                    g.write_zeroes(component.id, lba, blocks, epoch)
                        .await
                        .map(|_| Response::Ok)
                })
                .await
            }
            Request::Flush { component } => {
                self.with_group(&component, |g| async move {
                    g.flush().await.map(|_| Response::Ok)
                })
                .await
            }
            Request::Fence { component, epoch } => {
                self.with_group(&component, |g| async move {
                    g.fence(component.id, epoch).await.map(|_| Response::Ok)
                })
                .await
            }
            Request::Allocated {
                component,
                from,
                blocks,
            } => {
                self.with_group(&component, |g| async move {
                    g.allocated(component.id, from, blocks)
                        .await
                        .map(Response::Ranges)
                })
                .await
            }
            Request::ComponentStatus { component } => {
                self.with_group(&component, |g| async move {
                    let space = g.component_space(component.id)?;
                    let epoch = g.epoch(component.id)?;
                    Ok(Response::Status {
                        size_bytes: space.logical_bytes,
                        epoch,
                        allocated_bytes: space.allocated_bytes,
                        physical_bytes: space.physical_bytes,
                    })
                })
                .await
            }
            Request::CloneBlocks {
                source,
                source_lba,
                target,
                target_lba,
                blocks,
                epoch,
            } => {
                self.clone_blocks(&source, source_lba, &target, target_lba, blocks, epoch)
                    .await
            }
            other => Response::error(
                WireErrorKind::Invalid,
                format!("{} is not a component operation", other.kind().name()),
            ),
        }
    }

    /// Shares `blocks` blocks of `source` into `target` (see
    /// [`DiskGroup::clone_blocks`]). Blocks are shared only within one disk
    /// group: two components on different ones, or a source this host does
    /// not hold, are answered [`WireErrorKind::NotColocated`] and nothing
    /// changes, so the owner copies the data instead.
    pub async fn clone_blocks(
        &self,
        source: &ComponentRef,
        source_lba: Lba,
        target: &ComponentRef,
        target_lba: Lba,
        blocks: u64,
        epoch: Epoch,
    ) -> Response {
        let (source_home, target_home) = {
            let homes = self.homes.read();
            (
                homes.get(&source.id).copied(),
                homes.get(&target.id).copied(),
            )
        };
        let Some(target_home) = target_home else {
            return Response::error(
                WireErrorKind::NotFound,
                format!("{target} does not exist on this host"),
            );
        };
        let group = Arc::clone(&self.groups[target_home]);
        match source_home {
            Some(home) if home == target_home => {}
            Some(home) => {
                return Response::error(
                    WireErrorKind::NotColocated,
                    format!(
                        "{target} is on disk group {} and {source} on disk group {} of this host: blocks are shared only within one disk group",
                        group.id(),
                        self.groups[home].id()
                    ),
                )
            }
            None => {
                return Response::error(
                    WireErrorKind::NotColocated,
                    format!("{source} is not on this host, so it cannot share blocks with {target}"),
                )
            }
        }
        match group
            .clone_blocks(source.id, source_lba, target.id, target_lba, blocks, epoch)
            .await
        {
            Ok(()) => Response::Ok,
            Err(e) => store_error(target, e),
        }
    }

    async fn with_group<F, Fut>(&self, component: &ComponentRef, op: F) -> Response
    where
        F: FnOnce(Arc<DiskGroup>) -> Fut,
        Fut: std::future::Future<Output = Result<Response, StoreError>>,
    {
        let group = match self.group_for(component) {
            Ok(g) => g,
            Err(response) => return response,
        };
        match op(group).await {
            Ok(r) => r,
            Err(e) => store_error(component, e),
        }
    }
}

/// Maps a store error to the wire error the owner decides on.
pub fn store_error(component: &ComponentRef, e: StoreError) -> Response {
    let kind = match &e {
        StoreError::NoSuchComponent { .. } => WireErrorKind::NotFound,
        StoreError::OutOfRange { .. } => WireErrorKind::OutOfRange,
        StoreError::Misaligned { .. }
        | StoreError::Config(_)
        | StoreError::ComponentExists { .. } => WireErrorKind::Invalid,
        StoreError::StaleEpoch { highest, .. } => WireErrorKind::StaleEpoch { highest: *highest },
        StoreError::NoSpace { .. } | StoreError::NoSpaceForReservation { .. } => {
            WireErrorKind::NoSpace
        }
        StoreError::Checksum { lba, .. } => WireErrorKind::Checksum { lba: *lba },
        StoreError::ComponentFailed { .. }
        | StoreError::DiskGroupFailed { .. }
        | StoreError::Device(_)
        | StoreError::DeviceInUse { .. }
        | StoreError::BadDevice { .. } => WireErrorKind::Io,
    };
    if kind == WireErrorKind::Io {
        tracing::error!(%component, error = %e, "component I/O failed");
    }
    Response::error(kind, format!("{component}: {e}"))
}
