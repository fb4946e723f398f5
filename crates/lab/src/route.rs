//! Routed paths between a client namespace and a target namespace, for the
//! `route` suite (STUDIES.md §3) and the MPLS tests:
//!
//! - `direct`: one veth between client and target.
//! - `mpls`: client - LER - LSR - LSR - LSR - LER - target, every router a
//!   `blockwire router` in its own namespace, veths between neighbours. The
//!   edges carry every customer frame (AoE, ARP, IPv4) as an Ethernet
//!   pseudowire under a two-label stack; see `bw-mpls`.
//! - `vxlan`: client and target joined by kernel VXLAN over an IPv4 veth.
//!
//! Every path gives the client and the target one interface (`CUSTOMER_IF`)
//! on the same IPv4 subnet, so AoE, iSCSI and NVMe/TCP run unchanged over
//! each. Segmentation offloads and transmit checksum offload are off on
//! every endpoint: a software router relays frames as they are on the wire,
//! so it needs real MTU-sized frames with finished checksums, and the other
//! paths are set up the same way so the comparison is fair.
//!
//! Everything is removed on drop: router processes by PID, then the
//! namespaces (which takes their veths and VXLAN devices with them).

use anyhow::{bail, Context};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The interface AoE and IP use in the client and target namespaces.
pub const CUSTOMER_IF: &str = "cust0";
pub const TARGET_IP: &str = "198.18.0.1";
pub const CLIENT_IP: &str = "198.18.0.2";
/// Bytes the MPLS pseudowire adds in front of a customer frame on a core
/// link: two label entries and the control word, plus the customer's own
/// Ethernet header, which now rides as payload.
pub const MPLS_CORE_EXTRA: u32 = 8 + 4 + 14;
/// VXLAN over IPv4: outer IPv4 20 + UDP 8 + VXLAN 8 + inner Ethernet 14.
pub const VXLAN_EXTRA: u32 = 50;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    Direct,
    Mpls,
    Vxlan,
}

impl PathKind {
    pub fn name(&self) -> &'static str {
        match self {
            PathKind::Direct => "direct",
            PathKind::Mpls => "mpls",
            PathKind::Vxlan => "vxlan",
        }
    }
    pub fn parse(s: &str) -> anyhow::Result<PathKind> {
        Ok(match s {
            "direct" => PathKind::Direct,
            "mpls" => PathKind::Mpls,
            "vxlan" => PathKind::Vxlan,
            _ => bail!("unknown path {s:?} (direct, mpls, vxlan)"),
        })
    }
}

/// Label plan of the five-router chain. Eastbound (client to target) the
/// route label is 101 at the first hop and swapped to 102, 103, 104; the
/// far edge pops 104. Westbound it is 201..204. The customer label is 1000
/// both ways.
pub const CUSTOMER_LABEL: u32 = 1000;
pub const EAST_LABELS: [u32; 4] = [101, 102, 103, 104];
pub const WEST_LABELS: [u32; 4] = [201, 202, 203, 204];
/// Router names in path order: edge, three switches, edge.
pub const ROUTERS: [&str; 5] = ["ler1", "lsr1", "lsr2", "lsr3", "ler2"];

/// MAC of router `r` (0..5), port `p` (0 = west, 1 = east): fixed and
/// locally administered, so the label plan can name next hops.
pub fn router_mac(r: usize, p: usize) -> String {
    format!("02:62:77:00:{:02x}:{:02x}", r + 1, p)
}

/// A running router process.
pub struct RouterProc {
    pub name: String,
    pub ns: String,
    args: Vec<String>,
    child: Option<Child>,
    log: PathBuf,
}

