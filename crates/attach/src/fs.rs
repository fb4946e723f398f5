//! The FUSE file system: a root directory holding one regular file whose
//! bytes are the remote volume.
//!
//! fuser calls these methods on its reader threads with borrowed request
//! buffers; every I/O method copies what it needs (a write's payload
//! included) and hands the request to the tokio runtime, so the reader goes
//! straight back to /dev/fuse and many requests are in flight at once.

use bw_initiator::{BlockClient, ClientError};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::RwLock;

const ROOT: INodeNo = INodeNo(1);
const DISK: INodeNo = INodeNo(2);
/// Attributes never change behind the kernel's back, so it may cache them.
const TTL: Duration = Duration::from_secs(3600);
/// Largest request the kernel may send (FUSE_MAX_PAGES lets it exceed 128 KiB).
pub const MAX_REQUEST: u32 = 1 << 20;

pub struct VolumeFs {
    client: Arc<dyn BlockClient>,
    rt: tokio::runtime::Handle,
    name: String,
    readonly: bool,
    size: u64,
    block: u64,
    started: SystemTime,
    /// Aligned writes share this lock; a read-modify-write of a partial
    /// block holds it alone, so it never undoes a concurrent write to the
    /// other part of that block.
    rmw: Arc<RwLock<()>>,
}

impl VolumeFs {
    pub fn new(
        client: Arc<dyn BlockClient>,
        rt: tokio::runtime::Handle,
        name: String,
        readonly: bool,
    ) -> VolumeFs {
        VolumeFs {
            size: client.size_bytes(),
            block: client.block_size() as u64,
            client,
            rt,
            name,
            readonly,
            started: SystemTime::now(),
            rmw: Arc::new(RwLock::new(())),
        }
    }

    fn attr(&self, ino: INodeNo) -> FileAttr {
        let (kind, perm, size, nlink) = if ino == ROOT {
            (FileType::Directory, 0o755, 0, 2)
        } else {
            (
                FileType::RegularFile,
                if self.readonly { 0o400 } else { 0o600 },
                self.size,
                1,
            )
        };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: self.block.max(4096) as u32,
            flags: 0,
        }
    }
}

fn errno(e: &ClientError) -> Errno {
    match e {
        ClientError::OutOfRange { .. } => Errno::EINVAL,
        ClientError::Unsupported(_) => Errno::EOPNOTSUPP,
        _ => Errno::EIO,
    }
}

/// Read `[offset, offset+len)` (already clamped to the volume), widening to
/// whole blocks when the request is not aligned.
async fn read_range(
    client: &dyn BlockClient,
    block: u64,
    offset: u64,
    len: usize,
) -> Result<Vec<u8>, ClientError> {
    let start = offset / block * block;
    let end = (offset + len as u64).div_ceil(block) * block;
    let mut buf = vec![0u8; (end - start) as usize];
    client.read(start, &mut buf).await?;
    if start != offset || buf.len() != len {
        let skip = (offset - start) as usize;
        buf.drain(..skip);
        buf.truncate(len);
    }
    Ok(buf)
}

async fn write_range(
    client: &dyn BlockClient,
    rmw: &RwLock<()>,
    block: u64,
    offset: u64,
    data: Vec<u8>,
) -> Result<(), ClientError> {
    let end = offset + data.len() as u64;
    if offset % block == 0 && end % block == 0 {
        let _shared = rmw.read().await;
        return client.write(offset, &data).await;
    }
    let _alone = rmw.write().await;
    let start = offset / block * block;
    let wide_end = end.div_ceil(block) * block;
    let mut buf = vec![0u8; (wide_end - start) as usize];
    // Only the first and last blocks hold bytes we must keep.
    client.read(start, &mut buf[..block as usize]).await?;
    if wide_end - block > start {
        let tail = (wide_end - block - start) as usize;
        client.read(wide_end - block, &mut buf[tail..]).await?;
    }
    let at = (offset - start) as usize;
    buf[at..at + data.len()].copy_from_slice(&data);
    client.write(start, &buf).await
}

