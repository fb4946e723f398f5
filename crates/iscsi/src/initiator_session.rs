//! The initiator side of a logged-in iSCSI session, without sockets: commands
//! and PDUs from the target in, PDUs to send and completed commands out, the
//! time passed in. It keeps the CmdSN window (commands wait inside it until
//! MaxCmdSN allows them), assigns ITTs, reassembles Data-In, answers R2Ts with
//! Data-Out and NOP-In pings with NOP-Out, and times commands out.
//!
//! The socket driver (`bw-initiator`) only moves PDUs and completions.

use crate::msg::*;
use crate::negotiate::SessionParams;
use crate::pdu::{Pdu, RESERVED_TAG};
use crate::target_session::sn_lt;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// One SCSI command to run.
#[derive(Debug, Clone)]
pub struct Command {
    /// The 8-byte LUN field (`bw_scsi::encode_lun`).
    pub lun: u64,
    pub cdb: [u8; 16],
    /// Bytes of Data-In expected (reads).
    pub read_len: usize,
    /// Data-Out (writes).
    pub write: Bytes,
}

/// A command the target completed (any SCSI status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub status: u8,
    pub sense: Bytes,
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    #[error("the command window stayed closed")]
    WindowClosed,
    #[error("no response in time")]
    Timeout,
    #[error("target rejected the command (reason {0:#04x})")]
    Rejected(u8),
    #[error("target failure (iSCSI response {0:#04x})")]
    ServiceResponse(u8),
    #[error("{0}")]
    Disconnected(String),
}

#[derive(Debug)]
pub enum Action {
    Send(Pdu),
    /// The command with this ITT is finished; it will not be reported again.
    Complete { itt: u32, result: Result<Completion, TaskError> },
    /// The target answered our Logout Request.
    LoggedOut,
}

/// A violation that ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConnectionError(pub String);

struct Task {
    lun: u64,
    data: Vec<u8>,
    write: Bytes,
    deadline: Instant,
    /// Completed with a timeout; kept until the target answers so its ITT
    /// is not reused while the target may still send data for it.
    abandoned: bool,
}

struct Waiting {
    itt: u32,
    cmd: Command,
}

pub struct InitiatorSession {
    params: SessionParams,
    timeout: Duration,
    cmd_sn: u32,
    max_cmd_sn: u32,
    exp_stat_sn: u32,
    next_itt: u32,
    tasks: HashMap<u32, Task>,
    /// Commands outside the CmdSN window, in submission order.
    waiting: VecDeque<Waiting>,
    dead: Option<String>,
}

/// ITT of our Logout Request (never handed to a command).
const LOGOUT_ITT: u32 = RESERVED_TAG - 1;

impl InitiatorSession {
    /// A session after login: the numbers from the final Login Response.
    pub fn new(params: SessionParams, cmd_sn: u32, max_cmd_sn: u32, exp_stat_sn: u32, timeout: Duration) -> Self {
        InitiatorSession {
            params,
            timeout,
            cmd_sn,
            max_cmd_sn,
            exp_stat_sn,
            next_itt: 1,
            tasks: HashMap::new(),
            waiting: VecDeque::new(),
            dead: None,
        }
    }

    /// Why the session ended, if it has.
    pub fn dead(&self) -> Option<&str> {
        self.dead.as_deref()
    }

    /// Commands submitted and not yet completed (including those waiting for the window).
    pub fn outstanding(&self) -> usize {
        self.tasks.values().filter(|t| !t.abandoned).count()
    }

    fn window_open(&self) -> bool {
        !sn_lt(self.max_cmd_sn, self.cmd_sn)
    }

    /// Start `cmd`; returns its ITT, under which it completes. It is sent at
    /// once if the CmdSN window allows, else when a response opens it.
    pub fn submit(&mut self, cmd: Command, now: Instant, out: &mut Vec<Action>) -> Result<u32, TaskError> {
        if let Some(d) = &self.dead {
            return Err(TaskError::Disconnected(d.clone()));
        }
        let mut itt = self.next_itt;
        while itt == RESERVED_TAG || itt == LOGOUT_ITT || self.tasks.contains_key(&itt) {
            itt = itt.wrapping_add(1);
        }
        self.next_itt = itt.wrapping_add(1);
        let task = Task { lun: cmd.lun, data: vec![0u8; cmd.read_len], write: cmd.write.clone(), deadline: now + self.timeout, abandoned: false };
        self.tasks.insert(itt, task);
        // Commands leave in CmdSN order: behind any already waiting.
        if self.waiting.is_empty() && self.window_open() {
            self.send_command(itt, &cmd, out);
        } else {
            self.waiting.push_back(Waiting { itt, cmd });
        }
        Ok(itt)
    }

