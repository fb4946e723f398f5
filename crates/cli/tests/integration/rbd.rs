//! Ceph RBD behind blockwire gateways (issue 14). Each test starts its own
//! one-node cluster (`common::ceph`), about 10 s on a quiet machine.

use crate::common;

use common::blockwire_ok;
use common::ceph::Ceph;
use std::time::Duration;

/// The harness itself: an image written with `rbd import` reads back
/// identically with `rbd export`; a paused cluster makes clients time out
/// (not answer from somewhere else) and a resumed one serves the same data.
#[test]
fn one_node_cluster_stores_and_returns_rbd_data() {
    common::require_root();
    let ceph = Ceph::start();
    let src = ceph.dir().join("in.bin");
    let back = ceph.dir().join("out.bin");
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&src, &data).expect("write source");
    ceph.rbd(&["import", "--no-progress", src.to_str().expect("utf-8"), "rbd/harness"]);
    let info = ceph.rbd(&["info", "--format", "json", "rbd/harness"]);
    assert!(info.contains(&format!("\"size\":{}", data.len())), "image size: {info}");

    ceph.pause();
    let out = ceph.rbd_output(&["info", "rbd/harness"], Duration::from_secs(5));
    assert!(!out.status.success(), "rbd info answered while the cluster was paused");
    ceph.resume();

    ceph.rbd(&["export", "--no-progress", "rbd/harness", back.to_str().expect("utf-8")]);
    let got = std::fs::read(&back).expect("read export");
    assert!(got == data, "rbd export differs from what was imported ({} vs {} bytes)", got.len(), data.len());
}

/// A gateway's config: one rbd volume exported over iSCSI, NVMe/TCP and
/// (when `aoe_if` is given) AoE shelf 7 slot 1, with the ALUA/ANA group
/// `group`. Every gateway of one image uses the same IQN, NQN and serial,
/// so initiators see one disk behind several paths.
fn gateway_config(ceph: &Ceph, image: &str, iscsi: u16, nvme: u16, aoe_if: Option<&str>, group: u16) -> String {
    let aoe = aoe_if.map_or(String::new(), |ifc| {
        format!("[[aoe.export]]\ninterface = \"{ifc}\"\nvolume = \"v\"\nshelf = 7\nslot = 1\n")
    });
    format!(
        r#"
[[volume]]
name = "v"
backend = "rbd:rbd/{image},conf={conf},timeout=8"
{aoe}
[iscsi]
listen = ["127.0.0.1:{iscsi}"]
[[iscsi.target]]
iqn = "{IQN}"
luns = [{{ lun = 0, volume = "v" }}]
target_port_group = {group}
[nvme]
listen = ["127.0.0.1:{nvme}"]
discovery_listen = "127.0.0.1:{dport}"
[[nvme.subsystem]]
nqn = "{NQN}"
serial = "bwrbd0001"
namespaces = [{{ nsid = 1, volume = "v" }}]
"#,
        conf = ceph.conf().display(),
        dport = common::free_port(),
    )
}

const IQN: &str = "iqn.2026-11.org.blockwire.test:rbd";
const NQN: &str = "nqn.2026-11.org.blockwire:rbd-test";

fn qemu_img(args: &[&str]) {
    let out = std::process::Command::new("qemu-img").args(args).output().expect("spawn qemu-img");
    assert!(out.status.success(), "qemu-img {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// `verify` over iSCSI, NVMe/TCP and AoE (on a veth, initiator in a
/// namespace) against an `rbd:` volume; then data written through gateway A
/// (qemu-img over libiscsi) reads back through a second gateway B on the
/// same image, and `rbd export` (straight from the cluster) agrees.
#[test]
fn rbd_volume_serves_every_protocol_and_two_gateways_share_it() {
    common::require_root();
    let ceph = Ceph::start();
    ceph.rbd(&["create", "--size", "64M", "--image-feature", "layering", "rbd/shared"]);
    let pair = common::NetnsPair::new("rbd", 1500);
    let dir = common::TempDir::new("rbd-gw");
    let (ia, na) = (common::free_port(), common::free_port());
    let a = common::Serve::with_config(&dir, &gateway_config(&ceph, "shared", ia, na, Some(&pair.host_if), 1), &[]);

    blockwire_ok(None, &["verify", &format!("iscsi://127.0.0.1:{ia}/{IQN}/0"), "--size", "8M", "--concurrency", "16"]);
    blockwire_ok(None, &["verify", &format!("nvme+tcp://127.0.0.1:{na}/{NQN}/1"), "--size", "8M", "--offset", "8M", "--concurrency", "16", "--seed", "2"]);
    blockwire_ok(Some(&pair.ns), &["verify", &format!("aoe://{}/7.1", pair.ns_if), "--size", "4M", "--offset", "16M", "--seed", "3"]);

    let dir_b = common::TempDir::new("rbd-gwb");
    let (ib, nb) = (common::free_port(), common::free_port());
    let b = common::Serve::with_config(&dir_b, &gateway_config(&ceph, "shared", ib, nb, None, 2), &[]);
    let src = dir.path().join("src.bin");
    let back = dir.path().join("back.bin");
    let exported = dir.path().join("export.bin");
    let data: Vec<u8> = (0..64u32 << 20).map(|i| (i.wrapping_mul(2_246_822_519) >> 11) as u8).collect();
    std::fs::write(&src, &data).expect("write source");
    qemu_img(&["convert", "-n", "-f", "raw", "-O", "raw", src.to_str().expect("utf-8"), &format!("iscsi://127.0.0.1:{ia}/{IQN}/0")]);
    qemu_img(&["convert", "-f", "raw", "-O", "raw", &format!("iscsi://127.0.0.1:{ib}/{IQN}/0"), back.to_str().expect("utf-8")]);
    assert!(std::fs::read(&back).expect("read back") == data, "gateway B returned other data than was written through gateway A");
    ceph.rbd(&["export", "--no-progress", "rbd/shared", exported.to_str().expect("utf-8")]);
    assert!(std::fs::read(&exported).expect("read export") == data, "rbd export differs from what gateway A acknowledged");
    assert!(a.stop().success() && b.stop().success(), "a gateway did not stop cleanly");
}
