//! The full-feature phase of one connection (RFC 7143 sections 4.2, 11):
//! command numbering, data transfer, status, task management, text and
//! logout, as a state machine: PDUs and command completions in, actions out.
//!
//! Owns: the CmdSN window (ExpCmdSN, MaxCmdSN), StatSN, the task table
//! (data-out collection, R2Ts, Data-In splitting, residuals), the order in
//! which tasks start (CmdSN order and SAM task attributes), and the
//! protocol-error answers (Reject). Must not touch: sockets, the clock or
//! the SCSI device: the server runs [`Action::Execute`] and reports back
//! with [`FullFeature::complete`].
//! Invariants:
//! - non-immediate requests are taken in CmdSN order; one outside
//!   [ExpCmdSN, MaxCmdSN] or already seen is dropped without an answer;
//! - MaxCmdSN never moves backwards, and ExpCmdSN..=MaxCmdSN never admits
//!   more than [`MAX_TASKS`] tasks at once;
//! - a task receives exactly ExpectedDataTransferLength bytes of data-out,
//!   each byte from immediate data, unsolicited data below FirstBurstLength
//!   or an R2T this connection issued, before it runs;
//! - no PDU sent carries more data than the initiator's
//!   MaxRecvDataSegmentLength, no Data-In sequence more than MaxBurstLength;
//! - an aborted task never gets a response; every other task gets exactly
//!   one status.

use crate::catalog::TargetCatalog;
use crate::pdu::{
    self, lun_number, reject_reason, DataIn, DataOut, LogoutResponse, NopIn, NopOut, Pdu, R2t,
    Reject, Residual, ScsiCommand, ScsiResponse, TaskMgmtRequest, TaskMgmtResponse, TextRequest,
    TextResponse, RESERVED_TAG,
};
use crate::scsi::{self, Nexus, Reset, TaskAttribute};
use crate::text::{self, SessionParams, SessionType};
use bytes::{Bytes, BytesMut};
use std::collections::{HashMap, VecDeque};

/// Tasks one connection may hold at once (the CmdSN window).
pub const MAX_TASKS: u32 = 128;
/// Largest data-out buffer one command may announce, in bytes.
pub const MAX_TASK_DATA_OUT_BYTES: u32 = 64 * 1024 * 1024;
/// Data-out bytes solicited by R2Ts and not yet received, per connection:
/// bounds the memory an initiator can make the target reserve.
pub const MAX_SOLICITED_BYTES: u64 = 128 * 1024 * 1024;
/// Read length handed to the SCSI side: the device answers with what the
/// CDB asks for, at most this, and the transport truncates to the
/// initiator's ExpectedDataTransferLength, which is how it learns the
/// overflow residual.
pub const MAX_DATA_IN_BYTES: u32 = 64 * 1024 * 1024;

/// Task management function codes.
pub mod tmf {
    /// ABORT TASK.
    pub const ABORT_TASK: u8 = 1;
    /// ABORT TASK SET.
    pub const ABORT_TASK_SET: u8 = 2;
    /// CLEAR ACA.
    pub const CLEAR_ACA: u8 = 3;
    /// CLEAR TASK SET.
    pub const CLEAR_TASK_SET: u8 = 4;
    /// LOGICAL UNIT RESET.
    pub const LOGICAL_UNIT_RESET: u8 = 5;
    /// TARGET WARM RESET.
    pub const TARGET_WARM_RESET: u8 = 6;
    /// TARGET COLD RESET.
    pub const TARGET_COLD_RESET: u8 = 7;
    /// TASK REASSIGN.
    pub const TASK_REASSIGN: u8 = 8;

    /// Function complete.
    pub const COMPLETE: u8 = 0;
    /// Task does not exist.
    pub const NO_TASK: u8 = 1;
    /// Task allegiance reassignment not supported.
    pub const REASSIGN_NOT_SUPPORTED: u8 = 4;
    /// Task management function not supported.
    pub const NOT_SUPPORTED: u8 = 5;
    /// Function rejected.
    pub const REJECTED: u8 = 255;
}

/// What the server does next.
#[derive(Debug)]
pub enum Action {
    /// Send a PDU.
    Send(Pdu),
    /// Run a command on the SCSI target; report with
    /// [`FullFeature::complete`].
    Execute(scsi::Command),
    /// Drop the running command with this tag; it gets no response.
    Abort(u32),
    /// Run a reset, then report with [`FullFeature::reset_done`].
    Reset {
        /// The TMF request's tag.
        itt: u32,
        /// What to reset.
        reset: Reset,
    },
    /// The I_T nexus ends now (a logout): the SCSI target drops what it
    /// keeps per nexus before the initiator hears the Logout Response.
    EndNexus,
    /// Close the connection once everything before this is sent.
    Close,
}

