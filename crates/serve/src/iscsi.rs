//! iSCSI front-end: TCP listeners, one thread (single-threaded runtime) per
//! connection, login via `bw_iscsi::target_login`, full feature phase via
//! `bw_iscsi::target_session`, SCSI commands executed by `bw_scsi` in parallel.
//! Large READs are sent zero-copy (`sendfile` of a `bw_scsi::ReadExtent`),
//! Data-Out reaches the backend in the pieces it arrived in.

use crate::config::{IscsiConfig, IscsiTarget};
use crate::limits::{Admission, Limits, Ticket};
use crate::{Running, Shutdown, Volumes};
use anyhow::Context;
use bw_iscsi::target_login::{LoginConfig, LoginStep, Secret, TargetInfo, TargetLogin};
use bw_iscsi::negotiate::{LocalLimits, SessionType};
use bw_iscsi::pdu::{write_pdu, Decoder, Digests, Pdu};
use bw_iscsi::target_session::{write_outcome, Action, Exec, SessionConfig, TargetSession};
use bw_scsi::{AluaState, LunConfig, PortGroup, ReadExtent, ReadPlan, ScsiTarget};
use bytes::BytesMut;
use std::os::fd::AsRawFd;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};

/// Commands one session may have outstanding (MaxCmdSN window).
pub const QUEUE_DEPTH: u32 = 128;
/// Idle time after which we ping the initiator with a NOP-In; a second
/// interval without an answer ends the connection.
const NOP_INTERVAL: Duration = Duration::from_secs(15);
/// Largest READ/WRITE run inline on the connection's task; bigger
/// transfers and everything else (flushes, unmaps) go to the blocking pool.
/// `BLOCKWIRE_ISCSI_INLINE_MAX` overrides it, for measuring.
fn inline_io_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var("BLOCKWIRE_ISCSI_INLINE_MAX").ok().and_then(|v| v.parse().ok()).unwrap_or(64 * 1024)
    })
}
/// Smallest READ sent zero-copy (`sendfile` from the backend, see
/// [`bw_scsi::ReadExtent`]); smaller ones are copied, which lets many
/// replies share one socket write. `BLOCKWIRE_ISCSI_ZERO_COPY_MIN`
/// overrides it (a huge value turns zero-copy off), for measuring.
fn zero_copy_min() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("BLOCKWIRE_ISCSI_ZERO_COPY_MIN").ok().and_then(|v| v.parse().ok()).unwrap_or(32 * 1024)
    })
}

struct Target {
    scsi: Arc<ScsiTarget>,
}

struct Ctx {
    login: LoginConfig,
    targets: Vec<Target>,
    listen: Vec<SocketAddr>,
    next_tsih: AtomicU16,
    next_nexus: AtomicU64,
    /// Session and per-address limits, login timeout.
    admission: Arc<Admission>,
    /// Live normal sessions by (initiator name, ISID, target): a new login
    /// with the same key reinstates the session, ending the old connection.
    sessions: Mutex<HashMap<(String, [u8; 6], usize), (u64, Arc<Notify>)>>,
}

fn secret(c: &Option<crate::config::Credentials>) -> Option<Secret> {
    c.as_ref().map(|c| Secret { user: c.user.clone(), secret: c.secret.expose().to_string() })
}

fn alua_state(s: crate::config::AluaStateConfig) -> AluaState {
    use crate::config::AluaStateConfig as C;
    match s {
        C::ActiveOptimized => AluaState::ActiveOptimized,
        C::ActiveNonOptimized => AluaState::ActiveNonOptimized,
        C::Standby => AluaState::Standby,
        C::Unavailable => AluaState::Unavailable,
    }
}

fn build_target(t: &IscsiTarget, volumes: &Volumes) -> anyhow::Result<Target> {
    let mut luns = Vec::new();
    for l in &t.luns {
        let vol = volumes.get(&l.volume).with_context(|| format!("target {}: no volume {}", t.iqn, l.volume))?;
        let mut lc = LunConfig::for_volume(&l.volume, &t.iqn, l.lun);
        lc.read_only = l.readonly || vol.read_only();
        lc.port_group = PortGroup { id: t.target_port_group, state: alua_state(t.alua_state) };
        luns.push((l.lun, vol.clone(), lc));
    }
    Ok(Target { scsi: Arc::new(ScsiTarget::new(luns)) })
}

