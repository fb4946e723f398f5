//! Putting a file system on a subject for the fs suite, tracked for
//! cleanup: `blockwire mount URL MP --mkfs ext4` in the client namespace for
//! a networked subject, a loop device on the backing file with ext4 for the
//! local baseline.
//!
//! `blockwire mount` runs under `nsenter --net` (not `ip netns exec`, which
//! also gives its command a mount namespace of its own): the attach daemon
//! then talks through the client namespace's veth while the FUSE mount, the
//! loop device and ext4 land in the lab's mount namespace, where the
//! workloads run and where cleanup can see them.
//!
//! The mount point lives in a [`SharedDir`], so the copies of a mount that
//! other programs' new mount namespaces take are unmounted with it, and a
//! released loop device is waited for (bounded) rather than assumed gone.

use crate::cleanup::{attach_daemon_of, registry, Resource, Token};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;


/// Run a helper command (mount, mkfs, losetup) to completion, in its own
/// process group so a terminal's Ctrl-C reaches only the lab, which then
/// undoes things in order.
pub fn helper(cmd: &mut Command) -> anyhow::Result<String> {
    cmd.process_group(0);
    let out = cmd
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let why = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message")
            .trim()
            .to_string();
        anyhow::bail!("{} failed: {why}", cmd.get_program().to_string_lossy());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The directory of the fs suite of the lab with process ID `pid`: a
/// [`SharedDir`] holding the mount point.
pub fn fs_dir(pid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/bwlab-{pid}-fs"))
}

/// Where the fs suite of the lab with process ID `pid` mounts each subject
/// in turn (inside [`fs_dir`]).
pub fn fs_mountpoint(pid: u32) -> PathBuf {
    fs_dir(pid).join("mnt")
}

/// A directory bind-mounted on itself with shared propagation, tracked
/// (both the directory and the bind), for the mount points to live in.
///
/// Any program that makes a mount namespace while a subject's ext4 is
/// mounted (`ip netns exec` does, and so do `unshare -m`, container
/// runtimes and services with a private /tmp) gets a copy of that mount.
/// Where `/` is a private mount (containers, many VMs; systemd hosts make
/// it shared) nothing tells the copy about our unmount: ext4 stays mounted
/// there, holding the loop device, until that namespace's last process
/// exits. `umount` and `losetup -d` still succeed here, so a local
/// baseline left its loop device attached, and `blockwire umount` could
/// only wait and fail. Under a shared mount the copies are its peers or
/// slaves, and an unmount here reaches them at once.
pub struct SharedDir {
    pub path: PathBuf,
    tokens: Vec<Token>,
}

impl SharedDir {
    pub fn create(dir: &Path) -> anyhow::Result<SharedDir> {
        let (made, ()) = registry().create(Resource::Dir(dir.to_path_buf()), || {
            Ok(std::fs::create_dir_all(dir)?)
        })?;
        let bound = registry().create(Resource::Mount(dir.to_path_buf()), || {
            helper(Command::new("mount").arg("--bind").arg(dir).arg(dir))?;
            helper(Command::new("mount").arg("--make-shared").arg(dir)).map(|_| ())
        });
        match bound {
            Ok((t, ())) => Ok(SharedDir {
                path: dir.to_path_buf(),
                tokens: vec![made, t],
            }),
            Err(e) => {
                let _ = registry().release(made);
                Err(e.context(format!("making {} a shared mount", dir.display())))
            }
        }
    }

    /// Unmount the bind and remove the directory (empty by then).
    pub fn release(self) -> anyhow::Result<()> {
        release_all(self.tokens)
    }
}

fn release_all(tokens: Vec<Token>) -> anyhow::Result<()> {
    let mut first = Ok(());
    for t in tokens.into_iter().rev() {
        if let Err(e) = registry().release(t) {
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}

/// A file system mounted for one subject.
pub struct Mounted {
    pub mountpoint: PathBuf,
    /// The attach daemon (the protocol initiator) of a `blockwire mount`.
    pub daemon_pid: Option<u32>,
    tokens: Vec<Token>,
}

impl Mounted {
    pub fn new(mountpoint: PathBuf, daemon_pid: Option<u32>, tokens: Vec<Token>) -> Mounted {
        Mounted { mountpoint, daemon_pid, tokens }
    }

    /// A file system another module mounted (a kernel NFS mount), undone
    /// by releasing `tokens` in reverse.
    pub fn made_elsewhere(mountpoint: &Path, tokens: Vec<Token>) -> Mounted {
        Mounted::new(mountpoint.to_path_buf(), None, tokens)
    }

    /// Unmount (and detach the loop device, FUSE and the daemon).
    pub fn release(self) -> anyhow::Result<()> {
        release_all(self.tokens)
    }

    /// What undoes it, in the order made (release newest first).
    pub fn into_tokens(self) -> Vec<Token> {
        self.tokens
    }
}

/// `blockwire mount URL MP --mkfs ext4` from the client namespace.
pub fn mount_remote(exe: &Path, client: &crate::hosts::host::Host, url: &str, mp: &Path) -> anyhow::Result<Mounted> {
    mount_remote_as(exe, client, url, mp, crate::suites::fs::fs_kind::FsKind::Ext4, 0)
}

/// `blockwire mount URL MP --mkfs TYPE` from the client namespace, with
/// `kind`'s mkfs and mount options (`size`: the volume's, for them).
pub fn mount_remote_as(exe: &Path, client: &crate::hosts::host::Host, url: &str, mp: &Path, kind: crate::suites::fs::fs_kind::FsKind, size: u64) -> anyhow::Result<Mounted> {
    let res = Resource::BlockwireMount {
        exe: exe.to_path_buf(),
        mountpoint: mp.to_path_buf(),
    };
    let (token, ()) = registry().create(res, || {
        let mut cmd = client.command_sharing_mounts(exe);
        cmd.args(["mount", url])
            .arg(mp)
            .args(["--mkfs", kind.mkfs_type(), "-o", kind.mount_options(), "--timeout", "30"]);
        for o in kind.mkfs_options(size) {
            cmd.arg(format!("--mkfs-option={o}"));
        }
        helper(&mut cmd).map(|_| ())
    })?;
    Ok(Mounted {
        mountpoint: mp.to_path_buf(),
        daemon_pid: attach_daemon_of(mp),
        tokens: vec![token],
    })
}

/// A loop device on `backing` (direct I/O, as `blockwire attach --loop`
/// makes it), tracked. Returns its token and device path.
pub fn loop_device(backing: &Path) -> anyhow::Result<(Token, String)> {
    let intent = Resource::Loop { dev: String::new(), backing: backing.to_path_buf() };
    registry().create_tracked(intent, || {
        let dev = helper(
            Command::new("losetup")
                .args(["--find", "--show", "--direct-io=on"])
                .arg(backing),
        )?;
        anyhow::ensure!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
        Ok((
            Resource::Loop {
                dev: dev.clone(),
                backing: backing.to_path_buf(),
            },
            dev,
        ))
    })
}

/// ext4 on the local loop device `dev` (from [`loop_device`]), mounted on `mp`.
pub fn mount_local(dev: &str, loop_token: Token, mp: &Path) -> anyhow::Result<Mounted> {
    mount_local_as(dev, loop_token, mp, crate::suites::fs::fs_kind::FsKind::Ext4, 0)
}

/// `kind` on the local loop device `dev`, mounted on `mp` (`size`: the
/// volume's, for mkfs's options).
pub fn mount_local_as(dev: &str, loop_token: Token, mp: &Path, kind: crate::suites::fs::fs_kind::FsKind, size: u64) -> anyhow::Result<Mounted> {
    let force = if kind.mkfs_type() == "ext4" { "-F" } else { "-f" };
    let make = || {
        let mut c = Command::new(kind.mkfs_program());
        c.args(["-q", force]).args(kind.mkfs_options(size)).arg(dev);
        c
    };
    let made = bw_attach::run_mkfs(make, helper);
    if let Err(e) = made {
        let _ = registry().release(loop_token);
        return Err(e);
    }
    let mounted = registry().create(Resource::Mount(mp.to_path_buf()), || {
        helper(
            Command::new("mount")
                .args(["-o", kind.mount_options(), dev])
                .arg(mp),
        )
        .map(|_| ())
    });
    match mounted {
        Ok((t, ())) => Ok(Mounted {
            mountpoint: mp.to_path_buf(),
            daemon_pid: None,
            tokens: vec![loop_token, t],
        }),
        Err(e) => {
            let _ = registry().release(loop_token);
            Err(e)
        }
    }
}

/// Remove what a workload left in its directory and write back the rest,
/// so the next workload starts from the same file system state.
pub fn clean_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("cleaning {}: {e}", dir.display()))?;
    }
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cleanup::loop_backing;
    use std::time::{Duration, Instant};

    /// Another program makes a mount namespace while the local baseline's
    /// ext4 is mounted (`ip netns exec` in a test beside this one, a
    /// container, a service with a private /tmp): its copy of the mount
    /// must not keep the loop device. Where `/` is private this left the
    /// device attached after a release that reported success.
    #[test]
    fn release_reaches_a_mount_namespace_made_while_mounted() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let base = std::env::temp_dir().join(format!("bwlab-test-nscopy-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        let backing = base.join("img");
        std::fs::File::create(&backing).unwrap().set_len(64 << 20).unwrap();
        // `ip netns exec` makes its copy a slave; `unshare -m` keeps the propagation.
        for propagation in ["slave", "unchanged"] {
            // As the lab lays out its fs directory.
            let shared = SharedDir::create(&base.join("fs")).unwrap();
            let shared_path = shared.path.clone();
            let mp = shared_path.join("mnt");
            std::fs::create_dir_all(&mp).unwrap();
            let (loop_token, dev) = loop_device(&backing).unwrap();
            let mounted = mount_local(&dev, loop_token, &mp).unwrap();
            let mut copy = Command::new("unshare")
                .args(["--mount", "--propagation", propagation, "sleep", "60"])
                .spawn()
                .unwrap();
            let info = format!("/proc/{}/mountinfo", copy.id());
            let mp_s = mp.to_string_lossy().into_owned();
            let has_copy = || std::fs::read_to_string(&info).is_ok_and(|i| i.contains(&format!(" {mp_s} ")));
            let t0 = Instant::now();
            while !has_copy() && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let had_copy = has_copy();
            let released = mounted.release();
            let attached = loop_backing(&dev);
            let copy_left = has_copy();
            let _ = copy.kill();
            let _ = copy.wait();
            let _ = std::fs::remove_dir(&mp);
            let shared_released = shared.release();
            assert!(had_copy, "{propagation}: the new namespace never had its copy of {mp_s}");
            assert!(released.is_ok(), "{propagation}: release beside a namespace copy: {released:?}");
            assert_eq!(attached, None, "{propagation}: {dev} left attached after a release that succeeded");
            assert!(!copy_left, "{propagation}: ext4 still mounted in the other namespace");
            assert!(shared_released.is_ok(), "{propagation}: {shared_released:?}");
            assert!(!bw_attach::is_mountpoint(&shared_path) && !shared_path.exists(), "{propagation}: fs directory left");
            let listed = helper(Command::new("losetup").arg("-a")).unwrap();
            assert!(!listed.contains(&*backing.to_string_lossy()), "{propagation}: losetup -a: {listed}");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }
}
