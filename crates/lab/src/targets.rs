//! Target-side processes, each started inside the target namespace on the
//! shared backing file: `blockwire serve` (AoE + iSCSI + NVMe/TCP at once),
//! tgtd (iSCSI) and vblade (AoE). A target that cannot start is reported with
//! its reason; the lab carries on with the others.

use crate::cleanup::{registry, Resource, Token};
use crate::topology::{ns_command, Link, Topology};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const LAB_IQN: &str = "iqn.2026-11.org.blockwire.lab:disk";
pub const TGT_IQN: &str = "iqn.2026-11.org.blockwire.lab:tgt";
pub const LAB_NQN: &str = "nqn.2026-11.org.blockwire.lab:disk";
pub const BLOCKWIRE_AOE: (u16, u8) = (1, 0);
pub const VBLADE_AOE: (u16, u8) = (2, 0);
pub const BLOCKWIRE_ISCSI_PORT: u16 = 3260;
pub const TGT_ISCSI_PORT: u16 = 3261;
pub const BLOCKWIRE_NVME_PORT: u16 = 4420;

/// Subject keys: `<target>-<protocol>`.
pub fn subject_key(target: &str, protocol: &str) -> String {
    format!("{target}-{protocol}")
}

/// The URL blockwire's client uses to reach `subject` over `link`.
pub fn url_for(subject: &str, link: &Link) -> Option<String> {
    let ip = link.target_ip;
    Some(match subject {
        "blockwire-aoe" => format!("aoe://{}/{}.{}", link.client_if, BLOCKWIRE_AOE.0, BLOCKWIRE_AOE.1),
        "vblade-aoe" => format!("aoe://{}/{}.{}", link.client_if, VBLADE_AOE.0, VBLADE_AOE.1),
        "blockwire-iscsi" => format!("iscsi://{ip}:{BLOCKWIRE_ISCSI_PORT}/{LAB_IQN}/0"),
        // tgt puts its controller on LUN 0; the disk is LUN 1.
        "tgt-iscsi" => format!("iscsi://{ip}:{TGT_ISCSI_PORT}/{TGT_IQN}/1"),
        "blockwire-nvme" => format!("nvme+tcp://{ip}:{BLOCKWIRE_NVME_PORT}/{LAB_NQN}/1"),
        _ => return None,
    })
}

/// A running target process with its stderr kept (last lines) for errors.
pub struct TargetProcess {
    pub name: String,
    pub pid: u32,
    child: Child,
    token: Token,
    log: Arc<Mutex<VecDeque<String>>>,
    extra: Vec<Token>,
}

impl TargetProcess {
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        crate::machine::process_cpu_seconds(self.pid)
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log_tail(&self) -> String {
        let g = self.log.lock().unwrap_or_else(|p| p.into_inner());
        g.iter().cloned().collect::<Vec<_>>().join(" | ")
    }

    pub fn stop(self) {
        let _ = registry().release(self.token);
        for t in self.extra {
            let _ = registry().release(t);
        }
        drop(self.child);
    }
}

/// Spawn `cmd` with stderr (and stdout) collected line by line into a ring
/// buffer; `ready` is sent the first time a line contains `ready_marker`.
fn spawn_logged(
    mut cmd: std::process::Command,
    what: &str,
    ready_marker: Option<&'static str>,
) -> anyhow::Result<(TargetProcess, mpsc::Receiver<()>)> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let (token, mut child) = registry().spawn(&mut cmd, what, crate::cleanup::Role::Service)?;
    let log = Arc::new(Mutex::new(VecDeque::new()));
    let (tx, rx) = mpsc::channel();
    let streams: Vec<Box<dyn std::io::Read + Send>> = vec![
        Box::new(child.stderr.take().expect("piped stderr")),
        Box::new(child.stdout.take().expect("piped stdout")),
    ];
    for stream in streams {
        let (log, tx) = (log.clone(), tx.clone());
        // Keep draining after "ready": a full pipe would block the target.
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if ready_marker.is_some_and(|m| line.contains(m)) {
                    let _ = tx.send(());
                }
                let mut g = log.lock().unwrap_or_else(|p| p.into_inner());
                if g.len() >= 20 {
                    g.pop_front();
                }
                g.push_back(line);
            }
        });
    }
    let pid = child.id();
    Ok((TargetProcess { name: what.to_string(), pid, child, token, log, extra: vec![] }, rx))
}

