//! AoE over AF_XDP (`--aoe-datapath`): the target and the initiator on
//! AF_XDP sockets between namespaces over a veth pair, with jumbo frames
//! (one frame in several UMEM chunks), short and garbage frames to the XDP
//! target; and the AF_PACKET fallback, forced (`packet`) and by `auto` when
//! the interface's XDP hook is already taken. Needs root.
//!
//! The other AoE tests (aoe_net, attach's mount_ext4_over_aoe, the kernel
//! VM's aoe driver) run over the default, `auto`, and so over AF_XDP too.

use crate::common;
use bw_initiator::aoe::AoeClient;
use bw_initiator::{BlockClient, ConnectOptions, TargetUrl};
use bw_net::{Datapath, XdpFilter};
use common::*;
use std::time::Duration;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

fn client(rt: &tokio::runtime::Runtime, url: &str, datapath: Datapath) -> AoeClient {
    let url = TargetUrl::parse(url).expect("url");
    let opts = ConnectOptions { timeout: Duration::from_secs(5), aoe_datapath: datapath, ..Default::default() };
    rt.block_on(AoeClient::connect(&url, &opts)).expect("connect")
}

/// Write a pattern across frame boundaries and read it back.
fn round_trip(rt: &tokio::runtime::Runtime, c: &AoeClient, offset: u64, len: usize) {
    let data: Vec<u8> = (0..len).map(|i| (i * 13 % 251) as u8).collect();
    rt.block_on(c.write(offset, &data)).expect("write");
    let mut back = vec![0u8; len];
    rt.block_on(c.read(offset, &mut back)).expect("read");
    assert!(back == data, "data read back differs");
}

/// Both ends on AF_XDP at MTU 9000 (17 sectors a frame: 8740-byte replies
/// span three UMEM chunks): verify, I/O from the library client, and a
/// target that takes short and garbage frames without stopping.
#[test]
fn aoe_over_xdp_both_ends_jumbo_frames_and_bad_frames() {
    let pair = NetnsPair::new("xj", 9000);
    let export = format!("{},volume=d,shelf=1,slot=2", pair.ns_if);
    let mut serve = Serve::start_in(Some(&pair.ns), &["--aoe-datapath", "xdp", "--volume", "d=ram:32M", "--aoe", &export]);
    let log = serve.log_text();
    assert!(log.contains(&format!("aoe {}: datapath xdp (AF_XDP", pair.ns_if)), "serve's log names the datapath:\n{log}");
    let url = format!("aoe://{}/1.2", pair.host_if);
    blockwire_ok(None, &["verify", &url, "--size", "16M", "--aoe-datapath", "xdp"]);

    let rt = runtime();
    let c = client(&rt, &url, Datapath::Xdp);
    assert_eq!(c.datapath(), Datapath::Xdp);
    assert_eq!(c.frame_sectors(), 17);
    round_trip(&rt, &c, 512, 1 << 20);

    // Short and garbage AoE frames from another station reach the XDP target.
    send_garbage_aoe_requests(&pair.host_if, c.target().mac, 2, 0x8765_4321);
    assert!(serve.is_running(), "the target survives bad frames");
    round_trip(&rt, &c, 3 << 20, 64 << 10);
    assert!(c.frames_in_over_xdp() > 0, "replies came through the AF_XDP socket");
    drop(c);
    // serve's last words count the requests that came through AF_XDP.
    let lines = serve.log_lines();
    assert!(serve.stop().success());
    let counted = |l: &String| l.contains(&format!("aoe {}: ", pair.ns_if)) && l.contains(" through AF_XDP)");
    let line = (0..500)
        .find_map(|_| {
            let found = lines.lock().unwrap().iter().find(|l| counted(l)).cloned();
            if found.is_none() {
                std::thread::sleep(Duration::from_millis(20));
            }
            found
        })
        .expect("serve's frame counts");
    let xdp: u64 = line.split(" frames (").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok()).expect("a count");
    assert!(xdp > 0, "{line}");
}

