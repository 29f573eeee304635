//! One logical unit: a [`BlockDevice`] served with SBC-4/SPC-5 semantics.
//!
//! Owns: command execution over the device (reads, writes, verify, the VAAI
//! offloads), unit attentions per I_T nexus, mode parameters, copy results,
//! the reservation checks (state kept by the [`UnitEnvironment`]), and the
//! VAAI counters.
//! Must not touch: PDUs or sessions; other logical units except through the
//! environment (EXTENDED COPY targets).
//! Invariants:
//! - every range is checked against the device size before the device sees
//!   it, so a refused command changes nothing;
//! - WRITE SAME of zeros and UNMAP never write zeros: they become
//!   `write_zeroes(MayUnmap)` or `unmap`;
//! - a reservation conflict, a unit attention or a bad CDB is reported
//!   before any data moves;
//! - an offload the environment does not offer (see [`Offloads`]) is
//!   refused as an unknown operation code before its CDB is looked at, and
//!   a change of what is offered raises INQUIRY DATA HAS CHANGED on every
//!   nexus;
//! - a write-protected unit (a read-only device, or software write protect)
//!   says so in MODE SENSE (WP) and refuses every command that would change
//!   its medium, EXTENDED COPY into it included, with DATA PROTECT before
//!   touching the device.

use super::cdb::{self, Cdb, Transfer};
use super::copy::{self, CopyLimits, CopyRecord, CopyRequest};
use super::environment::{EnvironmentError, Offloads, UnitEnvironment, VersionedReservations};
use super::inquiry::{self, VpdContext};
use super::mode::{self, ModeSenseRequest, ModeState};
use super::reservations::{self, Access, ProutError, ReservationState};
use super::sense::{asc, key, Sense};
use super::{Command, Nexus, Reset, Response, Status, TaskAttribute};
use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use tessera_blockdev::{BlockDevice, BlockError, ExtentKind, WriteFlags, ZeroMode};

/// Logical block sizes a unit serves: 512 bytes over 4 KiB physical blocks
/// ("512e", the default: every initiator takes it) and 4096 ("4Kn").
pub const BLOCK_SIZES: [u32; 2] = [512, 4096];

/// What a unit reports about itself and the limits it enforces. The limits
/// counted in blocks are given for 512-byte logical blocks; a unit with
/// larger blocks keeps their size in bytes (see
/// [`UnitSettings::for_block_bytes`]).
#[derive(Debug, Clone)]
pub struct UnitSettings {
    /// T10 vendor identification (8 characters).
    pub vendor: String,
    /// Product identification (16 characters).
    pub product: String,
    /// Product revision level (4 characters).
    pub revision: String,
    /// Logical blocks per physical block, as a power of two (3: 4 KiB
    /// physical blocks under 512-byte logical blocks, "512e").
    pub physical_exponent: u8,
    /// Maximum transfer length, in blocks.
    pub max_transfer_blocks: u32,
    /// Optimal transfer length, in blocks.
    pub optimal_transfer_blocks: u32,
    /// Maximum COMPARE AND WRITE length, in blocks.
    pub max_compare_and_write_blocks: u8,
    /// Maximum WRITE ATOMIC length, in blocks (also the longest ORWRITE
    /// done as one uninterrupted read-modify-write).
    pub max_atomic_blocks: u32,
    /// Maximum WRITE SAME length, in blocks.
    pub max_write_same_blocks: u64,
    /// Maximum blocks one UNMAP may name.
    pub max_unmap_blocks: u32,
    /// Maximum UNMAP block descriptors.
    pub max_unmap_descriptors: u32,
    /// Datastore use, in percent of its capacity, past which the unit
    /// raises THIN PROVISIONING SOFT THRESHOLD REACHED once.
    pub soft_threshold_percent: Option<u8>,
    /// EXTENDED COPY limits.
    pub copy_limits: CopyLimits,
    /// Bytes a WRITE SAME of a pattern writes per device call.
    pub write_same_chunk_bytes: u64,
}

impl Default for UnitSettings {
    fn default() -> Self {
        UnitSettings {
            vendor: "TESSERA".into(),
            product: "VOLUME".into(),
            revision: "0001".into(),
            physical_exponent: 3,
            max_transfer_blocks: 32768,
            optimal_transfer_blocks: 2048,
            max_compare_and_write_blocks: 255,
            max_atomic_blocks: 2048,
            // A 16-bit count, so a WRITE SAME is never longer than a WRITE
            // SAME(10) can say; zeroing and unmapping take no data anyway.
            max_write_same_blocks: 0xFFFF,
            max_unmap_blocks: 1 << 20,
            max_unmap_descriptors: 256,
            soft_threshold_percent: Some(80),
            copy_limits: CopyLimits::default(),
            write_same_chunk_bytes: 1 << 20,
        }
    }
}

impl UnitSettings {
    /// These settings for a unit whose logical blocks are `block_bytes`
    /// long: every limit keeps its size in bytes (at least one block), and
    /// the physical block keeps its size (so 4 KiB physical blocks are one
    /// logical block of a 4Kn unit).
    pub fn for_block_bytes(mut self, block_bytes: u32) -> UnitSettings {
        let factor = (block_bytes / 512).max(1);
        if factor == 1 {
            return self;
        }
        let scale = |n: u32| (n / factor).max(1);
        self.max_transfer_blocks = scale(self.max_transfer_blocks);
        self.optimal_transfer_blocks = scale(self.optimal_transfer_blocks);
        self.max_compare_and_write_blocks =
            (self.max_compare_and_write_blocks as u32 / factor).max(1) as u8;
        self.max_atomic_blocks = scale(self.max_atomic_blocks);
        self.max_write_same_blocks = (self.max_write_same_blocks / factor as u64).max(1);
        self.max_unmap_blocks = scale(self.max_unmap_blocks);
        self.physical_exponent = self
            .physical_exponent
            .saturating_sub(factor.trailing_zeros() as u8);
        self
    }
}

/// Per-unit offload counters, like esxtop's VAAI columns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VaaiCounters {
    /// COMPARE AND WRITE commands (ATS).
    pub ats: u64,
    /// COMPARE AND WRITE commands that miscompared.
    pub ats_miscompare: u64,
    /// EXTENDED COPY commands (CLONE).
    pub clone_commands: u64,
    /// Blocks read for EXTENDED COPY (this unit the source).
    pub clone_read_blocks: u64,
    /// Blocks written by EXTENDED COPY (this unit the destination).
    pub clone_write_blocks: u64,
    /// Blocks zeroed by WRITE SAME (ZERO).
    pub zero_blocks: u64,
    /// Blocks deallocated by UNMAP or WRITE SAME with UNMAP (DELETE).
    pub delete_blocks: u64,
    /// Commands that failed for lack of datastore space.
    pub out_of_space: u64,
}

