//! What `blockwire bench --json` and `blockwire flowop --json` print, as
//! serde types. `bw-workload` fills them in; `bw-lab` (which runs the
//! `blockwire` binary and links no protocol crate) parses them. One
//! definition, so the printer and the parser cannot drift apart.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Access pattern, fio's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    Read,
    Write,
    RandRead,
    RandWrite,
    RandRw,
    /// Sequential mix (fio's `rw`/`readwrite`).
    Rw,
}

impl std::str::FromStr for Rw {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "read" => Rw::Read,
            "write" => Rw::Write,
            "randread" => Rw::RandRead,
            "randwrite" => Rw::RandWrite,
            "randrw" => Rw::RandRw,
            "rw" | "readwrite" => Rw::Rw,
            _ => {
                return Err(format!(
                    "unknown --rw {s:?} (read, write, randread, randwrite, randrw, rw)"
                ))
            }
        })
    }
}

impl Rw {
    pub fn random(self) -> bool {
        matches!(self, Rw::RandRead | Rw::RandWrite | Rw::RandRw)
    }
    /// Percentage of reads, given the mix asked for.
    pub fn read_pct(self, mix: u8) -> u8 {
        match self {
            Rw::Read | Rw::RandRead => 100,
            Rw::Write | Rw::RandWrite => 0,
            Rw::RandRw | Rw::Rw => mix.min(100),
        }
    }
}

/// Latency of requests in nanoseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub min: u64,
    pub mean: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DirectionReport {
    pub ios: u64,
    pub bytes: u64,
    pub iops: f64,
    pub bw_bytes: f64,
    pub lat_ns: Latency,
}

/// One `blockwire bench` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    pub target: String,
    pub rw: Rw,
    pub bs: usize,
    pub iodepth: usize,
    pub numjobs: usize,
    pub rwmixread: u8,
    pub runtime_s: f64,
    pub ios: u64,
    pub bytes: u64,
    pub iops: f64,
    /// Bytes per second.
    pub bw_bytes: f64,
    pub lat_ns: Latency,
    pub read: DirectionReport,
    pub write: DirectionReport,
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    /// Client CPU microseconds per request (user + sys).
    pub cpu_per_io_us: f64,
    pub errors: u64,
}

impl BenchReport {
    /// The human table `blockwire bench` prints.
    pub fn table(&self) -> String {
        let mix = if matches!(self.rw, Rw::RandRw | Rw::Rw) {
            format!(" rwmixread={}", self.rwmixread)
        } else {
            String::new()
        };
        let mut s = format!(
            "{}  {:?} bs={} iodepth={} numjobs={}{mix}  {:.1} s\n",
            self.target,
            self.rw,
            size_name(self.bs as u64),
            self.iodepth,
            self.numjobs,
            self.runtime_s
        )
        .to_lowercase();
        s.push_str(&format!(
            "{:<6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
            "op", "IOPS", "MiB/s", "lat p50", "p99", "p99.9", "ios"
        ));
        for (name, d) in [("read", &self.read), ("write", &self.write)] {
            if d.ios == 0 {
                continue;
            }
            s.push_str(&format!(
                "{:<6} {:>10.0} {:>10.1} {:>10} {:>10} {:>10} {:>10}\n",
                name,
                d.iops,
                d.bw_bytes / (1 << 20) as f64,
                fmt_ns(d.lat_ns.p50),
                fmt_ns(d.lat_ns.p99),
                fmt_ns(d.lat_ns.p999),
                d.ios
            ));
        }
        s.push_str(&format!(
            "client cpu: user {:.2} s, sys {:.2} s, {:.1} us per I/O\n",
            self.cpu_user_s, self.cpu_sys_s, self.cpu_per_io_us
        ));
        s
    }
}

/// Counts and latency of one flowop over a `blockwire flowop` run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpStats {
    pub count: u64,
    pub bytes: u64,
    pub lat_total_ns: u64,
    pub lat_max_ns: u64,
    /// Median and 99th percentile latency (ns).
    #[serde(default)]
    pub lat_p50_ns: u64,
    #[serde(default)]
    pub lat_p99_ns: u64,
}

impl OpStats {
    pub fn mean_lat_us(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.lat_total_ns as f64 / self.count as f64 / 1000.0
        }
    }
}

/// One `blockwire flowop` run (a filebench-style personality on a directory).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowReport {
    pub personality: String,
    /// Seconds of the measured phase (file sets made before it are not counted).
    pub elapsed_s: f64,
    /// Seconds spent making the file sets.
    #[serde(default)]
    pub prepare_s: f64,
    pub ops: u64,
    pub ops_per_s: f64,
    pub mib_per_s: f64,
    /// Per flowop name.
    pub flowops: BTreeMap<String, OpStats>,
    /// Operations that failed (e.g. no free file to create), by flowop.
    pub errors: BTreeMap<String, u64>,
    /// Client CPU of the whole process over the measured phase.
    #[serde(default)]
    pub cpu_user_s: f64,
    #[serde(default)]
    pub cpu_sys_s: f64,
}

fn size_name(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}MiB", b >> 20)
    } else if b >= 1024 && b.is_multiple_of(1024) {
        format!("{}KiB", b >> 10)
    } else {
        format!("{b}B")
    }
}

fn fmt_ns(ns: u64) -> String {
    if ns >= 10_000_000 {
        format!("{:.1}ms", ns as f64 / 1e6)
    } else {
        format!("{:.1}us", ns as f64 / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_report_round_trips_through_json() {
        let r = BenchReport {
            target: "iscsi://x/iqn/0".into(),
            rw: Rw::RandRw,
            bs: 4096,
            iodepth: 16,
            numjobs: 1,
            rwmixread: 75,
            runtime_s: 3.0,
            ios: 3000,
            bytes: 3000 * 4096,
            iops: 1000.0,
            bw_bytes: 4096000.0,
            lat_ns: Latency {
                min: 10,
                mean: 950.5,
                p50: 900,
                p90: 1500,
                p99: 2000,
                p999: 5000,
                max: 9000,
            },
            read: DirectionReport {
                ios: 2250,
                ..Default::default()
            },
            write: DirectionReport {
                ios: 750,
                ..Default::default()
            },
            cpu_user_s: 0.1,
            cpu_sys_s: 0.2,
            cpu_per_io_us: 100.0,
            errors: 0,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"rw\":\"randrw\""), "{text}");
        assert_eq!(serde_json::from_str::<BenchReport>(&text).unwrap(), r);
        assert!(r.table().contains("rwmixread=75"));
    }

    #[test]
    fn rw_names() {
        assert_eq!("randrw".parse::<Rw>().unwrap(), Rw::RandRw);
        assert!("randomread".parse::<Rw>().is_err());
        assert_eq!(Rw::RandRead.read_pct(10), 100);
        assert_eq!(Rw::Rw.read_pct(130), 100);
        assert!(Rw::RandWrite.random() && !Rw::Write.random());
    }
}
