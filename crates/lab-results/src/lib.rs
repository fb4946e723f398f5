//! What a lab run records: every raw sample plus the context needed to read
//! it later (machine, software versions, parameters). `results.json` is this
//! structure; the report and the CSV are derived from it alone.
//!
//! This crate is the bottom of the lab: the lab (`bw-lab`) writes these
//! records and the report (`bw-lab-report`) reads them, and it imports
//! neither. Each suite with records of its own has a module here (`fs`,
//! `net`, `route`); `accounting` and `stats` are the arithmetic both the
//! lab's terminal summary and the report do on them.

pub mod accounting;
pub mod fs;
pub mod joined;
pub mod keys;
pub mod net;
pub mod resumed;
pub mod route;
pub mod stats;

pub use keys::{DigestFactor, FailureSubject, LinkName, OffloadFactor, Suite, SubjectKey, TlsFactor};
use net::WireCounters;

use serde::{Deserialize, Serialize};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// The numbers the lab keeps of one micro or sweep run, from
/// `blockwire bench --json` ([`bw_workload_report::BenchReport`]) or
/// converted from fio's JSON for the local baseline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    pub iops: f64,
    /// Bytes per second.
    pub bw_bytes: f64,
    pub lat_ns: Latency,
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    pub ios: u64,
    pub bytes: u64,
    pub runtime_s: f64,
    pub errors: u64,
}

/// Latency in nanoseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub mean: f64,
}

impl From<&bw_workload_report::BenchReport> for BenchResult {
    fn from(r: &bw_workload_report::BenchReport) -> BenchResult {
        BenchResult {
            iops: r.iops,
            bw_bytes: r.bw_bytes,
            lat_ns: Latency { p50: r.lat_ns.p50 as f64, p99: r.lat_ns.p99 as f64, p999: r.lat_ns.p999 as f64, mean: r.lat_ns.mean },
            cpu_user_s: r.cpu_user_s,
            cpu_sys_s: r.cpu_sys_s,
            ios: r.ios,
            bytes: r.bytes,
            runtime_s: r.runtime_s,
            errors: r.errors,
        }
    }
}

/// One workload shape, fio vocabulary.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Workload {
    /// Stable name used as the case key, e.g. `randread-4k-qd32`.
    pub name: String,
    /// `read`, `write`, `randread`, `randwrite` or `randrw`.
    pub rw: String,
    pub bs: u64,
    pub iodepth: u32,
    pub numjobs: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rwmixread: Option<u32>,
}

impl Workload {
    pub fn is_sequential(&self) -> bool {
        self.rw == "read" || self.rw == "write"
    }
}

/// The micro suite: the studies' sequential/random cases.
pub fn micro_workloads() -> Vec<Workload> {
    MicroWorkload::ALL.iter().map(|m| m.workload()).collect()
}

/// The micro suite's workloads by name: the report's findings and tables
/// pick cases by these (`CaseKey.workload` holds the name, also for the
/// sweep's points), so a misspelt workload is a compile error, not an
/// empty finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MicroWorkload {
    SeqRead1m,
    SeqWrite1m,
    RandRead4kQd1,
    RandRead4kQd32,
    RandWrite4kQd1,
    RandWrite4kQd32,
    RandRw75_4kQd16,
}

impl MicroWorkload {
    /// In the micro suite's order.
    pub const ALL: [MicroWorkload; 7] = [
        MicroWorkload::SeqRead1m,
        MicroWorkload::SeqWrite1m,
        MicroWorkload::RandRead4kQd1,
        MicroWorkload::RandRead4kQd32,
        MicroWorkload::RandWrite4kQd1,
        MicroWorkload::RandWrite4kQd32,
        MicroWorkload::RandRw75_4kQd16,
    ];

