//! What a lab run will do, from the command line: subjects, MTUs, workloads,
//! repetitions and durations, with `--quick` shrinking everything.

use bw_lab_results::{Params, Workload};
use crate::subjects::{PeerChoice, PeerKind, Protocol, Subject};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;

/// The micro workloads a `--quick` run keeps.
const QUICK_MICRO: [MicroWorkload; 4] = [
    MicroWorkload::SeqRead1m,
    MicroWorkload::RandRead4kQd1,
    MicroWorkload::RandRead4kQd32,
    MicroWorkload::RandWrite4kQd32,
];

pub use bw_lab_results::{micro_workloads, sweep_workload};
use bw_lab_results::MicroWorkload;

/// `1G`, `64M`, `512K`, plain bytes (blockwire's one size syntax,
/// [`bw_block::parse_size`]); zero is refused.
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let n = bw_block::parse_size(s).map_err(|e| anyhow::anyhow!(e))?;
    anyhow::ensure!(n > 0, "invalid size {:?}: must be above zero", s.trim());
    Ok(n)
}

/// Command-line choices before defaults are applied.
#[derive(Debug, Clone, Default)]
pub struct Choices {
    pub quick: bool,
    pub protocols: Option<Vec<Protocol>>,
    pub peers: Option<Vec<PeerChoice>>,
    pub mtu: Option<Vec<u32>>,
    pub suite: Option<Vec<SuiteChoice>>,
    pub repeat: Option<u32>,
    pub size: Option<String>,
    pub runtime: Option<u32>,
    pub sweep_runtime: Option<u32>,
    /// `--idle-wait`: the whole run's budget for waiting on an idle machine
    /// (None: by `quick`).
    pub idle_wait: Option<f64>,
    pub no_baseline: bool,
    pub link: Option<Vec<String>>,
    pub client_mem: Option<Vec<String>>,
    pub fs_workloads: Option<Vec<String>>,
    pub fs_runtime: Option<u32>,
    /// `--tcp-congestion`: auto, system or an algorithm for the lab's
    /// namespaces (None: auto).
    pub tcp_congestion: Option<String>,
    /// `--micro-workloads`: the micro workloads to run (None: by `quick`).
    pub micro_workloads: Option<Vec<String>>,
    /// `--fs`, `--fsync`: the fs suite's file systems and fsync handling
    /// (None: ext4, honoured).
    pub fs_kinds: Option<Vec<String>>,
    pub fsync: Option<Vec<String>>,
    /// `--offload`: NIC offloads on the lab's links (None: the default).
    pub offload: Option<Vec<String>>,
    /// `--digest`: iSCSI/NVMe-TCP digests (None: none).
    pub digest: Option<Vec<String>>,
    /// `--tls`: NVMe/TCP over TLS (None: off).
    pub tls: Option<Vec<String>>,
    /// `--subject NAME=URL`: the user's own storage, measured beside the rest.
    pub externals: Vec<&'static crate::subjects::external::External>,
    /// Total memory of the machine (bytes), for the default `--client-mem`.
    pub mem_total: u64,
    /// `v1`/`v2`: where the memory controller is (from `cgroup::detect`).
    pub cgroup: String,
    /// The system's TCP congestion control and the algorithms the kernel
    /// has (`bw_net::tcp::system_default`, `available`), for `auto`.
    pub system_congestion: String,
    pub available_congestion: String,
}

/// One `--suite` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SuiteChoice {
    Net,
    Micro,
    Sweep,
    Fs,
    /// net, micro, sweep and fs.
    All,
    /// The routed-path suite, which runs alone (`crate::suites::route`).
    Route,
}

/// Suites in run order; `all` is every one of them.
pub const ALL_SUITES: [(SuiteChoice, &str); 4] =
    [(SuiteChoice::Net, "net"), (SuiteChoice::Micro, "micro"), (SuiteChoice::Sweep, "sweep"), (SuiteChoice::Fs, "fs")];

/// The fs workloads `--quick` runs: one personality, the one with an fsync
/// in every loop (the protocol's flush is on its path).
pub const QUICK_FS: [&str; 1] = ["varmail"];

/// The default client memory limits: 256 MiB and 2 GiB (the study's
/// 512 MiB and 4 GiB, halved for a smaller machine), the larger one at most
/// a quarter of the machine's memory.
pub fn default_client_mem(mem_total: u64) -> Vec<u64> {
    let large = (2 * GIB).min(mem_total / 4).max(512 * MIB);
    vec![256 * MIB, large]
}

/// The fs suite's parameters for a volume of `size` bytes.
fn fs_params(c: &Choices, size: u64, repeat: u32) -> anyhow::Result<crate::suites::fs::workloads::FsParams> {
    let workloads: Vec<String> = match &c.fs_workloads {
        Some(v) => v.iter().map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect(),
        None if c.quick => QUICK_FS.iter().map(|s| s.to_string()).collect(),
        None => crate::suites::fs::workloads::ALL
            .iter()
            .map(|w| w.name().to_string())
            .collect(),
    };
    anyhow::ensure!(!workloads.is_empty(), "no fs workload given");
    for w in &workloads {
        crate::suites::fs::workloads::FsWorkload::parse(w)?;
    }
    let mut client_mem: Vec<u64> = match &c.client_mem {
        Some(v) => v
            .iter()
            .filter(|x| !x.trim().is_empty())
            .map(|x| parse_size(x))
            .collect::<anyhow::Result<_>>()?,
        None if c.quick => default_client_mem(c.mem_total)[..1].to_vec(),
        None => default_client_mem(c.mem_total),
    };
    client_mem.sort();
    client_mem.dedup();
    anyhow::ensure!(!client_mem.is_empty(), "no --client-mem given");
    anyhow::ensure!(
        client_mem[0] >= 64 * MIB,
        "--client-mem below 64M leaves the workloads no room to run"
    );
    let smallest = client_mem[0];
    // Files of fileserver scaled to about a third of the volume (filebench's
    // 10000 x 128 KiB is 1.25 GiB); webserver and varmail (16 MiB) as they are.
    let fileserver_bytes = 10_000 * 128 * KIB;
    let fileserver_div = fileserver_bytes.div_ceil(size / 3).max(1) as usize;
    let small_volume_div = if c.quick { 4 } else { 1 };
    let flowop_scale = vec![
        ("webserver".to_string(), small_volume_div, 1),
        (
            "fileserver".to_string(),
            fileserver_div.max(small_volume_div),
            1,
        ),
        ("varmail".to_string(), small_volume_div, 1),
        ("oltp".to_string(), 1, 1),
        ("oltp-direct".to_string(), 1, 1),
    ];
    // Twice the smallest limit (so it cannot all be cached), within half the volume.
    let big_file = (2 * smallest).min(size / 2).max(16 * MIB) / MIB * MIB;
    Ok(crate::suites::fs::workloads::FsParams {
        workloads,
        client_mem,
        cgroup: c.cgroup.clone(),
        repeat,
        runtime_s: c.fs_runtime.unwrap_or(if c.quick { 2 } else { 4 }).max(1),
        flowop_scale,
        postmark_files: if c.quick { 1000 } else { 5000 },
        postmark_transactions: if c.quick { 5000 } else { 20_000 },
        bonnie_size: big_file,
        iogen_size: big_file,
        iogen_jobs: 4,
        iogen_bs: 8 * KIB,
        iogen_read_pct: 70,
    })
}

