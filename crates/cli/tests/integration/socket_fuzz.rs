//! Socket-level fuzzing of the iSCSI and NVMe/TCP front-ends of `blockwire
//! serve` and of its control methods over HTTP: scripted clients build
//! valid sessions (login or ICReq/Connect, admin and SCSI/NVM commands with
//! data, answers to R2Ts, logout; JSON-RPC requests POSTed without, with
//! wrong and with the right credentials, so the fuzzing reaches past
//! authentication) and mutate what they send: bit flips, smashed header
//! fields, huge length claims, truncation, duplication, reordering, dropped
//! PDUs, garbage and PDUs split into small writes. Meanwhile a clean session
//! of each protocol verifies its own volume (or, over HTTP, asks for the
//! status) over and over.
//!
//! Checks: the target never dies and never panics (its log), the clean
//! sessions never fail, the target's anonymous memory stays bounded, and
//! once the fuzzing stops its descriptors and threads return to where they
//! were. Separately, each kind of huge length claim (iSCSI
//! DataSegmentLength, a WRITE whose Expected Data Transfer Length would be
//! solicited with R2Ts, NVMe/TCP PDU length, H2CData length, a transport
//! SGL longer than MDTS) is shown to be refused, not allocated.
//!
//! `SOCKET_FUZZ_SECONDS` (default 20 per protocol; `make soak` uses 1800)
//! and `SOCKET_FUZZ_SEED` (replays a run's choices, up to timing).

use crate::common;
use crate::load::{proc_stats, settle, Sampler};
use bw_initiator::ConnectOptions;
use bw_iscsi::msg::{DataOut, LoginRequest, LogoutRequest, Message, NopOut, ScsiCommand, TaskMgmtRequest, TextRequest, TmfFunction};
use bw_iscsi::pdu::{field, Bhs, Decoder as IscsiDecoder};
use bw_nvme::queue_entry::{admin, nvm, sgl, Sgl};
use bw_nvme::fabrics::{reg, Connect, ConnectData, Property};
use bw_nvme::pdu::{CapsuleCmd, DataPdu, IcReq};
use bw_nvme::{Pdu as NvmePdu, Sqe};
use bw_workload::verify::{verify, VerifyParams};
use bytes::{Bytes, BytesMut};
use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const FUZZ_IQN: &str = "iqn.2026-11.org.blockwire.test:fuzz";
const CLEAN_IQN: &str = "iqn.2026-11.org.blockwire.test:clean";
const FUZZ_NQN: &str = "nqn.2026-11.org.blockwire.test:fuzz";
const CLEAN_NQN: &str = "nqn.2026-11.org.blockwire.test:clean";
/// Fuzzed volumes: big enough that most writes land inside.
const FUZZ_BLOCKS: u64 = 16 * 2048;
/// Concurrent fuzzing clients per protocol.
const FUZZERS: usize = 3;
/// Anonymous memory the target may gain while being fuzzed (a leak or an
/// allocation sized by a length claim would cross it).
const RSS_ANON_GROWTH_LIMIT_KIB: u64 = 256 * 1024;

fn seconds() -> u64 {
    std::env::var("SOCKET_FUZZ_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(20)
}

fn seed() -> u64 {
    std::env::var("SOCKET_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(rand::random)
}

// ---------------------------------------------------------------- the wire

/// A client connection whose every wait is bounded.
struct Wire {
    s: TcpStream,
    inbox: BytesMut,
    closed: bool,
}

impl Wire {
    fn connect(port: u16) -> Option<Wire> {
        let s = TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_nodelay(true).ok()?;
        // A target that stops reading must not hang the fuzzer.
        s.set_write_timeout(Some(Duration::from_secs(3))).ok()?;
        Some(Wire { s, inbox: BytesMut::new(), closed: false })
    }

    /// [`Wire::connect`] from 127.0.0.`from` (all of 127/8 is loopback):
    /// HTTP admission counts connections per address.
    fn connect_from(port: u16, from: u8) -> Option<Wire> {
        let s = tcp_connect_from(port, from).ok()?;
        s.set_nodelay(true).ok()?;
        s.set_write_timeout(Some(Duration::from_secs(3))).ok()?;
        Some(Wire { s, inbox: BytesMut::new(), closed: false })
    }

    fn send(&mut self, b: &[u8]) -> bool {
        if !self.closed && self.s.write_all(b).is_err() {
            self.closed = true;
        }
        !self.closed
    }

    /// Read what arrives within `wait` (at least one read attempt).
    fn pump(&mut self, wait: Duration) {
        if self.closed {
            return;
        }
        let deadline = Instant::now() + wait;
        let mut buf = [0u8; 65536];
        loop {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            let _ = self.s.set_read_timeout(Some(left));
            match self.s.read(&mut buf) {
                Ok(0) => {
                    self.closed = true;
                    return;
                }
                Ok(n) => {
                    self.inbox.extend_from_slice(&buf[..n]);
                    // Keep reading while data flows, without waiting again.
                    if Instant::now() >= deadline {
                        return;
                    }
                    let _ = self.s.set_read_timeout(Some(Duration::from_millis(1)));
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.closed = true;
                    return;
                }
            }
            if Instant::now() >= deadline {
                return;
            }
        }
    }

    /// Whether the target closed the connection within `wait`.
    fn closed_within(&mut self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        while !self.closed && Instant::now() < deadline {
            self.pump(Duration::from_millis(50));
            self.inbox.clear();
        }
        self.closed
    }
}

// ---------------------------------------------------------------- mutation

/// Where a protocol keeps the fields worth smashing in an outgoing PDU.
#[derive(Clone, Copy)]
struct Layout {
    /// Header bytes (mutations prefer them).
    header_len: usize,
    /// (offset, width) of length fields, for huge claims.
    lengths: &'static [(usize, usize)],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mutation {
    BitFlip,
    SmashField,
    HugeLength,
    Truncate,
    Duplicate,
    Reorder,
    Drop,
    Garbage,
    Split,
}

const MUTATIONS: [Mutation; 9] = [
    Mutation::BitFlip,
    Mutation::SmashField,
    Mutation::HugeLength,
    Mutation::Truncate,
    Mutation::Duplicate,
    Mutation::Reorder,
    Mutation::Drop,
    Mutation::Garbage,
    Mutation::Split,
];

/// Sends a session's PDUs, mutating some of them.
struct Sender<'a> {
    wire: Wire,
    rng: SmallRng,
    /// Probability that a PDU is mutated (0 for clean control sessions).
    rate: f64,
    layout: Layout,
    held: Option<Vec<u8>>,
    pdus: u64,
    log: Vec<String>,
    counts: &'a Mutex<BTreeMap<Mutation, u64>>,
}

const INTERESTING: [u32; 10] = [0, 1, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF];

impl Sender<'_> {
    /// Send one PDU (`what` names it in the session log); false once the
    /// connection is gone.
    fn pdu(&mut self, what: &str, mut b: Vec<u8>) -> bool {
        self.pdus += 1;
        let n = self.pdus;
        let mutation = (self.rate > 0.0 && self.rng.gen_bool(self.rate)).then(|| MUTATIONS[self.rng.gen_range(0..MUTATIONS.len())]);
        let Some(m) = mutation else { return self.flush_with(&b) };
        *self.counts.lock().expect("counts").entry(m).or_default() += 1;
        let hl = self.layout.header_len.min(b.len()).max(1);
        let note = match m {
            Mutation::BitFlip => {
                let flips = self.rng.gen_range(1..=4);
                for _ in 0..flips {
                    // Mostly in the header, where the parsers are.
                    let at = if self.rng.gen_bool(0.8) { self.rng.gen_range(0..hl) } else { self.rng.gen_range(0..b.len()) };
                    b[at] ^= 1 << self.rng.gen_range(0..8);
                }
                format!("{flips} bit flips")
            }
            Mutation::SmashField => {
                let width = [1usize, 2, 4][self.rng.gen_range(0..3)];
                let at = self.rng.gen_range(0..hl.saturating_sub(width).max(1));
                let v = INTERESTING[self.rng.gen_range(0..INTERESTING.len())];
                let bytes = if self.rng.gen_bool(0.5) { v.to_be_bytes() } else { v.to_le_bytes() };
                let end = (at + width).min(b.len());
                b[at..end].copy_from_slice(&bytes[4 - (end - at)..]);
                format!("field {at}+{width} = {v:#x}")
            }
            Mutation::HugeLength if self.layout.lengths.is_empty() => {
                // A text protocol (HTTP): a huge Content-Length or chunk size.
                let huge = ["99999999999999999999", "4294967296", "18446744073709551616", "-1", "ffffffffffffffff"][self.rng.gen_range(0..5)];
                let text = String::from_utf8_lossy(&b).into_owned();
                let (from, to) = match text.find("Content-Length: ") {
                    Some(at) => (at + 16, text[at + 16..].find("\r\n").map_or(text.len(), |e| at + 16 + e)),
                    None => (0, text.find("\r\n").unwrap_or(0)),
                };
                b.splice(from..to, huge.bytes());
                format!("length {huge}")
            }
            Mutation::HugeLength => {
                let (at, width) = self.layout.lengths[self.rng.gen_range(0..self.layout.lengths.len())];
                if at + width <= b.len() {
                    let v: u32 = [0xFFFF_FFFF, 0x7FFF_FFFF, 0x00FF_FFFF, 0x0100_0000, 0x1000_0000][self.rng.gen_range(0..5)];
                    let be = self.layout.lengths.as_ptr() == ISCSI_LENGTHS.as_ptr();
                    let bytes = if be { v.to_be_bytes() } else { v.to_le_bytes() };
                    if be {
                        b[at..at + width].copy_from_slice(&bytes[4 - width..]);
                    } else {
                        b[at..at + width].copy_from_slice(&bytes[..width]);
                    }
                }
                format!("length field {at}+{width} huge")
            }
            Mutation::Truncate => {
                let keep = self.rng.gen_range(0..b.len());
                b.truncate(keep);
                format!("truncated to {keep}")
            }
            Mutation::Duplicate => {
                let ok = self.flush_with(&b);
                self.log.push(format!("pdu {n} {what}: duplicated"));
                return ok && self.wire.send(&b);
            }
            Mutation::Reorder => {
                self.log.push(format!("pdu {n} {what}: sent after the next"));
                if let Some(h) = self.held.replace(b) {
                    return self.wire.send(&h);
                }
                return !self.wire.closed;
            }
            Mutation::Drop => {
                self.log.push(format!("pdu {n} {what}: dropped"));
                return !self.wire.closed;
            }
            Mutation::Garbage => {
                let len = self.rng.gen_range(1..64);
                let junk: Vec<u8> = (0..len).map(|_| self.rng.gen()).collect();
                let at = self.rng.gen_range(0..=b.len());
                b.splice(at..at, junk);
                format!("{len} garbage bytes at {at}")
            }
            Mutation::Split => {
                self.log.push(format!("pdu {n} {what}: split into small writes"));
                let mut rest = &b[..];
                while !rest.is_empty() && !self.wire.closed {
                    let k = self.rng.gen_range(1..=rest.len().min(7));
                    self.wire.send(&rest[..k]);
                    rest = &rest[k..];
                    if self.rng.gen_bool(0.3) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                return self.flush_held();
            }
        };
        self.log.push(format!("pdu {n} {what}: {note}"));
        self.flush_with(&b)
    }

    fn flush_with(&mut self, b: &[u8]) -> bool {
        self.wire.send(b) && self.flush_held()
    }

    fn flush_held(&mut self) -> bool {
        match self.held.take() {
            Some(h) => self.wire.send(&h),
            None => !self.wire.closed,
        }
    }
}

/// How a fuzzing session went.
struct Outcome {
    /// One of a few fixed phrases, counted per run.
    ending: &'static str,
    detail: String,
    pdus: u64,
    /// The mutations applied, PDU by PDU.
    log: Vec<String>,
}

impl Outcome {
    fn early(ending: &'static str, tx: Option<Sender>) -> Outcome {
        let (pdus, log) = tx.map(|t| (t.pdus, t.log)).unwrap_or_default();
        Outcome { ending, detail: String::new(), pdus, log }
    }
}

/// Endings of a session that nothing disturbed.
const CLEAN_ENDINGS: [&str; 3] = ["logged out", "closed by us", "answered as expected"];

// ---------------------------------------------------------------- iSCSI

/// DataSegmentLength (24 bits), TotalAHSLength, Expected Data Transfer
/// Length / TTT, buffer offset, big-endian.
const ISCSI_LENGTHS: &[(usize, usize)] = &[(5, 3), (4, 1), (20, 4), (40, 4), (44, 4)];

#[derive(Clone, Copy)]
struct IscsiDigests {
    header: bool,
    data: bool,
}

/// A PDU on the wire: header, optional header digest, data, padding, data digest.
fn iscsi_wire(mut bhs: Bhs, data: &[u8], d: IscsiDigests) -> Vec<u8> {
    bhs.set_data_segment_len(data.len());
    let mut v = bhs.0.to_vec();
    if d.header {
        let c = crc32c::crc32c(&v);
        v.extend_from_slice(&c.to_le_bytes());
    }
    if !data.is_empty() {
        let start = v.len();
        v.extend_from_slice(data);
        v.resize(v.len() + (4 - data.len() % 4) % 4, 0);
        if d.data {
            let c = crc32c::crc32c(&v[start..]);
            v.extend_from_slice(&c.to_le_bytes());
        }
    }
    v
}

/// What the fuzzing client learns from the target's PDUs.
#[derive(Default)]
struct IscsiSeen {
    max_cmd_sn: u32,
    /// Outstanding R2Ts: (ITT, TTT, offset, length).
    r2ts: VecDeque<(u32, u32, u32, u32)>,
    /// Target NOP-In pings to answer: TTT.
    pings: Vec<u32>,
    responses: u64,
    rejects: u64,
    /// ITTs whose SCSI Response came.
    done: std::collections::HashSet<u32>,
    logged_out: bool,
}

fn iscsi_take(w: &mut Wire, dec: &IscsiDecoder, seen: &mut IscsiSeen) {
    loop {
        match dec.decode(&mut w.inbox) {
            Ok(Some(p)) => {
                let b = &p.bhs;
                let opcode = b.0[0] & 0x3F;
                if matches!(opcode, 0x20 | 0x21 | 0x25 | 0x31 | 0x22 | 0x26) {
                    let m = b.get(field::MAX_CMD_SN);
                    if (m.wrapping_sub(seen.max_cmd_sn) as i32) > 0 {
                        seen.max_cmd_sn = m;
                    }
                }
                match opcode {
                    0x31 => seen.r2ts.push_back((b.itt(), b.get(field::TTT), b.get(field::BUFFER_OFFSET), b.get(field::DESIRED_LENGTH))),
                    0x20 if b.get(field::TTT) != 0xFFFF_FFFF => seen.pings.push(b.get(field::TTT)),
                    0x21 => {
                        seen.responses += 1;
                        seen.done.insert(b.itt());
                    }
                    0x26 => seen.logged_out = true,
                    0x3F => seen.rejects += 1,
                    _ => {}
                }
            }
            Ok(None) => return,
            Err(_) => {
                // The target's stream no longer parses with what we
                // negotiated (a mutated login): stop listening.
                w.inbox.clear();
                return;
            }
        }
    }
}

fn cdb16(bytes: &[u8]) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[..bytes.len()].copy_from_slice(bytes);
    c
}

