//! Reading a large payload from a TCP socket straight into its caller's
//! buffer, for both TCP initiators (NVMe/TCP's C2HData, iSCSI's Data-In):
//! the session fills the buffer under its lock, this waits for the socket
//! and, while much is left, asks it not to wake us for every segment.

use std::os::fd::AsRawFd;
use tokio::net::tcp::OwnedReadHalf;

/// Most bytes a payload read waits for before the socket wakes us
/// (`SO_RCVLOWAT`). A whole 1 MiB payload (one wakeup per read,
/// docs/notes/2026-11-22-nvme-tcp-data-path.md) serialized the copy behind
/// the whole transfer where data arrives in MTU-sized frames (the lab's
/// veth links, GRO off), and the host waited for the target's last segment
/// before copying the first: at queue depth 1 over MTU 1500 with host and
/// target on separate CPUs, 438-440 MiB/s against 480-524 at 256 KiB
/// (docs/notes/2026-11-25-nvme-datapath.md, where the whole matrix is).
/// 256 KiB was the best single value over the paths measured (GRO off/on,
/// MTU 1500/9000, queue depth 1/8, loopback).
///
/// Both initiators wait so, so that the lab compares protocols, not wakeup
/// policies: an iSCSI initiator taking each segment as it came read 1 MiB
/// at MTU 9000 at 1,093-1,184 MiB/s against NVMe/TCP's 1,610-1,655 under
/// BBR (timer-paced on the lab's veth links, where each wakeup takes a CPU
/// the sender shares), and tied with it under cubic; with the low-water
/// mark it ties under both (1,457-1,801 against 1,554-1,777 under BBR) and
/// spends 20-30% less CPU per read (docs/notes/2026-11-28-merges-20.md).
pub(crate) const RCVLOWAT_MAX: usize = 256 << 10;