/// The distinct names of one of the fs factors, in run order.
fn fs_names(combos: &[(crate::suites::fs::fs_kind::FsKind, crate::suites::fs::fs_kind::Fsync)], name: impl Fn(&(crate::suites::fs::fs_kind::FsKind, crate::suites::fs::fs_kind::Fsync)) -> &'static str) -> Vec<String> {
    let mut v: Vec<String> = vec![];
    for c in combos {
        if !v.iter().any(|x| x == name(c)) {
            v.push(name(c).to_string());
        }
    }
    v
}

/// `--mtu`, or the default, in range.
/// `--protocols` and `--peers`: every protocol and the default plan's
/// peers unless named; nvmet serves NVMe/RDMA too (on the same subsystem)
/// where the run measures NVMe/RDMA.
fn chosen_protocols_and_peers(c: &Choices) -> (Vec<Protocol>, Vec<PeerKind>) {
    let protocols: Vec<Protocol> = match &c.protocols {
        Some(v) => v.clone(),
        None => Protocol::ALL.to_vec(),
    };
    // `none` alone (or given with peers) leaves them out.
    let mut peers: Vec<PeerKind> = match &c.peers {
        Some(v) => v.iter().filter_map(|p| p.0).collect(),
        // Some only when named (ganesha: with it the default plans
        // outgrow their time budgets, the test below).
        None => PeerKind::all().iter().copied().filter(|p| p.target().in_default_plan()).collect(),
    };
    if peers.contains(&PeerKind::Nvmet) && protocols.contains(&Protocol::NvmeRdma) && !peers.contains(&PeerKind::NvmetRdma) {
        peers.push(PeerKind::NvmetRdma);
    }
    (protocols, peers)
}

/// `--size`: the backing file's (and every volume's) size.
fn chosen_size(c: &Choices) -> anyhow::Result<u64> {
    let size = match &c.size {
        Some(s) => parse_size(s)?,
        None if c.quick => 128 * MIB,
        None => GIB,
    };
    anyhow::ensure!(size >= MIB, "--size must be at least 1 MiB");
    Ok(size)
}

/// `--micro-workloads`, by name; else `--quick`'s four or all seven.
fn chosen_micro(c: &Choices) -> anyhow::Result<Vec<Workload>> {
    if let Some(names) = &c.micro_workloads {
        let all = micro_workloads();
        let mut v = vec![];
        for n in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
            let w = all.iter().find(|w| w.name == n);
            v.push(w.cloned().ok_or_else(|| anyhow::anyhow!("--micro-workloads {n:?}: not one of {:?}", all.iter().map(|w| w.name.as_str()).collect::<Vec<_>>()))?);
        }
        anyhow::ensure!(!v.is_empty(), "no micro workload given");
        Ok(v)
    } else if c.quick {
        // The demo's five-minute budget: the workloads the findings use.
        Ok(micro_workloads().into_iter().filter(|w| QUICK_MICRO.iter().any(|q| q.name() == w.name)).collect())
    } else {
        Ok(micro_workloads())
    }
}

/// The net suite's iperf3 runs per link: one per stream count and repeat.
fn net_runs(c: &Choices, repeat: u32) -> u32 {
    // iperf3's rates hardly move between runs: three repeats are plenty.
    let net_repeat = if c.quick { 1 } else { repeat.min(3) };
    crate::suites::net::iperf::STREAMS.len() as u32 * net_repeat
}

fn chosen_mtus(c: &Choices) -> anyhow::Result<Vec<u32>> {
    let mtus: Vec<u32> = match &c.mtu {
        Some(v) => v.clone(),
        None if c.quick => vec![1500],
        None => vec![1500, 9000],
    };
    anyhow::ensure!(!mtus.is_empty(), "no MTU given");
    for &m in &mtus {
        anyhow::ensure!(
            (576..=65_535).contains(&m),
            "MTU {m} out of range 576..65535"
        );
    }
    Ok(mtus)
}

/// The storage suites `--suite` names, in run order.
fn chosen_suites(c: &Choices) -> anyhow::Result<Vec<String>> {
    let asked: Vec<SuiteChoice> = c.suite.clone().unwrap_or(vec![SuiteChoice::All]);
    anyhow::ensure!(!asked.is_empty(), "no suite given");
    anyhow::ensure!(
        !asked.contains(&SuiteChoice::Route),
        "the route suite runs alone (--suite route)"
    );
    let suites: Vec<String> = ALL_SUITES
        .iter()
        .filter(|(s, _)| asked.iter().any(|a| *a == SuiteChoice::All || a == s))
        .map(|(_, name)| name.to_string())
        .collect();
    Ok(suites)
}

