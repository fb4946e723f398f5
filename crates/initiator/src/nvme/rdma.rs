//! One NVMe/RDMA queue from the host side: a thread of its own owns the
//! RDMA connection (bw-rdma) and an [`RdmaHost`] (command IDs, completions,
//! deadlines); callers hand it commands through a channel and an eventfd
//! that wakes it, and wait for their completion on a oneshot.
//!
//! A write's data goes in the capsule when it fits the controller's
//! in-capsule size (I/O queues), else it is registered where it is and the
//! controller RDMA READs it; a read's buffer is registered for the
//! controller to RDMA WRITE, then copied into the caller's (the caller's
//! buffer is borrowed by a future that may be dropped, so the controller
//! is never pointed at it). Buffers are registered per command: a pool of
//! registered buffers would save that cost.

use super::queue::succeeded;
use crate::{ClientError, ConnectOptions, Result};
use bw_nvme::host_queue::{Done, Payload};
use bw_nvme::queue_entry::{Keyed, Sqe};
use bw_nvme::rdma_host::{Data, RdmaHost};
use bw_nvme::rdma_queue::cm;
use bw_rdma::{BufId, EventKind, Wc};
use bytes::Bytes;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Semaphore};

/// Largest in-capsule data we ever send (the capsule send slots' size).
const INCAPSULE_MAX: usize = 16384;
/// Idle wake-up, to notice a dropped queue.
const TICK: Duration = Duration::from_millis(200);
const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;

fn wr_id(kind: u64, n: u64) -> u64 {
    kind << 56 | n
}

type Reply = oneshot::Sender<std::result::Result<Done, String>>;

struct Submission {
    sqe: Sqe,
    out: Option<Bytes>,
    in_len: u32,
    reply: Reply,
}

struct Shared {
    dead: AtomicBool,
    /// Largest in-capsule data the controller takes (0 until told).
    incapsule: AtomicUsize,
}

pub struct RdmaQueue {
    pub qid: u16,
    tx: mpsc::Sender<Submission>,
    wake: Arc<OwnedFd>,
    shared: Arc<Shared>,
    slots: Semaphore,
    timeout: Duration,
}

fn proto(s: impl Into<String>) -> ClientError {
    ClientError::Protocol(s.into())
}

fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; the fd is owned from here on.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: an 8-byte write to an eventfd we own.
    unsafe { libc::write(fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
}

fn drain(fd: &OwnedFd) {
    let mut v: u64 = 0;
    // SAFETY: an 8-byte read from a non-blocking eventfd we own.
    unsafe { libc::read(fd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
}

impl RdmaQueue {
    /// Resolve, connect (the private data asks for `depth` entries) and
    /// start the queue's thread.
    pub async fn open(host: &str, port: u16, qid: u16, depth: usize, opts: &ConnectOptions) -> Result<RdmaQueue> {
        let depth = depth.clamp(2, bw_nvme::rdma_queue::MAX_ENTRIES as usize) as u16;
        let timeout = opts.timeout;
        let host = host.to_string();
        let started = tokio::task::spawn_blocking(move || Conn::start(&host, port, qid, depth, timeout))
            .await
            .map_err(|e| proto(format!("queue {qid}: {e}")))??;
        let (conn, tx) = started;
        let wake = conn.wake.clone();
        let shared = conn.shared.clone();
        std::thread::Builder::new().name("nvme-rdma-host".into()).spawn(move || conn.run())?;
        Ok(RdmaQueue { qid, tx, wake, shared, slots: Semaphore::new(depth as usize), timeout })
    }

    pub fn set_incapsule(&self, n: usize) {
        self.shared.incapsule.store(n.min(INCAPSULE_MAX), Relaxed);
    }

    pub fn is_dead(&self) -> bool {
        self.shared.dead.load(Relaxed)
    }

    /// Submit one command; `out` goes to the controller, `in_len` bytes
    /// come back in [`Done::data`].
    pub async fn submit_raw(&self, sqe: Sqe, out: Option<Bytes>, in_len: u32) -> Result<Done> {
        let _permit = self.slots.acquire().await.map_err(|_| ClientError::Disconnected("queue closed".into()))?;
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Submission { sqe, out: out.filter(|b| !b.is_empty()), in_len, reply })
            .map_err(|_| ClientError::Disconnected("queue closed".into()))?;
        signal(&self.wake);
        // The queue's own deadline ends it; this one only bounds the wait.
        match tokio::time::timeout(self.timeout + Duration::from_secs(1), rx).await {
            Err(_) => Err(ClientError::Timeout(format!("queue {} command {sqe:?}", self.qid))),
            Ok(Err(_)) => Err(ClientError::Disconnected("queue closed".into())),
            Ok(Ok(Err(why))) => Err(ClientError::Disconnected(why)),
            Ok(Ok(Ok(d))) => Ok(d),
        }
    }

    /// Like [`RdmaQueue::submit_raw`] but an unsuccessful status is an error.
    pub async fn submit(&self, sqe: Sqe, out: Option<Bytes>, in_len: u32) -> Result<Done> {
        succeeded(self.qid, sqe.opcode(), self.submit_raw(sqe, out, in_len).await?)
    }

    pub async fn submit_write(&self, sqe: Sqe, data: Payload<'_>) -> Result<Done> {
        let out = match data {
            Payload::None => None,
            Payload::Owned(b) => Some(b),
            Payload::Borrowed(b) => Some(Bytes::copy_from_slice(b)),
        };
        self.submit(sqe, out, 0).await
    }

    pub async fn submit_read(&self, sqe: Sqe, buf: &mut [u8]) -> Result<Done> {
        let mut d = self.submit(sqe, None, buf.len() as u32).await?;
        let n = d.data.len().min(buf.len());
        buf[..n].copy_from_slice(&d.data[..n]);
        d.received = n;
        d.data = Bytes::new();
        Ok(d)
    }
}

impl Drop for RdmaQueue {
    fn drop(&mut self) {
        // The thread sees the channel closed and disconnects.
        self.shared.dead.store(true, Relaxed);
        signal(&self.wake);
    }
}

/// What a command in flight holds.
struct Pending {
    reply: Reply,
    /// Registered for the controller: the data to send, or the read's buffer.
    buf: Option<BufId>,
    in_len: u32,
}

struct Conn {
    q: bw_rdma::Queue,
    host: RdmaHost<Pending>,
    rx: mpsc::Receiver<Submission>,
    wake: Arc<OwnedFd>,
    shared: Arc<Shared>,
    /// One receive slot per completion the controller may send.
    recv: BufId,
    depth: u16,
    /// One capsule send slot per command ID.
    capsules: BufId,
}

impl Conn {
    fn start(host: &str, port: u16, qid: u16, depth: u16, timeout: Duration) -> Result<(Conn, mpsc::Sender<Submission>)> {
        let io = |e: std::io::Error| ClientError::Io(e);
        let mut q = bw_rdma::Queue::resolve(host, port, depth as u32 * 2, depth as u32, timeout).map_err(io)?;
        let recv = q.register(depth as usize * 64, false).map_err(io)?;
        for i in 0..depth as usize {
            q.post_recv(wr_id(WR_RECV, i as u64), recv, i * 64, 64).map_err(io)?;
        }
        let capsules = q.register(depth as usize * (64 + INCAPSULE_MAX), false).map_err(io)?;
        let req = cm::Request { recfmt: 0, qid, hrqsize: depth, hsqsize: depth - 1, cntlid: 0xFFFF };
        match q.connect(&req.encode(), 16, 16, timeout) {
            Ok(_) => {}
            Err(bw_rdma::ConnectError::Rejected(p)) => {
                let why = cm::parse_reject(&p).map_or_else(|| "no reason".to_string(), |s| format!("status {s}"));
                return Err(ClientError::Target(format!("queue {qid}: connection rejected ({why})")));
            }
            Err(bw_rdma::ConnectError::Io(e)) => return Err(ClientError::Io(e)),
        }
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared { dead: AtomicBool::new(false), incapsule: AtomicUsize::new(0) });
        let conn = Conn { q, host: RdmaHost::new(depth, timeout), rx, wake: Arc::new(eventfd()?), shared, recv, depth, capsules };
        Ok((conn, tx))
    }

    fn run(mut self) {
        let why = self.serve();
        log::debug!("nvme-rdma host queue: {why}");
        self.shared.dead.store(true, Relaxed);
        for p in self.host.drain() {
            let _ = p.reply.send(Err(why.clone()));
        }
        self.q.disconnect();
    }

    fn serve(&mut self) -> String {
        let mut wcs = [Wc::default(); 16];
        let mut armed = false;
        loop {
            drain(&self.wake);
            loop {
                match self.rx.try_recv() {
                    Ok(s) => {
                        if let Err(e) = self.submit(s) {
                            return e;
                        }
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return "queue closed".into(),
                }
            }
            let n = match self.q.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => return format!("poll: {e}"),
            };
            for wc in &wcs[..n] {
                if let Err(e) = self.completion(wc) {
                    return e;
                }
            }
            match self.q.cm_event() {
                Ok(Some(ev)) if matches!(ev.kind, EventKind::Disconnected | EventKind::DeviceRemoval) => return format!("{} from the controller's side", ev.name()),
                Ok(_) => {}
                Err(e) => return format!("connection manager: {e}"),
            }
            if let Err(e) = self.host.check_timeout(Instant::now()) {
                return e.to_string();
            }
            if n > 0 {
                continue;
            }
            if !armed {
                if let Err(e) = self.q.rearm() {
                    return format!("rearm: {e}");
                }
                armed = true;
                continue;
            }
            if let Err(e) = self.q.wait_also(Some(self.wake.as_raw_fd()), TICK) {
                return format!("wait: {e}");
            }
            armed = false;
        }
    }

    fn submit(&mut self, s: Submission) -> std::result::Result<(), String> {
        let Submission { sqe, out, in_len, reply } = s;
        let incapsule = self.shared.incapsule.load(Relaxed);
        let (data, buf, inline) = match &out {
            Some(b) if b.len() <= incapsule => (Data::InCapsule(b.len() as u32), None, Some(b.clone())),
            Some(b) => {
                let len = b.len() as u32;
                let buf = self.q.register_bytes(b.clone(), true).map_err(|e| format!("registering write data: {e}"))?;
                (Data::Keyed(self.keyed(buf, len)?), Some(buf), None)
            }
            None if in_len > 0 => {
                let buf = self.q.register(in_len as usize, true).map_err(|e| format!("registering a read buffer: {e}"))?;
                (Data::Keyed(self.keyed(buf, in_len)?), Some(buf), None)
            }
            None => (Data::None, None, None),
        };
        let (cid, sqe) = match self.host.submit(sqe, data, Pending { reply, buf, in_len }, Instant::now()) {
            Ok(x) => x,
            Err(e) => {
                // Cannot happen while callers hold one of `depth` permits.
                if let Some(b) = buf {
                    self.q.release(b);
                }
                return Err(e.to_string());
            }
        };
        let slot = cid as usize * (64 + INCAPSULE_MAX);
        let inline = inline.unwrap_or_default();
        if let Some(b) = self.q.buf_mut(self.capsules) {
            b[slot..slot + 64].copy_from_slice(&sqe.0);
            b[slot + 64..slot + 64 + inline.len()].copy_from_slice(&inline);
        }
        self.q.post_send(wr_id(WR_SEND, cid as u64), self.capsules, slot, 64 + inline.len(), None, true).map_err(|e| format!("SEND: {e}"))
    }

    fn keyed(&self, buf: BufId, length: u32) -> std::result::Result<Keyed, String> {
        let (addr, key) = self.q.remote_key(buf).map_err(|e| e.to_string())?;
        Ok(Keyed { addr, length, key, invalidate: false })
    }

    fn completion(&mut self, wc: &Wc) -> std::result::Result<(), String> {
        if !wc.ok() {
            return Err(format!("work request failed: {}", wc.status_str()));
        }
        if wc.wr_id >> 56 != WR_RECV {
            return Ok(());
        }
        let slot = (wc.wr_id & 0xFFFF) as usize;
        if slot >= self.depth as usize || (wc.byte_len as usize) < bw_nvme::Cqe::LEN {
            return Err(format!("a {}-byte completion", wc.byte_len));
        }
        let off = slot * 64;
        let r = self.host.completion(&self.q.buf(self.recv)[off..off + 16]);
        self.q.post_recv(wc.wr_id, self.recv, off, 64).map_err(|e| format!("RECV: {e}"))?;
        let (cqe, p) = r.map_err(|e| e.to_string())?;
        let Some(p) = p else { return Ok(()) };
        let data = p.buf.and_then(|b| self.q.release(b)).map(|mut v| {
            v.truncate(p.in_len as usize);
            Bytes::from(v)
        });
        let data = if p.in_len > 0 { data.unwrap_or_default() } else { Bytes::new() };
        let received = data.len();
        let _ = p.reply.send(Ok(Done { cqe, data, received }));
        Ok(())
    }
}
