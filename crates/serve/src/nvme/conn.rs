//! One NVMe/TCP connection = one queue (admin or I/O): the socket around a
//! [`TargetQueue`], which holds all of the queue's protocol state (ICReq,
//! capsule checks, SQ head, R2T and H2CData, C2HData, Connect's own checks,
//! DH-HMAC-CHAP, login and keep-alive deadlines).
//!
//! This task reads bytes into a buffer, feeds them to the queue, runs the
//! commands it hands out and writes what it queued to an [`Outbox`],
//! without blocking between reads: no channel hop or second task per
//! reply, and read data goes from the volume straight into the send buffer
//! (small reads) or from the page cache to the socket with sendfile (large
//! reads, no data digest). Reads and writes of volumes that complete
//! requests on their own threads (rbd: `DeviceInfo::async_submit`) are
//! submitted from here, and the backend's completion sends the result
//! back through a channel. Other commands that may block (O_DIRECT or
//! O_DSYNC volumes, flushes, discards) run on the blocking pool and come
//! back through the same channel; they complete out of order, as NVMe
//! allows.

use super::fabric::{CtrlEntry, Fabric};
use super::NvmeFraming;
use crate::dispatch::{self, Place, Work};
use crate::framing::FrameReader;
use crate::outbox::Outbox;
use crate::limits::Ticket;
use crate::metrics::{self, IoTimer, Meter, Op};
use crate::Shutdown;
use bw_nvme::auth::{ControllerAuth, Entropy};
use bw_nvme::queue_entry::{nvm, Sqe};
use bw_nvme::command_table::{self as commands, QueueKind};
use bw_nvme::controller::{AdminOutcome, Completion};
use bw_nvme::fabrics::{Connect, ConnectData};
use bw_nvme::nvm_io::{self as io, IoDone};
use bw_nvme::pdu;
use bw_nvme::target_queue::{Action, Connected, QueueConfig, Received, TargetQueue};
use bw_nvme::{Status, Subsystem};
use bytes::Bytes;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

/// Stop taking new PDUs while this much reply data waits in memory.
const OUT_HIGH: usize = 4 << 20;
/// Socket reads in a row before the task lets others run.
const READS_PER_YIELD: u32 = 32;
/// Commands taken from the receive buffer before the replies so far are
/// sent. A host that fills its queue sends its capsules in one burst;
/// answering the whole burst at once made the two sides take turns (each
/// idle while the other worked, the target sleeping once per burst), and
/// answering every 8 keeps both busy: 4 KiB random reads at QD32 with host
/// and target on separate vCPUs, 183k -> 268k IOPS, target sleeps per I/O
/// 0.03 -> 0.002 (crates/nvme/README.md). Linux's target uses the same
/// budget (NVMET_TCP_RECV_BUDGET). Not when the host is on this machine
/// and on our CPU: there the two cannot overlap, and every early reply
/// cost two context switches (same vCPU: 297k IOPS answering whole
/// bursts, 238k answering every 8).
const COMMANDS_PER_SEND: usize = 8;

/// Whether the host's last packets were processed on the CPU this thread
/// runs on. For a host on this machine (loopback) that is the CPU the host
/// sent from (SO_INCOMING_CPU): the host shares our CPU.
fn host_on_our_cpu(stream: &TcpStream) -> bool {
    let mut cpu: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid fd and an int-sized option value.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_INCOMING_CPU,
            &mut cpu as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    // SAFETY: no arguments.
    r == 0 && cpu >= 0 && cpu == unsafe { libc::sched_getcpu() }
}

/// What a connection has become once its login is over, for admission
/// (sessions that cost no credentials may be held to a smaller limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Login {
    /// The admin queue of a discovery controller: any host may open one,
    /// and it has only the keep-alive (or, with KATO 0, an idle) deadline.
    Discovery,
    /// A queue (admin or I/O) of an NVM controller, whose host is allowed
    /// on the subsystem and has authenticated where it has a secret.
    Controller,
}

