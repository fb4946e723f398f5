//! Everything the lab creates on the machine is tracked here (namespaces,
//! veths, qdiscs, child processes, mounts with their loop devices and FUSE
//! connections, memory cgroups, temporary files and directories) so it is
//! removed on success, on error and on every signal that ends a run by
//! default (HUP, INT, TERM, QUIT; and when the lab's own output goes away,
//! what SIGPIPE stands for: see [`install_signal_handler`]). A resource is
//! tracked *before* it is created, marked busy while that runs, so a signal
//! arriving mid-creation cannot slip between "created" and "tracked"; the
//! registry's lock is only held for moments, so a forced cleanup can always
//! get at every resource (a creation such as `blockwire mount --mkfs` over
//! a slow link takes long).
//!
//! Release goes newest first, so what stands on something goes before it:
//! a workload before its cgroup and its mount, a mount before the target
//! that serves it, processes before their namespace.
//!
//! Each resource is also written down before it is made, through the
//! recorder the run installs ([`set_recorder`]: this machine's state
//! file, `crate::hosts::local_state`), so what a run that could not clean up
//! (SIGKILL, a crash) made is undone by the next run.
//!
//! Ctrl-C (or any ending signal): the first one stops the workloads
//! (SIGTERM; after a short grace their mounts' FUSE connections are
//! aborted, so I/O stuck on the way to a target fails instead of being
//! waited for, and what is left is killed), and the run saves what it has
//! and cleans up in order. A second one, or a run still not done 20 s
//! later, forces: FUSE connections aborted, every process killed, then the
//! same cleanup for at most [`FORCED_CLEANUP`], then what is left is
//! listed and the lab exits. A third one lists what is left and exits at
//! once.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What a child process is for: the first Ctrl-C stops workloads only, so
/// the run winds down while the targets still serve the mounts that must be
/// unmounted cleanly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Workload,
    Service,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    /// A child process, killed by PID (SIGTERM, then SIGKILL).
    Child {
        pid: u32,
        what: String,
        role: Role,
    },
    /// A `blockwire mount` (its attach daemon, FUSE connection, loop device
    /// and file system), undone with `blockwire umount`.
    BlockwireMount {
        exe: PathBuf,
        mountpoint: PathBuf,
    },
    /// A file system mounted directly (the local baseline), unmounted.
    Mount(PathBuf),
    /// A loop device on `backing` (checked before detaching: numbers are reused).
    Loop {
        dev: String,
        backing: PathBuf,
    },
    /// A memory cgroup directory: its processes are killed, then it is removed.
    Cgroup(PathBuf),
    /// An empty directory (mount points), removed.
    Dir(PathBuf),
    /// A network namespace (`ip netns add`, which also bind-mounts /run/netns/NAME).
    Netns(String),
    /// A veth end inside a namespace (`None`: the root namespace).
    Veth {
        ns: Option<String>,
        name: String,
    },
    /// A root qdisc (tc tbf link shaping) on a device inside a namespace.
    Qdisc {
        ns: String,
        dev: String,
    },
    File(PathBuf),
    /// Something its owner knows how to undo (a file or a run's state on
    /// an ssh host, a kernel initiator's session, a device's MTU): the
    /// owner registers the undo, and this module knows nothing of hosts.
    Owned(Owned),
}

/// What undoes one thing an owner made. Undoing must be safe to repeat
/// (a failed release stays tracked and is tried again), and quick when
/// [`interrupted`] (what is undone need not be kept then).
pub trait Undo: std::fmt::Debug + Send + Sync {
    fn undo(&self) -> anyhow::Result<()>;
}

/// An owner's [`Undo`], shared by the registry and whoever holds its copy.
#[derive(Debug, Clone)]
pub struct Owned(std::sync::Arc<dyn Undo>);

impl Owned {
    pub fn new(undo: impl Undo + 'static) -> Owned {
        Owned(std::sync::Arc::new(undo))
    }
}

impl Resource {
    /// What `undo` undoes, registered by its owner.
    pub fn owned(undo: impl Undo + 'static) -> Resource {
        Resource::Owned(Owned::new(undo))
    }
}

