//! The `route` suite (STUDIES.md §3): the same workloads over each path
//! (direct, MPLS with each router datapath, VXLAN), interleaved within
//! rounds, with the CPU of every router and of everything else
//! (`super::cpu`), and the header bytes per frame from captures in the
//! middle of each path. The results go into the lab's results.json
//! (`Results::route`), which `blockwire lab report` renders
//! (`super::report`).

use super::cpu::CpuSnapshot;
use super::{
    spawn_service, tracked_output, Datapath, PathChoice, PathKind, RouteNet, CLIENT_IP, CUSTOMER_IF, CUSTOMER_LABEL,
    TARGET_IP,
};
use crate::cleanup::{interrupted, registry};
use crate::hosts::host::Host;
use crate::subjects::{blockwire, Protocol, Subject};
use crate::subjects::process::TargetProcess;
use crate::network::topology::Link;
use anyhow::{bail, Context};
pub use bw_lab_results::route::{Overhead, RouteResults, RouteSample, RouterCpu, WORKLOADS};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What `blockwire lab --suite route` runs.
#[derive(Debug, Clone)]
pub struct SuitePlan {
    pub paths: Vec<PathKind>,
    pub protocols: Vec<Protocol>,
    pub mtu: u32,
    /// Seconds per bench run.
    pub runtime: f64,
    /// Bytes written then read back by the copy case (and the volume size floor).
    pub copy_bytes: u64,
    /// Rounds; paths are interleaved within each round (machine speed drifts).
    pub rounds: u32,
    pub quick: bool,
}

impl SuitePlan {
    pub fn new(quick: bool) -> SuitePlan {
        SuitePlan {
            paths: vec![
                PathKind::Direct,
                PathKind::Mpls(Datapath::Bpf),
                PathKind::Mpls(Datapath::Userspace),
                PathKind::Vxlan,
            ],
            protocols: Protocol::ALL.to_vec(),
            mtu: 9000,
            runtime: if quick { 2.0 } else { 5.0 },
            copy_bytes: if quick { 128 << 20 } else { 1 << 30 },
            rounds: if quick { 1 } else { 3 },
            quick,
        }
    }
}

/// The path's `blockwire serve`, stopped on drop.
struct Target(Option<TargetProcess>);

impl Target {
    fn pid(&self) -> Option<u32> {
        self.0.as_ref().map(|p| p.pid)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            p.stop();
        }
    }
}

/// A path as its ends see it: the customer interface and addresses on both
/// sides (what serve exports on and the client's URLs name).
fn customer_link(mtu: u32) -> Link {
    Link {
        mtu,
        target_if: CUSTOMER_IF.into(),
        client_if: CUSTOMER_IF.into(),
        target_ip: TARGET_IP.parse().expect("TARGET_IP is an IPv4 address"),
        client_ip: CLIENT_IP.parse().expect("CLIENT_IP is an IPv4 address"),
    }
}

/// Serve a RAM volume of `size` bytes over the plan's protocols on the
/// path's target; the process and, per protocol, the client's URL.
fn start_target(net: &RouteNet, exe: &Path, plan: &SuitePlan, size: u64, log: &Path) -> anyhow::Result<(Target, Vec<String>)> {
    let protocols = &plan.protocols;
    let link = customer_link(plan.mtu);
    let serve = blockwire::Serve {
        exe,
        host: &Host::LocalNamespace(net.target_ns.clone()),
        link: &link,
        backend: format!("ram:{size}"),
        log: Some(log.to_path_buf()),
        ready_within: Duration::from_secs(30),
        soft_digest: false,
        tls: false,
    };
    let (process, status) = blockwire::start(&serve, protocols);
    let target = Target(process);
    for (p, st) in status {
        if let Err(why) = st {
            bail!("serve {p}: {why}");
        }
    }
    let urls = protocols.iter().map(|&p| Subject::Blockwire(p).url(&link)).collect();
    Ok((target, urls))
}

