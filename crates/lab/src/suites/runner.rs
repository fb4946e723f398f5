//! One measured run: `blockwire bench ... --json` in the client namespace
//! against a URL, or fio on the backing file for the local baseline.

use crate::cleanup::registry;
use crate::command::{last_lines, read_in_background};
use bw_lab_results::{BenchResult, Latency, Workload};
use bw_workload_report::BenchReport;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How a tracked command ended.
#[derive(Debug, Clone, Default)]
pub struct Finished {
    /// Exited with status 0.
    pub ok: bool,
    /// The signal that ended it, if one did (SIGKILL from the OOM killer).
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// rusage CPU seconds of it and its reaped children.
    pub cpu_s: f64,
    pub elapsed_s: f64,
}

/// Run a command to completion with a deadline, tracked for cleanup (as a
/// workload: the first Ctrl-C stops it).
fn run_tracked(
    cmd: Command,
    what: &str,
    timeout: Duration,
) -> anyhow::Result<(bool, String, String, f64)> {
    let f = run_workload(cmd, what, timeout, None)?;
    Ok((f.ok, f.stdout, f.stderr, f.cpu_s))
}

/// Run a workload to completion with a deadline, tracked for cleanup, in
/// the cgroup whose `cgroup.procs` is `cgroup` if given.
pub fn run_workload(
    cmd: Command,
    what: &str,
    timeout: Duration,
    cgroup: Option<&Path>,
) -> anyhow::Result<Finished> {
    run_workload_with_stdin(cmd, what, timeout, cgroup, Stdio::null())
}

