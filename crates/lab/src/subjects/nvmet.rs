//! nvmet, the Linux kernel's NVMe-oF target (study 4 measured it), set up
//! through configfs directly (no nvmetcli): a subsystem with its own NQN,
//! the backing file (or device) as namespace 1, any host allowed, and a
//! port of its own per transport: NVMe/TCP (`nvmet`), and NVMe/RDMA
//! (`nvmet-rdma`) on the same subsystem when the link has an RDMA device
//! on both hosts (the rule of `crate::network::rdma`). Ports the host already has
//! are never touched or linked: the lab's get fresh port numbers, and a
//! subsystem of the lab's NQN that is not this run's is refused.

use super::configfs;
use super::target::{Address, PeerTarget, Tool};
use crate::subjects::process::TargetProcess;
use crate::network::topology::{Link, Topology};
use std::path::Path;

pub const NQN: &str = "nqn.2026-11.org.blockwire.lab:nvmet";
/// Not blockwire's 4420 (TCP) or 4421 (RDMA).
pub const TCP_PORT: u16 = 4422;
pub const RDMA_PORT: u16 = 4423;

/// One transport of the lab's nvmet subsystem: a registry row each.
pub struct Nvmet {
    pub rdma: bool,
}

/// Shell: `tlshd_pid` prints the PID of a running tlshd or fails. Found by
/// its command line: a tlshd started through its loader (as Debian 13's in
/// the kernel VM) has another process name.
pub const TLSHD_PID: &str = r#"tlshd_pid() {
  for c in /proc/[0-9]*/cmdline; do
    tr '\0' '\n' < "$c" 2>/dev/null | grep -qxE 'tlshd|.*/tlshd' || continue
    c=${c#/proc/}; echo "${c%/cmdline}"; return 0
  done
  return 1
}
"#;

/// `$1` NQN, `$2` backing, `$3` transport (tcp, rdma), `$4` address, `$5`
/// port, `$6` this run's mark (the subsystem's serial number: a second
/// transport of the same run joins the subsystem, anyone else's is left
/// alone), `$7` `tls` for NVMe/TCP over TLS 1.3 (else empty) with `$8` the
/// host NQN and `$9` its PSK. A file namespace uses buffered I/O
/// (`buffered_io=1`: tmpfs, where the lab's backing lives, takes no
/// O_DIRECT); the settings line says which.
///
/// TLS (TP 8011) on nvmet is the kernel's records (kTLS) after a handshake
/// done by tlshd (ktls-utils) with the PSK the `.nvme` keyring holds under
/// its identity: the setup checks for both before making anything, inserts
/// the lab's PSK as nvme-cli does (`nvme check-tls-key --insert`, the
/// retained PSK derived into a TLS PSK named `NVMe0R01 HOST NQN`; recorded
/// first, unlinked with keyctl afterwards) and sets the port's `addr_tsas`
/// (tls1.3) and `addr_treq` (required). The PSK is the lab's own, not a
/// secret (`blockwire::TLS_PSK`).
const SETUP: &str = r#"nqn=$1; backing=$2; tr=$3; addr=$4; svc=$5; mark=$6; tls=$7; tlshost=$8; psk=$9
load nvmet || nocfs "the kernel of $(uname -n) $(uname -r) has no nvmet"
n=/sys/kernel/config/nvmet; s=$n/subsystems/$nqn
[ -d "$n/subsystems" ] || nocfs "$n is missing on $(uname -n)"
load nvmet-$tr || fail "the kernel of $(uname -n) has no nvmet-$tr"
if [ -n "$tls" ]; then
  no_tls() { fail "NVMe/TCP over TLS on $(uname -n): $*"; }
  load tls || [ -d /sys/module/tls ] || no_tls "the kernel $(uname -r) has no TLS (the tls module, CONFIG_TLS)"
  tlshd_pid >/dev/null || no_tls "no tlshd running: nvmet's TLS handshakes are tlshd's (package ktls-utils; systemctl start tlshd)"
  nvme check-tls-key --help 2>&1 | grep -q -- --insert || no_tls "$(nvme version 2>/dev/null | head -n 1 || echo 'no nvme-cli') cannot insert a TLS PSK (nvme check-tls-key --insert: nvme-cli 2.7 or later)"
  command -v keyctl >/dev/null || no_tls "no keyctl to remove the lab's PSK afterwards (package keyutils)"
fi
join=""
if [ -d "$s" ]; then
  [ "$(sed 's/ *$//' "$s/attr_serial")" = "$mark" ] || fail "$nqn exists on $(uname -n) already (another lab's, or not the lab's): left alone"
  join=1
