//! NVMe/TCP: one TCP connection is one queue (admin or I/O), a
//! [`TargetQueue`] (which holds all of the queue's protocol state: ICReq,
//! capsule checks, SQ head, R2T and H2CData, C2HData, Connect's own checks,
//! DH-HMAC-CHAP, login and keep-alive deadlines) in the one NVMe queue
//! wrapper ([`Queue`], shared with NVMe/RDMA). This file is the TCP
//! transport's I/O: the framing of what the socket brings, the send buffer
//! its answers go into, and where a command runs.
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
//!
//! Every byte to and from the host passes [`Tcp::fill`]'s reader and the
//! outbox (written by the driver; read payloads by reference, sent with
//! the headers gathered or with sendfile, both decided in [`Tcp::read`]).

use super::fabric::Fabric;
use super::link::Link;
use super::queue::{Finished, Io, Queue, Transport};
use crate::dispatch::{self, Place, Work};
use crate::driver::{self, Exit, Knobs, Step};
use crate::framing::FrameReader;
use crate::limits::Ticket;
use crate::metrics;
use crate::outbox::Outbox;
use crate::Shutdown;
use bw_nvme::auth::Entropy;
use bw_nvme::fabric_queue::Connected;
use bw_nvme::nvm_io::{self as io, IoDone, Resolved};
use bw_nvme::pdu;
use bw_nvme::queue_entry::{nvm, Sqe};
use bw_nvme::target_queue::{Action, QueueConfig, QueueError, Received, TargetQueue};
use bw_nvme::Status;
use bytes::{Bytes, BytesMut};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// NVMe/TCP framing for the shared reader: the common header's PLEN is the
/// PDU's length; `max_plen` bounds what a peer can make us buffer.
struct NvmeFraming {
    max_plen: u32,
}

impl crate::framing::Framing for NvmeFraming {
    fn header_len(&self) -> usize {
        pdu::CH_LEN
    }
    fn pdu_len(&self, header: &[u8]) -> usize {
        pdu::CommonHeader::parse(header).plen as usize
    }
    fn max_pdu(&self) -> usize {
        self.max_plen as usize
    }
    fn growth(&self) -> crate::framing::Growth {
        // `pdu::decode` reserves exactly what a partial PDU still needs;
        // only a full buffer needs more room (reserving more while earlier
        // PDUs' payloads are still referenced would copy the partial PDU).
        crate::framing::Growth { low_water: 1, chunk: 64 * 1024, large_pdu: usize::MAX }
    }
}

/// NVMe/TCP's I/O under the queue wrapper.
pub struct Tcp {
    q: TargetQueue,
    /// What goes to the host: PDUs, and read payloads by reference.
    out: Outbox,
    /// What the queue's state machine says while it takes a PDU in, or
    /// as a mapped read's payload is queued (R2Ts, a TermReq, a refused
    /// command's completion, a read's CapsuleResp): moved to `out` only
    /// when there is any ([`Tcp::flush_said`]). Most PDUs say nothing there,
    /// and `out`'s byte buffer, asked for each time, cost ~30
    /// instructions per PDU and, behind a mapped read's payload, a new
    /// buffer started for nothing (docs/notes/2026-11-27-h51z2-nvme-target.md).
    said: Vec<u8>,
    local: Option<SocketAddr>,
    peer: SocketAddr,
    /// Commands run on the blocking pool or by the backend come back here.
    done_tx: mpsc::UnboundedSender<Finished>,
    knobs: Knobs,
    /// Over TLS: the suite, record layer and PSK identity (the Connect must
    /// be the identity's), counted in the metrics while it lives.
    tls: Option<(super::tls::Secured, crate::metrics::TlsGuard)>,
}

/// What wakes a queue from outside (see [`driver::Session::signal`]).
pub enum Signal {
    /// A live change completed asynchronous event requests (admin queue).
    Events,
    /// The controller was torn down.
    Killed,
}

