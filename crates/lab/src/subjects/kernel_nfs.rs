//! The client host's kernel NFS client on a peer serving files (any
//! [`crate::subjects::FileServer`]: ganesha, knfsd): its export mounted
//! with NFSv3 or NFSv4.1, each version a subject of its own,
//! `kernel-nfs3@knfsd` and `kernel-nfs4.1@knfsd` (named like
//! `kernel-iscsi@tgt`). The micro and sweep suites drive the export's
//! image file with fio and direct I/O, as qemu uses a disk image on NFS
//! ([`mount_image`], held for the link's runs); the fs suite mounts the
//! export afresh in each turn and runs its workloads in `w/` at its root,
//! as the iSCSI-vs-NFS study did ([`mount`]). The file system under the
//! data is the server's (the export's), so `--fs` chooses that one.
//!
//! On an ssh host a mount is recorded in the host's state file before it
//! is made (`kernel nfs MOUNTPOINT`, undone by the `nfs` case of
//! `ssh::detach_script`), so the next run unmounts what a killed one
//! left. On this machine the mount goes into the lab's mount namespace
//! (nsenter --net, as `blockwire mount` does), tracked like the others.

use crate::cleanup::{registry, Resource, Token};
use crate::hosts::host::Host;
use crate::suites::fs::mounts::Mounted;
use crate::subjects::Address;
use bw_lab_results::SubjectKey;
use std::net::Ipv4Addr;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NfsVersion {
    V3,
    V41,
}

pub const VERSIONS: [NfsVersion; 2] = [NfsVersion::V3, NfsVersion::V41];

impl NfsVersion {
    /// Its part of the subject's name.
    pub fn name(self) -> &'static str {
        match self {
            NfsVersion::V3 => "nfs3",
            NfsVersion::V41 => "nfs4.1",
        }
    }

    /// mount(8) options. `soft` with a bounded retry: a server that dies
    /// fails the case with EIO instead of hanging the run. `nolock`: ganesha
    /// runs without NLM, and nothing here locks across clients.
    pub fn options(self) -> &'static str {
        match self {
            NfsVersion::V3 => "vers=3,proto=tcp,nolock,soft,timeo=150,retrans=2",
            NfsVersion::V41 => "vers=4.1,proto=tcp,soft,timeo=150,retrans=2",
        }
    }

    /// Its subject key on the peer `target` serves: `kernel-nfs3@knfsd`.
    pub fn key(self, target: &'static str) -> SubjectKey {
        SubjectKey::kernel(self.name(), target)
    }

    /// The client as the report's subject table names it.
    pub fn initiator(self, host: &Host) -> String {
        let on = host.on_name();
        let v = match self {
            NfsVersion::V3 => "NFSv3",
            NfsVersion::V41 => "NFSv4.1",
        };
        format!("the kernel NFS client ({v} mount of the export: the image file with fio and direct I/O, files on the server's file system){on}")
    }
}

/// Succeeds where the host can mount NFS: mount.nfs, and the nfs file
/// system built in or loadable.
const PROBE: &str = "PATH=$PATH:/usr/sbin:/sbin; command -v mount.nfs >/dev/null && { grep -qw nfs /proc/filesystems || modprobe -q nfs; }";

/// Whether `host` has a kernel NFS client (mount.nfs and the module).
pub fn available(host: &Host) -> bool {
    host.run("sh", &["-c", PROBE]).is_ok()
}

/// Whether this machine can mount NFS with its kernel (mount.nfs, and the
/// nfs file system built in or loadable): the one-box lab's client needs
/// it for file-level NFS.
pub fn available_here() -> bool {
    available(&Host::Local)
}

/// Mount `$2` on `$1` with options `$3` (the mount point made first, as
/// on a remote host nothing else makes it). mount.nfs itself: a host's
/// `mount` may be busybox's, whose own NFS code knows no NFSv4; the
/// version modules loaded first where no udev or modprobe helper would.
const MOUNT: &str = r#"PATH=$PATH:/usr/sbin:/sbin
for m in nfs nfsv3 nfsv4; do modprobe -q $m 2>/dev/null; done
mkdir -p "$1" && mount.nfs "$2" "$1" -o "$3""#;

