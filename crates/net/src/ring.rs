//! PACKET_MMAP: an AF_PACKET socket with a receive ring and a transmit
//! ring in one shared mapping, the receive ring first (the kernel's layout
//! when both are set; Documentation/networking/packet_mmap.rst). Frames are
//! read and built in the rings in place: no copy between the kernel and a
//! user buffer, and none into an skb on transmit (the kernel takes the
//! ring's pages as fragments). [`RingSocket`] is the datapath AoE uses
//! (`aoe_datapath = "mmap"`: TPACKET_V2); [`Rings`] alone serves the
//! frame-pair ceiling tool, which also measures TPACKET_V3.
//!
//! - TPACKET_V2: both rings are fixed-size frame slots with a
//!   tpacket2_hdr each. The kernel hands every received frame over on its
//!   own (tp_status TP_STATUS_USER); we walk the frames in order, take the
//!   run of ready ones as a batch and give each back (TP_STATUS_KERNEL).
//!   No timer is involved: a frame is ours as soon as it is written.
//! - TPACKET_V3: the kernel packs received frames into blocks
//!   and hands a block over (TP_STATUS_USER in its descriptor) when it is
//!   full or its retire timer (tp_retire_blk_tov) runs out; we walk its
//!   frames by tp_next_offset and give the block back. With small
//!   requests and a request/reply window that cannot fill a block, every
//!   round trip waits for that timer (see RX_RETIRE_MS).
//!
//! Transmit (both versions; tpacket2_hdr or tpacket3_hdr slots): frames
//! are written in place, marked TP_STATUS_SEND_REQUEST, and one
//! `sendto(fd, NULL, 0, MSG_DONTWAIT)` sends every marked frame; a slot is
//! free again once the kernel has set it back to TP_STATUS_AVAILABLE.
//! PACKET_QDISC_BYPASS is on. The structs and constants come from `libc`
//! (its copies of include/uapi/linux/if_packet.h).

use crate::packet::{wait_readable, FanoutMode, FrameBatch, InterfaceInfo, PacketSocket};
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The ring layout asked for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Version {
    /// TPACKET_V2: per-frame hand-over both ways.
    V2,
    /// TPACKET_V3: block receive ring (retire-timer bound), per-frame TX.
    V3,
}

impl Version {
    fn name(self) -> &'static str {
        match self {
            Version::V2 => "TPACKET_V2",
            Version::V3 => "TPACKET_V3",
        }
    }

    /// Where a slot's frame data (TX) or sockaddr_ll (RX) starts: the
    /// kernel's `po->tp_hdrlen - sizeof(struct sockaddr_ll)`, i.e. the
    /// frame header's size rounded up to TPACKET_ALIGNMENT
    /// (net/packet/af_packet.c, tpacket_parse_header, without
    /// PACKET_TX_HAS_OFF).
    fn hdr_aligned(self) -> usize {
        let hdrlen = match self {
            Version::V2 => libc::TPACKET2_HDRLEN,
            Version::V3 => libc::TPACKET3_HDRLEN,
        };
        hdrlen - mem::size_of::<libc::sockaddr_ll>()
    }

    /// Offset of tp_status in this version's frame header.
    fn status_offset(self) -> usize {
        match self {
            Version::V2 => mem::offset_of!(libc::tpacket2_hdr, tp_status),
            Version::V3 => mem::offset_of!(libc::tpacket3_hdr, tp_status),
        }
    }
}

/// TPACKET_V3 receive ring: 64 blocks of 256 KiB (28 MTU-9000 frames, or
/// thousands of small ones, per block), a block retired after 1 ms at the
/// latest. A request/reply window too small to fill a block therefore
/// waits for that timer every round trip (seen on veth: about WINDOW x
/// 1000 pairs/s with 60-byte requests); the timer, not the per-frame cost,
/// is then what the measured rate shows. TPACKET_V2 has no such timer.
const RX_V3_BLOCK_SIZE: usize = 256 << 10;
const RX_V3_BLOCK_NR: usize = 64;
const RX_RETIRE_MS: u32 = 1;
/// Blocks of the TPACKET_V2 receive ring and of both transmit rings:
/// 256 KiB (a multiple of the page size; frames never straddle blocks),
/// enough of them for this many frames.
const BLOCK_SIZE: usize = 256 << 10;
const RX_V2_FRAMES_MIN: usize = 1024;
const TX_FRAMES_MIN: usize = 512;
/// At most this many ready TPACKET_V2 frames make one receive batch (the
/// batch size of the other datapaths), so they go back to the kernel soon.
const RX_V2_BATCH_MAX: usize = 64;
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