#[derive(Default)]
struct Counters {
    ats: AtomicU64,
    ats_miscompare: AtomicU64,
    clone_commands: AtomicU64,
    clone_read_blocks: AtomicU64,
    clone_write_blocks: AtomicU64,
    zero_blocks: AtomicU64,
    delete_blocks: AtomicU64,
    out_of_space: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// Why a command did not complete with GOOD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// CHECK CONDITION with this sense.
    Check(Sense),
    /// RESERVATION CONFLICT.
    Conflict,
    /// BUSY: shared state kept changing under us.
    Busy,
}

impl From<Sense> for Failure {
    fn from(s: Sense) -> Self {
        Failure::Check(s)
    }
}

type Outcome = Result<Bytes, Failure>;

/// How many times a reservation update is retried against concurrent ones.
const RESERVATION_RETRIES: usize = 32;

/// A logical unit.
pub struct LogicalUnit {
    device: Arc<dyn BlockDevice>,
    /// The device's logical block size (one of [`BLOCK_SIZES`]).
    block_bytes: u64,
    environment: Arc<dyn UnitEnvironment>,
    settings: UnitSettings,
    mode: Mutex<ModeState>,
    /// Pending unit attentions of every nexus that has been seen.
    attentions: Mutex<HashMap<Nexus, VecDeque<(u8, u8)>>>,
    copies: Mutex<HashMap<(Nexus, u8), CopyRecord>>,
    counters: Counters,
    last_size: AtomicU64,
    over_threshold: AtomicBool,
    /// The offloads offered at the last command, as [`offload_bits`].
    offered: AtomicU8,
    /// SIMPLE commands take it shared, ORDERED ones exclusively.
    ordering: tokio::sync::RwLock<()>,
    /// The latest shared attention this unit has raised (`None` until the
    /// first command: older attentions are not for nexuses that came later).
    seen_attention: Mutex<Option<u64>>,
}

fn env_unavailable(e: EnvironmentError) -> Failure {
    tracing::warn!(error = %e, "reservation state unavailable");
    Failure::Check(Sense::new(
        key::NOT_READY,
        asc::NOT_READY_ASYMMETRIC_TRANSITION,
    ))
}

impl LogicalUnit {
    /// A unit over `device` with `environment`, in the device's logical
    /// block size (512 unless it reports 4096); `settings` are given for
    /// 512-byte blocks and scaled to it.
    pub fn new(
        device: Arc<dyn BlockDevice>,
        environment: Arc<dyn UnitEnvironment>,
        settings: UnitSettings,
    ) -> Self {
        let info = device.info();
        let size = info.size_bytes;
        let block_bytes = if BLOCK_SIZES.contains(&info.logical_block_bytes) {
            info.logical_block_bytes
        } else {
            tracing::warn!(
                volume = %info.name,
                block_bytes = info.logical_block_bytes,
                "unsupported logical block size; the unit serves 512-byte blocks"
            );
            512
        };
        let offered = offload_bits(environment.offloads());
        LogicalUnit {
            device,
            block_bytes: block_bytes as u64,
            settings: settings.for_block_bytes(block_bytes),
            environment,
            mode: Mutex::new(ModeState::default()),
            attentions: Mutex::new(HashMap::new()),
            copies: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            last_size: AtomicU64::new(size),
            over_threshold: AtomicBool::new(false),
            offered: AtomicU8::new(offered),
            ordering: tokio::sync::RwLock::new(()),
            seen_attention: Mutex::new(None),
        }
    }

    /// The device served.
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    /// Settings.
    pub fn settings(&self) -> &UnitSettings {
        &self.settings
    }

    /// The offload counters so far.
    pub fn counters(&self) -> VaaiCounters {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        VaaiCounters {
            ats: get(&c.ats),
            ats_miscompare: get(&c.ats_miscompare),
            clone_commands: get(&c.clone_commands),
            clone_read_blocks: get(&c.clone_read_blocks),
            clone_write_blocks: get(&c.clone_write_blocks),
            zero_blocks: get(&c.zero_blocks),
            delete_blocks: get(&c.delete_blocks),
            out_of_space: get(&c.out_of_space),
        }
    }

    /// The unit's NAA designator (VPD 0x83).
    pub fn designator(&self) -> [u8; 16] {
        inquiry::naa_designator(self.device.info().serial)
    }

    fn blocks(&self) -> u64 {
        self.device.info().size_bytes / self.block_bytes
    }

    fn descriptor_sense(&self) -> bool {
        self.mode.lock().descriptor_sense
    }

    /// Raises a unit attention for every nexus seen, except `except`.
    pub fn raise_attention(&self, code: (u8, u8), except: Option<&Nexus>) {
        for (nexus, queue) in self.attentions.lock().iter_mut() {
            if Some(nexus) != except && !queue.contains(&code) {
                queue.push_back(code);
            }
        }
    }

    fn raise_for(&self, nexus: &Nexus, code: (u8, u8)) {
        if let Some(queue) = self.attentions.lock().get_mut(nexus) {
            if !queue.contains(&code) {
                queue.push_back(code);
            }
        }
    }

    /// First contact of a nexus: it starts with POWER ON, RESET OR BUS
    /// DEVICE RESET OCCURRED.
    fn register_nexus(&self, nexus: &Nexus) {
        let size = self.device.info().size_bytes;
        if self.last_size.swap(size, Ordering::Relaxed) != size {
            self.raise_attention(asc::CAPACITY_DATA_CHANGED, None);
        }
        self.attentions
            .lock()
            .entry(nexus.clone())
            .or_insert_with(|| VecDeque::from([asc::POWER_ON_RESET]));
    }

    /// Raises the shared attentions other paths and hosts recorded since
    /// this unit last looked.
    async fn catch_up_attentions(&self, now: bool) {
        let current = if now {
            self.environment.reservations_now().await
        } else {
            self.environment.reservations().await
        };
        let Ok(current) = current else {
            return;
        };
        let latest = current.state.attention_sequence();
        let mut seen = self.seen_attention.lock();
        let from = match *seen {
            Some(s) if s < latest => s,
            Some(_) => return,
            None => {
                *seen = Some(latest);
                return;
            }
        };
        for a in current
            .state
            .attentions
            .iter()
            .filter(|a| a.sequence > from)
        {
            match &a.nexus {
                Some(n) => self.raise_for(n, a.code),
                None => self.raise_attention(a.code, a.except.as_ref()),
            }
        }
        *seen = Some(latest);
    }

