//! `blockwire attach`: a remote volume as one regular file in a FUSE file
//! system. Reads and writes on the file become initiator I/O, fsync becomes
//! the protocol's flush and `fallocate(PUNCH_HOLE)` a discard. A loop device
//! on that file (with direct I/O) gives the kernel a block device, with no
//! kernel initiator involved.
//!
//! fuser mounts and answers INIT; the requests after that are served by our
//! own loop (`dev.rs`, or `ring.rs` for FUSE over io_uring) on one thread
//! that also runs the initiator. README.md says why; the numbers are in
//! docs/notes/2026-11-24-attach.md.
//!
//! The lifecycle around it is here too: the daemon (`daemon`: attach, loop
//! device, state file, detach on a signal), its state file (`state`), and
//! `mount`/`umount` (`mount`: mkfs and mount on the loop device, undo in
//! order, signalling only the daemon the state file names: `process`).

mod abi;
pub mod daemon;
mod dev;
mod disk;
mod fs;
mod loop_device;
mod mkfs;
mod mount;
mod null;
mod process;
mod reconnect;
mod ring;
mod state;
mod tool;

pub use daemon::{DaemonOptions, Running};
pub use fs::MAX_REQUEST;
pub use mkfs::run_mkfs;
pub use mount::{mount, umount, FileSystem, MountOptions};
pub use reconnect::Reconnecting;
pub use ring::enabled as uring_enabled;
pub use state::{log_path, state_path, AttachState, TargetHealth, STATE_DIR};

use bw_initiator::{BlockClient, ConnectOptions};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("{0}: {1}")]
    Mount(PathBuf, std::io::Error),
    #[error("{0} is not an empty directory")]
    Busy(PathBuf),
    #[error("{0}: {1}")]
    Sys(&'static str, std::io::Error),
    /// The URL and why connecting failed, causes included.
    #[error("{0}")]
    Connect(String),
    #[error("{0}: no answer in {1:?}")]
    NoAnswer(String, std::time::Duration),
    #[error("FUSE over io_uring: {0}")]
    Uring(String),
    #[error("--file {0:?}: {1}")]
    FileName(String, &'static str),
}

/// How requests travel between the kernel and this daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// read(2)/write(2) on /dev/fuse.
    Dev,
    /// FUSE over io_uring with this many entries per CPU queue.
    Uring { per_queue: usize },
}

/// What the FUSE file system looks like.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// Name of the one file (default `disk`).
    pub file_name: String,
    pub readonly: bool,
    /// Shown as the mount's source in /proc/mounts.
    pub source: String,
    pub transport: Transport,
}

/// Keep the daemon out of the reclaim loop it serves: writes to the loop
/// device can be the very writeback that reclaim waits for, so the daemon
/// must neither be throttled as a normal writer (PR_SET_IO_FLUSHER) nor have
/// its own pages swapped out (mlockall; ONFAULT so idle buffers cost nothing).
/// linux/prctl.h (not exported by the libc crate).
const PR_SET_IO_FLUSHER: libc::c_int = 57;