/// Fixed-size slots laid out as the kernel lays out ring frames: `per_block`
/// slots of `size` bytes at the start of each `block_size` block, `count`
/// slots in all. (The V3 receive ring is walked a block at a time: one
/// block-sized slot per block.)
#[derive(Clone, Copy)]
struct Slots {
    base: *mut u8,
    block_size: usize,
    per_block: usize,
    size: usize,
    count: usize,
}

impl Slots {
    /// `min` slots of `size` bytes in BLOCK_SIZE blocks (the last block filled up).
    fn fixed(size: usize, min: usize) -> Slots {
        let per_block = BLOCK_SIZE / size;
        let count = min.div_ceil(per_block) * per_block;
        Slots { base: std::ptr::null_mut(), block_size: BLOCK_SIZE, per_block, size, count }
    }

    fn blocks(&self) -> usize {
        self.count / self.per_block
    }

    fn len(&self) -> usize {
        self.blocks() * self.block_size
    }

    fn ptr(&self, i: usize) -> *mut u8 {
        debug_assert!(i < self.count);
        // SAFETY: i < count, so the slot lies inside the ring's part of the
        // mapping (slots never straddle blocks; blocks follow each other).
        unsafe { self.base.add((i / self.per_block) * self.block_size + (i % self.per_block) * self.size) }
    }

    /// The u32 at `offset` in slot `i` (a tp_status or block_status).
    fn word(&self, i: usize, offset: usize) -> &AtomicU32 {
        // SAFETY: the status words are 4-byte-aligned u32s inside slot i, in
        // the mapping for as long as the ring that owns `self` lives; the
        // kernel and we hand slots over with release/acquire on them
        // (smp_wmb/smp_rmb on its side).
        unsafe { &*(self.ptr(i).add(offset) as *const AtomicU32) }
    }
}

