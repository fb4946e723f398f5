//! This machine's state file: what a run makes here, written down before it
//! is made, in the format and with the undo script the ssh hosts' state
//! files have (`crate::hosts::state_file`). The cleanup registry records each
//! resource it tracks (namespaces, links, qdiscs, processes with their
//! start times, files, directories, mounts, `blockwire mount`s, loop
//! devices, cgroups) through [`open`]'s recorder, and what an owner makes
//! on this machine through [`record`] (`Host::record`).
//!
//! A run ends by undoing everything itself; a run that could not (SIGKILL,
//! an OOM kill, a crash, a power cut, a cleanup that failed) leaves its
//! file in [`LOCAL_DIR`], and the next run on this machine undoes it before
//! it makes anything ([`sweep`]). Whose a file is, is its `run` line
//! (`state_file::RunOwner`): PID, start time and boot id, so neither a
//! reused PID nor a reboot makes a dead run look alive, and a live run's
//! file is never touched. Nothing is ever swept by its name: only what a
//! dead run's file lists.

use crate::cleanup::Resource;
use crate::hosts::state_file::{RunOwner, Swept, CLEANUP_SCRIPT};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where this machine's state files live (one per run, `state-local-…`).
pub const LOCAL_DIR: &str = "/var/tmp/bwlab-local";

/// How long a sweep waits for another run sweeping the same dead run's
/// file (the undo of a mount can take that long: `blockwire umount`).
const SWEEP_LOCK_WAIT: Duration = Duration::from_secs(180);

/// The open state file of this run.
struct Open {
    path: PathBuf,
    file: std::fs::File,
}

static OPEN: Mutex<Option<Open>> = Mutex::new(None);

fn open_file() -> std::sync::MutexGuard<'static, Option<Open>> {
    OPEN.lock().unwrap_or_else(|p| p.into_inner())
}

/// The state file of this run, if it keeps one.
pub fn path() -> Option<PathBuf> {
    open_file().as_ref().map(|o| o.path.clone())
}

/// Start this run's state file in `dir` (its first line names the run: see
/// `RunOwner`), and record every resource the cleanup registry tracks in
/// it from now on. Call before anything is made.
pub fn open(dir: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let owner = RunOwner::current();
    let name = format!("state-local-{}-{}-{}", &owner.boot_id[..8.min(owner.boot_id.len())], owner.pid, owner.start);
    let path = dir.join(&name);
    // Whole or not at all: a sweep never sees a file without its owner.
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, format!("{}\n", owner.line()))?;
    std::fs::rename(&tmp, &path)?;
    let file = std::fs::OpenOptions::new().append(true).custom_flags(libc::O_CLOEXEC).open(&path)?;
    *open_file() = Some(Open { path: path.clone(), file });
    crate::cleanup::set_recorder(record_resource);
    Ok(path)
}

/// What a run does on this machine before it makes anything: undo what
/// dead runs left here (saying what), then start its own state file. A
/// state file that cannot be kept (no write access to [`LOCAL_DIR`]) is
/// said and the run goes on.
pub fn start_run() {
    let dir = Path::new(LOCAL_DIR);
    for s in sweep(dir) {
        crate::cleanup::say(&format!("lab: {}", s.message("this machine")));
    }
    match open(dir) {
        Ok(_) => crate::cleanup::after_forced_end(|_| {
            if let Some(kept) = close() {
                crate::cleanup::say(&format!("lab: it is listed in {}: the next `blockwire lab` (or `blockwire lab sweep`) undoes it", kept.display()));
            }
        }),
        Err(e) => crate::cleanup::say(&format!(
            "lab: cannot keep a state file in {LOCAL_DIR} ({e:#}): should this run be killed, the next one will not undo what it left here"
        )),
    }
}

/// Write `KIND A B` to this run's state file (nothing if it keeps none).
pub fn record(kind: &str, a: &str, b: &str) -> anyhow::Result<()> {
    let mut g = open_file();
    let Some(o) = g.as_mut() else { return Ok(()) };
    // One write per line, so a kill cannot leave half of one mid-file.
    let line = format!("{kind} {a} {b}").trim_end().to_string() + "\n";
    o.file.write_all(line.as_bytes()).map_err(|e| anyhow::anyhow!("writing {}: {e}", o.path.display()))
}

