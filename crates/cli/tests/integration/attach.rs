//! `blockwire mount/attach/umount`: a remote volume through FUSE and a loop
//! device, with a real kernel file system on top.
//!
//! - ext4 per protocol (iSCSI, NVMe/TCP, AoE on a veth pair), xfs once, both
//!   FUSE transports (/dev/fuse and FUSE over io_uring);
//! - fio's verifier at queue depth 32 through the loop device, per transport
//!   (catches a request buffer reused while a request still runs);
//! - discard: blkdiscard and fstrim punch holes in the target's file (UNMAP,
//!   DSM deallocate), EOPNOTSUPP over AoE and from a LUN without provisioning;
//! - peers: tgt and vblade (and Linux nvmet in nvme_nvmet.rs);
//! - faults: the target killed under dd and back (per protocol), umount while
//!   it is down, SIGTERM (flush, unmount) and a second signal (force);
//! - bad input: one line, non-zero exit and nothing left attached.

use crate::common;
use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::os::unix::process::CommandExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const IQN: &str = "iqn.2026-11.org.blockwire:attach-test";
const NQN: &str = "nqn.2026-11.org.blockwire:attach-test";

// ---- the FUSE transport ----

const URING_SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";

/// FUSE over io_uring is off by default in the fuse module (a host-wide
/// switch that only lets daemons that ask use it). Tests of that transport
/// turn it on while they run and put back what was there when the last ends.
struct UringOn;

static URING_USERS: Mutex<(usize, Option<String>)> = Mutex::new((0, None));

impl UringOn {
    fn new() -> UringOn {
        let mut u = URING_USERS.lock().unwrap_or_else(|e| e.into_inner());
        let before = std::fs::read_to_string(URING_SWITCH)
            .unwrap_or_else(|e| panic!("{URING_SWITCH}: {e} (FUSE over io_uring needs Linux 6.14+)"));
        if u.0 == 0 {
            u.1 = Some(before.trim().to_string());
        }
        u.0 += 1;
        std::fs::write(URING_SWITCH, "Y").expect("turn on FUSE over io_uring");
        UringOn
    }
}

impl Drop for UringOn {
    fn drop(&mut self) {
        let mut u = URING_USERS.lock().unwrap_or_else(|e| e.into_inner());
        u.0 -= 1;
        if u.0 == 0 {
            if let Some(v) = u.1.take() {
                let _ = std::fs::write(URING_SWITCH, v);
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fuse {
    Dev,
    Uring,
}

impl Fuse {
    fn arg(self) -> &'static str {
        match self {
            Fuse::Dev => "dev",
            Fuse::Uring => "uring",
        }
    }
    fn guard(self) -> Option<UringOn> {
        (self == Fuse::Uring).then(UringOn::new)
    }
}

// ---- targets ----

#[derive(Clone, Copy, Debug, PartialEq)]
enum Proto {
    Iscsi,
    Nvme,
    Aoe,
    /// A file on nfs-ganesha's export (`nfs://`).
    Nfs,
}

/// A `blockwire serve` of one file volume, restartable on the same address
/// (same port, or the same AoE shelf.slot on the same veth pair).
struct Target {
    proto: Proto,
    dir: PathBuf,
    size: &'static str,
    port: u16,
    pair: Option<NetnsPair>,
    serve: Option<Serve>,
    nfs: Option<common::ganesha::Ganesha>,
    chap: Option<(&'static str, &'static str)>,
}

impl Target {
    fn start(proto: Proto, tmp: &TempDir, size: &'static str) -> Target {
        Target::start_with(proto, tmp, size, None)
    }

    fn start_with(proto: Proto, tmp: &TempDir, size: &'static str, chap: Option<(&'static str, &'static str)>) -> Target {
        let pair = (proto == Proto::Aoe).then(|| NetnsPair::new("att", 1500));
        let mut t = Target { proto, dir: tmp.path().to_path_buf(), size, port: free_port(), pair, serve: None, nfs: None, chap };
        t.restart();
        t
    }

    fn img(&self) -> PathBuf {
        match self.proto {
            Proto::Nfs => self.dir.join("export/vol.img"),
            _ => self.dir.join("vol.img"),
        }
    }

    fn restart(&mut self) {
        let vol = format!("[[volume]]\nname = \"d0\"\nbackend = \"file:{},size={}\"\n", self.img().display(), self.size);
        let port = self.port;
        if self.proto == Proto::Nfs {
            match &mut self.nfs {
                Some(g) => g.restart(),
                None => {
                    let g = common::ganesha::Ganesha::start(&self.dir.join("export"));
                    let mib: u64 = self.size.trim_end_matches('M').parse().expect("size in MiB");
                    std::fs::File::create(self.img()).unwrap().set_len(mib << 20).unwrap();
                    self.nfs = Some(g);
                }
            }
            return;
        }
        self.serve = Some(match self.proto {
            Proto::Iscsi => {
                let chap = self.chap.map(|(u, s)| format!("chap = {{ user = \"{u}\", secret = \"{s}\" }}\n")).unwrap_or_default();
                let toml = format!(
                    "{vol}[iscsi]\nlisten = [\"127.0.0.1:{port}\"]\n[[iscsi.target]]\niqn = \"{IQN}\"\nluns = [{{ lun = 0, volume = \"d0\" }}]\n{chap}"
                );
                self.serve_config(&toml)
            }
            Proto::Nvme => {
                let toml = format!(
                    "{vol}[nvme]\nlisten = [\"127.0.0.1:{port}\"]\ndiscovery_listen = \"127.0.0.1:{}\"\n[[nvme.subsystem]]\nnqn = \"{NQN}\"\nnamespaces = [{{ nsid = 1, volume = \"d0\" }}]\n",
                    free_port()
                );
                self.serve_config(&toml)
            }
            Proto::Aoe => {
                let pair = self.pair.as_ref().expect("veth pair");
                let v = format!("d0=file:{},size={}", self.img().display(), self.size);
                let aoe = format!("{},volume=d0,shelf=1,slot=0", pair.ns_if);
                Serve::start_in(Some(&pair.ns), &["--volume", &v, "--aoe", &aoe])
            }
            Proto::Nfs => unreachable!(),
        });
    }

    fn serve_config(&self, toml: &str) -> Serve {
        let path = self.dir.join("serve.toml");
        std::fs::write(&path, toml).unwrap();
        Serve::start(&["--config", path.to_str().unwrap()])
    }

    /// The target process, gone (SIGTERM).
    fn stop(&mut self) {
        if let Some(s) = self.serve.take() {
            s.stop();
        }
        if let Some(g) = &mut self.nfs {
            g.stop();
        }
    }

    fn pid(&self) -> u32 {
        self.serve.as_ref().expect("running").pid()
    }

    fn url(&self) -> String {
        match self.proto {
            Proto::Iscsi => match self.chap {
                Some((u, s)) => format!("iscsi://{u}%{s}@127.0.0.1:{}/{IQN}/0", self.port),
                None => format!("iscsi://127.0.0.1:{}/{IQN}/0", self.port),
            },
            Proto::Nvme => format!("nvme+tcp://127.0.0.1:{}/{NQN}/1", self.port),
            Proto::Aoe => format!("aoe://{}/1.0", self.pair.as_ref().expect("veth pair").host_if),
            Proto::Nfs => self.nfs.as_ref().expect("ganesha").url("vol.img"),
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        // Before its namespace goes.
        self.stop();
    }
}

// ---- a tree of files with known contents ----

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

fn tree_path(root: &Path, i: usize) -> PathBuf {
    root.join(format!("d{}", i % 4)).join(format!("sub{}", i % 3)).join(format!("f{i}"))
}

fn write_tree(root: &Path) {
    for i in 0..FILES {
        let p = tree_path(root, i);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, contents(i)).unwrap();
    }
    sh("sync");
}

fn check_tree(root: &Path) {
    for i in 0..FILES {
        let p = tree_path(root, i);
        let got = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(got == contents(i), "{} differs after remount", p.display());
    }
}

// ---- attach/detach helpers ----

/// Runs `blockwire umount` when a test ends, failed or not.
struct Detach(String);
impl Drop for Detach {
    fn drop(&mut self) {
        let _ = blockwire(None, &["umount", &self.0]);
    }
}

/// What must be gone after `blockwire umount`: mounts, loop devices, FUSE
/// connections and daemons mentioning `hint`, and processes stuck in FUSE.
fn assert_nothing_left(mp: &Path, hint: &str) {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(mp.to_str().unwrap()), "still mounted:\n{mounts}");
    assert!(!mounts.contains(hint), "FUSE mount left:\n{mounts}");
    let loops = sh("losetup -a");
    assert!(!loops.contains(hint), "loop device left: {loops}");
    assert!(
        !sh("ps -eo args").lines().any(|l| l.contains("blockwire attach") && (l.contains(hint) || l.contains(mp.to_str().unwrap()))),
        "attach daemon left"
    );
    assert_no_fuse_waiters();
}

/// No process sleeps uninterruptibly inside FUSE (a request nobody answers).
fn assert_no_fuse_waiters() {
    let stuck: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
            (state == 'D' && wchan.contains("fuse")).then(|| format!("{pid} {wchan}: {}", &stat[..stat.find(')').unwrap_or(0) + 1]))
        })
        .collect();
    assert!(stuck.is_empty(), "processes in D state inside FUSE: {stuck:?}");
}

