//! The attach daemon as another process sees it: found from its state file
//! and held by a pidfd, so signals reach that process and never one that
//! got its PID after it ended (state files outlive daemons that were killed).

use crate::state::AttachState;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

pub struct DaemonProcess {
    pidfd: OwnedFd,
}

impl DaemonProcess {
    /// The daemon `state` records, if the process with its PID still is that
    /// daemon: owned by root and started at the recorded time (state files
    /// without one: running `blockwire attach` with its FUSE directory among
    /// its arguments).
    pub fn find(state: &AttachState) -> Option<DaemonProcess> {
        let pid = i32::try_from(state.pid).ok().filter(|&p| p > 0)?;
        // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd is a descriptor we just opened and own.
        let d = DaemonProcess {
            pidfd: unsafe { OwnedFd::from_raw_fd(fd as i32) },
        };
        let looks_right = is_root_owned(pid)
            && match state.start {
                Some(start) => process_start(state.pid) == Some(start),
                None => runs_attach_of(pid, &state.dir),
            };
        // Alive after /proc was read: the PID was not reused in between,
        // so what was read describes the process the pidfd holds.
        (looks_right && d.signal(0)).then_some(d)
    }

    /// Whether the signal was sent (false once the process has ended).
    pub fn signal(&self, sig: i32) -> bool {
        // SAFETY: pidfd_send_signal with a null siginfo sends `sig` as kill(2) would.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            ) == 0
        }
    }

    /// Wait up to `limit` for the process to end (a zombie has ended).
    pub fn wait_exit(&self, limit: Duration) -> bool {
        let mut p = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let t0 = Instant::now();
        loop {
            let left = limit.saturating_sub(t0.elapsed());
            // SAFETY: one valid pollfd; a pidfd polls readable once the process exits.
            let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            if n > 0 {
                return true;
            }
            let interrupted =
                n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
            if !interrupted || t0.elapsed() >= limit {
                return false;
            }
        }
    }
}

fn is_root_owned(pid: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == 0)
}

/// When process `pid` started, in clock ticks after boot (/proc/PID/stat
/// field 22): with the PID, it names one process for as long as the system runs.
pub fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the parenthesised command name start at field 3.
    stat.rsplit_once(") ")?
        .1
        .split(' ')
        .nth(22 - 3)?
        .parse()
        .ok()
}

/// Whether process `pid` runs `blockwire attach` with `dir` among its arguments.
fn runs_attach_of(pid: i32, dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    args.get(1) == Some(&&b"attach"[..]) && args.contains(&dir.as_os_str().as_bytes())
}
