//! One NVMe/TCP queue on the controller side (one TCP connection, admin or
//! I/O), without sockets, in the style of quinn-proto: bytes and time go
//! in, encoded PDUs and [`Action`]s come out.
//!
//! [`TargetQueue`] frames what the host sends ([`TargetQueue::receive`]),
//! answers the ICReq, checks every capsule (SGL, in-capsule data, queue
//! depth, command ID), keeps the submission queue head, asks for write data
//! with R2T and checks every H2CData against it, and hands complete
//! commands to the transport as [`Action`]s. The transport runs them (on a
//! controller, a volume, the set of controllers for Connect) and reports
//! back with [`TargetQueue::complete`], [`TargetQueue::connected`] or, for
//! reads whose payload it moves itself, [`TargetQueue::read_pdus`] and
//! [`TargetQueue::read_sent`]; the queue turns those into C2HData (split
//! into PDUs of at most [`QueueConfig::max_c2h_data`]) and CapsuleResp.
//! Time is passed in: the login deadline and the admin queue's keep-alive
//! come out of [`TargetQueue::poll_timeout`] and are enforced by
//! [`TargetQueue::handle_timeout`].
//!
//! In-band authentication (DH-HMAC-CHAP, [`crate::auth`]) is part of the
//! login: when the transport connects the queue with a
//! [`ControllerAuth`], the Connect response sets AUTHREQ.ATR, every command
//! but Auth Send/Receive and Disconnect fails with AUTH_REQUIRED until the
//! host has authenticated, and the login deadline stays armed until then.
//! Auth Receive runs here; Auth Send comes out as [`Action::AuthSend`]
//! because it needs fresh randomness ([`Entropy`]), which the transport
//! draws and passes back in [`TargetQueue::auth_send`].
//!
//! Encoded PDUs are appended to a `&mut Vec<u8>` the transport passes in
//! (its send buffer), so nothing is allocated per reply.
//!
//! Memory a host can make us hold is bounded: a PDU longer than the largest
//! we accept is refused from its 8-byte header, before anything is
//! buffered; a transfer longer than MDTS is refused before its R2T; and R2Ts
//! are issued only while the write data asked for and not yet completed
//! stays within [`QueueConfig::r2t_budget`] (later writes wait their turn).
//! Before the queue is connected the host may send one thing only, a
//! Connect with its 1024 bytes of data (in the capsule or asked for with
//! one R2T), so a host that never connects holds about a kilobyte: anything
//! else then is a fatal transport error.

use crate::auth::message::{AuthCommand, Message};
use crate::auth::{ControllerAuth, Entropy, FailureReason};
use crate::queue_entry::{sgl, Cqe, Sqe};
use crate::controller::{KeepAlive, INCAPSULE_DATA, MAX_TRANSFER};
use crate::fabrics::{self, fctype, Connect, ConnectData, CATTR_DISABLE_SQFLOW, CONNECT_DATA_LEN};
use crate::pdu::{
    self, fes, CapsuleCmd, DataHeader, DataPdu, DataPduHeader, Digests, IcResp, Pdu, PduError, R2t,
    TermReq,
};
use crate::subsystem::LiveSubsystem;
use crate::{nvm_io, Status};
use bytes::{Bytes, BytesMut};
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

/// Largest H2CData payload we accept (MAXH2CDATA), also the most one R2T
/// asks for: one command's whole transfer.
pub const MAXH2CDATA: u32 = 1 << 20;
/// Write data asked for with R2T and not yet completed, per queue.
pub const R2T_BUDGET: usize = 16 << 20;

#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// MAXH2CDATA we announce in the ICResp.
    pub maxh2cdata: u32,
    /// Largest C2HData payload we send; longer read results are split.
    pub max_c2h_data: u32,
    /// See the module documentation.
    pub r2t_budget: usize,
    /// The queue must be connected (ICReq and a successful Connect) by then.
    pub login_deadline: Instant,
}

impl QueueConfig {
    pub fn new(login_deadline: Instant) -> QueueConfig {
        QueueConfig {
            maxh2cdata: MAXH2CDATA,
            max_c2h_data: MAX_TRANSFER,
            r2t_budget: R2T_BUDGET,
            login_deadline,
        }
    }
}

