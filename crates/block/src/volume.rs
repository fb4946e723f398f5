//! A named, shareable handle to a backend: range and read-only checks in one
//! place, plus I/O counters the lab reads.

use crate::{BlockDevice, BlockError, DeviceInfo, Request, Result};
use crate::qos::{Direction, Limiter, QosLimits};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

#[derive(Default, Debug)]
pub struct IoStats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub read_bytes: AtomicU64,
    pub written_bytes: AtomicU64,
    pub flushes: AtomicU64,
    pub discards: AtomicU64,
    pub errors: AtomicU64,
    /// Requests started and not finished yet (`blockwire ctl drain` waits
    /// for them).
    pub in_flight: AtomicU64,
}

/// Counts one request in flight until dropped.
struct Busy(Arc<IoStats>);

impl Busy {
    fn new(stats: &Arc<IoStats>) -> Busy {
        stats.in_flight.fetch_add(1, Relaxed);
        Busy(stats.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

#[derive(Default, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct IoStatsSnapshot {
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub errors: u64,
}

impl IoStats {
    pub fn snapshot(&self) -> IoStatsSnapshot {
        IoStatsSnapshot {
            reads: self.reads.load(Relaxed),
            writes: self.writes.load(Relaxed),
            read_bytes: self.read_bytes.load(Relaxed),
            written_bytes: self.written_bytes.load(Relaxed),
            flushes: self.flushes.load(Relaxed),
            discards: self.discards.load(Relaxed),
            errors: self.errors.load(Relaxed),
        }
    }

    fn count_read(&self, len: u64) {
        self.reads.fetch_add(1, Relaxed);
        self.read_bytes.fetch_add(len, Relaxed);
    }

    fn count_write(&self, len: u64) {
        self.writes.fetch_add(1, Relaxed);
        self.written_bytes.fetch_add(len, Relaxed);
    }

    /// Count a backend's error and turn it into the volume's.
    fn io_error(&self, e: std::io::Error) -> BlockError {
        self.errors.fetch_add(1, Relaxed);
        BlockError::Io(e)
    }
}

/// Cheap to clone; every front-end holds one per export.
#[derive(Clone)]
pub struct Volume {
    inner: Arc<VolumeInner>,
}

struct VolumeInner {
    name: String,
    dev: Box<dyn BlockDevice>,
    read_only: bool,
    /// Current size in bytes: the backend's at open, then what
    /// [`Volume::resize`] set (one relaxed load per range check).
    size: AtomicU64,
    /// Shared with submitted requests, which count their own errors.
    stats: Arc<IoStats>,
    /// The volume's persistent reservations, shared by every front-end
    /// that exports it (and, through its store, by other gateways).
    reservations: Arc<bw_reservation::Shared>,
    /// A memory-backed volume's backing file mapped (writable unless the
    /// volume is read-only), made at the first [`Volume::mapped_read`] or
    /// small write (None: the backend has no such file, or mmap failed).
    mapping: OnceLock<Option<Mapping>>,
    /// Writes copied into the mapping hold the stripes they touch, as a
    /// `pwrite` holds the inode's lock: two writes to one sector at once
    /// end as one or the other, never a mix.
    write_stripes: Box<[std::sync::Mutex<()>; WRITE_STRIPES]>,
    /// Whether a QoS limit is set: the one relaxed load an unlimited
    /// volume's request pays; `qos` is read only when it is.
    limited: AtomicBool,
    qos: arc_swap::ArcSwapOption<Limiter>,
    /// Requests the QoS limits held back, and for how long in all
    /// (nanoseconds), reads then writes: for the metrics.
    qos_delayed: [AtomicU64; 2],
    qos_delay_ns: [AtomicU64; 2],
}

/// A [`Volume::watch_size`] in force; dropping it ends the watch (and
/// waits for a callback that is running).
pub struct SizeWatch {
    volume: Volume,
    id: u64,
}

impl Drop for SizeWatch {
    fn drop(&mut self) {
        self.volume.inner.dev.unwatch_size(self.id);
    }
}

/// What the QoS limits of a volume have held back since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct QosThrottled {
    /// Reads and writes that had to wait.
    pub delayed: [u64; 2],
    /// How long they waited in all, nanoseconds (reads, writes).
    pub delay_ns: [u64; 2],
}

/// The backing file of a memory-backed volume (memfd, tmpfs) mapped
/// read-only and shared, so that a front-end can hand its bytes to a
/// system call (`sendmsg`) that copies them into the socket once, instead
/// of reading them into a buffer first (a `pread`: a system call, a page
/// cache lookup and a copy per read).
///
/// Nothing in user space ever reads through it: if the file were
/// truncated under the mapping (by someone else: the volume's own size
/// never shrinks below what it checks), a read there would raise SIGBUS
/// and end the process, where the kernel's copy fails with EFAULT and
/// only the system call fails.
///
/// Writes of at most [`MAPPED_WRITE_MAX`] bytes are copied into it instead
/// of `pwrite`n (a third of the cost: see `mapped_copy`), with a copy that
/// fails like the system call where a page is gone (`mapped_copy::copy`).
///
/// Those copies stream past the cache (`mapped_copy::copy_streaming`) in
/// a mapping of at least [`STREAM_CACHES`] times the last-level cache: a
/// random small write there almost never finds its lines cached, and an
/// ordinary copy reads each from memory before writing it (0.50 against
/// 0.28 µs per 4 KiB into 512 MiB; docs/notes/2026-11-29-streaming-writes.md).
/// In a smaller one the lines are often cached and the ordinary copy wins.
struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
    writable: bool,
    streaming: bool,
}

