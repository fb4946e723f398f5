//! NVMe/RDMA: the verbs around [`RdmaQueue`] in the one NVMe queue
//! wrapper ([`Queue`]), as `tcp.rs` is the socket around NVMe/TCP's queue.
//! Controllers, subsystems and allowed hosts are the same [`Fabric`] as
//! NVMe/TCP's; this file is the transport's I/O: the connection manager,
//! the queue pair's RECVs, SENDs and RDMA transfers, and commands run on
//! the queue's thread.
//!
//! One thread per listener takes connect requests: a request whose private
//! data asks for a queue we do not offer is rejected with the reason, one
//! over the admission limits (connections per address, connections not
//! logged in yet: `[limits]`, as NVMe/TCP's) with "no resources";
//! otherwise the connection gets its queue pair, one posted RECV per
//! submission queue entry (a command capsule each), and a thread of its
//! own, which sleeps on its completion channel and connection-manager
//! channel together. Commands run on that thread (volume I/O included):
//! an RDMA queue is one host CPU's queue, as a TCP connection is.
//!
//! Data moves through buffers registered per transfer: a write's data is
//! RDMA READ into a fresh buffer that becomes the command's data, a read's
//! result is registered as it is and RDMA WRITTEN from there. (A pool of
//! registered buffers would save the registration per command; this is
//! the plain version.) Every work request is signaled, so a buffer is
//! released when its transfer completes and a completion slot when its
//! SEND does.
//!
//! A failed work completion (the host's key or address refused, the host
//! gone) puts the queue pair in its error state: that queue closes, its
//! controller too if it was the admin queue, and other queues go on.

use super::fabric::Fabric;
use super::link::Link;
use super::queue::{Finished, Io, Queue, Transport};
use crate::limits::Admission;
use crate::metrics;
use crate::Shutdown;
use anyhow::{anyhow, Context};
use bw_nvme::auth::Entropy;
use bw_nvme::fabric_queue::Connected;
use bw_nvme::nvm_io as io;
use bw_nvme::queue_entry::Sqe;
use bw_nvme::rdma_queue::{cm, Action, Post, RdmaQueue, RdmaQueueError, CAPSULE_LEN};
use bw_nvme::Status;
use bw_rdma::{BufId, EventKind, Listener, Remote, Request, Wc};
use bytes::Bytes;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often threads look at shutdown and controller teardown while idle.
const TICK: Duration = Duration::from_millis(100);

/// Work request kinds, in the top byte of the work request ID.
const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;
const WR_READ: u64 = 3;
const WR_WRITE: u64 = 4;

fn wr_id(kind: u64, n: u64) -> u64 {
    kind << 56 | (n & ((1 << 56) - 1))
}

/// Listen on `addr` (an address of an RDMA device's network interface);
/// returns the listener and the address it is bound to (the port chosen
/// when `addr` asks for port 0).
pub fn bind(addr: SocketAddr) -> anyhow::Result<(Listener, SocketAddr)> {
    let l = Listener::bind(&addr.ip().to_string(), addr.port(), 128).with_context(|| format!("NVMe/RDMA listen on {addr} (is there an RDMA device on it?)"))?;
    let bound = SocketAddr::new(addr.ip(), l.port());
    Ok((l, bound))
}

/// Take connect requests on `l` in a thread of its own, which ends at
/// shutdown; `admission` is the RDMA front-end's (one for all its listeners).
pub fn serve(mut l: Listener, fabric: Arc<Fabric>, admission: Arc<Admission>, shutdown: Shutdown) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let login_timeout = admission.limits().login_timeout();
    let t = std::thread::Builder::new().name("nvme-rdma-cm".into()).spawn(move || {
        while !shutdown.is_set() {
            match l.request(TICK) {
                Ok(Some(r)) => accept(r, &fabric, &admission, login_timeout, &shutdown),
                Ok(None) => {}
                Err(e) => {
                    log::error!("nvme-rdma: connection manager: {e}");
                    std::thread::sleep(TICK);
                }
            }
        }
    })?;
    Ok(t)
}

