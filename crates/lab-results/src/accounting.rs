//! Per-operation accounting derived from raw samples: CPU per op and per MiB
//! (target and initiator apart), bytes and frames on the wire per op, and the
//! header overhead per frame. Also the grouping of repeated samples into cases.

use crate::keys::{LinkName, SubjectKey, Suite};
use crate::{Sample, Workload};
use crate::stats::Summary;
use std::collections::BTreeMap;

const MIB: f64 = 1024.0 * 1024.0;

/// A number the lab reports per case, with its unit and which way is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Metric {
    Iops,
    MibPerS,
    LatP50Us,
    LatP99Us,
    LatP999Us,
    TargetCpuUsPerOp,
    InitiatorCpuUsPerOp,
    TotalCpuUsPerOp,
    CpuMsPerMib,
    WireBytesPerOp,
    FramesPerOp,
    HeaderBytesPerFrame,
    /// Whole-machine CPU (/proc/stat, idle baseline subtracted).
    MachineCpuUsPerOp,
    MachineCpuSPerGb,
}

impl Metric {
    pub const ALL: [Metric; 14] = [
        Metric::Iops,
        Metric::MibPerS,
        Metric::LatP50Us,
        Metric::LatP99Us,
        Metric::LatP999Us,
        Metric::TargetCpuUsPerOp,
        Metric::InitiatorCpuUsPerOp,
        Metric::TotalCpuUsPerOp,
        Metric::CpuMsPerMib,
        Metric::WireBytesPerOp,
        Metric::FramesPerOp,
        Metric::HeaderBytesPerFrame,
        Metric::MachineCpuUsPerOp,
        Metric::MachineCpuSPerGb,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Metric::Iops => "iops",
            Metric::MibPerS => "mib_s",
            Metric::LatP50Us => "lat_p50_us",
            Metric::LatP99Us => "lat_p99_us",
            Metric::LatP999Us => "lat_p999_us",
            Metric::TargetCpuUsPerOp => "target_cpu_us_per_op",
            Metric::InitiatorCpuUsPerOp => "initiator_cpu_us_per_op",
            Metric::TotalCpuUsPerOp => "total_cpu_us_per_op",
            Metric::CpuMsPerMib => "cpu_ms_per_mib",
            Metric::WireBytesPerOp => "wire_bytes_per_op",
            Metric::FramesPerOp => "frames_per_op",
            Metric::HeaderBytesPerFrame => "header_bytes_per_frame",
            Metric::MachineCpuUsPerOp => "machine_cpu_us_per_op",
            Metric::MachineCpuSPerGb => "machine_cpu_s_per_gb",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Metric::Iops => "IOPS",
            Metric::MibPerS => "MiB/s",
            Metric::LatP50Us => "latency p50 (µs)",
            Metric::LatP99Us => "latency p99 (µs)",
            Metric::LatP999Us => "latency p99.9 (µs)",
            Metric::TargetCpuUsPerOp => "target CPU µs/op",
            Metric::InitiatorCpuUsPerOp => "initiator CPU µs/op",
            Metric::TotalCpuUsPerOp => "total CPU µs/op",
            Metric::CpuMsPerMib => "CPU ms/MiB",
            Metric::WireBytesPerOp => "wire bytes/op",
            Metric::FramesPerOp => "frames/op",
            Metric::HeaderBytesPerFrame => "header bytes/frame",
            Metric::MachineCpuUsPerOp => "machine CPU µs/op",
            Metric::MachineCpuSPerGb => "machine CPU s/GB",
        }
    }

    /// What the metric measures, for sentences such as "2.2x less CPU per op".
    pub fn noun(self) -> &'static str {
        match self {
            Metric::Iops => "IOPS",
            Metric::MibPerS => "throughput",
            Metric::LatP50Us => "median latency",
            Metric::LatP99Us => "p99 latency",
            Metric::LatP999Us => "p99.9 latency",
            Metric::TargetCpuUsPerOp => "target CPU per op",
            Metric::InitiatorCpuUsPerOp => "initiator CPU per op",
            Metric::TotalCpuUsPerOp => "CPU per op",
            Metric::CpuMsPerMib => "CPU per MiB",
            Metric::WireBytesPerOp => "wire bytes per op",
            Metric::FramesPerOp => "frames per op",
            Metric::HeaderBytesPerFrame => "header bytes per frame",
            Metric::MachineCpuUsPerOp => "whole-machine CPU per op",
            Metric::MachineCpuSPerGb => "whole-machine CPU per GB",
        }
    }

    pub fn higher_is_better(self) -> bool {
        matches!(self, Metric::Iops | Metric::MibPerS)
    }

    /// The value of this metric for one sample; `None` when the sample lacks
    /// the data (no ops done, no wire for the local baseline, ...).
    pub fn of(self, s: &Sample) -> Option<f64> {
        let b = &s.bench;
        let ios = b.ios as f64;
        let per_op = |x: f64| if b.ios > 0 { Some(x / ios) } else { None };
        let initiator_cpu = b.cpu_user_s + b.cpu_sys_s;
        match self {
            Metric::Iops => Some(b.iops),
            Metric::MibPerS => Some(b.bw_bytes / MIB),
            Metric::LatP50Us => Some(b.lat_ns.p50 / 1e3),
            Metric::LatP99Us => Some(b.lat_ns.p99 / 1e3),
            Metric::LatP999Us => Some(b.lat_ns.p999 / 1e3),
            Metric::TargetCpuUsPerOp => per_op(s.target_cpu_s? * 1e6),
            Metric::InitiatorCpuUsPerOp => per_op(initiator_cpu * 1e6),
            Metric::TotalCpuUsPerOp => per_op((s.target_cpu_s.unwrap_or(0.0) + initiator_cpu) * 1e6),
            Metric::CpuMsPerMib => {
                if b.bytes == 0 {
                    None
                } else {
                    Some((s.target_cpu_s.unwrap_or(0.0) + initiator_cpu) * 1e3 / (b.bytes as f64 / MIB))
                }
            }
            Metric::WireBytesPerOp => per_op(s.wire?.bytes() as f64),
            Metric::FramesPerOp => per_op(s.wire?.frames() as f64),
            Metric::HeaderBytesPerFrame => {
                let w = s.wire?;
                if w.frames() == 0 {
                    return None;
                }
                // Everything on the wire that is not payload (Ethernet, IP,
                // TCP, protocol headers, ACKs, login/discovery), per frame.
                Some((w.bytes() as f64 - b.bytes as f64).max(0.0) / w.frames() as f64)
            }
            Metric::MachineCpuUsPerOp => per_op(machine_cpu_s(s)? * 1e6),
            Metric::MachineCpuSPerGb => {
                if b.bytes == 0 {
                    None
                } else {
                    Some(machine_cpu_s(s)? / (b.bytes as f64 / 1e9))
                }
            }
        }
    }
}

