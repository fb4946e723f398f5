//! The controllers alive on this target: Connect creates (admin queue) or
//! joins (I/O queue) them; admin-queue loss or a keep-alive timeout tears
//! them down and closes every queue they have. A queue that joins takes
//! its queue ID only once its host has authenticated (when it must), so a
//! peer that merely knows a host's NQN and Host ID can neither hold an ID
//! nor, failing to authenticate, end anything but its own connection.

use super::auth::HostKeys;
use bw_nvme::auth::AuthConfig;
use bw_nvme::controller::{KeepAlive, Role};
use bw_nvme::fabrics::{self, Connect, ConnectData};
use bw_nvme::logpage::{DiscoveryEntry, SecureChannel, SUBTYPE_NVME, TRTYPE_RDMA, TRTYPE_TCP};
use super::tls::TlsKeys;
use bw_nvme::ana::AnaState;
use bw_nvme::{Completion, Controller, LiveSubsystem, Status, Subsystem, DISCOVERY_NQN};
use crate::session::{SessionInfo, SessionStats};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub struct CtrlEntry {
    pub cntlid: u16,
    pub ctrl: Mutex<Controller>,
    pub keep_alive: Arc<KeepAlive>,
    /// The subsystem as it is now (it may change while connected).
    pub subsys: Option<Arc<LiveSubsystem>>,
    pub hostnqn: String,
    /// The admin queue's peer, for `session_list`.
    pub peer: Option<SocketAddr>,
    /// Reads and writes, one counter set per I/O queue (its connection
    /// holds the other reference and is the only writer).
    pub stats: Mutex<Vec<Arc<SessionStats>>>,
    /// Asynchronous event completions made outside the admin queue's
    /// task (a live change); that task sends them when woken.
    pub events: Mutex<Vec<Completion>>,
    pub events_ready: tokio::sync::Notify,
    /// The Host ID of the admin queue's Connect: every I/O queue's must match.
    pub hostid: [u8; 16],
    /// The host as a reservation registrant (from `hostid`).
    pub host: Arc<bw_nvme::nvm_io::Host>,
    /// Hands the reservation notices meant for this host to the
    /// controller, one per namespace (dropped with the controller).
    notices: Mutex<Vec<bw_reservation::Listener>>,
    /// DH-HMAC-CHAP settings when this host must authenticate on every queue.
    pub auth: Option<Arc<AuthConfig>>,
    /// The admin queue's TLS ("<suite> <record layer>"), for `session_list`.
    pub tls: std::sync::OnceLock<String>,
    /// Becomes true when the controller is torn down; every queue watches it.
    pub kill: watch::Sender<bool>,
    qids: Mutex<HashSet<u16>>,
}

impl CtrlEntry {
    pub fn killed(&self) -> watch::Receiver<bool> {
        self.kill.subscribe()
    }
    /// A discovery controller (no subsystem, no host check).
    pub fn is_discovery(&self) -> bool {
        self.subsys.is_none()
    }
    /// Take I/O queue ID `qid` for a queue whose host is logged in (has
    /// authenticated, where it must): false if another queue holds it.
    pub fn reserve_queue(&self, qid: u16) -> bool {
        let taken = !self.qids.lock().unwrap_or_else(|p| p.into_inner()).insert(qid);
        if !taken {
            self.keep_alive.touch(Instant::now());
        }
        !taken
    }
    /// Give back an ID taken with [`CtrlEntry::reserve_queue`].
    pub fn release_queue(&self, qid: u16) {
        if let Ok(mut q) = self.qids.lock() {
            q.remove(&qid);
        }
    }
    fn queue_taken(&self, qid: u16) -> bool {
        self.qids.lock().unwrap_or_else(|p| p.into_inner()).contains(&qid)
    }
}