/// The largest write copied into the mapping: a small write's system call
/// costs as much as its copy; a large one's is spread over its bytes.
const MAPPED_WRITE_MAX: usize = 64 << 10;
/// Stripes of the write locks, each [`MAPPED_WRITE_MAX`] bytes of the
/// volume (modulo their number), so a mapped write takes one or two.
const WRITE_STRIPES: usize = 64;

// SAFETY: the mapping is read by the kernel only (system calls given its
// addresses) and written only by `mapped_copy::copy` under the write
// stripes' locks, so sharing it across threads cannot race in user space.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn of(fd: std::os::fd::BorrowedFd<'_>, len: u64, writable: bool) -> Option<Mapping> {
        use std::os::fd::AsRawFd;
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        let map = |prot| {
            // SAFETY: a fresh shared mapping of an open descriptor; the
            // result is checked before use.
            let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
            (ptr != libc::MAP_FAILED).then_some(ptr)
        };
        // A descriptor opened read-only maps read-only (writes then pwrite).
        let streaming = len as u64 >= STREAM_CACHES * last_level_cache_bytes();
        if let Some(ptr) = writable.then(|| map(libc::PROT_READ | libc::PROT_WRITE)).flatten() {
            return Some(Mapping { ptr, len, writable: true, streaming });
        }
        map(libc::PROT_READ).map(|ptr| Mapping { ptr, len, writable: false, streaming })
    }
}

/// How many last-level caches a mapping spans at least for its small
/// writes to stream. Measured (4 KiB copies to random places, 16 MiB L3):
/// ordinary 0.19 µs into 16 MiB, 0.33 into 64 MiB, 0.50 into 512 MiB;
/// streamed 0.28 at each. The break-even lies near twice the cache; four
/// times keeps clear of it.
const STREAM_CACHES: u64 = 4;

