//! `rbd:POOL/IMAGE`: a Ceph RBD image through librbd.
//!
//! Every request goes through `rbd_aio_*`. Reads and writes from the
//! front-ends come in through [`crate::BlockDevice::submit`]: the request
//! (and the memory librbd reads from or writes into) moves into the
//! completion, librbd's callback hands it back to the front-end's closure
//! on a librbd thread, and nothing waits in between. The iSCSI and NVMe/TCP
//! connection tasks submit from their own thread, and the closure sends the
//! result to the connection's channel: per request one hop from the
//! connection to librbd and one back, instead of a blocking-pool thread
//! woken to submit and woken again by the completion (24 us of gateway CPU
//! per 4 KiB read against 61 that way, of which librbd alone costs 19;
//! docs/ceph.md, "How a request flows"). The synchronous methods
//! (flush, discard, write-zeroes, and reads and writes from callers that
//! have a thread to spare) submit the same way and sleep on a condition
//! variable until the callback fires.
//!
//! Settings forced on every connection, because several gateways may serve
//! one image at once:
//! - `rbd_cache = false`: a write-back cache in one gateway would hide its
//!   writes from the others (and lose them if the gateway dies); every write
//!   is acknowledged only once the OSDs have it.
//! - `rbd_skip_partial_discard = false`: a discard must read back as zeroes,
//!   also where it covers only part of an object.
//! - `rados_osd_op_timeout` / `rados_mon_op_timeout` / `client_mount_timeout`
//!   = `timeout=` seconds: librados waits for a missing cluster forever by
//!   default; a gateway must fail the request instead, so the initiator sees
//!   an error and can use another path.

mod admin;
mod connection;
mod ffi;
mod pr_store;

pub use admin::RbdPool;

use crate::{BackendSpec, BlockError, DeviceInfo, Durability, RbdTarget};
use crate::{OnDone, Request};
use connection::{check, cstr, rbd_error, Connection};
use ffi::{Completion, Lib};
use std::ffi::{c_char, c_int, c_void};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub struct RbdDevice {
    lib: &'static Lib,
    /// Dropped after the image is closed (fields drop after `drop`).
    conn: Arc<Connection>,
    /// Where the image's reservations live (the head, writable images only).
    pool_image: Option<(String, String)>,
    image: ffi::Image,
    info: DeviceInfo,
    /// Shared with the requests in flight.
    failures: Arc<FailureLog>,
    /// Update watches in force, by librbd's handle: the callback each was
    /// given ([`RbdDevice::watch_size`]), freed once it is unwatched.
    watches: Mutex<std::collections::HashMap<u64, UpdateArg>>,
}

/// A [`crate::SizeChanged`] handed to librbd as its callback's argument
/// (from `Box::into_raw`).
struct UpdateArg(*mut crate::SizeChanged);

/// Update watches in force in this process, all images: a removed volume
/// whose watch outlived it would show here (`status` reports it).
static UPDATE_WATCHES: AtomicU64 = AtomicU64::new(0);

/// Failed requests, logged at most once per [`FailureLog::EVERY`] with the
/// count since the last line: during a cluster outage every request fails,
/// and the operator needs the cause, not thousands of copies of it.
#[derive(Default)]
struct FailureLog {
    /// The device's description, for the error messages.
    device: String,
    since_last: AtomicU64,
    last: Mutex<Option<Instant>>,
}

impl FailureLog {
    const EVERY: Duration = Duration::from_secs(5);

    /// A request's return value: negative is an error naming the request,
    /// logged; otherwise the bytes it moved.
    fn check(&self, ret: isize, what: &str, offset: u64) -> io::Result<isize> {
        if ret >= 0 {
            return Ok(ret);
        }
        let e = rbd_error(ret as c_int, || format!("{what} at offset {offset} on {}", self.device));
        self.note(&e);
        Err(e)
    }

    fn note(&self, e: &io::Error) {
        let n = self.since_last.fetch_add(1, Relaxed) + 1;
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            return;
        }
        *last = Some(Instant::now());
        self.since_last.store(0, Relaxed);
        log::warn!(
            "{e} ({n} failed request{} since the last report)",
            if n == 1 { "" } else { "s" }
        );
    }
}

// SAFETY: librbd image handles and librados clusters are thread-safe (one
// handle serves any number of concurrent aio requests); we never free them
// before `drop`.
unsafe impl Send for RbdDevice {}
unsafe impl Sync for RbdDevice {}

