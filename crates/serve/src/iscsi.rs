//! iSCSI front-end: TCP listeners (the shared [`crate::accept`] loop), login
//! via `bw_iscsi::target_login`, full feature phase via
//! `bw_iscsi::target_session`, SCSI commands executed by `bw_scsi`.
//!
//! One concurrency model and one connection driver ([`crate::driver`]),
//! the NVMe/TCP front-end's: the connection's task owns its session state
//! outright and is the only one to touch it.
//! Commands that never wait for a device, and small READs and WRITEs, run
//! on that task; READs and WRITEs of volumes that complete requests on
//! their own threads (rbd) are submitted from the task, and the backend's
//! completion sends the result back through a channel; the rest run on the
//! blocking pool and their results come back through the same channel,
//! where the task turns them into PDUs. Where each command runs is
//! [`crate::dispatch`]'s rule, shared with NVMe/TCP; replies go out
//! through the shared [`Outbox`]: small READs are read straight into it
//! behind their Data-In headers, large ones are sent with `sendfile`.
//! Data-Out reaches the backend in the pieces it arrived in.

use crate::accept::{Accepted, Acceptor, Threading};
use crate::config::{IscsiConfig, IscsiTarget, ServeConfig};
use crate::dispatch::{self, Place, Work};
use crate::driver::{self, Exit, Knobs, Step};
use crate::metrics::{self, IoTimer, Meter, Op, Proto};
use crate::framing::{FrameReader, Framing, Growth};
use crate::frontend::{failed, fixed_at_start, AccessState, Frontend};
use crate::limits::{Admission, Limits, SessionKind, Ticket};
use crate::outbox::{Outbox, Payload};
use crate::refused::Refused;
use crate::tuning::Tuning;
use crate::{Running, Shutdown, Volumes};
use anyhow::Context;
use bw_block::Volume;
use bw_iscsi::msg::Residual;
use bw_iscsi::negotiate::{LocalLimits, SessionType};
use bw_iscsi::pdu::{Decoder, Digests, Pdu, BHS_LEN};
use bw_iscsi::target_login::{LoginConfig, LoginResult, LoginStep, LoginTimedOut, Secret, TargetInfo, TargetLogin};
use bw_iscsi::target_session::{
    write_outcome, Action, Exec, SessionConfig, TargetSession, Timers, DATA_OUT_BUDGET,
};
use bw_net::tcp::CongestionPlan;
use bw_scsi::commands::Execution;
use bw_scsi::{AluaState, IoPlan, LunCache, LunConfig, Plan, PortGroup, ReadPlan, ScsiTarget};
use crate::session::{SessionInfo, SessionStats};
use arc_swap::ArcSwap;
use bytes::BytesMut;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};

/// Commands one session may have outstanding (MaxCmdSN window).
pub const QUEUE_DEPTH: u32 = 128;
/// Idle time after which the session pings the initiator with a NOP-In; a
/// second interval without an answer ends the connection.
const NOP_INTERVAL: Duration = Duration::from_secs(15);
/// Largest data segment accepted during login.
const LOGIN_MAX_DATA: usize = 64 * 1024;

/// (initiator name, ISID, target name): what identifies an iSCSI session.
type SessionKey = (String, [u8; 6], String);

/// The targets as logins see them: names, ACLs and credentials, and the
/// SCSI side of each (same order). Live changes publish a new one; a
/// session keeps the `ScsiTarget` it logged in to, whose LUN table
/// changes in place.
struct Published {
    login: LoginConfig,
    targets: Vec<Arc<ScsiTarget>>,
}

/// Tells one session's connection to end, and why.
struct Ending {
    notify: Notify,
    why: Mutex<&'static str>,
}

