//! Everything the lab creates on the machine is tracked here (namespaces,
//! veths, qdiscs, child processes, mounts with their loop devices and FUSE
//! connections, memory cgroups, temporary files and directories) so it is
//! removed on success, on error and on SIGINT/SIGTERM. Resources are
//! registered while the registry lock is held *during* their creation, so a
//! signal arriving mid-creation cannot slip between "created" and "tracked".
//!
//! Release goes newest first, so what stands on something goes before it:
//! a workload before its cgroup and its mount, a mount before the target
//! that serves it, processes before their namespace.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token(u64);

#[derive(Default)]
struct Inner {
    next: u64,
    items: Vec<(u64, Resource)>,
}

pub struct Registry {
    inner: Mutex<Inner>,
}

static REGISTRY: OnceLock<Registry> = OnceLock::new();
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

pub fn registry() -> &'static Registry {
    REGISTRY.get_or_init(|| Registry {
        inner: Mutex::new(Inner::default()),
    })
}

/// Set once SIGINT or SIGTERM arrived; long loops check it between runs.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Track `res`, then run `create` with the lock held. If creation fails
    /// the resource is cleaned (it may be half-made) and untracked.
    pub fn create<T>(
        &self,
        res: Resource,
        create: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<(Token, T)> {
        let mut g = self.lock();
        if interrupted() {
            anyhow::bail!("interrupted");
        }
        let id = g.next;
        g.next += 1;
        g.items.push((id, res.clone()));
        match create() {
            Ok(v) => Ok((Token(id), v)),
            Err(e) => {
                g.items.retain(|(i, _)| *i != id);
                drop(g);
                let _ = release_resource(&res);
                Err(e)
            }
        }
    }

    /// Create something whose identity is only known once it exists (a loop
    /// device's number): `create` makes it and names it, under the lock, so
    /// a signal cannot fall between the two.
    pub fn create_tracked<T>(
        &self,
        create: impl FnOnce() -> anyhow::Result<(Resource, T)>,
    ) -> anyhow::Result<(Token, T)> {
        let mut g = self.lock();
        if interrupted() {
            anyhow::bail!("interrupted");
        }
        let (res, v) = create()?;
        let id = g.next;
        g.next += 1;
        g.items.push((id, res));
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
        let id = g.next;
        g.next += 1;
        g.items.push((
            id,
            Resource::Child {
                pid: child.id(),
                what: what.to_string(),
                role,
            },
        ));
        Ok((Token(id), child))
    }

    /// Stop tracking (the owner released the resource itself).
    pub fn forget(&self, t: Token) {
        self.lock().items.retain(|(i, _)| *i != t.0);
    }

    /// Release one resource now and stop tracking it.
    pub fn release(&self, t: Token) -> anyhow::Result<()> {
        let res = {
            let mut g = self.lock();
            let pos = g.items.iter().position(|(i, _)| *i == t.0);
            pos.map(|p| g.items.remove(p).1)
        };
        match res {
            Some(r) => release_resource(&r),
            None => Ok(()),
        }
    }

    /// Release everything, newest first (see the module comment). Children
    /// next to each other in that order are signalled together, so their
    /// grace periods overlap. Returns the problems met, for the log.
    pub fn cleanup_all(&self) -> Vec<String> {
        let mut g = self.lock();
        let items: Vec<Resource> = g.items.drain(..).rev().map(|(_, r)| r).collect();
        // Keep the lock: nothing new may be created while tearing down.
        let mut errors = vec![];
        let mut i = 0;
        while i < items.len() {
            let mut pids = vec![];
            while let Some(Resource::Child { pid, .. }) = items.get(i) {
                pids.push(*pid);
                i += 1;
            }
            if !pids.is_empty() {
                kill_all(&pids);
                continue;
            }
            if let Err(e) = release_resource(&items[i]) {
                errors.push(format!("{:?}: {e}", items[i]));
            }
            i += 1;
        }
        drop(g);
        errors
    }

    pub fn tracked(&self) -> Vec<Resource> {
        self.lock().items.iter().map(|(_, r)| r.clone()).collect()
    }

    /// SIGTERM to every tracked workload (first Ctrl-C: the running bench
    /// or workload ends, the main loop notices and winds down; targets keep
    /// serving until the mounts on them are undone).
    fn term_workloads(&self) {
        for (_, r) in self.lock().items.iter() {
            if let Resource::Child {
                pid,
                role: Role::Workload,
                ..
            } = r
            {
                signal(*pid, libc::SIGTERM);
            }
        }
    }
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
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && pids.iter().any(|&p| alive(p)) {
        reap(pids);
        std::thread::sleep(Duration::from_millis(20));
    }
    for &p in pids {
        if alive(p) {
            signal(p, libc::SIGKILL);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && pids.iter().any(|&p| alive(p)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    reap(pids);
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
            run_quiet(&["losetup", "-d", dev])
        }
        Resource::Cgroup(dir) => release_cgroup(dir),
    }
}

/// Is `path` a mount point now (in /proc/self/mounts)?
pub fn is_mounted(path: &std::path::Path) -> bool {
    let Ok(m) = std::fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    let want = path.to_string_lossy();
    // Octal escapes (\040 for a space) are how /proc shows odd names; ours have none.
    m.lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&*want))
}

