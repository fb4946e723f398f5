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

use super::fabric::{CtrlEntry, Fabric};
use crate::limits::{Admission, Ticket};
use crate::metrics::{self, Meter, Op};
use crate::session::SessionStats;
use crate::Shutdown;
use anyhow::Context;
use bw_nvme::auth::{ControllerAuth, Entropy};
use bw_nvme::controller::{AdminOutcome, Completion};
use bw_nvme::fabrics::{self, Connect, ConnectData};
use bw_nvme::nvm_io as io;
use bw_nvme::queue_entry::{nvm, Sqe};
use bw_nvme::rdma_queue::{cm, Action, Connected, Post, RdmaQueue, CAPSULE_LEN};
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
        fabric: fabric.clone(),
        peer: peer.clone(),
        q,
        rq: RdmaQueue::new(shape, Instant::now() + login_timeout),
        recv,
        cqes,
        free_cqes: (0..2 * entries as usize).collect(),
        transfers: HashMap::new(),
        next_transfer: 0,
        posts: Vec::new(),
        ctrl: None,
        holds_qid: false,
        logged_in: false,
        kill: None,
        stats: Arc::default(),
        meter: Meter::new(metrics::Proto::Nvme),
        counted: None,
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
    fabric: Arc<Fabric>,
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
    ctrl: Option<Arc<CtrlEntry>>,
    holds_qid: bool,
    /// Allowed and, where the host must, authenticated.
    logged_in: bool,
    kill: Option<tokio::sync::watch::Receiver<bool>>,
    stats: Arc<SessionStats>,
    meter: Meter,
    counted: Option<metrics::SessionGuard>,
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
        if let Some(e) = &self.ctrl {
            if self.rq.qid() == 0 {
                self.fabric.remove(e.cntlid, "admin queue closed");
            } else if self.holds_qid {
                e.release_queue(self.rq.qid());
            }
        }
        self.counted = None;
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
                if let Some(c) = self.ctrl.as_ref().filter(|c| !self.logged_in && c.auth.is_some()) {
                    let subnqn = c.subsys.as_ref().map(|s| s.nqn()).unwrap_or_default();
                    metrics::global().auth_failure(metrics::Proto::Nvme, &subnqn, &c.hostnqn);
                }
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
            Action::Fetch { cid, from } => {
                let fetch = self.q.register(from.length as usize, false).and_then(|buf| {
                    let id = self.transfer(buf, Some(cid));
                    self.q.post_read(wr_id(WR_READ, id), buf, 0, from.length as usize, Remote { addr: from.addr, key: from.key })
                });
                if let Err(e) = fetch {
                    return Some(Err(format!("RDMA READ: {e}")));
                }
            }
            Action::Connect { cid, connect, data } => self.connect(cid, connect, data),
            Action::Admin { sqe, data } => self.admin(sqe, data),
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
        let r = if c.qid == 0 { self.fabric.connect_admin(&c, &d, None, peer) } else { self.fabric.connect_io(&c, &d) };
        let e = match r {
            Ok(e) => e,
            Err(r) => {
                if r.status == Status::CONNECT_INVALID_HOST.dnr() {
                    metrics::global().auth_failure(metrics::Proto::Nvme, &d.subnqn, &d.hostnqn);
                }
                log::info!("nvme-rdma: {}: Connect (qid {}) refused: {}", self.peer, c.qid, r.status);
                return self.refuse(cid, r.status, r.result);
            }
        };
        if c.qid == 0 {
            e.ctrl.lock().unwrap_or_else(|p| p.into_inner()).set_keyed_sgls(true);
        }
        log::debug!("nvme-rdma: {}: queue {} of controller {} connected (sqsize {})", self.peer, c.qid, e.cntlid, c.sqsize);
        // Every queue of a controller whose host has a secret authenticates
        // before it logs in (and an I/O queue takes its queue ID).
        let auth = e.auth.as_ref().and_then(|a| Some(ControllerAuth::new(a.clone(), &e.hostnqn, &e.subsys.as_ref()?.nqn())));
        let must_authenticate = auth.is_some();
        self.kill = Some(e.killed());
        let done = Connected { result: e.cntlid as u64, keep_alive: e.keep_alive.clone(), subsystem: e.subsys.clone(), auth };
        self.ctrl = Some(e);
        if !must_authenticate {
            if let Err(why) = self.log_in() {
                log::info!("nvme-rdma: {}: Connect (qid {}) refused: {why}", self.peer, c.qid);
                self.ctrl = None;
                self.kill = None;
                return self.refuse(cid, Status::CONNECT_INVALID_PARAM.dnr(), fabrics::ipo_sqe(fabrics::CS_QID));
            }
        }
        self.rq.connected(cid, done, Instant::now(), &mut self.posts);
    }

    /// The queue's login is over: the host is allowed and authenticated
    /// where it must be. An I/O queue takes its queue ID now.
    fn log_in(&mut self) -> Result<(), String> {
        let Some(e) = self.ctrl.clone() else { return Ok(()) };
        let qid = self.rq.qid();
        if qid > 0 && !self.holds_qid {
            if !e.reserve_queue(qid) {
                return Err(format!("queue {qid} of controller {} is taken", e.cntlid));
            }
            self.holds_qid = true;
            e.stats.lock().unwrap_or_else(|p| p.into_inner()).push(self.stats.clone());
        }
        self.logged_in = true;
        self.ticket.logged_in();
        let subnqn = e.subsys.as_ref().map_or_else(|| bw_nvme::DISCOVERY_NQN.to_string(), |s| s.nqn());
        self.counted = Some(metrics::global().login(metrics::Proto::Nvme, &subnqn, &e.hostnqn, qid == 0));
        Ok(())
    }

    /// Auth Send: the queue's DH-HMAC-CHAP step with fresh randomness.
    fn auth_send(&mut self, sqe: Sqe, data: Bytes) -> Option<End> {
        match Entropy::from_os(&self.fabric.host_keys.seq) {
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
        let Some(e) = self.ctrl.clone().filter(|_| self.rq.qid() == 0) else { return };
        let list = std::mem::take(&mut *e.events.lock().unwrap_or_else(|p| p.into_inner()));
        for c in list {
            self.complete(c.cid, c.status, c.result, c.data);
        }
    }

    fn admin(&mut self, sqe: Sqe, data: Bytes) {
        let Some(e) = self.ctrl.clone() else {
            return self.complete(sqe.cid(), Status::CMD_SEQ_ERROR, 0, None);
        };
        let out = e.ctrl.lock().unwrap_or_else(|p| p.into_inner()).execute_admin(&sqe, &data, Instant::now());
        if let AdminOutcome::Complete(Completion { cid, status, result, data }) = out {
            self.complete(cid, status, result, data);
        }
    }

    fn io(&mut self, sqe: Sqe, data: Bytes) {
        let cid = sqe.cid();
        let Some(sub) = self.ctrl.as_ref().and_then(|e| e.subsys.as_ref()).map(|s| s.load_full()) else {
            return self.complete(cid, Status::INVALID_OPCODE.dnr(), 0, None);
        };
        let op = match sqe.opcode() {
            nvm::READ => Some(Op::Read),
            nvm::WRITE => Some(Op::Write),
            _ => None,
        };
        let len = io::transfer_len(&sqe);
        if let Some(op) = op {
            self.stats.count(op == Op::Write, len as u64);
        }
        let timer = op.zip(sub.namespace(sqe.nsid())).map(|(op, n)| self.meter.start(n.volume.name(), op, len as usize));
        let Some(host) = self.ctrl.as_ref().map(|e| e.host.clone()) else {
            return self.complete(cid, Status::INVALID_OPCODE.dnr(), 0, None);
        };
        let done = io::execute(&sub, &host, &sqe, &data);
        if let Some(t) = timer {
            self.meter.done(t, done.status == Status::SUCCESS);
        }
        self.complete(cid, done.status, 0, done.data);
    }
}
