//! One NVMe/TCP connection = one queue (admin or I/O).
//!
//! One task per connection reads PDUs, runs commands and appends the replies
//! to an [`Outbox`], which it writes out without blocking between reads: no
//! channel hop or second task per reply, and read data goes from the volume
//! straight into the send buffer (small reads) or from the page cache to the
//! socket with sendfile (large reads, no data digest). Commands that may
//! block (O_DIRECT or O_DSYNC volumes, flushes, discards) run on the
//! blocking pool and come back through a channel; they complete out of
//! order, as NVMe allows.

use super::auth::{Gate, QueueAuth};
use super::fabric::{CtrlEntry, Fabric, Refusal};
use super::outbox::Outbox;
use super::NvmeFraming;
use crate::framing::{FrameReader, ReadError};
use crate::Shutdown;
use anyhow::{anyhow, bail};
use bw_nvme::command::{nvm, sgl, Cqe, Sqe};
use bw_nvme::controller::{AdminOutcome, Completion, INCAPSULE_DATA, MAX_QUEUE_ENTRIES, MAX_TRANSFER};
use bw_nvme::fabrics::{self, fctype, Connect, ConnectData, CATTR_DISABLE_SQFLOW};
use bw_nvme::io::{self, IoDone};
use bw_nvme::pdu::{self, fes, CapsuleCmd, DataHeader, DataPdu, DataPduHeader, Digests, IcResp, Pdu, PduError, R2t, TermReq};
use bw_nvme::{Status, Subsystem};
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

/// Largest H2CData payload we accept (also the most one R2T asks for).
pub const MAXH2CDATA: u32 = 1 << 20;
/// Bound on one PDU's size: data plus headers, digests and padding.
const MAX_PLEN: u32 = MAXH2CDATA + 256;
/// Reads at least this long go out with sendfile (when the backend allows
/// and no data digest is needed); shorter ones are cheaper to copy.
const ZERO_COPY_MIN: usize = 32 * 1024;
/// Stop taking new PDUs while this much reply data waits in memory.
const OUT_HIGH: usize = 4 << 20;
/// Socket reads in a row before the task lets others run.
const READS_PER_YIELD: u32 = 32;

/// A write (or other host-to-controller command) waiting for its data.
struct Pending {
    sqe: Sqe,
    chunks: Vec<Bytes>,
    received: usize,
    total: usize,
}

/// A command finished on the blocking pool.
struct Finished {
    cid: u16,
    done: IoDone,
}

/// Fixed once the queue is connected, plus the submission queue state.
struct QueueInfo {
    qid: u16,
    sqflow_disabled: bool,
    /// Submission queue head, reported in every completion.
    sqhd: u16,
    sq_entries: u16,
    outstanding: usize,
}

enum Flow {
    Continue,
    /// Close the connection after what is queued has been sent.
    Close,
}

struct Conn {
    fabric: Arc<Fabric>,
    local: Option<SocketAddr>,
    peer: SocketAddr,
    digests: Digests,
    out: Outbox,
    /// Completions from the blocking pool come back through here.
    done_tx: mpsc::UnboundedSender<Finished>,
    q: QueueInfo,
    ctrl: Option<Arc<CtrlEntry>>,
    kill: watch::Receiver<bool>,
    _kill_keep: watch::Sender<bool>,
    pending: HashMap<u16, Pending>,
    /// Until a Connect succeeds (`ctrl` is set) and, when the host must
    /// authenticate, until it has, the connection must not outlive this.
    login_deadline: tokio::time::Instant,
    /// DH-HMAC-CHAP on this queue, when its host must authenticate.
    auth: Option<QueueAuth>,
}

