//! The AoE front-end: serve exports on Ethernet interfaces.
//!
//! Per interface, several worker threads each own a socket: with AF_XDP
//! (`[tuning] aoe_datapath`, `auto` by default), one per receive queue, an
//! XDP program steering requests for our shelf.slot pairs to them (the
//! rest, broadcasts included, to the stack and an AF_PACKET socket, so
//! vblade beside us on the interface still sees its own); with AF_PACKET, sockets in
//! one fanout group (load-balanced with rollover), so the kernel spreads
//! requests over them and many requests are in flight to the backend at
//! once. Each worker receives a batch of frames (one `recvmmsg`, or what
//! the RX ring holds), runs every frame through the protocol state machine
//! ([`bw_aoe::target::Export`]), which reads straight into the reply buffer
//! or writes straight from the request frame, and sends all replies at once
//! (one `sendmmsg`, or one TX ring kick). Buffers are allocated once per
//! worker; nothing is allocated per frame.
//!
//! Exports on a real device (anything not in memory) get more workers than
//! cores, so a worker waiting for the disk does not stall the others. An
//! opt-in I/O pool (`[tuning] aoe_io_threads = N`) instead hands each frame
//! to one of N threads (in a recycled buffer) for a deeper device queue:
//! about 1.3x the IOPS of the default on a virtio disk, but the Linux aoe
//! driver once hung during mkfs over it (all frames answered; 1 of 11 runs,
//! under heavy load; cause not found), so it stays off by default.
//!
//! Live changes ([`Handle::reconcile`]) add and remove exports on the
//! interfaces serve listens on: each interface's export table is swapped
//! whole (`arc_swap`) and loaded once per frame, lock-free, and the XDP
//! program's map of exported shelf.slot pairs follows it. An interface
//! gets its sockets and workers at start only, so an export on another
//! interface needs a restart.

use crate::config::{AoeConfig, AoeExport, ServeConfig};
use crate::frontend::{failed, Frontend};
use crate::metrics::{self, AoeStats, Op, Proto, VolumeStats};
use crate::refused::Refused;
use crate::tuning::{AoeFanout, Tuning};
use crate::{Running, Shutdown, Volumes};
use anyhow::Context;
use arc_swap::ArcSwap;
use bw_aoe::target::{Export, ExportSettings, Outcome};
use bw_aoe::ata::{self, AtaArg};
use bw_aoe::{frame::xdp_match, frame::FLAG_RESPONSE, max_sectors_for_mtu, AoeHeader, Command, ETHERTYPE_AOE};
use bw_net::frames::{self, Chosen, Datapath};
use bw_net::{FanoutMode, FrameBatch, FrameSocket, PacketSocket, RingSocket, XdpFilter, XdpKeys};
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Frames per receive/send batch.
const BATCH: usize = 32;
/// Kernel receive buffer we ask for per worker socket.
const SOCKET_BUFFER: usize = 4 << 20;
/// Upper bound on the buffer count we advertise.
const MAX_ADVERTISED_BUFFERS: usize = 256;
/// How often idle workers look at the stop flag.
const POLL: Duration = Duration::from_millis(200);

/// I/O pool size for an interface with exports on remote volumes (rbd)
/// when `tuning.aoe_io_threads` is 0: each request waits a cluster round
/// trip, so the pool is what keeps many in flight (the Linux aoe driver
/// keeps up to its window per target).
const REMOTE_IO_THREADS: usize = 64;

/// Receive worker threads per interface: `configured` if not 0, else by
/// what the interface exports; `io_threads`: the I/O pool's size.
fn workers(configured: usize, memory_backed: bool, io_threads: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    if memory_backed || io_threads > 0 {
        // Each request is a memory copy (or goes to the I/O pool): one
        // worker per two cores keeps up with the wire (a batch of frames per
        // wakeup) and leaves the other cores to the kernel's network
        // processing. More workers only add wakeups and contention
        // (measured: 2.5x the CPU per I/O with 4 workers on 2 cores).
        (cpus / 2).max(1)
    } else {
        // More threads than cores: a worker blocked on the disk must not
        // stall the others.
        cpus.clamp(2, 8) * 2
    }
}

