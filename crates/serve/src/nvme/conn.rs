//! One NVMe/TCP connection = one queue (admin or I/O): the socket around a
//! [`TargetQueue`], which holds all of the queue's protocol state (ICReq,
//! capsule checks, SQ head, R2T and H2CData, C2HData, Connect's own checks,
//! DH-HMAC-CHAP, login and keep-alive deadlines).
//!
//! The connection is driven by [`crate::driver`], the iSCSI front-end's
//! driver too: it feeds the received bytes to this queue, which runs the
//! commands its state machine hands out and queues what it sends in an
//! [`Outbox`], without blocking between reads: no channel hop or second
//! task per reply, and read data goes from the volume straight into the send buffer
//! (small reads) or from the page cache to the socket with sendfile (large
//! reads, no data digest). Reads and writes of volumes that complete
//! requests on their own threads (rbd: `DeviceInfo::async_submit`) are
//! submitted from here, and the backend's completion sends the result
//! back through a channel. Other commands that may block (O_DIRECT or
//! O_DSYNC volumes, flushes, discards) run on the blocking pool and come
//! back through the same channel; they complete out of order, as NVMe
//! allows.

use super::fabric::Fabric;
use super::link::Link;
use super::NvmeFraming;
use crate::dispatch::{self, Place, Work};
use crate::driver::{self, Exit, Knobs, Step};
use crate::framing::FrameReader;
use crate::limits::Ticket;
use crate::metrics::{self, IoTimer};
use crate::outbox::{Outbox, Payload};
use crate::Shutdown;
use bw_nvme::auth::Entropy;
use bw_nvme::fabrics::{Connect, ConnectData};
use bw_nvme::nvm_io::{self as io, IoDone, Resolved};
use bw_nvme::pdu;
use bw_nvme::queue_entry::{nvm, Sqe};
use bw_nvme::target_queue::{Action, QueueConfig, Received, TargetQueue};
use bw_nvme::Status;
use bytes::{Bytes, BytesMut};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

/// A command finished on the blocking pool or by the backend.
pub(super) struct Finished {
    cid: u16,
    done: IoDone,
    /// A read or write, counted when it completes.
    io: Option<IoTimer>,
}

/// One NVMe/TCP queue as a [`driver::Session`].
struct Conn {
    link: Link,
    local: Option<SocketAddr>,
    peer: SocketAddr,
    q: TargetQueue,
    /// When the driver took the batch of PDUs being handled (I/O timers
    /// start there).
    now: Instant,
    out: Outbox,
    /// Completions from the blocking pool come back through here.
    done_tx: mpsc::UnboundedSender<Finished>,
    /// Becomes true when the controller is torn down.
    kill: watch::Receiver<bool>,
    _kill_keep: watch::Sender<bool>,
    knobs: Knobs,
}

/// What wakes a queue from outside (see [`driver::Session::signal`]).
enum Signal {
    /// A live change completed asynchronous event requests (admin queue).
    Events,
    /// The controller was torn down.
    Killed,
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
    // and the host 21% more CPU per 1 MiB read (docs/notes/2026-11-22-nvme-tcp-data-path.md).
    let cfg = QueueConfig::new(Instant::now() + login_timeout);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let (kill_keep, kill) = watch::channel(false);
    let knobs = fabric.knobs;
    let mut c = Conn {
        link: Link::new(fabric, "nvme", peer.to_string()),
        local,
        peer,
        q: TargetQueue::new(cfg),
        now: Instant::now(),
        out: Outbox::default(),
        done_tx,
        kill,
        _kill_keep: kill_keep,
        knobs,
    };
    let _counted = metrics::global().connection(metrics::Proto::Nvme);
    let mut reader = FrameReader::with_capacity(256 * 1024);
    let r = loop {
        match driver::run(&stream, &mut reader, &mut c, &mut done_rx, &mut shutdown, &knobs).await {
            Exit::Closed(r) => break r,
            Exit::Returned => {}
        }
        // The login is over.
        ticket.logged_in();
        // Discovery controllers stay on the shared runtime.
        if c.link.ctrl.as_ref().is_some_and(|e| e.subsys.is_some()) {
            // The stream is gone if this fails; the connection ends, and
            // the teardown below still runs.
            match ticket.own_thread(stream).await {
                Ok(s) => stream = s,
                Err(e) => {
                    c.link.close(c.q.qid());
                    return Err(e.into());
                }
            }
        }
    };
    c.link.close(c.q.qid());
    // Let queued replies (a TermReq, a Disconnect's completion) go out.
    driver::close(stream, &mut c.out).await;
    r
}

