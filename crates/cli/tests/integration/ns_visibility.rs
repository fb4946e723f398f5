//! Per-host namespace visibility in one NVMe subsystem (SPDK's
//! `no_auto_visible`, `nvmf_ns_add_host`, `nvmf_ns_remove_host`), seen by
//! raw NVMe/TCP hosts: a namespace a host was not given is absent from its
//! Identify lists, zeroed in Identify Namespace and refused for I/O and
//! reservations; giving it (through SPDK's own Python client) or taking it
//! away reaches that host, and only it, as a Namespace Attribute Changed
//! event with the Changed Namespace List; the change is persisted and
//! listed. Bad names and numbers are refused and change nothing.

use crate::common::nvme_raw::RawNvme;
use crate::common::*;
use crate::control::mailbox;
use crate::volumes::{spdk_rpc, venv};
use bw_nvme::fabrics::{reg, Property};
use bw_nvme::identify::cns;
use bw_nvme::logpage::{lid, LogRequest};
use bw_nvme::pdu::{self, Digests, Pdu};
use bw_nvme::queue_entry::{admin, nvm, sgl, Sgl, Sqe};
use bw_nvme::Status;
use serde_json::Value;
use std::io::Write;
use std::path::Path;

const NQN: &str = "nqn.2026-11.org.blockwire:vis";
const H1: &str = "nqn.2026-11.org.blockwire:vis-host1";
const H2: &str = "nqn.2026-11.org.blockwire:vis-host2";

fn config(np: u16) -> String {
    format!(
        r#"
[[volume]]
name = "a"
backend = "ram:4M"
[[volume]]
name = "b"
backend = "ram:4M"
[[volume]]
name = "c"
backend = "ram:4M"
[nvme]
listen = ["127.0.0.1:{np}"]
[[nvme.subsystem]]
nqn = "{NQN}"
namespaces = [{{ nsid = 1, volume = "a" }}, {{ nsid = 2, volume = "b", no_auto_visible = true, hosts = ["{H1}"] }}]
allowed_hosts = ["{H1}", "{H2}"]
"#
    )
}

/// A host's controller: its admin queue (enabled, namespace notices on,
/// an Asynchronous Event Request with command id 40 outstanding) and one
/// I/O queue.
struct Host {
    admin: RawNvme,
    io: RawNvme,
}

impl Host {
    fn connect(port: u16, hostnqn: &str, hostid: [u8; 16]) -> Host {
        let (mut admin, c) = RawNvme::connected(port, NQN, 0, 0xFFFF, hostnqn, hostid);
        assert!(c.status.is_success(), "{hostnqn}: {c:?}");
        assert!(admin.command(Property::set_sqe(2, reg::CC, 0x46_0001), &[]).unwrap().status.is_success());
        let mut s = Sqe::new(admin::SET_FEATURES, 3, 0);
        s.set_cdw(10, bw_nvme::controller::feature::ASYNC_EVENT as u32);
        s.set_cdw(11, 1 << 8);
        assert!(admin.command(s, &[]).unwrap().status.is_success());
        let (io, c2) = RawNvme::connected(port, NQN, 1, c.result as u16, hostnqn, hostid);
        assert!(c2.status.is_success(), "{hostnqn} I/O queue: {c2:?}");
        let mut h = Host { admin, io };
        h.arm(40);
        h
    }

    /// An Asynchronous Event Request, left outstanding.
    fn arm(&mut self, cid: u16) {
        let mut out = Vec::new();
        pdu::encode_capsule(&Sqe::new(admin::ASYNC_EVENT, cid, 0), &[], Digests::default(), &mut out);
        self.admin.s.write_all(&out).unwrap();
    }

    /// The next thing on the admin queue must be the event for `cid`.
    fn told(&mut self, cid: u16) {
        match self.admin.next(RawNvme::WAIT) {
            Some(Pdu::CapsuleResp(c)) => assert_eq!((c.cid, c.result), (cid, bw_nvme::controller::AEN_NS_CHANGED as u64)),
            p => panic!("no Namespace Attribute Changed event: {:?}", p.map(|p| p.kind())),
        }
    }