    fn take_attention(&self, nexus: &Nexus) -> Option<(u8, u8)> {
        self.attentions.lock().get_mut(nexus)?.pop_front()
    }

    /// Runs one command addressed to this unit.
    pub async fn execute(&self, command: &Command) -> Response {
        let (_exclusive, _shared) = match command.attribute {
            TaskAttribute::Ordered => (Some(self.ordering.write().await), None),
            TaskAttribute::HeadOfQueue => (None, None),
            _ => (None, Some(self.ordering.read().await)),
        };
        let opcode = command.cdb.first().copied().unwrap_or(0xFF);
        self.register_nexus(&command.nexus);
        self.catch_up_attentions(!cdb::is_data_transfer(opcode))
            .await;
        let offloads = self.offloads_now();
        let exempt = matches!(
            opcode,
            cdb::op::INQUIRY | cdb::op::REPORT_LUNS | cdb::op::REQUEST_SENSE
        );
        let outcome = if !exempt {
            match self.take_attention(&command.nexus) {
                Some(code) => Err(Failure::Check(Sense::new(key::UNIT_ATTENTION, code))),
                None => self.decode_and_run(command, offloads).await,
            }
        } else {
            self.decode_and_run(command, offloads).await
        };
        self.respond(command, outcome)
    }

    fn respond(&self, command: &Command, outcome: Outcome) -> Response {
        let data_out_used = expected_data_out(&command.cdb, self.block_bytes);
        match outcome {
            Ok(mut data) => {
                data.truncate(command.expected_data_in as usize);
                Response {
                    status: Status::Good,
                    sense: None,
                    data_in: data,
                    data_out_used,
                }
            }
            Err(Failure::Check(sense)) => Response {
                status: Status::CheckCondition,
                sense: Some(sense.encode(self.descriptor_sense())),
                data_in: Bytes::new(),
                data_out_used,
            },
            Err(Failure::Conflict) => Response {
                status: Status::ReservationConflict,
                sense: None,
                data_in: Bytes::new(),
                data_out_used,
            },
            Err(Failure::Busy) => Response {
                status: Status::Busy,
                sense: None,
                data_in: Bytes::new(),
                data_out_used,
            },
        }
    }

    /// The offloads the environment offers now; when they changed since
    /// the last command, every nexus hears that the INQUIRY data changed
    /// (so an initiator reads the VPD pages again).
    fn offloads_now(&self) -> Offloads {
        let offloads = self.environment.offloads();
        let bits = offload_bits(offloads);
        if self.offered.swap(bits, Ordering::Relaxed) != bits {
            self.raise_attention(asc::INQUIRY_DATA_HAS_CHANGED, None);
        }
        offloads
    }

    async fn decode_and_run(&self, command: &Command, offloads: Offloads) -> Outcome {
        if !offloads.offers(command.cdb.first().copied().unwrap_or(0xFF)) {
            return Err(Sense::illegal(asc::INVALID_COMMAND_OPERATION_CODE).into());
        }
        let cdb = cdb::decode(&command.cdb)?;
        let access = access_of(&cdb);
        if access != Access::Always {
            let current = self.reservations().await?;
            if current.state.conflicts(&command.nexus, access) {
                return Err(Failure::Conflict);
            }
        }
        let writes = access == Access::Write;
        let result = self.run(command, cdb, offloads).await;
        if writes {
            if let Err(Failure::Check(s)) = &result {
                if (s.asc, s.ascq) == asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT {
                    bump(&self.counters.out_of_space, 1);
                }
            }
            self.check_soft_threshold();
        }
        result
    }

    async fn reservations(&self) -> Result<VersionedReservations, Failure> {
        self.environment
            .reservations()
            .await
            .map_err(env_unavailable)
    }

    fn check_soft_threshold(&self) {
        let Some(space) = self.environment.datastore_space() else {
            return;
        };
        let Some(percent) = space
            .soft_threshold_percent
            .or(self.settings.soft_threshold_percent)
        else {
            return;
        };
        if space.capacity_bytes == 0 {
            return;
        }
        let over = space.used_bytes as u128 * 100 >= space.capacity_bytes as u128 * percent as u128;
        if over {
            if !self.over_threshold.swap(true, Ordering::Relaxed) {
                self.raise_attention(asc::THIN_PROVISIONING_SOFT_THRESHOLD_REACHED, None);
            }
        } else {
            self.over_threshold.store(false, Ordering::Relaxed);
        }
    }

    fn block_error(&self, e: &BlockError, writing: bool) -> Failure {
        Failure::Check(Sense::from_block_error(e, self.block_bytes, writing))
    }

