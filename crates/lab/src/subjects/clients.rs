//! The clients a subject is measured with: blockwire's own userspace
//! initiators (`blockwire bench` on a URL), or the client host's kernel
//! initiators (open-iscsi, nvme-tcp, the aoe driver), which make a block
//! device that fio drives with direct I/O, or its kernel NFS client on a
//! peer serving files (`crate::subjects::kernel_nfs`: fio on the export's image file). One row per kernel client in
//! [`KERNEL`]: its protocol, how to find it on a host, how to attach a
//! target and find the device, and how to undo that (also after an
//! interrupted run: the state file's `kernel` lines, see
//! `state_file::CLEANUP_SCRIPT`).

use crate::cleanup::{registry, Resource, Token};
use crate::hosts::host::{Host, ShellUndo};
use crate::subjects::kernel_nfs::NfsVersion;
use crate::subjects::{KernelAddress, Protocol, Subject};
use crate::network::topology::Link;
use bw_lab_results::SubjectKey;
use clap::ValueEnum;
use std::time::Duration;

/// A `--clients` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClientChoice {
    /// blockwire's userspace initiators.
    Blockwire,
    /// The client host's kernel initiators it has (iscsi_tcp, nvme-tcp, aoe).
    Kernel,
}

/// Which initiator measures a subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientKind {
    Blockwire,
    /// A kernel block initiator.
    Kernel(Protocol),
    /// The kernel NFS client, on a peer serving files.
    KernelNfs(NfsVersion),
}

/// A kernel initiator: what finds it on a host and what it is called.
pub struct KernelClient {
    pub protocol: Protocol,
    /// Its subject prefix: `kernel-iscsi`.
    pub name: &'static str,
    /// The initiator as the report names it.
    pub initiator: &'static str,
    /// A shell test that succeeds when the host has it (loads the module
    /// with `load`, see [`LOAD`]).
    probe: &'static str,
    /// What is missing when the probe fails.
    missing: &'static str,
}

pub const KERNEL: [KernelClient; 4] = [
    KernelClient {
        protocol: Protocol::Iscsi,
        name: "kernel-iscsi",
        initiator: "open-iscsi (kernel iscsi_tcp)",
        probe: "command -v iscsiadm && load iscsi_tcp",
        missing: "iscsiadm or the iscsi_tcp module (package open-iscsi)",
    },
    KernelClient {
        protocol: Protocol::Nvme,
        name: "kernel-nvme",
        initiator: "nvme-cli (kernel nvme-tcp)",
        probe: "command -v nvme && load nvme-tcp",
        missing: "nvme or the nvme-tcp module (package nvme-cli)",
    },
    KernelClient {
        protocol: Protocol::NvmeRdma,
        name: "kernel-nvme-rdma",
        initiator: "nvme-cli (kernel nvme-rdma)",
        probe: "command -v nvme && load nvme-rdma",
        missing: "nvme or the nvme-rdma module (package nvme-cli)",
    },
    KernelClient {
        protocol: Protocol::Aoe,
        name: "kernel-aoe",
        initiator: "the kernel aoe driver",
        probe: "load aoe && n=0; while [ ! -e /dev/etherd/discover ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n+1)); done; [ -e /dev/etherd/discover ]",
        missing: "the aoe module or /dev/etherd",
    },
];

