//! The initiator side of a logged-in iSCSI session (one connection),
//! without sockets, in the style of the NVMe/TCP host queue
//! (`bw_nvme::host_queue`): commands in, with the caller's context `C`;
//! bytes received in; bytes to send and finished commands out; the time
//! passed in.
//!
//! It keeps the CmdSN window (commands wait inside it until MaxCmdSN
//! allows them), gives each command an ITT (a slot of its own, so nothing
//! is hashed or allocated per command once the slots exist), encodes the
//! commands with their immediate and unsolicited data straight into one
//! send buffer (so a burst of commands leaves in one write), answers R2Ts
//! with Data-Out and NOP-In pings with NOP-Out, puts Data-In into the
//! caller's own buffer (read straight from the socket with
//! [`InitiatorSession::direct_fill`] where the transport can, and small
//! ones, a batch at a time, with [`InitiatorSession::plan_placed`]: no
//! staging copy), and times commands out.
//!
//! A command the caller gave up on ([`InitiatorSession::cancel`], or a
//! timeout) keeps its ITT until the target answers, so a late answer is
//! never taken for a newer command; its data is read and dropped.
//!
//! Data-In must come in order (DataPDUInOrder and DataSequenceInOrder are
//! Yes: we offer Yes and the result is the OR of both sides): each PDU
//! continues where the last one ended, so a caller's buffer is filled
//! whole or the command fails, never left with holes.

use crate::msg::*;
use crate::negotiate::SessionParams;
use crate::pdu::{self, Bhs, Decoder, Digests, Header, Opcode, RESERVED_TAG};
use crate::target_session::sn_lt;
use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Data segments at least this long, of data the caller handed over
/// ([`Payload::Owned`]), go to the transport to be written from where they
/// are, gathered with the headers around them in one writev, instead of
/// being copied into the send buffer: as NVMe/TCP's host queue
/// (`bw_nvme::host_queue::SEND_IN_PLACE_MIN`, the same judgement for short
/// payloads). At 64 KiB, a 4 KiB write's immediate data was copied: ~410 of
/// the client's ~3,880 instructions per 4 KiB QD32 write (callgrind,
/// docs/notes/2026-11-27-h51q-client-writes.md).
pub const WRITE_DIRECT_MIN: usize = 1024;

/// Most slots (commands in flight, given up ones included): ITTs are the
/// slot in the low 16 bits and a generation in the high 16, and never
/// [`RESERVED_TAG`] or our Logout Request's.
const MAX_SLOTS: usize = 0xFFFE;

/// The caller's context for one command.
pub trait Context {
    /// Where this command's Data-In goes, if the caller gave a buffer
    /// (exactly the read length). None: the data is collected into
    /// [`Completion::data`].
    fn read_buf(&mut self) -> Option<&mut [u8]>;
}

/// Data a command sends to the target.
#[derive(Clone)]
pub enum Payload<'a> {
    None,
    /// Kept, not copied, until sent (large segments go out from where they
    /// are, see [`WRITE_DIRECT_MIN`]).
    Owned(Bytes),
    /// Copied into the send buffer at once (and into a buffer of its own
    /// only if the target is to ask for part of it with R2T).
    Borrowed(&'a [u8]),
}

impl Payload<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Payload::None => &[],
            Payload::Owned(b) => b,
            Payload::Borrowed(s) => s,
        }
    }
    fn to_owned_range(&self, r: std::ops::Range<usize>) -> Bytes {
        match self {
            Payload::Owned(b) => b.slice(r),
            _ => Bytes::copy_from_slice(&self.bytes()[r]),
        }
    }
}

/// One SCSI command to run.
pub struct Command<'a> {
    /// The 8-byte LUN field (`bw_scsi::encode_lun`).
    pub lun: u64,
    pub cdb: [u8; 16],
    /// Bytes of Data-In expected (reads).
    pub read_len: usize,
    /// Data-Out (writes).
    pub write: Payload<'a>,
}

/// A command the target completed (any SCSI status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub status: u8,
    pub sense: Bytes,
    /// The Data-In of a command without a buffer of its own, `read_len`
    /// bytes (zeros past what the target sent); empty otherwise.
    pub data: Vec<u8>,
    /// Bytes of Data-In the target sent.
    pub received: usize,
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
    #[error("GOOD status after {got} of {want} bytes of Data-In")]
    ShortData { got: usize, want: usize },
    #[error("no free task tag")]
    NoFreeTag,
    #[error("{0}")]
    Disconnected(String),
}

/// A violation that ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConnectionError(pub String);

fn violation(s: impl Into<String>) -> ConnectionError {
    ConnectionError(s.into())
}

/// Identifies one submission (a slot is reused; a ticket is not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub itt: u32,
}

/// What one call to [`InitiatorSession::receive`] found.
#[derive(Debug)]
pub enum Received {
    /// No whole PDU header at the front of the buffer.
    NeedMore,
    /// A PDU was handled.
    Pdu,
    /// A Data-In PDU for a command with a buffer of its own: its header is
    /// taken and what of its data was in the buffer is in place; the rest
    /// (see [`DirectRead::left`]) is to be read with
    /// [`InitiatorSession::direct_fill`].
    Direct(DirectRead),
}