fn set_rcvlowat(rd: &OwnedReadHalf, n: usize) {
    let v = n as libc::c_int;
    // SAFETY: a valid fd and a c_int option value of the right size.
    unsafe {
        libc::setsockopt(
            rd.as_ref().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            &v as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Where a plain socket read of a payload lands: straight in the
/// destination, or, when the destination is not aligned to a cache line,
/// in an aligned staging buffer whose bytes are then copied in small pieces.
///
/// Why: the kernel copies received bytes out with `rep movsb` where the
/// CPU has fast short `rep movs` (FSRM), and on AMD Zen 3 that runs at a
/// fraction of its speed when the source (the socket buffer's pages: page
/// cache pages under `sendfile`) is aligned and the destination is not
/// (glibc BZ 30994). A 1 MiB read into a heap buffer 16 bytes past a page
/// cost our initiators 3x the CPU of a page-aligned one, more than the
/// TLS path, which decrypts into the destination with vector stores
/// (docs/notes/2026-11-27-h51h-seqread.md). Staging costs one more copy,
/// from a buffer the cache still holds, in pieces short enough that
/// glibc's `memcpy` uses vector moves, not `rep movsb`, for them.
pub(crate) struct Landing {
    /// Allocated on the first misaligned payload.
    staging: Vec<u8>,
    /// Whether the payload being read is staged; decided on its first
    /// read from where it starts (not per read: a direct read ends
    /// anywhere, and the next starts there).
    staged: Option<bool>,
    /// Bytes that went through the staging buffer (for tests).
    pub(crate) staged_bytes: u64,
}

/// The alignment a destination needs for a direct read.
const LANDING_ALIGN: usize = 64;
/// The staging buffer: within a core's L2 cache (512 KiB on Zen 3), which
/// the copy out of it then reads from.
const STAGING: usize = 128 << 10;
/// The copy out of the staging buffer goes in pieces of at most this many
/// bytes: below the smallest size for which glibc's `memcpy` uses
/// `rep movsb` (2 KiB, `rep_movsb_threshold` with 16-byte vectors).
const PIECE: usize = 1024;

impl Landing {
    pub(crate) fn new() -> Landing {
        Landing { staging: Vec::new(), staged: None, staged_bytes: 0 }
    }

    /// A new payload starts: decide again on its first read.
    pub(crate) fn begin(&mut self) {
        self.staged = None;
    }

    /// A payload goes on whose start a planned read (`placed`) put into
    /// place, at an aligned address (the plan takes no other): the rest
    /// goes straight there too, wherever the first read ended. (Decided
    /// from where the rest starts, a 1 MiB read was all staged: 42k more
    /// instructions of copy per read, h51p's note.)
    pub(crate) fn go_on_placed(&mut self) {
        self.staged = Some(false);
    }

    /// Read what the socket holds (up to `dst.len()` bytes) into `dst`;
    /// as `try_read`, nothing taken off the socket when it would block.
    pub(crate) fn read(&mut self, rd: &OwnedReadHalf, dst: &mut [u8]) -> std::io::Result<usize> {
        self.read_with(dst, |b| rd.try_read(b))
    }

    fn read_with(&mut self, dst: &mut [u8], read: impl FnOnce(&mut [u8]) -> std::io::Result<usize>) -> std::io::Result<usize> {
        let staged = *self.staged.get_or_insert_with(|| !(dst.as_ptr() as usize).is_multiple_of(LANDING_ALIGN));
        if !staged {
            return read(dst);
        }
        if self.staging.is_empty() {
            self.staging = vec![0u8; STAGING + LANDING_ALIGN];
        }
        let at = self.staging.as_ptr().align_offset(LANDING_ALIGN);
        let n = dst.len().min(STAGING);
        let stage = &mut self.staging[at..at + n];
        let got = read(stage)?.min(n);
        for (d, s) in dst[..got].chunks_mut(PIECE).zip(stage[..got].chunks(PIECE)) {
            d.copy_from_slice(s);
        }
        self.staged_bytes += got as u64;
        Ok(got)
    }
}

/// What one attempt to read more of a payload into place did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Filled {
    /// Some of the payload went into place; `left` bytes of it are still to come.
    Placed { left: usize },
    /// Nothing went into place: the socket must first hold `need` more
    /// bytes (at least) than it does now. Counted when the attempt ends:
    /// through the TLS record layer an attempt can take bytes off the
    /// socket (part of a record, held) and place nothing, so what was
    /// left before it overstates what is still to come on the wire.
    Waiting { need: usize },
    /// The peer closed the connection.
    Closed,
}

impl Filled {
    /// The outcome of one read attempt `r` (bytes placed, or an error)
    /// after which the payload has `left` bytes to come, `held` of them
    /// already taken off the socket and held (part of a TLS record; 0 for
    /// a plain socket read, which takes nothing when it would block).
    pub(crate) fn after(r: std::io::Result<usize>, left: usize, held: usize) -> std::io::Result<Filled> {
        match r {
            Ok(0) => Ok(Filled::Closed),
            Ok(_) => Ok(Filled::Placed { left }),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(Filled::Waiting { need: left.saturating_sub(held) }),
            Err(e) => Err(e),
        }
    }
}

/// Below this many bytes still to come, a payload read waits for all of
/// them: a copy this short after the last byte is a few microseconds.
const TAIL: usize = 32 << 10;

/// How many bytes the socket should hold before it wakes a read that has
/// `need` bytes of its payload still to come: half of them, at most `max`,
/// at least [`TAIL`] (or all, when fewer are left).
///
/// Why not all of them once fewer than `max` are left: the read then
/// sleeps until the target's last byte is in and only then copies up to
/// `max` bytes, while nothing else happens (at queue depth 1 the next
/// command waits for that copy). Waiting for half of what is left
/// instead, the copy of one half overlaps the arrival of the other, and
/// what is left to copy after the last byte shrinks to at most [`TAIL`]
/// (about 0.25 MiB -> 32 KiB, one wakeup more or so per large payload).
/// On the lab's MTU 9000 link, with host and target on their own CPUs,
/// the median time from the target's last `sendfile` to the next command
/// fell from 22-70 to 17-54 µs, under load (docs/notes/2026-11-27-h51l-seqread-9000.md).
fn low_water(need: usize, max: usize) -> usize {
    let max = max.max(1);
    if need <= TAIL {
        return need.min(max).max(1);
    }
    (need / 2).clamp(TAIL.min(max), max)
}

/// Read the `left` bytes still to come of a payload: `fill` reads what the
/// socket holds into place (with `OwnedReadHalf::try_read`, under the
/// session's lock, so that a caller giving up takes its buffer back under
/// the same lock) and says what it did.
///
/// The socket is told to wake us only once it holds what `fill` last said
/// it needs (at most [`RCVLOWAT_MAX`]): never more than will come, or
/// the read waits for bytes the target will never send (until the
/// command's timeout; docs/notes/2026-11-26-tls-lowat.md).
pub(crate) async fn recv(
    rd: &OwnedReadHalf,
    mut left: usize,
    mut fill: impl FnMut() -> std::io::Result<Filled>,
) -> Result<(), String> {
    let mut lowat = 1;
    while left > 0 {
        rd.readable().await.map_err(|e| format!("receive failed: {e}"))?;
        match fill() {
            Ok(Filled::Placed { left: l }) => left = l,
            Ok(Filled::Closed) => return Err("target closed the connection".into()),
            Ok(Filled::Waiting { need }) => {
                let want = low_water(need, RCVLOWAT_MAX);
                if want != lowat {
                    set_rcvlowat(rd, want);
                    lowat = want;
                }
            }
            Err(e) => return Err(format!("receive failed: {e}")),
        }
    }
    if lowat != 1 {
        set_rcvlowat(rd, 1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `data` to a read in the sizes of `cuts`, as a socket would.
    fn reads<'a>(data: &'a [u8], cuts: &'a [usize]) -> impl FnMut(&mut [u8]) -> std::io::Result<usize> + 'a {
        let (mut at, mut i) = (0, 0);
        move |b: &mut [u8]| {
            let n = cuts[i % cuts.len()].min(b.len()).min(data.len() - at);
            b[..n].copy_from_slice(&data[at..at + n]);
            at += n;
            i += 1;
            Ok(n)
        }
    }

    fn land(offset: usize) -> (Vec<u8>, Vec<u8>, u64) {
        const LEN: usize = 300_000;
        let data: Vec<u8> = (0..LEN).map(|i| (i * 31 + 7) as u8).collect();
        let mut space = vec![0u8; LEN + 2 * LANDING_ALIGN];
        let start = space.as_ptr().align_offset(LANDING_ALIGN) + offset;
        let dst = &mut space[start..start + LEN];
        let mut l = Landing::new();
        l.begin();
        {
            let mut read = reads(&data, &[1448, 70_000, 200_000, 3]);
            let mut placed = 0;
            while placed < LEN {
                placed += l.read_with(&mut dst[placed..], &mut read).unwrap();
            }
        }
        (dst.to_vec(), data, l.staged_bytes)
    }

    /// Waiting for a 1 MiB payload that arrives no faster than it is
    /// taken: every wait is for at most `max` and never for more than is
    /// still to come, and the last one (after which everything left is
    /// copied while nothing else arrives) is for at most `TAIL` bytes,
    /// not for all of the last `max`.
    #[test]
    fn the_last_wait_of_a_large_payload_is_short() {
        let max = 256 << 10;
        let mut left = 1 << 20;
        let mut waits = vec![];
        while left > 0 {
            let want = low_water(left, max);
            assert!(want >= 1 && want <= left && want <= max, "want {want} of {left}");
            waits.push(want);
            left -= want;
        }
        assert_eq!(waits[0], max);
        assert!(*waits.last().unwrap() <= TAIL, "{waits:?}");
        // A few more wakeups than 1 MiB / max, not one per segment.
        assert!(waits.len() <= 10, "{waits:?}");
        // Small payloads and small max are waited for as before.
        assert_eq!(low_water(1000, max), 1000);
        assert_eq!(low_water(0, max), 1);
        assert_eq!(low_water(TAIL + 2, 1), 1);
    }

    /// A payload into an aligned buffer goes straight there, in reads
    /// that end anywhere (its later reads start unaligned).
    #[test]
    fn an_aligned_destination_is_read_into_directly() {
        let (got, want, staged) = land(0);
        assert!(got == want);
        assert_eq!(staged, 0);
    }

    /// A payload into a buffer 16 bytes past a cache line (where a large
    /// heap buffer starts) goes through the staging buffer, intact.
    #[test]
    fn a_misaligned_destination_is_staged_and_arrives_intact() {
        let (got, want, staged) = land(16);
        assert!(got == want);
        assert_eq!(staged, want.len() as u64);
    }

    /// The rest of a payload whose start a planned read placed (at an
    /// aligned address) goes straight on from wherever that read ended.
    #[test]
    fn the_rest_of_a_placed_payload_is_not_staged() {
        let data: Vec<u8> = (0..100_000).map(|i| (i * 13 + 1) as u8).collect();
        let mut space = vec![0u8; data.len() + LANDING_ALIGN];
        let start = space.as_ptr().align_offset(LANDING_ALIGN);
        let dst = &mut space[start..start + data.len()];
        // The planned read placed 1,424 bytes (a segment less a header).
        dst[..1424].copy_from_slice(&data[..1424]);
        let mut l = Landing::new();
        l.go_on_placed();
        let mut read = reads(&data[1424..], &[1448, 65_536]);
        let mut placed = 1424;
        while placed < data.len() {
            placed += l.read_with(&mut dst[placed..], &mut read).unwrap();
        }
        assert!(dst == &data[..]);
        assert_eq!(l.staged_bytes, 0);
    }
}
