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
//! uses AF_PACKET's recvmmsg/sendmmsg. `mmap` and `mmap-v3` (mmap.rs; a
//! measurement of the PACKET_MMAP alternative only, blockwire's AoE does
//! not use it) are AF_PACKET with a receive and a transmit ring
//! (PACKET_QDISC_BYPASS on): frames are read and written in the rings in
//! place and sent a batch per `sendto` kick. `mmap` uses TPACKET_V2 rings:
//! every received frame is handed over on its own, no timer. `mmap-v3`
//! uses a TPACKET_V3 receive ring, which hands a block over only when it
//! is full or after its 1 ms retire timer: with small requests and a
//! window that cannot fill a block, every round trip waits for that timer
//! and the rate measures it (about WINDOW x 1000 pairs/s), not the rings.

mod mmap;

use bw_net::frames::{self, Chosen, Datapath};
use bw_net::{FrameBatch, FrameSocket, PacketSocket, XdpFilter};
use mmap::{MmapSocket, Version};
use std::io;
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

/// One socket of the kind asked for (AF_XDP: the first queue's).
fn open(iface: &str, datapath: Datapath) -> io::Result<FrameSocket> {
    match frames::choose(iface, ETHERTYPE, datapath, XdpFilter::default())? {
        Chosen::Xdp(s) => {
            let s = s.into_iter().next().expect("one socket per queue, at least one queue");
            eprintln!("frame_ceiling: AF_XDP on {iface} ({})", if s.zero_copy() { "zero-copy" } else { "copy mode" });
            Ok(FrameSocket::Xdp(Box::new(s)))
        }
        Chosen::Packet { .. } => {
            let s = PacketSocket::open(iface, ETHERTYPE)?;
            s.set_buffer_sizes(4 << 20, 4 << 20)?;
            Ok(FrameSocket::Packet(s))
        }
    }
}

fn respond(iface: &str, reply_bytes: usize, datapath: Datapath) -> io::Result<()> {
    let sock = open(iface, datapath)?;
    let mut rx = FrameBatch::new(BATCH, sock.mtu() + 18);
    let mut tx = FrameBatch::new(BATCH, reply_bytes.max(60));
    let me = sock.mac();
    let start = cpu_seconds();
    let mut pairs = 0u64;
    eprintln!("frame_ceiling: responding on {iface} with {reply_bytes}-byte frames");
    loop {
        let n = sock.recv_batch(&mut rx)?;
        let mut out = 0;
        for i in 0..n {
            let f = rx.frame(i);
            if f.len() > 14 && f[14] == STOP {
                println!("{{\"responder_cpu_s\": {:.3}, \"pairs\": {pairs}}}", cpu_seconds() - start);
                return Ok(());
            }
            let mut src = [0u8; 6];
            src.copy_from_slice(&f[6..12]);
            header(tx.slot_mut(out), src, me);
            tx.set_len(out, reply_bytes);
            out += 1;
        }
        pairs += sock.send_batch(&mut tx, out)? as u64;
    }
}

