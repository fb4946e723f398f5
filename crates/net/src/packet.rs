//! AF_PACKET raw socket bound to an interface and an EtherType.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Facts about a network interface, read with ioctls on a socket (so they
/// are right for the caller's network namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceInfo {
    pub name: String,
    pub index: i32,
    pub mtu: usize,
    pub mac: [u8; 6],
}

// setsockopt names and values from <linux/if_packet.h>, not all in libc.
const PACKET_FANOUT: libc::c_int = 18;
const PACKET_STATISTICS: libc::c_int = 6;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const PACKET_FANOUT_FLAG_ROLLOVER: u32 = 0x1000;

/// How a fanout group spreads frames over its sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanoutMode {
    /// Round robin (AoE requests are independent, so order does not matter).
    LoadBalance,
    /// By the CPU that received the frame.
    Cpu,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Wait up to `timeout_ms` (-1: for ever) for `fd` to be readable:
/// TimedOut when the time runs out, the OS error (EINTR included) if poll
/// fails. For sockets whose frames arrive in memory shared with the kernel
/// (AF_XDP and PACKET_MMAP rings), which wait with poll, not a receive call.
pub(crate) fn wait_readable(fd: RawFd, timeout_ms: i32) -> io::Result<()> {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one live pollfd.
    match cvt(unsafe { libc::poll(&mut p, 1, timeout_ms) })? {
        0 => Err(io::Error::from(io::ErrorKind::TimedOut)),
        _ => Ok(()),
    }
}

/// `struct ifreq`: 16-byte name then a 24-byte union.
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    data: [u8; 24],
}

fn ifreq(name: &str) -> io::Result<IfReq> {
    if name.is_empty() || name.len() >= 16 || name.contains('\0') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("invalid interface name {name:?}")));
    }
    let mut r = IfReq { name: [0; 16], data: [0; 24] };
    r.name[..name.len()].copy_from_slice(name.as_bytes());
    Ok(r)
}

fn ioctl_ifreq(fd: RawFd, req: libc::c_ulong, name: &str) -> io::Result<IfReq> {
    let mut r = ifreq(name)?;
    // SAFETY: the ioctls used here read the name and write at most 24 bytes of union.
    cvt(unsafe { libc::ioctl(fd, req as _, &mut r as *mut IfReq) }).map_err(|e| {
        io::Error::new(e.kind(), format!("interface {name}: {e}"))
    })?;
    Ok(r)
}

fn interface_info_fd(fd: RawFd, name: &str) -> io::Result<InterfaceInfo> {
    let idx = ioctl_ifreq(fd, libc::SIOCGIFINDEX, name)?;
    let index = i32::from_ne_bytes([idx.data[0], idx.data[1], idx.data[2], idx.data[3]]);
    let m = ioctl_ifreq(fd, libc::SIOCGIFMTU, name)?;
    let mtu = i32::from_ne_bytes([m.data[0], m.data[1], m.data[2], m.data[3]]);
    let hw = ioctl_ifreq(fd, libc::SIOCGIFHWADDR, name)?;
    // sockaddr: 2-byte family, then the address bytes.
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&hw.data[2..8]);
    Ok(InterfaceInfo { name: name.to_string(), index, mtu: mtu.max(0) as usize, mac })
}

/// Look up an interface's index, MTU and MAC.
pub fn interface_info(name: &str) -> io::Result<InterfaceInfo> {
    // SAFETY: plain socket creation; the fd is owned below.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fresh fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    interface_info_fd(fd.as_raw_fd(), name)
}

/// A raw Ethernet socket bound to one interface and EtherType. Frames
/// include the 14-byte Ethernet header.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    info: InterfaceInfo,
    ethertype: u16,
}

