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

/// The lab's kernel NFS subjects' mounts (`bw_lab::subjects::kernel_nfs`) on a
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
    use bw_lab::hosts::host::Host;
    use bw_lab::subjects::kernel_nfs::{self, NfsVersion};
    use bw_lab::hosts::ssh::SshHost;
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
    std::fs::write(&script, format!("#!/bin/sh\nln -sf bash /bin/sh\n{}", crate::common::guest_stays_up())).unwrap();
    sh(&format!("chmod +x {}", script.display()));
    let key = dir.join("client.pub").display().to_string();
    let exe = blockwire_bin().display().to_string();
    // flock for the sweep's lock test; libgcc_s for the binary.
    let with = ["--with", exe.as_str(), "--with", "/usr/bin/flock", "--with", "/lib/x86_64-linux-gnu/libgcc_s.so.1"];
    let port = free_port();
    let life = crate::common::stays_up_timeout();
    let mut vm = BackgroundVm::start_with(None, &script, &format!("tcp:127.0.0.1:{port}-:22"), &with, &[("KVM_SSH_KEY", &key), (life.0, &life.1)]);
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
    killed.run_line(&format!("mkdir -p {}", bw_lab::hosts::ssh::REMOTE_DIR)).unwrap();
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
    assert!(swept.iter().any(|f| f.state.ends_with(&killed.run_id)), "swept: {swept:?}");
    let left = nfs_left(&next);
    assert!(left.trim().is_empty(), "left in the guest: {left}");
    eprintln!("kernel NFS on the VM took {:?}", t0.elapsed());
}