/// Give the controller of `e` the reservation notices for its host on each
/// namespace of `s` (replacing the listeners of an older version of `s`):
/// a Reservation Notification log entry and, when the host waits for one,
/// the asynchronous event.
fn listen_for_notices(e: &Arc<CtrlEntry>, s: &Subsystem) {
    let mut listeners = Vec::new();
    for ns in s.namespaces.iter().filter(|n| n.visible_to(&e.hostnqn)) {
        let (weak, nsid, who) = (Arc::downgrade(e), ns.nsid, e.host.who.as_str().to_string());
        listeners.push(ns.volume.reservations().listen(move |ev| {
            if ev.who != who {
                return;
            }
            let kind = bw_nvme::reservation::notice_type(ev.notice);
            // On a thread of its own: a notice can come from a change made
            // while this very controller is locked (Set Features on the
            // admin queue), and notices are rare.
            let weak = weak.clone();
            std::thread::spawn(move || {
                let Some(e) = weak.upgrade() else { return };
                let aen = e.ctrl.lock().unwrap_or_else(|p| p.into_inner()).reservation_notice(nsid, kind);
                if let Some(c) = aen {
                    e.events.lock().unwrap_or_else(|p| p.into_inner()).push(c);
                    e.events_ready.notify_one();
                }
            });
        }));
    }
    *e.notices.lock().unwrap_or_else(|p| p.into_inner()) = listeners;
}

/// A refused Connect: status plus the invalid-parameter location.
pub struct Refusal {
    pub status: Status,
    pub result: u64,
}

fn refuse(status: Status, result: u64) -> Refusal {
    Refusal { status: status.dnr(), result }
}

/// The front-end's name: controller (session) ids are `nvme:CNTLID`.
pub const NAME: &str = "nvme";

/// A port the discovery log names: where hosts reach the subsystems.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Port {
    pub rdma: bool,
    pub addr: SocketAddr,
    /// TCP: whether it requires, allows or does not offer TLS.
    pub tls: SecureChannel,
}

pub struct Fabric {
    /// Looked up at Connect only; live changes replace entries.
    subsystems: Mutex<Vec<Arc<LiveSubsystem>>>,
    /// NVMe/TCP listeners, then NVMe/RDMA ones (their discovery port IDs
    /// count in that order from 1). TCP ones change live.
    ports: Mutex<Vec<Port>>,
    ctrls: Mutex<HashMap<u16, Arc<CtrlEntry>>>,
    next_cntlid: Mutex<u16>,
    /// NVM controllers alive at once (`limits.max_sessions`), and discovery
    /// controllers (`limits.max_discovery_sessions`): anyone may open
    /// those, so they must not take a host's place.
    max_controllers: usize,
    max_discovery: usize,
    /// Controller ids this gateway may hand out (inclusive).
    cntlids: (u16, u16),
    /// Hosts that authenticate in band, and the sequence numbers they get.
    pub host_keys: HostKeys,
    /// Keep-alive timeout of a discovery controller whose host asks for
    /// none (KATO 0), as Linux's target has (120 s there): it needs no
    /// credentials, so it must not stay forever.
    discovery_idle_ms: u32,
    /// The TCP connection driver's `[tuning]` knobs (zero-copy and inline
    /// limits, commands per send).
    pub knobs: crate::driver::Knobs,
    /// Hosts' TLS PSKs, for the handshakes of ports with TLS.
    pub tls_keys: Arc<TlsKeys>,
    /// Who keeps TLS connections' records (`[tuning] tls_records`).
    pub tls_records: bw_tls::RecordChoice,
}

/// The longest keep-alive timeout a discovery controller gets, whatever
/// its host asks (Linux nvmet's default for one that asks for none), and
/// [`Fabric::with_discovery_idle`] unless told otherwise.
const DISCOVERY_KATO_MAX_MS: u32 = 120_000;

impl Fabric {
    pub fn new(subsystems: Vec<Arc<Subsystem>>, ports: Vec<Port>) -> Fabric {
        Fabric {
            subsystems: Mutex::new(subsystems.into_iter().map(|s| Arc::new(LiveSubsystem::new(s))).collect()),
            ports: Mutex::new(ports),
            ctrls: Mutex::new(HashMap::new()),
            next_cntlid: Mutex::new(1),
            max_controllers: usize::MAX,
            max_discovery: usize::MAX,
            cntlids: (1, 0xFFEF),
            host_keys: HostKeys::default(),
            discovery_idle_ms: DISCOVERY_KATO_MAX_MS,
            knobs: crate::driver::Knobs::default(),
            tls_keys: Arc::default(),
            tls_records: bw_tls::RecordChoice::Auto,
        }
    }