/// [`run_workload`] with `stdin` (a pipe for a host's service command:
/// kept open while it runs, its end stops the remote program).
pub(crate) fn run_workload_with_stdin(
    mut cmd: Command,
    what: &str,
    timeout: Duration,
    cgroup: Option<&Path>,
    stdin: Stdio,
) -> anyhow::Result<Finished> {
    cmd.stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let (token, mut child) =
        registry().spawn_in(&mut cmd, what, crate::cleanup::Role::Workload, cgroup)?;
    let _session = child.stdin.take();
    let pid = child.id();
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    let t_out = read_in_background(out);
    let t_err = read_in_background(err);
    let deadline = Instant::now() + timeout;
    let mut status = 0i32;
    // SAFETY: zeroed rusage is a valid initial value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let mut timed_out = false;
    loop {
        // SAFETY: wait4 on our own child; WNOHANG never blocks.
        let r = unsafe { libc::wait4(pid as i32, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid as i32 {
            break;
        }
        if r < 0 {
            // Reaped by the signal path's cleanup (interrupted).
            status = -1;
            break;
        }
        if Instant::now() > deadline {
            timed_out = true;
            crate::cleanup::kill_all(&[pid]);
            status = -1;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    registry().forget(token);
    drop(child);
    // Through an ssh connection multiplexer the master holds our pipes'
    // other ends until the remote command ends, which a killed client
    // does not end: wait a bounded time for the output, then go on.
    let grace = Duration::from_secs(if timed_out { 5 } else { 30 });
    let stdout = t_out.recv_timeout(grace).unwrap_or_default();
    let mut stderr = t_err.recv_timeout(grace).unwrap_or_default();
    if timed_out {
        stderr.push_str(&format!("\n(killed after {timeout:?})"));
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu_s = tv(ru.ru_utime) + tv(ru.ru_stime);
    let ok = status != -1 && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    let signal = (status != -1 && libc::WIFSIGNALED(status)).then(|| libc::WTERMSIG(status));
    Ok(Finished {
        ok,
        signal,
        stdout,
        stderr,
        cpu_s,
        elapsed_s: t0.elapsed().as_secs_f64(),
    })
}

/// The bench arguments for `workload` (fio-style names).
pub fn bench_args(url: &str, w: &Workload, runtime_s: u32, size: u64) -> Vec<String> {
    let mut a = vec![
        "bench".to_string(),
        url.to_string(),
        "--rw".into(),
        w.rw.clone(),
        "--bs".into(),
        w.bs.to_string(),
        "--iodepth".into(),
        w.iodepth.to_string(),
        "--numjobs".into(),
        w.numjobs.to_string(),
        "--runtime".into(),
        runtime_s.to_string(),
        "--size".into(),
        size.to_string(),
        "--json".into(),
    ];
    if let Some(m) = w.rwmixread {
        a.push("--rwmixread".into());
        a.push(m.to_string());
    }
    a
}

/// Parse the JSON report a workload command prints with `--json` (`bench`:
/// [`BenchReport`], `flowop`: `FlowReport`): its whole output is that one
/// object (what an ssh login shell prints first is cut off by
/// [`crate::hosts::host::Host::program_output`]).
pub fn parse_json_report<T: serde::de::DeserializeOwned>(stdout: &str) -> anyhow::Result<T> {
    serde_json::from_str(stdout.trim())
        .map_err(|e| anyhow::anyhow!("printed no JSON report ({e}): {}", last_lines(stdout, 3)))
}

/// What the lab keeps of a `blockwire bench --json` run.
pub fn parse_bench_json(stdout: &str) -> anyhow::Result<BenchResult> {
    parse_bench_json_described(stdout).map(|(b, _)| b)
}

/// The result and what the client said it ran against (its `target`:
/// the URL, the controller, and `TLS SUITE, LAYER` over TLS).
fn parse_bench_json_described(stdout: &str) -> anyhow::Result<(BenchResult, String)> {
    let r: BenchReport = parse_json_report(stdout).map_err(|e| anyhow::anyhow!("bench {e}"))?;
    Ok((BenchResult::from(&r), r.target.clone()))
}

/// `blockwire bench` of workload `w` on `url` from `client`: the result and
/// what the client said it ran against (the URL, the controller, and
/// `TLS SUITE, LAYER` over TLS).
pub fn run_bench(
    exe: &Path,
    client: &crate::hosts::host::Host,
    url: &str,
    w: &Workload,
    runtime_s: u32,
    size: u64,
    extra: &[&str],
) -> anyhow::Result<(BenchResult, String)> {
    // As a service: a bench on another host ends with its ssh session
    // (Ctrl-C, a lost connection) instead of running out its time.
    let mut args = bench_args(url, w, runtime_s, size);
    args.extend(extra.iter().map(|a| a.to_string()));
    let cmd = client.service_command(&client.lab_exe(exe).to_string_lossy(), &args);
    let timeout = Duration::from_secs(runtime_s as u64 + 60);
    let f = run_workload_with_stdin(cmd, "blockwire bench", timeout, None, client.service_stdin())?;
    let (ok, stdout, stderr) = (f.ok, f.stdout, f.stderr);
    if !ok {
        anyhow::bail!("bench {url} {} failed: {}", w.name, last_lines(&stderr, 3));
    }
    parse_bench_json_described(client.program_output(&stdout)?)
        .map_err(|e| anyhow::anyhow!("{e} (stderr: {})", last_lines(&stderr, 2)))
}

/// How fio reaches what it measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FioOn {
    /// The backing file (the local, no-network reference): io_uring gives
    /// real queue depth on tmpfs (libaio would complete synchronously on
    /// buffered files).
    File,
    /// A kernel initiator's block device: direct I/O with libaio, as the
    /// studies drove theirs (no page cache, like `blockwire bench`).
    Device,
}

/// fio's arguments for workload `w` on `file`: the one mapping of the lab's
/// workload definitions (those `blockwire bench` runs) to fio's options.
pub fn fio_args(file: &Path, w: &Workload, runtime_s: u32, size: u64, on: FioOn) -> Vec<String> {
    let (name, engine) = match on {
        FioOn::File => ("baseline", "io_uring"),
        FioOn::Device => ("device", "libaio"),
    };
    let mut a = vec![
        format!("--name={name}"),
        format!("--filename={}", file.display()),
        format!("--rw={}", w.rw),
        format!("--bs={}", w.bs),
        format!("--iodepth={}", w.iodepth),
        format!("--numjobs={}", w.numjobs),
        format!("--ioengine={engine}"),
        "--time_based".into(),
        format!("--runtime={runtime_s}"),
        format!("--size={size}"),
        "--group_reporting".into(),
        "--output-format=json".into(),
    ];
    if let Some(m) = w.rwmixread {
        a.push(format!("--rwmixread={m}"));
    }
    if on == FioOn::Device {
        a.push("--direct=1".into());
    }
    a
}

/// fio with direct I/O on block device `dev` of `client` (a kernel
/// initiator's), as a service like the bench: it ends with its session.
/// Its CPU is not kept (the caller measures the whole machine's).
pub fn run_fio_on_device(
    client: &crate::hosts::host::Host,
    dev: &str,
    w: &Workload,
    runtime_s: u32,
    size: u64,
) -> anyhow::Result<BenchResult> {
    let cmd = client.service_command("fio", &fio_args(Path::new(dev), w, runtime_s, size, FioOn::Device));
    // Generous: fio starts slowly on an emulated client.
    let timeout = Duration::from_secs(runtime_s as u64 + 120);
    let f = run_workload_with_stdin(cmd, "fio", timeout, None, client.service_stdin())?;
    if !f.ok {
        anyhow::bail!("fio {dev} {} failed: {}", w.name, last_lines(&f.stderr, 3));
    }
    parse_fio_json(client.program_output(&f.stdout)?).map_err(|e| anyhow::anyhow!("fio {dev}: {e} (stderr: {})", last_lines(&f.stderr, 2)))
}

pub fn run_fio(
    file: &Path,
    w: &Workload,
    runtime_s: u32,
    size: u64,
) -> anyhow::Result<BenchResult> {
    let mut cmd = Command::new("fio");
    cmd.args(fio_args(file, w, runtime_s, size, FioOn::File));
    let (ok, stdout, stderr, cpu) =
        run_tracked(cmd, "fio", Duration::from_secs(runtime_s as u64 + 60))?;
    if !ok {
        anyhow::bail!("fio {} failed: {}", w.name, last_lines(&stderr, 3));
    }
    let mut r = parse_fio_json(&stdout)?;
    // rusage covers fio and its reaped job processes: the client CPU.
    r.cpu_user_s = cpu;
    r.cpu_sys_s = 0.0;
    Ok(r)
}

/// Convert fio's JSON (group_reporting: one job) into a BenchResult. Reads
/// and writes are summed; for mixed loads the latency percentiles are those
/// of the direction with more I/Os for p50 and the worse of the two for the
/// tails (fio does not merge histograms across directions).
pub fn parse_fio_json(text: &str) -> anyhow::Result<BenchResult> {
    // fio may print notes before the JSON.
    let start = text
        .find('{')
        .ok_or_else(|| anyhow::anyhow!("fio printed no JSON"))?;
    let v: serde_json::Value = serde_json::from_str(&text[start..])?;
    let job = v
        .get("jobs")
        .and_then(|j| j.get(0))
        .ok_or_else(|| anyhow::anyhow!("fio JSON has no jobs"))?;
    let mut r = BenchResult::default();
    let mut dirs = vec![];
    for dir in ["read", "write"] {
        let d = job
            .get(dir)
            .ok_or_else(|| anyhow::anyhow!("fio JSON lacks {dir}"))?;
        let f = |k: &str| d.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
        let ios = f("total_ios") as u64;
        r.iops += f("iops");
        r.bw_bytes += f("bw_bytes");
        r.ios += ios;
        r.bytes += f("io_bytes") as u64;
        if ios > 0 {
            let clat = d.get("clat_ns");
            let pct = |p: &str| {
                clat.and_then(|c| c.get("percentile"))
                    .and_then(|x| x.get(p))
                    .and_then(|x| x.as_f64())
                    .unwrap_or(0.0)
            };
            let mean = d
                .get("lat_ns")
                .and_then(|l| l.get("mean"))
                .and_then(|x| x.as_f64())
                .unwrap_or(0.0);
            dirs.push((
                ios,
                Latency {
                    p50: pct("50.000000"),
                    p99: pct("99.000000"),
                    p999: pct("99.900000"),
                    mean,
                },
            ));
        }
    }
    if let Some((_, main)) = dirs.iter().max_by_key(|(ios, _)| *ios) {
        r.lat_ns.p50 = main.p50;
    }
    let total: u64 = dirs.iter().map(|(n, _)| n).sum();
    for (n, l) in &dirs {
        r.lat_ns.p99 = r.lat_ns.p99.max(l.p99);
        r.lat_ns.p999 = r.lat_ns.p999.max(l.p999);
        r.lat_ns.mean += l.mean * *n as f64 / total.max(1) as f64;
    }
    r.errors = job.get("error").and_then(|x| x.as_u64()).unwrap_or(0);
    r.runtime_s = job
        .get("job_runtime")
        .and_then(|x| x.as_f64())
        .unwrap_or(0.0)
        / 1e3;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w() -> Workload {
        Workload {
            name: "randrw".into(),
            rw: "randrw".into(),
            bs: 4096,
            iodepth: 16,
            numjobs: 2,
            rwmixread: Some(75),
        }
    }

    #[test]
    fn bench_json_in_various_shapes() {
        // What `blockwire bench --json` printed (bw_workload_report::BenchReport).
        let one = r#"{"target":"iscsi://198.18.0.1:3260/iqn.2026-11.org.blockwire.lab:disk/0","rw":"randrw","bs":4096,"iodepth":16,"numjobs":1,"rwmixread":75,"runtime_s":3.0,"ios":3001,"bytes":12292096,"iops":1000.5,"bw_bytes":4098048.0,"lat_ns":{"min":300,"mean":950.0,"p50":900,"p90":1500,"p99":2000,"p999":5000,"max":9000},"read":{"ios":2250,"bytes":9216000,"iops":750.0,"bw_bytes":3072000.0,"lat_ns":{"min":0,"mean":0.0,"p50":0,"p90":0,"p99":0,"p999":0,"max":0}},"write":{"ios":751,"bytes":3076096,"iops":250.5,"bw_bytes":1026048.0,"lat_ns":{"min":0,"mean":0.0,"p50":0,"p90":0,"p99":0,"p999":0,"max":0}},"cpu_user_s":0.1,"cpu_sys_s":0.2,"cpu_per_io_us":99.9,"errors":0}"#;
        let r = parse_bench_json(one).unwrap();
        assert_eq!(r.ios, 3001);
        assert_eq!(r.lat_ns.p999, 5000.0);
        assert_eq!(r.lat_ns.mean, 950.0);
        assert_eq!(r.cpu_sys_s, 0.2);
        assert_eq!(parse_bench_json(&format!("{one}\n")).unwrap(), r);
        // Anything beside the report is a fault to show, not to skip.
        assert!(parse_bench_json(&format!("connecting...\n{one}\n")).is_err());
        let report: BenchReport = serde_json::from_str(one).unwrap();
        let pretty = serde_json::to_string_pretty(&report).unwrap();
        assert_eq!(parse_bench_json(&pretty).unwrap(), r);
        assert!(parse_bench_json("no json here").is_err());
        assert!(
            parse_bench_json(r#"{"iops": 1}"#).is_err(),
            "missing fields must not pass"
        );
    }

    #[test]
    fn bench_and_fio_arguments() {
        let a = bench_args("aoe://x/1.0", &w(), 3, 1 << 20);
        assert_eq!(a[0..2], ["bench", "aoe://x/1.0"]);
        assert!(a.windows(2).any(|p| p == ["--rwmixread", "75"]));
        assert!(a.windows(2).any(|p| p == ["--numjobs", "2"]));
        assert!(a.contains(&"--json".to_string()));
        let f = fio_args(Path::new("/dev/shm/f"), &w(), 3, 1 << 20, FioOn::File);
        assert!(f.contains(&"--rwmixread=75".to_string()));
        assert!(f.contains(&"--filename=/dev/shm/f".to_string()));
        assert!(f.contains(&"--ioengine=io_uring".to_string()) && !f.contains(&"--direct=1".to_string()));
        let d = fio_args(Path::new("/dev/sdb"), &w(), 3, 1 << 20, FioOn::Device);
        assert!(d.contains(&"--ioengine=libaio".to_string()) && d.contains(&"--direct=1".to_string()));
        assert_eq!(f.iter().filter(|x| x.starts_with("--rw")).count(), d.iter().filter(|x| x.starts_with("--rw")).count());
    }

    #[test]
    fn fio_json_conversion() {
        // Trimmed fio 3.33 output of a randrw 75/25 run.
        let text = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{"fio version":"fio-3.33","jobs":[{"jobname":"baseline","error":0,"job_runtime":2000,
"read":{"io_bytes":307200000,"bw_bytes":153600000,"iops":37500.0,"total_ios":75000,
  "clat_ns":{"mean":20000.0,"percentile":{"50.000000":18000,"99.000000":60000,"99.900000":120000}},
  "lat_ns":{"mean":21000.0}},
"write":{"io_bytes":102400000,"bw_bytes":51200000,"iops":12500.0,"total_ios":25000,
  "clat_ns":{"mean":30000.0,"percentile":{"50.000000":25000,"99.000000":90000,"99.900000":100000}},
  "lat_ns":{"mean":31000.0}},
"usr_cpu":20.0,"sys_cpu":30.0}]}"#;
        let r = parse_fio_json(text).unwrap();
        assert_eq!(r.iops, 50_000.0);
        assert_eq!(r.ios, 100_000);
        assert_eq!(r.bytes, 409_600_000);
        assert_eq!(r.lat_ns.p50, 18_000.0);
        assert_eq!(r.lat_ns.p99, 90_000.0);
        assert_eq!(r.lat_ns.p999, 120_000.0);
        assert!((r.lat_ns.mean - (21_000.0 * 0.75 + 31_000.0 * 0.25)).abs() < 1e-6);
        assert_eq!(r.runtime_s, 2.0);
        assert!(parse_fio_json("{}").is_err());
    }

    #[test]
    fn fio_really_runs_on_a_file() {
        let path = std::env::temp_dir().join(format!("bwlab-fio-unit-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let wl = Workload {
            name: "randread".into(),
            rw: "randread".into(),
            bs: 4096,
            iodepth: 4,
            numjobs: 1,
            rwmixread: None,
        };
        let r = run_fio(&path, &wl, 1, 1 << 20);
        let _ = std::fs::remove_file(&path);
        let r = r.unwrap();
        assert!(r.ios > 0 && r.iops > 0.0 && r.lat_ns.p50 > 0.0, "{r:?}");
        assert_eq!(r.bytes, r.ios * 4096);
    }
}
