//! Volume pools and the SPDK-compatible API (issue 40), against real
//! clients: `blockwire ctl` for the lifecycle (pools on xfs with reflinks
//! and on ext4 without, on loop files this module makes), SPDK's own
//! Python client (`spdk-rpc` from the `spdk` package on PyPI, in a venv
//! under target/) for lvols and their NVMe/TCP and iSCSI exports,
//! OpenStack Cinder's SPDK driver over HTTP, and blockwire's initiator
//! reading back what must be where: a clone holds its snapshot's data,
//! an origin's later writes are not in its snapshot. Also: idempotency,
//! refusal to delete an exported volume, the configuration file old or
//! new after a SIGKILL at any moment of a change, and snapshots that hold
//! every write acknowledged before them.

use crate::common::*;
use crate::load::{opts, runtime};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A file system on a loop file, mounted under a temp dir; unmounted and
/// removed on drop.
struct LoopFs {
    dir: TempDir,
}

impl LoopFs {
    /// `mkfs` is the command and its options, e.g. `mkfs.xfs -q -m reflink=1`.
    fn new(tag: &str, mkfs: &str) -> LoopFs {
        LoopFs::sized(tag, mkfs, "1G")
    }

    fn sized(tag: &str, mkfs: &str, size: &str) -> LoopFs {
        require_root();
        let dir = TempDir::new_in(env!("CARGO_TARGET_TMPDIR"), tag);
        let img = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        sh(&format!("truncate -s {size} {0} && {mkfs} {0} && mount -o loop {0} {1}", img.display(), mnt.display()));
        LoopFs { dir }
    }

    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let m = self.mnt();
        let _ = Command::new("umount").arg(&m).status();
    }
}

fn ctl_out(sock: &Path, args: &[&str]) -> std::process::Output {
    let mut a = vec!["ctl", "--control", sock.to_str().unwrap(), "--json"];
    a.extend_from_slice(args);
    blockwire(None, &a)
}

