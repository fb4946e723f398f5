//! NVMe/TCP front-end: listeners, the set of live controllers, and one task
//! per TCP connection (each connection is one queue: admin or I/O); and
//! NVMe/RDMA beside it (`rdma.rs`), one thread per RDMA connection, on the
//! same controllers and subsystems. Both transports' queues are the one
//! queue wrapper (`queue.rs`), each transport supplying its I/O (`tcp.rs`,
//! `rdma.rs`).
//!
//! Protocol logic lives in `bw_nvme` (PDU codec, controller state machine,
//! NVM command set); this module moves bytes and owns the controllers.

mod auth;
mod fabric;
mod link;
mod queue;
mod rdma;
mod tcp;
mod tls;

use crate::accept::{Accepted, Acceptor, Threading};
use crate::limits::{Admission, Limits};
use crate::tuning::Tuning;
use bw_net::tcp::CongestionPlan;
use crate::config::{AnaStateConfig, NvmeConfig, ServeConfig};
use crate::frontend::{failed, fixed_at_start, AccessState, Frontend};
use crate::refused::Refused;
use crate::session::SessionInfo;
use bw_nvme::ana::AnaState;
use crate::{Running, Shutdown, Volumes};
use anyhow::Context;
use bw_nvme::{Namespace, Subsystem};
use bw_nvme::logpage::SecureChannel;
use fabric::{Fabric, Port};
use std::sync::atomic::{AtomicU8, Ordering};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Build the subsystems a config describes.
fn subsystems(cfg: &NvmeConfig, volumes: &Volumes) -> anyhow::Result<Vec<Arc<Subsystem>>> {
    let mut out = Vec::new();
    for s in &cfg.subsystems {
        // Hosts with DH-HMAC-CHAP secrets are allowed hosts too.
        let mut allowed_hosts = s.allowed_hosts.clone();
        allowed_hosts.extend(s.hosts.iter().map(|h| h.nqn.clone()));
        match s.allow_any_host {
            Some(true) if s.hosts.is_empty() => allowed_hosts.clear(),
            // An empty list allows any host: this entry keeps it from
            // being empty and matches none, since a host NQN read from a
            // Connect ends at its first NUL.
            Some(false) if allowed_hosts.is_empty() => allowed_hosts.push("\0".into()),
            _ => {}
        }
        let mut namespaces = Vec::new();
        for n in &s.namespaces {
            let v = volumes.get(&n.volume).with_context(|| format!("subsystem {}: no volume {:?}", s.nqn, n.volume))?;
            let mut ns = Namespace::new(&s.nqn, n.nsid, v.clone(), n.readonly);
            ns.ana_group = n.ana_group;
            ns.visible_to = n.visible_to();
            // (Validated with the configuration.)
            let ids = n.ids().map_err(anyhow::Error::msg)?;
            ns.uuid = ids.uuid.unwrap_or(ns.uuid);
            ns.nguid = ids.nguid.or(ids.uuid).unwrap_or(ns.nguid);
            ns.eui64 = ids.eui64;
            namespaces.push(ns);
        }
        let serial = s.serial.clone().unwrap_or_else(|| format!("BW{:08X}{:04X}", crc32c_str(&s.nqn), out.len()));
        out.push(Arc::new(Subsystem {
            nqn: s.nqn.clone(),
            serial,
            model: s.model.clone().unwrap_or_else(|| "blockwire".into()),
            namespaces,
            allowed_hosts,
            ana: bw_nvme::ana::Ana::new(match s.ana_state {
                AnaStateConfig::Optimized => AnaState::Optimized,
                AnaStateConfig::NonOptimized => AnaState::NonOptimized,
                AnaStateConfig::Inaccessible => AnaState::Inaccessible,
                AnaStateConfig::PersistentLoss => AnaState::PersistentLoss,
            }),
        }));
    }
    Ok(out)
}

fn crc32c_str(s: &str) -> u32 {
    // Stable serial numbers: a cheap hash of the NQN.
    s.bytes().fold(0x811C_9DC5u32, |h, b| (h ^ b as u32).wrapping_mul(0x0100_0193))
}