/// Unmount; a file system kept busy by a process that is being killed gets
/// a few tries, then a lazy unmount so the run can still finish.
fn unmount(mp: &std::path::Path) -> anyhow::Result<()> {
    let s = mp.to_string_lossy();
    for _ in 0..10 {
        if !is_mounted(mp) {
            return Ok(());
        }
        if run_quiet(&["umount", &s]).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    run_quiet(&["umount", "-l", &s])
}

/// `blockwire umount` undoes the file system, loop device, FUSE connection
/// and attach daemon in order (and aborts the FUSE connection if the daemon
/// is stuck). A busy file system gets a few tries.
fn release_blockwire_mount(exe: &std::path::Path, mp: &std::path::Path) -> anyhow::Result<()> {
    let mut last = String::new();
    for _ in 0..5 {
        let out = Command::new(exe).arg("umount").arg(mp).output()?;
        if out.status.success() && !is_mounted(mp) {
            return Ok(());
        }
        last = String::from_utf8_lossy(&out.stderr).trim().to_string();
        std::thread::sleep(Duration::from_millis(300));
    }
    anyhow::bail!("blockwire umount {}: {last}", mp.display())
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

/// Block SIGINT/SIGTERM in this (main) thread and every thread it starts
/// later, and handle them on a dedicated thread instead: the first signal
/// stops the children and lets the main loop save what it has and clean up;
/// a second one, or a main loop stuck for 20 s, cleans up and exits at once.
/// Children get an empty signal mask back (std resets it before exec).
pub fn install_signal_handler() -> anyhow::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block()?;
    std::thread::Builder::new().name("lab-signals".into()).spawn(move || {
        let mut count = 0;
        loop {
            let Ok(sig) = set.wait() else { continue };
            count += 1;
            INTERRUPTED.store(true, Ordering::SeqCst);
            if count == 1 {
                eprintln!("\nlab: {sig:?} received: stopping, saving partial results and cleaning up (again to force)");
                registry().term_workloads();
                std::thread::spawn(|| {
                    std::thread::sleep(Duration::from_secs(20));
                    force_exit();
                });
            } else {
                force_exit();
            }
        }
    })?;
    Ok(())
}

fn force_exit() -> ! {
    for e in registry().cleanup_all() {
        eprintln!("lab: cleanup: {e}");
    }
    eprintln!("lab: cleaned up after interruption");
    std::process::exit(130);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_tracked_killed_and_files_removed() {
        let reg = Registry {
            inner: Mutex::new(Inner::default()),
        };
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

    #[test]
    fn failed_creation_is_untracked_and_undone() {
        let reg = Registry {
            inner: Mutex::new(Inner::default()),
        };
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
        let reg = Registry {
            inner: Mutex::new(Inner::default()),
        };
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
        let reg = Registry {
            inner: Mutex::new(Inner::default()),
        };
        let (_a, w) = reg
            .spawn(Command::new("sleep").arg("30"), "bench", Role::Workload)
            .unwrap();
        let (_b, t) = reg
            .spawn(Command::new("sleep").arg("30"), "target", Role::Service)
            .unwrap();
        reg.term_workloads();
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(w.id()) && Instant::now() < deadline {
            reap(&[w.id()]);
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(w.id()), "the workload survived SIGTERM");
        assert!(
            alive(t.id()),
            "the target was stopped before the mounts on it were undone"
        );
        reg.cleanup_all();
        assert!(!alive(t.id()));
    }

    #[test]
    fn release_goes_newest_first() {
        // A file inside a directory: the directory only goes once the file is gone.
        let reg = Registry {
            inner: Mutex::new(Inner::default()),
        };
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
        let reg = Registry {
            inner: Mutex::new(Inner::default()),
        };
        let base = std::env::temp_dir().join(format!("bwlab-test-mnt-{}", std::process::id()));
        let mp = base.join("mp");
        std::fs::create_dir_all(&mp).unwrap();
        let s = mp.to_string_lossy().to_string();
        reg.create(Resource::Mount(mp.clone()), || {
            run_quiet(&["mount", "-t", "tmpfs", "-o", "size=1m", "bwlabtest", &s])
        })
        .unwrap();
        assert!(is_mounted(&mp));
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
        assert!(!is_mounted(&mp), "still mounted");
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
