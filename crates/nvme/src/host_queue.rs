//! One NVMe/TCP queue on the host side (one TCP connection), without
//! sockets, in the style of quinn-proto.
//!
//! [`HostQueue`] gives each submitted command a free command ID, encodes
//! its capsule (data in the capsule when it fits, else kept until the
//! controller asks for it with R2T), answers R2Ts with H2CData split to the
//! controller's MAXH2CDATA, puts C2HData payloads into the command's own
//! buffer (or collects them when it has none), matches completions to
//! commands and hands them back with the caller's context `C`. Time is
//! passed in: a command that outlives its deadline kills the queue, as a
//! lost reply leaves no way to know which later replies are real.
//!
//! A transport feeds it received bytes ([`HostQueue::receive`], or for a
//! large C2HData payload [`HostQueue::begin_direct`] and
//! [`HostQueue::direct_fill`], which read from the socket straight into
//! the command's buffer), sends what [`HostQueue::poll_transmit`] gives
//! (the encoded headers, with the payloads the caller handed over gathered
//! in their places: see [`SEND_IN_PLACE_MIN`]), and delivers what
//! [`HostQueue::poll_completion`] gives.
//!
//! A cancelled command ([`HostQueue::cancel`]) keeps its ID until the
//! controller completes it, so a late reply is never taken for a newer
//! command; its data is read and dropped.

use crate::in_flight::{Entry, InFlight};
use crate::queue_entry::{sgl, Cqe, Sgl, Sqe};
use crate::pdu::{self, DataHeaderView, DataPdu, Digests, IcReq, Pdu, PduError};
use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Payloads the caller handed over ([`Payload::Owned`]: in a capsule or
/// in H2CData) at least this long are not copied into the send buffer: the
/// queue keeps a reference, which the transport sends from where it is,
/// gathered with the headers around it in one write (writev). The queue
/// owns the reference until the transport takes it, so a caller that gives
/// up on its command cannot pull the data from under a send. Copying the
/// 4 KiB of a write into the send buffer was 4.7% of the NVMe/TCP client's
/// samples at 4 KiB QD32 writes (docs/notes/2026-11-26-floor-4.md). Short
/// payloads (Dataset Management ranges, a few hundred bytes of admin data)
/// are still copied: a copy that size costs about what a reference and an
/// iovec entry more do (a threshold by judgement, not measured finely).
pub const SEND_IN_PLACE_MIN: usize = 1024;
/// Largest PDU we accept from a controller.
pub const MAX_PLEN: u32 = (8 << 20) + 256;

/// The caller's context for one command: how its result gets back, and
/// optionally the buffer its read data goes to.
pub trait Context {
    /// Where this command's C2HData goes, if the caller gave a buffer
    /// (exactly the transfer length). None: data is collected into
    /// [`Done::data`].
    fn read_buf(&mut self) -> Option<&mut [u8]>;
}

#[derive(Debug, Clone)]
pub struct HostConfig {
    pub qid: u16,
    pub digests: Digests,
    /// Commands in flight at once (command IDs 0..depth).
    pub depth: usize,
    /// How long a command may take.
    pub timeout: Duration,
    /// Largest in-capsule data the controller takes on this queue.
    pub incapsule: usize,
}

/// A finished command: completion entry and the data the controller sent
/// (`data` is empty when it went into the caller's buffer; `received`
/// counts it either way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    pub cqe: Cqe,
    pub data: Bytes,
    pub received: usize,
}