/// Where a write task's data-out stands.
#[derive(Debug)]
struct Transfer {
    buffer: BytesMut,
    /// Bytes received so far.
    received: u64,
    /// End of the unsolicited range (immediate data included).
    unsolicited_end: u32,
    /// Whether unsolicited Data-Outs are still to come (command F bit 0).
    unsolicited_open: bool,
    /// DataSN expected next in the unsolicited sequence.
    unsolicited_data_sn: u32,
    /// Next offset to solicit.
    next_r2t_offset: u32,
    /// Next R2TSN.
    r2t_sn: u32,
    /// Outstanding R2Ts: (ttt, offset, length, received, next DataSN).
    r2ts: Vec<OutstandingR2t>,
}

#[derive(Debug, Clone, Copy)]
struct OutstandingR2t {
    ttt: u32,
    offset: u32,
    length: u32,
    received: u32,
    data_sn: u32,
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum TaskState {
    /// Received, waiting for its turn in CmdSN order or for data.
    Pending,
    /// Running on the SCSI target.
    Running,
}

#[derive(Debug)]
struct Task {
    command: ScsiCommand,
    lun: u64,
    attribute: TaskAttribute,
    /// Taken in CmdSN order (or immediate).
    delivered: bool,
    transfer: Option<Transfer>,
    /// The whole data-out when immediate data carried all of it: handed to
    /// the SCSI side as received, without a copy.
    immediate_data: Bytes,
    state: TaskState,
}

impl Task {
    fn data_complete(&self) -> bool {
        match &self.transfer {
            None => true,
            Some(t) => t.received >= self.command.expected_length as u64,
        }
    }
}

/// A non-immediate request held until its CmdSN comes up.
#[derive(Debug)]
enum Held {
    /// A SCSI command; its task already exists (so its data can arrive).
    Command(u32),
    /// Any other request.
    Other(Pdu),
}

/// A text response too long for one PDU.
#[derive(Debug)]
struct PendingText {
    itt: u32,
    ttt: u32,
    rest: Bytes,
}

/// Counters of one connection, for logs.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    /// Commands run.
    pub commands: u64,
    /// PDUs rejected.
    pub rejects: u64,
}

/// The full-feature phase of one connection.
pub struct FullFeature {
    params: SessionParams,
    session_type: SessionType,
    nexus: Nexus,
    target_name: Option<String>,
    cid: u16,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    stat_sn: u32,
    tasks: HashMap<u32, Task>,
    /// Tags in the order their commands were taken (for task attributes).
    order: VecDeque<u32>,
    held: HashMap<u32, Held>,
    next_ttt: u32,
    solicited_outstanding: u64,
    pending_text: Option<PendingText>,
    /// TMF responses waiting for a reset to finish: tag -> function.
    resets: HashMap<u32, u8>,
    logging_out: bool,
    /// Tag of the last target-initiated ping not yet answered.
    ping_outstanding: Option<u32>,
    counters: Counters,
}

fn serial_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 1 << 31
}

fn serial_le(a: u32, b: u32) -> bool {
    a == b || serial_lt(a, b)
}

fn attribute(code: u8) -> TaskAttribute {
    match code {
        2 => TaskAttribute::Ordered,
        3 => TaskAttribute::HeadOfQueue,
        4 => TaskAttribute::Aca,
        _ => TaskAttribute::Simple,
    }
}

/// Fixed-format sense data for a transport-level failure of a command.
fn transport_sense(key: u8, asc: u8, ascq: u8) -> Bytes {
    let mut s = vec![0u8; 18];
    s[0] = 0x70;
    s[2] = key;
    s[7] = 10;
    s[12] = asc;
    s[13] = ascq;
    Bytes::from(s)
}

impl FullFeature {
    /// The full-feature phase after a login.
    pub fn new(logged_in: &crate::login::LoggedIn, nexus: Nexus) -> FullFeature {
        FullFeature {
            params: logged_in.params,
            session_type: logged_in.session_type,
            nexus,
            target_name: logged_in.target.as_ref().map(|t| t.name.clone()),
            cid: logged_in.cid,
            exp_cmd_sn: logged_in.exp_cmd_sn,
            max_cmd_sn: logged_in.max_cmd_sn,
            stat_sn: logged_in.stat_sn,
            tasks: HashMap::new(),
            order: VecDeque::new(),
            held: HashMap::new(),
            next_ttt: 1,
            solicited_outstanding: 0,
            pending_text: None,
            resets: HashMap::new(),
            logging_out: false,
            ping_outstanding: None,
            counters: Counters::default(),
        }
    }

    /// The negotiated parameters.
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// Counters so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Tasks not yet answered.
    pub fn tasks_in_flight(&self) -> usize {
        self.tasks.len()
    }

    /// The nexus of this connection.
    pub fn nexus(&self) -> &Nexus {
        &self.nexus
    }

    fn next_stat_sn(&mut self) -> u32 {
        let sn = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        sn
    }

    /// MaxCmdSN as it may be advertised now: never backwards, and never
    /// admitting more than [`MAX_TASKS`] tasks.
    fn window(&mut self) -> (u32, u32) {
        let busy = (self.tasks.len() + self.held.len()) as u32;
        let free = MAX_TASKS.saturating_sub(busy);
        let candidate = self.exp_cmd_sn.wrapping_add(free).wrapping_sub(1);
        if serial_lt(self.max_cmd_sn, candidate) {
            self.max_cmd_sn = candidate;
        }
        (self.exp_cmd_sn, self.max_cmd_sn)
    }

