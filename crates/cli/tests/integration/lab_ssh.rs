//! The lab across machines, with two "hosts" made of network namespaces:
//! the target namespace runs its own sshd (Debian's openssh-server, a
//! throwaway host key and an authorized key made here), the lab runs in the
//! client namespace (sharing this machine's mounts) and reaches the target
//! over a veth on a storage subnet with `--target-host ssh://root@ADDR`.
//! A quick run writes the results schema and report sections a local run
//! writes (plus the host section); SIGINT mid-run and a killed sshd stop the
//! run with its samples kept; afterwards no process, file, mount or
//! namespace of the run is left on either side (a later run undoes what the
//! cut connection left on the target). The namespaces share this machine's
//! file system, so the target's private directory (/var/tmp/bwlab-remote)
//! and files (bwlab-remote-*) are checked here. Needs root.

use crate::common;

use common::{blockwire_bin, require_root, unique};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";
const TARGET_IP: &str = "10.231.0.1";
const CLIENT_IP: &str = "10.231.0.2";
/// ssh's ConnectTimeout for the kernel VM's guest (its CPU is emulated).
const GUEST_CONNECT_TIMEOUT_S: u32 = 120;

/// ssh options for the kernel VM tests' guest, keyed by the rig's `dir`.
/// The guest's CPU is emulated: on a busy machine its sshd has taken more
/// than the lab's default 10 s to send its banner (CI, 2026-11-28); a
/// user's option comes first and wins.
fn guest_ssh_options(dir: &Path) -> Vec<String> {
    let key = dir.join("client").display().to_string();
    vec!["StrictHostKeyChecking=no".into(), "UserKnownHostsFile=/dev/null".into(), format!("IdentityFile={key}"), "LogLevel=ERROR".into(), format!("ConnectTimeout={GUEST_CONNECT_TIMEOUT_S}")]
}

/// `line` run in the kernel VM's guest over its forwarded ssh `port`
/// (None: ssh failed).
fn in_guest(dir: &Path, port: u16, line: &str) -> Option<String> {
    let mut c = Command::new("ssh");
    c.args(["-o", "BatchMode=yes", "-p", &port.to_string()]);
    for o in guest_ssh_options(dir) {
        c.arg("-o").arg(o);
    }
    let out = c.args(["root@127.0.0.1", line]).stdin(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc").unwrap().flatten().filter_map(|e| e.file_name().to_string_lossy().parse().ok()).collect()
}

fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split_whitespace().nth(1)?.parse().ok()
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline")).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default()
}

/// `pid` and everything below it.
fn tree(pid: u32) -> Vec<u32> {
    let pids = all_pids();
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(pids.iter().copied().filter(|&c| ppid(c) == Some(p)));
        i += 1;
    }
    out
}

fn kill(pids: &[u32], sig: i32) {
    for &p in pids {
        // SAFETY: kill(2) on processes this test started (or their children).
        unsafe {
            libc::kill(p as i32, sig);
        }
    }
}

/// In `dir`: a throwaway host key (`host`), a client key (`client`)
/// authorized for root, and an sshd_config listening on `listen`.
pub(crate) fn ssh_keys_and_config(dir: &Path, listen: &str) {
    for k in ["host", "client"] {
        run(&["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bwlab-test", "-f", &dir.join(k).to_string_lossy()]);
    }
    std::fs::copy(dir.join("client.pub"), dir.join("authorized_keys")).unwrap();
    // A HOME of the sessions' own (root's ~/.bashrc here runs `pyenv
    // init`, which can hang on a stale shim), whose ~/.bashrc, sourced by
    // Debian's bash for ssh commands, prints on stdout as a user's profile
    // may: JSON-like noise without a newline and a byte that is no UTF-8
    // before the command, and an EXIT trap's goodbye after it. The lab
    // must read its programs' reports past both (ssh::FRAME_MARK).
    std::fs::create_dir_all(dir.join("home")).unwrap();
    std::fs::write(
        dir.join("home/.bashrc"),
        b"printf 'profile says hello \xe9 {\"not\": \"a report\"}'\ntrap 'echo \"bye {\\\"not\\\": 2}\"' EXIT\n",
    )
    .unwrap();
    let d = dir.display();
    std::fs::write(
        dir.join("sshd_config"),
        format!(
            "ListenAddress {listen}\nHostKey {d}/host\nAuthorizedKeysFile {d}/authorized_keys\nPermitRootLogin prohibit-password\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\nMaxSessions 20\n\
             SetEnv HOME={d}/home\n"
        ),
    )
    .unwrap();
}

/// Two namespaces joined by a veth, sshd in the target one.
struct Hosts {
    dir: PathBuf,
    target_ns: String,
    client_ns: String,
    sshd: Option<Child>,
    /// sshd in the client namespace (`--client-host`), sharing this
    /// machine's mounts and cgroups.
    client_sshd: Option<Child>,
}

impl Hosts {
    fn new(tag: &str) -> Hosts {
        require_root();
        assert!(Path::new(SSHD).exists(), "{SSHD} is missing: install openssh-server (make deps)");
        let id = unique(tag);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ssh-{id}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let h = Hosts { dir: dir.clone(), target_ns: format!("bwsT{id}"), client_ns: format!("bwsC{id}"), sshd: None, client_sshd: None };
        ssh_keys_and_config(&dir, TARGET_IP);
        let (tv, cv) = (format!("{}v", &h.target_ns), format!("{}v", &h.client_ns));
        run(&["ip", "netns", "add", &h.target_ns]);
        run(&["ip", "netns", "add", &h.client_ns]);
        run(&["ip", "link", "add", &tv, "netns", &h.target_ns, "type", "veth", "peer", "name", &cv, "netns", &h.client_ns]);
        for (ns, dev, ip) in [(&h.target_ns, &tv, TARGET_IP), (&h.client_ns, &cv, CLIENT_IP)] {
            run(&["ip", "-n", ns, "addr", "add", &format!("{ip}/24"), "dev", dev]);
            run(&["ip", "-n", ns, "link", "set", dev, "up"]);
            run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        let mut h = h;
        h.start_sshd();
        h
    }

    fn start_sshd(&mut self) {
        // sshd's privilege separation directory (made by the package's
        // service, which is never started here).
        std::fs::create_dir_all("/run/sshd").unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.target_ns, SSHD, "-D", "-f"])
            .arg(self.dir.join("sshd_config"))
            .arg("-E")
            .arg(self.dir.join("sshd.log"))
            .stdin(Stdio::null())
            .spawn()
            .expect("start sshd");
        self.sshd = Some(child);
        // Ready once it accepts a login.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.ssh_ok() {
            assert!(Instant::now() < deadline, "sshd did not accept a login: {}", std::fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn ssh_ok(&self) -> bool {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.client_ns)).args(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=2"]);
        for o in self.ssh_options() {
            c.arg("-o").arg(o);
        }
        c.args([&format!("root@{TARGET_IP}"), "true"]).stdout(Stdio::null()).stderr(Stdio::null());
        c.status().is_ok_and(|s| s.success())
    }

