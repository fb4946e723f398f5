//! Userspace iSCSI initiator: one session, one TCP connection, many commands
//! in flight (ITT multiplexing, CmdSN window respected), immediate and
//! unsolicited data as negotiated, R2T answered with Data-Out.
//!
//! The session logic is `bw_iscsi::initiator_session` (no sockets); this is
//! its driver: a reader task feeds it the target's PDUs, one writer task sends
//! what it asks for (so PDUs of different commands never interleave), and
//! callers wait on its completions.

use crate::{check_range, BlockClient, ClientError, ConnectOptions, Result, TargetUrl};
use async_trait::async_trait;
use bw_iscsi::initiator_login::{InitiatorConfig, InitiatorLogin, LoginDone, Progress};
use bw_iscsi::target_login::Secret;
use bw_iscsi::msg::*;
use bw_iscsi::negotiate::{Digest, LocalLimits};
use bw_iscsi::pdu::{Decoder, Digests, Pdu, RESERVED_TAG};
use bw_iscsi::initiator_session::{Action, Command, Completion, InitiatorSession, TaskError};
use bw_scsi::{initiator, sense, status};
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot, Semaphore};

const DEFAULT_INITIATOR: &str = "iqn.2026-11.org.blockwire:initiator";

fn proto(s: impl Into<String>) -> ClientError {
    ClientError::Protocol(s.into())
}

/// The session state machine and the callers waiting on it.
struct Shared {
    machine: InitiatorSession,
    waiters: HashMap<u32, oneshot::Sender<std::result::Result<Completion, TaskError>>>,
    logout: Option<oneshot::Sender<()>>,
}

struct Session {
    tx: mpsc::UnboundedSender<Pdu>,
    state: Mutex<Shared>,
    slots: Semaphore,
}

fn task_error(e: TaskError, cdb: &[u8]) -> ClientError {
    match e {
        TaskError::WindowClosed => ClientError::Timeout("command window stayed closed".into()),
        TaskError::Timeout => ClientError::Timeout(format!("SCSI command {:#04x}", cdb[0])),
        TaskError::Rejected(_) => proto(e.to_string()),
        TaskError::ServiceResponse(_) => ClientError::Target(e.to_string()),
        TaskError::Disconnected(why) => ClientError::Disconnected(why),
    }
}

impl Session {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Carry out the machine's actions: PDUs to the writer task, results to
    /// the waiting callers.
    fn run(&self, st: &mut Shared, out: Vec<Action>) {
        for a in out {
            match a {
                Action::Send(p) => {
                    let _ = self.tx.send(p);
                }
                Action::Complete { itt, result } => {
                    if let Some(w) = st.waiters.remove(&itt) {
                        let _ = w.send(result);
                    }
                }
                Action::LoggedOut => {
                    if let Some(l) = st.logout.take() {
                        let _ = l.send(());
                    }
                }
            }
        }
    }

    /// Run one SCSI command; `read_len` bytes expected back, `write` sent.
    async fn command(&self, lun: u64, cdb: &[u8], read_len: usize, write: Bytes) -> Result<Completion> {
        let _slot = self.slots.acquire().await.map_err(|_| ClientError::Disconnected("session closed".into()))?;
        let mut c = [0u8; 16];
        c[..cdb.len().min(16)].copy_from_slice(&cdb[..cdb.len().min(16)]);
        let now = Instant::now();
        let mut rx = {
            let mut st = self.lock();
            let mut out = Vec::new();
            let itt = st.machine.submit(Command { lun, cdb: c, read_len, write }, now, &mut out).map_err(|e| task_error(e, cdb))?;
            let (tx, rx) = oneshot::channel();
            st.waiters.insert(itt, tx);
            self.run(&mut st, out);
            rx
        };
        // Wake at the session's next deadline (this command's or an earlier
        // one's) and let the machine decide which commands expired.
        let result = loop {
            let next = self.lock().machine.next_deadline();
            let Some(deadline) = next else { break (&mut rx).await };
            match tokio::time::timeout_at(deadline.into(), &mut rx).await {
                Ok(r) => break r,
                Err(_) => {
                    let mut st = self.lock();
                    let mut out = Vec::new();
                    st.machine.on_timer(Instant::now(), &mut out);
                    self.run(&mut st, out);
                }
            }
        };
        match result {
            Ok(r) => r.map_err(|e| task_error(e, cdb)),
            Err(_) => Err(ClientError::Disconnected("connection lost".into())),
        }
    }