impl RouterProc {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// One built path. See the module comment.
pub struct RouteNet {
    pub kind: PathKind,
    pub mtu: u32,
    pub client_ns: String,
    pub target_ns: String,
    pub routers: Vec<RouterProc>,
    /// Where to capture what crosses the middle of the path (namespace, interface).
    pub capture_point: (String, String),
    namespaces: Vec<String>,
    exe: PathBuf,
    logdir: PathBuf,
}

fn run(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(args[0]).args(&args[1..]).output().with_context(|| format!("cannot run {}", args[0]))?;
    if !out.status.success() {
        bail!("`{}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn in_ns(ns: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    run(&v)
}

impl RouteNet {
    /// Build path `kind` with customer MTU `mtu`. `tag` (at most 6
    /// characters) keeps namespace names apart; `exe` is the blockwire
    /// binary (routers run as `blockwire router`).
    pub fn build(kind: PathKind, tag: &str, mtu: u32, exe: &Path) -> anyhow::Result<RouteNet> {
        let logdir = std::env::temp_dir().join(format!("blockwire-route-{tag}"));
        std::fs::create_dir_all(&logdir)?;
        let mut net = RouteNet {
            kind,
            mtu,
            client_ns: format!("bwr{tag}-c"),
            target_ns: format!("bwr{tag}-t"),
            routers: vec![],
            capture_point: (String::new(), String::new()),
            namespaces: vec![],
            exe: exe.to_path_buf(),
            logdir,
        };
        // On error, Drop removes whatever was made.
        let (c, t) = (net.client_ns.clone(), net.target_ns.clone());
        net.add_ns(&c)?;
        net.add_ns(&t)?;
        match kind {
            PathKind::Direct => {
                veth(&c, CUSTOMER_IF, &t, CUSTOMER_IF, mtu)?;
                net.capture_point = (t.clone(), CUSTOMER_IF.into());
            }
            PathKind::Vxlan => {
                veth(&c, "under0", &t, "under0", mtu + VXLAN_EXTRA)?;
                for (ns, me, peer) in [(&c, "198.19.0.2", "198.19.0.1"), (&t, "198.19.0.1", "198.19.0.2")] {
                    in_ns(ns, &["ip", "addr", "add", &format!("{me}/30"), "dev", "under0"])?;
                    in_ns(ns, &["ip", "link", "set", "under0", "up"])?;
                    in_ns(ns, &["ip", "link", "add", CUSTOMER_IF, "type", "vxlan", "id", "42", "local", me, "remote", peer, "dstport", "4789", "dev", "under0"])?;
                    in_ns(ns, &["ip", "link", "set", CUSTOMER_IF, "mtu", &mtu.to_string()])?;
                    offloads_off(ns, "under0");
                }
                net.capture_point = (t.clone(), "under0".into());
            }
            PathKind::Mpls => {
                let names: Vec<String> = ROUTERS.iter().map(|r| format!("bwr{tag}-{r}")).collect();
                for n in &names {
                    net.add_ns(n)?;
                }
                let core = mtu + MPLS_CORE_EXTRA;
                // Port names: edges "cust" and "core", switches "west" and "east".
                let ports = |r: usize| -> [&'static str; 2] {
                    match r {
                        0 => ["cust", "core"],
                        4 => ["core", "cust"],
                        _ => ["west", "east"],
                    }
                };
                veth(&c, CUSTOMER_IF, &names[0], "cust", mtu)?;
                for r in 0..4 {
                    veth(&names[r], ports(r)[1], &names[r + 1], ports(r + 1)[0], core)?;
                }
                veth(&names[4], "cust", &t, CUSTOMER_IF, mtu)?;
                for (r, n) in names.iter().enumerate() {
                    for (p, ifname) in ports(r).iter().enumerate() {
                        in_ns(n, &["ip", "link", "set", ifname, "address", &router_mac(r, p)])?;
                        offloads_off(n, ifname);
                    }
                }
                for (r, n) in names.iter().enumerate() {
                    let args = router_args(r);
                    net.start_router(ROUTERS[r], n, args)?;
                }
                net.capture_point = (names[2].clone(), "west".into());
            }
        }
        for (ns, ip) in [(&c, CLIENT_IP), (&t, TARGET_IP)] {
            in_ns(ns, &["ip", "addr", "add", &format!("{ip}/24"), "dev", CUSTOMER_IF])?;
            in_ns(ns, &["ip", "link", "set", CUSTOMER_IF, "mtu", &mtu.to_string()])?;
            offloads_off(ns, CUSTOMER_IF);
            in_ns(ns, &["ip", "link", "set", CUSTOMER_IF, "up"])?;
        }
        net.wait_up()?;
        Ok(net)
    }

    fn add_ns(&mut self, ns: &str) -> anyhow::Result<()> {
        run(&["ip", "netns", "add", ns])?;
        self.namespaces.push(ns.to_string());
        in_ns(ns, &["ip", "link", "set", "lo", "up"])?;
        // No IPv6 chatter (router solicitations, DAD) on the paths.
        let _ = in_ns(ns, &["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]);
        let _ = in_ns(ns, &["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"]);
        Ok(())
    }

    fn start_router(&mut self, name: &str, ns: &str, args: Vec<String>) -> anyhow::Result<()> {
        let log = self.logdir.join(format!("{name}.log"));
        let mut p = RouterProc { name: name.into(), ns: ns.into(), args, child: None, log };
        self.spawn(&mut p)?;
        self.routers.push(p);
        Ok(())
    }

    fn spawn(&self, p: &mut RouterProc) -> anyhow::Result<()> {
        let logf = std::fs::OpenOptions::new().create(true).append(true).open(&p.log)?;
        let start_len = logf.metadata()?.len();
        let child = Command::new("ip")
            .args(["netns", "exec", &p.ns])
            .arg(&self.exe)
            .args(["router", "--name", &p.name])
            .args(&p.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .context("spawn blockwire router")?;
        p.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut text = String::new();
            if let Ok(mut f) = std::fs::File::open(&p.log) {
                let _ = f.read_to_string(&mut text);
            }
            if text.get(start_len as usize..).unwrap_or("").contains("blockwire: ready") {
                return Ok(());
            }
            if let Some(st) = p.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                p.child = None;
                bail!("router {} exited with {st}: {text}", p.name);
            }
            if Instant::now() > deadline {
                bail!("router {} not ready after 20 s: {text}", p.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stop router `name` (SIGTERM, wait), returning its last log line (the counters).
    pub fn stop_router(&mut self, name: &str) -> anyhow::Result<String> {
        let p = self.routers.iter_mut().find(|p| p.name == name).with_context(|| format!("no router {name}"))?;
        if let Some(c) = p.child.take() {
            terminate(c);
        }
        Ok(p.log_text().lines().rev().find(|l| l.contains("received")).unwrap_or("").to_string())
    }

    /// Start router `name` again with the same arguments.
    pub fn start_router_again(&mut self, name: &str) -> anyhow::Result<()> {
        let i = self.routers.iter().position(|p| p.name == name).with_context(|| format!("no router {name}"))?;
        let mut p = std::mem::replace(&mut self.routers[i], RouterProc { name: String::new(), ns: String::new(), args: vec![], child: None, log: PathBuf::new() });
        let r = self.spawn(&mut p);
        self.routers[i] = p;
        r
    }

    /// CPU seconds (user + system) each router has used so far.
    pub fn router_cpu(&self) -> Vec<(String, f64)> {
        self.routers.iter().filter_map(|p| Some((p.name.clone(), process_cpu_seconds(p.pid()?)?))).collect()
    }

    /// PIDs of every router process still running.
    pub fn pids(&self) -> Vec<u32> {
        self.routers.iter().filter_map(|p| p.pid()).collect()
    }

    /// Namespaces this path created (all gone after drop).
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    fn wait_up(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        for ns in &self.namespaces {
            loop {
                let out = in_ns(ns, &["ip", "-j", "link", "show"])?;
                // Every veth end reports carrier (operstate UP, or UNKNOWN for vxlan/lo).
                if !out.contains("\"operstate\":\"DOWN\"") && !out.contains("LOWERLAYERDOWN") {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("links in {ns} did not come up: {out}");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }
}

/// `blockwire router` arguments of router `r` in the chain.
fn router_args(r: usize) -> Vec<String> {
    let mut a = vec![];
    let port = |n: &str, i: &str| format!("--port={n}={i}");
    match r {
        0 => {
            a.push(port("cust", "cust"));
            a.push(port("core", "core"));
            a.push(format!("--pseudowire=customer=cust,core=core,route={},label={CUSTOMER_LABEL},via={}", EAST_LABELS[0], router_mac(1, 0)));
            a.push(format!("--pop={}", WEST_LABELS[3]));
        }
        4 => {
            a.push(port("core", "core"));
            a.push(port("cust", "cust"));
            a.push(format!("--pseudowire=customer=cust,core=core,route={},label={CUSTOMER_LABEL},via={}", WEST_LABELS[0], router_mac(3, 1)));
            a.push(format!("--pop={}", EAST_LABELS[3]));
        }
        _ => {
            a.push(port("west", "west"));
            a.push(port("east", "east"));
            // Switch r swaps the label its west neighbour pushed or swapped.
            a.push(format!("--swap=in={},out={},port=east,via={}", EAST_LABELS[r - 1], EAST_LABELS[r], router_mac(r + 1, 0)));
            a.push(format!("--swap=in={},out={},port=west,via={}", WEST_LABELS[3 - r], WEST_LABELS[4 - r], router_mac(r - 1, 1)));
        }
    }
    a
}

fn veth(ns_a: &str, if_a: &str, ns_b: &str, if_b: &str, mtu: u32) -> anyhow::Result<()> {
    let m = mtu.to_string();
    run(&["ip", "link", "add", if_a, "netns", ns_a, "mtu", &m, "type", "veth", "peer", "name", if_b, "netns", ns_b, "mtu", &m])?;
    in_ns(ns_a, &["ip", "link", "set", if_a, "up"])?;
    in_ns(ns_b, &["ip", "link", "set", if_b, "up"])?;
    Ok(())
}

/// Real MTU-sized frames with finished checksums (see the module comment).
/// Best effort: a device without a feature refuses to change it.
fn offloads_off(ns: &str, ifname: &str) {
    if let Err(e) = in_ns(ns, &["ethtool", "-K", ifname, "tx", "off", "tso", "off", "gso", "off", "gro", "off"]) {
        log::warn!("offloads on {ifname} in {ns}: {e}");
    }
}

fn terminate(mut c: Child) {
    // SAFETY: signalling our own child by PID.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// utime + stime of a process from /proc/PID/stat, in seconds.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks as f64 / hz)
}

impl Drop for RouteNet {
    fn drop(&mut self) {
        for p in &mut self.routers {
            if let Some(c) = p.child.take() {
                terminate(c);
            }
        }
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = std::fs::remove_dir_all(&self.logdir);
    }
}
