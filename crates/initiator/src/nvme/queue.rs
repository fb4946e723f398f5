//! One NVMe/TCP queue from the host side: the socket around a
//! [`HostQueue`], which holds the queue's protocol state (command IDs, R2T
//! answers, C2HData reassembly, completion matching, timeouts). A reader
//! task feeds it what the controller sends, a writer task sends what it
//! queued, and each caller waits for its own command. Read data goes
//! straight from the socket into the caller's buffer when no data digest
//! is in use (one copy, no staging).

use crate::{ClientError, ConnectOptions, Result};
use bw_nvme::queue_entry::Sqe;
use bw_nvme::host_queue::{Context, DirectRead, HostConfig, HostError, HostQueue, Payload, Ticket};
use bw_nvme::pdu::{self, Digests};
use bytes::{Bytes, BytesMut};
use crate::placed::{PlacedRead, Placing};
use std::sync::{Arc, Mutex, MutexGuard};
use crate::waiting::{self, Deadlines, InFlight, Mailboxes, Waits};
use std::future::Future;
use std::task::Poll;
use std::time::Instant;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;
use bw_tls::secure::RecordReader;

pub use bw_nvme::host_queue::Done;

/// The caller's buffer for a read, filled in place by the reader task.
struct Dest {
    ptr: *mut u8,
    len: usize,
}

/// A caller waiting for its command: its mailbox (see
/// [`crate::waiting`]) and maybe the buffer its read data goes to.
struct Waiter {
    mailbox: usize,
    dest: Option<Dest>,
}

// SAFETY: the Dest pointer is only dereferenced (in `read_buf`) under the
// queue lock while the submitting future that owns the buffer is alive:
// that future cancels its ticket under the same lock before the buffer can
// go away (`InFlight`'s Drop), which drops the Waiter's place in the queue.
unsafe impl Send for Dest {}

impl Context for Waiter {
    fn read_buf(&mut self) -> Option<&mut [u8]> {
        // SAFETY: see `unsafe impl Send for Dest`.
        self.dest
            .as_mut()
            .map(|d| unsafe { std::slice::from_raw_parts_mut(d.ptr, d.len) })
    }
}

/// The queue's state machine and the callers waiting on it.
struct State {
    q: HostQueue<Waiter>,
    mailboxes: Mailboxes<std::result::Result<Done, HostError>>,
    /// Where commands' deadlines count from.
    clock: waiting::SubmitClock,
}

struct Shared {
    state: Mutex<State>,
    /// Tells the writer the queue has something to send.
    wake: crate::send::SendWake,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hand finished commands to their callers (each woken once); wake the
    /// writer if there is something to send.
    fn deliver(&self, st: &mut State) {
        while let Some((w, r)) = st.q.poll_completion() {
            st.mailboxes.post(w.mailbox, r);
        }
        if st.q.has_transmit() || st.q.dead().is_some() {
            self.wake.wake();
        }
    }

    fn fail_all(&self, why: &str) {
        let mut st = self.lock();
        st.q.fail_all(why);
        self.deliver(&mut st);
    }
}

impl Deadlines for Shared {
    fn next_deadline(&self) -> std::result::Result<Option<Instant>, ()> {
        let st = self.lock();
        if st.q.dead().is_some() {
            return Err(());
        }
        Ok(st.q.poll_timeout())
    }
    fn expire(&self, now: Instant) {
        let mut st = self.lock();
        st.q.handle_timeout(now);
        self.deliver(&mut st);
    }
}

impl Waits for Shared {
    type Result = std::result::Result<Done, HostError>;
    type Ticket = Ticket;
    fn poll_mailbox(&self, m: usize, cx: &mut std::task::Context<'_>) -> Poll<Self::Result> {
        self.lock().mailboxes.poll(m, cx)
    }
    fn cancel(&self, t: Ticket, m: usize) {
        let mut st = self.lock();
        st.q.cancel(t);
        st.mailboxes.release(m);
    }
}

pub struct TcpQueue {
    pub qid: u16,
    /// With TLS: the suite and who keeps the records ("TLS_AES_128_GCM_SHA256, ktls"),
    /// then a binding other than TP 8011's ("..., user, SHA-384 PSK bound with SHA-256 as tlshd 1.0 does").
    pub tls: Option<String>,
    shared: Arc<Shared>,
    slots: waiting::Slots,
    /// The reader and the timer (the writer ends when the queue dies).
    tasks: [tokio::task::JoinHandle<()>; 2],
}

impl Drop for TcpQueue {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        // The writer ends when it sees the queue dead.
        self.shared.fail_all("queue closed");
    }
}

fn proto(s: impl Into<String>) -> ClientError {
    ClientError::Protocol(s.into())
}