///
/// Call before `attach` (the flags are inherited by the serving thread).
/// PR_SET_IO_FLUSHER needs CAP_SYS_RESOURCE, which containers often drop:
/// then this returns a warning for the caller to show once attached (a
/// refused attach should say one thing: why it was refused).
pub fn prepare_process() -> Result<Option<String>, AttachError> {
    let mut warning = None;
    // SAFETY: prctl and mlockall take plain integers and touch no memory of ours.
    unsafe {
        if libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) != 0 {
            warning = Some(format!(
                "prctl(PR_SET_IO_FLUSHER): {}; under memory pressure writeback through this attach may stall",
                std::io::Error::last_os_error()
            ));
        }
        if libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) != 0 {
            return Err(AttachError::Sys(
                "mlockall",
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(warning)
}

/// Answers INIT for fuser's handshake; nothing else reaches it.
struct Init {
    uring: bool,
}

impl fuser::Filesystem for Init {
    fn init(
        &mut self,
        _req: &fuser::Request,
        config: &mut fuser::KernelConfig,
    ) -> std::io::Result<()> {
        use fuser::InitFlags as F;
        // ASYNC_DIO: loop's direct I/O arrives as parallel requests instead
        // of one at a time; MAX_PAGES: requests up to MAX_REQUEST bytes.
        let mut wanted = F::FUSE_ASYNC_DIO | F::FUSE_ASYNC_READ | F::FUSE_MAX_PAGES;
        if self.uring {
            wanted |= F::FUSE_OVER_IO_URING;
        }
        let offered = config.capabilities();
        if self.uring && !offered.contains(F::FUSE_OVER_IO_URING) {
            self.uring = false;
        }
        let _ = config.add_capabilities(wanted & offered);
        let _ = config.set_max_write(MAX_REQUEST);
        let _ = config.set_max_readahead(MAX_REQUEST);
        // Loop keeps up to 128 requests in flight; each holds a 1 MiB buffer
        // here while it runs.
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }
}

/// A mounted FUSE file system served by its own thread.
pub struct Attached {
    thread: std::thread::JoinHandle<std::io::Result<()>>,
    dir: PathBuf,
    client: Arc<Reconnecting>,
    transport: Transport,
}

/// What the serving thread reports once the file is usable.
type Ready = Result<(Arc<Reconnecting>, Transport), AttachError>;

/// Connect to `url` and mount its volume as a file in `dir`. Returns once
/// the kernel has completed the FUSE handshake, so the file is usable. The
/// initiator and the request loop share one thread (see dev.rs for why).
pub fn attach(
    url: &str,
    connect: ConnectOptions,
    dir: &Path,
    opts: &AttachOptions,
) -> Result<Attached, AttachError> {
    check_dir(dir)?;
    let (tx, rx) = std::sync::mpsc::channel::<Ready>();
    let (url, dir_buf, opts2) = (url.to_string(), dir.to_path_buf(), opts.clone());
    let thread = std::thread::Builder::new()
        .name("bw-attach".into())
        .spawn(move || serve_thread(&url, connect, &dir_buf, &opts2, tx))
        .map_err(|e| AttachError::Sys("starting the attach thread", e))?;
    match rx.recv() {
        Ok(Ok((client, transport))) => Ok(Attached {
            thread,
            dir: dir.to_path_buf(),
            client,
            transport,
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let r = thread.join();
            Err(AttachError::Sys(
                "attach thread",
                match r {
                    Ok(Err(e)) => e,
                    _ => std::io::Error::other("ended before it was ready"),
                },
            ))
        }
    }
}

fn serve_thread(
    url: &str,
    connect: ConnectOptions,
    dir: &Path,
    opts: &AttachOptions,
    ready: std::sync::mpsc::Sender<Ready>,
) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let timeout = connect.timeout;
        let client = match tokio::time::timeout(timeout, Reconnecting::connect(url, connect)).await
        {
            Ok(Ok(c)) => Arc::new(c),
            Ok(Err(e)) => {
                let _ = ready.send(Err(AttachError::Connect(chain(url, &e))));
                return Ok(());
            }
            Err(_) => {
                let _ = ready.send(Err(AttachError::NoAnswer(redact(url), timeout)));
                return Ok(());
            }
        };
        let want_uring = matches!(opts.transport, Transport::Uring { .. });
        let session = match fuse_session(dir, opts, want_uring) {
            Ok(s) => s,
            Err(e) => {
                let _ = client.close().await;
                let _ = ready.send(Err(e));
                return Ok(());
            }
        };
        let fd = match std::os::fd::AsFd::as_fd(&session).try_clone_to_owned() {
            Ok(fd) => fd,
            Err(e) => {
                let _ = ready.send(Err(AttachError::Sys("dup /dev/fuse", e)));
                return Ok(());
            }
        };
        let fs = fs::VolumeFs::new(
            opts.file_name.clone(),
            opts.readonly,
            client.size_bytes(),
            client.block_size() as u64,
        );
        let disk = Rc::new(disk::Disk::new(client.clone() as Arc<dyn BlockClient>));
        let r = match opts.transport {
            Transport::Uring { per_queue } => {
                // Until the ring is ready (and for FORGET/INTERRUPT after),
                // the kernel still uses /dev/fuse: serve both.
                let classic = fd.try_clone()?;
                let dev_loop =
                    tokio::task::spawn_local(dev::serve(classic, fs.clone(), disk.clone()));
                let _ = ready.send(Ok((client.clone(), opts.transport)));
                let r = ring::serve(fd, fs, disk, per_queue, MAX_REQUEST as usize).await;
                dev_loop.abort();
                r
            }
            Transport::Dev => {
                let _ = ready.send(Ok((client.clone(), opts.transport)));
                dev::serve(fd, fs, disk).await
            }
        };
        // Unmounted (or aborted): the session's drop unmounts if still mounted.
        drop(session);
        // Log out here, on the runtime that carries the connection: once this
        // thread ends, the connection's tasks are gone, and a close from
        // another thread waited its full logout timeout (5 s) for an answer
        // that could no longer be read.
        let _ = client.close().await;
        r
    })
}

