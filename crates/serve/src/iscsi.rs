//! iSCSI front-end: TCP listeners (the shared [`crate::accept`] loop), login
//! via `bw_iscsi::target_login`, full feature phase via
//! `bw_iscsi::target_session`, SCSI commands executed by `bw_scsi`.
//!
//! One concurrency model, the NVMe/TCP front-end's: the connection's task
//! owns its session state outright and is the only one to touch it.
//! Commands that never wait for a device, and small READs and WRITEs, run
//! on that task; READs and WRITEs of volumes that complete requests on
//! their own threads (rbd) are submitted from the task, and the backend's
//! completion sends the result back through a channel; the rest run on the
//! blocking pool and their results come back through the same channel,
//! where the task turns them into PDUs. Large READs
//! are sent zero-copy (`sendfile` of a `bw_scsi::ReadExtent`); Data-Out
//! reaches the backend in the pieces it arrived in.

use crate::accept::{Accepted, Acceptor, Threading};
use crate::config::{IscsiConfig, IscsiTarget};
use crate::framing::{FrameReader, Framing, Growth};
use crate::limits::{Admission, Limits, SessionKind};
use crate::tuning::Tuning;
use bw_net::tcp::CongestionPlan;
use crate::{Running, Shutdown, Volumes};
use anyhow::Context;
use bw_iscsi::msg::Residual;
use bw_iscsi::negotiate::{LocalLimits, SessionType};
use bw_iscsi::pdu::{write_pdu, Decoder, Digests, Pdu, BHS_LEN};
use bw_iscsi::target_login::{LoginConfig, LoginStep, Secret, TargetInfo, TargetLogin};
use bw_iscsi::target_session::{
    write_outcome, Action, Exec, SessionConfig, TargetSession, DATA_OUT_BUDGET,
};
use bw_scsi::commands::Execution;
use bw_scsi::{AluaState, IoPlan, LunConfig, PortGroup, ReadExtent, ReadPlan, ScsiTarget};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};

/// Commands one session may have outstanding (MaxCmdSN window).
pub const QUEUE_DEPTH: u32 = 128;
/// Idle time after which we ping the initiator with a NOP-In; a second
/// interval without an answer ends the connection.
const NOP_INTERVAL: Duration = Duration::from_secs(15);
/// Largest data segment accepted during login.
const LOGIN_MAX_DATA: usize = 64 * 1024;

/// The per-connection knobs of `[tuning]`.
#[derive(Debug, Clone, Copy)]
struct Knobs {
    inline_max: usize,
    zero_copy_min: usize,
    flush_every: usize,
}

struct Target {
    scsi: Arc<ScsiTarget>,
}

/// (initiator name, ISID, target index): what identifies an iSCSI session.
type SessionKey = (String, [u8; 6], usize);

struct Ctx {
    login: LoginConfig,
    targets: Vec<Target>,
    listen: Vec<SocketAddr>,
    next_tsih: AtomicU16,
    next_nexus: AtomicU64,
    /// Session and per-address limits, login timeout.
    admission: Arc<Admission>,
    knobs: Knobs,
    /// Live normal sessions by (initiator name, ISID, target): a new login
    /// with the same key reinstates the session, ending the old connection.
    sessions: Mutex<HashMap<SessionKey, (u64, Arc<Notify>)>>,
}

fn secret(c: &Option<crate::config::Credentials>) -> Option<Secret> {
    c.as_ref().map(|c| Secret::new(c.user.clone(), c.secret.expose()))
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
        let vol = volumes
            .get(&l.volume)
            .with_context(|| format!("target {}: no volume {}", t.iqn, l.volume))?;
        let mut lc = LunConfig::for_volume(&l.volume, &t.iqn, l.lun);
        lc.read_only = l.readonly || vol.read_only();
        lc.port_group = PortGroup {
            id: t.target_port_group,
            state: alua_state(t.alua_state),
            relative_port: t.relative_target_port.unwrap_or(t.target_port_group.max(1)),
        };
        luns.push((l.lun, vol.clone(), lc));
    }
    Ok(Target {
        scsi: Arc::new(ScsiTarget::new(luns)),
    })
}

