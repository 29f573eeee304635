//! How a coordinator reaches its components, and how it records layout
//! changes: the two seams between the object layer and the rest of a host.
//!
//! Owns: the [`ComponentIo`] and [`LayoutRecorder`] traits and
//! [`ComponentError`]. The node implements them (local store for components
//! on its own disk groups, the transport for the rest; the directory for
//! layouts), so this crate never sees the store, the network or etcd.

use async_trait::async_trait;
use bytes::Bytes;
use tessera_types::dirty::DirtyRecord;
use tessera_types::layout::{ComponentPlacement, Layout};
use tessera_types::{ComponentId, Epoch, HostId, Lba, VolumeId};

/// Blocks one [`ComponentIo::clone_blocks`] call may share: the store's
/// bound on one durable clone (`tessera_store::CLONE_BLOCKS_MAX`; the node
/// checks at compile time that the two agree).
pub const CLONE_BLOCKS_MAX: u64 = 4096;

/// Which queue an operation travels on: resync traffic must never delay
/// guest I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoClass {
    /// A client's I/O.
    Guest,
    /// Copying data to bring a component up to date.
    Resync,
}

/// What one component reports about itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ComponentStatus {
    /// Highest epoch the component has seen.
    pub epoch: Epoch,
    /// Bytes of its address space that hold data.
    pub allocated_bytes: u64,
    /// Bytes it occupies on its devices.
    pub physical_bytes: u64,
}

/// Blocks of one component to be shared into another on the same disk group
/// of one host: what [`ComponentIo::clone_blocks`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockClone {
    /// The volume `source` belongs to (this object's or another's).
    pub source_volume: VolumeId,
    /// The component whose blocks are shared.
    pub source: ComponentPlacement,
    /// First source block.
    pub source_lba: Lba,
    /// The component that receives them (of the calling coordinator's
    /// object).
    pub target: ComponentPlacement,
    /// First target block.
    pub target_lba: Lba,
    /// Number of blocks, at most [`CLONE_BLOCKS_MAX`].
    pub blocks: u64,
    /// The target owner's epoch.
    pub epoch: Epoch,
}

/// Why an operation on one component failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ComponentError {
    /// The component's host did not answer.
    #[error("component {component} on host {host} is unreachable: {detail}")]
    Unreachable {
        /// The component.
        component: ComponentId,
        /// Its host.
        host: HostId,
        /// What the transport said.
        detail: String,
    },
    /// The component has seen a newer owner.
    #[error("component {component} refused {epoch}: it has seen {highest}")]
    StaleEpoch {
        /// The component.
        component: ComponentId,
        /// The epoch that was refused.
        epoch: Epoch,
        /// The highest epoch it has seen.
        highest: Epoch,
    },
    /// A block failed its checksum.
    #[error("component {component}: checksum mismatch at {lba}")]
    Checksum {
        /// The component.
        component: ComponentId,
        /// The bad block.
        lba: Lba,
    },
    /// Its disk group has no space for the write.
    #[error("component {component}: no space left on its disk group")]
    NoSpace {
        /// The component.
        component: ComponentId,
    },
    /// The host has no such component (lost with its disk group).
    #[error("component {component} does not exist on host {host}")]
    NotFound {
        /// The component.
        component: ComponentId,
        /// The host asked.
        host: HostId,
    },
    /// Blocks could not be shared into the component: the source is not on
    /// its disk group, or its host runs a release that cannot share. Nothing
    /// changed; the caller copies the data instead.
    #[error("component {component} on host {host} cannot share the blocks: {detail}")]
    NotShared {
        /// The component that was to receive them.
        component: ComponentId,
        /// Its host.
        host: HostId,
        /// Why.
        detail: String,
    },
    /// A device error.
    #[error("component {component}: I/O error: {detail}")]
    Io {
        /// The component.
        component: ComponentId,
        /// What failed.
        detail: String,
    },
}