    fn identify(&mut self, c: u8, nsid: u32) -> (Status, Vec<u8>) {
        let mut s = Sqe::new(admin::IDENTIFY, 5, nsid);
        s.set_cdw(10, c as u32);
        s.set_sgl(Sgl { addr: 0, length: 4096, kind: sgl::TRANSPORT });
        let (c, d) = self.admin.exchange(s, &[]).unwrap();
        (c.status, d)
    }

    fn active(&mut self) -> Vec<u32> {
        let (st, d) = self.identify(cns::ACTIVE_NS_LIST, 0);
        assert!(st.is_success());
        words(&d)
    }

    /// The Changed Namespace List, read (and cleared).
    fn changed(&mut self) -> Vec<u32> {
        let l = LogRequest { lid: lid::CHANGED_NS, rae: false, len: 4096, offset: 0 };
        let mut s = l.to_sqe(41, 0);
        s.set_sgl(Sgl { addr: 0, length: 4096, kind: sgl::TRANSPORT });
        let (c, d) = self.admin.exchange(s, &[]).unwrap();
        assert!(c.status.is_success());
        words(&d)
    }

    /// A one-block Read and a Reservation Report of `nsid`: their statuses.
    fn io(&mut self, nsid: u32) -> [Status; 2] {
        let mut read = Sqe::new(nvm::READ, 7, nsid);
        read.set_sgl(Sgl { addr: 0, length: 512, kind: sgl::TRANSPORT });
        let mut report = Sqe::new(nvm::RESV_REPORT, 8, nsid);
        report.set_cdw(10, 4096 / 4 - 1);
        report.set_cdw(11, 1);
        report.set_sgl(Sgl { addr: 0, length: 4096, kind: sgl::TRANSPORT });
        [read, report].map(|s| self.io.command(s, &[]).expect("answered").status)
    }
}

fn words(d: &[u8]) -> Vec<u32> {
    d.chunks(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).take_while(|n| *n != 0).collect()
}

fn ctl(sock: &Path, method: &str, params: &str) -> Result<Value, String> {
    let o = blockwire(None, &["ctl", "--control", sock.to_str().unwrap(), "--json", method, params]);
    let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&o.stderr)))?;
    match v.get("error") {
        Some(e) => Err(e.to_string()),
        None => Ok(v["result"].clone()),
    }
}

