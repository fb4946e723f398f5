//! Counters for `--metrics ADDR:PORT`, and their Prometheus text exposition.
//!
//! What a read or write pays (the front-ends count each command once, where
//! its response is queued; see [`Meter`]): two monotonic clock reads
//! (`Instant::now`, a vDSO call), a binary search over 18 bucket bounds,
//! and four `fetch_add(Relaxed)` on the counters of its volume and
//! protocol (operations, bytes, latency sum, one histogram bucket; a fifth
//! for an error). No lock and no allocation: each connection looks its
//! volume's counters up in its own short list, taking the registry's lock
//! only the first time it meets a volume. Counters of one volume and
//! protocol are shared by all its connections (one cache line per
//! direction), so connections on different CPUs hitting one volume bounce
//! that line; per-connection counters would avoid it but need folding in
//! when connections end.
//!
//! Histograms are fixed buckets of atomics, made cumulative at scrape time
//! (Prometheus wants `le` buckets). hdrhistogram is not used here: recording
//! into one needs `&mut`, so a lock or per-thread copies per histogram.
//! Hand-written rather than `prometheus-client`, whose histograms take a
//! lock per observation and whose label families look labels up per call.
//!
//! Label values are bounded: volumes and targets come from the
//! configuration; initiator names (which anyone who connects chooses) are
//! kept for the first [`INITIATOR_CAP`] distinct names and counted as
//! `other` after that.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

/// Distinct initiator names used as label values; later ones are `other`.
pub const INITIATOR_CAP: usize = 64;
/// The label value for initiators past the cap.
pub const OTHER: &str = "other";

/// Upper bounds of the latency buckets, in nanoseconds (1 µs, a read from
/// RAM on the connection's thread, to 1 s; the last bucket, +Inf, holds
/// the rest).
pub const LATENCY_BOUNDS_NS: [u64; 18] = [
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    1_000_000_000,
];
const BUCKETS: usize = LATENCY_BOUNDS_NS.len() + 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    Aoe,
    Iscsi,
    Nvme,
}

impl Proto {
    pub const ALL: [Proto; 3] = [Proto::Aoe, Proto::Iscsi, Proto::Nvme];
    pub fn label(self) -> &'static str {
        match self {
            Proto::Aoe => "aoe",
            Proto::Iscsi => "iscsi",
            Proto::Nvme => "nvme-tcp",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
}

impl Op {
    fn label(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }
}

/// One direction's counters; a cache line of its own.
#[repr(align(64))]
#[derive(Default)]
struct OpCounters {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    latency_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

/// What [`OpCounters`] held at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct OpSnapshot {
    pub ops: u64,
    pub bytes: u64,
    pub errors: u64,
    pub latency_ns_sum: u64,
    /// Per bucket (not cumulative), bounds [`LATENCY_BOUNDS_NS`] then +Inf.
    pub buckets: Vec<u64>,
}

impl OpCounters {
    fn snapshot(&self) -> OpSnapshot {
        OpSnapshot {
            ops: self.ops.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            errors: self.errors.load(Relaxed),
            latency_ns_sum: self.latency_ns.load(Relaxed),
            buckets: self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
        }
    }
}

/// The counters of one volume served over one protocol.
pub struct VolumeStats {
    volume: String,
    proto: Proto,
    ops: [OpCounters; 2],
}

impl VolumeStats {
    /// Count one finished read or write.
    #[inline]
    pub fn record(&self, op: Op, bytes: u64, ok: bool, elapsed_ns: u64) {
        self.record_n(op, 1, bytes, ok, elapsed_ns);
    }

    /// Count `n` finished reads or writes alike (same operation, outcome
    /// and time taken) carrying `bytes` in all: the counters end as after
    /// `n` calls of [`VolumeStats::record`], with four atomic additions
    /// instead of 4n (a receive batch's I/Os share their start and end).
    #[inline]
    pub fn record_n(&self, op: Op, n: u64, bytes: u64, ok: bool, elapsed_ns: u64) {
        let c = &self.ops[op as usize];
        c.ops.fetch_add(n, Relaxed);
        if ok {
            c.bytes.fetch_add(bytes, Relaxed);
        } else {
            c.errors.fetch_add(n, Relaxed);
        }
        c.latency_ns.fetch_add(elapsed_ns.saturating_mul(n), Relaxed);
        c.buckets[LATENCY_BOUNDS_NS.partition_point(|&b| b < elapsed_ns)].fetch_add(n, Relaxed);
    }
}

/// A read or write under way: where its counters are and when it began.
#[derive(Debug, Clone, Copy)]
pub struct IoTimer {
    slot: usize,
    op: Op,
    bytes: u32,
    start: Instant,
}

/// One connection's (or AoE interface's) way to its volumes' counters.
pub struct Meter {
    proto: Proto,
    metrics: &'static Metrics,
    seen: Vec<Arc<VolumeStats>>,
    /// I/Os whose answers are queued, timed at the next [`Meter::flush`].
    ended: Vec<(IoTimer, bool)>,
}

impl Meter {
    pub fn new(proto: Proto) -> Meter {
        Meter::with(global(), proto)
    }