/// Whole-machine CPU-seconds of a run over every machine it used.
fn machine_cpu_s(s: &Sample) -> Option<f64> {
    if s.machine_cpu.is_empty() {
        return None;
    }
    Some(s.machine_cpu.iter().map(|m| m.net_s()).sum())
}

/// Identifies a case: one workload on one subject at one MTU in one suite
/// (and factors, when the run varied them).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CaseKey {
    pub suite: Suite,
    pub link: LinkName,
    pub mtu: Option<u32>,
    pub workload: String,
    pub subject: SubjectKey,
    pub factors: crate::Factors,
}

/// The repetitions of one case and their summaries.
#[derive(Debug, Clone)]
pub struct Case {
    pub key: CaseKey,
    pub workload: Workload,
    pub samples: Vec<Sample>,
}

impl Case {
    pub fn summary(&self, m: Metric) -> Option<Summary> {
        Summary::of(&self.values(m))
    }
    /// The metric's value in every repetition that has it.
    pub fn values(&self, m: Metric) -> Vec<f64> {
        self.samples.iter().filter_map(|s| m.of(s)).collect()
    }
    pub fn errors(&self) -> u64 {
        self.samples.iter().map(|s| s.bench.errors).sum()
    }
}

/// Group samples into cases (ordered by suite, MTU, workload, subject).
pub fn cases(samples: &[Sample]) -> BTreeMap<CaseKey, Case> {
    let mut out: BTreeMap<CaseKey, Case> = BTreeMap::new();
    for s in samples {
        let key = CaseKey {
            suite: s.suite,
            link: s.link.clone(),
            mtu: s.mtu,
            workload: s.workload.name.clone(),
            subject: s.subject.clone(),
            factors: s.factors.clone(),
        };
        out.entry(key.clone())
            .or_insert_with(|| Case { key, workload: s.workload.clone(), samples: vec![] })
            .samples
            .push(s.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::WireCounters;
    use crate::{BenchResult, Latency};

    /// A recorded AoE 4 KiB random-read sample at MTU 1500: at 2 sectors per
    /// frame a 4 KiB read is 4 request frames (60 B, padded) and 4 replies.
    fn recorded() -> Sample {
        Sample {
            subject: SubjectKey::served("blockwire", "aoe"),
            mtu: Some(1500),
            link: "none".into(),
            suite: Suite::Micro,
            workload: Workload {
                name: "randread-4k-qd1".into(),
                rw: "randread".into(),
                bs: 4096,
                iodepth: 1,
                numjobs: 1,
                rwmixread: None,
            },
            repeat: 1,
            bench: BenchResult {
                iops: 10_000.0,
                bw_bytes: 10_000.0 * 4096.0,
                lat_ns: Latency { p50: 95_000.0, p99: 180_000.0, p999: 400_000.0, mean: 99_000.0 },
                cpu_user_s: 0.4,
                cpu_sys_s: 0.6,
                ios: 30_000,
                bytes: 30_000 * 4096,
                runtime_s: 3.0,
                errors: 0,
            },
            target_cpu_s: Some(1.5),
            // Per op: 4 requests of 60 B out, 4 replies of 14+36+1024 B in.
            wire: Some(WireCounters {
                rx_bytes: 30_000 * 4 * (14 + 36 + 1024),
                tx_bytes: 30_000 * 4 * 60,
                rx_packets: 30_000 * 4,
                tx_packets: 30_000 * 4,
            }),
            busy_before: 0.02,
            idle_wait_s: 0.3,
            started_unix: 0.0,
            factors: Default::default(),
            machine_cpu: vec![],
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn cpu_accounting_per_op_and_per_mib() {
        let s = recorded();
        assert!(close(Metric::TargetCpuUsPerOp.of(&s).unwrap(), 50.0));
        assert!(close(Metric::InitiatorCpuUsPerOp.of(&s).unwrap(), 1.0e6 / 30_000.0));
        assert!(close(Metric::TotalCpuUsPerOp.of(&s).unwrap(), 2.5e6 / 30_000.0));
        // 2.5 CPU-seconds over 30000*4 KiB = 117.1875 MiB.
        assert!(close(Metric::CpuMsPerMib.of(&s).unwrap(), 2500.0 / 117.1875));
        assert!(close(Metric::MibPerS.of(&s).unwrap(), 40_960_000.0 / MIB));
        assert!(close(Metric::LatP99Us.of(&s).unwrap(), 180.0));
        assert_eq!(Metric::MachineCpuSPerGb.of(&s), None, "no whole-machine figure in older samples");
    }

    #[test]
    fn whole_machine_cpu_net_of_the_idle_baseline() {
        let mut s = recorded();
        // Two machines: 3.1 s busy of which 0.1 s idle baseline, and 0.5 s
        // below its baseline (counts as nothing, not as a negative).
        s.machine_cpu = vec![
            crate::MachineCpu { hosts: vec!["t".into(), "c".into()], busy_s: 3.1, idle_s: 0.1 },
            crate::MachineCpu { hosts: vec!["x".into()], busy_s: 0.5, idle_s: 0.6 },
        ];
        assert!(close(Metric::MachineCpuUsPerOp.of(&s).unwrap(), 3.0e6 / 30_000.0));
        assert!(close(Metric::MachineCpuSPerGb.of(&s).unwrap(), 3.0 / (30_000.0 * 4096.0 / 1e9)));
        // Old results load: the new fields default.
        let mut v = serde_json::to_value(recorded()).unwrap();
        v.as_object_mut().unwrap().remove("factors");
        v.as_object_mut().unwrap().remove("machine_cpu");
        let back: Sample = serde_json::from_value(v).unwrap();
        assert!(back.factors.is_default() && back.machine_cpu.is_empty());
    }

    #[test]
    fn wire_accounting_per_op_and_header_overhead() {
        let s = recorded();
        assert!(close(Metric::WireBytesPerOp.of(&s).unwrap(), (4 * (14 + 36 + 1024) + 4 * 60) as f64));
        assert!(close(Metric::FramesPerOp.of(&s).unwrap(), 8.0));
        // Non-payload bytes per op: 4*(50) + 4*60 = 440 over 8 frames.
        assert!(close(Metric::HeaderBytesPerFrame.of(&s).unwrap(), 55.0));
    }

    #[test]
    fn missing_data_gives_none_not_garbage() {
        let mut s = recorded();
        s.wire = None;
        s.target_cpu_s = None;
        assert_eq!(Metric::WireBytesPerOp.of(&s), None);
        assert_eq!(Metric::TargetCpuUsPerOp.of(&s), None);
        // Local baseline: total CPU is the initiator's alone.
        assert!(close(Metric::TotalCpuUsPerOp.of(&s).unwrap(), 1.0e6 / 30_000.0));
        s.bench.ios = 0;
        s.bench.bytes = 0;
        assert_eq!(Metric::InitiatorCpuUsPerOp.of(&s), None);
        assert_eq!(Metric::CpuMsPerMib.of(&s), None);
    }

    #[test]
    fn grouping_into_cases_with_summaries() {
        let mut a = recorded();
        let mut b = recorded();
        b.repeat = 2;
        b.bench.iops = 12_000.0;
        let mut other = recorded();
        other.subject = SubjectKey::served("vblade", "aoe");
        a.bench.iops = 8_000.0;
        let cs = cases(&[a, b, other]);
        assert_eq!(cs.len(), 2);
        let c = cs.values().find(|c| c.key.subject == SubjectKey::served("blockwire", "aoe")).unwrap();
        let s = c.summary(Metric::Iops).unwrap();
        assert_eq!(s.n, 2);
        assert!(close(s.mean, 10_000.0));
        assert!(close(s.stddev, 2f64.sqrt() * 2000.0));
    }
}