/// How the kernel spreads frames over the workers: round robin by default;
/// `cpu` keeps each CPU's frames on one socket.
fn fanout_mode(f: AoeFanout) -> FanoutMode {
    match f {
        AoeFanout::Cpu => FanoutMode::Cpu,
        AoeFanout::RoundRobin => FanoutMode::LoadBalance,
    }
}

/// With CPU fanout, worker w serves the frames that arrive on CPU w % n:
/// pinning it there makes the wakeup local and cache-hot.
fn pin_to_cpu(w: usize) {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: cpu_set_t is plain data; CPU_SET indexes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(w % n, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            log::debug!("aoe worker {w}: cannot pin to CPU {}: {}", w % n, io::Error::last_os_error());
        }
    }
}

/// Kernel memory one queued frame costs (skb truesize), estimated
/// conservatively: the data buffer rounded up to a power of two plus overhead.
fn frame_truesize(mtu: usize) -> usize {
    (mtu + 14 + 256).next_power_of_two() + 768
}

#[derive(Default)]
struct Counters {
    frames: AtomicU64,
    /// Of `frames`, those that came through AF_XDP sockets.
    xdp_frames: AtomicU64,
    replies: AtomicU64,
    ignored: AtomicU64,
    batches: AtomicU64,
    errors: AtomicU64,
    /// Frames the kernel dropped because a worker socket's buffer was full.
    drops: AtomicU64,
}

/// One export served on an interface.
struct Served {
    export: Export,
    /// The metrics of its volume.
    volume_stats: Arc<VolumeStats>,
    /// What it was built from: a live change keeps it while this stays equal.
    cfg: AoeExport,
}

/// What exports on one interface are built with (fixed by its sockets).
#[derive(Clone, Copy)]
struct Link {
    mtu: usize,
    max_sectors: u8,
    /// Frames the sockets can hold queued: the buffer count advertised by default.
    capacity: usize,
    workers: usize,
}

struct Interface {
    name: String,
    mac: [u8; 6],
    link: Link,
    /// The exports, replaced whole by live changes; loaded once per frame.
    exports: ArcSwap<Vec<Arc<Served>>>,
    /// With AF_XDP: the shelf.slot pairs the XDP program steers to our
    /// sockets, kept equal to `exports` by live changes.
    xdp_keys: Option<XdpKeys>,
    counters: Counters,
    stats: Arc<AoeStats>,
    /// Recent requests by (source, tag) hash, to count repeats.
    recent: Box<[AtomicU64]>,
}

/// Slots of [`Interface::recent`].
const RECENT: usize = 4096;

/// An ATA read or write on its way through an export.
#[derive(Clone, Copy)]
struct AtaIo {
    op: Op,
    bytes: u64,
    start: Instant,
}

impl Interface {
    /// Make the XDP program take requests for exactly the exports now in
    /// the table. Should that fail, requests it does not take still reach
    /// the AF_PACKET companion and are answered.
    /// The map read back is logged.
    fn steer_exports(&self) {
        let Some(keys) = &self.xdp_keys else { return };
        let want: Vec<u32> = self.exports.load().iter().map(|s| xdp_match::address_key(s.cfg.shelf, s.cfg.slot)).collect();
        match keys.set(&want).and_then(|()| keys.get()) {
            Ok(now) => {
                let names: Vec<String> = now.iter().map(|k| format!("e{}.{}", k >> 16, (k >> 8) & 0xFF)).collect();
                log::info!("aoe {}: AF_XDP takes requests for [{}]", self.name, names.join(", "));
            }
            Err(e) => log::warn!("aoe {}: the XDP program's export map: {e} (requests go through AF_PACKET instead)", self.name),
        }
    }

    /// Room for the longest reply any export here can send (the same for
    /// every export on the interface: it follows from the MTU).
    fn reply_len(&self) -> usize {
        self.exports.load().iter().map(|e| e.export.reply_buffer_len()).max().unwrap_or(1514)
    }

