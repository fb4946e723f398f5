//! Userspace initiators behind one trait.
//!
//! [`connect`] turns a URL into a [`BlockClient`]:
//! - `aoe://IFACE/SHELF.SLOT`
//! - `iscsi://[USER[%SECRET]@]HOST[:PORT]/IQN/LUN`
//! - `nvme+tcp://HOST[:PORT]/SUBNQN/NSID`
//! - `nfs://HOST[:PORT]/EXPORT/FILE[?sync]` (a file on an NFSv3 export)
//!
//! Clients are shared between tasks (`Arc<dyn BlockClient>`): every method
//! takes `&self`, and each client keeps many requests in flight internally
//! (tags, ITTs, command IDs), so concurrency is simply concurrent calls.

mod connect;
mod url;
pub use connect::{connect, connect_typed, Connected};
pub use url::{redact_url, TargetUrl, UrlError};

pub mod aoe;
mod direct;
mod placed;
pub mod iscsi;
pub mod nfs;
pub mod nvme;
mod send;
mod waiting;

use async_trait::async_trait;
pub use bw_net::tcp::Congestion;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Url(#[from] UrlError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Connecting to `url` failed (the cause is the source).
    #[error("cannot connect to {url}")]
    Connect { url: String, source: Box<ClientError> },
    #[error("target reported an error: {0}")]
    Target(String),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("request out of range: offset {offset} length {len}, device has {size} bytes")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("not connected: {0}")]
    Disconnected(String),
    #[error("not supported: {0}")]
    Unsupported(String),
    /// In-band authentication failed or was needed and not possible.
    #[error("authentication: {0}")]
    Auth(String),
    /// NVMe/TCP's TLS: a PSK that does not parse, a handshake refused.
    #[error("TLS: {0}")]
    Tls(String),
}

pub type Result<T> = std::result::Result<T, ClientError>;

/// The TLS PSK identity's form ([`ConnectOptions::tls_identity`]).
pub use bw_nvme::tls_psk::IdentityVersion as TlsIdentity;

/// Options shared by every protocol; each client ignores what does not apply.
#[derive(Clone)]
pub struct ConnectOptions {
    /// Our iSCSI initiator IQN / NVMe host NQN (a sensible default if None).
    pub initiator_name: Option<String>,
    /// NVMe/TCP: number of I/O queues (connections) to open.
    pub queues: usize,
    /// Commands in flight per queue/session the client should allow.
    pub queue_depth: usize,
    /// iSCSI / NVMe: ask for CRC32C header and data digests.
    pub header_digest: bool,
    pub data_digest: bool,
    /// How long to wait for the target before giving up on one request.
    pub timeout: Duration,
    /// NVMe/TCP in-band authentication (DH-HMAC-CHAP): our host secret,
    /// `DHHC-1:hh:base64:` as `nvme gen-dhchap-key` prints it ...
    pub dhchap_secret: Option<String>,
    /// ... and the controller's, to make it prove itself (bidirectional).
    pub dhchap_ctrl_secret: Option<String>,
    /// NVMe/TCP with `?tls`: the configured PSK, `NVMeTLSkey-1:hh:base64:`
    /// as `nvme gen-tls-key` prints it.
    pub tls_psk: Option<String>,
    /// The PSK identity's form: version 0 (`NVMe0R01 host subsystem`, what
    /// Linux's host looks up before 6.13 and nvme-cli inserts by default)
    /// or 1 (with the PSK digest).
    pub tls_identity: bw_nvme::tls_psk::IdentityVersion,
    /// iSCSI / NVMe: the connections' TCP congestion control.
    pub tcp_congestion: Congestion,
    /// AoE: AF_XDP or AF_PACKET sockets (`auto`: AF_XDP where it can be set up).
    pub aoe_datapath: bw_net::Datapath,
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |s: &Option<String>| s.as_ref().map(|_| "(redacted)");
        f.debug_struct("ConnectOptions")
            .field("initiator_name", &self.initiator_name)
            .field("queues", &self.queues)
            .field("queue_depth", &self.queue_depth)
            .field("header_digest", &self.header_digest)
            .field("data_digest", &self.data_digest)
            .field("timeout", &self.timeout)
            .field("dhchap_secret", &hidden(&self.dhchap_secret))
            .field("dhchap_ctrl_secret", &hidden(&self.dhchap_ctrl_secret))
            .field("tls_psk", &hidden(&self.tls_psk))
            .field("tls_identity", &self.tls_identity)
            .field("tcp_congestion", &self.tcp_congestion)
            .field("aoe_datapath", &self.aoe_datapath)
            .finish()
    }
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            initiator_name: None,
            queues: 1,
            queue_depth: 128,
            header_digest: false,
            data_digest: false,
            timeout: Duration::from_secs(30),
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
            tls_psk: None,
            tls_identity: bw_nvme::tls_psk::IdentityVersion::V0,
            tcp_congestion: Congestion::Auto,
            aoe_datapath: bw_net::Datapath::Auto,
        }
    }
}

