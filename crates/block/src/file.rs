//! The one file-descriptor backend: a memfd for `ram:`, a regular file or a
//! block device for paths. All I/O is positional (`pread`/`pwrite`), so any
//! number of threads may use one device at once.

use crate::block_locks::BlockLocks;
use crate::{BackendKind, BackendSpec, BlockError, DeviceInfo, DeviceKind, Durability, Extent};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, FromRawFd};

/// Whether a file lives on tmpfs or ramfs (e.g. /dev/shm).
fn on_memory_fs(file: &File) -> bool {
    const TMPFS_MAGIC: libc::c_long = 0x0102_1994;
    const RAMFS_MAGIC: libc::c_long = 0x8584_58f6;
    // SAFETY: statfs is plain data filled in by the kernel for a valid fd.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    matches!(st.f_type as libc::c_long, TMPFS_MAGIC | RAMFS_MAGIC)
}

/// Make a missing backing file: empty, root's, private (its data is the
/// volume's), in a directory only root may write, never through a link
/// planted at the name (a dangling one would have root create the file it
/// points to). The caller opens it then, and grows it.
fn create_backing_file(path: &std::path::Path) -> io::Result<()> {
    let (dir, name) = bw_rootdir::RootDir::of(path).map_err(|e| io::Error::new(e.kind(), format!("cannot create {}: {e}", path.display())))?;
    dir.create_new(&name, 0o600)?;
    dir.sync()
}

/// Alignment O_DIRECT needs for buffers, offsets and lengths. 4096 covers
/// every logical block size in common use.
const DIRECT_ALIGN: usize = 4096;

pub struct FileDevice {
    file: File,
    /// O_DIRECT only: keeps partial-block patches from losing writes.
    locks: BlockLocks,
    info: DeviceInfo,
    direct: bool,
    is_block_device: bool,
    /// A file's path, and whether opening it made it (its reservations
    /// are kept beside it: [`crate::BlockDevice::reservation_store`]).
    beside: Option<(std::path::PathBuf, bool)>,
}

