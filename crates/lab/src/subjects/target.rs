//! What a subject module is written against: the protocols subjects
//! speak, the programs a peer needs, and [`PeerTarget`], the trait each
//! peer module implements. Below every subject module (they import it,
//! `subjects` dispatches over them).

use crate::targets::TargetProcess;
use crate::topology::{Link, Topology};
use clap::ValueEnum;
use std::path::Path;

/// The protocols subjects speak; one `blockwire serve` serves [`Protocol::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum Protocol {
    Aoe,
    Iscsi,
    Nvme,
    // Measured where both hosts have an RDMA device on the link
    // (crate::rdma); not in ALL: the default plans keep to their time
    // budgets without it.
    /// NVMe over RDMA (needs an RDMA device on the link; not in the default)
    NvmeRdma,
    /// A file on an NFSv3 export (`nfs://`): peers only, blockwire serves no NFS.
    #[value(skip)]
    Nfs,
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
            Protocol::Nfs => "nfs",
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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
    fn protocol(&self) -> Protocol;
    /// The programs it runs: without them it is unavailable, with this reason.
    fn tools(&self) -> &'static [Tool];
    /// Its installed version, for the report (None: not installed).
    fn version(&self) -> Option<String>;
    /// Start it on `link` serving `backing`; Err is why it is unavailable.
    fn start(&self, topo: &Topology, link: &Link, backing: &Path) -> Result<TargetProcess, String>;
    /// The URL blockwire's client reaches it at over `link`.
    fn url(&self, link: &Link) -> String;
}