    pub fn with(metrics: &'static Metrics, proto: Proto) -> Meter {
        Meter { proto, metrics, seen: Vec::new(), ended: Vec::new() }
    }

    /// A read or write of `bytes` on `volume` begins now.
    #[inline]
    pub fn start(&mut self, volume: &str, op: Op, bytes: usize) -> IoTimer {
        self.start_at(volume, op, bytes, Instant::now())
    }

    /// A read or write of `bytes` on `volume` began at `at`: the TCP
    /// front-ends pass the instant they took the batch of PDUs it came in
    /// (one clock read per batch instead of one per command).
    #[inline]
    pub fn start_at(&mut self, volume: &str, op: Op, bytes: usize, at: Instant) -> IoTimer {
        let slot = match self.seen.iter().position(|s| s.volume == volume) {
            Some(i) => i,
            None => {
                self.seen.push(self.metrics.volume(volume, self.proto));
                self.seen.len() - 1
            }
        };
        IoTimer { slot, op, bytes: bytes.min(u32::MAX as usize) as u32, start: at }
    }

    /// The I/O `t` has its answer queued; it is timed and counted at the
    /// next [`Meter::flush`], which a TCP front-end calls as it sends the
    /// batch: one clock read for all the I/Os of a batch instead of one
    /// each (with the batch's start from [`Meter::start_at`], none per
    /// I/O).
    #[inline]
    pub fn done_later(&mut self, t: IoTimer, ok: bool) {
        self.ended.push((t, ok));
    }

    /// Time and count the I/Os [`Meter::done_later`] left, now.
    pub fn flush(&mut self) {
        if self.ended.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut ended = std::mem::take(&mut self.ended);
        // The I/Os of a receive batch share its start (`start_at`): one
        // clock subtraction for each run of them, not one per I/O, and a
        // run of alike ones (same volume, operation, start and outcome:
        // a QD32 burst of 4 KiB writes) is counted with one addition per
        // counter (`record_n`), not one per I/O (four locked additions
        // each, 64 instructions per NVMe/TCP write:
        // docs/notes/2026-11-27-h51t-nvme-target.md).
        let mut run: Option<(IoTimer, bool, u64, u64)> = None;
        for (t, ok) in ended.drain(..) {
            if let Some((r, rok, n, bytes)) = run.as_mut() {
                if (r.slot, r.op, r.start, *rok) == (t.slot, t.op, t.start, ok) {
                    *n += 1;
                    *bytes += t.bytes as u64;
                    continue;
                }
            }
            if let Some(r) = run.take() {
                self.record_run(r, now);
            }
            run = Some((t, ok, 1, t.bytes as u64));
        }
        if let Some(r) = run {
            self.record_run(r, now);
        }
        self.ended = ended;
    }

    /// Count a run of alike I/Os of [`Meter::flush`]: `(first, ok, n, bytes)`.
    fn record_run(&self, (t, ok, n, bytes): (IoTimer, bool, u64, u64), now: Instant) {
        self.seen[t.slot].record_n(t.op, n, bytes, ok, elapsed_ns(t.start, now));
    }
}

/// Nanoseconds from `start` to `now` (0 if `now` is earlier).
fn elapsed_ns(start: Instant, now: Instant) -> u64 {
    now.saturating_duration_since(start).as_nanos().min(u64::MAX as u128) as u64
}

/// Logins and sessions of one target (iSCSI target, NVMe subsystem).
#[derive(Default)]
struct TargetStats {
    sessions: AtomicI64,
    connections: AtomicI64,
    /// By initiator label.
    logins: Mutex<BTreeMap<String, u64>>,
    auth_failures: Mutex<BTreeMap<String, u64>>,
}

/// Frames of one AoE interface.
#[derive(Default)]
pub struct AoeStats {
    pub frames_received: AtomicU64,
    pub frames_sent: AtomicU64,
    /// Requests seen again with the same source and tag (see `aoe.rs`).
    pub retransmits: AtomicU64,
}

/// A connection counted while this lives.
pub struct ConnectionGuard {
    gauge: &'static AtomicI64,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.gauge.fetch_sub(1, Relaxed);
    }
}

/// A session (or target connection) counted while this lives.
pub struct SessionGuard {
    target: Arc<TargetStats>,
    session: bool,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.target.connections.fetch_sub(1, Relaxed);
        if self.session {
            self.target.sessions.fetch_sub(1, Relaxed);
        }
    }
}

