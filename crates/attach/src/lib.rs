//! `blockwire attach`: a remote volume as one regular file in a FUSE file
//! system. Reads and writes on the file become initiator I/O, fsync becomes
//! the protocol's flush and `fallocate(PUNCH_HOLE)` a discard. A loop device
//! on that file (with direct I/O) gives the kernel a block device, with no
//! kernel initiator involved. See README.md for why fuser.

mod fs;
mod reconnect;

pub use fs::{VolumeFs, MAX_REQUEST};
pub use reconnect::Reconnecting;

use bw_initiator::BlockClient;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("{0}: {1}")]
    Mount(PathBuf, std::io::Error),
    #[error("{0} is not an empty directory")]
    Busy(PathBuf),
    #[error("{0}: {1}")]
    Sys(&'static str, std::io::Error),
}

/// What the FUSE file system looks like.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// Name of the one file (default `disk`).
    pub file_name: String,
    pub readonly: bool,
    /// Threads reading /dev/fuse (each hands requests to the runtime).
    pub fuse_threads: usize,
    /// Shown as the mount's source in /proc/mounts.
    pub source: String,
}

/// Keep the daemon out of the reclaim loop it serves: writes to the loop
/// device can be the very writeback that reclaim waits for, so the daemon
/// must neither be throttled as a normal writer (PR_SET_IO_FLUSHER) nor have
/// its own pages swapped out (mlockall; ONFAULT so idle buffers cost nothing).
/// linux/prctl.h (not exported by the libc crate).
const PR_SET_IO_FLUSHER: libc::c_int = 57;

pub fn prepare_process() -> Result<(), AttachError> {
    // SAFETY: prctl and mlockall take plain integers and touch no memory of ours.
    unsafe {
        // Needs CAP_SYS_RESOURCE, which containers often drop: warn, go on.
        if libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) != 0 {
            log::warn!(
                "prctl(PR_SET_IO_FLUSHER): {}; under memory pressure writeback through this attach may stall",
                std::io::Error::last_os_error()
            );
        }
        if libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) != 0 {
            return Err(AttachError::Sys(
                "mlockall",
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

/// A mounted FUSE file system; dropping it (or [`Attached::unmount`])
/// unmounts it.
pub struct Attached {
    session: fuser::BackgroundSession,
    dir: PathBuf,
}

/// Mount the FUSE file system for `client` on `dir`. Returns once the kernel
/// has completed the FUSE handshake, so the file is usable.
pub fn attach(
    client: Arc<dyn BlockClient>,
    rt: tokio::runtime::Handle,
    dir: &Path,
    opts: &AttachOptions,
) -> Result<Attached, AttachError> {
    let empty = std::fs::read_dir(dir)
        .map(|mut d| d.next().is_none())
        .map_err(|e| AttachError::Mount(dir.to_path_buf(), e))?;
    if !empty || is_mountpoint(dir) {
        return Err(AttachError::Busy(dir.to_path_buf()));
    }
    let fs = VolumeFs::new(client, rt, opts.file_name.clone(), opts.readonly);
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(opts.source.replace(',', "_")),
        fuser::MountOption::Subtype("blockwire".into()),
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
        fuser::MountOption::NoExec,
        if opts.readonly {
            fuser::MountOption::RO
        } else {
            fuser::MountOption::RW
        },
    ];
    config.n_threads = Some(opts.fuse_threads.max(1));
    config.clone_fd = true;
    let session = fuser::Session::new(fs, dir, &config)
        .and_then(fuser::Session::spawn)
        .map_err(|e| AttachError::Mount(dir.to_path_buf(), e))?;
    Ok(Attached {
        session,
        dir: dir.to_path_buf(),
    })
}

impl Attached {
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// Unmount lazily (MNT_DETACH) and wait for the session to end.
    pub fn unmount(self) -> std::io::Result<()> {
        self.session.umount_and_join()
    }
    /// Wait for the session to end after the file system was unmounted (or
    /// its connection aborted) by other means.
    pub fn join(self) -> std::io::Result<()> {
        self.session.join()
    }
}

/// Whether `dir` is the root of a mount (its device differs from its parent's).
pub fn is_mountpoint(dir: &Path) -> bool {
    let (Ok(me), Ok(parent)) = (std::fs::metadata(dir), std::fs::metadata(dir.join(".."))) else {
        return false;
    };
    me.dev() != parent.dev() || me.ino() == parent.ino()
}

/// Abort the FUSE connection mounted at `dir` (every pending and future
/// request fails with ENOTCONN), for unmounting while the daemon cannot answer.
pub fn abort_connection(dir: &Path) -> std::io::Result<()> {
    let dev = std::fs::metadata(dir)?.dev();
    // The connection directory is named after the mount's device number.
    let minor = ((dev & 0xff) | ((dev >> 12) & !0xff)) as u32;
    std::fs::write(format!("/sys/fs/fuse/connections/{minor}/abort"), "1")
}