/// The Data-In status fields that apply once a direct payload is complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DataInStatus {
    status: u8,
    stat_sn: u32,
}

/// A Data-In payload being read straight into its command's buffer.
#[derive(Debug)]
pub struct DirectRead {
    itt: u32,
    /// Offset in the command's transfer of the next byte.
    at: usize,
    left: usize,
    /// Padding and digest behind the payload, dropped from the stream.
    trailer: usize,
    status: Option<DataInStatus>,
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

/// A command not sent yet (the CmdSN window was closed).
struct Unsent {
    cdb: [u8; 16],
    write: Bytes,
}

struct Task<C> {
    /// None once the caller gave up (the task stays until the target
    /// answers, or is forgotten if it was never sent).
    ctx: Option<C>,
    itt: u32,
    lun: u64,
    deadline: Instant,
    read_len: usize,
    /// Bytes of Data-In so far (they arrive in order).
    received: usize,
    /// Data-In of a command without a buffer of its own.
    collected: Vec<u8>,
    /// Write data the target may still ask for with R2T: bytes from
    /// `write_from` on.
    write: Bytes,
    write_from: usize,
    write_len: usize,
    /// Boxed: a command waits for the window rarely, and every task is
    /// moved into its slot (a smaller task is a shorter copy per command).
    unsent: Option<Box<Unsent>>,
}

pub struct InitiatorSession<C> {
    params: SessionParams,
    digests: Digests,
    dec: Decoder,
    timeout: Duration,
    cmd_sn: u32,
    max_cmd_sn: u32,
    exp_stat_sn: u32,
    slots: Vec<Option<Task<C>>>,
    /// Free slots, the lowest last.
    free: Vec<u16>,
    generation: u16,
    /// Commands outside the CmdSN window, by ITT, in submission order.
    waiting: VecDeque<u32>,
    /// Encoded PDUs not yet taken by the transport.
    tx: Vec<u8>,
    /// Payloads to send from where they are, each with the length of `tx`
    /// it follows (see [`WRITE_DIRECT_MIN`]).
    tx_refs: Vec<(usize, Bytes)>,
    done: VecDeque<(C, Result<Completion, TaskError>)>,
    /// Bytes of the stream to drop (a direct payload's padding and digest).
    skip: usize,
    /// Where data of a command given up on goes.
    scratch: Vec<u8>,
    logged_out: bool,
    dead: Option<String>,
    /// Commands in flight that read at least [`LARGE_READ`] bytes.
    large_reads: usize,
    /// ITTs in the order their commands were sent (those answered are
    /// dropped from the front as plans meet them): the order a target
    /// that answers in turn sends their Data-In.
    sent: VecDeque<u32>,
    /// The last [`InitiatorSession::plan_placed`]: ITT and read length of
    /// each Data-In the transport reads ahead of its header.
    plan: Vec<(u32, usize)>,
    /// Bytes of Data-In copied out of the receive buffer (rather than
    /// read straight into place).
    staged_bytes: u64,
}

/// Most pieces in one plan (two iovecs each, well within `IOV_MAX`).
pub const PLAN_MAX: usize = 64;

/// Reads this long or longer count as large (see
/// [`InitiatorSession::large_reads`]).
pub const LARGE_READ: usize = 64 * 1024;

/// ITT of our Logout Request (never a command's).
const LOGOUT_ITT: u32 = RESERVED_TAG - 1;

/// What [`InitiatorSession::receive_placed`] takes from a planned piece's
/// header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PlacedDataIn {
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    status: Option<DataInStatus>,
}

/// If `h` is the Data-In a plan expects for task `itt`'s `len`-byte read
/// (no AHS, the whole read from offset 0; no digests, or there is no
/// plan, and `len` is within what we declared we take: no more to check
/// than the Decoder would), the fields the session takes from it. Read
/// straight from the bytes: copying the header into a `Bhs` and decoding
/// every Data-In field (`DataIn::from_bhs`) cost ~60 instructions of an
/// iSCSI 4 KiB read's ~2,490 (callgrind,
/// docs/notes/2026-11-27-h51z1-client.md); a test holds the answers to the
/// generic decoding's.
fn placed_data_in(h: &[u8; pdu::BHS_LEN], itt: u32, len: usize) -> Option<PlacedDataIn> {
    let be32 = |at: usize| u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    // Byte 0: opcode (low 6 bits); byte 4: TotalAHSLength; 5..8:
    // DataSegmentLength; ITT at 16; BufferOffset at 40.
    let ok = h[0] & 0x3f == Opcode::DataIn as u8
        && h[4] == 0
        && (be32(4) & 0x00FF_FFFF) as usize == len
        && be32(16) == itt
        && be32(40) == 0;
    if !ok {
        return None;
    }
    // S bit (byte 1, 0x01): Status (byte 3) and StatSN (24) are reserved
    // unless it is set (RFC 7143 11.7.4).
    let status = (h[1] & 0x01 != 0).then(|| DataInStatus { status: h[3], stat_sn: be32(24) });
    Some(PlacedDataIn { exp_cmd_sn: be32(28), max_cmd_sn: be32(32), status })
}