impl Ending {
    fn new() -> Arc<Ending> {
        Arc::new(Ending { notify: Notify::new(), why: Mutex::new("") })
    }
    fn end(&self, why: &'static str) {
        *self.why.lock().unwrap_or_else(|p| p.into_inner()) = why;
        self.notify.notify_one();
    }
    async fn wait(&self) -> &'static str {
        self.notify.notified().await;
        *self.why.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A live normal session, for reinstatement, `session_list`,
/// `session_disconnect` and ACL changes.
struct SessionEntry {
    nexus: u64,
    ending: Arc<Ending>,
    peer: SocketAddr,
    stats: Arc<SessionStats>,
}

struct Ctx {
    /// Loaded once per login (a lock-free load), never per command.
    published: ArcSwap<Published>,
    listen: Vec<SocketAddr>,
    next_tsih: AtomicU16,
    next_nexus: AtomicU64,
    /// Session and per-address limits, login timeout.
    admission: Arc<Admission>,
    knobs: Knobs,
    /// Live normal sessions by (initiator name, ISID, target): a new login
    /// with the same key reinstates the session, ending the old connection.
    sessions: Mutex<HashMap<SessionKey, SessionEntry>>,
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

/// The volume and SCSI identity of each LUN of `t`.
fn luns(t: &IscsiTarget, volumes: &Volumes) -> anyhow::Result<Vec<(u64, Volume, LunConfig)>> {
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
    Ok(luns)
}

fn target_info(t: &IscsiTarget) -> TargetInfo {
    TargetInfo {
        name: t.iqn.clone(),
        alias: None,
        portal_group_tag: t.portal_group_tag,
        allowed_initiators: t.allowed_initiators.clone(),
        chap: secret(&t.chap),
        mutual_chap: secret(&t.mutual_chap),
    }
}

fn login_config(cfg: &IscsiConfig) -> LoginConfig {
    LoginConfig {
        targets: cfg.targets.iter().map(target_info).collect(),
        limits: LocalLimits::default(),
        queue_depth: QUEUE_DEPTH,
        discovery_chap: secret(&cfg.discovery_chap),
        discovery_mutual_chap: secret(&cfg.discovery_mutual_chap),
    }
}

/// The running iSCSI front-end, for live changes and `session_list`.
#[derive(Clone)]
pub struct Handle(Arc<Ctx>);

impl Handle {
    /// Make the targets those of `cfg` while sessions run: a target kept
    /// by name keeps its `ScsiTarget` and maps and unmaps LUNs in place
    /// (REPORTED LUNS DATA HAS CHANGED for its sessions), a LUN whose
    /// volume is in `resized` raises CAPACITY DATA HAS CHANGED, and the
    /// sessions of a target removed, or of an initiator its ACL no longer
    /// allows, end. Returns what changed, for the log.
    pub fn reconcile(&self, cfg: &IscsiConfig, volumes: &Volumes, resized: &HashSet<String>) -> anyhow::Result<Vec<String>> {
        let ctx = &self.0;
        let old = ctx.published.load_full();
        let mut log = Vec::new();
        // Everything that can fail first: then the change is all or nothing.
        let mut wanted = Vec::new();
        for t in &cfg.targets {
            wanted.push((t, luns(t, volumes)?));
        }
        let mut targets = Vec::new();
        for (t, luns) in wanted {
            let kept = old.login.targets.iter().position(|i| i.name == t.iqn).map(|i| old.targets[i].clone());
            let Some(scsi) = kept else {
                log.push(format!("iscsi {}: target added ({} LUNs)", t.iqn, luns.len()));
                targets.push(Arc::new(ScsiTarget::new(luns)));
                continue;
            };
            // A LUN kept has the same volume and settings (read-only,
            // ALUA group); one whose settings changed is mapped again.
            let have = scsi.luns();
            let same = |n: u64, v: &Volume, lc: &LunConfig| scsi.volume(n).is_some_and(|o| o.name() == v.name()) && scsi.lun_config(n).as_ref() == Some(lc);
            for n in have.iter().filter(|n| !luns.iter().any(|(l, v, lc)| l == *n && same(**n, v, lc))) {
                scsi.remove_lun(*n);
                log.push(format!("iscsi {}: LUN {n} removed", t.iqn));
            }
            for (n, vol, lc) in luns {
                if scsi.volume(n).is_none() {
                    let name = vol.name().to_string();
                    scsi.add_lun(n, vol, lc);
                    log.push(format!("iscsi {}: LUN {n} added (volume {name})", t.iqn));
                } else if resized.contains(vol.name()) {
                    scsi.capacity_changed(n);
                    log.push(format!("iscsi {}: LUN {n} capacity changed", t.iqn));
                }
            }
            targets.push(scsi);
        }
        let login = login_config(cfg);
        for t in &old.login.targets {
            if !login.targets.iter().any(|n| n.name == t.name) {
                log.push(format!("iscsi {}: target removed", t.name));
            }
        }
        ctx.published.store(Arc::new(Published { login, targets }));
        let published = ctx.published.load();
        let sessions = ctx.sessions.lock().unwrap_or_else(|p| p.into_inner());
        for ((initiator, _, iqn), e) in sessions.iter() {
            let why = match published.login.targets.iter().find(|t| &t.name == iqn) {
                None => "its target was removed",
                Some(t) if !t.allowed_initiators.is_empty() && !t.allowed_initiators.contains(initiator) => "its initiator is no longer allowed",
                Some(_) => continue,
            };
            log.push(format!("iscsi {iqn}: session of {initiator} ends: {why}"));
            e.ending.end(why);
        }
        Ok(log)
    }

    /// Every normal session, for `session_list`.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let sessions = self.0.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<SessionInfo> = sessions
            .iter()
            .map(|((initiator, _, iqn), e)| SessionInfo::new(format!("{NAME}:{}", e.nexus), NAME, initiator, e.peer.to_string(), iqn.clone(), &e.stats))
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// `tpg_set`: the asymmetric access state of target `iqn`'s LUNs (its
    /// port group `group`, if given, must be theirs), at run time; its
    /// sessions get ASYMMETRIC ACCESS STATE CHANGED. Ok(false) if nothing
    /// changed.
    pub fn tpg_set(&self, iqn: &str, group: Option<u16>, state: AluaState) -> Result<bool, Refused> {
        let p = self.0.published.load();
        let i = p.login.targets.iter().position(|t| t.name == iqn).ok_or_else(|| Refused::NotFound(format!("no iSCSI target {iqn}")))?;
        let t = &p.targets[i];
        if let Some(g) = group {
            let ids = t.port_group_ids();
            if !ids.contains(&g) {
                return Err(Refused::Invalid(format!("target {iqn} is in target port group {ids:?}, not {g}")));
            }
        }
        Ok(t.set_alua_state(Some(state)))
    }