/// A command finished on the blocking pool.
struct Finished {
    cid: u16,
    done: IoDone,
    /// A read or write, counted when it completes.
    io: Option<IoTimer>,
}

struct Conn {
    fabric: Arc<Fabric>,
    local: Option<SocketAddr>,
    peer: SocketAddr,
    /// The host runs on this machine (see COMMANDS_PER_SEND).
    local_host: bool,
    q: TargetQueue,
    out: Outbox,
    /// Completions from the blocking pool come back through here.
    done_tx: mpsc::UnboundedSender<Finished>,
    ctrl: Option<Arc<CtrlEntry>>,
    /// This I/O queue holds its queue ID in `ctrl` (from its login on).
    holds_qid: bool,
    kill: watch::Receiver<bool>,
    _kill_keep: watch::Sender<bool>,
    /// This queue's reads and writes (also listed in its controller).
    stats: Arc<crate::session::SessionStats>,
    /// Connected and, where the host must, authenticated: `run` returns
    /// when this becomes true so that `serve` can give the pending-login
    /// place back and move the queue to its own thread.
    logged_in: bool,
    meter: Meter,
    /// This queue's place in the target's session and connection counts.
    counted: Option<metrics::SessionGuard>,
}

/// `login_timeout`: from accept to a successful Connect; a connection that
/// is silent, sends half a PDU or never connects is dropped then. `ticket`
/// holds the connection's places in the admission limits until it ends.
pub async fn serve(
    mut stream: TcpStream,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    fabric: Arc<Fabric>,
    mut shutdown: Shutdown,
    login_timeout: Duration,
    mut ticket: Ticket,
) -> anyhow::Result<()> {
    // One C2HData per read (up to MDTS): 128 KiB PDUs cost the target 14%
    // and the host 21% more CPU per 1 MiB read (crates/nvme/README.md).
    let cfg = QueueConfig::new(Instant::now() + login_timeout);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let (kill_keep, kill) = watch::channel(false);
    let mut c = Conn {
        fabric,
        local,
        peer,
        local_host: bw_net::tcp::is_same_host(peer.ip(), local.map(|l| l.ip())),
        q: TargetQueue::new(cfg),
        out: Outbox::default(),
        done_tx,
        ctrl: None,
        holds_qid: false,
        kill,
        _kill_keep: kill_keep,
        stats: Arc::default(),
        logged_in: false,
        meter: Meter::new(metrics::Proto::Nvme),
        counted: None,
    };
    let _counted = metrics::global().connection(metrics::Proto::Nvme);
    let mut reader = FrameReader::with_capacity(256 * 1024);
    let r = loop {
        let was_logged_in = c.logged_in;
        let r = c.run(&stream, &mut reader, &mut done_rx, &mut shutdown).await;
        if c.logged_in == was_logged_in {
            break r;
        }
        ticket.logged_in();
        // Discovery controllers stay on the shared runtime.
        if c.ctrl.as_ref().is_some_and(|e| e.subsys.is_some()) {
            // The stream is gone if this fails; the connection ends, and
            // the teardown below still runs.
            match ticket.own_thread(stream).await {
                Ok(s) => stream = s,
                Err(e) => {
                    c.close_queue();
                    return Err(e.into());
                }
            }
        }
    };
    c.close_queue();
    // Let queued replies (a TermReq, a Disconnect's completion) go out.
    if tokio::time::timeout(Duration::from_secs(5), c.out.drain(&stream))
        .await
        .is_ok()
    {
        let mut s = stream;
        let _ = s.shutdown().await;
    }
    r
}

/// What one attempt to read the socket gave.
enum Read {
    Bytes,
    Empty,
    Closed,
}

