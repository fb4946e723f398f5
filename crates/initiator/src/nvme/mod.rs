//! NVMe/TCP initiator: `nvme+tcp://HOST[:PORT]/SUBNQN/NSID`, and NVMe/RDMA:
//! `nvme+rdma://HOST[:PORT]/SUBNQN/NSID` (`rdma.rs`; the same controller
//! logic on another kind of [`Queue`]).
//!
//! One admin queue plus `ConnectOptions::queues` I/O queues (one TCP
//! connection each), many commands in flight per queue, digests as asked,
//! small writes in the capsule and larger ones on R2T, keep-alive on the
//! admin queue, Disconnect and a controller shutdown on close.

mod auth;
mod queue;
mod rdma;
mod tls;

use crate::{check_range, BlockClient, ClientError, ConnectOptions, HeldIo, Result, TargetUrl};
use async_trait::async_trait;
use bw_nvme::queue_entry::{admin, nvm, Sqe};
use bw_nvme::controller::feature;
use bw_nvme::fabrics::{self, reg, Connect, ConnectData, Property, CATTR_DISABLE_SQFLOW};
use bw_nvme::identify::{self, cns, IdCtrl};
use bw_nvme::logpage::{self, lid, LogRequest};
use bw_nvme::host_queue::Payload;
use bw_nvme::auth::AuthConfig;
use bytes::Bytes;
use bw_nvme::host_queue::Done;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Keep-alive timeout we ask for; Keep Alive goes out every half of it.
const KATO_MS: u32 = 10_000;
/// Admin queue depth (Linux uses 32 as well).
const ADMIN_DEPTH: usize = 32;
/// Transfers at least this long are spread over all I/O queues.
const SPREAD_MIN: usize = 128 * 1024;

fn proto(s: impl Into<String>) -> ClientError {
    ClientError::Protocol(s.into())
}

/// Our host NQN: the one given, else one derived from the machine's host name.
fn host_nqn(opts: &ConnectOptions) -> String {
    opts.initiator_name.clone().unwrap_or_else(|| {
        let h = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "localhost".into());
        format!("nqn.2026-11.org.blockwire:initiator:{}", h.trim())
    })
}

fn host_id(hostnqn: &str) -> [u8; 16] {
    let mut id = [0u8; 16];
    for (i, c) in id.chunks_mut(4).enumerate() {
        let seeded = format!("{i}:{hostnqn}");
        c.copy_from_slice(&bw_nvme::pdu::crc32c(seeded.as_bytes()).to_le_bytes());
    }
    id
}

/// How the queues reach the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Rdma,
}

/// One queue on either transport.
pub enum Queue {
    Tcp(queue::TcpQueue),
    Rdma(rdma::RdmaQueue),
}

impl Queue {
    async fn open(t: Transport, host: &str, port: u16, qid: u16, depth: usize, opts: &ConnectOptions, tls: Option<&tls::TlsClient>) -> Result<Queue> {
        Ok(match t {
            Transport::Tcp => Queue::Tcp(queue::TcpQueue::open(host, port, qid, depth, opts, tls).await?),
            Transport::Rdma => Queue::Rdma(rdma::RdmaQueue::open(host, port, qid, depth, opts).await?),
        })
    }
    pub fn qid(&self) -> u16 {
        match self {
            Queue::Tcp(q) => q.qid,
            Queue::Rdma(q) => q.qid,
        }
    }
    /// With TLS: the suite and who keeps the records.
    fn tls(&self) -> Option<&str> {
        match self {
            Queue::Tcp(q) => q.tls.as_deref(),
            Queue::Rdma(_) => None,
        }
    }
    fn set_incapsule(&self, n: usize) {
        match self {
            Queue::Tcp(q) => q.set_incapsule(n),
            Queue::Rdma(q) => q.set_incapsule(n),
        }
    }
    fn is_dead(&self) -> bool {
        match self {
            Queue::Tcp(q) => q.is_dead(),
            Queue::Rdma(q) => q.is_dead(),
        }
    }
    /// The completion and any data, whatever its status.
    pub async fn submit_raw(&self, sqe: Sqe, out: Option<Bytes>, in_len: u32) -> Result<Done> {
        match self {
            Queue::Tcp(q) => q.submit_raw(sqe, out, in_len).await,
            Queue::Rdma(q) => q.submit_raw(sqe, out, in_len).await,
        }
    }
    /// As [`Queue::submit_raw`]; an unsuccessful status is an error.
    pub async fn submit(&self, sqe: Sqe, out: Option<Bytes>, in_len: u32) -> Result<Done> {
        match self {
            Queue::Tcp(q) => q.submit(sqe, out, in_len).await,
            Queue::Rdma(q) => q.submit(sqe, out, in_len).await,
        }
    }
}