/// `--link` shapes, or the plain veth.
fn chosen_links(c: &Choices) -> anyhow::Result<Vec<crate::suites::net::iperf::LinkShape>> {
    let links: Vec<crate::suites::net::iperf::LinkShape> = match &c.link {
        Some(v) => v
            .iter()
            .filter(|x| !x.trim().is_empty())
            .map(|x| crate::suites::net::iperf::parse_link(x))
            .collect::<anyhow::Result<_>>()?,
        None => vec![crate::suites::net::iperf::LinkShape::none()],
    };
    anyhow::ensure!(!links.is_empty(), "no link given");
    Ok(links)
}

/// `--tcp-congestion`: the policy, and the algorithm the lab's namespaces
/// take (empty: they keep the system's).
///
/// `auto` (the default), as `serve`'s for connections within one machine:
/// where the system's algorithm paces by timer (BBR), the namespaces run an
/// unpaced one (cubic). The lab's veth links have no qdisc, so BBR paces
/// every connection with a timer at a rate taken from when ACKs return on
/// CPUs the sender shares with the receiver: on this project's 2-vCPU
/// machines that halved iperf3's single stream and turned the seqread-1m
/// verdict at MTU 9000 (NVMe/TCP 1.35-1.49x iSCSI under BBR, 0.92-1.11 under
/// cubic, 3 runs each; docs/notes/2026-11-28-merges-20.md), so a verdict
/// followed a sysctl the user never chose for the lab. Debian's default is
/// cubic; between real hosts each keeps its own (`hosts::remote::adapt_plan`).
fn chosen_tcp_congestion(c: &Choices) -> anyhow::Result<(bw_net::tcp::Congestion, String)> {
    use bw_net::tcp::Congestion;
    let policy = match c.tcp_congestion.as_deref().map(str::parse::<Congestion>) {
        None => Congestion::Auto,
        Some(Ok(p)) => p,
        Some(Err(e)) => anyhow::bail!("--tcp-congestion {e}"),
    };
    let algorithm = match &policy {
        Congestion::Auto => bw_net::tcp::unpaced_in_place_of(&c.system_congestion, &c.available_congestion).unwrap_or_default().to_string(),
        Congestion::System => String::new(),
        Congestion::Named(n) => n.clone(),
    };
    Ok((policy, algorithm))
}

#[derive(Debug, Clone)]
pub struct Plan {
    /// What results.json records of the plan.
    pub params: Params,
    /// blockwire's protocols to measure.
    pub protocols: Vec<Protocol>,
    pub peers: Vec<PeerKind>,
    /// `--subject`: external subjects, after the peers.
    pub externals: Vec<&'static crate::subjects::external::External>,
    pub links: Vec<crate::suites::net::iperf::LinkShape>,
    /// iperf3 runs per link and MTU (0 without the net suite).
    pub net_runs: u32,
    pub micro: Vec<Workload>,
    pub sweep: Vec<Workload>,
    pub baseline: bool,
    /// The fs suite, when it runs.
    pub fs: Option<crate::suites::fs::workloads::FsParams>,
    /// The offload study's factors, every combination per link shape.
    pub offloads: Vec<crate::network::offload::Offload>,
    pub digests: Vec<crate::network::offload::Digest>,
    pub tls: Vec<crate::network::offload::Tls>,
    /// The fs suite's (file system, fsync) combinations, in run order.
    pub fs_combinations: Vec<(crate::suites::fs::fs_kind::FsKind, crate::suites::fs::fs_kind::Fsync)>,
    /// `--tcp-congestion` as given (`params.tcp_congestion` is what it
    /// chose for the namespaces).
    pub tcp_congestion: bw_net::tcp::Congestion,
}

/// A factor's `--LIST` values, parsed, in order without repeats; `default`
/// when none is given.
fn factor_list<T: PartialEq>(v: &Option<Vec<String>>, parse: impl Fn(&str) -> anyhow::Result<T>, default: T) -> anyhow::Result<Vec<T>> {
    let mut out: Vec<T> = vec![];
    for x in v.iter().flatten().map(|x| x.trim()).filter(|x| !x.is_empty()) {
        let t = parse(x)?;
        if !out.contains(&t) {
            out.push(t);
        }
    }
    if out.is_empty() {
        out.push(default);
    }
    Ok(out)
}

/// `--fs` x `--fsync`, or ext4 with fsync honoured.
fn chosen_fs_combinations(c: &Choices, size: u64) -> anyhow::Result<Vec<(crate::suites::fs::fs_kind::FsKind, crate::suites::fs::fs_kind::Fsync)>> {
    use crate::suites::fs::fs_kind::{FsKind, Fsync};
    let kinds = factor_list(&c.fs_kinds, FsKind::parse, FsKind::Ext4)?;
    let syncs = factor_list(&c.fsync, Fsync::parse, Fsync::Honour)?;
    for k in &kinds {
        anyhow::ensure!(size >= k.min_size(), "--fs {}: mkfs needs a volume of at least {} MiB (--size)", k.name(), k.min_size() >> 20);
    }
    Ok(kinds.iter().flat_map(|&k| syncs.iter().map(move |&f| (k, f))).collect())
}

/// The offload study's factors.
type FactorLists = (Vec<crate::network::offload::Offload>, Vec<crate::network::offload::Digest>, Vec<crate::network::offload::Tls>);

/// `--offload`, `--digest` and `--tls`, or the defaults (one setting each).
fn chosen_factors(c: &Choices) -> anyhow::Result<FactorLists> {
    use crate::network::offload::{Digest, Offload, Tls};
    Ok((
        factor_list(&c.offload, Offload::parse, Offload::MtuFrames)?,
        factor_list(&c.digest, Digest::parse, Digest::None)?,
        factor_list(&c.tls, Tls::parse, Tls::Off)?,
    ))
}

