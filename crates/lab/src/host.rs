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
        crate::topology::parse_ip_stats_json(&out)
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
