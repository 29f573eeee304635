//! The replica service: component operations on a host's own disk groups.
//!
//! Owns: the mapping from a component to the disk group that stores it, the
//! typed operations a coordinator on this host calls directly (no wire
//! encoding, errors as [`ReplicaError`]), and the translation of wire
//! requests from other hosts into those operations and of their errors into
//! wire errors.
//! Must not touch: placement decisions or layouts. It does what owners ask,
//! and its only judgement is the store's epoch fence: a write from an epoch
//! lower than the highest the component has seen is refused.
//! Invariant: a component lives on exactly one disk group of this host; a
//! create for a component that exists elsewhere on the host goes to that
//! disk group (idempotent), never to a second one. Blocks are shared
//! (`CloneBlocks`) only between components of one disk group; any other
//! pair is answered `NotColocated` and nothing changes. A snapshot, and a
//! clone of one, is made on the disk group of the component it is made
//! from: that is where the blocks it shares are.

use bytes::Bytes;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use tessera_store::{DiskGroup, StoreError};
use tessera_types::{ComponentId, DiskGroupId, Epoch, Lba};
use tessera_wire::{ComponentRef, QueueClass, Request, Response, WireErrorKind};

/// Why a component operation failed on this host.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// The component's disk group refused or failed the operation.
    #[error("{component}: {source}")]
    Store {
        /// The component.
        component: ComponentRef,
        /// What the store said.
        source: StoreError,
    },
    /// No disk group of this host holds the component.
    #[error("{component} does not exist on this host")]
    NotFound {
        /// The component.
        component: ComponentRef,
    },
    /// Blocks cannot be shared between the two components here: nothing
    /// changed, and the owner copies the data instead.
    #[error("{detail}")]
    NotColocated {
        /// Why.
        detail: String,
    },
    /// This host has no disk group to create a component on.
    #[error("this host has no disk group")]
    NoDiskGroup,
}

impl ReplicaError {
    /// The wire error kind another host's owner decides on.
    pub fn wire_kind(&self) -> WireErrorKind {
        match self {
            ReplicaError::Store { source, .. } => store_error_kind(source),
            ReplicaError::NotFound { .. } => WireErrorKind::NotFound,
            ReplicaError::NotColocated { .. } => WireErrorKind::NotColocated,
            ReplicaError::NoDiskGroup => WireErrorKind::NoSpace,
        }
    }

    /// The wire answer for another host's owner.
    pub fn into_response(self) -> Response {
        let kind = self.wire_kind();
        Response::error(kind, self.to_string())
    }
}

