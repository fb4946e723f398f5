//! One NVMe/TCP queue from the host side: a TCP connection with a writer
//! task, a reader task that routes C2HData / R2T / CapsuleResp to the
//! command they belong to, and command-ID multiplexing so many commands are
//! in flight at once. Read data goes straight from the socket into the
//! caller's buffer when no data digest is in use (one copy, no staging).

use crate::{ClientError, Result};
use bw_nvme::command::{sgl, Cqe, Sgl, Sqe};
use bw_nvme::pdu::{self, DataPdu, Digests, IcReq, Pdu};
use bytes::{Buf, Bytes, BytesMut};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// A finished command: completion entry and the data the controller sent
/// (`data` is empty when it went into the caller's buffer; `received`
/// counts it either way).
pub struct Done {
    pub cqe: Cqe,
    pub data: Bytes,
    pub received: usize,
}

/// The caller's buffer for a read, filled in place by the reader task. Only
/// touched with the inflight lock held; the submitting future takes it out
/// under the same lock before the buffer can go away (also when dropped).
struct Dest {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a Dest is only dereferenced under the inflight lock while the
// buffer it points to is borrowed by the (still live) submitting future.
unsafe impl Send for Dest {}

impl Dest {
    /// The buffer from `off` to its end.
    ///
    /// SAFETY: the caller holds the inflight lock and the Dest is still
    /// registered, so the buffer is alive and nobody else touches it.
    unsafe fn tail(&mut self, off: usize) -> &mut [u8] {
        std::slice::from_raw_parts_mut(self.ptr.add(off), self.len - off)
    }
}

struct Inflight {
    done: oneshot::Sender<Result<Done>>,
    chunks: Vec<Bytes>,
    received: usize,
    /// Data to send when the controller asks for it with R2T.
    write_data: Option<Bytes>,
    dest: Option<Dest>,
}

/// Unregisters a read's destination buffer when the submitting future ends,
/// however it ends.
struct DestGuard<'a> {
    shared: &'a Shared,
    cid: u16,
}

impl Drop for DestGuard<'_> {
    fn drop(&mut self) {
        let mut m = self.shared.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = m.get_mut(&self.cid) {
            f.dest = None;
        }
    }
}

struct Shared {
    inflight: Mutex<HashMap<u16, Inflight>>,
    /// Capsules encoded by the submitting tasks, waiting for the writer.
    out: Mutex<Vec<u8>>,
    /// Tells the writer `out` has something.
    wake: tokio::sync::Notify,
    free_cids: Mutex<Vec<u16>>,
    /// Set when the connection died: why.
    dead: Mutex<Option<String>>,
}

impl Shared {
    fn fail_all(&self, why: &str) {
        if let Ok(mut d) = self.dead.lock() {
            d.get_or_insert_with(|| why.to_string());
        }
        let all: Vec<Inflight> = match self.inflight.lock() {
            Ok(mut m) => m.drain().map(|(_, v)| v).collect(),
            Err(_) => Vec::new(),
        };
        for f in all {
            let _ = f.done.send(Err(ClientError::Disconnected(why.to_string())));
        }
    }
}