/// The running NVMe/TCP front-end, for live changes and `session_list`.
#[derive(Clone)]
pub struct Handle {
    fabric: Arc<Fabric>,
    tcp: Arc<TcpPorts>,
    rdma: Arc<RdmaPorts>,
}

impl Handle {
    /// Make the ports and subsystems those of `cfg` while hosts stay
    /// connected (see [`TcpPorts::reconcile`], [`Fabric::reconcile`]);
    /// namespaces on a volume in `resized` are reported changed. Returns
    /// what changed, for the log.
    pub fn reconcile(&self, cfg: &NvmeConfig, volumes: &Volumes, resized: &std::collections::HashSet<String>) -> anyhow::Result<Vec<String>> {
        let subs = subsystems(cfg, volumes)?;
        // Keys first: a key file that cannot be read refuses the change
        // before any port moves.
        self.fabric.tls_keys.check(cfg)?;
        let (mut log, tcp) = self.tcp.reconcile(cfg)?;
        let (rdma_log, rdma) = self.rdma.reconcile(&cfg.rdma_listen)?;
        log.extend(rdma_log);
        self.fabric.set_ports(&tcp, &rdma);
        log.extend(self.fabric.host_keys.replace(cfg)?);
        log.extend(self.fabric.tls_keys.replace(cfg)?);
        log.extend(self.fabric.reconcile(subs, resized));
        Ok(log)
    }

    pub fn sessions(&self) -> Vec<SessionInfo> {
        self.fabric.sessions()
    }

    /// End the controller with this id (`session_disconnect`).
    /// See [`Fabric::ana_set`].
    pub fn ana_set(&self, nqn: &str, group: Option<u32>, state: AnaState) -> Result<bool, Refused> {
        if !self.fabric.nqns().iter().any(|n| n == nqn) {
            return Err(Refused::NotFound(format!("no NVMe subsystem {nqn}")));
        }
        self.fabric.ana_set(nqn, group, state).map_err(Refused::Invalid)
    }

    /// Every subsystem's every ANA group inaccessible (`drain`); the NQNs
    /// whose state changed.
    pub fn drain(&self) -> Vec<String> {
        self.fabric.nqns().into_iter().filter(|n| self.fabric.ana_set(n, None, AnaState::Inaccessible).unwrap_or(false)).collect()
    }

    pub fn disconnect(&self, cntlid: u16) -> bool {
        self.fabric.disconnect(cntlid)
    }
}

pub use fabric::NAME;

/// NVMe/TCP and NVMe/RDMA as the control plane sees them: the running
/// front-end, or none (neither listened at start, and subsystems were
/// configured: see crate::start).
pub struct NvmeFrontend(pub Option<Handle>);

