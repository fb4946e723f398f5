//! NVMe over RDMA (NVMe/RDMA transport binding), without verbs: the RDMA
//! connection manager's private data, and one queue on the controller side
//! as a state machine ([`RdmaQueue`]): command capsules go in, the
//! transfers and responses to post come out.
//!
//! The connection is the queue: its connect request carries the queue ID
//! and both queue sizes ([`cm::Request`], checked by [`cm::check_request`]
//! before the transport accepts). Each command capsule arrives in one
//! RECV: the 64-byte SQE, then any in-capsule data. Host memory is named by
//! a keyed SGL descriptor (address, length, key): data for the controller
//! is fetched with RDMA READ ([`Action::Fetch`], reported back with
//! [`RdmaQueue::fetched`]), a result goes out with RDMA WRITE before the
//! 16-byte completion is SENT ([`Post`], in order on the one queue pair, so
//! the data is there when the host sees the completion).
//!
//! What the queue checks, and how it fails: a capsule shorter than an SQE,
//! anything but Connect before the queue is connected, or more commands
//! outstanding than the submission queue holds close the queue (the host
//! broke the transport's rules); an SGL this transport cannot use, data
//! longer than MDTS, in-capsule data that does not match its descriptor,
//! or a result longer than the host's buffer fail that command only. The
//! host's keys are checked by the RDMA device: a READ or WRITE outside the
//! host's registered memory fails with a remote access error, the queue
//! pair goes to its error state and the transport closes this queue alone.
//!
//! In-band authentication (DH-HMAC-CHAP) as on NVMe/TCP: with
//! [`Connected::auth`] the Connect response sets AUTHREQ.ATR, every command
//! but Auth Send/Receive and Disconnect fails with AUTH_REQUIRED (a write's
//! data is not fetched) until the host has authenticated, the host does not
//! keep the controller alive meanwhile, and the login deadline stays armed.
//! Auth Receive runs here; Auth Send comes out as [`Action::AuthSend`] for
//! the transport's randomness ([`RdmaQueue::auth_send`]); success comes out
//! as [`Action::Authenticated`], failure closes this queue alone.

use crate::auth::message::AuthCommand;
use crate::auth::{ControllerAuth, Entropy, FailureReason};
use crate::controller::{KeepAlive, INCAPSULE_DATA, MAX_TRANSFER};
use crate::fabrics::{self, fctype, Connect, ConnectData, CONNECT_DATA_LEN};
use crate::queue_entry::{sgl, Cqe, Keyed, Sqe};
use crate::subsystem::LiveSubsystem;
use crate::target_queue::CidSet;
use crate::{nvm_io, Status};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Largest submission queue an RDMA queue may have: every entry holds a
/// receive buffer of [`CAPSULE_LEN`] bytes (Linux's host asks for 128).
pub const MAX_ENTRIES: u16 = 256;
/// One command capsule: the SQE and up to [`INCAPSULE_DATA`] bytes.
pub const CAPSULE_LEN: usize = 64 + INCAPSULE_DATA as usize;

/// The RDMA connection manager's private data (NVMe/RDMA transport
/// binding: RDMA_CM_REQUEST, RDMA_CM_ACCEPT, RDMA_CM_REJECT).
pub mod cm {
    use bw_wire::{Field, Le};

    pub const REQUEST_LEN: usize = 32;
    pub const ACCEPT_LEN: usize = 32;
    pub const REJECT_LEN: usize = 4;

    const RECFMT: Field<Le<u16>> = Field::at(0);
    // Request.
    const QID: Field<Le<u16>> = Field::at(2);
    const HRQSIZE: Field<Le<u16>> = Field::at(4);
    const HSQSIZE: Field<Le<u16>> = Field::at(6);
    const CNTLID: Field<Le<u16>> = Field::at(8);
    // Accept.
    const CRQSIZE: Field<Le<u16>> = Field::at(2);
    // Reject.
    const STS: Field<Le<u16>> = Field::at(2);

    /// Reject status codes.
    pub mod reject {
        pub const INVALID_LEN: u16 = 0x01;
        pub const INVALID_RECFMT: u16 = 0x02;
        pub const INVALID_QID: u16 = 0x03;
        pub const INVALID_HSQSIZE: u16 = 0x04;
        pub const INVALID_HRQSIZE: u16 = 0x05;
        pub const NO_RESOURCES: u16 = 0x06;
    }