/// The BHS of a SCSI Command (RFC 7143 11.3) with a `data_len`-byte data
/// segment and no AHS, written field by field into one array: the same
/// bytes as `Message::ScsiCommand(c).encode()` with the length set by
/// `pdu::encode_head_into` (a test holds them equal), for a fraction of
/// the instructions. Through the generic path (a `Bhs` built by the
/// `header!` list, copied into the send buffer, then its lengths set) the
/// command header cost ~125 instructions of an iSCSI 4 KiB read's ~2,490
/// (callgrind, docs/notes/2026-11-27-h51z1-client.md).
fn scsi_command_bhs(c: &ScsiCommand, data_len: usize) -> [u8; pdu::BHS_LEN] {
    let mut b = [0u8; pdu::BHS_LEN];
    b[0] = Opcode::ScsiCommand as u8 | if c.immediate { 0x40 } else { 0 };
    b[1] = (c.final_ as u8) << 7 | (c.read as u8) << 6 | (c.write as u8) << 5 | (c.attr & 0x07);
    // Byte 4, TotalAHSLength, stays 0; DataSegmentLength is 24 bits.
    b[4..8].copy_from_slice(&((data_len as u32) & 0x00FF_FFFF).to_be_bytes());
    b[8..16].copy_from_slice(&c.lun.to_be_bytes());
    b[16..20].copy_from_slice(&c.itt.to_be_bytes());
    b[20..24].copy_from_slice(&c.edtl.to_be_bytes());
    b[24..28].copy_from_slice(&c.cmd_sn.to_be_bytes());
    b[28..32].copy_from_slice(&c.exp_stat_sn.to_be_bytes());
    b[32..48].copy_from_slice(&c.cdb);
    b
}

impl<C: Context> InitiatorSession<C> {
    /// A session after login: the negotiated parameters and digests, the
    /// numbers from the final Login Response, and how long a command may
    /// take.
    pub fn new(params: SessionParams, cmd_sn: u32, max_cmd_sn: u32, exp_stat_sn: u32, timeout: Duration) -> Self {
        let digests = Digests { header: params.header_digest, data: params.data_digest };
        let mut dec = Decoder::new(params.max_recv_data_segment_length as usize);
        dec.digests = digests;
        InitiatorSession {
            params,
            digests,
            dec,
            timeout,
            cmd_sn,
            max_cmd_sn,
            exp_stat_sn,
            slots: Vec::new(),
            free: Vec::new(),
            generation: 0,
            waiting: VecDeque::new(),
            tx: Vec::new(),
            tx_refs: Vec::new(),
            done: VecDeque::new(),
            skip: 0,
            scratch: Vec::new(),
            logged_out: false,
            dead: None,
            large_reads: 0,
            sent: VecDeque::new(),
            plan: Vec::new(),
            staged_bytes: 0,
        }
    }

    /// Commands in flight that read [`LARGE_READ`] bytes or more: while
    /// there are none, the transport may read the socket in large chunks
    /// (no Data-In payload it would rather read straight into its buffer
    /// can be in them).
    pub fn large_reads(&self) -> usize {
        self.large_reads
    }

    /// Bytes of Data-In copied out of the receive buffer so far (the rest
    /// was read straight into place).
    pub fn staged_bytes(&self) -> u64 {
        self.staged_bytes
    }

    /// Why the session ended, if it has.
    pub fn dead(&self) -> Option<&str> {
        self.dead.as_deref()
    }

    pub fn digests(&self) -> Digests {
        self.digests
    }

    /// Commands submitted and not yet completed (those waiting for the
    /// window included; those given up on not).
    pub fn outstanding(&self) -> usize {
        self.slots.iter().flatten().filter(|t| t.ctx.is_some()).count()
    }

    fn window_open(&self) -> bool {
        !sn_lt(self.max_cmd_sn, self.cmd_sn)
    }

    fn task(&mut self, itt: u32) -> Option<&mut Task<C>> {
        self.slots.get_mut((itt & 0xFFFF) as usize)?.as_mut().filter(|t| t.itt == itt)
    }

    fn remove(&mut self, itt: u32) -> Option<Task<C>> {
        let slot = (itt & 0xFFFF) as usize;
        let s = self.slots.get_mut(slot)?;
        if s.as_ref().is_none_or(|t| t.itt != itt) {
            return None;
        }
        self.free.push(slot as u16);
        let t = s.take();
        if t.as_ref().is_some_and(|t| t.read_len >= LARGE_READ) {
            self.large_reads -= 1;
        }
        t
    }

