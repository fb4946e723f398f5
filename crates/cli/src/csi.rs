//! `blockwire csi`: the Kubernetes CSI plugin (crates/csi), its arguments.

use anyhow::Context;
use clap::{Args, ValueEnum};
use std::path::PathBuf;

#[derive(Args)]
pub struct CsiArgs {
    /// The socket the CO connects to: unix:///PATH or PATH.
    #[arg(long, default_value = "unix:///csi/csi.sock")]
    pub endpoint: String,
    /// Which services besides Identity: controller (the Deployment), node
    /// (the DaemonSet on every node) or both (one process, for tests).
    #[arg(long, value_enum, default_value = "both")]
    pub mode: Mode,
    /// A gateway's control endpoint, http://HOST:PORT (serve --rpc-http);
    /// repeat for several. Hosts connect to the NVMe ports its `status`
    /// lists; use --gateways for other addresses or iSCSI portals.
    #[arg(long = "gateway", value_name = "URL")]
    pub gateway: Vec<String>,
    /// A JSON file: an array of gateways, each {"url", "nvme_tcp": [ADDR],
    /// "nvme_rdma": [ADDR], "iscsi": [ADDR]}.
    #[arg(long, value_name = "FILE")]
    pub gateways: Option<PathBuf>,
    /// USER:PASSWORD for the gateways (one line, mode 600), used where a
    /// request carries no CSI secrets (username, password).
    #[arg(long, value_name = "FILE")]
    pub credentials: Option<PathBuf>,
    /// Subsystem NQNs are PREFIX:VOLUME.
    #[arg(long, default_value = "nqn.2026-11.io.blockwire.csi")]
    pub nqn_prefix: String,
    /// Target IQNs are PREFIX:VOLUME.
    #[arg(long, default_value = "iqn.2026-11.io.blockwire.csi")]
    pub iqn_prefix: String,
    /// This node's host NQN (default: /etc/nvme/hostnqn, else one made
    /// from /etc/machine-id).
    #[arg(long)]
    pub host_nqn: Option<String>,
    /// This node's iSCSI initiator name (default: InitiatorName in
    /// /etc/iscsi/initiatorname.iscsi, else one made from the host name).
    #[arg(long)]
    pub iqn: Option<String>,
    /// How the node reaches volumes: kernel (nvme-cli, iscsiadm), fuse
    /// (blockwire attach) or auto (kernel where its initiator is there).
    #[arg(long, value_enum, default_value = "auto")]
    pub attach: AttachMode,
    /// Where the node keeps what it staged.
    #[arg(long, default_value = "/var/lib/blockwire-csi")]
    pub state_dir: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Controller,
    Node,
    Both,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AttachMode {
    Auto,
    Kernel,
    Fuse,
}

fn first_line(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().and_then(|s| s.lines().next().map(|l| l.trim().to_string())).filter(|l| !l.is_empty())
}

fn host_nqn() -> anyhow::Result<String> {
    if let Some(n) = first_line("/etc/nvme/hostnqn") {
        return Ok(n);
    }
    let id = first_line("/etc/machine-id").context("no /etc/nvme/hostnqn and no /etc/machine-id: pass --host-nqn")?;
    anyhow::ensure!(id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()), "/etc/machine-id: not 32 hex digits: pass --host-nqn");
    Ok(format!("nqn.2014-08.org.nvmexpress:uuid:{}-{}-{}-{}-{}", &id[..8], &id[8..12], &id[12..16], &id[16..20], &id[20..]))
}

fn iqn() -> anyhow::Result<String> {
    if let Ok(text) = std::fs::read_to_string("/etc/iscsi/initiatorname.iscsi") {
        if let Some(n) = text.lines().find_map(|l| l.trim().strip_prefix("InitiatorName=")) {
            return Ok(n.trim().to_string());
        }
    }
    let host = first_line("/etc/hostname").unwrap_or_else(|| "node".into()).to_lowercase();
    Ok(format!("iqn.2026-11.io.blockwire.csi.node:{host}"))
}

pub fn run(a: CsiArgs) -> anyhow::Result<()> {
    let credentials = match &a.credentials {
        Some(p) => Some(bw_csi::rpc::Credentials::parse(&std::fs::read_to_string(p).with_context(|| format!("--credentials {}", p.display()))?).with_context(|| format!("--credentials {}: expected USER:PASSWORD", p.display()))?),
        None => None,
    };
    let controller = if a.mode != Mode::Node {
        let mut configs: Vec<bw_csi::gateways::GatewayConfig> = a.gateway.iter().map(|u| bw_csi::gateways::GatewayConfig { url: u.clone(), nvme_tcp: vec![], nvme_rdma: vec![], iscsi: vec![] }).collect();
        if let Some(p) = &a.gateways {
            let text = std::fs::read_to_string(p).with_context(|| format!("--gateways {}", p.display()))?;
            configs.extend(serde_json::from_str::<Vec<bw_csi::gateways::GatewayConfig>>(&text).with_context(|| format!("--gateways {}", p.display()))?);
        }
        anyhow::ensure!(!configs.is_empty(), "the controller needs at least one --gateway (or --gateways)");
        let gateways = configs.into_iter().map(bw_csi::gateways::Gateway::new).collect::<anyhow::Result<Vec<_>>>()?;
        Some(bw_csi::controller::ControllerService { gateways, credentials, nqn_prefix: a.nqn_prefix.clone(), iqn_prefix: a.iqn_prefix.clone(), lock: Default::default() })
    } else {
        None
    };
    let node = if a.mode != Mode::Controller {
        let node = bw_csi::names::NodeId { host_nqn: match &a.host_nqn { Some(n) => n.clone(), None => host_nqn()? }, iqn: match &a.iqn { Some(n) => n.clone(), None => iqn()? } };
        anyhow::ensure!(bw_csi::names::NodeId::parse(&node.encode()).is_some(), "node identity {:?}: a host NQN (nqn.…) and an IQN (iqn.…) without spaces", node.encode());
        anyhow::ensure!(node.encode().len() <= bw_csi::names::MAX_NODE_ID, "node ID {:?} is longer than Kubernetes keeps ({} bytes)", node.encode(), bw_csi::names::MAX_NODE_ID);
        let attacher = match a.attach {
            AttachMode::Kernel => bw_csi::node::Attacher::Kernel,
            AttachMode::Fuse => bw_csi::node::Attacher::Fuse,
            AttachMode::Auto => bw_csi::node::Attacher::detect(),
        };
        if attacher == bw_csi::node::Attacher::Fuse {
            log::warn!("node: no kernel NVMe/iSCSI initiator here (or --attach fuse): volumes are attached with blockwire's own initiator over FUSE and a loop device (one path, no online growth)");
        }
        Some(bw_csi::node::NodeService { node, attacher, state_dir: a.state_dir.clone(), blockwire: std::env::current_exe()?, lock: Default::default() })
    } else {
        None
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let shutdown = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        bw_csi::Plugin { controller, node }.serve(bw_csi::socket_path(&a.endpoint), shutdown).await
    })
}
