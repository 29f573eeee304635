//! CDB decoding: bytes in, a typed command (or the sense that refuses it)
//! out. Pure: no device, no state.
//!
//! Owns: the table of supported operation codes with their CDB usage masks
//! and timeouts (what REPORT SUPPORTED OPERATION CODES reports), and the
//! decoder that enforces the same masks, so a bit the target says it does not
//! use is refused with INVALID FIELD IN CDB and a field pointer.
//! Invariant: `decode` never panics and never reads past the CDB it was given.

use super::sense::{asc, Sense};

/// Operation codes this target implements.
pub mod op {
    #![allow(missing_docs)]
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0A;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1A;
    pub const START_STOP_UNIT: u8 = 0x1B;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2A;
    pub const WRITE_AND_VERIFY_10: u8 = 0x2E;
    pub const VERIFY_10: u8 = 0x2F;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub const READ_DEFECT_DATA_10: u8 = 0x37;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const MODE_SENSE_10: u8 = 0x5A;
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5E;
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5F;
    pub const EXTENDED_COPY: u8 = 0x83;
    pub const RECEIVE_COPY_RESULTS: u8 = 0x84;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const WRITE_16: u8 = 0x8A;
    pub const ORWRITE_16: u8 = 0x8B;
    pub const WRITE_AND_VERIFY_16: u8 = 0x8E;
    pub const VERIFY_16: u8 = 0x8F;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const WRITE_ATOMIC_16: u8 = 0x9C;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9E;
    pub const REPORT_LUNS: u8 = 0xA0;
    pub const MAINTENANCE_IN: u8 = 0xA3;
    pub const READ_12: u8 = 0xA8;
    pub const WRITE_12: u8 = 0xAA;
    pub const WRITE_AND_VERIFY_12: u8 = 0xAE;
    pub const VERIFY_12: u8 = 0xAF;
    pub const READ_DEFECT_DATA_12: u8 = 0xB7;
}

/// Whether `opcode` moves or changes blocks (reads, writes, verifies,
/// zeroing, unmapping, copies): the commands that run at full rate, which
/// take shared state from the host's cache.
pub fn is_data_transfer(opcode: u8) -> bool {
    matches!(
        opcode,
        op::READ_6
            | op::READ_10
            | op::READ_12
            | op::READ_16
            | op::WRITE_6
            | op::WRITE_10
            | op::WRITE_12
            | op::WRITE_16
            | op::WRITE_AND_VERIFY_10
            | op::WRITE_AND_VERIFY_12
            | op::WRITE_AND_VERIFY_16
            | op::VERIFY_10
            | op::VERIFY_12
            | op::VERIFY_16
            | op::COMPARE_AND_WRITE
            | op::ORWRITE_16
            | op::WRITE_ATOMIC_16
            | op::WRITE_SAME_10
            | op::WRITE_SAME_16
            | op::UNMAP
            | op::EXTENDED_COPY
            | op::PRE_FETCH_10
            | op::PRE_FETCH_16
            | op::SYNCHRONIZE_CACHE_10
            | op::SYNCHRONIZE_CACHE_16
    )
}

/// Service actions used with the operation codes that have them.
pub mod sa {
    #![allow(missing_docs)]
    pub const READ_CAPACITY_16: u16 = 0x10;
    pub const GET_LBA_STATUS: u16 = 0x12;
    pub const REPORT_TARGET_PORT_GROUPS: u16 = 0x0A;
    pub const REPORT_SUPPORTED_OPERATION_CODES: u16 = 0x0C;
    pub const EXTENDED_COPY_LID1: u16 = 0x00;
    pub const COPY_STATUS: u16 = 0x00;
    pub const OPERATING_PARAMETERS: u16 = 0x03;
    pub const FAILED_SEGMENT_DETAILS: u16 = 0x04;
}

/// One supported command: what REPORT SUPPORTED OPERATION CODES says about
/// it, and the mask the decoder enforces.
#[derive(Debug)]
pub struct CommandInfo {
    /// Operation code.
    pub opcode: u8,
    /// Service action, for operation codes that have them.
    pub service_action: Option<u16>,
    /// Name, for logs and documentation.
    pub name: &'static str,
    /// CDB usage data: byte 0 is the operation code; each other byte has a
    /// bit set for every CDB bit the target looks at.
    pub usage: &'static [u8],
    /// Recommended timeout in seconds (timeouts descriptor).
    pub timeout_secs: u32,
}

const F8: u8 = 0xFF;

macro_rules! cmd {
    ($op:expr, $sa:expr, $name:expr, $t:expr, [$($u:expr),*]) => {
        CommandInfo { opcode: $op, service_action: $sa, name: $name, usage: &[$($u),*], timeout_secs: $t }
    };
}