/// A TCP connection to an iSCSI or NVMe/TCP target, as every session and
/// queue opens it: within `opts.timeout`, trying each address the name
/// resolves to, with Nagle off (requests are small and latency-bound) and
/// the congestion control `opts` asks for, set before connecting (see
/// `bw_net::tcp::CongestionPlan` for why before).
pub(crate) async fn connect_tcp(host: &str, port: u16, opts: &ConnectOptions) -> Result<tokio::net::TcpStream> {
    let plan = bw_net::tcp::CongestionPlan::new(opts.tcp_congestion.clone());
    let attempt = async {
        let mut last = None;
        for addr in tokio::net::lookup_host((host, port)).await? {
            let sock = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
            if let Some(cc) = plan.before_connect(&sock, bw_net::tcp::is_own_address(addr.ip()))? {
                log::debug!("{addr} is on this machine: TCP congestion control {cc}");
            }
            match sock.connect(addr).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("{host}: no address"))))
    };
    let stream = tokio::time::timeout(opts.timeout, attempt)
        .await
        .map_err(|_| ClientError::Timeout(format!("connecting to {host}:{port}")))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// A remote (or local) disk addressed in bytes. Offsets and lengths must be
/// multiples of [`BlockClient::block_size`].
#[async_trait]
pub trait BlockClient: Send + Sync {
    /// What this client is connected to, for logs and reports.
    fn describe(&self) -> String;
    /// What the target says it is, as read at connect: SCSI INQUIRY's
    /// vendor, product and revision; NVMe Identify Controller's model and
    /// firmware; ATA IDENTIFY's over AoE; an NFS file's server and export.
    fn identity(&self) -> Option<String> {
        None
    }
    fn size_bytes(&self) -> u64;
    fn block_size(&self) -> u32 {
        512
    }
    async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    async fn write(&self, offset: u64, data: &[u8]) -> Result<()>;
    /// [`BlockClient::write`] for a caller that hands its buffer over: the
    /// client may keep `data` until the target has it instead of copying
    /// it (the FUSE attach path, whose request buffers are its own).
    async fn write_owned(&self, offset: u64, data: bytes::Bytes) -> Result<()> {
        self.write(offset, &data).await
    }
    /// Make acknowledged writes durable on the target.
    async fn flush(&self) -> Result<()>;
    /// Tell the target a range is no longer needed (UNMAP, Dataset Management
    /// deallocate). Targets and protocols without it answer `Unsupported`.
    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let _ = (offset, len);
        Err(ClientError::Unsupported(format!("discard on {}", self.describe())))
    }
    /// Log out / disconnect cleanly.
    async fn close(&self) -> Result<()>;
}

/// Reads and writes of a client whose type the caller knows, with each
/// request's future held in the caller's own (a bench worker's task): a
/// [`BlockClient`] call through `dyn` returns its future boxed, one malloc
/// and free per request and the future moved into the box (~150-250
/// instructions of a 4 KiB read's ~3,700 in `blockwire bench`;
/// docs/notes/2026-11-27-h51i-client.md). The same requests as
/// [`BlockClient::read`] and [`BlockClient::write_owned`].
pub trait HeldIo: BlockClient {
    fn read_held(&self, offset: u64, buf: &mut [u8]) -> impl std::future::Future<Output = Result<()>> + Send;
    fn write_owned_held(&self, offset: u64, data: bytes::Bytes) -> impl std::future::Future<Output = Result<()>> + Send;
}

/// Any client, through `dyn`: its boxed futures.
impl HeldIo for dyn BlockClient {
    async fn read_held(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read(offset, buf).await
    }
    async fn write_owned_held(&self, offset: u64, data: bytes::Bytes) -> Result<()> {
        self.write_owned(offset, data).await
    }
}

/// Check an I/O request against the device geometry before it goes on the wire.
///
/// Inlined: its callers pass a concrete client, so the geometry is read
/// straight from it instead of through two dynamic calls, and the call
/// itself goes (~59 instructions per 4 KiB read as a call, callgrind,
/// docs/notes/2026-11-27-h51z1-client.md).
#[inline]
pub fn check_range(client: &dyn BlockClient, offset: u64, len: usize) -> Result<()> {
    let bs = client.block_size() as u64;
    let size = client.size_bytes();
    let end = offset.checked_add(len as u64);
    if !offset.is_multiple_of(bs) || !(len as u64).is_multiple_of(bs) || end.is_none_or(|e| e > size) {
        return Err(ClientError::OutOfRange { offset, len: len as u64, size });
    }
    Ok(())
}