    fn reject(&mut self, reason: u8, header: &[u8]) -> Action {
        self.counters.rejects += 1;
        let (exp, max) = self.window();
        let stat_sn = self.next_stat_sn();
        Action::Send(Pdu::Reject(Reject {
            reason,
            stat_sn,
            exp_cmd_sn: exp,
            max_cmd_sn: max,
            data_sn: 0,
            header: Bytes::copy_from_slice(&header[..header.len().min(pdu::BHS_BYTES)]),
        }))
    }

    /// A PDU whose data digest failed: rejected and dropped; a Data-Out
    /// cannot be recovered at error recovery level 0, so the connection
    /// closes after it.
    pub fn data_digest_error(&mut self, bhs: &[u8]) -> Vec<Action> {
        let mut out = vec![self.reject(reject_reason::DATA_DIGEST_ERROR, bhs)];
        if bhs[0] & 0x3f == pdu::opcode::DATA_OUT {
            out.push(Action::Close);
        }
        out
    }

    /// A PDU the connection cannot parse further (unknown opcode, bad AHS).
    pub fn unparseable(&mut self, bhs: &[u8], reason: u8) -> Vec<Action> {
        vec![self.reject(reason, bhs)]
    }

    /// Handles one PDU from the initiator. `catalog` answers SendTargets.
    pub fn receive(&mut self, pdu: Pdu, catalog: &dyn TargetCatalog) -> Vec<Action> {
        let mut out = Vec::new();
        match pdu {
            Pdu::DataOut(d) => self.data_out(d, &mut out),
            Pdu::ScsiCommand(c) => {
                if self.session_type == SessionType::Discovery {
                    let header = Pdu::ScsiCommand(c).to_frame().bhs;
                    out.push(self.reject(reject_reason::PROTOCOL_ERROR, &header));
                    return out;
                }
                self.command(c, &mut out);
            }
            Pdu::NopOut(n) if n.itt == RESERVED_TAG => {
                // The answer to a target ping: no CmdSN, no reply.
                if self.ping_outstanding == Some(n.ttt) {
                    self.ping_outstanding = None;
                }
            }
            Pdu::Snack(s) => out.push(self.reject(reject_reason::PROTOCOL_ERROR, &s.bhs)),
            pdu => match numbering(&pdu) {
                Some((true, _)) => self.take(pdu, catalog, &mut out),
                Some((false, cmd_sn)) => {
                    if self.admit(cmd_sn) {
                        self.held.insert(cmd_sn, Held::Other(pdu));
                    }
                }
                None => {
                    // Login in the full-feature phase, or a target opcode.
                    let header = pdu.to_frame().bhs;
                    let reason = if matches!(pdu, Pdu::LoginRequest(_)) {
                        reject_reason::PROTOCOL_ERROR
                    } else {
                        reject_reason::COMMAND_NOT_SUPPORTED
                    };
                    out.push(self.reject(reason, &header));
                }
            },
        }
        self.drain_held(catalog, &mut out);
        self.start_ready(&mut out);
        out
    }

    /// Whether a non-immediate CmdSN is inside the window and new.
    fn admit(&self, cmd_sn: u32) -> bool {
        let inside = serial_le(self.exp_cmd_sn, cmd_sn) && serial_le(cmd_sn, self.max_cmd_sn);
        if !inside {
            tracing::debug!(
                "iSCSI CmdSN {cmd_sn} outside [{}, {}]: dropped",
                self.exp_cmd_sn,
                self.max_cmd_sn
            );
        }
        inside && !self.held.contains_key(&cmd_sn)
    }

    /// Takes held requests whose CmdSN has come up.
    fn drain_held(&mut self, catalog: &dyn TargetCatalog, out: &mut Vec<Action>) {
        while let Some(held) = self.held.remove(&self.exp_cmd_sn) {
            self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
            match held {
                Held::Command(itt) => self.deliver(itt),
                Held::Other(pdu) => self.take(pdu, catalog, out),
            }
        }
    }

    fn deliver(&mut self, itt: u32) {
        if let Some(task) = self.tasks.get_mut(&itt) {
            task.delivered = true;
            self.order.push_back(itt);
        }
    }

    /// A non-SCSI request taken in order.
    fn take(&mut self, pdu: Pdu, catalog: &dyn TargetCatalog, out: &mut Vec<Action>) {
        match pdu {
            Pdu::NopOut(n) => self.nop(n, out),
            Pdu::TaskMgmtRequest(t) => self.task_management(t, out),
            Pdu::TextRequest(t) => self.text(t, catalog, out),
            Pdu::LogoutRequest(l) => {
                let response = match l.reason {
                    0 => 0,
                    1 if l.cid == self.cid => 0,
                    1 => 1,
                    _ => 2,
                };
                if response == 0 {
                    self.logging_out = true;
                    for itt in self.tasks.keys().copied().collect::<Vec<_>>() {
                        self.drop_task(itt, out);
                    }
                    out.push(Action::EndNexus);
                }
                let (exp, max) = self.window();
                let stat_sn = self.next_stat_sn();
                out.push(Action::Send(Pdu::LogoutResponse(LogoutResponse {
                    response,
                    itt: l.itt,
                    stat_sn,
                    exp_cmd_sn: exp,
                    max_cmd_sn: max,
                    time_to_wait: self.params.default_time_to_wait,
                    time_to_retain: 0,
                })));
                if response == 0 {
                    out.push(Action::Close);
                }
            }
            _ => {}
        }
    }

