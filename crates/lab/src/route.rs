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
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("cannot run {}", args[0]))?;
    if !out.status.success() {
        bail!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
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
                for (ns, me, peer) in [
                    (&c, "198.19.0.2", "198.19.0.1"),
                    (&t, "198.19.0.1", "198.19.0.2"),
                ] {
                    in_ns(
                        ns,
                        &["ip", "addr", "add", &format!("{me}/30"), "dev", "under0"],
                    )?;
                    in_ns(ns, &["ip", "link", "set", "under0", "up"])?;
                    in_ns(
                        ns,
                        &[
                            "ip",
                            "link",
                            "add",
                            CUSTOMER_IF,
                            "type",
                            "vxlan",
                            "id",
                            "42",
                            "local",
                            me,
                            "remote",
                            peer,
                            "dstport",
                            "4789",
                            "dev",
                            "under0",
                        ],
                    )?;
                    in_ns(
                        ns,
                        &["ip", "link", "set", CUSTOMER_IF, "mtu", &mtu.to_string()],
                    )?;
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
                        in_ns(
                            n,
                            &["ip", "link", "set", ifname, "address", &router_mac(r, p)],
                        )?;
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
            in_ns(
                ns,
                &["ip", "addr", "add", &format!("{ip}/24"), "dev", CUSTOMER_IF],
            )?;
            in_ns(
                ns,
                &["ip", "link", "set", CUSTOMER_IF, "mtu", &mtu.to_string()],
            )?;
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
        let _ = in_ns(
            ns,
            &["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"],
        );
        Ok(())
    }

    fn start_router(&mut self, name: &str, ns: &str, args: Vec<String>) -> anyhow::Result<()> {
        let log = self.logdir.join(format!("{name}.log"));
        let mut p = RouterProc {
            name: name.into(),
            ns: ns.into(),
            args,
            child: None,
            log,
        };
        self.spawn(&mut p)?;
        self.routers.push(p);
        Ok(())
    }

    fn spawn(&self, p: &mut RouterProc) -> anyhow::Result<()> {
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p.log)?;
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
            if text
                .get(start_len as usize..)
                .unwrap_or("")
                .contains("blockwire: ready")
            {
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
        let p = self
            .routers
            .iter_mut()
            .find(|p| p.name == name)
            .with_context(|| format!("no router {name}"))?;
        if let Some(c) = p.child.take() {
            terminate(c);
        }
        Ok(p.log_text()
            .lines()
            .rev()
            .find(|l| l.contains("received"))
            .unwrap_or("")
            .to_string())
    }

    /// Start router `name` again with the same arguments.
    pub fn start_router_again(&mut self, name: &str) -> anyhow::Result<()> {
        let i = self
            .routers
            .iter()
            .position(|p| p.name == name)
            .with_context(|| format!("no router {name}"))?;
        let mut p = std::mem::replace(
            &mut self.routers[i],
            RouterProc {
                name: String::new(),
                ns: String::new(),
                args: vec![],
                child: None,
                log: PathBuf::new(),
            },
        );
        let r = self.spawn(&mut p);
        self.routers[i] = p;
        r
    }

    /// CPU seconds (user + system) each router has used so far.
    pub fn router_cpu(&self) -> Vec<(String, f64)> {
        self.routers
            .iter()
            .filter_map(|p| Some((p.name.clone(), process_cpu_seconds(p.pid()?)?)))
            .collect()
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
            a.push(format!(
                "--pseudowire=customer=cust,core=core,route={},label={CUSTOMER_LABEL},via={}",
                EAST_LABELS[0],
                router_mac(1, 0)
            ));
            a.push(format!("--pop={}", WEST_LABELS[3]));
        }
        4 => {
            a.push(port("core", "core"));
            a.push(port("cust", "cust"));
            a.push(format!(
                "--pseudowire=customer=cust,core=core,route={},label={CUSTOMER_LABEL},via={}",
                WEST_LABELS[0],
                router_mac(3, 1)
            ));
            a.push(format!("--pop={}", EAST_LABELS[3]));
        }
        _ => {
            a.push(port("west", "west"));
            a.push(port("east", "east"));
            // Switch r swaps the label its west neighbour pushed or swapped.
            a.push(format!(
                "--swap=in={},out={},port=east,via={}",
                EAST_LABELS[r - 1],
                EAST_LABELS[r],
                router_mac(r + 1, 0)
            ));
            a.push(format!(
                "--swap=in={},out={},port=west,via={}",
                WEST_LABELS[3 - r],
                WEST_LABELS[4 - r],
                router_mac(r - 1, 1)
            ));
        }
    }
    a
}