impl Frontend for NvmeFrontend {
    fn name(&self) -> &'static str {
        NAME
    }

    /// (nvme.listen and nvme.rdma_listen change live: nvme_port_add,
    /// nvme_port_remove.)
    fn admit(&self, old: &ServeConfig, new: &ServeConfig) -> Result<(), Refused> {
        let fixed = |c: &ServeConfig| c.nvme.as_ref().map(|n| (n.discovery_listen, n.cntlid_range)).unwrap_or_default();
        if fixed(old) != fixed(new) {
            return Err(fixed_at_start("nvme.discovery_listen or nvme.cntlid_range"));
        }
        let has_subsystems = |c: &ServeConfig| c.nvme.as_ref().is_some_and(|n| !n.subsystems.is_empty());
        if self.0.is_none() && has_subsystems(new) && !has_subsystems(old) {
            return Err(Refused::NeedsRestart("NVMe/TCP is not being served (no listen address at start): restart with one to add subsystems".into()));
        }
        Ok(())
    }

    fn reconcile(&self, new: &ServeConfig, volumes: &Volumes, resized: &std::collections::HashSet<String>) -> Result<Vec<String>, Refused> {
        match &self.0 {
            Some(h) => h.reconcile(&new.nvme.clone().unwrap_or_default(), volumes, resized).map_err(failed),
            None => Ok(Vec::new()),
        }
    }

    fn sessions(&self) -> Option<Vec<SessionInfo>> {
        Some(self.0.as_ref().map(Handle::sessions).unwrap_or_default())
    }

    fn disconnect(&self, n: &str) -> bool {
        match (&self.0, n.parse()) {
            (Some(h), Ok(cntlid)) => h.disconnect(cntlid),
            _ => false,
        }
    }

    fn drain(&self) -> Vec<String> {
        let drained = self.0.as_ref().map(Handle::drain).unwrap_or_default();
        drained.into_iter().map(|n| format!("nvme {n}: every ANA group Inaccessible; hosts notified")).collect()
    }

    fn set_access(&self, nqn: &str, group: Option<u32>, state: AccessState) -> Result<String, Refused> {
        let h = self.0.as_ref().ok_or_else(|| Refused::Unsupported("NVMe/TCP is not served".into()))?;
        let state = match state {
            AccessState::Optimized => AnaState::Optimized,
            AccessState::NonOptimized => AnaState::NonOptimized,
            AccessState::Inaccessible => AnaState::Inaccessible,
            AccessState::PersistentLoss => AnaState::PersistentLoss,
            AccessState::Change => AnaState::Change,
            AccessState::Standby => return Err(Refused::Invalid("ANA has no standby state".into())),
        };
        let changed = h.ana_set(nqn, group, state)?;
        let what = group.map_or("every ANA group".to_string(), |g| format!("ANA group {g}"));
        Ok(if changed { format!("nvme {nqn}: {what} {state:?}; hosts notified") } else { format!("nvme {nqn}: {what} already {state:?}") })
    }
}

pub async fn start(cfg: &NvmeConfig, limits: &Limits, tuning: &Tuning, volumes: &Volumes, shutdown: Shutdown) -> anyhow::Result<(Running, Handle)> {
    let subs = subsystems(cfg, volumes)?;
    let congestion = CongestionPlan::new(tuning.tcp_congestion.clone());
    let listeners = listen_tcp(&cfg.listen, &congestion)?;
    let tls_keys = tls::TlsKeys::from_config(cfg)?;
    let bound: Vec<SocketAddr> = listeners.iter().map(|(_, l)| l.local_addr()).collect::<Result<_, _>>()?;
    let discovery = listen_discovery(cfg, &congestion)?;
    let (ports, rdma_listeners) = announce_ports(cfg, &subs, &bound)?;
    let fabric = Arc::new(make_fabric(cfg, limits, tuning, subs, ports, tls_keys)?);
    let login_timeout = limits.login_timeout();
    // One thread per connected queue (discovery controllers excepted), as
    // iSCSI connections by default: see `Threading::ThreadPerConnection`.
    let acceptor = Arc::new(Acceptor {
        name: "nvme",
        thread_name: "nvme-conn",
        admission: Admission::new(limits.clone()),
        threading: Threading::ThreadPerConnection,
        congestion: congestion.clone(),
    });
    // NVMe/RDMA is a front-end of its own, counted apart from NVMe/TCP's
    // (controllers are counted by the fabric, across both).
    let rdma = Arc::new(RdmaPorts {
        open: Mutex::new(Vec::new()),
        fabric: fabric.clone(),
        admission: Admission::new(limits.clone()),
        rt: tokio::runtime::Handle::current(),
        shutdown: shutdown.clone(),
    });
    for (configured, bound, l) in rdma_listeners {
        rdma.open(configured, bound, l)?;
    }
    let f = fabric.clone();
    // One accept closure per port: each reads its port's TLS as it is now
    // (a live change may set it).
    let serve = move |tls: Arc<PortTls>| {
        let f = f.clone();
        Arc::new(move |a: Accepted| {
            // `a.ticket` lives as long as the connection's future.
            let Accepted { stream, peer, local, ticket, shutdown } = a;
            let fabric = f.clone();
            tcp::serve(stream, peer, local, fabric, shutdown, login_timeout, ticket, tls.get())
        })
    };
    let discovery = discovery.map(|l| {
        let mode = cfg.discovery_listen.map_or(SecureChannel::None, |d| cfg.tls_of(&d).into());
        acceptor.accept_on(l, shutdown.clone(), serve(Arc::new(PortTls::new(mode))))
    });
    let tcp = Arc::new(TcpPorts {
        open: Mutex::new(Vec::new()),
        congestion,
        rt: tokio::runtime::Handle::current(),
        shutdown: shutdown.clone(),
        accept: Box::new(move |l, sd, tls| drop(acceptor.accept_on(l, sd, serve(tls)))),
    });
    for ((configured, l), bound) in listeners.into_iter().zip(bound) {
        tcp.open(configured, bound, l, cfg.tls_of(&configured).into());
    }
    let handle = Handle { fabric: fabric.clone(), tcp, rdma: rdma.clone() };
    let mut stopping = shutdown.clone();
    let running = tokio::spawn(async move {
        // Accept loops and connections watch the same signal.
        stopping.wait().await;
        if let Some(d) = discovery {
            let _ = d.await;
        }
        let _ = tokio::task::spawn_blocking(move || rdma.stop_all()).await;
        fabric.shutdown_all();
        Ok(())
    });
    Ok((running, handle))
}