    pub fn with_tls(mut self, keys: TlsKeys, records: bw_tls::RecordChoice) -> Fabric {
        self.tls_keys = Arc::new(keys);
        self.tls_records = records;
        self
    }

    /// How long a discovery controller whose host asked for no keep-alive
    /// may go without a command before it is torn down.
    pub fn with_discovery_idle(mut self, idle: Duration) -> Fabric {
        self.discovery_idle_ms = idle.as_millis().clamp(1, u32::MAX as u128) as u32;
        self
    }

    pub fn with_knobs(mut self, knobs: crate::driver::Knobs) -> Fabric {
        self.knobs = knobs;
        self
    }

    pub fn with_host_auth(mut self, keys: HostKeys) -> Fabric {
        self.host_keys = keys;
        self
    }

    pub fn with_max_controllers(mut self, nvm: usize, discovery: usize) -> Fabric {
        self.max_controllers = nvm;
        self.max_discovery = discovery;
        self
    }

    /// Hand out controller ids from `lo..=hi` only (several gateways of one
    /// subsystem must not give one host two controllers with the same id).
    pub fn with_cntlid_range(mut self, lo: u16, hi: u16) -> Fabric {
        self.cntlids = (lo, hi);
        self.next_cntlid = Mutex::new(lo);
        self
    }

    /// The ports are now `tcp` and `rdma` (a live change): discovery
    /// controllers created from now on list these.
    pub fn set_ports(&self, tcp: &[(SocketAddr, SecureChannel)], rdma: &[SocketAddr]) {
        let mut ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        let tcp = tcp.iter().map(|&(addr, tls)| Port { rdma: false, addr, tls });
        *ports = tcp.chain(rdma.iter().map(|&addr| Port { rdma: true, addr, tls: SecureChannel::None })).collect();
    }

