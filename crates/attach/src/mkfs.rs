//! Running a mkfs beside dead FUSE mounts.
//!
//! Before it writes, mkfs.btrfs asks whether the device is mounted: it
//! walks the mount table and, for every file system on a loop device,
//! stats the loop's backing file. A backing file on a FUSE mount whose
//! connection is gone (aborted, or its daemon killed) answers ENOTCONN,
//! and mkfs.btrfs refuses ("cannot check mount status of /dev/loop1:
//! Transport endpoint is not connected"), whatever device it was given.
//! One such mount anywhere on the machine, say from an interrupted lab
//! that has not yet unmounted, or from a killed one, stops every btrfs
//! mkfs. A mount whose file system cannot even be reached cannot be the
//! fresh device being made, so the mkfs is run once more in a mount
//! namespace of its own with those mounts detached; the machine's mounts
//! are untouched.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Run the mkfs that `make` builds, through `run` (the caller's way of
/// running a tool, whose error carries the tool's message). When it fails
/// because a mount cannot be checked, run it once more with the mounts
/// found unreachable hidden from it, and say so on stderr.
pub fn run_mkfs<T>(make: impl Fn() -> Command, run: impl Fn(&mut Command) -> anyhow::Result<T>) -> anyhow::Result<T> {
    match run(&mut make()) {
        Err(e) if is_unreachable_mount_error(&format!("{e:#}")) => {
            let hidden = unreachable_mounts(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
            if hidden.is_empty() {
                return Err(e);
            }
            let list: Vec<String> = hidden.iter().map(|p| p.display().to_string()).collect();
            eprintln!("blockwire: mkfs cannot check mounts whose FUSE connection is gone; running it without them: {}", list.join(", "));
            let mut cmd = make();
            hide_mounts(&mut cmd, &hidden);
            run(&mut cmd)
        }
        other => other,
    }
}

/// Whether a tool's complaint is a stat that met a dead FUSE connection.
fn is_unreachable_mount_error(message: &str) -> bool {
    message.contains("Transport endpoint is not connected")
}

/// Mount points of the mounts a mkfs's check cannot stat, in the order
/// to detach them (the table's reverse, so one above another goes first):
/// FUSE mounts whose connection is gone, and file systems on loop devices
/// whose backing file is on one. Only called after a mkfs met one, so the
/// stats below touch only what that mkfs has just stat'ed itself.
fn unreachable_mounts(mountinfo: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for line in mountinfo.lines().rev() {
        let Some((point, fstype, source)) = mount_fields(line) else { continue };
        let probe = if fstype == "fuse" || fstype.starts_with("fuse.") {
            Some(point.clone())
        } else {
            loop_backing_file(&source)
        };
        if probe.is_some_and(|p| is_not_connected(&p)) {
            found.push(point);
        }
    }
    found
}

/// Mount point, file-system type and source of one mountinfo line.
fn mount_fields(line: &str) -> Option<(PathBuf, String, String)> {
    crate::mount_line(line).map(|m| (PathBuf::from(m.point), m.fstype, m.source))
}

/// The file behind loop device `dev` (`/dev/loopN`), from sysfs.
fn loop_backing_file(dev: &str) -> Option<PathBuf> {
    let name = dev.strip_prefix("/dev/")?;
    if !name.starts_with("loop") {
        return None;
    }
    let file = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(PathBuf::from(file.trim_end_matches('\n')))
}

fn is_not_connected(path: &Path) -> bool {
    std::fs::metadata(path).err().and_then(|e| e.raw_os_error()) == Some(libc::ENOTCONN)
}

/// Make `cmd` run in a mount namespace of its own (private, so nothing
/// propagates back) with `mounts` detached there.
fn hide_mounts(cmd: &mut Command, mounts: &[PathBuf]) {
    let paths: Vec<CString> = mounts.iter().filter_map(|p| CString::new(p.as_os_str().as_bytes()).ok()).collect();
    let root = CString::new("/").expect("no NUL");
    // SAFETY: between fork and exec only system calls run, on memory
    // prepared before the fork; nothing allocates or takes a lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(std::ptr::null(), root.as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            for p in &paths {
                // One already gone with a detached parent is fine.
                libc::umount2(p.as_ptr(), libc::MNT_DETACH);
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_fields_reads_point_type_and_escaped_source() {
        let line = "812 30 0:58 / /run/blockwire/fuse/a\\040b rw,nosuid - fuse blockwire:nfs://198.18.0.1:2049/x rw,user_id=0";
        let (p, t, s) = mount_fields(line).unwrap();
        assert_eq!(p, PathBuf::from("/run/blockwire/fuse/a b"));
        assert_eq!((t.as_str(), s.as_str()), ("fuse", "blockwire:nfs://198.18.0.1:2049/x"));
        let line = "900 812 7:0 / /tmp/bwlab-1-fs/mnt rw,relatime shared:5 - ext4 /dev/loop0 rw";
        let (p, t, s) = mount_fields(line).unwrap();
        assert_eq!((p, t.as_str(), s.as_str()), (PathBuf::from("/tmp/bwlab-1-fs/mnt"), "ext4", "/dev/loop0"));
        assert!(mount_fields("garbage").is_none());
    }

    #[test]
    fn only_dead_connections_trigger_the_second_try() {
        assert!(is_unreachable_mount_error("mkfs.btrfs failed: ERROR: cannot check mount status of /dev/loop1: Transport endpoint is not connected"));
        assert!(!is_unreachable_mount_error("mkfs.btrfs failed: ERROR: /dev/loop1 is mounted"));
    }
}