/// Errors that end the queue: the controller broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("malformed PDU from the controller: {0}")]
    Malformed(PduError),
    #[error("ICResp: {0}")]
    IcResp(String),
    #[error("PDU type {kind:#04x} for command {cid}, which is not in flight")]
    UnknownCommand { kind: u8, cid: u16 },
    #[error("C2HData for command {cid} at offset {offset}, expected {expected}")]
    DataOffset {
        cid: u16,
        offset: u32,
        expected: usize,
    },
    #[error("C2HData for command {cid} runs to byte {end}, past its {len}-byte transfer")]
    DataOverrun { cid: u16, end: usize, len: usize },
    #[error("C2HData for command {0} with SUCCESS but not LAST")]
    SuccessNotLast(u16),
    #[error("R2T for command {0}, which has no data to send")]
    R2tWithoutData(u16),
    #[error(
        "R2T for command {cid}: offset {offset} length {len} outside its {total}-byte transfer"
    )]
    R2tRange {
        cid: u16,
        offset: u32,
        len: u32,
        total: usize,
    },
    #[error("controller terminated the connection: FES {fes:#x} FEI {fei}")]
    Terminated { fes: u16, fei: u32 },
    #[error("unexpected PDU type {0:#04x} from the controller")]
    UnexpectedPdu(u8),
}

/// Why one command failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("queue closed: {0}")]
    Closed(String),
    #[error("command timed out")]
    Timeout,
    #[error("no free command id")]
    NoFreeCid,
    #[error("command {cid} completed with {got} of {want} bytes")]
    ShortData { cid: u16, got: usize, want: usize },
    #[error("{0}")]
    Protocol(ProtocolError),
}

/// Data a command sends to the controller.
pub enum Payload<'a> {
    None,
    Owned(Bytes),
    Borrowed(&'a [u8]),
}

impl Payload<'_> {
    fn bytes(&self) -> Option<&[u8]> {
        match self {
            Payload::None => None,
            Payload::Owned(b) => Some(b),
            Payload::Borrowed(s) => Some(s),
        }
    }
}

/// Identifies one submission (a command ID is reused; this is not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub cid: u16,
    seq: u64,
}

/// What the queue keeps for a command in flight, beside its context and
/// deadline.
struct Transfer {
    seq: u64,
    /// Bytes the controller is to send (the SGL length).
    expect: usize,
    received: usize,
    /// Data for a command without a buffer of its own.
    chunks: Vec<Bytes>,
    /// Data to send when the controller asks for it with R2T.
    write_data: Option<Bytes>,
}

type Slot<C> = Entry<C, Transfer>;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    AwaitIcResp,
    Live,
    Dead(String),
}

/// A C2HData payload being read straight into its command's buffer; see
/// [`HostQueue::begin_direct`].
#[derive(Debug)]
pub struct DirectRead {
    cid: u16,
    seq: u64,
    /// Offset in the command's transfer of the next byte.
    at: usize,
    left: usize,
    success: bool,
}

impl DirectRead {
    pub fn is_done(&self) -> bool {
        self.left == 0
    }
    /// Payload bytes still to come.
    pub fn left(&self) -> usize {
        self.left
    }
}

pub struct HostQueue<C> {
    cfg: HostConfig,
    phase: Phase,
    maxh2cdata: usize,
    in_flight: InFlight<C, Transfer>,
    next_seq: u64,
    /// Encoded PDUs not yet taken by the transport ...
    tx: Vec<u8>,
    /// ... and the payloads sent from where they are: each goes out after
    /// the first `.0` bytes of `tx` (in order of those offsets).
    tx_refs: Vec<(usize, Bytes)>,
    done: VecDeque<(C, Result<Done, HostError>)>,
    /// Where data of a cancelled command goes.
    scratch: Vec<u8>,
    /// Commands in flight that read at least [`LARGE_READ`] bytes.
    large_reads: usize,
    /// Commands (ID, submission) in the order they were sent (those
    /// answered are dropped from the front as plans meet them): the order
    /// a controller that serves them in turn answers in.
    sent: VecDeque<(u16, u64)>,
    /// The last [`HostQueue::plan_placed`]: command, submission and read
    /// length of each piece.
    plan: Vec<(u16, u64, usize)>,
    /// Payload bytes copied out of the transport's receive buffer into
    /// commands' buffers (for the log and the tests: planned reads and
    /// direct reads copy none).
    staged: u64,
}

/// Most pieces in one plan (two iovecs each, well within `IOV_MAX`).
pub const PLAN_MAX: usize = 64;

/// Reads this long or longer count as large (see [`HostQueue::large_reads`]).
pub const LARGE_READ: usize = 64 * 1024;

