//! Serving a volume from any host: the NBD catalog and the volume handle
//! that sends each request to the volume's owner.
//!
//! Owns: [`HostCatalog`] (the exports a host offers: every ready volume not
//! being filled, and every snapshot read-only; a full clone being filled
//! is refused with the fill's progress) and [`VolumeHandle`] (a `BlockDevice` that runs
//! I/O on the local coordinator when this host owns the volume, and forwards
//! it over the transport to the owner otherwise; an EXTENDED COPY between
//! two volumes this host owns shares stored blocks on the owner's
//! coordinator), the typed volume
//! operation both paths run (encoded as a wire request only when it leaves
//! the host), and the mapping between `BlockError` and wire errors.
//! Invariant: while ownership moves, requests wait (bounded by
//! [`ROUTE_WAIT`]) rather than fail, so a client sees a pause, not an error.

use crate::attachments::{AttachGuard, Attachments};
use crate::host::{Owned, VolumeView};
use crate::peers::Peers;
use async_trait::async_trait;
use bytes::Bytes;
use std::any::Any;
use std::sync::Arc;
use std::time::Duration;
use tessera_blockdev::{
    copy_by_data, BlockDevice, BlockError, DeviceInfo, Extent, ExtentKind, SpaceUsage, WriteFlags,
    ZeroMode,
};
use tessera_nbd::ExportCatalog;
use tessera_object::{Coordinator, IoKind};
use tessera_transport::Transport;
use tessera_types::{ComponentId, HostId, Lba, VolumeId};
use tessera_wire::{QueueClass, Request, Response, WireErrorKind};

/// How long a request waits for a volume to get a reachable owner.
pub const ROUTE_WAIT: Duration = Duration::from_secs(15);
/// Bytes forwarded per request: below the wire's data limit, large enough
/// to amortise a round trip.
pub const FORWARD_BYTES_MAX: u64 = 4 << 20;
/// Pause between routing attempts.
const ROUTE_RETRY: Duration = Duration::from_millis(200);

/// The exports of one host.
pub struct HostCatalog {
    host: HostId,
    replica: Arc<tessera_replica::ReplicaService>,
    owned: Owned,
    view: Arc<VolumeView>,
    peers: Arc<Peers>,
    transport: Arc<Transport>,
    attachments: Arc<Attachments>,
}

impl HostCatalog {
    /// A catalog over the host's view of the volumes.
    pub fn new(
        host: HostId,
        replica: Arc<tessera_replica::ReplicaService>,
        owned: Owned,
        view: Arc<VolumeView>,
        peers: Arc<Peers>,
        transport: Arc<Transport>,
        attachments: Arc<Attachments>,
    ) -> HostCatalog {
        HostCatalog {
            host,
            replica,
            owned,
            view,
            peers,
            transport,
            attachments,
        }
    }

    /// A handle on a ready volume (not one being filled: it serves no
    /// client until the fill ends). `attached` counts it as one client's
    /// open volume for as long as the handle lives (an NBD connection);
    /// the iSCSI target's shared handle counts sessions instead.
    pub fn open_handle(&self, name: &str, attached: bool) -> Option<Arc<VolumeHandle>> {
        let volume = VolumeId::new(name).ok()?;
        let record = self.view.volumes.read().get(&volume).cloned()?;
        if !record.serves_clients() {
            return None;
        }
        Some(Arc::new(VolumeHandle {
            host: self.host.clone(),
            info: DeviceInfo {
                name: name.to_string(),
                size_bytes: record.size_bytes,
                logical_block_bytes: record.block_bytes,
                preferred_block_bytes: 4096,
                read_only: false,
                serial: crate::host::serial_of(&record),
            },
            _attached: attached.then(|| self.attachments.attach(&volume)),
            volume,
            owned: Arc::clone(&self.owned),
            view: Arc::clone(&self.view),
            peers: Arc::clone(&self.peers),
            transport: Arc::clone(&self.transport),
        }))
    }

    /// The snapshot an export name (`volume@snapshot`) names, if it exists.
    fn snapshot(&self, name: &str) -> Option<tessera_directory::keys::SnapshotRecord> {
        let (volume, snapshot) = name.split_once(crate::snapshot_export::SNAPSHOT_SEPARATOR)?;
        let key = (
            VolumeId::new(volume).ok()?,
            tessera_directory::keys::SnapshotName::new(snapshot).ok()?,
        );
        self.view.snapshots.read().get(&key).cloned()
    }

