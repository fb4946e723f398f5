//! AF_XDP sockets: frames of one EtherType taken off an interface by an XDP
//! program before the kernel's network stack sees them, through rings shared
//! with the kernel instead of one syscall per batch.
//!
//! [`open`] gives one [`XdpSocket`] per receive queue of the interface. Each
//! has its own UMEM (the frame memory the kernel writes into and reads
//! from), split in two halves of 4 KiB chunks: receive chunks, which travel
//! fill ring -> kernel -> RX ring -> us -> fill ring, and transmit chunks,
//! which travel us -> TX ring -> kernel -> completion ring -> us, in slots
//! of contiguous chunks that hold a frame of the MTU. Received frames are
//! copied from the chunks into a [`FrameBatch`], so callers use the same
//! batches as with [`crate::PacketSocket`]; frames to send are copied from
//! one ([`XdpSocket::send_batch`]) or built straight in a transmit slot
//! ([`XdpSocket::send_built`], no copy: the AoE target's replies).
//!
//! The XDP program (bpf/xsk_redirect.bpf.c, embedded at build time and
//! loaded with aya) redirects the EtherType's frames that pass an optional
//! [`XdpFilter`] to the socket of their queue and passes everything else
//! on. The filter can ask for a key from the frame to be in a set the
//! caller changes while the program runs ([`XdpKeys`]): an AoE target
//! takes only requests for the shelf.slot pairs it exports, so other
//! targets on the interface keep theirs. It is attached with a BPF link owned by this process, so it goes
//! away with the last socket, or with the process, however it ends: nothing
//! is pinned. Native mode where the driver has it, generic otherwise, and
//! generic on veth: a veth's native XDP runs where its peer transmits,
//! which a tc program handing frames over with bpf_redirect_peer (as the
//! BPF router does) bypasses; generic XDP runs where the stack receives.
//!
//! The sockets are bound without forcing a mode, so the kernel uses
//! zero-copy where the driver offers it and copy mode elsewhere (veth, tap);
//! [`XdpSocket::zero_copy`] says which. Frames larger than a chunk (jumbo
//! MTUs) span several chunks (XDP_USE_SG, Linux 6.6+). Need-wakeup is on:
//! we only make the syscall that kicks the kernel when the ring says it
//! waits for one.

use crate::packet::{interface_info, wait_readable, FrameBatch, InterfaceInfo};
use aya::maps::{Array, HashMap, XskMap};
use aya::programs::{Xdp, XdpMode};
use aya::Ebpf;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The compiled program (empty when clang was missing at build time).
#[cfg(xdp_object)]
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xsk_redirect.bpf.o"));
#[cfg(not(xdp_object))]
static OBJECT: &[u8] = &[];
const PROGRAM: &str = "bw_xsk_redirect";
/// Entries of the program's socket map: queues we can serve.
const MAX_QUEUES: u32 = 64;
/// Entries of the program's key map (MAX_KEYS there).
pub const MAX_KEYS: usize = 4096;

// From <linux/if_xdp.h> (Debian 12's headers predate XDP_USE_SG and
// XDP_PKT_CONTD, so none of this is taken from libc).
const AF_XDP: libc::c_int = 44;
const SOL_XDP: libc::c_int = 283;
const XDP_MMAP_OFFSETS: libc::c_int = 1;
const XDP_RX_RING: libc::c_int = 2;
const XDP_TX_RING: libc::c_int = 3;
const XDP_UMEM_REG: libc::c_int = 4;
const XDP_UMEM_FILL_RING: libc::c_int = 5;
const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
const XDP_STATISTICS: libc::c_int = 7;
const XDP_OPTIONS: libc::c_int = 8;
const XDP_OPTIONS_ZEROCOPY: u32 = 1;
const XDP_COPY: u16 = 1 << 1;
const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
const XDP_USE_SG: u16 = 1 << 4;
const XDP_RING_NEED_WAKEUP: u32 = 1;
/// Descriptor option: the frame goes on in the next descriptor.
const XDP_PKT_CONTD: u32 = 1;
const XDP_PGOFF_RX_RING: libc::off_t = 0;
const XDP_PGOFF_TX_RING: libc::off_t = 0x8000_0000;
const XDP_UMEM_PGOFF_FILL_RING: libc::off_t = 0x1_0000_0000;
const XDP_UMEM_PGOFF_COMPLETION_RING: libc::off_t = 0x1_8000_0000;
/// Room the kernel keeps in front of a received frame in its chunk.
const XDP_PACKET_HEADROOM: usize = 256;
const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GCHANNELS: u32 = 0x3c;
const ETHTOOL_GDRVINFO: u32 = 0x03;

/// One UMEM chunk: a page, the largest aligned chunk without huge pages.
const CHUNK: usize = 4096;
/// Receive chunks (all on the fill ring when idle): at MTU 9000, three per
/// frame, so ~680 frames can wait for us.
const RX_CHUNKS: u32 = 2048;
/// Transmit chunks: more than a full batch of jumbo replies.
const TX_CHUNKS: u32 = 1024;
/// Copy mode sends at most this many descriptors per kick (TX_BATCH_SIZE).
const KERNEL_TX_BUDGET: usize = 32;
/// How long a blocking send waits for transmit chunks to come back.
const TX_WAIT: Duration = Duration::from_secs(1);

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RingOffset {
    producer: u64,
    consumer: u64,
    desc: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct MmapOffsets {
    rx: RingOffset,
    tx: RingOffset,
    fill: RingOffset,
    completion: RingOffset,
}

#[repr(C)]
struct UmemReg {
    addr: u64,
    len: u64,
    chunk_size: u32,
    headroom: u32,
    flags: u32,
    tx_metadata_len: u32,
}

#[repr(C)]
struct SockaddrXdp {
    family: u16,
    flags: u16,
    ifindex: u32,
    queue_id: u32,
    shared_umem_fd: u32,
}

/// A descriptor of the RX and TX rings.
#[repr(C)]
#[derive(Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    options: u32,
}