    fn note_no_reply(&self, why: impl std::fmt::Debug) {
        self.counters.ignored.fetch_add(1, Relaxed);
        log::trace!("aoe {}: no reply: {why:?}", self.name);
    }

    /// For the metrics, once per request frame: whether it is an ATA read
    /// or write, and whether its (source, tag) came recently (a resend
    /// under the same tag; initiators that give each resend a fresh tag,
    /// as Linux's and ours do, are not seen).
    fn classify(&self, frame: &[u8]) -> Option<AtaIo> {
        let h = AoeHeader::parse(frame).ok().filter(|h| !h.is_response())?;
        let src = h.src().iter().fold(0u64, |k, &b| k << 8 | b as u64);
        let key = (src ^ (h.tag() as u64) << 16 ^ (h.tag() as u64) >> 16).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        if self.recent[(key >> 52) as usize % RECENT].swap(key, Relaxed) == key {
            self.stats.retransmits.fetch_add(1, Relaxed);
        }
        if h.command() != Command::Ata {
            return None;
        }
        let a = AtaArg::parse(frame).ok()?;
        let op = match a.cmd_status {
            ata::CMD_READ_SECTORS | ata::CMD_READ_SECTORS_EXT => Op::Read,
            ata::CMD_WRITE_SECTORS | ata::CMD_WRITE_SECTORS_EXT => Op::Write,
            _ => return None,
        };
        Some(AtaIo { op, bytes: a.sector_count as u64 * bw_aoe::SECTOR as u64, start: Instant::now() })
    }

    /// Hand `frame` to export `s`; an ATA read or write (`io`) it answers
    /// is counted for its volume.
    fn handle(&self, s: &Served, frame: &[u8], io: Option<AtaIo>, out: &mut [u8]) -> Outcome {
        let r = s.export.handle(frame, self.mac, out);
        if let (Some(io), Outcome::Reply(len)) = (io, r) {
            let reply = &out[..len];
            let failed = AoeHeader::parse(reply).is_ok_and(|h| h.is_error()) || AtaArg::parse(reply).is_ok_and(|a| a.failed());
            let ns = io.start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
            s.volume_stats.record(io.op, io.bytes, !failed, ns);
        }
        r
    }
}

/// The running AoE front-end's side for live changes.
#[derive(Clone)]
pub struct Handle {
    interfaces: Arc<Vec<Arc<Interface>>>,
}

impl Handle {
    /// The interfaces serve listens on.
    pub fn interfaces(&self) -> Vec<String> {
        self.interfaces.iter().map(|i| i.name.clone()).collect()
    }

    /// The exports being served: (interface, shelf, slot, volume).
    pub fn exports(&self) -> Vec<(String, u16, u8, String)> {
        let mut v = Vec::new();
        for i in self.interfaces.iter() {
            v.extend(i.exports.load().iter().map(|s| (i.name.clone(), s.cfg.shelf, s.cfg.slot, s.cfg.volume.clone())));
        }
        v
    }

    /// Serve `cfg`'s exports: an export whose settings are unchanged stays
    /// as it is (its config string and reservations with it), the others
    /// are built anew or dropped; frames for a dropped one go unanswered,
    /// as for any unknown shelf.slot. Every export must be on an interface
    /// served already; nothing changes otherwise. Returns what changed.
    pub fn reconcile(&self, cfg: &AoeConfig, volumes: &Volumes) -> anyhow::Result<Vec<String>> {
        if let Some(e) = cfg.exports.iter().find(|e| !self.interfaces.iter().any(|i| i.name == e.interface)) {
            anyhow::bail!("{}", not_served(&e.interface, &self.interfaces()));
        }
        let mut tables = Vec::new();
        let mut log = Vec::new();
        for ifc in self.interfaces.iter() {
            let old = ifc.exports.load();
            let mut table = Vec::new();
            let mut changed = false;
            for e in cfg.exports.iter().filter(|e| e.interface == ifc.name) {
                match old.iter().find(|s| s.cfg == *e) {
                    Some(s) => table.push(s.clone()),
                    None => {
                        table.push(Arc::new(build_export(&ifc.name, e, volumes, ifc.link)?));
                        log.push(format!("AoE e{}.{} on {}: added (volume {})", e.shelf, e.slot, ifc.name, e.volume));
                        changed = true;
                    }
                }
            }
            for s in old.iter().filter(|s| !table.iter().any(|t| Arc::ptr_eq(s, t))) {
                log.push(format!("AoE e{}.{} on {}: removed (volume {})", s.cfg.shelf, s.cfg.slot, ifc.name, s.cfg.volume));
                changed = true;
            }
            if changed {
                tables.push((ifc, table));
            }
        }
        for (ifc, table) in tables {
            ifc.exports.store(Arc::new(table));
            ifc.steer_exports();
        }
        Ok(log)
    }
}

