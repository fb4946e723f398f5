//! Where the lab's processes run. Every command, process, counter and link
//! setting goes through a [`Host`], so the lab does not care where a side
//! lives. Today the only kind is a network namespace on this machine; a host
//! reached over ssh is the next (a multi-machine lab).

use crate::results::WireCounters;
use std::process::Command;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A network namespace of this machine, by name (`ip netns`).
    LocalNamespace(String),
}

impl Host {
    /// Its name in messages and cleanup records (the namespace's name).
    pub fn name(&self) -> &str {
        match self {
            Host::LocalNamespace(ns) => ns,
        }
    }

    /// A command that runs `program` on the host. In a namespace, `ip netns
    /// exec` execs it, so the PID of the spawned child is the program's own
    /// PID (what CPU accounting and stopping by PID rely on).
    pub fn command(&self, program: &str) -> Command {
        match self {
            Host::LocalNamespace(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
        }
    }

    /// Like [`Host::command`], but sharing this process's mounts: `ip netns
    /// exec` gives the program a mount namespace of its own, so a file system
    /// it mounts would not be seen by the lab; nsenter enters only the network.
    pub fn command_sharing_mounts(&self, program: &std::path::Path) -> Command {
        match self {
            Host::LocalNamespace(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg(program);
                c
            }
        }
    }

    /// Run `program args` on the host; its stdout, or why it failed.
    pub fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .command(program)
            .args(args)
            .output()
            .map_err(|e| anyhow::anyhow!("cannot run {program} in {}: {e}", self.name()))?;
        if !out.status.success() {
            anyhow::bail!("`{program} {}` in {} failed: {}", args.join(" "), self.name(), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `ip ARGS` about this host's links (`ip -n NS` for a namespace).
    pub fn ip(&self, args: &[&str]) -> anyhow::Result<String> {
        match self {
            Host::LocalNamespace(ns) => sh("ip", &[&["-n", ns], args].concat()),
        }
    }

    pub fn set_mtu(&self, dev: &str, mtu: u32) -> anyhow::Result<()> {
        self.ip(&["link", "set", dev, "mtu", &mtu.to_string()]).map(|_| ())
    }

    /// `tc ARGS` on the host (link shapes: qdiscs).
    pub fn tc(&self, args: &[String]) -> anyhow::Result<()> {
        let out = self.command("tc").args(args).output()?;
        anyhow::ensure!(out.status.success(), "tc {} in {}: {}", args.join(" "), self.name(), String::from_utf8_lossy(&out.stderr).trim());
        Ok(())
    }

    /// Frame and byte counters of `dev` (both directions).
    pub fn nic_counters(&self, dev: &str) -> anyhow::Result<WireCounters> {
        let out = self.ip(&["-s", "-j", "link", "show", "dev", dev])?;
        parse_ip_stats_json(&out)
    }

    /// utime + stime of process `pid` on the host, in seconds (/proc).
    pub fn process_cpu_seconds(&self, pid: u32) -> anyhow::Result<f64> {
        match self {
            // A namespace shares this machine's /proc.
            Host::LocalNamespace(_) => crate::machine::process_cpu_seconds(pid),
        }
    }
}

/// Whole-machine CPU and NIC offloads, built only on [`Host::run`], so they
/// work on every kind of host.
impl Host {
    /// The CPU counters of the machine this host runs on, and which machine
    /// that is (its boot id: namespaces of one machine share its counters).
    pub fn machine_ticks(&self) -> anyhow::Result<MachineTicks> {
        let text = self.run("cat", &["/proc/sys/kernel/random/boot_id", "/proc/stat"])?;
        parse_machine_ticks(&text).ok_or_else(|| anyhow::anyhow!("cannot parse /proc/stat of {}", self.name()))
    }

    /// Busy CPU-seconds per second of the machine over `window`, measured
    /// while the lab runs nothing: the baseline a run's figure is net of.
    pub fn idle_busy_rate(&self, window: std::time::Duration) -> anyhow::Result<f64> {
        let a = self.machine_ticks()?;
        std::thread::sleep(window);
        let b = self.machine_ticks()?;
        Ok(b.busy_s_since(&a) / window.as_secs_f64())
    }

    /// The offload features of `dev` that [`Offload`] sets, as they are now.
    pub fn offloads(&self, dev: &str) -> anyhow::Result<Vec<(&'static str, bool)>> {
        let text = self.run("ethtool", &["-k", dev])?;
        let v = parse_ethtool_features(&text);
        anyhow::ensure!(v.len() == OFFLOAD_FEATURES.len(), "`ethtool -k {dev}` in {} lacks some of {OFFLOAD_FEATURES:?}: {v:?}", self.name());
        Ok(v)
    }

    /// Switch offload features of `dev` (`ethtool -K`).
    pub fn set_offloads(&self, dev: &str, features: &[(&str, bool)]) -> anyhow::Result<()> {
        let mut args = vec!["-K", dev];
        for (k, on) in features {
            args.extend([*k, if *on { "on" } else { "off" }]);
        }
        self.run("ethtool", &args).map(|_| ())
    }
}

/// USER_HZ, the unit of /proc/stat on every Linux architecture.
const USER_HZ: f64 = 100.0;

/// A machine's CPU counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineTicks {
    pub boot_id: String,
    /// user + nice + system + irq + softirq + steal, all CPUs, in USER_HZ ticks.
    pub busy: u64,
    /// Those plus idle and iowait.
    pub total: u64,
}

impl MachineTicks {
    /// Busy CPU-seconds from `earlier` to now.
    pub fn busy_s_since(&self, earlier: &MachineTicks) -> f64 {
        self.busy.saturating_sub(earlier.busy) as f64 / USER_HZ
    }
}

/// `cat /proc/sys/kernel/random/boot_id /proc/stat`: the boot id, then the
/// aggregate `cpu` line (guest time is already inside user and nice).
pub fn parse_machine_ticks(text: &str) -> Option<MachineTicks> {
    let boot_id = text.lines().next()?.trim().to_string();
    if boot_id.is_empty() || boot_id.starts_with("cpu") {
        return None;
    }
    let (busy, total) = crate::machine::parse_proc_stat_totals(text)?;
    Some(MachineTicks { boot_id, busy, total })
}

/// The features `--offload` sets: `ethtool -K` name, `ethtool -k` name.
pub const OFFLOAD_FEATURES: [(&str, &str); 6] = [
    ("tx", "tx-checksumming"),
    ("rx", "rx-checksumming"),
    ("sg", "scatter-gather"),
    ("tso", "tcp-segmentation-offload"),
    ("gso", "generic-segmentation-offload"),
    ("gro", "generic-receive-offload"),
];

/// The [`OFFLOAD_FEATURES`] in `ethtool -k` output, by their `-K` names,
/// in that order (a feature the output lacks is left out).
pub fn parse_ethtool_features(text: &str) -> Vec<(&'static str, bool)> {
    OFFLOAD_FEATURES
        .iter()
        .filter_map(|(short, long)| {
            let line = text.lines().find(|l| l.trim_start().strip_prefix(long).is_some_and(|r| r.starts_with(':')))?;
            let value = line.split_once(':')?.1.split_whitespace().next()?;
            Some((*short, value == "on"))
        })
        .collect()
}

/// Run a program on this machine, outside any namespace.
pub fn sh(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program).args(args).output().map_err(|e| anyhow::anyhow!("cannot run {program}: {e}"))?;
    if !out.status.success() {
        anyhow::bail!("`{program} {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `program` is installed on this machine (every local namespace
/// shares its file system).
pub fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
        || ["/usr/sbin", "/sbin", "/usr/bin"].iter().any(|d| std::path::Path::new(d).join(program).is_file())
}

/// The installed version of Debian package `package` on this machine.
pub fn package_version(package: &str) -> Option<String> {
    let out = Command::new("dpkg-query").args(["-W", "-f", "${Version}", package]).output().ok()?;
    if out.status.success() {
        Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        None
    }
}

/// Parse `ip -s -j link show dev IF` output (iproute2 JSON, `stats64`).
pub fn parse_ip_stats_json(text: &str) -> anyhow::Result<WireCounters> {
    let v: serde_json::Value = serde_json::from_str(text)?;
    let s = v
        .get(0)
        .and_then(|l| l.get("stats64").or_else(|| l.get("stats")))
        .ok_or_else(|| anyhow::anyhow!("no stats64 in `ip -s -j link` output"))?;
    let num = |dir: &str, k: &str| -> anyhow::Result<u64> {
        s.get(dir)
            .and_then(|d| d.get(k))
            .and_then(|x| x.as_u64())
            .ok_or_else(|| anyhow::anyhow!("`ip -s -j link` output lacks {dir}.{k}"))
    };
    Ok(WireCounters {
        rx_bytes: num("rx", "bytes")?,
        tx_bytes: num("tx", "bytes")?,
        rx_packets: num("rx", "packets")?,
        tx_packets: num("tx", "packets")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_iproute2_json_counters() {
        // Recorded from `ip -s -j link show dev X` (iproute2 6.1).
        let text = r#"[{"ifindex":5,"link_index":4,"ifname":"bwl1a","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"mtu":1500,"qdisc":"noqueue","operstate":"UP","linkmode":"DEFAULT","group":"default","txqlen":1000,"link_type":"ether","address":"aa:bb:cc:dd:ee:ff","broadcast":"ff:ff:ff:ff:ff:ff","link_netnsid":0,"stats64":{"rx":{"bytes":123456,"packets":321,"errors":0,"dropped":0,"over_errors":0,"multicast":0},"tx":{"bytes":6543,"packets":45,"errors":0,"dropped":0,"carrier_errors":0,"collisions":0}}}]"#;
        let c = parse_ip_stats_json(text).unwrap();
        assert_eq!(c, WireCounters { rx_bytes: 123456, tx_bytes: 6543, rx_packets: 321, tx_packets: 45 });
        assert!(parse_ip_stats_json("[]").is_err());
        assert!(parse_ip_stats_json("not json").is_err());
    }

    #[test]
    fn parses_machine_ticks() {
        let text = "0b5c6a1e-86a4-4c2d-9f57-3f1c2b1a9e01\ncpu  100 5 50 800 20 3 2 1 0 0\ncpu0 50 2 25 400 10 1 1 0 0 0\nintr 12345\n";
        let t = parse_machine_ticks(text).unwrap();
        // busy: user+nice+system+irq+softirq+steal; idle and iowait apart.
        assert_eq!(t, MachineTicks { boot_id: "0b5c6a1e-86a4-4c2d-9f57-3f1c2b1a9e01".into(), busy: 161, total: 981 });
        let later = MachineTicks { busy: 411, ..t.clone() };
        assert!((later.busy_s_since(&t) - 2.5).abs() < 1e-9);
        assert_eq!(t.busy_s_since(&later), 0.0, "counters never run backwards");
        assert!(parse_machine_ticks("cpu  1 2 3 4\n").is_none(), "no boot id");
        assert!(parse_machine_ticks("abc\nintr 1\n").is_none());
    }

    #[test]
    fn parses_ethtool_features() {
        // Recorded from `ethtool -k` on a veth (ethtool 6.1), abridged.
        let text = "Features for bwl1a:\nrx-checksumming: on\ntx-checksumming: on\n\ttx-checksum-ipv4: off [fixed]\nscatter-gather: on\n\ttx-scatter-gather: on\ntcp-segmentation-offload: off\ngeneric-segmentation-offload: off\ngeneric-receive-offload: off\nrx-gro-hw: off [fixed]\n";
        assert_eq!(
            parse_ethtool_features(text),
            vec![("tx", true), ("rx", true), ("sg", true), ("tso", false), ("gso", false), ("gro", false)]
        );
        assert!(parse_ethtool_features("Features for x:\n").is_empty());
    }
}
