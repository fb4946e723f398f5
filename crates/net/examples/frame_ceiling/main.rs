//! The most request/reply frame pairs per second AF_PACKET (plain or with
//! PACKET_MMAP rings) or AF_XDP sockets can move over one link on this
//! machine, with nothing else done per frame: an upper bound for any
//! userspace AoE target and initiator pair (bench/aoe-ceiling).
//!
//! `frame_ceiling respond IFACE REPLY_BYTES [packet|mmap|mmap-v3|xdp]`:
//! answer every frame with a REPLY_BYTES frame to its sender (batched both
//! ways), until a stop frame comes; then print its CPU seconds.
//! `frame_ceiling drive IFACE SECONDS WINDOW [packet|mmap|mmap-v3|xdp]`:
//! keep WINDOW requests (60-byte frames) in flight, batched both ways, for
//! SECONDS; print one JSON line with pairs per second and the driver's CPU
//! seconds.
//!
//! `xdp` uses AF_XDP through the same batches the AoE target and initiator
//! use (one copy each way between the rings' memory and the batch), on the
//! interface's first receive queue (a veth has one); `packet` (the default)
//! uses AF_PACKET's recvmmsg/sendmmsg. `mmap` and `mmap-v3`
//! (bw_net::ring's rings, handled here in place, with no batch between)
//! are AF_PACKET with a receive and a transmit ring
//! (PACKET_QDISC_BYPASS on): frames are read and written in the rings in
//! place and sent a batch per `sendto` kick. `mmap` uses TPACKET_V2 rings:
//! every received frame is handed over on its own, no timer. `mmap-v3`
//! uses a TPACKET_V3 receive ring, which hands a block over only when it
//! is full or after its 1 ms retire timer: with small requests and a
//! window that cannot fill a block, every round trip waits for that timer
//! and the rate measures it (about WINDOW x 1000 pairs/s), not the rings.
//! AoE's `aoe_datapath = "mmap"` uses the TPACKET_V2 rings, through the
//! batches (bw_net::RingSocket: received frames copied into the batch).