/// The only place this connection reads its socket: append what is there
/// to the reader's buffer without waiting (its growth policy is
/// [`NvmeFraming`]'s).
fn read_some(stream: &TcpStream, reader: &mut FrameReader, max_plen: u32) -> Read {
    match reader.try_fill(stream, &NvmeFraming { max_plen }) {
        Ok(0) => Read::Closed,
        Ok(_) => Read::Bytes,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Read::Empty,
        Err(_) => Read::Closed,
    }
}

/// What [`dispatch`] needs to know about an I/O command: the table's
/// `sleeps` and FUA say it waits for the device whatever backs it; a read
/// may go out zero-copy.
fn work(sqe: &Sqe, device: Option<&bw_block::DeviceInfo>, zero_copy_min: usize, data_digest: bool) -> Work {
    if commands::lookup(QueueKind::Io, sqe.opcode()).is_some_and(|c| c.sleeps) || sqe.fua() {
        return Work::Waits;
    }
    let read = sqe.opcode() == nvm::READ;
    let len = if read {
        sqe.nlb() as usize * bw_block::SECTOR_SIZE as usize
    } else {
        io::transfer_len(sqe) as usize
    };
    let zero_copy = read && dispatch::zero_copy(len, zero_copy_min, data_digest, device);
    Work::Data { len, zero_copy }
}

impl Conn {
    /// Teardown: an admin queue takes its controller with it.
    fn close_queue(&self) {
        if let Some(e) = &self.ctrl {
            if self.q.qid() == 0 {
                self.fabric.remove(e.cntlid, "admin queue closed");
            } else if self.holds_qid {
                e.release_queue(self.q.qid());
            }
        }
    }