/// An admin queue connected and enabled: controller ID and identify data.
struct Admin {
    q: Arc<Queue>,
    cntlid: u16,
    id: IdCtrl,
    /// Identify Controller's firmware revision (bytes 64-71).
    firmware: String,
    mqes: u16,
}

/// Connect one queue and, when the controller asks (AUTHREQ), authenticate it.
async fn fabrics_connect(q: &Queue, qid: u16, sqsize: u16, kato_ms: u32, data: ConnectData, auth: Option<&Arc<AuthConfig>>) -> Result<u16> {
    let c = Connect { recfmt: 0, qid, sqsize, cattr: CATTR_DISABLE_SQFLOW, kato_ms };
    let d = q.submit_raw(c.to_sqe(0), Some(Bytes::from(data.encode())), 0).await?;
    if !d.cqe.status.is_success() {
        return Err(ClientError::Target(format!("Connect (queue {qid}) refused: {} (parameter {:#x})", d.cqe.status, d.cqe.dw0())));
    }
    let submit = |sqe, out, in_len| q.submit_raw(sqe, out, in_len);
    auth::authenticate(submit, qid, &data.hostnqn, &data.subnqn, d.cqe.dw0(), auth).await?;
    Ok(d.cqe.dw0() as u16)
}

async fn prop_get(q: &Queue, off: u32, size8: bool) -> Result<u64> {
    Ok(q.submit(Property::get_sqe(0, off, size8), None, 0).await?.cqe.result)
}

async fn prop_set(q: &Queue, off: u32, v: u64) -> Result<()> {
    q.submit(Property::set_sqe(0, off, v), None, 0).await.map(|_| ())
}