/// The same registration, not an equal-looking one.
impl PartialEq for Owned {
    fn eq(&self, other: &Owned) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for Owned {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token(u64);

#[derive(Default)]
struct Inner {
    next: u64,
    items: Vec<Entry>,
}

struct Entry {
    id: u64,
    res: Resource,
    /// Being created or released by some thread right now.
    busy: bool,
}

pub struct Registry {
    inner: Mutex<Inner>,
    /// Notified whenever an entry stops being busy.
    settled: Condvar,
}

static REGISTRY: OnceLock<Registry> = OnceLock::new();
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// Why the run was stopped: the signal, or another reason (a host lost,
/// the lab's output gone).
static ABORT_REASON: Mutex<Option<String>> = Mutex::new(None);
/// The signal that stopped the run (0: none): the exit status of a forced
/// end is 128 + it.
static STOP_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// What writes each resource down before it is made (this machine's state
/// file): set once by the run ([`set_recorder`]).
static RECORDER: OnceLock<fn(&Resource) -> anyhow::Result<()>> = OnceLock::new();

/// Write every resource the registry tracks down with `record` before it is
/// made (processes once they exist: their PID and start time).
pub fn set_recorder(record: fn(&Resource) -> anyhow::Result<()>) {
    let _ = RECORDER.set(record);
}

fn record(res: &Resource) -> anyhow::Result<()> {
    match RECORDER.get() {
        Some(r) => r(res),
        None => Ok(()),
    }
}

/// How long a cleanup waits for creations and releases that another
/// thread has under way (a forced cleanup while the main thread still
/// unmounts) before it releases those resources itself.
const SETTLE: Duration = Duration::from_secs(10);
/// After the first Ctrl-C, how long workloads get to stop on SIGTERM
/// before the FUSE connections under them are aborted and they are killed.
const WORKLOAD_GRACE: Duration = Duration::from_secs(3);
/// After the first Ctrl-C, when the run is forced to end.
const FORCE_AFTER: Duration = Duration::from_secs(20);
/// How long a forced end cleans up (every process already killed) before
/// it lists what is left and exits: a umount stuck in the kernel must not
/// keep a user who pressed Ctrl-C twice waiting. What is left stays in the
/// state file for the next run.
pub const FORCED_CLEANUP: Duration = Duration::from_secs(20);

pub fn registry() -> &'static Registry {
    REGISTRY.get_or_init(Registry::new)
}

/// Set once SIGINT or SIGTERM arrived (or [`abort`] was called); long
/// loops check it between runs.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Stop the run as the first Ctrl-C does, for `reason` (a lost host).
pub fn abort(reason: String) {
    if INTERRUPTED.load(Ordering::SeqCst) {
        return;
    }
    say(&format!("\nlab: {reason}: stopping, saving partial results and cleaning up"));
    set_reason(&reason);
    first_stop();
}

/// What stopped the run: the signal or [`abort`]'s reason.
pub fn stop_reason() -> String {
    ABORT_REASON.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_else(|| "interrupted".into())
}

/// The first stop (Ctrl-C or a lost host): workloads get SIGTERM, then
/// after a grace their FUSE I/O is aborted and they are killed; a run not
/// over 20 s later is forced to end.
fn first_stop() {
    INTERRUPTED.store(true, Ordering::SeqCst);
    registry().term_workloads();
    std::thread::spawn(|| {
        std::thread::sleep(WORKLOAD_GRACE);
        // I/O stuck on its way to a target is aborted, not waited for.
        let reg = registry();
        reg.abort_fuse();
        for pid in reg.children(Role::Workload) {
            signal(pid, libc::SIGKILL);
        }
        std::thread::sleep(FORCE_AFTER - WORKLOAD_GRACE);
        force_exit();
    });
}

impl Registry {
    fn new() -> Registry {
        Registry {
            inner: Mutex::new(Inner::default()),
            settled: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Mark entry `id` done with (`Some(keep)`: keep tracking it or not)
    /// and wake whoever waits for busy entries.
    fn settle(&self, id: u64, keep: bool) {
        let mut g = self.lock();
        if keep {
            if let Some(e) = g.items.iter_mut().find(|e| e.id == id) {
                e.busy = false;
            }
        } else {
            g.items.retain(|e| e.id != id);
        }
        drop(g);
        self.settled.notify_all();
    }

    /// Track `res`, then run `create` (without the lock: see the module
    /// comment). If creation fails the resource is cleaned (it may be
    /// half-made) and untracked.
    pub fn create<T>(
        &self,
        res: Resource,
        create: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<(Token, T)> {
        let id = {
            let mut g = self.lock();
            if interrupted() {
                anyhow::bail!("interrupted");
            }
            record(&res)?;
            let id = g.next;
            g.next += 1;
            g.items.push(Entry {
                id,
                res: res.clone(),
                busy: true,
            });
            id
        };
        match create() {
            Ok(v) => {
                self.settle(id, true);
                Ok((Token(id), v))
            }
            Err(e) => {
                let _ = release_resource(&res);
                self.settle(id, false);
                Err(e)
            }
        }
    }

    /// Create something whose identity is only known once it exists (a loop
    /// device's number): `intent` (what it will be, as far as known: a loop
    /// device on its file) is written down first, then `create` makes it
    /// and names it, under the lock, so a signal cannot fall between the
    /// two (keep `create` short).
    pub fn create_tracked<T>(
        &self,
        intent: Resource,
        create: impl FnOnce() -> anyhow::Result<(Resource, T)>,
    ) -> anyhow::Result<(Token, T)> {
        let mut g = self.lock();
        if interrupted() {
            anyhow::bail!("interrupted");
        }
        record(&intent)?;
        let (res, v) = create()?;
        if let Err(e) = record(&res) {
            log::warn!("cannot write {res:?} down: {e:#}");
        }
        let id = g.next;
        g.next += 1;
        g.items.push(Entry {
            id,
            res,
            busy: false,
        });
        Ok((Token(id), v))
    }

    /// Spawn `cmd` as a tracked child in its own process group (a Ctrl-C on
    /// the terminal reaches only the lab, which then stops children in order)
    /// with SIGKILL as its parent-death signal (a killed lab leaves no orphan).
    pub fn spawn(
        &self,
        cmd: &mut Command,
        what: &str,
        role: Role,
    ) -> anyhow::Result<(Token, Child)> {
        self.spawn_in(cmd, what, role, None)
    }

    /// [`Registry::spawn`], with the child placed in the cgroup whose
    /// `cgroup.procs` is `procs` before it executes anything, so none of
    /// its memory is charged elsewhere.
    pub fn spawn_in(
        &self,
        cmd: &mut Command,
        what: &str,
        role: Role,
        procs: Option<&std::path::Path>,
    ) -> anyhow::Result<(Token, Child)> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        let procs = match procs {
            Some(p) => Some(std::ffi::CString::new(p.as_os_str().as_bytes())?),
            None => None,
        };
        // SAFETY: prctl, open, write and close are async-signal-safe and touch
        // no Rust state; the path was allocated before fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(path) = &procs {
                    // "0" is the writing process itself, in v1 and v2.
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let err = std::io::Error::last_os_error();
                    libc::close(fd);
                    if n != 1 {
                        return Err(err);
                    }
                }
                Ok(())
            });
        }
        let mut g = self.lock();
        if interrupted() {
            anyhow::bail!("interrupted");
        }
        let child = cmd
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start {what}: {e}"))?;
        let res = Resource::Child {
            pid: child.id(),
            what: what.to_string(),
            role,
        };
        // (PDEATHSIG ends it with the lab anyway; the line also covers
        // what it may have left.)
        if let Err(e) = record(&res) {
            log::warn!("cannot write {what} down: {e:#}");
        }
        let id = g.next;
        g.next += 1;
        g.items.push(Entry {
            id,
            res,
            busy: false,
        });
        Ok((Token(id), child))
    }

    /// Stop tracking (the owner released the resource itself).
    pub fn forget(&self, t: Token) {
        self.lock().items.retain(|e| e.id != t.0);
        self.settled.notify_all();
    }

    /// Release one resource now and stop tracking it. One that cannot be
    /// released stays tracked, so the final cleanup tries again.
    pub fn release(&self, t: Token) -> anyhow::Result<()> {
        let res = {
            let mut g = self.lock();
            match g.items.iter_mut().find(|e| e.id == t.0 && !e.busy) {
                Some(e) => {
                    e.busy = true;
                    e.res.clone()
                }
                // Gone, or a cleanup is releasing it right now.
                None => return Ok(()),
            }
        };
        let r = release_resource(&res);
        self.settle(t.0, r.is_err());
        r
    }

    /// Release everything, newest first (see the module comment). Children
    /// next to each other in that order are signalled together, so their
    /// grace periods overlap. Creations and releases another thread has
    /// under way are waited for (up to [`SETTLE`]), then released here
    /// too: every release is safe to repeat. Returns the problems met, for
    /// the log.
    pub fn cleanup_all(&self) -> Vec<String> {
        let g = self.lock();
        let mut g = match self
            .settled
            .wait_timeout_while(g, SETTLE, |i| i.items.iter().any(|e| e.busy))
        {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        };
        let items: Vec<(u64, Resource)> = g
            .items
            .iter_mut()
            .rev()
            .map(|e| {
                e.busy = true;
                (e.id, e.res.clone())
            })
            .collect();
        drop(g);
        let mut errors = vec![];
        let mut i = 0;
        while i < items.len() {
            let mut pids = vec![];
            let mut ids = vec![];
            while let Some((id, Resource::Child { pid, .. })) = items.get(i) {
                pids.push(*pid);
                ids.push(*id);
                i += 1;
            }
            if !pids.is_empty() {
                kill_all(&pids);
            } else {
                let (id, res) = &items[i];
                if let Err(e) = release_resource(res) {
                    errors.push(format!("{res:?}: {e}"));
                }
                ids.push(*id);
                i += 1;
            }
            for id in ids {
                self.settle(id, false);
            }
        }
        errors
    }

    pub fn tracked(&self) -> Vec<Resource> {
        self.lock().items.iter().map(|e| e.res.clone()).collect()
    }

    /// The tracked children of `role`.
    fn children(&self, role: Role) -> Vec<u32> {
        self.lock()
            .items
            .iter()
            .filter_map(|e| match &e.res {
                Resource::Child { pid, role: r, .. } if *r == role => Some(*pid),
                _ => None,
            })
            .collect()
    }

    /// SIGTERM to every tracked workload (first Ctrl-C: the running bench
    /// or workload ends, the main loop notices and winds down; targets keep
    /// serving until the mounts on them are undone).
    fn term_workloads(&self) {
        for pid in self.children(Role::Workload) {
            signal(pid, libc::SIGTERM);
        }
    }

    /// Abort the FUSE connection under every tracked `blockwire mount`:
    /// whatever waits on one (a workload's write or fsync, an unmount's
    /// writeback, the mkfs of a mount being made) fails at once instead of
    /// waiting for the attach daemon and the target. Found through the
    /// mount table, so a hung daemon cannot hang this too.
    fn abort_fuse(&self) {
        let mounts: Vec<PathBuf> = self
            .lock()
            .items
            .iter()
            .filter_map(|e| match &e.res {
                Resource::BlockwireMount { mountpoint, .. } => Some(mountpoint.clone()),
                _ => None,
            })
            .collect();
        for mp in mounts {
            abort_fuse_under(&mp);
        }
    }

    /// The forced end's first step, before the ordered cleanup: no waiting
    /// on anything. FUSE connections aborted first (a process stuck in
    /// FUSE I/O cannot die before), then every tracked process and the
    /// attach daemons of the mounts killed.
    fn emergency(&self) {
        self.abort_fuse();
        let mut pids = self.children(Role::Workload);
        pids.extend(self.children(Role::Service));
        for e in self.tracked() {
            if let Resource::BlockwireMount { mountpoint, .. } = e {
                pids.extend(attach_daemon_of(&mountpoint).filter(|p| is_attach_daemon(*p)));
            }
        }
        for p in pids {
            signal(p, libc::SIGKILL);
        }
    }
}