/// What [`ReplicaService::status`] reports about one component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaStatus {
    /// The component's size.
    pub size_bytes: u64,
    /// Highest epoch it has seen.
    pub epoch: Epoch,
    /// Bytes of its address space that hold data.
    pub allocated_bytes: u64,
    /// Bytes it occupies on its devices.
    pub physical_bytes: u64,
}

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

    fn group_for(&self, component: &ComponentRef) -> Result<Arc<DiskGroup>, ReplicaError> {
        self.home(component.id)
            .ok_or_else(|| ReplicaError::NotFound {
                component: component.clone(),
            })
    }

    /// Runs `op` on the disk group holding `component`; a store error
    /// names the component.
    async fn on_group<T, F, Fut>(&self, component: &ComponentRef, op: F) -> Result<T, ReplicaError>
    where
        F: FnOnce(Arc<DiskGroup>) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let group = self.group_for(component)?;
        op(group).await.map_err(|e| store(component, e))
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
    ) -> Result<(), ReplicaError> {
        let index = match self.homes.read().get(&component.id) {
            Some(&i) => Some(i),
            None => self.place_new(disk_group),
        };
        let index = index.ok_or(ReplicaError::NoDiskGroup)?;
        self.groups[index]
            .create_component(component.id, size_bytes, reserve_bytes)
            .await
            .map_err(|e| store(component, e))?;
        self.homes.write().insert(component.id, index);
        Ok(())
    }

    /// Deletes a component and frees its space. Idempotent.
    pub async fn delete(&self, component: &ComponentRef) -> Result<(), ReplicaError> {
        let Ok(group) = self.group_for(component) else {
            // Already gone.
            return Ok(());
        };
        match group.delete_component(component.id).await {
            Ok(()) | Err(StoreError::NoSuchComponent { .. }) => {
                self.homes.write().remove(&component.id);
                Ok(())
            }
            Err(e) => Err(store(component, e)),
        }
    }

    /// Grows a component's address space.
    pub async fn resize(
        &self,
        component: &ComponentRef,
        size_bytes: u64,
    ) -> Result<(), ReplicaError> {
        self.on_group(component, |g| async move {
            g.resize_component(component.id, size_bytes)
                .await
                .map(|_| ())
        })
        .await
    }

    /// Writes whole blocks at `lba`; durable when it returns Ok.
    pub async fn write(
        &self,
        component: &ComponentRef,
        lba: Lba,
        data: Bytes,
        epoch: Epoch,
    ) -> Result<(), ReplicaError> {
        self.on_group(component, |g| async move {
            g.write(component.id, lba, data, epoch).await
        })
        .await
    }

    /// Reads `blocks` blocks at `lba`, each verified against its checksum.
    /// A read for a resync or rebuild (`QueueClass::Resync`) copies the
    /// blocks elsewhere and reads them once: past the store's content cache
    /// and the host's page cache.
    pub async fn read(
        &self,
        component: &ComponentRef,
        lba: Lba,
        blocks: u32,
        class: QueueClass,
    ) -> Result<Bytes, ReplicaError> {
        self.on_group(component, |g| async move {
            match class {
                QueueClass::Guest => g.read(component.id, lba, blocks).await,
                QueueClass::Resync => g.read_for_copy(component.id, lba, blocks).await,
            }
        })
        .await
    }

    /// Deallocates blocks.
    pub async fn unmap(
        &self,
        component: &ComponentRef,
        lba: Lba,
        blocks: u64,
        epoch: Epoch,
    ) -> Result<(), ReplicaError> {
        self.on_group(component, |g| async move {
            g.unmap(component.id, lba, blocks, epoch).await
        })
        .await
    }

    /// Makes blocks read as zeros.
    pub async fn write_zeroes(
        &self,
        component: &ComponentRef,
        lba: Lba,
        blocks: u64,
        epoch: Epoch,
    ) -> Result<(), ReplicaError> {
        self.on_group(component, |g| async move {
            g.write_zeroes(component.id, lba, blocks, epoch).await
        })
        .await
    }

    /// Makes every acknowledged write of the component's disk group durable.
    pub async fn flush(&self, component: &ComponentRef) -> Result<(), ReplicaError> {
        self.on_group(component, |g| async move { g.flush().await })
            .await
    }

    /// Installs `epoch` as the lowest the component accepts.
    pub async fn fence(&self, component: &ComponentRef, epoch: Epoch) -> Result<(), ReplicaError> {
        self.on_group(
            component,
            |g| async move { g.fence(component.id, epoch).await },
        )
        .await
    }

    /// Runs of allocated blocks within `[from, from+blocks)`.
    pub async fn allocated(
        &self,
        component: &ComponentRef,
        from: Lba,
        blocks: u64,
    ) -> Result<Vec<(Lba, u64)>, ReplicaError> {
        self.on_group(component, |g| async move {
            g.allocated(component.id, from, blocks).await
        })
        .await
    }

    /// Runs of blocks within `[from, from+blocks)` where `component` may
    /// hold other data than `base` (of the same disk group).
    pub async fn changed(
        &self,
        component: &ComponentRef,
        base: ComponentId,
        from: Lba,
        blocks: u64,
    ) -> Result<Vec<(Lba, u64)>, ReplicaError> {
        self.on_group(component, |g| async move {
            g.changed(base, component.id, from, blocks).await
        })
        .await
    }

    /// The bytes `component` holds alone and shares with others.
    pub async fn held_space(
        &self,
        component: &ComponentRef,
    ) -> Result<tessera_store::HeldSpace, ReplicaError> {
        self.on_group(
            component,
            |g| async move { g.held_space(component.id).await },
        )
        .await
    }

    /// Epoch and space of a component.
    pub fn status(&self, component: &ComponentRef) -> Result<ReplicaStatus, ReplicaError> {
        let group = self.group_for(component)?;
        let space = group
            .component_space(component.id)
            .map_err(|e| store(component, e))?;
        let epoch = group.epoch(component.id).map_err(|e| store(component, e))?;
        Ok(ReplicaStatus {
            size_bytes: space.logical_bytes,
            epoch,
            allocated_bytes: space.allocated_bytes,
            physical_bytes: space.physical_bytes,
        })
    }

    /// Serves one component request from another host. Requests that are
    /// not component operations are answered `Invalid`.
    pub async fn handle(&self, class: QueueClass, request: Request) -> Response {
        let done = |r: Result<(), ReplicaError>| match r {
            Ok(()) => Response::Ok,
            Err(e) => answer_error(e),
        };
        match request {
            Request::CreateComponent {
                component,
                size_bytes,
                reserve_bytes,
            } => done(
                self.create(&component, None, size_bytes, reserve_bytes)
                    .await,
            ),
            Request::DeleteComponent { component } => done(self.delete(&component).await),
            Request::ResizeComponent {
                component,
                size_bytes,
            } => done(self.resize(&component, size_bytes).await),
            Request::Write {
                component,
                lba,
                epoch,
                data,
            } => done(self.write(&component, lba, data, epoch).await),
            Request::Read {
                component,
                lba,
                blocks,
            } => match self.read(&component, lba, blocks, class).await {
                Ok(data) => Response::Data(data),
                Err(e) => answer_error(e),
            },
            Request::Unmap {
                component,
                lba,
                blocks,
                epoch,
            } => done(self.unmap(&component, lba, blocks, epoch).await),
            Request::WriteZeroes {
                component,
                lba,
                blocks,
                epoch,
            } => done(self.write_zeroes(&component, lba, blocks, epoch).await),
            Request::Flush { component } => done(self.flush(&component).await),
            Request::Fence { component, epoch } => done(self.fence(&component, epoch).await),
            Request::Allocated {
                component,
                from,
                blocks,
            } => match self.allocated(&component, from, blocks).await {
                Ok(ranges) => Response::Ranges(ranges),
                Err(e) => answer_error(e),
            },
            Request::Changed {
                component,
                base,
                from,
                blocks,
            } => match self.changed(&component, base, from, blocks).await {
                Ok(ranges) => Response::Ranges(ranges),
                Err(e) => answer_error(e),
            },
            Request::HeldSpace { component } => match self.held_space(&component).await {
                Ok(h) => Response::Held {
                    alone_bytes: h.alone_bytes,
                    shared_bytes: h.shared_bytes,
                },
                Err(e) => answer_error(e),
            },
            Request::ComponentStatus { component } => match self.status(&component) {
                Ok(s) => Response::Status {
                    size_bytes: s.size_bytes,
                    epoch: s.epoch,
                    allocated_bytes: s.allocated_bytes,
                    physical_bytes: s.physical_bytes,
                },
                Err(e) => answer_error(e),
            },
            Request::CloneBlocks {
                source,
                source_lba,
                target,
                target_lba,
                blocks,
                epoch,
            } => done(
                self.clone_blocks(&source, source_lba, &target, target_lba, blocks, epoch)
                    .await,
            ),
            Request::SnapshotComponent {
                component,
                snapshot,
                epoch,
            } => done(self.snapshot(&component, snapshot, epoch).await),
            Request::CloneSnapshot {
                snapshot,
                clone,
                epoch,
            } => done(self.clone_snapshot(&snapshot, clone, epoch).await),
            other => Response::error(
                WireErrorKind::Invalid,
                format!("{} is not a component operation", other.kind().name()),
            ),
        }
    }

    /// Shares `blocks` blocks of `source` into `target` (see
    /// [`DiskGroup::clone_blocks`]). Blocks are shared only within one disk
    /// group: two components on different ones, or a source this host does
    /// not hold, are refused with [`ReplicaError::NotColocated`] and nothing
    /// changes, so the owner copies the data instead.
    pub async fn clone_blocks(
        &self,
        source: &ComponentRef,
        source_lba: Lba,
        target: &ComponentRef,
        target_lba: Lba,
        blocks: u64,
        epoch: Epoch,
    ) -> Result<(), ReplicaError> {
        let (source_home, target_home) = {
            let homes = self.homes.read();
            (
                homes.get(&source.id).copied(),
                homes.get(&target.id).copied(),
            )
        };
        let Some(target_home) = target_home else {
            return Err(ReplicaError::NotFound {
                component: target.clone(),
            });
        };
        let group = Arc::clone(&self.groups[target_home]);
        match source_home {
            Some(home) if home == target_home => {}
            Some(home) => {
                return Err(ReplicaError::NotColocated {
                    detail: format!(
                        "{target} is on disk group {} and {source} on disk group {} of this host: blocks are shared only within one disk group",
                        group.id(),
                        self.groups[home].id()
                    ),
                })
            }
            None => {
                return Err(ReplicaError::NotColocated {
                    detail: format!(
                        "{source} is not on this host, so it cannot share blocks with {target}"
                    ),
                })
            }
        }
        group
            .clone_blocks(source.id, source_lba, target.id, target_lba, blocks, epoch)
            .await
            .map_err(|e| store(target, e))
    }

    /// Takes a snapshot `snapshot` of `component` (see
    /// [`DiskGroup::snapshot_component`]): a read-only component of the
    /// same volume, on `component`'s disk group, holding what `component`
    /// holds now. Refused with a stale epoch if `component` has seen a
    /// newer owner than `epoch`. Taking the same snapshot again succeeds and
    /// changes nothing.
    pub async fn snapshot(
        &self,
        component: &ComponentRef,
        snapshot: ComponentId,
        epoch: Epoch,
    ) -> Result<(), ReplicaError> {
        // The store turns a stale owner away (its epoch is checked like a
        // write's), so no point in time is left that a newer owner does not
        // know of.
        let (group, home) = self.home_for_copy(component, snapshot)?;
        group
            .snapshot_component(component.id, snapshot, epoch)
            .await
            .map_err(|e| store(component, e))?;
        self.homes.write().insert(snapshot, home);
        Ok(())
    }

    /// Makes `clone` a writable linked clone of the snapshot `snapshot`
    /// (see [`DiskGroup::clone_component`]): a component of the same volume,
    /// on the snapshot's disk group, holding what the snapshot holds and
    /// accepting `epoch` and later. Making the same clone again succeeds and
    /// changes nothing.
    pub async fn clone_snapshot(
        &self,
        snapshot: &ComponentRef,
        clone: ComponentId,
        epoch: Epoch,
    ) -> Result<(), ReplicaError> {
        let (group, home) = self.home_for_copy(snapshot, clone)?;
        group
            .clone_component(snapshot.id, clone, epoch)
            .await
            .map_err(|e| store(snapshot, e))?;
        self.homes.write().insert(clone, home);
        Ok(())
    }

    /// The disk group (and its index) of `from`, where a snapshot or clone
    /// `made` of it is made. A `made` that already lives on another disk
    /// group of this host is refused: the store would make a second
    /// component of that number, on a second disk group. Errors name
    /// `from`, the component the request addresses (the store's error names
    /// the component it is about).
    fn home_for_copy(
        &self,
        from: &ComponentRef,
        made: ComponentId,
    ) -> Result<(Arc<DiskGroup>, usize), ReplicaError> {
        let (from_home, made_home) = {
            let homes = self.homes.read();
            (homes.get(&from.id).copied(), homes.get(&made).copied())
        };
        let Some(home) = from_home else {
            return Err(ReplicaError::NotFound {
                component: from.clone(),
            });
        };
        if let Some(other) = made_home.filter(|&h| h != home) {
            let size_bytes = self.groups[other]
                .component_space(made)
                .map_or(0, |s| s.logical_bytes);
            return Err(store(
                from,
                StoreError::ComponentExists {
                    component: made,
                    size_bytes,
                },
            ));
        }
        Ok((Arc::clone(&self.groups[home]), home))
    }
}