    /// Every target's LUNs unavailable (`drain`); the IQNs whose state changed.
    pub fn drain(&self) -> Vec<String> {
        let p = self.0.published.load();
        p.login.targets.iter().zip(&p.targets).filter(|(_, t)| t.set_alua_state(Some(AluaState::Unavailable))).map(|(i, _)| i.name.clone()).collect()
    }

    /// End the session with this nexus id (`session_disconnect`).
    pub fn disconnect(&self, nexus: u64) -> bool {
        let sessions = self.0.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let found = sessions.values().find(|e| e.nexus == nexus);
        if let Some(e) = found {
            e.ending.end("disconnected by the operator");
        }
        found.is_some()
    }
}

/// The front-end's name: session ids are `iscsi:N`.
pub const NAME: &str = "iscsi";

/// iSCSI as the control plane sees it: the running front-end, or none
/// (no listen address at start).
pub struct IscsiFrontend(pub Option<Handle>);

impl Frontend for IscsiFrontend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn admit(&self, old: &ServeConfig, new: &ServeConfig) -> Result<(), Refused> {
        let listen = |c: &ServeConfig| c.iscsi.as_ref().map(|i| i.listen.clone()).unwrap_or_default();
        if listen(old) != listen(new) {
            return Err(fixed_at_start("iscsi.listen"));
        }
        let has_targets = |c: &ServeConfig| c.iscsi.as_ref().is_some_and(|i| !i.targets.is_empty());
        if self.0.is_none() && has_targets(new) && !has_targets(old) {
            return Err(Refused::NeedsRestart("iSCSI is not being served (no listen address at start): restart with one to add targets".into()));
        }
        Ok(())
    }

    fn reconcile(&self, new: &ServeConfig, volumes: &Volumes, resized: &HashSet<String>) -> Result<Vec<String>, Refused> {
        match &self.0 {
            Some(h) => h.reconcile(&new.iscsi.clone().unwrap_or_default(), volumes, resized).map_err(failed),
            None => Ok(Vec::new()),
        }
    }

    fn sessions(&self) -> Option<Vec<SessionInfo>> {
        Some(self.0.as_ref().map(Handle::sessions).unwrap_or_default())
    }

    fn disconnect(&self, n: &str) -> bool {
        match (&self.0, n.parse()) {
            (Some(h), Ok(nexus)) => h.disconnect(nexus),
            _ => false,
        }
    }

    fn drain(&self) -> Vec<String> {
        let drained = self.0.as_ref().map(Handle::drain).unwrap_or_default();
        drained.into_iter().map(|n| format!("iscsi {n}: Unavailable; sessions notified")).collect()
    }

