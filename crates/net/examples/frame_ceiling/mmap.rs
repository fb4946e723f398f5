//! PACKET_MMAP for frame_ceiling's `mmap` datapath: one AF_PACKET socket
//! with a TPACKET_V3 receive ring and a transmit ring (tpacket3_hdr
//! frames) in one shared mapping, the receive ring first (the kernel's
//! layout when both are set; Documentation/networking/packet_mmap.rst).
//!
//! Receive: the kernel fills blocks of variable-sized frames and hands a
//! block over (TP_STATUS_USER) when it is full or its retire timer
//! (tp_retire_blk_tov) runs out; we walk its frames by tp_next_offset and
//! give it back (TP_STATUS_KERNEL). Transmit: frames are written in place,
//! marked TP_STATUS_SEND_REQUEST, and one `sendto(fd, NULL, 0,
//! MSG_DONTWAIT)` sends every marked frame; a slot is free again once the
//! kernel has set it back to TP_STATUS_AVAILABLE. PACKET_QDISC_BYPASS is
//! on. The structs and constants come from `libc` (its copies of
//! include/uapi/linux/if_packet.h).

use std::io;
use std::marker::PhantomData;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Receive ring: 64 blocks of 256 KiB (28 MTU-9000 frames, or thousands
/// of small ones, per block), a block retired after 1 ms at the latest.
/// A request/reply window too small to fill a block therefore waits for
/// that timer every round trip (seen on veth: about WINDOW x 1000 pairs/s
/// with 60-byte requests); the timer, not the per-frame cost, is then what
/// the measured rate shows.
const RX_BLOCK_SIZE: usize = 256 << 10;
const RX_BLOCK_NR: usize = 64;
const RX_RETIRE_MS: u32 = 1;
/// Transmit ring: blocks of 256 KiB, enough of them for this many frames.
const TX_BLOCK_SIZE: usize = 256 << 10;
const TX_FRAMES_MIN: usize = 512;

/// Where a tpacket3_hdr's frame data starts in a TX slot: the kernel's
/// `po->tp_hdrlen - sizeof(struct sockaddr_ll)`, i.e.
/// TPACKET_ALIGN(sizeof(struct tpacket3_hdr)) (net/packet/af_packet.c,
/// tpacket_parse_header, without PACKET_TX_HAS_OFF). Also where the
/// sockaddr_ll of a received frame sits.
const HDR_ALIGNED: usize = libc::TPACKET3_HDRLEN - mem::size_of::<libc::sockaddr_ll>();
/// Offset of block_status in struct tpacket_block_desc (version,
/// offset_to_priv, then struct tpacket_hdr_v1 starting with block_status).
const BLOCK_STATUS: usize = mem::offset_of!(libc::tpacket_block_desc, hdr);

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

fn os_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, v: &T, what: &str) -> io::Result<()> {
    // SAFETY: `v` is a live value of the type the option expects, passed with its size.
    let r = unsafe { libc::setsockopt(fd, level, name, v as *const T as *const libc::c_void, mem::size_of::<T>() as libc::socklen_t) };
    if r < 0 {
        return Err(os_error(what));
    }
    Ok(())
}

/// Wait for `events` on `fd` for at most `ms` milliseconds (EINTR is a
/// spurious wake-up, not an error).
fn poll(fd: RawFd, events: libc::c_short, ms: i32, what: &str) -> io::Result<()> {
    let mut p = libc::pollfd { fd, events, revents: 0 };
    // SAFETY: one live pollfd.
    if unsafe { libc::poll(&mut p, 1, ms) } < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
        }
    }
    Ok(())
}

struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; no reference into
        // the mapping outlives the socket that owns it.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// An AF_PACKET socket with both rings, bound to one interface and EtherType.
pub struct MmapSocket {
    pub rx: RxRing,
    pub tx: TxRing,
    mac: [u8; 6],
    _map: Mapping,
    _fd: OwnedFd,
}