impl Filesystem for VolumeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // ASYNC_DIO: loop's direct I/O arrives as parallel requests instead
        // of one at a time; MAX_PAGES: requests up to MAX_REQUEST bytes.
        let wanted =
            InitFlags::FUSE_ASYNC_DIO | InitFlags::FUSE_ASYNC_READ | InitFlags::FUSE_MAX_PAGES;
        let _ = config.add_capabilities(wanted & config.capabilities());
        let _ = config.set_max_write(MAX_REQUEST);
        let _ = config.set_max_readahead(MAX_REQUEST);
        let _ = config.set_max_background(256);
        let _ = config.set_congestion_threshold(192);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT && name == OsStr::new(&self.name) {
            reply.entry(&TTL, &self.attr(DISK), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino == ROOT || ino == DISK {
            reply.attr(&TTL, &self.attr(ino));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // The volume's size is the target's; O_TRUNC and ftruncate to another
        // size would silently not happen, so refuse them. Times/modes are
        // ignored (nothing to store them in).
        if ino == DISK && size.is_some_and(|s| s != self.size) {
            reply.error(Errno::EPERM);
        } else {
            reply.attr(&TTL, &self.attr(ino));
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != DISK {
            return reply.error(Errno::EISDIR);
        }
        if self.readonly && (flags.0 & libc::O_ACCMODE) != libc::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        reply.opened(FileHandle(0), FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let len = (size as u64).min(self.size.saturating_sub(offset)) as usize;
        if len == 0 {
            return reply.data(&[]);
        }
        let (client, block) = (self.client.clone(), self.block);
        self.rt.spawn(async move {
            match read_range(&*client, block, offset, len).await {
                Ok(buf) => reply.data(&buf),
                Err(e) => {
                    log::warn!("read {len} at {offset}: {e}");
                    reply.error(errno(&e))
                }
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if self.readonly {
            return reply.error(Errno::EROFS);
        }
        if offset >= self.size {
            return reply.error(Errno::ENOSPC);
        }
        let len = (data.len() as u64).min(self.size - offset) as usize;
        // The copy happens here, before the reader thread reuses its buffer
        // for the next request (the bug that corrupts qemu 7.2's FUSE export).
        let payload = data[..len].to_vec();
        let (client, rmw, block) = (self.client.clone(), self.rmw.clone(), self.block);
        self.rt.spawn(async move {
            match write_range(&*client, &rmw, block, offset, payload).await {
                Ok(()) => reply.written(len as u32),
                Err(e) => {
                    log::warn!("write {len} at {offset}: {e}");
                    reply.error(errno(&e))
                }
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(): nothing is buffered here; durability is fsync's job.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let client = self.client.clone();
        self.rt.spawn(async move {
            match client.flush().await {
                Ok(()) => reply.ok(),
                Err(e) => {
                    log::warn!("flush: {e}");
                    reply.error(errno(&e))
                }
            }
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let end = offset.saturating_add(length);
        if mode == 0 || mode == libc::FALLOC_FL_KEEP_SIZE {
            // Every byte of the volume already exists.
            return if end <= self.size {
                reply.ok()
            } else {
                reply.error(Errno::EFBIG)
            };
        }
        if mode != libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE {
            return reply.error(Errno::EOPNOTSUPP);
        }
        if self.readonly {
            return reply.error(Errno::EROFS);
        }
        // Discard whole blocks only: partial blocks at the ends are left as
        // they are (punching a hole may leave data; reading zeros is not
        // promised by every target's UNMAP anyway).
        let start = offset.div_ceil(self.block) * self.block;
        let stop = end.min(self.size) / self.block * self.block;
        if stop <= start {
            return reply.ok();
        }
        let (client, rmw) = (self.client.clone(), self.rmw.clone());
        self.rt.spawn(async move {
            let _shared = rmw.read().await;
            match client.discard(start, stop - start).await {
                Ok(()) => reply.ok(),
                Err(e) => {
                    log::debug!("discard {start}+{}: {e}", stop - start);
                    reply.error(errno(&e))
                }
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
            (DISK, FileType::RegularFile, self.name.as_str()),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bs = self.block.max(512);
        reply.statfs(self.size / bs, 0, 0, 2, 0, bs as u32, 255, bs as u32);
    }
}