/// One fuzzing session against the iSCSI front-end; returns how it ended.
fn iscsi_session(port: u16, seed: u64, rate: f64, counts: &Mutex<BTreeMap<Mutation, u64>>) -> Outcome {
    let mut rng = SmallRng::seed_from_u64(seed);
    let Some(wire) = Wire::connect(port) else { return Outcome::early("connect failed", None) };
    let mut tx = Sender {
        wire,
        rng: SmallRng::seed_from_u64(seed ^ 0x5eed),
        rate,
        layout: Layout { header_len: 48, lengths: ISCSI_LENGTHS },
        held: None,
        pdus: 0,
        log: Vec::new(),
        counts,
    };
    let digests = if rng.gen_bool(0.2) { IscsiDigests { header: true, data: rng.gen_bool(0.5) } } else { IscsiDigests { header: false, data: false } };
    let initial_r2t = rng.gen_bool(0.5);
    let immediate = rng.gen_bool(0.7);
    let first_burst: u32 = [8192, 65536][rng.gen_range(0..2)];
    let max_burst: u32 = [16384, 262144][rng.gen_range(0..2)];
    // What the target will use: FirstBurstLength never exceeds MaxBurstLength.
    let first_burst_used = first_burst.min(max_burst);
    let outstanding_r2t: u32 = rng.gen_range(1..=4);
    let mut isid = [0u8; 6];
    rng.fill(&mut isid[..]);
    isid[0] = 0x80;
    let yes = |b: bool| if b { "Yes" } else { "No" };
    let digest = |b: bool| if b { "CRC32C" } else { "None" };
    let text = bw_iscsi::text::encode(&[
        ("InitiatorName", format!("iqn.2026-11.org.blockwire.test:fuzzer-{}", seed % 7)),
        ("TargetName", FUZZ_IQN.to_string()),
        ("SessionType", "Normal".into()),
        ("HeaderDigest", digest(digests.header).into()),
        ("DataDigest", digest(digests.data).into()),
        ("InitialR2T", yes(initial_r2t).into()),
        ("ImmediateData", yes(immediate).into()),
        ("MaxRecvDataSegmentLength", "65536".into()),
        ("FirstBurstLength", first_burst.to_string()),
        ("MaxBurstLength", max_burst.to_string()),
        ("MaxOutstandingR2T", outstanding_r2t.to_string()),
        ("ErrorRecoveryLevel", "0".into()),
    ]);
    let login = Message::LoginRequest(LoginRequest {
        transit: true,
        continue_: false,
        csg: 1,
        nsg: 3,
        version_max: 0,
        version_min: 0,
        isid,
        tsih: 0,
        itt: 0,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    });
    let none = IscsiDigests { header: false, data: false };
    if !tx.pdu("Login", iscsi_wire(login.encode(), &text, none)) {
        return Outcome::early("closed during login", Some(tx));
    }
    // The Login Response.
    let mut dec = IscsiDecoder::new(1 << 24);
    let deadline = Instant::now() + Duration::from_secs(1);
    let resp = loop {
        tx.wire.pump(Duration::from_millis(20));
        match dec.decode(&mut tx.wire.inbox) {
            Ok(Some(p)) => break Some(p),
            Ok(None) if !tx.wire.closed && Instant::now() < deadline => continue,
            _ => break None,
        }
    };
    let Some(resp) = resp else { return Outcome::early("no login response", Some(tx)) };
    let (status, final_) = (login_status(&resp.bhs), resp.bhs.0[1] & 0x80 != 0 && resp.bhs.0[1] & 3 == 3);
    if resp.bhs.0[0] & 0x3F != 0x23 || status != 0 || !final_ {
        return Outcome { ending: "login refused", detail: format!("status {status:#06x}"), pdus: tx.pdus, log: tx.log };
    }
    let mut cmd_sn = resp.bhs.get(field::EXP_CMD_SN);
    let mut seen = IscsiSeen { max_cmd_sn: resp.bhs.get(field::MAX_CMD_SN), ..Default::default() };
    dec.digests = bw_iscsi::pdu::Digests { header: digests.header, data: digests.data };
    let mut itt: u32 = 0x100;
    let n_cmds = rng.gen_range(4..40);
    for _ in 0..n_cmds {
        if tx.wire.closed {
            break;
        }
        // Respect the command window (a dropped command opens a hole the
        // target waits for; do not wait long for it).
        let wait_until = Instant::now() + Duration::from_millis(300);
        while (cmd_sn.wrapping_sub(seen.max_cmd_sn) as i32) > 0 && Instant::now() < wait_until && !tx.wire.closed {
            tx.wire.pump(Duration::from_millis(10));
            iscsi_take(&mut tx.wire, &dec, &mut seen);
        }
        for ttt in std::mem::take(&mut seen.pings) {
            let nop = Message::NopOut(NopOut { immediate: true, lun: 0, itt: 0xFFFF_FFFF, ttt, cmd_sn, exp_stat_sn: 0 });
            tx.pdu("NOP-Out answer", iscsi_wire(nop.encode(), &[], digests));
        }
        itt += 1;
        let lun = if rng.gen_bool(0.9) { 0 } else { rng.gen_range(1..3u64) };
        let lun_field = u64::from_be_bytes(bw_scsi::encode_lun(lun));
        let lba = rng.gen_range(0..FUZZ_BLOCKS - 256);
        let pick = rng.gen_range(0..100);
        let (cdb, read_len, write_len): ([u8; 16], u32, u32) = match pick {
            0..=24 => {
                let n = rng.gen_range(1..=64u32);
                (bw_scsi::initiator::read_16(lba, n), n * 512, 0)
            }
            25..=54 => {
                let n = rng.gen_range(1..=256u32);
                (bw_scsi::initiator::write_16(lba, n), 0, n * 512)
            }
            55..=59 => (cdb16(&bw_scsi::initiator::test_unit_ready()), 0, 0),
            60..=63 => (cdb16(&[0x12, 0, 0, 0, 255, 0]), 255, 0),
            64..=66 => (cdb16(&[0x12, 1, [0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2][rng.gen_range(0..6)], 0, 255, 0]), 255, 0),
            67..=69 => (bw_scsi::initiator::read_capacity_16(32), 32, 0),
            70..=71 => (cdb16(&[0x1A, 0, 0x3F, 0, 255, 0]), 255, 0),
            72..=73 => (cdb16(&[0xA0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]), 256, 0),
            74..=75 => (cdb16(&bw_scsi::initiator::synchronize_cache_10()), 0, 0),
            76..=77 => {
                // UNMAP one range.
                (cdb16(&[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0]), 0, 24)
            }
            78..=79 => {
                let mut c = [0u8; 16];
                c[0] = 0x93; // WRITE SAME(16)
                c[2..10].copy_from_slice(&lba.to_be_bytes());
                c[13] = rng.gen_range(1..16);
                (c, 0, 512)
            }
            80..=81 => {
                let mut c = [0u8; 16];
                c[0] = 0x89; // COMPARE AND WRITE, one block
                c[2..10].copy_from_slice(&lba.to_be_bytes());
                c[13] = 1;
                (c, 0, 1024)
            }
            82..=83 => (cdb16(&[0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0]), 0x1000, 0),
            84..=85 => {
                // A random CDB with a random direction.
                let mut c = [0u8; 16];
                rng.fill(&mut c[..]);
                (c, if rng.gen_bool(0.5) { rng.gen_range(0..4096) } else { 0 }, 0)
            }
            86..=89 => {
                let nop = Message::NopOut(NopOut { immediate: false, lun: 0, itt, ttt: 0xFFFF_FFFF, cmd_sn, exp_stat_sn: 0 });
                cmd_sn = cmd_sn.wrapping_add(1);
                tx.pdu("NOP-Out", iscsi_wire(nop.encode(), b"ping", digests));
                continue;
            }
            90..=92 => {
                let t = Message::TextRequest(TextRequest { final_: true, itt, ttt: 0xFFFF_FFFF, cmd_sn, ..Default::default() });
                cmd_sn = cmd_sn.wrapping_add(1);
                tx.pdu("Text SendTargets", iscsi_wire(t.encode(), b"SendTargets=All\0", digests));
                continue;
            }
            93..=95 => {
                // ABORT TASK on an earlier command, or LUN RESET.
                let function = if rng.gen_bool(0.7) { TmfFunction::AbortTask } else { TmfFunction::LunReset };
                let tm = TaskMgmtRequest {
                    immediate: true,
                    function: function as u8,
                    lun: lun_field,
                    itt,
                    referenced_task_tag: itt.wrapping_sub(rng.gen_range(1..4)),
                    cmd_sn,
                    ref_cmd_sn: cmd_sn.wrapping_sub(1),
                    ..Default::default()
                };
                tx.pdu("Task management", iscsi_wire(Message::TaskMgmtRequest(tm).encode(), &[], digests));
                continue;
            }
            _ => {
                // SNACK (not supported at ErrorRecoveryLevel 0): raw header.
                let mut b = Bhs::default();
                b.0[0] = 0x10;
                b.0[1] = 0x80 | rng.gen_range(0..4);
                b.set(field::ITT, itt.wrapping_sub(1));
                b.set(field::TTT, 0xFFFF_FFFF);
                tx.pdu("SNACK", iscsi_wire(b, &[], digests));
                continue;
            }
        };
        let mut data: Vec<u8> = (0..write_len).map(|i| (i as u8) ^ (itt as u8)).collect();
        if cdb[0] == 0x42 && data.len() >= 24 {
            // UNMAP parameter list: one descriptor at `lba`, 8 blocks.
            data[..8].copy_from_slice(&[0, 22, 0, 16, 0, 0, 0, 0]);
            data[8..16].copy_from_slice(&lba.to_be_bytes());
            data[16..20].copy_from_slice(&8u32.to_be_bytes());
        }
        let imm_len = if immediate { write_len.min(first_burst_used).min(65536) as usize } else { 0 };
        let unsolicited_end = if !initial_r2t { write_len.min(first_burst_used) } else { 0 };
        let final_ = write_len == 0 || initial_r2t || imm_len as u32 >= unsolicited_end;
        let cmd = ScsiCommand {
            immediate: false,
            final_,
            read: read_len > 0,
            write: write_len > 0,
            attr: 1,
            lun: lun_field,
            itt,
            edtl: read_len.max(write_len),
            cmd_sn,
            exp_stat_sn: 0,
            cdb,
        };
        cmd_sn = cmd_sn.wrapping_add(1);
        if !tx.pdu(&format!("SCSI {:#04x}", cdb[0]), iscsi_wire(Message::ScsiCommand(cmd).encode(), &data[..imm_len], digests)) {
            break;
        }
        // Unsolicited Data-Out up to FirstBurstLength.
        let mut off = imm_len as u32;
        let mut data_sn = 0;
        while write_len > 0 && off < unsolicited_end {
            let len = (unsolicited_end - off).min(8192);
            let d = DataOut { final_: off + len >= unsolicited_end, lun: lun_field, itt, ttt: 0xFFFF_FFFF, exp_stat_sn: 0, data_sn, buffer_offset: off };
            tx.pdu("unsolicited Data-Out", iscsi_wire(Message::DataOut(d).encode(), &data[off as usize..(off + len) as usize], digests));
            off += len;
            data_sn += 1;
        }
        // Answer the R2Ts for this command until all its data is sent or it
        // ends (a mutated command may never get one: do not wait long).
        let mut sent_all = write_len <= off;
        let deadline = Instant::now() + Duration::from_millis(200);
        loop {
            tx.wire.pump(Duration::from_millis(if sent_all { 0 } else { 5 }));
            iscsi_take(&mut tx.wire, &dec, &mut seen);
            while let Some((r_itt, ttt, r_off, r_len)) = seen.r2ts.pop_front() {
                if r_itt != itt {
                    continue; // an earlier command's, whose data we no longer have
                }
                let mut o = r_off;
                let end = r_off.saturating_add(r_len).min(write_len);
                let mut sn = 0;
                while o < end {
                    let len = (end - o).min(8192);
                    let d = DataOut { final_: o + len >= end, lun: lun_field, itt, ttt, exp_stat_sn: 0, data_sn: sn, buffer_offset: o };
                    tx.pdu("solicited Data-Out", iscsi_wire(Message::DataOut(d).encode(), &data[o as usize..(o + len) as usize], digests));
                    o += len;
                    sn += 1;
                }
                sent_all |= end >= write_len;
            }
            if sent_all || seen.done.contains(&itt) || tx.wire.closed || Instant::now() >= deadline {
                break;
            }
        }
    }
    let mut how = if tx.wire.closed { "closed by the target" } else { "closed by us" };
    if rng.gen_bool(0.8) && !tx.wire.closed {
        let lo = Message::LogoutRequest(LogoutRequest { immediate: true, reason: 0, itt: itt + 1, cid: 0, cmd_sn, exp_stat_sn: 0 });
        tx.pdu("Logout", iscsi_wire(lo.encode(), &[], digests));
        tx.flush_held();
        // Outstanding commands finish first; then the Logout Response and the close.
        let deadline = Instant::now() + Duration::from_secs(2);
        while !tx.wire.closed && Instant::now() < deadline {
            tx.wire.pump(Duration::from_millis(20));
            iscsi_take(&mut tx.wire, &dec, &mut seen);
        }
        how = match (seen.logged_out, tx.wire.closed) {
            (true, true) => "logged out",
            (false, true) => "closed by the target",
            (_, false) => "logout not answered",
        };
    }
    Outcome { ending: how, detail: format!("{} responses, {} rejects", seen.responses, seen.rejects), pdus: tx.pdus, log: tx.log }
}

