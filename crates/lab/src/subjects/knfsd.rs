//! knfsd, the Linux kernel's NFS server (the shared storage many Proxmox
//! clusters use), exporting a directory that holds the volume's image
//! file, `disk.img`, to the client host over NFSv3 and NFSv4.1. Like
//! ganesha's, the directory is a file system of its own (a loop image on
//! the target host's /dev/shm, filled with the backing's bytes; ext4, or
//! the fs suite's `--fs` setting: over NFS the server's file system is the
//! one under the data). Measured through blockwire's `nfs://` client and
//! the client host's kernel NFS client (`crate::subjects::kernel_nfs`).
//!
//! What the host already runs is left alone: the lab adds its own export
//! with `exportfs -o OPTIONS CLIENT:DIR` (never /etc/exports, never
//! `exportfs -r`), starts rpcbind, rpc.mountd and the nfsd threads only
//! when they are not running, mounts /proc/fs/nfsd only when it is not
//! mounted, and loads nfsd only when it is not loaded. Each of those is
//! written to the host's state file before it is done (`export`, `nfsd`,
//! `kill`, `write`, `mount`, `file`, `rmdir`, `modules` lines), undone
//! newest first when the target stops, and by the next run after a killed
//! one; a module goes last and only if nothing uses it (rmmod).
//!
//! It runs on a target host reached over ssh: in one box the target is a
//! network namespace of this machine, and nfsd, mountd and the export
//! table would be this machine's.

use super::configfs;
use super::target::{Address, FileServer, PeerTarget, Tool};
use crate::suites::fs::fs_kind::FsKind;
use crate::subjects::process::TargetProcess;
use crate::network::topology::{Link, Topology};
use std::path::Path;

/// The exported directory (the mount point of the export's file system).
pub const EXPORT: &str = "/srv/bwlab-knfsd";
/// The volume's file on the export.
pub const VOLUME_FILE: &str = "disk.img";
pub const NFS_PORT: u16 = 2049;
/// The export's options: written through to the server's file system
/// (`sync`, as qemu's cache=none users expect an acknowledged write to
/// be), root writes as root (the clients run as root), no subtree check.
pub const EXPORT_OPTIONS: &str = "rw,sync,no_subtree_check,no_root_squash";

pub struct Knfsd;

/// The programs it runs on the target host.
const TOOLS: [Tool; 4] = [
    Tool { program: "exportfs", package: "nfs-kernel-server" },
    Tool { program: "rpc.mountd", package: "nfs-kernel-server" },
    Tool { program: "rpc.nfsd", package: "nfs-kernel-server" },
    Tool { program: "rpcbind", package: "rpcbind" },
];

/// Whether this host's kernel has an NFS server (built in, loaded, or a
/// module to load), before anything else: a clear reason when it has not.
/// Nothing is loaded here.
const CHECK: &str = r#"PATH=$PATH:/usr/sbin:/sbin
grep -qw nfsd /proc/filesystems || [ -d /sys/module/nfsd ] || find "/lib/modules/$(uname -r)" -name 'nfsd.ko*' 2>/dev/null | grep -q . || {
  echo "the kernel of $(uname -n) $(uname -r) has no NFS server (no nfsd module)" >&2; exit 3; }
"#;

/// After `configfs`'s prelude (`rec`, `load`, `fail`): `$1` the exported
/// directory, `$2` the export's image file, `$3` the backing, `$4` the
/// client's address, `$5` the export options, `$6` mkfs program, `$7` the
/// image's mount options, `$8` its file system type, then mkfs's arguments.
const SETUP: &str = r#"dir=$1; img=$2; backing=$3; client=$4; opts=$5; mkfs=$6; mopts=$7; fstype=$8; shift 8
load nfsd || fail "the kernel of $(uname -n) $(uname -r) has no NFS server (nfsd does not load)"
[ -d /var/lib/nfs ] || { rec rmdir /var/lib/nfs; mkdir -p /var/lib/nfs; }
if ! grep -q " /proc/fs/nfsd nfsd " /proc/mounts; then
  rec mount /proc/fs/nfsd; mount -t nfsd nfsd /proc/fs/nfsd || fail "the nfsd file system does not mount on $(uname -n)"
fi
grep -qs " $dir " /proc/mounts && fail "$dir is mounted on $(uname -n) already (another lab's, or not the lab's): left alone"
exportfs 2>/dev/null | grep -q "^$dir" && fail "$dir is exported on $(uname -n) already: left alone"
# The export's file system: a sparse image with room for the volume's
# file, the fs suite's files and a copy-on-write file system's overwrites.
size=$(stat -c %s "$backing") || fail "no backing file $backing"
rec file "$img"
truncate -s $((2 * size + 268435456)) "$img" && "$mkfs" "$@" "$img" >/dev/null || fail "$mkfs on $img failed"
[ -d "$dir" ] || { rec rmdir "$dir"; mkdir -p "$dir"; }
rec mount "$dir"
[ -e /dev/loop-control ] || load loop
grep -qw "$fstype" /proc/filesystems || load "$fstype"
mount -t "$fstype" -o "loop${mopts:+,$mopts}" "$img" "$dir" || fail "cannot mount the export's image on $dir"
dd if="$backing" of="$dir/disk.img" bs=1M conv=fsync 2>/dev/null || fail "cannot copy the backing into $dir"
# rpcbind (NFSv3's mountd registers there), mountd, the nfsd threads:
# started only when not running, and stopped only then.
started() { for p in $(pidof "$1"); do rec kill "$p" "$(cut -d' ' -f22 /proc/$p/stat)"; done; }
if ! pidof rpcbind >/dev/null; then
  rpcbind -w </dev/null >/dev/null 2>&1 || fail "rpcbind does not start on $(uname -n)"; started rpcbind