    /// Its name in results.json and the report (`Workload.name`).
    pub const fn name(self) -> &'static str {
        match self {
            MicroWorkload::SeqRead1m => "seqread-1m",
            MicroWorkload::SeqWrite1m => "seqwrite-1m",
            MicroWorkload::RandRead4kQd1 => "randread-4k-qd1",
            MicroWorkload::RandRead4kQd32 => "randread-4k-qd32",
            MicroWorkload::RandWrite4kQd1 => "randwrite-4k-qd1",
            MicroWorkload::RandWrite4kQd32 => "randwrite-4k-qd32",
            MicroWorkload::RandRw75_4kQd16 => "randrw75-4k-qd16",
        }
    }

    /// Its shape, fio vocabulary.
    pub fn workload(self) -> Workload {
        let w = |rw: &str, bs: u64, iodepth: u32, rwmixread: Option<u32>| Workload { name: self.name().into(), rw: rw.into(), bs, iodepth, numjobs: 1, rwmixread };
        match self {
            MicroWorkload::SeqRead1m => w("read", MIB, 1, None),
            MicroWorkload::SeqWrite1m => w("write", MIB, 1, None),
            MicroWorkload::RandRead4kQd1 => w("randread", 4 * KIB, 1, None),
            MicroWorkload::RandRead4kQd32 => w("randread", 4 * KIB, 32, None),
            MicroWorkload::RandWrite4kQd1 => w("randwrite", 4 * KIB, 1, None),
            MicroWorkload::RandWrite4kQd32 => w("randwrite", 4 * KIB, 32, None),
            MicroWorkload::RandRw75_4kQd16 => w("randrw", 4 * KIB, 16, Some(75)),
        }
    }
}

impl std::fmt::Display for MicroWorkload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// One point of the numjobs x iodepth sweep (4 KiB, 75 % reads).
pub fn sweep_workload(numjobs: u32, iodepth: u32) -> Workload {
    Workload {
        name: format!("sweep-j{numjobs}-qd{iodepth}"),
        rw: "randrw".into(),
        bs: 4 * KIB,
        iodepth,
        numjobs,
        rwmixread: Some(75),
    }
}

/// One measured run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Subject key, e.g. `blockwire-aoe`, `tgt-iscsi`, `vblade-aoe`, `local-fio`.
    pub subject: SubjectKey,
    /// `None` for the local baseline (no network).
    pub mtu: Option<u32>,
    /// The link shape (`none`, `1gbit`, ...; absent in older results: `none`).
    #[serde(default)]
    pub link: LinkName,
    pub suite: Suite,
    pub workload: Workload,
    /// 1-based repetition number.
    pub repeat: u32,
    pub bench: BenchResult,
    /// CPU seconds (user + system) of the target process over the run;
    /// `None` for the local baseline.
    pub target_cpu_s: Option<f64>,
    pub wire: Option<WireCounters>,
    /// Busy share of all CPUs (0..1) measured just before the run started,
    /// after waiting for the machine to be idle.
    pub busy_before: f64,
    /// Seconds spent waiting for the machine to become idle.
    pub idle_wait_s: f64,
    pub started_unix: f64,
    /// The offload study's factors (`--offload`, `--digest`); empty: the
    /// lab's defaults (and older results).
    #[serde(default, skip_serializing_if = "Factors::is_default")]
    pub factors: Factors,
    /// Whole-machine CPU over the run, one entry per machine the lab's
    /// hosts run on (absent in older results).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machine_cpu: Vec<MachineCpu>,
}

/// Settings a run varies besides subject, link and MTU. Each field is
/// empty at the lab's default, so a case key names only what was changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Factors {
    /// NIC offloads on the lab's links: `none` or `stateless` (empty: the
    /// default: segmentation offloads off, GRO and checksums on).
    #[serde(default, skip_serializing_if = "OffloadFactor::is_default")]
    pub offload: OffloadFactor,
    /// iSCSI/NVMe-TCP digests: `crc32c` or `crc32c-soft` (empty: none).
    #[serde(default, skip_serializing_if = "DigestFactor::is_default")]
    pub digest: DigestFactor,
    /// NVMe/TCP over TLS 1.3: `on` (empty: off, plaintext).
    #[serde(default, skip_serializing_if = "TlsFactor::is_default")]
    pub tls: TlsFactor,
}

impl Factors {
    pub fn is_default(&self) -> bool {
        *self == Factors::default()
    }

