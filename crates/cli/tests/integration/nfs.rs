//! `nfs://` (a file on an NFSv3 export as a block volume) against
//! nfs-ganesha: verify and bench, and bad input. The mount round trip and
//! the server killed under dd are in attach.rs beside the other protocols.

use crate::common;
use common::ganesha::Ganesha;
use common::*;
use std::process::Command;

#[test]
fn verify_and_bench_over_nfs_against_ganesha() {
    let tmp = TempDir::new("nfs-vb");
    let g = Ganesha::start(&tmp.path().join("export"));
    let img = g.dir.join("disk.img");
    std::fs::File::create(&img).unwrap().set_len(32 << 20).unwrap();
    let url = g.url("disk.img");
    let out = blockwire_ok(None, &["verify", &url, "--size", "16M"]);
    assert!(out.contains("OK") && out.contains("NFSv3"), "{out}");
    let out = blockwire_ok(None, &["bench", &url, "--rw", "randrw", "--bs", "4k", "--iodepth", "16", "--runtime", "1", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(v.to_string().contains("\"ios\""), "{out}");
    // What verify wrote is in the file, read here without NFS.
    let head = std::fs::read(&img).unwrap();
    assert!(head.iter().take(1 << 20).any(|&b| b != 0), "nothing written to {}", img.display());
}

/// A missing export, a missing file, nothing listening: one line, non-zero exit.
#[test]
fn nfs_bad_input_says_one_line() {
    let tmp = TempDir::new("nfs-bad");
    let g = Ganesha::start(&tmp.path().join("export"));
    std::fs::File::create(g.dir.join("disk.img")).unwrap().set_len(1 << 20).unwrap();
    let cases = [
        // ganesha answers ACCES for an export it does not have (it names none it hides).
        (format!("nfs://{}/no-such-export/disk.img", g.ip), "mount /no-such-export: MNT3ERR_"),
        (g.url("missing.img"), "NFS3ERR_NOENT"),
        (String::from("nfs://127.0.0.1/x/disk.img"), "cannot connect"),
    ];
    for (url, want) in cases {
        let out = blockwire(None, &["verify", &url, "--size", "1M", "--timeout", "3"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{url}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{url}: more than one line: {err}");
    }
}

/// The kernel's NFS client (in the kernel VM) against ganesha: NFSv3 and
/// NFSv4.1 mounts of the export, a file written over one read over the
/// other, and one file workload (flowop varmail) on the NFSv4.1 mount. The
/// guest's eth1 is a tap in ganesha's namespace (10.254.80.0/30).
#[test]
fn kernel_nfs_client_mounts_ganesha_v3_and_v41() {
    let tmp = TempDir::new("nfs-kvm");
    let g = Ganesha::start(&tmp.path().join("export"));
    let tap = format!("bwnfs{}", std::process::id() % 100_000);
    sh(&format!("ip -n {ns} tuntap add dev {tap} mode tap && ip -n {ns} addr add 10.254.80.1/30 dev {tap} && ip -n {ns} link set {tap} up", ns = g.pair.ns));
    let script = tmp.path().join("nfs.sh");
    let body = std::fs::read_to_string(repo_root().join("tests/kernel-vm/nfs.sh")).unwrap();
    std::fs::write(&script, format!("BLOCKWIRE={}\n{body}", blockwire_bin().display())).unwrap();
    let tool = shared_dir().join("tools/kernel-vm");
    // kernel-vm (and its qemu) in ganesha's namespace, so the tap is that namespace's.
    let out = Command::new("ip")
        .args(["netns", "exec", &g.pair.ns])
        .arg(&tool)
        .arg("run")
        .arg(&script)
        .args(["--tap", &tap, "--with"])
        .arg(blockwire_bin())
        .env("KVM_TIMEOUT", std::env::var("KVM_TIMEOUT").unwrap_or_else(|_| "900".into()))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("spawn kernel-vm");
    let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("---- kernel-vm nfs.sh ----\n{output}\n---- end ----");
    assert!(output.contains("NFS-KERNEL-OK"), "guest did not finish the NFS checks:\n{output}");
    assert!(g.dir.join("probe").exists(), "the guest's file is not in the export");
}