/// Every counter of the process.
pub struct Metrics {
    volumes: Mutex<Vec<Arc<VolumeStats>>>,
    targets: Mutex<BTreeMap<(Proto, String), Arc<TargetStats>>>,
    initiators: Mutex<BTreeSet<String>>,
    aoe: Mutex<BTreeMap<String, Arc<AoeStats>>>,
    connections: [AtomicI64; 3],
    connections_total: [AtomicU64; 3],
    /// NVMe/TCP connections over TLS open, by record layer (kernel, user).
    tls: [AtomicI64; 2],
    tls_total: [AtomicU64; 2],
    /// Connections refused before or during their TLS handshake.
    tls_refused: AtomicU64,
    /// The open volumes, by name: their QoS limits and what the limits
    /// held back are read from them at each scrape.
    open_volumes: Mutex<BTreeMap<String, bw_block::Volume>>,
}

/// An NVMe/TCP connection over TLS, counted by record layer while this lives.
pub struct TlsGuard {
    gauge: &'static AtomicI64,
}

impl Drop for TlsGuard {
    fn drop(&mut self) {
        self.gauge.fetch_sub(1, Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's registry, which the front-ends count into.
pub fn global() -> &'static Metrics {
    static GLOBAL: OnceLock<Metrics> = OnceLock::new();
    GLOBAL.get_or_init(Metrics::new)
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            volumes: Mutex::default(),
            targets: Mutex::default(),
            initiators: Mutex::default(),
            aoe: Mutex::default(),
            connections: Default::default(),
            connections_total: Default::default(),
            tls: Default::default(),
            tls_total: Default::default(),
            tls_refused: AtomicU64::new(0),
            open_volumes: Mutex::default(),
        }
    }

    /// Report `volume`'s QoS (its limits, what they held back) until
    /// [`Metrics::forget_volume`].
    pub fn watch_volume(&self, volume: &bw_block::Volume) {
        lock(&self.open_volumes).insert(volume.name().to_string(), volume.clone());
    }

    /// An NVMe/TCP connection secured with its records kept by `layer`.
    pub fn tls_connection(&'static self, layer: bw_tls::RecordLayer) -> TlsGuard {
        let i = layer as usize;
        self.tls_total[i].fetch_add(1, Relaxed);
        self.tls[i].fetch_add(1, Relaxed);
        TlsGuard { gauge: &self.tls[i] }
    }

    /// A connection refused for TLS: a failed handshake, or plaintext on a
    /// TLS-only port.
    pub fn tls_refused(&self) {
        self.tls_refused.fetch_add(1, Relaxed);
    }

    /// The counters of `volume` over `proto`, made on first use.
    pub fn volume(&self, volume: &str, proto: Proto) -> Arc<VolumeStats> {
        let mut v = lock(&self.volumes);
        if let Some(s) = v.iter().find(|s| s.proto == proto && s.volume == volume) {
            return s.clone();
        }
        let s = Arc::new(VolumeStats { volume: volume.to_string(), proto, ops: Default::default() });
        v.push(s.clone());
        s
    }

    /// Drop a removed volume's series (connections still holding its
    /// counters keep counting into the detached copy).
    pub fn forget_volume(&self, volume: &str) {
        lock(&self.volumes).retain(|s| s.volume != volume);
        lock(&self.open_volumes).remove(volume);
    }

    /// The counters of AoE interface `iface`.
    pub fn aoe(&self, iface: &str) -> Arc<AoeStats> {
        lock(&self.aoe).entry(iface.to_string()).or_default().clone()
    }

    /// A TCP connection accepted by `proto`'s front-end, counted until the guard drops.
    pub fn connection(&'static self, proto: Proto) -> ConnectionGuard {
        self.connections_total[proto as usize].fetch_add(1, Relaxed);
        let gauge = &self.connections[proto as usize];
        gauge.fetch_add(1, Relaxed);
        ConnectionGuard { gauge }
    }

    fn target(&self, proto: Proto, target: &str) -> Arc<TargetStats> {
        lock(&self.targets).entry((proto, target.to_string())).or_default().clone()
    }

    /// `name` as a label value: itself while fewer than [`INITIATOR_CAP`]
    /// names have been seen, else [`OTHER`].
    pub fn initiator_label(&self, name: &str) -> String {
        let mut seen = lock(&self.initiators);
        if seen.contains(name) {
            return name.to_string();
        }
        if seen.len() >= INITIATOR_CAP {
            return OTHER.to_string();
        }
        seen.insert(name.to_string());
        name.to_string()
    }

    /// A login to `target` succeeded. `new_session`: it starts a session
    /// (an iSCSI login, an NVMe admin queue), not just another connection
    /// of one (an NVMe I/O queue). The session and connection count until
    /// the guard drops.
    pub fn login(&self, proto: Proto, target: &str, initiator: &str, new_session: bool) -> SessionGuard {
        let t = self.target(proto, target);
        let who = self.initiator_label(initiator);
        *lock(&t.logins).entry(who).or_default() += 1;
        t.connections.fetch_add(1, Relaxed);
        if new_session {
            t.sessions.fetch_add(1, Relaxed);
        }
        SessionGuard { target: t, session: new_session }
    }