    fn nop(&mut self, n: NopOut, out: &mut Vec<Action>) {
        let (exp, max) = self.window();
        let stat_sn = self.next_stat_sn();
        let limit = self.params.initiator_max_recv_data_segment_length as usize;
        let data = n.data.slice(..n.data.len().min(limit));
        out.push(Action::Send(Pdu::NopIn(NopIn {
            lun: n.lun,
            itt: n.itt,
            ttt: RESERVED_TAG,
            stat_sn,
            exp_cmd_sn: exp,
            max_cmd_sn: max,
            data,
        })));
    }

    /// A target-initiated ping (dead-connection detection): the initiator
    /// answers with a NOP-Out carrying the same TTT.
    pub fn ping(&mut self) -> Option<Pdu> {
        if self.ping_outstanding.is_some() {
            return None;
        }
        let ttt = self.allocate_ttt();
        self.ping_outstanding = Some(ttt);
        let (exp, max) = self.window();
        Some(Pdu::NopIn(NopIn {
            lun: [0; 8],
            itt: RESERVED_TAG,
            ttt,
            stat_sn: self.stat_sn,
            exp_cmd_sn: exp,
            max_cmd_sn: max,
            data: Bytes::new(),
        }))
    }

    /// Whether a ping is waiting for its answer.
    pub fn ping_outstanding(&self) -> bool {
        self.ping_outstanding.is_some()
    }

    fn allocate_ttt(&mut self) -> u32 {
        let ttt = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == RESERVED_TAG {
            self.next_ttt = 1;
        }
        ttt
    }

    fn command(&mut self, c: ScsiCommand, out: &mut Vec<Action>) {
        let header = |c: &ScsiCommand| Pdu::ScsiCommand(c.clone()).to_frame().bhs;
        if !c.immediate && !self.admit(c.cmd_sn) {
            return;
        }
        if c.immediate && self.tasks.len() as u32 >= MAX_TASKS {
            out.push(self.reject(reject_reason::IMMEDIATE_COMMAND_REJECT, &header(&c)));
            return;
        }
        // From here the CmdSN is consumed, whatever happens to the command.
        let immediate_data_refused =
            !c.data.is_empty() && (!c.write || !self.params.immediate_data);
        let immediate_data_too_long = c.data.len() as u64 > c.expected_length as u64
            || c.data.len() as u32 > self.params.first_burst_length;
        let unsolicited_refused = !c.final_pdu && (self.params.initial_r2t || !c.write);
        let protocol_error = if self.tasks.contains_key(&c.itt) || c.itt == RESERVED_TAG {
            Some(reject_reason::INVALID_PDU_FIELD)
        } else if immediate_data_refused || immediate_data_too_long || unsolicited_refused {
            Some(reject_reason::PROTOCOL_ERROR)
        } else {
            None
        };
        if let Some(reason) = protocol_error {
            if !c.immediate {
                self.consume(c.cmd_sn);
            }
            out.push(self.reject(reason, &header(&c)));
            return;
        }
        let itt = c.itt;
        let oversized = c.write && c.expected_length > MAX_TASK_DATA_OUT_BYTES;
        let whole_in_immediate = c.write && c.data.len() as u64 == c.expected_length as u64;
        let transfer = (c.write && c.expected_length > 0 && !oversized && !whole_in_immediate)
            .then(|| {
                let edtl = c.expected_length;
                let immediate = c.data.len() as u32;
                let unsolicited_end = if !self.params.initial_r2t && !c.final_pdu {
                    self.params.first_burst_length.min(edtl)
                } else {
                    immediate
                };
                let mut buffer = BytesMut::zeroed(edtl as usize);
                buffer[..c.data.len()].copy_from_slice(&c.data);
                Transfer {
                    buffer,
                    received: immediate as u64,
                    unsolicited_end,
                    unsolicited_open: !c.final_pdu && unsolicited_end > immediate,
                    unsolicited_data_sn: 0,
                    next_r2t_offset: unsolicited_end,
                    r2t_sn: 0,
                    r2ts: Vec::new(),
                }
            });
        let task = Task {
            lun: lun_number(c.lun),
            attribute: attribute(c.attribute),
            immediate_data: if whole_in_immediate && !oversized {
                c.data.clone()
            } else {
                Bytes::new()
            },
            command: ScsiCommand {
                data: Bytes::new(),
                ..c
            },
            delivered: false,
            transfer,
            state: TaskState::Pending,
        };
        let cmd_sn = task.command.cmd_sn;
        let immediate = task.command.immediate;
        self.tasks.insert(itt, task);
        if oversized {
            // Consumed, answered at once; its data (if any) is discarded.
            if !immediate {
                self.consume(cmd_sn);
            }
            self.tasks.remove(&itt);
            let response = self.status_response(
                itt,
                scsi::Status::CheckCondition.code(),
                Residual::None,
                0,
                // ILLEGAL REQUEST, INVALID FIELD IN COMMAND INFORMATION UNIT.
                transport_sense(0x05, 0x0e, 0x03),
            );
            out.push(Action::Send(response));
            return;
        }
        if immediate {
            self.deliver(itt);
        } else {
            // Taken in CmdSN order by `drain_held`, at once when it is next.
            self.held.insert(cmd_sn, Held::Command(itt));
        }
        self.solicit(itt, out);
    }