fn accept(r: Request, fabric: &Arc<Fabric>, admission: &Arc<Admission>, login_timeout: Duration, shutdown: &Shutdown) {
    let shape = match cm::check_request(&r.private_data) {
        Ok(s) => s,
        Err(sts) => {
            log::info!("nvme-rdma: {}: connect request refused (reject status {sts})", r.peer);
            let _ = r.reject(&cm::reject(sts));
            return;
        }
    };
    // The limits NVMe/TCP's accept loop applies to a new connection: how
    // many one address may hold, how many may be waiting for their Connect.
    let ip = r.peer.parse::<IpAddr>().unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    let ticket = match admission.admit(ip) {
        Ok(t) => t,
        Err(why) => {
            log::warn!("nvme-rdma: {}: connect request refused: {why}", r.peer);
            let _ = r.reject(&cm::reject(cm::reject::NO_RESOURCES));
            return;
        }
    };
    let peer = r.peer.clone();
    // The request's values are from our side already (the kernel swaps
    // them): RDMA READs we may have in flight (the host's responder
    // resources), and those we answer.
    let (responder, initiator) = (r.responder_resources, r.initiator_depth);
    let entries = shape.sq_entries as u32;
    // Per command at most one READ, one WRITE and one SEND, and a SEND's
    // completion may come after its command's slot is reused: room for two.
    let started = r.into_queue(entries * 6, entries).and_then(|mut q| {
        let recv = q.register(entries as usize * CAPSULE_LEN, false)?;
        for slot in 0..entries as usize {
            q.post_recv(wr_id(WR_RECV, slot as u64), recv, slot * CAPSULE_LEN, CAPSULE_LEN)?;
        }
        let cqes = q.register(2 * entries as usize * 16, false)?;
        q.accept(&cm::accept(shape.sq_entries), responder, initiator)?;
        Ok((q, recv, cqes))
    });
    let (qp, recv, cqes) = match started {
        Ok(x) => x,
        Err(e) => {
            log::warn!("nvme-rdma: {peer}: cannot accept: {e}");
            return;
        }
    };
    let rdma = Rdma {
        rq: RdmaQueue::new(shape, Instant::now() + login_timeout),
        qp,
        // (Its port is not the CM's: the address alone, for `session_list`.)
        peer: peer.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 0)),
        recv,
        cqes,
        free_cqes: (0..2 * entries as usize).collect(),
        transfers: HashMap::new(),
        next_transfer: 0,
        posts: Vec::new(),
    };
    let mut c = Queue::new(Link::new(fabric.clone(), "nvme-rdma", peer.clone()), rdma, ticket);
    let shutdown = shutdown.clone();
    let spawned = std::thread::Builder::new().name("nvme-rdma-q".into()).spawn(move || {
        let _conn = metrics::global().connection(metrics::Proto::Nvme);
        let r = c.drive(&shutdown);
        c.close();
        c.t.qp.disconnect();
        match r {
            Ok(()) => log::debug!("nvme-rdma: {}: queue {} closed", c.link.peer, c.t.rq.qid()),
            Err(e) => log::info!("nvme-rdma: {}: queue {} of controller {} closed: {e:#}", c.link.peer, c.t.rq.qid(), c.t.rq.cntlid()),
        }
    });
    if let Err(e) = spawned {
        log::warn!("nvme-rdma: {peer}: no thread for the queue: {e}");
    }
}

/// A transfer in flight: the buffer it uses, and for a fetch the command.
struct Transfer {
    buf: BufId,
    fetch_for: Option<u16>,
}

/// NVMe/RDMA's I/O under the queue wrapper.
pub struct Rdma {
    rq: RdmaQueue,
    qp: bw_rdma::Queue,
    peer: Option<SocketAddr>,
    /// One receive slot of CAPSULE_LEN bytes per submission queue entry.
    recv: BufId,
    /// 16-byte completion slots for SENDs, and the free ones.
    cqes: BufId,
    free_cqes: Vec<usize>,
    transfers: HashMap<u64, Transfer>,
    next_transfer: u64,
    /// What the queue asked to post, in order.
    posts: Vec<Post>,
}

type End = anyhow::Result<()>;

impl Queue<Rdma> {
    /// Run the queue until it ends, the controller is torn down or the
    /// target shuts down.
    fn drive(&mut self, shutdown: &Shutdown) -> End {
        let mut wcs = [Wc::default(); 16];
        let mut armed = false;
        loop {
            if shutdown.is_set() || self.killed() {
                return Ok(());
            }
            let n = self.t.qp.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                if let Some(end) = self.completion(wc) {
                    return self.end(end);
                }
            }
            self.link.timed();
            self.t.post()?;
            while let Some(ev) = self.t.qp.cm_event()? {
                match ev.kind {
                    EventKind::Established => log::debug!("nvme-rdma: {}: queue {} established", self.link.peer, self.t.rq.qid()),
                    EventKind::Disconnected | EventKind::DeviceRemoval => return Err(anyhow!("{} from the host's side", ev.name())),
                    _ => {}
                }
            }
            self.send_events();
            let now = Instant::now();
            if self.t.rq.poll_timeout().is_some_and(|t| now >= t) {
                if let Some(end) = self.t.rq.handle_timeout(now).and_then(|a| self.act(a)) {
                    return self.end(end);
                }
            }
            self.t.post()?;
            if n > 0 {
                continue;
            }
            // Empty: ask to be woken, look once more (a completion may have
            // come in between), then sleep.
            if !armed {
                self.t.qp.rearm()?;
                armed = true;
                continue;
            }
            let wait = self.t.rq.poll_timeout().map_or(TICK, |t| t.saturating_duration_since(now).min(TICK));
            self.t.qp.wait(wait)?;
            armed = false;
        }
    }

    /// The queue ends: post what it queued last (a Disconnect's
    /// completion, an authentication's failure) first.
    fn end(&mut self, end: End) -> End {
        let posted = self.t.post();
        end.and(posted)
    }

    /// One work completion; `Some` ends the queue.
    fn completion(&mut self, wc: &Wc) -> Option<End> {
        let (kind, n) = (wc.wr_id >> 56, wc.wr_id & ((1 << 56) - 1));
        if !wc.ok() {
            let what = match kind {
                WR_RECV => "RECV",
                WR_SEND => "SEND",
                WR_READ => "RDMA READ",
                _ => "RDMA WRITE",
            };
            return Some(Err(anyhow!("{what} failed: {}", wc.status_str())));
        }
        self.now = Instant::now();
        let t = &mut self.t;
        let a = match kind {
            WR_RECV => {
                let off = n as usize * CAPSULE_LEN;
                let len = (wc.byte_len as usize).min(CAPSULE_LEN);
                let capsule = &t.qp.buf(t.recv)[off..off + len];
                let a = t.rq.capsule(capsule, self.now, &mut t.posts);
                // The capsule was copied out: the slot takes the next one.
                if let Err(e) = t.qp.post_recv(wc.wr_id, t.recv, off, CAPSULE_LEN) {
                    return Some(Err(anyhow!("RECV: {e}")));
                }
                a
            }
            WR_SEND => {
                t.free_cqes.push(n as usize);
                None
            }
            _ => {
                let tr = t.transfers.remove(&n)?;
                let data = t.qp.release(tr.buf);
                let cid = tr.fetch_for?;
                t.rq.fetched(cid, Bytes::from(data.unwrap_or_default()), &mut t.posts)
            }
        };
        a.and_then(|a| self.act(a))
    }
}

