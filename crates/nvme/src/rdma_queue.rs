//! NVMe over RDMA (NVMe/RDMA transport binding), without verbs: the RDMA
//! connection manager's private data, and one queue on the controller side
//! as a state machine ([`RdmaQueue`]): command capsules go in, the
//! transfers and responses to post come out.
//!
//! [`RdmaQueue`] is this transport's framing and data movement around the
//! [`FabricQueue`] core it shares with NVMe/TCP (Connect and its checks,
//! the login deadline, DH-HMAC-CHAP and the AUTH_REQUIRED gate, the
//! keep-alive, queue depth and command IDs, dispatch).
//!
//! The connection is the queue: its connect request carries the queue ID
//! and both queue sizes ([`cm::Request`], checked by [`cm::check_request`]
//! before the transport accepts), and the Connect must match them. Each
//! command capsule arrives in one RECV: the 64-byte SQE, then any
//! in-capsule data. Host memory is named by a keyed SGL descriptor
//! (address, length, key): data for the controller is fetched with RDMA
//! READ ([`Post::Read`], reported back with [`RdmaQueue::fetched`]), a
//! result goes out with RDMA WRITE before the 16-byte completion is SENT
//! ([`Post`], in order on the one queue pair, so the data is there when the
//! host sees the completion).
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
//! In-band authentication (DH-HMAC-CHAP) is the core's, as on NVMe/TCP (a
//! write's data is not fetched before the host has authenticated); Auth
//! Send comes out as [`Action::AuthSend`] for the transport's randomness
//! ([`RdmaQueue::auth_send`]).

use crate::auth::Entropy;
use crate::limits::{INCAPSULE_DATA, MAX_TRANSFER};
use crate::fabric_queue::{self, FabricError, FabricQueue, Refused, Setup, Wire};
use crate::fabrics::{self, fctype, CONNECT_DATA_LEN};
use crate::queue_entry::{Cqe, Keyed, Sqe};
use crate::Status;
use bytes::Bytes;
use std::collections::HashMap;
use std::time::Instant;

pub use crate::fabric_queue::Connected;

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
        if r.qid > crate::limits::MAX_IO_QUEUES {
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

/// Why a queue closed with an error: this transport's framing, or what
/// every fabric queue enforces.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RdmaQueueError {
    #[error("capsule of {0} bytes is shorter than a command")]
    ShortCapsule(usize),
    #[error("Connect for queue {connect} on a connection set up for queue {cm}")]
    QueueIdMismatch { connect: u16, cm: u16 },
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// What the transport must do next (see [`fabric_queue::Action`]): call
/// back [`RdmaQueue::connected`], [`RdmaQueue::complete`],
/// [`RdmaQueue::auth_send`] as each variant says.
pub type Action = fabric_queue::Action<RdmaQueueError>;

/// Work to post, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Post {
    /// RDMA READ command `cid`'s data from the host, then
    /// [`RdmaQueue::fetched`].
    Read { cid: u16, from: Keyed },
    /// RDMA WRITE a result into the host's buffer.
    Write { to: Keyed, data: Bytes },
    /// SEND a completion; with `invalidate`, SEND with Invalidate of the
    /// host's key (the host asked for it with the invalidate subtype).
    Send { cqe: [u8; Cqe::LEN], invalidate: Option<u32> },
}

pub struct RdmaQueue {
    core: FabricQueue,
    shape: Shape,
    /// Commands whose data is being fetched, by command ID.
    fetching: HashMap<u16, Sqe>,
    /// Where each command's result goes, by command ID.
    dest: HashMap<u16, Keyed>,
}

/// Completions as posts: the result's RDMA WRITE, then the SEND.
struct RdmaWire<'a> {
    dest: &'a mut HashMap<u16, Keyed>,
    out: &'a mut Vec<Post>,
}

