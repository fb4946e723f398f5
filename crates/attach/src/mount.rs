//! `blockwire mount` and `umount`: a file system on the loop device of an
//! attach daemon, and undoing an attach (with its mount) in order.

use crate::loop_device;
use crate::process::DaemonProcess;
use crate::state::{log_path, AttachState, TargetHealth, STATE_DIR};
use crate::tool;
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A file system `mkfs` can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileSystem {
    Ext4,
    Xfs,
    Btrfs,
}

/// What `mount` mounts, and how.
pub struct MountOptions {
    /// Absolute, without symlinks.
    pub mountpoint: PathBuf,
    /// Make this file system first (destroys what is on the volume).
    pub mkfs: Option<FileSystem>,
    /// More arguments for mkfs, before the device.
    pub mkfs_options: Vec<String>,
    /// Passed to mount(8) as `-o`.
    pub options: Option<String>,
    pub readonly: bool,
    /// How long a failed mount waits for the loop device when undoing itself.
    pub loop_wait: Duration,
}

/// Start an attach daemon with a loop device (`spawn_daemon`, given its
/// FUSE directory: `spawn` of a command that records `mountpoint`), then
/// make the file system if asked and mount it; undone if that fails.
/// Returns the daemon's state.
pub fn mount(
    opts: &MountOptions,
    spawn_daemon: impl FnOnce(&Path) -> anyhow::Result<(AttachState, String)>,
) -> anyhow::Result<AttachState> {
    let mp = &opts.mountpoint;
    if !mp.is_dir() {
        bail!("{}: not a directory", mp.display());
    }
    if crate::is_mountpoint(mp) {
        bail!("{}: already a mount point", mp.display());
    }
    let fuse_dir = crate::mount_fuse_dir(mp);
    // An earlier attach for this mount point whose file system is gone (a
    // plain `umount`, or a `blockwire umount` that found the loop device
    // still busy) holds the FUSE directory: undo it first, or say why not.
    if let Some(old) = AttachState::at(&fuse_dir) {
        undo(&old, &fuse_dir, opts.loop_wait).with_context(|| {
            format!("{}: an earlier attach for this mount point is left and cannot be undone yet", mp.display())
        })?;
    }
    std::fs::create_dir_all(&fuse_dir)?;
    let (state, _) = spawn_daemon(&fuse_dir).inspect_err(|_| {
        let _ = std::fs::remove_dir(&fuse_dir);
    })?;
    if let Err(e) = make_and_mount(opts, state.loop_dev.as_deref().unwrap_or_default()) {
        let _ = undo(&state, mp, opts.loop_wait);
        return Err(e);
    }
    Ok(state)
}

fn make_and_mount(opts: &MountOptions, dev: &str) -> anyhow::Result<()> {
    let mkfs = match opts.mkfs {
        Some(FileSystem::Ext4) => Some(("mkfs.ext4", "-F")),
        Some(FileSystem::Xfs) => Some(("mkfs.xfs", "-f")),
        Some(FileSystem::Btrfs) => Some(("mkfs.btrfs", "-f")),
        None => None,
    };
    if let Some((program, force)) = mkfs {
        let make = || {
            let mut c = Command::new(program);
            c.args(["-q", force]).args(&opts.mkfs_options).arg(dev);
            c
        };
        crate::mkfs::run_mkfs(make, tool::run)?;
    }
    let mut cmd = Command::new("mount");
    if let Some(o) = &opts.options {
        cmd.args(["-o", o]);
    }
    if opts.readonly {
        cmd.arg("-r");
    }
    tool::run(cmd.arg(dev).arg(&opts.mountpoint))?;
    Ok(())
}

/// Undo the attach whose mount point or FUSE directory is `target`
/// (absolute); `loop_wait` bounds the wait for others to let go of the loop
/// device. False if nothing is attached there.
pub fn umount(target: &Path, loop_wait: Duration) -> anyhow::Result<bool> {
    let Some(state) = AttachState::at(target) else {
        return Ok(false);
    };
    undo(&state, target, loop_wait)?;
    Ok(true)
}