/// The recorder the registry calls for what it tracks on this machine.
fn record_resource(res: &Resource) -> anyhow::Result<()> {
    match line_of(res) {
        Some((kind, a, b)) => record(kind, &a, &b),
        None => Ok(()),
    }
}

/// A resource's state-file line (`None`: its owner records it, on its host).
pub fn line_of(res: &Resource) -> Option<(&'static str, String, String)> {
    let p = |p: &Path| p.to_string_lossy().into_owned();
    Some(match res {
        Resource::Child { pid, .. } => ("pid", pid.to_string(), crate::hosts::state_file::start_ticks(*pid)?.to_string()),
        Resource::BlockwireMount { exe, mountpoint } => ("bwmount", p(mountpoint), p(exe)),
        Resource::Mount(mp) => ("mount", p(mp), String::new()),
        Resource::Loop { dev, backing } => ("loop", if dev.is_empty() { "-".into() } else { dev.clone() }, p(backing)),
        Resource::Cgroup(dir) => ("cgroup", p(dir), String::new()),
        Resource::Dir(dir) => ("rmdir", p(dir), String::new()),
        Resource::Netns(name) => ("netns", name.clone(), String::new()),
        Resource::Veth { ns, name } => ("link", name.clone(), ns.clone().unwrap_or_default()),
        Resource::Qdisc { ns, dev } => ("qdisc", dev.clone(), ns.clone()),
        Resource::File(f) => ("file", p(f), String::new()),
        Resource::Owned(_) => return None,
    })
}

/// The run is over and its cleanup done: with everything it made here
/// undone (nothing of this machine's left in the registry), its state file
/// goes; with something left, it stays for the next run, which undoes it.
/// Returns the file when it was kept.
pub fn close() -> Option<PathBuf> {
    let left_here = crate::cleanup::registry().tracked().iter().any(|r| line_of(r).is_some());
    let o = open_file().take()?;
    drop(o.file);
    if !left_here {
        let _ = std::fs::remove_file(&o.path);
        if let Some(dir) = o.path.parent() {
            let _ = std::fs::remove_dir(dir);
        }
        None
    } else {
        Some(o.path)
    }
}

/// Undo what dead runs left on this machine: every state file in `dir` but
/// this run's whose owner is not a live lab run. Another run sweeping the
/// same file is waited for (the first one undoes it). Returns what each
/// sweep found and did.
pub fn sweep(dir: &Path) -> Vec<Swept> {
    let own = path();
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("state-")))
        .filter(|p| Some(p) != own.as_ref())
        .collect();
    names.sort();
    let mut out = vec![];
    for state in names {
        let Ok(text) = std::fs::read_to_string(&state) else { continue };
        let owner = match RunOwner::of_state(&text) {
            Some(o) if o.is_live() => continue,
            Some(o) => o.describe(),
            // Not a file of this format (a run's files always start with it).
            None => continue,
        };
        match sweep_one(&state, &owner, &text) {
            Ok(Some(s)) => out.push(s),
            Ok(None) => {}
            Err(e) => out.push(Swept { state: state.display().to_string(), owner, still: vec![format!("({e:#})")], ..Default::default() }),
        }
    }
    out
}

/// Take `f`'s exclusive lock (`flock`), trying every `poll` for at most
/// `wait`; whether it was taken. A lock the runs on this machine share,
/// each holder keeping it a bounded time: a run that waits longer reports
/// it rather than hang.
pub(crate) fn lock_within(f: &std::fs::File, wait: Duration, poll: Duration) -> bool {
    use std::os::unix::io::AsRawFd;
    let deadline = Instant::now() + wait;
    // SAFETY: flock on a descriptor we own.
    while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(poll);
    }
    true
}