impl TcpQueue {
    /// TCP connect and the ICReq/ICResp exchange. `depth` commands may be in
    /// flight at once (the caller connects with sqsize = depth - 1 or more).
    /// Digests, the timeout and the TCP options come from `opts`.
    /// With `tls`, the connection is secured first (see super::tls).
    pub async fn open(host: &str, port: u16, qid: u16, depth: usize, opts: &ConnectOptions, tls: Option<&super::tls::TlsClient>) -> Result<TcpQueue> {
        let (digests, timeout) = (Digests { header: opts.header_digest, data: opts.data_digest }, opts.timeout);
        let (stream, mut buf, mut sealer, mut reader, described) = match tls {
            None => (crate::connect_tcp(host, port, opts).await?, BytesMut::with_capacity(256 * 1024), None, None, None),
            Some(t) => {
                let (stream, sec, bound) = t.open(host, port, opts).await?;
                let described = match bound {
                    None => format!("{}, {}", sec.suite, sec.layer),
                    // After the layer: bw_lab reads "suite, layer" off the front.
                    Some(b) => format!("{}, {}, {b}", sec.suite, sec.layer),
                };
                log::info!("nvme: queue {qid}: TLS as {:?}: {described}", sec.identity);
                let mut buf = BytesMut::with_capacity(256 * 1024);
                buf.extend_from_slice(&sec.plaintext);
                let (sealer, reader) = match sec.user {
                    Some(u) => (Some(u.sealer), Some(u.reader)),
                    None => (None, None),
                };
                (stream, buf, sealer, reader, Some(described))
            }
        };
        let (mut rd, mut wr) = stream.into_split();
        let depth = depth.clamp(1, 65535);
        let mut q = HostQueue::new(HostConfig {
            qid,
            digests,
            depth,
            timeout,
            incapsule: 8192,
        });
        let mut ic = Vec::new();
        q.poll_transmit(&mut ic, &mut Vec::new());
        crate::send::send(&mut wr, sealer.as_mut(), &ic).await?;
        tokio::time::timeout(timeout, async {
            while !q.is_ready() {
                if !q.receive(&mut buf).map_err(|e| proto(e.to_string()))?
                    && receive(&mut rd, reader.as_mut(), &mut buf, u64::MAX).await? == 0
                {
                    return Err(ClientError::Disconnected(
                        "connection closed during ICReq".into(),
                    ));
                }
            }
            Ok(())
        })
        .await
        .map_err(|_| ClientError::Timeout("ICResp".into()))??;
        let shared = Arc::new(Shared {
            state: Mutex::new(State { q, mailboxes: Mailboxes::default(), clock: waiting::SubmitClock::new() }),
            wake: Default::default(),
        });
        let sh = shared.clone();
        tokio::spawn(async move { crate::send::send_loop(wr, &*sh, sealer).await });
        let reader = tokio::spawn(read_loop(rd, buf, digests, shared.clone(), reader));
        let timer = tokio::spawn(waiting::timer_loop(shared.clone(), timeout));
        Ok(TcpQueue {
            qid,
            tls: described,
            shared,
            slots: waiting::Slots::new(depth),
            tasks: [reader, timer],
        })
    }

    /// Largest in-capsule data the controller takes on this queue.
    pub fn set_incapsule(&self, n: usize) {
        self.shared.lock().q.set_incapsule(n);
    }

    /// Submit one command. `out` is data for the controller: sent in the
    /// capsule when it fits, else on R2T. Returns the completion and any
    /// data the controller sent, whatever its status.
    pub async fn submit_raw(&self, sqe: Sqe, out: Option<Bytes>, in_len: u32) -> Result<Done> {
        self.submit_inner(sqe, out.map_or(Payload::None, Payload::Owned), in_len, None, Status::AsIs).await
    }

    /// Submit a command that writes `data`; an unsuccessful status is an
    /// error. A borrowed payload is copied once (into the capsule, or to a
    /// buffer for R2T); an owned one is kept, not copied, until sent.
    // Not `async`: the future is `submit_inner`'s, not one more layer
    // around it polled twice per command (as with `submit_read`).
    pub fn submit_write<'a>(&'a self, sqe: Sqe, data: Payload<'a>) -> impl Future<Output = Result<Done>> + 'a {
        self.submit_inner(sqe, data, 0, None, Status::MustSucceed)
    }

    /// Submit a command that reads `buf.len()` bytes into `buf`; an
    /// unsuccessful status is an error.
    pub fn submit_read<'a>(&'a self, sqe: Sqe, buf: &'a mut [u8]) -> impl Future<Output = Result<Done>> + 'a {
        let dest = Dest {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        };
        self.submit_inner(sqe, Payload::None, buf.len() as u32, Some(dest), Status::MustSucceed)
    }