#[repr(C)]
#[derive(Default)]
struct XdpStatistics {
    rx_dropped: u64,
    rx_invalid_descs: u64,
    tx_invalid_descs: u64,
    rx_ring_full: u64,
    rx_fill_ring_empty_descs: u64,
    tx_ring_empty_descs: u64,
}

#[repr(C)]
#[derive(Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

/// Which frames of the EtherType the program takes (the rest go on to the
/// stack): `(field & mask) == value` for the byte at `byte.0` and the
/// big-endian 32-bit word at `word.0` (offsets from the Ethernet header,
/// below 64); with `key`, the big-endian word at `key.0` masked with
/// `key.1` must also be in the program's key set, which starts as `keys`
/// and changes through [`XdpKeys`]. `None` takes every frame. Laid out as
/// `struct filter` in xsk_redirect.bpf.c.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XdpFilter {
    pub byte: Option<(u16, u8, u8)>,
    pub word: Option<(u16, u32, u32)>,
    pub key: Option<(u16, u32)>,
    pub keys: Vec<u32>,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct FilterValue {
    ethertype: u16,
    byte_offset: u16,
    byte_mask: u8,
    byte_value: u8,
    word_offset: u16,
    word_mask: u32,
    word_value: u32,
    key_offset: u16,
    pad: u16,
    key_mask: u32,
}

// SAFETY: repr(C) plain data, 24 bytes without padding.
unsafe impl aya::Pod for FilterValue {}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn context(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A shared memory area the kernel also maps; unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize, fd: RawFd, offset: libc::off_t) -> io::Result<Mapping> {
        let (flags, fd) = if fd < 0 {
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE, -1)
        } else {
            (libc::MAP_SHARED | libc::MAP_POPULATE, fd)
        };
        // SAFETY: a fresh mapping; the kernel checks fd and offset.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, offset) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: ptr as *mut u8, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// One single-producer single-consumer ring shared with the kernel. We are
/// the producer of the fill and TX rings and the consumer of the RX and
/// completion rings. Indexes run freely and wrap; `size - 1` masks them
/// to an entry (sizes are powers of two).
struct Ring<T> {
    /// Holds the ring mapped (unmapped on drop).
    _mapping: Mapping,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    entries: *mut T,
    size: u32,
    /// Our copy of the index we own, and the last seen of the other side's.
    prod: u32,
    cons: u32,
}

impl<T: Copy> Ring<T> {
    fn map(fd: RawFd, off: &RingOffset, size: u32, pgoff: libc::off_t) -> io::Result<Ring<T>> {
        let map = Mapping::new(off.desc as usize + size as usize * mem::size_of::<T>(), fd, pgoff)?;
        let at = |o: u64| map.ptr.wrapping_add(o as usize);
        let (producer, consumer, flags) = (at(off.producer) as *const AtomicU32, at(off.consumer) as *const AtomicU32, at(off.flags) as *const AtomicU32);
        let entries = at(off.desc) as *mut T;
        // SAFETY: the offsets come from the kernel and lie inside the mapping.
        let (prod, cons) = unsafe { ((*producer).load(Ordering::Relaxed), (*consumer).load(Ordering::Relaxed)) };
        Ok(Ring { _mapping: map, producer, consumer, flags, entries, size, prod, cons })
    }

    fn slot(&self, index: u32) -> *mut T {
        // SAFETY: masked into the ring's entries.
        unsafe { self.entries.add((index & (self.size - 1)) as usize) }
    }

    /// Producer side: entries we may still write.
    fn free(&mut self) -> u32 {
        // SAFETY: a field of the mapped ring header.
        self.cons = unsafe { (*self.consumer).load(Ordering::Acquire) };
        self.size - self.prod.wrapping_sub(self.cons)
    }

    /// Producer side: write the `i`-th entry after those published.
    fn write(&mut self, i: u32, v: T) {
        // SAFETY: the caller checked `free`; the kernel does not read it yet.
        unsafe { self.slot(self.prod.wrapping_add(i)).write(v) }
    }

    /// Producer side: publish `n` written entries.
    fn submit(&mut self, n: u32) {
        self.prod = self.prod.wrapping_add(n);
        // SAFETY: as in `free`; Release orders the entries before the index.
        unsafe { (*self.producer).store(self.prod, Ordering::Release) }
    }

    /// Consumer side: entries ready for us.
    fn available(&mut self) -> u32 {
        // SAFETY: as in `free`.
        self.prod = unsafe { (*self.producer).load(Ordering::Acquire) };
        self.prod.wrapping_sub(self.cons)
    }

    /// Consumer side: the `i`-th ready entry.
    fn read(&self, i: u32) -> T {
        // SAFETY: below `available`, so the kernel wrote it and will not touch it.
        unsafe { self.slot(self.cons.wrapping_add(i)).read() }
    }

    /// Consumer side: hand `n` entries back.
    fn release(&mut self, n: u32) {
        self.cons = self.cons.wrapping_add(n);
        // SAFETY: as in `free`.
        unsafe { (*self.consumer).store(self.cons, Ordering::Release) }
    }

    /// Does the kernel wait for a syscall to look at this ring?
    fn needs_wakeup(&self) -> bool {
        // SAFETY: as in `free`.
        unsafe { (*self.flags).load(Ordering::Relaxed) & XDP_RING_NEED_WAKEUP != 0 }
    }

