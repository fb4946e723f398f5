//! What the lab measures: blockwire over each of its protocols, and the peer
//! targets served from the same backing file. Each peer kind is one module
//! here (how to start it, its URL, its version, the tools it needs; the
//! process it returns is what CPU accounting reads and cleanup stops) and
//! one row in [`PeerKind`] and [`PeerKind::target`]. What every subject
//! module is written against (the protocols, [`PeerTarget`]) is
//! [`target`], below them all, so no subject module imports this one.

pub mod blockwire;
pub mod clients;
pub mod configfs;
pub mod external;
pub mod ganesha;
pub mod kernel_nfs;
pub mod knfsd;
pub mod lio;
pub mod nvmet;
pub mod process;
pub mod tgt;
pub mod vblade;

pub mod target;

pub use target::{Address, FileServer, KernelAddress, PeerTarget, Protocol, Tool};

use crate::subjects::process::TargetProcess;
use crate::network::topology::{Link, Topology};
use clap::ValueEnum;
use std::path::Path;

/// The peer targets the lab knows: one row per peer module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum PeerKind {
    Tgt,
    Vblade,
    Ganesha,
    Lio,
    Nvmet,
    NvmetRdma,
    Knfsd,
}

impl PeerKind {
    /// The module implementing this peer.
    pub fn target(self) -> &'static dyn PeerTarget {
        match self {
            PeerKind::Tgt => &tgt::Tgt,
            PeerKind::Vblade => &vblade::Vblade,
            PeerKind::Ganesha => &ganesha::Ganesha,
            PeerKind::Lio => &lio::Lio,
            PeerKind::Nvmet => &nvmet::Nvmet { rdma: false },
            PeerKind::NvmetRdma => &nvmet::Nvmet { rdma: true },
            PeerKind::Knfsd => &knfsd::Knfsd,
        }
    }

    pub fn all() -> &'static [PeerKind] {
        PeerKind::value_variants()
    }

    pub fn name(self) -> &'static str {
        self.target().name()
    }

    /// Start the peer, first checking its tools are installed.
    /// Start it on `link`; with `tls`, requiring NVMe/TCP over TLS 1.3.
    pub fn start(self, topo: &Topology, link: &Link, backing: &Path, tls: bool) -> Result<TargetProcess, String> {
        let t = self.target();
        for tool in t.tools() {
            if !topo.target.has(tool.program) {
                return Err(format!("{} is not installed (package {})", tool.program, tool.package));
            }
        }
        if tls {
            t.start_tls(topo, link, backing)
        } else {
            t.start(topo, link, backing)
        }
    }
}

/// One `--peers` entry: a peer, or `none` (no peers at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerChoice(pub Option<PeerKind>);

/// clap's parser for `--peers` entries: a peer name or `none`.
pub fn parse_peer_choice(s: &str) -> Result<PeerChoice, String> {
    if s.trim() == "none" {
        return Ok(PeerChoice(None));
    }
    let names: Vec<&str> = PeerKind::all().iter().map(|p| p.name()).collect();
    PeerKind::from_str(s.trim(), false)
        .map(|p| PeerChoice(Some(p)))
        .map_err(|_| format!("unknown peer {s:?} ({}, or none)", names.join(", ")))
}

/// A networked subject: who serves, over which protocol (measured with
/// blockwire's client, and a kernel initiator where the client host has
/// one). Blockwire and the peers are started by the lab; an external
/// subject (the user's own storage) is only visited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Subject {
    Blockwire(Protocol),
    Peer(PeerKind),
    External(&'static external::External),
}