    /// A second sshd, in the client namespace on CLIENT_IP, entered with
    /// nsenter (not `ip netns exec`, which gives it a mount namespace and a
    /// /sys of its own, without the cgroup mounts): the client host's
    /// mounts and memory cgroups are this machine's, where the test sees them.
    fn start_client_sshd(&mut self) {
        let conf = std::fs::read_to_string(self.dir.join("sshd_config")).unwrap().replace(TARGET_IP, CLIENT_IP);
        std::fs::write(self.dir.join("sshd_client_config"), conf).unwrap();
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.client_ns))
            .args([SSHD, "-D", "-f"])
            .arg(self.dir.join("sshd_client_config"))
            .arg("-E")
            .arg(self.dir.join("sshd_client.log"))
            .stdin(Stdio::null())
            .spawn()
            .expect("start the client's sshd");
        self.client_sshd = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/run/netns/{}", self.client_ns)).args(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=2"]);
            for o in self.ssh_options() {
                c.arg("-o").arg(o);
            }
            c.args([&format!("root@{CLIENT_IP}"), "true"]).stdout(Stdio::null()).stderr(Stdio::null());
            if c.status().is_ok_and(|s| s.success()) {
                break;
            }
            assert!(Instant::now() < deadline, "the client's sshd did not accept a login: {}", std::fs::read_to_string(self.dir.join("sshd_client.log")).unwrap_or_default());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// sshd and every session under it, killed (a dropped connection).
    fn kill_sshd(&mut self) {
        if let Some(mut c) = self.sshd.take() {
            kill(&tree(c.id()), libc::SIGKILL);
            let _ = c.wait();
        }
    }

    fn ssh_options(&self) -> Vec<String> {
        vec![
            format!("IdentityFile={}", self.dir.join("client").display()),
            "IdentitiesOnly=yes".into(),
            "StrictHostKeyChecking=no".into(),
            "UserKnownHostsFile=/dev/null".into(),
            "LogLevel=ERROR".into(),
        ]
    }

    /// `blockwire lab ARGS --target-host ...` in the client namespace,
    /// sharing this machine's mounts (nsenter enters only the network).
    fn lab(&self, out: &Path, args: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.client_ns)).arg(blockwire_bin()).arg("lab").args(common::LAB_AT_ONCE).args(args);
        c.args(["--target-host", &format!("ssh://root@{TARGET_IP}")]);
        for o in self.ssh_options() {
            c.arg("--ssh-option").arg(o);
        }
        c.arg("--out").arg(out);
        c
    }

    /// Processes in the target namespace other than the sshd listener.
    fn target_processes(&self) -> Vec<String> {
        let listener = self.sshd.as_ref().map(|c| c.id());
        let Some(ns) = ino(&format!("/run/netns/{}", self.target_ns)) else {
            return vec![];
        };
        all_pids()
            .into_iter()
            .filter(|&p| Some(p) != listener && ino(&format!("/proc/{p}/ns/net")) == Some(ns))
            .map(|p| format!("{p}: {}", cmdline(p)))
            .collect()
    }

    /// [`Hosts::leftovers`] once the sessions had a moment to close.
    fn settled_leftovers(&self, lab_pid: u32) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let left = self.leftovers(lab_pid);
            if left.is_empty() || Instant::now() > deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Everything of a lab run with PID `lab_pid` still around on either
    /// side. Runs of other tests share this file system: only this run's
    /// names count (its run id ends in `-PID`), and the binary's directory
    /// (shared by runs of one version) only when no other run is live.
    fn leftovers(&self, lab_pid: u32) -> Vec<String> {
        let mut left = bw_lab::network::topology::leftovers(lab_pid);
        left.extend(self.target_processes().into_iter().map(|p| format!("process on the target: {p}")));
        let remote_dir = Path::new("/var/tmp/bwlab-remote");
        let entries: Vec<String> = std::fs::read_dir(remote_dir).into_iter().flatten().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        let others_live = entries.iter().any(|n| n.starts_with("state-") && !n.ends_with(&format!("-{lab_pid}")));
        for n in &entries {
            let ours = n.starts_with("state-") && n.ends_with(&format!("-{lab_pid}"));
            if ours || (n.starts_with("bin-") && !others_live) {
                left.push(format!("{}/{n}", remote_dir.display()));
            }
        }
        for dir in ["/dev/shm", "/tmp"] {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if (n.starts_with("bwlab-remote-") && n.contains(&format!("-{lab_pid}-"))) || n.starts_with(&format!("bwlab-{lab_pid}-")) {
                    left.push(format!("file {}", e.path().display()));
                }
            }
        }
        left
    }
}

