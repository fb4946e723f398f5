//! Two `blockwire serve` gateways on one Ceph RBD image as a cluster uses
//! them, against the Linux host in the kernel VM, in one boot
//! (tests/kernel-vm/rbd-ha.sh): SCSI persistent reservations through
//! sg_persist and NVMe reservations through nvme-cli, made through one
//! gateway and enforced and reported by the other, and by a gateway
//! killed and restarted (the state lives in a RADOS object beside the
//! image, see docs/ceph.md); planned failover under writes (`ctl ana_set`,
//! `ctl drain`) and, for comparison, the unplanned one (gateway A killed);
//! iSCSI through dm-multipath and multipathd with gateway A killed.
//!
//! The guest steers the test through a small order port: `kill-a`,
//! `start-a`, and `ctl a|b METHOD JSON` (a control call on a gateway).

use crate::common;
use crate::rbd_gateways::{check_ledgers, guest_script, Orders};
use common::ceph::{gateway_toml, Ceph, Gateway, GATEWAY_IQN, GATEWAY_NQN};
use common::*;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// `blockwire ctl` on a gateway's control socket; its output, or the failure.
fn ctl(sock: &std::path::Path, method: &str, params: &str) -> Result<String, String> {
    let out = std::process::Command::new(blockwire_bin())
        .arg("ctl")
        .arg("--control")
        .arg(sock)
        .arg(method)
        .arg(params)
        .output()
        .expect("spawn blockwire ctl");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("ctl {method} {params}: {text}"))
    }
}

#[test]
fn two_rbd_gateways_share_reservations_with_a_linux_host() {
    require_root();
    let ceph = Ceph::shared();
    let image = format!("ha{}", unique(""));
    ceph.rbd(&["create", "--size", "64M", "--image-feature", "layering", &format!("rbd/{image}")]);
    let (dir_a, dir_b) = (TempDir::new("rbdhaa"), TempDir::new("rbdhab"));
    let (ia, ib, na, nb) = (free_port(), free_port(), free_port(), free_port());
    let toml = |group: u16, iscsi_port: u16, nvme_port: u16| {
        gateway_toml(ceph, &Gateway { image: &image, group, preferred: group == 1, iscsi_port, nvme_port, aoe_if: None, timeout_s: 20 })
    };
    let sock_a = dir_a.path().join("ctl.sock");
    let sock_b = dir_b.path().join("ctl.sock");
    let (sa, sb) = (sock_a.to_str().expect("UTF-8").to_string(), sock_b.to_str().expect("UTF-8").to_string());
    let a = Arc::new(Mutex::new(Some(Serve::with_config(&dir_a, &toml(1, ia, na), &["--control", &sa]))));
    let mut b = Serve::with_config(&dir_b, &toml(2, ib, nb), &["--control", &sb]);
    let config_a = dir_a.path().join("serve.toml").to_str().expect("UTF-8").to_string();
    let mut kill_start = Orders::kill_and_start(a.clone(), move || Serve::start(&["--config", &config_a, "--control", &sa]));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let f2 = failures.clone();
    let socks: [PathBuf; 2] = [sock_a.clone(), sock_b.clone()];
    let orders = Orders::serve(move |order| match order.strip_prefix("ctl ") {
        Some(rest) => {
            let mut w = rest.splitn(3, ' ');
            let (gw, method, params) = (w.next().unwrap_or(""), w.next().unwrap_or(""), w.next().unwrap_or("{}"));
            let sock = if gw == "a" { &socks[0] } else { &socks[1] };
            match ctl(sock, method, params) {
                Ok(out) => eprintln!("rbd_ha: gateway {gw}: {method} {params}: {}", out.trim()),
                Err(e) => f2.lock().expect("failures").push(e),
            }
        }
        None => kill_start(order),
    });

    let script = dir_a.path().join("rbd-ha.sh");
    std::fs::write(
        &script,
        format!("PA={na} PB={nb} IA={ia} IB={ib} NQN={GATEWAY_NQN} IQN={GATEWAY_IQN} CTL={}\n{}", orders.port, guest_script("rbd-ha.sh")),
    )
    .expect("write guest script");
    let run = kernel_vm(&script, None, None);
    let done = orders.finish();
    for step in [
        "MP-OK: SCSI: reserved through A",
        "MP-OK: SCSI: preempted and released through B",
        "MP-OK: SCSI: gateway A restarted reports the reservation",
        "MP-OK: NVMe: acquired through A",
        "MP-OK: NVMe: preempted and released through B",
        "MP-OK: NVMe: gateway A restarted reports the reservation",
        "MP-OK: planned failover: ana_set moved the optimized path from A to B",
        "MP-OK: drain: A inaccessible",
        "MP-OK: no write failed and every acknowledged block reads back",
        "MP-OK: one dm-multipath map over both gateways' paths",
        "MP-OK: dm-multipath: tpg_set moved the writes from A to B",
        "MP-OK: dm-multipath: I/O continued through B after A was killed",
        "MP-ALL-OK",
    ] {
        assert!(run.output.contains(step), "guest did not report {step:?}\n{}", run.output);
    }
    assert!(run.status.success(), "guest script failed");
    assert_eq!(failures.lock().expect("failures").clone(), Vec::<String>::new(), "control calls failed");
    assert!(done.iter().filter(|o| *o == "kill-a").count() >= 2, "orders the guest gave: {done:?}");

    // What the guest was told is written must be in the cluster itself.
    let export = dir_b.path().join("export.bin");
    ceph.rbd(&["export", "--no-progress", &format!("rbd/{image}"), export.to_str().expect("UTF-8")]);
    let data = std::fs::read(&export).expect("read export");
    let planned = check_ledgers(&data, &run.output, "plan");
    let mpath = check_ledgers(&data, &run.output, "mpath");
    eprintln!("rbd_ha: {planned} NVMe and {mpath} dm-multipath acknowledged writes of the failover runs found in rbd export");
    assert!(planned >= 200 && mpath >= 100, "too few acknowledged writes to mean anything: {planned} NVMe, {mpath} dm-multipath");
    for l in run.output.lines().filter(|l| l.contains("FAILOVER-GAPS")) {
        eprintln!("rbd_ha: {l}");
    }

    assert!(b.is_running(), "gateway B died:\n{}", b.log_text());
    assert!(b.stop().success(), "gateway B did not stop cleanly");
    let last_a = a.lock().expect("gateway A").take();
    if let Some(a) = last_a {
        assert!(a.stop().success(), "gateway A did not stop cleanly");
    }
}
