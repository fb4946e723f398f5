//! Userspace iSCSI initiator: one session, one TCP connection, many commands
//! in flight (ITT multiplexing, CmdSN window respected), immediate and
//! unsolicited data as negotiated, R2T answered with Data-Out.
//!
//! The session logic is `bw_iscsi::initiator_session` (no sockets); this is
//! its driver, built as the NVMe/TCP queue's (`nvme/queue.rs`): callers
//! submit under one lock and wait in a mailbox (no task, channel, timer or
//! allocation per command); one writer task sends whatever a burst of
//! callers queued in one write; one reader task handles everything a socket
//! read brought under one lock and wakes the callers it completed, and reads
//! Data-In payloads straight into the callers' buffers; one timer serves the
//! whole session's deadlines.

use crate::{check_range, BlockClient, ClientError, ConnectOptions, HeldIo, Result, TargetUrl};
use async_trait::async_trait;
use bw_iscsi::initiator_login::{InitiatorConfig, InitiatorLogin, LoginDone, Progress};
use bw_iscsi::target_login::Secret;
use bw_iscsi::msg::*;
use bw_iscsi::negotiate::LocalLimits;
use bw_iscsi::pdu::{self, Decoder, Digests, Pdu, RESERVED_TAG};
use bw_iscsi::initiator_session::{Command, Completion, Context, DirectRead, InitiatorSession, Payload, Received, TaskError, Ticket};
use crate::placed::{PlacedRead, Placing, READ_CHUNK_SMALL_IO};
use bw_scsi::{initiator, sense, status};
use bytes::{Bytes, BytesMut};
use std::sync::{Arc, Mutex, MutexGuard};
use crate::waiting::{self, Deadlines, InFlight, Mailboxes, Waits};
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::oneshot;

const DEFAULT_INITIATOR: &str = "iqn.2026-11.org.blockwire:initiator";

fn proto(s: impl Into<String>) -> ClientError {
    ClientError::Protocol(s.into())
}