#[allow(clippy::too_many_arguments)]
async fn open_admin(t: Transport, host: &str, port: u16, subnqn: &str, opts: &ConnectOptions, kato_ms: u32, auth: Option<&Arc<AuthConfig>>, tls: Option<&tls::TlsClient>) -> Result<Admin> {
    let q = Queue::open(t, host, port, 0, ADMIN_DEPTH, opts, tls).await?;
    let hostnqn = host_nqn(opts);
    let data = ConnectData { hostid: host_id(&hostnqn), cntlid: 0xFFFF, subnqn: subnqn.into(), hostnqn };
    let cntlid = fabrics_connect(&q, 0, ADMIN_DEPTH as u16 - 1, kato_ms, data, auth).await?;
    let cap = prop_get(&q, reg::CAP, true).await?;
    // Enable: 64-byte SQEs, 16-byte CQEs, NVM command set.
    prop_set(&q, reg::CC, (6 << 16) | (4 << 20) | 1).await?;
    let to = Duration::from_millis(500 * ((cap >> 24) & 0xFF).max(1));
    let t0 = std::time::Instant::now();
    loop {
        let csts = prop_get(&q, reg::CSTS, false).await?;
        if csts & 2 != 0 {
            return Err(proto("controller fatal status while enabling"));
        }
        if csts & 1 != 0 {
            break;
        }
        if t0.elapsed() > to {
            return Err(ClientError::Timeout("controller did not become ready".into()));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut s = Sqe::new(admin::IDENTIFY, 0, 0);
    s.set_cdw(10, cns::CONTROLLER as u32);
    let d = q.submit(s, None, identify::LEN as u32).await?;
    let id = IdCtrl::parse(&d.data).ok_or_else(|| proto("short Identify Controller data"))?;
    if id.cntlid != cntlid {
        return Err(proto(format!("Identify cntlid {} differs from Connect's {cntlid}", id.cntlid)));
    }
    if id.icdoff != 0 || id.sgls & 3 == 0 {
        return Err(proto("controller needs ICDOFF 0 and SGL support"));
    }
    let firmware = String::from_utf8_lossy(d.data.get(64..72).unwrap_or_default()).trim().to_string();
    Ok(Admin { q: Arc::new(q), cntlid, id, firmware, mqes: (cap & 0xFFFF) as u16 })
}

async fn shutdown_admin(q: &Queue) {
    // Normal shutdown; wait briefly for SHST complete.
    if prop_set(q, reg::CC, (6 << 16) | (4 << 20) | 1 | (1 << 14)).await.is_ok() {
        for _ in 0..50 {
            match prop_get(q, reg::CSTS, false).await {
                Ok(c) if (c >> 2) & 3 == 2 => break,
                Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(_) => break,
            }
        }
    }
}

pub struct NvmeClient {
    url: String,
    admin: Arc<Queue>,
    io: Vec<Arc<Queue>>,
    next: AtomicUsize,
    nsid: u32,
    size: u64,
    block: u32,
    max_transfer: usize,
    closed: AtomicBool,
    keep_alive: tokio::task::JoinHandle<()>,
    cntlid: u16,
    /// Threads serving the I/O queues when there are several.
    io_rt: Option<tokio::runtime::Runtime>,
    /// Optional NVM commands the controller supports (Identify ONCS).
    oncs: u16,
    /// Identify Controller's model and firmware.
    identity: String,
    /// ", TLS <suite>, <record layer>" when the queues run TLS.
    secured: String,
}

pub async fn connect(url: &TargetUrl, opts: &ConnectOptions) -> Result<Arc<dyn BlockClient>> {
    Ok(Arc::new(NvmeClient::connect(url, opts).await?))
}

impl NvmeClient {
    pub async fn connect(url: &TargetUrl, opts: &ConnectOptions) -> Result<NvmeClient> {
        let (t, host, port, subnqn, nsid, tls) = match url {
            TargetUrl::Nvme { host, port, subnqn, nsid, tls } => (Transport::Tcp, host, port, subnqn, nsid, *tls),
            TargetUrl::NvmeRdma { host, port, subnqn, nsid } => (Transport::Rdma, host, port, subnqn, nsid, None),
            _ => return Err(proto(format!("{url} is not an nvme+tcp or nvme+rdma URL"))),
        };
        let auth = auth::config(opts)?;
        let tls = tls::TlsClient::new(opts, tls, &host_nqn(opts), subnqn)?.map(Arc::new);
        let a = open_admin(t, host, *port, subnqn, opts, KATO_MS, auth.as_ref(), tls.as_deref()).await?;
        let want = opts.queues.clamp(1, 0xFFFF) as u32;
        let mut s = Sqe::new(admin::SET_FEATURES, 0, 0);
        s.set_cdw(10, feature::NUM_QUEUES as u32);
        s.set_cdw(11, (want - 1) | (want - 1) << 16);
        let r = a.q.submit(s, None, 0).await?.cqe.dw0();
        let granted = ((r & 0xFFFF).min(r >> 16) + 1).min(want) as usize;
        let mut s = Sqe::new(admin::IDENTIFY, 0, *nsid);
        s.set_cdw(10, cns::NAMESPACE as u32);
        let d = a.q.submit(s, None, identify::LEN as u32).await?;
        let (blocks, block, _ro) = identify::parse_namespace(&d.data).ok_or_else(|| proto(format!("namespace {nsid}: bad Identify Namespace data")))?;
        if blocks == 0 {
            return Err(ClientError::Target(format!("namespace {nsid} is not active")));
        }
        // Queue depth: what was asked, bounded by MQES and MAXCMD.
        let mut depth = opts.queue_depth.clamp(2, a.mqes as usize + 1);
        if a.id.maxcmd > 0 {
            depth = depth.min(a.id.maxcmd as usize);
        }
        if t == Transport::Rdma {
            depth = depth.min(bw_nvme::rdma_queue::MAX_ENTRIES as usize);
        }
        let hostnqn = host_nqn(opts);
        let incapsule = (a.id.ioccsz as usize * 16).saturating_sub(64);
        // The first I/O queue runs on the caller's runtime; any further
        // ones get threads of their own (like the Linux host's per-CPU
        // queues), so the receive copies of large reads on different queues
        // run in parallel whatever runtime the caller uses.
        let io_rt = if granted > 1 {
            Some(tokio::runtime::Builder::new_multi_thread().worker_threads(granted - 1).thread_name("nvme-io").enable_all().build()?)
        } else {
            None
        };
        let mut io = Vec::new();
        for qid in 1..=granted as u16 {
            let (host, port, opts, auth, tls) = (host.clone(), *port, opts.clone(), auth.clone(), tls.clone());
            let data = ConnectData { hostid: host_id(&hostnqn), cntlid: a.cntlid, subnqn: subnqn.clone(), hostnqn: hostnqn.clone() };
            let open = async move {
                let q = Queue::open(t, &host, port, qid, depth, &opts, tls.as_deref()).await?;
                fabrics_connect(&q, qid, depth as u16 - 1, 0, data, auth.as_ref()).await?;
                q.set_incapsule(incapsule);
                Ok::<Queue, ClientError>(q)
            };
            let q = match io_rt.as_ref().filter(|_| qid > 1) {
                Some(rt) => rt.spawn(open).await.map_err(|e| proto(format!("opening queue {qid}: {e}")))??,
                None => open.await?,
            };
            io.push(Arc::new(q));
        }
        let max_transfer = if a.id.mdts == 0 { 1 << 20 } else { (4096usize << a.id.mdts).min(8 << 20) };
        let ka_q = a.q.clone();
        let keep_alive = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(KATO_MS as u64 / 2)).await;
                if ka_q.is_dead() || ka_q.submit(Sqe::new(admin::KEEP_ALIVE, 0, 0), None, 0).await.is_err() {
                    log::warn!("nvme: keep-alive failed");
                    return;
                }
            }
        });
        let secured = a.q.tls().map(|t| format!(", TLS {t}")).unwrap_or_default();
        log::info!("nvme: {url}: controller {} with {granted} I/O queues of depth {depth}, {blocks} blocks of {block} bytes{secured}", a.cntlid);
        Ok(NvmeClient {
            url: url.to_string(),
            admin: a.q,
            io,
            next: AtomicUsize::new(0),
            nsid: *nsid,
            size: blocks * block as u64,
            block,
            max_transfer,
            closed: AtomicBool::new(false),
            keep_alive,
            cntlid: a.cntlid,
            io_rt,
            oncs: a.id.oncs,
            identity: format!("{} firmware {}", a.id.model.trim(), a.firmware),
            secured,
        })
    }

    fn queue(&self) -> &Arc<Queue> {
        let i = self.next.fetch_add(1, Relaxed) % self.io.len();
        &self.io[i]
    }

    /// The queue for a transfer of `len` bytes. Small ones stay on the first
    /// queue, served by the caller's own threads: their cost is per command,
    /// and handing them to another thread would add two wakeups each. Large
    /// ones, whose cost is the receive copy, spread over all queues.
    fn queue_for(&self, len: usize) -> &Arc<Queue> {
        if len < SPREAD_MIN {
            return &self.io[0];
        }
        self.queue()
    }

    /// Number of I/O queues connected.
    pub fn io_queues(&self) -> usize {
        self.io.len()
    }

    /// Run one NVM command on an I/O queue; a raw completion for tests.
    pub async fn io_raw(&self, sqe: Sqe, out: Option<Bytes>, in_len: u32) -> Result<queue::Done> {
        self.queue().submit_raw(sqe, out, in_len).await
    }

    fn rw_sqe(&self, op: u8, offset: u64, len: usize) -> Sqe {
        let mut s = Sqe::new(op, 0, self.nsid);
        s.set_rw(offset / self.block as u64, (len / self.block as usize) as u32);
        s
    }

    /// Write `len` bytes at `offset` in commands of at most `max_transfer`,
    /// each carrying `piece(range)` of the data.
    async fn write_payload<'a>(&self, offset: u64, len: usize, mut piece: impl FnMut(std::ops::Range<usize>) -> Payload<'a>) -> Result<()> {
        check_range(self, offset, len)?;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(self.max_transfer);
            let sqe = self.rw_sqe(nvm::WRITE, offset + done as u64, n);
            // As in `read_held`.
            let data = piece(done..done + n);
            match &**self.queue_for(n) {
                Queue::Tcp(q) => q.submit_write(sqe, data).await?,
                Queue::Rdma(q) => Box::pin(q.submit_write(sqe, data)).await?,
            };
            done += n;
        }
        Ok(())
    }
}

