//! Two `blockwire serve` gateways on one Ceph RBD image, and the Linux host
//! (the kernel VM) using them as paths to one disk, in one boot
//! (tests/kernel-vm/rbd-gateways.sh):
//! - NVMe/TCP native multipath: one namespace, two paths, ANA optimized on
//!   A and non-optimized on B, I/O follows ANA; A SIGKILLed under writes,
//!   they go on through B; A restarted, the host reconnects and uses it
//!   again. No acknowledged write is lost (checked in the guest and, from
//!   the cluster itself, with `rbd export` here).
//! - iSCSI: open-iscsi logins to both; sg_inq/sg_vpd/sg_rtpg show implicit
//!   ALUA, one LU, distinct relative target ports and each gateway's group
//!   and state.
//! - AoE: e7.1 answered from two MACs (two veths bridged with the VM's tap);
//!   the aoe driver holds both as targets; A killed under writes, they go on.
//!
//! The guest steers the test through a small control port (`kill-a`,
//! `start-a`), so every step happens at a known point of the guest's work.

use crate::common;
use common::ceph::{gateway_toml, Ceph, Gateway, GATEWAY_IQN, GATEWAY_NQN};
use common::*;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A bridge joining the VM's tap with one veth per gateway; the gateways
/// serve AoE on the veths' other ends, so each answers from its own MAC.
struct AoeLan {
    bridge: String,
    tap: String,
    /// (serving end, bridge end) per gateway.
    veths: Vec<(String, String)>,
}

impl AoeLan {
    fn new(gateways: usize) -> AoeLan {
        let id = unique("");
        let lan = AoeLan {
            bridge: format!("bwbr{id}"),
            tap: format!("bwtp{id}"),
            veths: (0..gateways)
                .map(|g| (format!("bwg{g}{id}s"), format!("bwg{g}{id}b")))
                .collect(),
        };
        sh(&format!(
            "ip link add {} type bridge forward_delay 0 && ip link set {} up",
            lan.bridge, lan.bridge
        ));
        sh(&format!(
            "ip tuntap add dev {} mode tap && ip link set {} master {} && ip link set {} up",
            lan.tap, lan.tap, lan.bridge, lan.tap
        ));
        for (s, b) in &lan.veths {
            sh(&format!("ip link add {s} type veth peer name {b} && ip link set {b} master {} && ip link set {b} up && ip link set {s} up", lan.bridge));
        }
        lan
    }

    /// The MAC of gateway `g`'s serving end, as the aoe driver's debugfs
    /// prints it (12 hex digits).
    fn mac(&self, g: usize) -> String {
        std::fs::read_to_string(format!("/sys/class/net/{}/address", self.veths[g].0))
            .expect("veth address")
            .trim()
            .replace(':', "")
    }
}

impl Drop for AoeLan {
    fn drop(&mut self) {
        for (s, _) in &self.veths {
            let _ = std::process::Command::new("ip")
                .args(["link", "del", s])
                .output();
        }
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.tap])
            .output();
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
    }
}

/// Orders from the guest, each a line, carried out by `handle` (on gateway
/// A here: `kill-a` (SIGKILL, a crash) and `start-a` (the same config
/// again)). Answers "done ORDER".
pub(crate) struct Orders {
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<String>>>,
}

impl Orders {
    pub fn serve(mut handle: impl FnMut(&str) + Send + 'static) -> Orders {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the control port");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut done = Vec::new();
            while !stop2.load(Ordering::Relaxed) {
                let Ok((conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                };
                conn.set_nonblocking(false).expect("blocking");
                let mut line = String::new();
                if BufReader::new(&conn).read_line(&mut line).is_err() {
                    continue;
                }
                let order = line.trim().to_string();
                handle(&order);
                let _ = (&conn).write_all(format!("done {order}\n").as_bytes());
                done.push(order);
            }
            done
        });
        Orders {
            port,
            stop,
            thread: Some(thread),
        }
    }

    /// `kill-a` and `start-a` on the gateway in `a`, started again by `start_a`.
    pub fn kill_and_start(a: Arc<Mutex<Option<Serve>>>, start_a: impl Fn() -> Serve + Send + 'static) -> impl FnMut(&str) + Send + 'static {
        move |order| match order {
            "kill-a" => {
                if let Some(s) = a.lock().expect("gateway A").take() {
                    eprintln!("gateways: SIGKILL gateway A ({})", s.kill_now());
                }
            }
            "start-a" => {
                *a.lock().expect("gateway A") = Some(start_a());
                eprintln!("gateways: gateway A restarted");
            }
            _ => {}
        }
    }

    pub fn finish(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .expect("running")
            .join()
            .expect("control thread")
    }
}