impl PacketSocket {
    /// Open and bind. Frames this host sends are not looped back to it.
    pub fn open(ifname: &str, ethertype: u16) -> io::Result<Self> {
        // Protocol 0 at creation: no frames queue up before bind() picks the
        // interface and the EtherType.
        // SAFETY: plain socket creation.
        let fd = cvt(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })
            .map_err(|e| io::Error::new(e.kind(), format!("AF_PACKET socket (needs root or CAP_NET_RAW): {e}")))?;
        // SAFETY: fresh fd.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let info = interface_info_fd(fd.as_raw_fd(), ifname)?;
        // SAFETY: sockaddr_ll is plain data; zero is a valid starting value.
        let mut sll: libc::sockaddr_ll = unsafe { mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ethertype.to_be();
        sll.sll_ifindex = info.index;
        // SAFETY: sll is a valid sockaddr_ll of the given size.
        cvt(unsafe {
            libc::bind(fd.as_raw_fd(), &sll as *const _ as *const libc::sockaddr, mem::size_of::<libc::sockaddr_ll>() as u32)
        })
        .map_err(|e| io::Error::new(e.kind(), format!("bind AF_PACKET to {ifname}: {e}")))?;
        let s = PacketSocket { fd, info, ethertype };
        // Best effort (Linux >= 4.20): our own transmissions are not input.
        let _ = s.setsockopt_int(libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1);
        Ok(s)
    }

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
    /// Re-read the interface MTU (it may change while we run).
    pub fn refresh_mtu(&mut self) -> io::Result<usize> {
        self.info = interface_info_fd(self.fd.as_raw_fd(), &self.info.name)?;
        Ok(self.info.mtu)
    }

    fn setsockopt_int(&self, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
        // SAFETY: pointer to a live c_int with its size.
        cvt(unsafe {
            libc::setsockopt(self.fd.as_raw_fd(), level, name, &v as *const _ as *const libc::c_void, mem::size_of::<libc::c_int>() as u32)
        })
        .map(|_| ())
    }

    fn getsockopt_int(&self, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
        let mut v: libc::c_int = 0;
        let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: pointer to a live c_int and its length.
        cvt(unsafe { libc::getsockopt(self.fd.as_raw_fd(), level, name, &mut v as *mut _ as *mut libc::c_void, &mut len) })?;
        Ok(v)
    }

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        let fd = self.fd.as_raw_fd();
        // SAFETY: fcntl on our own fd.
        let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
        let flags = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
        // SAFETY: as above.
        cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) }).map(|_| ())
    }

    /// Blocking receives give up after this long (so worker loops can check
    /// for shutdown).
    pub fn set_recv_timeout(&self, t: Duration) -> io::Result<()> {
        let tv = libc::timeval { tv_sec: t.as_secs() as libc::time_t, tv_usec: t.subsec_micros() as libc::suseconds_t };
        // SAFETY: pointer to a live timeval with its size.
        cvt(unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                mem::size_of::<libc::timeval>() as u32,
            )
        })
        .map(|_| ())
    }

    /// Ask for kernel socket buffers of these sizes (forcing past the sysctl
    /// limits when we have CAP_NET_ADMIN); returns the receive buffer size
    /// the kernel really granted.
    pub fn set_buffer_sizes(&self, rcv: usize, snd: usize) -> io::Result<usize> {
        let rcv = rcv.min(i32::MAX as usize / 2) as libc::c_int;
        let snd = snd.min(i32::MAX as usize / 2) as libc::c_int;
        if self.setsockopt_int(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, rcv).is_err() {
            self.setsockopt_int(libc::SOL_SOCKET, libc::SO_RCVBUF, rcv)?;
        }
        if self.setsockopt_int(libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, snd).is_err() {
            self.setsockopt_int(libc::SOL_SOCKET, libc::SO_SNDBUF, snd)?;
        }
        Ok(self.getsockopt_int(libc::SOL_SOCKET, libc::SO_RCVBUF)? as usize)
    }

    /// Join fanout group `group` (all sockets of a group must be bound the
    /// same way). With rollover, a full socket hands frames to the next one.
    pub fn join_fanout(&self, group: u16, mode: FanoutMode) -> io::Result<()> {
        let m: u32 = match mode {
            FanoutMode::LoadBalance => 1,
            FanoutMode::Cpu => 2,
        } | PACKET_FANOUT_FLAG_ROLLOVER;
        let v = (group as u32) | (m << 16);
        self.setsockopt_int(libc::SOL_PACKET, PACKET_FANOUT, v as libc::c_int)
    }

    /// Frames received and frames the kernel dropped because this socket's
    /// receive buffer was full, since the last call (PACKET_STATISTICS).
    pub fn take_statistics(&self) -> io::Result<(u64, u64)> {
        let mut st = [0u32; 2]; // struct tpacket_stats { tp_packets, tp_drops }
        let mut len = mem::size_of_val(&st) as libc::socklen_t;
        // SAFETY: pointer to a live 8-byte buffer and its length.
        cvt(unsafe {
            libc::getsockopt(self.fd.as_raw_fd(), libc::SOL_PACKET, PACKET_STATISTICS, st.as_mut_ptr() as *mut libc::c_void, &mut len)
        })?;
        Ok((st[0] as u64, st[1] as u64))
    }

    /// Send one frame (Ethernet header included).
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: pointer and length of a live slice.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr() as *const libc::c_void, frame.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Receive one frame into `buf`; returns its length (frames longer than
    /// `buf` are an error, not silently cut).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: pointer and length of a live mutable slice.
        let n = unsafe {
            libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), libc::MSG_TRUNC)
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n > buf.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {n} bytes truncated to {}", buf.len())));
        }
        Ok(n)
    }

    /// Receive up to `batch.capacity()` frames with one syscall. Blocking
    /// sockets wait for the first frame only. Returns the number received;
    /// frames are `batch.frame(i)`. Frames that did not fit are dropped from
    /// the batch (counted in `batch.truncated`).
    pub fn recv_batch(&self, batch: &mut FrameBatch) -> io::Result<usize> {
        batch.prepare_recv();
        // SAFETY: the mmsghdr array and everything it points to live in `batch`.
        let n = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                batch.hdrs.as_mut_ptr(),
                batch.hdrs.len() as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            batch.count = 0;
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        // Compact: keep only whole frames.
        let mut kept = 0;
        for i in 0..n {
            let len = batch.hdrs[i].msg_len as usize;
            if batch.hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0 || len > batch.frame_size {
                batch.truncated += 1;
                continue;
            }
            batch.lens[i] = len;
            batch.order[kept] = i as u16;
            kept += 1;
        }
        batch.count = kept;
        Ok(kept)
    }

    /// Send frames `0..count` of `batch` (lengths set with
    /// [`FrameBatch::set_len`]) with as few syscalls as possible. Returns
    /// how many went out; a full socket buffer on a non-blocking socket
    /// stops early with the count so far (or WouldBlock if none).
    pub fn send_batch(&self, batch: &mut FrameBatch, count: usize) -> io::Result<usize> {
        let count = count.min(batch.hdrs.len());
        batch.prepare_send(count);
        let mut sent = 0;
        while sent < count {
            // SAFETY: as in recv_batch.
            let n = unsafe {
                libc::sendmmsg(self.fd.as_raw_fd(), batch.hdrs[sent..].as_mut_ptr(), (count - sent) as u32, 0)
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                if sent > 0 && e.kind() == io::ErrorKind::WouldBlock {
                    return Ok(sent);
                }
                return Err(e);
            }
            sent += n as usize;
        }
        Ok(sent)
    }
}

