//! Whole-machine CPU over a run, per machine the lab's hosts run on, from
//! /proc/stat deltas (user, nice, system, irq, softirq, steal; all CPUs),
//! net of the machine's idle busy rate measured before the runs.
//!
//! The per-process figures (a target's utime + stime, the initiator's
//! rusage) miss work: the kernel charges softirq time (the network stack's
//! receive path, much of TCP) by tick to whichever task happens to run, so
//! it lands on the lab, on other processes, or on idle. The whole-machine
//! figure is the honest one for "CPU per unit of throughput".

use crate::hosts::host::{Host, MachineTicks};
use bw_lab_results::MachineCpu;
use std::time::{Duration, Instant};

/// The idle baseline is the least busy of [`IDLE_WINDOWS`] windows this
/// long, per machine: a neighbour's burst during one window (a build step,
/// a package install) would otherwise be subtracted from every run of the
/// setting, down to zero. 200 ms at HZ=250 is 50 ticks per CPU.
pub const IDLE_WINDOW: Duration = Duration::from_millis(200);
pub const IDLE_WINDOWS: usize = 5;

/// A baseline above this share of one CPU means the machine was not idle:
/// said in the log, since its whole-machine figures carry the noise.
pub const BUSY_BASELINE: f64 = 0.10;

/// One machine: the lab hosts on it, the one read through, its idle rate.
#[derive(Debug, Clone)]
struct Machine {
    host: Host,
    hosts: Vec<String>,
    idle_rate: f64,
}

/// Reads the machines of a set of hosts around each run.
#[derive(Debug, Clone, Default)]
pub struct MachineMeter {
    machines: Vec<Machine>,
}

/// Counters at a run's start.
pub struct Started {
    at: Instant,
    ticks: Vec<MachineTicks>,
}

impl MachineMeter {
    /// Group `hosts` by machine (boot id) and measure each machine's busy
    /// rate over [`IDLE_WINDOW`] while the lab runs nothing on it.
    pub fn new(hosts: &[&Host]) -> anyhow::Result<MachineMeter> {
        let mut by_boot: Vec<(String, Machine)> = vec![];
        for h in hosts {
            let id = h.machine_ticks()?.boot_id;
            match by_boot.iter_mut().find(|(b, _)| *b == id) {
                Some((_, m)) => m.hosts.push(h.name().to_string()),
                None => by_boot.push((id, Machine { host: (*h).clone(), hosts: vec![h.name().to_string()], idle_rate: 0.0 })),
            }
        }
        for (_, m) in &mut by_boot {
            let mut rates = vec![];
            for _ in 0..IDLE_WINDOWS {
                rates.push(m.host.idle_busy_rate(IDLE_WINDOW)?);
            }
            m.idle_rate = least(&rates);
            if m.idle_rate > BUSY_BASELINE {
                eprintln!(
                    "lab: {} is busy while the lab runs nothing there ({:.0}% of a CPU at the least over {IDLE_WINDOWS} windows): its whole-machine CPU figures carry that noise",
                    m.hosts.join(", "),
                    m.idle_rate * 100.0
                );
            }
        }
        Ok(MachineMeter { machines: by_boot.into_iter().map(|(_, m)| m).collect() })
    }

    pub fn start(&self) -> anyhow::Result<Started> {
        let ticks = self.machines.iter().map(|m| m.host.machine_ticks()).collect::<anyhow::Result<_>>()?;
        Ok(Started { at: Instant::now(), ticks })
    }

    pub fn finish(&self, started: Started) -> anyhow::Result<Vec<MachineCpu>> {
        let secs = started.at.elapsed().as_secs_f64();
        self.machines
            .iter()
            .zip(started.ticks)
            .map(|(m, t0)| {
                let t1 = m.host.machine_ticks()?;
                anyhow::ensure!(t1.boot_id == t0.boot_id, "{} rebooted during the run", m.host.name());
                Ok(MachineCpu { hosts: m.hosts.clone(), busy_s: t1.busy_s_since(&t0), idle_s: m.idle_rate * secs })
            })
            .collect()
    }
}

/// The smallest of `rates` (0 for none).
fn least(rates: &[f64]) -> f64 {
    rates.iter().copied().reduce(f64::min).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::least;

    #[test]
    fn the_baseline_is_the_quietest_window() {
        assert_eq!(least(&[0.9, 0.02, 0.5, 0.03, 0.8]), 0.02);
        assert_eq!(least(&[]), 0.0);
    }
}
