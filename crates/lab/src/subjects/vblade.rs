//! vblade (AoE): exports the backing file on the target veth at its own
//! shelf, beside blockwire's.

use super::target::{Address, PeerTarget, Tool};
use crate::subjects::process::{spawn_logged, TargetProcess};
use crate::network::topology::{Link, Topology};
use std::path::Path;
use std::time::Duration;

/// AoE shelf and slot.
pub const AOE_ADDRESS: (u16, u8) = (2, 0);

pub struct Vblade;

impl PeerTarget for Vblade {
    fn name(&self) -> &'static str {
        "vblade"
    }

    fn address(&self) -> Address {
        Address::Aoe { shelf: AOE_ADDRESS.0, slot: AOE_ADDRESS.1 }
    }

    fn in_default_plan(&self) -> bool {
        true
    }

    fn tools(&self) -> &'static [Tool] {
        &[Tool { program: "vblade", package: "vblade" }]
    }

    fn version(&self) -> Option<String> {
        crate::command::package_version("vblade").map(|v| format!("vblade {v}"))
    }

    /// vblade prints nothing when ready; it is ready once it has opened the
    /// socket, so give it a moment and check it is still alive (the client's
    /// discovery retries).
    fn start(&self, topo: &Topology, link: &Link, backing: &Path) -> Result<TargetProcess, String> {
        let backing = backing.to_string_lossy();
        let args = [&AOE_ADDRESS.0.to_string(), &AOE_ADDRESS.1.to_string(), &link.target_if, &*backing];
        let cmd = topo.target.daemon_command("vblade", &args);
        let (mut p, _rx) = spawn_logged(&topo.target, cmd, "vblade", None, None).map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_millis(500));
        if !p.alive() {
            std::thread::sleep(Duration::from_millis(100));
            let why = format!("vblade exited: {}", p.log_tail());
            p.stop();
            return Err(why);
        }
        Ok(p)
    }
}