impl MmapSocket {
    pub fn open(iface: &str, ethertype: u16) -> io::Result<Self> {
        let info = bw_net::interface_info(iface)?;
        // Protocol 0 until bind: nothing lands in the ring before it is set up.
        // SAFETY: plain socket creation; the fd is owned right below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(os_error("AF_PACKET socket (needs root or CAP_NET_RAW)"));
        }
        // SAFETY: a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        let version = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_VERSION, &version, "PACKET_VERSION (TPACKET_V3)")?;

        // Receive ring. With TPACKET_V3 frames are packed into blocks at
        // their real size; tp_frame_size only has to be a multiple of
        // TPACKET_ALIGNMENT that divides the block (2048-aligned here, room
        // for an MTU frame and its headers).
        let rx_frame = round_up(info.mtu + 14 + libc::TPACKET3_HDRLEN, 2048);
        if rx_frame > RX_BLOCK_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("MTU {} too large for {RX_BLOCK_SIZE}-byte ring blocks", info.mtu),
            ));
        }
        // SAFETY: tpacket_req3 is plain integers; zero is valid.
        let mut req: libc::tpacket_req3 = unsafe { mem::zeroed() };
        req.tp_block_size = RX_BLOCK_SIZE as u32;
        req.tp_block_nr = RX_BLOCK_NR as u32;
        req.tp_frame_size = rx_frame as u32;
        req.tp_frame_nr = ((RX_BLOCK_SIZE / rx_frame) * RX_BLOCK_NR) as u32;
        req.tp_retire_blk_tov = RX_RETIRE_MS;
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_RX_RING, &req, "PACKET_RX_RING")?;

        // Transmit ring: fixed-size slots (tpacket3_hdr, data at
        // HDR_ALIGNED), as many as fit a block; the kernel rejects a
        // tp_retire_blk_tov, private area or feature word here.
        let tx_frame = round_up(HDR_ALIGNED + info.mtu + 14, libc::TPACKET_ALIGNMENT);
        let per_block = TX_BLOCK_SIZE / tx_frame;
        let tx_blocks = TX_FRAMES_MIN.div_ceil(per_block.max(1));
        // SAFETY: as above.
        let mut req: libc::tpacket_req3 = unsafe { mem::zeroed() };
        req.tp_block_size = TX_BLOCK_SIZE as u32;
        req.tp_block_nr = tx_blocks as u32;
        req.tp_frame_size = tx_frame as u32;
        req.tp_frame_nr = (per_block * tx_blocks) as u32;
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_TX_RING, &req, "PACKET_TX_RING")?;

        let one: libc::c_int = 1;
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, &one, "PACKET_QDISC_BYPASS")?;
        // Best effort (Linux >= 4.20): our own transmissions are not input.
        let _ = setsockopt(raw, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &one, "PACKET_IGNORE_OUTGOING");
        // The send buffer still bounds the frames in flight out of the TX
        // ring; the same 4 MiB as the packet datapath (best effort).
        let buf: libc::c_int = 4 << 20;
        let _ = setsockopt(raw, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &buf, "SO_SNDBUFFORCE");

        let rx_len = RX_BLOCK_SIZE * RX_BLOCK_NR;
        let len = rx_len + TX_BLOCK_SIZE * tx_blocks;
        // SAFETY: maps the socket's rings (RX then TX) into fresh memory
        // of exactly their combined size.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_POPULATE, raw, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(os_error("mmap of the RX and TX rings"));
        }
        let map = Mapping { ptr: p as *mut u8, len };

        // SAFETY: sockaddr_ll is plain data; zero is valid.
        let mut sll: libc::sockaddr_ll = unsafe { mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ethertype.to_be();
        sll.sll_ifindex = info.index;
        // SAFETY: a live sockaddr_ll with its size.
        let r =
            unsafe { libc::bind(raw, &sll as *const _ as *const libc::sockaddr, mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t) };
        if r < 0 {
            return Err(os_error(&format!("bind AF_PACKET to {iface}")));
        }
        Ok(MmapSocket {
            rx: RxRing { fd: raw, base: map.ptr, cur: 0 },
            // SAFETY: the TX ring starts right after the RX ring in the mapping.
            tx: TxRing {
                fd: raw,
                base: unsafe { map.ptr.add(rx_len) },
                frame_size: tx_frame,
                per_block,
                frames: per_block * tx_blocks,
                head: 0,
                pending: 0,
            },
            mac: info.mac,
            _map: map,
            _fd: fd,
        })
    }

    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }
}