/// Every command this target implements, sorted by operation code and
/// service action.
pub static COMMANDS: &[CommandInfo] = &[
    cmd!(
        op::TEST_UNIT_READY,
        None,
        "TEST UNIT READY",
        10,
        [0x00, 0, 0, 0, 0, 0]
    ),
    cmd!(
        op::REQUEST_SENSE,
        None,
        "REQUEST SENSE",
        10,
        [0x03, 0x01, 0, 0, F8, 0]
    ),
    cmd!(op::READ_6, None, "READ(6)", 30, [0x08, 0x1F, F8, F8, F8, 0]),
    cmd!(
        op::WRITE_6,
        None,
        "WRITE(6)",
        30,
        [0x0A, 0x1F, F8, F8, F8, 0]
    ),
    cmd!(
        op::INQUIRY,
        None,
        "INQUIRY",
        10,
        [0x12, 0x01, F8, F8, F8, 0]
    ),
    cmd!(
        op::MODE_SELECT_6,
        None,
        "MODE SELECT(6)",
        10,
        [0x15, 0x11, 0, 0, F8, 0]
    ),
    cmd!(op::RESERVE_6, None, "RESERVE(6)", 10, [0x16, 0, 0, 0, 0, 0]),
    cmd!(op::RELEASE_6, None, "RELEASE(6)", 10, [0x17, 0, 0, 0, 0, 0]),
    cmd!(
        op::MODE_SENSE_6,
        None,
        "MODE SENSE(6)",
        10,
        [0x1A, 0x08, F8, F8, F8, 0]
    ),
    cmd!(
        op::START_STOP_UNIT,
        None,
        "START STOP UNIT",
        30,
        [0x1B, 0x01, 0, 0x0F, 0xF7, 0]
    ),
    cmd!(
        op::READ_CAPACITY_10,
        None,
        "READ CAPACITY(10)",
        10,
        [0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    ),
    cmd!(
        op::READ_10,
        None,
        "READ(10)",
        30,
        [0x28, 0x18, F8, F8, F8, F8, 0x1F, F8, F8, 0]
    ),
    cmd!(
        op::WRITE_10,
        None,
        "WRITE(10)",
        30,
        [0x2A, 0x18, F8, F8, F8, F8, 0x1F, F8, F8, 0]
    ),
    cmd!(
        op::WRITE_AND_VERIFY_10,
        None,
        "WRITE AND VERIFY(10)",
        30,
        [0x2E, 0x12, F8, F8, F8, F8, 0x1F, F8, F8, 0]
    ),
    cmd!(
        op::VERIFY_10,
        None,
        "VERIFY(10)",
        30,
        [0x2F, 0x16, F8, F8, F8, F8, 0x1F, F8, F8, 0]
    ),
    cmd!(
        op::PRE_FETCH_10,
        None,
        "PRE-FETCH(10)",
        30,
        [0x34, 0x02, F8, F8, F8, F8, 0x1F, F8, F8, 0]
    ),
    cmd!(
        op::SYNCHRONIZE_CACHE_10,
        None,
        "SYNCHRONIZE CACHE(10)",
        60,
        [0x35, 0x02, F8, F8, F8, F8, 0x1F, F8, F8, 0]
    ),
    cmd!(
        op::READ_DEFECT_DATA_10,
        None,
        "READ DEFECT DATA(10)",
        10,
        [0x37, 0, 0x1F, 0, 0, 0, 0, F8, F8, 0]
    ),
    cmd!(
        op::WRITE_SAME_10,
        None,
        "WRITE SAME(10)",
        60,
        [0x41, 0x08, F8, F8, F8, F8, 0x1F, F8, F8, 0]
    ),
    cmd!(
        op::UNMAP,
        None,
        "UNMAP",
        60,
        [0x42, 0, 0, 0, 0, 0, 0x1F, F8, F8, 0]
    ),
    cmd!(
        op::MODE_SELECT_10,
        None,
        "MODE SELECT(10)",
        10,
        [0x55, 0x11, 0, 0, 0, 0, 0, F8, F8, 0]
    ),
    cmd!(
        op::MODE_SENSE_10,
        None,
        "MODE SENSE(10)",
        10,
        [0x5A, 0x18, F8, F8, 0, 0, 0, F8, F8, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_IN,
        Some(0x00),
        "PERSISTENT RESERVE IN (READ KEYS)",
        10,
        [0x5E, 0x1F, 0, 0, 0, 0, 0, F8, F8, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_IN,
        Some(0x01),
        "PERSISTENT RESERVE IN (READ RESERVATION)",
        10,
        [0x5E, 0x1F, 0, 0, 0, 0, 0, F8, F8, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_IN,
        Some(0x02),
        "PERSISTENT RESERVE IN (REPORT CAPABILITIES)",
        10,
        [0x5E, 0x1F, 0, 0, 0, 0, 0, F8, F8, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_IN,
        Some(0x03),
        "PERSISTENT RESERVE IN (READ FULL STATUS)",
        10,
        [0x5E, 0x1F, 0, 0, 0, 0, 0, F8, F8, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x00),
        "PERSISTENT RESERVE OUT (REGISTER)",
        10,
        [0x5F, 0x1F, F8, 0, 0, F8, F8, F8, F8, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x01),
        "PERSISTENT RESERVE OUT (RESERVE)",
        10,
        [0x5F, 0x1F, F8, 0, 0, F8, F8, F8, F8, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x02),
        "PERSISTENT RESERVE OUT (RELEASE)",
        10,
        [0x5F, 0x1F, F8, 0, 0, F8, F8, F8, F8, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x03),
        "PERSISTENT RESERVE OUT (CLEAR)",
        10,
        [0x5F, 0x1F, F8, 0, 0, F8, F8, F8, F8, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x04),
        "PERSISTENT RESERVE OUT (PREEMPT)",
        10,
        [0x5F, 0x1F, F8, 0, 0, F8, F8, F8, F8, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x05),
        "PERSISTENT RESERVE OUT (PREEMPT AND ABORT)",
        10,
        [0x5F, 0x1F, F8, 0, 0, F8, F8, F8, F8, 0]
    ),
    cmd!(
        op::PERSISTENT_RESERVE_OUT,
        Some(0x06),
        "PERSISTENT RESERVE OUT (REGISTER AND IGNORE EXISTING KEY)",
        10,
        [0x5F, 0x1F, F8, 0, 0, F8, F8, F8, F8, 0]
    ),
    cmd!(
        op::EXTENDED_COPY,
        Some(sa::EXTENDED_COPY_LID1),
        "EXTENDED COPY (LID1)",
        120,
        [0x83, 0x1F, 0, 0, 0, 0, 0, 0, 0, 0, F8, F8, F8, F8, 0, 0]
    ),
    cmd!(
        op::RECEIVE_COPY_RESULTS,
        Some(sa::COPY_STATUS),
        "RECEIVE COPY RESULTS (COPY STATUS)",
        10,
        [0x84, 0x1F, F8, 0, 0, 0, 0, 0, 0, 0, F8, F8, F8, F8, 0, 0]
    ),
    cmd!(
        op::RECEIVE_COPY_RESULTS,
        Some(sa::OPERATING_PARAMETERS),
        "RECEIVE COPY RESULTS (OPERATING PARAMETERS)",
        10,
        [0x84, 0x1F, 0, 0, 0, 0, 0, 0, 0, 0, F8, F8, F8, F8, 0, 0]
    ),
    cmd!(
        op::RECEIVE_COPY_RESULTS,
        Some(sa::FAILED_SEGMENT_DETAILS),
        "RECEIVE COPY RESULTS (FAILED SEGMENT DETAILS)",
        10,
        [0x84, 0x1F, F8, 0, 0, 0, 0, 0, 0, 0, F8, F8, F8, F8, 0, 0]
    ),
    cmd!(
        op::READ_16,
        None,
        "READ(16)",
        30,
        [0x88, 0x18, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, 0x1F, 0]
    ),
    cmd!(
        op::COMPARE_AND_WRITE,
        None,
        "COMPARE AND WRITE",
        30,
        [0x89, 0x18, F8, F8, F8, F8, F8, F8, F8, F8, 0, 0, 0, F8, 0x1F, 0]
    ),
    cmd!(
        op::WRITE_16,
        None,
        "WRITE(16)",
        30,
        [0x8A, 0x18, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, 0x1F, 0]
    ),
    cmd!(
        op::ORWRITE_16,
        None,
        "ORWRITE(16)",
        30,
        [0x8B, 0x18, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, 0x1F, 0]
    ),
    cmd!(
        op::WRITE_AND_VERIFY_16,
        None,
        "WRITE AND VERIFY(16)",
        30,
        [0x8E, 0x12, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, 0x1F, 0]
    ),
    cmd!(
        op::VERIFY_16,
        None,
        "VERIFY(16)",
        30,
        [0x8F, 0x16, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, 0x1F, 0]
    ),
    cmd!(
        op::PRE_FETCH_16,
        None,
        "PRE-FETCH(16)",
        30,
        [0x90, 0x02, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, 0x1F, 0]
    ),
    cmd!(
        op::SYNCHRONIZE_CACHE_16,
        None,
        "SYNCHRONIZE CACHE(16)",
        60,
        [0x91, 0x02, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, 0x1F, 0]
    ),
    cmd!(
        op::WRITE_SAME_16,
        None,
        "WRITE SAME(16)",
        60,
        [0x93, 0x09, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, 0x1F, 0]
    ),
    cmd!(
        op::WRITE_ATOMIC_16,
        None,
        "WRITE ATOMIC(16)",
        30,
        [0x9C, 0x18, F8, F8, F8, F8, F8, F8, F8, F8, 0, 0, F8, F8, 0x1F, 0]
    ),
    cmd!(
        op::SERVICE_ACTION_IN_16,
        Some(sa::READ_CAPACITY_16),
        "READ CAPACITY(16)",
        10,
        [0x9E, 0x1F, 0, 0, 0, 0, 0, 0, 0, 0, F8, F8, F8, F8, 0, 0]
    ),
    cmd!(
        op::SERVICE_ACTION_IN_16,
        Some(sa::GET_LBA_STATUS),
        "GET LBA STATUS",
        10,
        [0x9E, 0x1F, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, F8, 0, 0]
    ),
    cmd!(
        op::REPORT_LUNS,
        None,
        "REPORT LUNS",
        10,
        [0xA0, 0, F8, 0, 0, 0, F8, F8, F8, F8, 0, 0]
    ),
    cmd!(
        op::MAINTENANCE_IN,
        Some(sa::REPORT_TARGET_PORT_GROUPS),
        "REPORT TARGET PORT GROUPS",
        10,
        [0xA3, 0xFF, 0, 0, 0, 0, F8, F8, F8, F8, 0, 0]
    ),
    cmd!(
        op::MAINTENANCE_IN,
        Some(sa::REPORT_SUPPORTED_OPERATION_CODES),
        "REPORT SUPPORTED OPERATION CODES",
        10,
        [0xA3, 0x1F, 0x87, F8, F8, F8, F8, F8, F8, F8, 0, 0]
    ),
    cmd!(
        op::READ_12,
        None,
        "READ(12)",
        30,
        [0xA8, 0x18, F8, F8, F8, F8, F8, F8, F8, F8, 0x1F, 0]
    ),
    cmd!(
        op::WRITE_12,
        None,
        "WRITE(12)",
        30,
        [0xAA, 0x18, F8, F8, F8, F8, F8, F8, F8, F8, 0x1F, 0]
    ),
    cmd!(
        op::WRITE_AND_VERIFY_12,
        None,
        "WRITE AND VERIFY(12)",
        30,
        [0xAE, 0x12, F8, F8, F8, F8, F8, F8, F8, F8, 0x1F, 0]
    ),
    cmd!(
        op::VERIFY_12,
        None,
        "VERIFY(12)",
        30,
        [0xAF, 0x16, F8, F8, F8, F8, F8, F8, F8, F8, 0x1F, 0]
    ),
    cmd!(
        op::READ_DEFECT_DATA_12,
        None,
        "READ DEFECT DATA(12)",
        10,
        [0xB7, 0x1F, F8, F8, F8, F8, F8, F8, F8, F8, 0, 0]
    ),
];

/// Whether an operation code is defined with service actions here.
pub fn has_service_actions(opcode: u8) -> bool {
    COMMANDS
        .iter()
        .any(|c| c.opcode == opcode && c.service_action.is_some())
}

/// The table entry for an operation code (and service action).
pub fn lookup(opcode: u8, service_action: Option<u16>) -> Option<&'static CommandInfo> {
    COMMANDS
        .iter()
        .find(|c| c.opcode == opcode && c.service_action == service_action)
}

/// A decoded CDB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cdb {
    /// TEST UNIT READY.
    TestUnitReady,
    /// REQUEST SENSE.
    RequestSense {
        /// DESC bit: descriptor format wanted.
        descriptor: bool,
        /// Allocation length.
        alloc: u32,
    },
    /// INQUIRY.
    Inquiry {
        /// EVPD bit.
        evpd: bool,
        /// Page code.
        page: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// READ CAPACITY(10).
    ReadCapacity10,
    /// READ CAPACITY(16).
    ReadCapacity16 {
        /// Allocation length.
        alloc: u32,
    },
    /// READ(6/10/12/16).
    Read(Transfer),
    /// WRITE(6/10/12/16).
    Write(Transfer),
    /// WRITE AND VERIFY(10/12/16).
    WriteAndVerify(Transfer),
    /// VERIFY(10/12/16).
    Verify {
        /// Range.
        range: Transfer,
        /// BYTCHK: 0 medium only, 1 compare data-out, 3 one block against each.
        bytchk: u8,
    },
    /// SYNCHRONIZE CACHE(10/16).
    SynchronizeCache {
        /// First LBA.
        lba: u64,
        /// Blocks (0: to the end).
        blocks: u32,
    },
    /// PRE-FETCH(10/16).
    PreFetch {
        /// First LBA.
        lba: u64,
        /// Blocks (0: to the end).
        blocks: u32,
    },
    /// MODE SENSE(6/10).
    ModeSense {
        /// MODE SENSE(10).
        ten: bool,
        /// Disable block descriptors.
        dbd: bool,
        /// Long LBA block descriptor accepted.
        llbaa: bool,
        /// Page control.
        page_control: u8,
        /// Page code.
        page: u8,
        /// Subpage code.
        subpage: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// MODE SELECT(6/10).
    ModeSelect {
        /// MODE SELECT(10).
        ten: bool,
        /// Page format bit.
        page_format: bool,
        /// Save pages bit.
        save: bool,
        /// Parameter list length.
        length: u32,
    },
    /// REPORT LUNS.
    ReportLuns {
        /// SELECT REPORT.
        select: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// REPORT SUPPORTED OPERATION CODES.
    ReportSupportedOpcodes {
        /// Return command timeouts descriptors.
        rctd: bool,
        /// Reporting options.
        options: u8,
        /// Requested operation code.
        opcode: u8,
        /// Requested service action.
        service_action: u16,
        /// Allocation length.
        alloc: u32,
    },
    /// REPORT TARGET PORT GROUPS.
    ReportTargetPortGroups {
        /// Extended header format requested.
        extended: bool,
        /// Allocation length.
        alloc: u32,
    },
    /// RESERVE(6).
    Reserve6,
    /// RELEASE(6).
    Release6,
    /// PERSISTENT RESERVE IN.
    PersistentReserveIn {
        /// Service action.
        service_action: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// PERSISTENT RESERVE OUT.
    PersistentReserveOut {
        /// Service action.
        service_action: u8,
        /// Scope (high nibble of byte 2).
        scope: u8,
        /// Reservation type.
        kind: u8,
        /// Parameter list length.
        length: u32,
    },
    /// START STOP UNIT.
    StartStopUnit {
        /// Power condition.
        power_condition: u8,
        /// Load/eject.
        load_eject: bool,
        /// Start.
        start: bool,
    },
    /// GET LBA STATUS.
    GetLbaStatus {
        /// Starting LBA.
        lba: u64,
        /// Allocation length.
        alloc: u32,
    },
    /// COMPARE AND WRITE.
    CompareAndWrite {
        /// First LBA.
        lba: u64,
        /// Blocks compared and written.
        blocks: u32,
        /// FUA bit.
        fua: bool,
    },
    /// EXTENDED COPY (LID1).
    ExtendedCopy {
        /// Parameter list length.
        length: u32,
    },
    /// RECEIVE COPY RESULTS.
    ReceiveCopyResults {
        /// Service action.
        service_action: u8,
        /// List identifier.
        list_id: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// WRITE SAME(10/16).
    WriteSame {
        /// First LBA.
        lba: u64,
        /// Blocks (0: to the end of the unit).
        blocks: u64,
        /// UNMAP bit.
        unmap: bool,
        /// NDOB bit (no data-out: the block is zeros).
        ndob: bool,
    },
    /// UNMAP.
    Unmap {
        /// Parameter list length.
        length: u32,
    },
    /// ORWRITE(16): the data-out ORed into the blocks, as one uninterrupted
    /// read-modify-write.
    OrWrite(Transfer),
    /// WRITE ATOMIC(16): a write no other command sees half done.
    WriteAtomic(Transfer),
    /// READ DEFECT DATA(10/12).
    ReadDefectData {
        /// The 12-byte CDB (8-byte header with a generation code).
        twelve: bool,
        /// REQ_PLIST: the primary (manufacturer's) list is asked for.
        primary: bool,
        /// REQ_GLIST: the grown list is asked for.
        grown: bool,
        /// Defect list format.
        format: u8,
        /// Allocation length.
        alloc: u32,
    },
}

/// The range of a read or write CDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// First LBA.
    pub lba: u64,
    /// Blocks.
    pub blocks: u32,
    /// FUA bit.
    pub fua: bool,
}

/// Length of a CDB by operation code group (SPC-5 'Operation code').
pub fn cdb_length(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

fn be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0u64, |acc, &b| (acc << 8) | b as u64)
}

/// Finds the table entry a CDB names, with the sense that refuses it when
/// there is none.
pub fn command_info(raw: &[u8]) -> Result<&'static CommandInfo, Sense> {
    let opcode = *raw
        .first()
        .ok_or_else(|| Sense::illegal(asc::INVALID_COMMAND_OPERATION_CODE))?;
    if !COMMANDS.iter().any(|c| c.opcode == opcode) {
        return Err(Sense::illegal(asc::INVALID_COMMAND_OPERATION_CODE));
    }
    let service_action = if has_service_actions(opcode) {
        Some((raw.get(1).copied().unwrap_or(0) & 0x1F) as u16)
    } else {
        None
    };
    lookup(opcode, service_action).ok_or_else(|| Sense::invalid_cdb_field(1, Some(4)))
}

/// Decodes a CDB. `raw` may carry padding past the CDB's own length (an
/// iSCSI header always holds 16 bytes); it is ignored.
pub fn decode(raw: &[u8]) -> Result<Cdb, Sense> {
    let info = command_info(raw)?;
    let len = info.usage.len();
    if raw.len() < len {
        return Err(Sense::invalid_cdb_field(raw.len() as u16, None));
    }
    let c = &raw[..len];
    for (i, (&byte, &mask)) in c.iter().zip(info.usage.iter()).enumerate().skip(1) {
        // The control byte's vendor-specific bits are the initiator's own.
        let byte = if i == len - 1 { byte & 0x3F } else { byte };
        let stray = byte & !mask;
        if stray != 0 {
            return Err(Sense::invalid_cdb_field(
                i as u16,
                Some(7 - stray.leading_zeros() as u8),
            ));
        }
    }
    let fua = |byte: u8| byte & 0x08 != 0;
    let cdb = match c[0] {
        op::TEST_UNIT_READY => Cdb::TestUnitReady,
        op::REQUEST_SENSE => Cdb::RequestSense {
            descriptor: c[1] & 0x01 != 0,
            alloc: c[4] as u32,
        },
        op::INQUIRY => {
            let evpd = c[1] & 0x01 != 0;
            if !evpd && c[2] != 0 {
                return Err(Sense::invalid_cdb_field(2, None));
            }
            Cdb::Inquiry {
                evpd,
                page: c[2],
                alloc: be(&c[3..5]) as u32,
            }
        }
        op::READ_6 | op::WRITE_6 => {
            let blocks = match c[4] {
                0 => 256,
                n => n as u32,
            };
            let t = Transfer {
                lba: be(&c[1..4]) & 0x1F_FFFF,
                blocks,
                fua: false,
            };
            if c[0] == op::READ_6 {
                Cdb::Read(t)
            } else {
                Cdb::Write(t)
            }
        }
        op::READ_10 | op::WRITE_10 | op::WRITE_AND_VERIFY_10 | op::VERIFY_10 => {
            let t = Transfer {
                lba: be(&c[2..6]),
                blocks: be(&c[7..9]) as u32,
                fua: fua(c[1]),
            };
            rw(c[0], c[1], t)?
        }
        op::READ_12 | op::WRITE_12 | op::WRITE_AND_VERIFY_12 | op::VERIFY_12 => {
            let t = Transfer {
                lba: be(&c[2..6]),
                blocks: be(&c[6..10]) as u32,
                fua: fua(c[1]),
            };
            rw(c[0], c[1], t)?
        }
        op::READ_16 | op::WRITE_16 | op::WRITE_AND_VERIFY_16 | op::VERIFY_16 => {
            let t = Transfer {
                lba: be(&c[2..10]),
                blocks: be(&c[10..14]) as u32,
                fua: fua(c[1]),
            };
            rw(c[0], c[1], t)?
        }
        op::MODE_SELECT_6 => Cdb::ModeSelect {
            ten: false,
            page_format: c[1] & 0x10 != 0,
            save: c[1] & 0x01 != 0,
            length: c[4] as u32,
        },
        op::MODE_SELECT_10 => Cdb::ModeSelect {
            ten: true,
            page_format: c[1] & 0x10 != 0,
            save: c[1] & 0x01 != 0,
            length: be(&c[7..9]) as u32,
        },
        op::RESERVE_6 => Cdb::Reserve6,
        op::RELEASE_6 => Cdb::Release6,
        op::MODE_SENSE_6 => Cdb::ModeSense {
            ten: false,
            dbd: c[1] & 0x08 != 0,
            llbaa: false,
            page_control: c[2] >> 6,
            page: c[2] & 0x3F,
            subpage: c[3],
            alloc: c[4] as u32,
        },
        op::MODE_SENSE_10 => Cdb::ModeSense {
            ten: true,
            dbd: c[1] & 0x08 != 0,
            llbaa: c[1] & 0x10 != 0,
            page_control: c[2] >> 6,
            page: c[2] & 0x3F,
            subpage: c[3],
            alloc: be(&c[7..9]) as u32,
        },
        op::START_STOP_UNIT => Cdb::StartStopUnit {
            power_condition: c[4] >> 4,
            load_eject: c[4] & 0x02 != 0,
            start: c[4] & 0x01 != 0,
        },
        op::READ_CAPACITY_10 => Cdb::ReadCapacity10,
        op::PRE_FETCH_10 | op::SYNCHRONIZE_CACHE_10 => {
            let (lba, blocks) = (be(&c[2..6]), be(&c[7..9]) as u32);
            if c[0] == op::PRE_FETCH_10 {
                Cdb::PreFetch { lba, blocks }
            } else {
                Cdb::SynchronizeCache { lba, blocks }
            }
        }
        op::PRE_FETCH_16 | op::SYNCHRONIZE_CACHE_16 => {
            let (lba, blocks) = (be(&c[2..10]), be(&c[10..14]) as u32);
            if c[0] == op::PRE_FETCH_16 {
                Cdb::PreFetch { lba, blocks }
            } else {
                Cdb::SynchronizeCache { lba, blocks }
            }
        }
        op::WRITE_SAME_10 => Cdb::WriteSame {
            lba: be(&c[2..6]),
            blocks: be(&c[7..9]),
            unmap: c[1] & 0x08 != 0,
            ndob: false,
        },
        op::WRITE_SAME_16 => Cdb::WriteSame {
            lba: be(&c[2..10]),
            blocks: be(&c[10..14]),
            unmap: c[1] & 0x08 != 0,
            ndob: c[1] & 0x01 != 0,
        },
        op::UNMAP => Cdb::Unmap {
            length: be(&c[7..9]) as u32,
        },
        op::PERSISTENT_RESERVE_IN => Cdb::PersistentReserveIn {
            service_action: c[1] & 0x1F,
            alloc: be(&c[7..9]) as u32,
        },
        op::PERSISTENT_RESERVE_OUT => Cdb::PersistentReserveOut {
            service_action: c[1] & 0x1F,
            scope: c[2] >> 4,
            kind: c[2] & 0x0F,
            length: be(&c[5..9]) as u32,
        },
        op::EXTENDED_COPY => Cdb::ExtendedCopy {
            length: be(&c[10..14]) as u32,
        },
        op::RECEIVE_COPY_RESULTS => Cdb::ReceiveCopyResults {
            service_action: c[1] & 0x1F,
            list_id: c[2],
            alloc: be(&c[10..14]) as u32,
        },
        op::ORWRITE_16 => Cdb::OrWrite(Transfer {
            lba: be(&c[2..10]),
            blocks: be(&c[10..14]) as u32,
            fua: fua(c[1]),
        }),
        op::WRITE_ATOMIC_16 => Cdb::WriteAtomic(Transfer {
            lba: be(&c[2..10]),
            blocks: be(&c[12..14]) as u32,
            fua: fua(c[1]),
        }),
        op::READ_DEFECT_DATA_10 => Cdb::ReadDefectData {
            twelve: false,
            primary: c[2] & 0x10 != 0,
            grown: c[2] & 0x08 != 0,
            format: c[2] & 0x07,
            alloc: be(&c[7..9]) as u32,
        },
        op::READ_DEFECT_DATA_12 => {
            // An address descriptor index past the (empty) list is still
            // answered with the header alone.
            Cdb::ReadDefectData {
                twelve: true,
                primary: c[1] & 0x10 != 0,
                grown: c[1] & 0x08 != 0,
                format: c[1] & 0x07,
                alloc: be(&c[6..10]) as u32,
            }
        }
        op::COMPARE_AND_WRITE => Cdb::CompareAndWrite {
            lba: be(&c[2..10]),
            blocks: c[13] as u32,
            fua: fua(c[1]),
        },
        op::SERVICE_ACTION_IN_16 => {
            if c[1] & 0x1F == sa::READ_CAPACITY_16 as u8 {
                Cdb::ReadCapacity16 {
                    alloc: be(&c[10..14]) as u32,
                }
            } else {
                Cdb::GetLbaStatus {
                    lba: be(&c[2..10]),
                    alloc: be(&c[10..14]) as u32,
                }
            }
        }
        op::REPORT_LUNS => Cdb::ReportLuns {
            select: c[2],
            alloc: be(&c[6..10]) as u32,
        },
        op::MAINTENANCE_IN => {
            if c[1] & 0x1F == sa::REPORT_TARGET_PORT_GROUPS as u8 {
                let format = c[1] >> 5;
                if format > 1 {
                    return Err(Sense::invalid_cdb_field(1, Some(7)));
                }
                Cdb::ReportTargetPortGroups {
                    extended: format == 1,
                    alloc: be(&c[6..10]) as u32,
                }
            } else {
                Cdb::ReportSupportedOpcodes {
                    rctd: c[2] & 0x80 != 0,
                    options: c[2] & 0x07,
                    opcode: c[3],
                    service_action: be(&c[4..6]) as u16,
                    alloc: be(&c[6..10]) as u32,
                }
            }
        }
        _ => return Err(Sense::illegal(asc::INVALID_COMMAND_OPERATION_CODE)),
    };
    Ok(cdb)
}

fn rw(opcode: u8, byte1: u8, t: Transfer) -> Result<Cdb, Sense> {
    let bytchk = (byte1 >> 1) & 0x03;
    Ok(match opcode {
        op::READ_10 | op::READ_12 | op::READ_16 => Cdb::Read(t),
        op::WRITE_10 | op::WRITE_12 | op::WRITE_16 => Cdb::Write(t),
        op::WRITE_AND_VERIFY_10 | op::WRITE_AND_VERIFY_12 | op::WRITE_AND_VERIFY_16 => {
            if bytchk > 1 {
                return Err(Sense::invalid_cdb_field(1, Some(2)));
            }
            Cdb::WriteAndVerify(Transfer { fua: true, ..t })
        }
        _ => {
            if bytchk == 2 {
                return Err(Sense::invalid_cdb_field(1, Some(2)));
            }
            Cdb::Verify { range: t, bytchk }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scsi::sense::key;
    use proptest::prelude::*;

    #[test]
    fn table_is_sorted_and_usage_starts_with_opcode() {
        for pair in COMMANDS.windows(2) {
            let a = (pair[0].opcode, pair[0].service_action);
            let b = (pair[1].opcode, pair[1].service_action);
            assert!(a < b, "{:?} before {:?}", a, b);
        }
        for c in COMMANDS {
            assert_eq!(c.usage[0], c.opcode, "{}", c.name);
            assert_eq!(Some(c.usage.len()), cdb_length(c.opcode), "{}", c.name);
        }
    }

    #[test]
    fn read16_decodes_lba_length_and_fua() {
        let mut c = [0u8; 16];
        c[0] = op::READ_16;
        c[1] = 0x08;
        c[2..10].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        c[10..14].copy_from_slice(&9u32.to_be_bytes());
        assert_eq!(
            decode(&c),
            Ok(Cdb::Read(Transfer {
                lba: 0x0102_0304_0506_0708,
                blocks: 9,
                fua: true
            }))
        );
    }

    #[test]
    fn reserved_bits_and_unknown_opcodes_are_refused() {
        let mut c = [0u8; 10];
        c[0] = op::READ_10;
        c[1] = 0x20; // RDPROTECT: no protection information here.
        let s = decode(&c).unwrap_err();
        assert_eq!((s.key, s.asc), (key::ILLEGAL_REQUEST, 0x24));
        assert_eq!(s.field.unwrap().byte, 1);
        assert_eq!(s.field.unwrap().bit, Some(5));
        let s = decode(&[0xC5, 0, 0, 0, 0, 0]).unwrap_err();
        assert_eq!((s.asc, s.ascq), (0x20, 0x00));
        let s = decode(&[
            op::SERVICE_ACTION_IN_16,
            0x05,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ])
        .unwrap_err();
        assert_eq!((s.asc, s.ascq), (0x24, 0x00));
        let s = decode(&[op::TEST_UNIT_READY, 0, 0, 0, 0, 0x04]).unwrap_err();
        assert_eq!(s.field.unwrap().byte, 5);
    }

    #[test]
    fn six_byte_transfer_of_zero_means_256_blocks() {
        assert_eq!(
            decode(&[op::READ_6, 0x1F, 0xFF, 0xFF, 0, 0]),
            Ok(Cdb::Read(Transfer {
                lba: 0x1F_FFFF,
                blocks: 256,
                fua: false
            }))
        );
    }

    proptest! {
        /// Decoding never panics, and a CDB that decodes uses only the bits
        /// its usage mask names.
        #[test]
        fn decode_is_total_and_respects_usage(raw in proptest::collection::vec(any::<u8>(), 0..20)) {
            if let Ok(_cdb) = decode(&raw) {
                let info = command_info(&raw).unwrap();
                for (i, (&b, &m)) in raw.iter().zip(info.usage.iter()).enumerate().skip(1) {
                    let b = if i == info.usage.len() - 1 { b & 0x3F } else { b };
                    prop_assert_eq!(b & !m, 0);
                }
            }
        }

        /// READ(10) round-trips any LBA and length.
        #[test]
        fn read10_round_trips(lba in any::<u32>(), blocks in any::<u16>(), fua in any::<bool>()) {
            let mut c = [0u8; 10];
            c[0] = op::READ_10;
            c[1] = if fua { 0x08 } else { 0 };
            c[2..6].copy_from_slice(&lba.to_be_bytes());
            c[7..9].copy_from_slice(&blocks.to_be_bytes());
            prop_assert_eq!(decode(&c), Ok(Cdb::Read(Transfer { lba: lba as u64, blocks: blocks as u32, fua })));
        }

        /// WRITE SAME(16) keeps the 32-bit length and the UNMAP/NDOB bits.
        #[test]
        fn write_same16_round_trips(lba in any::<u64>(), blocks in any::<u32>(), unmap in any::<bool>(), ndob in any::<bool>()) {
            let mut c = [0u8; 16];
            c[0] = op::WRITE_SAME_16;
            c[1] = (if unmap { 0x08 } else { 0 }) | (if ndob { 0x01 } else { 0 });
            c[2..10].copy_from_slice(&lba.to_be_bytes());
            c[10..14].copy_from_slice(&blocks.to_be_bytes());
            prop_assert_eq!(decode(&c), Ok(Cdb::WriteSame { lba, blocks: blocks as u64, unmap, ndob }));
        }
    }
}
