//! Target side of the full feature phase, one connection per session
//! (MaxConnections=1), error recovery level 0.
//!
//! [`TargetSession`] is fed PDUs and returns [`Action`]s: PDUs to send and
//! SCSI commands to execute. Commands run elsewhere (in parallel); their
//! results come back through [`TargetSession::complete`], which turns them
//! into Data-In PDUs and the status. The command window (MaxCmdSN) only
//! opens as commands finish, so an initiator never has more than the queue
//! depth outstanding.
//!
//! Time is passed in: [`TargetSession::poll_timeout`] says when
//! [`TargetSession::handle_timeout`] wants to run next (the keep-alive
//! NOP-In, its missing answer, a discovery session's idle limit; see
//! [`Timers`]).

use crate::msg::*;
use crate::negotiate::{SessionParams, SessionType};
use crate::pdu::{extended_cdb, Pdu, RESERVED_TAG};
use crate::text;
use bytes::{BufMut, Bytes, BytesMut};
use crate::task_map::TaskMap;
use std::collections::VecDeque;

/// The session's tasks by ITT (the newest held outside the hash map: see
/// [`TaskMap`]).
type Tasks = TaskMap<Task>;
use std::time::{Duration, Instant};

/// RFC 1982 serial number comparison: a < b.
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 0x8000_0000
}

pub use bw_scsi::status;

/// Fixed-format sense data: ILLEGAL REQUEST / INVALID FIELD IN INFORMATION
/// UNIT (0x0E/0x03), for data-out transfers shorter than the CDB asks for.
pub fn sense_invalid_field_in_iu() -> Vec<u8> {
    bw_scsi::Sense::INVALID_FIELD_IN_IU.to_fixed()
}

#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub session_type: SessionType,
    pub params: SessionParams,
    pub queue_depth: u32,
    pub exp_cmd_sn: u32,
    pub stat_sn: u32,
    pub cid: u16,
    /// For SendTargets: every target this initiator may see, with portals
    /// (`ADDR:PORT,TPGT`), and the session's own target name.
    pub targets: Vec<(String, Vec<String>)>,
    pub current_target: Option<String>,
    /// Write data the session may hold or ask for at once; see
    /// [`DATA_OUT_BUDGET`].
    pub data_out_budget: usize,
}

/// Write data a connection may hold, per session: received or asked for
/// with R2T and not yet completed (the same bound as NVMe/TCP's
/// `R2T_BUDGET` per queue). Immediate and unsolicited data count against
/// it but cannot be refused (FirstBurstLength bounds them per command);
/// commands whose data would go beyond it get no R2T until earlier ones
/// complete. One command is always served, however long, so a transfer
/// larger than the budget still makes progress.
pub const DATA_OUT_BUDGET: usize = 16 << 20;

/// A write's data-out pieces (see [`Exec::data_out`]).
pub type DataOutPieces = smallvec::SmallVec<[Bytes; 1]>;

/// A SCSI command ready to run.
#[derive(Debug, Clone)]
pub struct Exec {
    pub itt: u32,
    /// Unique per session: matches results to tasks even if an ITT is
    /// reused after an abort.
    pub id: u64,
    pub lun: u64,
    pub cdb: Cdb,
    /// Everything the initiator sent (EDTL bytes for writes, else empty),
    /// in consecutive pieces as they arrived (immediate data, Data-Out
    /// segments), not copied into one buffer (one piece, the usual small
    /// write's, held inline).
    pub data_out: DataOutPieces,
    pub edtl: u32,
    pub read: bool,
    pub write: bool,
}

#[derive(Debug, Clone)]
pub enum Action {
    Send(Pdu),
    Execute(Exec),
    /// Reset the LUN in the SCSI layer, then call [`TargetSession::finish_tmf`].
    LunReset { itt: u32, lun: u64 },
    /// Reset the whole target, then call [`TargetSession::finish_tmf`];
    /// `cold`: close the connection after the response.
    TargetReset { itt: u32, cold: bool },
    /// Send everything queued before this, then close the connection.
    Close,
}

/// Errors that end the connection (ERL 0 has no recovery from these).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// Two keep-alive intervals went by without a PDU while our NOP-In
    /// waited for its answer.
    #[error("initiator did not answer NOP-In")]
    NopTimeout,
    /// A discovery session went this long without a request.
    #[error("discovery session without a request for {0:?} (discovery_idle_timeout_s)")]
    Idle(Duration),
}

/// The session's timers ([`TargetSession::with_timers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    /// Every this long the target pings an idle initiator with a NOP-In; a
    /// second interval without any PDU while the ping waits ends the
    /// connection.
    pub nop_interval: Duration,
    /// End the session after this long without a request (a NOP-Out, which
    /// may answer our own NOP-In, is none); discovery sessions.
    pub idle_limit: Option<Duration>,
}

/// Where the timers stand.
#[derive(Debug)]
struct Clock {
    timers: Timers,
    next_tick: Instant,
    /// Keep-alive intervals ended since the last PDU.
    idle_ticks: u32,
    last_request: Instant,
}

#[derive(Debug)]
struct R2tState {
    ttt: u32,
    offset: u32,
    len: u32,
    received: u32,
    next_data_sn: u32,
}

/// A command's CDB: the 16 bytes of its BHS, kept as they are (no
/// allocation), or, with an extended CDB in an AHS (longer CDBs, rare),
/// the whole of it in a buffer of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cdb {
    Short([u8; 16]),
    Long(Bytes),
}

impl std::ops::Deref for Cdb {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Cdb::Short(b) => b,
            Cdb::Long(b) => b,
        }
    }
}

#[derive(Debug)]
struct Task {
    id: u64,
    lun: u64,
    cdb: Cdb,
    edtl: u32,
    read: bool,
    write: bool,
    /// Data-out received so far: (buffer offset, bytes).
    pieces: Vec<(u32, Bytes)>,
    /// Bytes of data-out received so far; while unsolicited data is
    /// expected, also the offset the next unsolicited Data-Out starts at.
    received: u32,
    /// End (exclusive) of the unsolicited burst still expected, if any.
    unsolicited_end: Option<u32>,
    unsolicited_data_sn: u32,
    next_r2t_offset: u32,
    r2t_sn: u32,
    r2ts: Vec<R2tState>,
    /// Bytes of the session's data-out budget this task holds: its
    /// immediate and unsolicited data, plus, once it is served R2Ts, the
    /// rest of its transfer.
    held: usize,
    /// Of `held`, the bytes asked for with R2Ts (the rest of the transfer
    /// once the task is served).
    solicited: usize,
    executing: bool,
    /// Sent with the I bit: outside the CmdSN window, so ending it opens
    /// no slot.
    immediate: bool,
}

impl Task {
    /// The command to run, with its data-out.
    fn exec(&self, itt: u32, data_out: DataOutPieces) -> Exec {
        Exec { itt, id: self.id, lun: self.lun, cdb: self.cdb.clone(), data_out, edtl: self.edtl, read: self.read, write: self.write }
    }

    /// What its completion needs of it once it is removed.
    fn ended(&self) -> Ended {
        Ended { lun: self.lun, edtl: self.edtl, read: self.read, write: self.write, r2t_sn: self.r2t_sn }
    }
}

/// What a completion needs of a task that [`TargetSession::take_task`]
/// removed: copied out of it, so that the task (~150 bytes) is dropped
/// where it lies instead of being moved out.
#[derive(Debug, Clone, Copy)]
struct Ended {
    lun: u64,
    edtl: u32,
    read: bool,
    write: bool,
    r2t_sn: u32,
}

impl Ended {
    /// A write with no read side: its residual is the data-out's
    /// (`write_residual`), and it sends no data-in.
    fn write_only(&self) -> bool {
        self.write && !self.read
    }

    /// The residual its SCSI Response reports when it produced `produced`
    /// bytes of data-in: the data-out's for a write, else against the
    /// expected transfer length.
    fn residual(&self, produced: usize, write_residual: Residual) -> Residual {
        if self.write_only() {
            write_residual
        } else {
            Residual::of(produced, self.edtl as usize)
        }
    }
}

/// Immediate commands (which the CmdSN window does not bound) a session
/// may have outstanding; more get TASK SET FULL.
pub const MAX_IMMEDIATE_TASKS: usize = 16;

pub struct TargetSession {
    cfg: SessionConfig,
    params: SessionParams,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    stat_sn: u32,
    tasks: Tasks,
    /// Sum of the tasks' `held` bytes.
    data_out_held: usize,
    /// Of `data_out_held`, the bytes of tasks given R2T service.
    solicited_held: usize,
    /// Writes waiting for data-out budget before their first R2T, in
    /// arrival order: (ITT, task id).
    r2t_waiting: VecDeque<(u32, u64)>,
    next_id: u64,
    next_ttt: u32,
    /// Target-initiated NOP-In waiting for its NOP-Out answer.
    ping_outstanding: Option<u32>,
    /// Text request split over PDUs (C bit), and a long answer being sent in parts.
    text_partial: Vec<u8>,
    text_pending: Option<(u32, Bytes)>,
    /// `None`: no timers (see [`TargetSession::with_timers`]).
    clock: Option<Clock>,
}

