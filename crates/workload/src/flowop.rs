//! A small flowop engine running filebench's documented personalities on a
//! directory (filebench itself is not packaged for Debian 12). A personality
//! is data: file sets (count, size, preallocated share) and thread kinds,
//! each a loop over a flowop sequence. The engine reports ops/s, MiB/s and
//! latency per flowop.
//!
//! Parameters follow filebench's workloads/*.f (webserver, fileserver,
//! varmail, oltp); `scale` divides the file counts and thread instances so a
//! short run fits a small machine. Not modelled: oltp's semaphores, `hog`
//! CPU burners and asynchronous I/O (its writes are synchronous pwrite with
//! O_DSYNC here), filebench's gamma-distributed file sizes (fixed sizes).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

#[derive(Debug, Clone, PartialEq)]
pub enum Flowop {
    /// Create a file that does not exist in `set` (it becomes the thread's open file).
    Create { set: usize },
    /// Open an existing file of `set`.
    Open { set: usize },
    Close,
    /// Read the open file from start to end in `iosize` chunks.
    ReadWhole { iosize: u64 },
    /// Write the set's file size to the open file in `iosize` chunks.
    WriteWhole { iosize: u64 },
    /// Append a random 1..=2*mean bytes to the open file.
    AppendRand { mean: u64 },
    Fsync,
    /// Delete an existing file of `set`.
    Delete { set: usize },
    Stat { set: usize },
    /// pread/pwrite of `iosize` at a random aligned offset of a random file of `set`.
    ReadRandom { set: usize, iosize: u64 },
    WriteRandom { set: usize, iosize: u64, dsync: bool },
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

fn div(n: usize, scale: usize) -> usize {
    (n / scale.max(1)).max(1)
}

/// webserver.f: 1000 files of 16 KiB in directories of 20, 100 threads each
/// reading 10 whole files (open/read/close) then appending 16 KiB to a log.
pub fn webserver(scale: usize) -> Personality {
    let mut flowops = vec![];
    for _ in 0..10 {
        flowops.extend([Flowop::Open { set: 0 }, Flowop::ReadWhole { iosize: MIB }, Flowop::Close]);
    }
    flowops.extend([Flowop::Open { set: 1 }, Flowop::AppendRand { mean: 16 * KIB }, Flowop::Close]);
    Personality {
        name: "webserver".into(),
        filesets: vec![
            FileSet { name: "bigfileset".into(), count: div(1000, scale), size: 16 * KIB, prealloc_pct: 100, direct: false },
            FileSet { name: "logfiles".into(), count: 1, size: 16 * KIB, prealloc_pct: 100, direct: false },
        ],
        threads: vec![ThreadKind { name: "filereader".into(), instances: div(100, scale), flowops }],
    }
}

/// fileserver.f: 10000 files of 128 KiB, 50 threads each creating and
/// writing a file, appending 16 KiB to another, reading a whole one,
/// deleting one and stat-ing one.
pub fn fileserver(scale: usize) -> Personality {
    let s = 0;
    Personality {
        name: "fileserver".into(),
        filesets: vec![FileSet { name: "bigfileset".into(), count: div(10_000, scale), size: 128 * KIB, prealloc_pct: 80, direct: false }],
        threads: vec![ThreadKind {
            name: "filereader".into(),
            instances: div(50, scale),
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
pub fn varmail(scale: usize) -> Personality {
    let s = 0;
    Personality {
        name: "varmail".into(),
        filesets: vec![FileSet { name: "bigfileset".into(), count: div(1000, scale), size: 16 * KIB, prealloc_pct: 80, direct: false }],
        threads: vec![ThreadKind {
            name: "filereader".into(),
            instances: div(16, scale),
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
/// synchronous writes) and 200 shadow readers (2 KiB random reads).
/// `direct`: the data and log files with O_DIRECT (filebench's directio=1).
pub fn oltp(scale: usize, direct: bool) -> Personality {
    Personality {
        name: "oltp".into(),
        filesets: vec![
            FileSet { name: "datafiles".into(), count: 10, size: 10 * MIB, prealloc_pct: 100, direct },
            FileSet { name: "logfile".into(), count: 1, size: 10 * MIB, prealloc_pct: 100, direct },
        ],
        threads: vec![
            ThreadKind { name: "lgwr".into(), instances: 1, flowops: vec![Flowop::WriteRandom { set: 1, iosize: 256 * KIB, dsync: true }] },
            ThreadKind {
                name: "dbwr".into(),
                instances: div(10, scale),
                flowops: vec![Flowop::WriteRandom { set: 0, iosize: 2 * KIB, dsync: true }],
            },
            ThreadKind { name: "shadow".into(), instances: div(200, scale), flowops: vec![Flowop::ReadRandom { set: 0, iosize: 2 * KIB }] },
        ],
    }
}

pub fn personality(name: &str, scale: usize) -> Option<Personality> {
    Some(match name {
        "webserver" => webserver(scale),
        "fileserver" => fileserver(scale),
        "varmail" => varmail(scale),
        "oltp" => oltp(scale, false),
        "oltp-direct" => oltp(scale, true),
        _ => return None,
    })
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OpStats {
    pub count: u64,
    pub bytes: u64,
    pub lat_total_ns: u64,
    pub lat_max_ns: u64,
}

impl OpStats {
    fn add(&mut self, bytes: u64, ns: u64) {
        self.count += 1;
        self.bytes += bytes;
        self.lat_total_ns += ns;
        self.lat_max_ns = self.lat_max_ns.max(ns);
    }
    pub fn mean_lat_us(&self) -> f64 {
        if self.count == 0 { 0.0 } else { self.lat_total_ns as f64 / self.count as f64 / 1000.0 }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FlowResult {
    pub personality: String,
    pub elapsed_s: f64,
    pub ops: u64,
    pub ops_per_s: f64,
    pub mib_per_s: f64,
    /// Per flowop name.
    pub flowops: BTreeMap<String, OpStats>,
    /// Operations that failed (e.g. no free file to create), by flowop.
    pub errors: BTreeMap<String, u64>,
}

/// When a run stops: after each thread did `Loops` passes over its flowops, or after a time.
#[derive(Debug, Clone, Copy)]
pub enum Stop {
    Loops(u64),
    After(Duration),
}

#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    #[error("preparing file set {set} in {dir}")]
    Prepare { set: String, dir: PathBuf, source: std::io::Error },
}

struct Set {
    def: FileSet,
    dir: PathBuf,
    exists: Mutex<Vec<bool>>,
}

impl Set {
    fn path(&self, i: usize) -> PathBuf {
        // Directories of at most 20 files, as filebench's meandirwidth=20 (varmail: one).
        self.dir.join(format!("d{}", i / 20)).join(format!("f{i}"))
    }
    /// A random index whose existence is `want`; flips it to `set_to`.
    fn pick(&self, rng: &mut SmallRng, want: bool, set_to: bool) -> Option<usize> {
        let mut g = self.exists.lock().unwrap_or_else(|p| p.into_inner());
        let n = g.len();
        let start = rng.gen_range(0..n);
        let i = (0..n).map(|k| (start + k) % n).find(|&i| g[i] == want)?;
        g[i] = set_to;
        Some(i)
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

/// Create the file sets under `dir` (preallocated share of each).
fn prepare(dir: &Path, p: &Personality) -> Result<Vec<Set>, FlowError> {
    let buf = vec![0x5Au8; MIB as usize];
    let mut sets = vec![];
    for fs in &p.filesets {
        let sdir = dir.join(&fs.name);
        let err = |source| FlowError::Prepare { set: fs.name.clone(), dir: sdir.clone(), source };
        let pre = fs.count * fs.prealloc_pct as usize / 100;
        let set = Set { def: fs.clone(), dir: sdir.clone(), exists: Mutex::new(vec![false; fs.count]) };
        for i in 0..fs.count {
            std::fs::create_dir_all(set.path(i).parent().unwrap_or(&sdir)).map_err(err)?;
            if i < pre {
                let mut f = File::create(set.path(i)).map_err(err)?;
                fill(&mut f, fs.size, &buf).map_err(err)?;
                set.exists.lock().unwrap_or_else(|p| p.into_inner())[i] = true;
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

struct Worker<'a> {
    sets: &'a [Set],
    rng: SmallRng,
    /// The thread's open file and which set/index it is.
    open: Option<(File, usize, usize)>,
    stats: BTreeMap<String, OpStats>,
    errors: BTreeMap<String, u64>,
    buf: AlignedBuf,
}

impl Worker<'_> {
    /// One flowop; Ok(bytes moved) or Err when it could not run.
    fn step(&mut self, op: &Flowop) -> std::io::Result<u64> {
        let none = || std::io::Error::other("no suitable file");
        let closed = || std::io::Error::other("no open file");
        match *op {
            Flowop::Create { set } => {
                let s = &self.sets[set];
                let i = s.pick(&mut self.rng, false, true).ok_or_else(none)?;
                let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(s.path(i))?;
                self.open = Some((f, set, i));
                Ok(0)
            }
            Flowop::Open { set } => {
                let s = &self.sets[set];
                let i = s.pick(&mut self.rng, true, true).ok_or_else(none)?;
                self.open = Some((s.open(i, true, false)?, set, i));
                Ok(0)
            }
            Flowop::Close => {
                self.open.take().ok_or_else(closed)?;
                Ok(0)
            }
            Flowop::ReadWhole { iosize } => {
                let (f, _, _) = self.open.as_mut().ok_or_else(closed)?;
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
            Flowop::WriteWhole { iosize } => {
                let (f, set, _) = self.open.as_mut().ok_or_else(closed)?;
                let size = self.sets[*set].def.size;
                let mut left = size;
                while left > 0 {
                    let n = left.min(iosize) as usize;
                    f.write_all(self.buf.get(n))?;
                    left -= n as u64;
                }
                Ok(size)
            }
            Flowop::AppendRand { mean } => {
                let n = self.rng.gen_range(1..=2 * mean) as usize;
                let (f, _, _) = self.open.as_mut().ok_or_else(closed)?;
                let end = f.metadata()?.len();
                f.write_all_at(self.buf.get(n), end)?;
                Ok(n as u64)
            }
            Flowop::Fsync => {
                let (f, _, _) = self.open.as_ref().ok_or_else(closed)?;
                f.sync_all()?;
                Ok(0)
            }
            Flowop::Delete { set } => {
                let s = &self.sets[set];
                let i = s.pick(&mut self.rng, true, false).ok_or_else(none)?;
                std::fs::remove_file(s.path(i))?;
                Ok(0)
            }
            Flowop::Stat { set } => {
                let s = &self.sets[set];
                let i = {
                    let g = s.exists.lock().unwrap_or_else(|p| p.into_inner());
                    let have: Vec<usize> = (0..g.len()).filter(|&i| g[i]).collect();
                    *have.get(self.rng.gen_range(0..have.len().max(1))).ok_or_else(none)?
                };
                std::fs::metadata(s.path(i))?;
                Ok(0)
            }
            Flowop::ReadRandom { set, iosize } | Flowop::WriteRandom { set, iosize, .. } => {
                let s = &self.sets[set];
                let i = self.rng.gen_range(0..s.def.count);
                let write = matches!(op, Flowop::WriteRandom { .. });
                let dsync = matches!(op, Flowop::WriteRandom { dsync: true, .. });
                let f = s.open(i, write, dsync)?;
                let blocks = (s.def.size / iosize).max(1);
                let off = self.rng.gen_range(0..blocks) * iosize;
                let buf = self.buf.get(iosize as usize);
                if write {
                    f.write_all_at(buf, off)?;
                } else {
                    f.read_exact_at(buf, off)?;
                }
                Ok(iosize)
            }
        }
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
                let t = Instant::now();
                match self.step(op) {
                    Ok(bytes) => self.stats.entry(op.name().into()).or_default().add(bytes, t.elapsed().as_nanos() as u64),
                    Err(_) => *self.errors.entry(op.name().into()).or_default() += 1,
                }
            }
            // A file left open by a failed step does not leak into the next loop.
            self.open = None;
            loops += 1;
        }
    }
}

/// Run `p` on `dir` (created if missing; the file sets are made first and
/// left in place). `seed` makes file choice and append sizes repeatable.
pub fn run(dir: &Path, p: &Personality, stop: Stop, seed: u64) -> Result<FlowResult, FlowError> {
    let sets = prepare(dir, p)?;
    let started = Instant::now();
    let mut results: Vec<(BTreeMap<String, OpStats>, BTreeMap<String, u64>)> = vec![];
    std::thread::scope(|sc| {
        let mut handles = vec![];
        let mut n = 0u64;
        for kind in &p.threads {
            for _ in 0..kind.instances {
                n += 1;
                let sets = &sets;
                let rng = SmallRng::seed_from_u64(seed.wrapping_add(n));
                handles.push(sc.spawn(move || {
                    let mut w = Worker { sets, rng, open: None, stats: BTreeMap::new(), errors: BTreeMap::new(), buf: AlignedBuf::new(MIB as usize) };
                    w.run(&kind.flowops, stop, started);
                    (w.stats, w.errors)
                }));
            }
        }
        for h in handles {
            if let Ok(r) = h.join() {
                results.push(r);
            }
        }
    });
    let elapsed_s = started.elapsed().as_secs_f64();
    let mut out = FlowResult { personality: p.name.clone(), elapsed_s, ..Default::default() };
    for (stats, errors) in results {
        for (k, v) in stats {
            let e = out.flowops.entry(k).or_default();
            e.count += v.count;
            e.bytes += v.bytes;
            e.lat_total_ns += v.lat_total_ns;
            e.lat_max_ns = e.lat_max_ns.max(v.lat_max_ns);
        }
        for (k, v) in errors {
            *out.errors.entry(k).or_default() += v;
        }
    }
    out.ops = out.flowops.values().map(|s| s.count).sum();
    let bytes: u64 = out.flowops.values().map(|s| s.bytes).sum();
    out.ops_per_s = out.ops as f64 / elapsed_s.max(1e-9);
    out.mib_per_s = bytes as f64 / MIB as f64 / elapsed_s.max(1e-9);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("bw-flowop-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn count(r: &FlowResult, op: &str) -> u64 {
        r.flowops.get(op).map(|s| s.count).unwrap_or(0)
    }

    #[test]
    fn webserver_reads_ten_files_per_log_append() {
        let d = tmp("web");
        let p = webserver(50); // 20 files, 2 threads
        let r = run(&d, &p, Stop::Loops(3), 7).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        // 2 threads x 3 loops: 60 whole-file reads of 16 KiB, 6 appends.
        assert_eq!(count(&r, "readwholefile"), 60);
        assert_eq!(r.flowops["readwholefile"].bytes, 60 * 16 * KIB);
        assert_eq!(count(&r, "appendfilerand"), 6);
        assert_eq!(count(&r, "openfile"), 66);
        assert_eq!(count(&r, "closefile"), 66);
    }

    #[test]
    fn fileserver_and_varmail_keep_their_op_mix() {
        let d = tmp("fsrv");
        let r = run(&d, &fileserver(500), Stop::Loops(4), 1).unwrap(); // 20 files (16 pre), 1 thread
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        for op in ["createfile", "writewholefile", "appendfilerand", "readwholefile", "deletefile", "statfile"] {
            assert_eq!(count(&r, op), 4, "{op}");
        }
        assert_eq!(r.flowops["writewholefile"].bytes, 4 * 128 * KIB);
        // One create and one delete per loop: the number of files stays.
        let files = walk(&d.join("bigfileset"));
        assert_eq!(files, 16);
        std::fs::remove_dir_all(&d).unwrap();

        let d = tmp("mail");
        let r = run(&d, &varmail(16), Stop::Loops(5), 2).unwrap(); // 62 files, 1 thread
        std::fs::remove_dir_all(&d).unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(count(&r, "fsync"), 10, "two fsync points per loop");
        assert_eq!(count(&r, "readwholefile"), 10);
        assert_eq!(count(&r, "deletefile"), 5);
    }

    #[test]
    fn oltp_mixes_log_writes_db_writes_and_reads() {
        let d = tmp("oltp");
        let r = run(&d, &oltp(10, false), Stop::Loops(10), 3).unwrap(); // lgwr 1, dbwr 1, shadow 20
        std::fs::remove_dir_all(&d).unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(count(&r, "read"), 200);
        assert_eq!(r.flowops["read"].bytes, 200 * 2 * KIB);
        // 10 log writes of 256 KiB and 10 db writes of 2 KiB.
        assert_eq!(count(&r, "write"), 20);
        assert_eq!(r.flowops["write"].bytes, 10 * 256 * KIB + 10 * 2 * KIB);
        assert!(r.ops_per_s > 0.0 && r.mib_per_s > 0.0);
    }

    #[test]
    fn names_and_errors() {
        assert!(personality("webserver", 1).is_some());
        assert!(personality("oltp-direct", 1).unwrap().filesets.iter().all(|f| f.direct));
        assert!(personality("mailserver", 1).is_none());
        // A directory that cannot be made is a clear error.
        let e = run(Path::new("/proc/bw-no-such"), &varmail(100), Stop::Loops(1), 0).unwrap_err();
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