impl Plan {
    pub fn from_choices(c: &Choices) -> anyhow::Result<Plan> {
        let (protocols, peers) = chosen_protocols_and_peers(c);
        let mtus = chosen_mtus(c)?;
        let suites = chosen_suites(c)?;
        let links = chosen_links(c)?;
        let (offloads, digests, tls) = chosen_factors(c)?;
        // Five repeats: with fewer, no honest interval is narrow enough to
        // name a winner even when one subject needs 8x the CPU of another
        // (stats::ratio_of_means widens small samples' intervals). The
        // full run buys them with 2 s runs instead of 3.
        let repeat = c.repeat.unwrap_or(5);
        anyhow::ensure!(repeat >= 1, "--repeat must be at least 1");
        let size = chosen_size(c)?;
        let runtime_s = c.runtime.unwrap_or(if c.quick { 1 } else { 2 });
        let sweep_runtime_s = c.sweep_runtime.unwrap_or(1).max(1);
        anyhow::ensure!(runtime_s >= 1, "--runtime must be at least 1 s");
        let idle_budget_s = c.idle_wait.unwrap_or(if c.quick { 20.0 } else { 180.0 });
        anyhow::ensure!(idle_budget_s.is_finite() && idle_budget_s >= 0.0, "--idle-wait must be 0 or more seconds");
        let (sweep_numjobs, sweep_iodepth) = if c.quick {
            (vec![1, 8], vec![1, 16])
        } else {
            (vec![1, 4, 16, 64], vec![1, 4, 16, 64])
        };
        let micro = if suites.iter().any(|s| s == "micro") { chosen_micro(c)? } else { vec![] };
        let sweep = if suites.iter().any(|s| s == "sweep") {
            sweep_numjobs
                .iter()
                .flat_map(|&j| sweep_iodepth.iter().map(move |&d| sweep_workload(j, d)))
                .collect()
        } else {
            vec![]
        };
        let fs_combinations = chosen_fs_combinations(c, size)?;
        let fs = if suites.iter().any(|s| s == "fs") {
            // Three fs repeats (each case lays out its file set through ext4
            // first): five would take the full run past an hour.
            Some(fs_params(c, size, c.repeat.unwrap_or(3))?)
        } else {
            None
        };
        let net_runtime_s = if c.quick { 1 } else { 3 };
        let net_runs = if suites.iter().any(|s| s == "net") { net_runs(c, repeat) } else { 0 };
        let (tcp_congestion, tcp_algorithm) = chosen_tcp_congestion(c)?;
        let params = Params {
            links: links.iter().map(|l| l.name.clone()).collect(),
            net_runtime_s,
            quick: c.quick,
            protocols: protocols.iter().map(|p| p.name().to_string()).collect(),
            peers: peers.iter().map(|p| p.name().to_string()).collect(),
            mtus,
            suites,
            repeat,
            // The heat maps show means and name no winner: one run per point
            // is enough for a first look (and keeps the full run within an hour).
            sweep_repeat: 1,
            size_bytes: size,
            runtime_s,
            sweep_runtime_s,
            sweep_numjobs,
            sweep_iodepth,
            backing: String::new(),
            idle_max_wait_s: if c.quick { 1.0 } else { 3.0 },
            idle_budget_s,
            idle_threshold: 0.25,
            veth_offloads_off: false,
            veth_gro: false,
            link_shapes: links.clone(),
            fs: fs.clone(),
            tcp_congestion: tcp_algorithm,
            offloads: offloads.iter().map(|o| o.name().to_string()).filter(|n| !n.is_empty()).collect(),
            digests: if c.digest.is_some() { digests.iter().map(|d| d.name().to_string()).collect() } else { vec![] },
            tls: if c.tls.is_some() { tls.iter().map(|t| t.name().to_string()).collect() } else { vec![] },
            fs_kinds: if c.fs_kinds.is_some() { fs_names(&fs_combinations, |(k, _)| k.name()) } else { vec![] },
            fsyncs: if c.fsync.is_some() { fs_names(&fs_combinations, |(_, f)| f.name()) } else { vec![] },
        };
        Ok(Plan {
            params,
            protocols,
            peers,
            externals: c.externals.clone(),
            links,
            net_runs,
            micro,
            sweep,
            baseline: !c.no_baseline,
            fs,
            offloads,
            digests,
            tls,
            fs_combinations,
            tcp_congestion,
        })
    }

    /// Networked subjects over every factor combination: how many turns
    /// each micro and sweep case takes per MTU and link.
    pub fn subject_turns(&self) -> usize {
        self.factor_combinations().iter().map(|&(_, d, t)| self.subjects_for(d, t).len()).sum()
    }

    /// The (offload, digest, TLS) combinations each link shape runs, in order.
    pub fn factor_combinations(&self) -> Vec<(crate::network::offload::Offload, crate::network::offload::Digest, crate::network::offload::Tls)> {
        let mut v = vec![];
        for &o in &self.offloads {
            for &d in &self.digests {
                v.extend(self.tls.iter().map(|&t| (o, d, t)));
            }
        }
        v
    }

    /// The networked subjects a digest and TLS setting measures: all of
    /// them without either; with digests, blockwire's iSCSI and NVMe/TCP
    /// only (AoE has no digest, and the peers' own CRC code is not ours to
    /// switch); with TLS, those that serve NVMe/TCP over TLS (blockwire's
    /// NVMe/TCP, and nvmet's TCP port with tlshd and the kernel keyring on
    /// the target host).
    pub fn subjects_for(&self, digest: crate::network::offload::Digest, tls: crate::network::offload::Tls) -> Vec<Subject> {
        use crate::network::offload::{Digest, Tls};
        self.subjects()
            .into_iter()
            .filter(|s| digest == Digest::None || matches!(s, Subject::Blockwire(Protocol::Iscsi | Protocol::Nvme)))
            .filter(|s| tls == Tls::Off || s.serves_tls())
            .collect()
    }

