//! What a target exports: subsystems with namespaces over volumes.

use bw_block::Volume;
use std::sync::Arc;

/// The well-known NQN of discovery controllers.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

#[derive(Debug, Clone)]
pub struct Namespace {
    pub nsid: u32,
    pub volume: Volume,
    pub readonly: bool,
    /// Stable unique id (the UUID descriptor), derived from the subsystem
    /// NQN and NSID so a host sees the same id after a restart, unless set.
    pub uuid: [u8; 16],
    /// NGUID (Identify Namespace and its descriptor): the UUID's bytes
    /// unless set.
    pub nguid: [u8; 16],
    /// IEEE EUI-64 (Identify Namespace and its descriptor), when set.
    pub eui64: Option<[u8; 8]>,
    /// ANA group (ANAGRPID, 1..=[`crate::ana::MAX_GROUPS`]); the same on
    /// every gateway exporting the namespace.
    pub ana_group: u32,
    /// The hosts that see the namespace, when it is not visible to every
    /// host the subsystem allows (SPDK's `no_auto_visible`, filled by
    /// `nvmf_ns_add_host`). To any other host it is an inactive NSID:
    /// absent from the lists, zeroed in Identify, refused for I/O.
    pub visible_to: Option<Vec<String>>,
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
        Namespace { nsid, volume, readonly, uuid, nguid: uuid, eui64: None, ana_group: 1, visible_to: None }
    }
    /// Size in logical blocks.
    pub fn blocks(&self) -> u64 {
        self.volume.size_bytes() >> crate::LBA_SHIFT
    }
    pub fn read_only(&self) -> bool {
        self.readonly || self.volume.read_only()
    }
    /// Whether host `hostnqn` sees the namespace (it is active for it).
    #[inline]
    pub fn visible_to(&self, hostnqn: &str) -> bool {
        self.visible_to.as_ref().is_none_or(|hosts| hosts.iter().any(|h| h == hostnqn))
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
    /// Namespace `nsid` if host `hostnqn` sees it: what every command of
    /// that host's controller looks namespaces up with.
    pub fn visible_namespace(&self, nsid: u32, hostnqn: &str) -> Option<&Namespace> {
        self.namespace(nsid).filter(|n| n.visible_to(hostnqn))
    }
    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        self.allowed_hosts.is_empty() || self.allowed_hosts.iter().any(|h| h == hostnqn)
    }
    /// The ANA log page (see [`crate::ana::log_page`]) of this gateway's
    /// groups and the namespaces in them.
    /// Only the namespaces `hostnqn` sees are listed.
    pub fn ana_log_page(&self, groups_only: bool, hostnqn: &str) -> Vec<u8> {
        let members: Vec<(u32, u32)> = self.namespaces.iter().filter(|n| n.visible_to(hostnqn)).map(|n| (n.nsid, n.ana_group)).collect();
        crate::ana::log_page(&self.ana, &members, groups_only)
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

/// A subsystem that can change while hosts are connected (namespaces
/// added, removed, resized): every queue shares one cell and loads the
/// current [`Subsystem`] without a lock; the control path stores a new one.
#[derive(Debug)]
pub struct LiveSubsystem(arc_swap::ArcSwap<Subsystem>);

impl LiveSubsystem {
    pub fn new(s: Arc<Subsystem>) -> LiveSubsystem {
        LiveSubsystem(arc_swap::ArcSwap::new(s))
    }
    /// The current subsystem (a lock-free load).
    #[inline]
    pub fn load(&self) -> arc_swap::Guard<Arc<Subsystem>> {
        self.0.load()
    }
    #[inline]
    pub fn load_full(&self) -> Arc<Subsystem> {
        self.0.load_full()
    }
    pub fn store(&self, s: Arc<Subsystem>) {
        self.0.store(s)
    }
    pub fn nqn(&self) -> String {
        self.0.load().nqn.clone()
    }
}

/// The NSIDs whose namespace was added, removed or changed size between
/// two versions of a subsystem (what a Namespace Attribute Changed event
/// and the Changed Namespace List log report).
pub fn changed_namespaces(old: &Subsystem, new: &Subsystem) -> Vec<u32> {
    let mut ids: Vec<u32> = Vec::new();
    for n in &new.namespaces {
        match old.namespace(n.nsid) {
            Some(o) if o.blocks() == n.blocks() && o.volume.name() == n.volume.name() && o.readonly == n.readonly && (o.uuid, o.nguid, o.eui64) == (n.uuid, n.nguid, n.eui64) => {}
            _ => ids.push(n.nsid),
        }
    }
    ids.extend(old.namespaces.iter().filter(|o| new.namespace(o.nsid).is_none()).map(|o| o.nsid));
    ids.sort_unstable();
    ids
}

/// What host `hostnqn` is told of a change from `old` to `new` whose
/// namespaces `changed` (from [`changed_namespaces`], with resizes): the
/// changed ones it sees before or after, and those that appeared to it or
/// vanished from it because their host list changed. Hosts that see none
/// of it get no event.
pub fn changed_for_host(old: &Subsystem, new: &Subsystem, changed: &[u32], hostnqn: &str) -> Vec<u32> {
    let sees = |s: &Subsystem, nsid: u32| s.visible_namespace(nsid, hostnqn).is_some();
    let mut ids: Vec<u32> = changed.iter().copied().filter(|&n| sees(old, n) || sees(new, n)).collect();
    for n in &new.namespaces {
        if old.namespace(n.nsid).is_some() && sees(old, n.nsid) != sees(new, n.nsid) && !ids.contains(&n.nsid) {
            ids.push(n.nsid);
        }
    }
    ids.sort_unstable();
    ids
}
