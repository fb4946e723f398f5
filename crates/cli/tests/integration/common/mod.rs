//! Test kit shared by the integration tests: start `blockwire serve` and wait
//! until it is ready, network namespaces with veth pairs, the kernel VM, free
//! ports. Everything a test creates is removed on drop, processes by PID.
//!
//! **A test whose peer is missing** (a tool, a source tree such as
//! ../shared/blktests, a device) calls [`skip`] with the reason and returns:
//!
//! ```ignore
//! if !csi_sanity.exists() {
//!     return skip("no csi-sanity (make deps installs it)");
//! }
//! ```
//!
//! libtest still reports it "ok", but `make test`'s summary
//! (tests/test-summary) counts it as skipped, never as passed, and lists
//! it with its reason, one line per reason:
//!
//! ```text
//! skipped: no csi-sanity (make deps installs it): csi::sanity, csi::sanity_block
//! tests: 1480 passed, 0 failed, 14 skipped
//! ```
//!
//! Only for a peer that is absent: a peer that is there and fails is a
//! failure, and a missing Debian package belongs in `make deps` (its test
//! panics naming the package).


pub mod ceph;
pub mod ganesha;
pub mod nvme_raw;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The binary under test: this build's, or `$BLOCKWIRE_BIN` (to run a
/// test against another build, e.g. to see a new test fail on an older
/// one).
pub fn blockwire_bin() -> PathBuf {
    std::env::var_os("BLOCKWIRE_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_blockwire")))
}

/// The repository root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repo root")
}

/// A guest script of tests/kernel-vm with the helpers it uses (`lib`, a
/// file beside it) in front.
pub fn guest_script_with(lib: &str, name: &str) -> String {
    let read = |f: &str| std::fs::read_to_string(repo_root().join("tests/kernel-vm").join(f)).expect("guest script");
    format!("{}\n{}", read(lib), read(name))
}

/// `../shared` beside the repository, or `$BLOCKWIRE_SHARED` (a git
/// worktree elsewhere has no `../shared`).
pub fn shared_dir() -> PathBuf {
    std::env::var_os("BLOCKWIRE_SHARED").map(PathBuf::from).unwrap_or_else(|| repo_root().join("../shared"))
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root (namespaces, raw sockets); run `make test` as root");
}

/// Record that the calling test is skipped, and why (see the module
/// comment); the test then returns. One file per test, named after the
/// test, holding the reason, in `$BW_SKIPPED_DIR` (`make test` sets it to
/// target/skipped, emptied before each run; by default the same place)
/// for tests/test-summary. Call it on the test's own thread: libtest names
/// that thread after the test.
pub fn skip(reason: &str) {
    let current = std::thread::current();
    let name = current.name().filter(|n| *n != "main").expect("skip() called off the test's own thread (libtest names that one after the test)");
    println!("skipped: {name}: {reason}");
    let dir = skipped_dir();
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let file = dir.join(name);
    std::fs::write(&file, format!("{}\n", reason.replace('\n', " "))).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
}

/// Put first among `blockwire lab`'s options in tests: measure without
/// waiting for an idle machine. Under make test the machine is never idle
/// (the other test thread), so each quick run's default 20 s of waiting
/// bought nothing but wall time; `make demo` keeps the default.
pub const LAB_AT_ONCE: [&str; 2] = ["--idle-wait", "0"];

/// Where [`skip`] records skipped tests.
pub fn skipped_dir() -> PathBuf {
    std::env::var_os("BW_SKIPPED_DIR").map(PathBuf::from).unwrap_or_else(|| repo_root().join("target/skipped"))
}

