//! The attach daemon: attach, make the loop device, record the state file,
//! serve until SIGINT/SIGTERM, then undo its own part (loop device, flush,
//! FUSE). `spawn` starts one in the background and waits until it is ready.

use crate::loop_device;
use crate::mount::{lazy_unmount, unmount_fuse};
use crate::process::process_start;
use crate::state::{log_path, state_path, AttachState, TargetHealth, STATE_DIR};
use crate::{AttachOptions, Attached};
use anyhow::{bail, Context};
use bw_initiator::{BlockClient, ConnectOptions};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What one daemon attaches, and how.
pub struct DaemonOptions {
    /// Target URL (may hold a secret: only its `redact`ed form is stored).
    pub url: String,
    pub connect: ConnectOptions,
    /// The FUSE directory: empty, absolute, without symlinks.
    pub dir: PathBuf,
    pub fs: AttachOptions,
    /// Also make a loop device on the file.
    pub make_loop: bool,
    /// Recorded for `umount` when `mount` started this daemon.
    pub mountpoint: Option<PathBuf>,
}

/// An attached daemon, its state file written, not yet serving signals.
pub struct Running {
    rt: tokio::runtime::Runtime,
    signals: Signals,
    attached: Attached,
    state: AttachState,
}

/// The ready line starts with this; `spawn` waits for it.
const READY: &str = "attached ";

/// Attach as `opts` says and write the state file. The caller prints
/// `ready_line`, then calls `serve_until_signalled`.
pub fn start(opts: DaemonOptions) -> anyhow::Result<Running> {
    let io_flusher_warning = crate::prepare_process()?;
    // The attach itself runs on its own thread (crate::attach); this
    // runtime only waits for signals.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Catch SIGINT/SIGTERM before anything is mounted and before the ready
    // line: a caller may signal as soon as it reads that line, and the
    // default action would kill us with the FUSE mount left behind.
    let signals = {
        let _in_runtime = rt.enter();
        Signals::new()?
    };
    let attached = crate::attach(&opts.url, opts.connect, &opts.dir, &opts.fs)?;
    if let Some(w) = io_flusher_warning {
        log::warn!("{w}");
    }
    let file = opts.dir.join(&opts.fs.file_name);
    let loop_dev = if opts.make_loop {
        match loop_device::create(&file, opts.fs.readonly) {
            Ok(dev) => Some(dev),
            Err(e) => {
                let _ = unmount_fuse(&opts.dir);
                let _ = attached.join();
                return Err(e);
            }
        }
    } else {
        None
    };
    let pid = std::process::id();
    let state = AttachState {
        pid,
        start: process_start(pid),
        url: crate::redact(&opts.url),
        dir: opts.dir,
        file,
        loop_dev,
        mountpoint: opts.mountpoint,
        target: None,
    };
    state.write()?;
    Ok(Running {
        rt,
        signals,
        attached,
        state,
    })
}

impl Running {
    pub fn state(&self) -> &AttachState {
        &self.state
    }

    /// `attached URL at FILE (SIZE bytes)[ loop DEV]`: what the daemon
    /// prints once the volume is usable (`spawn` waits for it).
    pub fn ready_line(&self) -> String {
        let s = &self.state;
        let size = self.attached.client().size_bytes();
        let mut line = format!("{READY}{} at {} ({size} bytes)", s.url, s.file.display());
        if let Some(l) = &s.loop_dev {
            line.push_str(&format!(" loop {l}"));
        }
        line
    }

    /// Serve until SIGINT/SIGTERM, keeping the state file's `target`
    /// current; then detach (see `wait_and_detach`) and remove the state file.
    pub fn serve_until_signalled(self) -> anyhow::Result<()> {
        let Running {
            rt,
            signals,
            attached,
            state,
        } = self;
        let client = attached.client();
        let r = rt.block_on(async {
            tokio::select! {
                r = wait_and_detach(signals, &state.dir, state.loop_dev.as_deref(), client) => r,
                _ = record_health(&attached, state.clone()) => unreachable!("record_health never returns"),
            }
        });
        let _ = std::fs::remove_file(state.path());
        // After a forced detach the serving thread may still wait on the
        // target (requests already sent); the process exits without it.
        if r? {
            let _ = attached.join();
        }
        Ok(())
    }
}

/// Keep `target` in the state file current, so `umount` knows when waiting
/// for the target is pointless.
async fn record_health(attached: &Attached, mut state: AttachState) {
    let mut last = true;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = attached.target_reachable();
        if now != last {
            last = now;
            state.target = Some(if now {
                TargetHealth::Reachable
            } else {
                TargetHealth::Unreachable
            });
            let _ = state.write();
        }
    }
}