/// Why a queue closed with an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("malformed PDU: {0}")]
    Malformed(PduError),
    #[error("first PDU is type {0:#04x}, not ICReq")]
    NotIcReq(u8),
    #[error("ICReq: unsupported {0}")]
    UnsupportedIcReq(&'static str),
    #[error("unexpected PDU type {0:#04x} from the host")]
    UnexpectedPdu(u8),
    #[error("host terminated the connection: FES {fes:#x} FEI {fei}")]
    HostTerminated { fes: u16, fei: u32 },
    #[error("host has {outstanding} commands outstanding on a queue of {entries} entries")]
    QueueOverflow { outstanding: usize, entries: u16 },
    #[error("H2CData for unknown transfer tag {0}")]
    UnknownTransferTag(u16),
    #[error("H2CData command id {cid} does not match transfer tag {ttag}")]
    TransferTagMismatch { cid: u16, ttag: u16 },
    #[error("H2CData of {0} bytes exceeds MAXH2CDATA")]
    H2CDataTooLong(usize),
    #[error("H2CData offset {offset} length {len} outside the expected {expected}..{total}")]
    H2CDataOutOfRange {
        offset: u32,
        len: usize,
        expected: usize,
        total: usize,
    },
    #[error("{0} before the queue is connected")]
    NotConnected(&'static str),
    #[error("no ICReq and Connect before the login timeout")]
    LoginTimeout,
    #[error("connected but no DH-HMAC-CHAP authentication before the login timeout")]
    AuthTimeout,
    /// Authentication failed for good: this queue closes (its
    /// controller's other queues are not the failing host's to end).
    /// `hostnqn` came from the wire: printed escaped.
    #[error("DH-HMAC-CHAP authentication of {} failed: {why} ({reason})", hostnqn.escape_debug())]
    AuthFailed {
        hostnqn: String,
        why: String,
        reason: FailureReason,
    },
    #[error("keep-alive timeout ({0} ms without a command)")]
    KeepAliveExpired(u128),
}

/// What the transport must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create (queue 0) or join a controller, then call
    /// [`TargetQueue::connected`] or [`TargetQueue::connect_refused`].
    Connect {
        cid: u16,
        connect: Connect,
        data: ConnectData,
    },
    /// Run an admin command (or a fabrics command other than Connect and
    /// Disconnect) on the controller; report with [`TargetQueue::complete`].
    Admin { sqe: Sqe, data: Bytes },
    /// Run an NVM I/O command; report with [`TargetQueue::complete`], or
    /// move a read's payload with [`TargetQueue::read_pdus`].
    Io { sqe: Sqe, data: Bytes },
    /// An Auth Send: draw fresh [`Entropy`] and call
    /// [`TargetQueue::auth_send`] (or [`TargetQueue::complete`] with an
    /// error if there is no randomness to be had).
    AuthSend { sqe: Sqe, data: Bytes },
    /// The host has just authenticated on this queue (the first time:
    /// its login is over). Until then the queue is connected but nothing
    /// other than authentication runs on it, so the transport claims what
    /// the queue holds (its queue ID) only now.
    Authenticated,
    /// Send what was queued, then close the connection; `None` after a
    /// Disconnect.
    Close(Option<QueueError>),
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
    /// The host must authenticate on this queue (DH-HMAC-CHAP): the
    /// Connect response asks for it (AUTHREQ.ATR) and the login deadline
    /// stays armed until it has.
    pub auth: Option<ControllerAuth>,
}

/// Outcome of [`TargetQueue::receive`].
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// No complete PDU buffered.
    NeedMore,
    /// One PDU handled, with what it asks the transport to do.
    Pdu(Option<Action>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitIcReq,
    AwaitConnect,
    Connected,
    Closed,
}

/// A write (or other host-to-controller command) waiting for its data.
struct Pending {
    sqe: Sqe,
    chunks: Vec<Bytes>,
    received: usize,
    total: usize,
}

/// Command IDs in flight: one bit each (the RDMA queue keeps one too).
pub(crate) struct CidSet {
    bits: Box<[u64; 1024]>,
    pub(crate) len: usize,
}