    /// `offload none, digest crc32c` (empty at the defaults).
    pub fn describe(&self) -> String {
        let mut v = vec![];
        if !self.offload.is_default() {
            v.push(format!("offload {}", self.offload));
        }
        if !self.digest.is_default() {
            v.push(format!("digest {}", self.digest));
        }
        if !self.tls.is_default() {
            v.push(format!("tls {}", self.tls));
        }
        v.join(", ")
    }
}

/// Whole-machine CPU over one run on one machine, from /proc/stat: user,
/// nice, system, irq, softirq and steal over all CPUs. Unlike a process's
/// own time it holds the network stack's softirq work, which the kernel's
/// tick accounting charges to whichever task happens to run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineCpu {
    /// The lab's hosts on this machine (its namespaces share one).
    pub hosts: Vec<String>,
    /// Busy CPU-seconds over the run.
    pub busy_s: f64,
    /// What the machine keeps busy without the run (the busy rate measured
    /// before the run, times the run's duration): subtracted.
    pub idle_s: f64,
}

impl MachineCpu {
    /// The run's own share: busy minus the idle baseline.
    pub fn net_s(&self) -> f64 {
        (self.busy_s - self.idle_s).max(0.0)
    }
}

/// A run or a whole subject that produced no numbers, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub subject: FailureSubject,
    pub mtu: Option<u32>,
    /// Empty when the whole subject could not start.
    pub workload: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineInfo {
    pub cpu_model: String,
    pub cpus: usize,
    pub kernel: String,
    pub mem_total_bytes: u64,
    pub hostname: String,
    /// The system's TCP congestion control (net.ipv4.tcp_congestion_control):
    /// BBR paces by timer and costs TCP senders CPU (crates/net/src/tcp.rs).
    /// Empty in results from before it was recorded.
    #[serde(default)]
    pub tcp_congestion: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "SoftwareRecord")]
pub struct Software {
    pub blockwire: String,
    /// Every peer the lab knows, with its version ("not installed").
    pub peers: Vec<PeerVersion>,
    pub fio: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerVersion {
    pub peer: String,
    pub version: String,
}

/// `Software` as results.json holds it, now or before peers became a list
/// (a field per peer: `tgt`, `vblade`).
#[derive(Deserialize)]
struct SoftwareRecord {
    blockwire: String,
    #[serde(default)]
    peers: Vec<PeerVersion>,
    tgt: Option<String>,
    vblade: Option<String>,
    fio: String,
}

impl From<SoftwareRecord> for Software {
    fn from(r: SoftwareRecord) -> Software {
        let old = [("tgt", r.tgt), ("vblade", r.vblade)].into_iter().filter_map(|(p, v)| Some(PeerVersion { peer: p.into(), version: v? }));
        let peers = if r.peers.is_empty() { old.collect() } else { r.peers };
        Software { blockwire: r.blockwire, peers, fio: r.fio }
    }
}

/// The parameters the run used, after defaults and `--quick` were applied.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Params {
    pub quick: bool,
    pub protocols: Vec<String>,
    pub peers: Vec<String>,
    pub mtus: Vec<u32>,
    pub suites: Vec<String>,
    pub repeat: u32,
    /// Repetitions of each sweep point (0 in older results: same as `repeat`).
    #[serde(default)]
    pub sweep_repeat: u32,
    pub size_bytes: u64,
    pub runtime_s: u32,
    pub sweep_runtime_s: u32,
    pub sweep_numjobs: Vec<u32>,
    pub sweep_iodepth: Vec<u32>,
    /// Where the volume lives, e.g. `/dev/shm file (tmpfs) shared by every target`.
    pub backing: String,
    /// How long to wait at most for the machine to be idle before a run.
    pub idle_max_wait_s: f64,
    /// Total seconds the whole run may spend waiting for idle.
    #[serde(default)]
    pub idle_budget_s: f64,
    pub idle_threshold: f64,
    /// Segmentation offloads switched off on the veths so frames have real
    /// MTU sizes (GRO too where `veth_gro` is false).
    pub veth_offloads_off: bool,
    /// GRO on at the veths' receiving ends, as on a Linux host's NIC (the
    /// lab's default link since 2026-11-25; absent in older results, whose
    /// links had it off).
    #[serde(default)]
    pub veth_gro: bool,
    /// Link shapes, in run order (absent in older results: unshaped only).
    #[serde(default = "default_links")]
    pub links: Vec<LinkName>,
    /// Seconds per iperf3 run of the net suite.
    #[serde(default)]
    pub net_runtime_s: u32,
    /// Link shapes with their rates (absent in older results).
    #[serde(default)]
    pub link_shapes: Vec<crate::net::LinkShape>,
    /// The fs suite's sizes and limits (absent when it did not run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs: Option<crate::fs::FsParams>,
    /// `--tcp-congestion`: the algorithm the lab set in its namespaces
    /// (empty: they kept the system's, `MachineInfo::tcp_congestion`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tcp_congestion: String,
    /// `--offload` values in run order (empty: the default only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offloads: Vec<String>,
    /// `--digest` values in run order (empty: none only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub digests: Vec<String>,
    /// `--tls` values in run order (empty: off only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls: Vec<String>,
    /// `--fs` values in run order (empty: ext4 only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fs_kinds: Vec<String>,
    /// `--fsync` values in run order (empty: honour only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fsyncs: Vec<String>,
}

