//! blockwire's own target: one `blockwire serve` exporting the backing file
//! over every protocol asked for (AoE, iSCSI and NVMe/TCP at once).

use super::target::{Address, Protocol};
use crate::cleanup::registry;
use crate::hosts::host::Host;
use crate::subjects::process::{await_ready, spawn_logged, TargetProcess};
use crate::network::topology::Link;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const NAME: &str = "blockwire";
pub const IQN: &str = "iqn.2026-11.org.blockwire.lab:disk";
pub const NQN: &str = "nqn.2026-11.org.blockwire.lab:disk";
/// AoE shelf and slot.
pub const AOE_ADDRESS: (u16, u8) = (1, 0);
pub const ISCSI_PORT: u16 = 3260;
pub const NVME_PORT: u16 = 4420;
/// With `--tls on`: the host NQN `blockwire bench` connects as, and its
/// PSK (`nvme gen-tls-key` form). A fixed key of the lab's own: the lab
/// measures what encryption costs on its links, not what it hides.
pub const TLS_HOST: &str = "nqn.2026-11.org.blockwire.lab:tls-client";
pub const TLS_PSK: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
/// Not NVMe/TCP's port: an iWARP device's connection manager shares the
/// TCP port space.
pub const NVME_RDMA_PORT: u16 = 4421;

/// Where `blockwire serve` serves the volume over protocol `p`.
pub fn address(p: Protocol) -> Address {
    match p {
        Protocol::Aoe => Address::Aoe { shelf: AOE_ADDRESS.0, slot: AOE_ADDRESS.1 },
        Protocol::Iscsi => Address::Iscsi { iqn: IQN, port: ISCSI_PORT, lun: 0 },
        Protocol::Nvme => Address::Nvme { nqn: NQN, port: NVME_PORT },
        Protocol::NvmeRdma => Address::NvmeRdma { nqn: NQN, port: NVME_RDMA_PORT },
    }
}

/// What `blockwire serve` exports, over which protocols, where.
pub struct Serve<'a> {
    pub exe: &'a Path,
    pub host: &'a Host,
    pub link: &'a Link,
    /// The volume's backend in serve's syntax (`file:PATH`, `ram:SIZE`).
    pub backend: String,
    /// Where serve's output goes besides the lab's memory of its last lines.
    pub log: Option<PathBuf>,
    /// How long it may take to say it is ready.
    pub ready_within: Duration,
    /// CRC32C digests with portable tables (`[tuning] digest_impl`).
    pub soft_digest: bool,
    /// NVMe/TCP requires TLS ([`TLS_HOST`] with [`TLS_PSK`]).
    pub tls: bool,
}

/// `blockwire bench` options for an NVMe/TCP subject over TLS: the host
/// the target knows the PSK of, and the PSK.
pub fn tls_bench_args() -> [&'static str; 4] {
    ["--initiator-name", TLS_HOST, "--tls-psk", TLS_PSK]
}

/// The record layer serve's log says its last TLS connection got
/// (`nvme: PEER on PORT: TLS SUITE as "ID" (..), records LAYER`): `TLS
/// SUITE LAYER records` (user: user space; ktls: the kernel's; no comma:
/// a subject's datapaths are a comma-separated list).
pub fn tls_records(log: &str) -> Option<String> {
    const RECORDS: &str = ", records ";
    let at = log.rfind(RECORDS)?;
    let before = &log[..at];
    let suite = before[before.rfind(": TLS ")? + ": TLS ".len()..].split(' ').next()?;
    let layer: String = log[at + RECORDS.len()..].chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
    (!layer.is_empty()).then(|| format!("TLS {suite} {layer} records"))
}

/// The TLS of blockwire's client as its bench report names the target
/// (`URL (controller 1, 2 I/O queues, TLS SUITE, LAYER)`): `(SUITE,
/// LAYER)`, LAYER `user` or `ktls`.
pub fn client_tls(described: &str) -> Option<(String, String)> {
    let at = described.rfind(", TLS ")? + ", TLS ".len();
    let mut parts = described[at..].trim_end_matches(')').splitn(2, ", ");
    let suite = parts.next()?.trim();
    let layer: String = parts.next()?.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
    (!suite.is_empty() && !layer.is_empty()).then(|| (suite.to_string(), layer))
}

