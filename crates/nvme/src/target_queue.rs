//! One NVMe/TCP queue on the controller side (one TCP connection, admin or
//! I/O), without sockets, in the style of quinn-proto: bytes and time go
//! in, encoded PDUs and [`Action`]s come out.
//!
//! [`TargetQueue`] is NVMe/TCP's framing and data movement around the
//! [`FabricQueue`] core that NVMe/RDMA's queue shares (Connect and its
//! checks, the login deadline, DH-HMAC-CHAP and the AUTH_REQUIRED gate,
//! the keep-alive, queue depth and command IDs, dispatch). Here: it frames
//! what the host sends ([`TargetQueue::receive`]), answers the ICReq,
//! checks every capsule's SGL and in-capsule data, asks for write data
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
//! login (see [`crate::fabric_queue`]): Auth Send comes out as
//! [`Action::AuthSend`] because it needs fresh randomness ([`Entropy`]),
//! which the transport draws and passes back in [`TargetQueue::auth_send`].
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

use crate::auth::Entropy;
use crate::limits::{INCAPSULE_DATA, MAX_TRANSFER};
use crate::fabric_queue::{self, FabricError, FabricQueue, Refused, Setup, Wire};
use crate::fabrics::{CATTR_DISABLE_SQFLOW, CONNECT_DATA_LEN};
use crate::pdu::{
    self, fes, DataHeader, DataPdu, DataPduHeader, Digests, IcResp, Pdu, PduError, R2t,
    TermReq,
};
use crate::queue_entry::{sgl, Cqe, Sqe};
use crate::Status;
use bytes::{Bytes, BytesMut};
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::time::Instant;

pub use crate::fabric_queue::Connected;

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

/// Why a queue closed with an error: NVMe/TCP's framing, or what every
/// fabric queue enforces.
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
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// What the transport must do next (see [`fabric_queue::Action`]): call
/// back [`TargetQueue::connected`], [`TargetQueue::complete`],
/// [`TargetQueue::auth_send`] as each variant says.
pub type Action = fabric_queue::Action<QueueError>;

/// Outcome of [`TargetQueue::receive`].
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// No complete PDU buffered.
    NeedMore,
    /// One PDU handled, with what it asks the transport to do.
    Pdu(Option<Action>),
}

/// A write (or other host-to-controller command) waiting for its data.
struct Pending {
    sqe: Sqe,
    chunks: Vec<Bytes>,
    received: usize,
    total: usize,
}

pub struct TargetQueue {
    core: FabricQueue,
    tcp: Tcp,
}

/// NVMe/TCP's own state: the ICReq's outcome, SQ flow control, and the
/// write data asked for with R2T.
struct Tcp {
    cfg: QueueConfig,
    /// The ICReq was answered: capsules may come.
    ic_done: bool,
    digests: Digests,
    sqflow_disabled: bool,
    /// Writes receiving data, by transfer tag (= command ID).
    pending: HashMap<u16, Pending>,
    /// Writes waiting for R2T budget, in arrival order.
    waiting: VecDeque<Sqe>,
    /// Write bytes asked for and not yet completed, per command.
    granted: HashMap<u16, usize>,
    granted_bytes: usize,
}

/// Completions as PDUs into the send buffer `tx`.
struct TcpWire<'a> {
    tcp: &'a mut Tcp,
    tx: &'a mut Vec<u8>,
    /// The result's C2HData went out already ([`TargetQueue::read_sent`]).
    data_sent: bool,
}