impl TargetSession {
    pub fn new(cfg: SessionConfig) -> Self {
        let qd = cfg.queue_depth.max(1);
        TargetSession {
            params: cfg.params.clone(),
            exp_cmd_sn: cfg.exp_cmd_sn,
            max_cmd_sn: cfg.exp_cmd_sn.wrapping_add(qd - 1),
            stat_sn: cfg.stat_sn,
            tasks: Tasks::default(),
            data_out_held: 0,
            solicited_held: 0,
            r2t_waiting: VecDeque::new(),
            next_id: 1,
            next_ttt: 1,
            ping_outstanding: None,
            text_partial: Vec::new(),
            text_pending: None,
            clock: None,
            cfg,
        }
    }

    /// Run `timers` from `now` (a session without is driven by PDUs alone).
    pub fn with_timers(mut self, timers: Timers, now: Instant) -> Self {
        self.clock = Some(Clock { timers, next_tick: now + timers.nop_interval, idle_ticks: 0, last_request: now });
        self
    }

    /// When [`TargetSession::handle_timeout`] wants to run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let c = self.clock.as_ref()?;
        let idle = c.timers.idle_limit.map(|l| c.last_request + l);
        Some(idle.map_or(c.next_tick, |i| i.min(c.next_tick)))
    }

    /// The timers at `now`: a NOP-In to send, or an error that ends the
    /// connection.
    pub fn handle_timeout(&mut self, now: Instant, out: &mut Vec<Action>) -> Result<(), SessionError> {
        let Some(c) = self.clock.as_mut() else { return Ok(()) };
        if let Some(limit) = c.timers.idle_limit {
            if now >= c.last_request + limit {
                return Err(SessionError::Idle(limit));
            }
        }
        if now < c.next_tick {
            return Ok(());
        }
        c.next_tick = now + c.timers.nop_interval;
        c.idle_ticks += 1;
        if self.ping_outstanding.is_some() && c.idle_ticks >= 2 {
            return Err(SessionError::NopTimeout);
        }
        if let Some(p) = self.ping() {
            out.push(Action::Send(p));
        }
        Ok(())
    }

    pub fn params(&self) -> &SessionParams {
        &self.params
    }
    pub fn exp_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn
    }
    pub fn max_cmd_sn(&self) -> u32 {
        self.max_cmd_sn
    }
    pub fn outstanding(&self) -> usize {
        self.tasks.len()
    }
    /// Of [`TargetSession::outstanding`], the immediate commands.
    pub fn immediate_outstanding(&self) -> usize {
        self.tasks.values().filter(|t| t.immediate).count()
    }
    pub fn ping_outstanding(&self) -> bool {
        self.ping_outstanding.is_some()
    }
    /// Write data held or asked for and not yet completed (see
    /// [`DATA_OUT_BUDGET`]).
    pub fn data_out_held(&self) -> usize {
        self.data_out_held
    }

    fn take_stat_sn(&mut self) -> u32 {
        let s = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        s
    }

    fn new_ttt(&mut self) -> u32 {
        let t = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == RESERVED_TAG {
            self.next_ttt = 1;
        }
        t
    }

    /// A command slot was freed: open the window by one.
    fn slot_done(&mut self) {
        self.max_cmd_sn = self.max_cmd_sn.wrapping_add(1);
    }

    /// Check and consume the CmdSN of a non-immediate command. `false`: the
    /// command is outside the window and must be ignored silently.
    fn accept_cmd_sn(&mut self, immediate: bool, cmd_sn: u32) -> bool {
        if immediate {
            return true;
        }
        // In order and inside the window: an initiator that ignores
        // MaxCmdSN must not get more than the queue depth outstanding.
        if cmd_sn == self.exp_cmd_sn && !sn_lt(self.max_cmd_sn, cmd_sn) {
            self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
            true
        } else {
            false
        }
    }

    pub fn reject(&mut self, bhs: &crate::pdu::Bhs, reason: u8) -> Pdu {
        let m = Reject {
            reason,
            stat_sn: self.take_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
            data_sn: 0,
        };
        Pdu::new(Message::Reject(m).encode(), Bytes::copy_from_slice(&bhs.0))
    }

    /// Target-initiated NOP-In (keep-alive / liveness check); `None` if one
    /// is already waiting for its answer.
    pub fn ping(&mut self) -> Option<Pdu> {
        if self.ping_outstanding.is_some() {
            return None;
        }
        let ttt = self.new_ttt();
        self.ping_outstanding = Some(ttt);
        let m = NopIn { lun: 0, itt: RESERVED_TAG, ttt, stat_sn: self.stat_sn, exp_cmd_sn: self.exp_cmd_sn, max_cmd_sn: self.max_cmd_sn };
        Some(Pdu::new(Message::NopIn(m).encode(), Bytes::new()))
    }

    /// Async Message announcing that the target will drop the connection
    /// (sent before shutdown).
    pub fn async_drop_all(&mut self, time2wait: u16) -> Pdu {
        let m = AsyncMessage {
            lun: 0,
            stat_sn: self.take_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
            event: async_event::DROP_ALL_CONNECTIONS,
            vcode: 0,
            parameter1: 0,
            parameter2: time2wait,
            parameter3: 0,
        };
        Pdu::new(Message::AsyncMessage(m).encode(), Bytes::new())
    }

    /// Handle one received PDU, at `now`.
    pub fn on_pdu(&mut self, pdu: Pdu, now: Instant, out: &mut Vec<Action>) -> Result<(), SessionError> {
        if let Some(c) = self.clock.as_mut() {
            c.idle_ticks = 0;
            if pdu.bhs.opcode_raw() != crate::pdu::Opcode::NopOut as u8 {
                c.last_request = now;
            }
        }
        let msg = match Message::decode(&pdu.bhs) {
            Ok(m) => m,
            Err(_) => {
                out.push(Action::Send(self.reject(&pdu.bhs, reject_reason::COMMAND_NOT_SUPPORTED)));
                return Ok(());
            }
        };
        let discovery = self.cfg.session_type == SessionType::Discovery;
        match msg {
            Message::ScsiCommand(c) if !discovery => self.on_command(c, pdu, out),
            Message::DataOut(d) if !discovery => self.on_data_out(d, pdu.data, out),
            Message::NopOut(n) => {
                self.on_nop_out(n, pdu.data, out);
                Ok(())
            }
            Message::TaskMgmtRequest(t) if !discovery => {
                self.on_tmf(t, out);
                Ok(())
            }
            Message::TextRequest(t) => {
                self.on_text(t, pdu, out);
                Ok(())
            }
            Message::LogoutRequest(l) => {
                self.on_logout(l, out);
                Ok(())
            }
            Message::SnackRequest(_) => {
                // SNACK needs error recovery level 1 or more.
                out.push(Action::Send(self.reject(&pdu.bhs, reject_reason::PROTOCOL_ERROR)));
                Ok(())
            }
            Message::LoginRequest(_) => {
                out.push(Action::Send(self.reject(&pdu.bhs, reject_reason::PROTOCOL_ERROR)));
                Ok(())
            }
            Message::ScsiCommand(_) | Message::DataOut(_) | Message::TaskMgmtRequest(_) => {
                // Not allowed in a discovery session.
                out.push(Action::Send(self.reject(&pdu.bhs, reject_reason::PROTOCOL_ERROR)));
                Ok(())
            }
            _ => {
                // A target-only opcode sent by the initiator.
                out.push(Action::Send(self.reject(&pdu.bhs, reject_reason::PROTOCOL_ERROR)));
                Ok(())
            }
        }
    }

    fn on_command(&mut self, c: ScsiCommand, pdu: Pdu, out: &mut Vec<Action>) -> Result<(), SessionError> {
        if !self.accept_cmd_sn(c.immediate, c.cmd_sn) {
            log_drop(c.cmd_sn, self.exp_cmd_sn, self.max_cmd_sn);
            return Ok(());
        }
        // Slots freed for rejected commands so the window keeps its size.
        let free = |s: &mut Self| {
            if !c.immediate {
                s.slot_done()
            }
        };
        if c.itt == RESERVED_TAG || self.tasks.contains_key(&c.itt) {
            free(self);
            out.push(Action::Send(self.reject(&pdu.bhs, reject_reason::INVALID_PDU_FIELD)));
            return Ok(());
        }
        let imm = pdu.data.len() as u32;
        if imm > 0 && (!c.write || !self.params.immediate_data || imm > self.params.first_burst_length || imm > c.edtl) {
            return Err(SessionError::Protocol("immediate data not allowed or too long"));
        }
        let mut task = self.new_task(&c, full_cdb(&c, &pdu.ahs), imm)?;
        let (id, edtl) = (task.id, if c.write { c.edtl } else { 0 });
        if let Some((status, sense)) = self.refused_at_once(&c) {
            self.tasks.insert(c.itt, task);
            self.complete(c.itt, id, status, &sense, Vec::new(), Residual::None, out);
            return Ok(());
        }
        // The data this command brings without asking, which the
        // session holds until the command completes.
        task.held = task.unsolicited_end.unwrap_or(imm) as usize;
        self.data_out_held += task.held;
        if imm == edtl {
            // All data (possibly none) is here: run it (the task is looked
            // up no more until it completes).
            let data = if imm == 0 { DataOutPieces::new() } else { smallvec::smallvec![pdu.data] };
            task.executing = true;
            out.push(Action::Execute(task.exec(c.itt, data)));
            self.tasks.insert(c.itt, task);
            return Ok(());
        }
        if imm > 0 {
            task.pieces.push((0, pdu.data));
        }
        let waits_for_unsolicited = task.unsolicited_end.is_some();
        self.tasks.insert(c.itt, task);
        if !waits_for_unsolicited {
            self.solicit(c.itt, id, out);
        }
        Ok(())
    }

    /// A new command's task, with `imm` bytes of immediate data in, and
    /// where its unsolicited Data-Out (if any) ends.
    #[inline]
    fn new_task(&mut self, c: &ScsiCommand, cdb: Cdb, imm: u32) -> Result<Task, SessionError> {
        // Unsolicited Data-Out follows unless the F bit says otherwise (or
        // the immediate data already filled the first burst).
        let unsolicited_end = if c.write && !c.final_ && !self.params.initial_r2t {
            Some(self.params.first_burst_length.min(c.edtl)).filter(|&end| end > imm)
        } else {
            None
        };
        if c.write && !c.final_ && self.params.initial_r2t {
            return Err(SessionError::Protocol("unsolicited data announced but InitialR2T=Yes"));
        }
        let id = self.next_id;
        self.next_id += 1;
        Ok(Task {
            id,
            lun: c.lun,
            cdb,
            edtl: c.edtl,
            read: c.read,
            write: c.write,
            pieces: Vec::new(),
            received: imm,
            unsolicited_end,
            unsolicited_data_sn: 0,
            next_r2t_offset: unsolicited_end.unwrap_or(imm),
            r2t_sn: 0,
            r2ts: Vec::new(),
            held: 0,
            solicited: 0,
            executing: false,
            immediate: c.immediate,
        })
    }

    /// The status (and sense) a command is answered with at once, without
    /// running it, if the session will not take it.
    #[inline]
    fn refused_at_once(&self, c: &ScsiCommand) -> Option<(u8, Vec<u8>)> {
        if c.immediate && self.immediate_outstanding() >= MAX_IMMEDIATE_TASKS {
            // Immediate commands bypass the window; bound them here.
            return Some((status::TASK_SET_FULL, Vec::new()));
        }
        if c.write && c.edtl > bw_scsi::MAX_DATA_OUT_BYTES {
            // More data than any command takes (the Block Limits VPD page
            // says so): refuse now rather than solicit it with R2Ts and
            // hold gigabytes until the last byte arrives. Data-Out that
            // still comes for this task is dropped as the task is gone.
            return Some((status::CHECK_CONDITION, bw_scsi::Sense::INVALID_FIELD_IN_CDB.to_fixed()));
        }
        None
    }

    /// The task's unsolicited data (if any) is in: ask for the rest with
    /// R2Ts once the data-out budget allows, after writes that came first.
    fn solicit(&mut self, itt: u32, id: u64, out: &mut Vec<Action>) {
        self.r2t_waiting.push_back((itt, id));
        self.serve_waiting(out);
    }

    /// Give R2T service to waiting writes, oldest first, while their whole
    /// remaining transfer fits in the budget (the oldest always gets it
    /// when no other write is being served, so every write progresses).
    fn serve_waiting(&mut self, out: &mut Vec<Action>) {
        while let Some(&(itt, id)) = self.r2t_waiting.front() {
            let need = match self.tasks.get(&itt) {
                Some(t) if t.id == id => t.edtl.saturating_sub(t.next_r2t_offset) as usize,
                // Ended (aborted, failed) while waiting.
                _ => {
                    self.r2t_waiting.pop_front();
                    continue;
                }
            };
            if self.solicited_held > 0 && self.data_out_held + need > self.cfg.data_out_budget {
                return;
            }
            self.r2t_waiting.pop_front();
            if let Some(t) = self.tasks.get_mut(&itt) {
                t.held += need;
                t.solicited = need;
            }
            self.data_out_held += need;
            self.solicited_held += need;
            self.issue_r2ts(itt, out);
        }
    }

    /// A task ended: give back the budget it held (then call
    /// `serve_waiting`).
    fn release(&mut self, held: usize, solicited: usize) {
        self.data_out_held -= held;
        self.solicited_held -= solicited;
    }

    fn start(&mut self, itt: u32, data: DataOutPieces, out: &mut Vec<Action>) {
        if let Some(t) = self.tasks.get_mut(&itt) {
            t.executing = true;
            out.push(Action::Execute(t.exec(itt, data)));
        }
    }

    /// Send R2Ts for data not yet requested, up to MaxOutstandingR2T.
    fn issue_r2ts(&mut self, itt: u32, out: &mut Vec<Action>) {
        let max_out = self.params.max_outstanding_r2t.max(1) as usize;
        let burst = self.params.max_burst_length.max(512);
        loop {
            let Some(t) = self.tasks.get(&itt) else { return };
            // Only tasks given budget (see `serve_waiting`) get R2Ts.
            if t.solicited == 0 || t.unsolicited_end.is_some() || t.r2ts.len() >= max_out || t.next_r2t_offset >= t.edtl {
                return;
            }
            let ttt = self.new_ttt();
            let (stat_sn, exp, max) = (self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
            let Some(t) = self.tasks.get_mut(&itt) else { return };
            let len = burst.min(t.edtl - t.next_r2t_offset);
            let r = R2t {
                lun: t.lun,
                itt,
                ttt,
                stat_sn,
                exp_cmd_sn: exp,
                max_cmd_sn: max,
                r2t_sn: t.r2t_sn,
                buffer_offset: t.next_r2t_offset,
                desired_length: len,
            };
            t.r2ts.push(R2tState { ttt, offset: t.next_r2t_offset, len, received: 0, next_data_sn: 0 });
            t.r2t_sn += 1;
            t.next_r2t_offset += len;
            out.push(Action::Send(Pdu::new(Message::R2t(r).encode(), Bytes::new())));
        }
    }

    fn on_data_out(&mut self, d: DataOut, data: Bytes, out: &mut Vec<Action>) -> Result<(), SessionError> {
        let itt = d.itt;
        match self.data_out_inner(d, data, out) {
            Err(SessionError::Protocol(why)) if self.tasks.get(&itt).is_some_and(|t| !t.executing) => {
                // A sequencing error in one task's data (wrong DataSN, offset,
                // tag) fails that task only; the connection stays up.
                self.fail_task(itt, why, out);
                Ok(())
            }
            r => r,
        }
    }

    /// End a task that is still receiving data with CHECK CONDITION,
    /// ABORTED COMMAND / DATA PHASE ERROR (4B/00).
    fn fail_task(&mut self, itt: u32, _why: &'static str, out: &mut Vec<Action>) {
        let Some(t) = self.tasks.get(&itt) else { return };
        let id = t.id;
        let sense = bw_scsi::Sense::DATA_PHASE_ERROR.to_fixed();
        self.complete(itt, id, status::CHECK_CONDITION, &sense, Vec::new(), Residual::None, out);
    }

    fn data_out_inner(&mut self, d: DataOut, data: Bytes, out: &mut Vec<Action>) -> Result<(), SessionError> {
        let Some(t) = self.tasks.get_mut(&d.itt) else {
            // Data for a task we aborted (or never had): drop it.
            return Ok(());
        };
        if t.executing || !t.write {
            return Err(SessionError::Protocol("Data-Out for a task that is not receiving data"));
        }
        let len = data.len() as u32;
        let off = d.buffer_offset;
        let end = off.checked_add(len).ok_or(SessionError::Protocol("buffer offset overflow"))?;
        if end > t.edtl {
            return Err(SessionError::Protocol("Data-Out beyond the expected data transfer length"));
        }
        // DataPDUInOrder=Yes (the only value we accept): each Data-Out
        // continues exactly where the last one of its sequence ended, so a
        // task never holds more than its transfer length.
        let mut unsolicited_done = false;
        let mut sequence_done = false;
        if d.ttt == RESERVED_TAG {
            let Some(uend) = t.unsolicited_end else {
                return Err(SessionError::Protocol("unsolicited Data-Out not allowed"));
            };
            if d.data_sn != t.unsolicited_data_sn {
                return Err(SessionError::Protocol("bad DataSN in unsolicited Data-Out"));
            }
            if off != t.received || end > uend {
                return Err(SessionError::Protocol("unsolicited Data-Out out of order or beyond FirstBurstLength"));
            }
            t.unsolicited_data_sn += 1;
            if d.final_ || end == uend {
                // Whatever the burst left out is asked for with R2Ts, and
                // counted again when it is.
                t.unsolicited_end = None;
                t.next_r2t_offset = end;
                t.held -= (uend - end) as usize;
                self.data_out_held -= (uend - end) as usize;
                unsolicited_done = true;
            }
        } else {
            let Some(i) = t.r2ts.iter().position(|r| r.ttt == d.ttt) else {
                return Err(SessionError::Protocol("Data-Out with unknown Target Transfer Tag"));
            };
            let r = &mut t.r2ts[i];
            if d.data_sn != r.next_data_sn {
                return Err(SessionError::Protocol("bad DataSN in solicited Data-Out"));
            }
            if off != r.offset + r.received || end > r.offset + r.len {
                return Err(SessionError::Protocol("solicited Data-Out out of order or outside its R2T"));
            }
            r.next_data_sn += 1;
            r.received += len;
            if d.final_ || r.received == r.len {
                if r.received != r.len {
                    return Err(SessionError::Protocol("R2T sequence ended short"));
                }
                t.r2ts.remove(i);
                sequence_done = true;
            }
        }
        if !data.is_empty() {
            t.pieces.push((off, data));
        }
        t.received += len;
        let (id, all_here) = (t.id, t.received == t.edtl && t.r2ts.is_empty() && t.unsolicited_end.is_none());
        if all_here {
            let data = in_order(std::mem::take(&mut t.pieces), t.edtl as usize);
            self.start(d.itt, data, out);
        } else if unsolicited_done {
            self.solicit(d.itt, id, out);
        } else if sequence_done {
            self.issue_r2ts(d.itt, out);
        }
        Ok(())
    }

    /// A command finished: `status`/`sense` from the SCSI layer, `data_in`
    /// everything it produced, `write_residual` from [`write_outcome`].
    #[allow(clippy::too_many_arguments)]
    pub fn complete(&mut self, itt: u32, id: u64, status: u8, sense: &[u8], mut data_in: Vec<u8>, write_residual: Residual, out: &mut Vec<Action>) {
        let Some(t) = self.take_task(itt, id) else { return };
        let read_residual = t.residual(data_in.len(), write_residual);
        if !t.write_only() {
            data_in.truncate(t.edtl as usize);
        }
        let data_in = Bytes::from(data_in);
        let len = data_in.len();
        self.respond(itt, &t, status, sense, len, read_residual, out, |pdu, off, end| Some(Action::Send(Pdu { data: data_in.slice(off..end), ..pdu })));
        self.serve_waiting(out);
    }

    /// [`TargetSession::complete`] for a command that produced neither
    /// data-in nor sense (a write, most often): the header of its SCSI
    /// Response, which the transport queues at once, ahead of what `out`
    /// gets (R2Ts for writes that waited for the budget this one held).
    /// No action, PDU or buffer is made for it. `None`: the task is gone
    /// (aborted meanwhile), nothing to send.
    pub fn complete_status(&mut self, itt: u32, id: u64, status: u8, write_residual: Residual, out: &mut Vec<Action>) -> Option<crate::pdu::Bhs> {
        let t = self.take_task(itt, id)?;
        let residual = t.residual(0, write_residual);
        let r = self.status_response(itt, &t, status, 0, residual);
        self.serve_waiting(out);
        Some(Message::ScsiResponse(r).encode())
    }

    /// The SCSI Response that ends task `t` after `data_sn` Data-In PDUs.
    fn status_response(&mut self, itt: u32, t: &Ended, status: u8, data_sn: u32, residual: Residual) -> ScsiResponse {
        ScsiResponse {
            response: 0,
            status,
            itt,
            stat_sn: self.take_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
            exp_data_sn: data_sn.max(t.r2t_sn),
            residual,
        }
    }

    /// A read finished as a read extent of `len` bytes that the transport
    /// sends itself: GOOD status, each Data-In PDU handed to `data_in` (the
    /// PDU, the offset of its data in the extent and its length, in order;
    /// the extent is cut to the expected transfer length). The transport
    /// sends the header for that length (see [`Pdu::header_bytes_for`]),
    /// the bytes, then padding; only without a data digest. The PDUs are
    /// handed over rather than pushed to `out` as actions: the transport
    /// queues each where it is made, with no action built, moved and
    /// matched per read (~100 instructions of a 4 KiB read). `out` gets
    /// the rest (R2Ts of writes that waited for the budget this read held).
    pub fn complete_extent_with(&mut self, itt: u32, id: u64, len: usize, out: &mut Vec<Action>, mut data_in: impl FnMut(Pdu, usize, usize)) {
        let Some(t) = self.take_task(itt, id) else { return };
        let edtl = t.edtl as usize;
        let residual = Residual::of(len, edtl);
        let len = len.min(edtl);
        self.respond(itt, &t, status::GOOD, &[], len, residual, out, |pdu, at, end| {
            data_in(pdu, at, end - at);
            None
        });
        self.serve_waiting(out);
    }

    /// The byte ranges of the Data-In PDUs that carry `len` bytes of
    /// data-in: each ends at the initiator's segment limit or at a burst
    /// boundary. A transport that reads the data into its send buffer
    /// itself lays it out by these before [`TargetSession::complete_extent_with`]
    /// makes the headers (one per range, in this order).
    pub fn data_in_segments(&self, len: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
        let mss = self.params.max_send_data_segment_length.max(512) as usize;
        let burst = self.params.max_burst_length.max(512) as usize;
        let mut off = 0usize;
        std::iter::from_fn(move || {
            (off < len).then(|| {
                let burst_end = (off / burst + 1) * burst;
                let end = (off + mss).min(len).min(burst_end);
                let r = off..end;
                off = end;
                r
            })
        })
    }

    /// The task `itt` if it is still the one with `id` (not aborted
    /// meanwhile), removed; its command slot and data-out budget are freed.
    fn take_task(&mut self, itt: u32, id: u64) -> Option<Ended> {
        // A task with the ITT but another id is a newer one (the one asked
        // for was aborted): it stays.
        let (t, immediate, held, solicited) = self
            .tasks
            .remove_with(&itt, |t| (t.id == id).then(|| (t.ended(), t.immediate, t.held, t.solicited)))?;
        if !immediate {
            self.slot_done();
        }
        self.release(held, solicited);
        Some(t)
    }

    /// Data-In PDUs for `len` bytes of data (built by `data_pdu` from a
    /// header-only PDU and a byte range), with the status in the last one
    /// when there is no sense data, else a SCSI Response after them.
    #[allow(clippy::too_many_arguments)]
    fn respond(
        &mut self,
        itt: u32,
        t: &Ended,
        status: u8,
        sense: &[u8],
        len: usize,
        read_residual: Residual,
        out: &mut Vec<Action>,
        mut data_pdu: impl FnMut(Pdu, usize, usize) -> Option<Action>,
    ) {
        let burst = self.params.max_burst_length.max(512) as usize;
        let mut data_sn = 0u32;
        let collapse = sense.is_empty();
        for std::ops::Range { start: off, end } in self.data_in_segments(len) {
            let burst_end = (off / burst + 1) * burst;
            let last = end == len;
            let with_status = last && collapse;
            let m = DataIn {
                final_: last || end == burst_end,
                ack: false,
                has_status: with_status,
                status: if with_status { status } else { 0 },
                lun: t.lun,
                itt,
                ttt: RESERVED_TAG,
                stat_sn: if with_status { self.take_stat_sn() } else { 0 },
                exp_cmd_sn: self.exp_cmd_sn,
                max_cmd_sn: self.max_cmd_sn,
                data_sn,
                buffer_offset: off as u32,
                residual: if with_status { read_residual } else { Residual::None },
            };
            if let Some(a) = data_pdu(Pdu::new(Message::DataIn(m).encode(), Bytes::new()), off, end) {
                out.push(a);
            }
            data_sn += 1;
        }
        if len == 0 || !collapse {
            let r = self.status_response(itt, t, status, data_sn, read_residual);
            let data = if sense.is_empty() {
                Bytes::new()
            } else {
                let mut b = BytesMut::with_capacity(2 + sense.len());
                b.put_u16(sense.len() as u16);
                b.put_slice(sense);
                b.freeze()
            };
            out.push(Action::Send(Pdu::new(Message::ScsiResponse(r).encode(), data)));
        }
    }

    fn on_nop_out(&mut self, n: NopOut, data: Bytes, out: &mut Vec<Action>) {
        if n.itt == RESERVED_TAG {
            // Answer to our NOP-In (or an unsolicited one-way ping): no reply.
            if n.ttt != RESERVED_TAG && self.ping_outstanding == Some(n.ttt) {
                self.ping_outstanding = None;
            }
            if !n.immediate && self.accept_cmd_sn(false, n.cmd_sn) {
                // A non-immediate NOP-Out with no reply still uses a CmdSN.
                self.slot_done();
            }
            return;
        }
        if !self.accept_cmd_sn(n.immediate, n.cmd_sn) {
            return;
        }
        if !n.immediate {
            self.slot_done();
        }
        let m = NopIn {
            lun: n.lun,
            itt: n.itt,
            ttt: RESERVED_TAG,
            stat_sn: self.take_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
        };
        out.push(Action::Send(Pdu::new(Message::NopIn(m).encode(), data)));
    }

    /// End the tasks `pred` picks; writes waiting for budget may then get
    /// their R2Ts.
    fn abort_where(&mut self, pred: impl Fn(&Task) -> bool, out: &mut Vec<Action>) -> usize {
        let victims: Vec<u32> = self.tasks.iter().filter(|(_, t)| pred(t)).map(|(k, _)| *k).collect();
        for itt in &victims {
            if let Some(t) = self.tasks.remove(itt) {
                if !t.immediate {
                    self.slot_done();
                }
                self.release(t.held, t.solicited);
            }
        }
        self.serve_waiting(out);
        victims.len()
    }

    fn on_tmf(&mut self, t: TaskMgmtRequest, out: &mut Vec<Action>) {
        if !self.accept_cmd_sn(t.immediate, t.cmd_sn) {
            return;
        }
        if !t.immediate {
            self.slot_done();
        }
        let response = match TmfFunction::try_from(t.function).ok() {
            Some(TmfFunction::AbortTask) => {
                // Matched by tag alone: some initiators leave the LUN at 0.
                if let Some(id) = self.tasks.get(&t.referenced_task_tag).map(|x| x.id) {
                    self.abort_where(|x| x.id == id, out);
                    tmf_response::FUNCTION_COMPLETE
                } else {
                    tmf_response::TASK_DOES_NOT_EXIST
                }
            }
            Some(TmfFunction::AbortTaskSet) | Some(TmfFunction::ClearTaskSet) => {
                self.abort_where(|x| x.lun == t.lun, out);
                tmf_response::FUNCTION_COMPLETE
            }
            Some(TmfFunction::LunReset) => {
                self.abort_where(|x| x.lun == t.lun, out);
                out.push(Action::LunReset { itt: t.itt, lun: t.lun });
                return;
            }
            Some(TmfFunction::TargetWarmReset) | Some(TmfFunction::TargetColdReset) => {
                self.abort_where(|_| true, out);
                out.push(Action::TargetReset { itt: t.itt, cold: t.function == TmfFunction::TargetColdReset as u8 });
                return;
            }
            Some(TmfFunction::TaskReassign) => tmf_response::REASSIGNMENT_NOT_SUPPORTED,
            Some(TmfFunction::ClearAca) | None => tmf_response::NOT_SUPPORTED,
        };
        out.push(Action::Send(self.finish_tmf(t.itt, response)));
    }

    /// The TMF Response for a task management request.
    pub fn finish_tmf(&mut self, itt: u32, response: u8) -> Pdu {
        let m = TaskMgmtResponse { response, itt, stat_sn: self.take_stat_sn(), exp_cmd_sn: self.exp_cmd_sn, max_cmd_sn: self.max_cmd_sn };
        Pdu::new(Message::TaskMgmtResponse(m).encode(), Bytes::new())
    }

    fn on_text(&mut self, t: TextRequest, pdu: Pdu, out: &mut Vec<Action>) {
        if !self.accept_cmd_sn(t.immediate, t.cmd_sn) {
            return;
        }
        if !t.immediate {
            self.slot_done();
        }
        let mss = self.params.max_send_data_segment_length.max(512) as usize;
        // Continuation of a long answer we are sending in parts.
        if t.ttt != RESERVED_TAG {
            match self.text_pending.take() {
                Some((ttt, rest)) if ttt == t.ttt => {
                    self.text_reply(t.itt, t.lun, rest, mss, out);
                }
                _ => out.push(Action::Send(self.reject(&pdu.bhs, reject_reason::INVALID_PDU_FIELD))),
            }
            return;
        }
        self.text_partial.extend_from_slice(&pdu.data);
        if self.text_partial.len() > 64 * 1024 {
            self.text_partial.clear();
            out.push(Action::Send(self.reject(&pdu.bhs, reject_reason::PROTOCOL_ERROR)));
            return;
        }
        if t.continue_ {
            let m = TextResponse { final_: false, continue_: false, lun: t.lun, itt: t.itt, ttt: self.new_ttt(), stat_sn: self.take_stat_sn(), exp_cmd_sn: self.exp_cmd_sn, max_cmd_sn: self.max_cmd_sn };
            out.push(Action::Send(Pdu::new(Message::TextResponse(m).encode(), Bytes::new())));
            return;
        }
        let raw = std::mem::take(&mut self.text_partial);
        let pairs = match text::parse(&raw) {
            Ok(p) => p,
            Err(_) => {
                out.push(Action::Send(self.reject(&pdu.bhs, reject_reason::PROTOCOL_ERROR)));
                return;
            }
        };
        let mut answer: Vec<(String, String)> = Vec::new();
        for (k, v) in &pairs {
            if k == "SendTargets" {
                if v == "All" && self.cfg.session_type != SessionType::Discovery {
                    // RFC 7143 13.3: "All" only in discovery sessions; a normal
                    // session gets its own target.
                    answer.extend(crate::target_login::send_targets(&self.cfg.targets, "", self.cfg.current_target.as_deref()));
                } else {
                    answer.extend(crate::target_login::send_targets(&self.cfg.targets, v, self.cfg.current_target.as_deref()));
                }
            } else {
                answer.push((k.clone(), "NotUnderstood".into()));
            }
        }
        self.text_reply(t.itt, t.lun, Bytes::from(text::encode(&answer)), mss, out);
    }

    fn text_reply(&mut self, itt: u32, lun: u64, body: Bytes, mss: usize, out: &mut Vec<Action>) {
        let more = body.len() > mss;
        let ttt = if more { self.new_ttt() } else { RESERVED_TAG };
        let m = TextResponse {
            final_: !more,
            continue_: more,
            lun,
            itt,
            ttt,
            stat_sn: self.take_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
        };
        let now = body.slice(..body.len().min(mss));
        if more {
            self.text_pending = Some((ttt, body.slice(mss..)));
        }
        out.push(Action::Send(Pdu::new(Message::TextResponse(m).encode(), now)));
    }

    fn on_logout(&mut self, l: LogoutRequest, out: &mut Vec<Action>) {
        if !self.accept_cmd_sn(l.immediate, l.cmd_sn) {
            return;
        }
        if !l.immediate {
            self.slot_done();
        }
        let response = match l.reason {
            0 => 0,
            1 if l.cid == self.cfg.cid => 0,
            1 => 1,
            _ => 2,
        };
        // Outstanding tasks end with the session.
        if response == 0 {
            self.abort_where(|_| true, out);
        }
        let m = LogoutResponse {
            response,
            itt: l.itt,
            stat_sn: self.take_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
            time2wait: 0,
            time2retain: 0,
        };
        out.push(Action::Send(Pdu::new(Message::LogoutResponse(m).encode(), Bytes::new())));
        if response == 0 {
            out.push(Action::Close);
        }
    }
}