/// The caller's buffer for a read, filled in place under the session lock.
struct Dest {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the Dest pointer is only dereferenced (in `read_buf`) under the
// session lock while the command's future, which borrows the buffer, is
// alive: that future cancels its ticket under the same lock before the
// buffer can go away (`InFlight`'s Drop), which drops the Waiter and its
// Dest from the session.
unsafe impl Send for Dest {}

/// A caller waiting for its command: where its result goes (a mailbox of
/// the driver's, so that nothing is allocated per command) and maybe the
/// buffer its Data-In goes to.
struct Waiter {
    mailbox: usize,
    dest: Option<Dest>,
}

impl Context for Waiter {
    fn read_buf(&mut self) -> Option<&mut [u8]> {
        // SAFETY: see `unsafe impl Send for Dest`.
        self.dest.as_mut().map(|d| unsafe { std::slice::from_raw_parts_mut(d.ptr, d.len) })
    }
}

/// The session state machine and the callers waiting on it.
struct State {
    s: InitiatorSession<Waiter>,
    mailboxes: Mailboxes<std::result::Result<Completion, TaskError>>,
    logout: Option<oneshot::Sender<()>>,
    /// Where commands' deadlines count from.
    clock: waiting::SubmitClock,
}

struct Shared {
    state: Mutex<State>,
    /// Tells the writer the session has something to send.
    wake: crate::send::SendWake,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hand finished commands to their callers (each woken once, whatever
    /// the batch), and wake the writer if there is something to send.
    fn deliver(&self, st: &mut State) {
        while let Some((w, r)) = st.s.poll_completion() {
            st.mailboxes.post(w.mailbox, r);
        }
        if st.s.take_logged_out() || st.s.dead().is_some() {
            if let Some(l) = st.logout.take() {
                let _ = l.send(());
            }
        }
        if st.s.has_transmit() || st.s.dead().is_some() {
            self.wake.wake();
        }
    }

    fn fail_all(&self, why: &str) {
        let mut st = self.lock();
        st.s.fail_all(why);
        self.deliver(&mut st);
    }
}

impl Waits for Shared {
    type Result = std::result::Result<Completion, TaskError>;
    type Ticket = Ticket;
    fn poll_mailbox(&self, m: usize, cx: &mut std::task::Context<'_>) -> Poll<Self::Result> {
        self.lock().mailboxes.poll(m, cx)
    }
    fn cancel(&self, t: Ticket, m: usize) {
        let mut st = self.lock();
        st.s.cancel(t);
        st.mailboxes.release(m);
    }
}

struct Session {
    shared: Arc<Shared>,
    slots: waiting::Slots,
    /// The reader and the timer (the writer ends when the session dies).
    tasks: [tokio::task::JoinHandle<()>; 2],
}

fn task_error(e: TaskError, cdb: &[u8]) -> ClientError {
    match e {
        TaskError::WindowClosed => ClientError::Timeout("command window stayed closed".into()),
        TaskError::Timeout => ClientError::Timeout(format!("SCSI command {:#04x}", cdb[0])),
        TaskError::Rejected(_) | TaskError::ShortData { .. } | TaskError::NoFreeTag => proto(format!("SCSI command {:#04x}: {e}", cdb[0])),
        TaskError::ServiceResponse(_) => ClientError::Target(e.to_string()),
        TaskError::Disconnected(why) => ClientError::Disconnected(why),
    }
}

impl Session {
    /// Run one SCSI command: `read_len` bytes expected back (into `dest`
    /// if given), `write` sent. No task, timer or allocation of its own:
    /// the command waits in a mailbox the reader fills.
    async fn command(&self, lun: u64, cdb: &[u8], read_len: usize, write: Payload<'_>, dest: Option<Dest>) -> Result<Completion> {
        let _slot = self.slots.take().await;
        let mut c = [0u8; 16];
        c[..cdb.len().min(16)].copy_from_slice(&cdb[..cdb.len().min(16)]);
        let waker = waiting::own_waker().await;
        let (ticket, mailbox) = {
            let mut st = self.shared.lock();
            let mailbox = st.mailboxes.open_for(waker);
            let cmd = Command { lun, cdb: c, read_len, write };
            let now = st.clock.now_or_later();
            match st.s.submit(cmd, Waiter { mailbox, dest }, now) {
                Ok(t) => {
                    self.shared.wake.wake();
                    (t, mailbox)
                }
                Err((_, e)) => {
                    st.mailboxes.release(mailbox);
                    return Err(task_error(e, cdb));
                }
            }
        };
        InFlight::new(&*self.shared, ticket, mailbox).wait().await.map_err(|e| task_error(e, cdb))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        // The writer ends when it sees the session dead.
        self.shared.fail_all("session closed");
    }
}

async fn read_pdu(rd: &mut OwnedReadHalf, buf: &mut BytesMut, dec: &Decoder) -> Result<Pdu> {
    loop {
        if let Some(p) = dec.decode(buf).map_err(|e| proto(e.to_string()))? {
            return Ok(p);
        }
        buf.reserve(64 * 1024);
        if rd.read_buf(buf).await? == 0 {
            return Err(ClientError::Disconnected("target closed the connection".into()));
        }
    }
}

/// Write one PDU to an async writer with vectored writes (see
/// [`Pdu::wire_parts`]), never copying its data segment. Meant for a
/// buffered writer, flushed by the caller.
async fn write_pdu<W: tokio::io::AsyncWrite + Unpin>(w: &mut W, p: &Pdu, d: Digests) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let parts = p.wire_parts(d);
    let mut slices = parts.io_slices();
    let mut bufs = &mut slices[..];
    while !bufs.is_empty() {
        let n = w.write_vectored(bufs).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        std::io::IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// Connect and log in; returns the split stream, leftover bytes and the
/// negotiated session.
async fn login(
    host: &str,
    port: u16,
    target: Option<&str>,
    user: Option<&str>,
    secret: Option<&str>,
    opts: &ConnectOptions,
) -> Result<(OwnedReadHalf, OwnedWriteHalf, BytesMut, LoginDone)> {
    let stream = crate::connect_tcp(host, port, opts).await?;
    let (mut rd, mut wr) = stream.into_split();
    let limits = LocalLimits::initiator(opts.header_digest, opts.data_digest);
    let mut random = [0u8; 33];
    getrandom::getrandom(&mut random).map_err(|e| proto(format!("no random numbers from the OS for the login: {e}")))?;
    let entropy = bw_iscsi::chap::ChapEntropy(random);
    // The ISID's random qualifier comes from the same draw as the challenge
    // (bytes the challenge, at most 32 of the 33, does not use up front).
    let isid_tail = [entropy.0[30], entropy.0[31], entropy.0[32]];
    let chap = match (user, secret) {
        (Some(u), Some(s)) => Some(Secret::new(u, s)),
        (Some(_), None) => return Err(proto("CHAP user given without a secret (user%secret@host)")),
        _ => None,
    };
    let mut l = InitiatorLogin::new(InitiatorConfig {
        initiator_name: opts.initiator_name.clone().unwrap_or_else(|| DEFAULT_INITIATOR.into()),
        target_name: target.map(String::from),
        chap,
        mutual_chap: None,
        limits,
        // Random-qualifier ISID (type 0b10), different for each session.
        isid: [0x80, 0x00, 0x02, isid_tail[0], isid_tail[1], isid_tail[2]],
    }, entropy);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let dec = Decoder::new(64 * 1024);
    let mut req = l.start();
    loop {
        wr.write_all(&req.encode(Digests::default())).await?;
        let resp = tokio::time::timeout(opts.timeout, read_pdu(&mut rd, &mut buf, &dec))
            .await
            .map_err(|_| ClientError::Timeout("login response".into()))??;
        match l.on_response(&resp).map_err(|e| ClientError::Target(e.to_string()))? {
            Progress::Send(p) => req = p,
            Progress::Done(d) => return Ok((rd, wr, buf, d)),
        }
    }
}

pub struct IscsiClient {
    session: Session,
    lun: u64,
    size: u64,
    block: u32,
    describe: String,
    /// Standard INQUIRY's vendor, product and revision.
    identity: Option<String>,
    /// Most blocks one UNMAP may name, if the LUN takes UNMAP at all
    /// (LBPME in READ CAPACITY, LBPU in VPD B2, the count from VPD B0).
    unmap_max_blocks: Option<u32>,
}

impl IscsiClient {
    /// Whether the LUN takes UNMAP, and how many blocks at a time: as Linux
    /// decides it (sd_read_block_limits/sd_discard_mode), VPD pages a target
    /// does not have mean no.
    async fn unmap_limit(&self) -> Option<u32> {
        let b2 = self.scsi(&initiator::inquiry_vpd(initiator::vpd::LOGICAL_BLOCK_PROVISIONING, 64), 64, Payload::None).await.ok()?;
        if !initiator::parse_lbpu(&b2) {
            return None;
        }
        let b0 = self.scsi(&initiator::inquiry_vpd(initiator::vpd::BLOCK_LIMITS, 64), 64, Payload::None).await.ok()?;
        let (max_lba, _descriptors) = initiator::parse_unmap_limits(&b0)?;
        // A zero count means the device server does not implement UNMAP.
        (max_lba > 0).then_some(max_lba)
    }

    /// Run a command that collects its Data-In (`read_len` bytes, zeros
    /// past what the target sent); see [`IscsiClient::run`].
    async fn scsi(&self, cdb: &[u8], read_len: usize, write: Payload<'_>) -> Result<Vec<u8>> {
        Ok(self.run(cdb, read_len, write, None).await?.data)
    }

    /// Run a command, its Data-In into `buf` if given, retrying a few times
    /// on UNIT ATTENTION (reported once per nexus after resets and capacity
    /// changes). Anything but GOOD is an error.
    async fn run(&self, cdb: &[u8], read_len: usize, write: Payload<'_>, mut buf: Option<&mut [u8]>) -> Result<Completion> {
        let c = self.session.command(self.lun, cdb, read_len, write.clone(), dest_of(&mut buf)).await?;
        if c.status == status::GOOD {
            return Ok(c);
        }
        self.not_good(c, cdb, read_len, write, buf).await
    }

    /// [`IscsiClient::run`] after a first answer `c` that was not GOOD: the
    /// UNIT ATTENTION retries, boxed, off the common path: async_trait
    /// moves each call's whole future into its box, and a future holds
    /// everything any of its awaits may need (issue 51; the iSCSI
    /// counterpart of 0ff2ed8's boxed RDMA arm). A unit attention is rare
    /// (once per nexus and event), so a box then costs nothing that matters.
    async fn not_good(&self, c: Completion, cdb: &[u8], read_len: usize, write: Payload<'_>, mut buf: Option<&mut [u8]>) -> Result<Completion> {
        Box::pin(retry_unit_attention(c, cdb, || {
            self.session.command(self.lun, cdb, read_len, write.clone(), dest_of(&mut buf))
        }))
        .await
    }
}

/// Where a command's Data-In goes, if it has a buffer.
fn dest_of(buf: &mut Option<&mut [u8]>) -> Option<Dest> {
    buf.as_mut().map(|b| Dest { ptr: b.as_mut_ptr(), len: b.len() })
}

fn is_unit_attention(c: &Completion) -> bool {
    c.status == status::CHECK_CONDITION && sense::key_of(&c.sense) == Some(sense::key::UNIT_ATTENTION)
}

/// How many times a command is sent while it meets UNIT ATTENTION.
const UNIT_ATTENTION_ATTEMPTS: usize = 4;

/// After a first answer `c` that was not GOOD: send the command again
/// (`again`) while it meets UNIT ATTENTION, up to
/// [`UNIT_ATTENTION_ATTEMPTS`] sends in all. Anything else but GOOD is an
/// error.
async fn retry_unit_attention<F, Fut>(mut c: Completion, cdb: &[u8], mut again: F) -> Result<Completion>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Completion>>,
{
    for _ in 1..UNIT_ATTENTION_ATTEMPTS {
        if !is_unit_attention(&c) {
            break;
        }
        c = again().await?;
        if c.status == status::GOOD {
            return Ok(c);
        }
    }
    if is_unit_attention(&c) {
        return Err(ClientError::Target(format!("SCSI command {:#04x}: unit attention does not clear", cdb[0])));
    }
    Err(ClientError::Target(format!(
        "SCSI command {:#04x} failed: status {:#04x}, sense {}",
        cdb[0],
        c.status,
        c.sense.iter().take(18).map(|b| format!("{b:02x}")).collect::<String>()
    )))
}

impl HeldIo for IscsiClient {
    async fn read_held(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_range(self, offset, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let bs = self.block as u64;
        let cdb = initiator::read_16(offset / bs, (buf.len() as u64 / bs) as u32);
        // `run` spelled out: one future fewer wrapped around every read
        // (each layer is polled, and moves its state, twice per command).
        let dest = Dest { ptr: buf.as_mut_ptr(), len: buf.len() };
        let c = self.session.command(self.lun, &cdb, buf.len(), Payload::None, Some(dest)).await?;
        if c.status != status::GOOD {
            self.not_good(c, &cdb, buf.len(), Payload::None, Some(buf)).await?;
        }
        Ok(())
    }
    // Not `async`: `write_payload`'s future is this one, not wrapped in one
    // more state machine polled twice per command.
    fn write_owned_held(&self, offset: u64, data: Bytes) -> impl std::future::Future<Output = Result<()>> + Send {
        self.write_payload(offset, Payload::Owned(data))
    }
}

#[async_trait]
impl BlockClient for IscsiClient {
    fn describe(&self) -> String {
        self.describe.clone()
    }
    fn identity(&self) -> Option<String> {
        self.identity.clone()
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn block_size(&self) -> u32 {
        self.block
    }
    async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_held(offset, buf).await
    }
    async fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_payload(offset, Payload::Borrowed(data)).await
    }
    async fn write_owned(&self, offset: u64, data: Bytes) -> Result<()> {
        self.write_owned_held(offset, data).await
    }
    async fn flush(&self) -> Result<()> {
        self.scsi(&initiator::synchronize_cache_10(), 0, Payload::None).await?;
        Ok(())
    }
    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let Some(max) = self.unmap_max_blocks else {
            return Err(ClientError::Unsupported(format!("UNMAP on {} (the LUN reports no logical block provisioning)", self.describe)));
        };
        check_range(self, offset, len as usize)?;
        let bs = self.block as u64;
        let (mut lba, mut left) = (offset / bs, len / bs);
        // One descriptor per command, each within the LUN's limit.
        while left > 0 {
            let n = left.min(max as u64) as u32;
            let params = initiator::unmap_parameters(&[(lba, n)]);
            self.scsi(&initiator::unmap(params.len() as u16), 0, Payload::Owned(Bytes::from(params))).await?;
            lba += n as u64;
            left -= n as u64;
        }
        Ok(())
    }
    async fn close(&self) -> Result<()> {
        let sh = &self.session.shared;
        let rx = {
            let mut st = sh.lock();
            if st.s.dead().is_some() {
                return Ok(());
            }
            let (tx, rx) = oneshot::channel();
            st.logout = Some(tx);
            st.s.logout();
            sh.deliver(&mut st);
            rx
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), rx).await;
        sh.fail_all("logged out");
        Ok(())
    }
}

impl IscsiClient {
    /// Write `data` at `offset` (checked against the LUN's geometry).
    async fn write_payload(&self, offset: u64, data: Payload<'_>) -> Result<()> {
        let len = match &data {
            Payload::Owned(b) => b.len(),
            Payload::Borrowed(s) => s.len(),
            Payload::None => 0,
        };
        check_range(self, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let bs = self.block as u64;
        let cdb = initiator::write_16(offset / bs, (len as u64 / bs) as u32);
        // `run` spelled out, as in `read_held`.
        let c = self.session.command(self.lun, &cdb, 0, data.clone(), None).await?;
        if c.status != status::GOOD {
            self.not_good(c, &cdb, 0, data, None).await?;
        }
        Ok(())
    }
}

impl crate::send::Transmit for Shared {
    fn wake(&self) -> &crate::send::SendWake {
        &self.wake
    }
    fn poll(&self, out: &mut Vec<u8>, refs: &mut Vec<(usize, bytes::Bytes)>) -> bool {
        let mut st = self.lock();
        st.s.poll_transmit(out, refs);
        st.s.dead().is_some()
    }
    fn fail_all(&self, why: &str) {
        Shared::fail_all(self, why)
    }
}

/// While a large read is in flight, socket reads stop at this many bytes,
/// so that little of a large Data-In payload lands in the receive buffer
/// (it goes straight to the caller's buffer instead) ...
const READ_CHUNK: usize = 64 * 1024;
// ... and otherwise at `placed::READ_CHUNK_SMALL_IO`: a burst of 32
// answers to 4 KiB reads (132 KiB) in one read, where 64 KiB took three
// (6.4 reads per 4 KiB read at queue depth 32 on the lab's link).

/// Read the rest of a Data-In payload from the socket straight into its
/// command's buffer, woken as NVMe/TCP's is (`crate::direct::RCVLOWAT_MAX`).
async fn recv_direct(rd: &OwnedReadHalf, landing: &mut crate::direct::Landing, sh: &Shared, d: &mut DirectRead, placed: bool) -> std::result::Result<(), String> {
    if placed {
        landing.go_on_placed();
    } else {
        landing.begin();
    }
    crate::direct::recv(rd, d.left(), || {
        // Under the session lock: a caller that gives up takes its buffer
        // back under the same lock (`InFlight`).
        let r = sh.lock().s.direct_fill(d, |dst| landing.read(rd, dst));
        crate::direct::Filled::after(r, d.left(), 0)
    })
    .await
}

crate::placed::plans_by!(InitiatorSession<Waiter>, DirectRead, pdu::BHS_LEN);

/// Feed the session what the target sends: everything one socket read
/// brought is handled under one lock and its commands' callers woken
/// together; Data-In payloads go straight to the callers' buffers.
async fn read_loop(mut rd: OwnedReadHalf, mut buf: BytesMut, sh: Arc<Shared>) {
    // After a large payload went straight to its buffer, the next read takes
    // just the next PDU's header: a large payload behind it then goes
    // straight to its buffer too instead of into `buf`.
    let mut header_only = false;
    let mut landing = crate::direct::Landing::new();
    let mut placing = Placing::new();
    let why = loop {
        let (step, header_len, large, placed) = {
            let mut st = sh.lock();
            let step = loop {
                match st.s.receive(&mut buf) {
                    Ok(Received::Pdu) => {}
                    Ok(Received::Direct(d)) if d.is_done() => {}
                    Ok(Received::Direct(d)) => break Ok(Some(d)),
                    Ok(Received::NeedMore) => break Ok(None),
                    Err(e) => break Err(e.to_string()),
                }
            };
            let large = st.s.large_reads() > 0;
            // Small reads in flight and the stream at a header: read the
            // answers expected next straight into place.
            let placed = match step {
                Ok(None) if !header_only && !large && buf.len() < pdu::BHS_LEN => Some(placing.read(&rd, &mut buf, &mut st.s, true)),
                _ => None,
            };
            sh.deliver(&mut st);
            if let Some(why) = st.s.dead() {
                break why.to_string();
            }
            (step, st.s.next_header_len(), large, placed)
        };
        match placed {
            None => {}
            Some(Ok(PlacedRead::Read(None))) => continue,
            Some(Ok(PlacedRead::Read(Some(mut d)))) => {
                if let Err(why) = recv_direct(&rd, &mut landing, &sh, &mut d, true).await {
                    break why;
                }
                continue;
            }
            Some(Ok(PlacedRead::Closed)) => break "target closed the connection".to_string(),
            Some(Ok(PlacedRead::Unplanned)) => {}
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
            Ok(Some(mut d)) => {
                let large = d.left() >= READ_CHUNK;
                if let Err(why) = recv_direct(&rd, &mut landing, &sh, &mut d, false).await {
                    break why;
                }
                header_only = large;
                continue;
            }
            Ok(None) => {}
        }
        let limit = match (header_only, large) {
            (true, _) => header_len.saturating_sub(buf.len()).max(1),
            (false, true) => READ_CHUNK,
            (false, false) => READ_CHUNK_SMALL_IO,
        };
        if buf.capacity() - buf.len() < limit.min(READ_CHUNK) {
            buf.reserve(limit);
        }
        header_only = false;
        match (&mut rd).take(limit as u64).read_buf(&mut buf).await {
            Ok(0) => break "target closed the connection".to_string(),
            Ok(_) => {}
            Err(e) => break format!("receive failed: {e}"),
        }
    };
    log::debug!(
        "iSCSI session ended: {why} ({} bytes of Data-In copied out of the receive buffer, planned reads {} placing {} payloads, {} answered out of turn, {} times nothing to plan)",
        sh.lock().s.staged_bytes(),
        placing.reads,
        placing.placed,
        placing.misses,
        placing.noplan
    );
    sh.fail_all(&why);
}

impl Deadlines for Shared {
    fn next_deadline(&self) -> std::result::Result<Option<Instant>, ()> {
        let st = self.lock();
        if st.s.dead().is_some() {
            return Err(());
        }
        Ok(st.s.poll_timeout())
    }
    fn expire(&self, now: Instant) {
        let mut st = self.lock();
        st.s.handle_timeout(now);
        self.deliver(&mut st);
    }
}

/// Start the reader, writer and timer tasks for a logged-in connection.
fn start_session(rd: OwnedReadHalf, wr: OwnedWriteHalf, buf: BytesMut, d: &LoginDone, opts: &ConnectOptions) -> Session {
    let machine = InitiatorSession::new(d.params.clone(), d.cmd_sn, d.max_cmd_sn, d.exp_stat_sn, opts.timeout);
    let shared = Arc::new(Shared {
        state: Mutex::new(State { s: machine, mailboxes: Mailboxes::default(), logout: None, clock: waiting::SubmitClock::new() }),
        wake: Default::default(),
    });
    let sh = shared.clone();
    tokio::spawn(async move { crate::send::send_loop(wr, &*sh, None).await });
    let reader = tokio::spawn(read_loop(rd, buf, shared.clone()));
    let timer = tokio::spawn(waiting::timer_loop(shared.clone(), opts.timeout));
    Session { shared, slots: waiting::Slots::new(opts.queue_depth.max(1)), tasks: [reader, timer] }
}

pub async fn connect(url: &TargetUrl, opts: &ConnectOptions) -> Result<Arc<dyn BlockClient>> {
    Ok(Arc::new(IscsiClient::connect(url, opts).await?))
}

impl IscsiClient {
    pub async fn connect(url: &TargetUrl, opts: &ConnectOptions) -> Result<IscsiClient> {
        let TargetUrl::Iscsi { host, port, iqn, lun, user, secret } = url else {
            return Err(proto(format!("{url} is not an iscsi:// URL")));
        };
        let (rd, wr, buf, done) = login(host, *port, Some(iqn), user.as_deref(), secret.as_deref(), opts).await?;
        let session = start_session(rd, wr, buf, &done, opts);
        let lun_field = u64::from_be_bytes(bw_scsi::encode_lun(*lun));
        let mut client = IscsiClient { session, lun: lun_field, size: 0, block: 512, describe: url.to_string(), identity: None, unmap_max_blocks: None };
        // TEST UNIT READY first: it absorbs the unit attention a fresh nexus may have.
        client.scsi(&initiator::test_unit_ready(), 0, Payload::None).await?;
        let cap = client.scsi(&initiator::read_capacity_16(32), 32, Payload::None).await?;
        let (last_lba, block) = initiator::parse_read_capacity_16(&cap).ok_or_else(|| proto("short READ CAPACITY"))?;
        if block == 0 || block % 512 != 0 {
            return Err(proto(format!("unsupported block size {block}")));
        }
        client.block = block;
        client.size = (last_lba + 1) * block as u64;
        // Standard INQUIRY: T10 vendor (bytes 8-15), product (16-31), revision (32-35).
        if let Ok(d) = client.scsi(&[bw_scsi::op::INQUIRY, 0, 0, 0, 36, 0], 36, Payload::None).await {
            client.identity = inquiry_identity(&d);
        }
        if initiator::parse_lbpme(&cap) {
            client.unmap_max_blocks = client.unmap_limit().await;
        }
        log::info!("{url}: {} bytes, {} byte blocks, params {:?}", client.size, block, done.params);
        Ok(client)
    }
}

/// "VENDOR PRODUCT REVISION" from standard INQUIRY data (None if short).
fn inquiry_identity(d: &[u8]) -> Option<String> {
    let field = |r: std::ops::Range<usize>| String::from_utf8_lossy(d.get(r).unwrap_or_default()).trim().to_string();
    (d.len() >= 36).then(|| format!("{} {} {}", field(8..16), field(16..32), field(32..36)))
}

/// Targets found by discovery, one line each when printed:
/// `IQN ADDR:PORT,TPGT [ADDR:PORT,TPGT ...]`.
/// SendTargets=All in a discovery session; `user`/`secret` answer the
/// portal's CHAP challenge if it requires one.
pub async fn discover(host: &str, port: u16, user: Option<&str>, secret: Option<&str>, opts: &ConnectOptions) -> Result<Vec<String>> {
    let (mut rd, mut wr, mut buf, done) = login(host, port, None, user, secret, opts).await?;
    let digests = Digests { header: done.params.header_digest, data: done.params.data_digest };
    let mut dec = Decoder::new(done.params.max_recv_data_segment_length as usize);
    dec.digests = digests;
    let mut cmd_sn = done.cmd_sn;
    let mut exp_stat_sn = done.exp_stat_sn;
    let mut text = Vec::new();
    let mut ttt = RESERVED_TAG;
    let mut body = bw_iscsi::text::encode(&[("SendTargets", "All")]);
    loop {
        let t = TextRequest { immediate: true, final_: true, continue_: false, lun: 0, itt: 1, ttt, cmd_sn, exp_stat_sn };
        write_pdu(&mut wr, &Pdu::new(Message::TextRequest(t).encode(), Bytes::from(std::mem::take(&mut body))), digests).await?;
        let p = tokio::time::timeout(opts.timeout, read_pdu(&mut rd, &mut buf, &dec))
            .await
            .map_err(|_| ClientError::Timeout("SendTargets".into()))??;
        let Ok(Message::TextResponse(r)) = Message::decode(&p.bhs) else {
            return Err(proto("expected a Text Response to SendTargets"));
        };
        exp_stat_sn = r.stat_sn.wrapping_add(1);
        text.extend_from_slice(&p.data);
        if !r.continue_ {
            break;
        }
        ttt = r.ttt;
        if text.len() > 1 << 20 {
            return Err(proto("SendTargets answer too long"));
        }
    }
    cmd_sn = cmd_sn.wrapping_add(0);
    let l = LogoutRequest { immediate: true, reason: 0, itt: 2, cid: 0, cmd_sn, exp_stat_sn };
    let _ = write_pdu(&mut wr, &Pdu::new(Message::LogoutRequest(l).encode(), Bytes::new()), digests).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), read_pdu(&mut rd, &mut buf, &dec)).await;
    let pairs = bw_iscsi::text::parse(&text).map_err(|e| proto(e.to_string()))?;
    let mut out: Vec<String> = Vec::new();
    for (k, v) in pairs {
        match k.as_str() {
            "TargetName" => out.push(v),
            "TargetAddress" => {
                if let Some(last) = out.last_mut() {
                    last.push(' ');
                    last.push_str(&v);
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod write_tests {
    use super::*;

    #[tokio::test]
    async fn write_pdu_survives_short_writes() {
        // A writer that takes at most 7 bytes per call.
        struct Trickle(Vec<u8>);
        impl tokio::io::AsyncWrite for Trickle {
            fn poll_write(mut self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>, b: &[u8]) -> std::task::Poll<std::io::Result<usize>> {
                let n = b.len().min(7);
                self.0.extend_from_slice(&b[..n]);
                std::task::Poll::Ready(Ok(n))
            }
            fn poll_flush(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
                std::task::Poll::Ready(Ok(()))
            }
            fn poll_shutdown(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
                std::task::Poll::Ready(Ok(()))
            }
        }
        let p = Pdu::new(bw_iscsi::pdu::Bhs::default(), Bytes::from_static(b"some data here"));
        let d = Digests { header: true, data: true };
        let mut w = Trickle(Vec::new());
        write_pdu(&mut w, &p, d).await.unwrap();
        assert_eq!(w.0, p.encode(d).to_vec());
    }

}

/// Writes whose data the caller handed over leave from where they are
/// (gathered with their headers by the send loop's writev): each command
/// must still carry its own data, whole, as immediate data.
#[cfg(test)]
mod owned_write_tests {
    use super::*;
    use bw_iscsi::negotiate::SessionParams;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn owned_writes_carry_their_own_data_as_immediate_data() {
        const N: u64 = 16;
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (c, t) = tokio::join!(tokio::net::TcpStream::connect(l.local_addr().unwrap()), l.accept());
        let (rd, wr) = c.unwrap().into_split();
        let mut t = t.unwrap().0;
        let done = LoginDone { params: SessionParams::default(), tsih: 1, cmd_sn: 1, max_cmd_sn: 64, exp_stat_sn: 1 };
        let opts = ConnectOptions { timeout: Duration::from_secs(20), queue_depth: 32, ..ConnectOptions::default() };
        let s = start_session(rd, wr, BytesMut::new(), &done, &opts);
        // Block `lba`'s data: 4 KiB, different for every block.
        let data = |lba: u64| Bytes::from((0..4096u64).map(|b| (b * 13 + lba * 101) as u8).collect::<Vec<u8>>());
        let s = &s;
        let writes = futures::future::join_all((0..N).map(|lba| async move {
            let c = s.command(0, &initiator::write_16(lba * 8, 8), 0, Payload::Owned(data(lba)), None).await.unwrap();
            assert_eq!(c.status, status::GOOD);
        }));
        let target = async {
            let (mut buf, dec) = (BytesMut::new(), Decoder::new(1 << 20));
            for n in 0..N as u32 {
                let p = loop {
                    if let Some(p) = dec.decode(&mut buf).unwrap() {
                        break p;
                    }
                    assert!(t.read_buf(&mut buf).await.unwrap() > 0, "initiator closed");
                };
                let Ok(Message::ScsiCommand(c)) = Message::decode(&p.bhs) else { panic!("expected a SCSI command") };
                let lba = u64::from_be_bytes(c.cdb[2..10].try_into().unwrap()) / 8;
                assert!(c.final_ && c.edtl == 4096, "4 KiB of immediate data, no Data-Out to follow");
                assert!(p.data == data(lba), "block {lba}'s command carried other data");
                let r = ScsiResponse { itt: c.itt, stat_sn: 1 + n, exp_cmd_sn: 2 + n, max_cmd_sn: 64 + n, ..Default::default() };
                t.write_all(&Pdu::new(Message::ScsiResponse(r).encode(), Bytes::new()).encode(Digests::default())).await.unwrap();
            }
        };
        tokio::join!(writes, target);
    }
}

#[cfg(test)]
mod unit_attention_tests {
    use super::*;
    use bw_scsi::sense::{key, Sense};

    fn answer(status: u8, sense_key: Option<u8>) -> Completion {
        let sense = sense_key.map(|k| Bytes::from(Sense::new(k, 0x29, 0).to_fixed())).unwrap_or_default();
        Completion { status, sense, data: Vec::new(), received: 0 }
    }
    fn ua() -> Completion {
        answer(status::CHECK_CONDITION, Some(key::UNIT_ATTENTION))
    }

    /// Runs `retry_unit_attention` after a first answer, later answers from
    /// `rest`; the result and how many times the command was sent in all.
    async fn run(first: Completion, rest: Vec<Completion>) -> (Result<Completion>, usize) {
        let mut rest = rest.into_iter();
        let mut sends = 1;
        let r = retry_unit_attention(first, &[0x88], || {
            sends += 1;
            let next = rest.next().expect("sent more often than the test expects");
            async move { Ok(next) }
        })
        .await;
        (r, sends)
    }

    #[tokio::test]
    async fn unit_attention_is_retried_up_to_four_sends_in_all() {
        let (r, sends) = run(ua(), vec![ua(), answer(status::GOOD, None)]).await;
        assert_eq!((r.unwrap().status, sends), (status::GOOD, 3));
        let (r, sends) = run(ua(), vec![ua(), ua(), answer(status::GOOD, None)]).await;
        assert_eq!((r.unwrap().status, sends), (status::GOOD, 4));
        let (r, sends) = run(ua(), vec![ua(), ua(), ua()]).await;
        assert!(r.unwrap_err().to_string().contains("unit attention does not clear"));
        assert_eq!(sends, 4);
    }

    #[tokio::test]
    async fn other_failures_are_not_retried() {
        let (r, sends) = run(answer(status::CHECK_CONDITION, Some(key::MEDIUM_ERROR)), vec![]).await;
        assert!(r.unwrap_err().to_string().contains("0x88 failed: status 0x02"));
        assert_eq!(sends, 1);
        // A unit attention, then another failure: that failure, not retried.
        let (r, sends) = run(ua(), vec![answer(status::CHECK_CONDITION, Some(key::ILLEGAL_REQUEST)), ua()]).await;
        assert!(r.unwrap_err().to_string().contains("failed: status 0x02, sense 70"));
        assert_eq!(sends, 2);
    }
}

#[cfg(test)]
mod placed_tests {
    use super::*;
    use bw_iscsi::negotiate::SessionParams;
    use tokio::net::{TcpListener, TcpStream};

    const N: usize = 8;
    const LEN: usize = 4096;

    /// A logged-in session over loopback and the target's end of it.
    async fn pair() -> (Session, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (c, t) = tokio::join!(TcpStream::connect(l.local_addr().unwrap()), l.accept());
        let (rd, wr) = c.unwrap().into_split();
        let done = LoginDone { params: SessionParams::default(), tsih: 1, cmd_sn: 1, max_cmd_sn: 64, exp_stat_sn: 1 };
        let opts = ConnectOptions { timeout: Duration::from_secs(20), queue_depth: 32, ..ConnectOptions::default() };
        (start_session(rd, wr, BytesMut::new(), &done, &opts), t.unwrap().0)
    }

    /// Reads `N` commands off the target's end; their ITTs in CmdSN order.
    async fn commands(t: &mut TcpStream) -> Vec<u32> {
        let (mut buf, dec) = (BytesMut::new(), Decoder::new(1 << 20));
        let mut itts = Vec::new();
        while itts.len() < N {
            let p = read_pdu_from(&mut *t, &mut buf, &dec).await;
            let Ok(Message::ScsiCommand(c)) = Message::decode(&p.bhs) else { panic!("expected a SCSI command") };
            itts.push(c.itt);
        }
        itts
    }

    async fn read_pdu_from<R: tokio::io::AsyncRead + Unpin>(rd: &mut R, buf: &mut BytesMut, dec: &Decoder) -> Pdu {
        loop {
            if let Some(p) = dec.decode(buf).unwrap() {
                return p;
            }
            assert!(rd.read_buf(buf).await.unwrap() > 0, "initiator closed");
        }
    }

    fn payload(i: usize) -> Vec<u8> {
        (0..LEN).map(|b| (b * 7 + i * 31) as u8).collect()
    }

    /// Each read's Data-In with status (phase collapse), in `order`, as one
    /// byte stream.
    fn answers(itts: &[u32], order: &[usize]) -> Vec<u8> {
        let mut wire = Vec::new();
        for (n, &i) in order.iter().enumerate() {
            let d = DataIn { final_: true, has_status: true, itt: itts[i], stat_sn: 1 + n as u32, exp_cmd_sn: 1 + N as u32, max_cmd_sn: 64, ..Default::default() };
            wire.extend_from_slice(&Pdu::new(Message::DataIn(d).encode(), Bytes::from(payload(i))).encode(Digests::default()));
        }
        wire
    }

    /// `N` reads into cache-line aligned buffers; the target answers them
    /// in `order`, its bytes written in pieces cut at `cuts`. Every read
    /// must get its own payload; returns the bytes the initiator copied
    /// out of its receive buffer.
    async fn run(order: [usize; N], cuts: &[usize]) -> u64 {
        let (s, mut t) = pair().await;
        let mut space = vec![0u8; N * LEN + 64];
        let at = space.as_ptr().align_offset(64);
        let bufs: Vec<&mut [u8]> = space[at..at + N * LEN].chunks_mut(LEN).collect();
        let s = &s;
        let reads = futures::future::join_all(bufs.into_iter().map(|b| async move {
            let dest = Some(Dest { ptr: b.as_mut_ptr(), len: b.len() });
            let c = s.command(0, &initiator::read_16(0, 8), LEN, Payload::None, dest).await.unwrap();
            assert_eq!(c.status, status::GOOD);
        }));
        let target = async {
            let itts = commands(&mut t).await;
            let wire = answers(&itts, &order);
            let mut from = 0;
            for &c in cuts.iter().chain([wire.len()].iter()) {
                t.write_all(&wire[from..c]).await.unwrap();
                t.flush().await.unwrap();
                // Let the initiator read each piece apart.
                tokio::time::sleep(Duration::from_millis(20)).await;
                from = c;
            }
        };
        tokio::join!(reads, target);
        for (i, b) in space[at..at + N * LEN].chunks(LEN).enumerate() {
            assert!(b == &payload(i)[..], "read {i} got another's data");
        }
        let staged = s.shared.lock().s.staged_bytes();
        staged
    }

    /// A target that answers in turn: every payload is read straight into
    /// its caller's buffer, none copied out of the receive buffer (all of
    /// them were, before the planned reads).
    #[tokio::test]
    async fn answers_in_turn_go_straight_into_the_callers_buffers() {
        assert_eq!(run([0, 1, 2, 3, 4, 5, 6, 7], &[]).await, 0);
    }

    /// Out of turn, and cut inside headers and payloads: the bytes that went
    /// to the wrong buffers are gathered back and every read still gets
    /// its own data.
    #[tokio::test]
    async fn answers_out_of_turn_and_cut_anywhere_reach_their_callers() {
        let h = pdu::BHS_LEN;
        let piece = h + LEN;
        // In turn but cut in a header, then in a payload, then between PDUs.
        run([0, 1, 2, 3, 4, 5, 6, 7], &[20, piece + h + 100, 3 * piece]).await;
        // Reversed, whole.
        assert!(run([7, 6, 5, 4, 3, 2, 1, 0], &[]).await > 0);
        // Two swapped in the middle, cut inside the swapped pair's header.
        run([0, 1, 3, 2, 4, 5, 6, 7], &[2 * piece + 30, 5 * piece + h + 7]).await;
    }
}