impl RbdDevice {
    /// How many librbd update watches this process has in force.
    pub fn update_watches() -> u64 {
        UPDATE_WATCHES.load(Relaxed)
    }

    /// `rbd_get_size`, which refreshes the image first if its header
    /// changed since librbd last read it.
    fn image_size(&self) -> io::Result<u64> {
        let mut size = 0u64;
        // SAFETY: an open image and an out-pointer.
        check(unsafe { (self.lib.rbd_get_size)(self.image, &mut size) }, || format!("{}: rbd_get_size", self.info.description))?;
        Ok(size)
    }

    /// `rbd_update_unwatch`, then free the callback (librbd has returned
    /// from it for good once the call returns).
    fn unwatch(&self, handle: u64, arg: UpdateArg) {
        // SAFETY: an open image and a handle of ours, unwatched once (it
        // left the map).
        let r = unsafe { (self.lib.rbd_update_unwatch)(self.image, handle) };
        if let Err(e) = check(r, || format!("{}: rbd_update_unwatch", self.info.description)) {
            // Only -ENOENT (never registered) is possible: nothing calls
            // back with it either way.
            log::warn!("{e}");
        }
        UPDATE_WATCHES.fetch_sub(1, Relaxed);
        // SAFETY: from `Box::into_raw` in `watch_size`; librbd no longer
        // has it.
        drop(unsafe { Box::from_raw(arg.0) });
    }

    pub fn open(spec: &BackendSpec, t: &RbdTarget) -> Result<Self, BlockError> {
        let lib = ffi::lib().map_err(io::Error::other)?;
        let name = match &t.snap {
            Some(snap) => format!("rbd:{}/{}@{snap}", t.pool, t.image),
            None => format!("rbd:{}/{}", t.pool, t.image),
        };
        let timeout = t.timeout_secs.unwrap_or(RbdTarget::DEFAULT_TIMEOUT_SECS).to_string();
        let conn = Arc::new(Connection::open(&name, t)?);
        // From here on `dev`'s Drop releases whatever has been set up.
        let mut dev = RbdDevice {
            lib,
            conn,
            pool_image: (t.snap.is_none() && !spec.readonly).then(|| (t.pool.clone(), t.image.clone())),
            image: std::ptr::null_mut(),
            info: DeviceInfo {
                kind: crate::DeviceKind::Rbd,
                direct: false,
                size_bytes: 0,
                read_only: spec.readonly || t.snap.is_some(),
                durability: Durability::WriteThrough,
                supports_discard: true,
                memory_backed: false,
                remote: true,
                async_submit: true,
                description: String::new(),
            },
            failures: Arc::default(),
            watches: Mutex::default(),
        };
        dev.open_image(&name, spec, t)?;
        let size = dev.checked_size(&name, t)?;
        dev.warn_exclusive_lock(&name, spec, t)?;
        dev.info.size_bytes = size;
        dev.info.description = format!(
            "{name} ({}, {} s request timeout)",
            crate::format_size(size),
            timeout
        );
        dev.failures = Arc::new(FailureLog { device: dev.info.description.clone(), ..FailureLog::default() });
        Ok(dev)
    }

    /// Open the image, creating it first if it does not exist and the spec
    /// gives its size.
    fn open_image(&mut self, name: &str, spec: &BackendSpec, t: &RbdTarget) -> io::Result<()> {
        let lib = self.lib;
        let image = cstr("image", &t.image)?;
        let snap = t.snap.as_deref().map(|s| cstr("snapshot", s)).transpose()?;
        let read_only = spec.readonly || snap.is_some();
        let open = |this: &mut RbdDevice| {
            let f = if read_only {
                lib.rbd_open_read_only
            } else {
                lib.rbd_open
            };
            // SAFETY: valid ioctx, image name, out-pointer; NULL snapshot = the head.
            unsafe { f(this.conn.ioctx, image.as_ptr(), &mut this.image, snap.as_ref().map_or(std::ptr::null(), |s| s.as_ptr())) }
        };
        let mut r = open(self);
        if r == -libc::ENOENT && !read_only {
            if let Some(size) = t.size {
                let mut order: c_int = 0; // 0: librbd's default object size
                                          // SAFETY: valid ioctx and name; `order` is an in/out int.
                check(
                    unsafe {
                        (lib.rbd_create2)(
                            self.conn.ioctx,
                            image.as_ptr(),
                            size,
                            ffi::FEATURE_LAYERING,
                            &mut order,
                        )
                    },
                    || format!("{name}: cannot create the image"),
                )?;
                r = open(self);
            }
        }
        check(r, || {
            format!(
                "{name}: cannot open the image{}",
                if r == -libc::ENOENT && t.size.is_none() {
                    " (give size= to create it)"
                } else {
                    ""
                }
            )
        })?;
        Ok(())
    }