impl CidSet {
    pub(crate) fn new() -> CidSet {
        CidSet {
            bits: Box::new([0; 1024]),
            len: 0,
        }
    }
    pub(crate) fn insert(&mut self, cid: u16) -> bool {
        let (w, b) = (cid as usize / 64, 1u64 << (cid % 64));
        if self.bits[w] & b != 0 {
            return false;
        }
        self.bits[w] |= b;
        self.len += 1;
        true
    }
    pub(crate) fn remove(&mut self, cid: u16) -> bool {
        let (w, b) = (cid as usize / 64, 1u64 << (cid % 64));
        if self.bits[w] & b == 0 {
            return false;
        }
        self.bits[w] &= !b;
        self.len -= 1;
        true
    }
}

pub struct TargetQueue {
    cfg: QueueConfig,
    phase: Phase,
    digests: Digests,
    qid: u16,
    /// The controller this queue belongs to, once connected (for logs).
    cntlid: u16,
    sqflow_disabled: bool,
    /// Submission queue head, reported in every completion.
    sqhd: u16,
    sq_entries: u16,
    inflight: CidSet,
    /// The Connect handed to the transport, until it reports back.
    connecting: Option<Connect>,
    login_open: bool,
    /// DH-HMAC-CHAP on this queue, when its host must authenticate.
    auth: Option<ControllerAuth>,
    keep_alive: Option<Arc<KeepAlive>>,
    /// When the last capsule arrived: the instant an authentication that
    /// it completes succeeded, when the controller's keep-alive starts.
    last_capsule: Option<Instant>,
    subsystem: Option<Arc<LiveSubsystem>>,
    /// Writes receiving data, by transfer tag (= command ID).
    pending: HashMap<u16, Pending>,
    /// Writes waiting for R2T budget, in arrival order.
    waiting: VecDeque<Sqe>,
    /// Write bytes asked for and not yet completed, per command.
    granted: HashMap<u16, usize>,
    granted_bytes: usize,
}

impl TargetQueue {
    pub fn new(cfg: QueueConfig) -> TargetQueue {
        TargetQueue {
            cfg,
            phase: Phase::AwaitIcReq,
            digests: Digests::default(),
            qid: 0,
            cntlid: 0,
            sqflow_disabled: false,
            sqhd: 0,
            sq_entries: 1,
            inflight: CidSet::new(),
            connecting: None,
            login_open: true,
            auth: None,
            keep_alive: None,
            last_capsule: None,
            subsystem: None,
            pending: HashMap::new(),
            waiting: VecDeque::new(),
            granted: HashMap::new(),
            granted_bytes: 0,
        }
    }

    /// Queue ID, once connected (0 before).
    pub fn qid(&self) -> u16 {
        self.qid
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
    /// Digests negotiated by the ICReq (none before).
    pub fn digests(&self) -> Digests {
        self.digests
    }
    /// Commands received and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.inflight.len
    }
    /// Write data asked for with R2T and not yet completed, bytes.
    pub fn granted_bytes(&self) -> usize {
        self.granted_bytes
    }
    /// Largest PDU the host may send now: a framing reader refuses longer
    /// ones from their header.
    pub fn max_pdu_len(&self) -> u32 {
        match self.phase {
            Phase::AwaitIcReq => pdu::IC_LEN as u32,
            // A Connect capsule with its data, or the H2CData carrying it.
            Phase::AwaitConnect => (pdu::CMD_HLEN + 2 * pdu::DIGEST_LEN + CONNECT_DATA_LEN) as u32,
            _ => self.cfg.maxh2cdata.max(INCAPSULE_DATA) + 256,
        }
    }

    /// Decode and handle at most one PDU from the front of `buf`.
    pub fn receive(&mut self, buf: &mut BytesMut, now: Instant, tx: &mut Vec<u8>) -> Received {
        if self.phase == Phase::Closed {
            return Received::NeedMore;
        }
        match pdu::decode(buf, self.digests, self.max_pdu_len()) {
            Ok(Some(p)) => Received::Pdu(self.handle_pdu(p, now, tx)),
            Ok(None) => Received::NeedMore,
            Err(e) => {
                let head = buf[..buf.len().min(pdu::TERM_MAX_DATA)].to_vec();
                Received::Pdu(self.handle_bad_pdu(e, &head, now, tx))
            }
        }
    }