pub async fn start(cfg: &IscsiConfig, limits: &Limits, volumes: &Volumes, shutdown: Shutdown) -> anyhow::Result<Running> {
    let mut infos = Vec::new();
    let mut targets = Vec::new();
    for t in &cfg.targets {
        targets.push(build_target(t, volumes)?);
        infos.push(TargetInfo {
            name: t.iqn.clone(),
            alias: None,
            portal_group_tag: t.portal_group_tag,
            allowed_initiators: t.allowed_initiators.clone(),
            chap: secret(&t.chap),
            mutual_chap: secret(&t.mutual_chap),
        });
        eprintln!("blockwire: iSCSI target {} ({} LUNs)", t.iqn, t.luns.len());
    }
    let ctx = Arc::new(Ctx {
        login: LoginConfig {
            targets: infos,
            limits: LocalLimits::default(),
            queue_depth: QUEUE_DEPTH,
            discovery_chap: secret(&cfg.discovery_chap),
            discovery_mutual_chap: secret(&cfg.discovery_mutual_chap),
        },
        targets,
        listen: cfg.listen.clone(),
        next_tsih: AtomicU16::new(1),
        next_nexus: AtomicU64::new(1),
        admission: Admission::new(limits.clone()),
        sessions: Mutex::new(HashMap::new()),
    });
    let mut listeners = Vec::new();
    for a in &cfg.listen {
        let l = TcpListener::bind(a).await.with_context(|| format!("iSCSI listen on {a}"))?;
        log::info!("iSCSI listening on {a}");
        listeners.push(l);
    }
    Ok(tokio::spawn(async move {
        let mut tasks = Vec::new();
        for l in listeners {
            let ctx = ctx.clone();
            let sd = shutdown.clone();
            tasks.push(tokio::spawn(accept_loop(l, ctx, sd)));
        }
        let mut sd = shutdown.clone();
        sd.wait().await;
        for t in tasks {
            let _ = t.await;
        }
        Ok(())
    }))
}

