//! Routed paths between a client namespace and a target namespace, for the
//! `route` suite (STUDIES.md §3) and the MPLS tests:
//!
//! - `direct`: one veth between client and target.
//! - `mpls-bpf`, `mpls-userspace`: client - LER - LSR - LSR - LSR - LER -
//!   target, every router a `blockwire router` in its own namespace, veths
//!   between neighbours, forwarding with the BPF programs in the kernel or
//!   in userspace on AF_PACKET (`--datapath`). The edges carry every customer
//!   frame (AoE, ARP, IPv4) as an Ethernet pseudowire under a two-label
//!   stack; see `bw-mpls` and `bw-router`.
//! - `vxlan`: client and target joined by kernel VXLAN over an IPv4 veth.
//!
//! Every path gives the client and the target one interface (`CUSTOMER_IF`)
//! on the same IPv4 subnet, so AoE, iSCSI and NVMe/TCP run unchanged over
//! each. Segmentation offloads and transmit checksum offload are off on
//! every endpoint: a software router relays frames as they are on the wire,
//! so it needs real MTU-sized frames with finished checksums, and the other
//! paths are set up the same way so the comparison is fair.
//!
//! Everything is tracked by the lab's cleanup registry (`crate::cleanup`)
//! while it is created, and removed on drop, on error and on Ctrl-C: router
//! processes by PID, then the namespaces (which take their veths and VXLAN
//! devices with them). The BPF datapath's programs and links belong to the
//! router processes' file descriptors (tcx and XDP links, no qdisc, no
//! pins), so ending a router removes them, even with SIGKILL.

// The suite (`suite`) and its CPU sampling (`cpu`) stand on the paths
// built here, never the other way round.
pub mod cpu;
pub mod suite;

use crate::cleanup::{registry, Resource, Token};
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

/// Who forwards on the MPLS path (`blockwire router --datapath`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Datapath {
    /// tc (tcx) and XDP programs in the kernel.
    Bpf,
    /// AF_PACKET sockets and the bw-mpls state machine in a process.
    Userspace,
}

impl Datapath {
    pub fn name(&self) -> &'static str {
        match self {
            Datapath::Bpf => "bpf",
            Datapath::Userspace => "userspace",
        }
    }
}

/// One `--path` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PathChoice {
    Direct,
    Mpls,
    MplsBpf,
    MplsUserspace,
    Vxlan,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    Direct,
    Mpls(Datapath),
    Vxlan,
}

impl PathKind {
    pub fn name(&self) -> &'static str {
        match self {
            PathKind::Direct => "direct",
            PathKind::Mpls(Datapath::Bpf) => "mpls-bpf",
            PathKind::Mpls(Datapath::Userspace) => "mpls-userspace",
            PathKind::Vxlan => "vxlan",
        }
    }
    /// The paths `choice` names; `mpls` alone stands for one path per
    /// datapath in `datapaths`.
    pub fn of_choice(choice: PathChoice, datapaths: &[Datapath]) -> Vec<PathKind> {
        match choice {
            PathChoice::Direct => vec![PathKind::Direct],
            PathChoice::Mpls => datapaths.iter().map(|d| PathKind::Mpls(*d)).collect(),
            PathChoice::MplsBpf => vec![PathKind::Mpls(Datapath::Bpf)],
            PathChoice::MplsUserspace => vec![PathKind::Mpls(Datapath::Userspace)],
            PathChoice::Vxlan => vec![PathKind::Vxlan],
        }
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
    /// The process and its entry in the cleanup registry.
    child: Option<(Token, Child)>,
    log: PathBuf,
}

impl RouterProc {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.1.id())
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
    /// The two ends (namespace, interface) of the link in the middle of the
    /// path: the client-side end first. Each end's receive counter and
    /// capture see one direction on every datapath (the BPF routers hand
    /// frames straight to the next router's ingress, so a sender's egress
    /// shows nothing).
    pub middle: [(String, String); 2],
    namespaces: Vec<(String, Token)>,
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

/// A long-lived child (router, target), tracked by the cleanup registry.
pub fn spawn_service(cmd: &mut Command, what: &str) -> anyhow::Result<(Token, Child)> {
    registry().spawn(cmd, what, crate::cleanup::Role::Service)
}

/// A child that does one job and ends (bench, verify, capture), tracked.
pub fn spawn_workload(cmd: &mut Command, what: &str) -> anyhow::Result<(Token, Child)> {
    registry().spawn(cmd, what, crate::cleanup::Role::Workload)
}