    /// Start `cmd`; it completes with `ctx` through
    /// [`InitiatorSession::poll_completion`]. It is queued to send at once
    /// if the CmdSN window allows, else when a response opens it.
    pub fn submit(&mut self, cmd: Command<'_>, ctx: C, now: Instant) -> Result<Ticket, (C, TaskError)> {
        if let Some(d) = &self.dead {
            return Err((ctx, TaskError::Disconnected(d.clone())));
        }
        let slot = match self.free.pop() {
            Some(s) => s as usize,
            None if self.slots.len() < MAX_SLOTS => {
                self.slots.push(None);
                self.slots.len() - 1
            }
            None => return Err((ctx, TaskError::NoFreeTag)),
        };
        self.generation = self.generation.wrapping_add(1);
        let itt = (self.generation as u32) << 16 | slot as u32;
        let write_len = cmd.write.bytes().len();
        let mut task = Task {
            ctx: Some(ctx),
            itt,
            lun: cmd.lun,
            deadline: now + self.timeout,
            read_len: cmd.read_len,
            received: 0,
            collected: Vec::new(),
            write: Bytes::new(),
            write_from: write_len,
            write_len,
            unsent: None,
        };
        // Commands leave in CmdSN order: behind any already waiting.
        if self.waiting.is_empty() && self.window_open() {
            let (from, tail) = self.send_command(itt, &mut task, &cmd.cdb, &cmd.write);
            task.write_from = from;
            task.write = tail;
        } else {
            task.unsent = Some(Box::new(Unsent { cdb: cmd.cdb, write: cmd.write.to_owned_range(0..write_len) }));
            self.waiting.push_back(itt);
        }
        if cmd.read_len >= LARGE_READ {
            self.large_reads += 1;
        }
        self.slots[slot] = Some(task);
        Ok(Ticket { itt })
    }

    /// Encode the command, its immediate data and its unsolicited Data-Out
    /// into the send buffer. Returns where the data the target may ask for
    /// with R2T starts, and those bytes.
    fn send_command(&mut self, itt: u32, t: &mut Task<C>, cdb: &[u8; 16], write: &Payload<'_>) -> (usize, Bytes) {
        let p = &self.params;
        let data = write.bytes();
        let mss = p.max_send_data_segment_length.max(512) as usize;
        let first_burst = p.first_burst_length as usize;
        let imm_len = if p.immediate_data { data.len().min(first_burst).min(mss) } else { 0 };
        let unsolicited_end = if p.initial_r2t { imm_len } else { data.len().min(first_burst) };
        let c = ScsiCommand {
            immediate: false,
            final_: unsolicited_end == imm_len,
            read: t.read_len > 0,
            write: !data.is_empty(),
            attr: 1, // SIMPLE
            lun: t.lun,
            itt,
            edtl: if data.is_empty() { t.read_len as u32 } else { data.len() as u32 },
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: *cdb,
        };
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.sent.push_back(itt);
        // Written straight into the send buffer (see `scsi_command_bhs`),
        // not through `Message::encode` and `encode_head_into`.
        self.push_head(&scsi_command_bhs(&c, imm_len));
        self.push_segment(write, 0..imm_len);
        // Unsolicited Data-Out up to FirstBurstLength.
        if unsolicited_end > imm_len {
            self.send_data_out(t.lun, itt, RESERVED_TAG, write, 0, imm_len..unsolicited_end);
        }
        if unsolicited_end < data.len() {
            (unsolicited_end, write.to_owned_range(unsolicited_end..data.len()))
        } else {
            (data.len(), Bytes::new())
        }
    }

    /// Queue one PDU whose data segment is `range` of `data`: copied into
    /// the send buffer, or handed to the transport as it is if it is large
    /// and the caller's own.
    fn push_pdu(&mut self, bhs: &Bhs, data: &Payload<'_>, range: std::ops::Range<usize>) {
        pdu::encode_head_into(bhs, range.len(), self.digests, &mut self.tx);
        self.push_segment(data, range);
    }

    /// Queue a BHS whose lengths are already in place (no AHS), with its
    /// header digest if negotiated: what `pdu::encode_head_into` appends.
    fn push_head(&mut self, bhs: &[u8; pdu::BHS_LEN]) {
        self.tx.extend_from_slice(bhs);
        if self.digests.header {
            let crc = pdu::crc32c(bhs);
            self.tx.extend_from_slice(&crc.to_le_bytes());
        }
    }

    /// Queue the data segment `range` of `data` (with its padding and
    /// digest) behind the header just queued: copied into the send buffer,
    /// or handed to the transport as it is if it is large and the caller's
    /// own.
    fn push_segment(&mut self, data: &Payload<'_>, range: std::ops::Range<usize>) {
        // No segment, no padding, no digest (every read's command): ~50
        // instructions less than going through the copy and `trailer`.
        if range.is_empty() {
            return;
        }
        let d = self.digests;
        match data {
            Payload::Owned(b) if range.len() >= WRITE_DIRECT_MIN => {
                let seg = b.slice(range);
                let (t, n) = pdu::trailer(&seg, d);
                self.tx_refs.push((self.tx.len(), seg));
                self.tx.extend_from_slice(&t[..n]);
            }
            _ => {
                let seg = &data.bytes()[range];
                self.tx.extend_from_slice(seg);
                let (t, n) = pdu::trailer(seg, d);
                self.tx.extend_from_slice(&t[..n]);
            }
        }
    }