/// `packet` forces AF_PACKET; `auto` falls back to it, saying why, when
/// AF_XDP cannot be set up: the interface's queue and XDP hook held by
/// AF_XDP sockets of this test, or only the hook, taken by a program `ip`
/// attached; `xdp` then fails. The fallen-back ends still talk to AF_XDP
/// ones, and a client opened once the interface is free again gets AF_XDP.
#[test]
fn aoe_falls_back_to_af_packet_when_xdp_is_taken_or_refused() {
    let pair = NetnsPair::new("xf", 1500);
    // Take host_if for another EtherType: AoE frames pass its program.
    let hook = bw_net::xdp::open(&pair.host_if, 0x88B5, XdpFilter::default()).expect("AF_XDP on a veth");

    // A target on host_if: auto falls back, xdp refuses to start.
    let host_export = format!("{},volume=h,shelf=2,slot=1", pair.host_if);
    // (`timeout`: were it to start after all, the test fails instead of hanging.)
    let refused = std::process::Command::new("timeout")
        .arg("20")
        .arg(blockwire_bin())
        .args(["serve", "--control", "none", "--aoe-datapath", "xdp", "--volume", "h=ram:8M", "--aoe", &host_export])
        .output()
        .expect("spawn blockwire serve");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("AF_XDP"), "xdp with the hook taken: {err}");
    let host_serve = Serve::start(&["--aoe-datapath", "auto", "--volume", "h=ram:8M", "--aoe", &host_export]);
    let log = host_serve.log_text();
    assert!(log.contains("AF_XDP not used, AF_PACKET instead") && log.contains("datapath packet"), "{log}");
    // ... served to an AF_XDP initiator in the namespace.
    blockwire_ok(Some(&pair.ns), &["verify", &format!("aoe://{}/2.1", pair.ns_if), "--size", "4M", "--aoe-datapath", "xdp"]);

    // On another (fresh) pair, the namespace's hook taken by a program
    // attached with ip: binding the sockets works, attaching does not.
    let other = NetnsPair::new("xg", 1500);
    let dir = TempDir::new("aoexdp");
    let obj = dir.path().join("xsk_redirect.bpf.o");
    std::fs::write(&obj, bw_net::xdp::program_object()).expect("write the XDP object");
    sh(&format!("ip -n {} link set dev {} xdpgeneric obj {} sec xdp.frags", other.ns, other.ns_if, obj.display()));
    let auto_export = format!("{},volume=a,shelf=3,slot=1", other.ns_if);
    let auto_serve = Serve::start_in(Some(&other.ns), &["--aoe-datapath", "auto", "--volume", "a=ram:8M", "--aoe", &auto_export]);
    let log = auto_serve.log_text();
    assert!(log.contains("AF_XDP not used, AF_PACKET instead: attaching XDP") && log.contains("datapath packet"), "{log}");
    blockwire_ok(None, &["verify", &format!("aoe://{}/3.1", other.host_if), "--size", "2M", "--aoe-datapath", "packet"]);
    assert!(auto_serve.stop().success());

    // A target forced onto AF_PACKET in the namespace: no fallback line.
    let ns_export = format!("{},volume=d,shelf=1,slot=2", pair.ns_if);
    let ns_serve = Serve::start_in(Some(&pair.ns), &["--aoe-datapath", "packet", "--volume", "d=ram:8M", "--aoe", &ns_export]);
    let log = ns_serve.log_text();
    assert!(log.contains("datapath packet (AF_PACKET)") && !log.contains("AF_XDP not used"), "{log}");

    // Initiators on host_if: auto falls back while the hook is held ...
    let rt = runtime();
    let url = format!("aoe://{}/1.2", pair.host_if);
    let c = client(&rt, &url, Datapath::Auto);
    assert_eq!(c.datapath(), Datapath::Packet);
    round_trip(&rt, &c, 0, 256 << 10);
    let opts = ConnectOptions { timeout: Duration::from_secs(5), aoe_datapath: Datapath::Xdp, ..Default::default() };
    assert!(rt.block_on(AoeClient::connect(&TargetUrl::parse(&url).unwrap(), &opts)).is_err(), "xdp with the hook taken");
    // ... and gets AF_XDP once it is free, beside the AF_PACKET client. The
    // kernel lets go of a closed socket's queue a moment later (deferred
    // work), so a client opened at once may still fall back: try a while.
    drop(hook);
    let x = (0..200)
        .find_map(|_| {
            let x = client(&rt, &url, Datapath::Auto);
            if x.datapath() == Datapath::Xdp {
                return Some(x);
            }
            std::thread::sleep(Duration::from_millis(50));
            None
        })
        .expect("AF_XDP once the interface is free");
    round_trip(&rt, &x, 1 << 20, 256 << 10);
    round_trip(&rt, &c, 2 << 20, 64 << 10);
    drop((c, x));
    assert!(ns_serve.stop().success());
    assert!(host_serve.stop().success());
}

