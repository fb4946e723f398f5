//! Opening the configured volumes and starting every configured front-end
//! on its sockets: what a server does before it announces readiness.

use crate::config::ServeConfig;
use crate::aoe::{self, AoeFrontend};
use crate::frontend::Frontends;
use crate::iscsi::{self, IscsiFrontend};
use crate::nvme::{self, NvmeFrontend};
use crate::{metrics, Running, Shutdown, Volumes};
use anyhow::Context;
use bw_block::Volume;
use std::collections::HashMap;
use std::sync::Arc;

/// A transport serve speaks: what people call it, the `serve` flag that
/// listens for it (and its section's key), and the front-end
/// ([`crate::frontend::Frontend::name`]) that serves it. Help text, the
/// README and the errors that list transports are made from or checked
/// against this table, and the table against the front-ends [`start`]
/// makes (a test in crates/cli), so a new transport is one row here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transport {
    pub name: &'static str,
    pub flag: &'static str,
    pub frontend: &'static str,
}

/// Every transport, in the order help text names them.
pub const TRANSPORTS: &[Transport] = &[
    Transport { name: "AoE", flag: "aoe", frontend: aoe::NAME },
    Transport { name: "iSCSI", flag: "iscsi", frontend: iscsi::NAME },
    Transport { name: "NVMe/TCP", flag: "nvme", frontend: nvme::NAME },
    Transport { name: "NVMe/RDMA", flag: "nvme-rdma", frontend: nvme::NAME },
];

/// The transports' names in prose: "AoE, iSCSI, NVMe/TCP and NVMe/RDMA".
pub fn transport_names() -> String {
    prose_list(TRANSPORTS.iter().map(|t| t.name), "and")
}

/// The transports' flags in prose: "--aoe, --iscsi, --nvme or --nvme-rdma".
pub fn transport_flags() -> String {
    let flags: Vec<String> = TRANSPORTS.iter().map(|t| format!("--{}", t.flag)).collect();
    prose_list(flags.iter().map(String::as_str), "or")
}

/// "a", "a CONJ b", "a, b CONJ c".
pub fn prose_list<'a>(items: impl IntoIterator<Item = &'a str>, conj: &str) -> String {
    let v: Vec<&str> = items.into_iter().collect();
    match v.split_last() {
        None => String::new(),
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} {conj} {last}", rest.join(", ")),
    }
}

/// Open every configured volume. One file is one volume, as the control
/// methods hold live (bw-control's check_one_file_one_volume): two volumes
/// on one file, however spelled (`./`, `..`, a link, two device nodes of
/// one disk), would each cache and reserve it as its own.
pub fn open_volumes(cfg: &ServeConfig) -> anyhow::Result<Volumes> {
    let mut map = HashMap::new();
    let mut files: Vec<(bw_block::Backing, &str)> = Vec::new();
    for v in &cfg.volumes {
        let vol = Volume::open(&v.name, &v.backend).with_context(|| format!("volume {}", v.name))?;
        if let Some(key) = vol.backing() {
            if let Some((_, other)) = files.iter().find(|(k, _)| *k == key) {
                anyhow::bail!("volume {}: {} is the file of volume {other} (one file is one volume)", v.name, v.backend);
            }
            files.push((key, &v.name));
        }
        log::info!("volume {}: {} ({} bytes)", v.name, vol.info().description, vol.size_bytes());
        if let Some(q) = &v.qos {
            vol.set_qos(*q);
            log::info!("volume {}: QoS {q}", v.name);
        }
        crate::metrics::global().watch_volume(&vol);
        map.insert(v.name.clone(), vol);
    }
    Ok(Arc::new(map))
}

