//! What a target exports: subsystems with namespaces over volumes.

use bw_block::Volume;

/// The well-known NQN of discovery controllers.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

#[derive(Debug, Clone)]
pub struct Namespace {
    pub nsid: u32,
    pub volume: Volume,
    pub readonly: bool,
    /// Stable unique id (NGUID and UUID descriptors), derived from the
    /// subsystem NQN and NSID so a host sees the same id after a restart.
    pub uuid: [u8; 16],
    /// ANA group (ANAGRPID, 1..=[`crate::ana::MAX_GROUPS`]); the same on
    /// every gateway exporting the namespace.
    pub ana_group: u32,
}

impl Namespace {
    pub fn new(subnqn: &str, nsid: u32, volume: Volume, readonly: bool) -> Namespace {
        let mut uuid = [0u8; 16];
        let seed = format!("{subnqn}/{nsid}");
        for (i, chunk) in uuid.chunks_mut(4).enumerate() {
            let c = crc32c::crc32c_append((i as u32).wrapping_mul(0x9E37_79B9), seed.as_bytes());
            chunk.copy_from_slice(&c.to_le_bytes());
        }
        uuid[6] = (uuid[6] & 0x0F) | 0x40; // version 4 layout
        uuid[8] = (uuid[8] & 0x3F) | 0x80; // RFC 4122 variant
        Namespace { nsid, volume, readonly, uuid, ana_group: 1 }
    }
    /// Size in logical blocks.
    pub fn blocks(&self) -> u64 {
        self.volume.size_bytes() >> crate::LBA_SHIFT
    }
    pub fn read_only(&self) -> bool {
        self.readonly || self.volume.read_only()
    }
}

#[derive(Debug, Clone)]
pub struct Subsystem {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub namespaces: Vec<Namespace>,
    /// Host NQNs allowed to connect; empty means any host.
    pub allowed_hosts: Vec<String>,
    /// This gateway's ANA state for the subsystem's groups.
    pub ana: crate::ana::Ana,
}

impl Subsystem {
    pub fn namespace(&self, nsid: u32) -> Option<&Namespace> {
        self.namespaces.iter().find(|n| n.nsid == nsid)
    }
    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        self.allowed_hosts.is_empty() || self.allowed_hosts.iter().any(|h| h == hostnqn)
    }
    /// Number of namespaces (NN): the highest NSID in use.
    pub fn max_nsid(&self) -> u32 {
        self.namespaces.iter().map(|n| n.nsid).max().unwrap_or(0)
    }
    /// Whether any namespace has a volatile write cache worth flushing.
    pub fn write_cache(&self) -> bool {
        self.namespaces.iter().any(|n| n.volume.info().durability == bw_block::Durability::WriteBack)
    }
}
