//! Reservations of an RBD image, kept where every gateway serving the image
//! sees them: the RADOS object `blockwire.pr.IMAGE` in the image's pool.
//!
//! - The object's data is the state (`bw_reservation::State`, JSON); its
//!   xattr `bw.seq` is the state's seq. A change is one RADOS write
//!   operation: compare `bw.seq` with the seq the gateway read, write the
//!   new state and the new seq; the OSD applies all or nothing, and a
//!   gateway that lost the race reads again (compare-and-swap).
//! - Every gateway watches the object (`rados_watch3`). After a change the
//!   gateway that made it notifies the watchers with the new state as
//!   payload (`rados_notify2`) and waits for their acknowledgements; each
//!   takes the state into its cache before acknowledging. So when the
//!   command that made the change completes, every live gateway already
//!   checks the next command against the new state.
//! - A watch that breaks (the gateway lost its OSD session) makes that
//!   gateway read the object before every check until it has watched
//!   again. A gateway that died stops answering; its watch expires after
//!   [`WATCH_TIMEOUT_S`], and until then notifies wait [`NOTIFY_TIMEOUT_MS`]
//!   for it.

use super::ffi::{self, Lib};
use super::connection::{check, cstr, Connection};
use bw_reservation::{State, Store};
use std::ffi::{c_char, c_int, c_void, CString};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Seconds the OSD keeps a watch of a gateway it no longer hears from.
pub const WATCH_TIMEOUT_S: u32 = 10;
/// How long a change waits for the other gateways to acknowledge it.
pub const NOTIFY_TIMEOUT_MS: u64 = 5000;
const SEQ_XATTR: &std::ffi::CStr = c"bw.seq";

type OnChange = Arc<dyn Fn(Option<State>) + Send + Sync>;

/// What the watch callbacks reach through their argument pointer; lives
/// until the watch is gone and flushed (the store's drop).
struct Watch {
    lib: &'static Lib,
    conn: Arc<Connection>,
    oid: CString,
    cookie: AtomicU64,
    on: Mutex<Option<OnChange>>,
}

pub struct RadosStore {
    watch: Arc<Watch>,
    name: String,
}

// SAFETY: librados handles are thread-safe; see Connection.
unsafe impl Send for Watch {}
unsafe impl Sync for Watch {}

/// The RADOS object that holds `image`'s reservations.
fn object_id(image: &str) -> io::Result<CString> {
    cstr("object", &format!("blockwire.pr.{image}"))
}

/// Remove `image`'s reservation object (with the image: a new image of
/// the same name must not inherit the old one's registrations and
/// holder). Missing is fine.
pub(super) fn remove(conn: &Connection, image: &str) -> io::Result<()> {
    let oid = object_id(image)?;
    // SAFETY: a live ioctx and a C string.
    let r = unsafe { (conn.lib.rados_remove)(conn.ioctx, oid.as_ptr()) };
    if r == -libc::ENOENT {
        return Ok(());
    }
    check(r, || format!("rados object blockwire.pr.{image}: remove")).map(|_| ())
}

impl RadosStore {
    /// The store of `image` (in the connection's pool); creates the object
    /// (empty state) if it is missing.
    pub(super) fn open(conn: Arc<Connection>, pool: &str, image: &str) -> io::Result<RadosStore> {
        let lib = conn.lib;
        let oid = object_id(image)?;
        let name = format!("rados object {pool}/blockwire.pr.{image}");
        let store = RadosStore { watch: Arc::new(Watch { lib, conn, oid, cookie: AtomicU64::new(0), on: Mutex::new(None) }), name };
        // Create it exclusively with the empty state; if it exists, keep it.
        let empty = State::default();
        let r = store.write(|op| {
            // SAFETY: a fresh write op.
            unsafe { (lib.rados_write_op_create)(op, ffi::CREATE_EXCLUSIVE, std::ptr::null()) };
        }, &empty)?;
        // EEXIST: it is there already; keep it.
        if r != -libc::EEXIST {
            check(r, || format!("{}: create", store.name))?;
        }
        Ok(store)
    }