/// The received pieces as consecutive buffers from offset 0. Pieces
/// normally arrive in order and back to back (DataPDUInOrder); anything else
/// (gaps, overlaps) is assembled into one zero-filled buffer of `len` bytes.
fn in_order(mut pieces: Vec<(u32, Bytes)>, len: usize) -> DataOutPieces {
    pieces.sort_by_key(|(off, _)| *off);
    let mut next = 0usize;
    let contiguous = pieces.iter().all(|(off, b)| {
        let ok = *off as usize == next;
        next += b.len();
        ok
    });
    if contiguous {
        return pieces.into_iter().map(|(_, b)| b).collect();
    }
    let mut buf = BytesMut::zeroed(len);
    for (off, b) in pieces {
        let off = off as usize;
        let end = (off + b.len()).min(len);
        if off < end {
            buf[off..end].copy_from_slice(&b[..end - off]);
        }
    }
    smallvec::smallvec![buf.freeze()]
}

/// The command's CDB, with an extended CDB AHS's bytes after its 16.
#[inline]
fn full_cdb(c: &ScsiCommand, ahs: &[u8]) -> Cdb {
    match extended_cdb(ahs) {
        Some(ext) => {
            let mut v = c.cdb.to_vec();
            v.extend_from_slice(ext);
            Cdb::Long(Bytes::from(v))
        }
        None => Cdb::Short(c.cdb),
    }
}

