//! A run across machines: opening each ssh host (its master connection,
//! what interrupted runs left there swept, the lab's binary brought) and the
//! preflight that checks every host before anything starts, one line per
//! problem.

use crate::cleanup::{registry, Resource};
use crate::hosts::host::Host;
use crate::plan::Plan;
use crate::hosts::ssh::SshHost;
use crate::subjects::Subject;
use crate::network::topology::Remote;
use std::path::Path;

/// What the command line says about hosts.
#[derive(Debug, Clone, Default)]
pub struct HostChoices {
    pub target_host: Option<String>,
    pub client_host: Option<String>,
    pub data_addr: Option<std::net::Ipv4Addr>,
    pub ssh_options: Vec<(String, String)>,
    pub allow_nic_changes: bool,
    pub mtu: Option<Vec<u32>>,
    /// `--clients` (None: blockwire's and every kernel one the client host has).
    pub clients: Option<Vec<crate::subjects::clients::ClientChoice>>,
}

/// Which side of the run a host is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Target,
    Client,
}

/// A program the run needs on a host, its package, and what lacks without it
/// (None: the run cannot go on).
struct Need {
    program: &'static str,
    package: &'static str,
    disables: Option<String>,
}

/// What the plan needs on a host of `role`.
fn needs(plan: &Plan, role: Role) -> Vec<Need> {
    let base = |program, package| Need { program, package, disables: None };
    let mut v = vec![base("ip", "iproute2"), base("flock", "util-linux"), base("sha256sum", "coreutils"), base("getconf", "libc-bin")];
    if plan.net_runs > 0 {
        v.push(base("iperf3", "iperf3"));
    }
    if plan.links.iter().any(|l| l.bits_per_s.is_some()) {
        v.push(base("tc", "iproute2"));
    }
    if !plan.params.offloads.is_empty() {
        v.push(base("ethtool", "ethtool"));
    }
    if let (Role::Client, Some(fs)) = (role, &plan.fs) {
        // The fs suite's workloads and file systems run on the client host.
        v.extend([base("fio", "fio"), base("mount", "mount")]);
        for &(kind, fsync) in &plan.fs_combinations {
            let package = match kind.mkfs_type() {
                "ext4" => "e2fsprogs",
                "xfs" => "xfsprogs",
                _ => "btrfs-progs",
            };
            v.push(base(kind.mkfs_program(), package));
            if let Some(w) = fsync.wrapper() {
                v.push(base(w, "eatmydata"));
            }
        }
        for (w, program) in [("postmark", "postmark"), ("bonnie", "bonnie++")] {
            if fs.workloads.iter().any(|x| x == w) {
                v.push(base(program, program));
            }
        }
    }
    if role == Role::Target {
        for &peer in &plan.peers {
            for t in peer.target().tools() {
                v.push(Need { program: t.program, package: t.package, disables: Some(Subject::Peer(peer).key().to_string()) });
            }
        }
    }
    v
}

/// The facts the preflight reads on a host, in one round trip.
struct Probed {
    /// Which of the programs asked for are missing.
    missing: Vec<String>,
    uid: u32,
    /// Free KiB in /dev/shm.
    shm_kib: u64,
    /// /dev/fuse is there (blockwire's file systems mount through FUSE).
    fuse: bool,
    /// A memory cgroup controller (v1 or v2) is there.
    memory_cgroup: bool,
}

fn probe(h: &SshHost, programs: &[&str]) -> anyhow::Result<Probed> {
    let list: Vec<String> = programs.iter().map(|p| crate::hosts::ssh::quote(p)).collect();
    let line = format!(
        "PATH=$PATH:/usr/sbin:/sbin; for p in {}; do command -v \"$p\" >/dev/null || echo \"missing $p\"; done; echo \"uid $(id -u)\"; echo \"shm $(df -Pk /dev/shm | awk 'NR==2{{print $4}}')\"; \
         [ -e /dev/fuse ] && echo fuse; {{ [ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ] || grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; }} && echo memcg; true",
        list.join(" ")
    );
    let out = h.run_line(&line)?;
    let mut p = Probed { missing: vec![], uid: u32::MAX, shm_kib: 0, fuse: false, memory_cgroup: false };
    for l in out.lines() {
        match l.split_once(' ') {
            Some(("missing", m)) => p.missing.push(m.to_string()),
            Some(("uid", u)) => p.uid = u.trim().parse().unwrap_or(u32::MAX),
            Some(("shm", k)) => p.shm_kib = k.trim().parse().unwrap_or(0),
            _ => match l.trim() {
                "fuse" => p.fuse = true,
                "memcg" => p.memory_cgroup = true,
                _ => {}
            },
        }
    }
    Ok(p)
}