/// `login_timeout`: from accept to a successful Connect; a connection that
/// is silent, sends half a PDU or never connects is dropped then.
pub async fn serve(mut stream: TcpStream, peer: SocketAddr, local: Option<SocketAddr>, fabric: Arc<Fabric>, mut shutdown: Shutdown, login_timeout: Duration) -> anyhow::Result<()> {
    let login_deadline = tokio::time::Instant::now() + login_timeout;
    let mut reader = FrameReader::with_capacity(256 * 1024);
    // Initialization: ICReq -> ICResp, no digests yet.
    let icreq = tokio::select! {
        r = tokio::time::timeout_at(login_deadline, next_pdu(&mut stream, &mut reader, Digests::default(), pdu::IC_LEN as u32)) => match r {
            Err(_) => bail!("no ICReq within {login_timeout:?} (login_timeout_s)"),
            Ok(r) => r,
        },
        _ = shutdown.wait() => return Ok(()),
    };
    let req = match icreq {
        Ok(Some(Pdu::IcReq(r))) => r,
        Ok(None) => return Ok(()),
        Ok(Some(p)) => return fatal_direct(&mut stream, fes::PDU_SEQUENCE_ERROR, 0, &[p.kind()], "first PDU is not ICReq").await,
        Err(e) => {
            let hdr = &reader.pending()[..reader.pending().len().min(128)];
            return fatal_direct(&mut stream, e.fes().unwrap_or(fes::INVALID_HEADER_FIELD), e.fei(), hdr, &e.to_string()).await;
        }
    };
    if req.pfv != 0 {
        return fatal_direct(&mut stream, fes::UNSUPPORTED_PARAMETER, 8, &[], "unsupported PDU format version").await;
    }
    if req.hpda != 0 {
        return fatal_direct(&mut stream, fes::UNSUPPORTED_PARAMETER, 10, &[], "host PDU data alignment not supported").await;
    }
    let digests = req.digests;
    let resp = Pdu::IcResp(IcResp { pfv: 0, cpda: 0, digests, maxh2cdata: MAXH2CDATA });
    stream.write_all(&resp.encode_parts(Digests::default()).concat()).await?;
    log::debug!("nvme: {peer}: ICReq ok (header digest {}, data digest {})", digests.header, digests.data);

    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let (kill_keep, kill) = watch::channel(false);
    let mut c = Conn {
        fabric,
        local,
        peer,
        digests,
        out: Outbox::default(),
        done_tx,
        q: QueueInfo { qid: 0, sqflow_disabled: false, sqhd: 0, sq_entries: 1, outstanding: 0 },
        ctrl: None,
        kill,
        _kill_keep: kill_keep,
        pending: HashMap::new(),
        login_deadline,
        auth: None,
    };
    let r = c.run(&stream, &mut reader, &mut done_rx, &mut shutdown).await;
    // Teardown: an admin queue takes its controller with it.
    if let Some(e) = &c.ctrl {
        if c.q.qid == 0 {
            c.fabric.remove(e.cntlid, "admin queue closed");
        } else {
            e.release_queue(c.q.qid);
        }
    }
    // Let queued replies (a TermReq, a Disconnect's completion) go out.
    if tokio::time::timeout(Duration::from_secs(5), c.out.drain(&stream)).await.is_ok() {
        let _ = stream.shutdown().await;
    }
    r
}

/// Read until one PDU is decoded; Ok(None) when the stream ends (or fails).
async fn next_pdu(rd: &mut TcpStream, reader: &mut FrameReader, d: Digests, max: u32) -> Result<Option<Pdu>, PduError> {
    match reader.next(rd, &NvmeFraming { max_plen: max }, |b| pdu::decode(b, d, max)).await {
        Ok(p) => Ok(p),
        Err(ReadError::Pdu(e)) => Err(e),
        Err(ReadError::Io(_)) => Ok(None),
    }
}

async fn fatal_direct(wr: &mut TcpStream, fes: u16, fei: u32, hdr: &[u8], why: &str) -> anyhow::Result<()> {
    let t = Pdu::C2HTermReq(TermReq { fes, fei, data: Bytes::copy_from_slice(hdr) });
    let _ = wr.write_all(&t.encode_parts(Digests::default()).concat()).await;
    let _ = wr.shutdown().await;
    Err(anyhow!("{why} (C2HTermReq FES {fes:#x})"))
}

/// Commands that may sleep in the kernel run on the blocking pool; plain
/// reads and writes of RAM or page-cache backed volumes run inline.
fn may_block(subsys: &Subsystem, sqe: &Sqe) -> bool {
    match sqe.opcode() {
        nvm::FLUSH | nvm::DSM | nvm::WRITE_ZEROES => true,
        _ if sqe.cdw(12) & (1 << 30) != 0 => true, // FUA
        _ => subsys.namespace(sqe.nsid()).is_some_and(|n| n.volume.info().io_may_block()),
    }
}