/// knfsd (`bw_lab::subjects::knfsd`) set up on the kernel VM as on a lab's
/// target host over ssh (dropbear behind a qemu port forward), exporting
/// to the guest itself (127.0.0.1: the client is the guest's kernel NFS
/// client and blockwire's `nfs://` client run in the guest). One boot,
/// three runs:
/// - nothing of NFS runs in the guest: the lab loads nfsd, starts rpcbind,
///   mountd and the server, exports; the image file read with direct I/O
///   over NFSv3 and NFSv4.1 is the backing's bytes, a file written in
///   `w/` over one version is read back over the other, blockwire benches
///   the image over `nfs://`; stopped, the guest is as it was (no export,
///   server, daemon, module, mount or file of the lab's);
/// - the guest runs a server with an export of its own: the lab adds its
///   export beside it, and stopped leaves the guest's server, daemons and
///   export as they were;
/// - a run that never stops (killed): the next run's sweep undoes it, and
///   the guest's own export is still there.
#[test]
fn knfsd_in_the_vm_serves_nfs3_and_nfs41_and_leaves_only_what_was_there() {
    use bw_lab::suites::fs::fs_kind::FsKind;
    use bw_lab::hosts::host::Host;
    use bw_lab::subjects::kernel_nfs::{self, NfsVersion};
    use bw_lab::hosts::ssh::SshHost;
    use bw_lab::subjects::knfsd;
    use std::path::Path;
    use std::time::{Duration, Instant};
    let t0 = Instant::now();
    let tmp = TempDir::new("knfsd-kvm");
    let dir = tmp.path();
    sh(&format!("ssh-keygen -q -t ed25519 -N '' -C bwknfsd -f {}", dir.join("client").display()));
    let script = dir.join("guest.sh");
    std::fs::write(&script, format!("#!/bin/sh\nln -sf bash /bin/sh\n{}", crate::common::guest_stays_up())).unwrap();
    sh(&format!("chmod +x {}", script.display()));
    let key = dir.join("client.pub").display().to_string();
    let exe = blockwire_bin().display().to_string();
    let with = ["--with", exe.as_str(), "--with", "/usr/bin/flock", "--with", "/lib/x86_64-linux-gnu/libgcc_s.so.1"];
    let port = free_port();
    let life = crate::common::stays_up_timeout();
    let mut vm = BackgroundVm::start_with(None, &script, &format!("tcp:127.0.0.1:{port}-:22"), &with, &[("KVM_SSH_KEY", &key), (life.0, &life.1)]);
    let opts: Vec<(String, String)> = [
        ("IdentityFile", dir.join("client").display().to_string()),
        ("IdentitiesOnly", "yes".into()),
        ("StrictHostKeyChecking", "no".into()),
        ("UserKnownHostsFile", "/dev/null".into()),
        ("LogLevel", "ERROR".into()),
    ]
    .map(|(k, v)| (k.to_string(), v))
    .to_vec();
    let run = |id: &str| {
        let h = SshHost::new(&format!("ssh://root@127.0.0.1:{port}"), &opts, &blockwire_bin()).unwrap();
        SshHost { run_id: format!("{id}-{}", std::process::id()), ..h }
    };
    let first = run("knfsd-first");
    vm.wait_until(Duration::from_secs(600), || first.run_line("true").is_ok()).unwrap_or_else(|c| panic!("the guest did not come up: {c}"));
    eprintln!("guest up after {:?}", t0.elapsed());
    let host = Host::Ssh(first.clone());
    let line = |h: &SshHost, l: &str| h.run_line(l).unwrap_or_else(|e| panic!("{l}: {e:#}"));
    line(&first, &format!("mkdir -p {}", bw_lab::hosts::ssh::REMOTE_DIR));
    let backing = Path::new("/dev/shm/bwlab-test-backing");
    line(&first, &format!("dd if=/dev/urandom of={} bs=1M count=16 2>/dev/null", backing.display()));
    let md5 = line(&first, &format!("md5sum < {}", backing.display()));
    let local: std::net::Ipv4Addr = "127.0.0.1".parse().unwrap();
    let link = bw_lab::network::topology::Link { mtu: 1500, target_if: "lo".into(), client_if: "lo".into(), target_ip: local, client_ip: local };
    // What of NFS the guest runs: module, daemons, threads, exports, mounts.
    let state = |h: &SshHost| {
        line(
            h,
            "echo module $([ -d /sys/module/nfsd ] && echo nfsd); echo daemons $(pidof rpcbind rpc.mountd); \
             echo threads $(cat /proc/fs/nfsd/threads 2>/dev/null); echo exports $(exportfs 2>/dev/null | tr -s ' \\n' ' '); \
             echo mounts $(grep -e nfsd -e bwlab /proc/mounts | cut -d' ' -f2); echo files $(ls -d /srv/bwlab-knfsd /dev/shm/bwlab-remote-* 2>/dev/null)",
        )
    };
    let address = bw_lab::subjects::PeerTarget::address(&knfsd::Knfsd);

    // 1. Nothing of NFS runs: the lab starts it all, and takes it all down.
    let before = state(&first);
    assert!(before.lines().any(|l| l == "module") && before.lines().any(|l| l == "daemons"), "the guest runs NFS before the test: {before}");
    let p = knfsd::serve(&host, &link, backing, FsKind::Ext4).unwrap_or_else(|e| panic!("knfsd: {e}"));
    let settings = p.settings.clone().unwrap_or_default();
    assert!(settings.contains("knfsd in Linux 6.") && settings.contains(knfsd::EXPORT_OPTIONS) && settings.contains("8 nfsd threads"), "{settings}");
    let up = state(&first);
    assert!(up.contains("/srv/bwlab-knfsd 127.0.0.1") && up.contains("threads 8"), "{up}");
    // The image with direct I/O over each version, as the micro suite reads it.
    for v in kernel_nfs::VERSIONS {
        let (image, tokens) = kernel_nfs::mount_image(&host, local, address, v).unwrap_or_else(|e| panic!("{}: {e:#}", v.name()));
        let read = line(&first, &format!("dd if={image} iflag=direct bs=1M 2>/dev/null | md5sum"));
        assert_eq!(read, md5, "the image over {} is not the backing", v.name());
        for t in tokens.into_iter().rev() {
            bw_lab::cleanup::registry().release(t).unwrap();
        }
    }
    // The fs suite's mounts: a file written over NFSv3 read over NFSv4.1.
    let v3 = kernel_nfs::mount(&host, local, address, NfsVersion::V3, Path::new("/mnt/bwlab-k3"), "").expect("NFSv3 mount");
    let v41 = kernel_nfs::mount(&host, local, address, NfsVersion::V41, Path::new("/mnt/bwlab-k41"), "").expect("NFSv4.1 mount");
    let out = line(
        &first,
        "mkdir -p /mnt/bwlab-k3/w && dd if=/dev/urandom of=/mnt/bwlab-k3/w/probe bs=64k count=16 2>/dev/null && sync && a=$(md5sum < /mnt/bwlab-k3/w/probe) && b=$(md5sum < /mnt/bwlab-k41/w/probe) && [ \"$a\" = \"$b\" ] && echo same",
    );
    assert!(out.contains("same"), "written over NFSv3, read over NFSv4.1: {out}");
    v41.release().unwrap();
    v3.release().unwrap();
    // blockwire's nfs:// client on the export's image.
    let url = bw_lab::subjects::Subject::Peer(bw_lab::subjects::PeerKind::Knfsd).url(&link);
    let out = line(&first, &format!("{exe} bench {url} --rw randrw --bs 4k --iodepth 4 --runtime 1 --size 16M --json"));
    assert!(out.contains("\"ios\""), "bench {url}: {out}");
    p.stop();
    // The run's end: its state file applied once more, then removed.
    first.cleanup().unwrap();
    assert_eq!(state(&first), before, "the guest after the lab's knfsd stopped");

    // 2. The guest's own server and export: left as they were.
    line(
        &first,
        "mkdir -p /srv/theirs /var/lib/nfs && rpcbind -w && { grep -q ' /proc/fs/nfsd ' /proc/mounts || { modprobe nfsd; mount -t nfsd nfsd /proc/fs/nfsd; }; } \
         && rpc.mountd && rpc.nfsd 4 && exportfs -o ro,no_subtree_check,fsid=77 127.0.0.2:/srv/theirs",
    );
    let theirs = state(&first);
    assert!(theirs.contains("/srv/theirs 127.0.0.2") && theirs.contains("threads 4"), "{theirs}");
    let second = run("knfsd-second");
    // (The lab's directory is its master connection's to make; the first
    // run's end removed it.)
    line(&second, &format!("mkdir -p {}", bw_lab::hosts::ssh::REMOTE_DIR));
    let p = knfsd::serve(&Host::Ssh(second.clone()), &link, backing, FsKind::Ext4).unwrap_or_else(|e| panic!("knfsd beside the guest's: {e}"));
    let up = state(&second);
    assert!(up.contains("/srv/theirs 127.0.0.2") && up.contains("/srv/bwlab-knfsd 127.0.0.1") && up.contains("threads 4"), "{up}");
    p.stop();
    second.cleanup().unwrap();
    assert_eq!(state(&second), theirs, "the guest's own NFS after the lab's knfsd stopped");

    // 3. A run that never stops (killed): the next run undoes it.
    let killed = run("knfsd-killed");
    line(&killed, &format!("mkdir -p {}", bw_lab::hosts::ssh::REMOTE_DIR));
    let p = knfsd::serve(&Host::Ssh(killed.clone()), &link, backing, FsKind::Ext4).unwrap_or_else(|e| panic!("knfsd: {e}"));
    std::mem::forget(p);
    assert!(state(&killed).contains("/srv/bwlab-knfsd"));
    let next = run("knfsd-next");
    let swept = next.sweep_stale().expect("sweep");
    assert!(swept.iter().any(|f| f.state.ends_with(&killed.run_id)), "swept: {swept:?}");
    assert_eq!(state(&next), theirs, "the guest after the next run's sweep");
    eprintln!("knfsd on the VM took {:?}", t0.elapsed());
}