    /// Networked subjects in run order: blockwire's protocols, the peers,
    /// then the external subjects.
    pub fn subjects(&self) -> Vec<Subject> {
        self.protocols
            .iter()
            .map(|&p| Subject::Blockwire(p))
            .chain(self.peers.iter().map(|&p| Subject::Peer(p)))
            .chain(self.externals.iter().map(|&e| Subject::External(e)))
            .collect()
    }

    /// The fs subjects: the networked ones and the local baseline.
    pub fn fs_subjects(&self) -> Vec<bw_lab_results::SubjectKey> {
        let mut v: Vec<bw_lab_results::SubjectKey> = self.subjects().into_iter().map(Subject::key).collect();
        if self.baseline {
            v.push(crate::suites::fs::workloads::LOCAL);
        }
        v
    }

    /// (workload, memory limit) pairs one fs subject runs per repetition.
    pub fn fs_cases(&self, local: bool) -> Vec<(crate::suites::fs::workloads::FsWorkload, u64)> {
        let Some(p) = &self.fs else { return vec![] };
        let mut v = vec![];
        for w in p
            .workloads
            .iter()
            .filter_map(|w| crate::suites::fs::workloads::FsWorkload::parse(w).ok())
        {
            if w.local_only() && !local {
                continue;
            }
            let limits = if w.at_every_limit() {
                &p.client_mem[..]
            } else {
                &p.client_mem[..1]
            };
            v.extend(limits.iter().map(|&m| (w, m)));
        }
        v
    }

    /// fs runs per link (every subject, every repetition, every file
    /// system and fsync setting).
    pub fn fs_runs(&self) -> u64 {
        let Some(p) = &self.fs else { return 0 };
        self.fs_subjects()
            .iter()
            .map(|s| self.fs_cases(*s == crate::suites::fs::workloads::LOCAL).len() as u64)
            .sum::<u64>()
            * p.repeat as u64
            * self.fs_combinations.len() as u64
    }

    /// How many bench runs the plan makes (for the progress bar).
    pub fn total_runs(&self) -> u64 {
        let r = self.params.repeat as u64;
        let n_subj = self.subject_turns() as u64;
        let n_mtu = self.params.mtus.len() as u64;
        let n_links = self.links.len() as u64;
        let micro = self.micro.len() as u64 * r;
        let sweep = self.sweep.len() as u64 * self.params.sweep_repeats() as u64;
        let iperf = self.net_runs as u64 * n_mtu * n_links;
        let net = n_subj * (micro + sweep) * n_mtu * n_links;
        let local = if self.baseline { micro + sweep } else { 0 };
        iperf + net + local + self.fs_runs() * n_links
    }
}

/// What a plan is expected to take, by part, in seconds: printed before
/// the run starts. Each run's measured seconds plus what it costs around
/// them, with the constants below, measured on this 2-core machine while
/// other builds ran (load average 7-9): a `--quick` run took 269 s,
/// estimated 296 s; the default fs suite for iSCSI and the local baseline
/// with one repetition took 272 s, estimated 316 s. A quiet machine is
/// faster.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Estimate {
    /// Filling the backing file, namespaces, starting targets.
    pub setup_s: f64,
    pub net_s: f64,
    pub micro_s: f64,
    pub sweep_s: f64,
    /// The local fio baseline of micro and sweep.
    pub local_s: f64,
    pub fs_s: f64,
    /// The most the run waits for an idle machine (its idle budget).
    pub idle_s: f64,
}

impl Estimate {
    pub fn total_s(&self) -> f64 {
        self.setup_s + self.net_s + self.micro_s + self.sweep_s + self.local_s + self.fs_s + self.idle_s
    }

    /// "about 54 min (net 1.6, micro 11.6, ..., idle waits up to 3.0 min)"
    /// for the terminal.
    pub fn describe(&self) -> String {
        let mut parts = vec![];
        for (name, s) in [("setup", self.setup_s), ("net", self.net_s), ("micro", self.micro_s), ("sweep", self.sweep_s), ("local", self.local_s), ("fs", self.fs_s), ("idle waits up to", self.idle_s)] {
            if s > 0.0 {
                parts.push(format!("{name} {:.1}", s / 60.0));
            }
        }
        format!("about {:.0} min ({} min)", self.total_s() / 60.0, parts.join(", "))
    }
}

/// Seconds around one `blockwire bench` run: starting it in the client
/// namespace, connecting, reading counters (measured 0.2-0.4 s).
const BENCH_AROUND_S: f64 = 0.3;
/// Around one local fio run (measured 0.7 s: fio starts slower).
const FIO_AROUND_S: f64 = 0.7;
/// Around one iperf3 run (server start, connect).
const IPERF_AROUND_S: f64 = 1.0;
/// Starting every target at one MTU.
const TARGETS_S: f64 = 2.0;
/// Namespaces, veths and idle checks before the first run.
const SETUP_S: f64 = 5.0;
/// Filling the backing file (tmpfs), MiB/s.
const FILL_MIB_PER_S: f64 = 500.0;
/// One fs turn: mkfs, mount and unmount of a subject (measured about 1 s
/// beyond its cases, with `blockwire umount` at 0.2 s).
const FS_TURN_S: f64 = 1.0;
/// Around one fs case: its cgroup, counters, cleaning its directory.
const FS_CASE_AROUND_S: f64 = 0.5;
/// Laying out files through ext4 on a subject (file sets, IOgen's file),
/// and Bonnie++'s streaming passes, MiB/s (measured 95-155 over iSCSI).
const FS_MIB_PER_S: f64 = 100.0;
/// PostMark's 20,000 transactions on 5,000 files (measured 2-7 s).
const POSTMARK_S: f64 = 5.0;

