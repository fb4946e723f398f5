//! nfs-ganesha (NFSv3 and NFSv4.1, VFS back end) serving the volume as a
//! file, `disk.img`, on a file system of its own (a loop image beside the
//! backing file, filled with the backing's bytes; ext4, or the fs suite's
//! `--fs` setting: the server's file system is the one under NFS data),
//! with `files/` beside it. Measured through blockwire's `nfs://` client,
//! as qemu and Proxmox use a disk image on NFS, and where the client host
//! has one through the kernel's NFS client (`crate::subjects::kernel_nfs`, whose
//! workloads run in `w/` at the export's root, where the fs suite puts
//! every subject's).
//!
//! rpcbind's socket and lock (/run/rpcbind.sock, /run/rpcbind.lock) are one
//! per machine, not per network namespace: ganesha and its rpcbind run in a
//! mount namespace of their own with a tmpfs over /run, so they never meet a
//! host rpcbind or another run's. That namespace also holds the ext4 mount,
//! which goes with its last process.

use super::target::{Address, FileServer, PeerTarget, Tool};
use crate::cleanup::{registry, Resource, Role};
use crate::suites::fs::fs_kind::FsKind;
use crate::subjects::process::{spawn_logged, TargetProcess};
use crate::network::topology::{Link, Topology};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The export's pseudo path, which NFSv3 MOUNT also uses (Mount_Path_Pseudo).
pub const EXPORT: &str = "/bwlab-nfs";
/// The volume's file on the export, and the directory for file workloads.
pub const VOLUME_FILE: &str = "disk.img";
pub const FILES_DIR: &str = "files";
pub const NFS_PORT: u16 = 2049;

pub struct Ganesha;

/// How to start one ganesha with its rpcbind.
pub struct Launch<'a> {
    /// Its config, log and PID files ([`Launch::STATE_FILES`]).
    pub state: &'a Path,
    /// The directory exported.
    pub export_dir: &'a Path,
    /// A file system image mounted on `export_dir` inside ganesha's
    /// namespace, with its mount options.
    pub image: Option<(&'a Path, &'a str)>,
    /// A file copied to `export_dir/disk.img` once mounted (the backing).
    pub volume_from: Option<&'a Path>,
    /// The address it listens on (all of the namespace's if None).
    pub bind: Option<Ipv4Addr>,
}

/// NFSv4 client records, in the tmpfs over /run of ganesha's namespace:
/// they go with it.
const RECOVERY: &str = "/run/bwlab-ganesha-recovery";

impl Launch<'_> {
    /// What a launch writes in its state directory.
    pub const STATE_FILES: [&'static str; 4] = ["ganesha.conf", "ganesha.log", "ganesha.pid", "rpcbind.pid"];

    fn config(&self) -> String {
        let bind = self.bind.map(|ip| format!("Bind_addr = {ip}; ")).unwrap_or_default();
        format!(
            "NFS_CORE_PARAM {{ {bind}NFS_Port = {NFS_PORT}; Protocols = 3, 4; Enable_NLM = false; Enable_RQUOTA = false; Mount_Path_Pseudo = true; }}\n\
             NFSV4 {{ Graceless = true; Minor_Versions = 1; RecoveryRoot = {RECOVERY}; }}\n\
             EXPORT {{ Export_Id = 1; Path = {}; Pseudo = {EXPORT}; Access_Type = RW; Squash = No_Root_Squash; Protocols = 3, 4; \
             Transports = TCP; SecType = sys; FSAL {{ Name = VFS; }} }}\n\
             LOG {{ Default_Log_Level = WARN; }}\n",
            self.export_dir.display()
        )
    }

    /// The shell run in ganesha's mount namespace; it ends by exec'ing
    /// ganesha, so the PID spawned is ganesha's.
    fn script(&self) -> String {
        let st = self.state.display();
        let ex = self.export_dir.display();
        let mut s = format!("set -e\nmount -t tmpfs -o mode=755 bwlab-run /run\nmkdir {RECOVERY}\n");
        if let Some((img, options)) = self.image {
            s += &format!("mount -o loop,{options} {} {ex}\n", img.display());
        }
        if let Some(src) = self.volume_from {
            s += &format!("cp --sparse=never {} {ex}/{VOLUME_FILE}\nmkdir -p {ex}/{FILES_DIR}\n", src.display());
        }
        s += &format!(
            "rpcbind -f & echo $! > {st}/rpcbind.pid\n\
             for i in $(seq 100); do [ -S /run/rpcbind.sock ] && break; sleep 0.1; done\n\
             exec ganesha.nfsd -F -f {st}/ganesha.conf -L {st}/ganesha.log -p {st}/ganesha.pid -N NIV_WARN\n"
        );
        s
    }

    /// `unshare` (as the target host runs it) given the arguments that run
    /// the script in a private mount namespace; the config written.
    pub fn command(&self, mut unshare: std::process::Command) -> std::io::Result<std::process::Command> {
        std::fs::create_dir_all(self.state)?;
        std::fs::write(self.state.join("ganesha.conf"), self.config())?;
        unshare.args(["-m", "--propagation", "private", "sh", "-c", &self.script()]);
        Ok(unshare)
    }

    /// rpcbind's PID once the script started it.
    pub fn rpcbind_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.state.join("rpcbind.pid")).ok()?.trim().parse().ok()
    }

    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.state.join("ganesha.log")).unwrap_or_default();
        let crit: Vec<&str> = text.lines().filter(|l| l.contains(":CRIT :") || l.contains(":FATAL :") || l.contains(":MAJ :")).collect();
        crit[crit.len().saturating_sub(3)..].join(" | ")
    }
}

