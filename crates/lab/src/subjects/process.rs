//! Target processes (what `crate::subjects` starts): spawned tracked, their
//! output kept for errors, waited on until ready, their CPU time read, and
//! stopped. A target that cannot start is reported with its reason; the lab
//! carries on with the others.

use crate::cleanup::{registry, Token};
use crate::hosts::host::Host;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The line `blockwire serve` prints once it listens on everything.
pub const SERVE_READY: &str = "blockwire: ready";

/// A running target process with its stderr kept (last lines) for errors,
/// or a target inside the host's kernel (LIO, nvmet), which has no process:
/// its CPU is the host machine's, and stopping it undoes what set it up.
pub struct TargetProcess {
    pub name: String,
    /// The local child: the program itself, or its ssh session (0 for a
    /// kernel target).
    pub pid: u32,
    /// Where it runs.
    pub host: Host,
    /// Its PID on a remote host (printed first by the session's wrapper).
    remote_pid: Arc<RemotePid>,
    /// None: a kernel target.
    child: Option<Child>,
    token: Option<Token>,
    log: Arc<Mutex<VecDeque<String>>>,
    extra: Vec<Token>,
    /// What the report says of how it serves (a kernel target's version,
    /// backstore and cache settings).
    pub settings: Option<String>,
}

impl TargetProcess {
    /// A target the host's kernel serves (configfs): nothing runs for it,
    /// `undo` (released when it stops) takes it down again.
    pub fn kernel(name: &str, host: &Host, undo: Token) -> TargetProcess {
        TargetProcess {
            name: name.to_string(),
            pid: 0,
            host: host.clone(),
            remote_pid: Arc::default(),
            child: None,
            token: Some(undo),
            log: Arc::default(),
            extra: vec![],
            settings: None,
        }
    }

    /// Whether the kernel serves it (no process of its own).
    pub fn in_kernel(&self) -> bool {
        self.child.is_none()
    }

    /// Its CPU time: the process's, or for a kernel target the whole host
    /// machine's busy time (its work belongs to no process: kernel
    /// threads, softirqs), as a kernel initiator's is measured.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        if self.in_kernel() {
            return Ok(self.host.machine_ticks()?.busy as f64 / crate::hosts::host::USER_HZ);
        }
        self.host.process_cpu_seconds(self.host_pid()?)
    }

    /// Its PID on its host.
    pub fn host_pid(&self) -> anyhow::Result<u32> {
        anyhow::ensure!(!self.in_kernel(), "{} is served by the kernel of {}: no process", self.name, self.host.name());
        if self.host.on_this_machine() {
            return Ok(self.pid);
        }
        match self.remote_pid.wait() {
            Some(p) => Ok(p),
            None => anyhow::bail!("{} on {}: its session ended before it printed its PID: {}", self.name, self.host.name(), self.log_tail()),
        }
    }

    pub fn alive(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => true,
        }
    }

    pub fn log_tail(&self) -> String {
        let g = self.log.lock().unwrap_or_else(|p| p.into_inner());
        g.iter().cloned().collect::<Vec<_>>().join(" | ")
    }

    /// Release `token` (a file it leaves behind, its config) when it stops.
    pub fn keep_until_stopped(&mut self, token: Token) {
        self.extra.push(token);
    }

    /// Stop it where it stands, its place kept for the process that
    /// replaces it (a target restarted on another file system); `stop` on
    /// it afterwards is harmless.
    pub fn halt(&mut self) {
        if let Some(t) = self.token.take() {
            let _ = registry().release(t);
        }
        for t in self.extra.drain(..) {
            let _ = registry().release(t);
        }
        if let Some(c) = &mut self.child {
            let _ = c.try_wait();
        }
    }

    pub fn stop(mut self) {
        self.halt();
    }
}

/// A remote service's PID as its session's wrapper prints it. It comes
/// when the remote shell gets to it, which on a slow host (an emulated
/// guest, a loaded machine) can take any time: [`RemotePid::wait`] waits
/// until it comes or until the session's output has ended (then it never
/// will), not for a fixed time.
#[derive(Default)]
struct RemotePid {
    state: Mutex<PidState>,
    changed: Condvar,
}

