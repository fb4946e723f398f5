//! The route suite's records (`--suite route`): the same workloads over
//! each path (direct, MPLS with each router datapath, VXLAN), interleaved
//! within rounds, with where the CPU went and the header bytes per frame.
//! Running the paths and measuring is the lab's (`bw_lab::suites::route`).

use serde::{Deserialize, Serialize};

/// The suite's workloads: (name, bench arguments); "copy" is special.
pub const WORKLOADS: [(&str, &[&str]); 3] = [
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

/// Everything the route suite measured: stored in results.json.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RouteResults {
    /// Path names in run order (`direct`, `mpls-bpf`, `mpls-userspace`, `vxlan`).
    pub paths: Vec<String>,
    pub protocols: Vec<String>,
    pub mtu: u32,
    pub runtime_s: f64,
    pub copy_bytes: u64,
    pub rounds: u32,
    pub quick: bool,
    pub samples: Vec<RouteSample>,
    pub overheads: Vec<Overhead>,
}

/// The CPU of one router during one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterCpu {
    pub name: String,
    /// utime + stime of the router process (the userspace datapath's work;
    /// near 0 for BPF, whose process only holds the links).
    pub process_s: f64,
    /// Run time of the router's BPF programs (BPF datapath only).
    pub bpf_s: f64,
}

/// One measured case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteSample {
    pub round: u32,
    pub path: String,
    pub protocol: String,
    pub workload: String,
    /// Bytes per second (copy: bytes written plus read over both phases).
    pub bw_bytes: f64,
    pub iops: f64,
    pub mean_lat_us: f64,
    pub wall_s: f64,
    /// Bytes moved (read plus written).
    pub bytes: f64,
    /// Frames (both directions) through the middle of the path per MiB of
    /// data moved: a count, unlike the speeds robust to a busy machine.
    pub frames_per_mib: f64,
    pub routers: Vec<RouterCpu>,
    pub cpu: CpuAccount,
    /// 1-minute load average when the run started (the machine is shared).
    pub load1: f64,
}

impl RouteSample {
    /// Client + target + routers + ksoftirqd CPU per MiB moved, in ms.
    pub fn cpu_ms_per_mib(&self) -> f64 {
        self.cpu.total_s() * 1e3 / (self.bytes / (1 << 20) as f64).max(1e-9)
    }

    /// Router CPU (process or programs) per frame per router, in µs.
    pub fn router_us_per_frame(&self) -> Option<f64> {
        if self.routers.is_empty() || self.frames_per_mib <= 0.0 {
            return None;
        }
        let frames = self.frames_per_mib * self.bytes / (1 << 20) as f64;
        let cpu: f64 = self.routers.iter().map(|r| r.process_s + r.bpf_s).sum();
        Some(cpu / self.routers.len() as f64 / frames * 1e6)
    }
}

/// Header bytes per full data frame, from a capture in the middle of a path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Overhead {
    pub path: String,
    pub protocol: String,
    /// Most common (frame length - data payload) over the data frames.
    pub bytes_per_frame: u32,
    pub frames: usize,
    /// Frames tshark marked malformed in the whole capture (should be 0).
    pub malformed: usize,
}

/// CPU seconds spent during one run, by whom (how each is measured, and
/// why: `bw_lab::suites::route::cpu`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuAccount {
    pub client_s: f64,
    pub target_s: f64,
    pub routers_s: f64,
    pub bpf_s: f64,
    pub ksoftirqd_s: f64,
    pub softirq_s: f64,
    pub busy_s: f64,
}

impl CpuAccount {
    /// CPU attributable to this run's processes and softirq threads.
    pub fn total_s(&self) -> f64 {
        self.client_s + self.target_s + self.routers_s + self.ksoftirqd_s
    }
}