/// The NVMe/TCP listeners, one per configured address.
fn listen_tcp(addrs: &[SocketAddr], congestion: &CongestionPlan) -> anyhow::Result<Vec<(SocketAddr, TcpListener)>> {
    let mut listeners = Vec::new();
    for addr in addrs {
        let l = crate::accept::listen(*addr, congestion).with_context(|| format!("NVMe/TCP listen on {addr}"))?;
        listeners.push((*addr, l));
    }
    Ok(listeners)
}

/// The discovery controller's own listener, if it has an address that is
/// not already one of the I/O listeners (which answer discovery too).
fn listen_discovery(cfg: &NvmeConfig, congestion: &CongestionPlan) -> anyhow::Result<Option<TcpListener>> {
    let Some(d) = cfg.discovery_listen.filter(|d| !cfg.listen.contains(d)) else { return Ok(None) };
    let l = crate::accept::listen(d, congestion).with_context(|| format!("NVMe/TCP discovery listen on {d}"))?;
    log::info!("nvme: discovery controller on {}", l.local_addr()?);
    Ok(Some(l))
}

/// An RDMA listener bound before the fabric exists: (configured, bound, listener).
type RdmaBound = (SocketAddr, SocketAddr, bw_rdma::Listener);

/// The ports the discovery log names: the bound TCP ports with their TLS,
/// and the RDMA ports, bound here (before the fabric exists) so that the
/// log names them beside the TCP ports. Each subsystem is announced on
/// every port.
fn announce_ports(cfg: &NvmeConfig, subs: &[Arc<Subsystem>], bound: &[SocketAddr]) -> anyhow::Result<(Vec<Port>, Vec<RdmaBound>)> {
    let names: Vec<String> = subs.iter().map(|s| format!("{} ({} namespaces)", s.nqn, s.namespaces.len())).collect();
    if !bound.is_empty() {
        let ports: Vec<String> = bound.iter().map(|a| a.to_string()).collect();
        for n in &names {
            eprintln!("blockwire: nvme subsystem {n} on {}", ports.join(", "));
        }
    }
    let mut rdma_listeners = Vec::new();
    let mut ports: Vec<Port> = bound.iter().zip(&cfg.listen).map(|(&addr, c)| Port { rdma: false, addr, tls: cfg.tls_of(c).into() }).collect();
    for (p, c) in ports.iter().zip(&cfg.listen) {
        if p.tls != SecureChannel::None {
            log::info!("nvme: port {c}: TLS {}", p.tls.name());
        }
    }
    for addr in &cfg.rdma_listen {
        let (l, bound) = rdma::bind(*addr)?;
        for n in &names {
            eprintln!("blockwire: nvme subsystem {n} on rdma {bound}");
        }
        ports.push(Port { rdma: true, addr: bound, tls: SecureChannel::None });
        rdma_listeners.push((*addr, bound, l));
    }
    Ok((ports, rdma_listeners))
}