    /// Marks a non-immediate CmdSN as taken without a task; the window
    /// moves past it when its turn comes (in `drain_held`).
    fn consume(&mut self, cmd_sn: u32) {
        self.held.insert(cmd_sn, Held::Command(RESERVED_TAG));
    }

    /// Issues R2Ts for a write task, up to MaxOutstandingR2T and the
    /// connection's solicited-bytes budget.
    fn solicit(&mut self, itt: u32, out: &mut Vec<Action>) {
        let max_r2t = self.params.max_outstanding_r2t.max(1) as usize;
        let max_burst = self.params.max_burst_length.max(512);
        loop {
            if self.solicited_outstanding >= MAX_SOLICITED_BYTES {
                return;
            }
            let Some(task) = self.tasks.get(&itt) else {
                return;
            };
            let edtl = task.command.expected_length;
            let lun = task.command.lun;
            let Some(t) = &task.transfer else {
                return;
            };
            if t.r2ts.len() >= max_r2t || t.next_r2t_offset >= edtl {
                return;
            }
            let offset = t.next_r2t_offset;
            let length = (edtl - offset).min(max_burst);
            let ttt = self.allocate_ttt();
            let (exp, max) = self.window();
            let stat_sn = self.stat_sn;
            let Some(t) = self.tasks.get_mut(&itt).and_then(|t| t.transfer.as_mut()) else {
                return;
            };
            let r2t_sn = t.r2t_sn;
            t.r2t_sn += 1;
            t.next_r2t_offset = offset + length;
            t.r2ts.push(OutstandingR2t {
                ttt,
                offset,
                length,
                received: 0,
                data_sn: 0,
            });
            self.solicited_outstanding += length as u64;
            out.push(Action::Send(Pdu::R2t(R2t {
                lun,
                itt,
                ttt,
                stat_sn,
                exp_cmd_sn: exp,
                max_cmd_sn: max,
                r2t_sn,
                buffer_offset: offset,
                desired_length: length,
            })));
        }
    }

    fn data_out(&mut self, d: DataOut, out: &mut Vec<Action>) {
        let Some(task) = self.tasks.get_mut(&d.itt) else {
            // Data for an aborted or unknown task: dropped (RFC 7143 11.7).
            tracing::debug!("iSCSI Data-Out for unknown task {:#x} dropped", d.itt);
            return;
        };
        let edtl = task.command.expected_length as u64;
        let accepted = task
            .transfer
            .as_mut()
            .and_then(|t| accept_data_out(t, &d, edtl));
        let Some(finished_r2t) = accepted else {
            // Error recovery level 0 cannot ask for the data again: the
            // task ends with CHECK CONDITION (ABORTED COMMAND, DATA PHASE
            // ERROR), later Data-Outs for it are dropped, and the
            // connection carries on.
            tracing::info!(
                "iSCSI Data-Out for task {:#x} out of sequence (TTT {:#x}, DataSN {}, offset {}, \
                 {} bytes); the task ends with a data phase error",
                d.itt,
                d.ttt,
                d.data_sn,
                d.buffer_offset,
                d.data.len()
            );
            self.drop_task(d.itt, out);
            let response = self.status_response(
                d.itt,
                scsi::Status::CheckCondition.code(),
                Residual::None,
                0,
                transport_sense(0x0b, 0x4b, 0x00),
            );
            out.push(Action::Send(response));
            return;
        };
        if let Some(length) = finished_r2t {
            self.solicited_outstanding = self.solicited_outstanding.saturating_sub(length as u64);
            self.solicit(d.itt, out);
        }
    }