fn client(net: &RouteNet, exe: &Path, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &net.client_ns])
        .arg(exe)
        .args(args);
    tracked_output(
        &mut cmd,
        &format!("blockwire {}", args.first().unwrap_or(&"")),
    )
}

/// Frames that crossed the middle link so far, both directions: what each
/// end received.
fn middle_packets(net: &RouteNet) -> u64 {
    net.middle
        .iter()
        .map(|(ns, ifname)| {
            let Ok(out) = Command::new("ip")
                .args(["-n", ns, "-s", "-j", "link", "show", "dev", ifname])
                .output()
            else {
                return 0;
            };
            let Ok(j) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
                return 0;
            };
            j[0]["stats64"]["rx"]["packets"].as_u64().unwrap_or(0)
        })
        .sum()
}

/// What one workload run gives: speed and what moved.
struct CaseResult {
    bw_bytes: f64,
    iops: f64,
    mean_lat_us: f64,
    wall_s: f64,
    bytes: f64,
}

fn one_case(
    net: &RouteNet,
    exe: &Path,
    url: &str,
    w: &str,
    args: &[&str],
    plan: &SuitePlan,
) -> anyhow::Result<CaseResult> {
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
        let bytes = 2.0 * plan.copy_bytes as f64;
        return Ok(CaseResult {
            bw_bytes: bytes / wall,
            iops: 0.0,
            mean_lat_us: 0.0,
            wall_s: wall,
            bytes,
        });
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
    Ok(CaseResult {
        bw_bytes: f("bw_bytes"),
        iops: f("iops"),
        mean_lat_us: j["lat_ns"]["mean"].as_f64().unwrap_or(0.0) / 1000.0,
        wall_s: wall,
        bytes: f("bytes"),
    })
}

/// Capture a short read of protocol `p` in the middle of the path and
/// return the most common header bytes per data frame.
fn measure_overhead(
    net: &RouteNet,
    exe: &Path,
    url: &str,
    p: Protocol,
    dir: &Path,
) -> anyhow::Result<Overhead> {
    // One retry: on a loaded machine a capture occasionally starts late.
    measure_overhead_once(net, exe, url, p, dir).or_else(|e| {
        anyhow::ensure!(!interrupted(), "interrupted");
        log::info!("overhead of {p} over {}: {e:#}; once more", net.kind.name());
        measure_overhead_once(net, exe, url, p, dir)
    })
}

fn run_text(args: &[String]) -> anyhow::Result<String> {
    let out = Command::new(&args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("cannot run {}", args[0]))?;
    anyhow::ensure!(
        out.status.success(),
        "`{}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn measure_overhead_once(
    net: &RouteNet,
    exe: &Path,
    url: &str,
    p: Protocol,
    dir: &Path,
) -> anyhow::Result<Overhead> {
    let pcap = dir.join(format!("{}-{p}.pcap", net.kind.name()));
    let bench = capture_while(net, &pcap, || {
        client(net, exe, &["bench", url, "--rw", "read", "--bs", "1M", "--iodepth", "4", "--ios", "64"])
    })?;
    bench.context("the read during the capture")?;
    let pcap_s = pcap.to_str().context("pcap path")?.to_string();
    let counts = frames_by_header_bytes(&pcap_s, p)?;
    let mut m = vec!["tshark".to_string(), "-r".into(), pcap_s];
    m.extend(tshark_decode_args());
    m.extend(["-Y".into(), "_ws.malformed".into()]);
    let malformed = run_text(&m)?.lines().count();
    let frames = counts.values().sum();
    let (&bytes_per_frame, _) = counts
        .iter()
        .max_by_key(|(_, n)| **n)
        .context("no data frames in the capture")?;
    Ok(Overhead {
        path: net.kind.name().into(),
        protocol: p.name().into(),
        bytes_per_frame,
        frames,
        malformed,
    })
}

/// Capture (up to 400 frames) at the path's capture point into `pcap`
/// while `run` runs; `run`'s outcome once the capture has stopped.
fn capture_while<T>(net: &RouteNet, pcap: &Path, run: impl FnOnce() -> T) -> anyhow::Result<T> {
    let (ns, ifname) = &net.capture_point();
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns", "exec", ns, "tshark", "-q", "-c", "400", "-i", ifname, "-w",
    ])
    .arg(pcap)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let (token, mut tshark) = spawn_service(&mut cmd, "tshark")?;
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
    let outcome = run();
    let deadline = Instant::now() + Duration::from_secs(10);
    while tshark.try_wait()?.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(tshark.id() as i32, libc::SIGINT) };
    let _ = tshark.wait();
    registry().forget(token);
    Ok(outcome)
}

