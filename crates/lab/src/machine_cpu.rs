//! Whole-machine CPU over a run, per machine the lab's hosts run on, from
//! /proc/stat deltas (user, nice, system, irq, softirq, steal; all CPUs),
//! net of the machine's idle busy rate measured before the runs.
//!
//! The per-process figures (a target's utime + stime, the initiator's
//! rusage) miss work: the kernel charges softirq time (the network stack's
//! receive path, much of TCP) by tick to whichever task happens to run, so
//! it lands on the lab, on other processes, or on idle. The whole-machine
//! figure is the honest one for "CPU per unit of throughput".

use crate::host::{Host, MachineTicks};
use crate::results::MachineCpu;
use std::time::{Duration, Instant};

/// How long the idle baseline is measured, per machine.
pub const IDLE_WINDOW: Duration = Duration::from_secs(1);

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
            m.idle_rate = m.host.idle_busy_rate(IDLE_WINDOW)?;
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
