//! A small flowop engine running filebench's documented personalities on a
//! directory (filebench itself is not packaged for Debian 12). A personality
//! is data: file sets (count, size, preallocated share, directory width) and
//! thread kinds, each a loop over a flowop sequence. The engine reports
//! ops/s, MiB/s and latency (mean, p50, p99) per flowop.
//!
//! Parameters follow filebench's workloads/*.f (webserver, fileserver,
//! varmail, oltp); [`Scale`] divides the file counts and thread instances so
//! a short run fits a small machine. Not modelled: oltp's semaphores, `hog`
//! CPU burners and asynchronous I/O (its writes are synchronous pwrite with
//! O_DSYNC here), filebench's gamma-distributed file sizes (fixed sizes).
//!
//! A run has two phases: the file sets are made (and, with
//! [`Options::drop_cache`], written back and dropped from the page cache, so
//! the measured phase starts uncached), then the threads run their flowops.
//! Only the second phase is measured.

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

pub use bw_workload_report::{FlowReport, OpStats};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

#[derive(Debug, Clone, PartialEq)]
pub enum Flowop {
    /// Create a file that does not exist in `set` (it becomes the thread's open file).
    Create {
        set: usize,
    },
    /// Open an existing file of `set`.
    Open {
        set: usize,
    },
    Close,
    /// Read the open file from start to end in `iosize` chunks.
    ReadWhole {
        iosize: u64,
    },
    /// Write the set's file size to the open file in `iosize` chunks.
    WriteWhole {
        iosize: u64,
    },
    /// Append a random 1..=2*mean bytes to the open file.
    AppendRand {
        mean: u64,
    },
    Fsync,
    /// Delete an existing file of `set`.
    Delete {
        set: usize,
    },
    Stat {
        set: usize,
    },
    /// pread/pwrite of `iosize` at a random aligned offset of a random file of `set`.
    ReadRandom {
        set: usize,
        iosize: u64,
    },
    WriteRandom {
        set: usize,
        iosize: u64,
        dsync: bool,
    },
}