/// PACKET_RX_RING or PACKET_TX_RING for `slots` (`frame_size`, `frame_nr`:
/// the kernel's per-frame view; for V3 receive, where `slots` are blocks).
fn set_ring(fd: RawFd, opt: libc::c_int, version: Version, slots: &Slots, frame_size: usize, retire_ms: u32, what: &str) -> io::Result<()> {
    let frame_nr = (slots.block_size / frame_size) * slots.blocks();
    match version {
        Version::V2 => {
            let req = libc::tpacket_req {
                tp_block_size: slots.block_size as u32,
                tp_block_nr: slots.blocks() as u32,
                tp_frame_size: frame_size as u32,
                tp_frame_nr: frame_nr as u32,
            };
            setsockopt(fd, libc::SOL_PACKET, opt, &req, what)
        }
        Version::V3 => {
            // The kernel rejects a retire timer, private area or feature
            // word on the TX ring: all zero there.
            let req = libc::tpacket_req3 {
                tp_block_size: slots.block_size as u32,
                tp_block_nr: slots.blocks() as u32,
                tp_frame_size: frame_size as u32,
                tp_frame_nr: frame_nr as u32,
                tp_retire_blk_tov: retire_ms,
                tp_sizeof_priv: 0,
                tp_feature_req_word: 0,
            };
            setsockopt(fd, libc::SOL_PACKET, opt, &req, what)
        }
    }
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

// SAFETY: the mapping is plain memory owned by whoever owns the Mapping.
unsafe impl Send for Mapping {}
// SAFETY: as above; the rings that point into it take care of access.
unsafe impl Sync for Mapping {}

/// A socket's receive and transmit rings and the mapping they live in.
pub struct Rings {
    pub rx: RxRing,
    pub tx: TxRing,
    map: Mapping,
}

impl Rings {
    /// Set up both rings on `raw`, an AF_PACKET socket with no ring yet,
    /// for frames of `mtu` bytes of payload, and map them.
    pub fn attach(raw: RawFd, mtu: usize, version: Version) -> io::Result<Rings> {
        let v = match version {
            Version::V2 => libc::tpacket_versions::TPACKET_V2,
            Version::V3 => libc::tpacket_versions::TPACKET_V3,
        } as libc::c_int;
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_VERSION, &v, &format!("PACKET_VERSION ({})", version.name()))?;
        // Receive frames: the kernel puts a frame's MAC header so that its
        // network header starts at TPACKET_ALIGN(hdrlen + 16), so a slot
        // holding that plus an MTU of payload takes a whole frame;
        // 2048-aligned (a multiple of TPACKET_ALIGNMENT).
        let hdrlen = version.hdr_aligned() + mem::size_of::<libc::sockaddr_ll>();
        let rx_frame = round_up(round_up(hdrlen + 16, libc::TPACKET_ALIGNMENT) + mtu, 2048);
        if rx_frame > BLOCK_SIZE.min(RX_V3_BLOCK_SIZE) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("MTU {mtu} too large for {BLOCK_SIZE}-byte ring blocks")));
        }
        let (rx_slots, retire) = match version {
            // One slot per frame.
            Version::V2 => (Slots::fixed(rx_frame, RX_V2_FRAMES_MIN), 0),
            // Frames packed into blocks at their real size; walked a block
            // at a time (tp_frame_size only bounds one frame).
            Version::V3 => (
                Slots {
                    base: std::ptr::null_mut(),
                    block_size: RX_V3_BLOCK_SIZE,
                    per_block: 1,
                    size: RX_V3_BLOCK_SIZE,
                    count: RX_V3_BLOCK_NR,
                },
                RX_RETIRE_MS,
            ),
        };
        set_ring(raw, libc::PACKET_RX_RING, version, &rx_slots, rx_frame, retire, "PACKET_RX_RING")?;

        // Transmit ring: fixed-size slots (frame header, data at
        // hdr_aligned: a frame of the MTU, VLAN tag included), in either
        // version.
        let tx_frame = round_up(version.hdr_aligned() + mtu + 18, libc::TPACKET_ALIGNMENT);
        let tx_slots = Slots::fixed(tx_frame, TX_FRAMES_MIN);
        set_ring(raw, libc::PACKET_TX_RING, version, &tx_slots, tx_frame, 0, "PACKET_TX_RING")?;

        let one: libc::c_int = 1;
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, &one, "PACKET_QDISC_BYPASS")?;
        // Best effort (Linux >= 4.20): our own transmissions are not input.
        let _ = setsockopt(raw, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &one, "PACKET_IGNORE_OUTGOING");
        // The send buffer still bounds the frames in flight out of the TX
        // ring; the same 4 MiB as the packet datapath (best effort).
        let buf: libc::c_int = 4 << 20;
        let _ = setsockopt(raw, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &buf, "SO_SNDBUFFORCE");

        let rx_len = rx_slots.len();
        let len = rx_len + tx_slots.len();
        // SAFETY: maps the socket's rings (RX then TX) into fresh memory
        // of exactly their combined size.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_POPULATE, raw, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(os_error("mmap of the RX and TX rings"));
        }
        let map = Mapping { ptr: p as *mut u8, len };

        // SAFETY: the TX ring starts right after the RX ring in the mapping.
        let tx_base = unsafe { map.ptr.add(rx_len) };
        Ok(Rings {
            rx: RxRing { fd: raw, version, slots: Slots { base: map.ptr, ..rx_slots }, cur: 0, ready: 0 },
            tx: TxRing { fd: raw, version, slots: Slots { base: tx_base, ..tx_slots }, head: 0, pending: 0 },
            map,
        })
    }
}

/// The receive ring, taken in order: frame slots (V2) or blocks (V3).
pub struct RxRing {
    fd: RawFd,
    version: Version,
    slots: Slots,
    /// The next slot (V2 frame or V3 block) to look at.
    cur: usize,
    /// Slots from `cur` that `wait` found ours and `release` gives back.
    ready: usize,
}

