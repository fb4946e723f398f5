//! The classic transport: requests read from /dev/fuse, answers written
//! back, on the same thread that runs the initiator.
//!
//! Why not fuser's session loop: its reader threads block in read(2) and
//! hand each request to the runtime, so every request crossed threads twice
//! (reader -> worker -> socket task and back); on 2 vCPUs the wakeups cost
//! more than the I/O (bench/attach-overhead; figures in
//! docs/notes/2026-11-24-attach.md). Here /dev/fuse is non-blocking and
//! polled by the same current-thread runtime that owns the initiator's
//! sockets: a request, its network round trip and its answer run without a
//! thread switch, and at queue depth many of each are handled per wakeup.

use crate::abi::{OutHeader, WriteOut};
use crate::disk::{Disk, Done, Job};
use crate::fs::{Request, Step, VolumeFs, MAX_REQUEST};
use bytes::Bytes;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use zerocopy::IntoBytes;

/// A request buffer: the in header, a fuse_write_in and the largest write.
const BUF_LEN: usize = MAX_REQUEST as usize + 4096;
/// Idle buffers kept for reuse (each is BUF_LEN bytes). At least the most
/// requests ever in flight (max_background plus a few synchronous ones):
/// a fresh buffer costs a 1 MiB memset, which at queue depth 32 took two
/// thirds of the daemon's time. Only pages a request touched are resident.
const POOL_KEEP: usize = 256;

/// Request buffers, kept initialized so a read can land in one without
/// zeroing it first. Behind a mutex (uncontended) because the buffers a
/// write lends to the initiator come back from wherever it drops them.
#[derive(Default)]
struct Pool(Mutex<Vec<Box<[u8]>>>);

impl Pool {
    fn take(&self) -> Box<[u8]> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_else(|| vec![0u8; BUF_LEN].into_boxed_slice())
    }
    fn put(&self, b: Box<[u8]>) {
        let mut p = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if p.len() < POOL_KEEP {
            p.push(b);
        }
    }
}

/// A request buffer lent to the initiator as `Bytes`, so that a write's
/// data is sent without another copy (at 1 MiB that copy was a sixth of
/// the daemon's time). It goes back to the pool only when the initiator
/// drops its last slice of it, so no later request can reuse it before.
struct Lent {
    buf: Box<[u8]>,
    pool: Arc<Pool>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.pool.put(std::mem::take(&mut self.buf));
    }
}

struct Ctx {
    fd: RawFd,
    fs: VolumeFs,
    disk: Rc<Disk>,
    pool: Arc<Pool>,
}

/// Send one answer. ENOENT means the request is gone (interrupted, or the
/// connection aborted): nobody is waiting for the answer any more.
fn reply(fd: RawFd, unique: u64, error: i32, body: &[u8]) {
    let h = OutHeader {
        len: (16 + body.len()) as u32,
        error: -error,
        unique,
    };
    let iov = [
        libc::iovec {
            iov_base: h.as_bytes().as_ptr() as *mut _,
            iov_len: 16,
        },
        libc::iovec {
            iov_base: body.as_ptr() as *mut _,
            iov_len: body.len(),
        },
    ];
    // SAFETY: both iovecs point at live memory of the stated lengths.
    let n = unsafe { libc::writev(fd, iov.as_ptr(), if body.is_empty() { 1 } else { 2 }) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOENT) {
            log::debug!("answering request {unique}: {e}");
        }
    }
}

fn answer(fd: RawFd, unique: u64, done: Done, buf: &[u8]) {
    match done {
        Done::Data(n) => reply(fd, unique, 0, &buf[..n]),
        Done::Written(size) => reply(fd, unique, 0, WriteOut { size, padding: 0 }.as_bytes()),
        Done::Empty => reply(fd, unique, 0, &[]),
        Done::Failed(errno) => reply(fd, unique, errno, &[]),
    }
}

/// Serve requests on `fd` (a /dev/fuse connection past INIT) until the file
/// system is unmounted or DESTROY arrives. Must run inside a `LocalSet`.
pub async fn serve(fd: OwnedFd, fs: VolumeFs, disk: Rc<Disk>) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(raw, libc::F_GETFL);
        if fl < 0 || libc::fcntl(raw, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: the AsyncFd owns fd, so it stays open and the same while registered.
    let afd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE | Interest::ERROR) }?;
    let ctx = Rc::new(Ctx {
        fd: raw,
        fs,
        disk,
        pool: Arc::default(),
    });
    loop {
        // An aborted connection polls as EPOLLERR only, not readable; the
        // read then says ENODEV.
        let mut ready = afd.ready(Interest::READABLE | Interest::ERROR).await?;
        loop {
            let mut buf = ctx.pool.take();
            // SAFETY: buf is BUF_LEN writable bytes.
            let n = unsafe { libc::read(raw, buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                ctx.pool.put(buf);
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => {
                        ready.clear_ready();
                        break;
                    }
                    // ENOENT: the request was interrupted before we read it.
                    Some(libc::EINTR | libc::ENOENT) => continue,
                    // Unmounted or aborted.
                    Some(libc::ENODEV) => return Ok(()),
                    _ => return Err(e),
                }
            }
            if !dispatch(&ctx, buf, n as usize) {
                return Ok(());
            }
        }
    }
}

/// Handle one request; false once the session is over.
fn dispatch(ctx: &Rc<Ctx>, buf: Box<[u8]>, n: usize) -> bool {
    let req = match Request::parse(&buf[..n]) {
        Ok(r) => r,
        Err(e) => {
            // The kernel does not send these; if it did, failing the one
            // request (when it can be named) is all we can do.
            log::warn!("malformed FUSE request: {e}");
            if n >= 16 {
                let unique = u64::from_ne_bytes(buf[8..16].try_into().unwrap_or_default());
                reply(ctx.fd, unique, libc::EIO, &[]);
            }
            ctx.pool.put(buf);
            return true;
        }
    };
    let unique = req.header.unique;
    match ctx.fs.handle(&req) {
        Step::Reply { error, body } => reply(ctx.fd, unique, error, &body),
        Step::Silent => {}
        Step::Destroy => {
            reply(ctx.fd, unique, 0, &[]);
            return false;
        }
        Step::Io(io) => {
            let job = Job::new(&io, &buf);
            let ctx = ctx.clone();
            tokio::task::spawn_local(async move {
                if matches!(job, Job::Write { .. }) {
                    let lent = Bytes::from_owner(Lent {
                        buf,
                        pool: ctx.pool.clone(),
                    });
                    let done = ctx.disk.run_owned(&job, lent).await;
                    return answer(ctx.fd, unique, done, &[]);
                }
                let mut buf = buf;
                let done = ctx.disk.run(&job, &mut buf).await;
                answer(ctx.fd, unique, done, &buf);
                ctx.pool.put(buf);
            });
            return true;
        }
    }
    ctx.pool.put(buf);
    true
}