    /// The host's connect request.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Request {
        pub recfmt: u16,
        pub qid: u16,
        /// Host receive queue size: completions the host can take at once.
        pub hrqsize: u16,
        /// Host submission queue size, zero-based (the Connect's SQSIZE).
        pub hsqsize: u16,
        pub cntlid: u16,
    }

    impl Request {
        pub fn parse(b: &[u8]) -> Option<Request> {
            if b.len() < REQUEST_LEN {
                return None;
            }
            Some(Request { recfmt: RECFMT.get(b), qid: QID.get(b), hrqsize: HRQSIZE.get(b), hsqsize: HSQSIZE.get(b), cntlid: CNTLID.get(b) })
        }
        pub fn encode(&self) -> [u8; REQUEST_LEN] {
            let mut b = [0u8; REQUEST_LEN];
            RECFMT.set(&mut b, self.recfmt);
            QID.set(&mut b, self.qid);
            HRQSIZE.set(&mut b, self.hrqsize);
            HSQSIZE.set(&mut b, self.hsqsize);
            CNTLID.set(&mut b, self.cntlid);
            b
        }
    }

    /// Accept private data: the controller's receive queue size.
    pub fn accept(crqsize: u16) -> [u8; ACCEPT_LEN] {
        let mut b = [0u8; ACCEPT_LEN];
        CRQSIZE.set(&mut b, crqsize);
        b
    }
    pub fn parse_accept(b: &[u8]) -> Option<u16> {
        (b.len() >= 4 && RECFMT.get(b) == 0).then(|| CRQSIZE.get(b))
    }
    pub fn reject(sts: u16) -> [u8; REJECT_LEN] {
        let mut b = [0u8; REJECT_LEN];
        STS.set(&mut b, sts);
        b
    }
    pub fn parse_reject(b: &[u8]) -> Option<u16> {
        (b.len() >= REJECT_LEN).then(|| STS.get(b))
    }

    /// The queue a connect request asks for, or the reject status.
    pub fn check_request(b: &[u8]) -> Result<super::Shape, u16> {
        let r = Request::parse(b).ok_or(reject::INVALID_LEN)?;
        if r.recfmt != 0 {
            return Err(reject::INVALID_RECFMT);
        }
        if r.qid > crate::controller::MAX_IO_QUEUES {
            return Err(reject::INVALID_QID);
        }
        if r.hsqsize == 0 || r.hsqsize >= super::MAX_ENTRIES {
            return Err(reject::INVALID_HSQSIZE);
        }
        // The host must be able to take a completion for every command.
        if r.hrqsize <= r.hsqsize || r.hrqsize > super::MAX_ENTRIES {
            return Err(reject::INVALID_HRQSIZE);
        }
        Ok(super::Shape { qid: r.qid, sq_entries: r.hsqsize + 1, rq_entries: r.hrqsize })
    }
}

/// The queue a connect request set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub qid: u16,
    /// Submission queue entries (HSQSIZE + 1): capsules in flight at most,
    /// and the receive buffers the transport posts.
    pub sq_entries: u16,
    /// Completions the host can take at once (HRQSIZE).
    pub rq_entries: u16,
}

/// Why a queue closed with an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RdmaQueueError {
    #[error("capsule of {0} bytes is shorter than a command")]
    ShortCapsule(usize),
    #[error("{0} before the queue is connected")]
    NotConnected(&'static str),
    #[error("host has {outstanding} commands outstanding on a queue of {entries} entries")]
    QueueOverflow { outstanding: usize, entries: u16 },
    #[error("Connect for queue {connect} on a connection set up for queue {cm}")]
    QueueIdMismatch { connect: u16, cm: u16 },
    #[error("no Connect before the login timeout")]
    LoginTimeout,
    #[error("connected but no DH-HMAC-CHAP authentication before the login timeout")]
    AuthTimeout,
    #[error("DH-HMAC-CHAP authentication of {} failed: {why} ({reason})", hostnqn.escape_debug())]
    AuthFailed { hostnqn: String, why: String, reason: FailureReason },
    #[error("keep-alive timeout ({0} ms without a command)")]
    KeepAliveExpired(u128),
}