/// Operations on components, wherever they live. Data lengths are whole
/// 4 KiB blocks; writes are durable when they return `Ok`.
#[async_trait]
pub trait ComponentIo: Send + Sync + 'static {
    /// Writes whole blocks at `lba`.
    async fn write(
        &self,
        component: &ComponentPlacement,
        lba: Lba,
        data: Bytes,
        epoch: Epoch,
        class: IoClass,
    ) -> Result<(), ComponentError>;

    /// Reads `blocks` blocks at `lba`, checksum-verified.
    async fn read(
        &self,
        component: &ComponentPlacement,
        lba: Lba,
        blocks: u32,
        class: IoClass,
    ) -> Result<Bytes, ComponentError>;

    /// Deallocates blocks; they read as zeros afterwards.
    async fn unmap(
        &self,
        component: &ComponentPlacement,
        lba: Lba,
        blocks: u64,
        epoch: Epoch,
        class: IoClass,
    ) -> Result<(), ComponentError>;

    /// Runs of allocated blocks within `[from, from+blocks)`.
    async fn allocated(
        &self,
        component: &ComponentPlacement,
        from: Lba,
        blocks: u64,
    ) -> Result<Vec<(Lba, u64)>, ComponentError>;

    /// Runs of blocks within `[from, from+blocks)` where `component` may
    /// hold other data than `base`, a component of its volume on the same
    /// disk group (a snapshot taken before it): what a copy holding `base`
    /// must be sent to hold `component`. Never leaves out a block that
    /// differs. This answer names every block either allocates, which is
    /// right but sends more than a store that compares index pages.
    async fn changed(
        &self,
        component: &ComponentPlacement,
        base: ComponentId,
        from: Lba,
        blocks: u64,
    ) -> Result<Vec<(Lba, u64)>, ComponentError> {
        let base = ComponentPlacement {
            id: base,
            ..component.clone()
        };
        let mut lbas = std::collections::BTreeSet::new();
        for c in [component, &base] {
            for (lba, n) in self.allocated(c, from, blocks).await? {
                lbas.extend(lba.0..lba.0 + n);
            }
        }
        let mut runs: Vec<(Lba, u64)> = Vec::new();
        for l in lbas {
            match runs.last_mut() {
                Some((s, n)) if s.0 + *n == l => *n += 1,
                _ => runs.push((Lba(l), 1)),
            }
        }
        Ok(runs)
    }

    /// Makes the target blocks of `clone` hold what its source blocks hold
    /// by sharing the stored blocks: no data moves, holes stay holes, and a
    /// later write to either side leaves the other as it was. Checked
    /// against the target's epoch like a write. Durable when it returns
    /// `Ok`; on an error nothing changed, and [`ComponentError::NotShared`]
    /// says the blocks cannot be shared there.
    async fn clone_blocks(&self, clone: &BlockClone) -> Result<(), ComponentError>;

    /// Installs `epoch` as the lowest the component accepts from now on.
    async fn fence(
        &self,
        component: &ComponentPlacement,
        epoch: Epoch,
    ) -> Result<(), ComponentError>;

    /// Creates the component (idempotent), reserving `reserve_bytes`.
    async fn create(
        &self,
        component: &ComponentPlacement,
        reserve_bytes: u64,
    ) -> Result<(), ComponentError>;

    /// Grows the component's address space to `size_bytes`.
    async fn resize(
        &self,
        component: &ComponentPlacement,
        size_bytes: u64,
    ) -> Result<(), ComponentError>;

    /// Deletes the component and frees its space.
    async fn delete(&self, component: &ComponentPlacement) -> Result<(), ComponentError>;

    /// Takes a snapshot of `component`: a new read-only component
    /// `snapshot` on the same disk group that holds what `component` holds
    /// now, sharing its stored blocks (nothing is copied). Writes to
    /// `component` that reach its host while it is taken are ordered before
    /// or after it; the caller makes sure none is in flight. Checked against
    /// the component's epoch like a write. Taking the same snapshot again
    /// succeeds and changes nothing.
    async fn snapshot(
        &self,
        component: &ComponentPlacement,
        snapshot: ComponentId,
        epoch: Epoch,
    ) -> Result<(), ComponentError>;

    /// Makes `clone` a new writable component on the snapshot's disk group
    /// that holds what the snapshot `snapshot` holds, sharing its stored
    /// blocks until either is changed (a linked clone). Making the same
    /// clone again succeeds and changes nothing.
    async fn clone_snapshot(
        &self,
        snapshot: &ComponentPlacement,
        clone: ComponentId,
        epoch: Epoch,
    ) -> Result<(), ComponentError>;

    /// Epoch and space of the component.
    async fn status(
        &self,
        component: &ComponentPlacement,
    ) -> Result<ComponentStatus, ComponentError>;

    /// True when the component lives on the calling host, so an operation
    /// on it may run on the caller's thread until it is durable (the store
    /// commits a lone write inline). The coordinator starts operations on
    /// other hosts first, so their requests are on the wire while the local
    /// copy is written: the copies are written in parallel, not one after
    /// the other.
    fn is_local(&self, _component: &ComponentPlacement) -> bool {
        false
    }
}