fn store(component: &ComponentRef, source: StoreError) -> ReplicaError {
    ReplicaError::Store {
        component: component.clone(),
        source,
    }
}

/// The wire answer for a failed operation; device failures are logged here,
/// on the host whose device failed.
fn answer_error(e: ReplicaError) -> Response {
    if e.wire_kind() == WireErrorKind::Io {
        tracing::error!(error = %e, "component I/O failed");
    }
    e.into_response()
}

/// The wire error kind for a store error: what the owner decides on.
pub fn store_error_kind(e: &StoreError) -> WireErrorKind {
    match e {
        StoreError::NoSuchComponent { .. } => WireErrorKind::NotFound,
        StoreError::OutOfRange { .. } => WireErrorKind::OutOfRange,
        StoreError::Misaligned { .. }
        | StoreError::Config(_)
        | StoreError::ComponentExists { .. }
        | StoreError::ReadOnly { .. }
        | StoreError::RekeyUnderWay
        | StoreError::NotStored { .. } => WireErrorKind::Invalid,
        StoreError::StaleEpoch { highest, .. } => WireErrorKind::StaleEpoch { highest: *highest },
        StoreError::NoSpace { .. } | StoreError::NoSpaceForReservation { .. } => {
            WireErrorKind::NoSpace
        }
        StoreError::Checksum { lba, .. } => WireErrorKind::Checksum { lba: *lba },
        StoreError::ComponentFailed { .. }
        | StoreError::DiskGroupFailed { .. }
        | StoreError::Device(_)
        | StoreError::DeviceInUse { .. }
        | StoreError::BadDevice { .. }
        | StoreError::Encryption(_) => WireErrorKind::Io,
    }
}