impl Handle {
    /// Interfaces with no sockets or workers, for tests of live changes
    /// (bw-control's).
    pub fn detached(names: &[&str]) -> Handle {
        let link = Link { mtu: 1500, max_sectors: max_sectors_for_mtu(1500), capacity: 16, workers: 1 };
        Handle { interfaces: Arc::new(names.iter().map(|n| Arc::new(Interface::new(n, [2, 0, 0, 0, 0, 1], link, Vec::new()))).collect()) }
    }
}

/// The front-end's name.
pub const NAME: &str = "aoe";

/// AoE as the control plane sees it: the running front-end, or none (no
/// export at start). AoE has no sessions and no path states.
pub struct AoeFrontend(pub Option<Handle>);

impl AoeFrontend {
    fn served(&self) -> Vec<String> {
        self.0.as_ref().map(Handle::interfaces).unwrap_or_default()
    }
}

impl Frontend for AoeFrontend {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Each interface's sockets and workers are set up at start: an
    /// export can be added on an interface that had one then.
    fn admit(&self, _old: &ServeConfig, new: &ServeConfig) -> Result<(), Refused> {
        let served = self.served();
        match new.aoe.iter().flat_map(|a| &a.exports).find(|e| !served.contains(&e.interface)) {
            Some(e) => Err(Refused::NeedsRestart(not_served(&e.interface, &served))),
            None => Ok(()),
        }
    }

    fn reconcile(&self, new: &ServeConfig, volumes: &Volumes, _resized: &std::collections::HashSet<String>) -> Result<Vec<String>, Refused> {
        match &self.0 {
            Some(h) => h.reconcile(&new.aoe.clone().unwrap_or_default(), volumes).map_err(failed),
            None => Ok(Vec::new()),
        }
    }
}

/// Why an export on `iface` cannot be added while serving.
pub fn not_served(iface: &str, served: &[String]) -> String {
    let on = if served.is_empty() { "no interface".to_string() } else { served.join(", ") };
    format!(
        "AoE is not served on {iface} (serve opened its sockets at start on {on}): restart blockwire serve to export there"
    )
}

