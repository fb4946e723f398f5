//! The few librados/librbd calls the rbd backend uses, loaded at run time
//! with `libloading` so that `blockwire` starts (and serves every other
//! backend) on machines without the Ceph client libraries. Signatures follow
//! `rados/librados.h` and `rbd/librbd.h` (Ceph 16); only what [`super`]
//! needs is here.

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

pub type Rados = *mut c_void;
pub type IoCtx = *mut c_void;
pub type Image = *mut c_void;
pub type Completion = *mut c_void;
pub type WriteOp = *mut c_void;
/// `rados_watchcb2_t`: argument, notify id, watch handle, notifier id, payload, its length.
pub type WatchCallback = extern "C" fn(*mut c_void, u64, u64, u64, *mut c_void, usize);
/// `rados_watcherrcb_t`: argument, watch handle, error.
pub type WatchErrorCallback = extern "C" fn(*mut c_void, u64, c_int);
/// `LIBRADOS_CMPXATTR_OP_EQ`.
pub const CMPXATTR_OP_EQ: u8 = 1;
/// `LIBRADOS_CREATE_EXCLUSIVE`.
pub const CREATE_EXCLUSIVE: c_int = 1;
pub type Callback = extern "C" fn(Completion, *mut c_void);
/// `rbd_diff_iterate2`'s callback: offset, length, whether the extent
/// holds data, the caller's argument; non-zero stops the walk.
pub type DiffCallback = extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int;
/// `librbd_progress_fn_t`: offset, total, the caller's argument; non-zero
/// cancels.
pub type ProgressCallback = extern "C" fn(u64, u64, *mut c_void) -> c_int;
/// `rbd_update_callback_t`: the caller's argument.
pub type UpdateCallback = extern "C" fn(*mut c_void);

/// RBD_FEATURE_LAYERING: the only feature of images we create. Without
/// exclusive-lock, several gateways can write one image without passing a
/// lock back and forth (see docs/ceph.md).
pub const FEATURE_LAYERING: u64 = 1;
/// RBD_FEATURE_EXCLUSIVE_LOCK: one client writes at a time; others must
/// ask for the lock first.
pub const FEATURE_EXCLUSIVE_LOCK: u64 = 1 << 2;