/// What [`dispatch`] needs to know about a resolved I/O command: the
/// table's `sleeps` and FUA say it waits for the device whatever backs it;
/// a read may go out zero-copy.
fn work(r: &Resolved, sqe: &Sqe, device: Option<&bw_block::DeviceInfo>, zero_copy_min: usize, data_digest: bool) -> Work {
    if r.row.sleeps || sqe.fua() {
        return Work::Waits;
    }
    let read = r.row.opcode == nvm::READ;
    let len = if read { r.len } else { io::transfer_len(sqe) as usize };
    let zero_copy = read && dispatch::zero_copy(len, zero_copy_min, data_digest, device);
    Work::Data { len, zero_copy }
}

impl driver::Session for Conn {
    type Done = Finished;
    type Signal = Signal;

    fn outbox(&mut self) -> &mut Outbox {
        &mut self.out
    }

    fn fill(&self, reader: &mut FrameReader, stream: &TcpStream) -> std::io::Result<usize> {
        reader.try_fill(stream, &NvmeFraming { max_plen: self.q.max_pdu_len() })
    }

    fn receive(&mut self, buf: &mut BytesMut, now: Instant) -> Step {
        if *self.kill.borrow() {
            return Step::Close(Ok(()));
        }
        let was_logged_in = self.link.logged_in;
        self.now = now;
        match self.q.receive(buf, now, self.out.buf_mut()) {
            Received::NeedMore => Step::NeedMore,
            Received::Pdu(None) => Step::Pdu,
            Received::Pdu(Some(a)) => {
                if let Some(end) = self.act(a) {
                    return Step::Close(end);
                }
                if self.link.logged_in != was_logged_in {
                    return Step::Return;
                }
                Step::Command
            }
        }
    }

    fn complete(&mut self, f: Finished) {
        self.finished(f);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.q.poll_timeout()
    }

    fn handle_timeout(&mut self, now: Instant) -> Step {
        match self.q.handle_timeout(now).and_then(|a| self.act(a)) {
            Some(end) => Step::Close(end),
            None => Step::Pdu,
        }
    }

    fn signal(&self) -> impl Future<Output = Signal> + Send + 'static {
        // The admin queue sends events a live change made.
        let events = self.link.ctrl.clone().filter(|_| self.q.qid() == 0 && self.link.logged_in);
        let mut kill = self.kill.clone();
        async move {
            let events = async {
                match &events {
                    Some(e) => e.events_ready.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = events => Signal::Events,
                _ = kill.wait_for(|k| *k) => Signal::Killed,
            }
        }
    }

    fn on_signal(&mut self, s: Signal) -> Step {
        match s {
            Signal::Events => {
                for c in self.link.events(self.q.qid()) {
                    self.complete_cmd(c.cid, c.status, c.result, c.data);
                }
                Step::Pdu
            }
            Signal::Killed => Step::Close(Ok(())),
        }
    }
}

impl Conn {
    /// Carry out what the queue asks for; `Some` ends the connection.
    fn act(&mut self, a: Action) -> Option<anyhow::Result<()>> {
        match a {
            Action::Close(None) => return Some(Ok(())),
            // A failed authentication ends this queue alone: whoever failed
            // may not be the host that owns the controller. (An admin
            // queue's controller goes with it, at teardown.)
            Action::Close(Some(e)) => {
                self.link.closing_with_error();
                return Some(Err(e.into()));
            }
            Action::Authenticated => {
                let qid = self.q.qid();
                return self.link.log_in(qid).err().map(|e| Err(anyhow::anyhow!(e)));
            }
            Action::AuthSend { sqe, data } => return self.auth_send(sqe, data),
            Action::Connect { cid, connect, data } => self.connect(cid, connect, data),
            Action::Admin { sqe, data } => {
                if let Some(c) = self.link.admin(&sqe, &data) {
                    self.complete_cmd(c.cid, c.status, c.result, c.data);
                }
            }
            Action::Io { sqe, data } => self.io(sqe, data),
        }
        None
    }

    fn complete_cmd(&mut self, cid: u16, status: Status, result: u64, data: Option<Bytes>) {
        self.q.complete(cid, status, result, data, self.out.buf_mut());
    }

    /// The one place a read or write ends, whichever way it ran (the
    /// inline read path reports here too).
    fn finished(&mut self, f: Finished) {
        self.link.io_done(f.io, f.done.status == Status::SUCCESS);
        self.complete_cmd(f.cid, f.done.status, 0, f.done.data);
    }

    fn connect(&mut self, cid: u16, c: Connect, d: ConnectData) {
        match self.link.connect(&c, &d, self.local, Some(self.peer)) {
            Ok(done) => {
                if let Some(e) = &self.link.ctrl {
                    self.kill = e.killed();
                }
                self.q.connected(cid, done, Instant::now(), self.out.buf_mut());
            }
            Err(r) => self.q.connect_refused(cid, r.status, r.result, self.out.buf_mut()),
        }
    }