/// The export of a file peer at `address`, served at `server`, mounted on
/// `mp` of `host` with version `v` and mount options `extra` besides the
/// version's. Released: unmounted (forcibly and lazily if the server is
/// gone), and on a remote host the mount point removed.
pub fn mount(host: &Host, server: Ipv4Addr, address: Address, v: NfsVersion, mp: &Path, extra: &str) -> anyhow::Result<Mounted> {
    let (port, export, _) = address.nfs_export().ok_or_else(|| anyhow::anyhow!("no NFS export to mount: {address:?}"))?;
    let src = format!("{server}:{export}");
    let options = format!("{},port={port}{extra}", v.options());
    let mp_s = mp.to_string_lossy().into_owned();
    let args = [mp_s.as_str(), src.as_str(), options.as_str()];
    // `kernel nfs MP`: the cleanup script splits the rest into arguments.
    let detach = (crate::hosts::state_file::DETACH, vec!["nfs".into(), mp_s.clone(), String::new()]);
    let (res, mut cmd) = host.mount_command(MOUNT, &args, mp, ("kernel", "nfs"), detach)?;
    let (token, ()) = registry().create(res, || {
        crate::suites::fs::mounts::helper(&mut cmd).map(|_| ()).map_err(|e| anyhow::anyhow!("mounting {src} with {} on {}: {e:#}", v.name(), host.name()))
    })?;
    Ok(Mounted::made_elsewhere(mp, vec![token]))
}

/// For the micro and sweep suites: the export of the file peer at
/// `address` mounted with `v` on a mount point of its own on `host`
/// (`nosharecache`: its page cache is not the fs suite's mount's), and the
/// image file on it, which fio then drives with direct I/O. The tokens,
/// released newest first, unmount it and remove its mount point.
pub fn mount_image(host: &Host, server: Ipv4Addr, address: Address, v: NfsVersion) -> anyhow::Result<(String, Vec<Token>)> {
    let (_, export, file) = address.nfs_export().ok_or_else(|| anyhow::anyhow!("no NFS export to mount: {address:?}"))?;
    let name = format!("knfs-{}{}", v.name(), export.replace('/', "-"));
    let mp = host.run_path("/tmp", &name);
    // On this machine the mount point is made here (over ssh the mount
    // script makes it and the detach script removes it).
    let mut tokens = vec![];
    if host.on_this_machine() {
        tokens.push(registry().create(Resource::Dir(mp.clone()), || Ok(std::fs::create_dir_all(&mp)?))?.0);
    }
    match mount(host, server, address, v, &mp, ",nosharecache") {
        Ok(m) => tokens.extend(m.into_tokens()),
        Err(e) => {
            for t in tokens {
                let _ = registry().release(t);
            }
            return Err(e);
        }
    }
    Ok((mp.join(file).to_string_lossy().into_owned(), tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_the_version_and_the_server() {
        assert_eq!(NfsVersion::V3.key("ganesha").to_string(), "kernel-nfs3@ganesha");
        assert_eq!(NfsVersion::V41.key("knfsd").to_string(), "kernel-nfs4.1@knfsd");
        assert!(NfsVersion::V3.options().contains("nolock") && NfsVersion::V41.options().starts_with("vers=4.1"));
        // In one box there is no host to name.
        assert!(NfsVersion::V3.initiator(&Host::LocalNamespace("c".into())).ends_with("file system)"));
    }

    /// The state file's line for a mount is undone by the cleanup script's
    /// `nfs` case: a tmpfs stands in for the NFS mount (the script unmounts
    /// whatever is there, then removes the empty mount point).
    #[test]
    fn a_recorded_mount_is_undone_by_the_cleanup_script() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to mount");
            return;
        }
        let dir = std::env::temp_dir().join(format!("bwlab-knfs-unit-{}", std::process::id()));
        let mp = dir.join("mnt");
        std::fs::create_dir_all(&mp).unwrap();
        let st = std::process::Command::new("mount").args(["-t", "tmpfs", "bwlabtest"]).arg(&mp).status().unwrap();
        assert!(st.success());
        let state = dir.join("state-unit");
        std::fs::write(&state, format!("kernel nfs {}\n", mp.display())).unwrap();
        let st = std::process::Command::new("sh").args(["-c", crate::hosts::state_file::CLEANUP_SCRIPT, "sh"]).arg(&state).status().unwrap();
        assert!(st.success());
        let mounted = std::fs::read_to_string("/proc/self/mounts").unwrap().lines().any(|l| l.split(' ').nth(1) == Some(&*mp.to_string_lossy()));
        assert!(!mounted && !mp.exists() && !state.exists(), "the mount or its point is left");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