    /// One write operation: `guard` adds its condition, then the state and
    /// its seq are written. The librados return code (negative: an errno).
    fn write(&self, guard: impl FnOnce(ffi::WriteOp), s: &State) -> io::Result<c_int> {
        let w = &self.watch;
        let lib = w.lib;
        let body = s.encode();
        let seq = s.seq.to_string();
        // SAFETY: the op is created, filled with pointers that outlive
        // `operate` (which copies them), run synchronously and released.
        let r = unsafe {
            let op = (lib.rados_create_write_op)();
            if op.is_null() {
                return Err(io::Error::other(format!("{}: rados_create_write_op failed", self.name)));
            }
            guard(op);
            (lib.rados_write_op_write_full)(op, body.as_ptr().cast(), body.len());
            (lib.rados_write_op_setxattr)(op, SEQ_XATTR.as_ptr(), seq.as_ptr().cast(), seq.len());
            let r = (lib.rados_write_op_operate)(op, w.conn.ioctx, w.oid.as_ptr(), std::ptr::null_mut(), 0);
            (lib.rados_release_write_op)(op);
            r
        };
        Ok(r)
    }

    fn read(w: &Watch, name: &str) -> io::Result<Option<State>> {
        let mut len = 64 * 1024;
        loop {
            let mut buf = vec![0u8; len];
            // SAFETY: reading into our buffer of `len` bytes.
            let r = unsafe { (w.lib.rados_read)(w.conn.ioctx, w.oid.as_ptr(), buf.as_mut_ptr().cast(), len, 0) };
            if r == -libc::ENOENT {
                return Ok(None);
            }
            let n = check(r, || format!("{name}: read"))? as usize;
            if n == len {
                len *= 4; // bigger than we asked for: again, whole
                continue;
            }
            buf.truncate(n);
            return State::decode(&buf).map(Some);
        }
    }

    fn start_watch(w: &Arc<Watch>) -> io::Result<()> {
        let mut cookie = 0u64;
        // SAFETY: `w` outlives the watch: the store unwatches and flushes
        // before it lets go of its Arc.
        let r = unsafe {
            (w.lib.rados_watch3)(w.conn.ioctx, w.oid.as_ptr(), &mut cookie, on_notify, on_watch_error, WATCH_TIMEOUT_S, Arc::as_ptr(w) as *mut c_void)
        };
        check(r, || "rados_watch3".to_string())?;
        w.cookie.store(cookie, Ordering::Release);
        Ok(())
    }
}

extern "C" fn on_notify(arg: *mut c_void, notify_id: u64, handle: u64, _notifier: u64, data: *mut c_void, len: usize) {
    // SAFETY: `arg` is the Watch given to rados_watch3, alive while watched.
    let w = unsafe { &*(arg as *const Watch) };
    if !data.is_null() && len > 0 {
        // SAFETY: librados hands us `len` bytes at `data` for this call.
        let payload = unsafe { std::slice::from_raw_parts(data as *const u8, len) };
        let on = w.on.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match (State::decode(payload), on) {
            (Ok(s), Some(on)) => on(Some(s)),
            (Err(e), Some(on)) => {
                log::warn!("reservations: a notify carried no state ({e}); reading the object");
                on(None);
            }
            _ => {}
        }
    }
    // Acknowledge only now: the notifier waits for this, so the change is
    // in our cache before the command that made it completes.
    // SAFETY: valid ioctx and object name; an empty reply.
    unsafe { (w.lib.rados_notify_ack)(w.conn.ioctx, w.oid.as_ptr(), notify_id, handle, std::ptr::null(), 0) };
}