// ---------------------------------------------------------------- NVMe/TCP

/// PDU length, HLEN/PDO, H2CData DATAL and DATAO, SGL length of a capsule, little-endian.
const NVME_LENGTHS: &[(usize, usize)] = &[(4, 4), (2, 1), (3, 1), (16, 4), (12, 4), (40, 4)];

fn nvme_wire(p: &NvmePdu, d: bw_nvme::Digests) -> Vec<u8> {
    let mut v = Vec::new();
    p.encode_into(d, &mut v);
    v
}

/// What the fuzzing host learns from the controller's PDUs.
#[derive(Default)]
struct NvmeSeen {
    ic: Option<bw_nvme::pdu::IcResp>,
    /// Completions by command id: (status, dword 0).
    done: BTreeMap<u16, (u16, u32)>,
    /// R2Ts: (cid, ttag, offset, length).
    r2ts: VecDeque<(u16, u16, u32, u32)>,
    terminated: bool,
    completions: u64,
}

fn nvme_take(w: &mut Wire, d: bw_nvme::Digests, seen: &mut NvmeSeen) {
    loop {
        match bw_nvme::pdu::decode(&mut w.inbox, d, 1 << 24) {
            Ok(Some(p)) => match p {
                NvmePdu::IcResp(r) => seen.ic = Some(r),
                NvmePdu::CapsuleResp(c) => {
                    seen.completions += 1;
                    seen.done.insert(c.cid, (c.status.0, c.result as u32));
                }
                NvmePdu::C2HData(dp) if dp.success => {
                    seen.completions += 1;
                    seen.done.insert(dp.cid, (0, 0));
                }
                NvmePdu::R2T(r) => seen.r2ts.push_back((r.cid, r.ttag, r.offset, r.length)),
                NvmePdu::C2HTermReq(_) => seen.terminated = true,
                _ => {}
            },
            Ok(None) => return,
            Err(_) => {
                w.inbox.clear();
                return;
            }
        }
    }
}