async fn accept_loop(l: TcpListener, ctx: Arc<Ctx>, mut shutdown: Shutdown) {
    loop {
        tokio::select! {
            _ = shutdown.wait() => return,
            r = l.accept() => match r {
                Ok((s, peer)) => {
                    let ticket = match ctx.admission.admit(peer.ip()) {
                        Ok(t) => t,
                        Err(why) => {
                            log::warn!("iSCSI connection from {peer} refused: {why}");
                            continue;
                        }
                    };
                    let ctx = ctx.clone();
                    let sd = shutdown.clone();
                    if own_thread_per_connection() {
                        if let Err(e) = spawn_connection_thread(s, peer, ctx, sd, ticket) {
                            log::warn!("iSCSI connection from {peer}: {e:#}");
                        }
                        continue;
                    }
                    tokio::spawn(async move {
                        if let Err(e) = connection(s, ctx, sd, ticket).await {
                            log::info!("iSCSI connection from {peer} ended: {e:#}");
                        }
                    });
                }
                Err(e) => {
                    log::warn!("iSCSI accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Whether each connection gets its own thread with a single-threaded
/// runtime (default) instead of a task on the shared runtime: the thread
/// that waits for the socket also runs the command and writes the answer,
/// so a request costs one wakeup and no cross-thread hand-offs.
/// `BLOCKWIRE_ISCSI_CONN_THREADS=0` turns it off, for measuring.
fn own_thread_per_connection() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("BLOCKWIRE_ISCSI_CONN_THREADS").map_or(true, |v| v != "0"))
}

fn spawn_connection_thread(s: TcpStream, peer: SocketAddr, ctx: Arc<Ctx>, sd: Shutdown, ticket: Ticket) -> anyhow::Result<()> {
    let s = s.into_std()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::Builder::new().name("iscsi-conn".into()).spawn(move || {
        rt.block_on(async move {
            let r = match TcpStream::from_std(s) {
                Ok(s) => connection(s, ctx, sd, ticket).await,
                Err(e) => Err(e.into()),
            };
            if let Err(e) = r {
                log::info!("iSCSI connection from {peer} ended: {e:#}");
            }
        });
    })?;
    Ok(())
}

/// How many PDUs in a row are handled before the answers queued so far are
/// sent; `BLOCKWIRE_ISCSI_FLUSH_EVERY` overrides it, for measuring.
fn flush_every() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("BLOCKWIRE_ISCSI_FLUSH_EVERY").ok().and_then(|v| v.parse().ok()).unwrap_or(usize::MAX).max(1))
}

/// PDUs from this size on are read to their end and no further (see
/// `full_feature`).
const LARGE_PDU: usize = 64 * 1024;

/// One read into `buf`, of at most `limit` bytes if given.
async fn read_some(rd: &mut tokio::net::tcp::OwnedReadHalf, buf: &mut BytesMut, limit: Option<usize>) -> std::io::Result<usize> {
    match limit {
        Some(n) => rd.take(n as u64).read_buf(buf).await,
        None => rd.read_buf(buf).await,
    }
}

/// Read until one PDU is complete.
async fn read_pdu(rd: &mut tokio::net::tcp::OwnedReadHalf, buf: &mut BytesMut, dec: &Decoder) -> anyhow::Result<Option<Pdu>> {
    loop {
        if let Some(p) = dec.decode(buf)? {
            return Ok(Some(p));
        }
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(64 * 1024);
        }
        if rd.read_buf(buf).await? == 0 {
            return Ok(None);
        }
    }
}

/// Portal strings for SendTargets; wildcard listeners show the address
/// this connection arrived on.
fn portals(ctx: &Ctx, local: SocketAddr, tpgt: u16) -> Vec<String> {
    ctx.listen
        .iter()
        .map(|a| {
            let ip = if a.ip().is_unspecified() { local.ip() } else { a.ip() };
            let sa = SocketAddr::new(ip, a.port());
            format!("{sa},{tpgt}")
        })
        .collect()
}

/// One connection, from accept to close; `ticket` holds its place in the
/// admission limits until it ends.
async fn connection(stream: TcpStream, ctx: Arc<Ctx>, mut shutdown: Shutdown, mut ticket: Ticket) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let local = stream.local_addr()?;
    let (mut rd, mut wr) = stream.into_split();
    let mut buf = BytesMut::with_capacity(256 * 1024);
    let mut dec = Decoder::new(64 * 1024);
    // Login phase: strictly request/response.
    let tsih = loop {
        let t = ctx.next_tsih.fetch_add(1, Ordering::Relaxed);
        if t != 0 {
            break t;
        }
    };
    let entropy = bw_iscsi::chap::ChapEntropy::from_os().map_err(|e| anyhow::anyhow!("no random numbers from the OS for a CHAP challenge: {e}"))?;
    let mut login = TargetLogin::new(&ctx.login, tsih, entropy);
    // The whole login, not each PDU, has to fit in the timeout: a peer
    // dripping a byte at a time must not hold its thread for ever.
    let login_timeout = ctx.admission.limits().login_timeout();
    let deadline = tokio::time::Instant::now() + login_timeout;
    loop {
        let pdu = match tokio::time::timeout_at(deadline, read_pdu(&mut rd, &mut buf, &dec)).await {
            Ok(r) => r?,
            Err(_) => anyhow::bail!("no complete login within {login_timeout:?} (login_timeout_s)"),
        };
        let Some(pdu) = pdu else { return Ok(()) };
        if !ticket.begin_session() {
            let resp = login.refuse(&pdu, bw_iscsi::msg::login_status::OUT_OF_RESOURCES);
            wr.write_all(&resp.encode(Digests::default())).await?;
            log::warn!("iSCSI login refused: {} sessions already (max_sessions)", ctx.admission.limits().max_sessions);
            return Ok(());
        }
        let (resp, step) = login.step(&pdu);
        // One write per response: login PDUs are small.
        wr.write_all(&resp.encode(Digests::default())).await?;
        match step {
            LoginStep::Continue => {}
            LoginStep::Complete => break,
            LoginStep::Failed(s) => {
                wr.flush().await?;
                log::info!("iSCSI login from {} refused with status {s:#06x}", login.initiator_name());
                return Ok(());
            }
        }
    }
    let Some(res) = login.result().cloned() else { anyhow::bail!("login completed without a result") };
    drop(login);
    let digests = Digests { header: res.params.header_digest, data: res.params.data_digest };
    dec.digests = digests;
    dec.max_data = res.params.max_recv_data_segment_length as usize;
    let visible: Vec<(String, Vec<String>)> = ctx
        .login
        .targets
        .iter()
        .filter(|t| t.allowed_initiators.is_empty() || t.allowed_initiators.iter().any(|a| *a == res.initiator_name))
        .map(|t| (t.name.clone(), portals(&ctx, local, t.portal_group_tag)))
        .collect();
    let current = res.target.map(|i| ctx.login.targets[i].name.clone());
    log::info!(
        "iSCSI {} session from {} to {:?} (digests {:?})",
        if res.session_type == SessionType::Discovery { "discovery" } else { "normal" },
        res.initiator_name,
        current,
        digests
    );
    let session = TargetSession::new(SessionConfig {
        session_type: res.session_type,
        params: res.params.clone(),
        queue_depth: QUEUE_DEPTH,
        exp_cmd_sn: res.exp_cmd_sn,
        stat_sn: res.next_stat_sn,
        cid: res.cid,
        targets: visible,
        current_target: current,
    });
    let scsi = res.target.map(|i| ctx.targets[i].scsi.clone());
    let nexus = ctx.next_nexus.fetch_add(1, Ordering::Relaxed);
    if let Some(s) = &scsi {
        let isid: String = res.isid.iter().map(|b| format!("{b:02x}")).collect();
        s.set_initiator_name(nexus, &format!("{},i,0x{isid}", res.initiator_name));
    }
    let ended = Arc::new(Notify::new());
    let key = res.target.map(|t| (res.initiator_name.clone(), res.isid, t));
    if let Some(k) = &key {
        let old = ctx.sessions.lock().unwrap_or_else(|p| p.into_inner()).insert(k.clone(), (nexus, ended.clone()));
        if let Some((_, old)) = old {
            log::info!("iSCSI session of {} reinstated: ending the old connection", res.initiator_name);
            old.notify_one();
        }
    }
    let (tx, rx) = mpsc::unbounded_channel::<Out>();
    // Zero-copy data-in cannot carry a data digest (it would need the bytes).
    let zero_copy = !digests.data;
    let conn = Arc::new(Conn { session: Mutex::new(session), tx, scsi: scsi.clone(), nexus, zero_copy });
    let mut io = ConnIo { rd, w: BufWriter::with_capacity(256 * 1024, wr), rx, digests, buf, dec };
    let r = full_feature(&conn, &mut io, &mut shutdown, &ended).await;
    if let Some(k) = &key {
        let mut map = ctx.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(k).is_some_and(|(n, _)| *n == nexus) {
            map.remove(k);
        }
    }
    let _ = io.w.flush().await;
    let _ = io.w.shutdown().await;
    if let Some(s) = &scsi {
        s.nexus_gone(nexus);
    }
    r
}

