//! FUSE over io_uring (Linux 6.14+, `enable_uring`): the kernel hands
//! requests to ring entries the daemon registered (one set per possible
//! CPU), and one io_uring command both returns an answer and asks for the
//! next request. No read(2)/write(2) per request; a request arrives as a
//! completion on the same thread that runs the initiator.
//!
//! No released crate speaks this transport (see README), so it is built on
//! the `io-uring` crate here. Each entry is owned by the kernel from
//! REGISTER / COMMIT_AND_FETCH until its completion, then by us until we
//! commit it again; its buffers are only touched in the second state.

use crate::abi::{self, UringCmdReq, UringEntInOut, UringReqHeader, WriteOut};
use crate::disk::{Disk, Done, Job};
use crate::fs::{Request, Step, VolumeFs};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::cell::{RefCell, UnsafeCell};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use zerocopy::{FromZeros, IntoBytes};

/// One ring entry: a header buffer and a payload buffer the kernel fills
/// with a request and reads the answer from.
struct Entry {
    qid: u16,
    header: UnsafeCell<Box<UringReqHeader>>,
    payload: UnsafeCell<Box<[u8]>>,
    /// iov[0] header, iov[1] payload; read by the kernel at REGISTER.
    iov: Box<[libc::iovec; 2]>,
}

struct Ring {
    uring: RefCell<IoUring<squeue::Entry128, cqueue::Entry>>,
    fuse_fd: RawFd,
    entries: Vec<Entry>,
    fs: VolumeFs,
    disk: Rc<Disk>,
    /// A submit is scheduled: answers queued meanwhile go with it.
    submit_pending: std::cell::Cell<bool>,
}

/// Number of possible CPUs: the kernel keeps one queue per possible CPU and
/// serves nothing until every one of them has an entry.
pub fn possible_cpus() -> usize {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    s.trim()
        .split(',')
        .filter_map(|r| match r.split_once('-') {
            Some((a, b)) => Some(b.parse::<usize>().ok()? - a.parse::<usize>().ok()? + 1),
            None => r.parse::<usize>().ok().map(|_| 1),
        })
        .sum::<usize>()
        .max(1)
}

/// Whether the fuse module lets daemons use io_uring (a host-wide switch).
pub fn enabled() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|s| s.trim() == "Y")
}