impl Drop for NvmeClient {
    fn drop(&mut self) {
        self.keep_alive.abort();
        // The queues' tasks end with their connections; a runtime must not
        // block in drop when the client is dropped inside another runtime.
        if let Some(rt) = self.io_rt.take() {
            rt.shutdown_background();
        }
    }
}

impl HeldIo for NvmeClient {
    async fn read_held(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_range(self, offset, buf.len())?;
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(self.max_transfer);
            let sqe = self.rw_sqe(nvm::READ, offset + done as u64, n);
            // The transport's match is here, not in an `async fn` of
            // `Queue`: the TCP queue's future is built in place in this one,
            // not wrapped in one more state machine polled twice per command
            // (~50 instructions per 4 KiB QD32 read). The RDMA arm's is
            // boxed: a future holds the largest of its arms, and async_trait
            // moves the whole `read`/`write` future into its box on every
            // call (~250 instructions per read with the free,
            // docs/notes/2026-11-26-floor-6.md); over RDMA a box per command
            // is small beside a work request's post and poll.
            let part = &mut buf[done..done + n];
            let d = match &**self.queue_for(n) {
                Queue::Tcp(q) => q.submit_read(sqe, part).await?,
                Queue::Rdma(q) => Box::pin(q.submit_read(sqe, part)).await?,
            };
            if d.received != n {
                return Err(proto(format!("read of {n} bytes returned {}", d.received)));
            }
            done += n;
        }
        Ok(())
    }

    // Not `async`: `write_payload`'s future is this one, not wrapped in one
    // more state machine polled twice per command.
    fn write_owned_held(&self, offset: u64, mut data: bytes::Bytes) -> impl std::future::Future<Output = Result<()>> + Send {
        let len = data.len();
        // A write of one command hands its data on as it is: a slice is a
        // reference count taken and given back (an atomic operation each)
        // per write.
        self.write_payload(offset, len, move |r| Payload::Owned(if r.len() == len { std::mem::take(&mut data) } else { data.slice(r) }))
    }
}

