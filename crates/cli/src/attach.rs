//! `blockwire attach`, `mount` and `umount`: a remote volume as a file (FUSE),
//! a block device (loop with direct I/O) and a mounted file system.
//!
//! Each attach daemon records itself in `/run/blockwire/attach-PID.json`
//! (FUSE dir, loop device, mount point) so `umount` can undo it in order.

use crate::ClientArgs;
use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bw_attach::STATE_DIR;

#[derive(Args)]
pub struct AttachArgs {
    /// Target URL (see `blockwire verify --help`), or null://SIZE: a volume
    /// answered at once without network or storage, for measuring the FUSE
    /// and loop path itself.
    pub url: String,
    /// Empty directory to mount the FUSE file system on.
    pub dir: PathBuf,
    /// Name of the file that is the volume.
    #[arg(long = "file", default_value = "disk")]
    pub file: String,
    /// Refuse writes.
    #[arg(long)]
    pub readonly: bool,
    /// Also create a loop device (direct I/O) on the file and print it.
    #[arg(long = "loop")]
    pub make_loop: bool,
    /// Return once attached, leaving the daemon running.
    #[arg(long)]
    pub background: bool,
    /// How FUSE requests reach the daemon: `dev` (/dev/fuse), `uring` (FUSE
    /// over io_uring, needs /sys/module/fuse/parameters/enable_uring = Y) or
    /// `auto` (uring when the kernel allows it). The default is `dev`: it
    /// is as fast at 4 KiB and faster for large writes (crates/attach/README.md).
    #[arg(long, value_enum, default_value = "dev")]
    pub fuse: FuseTransport,
    /// Recorded for `blockwire umount` (set by `blockwire mount`).
    #[arg(long, hide = true)]
    pub mountpoint: Option<PathBuf>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum FuseTransport {
    Auto,
    Dev,
    Uring,
}

/// Ring entries per CPU queue: the deepest queue one CPU's requests reach
/// without waiting in the kernel (loop submits from one worker at a time).
const URING_PER_QUEUE: usize = 64;

fn transport(t: FuseTransport) -> anyhow::Result<bw_attach::Transport> {
    Ok(match t {
        FuseTransport::Dev => bw_attach::Transport::Dev,
        FuseTransport::Uring => bw_attach::Transport::Uring {
            per_queue: URING_PER_QUEUE,
        },
        FuseTransport::Auto if bw_attach::uring_enabled() => bw_attach::Transport::Uring {
            per_queue: URING_PER_QUEUE,
        },
        FuseTransport::Auto => bw_attach::Transport::Dev,
    })
}

#[derive(Args)]
pub struct MountArgs {
    /// Target URL (see `blockwire verify --help`).
    pub url: String,
    /// Directory to mount the file system on.
    pub mountpoint: PathBuf,
    /// Make a file system first (destroys what is on the volume).
    #[arg(long, value_parser = ["ext4", "xfs"])]
    pub mkfs: Option<String>,
    /// Mount options, passed to mount(8).
    #[arg(short = 'o', value_name = "OPTS")]
    pub options: Option<String>,
    #[arg(long)]
    pub readonly: bool,
    /// How FUSE requests reach the daemon (see `blockwire attach --help`).
    #[arg(long, value_enum, default_value = "dev")]
    pub fuse: FuseTransport,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Args)]
pub struct UmountArgs {
    /// Mount point of `blockwire mount`, or the directory of `blockwire attach`.
    pub target: PathBuf,
    /// Seconds to wait for the loop device to be let go by whoever else still
    /// holds it (a process with it open, or a copy of the mount in a mount
    /// namespace made while it was mounted); then fail and name them.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_LOOP_WAIT.as_secs())]
    pub wait: u64,
}

/// How long `umount` (and a failed `mount` undoing itself) waits for the
/// loop device by default.
const DEFAULT_LOOP_WAIT: Duration = Duration::from_secs(30);

fn require_root() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("must run as root (FUSE mount, loop devices)");
    }
    Ok(())
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    std::fs::canonicalize(p).with_context(|| format!("{}", p.display()))
}