    /// The snapshot `record`, served read-only from any of its copies
    /// (this host's first): the NBD export `volume@snapshot` and the
    /// snapshot's iSCSI target both read it through this.
    pub fn open_snapshot(
        &self,
        record: tessera_directory::keys::SnapshotRecord,
    ) -> Arc<crate::snapshot_export::SnapshotDevice> {
        let io = Arc::new(crate::components::ClusterComponents::new(
            self.host.clone(),
            record.volume.clone(),
            Arc::clone(&self.replica),
            Arc::clone(&self.transport),
            Arc::clone(&self.peers),
        ));
        Arc::new(crate::snapshot_export::SnapshotDevice::new(
            record,
            io,
            self.host.clone(),
        ))
    }

    /// Counts one iSCSI session of `volume` while the guard lives.
    pub fn attach(&self, volume: &VolumeId) -> AttachGuard {
        self.attachments.attach(volume)
    }
}

impl ExportCatalog for HostCatalog {
    fn list(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .view
            .volumes
            .read()
            .values()
            .filter(|v| v.serves_clients())
            .map(|v| v.name.to_string())
            .collect();
        names.extend(
            self.view
                .snapshots
                .read()
                .values()
                .map(crate::snapshot_export::export_name),
        );
        names.sort();
        names
    }

    fn open(&self, name: &str) -> Option<Arc<dyn BlockDevice>> {
        if let Some(record) = self.snapshot(name) {
            return Some(self.open_snapshot(record));
        }
        self.open_handle(name, true)
            .map(|h| h as Arc<dyn BlockDevice>)
    }

    fn description(&self, name: &str) -> Option<String> {
        if let Some(record) = self.snapshot(name) {
            return Some(format!(
                "Tessera snapshot {} of volume {} (read-only)",
                record.name, record.volume
            ));
        }
        let volume = VolumeId::new(name).ok()?;
        let record = self.view.volumes.read().get(&volume).cloned()?;
        Some(format!("Tessera volume {name} (policy {})", record.policy))
    }

    fn refusal(&self, name: &str) -> Option<String> {
        let volume = VolumeId::new(name).ok()?;
        let record = self.view.volumes.read().get(&volume).cloned()?;
        crate::host::fill_refusal(&record)
    }

    fn admits(&self, name: &str, client: &tessera_nbd::NbdClient) -> Result<(), String> {
        // A snapshot's export admits whom its volume admits.
        let volume = name
            .split_once(crate::snapshot_export::SNAPSHOT_SEPARATOR)
            .map_or(name, |(volume, _)| volume);
        let record = VolumeId::new(volume)
            .ok()
            .and_then(|id| self.view.iscsi_access.read().get(&id).cloned());
        crate::volume_access::nbd_admission(volume, record.as_ref(), client)
    }
}

enum Route {
    Local(Arc<Coordinator>),
    Remote(HostId, std::net::SocketAddr),
}

/// A volume as one host serves it.
pub struct VolumeHandle {
    host: HostId,
    volume: VolumeId,
    info: DeviceInfo,
    /// Counts the client holding this handle among the volume's users.
    _attached: Option<AttachGuard>,
    owned: Owned,
    view: Arc<VolumeView>,
    peers: Arc<Peers>,
    transport: Arc<Transport>,
}

impl VolumeHandle {
    /// Set when the volume this handle serves was deleted (or deleted and
    /// created again under its name): its clients get an error at once
    /// instead of waiting for an owner that will never come. Checked before
    /// every attempt, not only when no owner answers, so that a handle of a
    /// deleted volume never writes into a new volume of the same name.
    fn gone(&self) -> Option<BlockError> {
        let view = self.view.volumes.read();
        let current = view
            .get(&self.volume)
            .filter(|r| r.state == tessera_directory::keys::VolumeState::Ready);
        match current {
            Some(r) if crate::host::serial_of(r) == self.info.serial => None,
            _ => Some(BlockError::Unavailable {
                reason: format!("volume {} was deleted", self.volume),
            }),
        }
    }