/// Wait for the ready line; on exit or timeout, stop it and return why.
fn await_ready(mut p: TargetProcess, rx: &mpsc::Receiver<()>, timeout: Duration) -> Result<TargetProcess, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if rx.recv_timeout(Duration::from_millis(100)).is_ok() {
            return Ok(p);
        }
        if !p.alive() {
            std::thread::sleep(Duration::from_millis(100)); // let the readers catch the last lines
            let why = format!("{} exited: {}", p.name, p.log_tail());
            p.stop();
            return Err(why);
        }
        if Instant::now() > deadline || crate::cleanup::interrupted() {
            let why = format!("{} not ready after {timeout:?}: {}", p.name, p.log_tail());
            p.stop();
            return Err(why);
        }
    }
}

/// The `blockwire serve --config` TOML for `protocols` on `link` (schema of
/// bw_serve::config; written as text so the lab does not link the target).
fn serve_config(link: &Link, backing: &Path, protocols: &[String]) -> String {
    let ip = link.target_ip;
    let q = |s: &str| toml::Value::String(s.to_string()).to_string();
    let mut t = format!("[[volume]]\nname = \"lab\"\nbackend = {}\n", q(&format!("file:{}", backing.display())));
    for p in protocols {
        match p.as_str() {
            "aoe" => {
                t += &format!(
                    "\n[[aoe.export]]\ninterface = {}\nvolume = \"lab\"\nshelf = {}\nslot = {}\n",
                    q(&link.target_if),
                    BLOCKWIRE_AOE.0,
                    BLOCKWIRE_AOE.1
                )
            }
            "iscsi" => {
                t += &format!(
                    "\n[iscsi]\nlisten = [\"{ip}:{BLOCKWIRE_ISCSI_PORT}\"]\n[[iscsi.target]]\niqn = {}\nluns = [{{ lun = 0, volume = \"lab\" }}]\n",
                    q(LAB_IQN)
                )
            }
            "nvme" => {
                t += &format!(
                    "\n[nvme]\nlisten = [\"{ip}:{BLOCKWIRE_NVME_PORT}\"]\ndiscovery_listen = \"{ip}:8009\"\n[[nvme.subsystem]]\nnqn = {}\nnamespaces = [{{ nsid = 1, volume = \"lab\" }}]\n",
                    q(LAB_NQN)
                )
            }
            _ => {}
        }
    }
    t
}

fn start_serve_once(
    exe: &Path,
    topo: &Topology,
    link: &Link,
    backing: &Path,
    protocols: &[String],
) -> Result<TargetProcess, String> {
    let text = serve_config(link, backing, protocols);
    let path = PathBuf::from(format!("/tmp/bwlab-{}-serve-{}.toml", std::process::id(), link.mtu));
    let (cfg_token, ()) = registry()
        .create(Resource::File(path.clone()), || Ok(std::fs::write(&path, &text)?))
        .map_err(|e| e.to_string())?;
    let mut cmd = ns_command(&topo.target_ns, &exe.to_string_lossy());
    cmd.args(["serve", "--config"]).arg(&path);
    let (mut p, rx) = match spawn_logged(cmd, "blockwire serve", Some("blockwire: ready")) {
        Ok(x) => x,
        Err(e) => {
            let _ = registry().release(cfg_token);
            return Err(e.to_string());
        }
    };
    p.extra.push(cfg_token);
    await_ready(p, &rx, Duration::from_secs(20))
}

/// Per protocol: `Ok` if it is served, `Err(reason)` if not.
pub type ProtocolStatus = Vec<(String, Result<(), String>)>;

/// Start one `blockwire serve` for all `protocols` at once. If that fails,
/// find out which protocols fail alone (each gets its own reason) and start
/// the rest together. Returns the process (if any protocol works) and, per
/// protocol, `Err(reason)` for those unavailable.
pub fn start_blockwire(
    exe: &Path,
    topo: &Topology,
    link: &Link,
    backing: &Path,
    protocols: &[String],
) -> (Option<TargetProcess>, ProtocolStatus) {
    if protocols.is_empty() {
        return (None, vec![]);
    }
    match start_serve_once(exe, topo, link, backing, protocols) {
        Ok(p) => return (Some(p), protocols.iter().map(|p| (p.clone(), Ok(()))).collect()),
        Err(e) if protocols.len() == 1 => return (None, vec![(protocols[0].clone(), Err(e))]),
        Err(e) => log::info!("serve with {protocols:?} failed ({e}); probing protocols one by one"),
    }
    let mut status = vec![];
    let mut working = vec![];
    for proto in protocols {
        match start_serve_once(exe, topo, link, backing, std::slice::from_ref(proto)) {
            Ok(p) => {
                p.stop();
                working.push(proto.clone());
                status.push((proto.clone(), Ok(())));
            }
            Err(e) => status.push((proto.clone(), Err(e))),
        }
    }
    if working.is_empty() {
        return (None, status);
    }
    match start_serve_once(exe, topo, link, backing, &working) {
        Ok(p) => (Some(p), status),
        Err(e) => (None, working.iter().map(|w| (w.clone(), Err(e.clone()))).collect()),
    }
}

