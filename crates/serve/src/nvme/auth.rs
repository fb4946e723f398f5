//! In-band authentication (DH-HMAC-CHAP) on the target: which hosts must
//! authenticate, with which keys. Each queue's exchange, and what waits
//! for it, is `bw_nvme::target_queue` (with `bw_nvme::auth`).

use crate::config::NvmeConfig;
use bw_nvme::auth::{AuthConfig, SeqNum};
use std::collections::HashMap;
use std::sync::Arc;

/// Per (subsystem NQN, host NQN): the keys that host authenticates with.
#[derive(Debug)]
pub struct HostKeys {
    /// Read at Connect only; replaced by live changes.
    keys: std::sync::Mutex<HashMap<(String, String), Arc<AuthConfig>>>,
    /// Sequence numbers S1 for every challenge this target sends.
    pub seq: SeqNum,
}

impl Default for HostKeys {
    fn default() -> Self {
        HostKeys {
            keys: Default::default(),
            seq: SeqNum::new(0),
        }
    }
}

impl HostKeys {
    pub fn from_config(cfg: &NvmeConfig) -> anyhow::Result<HostKeys> {
        let keys = Self::keys(cfg)?;
        let seq = SeqNum::from_os()
            .map_err(|e| anyhow::anyhow!("no random numbers from the OS for DH-HMAC-CHAP: {e}"))?;
        Ok(HostKeys { keys: keys.into(), seq })
    }

    /// Take the hosts and keys of `cfg` (a live change); queues already
    /// logged in keep going, new ones use these. Returns what changed, a
    /// line per host, for the change's answer: new keys alone change no
    /// subsystem, and must not be answered with "no change".
    pub fn replace(&self, cfg: &NvmeConfig) -> anyhow::Result<Vec<String>> {
        let keys = Self::keys(cfg)?;
        let mut old = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let says = ["authenticates (DH-HMAC-CHAP) from its next Connect", "DH-HMAC-CHAP keys, hashes or groups changed (from its next Connect)", "no longer authenticates (DH-HMAC-CHAP)"];
        Ok(swap_host_keys(&mut old, keys, says))
    }

    fn keys(cfg: &NvmeConfig) -> anyhow::Result<HashMap<(String, String), Arc<AuthConfig>>> {
        let mut keys = HashMap::new();
        for s in &cfg.subsystems {
            for h in &s.hosts {
                let Some(a) = h
                    .auth_config()
                    .map_err(|e| anyhow::anyhow!("NVMe {} host {}: {e}", s.nqn, h.nqn))?
                else {
                    continue;
                };
                log::info!(
                    "nvme: {} requires DH-HMAC-CHAP from {}{} (hashes {:?}, groups {:?})",
                    s.nqn,
                    h.nqn,
                    if a.ctrl_key.is_some() {
                        ", and proves itself when asked"
                    } else {
                        ""
                    },
                    a.hashes.iter().map(|x| x.name()).collect::<Vec<_>>(),
                    a.groups.iter().map(|x| x.name()).collect::<Vec<_>>()
                );
                keys.insert((s.nqn.clone(), h.nqn.clone()), Arc::new(a));
            }
        }
        Ok(keys)
    }

    pub fn get(&self, subnqn: &str, hostnqn: &str) -> Option<Arc<AuthConfig>> {
        self.keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(subnqn.to_string(), hostnqn.to_string()))
            .cloned()
    }
}

/// Put `new` in place of `old` (keys by subsystem and host NQN) and say
/// what changed for the log, sorted: `says` is what a host that got keys,
/// whose keys changed and that lost them is told.
pub(super) fn swap_host_keys<V: PartialEq>(old: &mut HashMap<(String, String), V>, new: HashMap<(String, String), V>, says: [&str; 3]) -> Vec<String> {
    let [added, changed, removed] = says;
    let mut log = Vec::new();
    for ((sub, host), k) in &new {
        match old.get(&(sub.clone(), host.clone())) {
            None => log.push(format!("nvme {sub}: host {host} {added}")),
            Some(o) if o != k => log.push(format!("nvme {sub}: host {host}: {changed}")),
            Some(_) => {}
        }
    }
    for (sub, host) in old.keys().filter(|k| !new.contains_key(*k)) {
        log.push(format!("nvme {sub}: host {host} {removed}"));
    }
    log.sort();
    *old = new;
    log
}