/// What the transport must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create (queue 0) or join a controller, then call
    /// [`RdmaQueue::connected`] or [`RdmaQueue::connect_refused`].
    Connect { cid: u16, connect: Connect, data: ConnectData },
    /// Run an admin (or fabrics) command; report with [`RdmaQueue::complete`].
    Admin { sqe: Sqe, data: Bytes },
    /// Run an NVM I/O command; report with [`RdmaQueue::complete`].
    Io { sqe: Sqe, data: Bytes },
    /// RDMA READ the command's data from the host, then
    /// [`RdmaQueue::fetched`].
    Fetch { cid: u16, from: Keyed },
    /// Draw fresh [`Entropy`] and call [`RdmaQueue::auth_send`].
    AuthSend { sqe: Sqe, data: Bytes },
    /// The host has just authenticated on this queue: its login is over.
    Authenticated,
    /// Post what was queued, then disconnect; `None` after a Disconnect.
    Close(Option<RdmaQueueError>),
}

/// Work to post, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Post {
    /// RDMA WRITE a result into the host's buffer.
    Write { to: Keyed, data: Bytes },
    /// SEND a completion; with `invalidate`, SEND with Invalidate of the
    /// host's key (the host asked for it with the invalidate subtype).
    Send { cqe: [u8; Cqe::LEN], invalidate: Option<u32> },
}

/// What the controller side reports for a successful Connect.
#[derive(Debug)]
pub struct Connected {
    /// Completion dword 0: the controller ID.
    pub result: u64,
    pub keep_alive: Arc<KeepAlive>,
    pub subsystem: Option<Arc<LiveSubsystem>>,
    /// The host must authenticate on this queue (DH-HMAC-CHAP).
    pub auth: Option<ControllerAuth>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitConnect,
    Connected,
    Closed,
}

pub struct RdmaQueue {
    shape: Shape,
    login_deadline: Instant,
    phase: Phase,
    cntlid: u16,
    sqhd: u16,
    inflight: CidSet,
    connecting: bool,
    keep_alive: Option<Arc<KeepAlive>>,
    /// When the last capsule arrived: the instant an authentication that
    /// it completes succeeded, when the controller's keep-alive starts.
    last_capsule: Option<Instant>,
    subsystem: Option<Arc<LiveSubsystem>>,
    /// Commands whose data is being fetched, by command ID.
    fetching: HashMap<u16, Sqe>,
    /// Where each command's result goes, by command ID.
    dest: HashMap<u16, Keyed>,
    auth: Option<ControllerAuth>,
    /// Connected, and the host has yet to authenticate: the login
    /// deadline still runs.
    login_open: bool,
}

impl RdmaQueue {
    /// A queue of `shape` (from [`cm::check_request`]) that must be
    /// connected by `login_deadline`.
    pub fn new(shape: Shape, login_deadline: Instant) -> RdmaQueue {
        RdmaQueue {
            shape,
            login_deadline,
            phase: Phase::AwaitConnect,
            cntlid: 0,
            sqhd: 0,
            inflight: CidSet::new(),
            connecting: false,
            keep_alive: None,
            last_capsule: None,
            subsystem: None,
            fetching: HashMap::new(),
            dest: HashMap::new(),
            auth: None,
            login_open: false,
        }
    }

    /// Connected, and the host still has to authenticate before commands
    /// other than Auth Send/Receive and Disconnect run.
    pub fn awaiting_auth(&self) -> bool {
        self.auth.as_ref().is_some_and(|a| !a.authenticated())
    }