    fn set_access(&self, iqn: &str, group: Option<u32>, state: AccessState) -> Result<String, Refused> {
        let h = self.0.as_ref().ok_or_else(|| Refused::Unsupported("iSCSI is not served".into()))?;
        let state = match state {
            AccessState::Optimized => AluaState::ActiveOptimized,
            AccessState::NonOptimized => AluaState::ActiveNonOptimized,
            AccessState::Standby => AluaState::Standby,
            AccessState::Inaccessible => AluaState::Unavailable,
            AccessState::PersistentLoss | AccessState::Change => return Err(Refused::Invalid(format!("ALUA has no state {state:?}"))),
        };
        let group = group.map(u16::try_from).transpose().map_err(|_| Refused::Invalid(format!("target port group {group:?}: at most 65535")))?;
        let changed = h.tpg_set(iqn, group, state)?;
        Ok(if changed { format!("iscsi {iqn}: {state:?}; sessions notified") } else { format!("iscsi {iqn}: already {state:?}") })
    }
}

pub async fn start(
    cfg: &IscsiConfig,
    limits: &Limits,
    tuning: &Tuning,
    volumes: &Volumes,
    shutdown: Shutdown,
) -> anyhow::Result<(Running, Handle)> {
    let mut targets = Vec::new();
    for t in &cfg.targets {
        targets.push(Arc::new(ScsiTarget::new(luns(t, volumes)?)));
        eprintln!("blockwire: iSCSI target {} ({} LUNs)", t.iqn, t.luns.len());
    }
    let admission = Admission::new(limits.clone());
    let ctx = Arc::new(Ctx {
        published: ArcSwap::from_pointee(Published { login: login_config(cfg), targets }),
        listen: cfg.listen.clone(),
        next_tsih: AtomicU16::new(1),
        next_nexus: AtomicU64::new(1),
        admission: admission.clone(),
        knobs: Knobs::from(tuning),
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
    let handle = Handle(ctx.clone());
    let accepting = acceptor.run(listeners, shutdown, move |a| connection(a, ctx.clone()));
    let running = tokio::spawn(async move {
        let _ = accepting.await;
        Ok(())
    });
    Ok((running, handle))
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
        peer,
        mut ticket,
        mut shutdown,
    } = a;
    // The targets as they are at this login.
    let published = ctx.published.load_full();
    let local = local.context("no local address")?;
    let _counted = metrics::global().connection(Proto::Iscsi);
    let mut stream = stream;
    let mut reader = FrameReader::with_capacity(256 * 1024);
    let mut dec = Decoder::new(LOGIN_MAX_DATA);
    let mut out = Outbox::default();
    let Some((res, registered)) = login(&ctx, &published.login, peer, &mut ticket, &mut stream, &mut reader, &dec, &mut out).await?
    else {
        return Ok(());
    };
    let _session = res
        .target
        .map(|t| metrics::global().login(Proto::Iscsi, &published.login.targets[t].name, &res.initiator_name, true));
    let discovery_idle = (res.session_type == SessionType::Discovery)
        .then(|| ctx.admission.limits().discovery_idle_timeout());
    if discovery_idle.is_none() {
        stream = ticket.own_thread(stream).await?;
    }
    let digests = Digests {
        header: res.params.header_digest,
        data: res.params.data_digest,
    };
    dec.digests = digests;
    dec.max_data = res.params.max_recv_data_segment_length as usize;
    let timers = Timers {
        nop_interval: NOP_INTERVAL,
        idle_limit: discovery_idle,
    };
    let session = full_feature_session(&ctx, &published.login, &res, local, digests)
        .with_timers(timers, Instant::now());
    let scsi = res.target.map(|i| published.targets[i].clone());
    let (nexus, ending, stats) = (registered.nexus, registered.ending.clone(), registered.stats.clone());
    if let Some(s) = &scsi {
        let isid: String = res.isid.iter().map(|b| format!("{b:02x}")).collect();
        s.set_initiator_name(nexus, &format!("{},i,0x{isid}", res.initiator_name));
    }
    drop(published);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let mut conn = Connection {
        session,
        scsi: scsi.clone(),
        lun_cache: LunCache::default(),
        nexus,
        digests,
        dec,
        knobs: ctx.knobs,
        out,
        done_tx,
        meter: Meter::new(Proto::Iscsi),
        stats,
        ending,
        now: Instant::now(),
        spare: Vec::new(),
    };
    let r = match driver::run(&stream, &mut reader, &mut conn, &mut done_rx, &mut shutdown, &ctx.knobs).await {
        Exit::Closed(r) => r,
        Exit::Returned => Ok(()),
    };
    drop(registered);
    conn.meter.flush();
    driver::close(stream, &mut conn.out).await;
    if let Some(s) = &scsi {
        s.nexus_gone(nexus);
    }
    r
}

/// A session's place in [`Ctx::sessions`] (a normal session's; a discovery
/// session has a nexus and no key), left when this is dropped unless a
/// newer login of the same session has taken it.
struct Registered {
    ctx: Arc<Ctx>,
    key: Option<SessionKey>,
    nexus: u64,
    ending: Arc<Ending>,
    stats: Arc<SessionStats>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(k) = &self.key {
            let mut map = self.ctx.sessions.lock().unwrap_or_else(|p| p.into_inner());
            if map.get(k).is_some_and(|e| e.nexus == self.nexus) {
                map.remove(k);
            }
        }
    }
}

/// The login phase, strictly request/response, within the login timeout.
/// `None`: the login failed or was refused (the answer has been sent).
///
/// A normal session is recorded under its key (reinstating an older one)
/// before the final login response goes out: once the initiator has that
/// answer it may log in again with the same ISID, and that newer login
/// must find this session to reinstate, not be reinstated by it.
async fn login(
    ctx: &Arc<Ctx>,
    targets: &LoginConfig,
    peer: SocketAddr,
    ticket: &mut Ticket,
    stream: &mut TcpStream,
    reader: &mut FrameReader,
    dec: &Decoder,
    out: &mut Outbox,
) -> anyhow::Result<Option<(LoginResult, Registered)>> {
    let tsih = loop {
        let t = ctx.next_tsih.fetch_add(1, Ordering::Relaxed);
        if t != 0 {
            break t;
        }
    };
    let login_timeout = ctx.admission.limits().login_timeout();
    let mut login =
        TargetLogin::new(targets, tsih, chap_entropy()?).with_deadline(std::time::Instant::now() + login_timeout);
    let mut registered = None;
    loop {
        let next = reader.next(&mut *stream, dec, |b| dec.decode(b));
        let pdu = match login.poll_timeout() {
            Some(deadline) => match tokio::time::timeout_at(deadline.into(), next).await {
                Ok(r) => r?,
                Err(_) => match login.handle_timeout(std::time::Instant::now()) {
                    Err(LoginTimedOut) => anyhow::bail!("no complete login within {login_timeout:?} (login_timeout_s)"),
                    // Woken a moment early: the deadline has not passed.
                    Ok(()) => continue,
                },
            },
            None => next.await?,
        };
        let Some(pdu) = pdu else { return Ok(None) };
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
                push_pdu(out, &resp, Digests::default());
                out.drain(stream).await?;
                log::warn!("iSCSI login refused: the {kind:?} session pool is full ({})", kind.knob());
                return Ok(None);
            }
            let key = r.target.map(|t| (r.initiator_name.clone(), r.isid, targets.targets[t].name.clone()));
            let reg = Registered {
                ctx: ctx.clone(),
                key,
                nexus: ctx.next_nexus.fetch_add(1, Ordering::Relaxed),
                ending: Ending::new(),
                stats: Arc::new(SessionStats::default()),
            };
            if let Some(k) = &reg.key {
                reinstate(ctx, k, SessionEntry { nexus: reg.nexus, ending: reg.ending.clone(), peer, stats: reg.stats.clone() });
            }
            registered = Some(reg);
        }
        push_pdu(out, &resp, Digests::default());
        out.drain(stream).await?;
        match step {
            LoginStep::Continue => {}
            LoginStep::Complete => break,
            LoginStep::Failed(s) => {
                use bw_iscsi::msg::login_status::{AUTHENTICATION_FAILURE, AUTHORIZATION_FAILURE};
                if s == AUTHENTICATION_FAILURE || s == AUTHORIZATION_FAILURE {
                    let target = login.target().map_or("", |t| targets.targets[t].name.as_str());
                    metrics::global().auth_failure(Proto::Iscsi, target, login.initiator_name());
                }
                log::info!(
                    "iSCSI login from {} refused with status {s:#06x}",
                    login.initiator_name().escape_debug()
                );
                return Ok(None);
            }
        }
    }
    match (login.result(), registered) {
        (Some(r), Some(reg)) => Ok(Some((r.clone(), reg))),
        _ => anyhow::bail!("login completed without a result"),
    }
}

