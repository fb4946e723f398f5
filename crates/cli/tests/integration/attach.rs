//! `blockwire mount/attach/umount`: a remote volume through FUSE and a loop
//! device, with a real kernel file system on top, per protocol; fio's
//! verifier at queue depth 32 through the loop device; a target killed under
//! I/O (EIO within the timeout, I/O resumes once it is back); tgt and vblade.

use crate::common;
use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const IQN: &str = "iqn.2026-11.org.blockwire:attach-test";
const NQN: &str = "nqn.2026-11.org.blockwire:attach-test";

/// Deterministic contents for file `i` of the test tree (sizes 0.5 KiB .. ~1 MiB).
fn contents(i: usize) -> Vec<u8> {
    let len = 512 + (i * 37_813) % (1 << 20);
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

const FILES: usize = 24;

fn write_tree(root: &Path) {
    for i in 0..FILES {
        let dir = root
            .join(format!("d{}", i % 4))
            .join(format!("sub{}", i % 3));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i}")), contents(i)).unwrap();
    }
    sh("sync");
}

fn check_tree(root: &Path) {
    for i in 0..FILES {
        let p = root
            .join(format!("d{}", i % 4))
            .join(format!("sub{}", i % 3))
            .join(format!("f{i}"));
        let got = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(got == contents(i), "{} differs after remount", p.display());
    }
}

/// Runs `blockwire umount` when a test ends, failed or not.
struct Detach(String);
impl Drop for Detach {
    fn drop(&mut self) {
        let _ = blockwire(None, &["umount", &self.0]);
    }
}

/// What must be gone after `blockwire umount`.
fn assert_nothing_left(mp: &Path, fuse_hint: &str) {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(mp.to_str().unwrap()),
        "still mounted:\n{mounts}"
    );
    assert!(!mounts.contains(fuse_hint), "FUSE mount left:\n{mounts}");
    let loops = sh("losetup -a");
    assert!(!loops.contains(fuse_hint), "loop device left: {loops}");
}