    /// Starts every task whose turn has come: delivered in CmdSN order,
    /// with all its data, and allowed by the task attributes of the tasks
    /// taken before it.
    fn start_ready(&mut self, out: &mut Vec<Action>) {
        let mut older_incomplete = false;
        let mut older_ordered = false;
        let mut start = Vec::new();
        for &itt in &self.order {
            let Some(task) = self.tasks.get(&itt) else {
                continue;
            };
            let allowed = match task.attribute {
                TaskAttribute::HeadOfQueue => true,
                TaskAttribute::Ordered => !older_incomplete,
                _ => !older_ordered,
            };
            if task.state == TaskState::Pending && task.delivered && task.data_complete() && allowed
            {
                start.push(itt);
            }
            older_incomplete = true;
            if task.attribute == TaskAttribute::Ordered {
                older_ordered = true;
            }
        }
        for itt in start {
            let Some(task) = self.tasks.get_mut(&itt) else {
                continue;
            };
            task.state = TaskState::Running;
            let data_out = task
                .transfer
                .take()
                .map(|t| t.buffer.freeze())
                .unwrap_or_else(|| std::mem::take(&mut task.immediate_data));
            self.counters.commands += 1;
            out.push(Action::Execute(scsi::Command {
                nexus: self.nexus.clone(),
                lun: task.lun,
                cdb: task.command.cdb.clone(),
                data_out,
                expected_data_in: MAX_DATA_IN_BYTES.max(task.command.expected_length),
                attribute: task.attribute,
                tag: itt,
            }));
        }
    }

    /// A command finished on the SCSI target: its Data-In and status.
    pub fn complete(&mut self, itt: u32, response: scsi::Response) -> Vec<Action> {
        let mut out = Vec::new();
        let Some(task) = self.tasks.remove(&itt) else {
            return out;
        };
        self.order.retain(|&t| t != itt);
        let c = &task.command;
        let edtl = c.expected_length;
        let (read_limit, residual, bidi) = match (c.read, c.write) {
            (true, false) => (
                edtl,
                Residual::of(edtl, response.data_in.len() as u64),
                Residual::None,
            ),
            (true, true) => {
                let read_len = c.bidi_read_length.unwrap_or(0);
                (
                    read_len,
                    Residual::of(edtl, response.data_out_used as u64),
                    Residual::of(read_len, response.data_in.len() as u64),
                )
            }
            (false, true) => (
                0,
                Residual::of(edtl, response.data_out_used as u64),
                Residual::None,
            ),
            (false, false) => (
                0,
                Residual::of(
                    edtl,
                    (response.data_in.len() as u64).max(response.data_out_used as u64),
                ),
                Residual::None,
            ),
        };
        let data = response
            .data_in
            .slice(..response.data_in.len().min(read_limit as usize));
        let status = response.status.code();
        let sense = response.sense.unwrap_or_default();
        let collapse = sense.is_empty()
            && matches!(
                response.status,
                scsi::Status::Good | scsi::Status::ConditionMet
            )
            && bidi == Residual::None
            && !data.is_empty();
        let segment = self.params.initiator_max_recv_data_segment_length.max(512) as usize;
        let burst = (self.params.max_burst_length.max(512) as usize).max(segment);
        let mut data_sn = 0u32;
        let mut offset = 0usize;
        while offset < data.len() {
            let burst_end = (offset / burst + 1) * burst;
            let end = (offset + segment).min(data.len()).min(burst_end);
            let last = end == data.len();
            let with_status = last && collapse;
            let (exp, max) = self.window();
            let stat_sn = if with_status { self.next_stat_sn() } else { 0 };
            out.push(Action::Send(Pdu::DataIn(DataIn {
                final_pdu: last || end == burst_end,
                status: with_status.then_some(status),
                lun: c.lun,
                itt,
                stat_sn,
                exp_cmd_sn: exp,
                max_cmd_sn: max,
                data_sn,
                buffer_offset: offset as u32,
                residual: if with_status {
                    residual
                } else {
                    Residual::None
                },
                data: data.slice(offset..end),
            })));
            data_sn += 1;
            offset = end;
        }
        if !collapse {
            let pdu = self.status_response_full(itt, status, residual, bidi, data_sn, sense);
            out.push(Action::Send(pdu));
        }
        if let Some(t) = &task.transfer {
            let unreceived: u64 = t.r2ts.iter().map(|r| (r.length - r.received) as u64).sum();
            self.solicited_outstanding = self.solicited_outstanding.saturating_sub(unreceived);
        }
        self.start_ready(&mut out);
        out
    }

    fn status_response(
        &mut self,
        itt: u32,
        status: u8,
        residual: Residual,
        exp_data_sn: u32,
        sense: Bytes,
    ) -> Pdu {
        self.status_response_full(itt, status, residual, Residual::None, exp_data_sn, sense)
    }

    fn status_response_full(
        &mut self,
        itt: u32,
        status: u8,
        residual: Residual,
        bidi_read_residual: Residual,
        exp_data_sn: u32,
        sense: Bytes,
    ) -> Pdu {
        let (exp, max) = self.window();
        let stat_sn = self.next_stat_sn();
        Pdu::ScsiResponse(ScsiResponse {
            response: 0,
            status,
            itt,
            stat_sn,
            exp_cmd_sn: exp,
            max_cmd_sn: max,
            exp_data_sn,
            residual,
            bidi_read_residual,
            sense,
        })
    }

