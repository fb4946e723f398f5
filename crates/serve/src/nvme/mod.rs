//! NVMe/TCP front-end: listeners, the set of live controllers, and one task
//! per TCP connection (each connection is one queue: admin or I/O).
//!
//! Protocol logic lives in `bw_nvme` (PDU codec, controller state machine,
//! NVM command set); this module moves bytes and owns the controllers.

mod auth;
mod conn;
mod fabric;
mod outbox;

use crate::limits::{Admission, Limits, Ticket};
use crate::config::{AnaStateConfig, NvmeConfig};
use bw_nvme::ana::AnaState;
use crate::{Running, Shutdown, Volumes};
use anyhow::Context;
use bw_nvme::{Namespace, Subsystem};
use fabric::Fabric;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Build the subsystems a config describes.
fn subsystems(cfg: &NvmeConfig, volumes: &Volumes) -> anyhow::Result<Vec<Arc<Subsystem>>> {
    let mut out = Vec::new();
    for s in &cfg.subsystems {
        // Hosts with DH-HMAC-CHAP secrets are allowed hosts too.
        let mut allowed_hosts = s.allowed_hosts.clone();
        allowed_hosts.extend(s.hosts.iter().map(|h| h.nqn.clone()));
        let mut namespaces = Vec::new();
        for n in &s.namespaces {
            let v = volumes.get(&n.volume).with_context(|| format!("subsystem {}: no volume {:?}", s.nqn, n.volume))?;
            let mut ns = Namespace::new(&s.nqn, n.nsid, v.clone(), n.readonly);
            ns.ana_group = n.ana_group;
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

pub async fn start(cfg: &NvmeConfig, limits: &Limits, volumes: &Volumes, shutdown: Shutdown) -> anyhow::Result<Running> {
    let subs = subsystems(cfg, volumes)?;
    let mut listeners = Vec::new();
    let mut bound = Vec::new();
    for addr in &cfg.listen {
        let l = TcpListener::bind(addr).await.with_context(|| format!("NVMe/TCP listen on {addr}"))?;
        bound.push(l.local_addr()?);
        listeners.push(l);
    }
    if let Some(d) = cfg.discovery_listen {
        if !cfg.listen.contains(&d) {
            let l = TcpListener::bind(d).await.with_context(|| format!("NVMe/TCP discovery listen on {d}"))?;
            log::info!("nvme: discovery controller on {}", l.local_addr()?);
            listeners.push(l);
        }
    }
    for s in &subs {
        let ports: Vec<String> = bound.iter().map(|a| a.to_string()).collect();
        eprintln!("blockwire: nvme subsystem {} ({} namespaces) on {}", s.nqn, s.namespaces.len(), ports.join(", "));
    }
    let admission = Admission::new(limits.clone());
    let [lo, hi] = cfg.cntlid_range.unwrap_or([1, 0xFFEF]);
    let fabric = Arc::new(Fabric::new(subs, bound).with_max_controllers(limits.max_sessions).with_cntlid_range(lo, hi).with_host_auth(auth::HostKeys::from_config(cfg)?));
    let mut tasks = Vec::new();
    for l in listeners {
        let fabric = fabric.clone();
        let shutdown = shutdown.clone();
        tasks.push(tokio::spawn(accept_loop(l, fabric, admission.clone(), shutdown)));
    }
    let mut sd = shutdown;
    Ok(tokio::spawn(async move {
        sd.wait().await;
        for t in &tasks {
            t.abort();
        }
        fabric.shutdown_all();
        Ok(())
    }))
}

async fn accept_loop(l: TcpListener, fabric: Arc<Fabric>, admission: Arc<Admission>, mut shutdown: Shutdown) {
    loop {
        tokio::select! {
            _ = shutdown.wait() => return,
            r = l.accept() => match r {
                Ok((stream, peer)) => {
                    let ticket = match admission.admit(peer.ip()) {
                        Ok(t) => t,
                        Err(why) => {
                            log::warn!("nvme: connection from {peer} refused: {why}");
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    let local: Option<SocketAddr> = stream.local_addr().ok();
                    let login_timeout = admission.limits().login_timeout();
                    if let Err(e) = spawn_connection_thread(stream, peer, local, fabric.clone(), shutdown.clone(), login_timeout, ticket) {
                        log::warn!("nvme: cannot start a thread for the connection from {peer}: {e:#}");
                    }
                }
                Err(e) => {
                    log::warn!("nvme: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Each connection (one queue) gets its own thread with a single-threaded
/// runtime, as iSCSI connections do: the thread that waits for the socket
/// also runs the command and writes the answer. On the shared work-stealing
/// runtime a queue's task and the I/O driver that wakes it could sit on
/// different workers and move between them from run to run, which made
/// 1 MiB reads swing by 2x between otherwise identical runs.
fn spawn_connection_thread(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    fabric: Arc<Fabric>,
    shutdown: Shutdown,
    login_timeout: std::time::Duration,
    ticket: Ticket,
) -> anyhow::Result<()> {
    let stream = stream.into_std()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::Builder::new().name("nvme-conn".into()).spawn(move || {
        // Holds this connection's place in the admission limits until it ends.
        let _ticket = ticket;
        rt.block_on(async move {
            let r = match tokio::net::TcpStream::from_std(stream) {
                Ok(s) => conn::serve(s, peer, local, fabric, shutdown, login_timeout).await,
                Err(e) => Err(e.into()),
            };
            if let Err(e) = r {
                log::info!("nvme: connection from {peer} ended: {e:#}");
            }
        });
    })?;
    Ok(())
}
