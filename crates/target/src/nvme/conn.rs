//! One NVMe/TCP connection = one queue (admin or I/O).
//!
//! The reader half decodes PDUs and runs commands; replies go through a
//! channel to a writer task, so reads from the socket, backend I/O and
//! writes to the socket overlap. Commands that may block (O_DIRECT or
//! O_DSYNC volumes, flushes, discards) run on the blocking pool and complete
//! out of order, as NVMe allows.

use super::fabric::{CtrlEntry, Fabric, Refusal};
use crate::Shutdown;
use anyhow::{anyhow, bail};
use bw_nvme::command::{nvm, sgl, Cqe, Sqe};
use bw_nvme::controller::{AdminOutcome, Completion, INCAPSULE_DATA, MAX_QUEUE_ENTRIES, MAX_TRANSFER};
use bw_nvme::fabrics::{self, fctype, Connect, ConnectData, CATTR_DISABLE_SQFLOW};
use bw_nvme::io::{self, IoDone};
use bw_nvme::pdu::{self, fes, CapsuleCmd, DataPdu, Digests, IcResp, Pdu, PduError, R2t, TermReq};
use bw_nvme::{Status, Subsystem};
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

/// Largest H2CData payload we accept (also the most one R2T asks for).
pub const MAXH2CDATA: u32 = 1 << 20;
/// Bound on one PDU's size: data plus headers, digests and padding.
const MAX_PLEN: u32 = MAXH2CDATA + 256;

/// A write (or other host-to-controller command) waiting for its data.
struct Pending {
    sqe: Sqe,
    chunks: Vec<Bytes>,
    received: usize,
    total: usize,
}

/// What is fixed once the queue is connected, shared with completions that
/// run on other tasks.
struct QueueInfo {
    qid: u16,
    sqflow_disabled: bool,
    /// Submission queue head, reported in every completion.
    sqhd: AtomicU16,
    sq_entries: u16,
    outstanding: AtomicUsize,
}

impl QueueInfo {
    fn cqe(&self, cid: u16, status: Status, result: u64) -> Pdu {
        Pdu::CapsuleResp(Cqe { result, sq_head: self.sqhd.load(Relaxed), sq_id: self.qid, cid, status })
    }
}

/// Send the data (if any) and the completion of one command.
async fn send_completion(tx: &mpsc::Sender<Pdu>, q: &QueueInfo, cid: u16, status: Status, result: u64, data: Option<Bytes>) {
    q.outstanding.fetch_sub(1, Relaxed);
    let mut skip_resp = false;
    if let Some(d) = data.filter(|d| !d.is_empty()) {
        // With SQ flow control off the host needs no SQ head, so a
        // successful read can complete with the data PDU alone.
        let success = q.sqflow_disabled && status.is_success();
        skip_resp = success;
        let _ = tx.send(Pdu::C2HData(DataPdu { cid, ttag: 0, offset: 0, last: true, success, data: d })).await;
    }
    if !skip_resp {
        let _ = tx.send(q.cqe(cid, status, result)).await;
    }
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
    tx: mpsc::Sender<Pdu>,
    q: Arc<QueueInfo>,
    ctrl: Option<Arc<CtrlEntry>>,
    kill: watch::Receiver<bool>,
    _kill_keep: watch::Sender<bool>,
    pending: HashMap<u16, Pending>,
}

