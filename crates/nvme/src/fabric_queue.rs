//! What every NVMe over Fabrics queue on the controller side does, whatever
//! carries it: the sans-IO core that NVMe/TCP's [`TargetQueue`] and
//! NVMe/RDMA's [`RdmaQueue`] both drive. Commands and time go in, [`Action`]s
//! and completions come out; randomness is passed in ([`Entropy`]).
//!
//! The core keeps the queue's login and its accounting:
//! - Connect: nothing but a Connect before the queue is connected
//!   ([`FabricQueue::out_of_turn`]), the Connect's own fields checked
//!   ([`fabrics::check_connect`]) before the transport sees it as
//!   [`Action::Connect`], and the transport's answer
//!   ([`FabricQueue::connected`], [`FabricQueue::connect_refused`]).
//! - The login deadline, armed from the start until the queue is connected
//!   and, when its host must, authenticated; then the admin queue's
//!   keep-alive ([`FabricQueue::poll_timeout`],
//!   [`FabricQueue::handle_timeout`]).
//! - DH-HMAC-CHAP ([`crate::auth`]): with [`Connected::auth`] the Connect
//!   response sets AUTHREQ.ATR, every command but Auth Send/Receive and
//!   Disconnect fails with AUTH_REQUIRED (and no write data is asked for,
//!   [`FabricQueue::may_fetch`]), the host does not keep the controller
//!   alive meanwhile, Auth Receive runs here, Auth Send goes out as
//!   [`Action::AuthSend`] for the transport's randomness, success comes
//!   out once as [`Action::Authenticated`] and starts the keep-alive clock,
//!   failure closes this queue alone.
//! - Admission ([`FabricQueue::admit`]): submission queue head, queue
//!   depth and command IDs in flight.
//! - Dispatch ([`FabricQueue::dispatch`]): a command whose data is here
//!   goes to Connect, Disconnect, authentication, the admin queue's
//!   controller or the I/O queue's namespaces.
//!
//! What stays with each transport is its framing (PDUs and their digests,
//! or capsules in RECVs and the connection manager's private data) and its
//! data movement (R2T/H2CData and C2HData, or RDMA READ and WRITE); it puts
//! completions on the wire through [`Wire`].
//!
//! [`TargetQueue`]: crate::target_queue::TargetQueue
//! [`RdmaQueue`]: crate::rdma_queue::RdmaQueue

use crate::auth::message::{AuthCommand, Message};
use crate::auth::{ControllerAuth, Entropy, FailureReason};
use crate::controller::KeepAlive;
use crate::limits::INCAPSULE_DATA;
use crate::fabrics::{self, fctype, Connect, ConnectData};
use crate::queue_entry::{sgl, Cqe, Sqe};
use crate::subsystem::LiveSubsystem;
use crate::{nvm_io, Status};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Instant;

/// Why a queue closes, whatever the transport.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FabricError {
    #[error("{0} before the queue is connected")]
    NotConnected(&'static str),
    #[error("host has {outstanding} commands outstanding on a queue of {entries} entries")]
    QueueOverflow { outstanding: usize, entries: u16 },
    #[error("no Connect before the login timeout")]
    LoginTimeout,
    #[error("connected but no DH-HMAC-CHAP authentication before the login timeout")]
    AuthTimeout,
    /// Authentication failed for good: this queue closes (its
    /// controller's other queues are not the failing host's to end).
    /// `hostnqn` came from the wire: printed escaped.
    #[error("DH-HMAC-CHAP authentication of {} failed: {why} ({reason})", hostnqn.escape_debug())]
    AuthFailed { hostnqn: String, why: String, reason: FailureReason },
    #[error("keep-alive timeout ({0} ms without a command)")]
    KeepAliveExpired(u128),
}

/// What the transport must do next; `E` is the transport's error, which
/// holds [`FabricError`] and its framing's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<E> {
    /// Create (queue 0) or join a controller, then call
    /// [`FabricQueue::connected`] or [`FabricQueue::connect_refused`]
    /// (through the transport's queue).
    Connect { cid: u16, connect: Connect, data: ConnectData },
    /// Run an admin command (or a fabrics command other than Connect,
    /// Disconnect and authentication) on the controller; report with the
    /// queue's `complete`.
    Admin { sqe: Sqe, data: Bytes },
    /// Run an NVM I/O command; report with the queue's `complete`.
    Io { sqe: Sqe, data: Bytes },
    /// An Auth Send: draw fresh [`Entropy`] and call the queue's
    /// `auth_send` (or `complete` with an error if there is no randomness
    /// to be had).
    AuthSend { sqe: Sqe, data: Bytes },
    /// The host has just authenticated on this queue (the first time: its
    /// login is over). Until then the queue is connected but nothing other
    /// than authentication runs on it, so the transport claims what the
    /// queue holds (its queue ID) only now.
    Authenticated,
    /// Send what was queued, then close the connection; `None` after a
    /// Disconnect.
    Close(Option<E>),
}

