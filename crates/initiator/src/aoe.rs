//! The userspace AoE initiator: `aoe://IFACE/SHELF.SLOT`.
//!
//! - Connect: a Query Config to the broadcast MAC for our shelf.slot finds
//!   the target's MAC, buffer count and sectors per frame; IDENTIFY gives
//!   the size.
//! - Window, retransmit timers and tags are decided by `bw_aoe::flow`
//!   (no sockets, time passed in); this file carries its decisions out.
//! - Every request occupies one of up to [`MAX_WINDOW`] slots. A window
//!   (a semaphore) bounds the frames in flight: it starts at half the
//!   target's buffer count (capped at 64), halves on every timeout and
//!   grows by one after a window's worth of clean replies.
//! - Timeouts come from the measured round trip (`2*avg + 8*dev`, 250 ms
//!   before the first sample); each retransmit gets a fresh tag so a late
//!   reply to an old attempt is never mistaken for the new one.
//! - A receiver task drains the socket in batches and hands each reply to
//!   the slot its tag names (slot index in the tag's low byte).
//! - Requests are queued, and a sender task sends everything queued with one
//!   `sendmmsg` after the tasks woken by a batch of replies have all queued
//!   their next request: one syscall per batch instead of one per frame.
//! - Large I/O is split into frames of the negotiated sector count and
//!   all its frames go out concurrently.
//! - Frames move through AF_XDP sockets where they can be set up
//!   (`ConnectOptions::aoe_datapath`, `auto` by default), the XDP program
//!   taking only replies from our target that carry this client's tag
//!   prefix, so other clients on the interface keep theirs; else through an
//!   AF_PACKET socket.

use crate::{check_range, BlockClient, ClientError, ConnectOptions, Result, TargetUrl};
use async_trait::async_trait;
use bw_aoe::ata::{self, AtaArg};
use bw_aoe::frame::{format_mac, xdp_match, AoeHeader, Mac, FLAG_RESPONSE};
use bw_aoe::flow::{Exchange, Expired, Tags, Window};
use bw_aoe::initiator::{self as req, Addr, AtaRequest, ReplyBody};
use bw_aoe::mask::Directive;
use bw_aoe::query_config::ConfigCommand;
use bw_aoe::{identify, max_sectors_for_mtu, BROADCAST_MAC, BROADCAST_SHELF, BROADCAST_SLOT, ETHERTYPE_AOE, SECTOR};
use bw_net::frames::{self, Chosen, Datapath};
use bw_net::{FrameBatch, FrameSocket, PacketSocket, RingSocket, XdpFilter};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, Semaphore, SemaphorePermit};

