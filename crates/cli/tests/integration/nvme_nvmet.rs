//! blockwire's NVMe/TCP initiator against the Linux kernel's target
//! (nvmet-tcp in a qemu guest, tests/kernel-vm/nvme-target.sh), reached
//! through a qemu port forward: `blockwire verify` with several queues and
//! with digests, and discovery through the kernel's discovery controller.

use crate::common;
use common::*;
use std::time::Duration;

const NQN: &str = "nqn.2026-11.org.blockwire:nvmet";
const DONE: &str = "nqn.2026-11.org.blockwire:host-done";

#[test]
fn blockwire_initiator_against_linux_nvmet() {
    require_root();
    let dir = TempDir::new("nvt");
    let port = free_port();
    let script = dir.path().join("nvme-target.sh");
    let body = std::fs::read_to_string(repo_root().join("tests/kernel-vm/nvme-target.sh")).unwrap();
    std::fs::write(&script, format!("NQN={NQN}\nDONE={DONE}\n{body}")).unwrap();
    let mut vm = BackgroundVm::start(None, &script, &format!("tcp:127.0.0.1:{port}-:4420"));
    // Our discovery client until the kernel target answers (qemu accepts
    // before the guest does).
    vm.wait_until(Duration::from_secs(900), || {
        let o = blockwire(None, &["nvme", "discover", &format!("127.0.0.1:{port}"), "--timeout", "10"]);
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains(NQN)
    })
    .unwrap_or_else(|console| panic!("{console}"));
    let u = format!("nvme+tcp://127.0.0.1:{port}/{NQN}/1");
    let o = blockwire_ok(None, &["verify", &u, "--size", "24M", "--queues", "2", "--timeout", "120"]);
    assert!(o.contains("OK"), "{o}");
    blockwire_ok(None, &["verify", &u, "--size", "4M", "--chunk", "4k", "--header-digest", "--data-digest", "--seed", "5", "--timeout", "120"]);
    blockwire_ok(None, &["verify", &u, "--size", "8M", "--chunk", "512k", "--data-digest", "--seed", "9", "--timeout", "120"]);
    let d = blockwire_ok(None, &["nvme", "discover", &format!("127.0.0.1:{port}"), "--timeout", "120"]);
    assert!(d.contains(NQN), "kernel discovery log does not list {NQN}:\n{d}");
    // blockwire mount against the kernel's target: ext4, a tree, fsck, remount.
    crate::attach::roundtrip_through_attach(&u, &dir);
    // Tell the guest we are done: it watches dmesg for this host NQN.
    let _ = blockwire(None, &["verify", &u, "--size", "1M", "--initiator-name", DONE, "--timeout", "120"]);
    let (status, all) = vm.finish();
    assert!(all.contains("NVMET-DONE"), "guest did not see the done signal");
    assert!(status.success(), "kernel-vm failed: {status}");
}
