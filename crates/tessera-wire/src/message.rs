//! The messages hosts exchange.
//!
//! Owns: [`Request`] (what a host asks a peer), [`Response`] (the answer) and
//! the error kinds a peer reports. Every request gets exactly one response
//! carrying the same request id; the transport matches them.
//!
//! Must not touch: encoding (see `codec`), semantics of the operations (the
//! replica service and the object coordinator own those). Messages carry
//! everything a user needs in an error: which component or volume, which
//! block, which epoch.

use std::fmt;

use bytes::Bytes;
use tessera_types::{ComponentId, Epoch, HostId, Lba, VolumeId};

use crate::{VersionRange, WireVersion};

/// Bytes an error message may hold; longer messages are cut at a character
/// boundary when encoded, so one noisy error cannot fill a frame.
pub const ERROR_MESSAGE_BYTES_MAX: usize = 4096;

/// Which queue a request travels in. Each class gets its own connection per
/// peer, so bulk resync traffic never waits in front of guest I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QueueClass {
    /// I/O a guest is waiting for, and control operations.
    Guest,
    /// Resync and rebuild copies.
    Resync,
}

impl QueueClass {
    /// Every class, for iterating over per-class state.
    pub const ALL: [QueueClass; 2] = [QueueClass::Guest, QueueClass::Resync];

    /// The number carried in frame headers.
    pub fn number(self) -> u8 {
        match self {
            QueueClass::Guest => 0,
            QueueClass::Resync => 1,
        }
    }

    /// The class with this number.
    pub fn from_number(number: u8) -> Result<QueueClass, crate::WireError> {
        match number {
            0 => Ok(QueueClass::Guest),
            1 => Ok(QueueClass::Resync),
            class => Err(crate::WireError::UnknownQueueClass { class }),
        }
    }
}

impl fmt::Display for QueueClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QueueClass::Guest => "guest",
            QueueClass::Resync => "resync",
        })
    }
}

/// A component as peers name it: component numbers are unique only within
/// their object, so the volume travels with them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ComponentRef {
    /// The object the component belongs to.
    pub volume: VolumeId,
    /// The component's number within that object.
    pub id: ComponentId,
}

impl fmt::Display for ComponentRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "component {} of volume {}", self.id, self.volume)
    }
}

/// Allocation state of a range of a volume, as BLOCK_STATUS reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExtentKind {
    /// Allocated and holding data.
    Data,
    /// Allocated, known to read as zeros.
    Zero,
    /// Not allocated: reads as zeros, occupies no space.
    Hole,
}

/// A run of bytes of a volume with one allocation state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Extent {
    /// First byte.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Its state.
    pub kind: ExtentKind,
}