    /// A PDU that failed to decode; `head` is what followed in the buffer
    /// (quoted in the C2HTermReq).
    pub fn handle_bad_pdu(
        &mut self,
        e: PduError,
        head: &[u8],
        now: Instant,
        tx: &mut Vec<u8>,
    ) -> Option<Action> {
        match e {
            // The capsule was consumed: fail only this command.
            PduError::DataDigest {
                kind: pdu::kind::CAPSULE_CMD,
                cid,
            } => match self.accept_capsule(cid, now, tx) {
                Err(a) => a,
                Ok(false) => None,
                Ok(true) => self.fail(cid, Status::TRANSIENT_TRANSPORT, tx),
            },
            // Which bytes of which transfer were bad cannot be trusted.
            PduError::DataDigest { .. } => self.close(Some(QueueError::Malformed(e))),
            e => {
                let fes = e.fes().unwrap_or(fes::INVALID_HEADER_FIELD);
                let fei = e.fei();
                self.fatal(fes, fei, head, QueueError::Malformed(e), tx)
            }
        }
    }

    /// A decoded PDU from the host.
    pub fn handle_pdu(&mut self, p: Pdu, now: Instant, tx: &mut Vec<u8>) -> Option<Action> {
        match (self.phase, p) {
            (Phase::Closed, _) => None,
            (Phase::AwaitIcReq, Pdu::IcReq(r)) => {
                if r.pfv != 0 {
                    return self.fatal(
                        fes::UNSUPPORTED_PARAMETER,
                        8,
                        &[],
                        QueueError::UnsupportedIcReq("PDU format version"),
                        tx,
                    );
                }
                if r.hpda != 0 {
                    return self.fatal(
                        fes::UNSUPPORTED_PARAMETER,
                        10,
                        &[],
                        QueueError::UnsupportedIcReq("host PDU data alignment"),
                        tx,
                    );
                }
                Pdu::IcResp(IcResp {
                    pfv: 0,
                    cpda: 0,
                    digests: r.digests,
                    maxh2cdata: self.cfg.maxh2cdata,
                })
                .encode_into(Digests::default(), tx);
                self.digests = r.digests;
                self.phase = Phase::AwaitConnect;
                None
            }
            (Phase::AwaitIcReq, p) => self.fatal(
                fes::PDU_SEQUENCE_ERROR,
                0,
                &[p.kind()],
                QueueError::NotIcReq(p.kind()),
                tx,
            ),
            (_, Pdu::CapsuleCmd(c)) => self.capsule(c, now, tx),
            (_, Pdu::H2CData(h)) => self.h2c_data(h, tx),
            (_, Pdu::H2CTermReq(t)) => self.close(Some(QueueError::HostTerminated {
                fes: t.fes,
                fei: t.fei,
            })),
            (_, other) => self.fatal(
                fes::INVALID_HEADER_FIELD,
                0,
                &[other.kind()],
                QueueError::UnexpectedPdu(other.kind()),
                tx,
            ),
        }
    }

