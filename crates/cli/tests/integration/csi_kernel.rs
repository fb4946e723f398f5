//! `blockwire csi`'s node service with the Linux kernel's initiators, in
//! the kernel VM (Debian's 6.12 kernel, tests/kernel-vm), driven over gRPC
//! from this test as a CO's kubelet drives it. One boot.
//!
//! On the host: two `blockwire serve` gateways with one RBD pool (the
//! project's Ceph test cluster) and a directory pool on the first, and the
//! plugin's controller service. In the guest: two node services, "node A"
//! and "node B" (each its own host NQN and IQN, state directory and
//! socket; socat makes each socket a TCP port the test reaches through
//! qemu's hostfwd), nvme-cli, open-iscsi, util-linux's mount, e2fsprogs,
//! xfsprogs and fio.
//!
//! - NVMe/TCP, ext4: stage on A connects to both gateways (native
//!   multipath: one head device, two live paths in `nvme list-subsys`),
//!   makes ext4, mounts; publish bind-mounts; a file written there is
//!   read back after unstage (no subsystem, mount or record left) on B,
//!   which connects with its own host NQN.
//! - ControllerExpandVolume and NodeExpandVolume grow a mounted ext4
//!   (resize2fs) on the RBD pool (both gateways, two paths: each gateway
//!   resizes and tells its path) and xfs (xfs_growfs) on the directory
//!   pool (one path).
//! - A raw block volume: published as the device itself.
//! - QoS on it, fio in the guest at 4 KiB QD32 and 1 MiB QD8: unlimited
//!   first (it must be over twice the limit, or the check could not
//!   fail), then limited through `bdev_set_qos_limit` on both gateways and
//!   through ControllerModifyVolume: at most 10% over the limit; lifted:
//!   over twice the limit again.
//! - iSCSI (one portal: the directory pool's gateway): iscsiadm login,
//!   ext4, mount; unstage logs out and leaves no node record.
//! - iSCSI over both gateways (the RBD pool): two sessions joined by
//!   dm-multipath (`multipath -ll`: two active paths), ext4 on the
//!   /dev/mapper map; gateway A's session logged out under the mount, and
//!   the data still read and written through B; unstage flushes the map
//!   and logs out: no map, no session, no record. The guest has no udev:
//!   its script keeps udev's database entries for SCSI disks (what
//!   multipath asks udev for) and gives multipath.conf, as rbd-ha.sh does.
//!   The stage runs with that database behind (a removed disk's entry for
//!   the device number sda reuses): node A flushes the stale map multipath
//!   makes from it. Grown online (both disks rescanned, the map reloaded,
//!   resize2fs). Then node B, which has no multipath-tools, stages the
//!   same volume on one path (the first portal) and reads back A's data.

use crate::common::ceph::Ceph;
use crate::common::*;
use crate::csi::control_call;
use bw_csi::proto;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NODE_A: (&str, &str) = ("nqn.2026-11.io.blockwire.test:kvm-node-a", "iqn.2026-11.io.blockwire.test:kvm-node-a");
const NODE_B: (&str, &str) = ("nqn.2026-11.io.blockwire.test:kvm-node-b", "iqn.2026-11.io.blockwire.test:kvm-node-b");
/// QoS limits the emulated guest exceeds by far when unlimited.
const LIMIT_IOPS: f64 = 200.0;
const LIMIT_MIBS: f64 = 4.0;