impl RxRing {
    fn status(&self, i: usize) -> &AtomicU32 {
        match self.version {
            Version::V2 => self.slots.word(i, Version::V2.status_offset()),
            Version::V3 => self.slots.word(i, BLOCK_STATUS),
        }
    }

    fn is_user(&self, i: usize) -> bool {
        self.status(i).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0
    }

    /// Whether the next frame (V2: up to `max` ready frames in a row) or
    /// block (V3) is ours, without waiting.
    fn gather(&mut self, max: usize) -> bool {
        if !self.is_user(self.cur) {
            return false;
        }
        self.ready = 1;
        if self.version == Version::V2 {
            let max = max.min(self.slots.count);
            while self.ready < max && self.is_user((self.cur + self.ready) % self.slots.count) {
                self.ready += 1;
            }
        }
        true
    }

    /// Wait until the next frame (V2: up to RX_V2_BATCH_MAX ready frames
    /// in a row) or block (V3) is ours, for at most `timeout` (None: for
    /// ever). Ok(false) when the time ran out.
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if self.gather(RX_V2_BATCH_MAX) {
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

    /// The frames `wait` returned true for (frames this host sent itself,
    /// should any show up, are left out).
    pub fn frames(&self) -> Frames<'_> {
        let (at, left) = match self.version {
            Version::V2 => (Walk::Slot(self.cur), self.ready),
            Version::V3 => {
                let b = self.slots.ptr(self.cur);
                // SAFETY: the block is ours (TP_STATUS_USER) until `release`,
                // which needs `&mut self`; its descriptor is a tpacket_block_desc.
                let h1 = unsafe { (*(b as *const libc::tpacket_block_desc)).hdr.bh1 };
                // SAFETY: offset_to_first_pkt lies inside the block.
                (Walk::Block(unsafe { b.add(h1.offset_to_first_pkt as usize) }), h1.num_pkts as usize)
            }
        };
        Frames { ring: self, at, left }
    }

    /// Give what `wait` found back to the kernel and move past it.
    pub fn release(&mut self) {
        for _ in 0..self.ready {
            self.status(self.cur).store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.cur = (self.cur + 1) % self.slots.count;
        }
        self.ready = 0;
    }
}

/// Where the next received frame's header is.
enum Walk {
    /// V2: the frame slot's index.
    Slot(usize),
    /// V3: a tpacket3_hdr inside the current block.
    Block(*const u8),
}

pub struct Frames<'a> {
    ring: &'a RxRing,
    at: Walk,
    left: usize,
}

impl<'a> Iterator for Frames<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let version = self.ring.version;
        while self.left > 0 {
            let p = match self.at {
                Walk::Slot(i) => self.ring.slots.ptr(i) as *const u8,
                Walk::Block(p) => p,
            };
            // SAFETY: `p` is a frame header of this version (TPACKET_ALIGNMENT-
            // aligned) that the kernel has handed over: a V2 slot or one of a
            // V3 block's num_pkts frames. Its sockaddr_ll follows at
            // hdr_aligned and its frame at tp_mac, tp_snaplen long, all inside
            // the slot or block, which stays ours while the ring is borrowed.
            let (frame, outgoing, next) = unsafe {
                let (mac, snaplen, next) = match version {
                    Version::V2 => {
                        let h = &*(p as *const libc::tpacket2_hdr);
                        (h.tp_mac, h.tp_snaplen, 0)
                    }
                    Version::V3 => {
                        let h = &*(p as *const libc::tpacket3_hdr);
                        (h.tp_mac, h.tp_snaplen, h.tp_next_offset as usize)
                    }
                };
                let ll = &*(p.add(version.hdr_aligned()) as *const libc::sockaddr_ll);
                (std::slice::from_raw_parts(p.add(mac as usize), snaplen as usize), ll.sll_pkttype == libc::PACKET_OUTGOING, next)
            };
            self.left -= 1;
            self.at = match self.at {
                Walk::Slot(i) => Walk::Slot((i + 1) % self.ring.slots.count),
                // SAFETY: the next header (unused past the last frame) is inside the block.
                Walk::Block(p) => Walk::Block(unsafe { p.add(next) }),
            };
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
    version: Version,
    slots: Slots,
    head: usize,
    /// Frames marked for sending since the last kick.
    pending: usize,
}