/// Seconds one fs case takes, from its parameters.
fn fs_case_s(w: crate::suites::fs::workloads::FsWorkload, p: &crate::suites::fs::workloads::FsParams) -> f64 {
    use crate::suites::fs::workloads::FsWorkload;
    let mib = |bytes: f64| bytes / MIB as f64;
    let run = p.runtime_s as f64;
    FS_CASE_AROUND_S
        + match w {
            FsWorkload::Flowop(name) => {
                let (files, threads) = p.scale_of(name);
                let made: f64 = bw_workload::flowop::personality(name, bw_workload::flowop::Scale { files, threads })
                    .map(|pers| {
                        pers.filesets
                            .iter()
                            .map(|f| f.count as f64 * f.size as f64 * f.prealloc_pct as f64 / 100.0)
                            .sum()
                    })
                    .unwrap_or(0.0);
                run + mib(made) / FS_MIB_PER_S
            }
            FsWorkload::Postmark => POSTMARK_S * p.postmark_transactions as f64 / 20_000.0,
            // Block write, rewrite (read and write), block read.
            FsWorkload::Bonnie => 4.0 * mib(p.bonnie_size as f64) / FS_MIB_PER_S,
            // The file is laid out first (IogenRaw's device needs none, but
            // it runs on the local baseline, which is no faster to time).
            FsWorkload::Iogen { .. } | FsWorkload::IogenRaw => run + mib(p.iogen_size as f64) / FS_MIB_PER_S,
        }
}