#[derive(Default)]
struct PidState {
    pid: Option<u32>,
    /// Output streams of the session still being read.
    open_streams: usize,
}

impl RemotePid {
    fn lock(&self) -> std::sync::MutexGuard<'_, PidState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reading(&self, streams: usize) {
        self.lock().open_streams = streams;
    }

    fn set(&self, pid: u32) {
        self.lock().pid.get_or_insert(pid);
        self.changed.notify_all();
    }

    fn stream_ended(&self) {
        let mut g = self.lock();
        g.open_streams = g.open_streams.saturating_sub(1);
        drop(g);
        self.changed.notify_all();
    }

    /// The PID, or None once every stream has ended without it.
    fn wait(&self) -> Option<u32> {
        let g = self.lock();
        let g = self
            .changed
            .wait_while(g, |s| s.pid.is_none() && s.open_streams > 0)
            .unwrap_or_else(|p| p.into_inner());
        g.pid
    }
}

/// Spawn `cmd` (from `host`'s [`Host::service_command`]) with stderr (and
/// stdout) collected line by line into a ring buffer (and into `log_file`,
/// if given); `ready` is sent the first time a line contains `ready_marker`.
pub fn spawn_logged(
    host: &Host,
    mut cmd: std::process::Command,
    what: &str,
    ready_marker: Option<&'static str>,
    log_file: Option<&std::path::Path>,
) -> anyhow::Result<(TargetProcess, mpsc::Receiver<()>)> {
    let file = match log_file {
        Some(p) => Some(Arc::new(Mutex::new(std::fs::File::create(p)?))),
        None => None,
    };
    cmd.stdin(host.service_stdin()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let (token, mut child) = registry().spawn(&mut cmd, what, crate::cleanup::Role::Service)?;
    let log = Arc::new(Mutex::new(VecDeque::new()));
    let (tx, rx) = mpsc::channel();
    let remote_pid: Arc<RemotePid> = Arc::default();
    let streams: Vec<Box<dyn std::io::Read + Send>> = vec![
        Box::new(child.stderr.take().expect("piped stderr")),
        Box::new(child.stdout.take().expect("piped stdout")),
    ];
    remote_pid.reading(streams.len());
    for stream in streams {
        let (log, tx, file, remote_pid) = (log.clone(), tx.clone(), file.clone(), remote_pid.clone());
        // Keep draining after "ready": a full pipe would block the target.
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if let Some(pid) = crate::hosts::ssh::pid_mark(&line) {
                    remote_pid.set(pid);
                    continue;
                }
                if ready_marker.is_some_and(|m| line.contains(m)) {
                    let _ = tx.send(());
                }
                if let Some(f) = &file {
                    let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = writeln!(f, "{line}");
                }
                let mut g = log.lock().unwrap_or_else(|p| p.into_inner());
                if g.len() >= 20 {
                    g.pop_front();
                }
                g.push_back(line);
            }
            remote_pid.stream_ended();
        });
    }
    let pid = child.id();
    Ok((TargetProcess { name: what.to_string(), pid, host: host.clone(), remote_pid, child: Some(child), token: Some(token), log, extra: vec![], settings: None }, rx))
}

/// Wait for the ready line; on exit or timeout, stop it and return why.
pub fn await_ready(mut p: TargetProcess, rx: &mpsc::Receiver<()>, timeout: Duration) -> Result<TargetProcess, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if rx.recv_timeout(Duration::from_millis(100)).is_ok() {
            return Ok(p);
        }
        if !p.alive() {
            std::thread::sleep(Duration::from_millis(100)); // let the readers catch the last lines
            let why = format!("{} exited: {}", p.name, p.log_tail());
            p.stop();
            return Err(why);
        }
        if Instant::now() > deadline || crate::cleanup::interrupted() {
            let why = format!("{} not ready after {timeout:?}: {}", p.name, p.log_tail());
            p.stop();
            return Err(why);
        }
    }
}