    /// Has the kernel taken everything we published?
    fn drained(&self) -> bool {
        // SAFETY: as in `free`.
        unsafe { (*self.consumer).load(Ordering::Acquire) == self.prod }
    }
}

/// The receive side: the RX ring and the fill ring that feeds it.
struct RxSide {
    rx: Ring<Desc>,
    fill: Ring<u64>,
}

/// The transmit side: the TX ring, the completion ring and the transmit
/// slots neither ring holds. A slot is `slot_chunks` contiguous chunks,
/// room for one frame of the interface's MTU, so a frame can be built in
/// place ([`XdpSocket::send_built`]) even where it spans chunks; each chunk
/// it uses goes out as one descriptor, and the slot is free again once the
/// kernel has completed them all.
struct TxSide {
    tx: Ring<Desc>,
    completion: Ring<u64>,
    slot_chunks: usize,
    /// Free slots, by the address of their first chunk.
    free: Vec<u64>,
    /// Per slot: its descriptors not yet completed.
    pending: Vec<u8>,
}

// SAFETY: the raw pointers point into mappings owned by the same value,
// which moves with it; the kernel side is synchronised by the ring indexes.
unsafe impl Send for RxSide {}
// SAFETY: as above.
unsafe impl Send for TxSide {}

impl TxSide {
    fn new(tx: Ring<Desc>, completion: Ring<u64>, slot_chunks: usize) -> TxSide {
        let slots = TX_CHUNKS as usize / slot_chunks;
        let free = (0..slots).rev().map(|i| (RX_CHUNKS as usize + i * slot_chunks) as u64 * CHUNK as u64).collect();
        TxSide { tx, completion, slot_chunks, free, pending: vec![0; slots] }
    }

    fn slot_of(&self, addr: u64) -> usize {
        (addr as usize / CHUNK - RX_CHUNKS as usize) / self.slot_chunks
    }

    /// Take back the slots whose chunks the kernel has all sent.
    fn reclaim(&mut self) {
        let n = self.completion.available();
        for i in 0..n {
            let slot = self.slot_of(self.completion.read(i));
            self.pending[slot] -= 1;
            if self.pending[slot] == 0 {
                self.free.push((RX_CHUNKS as usize + slot * self.slot_chunks) as u64 * CHUNK as u64);
            }
        }
        self.completion.release(n);
    }

    /// Put a frame of `len` bytes in the slot at `base` on the TX ring (not
    /// yet published: `queued` descriptors are ahead of it); returns the
    /// descriptors it took. The TX ring has an entry for every transmit
    /// chunk, so it has room for those of a slot we hold.
    fn queue(&mut self, base: u64, len: usize, queued: u32) -> u32 {
        let need = len.div_ceil(CHUNK).max(1);
        debug_assert!(need <= self.slot_chunks && self.tx.free() as usize >= queued as usize + need);
        for k in 0..need {
            let piece = (len - k * CHUNK).min(CHUNK);
            let options = if k + 1 < need { XDP_PKT_CONTD } else { 0 };
            self.tx.write(queued + k as u32, Desc { addr: base + (k * CHUNK) as u64, len: piece as u32, options });
        }
        let slot = self.slot_of(base);
        self.pending[slot] = need as u8;
        need as u32
    }
}

/// The loaded, attached program: detached when the last socket holding it
/// goes (its link belongs to this process).
struct Program {
    ebpf: Mutex<Ebpf>,
    native: bool,
}

fn map_error(e: aya::maps::MapError) -> io::Error {
    io::Error::other(format!("XDP program map: {e}"))
}

/// The key set of the program behind one [`open`]'s sockets
/// ([`XdpFilter::key`]): a frame is taken only while its key is in it.
/// Holding it keeps the program attached.
#[derive(Clone)]
pub struct XdpKeys {
    program: Arc<Program>,
}

impl std::fmt::Debug for XdpKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpKeys").finish_non_exhaustive()
    }
}

impl XdpKeys {
    /// Make the set exactly `keys` (at most [`MAX_KEYS`]).
    pub fn set(&self, keys: &[u32]) -> io::Result<()> {
        let mut ebpf = lock(&self.program.ebpf);
        set_keys(&mut ebpf, keys)
    }

    /// The keys in the set, sorted.
    pub fn get(&self) -> io::Result<Vec<u32>> {
        let ebpf = lock(&self.program.ebpf);
        let map: HashMap<_, u32, u8> = HashMap::try_from(ebpf.map("keys").ok_or_else(|| io::Error::other("XDP program has no keys map"))?).map_err(map_error)?;
        let mut keys = map.keys().collect::<Result<Vec<_>, _>>().map_err(map_error)?;
        keys.sort_unstable();
        Ok(keys)
    }
}

/// Put the keys of `keys` that are missing into the program's key map and
/// take out the others: a key that stays is never absent in between.
fn set_keys(ebpf: &mut Ebpf, keys: &[u32]) -> io::Result<()> {
    if keys.len() > MAX_KEYS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} XDP keys: at most {MAX_KEYS}", keys.len())));
    }
    let mut map: HashMap<_, u32, u8> = HashMap::try_from(ebpf.map_mut("keys").ok_or_else(|| io::Error::other("XDP program has no keys map"))?).map_err(map_error)?;
    let old = map.keys().collect::<Result<Vec<_>, _>>().map_err(map_error)?;
    for k in old.iter().filter(|k| !keys.contains(k)) {
        map.remove(k).map_err(map_error)?;
    }
    for k in keys.iter().filter(|k| !old.contains(k)) {
        map.insert(k, 1, 0).map_err(map_error)?;
    }
    Ok(())
}