/// Undo an attach (and its mount) in order: file system, loop device, FUSE,
/// daemon. `shown` names it in errors.
fn undo(state: &AttachState, shown: &Path, loop_wait: Duration) -> anyhow::Result<()> {
    let dir = &state.dir;
    if let Some(mp) = &state.mountpoint {
        if crate::is_mountpoint(mp) {
            unmount_fs(mp, dir, state.pid)
                .with_context(|| format!("{}: still mounted", shown.display()))?;
        }
    }
    if let Some(dev) = state
        .loop_dev
        .as_deref()
        .filter(|l| loop_device::backs(l, dir))
    {
        if !loop_device::detach(dev, dir, loop_wait) {
            bail!(
                "{dev} is still in use{} after {} s; not detaching {} (try again later, or give umount a longer --wait)",
                loop_device::holders(dev),
                loop_wait.as_secs(),
                shown.display()
            );
        }
    }
    stop_daemon(state);
    let _ = std::fs::remove_file(state.path());
    let _ = std::fs::remove_file(log_path(state.pid));
    if dir.starts_with(Path::new(STATE_DIR).join("fuse")) {
        let _ = std::fs::remove_dir(dir);
    }
    Ok(())
}

/// End the daemon and its FUSE mount: SIGTERM (it flushes and unmounts);
/// if it is gone or stuck, abort the connection and unmount lazily; then
/// SIGKILL. Only the process the state file names is signalled.
fn stop_daemon(state: &AttachState) {
    let dir = &state.dir;
    let daemon = DaemonProcess::find(state);
    if let Some(d) = &daemon {
        // A dead target makes the daemon's flush fail after its timeout, so
        // allow a little longer than that.
        if d.signal(libc::SIGTERM) {
            d.wait_exit(Duration::from_secs(5));
        }
    }
    if crate::is_mountpoint(dir) {
        // Fail every pending request, then unmount.
        let _ = crate::abort_connection(dir);
        lazy_unmount(dir);
    }
    if let Some(d) = &daemon {
        if d.signal(libc::SIGKILL) {
            d.wait_exit(Duration::from_secs(5));
        }
    }
}

/// umount(8) the file system on the loop device. Its last writes may wait
/// for the target; if the attach daemon (PID `pid`) finds the target
/// unreachable meanwhile (after at most its --timeout), the FUSE connection
/// is aborted so those writes fail at once and the unmount completes.
/// Unmount the file system, asking again for a moment while umount says
/// the target is busy: the kernel also finds a mount busy while another
/// process copies the mount tree into a new mount namespace (`unshare -m`,
/// `ip netns exec`: the copy holds references to the peers of a shared
/// mount), which ends by itself; a file held open keeps it busy, and then
/// the error stands.
fn unmount_fs(mp: &Path, fuse_dir: &Path, pid: u32) -> anyhow::Result<()> {
    let mut tries = 0;
    loop {
        match unmount_fs_once(mp, fuse_dir, pid) {
            Err(e) if tries < 10 && e.to_string().contains("target is busy") => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            r => return r,
        }
    }
}

fn unmount_fs_once(mp: &Path, fuse_dir: &Path, pid: u32) -> anyhow::Result<()> {
    let mut child = Command::new("umount")
        .arg(mp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running umount")?;
    let mut aborted = false;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        let down = AttachState::read(&crate::state::state_path(pid))
            .is_ok_and(|s| s.target == Some(TargetHealth::Unreachable));
        if down && !aborted && crate::is_mountpoint(fuse_dir) {
            eprintln!(
                "blockwire: the target is unreachable; dropping writes it has not acknowledged"
            );
            let _ = crate::abort_connection(fuse_dir);
            aborted = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        bail!(
            "umount failed: {}",
            err.lines().next().unwrap_or("no message").trim()
        );
    }
    Ok(())
}

fn cpath(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

/// Unmount (not lazily: a busy file system says so instead of lingering).
pub(crate) fn unmount_fuse(dir: &Path) -> std::io::Result<()> {
    let c = cpath(dir);
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn lazy_unmount(dir: &Path) {
    let c = cpath(dir);
    // SAFETY: c is a valid NUL-terminated path.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}