impl ClientKind {
    fn kernel(p: Protocol) -> &'static KernelClient {
        KERNEL.iter().find(|k| k.protocol == p).expect("a kernel client per protocol")
    }

    /// The subject's key in results.json: `blockwire-iscsi` for blockwire's
    /// client (the target's key), `kernel-iscsi@tgt` for a kernel one.
    pub fn key(self, s: Subject) -> SubjectKey {
        match self {
            ClientKind::Blockwire => s.key(),
            ClientKind::Kernel(p) => SubjectKey::kernel(p.name(), s.target_name()),
            ClientKind::KernelNfs(v) => v.key(s.target_name()),
        }
    }

    /// Whether this client measures subject `s` (a kernel one: its
    /// protocol's; the NFS client: a peer serving files).
    pub fn serves(self, s: Subject) -> bool {
        match self {
            ClientKind::Blockwire => true,
            ClientKind::Kernel(p) => s.address().block_protocol() == Some(p),
            // (An external export is measured through blockwire's nfs://.)
            ClientKind::KernelNfs(_) => s.address().serves_files() && s.external().is_none(),
        }
    }

    /// Whether it is one of the client host's kernel clients (attached
    /// once per link; its CPU is the client machine's).
    pub fn is_kernel(self) -> bool {
        !matches!(self, ClientKind::Blockwire)
    }

    /// The initiator of subject `s` as the report's "Clients:" line names it.
    pub fn initiator(self, s: Subject, host: &Host) -> String {
        // In one box (namespaces) there is one client: no host to name.
        let on = host.on_name();
        match self {
            ClientKind::Blockwire if s.address().serves_files() => format!("{}{on}", s.initiator()),
            ClientKind::Blockwire if on.is_empty() => "blockwire".into(),
            ClientKind::Blockwire => format!("blockwire (userspace){on}"),
            ClientKind::Kernel(p) => format!("{} with fio{on}", Self::kernel(p).initiator),
            ClientKind::KernelNfs(v) => v.initiator(host),
        }
    }
}

/// `load MODULE` for the probes: a module not loaded yet is written to the
/// state file (`$state`) as `module NAME` before modprobe loads it, so the
/// lab's end (or the next run, after a killed one) unloads it again; one
/// loaded before (or built in) is left alone.
const LOAD: &str = r#"exec 3>&1
load() {
  [ -d "/sys/module/$(echo "$1" | tr - _)" ] && return 0
  echo "module $1" >> "$state"
  modprobe -q "$1" && echo "loaded $1" >&3
}
"#;

/// The kernel clients of `protocols` that `host` has (fio included, which
/// drives them), and a line for each one it lacks. One round trip. Modules it loads are
/// recorded in the host's state file; on the lab's own machine they are
/// also tracked to be unloaded at the end.
pub fn detect(host: &Host, protocols: &[Protocol]) -> anyhow::Result<(Vec<Protocol>, Vec<String>)> {
    let asked = || KERNEL.iter().filter(|k| protocols.contains(&k.protocol));
    let state = host.state_file();
    let state_or_none = state.clone().unwrap_or_else(|| "/dev/null".into());
    let mut script = format!("PATH=$PATH:/usr/sbin:/sbin; state={}\n{LOAD}command -v fio >/dev/null || echo nofio\n", crate::hosts::ssh::quote(&state_or_none));
    for k in asked() {
        script += &format!("( {} ) >/dev/null 2>&1 && echo has {}\n", k.probe, k.name);
    }
    let out = host.run("sh", &["-c", &script])?;
    // This machine's state file is undone by a later run only (after a
    // kill): this run unloads them itself.
    if host.on_this_machine() {
        for m in out.lines().filter_map(|l| l.strip_prefix("loaded ")) {
            let undo = Resource::owned(ShellUndo { host: host.clone(), script: crate::hosts::state_file::UNDO_ONE, args: vec!["module".into(), m.into(), String::new()] });
            registry().create(undo, || Ok(()))?;
        }
    }
    if out.lines().any(|l| l == "nofio") {
        return Ok((vec![], vec![format!("{}: fio is not installed (package fio): no kernel initiator can be measured", host.name())]));
    }
    let (mut have, mut lack) = (vec![], vec![]);
    for k in asked() {
        if out.lines().any(|l| l == format!("has {}", k.name)) {
            have.push(k.protocol);
        } else {
            lack.push(format!("{}: {} is missing: {} will be unavailable", host.name(), k.missing, k.name));
        }
    }
    Ok((have, lack))
}

/// The hostnqn the lab's kernel NVMe connections use (nvme-cli wants one;
/// a host may have no /etc/nvme/hostnqn).
const HOSTNQN: &str = "nqn.2026-11.org.blockwire.lab:kernel-client";