/// An AF_XDP socket on one receive queue of an interface. Methods take
/// `&self`: receiving and sending each lock their own side, so one thread
/// may receive while others send.
pub struct XdpSocket {
    fd: OwnedFd,
    rx: Mutex<RxSide>,
    tx: Mutex<TxSide>,
    umem: Mapping,
    info: InterfaceInfo,
    ethertype: u16,
    queue: u32,
    zero_copy: bool,
    nonblocking: AtomicBool,
    /// poll() timeout of a blocking receive, in ms (-1: forever).
    recv_timeout_ms: AtomicI32,
    received: AtomicU64,
    last_dropped: AtomicU64,
    program: Arc<Program>,
}

// SAFETY: the UMEM mapping is only written through the rings' protocol:
// receive chunks under the rx lock, transmit chunks under the tx lock.
unsafe impl Send for XdpSocket {}
// SAFETY: as above.
unsafe impl Sync for XdpSocket {}

impl std::fmt::Debug for XdpSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpSocket").field("interface", &self.info.name).field("queue", &self.queue).field("zero_copy", &self.zero_copy).finish()
    }
}

/// Is the AF_XDP program built into this binary?
pub fn available() -> bool {
    !OBJECT.is_empty()
}

/// The compiled XDP program (ELF), for tests that occupy an interface's XDP
/// hook with it; empty when it was not built.
pub fn program_object() -> &'static [u8] {
    OBJECT
}

/// `struct ethtool_drvinfo`: the driver's name first.
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    rest: [u8; 192],
}

/// An ethtool request on `iface`: `T` starts with its command word, which
/// the kernel reads and answers in place.
fn ethtool<T>(iface: &str, request: &mut T) -> io::Result<()> {
    #[repr(C)]
    struct IfReqPtr {
        name: [u8; 16],
        data: *mut libc::c_void,
        _pad: [u8; 16],
    }
    // SAFETY: plain socket creation; owned below.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fresh fd.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut r = IfReqPtr { name: [0; 16], data: request as *mut T as *mut libc::c_void, _pad: [0; 16] };
    let n = iface.len().min(15);
    r.name[..n].copy_from_slice(&iface.as_bytes()[..n]);
    // SAFETY: SIOCETHTOOL reads the name and the command, and writes at most
    // size_of::<T>() bytes (the command's struct) through the pointer.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), SIOCETHTOOL as _, &mut r as *mut IfReqPtr) }).map(|_| ())
}

/// Receive queues of `iface` (ETHTOOL_GCHANNELS; 1 if the driver does not say).
fn queue_count(iface: &str) -> u32 {
    let mut ch = EthtoolChannels { cmd: ETHTOOL_GCHANNELS, ..Default::default() };
    match ethtool(iface, &mut ch) {
        Ok(()) => ch.rx_count.max(ch.combined_count).max(1),
        Err(_) => 1,
    }
}

/// The name of `iface`'s driver ("veth", "tun", "virtio_net", ...), if it says.
fn driver(iface: &str) -> Option<String> {
    let mut d = EthtoolDrvinfo { cmd: ETHTOOL_GDRVINFO, driver: [0; 32], rest: [0; 192] };
    ethtool(iface, &mut d).ok()?;
    let end = d.driver.iter().position(|&b| b == 0).unwrap_or(d.driver.len());
    Some(String::from_utf8_lossy(&d.driver[..end]).into_owned())
}

fn setsockopt<T>(fd: RawFd, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: pointer to a live value with its size.
    cvt(unsafe { libc::setsockopt(fd, SOL_XDP, name, v as *const T as *const libc::c_void, mem::size_of::<T>() as u32) }).map(|_| ())
}

fn getsockopt<T: Default>(fd: RawFd, name: libc::c_int) -> io::Result<T> {
    let mut v = T::default();
    let mut len = mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: pointer to a live value and its length.
    cvt(unsafe { libc::getsockopt(fd, SOL_XDP, name, &mut v as *mut T as *mut libc::c_void, &mut len) })?;
    Ok(v)
}