fn state_path(pid: u32) -> PathBuf {
    Path::new(STATE_DIR).join(format!("attach-{pid}.json"))
}

fn run_tool(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        // One line for the user: tools append usage text after the reason.
        let reason = err
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        bail!(
            "{} failed: {}",
            cmd.get_program().to_string_lossy(),
            reason.trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub fn attach(a: AttachArgs) -> anyhow::Result<()> {
    require_root()?;
    bw_attach::check_file_name(&a.file)?;
    let dir = absolute(&a.dir)?;
    bw_attach::check_dir(&dir)?;
    if a.background {
        let (_, line) = spawn_daemon(&a, &dir)?;
        println!("{line}");
        return Ok(());
    }
    let io_flusher_warning = bw_attach::prepare_process()?;
    // The attach itself runs on its own thread (bw_attach::attach); this
    // runtime only waits for signals.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let fs_opts = bw_attach::AttachOptions {
        file_name: a.file.clone(),
        readonly: a.readonly,
        source: format!("blockwire:{}", bw_attach::redact(&a.url)),
        transport: transport(a.fuse)?,
    };
    // Catch SIGINT/SIGTERM before anything is mounted and before the ready
    // line: a caller may signal as soon as it reads that line, and the
    // default action would kill us with the FUSE mount left behind.
    let signals = {
        let _in_runtime = rt.enter();
        Signals::new()?
    };
    let attached = bw_attach::attach(&a.url, a.client.options(128), &dir, &fs_opts)?;
    if let Some(w) = io_flusher_warning {
        log::warn!("{w}");
    }
    let client = attached.client();
    let size = client.size_bytes();
    let file = dir.join(&a.file);
    let loop_dev = if a.make_loop {
        let mut cmd = Command::new("losetup");
        cmd.args(["--direct-io=on", "--find", "--show"]);
        if a.readonly {
            cmd.arg("--read-only");
        }
        match run_tool(cmd.arg(&file)) {
            Ok(dev) => Some(dev),
            Err(e) => {
                let _ = unmount_fuse(&dir);
                let _ = attached.join();
                return Err(e);
            }
        }
    } else {
        None
    };
    std::fs::create_dir_all(STATE_DIR)?;
    let state = json!({
        "pid": std::process::id(), "start": process_start(std::process::id()),
        "url": bw_attach::redact(&a.url), "dir": dir, "file": file,
        "loop": loop_dev, "mountpoint": a.mountpoint,
    });
    std::fs::write(state_path(std::process::id()), state.to_string())?;
    let state = state.clone();
    let mut line = format!(
        "attached {} at {} ({size} bytes)",
        bw_attach::redact(&a.url),
        file.display()
    );
    if let Some(l) = &loop_dev {
        line.push_str(&format!(" loop {l}"));
    }
    println!("{line}");
    std::io::stdout().flush()?;

    let state_file = state_path(std::process::id());
    let r = rt.block_on(async {
        tokio::select! {
            r = wait_and_detach(signals, &dir, loop_dev.as_deref(), client.clone()) => r,
            _ = record_health(&attached, &state_file, state) => unreachable!("record_health never returns"),
        }
    });
    let _ = std::fs::remove_file(&state_file);
    // After a forced detach the serving thread may still wait on the
    // target (requests already sent); the process exits without it.
    if r? {
        let _ = attached.join();
    }
    Ok(())
}

/// Keep `"target": "reachable" | "unreachable"` in the state file current,
/// so `blockwire umount` knows when waiting for the target is pointless.
async fn record_health(attached: &bw_attach::Attached, path: &Path, mut state: Value) {
    let mut last = true;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = attached.target_reachable();
        if now != last {
            last = now;
            state["target"] = json!(if now { "reachable" } else { "unreachable" });
            let _ = std::fs::write(path, state.to_string());
        }
    }
}

/// SIGINT and SIGTERM, registered with the runtime (from then on they no
/// longer kill the process).
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    /// Needs a runtime context (`Runtime::enter`).
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }
}

