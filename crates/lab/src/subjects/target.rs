//! What a subject module is written against: the protocols subjects
//! speak, the programs a peer needs, and [`PeerTarget`], the trait each
//! peer module implements. Below every subject module (they import it,
//! `subjects` dispatches over them).

use crate::suites::fs::fs_kind::FsKind;
use crate::subjects::process::TargetProcess;
use crate::network::topology::{Link, Topology};
use clap::ValueEnum;
use std::path::Path;

/// The block protocols: blockwire serves each (one `blockwire serve`
/// serves [`Protocol::ALL`]), the kernel initiators speak them. A subject
/// serving files instead is an [`Address::NfsFile`] (peers only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum Protocol {
    Aoe,
    Iscsi,
    Nvme,
    // Measured where both hosts have an RDMA device on the link
    // (crate::network::rdma); not in ALL: the default plans keep to their time
    // budgets without it.
    /// NVMe over RDMA (needs an RDMA device on the link; not in the default)
    NvmeRdma,
}

impl Protocol {
    /// blockwire's own (`--protocols`).
    pub const ALL: [Protocol; 3] = [Protocol::Aoe, Protocol::Iscsi, Protocol::Nvme];

    /// Its name in `--protocols`, subject keys and results.json.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Aoe => "aoe",
            Protocol::Iscsi => "iscsi",
            Protocol::Nvme => "nvme",
            Protocol::NvmeRdma => "nvme-rdma",
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a subject serves the volume, in its protocol's terms: the one
/// fact its URL, its kernel initiator's address and LUN, its AoE address
/// and whether it serves files all come from, each by an exhaustive match
/// here (a new protocol cannot fall through, a new peer gives its
/// address and has them all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Address {
    Aoe { shelf: u16, slot: u8 },
    /// `lun`: the volume's (tgt puts its controller on LUN 0).
    Iscsi { iqn: &'static str, port: u16, lun: u32 },
    /// NVMe/TCP; the volume is namespace 1.
    Nvme { nqn: &'static str, port: u16 },
    /// NVMe over RDMA; the volume is namespace 1.
    NvmeRdma { nqn: &'static str, port: u16 },
    /// An image file on an NFSv3 export (`nfs://`), as qemu and Proxmox use
    /// one: a peer serving files (blockwire serves no NFS).
    NfsFile { port: u16, export: &'static str, file: &'static str },
}

/// How a kernel block initiator reaches a subject: the arguments of its
/// attach script and of the state file's `kernel WHAT A B` line (WHAT is
/// the protocol's name), and the LUN its block device is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelAddress {
    pub protocol: Protocol,
    pub a: String,
    pub b: String,
    pub lun: u32,
}

impl Address {
    /// The block protocol it is served over (None: files).
    pub fn block_protocol(self) -> Option<Protocol> {
        match self {
            Address::Aoe { .. } => Some(Protocol::Aoe),
            Address::Iscsi { .. } => Some(Protocol::Iscsi),
            Address::Nvme { .. } => Some(Protocol::Nvme),
            Address::NvmeRdma { .. } => Some(Protocol::NvmeRdma),
            Address::NfsFile { .. } => None,
        }
    }

    /// Its protocol's name in subject keys and results.json.
    pub fn protocol_name(self) -> &'static str {
        match self.block_protocol() {
            Some(p) => p.name(),
            None => "nfs",
        }
    }

    /// Whether it serves files (the fs suite mounts those with the kernel's
    /// NFS client) rather than a block device.
    pub fn serves_files(self) -> bool {
        self.block_protocol().is_none()
    }

    /// An NFS export's port, path and the image file on it (None: a
    /// block device).
    pub fn nfs_export(self) -> Option<(u16, &'static str, &'static str)> {
        match self {
            Address::NfsFile { port, export, file } => Some((port, export, file)),
            Address::Aoe { .. } | Address::Iscsi { .. } | Address::Nvme { .. } | Address::NvmeRdma { .. } => None,
        }
    }

    /// The URL blockwire's client reaches it at over `link`.
    pub fn url(self, link: &Link) -> String {
        let ip = link.target_ip;
        match self {
            Address::Aoe { shelf, slot } => format!("aoe://{}/{shelf}.{slot}", link.client_if),
            Address::Iscsi { iqn, port, lun } => format!("iscsi://{ip}:{port}/{iqn}/{lun}"),
            Address::Nvme { nqn, port } => format!("nvme+tcp://{ip}:{port}/{nqn}/1"),
            Address::NvmeRdma { nqn, port } => format!("nvme+rdma://{ip}:{port}/{nqn}/1"),
            Address::NfsFile { port, export, file } => format!("nfs://{ip}:{port}{export}/{file}"),
        }
    }

    /// Its AoE shelf and slot, if it is an AoE target.
    pub fn aoe(self) -> Option<(u16, u8)> {
        match self {
            Address::Aoe { shelf, slot } => Some((shelf, slot)),
            Address::Iscsi { .. } | Address::Nvme { .. } | Address::NvmeRdma { .. } | Address::NfsFile { .. } => None,
        }
    }

    /// How a kernel block initiator reaches it over `link` (None: it serves
    /// files, which no block initiator reads).
    pub fn kernel(self, link: &Link) -> Option<KernelAddress> {
        self.kernel_at(&link.target_ip.to_string())
    }

    /// How a kernel block initiator reaches it at `ip` (a host name or
    /// address; None: it serves files).
    pub fn kernel_at(self, ip: &str) -> Option<KernelAddress> {
        let (protocol, a, b, lun) = match self {
            Address::Aoe { shelf, slot } => (Protocol::Aoe, format!("e{shelf}.{slot}"), String::new(), 0),
            Address::Iscsi { iqn, port, lun } => (Protocol::Iscsi, iqn.to_string(), format!("{ip}:{port}"), lun),
            Address::Nvme { nqn, port } => (Protocol::Nvme, nqn.to_string(), format!("{ip} {port}"), 0),
            Address::NvmeRdma { nqn, port } => (Protocol::NvmeRdma, nqn.to_string(), format!("{ip} {port}"), 0),
            Address::NfsFile { .. } => return None,
        };
        Some(KernelAddress { protocol, a, b, lun })
    }
}

/// A program a subject needs, and the package that has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    pub program: &'static str,
    pub package: &'static str,
}