impl Transport for Rdma {
    type Error = RdmaQueueError;
    const KEYED_SGLS: bool = true;

    fn qid(&self) -> u16 {
        self.rq.qid()
    }
    fn local(&self) -> Option<SocketAddr> {
        None
    }
    fn peer(&self) -> Option<SocketAddr> {
        self.peer
    }
    fn connected(&mut self, cid: u16, c: Connected, now: Instant) {
        self.rq.connected(cid, c, now, &mut self.posts);
    }
    fn connect_refused(&mut self, cid: u16, status: Status, result: u64) {
        self.rq.connect_refused(cid, status, result, &mut self.posts);
    }
    fn auth_send(&mut self, sqe: &Sqe, data: &[u8], entropy: Entropy) -> Option<Action> {
        self.rq.auth_send(sqe, data, entropy, &mut self.posts)
    }
    fn complete(&mut self, cid: u16, status: Status, result: u64, data: Option<Bytes>) {
        self.rq.complete(cid, status, result, data, &mut self.posts);
    }

    /// On this thread: an RDMA queue is one host CPU's queue.
    fn run(q: &mut Queue<Rdma>, c: Io) {
        let done = io::execute_resolved(&c.sub, &c.r, &c.host, &c.sqe, &c.data);
        q.finished(Finished { cid: c.sqe.cid(), done, io: c.timer });
    }
}

impl Rdma {
    /// Post what the queue asked for, in order.
    fn post(&mut self) -> End {
        for p in std::mem::take(&mut self.posts) {
            match p {
                Post::Read { cid, from } => {
                    let len = from.length as usize;
                    let buf = self.qp.register(len, false).context("RDMA READ")?;
                    let id = self.transfer(buf, Some(cid));
                    self.qp.post_read(wr_id(WR_READ, id), buf, 0, len, Remote { addr: from.addr, key: from.key }).context("RDMA READ")?;
                }
                Post::Write { to, data } => {
                    let len = data.len();
                    let buf = self.qp.register_bytes(data, false).context("registering a result")?;
                    let id = self.transfer(buf, None);
                    self.qp.post_write(wr_id(WR_WRITE, id), buf, 0, len, Remote { addr: to.addr, key: to.key }, true).context("RDMA WRITE")?;
                }
                Post::Send { cqe, invalidate } => {
                    let slot = self.free_cqes.pop().context("no completion slot free: the host sends faster than its queue size allows")?;
                    if let Some(b) = self.qp.buf_mut(self.cqes) {
                        b[slot * 16..slot * 16 + 16].copy_from_slice(&cqe);
                    }
                    let id = wr_id(WR_SEND, slot as u64);
                    let sent = self.qp.post_send(id, self.cqes, slot * 16, 16, invalidate, true);
                    // A device without SEND with Invalidate: a plain SEND, and
                    // the host invalidates its key itself.
                    let sent = match sent {
                        Err(e) if invalidate.is_some() && e.raw_os_error() == Some(libc::EINVAL) => self.qp.post_send(id, self.cqes, slot * 16, 16, None, true),
                        r => r,
                    };
                    sent.context("SEND")?;
                }
            }
        }
        Ok(())
    }

    fn transfer(&mut self, buf: BufId, fetch_for: Option<u16>) -> u64 {
        let id = self.next_transfer;
        self.next_transfer += 1;
        self.transfers.insert(id, Transfer { buf, fetch_for });
        id
    }
}