use bw_net::frames::{self, Chosen, Datapath};
use bw_net::ring::{Rings, Version};
use bw_net::{FrameBatch, FrameSocket, PacketSocket, RingSocket, XdpFilter};
use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// An ethertype from the IEEE "local experimental" range, so no real
/// protocol handler (or AoE target) sees these frames.
const ETHERTYPE: u16 = 0x88B5;
const BATCH: usize = 64;
const STOP: u8 = 0xEE;

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills a plain struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn header(frame: &mut [u8], dst: [u8; 6], src: [u8; 6]) {
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    frame[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
}

/// What `respond` and `drive` need of a datapath: receive a batch, send
/// frames built in place.
trait Link {
    fn mac(&self) -> [u8; 6];
    /// The largest frame `send` can build.
    fn max_frame(&self) -> usize;
    /// Wait for frames (up to `timeout`, or for ever) and hand each to
    /// `each`; Ok(0) when none came in time.
    fn receive(&mut self, timeout: Option<Duration>, each: &mut dyn FnMut(&[u8])) -> io::Result<usize>;
    /// Send `count` frames; `build` writes each into the buffer it gets and
    /// returns its length.
    fn send(&mut self, count: usize, build: &mut dyn FnMut(&mut [u8]) -> usize) -> io::Result<usize>;
    /// Wait until what was sent has left (for the last frame before exit).
    fn flush(&mut self) -> io::Result<()>;
}

/// The product's sockets (bw_net::FrameSocket) with the batches the AoE
/// target and initiator use: received frames are copied into `rx`; frames
/// are built in AF_XDP's transmit slots, or in `tx` for AF_PACKET.
struct BatchLink {
    sock: FrameSocket,
    rx: FrameBatch,
    tx: FrameBatch,
    timeout: Option<Duration>,
}

impl BatchLink {
    /// One socket of the kind asked for (AF_XDP: the first queue's).
    fn open(iface: &str, datapath: Datapath) -> io::Result<Self> {
        let sock = match frames::choose(iface, ETHERTYPE, datapath, XdpFilter::default())? {
            Chosen::Xdp(s) => {
                let s = s.into_iter().next().expect("one socket per queue, at least one queue");
                eprintln!("frame_ceiling: AF_XDP on {iface} ({})", if s.zero_copy() { "zero-copy" } else { "copy mode" });
                FrameSocket::Xdp(Box::new(s))
            }
            Chosen::Mmap => FrameSocket::Mmap(Box::new(RingSocket::open(iface, ETHERTYPE)?)),
            Chosen::Packet { .. } => {
                let s = PacketSocket::open(iface, ETHERTYPE)?;
                s.set_buffer_sizes(4 << 20, 4 << 20)?;
                FrameSocket::Packet(s)
            }
        };
        let frame = sock.mtu() + 18;
        Ok(BatchLink { sock, rx: FrameBatch::new(BATCH, frame), tx: FrameBatch::new(BATCH, frame), timeout: None })
    }
}

impl Link for BatchLink {
    fn mac(&self) -> [u8; 6] {
        self.sock.mac()
    }
    fn max_frame(&self) -> usize {
        self.sock.mtu() + 14
    }
    fn receive(&mut self, timeout: Option<Duration>, each: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        // A socket option: set when it changes, not per call.
        if let Some(t) = timeout.filter(|&t| self.timeout != Some(t)) {
            self.sock.set_recv_timeout(t)?;
            self.timeout = Some(t);
        }
        match self.sock.recv_batch(&mut self.rx) {
            Ok(n) => {
                (0..n).for_each(|i| each(self.rx.frame(i)));
                Ok(n)
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Ok(0),
            Err(e) => Err(e),
        }
    }
    fn send(&mut self, count: usize, build: &mut dyn FnMut(&mut [u8]) -> usize) -> io::Result<usize> {
        let mut built = 0;
        self.sock.send_built(&mut self.tx, |buf| {
            (built < count).then(|| {
                built += 1;
                build(buf)
            })
        })
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// PACKET_MMAP rings: frames are read in the receive ring and built in
/// the transmit ring, in place; one kick per batch sent.
struct MmapLink {
    rings: Rings,
    sock: PacketSocket,
}

impl MmapLink {
    fn open(iface: &str, version: Version) -> io::Result<Self> {
        let sock = PacketSocket::open(iface, ETHERTYPE)?;
        let rings = Rings::attach(sock.as_raw_fd(), sock.mtu(), version)?;
        eprintln!("frame_ceiling: PACKET_MMAP ({version:?} rings) on {iface}");
        Ok(MmapLink { rings, sock })
    }
}

impl Link for MmapLink {
    fn mac(&self) -> [u8; 6] {
        self.sock.mac()
    }
    fn max_frame(&self) -> usize {
        self.rings.tx.max_frame()
    }
    fn receive(&mut self, timeout: Option<Duration>, each: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let rx = &mut self.rings.rx;
        if !rx.wait(timeout)? {
            return Ok(0);
        }
        let n = rx.frames().map(each).count();
        rx.release();
        Ok(n)
    }
    fn send(&mut self, count: usize, build: &mut dyn FnMut(&mut [u8]) -> usize) -> io::Result<usize> {
        let tx = &mut self.rings.tx;
        for _ in 0..count {
            let len = build(tx.slot()?);
            tx.commit(len);
        }
        tx.kick()?;
        Ok(count)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.rings.tx.flush(Duration::from_secs(1))
    }
}

/// Answer every frame with a `reply_bytes` frame to its sender until the
/// stop frame comes.
fn respond(iface: &str, reply_bytes: usize, mut link: impl Link) -> io::Result<()> {
    if reply_bytes > link.max_frame() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{reply_bytes}-byte replies: frames hold {}", link.max_frame())));
    }
    let me = link.mac();
    let start = cpu_seconds();
    let mut pairs = 0u64;
    let mut senders = Vec::with_capacity(BATCH);
    eprintln!("frame_ceiling: responding on {iface} with {reply_bytes}-byte frames");
    loop {
        let mut stop = false;
        senders.clear();
        link.receive(None, &mut |f| match f.get(14) {
            Some(&STOP) => stop = true,
            Some(_) => senders.push(<[u8; 6]>::try_from(&f[6..12]).expect("6 bytes")),
            None => {}
        })?;
        if stop {
            println!("{{\"responder_cpu_s\": {:.3}, \"pairs\": {pairs}}}", cpu_seconds() - start);
            return Ok(());
        }
        let mut next = senders.iter();
        pairs += link.send(senders.len(), &mut |buf| {
            header(buf, *next.next().expect("one reply per sender"), me);
            buf[14] = 0;
            reply_bytes
        })? as u64;
    }
}

/// Keep `window` 60-byte requests in flight for `seconds`; print the rate.
fn drive(seconds: f64, window: usize, mut link: impl Link) -> io::Result<()> {
    let me = link.mac();
    let request = |mark: u8| {
        move |buf: &mut [u8]| {
            header(buf, [0xff; 6], me);
            buf[14] = mark;
            60
        }
    };
    let start = Instant::now();
    let cpu0 = cpu_seconds();
    let deadline = start + Duration::from_secs_f64(seconds);
    let (mut inflight, mut pairs) = (0usize, 0u64);
    while Instant::now() < deadline {
        while inflight < window {
            let k = (window - inflight).min(BATCH);
            inflight += link.send(k, &mut request(0))?;
        }
        match link.receive(Some(Duration::from_millis(200)), &mut |_| {})? {
            // A lost frame shrinks the real window; refill it.
            0 => inflight = 0,
            n => {
                inflight -= n.min(inflight);
                pairs += n as u64;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    link.send(1, &mut request(STOP))?;
    link.flush()?;
    println!("{{\"pairs_per_s\": {:.0}, \"driver_cpu_s\": {cpu:.3}, \"seconds\": {secs:.3}, \"window\": {window}}}", pairs as f64 / secs);
    Ok(())
}

/// The datapath argument: the product's (bw_net::frames::Datapath) or this
/// example's own `mmap` (TPACKET_V2) and `mmap-v3`.
enum Path {
    Frames(Datapath),
    Mmap(Version),
}

fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    let path = match args.last().map(String::as_str) {
        Some("mmap") => {
            args.pop();
            Path::Mmap(Version::V2)
        }
        Some("mmap-v3") => {
            args.pop();
            Path::Mmap(Version::V3)
        }
        Some(a) => match a.parse::<Datapath>() {
            Ok(d) => {
                args.pop();
                Path::Frames(d)
            }
            Err(_) => Path::Frames(Datapath::Packet),
        },
        None => Path::Frames(Datapath::Packet),
    };
    let r = match (args.get(1).map(String::as_str), args.len()) {
        (Some("respond"), 4) => {
            let bytes = args[3].parse().expect("REPLY_BYTES");
            match path {
                Path::Frames(d) => BatchLink::open(&args[2], d).and_then(|l| respond(&args[2], bytes, l)),
                Path::Mmap(v) => MmapLink::open(&args[2], v).and_then(|l| respond(&args[2], bytes, l)),
            }
        }
        (Some("drive"), 5) => {
            let (secs, window) = (args[3].parse().expect("SECONDS"), args[4].parse().expect("WINDOW"));
            match path {
                Path::Frames(d) => BatchLink::open(&args[2], d).and_then(|l| drive(secs, window, l)),
                Path::Mmap(v) => MmapLink::open(&args[2], v).and_then(|l| drive(secs, window, l)),
            }
        }
        _ => {
            eprintln!("usage: frame_ceiling respond IFACE REPLY_BYTES [packet|mmap|mmap-v3|xdp] | drive IFACE SECONDS WINDOW [packet|mmap|mmap-v3|xdp]");
            std::process::exit(2);
        }
    };
    if let Err(e) = r {
        eprintln!("frame_ceiling: {e}");
        std::process::exit(1);
    }
}