pub struct Queue {
    pub qid: u16,
    digests: Digests,
    shared: Arc<Shared>,
    slots: Semaphore,
    /// Largest in-capsule data this queue accepts.
    pub incapsule: usize,
    timeout: Duration,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn proto(s: impl Into<String>) -> ClientError {
    ClientError::Protocol(s.into())
}

impl Queue {
    /// TCP connect and the ICReq/ICResp exchange. `depth` commands may be in
    /// flight at once (the caller connects with sqsize = depth - 1... or more).
    pub async fn open(host: &str, port: u16, qid: u16, digests: Digests, depth: usize, timeout: Duration) -> Result<Queue> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect((host, port)))
            .await
            .map_err(|_| ClientError::Timeout(format!("connecting to {host}:{port}")))??;
        stream.set_nodelay(true)?;
        let (mut rd, mut wr) = stream.into_split();
        let ic = Pdu::IcReq(IcReq { pfv: 0, hpda: 0, digests, maxr2t: 0 });
        wr.write_all(&ic.encode_parts(Digests::default()).concat()).await?;
        let mut buf = BytesMut::with_capacity(256 * 1024);
        let resp = tokio::time::timeout(timeout, async {
            loop {
                if let Some(p) = pdu::decode(&mut buf, Digests::default(), 4096).map_err(|e| proto(e.to_string()))? {
                    return Ok::<Pdu, ClientError>(p);
                }
                if rd.read_buf(&mut buf).await? == 0 {
                    return Err(ClientError::Disconnected("connection closed during ICReq".into()));
                }
            }
        })
        .await
        .map_err(|_| ClientError::Timeout("ICResp".into()))??;
        let maxh2cdata = match resp {
            Pdu::IcResp(r) => {
                if r.pfv != 0 || r.cpda != 0 {
                    return Err(proto(format!("ICResp: unsupported pfv {} / cpda {}", r.pfv, r.cpda)));
                }
                if r.digests != digests {
                    return Err(proto(format!("ICResp: digests {:?}, asked for {:?}", r.digests, digests)));
                }
                if r.maxh2cdata < 4096 || r.maxh2cdata % 4 != 0 {
                    return Err(proto(format!("ICResp: invalid MAXH2CDATA {}", r.maxh2cdata)));
                }
                r.maxh2cdata
            }
            Pdu::C2HTermReq(t) => return Err(proto(format!("target terminated the connection: FES {:#x}", t.fes))),
            other => return Err(proto(format!("expected ICResp, got PDU type {:#04x}", other.kind()))),
        };
        let depth = depth.clamp(1, 65535);
        let shared = Arc::new(Shared {
            inflight: Mutex::new(HashMap::new()),
            out: Mutex::new(Vec::with_capacity(64 * 1024)),
            wake: tokio::sync::Notify::new(),
            free_cids: Mutex::new((0..depth as u16).rev().collect()),
            dead: Mutex::new(None),
        });
        // H2CData PDUs (answers to R2Ts) go from the reader to the writer
        // through this channel; capsules through `Shared::out`.
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(write_loop(wr, rx, shared.clone(), digests));
        let reader = tokio::spawn(read_loop(rd, buf, digests, shared.clone(), tx, maxh2cdata as usize));
        Ok(Queue { qid, digests, shared, slots: Semaphore::new(depth), incapsule: 8192, timeout, reader })
    }

    /// Submit one command. `out` is data for the controller: sent in the
    /// capsule when it fits, else on R2T. Returns the completion and any
    /// data the controller sent; an error status becomes `ClientError::Target`
    /// unless `raw` is set.
    pub async fn submit_raw(&self, sqe: Sqe, out: Option<Bytes>, in_len: u32) -> Result<Done> {
        let payload = match out {
            Some(b) => Payload::Owned(b),
            None => Payload::None,
        };
        self.submit_inner(sqe, payload, in_len, None).await
    }

    /// Submit a command that writes `data` (copied once: into the capsule,
    /// or to a buffer for R2T); an unsuccessful status is an error.
    pub async fn submit_write(&self, sqe: Sqe, data: &[u8]) -> Result<Done> {
        let op = sqe.opcode();
        self.succeeded(op, self.submit_inner(sqe, Payload::Borrowed(data), 0, None).await?)
    }

    /// Submit a command that reads `buf.len()` bytes into `buf`; an
    /// unsuccessful status is an error.
    pub async fn submit_read(&self, sqe: Sqe, buf: &mut [u8]) -> Result<Done> {
        let op = sqe.opcode();
        let dest = Dest { ptr: buf.as_mut_ptr(), len: buf.len() };
        self.succeeded(op, self.submit_inner(sqe, Payload::None, buf.len() as u32, Some(dest)).await?)
    }

    /// `d`, or an error naming the queue and opcode if its status is not success.
    fn succeeded(&self, op: u8, d: Done) -> Result<Done> {
        if !d.cqe.status.is_success() {
            return Err(ClientError::Target(format!("queue {} opcode {op:#04x}: {}", self.qid, d.cqe.status)));
        }
        Ok(d)
    }

    async fn submit_inner(&self, mut sqe: Sqe, out: Payload<'_>, in_len: u32, dest: Option<Dest>) -> Result<Done> {
        if let Some(why) = self.shared.dead.lock().ok().and_then(|d| d.clone()) {
            return Err(ClientError::Disconnected(why));
        }
        let _permit = self.slots.acquire().await.map_err(|_| ClientError::Disconnected("queue closed".into()))?;
        let cid = self
            .shared
            .free_cids
            .lock()
            .ok()
            .and_then(|mut f| f.pop())
            .ok_or_else(|| proto("no free command id"))?;
        sqe.set_cid(cid);
        let (done_tx, done_rx) = oneshot::channel();
        let mut capsule_data: &[u8] = &[];
        let mut write_data = None;
        match out.bytes() {
            Some(d) if d.len() <= self.incapsule => {
                sqe.set_sgl(Sgl { addr: 0, length: d.len() as u32, kind: sgl::INCAPSULE });
                capsule_data = d;
            }
            Some(d) => {
                sqe.set_sgl(Sgl { addr: 0, length: d.len() as u32, kind: sgl::TRANSPORT });
                // Kept until the controller asks for it with R2T.
                write_data = Some(match &out {
                    Payload::Owned(b) => b.clone(),
                    _ => Bytes::copy_from_slice(d),
                });
            }
            None => sqe.set_sgl(Sgl { addr: 0, length: in_len, kind: sgl::TRANSPORT }),
        }
        let guard = dest.is_some().then_some(DestGuard { shared: &self.shared, cid });
        if let Ok(mut m) = self.shared.inflight.lock() {
            m.insert(cid, Inflight { done: done_tx, chunks: Vec::new(), received: 0, write_data, dest });
        }
        pdu::encode_capsule(&sqe, capsule_data, self.digests, &mut self.shared.out.lock().unwrap_or_else(|p| p.into_inner()));
        self.shared.wake.notify_one();
        // A writer or reader that died before the command was registered
        // would never complete it. (One that died after completing it, as
        // when a target answers and then closes, has left the result.)
        let dead = self.shared.dead.lock().ok().and_then(|d| d.clone());
        let mut done_rx = done_rx;
        let r = if let Some(why) = dead {
            done_rx.try_recv().unwrap_or(Err(ClientError::Disconnected(why)))
        } else {
            match tokio::time::timeout(self.timeout, done_rx).await {
                Ok(Ok(r)) => r,
                Ok(Err(_)) => Err(ClientError::Disconnected("queue closed".into())),
                Err(_) => {
                    // The command may still complete later; its CID stays
                    // retired so a late reply cannot be taken for another.
                    self.shared.fail_all("command timed out");
                    return Err(ClientError::Timeout(format!("queue {} command {:?}", self.qid, sqe)));
                }
            }
        };
        drop(guard);
        if let Ok(mut m) = self.shared.inflight.lock() {
            m.remove(&cid);
        }
        if let Ok(mut f) = self.shared.free_cids.lock() {
            f.push(cid);
        }
        r
    }

    /// Like [`Queue::submit_raw`] but an unsuccessful status is an error.
    pub async fn submit(&self, sqe: Sqe, out: Option<Bytes>, in_len: u32) -> Result<Done> {
        let op = sqe.opcode();
        self.succeeded(op, self.submit_raw(sqe, out, in_len).await?)
    }

    pub fn is_dead(&self) -> bool {
        self.shared.dead.lock().map(|d| d.is_some()).unwrap_or(true)
    }
}

