//! Planned reads, for both TCP initiators (iSCSI's Data-In, NVMe/TCP's
//! C2HData): one socket read of the answers a session expects next, in
//! the order their commands were sent, each answer's header into a small
//! array of ours and its payload straight into its caller's buffer, then
//! whatever else came into the receive buffer. No copy of the payloads out
//! of the receive buffer when the target answers in turn; when it does
//! not, the bytes from the first answer out of turn on are gathered back
//! into the receive buffer, in stream order, and handled from there as any
//! other (the buffers they passed through belong to commands still waiting
//! for their own data, which overwrites them). The session (no sockets)
//! makes the plan and checks each piece ([`Plans`]); this is the read, the
//! walk over its pieces and the gather.

use bytes::{Buf, BytesMut};
use std::os::fd::AsRawFd;
use tokio::net::tcp::OwnedReadHalf;

/// Most pieces in one plan (two iovecs each, well within `IOV_MAX`).
pub(crate) const PLAN_MAX: usize = 64;
/// The longest data PDU header a session plans for (iSCSI's BHS).
const HEADER_MAX: usize = 48;
/// Room in the receive buffer for what follows the pieces: a burst of 32
/// answers to 4 KiB reads (132 KiB) in one read.
pub(crate) const READ_CHUNK_SMALL_IO: usize = 256 * 1024;

/// A session (iSCSI's or an NVMe/TCP queue's) that plans reads.
pub(crate) trait Plans {
    /// A payload taken, maybe with more of it to read straight into place.
    type Direct;
    /// Its data PDUs' header length (no digest: no plan with digests).
    const HEADER: usize;
    /// Plan: `take` gets each expected answer's buffer in stream order and
    /// may refuse it, which ends the plan. The number of pieces planned.
    fn plan_placed(&mut self, take: impl FnMut(&mut [u8]) -> bool) -> usize;
    /// Piece `i` arrived: its `header`, and `got` bytes of its payload in
    /// the buffer. None: not what the plan expected, nothing taken.
    fn receive_placed(&mut self, i: usize, header: &[u8], got: usize) -> Option<Self::Direct>;
    fn is_done(d: &Self::Direct) -> bool;
}

/// [`Plans`] for a session type whose own methods of those names do it
/// (both sessions': they live in crates without sockets, which know no
/// trait of this one's).
macro_rules! plans_by {
    ($session:ty, $direct:ty, $header:expr) => {
        impl $crate::placed::Plans for $session {
            type Direct = $direct;
            const HEADER: usize = $header;
            fn plan_placed(&mut self, take: impl FnMut(&mut [u8]) -> bool) -> usize {
                <$session>::plan_placed(self, take)
            }
            fn receive_placed(&mut self, i: usize, header: &[u8], got: usize) -> Option<$direct> {
                <$session>::receive_placed(self, i, header, got)
            }
            fn is_done(d: &$direct) -> bool {
                d.is_done()
            }
        }
    };
}
pub(crate) use plans_by;

/// What a planned read did.
pub(crate) enum PlacedRead<D> {
    /// Read; what was not placed is in the receive buffer, and maybe a
    /// payload is still to come straight into its buffer.
    Read(Option<D>),
    /// Nothing to plan, and the caller asked for no read then.
    Unplanned,
    Closed,
}

pub(crate) struct Placing {
    headers: Vec<[u8; HEADER_MAX]>,
    /// The plan's buffers (address, length), valid while the session lock
    /// that planned them is held.
    dest: Vec<(usize, usize)>,
    gather: Vec<u8>,
    /// For the log: planned reads, the payloads they placed, those in
    /// which the target answered out of turn, and the times there was
    /// nothing to plan.
    pub reads: u64,
    pub placed: u64,
    pub misses: u64,
    pub noplan: u64,
}

/// One read that cannot block (`read`, a system call into `room` bytes
/// of buffers): the bytes it brought. A read short of `room` emptied the
/// socket's receive queue, so the socket's read readiness is cleared
/// (`bw_net::tcp_read`, as the target's `framing::read_draining` does),
/// and the next read attempt waits for readiness instead of making a
/// system call that fails with EAGAIN (one per wake at 4 KiB QD32: the
/// read after the batch's answers were placed, while their callers had not
/// yet sent more).
fn read_clearing_if_short(rd: &OwnedReadHalf, room: usize, read: impl FnOnce() -> std::io::Result<usize>) -> std::io::Result<usize> {
    bw_net::tcp_read::read_clearing_if_short(rd.as_ref(), room, false, read).map(|(n, _)| n)
}

impl Placing {
    pub fn new() -> Placing {
        Placing { headers: vec![[0; HEADER_MAX]; PLAN_MAX], dest: Vec::with_capacity(PLAN_MAX), gather: Vec::new(), reads: 0, placed: 0, misses: 0, noplan: 0 }
    }