    fn check_range(&self, lba: u64, blocks: u64) -> Result<(), Failure> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.blocks() => Ok(()),
            _ => Err(Sense::lba_out_of_range().into()),
        }
    }

    fn check_writable(&self) -> Result<(), Failure> {
        if self.device.info().read_only {
            return Err(Sense::new(key::DATA_PROTECT, asc::WRITE_PROTECTED).into());
        }
        if self.mode.lock().software_write_protect {
            return Err(Sense::new(key::DATA_PROTECT, asc::SOFTWARE_WRITE_PROTECTED).into());
        }
        Ok(())
    }

    fn check_transfer(&self, t: &Transfer) -> Result<(), Failure> {
        if t.blocks == 0 {
            if t.lba > self.blocks() {
                return Err(Sense::lba_out_of_range().into());
            }
            return Ok(());
        }
        self.check_range(t.lba, t.blocks as u64)?;
        if t.blocks > self.settings.max_transfer_blocks {
            return Err(Sense::invalid_cdb_field(0, None).into());
        }
        Ok(())
    }

    fn write_flags(&self, fua: bool) -> WriteFlags {
        WriteFlags {
            fua: fua || !self.mode.lock().write_cache,
        }
    }

    async fn run(&self, command: &Command, cdb: Cdb, offloads: Offloads) -> Outcome {
        let nexus = &command.nexus;
        let data = &command.data_out;
        match cdb {
            Cdb::TestUnitReady => Ok(Bytes::new()),
            Cdb::RequestSense { descriptor, alloc } => {
                let sense = match self.take_attention(nexus) {
                    Some(code) => Sense::new(key::UNIT_ATTENTION, code),
                    None => Sense::new(key::NO_SENSE, asc::NO_ADDITIONAL_SENSE),
                };
                Ok(truncate(sense.encode(descriptor), alloc))
            }
            Cdb::Inquiry { evpd, page, alloc } => {
                if !evpd {
                    return Ok(truncate(
                        inquiry::standard(&self.settings, true, offloads.extended_copy),
                        alloc,
                    ));
                }
                let info = self.device.info();
                let groups = self.environment.port_groups();
                let ctx = VpdContext {
                    info: &info,
                    settings: &self.settings,
                    relative_port: nexus.relative_port,
                    port_groups: &groups,
                    offloads,
                };
                inquiry::vpd(&ctx, page)
                    .map(|p| truncate(p, alloc))
                    .ok_or_else(|| Sense::invalid_cdb_field(2, None).into())
            }
            Cdb::ReadCapacity10 => {
                let last = self.blocks().saturating_sub(1).min(u32::MAX as u64) as u32;
                let mut out = BytesMut::with_capacity(8);
                out.put_u32(last);
                out.put_u32(self.block_bytes as u32);
                Ok(out.freeze())
            }
            Cdb::ReadCapacity16 { alloc } => {
                let mut out = BytesMut::with_capacity(32);
                out.put_u64(self.blocks().saturating_sub(1));
                out.put_u32(self.block_bytes as u32);
                out.put_u8(0);
                out.put_u8(self.settings.physical_exponent & 0x0F);
                out.put_u8(0x80 | 0x40); // LBPME, LBPRZ; lowest aligned LBA 0
                out.put_u8(0);
                out.put_bytes(0, 16);
                Ok(truncate(out.freeze(), alloc))
            }
            Cdb::Read(t) => {
                self.check_transfer(&t)?;
                let len = (t.blocks as u64 * self.block_bytes).min(command.expected_data_in as u64);
                if len == 0 {
                    return Ok(Bytes::new());
                }
                self.device
                    .read(t.lba * self.block_bytes, len)
                    .await
                    .map_err(|e| self.block_error(&e, false))
            }
            Cdb::Write(t) => {
                self.check_writable()?;
                self.check_transfer(&t)?;
                self.write_blocks(&t, data).await?;
                Ok(Bytes::new())
            }
            Cdb::WriteAndVerify(t) => {
                self.check_writable()?;
                self.check_transfer(&t)?;
                let written = self.write_blocks(&t, data).await?;
                if written > 0 {
                    let back = self
                        .device
                        .read(t.lba * self.block_bytes, written)
                        .await
                        .map_err(|e| self.block_error(&e, false))?;
                    if let Some(at) =
                        tessera_blockdev::first_difference(&back, &data[..written as usize])
                    {
                        return Err(Sense::new(key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY)
                            .with_information(at as u64)
                            .into());
                    }
                }
                Ok(Bytes::new())
            }
            Cdb::Verify { range, bytchk } => self.verify(&range, bytchk, data).await,
            Cdb::SynchronizeCache { lba, blocks } => {
                if blocks == 0 {
                    if lba > self.blocks() {
                        return Err(Sense::lba_out_of_range().into());
                    }
                } else {
                    self.check_range(lba, blocks as u64)?;
                }
                self.device
                    .flush()
                    .await
                    .map_err(|e| self.block_error(&e, true))?;
                Ok(Bytes::new())
            }
            Cdb::PreFetch { lba, blocks } => {
                let blocks = if blocks == 0 {
                    if lba > self.blocks() {
                        return Err(Sense::lba_out_of_range().into());
                    }
                    self.blocks() - lba
                } else {
                    self.check_range(lba, blocks as u64)?;
                    blocks as u64
                };
                self.device
                    .cache(lba * self.block_bytes, blocks * self.block_bytes)
                    .await
                    .map_err(|e| self.block_error(&e, false))?;
                Ok(Bytes::new())
            }
            Cdb::ModeSense {
                ten,
                dbd,
                llbaa,
                page_control,
                page,
                subpage,
                alloc,
            } => {
                let state = *self.mode.lock();
                let info = self.device.info();
                let req = ModeSenseRequest {
                    ten,
                    dbd,
                    llbaa,
                    page_control,
                    page,
                    subpage,
                };
                let protected = info.read_only || state.software_write_protect;
                let data = mode::mode_sense(
                    &req,
                    &state,
                    self.blocks(),
                    self.block_bytes as u32,
                    protected,
                )?;
                Ok(truncate(data, alloc))
            }
            Cdb::ModeSelect {
                ten, save, length, ..
            } => {
                let current = *self.mode.lock();
                let next =
                    mode::mode_select(ten, save, length, data, &current, self.block_bytes as u32)?;
                if next != current {
                    *self.mode.lock() = next;
                    self.raise_attention(asc::MODE_PARAMETERS_CHANGED, Some(nexus));
                }
                Ok(Bytes::new())
            }
            Cdb::ReportLuns { .. } => {
                Err(Sense::illegal(asc::INVALID_COMMAND_OPERATION_CODE).into())
            }
            Cdb::ReportSupportedOpcodes {
                rctd,
                options,
                opcode,
                service_action,
                alloc,
            } => Ok(truncate(
                report_supported_opcodes(rctd, options, opcode, service_action, offloads)?,
                alloc,
            )),
            Cdb::ReportTargetPortGroups { extended, alloc } => Ok(truncate(
                inquiry::target_port_groups(&self.environment.port_groups(), extended),
                alloc,
            )),
            Cdb::Reserve6 => {
                let done = self
                    .update_reservations(|s| {
                        if s.reserve_legacy(nexus) {
                            Ok(Vec::new())
                        } else {
                            Err(ProutError::Conflict)
                        }
                    })
                    .await?;
                done.map(|_| Bytes::new())
            }
            Cdb::Release6 => {
                self.update_reservations(|s| {
                    s.release_legacy(nexus);
                    Ok(Vec::new())
                })
                .await??;
                Ok(Bytes::new())
            }
            Cdb::PersistentReserveIn {
                service_action,
                alloc,
            } => {
                let current = self
                    .environment
                    .reservations_now()
                    .await
                    .map_err(env_unavailable)?;
                reservations::prin_data(&current.state, service_action)
                    .map(|d| truncate(d, alloc))
                    .ok_or_else(|| Sense::invalid_cdb_field(1, Some(4)).into())
            }
            Cdb::PersistentReserveOut {
                service_action,
                scope,
                kind,
                length,
            } => {
                let params = reservations::parse_prout_parameters(length, data)?;
                self.update_reservations(|s| {
                    let attentions =
                        reservations::apply_prout(s, nexus, service_action, scope, kind, &params)?;
                    for (who, code) in attentions {
                        s.share_attention(Some(who), None, code);
                    }
                    Ok(Vec::new())
                })
                .await??;
                // The other registrants may be on this host: tell them now.
                self.catch_up_attentions(true).await;
                Ok(Bytes::new())
            }
            Cdb::StartStopUnit { start, .. } => {
                // A volume shared by many hosts is never stopped by one of
                // them; stopping makes what was written durable.
                if !start {
                    self.device
                        .flush()
                        .await
                        .map_err(|e| self.block_error(&e, true))?;
                }
                Ok(Bytes::new())
            }
            Cdb::GetLbaStatus { lba, alloc } => self.get_lba_status(lba, alloc).await,
            Cdb::CompareAndWrite { lba, blocks, .. } => {
                self.compare_and_write(lba, blocks, data).await
            }
            Cdb::ExtendedCopy { length } => self.extended_copy(nexus, length, data).await,
            Cdb::ReceiveCopyResults {
                service_action,
                list_id,
                alloc,
            } => {
                let limits = &self.settings.copy_limits;
                let data = match service_action as u16 {
                    cdb::sa::OPERATING_PARAMETERS => copy::operating_parameters(limits),
                    sa => {
                        let record = self
                            .copies
                            .lock()
                            .get(&(nexus.clone(), list_id))
                            .cloned()
                            .ok_or_else(|| Failure::from(Sense::invalid_cdb_field(2, None)))?;
                        if sa == cdb::sa::COPY_STATUS {
                            copy::copy_status(&record)
                        } else {
                            copy::failed_segment_details(&record, self.descriptor_sense())
                        }
                    }
                };
                Ok(truncate(data, alloc))
            }
            Cdb::WriteSame {
                lba,
                blocks,
                unmap,
                ndob,
            } => {
                self.write_same(lba, blocks, unmap, ndob, data, command.cdb[0])
                    .await
            }
            Cdb::Unmap { length } => self.unmap(length, data).await,
            Cdb::OrWrite(t) => {
                self.check_writable()?;
                self.check_transfer(&t)?;
                self.rewrite_atomically(&t, data, |old, new| {
                    old.iter().zip(new).map(|(a, b)| a | b).collect()
                })
                .await?;
                Ok(Bytes::new())
            }
            Cdb::WriteAtomic(t) => {
                self.check_writable()?;
                self.check_transfer(&t)?;
                if t.blocks > self.settings.max_atomic_blocks {
                    return Err(Sense::invalid_cdb_field(12, None).into());
                }
                self.rewrite_atomically(&t, data, |_, new| new.to_vec())
                    .await?;
                Ok(Bytes::new())
            }
            Cdb::ReadDefectData {
                twelve,
                primary,
                grown,
                format,
                alloc,
            } => {
                // Blocks live in the datastore, which keeps its own spares:
                // the unit has no defect list of either kind, so both are
                // valid and empty in the format asked for.
                let flags = (primary as u8) << 4 | (grown as u8) << 3 | format;
                let header: &[u8] = if twelve {
                    &[0, flags, 0, 0, 0, 0, 0, 0]
                } else {
                    &[0, flags, 0, 0]
                };
                Ok(truncate(Bytes::copy_from_slice(header), alloc))
            }
        }
    }

    /// Writes the whole blocks the initiator sent (at most what the CDB
    /// asks for); returns the bytes written.
    async fn write_blocks(&self, t: &Transfer, data: &Bytes) -> Result<u64, Failure> {
        let wanted = t.blocks as u64 * self.block_bytes;
        let len = wanted.min(data.len() as u64) / self.block_bytes * self.block_bytes;
        if len == 0 {
            return Ok(0);
        }
        self.device
            .write(
                t.lba * self.block_bytes,
                data.slice(..len as usize),
                self.write_flags(t.fua),
            )
            .await
            .map_err(|e| self.block_error(&e, true))?;
        Ok(len)
    }

    /// Replaces the blocks of `t` with `combine(current, sent)` so that no
    /// other command, from any path or host, sees or interleaves with a half
    /// done update: the device's compare-and-write (atomic against every
    /// other command) stores the result only if the blocks still hold what
    /// was read, and a lost race reads again.
    async fn rewrite_atomically(
        &self,
        t: &Transfer,
        data: &Bytes,
        combine: impl Fn(&[u8], &[u8]) -> Vec<u8>,
    ) -> Result<(), Failure> {
        let wanted = t.blocks as u64 * self.block_bytes;
        let len = wanted.min(data.len() as u64) / self.block_bytes * self.block_bytes;
        if len == 0 {
            return Ok(());
        }
        let offset = t.lba * self.block_bytes;
        let sent = &data[..len as usize];
        for _ in 0..RESERVATION_RETRIES {
            let current = self
                .device
                .read(offset, len)
                .await
                .map_err(|e| self.block_error(&e, false))?;
            let next = Bytes::from(combine(&current, sent));
            match self.device.compare_and_write(offset, current, next).await {
                Ok(()) => {
                    if self.write_flags(t.fua).fua {
                        self.device
                            .flush()
                            .await
                            .map_err(|e| self.block_error(&e, true))?;
                    }
                    return Ok(());
                }
                Err(BlockError::Miscompare { .. }) => continue,
                Err(e) => return Err(self.block_error(&e, true)),
            }
        }
        Err(Failure::Busy)
    }

    async fn verify(&self, range: &Transfer, bytchk: u8, data: &Bytes) -> Outcome {
        self.check_transfer(range)?;
        if range.blocks == 0 {
            return Ok(Bytes::new());
        }
        let len = range.blocks as u64 * self.block_bytes;
        let expected: Option<Bytes> = match bytchk {
            0 => None,
            1 => {
                if (data.len() as u64) < len {
                    return Err(Sense::invalid_cdb_field(1, Some(2)).into());
                }
                Some(data.slice(..len as usize))
            }
            _ => {
                if (data.len() as u64) < self.block_bytes {
                    return Err(Sense::invalid_cdb_field(1, Some(2)).into());
                }
                let block = &data[..self.block_bytes as usize];
                let mut all = BytesMut::with_capacity(len as usize);
                for _ in 0..range.blocks {
                    all.put_slice(block);
                }
                Some(all.freeze())
            }
        };
        let medium = self
            .device
            .read(range.lba * self.block_bytes, len)
            .await
            .map_err(|e| self.block_error(&e, false))?;
        if let Some(expected) = expected {
            if let Some(at) = tessera_blockdev::first_difference(&medium, &expected) {
                return Err(Sense::new(key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY)
                    .with_information(at as u64)
                    .into());
            }
        }
        Ok(Bytes::new())
    }

    async fn get_lba_status(&self, lba: u64, alloc: u32) -> Outcome {
        let blocks = self.blocks();
        if lba >= blocks {
            return Err(Sense::lba_out_of_range().into());
        }
        // Bound the map asked of the device; the initiator asks again from
        // where the reply ends.
        let span = (blocks - lba).min(1 << 21) * self.block_bytes;
        let extents = self
            .device
            .block_status(lba * self.block_bytes, span)
            .await
            .map_err(|e| self.block_error(&e, false))?;
        let max_descriptors = ((alloc as usize).saturating_sub(8) / 16).clamp(1, 1024);
        let mut descriptors: Vec<(u64, u64, u8)> = Vec::new();
        for e in extents {
            let status = if e.kind == ExtentKind::Hole { 1 } else { 0 };
            let first = e.offset / self.block_bytes;
            let end = (e.offset + e.len).div_ceil(self.block_bytes);
            let covered = descriptors
                .last()
                .map_or(first, |l: &(u64, u64, u8)| l.0 + l.1);
            match descriptors.last_mut() {
                Some(last) if last.2 == status && covered >= first => {
                    last.1 = last.1.max(end - last.0);
                }
                // A partial block shared by two extents is reported with the
                // earlier one.
                Some(_) if end <= covered => {}
                Some(_) => descriptors.push((covered, end - covered, status)),
                None => descriptors.push((first, end - first, status)),
            }
            if descriptors.len() > max_descriptors {
                descriptors.truncate(max_descriptors);
                break;
            }
        }
        let mut out = BytesMut::with_capacity(8 + 16 * descriptors.len());
        out.put_u32(4 + 16 * descriptors.len() as u32);
        out.put_u32(0);
        for (first, count, status) in descriptors {
            out.put_u64(first);
            out.put_u32(count.min(u32::MAX as u64) as u32);
            out.put_u8(status);
            out.put_bytes(0, 3);
        }
        Ok(truncate(out.freeze(), alloc))
    }

    async fn compare_and_write(&self, lba: u64, blocks: u32, data: &Bytes) -> Outcome {
        self.check_writable()?;
        if blocks > self.settings.max_compare_and_write_blocks as u32 {
            return Err(Sense::invalid_cdb_field(13, None).into());
        }
        self.check_range(lba, blocks as u64)?;
        let half = blocks as usize * self.block_bytes as usize;
        if data.len() != 2 * half {
            return Err(Sense::invalid_cdb_field(13, None).into());
        }
        if blocks == 0 {
            return Ok(Bytes::new());
        }
        bump(&self.counters.ats, 1);
        match self
            .device
            .compare_and_write(
                lba * self.block_bytes,
                data.slice(..half),
                data.slice(half..),
            )
            .await
        {
            Ok(()) => Ok(Bytes::new()),
            Err(BlockError::Miscompare { offset }) => {
                bump(&self.counters.ats_miscompare, 1);
                Err(Sense::new(key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY)
                    .with_information(offset)
                    .into())
            }
            Err(e) => Err(self.block_error(&e, true)),
        }
    }

    async fn write_same(
        &self,
        lba: u64,
        blocks: u64,
        unmap: bool,
        ndob: bool,
        data: &Bytes,
        opcode: u8,
    ) -> Outcome {
        // Write protect is reported before anything else of the command is
        // looked at (LIO does the same): an UNMAP variant without data is
        // refused as a write, not as a short data-out.
        self.check_writable()?;
        let total = self.blocks();
        if lba > total {
            return Err(Sense::lba_out_of_range().into());
        }
        let blocks = if blocks == 0 { total - lba } else { blocks };
        self.check_range(lba, blocks)?;
        if blocks > self.settings.max_write_same_blocks {
            let at = if opcode == cdb::op::WRITE_SAME_10 {
                7
            } else {
                10
            };
            return Err(Sense::invalid_cdb_field(at, None).into());
        }
        let pattern = if ndob {
            Bytes::from(vec![0u8; self.block_bytes as usize])
        } else {
            if data.len() != self.block_bytes as usize {
                return Err(Sense::invalid_cdb_field(
                    if opcode == cdb::op::WRITE_SAME_10 {
                        7
                    } else {
                        10
                    },
                    None,
                )
                .into());
            }
            data.clone()
        };
        if blocks == 0 {
            return Ok(Bytes::new());
        }
        let (offset, len) = (lba * self.block_bytes, blocks * self.block_bytes);
        // With UNMAP the range is deallocated whatever the block holds: the
        // unit reports LBPRZ, so it then reads as zeros, which is what
        // initiators that send UNMAP mean (and what LIO and tgt do).
        if unmap || pattern.iter().all(|&b| b == 0) {
            if unmap {
                self.device
                    .unmap(offset, len)
                    .await
                    .map_err(|e| self.block_error(&e, true))?;
                bump(&self.counters.delete_blocks, blocks);
            } else {
                self.device
                    .write_zeroes(offset, len, ZeroMode::MayUnmap)
                    .await
                    .map_err(|e| self.block_error(&e, true))?;
                bump(&self.counters.zero_blocks, blocks);
            }
            return Ok(Bytes::new());
        }
        let chunk_blocks = (self.settings.write_same_chunk_bytes / self.block_bytes).max(1);
        let mut buffer =
            BytesMut::with_capacity((chunk_blocks.min(blocks) * self.block_bytes) as usize);
        for _ in 0..chunk_blocks.min(blocks) {
            buffer.put_slice(&pattern);
        }
        let buffer = buffer.freeze();
        let flags = self.write_flags(false);
        let mut done = 0;
        while done < blocks {
            let step = (blocks - done).min(chunk_blocks);
            self.device
                .write(
                    offset + done * self.block_bytes,
                    buffer.slice(..(step * self.block_bytes) as usize),
                    flags,
                )
                .await
                .map_err(|e| self.block_error(&e, true))?;
            done += step;
        }
        Ok(Bytes::new())
    }

    async fn unmap(&self, length: u32, data: &Bytes) -> Outcome {
        self.check_writable()?;
        let ranges = parse_unmap(
            length,
            data,
            self.blocks(),
            self.settings.max_unmap_blocks,
            self.settings.max_unmap_descriptors,
        )?;
        for (lba, blocks) in ranges {
            self.device
                .unmap(lba * self.block_bytes, blocks * self.block_bytes)
                .await
                .map_err(|e| self.block_error(&e, true))?;
            bump(&self.counters.delete_blocks, blocks);
        }
        Ok(Bytes::new())
    }

    fn resolve(&self, target: &copy::CopyTarget) -> Option<Arc<dyn BlockDevice>> {
        if target.designator == self.designator() {
            return Some(self.device.clone());
        }
        self.environment.resolve_designator(&target.designator)
    }

    async fn extended_copy(&self, nexus: &Nexus, length: u32, data: &Bytes) -> Outcome {
        let Some(request) = copy::parse_extended_copy(length, data, &self.settings.copy_limits)?
        else {
            return Ok(Bytes::new());
        };
        // A copy into this unit is a write to it: while the unit is write
        // protected it is refused as one (DATA PROTECT), before any segment
        // moves data. A write-protected destination elsewhere fails its own
        // segment (COPY ABORTED), as the copy manager reports it.
        let own = self.designator();
        let into_self = request.segments.iter().any(|segment| {
            request
                .targets
                .get(segment.destination as usize)
                .is_some_and(|t| t.designator == own)
        });
        if into_self {
            self.check_writable()?;
        }
        bump(&self.counters.clone_commands, 1);
        let mut record = CopyRecord {
            segments_processed: 0,
            bytes: 0,
            failure: None,
        };
        let result = self.run_copy(&request, &mut record).await;
        if let Err(sense) = &result {
            record.failure = Some(sense.clone());
        }
        if request.keep_status {
            self.copies
                .lock()
                .insert((nexus.clone(), request.list_id), record);
        }
        result.map(|_| Bytes::new()).map_err(Failure::Check)
    }

    async fn run_copy(&self, request: &CopyRequest, record: &mut CopyRecord) -> Result<(), Sense> {
        let own = self.designator();
        for (index, segment) in request.segments.iter().enumerate() {
            let lookup = |i: u16| {
                request
                    .targets
                    .get(i as usize)
                    .ok_or_else(|| copy::copy_aborted(asc::UNREACHABLE_COPY_TARGET, index))
            };
            let (source_target, destination_target) =
                (lookup(segment.source)?, lookup(segment.destination)?);
            let source = self
                .resolve(source_target)
                .ok_or_else(|| copy::copy_aborted(asc::UNREACHABLE_COPY_TARGET, index))?;
            let destination = self
                .resolve(destination_target)
                .ok_or_else(|| copy::copy_aborted(asc::UNREACHABLE_COPY_TARGET, index))?;
            // Both ends in one block size, the one each descriptor names: a
            // segment counts blocks, and the two would disagree on bytes.
            let block_bytes = source.info().logical_block_bytes;
            if source_target.block_bytes != block_bytes
                || destination_target.block_bytes != block_bytes
                || destination.info().logical_block_bytes != block_bytes
            {
                return Err(copy::copy_aborted(
                    asc::COPY_TARGET_DEVICE_NOT_REACHABLE,
                    index,
                ));
            }
            let block_bytes = block_bytes as u64;
            let blocks = segment.blocks as u64;
            let fits = |device: &Arc<dyn BlockDevice>, lba: u64| {
                lba.checked_add(blocks)
                    .and_then(|end| end.checked_mul(block_bytes))
                    .is_some_and(|end| end <= device.info().size_bytes)
            };
            if !fits(&source, segment.source_lba) || !fits(&destination, segment.destination_lba) {
                return Err(copy::copy_aborted(asc::NO_ADDITIONAL_SENSE, index)
                    .with_information(index as u64));
            }
            if destination.info().read_only
                || (destination_target.designator == own && self.mode.lock().software_write_protect)
            {
                return Err(copy::copy_aborted(asc::WRITE_PROTECTED, index));
            }
            if blocks > 0 {
                destination
                    .copy_from(
                        source.as_ref(),
                        segment.source_lba * block_bytes,
                        segment.destination_lba * block_bytes,
                        blocks * block_bytes,
                    )
                    .await
                    .map_err(|e| {
                        let inner = Sense::from_block_error(&e, block_bytes, true);
                        copy::copy_aborted((inner.asc, inner.ascq), index)
                    })?;
            }
            if source_target.designator == own {
                bump(&self.counters.clone_read_blocks, blocks);
            }
            if destination_target.designator == own {
                bump(&self.counters.clone_write_blocks, blocks);
            }
            record.segments_processed += 1;
            record.bytes += blocks * block_bytes;
        }
        Ok(())
    }

    /// Applies `change` to the shared reservation state with
    /// compare-and-swap, retrying when another host or path wrote first.
    async fn update_reservations<F>(
        &self,
        mut change: F,
    ) -> Result<Result<reservations::Attentions, Failure>, Failure>
    where
        F: FnMut(&mut ReservationState) -> Result<reservations::Attentions, ProutError>,
    {
        for _ in 0..RESERVATION_RETRIES {
            let current = self
                .environment
                .reservations_now()
                .await
                .map_err(env_unavailable)?;
            let mut next = (*current.state).clone();
            let attentions = match change(&mut next) {
                Ok(a) => a,
                Err(ProutError::Conflict) => return Ok(Err(Failure::Conflict)),
                Err(ProutError::Check(s)) => return Ok(Err(Failure::Check(s))),
            };
            if next == *current.state {
                return Ok(Ok(attentions));
            }
            if self
                .environment
                .store_reservations(current.version, next)
                .await
                .map_err(env_unavailable)?
            {
                return Ok(Ok(attentions));
            }
        }
        Err(Failure::Busy)
    }

    /// A task management reset from `nexus` (SAM-5): RESERVE(6)
    /// reservations end, and every other nexus sees a unit attention.
    pub async fn reset(&self, nexus: &Nexus, reset: Reset) {
        let code = match reset {
            Reset::TargetCold => asc::POWER_ON_RESET,
            _ => asc::BUS_DEVICE_RESET,
        };
        if reset == Reset::TargetCold {
            *self.mode.lock() = ModeState::default();
        }
        // A LOGICAL UNIT RESET is seen by every nexus, the asking one too
        // (multipath initiators count it on every path); after a target
        // reset the asking nexus already knows from the function's response.
        let except = match reset {
            Reset::LogicalUnit(_) => None,
            _ => Some(nexus),
        };
        // A unit's first look at the shared state marks what came before
        // as seen: take that look before adding the reset.
        self.catch_up_attentions(true).await;
        // Every path on every host sees the reset: through the shared
        // state, which this host reads at once below and the others on
        // their next command.
        if let Ok(Err(f)) | Err(f) = self
            .update_reservations(|s| {
                s.drop_legacy(None);
                s.share_attention(None, except.cloned(), code);
                Ok(Vec::new())
            })
            .await
        {
            tracing::warn!(?f, "reset could not reach the shared reservation state");
            self.raise_attention(code, except);
        }
        self.catch_up_attentions(true).await;
    }

    /// A nexus ended: its RESERVE(6) reservation, unit attentions and copy
    /// results go. Persistent reservations stay (they are persistent).
    pub async fn nexus_ended(&self, nexus: &Nexus) {
        self.attentions.lock().remove(nexus);
        self.copies.lock().retain(|(n, _), _| n != nexus);
        let outcome = self
            .update_reservations(|s| {
                s.drop_legacy(Some(nexus));
                Ok(Vec::new())
            })
            .await;
        if let Ok(Err(f)) | Err(f) = outcome {
            tracing::warn!(
                ?f,
                "could not release the RESERVE(6) reservation of an ended nexus"
            );
        }
    }
}