/// Serve until SIGINT/SIGTERM; then detach the loop device, flush and
/// unmount. If the file system is busy, keep serving; a second signal
/// (also while the flush waits for a dead target) forces: the FUSE
/// connection is aborted, so every waiting request fails, and the mount is
/// detached lazily.
async fn wait_and_detach(
    Signals { mut int, mut term }: Signals,
    dir: &Path,
    loop_dev: Option<&str>,
    client: Arc<dyn bw_initiator::BlockClient>,
) -> anyhow::Result<bool> {
    let (tx, mut signals) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            if tx.send(()).is_err() {
                return;
            }
        }
    });
    signals.recv().await;
    let graceful = async {
        if let Some(l) = loop_dev.filter(|l| loop_backs(l, dir)) {
            // Sets autoclear if the loop device is still open (mounted).
            let _ = run_tool(Command::new("losetup").args(["-d", l]));
            wait_loop_released(l, Duration::from_secs(5));
        }
        if let Err(e) = client.flush().await {
            log::warn!("flush before detaching: {e}");
        }
        unmount_fuse(dir)
    };
    tokio::select! {
        r = graceful => match r {
            Ok(()) => {
                // The serving thread logs out as it ends (the caller joins it):
                // the connection lives on its runtime.
                eprintln!("blockwire: flushed and detached {}", dir.display());
                return Ok(true);
            }
            Err(e) => {
                eprintln!("blockwire: {}: {e}; still attached (signal again to force)", dir.display());
                signals.recv().await;
            }
        },
        _ = signals.recv() => {}
    }
    // Second signal.
    eprintln!(
        "blockwire: second signal: aborting the FUSE connection at {}",
        dir.display()
    );
    let _ = bw_attach::abort_connection(dir);
    lazy_unmount(dir);
    Ok(false)
}

fn cpath(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

/// Unmount (not lazily: a busy file system says so instead of lingering).
fn unmount_fuse(dir: &Path) -> std::io::Result<()> {
    let c = cpath(dir);
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn lazy_unmount(dir: &Path) {
    let c = cpath(dir);
    // SAFETY: c is a valid NUL-terminated path.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

/// Whether `dev` is still the loop device on a file under `dir` (loop
/// numbers are reused: never detach someone else's).
fn loop_backs(dev: &str, dir: &Path) -> bool {
    let name = dev.trim_start_matches("/dev/");
    std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .is_ok_and(|f| Path::new(f.trim()).starts_with(dir))
}

/// Detach loop device `dev` from our file under `dir`, waiting up to
/// `limit` for anyone else to let go of it. LOOP_CLR_FD on a device that is
/// still open only marks it to detach on its last close; it is asked again
/// each second in case an earlier request failed (never once the number
/// backs someone else's file).
fn detach_loop(dev: &str, dir: &Path, limit: Duration) -> bool {
    let t0 = Instant::now();
    while loop_backs(dev, dir) {
        let _ = run_tool(Command::new("losetup").args(["-d", dev]));
        let left = limit.saturating_sub(t0.elapsed());
        if wait_loop_released(dev, left.min(Duration::from_secs(1))) {
            return true;
        }
        if t0.elapsed() >= limit {
            return !loop_backs(dev, dir);
        }
    }
    true
}

/// Who keeps loop device `dev` open, for the error message: processes with
/// it open, and mount namespaces where a file system on it is still mounted
/// (a namespace copied from ours while it was mounted keeps its own copy of
/// the mount when the parent mount does not propagate unmounts).
fn loop_holders(dev: &str) -> String {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(meta) = std::fs::metadata(dev) else {
        return String::new();
    };
    if !meta.file_type().is_block_device() {
        return String::new();
    }
    let rdev = meta.rdev();
    let dev_no = format!("{}:{}", libc::major(rdev), libc::minor(rdev));
    let comm = |pid: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim().to_string()).unwrap_or_default()
    };
    let mut open_by = vec![];
    let mut namespaces: Vec<(String, String)> = vec![];
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return String::new();
    };
    for p in procs.flatten() {
        let pid = p.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let has_open = std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == Path::new(dev)))
        });
        if has_open {
            open_by.push(format!("{pid} ({})", comm(&pid)));
        }
        let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/mnt")) else {
            continue;
        };
        let ns = ns.to_string_lossy().to_string();
        if namespaces.iter().any(|(n, _)| *n == ns) {
            continue;
        }
        let mounted = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
            .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(2) == Some(&dev_no)));
        if mounted {
            namespaces.push((ns, format!("{pid} ({})", comm(&pid))));
        }
    }
    let mut parts = vec![];
    if !open_by.is_empty() {
        parts.push(format!("open by PID {}", open_by.join(", ")));
    }
    if !namespaces.is_empty() {
        let pids: Vec<&str> = namespaces.iter().map(|(_, p)| p.as_str()).collect();
        parts.push(format!("mounted in the mount namespace of PID {}", pids.join(", ")));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join("; "))
    }
}