/// Open one socket per receive queue of `iface` for frames of `ethertype`
/// that pass `filter`, and attach the program that steers them there.
/// Fails (nothing left attached) where AF_XDP cannot be used: no program
/// built in, no permission, the interface's XDP hook taken by another
/// program, a kernel without AF_XDP.
pub fn open(iface: &str, ethertype: u16, filter: XdpFilter) -> io::Result<Vec<XdpSocket>> {
    if OBJECT.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this blockwire was built without the AF_XDP program (clang or libbpf-dev missing at build time)",
        ));
    }
    let info = interface_info(iface)?;
    let queues = queue_count(iface);
    if queues > MAX_QUEUES {
        return Err(io::Error::new(io::ErrorKind::Unsupported, format!("{iface} has {queues} receive queues; AF_XDP here serves at most {MAX_QUEUES}")));
    }
    let mut ebpf = Ebpf::load(OBJECT).map_err(|e| io::Error::other(format!("loading the XDP program: {e}")))?;
    let value = FilterValue {
        ethertype,
        byte_offset: filter.byte.map_or(0, |b| b.0),
        byte_mask: filter.byte.map_or(0, |b| b.1),
        byte_value: filter.byte.map_or(0, |b| b.2),
        word_offset: filter.word.map_or(0, |w| w.0),
        word_mask: filter.word.map_or(0, |w| w.1),
        word_value: filter.word.map_or(0, |w| w.2),
        key_offset: filter.key.map_or(0, |k| k.0),
        pad: 0,
        key_mask: filter.key.map_or(0, |k| k.1),
    };
    let map_err = map_error;
    set_keys(&mut ebpf, &filter.keys)?;
    let mut table: Array<_, FilterValue> = Array::try_from(ebpf.map_mut("filter").ok_or_else(|| io::Error::other("XDP program has no filter map"))?).map_err(map_err)?;
    table.set(0, value, 0).map_err(map_err)?;
    let mut opened = Vec::new();
    for q in 0..queues {
        opened.push(Opened::new(&info, q).map_err(context(format!("AF_XDP socket on {iface} queue {q}")))?);
    }
    let mut sockets: XskMap<_> = XskMap::try_from(ebpf.map_mut("sockets").ok_or_else(|| io::Error::other("XDP program has no sockets map"))?).map_err(map_err)?;
    for o in &opened {
        sockets.set(o.queue, o.fd.as_raw_fd(), 0).map_err(map_err)?;
    }
    let program: &mut Xdp = ebpf
        .program_mut(PROGRAM)
        .ok_or_else(|| io::Error::other("XDP program missing from its object"))?
        .try_into()
        .map_err(|e| io::Error::other(format!("XDP program: {e}")))?;
    program.load().map_err(|e| io::Error::other(format!("loading the XDP program: {e}")))?;
    // Native mode where the driver has it (most NICs, tap), else generic;
    // generic on veth (see the top of this file). A hook already taken
    // fails both.
    let veth = driver(iface).as_deref() == Some("veth");
    let native_err = if veth {
        "not tried on veth".to_string()
    } else {
        match program.attach(iface, XdpMode::Driver) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    };
    let native = native_err.is_empty();
    if !native {
        if let Err(e) = program.attach(iface, XdpMode::Skb) {
            return Err(io::Error::other(format!("attaching XDP to {iface}: {e} (native mode: {native_err})")));
        }
    }
    let program = Arc::new(Program { ebpf: Mutex::new(ebpf), native });
    Ok(opened
        .into_iter()
        .map(|o| XdpSocket {
            fd: o.fd,
            rx: Mutex::new(o.rx),
            tx: Mutex::new(o.tx),
            umem: o.umem,
            info: info.clone(),
            ethertype,
            queue: o.queue,
            zero_copy: o.zero_copy,
            nonblocking: AtomicBool::new(false),
            recv_timeout_ms: AtomicI32::new(-1),
            received: AtomicU64::new(0),
            last_dropped: AtomicU64::new(0),
            program: program.clone(),
        })
        .collect())
}

/// A bound socket before the program is attached.
struct Opened {
    fd: OwnedFd,
    rx: RxSide,
    tx: TxSide,
    umem: Mapping,
    queue: u32,
    zero_copy: bool,
}

impl Opened {
    fn new(info: &InterfaceInfo, queue: u32) -> io::Result<Opened> {
        // VLAN-tagged frames can be 4 bytes longer than MTU + 14.
        let multi_buffer = info.mtu + 18 > CHUNK - XDP_PACKET_HEADROOM;
        // Zero-copy (or copy mode where the driver has none: the kernel
        // falls back by itself when no mode is forced); if the bind still
        // fails, copy mode explicitly, on a fresh socket.
        match Opened::bind(info, queue, multi_buffer, 0) {
            Ok(o) => Ok(o),
            Err(_) => Opened::bind(info, queue, multi_buffer, XDP_COPY),
        }
    }

    fn bind(info: &InterfaceInfo, queue: u32, multi_buffer: bool, mode: u16) -> io::Result<Opened> {
        // SAFETY: plain socket creation.
        let fd = cvt(unsafe { libc::socket(AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) }).map_err(context("AF_XDP socket (needs root or CAP_NET_RAW, and a kernel with AF_XDP)"))?;
        // SAFETY: fresh fd.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        let chunks = (RX_CHUNKS + TX_CHUNKS) as usize;
        let umem = Mapping::new(chunks * CHUNK, -1, 0).map_err(context("UMEM"))?;
        let reg = UmemReg { addr: umem.ptr as u64, len: (chunks * CHUNK) as u64, chunk_size: CHUNK as u32, headroom: 0, flags: 0, tx_metadata_len: 0 };
        setsockopt(raw, XDP_UMEM_REG, &reg).map_err(context("XDP_UMEM_REG"))?;
        for (opt, size) in [(XDP_UMEM_FILL_RING, RX_CHUNKS), (XDP_UMEM_COMPLETION_RING, TX_CHUNKS), (XDP_RX_RING, RX_CHUNKS), (XDP_TX_RING, TX_CHUNKS)] {
            setsockopt(raw, opt, &(size as libc::c_int)).map_err(context("ring size"))?;
        }
        let off: MmapOffsets = getsockopt(raw, XDP_MMAP_OFFSETS).map_err(context("XDP_MMAP_OFFSETS"))?;
        let mut rx = RxSide {
            rx: Ring::map(raw, &off.rx, RX_CHUNKS, XDP_PGOFF_RX_RING)?,
            fill: Ring::map(raw, &off.fill, RX_CHUNKS, XDP_UMEM_PGOFF_FILL_RING)?,
        };
        let tx = TxSide::new(
            Ring::map(raw, &off.tx, TX_CHUNKS, XDP_PGOFF_TX_RING)?,
            Ring::map(raw, &off.completion, TX_CHUNKS, XDP_UMEM_PGOFF_COMPLETION_RING)?,
            if multi_buffer { (info.mtu + 18).div_ceil(CHUNK) } else { 1 },
        );
        // Every receive chunk starts on the fill ring.
        for c in 0..RX_CHUNKS {
            rx.fill.write(c, c as u64 * CHUNK as u64);
        }
        rx.fill.submit(RX_CHUNKS);
        let flags = mode | XDP_USE_NEED_WAKEUP | if multi_buffer { XDP_USE_SG } else { 0 };
        let sa = SockaddrXdp { family: AF_XDP as u16, flags, ifindex: info.index as u32, queue_id: queue, shared_umem_fd: 0 };
        // SAFETY: sa is a valid sockaddr_xdp of the given size.
        cvt(unsafe { libc::bind(raw, &sa as *const _ as *const libc::sockaddr, mem::size_of::<SockaddrXdp>() as u32) }).map_err(context("bind"))?;
        let zero_copy = getsockopt::<u32>(raw, XDP_OPTIONS).is_ok_and(|o| o & XDP_OPTIONS_ZEROCOPY != 0);
        Ok(Opened { fd, rx, tx, umem, queue, zero_copy })
    }
}