/// Random bytes for a login's CHAP challenge, from the OS; there is no
/// fallback: without the OS generator there is no login.
fn chap_entropy() -> anyhow::Result<bw_iscsi::chap::ChapEntropy> {
    let mut b = [0u8; 33];
    getrandom::getrandom(&mut b)
        .map_err(|e| anyhow::anyhow!("no random numbers from the OS for a CHAP challenge: {e}"))?;
    Ok(bw_iscsi::chap::ChapEntropy(b))
}

/// The full feature phase session a login produced: the targets this
/// initiator may see (for SendTargets) and the one it logged in to.
fn full_feature_session(ctx: &Ctx, login: &LoginConfig, res: &LoginResult, local: SocketAddr, digests: Digests) -> TargetSession {
    let visible: Vec<(String, Vec<String>)> = login
        .targets
        .iter()
        .filter(|t| t.allowed_initiators.is_empty() || t.allowed_initiators.contains(&res.initiator_name))
        .map(|t| (t.name.clone(), portals(ctx, local, t.portal_group_tag)))
        .collect();
    let current = res.target.map(|i| login.targets[i].name.clone());
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
    TargetSession::new(SessionConfig {
        session_type: res.session_type,
        params: res.params.clone(),
        queue_depth: QUEUE_DEPTH,
        exp_cmd_sn: res.exp_cmd_sn,
        stat_sn: res.next_stat_sn,
        cid: res.cid,
        targets: visible,
        current_target: current,
        data_out_budget: DATA_OUT_BUDGET,
    })
}

/// Record a normal session under its key; a live session with the same key
/// is reinstated: its connection is told to end.
fn reinstate(ctx: &Ctx, key: &SessionKey, entry: SessionEntry) {
    let old = ctx
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key.clone(), entry);
    if let Some(old) = old {
        log::info!(
            "iSCSI session of {} reinstated: ending the old connection",
            key.0.escape_debug()
        );
        old.ending.end("session reinstated by a new login");
    }
}

/// Queue one PDU, whole, in `out`.
fn push_pdu(out: &mut Outbox, p: &Pdu, d: Digests) {
    let parts = p.wire_parts(d);
    let b = out.buf_mut();
    b.reserve(parts.len());
    for s in parts.io_slices() {
        b.extend_from_slice(&s);
    }
}

/// A command finished on the blocking pool or by the backend.
struct Done {
    itt: u32,
    id: u64,
    status: u8,
    sense: Vec<u8>,
    data_in: Vec<u8>,
    residual: Residual,
    /// A read or write, counted when it completes.
    io: Option<IoTimer>,
}

