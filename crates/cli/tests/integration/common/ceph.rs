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
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The Debian packages this harness needs (also in the Makefile's DEB_PACKAGES).
pub const TOOLS: [&str; 4] = ["ceph-mon", "ceph-osd", "ceph", "rbd"];

pub struct Ceph {
    dir: TempDir,
    conf: PathBuf,
    mon: Option<Child>,
    osd: Option<Child>,
}

static SHARED: OnceLock<Ceph> = OnceLock::new();

impl Ceph {
    /// One cluster for every test of this process that does not stop or
    /// pause it (each uses its own image names): a start costs about 10 s.
    /// The first caller starts it; it is stopped when the test process
    /// exits (atexit), and its daemons die with the process in any case
    /// (they are spawned by a thread that never ends, with
    /// PR_SET_PDEATHSIG). Tests that pause the cluster use [`Ceph::start`].
    pub fn shared() -> &'static Ceph {
        SHARED.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("ceph-shared".into())
                .spawn(move || {
                    let started = std::panic::catch_unwind(Ceph::start);
                    let _ = tx.send(started);
                    // PR_SET_PDEATHSIG fires when the forking *thread* ends.
                    loop {
                        std::thread::park();
                    }
                })
                .expect("spawn the ceph-shared thread");
            let ceph = rx
                .recv()
                .expect("ceph-shared thread")
                .unwrap_or_else(|e| std::panic::resume_unwind(e));
            extern "C" fn stop_shared() {
                if let Some(c) = SHARED.get() {
                    let pids: Vec<i32> = [&c.osd, &c.mon]
                        .into_iter()
                        .flatten()
                        .map(|ch| ch.id() as i32)
                        .collect();
                    stop_daemons(&pids);
                    let _ = std::fs::remove_dir_all(c.dir.path());
                }
            }
            // SAFETY: registering a plain extern "C" function.
            unsafe { libc::atexit(stop_shared) };
            ceph
        })
    }

    /// Start the cluster and create the pool `rbd` (application rbd). Panics
    /// with the daemons' logs if it is not usable within a minute.
    pub fn start() -> Ceph {
        for t in TOOLS {
            assert!(
                Command::new("sh")
                    .arg("-c")
                    .arg(format!("command -v {t}"))
                    .output()
                    .is_ok_and(|o| o.status.success()),
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
             [client]\n\
             admin socket = {d}/run/$name.$pid.asok\n\
             ",
            d = d.display()
        );
        std::fs::write(&conf, text).expect("write ceph.conf");
        for sub in ["run", "crash", "mon-a"] {
            std::fs::create_dir_all(d.join(sub)).expect("mkdir");
        }
        let conf_s = conf.to_str().expect("UTF-8 temp path").to_string();
        let monmap = d.join("monmap");
        run_ok(
            Command::new("monmaptool")
                .args(["--create", "--fsid", &fsid, "--addv", "a"])
                .arg(format!("[v2:127.0.0.1:{port}]"))
                .arg(&monmap),
        );
        run_ok(
            Command::new("ceph-mon")
                .args(["-c", &conf_s, "--mkfs", "-i", "a", "--monmap"])
                .arg(&monmap),
        );
        let mon = daemon("ceph-mon")
            .args(["-f", "-c", &conf_s, "-i", "a"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ceph-mon");
        let mut c = Ceph {
            dir,
            conf,
            mon: Some(mon),
            osd: None,
        };

        let osd_uuid = uuid();
        let id = c.ceph(&["osd", "new", &osd_uuid]).trim().to_string();
        std::fs::create_dir_all(d.join(format!("osd-{id}"))).expect("mkdir osd");
        run_ok(Command::new("ceph-osd").args([
            "-c",
            &conf_s,
            "-i",
            &id,
            "--mkfs",
            "--osd-uuid",
            &osd_uuid,
        ]));
        let osd = daemon("ceph-osd")
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
            assert!(
                Instant::now() < deadline,
                "ceph-osd not up after 60 s: {stat}\n{}",
                c.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        c.ceph(&["osd", "pool", "create", "rbd", "8", "8"]);
        c.ceph(&["osd", "pool", "application", "enable", "rbd", "rbd"]);
        // Without a mgr there are no PG stats to wait on: an image create
        // (real I/O to the pool) only returns once the PGs are active.
        let probe = c.rbd_output(
            &["create", "--size", "1M", "rbd/harness-probe"],
            Duration::from_secs(60),
        );
        assert!(
            probe.status.success(),
            "rbd create on the new pool failed: {}\n{}",
            String::from_utf8_lossy(&probe.stderr),
            c.logs()
        );
        c.rbd(&["rm", "--no-progress", "rbd/harness-probe"]);
        eprintln!(
            "ceph: one-node cluster up in {:.1} s ({})",
            started.elapsed().as_secs_f64(),
            c.conf.display()
        );
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
        assert!(
            out.status.success(),
            "ceph {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `rbd rm POOL/IMAGE`, waiting out a watch that a stopped gateway left:
    /// serve exits without closing an image that a front-end's thread still
    /// holds when its 5 s for stopping run out (AoE's I/O threads), and the
    /// OSD drops that watch only after its timeout (30 s). Any other
    /// failure, or a watch that outlives 60 s, panics.
    pub fn rbd_rm(&self, image: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.rbd_output(&["rm", "--no-progress", image], Duration::from_secs(60));
            if out.status.success() {
                return;
            }
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("has watchers") && std::time::Instant::now() < deadline, "rbd rm {image} failed: {err}");
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    /// `rbd -c CONF ARGS`, panicking with the output if it fails.
    pub fn rbd(&self, args: &[&str]) -> String {
        let out = self.rbd_output(args, Duration::from_secs(60));
        assert!(
            out.status.success(),
            "rbd {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `rados -c CONF ARGS`, panicking with the output if it fails.
    pub fn rados(&self, args: &[&str]) -> String {
        let out = self.tool("rados", args, Duration::from_secs(60));
        assert!(out.status.success(), "rados {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
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
    /// keeps its (memory-only) data for [`Ceph::resume`]. Returns once
    /// every thread of both is stopped.
    pub fn pause(&self) {
        for c in [&self.mon, &self.osd].into_iter().flatten() {
            super::freeze(c.id());
        }
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

    /// Freeze only the OSD: the monitor still answers, but no I/O completes
    /// (requests stay in flight in the clients until they time out).
    /// Returns once every thread of the OSD is stopped.
    pub fn pause_osd(&self) {
        if let Some(c) = &self.osd {
            super::freeze(c.id());
        }
    }

    /// Requests the librados client of process `pid` (a gateway) has in
    /// flight, from its admin socket (`objecter_requests`).
    pub fn client_ops_in_flight(&self, pid: u32) -> usize {
        let sock = self.dir.path().join(format!("run/client.admin.{pid}.asok"));
        let out = self.tool(
            "ceph",
            &[
                "--admin-daemon",
                sock.to_str().expect("UTF-8 path"),
                "objecter_requests",
            ],
            Duration::from_secs(10),
        );
        assert!(
            out.status.success(),
            "objecter_requests on {}: {}",
            sock.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        // {"ops": [{"tid": ...}, ...], "linger_ops": [...], ...}
        let text = String::from_utf8_lossy(&out.stdout);
        let ops = text.split("\"linger_ops\"").next().unwrap_or("");
        ops.matches("\"tid\"").count()
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
        let pids: Vec<i32> = [self.osd.take(), self.mon.take()]
            .into_iter()
            .flatten()
            .map(|c| c.id() as i32)
            .collect();
        stop_daemons(&pids);
    }
}

/// A Ceph daemon that dies with the thread that spawns it (SIGKILL), so an
/// aborted test run leaves no cluster behind.
fn daemon(program: &str) -> Command {
    let mut c = Command::new(program);
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    unsafe {
        c.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    c
}

/// SIGCONT (a paused daemon would not act on SIGTERM), SIGTERM, wait up to
/// 10 s, then SIGKILL; each reaped by PID.
fn stop_daemons(pids: &[i32]) {
    for &pid in pids {
        // SAFETY: signalling our own children by PID.
        unsafe {
            libc::kill(pid, libc::SIGCONT);
            libc::kill(pid, libc::SIGTERM);
        }
    }
    for &pid in pids {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut status = 0;
            // SAFETY: reaping our own child; `status` is a local.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r != 0 {
                break; // reaped, or not our child any more
            }
            if Instant::now() >= deadline {
                // SAFETY: as above.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn uuid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .expect("read a random uuid")
        .trim()
        .to_string()
}

fn run_ok(c: &mut Command) {
    let out = c
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn {c:?}: {e}"));
    assert!(
        out.status.success(),
        "{c:?} failed\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One gateway of an rbd image, for [`gateway_toml`]. Gateways of one image
/// share the volume name, IQN, NQN and serial, so initiators see one LU /
/// namespace behind several paths; `group` (1, 2, ...) sets what must
/// differ: the ALUA target port group and relative target port, and the
/// NVMe controller id range.
pub struct Gateway<'a> {
    pub image: &'a str,
    pub group: u16,
    /// Optimized (ANA) / active-optimized (ALUA), or non-optimized.
    pub preferred: bool,
    pub iscsi_port: u16,
    pub nvme_port: u16,
    /// Export shelf 7 slot 1 over AoE on this interface.
    pub aoe_if: Option<&'a str>,
    /// librbd request timeout (`timeout=` of the rbd: backend).
    pub timeout_s: u32,
}

pub const GATEWAY_IQN: &str = "iqn.2026-11.org.blockwire.test:rbd";
pub const GATEWAY_NQN: &str = "nqn.2026-11.org.blockwire:rbd-test";

/// `blockwire serve` config of one gateway.
pub fn gateway_toml(ceph: &Ceph, g: &Gateway) -> String {
    let aoe = g.aoe_if.map_or(String::new(), |ifc| {
        format!("[[aoe.export]]\ninterface = \"{ifc}\"\nvolume = \"v\"\nshelf = 7\nslot = 1\n")
    });
    let (alua, ana) = if g.preferred {
        ("active-optimized", "optimized")
    } else {
        ("active-non-optimized", "non-optimized")
    };
    let lo = 1 + (g.group - 1) * 1000;
    format!(
        r#"
[[volume]]
name = "v"
backend = "rbd:rbd/{image},conf={conf},timeout={timeout}"
{aoe}
[iscsi]
listen = ["127.0.0.1:{iport}"]
[[iscsi.target]]
iqn = "{GATEWAY_IQN}"
luns = [{{ lun = 0, volume = "v" }}]
target_port_group = {group}
alua_state = "{alua}"
[nvme]
listen = ["127.0.0.1:{nport}"]
discovery_listen = "127.0.0.1:{dport}"
cntlid_range = [{lo}, {hi}]
[[nvme.subsystem]]
nqn = "{GATEWAY_NQN}"
serial = "bwrbd0001"
ana_state = "{ana}"
namespaces = [{{ nsid = 1, volume = "v" }}]
"#,
        image = g.image,
        conf = ceph.conf().display(),
        timeout = g.timeout_s,
        iport = g.iscsi_port,
        nport = g.nvme_port,
        dport = free_port(),
        group = g.group,
        hi = lo + 998,
    )
}
