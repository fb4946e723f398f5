//! The Linux kernel's own aoe driver against `blockwire serve`: a guest
//! (../shared/tools/kernel-vm, qemu) discovers e1.1 over a tap device,
//! writes and reads back 8 MiB with O_DIRECT, makes ext4, mounts it, writes
//! a file, and e2fsck -fn must find it clean. Needs root and the kernel-vm image.

use crate::common;
use common::*;

struct Tap(String);

impl Tap {
    fn new() -> Tap {
        let name = format!("bwaoetap{}", std::process::id() % 100_000);
        sh(&format!("ip tuntap add dev {name} mode tap && ip link set {name} up"));
        Tap(name)
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["link", "del", &self.0]).output();
    }
}

#[test]
fn linux_kernel_aoe_driver_reads_writes_and_mounts_ext4() {
    require_root();
    let tap = Tap::new();
    let dir = TempDir::new("aoekvm");
    let backing = dir.path().join("disk.img");
    let serve = Serve::start(&[
        "--volume",
        &format!("d=file:{},size=64M", backing.display()),
        "--aoe",
        &format!("{},volume=d,shelf=1,slot=1", tap.0),
        "--aoe-datapath",
        "xdp",
    ]);
    // The Linux initiator against the AF_XDP datapath (native XDP on a tap).
    assert!(serve.log_text().contains(&format!("aoe {}: datapath xdp", tap.0)), "{}", serve.log_text());
    let script = repo_root().join("tests/kernel-vm/aoe.sh");
    let run = kernel_vm(&script, Some(&tap.0), None);
    assert!(run.output.contains("AOE-KERNEL-OK"), "guest did not finish the AoE checks:\n{}", run.output);
    assert!(run.status.success(), "kernel-vm exit status {}", run.status);
    // The data went through blockwire into the backing file: it now holds ext4.
    let img = std::fs::read(&backing).expect("backing file");
    assert_eq!(&img[1024 + 56..1024 + 58], &[0x53, 0xEF], "ext4 superblock magic in the backing file");
    assert!(serve.stop().success());
}
