//! Two network namespaces (target side, client side) joined by one veth pair
//! per MTU. Every protocol, blockwire's and the peers', crosses the same veth,
//! so their wire counters and latencies are comparable.
//!
//! Addresses come from 198.18.0.0/15, the range set aside for benchmarking
//! (RFC 2544); they exist only inside the two namespaces the lab creates.

use crate::cleanup::{registry, Resource, Token, Undo};
use crate::command::sh;
use crate::hosts::host::Host;
use crate::hosts::local_state::CongestionLock;
use bw_lab_results::net::WireCounters;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};

/// An Ethernet header's bytes (ETH_HLEN), which a veth leaves out of its
/// byte counters for frames it receives through NAPI (see
/// [`Topology::client_counters`]).
const ETH_HLEN: u64 = 14;

#[derive(Debug, Clone)]
pub struct Link {
    pub mtu: u32,
    pub target_if: String,
    pub client_if: String,
    pub target_ip: Ipv4Addr,
    pub client_ip: Ipv4Addr,
}

#[derive(Debug)]
pub struct Topology {
    /// Where the targets run.
    pub target: Host,
    /// Where the clients run.
    pub client: Host,
    pub links: Vec<Link>,
    /// Every veth took the default link's offloads (TSO/GSO off, GRO on: see
    /// `Offload::MtuFrames`).
    pub offloads_off: bool,
    /// Between real hosts: the NICs are the machines' own (no qdiscs, no
    /// offload or sysctl changes), and AoE needs them on one layer-2 segment.
    pub remote: bool,
    /// The client reaches the target through a router (no AoE).
    pub routed: bool,
    /// The links' offloads are ours to change: true for the veths the lab
    /// creates; a topology over real NICs sets it only when the user allows
    /// NIC changes (`--allow-nic-changes`), else `--offload` is refused.
    pub nic_changes_allowed: bool,
    /// Both ends of every link receive through NAPI (the lab's veths with
    /// GRO on): their byte counters leave out each frame's Ethernet header.
    napi_rx: AtomicBool,
    /// Every link end's offloads as they were before the lab changed them.
    saved_offloads: Vec<crate::network::offload::Saved>,
    tokens: Vec<Token>,
}

/// The hosts of a run across machines (`--target-host`, `--client-host`).
#[derive(Debug, Clone)]
pub struct Remote {
    pub target: Host,
    pub client: Host,
    /// The target's address on the storage network (`--data-addr`).
    pub data_addr: Option<Ipv4Addr>,
    /// `--allow-nic-changes`: the MTU may be set (and is restored).
    pub allow_nic_changes: bool,
    /// `--mtu` as given (None: the NICs' own).
    pub mtu: Option<u32>,
}

/// A link as the subjects' tests address it (MTU 9000).
#[cfg(test)]
pub(crate) fn test_link() -> Link {
    Link {
        mtu: 9000,
        target_if: "bwl1at".into(),
        client_if: "bwl1ac".into(),
        target_ip: Ipv4Addr::new(198, 18, 1, 1),
        client_ip: Ipv4Addr::new(198, 18, 1, 2),
    }
}

/// The first IPv4 address `name` resolves to, on this machine.
pub fn resolve_v4(name: &str) -> anyhow::Result<Ipv4Addr> {
    if let Ok(ip) = name.parse() {
        return Ok(ip);
    }
    let out = sh("getent", &["ahostsv4", name]).map_err(|_| anyhow::anyhow!("{name} does not resolve to an IPv4 address (give --data-addr)"))?;
    out.split_whitespace()
        .next()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("{name} does not resolve to an IPv4 address (give --data-addr)"))
}

/// `ip -j` output's first object's string field `key`.
fn json_field(text: &str, key: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    v.get(0)?.get(key)?.as_str().map(|s| s.to_string())
}

/// The MTU of `dev` on `host`.
/// A device's MTU as it was before the run changed it: put back.
#[derive(Debug)]
struct MtuBefore {
    host: Host,
    dev: String,
    mtu: u32,
}

impl Undo for MtuBefore {
    fn undo(&self) -> anyhow::Result<()> {
        self.host.set_mtu(&self.dev, self.mtu)
    }
}

/// The algorithms a network namespace other than the first may take as its
/// default (the first namespace's list: the kernel refuses any other with
/// EPERM, whoever asks).
const ALLOWED_CONGESTION: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";