/// The TPACKET_V3 receive ring: blocks taken in order.
pub struct RxRing {
    fd: RawFd,
    base: *mut u8,
    cur: usize,
}

impl RxRing {
    fn block(&self) -> *mut u8 {
        // SAFETY: cur < RX_BLOCK_NR, so the block lies inside the RX part of the mapping.
        unsafe { self.base.add(self.cur * RX_BLOCK_SIZE) }
    }

    fn block_status(&self) -> &AtomicU32 {
        // SAFETY: block_status is a 4-byte-aligned u32 in the current
        // block's descriptor, inside the mapping for as long as `self`
        // lives; the kernel and we hand it over with release/acquire
        // (smp_wmb/smp_rmb on its side).
        unsafe { &*(self.block().add(BLOCK_STATUS) as *const AtomicU32) }
    }

    /// Wait until the next block is ours, for at most `timeout` (None:
    /// for ever). Ok(false) when the time ran out.
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if self.block_status().load(Ordering::Acquire) & libc::TP_STATUS_USER != 0 {
                return Ok(true);
            }
            let ms = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(false);
                    }
                    left.as_millis().clamp(1, i32::MAX as u128) as i32
                }
            };
            poll(self.fd, libc::POLLIN | libc::POLLERR, ms, "poll(POLLIN) on the RX ring")?;
        }
    }

    /// The frames of the block `wait` returned true for (frames this host
    /// sent itself, should any show up, are left out).
    pub fn frames(&self) -> Frames<'_> {
        let b = self.block();
        // SAFETY: the block is ours (TP_STATUS_USER) until `release`, which
        // needs `&mut self`; its descriptor is a tpacket_block_desc.
        let h1 = unsafe { (*(b as *const libc::tpacket_block_desc)).hdr.bh1 };
        // SAFETY: offset_to_first_pkt lies inside the block.
        let first = unsafe { b.add(h1.offset_to_first_pkt as usize) };
        Frames { p: first, left: h1.num_pkts, _ring: PhantomData }
    }

    /// Give the current block back to the kernel and move to the next.
    pub fn release(&mut self) {
        self.block_status().store(libc::TP_STATUS_KERNEL, Ordering::Release);
        self.cur = (self.cur + 1) % RX_BLOCK_NR;
    }
}

pub struct Frames<'a> {
    p: *const u8,
    left: u32,
    _ring: PhantomData<&'a RxRing>,
}

impl<'a> Iterator for Frames<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        while self.left > 0 {
            // SAFETY: `p` points at one of the block's num_pkts tpacket3_hdr
            // (TPACKET_ALIGNMENT-aligned), each followed by its sockaddr_ll
            // at HDR_ALIGNED and its frame at tp_mac, tp_snaplen long, all
            // inside the block, which stays ours while the ring is borrowed.
            let (frame, outgoing, next) = unsafe {
                let h = &*(self.p as *const libc::tpacket3_hdr);
                let ll = &*(self.p.add(HDR_ALIGNED) as *const libc::sockaddr_ll);
                let frame = std::slice::from_raw_parts(self.p.add(h.tp_mac as usize), h.tp_snaplen as usize);
                (frame, ll.sll_pkttype == libc::PACKET_OUTGOING, h.tp_next_offset as usize)
            };
            self.left -= 1;
            // SAFETY: the next header (unused past the last frame) is inside the block.
            self.p = unsafe { self.p.add(next) };
            if !outgoing {
                return Some(frame);
            }
        }
        None
    }
}

