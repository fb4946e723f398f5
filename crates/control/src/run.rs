//! `blockwire serve`'s run loop: open the volumes and start the
//! front-ends (bw_serve::start), put the control plane before them (the
//! control socket, the methods over HTTP, SIGHUP), run until SIGINT or
//! SIGTERM, then stop every front-end and flush the volumes.

use crate::live::{self, Live};
use crate::{pool, rpc_http, socket};
use anyhow::Context;
use bw_serve::config::{self, ServeConfig};
use bw_serve::{start, systemd, Running, Shutdown};
use std::sync::Arc;

/// Where the control socket goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ControlPath {
    /// [`socket::DEFAULT_PATH`], unless another server holds it.
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
    start::raise_fd_limit();
    for p in cfg.pools.iter().filter(|p| p.rbd.is_none()) {
        pool::ensure_dir(p).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let volumes = start::open_volumes(&cfg)?;
    // Handlers before the ready line: a SIGTERM sent right after it must
    // shut down cleanly, not kill the process with the default action.
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let (stop_tx, shutdown) = Shutdown::new();
    let mut sighup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let socket = match &opts.control {
        ControlPath::Default => socket::bind(std::path::Path::new(socket::DEFAULT_PATH), false)?,
        ControlPath::At(p) => socket::bind(p, true)?,
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
    let (mut running, frontends) = start::start(&cfg, &volumes, &shutdown).await?;
    if let Some(m) = &cfg.metrics {
        running.push(start::start_metrics(m.listen, &shutdown).await?);
    }
    let mut live = Live::new(cfg, &volumes, frontends, opts.reload);
    if let Some(p) = opts.persist {
        log::info!("changes are persisted to {}", p.display());
        // A serve killed while persisting left `.NAME.new-PID` beside it.
        match config::remove_temporaries(&p) {
            Ok(gone) => gone.iter().for_each(|t| log::info!("removed {}, left by a killed writer", t.display())),
            Err(e) => log::warn!("temporaries beside {} not cleaned: {e}", p.display()),
        }
        live = live.persist_to(p);
    }
    let live = Arc::new(live);
    drop(volumes);
    // Resizes made elsewhere (another gateway, `rbd resize`) are followed.
    // Not one of `running`: it ends at shutdown, not the server.
    tokio::spawn(live::follow_sizes(live.clone(), live.watch_sizes(), shutdown.clone()));
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

/// SIGHUP: serve the configuration read again, or say why not (then
/// nothing changed).
async fn reload(live: &Arc<Live>) {
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