pub async fn start(
    cfg: &IscsiConfig,
    limits: &Limits,
    tuning: &Tuning,
    volumes: &Volumes,
    shutdown: Shutdown,
) -> anyhow::Result<Running> {
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
    let admission = Admission::new(limits.clone());
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
        admission: admission.clone(),
        knobs: Knobs {
            inline_max: tuning.iscsi_inline_max,
            zero_copy_min: tuning.iscsi_zero_copy_min,
            flush_every: tuning.iscsi_flush_every(),
        },
        sessions: Mutex::new(HashMap::new()),
    });
    let mut listeners = Vec::new();
    let congestion = CongestionPlan::new(tuning.tcp_congestion.clone());
    for a in &cfg.listen {
        let l = crate::accept::listen(*a, &congestion).with_context(|| format!("iSCSI listen on {a}"))?;
        log::info!("iSCSI listening on {a}");
        listeners.push(l);
    }
    let threading = if tuning.iscsi_connection_threads {
        Threading::ThreadPerConnection
    } else {
        Threading::SharedRuntime
    };
    let acceptor = Acceptor {
        name: "iSCSI",
        thread_name: "iscsi-conn",
        admission,
        threading,
        congestion,
    };
    let accepting = acceptor.run(listeners, shutdown, move |a| connection(a, ctx.clone()));
    Ok(tokio::spawn(async move {
        let _ = accepting.await;
        Ok(())
    }))
}

/// iSCSI framing for the shared reader: the BHS says the PDU's length.
impl Framing for Decoder {
    fn header_len(&self) -> usize {
        BHS_LEN
    }
    fn pdu_len(&self, header: &[u8]) -> usize {
        self.frame_len(header).unwrap_or(BHS_LEN)
    }
    fn max_pdu(&self) -> usize {
        // BHS, the longest AHS (255 words), digests, data and its padding.
        BHS_LEN + 255 * 4 + 8 + self.max_data + 3
    }
    fn growth(&self) -> Growth {
        // Room for a whole PDU of the largest size whenever less than
        // 64 KiB is left; PDUs from 64 KiB on are read to their end only.
        Growth {
            low_water: 64 * 1024,
            chunk: self.max_data + 64 * 1024,
            large_pdu: 64 * 1024,
        }
    }
}

/// Portal strings for SendTargets; wildcard listeners show the address
/// this connection arrived on.
fn portals(ctx: &Ctx, local: SocketAddr, tpgt: u16) -> Vec<String> {
    ctx.listen
        .iter()
        .map(|a| {
            let ip = if a.ip().is_unspecified() {
                local.ip()
            } else {
                a.ip()
            };
            let sa = SocketAddr::new(ip, a.port());
            format!("{sa},{tpgt}")
        })
        .collect()
}