pub async fn serve(stream: TcpStream, peer: SocketAddr, local: Option<SocketAddr>, fabric: Arc<Fabric>, mut shutdown: Shutdown) -> anyhow::Result<()> {
    let (mut rd, mut wr) = stream.into_split();
    let mut buf = BytesMut::with_capacity(256 * 1024);
    // Initialization: ICReq -> ICResp, no digests yet.
    let icreq = tokio::select! {
        r = tokio::time::timeout(Duration::from_secs(30), next_pdu(&mut rd, &mut buf, Digests::default(), pdu::IC_LEN as u32)) => match r {
            Err(_) => bail!("no ICReq within 30 s"),
            Ok(r) => r,
        },
        _ = shutdown.wait() => return Ok(()),
    };
    let req = match icreq {
        Ok(Some(Pdu::IcReq(r))) => r,
        Ok(None) => return Ok(()),
        Ok(Some(p)) => return fatal_direct(&mut wr, fes::PDU_SEQUENCE_ERROR, 0, &[p.kind()], "first PDU is not ICReq").await,
        Err(e) => return fatal_direct(&mut wr, e.fes().unwrap_or(fes::INVALID_HEADER_FIELD), e.fei(), &buf[..buf.len().min(128)], &e.to_string()).await,
    };
    if req.pfv != 0 {
        return fatal_direct(&mut wr, fes::UNSUPPORTED_PARAMETER, 8, &[], "unsupported PDU format version").await;
    }
    if req.hpda != 0 {
        return fatal_direct(&mut wr, fes::UNSUPPORTED_PARAMETER, 10, &[], "host PDU data alignment not supported").await;
    }
    let digests = req.digests;
    let resp = Pdu::IcResp(IcResp { pfv: 0, cpda: 0, digests, maxh2cdata: MAXH2CDATA });
    wr.write_all(&resp.encode_parts(Digests::default()).concat()).await?;
    log::debug!("nvme: {peer}: ICReq ok (header digest {}, data digest {})", digests.header, digests.data);

    let (tx, rx) = mpsc::channel::<Pdu>(1024);
    let writer = tokio::spawn(write_loop(wr, rx, digests));
    let (kill_keep, kill) = watch::channel(false);
    let mut c = Conn {
        fabric,
        local,
        peer,
        tx,
        q: Arc::new(QueueInfo { qid: 0, sqflow_disabled: false, sqhd: AtomicU16::new(0), sq_entries: 1, outstanding: AtomicUsize::new(0) }),
        ctrl: None,
        kill,
        _kill_keep: kill_keep,
        pending: HashMap::new(),
    };
    let r = c.run(&mut rd, &mut buf, digests, &mut shutdown).await;
    // Teardown: an admin queue takes its controller with it.
    if let Some(e) = &c.ctrl {
        if c.q.qid == 0 {
            c.fabric.remove(e.cntlid, "admin queue closed");
        } else {
            e.release_queue(c.q.qid);
        }
    }
    drop(c);
    // Let queued replies (a TermReq, a Disconnect's completion) go out.
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    r
}

/// Read until one PDU is decoded; Ok(None) on a clean end of stream.
async fn next_pdu(rd: &mut OwnedReadHalf, buf: &mut BytesMut, d: Digests, max: u32) -> Result<Option<Pdu>, PduError> {
    loop {
        if let Some(p) = pdu::decode(buf, d, max)? {
            return Ok(Some(p));
        }
        // `decode` reserved exactly what the current PDU still needs; only
        // a full buffer needs more room. (Reserving more while earlier PDUs'
        // payloads are still referenced would copy the partial PDU.)
        if buf.capacity() == buf.len() {
            buf.reserve(64 * 1024);
        }
        match rd.read_buf(buf).await {
            Ok(0) | Err(_) => return Ok(None),
            Ok(_) => {}
        }
    }
}

async fn fatal_direct(wr: &mut OwnedWriteHalf, fes: u16, fei: u32, hdr: &[u8], why: &str) -> anyhow::Result<()> {
    let t = Pdu::C2HTermReq(TermReq { fes, fei, data: Bytes::copy_from_slice(hdr) });
    let _ = wr.write_all(&t.encode_parts(Digests::default()).concat()).await;
    let _ = wr.shutdown().await;
    Err(anyhow!("{why} (C2HTermReq FES {fes:#x})"))
}

async fn write_loop(wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Pdu>, d: Digests) -> std::io::Result<()> {
    let mut w = BufWriter::with_capacity(256 * 1024, wr);
    while let Some(p) = rx.recv().await {
        write_pdu(&mut w, &p, d).await?;
        // Batch whatever else is ready into the same flush.
        while let Ok(p) = rx.try_recv() {
            write_pdu(&mut w, &p, d).await?;
        }
        w.flush().await?;
        if matches!(p, Pdu::C2HTermReq(_)) {
            break;
        }
    }
    w.shutdown().await
}

async fn write_pdu(w: &mut BufWriter<OwnedWriteHalf>, p: &Pdu, d: Digests) -> std::io::Result<()> {
    let e = p.encode_parts(d);
    w.write_all(&e.head).await?;
    if !e.data.is_empty() {
        w.write_all(&e.data).await?;
    }
    if let Some(dd) = e.ddgst {
        w.write_all(&dd).await?;
    }
    Ok(())
}