fn default_links() -> Vec<LinkName> {
    vec![LinkName::none()]
}

impl Params {
    /// Repetitions of each sweep point.
    pub fn sweep_repeats(&self) -> u32 {
        if self.sweep_repeat == 0 { self.repeat } else { self.sweep_repeat }
    }
}

/// A subject the lab tried to measure: who serves and who initiates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subject {
    pub key: SubjectKey,
    pub protocol: String,
    /// The target implementation (`blockwire`, `tgt`, `vblade`, `fio` for local).
    pub target: String,
    /// The initiator (`blockwire` unless a peer client is named, `fio` locally).
    pub initiator: String,
    /// `None` when it ran; `Some(reason)` when it was unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    /// The sockets the target's AoE front-end moved frames through (`xdp`,
    /// `packet`), as its log says, each once: blockwire's AoE subjects
    /// only. Written as one text, joined by ", ".
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "joined::comma")]
    pub target_datapath: Vec<String>,
    /// How the target served: a kernel target's kernel version, backstore
    /// or namespace, and the cache settings that change results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<String>,
    /// The user's own storage, given by URL (`--subject NAME=URL`): never
    /// started or stopped by the lab.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub external: bool,
    /// What the target says it is: SCSI INQUIRY vendor, product and
    /// revision; NVMe Identify Controller model and firmware; an NFS
    /// server's address and export.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The cases not run on it and why (an external block subject is
    /// measured read-only unless writes were allowed), each reason once.
    /// Written as one text, joined by "; ".
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "joined::semicolon")]
    pub skipped: Vec<String>,
}