/// The inode of `path` (a namespace file: same inode, same namespace).
fn ino(path: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // What a run of a failed test left on these "hosts" (their state
        // files name their network namespace): no later test's run sees
        // these namespaces again, so none would undo it.
        let ids: Vec<String> = [&self.target_ns, &self.client_ns]
            .iter()
            .filter_map(|ns| ino(&format!("/run/netns/{ns}")).map(|i| format!("host net:[{i}]")))
            .collect();
        for e in std::fs::read_dir("/var/tmp/bwlab-remote").into_iter().flatten().flatten() {
            let f = e.path();
            let ours = std::fs::read_to_string(&f).is_ok_and(|t| t.lines().next().is_some_and(|l| ids.iter().any(|i| i == l)));
            if ours && f.file_name().is_some_and(|n| n.to_string_lossy().starts_with("state-")) {
                let _ = Command::new("sh").args(["-c", bw_lab::hosts::state_file::CLEANUP_SCRIPT, "sh"]).arg(&f).arg("stale").output();
            }
        }
        self.kill_sshd();
        if let Some(mut c) = self.client_sshd.take() {
            kill(&tree(c.id()), libc::SIGKILL);
            let _ = c.wait();
        }
        for ns in [&self.target_ns, &self.client_ns] {
            // Whatever a failed test left inside, by PID, then the namespace.
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                let pids: Vec<u32> = String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect();
                kill(&pids, libc::SIGKILL);
            }
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What listens on port 22 of this machine (the package's own sshd is
/// never started by these tests; theirs live in a namespace).
fn host_sshd_listeners() -> String {
    run(&["ss", "-ltnH", "sport = :22"])
}

fn out_dir(tag: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("lab-ssh-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Wait for the lab (at most `limit`, then it is killed and the test
/// fails); its status and stderr.
pub(crate) fn wait_done(child: &mut Child, limit: Duration, what: &str) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    // Read stderr as it comes: a full pipe would stall the lab.
    let mut err_pipe = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            kill(&[child.id()], libc::SIGKILL);
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}: {}", reader.join().unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (st, reader.join().unwrap_or_default())
}

/// The `<section id=...>`s of a report.
fn sections(report: &Path) -> Vec<String> {
    let html = std::fs::read_to_string(report).unwrap();
    html.split("<section id=\"").skip(1).map(|s| s.split('"').next().unwrap().to_string()).collect()
}

fn keys(v: &serde_json::Value) -> std::collections::BTreeSet<String> {
    v.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default()
}

const SMALL: &[&str] = &[
    "--quick", "--protocols", "iscsi,aoe", "--peers", "vblade", "--suite", "net,micro,fs", "--repeat", "1", "--size", "32M",
    "--runtime", "1", "--client-mem", "128M", "--fs-workloads", "varmail", "--fs-runtime", "1", "--no-baseline",
];

#[test]
fn remote_quick_lab_writes_what_a_local_one_does_and_leaves_nothing() {
    let port22 = host_sshd_listeners();
    let hosts = Hosts::new("q");
    let out = out_dir("remote");
    let mut child = hosts.lab(&out, SMALL).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let lab_pid = child.id();
    let (st, stderr) = wait_done(&mut child, Duration::from_secs(600), "the remote lab");
    assert!(st.success(), "remote lab failed: {stderr}");
    assert!(!stderr.contains("lab: cleanup:"), "cleanup reported problems: {stderr}");
    let left = hosts.settled_leftovers(lab_pid);
    assert!(left.is_empty(), "the remote lab left things behind: {left:#?}");

    // The same, on this machine's namespaces.
    let local_out = out_dir("local");
    let st = Command::new(blockwire_bin()).arg("lab").args(common::LAB_AT_ONCE).args(SMALL).arg("--out").arg(&local_out).stdout(Stdio::null()).stderr(Stdio::null()).status().unwrap();
    assert!(st.success(), "the local lab failed");

    let load = |d: &Path| -> serde_json::Value { serde_json::from_str(&std::fs::read_to_string(d.join("results.json")).unwrap()).unwrap() };
    let (remote, local) = (load(&out), load(&local_out));
    let (rk, lk) = (keys(&remote), keys(&local));
    assert!(lk.is_subset(&rk), "results.json keys: local {lk:?}, remote {rk:?}");
    for k in ["samples", "fs", "net"] {
        let r = &remote[k][0];
        assert!(r.is_object(), "the remote run has no {k} record: {remote}");
        assert_eq!(keys(r), keys(&local[k][0]), "a {k} record's fields differ");
    }
    for s in remote["subjects"].as_array().unwrap() {
        assert!(s["unavailable"].is_null(), "a subject was unavailable over ssh: {s}");
        assert!(s["initiator"].as_str().unwrap().contains("blockwire"), "{s}");
    }
    let hosts_rec = remote["hosts"].as_array().expect("host records");
    assert_eq!(hosts_rec.len(), 2);
    assert_eq!(hosts_rec[0]["role"], "target");
    assert_eq!(hosts_rec[0]["address"], format!("ssh://root@{TARGET_IP}"));
    assert!(hosts_rec[0]["cpus"].as_u64().unwrap() > 0 && hosts_rec[0]["mtu"].as_u64() == Some(1500), "{hosts_rec:?}");
    assert!(remote["ssh_commands"].as_u64().unwrap() > 0);
    let (rs, ls) = (sections(&out.join("report.html")), sections(&local_out.join("report.html")));
    for s in &ls {
        assert!(rs.contains(s), "the remote report lacks section {s} (remote {rs:?}, local {ls:?})");
    }
    assert!(rs.contains(&"hosts".to_string()), "no host section: {rs:?}");
    assert!(out.join("results.csv").exists() && out.join("results-fs.csv").exists());
    assert_eq!(host_sshd_listeners(), port22, "a new listener on this machine's port 22");
}

/// Start a remote micro run long enough to be cut, and wait for its first sample.
fn start_cuttable(hosts: &Hosts, out: &Path) -> Child {
    // The first sample is saved once every subject ran the first workload
    // `--repeat` times; three more workloads follow to be cut.
    let args = ["--suite", "micro", "--protocols", "iscsi,nvme", "--peers", "tgt", "--repeat", "3", "--size", "16M", "--runtime", "1"];
    start_and_wait_first_sample(hosts, out, &args)
}

/// Start a remote run with `args` and wait for its first saved sample.
fn start_and_wait_first_sample(hosts: &Hosts, out: &Path, args: &[&str]) -> Child {
    let mut child = hosts.lab(out, args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let n = std::fs::read_to_string(out.join("results.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["samples"].as_array().map(|a| a.len()))
            .unwrap_or(0);
        if n > 0 {
            break;
        }
        if child.try_wait().unwrap().is_some() {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
            panic!("the lab ended before its first sample: {err}");
        }
        assert!(Instant::now() < deadline, "no sample within 5 minutes");
        std::thread::sleep(Duration::from_millis(200));
    }
    child
}

fn saved(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap()
}

#[test]
fn sigint_stops_a_remote_lab_and_leaves_nothing() {
    let hosts = Hosts::new("i");
    let out = out_dir("sigint");
    let mut child = start_cuttable(&hosts, &out);
    let lab_pid = child.id();
    kill(&[lab_pid], libc::SIGINT);
    let (st, stderr) = wait_done(&mut child, Duration::from_secs(60), "the interrupted remote lab");
    assert!(!st.success(), "an interrupted lab must not report success");
    assert!(stderr.contains("SIGINT"), "{stderr}");
    assert!(!stderr.contains("lab: cleanup:"), "cleanup reported problems: {stderr}");
    let r = saved(&out);
    assert_eq!(r["aborted"], "interrupted");
    assert!(!r["samples"].as_array().unwrap().is_empty(), "the samples taken were lost");
    let left = hosts.settled_leftovers(lab_pid);
    assert!(left.is_empty(), "the interrupted remote lab left things behind: {left:#?}");
}

#[test]
fn a_dropped_connection_stops_the_run_and_the_next_run_cleans_up() {
    let mut hosts = Hosts::new("k");
    let out = out_dir("dropped");
    let mut child = start_cuttable(&hosts, &out);
    let lab_pid = child.id();
    hosts.kill_sshd();
    let (st, stderr) = wait_done(&mut child, Duration::from_secs(90), "the lab after its connection dropped");
    assert!(!st.success(), "a lab that lost its target must not report success");
    let r = saved(&out);
    let why = r["aborted"].as_str().unwrap_or_default();
    assert!(why.contains("lost the ssh connection"), "aborted: {why:?}; {stderr}");
    assert!(!r["samples"].as_array().unwrap().is_empty(), "the samples taken were lost");
    // The services died with their sessions.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !hosts.target_processes().is_empty() {
        assert!(Instant::now() < deadline, "processes outlived their ssh session: {:?}", hosts.target_processes());
        std::thread::sleep(Duration::from_millis(200));
    }
    // What the cut run could not remove (its backing file, the binary, the
    // state file) goes with the next run on that host.
    assert!(
        std::fs::read_dir("/var/tmp/bwlab-remote").unwrap().flatten().any(|e| e.file_name().to_string_lossy().ends_with(&format!("-{lab_pid}"))),
        "expected the cut run's state file on the target"
    );
    hosts.start_sshd();
    let out2 = out_dir("after-drop");
    let mut next = hosts
        .lab(&out2, &["--suite", "micro", "--protocols", "nvme", "--peers", "none", "--repeat", "1", "--size", "8M", "--runtime", "1", "--quick"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let next_pid = next.id();
    let (st, stderr) = wait_done(&mut next, Duration::from_secs(300), "the run after the drop");
    assert!(st.success(), "{stderr}");
    // This run undid it (it says "undid what an interrupted run left"),
    // unless another test's run on this shared file system came first.
    let mut left = hosts.settled_leftovers(next_pid);
    left.extend(hosts.leftovers(lab_pid));
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// The connection to the target host cut in the middle of a case (sshd and
/// every session killed): the run stops with the case it finished. The host
/// may go on holding a session of the cut run (an sshd that did not notice
/// a silent cut keeps it, and its lock on the state file, for hours): here
/// a `flock` holding that lock stands for it. `--resume` alone (the stored
/// plan, hosts and ssh options) finds the state file's owner, the cut run,
/// gone, takes the lock from that session, undoes what the cut run left on
/// the host (saying so), keeps the finished case, measures the cut one
/// again whole and the rest; results.json has every case, and nothing of
/// either run is left on either side.
#[test]
fn a_cut_connection_then_resume_goes_on_and_leaves_nothing() {
    let t0 = Instant::now();
    let mut hosts = Hosts::new("r");
    let out = out_dir("cut-resume");
    let args = [
        "--quick", "--suite", "micro", "--protocols", "nvme", "--peers", "none", "--repeat", "2", "--size", "8M", "--runtime", "1",
        "--micro-workloads", "randread-4k-qd1,seqread-1m,randread-4k-qd32",
    ];
    let mut first = hosts.lab(&out, &args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let pid1 = first.id();
    let deadline = Instant::now() + Duration::from_secs(300);
    while !crate::lab_endings::in_second_case(&out) {
        assert!(first.try_wait().unwrap().is_none(), "the lab ended before its second case");
        assert!(Instant::now() < deadline, "not in its second case within 5 minutes");
        std::thread::sleep(Duration::from_millis(50));
    }
    hosts.kill_sshd();
    let (st, stderr) = wait_done(&mut first, Duration::from_secs(90), "the lab after its connection was cut");
    assert!(!st.success());
    assert!(saved(&out)["aborted"].as_str().unwrap_or_default().contains("lost the ssh connection"), "{stderr}");
    let state = std::fs::read_dir("/var/tmp/bwlab-remote")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().ends_with(&format!("-{pid1}")))
        .expect("the cut run's state file on the target");
    let mut session = Killed(
        Command::new("ip")
            .args(["netns", "exec", &hosts.target_ns, "flock", "-x"])
            .arg(&state)
            .args(["sh", "-c", "read -r _"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let locked = || !Command::new("flock").arg("-n").arg(&state).arg("true").status().unwrap().success();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !locked() {
        assert!(Instant::now() < deadline, "the stand-in session did not take the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    hosts.start_sshd();
    let mut again = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", hosts.client_ns))
        .arg(blockwire_bin())
        .arg("lab")
        .args(common::LAB_AT_ONCE)
        .arg("--resume")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid2 = again.id();
    let (st, stderr) = wait_done(&mut again, Duration::from_secs(300), "the resumed run");
    assert!(st.success(), "{stderr}");
    let swept = stderr.lines().find(|l| l.contains(&format!("PID {pid1} on"))).unwrap_or_else(|| panic!("no word of the cut run's leftovers: {stderr}"));
    assert!(swept.contains(&format!("ssh://root@{TARGET_IP}: undid what an interrupted run left")) && swept.contains("the host still held its session"), "{swept}");
    assert!(swept.contains("backing.img"), "the cut run's backing file was not found there: {swept}");
    let held = session.0.try_wait().unwrap();
    assert!(held.is_some_and(|s| !s.success()), "the orphaned session's lock holder was left running");
    assert!(stderr.contains("lab: resuming (start 2): 1 of 3 cases finished in earlier starts are kept"), "{stderr}");
    let r = crate::lab_endings::check_schema(&out.join("results.json"));
    assert!(r.aborted.is_none(), "{:?}", r.aborted);
    let origin: Vec<u32> = r.resumed.as_ref().expect("resumed").cases.iter().map(|c| c.start).collect();
    assert_eq!(origin, [1, 2, 2]);
    assert_eq!(r.samples.len(), 6, "three workloads, two repetitions, one start each");
    assert_eq!(r.hosts.len(), 2, "the hosts of the first start");
    let mut left = hosts.settled_leftovers(pid2);
    left.extend(hosts.leftovers(pid1).into_iter().filter(|l| !l.contains(&format!("bwlab-{pid1}-ssh-"))));
    assert!(left.is_empty(), "left behind: {left:#?}");
    eprintln!("cut and resumed over ssh in {:?}", t0.elapsed());
}

/// A child killed when the test is done with it (or failed halfway).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Mounts, attach daemons and attach state of a remote fs suite of the
/// run with `lab_pid` on the client host (this machine's mounts: its sshd
/// shares them): its mount point is `/tmp/bwlab-remote-...-PID-mnt`.
fn client_fs_leftovers(lab_pid: u32) -> Vec<String> {
    let mp = format!("-{lab_pid}-mnt");
    let fuse_key = format!("_{lab_pid}_mnt");
    let mut left: Vec<String> = std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .filter(|l| (l.contains("bwlab-remote-") && l.contains(&mp)) || (l.contains("bwlab_remote_") && l.contains(&fuse_key)))
        .map(|l| format!("mount {l}"))
        .collect();
    left.extend(
        all_pids().into_iter().map(cmdline).filter(|c| c.contains(" attach ") && c.contains(&fuse_key)).map(|c| format!("attach daemon {c}")),
    );
    for e in std::fs::read_dir("/run/blockwire").into_iter().flatten().flatten() {
        if std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains(&mp)) {
            left.push(format!("attach state {}", e.path().display()));
        }
    }
    left
}

/// The fs suite on a client host over ssh: `blockwire mount`, the
/// workloads and their memory cgroups run there. A run SIGKILLed while its
/// file system is mounted leaves the mount (nothing of it could act); the
/// next run on that host undoes it from the state file before it starts,
/// measures, and leaves nothing.
#[test]
fn fs_suite_on_a_client_host_and_a_killed_runs_mount_undone_by_the_next() {
    let mut hosts = Hosts::new("f");
    hosts.start_client_sshd();
    let client_url = format!("ssh://root@{CLIENT_IP}");
    let args = |runtime: &'static str| -> Vec<&'static str> {
        vec![
            "--suite", "fs", "--protocols", "iscsi", "--peers", "none", "--clients", "blockwire", "--repeat", "1", "--size", "32M",
            "--client-mem", "128M", "--fs-workloads", "varmail", "--fs-runtime", runtime, "--no-baseline", "--quick",
        ]
    };
    let out1 = out_dir("fs-killed");
    let mut first = hosts.lab(&out1, &args("60")).arg("--client-host").arg(&client_url).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let pid1 = first.id();
    // Killed once its file system is mounted on the client host.
    let deadline = Instant::now() + Duration::from_secs(240);
    let mounted = |pid: u32| std::fs::read_to_string("/proc/mounts").unwrap().lines().any(|l| l.contains("bwlab-remote-") && l.contains(&format!("-{pid}-mnt")) && !l.contains("fuse"));
    while !mounted(pid1) {
        if first.try_wait().unwrap().is_some() {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(&mut first.stderr.take().unwrap(), &mut err);
            panic!("the first run ended before it mounted: {err}");
        }
        assert!(Instant::now() < deadline, "no file system mounted on the client host within 4 minutes");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    kill(&[pid1], libc::SIGKILL);
    let _ = first.wait();
    assert!(!client_fs_leftovers(pid1).is_empty(), "the killed run's mount went by itself: nothing left for the next run to undo");

    let out2 = out_dir("fs-next");
    let mut next = hosts.lab(&out2, &args("1")).arg("--client-host").arg(&client_url).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let pid2 = next.id();
    let (st, stderr) = wait_done(&mut next, Duration::from_secs(600), "the run after the killed one");
    assert!(st.success(), "{stderr}");
    assert!(stderr.contains(&format!("{client_url}: undid what an interrupted run left")), "{stderr}");
    assert!(!stderr.contains("lab: cleanup:"), "cleanup reported problems: {stderr}");
    let r = saved(&out2);
    let fs = r["fs"].as_array().expect("fs samples");
    assert!(!fs.is_empty(), "no fs sample: {stderr}");
    for s in fs {
        assert_eq!(s["subject"], "blockwire-iscsi", "{s}");
        // The workload's CPU as the client host's shell counted it, the
        // attach daemon's and the target's as their /proc entries did.
        assert!(s["workload_cpu_s"].as_f64().unwrap() > 0.0, "{s}");
        assert!(s["attach_cpu_s"].as_f64().is_some() && s["target_cpu_s"].as_f64().is_some(), "{s}");
        assert!(s["peak_mem_bytes"].as_u64().unwrap() > 0, "{s}");
    }
    let mut left = hosts.settled_leftovers(pid2);
    // (A SIGKILLed lab's own ssh control sockets here are stale files
    // nothing of it could remove; they name no host.)
    left.extend(hosts.leftovers(pid1).into_iter().filter(|l| !l.contains(&format!("bwlab-{pid1}-ssh-"))));
    left.extend(client_fs_leftovers(pid1));
    left.extend(client_fs_leftovers(pid2));
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// `--allow-nic-changes` on a "real" NIC (the target namespace's veth,
/// reached over ssh): MTU, offloads and a tbf root qdisc are set, and each
/// is in the host's state file before it is: a SIGKILLed run leaves them,
/// the next run on that host puts them back before it starts.
#[test]
fn nic_changes_of_a_killed_run_are_put_back_by_the_next_run() {
    let hosts = Hosts::new("n");
    let dev = format!("{}v", hosts.target_ns);
    let in_target = |args: &[&str]| -> String {
        let mut a = vec!["ip", "netns", "exec", hosts.target_ns.as_str()];
        a.extend_from_slice(args);
        run(&a)
    };
    let mtu = || -> String { in_target(&["cat", &format!("/sys/class/net/{dev}/mtu")]).trim().to_string() };
    let qdisc = || in_target(&["tc", "qdisc", "show", "dev", &dev, "root"]);
    let offloads = || -> String {
        in_target(&["ethtool", "-k", &dev])
            .lines()
            .filter(|l| ["tcp-segmentation-offload:", "generic-receive-offload:", "scatter-gather:", "tx-checksumming:"].iter().any(|k| l.starts_with(k)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let before = (mtu(), offloads());
    assert!(!qdisc().contains("tbf"), "{}", qdisc());
    let out1 = out_dir("nic-killed");
    let args = [
        "--suite", "micro", "--protocols", "iscsi", "--peers", "none", "--repeat", "3", "--size", "16M", "--runtime", "1",
        "--allow-nic-changes", "--mtu", "1400", "--link", "1gbit", "--offload", "none",
    ];
    let mut first = start_and_wait_first_sample(&hosts, &out1, &args);
    let pid1 = first.id();
    let changed = (mtu(), offloads(), qdisc());
    kill(&[pid1], libc::SIGKILL);
    let _ = first.wait();
    assert_eq!(changed.0, "1400", "the MTU was not set");
    assert_ne!(changed.1, before.1, "the offloads were not switched");
    assert!(changed.2.contains("tbf"), "no tbf: {}", changed.2);
    assert!(qdisc().contains("tbf") && mtu() == "1400", "the killed run's changes went by themselves: nothing for the next run to undo");

    let out2 = out_dir("nic-next");
    let mut next = hosts
        .lab(&out2, &["--suite", "micro", "--protocols", "nvme", "--peers", "none", "--repeat", "1", "--size", "8M", "--runtime", "1", "--quick"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid2 = next.id();
    let (st, stderr) = wait_done(&mut next, Duration::from_secs(300), "the run after the killed one");
    assert!(st.success(), "{stderr}");
    assert!(stderr.contains(&format!("ssh://root@{TARGET_IP}: undid what an interrupted run left")), "{stderr}");
    assert_eq!((mtu(), offloads()), before, "MTU and offloads not put back");
    assert!(!qdisc().contains("tbf"), "the tbf is still there: {}", qdisc());
    let mut left = hosts.settled_leftovers(pid2);
    left.extend(hosts.leftovers(pid1).into_iter().filter(|l| !l.contains(&format!("bwlab-{pid1}-ssh-"))));
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// AoE is asked for, not assumed: the target's data address is on an
/// interface that the client reaches over the veth by IP (a route with no
/// gateway), but no Ethernet frame of the client's reaches that interface.
/// The AoE query from the client gets no answer: AoE is unavailable with a
/// preflight line, iSCSI on the same target is measured.
#[test]
fn aoe_without_a_layer_2_path_is_unavailable_by_an_aoe_query() {
    let hosts = Hosts::new("a");
    let data_ip = "10.232.0.1";
    let dummy = format!("{}d", hosts.target_ns);
    // (A veth pair inside the target namespace: this kernel has no dummy.)
    let peer = format!("{}e", hosts.target_ns);
    run(&["ip", "-n", &hosts.target_ns, "link", "add", &dummy, "type", "veth", "peer", "name", &peer]);
    run(&["ip", "-n", &hosts.target_ns, "addr", "add", &format!("{data_ip}/32"), "dev", &dummy]);
    run(&["ip", "-n", &hosts.target_ns, "link", "set", &dummy, "up"]);
    run(&["ip", "-n", &hosts.target_ns, "link", "set", &peer, "up"]);
    run(&["ip", "-n", &hosts.client_ns, "route", "add", &format!("{data_ip}/32"), "dev", &format!("{}v", hosts.client_ns)]);
    let out = out_dir("aoe-l2");
    let mut child = hosts
        .lab(&out, &["--suite", "micro", "--protocols", "aoe,iscsi", "--peers", "none", "--repeat", "1", "--size", "8M", "--runtime", "1", "--quick", "--micro-workloads", "randread-4k-qd1", "--data-addr", data_ip])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (st, stderr) = wait_done(&mut child, Duration::from_secs(300), "the lab with AoE cut off at layer 2");
    assert!(st.success(), "{stderr}");
    assert!(stderr.contains("lab: preflight: AoE cannot reach the target at layer 2"), "{stderr}");
    let r = saved(&out);
    let subjects = r["subjects"].as_array().unwrap();
    let aoe = subjects.iter().find(|s| s["key"] == "blockwire-aoe").expect("blockwire-aoe in subjects");
    assert!(aoe["unavailable"].as_str().unwrap_or_default().contains("AoE config query"), "{aoe}");
    let samples = r["samples"].as_array().unwrap();
    assert!(samples.iter().any(|s| s["subject"] == "blockwire-iscsi"), "iSCSI was not measured: {stderr}");
    assert!(!samples.iter().any(|s| s["subject"] == "blockwire-aoe"));
    let left = hosts.settled_leftovers(pid);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// The kernel VM as the client host: this machine is the target host (an
/// sshd of the test's on 127.0.0.1), the guest the client host (dropbear,
/// reached through a qemu port forward), joined by a tap device on a
/// storage subnet (layer 2, so AoE works). One boot: a run killed once the
/// kernel initiators are attached, then a run that first logs out what the
/// killed one left and measures every target with blockwire's userspace
/// initiators and the guest's kernel ones (open-iscsi, nvme-tcp, aoe).
/// The guest's CPU is emulated: its figures are only checked for presence.
mod kernel_vm {
    use super::*;
    use crate::common::BackgroundVm;

    /// The kernel subjects the run must measure (every client against
    /// blockwire and the peer of its protocol).
    const KERNEL_SUBJECTS: [&str; 5] =
        ["kernel-iscsi@blockwire", "kernel-iscsi@tgt", "kernel-nvme@blockwire", "kernel-aoe@blockwire", "kernel-aoe@vblade"];

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// What the test made: its directory, the target's sshd, the tap, the VM.
    struct Rig {
        dir: PathBuf,
        tap: String,
        /// The tap's address here (the target's data address), on a /24
        /// no other device holds ([`crate::common::free_subnet`]).
        host_ip: String,
        sshd: Option<Child>,
        vm: Option<BackgroundVm>,
        target_port: u16,
        guest_port: u16,
    }

    impl Rig {
        fn ssh_options(&self) -> Vec<String> {
            guest_ssh_options(&self.dir)
        }

        /// A command in the guest (None: ssh failed).
        fn guest(&self, line: &str) -> Option<String> {
            in_guest(&self.dir, self.guest_port, line)
        }

        /// Both ends of the storage link as the kernels see them, for a
        /// failure's message.
        fn link_facts(&self) -> String {
            let here = Command::new("ip").args(["-s", "link", "show", "dev", &self.tap]).output();
            let here = here.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
            let there = self.guest("ip -s link show dev eth1; dmesg | tail -n 25").unwrap_or_else(|| "(the guest does not answer)".into());
            format!("\n--- {} here:\n{here}--- the guest:\n{there}", self.tap)
        }

        fn lab(&self, exe: &Path, out: &Path, log: &Path, extra: &[&str]) -> Child {
            let mut c = Command::new(exe);
            // One read and one write workload: what the test checks is that
            // every kernel initiator is attached, measured and undone; the
            // quick set's other two cost a minute of emulated fio.
            c.arg("lab").args(common::LAB_AT_ONCE).args(extra).args([
                "--quick", "--suite", "micro", "--repeat", "1", "--size", "16M", "--runtime", "1", "--micro-workloads", "randread-4k-qd32,randwrite-4k-qd32",
                "--data-addr", &self.host_ip,
            ]);
            c.arg("--target-host").arg(format!("ssh://root@127.0.0.1:{}", self.target_port));
            c.arg("--client-host").arg(format!("ssh://root@127.0.0.1:{}", self.guest_port));
            for o in self.ssh_options() {
                c.arg("--ssh-option").arg(o);
            }
            let f = std::fs::File::create(log).unwrap();
            c.arg("--out").arg(out).stdin(Stdio::null()).stdout(f.try_clone().unwrap()).stderr(f).spawn().expect("start the lab")
        }
    }

    impl Drop for Rig {
        fn drop(&mut self) {
            drop(self.vm.take());
            if let Some(mut c) = self.sshd.take() {
                kill(&[c.id()], libc::SIGTERM);
                let _ = c.wait();
            }
            let _ = Command::new("ip").args(["link", "del", &self.tap]).status();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// What the guest still has of a lab run: sessions, devices, files.
    const GUEST_LEFTOVERS: &str = "iscsiadm -m session 2>/dev/null; ls /sys/class/nvme-subsystem; ls /dev/etherd | grep '^e[0-9]'; \
        ls /var/tmp/bwlab-remote 2>/dev/null; ls /etc/iscsi/nodes; pidof iscsid fio; true";

    #[test]
    fn kernel_initiators_in_the_vm_are_measured_beside_blockwires_and_leave_nothing() {
        require_root();
        for (p, pkg) in [(SSHD, "openssh-server"), ("/usr/bin/fio", "fio"), ("/usr/sbin/tgtd", "tgt"), ("/usr/sbin/vblade", "vblade")] {
            assert!(Path::new(p).exists(), "{p} is missing: install {pkg} (make deps)");
        }
        let t0 = Instant::now();
        let id = unique("kv");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("lab-kvm-{id}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let net = crate::common::free_subnet([233, 0]);
        let (host_ip, guest_ip) = (format!("{net}.1"), format!("{net}.2"));
        let mut rig = Rig { dir: dir.clone(), tap: format!("bwk{id}"), host_ip: host_ip.clone(), sshd: None, vm: None, target_port: free_port(), guest_port: free_port() };
        ssh_keys_and_config(&dir, &format!("127.0.0.1:{}", rig.target_port));
        std::fs::create_dir_all("/run/sshd").unwrap();
        rig.sshd = Some(Command::new(SSHD).arg("-D").arg("-f").arg(dir.join("sshd_config")).arg("-E").arg(dir.join("sshd.log")).stdin(Stdio::null()).spawn().unwrap());
        // The storage link: a tap here (the target's NIC), eth1 in the guest.
        run(&["ip", "tuntap", "add", "dev", &rig.tap, "mode", "tap"]);
        run(&["ip", "addr", "add", &format!("{host_ip}/24"), "dev", &rig.tap]);
        run(&["ip", "link", "set", &rig.tap, "up"]);
        let script = dir.join("guest.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\n# the lab's remote lines want a shell that finds programs on PATH (busybox's prefers its applets)\n\
                 ln -sf bash /bin/sh\nip link set eth1 up\nip addr add {guest_ip}/24 dev eth1\n{}",
                crate::common::guest_stays_up()
            ),
        )
        .unwrap();
        run(&["chmod", "+x", &script.to_string_lossy()]);
        // The lab brings its binary to each host over ssh: a stripped copy
        // is a sixth of the size through the emulated guest's ssh server.
        let exe = dir.join("blockwire");
        if !Command::new("strip").arg("-o").arg(&exe).arg(blockwire_bin()).status().is_ok_and(|s| s.success()) {
            std::fs::copy(blockwire_bin(), &exe).unwrap();
        }
        let key = dir.join("client.pub").display().to_string();
        // iproute2's ip (JSON), flock and getconf: the lab's remote side needs
        // them and the guest's busybox lacks them; libgcc_s for the binary.
        let with = ["/usr/bin/fio", "/usr/bin/ip", "/usr/bin/flock", "/usr/bin/getconf", "/lib/x86_64-linux-gnu/libgcc_s.so.1"];
        let mut args = vec!["--tap", &rig.tap];
        for w in &with {
            args.extend(["--with", w]);
        }
        let fwd = format!("tcp:127.0.0.1:{}-:22", rig.guest_port);
        let life = crate::common::stays_up_timeout();
        rig.vm = Some(BackgroundVm::start_with(None, &script, &fwd, &args, &[("KVM_SSH_KEY", &key), ("KVM_MEM", "1536"), (life.0, &life.1)]));
        let up = rig.vm.as_mut().unwrap().wait_until(Duration::from_secs(600), || rig_guest_ready(&dir, rig.guest_port, &guest_ip));
        up.unwrap_or_else(|console| panic!("the guest did not come up: {console}"));
        eprintln!("guest up after {:?}", t0.elapsed());

        // 1. A run killed (SIGKILL: no cleanup of its own) once every kernel
        // initiator is attached: its sessions stay in the guest.
        let out1 = dir.join("out1");
        let log1 = dir.join("lab1.log");
        let mut lab = rig.lab(&exe, &out1, &log1, &["--clients", "kernel"]);
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let text = std::fs::read_to_string(&log1).unwrap_or_default();
            if text.contains("kernel-aoe@vblade: /dev/") {
                break;
            }
            if let Some(st) = lab.try_wait().unwrap() {
                panic!("the first run ended ({st}) before attaching every kernel initiator: {text}{}", rig.link_facts());
            }
            // A kernel subject the run gave up on will not attach later.
            assert!(!text.contains(": unavailable:"), "a kernel initiator did not attach: {text}{}", rig.link_facts());
            assert!(Instant::now() < deadline, "the kernel initiators were not attached within 10 min: {text}{}", rig.link_facts());
            std::thread::sleep(Duration::from_millis(200));
        }
        let pid1 = lab.id();
        kill(&[pid1], libc::SIGKILL);
        let _ = lab.wait();
        let left = rig.guest(GUEST_LEFTOVERS).unwrap_or_default();
        assert!(left.contains("iqn.2026-11.org.blockwire.lab") && left.contains("e2.0"), "the killed run should have left sessions: {left}");

        // 2. A full run: it undoes what the killed one left, then measures.
        let out2 = dir.join("out2");
        let log2 = dir.join("lab2.log");
        let mut lab = rig.lab(&exe, &out2, &log2, &[]);
        let deadline = Instant::now() + Duration::from_secs(1500);
        let st = loop {
            if let Some(st) = lab.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                kill(&[lab.id()], libc::SIGKILL);
                let _ = lab.wait();
                panic!("the lab did not finish within 25 min: {}", std::fs::read_to_string(&log2).unwrap_or_default());
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        let text = std::fs::read_to_string(&log2).unwrap_or_default();
        eprintln!("{text}");
        assert!(st.success(), "the lab failed: {text}");
        assert!(text.contains(&format!("ssh://root@127.0.0.1:{}: undid what an interrupted run left", rig.guest_port)), "{text}");
        let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out2.join("results.json")).unwrap()).unwrap();
        let samples = r["samples"].as_array().unwrap();
        for key in KERNEL_SUBJECTS.iter().copied().chain(["blockwire-iscsi", "blockwire-nvme", "blockwire-aoe", "tgt-iscsi", "vblade-aoe"]) {
            let mine: Vec<_> = samples.iter().filter(|s| s["subject"] == key).collect();
            assert!(!mine.is_empty(), "no sample of {key}: {text}{}", rig.link_facts());
            for s in mine {
                let b = &s["bench"];
                // Emulated: present, never judged.
                assert!(b["ios"].as_u64().unwrap() > 0 && b["runtime_s"].as_f64().unwrap() > 0.0 && b["lat_ns"]["p50"].as_f64().unwrap() > 0.0, "{key}: {s}");
                assert!(b["cpu_user_s"].as_f64().is_some() && b["cpu_sys_s"].as_f64().is_some() && s["target_cpu_s"].as_f64().is_some(), "{key}: {s}");
            }
        }
        let subjects = r["subjects"].as_array().unwrap();
        for key in KERNEL_SUBJECTS {
            let s = subjects.iter().find(|s| s["key"] == key).unwrap_or_else(|| panic!("{key} not in subjects"));
            assert!(s["initiator"].as_str().unwrap().contains("kernel"), "{s}");
        }
        let client = r["hosts"].as_array().unwrap().iter().find(|h| h["role"] == "client").expect("a client host record");
        assert_eq!(client["emulated"], true, "the guest's /proc/cpuinfo has the hypervisor flag: {client}");
        let html = std::fs::read_to_string(out2.join("report.html")).unwrap();
        assert!(html.contains("kernel-iscsi@tgt by open-iscsi") && html.contains("blockwire-nvme by blockwire (userspace)"), "the Clients line names each subject's initiator");
        assert!(html.contains("yes (a VM"), "the report says the client host was emulated");

        // Nothing of either run is left in the guest or here.
        let left = rig.guest(GUEST_LEFTOVERS).expect("the guest still answers");
        assert!(left.trim().is_empty(), "left in the guest: {left}");
        // Here: the targets (tgtd's portal, vblade's interface, serve's
        // config named by the run) and the runs' files and state files.
        let runs = [format!("-{pid1}-"), format!("-{}-", lab.id())];
        let of_runs = |s: &str| runs.iter().any(|r| s.contains(r.as_str()));
        // (The guest's qemu names the tap too: it is the test's.)
        let the_vm = |c: &str| c.contains("kernel-vm") || c.contains("qemu-system");
        let ours: Vec<String> = all_pids()
            .into_iter()
            .map(cmdline)
            .filter(|c| !the_vm(c) && (c.contains(&host_ip) || c.contains(&rig.tap) || of_runs(c)))
            .collect();
        assert!(ours.is_empty(), "processes of the runs left here: {ours:?}");
        for d in ["/dev/shm", "/tmp", "/var/tmp/bwlab-remote"] {
            for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                assert!(!(n.starts_with("bwlab-remote-") || n.starts_with("state-")) || !of_runs(&format!("{n}-")), "left here: {d}/{n}");
            }
        }
        // The runs' ssh control sockets: the full run removes its own, and
        // the killed run's (which ssh, signalled, leaves) when it starts.
        for pid in [pid1, lab.id()] {
            let prefix = format!("bwlab-{pid}-ssh-");
            let left: Vec<String> = std::fs::read_dir("/tmp").into_iter().flatten().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with(&prefix)).collect();
            assert!(left.is_empty(), "control sockets left in /tmp: {left:?}");
        }
        eprintln!("kernel VM lab test took {:?}", t0.elapsed());
    }

    /// The guest answers ssh (dropbear is up, eth1 configured).
    fn rig_guest_ready(dir: &Path, port: u16, guest_ip: &str) -> bool {
        let key = dir.join("client").display().to_string();
        Command::new("ssh")
            .args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"])
            .arg("-o")
            .arg(format!("IdentityFile={key}"))
            .args(["-p", &port.to_string(), "root@127.0.0.1", &format!("ip -4 addr show dev eth1 | grep -q {guest_ip}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

/// The kernel VM as the target host (issue 39): the kernel's own targets,
/// LIO and nvmet, set up by the lab through the guest's configfs, and its
/// NFS server (knfsd) exporting the image, beside blockwire serve, measured by blockwire's clients on this machine over a
/// tap, then by the guest's own kernel initiators and NFS client (the
/// guest as client host too); a LIO target, an nvmet subsystem and port
/// and an NFS export of "the user's", made before the runs, stay
/// untouched, and nothing of the runs is left.
mod kernel_targets_vm {
    use super::*;
    use crate::common::BackgroundVm;

    const USER_IQN: &str = "iqn.2003-01.org.example:user";
    const USER_NQN: &str = "nqn.2014-08.org.example:user";

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    struct Rig {
        dir: PathBuf,
        tap: String,
        /// The guest's address on the tap's /24, which no other device
        /// here holds ([`crate::common::free_subnet`]).
        guest_ip: String,
        vm: Option<BackgroundVm>,
        /// Two forwarded ports to the guest's ssh: the target host's and
        /// the client host's connection (one machine, two "hosts").
        ports: [u16; 2],
    }

    impl Rig {
        fn ssh_options(&self) -> Vec<String> {
            guest_ssh_options(&self.dir)
        }

        fn guest(&self, line: &str) -> Option<String> {
            in_guest(&self.dir, self.ports[0], line)
        }

        /// `blockwire lab` with the guest as target host (and `extra`), to its end.
        fn lab(&self, exe: &Path, out: &Path, extra: &[&str]) -> (std::process::ExitStatus, String) {
            let mut c = Command::new(exe);
            c.arg("lab").args(common::LAB_AT_ONCE).args(extra).args([
                "--quick", "--suite", "micro", "--repeat", "1", "--size", "16M", "--runtime", "1", "--protocols", "iscsi,nvme", "--peers", "lio,nvmet,knfsd",
                "--micro-workloads", "randread-4k-qd1,randwrite-4k-qd32", "--data-addr", &self.guest_ip,
            ]);
            c.arg("--target-host").arg(format!("ssh://root@127.0.0.1:{}", self.ports[0]));
            for o in self.ssh_options() {
                c.arg("--ssh-option").arg(o);
            }
            let mut child = c.arg("--out").arg(out).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("start the lab");
            wait_done(&mut child, Duration::from_secs(900), "the lab")
        }
    }

    impl Drop for Rig {
        fn drop(&mut self) {
            drop(self.vm.take());
            let _ = Command::new("ip").args(["link", "del", &self.tap]).status();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// "The user's" kernel targets, made before the lab runs: a LIO target
    /// with a fileio backstore and a portal on the guest's loopback, an
    /// nvmet subsystem with a namespace and a TCP port.
    const USER_TARGETS: &str = r#"
modprobe configfs; mount -t configfs none /sys/kernel/config
for m in target_core_mod target_core_file iscsi_target_mod nvmet nvmet-tcp; do modprobe $m; done
truncate -s 8M /dev/shm/user.img
t=/sys/kernel/config/target
mkdir -p $t/core/fileio_0/user
echo fd_dev_name=/dev/shm/user.img,fd_dev_size=8388608 > $t/core/fileio_0/user/control
echo 1 > $t/core/fileio_0/user/enable
g=$t/iscsi/IQN/tpgt_1
mkdir -p $g/lun/lun_0 && ln -s $t/core/fileio_0/user $g/lun/lun_0/user && mkdir $g/np/127.0.0.1:3260 && echo 1 > $g/enable
n=/sys/kernel/config/nvmet; s=$n/subsystems/NQN
mkdir $s && echo 1 > $s/attr_allow_any_host && mkdir $s/namespaces/1
printf %s /dev/shm/user.img > $s/namespaces/1/device_path; echo 1 > $s/namespaces/1/buffered_io; echo 1 > $s/namespaces/1/enable
mkdir $n/ports/1; echo ipv4 > $n/ports/1/addr_adrfam; echo tcp > $n/ports/1/addr_trtype; echo 127.0.0.1 > $n/ports/1/addr_traddr; echo 4430 > $n/ports/1/addr_trsvcid
ln -s $s $n/ports/1/subsystems/NQN
modprobe nfsd; mount -t nfsd nfsd /proc/fs/nfsd; rpcbind; mkdir -p /srv/user; exportfs -o ro,no_subtree_check 127.0.0.1:/srv/user; rpc.mountd; rpc.nfsd 2
"#;

    /// What the guest has of the user's targets: the tree and its values,
    /// and the NFS server's exports.
    const USER_STATE: &str = "exportfs -v; cd /sys/kernel/config && for f in $(find target/core/fileio_0 target/iscsi/IQN nvmet/subsystems/NQN nvmet/ports/1 | sort); do \
        if [ -L $f ]; then echo \"$f -> $(readlink $f)\"; elif [ -f $f ] && [ -r $f ]; then echo \"$f = $(head -c 200 $f 2>/dev/null | tr '\\n' ' ')\"; else echo $f; fi; done";

    /// What the guest has left of a lab run: the lab's configfs entries
    /// (its IQN, NQN, HBAs and ports), sessions, processes, state files.
    const LEFTOVERS: &str = "ls /sys/kernel/config/target/iscsi /sys/kernel/config/nvmet/subsystems 2>/dev/null | grep blockwire.lab; \
        exportfs | grep bwlab; ls /srv | grep bwlab; grep bwlab /proc/mounts; \
        ls /sys/kernel/config/target/core 2>/dev/null | grep -v '^fileio_0$' | grep -v '^alua$'; ls /sys/kernel/config/nvmet/ports | grep -vx 1; \
        iscsiadm -m session 2>/dev/null; ls /sys/class/nvme-subsystem; ls /var/tmp/bwlab-remote 2>/dev/null; ls /dev/shm | grep bwlab; pidof blockwire fio iscsid; true";

    #[test]
    fn lio_nvmet_and_knfsd_in_the_vm_are_measured_beside_blockwire_and_the_users_targets_stay() {
        require_root();
        assert!(Path::new("/usr/bin/fio").exists(), "fio is missing (make deps)");
        let t0 = Instant::now();
        let id = unique("kt");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("lab-kt-{id}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let net = crate::common::free_subnet([247, 39]);
        let (host_ip, guest_ip) = (format!("{net}.1"), format!("{net}.2"));
        let mut rig = Rig { dir: dir.clone(), tap: format!("bwt{id}"), guest_ip: guest_ip.clone(), vm: None, ports: [free_port(), free_port()] };
        ssh_keys_and_config(&dir, "127.0.0.1:1");
        run(&["ip", "tuntap", "add", "dev", &rig.tap, "mode", "tap"]);
        run(&["ip", "addr", "add", &format!("{host_ip}/24"), "dev", &rig.tap]);
        run(&["ip", "link", "set", &rig.tap, "up"]);
        let user = USER_TARGETS.replace("IQN", USER_IQN).replace("NQN", USER_NQN);
        let script = dir.join("guest.sh");
        std::fs::write(
            &script,
            format!("#!/bin/sh\nln -sf bash /bin/sh\nip link set lo up\nip link set eth1 up\nip addr add {guest_ip}/24 dev eth1\n{user}\n{}", crate::common::guest_stays_up()),
        )
        .unwrap();
        run(&["chmod", "+x", &script.to_string_lossy()]);
        let exe = dir.join("blockwire");
        if !Command::new("strip").arg("-o").arg(&exe).arg(blockwire_bin()).status().is_ok_and(|s| s.success()) {
            std::fs::copy(blockwire_bin(), &exe).unwrap();
        }
        let key = dir.join("client.pub").display().to_string();
        let with = ["/usr/bin/fio", "/usr/bin/ip", "/usr/bin/flock", "/usr/bin/getconf", "/lib/x86_64-linux-gnu/libgcc_s.so.1"];
        let mut args = vec!["--tap", &rig.tap];
        for w in &with {
            args.extend(["--with", w]);
        }
        let fwd = format!("tcp:127.0.0.1:{}-:22,tcp:127.0.0.1:{}-:22", rig.ports[0], rig.ports[1]);
        let life = crate::common::stays_up_timeout();
        rig.vm = Some(BackgroundVm::start_with(None, &script, &fwd, &args, &[("KVM_SSH_KEY", &key), ("KVM_MEM", "1536"), (life.0, &life.1)]));
        let port = rig.ports[0];
        let ready = |rig: &Rig| rig.guest(&format!("ip -4 addr show dev eth1 | grep -q {} && [ -e /sys/kernel/config/nvmet/ports/1/subsystems/{USER_NQN} ]", rig.guest_ip)).is_some();
        let up = rig.vm.as_mut().unwrap().wait_until(Duration::from_secs(600), || ready_on(&dir, port));
        up.unwrap_or_else(|console| panic!("the guest did not come up: {console}"));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready(&rig) {
            assert!(Instant::now() < deadline, "the user's targets were not made in the guest: {}", rig.guest("dmesg | tail -n 20").unwrap_or_default());
            std::thread::sleep(Duration::from_millis(500));
        }
        let state = USER_STATE.replace("IQN", USER_IQN).replace("NQN", USER_NQN);
        let before = rig.guest(&state).expect("the guest answers");
        assert!(before.contains("np/127.0.0.1:3260") && before.contains("addr_trsvcid = 4430") && before.contains("/srv/user"), "{before}");
        eprintln!("guest up after {:?}", t0.elapsed());

        // 1. blockwire's clients here, the targets in the guest.
        let out1 = dir.join("here");
        let (st, text) = rig.lab(&exe, &out1, &[]);
        eprintln!("{text}");
        assert!(st.success(), "the lab failed: {text}");
        let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out1.join("results.json")).unwrap()).unwrap();
        let subjects = ["blockwire-iscsi", "blockwire-nvme", "lio-iscsi", "nvmet-nvme", "knfsd-nfs"];
        check_samples(&r, &subjects, &text);
        for (key, says) in [("lio-iscsi", "fileio backstore on /dev/shm/"), ("nvmet-nvme", "file namespace, buffered_io=1")] {
            let s = r["subjects"].as_array().unwrap().iter().find(|s| s["key"] == key).unwrap();
            let settings = s["settings"].as_str().unwrap_or_default();
            assert!(settings.contains("in Linux 6.") && settings.contains(says), "{key}: kernel version and settings recorded: {s}");
        }
        if let Some(s) = r["subjects"].as_array().unwrap().iter().find(|s| s["key"] == "lio-iscsi") {
            assert!(s["settings"].as_str().unwrap().contains("emulate_write_cache="), "LIO's write cache setting: {s}");
        }
        let left = rig.guest(LEFTOVERS).expect("the guest answers");
        assert!(left.trim().is_empty(), "left in the guest after the first run: {left}");

        // 2. The guest's own kernel initiators (the guest as client host).
        let out2 = dir.join("kernel");
        let client = format!("ssh://root@127.0.0.1:{}", rig.ports[1]);
        let (st, text) = rig.lab(&exe, &out2, &["--client-host", &client, "--clients", "kernel"]);
        eprintln!("{text}");
        assert!(st.success(), "the lab failed: {text}");
        let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out2.join("results.json")).unwrap()).unwrap();
        check_samples(&r, &["kernel-iscsi@blockwire", "kernel-iscsi@lio", "kernel-nvme@blockwire", "kernel-nvme@nvmet", "kernel-nfs3@knfsd", "kernel-nfs4.1@knfsd"], &text);

        // Nothing of either run in the guest; the user's targets as they were.
        let left = rig.guest(LEFTOVERS).expect("the guest answers");
        assert!(left.trim().is_empty(), "left in the guest: {left}");
        let after = rig.guest(&state).expect("the guest answers");
        assert_eq!(before, after, "the user's LIO target and nvmet subsystem and port changed");
        eprintln!("kernel targets VM test took {:?}", t0.elapsed());
    }

    fn check_samples(r: &serde_json::Value, subjects: &[&str], text: &str) {
        let samples = r["samples"].as_array().unwrap();
        for key in subjects {
            let mine: Vec<_> = samples.iter().filter(|s| s["subject"] == *key).collect();
            assert_eq!(mine.len(), 2, "{key}: a sample per workload: {text}");
            for s in mine {
                let b = &s["bench"];
                // Emulated: present, never judged.
                assert!(b["ios"].as_u64().unwrap() > 0 && b["runtime_s"].as_f64().unwrap() > 0.0 && b["lat_ns"]["p50"].as_f64().unwrap() > 0.0, "{key}: {s}");
                assert!(s["target_cpu_s"].as_f64().is_some(), "{key}: {s}");
            }
        }
    }

    fn ready_on(dir: &Path, port: u16) -> bool {
        let key = dir.join("client").display().to_string();
        Command::new("ssh")
            .args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"])
            .arg("-o")
            .arg(format!("IdentityFile={key}"))
            .args(["-p", &port.to_string(), "root@127.0.0.1", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}