/// Commands that may sleep in the kernel run on the blocking pool; plain
/// reads and writes of RAM or page-cache backed volumes run inline.
fn may_block(subsys: &Subsystem, sqe: &Sqe) -> bool {
    match sqe.opcode() {
        nvm::FLUSH | nvm::DSM | nvm::WRITE_ZEROES => true,
        _ if sqe.cdw(12) & (1 << 30) != 0 => true, // FUA
        _ => subsys.namespace(sqe.nsid()).is_some_and(|n| {
            let i = n.volume.info();
            i.durability == bw_block::Durability::WriteThrough || i.description.contains("O_DIRECT") || i.description.starts_with("blockdev:")
        }),
    }
}

impl Conn {
    async fn run(&mut self, rd: &mut OwnedReadHalf, buf: &mut BytesMut, d: Digests, shutdown: &mut Shutdown) -> anyhow::Result<()> {
        loop {
            // Handle every PDU already buffered before waiting on the socket
            // (and the kill/shutdown signals) again: at high queue depth one
            // read brings many capsules.
            let p = match pdu::decode(buf, d, MAX_PLEN) {
                Ok(Some(p)) if !*self.kill.borrow() => Ok(Some(p)),
                Ok(Some(_)) => return Ok(()),
                Ok(None) => tokio::select! {
                    r = next_pdu(rd, buf, d, MAX_PLEN) => r,
                    _ = self.kill.changed() => return Ok(()),
                    _ = shutdown.wait() => return Ok(()),
                },
                Err(e) => Err(e),
            };
            let flow = match p {
                Ok(None) => return Ok(()),
                Ok(Some(Pdu::CapsuleCmd(c))) => self.capsule(c).await?,
                Ok(Some(Pdu::H2CData(h))) => self.h2c_data(h).await?,
                Ok(Some(Pdu::H2CTermReq(t))) => bail!("host terminated the connection: FES {:#x} FEI {}", t.fes, t.fei),
                Ok(Some(other)) => {
                    self.fatal(fes::INVALID_HEADER_FIELD, 0, Bytes::from(vec![other.kind()])).await;
                    bail!("unexpected PDU type {:#04x} from host", other.kind());
                }
                Err(PduError::DataDigest { kind, cid }) if kind == pdu::kind::CAPSULE_CMD => {
                    // The capsule was consumed; fail only this command.
                    log::warn!("nvme: {}: data digest error on command {cid}", self.peer);
                    let _ = self.tx.send(self.q.cqe(cid, Status::TRANSIENT_TRANSPORT, 0)).await;
                    Flow::Continue
                }
                Err(e @ PduError::DataDigest { .. }) => bail!("{e}: closing the queue"),
                Err(e) => {
                    let hdr = Bytes::copy_from_slice(&buf[..buf.len().min(128)]);
                    self.fatal(e.fes().unwrap_or(fes::INVALID_HEADER_FIELD), e.fei(), hdr).await;
                    bail!("malformed PDU: {e}");
                }
            };
            if let Flow::Close = flow {
                return Ok(());
            }
        }
    }

    async fn fatal(&self, fes: u16, fei: u32, hdr: Bytes) {
        let _ = self.tx.send(Pdu::C2HTermReq(TermReq { fes, fei, data: hdr })).await;
    }