/// The largest cache CPU 0 has (its last level: the one a miss in goes to
/// memory), from sysfs; 32 MiB where it does not say.
fn last_level_cache_bytes() -> u64 {
    static BYTES: OnceLock<u64> = OnceLock::new();
    *BYTES.get_or_init(|| {
        let dir = "/sys/devices/system/cpu/cpu0/cache";
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
            .filter_map(|s| crate::size::parse_size(&s).ok())
            .max()
            .unwrap_or(32 << 20)
    })
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what `of` mapped, once; no MappedBytes refers to
        // it any more (each holds the volume, and so this, alive).
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// `len` bytes of a volume, in its mapped backing file ([`Volume::mapped_read`]),
/// for a system call to copy: [`MappedBytes::iovec`]. Holds the volume,
/// and so the mapping, alive.
pub struct MappedBytes {
    vol: Volume,
    ptr: *const u8,
    len: usize,
}

// SAFETY: see `Mapping`: the bytes are only ever handed to the kernel.
unsafe impl Send for MappedBytes {}
unsafe impl Sync for MappedBytes {}

impl MappedBytes {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes from `skip` on, for `sendmsg`/`writev` (never to be read
    /// in user space: see `Mapping`).
    #[inline]
    pub fn iovec(&self, skip: usize) -> libc::iovec {
        let skip = skip.min(self.len);
        // SAFETY: within the mapped range (checked when made).
        libc::iovec { iov_base: unsafe { self.ptr.add(skip) } as *mut libc::c_void, iov_len: self.len - skip }
    }

    /// `len` bytes from `start` (within these).
    #[inline]
    pub fn slice(&self, start: usize, len: usize) -> MappedBytes {
        assert!(start.checked_add(len).is_some_and(|e| e <= self.len), "slice {start}+{len} of {} mapped bytes", self.len);
        // SAFETY: within the range, as asserted.
        MappedBytes { vol: self.vol.clone(), ptr: unsafe { self.ptr.add(start) }, len }
    }

    /// Append `len` bytes from `skip` on to `out`, copied in user space
    /// with the copy that fails like a system call where the page is
    /// gone (`mapped_copy`: the file truncated under the mapping fails
    /// this copy with EFAULT, and never raises SIGBUS in the process):
    /// for a caller that needs the bytes in its own memory (user-space
    /// TLS seals them there) without a `pread`'s system call and page
    /// cache lookup. `None`: this machine has no such copy (a caller
    /// reads the file instead); on an error `out` is as it was.
    pub fn copy_into(&self, skip: usize, len: usize, out: &mut Vec<u8>) -> Option<std::io::Result<()>> {
        assert!(skip.checked_add(len).is_some_and(|e| e <= self.len), "{skip}+{len} of {} mapped bytes", self.len);
        out.reserve(len);
        let start = out.len();
        // SAFETY: the source is within the mapped range (asserted), which
        // the volume keeps mapped; the destination is `out`'s spare room,
        // `len` bytes reserved, not read until the copy is over.
        let r = unsafe { crate::mapped_copy::copy_raw(out.as_mut_ptr().add(start), self.ptr.add(skip), len) }?;
        if r.is_ok() {
            // SAFETY: the copy wrote all `len` bytes.
            unsafe { out.set_len(start + len) };
        }
        Some(r)
    }

    /// Ask the CPU to start loading `len` bytes from `skip` on into its
    /// caches, so that a [`MappedBytes::copy_into`] of them a little later
    /// (after another record's encryption) finds them there instead of
    /// waiting for memory. A prefetch reads nothing the program sees and
    /// never faults (x86's PREFETCHh is a hint the CPU drops for an
    /// address not mapped, or whose page is gone), so it is safe on a
    /// mapping whose file shrank, which a read is not (see `Mapping`).
    /// Elsewhere than x86-64, nothing.
    pub fn prefetch(&self, skip: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let end = skip.saturating_add(len).min(self.len);
            // One hint per page, at the first byte wanted in it: it starts
            // the page's address translation and its first line; the
            // CPU's own prefetcher follows a page read in order. A hint per
            // cache line (64 a page) stalled on the CPU's outstanding-miss
            // limit and cost as much as the copy it spared.
            let mut at = skip;
            while at < end {
                // SAFETY: a prefetch hint neither reads memory visibly nor
                // faults, whatever the address (above); `wrapping_add`
                // makes no claim about the pointer.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(self.ptr.wrapping_add(at).cast()) };
                at = (at | 4095) + 1;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (skip, len);
    }

    /// Whether [`MappedBytes::copy_into`] can copy on this machine.
    pub fn can_copy() -> bool {
        let mut probe = Vec::new();
        // SAFETY: a zero-byte copy reads and writes nothing.
        unsafe { crate::mapped_copy::copy_raw(probe.as_mut_ptr(), [0u8; 1].as_ptr(), 0) }.is_some()
    }

    /// The volume the bytes are of (to count an error the copy met).
    pub fn volume(&self) -> &Volume {
        &self.vol
    }
}

impl Volume {
    /// A volume whose reservations live in this process only.
    pub fn new(name: impl Into<String>, dev: Box<dyn BlockDevice>) -> Self {
        Volume::with_reservations(name, dev, bw_reservation::Shared::in_memory())
    }

    fn with_reservations(name: impl Into<String>, dev: Box<dyn BlockDevice>, reservations: Arc<bw_reservation::Shared>) -> Self {
        let read_only = dev.info().read_only;
        let size = AtomicU64::new(dev.info().size_bytes);
        Volume { inner: Arc::new(VolumeInner { name: name.into(), dev, read_only, size, stats: Arc::default(), reservations, mapping: OnceLock::new(), write_stripes: Box::new(std::array::from_fn(|_| std::sync::Mutex::new(()))), limited: AtomicBool::new(false), qos: Default::default(), qos_delayed: Default::default(), qos_delay_ns: Default::default() }) }
    }

    /// Open a backend spec and wrap it. Its persistent reservations are
    /// read back from where the backend keeps them
    /// ([`crate::BlockDevice::reservation_store`]): beside a regular file
    /// (`FILE.pr`), in a RADOS object beside an RBD image, in memory for
    /// the rest.
    pub fn open(name: impl Into<String>, spec: &crate::BackendSpec) -> Result<Self> {
        let name = name.into();
        let dev = crate::backend::open(spec)?;
        let store = dev.reservation_store()?;
        let reservations = match store {
            Some(store) => {
                let what = store.describe();
                bw_reservation::Shared::open(store).map_err(|e| std::io::Error::new(e.kind(), format!("volume {name}: reservations in {what}: {e}")))?
            }
            None => bw_reservation::Shared::in_memory(),
        };
        Ok(Volume::with_reservations(name, dev, reservations))
    }

    /// Set the volume's QoS limits (all zero: unlimited), live: requests
    /// from now on are held to them, with fresh buckets.
    pub fn set_qos(&self, limits: QosLimits) {
        if limits.is_unlimited() {
            self.inner.limited.store(false, Relaxed);
            self.inner.qos.store(None);
        } else {
            self.inner.qos.store(Some(Arc::new(Limiter::new(limits, std::time::Instant::now()))));
            self.inner.limited.store(true, Relaxed);
        }
    }

    pub fn qos(&self) -> QosLimits {
        self.inner.qos.load().as_ref().map(|l| l.limits()).unwrap_or_default()
    }

    /// Whether QoS limits hold the volume's requests back: front-ends then
    /// submit its reads and writes ([`Volume::submit`]), which wait on a
    /// timer, instead of running them on a thread that serves others.
    #[inline]
    pub fn limited(&self) -> bool {
        self.inner.limited.load(Relaxed)
    }

    /// When a request may start under the QoS limits (None: now).
    fn admit(&self, dir: Direction, len: u64) -> Option<std::time::Instant> {
        if !self.inner.limited.load(Relaxed) {
            return None;
        }
        let l = self.inner.qos.load_full()?;
        let now = std::time::Instant::now();
        let at = l.admit(dir, len, now);
        let wait = at.checked_duration_since(now).filter(|w| !w.is_zero())?;
        let d = dir as usize;
        self.inner.qos_delayed[d].fetch_add(1, Relaxed);
        self.inner.qos_delay_ns[d].fetch_add(wait.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
        Some(at)
    }

    /// What the QoS limits have held back so far (counters that only grow,
    /// across limit changes).
    pub fn qos_throttled(&self) -> QosThrottled {
        let get = |a: &[AtomicU64; 2]| [a[0].load(Relaxed), a[1].load(Relaxed)];
        QosThrottled { delayed: get(&self.inner.qos_delayed), delay_ns: get(&self.inner.qos_delay_ns) }
    }

    /// For the synchronous calls: wait on this thread until the request
    /// may start (their callers run them on threads of their own: the
    /// blocking pool, AoE's and NVMe/RDMA's connection threads).
    fn throttle(&self, dir: Direction, len: u64) {
        if let Some(at) = self.admit(dir, len) {
            std::thread::sleep(at.saturating_duration_since(std::time::Instant::now()));
        }
    }

    /// What the volume's data is on this host (one file, one volume).
    pub fn backing(&self) -> Option<crate::Backing> {
        self.inner.dev.backing()
    }

    /// The volume's persistent reservations (SCSI and NVMe share them).
    pub fn reservations(&self) -> &Arc<bw_reservation::Shared> {
        &self.inner.reservations
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }
    #[inline]
    pub fn info(&self) -> &DeviceInfo {
        self.inner.dev.info()
    }
    #[inline]
    pub fn size_bytes(&self) -> u64 {
        self.inner.size.load(Relaxed)
    }
    /// Grow or shrink the backend to `new_size` bytes (a multiple of 512);
    /// front-ends then tell their initiators (the size is read live).
    pub fn resize(&self, new_size: u64) -> Result<()> {
        if new_size == 0 || !new_size.is_multiple_of(crate::SECTOR_SIZE as u64) {
            return Err(BlockError::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("size {new_size} is not a positive multiple of {} bytes", crate::SECTOR_SIZE))));
        }
        self.inner.dev.resize(new_size).map_err(BlockError::Io)?;
        self.inner.size.store(new_size, Relaxed);
        Ok(())
    }
    /// The size the backend's store has now ([`crate::BlockDevice::size_now`]),
    /// which differs from [`Volume::size_bytes`] when another client
    /// resized it and this volume has not been resized to match yet.
    pub fn size_now(&self) -> Result<u64> {
        self.inner.dev.size_now().map_err(BlockError::Io)
    }
    /// Have `changed` called when another client may have changed the
    /// backend's size, until the returned watch is dropped; `None` if the
    /// backend has no such news. The watch keeps the volume open.
    pub fn watch_size(&self, changed: crate::SizeChanged) -> Result<Option<SizeWatch>> {
        let id = self.inner.dev.watch_size(changed).map_err(BlockError::Io)?;
        Ok(id.map(|id| SizeWatch { volume: self.clone(), id }))
    }
    /// Number of 512-byte sectors.
    pub fn sectors(&self) -> u64 {
        self.size_bytes() / crate::SECTOR_SIZE as u64
    }
    pub fn read_only(&self) -> bool {
        self.inner.read_only
    }
    pub fn stats(&self) -> IoStatsSnapshot {
        self.inner.stats.snapshot()
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        let size = self.size_bytes();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(BlockError::OutOfRange { offset, len, size }),
        }
    }

    fn check_write(&self, offset: u64, len: u64) -> Result<()> {
        if self.inner.read_only {
            return Err(BlockError::ReadOnly);
        }
        self.check(offset, len)
    }

    fn count_err<T>(&self, r: std::io::Result<T>) -> Result<T> {
        r.map_err(|e| self.inner.stats.io_error(e))
    }

    /// Requests started on the volume and not finished.
    pub fn in_flight(&self) -> u64 {
        self.inner.stats.in_flight.load(Relaxed)
    }

    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.throttle(Direction::Read, buf.len() as u64);
        let _busy = Busy::new(&self.inner.stats);
        self.inner.stats.count_read(buf.len() as u64);
        self.count_err(self.inner.dev.read_at(buf, offset))
    }

    /// Check and count a read that the caller will carry out itself with
    /// `sendfile`/`splice` from the returned descriptor at `offset` (the
    /// backend's offsets are the volume's). `Ok(None)`: this backend has no
    /// zero-copy path; use [`Volume::read_at`]. Report a failed transfer with
    /// [`Volume::note_error`].
    pub fn zero_copy_read(&self, offset: u64, len: u64) -> Result<Option<std::os::fd::BorrowedFd<'_>>> {
        self.check(offset, len)?;
        if self.limited() {
            // Read (and so held to the limits) with read_at.
            return Ok(None);
        }
        let Some(fd) = self.inner.dev.zero_copy_fd() else { return Ok(None) };
        self.inner.stats.count_read(len);
        Ok(Some(fd))
    }

    /// `len` bytes at `offset` as a region of the volume's mapped backing
    /// file, for a front-end that gives them to a system call which copies
    /// them into a socket (one copy in all, where a `read_at` into a
    /// buffer and its send make two). Counted as a read. `Ok(None)`: the
    /// backend has no memory-backed file (see
    /// `BlockDevice::zero_copy_fd`), or the range lies beyond the size
    /// mapped at the first call (the volume grew since): use
    /// [`Volume::read_at`]. A copy that fails (EFAULT: the file was
    /// truncated by someone else) is reported with [`Volume::note_error`].
    pub fn mapped_read(&self, offset: u64, len: u64) -> Result<Option<MappedBytes>> {
        self.check(offset, len)?;
        if self.limited() {
            return Ok(None);
        }
        let Some(m) = self.mapping() else { return Ok(None) };
        let end = offset.checked_add(len).filter(|&e| e <= m.len as u64);
        if end.is_none() {
            return Ok(None);
        }
        self.inner.stats.count_read(len);
        // SAFETY: offset + len is within the mapping (checked above).
        let ptr = unsafe { (m.ptr as *const u8).add(offset as usize) };
        Ok(Some(MappedBytes { vol: self.clone(), ptr, len: len as usize }))
    }

    /// Count an I/O error the front-end hit outside the volume's own calls.
    pub fn note_error(&self) {
        self.inner.stats.errors.fetch_add(1, Relaxed);
    }

    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check_write(offset, buf.len() as u64)?;
        self.throttle(Direction::Write, buf.len() as u64);
        let _busy = Busy::new(&self.inner.stats);
        self.inner.stats.count_write(buf.len() as u64);
        if let Some(r) = self.mapped_write(buf, offset) {
            return self.count_err(r);
        }
        self.count_err(self.inner.dev.write_at(buf, offset))
    }

    /// A small checked write copied into the memory-backed file's mapping
    /// (see `Mapping`); `None`: `pwrite` it.
    fn mapped_write(&self, buf: &[u8], offset: u64) -> Option<std::io::Result<()>> {
        if buf.is_empty() || buf.len() > MAPPED_WRITE_MAX {
            return None;
        }
        let m = self.mapping()?;
        let end = offset.checked_add(buf.len() as u64).filter(|&e| m.writable && e <= m.len as u64)?;
        let stripe = |at: u64| (at / MAPPED_WRITE_MAX as u64) as usize % WRITE_STRIPES;
        let (a, b) = (stripe(offset), stripe(end - 1));
        let (first, second) = (a.min(b), a.max(b));
        let lock = |i: usize| self.inner.write_stripes[i].lock().unwrap_or_else(|e| e.into_inner());
        let _held = (lock(first), (second != first).then(|| lock(second)));
        let dst = (m.ptr as *mut u8).wrapping_add(offset as usize);
        // SAFETY: offset + len is within the mapping (checked above), which
        // the kernel alone reads; the stripes are held.
        unsafe {
            if m.streaming {
                crate::mapped_copy::copy_streaming(dst, buf)
            } else {
                crate::mapped_copy::copy(dst, buf)
            }
        }
    }

    /// The memory-backed file's mapping, made at the first call.
    fn mapping(&self) -> Option<&Mapping> {
        self.inner
            .mapping
            .get_or_init(|| {
                let fd = self.inner.dev.zero_copy_fd()?;
                // No further than the file goes: past its end the kernel's
                // copy would fail, where a read returns what is there.
                let file_len = std::fs::File::from(fd.try_clone_to_owned().ok()?).metadata().ok()?.len();
                Mapping::of(fd, self.size_bytes().min(file_len), !self.inner.read_only)
            })
            .as_ref()
    }

    pub fn flush(&self) -> Result<()> {
        let _busy = Busy::new(&self.inner.stats);
        self.inner.stats.flushes.fetch_add(1, Relaxed);
        self.count_err(self.inner.dev.flush())
    }

    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check_write(offset, len)?;
        // An I/O under the IOPS limits, moving no bytes (as SPDK counts
        // an unmap).
        self.throttle(Direction::Write, 0);
        let _busy = Busy::new(&self.inner.stats);
        self.inner.stats.discards.fetch_add(1, Relaxed);
        self.count_err(self.inner.dev.discard(offset, len))
    }

    /// Start a read or write (see [`BlockDevice::submit`]) after the checks
    /// and counting [`Volume::read_at`] and [`Volume::write_at`] do. `done`
    /// gets the request back with its result exactly once: at once on this
    /// thread if the checks fail or the backend has no
    /// [`DeviceInfo::async_submit`], else later on one of the backend's
    /// threads (so it must be quick and not block).
    ///
    /// A request in flight does not keep the volume open: if the last
    /// handle went away in `done`, on the backend's own thread, the backend
    /// would be closed there (librbd's close waits for that very callback).
    /// Backends with `async_submit` finish their requests in flight when
    /// they are dropped instead.
    pub fn submit(&self, req: Request, done: impl FnOnce(Request, Result<()>) + Send + 'static) {
        let (offset, len) = (req.offset(), req.len());
        let checked = if req.is_write() { self.check_write(offset, len) } else { self.check(offset, len) };
        if let Err(e) = checked {
            return done(req, Err(e));
        }
        let dir = if req.is_write() { Direction::Write } else { Direction::Read };
        if self.limited() {
            let at = self.admit(dir, len);
            let info = self.info();
            // Held back, or a backend whose calls would block the caller
            // (a front-end's network task): the timer thread submits it.
            if at.is_some() || (!info.async_submit && info.io_may_block()) {
                let vol = self.clone();
                let at = at.unwrap_or_else(std::time::Instant::now);
                return crate::qos::timer::schedule(at, move || vol.start(req, dir, done));
            }
        }
        self.start(req, dir, done)
    }

    /// Count and start a checked request.
    fn start(&self, req: Request, dir: Direction, done: impl FnOnce(Request, Result<()>) + Send + 'static) {
        let len = req.len();
        let stats = self.inner.stats.clone();
        if dir == Direction::Write {
            stats.count_write(len);
        } else {
            stats.count_read(len);
        }
        let busy = Busy::new(&stats);
        self.inner.dev.submit(
            req,
            Box::new(move |req, r| {
                drop(busy);
                done(req, r.map_err(|e| stats.io_error(e)))
            }),
        );
    }

    /// The allocation state at `offset` and how far it extends (at most
    /// `len`, never past the end): the answer GET LBA STATUS and NVMe's
    /// deallocated-block reporting give.
    pub fn allocation(&self, offset: u64, len: u64) -> Result<crate::Extent> {
        self.check(offset, 1)?;
        let len = len.min(self.size_bytes() - offset);
        let e = self.count_err(self.inner.dev.allocation(offset, len))?;
        Ok(crate::Extent { allocated: e.allocated, len: e.len.clamp(1, len) })
    }

    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.check_write(offset, len)?;
        self.throttle(Direction::Write, 0);
        let _busy = Busy::new(&self.inner.stats);
        self.inner.stats.writes.fetch_add(1, Relaxed);
        self.count_err(self.inner.dev.write_zeroes(offset, len))
    }
}

