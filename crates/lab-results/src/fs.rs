//! The fs suite's records: which workloads there are, the sizes they ran
//! with, what each one produced (the filebench personalities through
//! `blockwire flowop`, PostMark, Bonnie++, an IOgen-like fio run) and the
//! numbers the report compares. How they are run and how their output is
//! read is the lab's (`bw_lab::suites::fs`).

use crate::net::WireCounters;
use crate::keys::{LinkName, SubjectKey};
use bw_workload_report::FlowReport;
use serde::{Deserialize, Serialize};

/// The subject key of the local baseline (ext4 on a loop device over the
/// backing file, no network).
pub const LOCAL: SubjectKey = SubjectKey::LocalFs;

/// A workload of the fs suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsWorkload {
    /// A filebench personality (`blockwire flowop NAME`).
    Flowop(&'static str),
    Postmark,
    Bonnie,
    /// Several processes doing random reads and writes on one large file.
    Iogen {
        direct: bool,
    },
    /// The IOgen job on the raw local loop device (no file system).
    IogenRaw,
}

/// Every fs workload, in run order.
pub const ALL: [FsWorkload; 10] = [
    FsWorkload::Flowop("webserver"),
    FsWorkload::Flowop("fileserver"),
    FsWorkload::Flowop("varmail"),
    FsWorkload::Flowop("oltp"),
    FsWorkload::Flowop("oltp-direct"),
    FsWorkload::Postmark,
    FsWorkload::Bonnie,
    FsWorkload::Iogen { direct: false },
    FsWorkload::Iogen { direct: true },
    FsWorkload::IogenRaw,
];

impl FsWorkload {
    pub fn name(self) -> &'static str {
        match self {
            FsWorkload::Flowop(n) => n,
            FsWorkload::Postmark => "postmark",
            FsWorkload::Bonnie => "bonnie",
            FsWorkload::Iogen { direct: false } => "iogen",
            FsWorkload::Iogen { direct: true } => "iogen-direct",
            FsWorkload::IogenRaw => "iogen-raw",
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<FsWorkload> {
        ALL.iter().copied().find(|w| w.name() == s).ok_or_else(|| {
            let names: Vec<&str> = ALL.iter().map(|w| w.name()).collect();
            anyhow::anyhow!("unknown fs workload {s:?} ({})", names.join(", "))
        })
    }

    /// Does the client's memory limit change what this workload measures?
    /// The personalities run at every `--client-mem`; the others (O_DIRECT,
    /// or sized from the smallest limit) at the smallest only.
    pub fn at_every_limit(self) -> bool {
        matches!(self, FsWorkload::Flowop(n) if n != "oltp-direct")
    }

    /// Only the local baseline has a raw device to run on.
    pub fn local_only(self) -> bool {
        self == FsWorkload::IogenRaw
    }
}

/// Sizes and durations of the fs suite (from `--quick` and the volume).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FsParams {
    pub workloads: Vec<String>,
    /// Memory limits of the client cgroup, bytes, smallest first.
    pub client_mem: Vec<u64>,
    /// `v1` or `v2`: where the memory controller was.
    pub cgroup: String,
    pub repeat: u32,
    /// Seconds of each flowop and fio run.
    pub runtime_s: u32,
    /// Divisors of filebench's file counts and threads, per personality.
    pub flowop_scale: Vec<(String, usize, usize)>,
    pub postmark_files: u32,
    pub postmark_transactions: u32,
    pub bonnie_size: u64,
    pub iogen_size: u64,
    pub iogen_jobs: u32,
    pub iogen_bs: u64,
    pub iogen_read_pct: u32,
}

impl FsParams {
    pub fn scale_of(&self, personality: &str) -> (usize, usize) {
        self.flowop_scale
            .iter()
            .find(|(n, _, _)| n == personality)
            .map(|(_, f, t)| (*f, *t))
            .unwrap_or((1, 1))
    }
}

/// What PostMark reports (counts; its own timer has whole-second
/// resolution, so rates come from the lab's clock around the process).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PostmarkResult {
    /// As configured (PostMark prints only a rate in whole seconds).
    pub transactions: u64,
    pub created: u64,
    pub read: u64,
    pub appended: u64,
    pub deleted: u64,
    pub mb_read: f64,
    pub mb_written: f64,
}

