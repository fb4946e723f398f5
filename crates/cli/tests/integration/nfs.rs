//! `nfs://` (a file on an NFSv3 export as a block volume) against
//! nfs-ganesha: verify and bench, and bad input; and the kernel's NFS
//! client (in the kernel VM) through the lab's kernel NFS mounts. The mount
//! round trip and the server killed under dd are in attach.rs beside the
//! other protocols.

use crate::common;
use common::ganesha::Ganesha;
use common::*;

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

/// The lab's kernel NFS subjects' mounts (`bw_lab::kernel_nfs`) on a
/// client host with a kernel NFS client: the kernel VM over ssh (dropbear
/// behind a qemu port forward), reaching ganesha in its namespace through
/// qemu's user network. NFSv3 and NFSv4.1 mounts of the export, each
/// recorded in the host's state file before it is made; a file written
/// over one read back over the other; one file workload (flowop varmail)
/// on the NFSv4.1 mount, which is then released as a run releases it. The
/// NFSv3 one is left as a killed run leaves it, and the next run's sweep of
/// unlocked state files unmounts it. One boot.
#[test]
fn kernel_nfs_mounts_on_a_client_host_and_what_a_killed_run_left_is_undone() {
    use bw_lab::host::Host;
    use bw_lab::kernel_nfs::{self, NfsVersion};
    use bw_lab::ssh::SshHost;
    use std::path::Path;
    use std::time::{Duration, Instant};
    let t0 = Instant::now();
    let tmp = TempDir::new("nfs-kvm");
    let g = Ganesha::start(&tmp.path().join("export"));
    let dir = tmp.path();
    sh(&format!("ssh-keygen -q -t ed25519 -N '' -C bwnfs -f {}", dir.join("client").display()));
    let script = dir.join("guest.sh");
    // The lab's remote lines want a shell that finds programs on PATH
    // (busybox's prefers its applets).
    std::fs::write(&script, "#!/bin/sh\nln -sf bash /bin/sh\nsleep 900\n").unwrap();
    sh(&format!("chmod +x {}", script.display()));
    let key = dir.join("client.pub").display().to_string();
    let exe = blockwire_bin().display().to_string();
    // flock for the sweep's lock test; libgcc_s for the binary.
    let with = ["--with", exe.as_str(), "--with", "/usr/bin/flock", "--with", "/lib/x86_64-linux-gnu/libgcc_s.so.1"];
    let port = free_port();
    let mut vm = BackgroundVm::start_with(None, &script, &format!("tcp:127.0.0.1:{port}-:22"), &with, &[("KVM_SSH_KEY", &key)]);
    let opts: Vec<(String, String)> = [
        ("IdentityFile", dir.join("client").display().to_string()),
        ("IdentitiesOnly", "yes".into()),
        ("StrictHostKeyChecking", "no".into()),
        ("UserKnownHostsFile", "/dev/null".into()),
        ("LogLevel", "ERROR".into()),
    ]
    .map(|(k, v)| (k.to_string(), v))
    .to_vec();
    // Two runs of the lab on the guest, by their run ids (state files).
    let run = |id: &str| {
        let h = SshHost::new(&format!("ssh://root@127.0.0.1:{port}"), &opts, &blockwire_bin()).unwrap();
        SshHost { run_id: format!("{id}-{}", std::process::id()), ..h }
    };
    let (killed, next) = (run("knfs-killed"), run("knfs-next"));
    vm.wait_until(Duration::from_secs(600), || killed.run_line("true").is_ok()).unwrap_or_else(|c| panic!("the guest did not come up: {c}"));
    eprintln!("guest up after {:?}", t0.elapsed());
    let host = Host::Ssh(killed.clone());
    assert!(kernel_nfs::available(&host), "the guest has no kernel NFS client");
    killed.run_line(&format!("mkdir -p {}", bw_lab::ssh::REMOTE_DIR)).unwrap();
    let server: std::net::Ipv4Addr = g.ip.parse().unwrap();
    // (Never released: the killed run's.)
    let export = bw_lab::subjects::Subject::Peer(bw_lab::subjects::PeerKind::Ganesha).address();
    let _v3 = kernel_nfs::mount(&host, server, export, NfsVersion::V3, Path::new("/mnt/bwlab-v3"), "").expect("NFSv3 mount");
    let v41 = kernel_nfs::mount(&host, server, export, NfsVersion::V41, Path::new("/mnt/bwlab-v41"), "").expect("NFSv4.1 mount");
    let state = killed.run_line(&format!("cat {}", killed.state_file())).unwrap();
    assert!(state.contains("kernel nfs /mnt/bwlab-v3") && state.contains("kernel nfs /mnt/bwlab-v41"), "state file: {state}");
    let out = killed
        .run_line("dd if=/dev/urandom of=/mnt/bwlab-v3/probe bs=64k count=16 2>/dev/null && sync && a=$(md5sum < /mnt/bwlab-v3/probe) && b=$(md5sum < /mnt/bwlab-v41/probe) && [ \"$a\" = \"$b\" ] && echo same")
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(out.contains("same"), "written over NFSv3, read over NFSv4.1: {out}");
    assert!(g.dir.join("probe").exists(), "the guest's file is not in the export");
    let out = killed.run_line(&format!("mkdir -p /mnt/bwlab-v41/w && {exe} flowop varmail /mnt/bwlab-v41/w --runtime 1 --json")).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(out.contains("\"ops\""), "flowop on the NFSv4.1 mount: {out}");
    v41.release().expect("unmount NFSv4.1");
    let nfs_left = |h: &SshHost| h.run_line("grep ' nfs' /proc/mounts; ls -d /mnt/bwlab-* 2>/dev/null; true").unwrap();
    let left = nfs_left(&killed);
    assert!(left.contains("/mnt/bwlab-v3") && !left.contains("/mnt/bwlab-v41"), "after releasing the NFSv4.1 mount: {left}");
    // The killed run holds no lock on its state file: the next run undoes it.
    let swept = next.sweep_stale().expect("sweep");
    assert!(swept.iter().any(|f| f.ends_with(&killed.run_id)), "swept: {swept:?}");
    let left = nfs_left(&next);
    assert!(left.trim().is_empty(), "left in the guest: {left}");
    eprintln!("kernel NFS on the VM took {:?}", t0.elapsed());
}