impl Wire for TcpWire<'_> {
    /// With SQ flow control disabled a successful command with data
    /// completes with the last C2HData alone.
    fn complete(&mut self, cqe: Cqe, data: Option<Bytes>) {
        let success = self.tcp.sqflow_disabled && cqe.status.is_success();
        let mut resp = !(self.data_sent && success);
        if let Some(d) = data.filter(|d| !d.is_empty()) {
            resp = !success;
            let max = self.tcp.cfg.max_c2h_data.max(1) as usize;
            let mut at = 0;
            while at < d.len() {
                let n = (d.len() - at).min(max);
                let last = at + n == d.len();
                let p = DataPdu {
                    cid: cqe.cid,
                    ttag: 0,
                    offset: at as u32,
                    last,
                    success: success && last,
                    data: d.slice(at..at + n),
                };
                Pdu::C2HData(p).encode_into(self.tcp.digests, self.tx);
                at += n;
            }
        }
        if resp {
            self.refuse(cqe);
        }
        // Only writes given R2Ts are in `granted`: with in-capsule writes
        // and reads it is empty, and a lookup would still hash the CID
        // (SipHash, ~120 instructions per command).
        if self.tcp.granted.is_empty() {
            return;
        }
        if let Some(n) = self.tcp.granted.remove(&cqe.cid) {
            self.tcp.granted_bytes -= n;
            self.tcp.issue_r2ts(self.tx);
        }
    }

    fn refuse(&mut self, cqe: Cqe) {
        pdu::encode_capsule_resp(&cqe, self.tcp.digests, self.tx);
    }
}

impl Tcp {
    fn wire<'a>(&'a mut self, tx: &'a mut Vec<u8>) -> TcpWire<'a> {
        TcpWire { tcp: self, tx, data_sent: false }
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
}

impl TargetQueue {
    pub fn new(cfg: QueueConfig) -> TargetQueue {
        let core = FabricQueue::new(Setup {
            transport: "nvme",
            qid: 0,
            // Before Connect the queue has one entry: the Connect.
            sq_entries: 1,
            login_deadline: cfg.login_deadline,
        });
        let tcp = Tcp {
            cfg,
            ic_done: false,
            digests: Digests::default(),
            sqflow_disabled: false,
            pending: HashMap::new(),
            waiting: VecDeque::new(),
            granted: HashMap::new(),
            granted_bytes: 0,
        };
        TargetQueue { core, tcp }
    }

    /// Queue ID, once connected (0 before).
    pub fn qid(&self) -> u16 {
        self.core.qid()
    }
    pub fn is_connected(&self) -> bool {
        self.core.is_connected()
    }
    pub fn is_closed(&self) -> bool {
        self.core.is_closed()
    }
    /// Connected, and the host still has to authenticate before commands
    /// other than Auth Send/Receive and Disconnect run.
    pub fn awaiting_auth(&self) -> bool {
        self.core.awaiting_auth()
    }
    /// Digests negotiated by the ICReq (none before).
    pub fn digests(&self) -> Digests {
        self.tcp.digests
    }
    /// Commands received and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.core.outstanding()
    }
    /// Write data asked for with R2T and not yet completed, bytes.
    pub fn granted_bytes(&self) -> usize {
        self.tcp.granted_bytes
    }
    /// Largest PDU the host may send now: a framing reader refuses longer
    /// ones from their header.
    pub fn max_pdu_len(&self) -> u32 {
        if !self.tcp.ic_done {
            pdu::IC_LEN as u32
        } else if !self.core.is_connected() && !self.core.is_closed() {
            // A Connect capsule with its data, or the H2CData carrying it.
            (pdu::CMD_HLEN + 2 * pdu::DIGEST_LEN + CONNECT_DATA_LEN) as u32
        } else {
            self.tcp.cfg.maxh2cdata.max(INCAPSULE_DATA) + 256
        }
    }

    /// Decode and handle at most one PDU from the front of `buf`.
    pub fn receive(&mut self, buf: &mut BytesMut, now: Instant, tx: &mut Vec<u8>) -> Received {
        if self.core.is_closed() {
            return Received::NeedMore;
        }
        let f = match pdu::frame(buf, self.tcp.digests, self.max_pdu_len()) {
            Ok(Some(f)) => f,
            Ok(None) => return Received::NeedMore,
            Err(e) => return self.malformed(e, buf, now, tx),
        };
        // A command, the host's common PDU, read where it lies: building
        // the generic `Pdu` and matching it again in `handle_pdu` cost 84
        // instructions per 4 KiB read, 117 per write
        // (docs/notes/2026-11-28-h51zd-nvme-decode.md).
        if self.tcp.ic_done {
            if let Some(sqe) = f.sqe() {
                let data = f.take();
                return Received::Pdu(self.capsule(sqe, data, now, tx));
            }
        }
        match f.into_pdu() {
            Ok(p) => Received::Pdu(self.handle_pdu(p, now, tx)),
            Err(e) => self.malformed(e, buf, now, tx),
        }
    }