/// True once NFSv3 over TCP answers a NULL call at `ip` (`rpcinfo` as the
/// target host runs it).
pub fn answers(mut rpcinfo: std::process::Command, ip: Ipv4Addr) -> bool {
    rpcinfo.args(["-T", "tcp", &ip.to_string(), "100003", "3"]).output().is_ok_and(|o| o.status.success())
}

impl PeerTarget for Ganesha {
    fn name(&self) -> &'static str {
        "ganesha"
    }

    fn address(&self) -> Address {
        Address::NfsFile { port: NFS_PORT, export: EXPORT, file: VOLUME_FILE }
    }

    // With it the default plans outgrow their time budgets (plan's test).
    fn in_default_plan(&self) -> bool {
        false
    }

    fn tools(&self) -> &'static [Tool] {
        &[
            Tool { program: "ganesha.nfsd", package: "nfs-ganesha" },
            Tool { program: "rpcbind", package: "rpcbind" },
            Tool { program: "rpcinfo", package: "rpcbind" },
            Tool { program: "mkfs.ext4", package: "e2fsprogs" },
        ]
    }

    fn version(&self) -> Option<String> {
        crate::command::package_version("nfs-ganesha").map(|v| format!("nfs-ganesha {v}"))
    }

    fn start(&self, topo: &Topology, link: &Link, backing: &Path) -> Result<TargetProcess, String> {
        start_on(topo, link, backing, FsKind::Ext4)
    }

    fn file_server(&self) -> Option<&dyn FileServer> {
        Some(self)
    }
}

impl FileServer for Ganesha {
    fn start_on(&self, topo: &Topology, link: &Link, backing: &Path, kind: FsKind) -> Result<TargetProcess, String> {
        start_on(topo, link, backing, kind)
    }
}