pub async fn start(cfg: &AoeConfig, tuning: &Tuning, volumes: &Volumes, mut shutdown: Shutdown) -> anyhow::Result<(Running, Handle)> {
    let mut by_iface: BTreeMap<&str, Vec<&AoeExport>> = BTreeMap::new();
    for e in &cfg.exports {
        by_iface.entry(e.interface.as_str()).or_default().push(e);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    let mut interfaces = Vec::new();
    let fanout = fanout_mode(tuning.aoe_fanout);
    for (n, (iface, exports)) in by_iface.into_iter().enumerate() {
        let memory_backed = exports.iter().all(|e| volumes.get(&e.volume).is_some_and(|v| v.info().memory_backed));
        let remote = exports.iter().any(|e| volumes.get(&e.volume).is_some_and(|v| v.info().remote));
        let io_threads = match tuning.aoe_io_threads {
            _ if memory_backed => 0,
            0 if remote => REMOTE_IO_THREADS,
            n => n,
        };
        let workers = workers(tuning.aoe_workers, memory_backed, io_threads);
        let (ifc, sockets, companion) = open_interface(iface, &exports, volumes, workers, fanout, n, tuning.aoe_datapath)?;
        let ifc = Arc::new(ifc);
        let sockets: Vec<Arc<FrameSocket>> = sockets.into_iter().map(Arc::new).collect();
        let pool = if io_threads == 0 { None } else { Some(IoPool::start(io_threads, &sockets[0], &ifc, &mut threads)?) };
        // Workers share the sockets round robin; the AF_PACKET companion of
        // AF_XDP sockets gets a thread of its own, last.
        let companion = companion.map(Arc::new);
        let socket_of = |w: usize| match &companion {
            Some(c) if w == ifc.link.workers => c.clone(),
            _ => sockets[w % sockets.len()].clone(),
        };
        for w in 0..ifc.link.workers + companion.is_some() as usize {
            let sock = socket_of(w);
            let ifc = ifc.clone();
            let stop = stop.clone();
            let pool = pool.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("aoe-{}-{w}", ifc.name))
                    .spawn(move || {
                        if fanout == FanoutMode::Cpu {
                            pin_to_cpu(w);
                        }
                        worker(&sock, &ifc, &stop, pool.as_ref())
                    })
                    .context("spawn AoE worker")?,
            );
        }
        interfaces.push(ifc);
    }
    let handle = Handle { interfaces: Arc::new(interfaces.clone()) };
    let running = tokio::spawn(async move {
        shutdown.wait().await;
        stop.store(true, Relaxed);
        tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await?;
        for i in &interfaces {
            let c = &i.counters;
            log::info!(
                "aoe {}: {} frames ({} through AF_XDP) in {} batches, {} replies, {} ignored, {} socket errors, {} dropped (socket full)",
                i.name,
                c.frames.load(Relaxed),
                c.xdp_frames.load(Relaxed),
                c.batches.load(Relaxed),
                c.replies.load(Relaxed),
                c.ignored.load(Relaxed),
                c.errors.load(Relaxed),
                c.drops.load(Relaxed)
            );
        }
        Ok(())
    });
    Ok((running, handle))
}

/// The AoE frames an AF_XDP target takes: requests addressed to a
/// shelf.slot it exports (the program's key set, [`Interface::steer_exports`]).
/// Everything else goes on to the stack: replies, for initiators on the
/// interface; requests for other targets' shelf.slot, for vblade or another
/// blockwire there; and broadcast and wildcard queries (shelf 0xffff or
/// slot 0xff), which every target must see, answered here by the AF_PACKET
/// companion socket (the program can steer a frame to one socket only).
fn request_filter(exports: &[&AoeExport]) -> XdpFilter {
    XdpFilter {
        byte: Some((xdp_match::FLAGS_OFFSET, FLAG_RESPONSE, 0)),
        word: None,
        key: Some((xdp_match::ADDRESS_OFFSET, xdp_match::ADDRESS_MASK)),
        keys: exports.iter().map(|e| xdp_match::address_key(e.shelf, e.slot)).collect(),
    }
}

/// `workers` AF_PACKET sockets in one fanout group (with PACKET_MMAP
/// rings if `rings`), and the frames their receive buffers or rings can
/// hold queued.
fn open_packet_sockets(
    iface: &str,
    workers: usize,
    fanout: FanoutMode,
    group_offset: usize,
    rings: bool,
) -> anyhow::Result<(Vec<FrameSocket>, usize)> {
    let mut sockets = Vec::with_capacity(workers);
    // Fanout group ids are per network namespace: derive one from our pid
    // so two blockwire processes never share a group.
    let group = (std::process::id() as u16).wrapping_mul(7).wrapping_add(group_offset as u16);
    let mut queued = 0usize;
    let fanout_failed = || format!("PACKET_FANOUT on {iface}");
    for _ in 0..workers {
        // The socket and the frames it holds queued.
        let (s, holds) = if rings {
            let s = RingSocket::open(iface, ETHERTYPE_AOE).context("AoE (aoe_datapath = \"mmap\")")?;
            s.join_fanout(group, fanout).with_context(fanout_failed)?;
            let holds = s.rx_capacity();
            (FrameSocket::Mmap(Box::new(s)), holds)
        } else {
            let s = PacketSocket::open(iface, ETHERTYPE_AOE).context("AoE")?;
            let granted = s.set_buffer_sizes(SOCKET_BUFFER, SOCKET_BUFFER)?;
            s.join_fanout(group, fanout).with_context(fanout_failed)?;
            let holds = granted / frame_truesize(s.mtu());
            (FrameSocket::Packet(s), holds)
        };
        s.set_recv_timeout(POLL)?;
        queued += holds;
        sockets.push(s);
    }
    Ok((sockets, queued))
}

