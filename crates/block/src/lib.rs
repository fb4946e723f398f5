//! Block backends behind one trait.
//!
//! A [`BlockDevice`] is a flat array of bytes with positional, thread-safe
//! reads and writes (`pread`/`pwrite` semantics: many threads may call it at
//! once). Front-ends never talk to a backend directly: they go through a
//! [`Volume`], which checks ranges and read-only mode in one place and counts
//! I/O for the lab.
//!
//! Backends are opened from a spec string, see [`BackendSpec::parse`]:
//! `ram:SIZE`, `file:PATH[,size=SIZE]`, a plain path (regular file or
//! block device), each followed by options `direct`, `sync`, `readonly`, or
//! `rbd:POOL/IMAGE[@SNAP][,conf=PATH][,id=USER][,size=SIZE][,timeout=SECS]` (a Ceph
//! RBD image, or read-only one of its snapshots, through librbd, loaded at
//! run time).
//!
//! Two ways to run I/O, one trait: the synchronous methods
//! ([`BlockDevice::read_at`] and the rest; front-ends call them inline or on
//! a thread pool, as [`DeviceInfo::io_may_block`] says), and
//! [`BlockDevice::submit`], which starts a read or write and reports its end
//! through a callback. Backends with a native asynchronous interface (rbd:
//! librbd's `rbd_aio_*`) implement `submit` so that no thread waits for a
//! request ([`DeviceInfo::async_submit`]); for the others it runs the
//! synchronous method on the calling thread.

mod backend;
mod block_locks;
mod file;
mod mapped_copy;
pub mod qos;
mod rbd;
pub mod reflink;
mod request;
mod size;
mod spec;
mod volume;

pub use backend::open;
pub use file::FileDevice;
pub use rbd::{RbdDevice, RbdPool};
pub use request::{OnDone, Request};
pub use size::{format_size, parse_size};
pub use spec::{BackendKind, BackendSpec, RbdTarget};
pub use qos::{Direction, QosLimits};
pub use volume::{IoStats, IoStatsSnapshot, MappedBytes, QosThrottled, SizeWatch, Volume};

use std::io;

/// Logical block size every front-end uses. AoE, SCSI and NVMe namespaces in
/// blockwire all expose 512-byte sectors.
pub const SECTOR_SIZE: u32 = 512;

#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("access at offset {offset} length {len} is past the end of the device ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("the device is read-only")]
    ReadOnly,
    #[error(transparent)]
    Io(#[from] io::Error),
}

pub type Result<T> = std::result::Result<T, BlockError>;

/// How writes reach stable storage; front-ends report this to initiators
/// (SCSI WCE bit, NVMe volatile write cache) so they know whether to flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Data lives in memory only (RAM disk): nothing survives a restart.
    Volatile,
    /// Writes are acknowledged once they reach the OS page cache; FLUSH makes
    /// them durable (fdatasync).
    WriteBack,
    /// Every write is durable before it is acknowledged (O_DSYNC).
    WriteThrough,
}

/// What kind of store a backend is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKind {
    /// `ram:` (a memfd).
    Ram,
    /// A regular file.
    File,
    /// A block device node.
    BlockDevice,
    /// A Ceph RBD image (every request goes over the network).
    Rbd,
}

/// Static facts about an opened backend. Front-ends decide from these
/// typed fields, never from [`DeviceInfo::description`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceInfo {
    pub kind: DeviceKind,
    /// Opened with O_DIRECT: reads and writes bypass the page cache and
    /// wait for the device.
    pub direct: bool,
    pub size_bytes: u64,
    pub read_only: bool,
    pub durability: Durability,
    /// Whether `discard` really deallocates (hole punch / BLKDISCARD).
    pub supports_discard: bool,
    /// The data lives in memory (memfd, tmpfs/ramfs file) and is not read
    /// with O_DIRECT: I/O is a memory copy that never waits for a device, so
    /// front-ends need no extra threads to keep requests in flight.
    pub memory_backed: bool,
    /// Every request is a network round trip (rbd): it takes as long as the
    /// cluster does and many can be in flight at once, so front-ends must
    /// never run one on a network thread and should keep many outstanding.
    pub remote: bool,
    /// [`BlockDevice::submit`] only starts a read or write and returns;
    /// the backend's own threads complete it (rbd). Front-ends then submit
    /// from their network task and take the result back over a channel,
    /// instead of parking a pool thread per request in flight.
    pub async_submit: bool,
    /// Human-readable description, e.g. `file:/dev/shm/x O_DIRECT`, for
    /// logs only.
    pub description: String,
}

impl DeviceInfo {
    /// Whether a read or write may sleep waiting for a device or the
    /// network (O_DIRECT, a block device, RBD, or O_DSYNC writes), rather
    /// than being a copy to or from the page cache: front-ends run such
    /// I/O off their network threads.
    pub fn io_may_block(&self) -> bool {
        self.direct || self.durability == Durability::WriteThrough || matches!(self.kind, DeviceKind::BlockDevice | DeviceKind::Rbd)
    }
}