/// The data frames of the capture by their bytes besides the payload
/// (headers, digests): how many frames had each count.
fn frames_by_header_bytes(pcap_s: &str, p: Protocol) -> anyhow::Result<std::collections::BTreeMap<u32, usize>> {
    let mut args = vec!["tshark".to_string(), "-r".into(), pcap_s.to_string()];
    args.extend(tshark_decode_args());
    let (filter, fields) = if p == Protocol::Aoe {
        (
            "aoe.response==1 && aoe.sector_count>0 && aoe.aflags.w==0",
            ["-e", "frame.len", "-e", "aoe.sector_count"],
        )
    } else {
        ("tcp.len>1000", ["-e", "frame.len", "-e", "tcp.len"])
    };
    args.extend(["-Y".into(), filter.into(), "-T".into(), "fields".into()]);
    args.extend(fields.iter().map(|s| s.to_string()));
    let out = run_text(&args)?;
    let mut counts: std::collections::BTreeMap<u32, usize> = Default::default();
    for l in out.lines() {
        let v: Vec<u32> = l
            .split_whitespace()
            .filter_map(|x| x.split(',').next_back()?.parse().ok())
            .collect();
        if v.len() == 2 {
            let payload = if p == Protocol::Aoe { v[1] * 512 } else { v[1] };
            *counts.entry(v[0].saturating_sub(payload)).or_default() += 1;
        }
    }
    Ok(counts)
}

/// tshark options that decode the pseudowire (Ethernet with control word).
/// Wireshark's decode-as keys on the bottom label, the customer's. (Its
/// default heuristic also finds it: a first nibble of 0 after the stack.)
pub fn tshark_decode_args() -> Vec<String> {
    vec!["-d".into(), format!("mpls.label=={CUSTOMER_LABEL},pwethcw")]
}

fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Run the suite into `res` (partial results stay there on error), printing
/// one line per case.
pub fn run_suite(
    plan: &SuitePlan,
    exe: &Path,
    out: &Path,
    res: &mut RouteResults,
) -> anyhow::Result<()> {
    *res = RouteResults {
        paths: plan.paths.iter().map(|p| p.name().to_string()).collect(),
        protocols: plan.protocols.iter().map(|p| p.name().to_string()).collect(),
        mtu: plan.mtu,
        runtime_s: plan.runtime,
        copy_bytes: plan.copy_bytes,
        rounds: plan.rounds,
        quick: plan.quick,
        ..Default::default()
    };
    let size = plan.copy_bytes.max(256 << 20);
    let ksoftirqd = super::cpu::ksoftirqd_pids();
    // Every path stands at once (its own namespaces, routers and target),
    // so each case runs on all paths back to back, in an order rotated from
    // case to case: on a shared machine, the paths compared are seconds apart.
    let mut live = vec![];
    for (i, kind) in plan.paths.iter().enumerate() {
        anyhow::ensure!(!interrupted(), "interrupted");
        let tag = format!("{}{i}", std::process::id() % 100_000);
        eprintln!("route: building path {}", kind.name());
        let net = RouteNet::build(*kind, &tag, plan.mtu, exe)?;
        let log = out.join(format!("serve-{}.log", kind.name()));
        let (target, urls) = start_target(&net, exe, plan, size, &log)?;
        live.push((net, target, urls));
    }
    for (net, _, urls) in &live {
        for (p, url) in plan.protocols.iter().zip(urls) {
            match measure_overhead(net, exe, url, *p, out) {
                Ok(o) => res.overheads.push(o),
                Err(e) if interrupted() => return Err(e),
                Err(e) => log::warn!("overhead of {p} over {}: {e:#}", net.kind.name()),
            }
        }
    }
    let mut case = 0;
    for round in 0..plan.rounds {
        for (pi, p) in plan.protocols.iter().enumerate() {
            for (w, args) in WORKLOADS {
                case += 1;
                for k in 0..live.len() {
                    anyhow::ensure!(!interrupted(), "interrupted");
                    let (net, target, urls) = &live[(k + case) % live.len()];
                    let s = measure_case(
                        net, target, &urls[pi], *p, w, args, round, plan, exe, &ksoftirqd,
                    )?;
                    eprintln!("{}", sample_line(&s));
                    res.samples.push(s);
                }
            }
        }
    }
    Ok(())
}