/// `list` (an allowed list as the kernel prints it) with `cc` added, or
/// `None` where it is there already.
fn allowed_with(list: &str, cc: &str) -> Option<String> {
    let names: Vec<&str> = list.split_whitespace().collect();
    (!names.contains(&cc)).then(|| names.into_iter().chain([cc]).collect::<Vec<_>>().join(" "))
}

/// The allowed list as it was before the run added an algorithm: put back.
#[derive(Debug)]
struct AllowedCongestionBefore(String);

impl Undo for AllowedCongestionBefore {
    fn undo(&self) -> anyhow::Result<()> {
        let _lock = CongestionLock::take()?;
        std::fs::write(ALLOWED_CONGESTION, format!("{}\n", self.0)).map_err(|e| anyhow::anyhow!("{ALLOWED_CONGESTION}: {e}"))
    }
}

/// Let the lab's namespaces take `cc` as their default (`--tcp-congestion`).
/// The allowed list holds the system's default and reno unless an
/// administrator widened it: on Debian with BBR chosen, "reno bbr", so
/// `--tcp-congestion cubic` failed with sysctl's bare "Operation not
/// permitted". The run adds `cc` to it, written to its state
/// file first (`write FILE VALUE`) and put back at its end. A namespace
/// keeps the default it took when the list shrinks again, so a run that
/// restores the list does not change another run's namespaces. Called
/// under [`CongestionLock`].
fn allow_congestion(cc: &str, tokens: &mut Vec<Token>) -> anyhow::Result<()> {
    let list = std::fs::read_to_string(ALLOWED_CONGESTION).map_err(|e| anyhow::anyhow!("{ALLOWED_CONGESTION}: {e}"))?;
    let list = list.trim().to_string();
    let Some(wider) = allowed_with(&list, cc) else { return Ok(()) };
    crate::hosts::local_state::record("write", ALLOWED_CONGESTION, &list)?;
    let (t, ()) = registry().create(Resource::owned(AllowedCongestionBefore(list.clone())), || {
        std::fs::write(ALLOWED_CONGESTION, format!("{wider}\n")).map_err(|e| {
            anyhow::anyhow!(
                "--tcp-congestion {cc}: cannot add it to {ALLOWED_CONGESTION} ({list}), which the lab's namespaces need: {e} (the kernel has: {})",
                bw_net::tcp::available().unwrap_or_default()
            )
        })
    })?;
    tokens.push(t);
    Ok(())
}

fn mtu_of(host: &Host, dev: &str) -> anyhow::Result<u32> {
    let out = host.ip(&["-j", "link", "show", "dev", dev])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    v.get(0)
        .and_then(|l| l.get("mtu"))
        .and_then(|m| m.as_u64())
        .map(|m| m as u32)
        .ok_or_else(|| anyhow::anyhow!("no MTU for {dev} on {}", host.name()))
}

/// The interface holding address `ip` on `host` (`ip -j -4 addr show`).
fn dev_with_addr(host: &Host, ip: Ipv4Addr) -> anyhow::Result<Option<String>> {
    let out = host.ip(&["-j", "-4", "addr", "show"])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    for l in v.as_array().into_iter().flatten() {
        let has = l
            .get("addr_info")
            .and_then(|a| a.as_array())
            .is_some_and(|a| a.iter().any(|x| x.get("local").and_then(|x| x.as_str()) == Some(&ip.to_string())));
        if has {
            return Ok(l.get("ifname").and_then(|n| n.as_str()).map(|s| s.to_string()));
        }
    }
    Ok(None)
}

/// Names unique per lab process: namespaces `bwlab<pid>t|c`, veths
/// `bwl<pid><a..>t|c` (at most 15 bytes, the kernel's limit).
pub fn names(pid: u32) -> (String, String) {
    (format!("bwlab{pid}t"), format!("bwlab{pid}c"))
}

pub fn veth_names(pid: u32, index: usize) -> (String, String) {
    let idx = (b'a' + (index as u8 % 26)) as char;
    (format!("bwl{pid}{idx}t"), format!("bwl{pid}{idx}c"))
}