/// SIGINT and SIGTERM, each delivery counted (from then on they no longer
/// kill the process). tokio's signal streams coalesce deliveries the
/// runtime has not read yet: a second Ctrl-C whose handler ran before the
/// runtime's thread got to read the first (which takes tens of ms on a
/// busy machine) woke it once, and the second signal, the one that forces,
/// was lost. So the signal handler itself counts each delivery, and the
/// streams only wake us to read the counts. (A signal sent while the same
/// one is still pending in the kernel is merged there, as POSIX has it:
/// no process can count that one.)
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    /// Deliveries of SIGINT and SIGTERM so far (in `NAMES` order).
    counts: Arc<[AtomicUsize; 2]>,
    /// Deliveries already returned by `next`.
    seen: [usize; 2],
}

impl Signals {
    const NAMES: [&'static str; 2] = ["SIGINT", "SIGTERM"];

    /// Needs a runtime context (`Runtime::enter`).
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let counts: Arc<[AtomicUsize; 2]> = Arc::default();
        for (i, sig) in [libc::SIGINT, libc::SIGTERM].into_iter().enumerate() {
            let c = counts.clone();
            // Registered before tokio's handler, so it runs first: when the
            // runtime wakes for a delivery, its count is already there.
            // SAFETY: the action only does an atomic add (async-signal-safe).
            unsafe {
                signal_hook::low_level::register(sig, move || {
                    c[i].fetch_add(1, Ordering::SeqCst);
                })
            }?;
        }
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            counts,
            seen: [0; 2],
        })
    }

    /// The next delivery not yet returned (its signal's name), one per
    /// delivery however close together they came.
    async fn next(&mut self) -> &'static str {
        loop {
            for (i, name) in Self::NAMES.iter().enumerate() {
                if self.counts[i].load(Ordering::SeqCst) > self.seen[i] {
                    self.seen[i] += 1;
                    return name;
                }
            }
            tokio::select! {
                _ = self.int.recv() => {}
                _ = self.term.recv() => {}
            }
        }
    }
}

/// Serve until SIGINT/SIGTERM; then detach the loop device, flush and
/// unmount. If the file system is busy, keep serving; a second signal
/// (also while the flush waits for a dead target) forces: the FUSE
/// connection is aborted, so every waiting request fails, and the mount is
/// detached lazily. True if detached gracefully.
async fn wait_and_detach(
    mut deliveries: Signals,
    dir: &Path,
    loop_dev: Option<&str>,
    client: Arc<dyn BlockClient>,
) -> anyhow::Result<bool> {
    let (tx, mut signals) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            if tx.send(deliveries.next().await).is_err() {
                return;
            }
        }
    });
    let first = signals.recv().await.unwrap_or("signal");
    eprintln!(
        "blockwire: {first}: flushing and detaching {} (signal again to force)",
        dir.display()
    );
    let graceful = async {
        if let Some(l) = loop_dev.filter(|l| loop_device::backs(l, dir)) {
            loop_device::request_detach(l);
            loop_device::wait_released(l, Duration::from_secs(5));
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
    let _ = crate::abort_connection(dir);
    lazy_unmount(dir);
    Ok(false)
}

/// Run `daemon` (a command that runs a daemon in the foreground and prints
/// its ready line: `blockwire attach` without --background) in its own
/// session and wait for that line; its log goes to `STATE_DIR/attach-PID.log`.
/// Returns its state and the ready line.
pub fn spawn(mut daemon: Command) -> anyhow::Result<(AttachState, String)> {
    std::fs::create_dir_all(STATE_DIR)?;
    let log_tmp = Path::new(STATE_DIR).join(format!("attach-starting-{}.log", std::process::id()));
    let log = std::fs::File::create(&log_tmp)?;
    daemon
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
    // The daemon must not die with our terminal (setsid), and must hear the
    // SIGTERM of `blockwire umount` even when our caller blocks signals
    // (children inherit the signal mask).
    // SAFETY: setsid, sigemptyset and sigprocmask are async-signal-safe and
    // touch only the local set.
    unsafe {
        daemon.pre_exec(|| {
            libc::setsid();
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = daemon.spawn().context("starting the attach daemon")?;
    let pid = child.id();
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    let log_path = log_path(pid);
    let _ = std::fs::rename(&log_tmp, &log_path);
    if !line.starts_with(READY) {
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
    let state = AttachState::read(&state_path(pid))?;
    Ok((state, line.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two deliveries before the runtime reads either are two signals, not
    /// one (tokio's streams alone returned once and then waited for ever).
    #[test]
    fn two_deliveries_before_the_runtime_reads_are_two_signals() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut signals = {
            let _in_runtime = rt.enter();
            Signals::new().unwrap()
        };
        // raise(3) runs the handler before it returns, so the second is a
        // delivery of its own (not merged in the kernel with the first).
        // SAFETY: raise(3) to ourselves; the handlers are registered above.
        unsafe {
            libc::raise(libc::SIGTERM);
            libc::raise(libc::SIGTERM);
        }
        rt.block_on(async {
            for n in 1..=2 {
                let got = tokio::time::timeout(Duration::from_secs(10), signals.next()).await;
                assert_eq!(got, Ok("SIGTERM"), "delivery {n} of 2");
            }
        });
    }
}