fi
if ! pidof rpc.mountd >/dev/null; then
  rpc.mountd </dev/null >/dev/null 2>&1 || fail "rpc.mountd does not start on $(uname -n)"; started rpc.mountd
fi
threads=$(cat /proc/fs/nfsd/threads 2>/dev/null || echo 0)
if [ "$threads" = 0 ]; then
  # NFSv4's grace after a start blocks opens for its length (90 s by
  # default): the shortest the kernel takes, put back afterwards.
  for t in nfsv4gracetime nfsv4leasetime; do
    [ -w /proc/fs/nfsd/$t ] && rec write /proc/fs/nfsd/$t "$(cat /proc/fs/nfsd/$t)" && echo 10 > /proc/fs/nfsd/$t
  done
  rec nfsd threads
  rpc.nfsd 8 || fail "rpc.nfsd does not start the server on $(uname -n): $(dmesg | tail -n 2 | tr '\n' ' ')"
  threads=8
fi
rec export "$client:$dir"
exportfs -o "$opts" "$client:$dir" || fail "exportfs -o $opts $client:$dir failed"
versions=$(cat /proc/fs/nfsd/versions 2>/dev/null)
echo "settings knfsd in Linux $(uname -r): export $dir to $client ($opts), on $fstype (a loop image), $threads nfsd threads; versions ${versions:-unknown}"
"#;

impl PeerTarget for Knfsd {
    fn name(&self) -> &'static str {
        "knfsd"
    }

    fn address(&self) -> Address {
        Address::NfsFile { port: NFS_PORT, export: EXPORT, file: VOLUME_FILE }
    }

    // Opt-in: it changes the target host's kernel state (nfsd, exports).
    fn in_default_plan(&self) -> bool {
        false
    }

    // Checked after the kernel (`serve`): without nfsd, installing them
    // would not help.
    fn tools(&self) -> &'static [Tool] {
        &[]
    }

    fn version(&self) -> Option<String> {
        Some("the target host's kernel (its version is in the subject table)".into())
    }

    fn start(&self, topo: &Topology, link: &Link, backing: &Path) -> Result<TargetProcess, String> {
        self.start_on(topo, link, backing, FsKind::Ext4)
    }

    fn file_server(&self) -> Option<&dyn FileServer> {
        Some(self)
    }
}

impl FileServer for Knfsd {
    fn start_on(&self, topo: &Topology, link: &Link, backing: &Path, kind: FsKind) -> Result<TargetProcess, String> {
        serve(&topo.target, link, backing, kind)
    }
}

/// knfsd on `host` exporting, to `link`'s client address, a file system
/// of kind `kind` holding a copy of `backing` (a file on `host`) as
/// [`VOLUME_FILE`]. Err is why it is unavailable; what it made before
/// failing is undone. Stopped, the target undoes what it set up.
pub fn serve(host: &crate::hosts::host::Host, link: &Link, backing: &Path, kind: FsKind) -> Result<TargetProcess, String> {
    // The kernel first: on a host without nfsd that is the one reason.
    let out = host.command_with("sh", &["-c", CHECK, "sh"]).stdin(std::process::Stdio::null()).output().map_err(|e| format!("cannot ask {} for nfsd: {e}", host.name()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(crate::command::last_lines(err.trim(), 1));
    }
    for t in TOOLS {
        if !host.has(t.program) {
            return Err(format!("{} is not installed on {} (package {})", t.program, host.name(), t.package));
        }
    }
    if host.on_this_machine() {
        return Err("knfsd is measured on a target host reached over ssh (--target-host): in one box its server, mountd and export table would be this machine's".into());
    }
    let image = host.run_path("/dev/shm", &format!("knfsd-{}.img", kind.name()));
    let backing_s = backing.to_string_lossy();
    let size: u64 = host
        .run("stat", &["-c", "%s", &backing_s])
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| format!("no backing file {backing_s} on {}", host.name()))?;
    let mut args = vec![
        EXPORT.to_string(),
        image.to_string_lossy().into_owned(),
        backing_s.to_string(),
        link.client_ip.to_string(),
        EXPORT_OPTIONS.to_string(),
        kind.mkfs_program().to_string(),
        kind.mount_options().to_string(),
        kind.mkfs_type().to_string(),
    ];
    args.extend(kind.image_mkfs_args(size));
    configfs::set_up_after(host, "knfsd", SETUP, &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a host without an NFS server in its kernel (this machine's has
    /// none) the check gives one reason and changes nothing.
    #[test]
    fn a_kernel_without_nfsd_is_one_reason() {
        let out = std::process::Command::new("sh").args(["-c", CHECK, "sh"]).output().unwrap();
        let has = std::path::Path::new("/sys/module/nfsd").exists()
            || std::fs::read_to_string("/proc/filesystems").unwrap_or_default().contains("nfsd");
        if has {
            assert!(out.status.success());
        } else if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("has no NFS server (no nfsd module)") && err.trim().lines().count() == 1, "{err}");
        }
    }
}