    fn lock_ctrls(&self) -> std::sync::MutexGuard<'_, HashMap<u16, Arc<CtrlEntry>>> {
        self.ctrls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Discovery log entries this host may see, one per subsystem and
    /// port (TCP and RDMA alike). `local` is the address the host reached
    /// us on, reported for wildcard listeners.
    fn discovery_entries(&self, hostnqn: &str, local: Option<SocketAddr>) -> Vec<DiscoveryEntry> {
        let mut v = Vec::new();
        let subs: Vec<Arc<Subsystem>> = self.subsystems.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|s| s.load_full()).collect();
        for s in subs.iter().filter(|s| s.host_allowed(hostnqn)) {
            for (i, p) in self.ports.lock().unwrap_or_else(|p| p.into_inner()).iter().enumerate() {
                let a = p.addr;
                let ip = if a.ip().is_unspecified() { local.map(|l| l.ip()).unwrap_or(a.ip()) } else { a.ip() };
                let trtype = if p.rdma { TRTYPE_RDMA } else { TRTYPE_TCP };
                v.push(DiscoveryEntry { trtype, subnqn: s.nqn.clone(), traddr: ip.to_string(), trsvcid: a.port().to_string(), portid: i as u16 + 1, subtype: SUBTYPE_NVME, tls: p.tls });
            }
        }
        v
    }

    fn alloc_cntlid(&self, taken: &HashMap<u16, Arc<CtrlEntry>>) -> Option<u16> {
        let mut next = self.next_cntlid.lock().unwrap_or_else(|p| p.into_inner());
        // Dynamic controller IDs are 1..=0xFFEF; ours a configured part.
        let (lo, hi) = self.cntlids;
        for _ in lo..=hi {
            let id = *next;
            *next = if id >= hi { lo } else { id + 1 };
            if !taken.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }

    /// Connect on the admin queue: create a controller.
    pub fn connect_admin(&self, c: &Connect, d: &ConnectData, local: Option<SocketAddr>, peer: Option<SocketAddr>) -> Result<Arc<CtrlEntry>, Refusal> {
        if d.cntlid != 0xFFFF {
            // Only the dynamic controller model is offered.
            return Err(refuse(Status::CONNECT_INVALID_PARAM, fabrics::ipo_data(fabrics::CD_CNTLID)));
        }
        let (role, subsys) = if d.subnqn == DISCOVERY_NQN {
            (Role::Discovery(self.discovery_entries(&d.hostnqn, local)), None)
        } else {
            let live = self
                .subsystem(&d.subnqn)
                .ok_or_else(|| refuse(Status::CONNECT_INVALID_PARAM, fabrics::ipo_data(fabrics::CD_SUBNQN)))?;
            let s = live.load_full();
            if !s.host_allowed(&d.hostnqn) {
                log::warn!("nvme: host {} is not allowed on {}", d.hostnqn.escape_debug(), s.nqn);
                return Err(refuse(Status::CONNECT_INVALID_HOST, fabrics::ipo_data(fabrics::CD_HOSTNQN)));
            }
            (Role::Nvm(s), Some(live))
        };
        let mut ctrls = self.lock_ctrls();
        let discovery = subsys.is_none();
        let (max, knob) = if discovery { (self.max_discovery, "max_discovery_sessions") } else { (self.max_controllers, "max_sessions") };
        let n = ctrls.values().filter(|e| e.subsys.is_none() == discovery).count();
        if n >= max {
            log::warn!("nvme: connect from {} refused: {n} controllers of its kind already ({knob})", d.hostnqn.escape_debug());
            return Err(refuse(Status::CONNECT_CTRL_BUSY, 0));
        }
        let cntlid = self.alloc_cntlid(&ctrls).ok_or_else(|| refuse(Status::CONNECT_CTRL_BUSY, 0))?;
        let ctrl = Controller::new(cntlid, role, d.hostnqn.clone(), d.hostid, c.kato_ms, Instant::now());
        if subsys.is_none() {
            ctrl.keep_alive.bound(self.discovery_idle_ms, DISCOVERY_KATO_MAX_MS);
        }
        let kato_ms = ctrl.keep_alive.kato().map_or(0, |k| k.as_millis());
        let auth = (!discovery).then(|| self.host_keys.get(&d.subnqn, &d.hostnqn)).flatten();
        let (kill, _) = watch::channel(false);
        let e = Arc::new(CtrlEntry {
            cntlid,
            keep_alive: ctrl.keep_alive.clone(),
            ctrl: Mutex::new(ctrl),
            subsys,
            hostnqn: d.hostnqn.clone(),
            peer,
            stats: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
            events_ready: tokio::sync::Notify::new(),
            hostid: d.hostid,
            host: Arc::new(bw_nvme::nvm_io::Host::new(d.hostid, d.hostnqn.clone())),
            notices: Mutex::new(Vec::new()),
            auth,
            tls: std::sync::OnceLock::new(),
            kill,
            qids: Mutex::new(HashSet::from([0])),
        });
        if let Some(live) = &e.subsys {
            listen_for_notices(&e, &live.load());
        }
        ctrls.insert(cntlid, e.clone());
        log::info!("nvme: controller {cntlid} for {} on {} (kato {kato_ms} ms)", d.hostnqn.escape_debug(), d.subnqn.escape_debug());
        Ok(e)
    }

    /// Connect on an I/O queue: join an existing controller. The queue ID
    /// is checked free here but taken with [`CtrlEntry::reserve_queue`]
    /// once the queue's host is logged in.
    pub fn connect_io(&self, c: &Connect, d: &ConnectData) -> Result<Arc<CtrlEntry>, Refusal> {
        let e = self
            .lock_ctrls()
            .get(&d.cntlid)
            .cloned()
            .ok_or_else(|| refuse(Status::CONNECT_INVALID_PARAM, fabrics::ipo_data(fabrics::CD_CNTLID)))?;
        let subsys_ok = e.subsys.as_ref().is_some_and(|s| s.load().nqn == d.subnqn);
        if !subsys_ok || e.hostnqn != d.hostnqn || e.hostid != d.hostid {
            return Err(refuse(Status::CONNECT_INVALID_PARAM, fabrics::ipo_data(fabrics::CD_CNTLID)));
        }
        let (ready, nq) = {
            let g = e.ctrl.lock().unwrap_or_else(|p| p.into_inner());
            (g.ready(), g.io_queues())
        };
        if !ready {
            return Err(Refusal { status: Status::CMD_SEQ_ERROR, result: 0 });
        }
        if c.qid > nq {
            return Err(refuse(Status::CONNECT_INVALID_PARAM, fabrics::ipo_sqe(fabrics::CS_QID)));
        }
        if e.queue_taken(c.qid) {
            return Err(refuse(Status::CONNECT_INVALID_PARAM, fabrics::ipo_sqe(fabrics::CS_QID)));
        }
        Ok(e)
    }

    /// Tear a controller down: forget it and close all its queues.
    pub fn remove(&self, cntlid: u16, why: &str) {
        if let Some(e) = self.lock_ctrls().remove(&cntlid) {
            log::info!("nvme: controller {cntlid} ({}) torn down: {why}", e.hostnqn.escape_debug());
            let _ = e.kill.send(true);
        }
    }

    fn subsystem(&self, nqn: &str) -> Option<Arc<LiveSubsystem>> {
        self.subsystems.lock().unwrap_or_else(|p| p.into_inner()).iter().find(|s| s.load().nqn == nqn).cloned()
    }

    /// Make the exported subsystems `subs`, while hosts stay connected:
    /// a subsystem kept by NQN changes in place, and its controllers get
    /// a Namespace Attribute Changed event for the namespaces added,
    /// removed, resized (their volume in `resized`) or remapped; hosts no
    /// longer allowed, and the controllers of subsystems gone, are torn
    /// down. Returns what changed, for the log.
    pub fn reconcile(&self, subs: Vec<Arc<Subsystem>>, resized: &HashSet<String>) -> Vec<String> {
        let mut log = Vec::new();
        let mut table = self.subsystems.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = Vec::new();
        let mut changed_cells = Vec::new();
        let mut ana_cells = Vec::new();
        for s in subs {
            match table.iter().find(|c| c.load().nqn == s.nqn) {
                Some(cell) => {
                    let old = cell.load_full();
                    // Hosts know the subsystem by its serial number too. The
                    // ANA state carries over (`ana_set` may have changed it at
                    // run time), unless the configuration's state changed.
                    let configured = s.ana.configured();
                    let ana_moved = old.ana.reconfigure(configured) && old.ana.set_state(configured);
                    if ana_moved {
                        log.push(format!("nvme {}: ANA state {configured:?}", s.nqn));
                        ana_cells.push(cell.clone());
                    }
                    let s = Arc::new(Subsystem { serial: old.serial.clone(), ana: old.ana.clone(), ..(*s).clone() });
                    let mut changed = bw_nvme::changed_namespaces(&old, &s);
                    for n in &s.namespaces {
                        if resized.contains(n.volume.name()) && !changed.contains(&n.nsid) {
                            changed.push(n.nsid);
                        }
                    }
                    changed.sort_unstable();
                    cell.store(s.clone());
                    for n in &changed {
                        let what = match (old.namespace(*n), s.namespace(*n)) {
                            (None, _) => "added",
                            (_, None) => "removed",
                            _ => "changed",
                        };
                        log.push(format!("nvme {}: namespace {n} {what}", s.nqn));
                    }
                    for n in &s.namespaces {
                        if old.namespace(n.nsid).is_some_and(|o| o.visible_to != n.visible_to) {
                            let to = n.visible_to.as_ref().map_or("every allowed host".to_string(), |h| format!("hosts [{}]", h.join(", ")));
                            log.push(format!("nvme {}: namespace {} visible to {to}", s.nqn, n.nsid));
                        }
                    }
                    changed_cells.push((cell.clone(), old, s, changed));
                    next.push(cell.clone());
                }
                None => {
                    log.push(format!("nvme {}: subsystem added ({} namespaces)", s.nqn, s.namespaces.len()));
                    next.push(Arc::new(LiveSubsystem::new(s)));
                }
            }
        }
        let gone: Vec<Arc<LiveSubsystem>> = table.iter().filter(|c| !next.iter().any(|n| Arc::ptr_eq(n, c))).cloned().collect();
        *table = next;
        drop(table);
        for g in &gone {
            log.push(format!("nvme {}: subsystem removed", g.nqn()));
        }
        for cell in &ana_cells {
            self.ana_changed(cell);
        }
        let ctrls: Vec<Arc<CtrlEntry>> = self.lock_ctrls().values().cloned().collect();
        for e in ctrls {
            let Some(cell) = &e.subsys else { continue };
            if gone.iter().any(|g| Arc::ptr_eq(g, cell)) {
                self.remove(e.cntlid, "its subsystem was removed");
                continue;
            }
            let Some((_, old, s, changed)) = changed_cells.iter().find(|(c, ..)| Arc::ptr_eq(c, cell)) else { continue };
            if !s.host_allowed(&e.hostnqn) {
                log.push(format!("nvme {}: host {} no longer allowed: controller {} ends", s.nqn, e.hostnqn, e.cntlid));
                self.remove(e.cntlid, "its host is no longer allowed");
                continue;
            }
            listen_for_notices(&e, s);
            let changed = bw_nvme::changed_for_host(old, s, changed, &e.hostnqn);
            let aen = e.ctrl.lock().unwrap_or_else(|p| p.into_inner()).subsystem_changed(s.clone(), &changed);
            if let Some(c) = aen {
                e.events.lock().unwrap_or_else(|p| p.into_inner()).push(c);
                e.events_ready.notify_one();
            }
        }
        log
    }

    /// Tell every controller of the subsystem in `cell` that its ANA state
    /// changed: the ANA change event, now if it has an AER waiting.
    fn ana_changed(&self, cell: &Arc<LiveSubsystem>) {
        let ctrls: Vec<Arc<CtrlEntry>> = self.lock_ctrls().values().filter(|e| e.subsys.as_ref().is_some_and(|c| Arc::ptr_eq(c, cell))).cloned().collect();
        for e in ctrls {
            let aen = e.ctrl.lock().unwrap_or_else(|p| p.into_inner()).ana_changed();
            if let Some(c) = aen {
                e.events.lock().unwrap_or_else(|p| p.into_inner()).push(c);
                e.events_ready.notify_one();
            }
        }
    }

    /// `ana_set`: this gateway's ANA state for subsystem `nqn`, for group
    /// `group` or every group, at run time; the hosts get the ANA change
    /// event. Ok(false) if nothing changed.
    pub fn ana_set(&self, nqn: &str, group: Option<u32>, state: AnaState) -> Result<bool, String> {
        let cell = self.subsystem(nqn).ok_or_else(|| format!("no NVMe subsystem {nqn}"))?;
        let ana = cell.load().ana.clone();
        let changed = match group {
            None => ana.set_state(state),
            Some(g) => ana.set_group_state(g, state).ok_or_else(|| format!("ANA group {g} is not in 1..={}", bw_nvme::ana::MAX_GROUPS))?,
        };
        if changed {
            self.ana_changed(&cell);
        }
        Ok(changed)
    }

    /// The NQNs of the subsystems served.
    pub fn nqns(&self) -> Vec<String> {
        self.subsystems.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|c| c.nqn()).collect()
    }

    /// Every NVM controller, for `session_list` (ids `nvme:CNTLID`).
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let mut v: Vec<SessionInfo> = self
            .lock_ctrls()
            .values()
            .filter_map(|e| {
                let s = e.subsys.as_ref()?;
                let peer = e.peer.map_or_else(String::new, |p| p.to_string());
                let stats = SessionStats::sum(e.stats.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|s| &**s));
                let mut i = SessionInfo::new(format!("{NAME}:{}", e.cntlid), NAME, &e.hostnqn, peer, s.nqn(), &stats);
                i.tls = e.tls.get().cloned();
                Some(i)
            })
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// End one controller (`session_disconnect`): false if there is none.
    pub fn disconnect(&self, cntlid: u16) -> bool {
        let known = self.lock_ctrls().contains_key(&cntlid);
        self.remove(cntlid, "disconnected by the operator");
        known
    }

    pub fn shutdown_all(&self) {
        let all: Vec<u16> = self.lock_ctrls().keys().copied().collect();
        for id in all {
            self.remove(id, "target shutting down");
        }
    }
}
