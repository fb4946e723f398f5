//! `blockwire bench`: a small fio. `numjobs` groups of `iodepth` workers share
//! one client (like fio jobs sharing one kernel block device); each worker
//! keeps one request outstanding, so `numjobs * iodepth` requests are in
//! flight. Latency is recorded per request in HDR histograms.

use crate::clock::LatencyClock;
use crate::cpu::CpuTimes;
use bw_initiator::{BlockClient, HeldIo};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
pub use bw_workload_report::{BenchReport, DirectionReport, Latency, Rw};
use crate::ready_set::ReadySet;
use futures::FutureExt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct BenchParams {
    pub rw: Rw,
    pub bs: usize,
    pub iodepth: usize,
    pub numjobs: usize,
    pub rwmixread: u8,
    /// Stop after this long...
    pub runtime: Option<Duration>,
    /// ...or after this many requests in total (whichever comes first).
    pub ios: Option<u64>,
    /// Region of the device to use: `offset .. offset+size` (size 0 = to the end).
    pub offset: u64,
    pub size: u64,
    pub seed: u64,
    /// Requests issued before measuring starts (warms caches and windows).
    pub ramp_ios: u64,
    /// Where each job's buffer starts: this many bytes past a page boundary
    /// (0: page-aligned, as fio's buffers and the kernel's pages are).
    pub buf_offset: usize,
    /// Workers of a job polled at most per pass before the job lets the
    /// client send what they submitted ([`crate::DEFAULT_SUBMIT_BATCH`]
    /// says why and which; 0 counts as 1).
    pub submit_batch: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("invalid parameters: {0}")]
    Params(String),
    #[error("{op} of {len} bytes at offset {offset} failed")]
    Io { op: &'static str, offset: u64, len: usize, source: bw_initiator::ClientError },
}

struct Shared {
    stop: AtomicBool,
    issued: AtomicU64,
    limit: u64,
    measuring: AtomicBool,
    /// Every request's start and end ([`LatencyClock`]).
    clock: LatencyClock,
    /// Every worker's latencies, in one pair of histograms. A pair per
    /// worker (176 KiB each at these bounds) spread 32 workers' counters
    /// over 11 MiB, and the counters a run's latencies fall in over more
    /// than a CPU's caches: recording was 6.5% of the client's CPU at 4 KiB
    /// QD32 reads over NVMe/TCP (`perf record`,
    /// docs/notes/2026-11-25-lab-link-gro.md). Shared, they stay cached;
    /// Each worker gathers [`BATCH`] latencies before it takes the lock
    /// ([`Recorder`]): the lock per request was ~50 of the client's ~3,900
    /// instructions per 4 KiB QD32 read (callgrind,
    /// docs/notes/2026-11-26-floor-7.md).
    latencies: Mutex<Latencies>,
}

/// Latencies a worker records under one take of the shared lock.
const BATCH: usize = 64;

/// A worker's latencies not yet in the shared histograms: each as
/// nanoseconds shifted left once, the low bit set for a read. Dropped
/// (the worker ended, however), it records what it holds, so the report,
/// made once every worker has ended, has every request.
struct Recorder<'a> {
    shared: &'a Shared,
    held: Vec<u64>,
}

impl<'a> Recorder<'a> {
    fn new(shared: &'a Shared) -> Self {
        Recorder { shared, held: Vec::with_capacity(BATCH) }
    }

    fn record(&mut self, ns: u64, is_read: bool) {
        self.held.push(ns.clamp(100, u64::MAX >> 1) << 1 | is_read as u64);
        if self.held.len() == BATCH {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let mut l = lock(&self.shared.latencies);
        for &x in &self.held {
            let h = if x & 1 == 1 { &mut l.read } else { &mut l.write };
            h.saturating_record(x >> 1);
        }
        self.held.clear();
    }
}

impl Drop for Recorder<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

struct Latencies {
    read: Histogram<u64>,
    write: Histogram<u64>,
}

/// The lock, also after a worker panicked holding it (a histogram is never
/// left half-updated by a panic elsewhere in the worker).
fn lock(m: &Mutex<Latencies>) -> std::sync::MutexGuard<'_, Latencies> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(100, 120_000_000_000, 3).expect("static bounds are valid")
}