    /// Data-Out PDUs for `range` of `data` (bytes `base..` of the
    /// transfer), each at most the target's MaxRecvDataSegmentLength.
    fn send_data_out(&mut self, lun: u64, itt: u32, ttt: u32, data: &Payload<'_>, base: usize, range: std::ops::Range<usize>) {
        let mss = self.params.max_send_data_segment_length.max(512) as usize;
        let mut off = range.start;
        let mut sn = 0;
        while off < range.end {
            let end = (off + mss).min(range.end);
            let d = DataOut { final_: end == range.end, lun, itt, ttt, exp_stat_sn: self.exp_stat_sn, data_sn: sn, buffer_offset: (base + off) as u32 };
            self.push_pdu(&Message::DataOut(d).encode(), data, off..end);
            sn += 1;
            off = end;
        }
    }

    #[inline]
    fn update_window(&mut self, exp_cmd_sn: u32, max_cmd_sn: u32) {
        // Ignore nonsense windows (MaxCmdSN < ExpCmdSN - 1) as the RFC says.
        if sn_lt(max_cmd_sn.wrapping_add(1), exp_cmd_sn) {
            return;
        }
        if sn_lt(self.max_cmd_sn, max_cmd_sn) {
            self.max_cmd_sn = max_cmd_sn;
        }
        if !self.waiting.is_empty() {
            self.send_waiting();
        }
    }

    /// Send the commands that waited for the window, as far as it is open
    /// now. Kept apart from `update_window` (which runs for every Data-In
    /// and response) so that the common case, nothing waiting, is a few
    /// compares: with this loop and the command encoding inlined into it,
    /// `update_window` cost ~40 instructions per iSCSI 4 KiB read
    /// (callgrind, docs/notes/2026-11-27-h51z1-client.md).
    #[inline(never)]
    fn send_waiting(&mut self) {
        while self.window_open() {
            let Some(itt) = self.waiting.pop_front() else { break };
            let slot = (itt & 0xFFFF) as usize;
            // Given up on and forgotten while it waited (its slot may
            // have a newer command since).
            if self.slots[slot].as_ref().is_none_or(|t| t.itt != itt) {
                continue;
            }
            let Some(mut t) = self.slots[slot].take() else { continue };
            if let Some(u) = t.unsent.take() {
                let w = Payload::Owned(u.write);
                let (from, tail) = self.send_command(itt, &mut t, &u.cdb, &w);
                t.write_from = from;
                t.write = tail;
            }
            self.slots[slot] = Some(t);
        }
    }

    /// The command's end: free its ITT, hand its result to the caller (if
    /// the caller still waits).
    fn finish(&mut self, itt: u32, result: impl FnOnce(&mut Task<C>) -> Result<Completion, TaskError>) {
        let Some(mut t) = self.remove(itt) else { return };
        let r = result(&mut t);
        if let Some(ctx) = t.ctx {
            self.done.push_back((ctx, r));
        }
    }

    /// A status for `itt`: GOOD needs all the Data-In a caller's buffer
    /// waits for; a command without a buffer gets its data padded to the
    /// length it asked for.
    fn complete(&mut self, itt: u32, status: u8, sense: Bytes) {
        self.finish(itt, |t| {
            let want = t.read_len;
            let has_buf = t.ctx.as_mut().is_some_and(|c| c.read_buf().is_some());
            if has_buf && status == crate::target_session::status::GOOD && t.received < want {
                return Err(TaskError::ShortData { got: t.received, want });
            }
            let mut data = std::mem::take(&mut t.collected);
            if !has_buf && t.ctx.is_some() && want > 0 {
                data.resize(want, 0);
            }
            Ok(Completion { status, sense, data, received: t.received })
        });
    }

    /// Bytes the transport should read next when it wants no more than the
    /// next PDU's header (after a large direct payload, so that the next
    /// one goes straight to its buffer too): what is left to drop of the
    /// last payload's padding, and a BHS with its header digest.
    pub fn next_header_len(&self) -> usize {
        self.skip + pdu::BHS_LEN + if self.digests.header { 4 } else { 0 }
    }

    /// Something to send?
    pub fn has_transmit(&self) -> bool {
        !self.tx.is_empty() || !self.tx_refs.is_empty()
    }

    /// Hand over everything queued to send: the encoded bytes appended to
    /// `out`, and the payloads to send from where they are appended to
    /// `refs`, each with the length of `out` it follows (see
    /// [`WRITE_DIRECT_MIN`]). A whole burst in one call: a payload queued
    /// apart from the bytes before it (as before) cost a fresh send buffer,
    /// an allocation, per payload.
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

    /// The next finished command (or one failed by the session's end).
    pub fn poll_completion(&mut self) -> Option<(C, Result<Completion, TaskError>)> {
        self.done.pop_front()
    }

    /// The caller gave up on a command: forget its context (and so its
    /// buffer). A command never sent is forgotten; one sent keeps its ITT
    /// until the target answers.
    pub fn cancel(&mut self, t: Ticket) {
        let Some(task) = self.task(t.itt) else { return };
        task.ctx = None;
        if task.unsent.is_some() {
            self.remove(t.itt);
        }
    }