impl XdpSocket {
    pub fn info(&self) -> &InterfaceInfo {
        &self.info
    }
    pub fn mac(&self) -> [u8; 6] {
        self.info.mac
    }
    pub fn mtu(&self) -> usize {
        self.info.mtu
    }
    pub fn ethertype(&self) -> u16 {
        self.ethertype
    }
    /// The receive queue this socket serves.
    pub fn queue(&self) -> u32 {
        self.queue
    }
    /// The driver moves frames in and out of our memory itself (otherwise
    /// the kernel copies them: copy mode).
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }
    /// The program runs in the driver (native XDP) rather than on socket
    /// buffers (generic XDP).
    pub fn native(&self) -> bool {
        self.program.native
    }
    /// The key set of the program (shared by the sockets of one [`open`]).
    pub fn keys(&self) -> XdpKeys {
        XdpKeys { program: self.program.clone() }
    }
    /// Receive chunks: how many frames of the interface's MTU can wait for us.
    pub fn rx_capacity(&self) -> usize {
        RX_CHUNKS as usize / (self.info.mtu + 18).div_ceil(CHUNK - XDP_PACKET_HEADROOM)
    }

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.nonblocking.store(on, Ordering::Relaxed);
        let fd = self.fd.as_raw_fd();
        // SAFETY: fcntl on our own fd (poll readiness is what async callers use).
        let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
        let flags = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
        // SAFETY: as above.
        cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) }).map(|_| ())
    }

    /// Blocking receives give up after this long (TimedOut).
    pub fn set_recv_timeout(&self, t: Duration) -> io::Result<()> {
        self.recv_timeout_ms.store(t.as_millis().clamp(1, i32::MAX as u128) as i32, Ordering::Relaxed);
        Ok(())
    }

    /// Frames received and frames the kernel dropped for want of room
    /// (receive chunks or RX ring) since the last call.
    pub fn take_statistics(&self) -> io::Result<(u64, u64)> {
        let st: XdpStatistics = getsockopt(self.fd.as_raw_fd(), XDP_STATISTICS)?;
        let dropped = st.rx_dropped + st.rx_ring_full;
        let before = self.last_dropped.swap(dropped, Ordering::Relaxed);
        Ok((self.received.swap(0, Ordering::Relaxed), dropped.saturating_sub(before)))
    }

    /// Receive up to `batch.capacity()` frames, copied into the batch.
    /// Blocking sockets wait for the first frame (up to the receive
    /// timeout); non-blocking ones return WouldBlock when none is ready.
    pub fn recv_batch(&self, batch: &mut FrameBatch) -> io::Result<usize> {
        loop {
            let n = self.take_frames(batch);
            if n > 0 {
                self.received.fetch_add(n as u64, Ordering::Relaxed);
                return Ok(n);
            }
            if self.nonblocking.load(Ordering::Relaxed) {
                return Err(io::Error::from(io::ErrorKind::WouldBlock));
            }
            wait_readable(self.fd.as_raw_fd(), self.recv_timeout_ms.load(Ordering::Relaxed))?;
        }
    }

    /// Move whole frames from the RX ring into `batch`; their chunks go
    /// back on the fill ring at once.
    fn take_frames(&self, batch: &mut FrameBatch) -> usize {
        let mut side = lock(&self.rx);
        let RxSide { rx, fill } = &mut *side;
        batch.begin_fill();
        let avail = rx.available();
        let mut used = 0;
        while used < avail {
            // One frame: descriptors up to the first without XDP_PKT_CONTD.
            let mut end = used;
            let mut len = 0usize;
            let mut whole = false;
            while end < avail {
                let d = rx.read(end);
                end += 1;
                len += d.len as usize;
                if d.options & XDP_PKT_CONTD == 0 {
                    whole = true;
                    break;
                }
            }
            if !whole {
                break; // the kernel publishes frames whole; never seen, but safe
            }
            let Some(slot) = batch.next_fill_slot() else { break };
            if len <= slot.len() {
                let mut at = 0;
                for i in used..end {
                    let d = rx.read(i);
                    // SAFETY: the kernel handed this descriptor's bytes to us
                    // (inside the UMEM: it validates addresses it writes).
                    let src = unsafe { std::slice::from_raw_parts(self.umem.ptr.add(d.addr as usize), d.len as usize) };
                    slot[at..at + src.len()].copy_from_slice(src);
                    at += src.len();
                }
                batch.fill_done(len);
            } else {
                batch.truncated += 1;
            }
            used = end;
        }
        // The fill ring holds every receive chunk, so there is room for these.
        let room = fill.free();
        let give = used.min(room);
        for i in 0..give {
            let chunk = rx.read(i).addr & !(CHUNK as u64 - 1);
            fill.write(i, chunk);
        }
        fill.submit(give);
        rx.release(used);
        if give > 0 && fill.needs_wakeup() {
            // Zero-copy drivers wait for this before they fill again.
            // SAFETY: a zero-length recvfrom on our own fd.
            unsafe { libc::recvfrom(self.fd.as_raw_fd(), std::ptr::null_mut(), 0, libc::MSG_DONTWAIT, std::ptr::null_mut(), std::ptr::null_mut()) };
        }
        batch.len()
    }

    /// Receive one frame into `buf`; returns its length.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut one = FrameBatch::new(1, buf.len());
        self.recv_batch(&mut one)?;
        let f = one.frame(0);
        buf[..f.len()].copy_from_slice(f);
        Ok(f.len())
    }

    /// Send one frame (Ethernet header included).
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        self.send_frames(&[frame]).map(|_| ())
    }

    /// Send frames `0..count` of `batch`: copied into transmit chunks, put
    /// on the TX ring, one kick. Returns how many went out; a non-blocking
    /// socket stops early when transmit chunks run out (WouldBlock if none
    /// went), a blocking one waits for them up to a second.
    pub fn send_batch(&self, batch: &mut FrameBatch, count: usize) -> io::Result<usize> {
        let count = count.min(batch.capacity());
        let frames: Vec<&[u8]> = (0..count).map(|i| batch.built(i)).collect();
        self.send_frames(&frames)
    }

    fn send_frames(&self, frames: &[&[u8]]) -> io::Result<usize> {
        let room = lock(&self.tx).slot_chunks * CHUNK;
        if let Some(f) = frames.iter().find(|f| f.len() > room) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("frame of {} bytes is more than an AF_XDP transmit slot ({room})", f.len())));
        }
        let mut side = lock(&self.tx);
        side.reclaim();
        let started = Instant::now();
        let mut sent = 0;
        let mut queued = 0u32;
        while sent < frames.len() {
            let Some(base) = side.free.pop() else {
                // Out of slots: send what is queued, take back what went out.
                side.tx.submit(queued);
                queued = 0;
                if !self.wait_for_slot(&mut side, started)? {
                    return if sent > 0 { Ok(sent) } else { Err(io::Error::from(io::ErrorKind::WouldBlock)) };
                }
                continue;
            };
            let f = frames[sent];
            // SAFETY: a free slot (neither ring holds its chunks) of
            // slot_chunks contiguous chunks inside the UMEM: ours until
            // published; the length was checked above.
            unsafe { std::ptr::copy_nonoverlapping(f.as_ptr(), self.umem.ptr.add(base as usize), f.len()) };
            queued += side.queue(base, f.len(), queued);
            sent += 1;
        }
        side.tx.submit(queued);
        self.kick(&mut side)?;
        Ok(sent)
    }

    /// With no free slot: kick the kernel and take back what it sent; then
    /// Ok(true) if a slot is free, Ok(false) for a non-blocking socket
    /// without one, and a blocking one waits up to [`TX_WAIT`] from `started`.
    fn wait_for_slot(&self, side: &mut MutexGuard<'_, TxSide>, started: Instant) -> io::Result<bool> {
        loop {
            self.kick(side)?;
            side.reclaim();
            if !side.free.is_empty() {
                return Ok(true);
            }
            if self.nonblocking.load(Ordering::Relaxed) {
                return Ok(false);
            }
            if started.elapsed() > TX_WAIT {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "AF_XDP transmit chunks did not come back within a second"));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Build frames straight in transmit slots and send them, without the
    /// copy [`XdpSocket::send_batch`] makes: `build` writes one frame into
    /// the buffer it gets (room for a frame of the MTU, VLAN tag included)
    /// and returns its length, or None when there are no more. `build` runs
    /// without the socket's locks (it may wait for a disk while other
    /// threads send); the frames go out with one kick at the end. Returns
    /// how many were sent; a non-blocking socket out of slots stops there.
    pub fn send_built(&self, mut build: impl FnMut(&mut [u8]) -> Option<usize>) -> io::Result<usize> {
        let started = Instant::now();
        let mut sent = 0;
        loop {
            let (base, room) = {
                let mut side = lock(&self.tx);
                if side.free.is_empty() {
                    side.reclaim();
                }
                if side.free.is_empty() && !self.wait_for_slot(&mut side, started)? {
                    break;
                }
                (side.free.pop().expect("checked above"), side.slot_chunks * CHUNK)
            };
            // SAFETY: the slot is ours alone (off the free list, on no ring)
            // until queued below: `room` bytes inside the UMEM.
            let buf = unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.add(base as usize), room) };
            let built = build(buf);
            let mut side = lock(&self.tx);
            match built {
                Some(len) => {
                    let n = side.queue(base, len.min(room), 0);
                    side.tx.submit(n);
                    sent += 1;
                }
                None => {
                    side.free.push(base);
                    break;
                }
            }
        }
        if sent > 0 {
            self.kick(&mut lock(&self.tx))?;
        }
        Ok(sent)
    }

    /// Make the kernel send what is on the TX ring. Copy mode sends at most
    /// [`KERNEL_TX_BUDGET`] descriptors per call, so call until it is drained.
    fn kick(&self, side: &mut TxSide) -> io::Result<()> {
        let pending = (side.tx.size - side.tx.free()) as usize;
        for _ in 0..pending / KERNEL_TX_BUDGET + 2 {
            if side.tx.drained() || !side.tx.needs_wakeup() {
                return Ok(());
            }
            // SAFETY: a zero-length sendto on our own fd.
            let r = unsafe { libc::sendto(self.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    // Busy (another thread sends), out of buffers, or more to do: go on.
                    Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::ENOBUFS) | Some(libc::EINTR) => {}
                    _ => return Err(e),
                }
            }
        }
        Ok(())
    }
}