/// Check one host: fatal problems and notes (subjects it disables).
fn preflight(h: &SshHost, role: Role, plan: &Plan) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let needs = needs(plan, role);
    let programs: Vec<&str> = needs.iter().map(|n| n.program).collect();
    let Probed { missing, uid, shm_kib, fuse, memory_cgroup } = probe(h, &programs)?;
    let (mut fatal, mut notes) = (vec![], vec![]);
    let at = h.url();
    if uid != 0 {
        fatal.push(format!("{at}: not root (uid {uid}): the lab runs targets, AoE raw sockets and mounts there as root"));
    }
    for n in needs.iter().filter(|n| missing.iter().any(|m| m == n.program)) {
        match &n.disables {
            None => fatal.push(format!("{at}: {} is not installed (package {})", n.program, n.package)),
            Some(s) => notes.push(format!("{at}: {} is not installed (package {}): {s} will be unavailable", n.program, n.package)),
        }
    }
    if role == Role::Client && plan.fs.is_some() {
        if !memory_cgroup {
            fatal.push(format!("{at}: no memory cgroup controller under /sys/fs/cgroup: the fs suite limits the client's memory with one"));
        }
        if !fuse {
            notes.push(format!("{at}: /dev/fuse is missing (modprobe fuse): blockwire's own client cannot mount there, its fs cases will fail"));
        }
    }
    if role == Role::Target && shm_kib < plan.params.size_bytes >> 10 {
        fatal.push(format!("{at}: /dev/shm has {} MiB free, the volume needs {} MiB", shm_kib >> 10, plan.params.size_bytes >> 20));
    }
    Ok((fatal, notes))
}

/// What the plan may not do between real hosts (and the local baseline,
/// which measures this machine's tmpfs, is left out).
pub fn adapt_plan(plan: &mut Plan, allow_nic_changes: bool) -> Vec<String> {
    let mut fatal = vec![];
    plan.baseline = false;
    if plan.links.iter().any(|l| l.bits_per_s.is_some()) && !allow_nic_changes {
        fatal.push("--link shapes a NIC's qdiscs: between real hosts the lab leaves them alone unless --allow-nic-changes (or use --link none)".to_string());
    }
    // auto (the default) leaves real hosts' algorithms alone: between real
    // hosts the congestion control is part of what the user deploys (the
    // report records each host's); in one box it is the lab's choice.
    if let bw_net::tcp::Congestion::Named(_) = plan.tcp_congestion {
        fatal.push("--tcp-congestion is a host-wide setting: between real hosts set it yourself (the report records each host's)".to_string());
    }
    plan.params.tcp_congestion.clear();
    fatal
}

/// Open the hosts the command line names: each one's master connection,
/// its leftovers from interrupted runs swept, its preflight, the lab's
/// binary. Everything made is tracked (the run's cleanup undoes it).
/// With the hosts come the clients the subjects are measured with
/// (`--clients`, narrowed to what the client host has).
pub fn open(c: &HostChoices, plan: &Plan, exe: &Path) -> anyhow::Result<(Remote, Vec<crate::subjects::clients::ClientKind>)> {
    let target_url = c.target_host.as_deref().ok_or_else(|| anyhow::anyhow!("no --target-host"))?;
    let mtu = match c.mtu.as_deref() {
        None => None,
        Some([m]) => Some(*m),
        Some(_) => anyhow::bail!("a run between hosts measures one MTU (--mtu N; default: the NICs' own)"),
    };
    let mut hosts = vec![(Role::Target, SshHost::new(target_url, &c.ssh_options, exe)?)];
    if let Some(u) = &c.client_host {
        hosts.push((Role::Client, SshHost::new(u, &c.ssh_options, exe)?));
    }
    let (mut fatal, mut notes) = (vec![], vec![]);
    let mut opened = vec![];
    for (role, h) in &hosts {
        if let Err(e) = h.open_master() {
            fatal.push(format!("{e:#}"));
            continue;
        }
        match h.sweep_stale() {
            Ok(swept) => {
                for s in swept {
                    crate::cleanup::say(&format!("lab: {}", s.message(&h.url())));
                }
            }
            Err(e) => fatal.push(format!("{}: cannot check for an interrupted run's leftovers: {e:#}", h.url())),
        }
        registry().create(Resource::owned(crate::hosts::ssh::RunOnHost(h.clone())), || Ok(()))?;
        match preflight(h, *role, plan) {
            Ok((f, n)) => {
                fatal.extend(f);
                notes.extend(n);
            }
            Err(e) => fatal.push(format!("{}: {e:#}", h.url())),
        }
        opened.push(h);
    }
    let client_host = match hosts.iter().find(|(r, _)| *r == Role::Client) {
        Some((_, h)) => Host::Ssh(h.clone()),
        None => Host::Local,
    };
    let mut clients = vec![];
    if fatal.is_empty() {
        match choose_clients(&client_host, c.clients.as_deref(), &plan.subjects()) {
            Ok((k, n)) => {
                clients = k;
                notes.extend(n);
            }
            Err(e) => fatal.push(format!("{e:#}")),
        }
    }
    for n in &notes {
        eprintln!("lab: preflight: {n}");
    }
    if !fatal.is_empty() {
        anyhow::bail!("preflight found problems:\n  {}", fatal.join("\n  "));
    }
    for h in opened {
        h.deploy(exe)?;
    }
    let mut it = hosts.into_iter().map(|(_, h)| Host::Ssh(h));
    let target = it.next().expect("a target host");
    let client = it.next().unwrap_or(Host::Local);
    Ok((Remote { target, client, data_addr: c.data_addr, allow_nic_changes: c.allow_nic_changes, mtu }, clients))
}