/// Bonnie++'s block (not per-character) results, from its CSV line.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BonnieResult {
    pub size_mib: u64,
    /// KiB/s; `None` where Bonnie++ printed `+++++` (done too fast to time).
    pub block_write_kib_s: Option<f64>,
    pub rewrite_kib_s: Option<f64>,
    pub block_read_kib_s: Option<f64>,
    pub seeks_per_s: Option<f64>,
    /// Worst request latency per test, µs.
    pub block_write_lat_us: Option<f64>,
    pub rewrite_lat_us: Option<f64>,
    pub block_read_lat_us: Option<f64>,
    pub seeks_lat_us: Option<f64>,
}

/// The IOgen-like run, from fio's JSON: IOPS, response time (what the
/// processes wait per request) and service time (device busy time per
/// request, from fio's disk utilisation of the device under the file).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IogenResult {
    pub iops: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub bw_bytes: f64,
    /// Mean completion latency over reads and writes, µs.
    pub response_us: f64,
    pub read_response_us: f64,
    pub write_response_us: f64,
    /// Device busy time per device request, µs (`None` without disk stats).
    pub service_us: Option<f64>,
    pub device: String,
    pub device_util_pct: f64,
    pub ios: u64,
    pub runtime_s: f64,
    pub errors: u64,
}

/// What a workload produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum FsResult {
    Flowop(FlowReport),
    Postmark(PostmarkResult),
    Bonnie(BonnieResult),
    Iogen(IogenResult),
}

/// One run of an fs workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FsSample {
    /// `blockwire-iscsi`, `tgt-iscsi`, ..., or `local-fs`.
    pub subject: SubjectKey,
    pub link: LinkName,
    /// `None` for the local baseline.
    pub mtu: Option<u32>,
    /// The memory limit of the cgroup the workload ran in, bytes.
    pub client_mem: u64,
    /// `webserver`, ..., `postmark`, `bonnie`, `iogen`, `iogen-direct`, `iogen-raw`.
    pub workload: String,
    pub repeat: u32,
    pub result: FsResult,
    /// Wall time of the workload process (PostMark's rates use it).
    pub elapsed_s: f64,
    /// CPU of the workload process and its children (getrusage).
    pub workload_cpu_s: f64,
    /// CPU of the attach daemon (the protocol initiator) over the run.
    pub attach_cpu_s: Option<f64>,
    pub target_cpu_s: Option<f64>,
    pub wire: Option<WireCounters>,
    /// Highest memory use of the cgroup, page cache included.
    pub peak_mem_bytes: Option<u64>,
    pub busy_before: f64,
    pub started_unix: f64,
    /// The file-system factors (`--fs`, `--fsync`); empty: ext4 with
    /// fsync honoured, the lab's default (and older results).
    #[serde(default, skip_serializing_if = "FsFactors::is_default")]
    pub factors: FsFactors,
}

/// The file system a case ran on and whether fsync reached it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FsFactors {
    /// `ext4-tuned`, `xfs`, `btrfs`, `btrfs-nodatacow`, `zfs` (empty: ext4).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fs: String,
    /// `ignore`: fsync and friends made no-ops for the workload (empty: honoured).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fsync: String,
}

impl FsFactors {
    pub fn is_default(&self) -> bool {
        *self == FsFactors::default()
    }

    /// The file system's name (`ext4` for the default).
    pub fn fs_name(&self) -> &str {
        if self.fs.is_empty() { "ext4" } else { &self.fs }
    }

    /// `xfs, fsync ignored` (`ext4` at the defaults).
    pub fn describe(&self) -> String {
        let mut d = self.fs_name().to_string();
        match self.fsync.as_str() {
            "" => {}
            "ignore" => d += ", fsync ignored",
            other => d += &format!(", fsync {other}"),
        }
        d
    }
}

/// One number an fs run is compared on.
#[derive(Debug, Clone, PartialEq)]
pub struct Measure {
    /// The row it belongs to: the workload, or a part of it
    /// (`bonnie block write`), so each row has one headline.
    pub row: String,
    /// What it is: `ops/s`, `MiB/s`, `mean µs lgwr:write`, ...
    pub what: String,
    pub unit: &'static str,
    pub higher_is_better: bool,
    /// The row's headline (the answer table's throughput).
    pub headline: bool,
    pub value: f64,
}