    /// Removes a task without a response, aborting it if it runs.
    fn drop_task(&mut self, itt: u32, out: &mut Vec<Action>) {
        if let Some(task) = self.tasks.remove(&itt) {
            self.order.retain(|&t| t != itt);
            if task.state == TaskState::Running {
                out.push(Action::Abort(itt));
            }
            if let Some(t) = &task.transfer {
                let unreceived: u64 = t.r2ts.iter().map(|r| (r.length - r.received) as u64).sum();
                self.solicited_outstanding = self.solicited_outstanding.saturating_sub(unreceived);
            }
            // A held CmdSN slot of an aborted command still advances the
            // window when its turn comes.
            for held in self.held.values_mut() {
                if matches!(held, Held::Command(h) if *h == itt) {
                    *held = Held::Command(RESERVED_TAG);
                }
            }
        }
    }

    fn tmf_response(&mut self, itt: u32, response: u8) -> Action {
        let (exp, max) = self.window();
        let stat_sn = self.next_stat_sn();
        Action::Send(Pdu::TaskMgmtResponse(TaskMgmtResponse {
            response,
            itt,
            stat_sn,
            exp_cmd_sn: exp,
            max_cmd_sn: max,
        }))
    }

    fn task_management(&mut self, t: TaskMgmtRequest, out: &mut Vec<Action>) {
        let lun = lun_number(t.lun);
        match t.function {
            tmf::ABORT_TASK => {
                let response = if self.tasks.contains_key(&t.referenced_tag) {
                    self.drop_task(t.referenced_tag, out);
                    tmf::COMPLETE
                } else if serial_le(self.exp_cmd_sn, t.ref_cmd_sn)
                    && serial_le(t.ref_cmd_sn, self.max_cmd_sn)
                {
                    // Never received: it is as good as aborted (RFC 7143
                    // section 11.5.1), and its CmdSN must not block others.
                    if !self.held.contains_key(&t.ref_cmd_sn) {
                        self.consume(t.ref_cmd_sn);
                    }
                    tmf::COMPLETE
                } else {
                    tmf::NO_TASK
                };
                out.push(self.tmf_response(t.itt, response));
            }
            tmf::ABORT_TASK_SET | tmf::CLEAR_TASK_SET => {
                let victims: Vec<u32> = self
                    .tasks
                    .iter()
                    .filter(|(_, task)| task.lun == lun)
                    .map(|(&itt, _)| itt)
                    .collect();
                for itt in victims {
                    self.drop_task(itt, out);
                }
                out.push(self.tmf_response(t.itt, tmf::COMPLETE));
            }
            tmf::LOGICAL_UNIT_RESET | tmf::TARGET_WARM_RESET | tmf::TARGET_COLD_RESET => {
                let victims: Vec<u32> = self
                    .tasks
                    .iter()
                    .filter(|(_, task)| t.function != tmf::LOGICAL_UNIT_RESET || task.lun == lun)
                    .map(|(&itt, _)| itt)
                    .collect();
                for itt in victims {
                    self.drop_task(itt, out);
                }
                let reset = match t.function {
                    tmf::LOGICAL_UNIT_RESET => Reset::LogicalUnit(lun),
                    tmf::TARGET_WARM_RESET => Reset::TargetWarm,
                    _ => Reset::TargetCold,
                };
                self.resets.insert(t.itt, t.function);
                out.push(Action::Reset { itt: t.itt, reset });
            }
            tmf::TASK_REASSIGN => {
                out.push(self.tmf_response(t.itt, tmf::REASSIGN_NOT_SUPPORTED));
            }
            tmf::CLEAR_ACA => out.push(self.tmf_response(t.itt, tmf::NOT_SUPPORTED)),
            _ => out.push(self.tmf_response(t.itt, tmf::REJECTED)),
        }
    }

    /// A reset requested by a TMF finished: its response, and for a cold
    /// reset the end of the connection.
    pub fn reset_done(&mut self, itt: u32) -> Vec<Action> {
        let mut out = Vec::new();
        if let Some(function) = self.resets.remove(&itt) {
            out.push(self.tmf_response(itt, tmf::COMPLETE));
            if function == tmf::TARGET_COLD_RESET {
                out.push(Action::Close);
            }
        }
        self.start_ready(&mut out);
        out
    }

    fn text(&mut self, t: TextRequest, catalog: &dyn TargetCatalog, out: &mut Vec<Action>) {
        let header = Pdu::TextRequest(t.clone()).to_frame().bhs;
        if t.ttt != RESERVED_TAG {
            // The initiator asks for the next part of a long response.
            match self.pending_text.take() {
                Some(p) if p.ttt == t.ttt && p.itt == t.itt => {
                    self.send_text(t.itt, t.lun, p.rest, out);
                }
                _ => out.push(self.reject(reject_reason::PROTOCOL_ERROR, &header)),
            }
            return;
        }
        self.pending_text = None;
        if t.continue_text {
            // Multi-PDU text requests are not needed by any key we answer.
            out.push(self.reject(reject_reason::COMMAND_NOT_SUPPORTED, &header));
            return;
        }
        let pairs = match text::parse(&t.data) {
            Ok(p) => p,
            Err(_) => {
                out.push(self.reject(reject_reason::PROTOCOL_ERROR, &header));
                return;
            }
        };
        let mut reply = Vec::new();
        for (key, value) in pairs {
            match key.as_str() {
                "SendTargets" => self.send_targets(&value, catalog, &mut reply),
                "MaxRecvDataSegmentLength" => {
                    if let Ok(n) = value.parse::<u32>() {
                        if (512..1 << 24).contains(&n) {
                            self.params.initiator_max_recv_data_segment_length = n;
                        }
                    }
                }
                k if text::is_login_only(k) => reply.push((key, "Reject".into())),
                _ => reply.push((key, "NotUnderstood".into())),
            }
        }
        let data = Bytes::from(text::encode(&reply));
        self.send_text(t.itt, t.lun, data, out);
    }