fn nvme_sender<'a>(port: u16, seed: u64, rate: f64, counts: &'a Mutex<BTreeMap<Mutation, u64>>) -> Option<Sender<'a>> {
    Some(Sender {
        wire: Wire::connect(port)?,
        rng: SmallRng::seed_from_u64(seed),
        rate,
        layout: Layout { header_len: 72, lengths: NVME_LENGTHS },
        held: None,
        pdus: 0,
        log: Vec::new(),
        counts,
    })
}

/// ICReq and Connect on a new connection; the controller id on success.
fn nvme_open(tx: &mut Sender, rng: &mut SmallRng, qid: u16, cntlid: u16, hostnqn: &str, digests: bw_nvme::Digests, seen: &mut NvmeSeen) -> Option<u16> {
    let ic = NvmePdu::IcReq(IcReq { pfv: 0, hpda: 0, digests, maxr2t: 0 });
    tx.pdu("ICReq", nvme_wire(&ic, bw_nvme::Digests::default()));
    let deadline = Instant::now() + Duration::from_secs(3);
    while seen.ic.is_none() && !tx.wire.closed && Instant::now() < deadline {
        tx.wire.pump(Duration::from_millis(20));
        nvme_take(&mut tx.wire, bw_nvme::Digests::default(), seen);
    }
    seen.ic?;
    let sqsize = 31;
    let c = Connect { recfmt: 0, qid, sqsize, cattr: 0, kato_ms: if qid == 0 { rng.gen_range(0..3) * 5000 } else { 0 } };
    // Every queue of a controller carries its admin queue's Host ID.
    let cd = ConnectData { hostid: [1; 16], cntlid, subnqn: FUZZ_NQN.into(), hostnqn: hostnqn.into() };
    let p = NvmePdu::CapsuleCmd(CapsuleCmd { sqe: c.to_sqe(1), data: Bytes::from(cd.encode()) });
    tx.pdu("Connect", nvme_wire(&p, digests));
    let deadline = Instant::now() + Duration::from_secs(3);
    while !seen.done.contains_key(&1) && !tx.wire.closed && Instant::now() < deadline {
        tx.wire.pump(Duration::from_millis(20));
        nvme_take(&mut tx.wire, digests, seen);
    }
    match seen.done.remove(&1) {
        Some((0, dw0)) => Some(dw0 as u16),
        _ => None,
    }
}

/// One fuzzing session: an admin queue and an I/O queue of one controller.
fn nvme_session(port: u16, seed: u64, rate: f64, counts: &Mutex<BTreeMap<Mutation, u64>>) -> Outcome {
    let mut rng = SmallRng::seed_from_u64(seed);
    let digests = if rng.gen_bool(0.2) { bw_nvme::Digests { header: true, data: rng.gen_bool(0.5) } } else { bw_nvme::Digests::default() };
    let hostnqn = format!("nqn.2014-08.org.nvmexpress:uuid:fuzz-{}", seed % 5);
    let Some(mut admin_tx) = nvme_sender(port, seed ^ 1, rate, counts) else { return Outcome::early("connect failed", None) };
    let mut admin_seen = NvmeSeen::default();
    let Some(cntlid) = nvme_open(&mut admin_tx, &mut rng, 0, 0xFFFF, &hostnqn, digests, &mut admin_seen) else {
        return Outcome::early("admin queue refused or closed", Some(admin_tx));
    };
    // Enable the controller, then a few admin commands.
    let mut cid: u16 = 10;
    let mut admin_cmds: Vec<(String, Sqe, Vec<u8>)> = vec![("Property Set CC.EN".into(), Property::set_sqe(0, reg::CC, 0x46_0001), vec![])];
    for _ in 0..rng.gen_range(2..10) {
        let mut s;
        let name;
        match rng.gen_range(0..9) {
            0 => {
                s = Property::get_sqe(0, [reg::CAP, reg::VS, reg::CSTS, reg::CC][rng.gen_range(0..4)], rng.gen_bool(0.5));
                name = "Property Get";
            }
            1..=2 => {
                s = Sqe::new(admin::IDENTIFY, 0, [0, 1, 0xFFFF_FFFF][rng.gen_range(0..3)]);
                s.set_cdw(10, [0u32, 1, 2, 3][rng.gen_range(0..4)]);
                s.set_sgl(Sgl { addr: 0, length: 4096, kind: sgl::TRANSPORT });
                name = "Identify";
            }
            3 => {
                s = Sqe::new(admin::GET_LOG_PAGE, 0, 0xFFFF_FFFF);
                s.set_cdw(10, [0x01u32, 0x02, 0x03, 0x04, 0x0C, 0x70][rng.gen_range(0..6)] | (127 << 16));
                s.set_sgl(Sgl { addr: 0, length: 512, kind: sgl::TRANSPORT });
                name = "Get Log Page";
            }
            4 => {
                s = Sqe::new(admin::SET_FEATURES, 0, 0);
                s.set_cdw(10, 0x07);
                s.set_cdw(11, 0x0003_0003);
                name = "Set Features";
            }
            5 => {
                s = Sqe::new(admin::GET_FEATURES, 0, 0);
                s.set_cdw(10, rng.gen_range(1..0x20));
                name = "Get Features";
            }
            6 => {
                s = Sqe::new(admin::KEEP_ALIVE, 0, 0);
                name = "Keep Alive";
            }
            7 => {
                s = Sqe::new(admin::ASYNC_EVENT, 0, 0);
                name = "Async Event Request";
            }
            _ => {
                s = Sqe::new(rng.gen(), 0, rng.gen());
                for dw in 10..16 {
                    s.set_cdw(dw, rng.gen());
                }
                name = "random admin opcode";
            }
        }
        admin_cmds.push((name.into(), s, vec![]));
    }
    for (name, mut s, data) in admin_cmds {
        cid += 1;
        s.set_cid(cid);
        let p = NvmePdu::CapsuleCmd(CapsuleCmd { sqe: s, data: Bytes::from(data) });
        if !admin_tx.pdu(&name, nvme_wire(&p, digests)) {
            break;
        }
        admin_tx.wire.pump(Duration::from_millis(2));
        nvme_take(&mut admin_tx.wire, digests, &mut admin_seen);
    }
    admin_tx.flush_held();
    // The I/O queue.
    let mut io_seen = NvmeSeen::default();
    let mut report = format!("admin: {} PDUs, {} completions", admin_tx.pdus, admin_seen.completions);
    let mut pdus = admin_tx.pdus;
    let mut ending = "closed by us";
    let mut log = std::mem::take(&mut admin_tx.log);
    if let Some(mut io_tx) = nvme_sender(port, seed ^ 2, rate, counts) {
        // Wait for CC.EN to take before the I/O queue connects.
        admin_tx.wire.pump(Duration::from_millis(20));
        if nvme_open(&mut io_tx, &mut rng, 1, cntlid, &hostnqn, digests, &mut io_seen).is_some() {
            let maxh2c = io_seen.ic.map(|r| r.maxh2cdata).unwrap_or(8192).clamp(512, 1 << 20);
            let mut cid: u16 = 100;
            for _ in 0..rng.gen_range(4..40) {
                if io_tx.wire.closed {
                    break;
                }
                cid = cid.wrapping_add(1).max(100);
                let lba = rng.gen_range(0..FUZZ_BLOCKS - 512);
                let nsid = if rng.gen_bool(0.95) { 1 } else { rng.gen_range(0..4) };
                let (name, mut s, data, r2t_data): (&str, Sqe, Vec<u8>, Vec<u8>) = match rng.gen_range(0..100) {
                    0..=29 => {
                        let n = rng.gen_range(1..=32u32);
                        let mut s = Sqe::new(nvm::WRITE, 0, nsid);
                        s.set_rw(lba, n);
                        s.set_sgl(Sgl { addr: 0, length: n * 512, kind: sgl::INCAPSULE });
                        ("Write in capsule", s, vec![cid as u8; n as usize * 512], vec![])
                    }
                    30..=49 => {
                        let n = rng.gen_range(1..=512u32);
                        let mut s = Sqe::new(nvm::WRITE, 0, nsid);
                        s.set_rw(lba, n);
                        s.set_sgl(Sgl { addr: 0, length: n * 512, kind: sgl::TRANSPORT });
                        ("Write with R2T", s, vec![], vec![!cid as u8; n as usize * 512])
                    }
                    50..=74 => {
                        let n = rng.gen_range(1..=256u32);
                        let mut s = Sqe::new(nvm::READ, 0, nsid);
                        s.set_rw(lba, n);
                        s.set_sgl(Sgl { addr: 0, length: n * 512, kind: sgl::TRANSPORT });
                        ("Read", s, vec![], vec![])
                    }
                    75..=79 => ("Flush", Sqe::new(nvm::FLUSH, 0, nsid), vec![], vec![]),
                    80..=84 => {
                        let mut s = Sqe::new(nvm::WRITE_ZEROES, 0, nsid);
                        s.set_rw(lba, rng.gen_range(1..=1024));
                        ("Write Zeroes", s, vec![], vec![])
                    }
                    85..=89 => {
                        let mut s = Sqe::new(nvm::DSM, 0, nsid);
                        s.set_cdw(11, 1 << 2);
                        let mut r = vec![0u8; 16];
                        r[4..8].copy_from_slice(&8u32.to_le_bytes());
                        r[8..16].copy_from_slice(&lba.to_le_bytes());
                        s.set_sgl(Sgl { addr: 0, length: 16, kind: sgl::INCAPSULE });
                        ("Dataset Management", s, r, vec![])
                    }
                    90..=94 => {
                        let mut s = Sqe::new(nvm::COMPARE, 0, nsid);
                        s.set_rw(lba, 1);
                        s.set_sgl(Sgl { addr: 0, length: 512, kind: sgl::INCAPSULE });
                        ("Compare", s, vec![0u8; 512], vec![])
                    }
                    _ => {
                        let mut s = Sqe::new(rng.gen(), 0, nsid);
                        for dw in 10..16 {
                            s.set_cdw(dw, rng.gen());
                        }
                        ("random I/O opcode", s, vec![], vec![])
                    }
                };
                s.set_cid(cid);
                let p = NvmePdu::CapsuleCmd(CapsuleCmd { sqe: s, data: Bytes::from(data) });
                if !io_tx.pdu(name, nvme_wire(&p, digests)) {
                    break;
                }
                let wait = if r2t_data.is_empty() { Duration::ZERO } else { Duration::from_millis(300) };
                let deadline = Instant::now() + wait;
                loop {
                    io_tx.wire.pump(Duration::from_millis(if wait.is_zero() { 0 } else { 5 }));
                    nvme_take(&mut io_tx.wire, digests, &mut io_seen);
                    let mut answered = false;
                    while let Some((r_cid, ttag, off, len)) = io_seen.r2ts.pop_front() {
                        if r_cid != cid || r2t_data.is_empty() {
                            continue;
                        }
                        let end = off.saturating_add(len).min(r2t_data.len() as u32);
                        let mut o = off;
                        while o < end {
                            let l = (end - o).min(maxh2c).min(65536);
                            let d = DataPdu {
                                cid,
                                ttag,
                                offset: o,
                                last: o + l >= end,
                                success: false,
                                data: Bytes::copy_from_slice(&r2t_data[o as usize..(o + l) as usize]),
                            };
                            io_tx.pdu("H2CData", nvme_wire(&NvmePdu::H2CData(d), digests));
                            o += l;
                        }
                        answered = true;
                    }
                    if answered || io_seen.done.contains_key(&cid) || io_tx.wire.closed || Instant::now() >= deadline {
                        break;
                    }
                }
                // Keep under the queue size.
                let outstanding = |s: &NvmeSeen, c: u16| (c - 100) as u64 + 1 - s.completions.min((c - 100) as u64 + 1);
                let until = Instant::now() + Duration::from_millis(300);
                while outstanding(&io_seen, cid) > 24 && !io_tx.wire.closed && Instant::now() < until {
                    io_tx.wire.pump(Duration::from_millis(10));
                    nvme_take(&mut io_tx.wire, digests, &mut io_seen);
                }
            }
            io_tx.flush_held();
            io_tx.wire.pump(Duration::from_millis(50));
            nvme_take(&mut io_tx.wire, digests, &mut io_seen);
        }
        report += &format!("; I/O: {} PDUs, {} completions", io_tx.pdus, io_seen.completions);
        if io_seen.ic.is_none() || io_tx.pdus < 2 || (io_seen.completions == 0 && !io_tx.wire.closed) {
            ending = "I/O queue refused";
        }
        pdus += io_tx.pdus;
        if io_tx.wire.closed || io_seen.terminated {
            ending = "closed by the target";
        }
        log.extend(io_tx.log);
    }
    admin_tx.wire.pump(Duration::ZERO);
    if admin_tx.wire.closed || admin_seen.terminated {
        ending = "closed by the target";
    }
    Outcome { ending, detail: report, pdus, log }
}