    /// A command arrived: account for it, collect its data, run it.
    async fn capsule(&mut self, c: CapsuleCmd) -> anyhow::Result<Flow> {
        let sqe = c.sqe;
        let cid = sqe.cid();
        let q = &self.q;
        q.sqhd.store((q.sqhd.load(Relaxed) + 1) % q.sq_entries.max(1), Relaxed);
        let n = q.outstanding.fetch_add(1, Relaxed) + 1;
        if self.ctrl.is_some() && n > q.sq_entries as usize {
            self.fatal(fes::PDU_SEQUENCE_ERROR, 0, Bytes::new()).await;
            bail!("host has {n} commands outstanding on a queue of {} entries", q.sq_entries);
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
                return self.fail(cid, st.dnr()).await;
            }
            return self.dispatch(sqe, c.data).await;
        }
        if sqe.is_host_to_ctrl() && s.length > 0 {
            // Data comes later in H2CData PDUs: ask for it with one R2T.
            if s.kind != sgl::TRANSPORT {
                return self.fail(cid, Status::SGL_INVALID_TYPE.dnr()).await;
            }
            if s.length > MAX_TRANSFER {
                return self.fail(cid, Status::INVALID_FIELD.dnr()).await;
            }
            if let (Some(e), true) = (&self.ctrl, self.q.qid > 0 && !sqe.is_fabrics()) {
                if let Some(sub) = &e.subsys {
                    if let Err(st) = io::precheck(sub, &sqe) {
                        return self.fail(cid, st).await;
                    }
                }
            }
            if self.pending.contains_key(&cid) {
                return self.fail(cid, Status::CMDID_CONFLICT.dnr()).await;
            }
            self.pending.insert(cid, Pending { sqe, chunks: Vec::new(), received: 0, total: s.length as usize });
            let _ = self.tx.send(Pdu::R2T(R2t { cid, ttag: cid, offset: 0, length: s.length })).await;
            return Ok(Flow::Continue);
        }
        self.dispatch(sqe, Bytes::new()).await
    }

    async fn fail(&self, cid: u16, st: Status) -> anyhow::Result<Flow> {
        send_completion(&self.tx, &self.q, cid, st, 0, None).await;
        Ok(Flow::Continue)
    }

    async fn h2c_data(&mut self, h: DataPdu) -> anyhow::Result<Flow> {
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
            self.fatal(f, fei, Bytes::new()).await;
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
        self.dispatch(p.sqe, data).await
    }

    /// Run a command whose data (if any) is complete.
    async fn dispatch(&mut self, sqe: Sqe, data: Bytes) -> anyhow::Result<Flow> {
        let cid = sqe.cid();
        let Some(e) = self.ctrl.clone() else {
            if sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT {
                return self.connect(sqe, data).await;
            }
            return self.fail(cid, Status::CMD_SEQ_ERROR).await;
        };
        if sqe.is_fabrics() {
            match sqe.fctype() {
                fctype::CONNECT => return self.fail(cid, Status::CMD_SEQ_ERROR).await,
                fctype::DISCONNECT => {
                    send_completion(&self.tx, &self.q, cid, Status::SUCCESS, 0, None).await;
                    return Ok(Flow::Close);
                }
                _ if self.q.qid > 0 => return self.fail(cid, Status::INVALID_OPCODE.dnr()).await,
                _ => {}
            }
        }
        if self.q.qid == 0 {
            let out = {
                let mut g = e.ctrl.lock().unwrap_or_else(|p| p.into_inner());
                g.execute_admin(&sqe, &data, Instant::now())
            };
            if let AdminOutcome::Complete(Completion { cid, status, result, data }) = out {
                send_completion(&self.tx, &self.q, cid, status, result, data).await;
            }
            return Ok(Flow::Continue);
        }
        let Some(sub) = e.subsys.clone() else { return self.fail(cid, Status::INVALID_OPCODE.dnr()).await };
        if may_block(&sub, &sqe) {
            let (tx, q) = (self.tx.clone(), self.q.clone());
            tokio::spawn(async move {
                let done = tokio::task::spawn_blocking(move || io::execute(&sub, &sqe, &data)).await;
                let IoDone { status, data } = done.unwrap_or(IoDone { status: Status::INTERNAL, data: None });
                send_completion(&tx, &q, cid, status, 0, data).await;
            });
        } else {
            let IoDone { status, data } = io::execute(&sub, &sqe, &data);
            send_completion(&self.tx, &self.q, cid, status, 0, data).await;
        }
        Ok(Flow::Continue)
    }

    async fn connect(&mut self, sqe: Sqe, data: Bytes) -> anyhow::Result<Flow> {
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
                send_completion(&self.tx, &self.q, cid, status, result, None).await;
                return Ok(Flow::Continue);
            }
        };
        // The queue is now bound; its size and flow control are fixed.
        let outstanding = self.q.outstanding.load(Relaxed);
        self.q = Arc::new(QueueInfo {
            qid: c.qid,
            sqflow_disabled: c.cattr & CATTR_DISABLE_SQFLOW != 0,
            sqhd: AtomicU16::new(1 % (c.sqsize + 1)),
            sq_entries: c.sqsize + 1,
            outstanding: AtomicUsize::new(outstanding),
        });
        self.kill = e.killed();
        if c.qid == 0 {
            if let Some(kato) = e.keep_alive.kato() {
                tokio::spawn(keep_alive_timer(self.fabric.clone(), e.clone(), kato));
            }
        }
        log::debug!("nvme: {}: queue {} of controller {} connected (sqsize {})", self.peer, c.qid, e.cntlid, c.sqsize);
        self.ctrl = Some(e.clone());
        send_completion(&self.tx, &self.q, cid, Status::SUCCESS, e.cntlid as u64, None).await;
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