#[test]
fn hosts_see_only_the_namespaces_they_were_given_and_hear_of_changes() {
    require_root();
    let venv = venv(&["spdk"]);
    let dir = TempDir::new("ns-vis");
    let np = free_port();
    let sock = dir.path().join("control.sock");
    let serve = Serve::with_config(&dir, &config(np), &["--control", sock.to_str().unwrap()]);
    let file = dir.path().join("serve.toml");
    let rpc = |args: &[&str]| spdk_rpc(&venv, &sock, args).unwrap_or_else(|e| panic!("spdk-rpc {args:?}: {e}"));

    let (mut h1, mut h2) = (Host::connect(np, H1, [1; 16]), Host::connect(np, H2, [2; 16]));
    assert_eq!((h1.active(), h2.active()), (vec![1, 2], vec![1]));
    let (st, d) = h2.identify(cns::NAMESPACE, 2);
    assert!(st.is_success() && d.iter().all(|b| *b == 0), "an inactive NSID's Identify Namespace is zeroed");
    assert!(h1.identify(cns::NAMESPACE, 2).1[..8] != [0; 8]);
    assert_eq!(h2.identify(cns::NS_DESCRIPTORS, 2).0, Status::INVALID_NS.dnr());
    let refused = [Status::INVALID_NS.dnr(); 2];
    assert_eq!(h2.io(2), refused);
    assert!(h1.io(2).iter().all(|s| s.is_success()), "{:?}", h1.io(2));
    assert!(h2.io(1).iter().all(|s| s.is_success()));

    // Hostile and wrong requests: each refused, nothing changed, nobody told.
    let before = (std::fs::read_to_string(&file).unwrap(), ctl(&sock, "nvmf_get_subsystems", "{}").unwrap());
    let long = format!("nqn.2026-11.org.blockwire:{}", "x".repeat(300));
    for (method, p) in [
        ("nvmf_ns_add_host", format!(r#"{{"nqn": "{NQN}", "nsid": 9, "host": "{H2}"}}"#)),
        ("nvmf_ns_add_host", format!(r#"{{"nqn": "{NQN}", "nsid": 0, "host": "{H2}"}}"#)),
        ("nvmf_ns_add_host", format!(r#"{{"nqn": "{NQN}", "nsid": 4294967295, "host": "{H2}"}}"#)),
        ("nvmf_ns_add_host", format!(r#"{{"nqn": "{NQN}", "nsid": 1, "host": "{H2}"}}"#)),
        ("nvmf_ns_add_host", format!(r#"{{"nqn": "nqn.2026-11.org.blockwire:none", "nsid": 2, "host": "{H2}"}}"#)),
        ("nvmf_ns_add_host", format!(r#"{{"nqn": "{NQN}", "nsid": 2, "host": ""}}"#)),
        ("nvmf_ns_add_host", format!(r#"{{"nqn": "{NQN}", "nsid": 2, "host": "{H2}\u0001"}}"#)),
        ("nvmf_ns_add_host", format!(r#"{{"nqn": "{NQN}", "nsid": 2, "host": "{long}"}}"#)),
        ("nvmf_ns_add_host", format!(r#"{{"nqn": "{NQN}", "nsid": -2, "host": "{H2}"}}"#)),
        ("nvmf_ns_remove_host", format!(r#"{{"nqn": "{NQN}", "nsid": 9, "host": "{H1}"}}"#)),
        ("nvme_ns_host_add", format!(r#"{{"nqn": "{NQN}", "nsid": 2, "host": "{H2}", "extra": 1}}"#)),
        ("nvme_ns_host_remove", format!(r#"{{"nqn": "{NQN}", "nsid": 1, "host": "{H1}"}}"#)),
        ("nvme_ns_add", format!(r#"{{"nqn": "{NQN}", "nsid": 3, "volume": "c", "hosts": ["{H2}"]}}"#)),
        ("nvme_ns_add", format!(r#"{{"nqn": "{NQN}", "nsid": 3, "volume": "c", "no_auto_visible": true, "hosts": ["{H2}", "{H2}"]}}"#)),
        ("nvme_ns_add", format!(r#"{{"nqn": "{NQN}", "nsid": 3, "volume": "c", "no_auto_visible": true, "hosts": ["{H2}\u0007"]}}"#)),
    ] {
        assert!(ctl(&sock, method, &p).is_err(), "{method} {p} was accepted");
    }
    assert_eq!((std::fs::read_to_string(&file).unwrap(), ctl(&sock, "nvmf_get_subsystems", "{}").unwrap()), before);
    assert_eq!((h1.changed(), h2.changed()), (vec![], vec![]), "a refused change told a host something");

    // Given through SPDK's own client: host 2 alone is told, sees it, reads it.
    rpc(&["nvmf_ns_add_host", NQN, "2", H2]);
    h2.told(40);
    assert_eq!(h2.changed(), [2]);
    assert_eq!(h2.active(), [1, 2]);
    assert!(h2.io(2).iter().all(|s| s.is_success()));
    assert_eq!(h1.changed(), Vec::<u32>::new(), "host 1's view did not change");
    // Again: no change, no error (as SPDK).
    rpc(&["nvmf_ns_add_host", NQN, "2", H2]);
    let subs = rpc(&["nvmf_get_subsystems"]);
    let ns2 = &subs.as_array().unwrap().iter().find(|s| s["nqn"] == NQN).unwrap()["namespaces"][1];
    assert_eq!((ns2["no_auto_visible"].as_bool(), ns2["hosts"].clone()), (Some(true), serde_json::json!([{ "nqn": H1 }, { "nqn": H2 }])), "{subs}");
    let vols = ctl(&sock, "volume_list", "{}").unwrap();
    let b = vols.as_array().unwrap().iter().find(|v| v["name"] == "b").unwrap();
    assert_eq!(b["nvme_visibility"], serde_json::json!([{ "nqn": NQN, "nsid": 2, "hosts": [H1, H2] }]), "{b}");
    let a = vols.as_array().unwrap().iter().find(|v| v["name"] == "a").unwrap();
    assert_eq!(a["nvme_visibility"][0]["hosts"], "all");
    // Persisted whole: a restart from the file keeps it.
    let printed = blockwire_ok(None, &["serve", "--config", file.to_str().unwrap(), "--print-config"]);
    assert!(printed.contains(H2) && printed.contains("\"no_auto_visible\": true"), "{printed}");

    // A namespace no host was given: nobody is told; then host 1 is given it.
    rpc(&["nvmf_subsystem_add_ns", "-n", "3", "-i", NQN, "c"]);
    assert_eq!((h1.active(), h2.active()), (vec![1, 2], vec![1, 2]));
    ctl(&sock, "nvme_ns_host_add", &format!(r#"{{"nqn": "{NQN}", "nsid": 3, "host": "{H1}"}}"#)).unwrap();
    h1.told(40);
    assert_eq!((h1.changed(), h1.active()), (vec![3], vec![1, 2, 3]));
    assert_eq!(h2.changed(), Vec::<u32>::new());

    // Taken away again, live: host 2 is told and refused once more.
    h2.arm(42);
    rpc(&["nvmf_ns_remove_host", NQN, "2", H2]);
    h2.told(42);
    assert_eq!((h2.changed(), h2.active()), (vec![2], vec![1]));
    assert_eq!(h2.io(2), refused);
    assert_eq!(h1.active(), [1, 2, 3]);
    assert!(serve.stop().success());
}

/// The Linux host in the kernel VM (tests/kernel-vm/ns-visibility.sh),
/// in one boot: as host 1 it lists (`nvme list-ns`) and has block devices
/// for only namespaces 1 and 2; namespace 3 appears when given to it and
/// goes when taken away, with no reconnect; as host 2 it sees 1 and 3
/// (whose block device is nvmeXn2: the script finds devices by their
/// sysfs `nsid`, not by name).
#[test]
fn linux_hosts_see_only_their_namespaces() {
    require_root();
    let venv = venv(&["spdk"]);
    let dir = TempDir::new("ns-vis-vm");
    let np = free_port();
    let sock = dir.path().join("control.sock");
    let mbox = dir.path().join("mbox");
    let cfg = format!(
        r#"
[[volume]]
name = "mbox"
backend = "file:{},size=1M"
[[volume]]
name = "a"
backend = "ram:8M"
[[volume]]
name = "b"
backend = "ram:16M"
[nvme]
listen = ["127.0.0.1:{np}"]
[[nvme.subsystem]]
nqn = "{NQN}"
namespaces = [{{ nsid = 1, volume = "mbox" }}, {{ nsid = 2, volume = "a", no_auto_visible = true, hosts = ["{H1}"] }}, {{ nsid = 3, volume = "b", no_auto_visible = true, hosts = ["{H2}"] }}]
allowed_hosts = ["{H1}", "{H2}"]
"#,
        mbox.display()
    );
    let serve = Serve::with_config(&dir, &cfg, &["--control", sock.to_str().unwrap()]);
    let script = format!("NPORT={np}\nNQN={NQN}\nH1={H1}\nH2={H2}\n{}", std::fs::read_to_string(repo_root().join("tests/kernel-vm/ns-visibility.sh")).unwrap());
    let script_path = dir.path().join("ns-visibility.sh");
    std::fs::write(&script_path, script).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let vm = std::thread::spawn(move || {
        let run = kernel_vm(&script_path, None, None);
        let _ = tx.send(());
        run
    });
    // Bounds only: the guest is emulated and the machine shared.
    let wait_for = |phase: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(900);
        while mailbox(&mbox) != phase {
            if rx.try_recv().is_ok() || std::time::Instant::now() > deadline {
                panic!("the guest did not reach {phase} (mailbox {:?}); see its console above\n{}", mailbox(&mbox), serve.log_text());
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    };
    let rpc = |args: &[&str]| spdk_rpc(&venv, &sock, args).unwrap_or_else(|e| panic!("spdk-rpc {args:?}: {e}"));
    wait_for("P1");
    rpc(&["nvmf_ns_add_host", NQN, "3", H1]);
    wait_for("P2");
    rpc(&["nvmf_ns_remove_host", NQN, "3", H1]);
    let run = vm.join().unwrap();
    assert!(run.output.contains("VIS-OK"), "the guest did not finish:\n{}", run.output);
    assert!(run.status.success(), "guest failed ({})", run.status);
    assert!(serve.stop().success());
}
