//! Where the CPU of a routed run goes, from /proc.
//!
//! A userspace router is a process: its CPU is its utime + stime. The BPF
//! datapath has no thread of its own: its programs run in softirq context on
//! whatever CPU the frame arrived, usually inside the sending process's
//! `local_bh_enable` (veth delivers through the per-CPU backlog), sometimes
//! in ksoftirqd. This kernel has no IRQ time accounting
//! (`CONFIG_IRQ_TIME_ACCOUNTING` unset), so softirq time is charged, tick by
//! tick, as system time of the task it interrupted. So, per run:
//!
//! - `client_s`, `target_s`: CPU of the initiator (getrusage of the reaped
//!   child) and of `blockwire serve` (/proc/PID/stat), which include the
//!   softirq work done in their context: the kernel's forwarding of their own
//!   frames through every hop, for the BPF path;
//! - `routers_s`: the router processes (0 for BPF: they only hold the links);
//! - `bpf_s`: the BPF programs' own run time (`run_time_ns` of every program
//!   fd a router holds, /proc/PID/fdinfo, with BPF_ENABLE_STATS on); exact,
//!   but only the programs, not the veth hops around them;
//! - `ksoftirqd_s`: the per-CPU softirq threads (machine-wide: other work's
//!   softirqs count too);
//! - `softirq_s`, `busy_s`: /proc/stat softirq and non-idle time over all
//!   CPUs (machine-wide; for context on a shared machine).
//!
//! The forwarding cost of a path is then the total of the first four per
//! MiB moved, minus the same total over the direct path in the same round.

pub use bw_lab_results::route::CpuAccount;


/// utime + stime of a process, in seconds.
pub fn process_cpu_s(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    crate::hosts::proc::parse_stat_cpu_ticks(&s).map(|t| t as f64 / crate::hosts::proc::clk_tck())
}

/// CPU of reaped children so far (getrusage RUSAGE_CHILDREN), in seconds.
pub fn children_cpu_s() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Sum of `run_time_ns` over the BPF program fds `pid` holds, in seconds
/// (each program once, whatever number of fds point at it).
pub fn bpf_run_time_s(pid: u32) -> f64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0.0;
    };
    let mut seen = std::collections::BTreeMap::new();
    for e in dir.flatten() {
        if let Ok(text) = std::fs::read_to_string(e.path()) {
            if let Some((id, ns)) = parse_prog_fdinfo(&text) {
                seen.insert(id, ns);
            }
        }
    }
    seen.values().sum::<u64>() as f64 / 1e9
}

/// (prog_id, run_time_ns) of a BPF program fd's fdinfo; `None` for other fds
/// (links name a prog_id too, but carry no run time).
pub fn parse_prog_fdinfo(text: &str) -> Option<(u64, u64)> {
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok())
    };
    Some((field("prog_id:")?, field("run_time_ns:")?))
}

/// PIDs of the ksoftirqd threads.
pub fn ksoftirqd_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.starts_with("ksoftirqd/"))
                .unwrap_or(false)
        })
        .collect()
}

/// (softirq seconds, busy seconds) over all CPUs from /proc/stat.
pub fn machine_softirq_busy_s() -> (f64, f64) {
    crate::hosts::proc::CpuTicks::here()
        .map(|c| (c.softirq as f64 / crate::hosts::proc::clk_tck(), c.busy() as f64 / crate::hosts::proc::clk_tck()))
        .unwrap_or((0.0, 0.0))
}

/// A snapshot of every counter a [`CpuAccount`] is the difference of.
#[derive(Debug, Clone, Default)]
pub struct CpuSnapshot {
    children: f64,
    target: f64,
    routers: Vec<f64>,
    bpf: Vec<f64>,
    ksoftirqd: f64,
    softirq: f64,
    busy: f64,
}

impl CpuSnapshot {
    pub fn take(target_pid: Option<u32>, router_pids: &[u32], ksoftirqd: &[u32]) -> CpuSnapshot {
        let (softirq, busy) = machine_softirq_busy_s();
        CpuSnapshot {
            children: children_cpu_s(),
            target: target_pid.and_then(process_cpu_s).unwrap_or(0.0),
            routers: router_pids
                .iter()
                .map(|&p| process_cpu_s(p).unwrap_or(0.0))
                .collect(),
            bpf: router_pids.iter().map(|&p| bpf_run_time_s(p)).collect(),
            ksoftirqd: ksoftirqd.iter().filter_map(|&p| process_cpu_s(p)).sum(),
            softirq,
            busy,
        }
    }

    /// Per-router (process CPU, BPF program time) and the whole account.
    pub fn since(&self, before: &CpuSnapshot) -> (Vec<(f64, f64)>, CpuAccount) {
        // Counters never go back; a vanished process reads as 0, not negative.
        let d = |a: f64, b: f64| if a > b { a - b } else { 0.0 };
        let per: Vec<(f64, f64)> = (0..self.routers.len().min(before.routers.len()))
            .map(|i| {
                (
                    d(self.routers[i], before.routers[i]),
                    d(self.bpf[i], before.bpf[i]),
                )
            })
            .collect();
        let acc = CpuAccount {
            client_s: d(self.children, before.children),
            target_s: d(self.target, before.target),
            routers_s: per.iter().map(|x| x.0).sum(),
            bpf_s: per.iter().map(|x| x.1).sum(),
            ksoftirqd_s: d(self.ksoftirqd, before.ksoftirqd),
            softirq_s: d(self.softirq, before.softirq),
            busy_s: d(self.busy, before.busy),
        };
        (per, acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdinfo_of_programs_and_links() {
        // Recorded from /proc/PID/fdinfo of a router (Linux 6.18).
        let prog = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2072\nprog_type:\t3\nprog_jited:\t1\nprog_tag:\t5f3f5ba2b8cd1e4d\nmemlock:\t8192\nprog_id:\t97\nrun_time_ns:\t123456\nrun_cnt:\t42\nrecursion_misses:\t0\nverified_insns:\t812\n";
        assert_eq!(parse_prog_fdinfo(prog), Some((97, 123456)));
        let link = "pos:\t0\nflags:\t02000000\nlink_type:\ttcx\nlink_id:\t12\nprog_tag:\t5f3f5ba2b8cd1e4d\nprog_id:\t97\nifindex:\t4\nattach_type:\t46\n";
        assert_eq!(parse_prog_fdinfo(link), None);
    }

    #[test]
    fn proc_stat_softirq_and_busy() {
        let t = "cpu  148982 64 40150 160457 4402 0 4683 13266 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        let c = crate::hosts::proc::CpuTicks::parse(t).unwrap();
        assert_eq!((c.softirq, c.busy()), (4683, 148982 + 64 + 40150 + 4683 + 13266));
    }
}