/// Whether `h` is the C2HData header a plan expects for command `cid`'s
/// `len`-byte read (`len` > 0, at most `MAX_PLEN - DATA_HLEN`; no digests):
/// the whole transfer in one PDU, no flag but LAST (set) and SUCCESS, the
/// payload right behind the header. `Some(success)` if it is. The checks
/// `pdu::peek_data_header` makes of any data header hold here by
/// construction (a test holds the two to the same answers), and the rest
/// are compares of fixed fields: the generic parse cost ~110 instructions
/// of a 4 KiB read's ~2,540 (callgrind, docs/notes/2026-11-27-h51z1-client.md).
fn placed_header_success(h: &[u8; pdu::DATA_HLEN], cid: u16, len: usize) -> Option<bool> {
    let le32 = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    let fl = h[1];
    let ok = h[0] == pdu::kind::C2H_DATA
        && fl & !(pdu::flags::DATA_LAST | pdu::flags::DATA_SUCCESS) == 0
        && fl & pdu::flags::DATA_LAST != 0
        && h[2] as usize == pdu::DATA_HLEN
        && h[3] as usize == pdu::DATA_HLEN
        && le32(4) as usize == pdu::DATA_HLEN + len
        && u16::from_le_bytes([h[8], h[9]]) == cid
        && le32(12) == 0
        && le32(16) as usize == len;
    ok.then_some(fl & pdu::flags::DATA_SUCCESS != 0)
}