/// The guest: both node services, each behind a TCP port, until /tmp/done.
const GUEST: &str = r#"
modprobe nvme-tcp; modprobe iscsi_tcp; modprobe sd_mod; modprobe xfs || true; modprobe ext4 || true
modprobe dm-multipath; modprobe dm-round-robin; modprobe scsi_dh_alua
echo "multipath: $(cat /sys/module/nvme_core/parameters/multipath)"
iscsid
# dm-multipath's configuration, as a node's admin gives it (rbd-ha.sh's)
mkdir -p /etc/multipath
cat > /etc/multipath.conf <<'CONF'
defaults {
  user_friendly_names no
  find_multipaths off
}
devices {
  device {
    vendor "BLKWIRE"
    product ".*"
    path_grouping_policy group_by_prio
    prio alua
    hardware_handler "1 alua"
    failback immediate
    no_path_retry queue
    path_checker tur
  }
}
CONF
# A stand-in for udev's database, which multipath reads (that a disk was
# seen, and its ID_SERIAL: "3" and the NAA designator, as scsi_id gives
# it). Each pass drops the entries of disks gone (udev's "remove": the next
# disk reuses the device number) and writes those of the disks there. Any
# read may fail (a disk removed mid-pass) without ending the loop: under
# sh -e one failed `$(cat ...)` once ended it, and a removed disk's entry
# stayed for good (docs/notes/2026-11-26-csi-iscsi-multipath.md). While
# /tmp/udev-hold exists it stands still, as a udev running behind does,
# until a map holds a SCSI disk; it notes that map's name in
# /tmp/udev-held-map and goes on.
mkdir -p /run/udev/data
while [ ! -e /tmp/done ]; do
  if [ -e /tmp/udev-hold ]; then
    h=$(ls /sys/block/sd*/holders 2>/dev/null | grep -m1 dm- || true)
    if [ -n "$h" ]; then cat /sys/block/$h/dm/name > /tmp/udev-held-map 2>/dev/null || true; rm -f /tmp/udev-hold; fi
    sleep 0.2; continue
  fi
  for f in /run/udev/data/b*; do
    [ -e "$f" ] || continue
    [ -e /sys/dev/block/${f#/run/udev/data/b} ] || rm -f "$f"
  done
  for b in /sys/block/sd*; do
    w=$(cat $b/device/wwid 2>/dev/null) && n=$(cat $b/dev 2>/dev/null) || continue
    w=${w#naa.}
    e=$(printf 'I:1\nE:ID_SERIAL=3%s\nE:SCSI_IDENT_LUN_NAA_REGEXT=%s' "$w" "$w")
    [ "$(cat /run/udev/data/b$n 2>/dev/null)" = "$e" ] || echo "$e" > /run/udev/data/b$n || true
  done
  sleep 0.2
done &
# Node B has no multipath-tools: its PATH has the guest's programs but
# multipath and multipathd (in /sbin; the others are links in /run/nomp).
mkdir -p /run/nomp && ln -s /sbin/* /run/nomp/ && rm -f /run/nomp/multipath /run/nomp/multipathd
mkdir -p /run/csi
for n in a b; do
  eval "nqn=\$NQN_$n iqn=\$IQN_$n"
  p=$PATH; [ $n = a ] || p=/run/nomp:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/bin
  PATH=$p $BW csi --mode node --attach kernel --endpoint unix:///run/csi/$n.sock --state-dir /run/csi/state-$n \
    --host-nqn $nqn --iqn $iqn -v > /tmp/node-$n.log 2>&1 &
done
socat TCP-LISTEN:7000,fork,reuseaddr UNIX-CONNECT:/run/csi/a.sock &
socat TCP-LISTEN:7001,fork,reuseaddr UNIX-CONNECT:/run/csi/b.sock &
while [ ! -e /tmp/done ]; do sleep 1; done
echo "node A's log:"; cat /tmp/node-a.log
echo "node B's log:"; cat /tmp/node-b.log
"#;

struct Gateway {
    _serve: Serve,
    http: String,
    nvme: u16,
    iscsi: u16,
}

/// Commands in the guest over ssh.
struct Guest {
    port: u16,
    key: PathBuf,
}

impl Guest {
    fn run(&self, cmd: &str) -> Result<String, String> {
        let out = Command::new("ssh")
            .args(["-p", &self.port.to_string(), "-i", self.key.to_str().unwrap()])
            .args(["-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"])
            .args(["root@127.0.0.1", cmd])
            .stdin(Stdio::null())
            .output()
            .expect("ssh");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!("{cmd}: {}: {text}{}", out.status, String::from_utf8_lossy(&out.stderr)))
        }
    }

    fn ok(&self, cmd: &str) -> String {
        self.run(cmd).unwrap_or_else(|e| panic!("in the guest: {e}"))
    }

    /// fio against `dev` for 4 s: (IOPS, MiB/s) of its reads.
    fn fio(&self, dev: &str, bs: &str, rw: &str, qd: u32) -> (f64, f64) {
        let out = self.ok(&format!("fio --name=q --filename={dev} --direct=1 --ioengine=libaio --rw={rw} --bs={bs} --iodepth={qd} --runtime=4 --time_based --output-format=json 2>/dev/null"));
        let json = &out[out.find('{').unwrap_or_else(|| panic!("fio said: {out}"))..];
        let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("fio's JSON: {e}: {out}"));
        let r = &v["jobs"][0]["read"];
        (r["iops"].as_f64().expect("iops"), r["bw_bytes"].as_f64().expect("bw_bytes") / 1048576.0)
    }

    /// `nvme list-subsys` and the mounts under /run/kubelet, printed.
    fn show(&self, when: &str) -> (String, String) {
        let subsys = self.ok("nvme list-subsys 2>&1 || true");
        let mounts = self.ok("grep /run/kubelet /proc/mounts || true");
        eprintln!("---- {when}: nvme list-subsys ----\n{subsys}---- mounts ----\n{mounts}----");
        (subsys, mounts)
    }

    /// Nothing of volume `id` (NVMe subsystem `nqn`) left on the node.
    fn assert_clean(&self, id: &str, nqn: &str) {
        let (subsys, mounts) = self.show(&format!("{id} unstaged"));
        assert!(!subsys.contains(nqn), "{nqn} still connected:\n{subsys}");
        assert!(mounts.is_empty(), "mounts left: {mounts}");
        let left = self.ok("ls /run/csi/state-a /run/csi/state-b; iscsiadm -m session 2>&1 || true; ls /etc/iscsi/nodes");
        assert!(!left.contains(id) && !left.contains("tcp:"), "left on the node: {left}");
    }
}

fn mount_cap(fs: &str) -> proto::VolumeCapability {
    use proto::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
    proto::VolumeCapability { access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }), access_type: Some(AccessType::Mount(MountVolume { fs_type: fs.into(), ..Default::default() })) }
}

fn block_cap() -> proto::VolumeCapability {
    use proto::volume_capability::{access_mode::Mode, AccessMode, AccessType};
    proto::VolumeCapability { access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }), access_type: Some(AccessType::Block(Default::default())) }
}

type Ctl = proto::controller_client::ControllerClient<tonic::transport::Channel>;
type NodeC = proto::node_client::NodeClient<tonic::transport::Channel>;

fn staging(id: &str) -> String {
    format!("/run/kubelet/plugins/kubernetes.io/csi/csi.blockwire.io/{id}/globalmount")
}

fn target(id: &str, pod: &str) -> String {
    format!("/run/kubelet/pods/{pod}/volumes/kubernetes.io~csi/{id}/mount")
}

async fn create(c: &mut Ctl, name: &str, mib: i64, params: &[(&str, &str)], cap: &proto::VolumeCapability) -> proto::Volume {
    c.create_volume(proto::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(proto::CapacityRange { required_bytes: mib << 20, limit_bytes: 0 }),
        volume_capabilities: vec![cap.clone()],
        parameters: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("CreateVolume {name}: {e}"))
    .into_inner()
    .volume
    .expect("volume")
}

/// ControllerPublish to `node`, NodeStage and NodePublish there: the publish context.
async fn attach(c: &mut Ctl, n: &mut NodeC, v: &proto::Volume, node: &str, cap: &proto::VolumeCapability, pod: &str) -> HashMap<String, String> {
    let id = &v.volume_id;
    let ctx = c
        .controller_publish_volume(proto::ControllerPublishVolumeRequest { volume_id: id.clone(), node_id: node.into(), volume_capability: Some(cap.clone()), volume_context: v.volume_context.clone(), ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("ControllerPublishVolume {id}: {e}"))
        .into_inner()
        .publish_context;
    n.node_stage_volume(proto::NodeStageVolumeRequest { volume_id: id.clone(), publish_context: ctx.clone(), staging_target_path: staging(id), volume_capability: Some(cap.clone()), volume_context: v.volume_context.clone(), ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("NodeStageVolume {id}: {e}"));
    n.node_publish_volume(proto::NodePublishVolumeRequest { volume_id: id.clone(), publish_context: ctx.clone(), staging_target_path: staging(id), target_path: target(id, pod), volume_capability: Some(cap.clone()), volume_context: v.volume_context.clone(), ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("NodePublishVolume {id}: {e}"));
    ctx
}

/// NodeUnpublish, NodeUnstage, ControllerUnpublish.
async fn detach(c: &mut Ctl, n: &mut NodeC, id: &str, node: &str, pod: &str) {
    n.node_unpublish_volume(proto::NodeUnpublishVolumeRequest { volume_id: id.into(), target_path: target(id, pod) }).await.unwrap_or_else(|e| panic!("NodeUnpublishVolume {id}: {e}"));
    n.node_unstage_volume(proto::NodeUnstageVolumeRequest { volume_id: id.into(), staging_target_path: staging(id) }).await.unwrap_or_else(|e| panic!("NodeUnstageVolume {id}: {e}"));
    c.controller_unpublish_volume(proto::ControllerUnpublishVolumeRequest { volume_id: id.into(), node_id: node.into(), ..Default::default() }).await.unwrap_or_else(|e| panic!("ControllerUnpublishVolume {id}: {e}"));
}

/// `df` of a mount point in the guest: its size in KiB.
fn df_kib(g: &Guest, path: &str) -> u64 {
    // -P: one line per file system (a long /dev/mapper name would wrap it).
    let out = g.ok(&format!("df -kP {path} | tail -1"));
    out.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("df: {out}"))
}

/// ControllerExpandVolume to `mib`, NodeExpandVolume at the target path;
/// the file system's size before and after (KiB).
async fn expand(c: &mut Ctl, n: &mut NodeC, g: &Guest, id: &str, pod: &str, mib: i64, cap: &proto::VolumeCapability) -> (u64, u64) {
    let before = df_kib(g, &target(id, pod));
    let range = proto::CapacityRange { required_bytes: mib << 20, limit_bytes: 0 };
    let r = c.controller_expand_volume(proto::ControllerExpandVolumeRequest { volume_id: id.into(), capacity_range: Some(range), volume_capability: Some(cap.clone()), ..Default::default() }).await.unwrap_or_else(|e| panic!("ControllerExpandVolume {id}: {e}")).into_inner();
    assert!(r.node_expansion_required, "a file-system volume needs the node's part");
    n.node_expand_volume(proto::NodeExpandVolumeRequest { volume_id: id.into(), volume_path: target(id, pod), capacity_range: Some(range), staging_target_path: staging(id), volume_capability: Some(cap.clone()), ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("NodeExpandVolume {id}: {e}"));
    (before, df_kib(g, &target(id, pod)))
}

/// The three limits checks of one workload; the rates measured.
struct QosRow {
    unlimited: f64,
    by_rpc: f64,
    by_modify: f64,
    lifted: f64,
}

#[test]
fn kernel_node_stages_over_nvme_multipath_and_iscsi_and_qos_holds_under_fio() {
    require_root();
    let t0 = Instant::now();
    let ceph = Ceph::shared();
    let kvm = kernel_612_image();
    let dir = TempDir::new("csikvm");
    let d = dir.path();
    let creds = d.join("creds");
    std::fs::write(&creds, "csi:kvm-secret\n").unwrap();
    std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let conf = ceph.conf().display().to_string();
    let gateways: Vec<Gateway> = (0..2u16)
        .map(|i| {
            let gd = TempDir::new_in(d, &format!("gw{i}"));
            let (nvme, iscsi, http) = (free_port(), free_port(), format!("127.0.0.1:{}", free_port()));
            let lo = 1 + i * 1000;
            let local = if i == 0 {
                std::fs::create_dir_all(d.join("pool")).unwrap();
                format!("[[pool]]\nname = \"d\"\npath = \"{}\"\ncopy = true\n", d.join("pool").display())
            } else {
                String::new()
            };
            let toml = format!("[[pool]]\nname = \"r\"\nrbd = \"rbd\"\nconf = \"{conf}\"\n{local}\n[nvme]\nlisten = [\"127.0.0.1:{nvme}\"]\ncntlid_range = [{lo}, {}]\n[iscsi]\nlisten = [\"127.0.0.1:{iscsi}\"]\n", lo + 998);
            let serve = Serve::with_config(&gd, &toml, &["--control", "none", "--rpc-http", &http, "--rpc-http-credentials", creds.to_str().unwrap()]);
            std::mem::forget(gd); // under d, removed with it
            Gateway { _serve: serve, http, nvme, iscsi }
        })
        .collect();
    // What the guest connects to: the host's loopback is 10.0.2.2 there.
    let gw_json: Vec<serde_json::Value> = gateways.iter().map(|g| serde_json::json!({"url": format!("http://{}", g.http), "nvme_tcp": [format!("10.0.2.2:{}", g.nvme)], "iscsi": [format!("10.0.2.2:{}", g.iscsi)]})).collect();
    std::fs::write(d.join("gateways.json"), serde_json::to_string(&gw_json).unwrap()).unwrap();
    let socket = d.join("controller.sock");
    let mut controller: Child = Command::new(blockwire_bin())
        .args(["csi", "--mode", "controller", "--endpoint", socket.to_str().unwrap(), "--gateways", d.join("gateways.json").to_str().unwrap(), "--credentials", creds.to_str().unwrap(), "-v"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.join("controller.log")).unwrap())
        .spawn()
        .expect("spawn blockwire csi");
    struct KillOnDrop(u32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            // SAFETY: signalling our own child by PID.
            unsafe { libc::kill(self.0 as i32, libc::SIGTERM) };
        }
    }
    let _controller_guard = KillOnDrop(controller.id());

    // The guest.
    sh(&format!("ssh-keygen -q -t ed25519 -N '' -C bwcsi -f {}", d.join("key").display()));
    let script = d.join("guest.sh");
    let bw = blockwire_bin().display().to_string();
    std::fs::write(&script, format!("BW={bw} NQN_a={} IQN_a={} NQN_b={} IQN_b={}\n{GUEST}", NODE_A.0, NODE_A.1, NODE_B.0, NODE_B.1)).unwrap();
    let mut with: Vec<String> = vec![bw.clone(), "/lib/x86_64-linux-gnu/libgcc_s.so.1".into()];
    for t in ["/usr/bin/socat", "/usr/bin/fio", "/usr/sbin/resize2fs", "/usr/sbin/xfs_growfs", "/usr/sbin/blkid", "/usr/bin/mount", "/usr/bin/umount"] {
        assert!(Path::new(t).exists(), "{t} missing on the host (make deps)");
        with.push(t.into());
    }
    let args: Vec<&str> = with.iter().flat_map(|w| ["--with", w.as_str()]).collect();
    let (ps, pa, pb) = (free_port(), free_port(), free_port());
    let fwd = format!("tcp:127.0.0.1:{ps}-:22,tcp:127.0.0.1:{pa}-:7000,tcp:127.0.0.1:{pb}-:7001");
    let key = d.join("key.pub").display().to_string();
    let mut vm = BackgroundVm::start_with(Some(&kvm), &script, &fwd, &args, &[("KVM_SSH_KEY", &key), ("KVM_MEM", "1536")]);
    let g = Guest { port: ps, key: d.join("key") };
    vm.wait_until(Duration::from_secs(600), || g.run("[ -S /run/csi/a.sock ] && [ -S /run/csi/b.sock ]").is_ok()).unwrap_or_else(|c| panic!("the guest did not come up: {c}"));
    let booted = t0.elapsed();
    eprintln!("csi_kernel: guest up after {booted:?}");

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let rows = rt.block_on(async {
        let mut c = proto::controller_client::ControllerClient::new(bw_csi::client::connect_unix(socket.clone()).await.expect("controller socket"));
        let node = |p: u16| async move { proto::node_client::NodeClient::new(tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{p}")).unwrap().connect().await.expect("node endpoint")) };
        let (mut na, mut nb) = (node(pa).await, node(pb).await);
        let id_a = na.node_get_info(proto::NodeGetInfoRequest {}).await.unwrap().into_inner().node_id;
        let id_b = nb.node_get_info(proto::NodeGetInfoRequest {}).await.unwrap().into_inner().node_id;
        assert_eq!(id_a, format!("{} {}", NODE_A.0, NODE_A.1));
        let caps = na.node_get_capabilities(proto::NodeGetCapabilitiesRequest {}).await.unwrap().into_inner();
        {
            use proto::node_service_capability::{rpc::Type as T, Type};
            let expand = caps.capabilities.iter().any(|c| matches!(&c.r#type, Some(Type::Rpc(r)) if r.r#type == T::ExpandVolume as i32));
            assert!(expand, "the kernel node advertises no EXPAND_VOLUME: {caps:?}");
        }

        // ---- NVMe/TCP, ext4, over both gateways; then on node B ----
        let ext4 = mount_cap("ext4");
        let v = create(&mut c, "pvc-kvm-ext4", 64, &[("pool", "r"), ("protocol", "nvme-tcp")], &ext4).await;
        let id = v.volume_id.clone();
        let ctx = attach(&mut c, &mut na, &v, &id_a, &ext4, "pod-a").await;
        let nqn = ctx["nqn"].clone();
        let (subsys, mounts) = g.show("ext4 volume staged and published on node A");
        assert!(subsys.contains(&format!("NQN={nqn}")), "no subsystem {nqn}:\n{subsys}");
        for gw in &gateways {
            assert!(subsys.lines().any(|l| l.contains(&format!("trsvcid={}", gw.nvme)) && l.contains("live")), "no live path to the gateway on port {}:\n{subsys}", gw.nvme);
        }
        let dev = mounts.lines().find(|l| l.contains(&staging(&id))).and_then(|l| l.split(' ').next()).unwrap_or_else(|| panic!("nothing mounted at the staging path: {mounts}")).to_string();
        assert!(dev.starts_with("/dev/nvme") && !dev.contains('c'), "staged on {dev}, not a multipath head");
        assert!(mounts.lines().any(|l| l.contains(&staging(&id)) && l.contains(" ext4 ")), "{mounts}");
        assert!(mounts.lines().any(|l| l.contains(&target(&id, "pod-a"))), "not published: {mounts}");
        let sum = g.ok(&format!("cd {t} && echo from-node-a > hello && dd if=/dev/urandom of=blob bs=1M count=8 2>/dev/null && sync && sha256sum blob", t = target(&id, "pod-a")));
        let stats = na.node_get_volume_stats(proto::NodeGetVolumeStatsRequest { volume_id: id.clone(), volume_path: target(&id, "pod-a"), staging_target_path: staging(&id) }).await.unwrap().into_inner();
        assert!(stats.usage.first().is_some_and(|u| u.total > 50 << 20 && u.used >= 8 << 20), "{stats:?}");
        detach(&mut c, &mut na, &id, &id_a, "pod-a").await;
        g.assert_clean(&id, &nqn);

        attach(&mut c, &mut nb, &v, &id_b, &ext4, "pod-b").await;
        let (subsys, _) = g.show("staged on node B");
        assert!(subsys.contains(&format!("NQN={nqn}")), "{subsys}");
        assert!(g.ok("cat /sys/class/nvme/nvme*/hostnqn").lines().all(|l| l == NODE_B.0), "node B connected with another host NQN");
        let back = g.ok(&format!("cd {t} && cat hello && sha256sum blob", t = target(&id, "pod-b")));
        assert_eq!(back, format!("from-node-a\n{sum}"), "what node A wrote, read on node B");
        detach(&mut c, &mut nb, &id, &id_b, "pod-b").await;
        g.assert_clean(&id, &nqn);
        c.delete_volume(proto::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.unwrap();

        // ---- growing ext4 (RBD: both gateways, two paths) and xfs
        // (directory pool, one path; mkfs.xfs wants 300 MiB or more) ----
        let v = create(&mut c, "pvc-kvm-grow", 64, &[("pool", "r"), ("protocol", "nvme-tcp")], &ext4).await;
        let id = v.volume_id.clone();
        let ctx = attach(&mut c, &mut na, &v, &id_a, &ext4, "pod-a").await;
        let (before, after) = expand(&mut c, &mut na, &g, &id, "pod-a", 160, &ext4).await;
        eprintln!("csi_kernel: ext4 grown from {before} to {after} KiB");
        assert!(after >= before + (96 << 10) * 9 / 10, "ext4 {before} -> {after} KiB after growing 64 -> 160 MiB");
        detach(&mut c, &mut na, &id, &id_a, "pod-a").await;
        g.assert_clean(&id, &ctx["nqn"]);
        c.delete_volume(proto::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.unwrap();
        let xfs = mount_cap("xfs");
        let v = create(&mut c, "pvc-kvm-xfs", 320, &[("pool", "d"), ("fs", "xfs")], &xfs).await;
        let id = v.volume_id.clone();
        let ctx = attach(&mut c, &mut na, &v, &id_a, &xfs, "pod-a").await;
        let (_, mounts) = g.show("xfs volume staged");
        assert!(mounts.lines().any(|l| l.contains(&staging(&id)) && l.contains(" xfs ")), "{mounts}");
        g.ok(&format!("echo xfs > {}/x && sync", target(&id, "pod-a")));
        let (before, after) = expand(&mut c, &mut na, &g, &id, "pod-a", 640, &xfs).await;
        eprintln!("csi_kernel: xfs grown from {before} to {after} KiB");
        assert!(after >= before + (320 << 10) * 9 / 10, "xfs {before} -> {after} KiB after growing 320 -> 640 MiB");
        detach(&mut c, &mut na, &id, &id_a, "pod-a").await;
        g.assert_clean(&id, &ctx["nqn"]);
        c.delete_volume(proto::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.unwrap();

        // ---- a raw block volume, and QoS on it under fio ----
        let block = block_cap();
        let v = create(&mut c, "pvc-kvm-block", 256, &[("pool", "r")], &block).await;
        let id = v.volume_id.clone();
        let ctx = attach(&mut c, &mut na, &v, &id_a, &block, "pod-a").await;
        let t = target(&id, "pod-a");
        g.ok(&format!("[ -b {t} ] && dd if=/dev/urandom of=/tmp/p bs=64k count=4 2>/dev/null && dd if=/tmp/p of={t} bs=64k seek=10 oflag=direct 2>/dev/null && dd if={t} of=/tmp/q bs=64k skip=10 count=4 iflag=direct 2>/dev/null && cmp /tmp/p /tmp/q"));
        let limit = |field: &str, value: f64| {
            for gw in &gateways {
                control_call(&gw.http, &creds, "bdev_set_qos_limit", &format!(r#"{{"name":"{id}","{field}":{value}}}"#));
            }
        };
        let mut rows = vec![];
        for (field, value, bs, rw, qd) in [("rw_ios_per_sec", LIMIT_IOPS, "4k", "randread", 32), ("rw_mbytes_per_sec", LIMIT_MIBS, "1M", "read", 8)] {
            let measure = || {
                let (iops, mibs) = g.fio(&t, bs, rw, qd);
                if bs == "4k" {
                    iops
                } else {
                    mibs
                }
            };
            let unlimited = measure();
            // The limit sits at a quarter of what this guest reaches
            // unlimited when that is under the fixed one: the guest's CPU
            // is emulated, and on a busy host its own speed falls near
            // the fixed limit (make test, 2026-11-27: 490 IOPS unlimited,
            // 369 after lifting, against 200), where "limited" and
            // "lifted" could not be told apart.
            let value = value.min((unlimited / 4.0).floor());
            assert!(value >= 1.0, "{bs} unlimited: {unlimited:.1}: too slow a guest to see a limit");
            limit(field, value);
            let by_rpc = measure();
            limit(field, 0.0);
            c.controller_modify_volume(proto::ControllerModifyVolumeRequest { volume_id: id.clone(), mutable_parameters: [(field.to_string(), value.to_string())].into(), ..Default::default() }).await.unwrap();
            let by_modify = measure();
            c.controller_modify_volume(proto::ControllerModifyVolumeRequest { volume_id: id.clone(), mutable_parameters: [(field.to_string(), "0".to_string())].into(), ..Default::default() }).await.unwrap();
            // Under a limit the figure can only be low, so the checks of a
            // limit hold on any host; "lifted" is a lower bound, which a busy
            // host's emulated guest can miss for a while (make test,
            // 2026-11-27: 1212 IOPS unlimited, 361 after lifting a limit of
            // 200). A limit still in force never gives more than 1.1x, so
            // measuring again until the guest shows it is free proves the
            // same thing without racing the host's load.
            let mut lifted = measure();
            for _ in 0..3 {
                if lifted > 2.0 * value {
                    break;
                }
                eprintln!("csi_kernel: QoS {bs} lifted: {lifted:.1}, not yet 2x the limit {value}: measuring again");
                lifted = lifted.max(measure());
            }
            eprintln!("csi_kernel: QoS {bs} {rw} QD{qd}, {field} {value}: unlimited {unlimited:.1}, bdev_set_qos_limit {by_rpc:.1}, ControllerModifyVolume {by_modify:.1}, lifted {lifted:.1}");
            assert!(by_rpc <= 1.1 * value && by_rpc > 0.0, "{bs}: {by_rpc:.1} under a limit of {value} (bdev_set_qos_limit)");
            assert!(by_modify <= 1.1 * value && by_modify > 0.0, "{bs}: {by_modify:.1} under a limit of {value} (ControllerModifyVolume)");
            assert!(lifted > 2.0 * value, "{bs}: {lifted:.1} after the limit {value} was lifted");
            rows.push((bs, QosRow { unlimited, by_rpc, by_modify, lifted }));
        }
        detach(&mut c, &mut na, &id, &id_a, "pod-a").await;
        g.assert_clean(&id, &ctx["nqn"]);
        c.delete_volume(proto::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.unwrap();

        // ---- iSCSI: one portal (the directory pool is on gateway A only) ----
        let v = create(&mut c, "pvc-kvm-iscsi", 64, &[("pool", "d"), ("protocol", "iscsi")], &ext4).await;
        let id = v.volume_id.clone();
        let ctx = attach(&mut c, &mut na, &v, &id_a, &ext4, "pod-a").await;
        let sessions = g.ok("iscsiadm -m session");
        eprintln!("---- iSCSI volume staged: iscsiadm -m session ----\n{sessions}");
        assert!(sessions.contains(&ctx["iqn"]), "{sessions}");
        let (_, mounts) = g.show("iSCSI volume staged");
        assert!(mounts.lines().any(|l| l.starts_with("/dev/sd") && l.contains(&staging(&id)) && l.contains(" ext4 ")), "{mounts}");
        g.ok(&format!("echo iscsi > {}/i && sync", target(&id, "pod-a")));
        detach(&mut c, &mut na, &id, &id_a, "pod-a").await;
        g.assert_clean(&id, &ctx["iqn"]);
        c.delete_volume(proto::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.unwrap();

        // ---- iSCSI over both gateways (RBD pool): dm-multipath ----
        // udev's database behind (the stand-in held), still holding a
        // removed disk's entry for 8:0, the device number sda reuses (with
        // a SCSI_IDENT_ property: multipath's built-in blacklist exception
        // skips disks without one):
        // multipath's first map over sda is of that disk's WWID; the node
        // must flush it and join both disks in the LUN's own.
        let stale = format!("36{}dead", "0".repeat(27));
        let sds = g.ok("ls /sys/block | grep sd || true");
        assert!(sds.is_empty(), "SCSI disks before the multipath volume: {sds}");
        g.ok(&format!("touch /tmp/udev-hold && printf 'I:1\\nE:ID_SERIAL=%s\\nE:SCSI_IDENT_LUN_NAA_REGEXT=%s\\n' {stale} {} > /run/udev/data/b8:0", &stale[1..]));
        let v = create(&mut c, "pvc-kvm-mpath", 64, &[("pool", "r"), ("protocol", "iscsi")], &ext4).await;
        let id = v.volume_id.clone();
        let ctx = attach(&mut c, &mut na, &v, &id_a, &ext4, "pod-a").await;
        let iqn = ctx["iqn"].clone();
        let held = g.ok("cat /tmp/udev-held-map; ls /tmp/udev-hold 2>&1 || true");
        assert!(held.starts_with(&stale) && held.contains("No such file"), "the stale udev entry made no map of its WWID (or the stand-in still holds): {held}");
        let flushed = g.ok("grep -c 'made from stale udev data' /tmp/node-a.log || true");
        assert!(flushed.trim().parse::<u32>().unwrap_or(0) >= 1, "node A's log says nothing of flushing the stale map {stale}");
        let sessions = g.ok("iscsiadm -m session");
        let paths = g.ok("multipath -ll 2>/dev/null");
        eprintln!("---- iSCSI over two gateways staged: iscsiadm -m session ----\n{sessions}---- multipath -ll ----\n{paths}----");
        for gw in &gateways {
            assert!(sessions.lines().any(|l| l.contains(&iqn) && l.contains(&format!("10.0.2.2:{},", gw.iscsi))), "no session to the gateway on port {}:\n{sessions}", gw.iscsi);
        }
        assert_eq!(paths.matches("active ready running").count(), 2, "multipath -ll shows not two active paths:\n{paths}");
        let (_, mounts) = g.show("iSCSI multipath volume staged");
        let dev = mounts.lines().find(|l| l.contains(&staging(&id))).and_then(|l| l.split(' ').next()).unwrap_or_else(|| panic!("nothing mounted at the staging path: {mounts}")).to_string();
        assert!(dev.starts_with("/dev/mapper/") && mounts.contains(" ext4 "), "staged on {dev}, not the dm-multipath map: {mounts}");
        assert!(!dev.contains(&stale), "staged on the stale map: {dev}");
        let t = target(&id, "pod-a");
        let sum = g.ok(&format!("cd {t} && dd if=/dev/urandom of=blob bs=1M count=8 2>/dev/null && sync && sha256sum blob"));
        // Grown over both paths: each disk rescanned, then the map reloaded.
        let (before, after) = expand(&mut c, &mut na, &g, &id, "pod-a", 128, &ext4).await;
        let paths = g.ok("multipath -ll 2>/dev/null");
        eprintln!("csi_kernel: ext4 on the dm-multipath map grown from {before} to {after} KiB\n{paths}");
        assert!(after >= before + (64 << 10) * 9 / 10, "ext4 on the map {before} -> {after} KiB after growing 64 -> 128 MiB");
        assert!(paths.contains("size=128M") && paths.matches("active ready running").count() == 2, "the map after growing:\n{paths}");
        // Gateway A's path goes (its session logged out under the mount):
        // the file system goes on through B's.
        let port_a = gateways[0].iscsi;
        g.ok(&format!("for c in /sys/class/iscsi_connection/connection*; do [ $(cat $c/persistent_port) = {port_a} ] || continue; n=${{c##*/connection}}; iscsiadm -m session -r ${{n%%:*}} -u; done"));
        let sessions = g.ok("iscsiadm -m session");
        assert!(!sessions.contains(&format!("10.0.2.2:{port_a},")), "gateway A's session still there:\n{sessions}");
        let back = g.ok(&format!("cd {t} && echo after-a > after && sync && echo 3 > /proc/sys/vm/drop_caches && sha256sum blob && cat after"));
        let paths = g.ok("multipath -ll 2>/dev/null");
        eprintln!("---- gateway A's session logged out: multipath -ll ----\n{paths}----");
        assert_eq!(paths.matches("active ready running").count(), 1, "multipath -ll after A's path went:\n{paths}");
        assert_eq!(back, format!("{sum}after-a\n"), "read and written through gateway B after A's path went");
        detach(&mut c, &mut na, &id, &id_a, "pod-a").await;
        g.assert_clean(&id, &iqn);
        let maps = "multipath -ll 2>/dev/null; ls /sys/block | grep dm- ; ls /dev/mapper 2>/dev/null | grep -v control; true";
        let left = g.ok(maps);
        assert!(left.trim().is_empty(), "dm-multipath map left after unstage: {left}");

        // ---- the same volume on node B, which has no multipath: one path ----
        let ctx = attach(&mut c, &mut nb, &v, &id_b, &ext4, "pod-b").await;
        let first = ctx["addresses"].split(',').next().expect("an address").to_string();
        let sessions = g.ok("iscsiadm -m session");
        eprintln!("---- on node B, without multipath: iscsiadm -m session ----\n{sessions}----");
        let ours: Vec<&str> = sessions.lines().filter(|l| l.contains(&iqn)).collect();
        assert!(ours.len() == 1 && ours[0].contains(&format!("{first},")), "not one session, to the first portal {first}:\n{sessions}");
        let (_, mounts) = g.show("iSCSI multipath volume staged on node B (one path)");
        assert!(mounts.lines().any(|l| l.starts_with("/dev/sd") && l.contains(&staging(&id)) && l.contains(" ext4 ")), "not staged on the one SCSI disk: {mounts}");
        let back = g.ok(&format!("cd {} && sha256sum blob && cat after", target(&id, "pod-b")));
        assert_eq!(back, format!("{sum}after-a\n"), "what node A wrote, read on node B over one path");
        let warned = g.ok("grep 'staged on ONE path only' /tmp/node-b.log || true");
        assert!(warned.contains(&id) && warned.contains("no `multipath`"), "node B's log does not say it staged on one path: {warned:?}");
        detach(&mut c, &mut nb, &id, &id_b, "pod-b").await;
        g.assert_clean(&id, &iqn);
        let left = g.ok(maps);
        assert!(left.trim().is_empty(), "a map on node B: {left}");
        c.delete_volume(proto::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.unwrap();
        rows
    });
    for gw in &gateways {
        let st = control_call(&gw.http, &creds, "status", "null");
        assert_eq!(st["nvme_subsystems"].as_array().map(|a| a.len()), Some(0), "subsystems left: {st}");
        let vols = control_call(&gw.http, &creds, "volume_list", "null");
        assert_eq!(vols.as_array().map(|a| a.len()), Some(0), "volumes left: {vols}");
    }
    g.ok("touch /tmp/done");
    let (st, console) = vm.finish();
    assert!(st.success(), "the guest failed:\n{console}");
    for (bs, r) in &rows {
        println!("csi_kernel QoS {bs}: unlimited {:.1}, bdev_set_qos_limit {:.1}, ControllerModifyVolume {:.1}, lifted {:.1}", r.unlimited, r.by_rpc, r.by_modify, r.lifted);
    }
    println!("csi_kernel: {:?} in all, {booted:?} of it until the guest was up", t0.elapsed());
    let _ = controller.kill();
    let _ = controller.wait();
}