// ---------------------------------------------------------------- the run

#[derive(Clone, Copy, PartialEq, Debug)]
enum Proto {
    Iscsi,
    Nvme,
    /// The control methods over HTTP (`--rpc-http`).
    Http,
}

fn config(dir: &TempDir, iscsi_port: u16, nvme_port: u16) -> String {
    let t = format!(
        "[[volume]]\nname = \"f0\"\nbackend = \"ram:{fm}M\"\n[[volume]]\nname = \"f1\"\nbackend = \"ram:{fm}M\"\n\
         [[volume]]\nname = \"clean_i\"\nbackend = \"ram:8M\"\n[[volume]]\nname = \"clean_n\"\nbackend = \"ram:8M\"\n\
         [iscsi]\nlisten = [\"127.0.0.1:{iscsi_port}\"]\n\
         [[iscsi.target]]\niqn = \"{FUZZ_IQN}\"\nluns = [{{ lun = 0, volume = \"f0\" }}, {{ lun = 1, volume = \"f1\" }}]\n\
         [[iscsi.target]]\niqn = \"{CLEAN_IQN}\"\nluns = [{{ lun = 0, volume = \"clean_i\" }}]\n\
         [nvme]\nlisten = [\"127.0.0.1:{nvme_port}\"]\n\
         [[nvme.subsystem]]\nnqn = \"{FUZZ_NQN}\"\nnamespaces = [{{ nsid = 1, volume = \"f0\" }}, {{ nsid = 2, volume = \"f1\" }}]\n\
         [[nvme.subsystem]]\nnqn = \"{CLEAN_NQN}\"\nnamespaces = [{{ nsid = 1, volume = \"clean_n\" }}]\n\
         [limits]\nlogin_timeout_s = 5\n",
        fm = FUZZ_BLOCKS / 2048
    );
    let path = dir.path().join("serve.toml");
    std::fs::write(&path, t).expect("write config");
    path.to_str().expect("UTF-8 path").to_string()
}

/// Verify `url` over and over until `stop`; returns (passes, failures).
fn clean_loop(url: String, stop: Arc<AtomicBool>) -> (u64, Vec<String>) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    rt.block_on(async move {
        let opts = ConnectOptions { timeout: Duration::from_secs(20), ..Default::default() };
        let (mut passes, mut failures) = (0u64, Vec::new());
        let client = match bw_initiator::connect(&url, &opts).await {
            Ok(c) => c,
            Err(e) => return (0, vec![format!("{url}: connect: {e}")]),
        };
        let mut seed = 1;
        while !stop.load(Ordering::Relaxed) {
            let p = VerifyParams { offset: (seed % 4) * (1 << 20), size: 2 << 20, seed, chunk: 64 << 10, concurrency: 4 };
            match verify(client.clone(), &p).await {
                Ok(_) => {
                    passes += 1;
                    // Leave the CPU to the fuzzers most of the time.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    failures.push(format!("{url}: verify {seed}: {e}"));
                    break;
                }
            }
            seed += 1;
        }
        let _ = client.close().await;
        (passes, failures)
    })
}