fn m(
    row: &str,
    what: &str,
    unit: &'static str,
    higher: bool,
    headline: bool,
    value: f64,
) -> Measure {
    Measure {
        row: row.to_string(),
        what: what.to_string(),
        unit,
        higher_is_better: higher,
        headline,
        value,
    }
}

const MIB: f64 = 1048576.0;

impl FsSample {
    /// Operations the run did (for CPU and wire bytes per operation).
    pub fn ops(&self) -> Option<f64> {
        match &self.result {
            FsResult::Flowop(f) => Some(f.ops as f64),
            FsResult::Postmark(p) => Some((p.transactions.max(1) + p.created + p.deleted) as f64),
            FsResult::Iogen(i) => Some(i.ios as f64),
            FsResult::Bonnie(_) => None,
        }
    }

    /// Client (workload + attach daemon) and target CPU per operation, µs.
    pub fn cpu_us_per_op(&self) -> Option<f64> {
        let ops = self.ops()?;
        (ops > 0.0).then(|| {
            (self.workload_cpu_s
                + self.attach_cpu_s.unwrap_or(0.0)
                + self.target_cpu_s.unwrap_or(0.0))
                * 1e6
                / ops
        })
    }

    pub fn wire_bytes_per_op(&self) -> Option<f64> {
        let ops = self.ops()?;
        (ops > 0.0)
            .then(|| self.wire.map(|w| w.bytes() as f64 / ops))
            .flatten()
    }

    /// Every number of this run the report shows, grouped in rows.
    pub fn measures(&self) -> Vec<Measure> {
        let w = self.workload.as_str();
        let mut v = match &self.result {
            FsResult::Flowop(f) => flowop_measures(w, f),
            FsResult::Postmark(p) => postmark_measures(w, p, self.elapsed_s),
            FsResult::Bonnie(b) => bonnie_measures(b),
            FsResult::Iogen(i) => iogen_measures(w, i),
        };
        if let Some(c) = self.cpu_us_per_op() {
            for row in v
                .iter()
                .filter(|x| x.headline)
                .map(|x| x.row.clone())
                .collect::<Vec<_>>()
            {
                v.push(m(&row, "CPU per op", "µs", false, false, c));
            }
        }
        if let Some(b) = self.wire_bytes_per_op() {
            for row in v
                .iter()
                .filter(|x| x.headline)
                .map(|x| x.row.clone())
                .collect::<Vec<_>>()
            {
                v.push(m(&row, "wire bytes per op", "B", false, false, b));
            }
        }
        v
    }
}


/// A flowop workload's rows: ops/s and MiB/s, each flowop's mean and p99 latency.
fn flowop_measures(w: &str, f: &FlowReport) -> Vec<Measure> {
    let mut v = vec![];
    v.push(m(w, "ops/s", "ops/s", true, true, f.ops_per_s));
    v.push(m(w, "MiB/s", "MiB/s", true, false, f.mib_per_s));
    for (name, s) in &f.flowops {
        if s.count > 0 {
            v.push(m(
                w,
                &format!("{name} mean"),
                "µs",
                false,
                false,
                s.mean_lat_us(),
            ));
            v.push(m(
                w,
                &format!("{name} p99"),
                "µs",
                false,
                false,
                s.lat_p99_ns as f64 / 1e3,
            ));
        }
    }
    v
}

/// PostMark's rows: transactions, files created and bytes moved per second.
fn postmark_measures(w: &str, p: &PostmarkResult, elapsed_s: f64) -> Vec<Measure> {
    let mut v = vec![];
    let t = elapsed_s.max(1e-9);
    v.push(m(
        w,
        "transactions/s",
        "tx/s",
        true,
        true,
        p.transactions as f64 / t,
    ));
    v.push(m(
        w,
        "files created/s",
        "files/s",
        true,
        false,
        p.created as f64 / t,
    ));
    v.push(m(
        w,
        "MiB/s read+written",
        "MiB/s",
        true,
        false,
        (p.mb_read + p.mb_written) * 1e6 / MIB / t,
    ));
    v
}