/// One connection, from accept to close; the ticket in `a` holds its place
/// in the admission limits until it ends.
async fn connection(a: Accepted, ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Accepted {
        stream,
        local,
        mut ticket,
        mut shutdown,
        ..
    } = a;
    let local = local.context("no local address")?;
    let (mut rd, mut wr) = stream.into_split();
    let mut reader = FrameReader::with_capacity(256 * 1024);
    let mut dec = Decoder::new(LOGIN_MAX_DATA);
    // Login phase: strictly request/response.
    let tsih = loop {
        let t = ctx.next_tsih.fetch_add(1, Ordering::Relaxed);
        if t != 0 {
            break t;
        }
    };
    let entropy = bw_iscsi::chap::ChapEntropy::from_os()
        .map_err(|e| anyhow::anyhow!("no random numbers from the OS for a CHAP challenge: {e}"))?;
    let mut login = TargetLogin::new(&ctx.login, tsih, entropy);
    // The whole login, not each PDU, has to fit in the timeout: a peer
    // dripping a byte at a time must not hold its thread for ever.
    let login_timeout = ctx.admission.limits().login_timeout();
    let deadline = tokio::time::Instant::now() + login_timeout;
    loop {
        let pdu =
            match tokio::time::timeout_at(deadline, reader.next(&mut rd, &dec, |b| dec.decode(b)))
                .await
            {
                Ok(r) => r?,
                Err(_) => {
                    anyhow::bail!("no complete login within {login_timeout:?} (login_timeout_s)")
                }
            };
        let Some(pdu) = pdu else { return Ok(()) };
        let (mut resp, step) = login.step(&pdu);
        if let (LoginStep::Complete, Some(r)) = (&step, login.result()) {
            // A place in the session pools only once logged in, so that
            // clients without credentials cannot fill them.
            let kind = match r.session_type {
                SessionType::Discovery => SessionKind::Discovery,
                _ => SessionKind::Normal,
            };
            if !ticket.begin_session(kind) {
                resp = login.refuse(&pdu, bw_iscsi::msg::login_status::OUT_OF_RESOURCES);
                write_pdu(&mut wr, &resp, Digests::default()).await?;
                log::warn!("iSCSI login refused: the {kind:?} session pool is full ({})", kind.knob());
                return Ok(());
            }
        }
        write_pdu(&mut wr, &resp, Digests::default()).await?;
        match step {
            LoginStep::Continue => {}
            LoginStep::Complete => break,
            LoginStep::Failed(s) => {
                wr.flush().await?;
                log::info!(
                    "iSCSI login from {} refused with status {s:#06x}",
                    login.initiator_name().escape_debug()
                );
                return Ok(());
            }
        }
    }
    let Some(res) = login.result().cloned() else {
        anyhow::bail!("login completed without a result")
    };
    drop(login);
    let discovery_idle = (res.session_type == SessionType::Discovery).then(|| ctx.admission.limits().discovery_idle_timeout());
    if discovery_idle.is_none() {
        let stream = ticket.own_thread(rd.reunite(wr)?).await?;
        (rd, wr) = stream.into_split();
    }
    let digests = Digests {
        header: res.params.header_digest,
        data: res.params.data_digest,
    };
    dec.digests = digests;
    dec.max_data = res.params.max_recv_data_segment_length as usize;
    let visible: Vec<(String, Vec<String>)> = ctx
        .login
        .targets
        .iter()
        .filter(|t| {
            t.allowed_initiators.is_empty()
                || t.allowed_initiators.contains(&res.initiator_name)
        })
        .map(|t| (t.name.clone(), portals(&ctx, local, t.portal_group_tag)))
        .collect();
    let current = res.target.map(|i| ctx.login.targets[i].name.clone());
    log::info!(
        "iSCSI {} session from {} to {:?} (digests {:?})",
        if res.session_type == SessionType::Discovery {
            "discovery"
        } else {
            "normal"
        },
        res.initiator_name.escape_debug(),
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
        data_out_budget: DATA_OUT_BUDGET,
    });
    let scsi = res.target.map(|i| ctx.targets[i].scsi.clone());
    let nexus = ctx.next_nexus.fetch_add(1, Ordering::Relaxed);
    if let Some(s) = &scsi {
        let isid: String = res.isid.iter().map(|b| format!("{b:02x}")).collect();
        s.set_initiator_name(nexus, &format!("{},i,0x{isid}", res.initiator_name));
    }
    let ended = Arc::new(Notify::new());
    let key = res
        .target
        .map(|t| (res.initiator_name.clone(), res.isid, t));
    if let Some(k) = &key {
        let old = ctx
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(k.clone(), (nexus, ended.clone()));
        if let Some((_, old)) = old {
            log::info!(
                "iSCSI session of {} reinstated: ending the old connection",
                res.initiator_name.escape_debug()
            );
            old.notify_one();
        }
    }
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let mut conn = Connection {
        session,
        scsi: scsi.clone(),
        nexus,
        // Zero-copy data-in cannot carry a data digest (it would need the bytes).
        zero_copy: !digests.data,
        knobs: ctx.knobs,
        out: Vec::new(),
        done_tx,
        discovery_idle,
    };
    let mut io = ConnIo {
        rd,
        w: BufWriter::with_capacity(256 * 1024, wr),
        done_rx,
        digests,
        reader,
        dec,
    };
    let r = conn.full_feature(&mut io, &mut shutdown, &ended).await;
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