impl Subject {
    /// A subject as a run starts: what it is, nothing measured or noted yet.
    pub fn new(key: SubjectKey, protocol: &str, target: &str, initiator: &str) -> Subject {
        Subject {
            key,
            protocol: protocol.into(),
            target: target.into(),
            initiator: initiator.into(),
            unavailable: None,
            target_datapath: vec![],
            settings: None,
            external: false,
            identity: None,
            skipped: vec![],
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub format: u32,
    pub started_utc: String,
    pub finished_utc: String,
    pub params: Params,
    pub machine: MachineInfo,
    pub software: Software,
    pub subjects: Vec<Subject>,
    pub samples: Vec<Sample>,
    pub failures: Vec<Failure>,
    // Each suite's own records beside `samples` (micro and sweep): a suite
    // with a shape of its own adds a field here and a section in
    // `report::html::SECTIONS`.
    /// The net suite's iperf3 runs.
    #[serde(default)]
    pub net: Vec<crate::net::NetSample>,
    /// The fs suite's runs.
    #[serde(default)]
    pub fs: Vec<crate::fs::FsSample>,
    /// Set when the run was cut short (SIGINT/SIGTERM or an error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborted: Option<String>,
    /// The route suite (`--suite route`): paths, samples, header overheads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<crate::route::RouteResults>,
    /// A run across machines (`--target-host`): the target and client hosts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostInfo>,
    /// ssh commands the run issued (0: a run on this machine only).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ssh_commands: u64,
    /// A run continued with `blockwire lab --resume`: its starts, and which
    /// start measured each case (absent for a run that was not resumed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<crate::resumed::Resumed>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One host of a run across machines, as the report names it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostInfo {
    /// `target` or `client`.
    pub role: String,
    /// `ssh://...`, or `this machine`.
    pub address: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub kernel: String,
    /// The storage network's interface, its driver, speed (None: the
    /// driver reports none, as veth) and MTU.
    pub nic: String,
    pub nic_driver: String,
    pub link_speed_mbps: Option<u64>,
    pub mtu: u32,
    pub tcp_congestion: String,
    /// /proc/cpuinfo has the hypervisor flag: timings there are a VM's.
    pub emulated: bool,
}

pub const FORMAT: u32 = 1;

impl Results {
    pub fn load(path: &std::path::Path) -> anyhow::Result<Results> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let r: Results = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is not a lab results file: {e}", path.display()))?;
        Ok(r)
    }

    pub fn save(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }

    pub fn subject(&self, key: &SubjectKey) -> Option<&Subject> {
        self.subjects.iter().find(|s| &s.key == key)
    }
}

/// UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    format_utc(jiff::Timestamp::now().as_second().max(0) as u64)
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn format_utc(secs: u64) -> String {
    jiff::Timestamp::from_second(secs as i64)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Software with a field per peer (results.json before the peers list)
    /// reads as the list; the list round-trips.
    #[test]
    fn software_of_old_and_new_results() {
        let old: Software = serde_json::from_str(r#"{"blockwire":"b","tgt":"tgt 1","vblade":"vblade 2","fio":"f"}"#).unwrap();
        let pv = |p: &str, v: &str| PeerVersion { peer: p.into(), version: v.into() };
        assert_eq!(old.peers, vec![pv("tgt", "tgt 1"), pv("vblade", "vblade 2")]);
        let new = Software { peers: vec![pv("ganesha", "nfs-ganesha 4.3")], ..old };
        assert_eq!(serde_json::from_str::<Software>(&serde_json::to_string(&new).unwrap()).unwrap(), new);
    }

    /// A subject's datapaths and skipped cases are lists written as the
    /// joined text results.json always held (", " and "; "), left out when
    /// empty, and read back from that text.
    #[test]
    fn subject_lists_are_their_joined_text() {
        let mut s = Subject::new("blockwire-aoe".parse().unwrap(), "aoe", "blockwire", "blockwire");
        let plain = r#"{"key":"blockwire-aoe","protocol":"aoe","target":"blockwire","initiator":"blockwire"}"#;
        assert_eq!(serde_json::to_string(&s).unwrap(), plain);
        assert_eq!(serde_json::from_str::<Subject>(plain).unwrap(), s);
        for d in ["xdp", "packet", "xdp"] {
            joined::add_once(&mut s.target_datapath, d);
        }
        for why in ["writes skipped", "fs suite skipped", "writes skipped"] {
            joined::add_once(&mut s.skipped, why);
        }
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"key":"blockwire-aoe","protocol":"aoe","target":"blockwire","initiator":"blockwire","target_datapath":"xdp, packet","skipped":"writes skipped; fs suite skipped"}"#
        );
        assert_eq!(serde_json::from_str::<Subject>(&json).unwrap(), s);
    }

    #[test]
    fn utc_formatting() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_795_290_712), "2026-11-21T19:51:52Z");
    }

    #[test]
    fn wire_delta_and_sums() {
        let a = WireCounters { rx_bytes: 100, tx_bytes: 50, rx_packets: 2, tx_packets: 1 };
        let b = WireCounters { rx_bytes: 1100, tx_bytes: 550, rx_packets: 12, tx_packets: 6 };
        let d = WireCounters::delta(&a, &b);
        assert_eq!(d.bytes(), 1500);
        assert_eq!(d.frames(), 15);
        assert_eq!(WireCounters::delta(&b, &a).bytes(), 0);
    }
}