fn uring_cmd(
    fuse_fd: RawFd,
    cmd_op: u32,
    qid: u16,
    commit_id: u64,
    iov: Option<u64>,
    user_data: u64,
) -> squeue::Entry128 {
    let req = UringCmdReq {
        flags: 0,
        commit_id,
        qid,
        padding: [0; 6],
    };
    let mut area = [0u8; 80];
    area[..std::mem::size_of::<UringCmdReq>()].copy_from_slice(req.as_bytes());
    let mut b = opcode::UringCmd80::new(types::Fd(fuse_fd), cmd_op).cmd(area);
    if let Some(a) = iov {
        b = b.addr(Some(a));
    }
    let sqe = b.build().user_data(user_data);
    // FUSE wants sqe->len = 2 (header and payload iovecs) on REGISTER; the
    // builder has no setter for it. The SQE is plain bytes (repr(C)).
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    // SAFETY: Entry128 is a repr(C) 128-byte struct of integers; byte 24..28
    // of an io_uring_sqe is `len`.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: as above, any bytes are a valid Entry128.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

impl Ring {
    fn push(&self, sqe: &squeue::Entry128) {
        let mut u = self.uring.borrow_mut();
        // SAFETY: the SQE points at entry buffers that live as long as the ring.
        while unsafe { u.submission().push(sqe) }.is_err() {
            // Full: hand what is queued to the kernel and retry.
            let _ = u.submit();
        }
    }

    fn submit(&self) {
        if let Err(e) = self.uring.borrow().submit() {
            log::warn!("io_uring submit: {e}");
        }
    }

    /// Submit once the tasks that are ready now have run: one network read
    /// often completes many requests, and their answers then share one
    /// io_uring_enter.
    fn submit_soon(self: &Rc<Self>) {
        if !self.submit_pending.replace(true) {
            let ring = self.clone();
            tokio::task::spawn_local(async move {
                tokio::task::yield_now().await;
                ring.submit_pending.set(false);
                ring.submit();
            });
        }
    }

    /// Answer the request in entry `i` and ask for the next one.
    fn commit(self: &Rc<Self>, i: usize, error: i32, payload_len: usize) {
        let e = &self.entries[i];
        // SAFETY: we own entry i until the COMMIT_AND_FETCH below is submitted.
        let h = unsafe { &mut **e.header.get() };
        let commit_id = h.ring_ent_in_out.commit_id;
        let out = abi::OutHeader {
            len: 16 + payload_len as u32,
            error: -error,
            unique: commit_id,
        };
        h.in_out[..16].copy_from_slice(out.as_bytes());
        h.ring_ent_in_out = UringEntInOut {
            commit_id,
            payload_sz: payload_len as u32,
            ..Default::default()
        };
        let sqe = uring_cmd(
            self.fuse_fd,
            abi::URING_CMD_COMMIT_AND_FETCH,
            e.qid,
            commit_id,
            None,
            i as u64,
        );
        self.push(&sqe);
        self.submit_soon();
    }

    fn finish(self: &Rc<Self>, i: usize, done: Done) {
        match done {
            Done::Data(n) => self.commit(i, 0, n),
            Done::Written(size) => {
                // SAFETY: we own entry i; the write's data is no longer needed.
                let p = unsafe { &mut **self.entries[i].payload.get() };
                p[..8].copy_from_slice(WriteOut { size, padding: 0 }.as_bytes());
                self.commit(i, 0, 8)
            }
            Done::Empty => self.commit(i, 0, 0),
            Done::Failed(errno) => self.commit(i, errno, 0),
        }
    }

    /// A request arrived in entry `i`.
    fn on_request(self: &Rc<Self>, i: usize) {
        let e = &self.entries[i];
        // SAFETY: the completion gave entry i back to us.
        let (h, payload) = unsafe { (&**e.header.get(), &mut **e.payload.get()) };
        let len = (h.ring_ent_in_out.payload_sz as usize).min(payload.len());
        let req = match Request::from_ring(h, &payload[..len]) {
            Ok(r) => r,
            Err(err) => {
                log::warn!("malformed FUSE ring request: {err}");
                return self.commit(i, libc::EIO, 0);
            }
        };
        match self.fs.handle(&req) {
            Step::Reply { error, body } => {
                let n = body.len().min(payload.len());
                payload[..n].copy_from_slice(&body[..n]);
                self.commit(i, error, n)
            }
            // The kernel waits for an answer to everything it puts in a ring.
            Step::Silent => self.commit(i, libc::ENOSYS, 0),
            Step::Destroy => self.commit(i, 0, 0),
            Step::Io(io) => {
                let job = Job::new(&io, payload);
                let ring = self.clone();
                tokio::task::spawn_local(async move {
                    // SAFETY: entry i stays ours until `finish` commits it.
                    let buf = unsafe { &mut **ring.entries[i].payload.get() };
                    let done = ring.disk.run(&job, buf).await;
                    ring.finish(i, done);
                });
            }
        }
    }
}

/// An eventfd the ring's completions signal, so they wake the runtime.
fn completion_eventfd(uring: &IoUring<squeue::Entry128, cqueue::Entry>) -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes integers; the result is checked.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if efd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: efd is a fresh descriptor we own.
    let efd = unsafe { OwnedFd::from_raw_fd(efd) };
    uring.submitter().register_eventfd(efd.as_raw_fd())?;
    Ok(efd)
}

impl Entry {
    /// An entry of queue `qid`: its request header and a payload buffer of
    /// `max_payload` bytes, and the iovec pair the kernel writes them through.
    fn new(qid: u16, max_payload: usize) -> Entry {
        let mut header = Box::new(UringReqHeader::new_zeroed());
        // calloc'd: pages cost nothing until the kernel writes them.
        let mut payload = vec![0u8; max_payload].into_boxed_slice();
        let iov = Box::new([
            libc::iovec {
                iov_base: (&mut *header as *mut UringReqHeader).cast(),
                iov_len: std::mem::size_of::<UringReqHeader>(),
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload.len(),
            },
        ]);
        Entry {
            qid,
            header: UnsafeCell::new(header),
            payload: UnsafeCell::new(payload),
            iov,
        }
    }
}