/// Where the coordinator records layout changes (component states, rebuilt
/// components) and the coarse dirty-region maps of the copies that are
/// behind. A change is recorded *before* the write that depends on it is
/// acknowledged, so a later owner never reads a copy that missed a write;
/// a copy's map covers a write *before* the write is sent to the other
/// copies, so a later owner resyncs at least every block it missed.
#[async_trait]
pub trait LayoutRecorder: Send + Sync + 'static {
    /// Persists `layout` (whose generation the coordinator has raised) and
    /// `dirty` together: a reader sees both or neither.
    async fn record(&self, layout: &Layout, dirty: &DirtyRecord) -> Result<(), String>;

    /// Persists `dirty` alone (the layout did not change).
    async fn record_dirty(&self, dirty: &DirtyRecord) -> Result<(), String>;

    /// Persists a snapshot the coordinator took, if its epoch is still the
    /// volume's and the volume has no snapshot of that name; an error
    /// otherwise (the coordinator then deletes what it took).
    async fn record_snapshot(&self, snapshot: &TakenSnapshot) -> Result<(), String>;

    /// Persists `layout` and `dirty` as [`LayoutRecorder::record`] does,
    /// and in the same transaction changes the records of the volume's
    /// snapshots as `changes` say (a copy that joins or leaves the volume
    /// with its snapshots). Returns the snapshots of `changes` that have no
    /// record any more (deleted meanwhile): components made for them are
    /// the caller's to delete.
    async fn record_snapshot_copies(
        &self,
        layout: &Layout,
        dirty: &DirtyRecord,
        changes: &[SnapshotCopyChange],
    ) -> Result<Vec<u64>, String>;
}

/// A change to the components of one snapshot of a volume, made when a
/// copy of the volume joins or leaves it: see
/// [`LayoutRecorder::record_snapshot_copies`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotCopyChange {
    /// The snapshot's number.
    pub snapshot: u64,
    /// The copy of the volume whose snapshot component the change is
    /// made at (`copy.snapshot(snapshot)` in the snapshot's layout).
    pub copy: ComponentId,
    /// What happens there.
    pub edit: SnapshotCopyEdit,
}

/// What a [`SnapshotCopyChange`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotCopyEdit {
    /// The copy was lost: this new copy's snapshot takes its place.
    Replace(ComponentPlacement),
    /// This new copy's snapshot joins the copy's column.
    AddBeside(ComponentPlacement),
    /// The copy left: its snapshot leaves too.
    Remove,
}

impl SnapshotCopyChange {
    /// Applies each of `changes` to the layout of its snapshot among
    /// `snapshots` (number, layout); answers the snapshots of `changes`
    /// none of them is (or that lack the copy).
    pub fn apply_all<'a>(
        changes: &[SnapshotCopyChange],
        snapshots: impl IntoIterator<Item = (u64, &'a mut Layout)>,
    ) -> Vec<u64> {
        let mut layouts: Vec<(u64, &'a mut Layout)> = snapshots.into_iter().collect();
        let mut gone = Vec::new();
        for c in changes {
            let applied = layouts
                .iter_mut()
                .find(|(id, _)| *id == c.snapshot)
                .is_some_and(|(_, layout)| c.apply(layout));
            if !applied {
                gone.push(c.snapshot);
            }
        }
        gone
    }

    /// Applies the change to `layout` (the snapshot's); false if the copy's
    /// snapshot component is not in it.
    pub fn apply(&self, layout: &mut Layout) -> bool {
        let at = self.copy.snapshot(self.snapshot);
        let Some(column) = layout
            .columns
            .iter_mut()
            .find(|m| m.copies.iter().any(|c| c.id == at))
        else {
            return false;
        };
        match &self.edit {
            SnapshotCopyEdit::Replace(made) => {
                for slot in column.copies.iter_mut().filter(|c| c.id == at) {
                    *slot = made.clone();
                }
            }
            SnapshotCopyEdit::AddBeside(made) => {
                if !column.copies.iter().any(|c| c.id == made.id) {
                    column.copies.push(made.clone());
                }
            }
            SnapshotCopyEdit::Remove => column.copies.retain(|c| c.id != at),
        }
        true
    }
}

/// A snapshot a coordinator took on every copy of its volume, for its
/// [`LayoutRecorder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenSnapshot {
    /// Its name, as asked.
    pub name: String,
    /// Its number (its components' ids are made from it).
    pub id: u64,
    /// When it was taken (ms since the Unix epoch), as asked.
    pub created_ms: u64,
    /// The owner epoch that took it.
    pub epoch: Epoch,
    /// Its components: the volume's columns, each copy replaced by its
    /// snapshot (see [`crate::snapshot_layout`]).
    pub layout: Layout,
}