extern "C" fn on_watch_error(arg: *mut c_void, cookie: u64, err: c_int) {
    // SAFETY: as in on_notify.
    let w = unsafe { &*(arg as *const Watch) };
    log::warn!("reservations: the watch on {} broke ({}); reading the object before each check until it is back", w.oid.to_string_lossy(), io::Error::from_raw_os_error(-err));
    let on = w.on.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if let Some(on) = &on {
        on(None);
    }
    // Watch again, off librados' callback thread, holding the Watch: the
    // store's drop sets `cookie` to u64::MAX so this gives up.
    // SAFETY: `arg` came from Arc::as_ptr of a Watch the store still holds
    // (its drop flushes callbacks before letting go): one more reference.
    let w: Arc<Watch> = unsafe {
        Arc::increment_strong_count(arg as *const Watch);
        Arc::from_raw(arg as *const Watch)
    };
    std::thread::spawn(move || {
        let ptr = Arc::as_ptr(&w) as usize;
        // SAFETY: unwatching the broken handle.
        unsafe { (w.lib.rados_unwatch2)(w.conn.ioctx, cookie) };
        let mut delay = std::time::Duration::from_millis(200);
        while w.cookie.load(Ordering::Acquire) != u64::MAX {
            let mut fresh = 0u64;
            // SAFETY: as in start_watch.
            let r = unsafe { (w.lib.rados_watch3)(w.conn.ioctx, w.oid.as_ptr(), &mut fresh, on_notify, on_watch_error, WATCH_TIMEOUT_S, ptr as *mut c_void) };
            if r == 0 {
                w.cookie.store(fresh, Ordering::Release);
                match (RadosStore::read(&w, "reservations"), &on) {
                    (Ok(Some(s)), Some(on)) => on(Some(s)),
                    (Ok(None), Some(on)) => on(Some(State::default())),
                    _ => {}
                }
                return;
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(std::time::Duration::from_secs(5));
        }
    });
}

impl Drop for RadosStore {
    fn drop(&mut self) {
        let w = &self.watch;
        let cookie = w.cookie.swap(u64::MAX, Ordering::AcqRel);
        // SAFETY: our watch handle; flushing waits for callbacks in flight.
        unsafe {
            if cookie != 0 && cookie != u64::MAX {
                (w.lib.rados_unwatch2)(w.conn.ioctx, cookie);
            }
            (w.lib.rados_watch_flush)(w.conn.cluster);
        }
    }
}

impl Store for RadosStore {
    fn load(&self) -> io::Result<Option<State>> {
        RadosStore::read(&self.watch, &self.name)
    }

    fn replace(&self, expected: u64, new: &State) -> io::Result<bool> {
        let lib = self.watch.lib;
        let want = expected.to_string();
        let r = self.write(
            |op| {
                // SAFETY: `want` outlives the op's operate call.
                unsafe { (lib.rados_write_op_cmpxattr)(op, SEQ_XATTR.as_ptr(), ffi::CMPXATTR_OP_EQ, want.as_ptr().cast(), want.len()) };
            },
            new,
        )?;
        match r {
            // The comparison failed: someone else changed it.
            r if r == -libc::ECANCELED => Ok(false),
            r => check(r, || format!("{}: write", self.name)).map(|_| true),
        }
    }

    fn publish(&self, new: &State) -> io::Result<()> {
        let w = &self.watch;
        let body = new.encode();
        let mut reply: *mut c_char = std::ptr::null_mut();
        let mut reply_len = 0usize;
        // SAFETY: payload and out-pointers are ours; the reply buffer is freed below.
        let r = unsafe {
            (w.lib.rados_notify2)(w.conn.ioctx, w.oid.as_ptr(), body.as_ptr().cast(), body.len() as c_int, NOTIFY_TIMEOUT_MS, &mut reply, &mut reply_len)
        };
        if !reply.is_null() {
            // SAFETY: librados allocated it for us.
            unsafe { (w.lib.rados_buffer_free)(reply) };
        }
        check(r, || format!("{}: notify (some gateway did not acknowledge within {NOTIFY_TIMEOUT_MS} ms)", self.name)).map(|_| ())
    }

    fn watch(&self, on: OnChange) -> io::Result<()> {
        *self.watch.on.lock().unwrap_or_else(|p| p.into_inner()) = Some(on);
        RadosStore::start_watch(&self.watch).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.name)))
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}