/// The blocks (of `--bs`) each job's share of the region holds, once the
/// parameters are checked against the device.
fn blocks_per_job<C: BlockClient + ?Sized>(client: &C, p: &BenchParams) -> Result<u64, BenchError> {
    let bs = client.block_size() as u64;
    let dev = client.size_bytes();
    if p.bs == 0 || !(p.bs as u64).is_multiple_of(bs) {
        return Err(BenchError::Params(format!("--bs must be a non-zero multiple of {bs}")));
    }
    let size = if p.size == 0 { dev.saturating_sub(p.offset) } else { p.size };
    if !p.offset.is_multiple_of(bs) || p.offset.checked_add(size).is_none_or(|e| e > dev) {
        return Err(BenchError::Params(format!("region {}+{size} does not fit the device ({dev} bytes)", p.offset)));
    }
    let numjobs = p.numjobs.max(1) as u64;
    let blocks_per_job = size / numjobs / p.bs as u64;
    if blocks_per_job == 0 {
        return Err(BenchError::Params(format!("region of {size} bytes is too small for {numjobs} jobs of --bs {}", p.bs)));
    }
    if p.runtime.is_none() && p.ios.is_none() {
        return Err(BenchError::Params("give --runtime or --ios".into()));
    }
    Ok(blocks_per_job)
}

/// Run the workload over `client`. With a client of known type (not `dyn
/// BlockClient`) each worker holds its requests' futures in its own
/// ([`HeldIo`]): no box per request.
pub async fn bench<C: HeldIo + ?Sized + 'static>(client: Arc<C>, p: &BenchParams) -> Result<BenchReport, BenchError> {
    let blocks_per_job = blocks_per_job(client.as_ref(), p)?;
    let numjobs = p.numjobs.max(1) as u64;
    // Before any request or CPU time is counted: the first in a process
    // calibrates the TSC.
    let clock = LatencyClock::new();
    let shared = Arc::new(Shared {
        clock,
        stop: AtomicBool::new(false),
        issued: AtomicU64::new(0),
        limit: p.ios.map_or(u64::MAX, |n| n + p.ramp_ios),
        measuring: AtomicBool::new(p.ramp_ios == 0),
        latencies: Mutex::new(Latencies { read: new_hist(), write: new_hist() }),
    });

    // One task per job, polling its `iodepth` workers itself: a request's
    // completion wakes its worker inside the job's task (a push on the
    // set's ready queue) rather than a tokio task of its own through the
    // scheduler, ~490 instructions per 4 KiB I/O at QD32
    // (docs/notes/2026-11-27-h51s-client-runtime.md); completions that
    // arrive together wake the job's task once. Jobs stay tasks of their
    // own, run in parallel with `--threads` above 1, as fio's jobs are.
    let mut tasks = tokio::task::JoinSet::new();
    for job in 0..numjobs {
        // Sequential workers of one job share a cursor so together they stream.
        let cursor = Arc::new(AtomicU64::new(0));
        let job_base = p.offset + job * blocks_per_job * p.bs as u64;
        let workers = ReadySet::new((0..p.iodepth.max(1))
            .map(|w| {
                let (client, shared, cursor, p) = (client.clone(), shared.clone(), cursor.clone(), p.clone());
                let seed = p.seed ^ (job << 32) ^ w as u64;
                // A panic stays this worker's, counted as its error, as it
                // was when each worker was a task of its own.
                AssertUnwindSafe(worker(client, shared, cursor, p, job_base, blocks_per_job, seed)).catch_unwind()
            }), p.submit_batch);
        tasks.spawn(run_job(workers, shared.clone()));
    }

    // Ramp: wait until the warm-up requests are through, then start the clock.
    if p.ramp_ios > 0 {
        while shared.issued.load(Ordering::Relaxed) < p.ramp_ios && !tasks.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if tasks.try_join_next().is_some() {
                break;
            }
        }
        shared.measuring.store(true, Ordering::Relaxed);
    }
    let cpu0 = CpuTimes::now();
    let t0 = Instant::now();
    if let Some(rt) = p.runtime {
        let shared = shared.clone();
        tokio::spawn(async move {
            tokio::time::sleep(rt).await;
            shared.stop.store(true, Ordering::Relaxed);
        });
    }
    let (errors, first_err) = join_workers(&mut tasks, &shared).await;
    let elapsed = t0.elapsed().as_secs_f64().max(1e-9);
    let cpu = CpuTimes::now().since(&cpu0);
    if let Some(e) = first_err {
        return Err(e);
    }
    Ok(report(client.as_ref(), p, &shared, elapsed, cpu, errors))
}