/// Data a command sends to the controller.
enum Payload<'a> {
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

/// Payloads at least this long are written from where they are rather than
/// copied into the batch buffer.
const WRITE_DIRECT_MIN: usize = 64 * 1024;

async fn write_loop(mut wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Pdu>, sh: Arc<Shared>, d: Digests) {
    let mut batch: Vec<u8> = Vec::with_capacity(64 * 1024);
    loop {
        let mut next = tokio::select! {
            _ = sh.wake.notified() => None,
            p = rx.recv() => match p {
                Some(p) => Some(p),
                // The reader is gone: the connection is over.
                None => break,
            },
        };
        // Let the other ready tasks (callers woken by the completions just
        // read) submit first, so one send carries many capsules: the
        // scheduler would otherwise run this task right after each submit.
        tokio::task::yield_now().await;
        std::mem::swap(&mut *sh.out.lock().unwrap_or_else(|p| p.into_inner()), &mut batch);
        while let Some(p) = next.take().or_else(|| rx.try_recv().ok()) {
            let payload = match &p {
                Pdu::CapsuleCmd(c) => c.data.len(),
                Pdu::H2CData(h) => h.data.len(),
                _ => 0,
            };
            if payload < WRITE_DIRECT_MIN {
                p.encode_into(d, &mut batch);
                continue;
            }
            let e = p.encode_parts(d);
            batch.extend_from_slice(&e.head);
            if wr.write_all(&batch).await.is_err() || wr.write_all(&e.data).await.is_err() {
                sh.fail_all("send failed");
                return;
            }
            batch.clear();
            if let Some(dd) = e.ddgst {
                batch.extend_from_slice(&dd);
            }
        }
        if !batch.is_empty() && wr.write_all(&batch).await.is_err() {
            sh.fail_all("send failed");
            return;
        }
        batch.clear();
        if batch.capacity() > 1 << 20 {
            batch = Vec::with_capacity(64 * 1024);
        }
    }
    let _ = wr.shutdown().await;
}

