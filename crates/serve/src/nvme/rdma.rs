//! NVMe/RDMA: the verbs around [`RdmaQueue`], as `conn.rs` is the socket
//! around NVMe/TCP's queue. Controllers, subsystems and allowed hosts are
//! the same [`Fabric`] as NVMe/TCP's.
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
use crate::limits::{Admission, Ticket};
use crate::metrics;
use crate::Shutdown;
use anyhow::Context;
use bw_nvme::auth::Entropy;
use bw_nvme::fabrics::{Connect, ConnectData};
use bw_nvme::nvm_io as io;
use bw_nvme::queue_entry::Sqe;
use bw_nvme::rdma_queue::{cm, Action, Post, RdmaQueue, CAPSULE_LEN};
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
    let (q, recv, cqes) = match started {
        Ok(x) => x,
        Err(e) => {
            log::warn!("nvme-rdma: {peer}: cannot accept: {e}");
            return;
        }
    };
    let mut c = Conn {
        link: Link::new(fabric.clone(), "nvme-rdma", peer.clone()),
        peer: peer.clone(),
        q,
        rq: RdmaQueue::new(shape, Instant::now() + login_timeout),
        recv,
        cqes,
        free_cqes: (0..2 * entries as usize).collect(),
        transfers: HashMap::new(),
        next_transfer: 0,
        posts: Vec::new(),
        kill: None,
        ticket,
        shutdown: shutdown.clone(),
    };
    let spawned = std::thread::Builder::new().name("nvme-rdma-q".into()).spawn(move || {
        let _conn = metrics::global().connection(metrics::Proto::Nvme);
        let r = c.run();
        c.close_queue();
        c.q.disconnect();
        match r {
            Ok(()) => log::debug!("nvme-rdma: {}: queue {} closed", c.peer, c.rq.qid()),
            Err(e) => log::info!("nvme-rdma: {}: queue {} of controller {} closed: {e}", c.peer, c.rq.qid(), c.rq.cntlid()),
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

struct Conn {
    link: Link,
    peer: String,
    q: bw_rdma::Queue,
    rq: RdmaQueue,
    /// One receive slot of CAPSULE_LEN bytes per submission queue entry.
    recv: BufId,
    /// 16-byte completion slots for SENDs, and the free ones.
    cqes: BufId,
    free_cqes: Vec<usize>,
    transfers: HashMap<u64, Transfer>,
    next_transfer: u64,
    posts: Vec<Post>,
    kill: Option<tokio::sync::watch::Receiver<bool>>,
    /// This connection's place in the RDMA front-end's admission limits.
    ticket: Ticket,
    shutdown: Shutdown,
}

type End = Result<(), String>;

impl Conn {
    fn run(&mut self) -> End {
        let mut wcs = [Wc::default(); 16];
        let mut armed = false;
        loop {
            if self.shutdown.is_set() || self.kill.as_ref().is_some_and(|k| *k.borrow()) {
                return Ok(());
            }
            let n = self.q.poll(&mut wcs).map_err(|e| e.to_string())?;
            for wc in &wcs[..n] {
                if let Some(end) = self.completion(wc) {
                    return end;
                }
            }
            self.post()?;
            while let Some(ev) = self.q.cm_event().map_err(|e| e.to_string())? {
                match ev.kind {
                    EventKind::Established => log::debug!("nvme-rdma: {}: queue {} established", self.peer, self.rq.qid()),
                    EventKind::Disconnected | EventKind::DeviceRemoval => return Err(format!("{} from the host's side", ev.name())),
                    _ => {}
                }
            }
            self.send_events();
            let now = Instant::now();
            if self.rq.poll_timeout().is_some_and(|t| now >= t) {
                if let Some(end) = self.rq.handle_timeout(now).and_then(|a| self.act(a)) {
                    return end;
                }
            }
            self.post()?;
            if n > 0 {
                continue;
            }
            // Empty: ask to be woken, look once more (a completion may have
            // come in between), then sleep.
            if !armed {
                self.q.rearm().map_err(|e| e.to_string())?;
                armed = true;
                continue;
            }
            let wait = self.rq.poll_timeout().map_or(TICK, |t| t.saturating_duration_since(now).min(TICK));
            self.q.wait(wait).map_err(|e| e.to_string())?;
            armed = false;
        }
    }

    /// Teardown: an admin queue takes its controller with it.
    fn close_queue(&mut self) {
        self.link.close(self.rq.qid());
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
            return Some(Err(format!("{what} failed: {}", wc.status_str())));
        }
        let a = match kind {
            WR_RECV => {
                let off = n as usize * CAPSULE_LEN;
                let len = (wc.byte_len as usize).min(CAPSULE_LEN);
                let capsule = &self.q.buf(self.recv)[off..off + len];
                let a = self.rq.capsule(capsule, Instant::now(), &mut self.posts);
                // The capsule was copied out: the slot takes the next one.
                if let Err(e) = self.q.post_recv(wc.wr_id, self.recv, off, CAPSULE_LEN) {
                    return Some(Err(format!("RECV: {e}")));
                }
                a
            }
            WR_SEND => {
                self.free_cqes.push(n as usize);
                None
            }
            _ => {
                let t = self.transfers.remove(&n)?;
                let data = self.q.release(t.buf);
                let cid = t.fetch_for?;
                self.rq.fetched(cid, Bytes::from(data.unwrap_or_default()), &mut self.posts)
            }
        };
        a.and_then(|a| self.act(a))
    }

    /// Post what the queue asked for, in order.
    fn post(&mut self) -> End {
        for p in std::mem::take(&mut self.posts) {
            match p {
                Post::Read { cid, from } => {
                    let len = from.length as usize;
                    let buf = self.q.register(len, false).map_err(|e| format!("RDMA READ: {e}"))?;
                    let id = self.transfer(buf, Some(cid));
                    self.q.post_read(wr_id(WR_READ, id), buf, 0, len, Remote { addr: from.addr, key: from.key }).map_err(|e| format!("RDMA READ: {e}"))?;
                }
                Post::Write { to, data } => {
                    let len = data.len();
                    let buf = self.q.register_bytes(data, false).map_err(|e| format!("registering a result: {e}"))?;
                    let id = self.transfer(buf, None);
                    self.q.post_write(wr_id(WR_WRITE, id), buf, 0, len, Remote { addr: to.addr, key: to.key }, true).map_err(|e| format!("RDMA WRITE: {e}"))?;
                }
                Post::Send { cqe, invalidate } => {
                    let slot = self.free_cqes.pop().ok_or("no completion slot free: the host sends faster than its queue size allows")?;
                    if let Some(b) = self.q.buf_mut(self.cqes) {
                        b[slot * 16..slot * 16 + 16].copy_from_slice(&cqe);
                    }
                    let id = wr_id(WR_SEND, slot as u64);
                    let sent = self.q.post_send(id, self.cqes, slot * 16, 16, invalidate, true);
                    // A device without SEND with Invalidate: a plain SEND, and
                    // the host invalidates its key itself.
                    let sent = match sent {
                        Err(e) if invalidate.is_some() && e.raw_os_error() == Some(libc::EINVAL) => self.q.post_send(id, self.cqes, slot * 16, 16, None, true),
                        r => r,
                    };
                    sent.map_err(|e| format!("SEND: {e}"))?;
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

    /// Carry out what the queue asks for; `Some` ends the queue.
    fn act(&mut self, a: Action) -> Option<End> {
        match a {
            Action::Close(None) => return Some(self.post()),
            // A failed authentication ends this queue alone: whoever failed
            // may not be the host that owns the controller.
            Action::Close(Some(e)) => {
                self.link.closing_with_error();
                let _ = self.post();
                return Some(Err(e.to_string()));
            }
            Action::Authenticated => {
                if let Err(why) = self.log_in() {
                    let _ = self.post();
                    return Some(Err(why));
                }
            }
            Action::AuthSend { sqe, data } => return self.auth_send(sqe, data),
            Action::Connect { cid, connect, data } => self.connect(cid, connect, data),
            Action::Admin { sqe, data } => {
                if let Some(c) = self.link.admin(&sqe, &data) {
                    self.complete(c.cid, c.status, c.result, c.data);
                }
            }
            Action::Io { sqe, data } => self.io(sqe, data),
        }
        None
    }

    fn complete(&mut self, cid: u16, status: Status, result: u64, data: Option<Bytes>) {
        self.rq.complete(cid, status, result, data, &mut self.posts);
    }

    fn refuse(&mut self, cid: u16, status: Status, result: u64) {
        self.rq.connect_refused(cid, status, result, &mut self.posts);
    }

    fn connect(&mut self, cid: u16, c: Connect, d: ConnectData) {
        let peer = self.peer.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 0));
        match self.link.connect(&c, &d, None, peer) {
            Ok(done) => {
                if let Some(e) = &self.link.ctrl {
                    if c.qid == 0 {
                        e.ctrl.lock().unwrap_or_else(|p| p.into_inner()).set_keyed_sgls(true);
                    }
                    self.kill = Some(e.killed());
                }
                if self.link.logged_in {
                    self.ticket.logged_in();
                }
                // (The two queue crates' Connected are alike, field for field.)
                let done = bw_nvme::rdma_queue::Connected { result: done.result, keep_alive: done.keep_alive, subsystem: done.subsystem, auth: done.auth };
                self.rq.connected(cid, done, Instant::now(), &mut self.posts);
            }
            Err(r) => self.refuse(cid, r.status, r.result),
        }
    }

    /// The host has authenticated: the queue's login is over.
    fn log_in(&mut self) -> Result<(), String> {
        self.link.log_in(self.rq.qid())?;
        self.ticket.logged_in();
        Ok(())
    }

    /// Auth Send: the queue's DH-HMAC-CHAP step with fresh randomness.
    fn auth_send(&mut self, sqe: Sqe, data: Bytes) -> Option<End> {
        match Entropy::from_os(&self.link.fabric.host_keys.seq) {
            Ok(r) => {
                let a = self.rq.auth_send(&sqe, &data, r, &mut self.posts)?;
                self.act(a)
            }
            Err(err) => {
                log::error!("nvme-rdma: {}: no random numbers from the OS: {err}", self.peer);
                self.complete(sqe.cid(), Status::INTERNAL, 0, None);
                None
            }
        }
    }

    /// Complete the AERs a live change answered (admin queue).
    fn send_events(&mut self) {
        for c in self.link.events(self.rq.qid()) {
            self.complete(c.cid, c.status, c.result, c.data);
        }
    }

    /// An I/O command, run on this thread: resolved once, then executed.
    fn io(&mut self, sqe: Sqe, data: Bytes) {
        let cid = sqe.cid();
        let (Some(sub), Some(host)) = (self.link.subsystem(), self.link.ctrl.as_ref().map(|e| e.host.clone())) else {
            return self.complete(cid, Status::INVALID_OPCODE.dnr(), 0, None);
        };
        let r = io::resolve(&sub, &host, &sqe);
        let ns = match &r {
            Ok(r) => r.namespace(&sub),
            // Counted as the volume's failed I/O where there is one.
            Err(_) => sub.namespace(sqe.nsid()),
        };
        let timer = self.link.io_started(&sqe, ns.map(|n| &n.volume), Instant::now());
        let done = match r {
            Ok(r) => io::execute_resolved(&sub, &r, &host, &sqe, &data),
            Err(status) => io::IoDone { status, data: None },
        };
        self.link.io_done(timer, done.status == Status::SUCCESS);
        self.complete(cid, done.status, 0, done.data);
    }
}