/// The `blockwire serve --config` TOML for `protocols` on `link` (schema of
/// bw_serve::config; written as text so the lab does not link the target);
/// with `tls`, NVMe/TCP requires TLS from [`TLS_HOST`].
fn serve_config(link: &Link, backend: &str, protocols: &[Protocol], tls: bool) -> String {
    let ip = link.target_ip;
    let q = |s: &str| toml::Value::String(s.to_string()).to_string();
    // The lab's serve is built from this file alone: its control methods
    // (the default socket) may name no file (docs/control.md).
    let mut t = format!("[control]\nallowed_paths = []\n\n[[volume]]\nname = \"lab\"\nbackend = {}\n", q(backend));
    for p in protocols {
        match p {
            Protocol::Aoe => {
                t += &format!(
                    "\n[[aoe.export]]\ninterface = {}\nvolume = \"lab\"\nshelf = {}\nslot = {}\n",
                    q(&link.target_if),
                    AOE_ADDRESS.0,
                    AOE_ADDRESS.1
                )
            }
            Protocol::Iscsi => {
                t += &format!(
                    "\n[iscsi]\nlisten = [\"{ip}:{ISCSI_PORT}\"]\n[[iscsi.target]]\niqn = {}\nluns = [{{ lun = 0, volume = \"lab\" }}]\n",
                    q(IQN)
                )
            }
            // One [nvme] table for both transports, below.
            Protocol::Nvme | Protocol::NvmeRdma => {}
        }
    }
    let (tcp, rdma) = (protocols.contains(&Protocol::Nvme), protocols.contains(&Protocol::NvmeRdma));
    if tcp || rdma {
        t += "\n[nvme]\n";
        if tcp {
            t += &format!("listen = [\"{ip}:{NVME_PORT}\"]\ndiscovery_listen = \"{ip}:8009\"\n");
            if tls {
                t += "tls = \"required\"\n";
            }
        }
        if rdma {
            t += &format!("rdma_listen = [\"{ip}:{NVME_RDMA_PORT}\"]\n");
        }
        t += &format!("[[nvme.subsystem]]\nnqn = {}\nnamespaces = [{{ nsid = 1, volume = \"lab\" }}]\n", q(NQN));
        if tcp && tls {
            t += &format!("[[nvme.subsystem.host]]\nnqn = {}\ntls_psk = {}\n", q(TLS_HOST), q(TLS_PSK));
        }
    }
    t
}

/// The AoE datapath serve's log names (`aoe IFACE: datapath xdp (...)`).
pub fn aoe_datapath(log: &str) -> Option<String> {
    const MARK: &str = ": datapath ";
    let at = log.find(MARK)? + MARK.len();
    let name: String = log[at..].chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
    (!name.is_empty()).then_some(name)
}

/// Start serve and wait (at most 20 s) for its ready line.
fn start_serve_once(serve: &Serve, protocols: &[Protocol]) -> Result<TargetProcess, String> {
    let mut text = serve_config(serve.link, &serve.backend, protocols, serve.tls);
    if serve.soft_digest {
        text += "\n[tuning]\ndigest_impl = \"soft\"\n";
    }

    let path = serve.host.run_path("/tmp", &format!("serve-{}-{}.toml", serve.host.name(), serve.link.mtu));
    let cfg_token = serve.host.create_file(&path, text.as_bytes()).map_err(|e| e.to_string())?;
    let exe = serve.host.lab_exe(serve.exe);
    let cmd = serve.host.daemon_command(&exe.to_string_lossy(), &["serve", "--config", &path.to_string_lossy()]);
    let spawned = spawn_logged(serve.host, cmd, "blockwire serve", Some(crate::subjects::process::SERVE_READY), serve.log.as_deref());
    let (mut p, rx) = match spawned {
        Ok(x) => x,
        Err(e) => {
            let _ = registry().release(cfg_token);
            return Err(e.to_string());
        }
    };
    p.keep_until_stopped(cfg_token);
    await_ready(p, &rx, serve.ready_within)
}

/// Per protocol: `Ok` if it is served, `Err(reason)` if not.
pub type ProtocolStatus = Vec<(Protocol, Result<(), String>)>;