pub struct Lib {
    pub rados_create2: unsafe extern "C" fn(*mut Rados, *const c_char, *const c_char, u64) -> c_int,
    pub rados_conf_read_file: unsafe extern "C" fn(Rados, *const c_char) -> c_int,
    pub rados_conf_set: unsafe extern "C" fn(Rados, *const c_char, *const c_char) -> c_int,
    pub rados_connect: unsafe extern "C" fn(Rados) -> c_int,
    pub rados_shutdown: unsafe extern "C" fn(Rados),
    pub rados_ioctx_create: unsafe extern "C" fn(Rados, *const c_char, *mut IoCtx) -> c_int,
    pub rados_ioctx_destroy: unsafe extern "C" fn(IoCtx),
    pub rados_read: unsafe extern "C" fn(IoCtx, *const c_char, *mut c_char, usize, u64) -> c_int,
    pub rados_remove: unsafe extern "C" fn(IoCtx, *const c_char) -> c_int,
    pub rados_create_write_op: unsafe extern "C" fn() -> WriteOp,
    pub rados_release_write_op: unsafe extern "C" fn(WriteOp),
    pub rados_write_op_create: unsafe extern "C" fn(WriteOp, c_int, *const c_char),
    pub rados_write_op_cmpxattr: unsafe extern "C" fn(WriteOp, *const c_char, u8, *const c_char, usize),
    pub rados_write_op_setxattr: unsafe extern "C" fn(WriteOp, *const c_char, *const c_char, usize),
    pub rados_write_op_write_full: unsafe extern "C" fn(WriteOp, *const c_char, usize),
    pub rados_write_op_operate: unsafe extern "C" fn(WriteOp, IoCtx, *const c_char, *mut libc::time_t, c_int) -> c_int,
    /// ioctx, object, out cookie, notify callback, error callback, watch timeout (s), argument.
    pub rados_watch3: unsafe extern "C" fn(IoCtx, *const c_char, *mut u64, WatchCallback, WatchErrorCallback, u32, *mut c_void) -> c_int,
    pub rados_unwatch2: unsafe extern "C" fn(IoCtx, u64) -> c_int,
    pub rados_watch_flush: unsafe extern "C" fn(Rados) -> c_int,
    pub rados_notify_ack: unsafe extern "C" fn(IoCtx, *const c_char, u64, u64, *const c_char, c_int) -> c_int,
    /// ioctx, object, payload, its length, timeout (ms), out reply buffer, out reply length.
    pub rados_notify2: unsafe extern "C" fn(IoCtx, *const c_char, *const c_char, c_int, u64, *mut *mut c_char, *mut usize) -> c_int,
    pub rados_buffer_free: unsafe extern "C" fn(*mut c_char),
    pub rbd_create2: unsafe extern "C" fn(IoCtx, *const c_char, u64, u64, *mut c_int) -> c_int,
    pub rbd_remove: unsafe extern "C" fn(IoCtx, *const c_char) -> c_int,
    /// parent ioctx, parent image, parent snapshot, child ioctx, child
    /// image, features, in/out object order.
    pub rbd_clone: unsafe extern "C" fn(
        IoCtx,
        *const c_char,
        *const c_char,
        IoCtx,
        *const c_char,
        u64,
        *mut c_int,
    ) -> c_int,
    pub rbd_open: unsafe extern "C" fn(IoCtx, *const c_char, *mut Image, *const c_char) -> c_int,
    pub rbd_open_read_only:
        unsafe extern "C" fn(IoCtx, *const c_char, *mut Image, *const c_char) -> c_int,
    pub rbd_close: unsafe extern "C" fn(Image) -> c_int,
    pub rbd_get_size: unsafe extern "C" fn(Image, *mut u64) -> c_int,
    pub rbd_resize2: unsafe extern "C" fn(Image, u64, bool, ProgressCallback, *mut c_void) -> c_int,
    pub rbd_get_features: unsafe extern "C" fn(Image, *mut u64) -> c_int,
    /// image, out handle, callback, argument: the callback runs (on a
    /// librbd thread) whenever the image's header changed, by any client.
    pub rbd_update_watch: unsafe extern "C" fn(Image, *mut u64, UpdateCallback, *mut c_void) -> c_int,
    /// Returns once a callback in flight for this handle has returned.
    pub rbd_update_unwatch: unsafe extern "C" fn(Image, u64) -> c_int,
    pub rbd_snap_create: unsafe extern "C" fn(Image, *const c_char) -> c_int,
    pub rbd_snap_remove: unsafe extern "C" fn(Image, *const c_char) -> c_int,
    pub rbd_snap_protect: unsafe extern "C" fn(Image, *const c_char) -> c_int,
    pub rbd_snap_unprotect: unsafe extern "C" fn(Image, *const c_char) -> c_int,
    /// image, from snapshot (NULL: since creation), offset, length,
    /// include_parent, whole_object, callback, argument.
    pub rbd_diff_iterate2:
        unsafe extern "C" fn(Image, *const c_char, u64, u64, u8, u8, DiffCallback, *mut c_void) -> c_int,
    pub rbd_aio_create_completion:
        unsafe extern "C" fn(*mut c_void, Callback, *mut Completion) -> c_int,
    pub rbd_aio_get_return_value: unsafe extern "C" fn(Completion) -> isize,
    pub rbd_aio_release: unsafe extern "C" fn(Completion),
    pub rbd_aio_read: unsafe extern "C" fn(Image, u64, usize, *mut c_char, Completion) -> c_int,
    pub rbd_aio_write: unsafe extern "C" fn(Image, u64, usize, *const c_char, Completion) -> c_int,
    pub rbd_aio_writev: unsafe extern "C" fn(Image, *const libc::iovec, c_int, u64, Completion) -> c_int,
    pub rbd_aio_flush: unsafe extern "C" fn(Image, Completion) -> c_int,
    pub rbd_aio_discard: unsafe extern "C" fn(Image, u64, u64, Completion) -> c_int,
    pub rbd_aio_write_zeroes:
        unsafe extern "C" fn(Image, u64, usize, Completion, c_int, c_int) -> c_int,
    // The libraries stay loaded for the life of the process: completions
    // may call back into us from librados threads at any time.
    _rados: libloading::Library,
    _rbd: libloading::Library,
}

const RADOS_SONAME: &str = "librados.so.2";
const RBD_SONAME: &str = "librbd.so.1";