impl Flowop {
    pub fn name(&self) -> &'static str {
        match self {
            Flowop::Create { .. } => "createfile",
            Flowop::Open { .. } => "openfile",
            Flowop::Close => "closefile",
            Flowop::ReadWhole { .. } => "readwholefile",
            Flowop::WriteWhole { .. } => "writewholefile",
            Flowop::AppendRand { .. } => "appendfilerand",
            Flowop::Fsync => "fsync",
            Flowop::Delete { .. } => "deletefile",
            Flowop::Stat { .. } => "statfile",
            Flowop::ReadRandom { .. } => "read",
            Flowop::WriteRandom { .. } => "write",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct FileSet {
    pub name: String,
    pub count: usize,
    pub size: u64,
    /// Percentage of the files created before the run (filebench `prealloc`).
    pub prealloc_pct: u32,
    /// Files per directory (filebench `dirwidth`; varmail keeps all in one).
    pub dirwidth: usize,
    /// Open the files with O_DIRECT (oltp's `directio`).
    pub direct: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ThreadKind {
    pub name: String,
    pub instances: usize,
    pub flowops: Vec<Flowop>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Personality {
    pub name: String,
    pub filesets: Vec<FileSet>,
    pub threads: Vec<ThreadKind>,
}

/// Divisors for a personality's file counts and thread instances (1 =
/// filebench's defaults). Results are per second, so a scaled run stays
/// comparable with another run at the same scale, not with filebench's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scale {
    pub files: usize,
    pub threads: usize,
}

impl Scale {
    pub const FULL: Scale = Scale {
        files: 1,
        threads: 1,
    };
    pub fn both(n: usize) -> Scale {
        Scale {
            files: n,
            threads: n,
        }
    }
}

fn div(n: usize, by: usize) -> usize {
    (n / by.max(1)).max(1)
}

/// webserver.f: 1000 files of 16 KiB in directories of 20, 100 threads each
/// reading 10 whole files (open/read/close) then appending 16 KiB to a log.
pub fn webserver(scale: Scale) -> Personality {
    let mut flowops = vec![];
    for _ in 0..10 {
        flowops.extend([
            Flowop::Open { set: 0 },
            Flowop::ReadWhole { iosize: MIB },
            Flowop::Close,
        ]);
    }
    flowops.extend([
        Flowop::Open { set: 1 },
        Flowop::AppendRand { mean: 16 * KIB },
        Flowop::Close,
    ]);
    Personality {
        name: "webserver".into(),
        filesets: vec![
            FileSet {
                name: "bigfileset".into(),
                count: div(1000, scale.files),
                size: 16 * KIB,
                prealloc_pct: 100,
                dirwidth: 20,
                direct: false,
            },
            FileSet {
                name: "logfiles".into(),
                count: 1,
                size: 16 * KIB,
                prealloc_pct: 100,
                dirwidth: 20,
                direct: false,
            },
        ],
        threads: vec![ThreadKind {
            name: "filereader".into(),
            instances: div(100, scale.threads),
            flowops,
        }],
    }
}

/// fileserver.f: 10000 files of 128 KiB in directories of 20, 50 threads
/// each creating and writing a file, appending 16 KiB to another, reading a
/// whole one, deleting one and stat-ing one.
pub fn fileserver(scale: Scale) -> Personality {
    let s = 0;
    Personality {
        name: "fileserver".into(),
        filesets: vec![FileSet {
            name: "bigfileset".into(),
            count: div(10_000, scale.files),
            size: 128 * KIB,
            prealloc_pct: 80,
            dirwidth: 20,
            direct: false,
        }],
        threads: vec![ThreadKind {
            name: "filereader".into(),
            instances: div(50, scale.threads),
            flowops: vec![
                Flowop::Create { set: s },
                Flowop::WriteWhole { iosize: MIB },
                Flowop::Close,
                Flowop::Open { set: s },
                Flowop::AppendRand { mean: 16 * KIB },
                Flowop::Close,
                Flowop::Open { set: s },
                Flowop::ReadWhole { iosize: MIB },
                Flowop::Close,
                Flowop::Delete { set: s },
                Flowop::Stat { set: s },
            ],
        }],
    }
}

/// varmail.f: 1000 files of 16 KiB in one directory, 16 threads doing the
/// mail server's delete / create-append-fsync / read-append-fsync / read.
pub fn varmail(scale: Scale) -> Personality {
    let s = 0;
    Personality {
        name: "varmail".into(),
        filesets: vec![FileSet {
            name: "bigfileset".into(),
            count: div(1000, scale.files),
            size: 16 * KIB,
            prealloc_pct: 80,
            dirwidth: usize::MAX,
            direct: false,
        }],
        threads: vec![ThreadKind {
            name: "filereader".into(),
            instances: div(16, scale.threads),
            flowops: vec![
                Flowop::Delete { set: s },
                Flowop::Create { set: s },
                Flowop::AppendRand { mean: 16 * KIB },
                Flowop::Fsync,
                Flowop::Close,
                Flowop::Open { set: s },
                Flowop::ReadWhole { iosize: MIB },
                Flowop::AppendRand { mean: 16 * KIB },
                Flowop::Fsync,
                Flowop::Close,
                Flowop::Open { set: s },
                Flowop::ReadWhole { iosize: MIB },
                Flowop::Close,
            ],
        }],
    }
}

/// oltp.f: 10 data files and 1 log file of 10 MiB; a log writer (256 KiB
/// random synchronous writes), 10 database writers (2 KiB random
/// synchronous writes) and 200 shadow readers (2 KiB random reads). The
/// file counts are filebench's and do not scale; the threads do.
/// `direct`: the data and log files with O_DIRECT (filebench's directio=1).
pub fn oltp(scale: Scale, direct: bool) -> Personality {
    Personality {
        name: if direct { "oltp-direct" } else { "oltp" }.into(),
        filesets: vec![
            FileSet {
                name: "datafiles".into(),
                count: 10,
                size: 10 * MIB,
                prealloc_pct: 100,
                dirwidth: 20,
                direct,
            },
            FileSet {
                name: "logfile".into(),
                count: 1,
                size: 10 * MIB,
                prealloc_pct: 100,
                dirwidth: 20,
                direct,
            },
        ],
        threads: vec![
            ThreadKind {
                name: "lgwr".into(),
                instances: 1,
                flowops: vec![Flowop::WriteRandom {
                    set: 1,
                    iosize: 256 * KIB,
                    dsync: true,
                }],
            },
            ThreadKind {
                name: "dbwr".into(),
                instances: div(10, scale.threads),
                flowops: vec![Flowop::WriteRandom {
                    set: 0,
                    iosize: 2 * KIB,
                    dsync: true,
                }],
            },
            ThreadKind {
                name: "shadow".into(),
                instances: div(200, scale.threads),
                flowops: vec![Flowop::ReadRandom {
                    set: 0,
                    iosize: 2 * KIB,
                }],
            },
        ],
    }
}

/// The personalities by name.
pub const NAMES: [&str; 5] = ["webserver", "fileserver", "varmail", "oltp", "oltp-direct"];

pub fn personality(name: &str, scale: Scale) -> Option<Personality> {
    Some(match name {
        "webserver" => webserver(scale),
        "fileserver" => fileserver(scale),
        "varmail" => varmail(scale),
        "oltp" => oltp(scale, false),
        "oltp-direct" => oltp(scale, true),
        _ => return None,
    })
}

/// Latencies of one flowop in one thread.
struct OpRecord {
    stats: OpStats,
    hist: Histogram<u64>,
}

impl OpRecord {
    fn new() -> OpRecord {
        OpRecord {
            stats: OpStats::default(),
            hist: Histogram::new_with_bounds(100, 600_000_000_000, 2)
                .expect("static bounds are valid"),
        }
    }
    fn add(&mut self, bytes: u64, ns: u64) {
        let s = &mut self.stats;
        s.count += 1;
        s.bytes += bytes;
        s.lat_total_ns += ns;
        s.lat_max_ns = s.lat_max_ns.max(ns);
        self.hist.saturating_record(ns.max(100));
    }
    fn merge(&mut self, o: &OpRecord) {
        let s = &mut self.stats;
        s.count += o.stats.count;
        s.bytes += o.stats.bytes;
        s.lat_total_ns += o.stats.lat_total_ns;
        s.lat_max_ns = s.lat_max_ns.max(o.stats.lat_max_ns);
        let _ = self.hist.add(&o.hist);
    }
    fn finish(mut self) -> OpStats {
        if !self.hist.is_empty() {
            self.stats.lat_p50_ns = self.hist.value_at_quantile(0.5);
            self.stats.lat_p99_ns = self.hist.value_at_quantile(0.99);
        }
        self.stats
    }
}

/// When a run stops: after each thread did `Loops` passes over its flowops, or after a time.
#[derive(Debug, Clone, Copy)]
pub enum Stop {
    Loops(u64),
    After(Duration),
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub stop: Stop,
    /// Seeds file choice and append sizes, so runs are repeatable.
    pub seed: u64,
    /// After making the file sets, write them back and drop them from the
    /// page cache (fdatasync + POSIX_FADV_DONTNEED per file), so the measured
    /// phase starts with a cold client cache.
    pub drop_cache: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    #[error("preparing file set {set} in {dir}")]
    Prepare {
        set: String,
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// Where a file of a set is. A file being created, open, deleted or
/// stat-ed by one thread is `Busy` for the others (filebench's FSE_BUSY), so
/// no thread opens a file that another has not finished creating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Absent,
    Present,
    Busy,
}

struct Set {
    def: FileSet,
    dir: PathBuf,
    entries: Mutex<Vec<Entry>>,
    /// Signalled whenever a busy file is handed back.
    handed_back: Condvar,
}

/// How long a thread waits for a busy file before the pick fails ("no
/// suitable file"). Filebench waits for an idle file without bound; the
/// bound only keeps a thread that holds the one file it waits for (a flow
/// that stats its own open file) from hanging the run.
const PICK_WAIT: Duration = Duration::from_secs(1);

impl Set {
    fn path(&self, i: usize) -> PathBuf {
        self.dir
            .join(format!("d{}", i / self.def.dirwidth.max(1)))
            .join(format!("f{i}"))
    }
    /// A random file in state `from`, now `Busy`. While none is in that
    /// state but some are busy (another thread has them open, or is
    /// creating or deleting them), wait for one to be handed back, as
    /// filebench's fileset_pick waits for an idle file; with none busy
    /// either, there is no such file.
    fn take(&self, rng: &mut SmallRng, from: Entry) -> Option<usize> {
        let deadline = Instant::now() + PICK_WAIT;
        let mut g = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let n = g.len();
            let start = rng.gen_range(0..n);
            if let Some(i) = (0..n).map(|k| (start + k) % n).find(|&i| g[i] == from) {
                g[i] = Entry::Busy;
                return Some(i);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            if !g.contains(&Entry::Busy) {
                return None;
            }
            g = self.handed_back.wait_timeout(g, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
    /// Hand a taken file back in state `to`.
    fn put(&self, i: usize, to: Entry) {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())[i] = to;
        self.handed_back.notify_all();
    }
    fn open(&self, i: usize, write: bool, dsync: bool) -> std::io::Result<File> {
        let mut o = OpenOptions::new();
        o.read(true).write(write);
        let mut flags = 0;
        if self.def.direct {
            flags |= libc::O_DIRECT;
        }
        if dsync {
            flags |= libc::O_DSYNC;
        }
        o.custom_flags(flags).open(self.path(i))
    }
}

fn fill(f: &mut File, size: u64, buf: &[u8]) -> std::io::Result<()> {
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Write back and evict one file's pages (clean pages go at once).
fn drop_file_cache(path: &Path) -> std::io::Result<()> {
    let f = File::open(path)?;
    f.sync_data()?;
    // SAFETY: fadvise on a descriptor we own; offset 0 / len 0 = whole file.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        return Err(std::io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// Create the file sets under `dir` (preallocated share of each).
fn prepare(dir: &Path, p: &Personality, drop_cache: bool) -> Result<Vec<Set>, FlowError> {
    let buf = vec![0x5Au8; MIB as usize];
    let mut sets = vec![];
    for fs in &p.filesets {
        let sdir = dir.join(&fs.name);
        let err = |source| FlowError::Prepare {
            set: fs.name.clone(),
            dir: sdir.clone(),
            source,
        };
        let pre = fs.count * fs.prealloc_pct as usize / 100;
        let set = Set {
            def: fs.clone(),
            dir: sdir.clone(),
            entries: Mutex::new(vec![Entry::Absent; fs.count]),
            handed_back: Condvar::new(),
        };
        for i in 0..fs.count {
            std::fs::create_dir_all(set.path(i).parent().unwrap_or(&sdir)).map_err(err)?;
            if i < pre {
                let mut f = File::create(set.path(i)).map_err(err)?;
                fill(&mut f, fs.size, &buf).map_err(err)?;
                set.put(i, Entry::Present);
            }
        }
        if drop_cache {
            for i in 0..pre {
                drop_file_cache(&set.path(i)).map_err(err)?;
            }
        }
        sets.push(set);
    }
    Ok(sets)
}

/// Aligned buffer for O_DIRECT (4 KiB alignment).
struct AlignedBuf {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let v = vec![0xA5u8; len + 4096];
        let off = v.as_ptr().align_offset(4096);
        AlignedBuf { v, off, len }
    }
    fn get(&mut self, n: usize) -> &mut [u8] {
        &mut self.v[self.off..self.off + n.min(self.len)]
    }
}

/// The largest transfer a thread's flowops make: its buffer size. Sized per
/// thread so oltp's 200 readers of 2 KiB do not each hold 1 MiB (which a
/// memory-limited run would pay for).
fn buffer_size(p: &Personality, flowops: &[Flowop]) -> usize {
    let largest_file = p.filesets.iter().map(|f| f.size).max().unwrap_or(0);
    let need = flowops
        .iter()
        .map(|op| match *op {
            Flowop::ReadWhole { iosize } | Flowop::WriteWhole { iosize } => {
                iosize.min(largest_file)
            }
            Flowop::AppendRand { mean } => 2 * mean,
            Flowop::ReadRandom { iosize, .. } | Flowop::WriteRandom { iosize, .. } => iosize,
            _ => 0,
        })
        .max()
        .unwrap_or(0);
    need.max(4096) as usize
}

/// The thread's open file; it is `Busy` in its set until closed.
struct OpenFile<'a> {
    file: File,
    set: &'a Set,
    index: usize,
}

impl Drop for OpenFile<'_> {
    fn drop(&mut self) {
        self.set.put(self.index, Entry::Present);
    }
}

struct Worker<'a> {
    sets: &'a [Set],
    kind: &'a str,
    rng: SmallRng,
    open: Option<OpenFile<'a>>,
    /// Files kept open for random I/O (sets that are never deleted), as
    /// filebench keeps its oltp files open.
    held: HashMap<(usize, usize, bool), File>,
    stats: BTreeMap<String, OpRecord>,
    errors: BTreeMap<String, u64>,
    buf: AlignedBuf,
}

fn no_suitable_file() -> std::io::Error {
    std::io::Error::other("no suitable file")
}

fn no_open_file() -> std::io::Error {
    std::io::Error::other("no open file")
}

impl<'a> Worker<'a> {
    /// One flowop; Ok(bytes moved) or Err when it could not run. One arm
    /// per kind of flowop, as an opcode table: what each does is the
    /// method it names.
    fn step(&mut self, op: &Flowop) -> std::io::Result<u64> {
        match *op {
            Flowop::Create { set } => self.open_one(set, Entry::Absent, |s, i| {
                OpenOptions::new().read(true).write(true).create(true).truncate(true).open(s.path(i))
            }),
            Flowop::Open { set } => self.open_one(set, Entry::Present, |s, i| s.open(i, true, false)),
            Flowop::Close => self.open.take().map(|_| 0).ok_or_else(no_open_file),
            Flowop::ReadWhole { iosize } => self.read_whole(iosize),
            Flowop::WriteWhole { iosize } => self.write_whole(iosize),
            Flowop::AppendRand { mean } => self.append_rand(mean),
            Flowop::Fsync => {
                self.open.as_ref().ok_or_else(no_open_file)?.file.sync_all()?;
                Ok(0)
            }
            Flowop::Delete { set } => self.on_existing(set, Entry::Absent, |p| std::fs::remove_file(p)),
            Flowop::Stat { set } => self.on_existing(set, Entry::Present, |p| std::fs::metadata(p).map(drop)),
            Flowop::ReadRandom { set, iosize } => self.random_io(set, iosize, None),
            Flowop::WriteRandom { set, iosize, dsync } => self.random_io(set, iosize, Some(dsync)),
        }
    }

    /// Create or open a file of `set` that is `from` (absent or present):
    /// it becomes the thread's open file, and goes back to `from` if it
    /// cannot be opened.
    fn open_one(&mut self, set: usize, from: Entry, open: impl FnOnce(&Set, usize) -> std::io::Result<File>) -> std::io::Result<u64> {
        self.open = None;
        let sets: &'a [Set] = self.sets;
        let s = &sets[set];
        let i = s.take(&mut self.rng, from).ok_or_else(no_suitable_file)?;
        match open(s, i) {
            Ok(file) => self.open = Some(OpenFile { file, set: s, index: i }),
            Err(e) => {
                s.put(i, from);
                return Err(e);
            }
        }
        Ok(0)
    }

    /// Read the open file from start to end in `iosize` chunks.
    fn read_whole(&mut self, iosize: u64) -> std::io::Result<u64> {
        let f = &mut self.open.as_mut().ok_or_else(no_open_file)?.file;
        let mut total = 0;
        let buf = self.buf.get(iosize as usize);
        loop {
            let n = f.read(buf)?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        Ok(total)
    }

    /// Write the set's file size to the open file in `iosize` chunks.
    fn write_whole(&mut self, iosize: u64) -> std::io::Result<u64> {
        let o = self.open.as_mut().ok_or_else(no_open_file)?;
        let (f, size) = (&mut o.file, o.set.def.size);
        let mut left = size;
        while left > 0 {
            let n = left.min(iosize) as usize;
            f.write_all(self.buf.get(n))?;
            left -= n as u64;
        }
        Ok(size)
    }

    /// Append a random 1..=2*mean bytes to the open file.
    fn append_rand(&mut self, mean: u64) -> std::io::Result<u64> {
        let n = self.rng.gen_range(1..=2 * mean) as usize;
        let f = &self.open.as_ref().ok_or_else(no_open_file)?.file;
        let end = f.metadata()?.len();
        f.write_all_at(self.buf.get(n), end)?;
        Ok(n as u64)
    }

    /// `act` on the path of an existing file of `set`, which is then
    /// `after` (absent once deleted), or still present if `act` failed.
    fn on_existing(&mut self, set: usize, after: Entry, act: impl FnOnce(&Path) -> std::io::Result<()>) -> std::io::Result<u64> {
        let sets: &'a [Set] = self.sets;
        let s = &sets[set];
        let i = s.take(&mut self.rng, Entry::Present).ok_or_else(no_suitable_file)?;
        let r = act(&s.path(i));
        s.put(i, if r.is_ok() { after } else { Entry::Present });
        r.map(|()| 0)
    }

    /// pread (`write` None) or pwrite (Some(dsync)) of `iosize` at a random
    /// aligned offset of a random file of `set`, kept open for the next.
    fn random_io(&mut self, set: usize, iosize: u64, write: Option<bool>) -> std::io::Result<u64> {
        let sets: &'a [Set] = self.sets;
        let s = &sets[set];
        let i = self.rng.gen_range(0..s.def.count);
        let f = match self.held.entry((set, i, write.is_some())) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(s.open(i, write.is_some(), write == Some(true))?),
        };
        let blocks = (s.def.size / iosize).max(1);
        let off = self.rng.gen_range(0..blocks) * iosize;
        let buf = self.buf.get(iosize as usize);
        if write.is_some() {
            f.write_all_at(buf, off)?;
        } else {
            f.read_exact_at(buf, off)?;
        }
        Ok(iosize)
    }

    fn run(&mut self, flowops: &[Flowop], stop: Stop, started: Instant) {
        let mut loops = 0u64;
        loop {
            match stop {
                Stop::Loops(n) if loops >= n => break,
                Stop::After(d) if started.elapsed() >= d => break,
                _ => {}
            }
            for op in flowops {
                let key = format!("{}:{}", self.kind, op.name());
                let t = Instant::now();
                match self.step(op) {
                    Ok(bytes) => self
                        .stats
                        .entry(key)
                        .or_insert_with(OpRecord::new)
                        .add(bytes, t.elapsed().as_nanos() as u64),
                    // The cause is part of the key: "no suitable file" (all
                    // busy) is the workload's nature, an OS error is not.
                    Err(e) => *self.errors.entry(format!("{key}: {e}")).or_default() += 1,
                }
            }
            // A file left open by a failed step does not leak into the next loop.
            self.open = None;
            loops += 1;
        }
    }
}

/// Run `p` on `dir` (created if missing; the file sets are made first and
/// left in place). Per-flowop results are keyed `thread:flowop`, e.g.
/// `lgwr:write` and `shadow:read`, as filebench names flowops per thread.
pub fn run(dir: &Path, p: &Personality, o: Options) -> Result<FlowReport, FlowError> {
    let t_prep = Instant::now();
    let sets = prepare(dir, p, o.drop_cache)?;
    let prepare_s = t_prep.elapsed().as_secs_f64();
    let cpu0 = crate::cpu::CpuTimes::now();
    let started = Instant::now();
    let mut results: Vec<ThreadResults> = vec![];
    std::thread::scope(|sc| {
        let mut handles = vec![];
        let mut n = 0u64;
        for kind in &p.threads {
            let bufsize = buffer_size(p, &kind.flowops);
            for _ in 0..kind.instances {
                n += 1;
                let sets = &sets;
                let rng = SmallRng::seed_from_u64(o.seed.wrapping_add(n));
                let stop = o.stop;
                // Small stacks: oltp runs 211 threads, and a memory-limited
                // run pays for every page they touch.
                let h = std::thread::Builder::new()
                    .stack_size(256 * 1024)
                    .spawn_scoped(sc, move || {
                        let mut w = Worker {
                            sets,
                            kind: &kind.name,
                            rng,
                            open: None,
                            held: HashMap::new(),
                            stats: BTreeMap::new(),
                            errors: BTreeMap::new(),
                            buf: AlignedBuf::new(bufsize),
                        };
                        w.run(&kind.flowops, stop, started);
                        (w.stats, w.errors)
                    });
                match h {
                    Ok(h) => handles.push(h),
                    Err(_) => {
                        *results_errors(&mut results)
                            .entry(format!("{}:spawn", kind.name))
                            .or_default() += 1
                    }
                }
            }
        }
        for h in handles {
            if let Ok(r) = h.join() {
                results.push(r);
            }
        }
    });
    let elapsed_s = started.elapsed().as_secs_f64();
    let cpu = crate::cpu::CpuTimes::now().since(&cpu0);
    let mut out = FlowReport {
        personality: p.name.clone(),
        elapsed_s,
        prepare_s,
        cpu_user_s: cpu.user_s,
        cpu_sys_s: cpu.sys_s,
        ..Default::default()
    };
    let mut merged: BTreeMap<String, OpRecord> = BTreeMap::new();
    for (stats, errors) in results {
        for (k, v) in stats {
            merged.entry(k).or_insert_with(OpRecord::new).merge(&v);
        }
        for (k, v) in errors {
            *out.errors.entry(k).or_default() += v;
        }
    }
    out.flowops = merged.into_iter().map(|(k, v)| (k, v.finish())).collect();
    out.ops = out.flowops.values().map(|s| s.count).sum();
    let bytes: u64 = out.flowops.values().map(|s| s.bytes).sum();
    out.ops_per_s = out.ops as f64 / elapsed_s.max(1e-9);
    out.mib_per_s = bytes as f64 / MIB as f64 / elapsed_s.max(1e-9);
    Ok(out)
}

/// One thread's results: records by flowop name, and errors by kind.
type ThreadResults = (BTreeMap<String, OpRecord>, BTreeMap<String, u64>);

/// Where a thread that could not start is counted (a result set of its own).
fn results_errors(
    results: &mut Vec<ThreadResults>,
) -> &mut BTreeMap<String, u64> {
    if results.is_empty() {
        results.push((BTreeMap::new(), BTreeMap::new()));
    }
    &mut results[0].1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("bw-flowop-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn opts(loops: u64, seed: u64) -> Options {
        Options {
            stop: Stop::Loops(loops),
            seed,
            drop_cache: false,
        }
    }

    fn count(r: &FlowReport, op: &str) -> u64 {
        r.flowops.get(op).map(|s| s.count).unwrap_or(0)
    }

    #[test]
    fn webserver_reads_ten_files_per_log_append() {
        let d = tmp("web");
        let p = webserver(Scale::both(50)); // 20 files, 2 threads
        let r = run(&d, &p, opts(3, 7)).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        // 2 threads x 3 loops: 60 whole-file reads of 16 KiB, 6 appends.
        assert_eq!(count(&r, "filereader:readwholefile"), 60);
        assert_eq!(r.flowops["filereader:readwholefile"].bytes, 60 * 16 * KIB);
        assert_eq!(count(&r, "filereader:appendfilerand"), 6);
        assert_eq!(count(&r, "filereader:openfile"), 66);
        assert_eq!(count(&r, "filereader:closefile"), 66);
        let read = &r.flowops["filereader:readwholefile"];
        assert!(
            read.lat_p50_ns > 0
                && read.lat_p50_ns <= read.lat_p99_ns
                && read.lat_p99_ns <= read.lat_max_ns + read.lat_max_ns / 50,
            "{read:?}"
        );
    }

    /// Eight threads appending to one shared log file (webserver's log
    /// with more threads): a thread that finds the file busy waits for it,
    /// as filebench does, instead of counting "no suitable file".
    #[test]
    fn threads_wait_for_a_busy_file() {
        let d = tmp("shared-log");
        let mut p = webserver(Scale::both(50));
        p.threads[0].instances = 8;
        p.threads[0].flowops = vec![
            Flowop::Open { set: 1 },
            Flowop::AppendRand { mean: 4 * KIB },
            Flowop::Fsync,
            Flowop::Close,
        ];
        let r = run(&d, &p, opts(20, 3)).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(count(&r, "filereader:appendfilerand"), 8 * 20);
    }

    #[test]
    fn fileserver_and_varmail_keep_their_op_mix() {
        let d = tmp("fsrv");
        let r = run(&d, &fileserver(Scale::both(500)), opts(4, 1)).unwrap(); // 20 files (16 pre), 1 thread
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        for op in [
            "createfile",
            "writewholefile",
            "appendfilerand",
            "readwholefile",
            "deletefile",
            "statfile",
        ] {
            assert_eq!(count(&r, &format!("filereader:{op}")), 4, "{op}");
        }
        assert_eq!(r.flowops["filereader:writewholefile"].bytes, 4 * 128 * KIB);
        // One create and one delete per loop: the number of files stays.
        let files = walk(&d.join("bigfileset"));
        assert_eq!(files, 16);
        std::fs::remove_dir_all(&d).unwrap();

        let d = tmp("mail");
        let r = run(&d, &varmail(Scale::both(16)), opts(5, 2)).unwrap(); // 62 files, 1 thread
                                                                         // varmail keeps every file in one directory.
        assert_eq!(std::fs::read_dir(d.join("bigfileset")).unwrap().count(), 1);
        std::fs::remove_dir_all(&d).unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(
            count(&r, "filereader:fsync"),
            10,
            "two fsync points per loop"
        );
        assert_eq!(count(&r, "filereader:readwholefile"), 10);
        assert_eq!(count(&r, "filereader:deletefile"), 5);
    }

    #[test]
    fn oltp_mixes_log_writes_db_writes_and_reads() {
        let d = tmp("oltp");
        let r = run(&d, &oltp(Scale::both(10), false), opts(10, 3)).unwrap(); // lgwr 1, dbwr 1, shadow 20
        std::fs::remove_dir_all(&d).unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(count(&r, "shadow:read"), 200);
        assert_eq!(r.flowops["shadow:read"].bytes, 200 * 2 * KIB);
        // 10 log writes of 256 KiB and 10 db writes of 2 KiB, told apart.
        assert_eq!(count(&r, "lgwr:write"), 10);
        assert_eq!(r.flowops["lgwr:write"].bytes, 10 * 256 * KIB);
        assert_eq!(count(&r, "dbwr:write"), 10);
        assert_eq!(r.flowops["dbwr:write"].bytes, 10 * 2 * KIB);
        assert!(r.ops_per_s > 0.0 && r.mib_per_s > 0.0);
    }

    #[test]
    fn dropped_cache_leaves_the_prepared_files_uncached() {
        // mincore over a mapping tells which pages are resident.
        fn resident_pages(path: &Path) -> usize {
            let f = File::open(path).unwrap();
            let len = f.metadata().unwrap().len() as usize;
            // SAFETY: read-only shared mapping of a file we opened; unmapped below.
            unsafe {
                let m = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                );
                assert_ne!(m, libc::MAP_FAILED);
                let mut v = vec![0u8; len.div_ceil(4096)];
                assert_eq!(libc::mincore(m, len, v.as_mut_ptr()), 0);
                libc::munmap(m, len);
                v.iter().filter(|b| **b & 1 == 1).count()
            }
        }
        // On a disk file system (tmpfs pages can never be dropped).
        let base = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target"));
        for drop_cache in [false, true] {
            let d = base.join(format!(
                "bw-flowop-drop-{drop_cache}-{}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&d);
            let p = oltp(Scale::both(200), false);
            let o = Options {
                stop: Stop::Loops(0),
                seed: 1,
                drop_cache,
            };
            run(&d, &p, o).unwrap();
            let resident = resident_pages(&d.join("datafiles/d0/f0"));
            std::fs::remove_dir_all(&d).unwrap();
            if drop_cache {
                assert_eq!(resident, 0, "pages stayed cached after the drop");
            } else {
                assert!(
                    resident > 0,
                    "nothing cached even without the drop: the check cannot tell"
                );
            }
        }
    }

    /// Sixteen threads creating, opening and deleting among 20 files: an
    /// open may find every file busy ("no suitable file"), but never a file
    /// another thread has not finished creating or is deleting.
    #[test]
    fn concurrent_threads_never_race_on_a_file() {
        let d = tmp("race");
        let mut p = varmail(Scale { files: 50, threads: 1 });
        p.threads[0].instances = 16;
        let mut opened = 0;
        for seed in 0..3 {
            let r = run(&d, &p, opts(30, seed)).unwrap();
            std::fs::remove_dir_all(&d).unwrap();
            opened += count(&r, "filereader:openfile");
            for op in r.errors.keys() {
                assert!(op.ends_with(": no suitable file") || op.ends_with(": no open file"), "{:?}", r.errors);
            }
        }
        assert!(opened > 0);
    }

    #[test]
    fn buffers_are_sized_by_what_a_thread_moves() {
        let p = oltp(Scale::FULL, false);
        assert_eq!(
            buffer_size(&p, &p.threads[2].flowops),
            4096,
            "2 KiB reads need no 1 MiB buffer"
        );
        assert_eq!(buffer_size(&p, &p.threads[0].flowops), 256 * 1024);
        let w = webserver(Scale::FULL);
        // 1 MiB reads of 16 KiB files, 32 KiB appends at most.
        assert_eq!(buffer_size(&w, &w.threads[0].flowops), 32 * 1024);
    }

    #[test]
    fn names_and_errors() {
        for n in NAMES {
            assert_eq!(personality(n, Scale::FULL).unwrap().name, n);
        }
        assert!(personality("oltp-direct", Scale::FULL)
            .unwrap()
            .filesets
            .iter()
            .all(|f| f.direct));
        assert!(personality("mailserver", Scale::FULL).is_none());
        // A directory that cannot be made is a clear error.
        let e = run(
            Path::new("/proc/bw-no-such"),
            &varmail(Scale::both(100)),
            opts(1, 0),
        )
        .unwrap_err();
        assert!(e.to_string().contains("bigfileset"), "{e}");
    }

    fn walk(d: &Path) -> usize {
        let mut n = 0;
        for e in std::fs::read_dir(d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                n += walk(&e.path());
            } else {
                n += 1;
            }
        }
        n
    }
}