/// Wait until the loop device no longer holds a backing file.
fn wait_loop_released(dev: &str, limit: Duration) -> bool {
    let name = dev.trim_start_matches("/dev/");
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if !Path::new(&format!("/sys/block/{name}/loop/backing_file")).exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Start `blockwire attach` without --background in its own session and wait
/// for its ready line; its log goes to /run/blockwire/attach-PID.log.
fn spawn_daemon(a: &AttachArgs, dir: &Path) -> anyhow::Result<(Value, String)> {
    std::fs::create_dir_all(STATE_DIR)?;
    let log_tmp = Path::new(STATE_DIR).join(format!("attach-starting-{}.log", std::process::id()));
    let log = std::fs::File::create(&log_tmp)?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("attach")
        .arg(&a.url)
        .arg(dir)
        .arg("--file")
        .arg(&a.file);
    if a.readonly {
        cmd.arg("--readonly");
    }
    if a.make_loop {
        cmd.arg("--loop");
    }
    cmd.arg("--fuse")
        .arg(format!("{:?}", a.fuse).to_lowercase());
    if let Some(m) = &a.mountpoint {
        cmd.arg("--mountpoint").arg(m);
    }
    let c = &a.client;
    cmd.args([
        "--queues",
        &c.queues.to_string(),
        "--timeout",
        &c.timeout.to_string(),
        "--threads",
        &c.threads.to_string(),
    ]);
    if let Some(n) = &c.initiator_name {
        cmd.args(["--initiator-name", n]);
    }
    if c.header_digest {
        cmd.arg("--header-digest");
    }
    if c.data_digest {
        cmd.arg("--data-digest");
    }
    cmd.args(["--tcp-congestion", &c.tcp_congestion.to_string()]);
    // Secrets go through the environment, not the daemon's visible arguments.
    for (var, v) in [("BLOCKWIRE_DHCHAP_SECRET", &c.dhchap_secret), ("BLOCKWIRE_DHCHAP_CTRL_SECRET", &c.dhchap_ctrl_secret)] {
        match v {
            Some(s) => cmd.env(var, s),
            None => cmd.env_remove(var),
        };
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
    // The daemon must not die with our terminal (setsid), and must hear the
    // SIGTERM of `blockwire umount` even when our caller blocks signals
    // (children inherit the signal mask).
    // SAFETY: setsid, sigemptyset and sigprocmask are async-signal-safe and
    // touch only the local set.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the attach daemon")?;
    let pid = child.id();
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    let log_path = Path::new(STATE_DIR).join(format!("attach-{pid}.log"));
    let _ = std::fs::rename(&log_tmp, &log_path);
    if !line.starts_with("attached ") {
        let _ = child.wait();
        let msg = std::fs::read_to_string(&log_path).unwrap_or_default();
        let _ = std::fs::remove_file(&log_path);
        let last = msg
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("the attach daemon exited");
        bail!("{}", last.trim_start_matches("blockwire: error: "));
    }
    let state: Value = serde_json::from_str(&std::fs::read_to_string(state_path(pid))?)?;
    Ok((state, line.trim().to_string()))
}

pub fn mount(a: MountArgs) -> anyhow::Result<()> {
    require_root()?;
    let mp = absolute(&a.mountpoint)?;
    if !mp.is_dir() {
        bail!("{}: not a directory", mp.display());
    }
    if bw_attach::is_mountpoint(&mp) {
        bail!("{}: already a mount point", mp.display());
    }
    let fuse_dir = bw_attach::mount_fuse_dir(&mp);
    std::fs::create_dir_all(&fuse_dir)?;
    let attach_args = AttachArgs {
        url: a.url.clone(),
        dir: fuse_dir.clone(),
        file: "disk".into(),
        readonly: a.readonly,
        make_loop: true,
        background: true,
        fuse: a.fuse,
        mountpoint: Some(mp.clone()),
        client: a.client.clone(),
    };
    let (state, _) = spawn_daemon(&attach_args, &fuse_dir).inspect_err(|_| {
        let _ = std::fs::remove_dir(&fuse_dir);
    })?;
    let dev = state["loop"].as_str().unwrap_or_default().to_string();
    let finish = || -> anyhow::Result<()> {
        match a.mkfs.as_deref() {
            Some("ext4") => run_tool(Command::new("mkfs.ext4").args(["-q", "-F", &dev]))?,
            Some("xfs") => run_tool(Command::new("mkfs.xfs").args(["-q", "-f", &dev]))?,
            _ => String::new(),
        };
        let mut cmd = Command::new("mount");
        if let Some(o) = &a.options {
            cmd.args(["-o", o]);
        }
        if a.readonly {
            cmd.arg("-r");
        }
        run_tool(cmd.arg(&dev).arg(&mp))?;
        Ok(())
    };
    if let Err(e) = finish() {
        let _ = undo(&state, &mp, DEFAULT_LOOP_WAIT);
        return Err(e);
    }
    println!(
        "mounted {} on {} ({dev})",
        bw_attach::redact(&a.url),
        mp.display()
    );
    Ok(())
}

/// umount(8) the file system on the loop device. Its last writes may wait
/// for the target; if the attach daemon finds the target unreachable
/// meanwhile (after at most its --timeout), the FUSE connection is aborted
/// so those writes fail at once and the unmount completes.
fn unmount_fs(mp: &Path, fuse_dir: &Path, pid: u32) -> anyhow::Result<()> {
    let mut child = Command::new("umount")
        .arg(mp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running umount")?;
    let mut aborted = false;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        let down = std::fs::read_to_string(state_path(pid))
            .ok()
            .and_then(|s| serde_json::from_str::<Value>(&s).ok())
            .is_some_and(|s| s["target"] == "unreachable");
        if down && !aborted && bw_attach::is_mountpoint(fuse_dir) {
            eprintln!(
                "blockwire: the target is unreachable; dropping writes it has not acknowledged"
            );
            let _ = bw_attach::abort_connection(fuse_dir);
            aborted = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        bail!(
            "umount failed: {}",
            err.lines().next().unwrap_or("no message").trim()
        );
    }
    Ok(())
}

fn all_states() -> Vec<Value> {
    let Ok(rd) = std::fs::read_dir(STATE_DIR) else {
        return vec![];
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| serde_json::from_str(&std::fs::read_to_string(e.path()).ok()?).ok())
        .collect()
}

/// The attach daemon a state file names, held by a pidfd: signals reach
/// that process, never one that got its PID after it ended (state files
/// outlive daemons that were killed).
struct Daemon {
    pidfd: std::os::fd::OwnedFd,
}

impl Daemon {
    /// The daemon a state file records, if the process with its PID still
    /// is that daemon: owned by root and started at the recorded time (state
    /// files without one: running `blockwire attach` with `dir` among its
    /// arguments).
    fn find(state: &Value, dir: &Path) -> Option<Daemon> {
        use std::os::fd::FromRawFd;
        let pid = state["pid"].as_i64().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        if pid <= 0 {
            return None;
        }
        // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd is a descriptor we just opened and own.
        let d = Daemon { pidfd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) } };
        let looks_right = is_root_owned(pid)
            && match state["start"].as_u64() {
                Some(start) => process_start(pid as u32) == Some(start),
                None => runs_attach_of(pid, dir),
            };
        // Alive after /proc was read: the PID was not reused in between,
        // so what was read describes the process the pidfd holds.
        (looks_right && d.signal(0)).then_some(d)
    }

    /// Whether the signal was sent (false once the process has ended).
    fn signal(&self, sig: i32) -> bool {
        use std::os::fd::AsRawFd;
        // SAFETY: pidfd_send_signal with a null siginfo sends `sig` as kill(2) would.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            ) == 0
        }
    }

    /// Wait up to `limit` for the process to end (a zombie has ended).
    fn wait_exit(&self, limit: Duration) -> bool {
        use std::os::fd::AsRawFd;
        let mut p = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let t0 = Instant::now();
        loop {
            let left = limit.saturating_sub(t0.elapsed());
            // SAFETY: one valid pollfd; a pidfd polls readable once the process exits.
            let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            if n > 0 {
                return true;
            }
            let interrupted = n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
            if !interrupted || t0.elapsed() >= limit {
                return false;
            }
        }
    }
}

