//! Hostile neighbours (issue 52): serve runs as root; an unprivileged
//! local user (nobody) plants what an attacker plants where that user may
//! write, an unauthenticated network peer holds connections, a caller
//! with the control plane's credentials sends what a careless or hostile
//! orchestrator sends. One test per class of the issue; each failed
//! against the build before the fix (docs/notes/2026-11-25-hostile-neighbours-2.md).
//! Every test collects what went wrong and reports it all at once.

use crate::common::nvme_raw::RawNvme;
use crate::common::*;
use bw_nvme::fabrics::{reg, Property};
use bw_nvme::queue_entry::{nvm, sgl, Sgl, Sqe};
use bw_nvme::Status;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

const NQN: &str = "nqn.2026-11.org.blockwire:hostile";

/// One host's controller on [`NQN`]: its admin queue (enabled, held
/// open) and an I/O queue.
struct Host {
    _admin: RawNvme,
    io: RawNvme,
    cid: u16,
}

impl Host {
    /// Host `id`: Host Identifier 16 bytes of `id`.
    fn connect(port: u16, id: u8) -> Host {
        let hostnqn = format!("nqn.2014-08.org.blockwire:hostile-{id}");
        let (mut admin, c) = RawNvme::connected(port, NQN, 0, 0xFFFF, &hostnqn, [id; 16]);
        assert!(c.status.is_success(), "admin Connect: {}", c.status);
        assert!(admin.command(Property::set_sqe(2, reg::CC, 0x46_0001), &[]).unwrap().status.is_success());
        let (io, c) = RawNvme::connected(port, NQN, 1, c.result as u16, &hostnqn, [id; 16]);
        assert!(c.status.is_success(), "I/O Connect: {}", c.status);
        Host { _admin: admin, io, cid: 10 }
    }

    fn run(&mut self, mut s: Sqe, data: &[u8]) -> Status {
        if !data.is_empty() {
            s.set_sgl(Sgl { addr: 0, length: data.len() as u32, kind: sgl::INCAPSULE });
        }
        self.io.command(s, data).expect("the target answered").status
    }

    fn next_cid(&mut self) -> u16 {
        self.cid += 1;
        self.cid
    }

    /// A one-block write at block 0 of namespace `nsid`.
    fn write(&mut self, nsid: u32) -> Status {
        let mut s = Sqe::new(nvm::WRITE, self.next_cid(), nsid);
        s.set_rw(0, 1);
        self.run(s, &[0x5a; 512])
    }

    /// Reservation Register (RREGA 0) of `key` on namespace 1.
    fn register(&mut self, key: u64) -> Status {
        let s = Sqe::new(nvm::RESV_REGISTER, self.next_cid(), 1);
        self.run(s, &[[0u8; 8], key.to_le_bytes()].concat())
    }

    /// Reservation Acquire with Preempt (RACQA 1) of `victim`'s
    /// registrations, taking a reservation of NVMe type `rtype`.
    fn preempt(&mut self, key: u64, victim: u64, rtype: u32) -> Status {
        let mut s = Sqe::new(nvm::RESV_ACQUIRE, self.next_cid(), 1);
        s.set_cdw(10, 1 | rtype << 8);
        self.run(s, &[key.to_le_bytes(), victim.to_le_bytes()].concat())
    }
}

fn conflict(s: Status) -> bool {
    s.0 & 0x7FF == Status::RESERVATION_CONFLICT.0
}

/// A stored reservation state as any blockwire reads it: `registrants`
/// (host byte, key), a holder (host byte, SPC type), `seq`.
fn state_json(seq: u64, registrants: &[(u8, u64)], holder: Option<(u8, u8)>) -> String {
    let who = |h: u8| format!("nvme:{}", format!("{h:02x}").repeat(16));
    serde_json::json!({
        "seq": seq,
        "generation": registrants.len(),
        "aptpl": false,
        "registrants": registrants.iter().map(|(h, k)| serde_json::json!({ "who": who(*h), "key": k })).collect::<Vec<_>>(),
        "holder": holder.map(|(h, t)| serde_json::json!({ "who": who(h), "ptype": t })),
        "events": [],
    })
    .to_string()
}