/// What the connection's writer sends, in queue order.
enum Out {
    Pdu(Pdu),
    /// A Data-In PDU whose data segment is bytes `at..at + len` of a read
    /// extent, sent with `sendfile` from the backend.
    Extent { pdu: Pdu, extent: Arc<ReadExtent>, at: usize, len: usize },
}

struct Conn {
    session: Mutex<TargetSession>,
    tx: mpsc::UnboundedSender<Out>,
    scsi: Option<Arc<ScsiTarget>>,
    nexus: u64,
    /// Large READs go out as read extents (no data digest on this connection).
    zero_copy: bool,
}

impl Conn {
    fn lock(&self) -> std::sync::MutexGuard<'_, TargetSession> {
        self.session.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue the PDUs a session call produced (call with the session lock
    /// held, so they keep their order).
    fn queue(&self, out: Vec<Action>, extent: Option<&Arc<ReadExtent>>) {
        for a in out {
            match a {
                Action::Send(p) => {
                    let _ = self.tx.send(Out::Pdu(p));
                }
                Action::SendExtent { pdu, at, len } => {
                    if let Some(x) = extent {
                        let _ = self.tx.send(Out::Extent { pdu, extent: x.clone(), at, len });
                    }
                }
                _ => {}
            }
        }
    }

    /// Try to answer a large READ zero-copy. `false`: run it the ordinary way.
    fn try_zero_copy_read(&self, scsi: &ScsiTarget, e: &Exec) -> bool {
        if !self.zero_copy || !e.read || e.write || (e.edtl as usize) < zero_copy_min() {
            return false;
        }
        let mut out = Vec::new();
        match scsi.plan_read(self.nexus, lun_number(e.lun), &e.cdb) {
            ReadPlan::Buffered => return false,
            ReadPlan::Extent(x) => {
                let x = Arc::new(x);
                let mut s = self.lock();
                s.complete_extent(e.itt, e.id, x.len, &mut out);
                self.queue(out, Some(&x));
            }
            ReadPlan::Done(o) => {
                let mut s = self.lock();
                s.complete(e.itt, e.id, o.status, &o.sense, Vec::new(), bw_iscsi::msg::Residual::None, &mut out);
                self.queue(out, None);
            }
        }
        true
    }
}

fn lun_number(lun_field: u64) -> u64 {
    bw_scsi::decode_lun(lun_field.to_be_bytes()).unwrap_or(u64::MAX)
}

/// Run one SCSI command and build the transport result.
fn run_command(scsi: &ScsiTarget, nexus: u64, e: &Exec, data_in: &mut Vec<u8>) -> (u8, Vec<u8>, bw_iscsi::msg::Residual) {
    let lun = lun_number(e.lun);
    let wanted = scsi.data_out_len(lun, &e.cdb);
    // The pieces received, cut to what the CDB transfers.
    let mut data_out: Vec<&[u8]> = Vec::with_capacity(e.data_out.len());
    let residual = match wanted {
        Some(w) => {
            let mut left = w;
            for p in &e.data_out {
                let k = p.len().min(left);
                if k > 0 {
                    data_out.push(&p[..k]);
                }
                left -= k;
            }
            write_outcome(w, e.edtl as usize).0
        }
        None => bw_iscsi::msg::Residual::None,
    };
    // WRITE SAME and COMPARE AND WRITE take an exact amount of data: more
    // (or for COMPARE AND WRITE, less) than the CDB implies is an invalid
    // request, not something to truncate.
    if let Some(w) = wanted {
        let edtl = e.edtl as usize;
        let exact = matches!(e.cdb.first(), Some(0x41 | 0x93)) && edtl > w || e.cdb.first() == Some(&0x89) && edtl != w;
        if exact {
            let mut sense = vec![0u8; 18];
            sense[0] = 0x70;
            sense[2] = 0x05; // ILLEGAL REQUEST
            sense[7] = 10;
            sense[12] = 0x24; // INVALID FIELD IN CDB
            data_in.clear();
            return (bw_scsi::status::CHECK_CONDITION, sense, residual);
        }
    }
    let o = scsi.execute_pieces(nexus, lun, &e.cdb, &data_out, data_in);
    (o.status, o.sense, residual)
}

/// Whether a command is cheap enough to run on the runtime thread: small
/// READ/WRITE 6/10/12/16. Everything else (flushes, unmaps, big transfers)
/// may block for long and goes to the blocking pool.
fn inline_ok(e: &Exec) -> bool {
    matches!(e.cdb.first(), Some(0x08 | 0x0A | 0x28 | 0x2A | 0xA8 | 0xAA | 0x88 | 0x8A))
        && (e.edtl as usize) <= inline_io_limit()
}

fn dispatch(conn: &Arc<Conn>, actions: Vec<Action>) -> bool {
    let mut keep_going = true;
    for a in actions {
        match a {
            Action::Send(p) => {
                let _ = conn.tx.send(Out::Pdu(p));
            }
            // Only produced by complete_extent, which `Conn::queue` handles.
            Action::SendExtent { .. } => {}
            Action::Close => {
                keep_going = false;
            }
            Action::Execute(e) => {
                let Some(scsi) = conn.scsi.clone() else { continue };
                if conn.try_zero_copy_read(&scsi, &e) {
                    continue;
                }
                let c = conn.clone();
                let finish = move |c: &Arc<Conn>, e: &Exec, status: u8, sense: Vec<u8>, data_in: Vec<u8>, res| {
                    let mut out = Vec::new();
                    // Hold the lock while queueing so PDUs keep their order.
                    let mut s = c.lock();
                    s.complete(e.itt, e.id, status, &sense, data_in, res, &mut out);
                    c.queue(out, None);
                };
                if inline_ok(&e) {
                    let mut data_in = Vec::new();
                    let (st, sense, res) = run_command(&scsi, c.nexus, &e, &mut data_in);
                    finish(&c, &e, st, sense, data_in, res);
                } else {
                    tokio::spawn(async move {
                        let nexus = c.nexus;
                        let r = tokio::task::spawn_blocking(move || {
                            let mut data_in = Vec::new();
                            let (st, sense, res) = run_command(&scsi, nexus, &e, &mut data_in);
                            (e, st, sense, data_in, res)
                        })
                        .await;
                        if let Ok((e, st, sense, data_in, res)) = r {
                            finish(&c, &e, st, sense, data_in, res);
                        }
                    });
                }
            }
            Action::LunReset { itt, lun } => {
                let ok = conn.scsi.as_ref().is_some_and(|s| s.lun_reset(lun_number(lun)));
                let resp = if ok {
                    bw_iscsi::msg::tmf_response::FUNCTION_COMPLETE
                } else {
                    bw_iscsi::msg::tmf_response::LUN_DOES_NOT_EXIST
                };
                let p = conn.lock().finish_tmf(itt, resp);
                let _ = conn.tx.send(Out::Pdu(p));
            }
            Action::TargetReset { itt, cold } => {
                if let Some(s) = &conn.scsi {
                    s.target_reset();
                }
                let p = conn.lock().finish_tmf(itt, bw_iscsi::msg::tmf_response::FUNCTION_COMPLETE);
                let _ = conn.tx.send(Out::Pdu(p));
                if cold {
                    keep_going = false;
                }
            }
        }
    }
    keep_going
}

/// The socket side of one connection in full feature phase. One task does
/// both directions: commands that run inline (small reads and writes) are
/// answered without waking another thread; completions from the blocking
/// pool arrive through `rx`.
struct ConnIo {
    rd: tokio::net::tcp::OwnedReadHalf,
    w: BufWriter<OwnedWriteHalf>,
    rx: mpsc::UnboundedReceiver<Out>,
    digests: Digests,
    buf: BytesMut,
    dec: Decoder,
}

impl ConnIo {
    /// Write `first` and everything else queued, then flush.
    async fn drain(&mut self, first: Option<Out>) -> std::io::Result<bool> {
        let mut item = first.or_else(|| self.rx.try_recv().ok());
        if item.is_none() {
            return Ok(true);
        }
        while let Some(o) = item.take() {
            match o {
                Out::Pdu(p) => write_pdu(&mut self.w, &p, self.digests).await?,
                Out::Extent { pdu, extent, at, len } => {
                    self.w.write_all(&pdu.head(self.digests, len)).await?;
                    self.w.flush().await?;
                    send_extent(self.w.get_ref().as_ref(), &extent, at, len).await?;
                    let pad = bw_iscsi::pdu::pad4(len);
                    if pad > 0 {
                        self.w.write_all(&[0u8; 4][..pad]).await?;
                    }
                }
            }
            item = self.rx.try_recv().ok();
        }
        self.w.flush().await?;
        Ok(true)
    }
}

/// Send bytes `at..at + len` of `x` with `sendfile` on the (nonblocking)
/// socket, waiting for room as needed. A failure after the header went out
/// cannot be reported per command: it ends the connection.
async fn send_extent(sock: &TcpStream, x: &ReadExtent, at: usize, len: usize) -> std::io::Result<()> {
    let mut off = (x.offset + at as u64) as libc::off_t;
    let mut left = len;
    while left > 0 {
        sock.writable().await?;
        let r = sock.try_io(tokio::io::Interest::WRITABLE, || {
            // SAFETY: both descriptors are open for the duration of the call.
            let n = unsafe { libc::sendfile(sock.as_raw_fd(), x.fd().as_raw_fd(), &mut off, left) };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match r {
            Ok(0) => {
                x.note_error();
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "backend ended inside a read extent"));
            }
            Ok(n) => left -= n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                if matches!(e.raw_os_error(), Some(libc::EIO | libc::ENODATA | libc::EFAULT)) {
                    x.note_error();
                }
                return Err(e);
            }
        }
    }
    Ok(())
}