    /// The image's size, which must be the spec's `size=` if it gives one.
    fn checked_size(&self, name: &str, t: &RbdTarget) -> io::Result<u64> {
        let size = self.image_size().map_err(|e| io::Error::new(e.kind(), format!("{name}: {e}")))?;
        if let Some(want) = t.size {
            if want != size {
                return Err(io::Error::other(format!(
                    "{name}: the image exists with {} but the spec says size={}",
                    crate::format_size(size),
                    crate::format_size(want)
                )));
            }
        }
        Ok(size)
    }

    fn warn_exclusive_lock(&self, name: &str, spec: &BackendSpec, t: &RbdTarget) -> io::Result<()> {
        let lib = self.lib;
        let mut features = 0u64;
        // SAFETY: an open image and an out-pointer.
        check(
            unsafe { (lib.rbd_get_features)(self.image, &mut features) },
            || format!("{name}: rbd_get_features"),
        )?;
        if features & ffi::FEATURE_EXCLUSIVE_LOCK != 0 && !spec.readonly {
            // Works, but with several gateways librbd hands the lock from
            // one to the other on every write: slow, and each hand-over
            // stalls I/O.
            log::warn!(
                "{name}: the image has the exclusive-lock feature; if several gateways export it, disable it \
                 (rbd feature disable {}/{} object-map fast-diff exclusive-lock)",
                t.pool,
                t.image
            );
        }
        Ok(())
    }

    /// Hand one request to librbd: `finish` gets its return value (bytes
    /// read, or -errno) exactly once, on a librbd thread; or at once on
    /// this thread if librbd refuses the request.
    fn start(&self, finish: Finish, submit: impl FnOnce(Completion) -> c_int) {
        let lib = self.lib;
        let arg = Box::into_raw(Box::new(finish)) as *mut c_void;
        let mut c: Completion = std::ptr::null_mut();
        // SAFETY: `arg` is a boxed `Finish` that the callback takes back
        // exactly once.
        let r = unsafe { (lib.rbd_aio_create_completion)(arg, on_complete, &mut c) };
        if r < 0 {
            // SAFETY: the callback will never run: take the box back.
            let finish = unsafe { Box::from_raw(arg as *mut Finish) };
            return finish(r as isize);
        }
        let r = submit(c);
        if r < 0 {
            // SAFETY: a refused request never completes; release both.
            let finish = unsafe {
                (lib.rbd_aio_release)(c);
                Box::from_raw(arg as *mut Finish)
            };
            finish(r as isize);
        }
    }

    /// [`RbdDevice::start`] and sleep until the request ends; its result
    /// (bytes for reads), failures logged.
    fn run(&self, what: &'static str, offset: u64, submit: impl FnOnce(Completion) -> c_int) -> io::Result<isize> {
        let pending = Arc::new(Pending::default());
        let p = pending.clone();
        self.start(Box::new(move |r| p.set(r)), submit);
        let ret = pending.wait();
        self.failures.check(ret, what, offset)
    }
}

/// The most iovecs `rbd_aio_writev` accepts (IOV_MAX; librbd refuses more
/// with EINVAL).
const MAX_IOV: usize = 1024;

/// What a request does with librbd's return value, on librbd's thread.
type Finish = Box<dyn FnOnce(isize) + Send>;

/// librbd's completion callback, on one of its threads.
extern "C" fn on_complete(c: Completion, arg: *mut c_void) {
    // SAFETY: `arg` came from `Box::into_raw` in `start`, and librbd calls
    // back once per completion.
    let finish = unsafe { Box::from_raw(arg as *mut Finish) };
    let r = match ffi::lib() {
        // SAFETY: a live completion, inside its own callback; librbd holds
        // its own reference until the callback returns, so releasing ours
        // here is allowed (qemu's rbd driver does the same).
        Ok(lib) => unsafe {
            let r = (lib.rbd_aio_get_return_value)(c);
            (lib.rbd_aio_release)(c);
            r
        },
        Err(_) => -(libc::EIO as isize),
    };
    finish(r)
}

/// A synchronous caller's wait for its request.
#[derive(Default)]
struct Pending {
    result: Mutex<Option<isize>>,
    done: Condvar,
}

impl Pending {
    fn set(&self, r: isize) {
        *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        self.done.notify_one();
    }