    fn route_now(&self) -> Option<Route> {
        if let Some(c) = self.owned.read().get(&self.volume) {
            if c.superseded().is_none() {
                return Some(Route::Local(Arc::clone(c)));
            }
        }
        let owner = self.view.owners.read().get(&self.volume).cloned()?;
        if owner.host == self.host {
            return None;
        }
        let addr = self.peers.transport_addr(&owner.host)?;
        self.peers
            .is_live(&owner.host)
            .then_some(Route::Remote(owner.host, addr))
    }

    /// Runs `op` on the owner's coordinator: a direct call when this host
    /// owns the volume, a wire request to the owner's host otherwise;
    /// retried while ownership moves. `idempotent` operations are also
    /// retried after a lost answer.
    async fn run(&self, op: VolumeOp, idempotent: bool) -> Result<Answer, BlockError> {
        let deadline = tokio::time::Instant::now() + ROUTE_WAIT;
        let mut last = String::from("no owner");
        loop {
            if let Some(gone) = self.gone() {
                return Err(gone);
            }
            match self.route_now() {
                Some(Route::Local(c)) => {
                    let result = op.clone().run_on(&c).await;
                    let moved = || {
                        c.superseded().is_some()
                            || !self
                                .owned
                                .read()
                                .get(&self.volume)
                                .is_some_and(|o| Arc::ptr_eq(o, &c))
                    };
                    match result {
                        // The owner stepped down under the request: the
                        // next owner serves it.
                        Err(BlockError::Unavailable { reason }) if idempotent && moved() => {
                            last = reason;
                        }
                        result => return result,
                    }
                }
                Some(Route::Remote(host, addr)) => {
                    match self
                        .transport
                        .call(&host, addr, QueueClass::Guest, op.request(&self.volume))
                        .await
                    {
                        Ok(Response::Error {
                            kind: WireErrorKind::NotOwner,
                            message,
                        }) => last = message,
                        // The owner is stepping down or lost quorum for a
                        // moment: a new owner may serve it shortly.
                        Ok(Response::Error {
                            kind: WireErrorKind::Unavailable,
                            message,
                        }) if idempotent => last = message,
                        Ok(response) => return Answer::from_response(response),
                        Err(e) if idempotent => last = e.to_string(),
                        Err(e) => {
                            return Err(BlockError::OutcomeUnknown {
                                offset: op.offset(),
                                reason: format!("volume {} on host {host}: {e}", self.volume),
                            })
                        }
                    }
                }
                None => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(BlockError::Unavailable {
                    reason: format!(
                        "volume {} has no reachable owner after {}s: {last}",
                        self.volume,
                        ROUTE_WAIT.as_secs()
                    ),
                });
            }
            tokio::time::sleep(ROUTE_RETRY).await;
        }
    }
}

impl VolumeHandle {
    /// Has the owner rewrite `blocks` blocks of copy `component` at `lba`
    /// from another copy of its column: the scrubber of the copy's host
    /// found them bad. Safe to repeat.
    pub async fn repair_copy(
        &self,
        component: ComponentId,
        lba: Lba,
        blocks: u32,
    ) -> Result<(), BlockError> {
        self.run(
            VolumeOp::RepairCopy {
                component,
                lba,
                blocks,
            },
            true,
        )
        .await?
        .done()
    }

    /// Has the owner take snapshot number `id`, named `name`, of the volume
    /// on every copy and record it. Not repeated on a lost answer: the
    /// caller looks for the record instead.
    pub async fn snapshot(
        &self,
        name: &tessera_directory::keys::SnapshotName,
        id: u64,
        created_ms: u64,
    ) -> Result<(), BlockError> {
        self.run(
            VolumeOp::Snapshot {
                name: name.to_string(),
                id,
                created_ms,
            },
            false,
        )
        .await?
        .done()
    }