/// `url` with an iSCSI CHAP secret (`USER%SECRET@`) hidden, for anything
/// printed or stored.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@'), url.find('%')) {
        (Some(s), Some(at), Some(p)) if s < p && p < at => {
            format!("{}%***{}", &url[..p], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// "URL: error: cause: cause", one line, with the URL's secret hidden
/// wherever it appears (causes may quote the URL).
fn chain(url: &str, e: &dyn std::error::Error) -> String {
    let mut s = format!("{url}: {e}");
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&format!(": {c}"));
        cur = c.source();
    }
    s.replace(url, &redact(url))
}

fn fuse_session(
    dir: &Path,
    opts: &AttachOptions,
    uring: bool,
) -> Result<fuser::Session<Init>, AttachError> {
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
    if uring && !ring::enabled() {
        return Err(AttachError::Uring(
            "the fuse module has it off (echo Y > /sys/module/fuse/parameters/enable_uring)".into(),
        ));
    }
    fuser::Session::new(Init { uring }, dir, &config)
        .map_err(|e| AttachError::Mount(dir.to_path_buf(), e))
}

impl Attached {
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// The client the file system serves from (for a flush before detaching).
    pub fn client(&self) -> Arc<dyn BlockClient> {
        self.client.clone()
    }
    /// False while the target is known to be unreachable: a request found
    /// the connection broken and no reconnect has succeeded since.
    pub fn target_reachable(&self) -> bool {
        self.client.connected()
    }
    pub fn transport(&self) -> Transport {
        self.transport
    }
    /// Wait for the serving thread to end after the file system was
    /// unmounted (or its connection aborted).
    pub fn join(self) -> std::io::Result<()> {
        self.thread
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("attach thread panicked")))
    }
}

/// The directory `blockwire mount` attaches the volume under for the file
/// system mounted on `mountpoint` (absolute): one per mount point, named
/// after it with every character but ASCII letters and digits folded to
/// `_` (`/tmp/x-fs` -> `/run/blockwire/fuse/_tmp_x_fs`). Leak checks use
/// it too, so it stays the one place that says how the name is made.
pub fn mount_fuse_dir(mountpoint: &Path) -> PathBuf {
    let key: String = mountpoint
        .to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    Path::new(STATE_DIR).join("fuse").join(key)
}