fn truncate(mut data: Bytes, alloc: u32) -> Bytes {
    data.truncate(alloc as usize);
    data
}

/// How a decoded command touches the medium.
pub fn access_of(cdb: &Cdb) -> Access {
    match cdb {
        Cdb::TestUnitReady
        | Cdb::RequestSense { .. }
        | Cdb::Inquiry { .. }
        | Cdb::ReadCapacity10
        | Cdb::ReadCapacity16 { .. }
        | Cdb::ReportLuns { .. }
        | Cdb::ReportSupportedOpcodes { .. }
        | Cdb::ReportTargetPortGroups { .. }
        | Cdb::Release6
        | Cdb::Reserve6 => Access::Always,
        Cdb::PersistentReserveIn { .. } | Cdb::PersistentReserveOut { .. } => Access::Persistent,
        Cdb::Read(_)
        | Cdb::Verify { .. }
        | Cdb::PreFetch { .. }
        | Cdb::GetLbaStatus { .. }
        | Cdb::ReadDefectData { .. } => Access::Read,
        Cdb::StartStopUnit {
            start: true,
            power_condition: 0,
            ..
        } => Access::Always,
        _ => Access::Write,
    }
}

/// Bytes of data-out a CDB asks for (what `Response::data_out_used`
/// reports): the transport compares it with what the initiator sent.
pub fn expected_data_out(raw: &[u8], block_bytes: u64) -> u32 {
    let Ok(cdb) = cdb::decode(raw) else {
        return 0;
    };
    let blocks = |n: u64| (n * block_bytes).min(u32::MAX as u64) as u32;
    match cdb {
        Cdb::Write(t) | Cdb::WriteAndVerify(t) | Cdb::OrWrite(t) | Cdb::WriteAtomic(t) => {
            blocks(t.blocks as u64)
        }
        Cdb::Verify { range, bytchk: 1 } => blocks(range.blocks as u64),
        Cdb::Verify { bytchk: 3, .. } => block_bytes as u32,
        Cdb::CompareAndWrite { blocks: n, .. } => blocks(2 * n as u64),
        Cdb::WriteSame { ndob: false, .. } => block_bytes as u32,
        Cdb::ModeSelect { length, .. }
        | Cdb::PersistentReserveOut { length, .. }
        | Cdb::ExtendedCopy { length }
        | Cdb::Unmap { length } => length,
        _ => 0,
    }
}