impl Conn {
    async fn run(&mut self, stream: &TcpStream, reader: &mut FrameReader, done_rx: &mut mpsc::UnboundedReceiver<Finished>, shutdown: &mut Shutdown) -> anyhow::Result<()> {
        let d = self.digests;
        let framing = NvmeFraming { max_plen: MAX_PLEN };
        let mut reads_in_a_row = 0;
        loop {
            // Handle every PDU already buffered before touching the socket
            // again: at high queue depth one read brings many capsules.
            // (Left true when the reply backlog, not a lack of bytes, stopped it.)
            let mut stalled = true;
            while self.out.buffered() < OUT_HIGH {
                if *self.kill.borrow() {
                    return Ok(());
                }
                let p = match pdu::decode(reader.buf(), d, MAX_PLEN) {
                    Ok(Some(p)) => p,
                    Ok(None) => {
                        stalled = false;
                        break;
                    }
                    Err(PduError::DataDigest { kind, cid }) if kind == pdu::kind::CAPSULE_CMD => {
                        // The capsule was consumed; fail only this command.
                        log::warn!("nvme: {}: data digest error on command {cid}", self.peer);
                        self.q.outstanding += 1;
                        self.complete(cid, Status::TRANSIENT_TRANSPORT, 0, None);
                        continue;
                    }
                    Err(e @ PduError::DataDigest { .. }) => bail!("{e}: closing the queue"),
                    Err(e) => {
                        let hdr = Bytes::copy_from_slice(&reader.pending()[..reader.pending().len().min(128)]);
                        self.fatal(e.fes().unwrap_or(fes::INVALID_HEADER_FIELD), e.fei(), hdr);
                        bail!("malformed PDU: {e}");
                    }
                };
                if let Flow::Close = self.handle(p)? {
                    return Ok(());
                }
            }
            while let Ok(f) = done_rx.try_recv() {
                self.finished(f);
            }
            self.out.send(stream)?;
            let reading = self.out.buffered() < OUT_HIGH;
            if reading && stalled {
                // Room again: the PDUs already buffered come first.
                continue;
            }
            if reading && reads_in_a_row < READS_PER_YIELD {
                match reader.try_fill(stream, &framing) {
                    Ok(0) => return Ok(()),
                    Ok(_) => {
                        reads_in_a_row += 1;
                        continue;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return Ok(()),
                }
            }
            if reads_in_a_row >= READS_PER_YIELD {
                reads_in_a_row = 0;
                tokio::task::yield_now().await;
                continue;
            }
            reads_in_a_row = 0;
            let interest = match (reading, self.out.is_empty()) {
                (true, true) => Interest::READABLE,
                (true, false) => Interest::READABLE | Interest::WRITABLE,
                (false, _) => Interest::WRITABLE,
            };
            tokio::select! {
                r = stream.ready(interest) => { r?; }
                Some(f) = done_rx.recv() => self.finished(f),
                _ = self.kill.changed() => return Ok(()),
                _ = shutdown.wait() => return Ok(()),
                _ = tokio::time::sleep_until(self.login_deadline), if self.ctrl.is_none() || self.auth.as_ref().is_some_and(|a| !a.authenticated()) => bail!("no Connect or authentication before the login timeout (login_timeout_s)"),
            }
        }
    }

    fn handle(&mut self, p: Pdu) -> anyhow::Result<Flow> {
        match p {
            Pdu::CapsuleCmd(c) => self.capsule(c),
            Pdu::H2CData(h) => self.h2c_data(h),
            Pdu::H2CTermReq(t) => bail!("host terminated the connection: FES {:#x} FEI {}", t.fes, t.fei),
            other => {
                self.fatal(fes::INVALID_HEADER_FIELD, 0, Bytes::from(vec![other.kind()]));
                bail!("unexpected PDU type {:#04x} from host", other.kind());
            }
        }
    }

    fn push(&mut self, p: &Pdu) {
        p.encode_into(self.digests, self.out.buf_mut());
    }

    /// Queue a C2HTermReq; the caller then ends the connection.
    fn fatal(&mut self, fes: u16, fei: u32, hdr: Bytes) {
        self.push(&Pdu::C2HTermReq(TermReq { fes, fei, data: hdr }));
    }

    fn cqe(&self, cid: u16, status: Status, result: u64) -> Pdu {
        Pdu::CapsuleResp(Cqe { result, sq_head: self.q.sqhd, sq_id: self.q.qid, cid, status })
    }

    /// Queue the data (if any) and the completion of one command.
    fn complete(&mut self, cid: u16, status: Status, result: u64, data: Option<Bytes>) {
        self.q.outstanding = self.q.outstanding.saturating_sub(1);
        let mut skip_resp = false;
        if let Some(d) = data.filter(|d| !d.is_empty()) {
            // With SQ flow control off the host needs no SQ head, so a
            // successful read can complete with the data PDU alone.
            let success = self.q.sqflow_disabled && status.is_success();
            skip_resp = success;
            self.push(&Pdu::C2HData(DataPdu { cid, ttag: 0, offset: 0, last: true, success, data: d }));
        }
        if !skip_resp {
            let c = self.cqe(cid, status, result);
            self.push(&c);
        }
    }

    fn finished(&mut self, f: Finished) {
        self.complete(f.cid, f.done.status, 0, f.done.data);
    }

    fn fail(&mut self, cid: u16, st: Status) -> anyhow::Result<Flow> {
        self.complete(cid, st, 0, None);
        Ok(Flow::Continue)
    }

    /// A command arrived: account for it, collect its data, run it.
    fn capsule(&mut self, c: CapsuleCmd) -> anyhow::Result<Flow> {
        let sqe = c.sqe;
        let cid = sqe.cid();
        let q = &mut self.q;
        q.sqhd = (q.sqhd + 1) % q.sq_entries.max(1);
        q.outstanding += 1;
        if self.ctrl.is_some() && q.outstanding > q.sq_entries as usize {
            let (n, e) = (q.outstanding, q.sq_entries);
            self.fatal(fes::PDU_SEQUENCE_ERROR, 0, Bytes::new());
            bail!("host has {n} commands outstanding on a queue of {e} entries");
        }
        if let Some(e) = &self.ctrl {
            e.keep_alive.touch(Instant::now());
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
                return self.fail(cid, st.dnr());
            }
            return self.dispatch(sqe, c.data);
        }
        if sqe.is_host_to_ctrl() && s.length > 0 {
            // Data comes later in H2CData PDUs: ask for it with one R2T.
            if s.kind != sgl::TRANSPORT {
                return self.fail(cid, Status::SGL_INVALID_TYPE.dnr());
            }
            if s.length > MAX_TRANSFER {
                return self.fail(cid, Status::INVALID_FIELD.dnr());
            }
            if let (Some(e), true) = (&self.ctrl, self.q.qid > 0 && !sqe.is_fabrics()) {
                if let Some(sub) = &e.subsys {
                    if let Err(st) = io::precheck(sub, &sqe) {
                        return self.fail(cid, st);
                    }
                }
            }
            if self.pending.contains_key(&cid) {
                return self.fail(cid, Status::CMDID_CONFLICT.dnr());
            }
            self.pending.insert(cid, Pending { sqe, chunks: Vec::new(), received: 0, total: s.length as usize });
            self.push(&Pdu::R2T(R2t { cid, ttag: cid, offset: 0, length: s.length }));
            return Ok(Flow::Continue);
        }
        self.dispatch(sqe, Bytes::new())
    }

