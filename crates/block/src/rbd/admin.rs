//! Managing images in one RBD pool (what a blockwire volume pool on RBD
//! does): create, snapshot (protected, so that it can be cloned), clone a
//! snapshot, remove, and how much of an image holds data. Each call is
//! one librbd operation; librbd itself refuses what would lose data
//! (removing an image with snapshots, unprotecting a snapshot with
//! clones), and its errors come back naming the image.

use super::connection::{check, cstr, Connection};
use super::ffi;
use crate::RbdTarget;
use std::ffi::{c_int, c_void};
use std::io;

/// One pool of a cluster, reached as [`RbdTarget`] says (its `image`,
/// `snap` and `size` are not used).
pub struct RbdPool {
    conn: Connection,
    pool: String,
}

/// An open image, closed on drop.
struct Image<'a> {
    lib: &'static ffi::Lib,
    image: ffi::Image,
    _pool: &'a RbdPool,
}

impl Drop for Image<'_> {
    fn drop(&mut self) {
        // SAFETY: opened by `RbdPool::open`, closed once, before the
        // connection it came through (borrowed for `'a`).
        unsafe { (self.lib.rbd_close)(self.image) };
    }
}

impl RbdPool {
    pub fn connect(t: &RbdTarget) -> io::Result<RbdPool> {
        let conn = Connection::open(&format!("rbd pool {}", t.pool), t)?;
        Ok(RbdPool { conn, pool: t.pool.clone() })
    }

    fn what(&self, image: &str, snap: Option<&str>) -> String {
        match snap {
            Some(s) => format!("rbd:{}/{image}@{s}", self.pool),
            None => format!("rbd:{}/{image}", self.pool),
        }
    }