    /// An initiator failed to authenticate (or was not authorized) to
    /// `target` (empty when it named no target we have).
    pub fn auth_failure(&self, proto: Proto, target: &str, initiator: &str) {
        let t = self.target(proto, target);
        let who = self.initiator_label(initiator);
        *lock(&t.auth_failures).entry(who).or_default() += 1;
    }

    /// What every counter holds now (for the exposition and for `status`).
    pub fn snapshot(&self) -> Snapshot {
        let mut volumes: Vec<VolumeSnapshot> = lock(&self.volumes)
            .iter()
            .map(|s| VolumeSnapshot {
                volume: s.volume.clone(),
                protocol: s.proto.label(),
                read: s.ops[0].snapshot(),
                write: s.ops[1].snapshot(),
            })
            .collect();
        volumes.sort_by(|a, b| (&a.volume, a.protocol).cmp(&(&b.volume, b.protocol)));
        let targets = lock(&self.targets)
            .iter()
            .map(|((p, name), t)| TargetSnapshot {
                protocol: p.label(),
                target: name.clone(),
                sessions: t.sessions.load(Relaxed),
                connections: t.connections.load(Relaxed),
                logins: lock(&t.logins).clone(),
                auth_failures: lock(&t.auth_failures).clone(),
            })
            .collect();
        let aoe = lock(&self.aoe)
            .iter()
            .map(|(name, a)| AoeSnapshot {
                interface: name.clone(),
                frames_received: a.frames_received.load(Relaxed),
                frames_sent: a.frames_sent.load(Relaxed),
                retransmits: a.retransmits.load(Relaxed),
            })
            .collect();
        let connections = Proto::ALL
            .iter()
            .filter(|&&p| p != Proto::Aoe)
            .map(|&p| ConnectionSnapshot {
                protocol: p.label(),
                open: self.connections[p as usize].load(Relaxed),
                total: self.connections_total[p as usize].load(Relaxed),
            })
            .collect();
        let tls = [bw_tls::RecordLayer::Kernel, bw_tls::RecordLayer::User]
            .into_iter()
            .map(|l| TlsSnapshot { record_layer: l.name(), open: self.tls[l as usize].load(Relaxed), total: self.tls_total[l as usize].load(Relaxed) })
            .collect();
        let qos = lock(&self.open_volumes).iter().map(|(name, v)| QosSnapshot { volume: name.clone(), limits: v.qos(), throttled: v.qos_throttled() }).collect();
        Snapshot { volumes, targets, aoe, connections, tls, tls_refused: self.tls_refused.load(Relaxed), qos, process: ProcessSnapshot::read() }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct VolumeSnapshot {
    pub volume: String,
    pub protocol: &'static str,
    pub read: OpSnapshot,
    pub write: OpSnapshot,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TargetSnapshot {
    pub protocol: &'static str,
    pub target: String,
    pub sessions: i64,
    pub connections: i64,
    /// By initiator label (capped, see [`INITIATOR_CAP`]).
    pub logins: BTreeMap<String, u64>,
    pub auth_failures: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct AoeSnapshot {
    pub interface: String,
    pub frames_received: u64,
    pub frames_sent: u64,
    pub retransmits: u64,
}

/// NVMe/TCP connections over TLS with one record layer.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TlsSnapshot {
    pub record_layer: &'static str,
    pub open: i64,
    pub total: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ConnectionSnapshot {
    pub protocol: &'static str,
    pub open: i64,
    pub total: u64,
}

/// The process's CPU time and memory, from /proc/self (zeros where unreadable).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ProcessSnapshot {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub open_fds: u64,
    pub threads: u64,
    pub start_time_seconds: f64,
}

impl ProcessSnapshot {
    pub fn read() -> ProcessSnapshot {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3 (state): field N is f[N - 3].
        let field = |n: usize| f.get(n - 3).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        // SAFETY: sysconf reads a constant.
        let (tick, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
        let (tick, page) = (tick.max(1) as f64, page.max(1) as u64);
        let boot = std::fs::read_to_string("/proc/stat")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse::<u64>().ok()))
            .unwrap_or(0);
        ProcessSnapshot {
            cpu_seconds: (field(14) + field(15)) as f64 / tick,
            resident_bytes: field(24) * page,
            virtual_bytes: field(23),
            threads: field(20),
            start_time_seconds: boot as f64 + field(22) as f64 / tick,
            open_fds: std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64),
        }
    }
}

/// Every counter at one moment; [`Snapshot::exposition`] renders it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Snapshot {
    pub volumes: Vec<VolumeSnapshot>,
    pub targets: Vec<TargetSnapshot>,
    pub aoe: Vec<AoeSnapshot>,
    pub connections: Vec<ConnectionSnapshot>,
    pub tls: Vec<TlsSnapshot>,
    pub tls_refused: u64,
    /// Every open volume's QoS, by name.
    pub qos: Vec<QosSnapshot>,
    pub process: ProcessSnapshot,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct QosSnapshot {
    pub volume: String,
    pub limits: bw_block::QosLimits,
    pub throttled: bw_block::QosThrottled,
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// Writes one metric family at a time: HELP and TYPE once, then samples.
struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                let _ = write!(self.out, "{}{k}=\"{}\"", if i > 0 { "," } else { "" }, escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// A metric family drawn from one field of each row: name, help, the field.
type Column<T, V> = (&'static str, &'static str, fn(&T) -> V);
/// The same for a per-initiator map.
type ByInitiator = (&'static str, &'static str, fn(&TargetSnapshot) -> &BTreeMap<String, u64>);

/// Seconds as Prometheus prints them.
fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

impl Snapshot {
    /// The Prometheus text exposition format (version 0.0.4): the families
    /// in the order scrapes have always shown them (volumes, their QoS,
    /// targets, connections, TLS, AoE, the process), each group written by
    /// a function of its own.
    pub fn exposition(&self) -> String {
        let mut out = String::with_capacity(4096 + self.volumes.len() * 4096);
        let mut f = Family { out: &mut out };
        self.volume_counters(&mut f);
        self.volume_latency(&mut f);
        self.volume_qos(&mut f);
        self.target_families(&mut f);
        self.connection_families(&mut f);
        self.tls_families(&mut f);
        self.aoe_families(&mut f);
        self.process.families(&mut f);
        out
    }

    /// Operations, bytes and errors per volume, protocol and direction.
    fn volume_counters(&self, f: &mut Family) {
        let counters: [Column<OpSnapshot, u64>; 3] = [
            ("blockwire_volume_operations_total", "Reads and writes finished, by volume, protocol and direction.", |o| o.ops),
            ("blockwire_volume_bytes_total", "Bytes read or written successfully.", |o| o.bytes),
            ("blockwire_volume_errors_total", "Reads and writes that failed.", |o| o.errors),
        ];
        for (name, help, get) in counters {
            f.head(name, "counter", help);
            for v in &self.volumes {
                for (op, o) in v.ops() {
                    f.sample(name, &[("volume", &v.volume), ("protocol", v.protocol), ("op", op.label())], get(o));
                }
            }
        }
    }

    /// The latency histogram: cumulative buckets, sum and count.
    fn volume_latency(&self, f: &mut Family) {
        let h = "blockwire_volume_latency_seconds";
        f.head(h, "histogram", "Time from a command's arrival at the front-end to its answer being queued.");
        for v in &self.volumes {
            for (op, o) in v.ops() {
                let base = [("volume", v.volume.as_str()), ("protocol", v.protocol), ("op", op.label())];
                let mut cumulative = 0;
                for (i, n) in o.buckets.iter().enumerate() {
                    cumulative += n;
                    let le = LATENCY_BOUNDS_NS.get(i).map_or("+Inf".to_string(), |&b| seconds(b).to_string());
                    let mut l = base.to_vec();
                    l.push(("le", &le));
                    f.sample(&format!("{h}_bucket"), &l, cumulative);
                }
                f.sample(&format!("{h}_sum"), &base, seconds(o.latency_ns_sum));
                f.sample(&format!("{h}_count"), &base, o.ops);
            }
        }
    }

    /// The limits set on each volume and what they held back.
    fn volume_qos(&self, f: &mut Family) {
        f.head("blockwire_volume_qos_limit", "gauge", "QoS limits set on a volume (bdev_set_qos_limit's names; per second, MiB for the mbytes ones); limits not set are absent.");
        for q in &self.qos {
            let l = &q.limits;
            for (limit, n) in [
                ("rw_ios_per_sec", l.rw_ios_per_sec),
                ("r_ios_per_sec", l.r_ios_per_sec),
                ("w_ios_per_sec", l.w_ios_per_sec),
                ("rw_mbytes_per_sec", l.rw_mbytes_per_sec),
                ("r_mbytes_per_sec", l.r_mbytes_per_sec),
                ("w_mbytes_per_sec", l.w_mbytes_per_sec),
            ] {
                if n != 0 {
                    f.sample("blockwire_volume_qos_limit", &[("volume", &q.volume), ("limit", limit)], n);
                }
            }
        }
        f.head("blockwire_volume_qos_delayed_total", "counter", "Reads and writes the volume's QoS limits held back (every protocol).");
        for q in &self.qos {
            for (i, op) in [Op::Read, Op::Write].into_iter().enumerate() {
                f.sample("blockwire_volume_qos_delayed_total", &[("volume", &q.volume), ("op", op.label())], q.throttled.delayed[i]);
            }
        }
        f.head("blockwire_volume_qos_delay_seconds_total", "counter", "Time the QoS limits held reads and writes back, summed over requests.");
        for q in &self.qos {
            for (i, op) in [Op::Read, Op::Write].into_iter().enumerate() {
                f.sample("blockwire_volume_qos_delay_seconds_total", &[("volume", &q.volume), ("op", op.label())], seconds(q.throttled.delay_ns[i]));
            }
        }
    }

    /// Sessions and connections per target, logins and refusals per initiator.
    fn target_families(&self, f: &mut Family) {
        let gauges: [Column<TargetSnapshot, i64>; 2] = [
            ("blockwire_target_sessions", "Sessions open (iSCSI sessions, NVMe/TCP controllers).", |t| t.sessions),
            ("blockwire_target_connections", "Logged-in connections (iSCSI connections, NVMe/TCP queues).", |t| t.connections),
        ];
        for (name, help, get) in gauges {
            f.head(name, "gauge", help);
            for t in &self.targets {
                f.sample(name, &[("protocol", t.protocol), ("target", &t.target)], get(t));
            }
        }
        let by_initiator: [ByInitiator; 2] = [
            ("blockwire_target_logins_total", "Successful logins (iSCSI logins, NVMe/TCP Connects), by initiator (capped; later names are \"other\").", |t| &t.logins),
            ("blockwire_target_auth_failures_total", "Logins refused for failed authentication or authorization, by initiator (capped).", |t| &t.auth_failures),
        ];
        for (name, help, get) in by_initiator {
            f.head(name, "counter", help);
            for t in &self.targets {
                for (who, n) in get(t) {
                    f.sample(name, &[("protocol", t.protocol), ("target", &t.target), ("initiator", who)], n);
                }
            }
        }
    }

    /// TCP connections per protocol, logged in or not.
    fn connection_families(&self, f: &mut Family) {
        f.head("blockwire_connections", "gauge", "TCP connections open, logged in or not.");
        for c in &self.connections {
            f.sample("blockwire_connections", &[("protocol", c.protocol)], c.open);
        }
        f.head("blockwire_connections_accepted_total", "counter", "TCP connections accepted.");
        for c in &self.connections {
            f.sample("blockwire_connections_accepted_total", &[("protocol", c.protocol)], c.total);
        }
    }

    /// NVMe/TCP over TLS: open, handshakes, refusals.
    fn tls_families(&self, f: &mut Family) {
        f.head("blockwire_tls_connections", "gauge", "NVMe/TCP connections over TLS open, by who keeps their records (ktls: the kernel, user: this process).");
        for t in &self.tls {
            f.sample("blockwire_tls_connections", &[("protocol", "nvme-tcp"), ("record_layer", t.record_layer)], t.open);
        }
        f.head("blockwire_tls_handshakes_total", "counter", "NVMe/TCP TLS handshakes completed, by record layer.");
        for t in &self.tls {
            f.sample("blockwire_tls_handshakes_total", &[("protocol", "nvme-tcp"), ("record_layer", t.record_layer)], t.total);
        }
        f.head("blockwire_tls_refused_total", "counter", "NVMe/TCP connections refused for TLS: failed handshakes, plaintext on TLS-required ports.");
        f.sample("blockwire_tls_refused_total", &[("protocol", "nvme-tcp")], self.tls_refused);
    }

    /// Frames per AoE interface.
    fn aoe_families(&self, f: &mut Family) {
        let aoe: [Column<AoeSnapshot, u64>; 3] = [
            ("blockwire_aoe_frames_received_total", "AoE frames received.", |a| a.frames_received),
            ("blockwire_aoe_frames_sent_total", "AoE replies sent.", |a| a.frames_sent),
            ("blockwire_aoe_retransmits_total", "AoE requests received again with the same source and tag.", |a| a.retransmits),
        ];
        for (name, help, get) in aoe {
            f.head(name, "counter", help);
            for a in &self.aoe {
                f.sample(name, &[("interface", &a.interface)], get(a));
            }
        }
    }
}

impl VolumeSnapshot {
    fn ops(&self) -> [(Op, &OpSnapshot); 2] {
        [(Op::Read, &self.read), (Op::Write, &self.write)]
    }
}

impl ProcessSnapshot {
    /// The standard `process_*` families, as Prometheus's client
    /// libraries name and describe them.
    fn families(&self, f: &mut Family) {
        let families: [(&str, &str, &str, &dyn std::fmt::Display); 6] = [
            ("process_cpu_seconds_total", "counter", "User and system CPU time spent in seconds.", &self.cpu_seconds),
            ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", &self.resident_bytes),
            ("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", &self.virtual_bytes),
            ("process_open_fds", "gauge", "Number of open file descriptors.", &self.open_fds),
            ("process_threads", "gauge", "Number of OS threads in the process.", &self.threads),
            ("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.", &self.start_time_seconds),
        ];
        for (name, kind, help, value) in families {
            f.head(name, kind, help);
            f.sample(name, &[], value);
        }
    }
}

/// The metrics endpoint's bounds: requests are small GETs; no client
/// authenticates, so every scrape is answered from the pending slots,
/// where a peer holds at most 4 and the oldest idle one goes for a new
/// connection (bw_http::admission): a flood of idle connections from one
/// address or many cannot keep Prometheus out.
const LIMITS: bw_http::Limits = bw_http::Limits {
    admission: bw_http::AdmissionLimits { pending: 16, per_peer: 4, authenticated: 1 },
    max_head: 16 * 1024,
    max_body: 0,
    head_timeout: std::time::Duration::from_secs(5),
    body_timeout: std::time::Duration::from_secs(5),
    send_timeout: std::time::Duration::from_secs(10),
};

/// `GET /metrics` (and `/`); anything else 404, other methods 405.
struct Scrapes(&'static Metrics);

impl bw_http::Endpoint for Scrapes {
    fn name(&self) -> &'static str {
        "metrics"
    }

    fn check(&self, head: &bw_http::Head, _: std::net::SocketAddr) -> bw_http::Verdict {
        match head.method.as_str() {
            "GET" | "HEAD" => bw_http::Verdict::Anonymous,
            _ => bw_http::Verdict::Refused(bw_http::Answer::new(405, "text/plain; charset=utf-8", "GET only\n")),
        }
    }

    fn answer(&self, head: &bw_http::Head, _: bytes::Bytes, _: std::net::SocketAddr) -> bw_http::Answer {
        match head.uri.path() {
            "/metrics" => bw_http::Answer::new(200, "text/plain; version=0.0.4; charset=utf-8", self.0.snapshot().exposition()),
            "/" => bw_http::Answer::new(200, "text/plain; charset=utf-8", "blockwire: metrics at /metrics\n"),
            _ => bw_http::Answer::new(404, "text/plain; charset=utf-8", "not found\n"),
        }
    }
}

/// Serve `GET /metrics` on `listener` until shutdown (one request per
/// connection: scrapers reconnect).
pub async fn serve_http(listener: tokio::net::TcpListener, metrics: &'static Metrics, mut shutdown: crate::Shutdown) -> anyhow::Result<()> {
    bw_http::serve(listener, Arc::new(Scrapes(metrics)), LIMITS, async move { shutdown.wait().await }).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaked() -> &'static Metrics {
        Box::leak(Box::new(Metrics::new()))
    }

    #[test]
    fn one_io_counts_once_with_cumulative_buckets() {
        let m = leaked();
        let mut meter = Meter::with(m, Proto::Iscsi);
        let t = meter.start("d0", Op::Read, 4096);
        meter.done_later(t, true);
        meter.flush();
        m.volume("d0", Proto::Iscsi).record(Op::Write, 8192, true, 7_000);
        m.volume("d0", Proto::Iscsi).record(Op::Write, 8192, false, 2_000_000_000);
        let s = m.snapshot();
        assert_eq!(s.volumes.len(), 1);
        let v = &s.volumes[0];
        assert_eq!((v.read.ops, v.read.bytes, v.read.errors), (1, 4096, 0));
        assert_eq!((v.write.ops, v.write.bytes, v.write.errors), (2, 8192, 1));
        assert_eq!(v.write.buckets[3], 1, "7 µs lands in le=10µs");
        assert_eq!(v.write.buckets[BUCKETS - 1], 1, "2 s lands in +Inf");
        let text = s.exposition();
        let line = |needle: &str| text.lines().find(|l| l.starts_with(needle)).unwrap_or_else(|| panic!("{needle} missing:\n{text}")).to_string();
        assert!(line("blockwire_volume_operations_total{volume=\"d0\",protocol=\"iscsi\",op=\"write\"}").ends_with(" 2"));
        assert!(line("blockwire_volume_latency_seconds_bucket{volume=\"d0\",protocol=\"iscsi\",op=\"write\",le=\"0.000005\"}").ends_with(" 0"));
        assert!(line("blockwire_volume_latency_seconds_bucket{volume=\"d0\",protocol=\"iscsi\",op=\"write\",le=\"0.000001\"}").ends_with(" 0"));
        assert!(line("blockwire_volume_latency_seconds_bucket{volume=\"d0\",protocol=\"iscsi\",op=\"write\",le=\"0.00001\"}").ends_with(" 1"));
        assert!(line("blockwire_volume_latency_seconds_bucket{volume=\"d0\",protocol=\"iscsi\",op=\"write\",le=\"1\"}").ends_with(" 1"));
        assert!(line("blockwire_volume_latency_seconds_bucket{volume=\"d0\",protocol=\"iscsi\",op=\"write\",le=\"+Inf\"}").ends_with(" 2"));
        assert!(line("blockwire_volume_latency_seconds_count{volume=\"d0\",protocol=\"iscsi\",op=\"write\"}").ends_with(" 2"));
        assert!(line("blockwire_volume_latency_seconds_sum{volume=\"d0\",protocol=\"iscsi\",op=\"write\"}").ends_with(" 2.000007"));
        // Every family is announced once, before its samples.
        for name in ["blockwire_volume_latency_seconds", "process_cpu_seconds_total", "blockwire_target_logins_total"] {
            assert_eq!(text.matches(&format!("# TYPE {name} ")).count(), 1, "{name}");
        }
    }

    /// A flush counts runs of alike I/Os at once (`record_n`): the
    /// counters must end as if each I/O were counted alone, whatever
    /// breaks a run (volume, operation, start, outcome).
    #[test]
    fn a_flush_counts_each_io_of_a_run() {
        let m = leaked();
        let mut meter = Meter::with(m, Proto::Nvme);
        let now = Instant::now();
        use std::time::Duration;
        let (old, older) = (now - Duration::from_millis(2), now - Duration::from_secs(5));
        let ios = [
            ("a", Op::Write, 4096, old, true),
            ("a", Op::Write, 4096, old, true),
            ("a", Op::Write, 8192, old, true),
            ("a", Op::Write, 4096, old, false),
            ("a", Op::Write, 4096, old, true),
            ("b", Op::Write, 4096, old, true),
            ("a", Op::Read, 4096, old, true),
            ("a", Op::Read, 4096, older, true),
            ("a", Op::Read, 512, older, true),
        ];
        for (v, op, len, at, ok) in ios {
            let t = meter.start_at(v, op, len, at);
            meter.done_later(t, ok);
        }
        meter.flush();
        let s = m.snapshot();
        let vol = |n: &str| s.volumes.iter().find(|v| v.volume == n).unwrap_or_else(|| panic!("{n}")).clone();
        let (a, b) = (vol("a"), vol("b"));
        assert_eq!((a.write.ops, a.write.bytes, a.write.errors), (5, 4096 * 3 + 8192, 1));
        assert_eq!((a.read.ops, a.read.bytes, a.read.errors), (3, 4096 * 2 + 512, 0));
        assert_eq!((b.write.ops, b.write.bytes, b.write.errors, b.read.ops), (1, 4096, 0, 0));
        // The first bucket a time of `ns` or more can land in.
        let from = |ns: u64| LATENCY_BOUNDS_NS.partition_point(|&b| b < ns);
        assert_eq!(a.write.buckets.iter().sum::<u64>(), 5);
        assert_eq!(a.write.buckets[from(2_000_000)..].iter().sum::<u64>(), 5, "all took 2 ms or more");
        assert_eq!(a.read.buckets[from(5_000_000_000)..].iter().sum::<u64>(), 2, "two took 5 s or more");
        assert_eq!(a.read.buckets.iter().sum::<u64>(), 3);
        assert!(a.write.latency_ns_sum >= 5 * 2_000_000 && a.read.latency_ns_sum >= 10_000_000_000 + 2_000_000);
    }

    #[test]
    fn initiator_names_are_capped_with_an_other_bucket() {
        let m = leaked();
        let mut guards = Vec::new();
        for i in 0..INITIATOR_CAP + 10 {
            guards.push(m.login(Proto::Nvme, "nqn.t", &format!("nqn.host-{i}"), true));
        }
        m.auth_failure(Proto::Nvme, "nqn.t", "nqn.host-0");
        m.auth_failure(Proto::Nvme, "nqn.t", "nqn.attacker");
        let s = m.snapshot();
        let t = &s.targets[0];
        assert_eq!(t.logins.len(), INITIATOR_CAP + 1);
        assert_eq!(t.logins[OTHER], 10);
        assert_eq!(t.auth_failures["nqn.host-0"], 1);
        assert_eq!(t.auth_failures[OTHER], 1);
        assert_eq!((t.sessions, t.connections), ((INITIATOR_CAP + 10) as i64, (INITIATOR_CAP + 10) as i64));
        drop(guards);
        let t = &m.snapshot().targets[0];
        assert_eq!((t.sessions, t.connections), (0, 0));
    }

    #[test]
    fn label_values_are_escaped() {
        let m = leaked();
        let _g = m.login(Proto::Iscsi, "iqn.x", "a\"b\\c\nd", true);
        let text = m.snapshot().exposition();
        assert!(text.contains(r#"initiator="a\"b\\c\nd"} 1"#), "{text}");
    }

    #[test]
    fn process_figures_come_from_proc() {
        let p = ProcessSnapshot::read();
        assert!(p.resident_bytes > 0 && p.virtual_bytes >= p.resident_bytes && p.threads >= 1 && p.open_fds >= 3);
        assert!(p.start_time_seconds > 1.6e9);
    }
}
