//! The fs suite's workloads, apart from how they are run: the command line
//! each one needs (the filebench personalities through `blockwire flowop`,
//! PostMark, Bonnie++, an IOgen-like fio run) and how its output is read.
//! What they are and the numbers the report compares are records
//! (`bw_lab_results::fs`, re-exported here).
//!
//! Every workload runs on ext4 made on the volume and mounted with
//! `blockwire mount` (or, for the local baseline, on a loop device over the
//! backing file), inside a memory cgroup that limits the client's page
//! cache. `iogen-raw` is the exception: the same fio job on the local loop
//! device itself, before the file system is made, for what ext4 costs.

pub use bw_lab_results::fs::*;
use std::path::Path;

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

}
