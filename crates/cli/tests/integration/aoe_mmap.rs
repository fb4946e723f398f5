//! AoE over PACKET_MMAP rings (`--aoe-datapath mmap`): the target (two
//! workers, so two ring sockets in a fanout group) and the initiator on
//! AF_PACKET sockets with TPACKET_V2 rings between namespaces over a veth
//! pair with jumbo frames (8740-byte replies); bad frames to the target;
//! each end against a peer on another datapath (plain AF_PACKET, vblade),
//! so neither side's ring frames are only understood by the other. Needs
//! root.

use crate::common;
use bw_initiator::aoe::AoeClient;
use bw_initiator::{BlockClient, ConnectOptions, TargetUrl};
use bw_net::Datapath;
use common::*;
use std::time::Duration;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

#[test]
fn aoe_over_packet_mmap_rings_both_ends_against_other_datapaths_and_vblade() {
    let pair = NetnsPair::new("mr", 9000);
    let export = format!("{},volume=d,shelf=1,slot=2", pair.ns_if);
    let mut serve =
        Serve::start_in(Some(&pair.ns), &["--aoe-datapath", "mmap", "--aoe-workers", "2", "--volume", "d=ram:32M", "--aoe", &export]);
    let log = serve.log_text();
    assert!(
        log.contains(&format!("aoe {}: datapath mmap (AF_PACKET with PACKET_MMAP rings", pair.ns_if)),
        "serve's log names the datapath:\n{log}"
    );
    assert!(log.contains("2 sockets"), "one ring socket per worker:\n{log}");
    let url = format!("aoe://{}/1.2", pair.host_if);
    // Ring target, ring initiator; then a plain AF_PACKET initiator.
    blockwire_ok(None, &["verify", &url, "--size", "16M", "--aoe-datapath", "mmap"]);
    blockwire_ok(None, &["verify", &url, "--size", "4M", "--aoe-datapath", "packet"]);

    // The library client on rings: 17 sectors a frame, a pattern across
    // frame boundaries read back.
    let rt = runtime();
    let opts = ConnectOptions { timeout: Duration::from_secs(5), aoe_datapath: Datapath::Mmap, ..Default::default() };
    let c = rt.block_on(AoeClient::connect(&TargetUrl::parse(&url).unwrap(), &opts)).expect("connect over rings");
    assert_eq!(c.datapath(), Datapath::Mmap);
    assert_eq!(c.frame_sectors(), 17);
    let data: Vec<u8> = (0..(1 << 20) + 4096).map(|i| (i * 13 % 251) as u8).collect();
    rt.block_on(c.write(512, &data)).expect("write");
    let mut back = vec![0u8; data.len()];
    rt.block_on(c.read(512, &mut back)).expect("read");
    assert!(back == data, "data read back over the rings differs");

    // Short and garbage frames from another station:
    // the ring target drops them and goes on serving.
    send_garbage_aoe_requests(&pair.host_if, c.target().mac, 3, 0x1234_5678);
    assert!(serve.is_running(), "the ring target survives bad frames");
    let mut again = vec![0u8; 64 << 10];
    rt.block_on(c.read(512, &mut again)).expect("read after bad frames");
    assert!(again[..] == data[..64 << 10]);
    drop(c);
    assert!(serve.stop().success());

    // The ring initiator against vblade (AF_PACKET, one frame per syscall).
    let dir = TempDir::new("aoemr");
    let img = dir.path().join("vblade.img");
    std::fs::File::create(&img).unwrap().set_len(16 << 20).unwrap();
    let _vb = Vblade::start(&pair, 4, 5, &img);
    blockwire_ok(None, &["verify", &format!("aoe://{}/4.5", pair.host_if), "--size", "8M", "--aoe-datapath", "mmap"]);
}