/// Largest PDU we accept from a target.
const MAX_PLEN: u32 = (8 << 20) + 256;
/// Without data digests, socket reads stop at this many bytes so that little
/// of a large read's payload lands in the staging buffer (it goes straight
/// to the caller's buffer instead).
const READ_CHUNK: u64 = 64 * 1024;

/// Most bytes a payload read waits for before the socket wakes us.
const RCVLOWAT_MAX: usize = 256 * 1024;

fn set_rcvlowat(rd: &OwnedReadHalf, n: usize) {
    let v = n as libc::c_int;
    // SAFETY: a valid fd and a c_int option value of the right size.
    unsafe {
        libc::setsockopt(rd.as_ref().as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVLOWAT, &v as *const _ as *const libc::c_void, std::mem::size_of::<libc::c_int>() as libc::socklen_t);
    }
}

/// Is there a read buffer waiting for this C2HData payload, at this offset?
fn wants_direct(sh: &Shared, v: &pdu::DataHeaderView) -> bool {
    let m = sh.inflight.lock().unwrap_or_else(|p| p.into_inner());
    m.get(&v.hdr.cid).is_some_and(|f| {
        f.dest.as_ref().is_some_and(|dst| v.hdr.offset as usize == f.received && f.received + v.data_len <= dst.len)
    })
}

/// Move a C2HData payload whose header `v` starts `buf` into its command's
/// buffer: first what is already buffered, then straight from the socket.
async fn recv_direct(rd: &mut OwnedReadHalf, buf: &mut BytesMut, sh: &Shared, v: &pdu::DataHeaderView) -> std::result::Result<(), String> {
    let (cid, base, total) = (v.hdr.cid, v.hdr.offset as usize, v.data_len);
    buf.advance(v.data_start);
    let mut got = buf.len().min(total);
    {
        let mut m = sh.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dst) = m.get_mut(&cid).and_then(|f| f.dest.as_mut()) {
            // SAFETY: lock held, Dest registered; wants_direct checked bounds.
            unsafe { dst.tail(base)[..got].copy_from_slice(&buf[..got]) };
        }
    }
    buf.advance(got);
    let mut scratch = Vec::new();
    let mut lowat = 1;
    while got < total {
        rd.readable().await.map_err(|e| format!("receive failed: {e}"))?;
        let r = {
            let mut m = sh.inflight.lock().unwrap_or_else(|p| p.into_inner());
            match m.get_mut(&cid).and_then(|f| f.dest.as_mut()) {
                // SAFETY: as above; the lock is held across the read.
                Some(dst) => rd.try_read(unsafe { &mut dst.tail(base + got)[..total - got] }),
                None => {
                    // The caller gave up on this command: drop its data.
                    scratch.resize((total - got).min(64 * 1024), 0);
                    rd.try_read(&mut scratch)
                }
            }
        };
        match r {
            Ok(0) => return Err("target closed the connection".into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let want = (total - got).min(RCVLOWAT_MAX);
                if want != lowat {
                    set_rcvlowat(rd, want);
                    lowat = want;
                }
            }
            Err(e) => return Err(format!("receive failed: {e}")),
        }
    }
    if lowat != 1 {
        set_rcvlowat(rd, 1);
    }
    if let Some(f) = sh.inflight.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&cid) {
        f.received += total;
    }
    Ok(())
}

