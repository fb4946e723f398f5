//! File-level copies for volume pools: a reflink (FICLONE: the new file
//! shares the old one's extents, copy-on-write, instant) where the file
//! system has them (xfs with reflink=1, btrfs), a sparse copy
//! (SEEK_DATA/SEEK_HOLE and copy_file_range) where the caller allows it,
//! and the allocation figures thin provisioning reports.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// How a copy was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// Shared extents (instant, copy-on-write).
    Reflink,
    /// The data copied, holes kept.
    Copy,
}

/// Errors of FICLONE that mean "this file system (or pair of files) cannot
/// share extents", as opposed to a failure of the file system.
fn no_reflink(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EXDEV | libc::EINVAL | libc::ENOTTY | libc::ENOSYS))
}

fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)
}

/// Make `dst` (which must not exist) a copy of `src`: a reflink, or, if
/// the file system has none and `allow_copy`, a sparse copy. Without
/// reflinks and without `allow_copy` the error says so, and `dst` is not
/// left behind. The copy is synced (data and size) before this returns.
pub fn clone_file(src: &Path, dst: &Path, allow_copy: bool) -> io::Result<CopyKind> {
    let from = File::open(src)?;
    let to = create_new(dst)?;
    let made = (|| {
        // SAFETY: FICLONE takes the source descriptor as its argument;
        // both descriptors are open for the duration of the call.
        let rc = unsafe { libc::ioctl(to.as_raw_fd(), libc::FICLONE, from.as_raw_fd()) };
        let kind = if rc == 0 {
            CopyKind::Reflink
        } else {
            let e = io::Error::last_os_error();
            if !no_reflink(&e) {
                return Err(e);
            }
            if !allow_copy {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("the file system of {} has no reflinks (FICLONE: {e}); use xfs (mkfs.xfs -m reflink=1) or btrfs, or configure the pool with copy = true", src.display()),
                ));
            }
            copy_sparse(&from, &to)?;
            CopyKind::Copy
        };
        to.sync_all()?;
        Ok(kind)
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(dst);
    }
    made
}

/// Copy the data regions of `from` into `to` (same offsets), leaving the
/// holes as holes, and give `to` the same length.
fn copy_sparse(from: &File, to: &File) -> io::Result<()> {
    let len = from.metadata()?.len();
    to.set_len(len)?;
    let mut pos: i64 = 0;
    while (pos as u64) < len {
        // SAFETY: lseek on a descriptor we own.
        let data = unsafe { libc::lseek(from.as_raw_fd(), pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // no data after pos
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(from.as_raw_fd(), data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let (mut off_in, mut off_out) = (data, data);
        while off_in < hole {
            // SAFETY: offsets are ours; the kernel copies between two open files.
            let n = unsafe { libc::copy_file_range(from.as_raw_fd(), &mut off_in, to.as_raw_fd(), &mut off_out, (hole - off_in) as usize, 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                break;
            }
        }
        pos = hole;
    }
    Ok(())
}

/// Allocate every block of `path` and unshare any extent it shares with a
/// reflink (SPDK's inflate): later writes to the sharers cannot run out
/// of space for it.
pub fn allocate_all(path: &Path) -> io::Result<()> {
    let f = OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
    let len = f.metadata()?.len() as libc::off_t;
    if len == 0 {
        return Ok(());
    }
    // SAFETY: fallocate on a descriptor we own.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_UNSHARE_RANGE, 0, len) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)) {
            return Err(e);
        }
        // No shared extents on this file system: allocate the holes.
        // SAFETY: as above.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    f.sync_all()
}

/// Bytes the file system holds for `path` (its blocks, not its length).
pub fn allocated_bytes(path: &Path) -> io::Result<u64> {
    Ok(std::fs::symlink_metadata(path)?.blocks() * 512)
}

/// Total and available bytes of the file system holding `dir`, and its
/// type's magic number (statfs f_type).
pub fn fs_space(dir: &Path) -> io::Result<FsSpace> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: statfs fills the struct we pass; zeroed is a valid start.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let bs = s.f_bsize as u64;
    Ok(FsSpace { total: s.f_blocks as u64 * bs, available: s.f_bavail as u64 * bs, fs_type: fs_type_name(s.f_type as i64) })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsSpace {
    pub total: u64,
    pub available: u64,
    pub fs_type: &'static str,
}

fn fs_type_name(magic: i64) -> &'static str {
    match magic {
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0xEF53 => "ext4",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlayfs",
        0x6573_5546 => "fuse",
        _ => "other",
    }
}

/// Whether files in `dir` can be reflinked: two scratch files tried and
/// removed.
pub fn reflinks_work(dir: &Path) -> bool {
    let a = dir.join(format!(".reflink-probe-{}-a", std::process::id()));
    let b = dir.join(format!(".reflink-probe-{}-b", std::process::id()));
    let ok = (|| -> io::Result<bool> {
        let f = create_new(&a)?;
        f.set_len(4096)?;
        drop(f);
        Ok(clone_file(&a, &b, false).is_ok())
    })()
    .unwrap_or(false);
    let _ = std::fs::remove_file(&a);
    let _ = std::fs::remove_file(&b);
    ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};

    /// On whatever file system the temp dir is, a copy (reflink or sparse)
    /// holds the data at the same offsets and keeps a hole a hole.
    #[test]
    fn copies_keep_data_and_holes() {
        let dir = std::env::temp_dir().join(format!("bw-reflink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        let mut f = create_new(&a).unwrap();
        f.set_len(8 << 20).unwrap();
        f.seek(SeekFrom::Start(4 << 20)).unwrap();
        f.write_all(&[7u8; 4096]).unwrap();
        drop(f);
        let kind = clone_file(&a, &b, true).unwrap();
        let mut got = vec![0u8; 4096];
        let mut g = File::open(&b).unwrap();
        assert_eq!(g.metadata().unwrap().len(), 8 << 20);
        g.seek(SeekFrom::Start(4 << 20)).unwrap();
        g.read_exact(&mut got).unwrap();
        assert_eq!(got, vec![7u8; 4096]);
        if kind == CopyKind::Copy {
            assert!(allocated_bytes(&b).unwrap() < 1 << 20, "the copy filled the holes");
        }
        // The destination exists now: a second clone onto it is refused.
        assert_eq!(clone_file(&a, &b, true).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