/// The errors of a job's workers (or of all jobs): how many workers failed,
/// and the first error.
#[derive(Default)]
struct Failures {
    count: u64,
    first: Option<BenchError>,
}

impl Failures {
    /// A worker failed: the others stop.
    fn add(&mut self, e: BenchError, shared: &Shared) {
        self.count += 1;
        shared.stop.store(true, Ordering::Relaxed);
        self.first.get_or_insert(e);
    }
}

type WorkerResult = std::thread::Result<Result<(), BenchError>>;

/// A worker's panic as an error, with the panic's message.
fn panicked(payload: &(dyn std::any::Any + Send)) -> BenchError {
    let msg = payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str));
    BenchError::Params(format!("worker panicked: {}", msg.unwrap_or("(no message)")))
}

/// Run one job's workers to their end; the first error stops every job.
async fn run_job<F: Future<Output = WorkerResult>>(workers: ReadySet<F>, shared: Arc<Shared>) -> Failures {
    let mut failures = Failures::default();
    workers
        .run(|r| match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.add(e, &shared),
            Err(p) => failures.add(panicked(p.as_ref()), &shared),
        })
        .await;
    failures
}

/// Wait for every job: the count of workers that failed, and the first error.
async fn join_workers(tasks: &mut tokio::task::JoinSet<Failures>, shared: &Shared) -> (u64, Option<BenchError>) {
    let mut all = Failures::default();
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(f) => {
                all.count += f.count;
                if let Some(e) = f.first {
                    all.first.get_or_insert(e);
                }
            }
            Err(e) => all.add(BenchError::Params(format!("job panicked: {e}")), shared),
        }
    }
    (all.count, all.first)
}

/// The report from the workers' latencies, once every worker has ended.
fn report<C: BlockClient + ?Sized>(client: &C, p: &BenchParams, shared: &Shared, elapsed: f64, cpu: CpuTimes, errors: u64) -> BenchReport {
    // Every worker has ended: nothing records any more.
    let latencies = lock(&shared.latencies);
    let (read, write) = (&latencies.read, &latencies.write);
    let dir = |h: &Histogram<u64>| {
        let ios = h.len();
        let bytes = ios * p.bs as u64;
        DirectionReport { ios, bytes, iops: ios as f64 / elapsed, bw_bytes: bytes as f64 / elapsed, lat_ns: latency(h) }
    };
    let (r, w) = (dir(read), dir(write));
    let mut all = read.clone();
    all.add(write).expect("same bounds");
    let ios = r.ios + w.ios;
    BenchReport {
        target: client.describe(),
        rw: p.rw,
        bs: p.bs,
        iodepth: p.iodepth,
        numjobs: p.numjobs,
        rwmixread: p.rw.read_pct(p.rwmixread),
        runtime_s: elapsed,
        ios,
        bytes: r.bytes + w.bytes,
        iops: ios as f64 / elapsed,
        bw_bytes: (r.bytes + w.bytes) as f64 / elapsed,
        lat_ns: latency(&all),
        read: r,
        write: w,
        cpu_user_s: cpu.user_s,
        cpu_sys_s: cpu.sys_s,
        cpu_per_io_us: if ios > 0 { (cpu.user_s + cpu.sys_s) * 1e6 / ios as f64 } else { 0.0 },
        errors,
    }
}

fn latency(h: &Histogram<u64>) -> Latency {
    if h.is_empty() {
        return Latency::default();
    }
    Latency {
        min: h.min(),
        mean: h.mean(),
        p50: h.value_at_quantile(0.50),
        p90: h.value_at_quantile(0.90),
        p99: h.value_at_quantile(0.99),
        p999: h.value_at_quantile(0.999),
        max: h.max(),
    }
}

const PAGE: usize = 4096;