/// Most frames we keep in flight to one target (the Linux driver's cap).
pub const MAX_WINDOW: usize = 64;
/// Floor for the retransmit timeout. Under load a 2-core host can delay a
/// reply by tens of milliseconds (scheduling, not loss); a spurious
/// retransmit halves the window, so stay well above that.
const MIN_RTO: Duration = Duration::from_millis(100);
const MAX_RTO: Duration = Duration::from_secs(5);
const DISCOVERY_TRIES: u32 = 3;
const DISCOVERY_WAIT: Duration = Duration::from_millis(700);
/// The slot byte of the Query Config that finds the target: above every
/// request slot (at most MAX_WINDOW), so its reply is never taken for one.
const DISCOVERY_SLOT: u32 = 0xFF;
/// How long a sender waits before trying again when the socket has no
/// room: AF_XDP signals no readiness when transmit chunks come back.
const SEND_RETRY: Duration = Duration::from_millis(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a target told us in its Query Config reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetInfo {
    pub mac: Mac,
    pub shelf: u16,
    pub slot: u8,
    pub buffer_count: u16,
    pub firmware_version: u16,
    pub sector_count: u8,
    pub config: Vec<u8>,
}

/// Where a read's data goes: the caller's buffer, written by the receiver
/// task straight from the received frame (one copy instead of two).
#[derive(Clone, Copy)]
struct ReadDest {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is only dereferenced under the slot's `resp` lock
// while the slot is armed, and the owner of the buffer disarms the slot
// under that lock before its borrow ends (see `SlotLease`).
unsafe impl Send for ReadDest {}

/// Reply state of one slot, written by the receiver task.
struct Resp {
    tag: u32,
    armed: bool,
    complete: bool,
    received_at: Instant,
    frame: Vec<u8>,
    len: usize,
    dest: Option<ReadDest>,
    /// The reply's data went to `dest`; `frame` holds its headers only.
    delivered: bool,
}

struct Slot {
    /// Request frame; taken out by the slot's owner while it is in flight.
    req: Mutex<Vec<u8>>,
    resp: Mutex<Resp>,
    done: Notify,
}

#[derive(Default)]
struct Counters {
    frames: AtomicU64,
    /// Frames that came in through AF_XDP sockets.
    xdp_frames_in: AtomicU64,
    retransmits: AtomicU64,
    stray: AtomicU64,
}

/// Request frames waiting for the sender task.
struct SendQueue {
    batch: FrameBatch,
    queued: usize,
}

struct Shared {
    /// Requests go out through the first; replies come in through all
    /// (AF_XDP: one per receive queue, then the AF_PACKET one).
    socks: Vec<AsyncFd<FrameSocket>>,
    outq: Mutex<SendQueue>,
    /// Set when the queue goes from empty to non-empty.
    out_ready: Notify,
    url: String,
    addr: Addr,
    info: TargetInfo,
    frame_sectors: u8,
    size_bytes: AtomicU64,
    slots: Box<[Slot]>,
    free: Mutex<Vec<usize>>,
    window: Semaphore,
    /// Congestion window and RTT (`bw_aoe::flow`; the semaphore carries out its decisions).
    flow: Mutex<Window>,
    tags: Mutex<Tags>,
    timeout: Duration,
    counters: Counters,
    flush_ext_unsupported: std::sync::atomic::AtomicBool,
}

pub struct AoeClient {
    /// ATA IDENTIFY's model and firmware.
    identity: String,
    shared: Arc<Shared>,
    receivers: Vec<tokio::task::JoinHandle<()>>,
    sender: tokio::task::JoinHandle<()>,
}

impl Drop for AoeClient {
    fn drop(&mut self) {
        for r in &self.receivers {
            r.abort();
        }
        self.sender.abort();
    }
}

/// The replies an AF_XDP client takes: responses from the shelf.slot it
/// talks to that carry its tag prefix. The prefix alone would do between
/// our clients, but another initiator's tags (the kernel's aoe driver
/// beside us) may start with the same bits; its replies then still reach
/// it unless they also come from our target. Everything else, broadcast
/// discovery's replies included, goes on to the stack and the AF_PACKET
/// socket.
fn reply_filter(tag_prefix: u32, shelf: u16, slot: u8) -> XdpFilter {
    XdpFilter {
        byte: Some((xdp_match::FLAGS_OFFSET, FLAG_RESPONSE, FLAG_RESPONSE)),
        word: Some((xdp_match::TAG_OFFSET, Tags::ID_MASK, tag_prefix & Tags::ID_MASK)),
        key: Some((xdp_match::ADDRESS_OFFSET, xdp_match::ADDRESS_MASK)),
        keys: vec![xdp_match::address_key(shelf, slot)],
    }
}

/// The client's sockets on `iface`, non-blocking: AF_XDP ones for replies
/// passing `filter` if `want` asks and it can be set up, then an AF_PACKET
/// one, alone or for replies that reach the stack instead (generic XDP
/// skips frames act_mirred re-injects): a safeguard, idle when all goes
/// through XDP.
/// With `mmap`: one AF_PACKET socket with rings, alone.
fn open_sockets(iface: &str, want: Datapath, filter: XdpFilter) -> Result<Vec<AsyncFd<FrameSocket>>> {
    let mut socks: Vec<FrameSocket> = match frames::choose(iface, ETHERTYPE_AOE, want, filter)? {
        Chosen::Xdp(s) => s.into_iter().map(|s| FrameSocket::Xdp(Box::new(s))).collect(),
        // The ring socket sees every AoE frame: no second socket.
        Chosen::Mmap => return wrap(vec![FrameSocket::Mmap(Box::new(RingSocket::open(iface, ETHERTYPE_AOE)?))]),
        Chosen::Packet { why } => {
            if let Some(why) = why {
                log::info!("aoe {iface}: AF_XDP not used, AF_PACKET instead: {why}");
            }
            Vec::new()
        }
    };
    let sock = PacketSocket::open(iface, ETHERTYPE_AOE)?;
    // Best effort: a big receive buffer absorbs a full window of replies.
    let _ = sock.set_buffer_sizes(4 << 20, 4 << 20);
    socks.push(FrameSocket::Packet(sock));
    wrap(socks)
}

/// The sockets made non-blocking, for tokio.
fn wrap(socks: Vec<FrameSocket>) -> Result<Vec<AsyncFd<FrameSocket>>> {
    let mut out = Vec::with_capacity(socks.len());
    for sock in socks {
        sock.set_nonblocking(true)?;
        // The socket owns its fd (OwnedFd) and moves into the AsyncFd, so
        // the I/O-safety concern behind this deprecation does not apply.
        #[allow(deprecated)]
        let afd = AsyncFd::new(sock)?;
        out.push(afd);
    }
    Ok(out)
}

/// Wait for room to send: writable readiness, or a short pause (AF_XDP
/// sockets signal none when their transmit chunks come back).
async fn wait_writable(sock: &AsyncFd<FrameSocket>) -> io::Result<()> {
    if let Ok(g) = tokio::time::timeout(SEND_RETRY, sock.writable()).await {
        g?.clear_ready();
    }
    Ok(())
}

async fn send_frame(sock: &AsyncFd<FrameSocket>, frame: &[u8]) -> Result<()> {
    loop {
        match sock.get_ref().send(frame) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(sock).await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receive frames on any of `socks` until `deadline`, giving each to `f`
/// until it returns Some.
async fn recv_until<T>(socks: &[AsyncFd<FrameSocket>], deadline: Instant, mut f: impl FnMut(&[u8]) -> Option<T>) -> Result<Option<T>> {
    let mut buf = vec![0u8; socks[0].get_ref().mtu() + 18];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        let any = futures::future::select_all(socks.iter().map(|s| Box::pin(s.readable())));
        let mut guard = match tokio::time::timeout(deadline - now, any).await {
            Err(_) => return Ok(None),
            Ok((g, _, _)) => g?,
        };
        match guard.try_io(|s| s.get_ref().recv(&mut buf)) {
            Ok(Ok(n)) => {
                if let Some(t) = f(&buf[..n]) {
                    return Ok(Some(t));
                }
            }
            Ok(Err(e)) if e.kind() == io::ErrorKind::InvalidData => {} // oversized frame: not ours
            Ok(Err(e)) => return Err(e.into()),
            Err(_would_block) => {}
        }
    }
}

fn parse_config_reply(frame: &[u8], want: Option<(u16, u8)>) -> Option<TargetInfo> {
    let r = req::parse_reply(frame).ok()?;
    if let Some((shelf, slot)) = want {
        if (r.shelf, r.slot) != (shelf, slot) {
            return None;
        }
    }
    match r.body {
        ReplyBody::Config(q) => Some(TargetInfo {
            mac: r.src,
            shelf: r.shelf,
            slot: r.slot,
            buffer_count: q.buffer_count,
            firmware_version: q.firmware_version,
            sector_count: q.sector_count,
            config: q.config.to_vec(),
        }),
        _ => None,
    }
}

/// Find the target answering at shelf.slot on the socket's interface;
/// the Query Config carries the client's tag prefix (AF_XDP takes only
/// replies with it).
async fn find_target(socks: &[AsyncFd<FrameSocket>], shelf: u16, slot: u8, tag_prefix: u32) -> Result<TargetInfo> {
    let sock = &socks[0];
    let me = sock.get_ref().mac();
    let mut frame = [0u8; 64];
    for attempt in 0..DISCOVERY_TRIES {
        let tag = tag_prefix | attempt << 8 | DISCOVERY_SLOT;
        let to = Addr { src: me, dst: BROADCAST_MAC, shelf, slot };
        let n = req::query_config(&mut frame, &to, tag, ConfigCommand::Read, b"").map_err(|e| ClientError::Protocol(e.to_string()))?;
        send_frame(sock, &frame[..n]).await?;
        let deadline = Instant::now() + DISCOVERY_WAIT;
        if let Some(t) = recv_until(socks, deadline, |f| {
            parse_config_reply(f, Some((shelf, slot))).filter(|_| AoeHeader::parse(f).map(|h| h.tag() == tag).unwrap_or(false))
        })
        .await?
        {
            return Ok(t);
        }
    }
    Err(ClientError::Timeout(format!(
        "no AoE target e{shelf}.{slot} answered on {} within {:?}",
        sock.get_ref().info().name,
        DISCOVERY_WAIT * DISCOVERY_TRIES
    )))
}

fn target_error(code: u8) -> ClientError {
    let what = match code {
        1 => "unrecognized command",
        2 => "bad argument",
        3 => "device unavailable",
        4 => "config string present",
        5 => "unsupported version",
        6 => "target reserved",
        _ => "unknown error",
    };
    ClientError::Target(format!("AoE error {code} ({what})"))
}

/// Check an ATA reply: status and enough data.
fn ata_reply(frame: &[u8], want_data: usize) -> Result<(AtaArg, &[u8])> {
    match req::parse_reply(frame).map_err(|e| ClientError::Protocol(e.to_string()))?.body {
        ReplyBody::Error(code) => Err(target_error(code)),
        ReplyBody::Ata(a, data) => {
            if a.failed() {
                return Err(ClientError::Target(ata::describe_ata_error(a.cmd_status, a.err_feature)));
            }
            if data.len() < want_data {
                return Err(ClientError::Protocol(format!("ATA reply carries {} bytes, expected {want_data}", data.len())));
            }
            Ok((a, &data[..want_data]))
        }
        other => Err(ClientError::Protocol(format!("unexpected reply {other:?} to an ATA command"))),
    }
}

/// A tag id for each client: replies reach every socket on the interface,
/// so clients in one process (and, most likely, in different processes:
/// the count starts at a random place) must not share tags.
fn initiator_id() -> u32 {
    static NEXT: std::sync::OnceLock<std::sync::atomic::AtomicU32> = std::sync::OnceLock::new();
    let next = NEXT.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is keyed from the OS random source.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        std::sync::atomic::AtomicU32::new(h.finish() as u32)
    });
    // Id 0 would give tags without a prefix, like those of one-off
    // exchanges (discovery) and other software: an AF_XDP client must not
    // take their replies.
    loop {
        let id = next.fetch_add(1, Relaxed);
        if id & (Tags::ID_MASK >> 20) != 0 {
            return id;
        }
    }
}

pub async fn connect(url: &TargetUrl, opts: &ConnectOptions) -> Result<Arc<dyn BlockClient>> {
    Ok(Arc::new(AoeClient::connect(url, opts).await?))
}

impl AoeClient {
    pub async fn connect(url: &TargetUrl, opts: &ConnectOptions) -> Result<AoeClient> {
        let TargetUrl::Aoe { iface, shelf, slot } = url else {
            return Err(ClientError::Protocol(format!("{url} is not an aoe:// URL")));
        };
        let tags = Tags::for_initiator(initiator_id());
        let socks = open_sockets(iface, opts.aoe_datapath, reply_filter(tags.prefix(), *shelf, *slot))?;
        let sock = &socks[0];
        log::debug!("{url}: datapath {} ({}), {} sockets", sock.get_ref().datapath(), sock.get_ref().describe(), socks.len());
        let info = find_target(&socks, *shelf, *slot, tags.prefix()).await?;
        let our_sectors = max_sectors_for_mtu(sock.get_ref().mtu());
        let frame_sectors = match info.sector_count {
            0 => our_sectors,
            n => n.min(our_sectors),
        };
        if frame_sectors == 0 {
            return Err(ClientError::Protocol(format!("MTU {} of {iface} is too small for AoE", sock.get_ref().mtu())));
        }
        let max_window = (info.buffer_count as usize).clamp(1, MAX_WINDOW);
        let flow = Window::new(max_window, MIN_RTO, MAX_RTO);
        let window = flow.size();
        let frame_len = bw_aoe::ATA_HEADER_LEN + (frame_sectors as usize).max(1) * SECTOR;
        let reply_len = sock.get_ref().mtu() + 18;
        let slots: Box<[Slot]> = (0..max_window)
            .map(|_| Slot {
                req: Mutex::new(vec![0u8; frame_len.max(bw_aoe::MIN_FRAME).max(1100)]),
                resp: Mutex::new(Resp {
                    tag: 0,
                    armed: false,
                    complete: false,
                    received_at: Instant::now(),
                    frame: vec![0u8; reply_len],
                    len: 0,
                    dest: None,
                    delivered: false,
                }),
                done: Notify::new(),
            })
            .collect();
        let addr = Addr { src: sock.get_ref().mac(), dst: info.mac, shelf: *shelf, slot: *slot };
        let shared = Arc::new(Shared {
            url: url.to_string(),
            addr,
            frame_sectors,
            size_bytes: AtomicU64::new(0),
            free: Mutex::new((0..max_window).rev().collect()),
            window: Semaphore::new(window),
            flow: Mutex::new(flow),
            tags: Mutex::new(tags),
            outq: Mutex::new(SendQueue { batch: FrameBatch::new(MAX_WINDOW, frame_len.max(bw_aoe::MIN_FRAME)), queued: 0 }),
            out_ready: Notify::new(),
            timeout: opts.timeout,
            counters: Counters::default(),
            flush_ext_unsupported: std::sync::atomic::AtomicBool::new(false),
            slots,
            info,
            socks,
        });
        let receivers = (0..shared.socks.len()).map(|i| tokio::spawn(receive_loop(shared.clone(), i))).collect();
        let sender = tokio::spawn(send_loop(shared.clone(), FrameBatch::new(MAX_WINDOW, frame_len.max(bw_aoe::MIN_FRAME))));
        let mut client = AoeClient { identity: String::new(), shared, receivers, sender };
        let id = client.identify().await?;
        client.identity = format!("{} firmware {}", id.model.trim(), id.firmware.trim());
        client.shared.size_bytes.store(id.sectors * SECTOR as u64, Relaxed);
        log::debug!("{}: {} at {}, {} sectors, {} sectors/frame, window {window}/{max_window} (buffers {})",
            client.shared.url, id.model, format_mac(&client.shared.info.mac), id.sectors, frame_sectors, client.shared.info.buffer_count);
        Ok(client)
    }

    /// The sockets this client's frames move through.
    pub fn datapath(&self) -> Datapath {
        self.shared.socks[0].get_ref().datapath()
    }

    /// The target's Query Config answer at connect time.
    pub fn target(&self) -> &TargetInfo {
        &self.shared.info
    }
    /// Sectors per ATA frame in use.
    pub fn frame_sectors(&self) -> u8 {
        self.shared.frame_sectors
    }
    /// Current window (frames allowed in flight).
    pub fn window(&self) -> usize {
        lock(&self.shared.flow).size()
    }
    pub fn retransmits(&self) -> u64 {
        self.shared.counters.retransmits.load(Relaxed)
    }
    /// Frames received through AF_XDP sockets (the rest came through AF_PACKET).
    pub fn frames_in_over_xdp(&self) -> u64 {
        self.shared.counters.xdp_frames_in.load(Relaxed)
    }

    pub async fn identify(&self) -> Result<identify::IdentifyInfo> {
        self.shared
            .exchange(
                |b, to, tag| req::ata(b, to, tag, &AtaRequest::simple(ata::CMD_IDENTIFY_DEVICE)),
                |f| {
                    let (_, page) = ata_reply(f, SECTOR)?;
                    identify::parse(page).map_err(|e| ClientError::Protocol(e.to_string()))
                },
            )
            .await
    }

    /// Any ATA command without data; returns the reply's ATA registers.
    pub async fn ata_simple(&self, command: u8) -> Result<AtaArg> {
        self.shared
            .exchange(|b, to, tag| req::ata(b, to, tag, &AtaRequest::simple(command)), |f| Ok(ata_reply(f, 0)?.0))
            .await
    }

    /// Query Config with a config string command. A test/prefix mismatch
    /// gets no reply at all, which shows up here as a timeout.
    pub async fn query_config(&self, cmd: ConfigCommand, config: &[u8]) -> Result<TargetInfo> {
        self.shared
            .exchange(
                |b, to, tag| req::query_config(b, to, tag, cmd, config),
                |f| match req::parse_reply(f).map_err(|e| ClientError::Protocol(e.to_string()))?.body {
                    ReplyBody::Error(c) => Err(target_error(c)),
                    _ => parse_config_reply(f, None).ok_or_else(|| ClientError::Protocol("bad Query Config reply".into())),
                },
            )
            .await
    }

    /// MAC Mask List read/edit: returns merror and the directives in the reply.
    pub async fn mac_mask(&self, mcmd: u8, directives: &[Directive]) -> Result<(u8, Vec<Directive>)> {
        self.shared
            .exchange(
                |b, to, tag| req::mac_mask(b, to, tag, mcmd, directives),
                |f| match req::parse_reply(f).map_err(|e| ClientError::Protocol(e.to_string()))?.body {
                    ReplyBody::Error(c) => Err(target_error(c)),
                    ReplyBody::Mask(m) => Ok((m.merror, m.directives().collect())),
                    other => Err(ClientError::Protocol(format!("unexpected reply {other:?}"))),
                },
            )
            .await
    }

    /// Reserve/Release: returns the reservation list in the reply.
    pub async fn reserve_release(&self, rcmd: u8, macs: &[Mac]) -> Result<Vec<Mac>> {
        self.shared
            .exchange(
                |b, to, tag| req::reserve(b, to, tag, rcmd, macs),
                |f| match req::parse_reply(f).map_err(|e| ClientError::Protocol(e.to_string()))?.body {
                    ReplyBody::Error(c) => Err(target_error(c)),
                    ReplyBody::Reserve(r) => Ok(r.macs().collect()),
                    other => Err(ClientError::Protocol(format!("unexpected reply {other:?}"))),
                },
            )
            .await
    }

    async fn read_frame(&self, lba: u64, out: &mut [u8]) -> Result<()> {
        let sectors = (out.len() / SECTOR) as u8;
        let dest = ReadDest { ptr: out.as_mut_ptr(), len: out.len() };
        self.shared
            .exchange_into(
                |b, to, tag| req::ata(b, to, tag, &AtaRequest::read(lba, sectors)),
                |f, delivered| {
                    if delivered {
                        // The receiver checked the status and copied the data.
                        return Ok(());
                    }
                    let (_, data) = ata_reply(f, out.len())?;
                    out.copy_from_slice(data);
                    Ok(())
                },
                Some(dest),
            )
            .await
    }

    async fn write_frame(&self, lba: u64, data: &[u8]) -> Result<()> {
        self.shared
            .exchange(|b, to, tag| req::ata(b, to, tag, &AtaRequest::write(lba, data)), |f| ata_reply(f, 0).map(|_| ()))
            .await
    }
}

impl Shared {
    /// Hand a request frame to the sender task (or send it here if the
    /// queue is full).
    async fn queue_frame(&self, frame: &[u8]) -> Result<()> {
        let queued = {
            let mut q = lock(&self.outq);
            let i = q.queued;
            if i == q.batch.capacity() || frame.len() > q.batch.frame_size() {
                None
            } else {
                q.batch.slot_mut(i)[..frame.len()].copy_from_slice(frame);
                q.batch.set_len(i, frame.len());
                q.queued += 1;
                Some(i == 0)
            }
        };
        let Some(first) = queued else { return send_frame(&self.socks[0], frame).await };
        if first {
            self.out_ready.notify_one();
        }
        Ok(())
    }

    /// Return a permit, forgetting it if the window shrank meanwhile.
    fn release(&self, permit: SemaphorePermit<'_>, idx: usize) {
        lock(&self.free).push(idx);
        if !lock(&self.flow).on_release() {
            permit.forget();
        }
    }

    fn on_success(&self, rtt: Option<Duration>) {
        let open = lock(&self.flow).on_reply(rtt);
        if open > 0 {
            self.window.add_permits(open);
        }
    }

    /// One request/reply exchange with retransmits. `build` writes the
    /// frame for a tag; `parse` reads the reply.
    async fn exchange<T>(
        &self,
        build: impl Fn(&mut [u8], &Addr, u32) -> std::result::Result<usize, bw_aoe::WireError>,
        parse: impl FnOnce(&[u8]) -> Result<T>,
    ) -> Result<T> {
        self.exchange_into(build, |f, _| parse(f), None).await
    }

    /// [`Shared::exchange`], with a read's data going straight to `dest`
    /// when the reply is a good ATA reply carrying enough of it (`parse`
    /// then learns `delivered`).
    async fn exchange_into<T>(
        &self,
        build: impl Fn(&mut [u8], &Addr, u32) -> std::result::Result<usize, bw_aoe::WireError>,
        parse: impl FnOnce(&[u8], bool) -> Result<T>,
        dest: Option<ReadDest>,
    ) -> Result<T> {
        let permit = self.window.acquire().await.map_err(|_| ClientError::Disconnected("client closed".into()))?;
        let idx = match lock(&self.free).pop() {
            Some(i) => i,
            None => return Err(ClientError::Protocol("internal: no free slot under the window".into())),
        };
        let slot = &self.slots[idx];
        let frame = std::mem::take(&mut *lock(&slot.req));
        lock(&slot.resp).dest = dest;
        let mut lease = SlotLease { shared: self, idx, frame, permit: Some(permit) };
        let SlotLease { frame, .. } = &mut lease;
        self.exchange_in_slot(slot, idx, frame, build, parse).await
        // `lease` drops here, or when this future is dropped mid-flight.
    }

    async fn exchange_in_slot<T>(
        &self,
        slot: &Slot,
        idx: usize,
        frame: &mut [u8],
        build: impl Fn(&mut [u8], &Addr, u32) -> std::result::Result<usize, bw_aoe::WireError>,
        parse: impl FnOnce(&[u8], bool) -> Result<T>,
    ) -> Result<T> {
        let len = build(frame, &self.addr, 0).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut ex = {
            let flow = lock(&self.flow);
            Exchange::start(idx as u8, &mut lock(&self.tags), &flow, Instant::now(), self.timeout)
        };
        loop {
            let tag = ex.tag();
            bw_aoe::frame::field::TAG.set(frame, tag);
            {
                let mut r = lock(&slot.resp);
                r.tag = tag;
                r.armed = true;
                r.complete = false;
                r.delivered = false;
            }
            self.queue_frame(&frame[..len]).await?;
            self.counters.frames.fetch_add(1, Relaxed);
            loop {
                let notified = slot.done.notified();
                {
                    let r = lock(&slot.resp);
                    if r.complete && ex.accepts(r.tag) {
                        let rtt = ex.rtt_sample(r.received_at);
                        let out = parse(&r.frame[..r.len], r.delivered);
                        drop(r);
                        self.on_success(rtt);
                        return out;
                    }
                }
                if tokio::time::timeout_at(ex.expiry().into(), notified).await.is_err() {
                    break;
                }
            }
            // Timed out: the reply (or request) was lost or is late.
            if lock(&slot.resp).complete {
                continue; // raced with the reply: the inner loop picks it up next round
            }
            let expired = {
                let mut flow = lock(&self.flow);
                ex.on_expiry(Instant::now(), &mut lock(&self.tags), &mut flow)
            };
            match expired {
                Expired::GiveUp { retransmits } => {
                    return Err(ClientError::Timeout(format!("{}: no reply after {retransmits} retransmits", self.url)));
                }
                Expired::Retransmit { .. } => {
                    self.counters.retransmits.fetch_add(1, Relaxed);
                    log::debug!("{}: retransmit (attempt {})", self.url, ex.attempt());
                }
            }
        }
    }
}

/// Send queued requests in batches. After a wakeup it yields once, so the
/// tasks woken by the same batch of replies queue their next requests
/// first and all go out with one `sendmmsg`.
async fn send_loop(shared: Arc<Shared>, mut batch: FrameBatch) {
    loop {
        shared.out_ready.notified().await;
        tokio::task::yield_now().await;
        let n = {
            let mut q = lock(&shared.outq);
            std::mem::swap(&mut q.batch, &mut batch);
            std::mem::replace(&mut q.queued, 0)
        };
        let mut sent = 0;
        while sent < n {
            // Frames before `sent` went out; send_batch restarts at 0, so
            // after a partial send the rest go one by one.
            let r = if sent == 0 {
                shared.socks[0].get_ref().send_batch(&mut batch, n)
            } else {
                let len = batch.built_len(sent);
                shared.socks[0].get_ref().send(&batch.slot_mut(sent)[..len]).map(|()| 1)
            };
            match r {
                Ok(k) => sent += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => match wait_writable(&shared.socks[0]).await {
                    Ok(()) => {}
                    Err(e) => {
                        log::error!("{}: socket failed: {e}", shared.url);
                        return;
                    }
                },
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // The requests time out and are sent again.
                    log::warn!("{}: send failed: {e}", shared.url);
                    break;
                }
            }
        }
    }
}