impl Subject {
    /// The target implementation's name (`blockwire`, `tgt`, ...).
    pub fn target_name(self) -> &'static str {
        match self {
            Subject::Blockwire(_) => blockwire::NAME,
            Subject::Peer(p) => p.target().target_name(),
            Subject::External(e) => e.name,
        }
    }

    /// Where it serves the volume (its protocol, URL, kernel address).
    pub fn address(self) -> Address {
        match self {
            Subject::Blockwire(p) => blockwire::address(p),
            Subject::Peer(p) => p.target().address(),
            Subject::External(e) => e.address,
        }
    }

    /// The client measured: blockwire's, over NFS its `nfs://` NFSv3 client
    /// (a disk image file, as qemu and Proxmox use one), not a kernel mount.
    pub fn initiator(self) -> &'static str {
        if self.address().serves_files() {
            "blockwire nfs:// (NFSv3 client in userspace, image file)"
        } else {
            "blockwire"
        }
    }

    /// Its key in results.json: `<target>-<protocol>`.
    pub fn key(self) -> bw_lab_results::SubjectKey {
        bw_lab_results::SubjectKey::served(self.target_name(), self.address().protocol_name())
    }

    /// The URL blockwire's client uses to reach it over `link` (an
    /// external subject's own).
    pub fn url(self, link: &Link) -> String {
        match self {
            Subject::External(e) => e.url.to_string(),
            s => s.address().url(link),
        }
    }

    /// How a kernel block initiator reaches it over `link` (None: it
    /// serves files).
    pub fn kernel_address(self, link: &Link) -> Option<KernelAddress> {
        match self {
            Subject::External(e) => e.kernel(),
            s => s.address().kernel(link),
        }
    }

    /// The user's own storage: never started or stopped by the lab, not
    /// reached over the lab's link.
    /// Whether `--tls on` measures it: NVMe/TCP over TLS 1.3 (blockwire's
    /// NVMe/TCP, nvmet's TCP port with tlshd).
    pub fn serves_tls(self) -> bool {
        match self {
            Subject::Blockwire(p) => p == Protocol::Nvme,
            Subject::Peer(p) => p.target().serves_tls(),
            Subject::External(_) => false,
        }
    }

    pub fn external(self) -> Option<&'static external::External> {
        match self {
            Subject::External(e) => Some(e),
            Subject::Blockwire(_) | Subject::Peer(_) => None,
        }
    }

    /// Whether write workloads may run on it (all but an external block
    /// subject without `--allow-writes`).
    pub fn writes_allowed(self) -> bool {
        self.external().is_none_or(|e| e.writes_allowed())
    }

    /// Its peer's file server, if it serves files.
    pub fn file_server(self) -> Option<&'static dyn FileServer> {
        match self {
            Subject::Blockwire(_) | Subject::External(_) => None,
            Subject::Peer(p) => p.target().file_server(),
        }
    }
}

/// The versions of what the run measured (`blockwire_exe`, the peers, fio).
pub fn software(blockwire_exe: &std::path::Path) -> bw_lab_results::Software {
    let na = || "not installed".to_string();
    bw_lab_results::Software {
        blockwire: crate::command::first_line(&blockwire_exe.to_string_lossy(), &["--version"]).unwrap_or_else(na),
        peers: PeerKind::all()
            .iter()
            .map(|p| bw_lab_results::PeerVersion { peer: p.name().into(), version: p.target().version().unwrap_or_else(na) })
            .collect(),
        fio: crate::command::first_line("fio", &["--version"]).unwrap_or_else(na),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_per_subject() {
        let l = crate::network::topology::test_link();
        assert_eq!(Subject::Blockwire(Protocol::Aoe).url(&l), "aoe://bwl1ac/1.0");
        assert_eq!(Subject::Peer(PeerKind::Vblade).url(&l), "aoe://bwl1ac/2.0");
        assert_eq!(Subject::Peer(PeerKind::Tgt).url(&l), format!("iscsi://198.18.1.1:3261/{}/1", tgt::IQN));
        assert_eq!(Subject::Peer(PeerKind::Ganesha).url(&l), "nfs://198.18.1.1:2049/bwlab-nfs/disk.img");
        assert_eq!(Subject::Blockwire(Protocol::Nvme).url(&l), format!("nvme+tcp://198.18.1.1:4420/{}/1", blockwire::NQN));
        assert_eq!(Subject::Blockwire(Protocol::NvmeRdma).url(&l), format!("nvme+rdma://198.18.1.1:4421/{}/1", blockwire::NQN));
    }

    #[test]
    fn keys_and_names() {
        assert_eq!(Subject::Blockwire(Protocol::Iscsi).key().to_string(), "blockwire-iscsi");
        assert_eq!(Subject::Peer(PeerKind::Tgt).key().to_string(), "tgt-iscsi");
        assert_eq!(Subject::Peer(PeerKind::Vblade).key().to_string(), "vblade-aoe");
        assert_eq!(Subject::Peer(PeerKind::Ganesha).key().to_string(), "ganesha-nfs");
        // The name a peer gives itself is the one `--peers` accepts.
        for &p in PeerKind::all() {
            assert_eq!(parse_peer_choice(p.name()), Ok(PeerChoice(Some(p))));
        }
        assert_eq!(parse_peer_choice("none"), Ok(PeerChoice(None)));
        assert!(parse_peer_choice("scst").is_err());
        for p in Protocol::ALL.into_iter().chain([Protocol::NvmeRdma]) {
            assert_eq!(Protocol::from_str(p.name(), false), Ok(p));
        }
        assert_eq!(Subject::Blockwire(Protocol::NvmeRdma).key().to_string(), "blockwire-nvme-rdma");
    }

    /// A peer serving files is a file server, and only such a peer is.
    #[test]
    fn file_servers_are_the_peers_serving_files() {
        for &p in PeerKind::all() {
            let t = p.target();
            assert_eq!(t.file_server().is_some(), t.address().serves_files(), "{}", p.name());
            assert_eq!(Subject::Peer(p).file_server().is_some(), t.address().serves_files());
        }
        assert!(Subject::Blockwire(Protocol::Iscsi).file_server().is_none());
    }
}