/// What a host asks a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// First message on every connection: the versions the caller speaks and
    /// who it is. Answered by [`Response::HelloOk`] or by
    /// [`WireErrorKind::NoCommonVersion`].
    Hello {
        /// Versions the caller speaks.
        versions: VersionRange,
        /// The calling host.
        host: HostId,
    },
    /// Liveness probe, answered by [`Response::Pong`].
    Ping,

    /// Create an empty component of `size_bytes`, reserving `reserve_bytes`
    /// of space up front (the policy's object space reservation).
    CreateComponent {
        /// The component.
        component: ComponentRef,
        /// Its address space in bytes.
        size_bytes: u64,
        /// Bytes to reserve now.
        reserve_bytes: u64,
    },
    /// Delete a component and free its space.
    DeleteComponent {
        /// The component.
        component: ComponentRef,
    },
    /// Grow or shrink a component's address space.
    ResizeComponent {
        /// The component.
        component: ComponentRef,
        /// New size in bytes.
        size_bytes: u64,
    },
    /// Write whole blocks at `lba`, on behalf of the owner at `epoch`.
    /// Acknowledged (by [`Response::Ok`]) only once durable.
    Write {
        /// The component.
        component: ComponentRef,
        /// First block.
        lba: Lba,
        /// The writer's owner epoch; lower than the highest seen is refused.
        epoch: Epoch,
        /// Whole blocks of data.
        data: Bytes,
    },
    /// Read `blocks` blocks at `lba`, answered by [`Response::Data`].
    Read {
        /// The component.
        component: ComponentRef,
        /// First block.
        lba: Lba,
        /// Number of blocks.
        blocks: u32,
    },
    /// Deallocate blocks; they read as zeros afterwards.
    Unmap {
        /// The component.
        component: ComponentRef,
        /// First block.
        lba: Lba,
        /// Number of blocks.
        blocks: u64,
        /// The writer's owner epoch.
        epoch: Epoch,
    },
    /// Make blocks read as zeros (the store may deallocate them).
    WriteZeroes {
        /// The component.
        component: ComponentRef,
        /// First block.
        lba: Lba,
        /// Number of blocks.
        blocks: u64,
        /// The writer's owner epoch.
        epoch: Epoch,
    },
    /// Make every acknowledged write durable.
    Flush {
        /// The component.
        component: ComponentRef,
    },
    /// Raise the component's highest epoch to `epoch`, so that writes from
    /// older owners are refused from now on.
    Fence {
        /// The component.
        component: ComponentRef,
        /// The new owner's epoch.
        epoch: Epoch,
    },
    /// Allocated block ranges within `blocks` blocks from `from`, answered by
    /// [`Response::Ranges`]; resync reads only these.
    Allocated {
        /// The component.
        component: ComponentRef,
        /// First block of the query.
        from: Lba,
        /// Blocks in the query.
        blocks: u64,
    },
    /// Block ranges within `blocks` blocks from `from` where `component`
    /// may hold other data than `base`, a component of the same disk group
    /// (a snapshot taken earlier), answered by [`Response::Ranges`]; never
    /// leaves out a block that differs. A rebuild sends a new copy only
    /// these. Since wire v5.
    Changed {
        /// The component (the later one).
        component: ComponentRef,
        /// The component it is compared with, of the same volume.
        base: ComponentId,
        /// First block of the query.
        from: Lba,
        /// Blocks in the query.
        blocks: u64,
    },
    /// Size, epoch and space of a component, answered by [`Response::Status`].
    ComponentStatus {
        /// The component.
        component: ComponentRef,
    },
    /// The bytes a component holds alone and shares with others (a
    /// snapshot's cost), answered by [`Response::Held`]; counted from its
    /// index pages. Since wire v5.
    HeldSpace {
        /// The component.
        component: ComponentRef,
    },
    /// Make `blocks` blocks of `target` from `target_lba` hold what `blocks`
    /// blocks of `source` from `source_lba` hold, by sharing the stored
    /// blocks (no data moves; holes stay holes), on behalf of the target's
    /// owner at `epoch`. Both components live on the answering host, on one
    /// disk group; otherwise the answer is [`WireErrorKind::NotColocated`]
    /// and the caller copies the data instead. Acknowledged (by
    /// [`Response::Ok`]) only once durable. Since wire v2.
    CloneBlocks {
        /// The component whose blocks are shared (of any volume).
        source: ComponentRef,
        /// First source block.
        source_lba: Lba,
        /// The component that receives them.
        target: ComponentRef,
        /// First target block.
        target_lba: Lba,
        /// Number of blocks.
        blocks: u64,
        /// The target owner's epoch; lower than the highest the target has
        /// seen is refused.
        epoch: Epoch,
    },
    /// Take a snapshot of `component`: make `snapshot` a new read-only
    /// component of the same volume, on the same disk group of the
    /// answering host, that holds what `component` holds now, sharing its
    /// stored blocks (nothing is copied), on behalf of the owner at
    /// `epoch`. Taking the same snapshot again succeeds and changes
    /// nothing. Acknowledged (by [`Response::Ok`]) only once durable; a
    /// later write to the snapshot is answered [`WireErrorKind::Invalid`].
    /// Since wire v4.
    SnapshotComponent {
        /// The component whose contents the snapshot holds.
        component: ComponentRef,
        /// The new snapshot's number within the component's volume.
        snapshot: ComponentId,
        /// The owner's epoch; lower than the highest `component` has seen
        /// is refused.
        epoch: Epoch,
    },
    /// Make `clone` a new writable component of the snapshot's volume, on
    /// the snapshot's disk group of the answering host, that holds what the
    /// snapshot `snapshot` holds, sharing its stored blocks until either
    /// changes them (a linked clone), on behalf of the owner at `epoch`.
    /// Making the same clone again succeeds and changes nothing.
    /// Acknowledged (by [`Response::Ok`]) only once durable. Since wire v4.
    CloneSnapshot {
        /// The snapshot the clone starts as.
        snapshot: ComponentRef,
        /// The new clone's number within the snapshot's volume.
        clone: ComponentId,
        /// The owner's epoch, the lowest the clone accepts.
        epoch: Epoch,
    },

    /// Read from a volume through its owner, answered by [`Response::Data`].
    VolumeRead {
        /// The volume.
        volume: VolumeId,
        /// First byte.
        offset: u64,
        /// Bytes to read.
        len: u32,
    },
    /// Write to a volume through its owner.
    VolumeWrite {
        /// The volume.
        volume: VolumeId,
        /// First byte.
        offset: u64,
        /// The data.
        data: Bytes,
        /// Force unit access: durable before the answer.
        fua: bool,
    },
    /// Flush a volume through its owner.
    VolumeFlush {
        /// The volume.
        volume: VolumeId,
    },
    /// Unmap a byte range of a volume through its owner.
    VolumeUnmap {
        /// The volume.
        volume: VolumeId,
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Zero a byte range of a volume through its owner.
    VolumeWriteZeroes {
        /// The volume.
        volume: VolumeId,
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Whether the range may become unallocated.
        may_unmap: bool,
    },
    /// COMPARE AND WRITE through the owner: write `new` only if the range
    /// holds `expected`; otherwise [`WireErrorKind::Miscompare`].
    VolumeCompareAndWrite {
        /// The volume.
        volume: VolumeId,
        /// First byte.
        offset: u64,
        /// Data the range must hold.
        expected: Bytes,
        /// Data to write.
        new: Bytes,
    },
    /// Allocation map of a byte range, answered by [`Response::Extents`].
    VolumeBlockStatus {
        /// The volume.
        volume: VolumeId,
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Rewrite blocks of one copy from another copy of its column (the
    /// scrubber of the copy's host found them bad), under the owner's range
    /// lock; answered by [`Response::Ok`].
    VolumeRepairCopy {
        /// The volume.
        volume: VolumeId,
        /// The copy whose blocks are bad.
        component: ComponentId,
        /// First block, in the copy's address space.
        lba: Lba,
        /// Blocks.
        blocks: u32,
    },
    /// Take a snapshot of the volume on every copy, between two of its
    /// writes, and record it under the owner's epoch; answered by
    /// [`Response::Ok`] once recorded. Since wire v4.
    VolumeSnapshot {
        /// The volume.
        volume: VolumeId,
        /// The snapshot's name (checked by the owner).
        name: String,
        /// The snapshot's number: its components' ids are made from it.
        snapshot: u64,
        /// When it is taken (ms since the Unix epoch), as the requester
        /// asked it.
        created_ms: u64,
    },
    /// Hold every write to the volume (those under way finish first) until
    /// [`Request::VolumeReleaseWrites`] with the same `hold` or until
    /// `ttl_ms` pass; answered by [`Response::Ok`] once held. Since wire v5.
    VolumeHoldWrites {
        /// The volume.
        volume: VolumeId,
        /// Names the hold.
        hold: u64,
        /// How long it lasts at most.
        ttl_ms: u64,
    },
    /// End the hold `hold` (nothing if it is gone); answered by
    /// [`Response::Ok`]. Since wire v5.
    VolumeReleaseWrites {
        /// The volume.
        volume: VolumeId,
        /// The hold.
        hold: u64,
    },
    /// [`Request::VolumeSnapshot`] while the volume's writes are held by
    /// `hold`, which stays; refused if the hold is gone. Since wire v5.
    VolumeSnapshotHeld {
        /// The volume.
        volume: VolumeId,
        /// The hold it is taken under.
        hold: u64,
        /// The snapshot's name (checked by the owner).
        name: String,
        /// The snapshot's number.
        snapshot: u64,
        /// When it is taken (ms since the Unix epoch).
        created_ms: u64,
    },
}

/// The answer to a [`Request`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// The handshake succeeded: `version` is what both ends speak from now on.
    HelloOk {
        /// The negotiated version.
        version: WireVersion,
        /// The answering host.
        host: HostId,
    },
    /// Answer to [`Request::Ping`].
    Pong,
    /// Done, nothing to return.
    Ok,
    /// Data read.
    Data(Bytes),
    /// Allocated block ranges: (first block, number of blocks).
    Ranges(Vec<(Lba, u64)>),
    /// Allocation map of a volume range.
    Extents(Vec<Extent>),
    /// State of a component.
    Status {
        /// Address space in bytes.
        size_bytes: u64,
        /// Highest owner epoch seen.
        epoch: Epoch,
        /// Bytes of address space allocated.
        allocated_bytes: u64,
        /// Bytes the component occupies on its devices.
        physical_bytes: u64,
    },
    /// Answer to [`Request::HeldSpace`].
    Held {
        /// Bytes of blocks only the component references: what deleting
        /// it gives back.
        alone_bytes: u64,
        /// Bytes of blocks it references with other components.
        shared_bytes: u64,
    },
    /// The request failed.
    Error {
        /// What kind of failure, for the caller's decisions.
        kind: WireErrorKind,
        /// What happened, for the user (component, LBA, host...).
        message: String,
    },
}

impl Response {
    /// An error response.
    pub fn error(kind: WireErrorKind, message: impl Into<String>) -> Response {
        Response::Error {
            kind,
            message: message.into(),
        }
    }
}

/// Why a peer refused or failed a request. The caller decides on the kind
/// (retry elsewhere, fence itself, report to the client); the message in
/// [`Response::Error`] is for people.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireErrorKind {
    /// The request's epoch is lower than the highest the component has seen:
    /// the caller is a stale owner.
    StaleEpoch {
        /// The highest epoch the component has seen.
        highest: Epoch,
    },
    /// A block failed its checksum.
    Checksum {
        /// The bad block.
        lba: Lba,
    },
    /// No space left for the write.
    NoSpace,
    /// The component or volume does not exist here.
    NotFound,
    /// The range reaches past the end.
    OutOfRange,
    /// COMPARE AND WRITE found different data.
    Miscompare {
        /// First differing byte, relative to the request's start.
        offset: u64,
    },
    /// A device error.
    Io,
    /// The component or volume cannot serve I/O now.
    Unavailable,
    /// This host does not own the volume (any more).
    NotOwner,
    /// The volume is read-only.
    ReadOnly,
    /// The request is malformed.
    Invalid,
    /// The handshake found no common wire version; carries the versions the
    /// answering host speaks.
    NoCommonVersion {
        /// The answering host's versions.
        supported: VersionRange,
    },
    /// The two components of a `CloneBlocks` do not live on one disk group
    /// of the answering host, so their blocks cannot be shared. Since wire
    /// v2, and only in answer to `CloneBlocks`.
    NotColocated,
}

