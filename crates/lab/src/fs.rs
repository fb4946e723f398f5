//! The fs suite's workloads, apart from how they are run: what each one is
//! (the filebench personalities through `blockwire flowop`, PostMark,
//! Bonnie++, an IOgen-like fio run), the command line it needs, how its
//! output is read, and the numbers the report compares.
//!
//! Every workload runs on ext4 made on the volume and mounted with
//! `blockwire mount` (or, for the local baseline, on a loop device over the
//! backing file), inside a memory cgroup that limits the client's page
//! cache. `iogen-raw` is the exception: the same fio job on the local loop
//! device itself, before the file system is made, for what ext4 costs.

use crate::results::WireCounters;
use bw_workload_report::FlowReport;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The subject key of the local baseline (ext4 on a loop device over the
/// backing file, no network).
pub const LOCAL: &str = "local-fs";

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

/// The program and arguments of one run (`exe` is the blockwire binary).
pub fn command(
    w: FsWorkload,
    p: &FsParams,
    exe: &Path,
    dir: &Path,
    raw_dev: Option<&str>,
) -> (String, Vec<String>) {
    let s = |x: &str| x.to_string();
    match w {
        FsWorkload::Flowop(name) => {
            let (files, threads) = p.scale_of(name);
            (
                exe.to_string_lossy().into_owned(),
                vec![
                    s("flowop"),
                    s(name),
                    dir.to_string_lossy().into_owned(),
                    s("--runtime"),
                    p.runtime_s.to_string(),
                    s("--files-scale"),
                    files.to_string(),
                    s("--threads-scale"),
                    threads.to_string(),
                    s("--drop-cache"),
                    s("--json"),
                ],
            )
        }
        // PostMark reads its commands from a file (see `postmark_config`).
        FsWorkload::Postmark => (
            s("postmark"),
            vec![dir.join("postmark.cfg").to_string_lossy().into_owned()],
        ),
        FsWorkload::Bonnie => {
            let mib = (p.bonnie_size >> 20).max(2);
            (
                s("bonnie++"),
                vec![
                    s("-d"),
                    dir.to_string_lossy().into_owned(),
                    s("-s"),
                    format!("{mib}M"),
                    // Bonnie++ insists on a file of twice the RAM it assumes.
                    s("-r"),
                    (mib / 2).to_string(),
                    s("-n"),
                    s("0"),
                    s("-f"),
                    s("-u"),
                    s("root"),
                    s("-q"),
                    s("-m"),
                    s("lab"),
                ],
            )
        }
        FsWorkload::Iogen { direct } => (
            s("fio"),
            iogen_args(p, &dir.join("iogen.dat").to_string_lossy(), direct),
        ),
        FsWorkload::IogenRaw => (
            s("fio"),
            iogen_args(p, raw_dev.unwrap_or("/dev/null"), true),
        ),
    }
}

/// fio as IOgen: `iogen_jobs` processes (psync: one request each, like
/// IOgen's processes) doing random reads and writes of `iogen_bs` on one
/// shared file. fio drops the file's cached pages before it starts.
pub fn iogen_args(p: &FsParams, file: &str, direct: bool) -> Vec<String> {
    vec![
        "--name=iogen".to_string(),
        format!("--filename={file}"),
        format!("--size={}", p.iogen_size),
        "--rw=randrw".into(),
        format!("--rwmixread={}", p.iogen_read_pct),
        format!("--bs={}", p.iogen_bs),
        format!("--numjobs={}", p.iogen_jobs),
        "--ioengine=psync".into(),
        format!("--direct={}", direct as u8),
        "--invalidate=1".into(),
        "--time_based".into(),
        format!("--runtime={}", p.runtime_s),
        "--group_reporting".into(),
        "--output-format=json".into(),
    ]
}

/// The fio job that lays out the IOgen file before the measured run (not
/// measured; written back so the run starts from a settled file).
pub fn iogen_layout_args(p: &FsParams, file: &str) -> Vec<String> {
    vec![
        "--name=layout".to_string(),
        format!("--filename={file}"),
        format!("--size={}", p.iogen_size),
        "--rw=write".into(),
        "--bs=1M".into(),
        "--ioengine=psync".into(),
        "--end_fsync=1".into(),
        "--output-format=json".into(),
    ]
}

/// PostMark's command file: a pool of `postmark_files` files of 512 B to
/// 16 KiB in 10 directories, `postmark_transactions` create/delete and
/// read/append transactions, unbuffered 4 KiB reads and writes.
pub fn postmark_config(p: &FsParams, dir: &Path) -> String {
    format!(
        "set location {}\nset number {}\nset transactions {}\nset size 512 16384\nset subdirectories 10\nset read 4096\nset write 4096\nset buffering false\nset report verbose\nrun\nquit\n",
        dir.display(),
        p.postmark_files,
        p.postmark_transactions
    )
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

pub fn parse_postmark(text: &str) -> anyhow::Result<PostmarkResult> {
    let mut r = PostmarkResult::default();
    let first_num = |l: &str| -> Option<f64> { l.split_whitespace().next()?.parse().ok() };
    for l in text.lines().map(str::trim) {
        let n = first_num(l);
        if l.ends_with(')') && l.contains(" created (") {
            r.created = n.unwrap_or(0.0) as u64;
        } else if l.contains(" read (") && !l.contains("megabytes") {
            r.read = n.unwrap_or(0.0) as u64;
        } else if l.contains(" appended (") {
            r.appended = n.unwrap_or(0.0) as u64;
        } else if l.contains(" deleted (") {
            r.deleted = n.unwrap_or(0.0) as u64;
        } else if l.contains("megabytes read") {
            r.mb_read = n.unwrap_or(0.0);
        } else if l.contains("megabytes written") {
            r.mb_written = n.unwrap_or(0.0);
        }
    }
    anyhow::ensure!(
        r.created > 0 && r.deleted > 0,
        "PostMark printed no file counts: {}",
        last_line(text)
    );
    Ok(r)
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

/// Parse the CSV line of `bonnie++ -q` (format 1.98, Bonnie++ 2.00).
pub fn parse_bonnie(text: &str) -> anyhow::Result<BonnieResult> {
    let line = text
        .lines()
        .find(|l| l.starts_with("1.9") && l.matches(',').count() > 40)
        .ok_or_else(|| anyhow::anyhow!("Bonnie++ printed no CSV line: {}", last_line(text)))?;
    let f: Vec<&str> = line.split(',').collect();
    let num = |i: usize| -> Option<f64> { f.get(i).and_then(|x| x.trim().parse::<f64>().ok()) };
    let lat = |i: usize| -> Option<f64> {
        let x = f.get(i)?.trim();
        if let Some(v) = x.strip_suffix("us") {
            v.parse().ok()
        } else if let Some(v) = x.strip_suffix("ms") {
            v.parse::<f64>().ok().map(|v| v * 1e3)
        } else if let Some(v) = x.strip_suffix('s') {
            v.parse::<f64>().ok().map(|v| v * 1e6)
        } else {
            None
        }
    };
    let size_mib = f
        .get(5)
        .map(|s| bw_block::parse_size(s).map(|b| b >> 20).unwrap_or(0))
        .unwrap_or(0);
    // Fields: 11 block write, 13 rewrite, 17 block read, 19 seeks (each
    // followed by its CPU %); latencies from 38: putc, block write,
    // rewrite, getc, block read, seeks.
    Ok(BonnieResult {
        size_mib,
        block_write_kib_s: num(11),
        rewrite_kib_s: num(13),
        block_read_kib_s: num(17),
        seeks_per_s: num(19),
        block_write_lat_us: lat(39),
        rewrite_lat_us: lat(40),
        block_read_lat_us: lat(42),
        seeks_lat_us: lat(43),
    })
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

pub fn parse_iogen(text: &str) -> anyhow::Result<IogenResult> {
    let start = text
        .find('{')
        .ok_or_else(|| anyhow::anyhow!("fio printed no JSON: {}", last_line(text)))?;
    let v: serde_json::Value = serde_json::from_str(&text[start..])?;
    let job = v
        .get("jobs")
        .and_then(|j| j.get(0))
        .ok_or_else(|| anyhow::anyhow!("fio JSON has no jobs"))?;
    let mut r = IogenResult::default();
    let mut lat_sum = 0.0;
    for dir in ["read", "write"] {
        let d = job
            .get(dir)
            .ok_or_else(|| anyhow::anyhow!("fio JSON lacks {dir}"))?;
        let f = |k: &str| d.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
        let ios = f("total_ios") as u64;
        let mean_us = d
            .get("lat_ns")
            .and_then(|l| l.get("mean"))
            .and_then(|x| x.as_f64())
            .unwrap_or(0.0)
            / 1e3;
        r.iops += f("iops");
        r.bw_bytes += f("bw_bytes");
        r.ios += ios;
        lat_sum += mean_us * ios as f64;
        if dir == "read" {
            r.read_iops = f("iops");
            r.read_response_us = mean_us;
        } else {
            r.write_iops = f("iops");
            r.write_response_us = mean_us;
        }
    }
    r.response_us = if r.ios > 0 {
        lat_sum / r.ios as f64
    } else {
        0.0
    };
    r.runtime_s = job
        .get("job_runtime")
        .and_then(|x| x.as_f64())
        .unwrap_or(0.0)
        / 1e3;
    r.errors = job.get("error").and_then(|x| x.as_u64()).unwrap_or(0);
    if let Some(d) = v.get("disk_util").and_then(|d| d.get(0)) {
        let g = |k: &str| d.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
        r.device = d
            .get("name")
            .and_then(|x| x.as_str())
            .unwrap_or("")
            .to_string();
        r.device_util_pct = g("util");
        let dev_ios = g("read_ios") + g("write_ios");
        if dev_ios > 0.0 && r.runtime_s > 0.0 {
            r.service_us = Some(g("util") / 100.0 * r.runtime_s * 1e6 / dev_ios);
        }
    }
    anyhow::ensure!(r.ios > 0, "fio did no I/O");
    Ok(r)
}

fn last_line(s: &str) -> String {
    s.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(nothing)")
        .chars()
        .take(200)
        .collect()
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
    pub subject: String,
    pub link: String,
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
        let mut v = vec![];
        match &self.result {
            FsResult::Flowop(f) => {
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
            }
            FsResult::Postmark(p) => {
                let t = self.elapsed_s.max(1e-9);
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
            }
            FsResult::Bonnie(b) => {
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
            }
            FsResult::Iogen(i) => {
                v.push(m(w, "IOPS", "IOPS", true, true, i.iops));
                v.push(m(w, "response time", "µs", false, false, i.response_us));
                if let Some(s) = i.service_us {
                    v.push(m(w, "service time", "µs", false, false, s));
                }
                v.push(m(w, "MiB/s", "MiB/s", true, false, i.bw_bytes / MIB));
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> FsParams {
        FsParams {
            workloads: ALL.iter().map(|w| w.name().to_string()).collect(),
            client_mem: vec![256 << 20, 2 << 30],
            cgroup: "v1".into(),
            repeat: 3,
            runtime_s: 5,
            flowop_scale: vec![("fileserver".into(), 4, 1)],
            postmark_files: 5000,
            postmark_transactions: 20000,
            bonnie_size: 512 << 20,
            iogen_size: 512 << 20,
            iogen_jobs: 4,
            iogen_bs: 8192,
            iogen_read_pct: 70,
        }
    }

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
    fn command_lines() {
        let p = params();
        let exe = Path::new("/usr/bin/blockwire");
        let (prog, a) = command(
            FsWorkload::Flowop("fileserver"),
            &p,
            exe,
            Path::new("/mnt/w"),
            None,
        );
        assert_eq!(prog, "/usr/bin/blockwire");
        assert_eq!(a[..3], ["flowop", "fileserver", "/mnt/w"]);
        assert!(a.windows(2).any(|x| x == ["--files-scale", "4"]));
        assert!(a.contains(&"--drop-cache".to_string()) && a.contains(&"--json".to_string()));
        let (prog, a) = command(FsWorkload::Bonnie, &p, exe, Path::new("/mnt/w"), None);
        assert_eq!(prog, "bonnie++");
        assert!(
            a.windows(2).any(|x| x == ["-s", "512M"]) && a.windows(2).any(|x| x == ["-r", "256"])
        );
        let (prog, a) = command(
            FsWorkload::IogenRaw,
            &p,
            exe,
            Path::new("/mnt/w"),
            Some("/dev/loop7"),
        );
        assert_eq!(prog, "fio");
        assert!(
            a.contains(&"--filename=/dev/loop7".to_string())
                && a.contains(&"--direct=1".to_string())
        );
        let (_, a) = command(
            FsWorkload::Iogen { direct: false },
            &p,
            exe,
            Path::new("/mnt/w"),
            None,
        );
        assert!(
            a.contains(&"--filename=/mnt/w/iogen.dat".to_string())
                && a.contains(&"--direct=0".to_string())
        );
        assert!(
            a.contains(&"--numjobs=4".to_string()) && a.contains(&"--ioengine=psync".to_string())
        );
        let cfg = postmark_config(&p, Path::new("/mnt/w"));
        assert!(
            cfg.starts_with("set location /mnt/w\nset number 5000\nset transactions 20000\n")
                && cfg.ends_with("run\nquit\n")
        );
    }

    #[test]
    fn postmark_output() {
        // Recorded from postmark 1.51 (Debian 1.53-2).
        let text = "PostMark v1.51 : 8/14/01\nReading configuration from file 'cfg'\nCreating subdirectories...Done\nCreating files...Done\nPerforming transactions..........Done\nDeleting files...Done\nDeleting subdirectories...Done\nTime:\n\t1 seconds total\n\t1 seconds of transactions (2000 per second)\n\nFiles:\n\t1516 created (1516 per second)\n\t\tCreation alone: 500 files (500 per second)\n\t\tMixed with transactions: 1016 files (1016 per second)\n\t942 read (942 per second)\n\t1056 appended (1056 per second)\n\t1516 deleted (1516 per second)\n\t\tDeletion alone: 532 files (532 per second)\n\t\tMixed with transactions: 984 files (984 per second)\n\nData:\n\t5.57 megabytes read (5.57 megabytes per second)\n\t9.25 megabytes written (9.25 megabytes per second)\n";
        let r = parse_postmark(text).unwrap();
        assert_eq!(
            (r.created, r.read, r.appended, r.deleted),
            (1516, 942, 1056, 1516)
        );
        assert_eq!((r.mb_read, r.mb_written), (5.57, 9.25));
        assert!(parse_postmark("postmark: cannot open location").is_err());
    }

    #[test]
    fn bonnie_csv() {
        // Recorded from bonnie++ 2.00a -q (per-character tests on, file tests on).
        let line = "1.98,2.00a,vm,1,1795406981,64M,,8192,5,353,41,69426,36,+++++,+++,317,20,+++++,+++,1234.5,20,1,,,,,816,18,+++++,+++,+++++,+++,930,34,+++++,+++,+++++,+++,80127us,27499us,21077us,1003ms,12975us,47946us,20395us,3044us,50433us,22150us,137us,8106us";
        let r = parse_bonnie(&format!("some stderr noise\n{line}\n")).unwrap();
        assert_eq!(r.size_mib, 64);
        assert_eq!(r.block_write_kib_s, Some(69426.0));
        assert_eq!(r.rewrite_kib_s, None, "+++++ means too fast to time");
        assert_eq!(r.seeks_per_s, Some(1234.5));
        assert_eq!(r.block_write_lat_us, Some(27499.0));
        assert_eq!(r.block_read_lat_us, Some(12975.0));
        assert_eq!(r.seeks_lat_us, Some(47946.0));
        assert!(parse_bonnie("Can't open file").is_err());
    }

    #[test]
    fn iogen_json_with_service_time() {
        let text = r#"{"fio version":"fio-3.33","jobs":[{"jobname":"iogen","error":0,"job_runtime":5000,
"read":{"io_bytes":286720000,"bw_bytes":57344000,"iops":7000.0,"total_ios":35000,"lat_ns":{"mean":400000.0}},
"write":{"io_bytes":122880000,"bw_bytes":24576000,"iops":3000.0,"total_ios":15000,"lat_ns":{"mean":600000.0}}}],
"disk_util":[{"name":"loop4","read_ios":35000,"write_ios":5000,"read_merges":0,"write_merges":0,"read_ticks":1,"write_ticks":1,"in_queue":2,"util":80.0}]}"#;
        let r = parse_iogen(text).unwrap();
        assert_eq!(r.iops, 10_000.0);
        assert_eq!(r.ios, 50_000);
        assert!((r.response_us - 460.0).abs() < 1e-9, "{}", r.response_us);
        // 80% of 5 s busy over 40000 device requests: 100 µs each.
        assert!((r.service_us.unwrap() - 100.0).abs() < 1e-9);
        assert_eq!(r.device, "loop4");
        assert!(parse_iogen("{\"jobs\":[]}").is_err());
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
            subject: "blockwire-iscsi".into(),
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
