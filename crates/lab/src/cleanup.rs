//! Everything the lab creates on the machine is tracked here (namespaces,
//! veths, child processes, temporary files) so it is removed on success, on
//! error and on SIGINT/SIGTERM. Resources are registered while the registry
//! lock is held *during* their creation, so a signal arriving mid-creation
//! cannot slip between "created" and "tracked".

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    /// A child process, killed by PID (SIGTERM, then SIGKILL).
    Child { pid: u32, what: String },
    /// A network namespace (`ip netns add`, which also bind-mounts /run/netns/NAME).
    Netns(String),
    /// A veth end inside a namespace (`None`: the root namespace).
    Veth { ns: Option<String>, name: String },
    /// A root qdisc (tc tbf link shaping) on a device inside a namespace.
    Qdisc { ns: String, dev: String },
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
    REGISTRY.get_or_init(|| Registry { inner: Mutex::new(Inner::default()) })
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
    pub fn create<T>(&self, res: Resource, create: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(Token, T)> {
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

    /// Spawn `cmd` as a tracked child in its own process group (a Ctrl-C on
    /// the terminal reaches only the lab, which then stops children in order)
    /// with SIGKILL as its parent-death signal (a killed lab leaves no orphan).
    pub fn spawn(&self, cmd: &mut Command, what: &str) -> anyhow::Result<(Token, Child)> {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no Rust state.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut g = self.lock();
        if interrupted() {
            anyhow::bail!("interrupted");
        }
        let child = cmd.spawn().map_err(|e| anyhow::anyhow!("cannot start {what}: {e}"))?;
        let id = g.next;
        g.next += 1;
        g.items.push((id, Resource::Child { pid: child.id(), what: what.to_string() }));
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

    /// Release everything, newest first (children before the namespaces
    /// they live in). Returns the problems met, for the log.
    pub fn cleanup_all(&self) -> Vec<String> {
        let mut g = self.lock();
        let items: Vec<Resource> = g.items.drain(..).rev().map(|(_, r)| r).collect();
        // Keep the lock: nothing new may be created while tearing down.
        // Children first, all signalled at once, so their grace periods overlap.
        let mut errors = vec![];
        let pids: Vec<u32> = items
            .iter()
            .filter_map(|r| if let Resource::Child { pid, .. } = r { Some(*pid) } else { None })
            .collect();
        kill_all(&pids);
        for r in items.iter().filter(|r| !matches!(r, Resource::Child { .. })) {
            if let Err(e) = release_resource(r) {
                errors.push(format!("{r:?}: {e}"));
            }
        }
        drop(g);
        errors
    }

    pub fn tracked(&self) -> Vec<Resource> {
        self.lock().items.iter().map(|(_, r)| r.clone()).collect()
    }

    /// SIGTERM to every tracked child (first Ctrl-C: make running benches
    /// and targets end so the main loop notices and winds down).
    fn term_children(&self) {
        for (_, r) in self.lock().items.iter() {
            if let Resource::Child { pid, .. } = r {
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
        Ok(s) => s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')).unwrap_or(false),
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
        anyhow::bail!("{} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())
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
                Some(ns) => Command::new("ip").args(["-n", ns, "link", "show", name]).output()?.status.success(),
                None => Command::new("ip").args(["link", "show", name]).output()?.status.success(),
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
            if !Command::new("ip").args(["-n", ns, "link", "show", dev]).output()?.status.success() {
                return Ok(());
            }
            run_quiet(&["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"])
        }
        Resource::File(p) => match std::fs::remove_file(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        },
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
                registry().term_children();
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
        let reg = Registry { inner: Mutex::new(Inner::default()) };
        let (_t, child) = reg.spawn(Command::new("sleep").arg("30"), "sleep").unwrap();
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
        let reg = Registry { inner: Mutex::new(Inner::default()) };
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
        let reg = Registry { inner: Mutex::new(Inner::default()) };
        let (t1, c1) = reg.spawn(Command::new("sleep").arg("30"), "one").unwrap();
        let (_t2, c2) = reg.spawn(Command::new("sleep").arg("30"), "two").unwrap();
        reg.release(t1).unwrap();
        assert!(!alive(c1.id()));
        assert!(alive(c2.id()));
        reg.cleanup_all();
        assert!(!alive(c2.id()));
    }
}