impl Plan {
    /// How long this plan takes (see [`Estimate`]).
    pub fn estimate(&self) -> Estimate {
        let p = &self.params;
        let (n_subj, n_mtu, n_links) = (self.subject_turns() as f64, p.mtus.len() as f64, self.links.len() as f64);
        let micro_one = self.micro.len() as f64 * p.repeat as f64;
        let sweep_one = self.sweep.len() as f64 * p.sweep_repeats() as f64;
        let bench = |runs: f64, secs: u32| runs * (secs as f64 + BENCH_AROUND_S);
        let fio = |runs: f64, secs: u32| runs * (secs as f64 + FIO_AROUND_S);
        let fs_s = match &self.fs {
            None => 0.0,
            Some(f) => {
                let turn = |local: bool| FS_TURN_S + self.fs_cases(local).iter().map(|&(w, _)| fs_case_s(w, f)).sum::<f64>();
                let subjects = self.subjects().len() as f64 * turn(false) + if self.baseline { turn(true) } else { 0.0 };
                subjects * f.repeat as f64 * n_links * self.fs_combinations.len() as f64
            }
        };
        let has_targets = !self.micro.is_empty() || !self.sweep.is_empty() || self.fs.is_some();
        let runs = self.total_runs() as f64;
        Estimate {
            setup_s: SETUP_S
                + p.size_bytes as f64 / MIB as f64 / FILL_MIB_PER_S
                + if has_targets { TARGETS_S * n_mtu * n_links } else { 0.0 },
            net_s: self.net_runs as f64 * n_mtu * n_links * (p.net_runtime_s as f64 + IPERF_AROUND_S),
            micro_s: bench(micro_one * n_subj * n_mtu * n_links, p.runtime_s),
            sweep_s: bench(sweep_one * n_subj * n_mtu * n_links, p.sweep_runtime_s),
            local_s: if self.baseline { fio(micro_one, p.runtime_s) + fio(sweep_one, p.sweep_runtime_s) } else { 0.0 },
            fs_s,
            idle_s: (runs * p.idle_max_wait_s).min(p.idle_budget_s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_quick() {
        let full = Plan::from_choices(&choices()).unwrap();
        assert_eq!(full.params.mtus, vec![1500, 9000]);
        assert_eq!(full.params.repeat, 5);
        assert_eq!(full.params.size_bytes, GIB);
        assert_eq!(full.sweep.len(), 16);
        assert_eq!(full.subjects().len(), 5);
        // fs: 4 personalities at 2 limits + oltp-direct, postmark, bonnie,
        // iogen, iogen-direct at one = 13 per subject, 14 locally (iogen-raw);
        // 5 subjects + local, 3 repetitions.
        let fs = full.fs.as_ref().unwrap();
        assert_eq!(fs.client_mem, vec![256 * MIB, 2 * GIB]);
        assert_eq!(full.fs_cases(false).len(), 13);
        assert_eq!(full.fs_cases(true).len(), 14);
        assert_eq!(full.fs_runs(), (5 * 13 + 14) * 3);
        // iperf3 4 stream counts x 3 x 2 MTUs + 5 subjects x (7 x 5 + 16) x 2 MTUs + local (35 + 16) + fs
        assert_eq!(full.total_runs(), 24 + 5 * (35 + 16) * 2 + 51 + 237);
        assert_eq!(full.params.suites, vec!["net", "micro", "sweep", "fs"]);
        let two_links = Plan::from_choices(&Choices {
            link: Some(list("none,1gbit")),
            ..choices()
        })
        .unwrap();
        assert_eq!(
            two_links.total_runs(),
            2 * (24 + 5 * (35 + 16) * 2 + 237) + 51
        );
        let some = Plan::from_choices(&Choices {
            suite: Some(vec![SuiteChoice::Net, SuiteChoice::Micro]),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(some.params.suites, vec!["net", "micro"]);
        assert!(some.sweep.is_empty());
        assert!(some.fs.is_none() && some.fs_runs() == 0);
        let quick = Plan::from_choices(&Choices {
            quick: true,
            ..choices()
        })
        .unwrap();
        assert_eq!(quick.params.mtus, vec![1500]);
        assert_eq!(quick.sweep.len(), 4);
        assert!(quick.params.size_bytes < GIB);
        // One personality at one limit on every subject.
        let qfs = quick.fs.as_ref().unwrap();
        assert_eq!(
            (qfs.workloads.clone(), qfs.client_mem.clone()),
            (vec!["varmail".to_string()], vec![256 * MIB])
        );
        assert_eq!(quick.fs_runs(), 6 * 3);
    }

    /// The budgets of issue 17: `make demo` (`--quick`) under 5 minutes,
    /// the full default (every suite, one link) under 60, with room left
    /// (the estimate ran 10-20% over measured runs on a busy machine).
    #[test]
    fn the_default_plans_keep_to_their_time_budgets() {
        let quick = Plan::from_choices(&Choices { quick: true, ..choices() }).unwrap().estimate();
        assert!(quick.total_s() <= 5.0 * 60.0, "{quick:?}: {}", quick.describe());
        let full = Plan::from_choices(&choices()).unwrap().estimate();
        assert!(full.total_s() <= 55.0 * 60.0, "{full:?}: {}", full.describe());
        // Every part is counted: the full plan has all of them.
        for (part, s) in [("net", full.net_s), ("micro", full.micro_s), ("sweep", full.sweep_s), ("local", full.local_s), ("fs", full.fs_s)] {
            assert!(s > 0.0, "{part} missing from {full:?}");
        }
        // A --link sweep repeats everything but the local baseline per link.
        let two = Plan::from_choices(&Choices { link: Some(list("none,1gbit")), ..choices() }).unwrap().estimate();
        let per_link = two.total_s() - full.total_s();
        assert!(per_link > 0.8 * (full.total_s() - full.local_s - full.idle_s - full.setup_s), "{per_link}");
        assert!(full.describe().starts_with("about 53 min (setup 0.2, net 1.6, micro 13.4, sweep 3.5, local 2.0, fs 29"), "{}", full.describe());
        // Shorter runs, fewer cases: a smaller estimate.
        let fs_only = Plan::from_choices(&Choices { suite: Some(vec![SuiteChoice::Fs]), protocols: Some(vec![Protocol::Iscsi]), peers: Some(vec![PeerChoice(None)]), repeat: Some(1), ..choices() }).unwrap().estimate();
        assert!(fs_only.total_s() < full.fs_s / 10.0 + 400.0 && fs_only.micro_s == 0.0, "{fs_only:?}");
    }

    fn list(s: &str) -> Vec<String> {
        s.split(',').map(String::from).collect()
    }

    fn choices() -> Choices {
        Choices {
            mem_total: 24 * GIB,
            cgroup: "v1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn offload_and_digest_factors() {
        use crate::network::offload::{Digest, Offload};
        let p = Plan::from_choices(&Choices { offload: Some(list("none,stateless")), digest: Some(list("none,crc32c,crc32c-soft")), quick: true, ..choices() }).unwrap();
        assert_eq!(p.factor_combinations().len(), 6);
        assert_eq!(p.factor_combinations()[1], (Offload::None, Digest::Crc32c, crate::network::offload::Tls::Off));
        // 5 subjects without digests, blockwire's iSCSI and NVMe/TCP with.
        assert_eq!(p.subject_turns(), 2 * (5 + 2 + 2));
        assert_eq!((p.params.offloads.clone(), p.params.digests.len()), (list("none,stateless"), 3));
        let d = Plan::from_choices(&choices()).unwrap();
        assert_eq!(d.factor_combinations(), vec![(Offload::MtuFrames, Digest::None, crate::network::offload::Tls::Off)]);
        assert!(d.params.offloads.is_empty() && d.params.digests.is_empty(), "defaults are not named");
        assert!(Plan::from_choices(&Choices { offload: Some(list("toe")), ..choices() }).is_err());
        assert!(Plan::from_choices(&Choices { digest: Some(list("md5")), ..choices() }).is_err());
        let one = Plan::from_choices(&Choices { micro_workloads: Some(list("seqread-1m")), ..choices() }).unwrap();
        assert_eq!(one.micro.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(), ["seqread-1m"]);
        assert!(Plan::from_choices(&Choices { micro_workloads: Some(list("seqread-2m")), ..choices() }).is_err());
    }

    #[test]
    fn tls_factor() {
        use crate::network::offload::{Digest, Offload, Tls};
        let p = Plan::from_choices(&Choices { tls: Some(list("off,on")), quick: true, ..choices() }).unwrap();
        assert_eq!(p.factor_combinations(), vec![(Offload::MtuFrames, Digest::None, Tls::Off), (Offload::MtuFrames, Digest::None, Tls::On)]);
        // 5 subjects in plaintext, blockwire's NVMe/TCP alone over TLS.
        assert_eq!(p.subjects_for(Digest::None, Tls::On), vec![Subject::Blockwire(Protocol::Nvme)]);
        assert_eq!(p.subject_turns(), 5 + 1);
        assert_eq!(p.params.tls, list("off,on"));
        assert!(Plan::from_choices(&choices()).unwrap().params.tls.is_empty(), "the default is not named");
        assert!(Plan::from_choices(&Choices { tls: Some(list("ktls")), ..choices() }).is_err());
        // nvmet's TCP port serves TLS (tlshd); its RDMA port and LIO do not.
        let peers = [PeerKind::Lio, PeerKind::Nvmet, PeerKind::NvmetRdma].map(|p| PeerChoice(Some(p))).to_vec();
        let p = Plan::from_choices(&Choices { tls: Some(list("on")), protocols: Some(vec![Protocol::Iscsi, Protocol::Nvme]), peers: Some(peers), quick: true, ..choices() }).unwrap();
        assert_eq!(p.subjects_for(Digest::None, Tls::On), vec![Subject::Blockwire(Protocol::Nvme), Subject::Peer(PeerKind::Nvmet)]);
    }

    #[test]
    fn file_system_factors() {
        use crate::suites::fs::fs_kind::{FsKind, Fsync};
        let p = Plan::from_choices(&Choices { fs_kinds: Some(list("ext4,btrfs")), fsync: Some(list("honour,ignore")), suite: Some(vec![SuiteChoice::Fs]), quick: true, size: Some("256M".into()), ..choices() }).unwrap();
        assert_eq!(p.fs_combinations, vec![(FsKind::Ext4, Fsync::Honour), (FsKind::Ext4, Fsync::Ignore), (FsKind::Btrfs, Fsync::Honour), (FsKind::Btrfs, Fsync::Ignore)]);
        assert_eq!((p.params.fs_kinds.clone(), p.params.fsyncs.clone()), (list("ext4,btrfs"), list("honour,ignore")));
        // quick: 6 subjects, one case each, 3 repeats, 4 combinations.
        assert_eq!(p.fs_runs(), 6 * 3 * 4);
        assert!(Plan::from_choices(&Choices { fs_kinds: Some(list("btrfs")), size: Some("64M".into()), ..choices() }).is_err(), "btrfs needs a larger volume");
        assert!(Plan::from_choices(&Choices { fs_kinds: Some(list("zfs")), ..choices() }).is_err());
        let d = Plan::from_choices(&choices()).unwrap();
        assert_eq!(d.fs_combinations, vec![(FsKind::Ext4, Fsync::Honour)]);
        assert!(d.params.fs_kinds.is_empty() && d.params.fsyncs.is_empty());
    }

    #[test]
    fn tcp_congestion_choice() {
        let on = |system: &str| Choices { system_congestion: system.into(), available_congestion: "reno bbr cubic".into(), ..choices() };
        let cc = |v: Option<&str>, system: &str| {
            Plan::from_choices(&Choices { tcp_congestion: v.map(String::from), ..on(system) }).map(|p| p.params.tcp_congestion)
        };
        assert_eq!(cc(Some("cubic"), "bbr").unwrap(), "cubic");
        assert_eq!(cc(Some("bbr"), "cubic").unwrap(), "bbr");
        assert_eq!(cc(Some("system"), "bbr").unwrap(), "", "the namespaces keep what they inherit");
        assert_eq!(cc(None, "bbr").unwrap(), "cubic", "auto: no timer pacing on the lab's links");
        assert_eq!(cc(Some("auto"), "bbr").unwrap(), "cubic");
        assert_eq!(cc(None, "cubic").unwrap(), "", "an unpaced default is kept");
        assert_eq!(cc(None, "").unwrap(), "", "an unreadable default is kept");
        assert!(cc(Some("no such"), "bbr").is_err());
        let p = Plan::from_choices(&Choices { tcp_congestion: Some("system".into()), ..on("bbr") }).unwrap();
        assert_eq!(p.tcp_congestion, bw_net::tcp::Congestion::System);
    }

    #[test]
    fn idle_wait_budget() {
        let budget = |quick, w| Plan::from_choices(&Choices { quick, idle_wait: w, ..choices() }).map(|p| p.params.idle_budget_s);
        assert_eq!(budget(true, None).unwrap(), 20.0);
        assert_eq!(budget(false, None).unwrap(), 180.0);
        assert_eq!(budget(false, Some(0.0)).unwrap(), 0.0, "0: measure at once");
        assert_eq!(budget(true, Some(45.0)).unwrap(), 45.0);
        assert!(budget(true, Some(-1.0)).is_err() && budget(true, Some(f64::NAN)).is_err());
        let none = Plan::from_choices(&Choices { quick: true, idle_wait: Some(0.0), ..choices() }).unwrap().estimate();
        assert_eq!(none.idle_s, 0.0, "the estimate waits for nothing");
    }

    #[test]
    fn client_memory_limits() {
        assert_eq!(default_client_mem(24 * GIB), vec![256 * MIB, 2 * GIB]);
        // A 2 GiB machine gets 256 MiB and 512 MiB.
        assert_eq!(default_client_mem(2 * GIB), vec![256 * MIB, 512 * MIB]);
        let p = Plan::from_choices(&Choices {
            client_mem: Some(list("2G,512M")),
            ..choices()
        })
        .unwrap();
        let fs = p.fs.unwrap();
        assert_eq!(
            fs.client_mem,
            vec![512 * MIB, 2 * GIB],
            "sorted, smallest first"
        );
        // Bonnie++ and IOgen files: twice the smallest limit, within half the 1 GiB volume.
        assert_eq!((fs.bonnie_size, fs.iogen_size), (512 * MIB, 512 * MIB));
        assert!(Plan::from_choices(&Choices {
            client_mem: Some(list("16M")),
            ..choices()
        })
        .is_err());
        assert!(Plan::from_choices(&Choices {
            client_mem: Some(list("lots")),
            ..choices()
        })
        .is_err());
        assert!(Plan::from_choices(&Choices {
            fs_workloads: Some(list("varmail,nfs")),
            ..choices()
        })
        .is_err());
        let one = Plan::from_choices(&Choices {
            fs_workloads: Some(list("oltp")),
            protocols: Some(vec![Protocol::Iscsi]),
            peers: Some(vec![PeerChoice(None)]),
            ..choices()
        })
        .unwrap();
        // oltp at both limits on blockwire-iscsi and local.
        assert_eq!(one.fs_runs(), 2 * 2 * 3);
    }

    #[test]
    fn choices_are_validated() {
        let bad = |c: Choices| Plan::from_choices(&c).is_err();
        assert!(bad(Choices {
            mtu: Some(vec![100]),
            ..Default::default()
        }));
        assert!(bad(Choices {
            suite: Some(vec![SuiteChoice::Net, SuiteChoice::Route]),
            ..Default::default()
        }));
        assert!(bad(Choices {
            repeat: Some(0),
            ..Default::default()
        }));
        assert!(bad(Choices {
            link: Some(list("1g")),
            ..Default::default()
        }));
        assert!(!bad(Choices {
            suite: Some(vec![SuiteChoice::Fs]),
            ..choices()
        }));
        let p = Plan::from_choices(&Choices {
            protocols: Some(vec![Protocol::Aoe]),
            peers: Some(vec![PeerChoice(None)]),
            suite: Some(vec![SuiteChoice::Micro]),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            p.subjects(),
            vec![Subject::Blockwire(Protocol::Aoe)]
        );
        assert!(p.sweep.is_empty());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1G").unwrap(), GIB);
        assert_eq!(parse_size("64MiB").unwrap(), 64 * MIB);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512k").unwrap(), 512 * KIB);
        assert!(parse_size("0").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("").is_err());
    }
}