impl FileDevice {
    pub fn open(spec: &BackendSpec) -> Result<Self, BlockError> {
        match &spec.kind {
            BackendKind::Ram { size } => Self::open_ram(*size, spec.readonly),
            BackendKind::File { path, size } => {
                let mut oo = OpenOptions::new();
                oo.read(true).write(!spec.readonly);
                let mut flags = 0;
                if spec.direct {
                    flags |= libc::O_DIRECT;
                }
                if spec.sync {
                    flags |= libc::O_DSYNC;
                }
                oo.custom_flags(flags);
                let mut created = false;
                let file = match oo.open(path) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound && size.is_some() && !spec.readonly => {
                        create_backing_file(path)?;
                        created = true;
                        oo.open(path)
                    }
                    r => r,
                }
                .map_err(|e| io::Error::new(e.kind(), format!("cannot open {}: {e}", path.display())))?;
                let meta = file.metadata()?;
                let is_block_device = meta.file_type().is_block_device();
                let size_bytes = if is_block_device {
                    block_device_size(&file)?
                } else {
                    if let Some(want) = size {
                        // Grow sparse to the requested size; never shrink a file that
                        // holds someone's data.
                        if meta.len() < *want {
                            file.set_len(*want)?;
                        }
                    }
                    file.metadata()?.len()
                };
                if size_bytes == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{} is empty: give size= to create it", path.display()),
                    )
                    .into());
                }
                let memory_backed = !spec.direct && !is_block_device && on_memory_fs(&file);
                let durability = if spec.sync { Durability::WriteThrough } else { Durability::WriteBack };
                let mut description = format!("{}{}", if is_block_device { "blockdev:" } else { "file:" }, path.display());
                for (on, name) in [(spec.direct, "O_DIRECT"), (spec.sync, "O_DSYNC"), (spec.readonly, "read-only")] {
                    if on {
                        description.push_str(&format!(" {name}"));
                    }
                }
                Ok(FileDevice {
                    file,
                    info: DeviceInfo {
                        kind: if is_block_device { DeviceKind::BlockDevice } else { DeviceKind::File },
                        direct: spec.direct,
                        size_bytes,
                        read_only: spec.readonly,
                        durability,
                        supports_discard: true,
                        description,
                        memory_backed,
                        remote: false,
                        async_submit: false,
                    },
                    direct: spec.direct,
                    locks: BlockLocks::new(DIRECT_ALIGN),
                    is_block_device,
                    beside: Some((path.clone(), created)),
                })
            }
            BackendKind::Rbd(_) => Err(io::Error::other("an rbd: spec is opened by RbdDevice, not FileDevice").into()),
        }
    }

    fn open_ram(size: u64, read_only: bool) -> Result<Self, BlockError> {
        let name = CString::new("blockwire-ram").expect("static name has no NUL");
        // SAFETY: plain syscall with a valid C string; the fd is owned by File below.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size)?;
        Ok(FileDevice {
            file,
            info: DeviceInfo {
                kind: DeviceKind::Ram,
                direct: false,
                size_bytes: size,
                read_only,
                durability: Durability::Volatile,
                supports_discard: true,
                description: format!("ram:{}", crate::format_size(size)),
                memory_backed: true,
                remote: false,
                async_submit: false,
            },
            direct: false,
            locks: BlockLocks::new(DIRECT_ALIGN),
            is_block_device: false,
            beside: None,
        })
    }

    fn needs_bounce(&self, ptr: *const u8, len: usize, offset: u64) -> bool {
        self.direct
            && (!(ptr as usize).is_multiple_of(DIRECT_ALIGN)
                || !len.is_multiple_of(DIRECT_ALIGN)
                || !offset.is_multiple_of(DIRECT_ALIGN as u64))
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: valid fd; the kernel checks the range.
        let r = unsafe {
            libc::fallocate(self.file.as_raw_fd(), mode, offset as libc::off_t, len as libc::off_t)
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    fn block_ioctl_range(&self, request: libc::c_ulong, offset: u64, len: u64) -> io::Result<()> {
        let range: [u64; 2] = [offset, len];
        // SAFETY: BLKDISCARD/BLKZEROOUT read two u64s from the pointer.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), request as _, range.as_ptr()) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    fn write_zero_buffers(&self, offset: u64, len: u64) -> io::Result<()> {
        let chunk = AlignedBuf::new(1 << 20);
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(chunk.len() as u64) as usize;
            self.write_at_inner(&chunk.as_slice()[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }

    fn write_at_inner(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !self.direct {
            // The page cache merges concurrent writes to one page by itself.
            return self.file.write_all_at(buf, offset);
        }
        let patch = self.needs_bounce(buf.as_ptr(), buf.len(), offset);
        let _held = self.locks.write(offset, buf.len(), patch);
        if patch {
            return self.bounce_write(buf, offset);
        }
        self.file.write_all_at(buf, offset)
    }

    /// O_DIRECT with an unaligned request: widen to aligned bounds, read the
    /// edges, patch, write back. The caller holds the edge blocks exclusively:
    /// initiators see 512-byte sectors, so a write to another sector of the
    /// same 4 KiB block must not be lost.
    fn bounce_write(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let (start, end) = aligned_bounds(offset, buf.len(), self.info.size_bytes);
        let mut tmp = AlignedBuf::new((end - start) as usize);
        let head = (offset - start) as usize;
        if head != 0 || (head + buf.len()) as u64 != end - start {
            self.file.read_exact_at(tmp.as_mut_slice(), start)?;
        }
        tmp.as_mut_slice()[head..head + buf.len()].copy_from_slice(buf);
        self.file.write_all_at(tmp.as_slice(), start)
    }
}

/// Round a byte range out to the O_DIRECT alignment, clamped to the device size
/// (a device size is always a multiple of 512, and the last partial block is
/// still addressable with O_DIRECT on files and devices in practice).
fn aligned_bounds(offset: u64, len: usize, size: u64) -> (u64, u64) {
    let a = DIRECT_ALIGN as u64;
    let start = offset / a * a;
    let end = ((offset + len as u64).div_ceil(a) * a).min(size.max(offset + len as u64));
    (start, end)
}

impl crate::BlockDevice for FileDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn backing(&self) -> Option<crate::Backing> {
        use std::os::unix::fs::MetadataExt;
        self.beside.as_ref()?;
        let m = self.file.metadata().ok()?;
        Some(if self.is_block_device { crate::Backing::Device { rdev: m.rdev() } } else { crate::Backing::File { dev: m.dev(), ino: m.ino() } })
    }

    /// A writable regular file keeps its reservations beside it
    /// (`FILE.pr`: bw_reservation::FileStore), where other processes
    /// serving it see them, if only root may write its directory; if
    /// others may, they are kept in this process only (with a warning):
    /// root makes no files there.
    fn reservation_store(&self) -> io::Result<Option<Box<dyn bw_reservation::Store>>> {
        let Some((path, created)) = self.beside.as_ref().filter(|_| !self.info.read_only && !self.is_block_device) else {
            return Ok(None);
        };
        match bw_reservation::FileStore::beside(path, &self.file, *created) {
            Ok(s) => Ok(Some(Box::new(s))),
            Err(e) if bw_rootdir::is_untrusted(&e) => {
                log::warn!("{}: persistent reservations are kept in this process only, not beside the file: {e}", path.display());
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Files and memory files are truncated or extended; a block device's
    /// size is its own.
    fn resize(&self, new_size: u64) -> io::Result<()> {
        if self.is_block_device {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "a block device is resized where it comes from, not here"));
        }
        self.file.set_len(new_size)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.needs_bounce(buf.as_ptr(), buf.len(), offset) {
            let (start, end) = aligned_bounds(offset, buf.len(), self.info.size_bytes);
            let mut tmp = AlignedBuf::new((end - start) as usize);
            self.file.read_exact_at(tmp.as_mut_slice(), start)?;
            let head = (offset - start) as usize;
            buf.copy_from_slice(&tmp.as_slice()[head..head + buf.len()]);
            return Ok(());
        }
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at_inner(buf, offset)
    }

    fn zero_copy_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        // Only where reads never wait for a device: front-ends sendfile on
        // their network threads, and a cold page cache on a disk would stall
        // them (reads there go to the blocking pool instead). O_DIRECT files
        // are never memory-backed.
        self.info.memory_backed.then(|| self.file.as_fd())
    }

    /// SEEK_DATA / SEEK_HOLE: files (sparse), tmpfs and memfd (RAM volumes:
    /// pages never written or punched are holes). Block devices report
    /// everything as data, which is what the kernel answers for them too.
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Extent> {
        let fd = self.file.as_raw_fd();
        let seek = |whence| {
            // SAFETY: lseek on a valid fd; reads go through pread, so moving
            // the file position affects nothing.
            let r = unsafe { libc::lseek(fd, offset as libc::off_t, whence) };
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(r as u64)
            }
        };
        let data = match seek(libc::SEEK_DATA) {
            Ok(d) => d,
            // No data from `offset` to the end of the file: one hole.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(Extent { allocated: false, len }),
            // A filesystem that cannot tell: everything is data.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(Extent { allocated: true, len }),
            Err(e) => return Err(e),
        };
        if data > offset {
            return Ok(Extent { allocated: false, len: (data - offset).min(len) });
        }
        let hole = match seek(libc::SEEK_HOLE) {
            Ok(h) => h,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => offset + len,
            Err(e) => return Err(e),
        };
        Ok(Extent { allocated: true, len: (hole.max(offset + 1) - offset).min(len) })
    }

    fn flush(&self) -> io::Result<()> {
        if self.info.durability == Durability::Volatile {
            return Ok(());
        }
        self.file.sync_data()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        if self.is_block_device {
            // BLKDISCARD may leave old data readable on some devices, and
            // callers rely on zeroes after a discard: zero-out instead.
            return self.write_zeroes(offset, len);
        }
        self.fallocate(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let r = if self.is_block_device {
            const BLKZEROOUT: libc::c_ulong = 0x127f;
            self.block_ioctl_range(BLKZEROOUT, offset, len)
        } else {
            self.fallocate(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len)
        };
        match r {
            Ok(()) => {
                if self.info.durability == Durability::WriteThrough {
                    self.file.sync_data()?;
                }
                Ok(())
            }
            // Filesystems without hole punching: write real zeroes.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) || e.raw_os_error() == Some(libc::ENOTTY) => {
                self.write_zero_buffers(offset, len)
            }
            Err(e) => Err(e),
        }
    }
}

fn block_device_size(file: &File) -> io::Result<u64> {
    const BLKGETSIZE64: libc::c_ulong = 0x80081272;
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

/// A zero-filled heap buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len.max(DIRECT_ALIGN), DIRECT_ALIGN)
            .expect("valid layout");
        // SAFETY: non-zero size layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len }
    }
    fn len(&self) -> usize {
        self.len
    }
    fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len.max(DIRECT_ALIGN), DIRECT_ALIGN)
            .expect("valid layout");
        // SAFETY: allocated in new() with the same layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockDevice;

    /// RAM (memfd) and sparse files report holes where nothing was written
    /// or where a discard punched one, and data where a write landed.
    #[test]
    fn allocation_follows_writes_and_discards() {
        let dir = std::env::temp_dir().join(format!("bw-block-alloc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = BackendSpec::parse(&format!("file:{}/a.img,size=1M", dir.display())).unwrap();
        for spec in [BackendSpec::ram(1 << 20), file] {
            let d = FileDevice::open(&spec).unwrap();
            assert_eq!(d.allocation(0, 1 << 20).unwrap(), Extent { allocated: false, len: 1 << 20 });
            d.write_at(&[7u8; 8192], 65536).unwrap();
            assert_eq!(d.allocation(0, 1 << 20).unwrap(), Extent { allocated: false, len: 65536 });
            assert_eq!(d.allocation(65536, 1 << 20).unwrap(), Extent { allocated: true, len: 8192 });
            assert_eq!(d.allocation(65536, 512).unwrap(), Extent { allocated: true, len: 512 });
            assert_eq!(d.allocation(73728, 4096).unwrap(), Extent { allocated: false, len: 4096 });
            d.discard(65536, 4096).unwrap();
            assert_eq!(d.allocation(65536, 1 << 20).unwrap(), Extent { allocated: false, len: 4096 });
            assert_eq!(d.allocation(69632, 1 << 20).unwrap(), Extent { allocated: true, len: 4096 });
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ram_reads_back_and_discards_to_zero() {
        let d = FileDevice::open(&BackendSpec::ram(1 << 20)).unwrap();
        d.write_at(&[7u8; 4096], 8192).unwrap();
        let mut b = [0u8; 4096];
        d.read_at(&mut b, 8192).unwrap();
        assert_eq!(b, [7u8; 4096]);
        d.discard(8192, 4096).unwrap();
        d.read_at(&mut b, 8192).unwrap();
        assert_eq!(b, [0u8; 4096]);
    }

    #[test]
    fn file_created_sparse_and_direct_bounces_unaligned_io() {
        let dir = std::env::temp_dir().join(format!("bw-block-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("disk.img");
        let spec = BackendSpec::parse(&format!("file:{},size=1M", path.display())).unwrap();
        let d = FileDevice::open(&spec).unwrap();
        assert_eq!(d.info().size_bytes, 1 << 20);
        d.write_at(b"hello", 513).unwrap();
        d.flush().unwrap();
        drop(d);
        // Re-open with O_DIRECT (falls back to buffered if the fs refuses it).
        let spec = BackendSpec::parse(&format!("file:{},direct", path.display())).unwrap();
        if let Ok(d) = FileDevice::open(&spec) {
            let mut b = [0u8; 5];
            d.read_at(&mut b, 513).unwrap();
            assert_eq!(&b, b"hello");
            d.write_at(b"world", 4090).unwrap();
            let mut c = [0u8; 10];
            d.read_at(&mut c, 4088).unwrap();
            assert_eq!(&c, b"\0\0world\0\0\0");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn concurrent_sector_writes_to_one_direct_block_all_survive() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../target/bw-block-rmw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("disk.img");
        let spec = BackendSpec::parse(&format!("file:{},size=256k,direct", path.display())).unwrap();
        let Ok(d) = FileDevice::open(&spec) else {
            eprintln!("skipped: this file system refuses O_DIRECT");
            std::fs::remove_dir_all(&dir).unwrap();
            return;
        };
        let d = std::sync::Arc::new(d);
        // Eight writers, each owning one 512-byte sector of every 4 KiB block.
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    for round in 0..20u8 {
                        for block in 0..16u64 {
                            d.write_at(&[t.wrapping_mul(31).wrapping_add(round); 512], block * 4096 + t as u64 * 512).unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut b = vec![0u8; 16 * 4096];
        d.read_at(&mut b, 0).unwrap();
        for (i, sector) in b.chunks(512).enumerate() {
            let t = (i % 8) as u8;
            assert!(sector.iter().all(|&x| x == t.wrapping_mul(31).wrapping_add(19)), "sector {i} lost its last write");
        }
        drop(d);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn memory_backing_is_detected() {
        assert!(FileDevice::open(&BackendSpec::ram(4096)).unwrap().info().memory_backed);
        let shm = std::path::Path::new("/dev/shm");
        if shm.is_dir() {
            // A directory of its own: /dev/shm itself is everyone's.
            let dir = shm.join(format!("bw-block-memtest-{}", std::process::id()));
            std::fs::create_dir(&dir).unwrap();
            let path = dir.join("disk.img");
            let d = FileDevice::open(&BackendSpec::parse(&format!("file:{},size=4k", path.display())).unwrap()).unwrap();
            assert!(d.info().memory_backed, "/dev/shm is tmpfs");
            drop(d);
            std::fs::remove_dir_all(&dir).unwrap();
        }
        // The crate's own directory is on a disk file system, not tmpfs.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let d = FileDevice::open(&BackendSpec::parse(&format!("file:{},readonly", path.display())).unwrap()).unwrap();
        assert!(!d.info().memory_backed);
    }

    /// Two spellings of one file, or two nodes of one device, are one
    /// backing; memory is none.
    #[test]
    fn backing_is_the_file_whatever_its_spelling() {
        let dir = std::env::temp_dir().join(format!("bw-block-backing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let open = |s: String| FileDevice::open(&BackendSpec::parse(&s).unwrap()).unwrap();
        let a = open(format!("file:{}/a.img,size=64k", dir.display()));
        let again = open(format!("file:{}/./a.img", dir.display()));
        std::os::unix::fs::symlink(dir.join("a.img"), dir.join("link.img")).unwrap();
        let linked = open(format!("file:{}/link.img", dir.display()));
        let b = open(format!("file:{}/b.img,size=64k", dir.display()));
        use crate::BlockDevice;
        assert!(a.backing().is_some() && a.backing() == again.backing() && a.backing() == linked.backing());
        assert_ne!(a.backing(), b.backing());
        assert_eq!(FileDevice::open(&BackendSpec::ram(4096)).unwrap().backing(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A missing backing file is made private and root's, only where no
    /// other user may write, and never where a planted link points.
    #[test]
    fn backing_files_are_made_private_and_never_through_links() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("bw-block-make-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let open = |p: &std::path::Path| FileDevice::open(&BackendSpec::parse(&format!("file:{},size=64k", p.display())).unwrap());
        let made = dir.join("made.img");
        drop(open(&made).unwrap());
        assert_eq!(std::fs::metadata(&made).unwrap().permissions().mode() & 0o777, 0o600);
        let target = dir.join("target");
        std::os::unix::fs::symlink(&target, dir.join("dangling.img")).unwrap();
        assert!(open(&dir.join("dangling.img")).is_err());
        assert!(!target.exists(), "a file was made where a planted link pointed");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = open(&dir.join("shared.img")).err().unwrap().to_string();
        assert!(e.contains("cannot create") && e.contains("may be written by every user"), "{e}");
        // An existing file there is the administrator's to serve.
        open(&made).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn device_facts_are_typed() {
        let ram = FileDevice::open(&BackendSpec::ram(4096)).unwrap();
        assert_eq!((ram.info().kind, ram.info().direct, ram.info().io_may_block()), (DeviceKind::Ram, false, false));
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let f = FileDevice::open(&BackendSpec::parse(&format!("file:{},readonly", path.display())).unwrap()).unwrap();
        assert_eq!((f.info().kind, f.info().direct, f.info().io_may_block()), (DeviceKind::File, false, false));
        // O_DIRECT and O_DSYNC files wait for the device.
        let dir = std::env::temp_dir().join(format!("bw-block-facts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (opts, direct) in [("direct", true), ("sync", false)] {
            let spec = format!("file:{}/{opts}.img,size=64k,{opts}", dir.display());
            match FileDevice::open(&BackendSpec::parse(&spec).unwrap()) {
                Ok(d) => {
                    assert_eq!(d.info().direct, direct, "{opts}");
                    assert!(d.info().io_may_block(), "{opts}");
                }
                // tmpfs refuses O_DIRECT
                Err(e) if direct => eprintln!("no O_DIRECT here: {e}"),
                Err(e) => panic!("{opts}: {e}"),
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_file_without_size_is_an_error() {
        let spec = BackendSpec::parse("file:/nonexistent/blockwire/x").unwrap();
        assert!(FileDevice::open(&spec).is_err());
    }
}