fn fsck_clean(backing: &Path) {
    let out = Command::new("e2fsck").arg("-fn").arg(backing).output().unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn {}: {}\n{}",
        backing.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A directory bind-mounted on itself with shared propagation, so that an
/// unmount below it also reaches the copies in mount namespaces made from
/// ours meanwhile: `ip netns exec` (which tests running beside these use)
/// copies every mount, as a slave. Where `/` is private (this VM, most
/// containers; systemd hosts make it shared) a copy would keep ext4 mounted
/// on the loop device until that namespace's last process exits, and
/// `blockwire umount` could only wait and then fail.
struct SharedDir(PathBuf);

impl SharedDir {
    fn new(path: PathBuf) -> SharedDir {
        std::fs::create_dir_all(&path).unwrap();
        let p = path.to_str().unwrap();
        sh(&format!("mount --bind {p} {p} && mount --make-shared {p}"));
        SharedDir(path)
    }
}

impl Drop for SharedDir {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

/// Mount point (in a [`SharedDir`], kept mounted by the third value) and
/// the string its FUSE directory and loop device carry.
fn mountpoint(tmp: &TempDir) -> (PathBuf, String, SharedDir) {
    let shared = SharedDir::new(tmp.path().join("shared"));
    let mp = shared.0.join("mnt");
    std::fs::create_dir_all(&mp).unwrap();
    let hint = mp.to_str().unwrap().replace('/', "_");
    (mp, hint, shared)
}

/// mount --mkfs, write a tree, umount, (fsck), mount again, compare, umount.
fn roundtrip(url: &str, fs: &str, backing: Option<&Path>, fuse: Fuse, tmp: &TempDir) {
    let _uring = fuse.guard();
    let (mp, hint, _shared) = mountpoint(tmp);
    let m = mp.to_str().unwrap();
    let _guard = Detach(m.to_string());
    blockwire_ok(None, &["mount", url, m, "--mkfs", fs, "--timeout", "20", "--fuse", fuse.arg()]);
    write_tree(&mp);
    blockwire_ok(None, &["umount", m]);
    assert_nothing_left(&mp, &hint);
    if let (Some(b), "ext4") = (backing, fs) {
        fsck_clean(b);
    }
    blockwire_ok(None, &["mount", url, m, "--timeout", "20", "--fuse", fuse.arg()]);
    check_tree(&mp);
    blockwire_ok(None, &["umount", m]);
    // Safe to run twice.
    blockwire_ok(None, &["umount", m]);
    assert_nothing_left(&mp, &hint);
}

/// Against a peer whose backing file may not be readable here (Linux nvmet
/// in the kernel VM): mount --mkfs ext4, write a tree, umount; e2fsck on the
/// volume read back through `blockwire attach`; mount again and compare.
pub(crate) fn roundtrip_through_attach(url: &str, tmp: &TempDir) {
    let (mp, hint, _shared) = mountpoint(tmp);
    let m = mp.to_str().unwrap();
    let _guard = Detach(m.to_string());
    blockwire_ok(None, &["mount", url, m, "--mkfs", "ext4", "--timeout", "120"]);
    write_tree(&mp);
    blockwire_ok(None, &["umount", m]);
    assert_nothing_left(&mp, &hint);
    let dir = tmp.path().join("fsck");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let _g2 = Detach(d.to_string());
    blockwire_ok(None, &["attach", url, d, "--readonly", "--background", "--timeout", "120"]);
    fsck_clean(&dir.join("disk"));
    blockwire_ok(None, &["umount", d]);
    blockwire_ok(None, &["mount", url, m, "--timeout", "120"]);
    check_tree(&mp);
    blockwire_ok(None, &["umount", m]);
    assert_nothing_left(&mp, &hint);
}

/// `blockwire attach URL TMP/fuse --loop --background`: the loop device, the
/// FUSE directory and a guard that detaches them when the test ends.
fn attach_loop(tmp: &TempDir, url: &str, extra: &[&str]) -> (String, PathBuf, Detach) {
    let dir = tmp.path().join("fuse");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let guard = Detach(d.to_string());
    let mut args = vec!["attach", url, d, "--loop", "--background"];
    args.extend_from_slice(extra);
    let line = blockwire_ok(None, &args);
    let dev = line.split_whitespace().last().unwrap().to_string();
    assert!(dev.starts_with("/dev/loop"), "{line}");
    (dev, dir, guard)
}

// ---- round trips ----

#[test]
fn mount_ext4_over_iscsi() {
    require_root();
    let tmp = TempDir::new("att-i");
    let t = Target::start(Proto::Iscsi, &tmp, "128M");
    roundtrip(&t.url(), "ext4", Some(&t.img()), Fuse::Dev, &tmp);
}

/// A `blockwire umount` that finds the loop device busy stops before the
/// daemon and its FUSE mount: the next `blockwire mount` on that mount
/// point undoes that attach first instead of failing on its FUSE directory.
#[test]
fn mount_after_a_failed_umount_undoes_the_attach_left() {
    require_root();
    let tmp = TempDir::new("att-left");
    let t = Target::start(Proto::Iscsi, &tmp, "64M");
    let (mp, hint, _shared) = mountpoint(&tmp);
    let m = mp.to_str().unwrap();
    let _guard = Detach(m.to_string());
    blockwire_ok(None, &["mount", &t.url(), m, "--mkfs", "ext4", "--timeout", "20"]);
    write_tree(&mp);
    let dev = sh(&format!("findmnt -n -o SOURCE {m}")).trim().to_string();
    assert!(dev.starts_with("/dev/loop"), "{dev}");
    let mut holder = Command::new("sh").args(["-c", &format!("exec 3<{dev}; echo held; exec sleep 600")]).stdout(Stdio::piped()).spawn().unwrap();
    let mut held = String::new();
    BufReader::new(holder.stdout.take().unwrap()).read_line(&mut held).unwrap();
    let failed = blockwire(None, &["umount", m, "--wait", "1"]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(!failed.status.success(), "umount should fail while {dev} is held");
    blockwire_ok(None, &["mount", &t.url(), m, "--timeout", "20"]);
    check_tree(&mp);
    blockwire_ok(None, &["umount", m]);
    assert_nothing_left(&mp, &hint);
}

/// A file system whose FUSE connection is gone (as an interrupted lab
/// leaves one until it unmounts) made every btrfs mkfs on the machine fail
/// ("cannot check mount status ... Transport endpoint is not connected"):
/// `mount --mkfs btrfs` now succeeds beside it, says which mounts it left
/// out of its check, and leaves that mount where it was.
#[test]
fn mkfs_btrfs_beside_a_mount_whose_fuse_connection_is_gone() {
    require_root();
    let (tmp_dead, tmp_new) = (TempDir::new("att-dead"), TempDir::new("att-btrfs"));
    let t = Target::start(Proto::Iscsi, &tmp_dead, "64M");
    let (dead, dead_hint, _s1) = mountpoint(&tmp_dead);
    let d = dead.to_str().unwrap();
    let _g1 = Detach(d.to_string());
    blockwire_ok(None, &["mount", &t.url(), d, "--mkfs", "ext4", "--timeout", "20"]);
    bw_attach::abort_connection(&bw_attach::mount_fuse_dir(&dead)).expect("abort the FUSE connection");
    let t2 = Target::start(Proto::Iscsi, &tmp_new, "256M");
    let (mp, hint, _s2) = mountpoint(&tmp_new);
    let m = mp.to_str().unwrap();
    let _g2 = Detach(m.to_string());
    let out = blockwire(None, &["mount", &t2.url(), m, "--mkfs", "btrfs", "--timeout", "20"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mount --mkfs btrfs beside a dead FUSE mount: {stderr}");
    assert!(stderr.contains("running it without them") && stderr.contains(d), "{stderr}");
    write_tree(&mp);
    assert_eq!(sh(&format!("findmnt -n -o FSTYPE {m}")).trim(), "btrfs");
    assert!(std::fs::read_to_string("/proc/self/mounts").unwrap().contains(d), "the dead mount was detached from the machine");
    blockwire_ok(None, &["umount", m]);
    assert_nothing_left(&mp, &hint);
    blockwire_ok(None, &["umount", d]);
    assert_nothing_left(&dead, &dead_hint);
}

#[test]
fn mount_ext4_and_xfs_over_nvme() {
    require_root();
    let tmp = TempDir::new("att-n");
    // mkfs.xfs refuses file systems under 300 MB.
    let t = Target::start(Proto::Nvme, &tmp, "320M");
    roundtrip(&t.url(), "ext4", Some(&t.img()), Fuse::Uring, &tmp);
    roundtrip(&t.url(), "xfs", None, Fuse::Dev, &tmp);
    let out = Command::new("xfs_repair").args(["-n", "-f"]).arg(t.img()).output().unwrap();
    assert!(out.status.success(), "xfs_repair -n: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn mount_ext4_over_aoe() {
    require_root();
    let tmp = TempDir::new("att-a");
    let t = Target::start(Proto::Aoe, &tmp, "128M");
    // The default datapath, auto, puts the target on AF_XDP.
    let log = t.serve.as_ref().expect("serve").log_text();
    assert!(log.contains("datapath xdp"), "{log}");
    roundtrip(&t.url(), "ext4", Some(&t.img()), Fuse::Uring, &tmp);
}

// ---- data integrity under queue depth ----

fn fio_verify(fuse: Fuse, proto: Proto) {
    require_root();
    let _uring = fuse.guard();
    let tmp = TempDir::new("att-f");
    let t = Target::start(proto, &tmp, "128M");
    let (dev, dir, _guard) = attach_loop(&tmp, &t.url(), &["--timeout", "20", "--fuse", fuse.arg()]);
    let d = dir.to_str().unwrap();
    let dio = std::fs::read_to_string(format!("/sys/block/{}/loop/dio", dev.trim_start_matches("/dev/"))).unwrap();
    assert_eq!(dio.trim(), "1", "loop device without direct I/O");
    let out = Command::new("fio")
        .args([
            "--name=qd32",
            &format!("--filename={dev}"),
            "--direct=1",
            "--ioengine=libaio",
            "--rw=randwrite",
            "--bs=4k,64k",
            "--bsrange=4k-1M",
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
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    blockwire_ok(None, &["umount", d]);
    assert!(out.status.success() && !text.contains("verify failed") && !text.contains("bad "), "fio: {text}");
    assert_nothing_left(&dir, d);
}

#[test]
fn fio_verify_at_queue_depth_32_over_dev_fuse() {
    fio_verify(Fuse::Dev, Proto::Iscsi);
}

#[test]
fn fio_verify_at_queue_depth_32_over_fuse_io_uring() {
    fio_verify(Fuse::Uring, Proto::Iscsi);
}

/// Writes lend their request buffer to the NVMe/TCP queue (no copy): it
/// must not be reused before the data is sent.
#[test]
fn fio_verify_at_queue_depth_32_over_nvme() {
    fio_verify(Fuse::Dev, Proto::Nvme);
}

fn bw_attach_mounted(dir: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mounts").unwrap().contains(dir.to_str().unwrap())
}

/// The measuring null volume: a loop device of its size whose reads and
/// writes succeed at once (bench/attach-overhead's null rows), and a bad
/// size refused in one line.
#[test]
fn null_volume_answers_at_once() {
    require_root();
    let tmp = TempDir::new("att-n");
    let (dev, dir, _guard) = attach_loop(&tmp, "null://64M", &[]);
    let d = dir.to_str().unwrap();
    let size = sh(&format!("blockdev --getsize64 {dev}"));
    assert_eq!(size.trim(), (64u64 << 20).to_string(), "loop device size");
    sh(&format!("dd if=/dev/zero of={dev} bs=1M count=64 oflag=direct 2>&1"));
    sh(&format!("dd if={dev} of=/dev/null bs=1M count=64 iflag=direct 2>&1"));
    blockwire_ok(None, &["umount", d]);
    assert_nothing_left(&dir, d);
    let bad = tmp.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    let out = blockwire(None, &["attach", "null://100", bad.to_str().unwrap(), "--background"]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && text.contains("multiple of 512"), "{text}");
    assert!(!bw_attach_mounted(&bad), "a refused attach left a mount");
}

// ---- discard ----

/// Where the next data at or after `at` begins in `path` (SEEK_DATA), if any.
fn next_data(path: &Path, at: u64) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: lseek on an open descriptor.
    let r = unsafe { libc::lseek(f.as_raw_fd(), at as libc::off_t, libc::SEEK_DATA) };
    (r >= 0).then_some(r as u64)
}

/// blkdiscard on the loop device and fstrim on ext4 both reach the target as
/// UNMAP / deallocate: its file gets holes where the data was.
fn discard_punches_holes(proto: Proto) {
    require_root();
    let tmp = TempDir::new("att-d");
    let t = Target::start(proto, &tmp, "128M");
    let img = t.img();
    {
        let (dev, _dir, _guard) = attach_loop(&tmp, &t.url(), &["--timeout", "20"]);
        let at: u64 = 100 << 20;
        sh(&format!("dd if=/dev/urandom of={dev} bs=1M count=8 seek=100 oflag=direct status=none"));
        assert_eq!(next_data(&img, at), Some(at), "the written range is not allocated in the target's file");
        sh(&format!("blkdiscard -f -o {at} -l {} {dev}", 8 << 20));
        let next = next_data(&img, at);
        assert!(next.is_none_or(|n| n >= at + (8 << 20)), "blkdiscard left data at {next:?} in the target's file");
    }
    let (mp, hint, _shared) = mountpoint(&tmp);
    let m = mp.to_str().unwrap();
    let _guard = Detach(m.to_string());
    blockwire_ok(None, &["mount", t.url().as_str(), m, "--mkfs", "ext4", "--timeout", "20"]);
    let blocks = || std::fs::metadata(&img).map(|md| std::os::unix::fs::MetadataExt::blocks(&md) * 512).unwrap();
    sh(&format!("dd if=/dev/urandom of={m}/big bs=1M count=32 status=none && sync"));
    let full = blocks();
    std::fs::remove_file(mp.join("big")).unwrap();
    sh("sync");
    let trimmed = sh(&format!("fstrim -v {m}"));
    let after = blocks();
    assert!(after + (24 << 20) <= full, "fstrim ({}) freed only {} bytes of the target's file", trimmed.trim(), full - after);
    blockwire_ok(None, &["umount", m]);
    assert_nothing_left(&mp, &hint);
}

#[test]
fn discard_becomes_unmap_over_iscsi() {
    discard_punches_holes(Proto::Iscsi);
}

#[test]
fn discard_becomes_deallocate_over_nvme() {
    discard_punches_holes(Proto::Nvme);
}

/// Punching a hole in the attach file where the target cannot discard:
/// EOPNOTSUPP, and I/O goes on. (The loop device hides this: loop treats
/// EOPNOTSUPP from its file's fallocate as success, so blkdiscard on it
/// "succeeds" without anything reaching the target.)
fn punch_hole_is_refused(url: &str, tmp: &TempDir) {
    let (dev, dir, _guard) = attach_loop(tmp, url, &["--timeout", "20"]);
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new().write(true).open(dir.join("disk")).unwrap();
    // SAFETY: fallocate(2) on an open descriptor; no memory is passed.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 20) };
    let err = std::io::Error::last_os_error();
    assert!(r != 0 && err.raw_os_error() == Some(libc::EOPNOTSUPP), "punching a hole: {r} {err}");
    drop(f);
    sh(&format!("dd if=/dev/zero of={dev} bs=64k count=16 oflag=direct status=none"));
}

/// AoE has no discard (ATA DATA SET MANAGEMENT is not in the AoE command
/// set vblade and blockwire speak).
#[test]
fn discard_is_not_supported_over_aoe() {
    require_root();
    let tmp = TempDir::new("att-da");
    let t = Target::start(Proto::Aoe, &tmp, "64M");
    punch_hole_is_refused(&t.url(), &tmp);
}

// ---- peers ----

#[test]
fn mount_ext4_against_tgt() {
    require_root();
    let tmp = TempDir::new("att-t");
    let img = tmp.path().join("tgt.img");
    sh(&format!("truncate -s 128M {}", img.display()));
    let iqn = "iqn.2026-11.org.blockwire.test:attach-tgt";
    let tgtd = Tgtd::start(&img, iqn);
    let url = format!("iscsi://127.0.0.1:{}/{iqn}/1", tgtd.port);
    roundtrip(&url, "ext4", Some(&img), Fuse::Dev, &tmp);
    // tgt's LUN reports no logical block provisioning: no UNMAP is sent.
    punch_hole_is_refused(&url, &tmp);
}

#[test]
fn mount_ext4_against_vblade() {
    require_root();
    let tmp = TempDir::new("att-v");
    let pair = NetnsPair::new("atv", 1500);
    let img = tmp.path().join("vblade.img");
    std::fs::File::create(&img).unwrap().set_len(128 << 20).unwrap();
    let _vb = Vblade::start(&pair, 7, 3, &img);
    roundtrip(&format!("aoe://{}/7.3", pair.host_if), "ext4", Some(&img), Fuse::Uring, &tmp);
}

// ---- faults ----

/// Kill the target under a running dd: EIO within the timeout; start it
/// again on the same address: new I/O succeeds (iSCSI re-login, NVMe/TCP
/// re-connect, AoE re-discovery), and umount leaves nothing.
fn target_killed_under_dd_then_back(proto: Proto) {
    require_root();
    let tmp = TempDir::new("att-k");
    let mut t = Target::start(proto, &tmp, "128M");
    let (dev, dir, _guard) = attach_loop(&tmp, &t.url(), &["--timeout", "3"]);
    let d = dir.to_str().unwrap();
    // dd rewrites the first 32 MiB over and over, so it is still writing
    // when the target dies however fast the machine is (one dd across the
    // whole volume could finish first and end with "no space").
    let mut dd = Command::new("sh")
        .args(["-c", &format!("while dd of={dev} if=/dev/zero bs=64k count=512 oflag=direct status=none; do :; done; exit 1")])
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    // Killed once dd's writes are completing (through the loop device).
    let writes = || loop_writes_completed(&dev);
    let (before, deadline) = (writes(), Instant::now() + Duration::from_secs(60));
    while writes() == before {
        assert!(dd.try_wait().unwrap().is_none(), "dd ended before the target was killed");
        assert!(Instant::now() < deadline, "no write through {dev} 60 s after dd started");
        std::thread::sleep(Duration::from_millis(10));
    }
    t.stop();
    let killed = Instant::now();
    let mut status = None;
    while killed.elapsed() < Duration::from_secs(60) {
        if let Some(st) = dd.try_wait().unwrap() {
            status = Some(st);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let Some(status) = status else {
        // SAFETY: kill(2) on our own child's process group (the shell and its dd).
        unsafe { libc::kill(-(dd.id() as i32), libc::SIGKILL) };
        let _ = dd.wait();
        panic!("dd still running 60 s after the target died (timeout 3 s)");
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut dd.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success() && err.contains("Input/output error"), "dd: {status} {err}");

    t.restart();
    let t0 = Instant::now();
    loop {
        let ok = Command::new("dd")
            .args([&format!("of={dev}"), "if=/dev/zero", "bs=64k", "count=16", "oflag=direct"])
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        if ok {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no I/O 60 s after the target came back");
        std::thread::sleep(Duration::from_millis(300));
    }
    blockwire_ok(None, &["umount", d]);
    assert_nothing_left(&dir, d);
}

/// Writes the loop device `dev` (/dev/loopN) has completed (its stat's
/// fifth field).
fn loop_writes_completed(dev: &str) -> u64 {
    let name = dev.trim_start_matches("/dev/");
    let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap();
    stat.split_whitespace().nth(4).and_then(|n| n.parse().ok()).expect("write I/Os in the loop device's stat")
}

#[test]
fn nvme_target_killed_under_dd_then_back() {
    target_killed_under_dd_then_back(Proto::Nvme);
}

#[test]
fn iscsi_target_killed_under_dd_then_back() {
    target_killed_under_dd_then_back(Proto::Iscsi);
}

#[test]
fn aoe_target_killed_under_dd_then_back() {
    target_killed_under_dd_then_back(Proto::Aoe);
}

#[test]
fn nfs_target_killed_under_dd_then_back() {
    target_killed_under_dd_then_back(Proto::Nfs);
}

/// `blockwire umount` with the target gone: the file system's last writes
/// cannot reach it, so once the daemon knows the target is unreachable the
/// FUSE connection is aborted; umount completes and nothing is left, no
/// process waits in FUSE.
#[test]
fn umount_while_the_target_is_down() {
    require_root();
    let tmp = TempDir::new("att-u");
    let mut t = Target::start(Proto::Nvme, &tmp, "128M");
    let (mp, hint, _shared) = mountpoint(&tmp);
    let m = mp.to_str().unwrap();
    let _guard = Detach(m.to_string());
    blockwire_ok(None, &["mount", t.url().as_str(), m, "--mkfs", "ext4", "--timeout", "3"]);
    // Dirty data the target will never see.
    std::fs::write(mp.join("lost"), vec![7u8; 4 << 20]).unwrap();
    t.stop();
    let out = blockwire(None, &["umount", m]);
    assert!(out.status.success(), "umount with the target down: {}", String::from_utf8_lossy(&out.stderr));
    assert_nothing_left(&mp, &hint);
}

/// A foreground attach, started and waited for its ready line; its stderr
/// is read as it comes, so a test can wait for what it says.
struct Foreground {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Foreground {
    fn start(url: &str, dir: &Path, timeout: &str) -> Foreground {
        let mut c = Command::new(blockwire_bin())
            .args(["attach", url, dir.to_str().unwrap(), "--timeout", timeout])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("attached "), "{line}");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (lines, from) = (stderr.clone(), c.stderr.take().unwrap());
        let reader = std::thread::spawn(move || {
            for l in BufReader::new(from).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        });
        Foreground { child: c, stderr, reader: Some(reader) }
    }
    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
    fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }
    /// Wait (up to 60 s) until a line of its stderr contains `needle`.
    fn wait_for_line(&mut self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.stderr.lock().unwrap().iter().any(|l| l.contains(needle)) {
            let exited = self.child.try_wait().unwrap();
            assert!(exited.is_none() && Instant::now() < deadline, "no {needle:?} from the attach ({exited:?}):\n{}", self.stderr_text());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    /// Exit status and stderr, within `limit` (None: still running).
    fn wait(&mut self, limit: Duration) -> Option<(std::process::ExitStatus, String)> {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                // Its stderr ends with it: read to the end.
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                return Some((st, self.stderr_text()));
            }
            if t0.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Wait (up to 60 s) until thread `tid` of this process waits inside FUSE
/// for the answer to a write (its kernel stack), or its write ends first:
/// then that result.
fn wait_write_in_fuse(tid: i32, done: &std::sync::mpsc::Receiver<std::io::Result<()>>) -> Option<std::io::Result<()>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut stack = String::new();
    while Instant::now() < deadline {
        if let Ok(r) = done.try_recv() {
            return Some(r);
        }
        stack = std::fs::read_to_string(format!("/proc/self/task/{tid}/stack")).unwrap_or_default();
        if stack.contains("request_wait_answer") && stack.contains("fuse_perform_write") {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the writer is not waiting in a FUSE write 60 s after it started; its kernel stack:\n{stack}");
}

/// SIGTERM on a foreground attach: flush, unmount, exit 0, the data on the
/// target. With the target frozen, the flush cannot finish: a second signal
/// forces (the FUSE connection is aborted, the stuck writer gets an error).
/// Each step waits for the one before it to have happened (the target's
/// threads stopped, the write waiting in FUSE, the first signal taken),
/// never for a time.
#[test]
fn signals_flush_and_unmount_then_force() {
    require_root();
    let tmp = TempDir::new("att-s");
    let t = Target::start(Proto::Iscsi, &tmp, "64M");
    let dir = tmp.path().join("fg");
    std::fs::create_dir_all(&dir).unwrap();
    let mut fg = Foreground::start(&t.url(), &dir, "600");
    let data = vec![0x5Au8; 1 << 20];
    std::fs::OpenOptions::new().write(true).open(dir.join("disk")).and_then(|mut f| std::io::Write::write_all(&mut f, &data)).unwrap();
    fg.signal(libc::SIGTERM);
    let (st, err) = fg.wait(Duration::from_secs(60)).expect("attach still running 60 s after SIGTERM");
    assert!(st.success() && err.contains("flushed and detached"), "{st}: {err}");
    assert!(!bw_is_mounted(&dir), "still mounted after SIGTERM");
    let back = std::fs::read(t.img()).unwrap();
    assert!(back[..1 << 20] == data[..], "the data did not reach the target");

    // Now freeze the target: the flush after SIGINT hangs (timeout 600 s).
    let mut fg = Foreground::start(&t.url(), &dir, "600");
    freeze(t.pid());
    let file = dir.join("disk");
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let writer = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        let _ = tid_tx.send(unsafe { libc::gettid() });
        let r = std::fs::OpenOptions::new().write(true).open(file).and_then(|mut f| std::io::Write::write_all(&mut f, &[1u8; 65536]));
        let _ = done_tx.send(r);
    });
    let tid = tid_rx.recv().unwrap();
    if let Some(r) = wait_write_in_fuse(tid, &done_rx) {
        panic!("the write ended ({r:?}) with the target stopped: acknowledged without reaching it?");
    }
    fg.signal(libc::SIGINT);
    fg.wait_for_line("SIGINT: flushing and detaching");
    assert!(fg.wait(Duration::ZERO).is_none(), "one signal with a frozen target should wait for the flush");
    fg.signal(libc::SIGINT);
    let done = fg.wait(Duration::from_secs(60));
    // SAFETY: kill(2) on the target process we started.
    unsafe { libc::kill(t.pid() as i32, libc::SIGCONT) };
    let (st, err) = done.expect("a second signal did not force the detach");
    assert!(st.success() && err.contains("second signal"), "{st}: {err}");
    assert!(!err.contains("flushed and detached") && !err.contains("still attached"), "the flush did not wait for the frozen target: {err}");
    writer.join().unwrap();
    assert!(done_rx.recv().unwrap().is_err(), "the write to the aborted connection succeeded");
    assert!(!bw_is_mounted(&dir), "still mounted after the second signal");
    assert_no_fuse_waiters();
}

fn bw_is_mounted(dir: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mounts").unwrap().contains(dir.to_str().unwrap())
}

// ---- bad input ----

/// One line on stderr, non-zero exit, nothing attached.
fn refused(args: &[&str], needle: &str, mp: &Path) {
    refused_one_line(args, needle, mp);
    assert_nothing_left(mp, &mp.to_str().unwrap().replace('/', "_"));
}

/// One line on stderr, non-zero exit, no FUSE mount or loop device for `mp`.
fn refused_one_line(args: &[&str], needle: &str, mp: &Path) {
    let out = blockwire(None, args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert_eq!(err.trim().lines().count(), 1, "{args:?}: not one line: {err}");
    assert!(err.contains(needle), "{args:?}: {err}");
    let hint = mp.to_str().unwrap().replace('/', "_");
    assert!(!std::fs::read_to_string("/proc/self/mounts").unwrap().contains(&hint), "FUSE mount left for {args:?}");
    assert!(!sh("losetup -a").contains(&hint), "loop device left for {args:?}");
}

#[test]
fn refused_cases_leave_nothing() {
    require_root();
    let tmp = TempDir::new("att-r");
    let (mp, _, _shared) = mountpoint(&tmp);
    let m = mp.to_str().unwrap();
    // Wrong URL, unreachable target.
    refused(&["mount", "nbd://x/y", m], "nbd", &mp);
    let dead = format!("iscsi://127.0.0.1:{}/{IQN}/0", free_port());
    refused(&["mount", &dead, m, "--timeout", "2"], "127.0.0.1", &mp);
    // Refused authentication: CHAP with a wrong secret.
    let t = Target::start_with(Proto::Iscsi, &tmp, "32M", Some(("alice", "alice-secret-01")));
    let wrong = t.url().replace("alice-secret-01", "wrong-secret");
    refused(&["mount", &wrong, m, "--timeout", "5"], "authentication", &mp);
    // ... and the secret is not printed.
    let out = blockwire(None, &["mount", &wrong, m]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("wrong-secret"), "the secret was printed");
    // Busy: a mount point that is already mounted, a non-empty attach directory.
    sh(&format!("mount -t tmpfs bw-busy {m}"));
    refused_one_line(&["mount", &t.url(), m], "already a mount point", &mp);
    sh(&format!("umount {m}"));
    std::fs::write(mp.join("x"), b"x").unwrap();
    refused(&["attach", &t.url(), m], "not an empty directory", &mp);
    std::fs::remove_file(mp.join("x")).unwrap();
    // Not root.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(blockwire_bin())
        .args(["mount", &t.url(), m])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.trim().lines().count() == 1 && err.contains("root"), "not root: {err}");
    assert_nothing_left(&mp, &m.replace('/', "_"));
    // A good mount works after all that.
    let _guard = Detach(m.to_string());
    blockwire_ok(None, &["mount", &t.url(), m, "--mkfs", "ext4"]);
    blockwire_ok(None, &["umount", m]);
}

// ---- options ----

/// --file, --readonly, --queues, mount -o and mount --readonly do what they say.
#[test]
fn options_file_readonly_queues_and_mount_options() {
    require_root();
    let tmp = TempDir::new("att-o");
    let t = Target::start(Proto::Nvme, &tmp, "64M");
    let url = t.url();
    let dir = tmp.path().join("fuse");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    {
        let _g = Detach(d.to_string());
        blockwire_ok(None, &["attach", &url, d, "--file", "vol.raw", "--readonly", "--queues", "2", "--background"]);
        let names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        assert_eq!(names, ["vol.raw"]);
        assert_eq!(std::fs::metadata(dir.join("vol.raw")).unwrap().len(), 64 << 20);
        let w = std::fs::OpenOptions::new().write(true).open(dir.join("vol.raw"));
        assert!(w.is_err(), "--readonly file opened for writing");
        // One admin and two I/O connections from the daemon to the target.
        let conns = sh(&format!("ss -Htn state established '( dport = :{} )'", t.port)).lines().count();
        assert_eq!(conns, 3, "--queues 2: expected 1 admin + 2 I/O connections");
        blockwire_ok(None, &["umount", d]);
    }
    let (mp, hint, _shared) = mountpoint(&tmp);
    let m = mp.to_str().unwrap();
    let _guard = Detach(m.to_string());
    blockwire_ok(None, &["mount", &url, m, "--mkfs", "ext4", "-o", "noatime,nodiscard"]);
    let line = sh("cat /proc/self/mounts").lines().find(|l| l.contains(m)).unwrap_or_default().to_string();
    assert!(line.contains("noatime") && line.contains("ext4"), "mount -o not applied: {line}");
    blockwire_ok(None, &["umount", m]);
    blockwire_ok(None, &["mount", &url, m, "--readonly"]);
    let line = sh("cat /proc/self/mounts").lines().find(|l| l.contains(m)).unwrap_or_default().to_string();
    assert!(line.contains(" ro,") || line.contains(" ro "), "mount --readonly is not read-only: {line}");
    assert!(std::fs::write(mp.join("x"), b"x").is_err(), "wrote to a read-only mount");
    blockwire_ok(None, &["umount", m]);
    assert_nothing_left(&mp, &hint);
}

// ---- what a root-run umount and attach touch ----

/// Poll `cond` until it holds; `limit` is only an upper bound for a stuck run.
fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < limit, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `--file` names the one file inside the attach directory; the daemon runs
/// as root and gives DIR/NAME to losetup, so a name that leads elsewhere is
/// refused before anything is mounted.
#[test]
fn file_names_leading_out_of_the_directory_are_refused() {
    require_root();
    let tmp = TempDir::new("att-f");
    let dir = tmp.path().join("fuse");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    std::fs::write(tmp.path().join("victim"), b"not a volume").unwrap();
    for name in ["../victim", "..", ".", "/etc/hostname", "a/b", ""] {
        refused(&["attach", "null://64M", d, "--file", name, "--loop", "--background"], "--file", &dir);
    }
    assert_eq!(std::fs::read(tmp.path().join("victim")).unwrap(), b"not a volume");
    // A plain name still works.
    let _g = Detach(d.to_string());
    blockwire_ok(None, &["attach", "null://64M", d, "--file", "..vol", "--background"]);
    assert!(dir.join("..vol").exists());
    blockwire_ok(None, &["umount", d]);
}

/// A state file outlives a daemon that was killed, and its PID may then be
/// another process's: umount must not signal that process. The state file
/// names a `sleep` (as root, like the daemon): once as a state file of
/// today (the recorded start time is not the sleep's), once as one written
/// before start times were recorded (the sleep does not run `attach DIR`).
#[test]
fn umount_never_signals_a_process_that_reused_the_daemons_pid() {
    require_root();
    let tmp = TempDir::new("att-p");
    let dir = tmp.path().join("fuse");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    for start in [",\"start\":1", ""] {
        let mut sleep = Command::new("sleep").arg("600").spawn().unwrap();
        let pid = sleep.id();
        let state = PathBuf::from(format!("/run/blockwire/attach-{pid}.json"));
        std::fs::create_dir_all("/run/blockwire").unwrap();
        std::fs::write(
            &state,
            format!("{{\"pid\":{pid}{start},\"url\":\"null://64M\",\"dir\":\"{d}\",\"file\":\"{d}/disk\",\"loop\":null,\"mountpoint\":null}}"),
        )
        .unwrap();
        let out = blockwire(None, &["umount", d]);
        let alive = sleep.try_wait().unwrap().is_none();
        let _ = sleep.kill();
        let _ = sleep.wait();
        let _ = std::fs::remove_file(&state);
        assert!(out.status.success(), "umount: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("detached"), "the state file was not used");
        assert!(alive, "umount killed PID {pid}, a sleep named by a stale state file{start}");
    }
}

/// Whether loop device `dev` is marked to detach on its last close.
fn autoclear(dev: &str) -> bool {
    let name = dev.trim_start_matches("/dev/");
    std::fs::read_to_string(format!("/sys/block/{name}/loop/autoclear")).is_ok_and(|a| a.trim() == "1")
}

/// Someone else holds the loop device open when umount runs (udev's blkid,
/// a monitoring tool): umount waits for it to let go, then detaches.
#[test]
fn umount_waits_while_the_loop_device_is_held_open() {
    require_root();
    let tmp = TempDir::new("att-w");
    let (dev, dir, _guard) = attach_loop(&tmp, "null://64M", &[]);
    let d = dir.to_str().unwrap();
    let holder = std::fs::File::open(&dev).unwrap();
    // The bound is only there so a broken run ends.
    let mut umount = Command::new(blockwire_bin())
        .args(["umount", d, "--wait", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // umount has asked for the detach; it cannot finish while we hold the device.
    eventually("umount marks the loop device to detach", Duration::from_secs(120), || autoclear(&dev));
    assert!(umount.try_wait().unwrap().is_none(), "umount finished while the loop device was held");
    assert!(bw_attach_mounted(&dir), "the FUSE mount went while its loop device was held");
    drop(holder);
    let out = umount.wait_with_output().unwrap();
    assert!(out.status.success(), "umount after the holder let go: {}", String::from_utf8_lossy(&out.stderr));
    assert_nothing_left(&dir, d);
}

/// A holder that never lets go: after --wait, one line that names it, and
/// the volume still attached (nothing torn down under the holder); a later
/// umount finishes the job.
#[test]
fn umount_names_who_holds_the_loop_device_after_its_wait() {
    require_root();
    let tmp = TempDir::new("att-h");
    let (dev, dir, _guard) = attach_loop(&tmp, "null://64M", &[]);
    let d = dir.to_str().unwrap();
    let holder = std::fs::File::open(&dev).unwrap();
    let out = blockwire(None, &["umount", d, "--wait", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "umount succeeded while {dev} was held");
    assert_eq!(err.trim().lines().count(), 1, "not one line: {err}");
    let me = format!("open by PID {} (", std::process::id());
    assert!(err.contains(&format!("{dev} is still in use")) && err.contains(&me), "{err}");
    assert!(bw_attach_mounted(&dir), "the FUSE mount went while its loop device was held");
    drop(holder);
    blockwire_ok(None, &["umount", d]);
    assert_nothing_left(&dir, d);
}

/// A mount namespace made while the file system is mounted, as
/// `ip netns exec` makes one (a slave copy of every mount): umount detaches
/// at once, because the mount point's parent propagates the unmount to it
/// (see [`SharedDir`]; without that this failed after 30 s with
/// "/dev/loopN is still in use", the flake of mount_ext4_against_tgt).
#[test]
fn umount_reaches_a_mount_namespace_made_while_mounted() {
    require_root();
    let tmp = TempDir::new("att-ns");
    let t = Target::start(Proto::Nvme, &tmp, "64M");
    let (mp, hint, _shared) = mountpoint(&tmp);
    let m = mp.to_str().unwrap();
    let _guard = Detach(m.to_string());
    blockwire_ok(None, &["mount", &t.url(), m, "--mkfs", "ext4"]);
    let mut copy = Command::new("unshare").args(["--mount", "--propagation", "slave", "sleep", "600"]).spawn().unwrap();
    let info = format!("/proc/{}/mountinfo", copy.id());
    eventually("the new namespace has its copy of the mount", Duration::from_secs(60), || {
        std::fs::read_to_string(&info).is_ok_and(|i| i.contains(m))
    });
    let out = blockwire(None, &["umount", m, "--wait", "10"]);
    let copy_left = std::fs::read_to_string(&info).unwrap_or_default().contains(m);
    let _ = copy.kill();
    let _ = copy.wait();
    assert!(out.status.success(), "umount beside a namespace copy: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!copy_left, "the copy in the other namespace is still mounted");
    assert_nothing_left(&mp, &hint);
}

#[test]
fn mount_ext4_over_nfs() {
    require_root();
    let tmp = TempDir::new("att-f");
    let t = Target::start(Proto::Nfs, &tmp, "128M");
    roundtrip(&t.url(), "ext4", Some(&t.img()), Fuse::Dev, &tmp);
}
