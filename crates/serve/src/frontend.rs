//! What the control plane asks of a protocol front-end, in one interface:
//! whether it can take a configuration, take it, list and end its
//! sessions, drain its paths, set a path's access state. The control
//! plane (bw-control's `Live`) holds a list of these and asks each the
//! same; it has no branch per protocol, so a new transport is a module
//! here that implements [`Frontend`] and a line in crate::start.

use crate::config::ServeConfig;
use crate::refused::Refused;
use crate::session::SessionInfo;
use crate::Volumes;
use std::collections::HashSet;

/// Every protocol front-end, each as it was started or not: a protocol
/// not started at start is in the list too, and refuses what needs it.
pub type Frontends = Vec<Box<dyn Frontend>>;

/// A path's asymmetric access state, as SCSI's ALUA (target port groups)
/// and NVMe's ANA (ANA groups) both have it, named for what initiators
/// do with the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessState {
    Optimized,
    NonOptimized,
    /// ALUA only: the path answers, but not reads and writes.
    Standby,
    /// ALUA's unavailable, ANA's inaccessible.
    Inaccessible,
    /// ANA only.
    PersistentLoss,
    /// ANA only: the state is changing.
    Change,
}

pub trait Frontend: Send + Sync {
    /// The protocol's name: its sessions' ids are `NAME:N`
    /// ([`SessionInfo::id`]), and how the control plane finds it.
    fn name(&self) -> &'static str;

    /// Refuse, before anything changes, going from `old` to `new` (both
    /// valid) if this front-end cannot serve `new` as it was started: a
    /// setting of its fixed at start that differs, or objects it would
    /// need sockets it did not open for.
    fn admit(&self, old: &ServeConfig, new: &ServeConfig) -> Result<(), Refused>;

    /// Serve `new`'s part for this protocol while initiators stay
    /// connected, telling them in the protocol's way; namespaces and LUNs
    /// on a volume in `resized` are reported changed. Returns what
    /// changed, for the log.
    fn reconcile(&self, new: &ServeConfig, volumes: &Volumes, resized: &HashSet<String>) -> Result<Vec<String>, Refused>;

    /// Its sessions (iSCSI sessions, NVMe controllers), or `None` for a
    /// protocol without sessions (AoE).
    fn sessions(&self) -> Option<Vec<SessionInfo>> {
        None
    }

    /// End the session whose id is `NAME:n`; false if there is none.
    fn disconnect(&self, _n: &str) -> bool {
        false
    }

    /// Every path it serves made inaccessible (`drain`); what changed.
    fn drain(&self) -> Vec<String> {
        Vec::new()
    }

    /// The access state of `target`'s paths (of its group `group`, if
    /// given) at run time; what changed, for the answer.
    fn set_access(&self, _target: &str, _group: Option<u32>, _state: AccessState) -> Result<String, Refused> {
        Err(Refused::Unsupported(format!("{} has no path states", self.name())))
    }
}

/// A setting fixed at start, refused by name.
pub fn fixed_at_start(what: &str) -> Refused {
    Refused::NeedsRestart(format!("{what} cannot change while serving: restart blockwire serve for that"))
}

/// A front-end that could not take a configuration it admitted (a port
/// it could not bind, a device that is gone): the variant by the system
/// error under it, if any.
pub fn failed(e: anyhow::Error) -> Refused {
    let message = format!("{e:#}");
    match e.chain().find_map(|c| c.downcast_ref::<std::io::Error>()) {
        Some(io) => Refused::by_kind(message, io),
        None => Refused::Io(message),
    }
}