    fn h2c_data(&mut self, h: DataPdu) -> anyhow::Result<Flow> {
        // Validate against the pending transfer first, then report.
        let problem = match self.pending.get(&h.ttag) {
            None => Some((fes::INVALID_HEADER_FIELD, 10, format!("H2CData for unknown transfer tag {}", h.ttag))),
            Some(p) if h.cid != p.sqe.cid() => Some((fes::INVALID_HEADER_FIELD, 8, format!("H2CData command id {} does not match transfer tag {}", h.cid, h.ttag))),
            Some(_) if h.data.len() > MAXH2CDATA as usize => Some((fes::R2T_LIMIT_EXCEEDED, 16, format!("H2CData of {} bytes exceeds MAXH2CDATA", h.data.len()))),
            Some(p) if h.offset as usize != p.received || p.received + h.data.len() > p.total => Some((
                fes::DATA_OUT_OF_RANGE,
                12,
                format!("H2CData offset {} length {} outside the expected {}..{}", h.offset, h.data.len(), p.received, p.total),
            )),
            Some(_) => None,
        };
        if let Some((f, fei, why)) = problem {
            self.fatal(f, fei, Bytes::new());
            bail!("{why}");
        }
        let Some(p) = self.pending.get_mut(&h.ttag) else { return Ok(Flow::Continue) };
        p.received += h.data.len();
        p.chunks.push(h.data);
        if p.received < p.total {
            return Ok(Flow::Continue);
        }
        let Some(p) = self.pending.remove(&h.ttag) else { return Ok(Flow::Continue) };
        let data = if p.chunks.len() == 1 {
            p.chunks.into_iter().next().unwrap_or_default()
        } else {
            let mut all = BytesMut::with_capacity(p.total);
            for c in p.chunks {
                all.extend_from_slice(&c);
            }
            all.freeze()
        };
        self.dispatch(p.sqe, data)
    }