    fn fail_all(&self, why: String) {
        let mut st = self.lock();
        let mut out = Vec::new();
        st.machine.fail_all(&why, &mut out);
        self.run(&mut st, out);
        if let Some(l) = st.logout.take() {
            let _ = l.send(());
        }
    }

    /// Handle one PDU from the target.
    fn on_pdu(&self, pdu: Pdu) -> std::result::Result<(), String> {
        let mut st = self.lock();
        let mut out = Vec::new();
        let r = st.machine.on_pdu(pdu, &mut out);
        self.run(&mut st, out);
        r.map_err(|e| e.to_string())
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

async fn writer(wr: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<Pdu>, d: Digests) {
    let mut w = BufWriter::with_capacity(256 * 1024, wr);
    while let Some(p) = rx.recv().await {
        let mut next = Some(p);
        while let Some(p) = next.take() {
            if write_pdu(&mut w, &p, d).await.is_err() {
                return;
            }
            next = rx.try_recv().ok();
        }
        if w.flush().await.is_err() {
            return;
        }
    }
    let _ = w.shutdown().await;
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
    // Asked-for digests are preferred, not required: some targets (tgt) only do None.
    let digests = |on: bool| if on { vec![Digest::Crc32c, Digest::None] } else { vec![Digest::None] };
    let limits = LocalLimits {
        header_digests: digests(opts.header_digest),
        data_digests: digests(opts.data_digest),
        initial_r2t: false,
        immediate_data: true,
        first_burst_length: 262144,
        max_burst_length: 16776192,
        max_recv_data_segment_length: 262144,
        max_outstanding_r2t: 1,
        default_time2retain: 0,
        ..LocalLimits::default()
    };
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
    session: Arc<Session>,
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
        let b2 = self.scsi(&initiator::inquiry_vpd(initiator::vpd::LOGICAL_BLOCK_PROVISIONING, 64), 64, Bytes::new()).await.ok()?;
        if !initiator::parse_lbpu(&b2) {
            return None;
        }
        let b0 = self.scsi(&initiator::inquiry_vpd(initiator::vpd::BLOCK_LIMITS, 64), 64, Bytes::new()).await.ok()?;
        let (max_lba, _descriptors) = initiator::parse_unmap_limits(&b0)?;
        // A zero count means the device server does not implement UNMAP.
        (max_lba > 0).then_some(max_lba)
    }

    /// Run a command, retrying a few times on UNIT ATTENTION (reported once
    /// per nexus after resets and capacity changes).
    async fn scsi(&self, cdb: &[u8], read_len: usize, write: Bytes) -> Result<Vec<u8>> {
        for _ in 0..4 {
            let c = self.session.command(self.lun, cdb, read_len, write.clone()).await?;
            if c.status == status::GOOD {
                return Ok(c.data);
            }
            if c.status == status::CHECK_CONDITION && sense::key_of(&c.sense) == Some(sense::key::UNIT_ATTENTION) {
                continue;
            }
            return Err(ClientError::Target(format!(
                "SCSI command {:#04x} failed: status {:#04x}, sense {}",
                cdb[0],
                c.status,
                c.sense.iter().take(18).map(|b| format!("{b:02x}")).collect::<String>()
            )));
        }
        Err(ClientError::Target(format!("SCSI command {:#04x}: unit attention does not clear", cdb[0])))
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
        check_range(self, offset, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let bs = self.block as u64;
        let cdb = initiator::read_16(offset / bs, (buf.len() as u64 / bs) as u32);
        let data = self.scsi(&cdb, buf.len(), Bytes::new()).await?;
        buf.copy_from_slice(&data);
        Ok(())
    }
    async fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        check_range(self, offset, data.len())?;
        self.write_owned(offset, Bytes::copy_from_slice(data)).await
    }
    async fn write_owned(&self, offset: u64, data: Bytes) -> Result<()> {
        check_range(self, offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        let bs = self.block as u64;
        let cdb = initiator::write_16(offset / bs, (data.len() as u64 / bs) as u32);
        self.scsi(&cdb, 0, data).await?;
        Ok(())
    }
    async fn flush(&self) -> Result<()> {
        self.scsi(&initiator::synchronize_cache_10(), 0, Bytes::new()).await?;
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
            self.scsi(&initiator::unmap(params.len() as u16), 0, Bytes::from(params)).await?;
            lba += n as u64;
            left -= n as u64;
        }
        Ok(())
    }
    async fn close(&self) -> Result<()> {
        let s = &self.session;
        let rx = {
            let mut st = s.lock();
            if st.machine.dead().is_some() {
                return Ok(());
            }
            let (tx, rx) = oneshot::channel();
            st.logout = Some(tx);
            let mut out = Vec::new();
            st.machine.logout(&mut out);
            s.run(&mut st, out);
            rx
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), rx).await;
        s.fail_all("logged out".into());
        Ok(())
    }
}