/// What the controller side reports for a successful Connect.
#[derive(Debug)]
pub struct Connected {
    /// Completion dword 0/1: the controller ID (and any flags).
    pub result: u64,
    /// The controller's keep-alive clock: every command on any of its
    /// queues restarts it; the admin queue enforces it.
    pub keep_alive: Arc<KeepAlive>,
    /// The subsystem behind an I/O controller (for checks made before
    /// asking for write data).
    pub subsystem: Option<Arc<LiveSubsystem>>,
    /// The controller's host NQN: which of the subsystem's namespaces
    /// its commands may reach.
    pub hostnqn: String,
    /// The host must authenticate on this queue (DH-HMAC-CHAP): the
    /// Connect response asks for it (AUTHREQ.ATR) and the login deadline
    /// stays armed until it has.
    pub auth: Option<ControllerAuth>,
}

/// How a transport puts completions on the wire.
pub trait Wire {
    /// Command `cqe.cid` is over (the core no longer counts it): send its
    /// result data, if any, then the completion, and drop what the
    /// transport held for the command. The transport may change the
    /// status (a result its data path cannot deliver).
    fn complete(&mut self, cqe: Cqe, data: Option<Bytes>);
    /// Answer a capsule the core refused before it counted it (its command
    /// ID is in flight already): the completion alone, leaving what the
    /// transport holds for the command in flight under that ID.
    fn refuse(&mut self, cqe: Cqe);
}

/// Why [`FabricQueue::admit`] did not take a capsule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Answered already: its command ID is in flight.
    Answered,
    /// The host broke the queue's rules: the queue must close (how, with a
    /// transport's terminating message or without, is the transport's).
    Fatal(FabricError),
}

/// How a queue starts, before its Connect.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    /// Prefix of the queue's log lines ("nvme", "nvme-rdma").
    pub transport: &'static str,
    /// Queue ID when the transport knows it before the Connect (RDMA's
    /// connection manager request), else 0; the Connect's sets it.
    pub qid: u16,
    /// Commands the host may have outstanding before the Connect sets the
    /// queue's size.
    pub sq_entries: u16,
    /// The queue must be connected (and authenticated where it must) by then.
    pub login_deadline: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitConnect,
    Connected,
    Closed,
}

/// Command IDs in flight: one bit each.
struct CidSet {
    bits: Box<[u64; 1024]>,
    len: usize,
}

impl CidSet {
    fn new() -> CidSet {
        CidSet { bits: Box::new([0; 1024]), len: 0 }
    }
    fn insert(&mut self, cid: u16) -> bool {
        let (w, b) = (cid as usize / 64, 1u64 << (cid % 64));
        if self.bits[w] & b != 0 {
            return false;
        }
        self.bits[w] |= b;
        self.len += 1;
        true
    }
    fn remove(&mut self, cid: u16) -> bool {
        let (w, b) = (cid as usize / 64, 1u64 << (cid % 64));
        if self.bits[w] & b == 0 {
            return false;
        }
        self.bits[w] &= !b;
        self.len -= 1;
        true
    }
}

/// One queue's login and accounting: see the module documentation.
///
/// The calls every command makes (`out_of_turn`, `admit`, `may_fetch`,
/// `dispatch`, `complete`) are `#[inline]`: each transport's wrapper
/// around them is on the data path, and as separate calls they cost an
/// NVMe/RDMA 4 KiB read about 70 more instructions (callgrind, the note
/// of 2026-11-25 on this core).
pub struct FabricQueue {
    transport: &'static str,
    login_deadline: Instant,
    phase: Phase,
    qid: u16,
    /// The controller this queue belongs to, once connected (for logs).
    cntlid: u16,
    sq_entries: u16,
    /// Capsules taken so far: the submission queue head is this modulo
    /// the queue's size.
    taken: u64,
    inflight: CidSet,
    /// The Connect handed to the transport (until it reports back), then
    /// the one that connected the queue.
    connect: Option<Connect>,
    /// The login deadline still runs: not connected, or connected and the
    /// host has yet to authenticate.
    login_open: bool,
    /// DH-HMAC-CHAP on this queue, when its host must authenticate.
    auth: Option<ControllerAuth>,
    keep_alive: Option<Arc<KeepAlive>>,
    /// When the last capsule arrived: the instant an authentication that
    /// it completes succeeded, when the controller's keep-alive starts.
    last_capsule: Option<Instant>,
    subsystem: Option<Arc<LiveSubsystem>>,
    hostnqn: String,
}