#[async_trait]
impl BlockClient for NvmeClient {
    fn describe(&self) -> String {
        format!("{} (controller {}, {} I/O queues{})", self.url, self.cntlid, self.io.len(), self.secured)
    }
    fn identity(&self) -> Option<String> {
        Some(self.identity.clone())
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
        self.write_payload(offset, data.len(), |r| Payload::Borrowed(&data[r])).await
    }

    async fn write_owned(&self, offset: u64, data: bytes::Bytes) -> Result<()> {
        self.write_owned_held(offset, data).await
    }

    async fn flush(&self) -> Result<()> {
        self.queue().submit(Sqe::new(nvm::FLUSH, 0, self.nsid), None, 0).await.map(|_| ())
    }

    /// Dataset Management with the deallocate attribute.
    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        if self.oncs & identify::ONCS_DSM == 0 {
            return Err(ClientError::Unsupported(format!("deallocate on {} (no Dataset Management in ONCS)", self.url)));
        }
        check_range(self, offset, len as usize)?;
        let bs = self.block as u64;
        let (mut lba, mut left) = (offset / bs, len / bs);
        while left > 0 {
            let mut ranges = Vec::new();
            while left > 0 && ranges.len() < nvm::DSM_MAX_RANGES {
                let n = left.min(u32::MAX as u64) as u32;
                ranges.push((lba, n));
                lba += n as u64;
                left -= n as u64;
            }
            let mut s = Sqe::new(nvm::DSM, 0, self.nsid);
            s.set_dsm(ranges.len(), true);
            self.queue().submit(s, Some(Bytes::from(bw_nvme::nvm_io::dsm_ranges(&ranges))), 0).await?;
        }
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        if self.closed.swap(true, Relaxed) {
            return Ok(());
        }
        self.keep_alive.abort();
        for q in &self.io {
            if let Err(e) = q.submit(fabrics::disconnect_sqe(0), None, 0).await {
                log::debug!("nvme: disconnect of queue {}: {e}", q.qid());
            }
        }
        shutdown_admin(&self.admin).await;
        Ok(())
    }
}