/// SIGSTOP to `pid`, returning once every one of its threads is stopped.
/// kill(2) returns before the stop reaches the process's other threads:
/// only one is woken to start the group stop, and on a busy machine the
/// others went on serving for another 15-75 ms (time enough to answer a
/// write sent after the kill).
pub fn freeze(pid: u32) {
    // SAFETY: kill(2) on a process the caller started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0, "SIGSTOP {pid}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let states = thread_states(pid);
        if !states.is_empty() && states.iter().all(|&s| s == 'T') {
            return;
        }
        assert!(Instant::now() < deadline, "process {pid} not stopped 60 s after SIGSTOP: thread states {states:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The state letter (R, S, D, T, ...) of each thread of `pid`.
pub fn thread_states(pid: u32) -> Vec<char> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    dir.flatten()
        .filter_map(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            stat.rsplit_once(") ")?.1.chars().next()
        })
        .collect()
}

/// The unprivileged local user the hostile tests act as: what they plant,
/// they plant as this user, so a step the user could not take fails the
/// test instead of proving nothing.
pub const NOBODY: u32 = 65534;

/// Run `cmd` as [`NOBODY`] (no supplementary groups, its group and user
/// set in the child before exec).
pub fn as_nobody(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// `sh -c script` as [`NOBODY`]; panics with its output if it fails.
pub fn nobody_sh(script: &str) -> String {
    let out = as_nobody(Command::new("sh").arg("-c").arg(script)).output().expect("spawn sh as nobody");
    assert!(out.status.success(), "as nobody: {script}\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A directory `name` in `parent` that [`NOBODY`] owns (and may write):
/// where an unprivileged user plants what an attacker plants.
pub fn nobody_dir(parent: &Path, name: &str) -> PathBuf {
    let d = parent.join(name);
    std::fs::create_dir(&d).expect("mkdir");
    std::os::unix::fs::chown(&d, Some(NOBODY), Some(NOBODY)).expect("chown to nobody");
    d
}

/// A process id that no process has now (a child that ran and was
/// reaped): what a killed writer leaves in file names.
pub fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().expect("spawn true");
    c.wait().expect("wait for true");
    c.id()
}

/// A short unique suffix for names of namespaces and interfaces.
pub fn unique(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{tag}{}{}", std::process::id() % 100_000, N.fetch_add(1, Ordering::Relaxed))
}

/// Run a command, panic with its output if it fails.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().expect("spawn sh");
    assert!(
        out.status.success(),
        "command failed: {cmd}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run `blockwire ARGS` (optionally inside a namespace) and return its output.
pub fn blockwire(netns: Option<&str>, args: &[&str]) -> Output {
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(blockwire_bin());
            c
        }
        None => Command::new(blockwire_bin()),
    };
    c.args(args).output().expect("spawn blockwire")
}

/// Like [`blockwire`], panicking with both streams if it fails; returns stdout.
pub fn blockwire_ok(netns: Option<&str>, args: &[&str]) -> String {
    let out = blockwire(netns, args);
    assert!(
        out.status.success(),
        "blockwire {args:?} failed ({})\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A running `blockwire serve`. Stopped with SIGTERM (then SIGKILL) on drop.
pub struct Serve {
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Serve {
    pub fn start(args: &[&str]) -> Serve {
        Serve::start_in(None, args)
    }

    /// Write `toml` to `dir`/serve.toml and start `blockwire serve --config`
    /// on it, with `extra` arguments after.
    pub fn with_config(dir: &TempDir, toml: &str, extra: &[&str]) -> Serve {
        let path = dir.path().join("serve.toml");
        std::fs::write(&path, toml).expect("write serve.toml");
        let mut args = vec!["--config", path.to_str().expect("UTF-8 temp path")];
        args.extend_from_slice(extra);
        Serve::start(&args)
    }

    /// Start `blockwire serve ARGS`, inside `netns` if given (`ip netns exec`
    /// execs, so the PID is blockwire's own), and wait for its ready line.
    pub fn start_in(netns: Option<&str>, args: &[&str]) -> Serve {
        let mut c = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(blockwire_bin());
                c
            }
            None => Command::new(blockwire_bin()),
        };
        c.arg("serve").args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = c.spawn().expect("spawn blockwire serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[serve] {line}");
                if line.contains("blockwire: ready") {
                    let _ = tx.send(());
                }
                log2.lock().expect("log lock").push(line);
            }
        });
        let mut s = Serve { child: Some(child), log };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if rx.recv_timeout(Duration::from_millis(50)).is_ok() {
                return s;
            }
            if let Some(st) = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                std::thread::sleep(Duration::from_millis(100));
                panic!("blockwire serve {args:?} exited with {st} before it was ready:\n{}", s.log_text());
            }
            assert!(Instant::now() < deadline, "blockwire serve {args:?} not ready after 30 s:\n{}", s.log_text());
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn log_text(&self) -> String {
        self.log.lock().expect("log lock").join("\n")
    }

    /// Whether a line saying `needle` appears in its log within `within`
    /// (it comes when the server gets to it, on a busy machine too).
    pub fn wait_log(&self, needle: &str, within: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if self.log_text().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Its log lines as they come, also after it stopped (for its last words).
    pub fn log_lines(&self) -> Arc<Mutex<Vec<String>>> {
        self.log.clone()
    }

    /// Whether the process is still running (it must survive bad input).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// SIGTERM and wait; returns the exit status (should be success).
    pub fn stop(mut self) -> ExitStatus {
        self.terminate().expect("serve was running")
    }

    /// SIGKILL (a crash: no shutdown path runs) and reap the process.
    pub fn kill_now(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("serve was running");
        // SAFETY: signalling our own, not yet reaped child by PID.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().expect("wait for killed serve")
    }

    /// SIGTERM, then wait up to `limit` for the exit; returns the status and
    /// how long the exit took, or None (after a SIGKILL) if it hung.
    pub fn terminate_within(mut self, limit: Duration) -> Option<(ExitStatus, Duration)> {
        let mut child = self.child.take().expect("serve was running");
        let t0 = Instant::now();
        // SAFETY: signalling our own, not yet reaped child by PID.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        while t0.elapsed() < limit {
            if let Ok(Some(st)) = child.try_wait() {
                return Some((st, t0.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    fn terminate(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        // SAFETY: signalling our own child by PID.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// A network namespace joined to the root namespace by a veth pair:
/// `ns_if` lives inside `ns`, `host_if` stays outside. Removed on drop.
pub struct NetnsPair {
    pub ns: String,
    pub host_if: String,
    pub ns_if: String,
}

impl NetnsPair {
    /// `tag` keeps names apart between tests (at most 4 characters).
    pub fn new(tag: &str, mtu: u32) -> NetnsPair {
        require_root();
        let id = unique(tag);
        let p = NetnsPair { ns: format!("bw-{id}"), host_if: format!("bw{id}h"), ns_if: format!("bw{id}n") };
        assert!(p.host_if.len() <= 15, "interface name too long: {}", p.host_if);
        sh(&format!("ip netns add {}", p.ns));
        sh(&format!("ip link add {} mtu {mtu} type veth peer name {} mtu {mtu}", p.host_if, p.ns_if));
        sh(&format!("ip link set {} netns {}", p.ns_if, p.ns));
        sh(&format!("ip link set {} up", p.host_if));
        sh(&format!("ip -n {} link set {} up && ip -n {} link set lo up", p.ns, p.ns_if, p.ns));
        p
    }

    /// Give both ends IPv4 addresses in a private /30 that exists only on this veth.
    /// Returns (host address, namespace address).
    pub fn with_ipv4(&self, subnet: u8) -> (String, String) {
        let (h, n) = (format!("10.254.{subnet}.1"), format!("10.254.{subnet}.2"));
        sh(&format!("ip addr add {h}/30 dev {}", self.host_if));
        sh(&format!("ip -n {} addr add {n}/30 dev {}", self.ns, self.ns_if));
        (h, n)
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.host_if]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    // Below the ephemeral range: a port the kernel hands out for bind(0)
    // is also one it hands to client sockets, and a test making 50,000
    // logins next door took one between our check and the target's bind
    // ("Address already in use" in make soak). Each call tries the next
    // port of a per-process walk, so parallel tests never pick the same one.
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let base = 10_000u32;
    let span = low.saturating_sub(base).max(1000);
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let port = (base + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        let free = |ip: &str| std::net::TcpListener::bind((ip, port)).is_ok();
        if free("0.0.0.0") && free("127.0.0.1") {
            return port;
        }
    }
    panic!("no free port in {base}..{}", base + span)
}

/// A /24 on this host's own links for a test's tap, as "10.A.B" (host .1,
/// guest .2): the first from `10.first.0` upwards that no address or route
/// here already covers. A fixed subnet broke a test once: a tap that an
/// interrupted run of another test had left still held its address, and
/// the lab took that device for the target's. Callers start from
/// different `first`s so two tests running at once do not pick the same.
pub fn free_subnet(first: [u8; 2]) -> String {
    let held = format!("{}{}", sh("ip -4 -o addr show"), sh("ip -4 route show table all"));
    let taken = |net: &str| held.contains(&format!(" {net}.")) || held.contains(&format!("\n{net}.")) || held.starts_with(&format!("{net}."));
    let start = u16::from(first[0]) << 8 | u16::from(first[1]);
    for n in start..=u16::MAX {
        let net = format!("10.{}.{}", n >> 8, n & 0xff);
        if !taken(&net) {
            return net;
        }
    }
    panic!("no free 10.x.y.0/24 from 10.{}.{} up on this host", first[0], first[1])
}

/// A TCP connection to 127.0.0.1:`port` from 127.0.0.`from` (all of
/// 127/8 is loopback): a peer of its own for servers that count
/// connections per address.
pub fn tcp_connect_from(port: u16, from: u8) -> std::io::Result<std::net::TcpStream> {
    // SAFETY: plain socket calls on a descriptor the TcpStream made from
    // it owns at once.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let s = <std::net::TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd);
        let addr = |ip: [u8; 4], port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(ip) },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let (me, them) = (addr([127, 0, 0, from], 0), addr([127, 0, 0, 1], port));
        if libc::bind(fd, (&me as *const libc::sockaddr_in).cast(), len) != 0 || libc::connect(fd, (&them as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(s)
    }
}

/// Standard base64 (HTTP basic authentication).
pub fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            out.push(if i <= c.len() { A[(n >> (18 - 6 * i)) as usize & 63] as char } else { '=' });
        }
    }
    out
}

/// POST `body` to 127.0.0.1:`port` from 127.0.0.`from` as one HTTP/1.1
/// request, with basic authentication `auth` (USER:PASSWORD) if given;
/// the whole answer (read until the server closes).
pub fn http_post_from(port: u16, from: u8, auth: Option<&str>, body: &str) -> String {
    use std::io::{Read, Write};
    let mut s = tcp_connect_from(port, from).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let auth = auth.map(|a| format!("Authorization: Basic {}\r\n", base64(a.as_bytes()))).unwrap_or_default();
    let _ = write!(s, "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Wait until something accepts TCP connections on 127.0.0.1:port.
pub fn wait_for_port(port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The project's kernel VM harness (`tests/kernel-vm/vm`; its header says
/// what the guest holds).
pub fn kernel_vm_tool() -> PathBuf {
    repo_root().join("tests/kernel-vm/vm")
}

/// Result of a kernel VM run.
pub struct VmRun {
    pub status: ExitStatus,
    pub output: String,
}

/// Boot the Debian kernel under qemu and run `script` inside it
/// (`tests/kernel-vm/vm run SCRIPT [--tap IF]`), with optional qemu
/// hostfwd rules. The guest reaches the host's 127.0.0.1 as 10.0.2.2.
pub fn kernel_vm(script: &Path, tap: Option<&str>, hostfwd: Option<&str>) -> VmRun {
    kernel_vm_in(None, script, tap, hostfwd)
}

/// [`kernel_vm`] with another image directory (`KVM_DIR`), e.g. one with a
/// newer kernel (tests/kernel-vm/kernel-6.12.sh).
pub fn kernel_vm_in(kvm_dir: Option<&Path>, script: &Path, tap: Option<&str>, hostfwd: Option<&str>) -> VmRun {
    require_root();
    let mut c = Command::new(kernel_vm_tool());
    c.arg("run").arg(script);
    if let Some(t) = tap {
        c.args(["--tap", t]);
    }
    if let Some(f) = hostfwd {
        c.env("KVM_HOSTFWD", f);
    }
    c.env("KVM_TIMEOUT", std::env::var("KVM_TIMEOUT").unwrap_or_else(|_| "900".into()));
    if let Some(d) = kvm_dir {
        c.env("KVM_DIR", d);
    }
    let out = c.stdin(Stdio::null()).output().expect("spawn kernel-vm");
    let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("---- kernel-vm {} ----\n{output}\n---- end ----", script.display());
    VmRun { status: out.status, output }
}

/// Debian's linux-image-6.12 in `<repo>/.kvm-6.12`, made on first use.
pub fn kernel_612_image() -> std::path::PathBuf {
    let dir = repo_root().join(".kvm-6.12");
    let st = std::process::Command::new(repo_root().join("tests/kernel-vm/kernel-6.12.sh"))
        .arg(&dir)
        .status()
        .expect("run tests/kernel-vm/kernel-6.12.sh");
    assert!(
        st.success(),
        "could not prepare the Linux 6.12 kernel VM image"
    );
    dir
}

/// Under software emulation on a busy host the kernel's early check of the
/// timer interrupt can fail ("IO-APIC + timer doesn't work!") and the guest
/// panics before running anything; such a boot may simply be retried.
pub fn vm_boot_flaked(console: &str) -> bool {
    console.contains("IO-APIC + timer doesn't work")
}

/// How long a background guest may live, in seconds: longer than the sum
/// of any test's own deadlines (10 min to boot, then up to 35 min of runs),
/// so that the guest never powers off under a test still using it on a
/// busy machine (CI, 2026-11-27: a guest that slept 15 min ended before
/// its test's last check). The test ends the guest on drop; this bound only
/// matters for a test process killed before its drop ran.
pub const BACKGROUND_VM_LIFE_S: u64 = 3600;

/// The last line of a background guest's script: stay up until the test
/// ends the guest (or [`BACKGROUND_VM_LIFE_S`] passes).
pub fn guest_stays_up() -> String {
    format!("sleep {BACKGROUND_VM_LIFE_S}\n")
}

/// The KVM_TIMEOUT for a guest whose script ends in [`guest_stays_up`].
pub fn stays_up_timeout() -> (&'static str, String) {
    ("KVM_TIMEOUT", (BACKGROUND_VM_LIFE_S + 60).to_string())
}

/// `kernel-vm run` in the background, for guests that serve something
/// (a kernel target reached through `hostfwd` rules) while the test drives
/// it from the host. It runs in its own process group, killed as a group on
/// drop (qemu is its grandchild); the console is echoed and collected.
pub struct BackgroundVm {
    child: Child,
    console: Option<std::thread::JoinHandle<String>>,
    /// Waited for: its PID may belong to someone else now.
    reaped: bool,
}

impl BackgroundVm {
    pub fn start(kvm_dir: Option<&Path>, script: &Path, hostfwd: &str) -> BackgroundVm {
        BackgroundVm::start_with(kvm_dir, script, hostfwd, &[], &[])
    }

    /// [`BackgroundVm::start`] with more `kernel-vm run` arguments (`--tap
    /// IF`, `--with FILE`) and environment (`KVM_SSH_KEY`, `KVM_MEM`).
    pub fn start_with(kvm_dir: Option<&Path>, script: &Path, hostfwd: &str, args: &[&str], env: &[(&str, &str)]) -> BackgroundVm {
        use std::os::unix::process::CommandExt;
        require_root();
        let mut c = Command::new(kernel_vm_tool());
        c.arg("run")
            .arg(script)
            .args(args)
            // A guest whose script ends by itself has 15 min; one that
            // stays up (`guest_stays_up`) passes its own KVM_TIMEOUT.
            .env("KVM_TIMEOUT", "900")
            .envs(env.iter().copied())
            .env("KVM_HOSTFWD", hostfwd);
        if let Some(d) = kvm_dir {
            c.env("KVM_DIR", d);
        }
        let mut child = c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
            .expect("spawn kernel-vm");
        let out = child.stdout.take().expect("kernel-vm stdout");
        let console = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                eprintln!("[vm] {line}");
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        BackgroundVm {
            child,
            console: Some(console),
            reaped: false,
        }
    }

    /// Wait up to `limit` for `ready()` to hold. kernel-vm's console pipe
    /// is block-buffered, so probe the service rather than wait for a line.
    /// Err(console) if the guest ended first; panics if the time runs out.
    pub fn wait_until(
        &mut self,
        limit: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.reaped = true;
                let out = self
                    .console
                    .take()
                    .map(|c| c.join().unwrap_or_default())
                    .unwrap_or_default();
                return Err(format!("kernel-vm exited early ({st}):\n{out}"));
            }
            if ready() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_secs(5));
        }
        panic!("the guest's service did not come up within {limit:?}");
    }

    /// Wait for the guest to finish: its exit status and console.
    pub fn finish(mut self) -> (ExitStatus, String) {
        let st = self.child.wait().expect("wait for kernel-vm");
        self.reaped = true;
        let out = self
            .console
            .take()
            .map(|c| c.join().unwrap_or_default())
            .unwrap_or_default();
        (st, out)
    }
}

/// Every process below `pid` (from /proc), deepest last.
fn descendants(pid: i32) -> Vec<i32> {
    let mut parent_of = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        // stat: "pid (comm) state ppid ..."; comm may hold spaces.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        if let Some(pp) = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|x| x.parse::<i32>().ok())
        {
            parent_of.push((p, pp));
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let cur = out[i];
        out.extend(
            parent_of
                .iter()
                .filter(|(_, pp)| *pp == cur)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    out.remove(0);
    out
}

impl Drop for BackgroundVm {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        let pid = self.child.id() as i32;
        // kernel-vm starts qemu under `timeout`, which makes a process group
        // of its own: signal every descendant by PID. The script itself is
        // left to end: with qemu gone it returns, and its EXIT trap removes
        // its work directory (a copy of the image, ~140 MB in /tmp) and the
        // tap it made, which a SIGKILL to it would leave behind.
        // SAFETY: signalling processes this test started.
        unsafe {
            for p in descendants(pid) {
                libc::kill(p, libc::SIGKILL);
            }
        }
        // Whatever the script started after that list was taken (a sed on
        // the console) ends by itself; a script stopped before qemu ran
        // (building the image) is in our group.
        let _ = self.child.wait();
        // SAFETY: our own process group, made for this VM; nothing of it
        // should be left, and signalling an empty group is harmless.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        Self::new_in(std::env::temp_dir(), tag)
    }
    /// Under `parent`, e.g. `env!("CARGO_TARGET_TMPDIR")` for a disk file
    /// system where /tmp may be tmpfs.
    pub fn new_in(parent: impl AsRef<Path>, tag: &str) -> TempDir {
        let p = parent.as_ref().join(format!("blockwire-{}", unique(tag)));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tgtd (the Linux SCSI target framework, Debian package tgt) on
/// 127.0.0.1 with one target of one LUN (1) on `img`; on its own control
/// port so tests can run side by side. Stopped on drop.
pub struct Tgtd {
    child: Child,
    control: u32,
    pub port: u16,
}

impl Tgtd {
    pub fn start(img: &Path, iqn: &str) -> Tgtd {
        require_root();
        let port = free_port();
        // Unique per test: the pid and the (unique) image path.
        // tgtd takes control ports up to 32767.
        let control = 1000 + (std::process::id().wrapping_add(crc(img.to_string_lossy().as_bytes()))) % 31000;
        let log = img.with_extension("tgtd.log");
        let child = Command::new("tgtd")
            .args(["-f", "-C", &control.to_string(), "--iscsi", &format!("portal=127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("tgtd log"))
            .spawn()
            .expect("spawn tgtd (Debian package tgt)");
        let t = Tgtd { child, control, port };
        assert!(
            wait_for_port(port, Duration::from_secs(10)),
            "tgtd did not listen on {port}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        t.admin(&["--op", "new", "--mode", "target", "--tid", "1", "-T", iqn]);
        t.admin(&["--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", "1", "-b", img.to_str().expect("UTF-8 path")]);
        t.admin(&["--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL"]);
        t
    }

    /// `tgtadm --lld iscsi ARGS` on this tgtd; panics if it fails.
    pub fn admin(&self, args: &[&str]) {
        let out = Command::new("tgtadm").arg("-C").arg(self.control.to_string()).args(["--lld", "iscsi"]).args(args).output().expect("spawn tgtadm");
        assert!(out.status.success(), "tgtadm {args:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Tgtd {
    fn drop(&mut self) {
        let _ = Command::new("tgtadm").args(["-C", &self.control.to_string(), "--op", "delete", "--mode", "system"]).output();
        std::thread::sleep(Duration::from_millis(200));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn crc(b: &[u8]) -> u32 {
    b.iter().fold(17u32, |h, &c| h.wrapping_mul(31).wrapping_add(c as u32))
}

/// Short and garbage AoE requests (15 bytes to 9000) to `target_mac`
/// through `iface`, from station 02:fa:4e:00:00:`station`, bytes from
/// `seed`: never a Reserve (command 3), which could lock a client out.
pub fn send_garbage_aoe_requests(iface: &str, target_mac: [u8; 6], station: u8, mut seed: u32) {
    let raw = bw_net::PacketSocket::open(iface, bw_aoe::ETHERTYPE_AOE).expect("packet socket");
    let mut f = vec![0u8; 9000];
    f[0..6].copy_from_slice(&target_mac);
    f[6..12].copy_from_slice(&[0x02, 0xfa, 0x4e, 0, 0, station]);
    f[12..14].copy_from_slice(&bw_aoe::ETHERTYPE_AOE.to_be_bytes());
    for len in [15, 20, 24, 30, 36, 60, 1500, 5000, 9000] {
        for b in f[14..len].iter_mut() {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            *b = (seed >> 16) as u8;
        }
        // A request: the response flag clear.
        f[14] &= 0xF7;
        if len > 19 && f[19] == 3 {
            f[19] = 0;
        }
        raw.send(&f[..len]).expect("send a bad frame");
    }
}

/// vblade (the reference AoE target, Debian package vblade) exporting `img`
/// as SHELF.SLOT on the namespace end of `pair`, answering discovery before
/// this returns. Killed on drop.
pub struct Vblade(Child);

impl Vblade {
    pub fn start(pair: &NetnsPair, shelf: u16, slot: u8, img: &Path) -> Vblade {
        let child = Command::new("ip")
            .args(["netns", "exec", &pair.ns, "vblade", &shelf.to_string(), &slot.to_string(), &pair.ns_if])
            .arg(img)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn vblade (Debian package vblade)");
        let v = Vblade(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        let want = format!("e{shelf}.{slot}");
        loop {
            let out = blockwire(None, &["aoe", "discover", &pair.host_if, "--wait", "0.5"]);
            if String::from_utf8_lossy(&out.stdout).contains(&want) {
                return v;
            }
            assert!(Instant::now() < deadline, "vblade never answered discovery");
        }
    }
}

impl Drop for Vblade {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// GET `path` from `addr` (HOST:PORT) over plain HTTP/1.1; the whole
/// response, headers and all (the metrics endpoint, Prometheus's API).
pub fn http_get(addr: &str, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// The body of a 200 answer to `GET /metrics` from `addr`, checked to be
/// the Prometheus text format.
pub fn scrape_metrics(addr: &str) -> String {
    let r = http_get(addr, "/metrics").expect("scrape");
    let (head, body) = r.split_once("\r\n\r\n").expect("HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200") && head.contains("text/plain; version=0.0.4"), "{head}");
    body.to_string()
}

/// The value of the first sample in a Prometheus exposition whose line
/// starts with `series` (its name and labels, or a prefix of them).
pub fn metric_sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{series} not in the exposition:\n{text}"))
}