/// The loaded libraries, or why they could not be loaded (said once per
/// process, the same way to every caller).
pub fn lib() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Lib, String> {
    let open = |name: &str| {
        // SAFETY: loading the system's Ceph client library runs its
        // initialisers, which is what linking against it would do too.
        unsafe { libloading::Library::new(name) }.map_err(|e| {
            format!("rbd: volumes need the Ceph client libraries (Debian: librbd1 librados2), and {name} could not be loaded: {e}")
        })
    };
    let rados = open(RADOS_SONAME)?;
    let rbd = open(RBD_SONAME)?;
    macro_rules! sym {
        ($lib:expr, $name:ident) => {{
            // SAFETY: the field's type is the C prototype from the Ceph
            // headers; the library outlives the pointer (kept in `Lib`).
            let s: libloading::Symbol<_> =
                unsafe { $lib.get(concat!(stringify!($name), "\0").as_bytes()) }.map_err(|e| {
                    format!(
                        "rbd: {} lacks {}: {e} (Ceph 15 or newer is needed)",
                        stringify!($lib),
                        stringify!($name)
                    )
                })?;
            *s
        }};
    }
    Ok(Lib {
        rados_create2: sym!(rados, rados_create2),
        rados_conf_read_file: sym!(rados, rados_conf_read_file),
        rados_conf_set: sym!(rados, rados_conf_set),
        rados_connect: sym!(rados, rados_connect),
        rados_shutdown: sym!(rados, rados_shutdown),
        rados_ioctx_create: sym!(rados, rados_ioctx_create),
        rados_ioctx_destroy: sym!(rados, rados_ioctx_destroy),
        rados_read: sym!(rados, rados_read),
        rados_remove: sym!(rados, rados_remove),
        rados_create_write_op: sym!(rados, rados_create_write_op),
        rados_release_write_op: sym!(rados, rados_release_write_op),
        rados_write_op_create: sym!(rados, rados_write_op_create),
        rados_write_op_cmpxattr: sym!(rados, rados_write_op_cmpxattr),
        rados_write_op_setxattr: sym!(rados, rados_write_op_setxattr),
        rados_write_op_write_full: sym!(rados, rados_write_op_write_full),
        rados_write_op_operate: sym!(rados, rados_write_op_operate),
        rados_watch3: sym!(rados, rados_watch3),
        rados_unwatch2: sym!(rados, rados_unwatch2),
        rados_watch_flush: sym!(rados, rados_watch_flush),
        rados_notify_ack: sym!(rados, rados_notify_ack),
        rados_notify2: sym!(rados, rados_notify2),
        rados_buffer_free: sym!(rados, rados_buffer_free),
        rbd_create2: sym!(rbd, rbd_create2),
        rbd_remove: sym!(rbd, rbd_remove),
        rbd_clone: sym!(rbd, rbd_clone),
        rbd_open: sym!(rbd, rbd_open),
        rbd_open_read_only: sym!(rbd, rbd_open_read_only),
        rbd_close: sym!(rbd, rbd_close),
        rbd_get_size: sym!(rbd, rbd_get_size),
        rbd_resize2: sym!(rbd, rbd_resize2),
        rbd_get_features: sym!(rbd, rbd_get_features),
        rbd_update_watch: sym!(rbd, rbd_update_watch),
        rbd_update_unwatch: sym!(rbd, rbd_update_unwatch),
        rbd_snap_create: sym!(rbd, rbd_snap_create),
        rbd_snap_remove: sym!(rbd, rbd_snap_remove),
        rbd_snap_protect: sym!(rbd, rbd_snap_protect),
        rbd_snap_unprotect: sym!(rbd, rbd_snap_unprotect),
        rbd_diff_iterate2: sym!(rbd, rbd_diff_iterate2),
        rbd_aio_create_completion: sym!(rbd, rbd_aio_create_completion),
        rbd_aio_get_return_value: sym!(rbd, rbd_aio_get_return_value),
        rbd_aio_release: sym!(rbd, rbd_aio_release),
        rbd_aio_read: sym!(rbd, rbd_aio_read),
        rbd_aio_write: sym!(rbd, rbd_aio_write),
        rbd_aio_writev: sym!(rbd, rbd_aio_writev),
        rbd_aio_flush: sym!(rbd, rbd_aio_flush),
        rbd_aio_discard: sym!(rbd, rbd_aio_discard),
        rbd_aio_write_zeroes: sym!(rbd, rbd_aio_write_zeroes),
        _rados: rados,
        _rbd: rbd,
    })
}