    /// The image's head (writable) or one of its snapshots (read-only).
    fn open(&self, image: &str, snap: Option<&str>) -> io::Result<Image<'_>> {
        let lib = self.conn.lib;
        let name = cstr("image", image)?;
        let snap_c = snap.map(|s| cstr("snapshot", s)).transpose()?;
        let mut h: ffi::Image = std::ptr::null_mut();
        let f = if snap.is_some() { lib.rbd_open_read_only } else { lib.rbd_open };
        // SAFETY: a live ioctx, C strings, an out-pointer.
        check(
            unsafe { f(self.conn.ioctx, name.as_ptr(), &mut h, snap_c.as_ref().map_or(std::ptr::null(), |s| s.as_ptr())) },
            || format!("{}: open", self.what(image, snap)),
        )?;
        Ok(Image { lib, image: h, _pool: self })
    }

    /// A new image of `size` bytes, thin (RADOS objects are made as they
    /// are written), with layering only (cloneable; see ffi).
    pub fn create(&self, image: &str, size: u64) -> io::Result<()> {
        let name = cstr("image", image)?;
        let mut order: c_int = 0;
        // SAFETY: a live ioctx, a C string, an in/out int.
        check(
            unsafe { (self.conn.lib.rbd_create2)(self.conn.ioctx, name.as_ptr(), size, ffi::FEATURE_LAYERING, &mut order) },
            || format!("{}: create", self.what(image, None)),
        )?;
        Ok(())
    }

    /// Remove an image (librbd refuses while it has snapshots: ENOTEMPTY)
    /// and then the reservations kept beside it.
    pub fn remove(&self, image: &str) -> io::Result<()> {
        let name = cstr("image", image)?;
        // SAFETY: a live ioctx and a C string.
        check(unsafe { (self.conn.lib.rbd_remove)(self.conn.ioctx, name.as_ptr()) }, || {
            format!("{}: remove", self.what(image, None))
        })?;
        super::pr_store::remove(&self.conn, image)
    }

    /// Snapshot the image and protect the snapshot (clones need a
    /// protected parent). The snapshot holds every write the OSDs have
    /// acknowledged before the call: blockwire's rbd volumes run without
    /// librbd's cache, so every write acknowledged to an initiator is one.
    pub fn snapshot(&self, image: &str, snap: &str) -> io::Result<()> {
        let img = self.open(image, None)?;
        let s = cstr("snapshot", snap)?;
        // SAFETY: an open image and a C string.
        check(unsafe { (img.lib.rbd_snap_create)(img.image, s.as_ptr()) }, || {
            format!("{}: snapshot", self.what(image, Some(snap)))
        })?;
        // SAFETY: as above.
        let r = unsafe { (img.lib.rbd_snap_protect)(img.image, s.as_ptr()) };
        if r < 0 {
            // Not left half made.
            // SAFETY: as above.
            unsafe { (img.lib.rbd_snap_remove)(img.image, s.as_ptr()) };
            check(r, || format!("{}: protect", self.what(image, Some(snap))))?;
        }
        Ok(())
    }

    /// Unprotect and remove a snapshot (librbd refuses to unprotect one
    /// that has clones: EBUSY).
    pub fn remove_snapshot(&self, image: &str, snap: &str) -> io::Result<()> {
        let img = self.open(image, None)?;
        let s = cstr("snapshot", snap)?;
        // SAFETY: an open image and a C string.
        let r = unsafe { (img.lib.rbd_snap_unprotect)(img.image, s.as_ptr()) };
        // EINVAL: not protected (made by hand, or an earlier attempt got
        // this far).
        if r < 0 && r != -libc::EINVAL {
            check(r, || format!("{}: unprotect", self.what(image, Some(snap))))?;
        }
        // SAFETY: as above.
        check(unsafe { (img.lib.rbd_snap_remove)(img.image, s.as_ptr()) }, || {
            format!("{}: remove", self.what(image, Some(snap)))
        })?;
        Ok(())
    }

    /// A new image `clone` in this pool that reads through `image@snap`
    /// until written (copy-on-write).
    pub fn clone_snapshot(&self, image: &str, snap: &str, clone: &str) -> io::Result<()> {
        let (p, s, c) = (cstr("image", image)?, cstr("snapshot", snap)?, cstr("image", clone)?);
        let mut order: c_int = 0;
        // SAFETY: live ioctxs (the same pool), C strings, an in/out int.
        check(
            unsafe {
                (self.conn.lib.rbd_clone)(self.conn.ioctx, p.as_ptr(), s.as_ptr(), self.conn.ioctx, c.as_ptr(), ffi::FEATURE_LAYERING, &mut order)
            },
            || format!("{}: clone to {clone}", self.what(image, Some(snap))),
        )?;
        Ok(())
    }

    /// The size of the image (or snapshot) in bytes.
    pub fn size(&self, image: &str, snap: Option<&str>) -> io::Result<u64> {
        let img = self.open(image, snap)?;
        image_size(&img, || self.what(image, snap))
    }

    /// Bytes of the image (or snapshot) that hold data of its own, in
    /// whole RADOS objects (librbd's default is 4 MiB): a clone's parent
    /// is not counted.
    pub fn allocated_bytes(&self, image: &str, snap: Option<&str>) -> io::Result<u64> {
        extern "C" fn add(_offset: u64, len: usize, exists: c_int, arg: *mut c_void) -> c_int {
            if exists != 0 {
                // SAFETY: `arg` is the `u64` below, alive during the walk.
                unsafe { *(arg as *mut u64) += len as u64 };
            }
            0
        }
        let img = self.open(image, snap)?;
        let size = image_size(&img, || self.what(image, snap))?;
        let mut total = 0u64;
        // SAFETY: an open image; NULL: since creation; whole objects (no
        // reading of object contents); the callback gets `total`, which
        // outlives the call.
        check(
            unsafe {
                (img.lib.rbd_diff_iterate2)(
                    img.image,
                    std::ptr::null(),
                    0,
                    size,
                    0,
                    1,
                    add,
                    &mut total as *mut u64 as *mut c_void,
                )
            },
            || format!("{}: allocated extents", self.what(image, snap)),
        )?;
        Ok(total)
    }
}

fn image_size(img: &Image, what: impl FnOnce() -> String) -> io::Result<u64> {
    let mut size = 0u64;
    // SAFETY: an open image and an out-pointer.
    check(unsafe { (img.lib.rbd_get_size)(img.image, &mut size) }, || format!("{}: size", what()))?;
    Ok(size)
}
