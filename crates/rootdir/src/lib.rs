//! Files that `blockwire serve`, running as root, keeps in directories: a
//! volume's reservation state and its lock beside the volume's file, the
//! control socket and its lock, the configuration it persists and the
//! copies `save_config` writes.
//!
//! Root writing where another user may write too hands that user root's
//! pen: a symbolic link planted at the name makes a plain
//! `open(O_CREAT|O_TRUNC)` create or empty whatever file the link points
//! to, a planted file is read as if root had written it, and a directory
//! the user may rename can be swapped for one of theirs between a check
//! and a use. So a [`RootDir`] is a directory that only root (the user
//! serve runs as) may write, and so is every directory above it, except
//! that one above may be writable by others when it is sticky (as /tmp
//! is: then they cannot rename what root owns in it). It is held open;
//! every file in it is made, opened, replaced and removed relative to that
//! descriptor, never through a link at the name, and a file that is not a
//! regular file of root's with one name is not used. A directory that
//! fails the check is refused with the reason ([`is_untrusted`] tells
//! that refusal from other errors).
//!
//! Replacing a file ([`RootDir::replace`]) writes a new root-owned file
//! beside it (`.NAME.new-PID`), syncs it, renames it over the old one and
//! syncs the directory: a reader sees the old file or the new one, never a
//! mix, whoever owned the old one keeps only their own old file, and a
//! crash leaves at worst the temporary, which [`RootDir::remove_temporaries`]
//! removes once its writer is gone.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A directory only root may write (it and what is above it), held open.
#[derive(Debug)]
pub struct RootDir {
    fd: OwnedFd,
    /// Its canonical path (no links), for messages and for what must be
    /// named by path (a socket's address).
    path: PathBuf,
}

/// Why a directory was not trusted: the error [`is_untrusted`] recognises.
#[derive(Debug)]
struct Untrusted(String);

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Untrusted {}

fn untrusted(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, Untrusted(why))
}

/// Whether `e` is a refusal of a directory other users may write (rather
/// than, say, a missing one).
pub fn is_untrusted(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<Untrusted>())
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Owned by root, or by the user this process runs as.
fn ours(uid: u32) -> bool {
    uid == 0 || uid == euid()
}

fn writers(mode: u32) -> &'static str {
    if mode & 0o002 != 0 {
        "every user"
    } else {
        "its group"
    }
}

/// Whether the directory `path` (owner `uid`, `mode`) is one only root
/// may write.
fn check_dir(path: &Path, uid: u32, mode: u32) -> Result<(), String> {
    if !ours(uid) {
        return Err(format!("{} is owned by uid {uid}", path.display()));
    }
    if mode & 0o022 != 0 {
        return Err(format!("{} may be written by {} (mode {:04o})", path.display(), writers(mode), mode & 0o7777));
    }
    Ok(())
}

/// Whether every directory above `real` (canonical) keeps others from
/// putting another directory at its place.
fn check_ancestors(real: &Path) -> Result<(), String> {
    for a in real.ancestors().skip(1) {
        let m = std::fs::symlink_metadata(a).map_err(|e| format!("{}: {e}", a.display()))?;
        if !ours(m.uid()) {
            return Err(format!("{} is owned by uid {}, who could put another directory at {}", a.display(), m.uid(), real.display()));
        }
        let mode = m.mode();
        if mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
            return Err(format!(
                "{} may be written by {} (mode {:04o}, not sticky), who could put another directory at {}",
                a.display(),
                writers(mode),
                mode & 0o7777,
                real.display()
            ));
        }
    }
    Ok(())
}