impl fmt::Display for WireErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireErrorKind::StaleEpoch { highest } => {
                write!(f, "stale epoch (component has seen {highest})")
            }
            WireErrorKind::Checksum { lba } => write!(f, "checksum mismatch at {lba}"),
            WireErrorKind::NoSpace => f.write_str("no space"),
            WireErrorKind::NotFound => f.write_str("not found"),
            WireErrorKind::OutOfRange => f.write_str("out of range"),
            WireErrorKind::Miscompare { offset } => write!(f, "miscompare at byte {offset}"),
            WireErrorKind::Io => f.write_str("I/O error"),
            WireErrorKind::Unavailable => f.write_str("unavailable"),
            WireErrorKind::NotOwner => f.write_str("not the owner"),
            WireErrorKind::ReadOnly => f.write_str("read-only"),
            WireErrorKind::Invalid => f.write_str("invalid request"),
            WireErrorKind::NoCommonVersion { supported } => {
                write!(f, "no common wire version (peer speaks {supported})")
            }
            WireErrorKind::NotColocated => {
                f.write_str("components are not on one disk group of one host")
            }
        }
    }
}

/// A request or a response: what a frame carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// A request.
    Request(Request),
    /// A response.
    Response(Response),
}

/// The kind number in a frame header: which message the payload holds.
/// Requests are below 0x80, responses at or above.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
#[allow(missing_docs)] // each variant is named after the message it tags
pub enum MessageKind {
    Hello = 0x01,
    Ping = 0x02,
    CreateComponent = 0x10,
    DeleteComponent = 0x11,
    ResizeComponent = 0x12,
    Write = 0x13,
    Read = 0x14,
    Unmap = 0x15,
    WriteZeroes = 0x16,
    Flush = 0x17,
    Fence = 0x18,
    Allocated = 0x19,
    ComponentStatus = 0x1a,
    CloneBlocks = 0x1b,
    SnapshotComponent = 0x1c,
    CloneSnapshot = 0x1d,
    Changed = 0x1e,
    HeldSpace = 0x1f,
    VolumeRead = 0x30,
    VolumeWrite = 0x31,
    VolumeFlush = 0x32,
    VolumeUnmap = 0x33,
    VolumeWriteZeroes = 0x34,
    VolumeCompareAndWrite = 0x35,
    VolumeBlockStatus = 0x36,
    VolumeRepairCopy = 0x37,
    VolumeSnapshot = 0x38,
    VolumeHoldWrites = 0x39,
    VolumeReleaseWrites = 0x3a,
    VolumeSnapshotHeld = 0x3b,
    HelloOk = 0x81,
    Pong = 0x82,
    Ok = 0x90,
    Data = 0x91,
    Ranges = 0x92,
    Extents = 0x93,
    Status = 0x94,
    Held = 0x95,
    Error = 0xff,
}