impl Drop for IscsiClient {
    fn drop(&mut self) {
        self.session.fail_all("client dropped".into());
    }
}

/// Start the reader and writer tasks for a logged-in connection.
fn start_session(rd: OwnedReadHalf, wr: OwnedWriteHalf, buf: BytesMut, d: &LoginDone, opts: &ConnectOptions) -> Arc<Session> {
    let digests = Digests { header: d.params.header_digest, data: d.params.data_digest };
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(writer(wr, rx, digests));
    let session = Arc::new(Session {
        tx,
        state: Mutex::new(Shared {
            machine: InitiatorSession::new(d.params.clone(), d.cmd_sn, d.max_cmd_sn, d.exp_stat_sn, opts.timeout),
            waiters: HashMap::new(),
            logout: None,
        }),
        slots: Semaphore::new(opts.queue_depth.max(1)),
    });
    let mut dec = Decoder::new(d.params.max_recv_data_segment_length as usize);
    dec.digests = digests;
    let s2 = session.clone();
    tokio::spawn(async move {
        let mut rd = rd;
        let mut buf = buf;
        let why = loop {
            match read_pdu(&mut rd, &mut buf, &dec).await {
                Ok(p) => {
                    if let Err(e) = s2.on_pdu(p) {
                        break e;
                    }
                }
                Err(e) => break e.to_string(),
            }
            if s2.lock().machine.dead().is_some() {
                break "closed".into();
            }
        };
        log::debug!("iSCSI session ended: {why}");
        s2.fail_all(why);
    });
    session
}

pub async fn connect(url: &TargetUrl, opts: &ConnectOptions) -> Result<Arc<dyn BlockClient>> {
    let TargetUrl::Iscsi { host, port, iqn, lun, user, secret } = url else {
        return Err(proto(format!("{url} is not an iscsi:// URL")));
    };
    let (rd, wr, buf, done) = login(host, *port, Some(iqn), user.as_deref(), secret.as_deref(), opts).await?;
    let session = start_session(rd, wr, buf, &done, opts);
    let lun_field = u64::from_be_bytes(bw_scsi::encode_lun(*lun));
    let mut client = IscsiClient { session, lun: lun_field, size: 0, block: 512, describe: url.to_string(), identity: None, unmap_max_blocks: None };
    // TEST UNIT READY first: it absorbs the unit attention a fresh nexus may have.
    client.scsi(&initiator::test_unit_ready(), 0, Bytes::new()).await?;
    let cap = client.scsi(&initiator::read_capacity_16(32), 32, Bytes::new()).await?;
    let (last_lba, block) = initiator::parse_read_capacity_16(&cap).ok_or_else(|| proto("short READ CAPACITY"))?;
    if block == 0 || block % 512 != 0 {
        return Err(proto(format!("unsupported block size {block}")));
    }
    client.block = block;
    client.size = (last_lba + 1) * block as u64;
    // Standard INQUIRY: T10 vendor (bytes 8-15), product (16-31), revision (32-35).
    if let Ok(d) = client.scsi(&[bw_scsi::op::INQUIRY, 0, 0, 0, 36, 0], 36, Bytes::new()).await {
        client.identity = inquiry_identity(&d);
    }
    if initiator::parse_lbpme(&cap) {
        client.unmap_max_blocks = client.unmap_limit().await;
    }
    log::info!("{url}: {} bytes, {} byte blocks, params {:?}", client.size, block, done.params);
    Ok(Arc::new(client))
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
