//! nfs-ganesha (Debian nfs-ganesha, nfs-ganesha-vfs) with its own rpcbind
//! in the namespace end of a veth pair, exporting a directory of the test
//! (the lab's launch: bw_lab::subjects::ganesha::Launch). Restartable on the
//! same address; ganesha and rpcbind stopped by PID on drop.

use super::*;
use bw_lab::subjects::ganesha::{answers, Launch, EXPORT};
use std::net::Ipv4Addr;

pub struct Ganesha {
    pub pair: NetnsPair,
    /// The namespace end's address, where ganesha listens.
    pub ip: String,
    /// The exported directory (its pseudo path is [`EXPORT`]).
    pub dir: PathBuf,
    state: PathBuf,
    child: Option<Child>,
}

impl Ganesha {
    /// Export `dir` (created if missing) from a new namespace.
    pub fn start(dir: &Path) -> Ganesha {
        require_root();
        // Each its own /30 (10.254.60-79.0): tests run side by side.
        static NEXT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
        let subnet = 60 + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 20;
        let pair = NetnsPair::new("nfs", 1500);
        let (_, ip) = pair.with_ipv4(subnet);
        std::fs::create_dir_all(dir).unwrap();
        let state = dir.with_extension("ganesha-state");
        let mut g = Ganesha { pair, ip, dir: dir.to_path_buf(), state, child: None };
        g.restart();
        g
    }

    fn in_ns(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.pair.ns, program]);
        c
    }

    fn launch(&self) -> Launch<'_> {
        Launch { state: &self.state, export_dir: &self.dir, image: None, volume_from: None, bind: None }
    }

    /// Start ganesha (again) and wait until NFSv3 answers.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "ganesha is already running");
        let _ = std::fs::remove_file(self.state.join("rpcbind.pid"));
        let mut cmd = self.launch().command(self.in_ns("unshare")).expect("ganesha config");
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn ganesha.nfsd (Debian nfs-ganesha)");
        self.child = Some(child);
        let ip: Ipv4Addr = self.ip.parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !answers(self.in_ns("rpcinfo"), ip) {
            let gone = self.child.as_mut().unwrap().try_wait().unwrap().is_some();
            if gone || Instant::now() > deadline {
                let log = self.launch().log();
                self.stop();
                panic!("ganesha did not start: {log}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// ganesha killed (SIGKILL: a crash, no goodbye to clients), and its rpcbind.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(pid) = self.launch().rpcbind_pid() {
            // SAFETY: kill(2) on the rpcbind this fixture started (its PID file).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let _ = std::fs::remove_file(self.state.join("rpcbind.pid"));
        }
    }

    /// `nfs://IP/EXPORT/FILE` for a file in the exported directory.
    pub fn url(&self, file: &str) -> String {
        format!("nfs://{}{EXPORT}/{file}", self.ip)
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.state);
    }
}