impl<C: Context> HostQueue<C> {
    /// A new queue; its ICReq is ready to send.
    pub fn new(cfg: HostConfig) -> HostQueue<C> {
        let depth = cfg.depth.clamp(1, 65535);
        let mut tx = Vec::new();
        Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            digests: cfg.digests,
            maxr2t: 0,
        })
        .encode_into(Digests::default(), &mut tx);
        HostQueue {
            cfg,
            phase: Phase::AwaitIcResp,
            maxh2cdata: 0,
            in_flight: InFlight::new(depth),
            next_seq: 0,
            tx,
            tx_refs: Vec::new(),
            done: VecDeque::new(),
            scratch: Vec::new(),
            large_reads: 0,
            sent: VecDeque::new(),
            plan: Vec::new(),
            staged: 0,
        }
    }

    pub fn qid(&self) -> u16 {
        self.cfg.qid
    }
    /// The ICResp arrived and was acceptable.
    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Live
    }
    /// Why the queue died, once it has.
    pub fn dead(&self) -> Option<&str> {
        match &self.phase {
            Phase::Dead(why) => Some(why),
            _ => None,
        }
    }
    pub fn digests(&self) -> Digests {
        self.cfg.digests
    }
    pub fn set_incapsule(&mut self, n: usize) {
        self.cfg.incapsule = n;
    }
    /// Commands in flight (including cancelled ones not yet completed).
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Commands in flight that read [`LARGE_READ`] bytes or more: while
    /// there are none, the transport may read the socket in large chunks
    /// (no C2HData payload it would rather read straight into its buffer
    /// can be in them).
    pub fn large_reads(&self) -> usize {
        self.large_reads
    }

    /// Payload bytes copied out of the transport's receive buffer into
    /// commands' buffers so far.
    pub fn staged_bytes(&self) -> u64 {
        self.staged
    }

    /// Take command `cid` out of the queue (completed or timed out): `f`
    /// takes what it needs from the entry where it lies and may queue a
    /// result in `done`; then the entry is dropped and its ID freed. A
    /// completion comes once per I/O, and moving the whole entry (~130
    /// bytes) out of its slot first was a copy for nothing.
    fn remove_with(&mut self, cid: u16, f: impl FnOnce(&mut Slot<C>, &mut VecDeque<(C, Result<Done, HostError>)>)) {
        let (large_reads, done) = (&mut self.large_reads, &mut self.done);
        self.in_flight.remove_with(cid, |s| {
            if s.state.expect >= LARGE_READ {
                *large_reads -= 1;
            }
            f(s, done)
        });
    }

    /// Encode and queue one command. `in_len` bytes are expected back
    /// (into `ctx`'s buffer if it has one); `out` is sent in the capsule
    /// when it fits, else on R2T.
    pub fn submit(
        &mut self,
        mut sqe: Sqe,
        out: Payload<'_>,
        in_len: u32,
        ctx: C,
        now: Instant,
    ) -> Result<Ticket, (C, HostError)> {
        if let Phase::Dead(why) = &self.phase {
            return Err((ctx, HostError::Closed(why.clone())));
        }
        let len = out.bytes().map(<[u8]>::len);
        let in_capsule = len.is_some_and(|n| n <= self.cfg.incapsule);
        sqe.set_sgl(Sgl {
            addr: 0,
            length: len.map_or(in_len, |n| n as u32),
            kind: if in_capsule { sgl::INCAPSULE } else { sgl::TRANSPORT },
        });
        // An owned payload is moved to where it goes (a reference to send
        // from, the data kept for R2T), not cloned there and dropped with
        // `out`: a clone is an atomic increment now and a decrement later.
        let mut capsule: &[u8] = &[];
        let mut capsule_ref = None;
        // Owned but short: copied into the capsule.
        let mut small = None;
        let mut write_data = None;
        match out {
            Payload::None => {}
            Payload::Owned(b) if in_capsule && b.len() >= SEND_IN_PLACE_MIN => capsule_ref = Some(b),
            Payload::Owned(b) if in_capsule => small = Some(b),
            Payload::Borrowed(d) if in_capsule => capsule = d,
            Payload::Owned(b) => write_data = Some(b),
            Payload::Borrowed(d) => write_data = Some(Bytes::copy_from_slice(d)),
        }
        if let Some(b) = &small {
            capsule = &b[..];
        }
        let seq = self.next_seq;
        let expect = if len.is_some_and(|n| n > 0) {
            0
        } else {
            in_len as usize
        };
        let t = Transfer {
            seq,
            expect,
            received: 0,
            chunks: Vec::new(),
            write_data,
        };
        let cid = match self.in_flight.insert(ctx, now + self.cfg.timeout, t) {
            Ok(cid) => cid,
            Err(ctx) => return Err((ctx, HostError::NoFreeCid)),
        };
        self.next_seq += 1;
        if expect >= LARGE_READ {
            self.large_reads += 1;
        }
        sqe.set_cid(cid);
        self.sent.push_back((cid, seq));
        match capsule_ref {
            None => pdu::encode_capsule(&sqe, capsule, self.cfg.digests, &mut self.tx),
            Some(b) => {
                pdu::encode_capsule_head(&sqe, b.len(), self.cfg.digests, &mut self.tx);
                let dd = pdu::capsule_data_digest(&b, self.cfg.digests);
                self.tx_refs.push((self.tx.len(), b));
                if let Some(d) = dd {
                    self.tx.extend_from_slice(&d);
                }
            }
        }
        Ok(Ticket { cid, seq })
    }

    /// The caller gave up on a command: forget its buffer and context. Its
    /// ID stays taken until the controller completes it.
    pub fn cancel(&mut self, t: Ticket) {
        if let Some(s) = self.in_flight.get_mut(t.cid).filter(|s| s.state.seq == t.seq) {
            s.ctx = None;
        }
    }

    /// Something to send?
    pub fn has_transmit(&self) -> bool {
        !self.tx.is_empty() || !self.tx_refs.is_empty()
    }

    /// Hand over everything queued to send: the encoded bytes appended to
    /// `out`, and the payloads to send from where they are appended to
    /// `refs`, each with the length of `out` it follows (see
    /// [`SEND_IN_PLACE_MIN`]).
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>, refs: &mut Vec<(usize, Bytes)>) {
        let base = out.len();
        if base == 0 && refs.is_empty() {
            std::mem::swap(out, &mut self.tx);
            std::mem::swap(refs, &mut self.tx_refs);
            return;
        }
        out.extend_from_slice(&self.tx);
        self.tx.clear();
        refs.extend(self.tx_refs.drain(..).map(|(at, b)| (base + at, b)));
    }

    /// The next finished command (or one failed by the queue's end).
    pub fn poll_completion(&mut self) -> Option<(C, Result<Done, HostError>)> {
        self.done.pop_front()
    }

    /// The earliest deadline of a command in flight.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.in_flight.poll_timeout()
    }

    /// Time passed: a command past its deadline fails with a timeout and
    /// takes the queue down with it.
    pub fn handle_timeout(&mut self, now: Instant) {
        let late = self.in_flight.expired(now);
        if late.is_empty() {
            return;
        }
        for cid in late {
            self.remove_with(cid, |s, done| {
                if let Some(ctx) = s.ctx.take() {
                    done.push_back((ctx, Err(HostError::Timeout)));
                }
            });
        }
        self.fail_all("a command timed out");
    }

    /// The connection is gone: fail every command in flight.
    pub fn fail_all(&mut self, why: &str) {
        if !matches!(self.phase, Phase::Dead(_)) {
            self.phase = Phase::Dead(why.to_string());
        }
        let why = self.dead().unwrap_or(why).to_string();
        self.large_reads = 0;
        self.sent.clear();
        self.plan.clear();
        for ctx in self.in_flight.drain().filter_map(|s| s.ctx) {
            self.done
                .push_back((ctx, Err(HostError::Closed(why.clone()))));
        }
        self.tx.clear();
        self.tx_refs.clear();
    }

    fn die(&mut self, e: ProtocolError) -> Result<bool, ProtocolError> {
        self.fail_all(&e.to_string());
        Err(e)
    }

    /// Decode and handle at most one PDU from the front of `buf`. Ok(false):
    /// more bytes needed. An error has already failed every command.
    pub fn receive(&mut self, buf: &mut BytesMut) -> Result<bool, ProtocolError> {
        if self.dead().is_some() {
            return Ok(false);
        }
        let (digests, max) = match self.phase {
            Phase::AwaitIcResp => (Digests::default(), pdu::IC_LEN as u32),
            _ => (self.cfg.digests, MAX_PLEN),
        };
        let p = match pdu::decode(buf, digests, max) {
            Ok(Some(p)) => p,
            Ok(None) => return Ok(false),
            Err(e) => return self.die(ProtocolError::Malformed(e)),
        };
        match (&self.phase, p) {
            (Phase::AwaitIcResp, Pdu::IcResp(r)) => {
                let bad = if r.pfv != 0 || r.cpda != 0 {
                    Some(format!("unsupported pfv {} / cpda {}", r.pfv, r.cpda))
                } else if r.digests != self.cfg.digests {
                    Some(format!(
                        "digests {:?}, asked for {:?}",
                        r.digests, self.cfg.digests
                    ))
                } else if r.maxh2cdata < 4096 || r.maxh2cdata % 4 != 0 {
                    Some(format!("invalid MAXH2CDATA {}", r.maxh2cdata))
                } else {
                    None
                };
                if let Some(b) = bad {
                    return self.die(ProtocolError::IcResp(b));
                }
                self.maxh2cdata = r.maxh2cdata as usize;
                self.phase = Phase::Live;
            }
            (_, Pdu::C2HTermReq(t)) => {
                return self.die(ProtocolError::Terminated {
                    fes: t.fes,
                    fei: t.fei,
                })
            }
            (Phase::AwaitIcResp, p) => {
                return self.die(ProtocolError::IcResp(format!(
                    "expected ICResp, got PDU type {:#04x}",
                    p.kind()
                )))
            }
            (_, Pdu::CapsuleResp(cqe)) => {
                if self.slot(cqe.cid).is_none() {
                    return self.die(ProtocolError::UnknownCommand {
                        kind: pdu::kind::CAPSULE_RESP,
                        cid: cqe.cid,
                    });
                }
                self.finish(cqe);
            }
            (_, Pdu::C2HData(d)) => {
                if let Err(e) = self.c2h_data(d) {
                    return self.die(e);
                }
            }
            (_, Pdu::R2T(r)) => {
                if let Err(e) = self.r2t(r) {
                    return self.die(e);
                }
            }
            (_, other) => return self.die(ProtocolError::UnexpectedPdu(other.kind())),
        }
        Ok(true)
    }

    fn slot(&mut self, cid: u16) -> Option<&mut Slot<C>> {
        self.in_flight.get_mut(cid)
    }

    /// Check a data PDU against its command: in flight, at the next offset,
    /// within the transfer.
    fn check_data(&mut self, cid: u16, offset: u32, len: usize) -> Result<(), ProtocolError> {
        let Some(s) = self.slot(cid) else {
            return Err(ProtocolError::UnknownCommand {
                kind: pdu::kind::C2H_DATA,
                cid,
            });
        };
        if offset as usize != s.state.received {
            return Err(ProtocolError::DataOffset {
                cid,
                offset,
                expected: s.state.received,
            });
        }
        if s.state.received + len > s.state.expect {
            return Err(ProtocolError::DataOverrun {
                cid,
                end: s.state.received + len,
                len: s.state.expect,
            });
        }
        Ok(())
    }

    fn c2h_data(&mut self, d: DataPdu) -> Result<(), ProtocolError> {
        self.check_data(d.cid, d.offset, d.data.len())?;
        if d.success && !d.last {
            return Err(ProtocolError::SuccessNotLast(d.cid));
        }
        let Some(s) = self.in_flight.get_mut(d.cid) else {
            return Ok(());
        };
        let n = d.data.len();
        let has_ctx = s.ctx.is_some();
        match s.ctx.as_mut().and_then(|c| c.read_buf()) {
            Some(dst) if dst.len() >= s.state.received + n => {
                dst[s.state.received..s.state.received + n].copy_from_slice(&d.data);
                self.staged += n as u64;
            }
            Some(_) => {
                return Err(ProtocolError::DataOverrun {
                    cid: d.cid,
                    end: s.state.received + n,
                    len: s.state.expect,
                })
            }
            None if has_ctx => s.state.chunks.push(d.data),
            None => {}
        }
        s.state.received += n;
        if d.success {
            self.finish(Cqe {
                cid: d.cid,
                ..Default::default()
            });
        }
        Ok(())
    }

    /// If `buf` starts with the header of a C2HData PDU for a command with
    /// a buffer of its own, take the header, copy what of the payload is
    /// already in `buf` into place, and return the rest to read with
    /// [`HostQueue::direct_fill`]. Only without data digests (the digest
    /// needs the whole payload). Ok(None): not such a PDU, or its header is
    /// not complete yet.
    pub fn begin_direct(
        &mut self,
        buf: &mut BytesMut,
    ) -> Result<Option<DirectRead>, ProtocolError> {
        if self.phase != Phase::Live || self.cfg.digests.data {
            return Ok(None);
        }
        let v: DataHeaderView = match pdu::peek_data_header(buf, self.cfg.digests, MAX_PLEN) {
            Ok(Some(v)) if v.kind == pdu::kind::C2H_DATA => v,
            Ok(_) => return Ok(None),
            Err(e) => return self.die(ProtocolError::Malformed(e)).map(|_| None),
        };
        let cid = v.hdr.cid;
        let has_buf = self
            .slot(cid)
            .is_some_and(|s| s.ctx.as_mut().is_some_and(|c| c.read_buf().is_some()));
        if !has_buf {
            // Collected (or refused) through receive().
            return Ok(None);
        }
        if let Err(e) = self.check_data(cid, v.hdr.offset, v.data_len) {
            return self.die(e).map(|_| None);
        }
        if v.hdr.success && !v.hdr.last {
            return self.die(ProtocolError::SuccessNotLast(cid)).map(|_| None);
        }
        buf.advance(v.data_start);
        let seq = self.slot(cid).map_or(0, |s| s.state.seq);
        let mut d = DirectRead {
            cid,
            seq,
            at: v.hdr.offset as usize,
            left: v.data_len,
            success: v.hdr.success,
        };
        let have = buf.len().min(d.left);
        if have > 0 {
            // Copied from where it is, then dropped from `buf`: a
            // `split_to` made a second handle on the buffer (an atomic
            // count up and down per read, ~90 instructions of a 4 KiB
            // read's ~4,000; docs/notes/2026-11-26-floor-6.md).
            self.direct_fill(&mut d, |dst| {
                dst[..have].copy_from_slice(&buf[..have]);
                Ok::<usize, ()>(have)
            })
            .ok();
            self.staged += have as u64;
            buf.advance(have);
        }
        Ok(Some(d))
    }

    /// Let `read` fill the next part of a direct payload (the command's
    /// buffer, or scratch space if it was cancelled); it returns how many
    /// bytes it wrote. When the payload is complete and said SUCCESS, the
    /// command completes.
    pub fn direct_fill<E>(
        &mut self,
        d: &mut DirectRead,
        read: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<usize, E> {
        let (at, left) = (d.at, d.left);
        let slot = self
            .in_flight
            .get_mut(d.cid)
            .filter(|s| s.state.seq == d.seq);
        let dst = match slot.and_then(|s| s.ctx.as_mut()).and_then(|c| c.read_buf()) {
            Some(b) => &mut b[at..at + left],
            None => {
                self.scratch.resize(left.min(64 * 1024), 0);
                &mut self.scratch[..]
            }
        };
        let n = read(dst)?.min(left);
        d.at += n;
        d.left -= n;
        if let Some(s) = self
            .in_flight
            .get_mut(d.cid)
            .filter(|s| s.state.seq == d.seq)
        {
            s.state.received += n;
        }
        if d.left == 0 && d.success {
            self.finish(Cqe {
                cid: d.cid,
                ..Default::default()
            });
        }
        Ok(n)
    }

    /// Plan a socket read that puts C2HData payloads straight into their
    /// commands' buffers ahead of seeing their headers: the reads the
    /// controller answers next if it answers in the order the commands
    /// were sent (as ours does), each in one C2HData PDU (the whole
    /// transfer, LAST set) with nothing behind its payload. `take` gets
    /// each one's buffer (its whole read, in plan order) and may refuse
    /// it, which ends the plan, as does the first command that does not
    /// fit (a write, a command without a buffer of its own) and a large
    /// read (the plan's last piece: the rest of it is read with
    /// [`HostQueue::direct_fill`] as it comes). Returns the number of
    /// pieces: the transport reads, for piece `i`, a [`pdu::DATA_HLEN`]
    /// header (into a buffer of its own) and then `i`'s buffer, and hands
    /// each piece to [`HostQueue::receive_placed`]; what follows the pieces
    /// goes to [`HostQueue::receive`] as usual. None planned (0) unless the
    /// stream is at the start of a PDU, with no digests.
    pub fn plan_placed(&mut self, mut take: impl FnMut(&mut [u8]) -> bool) -> usize {
        self.plan.clear();
        if self.phase != Phase::Live || self.cfg.digests.header || self.cfg.digests.data {
            return 0;
        }
        // Answered commands leave the front; a long-lived one there (a
        // write waiting for R2T, say) must not let the queue grow without
        // bound behind it.
        while let Some(&(cid, seq)) = self.sent.front() {
            if self.in_flight.get_mut(cid).is_some_and(|s| s.state.seq == seq) {
                break;
            }
            self.sent.pop_front();
        }
        if self.sent.len() > 4 * PLAN_MAX.max(self.cfg.depth) {
            let f = &mut self.in_flight;
            self.sent.retain(|&(cid, seq)| f.get_mut(cid).is_some_and(|s| s.state.seq == seq));
        }
        for i in 0..self.sent.len() {
            if self.plan.len() == PLAN_MAX {
                break;
            }
            let (cid, seq) = self.sent[i];
            let Some(s) = self.in_flight.get_mut(cid).filter(|s| s.state.seq == seq) else {
                // Answered out of turn: not in the stream any more.
                continue;
            };
            let len = s.state.expect;
            if s.state.received != 0 || len == 0 || len > MAX_PLEN as usize - pdu::DATA_HLEN {
                break;
            }
            match s.ctx.as_mut().and_then(|c| c.read_buf()) {
                Some(b) if b.len() == len => {
                    if !take(b) {
                        break;
                    }
                    self.plan.push((cid, seq, len));
                }
                _ => break,
            }
            if len >= LARGE_READ {
                break;
            }
        }
        self.plan.len()
    }

    /// Piece `i` of the last plan arrived: its `header`, and `got` bytes
    /// of its payload read into the command's buffer (all of them, or the
    /// socket held no more). `Some`: it was the C2HData the plan expected,
    /// now taken (the command completed if it said SUCCESS and `got` is
    /// all of it), with the rest of its payload (if any) to read with
    /// [`HostQueue::direct_fill`]. `None`: it was not (another command's
    /// answer, another PDU, a split transfer), and nothing was taken: the
    /// stream from `header` on (the bytes read into the buffers included)
    /// goes to [`HostQueue::receive`].
    pub fn receive_placed(&mut self, i: usize, header: &[u8], got: usize) -> Option<DirectRead> {
        let &(cid, seq, len) = self.plan.get(i)?;
        let h: &[u8; pdu::DATA_HLEN] = header.get(..pdu::DATA_HLEN)?.try_into().ok()?;
        let success = placed_header_success(h, cid, len)?;
        if !self.in_flight.get_mut(cid).is_some_and(|s| s.state.seq == seq && s.state.received == 0) {
            return None;
        }
        let mut d = DirectRead {
            cid,
            seq,
            at: 0,
            left: len,
            success,
        };
        let got = got.min(len);
        // The bytes are in place already: only counted.
        let _ = self.direct_fill(&mut d, |_| Ok::<usize, ()>(got));
        Some(d)
    }

    fn r2t(&mut self, r: pdu::R2t) -> Result<(), ProtocolError> {
        let maxh2cdata = self.maxh2cdata.max(1);
        let digests = self.cfg.digests;
        let Some(s) = self.slot(r.cid) else {
            return Err(ProtocolError::UnknownCommand {
                kind: pdu::kind::R2T,
                cid: r.cid,
            });
        };
        let Some(data) = s.state.write_data.clone() else {
            return Err(ProtocolError::R2tWithoutData(r.cid));
        };
        let (off, len) = (r.offset as usize, r.length as usize);
        if len == 0 || off + len > data.len() {
            return Err(ProtocolError::R2tRange {
                cid: r.cid,
                offset: r.offset,
                len: r.length,
                total: data.len(),
            });
        }
        // One R2T may ask for more than one H2CData PDU may carry.
        let mut sent = 0;
        while sent < len {
            let n = (len - sent).min(maxh2cdata);
            let p = DataPdu {
                cid: r.cid,
                ttag: r.ttag,
                offset: (off + sent) as u32,
                last: sent + n == len,
                success: false,
                data: data.slice(off + sent..off + sent + n),
            };
            if n < SEND_IN_PLACE_MIN {
                Pdu::H2CData(p).encode_into(digests, &mut self.tx);
            } else {
                let e = Pdu::H2CData(p).encode_parts(digests);
                self.tx.extend_from_slice(&e.head);
                self.tx_refs.push((self.tx.len(), e.data));
                if let Some(dd) = e.ddgst {
                    self.tx.extend_from_slice(&dd);
                }
            }
            sent += n;
        }
        Ok(())
    }

    /// The command's completion: free its ID, hand back its result.
    fn finish(&mut self, cqe: Cqe) {
        self.remove_with(cqe.cid, |s, done| {
            let st = &mut s.state;
            let Some(mut ctx) = s.ctx.take() else { return };
            let r = if cqe.status.is_success() && st.received < st.expect {
                Err(HostError::ShortData {
                    cid: cqe.cid,
                    got: st.received,
                    want: st.expect,
                })
            } else {
                let data = if ctx.read_buf().is_some() || st.chunks.is_empty() {
                    Bytes::new()
                } else if st.chunks.len() == 1 {
                    st.chunks.pop().unwrap_or_default()
                } else {
                    let mut all = BytesMut::with_capacity(st.received);
                    for c in &st.chunks {
                        all.extend_from_slice(c);
                    }
                    all.freeze()
                };
                Ok(Done {
                    cqe,
                    data,
                    received: st.received,
                })
            };
            done.push_back((ctx, r));
        });
    }
}

#[cfg(test)]
mod tests;