fn tgtadm(topo: &Topology, port: u32, args: &[&str]) -> Result<(), String> {
    let out = ns_command(&topo.target_ns, "tgtadm")
        .args(["-C", &port.to_string(), "--lld", "iscsi"])
        .args(args)
        .output()
        .map_err(|e| format!("cannot run tgtadm: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("tgtadm {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// tgtd in the foreground with a control port of its own (so it never
/// meets a system tgtd), one target with the backing file as LUN 1.
pub fn start_tgt(topo: &Topology, link: &Link, backing: &Path) -> Result<TargetProcess, String> {
    // tgtd accepts control ports up to 32767.
    let port = 1_000 + std::process::id() % 31_000;
    // tgtd leaves its control socket and lock behind when killed.
    let sock = PathBuf::from(format!("/var/run/tgtd/socket.{port}"));
    let lock = PathBuf::from(format!("/var/run/tgtd/socket.{port}.lock"));
    let mut extra = vec![];
    for f in [sock, lock] {
        if let Ok((t, ())) = registry().create(Resource::File(f), || Ok(())) {
            extra.push(t);
        }
    }
    let mut cmd = ns_command(&topo.target_ns, "tgtd");
    cmd.args(["-f", "-C", &port.to_string(), "--iscsi", &format!("portal={}:{TGT_ISCSI_PORT}", link.target_ip)]);
    let (mut p, _rx) = spawn_logged(cmd, "tgtd", None).map_err(|e| e.to_string())?;
    p.extra = extra;
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
        vec!["--mode", "target", "--op", "new", "--tid", "1", "--targetname", TGT_IQN],
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

/// vblade exporting the backing file on the target veth. It prints nothing
/// when ready; it is ready once it has opened the socket, so give it a
/// moment and check it is still alive (the client's discovery retries).
pub fn start_vblade(topo: &Topology, link: &Link, backing: &Path) -> Result<TargetProcess, String> {
    let mut cmd = ns_command(&topo.target_ns, "vblade");
    cmd.args([&VBLADE_AOE.0.to_string(), &VBLADE_AOE.1.to_string(), &link.target_if])
        .arg(backing);
    let (mut p, _rx) = spawn_logged(cmd, "vblade", None).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(500));
    if !p.alive() {
        std::thread::sleep(Duration::from_millis(100));
        let why = format!("vblade exited: {}", p.log_tail());
        p.stop();
        return Err(why);
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn link() -> Link {
        Link {
            mtu: 9000,
            target_if: "bwl1at".into(),
            client_if: "bwl1ac".into(),
            target_ip: Ipv4Addr::new(198, 18, 1, 1),
            client_ip: Ipv4Addr::new(198, 18, 1, 2),
        }
    }

    #[test]
    fn urls_per_subject() {
        let l = link();
        assert_eq!(url_for("blockwire-aoe", &l).unwrap(), "aoe://bwl1ac/1.0");
        assert_eq!(url_for("vblade-aoe", &l).unwrap(), "aoe://bwl1ac/2.0");
        assert_eq!(url_for("tgt-iscsi", &l).unwrap(), format!("iscsi://198.18.1.1:3261/{TGT_IQN}/1"));
        assert_eq!(url_for("blockwire-nvme", &l).unwrap(), format!("nvme+tcp://198.18.1.1:4420/{LAB_NQN}/1"));
        assert!(url_for("nope", &l).is_none());
    }

    #[test]
    fn serve_config_is_well_formed_toml() {
        let all: Vec<String> = ["aoe", "iscsi", "nvme"].iter().map(|s| s.to_string()).collect();
        let text = serve_config(&link(), Path::new("/dev/shm/x.img"), &all);
        let v: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(v["volume"][0]["backend"].as_str(), Some("file:/dev/shm/x.img"));
        assert_eq!(v["aoe"]["export"][0]["interface"].as_str(), Some("bwl1at"));
        assert_eq!(v["aoe"]["export"][0]["shelf"].as_integer(), Some(1));
        assert_eq!(v["iscsi"]["listen"][0].as_str(), Some("198.18.1.1:3260"));
        assert_eq!(v["iscsi"]["target"][0]["iqn"].as_str(), Some(LAB_IQN));
        assert_eq!(v["iscsi"]["target"][0]["luns"][0]["lun"].as_integer(), Some(0));
        assert_eq!(v["nvme"]["subsystem"][0]["namespaces"][0]["nsid"].as_integer(), Some(1));
        let only_aoe: toml::Table = toml::from_str(&serve_config(&link(), Path::new("/x"), &all[..1])).unwrap();
        assert!(only_aoe.get("iscsi").is_none() && only_aoe.get("nvme").is_none());
    }
}