    /// Run a command whose data (if any) is complete.
    fn dispatch(&mut self, sqe: Sqe, data: Bytes) -> anyhow::Result<Flow> {
        let cid = sqe.cid();
        let Some(e) = self.ctrl.clone() else {
            if sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT {
                return self.connect(sqe, data);
            }
            return self.fail(cid, Status::CMD_SEQ_ERROR);
        };
        if let Some(a) = self.auth.as_mut() {
            if let Gate::Complete { status, data, close } = a.gate(&sqe, &data, &self.fabric.host_keys.seq) {
                self.complete(cid, status, 0, data);
                if close {
                    self.fabric.remove(e.cntlid, "DH-HMAC-CHAP authentication failed");
                    return Ok(Flow::Close);
                }
                return Ok(Flow::Continue);
            }
        }
        if sqe.is_fabrics() {
            match sqe.fctype() {
                fctype::CONNECT => return self.fail(cid, Status::CMD_SEQ_ERROR),
                fctype::DISCONNECT => {
                    self.complete(cid, Status::SUCCESS, 0, None);
                    return Ok(Flow::Close);
                }
                _ if self.q.qid > 0 => return self.fail(cid, Status::INVALID_OPCODE.dnr()),
                _ => {}
            }
        }
        if self.q.qid == 0 {
            let out = {
                let mut g = e.ctrl.lock().unwrap_or_else(|p| p.into_inner());
                g.execute_admin(&sqe, &data, Instant::now())
            };
            if let AdminOutcome::Complete(Completion { cid, status, result, data }) = out {
                self.complete(cid, status, result, data);
            }
            return Ok(Flow::Continue);
        }
        let Some(sub) = e.subsys.clone() else { return self.fail(cid, Status::INVALID_OPCODE.dnr()) };
        if may_block(&sub, &sqe) {
            let tx = self.done_tx.clone();
            tokio::task::spawn_blocking(move || {
                let run = std::panic::AssertUnwindSafe(|| io::execute(&sub, &sqe, &data));
                let done = std::panic::catch_unwind(run).unwrap_or(IoDone { status: Status::INTERNAL, data: None });
                let _ = tx.send(Finished { cid, done });
            });
        } else if sqe.opcode() == nvm::READ {
            self.read(&sub, &sqe);
        } else {
            let IoDone { status, data } = io::execute(&sub, &sqe, &data);
            self.complete(cid, status, 0, data);
        }
        Ok(Flow::Continue)
    }