/// What the connection writes, in order.
enum Out {
    Pdu(Pdu),
    /// A Data-In PDU whose data segment is bytes `at..at + len` of a read
    /// extent, sent with `sendfile` from the backend.
    Extent {
        pdu: Pdu,
        extent: Arc<ReadExtent>,
        at: usize,
        len: usize,
    },
}

/// A command finished on the blocking pool.
struct Done {
    itt: u32,
    id: u64,
    status: u8,
    sense: Vec<u8>,
    data_in: Vec<u8>,
    residual: Residual,
}

impl Done {
    fn new(e: &Exec, o: bw_scsi::ScsiOutcome, data_in: Vec<u8>, residual: Residual) -> Done {
        Done { itt: e.itt, id: e.id, status: o.status, sense: o.sense, data_in, residual }
    }
}

/// A command's residual: what the CDB transfers (`wanted`, for commands
/// with data-out) against the initiator's Expected Data Transfer Length.
fn data_out_residual(wanted: Option<usize>, edtl: u32) -> Residual {
    wanted.map_or(Residual::None, |w| write_outcome(w, edtl as usize).0)
}

/// One connection's state in full feature phase, owned by its task.
struct Connection {
    session: TargetSession,
    scsi: Option<Arc<ScsiTarget>>,
    nexus: u64,
    /// Large READs go out as read extents (no data digest on this connection).
    zero_copy: bool,
    knobs: Knobs,
    /// PDUs to write, in the order the session produced them.
    out: Vec<Out>,
    /// Completions from the blocking pool come back through here.
    done_tx: mpsc::UnboundedSender<Done>,
    /// A discovery session ends after this long without a request.
    discovery_idle: Option<Duration>,
}

/// The socket side of one connection.
struct ConnIo {
    rd: OwnedReadHalf,
    w: BufWriter<OwnedWriteHalf>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    digests: Digests,
    reader: FrameReader,
    dec: Decoder,
}

fn lun_number(lun_field: u64) -> u64 {
    bw_scsi::decode_lun(lun_field.to_be_bytes()).unwrap_or(u64::MAX)
}

/// Run one SCSI command; the result as the session wants it.
fn run_command(scsi: &ScsiTarget, nexus: u64, e: Exec) -> Done {
    let data_out: Vec<&[u8]> = e.data_out.iter().map(|b| &b[..]).collect();
    let mut data_in = Vec::new();
    let (o, wanted) = scsi.execute_transfer(
        nexus,
        lun_number(e.lun),
        &e.cdb,
        &data_out,
        e.edtl as usize,
        &mut data_in,
    );
    Done::new(&e, o, data_in, data_out_residual(wanted, e.edtl))
}

impl Connection {
    /// Queue the PDUs a session call produced; `extent` backs any
    /// [`Action::SendExtent`]. `false` once the session asks to close.
    fn act(&mut self, actions: Vec<Action>, extent: Option<&Arc<ReadExtent>>) -> bool {
        let mut keep_going = true;
        for a in actions {
            match a {
                Action::Send(p) => self.out.push(Out::Pdu(p)),
                Action::SendExtent { pdu, at, len } => {
                    if let Some(x) = extent {
                        self.out.push(Out::Extent {
                            pdu,
                            extent: x.clone(),
                            at,
                            len,
                        });
                    }
                }
                Action::Close => keep_going = false,
                Action::Execute(e) => self.execute(e),
                Action::LunReset { itt, lun } => {
                    let ok = self
                        .scsi
                        .as_ref()
                        .is_some_and(|s| s.lun_reset(lun_number(lun)));
                    let resp = if ok {
                        bw_iscsi::msg::tmf_response::FUNCTION_COMPLETE
                    } else {
                        bw_iscsi::msg::tmf_response::LUN_DOES_NOT_EXIST
                    };
                    let p = self.session.finish_tmf(itt, resp);
                    self.out.push(Out::Pdu(p));
                }
                Action::TargetReset { itt, cold } => {
                    if let Some(s) = &self.scsi {
                        s.target_reset();
                    }
                    let p = self
                        .session
                        .finish_tmf(itt, bw_iscsi::msg::tmf_response::FUNCTION_COMPLETE);
                    self.out.push(Out::Pdu(p));
                    if cold {
                        keep_going = false;
                    }
                }
            }
        }
        keep_going
    }

