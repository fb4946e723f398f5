//! LIO, the Linux kernel's iSCSI target (what Proxmox's LIO provider and
//! Cinder's `lioadm` drive), set up through configfs directly, so the
//! target host needs no targetcli or Python: a fileio backstore on the
//! backing file (a block backstore when the backing is a device) in an HBA
//! of its own, one target with its own IQN, TPG 1, LUN 0, a portal on the
//! link's address and a port of its own, in demo mode (any initiator,
//! no CHAP, writable). What the host's LIO already serves is left alone:
//! an IQN the lab's is refused, not reused, and saved targetcli configs are
//! never read or written.

use super::configfs;
use super::target::{Address, PeerTarget, Tool};
use crate::subjects::process::TargetProcess;
use crate::network::topology::{Link, Topology};
use std::path::Path;

pub const IQN: &str = "iqn.2026-11.org.blockwire.lab:lio";
/// Not blockwire's 3260 or tgt's 3261, nor a host LIO's on the usual port.
pub const ISCSI_PORT: u16 = 3262;

pub struct Lio;

/// `$1` IQN, `$2` backing, `$3` portal (IP:PORT), `$4` backstore name.
/// Buffered fileio with write-back caching (`fd_buffered_io=1`, what
/// targetcli's fileio backstores default to): the setting is read back
/// into the settings line with the kernel's version.
const SETUP: &str = r#"iqn=$1; backing=$2; portal=$3; name=$4
load target_core_mod || nocfs "the kernel of $(uname -n) $(uname -r) has no LIO (target_core_mod)"
t=/sys/kernel/config/target
[ -d "$t/core" ] || nocfs "$t is missing on $(uname -n)"
[ -d "$t/iscsi/$iqn" ] && fail "$iqn exists on $(uname -n) already (another lab's, or not the lab's): left alone"
if [ -b "$backing" ]; then kind=iblock; module=target_core_iblock; else kind=fileio; module=target_core_file; fi
load $module || fail "the kernel of $(uname -n) has no $module"
load iscsi_target_mod || nocfs "the kernel of $(uname -n) has no LIO iSCSI fabric (iscsi_target_mod)"
i=7700; while [ -e "$t/core/${kind}_$i" ]; do i=$((i+1)); done
bs=${kind}_$i/$name
rec lio "$iqn" "$bs"
mkdir -p "$t/core/$bs" || fail "cannot make the backstore $bs"
if [ $kind = fileio ]; then
  echo "fd_dev_name=$backing,fd_dev_size=$(stat -c %s "$backing"),fd_buffered_io=1" > "$t/core/$bs/control"
else
  echo "udev_path=$backing" > "$t/core/$bs/control"
fi
echo 1 > "$t/core/$bs/enable" || fail "the backstore on $backing did not enable: $(dmesg | tail -n 2 | tr '\n' ' ')"
g=$t/iscsi/$iqn/tpgt_1
mkdir -p "$g/lun/lun_0" || fail "cannot make $g"
ln -s "$t/core/$bs" "$g/lun/lun_0/bwlab" || fail "cannot map the backstore to LUN 0"
mkdir "$g/np/$portal" || fail "no portal on $portal: $(dmesg | tail -n 2 | tr '\n' ' ')"
echo 0 > "$g/attrib/authentication"
echo 1 > "$g/attrib/generate_node_acls"
echo 1 > "$g/attrib/cache_dynamic_acls"
echo 0 > "$g/attrib/demo_mode_write_protect"
echo 1 > "$g/enable" || fail "TPG 1 of $iqn did not enable"
mode=$(sed -n 's/.*Mode: *\([A-Za-z-]*\).*/\1/p' "$t/core/$bs/info" | head -n 1)
echo "settings LIO in Linux $(uname -r): $kind backstore on $backing${mode:+ ($mode)}, emulate_write_cache=$(cat "$t/core/$bs/attrib/emulate_write_cache"), block size $(cat "$t/core/$bs/attrib/block_size"); demo-mode TPG (no ACLs, no CHAP)"
"#;

impl PeerTarget for Lio {
    fn name(&self) -> &'static str {
        "lio"
    }

    fn address(&self) -> Address {
        Address::Iscsi { iqn: IQN, port: ISCSI_PORT, lun: 0 }
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
        let args = [IQN.to_string(), backing.to_string_lossy().into_owned(), format!("{}:{ISCSI_PORT}", link.target_ip), format!("bwlab-{}", std::process::id())];
        configfs::set_up(&topo.target, "LIO", SETUP, &args)
    }
}