impl TxRing {
    fn status(&self, i: usize) -> &AtomicU32 {
        self.slots.word(i, self.version.status_offset())
    }

    /// The largest frame a slot holds.
    pub fn max_frame(&self) -> usize {
        self.slots.size - self.version.hdr_aligned()
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
        // needs `&mut self`; its data area is max_frame bytes from hdr_aligned.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.slots.ptr(self.head).add(self.version.hdr_aligned()), n) })
    }

    /// Queue the slot `slot` returned, its first `len` bytes a frame.
    pub fn commit(&mut self, len: usize) {
        assert!(len <= self.max_frame(), "frame of {len} bytes, TX slots hold {}", self.max_frame());
        let p = self.slots.ptr(self.head);
        // SAFETY: the slot is ours (see `slot`) and starts with this
        // version's frame header; plain field writes before the status
        // store below publishes them.
        unsafe {
            match self.version {
                Version::V2 => {
                    let h = p as *mut libc::tpacket2_hdr;
                    (*h).tp_len = len as u32;
                    (*h).tp_snaplen = len as u32;
                }
                Version::V3 => {
                    let h = p as *mut libc::tpacket3_hdr;
                    (*h).tp_len = len as u32;
                    (*h).tp_snaplen = len as u32;
                    (*h).tp_next_offset = 0;
                }
            }
        }
        self.status(self.head).store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
        self.head = (self.head + 1) % self.slots.count;
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
        while (0..self.slots.count).any(|i| self.status(i).load(Ordering::Acquire) != libc::TP_STATUS_AVAILABLE) {
            if Instant::now() >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "TX ring: frames still unsent"));
            }
            self.kick()?;
            poll(self.fd, libc::POLLOUT, 10, "poll(POLLOUT) on the TX ring")?;
        }
        Ok(())
    }
}

// SAFETY: the ring's pointers lead into the mapping of the socket that owns
// the ring (a Rings or a RingSocket), which outlives it; one thread at a
// time uses a ring (&mut self, or a RingSocket's lock).
unsafe impl Send for RxRing {}
// SAFETY: as for RxRing.
unsafe impl Send for TxRing {}

/// AF_PACKET with TPACKET_V2 rings, bound to one interface and EtherType,
/// with the [`PacketSocket`] methods the protocols use. Threads may share
/// it: each ring is taken under its own lock, and a blocking receive waits
/// outside the lock.
pub struct RingSocket {
    rx: Mutex<RxRing>,
    tx: Mutex<TxRing>,
    _map: Mapping,
    sock: PacketSocket,
    nonblocking: AtomicBool,
    /// poll() timeout of a blocking receive, in ms (-1: for ever).
    recv_timeout_ms: AtomicI32,
}