/// Open the worker sockets of one interface and build its exports. With
/// AF_XDP there is one socket per receive queue, and `workers` threads
/// share them (a socket's rings are taken under a lock, so several threads
/// may receive from one: a worker waiting for a disk leaves the ring to
/// the others), plus one AF_PACKET socket (the third value) for requests
/// that reach the stack instead (generic XDP skips frames act_mirred
/// re-injects; a queue may have no socket): a safeguard, idle when all
/// goes through XDP. With AF_PACKET each worker has its own socket.
fn open_interface(
    iface: &str,
    exports: &[&AoeExport],
    volumes: &Volumes,
    workers: usize,
    fanout: FanoutMode,
    group_offset: usize,
    datapath: Datapath,
) -> anyhow::Result<(Interface, Vec<FrameSocket>, Option<FrameSocket>)> {
    let chosen = frames::choose(iface, ETHERTYPE_AOE, datapath, request_filter(exports))
        .with_context(|| format!("AoE on {iface}: AF_XDP (aoe_datapath = \"xdp\")"))?;
    let mut xdp_keys = None;
    let (sockets, queued, companion) = match chosen {
        Chosen::Xdp(socks) => {
            xdp_keys = Some(socks[0].keys());
            let mut queued = 0;
            let mut sockets = Vec::with_capacity(socks.len());
            for s in socks {
                s.set_recv_timeout(POLL)?;
                queued += s.rx_capacity();
                sockets.push(FrameSocket::Xdp(Box::new(s)));
            }
            let (mut companion, _) = open_packet_sockets(iface, 1, fanout, group_offset, false)?;
            (sockets, queued, companion.pop())
        }
        Chosen::Packet { why } => {
            if let Some(why) = why {
                log::info!("aoe {iface}: AF_XDP not used, AF_PACKET instead: {why}");
            }
            let (sockets, queued) = open_packet_sockets(iface, workers, fanout, group_offset, false)?;
            (sockets, queued, None)
        }
        Chosen::Mmap => {
            let (sockets, queued) = open_packet_sockets(iface, workers, fanout, group_offset, true)?;
            (sockets, queued, None)
        }
    };
    let workers = workers.max(sockets.len());
    log::info!(
        "aoe {iface}: datapath {} ({}), {} sockets{}",
        sockets[0].datapath(),
        sockets[0].describe(),
        sockets.len(),
        if companion.is_some() { ", and AF_PACKET for frames XDP does not see" } else { "" }
    );
    let mtu = sockets[0].mtu();
    let mac = sockets[0].mac();
    let max_sectors = max_sectors_for_mtu(mtu);
    if max_sectors == 0 {
        anyhow::bail!("interface {iface} has MTU {mtu}: too small for one 512-byte sector per AoE frame");
    }
    // What the sockets can really hold queued, plus what the workers hold in hand.
    let capacity = (queued + workers * BATCH).min(MAX_ADVERTISED_BUFFERS);
    let link = Link { mtu, max_sectors, capacity, workers };
    let mut built = Vec::new();
    for e in exports {
        built.push(Arc::new(build_export(iface, e, volumes, link)?));
    }
    let mut ifc = Interface::new(iface, mac, link, built);
    ifc.xdp_keys = xdp_keys;
    ifc.steer_exports();
    Ok((ifc, sockets, companion))
}