fn fsck_clean(backing: &Path) {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(backing)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn {}: {}\n{}",
        backing.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// mount --mkfs, write a tree, umount, (fsck), mount again, compare, umount.
fn roundtrip(url: &str, fs: &str, backing: Option<&Path>, tmp: &TempDir) {
    let mp = tmp.path().join("mnt");
    std::fs::create_dir_all(&mp).unwrap();
    let m = mp.to_str().unwrap();
    let hint = m.replace('/', "_");
    let _guard = Detach(m.to_string());
    blockwire_ok(None, &["mount", url, m, "--mkfs", fs, "--timeout", "10"]);
    write_tree(&mp);
    blockwire_ok(None, &["umount", m]);
    assert_nothing_left(&mp, &hint);
    if let (Some(b), "ext4") = (backing, fs) {
        fsck_clean(b);
    }
    blockwire_ok(None, &["mount", url, m, "--timeout", "10"]);
    check_tree(&mp);
    blockwire_ok(None, &["umount", m]);
    // Safe to run twice.
    blockwire_ok(None, &["umount", m]);
    assert_nothing_left(&mp, &hint);
}

fn serve_file(tmp: &TempDir, proto: &str, port: u16) -> (Serve, String) {
    serve_sized(tmp, proto, port, "128M")
}

/// mkfs.xfs refuses file systems under 300 MB.
fn serve_sized(tmp: &TempDir, proto: &str, port: u16, size: &str) -> (Serve, String) {
    let img = tmp.path().join("vol.img");
    let (listen, url) = match proto {
        "iscsi" => (
            format!("[iscsi]\nlisten = [\"127.0.0.1:{port}\"]\n[[iscsi.target]]\niqn = \"{IQN}\"\nluns = [{{ lun = 0, volume = \"d0\" }}]\n"),
            format!("iscsi://127.0.0.1:{port}/{IQN}/0"),
        ),
        _ => (
            format!(
                "[nvme]\nlisten = [\"127.0.0.1:{port}\"]\ndiscovery_listen = \"127.0.0.1:{}\"\n[[nvme.subsystem]]\nnqn = \"{NQN}\"\nnamespaces = [{{ nsid = 1, volume = \"d0\" }}]\n",
                free_port()
            ),
            format!("nvme+tcp://127.0.0.1:{port}/{NQN}/1"),
        ),
    };
    let toml = format!(
        "[[volume]]\nname = \"d0\"\nbackend = \"file:{},size={size}\"\n{listen}",
        img.display()
    );
    (Serve::with_config(tmp, &toml, &[]), url)
}

#[test]
fn mount_ext4_over_iscsi() {
    require_root();
    let tmp = TempDir::new("att-i");
    let (_serve, url) = serve_file(&tmp, "iscsi", free_port());
    roundtrip(&url, "ext4", Some(&tmp.path().join("vol.img")), &tmp);
}

#[test]
fn mount_ext4_and_xfs_over_nvme() {
    require_root();
    let tmp = TempDir::new("att-n");
    let (_serve, url) = serve_sized(&tmp, "nvme", free_port(), "320M");
    roundtrip(&url, "ext4", Some(&tmp.path().join("vol.img")), &tmp);
    roundtrip(&url, "xfs", None, &tmp);
    let out = Command::new("xfs_repair")
        .args(["-n", "-f"])
        .arg(tmp.path().join("vol.img"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "xfs_repair -n: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn mount_ext4_over_aoe() {
    require_root();
    let tmp = TempDir::new("att-a");
    let pair = NetnsPair::new("ata", 1500);
    let img = tmp.path().join("vol.img");
    let vol = format!("d0=file:{},size=128M", img.display());
    let aoe = format!("{},volume=d0,shelf=1,slot=0", pair.ns_if);
    let _serve = Serve::start_in(Some(&pair.ns), &["--volume", &vol, "--aoe", &aoe]);
    roundtrip(
        &format!("aoe://{}/1.0", pair.host_if),
        "ext4",
        Some(&img),
        &tmp,
    );
}

/// `blockwire attach URL TMP/fuse --loop --background`: the loop device, and
/// a guard that detaches it when the test ends.
fn attach_loop(tmp: &TempDir, url: &str, timeout: &str) -> (String, std::path::PathBuf, Detach) {
    let dir = tmp.path().join("fuse");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let guard = Detach(d.to_string());
    let line = blockwire_ok(None, &["attach", url, d, "--loop", "--background", "--timeout", timeout]);
    let dev = line.split_whitespace().last().unwrap().to_string();
    assert!(dev.starts_with("/dev/loop"), "{line}");
    (dev, dir, guard)
}

#[test]
fn fio_verify_at_queue_depth_32_through_loop() {
    require_root();
    let tmp = TempDir::new("att-f");
    let (_serve, url) = serve_file(&tmp, "iscsi", free_port());
    let (dev, dir, _guard) = attach_loop(&tmp, &url, "10");
    let d = dir.to_str().unwrap();
    let dio = std::fs::read_to_string(format!(
        "/sys/block/{}/loop/dio",
        dev.trim_start_matches("/dev/")
    ))
    .unwrap();
    assert_eq!(dio.trim(), "1", "loop device without direct I/O");
    let out = Command::new("fio")
        .args([
            "--name=qd32",
            &format!("--filename={dev}"),
            "--direct=1",
            "--ioengine=libaio",
            "--rw=randwrite",
            "--bs=4k,64k",
            "--bsrange=4k-64k",
            "--iodepth=32",
            "--size=64M",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
            // No local-*-verify.state file in the working directory.
            "--verify_state_save=0",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    blockwire_ok(None, &["umount", d]);
    assert!(
        out.status.success() && !text.contains("verify failed") && !text.contains("bad "),
        "fio: {text}"
    );
    assert_nothing_left(&dir, d);
}

#[test]
fn target_killed_under_dd_then_back() {
    require_root();
    let tmp = TempDir::new("att-k");
    let port = free_port();
    let (serve, url) = serve_file(&tmp, "nvme", port);
    let (dev, dir, _guard) = attach_loop(&tmp, &url, "3");
    let d = dir.to_str().unwrap();
    let mut dd = Command::new("dd")
        .args([
            &format!("of={dev}"),
            "if=/dev/zero",
            "bs=64k",
            "count=100000",
            "oflag=direct",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    serve.stop();
    let killed = Instant::now();
    let mut status = None;
    while killed.elapsed() < Duration::from_secs(30) {
        if let Some(st) = dd.try_wait().unwrap() {
            status = Some(st);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let Some(status) = status else {
        let _ = dd.kill();
        let _ = dd.wait();
        let _ = blockwire(None, &["umount", d]);
        panic!("dd still running 30 s after the target died (timeout 3 s)");
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut dd.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        !status.success() && err.contains("Input/output error"),
        "dd: {status} {err}"
    );

    // The same target comes back on the same port: new I/O succeeds.
    let (_serve2, _) = serve_file_on(&tmp, port);
    let t0 = Instant::now();
    loop {
        let ok = Command::new("dd")
            .args([
                &format!("of={dev}"),
                "if=/dev/zero",
                "bs=64k",
                "count=16",
                "oflag=direct",
            ])
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        if ok {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no I/O 20 s after the target came back"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    blockwire_ok(None, &["umount", d]);
    assert_nothing_left(&dir, d);
    assert!(
        !sh("ps -eo args")
            .lines()
            .any(|l| l.contains("attach") && l.contains(d)),
        "attach daemon left"
    );
}

fn serve_file_on(tmp: &TempDir, port: u16) -> (Serve, String) {
    serve_file(tmp, "nvme", port)
}

#[test]
fn refused_cases_leave_nothing() {
    require_root();
    let tmp = TempDir::new("att-r");
    let mp = tmp.path().join("mnt");
    std::fs::create_dir_all(&mp).unwrap();
    let m = mp.to_str().unwrap();
    let dead = format!("iscsi://127.0.0.1:{}/{IQN}/0", free_port());
    for (url, needle) in [(dead.as_str(), "127.0.0.1"), ("nbd://x/y", "")] {
        let out = blockwire(None, &["mount", url, m, "--timeout", "2"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "mount {url} succeeded");
        assert_eq!(err.trim().lines().count(), 1, "not one line: {err}");
        assert!(err.contains(needle), "{err}");
        assert_nothing_left(&mp, &m.replace('/', "_"));
    }
}