/// Held by a run from its look at the allowed list until both its
/// namespaces have taken their default, and by a run putting the list
/// back: otherwise a run ending between another's look (the algorithm
/// there, added by the first) and that one's `sysctl` takes the algorithm
/// off the list, and the `sysctl` fails with EPERM. Lab runs in parallel
/// (the integration tests' are) all do this since `auto` became the
/// default. A sweep's undo script takes it around each `write` line it
/// puts back ([`sweep_one`]). The lock file is [`CONGESTION_LOCK`] in the
/// runs' state directory; a holder keeps it for milliseconds.
pub(crate) struct CongestionLock(#[allow(dead_code)] std::fs::File);

/// The lock file's name in [`LOCAL_DIR`] (not a `state-` file:
/// the sweep of dead runs' files passes it by).
const CONGESTION_LOCK: &str = "congestion.lock";
/// How long a run waits for the lock before it gives up with an error.
const CONGESTION_LOCK_WAIT: Duration = Duration::from_secs(60);

impl CongestionLock {
    /// The lock file, made if it is not there, and its path.
    fn file() -> anyhow::Result<(std::fs::File, PathBuf)> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let dir = Path::new(LOCAL_DIR);
        // As `open` makes it: root's alone, in a /var/tmp anyone writes.
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
        let path = dir.join(CONGESTION_LOCK);
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Ok((f, path))
    }

    pub(crate) fn take() -> anyhow::Result<CongestionLock> {
        let (f, path) = CongestionLock::file()?;
        anyhow::ensure!(
            lock_within(&f, CONGESTION_LOCK_WAIT, Duration::from_millis(20)),
            "{}: another lab run has held it for {CONGESTION_LOCK_WAIT:?}",
            path.display()
        );
        Ok(CongestionLock(f))
    }
}