    async fn run(
        &mut self,
        stream: &TcpStream,
        reader: &mut FrameReader,
        done_rx: &mut mpsc::UnboundedReceiver<Finished>,
        shutdown: &mut Shutdown,
    ) -> anyhow::Result<()> {
        let mut reads_in_a_row = 0;
        let was_logged_in = self.logged_in;
        loop {
            // Handle the PDUs already buffered before touching the socket
            // again (at high queue depth one read brings many capsules),
            // sending the replies every COMMANDS_PER_SEND commands.
            // (Left true when the reply backlog or that count, not a lack
            // of bytes, stopped it.)
            let mut stalled = true;
            let now = Instant::now();
            let mut handled = 0;
            let mut limit = COMMANDS_PER_SEND;
            loop {
                if self.out.buffered() >= OUT_HIGH {
                    break;
                }
                if handled == limit {
                    // A host sharing our CPU cannot work while we do:
                    // early replies would only wake it to preempt us.
                    if self.local_host && !reader.buf().is_empty() && host_on_our_cpu(stream) {
                        limit = usize::MAX;
                    } else {
                        break;
                    }
                }
                if *self.kill.borrow() {
                    return Ok(());
                }
                match self.q.receive(reader.buf(), now, self.out.buf_mut()) {
                    Received::NeedMore => {
                        stalled = false;
                        break;
                    }
                    Received::Pdu(None) => {}
                    Received::Pdu(Some(a)) => {
                        handled += 1;
                        if let Some(end) = self.act(a) {
                            return end;
                        }
                        if self.logged_in != was_logged_in {
                            return Ok(());
                        }
                    }
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
                match read_some(stream, reader, self.q.max_pdu_len()) {
                    Read::Closed => return Ok(()),
                    Read::Bytes => {
                        reads_in_a_row += 1;
                        continue;
                    }
                    Read::Empty => {}
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
            let timeout = self.q.poll_timeout();
            let far = Instant::now() + Duration::from_secs(3600);
            // The admin queue sends events a live change made.
            let events = self.ctrl.clone().filter(|_| self.q.qid() == 0 && self.logged_in);
            let event = async {
                match &events {
                    Some(e) => e.events_ready.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = stream.ready(interest) => { r?; }
                _ = event => self.send_events(),
                Some(f) = done_rx.recv() => self.finished(f),
                _ = self.kill.changed() => return Ok(()),
                _ = shutdown.wait() => return Ok(()),
                _ = tokio::time::sleep_until(timeout.unwrap_or(far).into()), if timeout.is_some() => {
                    if let Some(end) = self.q.handle_timeout(Instant::now()).and_then(|a| self.act(a)) {
                        return end;
                    }
                }
            }
        }
    }

    /// Carry out what the queue asks for; `Some` ends the connection.
    fn act(&mut self, a: Action) -> Option<anyhow::Result<()>> {
        match a {
            Action::Close(None) => return Some(Ok(())),
            // A failed authentication ends this queue alone: whoever failed
            // may not be the host that owns the controller. (An admin
            // queue's controller goes with it, at teardown.)
            Action::Close(Some(e)) => {
                if let Some(c) = self.ctrl.as_ref().filter(|c| !self.logged_in && c.auth.is_some()) {
                    let subnqn = c.subsys.as_ref().map(|s| s.nqn()).unwrap_or_default();
                    metrics::global().auth_failure(metrics::Proto::Nvme, &subnqn, &c.hostnqn);
                }
                return Some(Err(e.into()));
            }
            Action::Authenticated => {
                let qid = self.q.qid();
                return self.log_in(Login::Controller, qid).err().map(Err);
            }
            Action::AuthSend { sqe, data } => return self.auth_send(sqe, data),
            Action::Connect { cid, connect, data } => self.connect(cid, connect, data),
            Action::Admin { sqe, data } => self.admin(sqe, data),
            Action::Io { sqe, data } => self.io(sqe, data),
        }
        None
    }

    fn complete(&mut self, cid: u16, status: Status, result: u64, data: Option<Bytes>) {
        self.q
            .complete(cid, status, result, data, self.out.buf_mut());
    }

    /// Complete the AERs a live change answered.
    fn send_events(&mut self) {
        let Some(e) = self.ctrl.clone() else { return };
        let list = std::mem::take(&mut *e.events.lock().unwrap_or_else(|p| p.into_inner()));
        for c in list {
            self.complete(c.cid, c.status, c.result, c.data);
        }
    }

    /// The one place a read or write ends, whichever way it ran (the
    /// inline read path reports here too).
    fn finished(&mut self, f: Finished) {
        if let Some(t) = f.io {
            self.meter.done(t, f.done.status == Status::SUCCESS);
        }
        self.complete(f.cid, f.done.status, 0, f.done.data);
    }

    fn connect(&mut self, cid: u16, c: Connect, d: ConnectData) {
        let r = if c.qid == 0 {
            self.fabric.connect_admin(&c, &d, self.local, Some(self.peer))
        } else {
            self.fabric.connect_io(&c, &d)
        };
        let e = match r {
            Ok(e) => e,
            Err(r) => {
                if r.status == Status::CONNECT_INVALID_HOST.dnr() {
                    // Only a configured subsystem gets this far: a bounded label.
                    metrics::global().auth_failure(metrics::Proto::Nvme, &d.subnqn, &d.hostnqn);
                }
                log::info!(
                    "nvme: {}: Connect (qid {}) refused: {}",
                    self.peer,
                    c.qid,
                    r.status
                );
                return self
                    .q
                    .connect_refused(cid, r.status, r.result, self.out.buf_mut());
            }
        };
        self.kill = e.killed();
        log::debug!(
            "nvme: {}: queue {} of controller {} connected (sqsize {})",
            self.peer,
            c.qid,
            e.cntlid,
            c.sqsize
        );
        // Every queue of a controller whose host has a secret authenticates.
        let auth = e.auth.as_ref().and_then(|a| {
            let sub = e.subsys.as_ref()?;
            Some(ControllerAuth::new(a.clone(), &e.hostnqn, &sub.nqn()))
        });
        let login = match (&auth, e.is_discovery()) {
            (Some(_), _) => None,
            (None, true) => Some(Login::Discovery),
            (None, false) => Some(Login::Controller),
        };
        let done = Connected {
            result: e.cntlid as u64,
            keep_alive: e.keep_alive.clone(),
            subsystem: e.subsys.clone(),
            auth,
        };
        self.ctrl = Some(e);
        if let Some(kind) = login {
            if let Err(e) = self.log_in(kind, c.qid) {
                log::info!("nvme: {}: Connect (qid {}) refused: {e}", self.peer, c.qid);
                let st = Status::CONNECT_INVALID_PARAM.dnr();
                let at = bw_nvme::fabrics::ipo_sqe(bw_nvme::fabrics::CS_QID);
                self.ctrl = None;
                return self.q.connect_refused(cid, st, at, self.out.buf_mut());
            }
        }
        self.q
            .connected(cid, done, Instant::now(), self.out.buf_mut());
    }

    /// The queue's login is over: the host is allowed and authenticated
    /// (or needs no credentials: discovery). An I/O queue takes its queue
    /// ID now; an `Err` ends the connection.
    fn log_in(&mut self, kind: Login, qid: u16) -> Result<(), anyhow::Error> {
        let Some(e) = &self.ctrl else {
            return Ok(());
        };
        if qid > 0 && !self.holds_qid {
            if !e.reserve_queue(qid) {
                anyhow::bail!("queue {qid} of controller {} is taken", e.cntlid);
            }
            self.holds_qid = true;
            e.stats.lock().unwrap_or_else(|p| p.into_inner()).push(self.stats.clone());
        }
        log::debug!(
            "nvme: {}: queue {qid} of controller {} logged in ({kind:?})",
            self.peer,
            e.cntlid
        );
        self.logged_in = true;
        let subnqn = e.subsys.as_ref().map_or_else(|| bw_nvme::DISCOVERY_NQN.to_string(), |s| s.nqn());
        self.counted = Some(metrics::global().login(metrics::Proto::Nvme, &subnqn, &e.hostnqn, qid == 0));
        Ok(())
    }

    /// Auth Send: the queue's DH-HMAC-CHAP step with fresh randomness.
    fn auth_send(&mut self, sqe: Sqe, data: Bytes) -> Option<anyhow::Result<()>> {
        match Entropy::from_os(&self.fabric.host_keys.seq) {
            Ok(e) => {
                let a = self.q.auth_send(&sqe, &data, e, self.out.buf_mut())?;
                self.act(a)
            }
            Err(e) => {
                log::error!("nvme: {}: no random numbers from the OS: {e}", self.peer);
                self.complete(sqe.cid(), Status::INTERNAL, 0, None);
                None
            }
        }
    }

    fn admin(&mut self, sqe: Sqe, data: Bytes) {
        let Some(e) = self.ctrl.clone() else {
            return self.complete(sqe.cid(), Status::CMD_SEQ_ERROR, 0, None);
        };
        let out = e
            .ctrl
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .execute_admin(&sqe, &data, Instant::now());
        if let AdminOutcome::Complete(Completion {
            cid,
            status,
            result,
            data,
        }) = out
        {
            self.complete(cid, status, result, data);
        }
    }

    fn io(&mut self, sqe: Sqe, data: Bytes) {
        let cid = sqe.cid();
        // The subsystem as it is now: a lock-free load (live changes swap it).
        let Some(e) = &self.ctrl else {
            return self.complete(cid, Status::INVALID_OPCODE.dnr(), 0, None);
        };
        let Some(sub) = e.subsys.as_ref().map(|s| s.load_full()) else {
            return self.complete(cid, Status::INVALID_OPCODE.dnr(), 0, None);
        };
        let host = e.host.clone();
        let op = match sqe.opcode() {
            nvm::READ => Some(Op::Read),
            nvm::WRITE => Some(Op::Write),
            _ => None,
        };
        let len = io::transfer_len(&sqe);
        if let Some(op) = op {
            self.stats.count(op == Op::Write, len as u64);
        }
        let volume = sub.namespace(sqe.nsid()).map(|n| &n.volume);
        let device = volume.map(|v| v.info());
        let work = work(&sqe, device, self.fabric.zero_copy_min, self.q.digests().data);
        let timer = op.zip(volume).map(|(op, v)| self.meter.start(v.name(), op, len as usize));
        // No size limit: NVMe/TCP reads and writes of page-cache volumes
        // have always run inline, whatever their length.
        let place = dispatch::place(work, device, usize::MAX);
        if place == Place::Submit {
            match io::plan(&sub, &host, &sqe, &data) {
                io::Plan::Submit { volume, request } => {
                    // The backend's own thread completes it; nothing here
                    // or on the blocking pool waits.
                    let tx = self.done_tx.clone();
                    return volume.submit(request, move |req, r| {
                        let _ = tx.send(Finished { cid, done: io::submitted(req, r), io: timer });
                    });
                }
                io::Plan::Done(status) => return self.finished(Finished { cid, done: IoDone { status, data: None }, io: timer }),
                io::Plan::Execute => {}
            }
        }
        if place != Place::Inline {
            let tx = self.done_tx.clone();
            tokio::task::spawn_blocking(move || {
                let run = std::panic::AssertUnwindSafe(|| io::execute(&sub, &host, &sqe, &data));
                let done = std::panic::catch_unwind(run).unwrap_or(IoDone {
                    status: Status::INTERNAL,
                    data: None,
                });
                let _ = tx.send(Finished { cid, done, io: timer });
            });
        } else if sqe.opcode() == nvm::READ {
            let ok = self.read(&sub, &host, &sqe, work);
            if let Some(t) = timer {
                self.meter.done(t, ok);
            }
        } else {
            let done = io::execute(&sub, &host, &sqe, &data);
            self.finished(Finished { cid, done, io: timer });
        }
    }

    /// A read that cannot block: its data goes from the volume straight into
    /// the send buffer behind each C2HData header, or, when `work` says
    /// zero-copy, from the page cache to the socket with sendfile.
    /// Whether it succeeded.
    fn read(&mut self, sub: &Subsystem, host: &io::Host, sqe: &Sqe, work: Work) -> bool {
        let cid = sqe.cid();
        let fail = |c: &mut Conn, st: Status| {
            c.complete(cid, st, 0, None);
            false
        };
        let (vol, off, len) = match io::read_extent(sub, host, sqe) {
            Ok(x) => x,
            Err(st) => return fail(self, st),
        };
        if len == 0 {
            self.complete(cid, Status::SUCCESS, 0, None);
            return true;
        }
        if matches!(work, Work::Data { zero_copy: true, .. }) {
            match vol.zero_copy_read(off, len as u64) {
                Ok(Some(fd)) => {
                    let fd = fd.as_raw_fd();
                    for (hdr, r) in self.q.read_pdus(cid, len) {
                        self.out.buf_mut().extend_from_slice(hdr.bytes());
                        self.out
                            .push_file(vol.clone(), fd, off + r.start as u64, r.len());
                    }
                    self.q.read_sent(cid, self.out.buf_mut());
                    return true;
                }
                Ok(None) => {}
                Err(e) => return fail(self, io::read_error(e)),
            }
        }
        let ddgst = self.q.digests().data;
        let start = self.out.buf_mut().len();
        for (hdr, r) in self.q.read_pdus(cid, len) {
            self.out.buf_mut().extend_from_slice(hdr.bytes());
            let at = match self.out.read_into(vol, off + r.start as u64, r.len()) {
                Ok(at) => at,
                Err(e) => {
                    self.out.buf_mut().truncate(start);
                    return fail(self, io::read_error(e));
                }
            };
            if ddgst {
                let b = self.out.buf_mut();
                let c = pdu::crc32c(&b[at..]);
                b.extend_from_slice(&c.to_le_bytes());
            }
        }
        self.q.read_sent(cid, self.out.buf_mut());
        true
    }
}