impl Topology {
    /// `tcp_congestion`: the algorithm both namespaces' TCP connections use
    /// (None: what new namespaces inherit from the system).
    pub fn setup(mtus: &[u32], tcp_congestion: Option<&str>) -> anyhow::Result<Topology> {
        anyhow::ensure!(mtus.len() <= 26, "at most 26 MTUs");
        let pid = std::process::id();
        let (tns, cns) = names(pid);
        let reg = registry();
        let mut tokens = vec![];
        // Until both namespaces have taken `tcp_congestion` (see CongestionLock).
        let congestion_lock = tcp_congestion.map(|_| CongestionLock::take()).transpose()?;
        if let Some(cc) = tcp_congestion {
            allow_congestion(cc, &mut tokens)?;
        }
        let (target, client) = (Host::LocalNamespace(tns.clone()), Host::LocalNamespace(cns.clone()));
        for host in [&target, &client] {
            let ns = host.name();
            let (t, ()) = reg.create(Resource::Netns(ns.to_string()), || {
                sh("ip", &["netns", "add", ns])?;
                Ok(())
            })?;
            tokens.push(t);
            host.ip(&["link", "set", "lo", "up"])?;
            // No IPv6 chatter (router solicitations, DAD) in the wire counters.
            let _ = host.run("sysctl", &["-qw", "net.ipv6.conf.all.disable_ipv6=1"]);
            let _ = host.run("sysctl", &["-qw", "net.ipv6.conf.default.disable_ipv6=1"]);
            if let Some(cc) = tcp_congestion {
                host.run("sysctl", &["-qw", &format!("net.ipv4.tcp_congestion_control={cc}")])?;
            }
        }
        drop(congestion_lock);
        let mut links = vec![];
        let mut offloads_off = true;
        let mut saved_offloads = vec![];
        for (i, &mtu) in mtus.iter().enumerate() {
            let (tif, cif) = veth_names(pid, i);
            let (t, ()) = reg.create(Resource::Veth { ns: Some(tns.clone()), name: tif.clone() }, || {
                sh("ip", &["link", "add", &tif, "netns", &tns, "type", "veth", "peer", "name", &cif, "netns", &cns])?;
                Ok(())
            })?;
            tokens.push(t);
            let target_ip = Ipv4Addr::new(198, 18, i as u8, 1);
            let client_ip = Ipv4Addr::new(198, 18, i as u8, 2);
            for (host, ifname, ip) in [(&target, &tif, target_ip), (&client, &cif, client_ip)] {
                host.set_mtu(ifname, mtu)?;
                host.ip(&["addr", "add", &format!("{ip}/24"), "dev", ifname])?;
                match crate::network::offload::Saved::take(host, ifname) {
                    Ok(saved) => saved_offloads.push(saved),
                    Err(e) => log::warn!("cannot read the offloads of {ifname}: {e}"),
                }
                if let Err(e) = crate::network::offload::Offload::MtuFrames.apply(host, ifname) {
                    log::warn!("cannot switch offloads off on {ifname}: {e}");
                    offloads_off = false;
                }
                host.ip(&["link", "set", ifname, "up"])?;
            }
            links.push(Link { mtu, target_if: tif, client_if: cif, target_ip, client_ip });
        }
        let napi_rx = AtomicBool::new(offloads_off && crate::network::offload::Offload::MtuFrames.veth_rx_napi());
        let topo = Topology { target, client, links, offloads_off, remote: false, routed: false, nic_changes_allowed: true, napi_rx, saved_offloads, tokens };
        topo.wait_reachable()?;
        Ok(topo)
    }