/// Parses an UNMAP parameter list into `(lba, blocks)` ranges, checking
/// every one before any is applied.
pub fn parse_unmap(
    length: u32,
    data: &[u8],
    capacity_blocks: u64,
    max_blocks: u32,
    max_descriptors: u32,
) -> Result<Vec<(u64, u64)>, Sense> {
    let length = length as usize;
    if length == 0 {
        return Ok(Vec::new());
    }
    if length < 8 || data.len() < length {
        return Err(Sense::parameter_list_length());
    }
    let d = &data[..length];
    let descriptor_bytes = (u16::from_be_bytes([d[2], d[3]]) as usize).min(length - 8);
    let count = descriptor_bytes / 16;
    if count > max_descriptors as usize {
        return Err(Sense::invalid_parameter_field(2, None));
    }
    let mut total = 0u64;
    let mut ranges = Vec::with_capacity(count);
    for i in 0..count {
        let at = 8 + i * 16;
        let mut lba = [0u8; 8];
        lba.copy_from_slice(&d[at..at + 8]);
        let lba = u64::from_be_bytes(lba);
        let blocks = u32::from_be_bytes([d[at + 8], d[at + 9], d[at + 10], d[at + 11]]) as u64;
        match lba.checked_add(blocks) {
            Some(end) if end <= capacity_blocks => {}
            _ => return Err(Sense::lba_out_of_range()),
        }
        total += blocks;
        if total > max_blocks as u64 {
            return Err(Sense::invalid_parameter_field(at as u16 + 8, None));
        }
        if blocks > 0 {
            ranges.push((lba, blocks));
        }
    }
    Ok(ranges)
}