/// ganesha serving `backing`'s bytes from an export on file system `kind`.
fn start_on(topo: &Topology, link: &Link, backing: &Path, kind: FsKind) -> Result<TargetProcess, String> {
    // Its export image, config and state files are made on this
    // machine's file system.
    if !topo.target.on_this_machine() {
        return Err("the ganesha peer runs only on a target host of this machine for now".into());
    }
    if crate::command::package_version("nfs-ganesha-vfs").is_none() {
        return Err("ganesha's VFS back end is not installed (package nfs-ganesha-vfs)".into());
    }
    let tag = format!("/tmp/bwlab-{}-ganesha-{}", std::process::id(), link.mtu);
    let (state, export, image) = (PathBuf::from(format!("{tag}-state")), PathBuf::from(format!("{tag}-export")), backing.with_extension(format!("nfs-{}", kind.name())));
    if !crate::command::which(kind.mkfs_program()) {
        return Err(format!("{} is not installed: no export on {}", kind.mkfs_program(), kind.name()));
    }
    let size = std::fs::metadata(backing).map_err(|e| format!("{}: {e}", backing.display()))?.len();
    let mut tokens = vec![];
    let made = (|| -> anyhow::Result<()> {
        tokens.push(registry().create(Resource::Dir(export.clone()), || Ok(std::fs::create_dir_all(&export)?))?.0);
        tokens.push(registry().create(Resource::Dir(state.clone()), || Ok(std::fs::create_dir_all(&state)?))?.0);
        for f in Launch::STATE_FILES {
            tokens.push(registry().create(Resource::File(state.join(f)), || Ok(()))?.0);
        }
        let (t, ()) = registry().create(Resource::File(image.clone()), || {
            // Room for the volume's file, the file system's metadata and the
            // kernel NFS subjects' file workloads, and on btrfs for its
            // copy-on-write (an overwrite takes new space until the old is
            // freed: with the file alone on it, writes failed ENOSPC);
            // sparse, so only what is written takes memory.
            let f = std::fs::File::create(&image)?;
            f.set_len(2 * size + (256 << 20))?;
            let mut args = kind.image_mkfs_args(size);
            args.push(image.to_string_lossy().into_owned());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            crate::command::sh(kind.mkfs_program(), &args)?;
            Ok(())
        })?;
        tokens.push(t);
        Ok(())
    })();
    let give_back = |tokens: Vec<_>| {
        for t in tokens.into_iter().rev() {
            let _ = registry().release(t);
        }
    };
    if let Err(e) = made {
        give_back(tokens);
        return Err(format!("cannot prepare ganesha's file system: {e}"));
    }
    let launch = Launch { state: &state, export_dir: &export, image: Some((&image, kind.mount_options())), volume_from: Some(backing), bind: Some(link.target_ip) };
    let cmd = match launch.command(topo.target.command("unshare")) {
        Ok(c) => c,
        Err(e) => {
            give_back(tokens);
            return Err(format!("cannot write ganesha's config: {e}"));
        }
    };
    let (mut p, _rx) = match spawn_logged(&topo.target, cmd, "ganesha.nfsd", None, None) {
        Ok(x) => x,
        Err(e) => {
            give_back(tokens);
            return Err(e.to_string());
        }
    };
    // The copy of the backing comes first: allow for it.
    let deadline = Instant::now() + Duration::from_secs(30 + size / (100 << 20));
    let mut rpcbind = None;
    loop {
        if rpcbind.is_none() {
            if let Some(pid) = launch.rpcbind_pid() {
                let r = registry().create(Resource::Child { pid, what: "rpcbind".into(), role: Role::Service }, || Ok(()));
                if let Ok((t, ())) = r {
                    rpcbind = Some(t);
                }
            }
        }
        if answers(topo.target.command("rpcinfo"), link.target_ip) {
            break;
        }
        if !p.alive() || Instant::now() > deadline {
            let why = format!("ganesha did not start: {} {}", p.log_tail(), launch.log());
            p.stop();
            give_back(rpcbind.into_iter().chain(tokens).collect());
            return Err(why);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Released after ganesha stops: rpcbind (the namespace, its image's
    // mount and loop device go with it), then the files.
    for t in rpcbind.into_iter().chain(tokens.into_iter().rev()) {
        p.keep_until_stopped(t);
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_export_image_is_made_without_discard_on_each_file_system() {
        assert_eq!(FsKind::Ext4.image_mkfs_args(1 << 30), ["-q", "-F", "-E", "nodiscard"]);
        // ext4-tuned's own -E options stand alone (mke2fs takes one -E).
        assert_eq!(FsKind::Ext4Tuned.image_mkfs_args(1 << 30)[..3], ["-q", "-F", "-E"]);
        assert_eq!(FsKind::Xfs.image_mkfs_args(1 << 30), ["-q", "-f", "-K"]);
        assert_eq!(FsKind::Btrfs.image_mkfs_args(1 << 30), ["-q", "-f", "-K"]);
        let dir = Path::new("/tmp/x");
        let l = Launch { state: dir, export_dir: dir, image: Some((Path::new("/dev/shm/i"), "nodatacow")), volume_from: None, bind: None };
        assert!(l.script().contains("mount -o loop,nodatacow /dev/shm/i /tmp/x\n"));
    }
}