impl Wire for RdmaWire<'_> {
    /// A result longer than the host's buffer fails the command instead.
    fn complete(&mut self, mut cqe: Cqe, data: Option<Bytes>) {
        let dest = self.dest.remove(&cqe.cid);
        if let Some(d) = data.filter(|d| !d.is_empty()) {
            // (A write's descriptor is not a destination: its commands return no data.)
            match dest {
                Some(to) if d.len() <= to.length as usize => self.out.push(Post::Write { to, data: d }),
                _ => cqe.status = Status::SGL_INVALID_DATA.dnr(),
            }
        }
        let invalidate = dest.filter(|k| k.invalidate).map(|k| k.key);
        self.send(cqe, invalidate);
    }

    fn refuse(&mut self, cqe: Cqe) {
        self.send(cqe, None);
    }
}

impl RdmaWire<'_> {
    fn send(&mut self, c: Cqe, invalidate: Option<u32>) {
        let mut cqe = [0u8; Cqe::LEN];
        c.write(&mut cqe);
        self.out.push(Post::Send { cqe, invalidate });
    }
}

impl RdmaQueue {
    /// A queue of `shape` (from [`cm::check_request`]) that must be
    /// connected by `login_deadline`.
    pub fn new(shape: Shape, login_deadline: Instant) -> RdmaQueue {
        let core = FabricQueue::new(Setup {
            transport: "nvme-rdma",
            qid: shape.qid,
            sq_entries: shape.sq_entries,
            login_deadline,
        });
        RdmaQueue { core, shape, fetching: HashMap::new(), dest: HashMap::new() }
    }

    fn wire<'a>(dest: &'a mut HashMap<u16, Keyed>, out: &'a mut Vec<Post>) -> RdmaWire<'a> {
        RdmaWire { dest, out }
    }