impl AsRawFd for PacketSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Preallocated frames plus the `mmsghdr`/`iovec` arrays that point into
/// them: no allocation per frame or per batch.
pub struct FrameBatch {
    frame_size: usize,
    data: Vec<u8>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    lens: Vec<usize>,
    /// Received frame i of the batch is slot `order[i]` (truncated ones skipped).
    order: Vec<u16>,
    count: usize,
    /// Frames dropped because they were longer than `frame_size`.
    pub truncated: u64,
}

// SAFETY: the raw pointers in iovs/hdrs only point into this struct's own
// heap buffers; moving the struct between threads moves them together.
unsafe impl Send for FrameBatch {}

impl FrameBatch {
    /// `capacity` frames of up to `frame_size` bytes each (at most 65535).
    pub fn new(capacity: usize, frame_size: usize) -> Self {
        let capacity = capacity.clamp(1, u16::MAX as usize);
        let mut data = vec![0u8; capacity * frame_size];
        let base = data.as_mut_ptr();
        let mut iovs: Vec<libc::iovec> = (0..capacity)
            // SAFETY: each offset is within `data`.
            .map(|i| libc::iovec { iov_base: unsafe { base.add(i * frame_size) } as *mut libc::c_void, iov_len: frame_size })
            .collect();
        let iov_base = iovs.as_mut_ptr();
        let hdrs = (0..capacity)
            .map(|i| {
                // SAFETY: mmsghdr is plain data; zero is valid.
                let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
                // SAFETY: i < capacity = iovs.len().
                h.msg_hdr.msg_iov = unsafe { iov_base.add(i) };
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        FrameBatch {
            frame_size,
            data,
            iovs,
            hdrs,
            lens: vec![0; capacity],
            order: vec![0; capacity],
            count: 0,
            truncated: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.hdrs.len()
    }
    pub fn frame_size(&self) -> usize {
        self.frame_size
    }
    /// Frames received by the last [`PacketSocket::recv_batch`].
    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Received frame `i` (0..len()).
    pub fn frame(&self, i: usize) -> &[u8] {
        let slot = self.order[i] as usize;
        &self.data[slot * self.frame_size..slot * self.frame_size + self.lens[slot]]
    }

    /// The whole buffer of slot `i`, to build a frame to send.
    pub fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.data[i * self.frame_size..(i + 1) * self.frame_size]
    }

    /// Length of the frame built in slot `i`.
    pub fn set_len(&mut self, i: usize, len: usize) {
        self.lens[i] = len.min(self.frame_size);
    }

    /// The length last given to [`FrameBatch::set_len`] for slot `i`.
    pub fn built_len(&self, i: usize) -> usize {
        self.lens[i]
    }

    /// Start filling the batch by copying frames in (AF_XDP receives).
    pub(crate) fn begin_fill(&mut self) {
        self.count = 0;
    }

    /// Room for the next received frame, if the batch has any left.
    pub(crate) fn next_fill_slot(&mut self) -> Option<&mut [u8]> {
        let i = self.count;
        (i < self.capacity()).then(|| &mut self.data[i * self.frame_size..(i + 1) * self.frame_size])
    }

    /// The frame of `len` bytes copied into [`FrameBatch::next_fill_slot`] is complete.
    pub(crate) fn fill_done(&mut self, len: usize) {
        let i = self.count;
        self.lens[i] = len;
        self.order[i] = i as u16;
        self.count += 1;
    }

    /// Frame `i` built for sending (its length given with [`FrameBatch::set_len`]).
    pub(crate) fn built(&self, i: usize) -> &[u8] {
        &self.data[i * self.frame_size..i * self.frame_size + self.lens[i]]
    }

    fn prepare_recv(&mut self) {
        for (iov, h) in self.iovs.iter_mut().zip(self.hdrs.iter_mut()) {
            iov.iov_len = self.frame_size;
            h.msg_len = 0;
            h.msg_hdr.msg_flags = 0;
        }
        self.count = 0;
    }

    fn prepare_send(&mut self, count: usize) {
        for i in 0..count {
            self.iovs[i].iov_len = self.lens[i];
            self.hdrs[i].msg_hdr.msg_flags = 0;
        }
    }
}

/// Is this process allowed to open packet sockets? (Tests skip without it.)
pub fn have_raw_socket_permission() -> bool {
    // SAFETY: plain socket creation, closed right away.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return false;
    }
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_info_is_readable() {
        let i = interface_info("lo").unwrap();
        assert!(i.index > 0);
        assert!(i.mtu >= 1500);
        assert!(interface_info("no-such-if0").is_err());
        assert!(interface_info("this-name-is-far-too-long").is_err());
    }

    #[test]
    fn batch_slots_are_disjoint() {
        let mut b = FrameBatch::new(4, 100);
        b.slot_mut(1)[0] = 7;
        b.set_len(1, 60);
        assert_eq!(b.slot_mut(0)[0], 0);
        assert_eq!(b.capacity(), 4);
        assert_eq!(b.lens[1], 60);
    }

    /// Frames sent in a batch on loopback come back in a batch (root only).
    #[test]
    fn batched_send_and_receive_on_loopback() {
        if !have_raw_socket_permission() {
            eprintln!("skipping: no CAP_NET_RAW");
            return;
        }
        let et = 0x88B5; // IEEE local experimental EtherType: nothing else uses it
        let rx = PacketSocket::open("lo", et).unwrap();
        rx.set_recv_timeout(Duration::from_secs(2)).unwrap();
        let tx = PacketSocket::open("lo", et).unwrap();
        let mut out = FrameBatch::new(8, 128);
        for i in 0..8 {
            let s = out.slot_mut(i);
            s[..12].fill(0);
            s[12..14].copy_from_slice(&et.to_be_bytes());
            s[14] = i as u8;
            s[15] = std::process::id() as u8;
            out.set_len(i, 60);
        }
        assert_eq!(tx.send_batch(&mut out, 8).unwrap(), 8);
        let mut inb = FrameBatch::new(16, 128);
        let mut seen = vec![];
        while seen.len() < 8 {
            let n = rx.recv_batch(&mut inb).unwrap();
            for i in 0..n {
                let f = inb.frame(i);
                assert_eq!(f.len(), 60);
                if f[15] == std::process::id() as u8 {
                    seen.push(f[14]);
                }
            }
        }
        seen.sort();
        assert_eq!(seen, (0..8).collect::<Vec<u8>>());
    }
}