fi
p=7700; while [ -e "$n/ports/$p" ]; do p=$((p+1)); done
rec nvmet "$nqn" "$p"
if [ -z "$join" ]; then
  mkdir "$s" || fail "cannot make the subsystem $nqn"
  echo "$mark" > "$s/attr_serial"
  echo 1 > "$s/attr_allow_any_host"
  mkdir "$s/namespaces/1"
  printf %s "$backing" > "$s/namespaces/1/device_path"
  [ -b "$backing" ] || echo 1 > "$s/namespaces/1/buffered_io"
  echo 1 > "$s/namespaces/1/enable" || fail "namespace 1 on $backing did not enable: $(dmesg | tail -n 2 | tr '\n' ' ')"
fi
mkdir "$n/ports/$p"
echo ipv4 > "$n/ports/$p/addr_adrfam"
echo "$tr" > "$n/ports/$p/addr_trtype"
echo "$addr" > "$n/ports/$p/addr_traddr"
echo "$svc" > "$n/ports/$p/addr_trsvcid"
sec=""
if [ -n "$tls" ]; then
  [ -e "$n/ports/$p/addr_tsas" ] || no_tls "nvmet in Linux $(uname -r) has no TLS (no addr_tsas: CONFIG_NVME_TARGET_TCP_TLS, Linux 6.7 or later)"
  id="NVMe0R01 $tlshost $nqn"
  rec tlskey .nvme "$id"
  out=$(nvme check-tls-key --insert --keyring=.nvme --hostnqn="$tlshost" --subsysnqn="$nqn" --keydata="$psk" 2>&1) \
    || no_tls "nvme check-tls-key --insert into the .nvme keyring failed: $(echo "$out" | tail -n 1)"
  echo "$out" | grep -q "Inserted TLS key" || no_tls "nvme check-tls-key --insert did not insert $id: $(echo "$out" | tail -n 1)"
  echo tls1.3 > "$n/ports/$p/addr_tsas" || no_tls "addr_tsas tls1.3 refused"
  echo required > "$n/ports/$p/addr_treq" || no_tls "addr_treq required refused"
  sec=", NVMe/TCP over TLS 1.3 required (addr_tsas $(cat "$n/ports/$p/addr_tsas"), addr_treq $(cat "$n/ports/$p/addr_treq" | tr '\n' ' ' | sed 's/ *$//')): PSK $id in the .nvme keyring, handshakes by tlshd (pid $(tlshd_pid)), records by the kernel (kTLS)"
fi
ln -s "$s" "$n/ports/$p/subsystems/$nqn" || fail "port $p ($tr $addr:$svc) did not enable: $(dmesg | tail -n 2 | tr '\n' ' ')"
if [ -b "$backing" ]; then io="block device namespace"; else io="file namespace, buffered_io=$(cat "$s/namespaces/1/buffered_io")"; fi
echo "settings nvmet in Linux $(uname -r): $io on $backing, port $p ($tr $addr:$svc), any host allowed$sec"
"#;

impl PeerTarget for Nvmet {
    fn name(&self) -> &'static str {
        if self.rdma {
            "nvmet-rdma"
        } else {
            "nvmet"
        }
    }

    fn target_name(&self) -> &'static str {
        "nvmet"
    }

    fn address(&self) -> Address {
        if self.rdma {
            Address::NvmeRdma { nqn: NQN, port: RDMA_PORT }
        } else {
            Address::Nvme { nqn: NQN, port: TCP_PORT }
        }
    }

    // Opt-in: it changes the target host's kernel state (modules, configfs).
    fn in_default_plan(&self) -> bool {
        false
    }

    fn tools(&self) -> &'static [Tool] {
        &[]
    }

    fn version(&self) -> Option<String> {
        Some("the target host's kernel (its version is in the subject table)".into())
    }

    fn start(&self, topo: &Topology, link: &Link, backing: &Path) -> Result<TargetProcess, String> {
        self.set_up(topo, link, backing, false)
    }

    fn serves_tls(&self) -> bool {
        !self.rdma
    }

    fn start_tls(&self, topo: &Topology, link: &Link, backing: &Path) -> Result<TargetProcess, String> {
        self.set_up(topo, link, backing, true)
    }
}

impl Nvmet {
    fn set_up(&self, topo: &Topology, link: &Link, backing: &Path, tls: bool) -> Result<TargetProcess, String> {
        if self.rdma {
            if let Some(why) = crate::network::rdma::check(&topo.target, &link.target_if).or_else(|| crate::network::rdma::check(&topo.client, &link.client_if)) {
                return Err(why);
            }
        }
        let (tr, port) = if self.rdma { ("rdma", RDMA_PORT) } else { ("tcp", TCP_PORT) };
        let mut args = vec![NQN.to_string(), backing.to_string_lossy().into_owned(), tr.into(), link.target_ip.to_string(), port.to_string(), format!("bwlab{}", std::process::id())];
        if tls {
            use crate::subjects::blockwire::{TLS_HOST, TLS_PSK};
            args.extend(["tls", TLS_HOST, TLS_PSK].map(String::from));
        }
        configfs::set_up(&topo.target, if self.rdma { "nvmet (RDMA)" } else { "nvmet" }, &format!("{TLSHD_PID}{SETUP}"), &args)
    }
}
