//! Live management through `blockwire ctl` against a running serve:
//! volumes, LUNs and namespaces added, resized and removed while a raw
//! NVMe/TCP host stays connected (it gets its Namespace Attribute Changed
//! event, and loses its controller when its host is removed); save_config
//! writes a file serve starts from; bad input (unknown method, malformed
//! JSON, a non-root client, a socket path in use) changes nothing; SIGHUP
//! applies a changed file and refuses a broken one.

use crate::common::nvme_raw::RawNvme;
use crate::common::*;
use bw_nvme::fabrics::{reg, Property};
use bw_nvme::logpage::{lid, LogRequest};
use bw_nvme::pdu::{self, Digests, Pdu};
use bw_nvme::queue_entry::{admin, sgl, Sgl, Sqe};
use serde_json::Value;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const IQN: &str = "iqn.2026-11.org.blockwire:ctl";
const NQN: &str = "nqn.2026-11.org.blockwire:ctl";
const HOST: &str = "nqn.2026-11.org.blockwire:ctl-host";
const OTHER: &str = "nqn.2026-11.org.blockwire:ctl-other";

fn config(ip: u16, np: u16, extra_lun: &str) -> String {
    format!(
        r#"
[[volume]]
name = "a"
backend = "ram:8M"
[iscsi]
listen = ["127.0.0.1:{ip}"]
[[iscsi.target]]
iqn = "{IQN}"
luns = [{{ lun = 0, volume = "a" }}{extra_lun}]
[nvme]
listen = ["127.0.0.1:{np}"]
[[nvme.subsystem]]
nqn = "{NQN}"
namespaces = [{{ nsid = 1, volume = "a" }}]
allowed_hosts = ["{HOST}", "{OTHER}"]
"#
    )
}

fn ctl_out(sock: &Path, args: &[&str]) -> Output {
    let mut a = vec!["ctl", "--control", sock.to_str().unwrap()];
    a.extend_from_slice(args);
    blockwire(None, &a)
}