    fn send_text(&mut self, itt: u32, lun: [u8; 8], data: Bytes, out: &mut Vec<Action>) {
        let limit = self.params.initiator_max_recv_data_segment_length.max(512) as usize;
        let (part, rest) = if data.len() > limit {
            (data.slice(..limit), Some(data.slice(limit..)))
        } else {
            (data, None)
        };
        let ttt = match &rest {
            Some(_) => self.allocate_ttt(),
            None => RESERVED_TAG,
        };
        let (exp, max) = self.window();
        let stat_sn = self.next_stat_sn();
        out.push(Action::Send(Pdu::TextResponse(TextResponse {
            final_pdu: rest.is_none(),
            continue_text: rest.is_some(),
            lun,
            itt,
            ttt,
            stat_sn,
            exp_cmd_sn: exp,
            max_cmd_sn: max,
            data: part,
        })));
        if let Some(rest) = rest {
            self.pending_text = Some(PendingText { itt, ttt, rest });
        }
    }

    fn send_targets(
        &self,
        value: &str,
        catalog: &dyn TargetCatalog,
        reply: &mut Vec<(String, String)>,
    ) {
        let names: Vec<String> = match (value, self.session_type) {
            ("All", SessionType::Discovery) => catalog.target_names(),
            ("All", SessionType::Normal) => {
                reply.push(("SendTargets".into(), "Reject".into()));
                return;
            }
            ("", _) => match &self.target_name {
                Some(n) => vec![n.clone()],
                None => Vec::new(),
            },
            (name, _) => vec![name.to_owned()],
        };
        for name in names {
            let Some(target) = catalog.target(&name) else {
                continue;
            };
            let initiator = self
                .nexus
                .initiator_port
                .split(",i,")
                .next()
                .unwrap_or_default();
            if !target.admits(initiator) {
                continue;
            }
            reply.push(("TargetName".into(), target.name.clone()));
            for portal in &target.portals {
                reply.push((
                    "TargetAddress".into(),
                    format!("{},{}", portal.address, portal.portal_group_tag),
                ));
            }
        }
    }

    /// Whether a logout was answered (the connection ends after sending).
    pub fn logging_out(&self) -> bool {
        self.logging_out
    }
}

/// Checks one Data-Out against the task's transfer and stores its data.
/// `None` is a sequence error; `Some(Some(length))` means it completed an
/// R2T of `length` bytes.
fn accept_data_out(t: &mut Transfer, d: &DataOut, edtl: u64) -> Option<Option<u32>> {
    let len = d.data.len() as u64;
    let start = d.buffer_offset as u64;
    let end = start + len;
    if end > edtl || (len == 0 && !d.final_pdu) {
        return None;
    }
    let mut finished = None;
    if d.ttt == RESERVED_TAG {
        if !t.unsolicited_open
            || d.data_sn != t.unsolicited_data_sn
            || end > t.unsolicited_end as u64
        {
            return None;
        }
        if d.final_pdu && end != t.unsolicited_end as u64 {
            // Unsolicited data must reach FirstBurstLength (or the end).
            return None;
        }
        t.unsolicited_data_sn += 1;
        if d.final_pdu {
            t.unsolicited_open = false;
        }
    } else {
        let i = t.r2ts.iter().position(|r| r.ttt == d.ttt)?;
        let r = &mut t.r2ts[i];
        let inside = start >= r.offset as u64 && end <= r.offset as u64 + r.length as u64;
        if d.data_sn != r.data_sn || !inside || r.received as u64 + len > r.length as u64 {
            return None;
        }
        r.data_sn += 1;
        r.received += len as u32;
        let complete = r.received == r.length;
        if d.final_pdu && !complete {
            // F before the end of the solicited burst leaves a hole.
            return None;
        }
        if complete {
            finished = Some(t.r2ts.swap_remove(i).length);
        }
    }
    t.buffer[start as usize..end as usize].copy_from_slice(&d.data);
    t.received += len;
    Some(finished)
}

/// Immediate bit and CmdSN of the requests other than SCSI commands that
/// carry one.
fn numbering(pdu: &Pdu) -> Option<(bool, u32)> {
    match pdu {
        Pdu::NopOut(p) => Some((p.immediate, p.cmd_sn)),
        Pdu::TaskMgmtRequest(p) => Some((p.immediate, p.cmd_sn)),
        Pdu::TextRequest(p) => Some((p.immediate, p.cmd_sn)),
        Pdu::LogoutRequest(p) => Some((p.immediate, p.cmd_sn)),
        _ => None,
    }
}