fn drive(iface: &str, seconds: f64, window: usize, datapath: Datapath) -> io::Result<()> {
    let sock = open(iface, datapath)?;
    sock.set_recv_timeout(Duration::from_millis(200))?;
    let mut rx = FrameBatch::new(BATCH, sock.mtu() + 18);
    let mut tx = FrameBatch::new(BATCH, 60);
    let me = sock.mac();
    for i in 0..BATCH {
        header(tx.slot_mut(i), [0xff; 6], me);
        tx.set_len(i, 60);
    }
    let start = Instant::now();
    let cpu0 = cpu_seconds();
    let deadline = start + Duration::from_secs_f64(seconds);
    let (mut inflight, mut pairs) = (0usize, 0u64);
    while Instant::now() < deadline {
        while inflight < window {
            let k = (window - inflight).min(BATCH);
            inflight += sock.send_batch(&mut tx, k)?;
        }
        match sock.recv_batch(&mut rx) {
            Ok(n) => {
                inflight -= n.min(inflight);
                pairs += n as u64;
            }
            // A lost frame shrinks the real window; refill it.
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => inflight = 0,
            Err(e) => return Err(e),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    tx.slot_mut(0)[14] = STOP;
    sock.send_batch(&mut tx, 1)?;
    println!("{{\"pairs_per_s\": {:.0}, \"driver_cpu_s\": {cpu:.3}, \"seconds\": {secs:.3}, \"window\": {window}}}", pairs as f64 / secs);
    Ok(())
}

/// `respond` over PACKET_MMAP rings: replies are written straight into
/// the TX ring from the received frames in the RX ring, one kick per
/// receive batch (V2: the ready frames in a row, V3: a block).
fn respond_mmap(iface: &str, reply_bytes: usize, version: Version) -> io::Result<()> {
    let mut sock = MmapSocket::open(iface, ETHERTYPE, version)?;
    if reply_bytes > sock.tx.max_frame() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{reply_bytes}-byte replies: TX ring slots hold {}", sock.tx.max_frame()),
        ));
    }
    let me = sock.mac();
    let MmapSocket { rx, tx, .. } = &mut sock;
    let start = cpu_seconds();
    let mut pairs = 0u64;
    eprintln!("frame_ceiling: responding on {iface} with {reply_bytes}-byte frames (PACKET_MMAP, {version:?} rings)");
    loop {
        rx.wait(None)?;
        let mut out = 0;
        let mut stop = false;
        for f in rx.frames() {
            if f.len() > 14 && f[14] == STOP {
                stop = true;
                break;
            }
            let mut src = [0u8; 6];
            src.copy_from_slice(&f[6..12]);
            let slot = tx.slot()?;
            header(slot, src, me);
            slot[14] = 0;
            tx.commit(reply_bytes);
            out += 1;
        }
        rx.release();
        if stop {
            println!("{{\"responder_cpu_s\": {:.3}, \"pairs\": {pairs}}}", cpu_seconds() - start);
            return Ok(());
        }
        tx.kick()?;
        pairs += out;
    }
}

/// `drive` over PACKET_MMAP rings: requests are written into the TX ring
/// and sent with one kick per batch; replies are counted in the RX ring.
fn drive_mmap(iface: &str, seconds: f64, window: usize, version: Version) -> io::Result<()> {
    let mut sock = MmapSocket::open(iface, ETHERTYPE, version)?;
    let me = sock.mac();
    let MmapSocket { rx, tx, .. } = &mut sock;
    let send = |tx: &mut mmap::TxRing, k: usize, first: u8| -> io::Result<usize> {
        for _ in 0..k {
            let slot = tx.slot()?;
            header(slot, [0xff; 6], me);
            slot[14] = first;
            tx.commit(60);
        }
        tx.kick()?;
        Ok(k)
    };
    let start = Instant::now();
    let cpu0 = cpu_seconds();
    let deadline = start + Duration::from_secs_f64(seconds);
    let (mut inflight, mut pairs) = (0usize, 0u64);
    while Instant::now() < deadline {
        while inflight < window {
            let k = (window - inflight).min(BATCH);
            inflight += send(tx, k, 0)?;
        }
        if rx.wait(Some(Duration::from_millis(200)))? {
            let n = rx.frames().count();
            rx.release();
            inflight -= n.min(inflight);
            pairs += n as u64;
        } else {
            // A lost frame shrinks the real window; refill it.
            inflight = 0;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    send(tx, 1, STOP)?;
    tx.flush(Duration::from_secs(1))?;
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
    let r = match (args.get(1).map(String::as_str), path) {
        (Some("respond"), Path::Frames(d)) if args.len() == 4 => respond(&args[2], args[3].parse().expect("REPLY_BYTES"), d),
        (Some("respond"), Path::Mmap(v)) if args.len() == 4 => respond_mmap(&args[2], args[3].parse().expect("REPLY_BYTES"), v),
        (Some("drive"), Path::Frames(d)) if args.len() == 5 => {
            drive(&args[2], args[3].parse().expect("SECONDS"), args[4].parse().expect("WINDOW"), d)
        }
        (Some("drive"), Path::Mmap(v)) if args.len() == 5 => {
            drive_mmap(&args[2], args[3].parse().expect("SECONDS"), args[4].parse().expect("WINDOW"), v)
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