impl std::fmt::Debug for Volume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Volume").field("name", &self.inner.name).field("info", self.info()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BackendSpec;
    use proptest::prelude::*;

    #[test]
    fn rejects_out_of_range_and_read_only_writes() {
        let v = Volume::open("v", &BackendSpec::ram(4096)).unwrap();
        let mut b = [0u8; 512];
        assert!(matches!(v.read_at(&mut b, 4096), Err(BlockError::OutOfRange { .. })));
        assert!(matches!(v.read_at(&mut b, u64::MAX - 10), Err(BlockError::OutOfRange { .. })));
        let ro = Volume::open("ro", &BackendSpec::parse("ram:4k,readonly").unwrap()).unwrap();
        assert!(matches!(ro.write_at(&b, 0), Err(BlockError::ReadOnly)));
        assert!(matches!(ro.discard(0, 512), Err(BlockError::ReadOnly)));
        ro.read_at(&mut b, 0).unwrap();
        assert_eq!(ro.stats().reads, 1);
    }

    #[test]
    fn zero_copy_read_hands_out_the_backing_fd() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let v = Volume::open("z", &BackendSpec::ram(8192)).unwrap();
        v.write_at(&[7u8; 512], 1024).unwrap();
        assert!(matches!(v.zero_copy_read(8000, 512), Err(BlockError::OutOfRange { .. })));
        let fd = v.zero_copy_read(1024, 512).unwrap().expect("ram has a zero-copy fd");
        // sendfile from the fd at the volume offset into a pipe yields the data.
        let (mut r, w) = std::io::pipe().unwrap();
        let mut off: libc::off_t = 1024;
        let n = unsafe { libc::sendfile(w.as_raw_fd(), fd.as_raw_fd(), &mut off, 512) };
        assert_eq!(n, 512);
        drop(w);
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        assert_eq!(got, vec![7u8; 512]);
        assert_eq!(v.stats().reads, 1);
        assert_eq!(v.stats().read_bytes, 512);
    }

    /// Bytes a system call copies out of `m` (a pipe's writev), as the
    /// outbox's sendmsg does; the error where the copy fails.
    fn copied_by_the_kernel(m: &MappedBytes) -> std::io::Result<Vec<u8>> {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let (mut r, w) = std::io::pipe()?;
        let iov = m.iovec(0);
        // SAFETY: one iovec the kernel reads.
        let n = unsafe { libc::writev(w.as_raw_fd(), &iov, 1) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        drop(w);
        let mut got = Vec::new();
        r.read_to_end(&mut got)?;
        Ok(got)
    }

    #[test]
    fn mapped_read_hands_the_kernel_the_bytes_and_counts_them() {
        let v = Volume::open("m", &BackendSpec::ram(8192)).unwrap();
        v.write_at(&[9u8; 512], 1024).unwrap();
        assert!(matches!(v.mapped_read(8000, 512), Err(BlockError::OutOfRange { .. })));
        let m = v.mapped_read(1024, 1024).unwrap().expect("ram is memory-backed");
        assert_eq!(copied_by_the_kernel(&m).unwrap(), [vec![9u8; 512], vec![0u8; 512]].concat());
        // Written after the mapping was made: the kernel's copy sees it.
        v.write_at(&[5u8; 512], 1536).unwrap();
        assert_eq!(copied_by_the_kernel(&m.slice(512, 512)).unwrap(), vec![5u8; 512]);
        assert_eq!(v.stats().reads, 1, "the one mapped_read is counted");
        // Beyond what was mapped (the volume grew since): none.
        v.resize(16384).unwrap();
        assert!(v.mapped_read(8192, 512).unwrap().is_none());
        // A file whose reads may wait for a device is not mapped.
        let dir = std::env::temp_dir().join(format!("bw-map-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("d.img");
        std::fs::write(&f, vec![0u8; 4096]).unwrap();
        let d = Volume::open("d", &BackendSpec::parse(&format!("file:{}", f.display())).unwrap()).unwrap();
        if !d.info().memory_backed {
            assert!(d.mapped_read(0, 512).unwrap().is_none(), "a file on disk is mapped");
        }
        drop(d);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A backing file truncated under the mapping by someone else: the
    /// kernel's copy fails (EFAULT), the process lives on (a read of the
    /// mapping in user space would have raised SIGBUS).
    #[test]
    fn a_file_truncated_under_the_mapping_fails_the_copy_not_the_process() {
        let shm = std::path::Path::new("/dev/shm");
        if !shm.is_dir() {
            return;
        }
        let f = shm.join(format!("bw-trunc-{}.img", std::process::id()));
        std::fs::write(&f, vec![3u8; 64 * 1024]).unwrap();
        let v = Volume::open("t", &BackendSpec::parse(&format!("file:{}", f.display())).unwrap()).unwrap();
        let m = v.mapped_read(32 * 1024, 4096).unwrap().expect("tmpfs is memory-backed");
        assert_eq!(copied_by_the_kernel(&m).unwrap(), vec![3u8; 4096]);
        std::fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(4096).unwrap();
        let e = copied_by_the_kernel(&m).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
        // A prefetch of the gone bytes (user-space TLS hints the next
        // record's payload) is a hint only: the process lives on.
        m.prefetch(0, 4096);
        // A small write there is copied into the mapping: it fails the
        // same way (SIGBUS caught), and is counted as the volume's error.
        let errors = v.stats().errors;
        assert!(matches!(v.write_at(&[7u8; 4096], 32 * 1024), Err(BlockError::Io(e)) if e.raw_os_error() == Some(libc::EFAULT)));
        assert_eq!(v.stats().errors, errors + 1);
        // Where the file still is, it lands.
        v.write_at(&[7u8; 512], 512).unwrap();
        assert_eq!(std::fs::read(&f).unwrap()[512..1024], [7u8; 512]);
        std::fs::remove_file(&f).unwrap();
        let _ = std::fs::remove_file(f.with_extension("img.pr"));
    }

    /// A volume of [`STREAM_CACHES`] last-level caches streams its small
    /// writes past the cache; a smaller one copies them as before. Either
    /// way each lands whole (streamed where aligned to 16 bytes and a
    /// multiple of 64 long, copied otherwise), and a streamed write into a
    /// page truncated away fails that write, not the process.
    #[test]
    fn small_writes_into_a_volume_larger_than_the_cache_stream_and_land() {
        let shm = std::path::Path::new("/dev/shm");
        if !shm.is_dir() {
            return;
        }
        let size = STREAM_CACHES * last_level_cache_bytes();
        let f = shm.join(format!("bw-stream-{}.img", std::process::id()));
        // Sparse: only the pages written take memory.
        std::fs::File::create(&f).unwrap().set_len(size).unwrap();
        let v = Volume::open("s", &BackendSpec::parse(&format!("file:{}", f.display())).unwrap()).unwrap();
        let small = Volume::open("c", &BackendSpec::ram(1 << 20)).unwrap();
        let streaming = |v: &Volume| v.inner.mapping.get().and_then(|m| m.as_ref()).map(|m| m.streaming);
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 + i / 97) as u8).collect();
        for (off, from, len) in [(size - 4096, 0, 4096), (4096 * 1000, 3, 4096), (512 * 7, 1, 512), (1000, 0, 100), (size - 64, 5, 64)] {
            v.write_at(&data[from..from + len], off).unwrap();
            let mut back = vec![0u8; len];
            v.read_at(&mut back, off).unwrap();
            assert_eq!(back, data[from..from + len], "at {off} len {len}");
        }
        small.write_at(&data[..4096], 8192).unwrap();
        assert_eq!((streaming(&v), streaming(&small)), (Some(true), Some(false)));
        std::fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(4096).unwrap();
        assert!(matches!(v.write_at(&data[..4096], 4096 * 1000), Err(BlockError::Io(e)) if e.raw_os_error() == Some(libc::EFAULT)));
        drop(v);
        std::fs::remove_file(&f).unwrap();
        let _ = std::fs::remove_file(f.with_extension("img.pr"));
    }

    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        let parse = |s: &str| crate::size::parse_size(s).ok();
        assert_eq!(parse("16384K\n"), Some(16 << 20));
        assert_eq!(parse("32M"), Some(32 << 20));
        assert_eq!(parse("512"), Some(512));
        assert_eq!(parse("1G"), Some(1 << 30));
        assert_eq!(parse("12X"), None);
        assert_eq!(parse(""), None);
        assert!(last_level_cache_bytes() >= 1 << 10);
    }

    /// Small writes of a RAM volume go into its mapping: what pread sees,
    /// counted; one past the mapping (the volume grew) and a large one
    /// pwrite as before; two writes of one range at once end as one of
    /// them in every sector, never a mix.
    #[test]
    fn small_writes_land_through_the_mapping_whole() {
        let v = Volume::open("w", &BackendSpec::ram(1 << 20)).unwrap();
        let mut back = vec![0u8; 4096];
        v.write_at(&[1u8; 4096], 8192).unwrap();
        v.read_at(&mut back, 8192).unwrap();
        assert_eq!(back, [1u8; 4096]);
        assert!(v.inner.mapping.get().is_some_and(|m| m.as_ref().is_some_and(|m| m.writable)), "a RAM volume's small write made a writable mapping");
        v.resize(2 << 20).unwrap();
        v.write_at(&[2u8; 4096], (1 << 20) + 4096).unwrap();
        v.read_at(&mut back, (1 << 20) + 4096).unwrap();
        assert_eq!(back, [2u8; 4096]);
        let big = vec![3u8; MAPPED_WRITE_MAX + 512];
        v.write_at(&big, 0).unwrap();
        let mut bigback = vec![0u8; big.len()];
        v.read_at(&mut bigback, 0).unwrap();
        assert_eq!(bigback, big);
        assert_eq!(v.stats().writes, 3);
        // Across a stripe's edge, from two threads at once, many times.
        let at = MAPPED_WRITE_MAX as u64 - 2048;
        std::thread::scope(|s| {
            for b in [0x11u8, 0x22] {
                let v = &v;
                s.spawn(move || {
                    for _ in 0..2000 {
                        v.write_at(&[b; 4096], at).unwrap();
                    }
                });
            }
        });
        v.read_at(&mut back, at).unwrap();
        assert!(back.iter().all(|&x| x == back[0]), "a mix of two writes");
    }

    #[test]
    fn submit_checks_counts_and_completes() {
        use std::sync::mpsc;
        let v = Volume::open("s", &BackendSpec::ram(8192)).unwrap();
        assert!(!v.info().async_submit);
        let (tx, rx) = mpsc::channel();
        let t = tx.clone();
        let data = vec![bytes::Bytes::from(vec![1u8; 512]), bytes::Bytes::from(vec![2u8; 1024])];
        v.submit(Request::Write { offset: 512, data }, move |req, r| t.send((req, r.is_ok())).unwrap());
        let (req, ok) = rx.recv().unwrap();
        assert!(ok && req.is_write() && req.len() == 1536);
        let t = tx.clone();
        v.submit(Request::read(0, 2048), move |req, r| t.send((req, r.is_ok())).unwrap());
        let (req, ok) = rx.recv().unwrap();
        assert!(ok);
        let buf = req.into_buf();
        assert_eq!(&buf[..512], &[0u8; 512][..]);
        assert_eq!(&buf[512..1024], &[1u8; 512][..]);
        assert_eq!(&buf[1024..], &[2u8; 1024][..]);
        // Past the end: fails without reaching the backend, uncounted.
        let t = tx.clone();
        v.submit(Request::read(8000, 512), move |req, r| {
            t.send((req, matches!(r, Err(BlockError::OutOfRange { .. })))).unwrap()
        });
        assert!(rx.recv().unwrap().1);
        let s = v.stats();
        assert_eq!((s.reads, s.read_bytes, s.writes, s.written_bytes, s.errors), (1, 2048, 1, 1536, 0));
        let ro = Volume::open("ro", &BackendSpec::parse("ram:4k,readonly").unwrap()).unwrap();
        let t = tx.clone();
        ro.submit(Request::Write { offset: 0, data: vec![bytes::Bytes::from_static(&[0; 512])] }, move |req, r| {
            t.send((req, matches!(r, Err(BlockError::ReadOnly)))).unwrap()
        });
        assert!(rx.recv().unwrap().1);
    }

    proptest! {
        // The RAM backend behaves like a byte array under any write sequence.
        #[test]
        fn ram_matches_model(ops in proptest::collection::vec((0u64..8192, 1usize..2048, any::<u8>(), any::<bool>()), 1..40)) {
            let v = Volume::open("m", &BackendSpec::ram(10240)).unwrap();
            let mut model = vec![0u8; 10240];
            for (off, len, byte, zero) in ops {
                let len = len.min(10240 - off as usize);
                if zero {
                    v.write_zeroes(off, len as u64).unwrap();
                    model[off as usize..off as usize + len].fill(0);
                } else {
                    v.write_at(&vec![byte; len], off).unwrap();
                    model[off as usize..off as usize + len].fill(byte);
                }
            }
            let mut all = vec![0u8; 10240];
            v.read_at(&mut all, 0).unwrap();
            prop_assert_eq!(all, model);
        }
    }
}