impl std::fmt::Debug for RingSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingSocket").field("sock", &self.sock).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl RingSocket {
    pub fn open(iface: &str, ethertype: u16) -> io::Result<Self> {
        let sock = PacketSocket::open(iface, ethertype)?;
        let rings = Rings::attach(sock.as_raw_fd(), sock.mtu(), Version::V2)?;
        // Frames that came between bind and the rings wait in the plain
        // receive queue, which nothing reads once the rings are there.
        let mut scratch = [0u8; 64];
        // SAFETY: a live buffer and its length; non-blocking, so this ends.
        while unsafe { libc::recv(sock.as_raw_fd(), scratch.as_mut_ptr() as *mut libc::c_void, scratch.len(), libc::MSG_DONTWAIT) } >= 0 {}
        Ok(RingSocket {
            rx: Mutex::new(rings.rx),
            tx: Mutex::new(rings.tx),
            _map: rings.map,
            sock,
            nonblocking: AtomicBool::new(false),
            recv_timeout_ms: AtomicI32::new(-1),
        })
    }

    pub fn info(&self) -> &InterfaceInfo {
        self.sock.info()
    }
    pub fn mac(&self) -> [u8; 6] {
        self.sock.mac()
    }
    pub fn mtu(&self) -> usize {
        self.sock.mtu()
    }
    /// Frames the receive ring holds.
    pub fn rx_capacity(&self) -> usize {
        lock(&self.rx).slots.count
    }
    pub fn join_fanout(&self, group: u16, mode: FanoutMode) -> io::Result<()> {
        self.sock.join_fanout(group, mode)
    }
    /// Frames received and frames dropped for want of a free ring slot,
    /// since the last call.
    pub fn take_statistics(&self) -> io::Result<(u64, u64)> {
        self.sock.take_statistics()
    }
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.nonblocking.store(on, Ordering::Relaxed);
        self.sock.set_nonblocking(on)
    }
    /// Blocking receives give up after this long (TimedOut).
    pub fn set_recv_timeout(&self, t: Duration) -> io::Result<()> {
        self.recv_timeout_ms.store(t.as_millis().clamp(1, i32::MAX as u128) as i32, Ordering::Relaxed);
        Ok(())
    }

    /// Hand up to `max` received frames to `each`, in order, and give
    /// their slots back; blocking sockets wait for the first (up to the
    /// receive timeout), non-blocking ones return WouldBlock.
    fn receive(&self, max: usize, mut each: impl FnMut(&[u8]) -> io::Result<()>) -> io::Result<usize> {
        loop {
            {
                let mut rx = lock(&self.rx);
                if rx.gather(max) {
                    // Every gathered slot goes back, whatever `each` says.
                    let handed = rx.frames().try_fold(0, |n, f| each(f).map(|()| n + 1));
                    rx.release();
                    match handed? {
                        // Only frames of our own: look again.
                        0 => continue,
                        n => return Ok(n),
                    }
                }
            }
            if self.nonblocking.load(Ordering::Relaxed) {
                return Err(io::Error::from(io::ErrorKind::WouldBlock));
            }
            match wait_readable(self.sock.as_raw_fd(), self.recv_timeout_ms.load(Ordering::Relaxed)) {
                // A signal: look at the ring again.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => r?,
            }
        }
    }

    /// Receive one frame into `buf`; returns its length (a longer frame is
    /// an error and is dropped, not cut).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut len = 0;
        self.receive(1, |f| {
            if f.len() > buf.len() {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {} bytes truncated to {}", f.len(), buf.len())));
            }
            buf[..f.len()].copy_from_slice(f);
            len = f.len();
            Ok(())
        })?;
        Ok(len)
    }

    /// Receive up to `batch.capacity()` frames, copied into the batch
    /// (frames longer than its slots are dropped and counted there).
    pub fn recv_batch(&self, batch: &mut FrameBatch) -> io::Result<usize> {
        batch.begin_fill();
        self.receive(batch.capacity(), |f| {
            match batch.next_fill_slot() {
                Some(slot) if f.len() <= slot.len() => {
                    slot[..f.len()].copy_from_slice(f);
                    batch.fill_done(f.len());
                }
                _ => batch.truncated += 1,
            }
            Ok(())
        })?;
        Ok(batch.len())
    }

    /// Send one frame (Ethernet header included).
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        let mut once = Some(frame);
        self.send_built(|slot| once.take().map(|f| copy_into(slot, f))).map(|_| ())
    }

    /// Send the first `count` frames of `batch`.
    pub fn send_batch(&self, batch: &mut FrameBatch, count: usize) -> io::Result<usize> {
        let mut i = 0;
        self.send_built(|slot| {
            (i < count).then(|| {
                i += 1;
                copy_into(slot, batch.built(i - 1))
            })
        })
    }

    /// Build frames straight in the transmit ring and send them with one
    /// kick: `build` writes one into the slot it gets and returns its
    /// length, or None when there are no more. Returns how many were sent.
    pub fn send_built(&self, mut build: impl FnMut(&mut [u8]) -> Option<usize>) -> io::Result<usize> {
        let mut tx = lock(&self.tx);
        let mut sent = 0;
        loop {
            let slot = tx.slot()?;
            match build(slot) {
                Some(len) => {
                    tx.commit(len);
                    sent += 1;
                }
                None => break,
            }
        }
        tx.kick()?;
        Ok(sent)
    }
}

/// Copy `frame` into a transmit slot; its length.
fn copy_into(slot: &mut [u8], frame: &[u8]) -> usize {
    slot[..frame.len()].copy_from_slice(frame);
    frame.len()
}

impl AsRawFd for RingSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}