impl Drop for Orders {
    /// On a failed test too: the thread holds gateway A, which must be
    /// stopped with the test, not left running.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A guest script of tests/kernel-vm with the failover helpers
/// (failover-lib.sh) in front.
pub(crate) fn guest_script(name: &str) -> String {
    crate::common::guest_script_with("failover-lib.sh", name)
}

/// `rbd export` of the image, then every block a guest ledger line names
/// must hold its marker: "MARK-LEDGER: writer K blocks FIRST to LAST step 4 count N".
pub(crate) fn check_ledgers(image: &[u8], output: &str, mark: &str) -> usize {
    let mut checked = 0;
    for line in output
        .lines()
        .filter_map(|l| l.split_once(&format!("{mark}-LEDGER: ")).map(|(_, r)| r))
    {
        let w: Vec<&str> = line.split_whitespace().collect();
        let (first, last, count): (u64, u64, u64) = (
            w[3].parse().expect("first"),
            w[5].parse().expect("last"),
            w[9].parse().expect("count"),
        );
        assert_eq!(
            (last - first) / 4 + 1,
            count,
            "ledger {line:?} has gaps: a write failed or was skipped"
        );
        for b in (first..=last).step_by(4) {
            let want = format!("{mark} block {b:08}\n");
            let at = (b * 4096) as usize;
            assert!(
                image.get(at..at + want.len()) == Some(want.as_bytes()),
                "block {b} acknowledged to the guest ({mark}) is not in the cluster: {:?}",
                String::from_utf8_lossy(&image[at..at + 32])
            );
            checked += 1;
        }
    }
    checked
}

#[test]
fn linux_host_uses_two_rbd_gateways_as_paths_and_survives_losing_one() {
    require_root();
    let ceph = Ceph::shared();
    let image = format!("mp{}", unique(""));
    ceph.rbd(&[
        "create",
        "--size",
        "64M",
        "--image-feature",
        "layering",
        &format!("rbd/{image}"),
    ]);
    let lan = AoeLan::new(2);
    let (dir_a, dir_b) = (TempDir::new("rbdgwa"), TempDir::new("rbdgwb"));
    let (ia, ib, na, nb) = (free_port(), free_port(), free_port(), free_port());
    let toml_a = gateway_toml(
        ceph,
        &Gateway {
            image: &image,
            group: 1,
            preferred: true,
            iscsi_port: ia,
            nvme_port: na,
            aoe_if: Some(&lan.veths[0].0),
            timeout_s: 20,
        },
    );
    let toml_b = gateway_toml(
        ceph,
        &Gateway {
            image: &image,
            group: 2,
            preferred: false,
            iscsi_port: ib,
            nvme_port: nb,
            aoe_if: Some(&lan.veths[1].0),
            timeout_s: 20,
        },
    );
    let a = Arc::new(Mutex::new(Some(Serve::with_config(&dir_a, &toml_a, &[]))));
    let mut b = Serve::with_config(&dir_b, &toml_b, &[]);
    let config_a = dir_a
        .path()
        .join("serve.toml")
        .to_str()
        .expect("UTF-8")
        .to_string();
    let orders = Orders::serve(Orders::kill_and_start(a.clone(), move || Serve::start(&["--config", &config_a])));

    let script = dir_a.path().join("rbd-gateways.sh");
    let body = guest_script("rbd-gateways.sh");
    std::fs::write(
        &script,
        format!(
            "PA={na} PB={nb} IA={ia} IB={ib} NQN={GATEWAY_NQN} IQN={GATEWAY_IQN} MACA={} MACB={} CTL={}\n{body}",
            lan.mac(0),
            lan.mac(1),
            orders.port
        ),
    )
    .expect("write guest script");
    let run = kernel_vm(&script, Some(&lan.tap), None);
    let done = orders.finish();
    for step in [
        "MP-OK: one multipath namespace",
        "MP-OK: ANA states: A optimized, B non-optimized",
        "MP-OK: I/O goes to the optimized path",
        "MP-OK: I/O continues through B while A is down",
        "MP-OK: A is used again after it returns",
        "MP-OK: NVMe multipath done",
        "MP-OK: sg_inq: TPGS=1",
        "MP-OK: sg_vpd: one LU, relative target ports 1 and 2",
        "MP-OK: sg_rtpg: A reports group 1 active/optimized",
        "MP-OK: written through A, read back through B",
        "MP-OK: one AoE device e7.1, two targets",
        "MP-OK: writes go to both gateways",
        "MP-OK: AoE writes continue through B while A is down",
        "MP-ALL-OK",
    ] {
        assert!(
            run.output.contains(step),
            "guest did not report {step:?}\n{}",
            run.output
        );
    }
    assert!(run.status.success(), "guest script failed");
    assert_eq!(
        done,
        ["kill-a", "start-a", "kill-a"],
        "orders the guest gave"
    );

    // What the guest was told is written must be in the cluster itself.
    let export = dir_b.path().join("export.bin");
    ceph.rbd(&[
        "export",
        "--no-progress",
        &format!("rbd/{image}"),
        export.to_str().expect("UTF-8"),
    ]);
    let data = std::fs::read(&export).expect("read export");
    let nvme = check_ledgers(&data, &run.output, "nvme");
    let aoe = check_ledgers(&data, &run.output, "aoe");
    eprintln!("rbd_gateways: {nvme} NVMe and {aoe} AoE acknowledged writes found in rbd export");
    assert!(
        nvme >= 160 && aoe >= 100,
        "too few acknowledged writes to mean anything: {nvme} NVMe, {aoe} AoE"
    );

    assert!(b.is_running(), "gateway B died:\n{}", b.log_text());
    assert!(b.stop().success(), "gateway B did not stop cleanly");
    let last_a = a.lock().expect("gateway A").take();
    if let Some(a) = last_a {
        assert!(a.stop().success(), "gateway A did not stop cleanly");
    }
    // The image stays: the killed gateway's watch on it lasts 30 s, and the
    // shared cluster is thrown away when the test process ends.
}
