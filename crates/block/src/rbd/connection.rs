//! A connection to a Ceph cluster and one pool (what the image, the
//! pool administration and the reservation store each open), and the
//! helpers every librados/librbd call uses.

use super::ffi::{self, Lib};
use crate::RbdTarget;
use std::ffi::{c_int, CString};
use std::io;

pub(super) fn cstr(what: &str, s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} {s:?} contains a NUL byte"),
        )
    })
}

/// A librados/librbd failure (`-errno`) as an error saying what failed; the
/// kind stays that of the errno (ETIMEDOUT: `TimedOut`, which front-ends
/// report as retryable).
pub(super) fn rbd_error(r: c_int, what: impl FnOnce() -> String) -> io::Error {
    let e = io::Error::from_raw_os_error(-r);
    io::Error::new(e.kind(), format!("{}: {e}", what()))
}

/// A librados/librbd return code: negative values are errors.
pub(super) fn check(r: c_int, what: impl FnOnce() -> String) -> io::Result<c_int> {
    if r < 0 {
        return Err(rbd_error(r, what));
    }
    Ok(r)
}

/// A connection to the cluster (the Ceph configuration read, the settings
/// `rbd/mod.rs`'s module comment lists forced) and one pool's I/O context; released
/// on drop, ioctx before cluster.
pub(super) struct Connection {
    pub(super) lib: &'static Lib,
    pub(super) cluster: ffi::Rados,
    pub(super) ioctx: ffi::IoCtx,
}

// SAFETY: librados handles are thread-safe; released only in drop.
unsafe impl Send for Connection {}
unsafe impl Sync for Connection {}

impl Connection {
    /// `name` says what for, in errors.
    pub(super) fn open(name: &str, t: &RbdTarget) -> io::Result<Connection> {
        let lib = ffi::lib().map_err(io::Error::other)?;
        let id = cstr("client id", t.id.as_deref().unwrap_or("admin"))?;
        let mut cluster: ffi::Rados = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; cluster and user names are C strings.
        check(
            unsafe {
                (lib.rados_create2)(
                    &mut cluster,
                    c"ceph".as_ptr(),
                    cstr("", &format!("client.{}", id.to_string_lossy()))?.as_ptr(),
                    0,
                )
            },
            || format!("{name}: rados_create2"),
        )?;
        // From here on Drop releases whatever has been set up.
        let mut conn = Connection { lib, cluster, ioctx: std::ptr::null_mut() };
        let timeout = t.timeout_secs.unwrap_or(RbdTarget::DEFAULT_TIMEOUT_SECS).to_string();
        conn.connect(name, t, &timeout)?;
        Ok(conn)
    }

    /// Read the Ceph configuration, force the settings `rbd/mod.rs`'s
    /// module comment lists, connect to the cluster and open the pool's I/O context.
    fn connect(&mut self, name: &str, t: &RbdTarget, timeout: &str) -> io::Result<()> {
        let (lib, cluster) = (self.lib, self.cluster);
        let conf = match &t.conf {
            Some(p) => Some(cstr(
                "conf path",
                p.to_str()
                    .ok_or_else(|| io::Error::other(format!("{name}: conf path is not UTF-8")))?,
            )?),
            None => None,
        };
        // SAFETY: a valid cluster handle; NULL asks for the default search path.
        check(
            unsafe {
                (lib.rados_conf_read_file)(
                    cluster,
                    conf.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                )
            },
            || {
                format!(
                    "{name}: cannot read ceph config {}",
                    t.conf
                        .as_ref()
                        .map_or("(default search path)".into(), |p| p.display().to_string())
                )
            },
        )?;
        for (k, v) in [
            ("rbd_cache", "false"),
            ("rbd_skip_partial_discard", "false"),
            ("rados_osd_op_timeout", timeout),
            ("rados_mon_op_timeout", timeout),
            ("client_mount_timeout", timeout),
        ] {
            let (ck, cv) = (cstr("option", k)?, cstr("value", v)?);
            // SAFETY: valid handle, NUL-terminated strings.
            check(
                unsafe { (lib.rados_conf_set)(cluster, ck.as_ptr(), cv.as_ptr()) },
                || format!("{name}: setting {k}={v}"),
            )?;
        }
        // SAFETY: a configured cluster handle.
        check(unsafe { (lib.rados_connect)(cluster) }, || {
            format!("{name}: cannot connect to the Ceph cluster")
        })?;
        let pool = cstr("pool", &t.pool)?;
        // SAFETY: connected handle, out-pointer into `self`.
        check(
            unsafe { (lib.rados_ioctx_create)(cluster, pool.as_ptr(), &mut self.ioctx) },
            || format!("{name}: pool {:?}", t.pool),
        )?;
        Ok(())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // SAFETY: created by us, released once, ioctx before cluster; the
        // images opened through them are closed before (RbdDevice's drop,
        // RbdPool's calls).
        unsafe {
            if !self.ioctx.is_null() {
                (self.lib.rados_ioctx_destroy)(self.ioctx);
            }
            (self.lib.rados_shutdown)(self.cluster);
        }
    }
}