/// The clients of the run: blockwire's unless `--clients` leaves it out,
/// and the kernel initiators the client host has (all it has by default on
/// a `--client-host`; on the lab's own machine, whose kernel state they
/// change (modules, iscsid, sessions), only when asked for; asked for and
/// none there is a problem). Also notes on what it lacks.
fn choose_clients(
    host: &Host,
    chosen: Option<&[crate::subjects::clients::ClientChoice]>,
    subjects: &[Subject],
) -> anyhow::Result<(Vec<crate::subjects::clients::ClientKind>, Vec<String>)> {
    use crate::subjects::clients::{ClientChoice, ClientKind};
    let mut kinds = vec![];
    if chosen.is_none_or(|v| v.contains(&ClientChoice::Blockwire)) {
        kinds.push(ClientKind::Blockwire);
    }
    let mut notes = vec![];
    let kernel_by_default = !host.on_this_machine();
    if chosen.map_or(kernel_by_default, |v| v.contains(&ClientChoice::Kernel)) {
        // Only the protocols some subject of the run speaks.
        let used = |p| subjects.iter().any(|s| s.address().block_protocol() == Some(p));
        let protocols: Vec<_> = crate::subjects::clients::KERNEL.iter().map(|k| k.protocol).filter(|&p| used(p)).collect();
        let (have, lack) = crate::subjects::clients::detect(host, &protocols)?;
        kinds.extend(have.into_iter().filter(|p| used(*p)).map(ClientKind::Kernel));
        notes.extend(lack);
        // The kernel NFS client, on the peers serving files.
        if let Some(s) = subjects.iter().find(|s| s.address().serves_files()) {
            if crate::subjects::kernel_nfs::available(host) {
                kinds.extend(crate::subjects::kernel_nfs::VERSIONS.map(ClientKind::KernelNfs));
            } else {
                notes.push(format!("{}: mount.nfs or the nfs module is missing: the kernel NFS client will not measure {} (package nfs-common)", host.name(), s.target_name()));
            }
        }
        if chosen.is_some() && !kinds.iter().any(|k| k.is_kernel()) {
            anyhow::bail!("--clients kernel: the client host has no kernel client for this run's subjects ({})", notes.join("; "));
        }
    }
    Ok((kinds, notes))
}

/// Which of the AoE targets `wanted` (shelf, slot) answer a config query
/// broadcast from `iface` on the client host (`blockwire aoe discover`, the
/// lab's own binary there). AoE is Ethernet frames: the query reaches a
/// target only when the two hosts share a layer-2 segment, whatever the IP
/// route says (proxy ARP, a bridge, a router without a gateway entry).
/// Answers are awaited `wait_s` seconds. Also what the query printed on
/// stderr, for the message.
pub fn aoe_answers(client: &Host, exe: &Path, iface: &str, wanted: &[(u16, u8)], wait_s: u32) -> anyhow::Result<(Vec<(u16, u8)>, String)> {
    let exe = client.lab_exe(exe);
    let out = client
        .command_with(&exe.to_string_lossy(), &["aoe", "discover", iface, "--wait", &wait_s.to_string()])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run an AoE query on {}: {e}", client.name()))?;
    // `discover` fails when nothing answers: what it printed still counts.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let text = client.program_output(&stdout)?;
    let answered = wanted.iter().copied().filter(|&a| answered_by(text, a)).collect();
    Ok((answered, crate::command::last_lines(&String::from_utf8_lossy(&out.stderr), 1)))
}

/// Whether `blockwire aoe discover` output lists shelf.slot `a`.
fn answered_by(discover: &str, (shelf, slot): (u16, u8)) -> bool {
    let name = format!("e{shelf}.{slot}");
    discover.lines().any(|l| l.split_whitespace().next() == Some(name.as_str()))
}