/// `blockwire ctl --json METHOD PARAMS` that must succeed: its result.
fn ctl(sock: &Path, method: &str, params: &str) -> Value {
    let o = ctl_out(sock, &[method, params]);
    assert!(o.status.success(), "ctl {method} {params}: {}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    v["result"].clone()
}

/// `blockwire ctl` that must fail: its error message.
fn ctl_err(sock: &Path, method: &str, params: &str) -> String {
    let o = ctl_out(sock, &[method, params]);
    assert!(!o.status.success(), "ctl {method} {params} succeeded: {}", String::from_utf8_lossy(&o.stdout));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A block of `len` bytes that says which pattern and offset it is.
fn pattern(tag: u8, offset: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| tag ^ ((offset as usize + i) as u8).rotate_left(3)).collect()
}

fn write_url(url: &str, offset: u64, data: &[u8]) -> Result<(), String> {
    let rt = runtime();
    let c = rt.block_on(bw_initiator::connect(url, &opts(1))).map_err(|e| e.to_string())?;
    let r = rt.block_on(async {
        c.write(offset, data).await?;
        c.flush().await
    });
    let _ = rt.block_on(c.close());
    r.map_err(|e| e.to_string())
}

fn read_url(url: &str, offset: u64, len: usize) -> Vec<u8> {
    let rt = runtime();
    let c = rt.block_on(bw_initiator::connect(url, &opts(1))).unwrap_or_else(|e| panic!("{url}: {e}"));
    let mut buf = vec![0u8; len];
    rt.block_on(c.read(offset, &mut buf)).unwrap_or_else(|e| panic!("{url}: read: {e}"));
    let _ = rt.block_on(c.close());
    buf
}

fn size_of_url(url: &str) -> u64 {
    let rt = runtime();
    let c = rt.block_on(bw_initiator::connect(url, &opts(1))).unwrap_or_else(|e| panic!("{url}: {e}"));
    let s = c.size_bytes();
    let _ = rt.block_on(c.close());
    s
}

const MIB: usize = 1 << 20;

fn server_toml(pools: &str, iscsi: u16, nvme: u16) -> String {
    format!("{pools}\n[iscsi]\nlisten = [\"127.0.0.1:{iscsi}\"]\n[nvme]\nlisten = [\"127.0.0.1:{nvme}\"]\n")
}

/// The lifecycle through `blockwire ctl` on an xfs pool: create (thin),
/// idempotent create, snapshot, clone, exports, data where it must be, a
/// write-protected snapshot namespace, refusal to delete what is
/// exported, and the same volumes, snapshots and exports after a restart
/// from the configuration file the changes were written to.
#[test]
fn lifecycle_on_reflinks_survives_a_restart() {
    let fs = LoopFs::new("vol-xfs", "mkfs.xfs -q -m reflink=1");
    let dir = TempDir::new("vol-life");
    let sock = dir.path().join("c.sock");
    let (ip, np) = (free_port(), free_port());
    let pool = fs.mnt().join("pool");
    // A server needs something to serve at start; the pool comes later.
    let cfg = server_toml("[[volume]]\nname = \"scratch\"\nbackend = \"ram:1M\"\n", ip, np);
    let serve = Serve::with_config(&dir, &cfg, &["--control", sock.to_str().unwrap()]);
    let made = ctl(&sock, "pool_create", &format!(r#"{{"name":"p","path":"{}"}}"#, pool.display()));
    assert_eq!(made["pool"]["reflinks"], true, "{made}");
    let v = ctl(&sock, "volume_create", r#"{"name":"v","size":"16M","pool":"p"}"#);
    assert_eq!((v["volume"]["provisioned_bytes"].as_u64(), v["volume"]["allocated_bytes"].as_u64()), (Some(16 << 20), Some(0)), "thin: {v}");
    // The same again: the existing volume, nothing changed.
    let again = ctl(&sock, "volume_create", r#"{"name":"v","size":"16M","pool":"p"}"#);
    assert_eq!((again["changes"].as_array().map(Vec::len), &again["volume"]["uuid"]), (Some(0), &v["volume"]["uuid"]), "{again}");
    let e = ctl_err(&sock, "volume_create", r#"{"name":"v","size":"32M","pool":"p"}"#);
    assert!(e.contains("other parameters") && e.contains("size is 16777216, not 33554432"), "{e}");

    let nqn = "nqn.2026-11.org.blockwire:vol";
    ctl(&sock, "nvme_subsystem_add", &format!(r#"{{"nqn":"{nqn}"}}"#));
    ctl(&sock, "nvme_ns_add", &format!(r#"{{"nqn":"{nqn}","nsid":1,"volume":"v"}}"#));
    let url = |n: u32| format!("nvme+tcp://127.0.0.1:{np}/{nqn}/{n}");
    write_url(&url(1), 0, &pattern(1, 0, 4 * MIB)).unwrap();
    ctl(&sock, "volume_snapshot", r#"{"name":"v","snapshot":"s"}"#);
    write_url(&url(1), MIB as u64, &pattern(2, MIB as u64, MIB)).unwrap();
    ctl(&sock, "volume_clone", r#"{"snapshot":"s","name":"c"}"#);
    ctl(&sock, "nvme_ns_add", &format!(r#"{{"nqn":"{nqn}","nsid":2,"volume":"s"}}"#));
    ctl(&sock, "nvme_ns_add", &format!(r#"{{"nqn":"{nqn}","nsid":3,"volume":"c"}}"#));
    let check = |why: &str| {
        let now_v = read_url(&url(1), 0, 4 * MIB);
        assert!(now_v[MIB..2 * MIB] == pattern(2, MIB as u64, MIB)[..] && now_v[..MIB] == pattern(1, 0, MIB)[..], "{why}: the origin lost a write");
        assert!(read_url(&url(2), 0, 4 * MIB) == pattern(1, 0, 4 * MIB), "{why}: the snapshot does not hold the data of its moment");
        assert!(read_url(&url(3), 0, 4 * MIB) == pattern(1, 0, 4 * MIB), "{why}: the clone does not hold its snapshot's data");
    };
    check("before the restart");
    // The snapshot's namespace is write-protected; the clone is writable.
    let e = write_url(&url(2), 0, &[0u8; 4096]).unwrap_err();
    assert!(!e.is_empty(), "a write to the snapshot succeeded");
    write_url(&url(3), 8 * MIB as u64, &pattern(3, 0, MIB)).unwrap();
    // Exported volumes are not deleted; the error names the exports.
    let e = ctl_err(&sock, "volume_delete", r#"{"name":"v"}"#);
    assert!(e.contains("exported") && e.contains(&format!("NVMe {nqn} namespace 1")), "{e}");
    let list = ctl(&sock, "volume_list", "{}");
    let s = list.as_array().unwrap().iter().find(|x| x["name"] == "s").unwrap();
    assert_eq!((&s["readonly"], &s["snapshot_of"], &s["clones"]), (&Value::Bool(true), &Value::from("v"), &serde_json::json!(["v", "c"])), "{list}");
    let pools = ctl(&sock, "pool_list", "{}");
    assert!(pools[0]["allocated_bytes"].as_u64().unwrap() >= (5 * MIB) as u64, "{pools}");
    assert_eq!(pools[0]["provisioned_bytes"].as_u64(), Some(3 * (16 << 20)), "{pools}");
    drop(serve);

    // A restart from the file the changes went to serves the same.
    let text = std::fs::read_to_string(dir.path().join("serve.toml")).unwrap();
    assert!(text.contains("[[pool]]") && text.contains("snapshot_of = \"v\""), "{text}");
    let _serve = Serve::start(&["--config", dir.path().join("serve.toml").to_str().unwrap(), "--control", sock.to_str().unwrap()]);
    assert_eq!(list_without_allocation(&ctl(&sock, "volume_list", "{}")), list_without_allocation(&list), "volumes after the restart");
    check("after the restart");
    assert!(read_url(&url(3), 8 * MIB as u64, MIB) == pattern(3, 0, MIB), "the clone's own write is gone");
    // Unexported, deletion goes through and takes the file, and the
    // reservations kept beside it (as a reservation leaves them: a new
    // volume of the name must not inherit them).
    ctl(&sock, "nvme_ns_remove", &format!(r#"{{"nqn":"{nqn}","nsid":3}}"#));
    for f in ["c.img.pr", "c.img.pr.lock"] {
        std::fs::write(pool.join(f), b"{}").unwrap();
    }
    ctl(&sock, "volume_delete", r#"{"name":"c"}"#);
    assert!(!pool.join("c.img").exists());
    assert!(!pool.join("c.img.pr").exists() && !pool.join("c.img.pr.lock").exists(), "the reservations beside c.img were left");
    assert!(ctl_err(&sock, "volume_delete", r#"{"name":"c"}"#).contains("no volume c"));
}

/// sha256 of `data`, as `sha256sum` prints it (the guest's busybox
/// computes the same).
fn sha256_hex(data: &[u8]) -> String {
    use std::io::Write;
    let mut c = Command::new("sha256sum").stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    c.stdin.take().unwrap().write_all(data).unwrap();
    let out = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_string()
}

/// The Linux nvme-tcp host (Debian kernel in the VM, one boot) reads pool
/// volumes made through the control socket: the snapshot and its clone
/// hold what the test wrote before the snapshot, the origin's later write
/// is not in the snapshot, and the snapshot's namespace refuses writes
/// (the host sees it read-only, and a Write passed through to the target
/// comes back write protected); the clone takes the guest's write, and
/// the host reads it back (tests/kernel-vm/volumes.sh).
#[test]
fn kernel_initiator_reads_snapshots_and_clones() {
    let fs = LoopFs::new("vol-kvm", "mkfs.xfs -q -m reflink=1");
    let dir = TempDir::new("vol-kvm");
    let sock = dir.path().join("c.sock");
    let (ip, np) = (free_port(), free_port());
    let nqn = "nqn.2026-11.org.blockwire:vol-kvm";
    let host = "nqn.2026-11.org.blockwire:kernel-vm";
    let cfg = server_toml("[[volume]]\nname = \"scratch\"\nbackend = \"ram:1M\"\n", ip, np);
    let serve = Serve::with_config(&dir, &cfg, &["--control", sock.to_str().unwrap()]);
    ctl(&sock, "pool_create", &format!(r#"{{"name":"p","path":"{}/pool"}}"#, fs.mnt().display()));
    ctl(&sock, "volume_create", r#"{"name":"v","size":"64M","pool":"p"}"#);
    ctl(&sock, "nvme_subsystem_add", &format!(r#"{{"nqn":"{nqn}","namespaces":[{{"nsid":1,"volume":"v"}}]}}"#));
    let url = |n: u32| format!("nvme+tcp://127.0.0.1:{np}/{nqn}/{n}");
    let a = pattern(0x21, 0, 4 * MIB);
    let b = pattern(0x42, MIB as u64, MIB);
    write_url(&url(1), 0, &a).unwrap();
    ctl(&sock, "volume_snapshot", r#"{"name":"v","snapshot":"s"}"#);
    write_url(&url(1), MIB as u64, &b).unwrap();
    ctl(&sock, "volume_clone", r#"{"snapshot":"s","name":"c"}"#);
    // NSIDs out of the order the host numbers its devices in.
    ctl(&sock, "nvme_ns_add", &format!(r#"{{"nqn":"{nqn}","nsid":7,"volume":"s"}}"#));
    ctl(&sock, "nvme_ns_add", &format!(r#"{{"nqn":"{nqn}","nsid":3,"volume":"c"}}"#));
    let script = dir.path().join("volumes.sh");
    let body = std::fs::read_to_string(repo_root().join("tests/kernel-vm/volumes.sh")).unwrap();
    let settings = format!(
        "PORT={np}\nNQN={nqn}\nHOSTNQN={host}\nNS_ORIGIN=1\nNS_SNAP=7\nNS_CLONE=3\nSUM_A={}\nSUM_B={}\nSUM_A_AT_1M={}\n",
        sha256_hex(&a),
        sha256_hex(&b),
        sha256_hex(&a[MIB..2 * MIB])
    );
    std::fs::write(&script, format!("{settings}{body}")).unwrap();
    let run = kernel_vm(&script, None, None);
    for step in [
        "VOL-OK: snapshot holds the data written before it",
        "VOL-OK: clone holds the snapshot's data",
        "VOL-OK: the origin's write after the snapshot is not in the snapshot",
        "VOL-OK: passthrough Write to the snapshot: write protected",
        "VOL-OK: snapshot read-only",
        "VOL-OK: clone written and read back",
        "VOL-ALL-OK",
    ] {
        assert!(run.output.contains(step), "the guest did not report {step:?}\n{}", run.output);
    }
    assert!(run.status.success(), "the guest script failed ({})", run.status);
    // What the guest wrote to the clone is there for blockwire's initiator
    // too, and the snapshot is as it was.
    let wrote = run.output.lines().find_map(|l| l.trim().strip_prefix("VOL-CLONE-WRITE: ")).expect("the guest's clone write checksum").trim().to_string();
    assert_eq!(sha256_hex(&read_url(&url(3), 8 * MIB as u64, MIB)), wrote, "the guest's write to the clone");
    assert!(read_url(&url(7), 0, 4 * MIB) == a, "the snapshot changed");
    assert!(serve.stop().success());
}

/// An RBD pool (`[[pool]]` with `rbd`, on the project's Ceph test
/// cluster): a volume is an image, a snapshot a protected RBD snapshot, a
/// clone an RBD clone of it, exported over NVMe/TCP and read back with
/// blockwire's initiator (the snapshot holds what was written before it,
/// not the origin's later write; the clone holds the snapshot's data and
/// takes writes); deletes are refused while exported, while a snapshot has
/// clones and while an image has snapshots (each named), and then remove
/// the images and the snapshot from the cluster, and an exported image's
/// reservation object with it (a new image of that name must not inherit
/// its registrations).
#[test]
fn rbd_pool_snapshots_and_clones() {
    let ceph = crate::common::ceph::Ceph::shared();
    let conf = ceph.conf().display().to_string();
    let dir = TempDir::new("vol-rbd");
    let sock = dir.path().join("c.sock");
    let (ip, np) = (free_port(), free_port());
    let u = unique("");
    let (v, s, c) = (format!("v{u}"), format!("s{u}"), format!("c{u}"));
    let pools = format!("[[pool]]\nname = \"r\"\nrbd = \"rbd\"\nconf = \"{conf}\"\n");
    let _serve = Serve::with_config(&dir, &server_toml(&pools, ip, np), &["--control", sock.to_str().unwrap()]);
    // The same pool again: nothing changes; another Ceph pool under the name: refused.
    let again = ctl(&sock, "pool_create", &format!(r#"{{"name":"r","rbd":"rbd","conf":"{conf}"}}"#));
    assert_eq!(again["changes"], serde_json::json!([]), "{again}");
    let e = ctl_err(&sock, "pool_create", &format!(r#"{{"name":"r","rbd":"other","conf":"{conf}"}}"#));
    assert!(e.contains("rbd is Some(\"rbd\"), not Some(\"other\")"), "{e}");
    let made = ctl(&sock, "volume_create", &format!(r#"{{"name":"{v}","size":"64M","pool":"r"}}"#));
    assert_eq!(made["volume"]["provisioned_bytes"].as_u64(), Some(64 << 20), "{made}");
    assert!(ceph.rbd(&["info", &format!("rbd/{v}")]).contains("size 64 MiB"), "volume_create made no image");

    let nqn = "nqn.2026-11.org.blockwire:vol-rbd";
    ctl(&sock, "nvme_subsystem_add", &format!(r#"{{"nqn":"{nqn}","namespaces":[{{"nsid":1,"volume":"{v}"}}]}}"#));
    let url = |n: u32| format!("nvme+tcp://127.0.0.1:{np}/{nqn}/{n}");
    let a = pattern(0x33, 0, 4 * MIB);
    let b = pattern(0x44, MIB as u64, MIB);
    write_url(&url(1), 0, &a).unwrap();
    let pr_object = format!("blockwire.pr.{v}");
    assert!(ceph.rados(&["-p", "rbd", "ls"]).lines().any(|l| l == pr_object), "serving {v} made no reservation object");
    ctl(&sock, "volume_snapshot", &format!(r#"{{"name":"{v}","snapshot":"{s}"}}"#));
    write_url(&url(1), MIB as u64, &b).unwrap();
    let snaps = ceph.rbd(&["snap", "ls", "--format", "json", &format!("rbd/{v}")]);
    assert!(snaps.contains(&format!("\"name\":\"{s}\"")) && snaps.contains("\"protected\":\"true\""), "no protected RBD snapshot: {snaps}");
    ctl(&sock, "volume_clone", &format!(r#"{{"snapshot":"{s}","name":"{c}"}}"#));
    assert!(ceph.rbd(&["info", &format!("rbd/{c}")]).contains(&format!("parent: rbd/{v}@{s}")), "the clone is not an RBD clone of the snapshot");
    ctl(&sock, "nvme_ns_add", &format!(r#"{{"nqn":"{nqn}","nsid":2,"volume":"{s}"}}"#));
    ctl(&sock, "nvme_ns_add", &format!(r#"{{"nqn":"{nqn}","nsid":3,"volume":"{c}"}}"#));
    assert!(read_url(&url(2), 0, 4 * MIB) == a, "the snapshot does not hold what was written before it (or holds the later write)");
    assert!(read_url(&url(3), 0, 4 * MIB) == a, "the clone does not hold its snapshot's data");
    assert!(read_url(&url(1), MIB as u64, MIB) == b, "the origin lost its write");
    assert!(write_url(&url(2), 0, &[1u8; 4096]).is_err(), "the snapshot took a write");
    write_url(&url(3), 8 * MIB as u64, &pattern(0x55, 0, MIB)).unwrap();
    assert!(read_url(&url(3), 8 * MIB as u64, MIB) == pattern(0x55, 0, MIB), "the clone's write");
    assert!(read_url(&url(2), 0, 4 * MIB) == a, "a write to the clone reached the snapshot");

    let list = ctl(&sock, "volume_list", "{}");
    let find = |n: &str| list.as_array().unwrap().iter().find(|x| x["name"] == n).cloned().unwrap();
    assert_eq!((&find(&s)["readonly"], &find(&s)["clones"], &find(&v)["snapshots"]), (&Value::Bool(true), &serde_json::json!([c]), &serde_json::json!([s])), "{list}");
    assert!(find(&v)["allocated_bytes"].as_u64().unwrap() >= 4 * MIB as u64, "{list}");
    let pools = ctl(&sock, "pool_list", "{}");
    assert_eq!((pools[0]["rbd"].as_str(), pools[0]["provisioned_bytes"].as_u64()), (Some("rbd"), Some(3 * (64 << 20))), "{pools}");

    // Refusals, each naming what stands in the way; then the deletes.
    let e = ctl_err(&sock, "volume_delete", &format!(r#"{{"name":"{s}"}}"#));
    assert!(e.contains("exported") && e.contains(&format!("NVMe {nqn} namespace 2")), "{e}");
    ctl(&sock, "nvme_subsystem_remove", &format!(r#"{{"nqn":"{nqn}"}}"#));
    let e = ctl_err(&sock, "volume_delete", &format!(r#"{{"name":"{s}"}}"#));
    assert!(e.contains("clones") && e.contains(&c), "{e}");
    let e = ctl_err(&sock, "volume_delete", &format!(r#"{{"name":"{v}"}}"#));
    assert!(e.contains("snapshots") && e.contains(&s), "{e}");
    ctl(&sock, "volume_delete", &format!(r#"{{"name":"{c}"}}"#));
    ctl(&sock, "volume_delete", &format!(r#"{{"name":"{s}"}}"#));
    assert_eq!(ceph.rbd(&["snap", "ls", "--format", "json", &format!("rbd/{v}")]).trim(), "[]", "the RBD snapshot is still there");
    ctl(&sock, "volume_delete", &format!(r#"{{"name":"{v}"}}"#));
    let images = ceph.rbd(&["ls", "rbd"]);
    assert!(!images.lines().any(|l| l == v || l == c), "images left after volume_delete: {images}");
    let objects = ceph.rados(&["-p", "rbd", "ls"]);
    assert!(!objects.lines().any(|l| l.starts_with("blockwire.pr.") && l.ends_with(&u)), "reservation objects left after volume_delete: {objects}");
}

/// volume_list with allocated_bytes left out (the file system may still
/// be settling its blocks): what a restart must bring back.
fn list_without_allocation(list: &Value) -> Value {
    let mut l = list.clone();
    for v in l.as_array_mut().unwrap() {
        v.as_object_mut().unwrap().remove("allocated_bytes");
    }
    l
}

/// Without reflinks (ext4) snapshots are refused with the reason, unless
/// the pool copies; a copy pool refuses to snapshot an exported volume.
#[test]
fn ext4_refuses_snapshots_unless_the_pool_copies() {
    let fs = LoopFs::new("vol-ext4", "mkfs.ext4 -q -F");
    let dir = TempDir::new("vol-ext4");
    let sock = dir.path().join("c.sock");
    let (ip, np) = (free_port(), free_port());
    let pools = format!("[[pool]]\nname = \"strict\"\npath = \"{0}/strict\"\n[[pool]]\nname = \"copying\"\npath = \"{0}/copying\"\ncopy = true\n", fs.mnt().display());
    let _serve = Serve::with_config(&dir, &server_toml(&pools, ip, np), &["--control", sock.to_str().unwrap()]);
    assert_eq!(ctl(&sock, "pool_list", "{}")[0]["reflinks"], false);
    ctl(&sock, "volume_create", r#"{"name":"a","size":"8M","pool":"strict"}"#);
    let e = ctl_err(&sock, "volume_snapshot", r#"{"name":"a","snapshot":"a1"}"#);
    assert!(e.contains("no reflinks") && e.contains("copy = true"), "{e}");
    assert!(!fs.mnt().join("strict/a1.img").exists(), "a refused snapshot left its file");
    assert!(ctl(&sock, "volume_list", "{}").as_array().unwrap().iter().all(|v| v["name"] != "a1"));
    ctl(&sock, "volume_create", r#"{"name":"b","size":"8M","pool":"copying"}"#);
    let nqn = "nqn.2026-11.org.blockwire:ext4";
    ctl(&sock, "nvme_subsystem_add", &format!(r#"{{"nqn":"{nqn}","namespaces":[{{"nsid":1,"volume":"b"}}]}}"#));
    write_url(&format!("nvme+tcp://127.0.0.1:{np}/{nqn}/1"), MIB as u64, &pattern(5, 0, MIB)).unwrap();
    let e = ctl_err(&sock, "volume_snapshot", r#"{"name":"b","snapshot":"b1"}"#);
    assert!(e.contains("copies") && e.contains("exported"), "{e}");
    ctl(&sock, "nvme_subsystem_remove", &format!(r#"{{"nqn":"{nqn}"}}"#));
    let s = ctl(&sock, "volume_snapshot", r#"{"name":"b","snapshot":"b1"}"#);
    // The copy kept the hole before the data.
    assert!(s["volume"]["allocated_bytes"].as_u64().unwrap() < 2 * MIB as u64, "{s}");
    ctl(&sock, "nvme_subsystem_add", &format!(r#"{{"nqn":"{nqn}","namespaces":[{{"nsid":1,"volume":"b1"}}]}}"#));
    assert!(read_url(&format!("nvme+tcp://127.0.0.1:{np}/{nqn}/1"), MIB as u64, MIB) == pattern(5, 0, MIB));
}

/// SIGKILL at random moments of a stream of changes: the configuration
/// file parses every time and is the one before the change or the one
/// after, and serve starts from it again.
#[test]
fn sigkill_during_a_change_leaves_the_old_or_the_new_configuration() {
    let dir = TempDir::new("vol-kill");
    let sock = dir.path().join("c.sock");
    let cfg = dir.path().join("serve.toml");
    let np = free_port();
    std::fs::write(&cfg, format!("[[pool]]\nname = \"p\"\npath = \"{}/pool\"\n[nvme]\nlisten = [\"127.0.0.1:{np}\"]\n", dir.path().display())).unwrap();
    let names = |text: &str| -> Vec<String> {
        let c: toml::Value = toml::from_str(text).unwrap_or_else(|e| panic!("torn configuration: {e}\n{text}"));
        c.get("volume").and_then(|v| v.as_array()).map(|a| a.iter().map(|v| v["name"].as_str().unwrap().to_string()).collect()).unwrap_or_default()
    };
    let mut seed = 0x9e37_79b9u32 ^ std::process::id();
    let (mut old_or_new, mut landed) = (0, 0);
    for round in 0..12 {
        let serve = Serve::start(&["--config", cfg.to_str().unwrap(), "--control", sock.to_str().unwrap()]);
        let before = names(&std::fs::read_to_string(&cfg).unwrap());
        let name = format!("v{round}");
        let mut call = Command::new(blockwire_bin())
            .args(["ctl", "--control", sock.to_str().unwrap(), "volume_create", &format!(r#"{{"name":"{name}","size":"4M","pool":"p"}}"#)])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        std::thread::sleep(Duration::from_micros(u64::from(seed % 40_000)));
        serve.kill_now();
        let acked = call.wait().unwrap().success();
        let after = names(&std::fs::read_to_string(&cfg).unwrap());
        let mut new = before.clone();
        new.push(name.clone());
        assert!(after == before || after == new, "round {round}: {after:?} is neither {before:?} nor {new:?}");
        // What was acknowledged is in the file.
        assert!(!acked || after == new, "round {round}: volume_create was acknowledged but {after:?} lacks it");
        old_or_new += 1;
        landed += (after == new) as u32;
    }
    assert_eq!(old_or_new, 12);
    eprintln!("{landed} of 12 changes landed before the kill");
    // And it still starts, with every volume that landed.
    let _serve = Serve::start(&["--config", cfg.to_str().unwrap(), "--control", sock.to_str().unwrap()]);
    assert_eq!(ctl(&sock, "volume_list", "{}").as_array().unwrap().len(), landed as usize);
}

/// Writes keep going while snapshots are taken: every write acknowledged
/// before `volume_snapshot` was called is in the snapshot, and none issued
/// after it answered.
#[test]
fn snapshots_hold_every_write_acknowledged_before_them() {
    let fs = LoopFs::new("vol-cons", "mkfs.xfs -q -m reflink=1");
    let dir = TempDir::new("vol-cons");
    let sock = dir.path().join("c.sock");
    let (ip, np) = (free_port(), free_port());
    let nqn = "nqn.2026-11.org.blockwire:cons";
    let pools = format!("[[pool]]\nname = \"p\"\npath = \"{}/pool\"\n", fs.mnt().display());
    let _serve = Serve::with_config(&dir, &server_toml(&pools, ip, np), &["--control", sock.to_str().unwrap()]);
    ctl(&sock, "volume_create", r#"{"name":"v","size":"64M","pool":"p"}"#);
    ctl(&sock, "nvme_subsystem_add", &format!(r#"{{"nqn":"{nqn}","namespaces":[{{"nsid":1,"volume":"v"}}]}}"#));
    const BLOCK: usize = 4096;
    const BLOCKS: u64 = 64 * 256;
    // Block i holds i in every byte-quad once written; acked counts the
    // writes answered so far (in order: one write at a time).
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (acked, stop, url) = (acked.clone(), stop.clone(), format!("nvme+tcp://127.0.0.1:{np}/{nqn}/1"));
        std::thread::spawn(move || {
            let rt = runtime();
            let c = rt.block_on(bw_initiator::connect(&url, &opts(1))).unwrap();
            for i in 0..BLOCKS {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let data: Vec<u8> = (0..BLOCK / 4).flat_map(|_| ((i as u32) + 1).to_le_bytes()).collect();
                rt.block_on(c.write(i * BLOCK as u64, &data)).unwrap();
                acked.store(i + 1, Ordering::Release);
            }
            let _ = rt.block_on(c.close());
        })
    };
    let mut windows = vec![];
    for k in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(120);
        let want = acked.load(Ordering::Acquire) + 200;
        while acked.load(Ordering::Acquire) < want {
            assert!(Instant::now() < deadline, "the writer made no progress");
            std::thread::sleep(Duration::from_millis(5));
        }
        let before = acked.load(Ordering::Acquire);
        ctl(&sock, "volume_snapshot", &format!(r#"{{"name":"v","snapshot":"s{k}"}}"#));
        let after = acked.load(Ordering::Acquire);
        windows.push((before, after));
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    for (k, (before, after)) in windows.iter().enumerate() {
        ctl(&sock, "nvme_ns_add", &format!(r#"{{"nqn":"{nqn}","nsid":{},"volume":"s{k}"}}"#, k + 2));
        let got = read_url(&format!("nvme+tcp://127.0.0.1:{np}/{nqn}/{}", k + 2), 0, (BLOCKS as usize) * BLOCK);
        for i in 0..BLOCKS {
            let b = &got[i as usize * BLOCK..(i as usize + 1) * BLOCK];
            let has = b.chunks(4).all(|q| q == ((i as u32) + 1).to_le_bytes());
            let zero = b.iter().all(|&x| x == 0);
            assert!(has || zero, "snapshot s{k} block {i}: torn");
            // Written before the call: present. Issued after its answer
            // (the one in flight at `after` may have been issued before): absent.
            assert!(i >= *before || has, "snapshot s{k} lacks block {i}, acknowledged before the snapshot (window {before}..{after})");
            assert!(i <= *after || zero, "snapshot s{k} holds block {i}, written after the snapshot answered (window {before}..{after})");
        }
    }
}

/// A venv under target/ with `packages` from PyPI; installing is done once
/// per machine (pip is quick when they are there). A machine that cannot
/// reach PyPI fails here, saying so.
pub(crate) fn venv(packages: &[&str]) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let v = repo_root().join("target/pyvenv-volumes");
    if !v.join("bin/pip").exists() {
        let o = Command::new("python3").args(["-m", "venv"]).arg(&v).output().unwrap();
        assert!(o.status.success(), "python3 -m venv {}: {}", v.display(), String::from_utf8_lossy(&o.stderr));
    }
    let o = Command::new(v.join("bin/pip")).args(["install", "-q"]).args(packages).output().unwrap();
    assert!(
        o.status.success(),
        "pip install {packages:?} into {} failed (is PyPI reachable?): {}{}",
        v.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    v
}

/// `spdk-rpc -s SOCK ARGS`: its stdout as JSON (or a string), or its error text.
pub(crate) fn spdk_rpc(venv: &Path, sock: &Path, args: &[&str]) -> Result<Value, String> {
    let o = Command::new(venv.join("bin/spdk-rpc")).arg("-s").arg(sock).args(args).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).trim().to_string();
    if !o.status.success() {
        return Err(format!("{out}\n{}", String::from_utf8_lossy(&o.stderr)));
    }
    Ok(serde_json::from_str(&out).unwrap_or(Value::String(out)))
}

/// SPDK's own client drives lvols and their exports: an lvol store
/// listed, lvols created, snapshotted and cloned, exported over NVMe/TCP
/// (nvmf_*) and iSCSI (iscsi_create_target_node), resized and deleted;
/// blockwire's initiator reads back what must be where; an unknown
/// method is SPDK's "Method not found".
#[test]
fn spdk_client_drives_lvols_and_exports() {
    let venv = venv(&["spdk"]);
    let fs = LoopFs::new("vol-spdk", "mkfs.xfs -q -m reflink=1");
    let dir = TempDir::new("vol-spdk");
    let sock = dir.path().join("spdk.sock");
    let (ip, np) = (free_port(), free_port());
    let pools = format!("[[pool]]\nname = \"lvs0\"\npath = \"{}/lvs0\"\n", fs.mnt().display());
    let _serve = Serve::with_config(&dir, &server_toml(&pools, ip, np), &["--control", sock.to_str().unwrap()]);
    let rpc = |args: &[&str]| spdk_rpc(&venv, &sock, args).unwrap_or_else(|e| panic!("spdk-rpc {args:?}: {e}"));
    let stores = rpc(&["bdev_lvol_get_lvstores"]);
    assert_eq!((stores[0]["name"].as_str(), stores[0]["cluster_size"].as_u64()), (Some("lvs0"), Some(4 << 20)), "{stores}");
    assert!(stores[0]["free_clusters"].as_u64().unwrap() > 100 && stores[0]["total_data_clusters"].as_u64() >= stores[0]["free_clusters"].as_u64());
    let uuid = rpc(&["bdev_lvol_create", "-l", "lvs0", "-t", "vol0", "16"]);
    let b = rpc(&["bdev_get_bdevs", "-b", "lvs0/vol0"]);
    assert_eq!((&b[0]["name"], &b[0]["aliases"][0], &b[0]["driver_specific"]["lvol"]["lvol_store_uuid"]), (&uuid, &Value::from("lvs0/vol0"), &stores[0]["uuid"]), "{b}");
    assert!(spdk_rpc(&venv, &sock, &["bdev_lvol_create", "-l", "lvs0", "vol0", "16"]).unwrap_err().contains("-17"), "a name in use is EEXIST");

    let nqn = "nqn.2016-06.io.spdk:cnode1";
    rpc(&["nvmf_create_transport", "-t", "TCP"]);
    rpc(&["nvmf_create_subsystem", "-a", "-s", "SPDK00000000000001", nqn]);
    rpc(&["nvmf_subsystem_add_listener", "-t", "tcp", "-a", "127.0.0.1", "-s", &np.to_string(), nqn]);
    let e = spdk_rpc(&venv, &sock, &["nvmf_subsystem_add_listener", "-t", "tcp", "-a", "127.0.0.1", "-s", "1", nqn]).unwrap_err();
    assert!(e.contains("does not listen"), "{e}");
    rpc(&["nvmf_subsystem_add_ns", nqn, "lvs0/vol0"]);
    let url = |n: u32| format!("nvme+tcp://127.0.0.1:{np}/{nqn}/{n}");
    write_url(&url(1), 0, &pattern(7, 0, 2 * MIB)).unwrap();
    rpc(&["bdev_lvol_snapshot", "lvs0/vol0", "snap0"]);
    write_url(&url(1), 0, &pattern(8, 0, MIB)).unwrap();
    rpc(&["bdev_lvol_clone", "lvs0/snap0", "clone0"]);
    let snap = rpc(&["bdev_get_bdevs", "-b", "lvs0/snap0"]);
    assert_eq!(snap[0]["driver_specific"]["lvol"]["clones"], serde_json::json!(["vol0", "clone0"]), "{snap}");
    // The snapshot over NVMe/TCP, the clone over iSCSI.
    rpc(&["nvmf_subsystem_add_ns", "-n", "5", nqn, "lvs0/snap0"]);
    rpc(&["iscsi_create_target_node", "clone0", "clone0-alias", "lvs0/clone0:0", "1:1", "64", "-d"]);
    let nodes = rpc(&["iscsi_get_target_nodes"]);
    assert_eq!(nodes[0]["name"], "iqn.2016-06.io.spdk:clone0", "{nodes}");
    let iscsi_url = format!("iscsi://127.0.0.1:{ip}/iqn.2016-06.io.spdk:clone0/0");
    assert!(read_url(&url(5), 0, 2 * MIB) == pattern(7, 0, 2 * MIB), "the snapshot holds the origin's later write, or lost data");
    assert!(read_url(&iscsi_url, 0, 2 * MIB) == pattern(7, 0, 2 * MIB), "the clone does not hold its snapshot's data");
    assert!(read_url(&url(1), 0, MIB) == pattern(8, 0, MIB), "the origin lost its write");
    assert!(write_url(&url(5), 0, &[1u8; 512]).is_err(), "the snapshot took a write");
    let subs = rpc(&["nvmf_get_subsystems"]);
    assert_eq!((subs[0]["subtype"].as_str(), subs[1]["nqn"].as_str()), (Some("Discovery"), Some(nqn)), "{subs}");
    assert_eq!(subs[1]["namespaces"][1]["bdev_name"], snap[0]["name"]);
    // Resize: the initiator sees the new size.
    rpc(&["bdev_lvol_resize", "lvs0/clone0", "32"]);
    assert_eq!(size_of_url(&iscsi_url), 32 << 20);
    // Exported: refused, the exports named. Then unexported and deleted.
    let e = spdk_rpc(&venv, &sock, &["bdev_lvol_delete", "lvs0/clone0"]).unwrap_err();
    assert!(e.contains("iSCSI iqn.2016-06.io.spdk:clone0 LUN 0"), "{e}");
    rpc(&["iscsi_delete_target_node", "iqn.2016-06.io.spdk:clone0"]);
    rpc(&["bdev_lvol_inflate", "lvs0/clone0"]);
    rpc(&["bdev_lvol_delete", "lvs0/clone0"]);
    rpc(&["nvmf_subsystem_remove_ns", nqn, "5"]);
    rpc(&["nvmf_delete_subsystem", nqn]);
    for n in ["lvs0/snap0", "lvs0/vol0"] {
        rpc(&["bdev_lvol_delete", n]);
    }
    assert_eq!(rpc(&["bdev_get_bdevs"]), serde_json::json!([]));
    // Outside the subset: SPDK's own answer, through SPDK's client library.
    let py = format!(
        "import sys\nfrom spdk.rpc.client import JSONRPCClient, JSONRPCException\nc = JSONRPCClient({:?})\ntry:\n    c.call('bdev_malloc_create', {{'num_blocks': 8, 'block_size': 512}})\nexcept JSONRPCException as e:\n    print(e.message)\n    sys.exit(0)\nsys.exit(1)\n",
        sock.to_str().unwrap()
    );
    let o = Command::new(venv.join("bin/python")).arg("-c").arg(py).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("-32601") && out.contains("Method not found"), "{out}{}", String::from_utf8_lossy(&o.stderr));
}

/// POST `body` to the HTTP endpoint with an Authorization header (or
/// none): the status line and the body.
fn http_post(port: u16, auth: Option<&str>, body: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let auth = auth.map(|a| format!("Authorization: Basic {}\r\n", base64_encode(a))).unwrap_or_default();
    write!(s, "POST / HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.lines().next().unwrap_or("").to_string(), body.to_string())
}

fn base64_encode(s: &str) -> String {
    let o = Command::new("base64").arg("-w0").stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    use std::io::Write;
    o.stdin.as_ref().unwrap().write_all(s.as_bytes()).unwrap();
    String::from_utf8(o.wait_with_output().unwrap().stdout).unwrap()
}

/// The HTTP endpoint refuses to start without private credentials, and
/// answers 401 to no or wrong credentials.
#[test]
fn rpc_http_requires_credentials() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("vol-http");
    let creds = dir.path().join("rpc.creds");
    std::fs::write(&creds, "cinder:s3cret-pass\n").unwrap();
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o644)).unwrap();
    let port = free_port();
    let args = |c: &Path| vec!["serve".to_string(), "--volume".into(), "a=ram:1M".into(), "--nvme".into(), format!("127.0.0.1:{}", free_port()), "--control".into(), "none".into(), "--rpc-http".into(), format!("127.0.0.1:{port}"), "--rpc-http-credentials".into(), c.display().to_string()];
    let o = Command::new(blockwire_bin()).args(args(&creds)).output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("mode 600"), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o600)).unwrap();
    let a: Vec<String> = args(&creds);
    let serve = Serve::start(&a[1..].iter().map(String::as_str).collect::<Vec<_>>());
    let req = r#"{"jsonrpc":"2.0","id":1,"method":"bdev_get_bdevs"}"#;
    assert_eq!(http_post(port, None, req).0, "HTTP/1.1 401 Unauthorized");
    assert_eq!(http_post(port, Some("cinder:s3cret-pasS"), req).0, "HTTP/1.1 401 Unauthorized");
    let (st, body) = http_post(port, Some("cinder:s3cret-pass"), req);
    assert_eq!(st, "HTTP/1.1 200 OK", "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["result"][0]["name"], "a", "{body}");
    let (st, _) = http_post(port, Some("cinder:s3cret-pass"), r#"{"jsonrpc":"2.0","id":2,"method":"volume_add","params":{"name":"b","backend":"ram:1M"}}"#);
    assert_eq!(st, "HTTP/1.1 200 OK");
    // The log is read from serve's stderr by another thread: give it time.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !serve.log_text().contains("rpc-http: change by 127.0.0.1:") {
        assert!(Instant::now() < deadline, "no change logged with the caller's address:\n{}", serve.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = serve.log_text();
    assert!(log.contains("volume_add") && log.contains("refused (no or wrong credentials)"), "{log}");
}

/// OpenStack Cinder's SPDK driver (with its spdk-nvmeof target helper)
/// against blockwire over HTTP: a volume, a snapshot, a volume from the
/// snapshot, exports, deletes; blockwire's initiator writes the first
/// export and reads the copy's. The session is printed (calls and
/// answers) for docs/notes.
#[test]
fn cinder_spdk_driver_over_http() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::fs::PermissionsExt;
    let venv = venv(&["spdk", "cinder"]);
    let fs = LoopFs::sized("vol-cinder", "mkfs.xfs -q -m reflink=1", "8G");
    let dir = TempDir::new("vol-cinder");
    let creds = dir.path().join("rpc.creds");
    std::fs::write(&creds, "cinder:cinder-pass\n").unwrap();
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (ip, np, hp) = (free_port(), free_port(), free_port());
    let pools = format!("[[pool]]\nname = \"lvs0\"\npath = \"{}/lvs0\"\n", fs.mnt().display());
    let _serve = Serve::with_config(&dir, &server_toml(&pools, ip, np), &["--control", "none", "--rpc-http", &format!("127.0.0.1:{hp}"), "--rpc-http-credentials", creds.to_str().unwrap()]);
    let script = repo_root().join("crates/cli/tests/integration/volumes/cinder_session.py");
    let mut py = Command::new(venv.join("bin/python"))
        .arg(script)
        .args([hp.to_string(), "cinder".into(), "cinder-pass".into(), np.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut input = py.stdin.take().unwrap();
    let mut lines = BufReader::new(py.stdout.take().unwrap()).lines();
    let mut next_step = |want: &str| -> Value {
        loop {
            let l = lines.next().unwrap_or_else(|| panic!("the Cinder session ended before step {want}")).unwrap();
            eprintln!("[cinder] {l}");
            let v: Value = serde_json::from_str(&l).unwrap_or(Value::Null);
            if v["step"] == want {
                return v;
            }
        }
    };
    let stats = next_step("stats");
    assert!(stats["pools"][0]["free_capacity_gb"].as_f64().unwrap() > 6.0, "{stats}");
    let url_of = |v: &Value| {
        let d = &v["connection"]["data"];
        format!("nvme+tcp://{}:{}/{}/{}", d["target_portal"].as_str().unwrap(), d["target_port"].as_str().map(String::from).unwrap_or_else(|| d["target_port"].to_string()), d["nqn"].as_str().unwrap(), d["ns_id"].as_str().map(String::from).unwrap_or_else(|| d["ns_id"].to_string()))
    };
    let first = next_step("exported");
    let url = url_of(&first);
    assert_eq!(size_of_url(&url), 1 << 30);
    write_url(&url, 0, &pattern(9, 0, 2 * MIB)).unwrap();
    writeln!(input, "go").unwrap();
    next_step("snapshot");
    // After the snapshot: not in the copy made from it.
    write_url(&url, 0, &pattern(10, 0, MIB)).unwrap();
    writeln!(input, "go").unwrap();
    let second = next_step("exported");
    let copy = url_of(&second);
    assert_eq!(size_of_url(&copy), 2 << 30, "the volume from the snapshot was not extended");
    assert!(read_url(&copy, 0, 2 * MIB) == pattern(9, 0, 2 * MIB), "the volume from the snapshot lacks the snapshot's data");
    write_url(&copy, 0, &pattern(11, 0, MIB)).unwrap();
    assert!(read_url(&url, 0, MIB) == pattern(10, 0, MIB), "a write to the copy reached the origin");
    writeln!(input, "go").unwrap();
    let end = next_step("deleted");
    assert_eq!((end["bdevs"].as_array().map(Vec::len), end["subsystems"].as_array().map(Vec::len)), (Some(0), Some(1)), "{end}");
    assert!(py.wait().unwrap().success());
}

/// TLS PSKs and the secure channel through SPDK's own client: a key file
/// (mode 600) named with keyring_file_add_key, a host given it by name
/// with nvmf_subsystem_add_host --psk, the listener made TLS-required with
/// nvmf_subsystem_add_listener --secure-channel; blockwire's initiator then
/// connects over TLS with that PSK and plaintext is refused. A key file
/// others can read is refused, a key in use is not removed, and neither
/// keyring_get_keys nor save_config's file (mode 600) holds the key.
#[test]
fn spdk_client_sets_tls_keys_and_secure_channel() {
    use std::os::unix::fs::PermissionsExt;
    const PSK: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    let venv = venv(&["spdk"]);
    let dir = TempDir::new("vol-spdk-tls");
    let sock = dir.path().join("spdk.sock");
    let (ip, np) = (free_port(), free_port());
    let nqn = "nqn.2016-06.io.spdk:tls1";
    let host = "nqn.2016-06.io.spdk:host1";
    let cfg = format!(
        "{}[[nvme.subsystem]]\nnqn = \"{nqn}\"\nnamespaces = [{{ nsid = 1, volume = \"d0\" }}]\nallowed_hosts = [\"nqn.2016-06.io.spdk:other\"]\n",
        server_toml("[[volume]]\nname = \"d0\"\nbackend = \"ram:8M\"\n", ip, np)
    );
    let _serve = Serve::with_config(&dir, &cfg, &["--control", sock.to_str().unwrap()]);
    let rpc = |args: &[&str]| spdk_rpc(&venv, &sock, args).unwrap_or_else(|e| panic!("spdk-rpc {args:?}: {e}"));
    let key = dir.path().join("key0");
    std::fs::write(&key, format!("{PSK}\n")).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = spdk_rpc(&venv, &sock, &["keyring_file_add_key", "key0", key.to_str().unwrap()]).unwrap_err();
    assert!(e.contains("keys must be mode 600"), "{e}");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    rpc(&["keyring_file_add_key", "key0", key.to_str().unwrap()]);
    rpc(&["nvmf_subsystem_add_host", nqn, host, "--psk", "key0"]);
    rpc(&["nvmf_subsystem_add_listener", "-t", "tcp", "-a", "127.0.0.1", "-s", &np.to_string(), "--secure-channel", nqn]);
    let keys = rpc(&["keyring_get_keys"]);
    assert_eq!((keys[0]["name"].as_str(), keys[0]["path"].as_str(), keys[0]["refcnt"].as_u64()), (Some("key0"), key.to_str(), Some(1)), "{keys}");
    let verify = |q: &str| {
        Command::new(blockwire_bin())
            .args(["verify", &format!("nvme+tcp://127.0.0.1:{np}/{nqn}/1{q}"), "--size", "1M", "--initiator-name", host, "--timeout", "20"])
            .env("BLOCKWIRE_TLS_PSK", PSK)
            .output()
            .unwrap()
    };
    let o = verify("?tls");
    assert!(o.status.success(), "TLS with the keyring's PSK: {}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(blockwire_bin())
        .args(["verify", &format!("nvme+tcp://127.0.0.1:{np}/{nqn}/1"), "--size", "1M", "--initiator-name", host, "--timeout", "20"])
        .env_remove("BLOCKWIRE_TLS_PSK")
        .output()
        .unwrap();
    assert!(!o.status.success(), "plaintext on the secure-channel listener connected");
    let e = spdk_rpc(&venv, &sock, &["keyring_file_remove_key", "key0"]).unwrap_err();
    assert!(e.contains("remove the host first"), "{e}");
    let saved = dir.path().join("saved.toml");
    ctl(&sock, "save_config", &format!(r#"{{"path":"{}"}}"#, saved.display()));
    let text = std::fs::read_to_string(&saved).unwrap();
    assert_eq!(std::fs::metadata(&saved).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(text.contains("tls_key = \"key0\"") && !text.contains("AAECAwQF") && !keys.to_string().contains("AAECAwQF"), "{text}");
    rpc(&["nvmf_subsystem_remove_host", nqn, host]);
    rpc(&["keyring_file_remove_key", "key0"]);
    assert_eq!(rpc(&["keyring_get_keys"]), serde_json::json!([]));
}