/// The controllers' fabric over the subsystems and ports, with the
/// configuration's limits, host keys and TLS.
fn make_fabric(cfg: &NvmeConfig, limits: &Limits, tuning: &Tuning, subs: Vec<Arc<Subsystem>>, ports: Vec<Port>, tls_keys: tls::TlsKeys) -> anyhow::Result<Fabric> {
    let [lo, hi] = cfg.cntlid_range.unwrap_or([1, 0xFFEF]);
    Ok(Fabric::new(subs, ports)
        .with_max_controllers(limits.max_sessions, limits.max_discovery_sessions)
        .with_cntlid_range(lo, hi)
        .with_knobs(crate::driver::Knobs::from(tuning))
        .with_host_auth(auth::HostKeys::from_config(cfg)?)
        .with_tls(tls_keys, tuning.tls_records.into())
        // A discovery controller needs no credentials: one that asked
        // for no keep-alive may stay idle no longer than this.
        .with_discovery_idle(limits.discovery_idle_timeout()))
}

/// A port's TLS as its accept loop reads it for each new connection.
struct PortTls(AtomicU8);

impl PortTls {
    fn new(m: SecureChannel) -> PortTls {
        PortTls(AtomicU8::new(m as u8))
    }
    fn get(&self) -> SecureChannel {
        match self.0.load(Ordering::Relaxed) {
            1 => SecureChannel::Allowed,
            2 => SecureChannel::Required,
            _ => SecureChannel::None,
        }
    }
    fn set(&self, m: SecureChannel) {
        self.0.store(m as u8, Ordering::Relaxed);
    }
}

/// A TCP port as bound, with its TLS (what the discovery log says).
type BoundPort = (SocketAddr, SecureChannel);

/// One NVMe/TCP port being listened on.
struct Listening {
    /// As configured (`nvme.listen`): what `nvme_port_remove` names.
    configured: SocketAddr,
    /// As bound (port 0 made concrete): what the discovery log names.
    bound: SocketAddr,
    /// Its TLS (connections accepted from now on).
    tls: Arc<PortTls>,
    /// Ends its accept loop and every connection it accepted.
    stop: watch::Sender<bool>,
}

/// The NVMe/TCP ports, added and removed while serving
/// (`nvme_port_add`, `nvme_port_remove`, SIGHUP).
struct TcpPorts {
    open: Mutex<Vec<Listening>>,
    congestion: CongestionPlan,
    rt: tokio::runtime::Handle,
    shutdown: Shutdown,
    /// Accept on a listener until its shutdown, with the port's TLS.
    accept: Box<dyn Fn(TcpListener, Shutdown, Arc<PortTls>) + Send + Sync>,
}

impl TcpPorts {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Listening>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Accept on `l` from now on, under a shutdown of its own.
    fn open(&self, configured: SocketAddr, bound: SocketAddr, l: TcpListener, tls: SecureChannel) {
        let _rt = self.rt.enter();
        let (stop, sd) = self.shutdown.child(&self.rt);
        let tls = Arc::new(PortTls::new(tls));
        (self.accept)(l, sd, tls.clone());
        self.lock().push(Listening { configured, bound, tls, stop });
    }