/// Start one `blockwire serve` for all `protocols` at once. If that fails,
/// find out which protocols fail alone (each gets its own reason) and start
/// the rest together. Returns the process (if any protocol works) and, per
/// protocol, `Err(reason)` for those unavailable.
pub fn start(serve: &Serve, protocols: &[Protocol]) -> (Option<TargetProcess>, ProtocolStatus) {
    if protocols.is_empty() {
        return (None, vec![]);
    }
    match start_serve_once(serve, protocols) {
        Ok(p) => return (Some(p), protocols.iter().map(|&p| (p, Ok(()))).collect()),
        Err(e) if protocols.len() == 1 => return (None, vec![(protocols[0], Err(e))]),
        Err(e) => log::info!("serve with {protocols:?} failed ({e}); probing protocols one by one"),
    }
    let mut status = vec![];
    let mut working = vec![];
    for &proto in protocols {
        match start_serve_once(serve, &[proto]) {
            Ok(p) => {
                p.stop();
                working.push(proto);
                status.push((proto, Ok(())));
            }
            Err(e) => status.push((proto, Err(e))),
        }
    }
    if working.is_empty() {
        return (None, status);
    }
    match start_serve_once(serve, &working) {
        Ok(p) => (Some(p), status),
        Err(e) => (None, working.iter().map(|&w| (w, Err(e.clone()))).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_config_is_well_formed_toml() {
        let link = crate::network::topology::test_link();
        let all = Protocol::ALL;
        let text = serve_config(&link, "file:/dev/shm/x.img", &all, false);
        let v: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(v["volume"][0]["backend"].as_str(), Some("file:/dev/shm/x.img"));
        assert_eq!(v["control"]["allowed_paths"].as_array().map(Vec::len), Some(0));
        assert_eq!(v["aoe"]["export"][0]["interface"].as_str(), Some("bwl1at"));
        assert_eq!(v["aoe"]["export"][0]["shelf"].as_integer(), Some(1));
        assert_eq!(v["iscsi"]["listen"][0].as_str(), Some("198.18.1.1:3260"));
        assert_eq!(v["iscsi"]["target"][0]["iqn"].as_str(), Some(IQN));
        assert_eq!(v["iscsi"]["target"][0]["luns"][0]["lun"].as_integer(), Some(0));
        assert_eq!(v["nvme"]["subsystem"][0]["namespaces"][0]["nsid"].as_integer(), Some(1));
        let only_aoe: toml::Table = toml::from_str(&serve_config(&link, "file:/x", &all[..1], false)).unwrap();
        assert!(only_aoe.get("iscsi").is_none() && only_aoe.get("nvme").is_none());
        assert!(v["nvme"].get("rdma_listen").is_none());
        // Both NVMe transports share one [nvme] table and subsystem.
        let both: toml::Table = toml::from_str(&serve_config(&link, "file:/x", &[Protocol::NvmeRdma, Protocol::Nvme], false)).unwrap();
        assert_eq!(both["nvme"]["listen"][0].as_str(), Some("198.18.1.1:4420"));
        assert_eq!(both["nvme"]["rdma_listen"][0].as_str(), Some("198.18.1.1:4421"));
        assert_eq!(both["nvme"]["subsystem"].as_array().map(|a| a.len()), Some(1));
        let rdma: toml::Table = toml::from_str(&serve_config(&link, "file:/x", &[Protocol::NvmeRdma], false)).unwrap();
        assert!(rdma["nvme"].get("listen").is_none() && rdma["nvme"].get("discovery_listen").is_none());
        // --tls on: NVMe/TCP requires it, from the lab's host with its PSK.
        let tls: toml::Table = toml::from_str(&serve_config(&link, "file:/x", &all, true)).unwrap();
        assert_eq!(tls["nvme"]["tls"].as_str(), Some("required"));
        assert_eq!(tls["nvme"]["subsystem"][0]["host"][0]["nqn"].as_str(), Some(TLS_HOST));
        assert_eq!(tls["nvme"]["subsystem"][0]["host"][0]["tls_psk"].as_str(), Some(TLS_PSK));
        assert!(v["nvme"].get("tls").is_none() && v["nvme"]["subsystem"][0].get("host").is_none());
    }

    #[test]
    fn tls_records_are_read_from_the_log() {
        let log = "nvme: 10.0.0.2:5 on 10.0.0.1:4420: TLS TLS_AES_128_GCM_SHA256 as \"NVMe0R01 h s\" (s's PSK derived by RFC 8446), records user\nblockwire: x";
        assert_eq!(tls_records(log).as_deref(), Some("TLS TLS_AES_128_GCM_SHA256 user records"));
        assert_eq!(tls_records("blockwire: ready"), None);
        // As the lab's log tail joins lines.
        assert_eq!(tls_records("a | nvme: p on q: TLS TLS_AES_256_GCM_SHA384 as \"x\" (), records ktls | b").as_deref(), Some("TLS TLS_AES_256_GCM_SHA384 ktls records"));
    }

    #[test]
    fn client_tls_is_read_from_the_bench_report() {
        let d = "nvme+tcp://198.18.1.1:4422/nqn.x:nvmet/1?tls (controller 1, 2 I/O queues, TLS TLS_AES_128_GCM_SHA256, ktls)";
        assert_eq!(client_tls(d), Some(("TLS_AES_128_GCM_SHA256".into(), "ktls".into())));
        assert_eq!(client_tls("nvme+tcp://h:1/n/1 (controller 1, 2 I/O queues)"), None);
        // A SHA-384 PSK bound with SHA-256 (Linux nvmet): the binding comes after.
        let d = "nvme+tcp://h:1/n/1?tls (controller 1, 2 I/O queues, TLS TLS_CHACHA20_POLY1305_SHA256, user, SHA-384 PSK bound with SHA-256 as tlshd 1.0 does)";
        assert_eq!(client_tls(d), Some(("TLS_CHACHA20_POLY1305_SHA256".into(), "user".into())));
    }

    #[test]
    fn aoe_datapath_is_read_from_the_log() {
        let log = "aoe bwl1at: AF_XDP not used, AF_PACKET instead: no | aoe bwl1at: datapath packet (AF_PACKET), 1 sockets | blockwire: ready";
        assert_eq!(aoe_datapath(log).as_deref(), Some("packet"));
        assert_eq!(aoe_datapath("aoe x: datapath xdp (AF_XDP (copy mode, generic XDP)), 1 sockets").as_deref(), Some("xdp"));
        assert_eq!(aoe_datapath("blockwire: ready"), None);
    }
}