impl MessageKind {
    const ALL: [MessageKind; 39] = [
        MessageKind::Hello,
        MessageKind::Ping,
        MessageKind::CreateComponent,
        MessageKind::DeleteComponent,
        MessageKind::ResizeComponent,
        MessageKind::Write,
        MessageKind::Read,
        MessageKind::Unmap,
        MessageKind::WriteZeroes,
        MessageKind::Flush,
        MessageKind::Fence,
        MessageKind::Allocated,
        MessageKind::ComponentStatus,
        MessageKind::CloneBlocks,
        MessageKind::SnapshotComponent,
        MessageKind::CloneSnapshot,
        MessageKind::Changed,
        MessageKind::HeldSpace,
        MessageKind::VolumeRead,
        MessageKind::VolumeWrite,
        MessageKind::VolumeFlush,
        MessageKind::VolumeUnmap,
        MessageKind::VolumeWriteZeroes,
        MessageKind::VolumeCompareAndWrite,
        MessageKind::VolumeBlockStatus,
        MessageKind::VolumeRepairCopy,
        MessageKind::VolumeSnapshot,
        MessageKind::VolumeHoldWrites,
        MessageKind::VolumeReleaseWrites,
        MessageKind::VolumeSnapshotHeld,
        MessageKind::HelloOk,
        MessageKind::Pong,
        MessageKind::Ok,
        MessageKind::Data,
        MessageKind::Ranges,
        MessageKind::Extents,
        MessageKind::Status,
        MessageKind::Held,
        MessageKind::Error,
    ];