impl Done {
    fn new(e: &Exec, o: bw_scsi::ScsiOutcome, data_in: Vec<u8>, residual: Residual) -> Done {
        Done { itt: e.itt, id: e.id, status: o.status, sense: o.sense, data_in, residual, io: None }
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
    /// The LUN this connection's commands used last (see [`LunCache`]).
    lun_cache: LunCache,
    nexus: u64,
    /// Zero-copy Data-In needs no data digest (it would need the bytes).
    digests: Digests,
    /// Full feature phase framing (the negotiated digests and data length).
    dec: Decoder,
    knobs: Knobs,
    /// What to send, in the order the session produced it.
    out: Outbox,
    /// Completions from the blocking pool come back through here.
    done_tx: mpsc::UnboundedSender<Done>,
    meter: Meter,
    /// Reads and writes, for `session_list`.
    stats: Arc<SessionStats>,
    /// Set by a reinstatement, `session_disconnect` or an ACL change.
    ending: Arc<Ending>,
    /// When the driver took the batch of PDUs being handled (I/O timers
    /// start there).
    now: Instant,
    /// Action lists to reuse (a command's handling nests two: the PDU's
    /// and its completion's), so that none is allocated per command.
    spare: Vec<Vec<Action>>,
}

fn lun_number(lun_field: u64) -> u64 {
    bw_scsi::decode_lun(lun_field.to_be_bytes()).unwrap_or(u64::MAX)
}

/// Run one SCSI command; the result as the session wants it.
fn run_command(plan: &Plan<'_>, nexus: u64, e: &Exec) -> Done {
    let data_out: smallvec::SmallVec<[&[u8]; 4]> = e.data_out.iter().map(|b| &b[..]).collect();
    let mut data_in = Vec::new();
    let (o, wanted) = plan.execute(nexus, &data_out, e.edtl as usize, &mut data_in);
    Done::new(e, o, data_in, data_out_residual(wanted, e.edtl))
}

/// What [`dispatch`] needs to know about a SCSI command.
fn work(plan: &Plan<'_>, e: &Exec, knobs: &Knobs, digests: Digests) -> Work {
    match plan.execution() {
        Execution::Inline => Work::Instant,
        Execution::InlineIfSmall => {
            let len = e.edtl as usize;
            let zero_copy = e.read
                && !e.write
                && dispatch::zero_copy(len, knobs.zero_copy_min, digests.data, plan.device());
            Work::Data { len, zero_copy }
        }
        Execution::Pool => Work::Waits,
    }
}

impl Connection {
    /// An empty action list (see [`Connection::spare`]).
    fn actions(&mut self) -> Vec<Action> {
        self.spare.pop().unwrap_or_default()
    }

    /// Queue the PDUs a session call produced and run the commands it
    /// released. `false` once the session asks to close.
    fn act(&mut self, actions: Vec<Action>) -> bool {
        if actions.is_empty() {
            // A good write's completion (its status already queued).
            self.recycle(actions);
            return true;
        }
        self.act_counting(actions).0
    }

    /// Keep an emptied action list for [`Connection::actions`].
    fn recycle(&mut self, mut actions: Vec<Action>) {
        actions.clear();
        if self.spare.len() < 4 {
            self.spare.push(actions);
        }
    }

    /// [`Connection::act`], also returning how many commands it ran.
    fn act_counting(&mut self, mut actions: Vec<Action>) -> (bool, usize) {
        let mut keep_going = true;
        let mut commands = 0;
        // Each action is handled where it lies (an action is ~140 bytes,
        // and moving one out is a memcpy call), then dropped by `clear`.
        for a in actions.iter_mut() {
            match a {
                Action::Send(p) => push_pdu(&mut self.out, p, self.digests),
                Action::Close => keep_going = false,
                Action::Execute(e) => {
                    commands += 1;
                    self.execute(e)
                }
                &mut Action::LunReset { itt, lun } => {
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
                    push_pdu(&mut self.out, &p, self.digests);
                }
                &mut Action::TargetReset { itt, cold } => {
                    if let Some(s) = &self.scsi {
                        s.target_reset();
                    }
                    let p = self
                        .session
                        .finish_tmf(itt, bw_iscsi::msg::tmf_response::FUNCTION_COMPLETE);
                    push_pdu(&mut self.out, &p, self.digests);
                    if cold {
                        keep_going = false;
                    }
                }
            }
        }
        self.recycle(actions);
        (keep_going, commands)
    }

    /// Run a command where [`dispatch::place`] says; only one sent to the
    /// blocking pool has its data-out taken from `e`.
    fn execute(&mut self, e: &mut Exec) {
        // The target is lent out for the command rather than its `Arc`
        // cloned (two locked atomic operations per command): nothing a
        // command's run does reads it from `self` (its completion's actions
        // are PDUs to send, never a LUN or target reset).
        let Some(scsi) = self.scsi.take() else {
            return;
        };
        self.execute_on(&scsi, e);
        self.scsi = Some(scsi);
    }