    /// Has the owner hold every write to the volume under `hold` for at
    /// most `ttl` (see [`Coordinator::hold_writes`]). Safe to repeat.
    pub async fn hold_writes(&self, hold: u64, ttl: Duration) -> Result<(), BlockError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.run(VolumeOp::HoldWrites { hold, ttl_ms }, true)
            .await?
            .done()
    }

    /// Has the owner end hold `hold`. Safe to repeat.
    pub async fn release_writes(&self, hold: u64) -> Result<(), BlockError> {
        self.run(VolumeOp::ReleaseWrites { hold }, true)
            .await?
            .done()
    }

    /// [`VolumeHandle::snapshot`] under hold `hold`.
    pub async fn snapshot_held(
        &self,
        hold: u64,
        name: &tessera_directory::keys::SnapshotName,
        id: u64,
        created_ms: u64,
    ) -> Result<(), BlockError> {
        self.run(
            VolumeOp::SnapshotHeld {
                hold,
                name: name.to_string(),
                id,
                created_ms,
            },
            false,
        )
        .await?
        .done()
    }

    /// The coordinators of `source` and of this volume, when `source` is a
    /// volume of the same datastore (a handle of this host) and this host
    /// owns both.
    fn local_pair(&self, source: &dyn BlockDevice) -> Option<(Arc<Coordinator>, Arc<Coordinator>)> {
        let source = source.as_any().downcast_ref::<VolumeHandle>()?;
        if !Arc::ptr_eq(&source.owned, &self.owned) {
            return None;
        }
        let owned = self.owned.read();
        let usable = |volume: &VolumeId| {
            owned
                .get(volume)
                .filter(|c| c.superseded().is_none())
                .cloned()
        };
        Some((usable(&source.volume)?, usable(&self.volume)?))
    }
}