    /// The number carried in frame headers.
    pub fn number(self) -> u16 {
        self as u16
    }

    /// The kind with this number.
    pub fn from_number(number: u16) -> Result<MessageKind, crate::WireError> {
        MessageKind::ALL
            .iter()
            .copied()
            .find(|k| k.number() == number)
            .ok_or(crate::WireError::UnknownKind { kind: number })
    }

    /// Whether frames of this kind are requests.
    pub fn is_request(self) -> bool {
        self.number() < 0x80
    }

    /// Whether the layout of this kind is frozen across all wire versions
    /// (the handshake must work between any two releases).
    pub fn is_handshake(self) -> bool {
        matches!(
            self,
            MessageKind::Hello | MessageKind::HelloOk | MessageKind::Error
        )
    }

    /// The first wire version that carries this kind: a frame of a newer
    /// kind is neither sent nor accepted on a connection that negotiated an
    /// older version, so an older peer is never sent what it cannot read.
    pub fn since(self) -> WireVersion {
        match self {
            MessageKind::CloneBlocks => WireVersion::V2,
            MessageKind::VolumeRepairCopy => WireVersion::V3,
            MessageKind::SnapshotComponent
            | MessageKind::CloneSnapshot
            | MessageKind::VolumeSnapshot => WireVersion::V4,
            MessageKind::Changed
            | MessageKind::HeldSpace
            | MessageKind::Held
            | MessageKind::VolumeHoldWrites
            | MessageKind::VolumeReleaseWrites
            | MessageKind::VolumeSnapshotHeld => WireVersion::V5,
            _ => WireVersion::V1,
        }
    }