impl AsRawFd for XdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run `f` on a thread of its own in a fresh network namespace (a
    /// thread's namespace is its own), with its loopback up; None without
    /// the privileges for that.
    fn in_new_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        std::thread::spawn(move || {
            // SAFETY: unshare affects only this thread, which ends with the test.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return None;
            }
            #[repr(C)]
            struct IfReqFlags {
                name: [u8; 16],
                flags: libc::c_short,
                _pad: [u8; 22],
            }
            // SAFETY: plain socket and ioctls on a live ifreq.
            unsafe {
                let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
                let mut r = IfReqFlags { name: [0; 16], flags: 0, _pad: [0; 22] };
                r.name[..2].copy_from_slice(b"lo");
                libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut r);
                r.flags |= libc::IFF_UP as libc::c_short;
                libc::ioctl(fd, libc::SIOCSIFFLAGS, &mut r);
                libc::close(fd);
            }
            Some(f())
        })
        .join()
        .expect("test thread")
    }

    /// Frames sent through the TX ring on loopback come back through the
    /// program to the RX ring, small ones and ones spanning several chunks
    /// (lo's MTU is 64 KiB); frames failing the byte match or carrying a
    /// key not in the set pass to AF_PACKET, and a change of the key set
    /// takes effect at once.
    #[test]
    fn frames_round_trip_through_the_rings_on_loopback() {
        if !available() || !crate::have_raw_socket_permission() {
            eprintln!("skipping: no AF_XDP program built in, or no CAP_NET_RAW");
            return;
        }
        let ran = in_new_netns(|| {
            const ET: u16 = 0x88B6; // IEEE local experimental 2
            // Key: bytes 16..19 (the last masked off).
            let filter = XdpFilter { byte: Some((14, 0xF0, 0x10)), word: None, key: Some((16, 0xFFFF_FF00)), keys: vec![0x0001_0200] };
            let socks = open("lo", ET, filter).expect("AF_XDP on lo");
            assert_eq!(socks.len(), 1);
            let s = &socks[0];
            assert!(!s.native(), "lo has no native XDP: generic");
            assert_eq!(s.keys().get().unwrap(), [0x0001_0200]);
            s.set_recv_timeout(Duration::from_secs(2)).unwrap();
            let passed = crate::PacketSocket::open("lo", ET).unwrap();
            passed.set_recv_timeout(Duration::from_secs(2)).unwrap();
            let mut out = FrameBatch::new(5, 9100);
            for (i, len) in [60usize, 1514, 9014, 60, 60].into_iter().enumerate() {
                let f = out.slot_mut(i);
                f[..12].fill(0);
                f[12..14].copy_from_slice(&ET.to_be_bytes());
                // Frame 3 fails the byte match: it goes to the stack.
                f[14] = if i == 3 { 0x20 } else { 0x10 };
                for (k, b) in f[15..len].iter_mut().enumerate() {
                    *b = (k * 7 + i) as u8;
                }
                // Frame 4's key is not in the set: to the stack too.
                f[16..19].copy_from_slice(if i == 4 { &[0, 1, 3] } else { &[0, 1, 2] });
                out.set_len(i, len);
            }
            assert_eq!(s.send_batch(&mut out, 5).unwrap(), 5);
            let mut got = Vec::new();
            let mut inb = FrameBatch::new(8, 9100);
            while got.len() < 3 {
                let n = s.recv_batch(&mut inb).expect("frames back");
                got.extend((0..n).map(|i| inb.frame(i).to_vec()));
            }
            assert_eq!(got.len(), 3);
            for (i, f) in got.iter().enumerate() {
                assert_eq!(f.as_slice(), out.built(i), "frame {i}");
            }
            let mut buf = vec![0u8; 200];
            for i in [3, 4] {
                let n = passed.recv(&mut buf).expect("an unmatched frame reaches AF_PACKET");
                assert_eq!(&buf[..n], out.built(i), "frame {i}");
            }
            assert_eq!(s.take_statistics().unwrap(), (3, 0));

            // Swap the key set: frame 4 is taken now, frame 0 passed on.
            s.keys().set(&[0x0001_0300]).unwrap();
            assert_eq!(s.keys().get().unwrap(), [0x0001_0300]);
            s.send(out.built(0)).unwrap();
            s.send(out.built(4)).unwrap();
            let n = s.recv(&mut buf).expect("frame 4 through AF_XDP");
            assert_eq!(&buf[..n], out.built(4));
            let n = passed.recv(&mut buf).expect("frame 0 through AF_PACKET");
            assert_eq!(&buf[..n], out.built(0));

            // Frames built in place, one of them spanning three chunks.
            s.keys().set(&[0x0001_0200, 0x0001_0300]).unwrap();
            let mut next = [2, 4].into_iter();
            let sent = s.send_built(|b| {
                let f = out.built(next.next()?);
                b[..f.len()].copy_from_slice(f);
                Some(f.len())
            });
            assert_eq!(sent.unwrap(), 2);
            let mut got = Vec::new();
            while got.len() < 2 {
                let n = s.recv_batch(&mut inb).expect("built frames back");
                got.extend((0..n).map(|i| inb.frame(i).to_vec()));
            }
            assert_eq!((got[0].as_slice(), got[1].as_slice()), (out.built(2), out.built(4)));
        });
        if ran.is_none() {
            eprintln!("skipping: cannot make a network namespace");
        }
    }
}