/// One workload on one path, with its CPU account and frame count.
#[allow(clippy::too_many_arguments)]
fn measure_case(
    net: &RouteNet,
    target: &Target,
    url: &str,
    p: Protocol,
    w: &str,
    args: &[&str],
    round: u32,
    plan: &SuitePlan,
    exe: &Path,
    ksoftirqd: &[u32],
) -> anyhow::Result<RouteSample> {
    let pids = net.pids();
    let load = load1();
    let before = CpuSnapshot::take(target.pid(), &pids, ksoftirqd);
    let pk = middle_packets(net);
    let c = one_case(net, exe, url, w, args, plan)?;
    let after = CpuSnapshot::take(target.pid(), &pids, ksoftirqd);
    let frames = middle_packets(net).saturating_sub(pk);
    let (per_router, cpu) = after.since(&before);
    let routers: Vec<RouterCpu> = net
        .routers
        .iter()
        .zip(per_router)
        .map(|(r, (process_s, bpf_s))| RouterCpu {
            name: r.name.clone(),
            process_s,
            bpf_s,
        })
        .collect();
    Ok(RouteSample {
        round,
        path: net.kind.name().into(),
        protocol: p.name().into(),
        workload: w.into(),
        bw_bytes: c.bw_bytes,
        iops: c.iops,
        mean_lat_us: c.mean_lat_us,
        wall_s: c.wall_s,
        bytes: c.bytes,
        frames_per_mib: frames as f64 / (c.bytes / (1 << 20) as f64).max(1e-9),
        routers,
        cpu,
        load1: load,
    })
}

/// One terminal line per measured case.
pub fn sample_line(s: &RouteSample) -> String {
    let routers: Vec<String> = s
        .routers
        .iter()
        .map(|r| {
            let t = (r.process_s + r.bpf_s) / s.wall_s.max(1e-9);
            format!("{} {:.0}%", r.name, t * 100.0)
        })
        .collect();
    format!(
        "route: round {} {:14} {:5} {:16} {:8.1} MB/s {:7.0} IOPS {:6.0} frames/MiB  CPU {:5.1} ms/MiB (client {:.2} s, target {:.2} s, routers {:.2} s, bpf {:.3} s, ksoftirqd {:.2} s)  {}{}  load {:.1}",
        s.round,
        s.path,
        s.protocol,
        s.workload,
        s.bw_bytes / 1e6,
        s.iops,
        s.frames_per_mib,
        s.cpu_ms_per_mib(),
        s.cpu.client_s,
        s.cpu.target_s,
        s.cpu.routers_s,
        s.cpu.bpf_s,
        s.cpu.ksoftirqd_s,
        routers.join(" "),
        s.router_us_per_frame()
            .map(|u| format!("  ({u:.2} us/frame/router)"))
            .unwrap_or_default(),
        s.load1
    )
}