    /// [`Connection::execute`] on `scsi`, the session's target.
    fn execute_on(&mut self, scsi: &Arc<ScsiTarget>, e: &mut Exec) {
        if e.read != e.write {
            self.stats.count(e.write, e.edtl as u64);
        }
        let plan = scsi.plan_cached(&mut self.lun_cache, lun_number(e.lun), &e.cdb);
        let work = work(&plan, e, &self.knobs, self.digests);
        let limited = plan.volume().is_some_and(|v| v.limited());
        let mut place = dispatch::place(work, plan.device(), limited, self.knobs.inline_max);
        let op = match (work, e.read, e.write) {
            (Work::Data { .. }, true, false) => Some(Op::Read),
            (Work::Data { .. }, false, true) => Some(Op::Write),
            _ => None,
        };
        let io = op.zip(plan.volume()).map(|(op, v)| self.meter.start_at(v.name(), op, e.edtl as usize, self.now));
        if place == Place::Submit && self.submit(&plan, e, io) {
            return;
        }
        if place == Place::Inline && e.read && !e.write {
            if let Some(ok) = self.read(&plan, e, work) {
                if let Some(t) = io {
                    self.meter.done_later(t, ok);
                }
                return;
            }
        }
        if let Work::Data { len, zero_copy: true } = work {
            // Not sent zero-copy after all (a unit attention or reservation
            // to report first): the general path copies it.
            let copy = Work::Data { len, zero_copy: false };
            place = dispatch::place(copy, plan.device(), limited, self.knobs.inline_max);
        }
        if place == Place::Inline {
            if let Some((o, wanted)) = plan.write(&e.data_out) {
                let residual = data_out_residual(Some(wanted), e.edtl);
                return self.finished(Done { io, ..Done::new(e, o, Vec::new(), residual) });
            }
            let d = run_command(&plan, self.nexus, e);
            return self.finished(Done { io, ..d });
        }
        let (tx, nexus, scsi) = (self.done_tx.clone(), self.nexus, scsi.clone());
        // The plan goes along, without its borrows: the pool thread looks
        // neither the command nor the LUN up again.
        let planned = plan.detach();
        let e = Exec { data_out: std::mem::take(&mut e.data_out), cdb: e.cdb.clone(), ..*e };
        tokio::task::spawn_blocking(move || {
            let plan = planned.attach(&scsi, &e.cdb);
            let _ = tx.send(Done { io, ..run_command(&plan, nexus, &e) });
        });
    }

    /// Start a READ or WRITE on a volume that completes requests on its
    /// own threads (rbd): the backend's completion sends the result to
    /// this connection's channel, so no thread waits for it. `false`: run
    /// it the ordinary way.
    fn submit(&mut self, plan: &Plan<'_>, e: &Exec, io: Option<IoTimer>) -> bool {
        let residual = || data_out_residual(plan.data_out_len(), e.edtl);
        let (volume, request) = match plan.io(&e.data_out) {
            IoPlan::Buffered => return false,
            IoPlan::Done(o) => {
                self.finished(Done { io, ..Done::new(e, o, Vec::new(), residual()) });
                return true;
            }
            IoPlan::Submit { volume, request } => (volume, request),
        };
        let (tx, write) = (self.done_tx.clone(), request.is_write());
        // The command's identity and residual now; its status and data when
        // the request ends.
        let done = Done { io, ..Done::new(e, bw_scsi::ScsiOutcome::GOOD, Vec::new(), residual()) };
        volume.submit(request, move |req, r| {
            let o = bw_scsi::io_outcome(&r, write);
            let data_in = if o.is_good() { req.into_buf() } else { Vec::new() };
            let _ = tx.send(Done { status: o.status, sense: o.sense, data_in, ..done });
        });
        true
    }

    /// A command's result: its Data-In and status PDUs. The one place a
    /// read or write ends, whichever way it ran (the inline read path
    /// reports from `execute`).
    fn finished(&mut self, d: Done) {
        if let Some(t) = d.io {
            self.meter.done_later(t, d.status == bw_scsi::ScsiOutcome::GOOD.status);
        }
        let mut actions = self.actions();
        if d.data_in.is_empty() && d.sense.is_empty() {
            // A status alone (every good write): its header straight into
            // the send buffer, without a PDU and action made and taken
            // apart again (~300 instructions per write).
            if let Some(bhs) = self.session.complete_status(d.itt, d.id, d.status, d.residual, &mut actions) {
                self.out.buf_mut().extend_from_slice(&Pdu::new(bhs, bytes::Bytes::new()).head(self.digests, 0));
            }
        } else {
            self.session.complete(d.itt, d.id, d.status, &d.sense, d.data_in, d.residual, &mut actions);
        }
        self.act(actions);
    }

    /// A plain READ on this task: its data goes from the page cache to the
    /// socket with sendfile when `work` says zero-copy (and the backend
    /// hands out a descriptor), else it is read straight into the send
    /// buffer behind its Data-In headers. Whether it succeeded; `None`: not
    /// a plain READ, run it the ordinary way.
    fn read(&mut self, plan: &Plan<'_>, e: &Exec, work: Work) -> Option<bool> {
        let (volume, offset, len) = match plan.read() {
            ReadPlan::Buffered => return None,
            ReadPlan::Done(o) => {
                let ok = o.is_good();
                self.finished(Done::new(e, o, Vec::new(), Residual::None));
                return Some(ok);
            }
            ReadPlan::Range { volume, offset, len } => (volume, offset, len),
        };
        let zero_copy = matches!(work, Work::Data { zero_copy: true, .. });
        let source = Payload::of(&volume, offset, len, zero_copy, self.knobs.mapped_reads && !self.digests.data);
        match source {
            Ok(Some(payload)) => {
                let mut actions = self.actions();
                // Each Data-In header is queued as the session makes it,
                // its data (from the mapping or the file) behind it.
                let (out, digests) = (&mut self.out, self.digests);
                self.session.complete_extent_with(e.itt, e.id, len, &mut actions, |pdu, at, len| {
                    out.push_headed(&pdu.head(digests, len), &payload, at, len);
                    let pad = bw_iscsi::pdu::pad4(len);
                    if pad > 0 {
                        out.buf_mut().extend_from_slice(&[0u8; 4][..pad]);
                    }
                });
                self.act(actions);
                return Some(true);
            }
            Ok(None) => {}
            Err(err) => {
                let o = bw_scsi::io_outcome(&Err(err), false);
                self.finished(Done::new(e, o, Vec::new(), Residual::None));
                return Some(false);
            }
        }
        Some(self.read_into_outbox(e, &volume, offset, len))
    }