impl Interface {
    fn new(name: &str, mac: [u8; 6], link: Link, exports: Vec<Arc<Served>>) -> Interface {
        Interface {
            name: name.to_string(),
            mac,
            link,
            exports: ArcSwap::from_pointee(exports),
            xdp_keys: None,
            counters: Counters::default(),
            stats: metrics::global().aoe(name),
            recent: (0..RECENT).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

/// Export `e` on `iface`, whose sockets are described by `link`.
fn build_export(iface: &str, e: &AoeExport, volumes: &Volumes, link: Link) -> anyhow::Result<Served> {
    let Link { mtu, max_sectors, capacity, workers } = link;
    let volume = volumes
        .get(&e.volume)
        .with_context(|| format!("AoE export {}.{} names unknown volume {}", e.shelf, e.slot, e.volume))?
        .clone();
    let buffer_count = match e.buffers {
        Some(b) => {
            if b as usize > capacity {
                log::warn!("aoe {iface} e{}.{}: buffers={b} is more than the {capacity} frames the sockets can queue", e.shelf, e.slot);
            }
            b
        }
        None => capacity as u16,
    };
    log::info!(
        "aoe: volume {} as e{}.{} on {iface} (MTU {mtu}, {max_sectors} sectors/frame, {buffer_count} buffers, {workers} workers{}{}{})",
        e.volume,
        e.shelf,
        e.slot,
        if volume.read_only() { ", read-only" } else { "" },
        if e.allow.is_empty() { String::new() } else { format!(", {} stations allowed", e.allow.len()) },
        if e.broadcast_writes { ", broadcast writes on" } else { "" }
    );
    let export = Export::new(
        ExportSettings {
            shelf: e.shelf,
            slot: e.slot,
            config_string: e.config_string.as_bytes().to_vec(),
            buffer_count,
            max_sectors,
            allow: e.allow.clone(),
            broadcast_writes: e.broadcast_writes,
        },
        volume,
    );
    Ok(Served { export, volume_stats: metrics::global().volume(&e.volume, Proto::Aoe), cfg: e.clone() })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A request frame on its way to an I/O pool thread.
struct Job {
    buf: Vec<u8>,
    len: usize,
}

/// The receive workers' end of a device-backed interface's I/O pool.
#[derive(Clone)]
struct IoPool {
    jobs: mpsc::SyncSender<Job>,
    /// Recycled frame buffers: nothing is allocated per frame, and a busy
    /// pool makes the receive workers wait (the socket queue absorbs the rest).
    free: Arc<Mutex<mpsc::Receiver<Vec<u8>>>>,
}

impl IoPool {
    /// Start the pool threads; they end once every receive worker (holding
    /// the job senders) has.
    fn start(n: usize, sock: &Arc<FrameSocket>, ifc: &Arc<Interface>, threads: &mut Vec<JoinHandle<()>>) -> anyhow::Result<IoPool> {
        let frame_len = sock.mtu() + 18;
        let (jobs, job_rx) = mpsc::sync_channel::<Job>(2 * n);
        let (free_tx, free) = mpsc::sync_channel::<Vec<u8>>(2 * n);
        for _ in 0..2 * n {
            free_tx.send(vec![0u8; frame_len]).expect("receiver is alive");
        }
        let job_rx = Arc::new(Mutex::new(job_rx));
        for t in 0..n {
            let (sock, ifc, job_rx, free_tx) = (sock.clone(), ifc.clone(), job_rx.clone(), free_tx.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("aoe-{}-io{t}", ifc.name))
                    .spawn(move || io_thread(&sock, &ifc, &job_rx, &free_tx))
                    .context("spawn AoE I/O thread")?,
            );
        }
        log::info!("aoe {}: {n} I/O threads for device-backed exports", ifc.name);
        Ok(IoPool { jobs, free: Arc::new(Mutex::new(free)) })
    }

    fn submit(&self, frame: &[u8]) {
        let Ok(mut buf) = lock(&self.free).recv() else { return };
        let len = frame.len().min(buf.len());
        buf[..len].copy_from_slice(&frame[..len]);
        let _ = self.jobs.send(Job { buf, len });
    }
}

fn io_thread(sock: &FrameSocket, ifc: &Interface, jobs: &Mutex<mpsc::Receiver<Job>>, free: &mpsc::SyncSender<Vec<u8>>) {
    let mut reply = vec![0u8; ifc.reply_len()];
    let c = &ifc.counters;
    loop {
        let job = match lock(jobs).recv() {
            Ok(j) => j,
            Err(_) => return, // every receive worker has stopped
        };
        let frame = &job.buf[..job.len];
        let io = ifc.classify(frame);
        for s in ifc.exports.load().iter() {
            match ifc.handle(s, frame, io, &mut reply) {
                Outcome::Reply(len) => match sock.send(&reply[..len]) {
                    Ok(()) => {
                        c.replies.fetch_add(1, Relaxed);
                        ifc.stats.frames_sent.fetch_add(1, Relaxed);
                    }
                    Err(err) => {
                        c.errors.fetch_add(1, Relaxed);
                        log::error!("aoe {}: send failed: {err}", ifc.name);
                    }
                },
                Outcome::NoReply(why) => ifc.note_no_reply(why),
            }
        }
        let _ = free.send(job.buf);
    }
}

/// An interface's exports as loaded for one frame.
type ExportsGuard = arc_swap::Guard<Arc<Vec<Arc<Served>>>>;

fn worker(sock: &FrameSocket, ifc: &Interface, stop: &AtomicBool, pool: Option<&IoPool>) {
    // VLAN-tagged frames can be 4 bytes longer than MTU + 14.
    let mut rx = FrameBatch::new(BATCH, sock.mtu() + 18);
    // A broadcast may draw one reply per export.
    let reply_len = ifc.reply_len();
    let mut tx = FrameBatch::new(BATCH * ifc.exports.load().len().max(1), reply_len);
    let c = &ifc.counters;
    while !stop.load(Relaxed) {
        let n = match sock.recv_batch(&mut rx) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted) => continue,
            Err(e) => {
                c.errors.fetch_add(1, Relaxed);
                log::error!("aoe {}: receive failed: {e}", ifc.name);
                std::thread::sleep(POLL);
                continue;
            }
        };
        c.batches.fetch_add(1, Relaxed);
        c.frames.fetch_add(n as u64, Relaxed);
        if sock.datapath() == Datapath::Xdp {
            c.xdp_frames.fetch_add(n as u64, Relaxed);
        }
        ifc.stats.frames_received.fetch_add(n as u64, Relaxed);
        if let Some(pool) = pool {
            for i in 0..n {
                pool.submit(rx.frame(i));
            }
            continue;
        }
        // Each frame goes to every export (a broadcast may draw one reply
        // from each); replies are built where they are sent from (AF_XDP:
        // straight in its transmit slots), one at a time as asked for.
        let mut next = 0;
        // The frame being answered: its index, its class, the exports as
        // loaded for it, and the next of them to hand it to.
        let mut current: Option<(usize, Option<AtaIo>, ExportsGuard, usize)> = None;
        let build = |out: &mut [u8]| loop {
            match &mut current {
                Some((i, io, exports, j)) if *j < exports.len() => {
                    let s = &exports[*j];
                    *j += 1;
                    match ifc.handle(s, rx.frame(*i), *io, out) {
                        Outcome::Reply(len) => return Some(len),
                        Outcome::NoReply(why) => ifc.note_no_reply(why),
                    }
                }
                _ => {
                    if next == n {
                        return None;
                    }
                    let frame = rx.frame(next);
                    current = Some((next, ifc.classify(frame), ifc.exports.load(), 0));
                    next += 1;
                }
            }
        };
        send_replies(sock, ifc, &mut tx, build);
    }
    if let Ok((_, drops)) = sock.take_statistics() {
        c.drops.fetch_add(drops, Relaxed);
    }
}

/// Send the replies `build` makes (AF_PACKET: in `tx`).
fn send_replies(sock: &FrameSocket, ifc: &Interface, tx: &mut FrameBatch, build: impl FnMut(&mut [u8]) -> Option<usize>) {
    let c = &ifc.counters;
    match sock.send_built(tx, build) {
        Ok(sent) => {
            c.replies.fetch_add(sent as u64, Relaxed);
            ifc.stats.frames_sent.fetch_add(sent as u64, Relaxed);
        }
        Err(e) => {
            c.errors.fetch_add(1, Relaxed);
            log::error!("aoe {}: send failed: {e}", ifc.name);
        }
    }
}