    /// Run a command here or on the blocking pool, as its row in the SCSI
    /// command table says.
    fn execute(&mut self, e: Exec) {
        let Some(scsi) = self.scsi.clone() else {
            return;
        };
        if self.try_zero_copy_read(&scsi, &e) || self.try_submit(&scsi, &e) {
            return;
        }
        let inline = match bw_scsi::execution(&e.cdb) {
            Execution::Inline => true,
            // A remote volume (rbd) waits a network round trip on every
            // read and write: never on the connection's thread, so many run
            // at once.
            Execution::InlineIfSmall => {
                e.edtl as usize <= self.knobs.inline_max
                    && !scsi.backend_info(lun_number(e.lun)).is_some_and(|i| i.remote)
            }
            Execution::Pool => false,
        };
        if inline {
            let d = run_command(&scsi, self.nexus, e);
            self.finished(d);
        } else {
            let (tx, nexus) = (self.done_tx.clone(), self.nexus);
            tokio::task::spawn_blocking(move || {
                let _ = tx.send(run_command(&scsi, nexus, e));
            });
        }
    }

    /// Start a READ or WRITE on a volume that completes requests on its
    /// own threads (rbd): the backend's completion sends the result to
    /// this connection's channel, so no thread waits for it. `false`: run
    /// it the ordinary way.
    fn try_submit(&mut self, scsi: &ScsiTarget, e: &Exec) -> bool {
        let lun = lun_number(e.lun);
        if !scsi.backend_info(lun).is_some_and(|i| i.async_submit) {
            return false;
        }
        let residual = || data_out_residual(scsi.data_out_len(lun, &e.cdb), e.edtl);
        let (volume, request) = match scsi.plan_io(self.nexus, lun, &e.cdb, &e.data_out) {
            IoPlan::Buffered => return false,
            IoPlan::Done(o) => {
                self.finished(Done::new(e, o, Vec::new(), residual()));
                return true;
            }
            IoPlan::Submit { volume, request } => (volume, request),
        };
        let (tx, write) = (self.done_tx.clone(), request.is_write());
        // The command's identity and residual now; its status and data when
        // the request ends.
        let done = Done::new(e, bw_scsi::ScsiOutcome::GOOD, Vec::new(), residual());
        volume.submit(request, move |req, r| {
            let o = bw_scsi::io_outcome(&r, write);
            let data_in = if o.is_good() { req.into_buf() } else { Vec::new() };
            let _ = tx.send(Done { status: o.status, sense: o.sense, data_in, ..done });
        });
        true
    }

    /// A command's result: its Data-In and status PDUs.
    fn finished(&mut self, d: Done) {
        let mut actions = Vec::new();
        self.session.complete(
            d.itt,
            d.id,
            d.status,
            &d.sense,
            d.data_in,
            d.residual,
            &mut actions,
        );
        self.act(actions, None);
    }

    /// Try to answer a large READ zero-copy. `false`: run it the ordinary way.
    fn try_zero_copy_read(&mut self, scsi: &ScsiTarget, e: &Exec) -> bool {
        if !self.zero_copy || !e.read || e.write || (e.edtl as usize) < self.knobs.zero_copy_min {
            return false;
        }
        let mut actions = Vec::new();
        match scsi.plan_read(self.nexus, lun_number(e.lun), &e.cdb) {
            ReadPlan::Buffered => return false,
            ReadPlan::Extent(x) => {
                let x = Arc::new(x);
                self.session
                    .complete_extent(e.itt, e.id, x.len, &mut actions);
                self.act(actions, Some(&x));
            }
            ReadPlan::Done(o) => {
                self.session.complete(
                    e.itt,
                    e.id,
                    o.status,
                    &o.sense,
                    Vec::new(),
                    Residual::None,
                    &mut actions,
                );
                self.act(actions, None);
            }
        }
        true
    }