/// A slot taken for one exchange. Dropping it, also when the exchange's
/// future is dropped mid-flight, disarms the slot (under its lock, so the
/// receiver never writes into a read buffer whose borrow has ended), puts
/// the request frame back and returns the slot and window permit.
struct SlotLease<'a> {
    shared: &'a Shared,
    idx: usize,
    frame: Vec<u8>,
    permit: Option<SemaphorePermit<'a>>,
}

impl Drop for SlotLease<'_> {
    fn drop(&mut self) {
        let slot = &self.shared.slots[self.idx];
        {
            let mut r = lock(&slot.resp);
            r.armed = false;
            r.complete = false;
            r.dest = None;
        }
        *lock(&slot.req) = std::mem::take(&mut self.frame);
        if let Some(p) = self.permit.take() {
            self.shared.release(p, self.idx);
        }
    }
}

/// Drain the socket in batches; hand each reply to the slot its tag names.
async fn receive_loop(shared: Arc<Shared>, sock: usize) {
    let sock = &shared.socks[sock];
    let mut batch = FrameBatch::new(64, sock.get_ref().mtu() + 18);
    loop {
        let mut guard = match sock.readable().await {
            Ok(g) => g,
            Err(e) => {
                log::error!("{}: socket failed: {e}", shared.url);
                return;
            }
        };
        let n = match guard.try_io(|s| s.get_ref().recv_batch(&mut batch)) {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => {
                log::error!("{}: receive failed: {e}", shared.url);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(_would_block) => continue,
        };
        if sock.get_ref().datapath() == Datapath::Xdp {
            shared.counters.xdp_frames_in.fetch_add(n as u64, Relaxed);
        }
        let now = Instant::now();
        for i in 0..n {
            deliver(&shared, batch.frame(i), now);
        }
    }
}

fn deliver(shared: &Shared, frame: &[u8], now: Instant) {
    let Ok(h) = AoeHeader::parse(frame) else { return };
    if !h.is_response() || h.src() != shared.info.mac || h.dst() != shared.addr.src || h.shelf() != shared.addr.shelf || h.slot() != shared.addr.slot {
        return;
    }
    let tag = h.tag();
    let Some(slot) = shared.slots.get(Tags::slot(tag)) else { return };
    let mut r = lock(&slot.resp);
    if !r.armed || r.complete || r.tag != tag || frame.len() > r.frame.len() {
        shared.counters.stray.fetch_add(1, Relaxed);
        return;
    }
    r.delivered = false;
    r.len = frame.len();
    if let Some(d) = r.dest {
        if let Ok(req::Reply { body: ReplyBody::Ata(a, data), .. }) = req::parse_reply(frame) {
            if !a.failed() && data.len() >= d.len {
                // SAFETY: see ReadDest: the slot is armed and we hold its lock,
                // so the buffer is alive and nobody else touches it.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), d.ptr, d.len) };
                r.delivered = true;
                r.len = frame.len() - data.len();
            }
        }
    }
    let keep = r.len;
    r.frame[..keep].copy_from_slice(&frame[..keep]);
    r.complete = true;
    r.received_at = now;
    drop(r);
    slot.done.notify_one();
}

#[async_trait]
impl BlockClient for AoeClient {
    fn identity(&self) -> Option<String> {
        Some(self.identity.clone())
    }
    fn describe(&self) -> String {
        let s = &self.shared;
        format!(
            "{} (target {} e{}.{}, {} sectors/frame, buffers {})",
            s.url,
            format_mac(&s.info.mac),
            s.info.shelf,
            s.info.slot,
            s.frame_sectors,
            s.info.buffer_count
        )
    }

    fn size_bytes(&self) -> u64 {
        self.shared.size_bytes.load(Relaxed)
    }

    async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_range(self, offset, buf.len())?;
        let chunk = self.shared.frame_sectors as usize * SECTOR;
        let lba = offset / SECTOR as u64;
        if buf.is_empty() {
            return Ok(());
        }
        if buf.len() <= chunk {
            // One frame: skip the join machinery.
            return self.read_frame(lba, buf).await;
        }
        let frames = buf.chunks_mut(chunk).enumerate().map(|(i, c)| self.read_frame(lba + (i * chunk / SECTOR) as u64, c));
        futures::future::try_join_all(frames).await?;
        Ok(())
    }

    async fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        check_range(self, offset, data.len())?;
        let chunk = self.shared.frame_sectors as usize * SECTOR;
        let lba = offset / SECTOR as u64;
        if data.is_empty() {
            return Ok(());
        }
        if data.len() <= chunk {
            return self.write_frame(lba, data).await;
        }
        let frames = data.chunks(chunk).enumerate().map(|(i, c)| self.write_frame(lba + (i * chunk / SECTOR) as u64, c));
        futures::future::try_join_all(frames).await?;
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        // FLUSH CACHE EXT first; targets that abort it (vblade only knows
        // FLUSH CACHE) get the 28-bit command from then on.
        if !self.shared.flush_ext_unsupported.load(Relaxed) {
            match self.ata_simple(ata::CMD_FLUSH_CACHE_EXT).await {
                Ok(_) => return Ok(()),
                Err(ClientError::Target(m)) if m.contains("ABRT") => {
                    log::debug!("{}: FLUSH CACHE EXT aborted, using FLUSH CACHE", self.shared.url);
                    self.shared.flush_ext_unsupported.store(true, Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        self.ata_simple(ata::CMD_FLUSH_CACHE).await.map(|_| ())
    }

    async fn close(&self) -> Result<()> {
        let c = &self.shared.counters;
        let drops: u64 = self.shared.socks.iter().map(|s| s.get_ref().take_statistics().map_or(0, |s| s.1)).sum();
        log::debug!(
            "{}: {} frames sent, {} retransmits, {} stray replies, {} dropped by our socket, window {}",
            self.shared.url,
            c.frames.load(Relaxed),
            c.retransmits.load(Relaxed),
            c.stray.load(Relaxed),
            drops,
            self.window()
        );
        for r in &self.receivers {
            r.abort();
        }
        self.sender.abort();
        Ok(())
    }
}

/// One target found by [`discover_targets`].
#[derive(Debug, Clone)]
pub struct Discovered {
    pub info: TargetInfo,
    pub size_bytes: Option<u64>,
    pub model: Option<String>,
}

impl Discovered {
    pub fn line(&self, iface: &str) -> String {
        let i = &self.info;
        let size = match self.size_bytes {
            Some(b) => format!("{} ({b} bytes)", bw_block::format_size(b)),
            None => "size unknown".into(),
        };
        format!(
            "e{}.{}  aoe://{iface}/{}.{}  mac {}  size {size}  buffers {}  sectors/frame {}  config {:?}",
            i.shelf,
            i.slot,
            i.shelf,
            i.slot,
            format_mac(&i.mac),
            i.buffer_count,
            i.sector_count,
            String::from_utf8_lossy(&i.config)
        )
    }
}

/// Broadcast a Query Config on `iface`, collect answers for `wait`, then
/// ask each target's size with IDENTIFY.
pub async fn discover_targets(iface: &str, wait: Duration) -> Result<Vec<Discovered>> {
    // AF_PACKET: a short exchange, and it sees replies with any tag.
    let socks = open_sockets(iface, Datapath::Packet, XdpFilter::default())?;
    let sock = &socks[0];
    let me = sock.get_ref().mac();
    let mut frame = vec![0u8; sock.get_ref().mtu() + 18];
    // No initiator id bits: no AF_XDP client's program takes the replies.
    let tag = std::process::id() & 0xFFFF;
    let to = Addr { src: me, dst: BROADCAST_MAC, shelf: BROADCAST_SHELF, slot: BROADCAST_SLOT };
    let n = req::query_config(&mut frame, &to, tag, ConfigCommand::Read, b"").map_err(|e| ClientError::Protocol(e.to_string()))?;
    send_frame(sock, &frame[..n]).await?;
    let mut found: Vec<TargetInfo> = Vec::new();
    let deadline = Instant::now() + wait;
    recv_until(&socks, deadline, |f| {
        if let Some(t) = parse_config_reply(f, None) {
            if AoeHeader::parse(f).map(|h| h.tag() == tag).unwrap_or(false)
                && !found.iter().any(|x| (x.mac, x.shelf, x.slot) == (t.mac, t.shelf, t.slot))
            {
                found.push(t);
            }
        }
        None::<()>
    })
    .await?;
    found.sort_by_key(|t| (t.shelf, t.slot, t.mac));
    let mut out = Vec::new();
    for (i, t) in found.into_iter().enumerate() {
        let id_tag = 0x1_0000 | i as u32;
        let to = Addr { src: me, dst: t.mac, shelf: t.shelf, slot: t.slot };
        let n = req::ata(&mut frame, &to, id_tag, &AtaRequest::simple(ata::CMD_IDENTIFY_DEVICE))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        send_frame(sock, &frame[..n]).await?;
        let id = recv_until(&socks, Instant::now() + Duration::from_secs(1), |f| {
            let h = AoeHeader::parse(f).ok()?;
            if h.tag() != id_tag || h.src() != t.mac || !h.is_response() {
                return None;
            }
            ata_reply(f, SECTOR).ok().and_then(|(_, p)| identify::parse(p).ok())
        })
        .await?;
        out.push(Discovered {
            size_bytes: id.as_ref().map(|i| i.sectors * SECTOR as u64),
            model: id.map(|i| i.model),
            info: t,
        });
    }
    Ok(out)
}

/// Targets found by discovery, one line each when printed.
pub async fn discover(iface: &str, wait: Duration) -> Result<Vec<String>> {
    Ok(discover_targets(iface, wait).await?.iter().map(|d| d.line(iface)).collect())
}