/// Prints `key=value` facts about a host and its interface `$1`.
const HOST_FACTS: &str = r#"d="$1"; PATH=$PATH:/usr/sbin:/sbin
echo "cpu_model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "cpus=$(grep -c ^processor /proc/cpuinfo)"
echo "kernel=$(uname -r)"
grep -qw hypervisor /proc/cpuinfo && echo emulated=1
echo "tcp=$(cat /proc/sys/net/ipv4/tcp_congestion_control)"
echo "mtu=$(ip -o link show dev "$d" | sed -n 's/.* mtu \([0-9]*\).*/\1/p')"
echo "speed=$(ethtool "$d" 2>/dev/null | sed -n 's/^[[:space:]]*Speed: \([0-9]*\)Mb\/s/\1/p')"
echo "driver=$(ethtool -i "$d" 2>/dev/null | sed -n 's/^driver: //p')""#;

/// The [`HOST_FACTS`] output as a host record.
pub fn parse_host_facts(text: &str, role: &str, address: &str, nic: &str) -> bw_lab_results::HostInfo {
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
            .unwrap_or("")
            .trim()
            .to_string()
    };
    bw_lab_results::HostInfo {
        role: role.into(),
        address: address.into(),
        cpu_model: get("cpu_model"),
        cpus: get("cpus").parse().unwrap_or(0),
        kernel: get("kernel"),
        nic: nic.into(),
        nic_driver: get("driver"),
        link_speed_mbps: get("speed").parse().ok(),
        mtu: get("mtu").parse().unwrap_or(0),
        tcp_congestion: get("tcp"),
        emulated: get("emulated") == "1",
    }
}

/// What the report says about `host` (its `nic` on the storage network).
pub fn host_info(host: &Host, role: &str, nic: &str) -> anyhow::Result<bw_lab_results::HostInfo> {
    let out = host.run("sh", &["-c", HOST_FACTS, "sh", nic])?;
    Ok(parse_host_facts(&out, role, &host.address(), nic))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Between real hosts, `auto` (which would run cubic in one box under a
    /// BBR default) sets nothing, and a named algorithm is refused.
    #[test]
    fn real_hosts_keep_their_congestion_control() {
        let plan = |cc: Option<&str>| {
            Plan::from_choices(&crate::plan::Choices {
                tcp_congestion: cc.map(String::from),
                mem_total: 24 << 30,
                cgroup: "v1".into(),
                system_congestion: "bbr".into(),
                available_congestion: "reno bbr cubic".into(),
                ..Default::default()
            })
            .unwrap()
        };
        let mut auto = plan(None);
        assert_eq!(auto.params.tcp_congestion, "cubic", "in one box");
        assert!(adapt_plan(&mut auto, false).is_empty());
        assert_eq!(auto.params.tcp_congestion, "", "the hosts keep theirs");
        let mut named = plan(Some("cubic"));
        assert_eq!(adapt_plan(&mut named, false).len(), 1, "a named algorithm is a host-wide change");
        assert!(adapt_plan(&mut plan(Some("system")), false).is_empty());
    }

    #[test]
    fn aoe_answers_are_read_from_discover() {
        let out = "e1.0  aoe://eth1/1.0  mac 02:00:00:00:00:01  size 16.0 MiB (16777216 bytes)  buffers 16  sectors/frame 2  config \"\"\n";
        assert!(answered_by(out, (1, 0)));
        assert!(!answered_by(out, (2, 0)));
        assert!(!answered_by("e11.0  aoe://eth1/11.0\n", (1, 0)));
        assert_eq!(Subject::Peer(crate::subjects::PeerKind::Vblade).address().aoe(), Some(crate::subjects::vblade::AOE_ADDRESS));
        assert_eq!(Subject::Peer(crate::subjects::PeerKind::Tgt).address().aoe(), None);
    }

    #[test]
    fn host_facts_of_this_machine() {
        let out = std::process::Command::new("sh").args(["-c", HOST_FACTS, "sh", "lo"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let h = parse_host_facts(&text, "client", "this machine", "lo");
        assert!(h.cpus > 0 && !h.kernel.is_empty() && h.mtu > 0, "{h:?} from {text}");
        assert_eq!(h.link_speed_mbps, None, "lo has no speed");
        let vm = parse_host_facts("cpus=2\nemulated=1\nspeed=10000\ndriver=virtio_net\nmtu=9000\n", "target", "ssh://x", "eth0");
        assert!(vm.emulated);
        assert_eq!((vm.link_speed_mbps, vm.nic_driver.as_str(), vm.mtu), (Some(10000), "virtio_net", 9000));
    }
}