#[cfg(test)]
mod qos_tests {
    use super::*;
    use crate::{BackendSpec, QosLimits};
    use std::time::{Duration, Instant};

    /// Held to the limit on both ways in (submitted and synchronous),
    /// asserted only from above (a slow machine is only slower); lifting
    /// the limit stops holding requests.
    #[test]
    fn a_limit_holds_requests_to_its_rate_and_lifting_it_frees_them() {
        let v = Volume::open("q", &BackendSpec::ram(1 << 20)).unwrap();
        assert!(!v.limited());
        v.set_qos(QosLimits { rw_ios_per_sec: 1000, ..Default::default() });
        assert!(v.limited() && v.qos().rw_ios_per_sec == 1000);
        assert!(v.zero_copy_read(0, 512).unwrap().is_none() && v.mapped_read(0, 512).unwrap().is_none(), "no path around the limiter");
        let t0 = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..300u64 {
            let tx = tx.clone();
            v.submit(Request::read((i % 64) * 4096, 4096), move |_, r| tx.send(r.is_ok()).unwrap());
        }
        for _ in 0..300 {
            assert!(rx.recv().unwrap());
        }
        // 300 I/Os at 1000/s with a 100 ms burst: at least 0.2 s.
        assert!(t0.elapsed() >= Duration::from_millis(195), "300 I/Os took {:?} under 1000 IOPS", t0.elapsed());
        let t1 = Instant::now();
        let mut b = [0u8; 4096];
        for _ in 0..300 {
            v.read_at(&mut b, 0).unwrap();
        }
        assert!(t1.elapsed() >= Duration::from_millis(195), "300 synchronous reads took {:?}", t1.elapsed());
        v.set_qos(QosLimits::default());
        assert!(!v.limited() && v.zero_copy_read(0, 512).unwrap().is_some());
        assert_eq!(v.stats().reads, 601);
    }
}