    /// Like [`TcpQueue::submit_raw`] but an unsuccessful status is an error.
    pub async fn submit(&self, sqe: Sqe, out: Option<Bytes>, in_len: u32) -> Result<Done> {
        self.submit_inner(sqe, out.map_or(Payload::None, Payload::Owned), in_len, None, Status::MustSucceed).await
    }

    fn client_error(&self, e: HostError, sqe: &Sqe) -> ClientError {
        match e {
            HostError::Closed(why) => ClientError::Disconnected(why),
            HostError::Timeout => {
                ClientError::Timeout(format!("queue {} command {sqe:?}", self.qid))
            }
            e => proto(format!("queue {}: {e}", self.qid)),
        }
    }

    /// `dest`'s buffer must outlive the returned future (the reader writes
    /// into it until the command completes or the future is dropped).
    async fn submit_inner(
        &self,
        sqe: Sqe,
        out: Payload<'_>,
        in_len: u32,
        dest: Option<Dest>,
        status: Status,
    ) -> Result<Done> {
        let _slot = self.slots.take().await;
        // No timer of its own: the queue's timer task fails it at its
        // deadline (`waiting::timer_loop`).
        let waker = waiting::own_waker().await;
        let (ticket, mailbox) = {
            let mut st = self.shared.lock();
            let mailbox = st.mailboxes.open_for(waker);
            let now = st.clock.now_or_later();
            match st.q.submit(sqe, out, in_len, Waiter { mailbox, dest }, now) {
                Ok(t) => {
                    self.shared.wake.wake();
                    (t, mailbox)
                }
                Err((_, e)) => {
                    st.mailboxes.release(mailbox);
                    return Err(self.client_error(e, &sqe));
                }
            }
        };
        let d = InFlight::new(&*self.shared, ticket, mailbox).wait().await.map_err(|e| self.client_error(e, &sqe))?;
        match status {
            Status::AsIs => Ok(d),
            Status::MustSucceed => succeeded(self.qid, sqe.opcode(), d),
        }
    }

    pub fn is_dead(&self) -> bool {
        self.shared.lock().q.dead().is_some()
    }
}

/// What a submission makes of an unsuccessful completion status.
#[derive(Clone, Copy)]
enum Status {
    /// Returned with the rest of the completion.
    AsIs,
    /// An error ([`succeeded`]).
    MustSucceed,
}

/// `d`, or an error naming the queue and opcode if its status is not
/// success (both transports).
pub(super) fn succeeded(qid: u16, op: u8, d: Done) -> Result<Done> {
    if !d.cqe.status.is_success() {
        return Err(ClientError::Target(format!("queue {qid} opcode {op:#04x}: {}", d.cqe.status)));
    }
    Ok(d)
}

impl crate::send::Transmit for Shared {
    fn wake(&self) -> &crate::send::SendWake {
        &self.wake
    }
    fn poll(&self, out: &mut Vec<u8>, refs: &mut Vec<(usize, Bytes)>) -> bool {
        let mut st = self.lock();
        st.q.poll_transmit(out, refs);
        st.q.dead().is_some()
    }
    fn fail_all(&self, why: &str) {
        Shared::fail_all(self, why)
    }
}

crate::placed::plans_by!(HostQueue<Waiter>, DirectRead, pdu::DATA_HLEN);

/// Read more into `buf` (at most `limit` bytes without TLS): the bytes
/// added, 0 at the end of the stream.
async fn receive(rd: &mut OwnedReadHalf, reader: Option<&mut RecordReader>, buf: &mut BytesMut, limit: u64) -> std::io::Result<usize> {
    match reader {
        None => rd.take(limit).read_buf(buf).await,
        Some(r) => loop {
            rd.readable().await?;
            match r.fill(rd, buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                other => return other,
            }
        },
    }
}

/// Without data digests, while a large read is in flight, socket reads
/// stop at this many bytes so that little of a large read's payload lands
/// in the staging buffer (it goes straight to the caller's buffer
/// instead) ...
const READ_CHUNK: usize = bw_nvme::host_queue::LARGE_READ;
/// ... and otherwise at this many: a burst of 32 answers to 4 KiB reads
/// (132 KiB) in one read, as the iSCSI initiator reads (where nothing was
/// planned: see `placed`). With 64 KiB, and
/// the buffer grown only once full (so that a read often had only the few
/// KiB left at its end to fill), this queue made 2.5x the iSCSI
/// initiator's socket reads at 4 KiB QD32 (28k against 11k per 200k
/// reads, docs/notes/2026-11-26-floor-4.md).
const READ_CHUNK_SMALL_IO: usize = 256 * 1024;