/// Attach: `$1` what, `$2` `$3` its address, `$4` the LUN; for NVMe/TCP
/// over TLS 1.3 `$5` `tls`, `$6` the host NQN and `$7` its PSK (inserted
/// into the `.nvme` keyring as nvme-cli does; tlshd makes the handshake,
/// the kernel keeps the records). Prints the
/// block device once it is there (at most ~60 s: an emulated host is slow).
/// find_dev must not assign `n`, the wait loop's counter: before the
/// namespace appears its glob stays unexpanded, and bash then evaluates
/// `n=$((n+1))` with n = "nvme*n*", which refers to itself.
const ATTACH: &str = r#"PATH=$PATH:/usr/sbin:/sbin; what=$1; a=$2; b=$3; lun=$4; tls=$5; tlshost=$6; psk=$7
dev=""; q="$HOSTNQN"; opts=""
find_dev() {
  case "$what" in
    iscsi) for s in /sys/class/iscsi_session/session*; do
             [ "$(cat "$s/targetname" 2>/dev/null)" = "$a" ] || continue
             for d in "$s"/device/target*/*:*:*:"$lun"/block/*; do [ -e "$d" ] && dev=/dev/${d##*/}; done
           done ;;
    nvme|nvme-rdma) for s in /sys/class/nvme-subsystem/*; do
            [ "$(cat "$s/subsysnqn" 2>/dev/null)" = "$a" ] || continue
            for d in "$s"/nvme*n*; do ns=${d##*/}; case "$ns" in *c*) ;; *) [ -e "$d" ] && dev=/dev/$ns ;; esac; done
          done ;;
    aoe) [ -b "/dev/etherd/$a" ] && dev=/dev/etherd/$a ;;
  esac
  [ -n "$dev" ] && [ -b "$dev" ]
}
# What the kernel said of this protocol and the frames each interface
# moved: the difference between a target never heard and a device not made.
diagnose() {
  printf 'kernel: %s frames rx/tx: %s' \
    "$(dmesg 2>/dev/null | grep -i -e "$what" -e etherd | tail -n 3 | tr '\n' ';')" \
    "$(sed 1,2d /proc/net/dev | sed 's/:/ /' | awk '$1 != "lo" { printf "%s %s/%s ", $1, $3, $11 }')"
}
case "$what" in
  iscsi) # sd_mod: no udev may be there to load the disk driver
         modprobe -q iscsi_tcp; modprobe -q sd_mod
         # an iscsid the lab starts is stopped with the last session
         pidof iscsid >/dev/null || { iscsid || exit 1; sleep 1; pidof iscsid > /run/bwlab-iscsid; }
         n=0; until iscsiadm -m discovery -t sendtargets -p "$b" >/dev/null; do n=$((n+1)); [ $n -lt 10 ] || exit 1; sleep 1; done
         iscsiadm -m node -T "$a" -p "$b" --login >/dev/null || exit 1 ;;
  nvme) modprobe -q nvme-tcp
        if [ -n "$tls" ]; then
          modprobe -q tls
          tlshd_pid >/dev/null || { echo "NVMe/TCP over TLS: no tlshd running on $(uname -n): the kernel's TLS handshakes are tlshd's (package ktls-utils; systemctl start tlshd)" >&2; exit 1; }
          grep -q tls /dev/nvme-fabrics 2>/dev/null || { echo "NVMe/TCP over TLS: the nvme-tcp of Linux $(uname -r) on $(uname -n) has no TLS (CONFIG_NVME_TCP_TLS, Linux 6.7 or later)" >&2; exit 1; }
          nvme check-tls-key --insert --keyring=.nvme --hostnqn="$tlshost" --subsysnqn="$a" --keydata="$psk" >/dev/null 2>&1 \
            || { echo "NVMe/TCP over TLS: nvme check-tls-key --insert failed on $(uname -n) (nvme-cli 2.7 or later)" >&2; exit 1; }
          q=$tlshost; opts=--tls
        fi
        nvme connect -t tcp -a "${b% *}" -s "${b#* }" -n "$a" -q "$q" $opts >/dev/null || exit 1 ;;
  nvme-rdma) modprobe -q nvme-rdma
        nvme connect -t rdma -a "${b% *}" -s "${b#* }" -n "$a" -q "$HOSTNQN" >/dev/null || exit 1 ;;
  aoe) modprobe -q aoe ;;
esac
n=0
until find_dev; do
  n=$((n+1)); [ $n -lt 600 ] || { echo "no block device appeared ($(diagnose))" >&2; exit 1; }
  [ "$what" = aoe ] && [ $((n % 20)) = 1 ] && echo > /dev/etherd/discover
  sleep 0.1
done
echo "$dev""#;