/// `blockwire ctl` against the running target; asserts success, returns stdout.
fn ctl_ok(sock: &std::path::Path, args: &[&str]) -> String {
    let mut a = vec!["ctl", "--control", sock.to_str().unwrap()];
    a.extend_from_slice(args);
    let o = blockwire(None, &a);
    assert!(o.status.success(), "ctl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Wait for serve's log to say which exports AF_XDP takes (the map read
/// back after each change).
fn wait_for_steering(serve: &Serve, iface: &str, exports: &str) {
    let want = format!("aoe {iface}: AF_XDP takes requests for [{exports}]");
    for _ in 0..500 {
        if serve.log_text().contains(&want) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no {want:?} in serve's log:\n{}", serve.log_text());
}

/// vblade beside an AF_XDP blockwire on the SAME interface: the XDP program
/// takes only requests for blockwire's exports, so a broadcast query finds
/// both targets and both serve writes and reads (initiator on AF_XDP too).
/// Exports added and removed live change what the program takes: once e1.7
/// is removed from blockwire, a second vblade at e1.7 gets its requests.
#[test]
fn vblade_beside_an_xdp_target_on_one_interface_keeps_its_frames() {
    let pair = NetnsPair::new("xv", 1500);
    let dir = TempDir::new("aoexv");
    let sock = dir.path().join("control.sock");
    let export = format!("{},volume=d,shelf=1,slot=2", pair.ns_if);
    let serve = Serve::start_in(
        Some(&pair.ns),
        &["--aoe-datapath", "xdp", "--volume", "d=ram:16M", "--volume", "n=ram:8M", "--aoe", &export, "--control", sock.to_str().unwrap()],
    );
    assert!(serve.log_text().contains(&format!("aoe {}: datapath xdp", pair.ns_if)), "{}", serve.log_text());
    wait_for_steering(&serve, &pair.ns_if, "e1.2");
    let img = dir.path().join("vblade.img");
    std::fs::File::create(&img).unwrap().set_len(16 << 20).unwrap();
    // (Starting it waits until a broadcast query finds e4.5.)
    let _vb = Vblade::start(&pair, 4, 5, &img);
    let found = blockwire_ok(None, &["aoe", "discover", &pair.host_if]);
    assert!(found.contains("e1.2") && found.contains("e4.5"), "discover: {found}");
    for addr in ["1.2", "4.5"] {
        blockwire_ok(None, &["verify", &format!("aoe://{}/{addr}", pair.host_if), "--size", "4M", "--aoe-datapath", "xdp"]);
    }

    let e17 = format!(r#"{{"interface": "{}", "shelf": 1, "slot": 7}}"#, pair.ns_if);
    let add = format!(r#"{{"interface": "{}", "shelf": 1, "slot": 7, "volume": "n"}}"#, pair.ns_if);
    assert!(ctl_ok(&sock, &["aoe_export_add", &add]).contains("added"));
    wait_for_steering(&serve, &pair.ns_if, "e1.2, e1.7");
    blockwire_ok(None, &["verify", &format!("aoe://{}/1.7", pair.host_if), "--size", "2M", "--aoe-datapath", "xdp"]);
    assert!(ctl_ok(&sock, &["aoe_export_remove", &e17]).contains("removed"));
    wait_for_steering(&serve, &pair.ns_if, "e1.2");
    let img2 = dir.path().join("vblade2.img");
    std::fs::File::create(&img2).unwrap().set_len(8 << 20).unwrap();
    let _vb2 = Vblade::start(&pair, 1, 7, &img2);
    blockwire_ok(None, &["verify", &format!("aoe://{}/1.7", pair.host_if), "--size", "2M", "--aoe-datapath", "xdp"]);
    // blockwire's own export still answers, through AF_XDP.
    blockwire_ok(None, &["verify", &format!("aoe://{}/1.2", pair.host_if), "--size", "2M", "--aoe-datapath", "xdp"]);
    assert!(serve.stop().success());
}
