//! Facts from /proc: CPU time of a process, whole-machine busy share (to wait
//! for idle before each run), and what machine and software the run used.

use bw_lab_results::MachineInfo;
use std::time::{Duration, Instant};

/// This machine's clock ticks per second (`/proc/PID/stat`'s unit).
pub fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// utime + stime (fields 14 and 15) of a /proc/PID/stat line, in ticks.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may contain spaces and parentheses: split
    // after the last ')'. Fields after it start at field 3 (state).
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// CPU seconds (user + system, all threads) used so far by a live process.
pub fn process_cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| anyhow::anyhow!("process {pid} is gone: {e}"))?;
    let ticks = parse_stat_cpu_ticks(&s).ok_or_else(|| anyhow::anyhow!("cannot parse /proc/{pid}/stat"))?;
    Ok(ticks as f64 / clk_tck())
}

/// The aggregate `cpu` line of /proc/stat (all CPUs), in USER_HZ ticks:
/// the one reader of it (machine, client host, routed-path suite). Guest
/// time is already inside user and nice, so it is not counted again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTicks {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
}

impl CpuTicks {
    /// The `cpu ` line of `text` (/proc/stat, or output holding it); None
    /// without one of its first eight counters (every kernel since 2.6.11
    /// has them).
    pub fn parse(text: &str) -> Option<CpuTicks> {
        let line = text.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line.split_whitespace().skip(1).map_while(|x| x.parse().ok()).collect();
        let [user, nice, system, idle, iowait, irq, softirq, steal] = *v.get(..8)? else {
            return None;
        };
        Some(CpuTicks { user, nice, system, idle, iowait, irq, softirq, steal })
    }

    /// This machine's.
    pub fn here() -> Option<CpuTicks> {
        CpuTicks::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Not idle: user, nice, system, irq, softirq and steal.
    pub fn busy(&self) -> u64 {
        self.user + self.nice + self.system + self.irq + self.softirq + self.steal
    }

    /// Busy, idle and iowait.
    pub fn total(&self) -> u64 {
        self.busy() + self.idle + self.iowait
    }
}

fn proc_stat_totals() -> Option<(u64, u64)> {
    CpuTicks::here().map(|c| (c.busy(), c.total()))
}

/// Busy share of all CPUs (0..1) over `window`.
pub fn busy_share(window: Duration) -> f64 {
    let a = proc_stat_totals();
    std::thread::sleep(window);
    let b = proc_stat_totals();
    match (a, b) {
        (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => (b1 - b0) as f64 / (t1 - t0) as f64,
        _ => 0.0,
    }
}

/// Wait until the machine's busy share over a 150 ms window drops below
/// `threshold`, at most `max_wait`. Returns (last busy share, seconds waited).
/// Bounded on purpose: on a shared machine "idle" may never come, and the
/// busy share is recorded with each sample so noisy runs are visible.
pub fn wait_idle(threshold: f64, max_wait: Duration) -> (f64, f64) {
    let start = Instant::now();
    loop {
        // 150 ms: 30 scheduler ticks on 2 CPUs, fine enough for a 25% threshold.
        let b = busy_share(Duration::from_millis(150));
        if b < threshold || start.elapsed() >= max_wait || crate::cleanup::interrupted() {
            return (b, start.elapsed().as_secs_f64());
        }
    }
}

pub fn machine_info() -> MachineInfo {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let mem_total_bytes = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
        })
        .map(|kib| kib * 1024)
        .unwrap_or(0);
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    let tcp_congestion = bw_net::tcp::system_default().unwrap_or_default();
    MachineInfo { cpu_model, cpus, kernel, mem_total_bytes, hostname, tcp_congestion }
}



#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_fields_even_with_odd_names() {
        // Recorded /proc/PID/stat of a process whose name has spaces and ')'.
        let line = "4242 (tgtd (x) y) S 1 4242 4242 0 -1 4194560 3051 0 0 0 157 42 0 0 20 0 3 0 12345 123456789 1000 18446744073709551615 0 0 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat_cpu_ticks(line), Some(199));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn own_cpu_time_is_readable() {
        let s = process_cpu_seconds(std::process::id()).unwrap();
        assert!(s >= 0.0);
        assert!(process_cpu_seconds(u32::MAX - 1).is_err());
    }

    #[test]
    fn proc_stat_busy_totals() {
        let text = "cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 50 2 25 400 10 1 1 0 0 0\nintr 1\n";
        // busy = 100+5+50+3+2+0 = 160, total = 980.
        let c = CpuTicks::parse(text).unwrap();
        assert_eq!((c.busy(), c.total()), (160, 980));
        assert_eq!(CpuTicks::parse("intr 1"), None);
        assert_eq!(CpuTicks::parse("cpu 1 2 3\n"), None);
        let b = busy_share(Duration::from_millis(50));
        assert!((0.0..=1.0).contains(&b));
    }
}