/// What a volume's data is on this host ([`BlockDevice::backing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backing {
    /// A regular file: its file system's device and its inode.
    File { dev: u64, ino: u64 },
    /// A block device, by its device number (one disk has many nodes:
    /// /dev/sdb, /dev/disk/by-id/...).
    Device { rdev: u64 },
}

/// What [`BlockDevice::watch_size`] calls when the store says its size
/// may have been changed by another client. It runs on the backend's own
/// thread (librbd's), which waits for it: it must hand the news on and
/// return (a channel send), never wait or do I/O.
pub type SizeChanged = Box<dyn Fn() + Send + Sync>;

/// A backend. All methods take absolute byte offsets already checked by
/// [`Volume`]; implementations only have to do the I/O.
pub trait BlockDevice: Send + Sync + 'static {
    fn info(&self) -> &DeviceInfo;
    /// Fill `buf` from `offset`. Reading a hole returns zeroes.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Make every acknowledged write durable.
    fn flush(&self) -> io::Result<()>;
    /// Deallocate a range; it reads back as zeroes afterwards.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Write zeroes over a range (may deallocate).
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()>;
    /// A descriptor that `sendfile`/`splice` may read from at the same
    /// absolute offsets, so a front-end can move read data from the page
    /// cache to a socket without copying it through user space. `None` when
    /// reads must go through [`BlockDevice::read_at`]: O_DIRECT, or data on
    /// a device, where `sendfile` could block the calling network thread.
    fn zero_copy_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
    /// Where the volume's persistent reservations are kept so that every
    /// process serving it sees them (`None`: this process only).
    fn reservation_store(&self) -> io::Result<Option<Box<dyn bw_reservation::Store>>> {
        Ok(None)
    }
    /// What the backend is on this host, whatever path named it: a file's
    /// device and inode, a block device's device number ([`Backing`]);
    /// `None` for what no other volume can share (memory, a remote image).
    /// One file is one volume: two volumes on one `Backing` would each
    /// think the data, and its reservations, theirs.
    fn backing(&self) -> Option<Backing> {
        None
    }
    /// Change the size to `new_size` bytes (growing reads back as zeroes).
    /// Backends that cannot say no.
    fn resize(&self, new_size: u64) -> io::Result<()> {
        let _ = new_size;
        Err(io::Error::new(io::ErrorKind::Unsupported, "this backend cannot be resized"))
    }
    /// The size the store has now, asked afresh: another client (a second
    /// gateway, `rbd resize`) may have changed it since the volume read
    /// it. Backends only this process changes say their opened size.
    fn size_now(&self) -> io::Result<u64> {
        Ok(self.info().size_bytes)
    }
    /// Have `changed` called whenever another client may have changed the
    /// size (for rbd: any update of the image's header, librbd's
    /// `rbd_update_watch`); the id is for [`BlockDevice::unwatch_size`].
    /// `None`: the backend has no such news.
    fn watch_size(&self, changed: SizeChanged) -> io::Result<Option<u64>> {
        drop(changed);
        Ok(None)
    }
    /// End a [`BlockDevice::watch_size`]: once this returns, its `changed`
    /// is not running and is never called again.
    fn unwatch_size(&self, id: u64) {
        let _ = id;
    }
    /// Whether the bytes at `offset` are backed by storage, and for how long
    /// that stays so (at most `len`). Backends that cannot tell report
    /// everything as allocated, which is always a safe answer.
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Extent> {
        let _ = offset;
        Ok(Extent { allocated: true, len })
    }
    /// Start a read or write; `done` gets the request back (a read's data
    /// in its buffer) with the result, exactly once. Backends with
    /// [`DeviceInfo::async_submit`] return at once and call `done` later
    /// from a thread of their own, so `done` must be quick and must not
    /// block; dropping such a backend waits for the requests still in
    /// flight, whose `done` must therefore not hold the backend (see
    /// [`Volume::submit`]). This default runs the request with
    /// [`BlockDevice::read_at`]/[`BlockDevice::write_at`] and calls `done`
    /// before it returns.
    fn submit(&self, mut req: Request, done: OnDone) {
        let r = match &mut req {
            Request::Read { offset, len, buf } => {
                buf.clear();
                buf.resize(*len, 0);
                self.read_at(buf, *offset)
            }
            Request::Write { offset, data } => request::write_pieces(data, *offset, |b, at| self.write_at(b, at)),
        };
        done(req, r)
    }
}

/// A run of bytes with one allocation state, starting at the offset asked
/// about (see [`BlockDevice::allocation`]). Holes read back as zeroes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub allocated: bool,
    pub len: u64,
}