    /// [`TargetQueue::handle_bad_pdu`] for a PDU that failed to decode,
    /// quoting what follows it in `buf`.
    fn malformed(&mut self, e: PduError, buf: &BytesMut, now: Instant, tx: &mut Vec<u8>) -> Received {
        let head = buf[..buf.len().min(pdu::TERM_MAX_DATA)].to_vec();
        Received::Pdu(self.handle_bad_pdu(e, &head, now, tx))
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
            } => match self.core.admit(cid, now, &mut self.tcp.wire(tx)) {
                Err(refused) => self.refused(refused, tx),
                Ok(()) => self.fail(cid, Status::TRANSIENT_TRANSPORT, tx),
            },
            // Which bytes of which transfer were bad cannot be trusted.
            PduError::DataDigest { .. } => self.core.close(Some(QueueError::Malformed(e))),
            e => {
                let fes = e.fes().unwrap_or(fes::INVALID_HEADER_FIELD);
                let fei = e.fei();
                self.fatal(fes, fei, head, QueueError::Malformed(e), tx)
            }
        }
    }

    /// A decoded PDU from the host.
    pub fn handle_pdu(&mut self, p: Pdu, now: Instant, tx: &mut Vec<u8>) -> Option<Action> {
        if self.core.is_closed() {
            return None;
        }
        if !self.tcp.ic_done {
            let Pdu::IcReq(r) = p else {
                let why = QueueError::NotIcReq(p.kind());
                return self.fatal(fes::PDU_SEQUENCE_ERROR, 0, &[p.kind()], why, tx);
            };
            if r.pfv != 0 {
                let why = QueueError::UnsupportedIcReq("PDU format version");
                return self.fatal(fes::UNSUPPORTED_PARAMETER, 8, &[], why, tx);
            }
            if r.hpda != 0 {
                let why = QueueError::UnsupportedIcReq("host PDU data alignment");
                return self.fatal(fes::UNSUPPORTED_PARAMETER, 10, &[], why, tx);
            }
            Pdu::IcResp(IcResp {
                pfv: 0,
                cpda: 0,
                digests: r.digests,
                maxh2cdata: self.tcp.cfg.maxh2cdata,
            })
            .encode_into(Digests::default(), tx);
            self.tcp.digests = r.digests;
            self.tcp.ic_done = true;
            return None;
        }
        match p {
            Pdu::CapsuleCmd(c) => self.capsule(c.sqe, c.data, now, tx),
            Pdu::H2CData(h) => self.h2c_data(h, tx),
            Pdu::H2CTermReq(t) => self.core.close(Some(QueueError::HostTerminated {
                fes: t.fes,
                fei: t.fei,
            })),
            other => self.fatal(
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
        self.core.poll_timeout()
    }

    /// Time passed: enforce the login deadline and the keep-alive timeout.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Action> {
        self.core.handle_timeout(now)
    }

    /// The Connect of [`Action::Connect`] succeeded: the queue is bound
    /// (and, with `c.auth`, waits for the host to authenticate).
    pub fn connected(&mut self, cid: u16, c: Connected, now: Instant, tx: &mut Vec<u8>) {
        self.core.connected(cid, c, now, &mut self.tcp.wire(tx));
        if let Some(c) = self.core.connect().filter(|_| self.core.is_connected()) {
            self.tcp.sqflow_disabled = c.cattr & CATTR_DISABLE_SQFLOW != 0;
        }
    }

    /// The Connect of [`Action::Connect`] was refused.
    pub fn connect_refused(&mut self, cid: u16, status: Status, result: u64, tx: &mut Vec<u8>) {
        self.core.connect_refused(cid, status, result, &mut self.tcp.wire(tx));
    }

    /// The [`Action::AuthSend`] with the randomness it needs.
    pub fn auth_send(
        &mut self,
        sqe: &Sqe,
        data: &[u8],
        entropy: Entropy,
        tx: &mut Vec<u8>,
    ) -> Option<Action> {
        self.core.auth_send(sqe, data, entropy, &mut self.tcp.wire(tx))
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
        self.core.complete(cid, status, result, data, &mut self.tcp.wire(tx));
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
            max: self.tcp.cfg.max_c2h_data.max(1) as usize,
            success: self.tcp.sqflow_disabled,
            digests: self.tcp.digests,
        }
    }

    /// The payload of [`TargetQueue::read_pdus`] was queued: complete the
    /// command (a CapsuleResp, unless the last C2HData said SUCCESS).
    pub fn read_sent(&mut self, cid: u16, tx: &mut Vec<u8>) {
        let mut w = self.tcp.wire(tx);
        w.data_sent = true;
        self.core.complete(cid, Status::SUCCESS, 0, None, &mut w);
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
        self.core.close(Some(why))
    }

    fn fail(&mut self, cid: u16, st: Status, tx: &mut Vec<u8>) -> Option<Action> {
        self.core.fail(cid, st, &mut self.tcp.wire(tx))
    }

    /// A capsule the core did not take.
    fn refused(&mut self, r: Refused, tx: &mut Vec<u8>) -> Option<Action> {
        match r {
            Refused::Answered => None,
            Refused::Fatal(why) => self.fatal(fes::PDU_SEQUENCE_ERROR, 0, &[], why.into(), tx),
        }
    }

    /// A command arrived: account for it, collect its data, run it.
    fn capsule(&mut self, sqe: Sqe, data: Bytes, now: Instant, tx: &mut Vec<u8>) -> Option<Action> {
        let cid = sqe.cid();
        let s = sqe.sgl();
        if let Some(why) = self.core.out_of_turn(&sqe) {
            return self.fatal(fes::PDU_SEQUENCE_ERROR, 0, &[], why.into(), tx);
        }
        if !self.core.is_connected() && s.length as usize > CONNECT_DATA_LEN {
            let why = FabricError::NotConnected("Connect data longer than 1024 bytes");
            return self.fatal(fes::PDU_SEQUENCE_ERROR, 0, &[], why.into(), tx);
        }
        if let Err(r) = self.core.admit(cid, now, &mut self.tcp.wire(tx)) {
            return self.refused(r, tx);
        }
        if !data.is_empty() {
            if let Err(st) = fabric_queue::incapsule_len(&sqe, data.len(), false) {
                return self.fail(cid, st, tx);
            }
            return self.core.dispatch(sqe, data, &mut self.tcp.wire(tx));
        }
        if sqe.is_host_to_ctrl() && s.length > 0 {
            // Data comes later in H2CData PDUs, asked for with one R2T.
            if s.kind != sgl::TRANSPORT {
                return self.fail(cid, Status::SGL_INVALID_TYPE.dnr(), tx);
            }
            if s.length > MAX_TRANSFER {
                return self.fail(cid, Status::INVALID_FIELD.dnr(), tx);
            }
            if let Err(st) = self.core.may_fetch(&sqe) {
                return self.fail(cid, st, tx);
            }
            self.tcp.waiting.push_back(sqe);
            self.tcp.issue_r2ts(tx);
            return None;
        }
        self.core.dispatch(sqe, Bytes::new(), &mut self.tcp.wire(tx))
    }

    fn h2c_data(&mut self, h: DataPdu, tx: &mut Vec<u8>) -> Option<Action> {
        // (Before Connect the only transfer asked for is the Connect's.)
        let problem = match self.tcp.pending.get(&h.ttag) {
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
            Some(_) if h.data.len() > self.tcp.cfg.maxh2cdata as usize => Some((
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
        let p = self.tcp.pending.get_mut(&h.ttag)?;
        p.received += h.data.len();
        p.chunks.push(h.data);
        if p.received < p.total {
            return None;
        }
        let p = self.tcp.pending.remove(&h.ttag)?;
        let data = if p.chunks.len() == 1 {
            p.chunks.into_iter().next().unwrap_or_default()
        } else {
            let mut all = BytesMut::with_capacity(p.total);
            for c in p.chunks {
                all.extend_from_slice(&c);
            }
            all.freeze()
        };
        self.core.dispatch(p.sqe, data, &mut self.tcp.wire(tx))
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