fn veth(ns_a: &str, if_a: &str, ns_b: &str, if_b: &str, mtu: u32) -> anyhow::Result<()> {
    let m = mtu.to_string();
    run(&[
        "ip", "link", "add", if_a, "netns", ns_a, "mtu", &m, "type", "veth", "peer", "name", if_b,
        "netns", ns_b, "mtu", &m,
    ])?;
    in_ns(ns_a, &["ip", "link", "set", if_a, "up"])?;
    in_ns(ns_b, &["ip", "link", "set", if_b, "up"])?;
    Ok(())
}

/// Real MTU-sized frames with finished checksums (see the module comment).
/// Best effort: a device without a feature refuses to change it.
fn offloads_off(ns: &str, ifname: &str) {
    if let Err(e) = in_ns(
        ns,
        &[
            "ethtool", "-K", ifname, "tx", "off", "tso", "off", "gso", "off", "gro", "off",
        ],
    ) {
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

// ---------------------------------------------------------------------
// The `route` suite: the same workloads over each path, router CPU, and
// header bytes per frame from captures.

/// What `blockwire lab --suite route` runs.
#[derive(Debug, Clone)]
pub struct SuitePlan {
    pub paths: Vec<PathKind>,
    pub protocols: Vec<String>,
    pub mtu: u32,
    /// Seconds per bench run.
    pub runtime: f64,
    /// Bytes written then read back by the copy case (and the volume size floor).
    pub copy_bytes: u64,
    /// Rounds; paths are interleaved within each round (machine speed drifts).
    pub rounds: u32,
}

impl SuitePlan {
    pub fn new(quick: bool) -> SuitePlan {
        SuitePlan {
            paths: vec![PathKind::Direct, PathKind::Mpls, PathKind::Vxlan],
            protocols: vec!["aoe".into(), "iscsi".into(), "nvme".into()],
            mtu: 9000,
            runtime: if quick { 2.0 } else { 5.0 },
            copy_bytes: if quick { 128 << 20 } else { 1 << 30 },
            rounds: if quick { 1 } else { 3 },
        }
    }
}

/// One measured case.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RouteSample {
    pub round: u32,
    pub path: String,
    pub protocol: String,
    pub workload: String,
    /// Bytes per second (copy: bytes written plus read over both phases).
    pub bw_bytes: f64,
    pub iops: f64,
    pub mean_lat_us: f64,
    /// CPU of each router during the run, as a fraction of one core.
    pub router_cpu: Vec<(String, f64)>,
    /// Frames (both directions) through the middle of the path per MiB of
    /// data moved: a count, unlike the speeds robust to a busy machine.
    pub frames_per_mib: f64,
    /// Router CPU per frame crossing the middle of the path, averaged over
    /// the routers, in µs (MPLS only): the cost of one hop of this datapath.
    pub router_us_per_frame: Option<f64>,
}

/// Header bytes per full data frame, from a capture in the middle of a path.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Overhead {
    pub path: String,
    pub protocol: String,
    /// Most common (frame length - data payload) over the data frames.
    pub bytes_per_frame: u32,
    pub frames: usize,
    /// Frames tshark marked malformed in the whole capture (should be 0).
    pub malformed: usize,
}

/// A `blockwire serve` in the target namespace, stopped on drop.
struct TargetProc(Option<Child>);

impl Drop for TargetProc {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            terminate(c);
        }
    }
}