    /// The message's name, for errors.
    pub fn name(self) -> &'static str {
        match self {
            MessageKind::Hello => "Hello",
            MessageKind::Ping => "Ping",
            MessageKind::CreateComponent => "CreateComponent",
            MessageKind::DeleteComponent => "DeleteComponent",
            MessageKind::ResizeComponent => "ResizeComponent",
            MessageKind::Write => "Write",
            MessageKind::Read => "Read",
            MessageKind::Unmap => "Unmap",
            MessageKind::WriteZeroes => "WriteZeroes",
            MessageKind::Flush => "Flush",
            MessageKind::Fence => "Fence",
            MessageKind::Allocated => "Allocated",
            MessageKind::ComponentStatus => "ComponentStatus",
            MessageKind::CloneBlocks => "CloneBlocks",
            MessageKind::SnapshotComponent => "SnapshotComponent",
            MessageKind::CloneSnapshot => "CloneSnapshot",
            MessageKind::Changed => "Changed",
            MessageKind::HeldSpace => "HeldSpace",
            MessageKind::VolumeRead => "VolumeRead",
            MessageKind::VolumeWrite => "VolumeWrite",
            MessageKind::VolumeFlush => "VolumeFlush",
            MessageKind::VolumeUnmap => "VolumeUnmap",
            MessageKind::VolumeWriteZeroes => "VolumeWriteZeroes",
            MessageKind::VolumeCompareAndWrite => "VolumeCompareAndWrite",
            MessageKind::VolumeBlockStatus => "VolumeBlockStatus",
            MessageKind::VolumeRepairCopy => "VolumeRepairCopy",
            MessageKind::VolumeHoldWrites => "VolumeHoldWrites",
            MessageKind::VolumeReleaseWrites => "VolumeReleaseWrites",
            MessageKind::VolumeSnapshotHeld => "VolumeSnapshotHeld",
            MessageKind::VolumeSnapshot => "VolumeSnapshot",
            MessageKind::HelloOk => "HelloOk",
            MessageKind::Pong => "Pong",
            MessageKind::Ok => "Ok",
            MessageKind::Data => "Data",
            MessageKind::Ranges => "Ranges",
            MessageKind::Extents => "Extents",
            MessageKind::Status => "Status",
            MessageKind::Held => "Held",
            MessageKind::Error => "Error",
        }
    }
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Request {
    /// The kind number of this request.
    pub fn kind(&self) -> MessageKind {
        match self {
            Request::Hello { .. } => MessageKind::Hello,
            Request::Ping => MessageKind::Ping,
            Request::CreateComponent { .. } => MessageKind::CreateComponent,
            Request::DeleteComponent { .. } => MessageKind::DeleteComponent,
            Request::ResizeComponent { .. } => MessageKind::ResizeComponent,
            Request::Write { .. } => MessageKind::Write,
            Request::Read { .. } => MessageKind::Read,
            Request::Unmap { .. } => MessageKind::Unmap,
            Request::WriteZeroes { .. } => MessageKind::WriteZeroes,
            Request::Flush { .. } => MessageKind::Flush,
            Request::Fence { .. } => MessageKind::Fence,
            Request::Allocated { .. } => MessageKind::Allocated,
            Request::ComponentStatus { .. } => MessageKind::ComponentStatus,
            Request::CloneBlocks { .. } => MessageKind::CloneBlocks,
            Request::SnapshotComponent { .. } => MessageKind::SnapshotComponent,
            Request::CloneSnapshot { .. } => MessageKind::CloneSnapshot,
            Request::Changed { .. } => MessageKind::Changed,
            Request::HeldSpace { .. } => MessageKind::HeldSpace,
            Request::VolumeRead { .. } => MessageKind::VolumeRead,
            Request::VolumeWrite { .. } => MessageKind::VolumeWrite,
            Request::VolumeFlush { .. } => MessageKind::VolumeFlush,
            Request::VolumeUnmap { .. } => MessageKind::VolumeUnmap,
            Request::VolumeWriteZeroes { .. } => MessageKind::VolumeWriteZeroes,
            Request::VolumeCompareAndWrite { .. } => MessageKind::VolumeCompareAndWrite,
            Request::VolumeBlockStatus { .. } => MessageKind::VolumeBlockStatus,
            Request::VolumeRepairCopy { .. } => MessageKind::VolumeRepairCopy,
            Request::VolumeSnapshot { .. } => MessageKind::VolumeSnapshot,
            Request::VolumeHoldWrites { .. } => MessageKind::VolumeHoldWrites,
            Request::VolumeReleaseWrites { .. } => MessageKind::VolumeReleaseWrites,
            Request::VolumeSnapshotHeld { .. } => MessageKind::VolumeSnapshotHeld,
        }
    }
}