    /// The earliest deadline of a command whose caller waits.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.slots.iter().flatten().filter(|t| t.ctx.is_some()).map(|t| t.deadline).min()
    }

    /// Complete every command whose time is up (`now` past its deadline):
    /// one never sent with [`TaskError::WindowClosed`] (and forgotten),
    /// one sent with [`TaskError::Timeout`] (its ITT kept until the target
    /// answers).
    pub fn handle_timeout(&mut self, now: Instant) {
        for i in 0..self.slots.len() {
            let Some(t) = self.slots[i].as_mut().filter(|t| t.ctx.is_some() && t.deadline <= now) else { continue };
            let (itt, unsent) = (t.itt, t.unsent.is_some());
            if let Some(ctx) = t.ctx.take() {
                self.done.push_back((ctx, Err(if unsent { TaskError::WindowClosed } else { TaskError::Timeout })));
            }
            if unsent {
                self.remove(itt);
            }
        }
    }

    /// Queue a Logout Request (close the session);
    /// [`InitiatorSession::take_logged_out`] says when the target answered.
    /// Nothing if the session is over.
    pub fn logout(&mut self) {
        if self.dead.is_some() {
            return;
        }
        let l = LogoutRequest { immediate: true, reason: 0, itt: LOGOUT_ITT, cid: 0, cmd_sn: self.cmd_sn, exp_stat_sn: self.exp_stat_sn };
        pdu::encode_into(&Message::LogoutRequest(l).encode(), &[], self.digests, &mut self.tx);
    }

    /// Whether the target answered our Logout Request (once).
    pub fn take_logged_out(&mut self) -> bool {
        std::mem::take(&mut self.logged_out)
    }

    /// The connection is gone (or the driver is closing): fail every command.
    pub fn fail_all(&mut self, why: &str) {
        let why = self.dead.get_or_insert_with(|| why.to_string()).clone();
        self.waiting.clear();
        self.free.clear();
        self.large_reads = 0;
        for (i, s) in self.slots.iter_mut().enumerate().rev() {
            if let Some(ctx) = s.take().and_then(|t| t.ctx) {
                self.done.push_back((ctx, Err(TaskError::Disconnected(why.clone()))));
            }
            self.free.push(i as u16);
        }
        self.tx.clear();
        self.tx_refs.clear();
        self.sent.clear();
        self.plan.clear();
    }

    fn die(&mut self, e: ConnectionError) -> ConnectionError {
        self.fail_all(&e.0);
        e
    }

    /// Handle at most one PDU from the front of `buf`. An error has already
    /// failed every command: the connection must end.
    pub fn receive(&mut self, buf: &mut BytesMut) -> Result<Received, ConnectionError> {
        if self.dead.is_some() {
            return Ok(Received::NeedMore);
        }
        if self.skip > 0 {
            let n = self.skip.min(buf.len());
            buf.advance(n);
            self.skip -= n;
            if self.skip > 0 {
                return Ok(Received::NeedMore);
            }
        }
        let h = match self.dec.peek_header(buf) {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(Received::NeedMore),
            Err(e) => return Err(self.die(violation(e.to_string()))),
        };
        if h.bhs.opcode_raw() == Opcode::DataIn as u8 && !self.digests.data {
            if let Some(d) = self.begin_direct(&h, buf).map_err(|e| self.die(e))? {
                return Ok(Received::Direct(d));
            }
        }
        let pdu = match self.dec.decode(buf) {
            Ok(Some(p)) => p,
            Ok(None) => return Ok(Received::NeedMore),
            Err(e) => return Err(self.die(violation(e.to_string()))),
        };
        self.on_pdu(&pdu.bhs, pdu.data).map_err(|e| self.die(e))?;
        Ok(Received::Pdu)
    }

    /// Check a Data-In against its command: in flight, at the next offset,
    /// within the read. `Ok(None)`: for a command no longer in flight.
    fn check_data_in(&mut self, d: &DataIn, len: usize) -> Result<Option<&mut Task<C>>, ConnectionError> {
        let Some(t) = self.task(d.itt) else {
            return if d.itt == RESERVED_TAG { Err(violation("Data-In without a task tag")) } else { Ok(None) };
        };
        let off = d.buffer_offset as usize;
        if off != t.received {
            return Err(violation(format!("Data-In at offset {off}, expected {} (DataPDUInOrder)", t.received)));
        }
        if off + len > t.read_len {
            return Err(violation(format!("Data-In past the read ({} > {})", off + len, t.read_len)));
        }
        Ok(Some(t))
    }

    /// A Data-In for a command with a buffer of its own: take its header,
    /// put what of its data is in `buf` in place, and hand back the rest to
    /// read. None: not such a command (the PDU goes the ordinary way).
    fn begin_direct(&mut self, h: &Header, buf: &mut BytesMut) -> Result<Option<DirectRead>, ConnectionError> {
        let Ok(Message::DataIn(d)) = Message::decode(&h.bhs) else { return Ok(None) };
        let has_buf = self.task(d.itt).is_some_and(|t| t.ctx.as_mut().is_some_and(|c| c.read_buf().is_some()));
        if !has_buf {
            return Ok(None);
        }
        self.check_data_in(&d, h.data_len)?;
        self.update_window(d.exp_cmd_sn, d.max_cmd_sn);
        buf.advance(h.header_len);
        let mut dr = DirectRead {
            itt: d.itt,
            at: d.buffer_offset as usize,
            left: h.data_len,
            trailer: h.trailer_len(self.digests),
            status: d.has_status.then_some(DataInStatus { status: d.status, stat_sn: d.stat_sn }),
        };
        let have = buf.len().min(dr.left);
        if have > 0 {
            // Copied from where it is, then dropped from `buf` (not
            // `split_to`: a second handle on the buffer, an atomic count up
            // and down per read).
            let _ = self.direct_fill(&mut dr, |dst| {
                dst[..have].copy_from_slice(&buf[..have]);
                Ok::<usize, ()>(have)
            });
            self.staged_bytes += have as u64;
            buf.advance(have);
        } else if dr.left == 0 {
            self.direct_done(&dr);
        }
        Ok(Some(dr))
    }

    /// Let `read` fill the next part of a direct payload (the command's
    /// buffer, or scratch space if the caller gave up); it returns how many
    /// bytes it wrote. When the payload is complete its padding is dropped
    /// from the stream and a status it carried completes the command.
    pub fn direct_fill<E>(&mut self, d: &mut DirectRead, read: impl FnOnce(&mut [u8]) -> Result<usize, E>) -> Result<usize, E> {
        let (at, left) = (d.at, d.left);
        let slot = (d.itt & 0xFFFF) as usize;
        let task = self.slots.get_mut(slot).and_then(|s| s.as_mut()).filter(|t| t.itt == d.itt);
        let dst = match task.and_then(|t| t.ctx.as_mut()).and_then(|c| c.read_buf()) {
            Some(b) => &mut b[at..at + left],
            None => {
                self.scratch.resize(left.min(64 * 1024), 0);
                &mut self.scratch[..]
            }
        };
        let n = read(dst)?.min(left);
        self.direct_advance(d, n);
        Ok(n)
    }

    /// `n` more bytes of a direct payload are in place.
    fn direct_advance(&mut self, d: &mut DirectRead, n: usize) {
        d.at += n;
        d.left -= n;
        if let Some(t) = self.task(d.itt) {
            t.received += n;
        }
        if d.left == 0 {
            self.direct_done(d);
        }
    }

    /// Plan a socket read that puts Data-In payloads straight into their
    /// callers' buffers ahead of seeing their headers: the reads the
    /// target answers next if it answers in the order the commands were
    /// sent (as a target that serves them in turn does), each in one
    /// Data-In PDU with nothing behind its payload. `take` gets each one's
    /// buffer (its whole read, in plan order) and may refuse it, which
    /// ends the plan, as does the first command that does not fit. Returns
    /// the number of pieces: the transport reads, for piece `i`, a BHS
    /// (into a buffer of its own) and then `i`'s buffer, and hands each
    /// piece to [`InitiatorSession::receive_placed`]; what follows the
    /// pieces goes to [`InitiatorSession::receive`] as usual. None planned
    /// (0) unless the stream is at the start of a PDU with no digests.
    pub fn plan_placed(&mut self, mut take: impl FnMut(&mut [u8]) -> bool) -> usize {
        self.plan.clear();
        if self.dead.is_some() || self.skip > 0 || self.digests.header || self.digests.data {
            return 0;
        }
        // Answered commands leave the front; a long-lived one there (a
        // large read, a write waiting for R2T) must not let the queue grow
        // without bound behind it.
        while let Some(&itt) = self.sent.front() {
            if self.task(itt).is_some() {
                break;
            }
            self.sent.pop_front();
        }
        if self.sent.len() > 4 * PLAN_MAX.max(self.slots.len()) {
            let slots = &self.slots;
            self.sent.retain(|&itt| slots.get((itt & 0xFFFF) as usize).is_some_and(|s| s.as_ref().is_some_and(|t| t.itt == itt)));
        }
        let max_data = self.params.max_recv_data_segment_length as usize;
        for i in 0..self.sent.len() {
            if self.plan.len() == PLAN_MAX {
                break;
            }
            let itt = self.sent[i];
            let slot = (itt & 0xFFFF) as usize;
            let Some(t) = self.slots.get_mut(slot).and_then(|s| s.as_mut()).filter(|t| t.itt == itt) else {
                // Answered out of turn: not in the stream any more.
                continue;
            };
            let len = t.read_len;
            let fits = t.received == 0 && t.unsent.is_none() && len > 0 && len % 4 == 0 && len <= max_data && len < LARGE_READ;
            if !fits {
                break;
            }
            match t.ctx.as_mut().and_then(|c| c.read_buf()) {
                Some(b) if b.len() == len => {
                    if !take(b) {
                        break;
                    }
                    self.plan.push((itt, len));
                }
                _ => break,
            }
        }
        self.plan.len()
    }

    /// Piece `i` of the last plan arrived: its BHS `header`, and `got`
    /// bytes of its payload read into the caller's buffer (all of them, or
    /// the socket held no more). `Some`: it was the Data-In the plan
    /// expected, now taken, with the rest of its payload (if any) to read
    /// with [`InitiatorSession::direct_fill`]. `None`: it was not (another
    /// command's answer, another PDU, a payload of another length), and
    /// nothing was taken: the stream from `header` on (the bytes read into
    /// the buffers included) goes to [`InitiatorSession::receive`].
    pub fn receive_placed(&mut self, i: usize, header: &[u8], got: usize) -> Option<DirectRead> {
        let &(itt, len) = self.plan.get(i)?;
        let h: &[u8; pdu::BHS_LEN] = header.get(..pdu::BHS_LEN)?.try_into().ok()?;
        let p = placed_data_in(h, itt, len)?;
        if self.task(itt).is_none_or(|t| t.received != 0) {
            return None;
        }
        self.update_window(p.exp_cmd_sn, p.max_cmd_sn);
        let mut dr = DirectRead {
            itt,
            at: 0,
            left: len,
            trailer: 0,
            status: p.status,
        };
        self.direct_advance(&mut dr, got.min(len));
        Some(dr)
    }

    fn direct_done(&mut self, d: &DirectRead) {
        self.skip += d.trailer;
        if let Some(s) = d.status {
            self.exp_stat_sn = s.stat_sn.wrapping_add(1);
            self.complete(d.itt, s.status, Bytes::new());
        }
    }

    /// One whole PDU from the target.
    fn on_pdu(&mut self, bhs: &Bhs, data: Bytes) -> Result<(), ConnectionError> {
        let msg = Message::decode(bhs).map_err(|e| violation(e.to_string()))?;
        match msg {
            Message::DataIn(d) => {
                self.update_window(d.exp_cmd_sn, d.max_cmd_sn);
                if let Some(t) = self.check_data_in(&d, data.len())? {
                    let off = t.received;
                    let waiting = t.ctx.is_some();
                    match t.ctx.as_mut().and_then(|c| c.read_buf()) {
                        Some(b) => b[off..off + data.len()].copy_from_slice(&data),
                        None if waiting => t.collected.extend_from_slice(&data),
                        None => {}
                    }
                    t.received += data.len();
                    self.staged_bytes += data.len() as u64;
                }
                if d.has_status {
                    self.exp_stat_sn = d.stat_sn.wrapping_add(1);
                    self.complete(d.itt, d.status, Bytes::new());
                }
            }
            Message::ScsiResponse(r) => {
                self.exp_stat_sn = r.stat_sn.wrapping_add(1);
                self.update_window(r.exp_cmd_sn, r.max_cmd_sn);
                // Sense data: a 2-byte length, then the sense bytes.
                let sense = if data.len() >= 2 {
                    let n = u16::from_be_bytes([data[0], data[1]]) as usize;
                    data.slice(2..(2 + n).min(data.len()))
                } else {
                    Bytes::new()
                };
                if r.response != 0 {
                    self.finish(r.itt, |_| Err(TaskError::ServiceResponse(r.response)));
                } else {
                    self.complete(r.itt, r.status, sense);
                }
            }
            Message::R2t(r) => {
                self.update_window(r.exp_cmd_sn, r.max_cmd_sn);
                let Some(t) = self.task(r.itt) else { return Ok(()) };
                let from = r.buffer_offset as usize;
                let to = from + r.desired_length as usize;
                if from < t.write_from || to > t.write_len {
                    return Err(violation(format!(
                        "R2T asks for bytes {from}..{to}, outside the {}..{} of the write not sent unsolicited",
                        t.write_from, t.write_len
                    )));
                }
                let (lun, base, data) = (t.lun, t.write_from, Payload::Owned(t.write.clone()));
                self.send_data_out(lun, r.itt, r.ttt, &data, base, from - base..to - base);
            }
            Message::NopIn(n) => {
                self.update_window(n.exp_cmd_sn, n.max_cmd_sn);
                if n.ttt != RESERVED_TAG {
                    // The target pings us: answer with the same TTT.
                    let o = NopOut { immediate: true, lun: n.lun, itt: RESERVED_TAG, ttt: n.ttt, cmd_sn: self.cmd_sn, exp_stat_sn: self.exp_stat_sn };
                    pdu::encode_into(&Message::NopOut(o).encode(), &[], self.digests, &mut self.tx);
                }
            }
            Message::LogoutResponse(l) => {
                self.exp_stat_sn = l.stat_sn.wrapping_add(1);
                self.logged_out = true;
            }
            Message::AsyncMessage(a) => {
                self.exp_stat_sn = a.stat_sn.wrapping_add(1);
                self.update_window(a.exp_cmd_sn, a.max_cmd_sn);
                if matches!(a.event, async_event::DROP_CONNECTION | async_event::DROP_ALL_CONNECTIONS | async_event::LOGOUT_REQUESTED) {
                    return Err(violation(format!("target asked to end the session (async event {})", a.event)));
                }
            }
            Message::Reject(r) => {
                // The rejected header comes back as data: fail that command.
                if data.len() >= 48 {
                    let itt = u32::from_be_bytes([data[16], data[17], data[18], data[19]]);
                    self.finish(itt, |_| Err(TaskError::Rejected(r.reason)));
                }
            }
            Message::TaskMgmtResponse(_) | Message::TextResponse(_) => {}
            other => return Err(violation(format!("unexpected PDU from target: {other:?}"))),
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "initiator_session/tests.rs"]
mod tests;