    fn wait(&self) -> isize {
        let mut g = self.result.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = *g {
                return r;
            }
            g = self.done.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl crate::BlockDevice for RbdDevice {
    fn reservation_store(&self) -> io::Result<Option<Box<dyn bw_reservation::Store>>> {
        match &self.pool_image {
            Some((pool, image)) => Ok(Some(Box::new(pr_store::RadosStore::open(self.conn.clone(), pool, image)?))),
            None => Ok(None),
        }
    }

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let (img, len, p) = (self.image, buf.len(), buf.as_mut_ptr() as *mut c_char);
        // SAFETY: `buf` outlives the request: `run` returns only after the
        // completion has fired.
        let n = self.run("read", offset, |c| unsafe { (self.lib.rbd_aio_read)(img, offset, len, p, c) })?;
        zero_tail(buf, n);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let (img, len, p) = (self.image, buf.len(), buf.as_ptr() as *const c_char);
        // SAFETY: as in read_at.
        self.run("write", offset, |c| unsafe { (self.lib.rbd_aio_write)(img, offset, len, p, c) }).map(|_| ())
    }

    /// Straight to `rbd_aio_read`/`rbd_aio_write(v)`: the request's memory
    /// moves into the completion's closure, and librbd's callback hands it
    /// to `done`. Nothing here waits.
    fn submit(&self, mut req: Request, done: OnDone) {
        let (img, lib, offset) = (self.image, self.lib, req.offset());
        if req.is_empty() {
            return done(req, Ok(()));
        }
        let failures = self.failures.clone();
        match &mut req {
            Request::Read { len, buf, .. } => {
                let len = *len;
                buf.clear();
                buf.reserve(len);
                let p = buf.as_mut_ptr() as *mut c_char;
                let finish = move |r: isize| {
                    let r = failures.check(r, "read", offset).map(|n| {
                        if let Request::Read { buf, .. } = &mut req {
                            // SAFETY: librbd wrote the first `n` bytes (never
                            // more than asked for) of the reserved capacity.
                            unsafe { buf.set_len((n.max(0) as usize).min(len)) };
                            // Anything short (never expected inside the
                            // image) reads as zeroes.
                            buf.resize(len, 0);
                        }
                    });
                    done(req, r)
                };
                // SAFETY: `p` points to `len` bytes of capacity of the Vec
                // that `finish` owns; its heap buffer does not move and
                // lives until the callback.
                self.start(Box::new(finish), |c| unsafe { (lib.rbd_aio_read)(img, offset, len, p, c) });
            }
            Request::Write { data, .. } => {
                if data.len() > MAX_IOV {
                    // More pieces than librbd takes in one writev (an
                    // initiator that sends tiny Data-Out PDUs): one copy.
                    let mut joined = Vec::with_capacity(data.iter().map(|b| b.len()).sum());
                    data.iter().for_each(|b| joined.extend_from_slice(b));
                    *data = vec![joined.into()];
                }
                let iov: Vec<libc::iovec> = data
                    .iter()
                    .filter(|b| !b.is_empty())
                    .map(|b| libc::iovec { iov_base: b.as_ptr() as *mut c_void, iov_len: b.len() })
                    .collect();
                let (p, n) = (iov.as_ptr(), iov.len() as c_int);
                let finish = move |r: isize| {
                    let r = failures.check(r, "write", offset).map(|_| ());
                    done(req, r)
                };
                // SAFETY: the pieces `iov` points into belong to `finish`
                // (heap memory that does not move) and live until the
                // callback; librbd reads the iovec array itself only during
                // the call, while `iov` is alive.
                self.start(Box::new(finish), |c| unsafe {
                    if n == 1 {
                        (lib.rbd_aio_write)(img, offset, (*p).iov_len, (*p).iov_base as *const c_char, c)
                    } else {
                        (lib.rbd_aio_writev)(img, p, n, offset, c)
                    }
                });
            }
        }
    }

    fn flush(&self) -> io::Result<()> {
        let img = self.image;
        // SAFETY: an open image.
        self.run("flush", 0, |c| unsafe { (self.lib.rbd_aio_flush)(img, c) })
            .map(|_| ())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let img = self.image;
        // SAFETY: an open image.
        self.run("discard", offset, |c| unsafe {
            (self.lib.rbd_aio_discard)(img, offset, len, c)
        })
        .map(|_| ())
    }

    /// Grow the image (`rbd_resize2`). The image's header tells every
    /// other client that has it open (librbd watches it and refreshes), so
    /// another gateway's `rbd_get_size` says the new size at once, and its
    /// update watch ([`RbdDevice::watch_size`]) has it resize its volume
    /// to the size the image already has: a no-op here. Shrinking is
    /// refused: other gateways' hosts may be using the end of the image,
    /// and `rbd resize` too wants `--allow-shrink` for it.
    fn resize(&self, new_size: u64) -> io::Result<()> {
        let now = self.image_size()?;
        if new_size < now {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: the image has {} and RBD images are not shrunk ({} asked)", self.info.description, crate::format_size(now), crate::format_size(new_size)),
            ));
        }
        if new_size > now {
            // SAFETY: an open image; the progress callback ignores its
            // (null) argument.
            check(unsafe { (self.lib.rbd_resize2)(self.image, new_size, false, no_progress, std::ptr::null_mut()) }, || {
                format!("{}: resize to {}", self.info.description, crate::format_size(new_size))
            })?;
        }
        Ok(())
    }

    fn size_now(&self) -> io::Result<u64> {
        self.image_size()
    }

    /// `rbd_update_watch`: librbd calls back on its own thread after any
    /// client updated the image's header (a resize among other things);
    /// `changed` only passes the news on.
    fn watch_size(&self, changed: crate::SizeChanged) -> io::Result<Option<u64>> {
        let arg = Box::into_raw(Box::new(changed));
        let mut handle = 0u64;
        // SAFETY: an open image, an out-pointer, and an argument that
        // lives until `unwatch` has unregistered it.
        let r = unsafe { (self.lib.rbd_update_watch)(self.image, &mut handle, on_update, arg as *mut c_void) };
        if let Err(e) = check(r, || format!("{}: rbd_update_watch", self.info.description)) {
            // SAFETY: librbd refused it and never calls back with it.
            drop(unsafe { Box::from_raw(arg) });
            return Err(e);
        }
        UPDATE_WATCHES.fetch_add(1, Relaxed);
        self.watches.lock().unwrap_or_else(|p| p.into_inner()).insert(handle, UpdateArg(arg));
        Ok(Some(handle))
    }

    fn unwatch_size(&self, id: u64) {
        let arg = self.watches.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        if let Some(arg) = arg {
            self.unwatch(id, arg);
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let img = self.image;
        // Split so each call's length fits size_t on any target.
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(1 << 30);
            let off = offset + done;
            // SAFETY: an open image; no flags (zeroing may deallocate).
            self.run("write zeroes", off, |c| unsafe {
                (self.lib.rbd_aio_write_zeroes)(img, off, n as usize, c, 0, 0)
            })?;
            done += n;
        }
        Ok(())
    }
}