/// Start every front-end its configuration asks for; each binds its
/// sockets before this returns, so the caller can announce readiness.
/// The list has every protocol, started or not (see [`Frontends`]), in
/// the order changes are reconciled and sessions listed.
pub async fn start(cfg: &ServeConfig, volumes: &Volumes, shutdown: &Shutdown) -> anyhow::Result<(Vec<Running>, Frontends)> {
    let mut running = Vec::new();
    let (mut aoe, mut iscsi, mut nvme) = (None, None, None);
    cfg.tuning.digest_impl.apply();
    if let Some(a) = &cfg.aoe {
        if !a.exports.is_empty() {
            let (r, h) = aoe::start(a, &cfg.tuning, volumes, shutdown.clone()).await?;
            running.push(r);
            aoe = Some(h);
        }
    }
    if let Some(i) = &cfg.iscsi {
        if !i.listen.is_empty() {
            let (r, h) = iscsi::start(i, &cfg.limits, &cfg.tuning, volumes, shutdown.clone()).await.context("iSCSI")?;
            running.push(r);
            iscsi = Some(h);
        }
    }
    if let Some(n) = &cfg.nvme {
        // An [nvme] section without listeners starts NVMe/TCP with no
        // port: a control-driven target adds them (nvme_port_add).
        if !n.listen.is_empty() || !n.rdma_listen.is_empty() || n.subsystems.is_empty() {
            let (r, h) = nvme::start(n, &cfg.limits, &cfg.tuning, volumes, shutdown.clone()).await.context("NVMe")?;
            running.push(r);
            nvme = Some(h);
        }
    }
    if running.is_empty() {
        anyhow::bail!("nothing to serve: give {} (or the same in the config file)", transport_flags());
    }
    Ok((running, vec![Box::new(IscsiFrontend(iscsi)), Box::new(NvmeFrontend(nvme)), Box::new(AoeFrontend(aoe))]))
}

/// Every protocol's front-end, none of them started: what a server
/// without sockets refuses (for tests of the control plane).
pub fn not_started() -> Frontends {
    vec![Box::new(IscsiFrontend(None)), Box::new(NvmeFrontend(None)), Box::new(AoeFrontend(None))]
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
pub fn raise_fd_limit() {
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

/// Serve the Prometheus exposition on `addr` (bound before this returns).
pub async fn start_metrics(addr: std::net::SocketAddr, shutdown: &Shutdown) -> anyhow::Result<Running> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("metrics listener on {addr}"))?;
    log::info!("metrics: http://{}/metrics", listener.local_addr()?);
    Ok(tokio::spawn(metrics::serve_http(listener, metrics::global(), shutdown.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Two volumes on one file are refused at start as live changes refuse
    /// them, whatever the spelling; two files are two volumes.
    #[test]
    fn one_file_is_one_volume_at_start() {
        let dir = std::env::temp_dir().join(format!("bw-serve-start-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.display();
        let mut c = ServeConfig::default();
        c.add_volume_flag(&format!("a=file:{d}/a.img,size=64k")).unwrap();
        c.add_volume_flag(&format!("b=file:{d}/b.img,size=64k")).unwrap();
        assert_eq!(open_volumes(&c).unwrap().len(), 2);
        c.add_volume_flag(&format!("c=file:{d}/./a.img")).unwrap();
        let e = format!("{:#}", open_volumes(&c).expect_err("a second volume on a.img"));
        assert!(e.contains("volume c") && e.contains("file of volume a") && e.contains("one file is one volume"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The transport table and the front-ends serve makes name the same
    /// front-ends: a front-end no transport names would be missing from
    /// every help text and error that lists the transports.
    #[test]
    fn every_front_end_has_a_transport_and_every_transport_a_front_end() {
        let made: BTreeSet<&str> = not_started().iter().map(|f| f.name()).collect();
        let named: BTreeSet<&str> = TRANSPORTS.iter().map(|t| t.frontend).collect();
        assert_eq!(made, named);
    }

    #[test]
    fn lists_read_as_prose() {
        assert_eq!(prose_list([], "and"), "");
        assert_eq!(prose_list(["a"], "and"), "a");
        assert_eq!(prose_list(["a", "b"], "or"), "a or b");
        assert_eq!(prose_list(["a", "b", "c"], "and"), "a, b and c");
        assert_eq!(transport_flags(), "--aoe, --iscsi, --nvme or --nvme-rdma");
    }
}