/// `blockwire ctl` that must succeed; its stdout.
pub(crate) fn ctl(sock: &Path, args: &[&str]) -> String {
    let o = ctl_out(sock, args);
    assert!(o.status.success(), "ctl {args:?}: {}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `blockwire ctl` that must fail; its stderr.
pub(crate) fn ctl_err(sock: &Path, args: &[&str]) -> String {
    let o = ctl_out(sock, args);
    assert!(!o.status.success(), "ctl {args:?} succeeded: {}", String::from_utf8_lossy(&o.stdout));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub(crate) fn status(sock: &Path) -> Value {
    let v: Value = serde_json::from_str(&ctl(sock, &["--json", "status"])).unwrap();
    v["result"].clone()
}

/// Poll `f` until it holds; generous, since the machine may be busy.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "not within 60 s: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An enabled admin queue of subsystem `nqn` that asked for namespace
/// notices and has one Asynchronous Event Request (command id 40)
/// outstanding.
pub(crate) fn admin_waiting_for_events(port: u16, nqn: &str) -> RawNvme {
    let mut q = RawNvme::open(port);
    let c = q.connect(nqn, 0, 0xFFFF, HOST, [7; 16], 600_000).expect("Connect answered");
    assert!(c.status.is_success(), "{c:?}");
    assert!(q.command(Property::set_sqe(2, reg::CC, 0x46_0001), &[]).unwrap().status.is_success());
    let mut s = Sqe::new(admin::SET_FEATURES, 3, 0);
    s.set_cdw(10, bw_nvme::controller::feature::ASYNC_EVENT as u32);
    s.set_cdw(11, 1 << 8);
    assert!(q.command(s, &[]).unwrap().status.is_success());
    wait_for_event(&mut q);
    q
}

/// Leave an Asynchronous Event Request (cid 40) outstanding: the host's
/// next event completes it.
pub(crate) fn wait_for_event(q: &mut RawNvme) {
    let mut out = Vec::new();
    pdu::encode_capsule(&Sqe::new(admin::ASYNC_EVENT, 40, 0), &[], Digests::default(), &mut out);
    q.s.write_all(&out).unwrap();
}

pub(crate) fn changed_namespace_log(q: &mut RawNvme) -> Vec<u32> {
    let l = LogRequest { lid: lid::CHANGED_NS, rae: false, len: 4096, offset: 0 };
    let mut s = l.to_sqe(41, 0);
    s.set_sgl(Sgl { addr: 0, length: 4096, kind: sgl::TRANSPORT });
    let (c, d) = q.exchange(s, &[]).unwrap();
    assert!(c.status.is_success());
    d.chunks(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).take_while(|n| *n != 0).collect()
}

#[test]
fn ctl_changes_a_running_server_and_hosts_are_told() {
    require_root();
    let dir = TempDir::new("ctl");
    let (ip, np) = (free_port(), free_port());
    let sock = dir.path().join("control.sock");
    let serve = Serve::with_config(&dir, &config(ip, np, ""), &["--control", sock.to_str().unwrap()]);
    assert_eq!(std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777, 0o600);
    let text = ctl(&sock, &["status"]);
    assert!(text.contains(IQN) && text.contains(NQN), "{text}");

    let mut host = admin_waiting_for_events(np, NQN);
    let sessions: Value = serde_json::from_str(&ctl(&sock, &["--json", "session_list"])).unwrap();
    let row = sessions["result"].as_array().unwrap().iter().find(|s| s["initiator"] == HOST).expect("the host's controller is listed").clone();
    assert_eq!((row["protocol"].as_str(), row["target"].as_str()), (Some("nvme"), Some(NQN)));

    // A volume, a LUN and a namespace on it, live.
    let out = ctl(&sock, &["volume_add", r#"{"name": "b", "backend": "ram:4M"}"#]);
    assert_eq!(out, "volume b: added (4194304 bytes)\n");
    ctl(&sock, &["iscsi_lun_add", &format!(r#"{{"iqn": "{IQN}", "lun": 1, "volume": "b"}}"#)]);
    ctl(&sock, &["nvme_ns_add", &format!(r#"{{"nqn": "{NQN}", "nsid": 2, "volume": "b"}}"#)]);
    match host.next(RawNvme::WAIT) {
        Some(Pdu::CapsuleResp(c)) => assert_eq!((c.cid, c.result), (40, bw_nvme::controller::AEN_NS_CHANGED as u64)),
        p => panic!("no Namespace Attribute Changed event: {:?}", p.map(|p| p.kind())),
    }
    assert_eq!(changed_namespace_log(&mut host), [2]);
    blockwire_ok(None, &["verify", &format!("iscsi://127.0.0.1:{ip}/{IQN}/1"), "--size", "2M"]);
    blockwire_ok(None, &["verify", &format!("nvme+tcp://127.0.0.1:{np}/{NQN}/2"), "--size", "2M", "--initiator-name", OTHER]);

    // Resize: the volume grows, the host hears of namespace 2 again.
    let mut out = Vec::new();
    pdu::encode_capsule(&Sqe::new(admin::ASYNC_EVENT, 42, 0), &[], Digests::default(), &mut out);
    host.s.write_all(&out).unwrap();
    ctl(&sock, &["volume_resize", r#"{"name": "b", "size": "16M"}"#]);
    assert_eq!(status(&sock)["volumes"][1]["size"], 16 << 20);
    match host.next(RawNvme::WAIT) {
        Some(Pdu::CapsuleResp(c)) => assert_eq!(c.cid, 42),
        p => panic!("no event for the resize: {:?}", p.map(|p| p.kind())),
    }
    assert_eq!(changed_namespace_log(&mut host), [2]);

    // In use: refused without force, and nothing changed.
    let e = ctl_err(&sock, &["volume_remove", r#"{"name": "b"}"#]);
    assert!(e.contains("in use") && e.contains("-32000"), "{e}");
    assert_eq!(status(&sock)["volumes"].as_array().unwrap().len(), 2);

    // save_config: private, and serve starts from it.
    let saved = dir.path().join("saved.toml");
    ctl(&sock, &["save_config", &format!(r#"{{"path": "{}"}}"#, saved.display())]);
    assert_eq!(std::fs::metadata(&saved).unwrap().permissions().mode() & 0o777, 0o600);
    let printed = blockwire_ok(None, &["serve", "--config", saved.to_str().unwrap(), "--print-config"]);
    assert!(printed.contains("\"volume\": \"b\"") && printed.contains("16M"), "{printed}");
    let again = dir.path().join("again.toml");
    ctl(&sock, &["save_config", &format!(r#"{{"path": "{}"}}"#, again.display())]);
    assert_eq!(std::fs::read_to_string(&saved).unwrap(), std::fs::read_to_string(&again).unwrap());

    // Bad input: JSON-RPC errors, nothing changed.
    let before = status(&sock);
    assert!(ctl_err(&sock, &["volume_explode"]).contains("Method not found"));
    assert!(ctl_err(&sock, &["volume_add", "{\"name\": "]).contains("parse error"));
    assert!(ctl_err(&sock, &["volume_add", r#"{"name": "c"}"#]).contains("invalid params"));
    assert!(ctl_err(&sock, &["nvme_ns_remove", &format!(r#"{{"nqn": "{NQN}", "nsid": 9}}"#)]).contains("no namespace 9"));
    assert_eq!(status(&sock)["volumes"], before["volumes"]);

    // A client that is not root: the socket's mode keeps it out, and
    // were the mode wider, the server's own check would.
    let as_nobody = |sock: &Path| {
        let mut c = Command::new(blockwire_bin());
        c.args(["ctl", "--control", sock.to_str().unwrap(), "status"]);
        // SAFETY: setuid in the child before exec; no allocation.
        unsafe {
            c.pre_exec(|| if libc::setuid(65534) == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) });
        }
        c.output().unwrap()
    };
    let o = as_nobody(&sock);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("ermission denied"), "{o:?}");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = as_nobody(&sock);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("root only") && e.contains("-32001"), "{e}");
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600)).unwrap();

    // A socket path in use: a second server refuses to start.
    let o = blockwire(None, &["serve", "--volume", "x=ram:1M", "--iscsi", &format!("127.0.0.1:{}", free_port()), "--control", sock.to_str().unwrap()]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("another blockwire server answers there"), "{o:?}");

    // Namespace removed: the host hears of it; its host removed: the
    // controller ends.
    let mut out = Vec::new();
    pdu::encode_capsule(&Sqe::new(admin::ASYNC_EVENT, 43, 0), &[], Digests::default(), &mut out);
    host.s.write_all(&out).unwrap();
    ctl(&sock, &["nvme_ns_remove", &format!(r#"{{"nqn": "{NQN}", "nsid": 2}}"#)]);
    match host.next(RawNvme::WAIT) {
        Some(Pdu::CapsuleResp(c)) => assert_eq!(c.cid, 43),
        p => panic!("no event for the removal: {:?}", p.map(|p| p.kind())),
    }
    assert_eq!(changed_namespace_log(&mut host), [2]);
    ctl(&sock, &["iscsi_lun_remove", &format!(r#"{{"iqn": "{IQN}", "lun": 1}}"#)]);
    let out = ctl(&sock, &["nvme_host_remove", &format!(r#"{{"nqn": "{NQN}", "host": "{HOST}"}}"#)]);
    assert!(out.contains("no longer allowed"), "{out}");
    assert!(host.until_closed(usize::MAX, RawNvme::WAIT).closed, "the removed host's controller still runs");
    ctl(&sock, &["volume_remove", r#"{"name": "b"}"#]);
    assert_eq!(status(&sock)["volumes"].as_array().unwrap().len(), 1);
    assert!(serve.stop().success());
    assert!(!sock.exists(), "the socket is removed at exit");
}

/// SIGHUP applies a changed file; a broken file changes nothing and the
/// log says why. A stale socket left by a crashed server is replaced, and
/// a path that is not a socket is refused.
#[test]
fn sighup_applies_the_file_or_refuses_it_whole() {
    require_root();
    let dir = TempDir::new("hup");
    let (ip, np) = (free_port(), free_port());
    let sock = dir.path().join("control.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let serve = Serve::with_config(&dir, &config(ip, np, ""), &["--control", sock.to_str().unwrap()]);
    let file = dir.path().join("serve.toml");
    let hup = || {
        // SAFETY: signalling our own child by PID.
        assert_eq!(unsafe { libc::kill(serve.pid() as i32, libc::SIGHUP) }, 0);
    };
    let luns = || status(&sock)["iscsi_targets"][0]["luns"].as_array().unwrap().len();
    let with_b = config(ip, np, r#", { lun = 1, volume = "b" }"#).replace("[iscsi]", "[[volume]]\nname = \"b\"\nbackend = \"ram:2M\"\n[iscsi]");
    std::fs::write(&file, &with_b).unwrap();
    hup();
    eventually("LUN 1 from the file", || luns() == 2);
    eventually("the change logged", || serve.log_text().contains("iscsi iqn.2026-11.org.blockwire:ctl: LUN 1 added"));
    std::fs::write(&file, with_b.replace("lun = 1, volume = \"b\"", "lun = 1, volume = \"nope\"")).unwrap();
    hup();
    eventually("the refusal logged", || serve.log_text().contains("configuration not applied, nothing changed"));
    assert!(serve.log_text().contains("unknown volume \"nope\""), "{}", serve.log_text());
    std::fs::write(&file, "[[volume]\nname = ").unwrap();
    hup();
    eventually("the parse error logged", || serve.log_text().matches("configuration not applied").count() == 2);
    assert_eq!(luns(), 2, "a broken file changed nothing");
    assert_eq!(status(&sock)["volumes"].as_array().unwrap().len(), 2);
    std::fs::write(&file, with_b.replace("listen = [\"127.0.0.1:", "listen = [\"127.0.0.2:")).unwrap();
    hup();
    eventually("a fixed setting refused", || serve.log_text().contains("cannot change while serving"));
    assert!(serve.stop().success());

    let not_socket = dir.path().join("plain");
    std::fs::write(&not_socket, "").unwrap();
    let o = blockwire(None, &["serve", "--volume", "x=ram:1M", "--iscsi", &format!("127.0.0.1:{}", free_port()), "--control", not_socket.to_str().unwrap()]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("not a socket"), "{o:?}");
}

/// The phase the guest of tests/kernel-vm/live.sh wrote to the mailbox.
pub(crate) fn mailbox(path: &Path) -> String {
    let b = std::fs::read(path).unwrap_or_default();
    String::from_utf8_lossy(&b[..b.len().min(512)]).trim_matches(|c: char| c.is_whitespace() || c == '\0').to_string()
}

/// ONE kernel VM boot: open-iscsi and nvme-tcp connected to serve while
/// `blockwire ctl` adds a LUN and a namespace, resizes them, removes the
/// namespace and the host; the guest checks each the standard way and
/// keeps an I/O loop on another LUN going throughout (tests/kernel-vm/live.sh).
#[test]
fn kernel_initiators_follow_live_changes() {
    require_root();
    let dir = TempDir::new("ctlvm");
    let (ip, np) = (free_port(), free_port());
    let sock = dir.path().join("control.sock");
    let mbox = dir.path().join("mbox");
    let guest = "nqn.2026-11.org.blockwire:live-guest";
    let cfg = format!(
        r#"
[[volume]]
name = "data"
backend = "ram:64M"
[[volume]]
name = "mbox"
backend = "file:{},size=1M"
[iscsi]
listen = ["127.0.0.1:{ip}"]
[[iscsi.target]]
iqn = "{IQN}"
luns = [{{ lun = 0, volume = "data" }}]
[nvme]
listen = ["127.0.0.1:{np}"]
[[nvme.subsystem]]
nqn = "{NQN}"
namespaces = [{{ nsid = 1, volume = "mbox" }}]
allowed_hosts = ["{guest}", "{OTHER}"]
"#,
        mbox.display()
    );
    let serve = Serve::with_config(&dir, &cfg, &["--control", sock.to_str().unwrap()]);
    let script = format!(
        "IPORT={ip}\nNPORT={np}\nIQN={IQN}\nNQN={NQN}\nHOSTNQN={guest}\n{}",
        std::fs::read_to_string(repo_root().join("tests/kernel-vm/live.sh")).unwrap()
    );
    let script_path = dir.path().join("live.sh");
    std::fs::write(&script_path, script).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let vm = std::thread::spawn(move || {
        let run = kernel_vm(&script_path, None, None);
        let _ = tx.send(());
        run
    });
    // Bounds only: the guest is emulated and the machine shared.
    let wait_for = |phase: &str| {
        let deadline = Instant::now() + Duration::from_secs(900);
        while mailbox(&mbox) != phase {
            if rx.try_recv().is_ok() || Instant::now() > deadline {
                panic!("the guest did not reach {phase} (mailbox {:?}); see its console above\n{}", mailbox(&mbox), serve.log_text());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    wait_for("P1");
    ctl(&sock, &["volume_add", r#"{"name": "grow", "backend": "ram:32M"}"#]);
    ctl(&sock, &["iscsi_lun_add", &format!(r#"{{"iqn": "{IQN}", "lun": 1, "volume": "grow"}}"#)]);
    ctl(&sock, &["nvme_ns_add", &format!(r#"{{"nqn": "{NQN}", "nsid": 2, "volume": "grow"}}"#)]);
    wait_for("P2");
    ctl(&sock, &["volume_resize", r#"{"name": "grow", "size": "48M"}"#]);
    wait_for("P3");
    ctl(&sock, &["nvme_ns_remove", &format!(r#"{{"nqn": "{NQN}", "nsid": 2}}"#)]);
    wait_for("P4");
    let sessions = ctl(&sock, &["session_list"]);
    assert!(sessions.contains(guest) && sessions.contains("iqn."), "{sessions}");
    ctl(&sock, &["nvme_host_remove", &format!(r#"{{"nqn": "{NQN}", "host": "{guest}"}}"#)]);
    let run = vm.join().unwrap();
    assert!(run.output.contains("LIVE-OK"), "the guest did not finish:\n{}", run.output);
    assert!(run.status.success(), "guest failed ({})", run.status);
    assert!(serve.stop().success());
}

/// iSCSI sessions are listed with their counters; taking an initiator
/// off a target's ACL ends its session (and it cannot log in again), and
/// session_disconnect ends the one it names.
#[test]
fn iscsi_acl_removal_and_disconnect_end_sessions() {
    require_root();
    let dir = TempDir::new("ctlacl");
    let (ip, np) = (free_port(), free_port());
    let sock = dir.path().join("control.sock");
    let (gone, kept) = ("iqn.2026-11.org.blockwire:acl-gone", "iqn.2026-11.org.blockwire:acl-kept");
    let cfg = config(ip, np, "").replace(&format!("iqn = \"{IQN}\""), &format!("iqn = \"{IQN}\"\nallowed_initiators = [\"{gone}\", \"{kept}\"]"));
    let serve = Serve::with_config(&dir, &cfg, &["--control", sock.to_str().unwrap()]);
    let url = format!("iscsi://127.0.0.1:{ip}/{IQN}/0");
    let bench = |name: &str| {
        Command::new(blockwire_bin())
            .args(["bench", &url, "--runtime", "600", "--initiator-name", name])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut a, mut b) = (bench(gone), bench(kept));
    let sessions = || -> Vec<Value> {
        let v: Value = serde_json::from_str(&ctl(&sock, &["--json", "session_list"])).unwrap();
        v["result"].as_array().unwrap().clone()
    };
    let of = |name: &str| sessions().into_iter().find(|s| s["initiator"] == name);
    eventually("both sessions listed with reads counted", || [gone, kept].iter().all(|n| of(n).is_some_and(|s| s["reads"].as_u64() > Some(0))));
    let row = of(kept).unwrap();
    assert_eq!((row["protocol"].as_str(), row["target"].as_str()), (Some("iscsi"), Some(IQN)));
    assert!(row["peer"].as_str().unwrap().starts_with("127.0.0.1:"), "{row}");

    let out = ctl(&sock, &["iscsi_acl_remove", &format!(r#"{{"iqn": "{IQN}", "initiator": "{gone}"}}"#)]);
    assert!(out.contains("no longer allowed"), "{out}");
    eventually("the removed initiator's session gone for good", || of(gone).is_none() && a.try_wait().unwrap().is_some());
    assert!(of(kept).is_some(), "the other session stays");

    let id = of(kept).unwrap()["id"].as_str().unwrap().to_string();
    ctl(&sock, &["session_disconnect", &format!(r#"{{"id": "{id}"}}"#)]);
    eventually("the disconnected session gone", || of(kept).is_none_or(|s| s["id"] != id.as_str()));
    assert!(ctl_err(&sock, &["session_disconnect", r#"{"id": "iscsi:99999"}"#]).contains("no session"));
    let _ = b.kill();
    let _ = b.wait();
    let _ = a.wait();
    assert!(serve.log_text().contains("its initiator is no longer allowed"), "{}", serve.log_text());
    assert!(serve.stop().success());
}

/// A control-driven target built as blktests' NVME_TARGET_CONTROL builds
/// one (tests/blktests/): serve starts with no volume, takes a subsystem
/// named outside the NQN formats, a namespace with the UUID the test asks
/// for, a host whose keys change (and the answer says so), and a second
/// port that is added, used, and removed under its connection while the
/// discovery log follows.
#[test]
fn an_empty_target_is_built_live_and_its_ports_change() {
    require_root();
    let dir = TempDir::new("ctl-empty");
    let (np, np2) = (free_port(), free_port());
    let sock = dir.path().join("control.sock");
    let toml = format!("[nvme]\nlisten = [\"127.0.0.1:{np}\"]\n");
    // Without a control socket an empty server has nothing to become.
    std::fs::write(dir.path().join("empty.toml"), &toml).unwrap();
    let o = blockwire(None, &["serve", "--config", dir.path().join("empty.toml").to_str().unwrap(), "--control", "none"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no volumes"), "{o:?}");
    let serve = Serve::with_config(&dir, &toml, &["--control", sock.to_str().unwrap()]);
    const SUB: &str = "blktests-subsystem-1";
    const UUID: &str = "91fdba0d-f87b-4c25-b80f-db7be1418b9e";
    ctl(&sock, &["volume_add", r#"{"name": "v", "backend": "ram:8M"}"#]);
    ctl(&sock, &["nvme_subsystem_add", &format!(r#"{{"nqn": "{SUB}"}}"#)]);
    ctl(&sock, &["nvme_ns_add", &format!(r#"{{"nqn": "{SUB}", "nsid": 1, "volume": "v", "uuid": "{UUID}", "eui64": "0011223344556677"}}"#)]);
    let err = ctl_err(&sock, &["nvme_ns_add", &format!(r#"{{"nqn": "{SUB}", "nsid": 2, "volume": "v", "nguid": "12"}}"#)]);
    assert!(err.contains("nguid"), "{err}");

    // The namespace shows the identifiers it was given.
    let (mut q, c) = RawNvme::connected(np, SUB, 0, 0xFFFF, HOST, [7; 16]);
    assert!(c.status.is_success(), "{c:?}");
    assert!(q.command(Property::set_sqe(2, reg::CC, 0x46_0001), &[]).unwrap().status.is_success());
    let mut s = Sqe::new(admin::IDENTIFY, 3, 1);
    s.set_cdw(10, 3); // namespace identification descriptors
    s.set_sgl(Sgl { addr: 0, length: 4096, kind: sgl::TRANSPORT });
    let (c, d) = q.exchange(s, &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    let uuid: Vec<u8> = (0..16).map(|i| u8::from_str_radix(&UUID.replace('-', "")[i * 2..i * 2 + 2], 16).unwrap()).collect();
    assert_eq!(&d[..12], &[1, 8, 0, 0, 0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77]);
    assert_eq!((&d[32..36], &d[36..52]), (&[3, 16, 0, 0][..], &uuid[..]));

    // A second port: served at once, listed in the discovery log, and
    // gone with its connection when removed.
    let out = ctl(&sock, &["nvme_port_add", &format!(r#"{{"addr": "127.0.0.1:{np2}"}}"#)]);
    assert!(out.contains(&format!("port 127.0.0.1:{np2} added")), "{out}");
    assert!(ctl_err(&sock, &["nvme_port_add", &format!(r#"{{"addr": "127.0.0.1:{np2}"}}"#)]).contains("already listens"));
    let discovered = || blockwire_ok(None, &["nvme", "discover", &format!("127.0.0.1:{np}")]);
    let out = discovered();
    assert!(out.contains(&format!("127.0.0.1:{np}/{SUB}")) && out.contains(&format!("127.0.0.1:{np2}/{SUB}")), "{out}");
    let (mut q2, c) = RawNvme::connected(np2, SUB, 0, 0xFFFF, HOST, [8; 16]);
    assert!(c.status.is_success(), "{c:?}");
    let out = ctl(&sock, &["nvme_port_remove", &format!(r#"{{"addr": "127.0.0.1:{np2}"}}"#)]);
    assert!(out.contains(&format!("port 127.0.0.1:{np2} removed")), "{out}");
    assert!(q2.until_closed(usize::MAX, RawNvme::WAIT).closed, "a connection on a removed port stays open");
    assert!(std::net::TcpStream::connect(("127.0.0.1", np2)).is_err(), "the removed port still accepts");
    let out = discovered();
    assert!(out.contains(&format!("127.0.0.1:{np}/{SUB}")) && !out.contains(&format!(":{np2}/")), "{out}");
    assert_eq!(status(&sock)["nvme_ports"], serde_json::json!([format!("127.0.0.1:{np}")]));
    // The other port's controller lives on.
    assert!(q.command(Sqe::new(admin::KEEP_ALIVE, 4, 0), &[]).unwrap().status.is_success());

    // Keys alone changing is a change, and the answer says so.
    const KEY: &str = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    ctl(&sock, &["nvme_host_add", &format!(r#"{{"nqn": "{SUB}", "host": "{HOST}"}}"#)]);
    let out = ctl(&sock, &["nvme_host_add", &format!(r#"{{"nqn": "{SUB}", "host": "{HOST}", "dhchap_secret": "{KEY}"}}"#)]);
    assert!(out.contains("authenticates"), "{out}");
    let out = ctl(&sock, &["nvme_host_add", &format!(r#"{{"nqn": "{SUB}", "host": "{HOST}", "dhchap_secret": "{KEY}", "dhchap_hashes": ["sha512"]}}"#)]);
    assert!(out.contains("changed") && !out.contains("no change"), "{out}");
    let out = ctl(&sock, &["nvme_host_add", &format!(r#"{{"nqn": "{SUB}", "host": "{HOST}", "dhchap_secret": "{KEY}", "dhchap_hashes": ["sha512"]}}"#)]);
    assert_eq!(out.trim(), "no change");
    assert!(serve.stop().success());
}