async fn read_loop(mut rd: OwnedReadHalf, mut buf: BytesMut, d: Digests, sh: Arc<Shared>, tx: mpsc::Sender<Pdu>, maxh2cdata: usize) {
    // After a large payload went straight to its buffer, the next read takes
    // just a data PDU header: the next large payload then follows it
    // straight to its buffer too instead of partly into `buf`.
    let hdr_len = (pdu::DATA_HLEN + if d.header { pdu::DIGEST_LEN } else { 0 }) as u64;
    let mut header_only = false;
    let why = loop {
        if !d.data {
            match pdu::peek_data_header(&buf, d, MAX_PLEN) {
                Err(e) => break format!("malformed PDU from target: {e}"),
                Ok(Some(v)) if v.kind == pdu::kind::C2H_DATA && wants_direct(&sh, &v) => {
                    if let Err(why) = recv_direct(&mut rd, &mut buf, &sh, &v).await {
                        break why;
                    }
                    header_only = v.data_len >= READ_CHUNK as usize;
                    if v.hdr.success {
                        if !v.hdr.last {
                            break "C2HData with SUCCESS but not LAST".into();
                        }
                        finish(&sh, v.hdr.cid, Ok(Cqe { cid: v.hdr.cid, ..Default::default() }));
                    }
                    continue;
                }
                Ok(_) => {}
            }
        }
        // A data PDU's header still incomplete: read on without decode()
        // reserving room for the whole payload.
        let hdr_need = if buf.len() >= pdu::CH_LEN { (buf[3] as usize).max(pdu::DATA_HLEN) } else { pdu::CH_LEN };
        let partial_data_header = !d.data && buf.first() == Some(&pdu::kind::C2H_DATA) && buf.len() < hdr_need;
        let p = match if partial_data_header { Ok(None) } else { pdu::decode(&mut buf, d, MAX_PLEN) } {
            Ok(Some(p)) => p,
            Ok(None) => {
                // See the target's reader: grow only when full.
                if buf.capacity() == buf.len() {
                    buf.reserve(64 * 1024);
                }
                let limit = if header_only { hdr_len.saturating_sub(buf.len() as u64).max(1) } else { READ_CHUNK };
                header_only = false;
                let r = if d.data { rd.read_buf(&mut buf).await } else { (&mut rd).take(limit).read_buf(&mut buf).await };
                match r {
                    Ok(0) => break "target closed the connection".to_string(),
                    Ok(_) => continue,
                    Err(e) => break format!("receive failed: {e}"),
                }
            }
            Err(e) => break format!("malformed PDU from target: {e}"),
        };
        match p {
            Pdu::CapsuleResp(cqe) => finish(&sh, cqe.cid, Ok(cqe)),
            Pdu::C2HData(dp) => {
                let mut bad = None;
                if let Ok(mut m) = sh.inflight.lock() {
                    match m.get_mut(&dp.cid) {
                        Some(f) if dp.offset as usize == f.received => {
                            let n = dp.data.len();
                            match f.dest.as_mut() {
                                // SAFETY: lock held, Dest registered.
                                Some(dst) if f.received + n <= dst.len => unsafe { dst.tail(f.received)[..n].copy_from_slice(&dp.data) },
                                Some(_) => bad = Some(format!("C2HData for command {} runs past the end of its buffer", dp.cid)),
                                None => f.chunks.push(dp.data),
                            }
                            f.received += n;
                        }
                        Some(_) => bad = Some(format!("C2HData for command {} at unexpected offset {}", dp.cid, dp.offset)),
                        None => bad = Some(format!("C2HData for unknown command {}", dp.cid)),
                    }
                }
                if let Some(b) = bad {
                    break b;
                }
                if dp.success {
                    if !dp.last {
                        break "C2HData with SUCCESS but not LAST".into();
                    }
                    finish(&sh, dp.cid, Ok(Cqe { cid: dp.cid, ..Default::default() }));
                }
            }
            Pdu::R2T(r) => {
                let data = sh.inflight.lock().ok().and_then(|m| m.get(&r.cid).and_then(|f| f.write_data.clone()));
                let Some(data) = data else { break format!("R2T for unknown command {}", r.cid) };
                let (off, len) = (r.offset as usize, r.length as usize);
                if len == 0 || off + len > data.len() {
                    break format!("R2T offset {off} length {len} outside the {}-byte transfer", data.len());
                }
                // One R2T may ask for more than one H2CData PDU may carry.
                let mut sent = 0;
                while sent < len {
                    let n = (len - sent).min(maxh2cdata);
                    let p = Pdu::H2CData(DataPdu {
                        cid: r.cid,
                        ttag: r.ttag,
                        offset: (off + sent) as u32,
                        last: sent + n == len,
                        success: false,
                        data: data.slice(off + sent..off + sent + n),
                    });
                    if tx.send(p).await.is_err() {
                        break;
                    }
                    sent += n;
                }
            }
            Pdu::C2HTermReq(t) => break format!("target terminated the connection: FES {:#x} FEI {}", t.fes, t.fei),
            other => break format!("unexpected PDU type {:#04x} from target", other.kind()),
        }
    };
    log::debug!("nvme queue reader: {why}");
    sh.fail_all(&why);
}

fn finish(sh: &Shared, cid: u16, r: std::result::Result<Cqe, ClientError>) {
    let f = sh.inflight.lock().ok().and_then(|mut m| m.remove(&cid));
    if let Some(f) = f {
        let out = r.map(|cqe| {
            let data = if f.chunks.len() == 1 {
                f.chunks.into_iter().next().unwrap_or_default()
            } else {
                let mut all = BytesMut::with_capacity(f.received);
                for c in f.chunks {
                    all.extend_from_slice(&c);
                }
                all.freeze()
            };
            Done { cqe, data, received: f.received }
        });
        let _ = f.done.send(out);
    }
}