    /// Listen on `want` and nowhere else: new addresses are bound first
    /// (any failure changes nothing), then served; ports no longer
    /// wanted stop accepting and close their connections (the hosts
    /// reconnect elsewhere or retry, as after nvmet removes a port).
    /// Returns what changed and the bound addresses with their TLS. A
    /// port whose TLS changed keeps its connections; new ones get the new.
    fn reconcile(&self, cfg: &NvmeConfig) -> anyhow::Result<(Vec<String>, Vec<BoundPort>)> {
        let want = &cfg.listen;
        let have: Vec<SocketAddr> = self.lock().iter().map(|l| l.configured).collect();
        let mut added = Vec::new();
        {
            let _rt = self.rt.enter();
            for a in want.iter().filter(|a| !have.contains(a)) {
                let l = crate::accept::listen(*a, &self.congestion).with_context(|| format!("NVMe/TCP listen on {a}"))?;
                let bound = l.local_addr()?;
                added.push((*a, bound, l));
            }
        }
        let mut log = Vec::new();
        for (a, bound, l) in added {
            let tls: SecureChannel = cfg.tls_of(&a).into();
            let with = if tls == SecureChannel::None { String::new() } else { format!(", TLS {}", tls.name()) };
            log.push(format!("nvme: port {a} added (listening on {bound}{with})"));
            self.open(a, bound, l, tls);
        }
        for l in self.lock().iter() {
            let tls: SecureChannel = cfg.tls_of(&l.configured).into();
            if l.tls.get() != tls {
                log.push(format!("nvme: port {}: TLS {} (new connections)", l.configured, tls.name()));
                l.tls.set(tls);
            }
        }
        self.lock().retain(|l| {
            let keep = want.contains(&l.configured);
            if !keep {
                let _ = l.stop.send(true);
                log.push(format!("nvme: port {} removed, its connections closed", l.configured));
            }
            keep
        });
        // In the order configured: the discovery log's port IDs follow it.
        let open = self.lock();
        let bound = want.iter().filter_map(|a| open.iter().find(|l| l.configured == *a).map(|l| (l.bound, l.tls.get()))).collect();
        Ok((log, bound))
    }
}

/// One NVMe/RDMA port being listened on: its connection manager thread.
struct RdmaListening {
    configured: SocketAddr,
    bound: SocketAddr,
    /// Ends the thread's accept loop and every queue it accepted.
    stop: watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
}

/// The NVMe/RDMA ports, added and removed while serving as the TCP ones
/// are (`nvme_port_add`/`nvme_port_remove` with `"trtype": "rdma"`,
/// SIGHUP), under the RDMA front-end's own admission limits.
struct RdmaPorts {
    open: Mutex<Vec<RdmaListening>>,
    fabric: Arc<Fabric>,
    admission: Arc<Admission>,
    rt: tokio::runtime::Handle,
    shutdown: Shutdown,
}

impl RdmaPorts {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RdmaListening>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open(&self, configured: SocketAddr, bound: SocketAddr, l: bw_rdma::Listener) -> anyhow::Result<()> {
        let (stop, sd) = self.shutdown.child(&self.rt);
        let thread = rdma::serve(l, self.fabric.clone(), self.admission.clone(), sd)?;
        self.lock().push(RdmaListening { configured, bound, stop, thread });
        Ok(())
    }

    /// As [`TcpPorts::reconcile`]: new addresses are bound first (a
    /// failure changes nothing). A removed port's thread is waited for
    /// (it looks at its stop every rdma.rs TICK), so its listener is
    /// released before the answer and the address can be added again.
    fn reconcile(&self, want: &[SocketAddr]) -> anyhow::Result<(Vec<String>, Vec<SocketAddr>)> {
        let have: Vec<SocketAddr> = self.lock().iter().map(|l| l.configured).collect();
        let mut added = Vec::new();
        for a in want.iter().filter(|a| !have.contains(a)) {
            let (l, bound) = rdma::bind(*a)?;
            added.push((*a, bound, l));
        }
        let mut log = Vec::new();
        for (a, bound, l) in added {
            self.open(a, bound, l)?;
            log.push(format!("nvme: rdma port {a} added (listening on {bound})"));
        }
        let removed: Vec<RdmaListening> = {
            let mut open = self.lock();
            let (keep, gone) = open.drain(..).partition(|l| want.contains(&l.configured));
            *open = keep;
            gone
        };
        for l in removed {
            let _ = l.stop.send(true);
            let _ = l.thread.join();
            log.push(format!("nvme: rdma port {} removed, its connections closed", l.configured));
        }
        let open = self.lock();
        let bound = want.iter().filter_map(|a| open.iter().find(|l| l.configured == *a).map(|l| l.bound)).collect();
        Ok((log, bound))
    }

    /// At shutdown (which every thread watches): wait for them.
    fn stop_all(&self) {
        let all: Vec<RdmaListening> = self.lock().drain(..).collect();
        for l in all {
            let _ = l.stop.send(true);
            let _ = l.thread.join();
        }
    }
}