    async fn full_feature(
        &mut self,
        io: &mut ConnIo,
        shutdown: &mut Shutdown,
        reinstated: &Notify,
    ) -> anyhow::Result<()> {
        let mut nop = tokio::time::interval(NOP_INTERVAL);
        nop.tick().await;
        let mut idle_ticks = 0u32;
        let mut last_request = tokio::time::Instant::now();
        loop {
            // Handle every PDU already buffered, then send what that produced.
            let mut open = true;
            let mut handled = 0usize;
            while open {
                let pdu = match io.dec.decode(io.reader.buf()) {
                    Ok(Some(p)) => p,
                    Ok(None) => break,
                    Err(e) => anyhow::bail!("bad PDU: {e}"),
                };
                idle_ticks = 0;
                let bhs = pdu.bhs;
                // A NOP-Out may answer our own NOP-In: no request.
                if bhs.0[0] & 0x3F != bw_iscsi::pdu::Opcode::NopOut as u8 {
                    last_request = tokio::time::Instant::now();
                }
                let mut actions = Vec::new();
                let r = self.session.on_pdu(pdu, &mut actions);
                if r.is_err() {
                    actions.push(Action::Send(
                        self.session
                            .reject(&bhs, bw_iscsi::msg::reject_reason::PROTOCOL_ERROR),
                    ));
                }
                open = self.act(actions, None);
                if let Err(e) = r {
                    let _ = io.drain(&mut self.out).await;
                    anyhow::bail!("{e}");
                }
                handled += 1;
                if handled.is_multiple_of(self.knobs.flush_every) && open {
                    // Answer part of a long burst now: the initiator works on
                    // these while we run the rest.
                    io.drain(&mut self.out).await?;
                }
            }
            while let Ok(d) = io.done_rx.try_recv() {
                self.finished(d);
            }
            io.drain(&mut self.out).await?;
            if !open {
                // Whatever was queued before the close has been written.
                return Ok(());
            }
            tokio::select! {
                r = io.reader.fill(&mut io.rd, &io.dec) => {
                    if r? == 0 {
                        return Ok(());
                    }
                }
                Some(d) = io.done_rx.recv() => self.finished(d),
                _ = reinstated.notified() => anyhow::bail!("session reinstated by a new login"),
                _ = tokio::time::sleep_until(last_request + self.discovery_idle.unwrap_or_default()), if self.discovery_idle.is_some() => {
                    anyhow::bail!("discovery session without a request for {:?} (discovery_idle_timeout_s)", self.discovery_idle.unwrap_or_default())
                }
                _ = nop.tick() => {
                    idle_ticks += 1;
                    if self.session.ping_outstanding() && idle_ticks >= 2 {
                        anyhow::bail!("initiator did not answer NOP-In");
                    }
                    if let Some(p) = self.session.ping() {
                        self.out.push(Out::Pdu(p));
                    }
                }
                _ = shutdown.wait() => {
                    let p = self.session.async_drop_all(2);
                    self.out.push(Out::Pdu(p));
                    let _ = io.drain(&mut self.out).await;
                    return Ok(());
                }
            }
        }
    }
}

impl ConnIo {
    /// Write everything queued, then flush.
    async fn drain(&mut self, out: &mut Vec<Out>) -> std::io::Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        for o in out.drain(..) {
            match o {
                Out::Pdu(p) => write_pdu(&mut self.w, &p, self.digests).await?,
                Out::Extent {
                    pdu,
                    extent,
                    at,
                    len,
                } => {
                    self.w.write_all(&pdu.head(self.digests, len)).await?;
                    self.w.flush().await?;
                    send_extent(self.w.get_ref().as_ref(), &extent, at, len).await?;
                    let pad = bw_iscsi::pdu::pad4(len);
                    if pad > 0 {
                        self.w.write_all(&[0u8; 4][..pad]).await?;
                    }
                }
            }
        }
        self.w.flush().await
    }
}

/// Send bytes `at..at + len` of `x` with `sendfile` on the (nonblocking)
/// socket, waiting for room as needed. A failure after the header went out
/// cannot be reported per command: it ends the connection.
async fn send_extent(
    sock: &TcpStream,
    x: &ReadExtent,
    at: usize,
    len: usize,
) -> std::io::Result<()> {
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
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "backend ended inside a read extent",
                ));
            }
            Ok(n) => left -= n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EIO | libc::ENODATA | libc::EFAULT)
                ) {
                    x.note_error();
                }
                return Err(e);
            }
        }
    }
    Ok(())
}