/// The route suite as the lab runs it (see [`crate::suites::Suite`]).
pub struct RouteSuite {
    pub plan: SuitePlan,
    pub out: PathBuf,
    exe: PathBuf,
    results: bw_lab_results::Results,
}

/// What `blockwire lab --suite route` takes from the command line (the
/// lab's arguments, as lib.rs hands them over).
pub struct RouteChoices {
    pub quick: bool,
    pub datapath: Option<Vec<Datapath>>,
    pub path: Option<Vec<PathChoice>>,
    pub protocols: Option<Vec<crate::subjects::Protocol>>,
    pub mtu: Option<Vec<u32>>,
    pub repeat: Option<u32>,
    pub runtime: Option<u32>,
    pub size: Option<String>,
    pub out: Option<PathBuf>,
}

impl RouteSuite {
    /// `blockwire lab --suite route [--path ...] [--datapath ...] [--protocols ...] [--quick]`.
    pub fn from_args(args: &RouteChoices) -> anyhow::Result<RouteSuite> {
        // SAFETY: geteuid has no preconditions.
        anyhow::ensure!(
            unsafe { libc::geteuid() } == 0,
            "the route suite creates network namespaces: run it as root"
        );
        let mut plan = SuitePlan::new(args.quick);
        let datapaths: Vec<Datapath> = args
            .datapath
            .clone()
            .unwrap_or(vec![Datapath::Bpf, Datapath::Userspace]);
        let paths = args
            .path
            .clone()
            .unwrap_or(vec![PathChoice::Direct, PathChoice::Mpls, PathChoice::Vxlan]);
        plan.paths = paths
            .into_iter()
            .flat_map(|p| PathKind::of_choice(p, &datapaths))
            .collect();
        anyhow::ensure!(!plan.paths.is_empty(), "no path given");
        if let Some(p) = &args.protocols {
            plan.protocols = p.clone();
        }
        if let Some(m) = &args.mtu {
            plan.mtu = m.first().copied().unwrap_or(9000);
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
        std::fs::create_dir_all(&out)?;
        // Before any thread exists (see install_signal_handler).
        crate::cleanup::install_signal_handler()?;
        crate::hosts::local_state::start_run();
        let exe = std::env::current_exe()?;
        let mut results = bw_lab_results::Results {
            format: bw_lab_results::FORMAT,
            started_utc: bw_lab_results::utc_now(),
            machine: crate::hosts::proc::machine_info(),
            software: crate::subjects::software(&exe),
            ..Default::default()
        };
        results.params.quick = plan.quick;
        results.params.protocols = plan.protocols.iter().map(|p| p.name().to_string()).collect();
        results.params.mtus = vec![plan.mtu];
        results.params.suites = vec!["route".into()];
        results.params.repeat = plan.rounds;
        results.params.size_bytes = plan.copy_bytes;
        results.params.runtime_s = plan.runtime as u32;
        results.params.veth_offloads_off = true;
        Ok(RouteSuite { plan, out, exe, results })
    }
}

impl crate::suites::Suite for RouteSuite {
    fn estimate(&self) -> Option<String> {
        None
    }

    fn run_cases(&mut self) -> anyhow::Result<()> {
        let mut route = RouteResults::default();
        let outcome = run_suite(&self.plan, &self.exe, &self.out, &mut route);
        self.results.route = Some(route);
        outcome
    }

    fn results(&mut self) -> &mut bw_lab_results::Results {
        &mut self.results
    }

    fn finish(&mut self) {
        for line in bw_lab_report::route::text_summary(self.results.route.as_ref().unwrap_or(&RouteResults::default())) {
            println!("{line}");
        }
    }

    fn print_outcome(&self, _ok: bool) {
        println!("route: results in {}", self.out.join("results.json").display());
        println!("route: report in {}", self.out.join("report.html").display());
    }
}
