//! blockwire's NVMe/TCP initiator against the Linux kernel's target
//! (nvmet-tcp in a qemu guest, tests/kernel-vm/nvme-target.sh), reached
//! through a qemu port forward: `blockwire verify` with several queues and
//! with digests, and discovery through the kernel's discovery controller.

use crate::common;
use common::*;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.org.blockwire:nvmet";
const DONE: &str = "nqn.2026-11.org.blockwire:host-done";

/// kernel-vm in its own process group, killed as a group on drop (qemu is
/// its grandchild).
struct Vm(Child);

impl Drop for Vm {
    fn drop(&mut self) {
        let pg = self.0.id() as i32;
        // SAFETY: signalling the process group we created for this child.
        unsafe { libc::kill(-pg, libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

#[test]
fn blockwire_initiator_against_linux_nvmet() {
    require_root();
    let dir = TempDir::new("nvt");
    let port = free_port();
    let script = dir.path().join("nvme-target.sh");
    let body = std::fs::read_to_string(repo_root().join("tests/kernel-vm/nvme-target.sh")).unwrap();
    std::fs::write(&script, format!("NQN={NQN}\nDONE={DONE}\n{body}")).unwrap();
    let child = Command::new(shared_dir().join("tools/kernel-vm"))
        .arg("run")
        .arg(&script)
        .env("KVM_HOSTFWD", format!("tcp:127.0.0.1:{port}-:4420"))
        .env("KVM_TIMEOUT", "900")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .expect("spawn kernel-vm");
    let mut vm = Vm(child);
    let out = vm.0.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            eprintln!("[vm] {line}");
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    // kernel-vm's console pipe is block-buffered, so the guest's "ready" line
    // can arrive late: probe the forwarded port with our discovery client
    // until the kernel target answers (qemu accepts before the guest does).
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut ready = false;
    while Instant::now() < deadline {
        if let Ok(Some(st)) = vm.0.try_wait() {
            panic!("kernel-vm exited early ({st}):\n{}", reader.join().unwrap_or_default());
        }
        let o = blockwire(None, &["nvme", "discover", &format!("127.0.0.1:{port}"), "--timeout", "10"]);
        if o.status.success() && String::from_utf8_lossy(&o.stdout).contains(NQN) {
            ready = true;
            break;
        }
        std::thread::sleep(Duration::from_secs(5));
    }
    assert!(ready, "the guest's nvmet target did not come up within 15 minutes");
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
    let status = vm.0.wait().expect("wait for kernel-vm");
    let all = reader.join().unwrap();
    assert!(all.contains("NVMET-DONE"), "guest did not see the done signal");
    assert!(status.success(), "kernel-vm failed: {status}");
}
