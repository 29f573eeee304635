//! The SCSI target side of a logical unit: CDB decoding, the block commands
//! and their sense data, over a [`BlockDevice`].
//!
//! Owns: what each command means (SPC-5, SBC-4), unit attentions per I_T
//! nexus, reservations, the VAAI offloads and their counters.
//! Must not touch: PDUs, sessions or sockets (the iSCSI layer hands over a
//! whole [`Command`] with every byte of its data-out buffer and gets back a
//! whole [`Response`]); volumes or the directory (a host supplies shared
//! state through [`UnitEnvironment`]).
//! Invariants:
//! - a command that fails its checks (bad CDB field, range past the end,
//!   malformed parameter list) changes nothing and answers CHECK CONDITION
//!   with the sense key, ASC/ASCQ and, where SPC-5 defines one, the field
//!   pointer;
//! - `Response::data_in` never exceeds `Command::expected_data_in`; the
//!   transport computes residuals from the difference.

use bytes::Bytes;

pub mod cdb;
pub mod copy;
pub mod environment;
pub mod fuzzing;
pub mod inquiry;
pub mod mode;
pub mod reservations;
pub mod sense;
pub mod target;
pub mod unit;

pub use environment::{
    AluaState, DatastoreSpace, EnvironmentError, LocalReservations, MemoryDatastore,
    MemoryEnvironment, Offloads, TargetPortGroup, UnitEnvironment, VersionedReservations,
};
pub use reservations::ReservationState;
pub use sense::Sense;
pub use target::BlockTarget;
pub use unit::{LogicalUnit, UnitSettings, VaaiCounters};

/// The I_T nexus a command arrives on: one initiator port talking to one
/// target port. Unit attentions and reservations are kept per nexus.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Nexus {
    /// Initiator port name, as SPC-5 transport IDs spell it for iSCSI:
    /// `<initiator name>,i,0x<ISID in 12 hex digits>`.
    pub initiator_port: String,
    /// Relative target port identifier (1-based): one per host portal, so a
    /// volume reached through two hosts shows two ports.
    pub relative_port: u16,
}

/// Task attribute of a command (SAM-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskAttribute {
    /// No ordering constraint beyond the device's own.
    #[default]
    Simple,
    /// Runs after every older command and before every newer one.
    Ordered,
    /// Runs before every queued command.
    HeadOfQueue,
    /// Auto contingent allegiance.
    Aca,
}

/// One SCSI command, with its whole data-out buffer.
#[derive(Debug, Clone)]
pub struct Command {
    /// Who sent it.
    pub nexus: Nexus,
    /// Logical unit number, as the initiator addressed it (flat, single level).
    pub lun: u64,
    /// The CDB, without padding beyond its own length where the transport
    /// knows it (an iSCSI CDB field is 16 bytes plus any AHS).
    pub cdb: Bytes,
    /// Every byte the initiator sent for this command (immediate, unsolicited
    /// and solicited data, in order). May be shorter or longer than the CDB
    /// asks for: the command decides what that means.
    pub data_out: Bytes,
    /// Expected data transfer length of the read direction, in bytes: the
    /// most the transport can deliver.
    pub expected_data_in: u32,
    /// Task attribute.
    pub attribute: TaskAttribute,
    /// Task tag, for ABORT TASK and logs.
    pub tag: u32,
}

/// SCSI status codes (SAM-5) a target returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// 0x00
    Good,
    /// 0x02: sense data says why.
    CheckCondition,
    /// 0x04: condition met (PRE-FETCH).
    ConditionMet,
    /// 0x08
    Busy,
    /// 0x18: the command conflicts with a reservation.
    ReservationConflict,
    /// 0x28
    TaskSetFull,
    /// 0x40
    TaskAborted,
}

impl Status {
    /// The status byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            Status::Good => 0x00,
            Status::CheckCondition => 0x02,
            Status::ConditionMet => 0x04,
            Status::Busy => 0x08,
            Status::ReservationConflict => 0x18,
            Status::TaskSetFull => 0x28,
            Status::TaskAborted => 0x40,
        }
    }
}

/// The outcome of one command.
#[derive(Debug, Clone)]
pub struct Response {
    /// SCSI status.
    pub status: Status,
    /// Sense data (fixed or descriptor format, as encoded) when `status` is
    /// CHECK CONDITION.
    pub sense: Option<Bytes>,
    /// Data-in, at most `Command::expected_data_in` bytes.
    pub data_in: Bytes,
    /// Bytes of data-out the command consumed, for the write-direction
    /// residual: what its CDB asks for (transfer length in bytes, or the
    /// parameter list length). When that is more than the initiator sent,
    /// the transport reports a residual overflow of the difference; when
    /// less, an underflow.
    pub data_out_used: u32,
}

/// Which reset a task management function asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reset {
    /// LOGICAL UNIT RESET of one LUN.
    LogicalUnit(u64),
    /// TARGET WARM RESET.
    TargetWarm,
    /// TARGET COLD RESET.
    TargetCold,
}

/// The SCSI target device behind one iSCSI target name: its logical units.
/// This is the whole surface the iSCSI layer uses.
#[async_trait::async_trait]
pub trait ScsiTarget: Send + Sync + 'static {
    /// Runs one command to completion. The transport has already collected
    /// every byte of data-out; it sends `data_in`, status and sense back.
    /// Dropping the future (ABORT TASK) must leave the unit consistent.
    async fn execute(&self, command: Command) -> Response;

    /// A reset requested by `nexus`: clears what SAM-5 says it clears and
    /// raises the unit attentions it raises for the other nexuses.
    async fn reset(&self, nexus: &Nexus, reset: Reset);

    /// A nexus ended (logout or a dropped connection without a session to
    /// continue): per-nexus state that does not outlive it may go.
    /// The transport awaits it before answering a logout, so state shared
    /// with other hosts (a RESERVE(6) held by the nexus) is released before
    /// the initiator can act on the logout.
    async fn nexus_ended(&self, nexus: &Nexus);
}