/// The PID of the attach daemon serving the mount at `mp`, from the state
/// files `blockwire mount` leaves in /run/blockwire.
pub fn attach_daemon_of(mp: &std::path::Path) -> Option<u32> {
    bw_attach::AttachState::of_mountpoint(mp).map(|s| s.pid)
}

/// Whether `pid` is (still) a `blockwire attach` daemon: the PID comes from
/// a state file, and PIDs are reused.
fn is_attach_daemon(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|b| *b == 0).nth(1) == Some(b"attach"))
}

fn signal(pid: u32, sig: i32) {
    if pid > 1 {
        // SAFETY: plain kill(2) on a PID we started.
        unsafe {
            libc::kill(pid as i32, sig);
        }
    }
}

/// Is `pid` still running (not gone and not a zombie)?
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(") ")
            .map(|(_, rest)| !rest.starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// SIGTERM, up to 3 s grace, then SIGKILL; reaps what it can.
pub fn kill_all(pids: &[u32]) {
    for &p in pids {
        signal(p, libc::SIGTERM);
    }
    wait_gone(pids, Duration::from_secs(3));
    for &p in pids {
        if alive(p) {
            signal(p, libc::SIGKILL);
        }
    }
    wait_gone(pids, Duration::from_secs(2));
}

/// Wait up to `within` for every process of `pids` to end, reaping our own
/// children as they do; whether all are gone.
fn wait_gone(pids: &[u32], within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        reap(pids);
        if !pids.iter().any(|&p| alive(p)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn reap(pids: &[u32]) {
    for &p in pids {
        // SAFETY: non-blocking waitpid on our own child; ECHILD is harmless.
        unsafe {
            libc::waitpid(p as i32, std::ptr::null_mut(), libc::WNOHANG);
        }
    }
}

fn run_quiet(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(args[0]).args(&args[1..]).output()?;
    if out.status.success() {
        Ok(())
    } else {
        anyhow::bail!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
    }
}

fn release_resource(r: &Resource) -> anyhow::Result<()> {
    match r {
        Resource::Child { pid, .. } => {
            kill_all(&[*pid]);
            Ok(())
        }
        Resource::Netns(name) => {
            if !std::path::Path::new("/run/netns").join(name).exists() {
                return Ok(());
            }
            // Processes still inside would keep it alive; they were killed first.
            run_quiet(&["ip", "netns", "del", name])
        }
        Resource::Veth { ns, name } => {
            let exists = match ns {
                Some(ns) => Command::new("ip")
                    .args(["-n", ns, "link", "show", name])
                    .output()?
                    .status
                    .success(),
                None => Command::new("ip")
                    .args(["link", "show", name])
                    .output()?
                    .status
                    .success(),
            };
            if !exists {
                return Ok(());
            }
            match ns {
                Some(ns) => run_quiet(&["ip", "-n", ns, "link", "del", name]),
                None => run_quiet(&["ip", "link", "del", name]),
            }
        }
        Resource::Qdisc { ns, dev } => {
            // Gone with its namespace or device: nothing left to remove.
            if !std::path::Path::new("/run/netns").join(ns).exists() {
                return Ok(());
            }
            if !Command::new("ip")
                .args(["-n", ns, "link", "show", dev])
                .output()?
                .status
                .success()
            {
                return Ok(());
            }
            run_quiet(&[
                "ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root",
            ])
        }
        Resource::File(p) => match std::fs::remove_file(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        },
        Resource::Dir(p) => match std::fs::remove_dir(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        },
        Resource::BlockwireMount { exe, mountpoint } => release_blockwire_mount(exe, mountpoint),
        Resource::Mount(mp) => unmount(mp),
        Resource::Loop { dev, backing } => {
            if loop_backing(dev).as_deref() != Some(backing.as_path()) {
                return Ok(());
            }
            run_quiet(&["losetup", "-d", dev])?;
            wait_loop_detached(dev, backing, LOOP_RELEASE)
        }
        Resource::Cgroup(dir) => release_cgroup(dir),
        Resource::Owned(o) => o.0.undo(),
    }
}

/// Unmount; a file system kept busy by a process that is being killed gets
/// a few tries, then a lazy unmount so the run can still finish.
fn unmount(mp: &std::path::Path) -> anyhow::Result<()> {
    let s = mp.to_string_lossy();
    for _ in 0..10 {
        if !bw_attach::is_mountpoint(mp) {
            return Ok(());
        }
        if run_quiet(&["umount", &s]).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    run_quiet(&["umount", "-l", &s])
}

/// How long one `blockwire umount` may take before the FUSE connection
/// under it is aborted: a graceful unmount writes the client's dirty pages
/// back through FUSE to the target, which a busy machine and a shaped link
/// can stretch, and a hung daemon stretches for ever.
const UMOUNT_PATIENCE: Duration = Duration::from_secs(15);

/// Abort the FUSE connection of the attach under `blockwire mount`'s file
/// system at `mp`, if one is mounted (abort_connection finds it in the
/// mount table and does nothing when there is none).
fn abort_fuse_under(mp: &std::path::Path) {
    let _ = bw_attach::abort_connection(&bw_attach::mount_fuse_dir(mp));
}

/// `blockwire umount` undoes the file system, loop device, FUSE connection
/// and attach daemon in order. After an interruption nothing on the volume
/// matters, so the FUSE connection is aborted first and the writes still
/// on their way fail at once; otherwise an unmount that takes longer than
/// [`UMOUNT_PATIENCE`] gets the same. A busy file system gets a few tries.
fn release_blockwire_mount(exe: &std::path::Path, mp: &std::path::Path) -> anyhow::Result<()> {
    let abort = || abort_fuse_under(mp);
    if interrupted() {
        abort();
    }
    let mut last = String::new();
    for _ in 0..5 {
        // Its own wait for the loop device ends before this one gives up,
        // so its message (naming who holds the device) is what is reported.
        let mut child = Command::new(exe)
            .arg("umount")
            .arg(mp)
            .args(["--wait", &LOOP_RELEASE.as_secs().to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let t0 = Instant::now();
        let mut aborted = false;
        let status = loop {
            if let Some(st) = child.try_wait()? {
                break Some(st);
            }
            if !aborted && t0.elapsed() > UMOUNT_PATIENCE {
                abort();
                aborted = true;
            }
            if t0.elapsed() > 2 * UMOUNT_PATIENCE {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        match status {
            Some(st) if st.success() && !bw_attach::is_mountpoint(mp) => return Ok(()),
            Some(_) => {
                last.clear();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut last);
                }
            }
            None => last = format!("no answer in {:?}, even with its FUSE connection aborted", 2 * UMOUNT_PATIENCE),
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    anyhow::bail!("blockwire umount {}: {}", mp.display(), last.trim())
}

/// How long a loop device may stay open by others after `losetup -d`
/// (which then only marks it to detach on its last close) before its
/// release is reported as failed; also `blockwire umount --wait`. A bound
/// on an event, not a timing: btrfs closes its device after umount returns,
/// and on a busy machine that took over 10 s.
const LOOP_RELEASE: Duration = Duration::from_secs(60);

/// Wait up to `limit` for loop device `dev` to let go of `backing`. An
/// error names who still holds it (a file system on it still mounted in
/// another mount namespace, made while it was mounted here).
fn wait_loop_detached(dev: &str, backing: &std::path::Path, limit: Duration) -> anyhow::Result<()> {
    let t0 = Instant::now();
    loop {
        if loop_backing(dev).as_deref() != Some(backing) {
            return Ok(());
        }
        if t0.elapsed() >= limit {
            anyhow::bail!(
                "{dev} is still in use after {} s{}; it detaches by itself once that ends",
                limit.as_secs(),
                loop_mounted_in(dev)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// " (mounted in the mount namespace of PID ...)" for a block device that
/// is mounted in mount namespaces other than ours, for messages.
fn loop_mounted_in(dev: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    let Ok(rdev) = std::fs::metadata(dev).map(|m| m.rdev()) else {
        return String::new();
    };
    let dev_no = format!("{}:{}", libc::major(rdev), libc::minor(rdev));
    let ours = std::fs::read_link("/proc/self/ns/mnt").ok();
    let mut seen = vec![];
    let mut pids = vec![];
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = p.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(ns) = std::fs::read_link(p.path().join("ns/mnt")) else {
            continue;
        };
        if Some(&ns) == ours.as_ref() || seen.contains(&ns) {
            continue;
        }
        seen.push(ns);
        let mounted = std::fs::read_to_string(p.path().join("mountinfo"))
            .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(2) == Some(&dev_no)));
        if mounted {
            let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
            pids.push(format!("{pid} ({})", comm.trim()));
        }
    }
    if pids.is_empty() {
        String::new()
    } else {
        format!(" (mounted in the mount namespace of PID {})", pids.join(", "))
    }
}

/// The file behind loop device `dev`, if it is attached.
pub fn loop_backing(dev: &str) -> Option<PathBuf> {
    let name = dev.trim_start_matches("/dev/");
    let f = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(PathBuf::from(f.trim()))
}

/// Kill what is left in a cgroup (an interrupted workload's children), then
/// remove it: a cgroup with processes cannot be removed.
fn release_cgroup(dir: &std::path::Path) -> anyhow::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    for _ in 0..50 {
        let procs: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if procs.is_empty() {
            break;
        }
        for p in procs {
            signal(p, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(anyhow::anyhow!("removing cgroup {}: {e}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// A line on stderr that never fails the caller: once the terminal is gone
/// (a hangup) or the reader of a pipe exited, `eprintln!` would panic.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The signals that end a process by default and end a run here, with what
/// the run's results say stopped it. SIGPIPE is not among them: the lab
/// writes to its children's pipes (an ssh session's stdin, a file sent to
/// a host), and one of them ending must not end the run, so it stays
/// ignored, as Rust programs have it; what it stands for when the lab's
/// own output goes away is watched for instead ([`watch_outputs`]).
const ENDING_SIGNALS: [(i32, &str, &str); 4] = [
    (libc::SIGINT, "SIGINT", "interrupted"),
    (libc::SIGTERM, "SIGTERM", "interrupted by SIGTERM"),
    (libc::SIGHUP, "SIGHUP", "interrupted by SIGHUP (the terminal or the ssh session closed)"),
    (libc::SIGQUIT, "SIGQUIT", "interrupted by SIGQUIT"),
];

/// Whether `sig` is ignored now (SIGHUP under `nohup`).
fn ignored(sig: i32) -> bool {
    // SAFETY: sigaction with a null new action only reads the current one.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Handle the ending signals (SIGHUP, SIGINT, SIGTERM, SIGQUIT) on a
/// thread of their own (signal-hook's self-pipe; see the module comment
/// for what each one does), and watch the lab's own output. A SIGHUP that
/// was ignored when the lab started (`nohup`) stays ignored. The signals
/// stay unblocked: children inherit their parent's signal mask (std has
/// not reset it since Rust 1.66), and a lab that blocked them for
/// sigwait(2) started every workload, target and attach daemon deaf to the
/// SIGTERM meant to stop it. Call before any thread exists: the signals
/// are unblocked here in case whoever started the lab blocked them.
pub fn install_signal_handler() -> anyhow::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    let wanted: Vec<i32> = ENDING_SIGNALS.iter().map(|s| s.0).filter(|&s| s != libc::SIGHUP || !ignored(s)).collect();
    let mut set = SigSet::empty();
    for &s in &wanted {
        set.add(Signal::try_from(s)?);
    }
    set.thread_unblock()?;
    let mut signals = signal_hook::iterator::Signals::new(&wanted)?;
    std::thread::Builder::new().name("lab-signals".into()).spawn(move || {
        let mut count = 0;
        for sig in signals.forever() {
            count += 1;
            let (_, name, reason) = ENDING_SIGNALS.iter().copied().find(|s| s.0 == sig).unwrap_or((sig, "a signal", "interrupted"));
            let _ = STOP_SIGNAL.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
            let was = INTERRUPTED.swap(true, Ordering::SeqCst);
            if count > 1 || was {
                if FORCING.load(Ordering::SeqCst) {
                    // A third: nothing more is waited for.
                    say(&format!("lab: {name} again: exiting now"));
                    exit_listing_what_is_left();
                }
                std::thread::spawn(force_exit);
                continue;
            }
            set_reason(reason);
            say(&format!("\nlab: {name} received: stopping, saving partial results and cleaning up (again to force)"));
            first_stop();
        }
    })?;
    watch_outputs()?;
    Ok(())
}

fn set_reason(reason: &str) {
    let mut r = ABORT_REASON.lock().unwrap_or_else(|p| p.into_inner());
    if r.is_none() {
        *r = Some(reason.to_string());
    }
}

/// Where the lab's output goes once its terminal or pipe is gone (None:
/// /dev/null): the run's output directory, once it is known.
static AFTER_OUTPUT_LOST: Mutex<Option<PathBuf>> = Mutex::new(None);

/// What the lab says once its terminal or pipe is gone goes to `path`.
pub fn write_output_to_after_it_is_lost(path: PathBuf) {
    *AFTER_OUTPUT_LOST.lock().unwrap_or_else(|p| p.into_inner()) = Some(path);
}

/// Watch stdout and stderr (what SIGPIPE and SIGHUP stand for: the lab's
/// terminal closed, or whoever read its pipe, `| tee`, `| less`, exited):
/// when one of them breaks, what the lab still writes there goes to a file
/// instead (writes would fail, and `eprintln!` panics then), and the run
/// stops as on Ctrl-C. poll(2) with no events asked reports exactly that:
/// POLLHUP for a terminal hung up, POLLERR for a pipe without a reader;
/// a file or /dev/null never.
fn watch_outputs() -> anyhow::Result<()> {
    std::thread::Builder::new().name("lab-outputs".into()).spawn(|| {
        let mut fds: Vec<libc::pollfd> = [1, 2].iter().map(|&fd| libc::pollfd { fd, events: 0, revents: 0 }).collect();
        while !fds.is_empty() {
            // SAFETY: poll on our own array of descriptors.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            let mut lost = false;
            fds.retain(|p| {
                if p.revents & libc::POLLNVAL != 0 {
                    return false;
                }
                if p.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
                    redirect_lost_output(p.fd);
                    lost = true;
                    return false;
                }
                true
            });
            if lost && !INTERRUPTED.load(Ordering::SeqCst) {
                set_reason("interrupted: the lab's output went away (its terminal or the reader of its pipe)");
                say("\nlab: the output went away: stopping, saving partial results and cleaning up");
                first_stop();
            }
        }
    })?;
    Ok(())
}

/// Point `fd` (stdout or stderr, broken) at the file set for that, or /dev/null.
fn redirect_lost_output(fd: i32) {
    use std::os::unix::io::IntoRawFd;
    let to = AFTER_OUTPUT_LOST.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let file = to
        .and_then(|p| std::fs::OpenOptions::new().create(true).append(true).open(p).ok())
        .or_else(|| std::fs::OpenOptions::new().write(true).open("/dev/null").ok());
    if let Some(f) = file {
        let new = f.into_raw_fd();
        // SAFETY: dup2 of a descriptor we own over one of the standard ones.
        unsafe {
            libc::dup2(new, fd);
            libc::close(new);
        }
    }
}

/// What owners want done first when the run is forced to end (an ssh
/// master exiting then is no fault).
static FORCED_END_HOOKS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

/// Call `hook` first if the run is forced to end; registering it again
/// adds nothing.
pub fn before_forced_end(hook: fn()) {
    let mut hooks = FORCED_END_HOOKS.lock().unwrap_or_else(|p| p.into_inner());
    if !hooks.iter().any(|h| std::ptr::fn_addr_eq(*h, hook)) {
        hooks.push(hook);
    }
}

/// What the run wants done last when it is forced to end, given whether
/// everything was undone (this machine's state file kept or removed).
static AFTER_FORCED_END: Mutex<Option<fn(bool)>> = Mutex::new(None);

/// Call `hook(everything_undone)` just before a forced end exits.
pub fn after_forced_end(hook: fn(bool)) {
    *AFTER_FORCED_END.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
}

static FORCING: AtomicBool = AtomicBool::new(false);

/// The forced end: FUSE aborted, every process killed, then the ordered
/// cleanup for at most [`FORCED_CLEANUP`]; then what is left is listed and
/// the lab exits.
fn force_exit() {
    if FORCING.swap(true, Ordering::SeqCst) {
        return;
    }
    say("lab: forcing the end: aborting FUSE connections, killing every process, cleaning up");
    for hook in FORCED_END_HOOKS.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        hook();
    }
    let reg = registry();
    reg.emergency();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(registry().cleanup_all());
    });
    match rx.recv_timeout(FORCED_CLEANUP) {
        Ok(errors) => {
            for e in errors {
                say(&format!("lab: cleanup: {e}"));
            }
        }
        Err(_) => say(&format!("lab: the cleanup is not done after {} s", FORCED_CLEANUP.as_secs())),
    }
    exit_listing_what_is_left();
}

/// List what the registry still tracks, run the last hook, exit.
fn exit_listing_what_is_left() -> ! {
    let left = registry().tracked();
    if left.is_empty() {
        say("lab: cleaned up after interruption");
    } else {
        let what: Vec<String> = left.iter().map(Resource::describe).collect();
        say(&format!("lab: left behind ({}): {}", what.len(), what.join(", ")));
    }
    if let Some(hook) = *AFTER_FORCED_END.lock().unwrap_or_else(|p| p.into_inner()) {
        hook(left.is_empty());
    }
    let sig = STOP_SIGNAL.load(Ordering::SeqCst);
    std::process::exit(128 + if sig > 0 { sig } else { libc::SIGINT });
}

impl Resource {
    /// What it is, as a person reads it.
    pub fn describe(&self) -> String {
        match self {
            Resource::Child { pid, what, .. } => format!("process {pid} ({what})"),
            Resource::BlockwireMount { mountpoint, .. } => format!("blockwire mount {}", mountpoint.display()),
            Resource::Mount(mp) => format!("mount {}", mp.display()),
            Resource::Loop { dev, backing } => format!("loop device {dev} on {}", backing.display()),
            Resource::Cgroup(dir) => format!("cgroup {}", dir.display()),
            Resource::Dir(dir) => format!("directory {}", dir.display()),
            Resource::Netns(ns) => format!("namespace {ns}"),
            Resource::Veth { name, .. } => format!("link {name}"),
            Resource::Qdisc { dev, .. } => format!("qdisc on {dev}"),
            Resource::File(f) => format!("file {}", f.display()),
            Resource::Owned(o) => format!("{:?}", o.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_tracked_killed_and_files_removed() {
        let reg = Registry::new();
        let (_t, child) = reg
            .spawn(Command::new("sleep").arg("30"), "sleep", Role::Workload)
            .unwrap();
        let pid = child.id();
        assert!(alive(pid));
        let path = std::env::temp_dir().join(format!("bwlab-test-{}", std::process::id()));
        let (_f, ()) = reg
            .create(Resource::File(path.clone()), || {
                std::fs::write(&path, b"x")?;
                Ok(())
            })
            .unwrap();
        assert_eq!(reg.tracked().len(), 2);
        assert!(reg.cleanup_all().is_empty());
        assert!(!alive(pid), "child survived cleanup");
        assert!(!path.exists());
        assert!(reg.tracked().is_empty());
        drop(child);
    }

    /// An owner's undo, as the ssh hosts and kernel clients register
    /// theirs: run at the cleanup in order, and kept while it fails.
    #[test]
    fn owners_undo_what_they_registered() {
        use std::sync::atomic::AtomicUsize;
        use std::sync::Arc;
        #[derive(Debug)]
        struct Counted {
            runs: Arc<AtomicUsize>,
            fail_first: bool,
        }
        impl Undo for Counted {
            fn undo(&self) -> anyhow::Result<()> {
                let n = self.runs.fetch_add(1, Ordering::SeqCst);
                anyhow::ensure!(!(self.fail_first && n == 0), "not yet");
                Ok(())
            }
        }
        let reg = Registry::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let (t, ()) = reg.create(Resource::owned(Counted { runs: runs.clone(), fail_first: true }), || Ok(())).unwrap();
        assert!(reg.release(t).is_err());
        assert_eq!(reg.tracked().len(), 1, "a failed undo is kept for the final cleanup");
        assert!(reg.cleanup_all().is_empty());
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert!(reg.tracked().is_empty());
    }

    #[test]
    fn failed_creation_is_untracked_and_undone() {
        let reg = Registry::new();
        let path = std::env::temp_dir().join(format!("bwlab-test-fail-{}", std::process::id()));
        let r = reg.create(Resource::File(path.clone()), || -> anyhow::Result<()> {
            std::fs::write(&path, b"half")?;
            anyhow::bail!("creation failed halfway")
        });
        assert!(r.is_err());
        assert!(!path.exists(), "half-made resource left behind");
        assert!(reg.tracked().is_empty());
    }

    #[test]
    fn release_one_keeps_the_others() {
        let reg = Registry::new();
        let (t1, c1) = reg
            .spawn(Command::new("sleep").arg("30"), "one", Role::Service)
            .unwrap();
        let (_t2, c2) = reg
            .spawn(Command::new("sleep").arg("30"), "two", Role::Service)
            .unwrap();
        reg.release(t1).unwrap();
        assert!(!alive(c1.id()));
        assert!(alive(c2.id()));
        reg.cleanup_all();
        assert!(!alive(c2.id()));
    }

    #[test]
    fn the_first_ctrl_c_stops_workloads_not_services() {
        let reg = Registry::new();
        let (_a, w) = reg
            .spawn(Command::new("sleep").arg("30"), "bench", Role::Workload)
            .unwrap();
        let (_b, t) = reg
            .spawn(Command::new("sleep").arg("30"), "target", Role::Service)
            .unwrap();
        reg.term_workloads();
        assert!(wait_gone(&[w.id()], Duration::from_secs(5)), "the workload survived SIGTERM");
        assert!(
            alive(t.id()),
            "the target was stopped before the mounts on it were undone"
        );
        reg.cleanup_all();
        assert!(!alive(t.id()));
    }

    /// Children inherit their parent's signal mask (std stopped resetting
    /// it): a lab that blocked SIGINT/SIGTERM for itself started workloads
    /// and targets that never heard the SIGTERM meant to stop them.
    #[test]
    fn children_of_the_lab_hear_sigterm() {
        use nix::sys::signal::{SigSet, Signal};
        // As if whoever started the lab had blocked them.
        let mut set = SigSet::empty();
        set.add(Signal::SIGINT);
        set.add(Signal::SIGTERM);
        set.thread_block().unwrap();
        install_signal_handler().unwrap();
        let reg = Registry::new();
        let (_t, child) = reg
            .spawn(Command::new("sleep").arg("30"), "sleep", Role::Workload)
            .unwrap();
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
        let mask = |field: &str| {
            let hex = status.lines().find_map(|l| l.strip_prefix(field)).unwrap().trim();
            u64::from_str_radix(hex, 16).unwrap()
        };
        let int_term = (1 << (libc::SIGINT - 1)) | (1 << (libc::SIGTERM - 1));
        assert_eq!(mask("SigBlk:") & int_term, 0, "{status}");
        assert_eq!(mask("SigIgn:") & int_term, 0, "{status}");
        reg.term_workloads();
        assert!(wait_gone(&[child.id()], Duration::from_secs(2)), "SIGTERM did not end the workload");
        reg.cleanup_all();
    }

    #[test]
    fn a_failed_release_stays_tracked_for_the_final_cleanup() {
        let reg = Registry::new();
        let dir = std::env::temp_dir().join(format!("bwlab-test-busy-{}", std::process::id()));
        let (t, ()) = reg
            .create(Resource::Dir(dir.clone()), || Ok(std::fs::create_dir(&dir)?))
            .unwrap();
        // Not empty: removing it fails, and it is kept.
        std::fs::write(dir.join("x"), b"x").unwrap();
        assert!(reg.release(t).is_err());
        assert_eq!(reg.tracked(), vec![Resource::Dir(dir.clone())]);
        std::fs::remove_file(dir.join("x")).unwrap();
        assert!(reg.cleanup_all().is_empty());
        assert!(!dir.exists() && reg.tracked().is_empty());
    }

    #[test]
    fn creation_runs_without_the_lock_and_cleanup_waits_for_it() {
        let reg = std::sync::Arc::new(Registry::new());
        let path = std::env::temp_dir().join(format!("bwlab-test-slow-{}", std::process::id()));
        let (started_tx, started) = std::sync::mpsc::channel();
        let maker = {
            let (reg, path) = (reg.clone(), path.clone());
            std::thread::spawn(move || {
                reg.create(Resource::File(path.clone()), || {
                    started_tx.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(300));
                    Ok(std::fs::write(&path, b"x")?)
                })
                .unwrap();
            })
        };
        started.recv().unwrap();
        // The registry answers while the creation runs...
        assert_eq!(reg.tracked(), vec![Resource::File(path.clone())]);
        // ...and a cleanup waits for the creation instead of racing it.
        assert!(reg.cleanup_all().is_empty());
        maker.join().unwrap();
        assert!(!path.exists(), "created after the cleanup: leaked");
        assert!(reg.tracked().is_empty());
    }

    #[test]
    fn release_goes_newest_first() {
        // A file inside a directory: the directory only goes once the file is gone.
        let reg = Registry::new();
        let dir = std::env::temp_dir().join(format!("bwlab-test-order-{}", std::process::id()));
        let file = dir.join("x");
        reg.create(Resource::Dir(dir.clone()), || {
            Ok(std::fs::create_dir(&dir)?)
        })
        .unwrap();
        reg.create(Resource::File(file.clone()), || {
            Ok(std::fs::write(&file, b"x")?)
        })
        .unwrap();
        let errors = reg.cleanup_all();
        assert!(errors.is_empty(), "{errors:?}");
        assert!(!dir.exists());
    }

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    /// A mount and a loop device (root only): both gone after cleanup, and a
    /// loop number reused by someone else is left alone.
    #[test]
    fn mounts_and_loop_devices_are_undone() {
        if !root() {
            eprintln!("skipped: needs root");
            return;
        }
        let reg = Registry::new();
        let base = std::env::temp_dir().join(format!("bwlab-test-mnt-{}", std::process::id()));
        let mp = base.join("mp");
        std::fs::create_dir_all(&mp).unwrap();
        let s = mp.to_string_lossy().to_string();
        reg.create(Resource::Mount(mp.clone()), || {
            run_quiet(&["mount", "-t", "tmpfs", "-o", "size=1m", "bwlabtest", &s])
        })
        .unwrap();
        assert!(bw_attach::is_mountpoint(&mp));
        let img = base.join("img");
        std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&img)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        reg.create(
            Resource::Loop {
                dev: dev.clone(),
                backing: img.clone(),
            },
            || Ok(()),
        )
        .unwrap();
        assert_eq!(loop_backing(&dev).as_deref(), Some(img.as_path()));
        let errors = reg.cleanup_all();
        assert!(errors.is_empty(), "{errors:?}");
        assert!(!bw_attach::is_mountpoint(&mp), "still mounted");
        assert!(loop_backing(&dev).is_none(), "{dev} still attached");
        // A loop device that now backs another file is not ours to detach.
        assert!(release_resource(&Resource::Loop {
            dev: dev.clone(),
            backing: base.join("other")
        })
        .is_ok());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
