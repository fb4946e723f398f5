//! Ceph RBD behind blockwire gateways (issue 14). Each test starts its own
//! one-node cluster (`common::ceph`), about 10 s on a quiet machine.

mod common;

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