/// `name` can be the volume's file: one plain name inside the attach
/// directory. The daemon runs as root and hands `DIR/NAME` to losetup, so a
/// `/` or a `.`/`..` would point it at a file outside the FUSE mount.
pub fn check_file_name(name: &str) -> Result<(), AttachError> {
    let why = if name.is_empty() {
        "empty"
    } else if name.contains('/') {
        "must be a plain file name, without '/'"
    } else if name == "." || name == ".." {
        "must be a plain file name, not '.' or '..'"
    } else if name.contains('\0') {
        "contains a NUL byte"
    } else if name.len() > 255 {
        "longer than 255 bytes"
    } else {
        return Ok(());
    };
    Err(AttachError::FileName(name.to_string(), why))
}

/// `dir` can take an attach: an empty directory that is not a mount point.
pub fn check_dir(dir: &Path) -> Result<(), AttachError> {
    let empty = std::fs::read_dir(dir)
        .map(|mut d| d.next().is_none())
        .map_err(|e| AttachError::Mount(dir.to_path_buf(), e))?;
    if !empty || is_mountpoint(dir) {
        return Err(AttachError::Busy(dir.to_path_buf()));
    }
    Ok(())
}

/// Whether a file system is mounted on `dir` (an absolute path without
/// symlinks, as the state files record it).
pub fn is_mountpoint(dir: &Path) -> bool {
    mount_at(dir).is_some()
}

/// A mount as /proc/self/mountinfo lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The minor of the mount's device number: for FUSE, the connection's
    /// directory under /sys/fs/fuse/connections.
    pub minor: u32,
    /// `fuse`, `fuse.blockwire`, `ext4`, ...
    pub fstype: String,
}

/// The topmost mount on exactly `dir`, from /proc/self/mountinfo. Reading
/// the table never touches the mounted file system, so it answers while a
/// FUSE daemon does not: a stat of the mount point would wait for the
/// daemon, forever if it hangs.
pub fn mount_at(dir: &Path) -> Option<MountEntry> {
    let dir = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(dir)
    };
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse_mountinfo(&table, &dir.to_string_lossy())
}

/// The last (topmost) line of `table` (mountinfo format) mounted on `dir`.
fn parse_mountinfo(table: &str, dir: &str) -> Option<MountEntry> {
    table.lines().rev().filter_map(mount_line).find(|m| m.point == dir).map(|m| MountEntry { minor: m.minor, fstype: m.fstype })
}

/// The fields of one mountinfo line that the lifecycle reads, unescaped.
pub(crate) struct MountLine {
    pub point: String,
    pub minor: u32,
    pub fstype: String,
    pub source: String,
}

pub(crate) fn mount_line(line: &str) -> Option<MountLine> {
    // ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
    let mut f = line.split(' ');
    let dev = f.nth(2)?;
    let point = unescape_mountinfo(f.nth(1)?);
    let minor = dev.split_once(':')?.1.parse().ok()?;
    let mut tail = line.split(" - ").nth(1)?.split(' ');
    let fstype = tail.next()?.to_string();
    let source = unescape_mountinfo(tail.next()?);
    Some(MountLine { point, minor, fstype, source })
}

/// mountinfo writes space, tab, newline and backslash in paths as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

const FUSECTL: &str = "/sys/fs/fuse/connections";