/// A peer target: another implementation serving the backing file in the
/// target namespace, measured with blockwire's client beside blockwire serve.
pub trait PeerTarget: Sync {
    /// Its name in `--peers`, subject keys and results.json (`tgt`).
    fn name(&self) -> &'static str;
    /// The target's name in subject keys, when rows of one target differ
    /// by transport (`nvmet` for both nvmet rows): its name otherwise.
    fn target_name(&self) -> &'static str {
        self.name()
    }
    /// Where it serves the volume: its protocol, URL, kernel address, LUN
    /// and AoE address in one.
    fn address(&self) -> Address;
    /// Whether a plan without `--peers` measures it (one that makes the
    /// default plans outgrow their time budgets: no).
    fn in_default_plan(&self) -> bool;
    /// The programs it runs: without them it is unavailable, with this reason.
    fn tools(&self) -> &'static [Tool];
    /// Its installed version, for the report (None: not installed).
    fn version(&self) -> Option<String>;
    /// Start it on `link` serving `backing`; Err is why it is unavailable.
    fn start(&self, topo: &Topology, link: &Link, backing: &Path) -> Result<TargetProcess, String>;
    /// Whether it can serve NVMe/TCP over TLS 1.3 (`--tls on`).
    fn serves_tls(&self) -> bool {
        false
    }
    /// Start it requiring NVMe/TCP over TLS 1.3 from the lab's host with
    /// the lab's PSK (`blockwire::TLS_HOST`, `blockwire::TLS_PSK`); only
    /// where [`PeerTarget::serves_tls`]. Err is why it is unavailable.
    fn start_tls(&self, _topo: &Topology, _link: &Link, _backing: &Path) -> Result<TargetProcess, String> {
        Err(format!("{} does not serve NVMe/TCP over TLS", self.name()))
    }
    /// What it does as a file server: Some exactly when its address
    /// [serves files](Address::serves_files) (a test holds every peer to
    /// that).
    fn file_server(&self) -> Option<&dyn FileServer> {
        None
    }
}

/// What a peer serving files (an [`Address::NfsFile`]: the image file on
/// an NFS export) does beyond a block peer. Its export is also mounted
/// by the client host's kernel NFS client (`crate::subjects::kernel_nfs`: the image
/// file with direct I/O for micro and sweep, files in `w/` at the export's
/// root for the fs suite), and over NFS the fs suite's `--fs` is the
/// server's file system, the one under the data: the peer serves from an
/// export on each in turn.
pub trait FileServer: Sync {
    /// Serve `backing`'s bytes as the image file from an export on file
    /// system `kind` (what [`PeerTarget::start`] does for ext4). The
    /// process it replaces is stopped first (one server per address and
    /// port).
    fn start_on(&self, topo: &Topology, link: &Link, backing: &Path, kind: FsKind) -> Result<TargetProcess, String>;
}