/// The offloads as bits, to notice a change with one atomic swap.
fn offload_bits(o: Offloads) -> u8 {
    o.compare_and_write as u8
        | (o.extended_copy as u8) << 1
        | (o.write_same as u8) << 2
        | (o.unmap as u8) << 3
}

/// REPORT SUPPORTED OPERATION CODES data, untruncated: the commands of
/// [`cdb::COMMANDS`] but the offloads not offered.
pub fn report_supported_opcodes(
    rctd: bool,
    options: u8,
    opcode: u8,
    service_action: u16,
    offloads: Offloads,
) -> Result<Bytes, Sense> {
    let timeouts = |out: &mut BytesMut, c: &cdb::CommandInfo| {
        out.put_u16(0x0A);
        out.put_u8(0);
        out.put_u8(0);
        out.put_u32(c.timeout_secs);
        out.put_u32(c.timeout_secs);
    };
    let mut out = BytesMut::new();
    match options {
        0 => {
            out.put_u32(0);
            for c in cdb::COMMANDS.iter().filter(|c| offloads.offers(c.opcode)) {
                out.put_u8(c.opcode);
                out.put_u8(0);
                out.put_u16(c.service_action.unwrap_or(0));
                out.put_u8(0);
                out.put_u8(
                    if rctd { 0x02 } else { 0 } | if c.service_action.is_some() { 0x01 } else { 0 },
                );
                out.put_u16(c.usage.len() as u16);
                if rctd {
                    timeouts(&mut out, c);
                }
            }
            let len = (out.len() - 4) as u32;
            out[0..4].copy_from_slice(&len.to_be_bytes());
        }
        1..=3 => {
            let has_sa = cdb::has_service_actions(opcode);
            let sa = match (options, has_sa) {
                (1, true) => return Err(Sense::invalid_cdb_field(2, Some(2))),
                (2, false) => return Err(Sense::invalid_cdb_field(2, Some(2))),
                (_, true) => Some(service_action),
                (_, false) => None,
            };
            match cdb::lookup(opcode, sa).filter(|c| offloads.offers(c.opcode)) {
                Some(c) => {
                    out.put_u8(0);
                    out.put_u8(if rctd { 0x80 } else { 0 } | 0x03);
                    out.put_u16(c.usage.len() as u16);
                    out.put_slice(c.usage);
                    if rctd {
                        timeouts(&mut out, c);
                    }
                }
                None => {
                    out.put_u8(0);
                    out.put_u8(0x01);
                    out.put_u16(0);
                }
            }
        }
        _ => return Err(Sense::invalid_cdb_field(2, Some(2))),
    }
    Ok(out.freeze())
}
