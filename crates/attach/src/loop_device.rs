//! The loop device (direct I/O) on the volume's file: made by the daemon,
//! detached by it or by `umount`, and only ever while it still backs our
//! file (loop numbers are reused: never detach someone else's).

use crate::tool;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A loop device with direct I/O on `file`; its path (`/dev/loopN`).
pub fn create(file: &Path, readonly: bool) -> anyhow::Result<String> {
    let mut cmd = Command::new("losetup");
    cmd.args(["--direct-io=on", "--find", "--show"]);
    if readonly {
        cmd.arg("--read-only");
    }
    tool::run(cmd.arg(file))
}

/// Ask to detach `dev`. On a device that is still open (mounted) this only
/// sets autoclear: it detaches on its last close.
pub(crate) fn request_detach(dev: &str) {
    let _ = tool::run(Command::new("losetup").args(["-d", dev]));
}

/// Whether `dev` is still the loop device on a file under `dir`.
pub fn backs(dev: &str, dir: &Path) -> bool {
    let name = dev.trim_start_matches("/dev/");
    std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .is_ok_and(|f| Path::new(f.trim()).starts_with(dir))
}

/// Detach loop device `dev` from our file under `dir`, waiting up to
/// `limit` for anyone else to let go of it. LOOP_CLR_FD on a device that is
/// still open only marks it to detach on its last close; it is asked again
/// each second in case an earlier request failed (never once the number
/// backs someone else's file).
pub fn detach(dev: &str, dir: &Path, limit: Duration) -> bool {
    let t0 = Instant::now();
    while backs(dev, dir) {
        request_detach(dev);
        let left = limit.saturating_sub(t0.elapsed());
        if wait_released(dev, left.min(Duration::from_secs(1))) {
            return true;
        }
        if t0.elapsed() >= limit {
            return !backs(dev, dir);
        }
    }
    true
}

/// Wait until the loop device no longer holds a backing file.
pub fn wait_released(dev: &str, limit: Duration) -> bool {
    let name = dev.trim_start_matches("/dev/");
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if !Path::new(&format!("/sys/block/{name}/loop/backing_file")).exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Who keeps loop device `dev` open, for the error message: processes with
/// it open, and mount namespaces where a file system on it is still mounted
/// (a namespace copied from ours while it was mounted keeps its own copy of
/// the mount when the parent mount does not propagate unmounts). Empty, or
/// ` (open by PID ...; mounted in the mount namespace of PID ...)`.
pub fn holders(dev: &str) -> String {
    let Some(dev_no) = device_number(dev) else {
        return String::new();
    };
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return String::new();
    };
    let mut open_by = vec![];
    // (namespace, a process in it) for each namespace with the mount.
    let mut namespaces: Vec<(String, String)> = vec![];
    for p in procs.flatten() {
        let pid = p.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if has_open(&pid, Path::new(dev)) {
            open_by.push(format!("{pid} ({})", comm(&pid)));
        }
        let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/mnt")) else {
            continue;
        };
        let ns = ns.to_string_lossy().to_string();
        if !namespaces.iter().any(|(n, _)| *n == ns) && sees_mounted(&pid, &dev_no) {
            namespaces.push((ns, format!("{pid} ({})", comm(&pid))));
        }
    }
    let mut parts = vec![];
    if !open_by.is_empty() {
        parts.push(format!("open by PID {}", open_by.join(", ")));
    }
    if !namespaces.is_empty() {
        let pids: Vec<&str> = namespaces.iter().map(|(_, p)| p.as_str()).collect();
        parts.push(format!(
            "mounted in the mount namespace of PID {}",
            pids.join(", ")
        ));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join("; "))
    }
}

/// `MAJOR:MINOR` of block device `dev`, as mountinfo writes it.
fn device_number(dev: &str) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(dev).ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    let rdev = meta.rdev();
    Some(format!("{}:{}", libc::major(rdev), libc::minor(rdev)))
}

fn comm(pid: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_default()
}

/// Whether process `pid` has `dev` open.
fn has_open(pid: &str, dev: &Path) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == dev))
    })
}

/// Whether the mount namespace of process `pid` has device `dev_no` mounted.
fn sees_mounted(pid: &str, dev_no: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(2) == Some(dev_no)))
}