/// `login_timeout`: from accept to a successful Connect; a connection that
/// is silent, sends half a PDU or never connects is dropped then. `ticket`
/// holds the connection's places in the admission limits until it ends.
/// `tls`: the port's (see super::tls: the handshake, if any, comes first).
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    mut stream: TcpStream,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    fabric: Arc<Fabric>,
    mut shutdown: Shutdown,
    login_timeout: Duration,
    ticket: Ticket,
    tls: bw_nvme::logpage::SecureChannel,
) -> anyhow::Result<()> {
    // One C2HData per read (up to MDTS): 128 KiB PDUs cost the target 14%
    // and the host 21% more CPU per 1 MiB read (docs/notes/2026-11-22-nvme-tcp-data-path.md).
    let deadline = Instant::now() + login_timeout;
    let cfg = QueueConfig::new(deadline);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let knobs = fabric.knobs;
    let link = Link::new(fabric, "nvme", peer.to_string());
    let tcp = Tcp { q: TargetQueue::new(cfg), out: Outbox::default(), said: Vec::new(), local, peer, done_tx, knobs, tls: None };
    let mut c = Queue::new(link, tcp, ticket);
    let _counted = metrics::global().connection(metrics::Proto::Nvme);
    let mut reader = FrameReader::with_capacity(256 * 1024);
    if let Some(s) = super::tls::start(&stream, tls, c.link.fabric.tls_keys.clone(), c.link.fabric.tls_records, c.t.knobs.tls_sealing, peer, local, deadline, &mut reader, &mut c.t.out).await? {
        if s.layer == bw_tls::RecordLayer::User {
            // Reads are queued as without TLS (small ones from the
            // volume's mapping, large ones as file payloads) and the outbox
            // copies them into the records it seals in place: one copy in
            // user space (through the send buffer it was two). Mapped only
            // where the fault-safe copy exists (see the outbox).
            c.t.knobs.mapped_reads &= bw_block::MappedBytes::can_copy();
        }
        let guard = metrics::global().tls_connection(s.layer);
        c.t.tls = Some((s, guard));
    }
    let r = loop {
        match driver::run(&stream, &mut reader, &mut c, &mut done_rx, &mut shutdown, &knobs).await {
            Exit::Closed(r) => break r,
            // The login is over (the queue gave its ticket's pending-login
            // place back).
            Exit::Returned => {}
        }
        // Discovery controllers stay on the shared runtime.
        if c.link.ctrl.as_ref().is_some_and(|e| e.subsys.is_some()) {
            // The stream is gone if this fails; the connection ends, and
            // the teardown below still runs.
            match c.ticket.own_thread(stream).await {
                Ok(s) => stream = s,
                Err(e) => {
                    c.close();
                    return Err(e.into());
                }
            }
        }
    };
    let r = super::tls::explain_end(&stream, c.t.tls.as_ref().map(|t| &t.0), r);
    c.close();
    // Let queued replies (a TermReq, a Disconnect's completion) go out,
    // and over TLS a close_notify after them.
    c.t.out.close_notify();
    driver::close(stream, &mut c.t.out).await;
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

impl driver::Session for Queue<Tcp> {
    type Done = Finished;
    type Signal = Signal;

    fn outbox(&mut self) -> &mut Outbox {
        &mut self.t.out
    }

    fn fill(&self, reader: &mut FrameReader, stream: &TcpStream) -> std::io::Result<usize> {
        self.t.fill(reader, stream)
    }

    fn receive(&mut self, buf: &mut BytesMut, now: Instant) -> Step {
        if self.killed() {
            return Step::Close(Ok(()));
        }
        let was_logged_in = self.link.logged_in;
        self.now = now;
        let r = self.t.q.receive(buf, now, &mut self.t.said);
        // Before whatever the action queues.
        self.t.flush_said();
        match r {
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
        self.t.q.poll_timeout()
    }

    fn handle_timeout(&mut self, now: Instant) -> Step {
        match self.t.q.handle_timeout(now).and_then(|a| self.act(a)) {
            Some(end) => Step::Close(end),
            None => Step::Pdu,
        }
    }

    fn signal(&self) -> impl Future<Output = Signal> + Send + 'static {
        // The admin queue sends events a live change made.
        let events = self.link.ctrl.clone().filter(|_| self.t.q.qid() == 0 && self.link.logged_in);
        let kill = self.kill_signal();
        async move {
            let events = async {
                match &events {
                    Some(e) => e.events_ready.notified().await,
                    None => std::future::pending().await,
                }
            };
            let killed = async {
                match kill {
                    // (Also when the controller is gone.)
                    Some(mut k) => drop(k.wait_for(|k| *k).await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = events => Signal::Events,
                _ = killed => Signal::Killed,
            }
        }
    }

    fn on_signal(&mut self, s: Signal) -> Step {
        match s {
            Signal::Events => {
                self.send_events();
                Step::Pdu
            }
            Signal::Killed => Step::Close(Ok(())),
        }
    }

    fn before_send(&mut self) {
        self.link.timed();
    }
}

impl Transport for Tcp {
    type Error = QueueError;
    const KEYED_SGLS: bool = false;

    fn qid(&self) -> u16 {
        self.q.qid()
    }
    fn local(&self) -> Option<SocketAddr> {
        self.local
    }
    fn peer(&self) -> Option<SocketAddr> {
        Some(self.peer)
    }
    fn tls(&self) -> Option<&super::tls::Secured> {
        self.tls.as_ref().map(|(s, _)| s)
    }
    fn connected(&mut self, cid: u16, c: Connected, now: Instant) {
        self.q.connected(cid, c, now, self.out.buf_mut());
    }
    fn connect_refused(&mut self, cid: u16, status: Status, result: u64) {
        self.q.connect_refused(cid, status, result, self.out.buf_mut());
    }
    fn auth_send(&mut self, sqe: &Sqe, data: &[u8], entropy: Entropy) -> Option<Action> {
        self.q.auth_send(sqe, data, entropy, self.out.buf_mut())
    }
    #[inline]
    fn complete(&mut self, cid: u16, status: Status, result: u64, data: Option<Bytes>) {
        self.q.complete(cid, status, result, data, self.out.buf_mut());
    }

    /// Where [`dispatch::place`] says: submitted to a backend that
    /// completes on its own threads, on the blocking pool, or here (a read
    /// straight into the send buffer or out of the page cache).
    #[inline]
    fn run(c: &mut Queue<Tcp>, cmd: Io) {
        let Io { sqe, data, sub, host, r, timer } = cmd;
        let cid = sqe.cid();
        let volume = r.namespace(&sub).map(|n| &n.volume);
        let device = volume.map(|v| v.info());
        let limited = volume.is_some_and(|v| v.limited());
        let work = work(&r, &sqe, device, c.t.knobs.zero_copy_min, c.t.q.digests().data);
        let place = dispatch::place(work, device, limited, c.t.knobs.inline_max);
        if place == Place::Submit {
            match io::plan_resolved(&sub, &r, &sqe, &data) {
                io::Plan::Submit { volume, request } => {
                    // The backend's own thread completes it; nothing here
                    // or on the blocking pool waits.
                    let tx = c.t.done_tx.clone();
                    return volume.submit(request, move |req, res| {
                        let _ = tx.send(Finished { cid, done: io::submitted(req, res), io: timer });
                    });
                }
                io::Plan::Done(status) => return c.finished(Finished { cid, done: IoDone { status, data: None }, io: timer }),
                io::Plan::Execute => {}
            }
        }
        if place != Place::Inline {
            let tx = c.t.done_tx.clone();
            tokio::task::spawn_blocking(move || {
                let run = std::panic::AssertUnwindSafe(|| io::execute_resolved(&sub, &r, &host, &sqe, &data));
                let done = std::panic::catch_unwind(run).unwrap_or(IoDone { status: Status::INTERNAL, data: None });
                let _ = tx.send(Finished { cid, done, io: timer });
            });
        } else if let Some((vol, off, len)) = r.read_extent(&sub) {
            let ok = c.t.read(cid, vol, off, len, work);
            c.link.io_done(timer, ok);
        } else {
            let done = io::execute_resolved(&sub, &r, &host, &sqe, &data);
            c.finished(Finished { cid, done, io: timer });
        }
    }
}

impl Tcp {
    /// Queue what the state machine said into `said`, if anything.
    #[inline]
    fn flush_said(&mut self) {
        if !self.said.is_empty() {
            self.out.buf_mut().extend_from_slice(&self.said);
            self.said.clear();
        }
    }

    /// Append what the socket holds to `reader` without waiting, as
    /// NVMe/TCP's framing wants it.
    fn fill(&self, reader: &mut FrameReader, stream: &TcpStream) -> std::io::Result<usize> {
        reader.try_fill(stream, &NvmeFraming { max_plen: self.q.max_pdu_len() })
    }

    /// A checked read that cannot block: its data goes from the volume
    /// straight into the send buffer behind each C2HData header, or, when
    /// `work` says zero-copy, from the page cache to the socket with
    /// sendfile. Whether it succeeded (it completed the command either way).
    #[inline]
    fn read(&mut self, cid: u16, vol: &bw_block::Volume, off: u64, len: usize, work: Work) -> bool {
        let fail = |t: &mut Tcp, st: Status| {
            t.complete(cid, st, 0, None);
            false
        };
        if len == 0 {
            self.complete(cid, Status::SUCCESS, 0, None);
            return true;
        }
        let ddgst = self.q.digests().data;
        let zero_copy = matches!(work, Work::Data { zero_copy: true, .. });
        match self.out.payload(vol, off, len, zero_copy, self.knobs.mapped_reads && !ddgst) {
            Ok(Some(p)) => {
                for (hdr, r) in self.q.read_pdus(cid, len) {
                    self.out.push_headed(hdr.bytes(), &p, r.start, r.len());
                }
                self.q.read_sent(cid, &mut self.said);
                self.flush_said();
                return true;
            }
            Ok(None) => {}
            Err(e) => return fail(self, io::read_error(e)),
        }
        // Room for the whole read and its headers at once: grown PDU by
        // PDU, a large read's buffer was reallocated (and copied) on the
        // way.
        // (A header and two digests, 32 bytes, per 4 KiB at most.)
        let b = self.out.buf_mut();
        b.reserve(len + (len / 4096 + 1) * 32);
        let start = b.len();
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