async fn worker<C: HeldIo + ?Sized>(
    client: Arc<C>,
    shared: Arc<Shared>,
    cursor: Arc<AtomicU64>,
    p: BenchParams,
    job_base: u64,
    blocks: u64,
    seed: u64,
) -> Result<(), BenchError> {
    let mut rng = SmallRng::seed_from_u64(seed);
    // Page-aligned unless asked otherwise, as fio's buffers are: a heap
    // buffer this large is mapped on its own and starts 16 bytes past a
    // page, and where the kernel's `rep movsb` copies into a destination
    // aligned unlike its source (AMD Zen 3), a receive into it cost our
    // initiators 3x the CPU per MiB of a page-aligned one
    // (docs/notes/2026-11-27-h51h-seqread.md).
    let mut space = vec![0u8; p.bs + PAGE + p.buf_offset];
    let at = space.as_ptr().align_offset(PAGE) + p.buf_offset;
    let buf = &mut space[at..at + p.bs];
    // Incompressible, non-zero data so no layer can cheat on zero pages.
    rng.fill(&mut buf[..]);
    // Writes hand their data over (`write_owned`, a reference count per
    // write, not a copy), as the FUSE attach path does: a client may then
    // send it from where it is instead of copying it into its send buffer
    // (NVMe/TCP: 1 KiB and up, bw_nvme::host_queue::SEND_IN_PLACE_MIN).
    // The lab's load is this loop too (it runs `blockwire bench`).
    let data = bytes::Bytes::copy_from_slice(buf);
    let read_pct = p.rw.read_pct(p.rwmixread);
    // One clock read per request, not two: a request's end is the next
    // one's start. What lies between (the stop check, the offset, the
    // histogram) is tens of nanoseconds counted into the next request's
    // latency; the second read was 1.5-2% of the client's CPU at 4 KiB
    // QD32 (docs/notes/2026-11-26-floor-3.md), where the floor's load
    // generator reads no clock per request at all.
    let mut recorder = Recorder::new(&shared);
    let mut t = shared.clock.now();
    loop {
        if shared.stop.load(Ordering::Relaxed) || shared.issued.fetch_add(1, Ordering::Relaxed) >= shared.limit {
            return Ok(());
        }
        let block = if p.rw.random() {
            rng.gen_range(0..blocks)
        } else {
            cursor.fetch_add(1, Ordering::Relaxed) % blocks
        };
        let offset = job_base + block * p.bs as u64;
        let is_read = read_pct == 100 || (read_pct > 0 && rng.gen_range(0..100u8) < read_pct);
        let r = if is_read { client.read_held(offset, buf).await } else { client.write_owned_held(offset, data.clone()).await };
        let end = shared.clock.now();
        let ns = shared.clock.ns_between(t, end);
        t = end;
        r.map_err(|source| BenchError::Io { op: if is_read { "read" } else { "write" }, offset, len: p.bs, source })?;
        if shared.measuring.load(Ordering::Relaxed) {
            recorder.record(ns, is_read);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::tests::mem;

    fn params(rw: Rw) -> BenchParams {
        BenchParams {
            rw,
            bs: 4096,
            iodepth: 4,
            numjobs: 2,
            rwmixread: 75,
            runtime: None,
            ios: Some(2000),
            offset: 0,
            size: 0,
            seed: 1,
            ramp_ios: 0,
            buf_offset: 0,
            submit_batch: crate::DEFAULT_SUBMIT_BATCH,
        }
    }

    #[tokio::test]
    async fn counts_exactly_the_requested_ios_and_mix() {
        let r = bench(mem(1 << 20, None), &params(Rw::RandRw)).await.unwrap();
        assert_eq!(r.ios, 2000);
        assert_eq!(r.bytes, 2000 * 4096);
        let frac = r.read.ios as f64 / r.ios as f64;
        assert!((0.65..0.85).contains(&frac), "read fraction {frac}");
        assert!(r.lat_ns.p50 <= r.lat_ns.p99 && r.lat_ns.p99 <= r.lat_ns.max);
        let w = bench(mem(1 << 20, None), &params(Rw::Write)).await.unwrap();
        assert_eq!((w.read.ios, w.write.ios), (0, 2000));
    }

    #[tokio::test]
    async fn sequential_jobs_stay_in_their_region() {
        // 2 jobs over 1 MiB: each owns 512 KiB; everything written must be inside the device.
        let mut p = params(Rw::Write);
        p.bs = 64 << 10;
        let r = bench(mem(1 << 20, None), &p).await.unwrap();
        assert_eq!(r.write.ios, 2000);
    }

    /// Allocations made on this thread: every worker of a bench run on a
    /// current-thread runtime runs on it, and other tests' threads do not
    /// count.
    mod allocs {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            static COUNT: Cell<u64> = const { Cell::new(0) };
        }

        pub struct Counting;

        // SAFETY: System's allocation, counted on the side.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, l: Layout) -> *mut u8 {
                let _ = COUNT.try_with(|c| c.set(c.get() + 1));
                unsafe { System.alloc(l) }
            }
            unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
                unsafe { System.dealloc(p, l) }
            }
        }

        pub fn count() -> u64 {
            COUNT.with(|c| c.get())
        }
    }

    #[global_allocator]
    static COUNTING: allocs::Counting = allocs::Counting;

    /// Allocations per request of a bench run, from two runs of `n` and `2n` requests.
    fn allocations_per_request<C: HeldIo + ?Sized + 'static>(client: Arc<C>, rw: Rw) -> f64 {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let run = |n: u64| {
            let mut p = params(rw);
            p.ios = Some(n);
            let before = allocs::count();
            let r = rt.block_on(bench(client.clone(), &p)).unwrap();
            assert_eq!(r.ios, n);
            allocs::count() - before
        };
        let (a, b) = (run(2000), run(4000));
        b.saturating_sub(a) as f64 / 2000.0
    }

    #[test]
    fn a_client_of_known_type_allocates_nothing_per_request() {
        use crate::verify::tests::mem_typed;
        for rw in [Rw::RandRead, Rw::RandWrite] {
            // Through `dyn BlockClient` each request's future is boxed: the
            // count sees it.
            let boxed = allocations_per_request(mem(1 << 20, None), rw);
            assert!(boxed >= 1.0, "{rw:?} through dyn: {boxed} allocations per request");
            let held = allocations_per_request(mem_typed(1 << 20, None), rw);
            assert!(held < 0.05, "{rw:?} held: {held} allocations per request");
        }
    }

    /// A client over memory that notes how many tokio tasks are alive at
    /// each request, and yields once per request so that every worker has
    /// started before any ends.
    struct TaskCounting {
        mem: Arc<crate::verify::tests::MemClient>,
        most_tasks: AtomicU64,
    }

    impl TaskCounting {
        async fn note(&self) {
            let alive = tokio::runtime::Handle::current().metrics().num_alive_tasks() as u64;
            self.most_tasks.fetch_max(alive, Ordering::Relaxed);
            tokio::task::yield_now().await;
        }
    }

    impl HeldIo for TaskCounting {
        async fn read_held(&self, offset: u64, buf: &mut [u8]) -> bw_initiator::Result<()> {
            self.note().await;
            self.mem.read_held(offset, buf).await
        }
        async fn write_owned_held(&self, offset: u64, data: bytes::Bytes) -> bw_initiator::Result<()> {
            self.note().await;
            self.mem.write_owned_held(offset, data).await
        }
    }

    #[async_trait::async_trait]
    impl BlockClient for TaskCounting {
        fn describe(&self) -> String {
            self.mem.describe()
        }
        fn size_bytes(&self) -> u64 {
            self.mem.size_bytes()
        }
        async fn read(&self, offset: u64, buf: &mut [u8]) -> bw_initiator::Result<()> {
            self.read_held(offset, buf).await
        }
        async fn write(&self, offset: u64, data: &[u8]) -> bw_initiator::Result<()> {
            self.write_owned_held(offset, bytes::Bytes::copy_from_slice(data)).await
        }
        async fn flush(&self) -> bw_initiator::Result<()> {
            Ok(())
        }
        async fn close(&self) -> bw_initiator::Result<()> {
            Ok(())
        }
    }

    /// Each job is one task however deep its queue: its workers are polled
    /// inside it, so a completion does not schedule a task of its own.
    #[tokio::test]
    async fn a_job_is_one_task_whatever_its_iodepth() {
        let client = Arc::new(TaskCounting { mem: crate::verify::tests::mem_typed(1 << 20, None), most_tasks: AtomicU64::new(0) });
        let p = params(Rw::RandRw);
        let r = bench(client.clone(), &p).await.unwrap();
        assert_eq!(r.ios, 2000);
        assert_eq!(client.most_tasks.load(Ordering::Relaxed), p.numjobs as u64, "{} jobs of iodepth {}", p.numjobs, p.iodepth);
    }

    #[tokio::test]
    async fn rejects_bad_parameters() {
        let mut p = params(Rw::Read);
        p.bs = 1000;
        assert!(matches!(bench(mem(1 << 20, None), &p).await, Err(BenchError::Params(_))));
        let mut p = params(Rw::Read);
        p.ios = None;
        assert!(matches!(bench(mem(1 << 20, None), &p).await, Err(BenchError::Params(_))));
        let mut p = params(Rw::Read);
        p.numjobs = 1000;
        p.bs = 1 << 20;
        assert!(matches!(bench(mem(1 << 20, None), &p).await, Err(BenchError::Params(_))));
    }
}