    pub fn qid(&self) -> u16 {
        self.shape.qid
    }
    /// The controller this queue belongs to, once connected (for logs).
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }
    pub fn shape(&self) -> Shape {
        self.shape
    }
    pub fn is_connected(&self) -> bool {
        self.phase == Phase::Connected
    }
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }
    /// Commands received and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.inflight.len
    }

    /// One RECV's worth: a command capsule.
    pub fn capsule(&mut self, b: &[u8], now: Instant, out: &mut Vec<Post>) -> Option<Action> {
        if self.phase == Phase::Closed {
            return None;
        }
        if b.len() < 64 {
            return self.close(Some(RdmaQueueError::ShortCapsule(b.len())));
        }
        let sqe = Sqe::from_slice(&b[..64]);
        let data = &b[64..];
        let cid = sqe.cid();
        let is_connect = sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT;
        if self.phase != Phase::Connected && !is_connect {
            return self.close(Some(RdmaQueueError::NotConnected("a command other than Connect")));
        }
        // Submission queue head, depth and command ID.
        self.sqhd = (self.sqhd + 1) % self.shape.sq_entries;
        if self.inflight.len >= self.shape.sq_entries as usize {
            let why = RdmaQueueError::QueueOverflow { outstanding: self.inflight.len + 1, entries: self.shape.sq_entries };
            return self.close(Some(why));
        }
        self.last_capsule = Some(now);
        // A host that has yet to authenticate does not keep the controller alive.
        if let Some(k) = self.keep_alive.as_ref().filter(|_| !self.awaiting_auth()) {
            k.touch(now);
        }
        if !self.inflight.insert(cid) {
            self.push_cqe(cid, Status::CMDID_CONFLICT.dnr(), 0, None, out);
            return None;
        }
        let s = sqe.sgl();
        if !data.is_empty() {
            // In-capsule data: offset 0, exactly the length announced.
            let st = if s.kind != sgl::INCAPSULE {
                Some(Status::SGL_INVALID_TYPE)
            } else if s.addr != 0 || data.len() > INCAPSULE_DATA as usize {
                Some(Status::SGL_INVALID_OFFSET)
            } else if (s.length as usize) > data.len() || !sqe.is_host_to_ctrl() {
                Some(Status::SGL_INVALID_DATA)
            } else {
                None
            };
            if let Some(st) = st {
                return self.fail(cid, st.dnr(), out);
            }
            // (A RECV may be longer than the data: the length announced counts.)
            let data = Bytes::copy_from_slice(&data[..s.length as usize]);
            return self.dispatch(sqe, data, out);
        }
        let keyed = sqe.keyed_sgl();
        let len = keyed.map_or(0, |k| k.length);
        // No data: any descriptor of length 0 will do.
        if keyed.is_none() && s.length == 0 {
            return self.dispatch(sqe, Bytes::new(), out);
        }
        let Some(k) = keyed else {
            return self.fail(cid, Status::SGL_INVALID_TYPE.dnr(), out);
        };
        let max = if is_connect { CONNECT_DATA_LEN as u32 } else { MAX_TRANSFER };
        if len > max {
            return self.fail(cid, Status::INVALID_FIELD.dnr(), out);
        }
        if sqe.is_host_to_ctrl() && len > 0 {
            // No write data from a host that has yet to authenticate.
            if self.awaiting_auth() && AuthCommand::parse(&sqe).is_none() {
                return self.fail(cid, Status::AUTH_REQUIRED.dnr(), out);
            }
            if let (Some(sub), true) = (&self.subsystem, self.shape.qid > 0 && !sqe.is_fabrics()) {
                if let Err(st) = nvm_io::precheck(&sub.load(), &sqe) {
                    return self.fail(cid, st, out);
                }
            }
            // (Kept for its key: the completion may invalidate it.)
            self.dest.insert(cid, k);
            self.fetching.insert(cid, sqe);
            return Some(Action::Fetch { cid, from: k });
        }
        if len > 0 {
            self.dest.insert(cid, k);
        }
        self.dispatch(sqe, Bytes::new(), out)
    }

    /// The data of [`Action::Fetch`] arrived.
    pub fn fetched(&mut self, cid: u16, data: Bytes, out: &mut Vec<Post>) -> Option<Action> {
        let sqe = self.fetching.remove(&cid)?;
        self.dispatch(sqe, data, out)
    }

    /// The next instant [`RdmaQueue::handle_timeout`] must be called at.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Closed => None,
            Phase::AwaitConnect => Some(self.login_deadline),
            Phase::Connected if self.login_open => Some(self.login_deadline),
            Phase::Connected if self.shape.qid == 0 => self.keep_alive.as_ref().and_then(|k| k.deadline()),
            Phase::Connected => None,
        }
    }

    /// Time passed: enforce the login deadline and the keep-alive timeout.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Action> {
        match self.phase {
            Phase::Closed => None,
            Phase::AwaitConnect if now >= self.login_deadline => self.close(Some(RdmaQueueError::LoginTimeout)),
            Phase::AwaitConnect => None,
            Phase::Connected if self.login_open && now >= self.login_deadline => self.close(Some(RdmaQueueError::AuthTimeout)),
            Phase::Connected if self.login_open => None,
            Phase::Connected => {
                let ka = self.keep_alive.as_ref().filter(|_| self.shape.qid == 0)?;
                if ka.expired(now) {
                    let ms = ka.kato().map_or(0, |k| k.as_millis());
                    return self.close(Some(RdmaQueueError::KeepAliveExpired(ms)));
                }
                None
            }
        }
    }

    /// The Connect of [`Action::Connect`] succeeded.
    pub fn connected(&mut self, cid: u16, c: Connected, now: Instant, out: &mut Vec<Post>) {
        if !std::mem::take(&mut self.connecting) {
            return;
        }
        self.cntlid = c.result as u16;
        if c.auth.is_none() {
            c.keep_alive.touch(now);
        }
        self.keep_alive = Some(c.keep_alive);
        self.subsystem = c.subsystem;
        let authreq = if c.auth.is_some() { fabrics::AUTHREQ_ATR as u64 } else { 0 };
        self.login_open = c.auth.is_some();
        self.auth = c.auth;
        self.phase = Phase::Connected;
        self.complete(cid, Status::SUCCESS, c.result | authreq, None, out);
    }

    /// The [`Action::AuthSend`] with the randomness it needs.
    pub fn auth_send(&mut self, sqe: &Sqe, data: &[u8], entropy: Entropy, out: &mut Vec<Post>) -> Option<Action> {
        let Some(a) = self.auth.as_mut() else {
            return self.fail(sqe.cid(), Status::INVALID_OPCODE.dnr(), out);
        };
        let status = a.auth_send(sqe, data, entropy);
        self.auth_done(sqe.cid(), status, None, out)
    }

    /// Auth Send (handed to the transport for its randomness) or Auth
    /// Receive (answered here), on a queue whose host authenticates.
    fn auth_command(&mut self, sqe: Sqe, data: Bytes, out: &mut Vec<Post>) -> Option<Action> {
        let cid = sqe.cid();
        let (Some(a), Some(cmd)) = (self.auth.as_mut(), AuthCommand::parse(&sqe)) else {
            // No authentication configured for this host (as Linux's target).
            return self.fail(cid, Status::INVALID_OPCODE.dnr(), out);
        };
        if cmd.send {
            return Some(Action::AuthSend { sqe, data });
        }
        let (status, data) = match a.auth_receive(&sqe) {
            Ok(d) => (Status::SUCCESS, Some(Bytes::from(d))),
            Err(st) => (st, None),
        };
        self.auth_done(cid, status, data, out)
    }

    /// Complete an authentication command; the queue closes when the
    /// exchange failed for good, and its login ends when it succeeded.
    fn auth_done(&mut self, cid: u16, status: Status, data: Option<Bytes>, out: &mut Vec<Post>) -> Option<Action> {
        self.complete(cid, status, 0, data, out);
        let a = self.auth.as_ref()?;
        if let Some(reason) = a.failed() {
            let why = RdmaQueueError::AuthFailed { hostnqn: a.hostnqn().to_string(), why: a.why().unwrap_or("-").to_string(), reason };
            return self.close(Some(why));
        }
        if a.authenticated() && self.login_open {
            self.login_open = false;
            // The keep-alive clock starts now (see TargetQueue::auth_done).
            if let (Some(k), Some(t)) = (self.keep_alive.as_ref(), self.last_capsule) {
                k.touch(t);
            }
            log::info!("nvme-rdma: controller {} queue {}: {} authenticated ({})", self.cntlid, self.shape.qid, a.hostnqn().escape_debug(), a.summary());
            return Some(Action::Authenticated);
        }
        None
    }

    /// The Connect of [`Action::Connect`] was refused.
    pub fn connect_refused(&mut self, cid: u16, status: Status, result: u64, out: &mut Vec<Post>) {
        self.connecting = false;
        self.complete(cid, status, result, None, out);
    }

    /// A command finished: its result (if any) goes to the host's buffer,
    /// then its completion. A result longer than that buffer fails the
    /// command instead.
    pub fn complete(&mut self, cid: u16, status: Status, result: u64, data: Option<Bytes>, out: &mut Vec<Post>) {
        if !self.inflight.remove(cid) {
            log::warn!("nvme-rdma queue {}: completion for command {cid}, which is not in flight", self.shape.qid);
            return;
        }
        let dest = self.dest.remove(&cid);
        let mut status = status;
        if let Some(d) = data.filter(|d| !d.is_empty()) {
            // (A write's descriptor is not a destination: its commands return no data.)
            match dest {
                Some(to) if d.len() <= to.length as usize => out.push(Post::Write { to, data: d }),
                _ => status = Status::SGL_INVALID_DATA.dnr(),
            }
        }
        let invalidate = dest.filter(|k| k.invalidate).map(|k| k.key);
        self.push_cqe(cid, status, result, invalidate, out);
    }

    fn push_cqe(&self, cid: u16, status: Status, result: u64, invalidate: Option<u32>, out: &mut Vec<Post>) {
        let mut cqe = [0u8; Cqe::LEN];
        Cqe { result, sq_head: self.sqhd, sq_id: self.shape.qid, cid, status }.write(&mut cqe);
        out.push(Post::Send { cqe, invalidate });
    }

    fn close(&mut self, why: Option<RdmaQueueError>) -> Option<Action> {
        self.phase = Phase::Closed;
        Some(Action::Close(why))
    }

    fn fail(&mut self, cid: u16, st: Status, out: &mut Vec<Post>) -> Option<Action> {
        self.dest.remove(&cid);
        self.complete(cid, st, 0, None, out);
        None
    }

    /// A command whose data (if any) is here.
    fn dispatch(&mut self, sqe: Sqe, data: Bytes, out: &mut Vec<Post>) -> Option<Action> {
        let cid = sqe.cid();
        if self.phase != Phase::Connected {
            if sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT && !self.connecting {
                return self.connect(sqe, data, out);
            }
            return self.fail(cid, Status::CMD_SEQ_ERROR, out);
        }
        if sqe.is_fabrics() {
            match sqe.fctype() {
                fctype::CONNECT => return self.fail(cid, Status::CMD_SEQ_ERROR, out),
                fctype::DISCONNECT => {
                    self.complete(cid, Status::SUCCESS, 0, None, out);
                    return self.close(None);
                }
                // Every queue authenticates on its own.
                fctype::AUTH_SEND | fctype::AUTH_RECEIVE => return self.auth_command(sqe, data, out),
                _ => {}
            }
        }
        if self.awaiting_auth() {
            return self.fail(cid, Status::AUTH_REQUIRED.dnr(), out);
        }
        // Property Get/Set belong to the admin queue.
        if sqe.is_fabrics() && self.shape.qid > 0 {
            return self.fail(cid, Status::INVALID_OPCODE.dnr(), out);
        }
        Some(if self.shape.qid == 0 { Action::Admin { sqe, data } } else { Action::Io { sqe, data } })
    }

    /// A Connect's own checks, and that it matches what the connection
    /// manager set up; the transport decides the rest.
    fn connect(&mut self, sqe: Sqe, data: Bytes, out: &mut Vec<Post>) -> Option<Action> {
        let cid = sqe.cid();
        let (connect, data) = match fabrics::check_connect(&sqe, &data) {
            Ok(x) => x,
            Err((st, result)) => {
                self.complete(cid, st, result, None, out);
                return None;
            }
        };
        if connect.qid != self.shape.qid {
            let why = RdmaQueueError::QueueIdMismatch { connect: connect.qid, cm: self.shape.qid };
            return self.close(Some(why));
        }
        if connect.sqsize + 1 != self.shape.sq_entries {
            let (st, at) = (Status::CONNECT_INVALID_PARAM.dnr(), fabrics::ipo_sqe(fabrics::CS_SQSIZE));
            self.complete(cid, st, at, None, out);
            return None;
        }
        self.connecting = true;
        Some(Action::Connect { cid, connect, data })
    }
}

#[cfg(test)]
mod tests;
