//! `blockwire serve`: open the volumes, start every configured front-end
//! (AoE, iSCSI, NVMe/TCP) at once, run until SIGINT/SIGTERM.

pub mod accept;
pub mod aoe;
pub mod config;
pub mod control;
pub mod dispatch;
pub mod driver;
pub mod framing;
pub mod iscsi;
pub mod limits;
pub mod live;
pub mod metrics;
pub mod nvme;
pub mod outbox;
pub mod pool;
pub mod rpc_http;
pub mod session;
pub mod spdk;
pub mod systemd;
pub mod tuning;

use anyhow::Context;
use bw_block::{BackendSpec, Volume};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use config::ServeConfig;

/// Every opened volume by name.
pub type Volumes = Arc<HashMap<String, Volume>>;

/// A front-end's running part: resolves when it has shut down.
pub type Running = JoinHandle<anyhow::Result<()>>;

/// Shutdown signal shared by all front-ends; cheap to clone.
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    pub fn new() -> (watch::Sender<bool>, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (tx, Shutdown(rx))
    }
    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }
    /// A shutdown of its own that also follows this one: setting the
    /// returned sender ends only those watching the child (one listener's
    /// connections). Spawns its forwarder on `rt`.
    pub fn child(&self, rt: &tokio::runtime::Handle) -> (watch::Sender<bool>, Shutdown) {
        let (tx, child) = Shutdown::new();
        let (mut parent, fwd) = (self.clone(), tx.clone());
        rt.spawn(async move {
            tokio::select! {
                _ = parent.wait() => { let _ = fwd.send(true); }
                _ = fwd.closed() => {}
            }
        });
        (tx, child)
    }

    /// Resolves once shutdown has been requested.
    pub async fn wait(&mut self) {
        while !*self.0.borrow() {
            if self.0.changed().await.is_err() {
                return;
            }
        }
    }
}

pub fn open_volumes(cfg: &ServeConfig) -> anyhow::Result<Volumes> {
    let mut map = HashMap::new();
    for v in &cfg.volumes {
        let spec = BackendSpec::parse(&v.backend).map_err(anyhow::Error::msg)?;
        let vol = Volume::open(&v.name, &spec).with_context(|| format!("volume {}", v.name))?;
        log::info!("volume {}: {} ({} bytes)", v.name, vol.info().description, vol.size_bytes());
        map.insert(v.name.clone(), vol);
    }
    Ok(Arc::new(map))
}

/// Start every front-end; each binds its sockets before this returns, so the
/// caller can announce readiness.
pub async fn start(cfg: &ServeConfig, volumes: &Volumes, shutdown: &Shutdown) -> anyhow::Result<(Vec<Running>, live::Frontends)> {
    let mut running = Vec::new();
    let mut frontends = live::Frontends::default();
    cfg.tuning.digest_impl.apply();
    if let Some(a) = &cfg.aoe {
        if !a.exports.is_empty() {
            let (r, h) = aoe::start(a, &cfg.tuning, volumes, shutdown.clone()).await?;
            running.push(r);
            frontends.aoe = Some(h);
        }
    }
    if let Some(i) = &cfg.iscsi {
        if !i.listen.is_empty() {
            let (r, h) = iscsi::start(i, &cfg.limits, &cfg.tuning, volumes, shutdown.clone()).await.context("iSCSI")?;
            running.push(r);
            frontends.iscsi = Some(h);
        }
    }
    if let Some(n) = &cfg.nvme {
        // An [nvme] section without listeners starts NVMe/TCP with no
        // port: a control-driven target adds them (nvme_port_add).
        if !n.listen.is_empty() || !n.rdma_listen.is_empty() || n.subsystems.is_empty() {
            let (r, h) = nvme::start(n, &cfg.limits, &cfg.tuning, volumes, shutdown.clone()).await.context("NVMe")?;
            running.push(r);
            frontends.nvme = Some(h);
        }
    }
    if running.is_empty() {
        anyhow::bail!("nothing to serve: give --aoe, --iscsi, --nvme or --nvme-rdma (or the same in the config file)");
    }
    Ok((running, frontends))
}

