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
}
