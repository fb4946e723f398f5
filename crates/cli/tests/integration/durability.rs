//! Durability: acknowledged writes survive a crash (SIGKILL) or an orderly
//! shutdown (SIGTERM) of `blockwire serve`, over each protocol.
//!
//! Every protocol's test serves two file volumes: `wt` (`sync`, write-through:
//! a write is durable once acknowledged) and `wb` (write-back: a write is
//! durable once a FLUSH issued after its acknowledgement is acknowledged).
//! Writers put 4 KiB blocks whose every sector names (block, generation,
//! sector) and carries a generation-specific fill; a ledger records what was
//! issued, acknowledged and covered by a flush. At a random moment the target
//! is killed, restarted on the same files, and every block is read back: a
//! sector older than the generation the ledger says must have survived is a
//! loss, named by volume, block, sector and generations.
//!
//! `DURABILITY_CYCLES` (default 3; `make soak` uses 20) sets the SIGKILL
//! cycles per protocol; `DURABILITY_SEED` replays a run's random choices.
//! What SIGKILL proves: nothing acknowledged was held only in the process
//! (user-space buffers, an answer sent before the write). The page cache
//! survives a process crash, so this is not a power-loss test.

use crate::common;
use bw_initiator::{BlockClient, ConnectOptions};
use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SECTOR: usize = 512;
const BLOCK: usize = 4096;
/// Blocks under test per volume (8 MiB): quick to read back after each cycle.
const BLOCKS: u64 = 2048;
/// Concurrent writers per volume; writer `i` owns the blocks `b % WRITERS == i`,
/// so writes to one block never race and its generations only grow.
const WRITERS: u64 = 8;
const MAGIC: &[u8; 8] = b"BWDURABL";
/// How long one request may take before the client gives up.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);
/// A generous hang detector, not a speed claim.
const EXIT_LIMIT: Duration = Duration::from_secs(10);