/// librbd's update callback, on its update-watchers thread (which waits
/// for it: `changed` only hands the news on).
extern "C" fn on_update(arg: *mut c_void) {
    // SAFETY: `arg` is the `SizeChanged` boxed in `watch_size`, freed only
    // after `rbd_update_unwatch` returned, which waits for this call.
    let changed = unsafe { &*(arg as *const crate::SizeChanged) };
    // A panic must not unwind into librbd's thread.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(changed)).is_err() {
        log::error!("rbd: an update watch's callback panicked");
    }
}

/// `rbd_resize2` reports its progress here; nothing is done with it.
extern "C" fn no_progress(_offset: u64, _total: u64, _arg: *mut c_void) -> c_int {
    0
}

/// librbd returns the bytes read; anything short (never expected inside
/// the image) reads as zeroes.
fn zero_tail(buf: &mut [u8], n: isize) {
    if let Some(rest) = buf.get_mut(n.max(0) as usize..) {
        rest.fill(0);
    }
}

impl Drop for RbdDevice {
    fn drop(&mut self) {
        // Update watches left (none while a `SizeWatch` holds the volume
        // open) end first, so their callbacks are freed.
        let watches = std::mem::take(self.watches.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (handle, arg) in watches {
            self.unwatch(handle, arg);
        }
        // SAFETY: each handle was created by us and is released once, image
        // before ioctx before cluster. `rbd_close` waits for the requests
        // still in flight (submitted ones may be) until their callbacks have
        // returned; those touch only what they own (their request, `done`,
        // the shared failure log), never this device. Every `run` waited
        // for its completion, and `&mut self` excludes new requests.
        unsafe {
            if !self.image.is_null() {
                (self.lib.rbd_close)(self.image);
            }
        }
        // `conn` drops next: the pool's I/O context, then the cluster.
    }
}