/// Abort the FUSE connection mounted at `dir` (every pending and future
/// request fails with ENOTCONN), for unmounting while the daemon cannot
/// answer. Found through the mount table, never by a stat of `dir` (which
/// would wait for the daemon); mounts the fusectl file system first if
/// nobody has.
pub fn abort_connection(dir: &Path) -> std::io::Result<()> {
    let m = mount_at(dir).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{}: nothing mounted", dir.display()),
        )
    })?;
    if m.fstype != "fuse" && !m.fstype.starts_with("fuse.") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: {} is not a FUSE file system", dir.display(), m.fstype),
        ));
    }
    // The connection directory is named after the mount's device number
    // (major 0: its minor).
    let abort = format!("{FUSECTL}/{}/abort", m.minor);
    if !Path::new(&abort).exists() {
        let c = |s: &str| std::ffi::CString::new(s).unwrap_or_default();
        let (src, target, fstype) = (c("fusectl"), c(FUSECTL), c("fusectl"));
        // SAFETY: valid NUL-terminated strings; no data argument.
        unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
    }
    std::fs::write(abort, "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    // In /proc/self/mountinfo's format: a FUSE attach, ext4 on its loop
    // device, and two mounts stacked on a path with a space.
    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
60 22 0:53 / /run/blockwire/fuse/_tmp_bwlab_42_fs rw,nosuid,nodev,noexec,relatime shared:30 - fuse.blockwire blockwire:iscsi://198.18.0.1/iqn.x rw,user_id=0,group_id=0
61 22 7:3 / /tmp/bwlab-42-fs rw,relatime shared:31 - ext4 /dev/loop3 rw
62 22 0:54 / /mnt/a\\040b rw,relatime shared:32 - tmpfs none rw
63 62 0:55 / /mnt/a\\040b rw,relatime shared:33 - fuse.sshfs x rw
";

    #[test]
    fn mounts_are_found_in_the_table_without_touching_them() {
        let fuse = parse_mountinfo(MOUNTINFO, "/run/blockwire/fuse/_tmp_bwlab_42_fs").unwrap();
        assert_eq!(
            fuse,
            MountEntry {
                minor: 53,
                fstype: "fuse.blockwire".into()
            }
        );
        assert_eq!(
            parse_mountinfo(MOUNTINFO, "/tmp/bwlab-42-fs")
                .unwrap()
                .fstype,
            "ext4"
        );
        // The topmost of two mounts on one (escaped) path.
        assert_eq!(parse_mountinfo(MOUNTINFO, "/mnt/a b").unwrap().minor, 55);
        assert_eq!(parse_mountinfo(MOUNTINFO, "/tmp"), None);
        assert_eq!(parse_mountinfo(MOUNTINFO, "/tmp/bwlab-42"), None);
        assert_eq!(unescape_mountinfo("a\\134b\\011c\\9"), "a\\b\tc\\9");
        // The live table: / is always mounted; this source file is not a mount point.
        assert!(is_mountpoint(Path::new("/")));
        assert!(!is_mountpoint(Path::new(file!())));
        // Nothing FUSE to abort on / (and nothing mounted on a plain directory).
        assert_eq!(
            abort_connection(Path::new("/")).unwrap_err().kind(),
            std::io::ErrorKind::InvalidInput
        );
        assert_eq!(
            abort_connection(&std::env::temp_dir().join("bw-no-such-mount"))
                .unwrap_err()
                .kind(),
            std::io::ErrorKind::NotFound
        );
    }

    #[test]
    fn the_file_name_stays_inside_the_attach_directory() {
        for good in ["disk", "vol.raw", "a..b", "..x", ".hidden"] {
            assert!(check_file_name(good).is_ok(), "{good:?} refused");
        }
        for bad in [
            "",
            ".",
            "..",
            "../etc/shadow",
            "/etc/shadow",
            "a/b",
            "x/..",
            "a\0b",
            &"x".repeat(256),
        ] {
            let e = check_file_name(bad).expect_err(bad);
            assert!(e.to_string().starts_with("--file "), "{e}");
        }
    }

    #[test]
    fn mount_fuse_dir_folds_the_mountpoint_into_one_name() {
        assert_eq!(
            mount_fuse_dir(Path::new("/tmp/bwlab-42-fs")),
            Path::new("/run/blockwire/fuse/_tmp_bwlab_42_fs")
        );
        // Different mount points get different directories; none nests.
        assert_ne!(
            mount_fuse_dir(Path::new("/mnt/a")),
            mount_fuse_dir(Path::new("/mnt/b"))
        );
        assert_eq!(
            mount_fuse_dir(Path::new("/mnt/a/b.c")).parent(),
            Some(Path::new("/run/blockwire/fuse"))
        );
    }
}