/// The transmit ring: slots filled in order from `head`.
pub struct TxRing {
    fd: RawFd,
    base: *mut u8,
    frame_size: usize,
    per_block: usize,
    frames: usize,
    head: usize,
    /// Frames marked for sending since the last kick.
    pending: usize,
}

impl TxRing {
    fn slot_ptr(&self, i: usize) -> *mut u8 {
        // SAFETY: i < frames; slots never straddle blocks, and blocks
        // follow each other in the mapping.
        unsafe { self.base.add((i / self.per_block) * TX_BLOCK_SIZE + (i % self.per_block) * self.frame_size) }
    }

    fn status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: tp_status is a 4-byte-aligned u32 in slot i's
        // tpacket3_hdr, inside the mapping while `self` lives; handed over
        // with release/acquire as in RxRing::block_status.
        unsafe { &*(self.slot_ptr(i).add(mem::offset_of!(libc::tpacket3_hdr, tp_status)) as *const AtomicU32) }
    }

    /// The largest frame a slot holds.
    pub fn max_frame(&self) -> usize {
        self.frame_size - HDR_ALIGNED
    }

    /// The data area of the next slot, once the kernel is done with it
    /// (if the ring is full: send what is queued and wait).
    pub fn slot(&mut self) -> io::Result<&mut [u8]> {
        loop {
            let s = self.status(self.head).load(Ordering::Acquire);
            if s == libc::TP_STATUS_AVAILABLE {
                break;
            }
            if s & libc::TP_STATUS_WRONG_FORMAT != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("TX ring slot {} refused by the kernel (TP_STATUS_WRONG_FORMAT)", self.head),
                ));
            }
            self.kick()?;
            poll(self.fd, libc::POLLOUT, 10, "poll(POLLOUT) on the TX ring")?;
        }
        let n = self.max_frame();
        // SAFETY: the slot is ours (TP_STATUS_AVAILABLE) until `commit`, which
        // needs `&mut self`; its data area is max_frame bytes from HDR_ALIGNED.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.slot_ptr(self.head).add(HDR_ALIGNED), n) })
    }

    /// Queue the slot `slot` returned, its first `len` bytes a frame.
    pub fn commit(&mut self, len: usize) {
        assert!(len <= self.max_frame(), "frame of {len} bytes, TX slots hold {}", self.max_frame());
        let h = self.slot_ptr(self.head) as *mut libc::tpacket3_hdr;
        // SAFETY: the slot is ours (see `slot`); plain field writes before
        // the status store below publishes them.
        unsafe {
            (*h).tp_len = len as u32;
            (*h).tp_snaplen = len as u32;
            (*h).tp_next_offset = 0;
        }
        self.status(self.head).store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
        self.head = (self.head + 1) % self.frames;
        self.pending += 1;
    }

    /// Have the kernel send every queued frame (one syscall, not waiting
    /// for completion). A full device queue leaves them queued for the
    /// next kick.
    pub fn kick(&mut self) -> io::Result<()> {
        if self.pending == 0 {
            return Ok(());
        }
        // SAFETY: a send of no user buffer: the kernel takes the frames from the ring.
        let r = unsafe { libc::sendto(self.fd, std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN | libc::ENOBUFS | libc::EINTR) => Ok(()),
                _ => Err(io::Error::new(e.kind(), format!("TX ring send (sendto): {e}"))),
            };
        }
        self.pending = 0;
        Ok(())
    }

    /// Kick, then wait (at most `timeout`) until the kernel has finished
    /// with every slot.
    pub fn flush(&mut self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        self.kick()?;
        while (0..self.frames).any(|i| self.status(i).load(Ordering::Acquire) != libc::TP_STATUS_AVAILABLE) {
            if Instant::now() >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "TX ring: frames still unsent"));
            }
            self.kick()?;
            poll(self.fd, libc::POLLOUT, 10, "poll(POLLOUT) on the TX ring")?;
        }
        Ok(())
    }
}