/// A server of `volumes` (`[[volume]]` bodies) on NVMe/TCP at `port`,
/// namespace 1 the first volume, and `extra` TOML.
fn nvme_config(port: u16, volumes: &[(&str, String)], extra: &str) -> String {
    let mut t = String::new();
    for (name, backend) in volumes {
        t += &format!("[[volume]]\nname = \"{name}\"\nbackend = \"{backend}\"\n");
    }
    t += &format!("[nvme]\nlisten = [\"127.0.0.1:{port}\"]\n[[nvme.subsystem]]\nnqn = \"{NQN}\"\n");
    match volumes.first() {
        Some((first, _)) => t += &format!("namespaces = [{{ nsid = 1, volume = \"{first}\" }}]\n"),
        None => t += "namespaces = []\n",
    }
    t + extra
}

/// `serve` of `volumes` and `extra` (nvme_config) in `dir`, on NVMe/TCP at
/// a free port, with a control socket `dir/c.sock`: (serve, its socket,
/// its NVMe/TCP port).
fn controlled(dir: &TempDir, volumes: &[(&str, String)], extra: &str) -> (Serve, std::path::PathBuf, u16) {
    let (sock, np) = (dir.path().join("c.sock"), free_port());
    let serve = Serve::with_config(dir, &nvme_config(np, volumes, extra), &["--control", sock.to_str().unwrap()]);
    (serve, sock, np)
}

/// A directory `name` in `parent` that every user may write (mode 1777,
/// as /tmp).
fn everyones_dir(parent: &Path, name: &str) -> std::path::PathBuf {
    let d = parent.join(name);
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    d
}

/// `blockwire ctl METHOD PARAMS` on `sock`: the result, or the error's text.
fn ctl(sock: &Path, method: &str, params: &str) -> Result<Value, String> {
    let o = blockwire(None, &["ctl", "--control", sock.to_str().unwrap(), "--json", method, params]);
    let out: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    match (o.status.success(), out.get("result")) {
        (true, Some(r)) => Ok(r.clone()),
        _ => Err(format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))),
    }
}