/// Fuzz one protocol for `seconds` with a clean session alongside.
fn run(proto: Proto) {
    let seed = seed();
    let secs = seconds();
    eprintln!("socket fuzz {proto:?}: SOCKET_FUZZ_SEED={seed}, {secs} s");
    let dir = TempDir::new("sfz");
    let (ip, np) = (free_port(), free_port());
    let cfg = config(&dir, ip, np);
    let hp = free_port();
    let creds = http_credentials(&dir);
    let http = [format!("127.0.0.1:{hp}"), creds.display().to_string()];
    let mut args = vec!["--config", &cfg, "--control", "none"];
    if proto == Proto::Http {
        args.extend(["--rpc-http", &http[0], "--rpc-http-credentials", &http[1]]);
    }
    let mut serve = Serve::start(&args);
    let pid = serve.pid();
    let (port, clean_url) = match proto {
        Proto::Iscsi => (ip, format!("iscsi://127.0.0.1:{ip}/{CLEAN_IQN}/0")),
        Proto::Nvme => (np, format!("nvme+tcp://127.0.0.1:{np}/{CLEAN_NQN}/1")),
        Proto::Http => (hp, format!("http://127.0.0.1:{hp}/")),
    };
    let session = |p: u16, s: u64, rate: f64, c: &Mutex<BTreeMap<Mutation, u64>>| match proto {
        Proto::Iscsi => iscsi_session(p, s, rate, c),
        Proto::Nvme => nvme_session(p, s, rate, c),
        Proto::Http => http_session(p, s, rate, c),
    };
    // Warm up with clean sessions (allocator arenas, thread pools), then
    // take the baseline.
    let counts = Mutex::new(BTreeMap::new());
    for i in 0..20 {
        let o = session(port, seed.wrapping_add(i), 0.0, &counts);
        assert!(CLEAN_ENDINGS.contains(&o.ending), "a clean {proto:?} session ended {:?}: {}", o.ending, o.detail);
    }
    let before = settle(pid, None);
    let stop = Arc::new(AtomicBool::new(false));
    let clean = {
        let (u, s) = (clean_url.clone(), stop.clone());
        match proto {
            Proto::Http => std::thread::spawn(move || http_clean_loop(hp, s)),
            _ => std::thread::spawn(move || clean_loop(u, s)),
        }
    };
    let sampler = Sampler::start(pid);
    let sessions = AtomicU64::new(0);
    let pdus_total = AtomicU64::new(0);
    let endings = Mutex::new(BTreeMap::<&'static str, u64>::new());
    let unmutated_failures = Mutex::new(Vec::<String>::new());
    let recent = Mutex::new(VecDeque::<String>::new());
    let dead = AtomicBool::new(false);
    let t0 = Instant::now();
    let counts = Mutex::new(BTreeMap::new());
    std::thread::scope(|sc| {
        for w in 0..FUZZERS as u64 {
            let (sessions, endings, recent, dead, counts, pdus_total, unmutated_failures) =
                (&sessions, &endings, &recent, &dead, &counts, &pdus_total, &unmutated_failures);
            sc.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed ^ (w << 32));
                while t0.elapsed() < Duration::from_secs(secs) && !dead.load(Ordering::Relaxed) {
                    let s: u64 = rng.gen();
                    let rate = [0.0, 0.02, 0.1, 0.3][rng.gen_range(0..4)];
                    let o = session(port, s, rate, counts);
                    let n = sessions.fetch_add(1, Ordering::Relaxed) + 1;
                    *endings.lock().expect("endings").entry(o.ending).or_default() += 1;
                    pdus_total.fetch_add(o.pdus, Ordering::Relaxed);
                    let line = format!("session {n} seed {s} rate {rate}: {} ({}), {} PDUs; {}", o.ending, o.detail, o.pdus, o.log.join("; "));
                    // A session without mutations must go as a valid one does.
                    if rate == 0.0 && !CLEAN_ENDINGS.contains(&o.ending) {
                        unmutated_failures.lock().expect("unmutated").push(line.clone());
                    }
                    let mut r = recent.lock().expect("recent");
                    r.push_back(line);
                    if r.len() > 12 {
                        r.pop_front();
                    }
                    drop(r);
                    if o.ending == "connect failed" && TcpStream::connect(("127.0.0.1", port)).is_err() {
                        dead.store(true, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let fuzz_time = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (passes, failures) = clean.join().expect("clean session thread");
    let peak = sampler.finish();
    let alive = serve.is_running();
    let after = settle(pid, Some(before));
    let log = serve.log_text();
    let panics: Vec<&str> = log.lines().filter(|l| l.contains("panicked")).take(5).collect();
    let counts = counts.into_inner().expect("counts");
    let mutations: u64 = counts.values().sum();
    eprintln!(
        "SOCKET FUZZ {proto:?}: {} sessions, {} PDUs, {mutations} mutations {counts:?}, in {fuzz_time:?} (busy machine); endings {:?}; \
         clean session: {passes} {} passed, {} failed; target before {before:?}, peak {peak:?}, after {after:?}",
        sessions.load(Ordering::Relaxed),
        pdus_total.load(Ordering::Relaxed),
        endings.lock().expect("endings"),
        if proto == Proto::Http { "authenticated status requests" } else { "verifies of 2 MiB" },
        failures.len()
    );
    let unmutated_failures = unmutated_failures.into_inner().expect("unmutated");
    assert!(unmutated_failures.is_empty(), "sessions without mutations went wrong (the fuzzer's or the target's bug):\n{}", unmutated_failures.join("\n"));
    let recent = recent.into_inner().expect("recent");
    let last = || recent.iter().cloned().collect::<Vec<_>>().join("\n");
    assert!(
        alive && !dead.load(Ordering::Relaxed),
        "the target died; last sessions:\n{}\n{}",
        last(),
        log.lines().rev().take(30).collect::<Vec<_>>().join("\n")
    );
    assert!(panics.is_empty(), "the target panicked: {panics:#?}\nlast sessions:\n{}", last());
    assert!(failures.is_empty(), "the clean session was disturbed: {failures:?}\nlast sessions:\n{}", last());
    assert!(passes > 0, "the clean session made no progress in {fuzz_time:?}");
    assert!(mutations > 0 && sessions.load(Ordering::Relaxed) >= 10, "the fuzzer hardly ran");
    assert!(
        peak.rss_anon_kib <= before.rss_anon_kib + RSS_ANON_GROWTH_LIMIT_KIB,
        "target anonymous memory grew from {} to {} KiB",
        before.rss_anon_kib,
        peak.rss_anon_kib
    );
    assert!(after.fds <= before.fds + 2 && after.threads <= before.threads + 2, "connections left behind: {before:?} -> {after:?}");
    assert!(serve.stop().success());
}

#[test]
fn iscsi_survives_mutated_sessions() {
    run(Proto::Iscsi);
}

#[test]
fn nvme_tcp_survives_mutated_sessions() {
    run(Proto::Nvme);
}

/// The HTTP control endpoint: mutated requests before and after
/// authentication, while an authenticated client keeps asking.
#[test]
fn http_control_survives_mutated_requests() {
    run(Proto::Http);
}

// ---------------------------------------------------------------- HTTP

/// `USER:PASSWORD` of the fuzzed endpoint.
const HTTP_USER: &str = "fuzz:fuzz-pass-52";

/// A private credentials file for `--rpc-http-credentials` in `dir`.
fn http_credentials(dir: &TempDir) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.path().join("rpc.creds");
    std::fs::write(&p, format!("{HTTP_USER}\n")).expect("write credentials");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod credentials");
    p
}

/// JSON-RPC bodies the HTTP sessions send: reads, errors, a batch, and a
/// change and its undoing.
const HTTP_BODIES: &[&str] = &[
    r#"{"jsonrpc":"2.0","id":1,"method":"status"}"#,
    r#"{"jsonrpc":"2.0","id":2,"method":"bdev_get_bdevs"}"#,
    r#"{"jsonrpc":"2.0","id":3,"method":"rpc_get_methods"}"#,
    r#"[{"jsonrpc":"2.0","id":4,"method":"volume_list"},{"jsonrpc":"2.0","id":5,"method":"nope"}]"#,
    r#"{"jsonrpc":"2.0","id":6,"method":"volume_add","params":{"name":"fz","backend":"ram:1M"}}"#,
    r#"{"jsonrpc":"2.0","id":7,"method":"volume_remove","params":{"name":"fz"}}"#,
    r#"{"jsonrpc":"2.0","id":8,"method":"volume_resize","params":{"name":"f0","size":"lots"}}"#,
    r#"{"jsonrpc":"2.0","id":9,"method":"drain","params":{"timeout_s":18446744073709551615}}"#,
];

/// A request's head (`auth`: USER:PASSWORD, or none) and body.
fn http_request(rng: &mut SmallRng, auth: Option<&str>) -> (Vec<u8>, Vec<u8>, &'static str) {
    let method = if rng.gen_bool(0.9) { "POST" } else { ["GET", "PUT", "OPTIONS"][rng.gen_range(0..3)] };
    let body = HTTP_BODIES[rng.gen_range(0..HTTP_BODIES.len())];
    let auth = auth.map(|a| format!("Authorization: Basic {}\r\n", base64(a.as_bytes()))).unwrap_or_default();
    let (length, body) = if rng.gen_bool(0.15) {
        ("Transfer-Encoding: chunked".to_string(), format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len()))
    } else {
        (format!("Content-Length: {}", body.len()), body.to_string())
    };
    let head = format!("{method} / HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n{length}\r\n\r\n");
    (head.into_bytes(), body.into_bytes(), method)
}

/// The status of an HTTP answer in `inbox`, once its head has come.
fn http_status(inbox: &[u8]) -> Option<u16> {
    let head = inbox.windows(4).position(|w| w == b"\r\n\r\n").map(|e| &inbox[..e])?;
    std::str::from_utf8(head).ok()?.split(' ').nth(1)?.parse().ok()
}

/// One fuzzing session against the HTTP endpoint: one to three requests,
/// each on its own connection (one request per connection), without,
/// with wrong or (mostly) with the right credentials; unmutated, each
/// must get what it asks for (200, 401, 405).
fn http_session(port: u16, seed: u64, rate: f64, counts: &Mutex<BTreeMap<Mutation, u64>>) -> Outcome {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (mut pdus, mut log) = (0, Vec::new());
    let mut ending = "answered as expected";
    let mut detail = String::new();
    for r in 0..rng.gen_range(1..=3u64) {
        // An address per session, so sessions at once are different peers
        // as often as not (admission counts per address).
        let Some(wire) = Wire::connect_from(port, 10 + (seed % 100) as u8) else { return Outcome::early("connect failed", None) };
        let auth = [None, Some("fuzz:wrong-pass"), Some(HTTP_USER), Some(HTTP_USER), Some(HTTP_USER)][rng.gen_range(0..5)];
        let (head, body, method) = http_request(&mut rng, auth);
        let expect = match (auth, method) {
            (Some(HTTP_USER), "POST") => 200,
            (Some(HTTP_USER), _) => 405,
            _ => 401,
        };
        let mut tx = Sender {
            wire,
            rng: SmallRng::seed_from_u64(seed ^ r ^ 0x5eed),
            rate,
            layout: Layout { header_len: head.len(), lengths: &[] },
            held: None,
            pdus: 0,
            log: Vec::new(),
            counts,
        };
        let sent = tx.pdu("head", head);
        tx.layout.header_len = body.len();
        if sent && !body.is_empty() {
            tx.pdu("body", body);
        }
        tx.flush_held();
        let deadline = Instant::now() + Duration::from_secs(3);
        while !tx.wire.closed && Instant::now() < deadline && http_status(&tx.wire.inbox).is_none() {
            tx.wire.pump(Duration::from_millis(100));
        }
        let got = http_status(&tx.wire.inbox);
        pdus += tx.pdus;
        log.extend(tx.log.iter().map(|l| format!("request {r}: {l}")));
        let this = match got {
            Some(s) if s == expect => "answered as expected",
            Some(_) => "answered otherwise",
            None if tx.wire.closed => "closed unanswered",
            None => "no answer in 3 s",
        };
        if this != "answered as expected" {
            ending = this;
            detail = format!("request {r}: {method} with {auth:?}: {got:?}, expected {expect}");
        }
    }
    Outcome { ending, detail, pdus, log }
}

/// An authenticated client asking for the status over and over until
/// `stop`, from an address of its own; (passes, failures).
fn http_clean_loop(port: u16, stop: Arc<AtomicBool>) -> (u64, Vec<String>) {
    let (mut passes, mut failures) = (0u64, Vec::new());
    let req = format!(
        "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic {}\r\nContent-Length: {}\r\n\r\n{}",
        base64(HTTP_USER.as_bytes()),
        HTTP_BODIES[0].len(),
        HTTP_BODIES[0]
    );
    while !stop.load(Ordering::Relaxed) {
        let Some(mut w) = Wire::connect_from(port, 2) else {
            failures.push("connect failed".into());
            break;
        };
        let sent = w.send(req.as_bytes());
        // Read until the server closes: an answer comes whole or not at all.
        let deadline = Instant::now() + Duration::from_secs(30);
        while sent && !w.closed && Instant::now() < deadline {
            w.pump(Duration::from_millis(100));
        }
        let text = String::from_utf8_lossy(&w.inbox).into_owned();
        if !(text.starts_with("HTTP/1.1 200") && text.contains("\"result\"")) {
            failures.push(format!("status: {:?}", text.lines().next().unwrap_or("(nothing)")));
            break;
        }
        passes += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    (passes, failures)
}

// ---------------------------------------------------------------- huge claims

/// A target with one small volume on both front-ends.
fn small_target() -> (TempDir, Serve, u16, u16) {
    let dir = TempDir::new("claim");
    let (ip, np) = (free_port(), free_port());
    let cfg = config(&dir, ip, np);
    let serve = Serve::start(&["--config", &cfg]);
    (dir, serve, ip, np)
}

/// A logged-in iSCSI connection (no digests, InitialR2T=Yes, no immediate data).
fn iscsi_logged_in(port: u16) -> (Wire, u32) {
    let mut w = Wire::connect(port).expect("connect");
    let text = bw_iscsi::text::encode(&[
        ("InitiatorName", "iqn.2026-11.org.blockwire.test:claims"),
        ("TargetName", FUZZ_IQN),
        ("SessionType", "Normal"),
        ("HeaderDigest", "None"),
        ("DataDigest", "None"),
        ("InitialR2T", "Yes"),
        ("ImmediateData", "No"),
        ("MaxBurstLength", "262144"),
    ]);
    let login = LoginRequest { transit: true, csg: 1, nsg: 3, isid: [0x80, 0, 0, 0, 0, 9], cmd_sn: 1, ..Default::default() };
    let none = IscsiDigests { header: false, data: false };
    assert!(w.send(&iscsi_wire(Message::LoginRequest(login).encode(), &text, none)));
    let dec = IscsiDecoder::new(1 << 20);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        w.pump(Duration::from_millis(20));
        if let Ok(Some(p)) = dec.decode(&mut w.inbox) {
            assert_eq!(login_status(&p.bhs), 0, "login refused");
            return (w, p.bhs.get(field::EXP_CMD_SN));
        }
        assert!(Instant::now() < deadline && !w.closed, "no login response");
    }
}

/// The target's anonymous memory, sampled while `f` runs: the peak growth.
fn anon_growth_during(pid: u32, f: impl FnOnce()) -> u64 {
    let before = proc_stats(pid);
    let sampler = Sampler::start(pid);
    f();
    std::thread::sleep(Duration::from_millis(200));
    let peak = sampler.finish();
    peak.rss_anon_kib.saturating_sub(before.rss_anon_kib)
}

/// An iSCSI PDU announcing a 16 MiB data segment (above MaxRecvDataSegmentLength),
/// in the login phase and after it: the connection is closed without the
/// data being awaited or a buffer of that size being filled; other
/// connections carry on.
#[test]
fn iscsi_huge_data_segment_length_is_refused() {
    let (_dir, mut serve, ip, _) = small_target();
    let pid = serve.pid();
    let grown = anon_growth_during(pid, || {
        for phase in ["login", "full feature"] {
            let mut conns = Vec::new();
            for _ in 0..32 {
                let (mut w, mut bhs) = if phase == "login" {
                    let mut b = Bhs::default();
                    b.0[0] = 0x43;
                    b.0[1] = 0x87;
                    (Wire::connect(ip).expect("connect"), b)
                } else {
                    let (w, cmd_sn) = iscsi_logged_in(ip);
                    let c = ScsiCommand { final_: true, write: true, itt: 1, edtl: 4096, cmd_sn, cdb: bw_scsi::initiator::write_16(0, 8), ..Default::default() };
                    (w, Message::ScsiCommand(c).encode())
                };
                bhs.set_data_segment_len(0xFF_FFFF);
                assert!(w.send(&bhs.0), "{phase}: header not sent");
                // A little of the claimed data, then wait.
                w.send(&[0u8; 4096]);
                conns.push(w);
            }
            for (i, w) in conns.iter_mut().enumerate() {
                assert!(w.closed_within(Duration::from_secs(5)), "{phase}: connection {i} with a 16 MiB DataSegmentLength stayed open");
            }
        }
    });
    eprintln!("huge DataSegmentLength: 64 connections refused; target anonymous memory grew {grown} KiB meanwhile");
    assert!(grown < 32 * 1024, "64 claims of 16 MiB grew the target by {grown} KiB");
    assert!(serve.is_running());
    let (mut w, _) = iscsi_logged_in(ip);
    assert!(!w.closed_within(Duration::from_millis(200)), "a normal login after the claims failed");
    assert!(serve.stop().success());
}

/// A WRITE whose Expected Data Transfer Length is 4 GiB - 1 (and whose CDB
/// asks for that many bytes): the target must refuse it at once with CHECK
/// CONDITION rather than solicit, and buffer, gigabytes with R2Ts; the
/// connection stays usable.
#[test]
fn iscsi_huge_write_transfer_length_is_refused_without_r2t() {
    let (_dir, mut serve, ip, _) = small_target();
    let pid = serve.pid();
    let (mut w, mut cmd_sn) = iscsi_logged_in(ip);
    let dec = IscsiDecoder::new(1 << 20);
    let grown = anon_growth_during(pid, || {
        for (i, (edtl, blocks)) in [(0xFFFF_FFFFu32, 0x7F_FFFFu32), (0xFFFF_FFFF, 8), (64 << 20, (64 << 20) / 512)].into_iter().enumerate() {
            let itt = 0x10 + i as u32;
            let c = ScsiCommand { final_: true, write: true, itt, edtl, cmd_sn, cdb: bw_scsi::initiator::write_16(0, blocks), ..Default::default() };
            cmd_sn += 1;
            assert!(w.send(&iscsi_wire(Message::ScsiCommand(c).encode(), &[], IscsiDigests { header: false, data: false })));
            let deadline = Instant::now() + Duration::from_secs(5);
            let status = loop {
                w.pump(Duration::from_millis(20));
                match dec.decode(&mut w.inbox) {
                    Ok(Some(p)) if p.bhs.0[0] & 0x3F == 0x31 => {
                        panic!("WRITE with EDTL {edtl:#x} ({blocks} blocks) was answered with an R2T for {} bytes", p.bhs.get(field::DESIRED_LENGTH))
                    }
                    Ok(Some(p)) if p.bhs.0[0] & 0x3F == 0x21 && p.bhs.itt() == itt => break p.bhs.0[3],
                    Ok(Some(_)) => {}
                    Ok(None) => {}
                    Err(e) => panic!("bad PDU from the target: {e}"),
                }
                assert!(!w.closed, "the target closed the connection on a WRITE with EDTL {edtl:#x}");
                assert!(Instant::now() < deadline, "no answer to a WRITE with EDTL {edtl:#x}");
            };
            assert_eq!(status, bw_scsi::status::CHECK_CONDITION, "EDTL {edtl:#x}");
        }
    });
    eprintln!("huge WRITE transfer lengths refused with CHECK CONDITION; target anonymous memory grew {grown} KiB");
    // The session still works.
    let c = ScsiCommand { final_: true, itt: 0x99, cmd_sn, cdb: cdb16(&bw_scsi::initiator::test_unit_ready()), ..Default::default() };
    assert!(w.send(&iscsi_wire(Message::ScsiCommand(c).encode(), &[], IscsiDigests { header: false, data: false })));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        w.pump(Duration::from_millis(20));
        if let Ok(Some(p)) = dec.decode(&mut w.inbox) {
            if p.bhs.0[0] & 0x3F == 0x21 && p.bhs.itt() == 0x99 {
                assert_eq!(p.bhs.0[3], 0, "TEST UNIT READY after the refusals");
                break;
            }
        }
        assert!(Instant::now() < deadline && !w.closed, "no answer to TEST UNIT READY");
    }
    assert!(serve.is_running());
    assert!(serve.stop().success());
}

/// NVMe/TCP: an ICReq or a command capsule whose PDU length claims 4 GiB,
/// an H2CData whose DATAL exceeds MAXH2CDATA, and a write whose transport
/// SGL asks for more than MDTS: each is refused (C2HTermReq and close, or
/// an error completion without an R2T), none is allocated.
#[test]
fn nvme_tcp_huge_length_claims_are_refused() {
    let (_dir, mut serve, _, np) = small_target();
    let pid = serve.pid();
    let counts = Mutex::new(BTreeMap::new());
    let d = bw_nvme::Digests::default();
    // The admin queue is returned too: it must stay open for the controller's life.
    let open_io = |rng: &mut SmallRng| -> (Sender<'_>, Sender<'_>, NvmeSeen) {
        let mut admin = nvme_sender(np, 1, 0.0, &counts).expect("connect");
        let mut seen = NvmeSeen::default();
        let cntlid = nvme_open(&mut admin, rng, 0, 0xFFFF, "nqn.2014-08.org.nvmexpress:uuid:claims", d, &mut seen).expect("admin connect");
        let en = NvmePdu::CapsuleCmd(CapsuleCmd {
            sqe: {
                let mut s = Property::set_sqe(0, reg::CC, 0x46_0001);
                s.set_cid(2);
                s
            },
            data: Bytes::new(),
        });
        admin.pdu("CC.EN", nvme_wire(&en, d));
        admin.wire.pump(Duration::from_millis(50));
        let mut io = nvme_sender(np, 2, 0.0, &counts).expect("connect");
        let mut io_seen = NvmeSeen::default();
        nvme_open(&mut io, rng, 1, cntlid, "nqn.2014-08.org.nvmexpress:uuid:claims", d, &mut io_seen).expect("I/O connect");
        (admin, io, io_seen)
    };
    let mut rng = SmallRng::seed_from_u64(7);
    let grown = anon_growth_during(pid, || {
        // ICReq claiming 4 GiB.
        for _ in 0..16 {
            let mut w = Wire::connect(np).expect("connect");
            let mut b = nvme_wire(&NvmePdu::IcReq(IcReq { pfv: 0, hpda: 0, digests: d, maxr2t: 0 }), d);
            b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
            w.send(&b);
            w.send(&[0u8; 4096]);
            assert!(w.closed_within(Duration::from_secs(5)), "an ICReq claiming 4 GiB left the connection open");
        }
        // A capsule claiming 4 GiB, an H2CData with DATAL above MAXH2CDATA.
        for what in ["capsule PLEN", "H2CData DATAL"] {
            let (_admin, mut io, mut seen) = open_io(&mut rng);
            let mut s = Sqe::new(nvm::WRITE, 7, 1);
            s.set_rw(0, 8);
            if what == "capsule PLEN" {
                s.set_sgl(Sgl { addr: 0, length: 4096, kind: sgl::INCAPSULE });
                let mut b = nvme_wire(&NvmePdu::CapsuleCmd(CapsuleCmd { sqe: s, data: Bytes::from(vec![0u8; 4096]) }), d);
                b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
                io.wire.send(&b);
            } else {
                s.set_sgl(Sgl { addr: 0, length: 4096, kind: sgl::TRANSPORT });
                io.wire.send(&nvme_wire(&NvmePdu::CapsuleCmd(CapsuleCmd { sqe: s, data: Bytes::new() }), d));
                let deadline = Instant::now() + Duration::from_secs(5);
                while seen.r2ts.is_empty() && Instant::now() < deadline {
                    io.wire.pump(Duration::from_millis(20));
                    nvme_take(&mut io.wire, d, &mut seen);
                }
                let (_, ttag, _, _) = seen.r2ts.pop_front().expect("an R2T for a 4 KiB write");
                let h = DataPdu { cid: 7, ttag, offset: 0, last: true, success: false, data: Bytes::from(vec![0u8; 4096]) };
                let mut b = nvme_wire(&NvmePdu::H2CData(h), d);
                // DATAL and PLEN claim 3 GiB.
                b[16..20].copy_from_slice(&0xC000_0000u32.to_le_bytes());
                b[4..8].copy_from_slice(&(0xC000_0000u32 + 24).to_le_bytes());
                io.wire.send(&b);
            }
            io.wire.send(&[0u8; 4096]);
            let deadline = Instant::now() + Duration::from_secs(5);
            while !io.wire.closed && Instant::now() < deadline {
                io.wire.pump(Duration::from_millis(20));
                nvme_take(&mut io.wire, d, &mut seen);
            }
            assert!(io.wire.closed, "{what} claiming gigabytes left the connection open");
            assert!(seen.terminated, "{what}: no C2HTermReq before the close");
        }
        // A write asking for more than MDTS (and for 4 GiB - 512): an error
        // completion, no R2T; the queue stays up.
        let (_admin, mut io, mut seen) = open_io(&mut rng);
        for (cid, len) in [(20u16, bw_nvme::limits::MAX_TRANSFER + 512), (21, u32::MAX - 511)] {
            let mut s = Sqe::new(nvm::WRITE, cid, 1);
            s.set_rw(0, (len / 512).min(0x1_0000));
            s.set_sgl(Sgl { addr: 0, length: len, kind: sgl::TRANSPORT });
            io.wire.send(&nvme_wire(&NvmePdu::CapsuleCmd(CapsuleCmd { sqe: s, data: Bytes::new() }), d));
            let deadline = Instant::now() + Duration::from_secs(5);
            while !seen.done.contains_key(&cid) && Instant::now() < deadline && !io.wire.closed {
                io.wire.pump(Duration::from_millis(20));
                nvme_take(&mut io.wire, d, &mut seen);
            }
            assert!(seen.r2ts.is_empty(), "a write of {len} bytes was answered with an R2T");
            let (status, _) = seen.done.get(&cid).copied().unwrap_or_else(|| panic!("no completion for a write of {len} bytes"));
            assert_ne!(status, 0, "a write of {len} bytes succeeded");
        }
        assert!(!io.wire.closed, "refusing an oversized write closed the queue");
    });
    eprintln!("NVMe/TCP huge claims refused; target anonymous memory grew {grown} KiB meanwhile");
    assert!(grown < 32 * 1024, "claims of gigabytes grew the target by {grown} KiB");
    assert!(serve.is_running());
    assert!(!serve.log_text().contains("panicked"));
    assert!(serve.stop().success());
}

/// An H2CTermReq with the DDGST flag and 1-3 bytes after its header, before
/// or after the ICReq: the PDU decoder read a data digest past the end of
/// the PDU and panicked the connection's task (found by the pdu_decode fuzz
/// target). Now the connection just ends; the target stays up and a clean
/// controller still reads.
#[test]
fn nvme_tcp_term_req_with_ddgst_flag_ends_only_its_connection() {
    let (_dir, mut serve, _, np) = small_target();
    let d = bw_nvme::Digests::default();
    for after_icreq in [false, true] {
        for extra in 1..=3u8 {
            let mut w = Wire::connect(np).expect("connect");
            if after_icreq {
                w.send(&nvme_wire(&NvmePdu::IcReq(IcReq { pfv: 0, hpda: 0, digests: d, maxr2t: 0 }), d));
            }
            let mut b = vec![0x02, 0x02, 24, 0, 24 + extra, 0, 0, 0, 1, 0];
            b.resize(24 + extra as usize, 0);
            w.send(&b);
            assert!(w.closed_within(Duration::from_secs(5)), "a TermReq ({extra} bytes of data) left the connection open");
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let c = bw_initiator::connect(&format!("nvme+tcp://127.0.0.1:{np}/{CLEAN_NQN}/1"), &Default::default()).await.expect("clean connect");
        let mut buf = vec![0u8; 4096];
        c.read(0, &mut buf).await.expect("clean read");
        c.close().await.expect("clean close");
    });
    assert!(serve.is_running());
    let log = serve.log_text();
    assert!(!log.contains("panicked"), "the target panicked:\n{log}");
    assert!(serve.stop().success());
}

/// The login timeout bounds the whole login, not each read or each PDU: an
/// iSCSI login that stops after its first step, one that sends a valid step
/// every 2 s (each answered, the login never done), an NVMe/TCP queue that
/// stops after the ICReq, and peers that drip a login PDU a byte every
/// 250 ms (it would take them 25 s or more to finish) are all closed once
/// `login_timeout_s` (5) has passed. Only generous upper bounds (timeout +
/// 10 s) are asserted.
#[test]
fn stalled_and_dripping_logins_are_dropped_at_the_login_timeout() {
    let (_dir, mut serve, ip, np) = small_target();
    let none = IscsiDigests { header: false, data: false };
    let d = bw_nvme::Digests::default();
    // The first step of an iSCSI login: security negotiation, on to operational.
    let security = {
        let text = bw_iscsi::text::encode(&[
            ("InitiatorName", "iqn.2026-11.org.blockwire.test:stalled"),
            ("TargetName", FUZZ_IQN),
            ("SessionType", "Normal"),
            ("AuthMethod", "None"),
        ]);
        let login = LoginRequest { transit: true, csg: 0, nsg: 1, isid: [0x80, 0, 0, 0, 0, 11], cmd_sn: 1, ..Default::default() };
        iscsi_wire(Message::LoginRequest(login).encode(), &text, none)
    };
    let icreq = nvme_wire(&NvmePdu::IcReq(IcReq { pfv: 0, hpda: 0, digests: d, maxr2t: 0 }), d);
    let limit = Duration::from_secs(5 + 10);
    // Operational-stage steps that do not move on (T=0), one key each.
    let steps: Vec<Vec<u8>> = [("HeaderDigest", "None"), ("DataDigest", "None"), ("InitialR2T", "Yes"), ("ImmediateData", "No"), ("MaxBurstLength", "262144"), ("FirstBurstLength", "65536"), ("MaxOutstandingR2T", "1"), ("DataPDUInOrder", "Yes"), ("DataSequenceInOrder", "Yes"), ("ErrorRecoveryLevel", "0")]
        .iter()
        .enumerate()
        .map(|(i, kv)| {
            let login = LoginRequest { csg: 1, nsg: 1, isid: [0x80, 0, 0, 0, 0, 11], cmd_sn: 1, exp_stat_sn: i as u32 + 1, ..Default::default() };
            iscsi_wire(Message::LoginRequest(login).encode(), &bw_iscsi::text::encode(&[*kv]), none)
        })
        .collect();
    #[derive(Clone, Copy, PartialEq)]
    enum How {
        Stall,
        Drip,
        Steps,
    }
    let cases: [(&str, u16, &[u8], How); 5] = [
        ("iSCSI stalled after the security step", ip, &security, How::Stall),
        ("iSCSI login in steps 2 s apart", ip, &security, How::Steps),
        ("iSCSI login dripped", ip, &security, How::Drip),
        ("NVMe/TCP stalled after ICReq", np, &icreq, How::Stall),
        ("NVMe/TCP ICReq dripped", np, &icreq, How::Drip),
    ];
    let steps = &steps;
    let results: Vec<String> = std::thread::scope(|sc| {
        let handles: Vec<_> = cases
            .iter()
            .map(|&(what, port, pdu, how)| {
                sc.spawn(move || {
                    let t0 = Instant::now();
                    let mut w = Wire::connect(port).expect("connect");
                    if how == How::Drip {
                        let mut sent = 0;
                        for b in pdu {
                            if !w.send(&[*b]) {
                                break;
                            }
                            sent += 1;
                            w.pump(Duration::from_millis(250));
                            if w.closed || t0.elapsed() > limit {
                                break;
                            }
                        }
                        assert!(sent < pdu.len(), "{what}: the whole PDU got through before the login timeout");
                    } else {
                        assert!(w.send(pdu));
                        // The step is answered (the login is in progress, not refused).
                        let deadline = Instant::now() + Duration::from_secs(5);
                        while w.inbox.is_empty() && !w.closed && Instant::now() < deadline {
                            w.pump(Duration::from_millis(50));
                        }
                        if port == ip {
                            let dec = IscsiDecoder::new(1 << 20);
                            let p = dec.decode(&mut w.inbox).expect("a login response").expect("a whole login response");
                            assert_eq!(login_status(&p.bhs), 0, "{what}: the first step was refused");
                        } else {
                            assert!(matches!(bw_nvme::pdu::decode(&mut w.inbox, d, 1 << 20), Ok(Some(NvmePdu::IcResp(_)))), "{what}: no ICResp");
                        }
                        if how == How::Steps {
                            let dec = IscsiDecoder::new(1 << 20);
                            for (i, step) in steps.iter().enumerate() {
                                if w.closed_within(Duration::from_secs(2)) || t0.elapsed() > limit || !w.send(step) {
                                    break;
                                }
                                let deadline = Instant::now() + Duration::from_secs(5);
                                while w.inbox.is_empty() && !w.closed && Instant::now() < deadline {
                                    w.pump(Duration::from_millis(50));
                                }
                                if let Ok(Some(p)) = dec.decode(&mut w.inbox) {
                                    assert_eq!(login_status(&p.bhs), 0, "{what}: step {i} was refused");
                                }
                            }
                        }
                        w.closed_within(limit.saturating_sub(t0.elapsed()));
                    }
                    let took = t0.elapsed();
                    assert!(w.closed || w.closed_within(limit.saturating_sub(took)), "{what}: still open {took:?} after connecting (login_timeout_s = 5)");
                    format!("{what}: closed after {took:?}")
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("case thread")).collect()
    });
    eprintln!("login timeout 5 s: {results:?}");
    assert!(serve.is_running());
    // The connection closes before its task logs why: wait for the line.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !serve.log_text().contains("login_timeout_s") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(serve.log_text().contains("login_timeout_s"), "the drop is logged with the knob's name: {}", serve.log_text());
    assert!(serve.stop().success());
}

/// A Login Response's Status-Class and Status-Detail as one number (0: success).
fn login_status(b: &Bhs) -> u16 {
    u16::from(b.get(field::STATUS_CLASS)) << 8 | u16::from(b.get(field::STATUS_DETAIL))
}