    /// Read `len` bytes at `offset` of `volume` (a checked READ) into the
    /// send buffer, each Data-In PDU's data behind room for its header;
    /// the headers are written once the read succeeded and the session
    /// made them. Whether the read succeeded.
    fn read_into_outbox(&mut self, e: &Exec, volume: &Volume, offset: u64, len: usize) -> bool {
        let sent = len.min(e.edtl as usize);
        let head_len = BHS_LEN + if self.digests.header { 4 } else { 0 };
        let start = self.out.buf_mut().len();
        let mut heads = Vec::with_capacity(1);
        for r in self.session.data_in_segments(sent) {
            let b = self.out.buf_mut();
            heads.push(b.len());
            b.resize(b.len() + head_len, 0);
            let at = match self.out.read_into(volume, offset + r.start as u64, r.len()) {
                Ok(at) => at,
                Err(err) => {
                    self.out.buf_mut().truncate(start);
                    let o = bw_scsi::io_outcome(&Err(err), false);
                    self.finished(Done::new(e, o, Vec::new(), Residual::None));
                    return false;
                }
            };
            let b = self.out.buf_mut();
            b.extend_from_slice(&[0u8; 4][..bw_iscsi::pdu::pad4(r.len())]);
            if self.digests.data {
                let crc = bw_iscsi::pdu::crc32c(&b[at..]);
                b.extend_from_slice(&crc.to_le_bytes());
            }
        }
        let mut actions = self.actions();
        let mut heads = heads.into_iter();
        let (out, digests) = (&mut self.out, self.digests);
        self.session.complete_extent_with(e.itt, e.id, len, &mut actions, |pdu, _, len| {
            if let Some(h) = heads.next() {
                let head = pdu.head(digests, len);
                out.buf_mut()[h..h + head_len].copy_from_slice(&head);
            }
        });
        if heads.next().is_some() {
            // The task was aborted meanwhile: nothing of it goes out.
            self.out.buf_mut().truncate(start);
        }
        self.act(actions);
        true
    }
}

impl driver::Session for Connection {
    type Done = Done;
    /// Why the session was told to end.
    type Signal = &'static str;

    fn outbox(&mut self) -> &mut Outbox {
        &mut self.out
    }

    fn fill(&self, reader: &mut FrameReader, stream: &TcpStream) -> std::io::Result<usize> {
        reader.try_fill(stream, &self.dec)
    }

    fn receive(&mut self, buf: &mut BytesMut, now: Instant) -> Step {
        let pdu = match self.dec.decode(buf) {
            Ok(Some(p)) => p,
            Ok(None) => return Step::NeedMore,
            Err(e) => return Step::Close(Err(anyhow::anyhow!("bad PDU: {e}"))),
        };
        let bhs = pdu.bhs;
        self.now = now;
        let mut actions = self.actions();
        let r = self.session.on_pdu(pdu, now, &mut actions);
        if r.is_err() {
            actions.push(Action::Send(self.session.reject(&bhs, bw_iscsi::msg::reject_reason::PROTOCOL_ERROR)));
        }
        let (open, commands) = self.act_counting(actions);
        match r {
            // The reject goes out with what was queued before it.
            Err(e) => Step::Close(Err(anyhow::anyhow!("{e}"))),
            // Whatever was queued before the close is sent first.
            Ok(()) if !open => Step::Close(Ok(())),
            Ok(()) if commands > 0 => Step::Command,
            Ok(()) => Step::Pdu,
        }
    }

    fn complete(&mut self, d: Done) {
        self.finished(d);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.session.poll_timeout()
    }

    fn handle_timeout(&mut self, now: Instant) -> Step {
        let mut actions = self.actions();
        let r = self.session.handle_timeout(now, &mut actions);
        let open = self.act(actions);
        match r {
            Err(e) => Step::Close(Err(e.into())),
            Ok(()) if !open => Step::Close(Ok(())),
            Ok(()) => Step::Pdu,
        }
    }

    fn signal(&self) -> impl Future<Output = &'static str> + Send + 'static {
        let ending = self.ending.clone();
        async move { ending.wait().await }
    }

    fn on_signal(&mut self, why: &'static str) -> Step {
        Step::Close(Err(anyhow::anyhow!("{why}")))
    }

    fn on_shutdown(&mut self) {
        let p = self.session.async_drop_all(2);
        push_pdu(&mut self.out, &p, self.digests);
    }

    fn before_send(&mut self) {
        self.meter.flush();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn chap_challenges_come_from_the_os() {
        // Two draws differ (a stuck generator would be caught here).
        let (a, b) = (super::chap_entropy().unwrap(), super::chap_entropy().unwrap());
        assert_ne!(a.0, b.0);
    }
}