    /// The next instant [`TargetQueue::handle_timeout`] must be called at.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Closed => None,
            _ if self.login_open => Some(self.cfg.login_deadline),
            Phase::Connected if self.qid == 0 => {
                self.keep_alive.as_ref().and_then(|k| k.deadline())
            }
            _ => None,
        }
    }

    /// Time passed: enforce the login deadline and the keep-alive timeout.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Action> {
        if self.phase == Phase::Closed {
            return None;
        }
        if self.login_open {
            if now >= self.cfg.login_deadline {
                let why = if self.phase == Phase::Connected {
                    QueueError::AuthTimeout
                } else {
                    QueueError::LoginTimeout
                };
                return self.close(Some(why));
            }
            return None;
        }
        let ka = self.keep_alive.as_ref().filter(|_| self.qid == 0)?;
        if ka.expired(now) {
            let ms = ka.kato().map_or(0, |k| k.as_millis());
            return self.close(Some(QueueError::KeepAliveExpired(ms)));
        }
        None
    }

    /// The Connect of [`Action::Connect`] succeeded: the queue is bound
    /// (and, with `c.auth`, waits for the host to authenticate).
    pub fn connected(&mut self, cid: u16, c: Connected, now: Instant, tx: &mut Vec<u8>) {
        let Some(conn) = self.connecting.take() else {
            return;
        };
        self.qid = conn.qid;
        self.cntlid = c.result as u16;
        self.sqflow_disabled = conn.cattr & CATTR_DISABLE_SQFLOW != 0;
        self.sq_entries = conn.sqsize + 1;
        // The Connect itself was the first entry.
        self.sqhd = 1 % self.sq_entries;
        // (Not a host that has yet to authenticate: see accept_capsule.)
        if c.auth.is_none() {
            c.keep_alive.touch(now);
        }
        self.keep_alive = Some(c.keep_alive);
        self.subsystem = c.subsystem;
        let authreq = if c.auth.is_some() {
            fabrics::AUTHREQ_ATR as u64
        } else {
            0
        };
        self.login_open = c.auth.is_some();
        self.auth = c.auth;
        self.phase = Phase::Connected;
        self.complete(cid, Status::SUCCESS, c.result | authreq, None, tx);
    }

    /// The Connect of [`Action::Connect`] was refused.
    pub fn connect_refused(&mut self, cid: u16, status: Status, result: u64, tx: &mut Vec<u8>) {
        self.connecting = None;
        self.complete(cid, status, result, None, tx);
    }

    /// The [`Action::AuthSend`] with the randomness it needs.
    pub fn auth_send(
        &mut self,
        sqe: &Sqe,
        data: &[u8],
        entropy: Entropy,
        tx: &mut Vec<u8>,
    ) -> Option<Action> {
        let Some(a) = self.auth.as_mut() else {
            return self.fail(sqe.cid(), Status::INVALID_OPCODE.dnr(), tx);
        };
        log::debug!(
            "nvme queue {}: {} ({} bytes)",
            self.qid,
            Message::parse(data)
                .map(|m| m.name())
                .unwrap_or("a malformed message"),
            data.len()
        );
        let status = a.auth_send(sqe, data, entropy);
        self.auth_done(sqe.cid(), status, None, tx)
    }

    /// Auth Send (handed to the transport for its randomness) or Auth
    /// Receive (answered here), on a queue whose host authenticates.
    fn auth_command(&mut self, sqe: Sqe, data: Bytes, tx: &mut Vec<u8>) -> Option<Action> {
        let cid = sqe.cid();
        let (Some(a), Some(cmd)) = (self.auth.as_mut(), AuthCommand::parse(&sqe)) else {
            // No authentication configured for this host (as Linux's target).
            return self.fail(cid, Status::INVALID_OPCODE.dnr(), tx);
        };
        if cmd.send {
            return Some(Action::AuthSend { sqe, data });
        }
        let (status, out) = match a.auth_receive(&sqe) {
            Ok(d) => {
                log::debug!(
                    "nvme queue {}: sends {}",
                    self.qid,
                    Message::parse(&d).map(|m| m.name()).unwrap_or("?")
                );
                (Status::SUCCESS, Some(Bytes::from(d)))
            }
            Err(st) => (st, None),
        };
        self.auth_done(cid, status, out, tx)
    }

    /// Complete an authentication command; the queue closes when the
    /// exchange failed for good, and its login ends when it succeeded.
    fn auth_done(
        &mut self,
        cid: u16,
        status: Status,
        data: Option<Bytes>,
        tx: &mut Vec<u8>,
    ) -> Option<Action> {
        self.complete(cid, status, 0, data, tx);
        let a = self.auth.as_ref()?;
        if let Some(reason) = a.failed() {
            let why = QueueError::AuthFailed {
                hostnqn: a.hostnqn().to_string(),
                why: a.why().unwrap_or("-").to_string(),
                reason,
            };
            return self.close(Some(why));
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
            log::info!(
                "nvme: controller {} queue {}: {} authenticated ({})",
                self.cntlid,
                self.qid,
                a.hostnqn().escape_debug(),
                a.summary()
            );
            return Some(Action::Authenticated);
        }
        None
    }

    /// A command finished: queue its data (C2HData, split as configured)
    /// and its completion. With SQ flow control disabled a successful
    /// command with data completes with the last C2HData alone.
    pub fn complete(
        &mut self,
        cid: u16,
        status: Status,
        result: u64,
        data: Option<Bytes>,
        tx: &mut Vec<u8>,
    ) {
        if !self.inflight.remove(cid) {
            log::warn!(
                "nvme queue {}: completion for command {cid}, which is not in flight",
                self.qid
            );
            return;
        }
        let mut resp = true;
        if let Some(d) = data.filter(|d| !d.is_empty()) {
            let success = self.sqflow_disabled && status.is_success();
            resp = !success;
            let max = self.cfg.max_c2h_data.max(1) as usize;
            let mut at = 0;
            while at < d.len() {
                let n = (d.len() - at).min(max);
                let last = at + n == d.len();
                let p = DataPdu {
                    cid,
                    ttag: 0,
                    offset: at as u32,
                    last,
                    success: success && last,
                    data: d.slice(at..at + n),
                };
                Pdu::C2HData(p).encode_into(self.digests, tx);
                at += n;
            }
        }
        if resp {
            self.push_cqe(cid, status, result, tx);
        }
        self.release_grant(cid, tx);
    }

    /// The C2HData PDUs that carry a successful `len`-byte read result of
    /// command `cid`, for a transport that writes each payload itself (from
    /// a file with sendfile, or from the volume straight into its send
    /// buffer): for each, the header to write and the range of the result
    /// that follows it (then its CRC32C when data digests are on). Then
    /// call [`TargetQueue::read_sent`]; if the data cannot be had, discard
    /// what was written and call [`TargetQueue::complete`] with the error.
    pub fn read_pdus(&self, cid: u16, len: usize) -> ReadPdus {
        ReadPdus {
            cid,
            len,
            at: 0,
            max: self.cfg.max_c2h_data.max(1) as usize,
            success: self.sqflow_disabled,
            digests: self.digests,
        }
    }

    /// The payload of [`TargetQueue::read_pdus`] was queued: complete the
    /// command (a CapsuleResp, unless the last C2HData said SUCCESS).
    pub fn read_sent(&mut self, cid: u16, tx: &mut Vec<u8>) {
        if !self.inflight.remove(cid) {
            log::warn!(
                "nvme queue {}: read data for command {cid}, which is not in flight",
                self.qid
            );
            return;
        }
        if !self.sqflow_disabled {
            self.push_cqe(cid, Status::SUCCESS, 0, tx);
        }
        self.release_grant(cid, tx);
    }

    fn push_cqe(&self, cid: u16, status: Status, result: u64, tx: &mut Vec<u8>) {
        Pdu::CapsuleResp(Cqe {
            result,
            sq_head: self.sqhd,
            sq_id: self.qid,
            cid,
            status,
        })
        .encode_into(self.digests, tx);
    }

    /// Queue a C2HTermReq and close.
    fn fatal(
        &mut self,
        fes: u16,
        fei: u32,
        head: &[u8],
        why: QueueError,
        tx: &mut Vec<u8>,
    ) -> Option<Action> {
        let data = Bytes::copy_from_slice(&head[..head.len().min(pdu::TERM_MAX_DATA)]);
        Pdu::C2HTermReq(TermReq { fes, fei, data }).encode_into(Digests::default(), tx);
        self.close(Some(why))
    }

    fn close(&mut self, why: Option<QueueError>) -> Option<Action> {
        self.phase = Phase::Closed;
        Some(Action::Close(why))
    }

    fn fail(&mut self, cid: u16, st: Status, tx: &mut Vec<u8>) -> Option<Action> {
        self.complete(cid, st, 0, None, tx);
        None
    }

    /// Account for a capsule: SQ head, queue depth, command ID, keep-alive.
    /// `Err(action)`: the queue closes; `Ok(false)`: answered already
    /// (command ID in use).
    fn accept_capsule(
        &mut self,
        cid: u16,
        now: Instant,
        tx: &mut Vec<u8>,
    ) -> Result<bool, Option<Action>> {
        self.sqhd = (self.sqhd + 1) % self.sq_entries.max(1);
        // Before Connect the queue has one entry: the Connect.
        if self.inflight.len >= self.sq_entries as usize {
            let why = QueueError::QueueOverflow {
                outstanding: self.inflight.len + 1,
                entries: self.sq_entries,
            };
            return Err(self.fatal(fes::PDU_SEQUENCE_ERROR, 0, &[], why, tx));
        }
        self.last_capsule = Some(now);
        // A host that has yet to authenticate does not keep the
        // controller alive.
        if let Some(k) = self.keep_alive.as_ref().filter(|_| !self.awaiting_auth()) {
            k.touch(now);
        }
        if !self.inflight.insert(cid) {
            // The command in flight keeps the ID; this one is refused.
            self.push_cqe(cid, Status::CMDID_CONFLICT.dnr(), 0, tx);
            return Ok(false);
        }
        Ok(true)
    }

    /// A command arrived: account for it, collect its data, run it.
    fn capsule(&mut self, c: CapsuleCmd, now: Instant, tx: &mut Vec<u8>) -> Option<Action> {
        let sqe = c.sqe;
        let cid = sqe.cid();
        if self.phase != Phase::Connected {
            let what = if !(sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT) {
                Some("a command other than Connect")
            } else if sqe.sgl().length as usize > CONNECT_DATA_LEN {
                Some("Connect data longer than 1024 bytes")
            } else {
                None
            };
            if let Some(what) = what {
                let why = QueueError::NotConnected(what);
                return self.fatal(fes::PDU_SEQUENCE_ERROR, 0, &[], why, tx);
            }
        }
        match self.accept_capsule(cid, now, tx) {
            Err(a) => return a,
            Ok(false) => return None,
            Ok(true) => {}
        }
        let s = sqe.sgl();
        if !c.data.is_empty() {
            // In-capsule data: offset SGL, exactly the length it announces.
            let st = if s.kind != sgl::INCAPSULE {
                Some(Status::SGL_INVALID_TYPE)
            } else if s.addr != 0 || c.data.len() > INCAPSULE_DATA as usize {
                Some(Status::SGL_INVALID_OFFSET)
            } else if s.length as usize != c.data.len() || !sqe.is_host_to_ctrl() {
                Some(Status::SGL_INVALID_DATA)
            } else {
                None
            };
            if let Some(st) = st {
                return self.fail(cid, st.dnr(), tx);
            }
            return self.dispatch(sqe, c.data, tx);
        }
        if sqe.is_host_to_ctrl() && s.length > 0 {
            // Data comes later in H2CData PDUs, asked for with one R2T.
            if s.kind != sgl::TRANSPORT {
                return self.fail(cid, Status::SGL_INVALID_TYPE.dnr(), tx);
            }
            if s.length > MAX_TRANSFER {
                return self.fail(cid, Status::INVALID_FIELD.dnr(), tx);
            }
            // No write data from a host that has yet to authenticate.
            if self.awaiting_auth() && AuthCommand::parse(&sqe).is_none() {
                return self.fail(cid, Status::AUTH_REQUIRED.dnr(), tx);
            }
            if let (Some(sub), true) = (&self.subsystem, self.qid > 0 && !sqe.is_fabrics()) {
                if let Err(st) = nvm_io::precheck(&sub.load(), &sqe) {
                    return self.fail(cid, st, tx);
                }
            }
            self.waiting.push_back(sqe);
            self.issue_r2ts(tx);
            return None;
        }
        self.dispatch(sqe, Bytes::new(), tx)
    }

    /// Ask for the data of waiting writes while the budget allows (always
    /// at least one at a time).
    fn issue_r2ts(&mut self, tx: &mut Vec<u8>) {
        while let Some(sqe) = self.waiting.front() {
            let len = sqe.sgl().length as usize;
            if self.granted_bytes > 0 && self.granted_bytes + len > self.cfg.r2t_budget {
                return;
            }
            let Some(sqe) = self.waiting.pop_front() else {
                return;
            };
            let cid = sqe.cid();
            self.granted_bytes += len;
            self.granted.insert(cid, len);
            self.pending.insert(
                cid,
                Pending {
                    sqe,
                    chunks: Vec::new(),
                    received: 0,
                    total: len,
                },
            );
            Pdu::R2T(R2t {
                cid,
                ttag: cid,
                offset: 0,
                length: len as u32,
            })
            .encode_into(self.digests, tx);
        }
    }

    fn release_grant(&mut self, cid: u16, tx: &mut Vec<u8>) {
        if let Some(n) = self.granted.remove(&cid) {
            self.granted_bytes -= n;
            self.issue_r2ts(tx);
        }
    }

    fn h2c_data(&mut self, h: DataPdu, tx: &mut Vec<u8>) -> Option<Action> {
        // (Before Connect the only transfer asked for is the Connect's.)
        let problem = match self.pending.get(&h.ttag) {
            None => Some((
                fes::INVALID_HEADER_FIELD,
                10,
                QueueError::UnknownTransferTag(h.ttag),
            )),
            Some(p) if h.cid != p.sqe.cid() => Some((
                fes::INVALID_HEADER_FIELD,
                8,
                QueueError::TransferTagMismatch {
                    cid: h.cid,
                    ttag: h.ttag,
                },
            )),
            Some(_) if h.data.len() > self.cfg.maxh2cdata as usize => Some((
                fes::R2T_LIMIT_EXCEEDED,
                16,
                QueueError::H2CDataTooLong(h.data.len()),
            )),
            Some(p) if h.offset as usize != p.received || p.received + h.data.len() > p.total => {
                let why = QueueError::H2CDataOutOfRange {
                    offset: h.offset,
                    len: h.data.len(),
                    expected: p.received,
                    total: p.total,
                };
                Some((fes::DATA_OUT_OF_RANGE, 12, why))
            }
            Some(_) => None,
        };
        if let Some((f, fei, why)) = problem {
            return self.fatal(f, fei, &[], why, tx);
        }
        let p = self.pending.get_mut(&h.ttag)?;
        p.received += h.data.len();
        p.chunks.push(h.data);
        if p.received < p.total {
            return None;
        }
        let p = self.pending.remove(&h.ttag)?;
        let data = if p.chunks.len() == 1 {
            p.chunks.into_iter().next().unwrap_or_default()
        } else {
            let mut all = BytesMut::with_capacity(p.total);
            for c in p.chunks {
                all.extend_from_slice(&c);
            }
            all.freeze()
        };
        self.dispatch(p.sqe, data, tx)
    }

    /// A command whose data (if any) is complete.
    fn dispatch(&mut self, sqe: Sqe, data: Bytes, tx: &mut Vec<u8>) -> Option<Action> {
        let cid = sqe.cid();
        if self.phase != Phase::Connected {
            if sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT && self.connecting.is_none() {
                return self.connect(sqe, data, tx);
            }
            return self.fail(cid, Status::CMD_SEQ_ERROR, tx);
        }
        if sqe.is_fabrics() {
            match sqe.fctype() {
                fctype::CONNECT => return self.fail(cid, Status::CMD_SEQ_ERROR, tx),
                fctype::DISCONNECT => {
                    self.complete(cid, Status::SUCCESS, 0, None, tx);
                    return self.close(None);
                }
                // Every queue authenticates on its own.
                fctype::AUTH_SEND | fctype::AUTH_RECEIVE => {
                    return self.auth_command(sqe, data, tx)
                }
                _ => {}
            }
        }
        if self.awaiting_auth() {
            return self.fail(cid, Status::AUTH_REQUIRED.dnr(), tx);
        }
        // Property Get/Set belong to the admin queue.
        if sqe.is_fabrics() && self.qid > 0 {
            return self.fail(cid, Status::INVALID_OPCODE.dnr(), tx);
        }
        Some(if self.qid == 0 {
            Action::Admin { sqe, data }
        } else {
            Action::Io { sqe, data }
        })
    }

    /// Check a Connect's own fields; the transport decides the rest.
    fn connect(&mut self, sqe: Sqe, data: Bytes, tx: &mut Vec<u8>) -> Option<Action> {
        let cid = sqe.cid();
        match fabrics::check_connect(&sqe, &data) {
            Ok((connect, data)) => {
                self.connecting = Some(connect);
                Some(Action::Connect { cid, connect, data })
            }
            Err((st, result)) => {
                self.complete(cid, st, result, None, tx);
                None
            }
        }
    }
}

/// The C2HData PDUs of one read result: see [`TargetQueue::read_pdus`].
pub struct ReadPdus {
    cid: u16,
    len: usize,
    at: usize,
    max: usize,
    success: bool,
    digests: Digests,
}

impl Iterator for ReadPdus {
    type Item = (DataHeader, Range<usize>);
    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.len {
            return None;
        }
        let n = (self.len - self.at).min(self.max);
        let last = self.at + n == self.len;
        let h = DataPduHeader {
            cid: self.cid,
            ttag: 0,
            offset: self.at as u32,
            last,
            success: self.success && last,
        };
        let r = self.at..self.at + n;
        self.at += n;
        Some((DataHeader::new(false, &h, n as u32, self.digests), r))
    }
}

#[cfg(test)]
mod tests;