async fn full_feature(conn: &Arc<Conn>, io: &mut ConnIo, shutdown: &mut Shutdown, reinstated: &Notify) -> anyhow::Result<()> {
    let mut nop = tokio::time::interval(NOP_INTERVAL);
    nop.tick().await;
    let mut idle_ticks = 0u32;
    let mut incoming: Option<Out> = None;
    loop {
        // Handle every PDU already buffered, then send what that produced.
        let mut open = true;
        let mut handled = 0usize;
        while open {
            let pdu = match io.dec.decode(&mut io.buf) {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(e) => anyhow::bail!("bad PDU: {e}"),
            };
            idle_ticks = 0;
            let mut out = Vec::new();
            let r = {
                let mut s = conn.lock();
                let bhs = pdu.bhs;
                let r = s.on_pdu(pdu, &mut out);
                if r.is_err() {
                    out.push(Action::Send(s.reject(&bhs, bw_iscsi::msg::reject_reason::PROTOCOL_ERROR)));
                }
                r
            };
            open = dispatch(conn, out);
            if let Err(e) = r {
                let _ = io.drain(None).await;
                anyhow::bail!("{e}");
            }
            handled += 1;
            if handled % flush_every() == 0 && open {
                // Answer part of a long burst now: the initiator works on
                // these while we run the rest.
                io.drain(incoming.take()).await?;
            }
        }
        if !io.drain(incoming.take()).await? || !open {
            // Whatever was queued before the close has been written.
            return Ok(());
        }
        // A large PDU half in the buffer: make room for all of it and read
        // no further than its end, so the next PDU starts a read of its own
        // and growing the buffer never copies a partial large PDU (its data
        // is handed on without copying and may pin the old buffer).
        let limit = io.dec.frame_len(&io.buf).filter(|&t| t > io.buf.len() && t >= LARGE_PDU).map(|t| t - io.buf.len());
        match limit {
            Some(n) => io.buf.reserve(n),
            // Room for a whole PDU of the largest size after what is there.
            None if io.buf.capacity() - io.buf.len() < 64 * 1024 => io.buf.reserve(io.dec.max_data + 64 * 1024),
            None => {}
        }
        tokio::select! {
            r = read_some(&mut io.rd, &mut io.buf, limit) => {
                if r? == 0 {
                    return Ok(());
                }
            }
            o = io.rx.recv() => incoming = o,
            _ = reinstated.notified() => anyhow::bail!("session reinstated by a new login"),
            _ = nop.tick() => {
                idle_ticks += 1;
                let mut s = conn.lock();
                if s.ping_outstanding() && idle_ticks >= 2 {
                    anyhow::bail!("initiator did not answer NOP-In");
                }
                if let Some(p) = s.ping() {
                    let _ = conn.tx.send(Out::Pdu(p));
                }
            }
            _ = shutdown.wait() => {
                let p = conn.lock().async_drop_all(2);
                let _ = io.drain(Some(Out::Pdu(p))).await;
                return Ok(());
            }
        }
    }
}
