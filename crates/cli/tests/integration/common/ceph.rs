//! A throwaway one-node Ceph cluster for tests: one ceph-mon and one memstore
//! ceph-osd, no mgr, no cephx, everything under a temporary directory, on
//! 127.0.0.1. Both daemons run in the foreground as our children and are
//! stopped by PID on drop; the directory goes with them.
//!
//! Why each setting is there:
//! - `auth_* = none`: no keyrings to create or pass to clients.
//! - memstore: no disk, nothing left behind; the data lives only as long as
//!   the OSD process, which is all a test needs.
//! - pool size 1 (and `mon_allow_pool_size_one`): one OSD must be enough for
//!   PGs to go active.
//! - the mon listens on a port we picked free (msgr2 only); the OSD picks its
//!   own free ports in `ms_bind_port_min..max` and registers them with the mon.
//! - `ceph-osd --mkfs` gets `--osd-uuid` equal to the uuid passed to
//!   `ceph osd new`: otherwise the OSD's superblock and the map disagree and it
//!   never boots.

use super::{free_port, TempDir};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The Debian packages this harness needs (also in the Makefile's DEB_PACKAGES).
pub const TOOLS: [&str; 4] = ["ceph-mon", "ceph-osd", "ceph", "rbd"];

pub struct Ceph {
    dir: TempDir,
    conf: PathBuf,
    mon: Option<Child>,
    osd: Option<Child>,
}

impl Ceph {
    /// Start the cluster and create the pool `rbd` (application rbd). Panics
    /// with the daemons' logs if it is not usable within a minute.
    pub fn start() -> Ceph {
        for t in TOOLS {
            assert!(
                Command::new("sh").arg("-c").arg(format!("command -v {t}")).output().is_ok_and(|o| o.status.success()),
                "{t} is missing: install ceph-mon ceph-osd ceph-common (`make deps`)"
            );
        }
        let started = Instant::now();
        let dir = TempDir::new("ceph");
        let d = dir.path().to_path_buf();
        let port = free_port();
        let fsid = uuid();
        let conf = d.join("ceph.conf");
        let text = format!(
            "[global]\n\
             fsid = {fsid}\n\
             mon host = [v2:127.0.0.1:{port}]\n\
             public addr = 127.0.0.1\n\
             cluster addr = 127.0.0.1\n\
             ms bind msgr1 = false\n\
             auth cluster required = none\n\
             auth service required = none\n\
             auth client required = none\n\
             auth allow insecure global id reclaim = true\n\
             keyring = {d}/keyring\n\
             run dir = {d}/run\n\
             admin socket = {d}/run/$name.asok\n\
             log file = {d}/$name.log\n\
             pid file = {d}/run/$name.pid\n\
             crash dir = {d}/crash\n\
             mon data = {d}/mon-$id\n\
             osd data = {d}/osd-$id\n\
             osd objectstore = memstore\n\
             memstore device bytes = 2147483648\n\
             osd pool default size = 1\n\
             osd pool default min size = 1\n\
             osd pool default pg num = 8\n\
             osd pool default pgp num = 8\n\
             osd crush chooseleaf type = 0\n\
             mon allow pool size one = true\n\
             mon allow pool delete = true\n\
             mon data avail crit = 0\n\
             mon warn on pool no redundancy = false\n\
             osd memory target = 536870912\n\
             ",
            d = d.display()
        );
        std::fs::write(&conf, text).expect("write ceph.conf");
        for sub in ["run", "crash", "mon-a"] {
            std::fs::create_dir_all(d.join(sub)).expect("mkdir");
        }
        let conf_s = conf.to_str().expect("UTF-8 temp path").to_string();
        let monmap = d.join("monmap");
        run_ok(Command::new("monmaptool").args(["--create", "--fsid", &fsid, "--addv", "a"]).arg(format!("[v2:127.0.0.1:{port}]")).arg(&monmap));
        run_ok(Command::new("ceph-mon").args(["-c", &conf_s, "--mkfs", "-i", "a", "--monmap"]).arg(&monmap));
        let mon = Command::new("ceph-mon")
            .args(["-f", "-c", &conf_s, "-i", "a"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ceph-mon");
        let mut c = Ceph { dir, conf, mon: Some(mon), osd: None };

        let osd_uuid = uuid();
        let id = c.ceph(&["osd", "new", &osd_uuid]).trim().to_string();
        std::fs::create_dir_all(d.join(format!("osd-{id}"))).expect("mkdir osd");
        run_ok(Command::new("ceph-osd").args(["-c", &conf_s, "-i", &id, "--mkfs", "--osd-uuid", &osd_uuid]));
        let osd = Command::new("ceph-osd")
            .args(["-f", "-c", &conf_s, "-i", &id])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ceph-osd");
        c.osd = Some(osd);

        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let stat = c.ceph(&["osd", "stat", "--format", "json"]);
            if stat.contains("\"num_up_osds\":1") {
                break;
            }
            assert!(Instant::now() < deadline, "ceph-osd not up after 60 s: {stat}\n{}", c.logs());
            std::thread::sleep(Duration::from_millis(200));
        }
        c.ceph(&["osd", "pool", "create", "rbd", "8", "8"]);
        c.ceph(&["osd", "pool", "application", "enable", "rbd", "rbd"]);
        // Without a mgr there are no PG stats to wait on: an image create
        // (real I/O to the pool) only returns once the PGs are active.
        let probe = c.rbd_output(&["create", "--size", "1M", "rbd/harness-probe"], Duration::from_secs(60));
        assert!(probe.status.success(), "rbd create on the new pool failed: {}\n{}", String::from_utf8_lossy(&probe.stderr), c.logs());
        c.rbd(&["rm", "--no-progress", "rbd/harness-probe"]);
        eprintln!("ceph: one-node cluster up in {:.1} s ({})", started.elapsed().as_secs_f64(), c.conf.display());
        c
    }

    /// The cluster's ceph.conf, for `rbd:POOL/IMAGE,conf=PATH`.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `ceph -c CONF ARGS`, panicking with the output if it fails.
    pub fn ceph(&self, args: &[&str]) -> String {
        let out = self.tool("ceph", args, Duration::from_secs(30));
        assert!(out.status.success(), "ceph {args:?} failed: {}\n{}", String::from_utf8_lossy(&out.stderr), self.logs());
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `rbd -c CONF ARGS`, panicking with the output if it fails.
    pub fn rbd(&self, args: &[&str]) -> String {
        let out = self.rbd_output(args, Duration::from_secs(60));
        assert!(out.status.success(), "rbd {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `rbd -c CONF ARGS` under `timeout`, whatever its result.
    pub fn rbd_output(&self, args: &[&str], timeout: Duration) -> Output {
        self.tool("rbd", args, timeout)
    }

    fn tool(&self, tool: &str, args: &[&str], timeout: Duration) -> Output {
        // `timeout` so a cluster that is down makes a test fail, not hang
        // (the Ceph clients retry forever by default).
        Command::new("timeout")
            .arg(format!("{}", timeout.as_secs()))
            .arg(tool)
            .arg("-c")
            .arg(&self.conf)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("spawn {tool}: {e}"))
    }

    /// Freeze both daemons (SIGSTOP): to clients the cluster is gone, but it
    /// keeps its (memory-only) data for [`Ceph::resume`].
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: i32) {
        for c in [&self.mon, &self.osd].into_iter().flatten() {
            // SAFETY: signalling our own child by PID.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// The tail of each daemon's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        if let Ok(rd) = std::fs::read_dir(self.dir.path()) {
            for e in rd.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "log") {
                    let text = std::fs::read_to_string(&p).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    let tail = &lines[lines.len().saturating_sub(30)..];
                    s.push_str(&format!("---- {} ----\n{}\n", p.display(), tail.join("\n")));
                }
            }
        }
        s
    }
}

impl Drop for Ceph {
    fn drop(&mut self) {
        // SIGCONT first: a paused daemon would not act on SIGTERM.
        self.resume();
        for child in [self.osd.take(), self.mon.take()].into_iter().flatten() {
            let mut child = child;
            // SAFETY: signalling our own child by PID.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn uuid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid").expect("read a random uuid").trim().to_string()
}

fn run_ok(c: &mut Command) {
    let out = c.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("spawn {c:?}: {e}"));
    assert!(
        out.status.success(),
        "{c:?} failed\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