impl FabricQueue {
    pub fn new(s: Setup) -> FabricQueue {
        FabricQueue {
            transport: s.transport,
            login_deadline: s.login_deadline,
            phase: Phase::AwaitConnect,
            qid: s.qid,
            cntlid: 0,
            sq_entries: s.sq_entries.max(1),
            taken: 0,
            inflight: CidSet::new(),
            connect: None,
            login_open: true,
            auth: None,
            keep_alive: None,
            last_capsule: None,
            subsystem: None,
            hostnqn: String::new(),
        }
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }
    /// The controller this queue belongs to, once connected.
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }
    pub fn is_connected(&self) -> bool {
        self.phase == Phase::Connected
    }
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }
    /// Connected, and the host still has to authenticate before commands
    /// other than Auth Send/Receive and Disconnect run.
    pub fn awaiting_auth(&self) -> bool {
        self.auth.as_ref().is_some_and(|a| !a.authenticated())
    }
    /// Commands taken and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.inflight.len
    }
    /// The Connect being handled, or the one that connected the queue.
    pub fn connect(&self) -> Option<&Connect> {
        self.connect.as_ref()
    }
    /// Submission queue head, as every completion reports it.
    #[inline]
    fn sq_head(&self) -> u16 {
        (self.taken % self.sq_entries as u64) as u16
    }
    #[inline]
    fn cqe(&self, cid: u16, status: Status, result: u64) -> Cqe {
        Cqe { result, sq_head: self.sq_head(), sq_id: self.qid, cid, status }
    }

    /// The host may not send this command now: before the queue is
    /// connected only a Connect may come.
    #[inline]
    pub fn out_of_turn(&self, sqe: &Sqe) -> Option<FabricError> {
        let connect = sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT;
        (self.phase != Phase::Connected && !connect).then_some(FabricError::NotConnected("a command other than Connect"))
    }

    /// Take a capsule with command ID `cid`: count it against the queue's
    /// size (the submission queue head moves), restart the keep-alive
    /// clock (not for a host that has yet to authenticate) and put the
    /// command ID in flight.
    #[inline]
    pub fn admit(&mut self, cid: u16, now: Instant, w: &mut impl Wire) -> Result<(), Refused> {
        self.taken += 1;
        if self.inflight.len >= self.sq_entries as usize {
            let outstanding = self.inflight.len + 1;
            return Err(Refused::Fatal(FabricError::QueueOverflow { outstanding, entries: self.sq_entries }));
        }
        // The transports give every command of a receive batch the batch's
        // instant: the batch's first command touched the keep-alive with it
        // already (a clock subtraction and a division per command saved),
        // and touching it again could only move it back behind another
        // queue's later touch.
        let same_batch = self.last_capsule == Some(now);
        self.last_capsule = Some(now);
        if let Some(k) = self.keep_alive.as_ref().filter(|_| !same_batch && !self.awaiting_auth()) {
            k.touch(now);
        }
        if !self.inflight.insert(cid) {
            // The command in flight keeps the ID; this one is refused.
            w.refuse(self.cqe(cid, Status::CMDID_CONFLICT.dnr(), 0));
            return Err(Refused::Answered);
        }
        Ok(())
    }

    /// May the transport move this command's data to us (R2T, RDMA READ)?
    /// Not from a host that has yet to authenticate (but its Auth Send's),
    /// and not for an I/O command that fails anyway.
    #[inline]
    pub fn may_fetch(&self, sqe: &Sqe) -> Result<(), Status> {
        if self.awaiting_auth() && AuthCommand::parse(sqe).is_none() {
            return Err(Status::AUTH_REQUIRED.dnr());
        }
        match (&self.subsystem, self.qid > 0 && !sqe.is_fabrics()) {
            (Some(sub), true) => nvm_io::precheck(&sub.load(), &self.hostnqn, sqe),
            _ => Ok(()),
        }
    }

    /// A command whose data (if any) is here: run it here, or hand it to
    /// the transport.
    #[inline]
    pub fn dispatch<E: From<FabricError>>(&mut self, sqe: Sqe, data: Bytes, w: &mut impl Wire) -> Option<Action<E>> {
        let cid = sqe.cid();
        if self.phase != Phase::Connected {
            if sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT && self.connect.is_none() {
                return self.check_connect(sqe, data, w);
            }
            return self.fail(cid, Status::CMD_SEQ_ERROR, w);
        }
        if sqe.is_fabrics() {
            match sqe.fctype() {
                fctype::CONNECT => return self.fail(cid, Status::CMD_SEQ_ERROR, w),
                fctype::DISCONNECT => {
                    self.complete(cid, Status::SUCCESS, 0, None, w);
                    return self.close(None);
                }
                // Every queue authenticates on its own.
                fctype::AUTH_SEND | fctype::AUTH_RECEIVE => return self.auth_command(sqe, data, w),
                _ => {}
            }
        }
        if self.awaiting_auth() {
            return self.fail(cid, Status::AUTH_REQUIRED.dnr(), w);
        }
        // Property Get/Set belong to the admin queue.
        if sqe.is_fabrics() && self.qid > 0 {
            return self.fail(cid, Status::INVALID_OPCODE.dnr(), w);
        }
        Some(if self.qid == 0 { Action::Admin { sqe, data } } else { Action::Io { sqe, data } })
    }

    /// Check a Connect's own fields; the transport decides the rest.
    fn check_connect<E>(&mut self, sqe: Sqe, data: Bytes, w: &mut impl Wire) -> Option<Action<E>> {
        let cid = sqe.cid();
        match fabrics::check_connect(&sqe, &data) {
            Ok((connect, data)) => {
                self.connect = Some(connect);
                Some(Action::Connect { cid, connect, data })
            }
            Err((st, result)) => {
                self.complete(cid, st, result, None, w);
                None
            }
        }
    }

    /// The Connect of [`Action::Connect`] succeeded: the queue is bound
    /// (and, with `c.auth`, waits for the host to authenticate).
    pub fn connected(&mut self, cid: u16, c: Connected, now: Instant, w: &mut impl Wire) {
        let Some(conn) = self.connect.filter(|_| self.phase == Phase::AwaitConnect) else {
            return;
        };
        self.qid = conn.qid;
        self.cntlid = c.result as u16;
        self.sq_entries = conn.sqsize + 1;
        // (Not a host that has yet to authenticate: see admit.)
        if c.auth.is_none() {
            c.keep_alive.touch(now);
        }
        self.keep_alive = Some(c.keep_alive);
        self.subsystem = c.subsystem;
        self.hostnqn = c.hostnqn;
        let authreq = if c.auth.is_some() { fabrics::AUTHREQ_ATR as u64 } else { 0 };
        self.login_open = c.auth.is_some();
        self.auth = c.auth;
        self.phase = Phase::Connected;
        self.complete(cid, Status::SUCCESS, c.result | authreq, None, w);
    }

    /// The Connect of [`Action::Connect`] was refused (by the transport
    /// or the controller side): the host may try again.
    pub fn connect_refused(&mut self, cid: u16, status: Status, result: u64, w: &mut impl Wire) {
        if self.phase == Phase::AwaitConnect {
            self.connect = None;
        }
        self.complete(cid, status, result, None, w);
    }

    /// The [`Action::AuthSend`] with the randomness it needs.
    pub fn auth_send<E: From<FabricError>>(&mut self, sqe: &Sqe, data: &[u8], entropy: Entropy, w: &mut impl Wire) -> Option<Action<E>> {
        let Some(a) = self.auth.as_mut() else {
            return self.fail(sqe.cid(), Status::INVALID_OPCODE.dnr(), w);
        };
        log::debug!("{} queue {}: {} ({} bytes)", self.transport, self.qid, Message::parse(data).map(|m| m.name()).unwrap_or("a malformed message"), data.len());
        let status = a.auth_send(sqe, data, entropy);
        self.auth_done(sqe.cid(), status, None, w)
    }

    /// Auth Send (handed to the transport for its randomness) or Auth
    /// Receive (answered here), on a queue whose host authenticates.
    fn auth_command<E: From<FabricError>>(&mut self, sqe: Sqe, data: Bytes, w: &mut impl Wire) -> Option<Action<E>> {
        let cid = sqe.cid();
        let (Some(a), Some(cmd)) = (self.auth.as_mut(), AuthCommand::parse(&sqe)) else {
            // No authentication configured for this host (as Linux's target).
            return self.fail(cid, Status::INVALID_OPCODE.dnr(), w);
        };
        if cmd.send {
            return Some(Action::AuthSend { sqe, data });
        }
        let (status, out) = match a.auth_receive(&sqe) {
            Ok(d) => {
                log::debug!("{} queue {}: sends {}", self.transport, self.qid, Message::parse(&d).map(|m| m.name()).unwrap_or("?"));
                (Status::SUCCESS, Some(Bytes::from(d)))
            }
            Err(st) => (st, None),
        };
        self.auth_done(cid, status, out, w)
    }

    /// Complete an authentication command; the queue closes when the
    /// exchange failed for good, and its login ends when it succeeded.
    fn auth_done<E: From<FabricError>>(&mut self, cid: u16, status: Status, data: Option<Bytes>, w: &mut impl Wire) -> Option<Action<E>> {
        self.complete(cid, status, 0, data, w);
        let a = self.auth.as_ref()?;
        if let Some(reason) = a.failed() {
            let why = FabricError::AuthFailed { hostnqn: a.hostnqn().to_string(), why: a.why().unwrap_or("-").to_string(), reason };
            return self.close(Some(why.into()));
        }
        if a.authenticated() && self.login_open {
            self.login_open = false;
            // The keep-alive clock starts now, as nvmet starts it when the
            // controller is enabled (after authentication): an exchange
            // slower than KATO (ffdhe8192 on a slow CPU) must not leave
            // the controller expired the moment its host got in.
            if let (Some(k), Some(t)) = (self.keep_alive.as_ref(), self.last_capsule) {
                k.touch(t);
            }
            log::info!("{}: controller {} queue {}: {} authenticated ({})", self.transport, self.cntlid, self.qid, a.hostnqn().escape_debug(), a.summary());
            return Some(Action::Authenticated);
        }
        None
    }

    /// A command finished: the transport sends its data (if any) and its
    /// completion.
    #[inline]
    pub fn complete(&mut self, cid: u16, status: Status, result: u64, data: Option<Bytes>, w: &mut impl Wire) {
        if !self.inflight.remove(cid) {
            log::warn!("{} queue {}: completion for command {cid}, which is not in flight", self.transport, self.qid);
            return;
        }
        w.complete(self.cqe(cid, status, result), data);
    }

    /// Fail a command the queue took.
    #[inline]
    pub fn fail<E>(&mut self, cid: u16, status: Status, w: &mut impl Wire) -> Option<Action<E>> {
        self.complete(cid, status, 0, None, w);
        None
    }

    /// Close the queue (the transport sends what was queued first).
    pub fn close<E>(&mut self, why: Option<E>) -> Option<Action<E>> {
        self.phase = Phase::Closed;
        Some(Action::Close(why))
    }

    /// The next instant [`FabricQueue::handle_timeout`] must be called at.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Closed => None,
            _ if self.login_open => Some(self.login_deadline),
            Phase::Connected if self.qid == 0 => self.keep_alive.as_ref().and_then(|k| k.deadline()),
            _ => None,
        }
    }

    /// Time passed: enforce the login deadline and the admin queue's
    /// keep-alive timeout.
    pub fn handle_timeout<E: From<FabricError>>(&mut self, now: Instant) -> Option<Action<E>> {
        if self.phase == Phase::Closed {
            return None;
        }
        if self.login_open {
            if now < self.login_deadline {
                return None;
            }
            let why = if self.phase == Phase::Connected { FabricError::AuthTimeout } else { FabricError::LoginTimeout };
            return self.close(Some(why.into()));
        }
        let ka = self.keep_alive.as_ref().filter(|_| self.qid == 0)?;
        if ka.expired(now) {
            let ms = ka.kato().map_or(0, |k| k.as_millis());
            return self.close(Some(FabricError::KeepAliveExpired(ms).into()));
        }
        None
    }
}

/// In-capsule data's descriptor checked against the `received` bytes that
/// followed the command: an offset descriptor at offset 0, within what a
/// capsule may carry, on a command that moves data to the controller, and
/// of exactly the length received (`padded`: of at most that length, for
/// a transport whose receive buffers may hold more than was sent). The
/// length to take, or the status that fails the command.
pub fn incapsule_len(sqe: &Sqe, received: usize, padded: bool) -> Result<usize, Status> {
    let s = sqe.sgl();
    let len = s.length as usize;
    let fits = if padded { len <= received } else { len == received };
    if s.kind != sgl::INCAPSULE {
        Err(Status::SGL_INVALID_TYPE.dnr())
    } else if s.addr != 0 || received > INCAPSULE_DATA as usize {
        Err(Status::SGL_INVALID_OFFSET.dnr())
    } else if !fits || !sqe.is_host_to_ctrl() {
        Err(Status::SGL_INVALID_DATA.dnr())
    } else {
        Ok(len)
    }
}

#[cfg(test)]
mod tests;
