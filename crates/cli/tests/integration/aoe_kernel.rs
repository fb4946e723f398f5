//! The Linux kernel's own aoe driver against `blockwire serve`: a guest
//! (tests/kernel-vm/vm, qemu) discovers e1.1 over a tap device,
//! writes and reads back 8 MiB with O_DIRECT, makes ext4, mounts it, writes
//! a file, and e2fsck -fn must find it clean; once against the AF_XDP
//! datapath, once against the PACKET_MMAP rings. Needs root and the
//! kernel-vm image.

use crate::common;
use common::*;

struct Tap(String);

impl Tap {
    /// `tag`: one letter per test, so tests running at once get their own.
    fn new(tag: &str) -> Tap {
        let name = format!("bwaoe{tag}{}", std::process::id() % 100_000);
        sh(&format!("ip tuntap add dev {name} mode tap && ip link set {name} up"));
        Tap(name)
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["link", "del", &self.0]).output();
    }
}

/// The Linux initiator against the AF_XDP datapath (native XDP on a tap).
#[test]
fn linux_kernel_aoe_driver_reads_writes_and_mounts_ext4() {
    kernel_aoe_driver_against("x", "xdp");
}

/// The same against the PACKET_MMAP rings (the target builds its replies
/// in its transmit ring; the guest's driver must take them as they are).
#[test]
fn linux_kernel_aoe_driver_over_packet_mmap_rings() {
    kernel_aoe_driver_against("m", "mmap");
}

/// serve on a tap of its own (`tag`) with `--aoe-datapath DATAPATH` (its
/// log names it), the guest's aoe driver doing tests/kernel-vm/aoe.sh.
fn kernel_aoe_driver_against(tag: &str, datapath: &str) {
    require_root();
    let tap = Tap::new(tag);
    let dir = TempDir::new("aoekvm");
    let backing = dir.path().join("disk.img");
    let serve = Serve::start(&[
        "--volume",
        &format!("d=file:{},size=64M", backing.display()),
        "--aoe",
        &format!("{},volume=d,shelf=1,slot=1", tap.0),
        "--aoe-datapath",
        datapath,
    ]);
    assert!(serve.log_text().contains(&format!("aoe {}: datapath {datapath}", tap.0)), "{}", serve.log_text());
    let script = repo_root().join("tests/kernel-vm/aoe.sh");
    let run = kernel_vm(&script, Some(&tap.0), None);
    assert!(run.output.contains("AOE-KERNEL-OK"), "guest did not finish the AoE checks:\n{}", run.output);
    assert!(run.status.success(), "kernel-vm exit status {}", run.status);
    // The data went through blockwire into the backing file: it now holds ext4.
    let img = std::fs::read(&backing).expect("backing file");
    assert_eq!(&img[1024 + 56..1024 + 58], &[0x53, 0xEF], "ext4 superblock magic in the backing file");
    assert!(serve.stop().success());
}