    /// Auth Send: the queue's DH-HMAC-CHAP step with fresh randomness.
    fn auth_send(&mut self, sqe: Sqe, data: Bytes) -> Option<anyhow::Result<()>> {
        match Entropy::from_os(&self.link.fabric.host_keys.seq) {
            Ok(e) => {
                let a = self.q.auth_send(&sqe, &data, e, self.out.buf_mut())?;
                self.act(a)
            }
            Err(e) => {
                log::error!("nvme: {}: no random numbers from the OS: {e}", self.peer);
                self.complete_cmd(sqe.cid(), Status::INTERNAL, 0, None);
                None
            }
        }
    }

    /// An I/O command: resolved once (row, namespace, extent), then run
    /// where [`dispatch::place`] says.
    fn io(&mut self, sqe: Sqe, data: Bytes) {
        let cid = sqe.cid();
        let (Some(sub), Some(host)) = (self.link.subsystem(), self.link.ctrl.as_ref().map(|e| e.host.clone())) else {
            return self.complete_cmd(cid, Status::INVALID_OPCODE.dnr(), 0, None);
        };
        let r = match io::resolve(&sub, &host, &sqe) {
            Ok(r) => r,
            Err(st) => {
                // Counted as the volume's failed I/O where there is one.
                let timer = self.link.io_started(&sqe, sub.namespace(sqe.nsid()).map(|n| &n.volume), self.now);
                return self.finished(Finished { cid, done: IoDone { status: st, data: None }, io: timer });
            }
        };
        let volume = r.namespace(&sub).map(|n| &n.volume);
        let device = volume.map(|v| v.info());
        let work = work(&r, &sqe, device, self.knobs.zero_copy_min, self.q.digests().data);
        let timer = self.link.io_started(&sqe, volume, self.now);
        let place = dispatch::place(work, device, volume.is_some_and(|v| v.limited()), self.knobs.inline_max);
        if place == Place::Submit {
            match io::plan_resolved(&sub, &r, &sqe, &data) {
                io::Plan::Submit { volume, request } => {
                    // The backend's own thread completes it; nothing here
                    // or on the blocking pool waits.
                    let tx = self.done_tx.clone();
                    return volume.submit(request, move |req, res| {
                        let _ = tx.send(Finished { cid, done: io::submitted(req, res), io: timer });
                    });
                }
                io::Plan::Done(status) => return self.finished(Finished { cid, done: IoDone { status, data: None }, io: timer }),
                io::Plan::Execute => {}
            }
        }
        if place != Place::Inline {
            let tx = self.done_tx.clone();
            tokio::task::spawn_blocking(move || {
                let run = std::panic::AssertUnwindSafe(|| io::execute_resolved(&sub, &r, &host, &sqe, &data));
                let done = std::panic::catch_unwind(run).unwrap_or(IoDone { status: Status::INTERNAL, data: None });
                let _ = tx.send(Finished { cid, done, io: timer });
            });
        } else if let Some((vol, off, len)) = r.read_extent(&sub) {
            let ok = self.read(cid, vol, off, len, work);
            self.link.io_done(timer, ok);
        } else {
            let done = io::execute_resolved(&sub, &r, &host, &sqe, &data);
            self.finished(Finished { cid, done, io: timer });
        }
    }

    /// A checked read that cannot block: its data goes from the volume
    /// straight into the send buffer behind each C2HData header, or, when
    /// `work` says zero-copy, from the page cache to the socket with
    /// sendfile. Whether it succeeded.
    fn read(&mut self, cid: u16, vol: &bw_block::Volume, off: u64, len: usize, work: Work) -> bool {
        let fail = |c: &mut Conn, st: Status| {
            c.complete_cmd(cid, st, 0, None);
            false
        };
        if len == 0 {
            self.complete_cmd(cid, Status::SUCCESS, 0, None);
            return true;
        }
        let ddgst = self.q.digests().data;
        let zero_copy = matches!(work, Work::Data { zero_copy: true, .. });
        match Payload::of(vol, off, len, zero_copy, self.knobs.mapped_reads && !ddgst) {
            Ok(Some(p)) => {
                for (hdr, r) in self.q.read_pdus(cid, len) {
                    self.out.buf_mut().extend_from_slice(hdr.bytes());
                    self.out.push_payload(&p, r.start, r.len());
                }
                self.q.read_sent(cid, self.out.buf_mut());
                return true;
            }
            Ok(None) => {}
            Err(e) => return fail(self, io::read_error(e)),
        }
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