/// Raise the limit on open descriptors: a logged-in connection with a
/// thread of its own costs five (its socket, and its thread's tokio
/// runtime: epoll twice, an eventfd and a dup of the signal driver's
/// socket, which tokio creates with any I/O driver), so the usual soft
/// limit of 1024 would have accept() fail long before the session limits
/// (4096 by default) apply. (A connection still logging in waits on the
/// shared runtime and costs its socket only; before, it had its thread
/// from accept on, and a hard limit of 20,000 ran out at 4,000 idle
/// sockets in make soak.) Root may raise the hard limit too, up to the
/// kernel's fs.nr_open (capped at 2^20).
fn raise_fd_limit() {
    const WANT: libc::rlim_t = 1 << 20;
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<libc::rlim_t>().ok())
        .unwrap_or(WANT)
        .min(WANT);
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return;
        }
        let soft = r.rlim_cur;
        if r.rlim_max < nr_open {
            // Fails with EPERM without CAP_SYS_RESOURCE: then keep the hard limit.
            let raised = libc::rlimit { rlim_cur: nr_open, rlim_max: nr_open };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r = raised;
            }
        }
        if r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                r.rlim_cur = soft;
            }
        }
        if r.rlim_cur != soft {
            log::debug!("open descriptor limit raised from {soft} to {}", r.rlim_cur);
        }
        if r.rlim_cur < 8192 {
            log::warn!("open descriptor limit is {}: connections beyond a fifth of it will be refused (raise it with ulimit -n)", r.rlim_cur);
        }
    }
}

/// Where the control socket goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ControlPath {
    /// [`control::DEFAULT_PATH`], unless another server holds it.
    #[default]
    Default,
    At(std::path::PathBuf),
    Off,
}

/// How `serve` runs besides its configuration.
#[derive(Default)]
pub struct Options {
    pub control: ControlPath,
    /// Reads the configuration again on SIGHUP.
    pub reload: Option<live::Reload>,
    /// Every accepted change is written here before it is acknowledged.
    pub persist: Option<std::path::PathBuf>,
    /// The control methods over HTTP on this address, for callers with
    /// the credentials in this file (`--rpc-http`, `--rpc-http-credentials`).
    pub rpc_http: Option<(std::net::SocketAddr, std::path::PathBuf)>,
}