    /// Plan and make one read under the session's lock (the plan's buffers
    /// stay their callers' while it is held: the callers take them back
    /// under the same lock). `buf` holds less than a header: the start of
    /// the first expected one. With nothing to plan: with `read_anyway`,
    /// read into `buf` without waiting (so that the wait is for readiness
    /// and the answers, when they come, are planned for: a blocking read
    /// would stage them all), else [`PlacedRead::Unplanned`].
    pub fn read<S: Plans>(&mut self, rd: &OwnedReadHalf, buf: &mut BytesMut, s: &mut S, read_anyway: bool) -> std::io::Result<PlacedRead<S::Direct>> {
        let hl = S::HEADER;
        let k = buf.len();
        debug_assert!(k < hl && hl <= HEADER_MAX);
        self.dest.clear();
        let dest = &mut self.dest;
        // Aligned buffers only (the kernel's copy into a misaligned one is
        // slow on some CPUs: see `direct::Landing`).
        let n = s.plan_placed(|b| {
            let ok = (b.as_ptr() as usize).is_multiple_of(64) && dest.len() < PLAN_MAX;
            if ok {
                dest.push((b.as_mut_ptr() as usize, b.len()));
            }
            ok
        });
        if n == 0 {
            if !read_anyway {
                return Ok(PlacedRead::Unplanned);
            }
            self.noplan += 1;
            if buf.capacity() - k < READ_CHUNK_SMALL_IO {
                buf.reserve(READ_CHUNK_SMALL_IO);
            }
            let room = buf.capacity() - k;
            return match read_clearing_if_short(rd, room, || rd.try_read_buf(buf))? {
                0 => Ok(PlacedRead::Closed),
                _ => Ok(PlacedRead::Read(None)),
            };
        }
        if buf.capacity() - k < READ_CHUNK_SMALL_IO {
            buf.reserve(READ_CHUNK_SMALL_IO);
        }
        self.headers[0][..k].copy_from_slice(&buf[..]);
        // Not zeroed first (2 KiB a read): only the first 2n + 1 are used.
        let mut iov = [const { std::mem::MaybeUninit::<libc::iovec>::uninit() }; 2 * PLAN_MAX + 1];
        let mut planned = 0;
        for (i, &(at, len)) in self.dest.iter().enumerate() {
            let from = if i == 0 { k } else { 0 };
            iov[2 * i].write(libc::iovec { iov_base: self.headers[i][from..hl].as_mut_ptr().cast(), iov_len: hl - from });
            iov[2 * i + 1].write(libc::iovec { iov_base: at as *mut libc::c_void, iov_len: len });
            planned += hl - from + len;
        }
        let spare = buf.spare_capacity_mut();
        let spare_len = spare.len();
        iov[2 * n].write(libc::iovec { iov_base: spare.as_mut_ptr().cast(), iov_len: spare_len });
        let fd = rd.as_ref().as_raw_fd();
        let got = read_clearing_if_short(rd, planned + spare_len, || {
            // SAFETY: every iovec is writable memory of its length: the
            // headers', the receive buffer's spare capacity, and the plan's
            // callers' buffers, theirs while the session lock is held (the
            // caller holds it); the first 2n + 1 were written above.
            let r = unsafe { libc::readv(fd, iov.as_ptr().cast(), (2 * n + 1) as libc::c_int) };
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(r as usize)
            }
        })?;
        if got == 0 {
            return Ok(PlacedRead::Closed);
        }
        self.reads += 1;
        let tail = got.saturating_sub(planned);
        // SAFETY: readv wrote `tail` bytes into the spare capacity.
        unsafe { buf.set_len(k + tail) };
        buf.advance(k);
        // Take the pieces in turn while they are what the plan expected.
        let mut left = got;
        for i in 0..n {
            if left == 0 {
                break;
            }
            let from = if i == 0 { k } else { 0 };
            let (h, len) = (hl - from, self.dest[i].1);
            if left >= h {
                let placed = (left - h).min(len);
                if let Some(d) = s.receive_placed(i, &self.headers[i][..hl], placed) {
                    left -= h + placed;
                    self.placed += 1;
                    if S::is_done(&d) {
                        continue;
                    }
                    return Ok(PlacedRead::Read(Some(d)));
                }
                self.misses += 1;
            }
            // Out of turn (or the header not whole).
            self.gather_back(hl, i, k, left, buf);
            break;
        }
        Ok(PlacedRead::Read(None))
    }

    /// The stream from planned piece `i` on (`left` bytes of the read, the
    /// first piece's header `k` bytes short of what `headers[0]` holds) goes
    /// back into the receive buffer, in order, ahead of what is there.
    fn gather_back(&mut self, hl: usize, i: usize, k: usize, mut left: usize, buf: &mut BytesMut) {
        self.gather.clear();
        for j in i..self.dest.len() {
            if left == 0 {
                break;
            }
            let from = if j == 0 { k } else { 0 };
            let h = left.min(hl - from);
            self.gather.extend_from_slice(&self.headers[j][..from + h]);
            left -= h;
            let p = left.min(self.dest[j].1);
            // SAFETY: as for the readv in `read` (under the same lock);
            // readv wrote these `p` bytes.
            self.gather.extend_from_slice(unsafe { std::slice::from_raw_parts(self.dest[j].0 as *const u8, p) });
            left -= p;
        }
        let mut nb = BytesMut::with_capacity(self.gather.len() + buf.len() + READ_CHUNK_SMALL_IO);
        nb.extend_from_slice(&self.gather);
        nb.extend_from_slice(buf);
        *buf = nb;
    }
}