/// Read the rest of a C2HData payload from the socket straight into its
/// command's buffer (one copy: measured against a copy through a 64 KiB
/// staging buffer, 220 against 288 µs of client CPU per 1 MiB read, see
/// docs/notes/2026-11-22-nvme-tcp-data-path.md). While the payload is
/// large, the socket is told not to wake us before `SO_RCVLOWAT` bytes
/// (what is left of it, at most [`crate::direct::RCVLOWAT_MAX`]) are there: fewer
/// wakeups than one per segment (each costs the sender a cross-CPU IPI).
async fn recv_direct(
    rd: &OwnedReadHalf,
    landing: &mut crate::direct::Landing,
    sh: &Shared,
    dr: &mut DirectRead,
    placed: bool,
) -> std::result::Result<(), String> {
    if placed {
        landing.go_on_placed();
    } else {
        landing.begin();
    }
    crate::direct::recv(rd, dr.left(), || {
        // Under the queue lock: a caller that gives up takes its buffer
        // back under the same lock (`InFlight`).
        let r = sh.lock().q.direct_fill(dr, |dst| landing.read(rd, dst));
        crate::direct::Filled::after(r, dr.left(), 0)
    })
    .await
}

/// [`recv_direct`] through the user-space record layer: the records are
/// opened in the command's buffer ([`RecordReader::fill_direct`]), what
/// follows the payload lands in `buf`. The socket's low-water mark counts
/// the part of a record already read and held, as it is after each
/// attempt: one that read the start of a record places nothing yet holds
/// those bytes, and a mark counted before it waited for more bytes than
/// the target had left to send (a read from nvmet over kTLS in the VM
/// timed out so in CI, 2026-11-26).
async fn recv_direct_tls(
    rd: &OwnedReadHalf,
    r: &mut RecordReader,
    buf: &mut BytesMut,
    sh: &Shared,
    dr: &mut DirectRead,
) -> std::result::Result<(), String> {
    crate::direct::recv(rd, dr.left(), || {
        let got = sh.lock().q.direct_fill(dr, |dst| r.fill_direct(rd, dst, buf));
        crate::direct::Filled::after(got, dr.left(), r.pending())
    })
    .await
}

/// Hand the queue every whole PDU in `buf`: what is left is a large
/// payload to receive straight into its command's buffer (`Some`), or
/// nothing until the socket brings more (`None`). A payload found whole in
/// `buf` ends the header-only reads that follow a large payload.
fn handle_buffered(q: &mut HostQueue<Waiter>, buf: &mut BytesMut, d: Digests, header_only: &mut bool) -> std::result::Result<Option<DirectRead>, String> {
    loop {
        match q.begin_direct(buf) {
            Err(e) => return Err(e.to_string()),
            // All of its payload was in `buf`.
            Ok(Some(dr)) if dr.is_done() => {
                *header_only = false;
                continue;
            }
            Ok(Some(dr)) => return Ok(Some(dr)),
            Ok(None) => {}
        }
        // A data PDU's header still incomplete: read on without the
        // decoder reserving room for the whole payload.
        let hdr_need = if buf.len() >= pdu::CH_LEN { (buf[3] as usize).max(pdu::DATA_HLEN) } else { pdu::CH_LEN };
        if !d.data && buf.first() == Some(&pdu::kind::C2H_DATA) && buf.len() < hdr_need {
            return Ok(None);
        }
        match q.receive(buf) {
            Err(e) => return Err(e.to_string()),
            Ok(true) => {}
            Ok(false) => return Ok(None),
        }
    }
}