/// Run until SIGINT/SIGTERM, then stop every front-end and flush volumes.
/// SIGHUP reads the configuration again and applies the difference.
pub async fn serve(cfg: ServeConfig, opts: Options) -> anyhow::Result<()> {
    cfg.validate_start(opts.control != ControlPath::Off || opts.rpc_http.is_some())?;
    raise_fd_limit();
    for p in cfg.pools.iter().filter(|p| p.rbd.is_none()) {
        pool::ensure_dir(p).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let volumes = open_volumes(&cfg)?;
    // Handlers before the ready line: a SIGTERM sent right after it must
    // shut down cleanly, not kill the process with the default action.
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let (stop_tx, shutdown) = Shutdown::new();
    let mut sighup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let socket = match &opts.control {
        ControlPath::Default => control::bind(std::path::Path::new(control::DEFAULT_PATH), false)?,
        ControlPath::At(p) => control::bind(p, true)?,
        ControlPath::Off => None,
    };
    let rpc_http = match &opts.rpc_http {
        Some((addr, creds)) => {
            let creds = Arc::new(rpc_http::Credentials::from_file(creds)?);
            let l = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("--rpc-http {addr}"))?;
            log::info!("control methods over HTTP on {}", l.local_addr()?);
            Some((l, creds))
        }
        None => None,
    };
    if socket.is_none() && rpc_http.is_none() && cfg.volumes.is_empty() && cfg.pools.is_empty() {
        anyhow::bail!("{} (the default socket is another server's)", config::NO_VOLUMES);
    }
    let (mut running, frontends) = start(&cfg, &volumes, &shutdown).await?;
    if let Some(m) = &cfg.metrics {
        running.push(start_metrics(m.listen, &shutdown).await?);
    }
    let mut live = live::Live::new(cfg, &volumes, frontends, opts.reload);
    if let Some(p) = opts.persist {
        match config::remove_temporaries(&p) {
            Ok(gone) => gone.iter().for_each(|t| log::info!("removed {}, left by a serve killed while writing it", t.display())),
            Err(e) => log::warn!("changes cannot be persisted to {}: {e}; every change will be refused", p.display()),
        }
        log::info!("changes are persisted to {}", p.display());
        live = live.persist_to(p);
    }
    let live = Arc::new(live);
    drop(volumes);
    let control = socket.map(|s| tokio::spawn(s.run(live.clone(), shutdown.clone())));
    if let Some((l, creds)) = rpc_http {
        running.push(tokio::spawn(rpc_http::serve(l, live.clone(), creds, shutdown.clone())));
    }
    // Tests and scripts wait for this exact line; systemd for READY=1.
    eprintln!("blockwire: ready (pid {})", std::process::id());
    systemd::notify("READY=1");
    let mut failed = None;
    let mut all = futures_select(running);
    loop {
        tokio::select! {
            _ = sigterm.recv() => { log::info!("SIGTERM: shutting down"); break }
            _ = sigint.recv() => { log::info!("SIGINT: shutting down"); break }
            _ = sighup.recv() => reload(&live).await,
            r = all.recv() => { failed = r; break }
        }
    }
    systemd::notify("STOPPING=1");
    let _ = stop_tx.send(true);
    // Give front-ends a moment to close sessions cleanly.
    let deadline = tokio::time::sleep(std::time::Duration::from_secs(5));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            r = all.recv() => match r {
                Some(Err(e)) if failed.is_none() => failed = Some(Err(e)),
                Some(_) => {}
                None => break,
            },
            _ = &mut deadline => { log::warn!("front-ends did not stop within 5 s"); break; }
        }
    }
    if let Some(c) = control {
        // Its socket file goes with it.
        let _ = c.await;
    }
    for v in live.volumes() {
        if let Err(e) = v.flush() {
            log::error!("flush of volume {} at shutdown failed: {e}", v.name());
        }
    }
    match failed {
        Some(Err(e)) => Err(e),
        _ => Ok(()),
    }
}

/// Serve the Prometheus exposition on `addr` (bound before this returns).
async fn start_metrics(addr: std::net::SocketAddr, shutdown: &Shutdown) -> anyhow::Result<Running> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("metrics listener on {addr}"))?;
    log::info!("metrics: http://{}/metrics", listener.local_addr()?);
    Ok(tokio::spawn(metrics::serve_http(listener, metrics::global(), shutdown.clone())))
}

/// SIGHUP: serve the configuration read again, or say why not (then
/// nothing changed).
async fn reload(live: &Arc<live::Live>) {
    let l = live.clone();
    match tokio::task::spawn_blocking(move || l.reload()).await {
        Ok(Ok(changes)) if changes.is_empty() => log::info!("SIGHUP: configuration read again: no change"),
        Ok(Ok(changes)) => log::info!("SIGHUP: configuration read again: {} changes applied", changes.len()),
        Ok(Err(e)) => log::error!("SIGHUP: configuration not applied, nothing changed: {e}"),
        Err(e) => log::error!("SIGHUP: reload failed: {e}"),
    }
}

/// Funnel front-end results into one channel as they finish.
fn futures_select(running: Vec<Running>) -> tokio::sync::mpsc::Receiver<anyhow::Result<()>> {
    let (tx, rx) = tokio::sync::mpsc::channel(running.len().max(1));
    for h in running {
        let tx = tx.clone();
        tokio::spawn(async move {
            let r = match h.await {
                Ok(r) => r,
                Err(e) => Err(anyhow::anyhow!("front-end task panicked: {e}")),
            };
            if let Err(e) = &r {
                log::error!("front-end stopped: {e:#}");
            }
            let _ = tx.send(r).await;
        });
    }
    rx
}