impl Request {
    /// The component a component operation addresses (`None` for volume
    /// operations and the handshake): what the replica service routes on.
    /// For `CloneBlocks` it is the target, the component that changes; for
    /// `SnapshotComponent` and `CloneSnapshot` the component the new one is
    /// made from, which the answering host must hold.
    pub fn component(&self) -> Option<&ComponentRef> {
        match self {
            Request::CreateComponent { component, .. }
            | Request::DeleteComponent { component }
            | Request::ResizeComponent { component, .. }
            | Request::Write { component, .. }
            | Request::Read { component, .. }
            | Request::Unmap { component, .. }
            | Request::WriteZeroes { component, .. }
            | Request::Flush { component }
            | Request::Fence { component, .. }
            | Request::Allocated { component, .. }
            | Request::Changed { component, .. }
            | Request::HeldSpace { component }
            | Request::ComponentStatus { component }
            | Request::CloneBlocks {
                target: component, ..
            }
            | Request::SnapshotComponent { component, .. }
            | Request::CloneSnapshot {
                snapshot: component,
                ..
            } => Some(component),
            _ => None,
        }
    }

    /// The volume a request concerns, for component and volume operations
    /// alike (`None` for the handshake and pings).
    pub fn volume(&self) -> Option<&VolumeId> {
        match self {
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
            | Request::VolumeSnapshotHeld { volume, .. } => Some(volume),
            other => other.component().map(|c| &c.volume),
        }
    }
}

impl Response {
    /// The error kind if this answer reports a failure.
    pub fn error_kind(&self) -> Option<WireErrorKind> {
        match self {
            Response::Error { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// The kind number of this response.
    pub fn kind(&self) -> MessageKind {
        match self {
            Response::HelloOk { .. } => MessageKind::HelloOk,
            Response::Pong => MessageKind::Pong,
            Response::Ok => MessageKind::Ok,
            Response::Data(_) => MessageKind::Data,
            Response::Ranges(_) => MessageKind::Ranges,
            Response::Extents(_) => MessageKind::Extents,
            Response::Status { .. } => MessageKind::Status,
            Response::Held { .. } => MessageKind::Held,
            Response::Error { .. } => MessageKind::Error,
        }
    }
}

impl Message {
    /// The kind number of this message.
    pub fn kind(&self) -> MessageKind {
        match self {
            Message::Request(r) => r.kind(),
            Message::Response(r) => r.kind(),
        }
    }
}