fn start_target(net: &RouteNet, exe: &Path, size: u64, log: &Path) -> anyhow::Result<TargetProc> {
    let logf = std::fs::File::create(log)?;
    let child = Command::new("ip")
        .args(["netns", "exec", &net.target_ns])
        .arg(exe)
        .args([
            "serve",
            "--volume",
            &format!("d=ram:{size}"),
            "--aoe",
            &format!("{CUSTOMER_IF},volume=d,shelf=1,slot=0"),
        ])
        .args([
            "--iscsi",
            &format!("{TARGET_IP}:3260"),
            "--nvme",
            &format!("{TARGET_IP}:4420"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(logf)
        .spawn()?;
    let mut t = TargetProc(Some(child));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains("blockwire: ready")
        {
            return Ok(t);
        }
        if let Some(st) = t.0.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            t.0 = None;
            bail!(
                "serve exited with {st}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        anyhow::ensure!(Instant::now() < deadline, "serve not ready after 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn client(net: &RouteNet, exe: &Path, args: &[&str]) -> anyhow::Result<String> {
    let mut v = vec!["ip", "netns", "exec", &net.client_ns];
    let exe_s = exe.to_str().context("exe path is not UTF-8")?;
    v.push(exe_s);
    v.extend_from_slice(args);
    run(&v)
}

/// URL of protocol `p` on the path (names found by discovery).
fn url_for(net: &RouteNet, exe: &Path, p: &str) -> anyhow::Result<String> {
    Ok(match p {
        "aoe" => format!("aoe://{CUSTOMER_IF}/1.0"),
        "iscsi" => {
            let out = client(net, exe, &["iscsi", "discover", TARGET_IP])?;
            let iqn = out
                .split_whitespace()
                .find(|w| w.starts_with("iqn."))
                .context("no IQN discovered")?;
            format!("iscsi://{TARGET_IP}/{iqn}/0")
        }
        "nvme" => {
            let out = client(net, exe, &["nvme", "discover", TARGET_IP])?;
            // Lines are "nvme+tcp://ADDR:PORT/SUBNQN (subtype ...)".
            let url = out
                .split_whitespace()
                .find(|w| w.starts_with("nvme+tcp://") && !w.contains("discovery"))
                .with_context(|| format!("no NVM subsystem discovered: {out}"))?;
            format!("{url}/1")
        }
        _ => bail!("unknown protocol {p:?}"),
    })
}

/// The suite's workloads: (name, bench arguments); "copy" is special.
const WORKLOADS: [(&str, &[&str]); 3] = [
    (
        "seqread-1m-qd8",
        &["--rw", "read", "--bs", "1M", "--iodepth", "8"],
    ),
    (
        "randread-4k-qd32",
        &["--rw", "randread", "--bs", "4k", "--iodepth", "32"],
    ),
    ("copy", &[]),
];

fn cpu_fractions(
    before: &[(String, f64)],
    after: &[(String, f64)],
    wall: f64,
) -> Vec<(String, f64)> {
    after
        .iter()
        .map(|(n, a)| {
            let b = before
                .iter()
                .find(|(m, _)| m == n)
                .map(|x| x.1)
                .unwrap_or(0.0);
            (n.clone(), (a - b) / wall.max(1e-6))
        })
        .collect()
}

/// Packets received plus sent on the path's middle interface so far.
fn middle_packets(net: &RouteNet) -> u64 {
    let (ns, ifname) = &net.capture_point;
    let Ok(out) = run(&["ip", "-n", ns, "-s", "-j", "link", "show", "dev", ifname]) else {
        return 0;
    };
    let Ok(j) = serde_json::from_str::<serde_json::Value>(&out) else {
        return 0;
    };
    let st = &j[0]["stats64"];
    st["rx"]["packets"].as_u64().unwrap_or(0) + st["tx"]["packets"].as_u64().unwrap_or(0)
}

/// (bytes per second, IOPS, mean latency in µs, wall seconds, bytes moved)
fn one_case(
    net: &RouteNet,
    exe: &Path,
    url: &str,
    w: &str,
    args: &[&str],
    plan: &SuitePlan,
) -> anyhow::Result<(f64, f64, f64, f64, f64)> {
    if w == "copy" {
        let size = plan.copy_bytes.to_string();
        let out = client(net, exe, &["verify", url, "--size", &size, "--seed", "5"])?;
        // "... OK (write W s, read R s)"
        let num = |key: &str| -> Option<f64> {
            out.split(key)
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        let (ws, rs) = (
            num("write ").context("verify output")?,
            num("read ").context("verify output")?,
        );
        let wall = ws + rs;
        return Ok((
            2.0 * plan.copy_bytes as f64 / wall,
            0.0,
            0.0,
            wall,
            2.0 * plan.copy_bytes as f64,
        ));
    }
    let rt = plan.runtime.to_string();
    let mut v = vec!["bench", url];
    v.extend_from_slice(args);
    v.extend_from_slice(&["--runtime", &rt, "--ramp-ios", "64", "--json"]);
    let t = Instant::now();
    let out = client(net, exe, &v)?;
    let wall = t.elapsed().as_secs_f64();
    let j: serde_json::Value =
        serde_json::from_str(out.trim()).with_context(|| format!("bench JSON: {out}"))?;
    let f = |k: &str| j[k].as_f64().unwrap_or(0.0);
    Ok((
        f("bw_bytes"),
        f("iops"),
        j["lat_ns"]["mean"].as_f64().unwrap_or(0.0) / 1000.0,
        wall,
        f("bytes"),
    ))
}

/// Capture a short read of protocol `p` in the middle of the path and
/// return the most common header bytes per data frame.
fn measure_overhead(
    net: &RouteNet,
    exe: &Path,
    url: &str,
    p: &str,
    dir: &Path,
) -> anyhow::Result<Overhead> {
    // One retry: on a loaded machine a capture occasionally starts late.
    measure_overhead_once(net, exe, url, p, dir).or_else(|e| {
        log::info!("overhead of {p} over {}: {e:#}; once more", net.kind.name());
        measure_overhead_once(net, exe, url, p, dir)
    })
}

fn measure_overhead_once(
    net: &RouteNet,
    exe: &Path,
    url: &str,
    p: &str,
    dir: &Path,
) -> anyhow::Result<Overhead> {
    let pcap = dir.join(format!("{}-{p}.pcap", net.kind.name()));
    let (ns, ifname) = &net.capture_point;
    let mut tshark = Command::new("ip")
        .args([
            "netns", "exec", ns, "tshark", "-q", "-c", "400", "-i", ifname, "-w",
        ])
        .arg(&pcap)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    // tshark prints "Capturing on" once its socket is open; a fixed sleep
    // was too short on a loaded machine.
    let mut err = tshark.stderr.take().context("tshark stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = String::new();
        let mut b = [0u8; 256];
        while let Ok(n) = err.read(&mut b) {
            if n == 0 {
                break;
            }
            seen.push_str(&String::from_utf8_lossy(&b[..n]));
            if seen.contains("Capturing on") {
                let _ = tx.send(());
            }
        }
    });
    let _ = rx.recv_timeout(Duration::from_secs(20));
    let bench = client(
        net,
        exe,
        &[
            "bench",
            url,
            "--rw",
            "read",
            "--bs",
            "1M",
            "--iodepth",
            "4",
            "--ios",
            "64",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while tshark.try_wait()?.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(tshark.id() as i32, libc::SIGINT) };
    let _ = tshark.wait();
    bench.context("the read during the capture")?;
    let pcap_s = pcap.to_str().context("pcap path")?;
    let mut args = vec!["tshark".to_string(), "-r".into(), pcap_s.into()];
    args.extend(tshark_decode_args());
    let (filter, fields) = if p == "aoe" {
        (
            "aoe.response==1 && aoe.sector_count>0 && aoe.aflags.w==0",
            ["-e", "frame.len", "-e", "aoe.sector_count"],
        )
    } else {
        ("tcp.len>1000", ["-e", "frame.len", "-e", "tcp.len"])
    };
    args.extend(["-Y".into(), filter.into(), "-T".into(), "fields".into()]);
    args.extend(fields.iter().map(|s| s.to_string()));
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let out = run(&argv)?;
    let mut counts: std::collections::BTreeMap<u32, usize> = Default::default();
    for l in out.lines() {
        let v: Vec<u32> = l
            .split_whitespace()
            .filter_map(|x| x.split(',').last()?.parse().ok())
            .collect();
        if v.len() == 2 {
            let payload = if p == "aoe" { v[1] * 512 } else { v[1] };
            *counts.entry(v[0].saturating_sub(payload)).or_default() += 1;
        }
    }
    let mut m = vec!["tshark".to_string(), "-r".into(), pcap_s.into()];
    m.extend(tshark_decode_args());
    m.extend(["-Y".into(), "_ws.malformed".into()]);
    let margv: Vec<&str> = m.iter().map(|s| s.as_str()).collect();
    let malformed = run(&margv)?.lines().count();
    let frames = counts.values().sum();
    let (&bytes_per_frame, _) = counts
        .iter()
        .max_by_key(|(_, n)| **n)
        .context("no data frames in the capture")?;
    Ok(Overhead {
        path: net.kind.name().into(),
        protocol: p.into(),
        bytes_per_frame,
        frames,
        malformed,
    })
}

/// tshark options that decode the pseudowire (Ethernet with control word).
/// Wireshark's decode-as keys on the bottom label, the customer's. (Its
/// default heuristic also finds it: a first nibble of 0 after the stack.)
pub fn tshark_decode_args() -> Vec<String> {
    vec!["-d".into(), format!("mpls.label=={CUSTOMER_LABEL},pwethcw")]
}

/// Run the suite, print a table, write `out/route.json`.
pub fn run_suite(plan: &SuitePlan, exe: &Path, out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    let size = plan.copy_bytes.max(256 << 20);
    let mut samples = vec![];
    let mut overheads = vec![];
    let tag = format!("{}", std::process::id() % 100_000);
    for round in 0..plan.rounds {
        for kind in &plan.paths {
            let net = RouteNet::build(*kind, &tag, plan.mtu, exe)?;
            let _target = start_target(
                &net,
                exe,
                size,
                &out.join(format!("serve-{}.log", kind.name())),
            )?;
            for p in &plan.protocols {
                let url = url_for(&net, exe, p)?;
                if round == 0 {
                    match measure_overhead(&net, exe, &url, p, out) {
                        Ok(o) => overheads.push(o),
                        Err(e) => log::warn!("overhead of {p} over {}: {e:#}", kind.name()),
                    }
                }
                for (w, args) in WORKLOADS {
                    let before = net.router_cpu();
                    let pk = middle_packets(&net);
                    let (bw, iops, lat, wall, moved) = one_case(&net, exe, &url, w, args, plan)?;
                    let frames = middle_packets(&net).saturating_sub(pk);
                    let frames_per_mib = frames as f64 / (moved / (1 << 20) as f64).max(1e-9);
                    let router_cpu = cpu_fractions(&before, &net.router_cpu(), wall);
                    let router_us_per_frame = (!router_cpu.is_empty() && frames > 0).then(|| {
                        router_cpu.iter().map(|(_, c)| c * wall).sum::<f64>()
                            / router_cpu.len() as f64
                            / frames as f64
                            * 1e6
                    });
                    let cpu: Vec<String> = router_cpu
                        .iter()
                        .map(|(n, c)| format!("{n} {:.0}%", c * 100.0))
                        .collect();
                    eprintln!(
                        "route: round {round} {:6} {:5} {:18} {:8.1} MB/s {:8.0} IOPS {:7.0} us {:6.0} frames/MiB  {}{}",
                        kind.name(),
                        p,
                        w,
                        bw / 1e6,
                        iops,
                        lat,
                        frames_per_mib,
                        cpu.join(" "),
                        router_us_per_frame.map(|u| format!("  ({u:.1} us CPU/frame/router)")).unwrap_or_default()
                    );
                    samples.push(RouteSample {
                        round,
                        path: kind.name().into(),
                        protocol: p.clone(),
                        workload: w.into(),
                        bw_bytes: bw,
                        iops,
                        mean_lat_us: lat,
                        router_cpu,
                        frames_per_mib,
                        router_us_per_frame,
                    });
                }
            }
        }
    }
    let summary = summarize(&samples);
    for line in &summary {
        println!("{line}");
    }
    for o in &overheads {
        println!(
            "header bytes per data frame: {:6} {:5} {} B ({} frames; tshark: {} malformed)",
            o.path, o.protocol, o.bytes_per_frame, o.frames, o.malformed
        );
    }
    let json = serde_json::json!({ "plan": format!("{plan:?}"), "samples": samples, "overheads": overheads, "summary": summary });
    std::fs::write(out.join("route.json"), serde_json::to_string_pretty(&json)?)?;
    println!("route: results in {}", out.join("route.json").display());
    Ok(())
}

/// Median per (path, protocol, workload), and each path's cost against
/// direct (median over rounds of the per-round ratio).
pub fn summarize(samples: &[RouteSample]) -> Vec<String> {
    let median = |mut v: Vec<f64>| -> f64 {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        if v.is_empty() {
            0.0
        } else {
            v[v.len() / 2]
        }
    };
    let mut keys: Vec<(String, String)> = vec![];
    for s in samples {
        let k = (s.protocol.clone(), s.workload.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut lines = vec![];
    for (p, w) in keys {
        let bw = |path: &str, round: u32| {
            samples
                .iter()
                .find(|s| s.path == path && s.protocol == p && s.workload == w && s.round == round)
                .map(|s| s.bw_bytes)
        };
        let rounds: Vec<u32> = samples
            .iter()
            .map(|s| s.round)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut parts = vec![];
        for path in ["direct", "mpls", "vxlan"] {
            let v: Vec<f64> = rounds.iter().filter_map(|r| bw(path, *r)).collect();
            if v.is_empty() {
                continue;
            }
            let mut s = format!("{path} {:.1} MB/s", median(v) / 1e6);
            if path != "direct" {
                let ratios: Vec<f64> = rounds
                    .iter()
                    .filter_map(|r| Some(bw(path, *r)? / bw("direct", *r)?))
                    .collect();
                if !ratios.is_empty() {
                    s.push_str(&format!(
                        " ({:+.1}% vs direct)",
                        (median(ratios) - 1.0) * 100.0
                    ));
                }
            }
            parts.push(s);
        }
        lines.push(format!("{p:5} {w:18} {}", parts.join(", ")));
    }
    lines
}

/// `blockwire lab --suite route [--path ...] [--protocols ...] [--quick]`.
pub fn run_cli(args: &crate::LabArgs) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    anyhow::ensure!(
        unsafe { libc::geteuid() } == 0,
        "the route suite creates network namespaces: run it as root"
    );
    let mut plan = SuitePlan::new(args.quick);
    if let Some(p) = &args.path {
        plan.paths = p
            .split(',')
            .filter(|x| !x.is_empty())
            .map(PathKind::parse)
            .collect::<anyhow::Result<_>>()?;
    }
    if let Some(p) = &args.protocols {
        plan.protocols = p
            .split(',')
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect();
    }
    if let Some(m) = &args.mtu {
        plan.mtu = m
            .split(',')
            .next()
            .unwrap_or("9000")
            .parse()
            .context("--mtu")?;
    }
    if let Some(r) = args.repeat {
        plan.rounds = r.max(1);
    }
    if let Some(r) = args.runtime {
        plan.runtime = r as f64;
    }
    if let Some(s) = &args.size {
        plan.copy_bytes = crate::plan::parse_size(s)?;
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("lab-route"));
    run_suite(&plan, &std::env::current_exe()?, &out)
}