/// Read the discovery log of the discovery controller at HOST:PORT; one line
/// per entry.
pub async fn discover(host: &str, port: u16, opts: &ConnectOptions) -> Result<Vec<String>> {
    // Discovery controllers do not prove themselves here: the log they
    // serve is not secret, and each subsystem it names is checked on connect.
    let auth = auth::config(opts)?.map(|c| Arc::new(AuthConfig { ctrl_key: None, ..(*c).clone() }));
    let a = open_admin(Transport::Tcp, host, port, bw_nvme::DISCOVERY_NQN, opts, 0, auth.as_ref(), None).await?;
    let get = |len: usize| {
        let q = a.q.clone();
        async move {
            let r = LogRequest { lid: lid::DISCOVERY, rae: false, len, offset: 0 };
            q.submit(r.to_sqe(0, 0), None, len as u32).await
        }
    };
    let head = get(1024).await?;
    let n = logpage::discovery_numrec(&head.data).ok_or_else(|| proto("short discovery log header"))?;
    let full = get(1024 * (n.min(1000) as usize + 1)).await?;
    let (genctr, entries) = logpage::parse_discovery_log(&full.data).ok_or_else(|| proto("bad discovery log"))?;
    shutdown_admin(&a.q).await;
    log::debug!("nvme: discovery log generation {genctr}, {} entries", entries.len());
    Ok(entries
        .iter()
        .map(|e| {
            let kind = match e.subtype {
                logpage::SUBTYPE_NVME => "nvme",
                logpage::SUBTYPE_CURRENT_DISCOVERY => "current-discovery",
                1 => "discovery-referral",
                _ => "unknown",
            };
            let scheme = if e.trtype == logpage::TRTYPE_RDMA { "nvme+rdma" } else { "nvme+tcp" };
            let tls = match e.tls {
                logpage::SecureChannel::None => String::new(),
                t => format!(", TLS {}", t.name()),
            };
            format!("{scheme}://{}:{}/{} (subtype {kind}, portid {}{tls})", e.traddr.trim(), e.trsvcid.trim(), e.subnqn, e.portid)
        })
        .collect())
}