/// A kernel client attached to a subject: the block device (or the image
/// file on an NFS mount) fio drives, undone when released.
pub struct Attached {
    pub device: String,
    /// Released newest first.
    tokens: Vec<Token>,
}

impl Attached {
    /// Detach (log out, disconnect, unmount).
    pub fn release(self) -> anyhow::Result<()> {
        let mut first = Ok(());
        for t in self.tokens.into_iter().rev() {
            let r = registry().release(t);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// Attach kernel client `c` on `host` to `s` over `link`: a block
/// initiator of `s`'s protocol (recorded in the host's state file first),
/// or the NFS client's mount of `s`'s export.
/// With `tls`, NVMe/TCP connects over TLS 1.3 as the lab's host with its
/// PSK (`blockwire::TLS_HOST`, `TLS_PSK`).
pub fn attach(host: &Host, c: ClientKind, s: Subject, link: &Link, tls: bool) -> anyhow::Result<Attached> {
    if tls && c != ClientKind::Kernel(Protocol::Nvme) {
        anyhow::bail!("{} does not connect over TLS", c.key(s));
    }
    match c {
        ClientKind::Blockwire => anyhow::bail!("blockwire's client attaches nothing: it reaches {} by URL", s.key()),
        ClientKind::KernelNfs(v) => {
            let (device, tokens) = crate::subjects::kernel_nfs::mount_image(host, link.target_ip, s.address(), v)?;
            Ok(Attached { device, tokens })
        }
        ClientKind::Kernel(_) => attach_block(host, s, link, tls),
    }
}

/// Attach the kernel initiator of `s`'s protocol on `host` to `s` over
/// `link`; recorded in the host's state file first.
fn attach_block(host: &Host, s: Subject, link: &Link, tls: bool) -> anyhow::Result<Attached> {
    let KernelAddress { protocol, a, b, lun } =
        s.kernel_address(link).ok_or_else(|| anyhow::anyhow!("{}: no kernel block initiator reads a subject serving files", s.key()))?;
    let what = protocol.name();
    let mut tokens = vec![];
    let mut tls_args: Vec<String> = vec![];
    if tls {
        // The PSK goes into the keyring under its TLS PSK identity: removed
        // after the session (released after it: newest first).
        use crate::subjects::blockwire::{TLS_HOST, TLS_PSK};
        let id = format!("NVMe0R01 {TLS_HOST} {a}");
        host.record("tlskey", ".nvme", &id)?;
        let undo = Resource::owned(ShellUndo { host: host.clone(), script: crate::hosts::state_file::UNDO_ONE, args: vec!["tlskey".into(), ".nvme".into(), id] });
        tokens.push(registry().create(undo, || Ok(()))?.0);
        tls_args = ["tls", TLS_HOST, TLS_PSK].map(String::from).to_vec();
    }
    // `kernel WHAT A B`: the cleanup script splits the rest into arguments.
    host.record("kernel", what, &format!("{a} {b}"))?;
    let undo = Resource::owned(ShellUndo {
        host: host.clone(),
        script: crate::hosts::state_file::DETACH,
        args: vec![what.into(), a.clone(), b.clone()],
    });
    let lun = lun.to_string();
    let script = format!("{}{ATTACH}", crate::subjects::nvmet::TLSHD_PID).replace("$HOSTNQN", HOSTNQN);
    let mut device = String::new();
    let made = registry().create(undo, || {
        let mut args = vec!["-c", script.as_str(), "sh", what, &a, &b, &lun];
        args.extend(tls_args.iter().map(String::as_str));
        let cmd = host.command_with("sh", &args);
        let f = crate::suites::runner::run_workload(cmd, "kernel attach", Duration::from_secs(120), None)?;
        device = if f.ok { host.program_output(&f.stdout)?.trim().to_string() } else { String::new() };
        anyhow::ensure!(
            f.ok && device.starts_with("/dev/"),
            "{} did not attach: {}",
            ClientKind::kernel(protocol).name,
            crate::command::last_lines(&f.stderr, 2)
        );
        Ok(())
    });
    match made {
        Ok((token, ())) => tokens.push(token),
        Err(e) => {
            // The PSK goes again.
            for t in tokens.into_iter().rev() {
                let _ = registry().release(t);
            }
            return Err(e);
        }
    }
    Ok(Attached { device, tokens })
}

/// Whole-machine CPU time of `host` since boot from /proc/stat's `cpu`
/// line, in seconds: (user + nice, system + irq + softirq). Kernel
/// initiators' work belongs to no process: this is what a kernel subject's
/// client CPU is measured with (fio's own CPU included).
pub fn machine_cpu_seconds(host: &Host) -> anyhow::Result<(f64, f64)> {
    let out = host.run("head", &["-n1", "/proc/stat"])?;
    parse_proc_stat_cpu(&out).ok_or_else(|| anyhow::anyhow!("cannot parse /proc/stat on {}: {out}", host.name()))
}

/// The `cpu` line of /proc/stat as seconds: (user + nice, system + irq +
/// softirq).
fn parse_proc_stat_cpu(line: &str) -> Option<(f64, f64)> {
    let c = crate::hosts::proc::CpuTicks::parse(line)?;
    let s = |ticks: u64| ticks as f64 / crate::hosts::host::USER_HZ;
    Some((s(c.user + c.nice), s(c.system + c.irq + c.softirq)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subjects::{blockwire, tgt, PeerKind};

    #[test]
    fn keys_name_client_and_target() {
        let s = Subject::Peer(PeerKind::Tgt);
        assert_eq!(ClientKind::Blockwire.key(s).to_string(), "tgt-iscsi");
        assert_eq!(ClientKind::Kernel(Protocol::Iscsi).key(s).to_string(), "kernel-iscsi@tgt");
        assert_eq!(ClientKind::Kernel(Protocol::Aoe).key(Subject::Blockwire(Protocol::Aoe)).to_string(), "kernel-aoe@blockwire");
        for p in Protocol::ALL.into_iter().chain([Protocol::NvmeRdma]) {
            assert_eq!(ClientKind::kernel(p).protocol, p);
            // The subject prefix the state file and probes use names the same client.
            assert_eq!(ClientKind::kernel(p).name, format!("kernel-{}", p.name()));
        }
    }

    #[test]
    fn addresses_follow_the_targets() {
        let l = Link {
            mtu: 1500,
            target_if: "t".into(),
            client_if: "c".into(),
            target_ip: "198.18.1.1".parse().unwrap(),
            client_ip: "198.18.1.2".parse().unwrap(),
        };
        let kernel = |s: Subject| s.address().kernel(&l).unwrap();
        let k = |protocol, a: &str, b: &str, lun| KernelAddress { protocol, a: a.into(), b: b.into(), lun };
        assert_eq!(kernel(Subject::Peer(PeerKind::Tgt)), k(Protocol::Iscsi, tgt::IQN, &format!("198.18.1.1:{}", tgt::ISCSI_PORT), 1));
        assert_eq!(kernel(Subject::Blockwire(Protocol::Iscsi)), k(Protocol::Iscsi, blockwire::IQN, "198.18.1.1:3260", 0));
        assert_eq!(kernel(Subject::Blockwire(Protocol::Nvme)).b, "198.18.1.1 4420");
        assert_eq!(kernel(Subject::Blockwire(Protocol::NvmeRdma)), k(Protocol::NvmeRdma, blockwire::NQN, "198.18.1.1 4421", 0));
        assert_eq!(ClientKind::Kernel(Protocol::NvmeRdma).key(Subject::Blockwire(Protocol::NvmeRdma)).to_string(), "kernel-nvme-rdma@blockwire");
        assert_eq!(kernel(Subject::Peer(PeerKind::Vblade)), k(Protocol::Aoe, "e2.0", "", 0));
        assert_eq!(kernel(Subject::Blockwire(Protocol::Aoe)).a, "e1.0");
        // A peer serving files has no block device to attach.
        assert_eq!(Subject::Peer(PeerKind::Ganesha).address().kernel(&l), None);
        assert!(!ClientKind::Kernel(Protocol::Iscsi).serves(Subject::Peer(PeerKind::Ganesha)));
    }

    #[test]
    fn proc_stat_cpu_line() {
        let (u, s) = parse_proc_stat_cpu("cpu  100 50 300 9000 10 20 30 0 0 0").unwrap();
        assert_eq!((u, s), (1.5, 3.5));
        assert!(parse_proc_stat_cpu("cpu0 1 2 3 4 5 6 7").is_none());
    }
}