    /// The link between two existing hosts: the target's address (its ssh
    /// address, or `--data-addr`), the client's route to it, the interfaces
    /// at both ends and their MTU. The NICs keep their MTU unless
    /// `--allow-nic-changes` lets the lab set `mtu` (restored at the end).
    pub fn connect(r: &Remote) -> anyhow::Result<Topology> {
        let target_ip = match (&r.data_addr, r.target.network_name()) {
            (Some(a), _) => *a,
            (None, Some(name)) => resolve_v4(name)?,
            (None, None) => anyhow::bail!("no address for the target host {}: give --data-addr", r.target.name()),
        };
        let route = r.client.ip(&["-j", "-4", "route", "get", &target_ip.to_string()])?;
        let client_if = json_field(&route, "dev").ok_or_else(|| anyhow::anyhow!("the client host has no route to {target_ip}"))?;
        let client_ip: Ipv4Addr = json_field(&route, "prefsrc")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("the client host has no source address towards {target_ip}"))?;
        let routed = json_field(&route, "gateway").is_some();
        let target_if = dev_with_addr(&r.target, target_ip)?
            .ok_or_else(|| anyhow::anyhow!("{target_ip} is not an address of the target host {} (--data-addr)", r.target.name()))?;
        let mut tokens = vec![];
        let mut link_mtu = mtu_of(&r.client, &client_if)?.min(mtu_of(&r.target, &target_if)?);
        if let Some(want) = r.mtu.filter(|m| *m != link_mtu) {
            anyhow::ensure!(
                r.allow_nic_changes,
                "the NICs have MTU {link_mtu}, --mtu asks for {want}: the lab changes a real NIC's MTU only with --allow-nic-changes"
            );
            for (host, dev) in [(&r.target, &target_if), (&r.client, &client_if)] {
                let before = mtu_of(host, dev)?;
                if before == want {
                    continue;
                }
                host.record("mtu", dev, &before.to_string())?;
                let res = Resource::owned(MtuBefore { host: host.clone(), dev: dev.clone(), mtu: before });
                let made = registry().create(res, || host.set_mtu(dev, want));
                match made {
                    Ok((t, ())) => tokens.push(t),
                    Err(e) => {
                        for t in tokens.into_iter().rev() {
                            let _ = registry().release(t);
                        }
                        anyhow::bail!("{}: MTU not settable on {dev}: {e:#}", host.name());
                    }
                }
            }
            link_mtu = want;
        }
        // Offloads of real NICs change only with --allow-nic-changes; what
        // they were is kept to put back at the end, and written to the
        // host's state file first, so a killed run's next run puts them back.
        let mut saved_offloads = vec![];
        if r.allow_nic_changes {
            for (host, dev) in [(&r.target, &target_if), (&r.client, &client_if)] {
                let saved = crate::network::offload::Saved::take(host, dev)?;
                host.record("offload", dev, &saved.ethtool_args())?;
                saved_offloads.push(saved);
            }
        }
        let links = vec![Link { mtu: link_mtu, target_if, client_if, target_ip, client_ip }];
        Ok(Topology {
            target: r.target.clone(),
            client: r.client.clone(),
            links,
            offloads_off: false,
            remote: true,
            routed,
            nic_changes_allowed: r.allow_nic_changes,
            napi_rx: AtomicBool::new(false),
            saved_offloads,
            tokens,
        })
    }

    /// Wait until both ends of every link report carrier (operstate UP);
    /// veth carrier comes up asynchronously after `link set up`.
    fn wait_reachable(&self) -> anyhow::Result<()> {
        for l in &self.links {
            for (host, ifname) in [(&self.target, &l.target_if), (&self.client, &l.client_if)] {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                loop {
                    let out = host.ip(&["-j", "link", "show", "dev", ifname])?;
                    if out.contains("\"operstate\":\"UP\"") {
                        break;
                    }
                    if std::time::Instant::now() > deadline {
                        anyhow::bail!("{ifname} in {} did not come up: {out}", host.name());
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            }
        }
        Ok(())
    }

    /// Set `offload` on both ends of every link.
    pub fn set_offload(&self, offload: crate::network::offload::Offload) -> anyhow::Result<()> {
        anyhow::ensure!(self.nic_changes_allowed, "the links' offloads are not ours to change (--allow-nic-changes)");
        for l in &self.links {
            for (host, ifname) in [(&self.target, &l.target_if), (&self.client, &l.client_if)] {
                offload.apply(host, ifname)?;
            }
        }
        self.napi_rx.store(!self.remote && offload.veth_rx_napi(), Ordering::Relaxed);
        Ok(())
    }

    /// Put every link end's offloads back as they were before `setup`, and
    /// check that they are.
    pub fn restore_offloads(&self) -> anyhow::Result<()> {
        self.saved_offloads.iter().try_for_each(|s| s.restore())
    }

    /// Whether both ends of every link receive through NAPI now (see
    /// [`Topology::client_counters`]).
    pub fn receives_through_napi(&self) -> bool {
        self.napi_rx.load(Ordering::Relaxed)
    }

    /// Counters of the client-side end of `link` (sent + received are both
    /// there: the veth has no other traffic), in bytes of whole frames.
    /// A veth whose receiving end runs NAPI (GRO on, or a native XDP
    /// program) counts each frame at that end's poll, after its Ethernet
    /// header was taken off, on both the receiver's rx and the sender's tx:
    /// 14 bytes short per frame (seen: 10 UDP frames of 1042 bytes count
    /// 10420 with GRO off and 10280 with it on). Where the lab's links run
    /// NAPI at both ends the header is added back, so wire bytes per
    /// operation mean the same whatever the offloads.
    pub fn client_counters(&self, link: &Link) -> anyhow::Result<WireCounters> {
        let c = self.client.nic_counters(&link.client_if)?;
        Ok(if self.receives_through_napi() { with_ethernet_headers(c) } else { c })
    }

    /// Remove the veths and namespaces (also done by the registry on abort).
    pub fn teardown(self) -> anyhow::Result<()> {
        let mut first_err = None;
        for t in self.tokens.into_iter().rev() {
            if let Err(e) = registry().release(t) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Counters of a veth end that counts frames without their Ethernet header,
/// with it added back (see [`Topology::client_counters`]).
fn with_ethernet_headers(c: WireCounters) -> WireCounters {
    WireCounters {
        rx_bytes: c.rx_bytes + ETH_HLEN * c.rx_packets,
        tx_bytes: c.tx_bytes + ETH_HLEN * c.tx_packets,
        ..c
    }
}

/// Everything on this machine that belongs to the lab run with `pid`:
/// namespaces, links, mounts, FUSE connections, loop devices, memory
/// cgroups and attach daemons (for leak checks; qdiscs live on the lab's
/// veths and go with them).
pub fn leftovers(pid: u32) -> Vec<String> {
    let (tns, cns) = names(pid);
    let veth_prefix = format!("bwl{pid}");
    let mut out = vec![];
    if let Ok(s) = sh("ip", &["netns", "list"]) {
        for l in s.lines() {
            let n = l.split_whitespace().next().unwrap_or("");
            if n == tns || n == cns {
                out.push(format!("namespace {n}"));
            }
        }
    }
    if let Ok(s) = sh("ip", &["-o", "link", "show"]) {
        for l in s.lines() {
            if let Some(name) = l.split(": ").nth(1) {
                let name = name.split('@').next().unwrap_or(name);
                if name.starts_with(&veth_prefix) {
                    out.push(format!("link {name}"));
                }
            }
        }
    }
    let tag = format!("bwlab-{pid}");
    // The attach daemon of the fs suite's `blockwire mount` serves the
    // volume from a FUSE directory named after the mount point, and the
    // loop device's backing file lives there.
    let fuse_dir = bw_attach::mount_fuse_dir(&crate::suites::fs::mounts::fs_mountpoint(pid));
    let fuse_tag = fuse_dir.to_string_lossy().into_owned();
    // File systems, FUSE connections (the attach daemon's mount) and netns binds.
    if let Ok(m) = std::fs::read_to_string("/proc/mounts") {
        for l in m.lines() {
            if l.contains(&tns) || l.contains(&cns) || l.contains(&tag) || l.contains(&fuse_tag) {
                out.push(format!("mount {l}"));
            }
        }
    }
    // Loop devices on the lab's backing file.
    for e in std::fs::read_dir("/sys/block").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Ok(f) = std::fs::read_to_string(e.path().join("loop/backing_file")) {
            if f.contains(&tag) || f.contains(&fuse_tag) {
                out.push(format!("loop device /dev/{name} on {}", f.trim()));
            }
        }
    }
    // Memory cgroups of the fs suite (v1 and v2 layouts).
    for base in ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"] {
        for e in std::fs::read_dir(base).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(&tag) {
                out.push(format!("cgroup {}", e.path().display()));
            }
        }
    }
    // Attach daemons of `blockwire mount` (not the lab's children: they
    // detach into their own session) and their state files.
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default();
        if cmd.contains(" attach ") && cmd.contains(&tag) {
            out.push(format!("process {} ({})", e.file_name().to_string_lossy(), cmd.trim()));
        }
    }
    for e in std::fs::read_dir(bw_attach::STATE_DIR).into_iter().flatten().flatten() {
        if std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains(&tag)) {
            out.push(format!("attach state {}", e.path().display()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A topology's names are the process's (`names`): tests that set one
    /// up take turns.
    static ONE_TOPOLOGY: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// While one run holds the congestion lock (between its look at the
    /// allowed list and its namespaces' `sysctl`), another cannot take it
    /// (to put the list back) until it is let go. (A slow machine can only
    /// make the second taker later, never let it in early.)
    #[test]
    fn the_congestion_lock_keeps_a_second_taker_out() {
        let _one = ONE_TOPOLOGY.lock().unwrap_or_else(|p| p.into_inner());
        let first = CongestionLock::take().unwrap();
        let took = std::sync::Arc::new(AtomicBool::new(false));
        let second = {
            let took = took.clone();
            std::thread::spawn(move || {
                let _l = CongestionLock::take().unwrap();
                took.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!took.load(Ordering::SeqCst), "a second taker got the lock while the first held it");
        drop(first);
        second.join().unwrap();
        assert!(took.load(Ordering::SeqCst));
    }

    #[test]
    fn an_allowed_list_gains_only_what_it_lacks() {
        assert_eq!(allowed_with("reno bbr", "cubic").as_deref(), Some("reno bbr cubic"));
        assert_eq!(allowed_with("reno bbr", "bbr"), None);
        assert_eq!(allowed_with("reno cubic\n", "cubic"), None);
        assert_eq!(allowed_with("", "cubic").as_deref(), Some("cubic"));
    }

    /// `--tcp-congestion` with an algorithm the first namespace's allowed
    /// list lacks (on this kind of machine "reno bbr", so cubic): the
    /// namespaces take it, and the list is as before once the run is over.
    #[test]
    fn namespaces_take_an_algorithm_the_allowed_list_lacked() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root (network namespaces)");
            return;
        }
        let available = bw_net::tcp::available().unwrap();
        let allowed = std::fs::read_to_string(ALLOWED_CONGESTION).unwrap();
        // One the kernel has but the list lacks, if any; else one it lists.
        let cc = ["cubic", "reno", "bbr"]
            .into_iter()
            .find(|c| available.split_whitespace().any(|a| a == *c) && !allowed.split_whitespace().any(|a| a == *c))
            .unwrap_or("reno");
        let _one = ONE_TOPOLOGY.lock().unwrap_or_else(|p| p.into_inner());
        let topo = Topology::setup(&[1500], Some(cc)).unwrap();
        let took = |h: &Host| h.run("sysctl", &["-n", "net.ipv4.tcp_congestion_control"]).unwrap().trim().to_string();
        let (t, c) = (took(&topo.target), took(&topo.client));
        let during = std::fs::read_to_string(ALLOWED_CONGESTION).unwrap();
        topo.teardown().unwrap();
        assert_eq!((t.as_str(), c.as_str()), (cc, cc), "both namespaces default to {cc}");
        assert!(during.split_whitespace().any(|a| a == cc), "allowed while the run lasts: {during}");
        assert_eq!(std::fs::read_to_string(ALLOWED_CONGESTION).unwrap(), allowed, "the allowed list put back");
    }

    #[test]
    fn names_fit_the_kernel_limit() {
        let (t, c) = veth_names(4_194_304, 25);
        assert!(t.len() <= 15 && c.len() <= 15, "{t} {c}");
        assert_ne!(t, c);
        assert_ne!(veth_names(12, 0), veth_names(12, 1));
    }

    /// The wire counters of the lab's default link count whole frames,
    /// Ethernet header included, though the veth (receiving through NAPI
    /// with GRO on) leaves the header out: 10 UDP datagrams of 1000 bytes
    /// are 10 frames of 1042 bytes (14 Ethernet, 20 IP, 8 UDP).
    #[test]
    fn wire_counters_count_whole_frames() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root (network namespaces)");
            return;
        }
        let _one = ONE_TOPOLOGY.lock().unwrap_or_else(|p| p.into_inner());
        let topo = Topology::setup(&[1500], None).unwrap();
        let link = topo.links[0].clone();
        let send = |n: u32| {
            let code = format!(
                "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nfor _ in range({n}): s.sendto(bytes(1000), ('{}', 9))",
                link.client_ip
            );
            topo.target.run("python3", &["-c", &code]).unwrap();
        };
        // Until `n` more frames than `from` arrived (the veth's poll may run
        // later, in ksoftirqd on a busy machine); the counters then.
        let arrived = |from: &WireCounters, n: u64| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let now = topo.client_counters(&link).unwrap();
                if now.rx_packets >= from.rx_packets + n || std::time::Instant::now() > deadline {
                    return now;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        };
        // The first datagram resolves the client's address first: an ARP
        // request and the datagram reach the client.
        let start = topo.client_counters(&link).unwrap();
        send(1);
        let before = arrived(&start, 2);
        send(10);
        let d = WireCounters::delta(&before, &arrived(&before, 10));
        let napi = topo.receives_through_napi();
        topo.teardown().unwrap();
        assert!(napi, "the default link receives through NAPI (GRO on, TSO off)");
        assert_eq!((d.rx_packets, d.rx_bytes), (10, 10 * 1042), "{d:?}");
    }
}