    /// A read that cannot block: its data goes from the volume straight into
    /// the send buffer behind the C2HData header, or, when large, from the
    /// page cache to the socket with sendfile.
    fn read(&mut self, sub: &Subsystem, sqe: &Sqe) {
        let cid = sqe.cid();
        let (vol, off, len) = match io::read_extent(sub, sqe) {
            Ok(x) => x,
            Err(st) => return self.complete(cid, st, 0, None),
        };
        if len == 0 {
            return self.complete(cid, Status::SUCCESS, 0, None);
        }
        // With SQ flow control off, the data PDU alone completes the read.
        let success = self.q.sqflow_disabled;
        let hdr = DataHeader::new(false, &DataPduHeader { cid, ttag: 0, offset: 0, last: true, success }, len as u32, self.digests);
        if !self.digests.data && len >= ZERO_COPY_MIN {
            match vol.zero_copy_read(off, len as u64) {
                Ok(Some(fd)) => {
                    let fd = fd.as_raw_fd();
                    self.out.buf_mut().extend_from_slice(hdr.bytes());
                    self.out.push_file(vol.clone(), fd, off, len);
                    self.q.outstanding = self.q.outstanding.saturating_sub(1);
                    if !success {
                        let c = self.cqe(cid, Status::SUCCESS, 0);
                        self.push(&c);
                    }
                    return;
                }
                Ok(None) => {}
                Err(e) => return self.complete(cid, io::read_error(e), 0, None),
            }
        }
        let want_ddgst = self.digests.data;
        let b = self.out.buf_mut();
        let start = b.len();
        b.extend_from_slice(hdr.bytes());
        let dstart = b.len();
        b.reserve(len);
        // SAFETY: u8 has no invalid bit patterns and `read_at` either fills
        // the whole slice or fails, after which it is truncated away unread.
        unsafe { b.set_len(dstart + len) };
        match vol.read_at(&mut b[dstart..], off) {
            Ok(()) => {
                if want_ddgst {
                    let c = pdu::crc32c(&b[dstart..]);
                    b.extend_from_slice(&c.to_le_bytes());
                }
                self.q.outstanding = self.q.outstanding.saturating_sub(1);
                if !success {
                    let c = self.cqe(cid, Status::SUCCESS, 0);
                    self.push(&c);
                }
            }
            Err(e) => {
                b.truncate(start);
                self.complete(cid, io::read_error(e), 0, None);
            }
        }
    }

    fn connect(&mut self, sqe: Sqe, data: Bytes) -> anyhow::Result<Flow> {
        let cid = sqe.cid();
        let c = Connect::parse(&sqe);
        let refused = |r: Refusal| (r.status, r.result);
        let outcome = if c.recfmt != 0 {
            Err((Status::CONNECT_FORMAT.dnr(), 0))
        } else if c.sqsize == 0 || c.sqsize >= MAX_QUEUE_ENTRIES {
            Err((Status::CONNECT_INVALID_PARAM.dnr(), fabrics::ipo_sqe(fabrics::CS_SQSIZE)))
        } else {
            match ConnectData::parse(&data) {
                None => Err((Status::SGL_INVALID_DATA.dnr(), 0)),
                Some(d) if c.qid == 0 => self.fabric.connect_admin(&c, &d, self.local).map_err(refused),
                Some(d) => self.fabric.connect_io(&c, &d).map_err(refused),
            }
        };
        let e = match outcome {
            Ok(e) => e,
            Err((status, result)) => {
                log::info!("nvme: {}: Connect (qid {}) refused: {status}", self.peer, c.qid);
                self.complete(cid, status, result, None);
                return Ok(Flow::Continue);
            }
        };
        // The queue is now bound; its size and flow control are fixed.
        self.q = QueueInfo {
            qid: c.qid,
            sqflow_disabled: c.cattr & CATTR_DISABLE_SQFLOW != 0,
            sqhd: 1 % (c.sqsize + 1),
            sq_entries: c.sqsize + 1,
            outstanding: self.q.outstanding,
        };
        self.kill = e.killed();
        if c.qid == 0 {
            if let Some(kato) = e.keep_alive.kato() {
                tokio::spawn(keep_alive_timer(self.fabric.clone(), e.clone(), kato));
            }
        }
        log::debug!("nvme: {}: queue {} of controller {} connected (sqsize {})", self.peer, c.qid, e.cntlid, c.sqsize);
        // Every queue of a controller whose host has a secret authenticates.
        self.auth = e.auth.as_ref().and_then(|a| Some(QueueAuth::new(a.clone(), &e.hostnqn, &e.subsys.as_ref()?.nqn, e.cntlid, c.qid)));
        let authreq = if self.auth.is_some() { fabrics::AUTHREQ_ATR as u64 } else { 0 };
        self.ctrl = Some(e.clone());
        self.complete(cid, Status::SUCCESS, e.cntlid as u64 | authreq, None);
        Ok(Flow::Continue)
    }
}

/// Tear the controller down when a whole KATO passes without a command.
async fn keep_alive_timer(fabric: Arc<Fabric>, e: Arc<CtrlEntry>, kato: Duration) {
    let mut kill = e.killed();
    let tick = (kato / 4).max(Duration::from_millis(50));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = kill.changed() => return,
        }
        if *kill.borrow() {
            return;
        }
        if e.keep_alive.expired(Instant::now()) {
            fabric.remove(e.cntlid, &format!("keep-alive timeout ({} ms without a command)", kato.as_millis()));
            return;
        }
    }
}