    /// Connected, and the host still has to authenticate before commands
    /// other than Auth Send/Receive and Disconnect run.
    pub fn awaiting_auth(&self) -> bool {
        self.core.awaiting_auth()
    }
    pub fn qid(&self) -> u16 {
        self.shape.qid
    }
    /// The controller this queue belongs to, once connected (for logs).
    pub fn cntlid(&self) -> u16 {
        self.core.cntlid()
    }
    pub fn shape(&self) -> Shape {
        self.shape
    }
    pub fn is_connected(&self) -> bool {
        self.core.is_connected()
    }
    pub fn is_closed(&self) -> bool {
        self.core.is_closed()
    }
    /// Commands received and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.core.outstanding()
    }

    /// One RECV's worth: a command capsule.
    pub fn capsule(&mut self, b: &[u8], now: Instant, out: &mut Vec<Post>) -> Option<Action> {
        if self.core.is_closed() {
            return None;
        }
        if b.len() < 64 {
            return self.core.close(Some(RdmaQueueError::ShortCapsule(b.len())));
        }
        let sqe = Sqe::from_slice(&b[..64]);
        let data = &b[64..];
        let cid = sqe.cid();
        if let Some(why) = self.core.out_of_turn(&sqe) {
            return self.core.close(Some(why.into()));
        }
        match self.core.admit(cid, now, &mut Self::wire(&mut self.dest, out)) {
            Ok(()) => {}
            Err(Refused::Answered) => return None,
            Err(Refused::Fatal(why)) => return self.core.close(Some(why.into())),
        }
        if !data.is_empty() {
            // (A RECV may be longer than the data: the length announced counts.)
            return match fabric_queue::incapsule_len(&sqe, data.len(), true) {
                Ok(len) => self.dispatch(sqe, Bytes::copy_from_slice(&data[..len]), out),
                Err(st) => self.fail(cid, st, out),
            };
        }
        let keyed = sqe.keyed_sgl();
        let len = keyed.map_or(0, |k| k.length);
        // No data: any descriptor of length 0 will do.
        if keyed.is_none() && sqe.sgl().length == 0 {
            return self.dispatch(sqe, Bytes::new(), out);
        }
        let Some(k) = keyed else {
            return self.fail(cid, Status::SGL_INVALID_TYPE.dnr(), out);
        };
        let is_connect = sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT;
        let max = if is_connect { CONNECT_DATA_LEN as u32 } else { MAX_TRANSFER };
        if len > max {
            return self.fail(cid, Status::INVALID_FIELD.dnr(), out);
        }
        if sqe.is_host_to_ctrl() && len > 0 {
            if let Err(st) = self.core.may_fetch(&sqe) {
                return self.fail(cid, st, out);
            }
            // (Kept for its key: the completion may invalidate it.)
            self.dest.insert(cid, k);
            self.fetching.insert(cid, sqe);
            out.push(Post::Read { cid, from: k });
            return None;
        }
        if len > 0 {
            self.dest.insert(cid, k);
        }
        self.dispatch(sqe, Bytes::new(), out)
    }

    /// The data of [`Post::Read`] arrived.
    pub fn fetched(&mut self, cid: u16, data: Bytes, out: &mut Vec<Post>) -> Option<Action> {
        let sqe = self.fetching.remove(&cid)?;
        self.dispatch(sqe, data, out)
    }

    /// The next instant [`RdmaQueue::handle_timeout`] must be called at.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.core.poll_timeout()
    }

    /// Time passed: enforce the login deadline and the keep-alive timeout.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Action> {
        self.core.handle_timeout(now)
    }

    /// The Connect of [`Action::Connect`] succeeded.
    pub fn connected(&mut self, cid: u16, c: Connected, now: Instant, out: &mut Vec<Post>) {
        self.core.connected(cid, c, now, &mut Self::wire(&mut self.dest, out));
    }

    /// The Connect of [`Action::Connect`] was refused.
    pub fn connect_refused(&mut self, cid: u16, status: Status, result: u64, out: &mut Vec<Post>) {
        self.core.connect_refused(cid, status, result, &mut Self::wire(&mut self.dest, out));
    }

    /// The [`Action::AuthSend`] with the randomness it needs.
    pub fn auth_send(&mut self, sqe: &Sqe, data: &[u8], entropy: Entropy, out: &mut Vec<Post>) -> Option<Action> {
        self.core.auth_send(sqe, data, entropy, &mut Self::wire(&mut self.dest, out))
    }

    /// A command finished: its result (if any) goes to the host's buffer,
    /// then its completion. A result longer than that buffer fails the
    /// command instead.
    pub fn complete(&mut self, cid: u16, status: Status, result: u64, data: Option<Bytes>, out: &mut Vec<Post>) {
        self.core.complete(cid, status, result, data, &mut Self::wire(&mut self.dest, out));
    }

    fn fail(&mut self, cid: u16, st: Status, out: &mut Vec<Post>) -> Option<Action> {
        self.core.fail(cid, st, &mut Self::wire(&mut self.dest, out))
    }

    /// A command whose data (if any) is here; a Connect must also match
    /// what the connection manager set up.
    fn dispatch(&mut self, sqe: Sqe, data: Bytes, out: &mut Vec<Post>) -> Option<Action> {
        let a = self.core.dispatch(sqe, data, &mut Self::wire(&mut self.dest, out));
        let Some(Action::Connect { cid, connect, .. }) = &a else {
            return a;
        };
        if connect.qid != self.shape.qid {
            let why = RdmaQueueError::QueueIdMismatch { connect: connect.qid, cm: self.shape.qid };
            return self.core.close(Some(why));
        }
        if connect.sqsize + 1 != self.shape.sq_entries {
            let (st, at) = (Status::CONNECT_INVALID_PARAM.dnr(), fabrics::ipo_sqe(fabrics::CS_SQSIZE));
            self.connect_refused(*cid, st, at, out);
            return None;
        }
        a
    }
}

#[cfg(test)]
mod tests;
