//! The Linux nvme-tcp host (a real Debian kernel under qemu) against
//! `blockwire serve`: connect with and without digests, with SQ flow
//! control disabled (reads completed by C2HData SUCCESS), O_DIRECT 8 MiB
//! write/read/compare, ext4 + e2fsck, disconnect, a host NQN outside the
//! allow list refused, the discovery controller; all in one boot
//! (tests/kernel-vm/nvme.sh). Then our own discovery client reads the same
//! discovery log.

use crate::common;
use common::*;

const NQN: &str = "nqn.2026-11.org.blockwire:kvm-test";
const HOSTNQN: &str = "nqn.2026-11.org.blockwire:kernel-vm";
const BADNQN: &str = "nqn.2026-11.org.blockwire:intruder";

#[test]
fn linux_nvme_tcp_host_against_blockwire() {
    require_root();
    let dir = TempDir::new("nvk");
    let (port, dport) = (free_port(), free_port());
    let cfg = format!(
        r#"
[[volume]]
name = "d0"
backend = "file:{}/disk.img,size=256M"
[nvme]
listen = ["127.0.0.1:{port}"]
discovery_listen = "127.0.0.1:{dport}"
[[nvme.subsystem]]
nqn = "{NQN}"
namespaces = [{{ nsid = 1, volume = "d0" }}]
allowed_hosts = ["{HOSTNQN}"]
"#,
        dir.path().display()
    );
    // -vv: the queues' connect lines say whether the host disabled SQ flow control.
    let mut serve = Serve::with_config(&dir, &cfg, &["-vv"]);
    let script = dir.path().join("nvme.sh");
    let body = guest_script_with("nvme-host-lib.sh", "nvme.sh");
    std::fs::write(&script, format!("PORT={port}\nDPORT={dport}\nNQN={NQN}\nHOSTNQN={HOSTNQN}\nBADNQN={BADNQN}\n{body}")).unwrap();
    let run = kernel_vm(&script, None, None);
    for step in [
        "NVME-OK: no-digest O_DIRECT 8 MiB write/read/compare",
        "NVME-OK: disconnect (no digests)",
        "NVME-OK: disable_sqflow O_DIRECT 8 MiB write/read/compare",
        "NVME-OK: disable_sqflow,data_digest O_DIRECT 8 MiB write/read/compare",
        "NVME-OK: digest O_DIRECT 8 MiB write/read/compare",
        "NVME-OK: ext4 mkfs/mount/write/e2fsck clean",
        "NVME-OK: disconnect (digests)",
        "NVME-OK: disallowed host refused",
        "NVME-OK: discovery controller connect/disconnect",
        "NVME-ALL-OK",
    ] {
        assert!(run.output.contains(step), "guest did not report {step:?}\n{}", run.output);
    }
    assert!(run.status.success(), "guest script failed");
    assert!(serve.is_running(), "target died");
    let needle = format!("host {BADNQN} is not allowed");
    let t0 = std::time::Instant::now();
    while !serve.log_text().contains(&needle) && t0.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(serve.log_text().contains(&needle), "refusal not logged:\n{}", serve.log_text());
    // The Linux host did disable SQ flow control on its I/O queues, so the
    // reads above completed with C2HData SUCCESS and no response capsule.
    assert!(
        serve.log_text().lines().any(|l| l.contains("queue 1 of controller") && l.contains("SQ flow control disabled")),
        "no I/O queue connected with SQ flow control disabled:\n{}",
        serve.log_text()
    );
    // The kernel connected the discovery controller; our client reads its log.
    let out = blockwire_ok(None, &["nvme", "discover", &format!("127.0.0.1:{dport}"), "--initiator-name", HOSTNQN]);
    assert!(out.contains(NQN) && out.contains(&port.to_string()), "discovery log does not list the subsystem:\n{out}");
    // A host outside the allow list sees nothing in the discovery log.
    let out = blockwire(None, &["nvme", "discover", &format!("127.0.0.1:{dport}"), "--initiator-name", BADNQN]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains(NQN), "discovery log shows the subsystem to a disallowed host:\n{text}");
    assert!(serve.stop().success());
}