fn is_root_owned(pid: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == 0)
}

/// When process `pid` started, in clock ticks after boot (/proc/PID/stat
/// field 22): with the PID, it names one process for as long as the system runs.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the parenthesised command name start at field 3.
    stat.rsplit_once(") ")?.1.split(' ').nth(22 - 3)?.parse().ok()
}

/// Whether process `pid` runs `blockwire attach` with `dir` among its arguments.
fn runs_attach_of(pid: i32, dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    args.get(1) == Some(&&b"attach"[..]) && args.contains(&dir.as_os_str().as_bytes())
}

pub fn umount(a: UmountArgs) -> anyhow::Result<()> {
    require_root()?;
    let target = std::fs::canonicalize(&a.target).unwrap_or(a.target.clone());
    let matches = |s: &Value, k: &str| s[k].as_str().is_some_and(|p| Path::new(p) == target);
    let Some(state) = all_states()
        .into_iter()
        .find(|s| matches(s, "mountpoint") || matches(s, "dir"))
    else {
        println!("nothing attached at {}", target.display());
        return Ok(());
    };
    undo(&state, &target, Duration::from_secs(a.wait))?;
    println!("detached {}", target.display());
    Ok(())
}

/// Undo an attach (and its mount) in order: file system, loop device, FUSE,
/// daemon. `loop_wait` bounds the wait for others to let go of the loop device.
fn undo(state: &Value, shown: &Path, loop_wait: Duration) -> anyhow::Result<()> {
    let dir = PathBuf::from(state["dir"].as_str().unwrap_or_default());
    if let Some(mp) = state["mountpoint"].as_str().map(Path::new) {
        if bw_attach::is_mountpoint(mp) {
            unmount_fs(mp, &dir, state["pid"].as_i64().unwrap_or(0) as u32)
                .with_context(|| format!("{}: still mounted", shown.display()))?;
        }
    }
    if let Some(dev) = state["loop"].as_str().filter(|l| loop_backs(l, &dir)) {
        if !detach_loop(dev, &dir, loop_wait) {
            bail!(
                "{dev} is still in use{} after {} s; not detaching {} (try again later, or give umount a longer --wait)",
                loop_holders(dev),
                loop_wait.as_secs(),
                shown.display()
            );
        }
    }
    let pid = state["pid"].as_i64().unwrap_or(0) as i32;
    let daemon = Daemon::find(state, &dir);
    if let Some(d) = &daemon {
        // The daemon flushes and unmounts on SIGTERM; a dead target makes its
        // flush fail after its timeout, so allow a little longer than that.
        if d.signal(libc::SIGTERM) {
            d.wait_exit(Duration::from_secs(5));
        }
    }
    if bw_attach::is_mountpoint(&dir) {
        // Daemon gone or stuck: fail every pending request, then unmount.
        let _ = bw_attach::abort_connection(&dir);
        lazy_unmount(&dir);
    }
    if let Some(d) = &daemon {
        if d.signal(libc::SIGKILL) {
            d.wait_exit(Duration::from_secs(5));
        }
    }
    let _ = std::fs::remove_file(state_path(pid as u32));
    let _ = std::fs::remove_file(Path::new(STATE_DIR).join(format!("attach-{pid}.log")));
    if dir.starts_with(Path::new(STATE_DIR).join("fuse")) {
        let _ = std::fs::remove_dir(&dir);
    }
    Ok(())
}