fn cycles() -> usize {
    std::env::var("DURABILITY_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(3)
}

fn seed() -> u64 {
    std::env::var("DURABILITY_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(rand::random)
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Proto {
    Aoe,
    Iscsi,
    Nvme,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    WriteThrough,
    WriteBack,
}

/// One 4 KiB block of generation `gen`.
fn block_data(block: u64, gen: u64) -> Vec<u8> {
    let mut d = vec![0u8; BLOCK];
    for (s, sec) in d.chunks_mut(SECTOR).enumerate() {
        sec[..8].copy_from_slice(MAGIC);
        sec[8..16].copy_from_slice(&block.to_le_bytes());
        sec[16..24].copy_from_slice(&gen.to_le_bytes());
        sec[24..28].copy_from_slice(&(s as u32).to_le_bytes());
        for (i, b) in sec[28..].iter_mut().enumerate() {
            *b = (gen as u8).wrapping_mul(31).wrapping_add(i as u8);
        }
    }
    d
}

/// What one sector holds.
enum Found {
    Zeroes,
    Gen(u64),
    /// Not a sector any writer wrote there (wrong block/sector, bad fill).
    Garbage(String),
}

fn parse_sector(block: u64, s: usize, sec: &[u8]) -> Found {
    if sec.iter().all(|&b| b == 0) {
        return Found::Zeroes;
    }
    let u64_at = |i: usize| u64::from_le_bytes(sec[i..i + 8].try_into().expect("8 bytes"));
    if &sec[..8] != MAGIC {
        return Found::Garbage("no magic".into());
    }
    let (b, gen, idx) = (u64_at(8), u64_at(16), u32::from_le_bytes(sec[24..28].try_into().expect("4 bytes")));
    if b != block || idx as usize != s {
        return Found::Garbage(format!("names block {b} sector {idx}"));
    }
    let fill_ok = sec[28..].iter().enumerate().all(|(i, &v)| v == (gen as u8).wrapping_mul(31).wrapping_add(i as u8));
    if !fill_ok {
        return Found::Garbage(format!("generation {gen} header with a torn fill"));
    }
    Found::Gen(gen)
}

#[derive(Default)]
struct LedgerState {
    /// Highest generation ever sent to a block.
    issued: HashMap<u64, u64>,
    /// Highest generation acknowledged per block.
    acked: HashMap<u64, u64>,
    /// The generation (or a newer one) that must be found, and in which cycle
    /// that became so.
    required: HashMap<u64, (u64, usize)>,
    acks: u64,
    flushes: u64,
}

/// The log of acknowledged writes of one volume.
struct Ledger {
    name: &'static str,
    mode: Mode,
    st: Mutex<LedgerState>,
    /// Readable event log, written to a file if a check fails.
    events: Mutex<String>,
}

impl Ledger {
    fn new(name: &'static str, mode: Mode) -> Ledger {
        Ledger { name, mode, st: Mutex::new(LedgerState::default()), events: Mutex::new(String::new()) }
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, LedgerState> {
        self.st.lock().expect("ledger lock")
    }
    fn issue(&self, block: u64, gen: u64) {
        self.lock().issued.insert(block, gen);
    }
    fn ack(&self, block: u64, gen: u64, cycle: usize) {
        let mut st = self.lock();
        st.acks += 1;
        st.acked.insert(block, gen);
        if self.mode == Mode::WriteThrough {
            st.required.insert(block, (gen, cycle));
        }
        drop(st);
        let _ = writeln!(self.events.lock().expect("events"), "cycle {cycle} ack block {block} gen {gen}");
    }
    fn acked_snapshot(&self) -> HashMap<u64, u64> {
        self.lock().acked.clone()
    }
    /// A flush issued after `snapshot` was taken has been acknowledged.
    fn flushed(&self, snapshot: &HashMap<u64, u64>, cycle: usize) {
        let mut st = self.lock();
        st.flushes += 1;
        for (&b, &g) in snapshot {
            let e = st.required.entry(b).or_insert((0, cycle));
            if g > e.0 {
                *e = (g, cycle);
            }
        }
        drop(st);
        let _ = writeln!(self.events.lock().expect("events"), "cycle {cycle} flush acked covering {} blocks", snapshot.len());
    }
    /// After an orderly shutdown everything acknowledged must be durable.
    fn all_acked_required(&self, cycle: usize) {
        let mut st = self.lock();
        let acked: Vec<(u64, u64)> = st.acked.iter().map(|(&b, &g)| (b, g)).collect();
        for (b, g) in acked {
            st.required.insert(b, (g, cycle));
        }
    }
    fn counts(&self) -> (u64, u64) {
        let st = self.lock();
        (st.acks, st.flushes)
    }
}

/// A protocol's target on two file volumes, restartable on the same files.
struct Rig {
    proto: Proto,
    dir: TempDir,
    pair: Option<NetnsPair>,
    config: PathBuf,
    port: u16,
}

const IQN: &str = "iqn.2026-11.org.blockwire.test:durability";
const NQN: &str = "nqn.2026-11.org.blockwire.test:durability";

impl Rig {
    fn new(proto: Proto) -> Rig {
        require_root();
        let dir = TempDir::new_in(env!("CARGO_TARGET_TMPDIR"), "dur");
        let d = dir.path().display().to_string();
        let mut toml = format!(
            "[[volume]]\nname = \"wt\"\nbackend = \"file:{d}/wt.img,size=16M,sync\"\n\
             [[volume]]\nname = \"wb\"\nbackend = \"file:{d}/wb.img,size=16M\"\n"
        );
        let port = free_port();
        let mut pair = None;
        match proto {
            Proto::Aoe => {
                let p = NetnsPair::new("du", 1500);
                for (vol, slot) in [("wt", 0), ("wb", 1)] {
                    let _ = write!(toml, "[[aoe.export]]\ninterface = \"{}\"\nvolume = \"{vol}\"\nshelf = 7\nslot = {slot}\n", p.ns_if);
                }
                pair = Some(p);
            }
            Proto::Iscsi => {
                let _ = write!(
                    toml,
                    "[iscsi]\nlisten = [\"127.0.0.1:{port}\"]\n[[iscsi.target]]\niqn = \"{IQN}\"\n\
                     luns = [{{ lun = 0, volume = \"wt\" }}, {{ lun = 1, volume = \"wb\" }}]\n"
                );
            }
            Proto::Nvme => {
                let _ = write!(
                    toml,
                    "[nvme]\nlisten = [\"127.0.0.1:{port}\"]\n[[nvme.subsystem]]\nnqn = \"{NQN}\"\n\
                     namespaces = [{{ nsid = 1, volume = \"wt\" }}, {{ nsid = 2, volume = \"wb\" }}]\n"
                );
            }
        }
        let config = dir.path().join("serve.toml");
        std::fs::write(&config, toml).expect("write config");
        Rig { proto, dir, pair, config, port }
    }

    fn start(&self) -> Serve {
        let cfg = self.config.to_str().expect("UTF-8 path");
        Serve::start_in(self.pair.as_ref().map(|p| p.ns.as_str()), &["--config", cfg])
    }

    /// URLs of (wt, wb).
    fn urls(&self) -> [String; 2] {
        let p = self.port;
        match self.proto {
            Proto::Aoe => {
                let h = &self.pair.as_ref().expect("veth pair").host_if;
                [format!("aoe://{h}/7.0"), format!("aoe://{h}/7.1")]
            }
            Proto::Iscsi => [format!("iscsi://127.0.0.1:{p}/{IQN}/0"), format!("iscsi://127.0.0.1:{p}/{IQN}/1")],
            Proto::Nvme => [format!("nvme+tcp://127.0.0.1:{p}/{NQN}/1"), format!("nvme+tcp://127.0.0.1:{p}/{NQN}/2")],
        }
    }

    fn log_path(&self, vol: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("durability-{:?}-{vol}.log", self.proto).to_lowercase())
    }
}

async fn connect(url: &str) -> Arc<dyn BlockClient> {
    let opts = ConnectOptions { timeout: CLIENT_TIMEOUT, ..Default::default() };
    // The target was just (re)started: give it a few tries.
    let mut last = None;
    for _ in 0..20 {
        match bw_initiator::connect(url, &opts).await {
            Ok(c) => return c,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("connect {url}: {:?}", last);
}

/// Write random blocks of its own until stopped or the target fails it.
async fn writer(client: Arc<dyn BlockClient>, ledger: Arc<Ledger>, id: u64, gens: Arc<AtomicU64>, stop: Arc<AtomicBool>, mut rng: SmallRng, cycle: usize) {
    while !stop.load(Ordering::Relaxed) {
        let block = rng.gen_range(0..BLOCKS / WRITERS) * WRITERS + id;
        let gen = gens.fetch_add(1, Ordering::Relaxed) + 1;
        ledger.issue(block, gen);
        match client.write(block * BLOCK as u64, &block_data(block, gen)).await {
            Ok(()) => ledger.ack(block, gen, cycle),
            Err(_) => return,
        }
    }
}

/// Write-back volumes: flush every few milliseconds; a flush acknowledged
/// makes every write acknowledged before it was sent durable.
async fn flusher(client: Arc<dyn BlockClient>, ledger: Arc<Ledger>, stop: Arc<AtomicBool>, mut rng: SmallRng, cycle: usize) {
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(5..40))).await;
        let snap = ledger.acked_snapshot();
        if client.flush().await.is_err() {
            return;
        }
        ledger.flushed(&snap, cycle);
    }
}

/// Read every block back and compare with the ledger; returns the losses.
async fn check(client: &Arc<dyn BlockClient>, ledger: &Ledger) -> Vec<String> {
    let (issued, required) = {
        let st = ledger.lock();
        (st.issued.clone(), st.required.clone())
    };
    let mut problems = Vec::new();
    let chunk_blocks = 64u64;
    let mut buf = vec![0u8; chunk_blocks as usize * BLOCK];
    for first in (0..BLOCKS).step_by(chunk_blocks as usize) {
        if let Err(e) = client.read(first * BLOCK as u64, &mut buf).await {
            problems.push(format!("{}: read of blocks {first}.. failed: {e}", ledger.name));
            return problems;
        }
        for (i, blk) in buf.chunks(BLOCK).enumerate() {
            let block = first + i as u64;
            let need = required.get(&block).copied();
            let max_issued = issued.get(&block).copied().unwrap_or(0);
            // One line per block: the first bad sector and how many there are.
            let mut bad = Vec::new();
            for (s, sec) in blk.chunks(SECTOR).enumerate() {
                let why = match (parse_sector(block, s, sec), need) {
                    (Found::Garbage(why), _) => format!("garbage ({why})"),
                    (Found::Gen(g), _) if g > max_issued => format!("generation {g}, never written there (last {max_issued})"),
                    (Found::Zeroes, Some((g, c))) => format!("LOST: zeroes, but generation {g} was durable-acknowledged in cycle {c}"),
                    (Found::Gen(f), Some((g, c))) if f < g => format!("LOST: generation {f}, but generation {g} was durable-acknowledged in cycle {c}"),
                    _ => continue,
                };
                bad.push((s, why));
            }
            if let Some((s, why)) = bad.first() {
                let byte = block * BLOCK as u64 + (*s * SECTOR) as u64;
                problems.push(format!("{} ({:?}) block {block} sector {s} (byte {byte}, {} of 8 sectors bad): {why}", ledger.name, ledger.mode, bad.len()));
            }
        }
    }
    problems
}

#[derive(Clone, Copy)]
enum Fault {
    Kill,
    Term,
}

/// Write to both volumes, strike with `fault` at a random moment, restart
/// and check. Returns the restarted target.
#[allow(clippy::too_many_arguments)]
fn cycle(rt: &tokio::runtime::Runtime, rig: &Rig, serve: Serve, ledgers: &[Arc<Ledger>; 2], gens: &Arc<AtomicU64>, rng: &mut SmallRng, n: usize, fault: Fault) -> Serve {
    let urls = rig.urls();
    let clients: Vec<Arc<dyn BlockClient>> = urls.iter().map(|u| rt.block_on(connect(u))).collect();
    let before: Vec<u64> = ledgers.iter().map(|l| l.counts().0).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (c, l) in clients.iter().zip(ledgers) {
        for id in 0..WRITERS {
            let r = SmallRng::seed_from_u64(rng.gen());
            tasks.push(rt.spawn(writer(c.clone(), l.clone(), id, gens.clone(), stop.clone(), r, n)));
        }
        if l.mode == Mode::WriteBack {
            let r = SmallRng::seed_from_u64(rng.gen());
            tasks.push(rt.spawn(flusher(c.clone(), l.clone(), stop.clone(), r, n)));
        }
    }
    let delay = Duration::from_millis(rng.gen_range(300..1500));
    std::thread::sleep(delay);
    let what = match fault {
        Fault::Kill => {
            let st = serve.kill_now();
            format!("SIGKILL after {delay:?} ({st})")
        }
        Fault::Term => {
            let (st, took) = serve.terminate_within(EXIT_LIMIT).unwrap_or_else(|| panic!("{:?}: serve did not exit within {EXIT_LIMIT:?} of SIGTERM under load", rig.proto));
            assert!(st.success(), "{:?}: serve exited with {st} after SIGTERM", rig.proto);
            format!("SIGTERM after {delay:?}, exit {st} in {took:?}")
        }
    };
    // Every request in flight must end (answered or failed) within a bound.
    let t0 = Instant::now();
    rt.block_on(async {
        for t in tasks {
            tokio::time::timeout(EXIT_LIMIT + CLIENT_TIMEOUT, t).await.expect("a writer hung after the target went away").expect("writer panicked");
        }
    });
    let writers_ended = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    drop(clients);
    if matches!(fault, Fault::Term) {
        // An orderly shutdown flushes every volume: nothing acknowledged may go.
        for l in ledgers {
            l.all_acked_required(n);
        }
    }
    let serve = rig.start();
    let mut report = format!("{:?} cycle {n}: {what}; writers ended {writers_ended:?} later;", rig.proto);
    for (i, (l, url)) in ledgers.iter().zip(&urls).enumerate() {
        let (acks, flushes) = l.counts();
        assert!(acks > before[i], "{:?} {}: no write was acknowledged before the fault; the cycle proves nothing", rig.proto, l.name);
        let c = rt.block_on(connect(url));
        let problems = rt.block_on(check(&c, l));
        let _ = rt.block_on(c.close());
        let _ = write!(report, " {} {} acks ({} total, {flushes} flushes) ok", l.name, acks - before[i], acks);
        if !problems.is_empty() {
            let path = rig.log_path(l.name);
            let _ = std::fs::write(&path, l.events.lock().expect("events").as_str());
            let shown: Vec<&String> = problems.iter().take(20).collect();
            panic!("{:?} cycle {n} ({what}): {} problems on {}, ledger in {}:\n{shown:#?}", rig.proto, problems.len(), l.name, path.display());
        }
    }
    eprintln!("{report}");
    serve
}

fn run(proto: Proto, fault: Fault) {
    let seed = seed();
    eprintln!("{proto:?}: DURABILITY_SEED={seed}");
    let mut rng = SmallRng::seed_from_u64(seed);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let rig = Rig::new(proto);
    let ledgers = [Arc::new(Ledger::new("wt", Mode::WriteThrough)), Arc::new(Ledger::new("wb", Mode::WriteBack))];
    let gens = Arc::new(AtomicU64::new(0));
    let mut serve = rig.start();
    let n = match fault {
        Fault::Kill => cycles(),
        Fault::Term => 1,
    };
    for i in 1..=n {
        serve = cycle(&rt, &rig, serve, &ledgers, &gens, &mut rng, i, fault);
    }
    assert!(serve.stop().success());
    // One line for the report (each cycle panics on any loss, so reaching
    // here means none).
    let what = match fault {
        Fault::Kill => "SIGKILL",
        Fault::Term => "SIGTERM",
    };
    let mut summary = format!("DURABILITY {proto:?}: {n} {what} cycles survived, 0 acknowledged writes lost (DURABILITY_SEED={seed});");
    for l in &ledgers {
        let (acks, flushes) = l.counts();
        let blocks = l.lock().required.len();
        let _ = write!(summary, " {} ({:?}) {acks} writes acknowledged, {flushes} flushes, {blocks} blocks checked with a required generation;", l.name, l.mode);
    }
    eprintln!("{summary}");
    let _ = &rig.dir;
}

#[test]
fn aoe_acknowledged_writes_survive_sigkill() {
    run(Proto::Aoe, Fault::Kill);
}

#[test]
fn iscsi_acknowledged_writes_survive_sigkill() {
    run(Proto::Iscsi, Fault::Kill);
}

#[test]
fn nvme_acknowledged_writes_survive_sigkill() {
    run(Proto::Nvme, Fault::Kill);
}

#[test]
fn aoe_sigterm_under_load_exits_promptly_and_loses_nothing() {
    run(Proto::Aoe, Fault::Term);
}

#[test]
fn iscsi_sigterm_under_load_exits_promptly_and_loses_nothing() {
    run(Proto::Iscsi, Fault::Term);
}

#[test]
fn nvme_sigterm_under_load_exits_promptly_and_loses_nothing() {
    run(Proto::Nvme, Fault::Term);
}