/// Bonnie++'s rows: block write, rewrite, block read and seeks, each with
/// its worst latency.
fn bonnie_measures(b: &BonnieResult) -> Vec<Measure> {
    let mut v = vec![];
    for (row, rate, lat) in [
        (
            "bonnie block write",
            b.block_write_kib_s,
            b.block_write_lat_us,
        ),
        ("bonnie rewrite", b.rewrite_kib_s, b.rewrite_lat_us),
        ("bonnie block read", b.block_read_kib_s, b.block_read_lat_us),
    ] {
        if let Some(r) = rate {
            v.push(m(row, "MiB/s", "MiB/s", true, true, r / 1024.0));
        }
        if let Some(l) = lat {
            v.push(m(row, "worst latency", "µs", false, false, l));
        }
    }
    if let Some(s) = b.seeks_per_s {
        v.push(m("bonnie seeks", "seeks/s", "seeks/s", true, true, s));
    }
    if let Some(l) = b.seeks_lat_us {
        v.push(m("bonnie seeks", "worst latency", "µs", false, false, l));
    }
    v
}

/// IOgen's rows: IOPS, response and service time, MiB/s.
fn iogen_measures(w: &str, i: &IogenResult) -> Vec<Measure> {
    let mut v = vec![];
    v.push(m(w, "IOPS", "IOPS", true, true, i.iops));
    v.push(m(w, "response time", "µs", false, false, i.response_us));
    if let Some(s) = i.service_us {
        v.push(m(w, "service time", "µs", false, false, s));
    }
    v.push(m(w, "MiB/s", "MiB/s", true, false, i.bw_bytes / MIB));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_by_name_and_where_they_run() {
        for w in ALL {
            assert_eq!(FsWorkload::parse(w.name()).unwrap(), w);
        }
        assert!(FsWorkload::parse("filebench").is_err());
        assert!(FsWorkload::Flowop("varmail").at_every_limit());
        assert!(!FsWorkload::Flowop("oltp-direct").at_every_limit());
        assert!(!FsWorkload::Bonnie.at_every_limit());
        assert!(FsWorkload::IogenRaw.local_only() && !FsWorkload::Postmark.local_only());
    }

    #[test]
    fn measures_per_row_with_cpu_and_wire_per_op() {
        let mut flow = FlowReport {
            personality: "varmail".into(),
            elapsed_s: 2.0,
            ops: 1000,
            ops_per_s: 500.0,
            mib_per_s: 3.0,
            ..Default::default()
        };
        flow.flowops.insert(
            "filereader:fsync".into(),
            bw_workload_report::OpStats {
                count: 100,
                bytes: 0,
                lat_total_ns: 100_000_000,
                lat_max_ns: 3_000_000,
                lat_p50_ns: 900_000,
                lat_p99_ns: 2_500_000,
            },
        );
        let s = FsSample {
            subject: SubjectKey::served("blockwire", "iscsi"),
            link: "none".into(),
            mtu: Some(1500),
            client_mem: 256 << 20,
            workload: "varmail".into(),
            repeat: 1,
            result: FsResult::Flowop(flow),
            elapsed_s: 2.2,
            workload_cpu_s: 0.5,
            attach_cpu_s: Some(0.3),
            target_cpu_s: Some(0.2),
            wire: Some(WireCounters {
                rx_bytes: 600_000,
                tx_bytes: 400_000,
                rx_packets: 10,
                tx_packets: 10,
            }),
            peak_mem_bytes: None,
            busy_before: 0.0,
            started_unix: 0.0,
            factors: Default::default(),
        };
        let ms = s.measures();
        let get = |what: &str| ms.iter().find(|x| x.what == what).map(|x| x.value);
        assert_eq!(get("ops/s"), Some(500.0));
        assert_eq!(get("filereader:fsync mean"), Some(1000.0));
        assert_eq!(get("filereader:fsync p99"), Some(2500.0));
        // (0.5 + 0.3 + 0.2) s over 1000 ops = 1000 µs; 1 MB over 1000 ops.
        assert_eq!(get("CPU per op"), Some(1000.0));
        assert_eq!(get("wire bytes per op"), Some(1000.0));
        assert_eq!(ms.iter().filter(|x| x.headline).count(), 1);
        let b = FsSample {
            result: FsResult::Bonnie(BonnieResult {
                block_write_kib_s: Some(102400.0),
                seeks_per_s: Some(900.0),
                ..Default::default()
            }),
            ..s
        };
        let rows: Vec<String> = b
            .measures()
            .iter()
            .filter(|x| x.headline)
            .map(|x| x.row.clone())
            .collect();
        assert_eq!(rows, ["bonnie block write", "bonnie seeks"]);
        assert_eq!(b.measures()[0].value, 100.0);
    }
}