fn log_drop(_cmd_sn: u32, _exp: u32, _max: u32) {
    // Out-of-window commands are ignored silently (RFC 7143 3.2.2.1).
}

/// Decide how a write-type command's data maps onto what the CDB asks for.
/// `wanted` is the data-out length the CDB implies, `got` what the
/// initiator sent (its EDTL). Returns the residual to report and, when the
/// initiator sent too little, the CHECK CONDITION sense to fail it with.
pub fn write_outcome(wanted: usize, got: usize) -> (Residual, Option<Vec<u8>>) {
    let r = Residual::of(wanted, got);
    if wanted > got {
        (r, Some(sense_invalid_field_in_iu()))
    } else {
        (r, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_and_idle_timers() {
        let (t0, nop) = (Instant::now(), Duration::from_secs(15));
        let mut s = session(8192).with_timers(Timers { nop_interval: nop, idle_limit: None }, t0);
        assert_eq!(s.poll_timeout(), Some(t0 + nop));
        let mut out = Vec::new();
        s.handle_timeout(t0 + nop / 2, &mut out).unwrap();
        assert!(out.is_empty(), "nothing before the interval ends");
        s.handle_timeout(t0 + nop, &mut out).unwrap();
        assert!(matches!(&out[..], [Action::Send(_)]) && s.ping_outstanding(), "a NOP-In after one interval");
        // Any PDU restarts the count: no error one interval later.
        read_command(&mut s, 1, 512);
        out.clear();
        s.handle_timeout(t0 + 2 * nop, &mut out).unwrap();
        assert!(out.is_empty(), "one ping at a time");
        // Two intervals without a PDU while the ping waits end it.
        assert_eq!(s.handle_timeout(t0 + 3 * nop, &mut out), Err(SessionError::NopTimeout));

        let idle = Duration::from_secs(40);
        let mut d = session(8192).with_timers(Timers { nop_interval: nop, idle_limit: Some(idle) }, t0);
        assert_eq!(d.poll_timeout(), Some(t0 + nop));
        assert_eq!(d.handle_timeout(t0 + idle, &mut out), Err(SessionError::Idle(idle)));
        assert_eq!(session(8192).poll_timeout(), None, "no timers unless asked for");
    }

    fn session(mss: u32) -> TargetSession {
        let params = SessionParams { max_send_data_segment_length: mss, ..SessionParams::default() };
        TargetSession::new(SessionConfig {
            session_type: SessionType::Normal,
            params,
            queue_depth: 8,
            exp_cmd_sn: 1,
            stat_sn: 10,
            cid: 0,
            targets: Vec::new(),
            current_target: None,
            data_out_budget: DATA_OUT_BUDGET,
        })
    }

    fn read_command(s: &mut TargetSession, itt: u32, edtl: u32) -> Exec {
        let c = ScsiCommand { final_: true, read: true, itt, edtl, cmd_sn: s.exp_cmd_sn(), cdb: [0x28; 16], ..Default::default() };
        let mut out = Vec::new();
        s.on_pdu(Pdu::new(Message::ScsiCommand(c).encode(), Bytes::new()), Instant::now(), &mut out).unwrap();
        match out.pop() {
            Some(Action::Execute(e)) => e,
            other => panic!("expected Execute, got {other:?}"),
        }
    }

    fn data_in(p: &Pdu) -> DataIn {
        match Message::decode(&p.bhs).unwrap() {
            Message::DataIn(d) => d,
            m => panic!("expected Data-In, got {m:?}"),
        }
    }

    /// A read extent becomes the same Data-In sequence as buffered data:
    /// segments cut at MaxRecvDataSegmentLength, status in the last one,
    /// and an extent longer than the EDTL is cut with an overflow residual.
    #[test]
    fn extent_completion_matches_buffered() {
        for (len, edtl) in [(4096usize, 4096u32), (20_000, 20_000), (20_000, 12_288), (512, 4096)] {
            let mut a = session(8192);
            let mut b = session(8192);
            let ea = read_command(&mut a, 5, edtl);
            let eb = read_command(&mut b, 5, edtl);
            let mut buffered = Vec::new();
            a.complete(5, ea.id, status::GOOD, &[], vec![7u8; len], Residual::None, &mut buffered);
            let (mut handed, mut rest) = (Vec::new(), Vec::new());
            b.complete_extent_with(5, eb.id, len, &mut rest, |pdu, at, n| handed.push((pdu, at, n)));
            assert!(rest.is_empty(), "{rest:?}");
            assert_eq!(buffered.len(), handed.len());
            let mut next = 0;
            for (x, (pdu, at, n)) in buffered.iter().zip(&handed) {
                let Action::Send(p) = x else { panic!("{x:?}") };
                assert_eq!((*at, p.data.len()), (next, *n));
                next += n;
                assert!(pdu.data.is_empty());
                assert_eq!(data_in(p), data_in(pdu));
                // The header sent for the extent carries its length.
                assert_eq!(&pdu.header_bytes_for(Default::default(), *n)[..], &p.header_bytes(Default::default())[..]);
            }
            assert_eq!(next, len.min(edtl as usize));
            let last = data_in(&handed.last().unwrap().0);
            assert!(last.has_status && last.final_);
            assert_eq!(last.residual, Residual::of(len, edtl as usize));
            assert_eq!((a.outstanding(), b.outstanding()), (0, 0));
            assert_eq!((a.max_cmd_sn(), a.exp_cmd_sn()), (b.max_cmd_sn(), b.exp_cmd_sn()));
        }
    }

    /// A completion with neither data nor sense, taken the short way,
    /// sends what [`TargetSession::complete`] sends: the same SCSI Response
    /// (status, residual, StatSN, window), then the R2Ts of a write that
    /// waited for the budget it gave back; a read that produced nothing
    /// reports its whole length as underflow; an aborted task sends nothing.
    #[test]
    fn status_completion_matches_complete() {
        let mut a = write_session(true, 8, 64 << 10);
        let mut b = write_session(true, 8, 64 << 10);
        for s in [&mut a, &mut b] {
            assert_eq!(r2ts(&write(s, 1, 64 << 10, true)).len(), 1);
            assert!(r2ts(&write(s, 2, 64 << 10, true)).is_empty(), "waits for the budget");
        }
        let (mut long, mut short) = (Vec::new(), Vec::new());
        a.complete(1, 1, status::GOOD, &[], Vec::new(), Residual::Underflow(512), &mut long);
        let head = b.complete_status(1, 1, status::GOOD, Residual::Underflow(512), &mut short).expect("a live task");
        let Some(Action::Send(resp)) = long.first() else { panic!("{long:?}") };
        assert_eq!(resp.bhs.0, head.0);
        assert!(resp.data.is_empty());
        assert_eq!(r2ts(&long[1..]), r2ts(&short));
        assert_eq!(r2ts(&short).len(), 1, "the waiting write got its R2T");
        assert_eq!((a.outstanding(), a.max_cmd_sn(), a.data_out_held()), (b.outstanding(), b.max_cmd_sn(), b.data_out_held()));

        let (mut x, mut y) = (session(8192), session(8192));
        let (ex, ey) = (read_command(&mut x, 7, 4096), read_command(&mut y, 7, 4096));
        let mut long = Vec::new();
        x.complete(7, ex.id, status::GOOD, &[], Vec::new(), Residual::None, &mut long);
        let head = y.complete_status(7, ey.id, status::GOOD, Residual::None, &mut Vec::new()).unwrap();
        let [Action::Send(resp)] = &long[..] else { panic!("{long:?}") };
        assert_eq!(resp.bhs.0, head.0);
        let Ok(Message::ScsiResponse(r)) = Message::decode(&head) else { panic!() };
        assert_eq!(r.residual, Residual::Underflow(4096));
        assert_eq!(y.complete_status(7, ey.id, status::GOOD, Residual::None, &mut Vec::new()), None, "gone");
    }

    /// Data-out pieces are handed over as received when they tile the
    /// buffer, and assembled into one buffer when they do not.
    #[test]
    fn data_out_pieces_in_order() {
        let b = |v: &[u8]| Bytes::copy_from_slice(v);
        let tiled = in_order(vec![(3, b(b"def")), (0, b(b"abc")), (6, b(b"g"))], 7);
        assert_eq!(tiled.to_vec(), vec![b(b"abc"), b(b"def"), b(b"g")]);
        let gap = in_order(vec![(0, b(b"ab")), (4, b(b"ef"))], 6);
        assert_eq!(gap.to_vec(), vec![b(b"ab\0\0ef")]);
        let overlap = in_order(vec![(0, b(b"abc")), (2, b(b"XY"))], 4);
        assert_eq!(overlap.to_vec(), vec![b(b"abXY")]);
        assert!(in_order(Vec::new(), 0).is_empty());
    }

    /// A WRITE announcing more data than any command takes is refused at
    /// once with CHECK CONDITION, without an R2T (which would have the
    /// target hold up to 4 GiB until the last byte came); its unsolicited
    /// Data-Out is dropped; the window stays open. Found by the socket
    /// fuzzer (crates/cli/tests/integration/socket_fuzz.rs).
    #[test]
    fn oversized_write_is_refused_without_r2t() {
        for initial_r2t in [true, false] {
            let params = SessionParams { initial_r2t, max_burst_length: 1 << 20, ..SessionParams::default() };
            let mut s = TargetSession::new(SessionConfig {
                session_type: SessionType::Normal,
                params,
                queue_depth: 8,
                exp_cmd_sn: 1,
                stat_sn: 10,
                cid: 0,
                targets: Vec::new(),
                current_target: None,
                data_out_budget: DATA_OUT_BUDGET,
            });
            let window = s.max_cmd_sn();
            for (i, edtl) in [u32::MAX, bw_scsi::MAX_DATA_OUT_BYTES + 1].into_iter().enumerate() {
                let itt = 20 + i as u32;
                let c = ScsiCommand { final_: initial_r2t, write: true, itt, edtl, cmd_sn: s.exp_cmd_sn(), cdb: [0x8A; 16], ..Default::default() };
                let mut out = Vec::new();
                s.on_pdu(Pdu::new(Message::ScsiCommand(c).encode(), Bytes::new()), Instant::now(), &mut out).unwrap();
                let [Action::Send(p)] = &out[..] else { panic!("EDTL {edtl:#x}: expected one response, got {out:?}") };
                let Ok(Message::ScsiResponse(r)) = Message::decode(&p.bhs) else { panic!("EDTL {edtl:#x}: not a SCSI Response: {p:?}") };
                assert_eq!((r.itt, r.status), (itt, status::CHECK_CONDITION));
                assert_eq!(&p.data[2..][12..14], &[0x24, 0x00], "INVALID FIELD IN CDB");
                // Unsolicited data for the refused task is dropped quietly.
                let d = DataOut { final_: true, itt, ttt: RESERVED_TAG, ..Default::default() };
                let mut more = Vec::new();
                s.on_pdu(Pdu::new(Message::DataOut(d).encode(), Bytes::from(vec![0u8; 4096])), Instant::now(), &mut more).unwrap();
                assert!(more.is_empty(), "{more:?}");
            }
            assert_eq!(s.outstanding(), 0);
            assert_eq!(s.max_cmd_sn(), window.wrapping_add(2));
            // The largest transfer allowed is still solicited.
            let c = ScsiCommand { final_: true, write: true, itt: 30, edtl: bw_scsi::MAX_DATA_OUT_BYTES, cmd_sn: s.exp_cmd_sn(), cdb: [0x8A; 16], ..Default::default() };
            let mut out = Vec::new();
            s.on_pdu(Pdu::new(Message::ScsiCommand(c).encode(), Bytes::new()), Instant::now(), &mut out).unwrap();
            assert!(matches!(out.first().map(|a| match a { Action::Send(p) => Message::decode(&p.bhs).ok(), _ => None }), Some(Some(Message::R2t(_)))), "{out:?}");
        }
    }

    fn send(s: &mut TargetSession, m: Message) -> Vec<Action> {
        let mut out = Vec::new();
        s.on_pdu(Pdu::new(m.encode(), Bytes::new()), Instant::now(), &mut out).unwrap();
        out
    }

    fn is_r2t(a: &Action) -> bool {
        matches!(a, Action::Send(p) if matches!(Message::decode(&p.bhs), Ok(Message::R2t(_))))
    }

    /// An initiator that ignores MaxCmdSN gets no more than the queue depth
    /// outstanding: commands past the window are ignored (RFC 7143 3.2.2.1),
    /// and accepted again once a slot opens. Found by the `session` fuzz target.
    #[test]
    fn commands_beyond_max_cmd_sn_are_ignored() {
        let mut s = session(8192);
        let first = s.exp_cmd_sn();
        let mut r2ts = 0;
        for i in 0..20u32 {
            // WRITEs that wait for data which never comes.
            let c = ScsiCommand { final_: true, write: true, itt: 100 + i, edtl: 4096, cmd_sn: first.wrapping_add(i), cdb: [0x8A; 16], ..Default::default() };
            r2ts += send(&mut s, Message::ScsiCommand(c)).iter().filter(|a| is_r2t(a)).count();
        }
        assert_eq!((r2ts, s.outstanding()), (8, 8));
        assert_eq!(s.exp_cmd_sn(), first.wrapping_add(8));
        assert_eq!(s.max_cmd_sn(), first.wrapping_add(7), "window closed");
        // Ending one task opens one slot, and the next CmdSN gets in.
        let tmf = TaskMgmtRequest { immediate: true, function: TmfFunction::AbortTask as u8, itt: 1, referenced_task_tag: 100, ..Default::default() };
        send(&mut s, Message::TaskMgmtRequest(tmf));
        assert_eq!(s.max_cmd_sn(), first.wrapping_add(8));
        let c = ScsiCommand { final_: true, write: true, itt: 200, edtl: 4096, cmd_sn: first.wrapping_add(8), cdb: [0x8A; 16], ..Default::default() };
        assert!(send(&mut s, Message::ScsiCommand(c)).iter().any(is_r2t));
        assert_eq!(s.outstanding(), 8);
    }

    /// Immediate commands sit outside the window: their end opens no slot,
    /// and past MAX_IMMEDIATE_TASKS outstanding they get TASK SET FULL.
    /// Found by the `session` fuzz target (regression input in
    /// crates/iscsi/fuzz/regressions/session).
    #[test]
    fn immediate_commands_neither_open_the_window_nor_pile_up() {
        let mut s = session(8192);
        let (exp, max) = (s.exp_cmd_sn(), s.max_cmd_sn());
        let mut execs = Vec::new();
        let mut full = 0;
        for i in 0..MAX_IMMEDIATE_TASKS as u32 + 5 {
            let c = ScsiCommand { immediate: true, final_: true, read: true, itt: 300 + i, edtl: 512, cmd_sn: exp, cdb: [0x88; 16], ..Default::default() };
            for a in send(&mut s, Message::ScsiCommand(c)) {
                match a {
                    Action::Execute(e) => execs.push(e),
                    Action::Send(p) => match Message::decode(&p.bhs) {
                        Ok(Message::ScsiResponse(r)) if r.status == status::TASK_SET_FULL => full += 1,
                        other => panic!("{other:?}"),
                    },
                    other => panic!("{other:?}"),
                }
            }
        }
        assert_eq!((execs.len(), full), (MAX_IMMEDIATE_TASKS, 5));
        let mut out = Vec::new();
        for e in execs {
            s.complete(e.itt, e.id, status::GOOD, &[], vec![0u8; 512], Residual::None, &mut out);
        }
        assert_eq!((s.exp_cmd_sn(), s.max_cmd_sn(), s.outstanding()), (exp, max, 0), "immediate commands moved the window");
    }

    /// A 4 KiB write with its data immediate, as a transport would run it
    /// inline: the Execute it releases.
    fn immediate_write(s: &mut TargetSession, itt: u32, lun: u64) -> Exec {
        let c = ScsiCommand { final_: true, write: true, itt, lun, edtl: 4096, cmd_sn: s.exp_cmd_sn(), cdb: [0x8A; 16], ..Default::default() };
        let mut out = Vec::new();
        s.on_pdu(Pdu::new(Message::ScsiCommand(c).encode(), Bytes::from(vec![7u8; 4096])), Instant::now(), &mut out).unwrap();
        match out.pop() {
            Some(Action::Execute(e)) => e,
            other => panic!("expected Execute, got {other:?}"),
        }
    }

    fn tmf_response(out: &[Action]) -> u8 {
        match out.iter().find_map(|a| match a { Action::Send(p) => Message::decode(&p.bhs).ok(), _ => None }) {
            Some(Message::TaskMgmtResponse(r)) => r.response,
            other => panic!("expected a TMF response, got {other:?}"),
        }
    }

    /// Task management finds a running write wherever the session holds
    /// it: the newest task (kept beside the task map, see
    /// [`crate::task_map`]) as well as older ones. ABORT TASK ends the
    /// newest and its completion then sends nothing; LUN RESET ends the
    /// LUN's tasks, the newest among them, and leaves other LUNs'.
    #[test]
    fn task_management_finds_the_newest_task() {
        let mut s = write_session(false, 8, DATA_OUT_BUDGET);
        let e = immediate_write(&mut s, 1, 0);
        let tmf = TaskMgmtRequest { immediate: true, function: TmfFunction::AbortTask as u8, itt: 90, referenced_task_tag: 1, ..Default::default() };
        assert_eq!(tmf_response(&send(&mut s, Message::TaskMgmtRequest(tmf))), tmf_response::FUNCTION_COMPLETE);
        assert_eq!(s.outstanding(), 0);
        assert!(s.complete_status(1, e.id, status::GOOD, Residual::None, &mut Vec::new()).is_none(), "an aborted write answered");

        let other_lun = 1u64 << 48;
        let older = immediate_write(&mut s, 2, 0);
        let kept = immediate_write(&mut s, 3, other_lun);
        let newest = immediate_write(&mut s, 4, 0);
        assert_eq!(s.data_out_held(), 3 * 4096);
        let reset = TaskMgmtRequest { immediate: true, function: TmfFunction::LunReset as u8, itt: 91, lun: 0, ..Default::default() };
        let out = send(&mut s, Message::TaskMgmtRequest(reset));
        assert!(matches!(out.last(), Some(Action::LunReset { itt: 91, lun: 0 })), "{out:?}");
        assert_eq!((s.outstanding(), s.data_out_held()), (1, 4096));
        let mut out = Vec::new();
        assert!(s.complete_status(4, newest.id, status::GOOD, Residual::None, &mut out).is_none(), "the newest write survived a LUN reset");
        assert!(s.complete_status(2, older.id, status::GOOD, Residual::None, &mut out).is_none());
        assert!(s.complete_status(3, kept.id, status::GOOD, Residual::None, &mut out).is_some(), "another LUN's write was ended");
        assert_eq!((s.outstanding(), s.data_out_held()), (0, 0));
    }

    /// A task aborted while its extent was being planned gets no PDUs.
    #[test]
    fn extent_for_aborted_task_is_dropped() {
        let mut s = session(8192);
        let e = read_command(&mut s, 9, 4096);
        let mut out = Vec::new();
        s.complete_extent_with(9, e.id + 1, 4096, &mut out, |_, _, _| panic!("a Data-In for a task that is gone"));
        assert!(out.is_empty());
        assert_eq!(s.outstanding(), 1);
    }

    fn write_session(initial_r2t: bool, queue_depth: u32, data_out_budget: usize) -> TargetSession {
        let params = SessionParams {
            initial_r2t,
            immediate_data: true,
            first_burst_length: 256 << 10,
            max_burst_length: 1 << 20,
            max_outstanding_r2t: 1,
            max_recv_data_segment_length: 256 << 10,
            ..SessionParams::default()
        };
        TargetSession::new(SessionConfig {
            session_type: SessionType::Normal,
            params,
            queue_depth,
            exp_cmd_sn: 1,
            stat_sn: 10,
            cid: 0,
            targets: Vec::new(),
            current_target: None,
            data_out_budget,
        })
    }

    /// A WRITE of `edtl` bytes; `final_` false announces unsolicited Data-Out.
    fn write(s: &mut TargetSession, itt: u32, edtl: u32, final_: bool) -> Vec<Action> {
        let c = ScsiCommand { final_, write: true, itt, edtl, cmd_sn: s.exp_cmd_sn(), cdb: [0x8A; 16], ..Default::default() };
        send(s, Message::ScsiCommand(c))
    }

    fn data_out(s: &mut TargetSession, itt: u32, ttt: u32, data_sn: u32, offset: u32, len: usize, final_: bool) -> Vec<Action> {
        let d = DataOut { final_, itt, ttt, data_sn, buffer_offset: offset, ..Default::default() };
        let mut out = Vec::new();
        s.on_pdu(Pdu::new(Message::DataOut(d).encode(), Bytes::from(vec![0x5a; len])), Instant::now(), &mut out).unwrap();
        out
    }

    fn r2ts(out: &[Action]) -> Vec<R2t> {
        out.iter()
            .filter_map(|a| match a {
                Action::Send(p) => match Message::decode(&p.bhs) {
                    Ok(Message::R2t(r)) => Some(r),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    /// The task `itt` ended with CHECK CONDITION, DATA PHASE ERROR.
    fn failed_with_data_phase_error(out: &[Action], itt: u32) -> bool {
        out.iter().any(|a| match a {
            Action::Send(p) => matches!(Message::decode(&p.bhs), Ok(Message::ScsiResponse(r)) if r.itt == itt && r.status == status::CHECK_CONDITION)
                && p.data[2..][12..14] == [0x4B, 0x00],
            _ => false,
        })
    }

    /// Unsolicited Data-Out must continue exactly where the last one ended,
    /// with a counting DataSN, inside FirstBurstLength: anything else fails
    /// the task at once. Before, Data-Out repeated at offset 0 was kept
    /// without limit (the probe: 256 KiB PDUs of one 4 MiB WRITE, F=0,
    /// took the target from 9 MB to 231 MB).
    #[test]
    fn unsolicited_data_out_continues_where_the_last_ended() {
        const K: usize = 1024;
        // (offset, DataSN) of the second 64 KiB PDU, after a first at 0.
        for (offset, data_sn, why) in [
            (0u32, 1u32, "repeated offset"),
            (128 * K as u32, 1, "gap"),
            (64 * K as u32, 0, "repeated DataSN"),
            (64 * K as u32, 7, "DataSN skipped"),
        ] {
            let mut s = write_session(false, 8, DATA_OUT_BUDGET);
            assert!(write(&mut s, 40, 4 << 20, false).is_empty());
            assert!(data_out(&mut s, 40, RESERVED_TAG, 0, 0, 64 * K, false).is_empty());
            let out = data_out(&mut s, 40, RESERVED_TAG, data_sn, offset, 64 * K, false);
            assert!(failed_with_data_phase_error(&out, 40), "{why}: {out:?}");
            assert_eq!((s.outstanding(), s.data_out_held()), (0, 0), "{why}");
            // The flood goes on: dropped, nothing kept.
            for n in 2..100 {
                assert!(data_out(&mut s, 40, RESERVED_TAG, n, 0, 256 * K, false).is_empty());
            }
            assert_eq!((s.outstanding(), s.data_out_held()), (0, 0), "{why}");
        }
        // Past FirstBurstLength, even in order.
        let mut s = write_session(false, 8, DATA_OUT_BUDGET);
        write(&mut s, 41, 4 << 20, false);
        data_out(&mut s, 41, RESERVED_TAG, 0, 0, 192 * K, false);
        let out = data_out(&mut s, 41, RESERVED_TAG, 1, 192 * K as u32, 128 * K, false);
        assert!(failed_with_data_phase_error(&out, 41), "{out:?}");
        // In order: the burst ends at FirstBurstLength (with or without the
        // F bit), the rest comes by R2T.
        for f_bit in [true, false] {
            let mut s = write_session(false, 8, DATA_OUT_BUDGET);
            write(&mut s, 42, 1 << 20, false);
            for i in 0..4u32 {
                let out = data_out(&mut s, 42, RESERVED_TAG, i, i * 64 * K as u32, 64 * K, f_bit && i == 3);
                if i < 3 {
                    assert!(out.is_empty(), "{out:?}");
                } else {
                    let r = r2ts(&out);
                    assert_eq!(r.len(), 1, "{out:?}");
                    assert_eq!((r[0].buffer_offset, r[0].desired_length), (256 * K as u32, 768 * K as u32));
                }
            }
        }
        // A burst the F bit ends early: the R2T asks for the rest from there.
        let mut s = write_session(false, 8, DATA_OUT_BUDGET);
        write(&mut s, 43, 1 << 20, false);
        let r = r2ts(&data_out(&mut s, 43, RESERVED_TAG, 0, 0, 64 * K, true));
        assert_eq!((r[0].buffer_offset, r[0].desired_length), (64 * K as u32, 960 * K as u32));
        assert_eq!(s.data_out_held(), 1 << 20, "what came and what is asked for");
    }

    /// Solicited Data-Out continues where the last one of its R2T ended,
    /// with its DataSN counting from 0 per R2T, inside the R2T's window.
    #[test]
    fn solicited_data_out_stays_in_order_inside_its_r2t() {
        const K: u32 = 1024;
        // (offset, DataSN, F) of each PDU sent.
        type Pdus = &'static [(u32, u32, bool)];
        let cases: [(&str, Pdus); 4] = [
            ("repeated offset", &[(0, 0, false), (0, 1, false)]),
            ("gap", &[(0, 0, false), (128 * K, 1, false)]),
            ("DataSN not from 0", &[(0, 1, false)]),
            ("repeated DataSN", &[(0, 0, false), (64 * K, 0, false)]),
        ];
        for (why, pdus) in cases {
            let mut s = write_session(true, 8, DATA_OUT_BUDGET);
            // One R2T for the first MiB (MaxBurstLength) of two.
            let r = r2ts(&write(&mut s, 50, 2048 * K, true));
            assert_eq!((r.len(), r[0].buffer_offset, r[0].desired_length), (1, 0, 1024 * K));
            let ttt = r[0].ttt;
            let mut last = Vec::new();
            for &(offset, data_sn, f) in pdus {
                last = data_out(&mut s, 50, ttt, data_sn, offset, 64 * K as usize, f);
            }
            assert!(failed_with_data_phase_error(&last, 50), "{why}: {last:?}");
            assert_eq!((s.outstanding(), s.data_out_held()), (0, 0), "{why}");
        }
    }

    /// Write data held or asked for stays within the budget: past it,
    /// commands wait for their first R2T until earlier ones complete or
    /// end; they are served in arrival order. Before, every command in the
    /// window (and 16 immediate ones) was given R2Ts at once, up to 4 MiB
    /// each: 576 MiB a connection could make the target hold.
    #[test]
    fn r2ts_wait_for_data_out_budget() {
        let big = 4u32 << 20;
        let mut s = write_session(true, 128, 16 << 20);
        let mut served = Vec::new();
        for itt in 0..128u32 {
            served.extend(r2ts(&write(&mut s, itt, big, true)));
        }
        // Four 4 MiB writes fill 16 MiB; the rest wait.
        assert_eq!(served.iter().map(|r| r.itt).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert_eq!(s.data_out_held(), 16 << 20);
        // Ending one (an abort here) serves the next in line.
        let tmf = TaskMgmtRequest { immediate: true, function: TmfFunction::AbortTask as u8, itt: 9999, referenced_task_tag: 1, ..Default::default() };
        let out = send(&mut s, Message::TaskMgmtRequest(tmf));
        assert_eq!(r2ts(&out).iter().map(|r| r.itt).collect::<Vec<_>>(), vec![4]);
        // Completing one does too: its data comes (R2Ts of MaxBurstLength,
        // one at a time), it runs, it completes.
        let mut r2t = served.remove(0);
        let exec = loop {
            let mut out = Vec::new();
            for i in 0..4u32 {
                let at = r2t.buffer_offset + i * (256 << 10);
                out = data_out(&mut s, 0, r2t.ttt, i, at, 256 << 10, i == 3);
            }
            match out.pop() {
                Some(Action::Execute(e)) => break e,
                Some(a) => r2t = r2ts(&[a]).pop().expect("next R2T"),
                None => panic!("no R2T after a full sequence"),
            }
        };
        assert_eq!(exec.data_out.iter().map(|b| b.len()).sum::<usize>(), big as usize);
        let mut out = Vec::new();
        s.complete(exec.itt, exec.id, status::GOOD, &[], Vec::new(), Residual::None, &mut out);
        assert_eq!(r2ts(&out).iter().map(|r| r.itt).collect::<Vec<_>>(), vec![5]);
        assert_eq!(s.data_out_held(), 16 << 20);
        // Immediate data and unsolicited bursts count too (they cannot be
        // refused): with them in, one write is still served at a time.
        let mut s = write_session(false, 128, 1 << 20);
        let mut served = Vec::new();
        for itt in 0..8u32 {
            let c = ScsiCommand { final_: true, write: true, itt, edtl: 1 << 20, cmd_sn: s.exp_cmd_sn(), cdb: [0x8A; 16], ..Default::default() };
            let mut out = Vec::new();
            s.on_pdu(Pdu::new(Message::ScsiCommand(c).encode(), Bytes::from(vec![0u8; 4096])), Instant::now(), &mut out).unwrap();
            served.extend(r2ts(&out));
        }
        assert_eq!(served.iter().map(|r| r.itt).collect::<Vec<_>>(), vec![0]);
        assert_eq!(s.data_out_held(), (1 << 20) + 7 * 4096);
        // The whole session's budget comes back when its tasks end.
        let tmf = TaskMgmtRequest { immediate: true, function: TmfFunction::AbortTaskSet as u8, itt: 9999, ..Default::default() };
        send(&mut s, Message::TaskMgmtRequest(tmf));
        assert_eq!((s.outstanding(), s.data_out_held()), (0, 0));
    }
}