/// Start `serve` (`c`) and see whether it serves on `port` (then it is
/// stopped) or exits first: its stderr.
fn started_or_refused(mut c: Command, port: u16) -> Result<(), String> {
    let mut child = c.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            return Err(String::from_utf8_lossy(&child.wait_with_output().unwrap().stderr).into_owned());
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            // SAFETY: our own child, by PID.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
            return Ok(());
        }
        assert!(std::time::Instant::now() < deadline, "serve neither served nor exited in 60 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// serve with `args` must refuse to start, saying `why` (`what` names the
/// case in the problems), NVMe/TCP at `port` telling whether it started.
fn refuses_to_start(args: &[&str], port: u16, why: &str, what: &str, problems: &mut Vec<String>) {
    let mut c = Command::new(blockwire_bin());
    c.arg("serve").args(args);
    match started_or_refused(c, port) {
        Ok(()) => problems.push(format!("serve started {what}")),
        Err(e) if !e.contains(why) => problems.push(format!("{what}: refused without the reason ({why}): {e}")),
        Err(_) => {}
    }
}

/// `--rpc-http-credentials` in `dir` (cinder:s3cret-pass, root's, mode 600).
fn credentials(dir: &Path) -> std::path::PathBuf {
    let creds = dir.join("rpc.creds");
    std::fs::write(&creds, "cinder:s3cret-pass\n").unwrap();
    std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    creds
}

fn assert_none(what: &str, problems: Vec<String>) {
    assert!(problems.is_empty(), "{what}:\n- {}", problems.join("\n- "));
}

/// Class 1: files serve makes beside a volume, in a directory the
/// volume's user may write. That user plants a state naming a holder, a
/// link at the lock file and links at the temporaries (once serve's pid
/// is known); one host's commands must neither be fenced by the planted
/// state nor make root write through the links.
#[test]
fn hostile_files_beside_a_volume_are_never_followed_or_trusted() {
    require_root();
    let dir = TempDir::new("hn-beside");
    let d = dir.path();
    let theirs = nobody_dir(d, "theirs");
    let vol = theirs.join("v.img");
    std::fs::File::create(&vol).unwrap().set_len(8 << 20).unwrap();
    for v in ["victim-tmp", "victim-new"] {
        std::fs::write(d.join(v), "precious\n").unwrap();
    }
    let planted = state_json(1, &[(0x77, 7)], Some((0x77, 3)));
    nobody_sh(&format!("printf '%s' '{planted}' > {t}/v.img.pr && ln -s {d}/made-by-lock {t}/v.img.pr.lock", t = theirs.display(), d = d.display()));
    let np = free_port();
    let serve = Serve::with_config(&dir, &nvme_config(np, &[("v", format!("file:{}", vol.display()))], ""), &["--control", "none"]);
    let pid = serve.pid();
    nobody_sh(&format!(
        "ln -s {d}/victim-tmp {t}/v.img.pr.tmp{pid} && ln -s {d}/victim-new {t}/.v.img.pr.new-{pid}",
        t = theirs.display(),
        d = d.display()
    ));
    let mut host = Host::connect(np, 1);
    let mut problems = Vec::new();
    let w = host.write(1);
    if !w.is_success() {
        problems.push(format!("a state another user planted was taken: a write got {w}"));
    }
    for (what, st) in [("register", host.register(0xA)), ("preempt", host.preempt(0xA, 0x7, 1))] {
        if !st.is_success() && !conflict(st) {
            problems.push(format!("{what}: {st}"));
        }
    }
    for v in ["victim-tmp", "victim-new"] {
        let now = std::fs::read_to_string(d.join(v)).unwrap();
        if now != "precious\n" {
            problems.push(format!("{v}, behind a link at a temporary, was written: {now:?}"));
        }
    }
    if d.join("made-by-lock").exists() {
        problems.push("root made a file where the link at the lock file pointed".into());
    }
    drop(serve);
    assert_none("files beside a volume", problems);
}

/// Class 5: a state at the counter's maximum (crafted or damaged) and a
/// deleted volume's state left where a new volume is made.
#[test]
fn hostile_reservation_state_at_the_maximum_or_left_by_a_deleted_volume() {
    require_root();
    let dir = TempDir::new("hn-state");
    let d = dir.path();
    let vol = d.join("v.img");
    std::fs::File::create(&vol).unwrap().set_len(8 << 20).unwrap();
    // Host 1 holds Write Exclusive - Registrants Only (SPC type 5); host 3
    // is registered; the counter is at its maximum.
    std::fs::write(d.join("v.img.pr"), state_json(u64::MAX, &[(1, 0xA), (3, 0xC)], Some((1, 5)))).unwrap();
    let pool = format!("[[pool]]\nname = \"p\"\npath = \"{}/pool\"\n", d.display());
    let (serve, sock, np) = controlled(&dir, &[("v", format!("file:{}", vol.display()))], &pool);
    let (mut one, mut three) = (Host::connect(np, 1), Host::connect(np, 3));
    let mut problems = Vec::new();
    let w = three.write(1);
    if !w.is_success() {
        problems.push(format!("a registrant's write under registrants-only got {w}"));
    }
    let p = one.preempt(0xA, 0xC, 3);
    if !p.is_success() {
        problems.push(format!("the holder's preempt got {p}"));
    }
    if !conflict(three.write(1)) {
        problems.push("after a change past the counter's maximum, the preempted host still writes".into());
    }
    // A deleted volume's state left in the pool (a crash between removing
    // the file and its state, or an older blockwire): host 9 held it.
    std::fs::write(d.join("pool/x.img.pr"), state_json(4, &[(9, 0x9)], Some((9, 3)))).unwrap();
    match ctl(&sock, "volume_create", r#"{"name":"x","size":"4M","pool":"p"}"#).and_then(|_| ctl(&sock, "nvme_ns_add", &format!(r#"{{"nqn":"{NQN}","nsid":2,"volume":"x"}}"#))) {
        Err(e) => problems.push(format!("volume_create: {e}")),
        Ok(_) => {
            let w = Host::connect(np, 2).write(2);
            if !w.is_success() {
                problems.push(format!("the new volume inherited the deleted one's reservation: a write got {w}"));
            }
        }
    }
    drop(serve);
    assert_none("reservation state", problems);
}

/// Class 6: save_config over a file another user owns (handed to them, or
/// theirs), or into their directory; and credentials another user owns.
#[test]
fn hostile_secrets_never_go_where_another_user_reads_them() {
    require_root();
    let dir = TempDir::new("hn-secret");
    let d = dir.path();
    let sock = d.join("c.sock");
    let secret = "hostile-Chap-Secret-52";
    let cfg = format!(
        "[[volume]]\nname = \"a\"\nbackend = \"ram:1M\"\n[iscsi]\nlisten = [\"127.0.0.1:{}\"]\n[[iscsi.target]]\niqn = \"iqn.2026-11.org.blockwire:hn\"\nluns = [{{ lun = 0, volume = \"a\" }}]\nchap = {{ user = \"u\", secret = \"{secret}\" }}\n",
        free_port()
    );
    let serve = Serve::with_config(&dir, &cfg, &["--control", sock.to_str().unwrap()]);
    let mut problems = Vec::new();
    // A file the user owns, in a directory of root's.
    let handed = d.join("handed.toml");
    std::fs::write(&handed, "").unwrap();
    std::os::unix::fs::chown(&handed, Some(NOBODY), Some(NOBODY)).unwrap();
    match ctl(&sock, "save_config", &format!(r#"{{"path":"{}"}}"#, handed.display())) {
        Err(e) => problems.push(format!("save_config over a file another user owns was refused: {e}")),
        Ok(_) => {
            let read = as_nobody(Command::new("cat").arg(&handed)).output().unwrap();
            if String::from_utf8_lossy(&read.stdout).contains(secret) {
                problems.push("the other user reads the saved secrets".into());
            }
        }
    }
    // The user's own directory.
    let theirs = nobody_dir(d, "theirs");
    match ctl(&sock, "save_config", &format!(r#"{{"path":"{}/saved.toml"}}"#, theirs.display())) {
        Ok(_) => problems.push("save_config wrote the secrets into another user's directory".into()),
        Err(e) if !e.contains("owned by uid 65534") => problems.push(format!("refused without the reason: {e}")),
        Err(_) => {}
    }
    drop(serve);
    // Credentials for --rpc-http another user owns (mode 600: theirs to read).
    let creds = credentials(d);
    std::os::unix::fs::chown(&creds, Some(NOBODY), Some(NOBODY)).unwrap();
    let (np, hp) = (free_port(), free_port());
    let (listen, http) = (format!("127.0.0.1:{np}"), format!("127.0.0.1:{hp}"));
    let args = ["--volume", "a=ram:1M", "--nvme", &listen, "--control", "none", "--rpc-http", &http, "--rpc-http-credentials", creds.to_str().unwrap()];
    refuses_to_start(&args, np, "owned by root", "with --rpc-http credentials another user owns", &mut problems);
    assert_none("secrets", problems);
}

/// Class 8: temporaries a killed serve leaves (the configuration's and a
/// reservation state's, planted as a killed writer leaves them, and
/// whatever real kills during changes leave) are gone after a restart.
#[test]
fn hostile_kills_leave_no_temporary_files_after_a_restart() {
    require_root();
    let dir = TempDir::new("hn-kill");
    let d = dir.path();
    let sock = d.join("c.sock");
    let cfg = d.join("serve.toml");
    let np = free_port();
    std::fs::write(&cfg, nvme_config(np, &[], &format!("[[pool]]\nname = \"p\"\npath = \"{}/pool\"\n", d.display()))).unwrap();
    let start = || Serve::start(&["--config", cfg.to_str().unwrap(), "--control", sock.to_str().unwrap()]);
    let serve = start();
    ctl(&sock, "volume_create", r#"{"name":"v","size":"4M","pool":"p"}"#).unwrap();
    ctl(&sock, "nvme_ns_add", &format!(r#"{{"nqn":"{NQN}","nsid":1,"volume":"v"}}"#)).unwrap();
    // A reservation change, so the volume's state and lock exist.
    assert!(Host::connect(np, 1).register(0xA).is_success());
    drop(serve);
    let dead = dead_pid();
    for t in [d.join(format!(".serve.toml.new-{dead}")), d.join(format!("pool/.v.img.pr.new-{dead}")), d.join(format!("pool/v.img.pr.tmp{dead}"))] {
        std::fs::write(t, "torn").unwrap();
    }
    // Real kills during changes.
    for round in 0..3u64 {
        let serve = start();
        let mut call = Command::new(blockwire_bin())
            .args(["ctl", "--control", sock.to_str().unwrap(), "volume_create", &format!(r#"{{"name":"k{round}","size":"4M","pool":"p"}}"#)])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5 + 7 * round));
        serve.kill_now();
        let _ = call.wait();
    }
    let serve = start();
    // The volume still opens, its state with it.
    assert!(ctl(&sock, "volume_list", "{}").is_ok());
    let leftovers: Vec<String> = [d.to_path_buf(), d.join("pool")]
        .iter()
        .flat_map(|p| std::fs::read_dir(p).unwrap())
        .map(|e| e.unwrap().path().display().to_string())
        .filter(|p| p.contains(".new-") || p.contains(".pr.tmp"))
        .collect();
    drop(serve);
    assert!(leftovers.is_empty(), "temporaries left after a restart: {leftovers:?}");
}

/// Class 1, the control socket: its lock file beside it, in a directory
/// another user owns (a link planted there to a file root owns) or that
/// every user may write. serve must not start there, and the linked file
/// must stay as it was.
#[test]
fn hostile_control_socket_only_where_root_alone_writes() {
    require_root();
    let dir = TempDir::new("hn-sock");
    let d = dir.path();
    let theirs = nobody_dir(d, "run");
    std::fs::write(d.join("victim"), "precious\n").unwrap();
    nobody_sh(&format!("ln -s {}/victim {}/c.sock.lock", d.display(), theirs.display()));
    let shared = everyones_dir(d, "shared");
    let mut problems = Vec::new();
    for (sock, why) in [(theirs.join("c.sock"), "owned by uid 65534"), (shared.join("c.sock"), "may be written by every user")] {
        let np = free_port();
        let listen = format!("127.0.0.1:{np}");
        let what = format!("with its control socket {} where another user may write", sock.display());
        refuses_to_start(&["--volume", "a=ram:1M", "--nvme", &listen, "--control", sock.to_str().unwrap()], np, why, &what, &mut problems);
    }
    let now = std::fs::read_to_string(d.join("victim")).unwrap();
    if now != "precious\n" {
        problems.push(format!("the file behind a link at the socket's lock was emptied or written: {now:?}"));
    }
    assert_none("control socket", problems);
}

/// Class 2: pool_create on a directory every user may write, or another
/// user owns, is refused with the reason and changes nothing (and a
/// [[pool]] there keeps serve from starting); one serve makes is 700 root.
#[test]
fn hostile_pool_directories_others_may_write_are_refused() {
    require_root();
    let dir = TempDir::new("hn-pool");
    let d = dir.path();
    let (serve, sock, _) = controlled(&dir, &[("a", "ram:1M".into())], "");
    let shared = everyones_dir(d, "shared");
    let theirs = nobody_dir(d, "theirs");
    let mut problems = Vec::new();
    for (path, why) in [(&shared, "may be written by every user (mode 1777)"), (&theirs, "is owned by uid 65534")] {
        match ctl(&sock, "pool_create", &format!(r#"{{"name":"p{}","path":"{}"}}"#, why.len(), path.display())) {
            Ok(_) => problems.push(format!("pool_create took {}", path.display())),
            Err(e) if !e.contains(why) => problems.push(format!("{}: refused without the reason: {e}", path.display())),
            Err(_) => {}
        }
    }
    if ctl(&sock, "pool_list", "{}").map(|l| l.as_array().map(Vec::len)) != Ok(Some(0)) {
        problems.push("a refused pool_create changed the pool list".into());
    }
    ctl(&sock, "pool_create", &format!(r#"{{"name":"made","path":"{}/made/pool"}}"#, d.display())).unwrap();
    let m = std::fs::metadata(d.join("made/pool")).unwrap();
    if std::os::unix::fs::MetadataExt::mode(&m) & 0o7777 != 0o700 || std::os::unix::fs::MetadataExt::uid(&m) != 0 {
        problems.push(format!("a pool directory serve made is {:o}", std::os::unix::fs::MetadataExt::mode(&m)));
    }
    drop(serve);
    // At start.
    let np = free_port();
    std::fs::write(d.join("start.toml"), nvme_config(np, &[], &format!("[[pool]]\nname = \"p\"\npath = \"{}\"\n", shared.display()))).unwrap();
    let start = d.join("start.toml");
    let args = ["--config", start.to_str().unwrap(), "--control", "none"];
    refuses_to_start(&args, np, "may be written by every user", "with a [[pool]] every user may write", &mut problems);
    assert_none("pool directories", problems);
}

/// Class 3: connections that send a request line and then nothing, from
/// one address or from fifty, keep no client that authenticates out of
/// the control methods over HTTP, nor a scrape out of the metrics. The
/// idle connections are all connected before the client is: the server
/// accepts in that order, so what happens is decided by the connections'
/// state, not by time.
#[test]
fn hostile_idle_http_connections_keep_no_client_out() {
    use std::io::{Read, Write};
    require_root();
    let dir = TempDir::new("hn-http");
    let d = dir.path();
    let creds = credentials(d);
    let (hp, mp) = (free_port(), free_port());
    let _serve = Serve::start(&[
        "--volume", "a=ram:1M", "--nvme", &format!("127.0.0.1:{}", free_port()), "--control", "none",
        "--rpc-http", &format!("127.0.0.1:{hp}"), "--rpc-http-credentials", creds.to_str().unwrap(), "--metrics", &format!("127.0.0.1:{mp}"),
    ]);
    let connect_from = |port: u16, from: u8| {
        let s = tcp_connect_from(port, from).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
        s
    };
    let ask = |port: u16, from: u8, req: &str| {
        let mut s = connect_from(port, from);
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.lines().next().unwrap_or("(no answer)").to_string()
    };
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"status"}"#;
    let call = format!("POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Basic Y2luZGVyOnMzY3JldC1wYXNz\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    let scrape = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut problems = Vec::new();
    for (what, port, req) in [("rpc-http", hp, call.as_str()), ("metrics", mp, scrape)] {
        let mut idle = Vec::new();
        for _ in 0..40 {
            let mut s = connect_from(port, 5);
            let _ = s.write_all(b"POST / HTTP/1.1\r\n");
            idle.push(s);
        }
        let got = ask(port, 9, req);
        if got != "HTTP/1.1 200 OK" {
            problems.push(format!("{what}: with 40 idle connections from one address, a client got {got}"));
        }
        for from in 10..60 {
            let mut s = connect_from(port, from);
            let _ = s.write_all(b"POST / HTTP/1.1\r\n");
            idle.push(s);
        }
        let got = ask(port, 9, req);
        if got != "HTTP/1.1 200 OK" {
            problems.push(format!("{what}: with an idle connection from each of 50 addresses, a client got {got}"));
        }
    }
    assert_none("HTTP admission", problems);
}

/// Class 4: drain with a timeout whose deadline overflows is refused
/// before any path changes (it set every path inaccessible, then
/// panicked); the same for the other parameters a caller sends into
/// arithmetic.
#[test]
fn hostile_huge_parameters_are_refused_before_anything_changes() {
    require_root();
    let dir = TempDir::new("hn-huge");
    let (serve, sock, np) = controlled(&dir, &[("a", "ram:1M".into())], "");
    let mut host = Host::connect(np, 1);
    let mut problems = Vec::new();
    let before = ctl(&sock, "status", "{}").unwrap();
    for (method, params) in [
        ("drain", r#"{"timeout_s":18446744073709551615}"#),
        ("drain", r#"{"timeout_s":9223372036854775807}"#),
        ("volume_resize", r#"{"name":"a","size":18446744073709551104}"#),
        ("bdev_lvol_resize", r#"{"name":"a","size_in_mib":18446744073709551615}"#),
        ("iscsi_target_add", r#"{"iqn":"iqn.2026-11.org.blockwire:huge","luns":[{"lun":18446744073709551615,"volume":"a"}]}"#),
        ("ana_set", &format!(r#"{{"nqn":"{NQN}","group":4294967295,"state":"inaccessible"}}"#)),
    ] {
        if let Ok(r) = ctl(&sock, method, params) {
            problems.push(format!("{method} {params} was taken: {r}"));
        }
    }
    let w = host.write(1);
    if !w.is_success() {
        problems.push(format!("a refused call changed the paths: a write now gets {w}"));
    }
    let after = ctl(&sock, "status", "{}").unwrap();
    if after["volumes"] != before["volumes"] || after["iscsi_targets"] != before["iscsi_targets"] {
        problems.push(format!("a refused call changed the configuration: {before} -> {after}"));
    }
    drop(serve);
    assert_none("huge parameters", problems);
}

/// Class 7: one file is one volume, whatever the spelling (another
/// volume's file by `./`, a pool's file from outside the pool); a comma
/// in a file name is a name, not options; control characters are
/// refused in every name.
#[test]
fn hostile_spellings_of_files_and_names_are_refused() {
    require_root();
    let dir = TempDir::new("hn-spell");
    let d = dir.path();
    let data = d.join("data");
    std::fs::File::create(&data).unwrap().set_len(8 << 20).unwrap();
    let pool = format!("[[pool]]\nname = \"p\"\npath = \"{}/pool\"\n", d.display());
    let (serve, sock, _) = controlled(&dir, &[("d", format!("file:{}", data.display()))], &pool);
    ctl(&sock, "volume_create", r#"{"name":"x","size":"4M","pool":"p"}"#).unwrap();
    let mut problems = Vec::new();
    let dn = d.display();
    for (method, params) in [
        ("volume_add", format!(r#"{{"name":"y","backend":"file:{dn}/pool/./x.img"}}"#)),
        ("bdev_aio_create", format!(r#"{{"name":"z","filename":"{dn}/pool/x.img"}}"#)),
        ("bdev_aio_create", format!(r#"{{"name":"z2","filename":"{dn}/./data"}}"#)),
        ("bdev_aio_create", format!(r#"{{"name":"c","filename":"{dn}/data,size=64M"}}"#)),
        ("volume_add", r#"{"name":"a\nb","backend":"ram:1M"}"#.to_string()),
        ("volume_add", r#"{"name":"n","backend":"file:/tmp/x\u0000.img,size=1M"}"#.to_string()),
        ("iscsi_target_add", "{\"iqn\":\"iqn.2026-11.org.blockwire:t\\u0000\",\"luns\":[]}".to_string()),
        ("nvme_host_add", format!("{{\"nqn\":\"{NQN}\",\"host\":\"nqn.x:h\\nINJECTED\"}}")),
    ] {
        if let Ok(r) = ctl(&sock, method, &params) {
            problems.push(format!("{method} {params} was taken: {r}"));
        }
    }
    if std::fs::metadata(&data).unwrap().len() != 8 << 20 {
        problems.push(format!("{} was grown by a name with a comma", data.display()));
    }
    let names: Vec<String> = ctl(&sock, "volume_list", "{}").unwrap().as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap().to_string()).collect();
    if names != ["d", "x"] {
        problems.push(format!("volumes now: {names:?}"));
    }
    if ctl(&sock, "volume_delete", r#"{"name":"x"}"#).is_err() || d.join("pool/x.img").exists() {
        problems.push("the pool volume did not go with its file".into());
    }
    drop(serve);
    assert_none("spellings", problems);
}

/// Class 9: whoever holds the --rpc-http credentials can export any file
/// and overwrite any regular file, unless `[control] allowed_paths`
/// confines backing files and save_config targets (pools are always
/// allowed): a file outside, a link inside to a file outside, a pool
/// outside are refused; inside, and in a pool, taken.
#[test]
fn hostile_credentials_are_confined_to_allowed_paths() {
    require_root();
    let dir = TempDir::new("hn-allow");
    let d = dir.path();
    let allowed = d.join("allowed");
    std::fs::create_dir(&allowed).unwrap();
    std::fs::File::create(allowed.join("a.img")).unwrap().set_len(1 << 20).unwrap();
    std::fs::create_dir(d.join("outside")).unwrap();
    std::fs::File::create(d.join("outside/secret.img")).unwrap().set_len(1 << 20).unwrap();
    std::os::unix::fs::symlink(d.join("outside/secret.img"), allowed.join("link.img")).unwrap();
    let creds = credentials(d);
    let hp = free_port();
    let extra = format!("[[pool]]\nname = \"p\"\npath = \"{}/pool\"\n[control]\nallowed_paths = [\"{}\"]\n", d.display(), allowed.display());
    let _serve = Serve::with_config(&dir, &nvme_config(free_port(), &[], &extra), &["--control", "none", "--rpc-http", &format!("127.0.0.1:{hp}"), "--rpc-http-credentials", creds.to_str().unwrap()]);
    let call = |method: &str, params: String| -> Value {
        let body = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{params}}}"#);
        let answer = http_post_from(hp, 1, Some("cinder:s3cret-pass"), &body);
        serde_json::from_str(answer.split_once("\r\n\r\n").map_or("", |(_, b)| b)).unwrap_or(Value::String(answer))
    };
    let mut problems = Vec::new();
    let dn = d.display();
    for (method, params, want) in [
        ("bdev_aio_create", r#"{"name":"shadow","filename":"/etc/shadow"}"#.to_string(), false),
        ("bdev_aio_create", format!(r#"{{"name":"o","filename":"{dn}/outside/secret.img"}}"#), false),
        ("bdev_aio_create", format!(r#"{{"name":"l","filename":"{dn}/allowed/link.img"}}"#), false),
        ("volume_add", format!(r#"{{"name":"o2","backend":"file:{dn}/allowed/../outside/secret.img"}}"#), false),
        ("save_config", format!(r#"{{"path":"{dn}/outside/x.toml"}}"#), false),
        ("pool_create", format!(r#"{{"name":"q","path":"{dn}/outside/q"}}"#), false),
        ("bdev_aio_create", format!(r#"{{"name":"a","filename":"{dn}/allowed/a.img"}}"#), true),
        ("save_config", format!(r#"{{"path":"{dn}/allowed/saved.toml"}}"#), true),
        ("bdev_lvol_create", r#"{"lvol_name":"v","size_in_mib":4,"lvs_name":"p"}"#.to_string(), true),
    ] {
        let r = call(method, params.clone());
        match (want, r.get("result").is_some()) {
            (false, true) => problems.push(format!("{method} {params} was taken outside allowed_paths: {r}")),
            (true, false) => problems.push(format!("{method} {params} was refused: {r}")),
            (false, false) if !r.to_string().contains("allowed_paths") => problems.push(format!("{method} {params}: refused without the reason: {r}")),
            _ => {}
        }
    }
    if d.join("outside/x.toml").exists() || d.join("outside/q").exists() {
        problems.push("a file or directory was made outside allowed_paths".into());
    }
    assert_none("allowed_paths", problems);
}