impl Ring {
    /// Hand every entry to the kernel (REGISTER): each comes back with a
    /// request in it.
    fn register_entries(&self) {
        for (i, e) in self.entries.iter().enumerate() {
            let sqe = uring_cmd(
                self.fuse_fd,
                abi::URING_CMD_REGISTER,
                e.qid,
                0,
                Some(e.iov.as_ptr() as u64),
                i as u64,
            );
            self.push(&sqe);
        }
        self.submit();
    }
}

/// Register `per_queue` entries on every queue of the FUSE connection `fd`
/// (past INIT, with FUSE_OVER_IO_URING negotiated) and serve requests until
/// the connection ends. Must run inside a `LocalSet`.
pub async fn serve(
    fd: OwnedFd,
    fs: VolumeFs,
    disk: Rc<Disk>,
    per_queue: usize,
    max_payload: usize,
) -> io::Result<()> {
    let queues = possible_cpus();
    let total = queues * per_queue.max(1);
    let uring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .build((total as u32 * 2).next_power_of_two())?;
    let efd = completion_eventfd(&uring)?;
    let entries = (0..total)
        .map(|i| Entry::new((i / per_queue.max(1)) as u16, max_payload))
        .collect();
    let ring = Rc::new(Ring {
        uring: RefCell::new(uring),
        fuse_fd: fd.as_raw_fd(),
        entries,
        fs,
        disk,
        submit_pending: std::cell::Cell::new(false),
    });
    ring.register_entries();
    // SAFETY: the AsyncFd owns efd, so it stays open and the same while registered.
    let wake = unsafe { AsyncFd::register_with_interest(efd, Interest::READABLE) }?;
    let mut live = total;
    let mut served = 0u64;
    while live > 0 {
        let mut ready = wake.readable().await?;
        let mut counter = 0u64;
        // SAFETY: reading 8 bytes into a u64 from our eventfd.
        if unsafe {
            libc::read(
                ready.get_inner().as_raw_fd(),
                (&mut counter as *mut u64).cast(),
                8,
            )
        } < 0
        {
            ready.clear_ready();
        }
        let cqes: Vec<(usize, i32)> = {
            let mut u = ring.uring.borrow_mut();
            u.completion()
                .map(|c| (c.user_data() as usize, c.result()))
                .collect()
        };
        for (i, res) in cqes {
            if res == 0 && i < ring.entries.len() {
                served += 1;
                ring.on_request(i);
            } else {
                // ENOTCONN/ECANCELED: the connection is going away; anything
                // else refused the entry (REGISTER on a kernel without it).
                live -= 1;
                if served == 0 && res != -libc::ENOTCONN {
                    return Err(io::Error::from_raw_os_error(-res));
                }
                log::debug!(
                    "ring entry {i} ended: {}",
                    io::Error::from_raw_os_error(-res)
                );
            }
        }
    }
    // Let the tasks still answering finish before the buffers go away.
    drop(fd);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromBytes;

    #[test]
    fn register_sqe_carries_the_fuse_command() {
        let sqe = uring_cmd(7, abi::URING_CMD_REGISTER, 3, 0, Some(0x1000), 42);
        // SAFETY: Entry128 is 128 plain bytes.
        let raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(raw[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(i32::from_ne_bytes(raw[4..8].try_into().unwrap()), 7, "fd");
        assert_eq!(
            u32::from_ne_bytes(raw[8..12].try_into().unwrap()),
            abi::URING_CMD_REGISTER,
            "cmd_op"
        );
        assert_eq!(
            u64::from_ne_bytes(raw[16..24].try_into().unwrap()),
            0x1000,
            "addr = iovecs"
        );
        assert_eq!(
            u32::from_ne_bytes(raw[24..28].try_into().unwrap()),
            2,
            "len = 2 iovecs"
        );
        assert_eq!(
            u64::from_ne_bytes(raw[32..40].try_into().unwrap()),
            42,
            "user_data"
        );
        // The command area starts at byte 48: fuse_uring_cmd_req.
        let cmd = UringCmdReq::read_from_bytes(&raw[48..72]).unwrap();
        assert_eq!((cmd.commit_id, cmd.qid), (0, 3));
    }

    #[test]
    fn possible_cpus_counts_ranges() {
        assert!(possible_cpus() >= 1);
    }
}