/// A single path component as a C string.
fn c_name(name: &OsStr) -> io::Result<CString> {
    let b = name.as_bytes();
    if b.is_empty() || b.contains(&b'/') || b == b"." || b == b".." {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} is not a file name")));
    }
    CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} holds a NUL byte")))
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks whether the process exists.
    pid > 0 && (unsafe { libc::kill(pid, 0) } == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// The name [`RootDir::replace`] writes `name`'s new version under
/// before renaming it: `.NAME.new-PID`.
pub fn temporary_name(name: &OsStr) -> OsString {
    let mut t = OsString::from(".");
    t.push(name);
    t.push(format!(".new-{}", std::process::id()));
    t
}

impl RootDir {
    /// Open `dir` if only root may write it and every directory above it
    /// keeps others from replacing it; otherwise an [`is_untrusted`] error
    /// saying which directory lets whom in.
    pub fn open(dir: &Path) -> io::Result<RootDir> {
        let real = std::fs::canonicalize(dir).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        let c = CString::new(real.as_os_str().as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))?;
        // SAFETY: a valid C string; the descriptor is owned right away.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("{}: {e}", real.display())));
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: fstat fills a plain struct for a valid descriptor.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        check_dir(&real, st.st_uid, st.st_mode).and_then(|()| check_ancestors(&real)).map_err(untrusted)?;
        Ok(RootDir { fd, path: real })
    }

    /// [`RootDir::open`], making `dir` first (mode 700, and its missing
    /// parents likewise) if it is missing.
    pub fn create(dir: &Path) -> io::Result<RootDir> {
        if std::fs::symlink_metadata(dir).is_err() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())))?;
        }
        RootDir::open(dir)
    }

    /// The directory holding `file` (opened as [`RootDir::open`] does), and
    /// `file`'s name in it.
    pub fn of(file: &Path) -> io::Result<(RootDir, OsString)> {
        let name = file.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{} names no file", file.display())))?;
        let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        Ok((RootDir::open(dir)?, name.to_owned()))
    }

    /// Its canonical path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` in it, as a path (for messages, and for what only a path
    /// can name: nobody but root can change what it leads to).
    pub fn join(&self, name: impl AsRef<OsStr>) -> PathBuf {
        self.path.join(name.as_ref())
    }

    /// A path that leads to this very directory while it is held open
    /// (`/proc/self/fd/N`), even if it is renamed: for calls that take a
    /// path only, such as `inotify_add_watch`.
    pub fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    fn errno_at(&self, name: &OsStr, e: io::Error) -> io::Error {
        let at = self.join(name);
        match e.raw_os_error() {
            Some(libc::ELOOP) => io::Error::new(io::ErrorKind::InvalidInput, format!("{} is a symbolic link; not following it", at.display())),
            Some(libc::EEXIST) => io::Error::new(io::ErrorKind::AlreadyExists, format!("{} exists", at.display())),
            _ => io::Error::new(e.kind(), format!("{}: {e}", at.display())),
        }
    }

    fn open_at(&self, name: &OsStr, flags: libc::c_int, mode: u32) -> io::Result<File> {
        let c = c_name(name)?;
        // SAFETY: a valid directory descriptor and C string; the result is
        // owned right away.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags | libc::O_CLOEXEC | libc::O_NOFOLLOW, mode as libc::c_uint) };
        if fd < 0 {
            return Err(self.errno_at(name, io::Error::last_os_error()));
        }
        // SAFETY: a fresh descriptor nothing else owns.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// A file opened here must be a regular file of root's with no other
    /// name (a hard link elsewhere would be written through).
    fn check_file(&self, f: &File, name: &OsStr) -> io::Result<()> {
        let m = f.metadata()?;
        if !m.is_file() || !ours(m.uid()) || m.nlink() != 1 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is not a regular file of root's with one name (a {}, uid {}, {} names): not using it",
                    self.join(name).display(),
                    if m.is_file() { "file" } else if m.is_dir() { "directory" } else { "special file" },
                    m.uid(),
                    m.nlink()
                ),
            ));
        }
        Ok(())
    }

    /// Create `name`, which must not exist (not even as a link), with
    /// `mode` (less the umask).
    pub fn create_new(&self, name: &OsStr, mode: u32) -> io::Result<File> {
        self.open_at(name, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, mode)
    }

    /// Open `name` for reading and writing, creating it (mode 600) if it
    /// is missing, as a lock file is: never truncated, never a link, and
    /// if it exists, a regular file of root's.
    pub fn open_lock(&self, name: &OsStr) -> io::Result<File> {
        let f = self.open_at(name, libc::O_RDWR | libc::O_CREAT, 0o600)?;
        self.check_file(&f, name)?;
        Ok(f)
    }

    /// The bytes of `name` (`None` if it is missing), if it is a regular
    /// file of root's reached without a link.
    pub fn read(&self, name: &OsStr) -> io::Result<Option<Vec<u8>>> {
        let mut f = match self.open_at(name, libc::O_RDONLY, 0) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        self.check_file(&f, name)?;
        let mut b = Vec::new();
        f.read_to_end(&mut b)?;
        Ok(Some(b))
    }

    /// Replace `name` with a root-owned file of `mode` holding `bytes`,
    /// whole or not at all (see the module comment). Whatever was at the
    /// name (another user's file, a link) is replaced, never written.
    pub fn replace(&self, name: &OsStr, bytes: &[u8], mode: u32) -> io::Result<()> {
        let cname = c_name(name)?;
        let tmp = temporary_name(name);
        let ctmp = c_name(&tmp)?;
        // A temporary of this pid is a dead process's (a reboot reuses pids):
        // this process writes one file at a time under a name.
        let _ = self.remove(&tmp);
        let written = (|| {
            let mut f = self.create_new(&tmp, 0o600)?;
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            f.write_all(bytes)?;
            f.sync_all()?;
            // SAFETY: valid descriptors and C strings.
            if unsafe { libc::renameat(self.fd.as_raw_fd(), ctmp.as_ptr(), self.fd.as_raw_fd(), cname.as_ptr()) } != 0 {
                return Err(self.errno_at(name, io::Error::last_os_error()));
            }
            self.sync()
        })();
        if written.is_err() {
            let _ = self.remove(&tmp);
        }
        written
    }

    /// Remove `name` (a link itself, never what it points to); `false` if
    /// it was not there.
    pub fn remove(&self, name: &OsStr) -> io::Result<bool> {
        let c = c_name(name)?;
        // SAFETY: a valid directory descriptor and C string.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) } == 0 {
            return Ok(true);
        }
        match io::Error::last_os_error() {
            e if e.kind() == io::ErrorKind::NotFound => Ok(false),
            e => Err(self.errno_at(name, e)),
        }
    }

    /// When `name` (not followed if a link) was last modified; `None` if
    /// it is missing.
    pub fn modified(&self, name: &OsStr) -> io::Result<Option<std::time::SystemTime>> {
        let c = c_name(name)?;
        // SAFETY: fstatat fills a plain struct; the name is not followed.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstatat(self.fd.as_raw_fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } != 0 {
            return match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::NotFound => Ok(None),
                e => Err(self.errno_at(name, e)),
            };
        }
        let at = std::time::Duration::new(u64::try_from(st.st_mtime).unwrap_or(0), st.st_mtime_nsec as u32);
        Ok(Some(std::time::SystemTime::UNIX_EPOCH + at))
    }

    /// Set `name`'s permission bits (a socket just bound here, which no
    /// open descriptor can reach). Only root can have put a link at the
    /// name in a directory only root may write.
    pub fn set_mode(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        let c = c_name(name)?;
        // SAFETY: a valid directory descriptor and C string.
        if unsafe { libc::fchmodat(self.fd.as_raw_fd(), c.as_ptr(), mode as libc::mode_t, 0) } != 0 {
            return Err(self.errno_at(name, io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Make what was renamed or removed in it durable.
    pub fn sync(&self) -> io::Result<()> {
        // SAFETY: fsync of a descriptor we own.
        if unsafe { libc::fsync(self.fd.as_raw_fd()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Remove the temporaries [`RootDir::replace`] left for `name` when
    /// its writer was killed (`.NAME.new-PID` whose process is gone; this
    /// process's own is left to its next replace). Returns what went.
    pub fn remove_temporaries(&self, name: &OsStr) -> io::Result<Vec<OsString>> {
        let mut prefix = OsString::from(".");
        prefix.push(name);
        prefix.push(".new-");
        self.remove_left_by_dead(&prefix)
    }

    /// Remove every `PREFIXPID` in it whose process PID is gone (not this
    /// process's): files a writer names after itself (an older blockwire
    /// named its temporaries so). Returns what went.
    pub fn remove_left_by_dead(&self, prefix: &OsStr) -> io::Result<Vec<OsString>> {
        let prefix = prefix.as_bytes();
        let mut gone = Vec::new();
        for e in std::fs::read_dir(self.proc_path())? {
            let n = e?.file_name().into_vec();
            let Some(pid) = n.strip_prefix(prefix).and_then(|p| std::str::from_utf8(p).ok()).and_then(|p| p.parse::<i32>().ok()) else {
                continue;
            };
            if pid as u32 == std::process::id() || pid_alive(pid) {
                continue;
            }
            let n = OsString::from_vec(n);
            if self.remove(&n)? {
                gone.push(n);
            }
        }
        Ok(gone)
    }
}

/// Replace the file at `path` as [`RootDir::replace`] does, in its
/// directory, which must be one only root may write.
pub fn replace_file(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let (dir, name) = RootDir::of(path)?;
    dir.replace(&name, bytes, mode)
}

#[cfg(test)]
mod tests;