#[async_trait]
impl BlockDevice for VolumeHandle {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    async fn read(&self, offset: u64, len: u64) -> Result<Bytes, BlockError> {
        tessera_blockdev::check_range(&self.info, "read", offset, len)?;
        if len <= FORWARD_BYTES_MAX {
            return self
                .run(
                    VolumeOp::Read {
                        offset,
                        len: len as u32,
                    },
                    true,
                )
                .await?
                .data(len);
        }
        let mut out = bytes::BytesMut::with_capacity(len as usize);
        let mut done = 0;
        while done < len {
            let step = (len - done).min(FORWARD_BYTES_MAX);
            let op = VolumeOp::Read {
                offset: offset + done,
                len: step as u32,
            };
            out.extend_from_slice(&self.run(op, true).await?.data(step)?);
            done += step;
        }
        Ok(out.freeze())
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<(), BlockError> {
        tessera_blockdev::check_range(&self.info, "write", offset, data.len() as u64)?;
        let len = data.len() as u64;
        let mut done = 0;
        while done < len {
            let step = (len - done).min(FORWARD_BYTES_MAX);
            let op = VolumeOp::Write {
                offset: offset + done,
                data: data.slice(done as usize..(done + step) as usize),
                fua: flags.fua,
            };
            self.run(op, true).await?.done()?;
            done += step;
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), BlockError> {
        self.run(VolumeOp::Flush, true).await?.done()
    }

    async fn unmap(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        tessera_blockdev::check_range(&self.info, "unmap", offset, len)?;
        self.run(VolumeOp::Unmap { offset, len }, true)
            .await?
            .done()
    }

    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<(), BlockError> {
        tessera_blockdev::check_range(&self.info, "write zeroes", offset, len)?;
        let op = VolumeOp::WriteZeroes { offset, len, mode };
        self.run(op, true).await?.done()
    }

    async fn compare_and_write(
        &self,
        offset: u64,
        expected: Bytes,
        new: Bytes,
    ) -> Result<(), BlockError> {
        tessera_blockdev::check_range(&self.info, "compare and write", offset, new.len() as u64)?;
        let op = VolumeOp::CompareAndWrite {
            offset,
            expected,
            new,
        };
        // Not retried after a lost answer: the first attempt may have
        // written, and a second would then miscompare.
        self.run(op, false).await?.done()
    }

    /// EXTENDED COPY. When `source` is a volume of this datastore and this
    /// host owns both volumes, the owner's coordinator shares the stored
    /// blocks where the two layouts allow it (moving no data) and copies the
    /// rest; otherwise, or when ownership moved during the copy, the data
    /// is copied through the owners.
    async fn copy_from(
        &self,
        source: &dyn BlockDevice,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), BlockError> {
        tessera_blockdev::check_range(&source.info(), "copy (source)", src_offset, len)?;
        tessera_blockdev::check_range(&self.info, "copy (destination)", dst_offset, len)?;
        if let Some((from, to)) = self.local_pair(source) {
            match to.copy_shared(&from, src_offset, dst_offset, len).await {
                Ok(_) => return Ok(()),
                // Ownership moved or a copy failed mid-way: the data copy
                // below goes to whichever host owns the volumes now.
                Err(
                    e @ (BlockError::Unavailable { .. }
                    | BlockError::Io { .. }
                    | BlockError::OutcomeUnknown { .. }),
                ) => {
                    tracing::warn!(volume = %self.volume, error = %e, "copy by sharing blocks failed; copying the data");
                }
                Err(e) => return Err(e),
            }
        }
        copy_by_data(source, self, src_offset, dst_offset, len).await
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, BlockError> {
        tessera_blockdev::check_range(&self.info, "block status", offset, len)?;
        match self
            .run(VolumeOp::BlockStatus { offset, len }, true)
            .await?
        {
            Answer::Extents(extents) => Ok(extents),
            other => Err(other.unexpected()),
        }
    }

    fn space(&self) -> SpaceUsage {
        match self.owned.read().get(&self.volume) {
            Some(c) => c.space(),
            None => SpaceUsage::default(),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One volume operation, typed: called on the owner's coordinator when
/// this host owns the volume, encoded as a wire request only when it goes
/// to another host.
#[derive(Clone)]
enum VolumeOp {
    Read {
        offset: u64,
        len: u32,
    },
    Write {
        offset: u64,
        data: Bytes,
        fua: bool,
    },
    Flush,
    Unmap {
        offset: u64,
        len: u64,
    },
    WriteZeroes {
        offset: u64,
        len: u64,
        mode: ZeroMode,
    },
    CompareAndWrite {
        offset: u64,
        expected: Bytes,
        new: Bytes,
    },
    BlockStatus {
        offset: u64,
        len: u64,
    },
    /// Rewrite bad blocks of one copy from another (found by a scrub).
    RepairCopy {
        component: ComponentId,
        lba: Lba,
        blocks: u32,
    },
    /// Take and record a snapshot of the volume.
    Snapshot {
        name: String,
        id: u64,
        created_ms: u64,
    },
    /// Hold every write to the volume (a consistency group's snapshot).
    HoldWrites {
        hold: u64,
        ttl_ms: u64,
    },
    /// End a hold.
    ReleaseWrites {
        hold: u64,
    },
    /// Take and record a snapshot under a hold.
    SnapshotHeld {
        hold: u64,
        name: String,
        id: u64,
        created_ms: u64,
    },
}

/// What a volume operation answers.
enum Answer {
    Done,
    Data(Bytes),
    Extents(Vec<Extent>),
}

impl Answer {
    fn done(self) -> Result<(), BlockError> {
        match self {
            Answer::Done => Ok(()),
            other => Err(other.unexpected()),
        }
    }

    fn data(self, len: u64) -> Result<Bytes, BlockError> {
        match self {
            Answer::Data(d) if d.len() as u64 == len => Ok(d),
            other => Err(other.unexpected()),
        }
    }

    fn unexpected(&self) -> BlockError {
        let what = match self {
            Answer::Done => "no data".to_string(),
            Answer::Data(d) => format!("{} bytes", d.len()),
            Answer::Extents(e) => format!("{} extents", e.len()),
        };
        BlockError::Io {
            offset: 0,
            detail: format!("the owner answered with {what}, which this request does not expect"),
        }
    }

    /// The answer a forwarded request's wire response stands for.
    fn from_response(response: Response) -> Result<Answer, BlockError> {
        match response {
            Response::Ok => Ok(Answer::Done),
            Response::Data(d) => Ok(Answer::Data(d)),
            Response::Extents(extents) => Ok(Answer::Extents(
                extents.into_iter().map(from_wire_extent).collect(),
            )),
            other => Err(response_error(other)),
        }
    }

    fn into_response(self) -> Response {
        match self {
            Answer::Done => Response::Ok,
            Answer::Data(d) => Response::Data(d),
            Answer::Extents(extents) => {
                Response::Extents(extents.into_iter().map(to_wire_extent).collect())
            }
        }
    }
}

impl VolumeOp {
    /// The first byte the operation touches (for errors).
    fn offset(&self) -> u64 {
        match self {
            VolumeOp::Read { offset, .. }
            | VolumeOp::Write { offset, .. }
            | VolumeOp::Unmap { offset, .. }
            | VolumeOp::WriteZeroes { offset, .. }
            | VolumeOp::CompareAndWrite { offset, .. }
            | VolumeOp::BlockStatus { offset, .. } => *offset,
            VolumeOp::Flush
            | VolumeOp::RepairCopy { .. }
            | VolumeOp::Snapshot { .. }
            | VolumeOp::HoldWrites { .. }
            | VolumeOp::ReleaseWrites { .. }
            | VolumeOp::SnapshotHeld { .. } => 0,
        }
    }

    /// Bytes of data the operation moves, as the owner's I/O scheduler
    /// counts them; None for operations it does not schedule (metadata,
    /// flushes, and repairs the scrubber asks for).
    fn scheduled_bytes(&self) -> Option<u64> {
        match self {
            VolumeOp::Read { len, .. } => Some(u64::from(*len)),
            VolumeOp::Write { data, .. } => Some(data.len() as u64),
            VolumeOp::CompareAndWrite { new, .. } => Some(new.len() as u64),
            VolumeOp::WriteZeroes { len, mode, .. } => Some(if *mode == ZeroMode::KeepAllocated {
                *len
            } else {
                0
            }),
            VolumeOp::Unmap { .. } => Some(0),
            VolumeOp::Flush
            | VolumeOp::BlockStatus { .. }
            | VolumeOp::RepairCopy { .. }
            | VolumeOp::Snapshot { .. }
            | VolumeOp::HoldWrites { .. }
            | VolumeOp::ReleaseWrites { .. }
            | VolumeOp::SnapshotHeld { .. } => None,
        }
    }

    /// The kind a client's operation is counted as in the volume's I/O
    /// statistics, with the bytes it moves; None for what the cluster
    /// itself asks (metadata, repairs, snapshots).
    fn counted(&self) -> Option<(IoKind, u64)> {
        match self {
            VolumeOp::Read { len, .. } => Some((IoKind::Read, u64::from(*len))),
            VolumeOp::Write { data, .. } => Some((IoKind::Write, data.len() as u64)),
            VolumeOp::Flush => Some((IoKind::Flush, 0)),
            VolumeOp::Unmap { len, .. } => Some((IoKind::Unmap, *len)),
            VolumeOp::WriteZeroes { len, .. } => Some((IoKind::WriteZeroes, *len)),
            VolumeOp::CompareAndWrite { new, .. } => {
                Some((IoKind::CompareAndWrite, new.len() as u64))
            }
            VolumeOp::BlockStatus { .. }
            | VolumeOp::RepairCopy { .. }
            | VolumeOp::Snapshot { .. }
            | VolumeOp::HoldWrites { .. }
            | VolumeOp::ReleaseWrites { .. }
            | VolumeOp::SnapshotHeld { .. } => None,
        }
    }

    /// Runs the operation on the owner's coordinator and counts a client's
    /// in the volume's I/O statistics, its latency measured from its
    /// arrival at the owner (a wait for its turn included).
    async fn run_on(self, c: &Arc<Coordinator>) -> Result<Answer, BlockError> {
        let Some((kind, bytes)) = self.counted() else {
            return self.run_scheduled(c).await;
        };
        let began = c.monotonic();
        let result = self.run_scheduled(c).await;
        let took = c.monotonic().saturating_sub(began);
        c.counters().io.record(kind, bytes, took, result.is_ok());
        result
    }

    /// Runs the operation on the owner's coordinator once the volume's
    /// turn in the host's I/O scheduler comes (its QoS acts here).
    async fn run_scheduled(self, c: &Arc<Coordinator>) -> Result<Answer, BlockError> {
        let _turn = match self.scheduled_bytes() {
            Some(bytes) => Some(c.guest_turn(bytes).await),
            None => None,
        };
        match self {
            VolumeOp::Read { offset, len } => c.read(offset, len as u64).await.map(Answer::Data),
            VolumeOp::Write { offset, data, fua } => c
                .write(offset, data, WriteFlags { fua })
                .await
                .map(|_| Answer::Done),
            VolumeOp::Flush => c.flush().await.map(|_| Answer::Done),
            VolumeOp::Unmap { offset, len } => c.unmap(offset, len).await.map(|_| Answer::Done),
            VolumeOp::WriteZeroes { offset, len, mode } => c
                .write_zeroes(offset, len, mode)
                .await
                .map(|_| Answer::Done),
            VolumeOp::CompareAndWrite {
                offset,
                expected,
                new,
            } => c
                .compare_and_write(offset, expected, new)
                .await
                .map(|_| Answer::Done),
            VolumeOp::BlockStatus { offset, len } => {
                c.block_status(offset, len).await.map(Answer::Extents)
            }
            VolumeOp::RepairCopy {
                component,
                lba,
                blocks,
            } => c
                .repair_copy(component, lba, blocks as u64)
                .await
                .map(|_| Answer::Done),
            VolumeOp::Snapshot {
                name,
                id,
                created_ms,
            } => c
                .snapshot(&name, id, created_ms)
                .await
                .map(|_| Answer::Done),
            VolumeOp::HoldWrites { hold, ttl_ms } => c
                .hold_writes(hold, Duration::from_millis(ttl_ms))
                .await
                .map(|_| Answer::Done),
            VolumeOp::ReleaseWrites { hold } => {
                c.release_writes(hold);
                Ok(Answer::Done)
            }
            VolumeOp::SnapshotHeld {
                hold,
                name,
                id,
                created_ms,
            } => c
                .snapshot_held(hold, &name, id, created_ms)
                .await
                .map(|_| Answer::Done),
        }
    }

    fn request(&self, volume: &VolumeId) -> Request {
        let volume = volume.clone();
        match self.clone() {
            VolumeOp::Read { offset, len } => Request::VolumeRead {
                volume,
                offset,
                len,
            },
            VolumeOp::Write { offset, data, fua } => Request::VolumeWrite {
                volume,
                offset,
                data,
                fua,
            },
            VolumeOp::Flush => Request::VolumeFlush { volume },
            VolumeOp::Unmap { offset, len } => Request::VolumeUnmap {
                volume,
                offset,
                len,
            },
            VolumeOp::WriteZeroes { offset, len, mode } => Request::VolumeWriteZeroes {
                volume,
                offset,
                len,
                may_unmap: mode == ZeroMode::MayUnmap,
            },
            VolumeOp::CompareAndWrite {
                offset,
                expected,
                new,
            } => Request::VolumeCompareAndWrite {
                volume,
                offset,
                expected,
                new,
            },
            VolumeOp::BlockStatus { offset, len } => Request::VolumeBlockStatus {
                volume,
                offset,
                len,
            },
            VolumeOp::RepairCopy {
                component,
                lba,
                blocks,
            } => Request::VolumeRepairCopy {
                volume,
                component,
                lba,
                blocks,
            },
            VolumeOp::Snapshot {
                name,
                id,
                created_ms,
            } => Request::VolumeSnapshot {
                volume,
                name,
                snapshot: id,
                created_ms,
            },
            VolumeOp::HoldWrites { hold, ttl_ms } => Request::VolumeHoldWrites {
                volume,
                hold,
                ttl_ms,
            },
            VolumeOp::ReleaseWrites { hold } => Request::VolumeReleaseWrites { volume, hold },
            VolumeOp::SnapshotHeld {
                hold,
                name,
                id,
                created_ms,
            } => Request::VolumeSnapshotHeld {
                volume,
                hold,
                name,
                snapshot: id,
                created_ms,
            },
        }
    }

    /// The operation a forwarded request carries; `None` for requests that
    /// are not volume operations.
    fn from_request(request: Request) -> Option<(VolumeId, VolumeOp)> {
        Some(match request {
            Request::VolumeRead {
                volume,
                offset,
                len,
            } => (volume, VolumeOp::Read { offset, len }),
            Request::VolumeWrite {
                volume,
                offset,
                data,
                fua,
            } => (volume, VolumeOp::Write { offset, data, fua }),
            Request::VolumeFlush { volume } => (volume, VolumeOp::Flush),
            Request::VolumeUnmap {
                volume,
                offset,
                len,
            } => (volume, VolumeOp::Unmap { offset, len }),
            Request::VolumeWriteZeroes {
                volume,
                offset,
                len,
                may_unmap,
            } => {
                let mode = if may_unmap {
                    ZeroMode::MayUnmap
                } else {
                    ZeroMode::KeepAllocated
                };
                (volume, VolumeOp::WriteZeroes { offset, len, mode })
            }
            Request::VolumeCompareAndWrite {
                volume,
                offset,
                expected,
                new,
            } => (
                volume,
                VolumeOp::CompareAndWrite {
                    offset,
                    expected,
                    new,
                },
            ),
            Request::VolumeBlockStatus {
                volume,
                offset,
                len,
            } => (volume, VolumeOp::BlockStatus { offset, len }),
            Request::VolumeRepairCopy {
                volume,
                component,
                lba,
                blocks,
            } => (
                volume,
                VolumeOp::RepairCopy {
                    component,
                    lba,
                    blocks,
                },
            ),
            Request::VolumeSnapshot {
                volume,
                name,
                snapshot,
                created_ms,
            } => (
                volume,
                VolumeOp::Snapshot {
                    name,
                    id: snapshot,
                    created_ms,
                },
            ),
            Request::VolumeHoldWrites {
                volume,
                hold,
                ttl_ms,
            } => (volume, VolumeOp::HoldWrites { hold, ttl_ms }),
            Request::VolumeReleaseWrites { volume, hold } => {
                (volume, VolumeOp::ReleaseWrites { hold })
            }
            Request::VolumeSnapshotHeld {
                volume,
                hold,
                name,
                snapshot,
                created_ms,
            } => (
                volume,
                VolumeOp::SnapshotHeld {
                    hold,
                    name,
                    id: snapshot,
                    created_ms,
                },
            ),
            _ => return None,
        })
    }
}

/// Serves a volume request forwarded by another host on this host's
/// coordinator of the volume: the same typed operation a local client's
/// request runs.
pub async fn execute(coordinator: &Arc<Coordinator>, request: Request) -> Response {
    let kind = request.kind();
    let Some((volume, op)) = VolumeOp::from_request(request) else {
        return Response::error(
            WireErrorKind::Invalid,
            format!("{} is not a volume operation", kind.name()),
        );
    };
    match op.run_on(coordinator).await {
        Ok(answer) => answer.into_response(),
        Err(e) => block_error_response(&volume, e),
    }
}

fn to_wire_extent(e: Extent) -> tessera_wire::Extent {
    tessera_wire::Extent {
        offset: e.offset,
        len: e.len,
        kind: match e.kind {
            ExtentKind::Data => tessera_wire::ExtentKind::Data,
            ExtentKind::Zero => tessera_wire::ExtentKind::Zero,
            ExtentKind::Hole => tessera_wire::ExtentKind::Hole,
        },
    }
}

fn from_wire_extent(e: tessera_wire::Extent) -> Extent {
    Extent {
        offset: e.offset,
        len: e.len,
        kind: match e.kind {
            tessera_wire::ExtentKind::Data => ExtentKind::Data,
            tessera_wire::ExtentKind::Zero => ExtentKind::Zero,
            tessera_wire::ExtentKind::Hole => ExtentKind::Hole,
        },
    }
}

/// The wire answer for a failed volume operation on the owner.
fn block_error_response(volume: &VolumeId, e: BlockError) -> Response {
    let kind = match &e {
        BlockError::OutOfRange { .. } => WireErrorKind::OutOfRange,
        BlockError::NoSpace { .. } => WireErrorKind::NoSpace,
        BlockError::ReadOnly => WireErrorKind::ReadOnly,
        BlockError::Checksum { offset } => WireErrorKind::Checksum {
            lba: tessera_types::Lba(offset / tessera_types::BLOCK_BYTES),
        },
        BlockError::Miscompare { offset } => WireErrorKind::Miscompare { offset: *offset },
        BlockError::Io { .. } | BlockError::OutcomeUnknown { .. } => WireErrorKind::Io,
        BlockError::Unavailable { .. } => WireErrorKind::Unavailable,
        BlockError::Invalid { .. } => WireErrorKind::Invalid,
    };
    Response::error(kind, format!("volume {volume}: {e}"))
}

/// The `BlockError` a forwarded request's wire answer stands for.
fn response_error(response: Response) -> BlockError {
    match response {
        Response::Error { kind, message } => match kind {
            WireErrorKind::OutOfRange => BlockError::Invalid { reason: message },
            WireErrorKind::NoSpace => BlockError::NoSpace { offset: 0, len: 0 },
            WireErrorKind::ReadOnly => BlockError::ReadOnly,
            WireErrorKind::Checksum { lba } => BlockError::Checksum {
                offset: lba.byte_offset(),
            },
            WireErrorKind::Miscompare { offset } => BlockError::Miscompare { offset },
            WireErrorKind::Unavailable | WireErrorKind::NotOwner => {
                BlockError::Unavailable { reason: message }
            }
            WireErrorKind::Invalid => BlockError::Invalid { reason: message },
            _ => BlockError::Io {
                offset: 0,
                detail: message,
            },
        },
        other => BlockError::Io {
            offset: 0,
            detail: format!("unexpected answer {:?}", other.kind()),
        },
    }
}