    fn send_command(&mut self, itt: u32, cmd: &Command, out: &mut Vec<Action>) {
        let p = &self.params;
        let write = &cmd.write;
        let mss = p.max_send_data_segment_length as usize;
        let first_burst = p.first_burst_length as usize;
        let imm_len = if p.immediate_data { write.len().min(first_burst).min(mss) } else { 0 };
        let unsolicited_end = if p.initial_r2t { imm_len } else { write.len().min(first_burst) };
        let c = ScsiCommand {
            immediate: false,
            final_: unsolicited_end == imm_len,
            read: cmd.read_len > 0,
            write: !write.is_empty(),
            attr: 1, // SIMPLE
            lun: cmd.lun,
            itt,
            edtl: if write.is_empty() { cmd.read_len as u32 } else { write.len() as u32 },
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: cmd.cdb,
        };
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        out.push(Action::Send(Pdu::new(Message::ScsiCommand(c).encode(), write.slice(..imm_len))));
        // Unsolicited Data-Out up to FirstBurstLength.
        if unsolicited_end > imm_len {
            self.send_data_out(cmd.lun, itt, RESERVED_TAG, write, imm_len, unsolicited_end, out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn send_data_out(&self, lun: u64, itt: u32, ttt: u32, data: &Bytes, from: usize, to: usize, out: &mut Vec<Action>) {
        let mss = self.params.max_send_data_segment_length.max(512) as usize;
        let mut off = from;
        let mut sn = 0;
        while off < to {
            let end = (off + mss).min(to);
            let d = DataOut { final_: end == to, lun, itt, ttt, exp_stat_sn: self.exp_stat_sn, data_sn: sn, buffer_offset: off as u32 };
            out.push(Action::Send(Pdu::new(Message::DataOut(d).encode(), data.slice(off..end))));
            sn += 1;
            off = end;
        }
    }

    fn update_window(&mut self, exp_cmd_sn: u32, max_cmd_sn: u32, out: &mut Vec<Action>) {
        // Ignore nonsense windows (MaxCmdSN < ExpCmdSN - 1) as the RFC says.
        if sn_lt(max_cmd_sn.wrapping_add(1), exp_cmd_sn) {
            return;
        }
        if sn_lt(self.max_cmd_sn, max_cmd_sn) {
            self.max_cmd_sn = max_cmd_sn;
        }
        while self.window_open() {
            let Some(w) = self.waiting.pop_front() else { break };
            self.send_command(w.itt, &w.cmd, out);
        }
    }

    fn finish(&mut self, itt: u32, result: impl FnOnce(Vec<u8>) -> Result<Completion, TaskError>, out: &mut Vec<Action>) {
        if let Some(mut t) = self.tasks.remove(&itt) {
            if !t.abandoned {
                out.push(Action::Complete { itt, result: result(std::mem::take(&mut t.data)) });
            }
        }
    }

    /// Complete every command whose time is up (`now` past its deadline).
    pub fn on_timer(&mut self, now: Instant, out: &mut Vec<Action>) {
        let waiting: Vec<u32> = self.waiting.iter().map(|w| w.itt).collect();
        for (itt, t) in self.tasks.iter_mut() {
            if !t.abandoned && t.deadline <= now {
                let not_sent = waiting.contains(itt);
                t.abandoned = true;
                out.push(Action::Complete { itt: *itt, result: Err(if not_sent { TaskError::WindowClosed } else { TaskError::Timeout }) });
            }
        }
        // A command never sent has no ITT at the target: forget it now.
        let tasks = &mut self.tasks;
        self.waiting.retain(|w| {
            let gone = tasks.get(&w.itt).is_none_or(|t| t.abandoned);
            if gone {
                tasks.remove(&w.itt);
            }
            !gone
        });
    }

    /// The earliest deadline of a command still waiting for its answer.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.tasks.values().filter(|t| !t.abandoned).map(|t| t.deadline).min()
    }

    /// Send a Logout Request (close the session); [`Action::LoggedOut`]
    /// follows when the target answers. Nothing if the session is over.
    pub fn logout(&mut self, out: &mut Vec<Action>) {
        if self.dead.is_some() {
            return;
        }
        let l = LogoutRequest { immediate: true, reason: 0, itt: LOGOUT_ITT, cid: 0, cmd_sn: self.cmd_sn, exp_stat_sn: self.exp_stat_sn };
        out.push(Action::Send(Pdu::new(Message::LogoutRequest(l).encode(), Bytes::new())));
    }

    /// The connection is gone (or the driver is closing): fail every command.
    pub fn fail_all(&mut self, why: &str, out: &mut Vec<Action>) {
        self.dead.get_or_insert_with(|| why.to_string());
        self.waiting.clear();
        let mut itts: Vec<u32> = self.tasks.keys().copied().collect();
        itts.sort_unstable();
        for itt in itts {
            self.finish(itt, |_| Err(TaskError::Disconnected(why.to_string())), out);
        }
    }

    /// One PDU from the target. An error means the connection must end (the
    /// caller then calls [`InitiatorSession::fail_all`]).
    pub fn on_pdu(&mut self, pdu: Pdu, out: &mut Vec<Action>) -> Result<(), ConnectionError> {
        let msg = Message::decode(&pdu.bhs).map_err(|e| ConnectionError(e.to_string()))?;
        match msg {
            Message::DataIn(d) => {
                self.update_window(d.exp_cmd_sn, d.max_cmd_sn, out);
                let Some(t) = self.tasks.get_mut(&d.itt) else { return Ok(()) };
                let off = d.buffer_offset as usize;
                let end = off + pdu.data.len();
                if end > t.data.len() {
                    return Err(ConnectionError(format!("Data-In past the buffer ({end} > {})", t.data.len())));
                }
                t.data[off..end].copy_from_slice(&pdu.data);
                if d.has_status {
                    self.exp_stat_sn = d.stat_sn.wrapping_add(1);
                    self.finish(d.itt, |data| Ok(Completion { status: d.status, sense: Bytes::new(), data }), out);
                }
            }
            Message::ScsiResponse(r) => {
                self.exp_stat_sn = r.stat_sn.wrapping_add(1);
                self.update_window(r.exp_cmd_sn, r.max_cmd_sn, out);
                // Sense data: a 2-byte length, then the sense bytes.
                let sense = if pdu.data.len() >= 2 {
                    let n = u16::from_be_bytes([pdu.data[0], pdu.data[1]]) as usize;
                    pdu.data.slice(2..(2 + n).min(pdu.data.len()))
                } else {
                    Bytes::new()
                };
                if r.response != 0 {
                    self.finish(r.itt, |_| Err(TaskError::ServiceResponse(r.response)), out);
                } else {
                    self.finish(r.itt, |data| Ok(Completion { status: r.status, sense, data }), out);
                }
            }
            Message::R2t(r) => {
                self.update_window(r.exp_cmd_sn, r.max_cmd_sn, out);
                let Some(t) = self.tasks.get(&r.itt) else { return Ok(()) };
                let from = r.buffer_offset as usize;
                let to = from + r.desired_length as usize;
                if to > t.write.len() {
                    return Err(ConnectionError("R2T asks for data past the end of the write".into()));
                }
                let (lun, data) = (t.lun, t.write.clone());
                self.send_data_out(lun, r.itt, r.ttt, &data, from, to, out);
            }
            Message::NopIn(n) => {
                self.update_window(n.exp_cmd_sn, n.max_cmd_sn, out);
                if n.ttt != RESERVED_TAG {
                    // The target pings us: answer with the same TTT.
                    let o = NopOut { immediate: true, lun: n.lun, itt: RESERVED_TAG, ttt: n.ttt, cmd_sn: self.cmd_sn, exp_stat_sn: self.exp_stat_sn };
                    out.push(Action::Send(Pdu::new(Message::NopOut(o).encode(), Bytes::new())));
                }
            }
            Message::LogoutResponse(l) => {
                self.exp_stat_sn = l.stat_sn.wrapping_add(1);
                out.push(Action::LoggedOut);
            }
            Message::AsyncMessage(a) => {
                self.exp_stat_sn = a.stat_sn.wrapping_add(1);
                self.update_window(a.exp_cmd_sn, a.max_cmd_sn, out);
                if matches!(a.event, async_event::DROP_CONNECTION | async_event::DROP_ALL_CONNECTIONS | async_event::LOGOUT_REQUESTED) {
                    return Err(ConnectionError(format!("target asked to end the session (async event {})", a.event)));
                }
            }
            Message::Reject(r) => {
                // The rejected header comes back as data: fail that command.
                if pdu.data.len() >= 48 {
                    let itt = u32::from_be_bytes([pdu.data[16], pdu.data[17], pdu.data[18], pdu.data[19]]);
                    self.finish(itt, |_| Err(TaskError::Rejected(r.reason)), out);
                }
            }
            Message::TaskMgmtResponse(_) | Message::TextResponse(_) => {}
            other => return Err(ConnectionError(format!("unexpected PDU from target: {other:?}"))),
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "initiator_session/tests.rs"]
mod tests;