/// Run `cmd` to the end as a child the cleanup registry knows (so Ctrl-C
/// stops it too); its stdout, or an error with its stderr.
pub fn tracked_output(cmd: &mut Command, what: &str) -> anyhow::Result<String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (token, child) = spawn_workload(cmd, what)?;
    let out = child.wait_with_output();
    registry().forget(token);
    let out = out.with_context(|| format!("waiting for {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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
            middle: Default::default(),
            namespaces: vec![],
            exe: exe.to_path_buf(),
            logdir,
        };
        // On error, Drop removes whatever was made.
        let (c, t) = (net.client_ns.clone(), net.target_ns.clone());
        net.add_ns(&c)?;
        net.add_ns(&t)?;
        net.middle = match kind {
            PathKind::Direct => net.join_direct(&c, &t)?,
            PathKind::Vxlan => net.join_vxlan(&c, &t)?,
            PathKind::Mpls(datapath) => net.join_mpls(&c, &t, tag, datapath)?,
        };
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

    /// The direct path: one veth between client and target. Returns the
    /// middle link's two ends.
    fn join_direct(&self, c: &str, t: &str) -> anyhow::Result<[(String, String); 2]> {
        veth(c, CUSTOMER_IF, t, CUSTOMER_IF, self.mtu)?;
        Ok([
            (c.to_string(), CUSTOMER_IF.into()),
            (t.to_string(), CUSTOMER_IF.into()),
        ])
    }

    /// VXLAN over a veth underlay (id 42, port 4789): the underlay's MTU
    /// carries the encapsulation.
    fn join_vxlan(&self, c: &str, t: &str) -> anyhow::Result<[(String, String); 2]> {
        veth(c, "under0", t, "under0", self.mtu + VXLAN_EXTRA)?;
        for (ns, me, peer) in [
            (c, "198.19.0.2", "198.19.0.1"),
            (t, "198.19.0.1", "198.19.0.2"),
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
                &["ip", "link", "set", CUSTOMER_IF, "mtu", &self.mtu.to_string()],
            )?;
            offloads_off(ns, "under0");
        }
        Ok([(c.to_string(), "under0".into()), (t.to_string(), "under0".into())])
    }

    /// MPLS through five routers (edge, three switches, edge), each a
    /// namespace running `datapath`; the core links carry the label stack.
    fn join_mpls(&mut self, c: &str, t: &str, tag: &str, datapath: Datapath) -> anyhow::Result<[(String, String); 2]> {
        let names: Vec<String> = ROUTERS.iter().map(|r| format!("bwr{tag}-{r}")).collect();
        for n in &names {
            self.add_ns(n)?;
        }
        let core = self.mtu + MPLS_CORE_EXTRA;
        // Port names: edges "cust" and "core", switches "west" and "east".
        let ports = |r: usize| -> [&'static str; 2] {
            match r {
                0 => ["cust", "core"],
                4 => ["core", "cust"],
                _ => ["west", "east"],
            }
        };
        veth(c, CUSTOMER_IF, &names[0], "cust", self.mtu)?;
        for r in 0..4 {
            veth(&names[r], ports(r)[1], &names[r + 1], ports(r + 1)[0], core)?;
        }
        veth(&names[4], "cust", t, CUSTOMER_IF, self.mtu)?;
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
            let args = router_args(r, datapath);
            self.start_router(ROUTERS[r], n, args)?;
        }
        Ok([
            (names[1].clone(), "east".into()),
            (names[2].clone(), "west".into()),
        ])
    }

    fn add_ns(&mut self, ns: &str) -> anyhow::Result<()> {
        let (token, _) = registry().create(Resource::Netns(ns.to_string()), || {
            run(&["ip", "netns", "add", ns])
        })?;
        self.namespaces.push((ns.to_string(), token));
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
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &p.ns])
            .arg(&self.exe)
            .args(["router", "--name", &p.name])
            .args(&p.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(logf);
        p.child = Some(spawn_service(&mut cmd, &format!("router {}", p.name))?);
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
            if let Some(st) = p.child.as_mut().and_then(|c| c.1.try_wait().ok().flatten()) {
                if let Some((t, _)) = p.child.take() {
                    registry().forget(t);
                }
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
        if let Some((t, _)) = p.child.take() {
            registry().release(t)?;
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

    /// Where to capture the target's replies (data frames of reads) in the
    /// middle of the path: the client-side end of the middle link.
    pub fn capture_point(&self) -> (String, String) {
        self.middle[0].clone()
    }

    /// PIDs of every router process still running.
    pub fn pids(&self) -> Vec<u32> {
        self.routers.iter().filter_map(|p| p.pid()).collect()
    }

    /// Namespaces this path created (all gone after drop).
    pub fn namespaces(&self) -> Vec<String> {
        self.namespaces.iter().map(|(n, _)| n.clone()).collect()
    }

    fn wait_up(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        for (ns, _) in &self.namespaces {
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
fn router_args(r: usize, datapath: Datapath) -> Vec<String> {
    let mut a = vec![format!("--datapath={}", datapath.name())];
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
    if let Err(e) = crate::network::offload::Offload::Routed.apply(&crate::hosts::host::Host::LocalNamespace(ns.to_string()), ifname) {
        log::warn!("offloads on {ifname} in {ns}: {e}");
    }
}

impl Drop for RouteNet {
    fn drop(&mut self) {
        // Routers first (SIGTERM together: their grace periods overlap),
        // then the namespaces they ran in.
        crate::cleanup::kill_all(&self.pids());
        for p in &mut self.routers {
            if let Some((t, _)) = p.child.take() {
                registry().forget(t);
            }
        }
        for (ns, t) in self.namespaces.drain(..).rev() {
            if let Err(e) = registry().release(t) {
                log::warn!("removing namespace {ns}: {e:#}");
            }
        }
        let _ = std::fs::remove_dir_all(&self.logdir);
    }
}