async fn read_loop(mut rd: OwnedReadHalf, mut buf: BytesMut, d: Digests, sh: Arc<Shared>, mut tls: Option<RecordReader>) {
    // After a large payload went straight to its buffer, the next read takes
    // just a data PDU header: the next large payload then follows it
    // straight to its buffer too instead of partly into `buf`.
    let hdr_len = (pdu::DATA_HLEN + if d.header { pdu::DIGEST_LEN } else { 0 }) as u64;
    let mut header_only = false;
    let mut landing = crate::direct::Landing::new();
    let mut placing = Placing::new();
    let why = loop {
        // Everything the last socket read brought is handled under one
        // lock, and the callers of the commands it finished are woken
        // together: taking the lock twice per answer (to start it, then
        // to hand it over) cost ~150 instructions of a 4 KiB QD32 read
        // (docs/notes/2026-11-27-h51k-client.md). Through the
        // user-space record layer, payloads are opened in their command's
        // buffer (recv_direct_tls); only a record shared with the next PDU
        // goes through `buf`.
        let (step, large_reads, placed) = {
            let mut st = sh.lock();
            let step = handle_buffered(&mut st.q, &mut buf, d, &mut header_only);
            let large = st.q.large_reads() > 0;
            // Without TLS, the stream at a header: read the answers
            // expected next straight into place (with only large reads
            // in flight and none of them next, as before).
            let placed = match step {
                Ok(None) if tls.is_none() && !header_only && buf.len() < pdu::DATA_HLEN => Some(placing.read(&rd, &mut buf, &mut st.q, !large)),
                _ => None,
            };
            sh.deliver(&mut st);
            (step, large, placed)
        };
        match placed {
            None | Some(Ok(PlacedRead::Unplanned)) => {}
            Some(Ok(PlacedRead::Read(None))) => continue,
            Some(Ok(PlacedRead::Read(Some(mut dr)))) => {
                if let Err(why) = recv_direct(&rd, &mut landing, &sh, &mut dr, true).await {
                    break why;
                }
                let mut st = sh.lock();
                sh.deliver(&mut st);
                continue;
            }
            Some(Ok(PlacedRead::Closed)) => break "target closed the connection".to_string(),
            Some(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Err(e) = rd.readable().await {
                    break format!("receive failed: {e}");
                }
                continue;
            }
            Some(Err(e)) => break format!("receive failed: {e}"),
        }
        match step {
            Err(why) => break why,
            Ok(Some(mut dr)) => {
                let large = dr.left() >= READ_CHUNK;
                let r = match tls.as_mut() {
                    None => recv_direct(&rd, &mut landing, &sh, &mut dr, false).await,
                    Some(r) => recv_direct_tls(&rd, r, &mut buf, &sh, &mut dr).await,
                };
                if let Err(why) = r {
                    break why;
                }
                header_only = large;
                let mut st = sh.lock();
                sh.deliver(&mut st);
                continue;
            }
            Ok(None) => {}
        }
        let limit = match (header_only, large_reads) {
            (true, _) => (hdr_len as usize).saturating_sub(buf.len()).max(1),
            (false, true) => READ_CHUNK,
            (false, false) => READ_CHUNK_SMALL_IO,
        };
        // Room for a whole chunk: a read is as short as the buffer's room.
        if buf.capacity() - buf.len() < limit.min(READ_CHUNK) {
            buf.reserve(limit);
        }
        header_only = false;
        let r = receive(&mut rd, tls.as_mut(), &mut buf, if d.data { u64::MAX } else { limit as u64 }).await;
        match r {
            Ok(0) => break "target closed the connection".to_string(),
            Ok(_) => {}
            Err(e) => break format!("receive failed: {e}"),
        }
    };
    log::debug!(
        "nvme queue reader: {why} (planned reads {} placing {} payloads, {} answered out of turn, {} times nothing to plan)",
        placing.reads,
        placing.placed,
        placing.misses,
        placing.noplan
    );
    sh.fail_all(&why);
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_nvme::queue_entry::admin;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    /// The controller's side of the connection's start, without TLS.
    async fn answer_icreq(s: &mut tokio::net::TcpStream) {
        let mut ic = [0u8; pdu::IC_LEN];
        s.read_exact(&mut ic).await.unwrap();
        let mut out = BytesMut::new();
        let resp = pdu::IcResp { pfv: 0, cpda: 0, digests: Digests::default(), maxh2cdata: 128 << 10 };
        pdu::Pdu::IcResp(resp).encode(Digests::default(), &mut out);
        s.write_all(&out).await.unwrap();
    }

    /// The queue has no timer per command: its one timer task must still
    /// fail a command the controller never answers, and the queue with it.
    #[tokio::test]
    async fn a_command_never_answered_times_out_and_takes_the_queue_down() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let controller = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            answer_icreq(&mut s).await;
            // Take commands, answer none.
            let mut sink = vec![0u8; 64 << 10];
            while s.read(&mut sink).await.is_ok_and(|n| n > 0) {}
        });
        let opts = ConnectOptions { timeout: Duration::from_millis(200), ..Default::default() };
        let q = TcpQueue::open("127.0.0.1", port, 0, 4, &opts, None).await.unwrap();
        // (The bound only turns a hang into a failure; nothing is timed.)
        let r = tokio::time::timeout(Duration::from_secs(120), q.submit(Sqe::new(admin::KEEP_ALIVE, 0, 0), None, 0))
            .await
            .expect("the command was never failed");
        assert!(matches!(r, Err(ClientError::Timeout(_))), "{r:?}");
        assert!(q.is_dead());
        controller.abort();
    }

    /// How many received bytes the socket bound to `local` (this host's
    /// side of a loopback connection) holds unread: `rx_queue` in
    /// /proc/net/tcp.
    fn unread_on(local: std::net::SocketAddr) -> Option<u64> {
        let want = format!("0100007F:{:04X}", local.port());
        let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
        let row = table.lines().find(|l| l.split_whitespace().nth(1) == Some(want.as_str()))?;
        let queues = row.split_whitespace().nth(4)?;
        u64::from_str_radix(queues.split(':').nth(1)?, 16).ok()
    }

    /// Send `wire` to the host at `host` in two writes, the second (from
    /// `cut` on) once the host has read all of the first; then take what
    /// the host sends until it closes.
    async fn send_in_two(s: &mut tokio::net::TcpStream, host: std::net::SocketAddr, wire: &[u8], cut: usize) {
        let (first, last) = wire.split_at(cut);
        s.write_all(first).await.unwrap();
        while unread_on(host) != Some(0) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        s.write_all(last).await.unwrap();
        let mut sink = vec![0u8; 4096];
        while s.read(&mut sink).await.is_ok_and(|n| n > 0) {}
    }

    /// Through the user-space TLS record layer, a read's payload whose
    /// last record comes in two parts: the reader takes the first part off
    /// the socket (held, nothing placed) and must then wait for the 10
    /// bytes still to come, not for the payload bytes it had left before.
    /// (It waited for those, past the command's timeout, reading from
    /// nvmet over kTLS through the VM's user networking, which splits
    /// records anywhere: CI, 2026-11-26.)
    #[tokio::test]
    async fn a_tls_payload_whose_last_record_comes_in_two_parts_completes() {
        const KEY: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
        const LEN: usize = 20_000;
        let payload: Vec<u8> = (0..LEN).map(|i| (i * 7 + 3) as u8).collect();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let sent = payload.clone();
        let controller = tokio::spawn(async move {
            let (mut s, host) = l.accept().await.unwrap();
            let store = std::sync::Arc::new(bw_tls::handshake::OneKey::any_host(KEY).unwrap());
            let mut sec = bw_tls::secure::accept(&s, store, BytesMut::new(), bw_tls::RecordChoice::User).await.unwrap();
            let mut got = sec.plaintext.split();
            let u = sec.user.as_mut().unwrap();
            let next = async |s: &tokio::net::TcpStream, got: &mut BytesMut, u: &mut bw_tls::secure::UserRecords| loop {
                if let Some(p) = pdu::decode(got, Digests::default(), u32::MAX).unwrap() {
                    return p;
                }
                s.readable().await.unwrap();
                match u.fill(s, got) {
                    Ok(n) => assert!(n > 0, "the host closed"),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            };
            assert!(matches!(next(&s, &mut got, u).await, pdu::Pdu::IcReq(_)));
            let mut plain = BytesMut::new();
            let resp = pdu::IcResp { pfv: 0, cpda: 0, digests: Digests::default(), maxh2cdata: 128 << 10 };
            pdu::Pdu::IcResp(resp).encode(Digests::default(), &mut plain);
            let mut wire = Vec::new();
            u.seal(&plain, &mut wire);
            s.write_all(&wire).await.unwrap();
            let pdu::Pdu::CapsuleCmd(c) = next(&s, &mut got, u).await else { panic!("no command") };
            let hdr = pdu::DataPduHeader { cid: c.sqe.cid(), ttag: 0, offset: 0, last: true, success: true };
            let mut plain = pdu::DataHeader::new(false, &hdr, LEN as u32, Digests::default()).bytes().to_vec();
            plain.extend_from_slice(&sent);
            let mut wire = Vec::new();
            u.seal(&plain, &mut wire);
            // All but the last record's last 10 bytes; the rest once the
            // host has read all of that.
            send_in_two(&mut s, host, &wire, wire.len() - 10).await;
        });
        let opts = ConnectOptions {
            timeout: Duration::from_secs(120),
            tls_psk: Some(KEY.to_string()),
            ..Default::default()
        };
        let tls = crate::nvme::tls::TlsClient::new(&opts, Some(bw_tls::RecordChoice::User), "nqn.h", "nqn.s").unwrap().unwrap();
        let q = TcpQueue::open("127.0.0.1", port, 1, 4, &opts, Some(&tls)).await.unwrap();
        let mut buf = vec![0u8; LEN];
        // (The bound only turns a hang into a failure; nothing is timed.)
        let r = tokio::time::timeout(Duration::from_secs(60), q.submit_read(Sqe::new(bw_nvme::queue_entry::nvm::READ, 0, 1), &mut buf))
            .await
            .expect("the read waited for more than the target had left to send");
        r.unwrap();
        assert!(buf == payload, "the payload arrived changed");
        controller.abort();
    }

    /// A burst of answers in one segment is handled in one pass under the
    /// queue's lock (the reader's batch loop): answers out of order, the
    /// last one's header cut in two across socket reads, each payload
    /// lands in its own caller's buffer and every caller completes.
    #[tokio::test]
    async fn a_burst_of_answers_out_of_order_and_cut_anywhere_reaches_every_caller() {
        const N: usize = 8;
        const LEN: usize = 4096;
        let fill = |cid: u16| -> Vec<u8> { (0..LEN).map(|i| (i as u16).wrapping_mul(31).wrapping_add(cid * 7) as u8).collect() };
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let controller = tokio::spawn(async move {
            let (mut s, host) = l.accept().await.unwrap();
            let mut got = BytesMut::new();
            answer_icreq(&mut s).await;
            let mut cids = Vec::new();
            while cids.len() < N {
                match pdu::decode(&mut got, Digests::default(), u32::MAX).unwrap() {
                    Some(pdu::Pdu::CapsuleCmd(c)) => cids.push(c.sqe.cid()),
                    Some(_) => panic!("not a command"),
                    None => assert!(s.read_buf(&mut got).await.unwrap() > 0, "the host closed"),
                }
            }
            let mut wire = Vec::new();
            for &cid in cids.iter().rev() {
                let hdr = pdu::DataPduHeader { cid, ttag: 0, offset: 0, last: true, success: true };
                wire.extend_from_slice(pdu::DataHeader::new(false, &hdr, LEN as u32, Digests::default()).bytes());
                wire.extend_from_slice(&fill(cid));
            }
            // All but the last answer and 10 bytes of its header; the rest
            // once the host has read all of that.
            send_in_two(&mut s, host, &wire, wire.len() - LEN - pdu::DATA_HLEN + 10).await;
        });
        let opts = ConnectOptions { timeout: Duration::from_secs(120), ..Default::default() };
        let q = Arc::new(TcpQueue::open("127.0.0.1", port, 1, N, &opts, None).await.unwrap());
        let reads: Vec<_> = (0..N)
            .map(|_| {
                let q = q.clone();
                tokio::spawn(async move {
                    // 64-byte aligned, as a direct read lands unstaged.
                    let mut space = vec![0u8; LEN + 64];
                    let at = space.as_ptr().align_offset(64);
                    let buf = &mut space[at..at + LEN];
                    let d = q.submit_read(Sqe::new(bw_nvme::queue_entry::nvm::READ, 0, 1), buf).await.unwrap();
                    (d.cqe.cid, buf.to_vec())
                })
            })
            .collect();
        for r in reads {
            // (The bound only turns a hang into a failure; nothing is timed.)
            let (cid, got) = tokio::time::timeout(Duration::from_secs(60), r).await.expect("a caller was never answered").unwrap();
            assert!(got == fill(cid), "command {cid}'s payload arrived changed or elsewhere");
        }
        controller.abort();
    }

    /// What the controller answers to one command.
    #[derive(Clone, Copy, PartialEq)]
    enum Answer {
        /// C2HData with SUCCESS.
        Read,
        /// C2HData without SUCCESS, then a CapsuleResp.
        ReadThenResp,
        /// A 4 KiB write (in the capsule): a CapsuleResp.
        Write,
    }

    fn payload(i: usize) -> Vec<u8> {
        (0..4096).map(|b| (b * 7 + i * 31) as u8).collect()
    }

    /// `N` commands as `kinds` says (reads into cache-line aligned
    /// buffers, command `i` reading block `i`); the controller answers
    /// them in `order` (positions in the order the commands arrived), its
    /// bytes written in pieces cut at `cuts`. Every read must get its own
    /// payload; returns the bytes the host copied out of its receive
    /// buffer.
    async fn run(kinds: [Answer; N_PLAN], order: [usize; N_PLAN], cuts: &[usize]) -> u64 {
        const LEN: usize = 4096;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let cuts = cuts.to_vec();
        let controller = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            answer_icreq(&mut s).await;
            let mut got = BytesMut::new();
            let mut cmds = Vec::new();
            while cmds.len() < N_PLAN {
                match pdu::decode(&mut got, Digests::default(), u32::MAX).unwrap() {
                    Some(pdu::Pdu::CapsuleCmd(c)) => cmds.push((c.sqe.cid(), c.sqe.slba() as usize)),
                    Some(_) => panic!("not a command"),
                    None => assert!(s.read_buf(&mut got).await.unwrap() > 0, "the host closed"),
                }
            }
            let mut wire = Vec::new();
            for &at in &order {
                let (cid, i) = cmds[at];
                let resp = |wire: &mut Vec<u8>| {
                    let cqe = bw_nvme::queue_entry::Cqe { cid, ..Default::default() };
                    pdu::Pdu::CapsuleResp(cqe).encode_into(Digests::default(), wire);
                };
                if kinds[i] == Answer::Write {
                    resp(&mut wire);
                    continue;
                }
                let success = kinds[i] == Answer::Read;
                let hdr = pdu::DataPduHeader { cid, ttag: 0, offset: 0, last: true, success };
                wire.extend_from_slice(pdu::DataHeader::new(false, &hdr, LEN as u32, Digests::default()).bytes());
                wire.extend_from_slice(&payload(i));
                if !success {
                    resp(&mut wire);
                }
            }
            let mut from = 0;
            for c in cuts.into_iter().chain([wire.len()]) {
                s.write_all(&wire[from..c]).await.unwrap();
                // Let the host read each piece apart.
                tokio::time::sleep(Duration::from_millis(20)).await;
                from = c;
            }
            let mut sink = vec![0u8; 4096];
            while s.read(&mut sink).await.is_ok_and(|n| n > 0) {}
        });
        let opts = ConnectOptions { timeout: Duration::from_secs(60), ..Default::default() };
        let q = TcpQueue::open("127.0.0.1", port, 1, N_PLAN, &opts, None).await.unwrap();
        let mut space = vec![0u8; N_PLAN * LEN + 64];
        let at = space.as_ptr().align_offset(64);
        let bufs: Vec<&mut [u8]> = space[at..at + N_PLAN * LEN].chunks_mut(LEN).collect();
        let q = &q;
        let cmds = futures::future::join_all(bufs.into_iter().enumerate().map(|(i, b)| async move {
            let mut sqe = Sqe::new(if kinds[i] == Answer::Write { bw_nvme::queue_entry::nvm::WRITE } else { bw_nvme::queue_entry::nvm::READ }, 0, 1);
            sqe.set_rw(i as u64, 8);
            if kinds[i] == Answer::Write {
                q.submit_write(sqe, Payload::Owned(Bytes::from(payload(i)))).await.unwrap();
                b.copy_from_slice(&payload(i));
            } else {
                q.submit_read(sqe, b).await.unwrap();
            }
        }));
        // (The bound only turns a hang into a failure; nothing is timed.)
        tokio::time::timeout(Duration::from_secs(60), cmds).await.expect("a caller was never answered");
        for (i, b) in space[at..at + N_PLAN * LEN].chunks(LEN).enumerate() {
            assert!(b == &payload(i)[..], "command {i} got another's data");
        }
        controller.abort();
        let staged = q.shared.lock().q.staged_bytes();
        staged
    }

    const N_PLAN: usize = 8;
    const R: Answer = Answer::Read;
    const IN_TURN: [usize; N_PLAN] = [0, 1, 2, 3, 4, 5, 6, 7];

    /// A controller that answers in turn: every payload is read straight
    /// into its caller's buffer, none copied out of the receive buffer
    /// (all of them were, before the planned reads).
    #[tokio::test]
    async fn answers_in_turn_go_straight_into_the_callers_buffers() {
        assert_eq!(run([R; N_PLAN], IN_TURN, &[]).await, 0);
    }

    /// Out of turn, and cut inside headers and payloads: the bytes that
    /// went to the wrong buffers are gathered back and every read still
    /// gets its own data.
    #[tokio::test]
    async fn answers_out_of_turn_and_cut_anywhere_reach_their_callers() {
        let h = pdu::DATA_HLEN;
        let piece = h + 4096;
        // In turn but cut in a header, then in a payload, then between PDUs.
        run([R; N_PLAN], IN_TURN, &[10, piece + h + 100, 3 * piece]).await;
        // Reversed, whole.
        assert!(run([R; N_PLAN], [7, 6, 5, 4, 3, 2, 1, 0], &[]).await > 0);
        // Two swapped in the middle, cut inside the swapped pair's header.
        run([R; N_PLAN], [0, 1, 3, 2, 4, 5, 6, 7], &[2 * piece + 13, 5 * piece + h + 7]).await;
    }

    /// C2HData without SUCCESS, each followed by its CapsuleResp (cut
    /// inside one), and writes among the reads, in turn and not: every
    /// caller completes with its own data. (The plan expects no
    /// CapsuleResp behind a payload: with such a controller only the first
    /// read of a plan is placed, the rest taken as before.)
    #[tokio::test]
    async fn completions_apart_from_the_data_and_writes_among_the_reads() {
        use Answer::{ReadThenResp as S, Write as W};
        let piece = pdu::DATA_HLEN + 4096 + pdu::RESP_HLEN;
        run([S; N_PLAN], IN_TURN, &[piece - 5, 4 * piece + 3]).await;
        run([R, S, W, R, R, W, S, R], IN_TURN, &[]).await;
        run([R, S, W, R, R, W, S, R], [2, 0, 1, 5, 3, 4, 7, 6], &[30, 5000]).await;
    }
}
