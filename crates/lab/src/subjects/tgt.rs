//! tgt (iSCSI): tgtd in the foreground with a control port of its own (so it
//! never meets a system tgtd), one target with the backing file as LUN 1.

use super::target::{Address, PeerTarget, Tool};
use crate::subjects::process::{spawn_logged, TargetProcess};
use crate::network::topology::{Link, Topology};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const IQN: &str = "iqn.2026-11.org.blockwire.lab:tgt";
pub const ISCSI_PORT: u16 = 3261;

pub struct Tgt;

fn tgtadm(topo: &Topology, port: u32, args: &[&str]) -> Result<(), String> {
    let port = port.to_string();
    let all: Vec<&str> = ["-C", &port, "--lld", "iscsi"].into_iter().chain(args.iter().copied()).collect();
    let out = topo
        .target
        .command_with("tgtadm", &all)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run tgtadm: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("tgtadm {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl PeerTarget for Tgt {
    fn name(&self) -> &'static str {
        "tgt"
    }

    // tgt puts its controller on LUN 0; the disk is LUN 1.
    fn address(&self) -> Address {
        Address::Iscsi { iqn: IQN, port: ISCSI_PORT, lun: 1 }
    }

    fn in_default_plan(&self) -> bool {
        true
    }

    fn tools(&self) -> &'static [Tool] {
        &[Tool { program: "tgtd", package: "tgt" }, Tool { program: "tgtadm", package: "tgt" }]
    }

    fn version(&self) -> Option<String> {
        crate::command::package_version("tgt").map(|v| format!("tgt {v}"))
    }

    fn start(&self, topo: &Topology, link: &Link, backing: &Path) -> Result<TargetProcess, String> {
        // tgtd accepts control ports up to 32767.
        let port = 1_000 + std::process::id() % 31_000;
        // tgtd leaves its control socket and lock behind when killed.
        let sock = PathBuf::from(format!("/var/run/tgtd/socket.{port}"));
        let lock = PathBuf::from(format!("/var/run/tgtd/socket.{port}.lock"));
        let mut leftovers = vec![];
        for f in [sock, lock] {
            if let Ok(t) = topo.target.track_file(&f) {
                leftovers.push(t);
            }
        }
        let portal = format!("portal={}:{ISCSI_PORT}", link.target_ip);
        let cmd = topo.target.daemon_command("tgtd", &["-f", "-C", &port.to_string(), "--iscsi", &portal]);
        let (mut p, _rx) = spawn_logged(&topo.target, cmd, "tgtd", None, None).map_err(|e| e.to_string())?;
        for t in leftovers {
            p.keep_until_stopped(t);
        }
        // Ready when its control socket answers.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if tgtadm(topo, port, &["--mode", "target", "--op", "show"]).is_ok() {
                break;
            }
            if !p.alive() || Instant::now() > deadline {
                let why = format!("tgtd did not start: {}", p.log_tail());
                p.stop();
                return Err(why);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let backing_s = backing.to_string_lossy();
        let setup = [
            vec!["--mode", "target", "--op", "new", "--tid", "1", "--targetname", IQN],
            vec!["--mode", "logicalunit", "--op", "new", "--tid", "1", "--lun", "1", "--backing-store", &backing_s],
            vec!["--mode", "target", "--op", "bind", "--tid", "1", "--initiator-address", "ALL"],
        ];
        for args in setup {
            if let Err(e) = tgtadm(topo, port, &args) {
                p.stop();
                return Err(e);
            }
        }
        Ok(p)
    }
}