/// Undo one dead run's state file (`text`), holding its lock (so two runs
/// starting at once undo it once); `None` when another sweep removed it
/// meanwhile. Its `write` lines (values put back: the allowed congestion
/// list a run widened, knfsd's settings) are written under the congestion
/// lock, each on its own (the script's `flock`, not the whole undo, which
/// can take minutes): a live run between its look at the allowed list and
/// its namespaces' `sysctl` would otherwise see the algorithm it found
/// there taken away.
fn sweep_one(state: &Path, owner: &str, text: &str) -> anyhow::Result<Option<Swept>> {
    let f = match std::fs::File::open(state) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    anyhow::ensure!(
        lock_within(&f, SWEEP_LOCK_WAIT, Duration::from_millis(100)),
        "another run has been sweeping it for {SWEEP_LOCK_WAIT:?}"
    );
    if !state.exists() {
        return Ok(None);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut undo = std::process::Command::new("sh");
    undo.args(["-c", CLEANUP_SCRIPT, "sh"]).arg(state).arg("stale");
    if text.lines().any(|l| l.starts_with("write ")) {
        undo.env("BWLAB_CONGESTION_LOCK", CongestionLock::file()?.1)
            .env("BWLAB_CONGESTION_LOCK_WAIT", CONGESTION_LOCK_WAIT.as_secs().to_string());
    }
    let out = undo
        // A dead run's `bwmount` line names its binary: this one, if that is gone.
        .env("BWLAB_EXE", &exe)
        .stdin(std::process::Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(out.status.success(), "its undo script failed: {}", crate::command::last_lines(&String::from_utf8_lossy(&out.stderr), 2));
    Ok(Some(Swept::from_output(&state.display().to_string(), owner, &text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("bwlab-local-unit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn each_local_resource_has_a_line() {
        let l = |r: Resource| line_of(&r).map(|(k, a, b)| format!("{k} {a} {b}").trim().to_string());
        assert_eq!(l(Resource::Netns("bwlab1t".into())).as_deref(), Some("netns bwlab1t"));
        assert_eq!(l(Resource::Veth { ns: Some("bwlab1t".into()), name: "bwl1at".into() }).as_deref(), Some("link bwl1at bwlab1t"));
        assert_eq!(l(Resource::Qdisc { ns: "bwlab1t".into(), dev: "bwl1at".into() }).as_deref(), Some("qdisc bwl1at bwlab1t"));
        assert_eq!(l(Resource::Loop { dev: String::new(), backing: "/dev/shm/x".into() }).as_deref(), Some("loop - /dev/shm/x"));
        assert_eq!(l(Resource::Dir("/tmp/d".into())).as_deref(), Some("rmdir /tmp/d"));
        let me = std::process::id();
        let start = crate::hosts::state_file::start_ticks(me).unwrap();
        assert_eq!(l(Resource::Child { pid: me, what: "x".into(), role: crate::cleanup::Role::Service }), Some(format!("pid {me} {start}")));
    }

    /// A live run's file is left alone whatever else is in the directory; a
    /// dead run's (another boot, or a process that is gone) is undone and
    /// says what it undid; a file that is no state file is not read as one.
    #[test]
    fn only_dead_runs_files_are_swept() {
        let d = dir("sweep");
        let made = |n: &str| {
            let f = d.join(n);
            std::fs::write(&f, "x").unwrap();
            f
        };
        let (a, b, c) = (made("a"), made("b"), made("c"));
        // A live lab run: `cat` waiting on a FIFO named `lab`, as `blockwire lab`.
        crate::command::sh("mkfifo", &[&d.join("lab").to_string_lossy()]).unwrap();
        let mut live = std::process::Command::new("bash").args(["-c", "exec -a blockwire cat lab"]).current_dir(&d).spawn().unwrap();
        let pid = live.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read(format!("/proc/{pid}/cmdline")).map(|c| c.starts_with(b"blockwire\0lab")).ok() != Some(true) {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(20));
        }
        let live_owner = RunOwner { pid, start: crate::hosts::state_file::start_ticks(pid).unwrap(), boot_id: crate::hosts::state_file::boot_id(), host: "-".into() };
        let gone = RunOwner { start: live_owner.start + 1, ..live_owner.clone() };
        let earlier_boot = RunOwner { boot_id: "0000-earlier".into(), ..live_owner.clone() };
        let write = |name: &str, owner: Option<&RunOwner>, f: &Path| {
            let head = owner.map(|o| o.line() + "\n").unwrap_or_default();
            std::fs::write(d.join(name), format!("{head}file {}\n", f.display())).unwrap();
        };
        write("state-local-live", Some(&live_owner), &a);
        write("state-local-gone", Some(&gone), &b);
        write("state-local-old", Some(&earlier_boot), &c);
        write("state-local-noowner", None, &a);
        let swept = sweep(&d);
        live.kill().unwrap();
        live.wait().unwrap();
        let mut states: Vec<String> = swept.iter().map(|s| s.state.rsplit('/').next().unwrap().to_string()).collect();
        states.sort();
        assert_eq!(states, ["state-local-gone", "state-local-old"], "{swept:#?}");
        assert!(a.exists(), "a live run's file was removed");
        assert!(!b.exists() && !c.exists(), "a dead run's file stayed");
        for s in &swept {
            assert_eq!(s.left.len(), 1, "{s:?}");
            assert!(s.still.is_empty(), "{s:?}");
        }
        assert!(swept.iter().any(|s| s.owner.contains("an earlier boot")));
        assert!(swept.iter().any(|s| s.owner.contains("this boot, gone")));
        assert!(d.join("state-local-live").exists() && d.join("state-local-noowner").exists());
        assert!(!d.join("state-local-gone").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A dead run's `write` line (the allowed congestion list it widened)
    /// is put back only under the congestion lock, which a live run holds
    /// from its look at the list to its namespaces' `sysctl`. (A slow
    /// machine can only make the sweep later, never let it in early.)
    #[test]
    fn a_dead_runs_setting_is_put_back_under_the_congestion_lock() {
        let d = dir("sweep-write");
        let setting = d.join("setting");
        std::fs::write(&setting, "widened\n").unwrap();
        let dead = RunOwner { pid: 1, start: 1, boot_id: "0000-earlier".into(), host: "-".into() };
        std::fs::write(d.join("state-local-dead"), format!("{}\nwrite {} as it was\n", dead.line(), setting.display())).unwrap();
        let held = CongestionLock::take().unwrap();
        let sweeping = {
            let d = d.clone();
            std::thread::spawn(move || sweep(&d))
        };
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(std::fs::read_to_string(&setting).unwrap(), "widened\n", "put back while another run held the congestion lock");
        drop(held);
        let swept = sweeping.join().unwrap();
        assert_eq!(swept.len(), 1, "{swept:#?}");
        assert!(swept[0].still.is_empty(), "{swept:#?}");
        assert_eq!(std::fs::read_to_string(&setting).unwrap(), "as it was\n");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
