//! AoE and iSCSI across a five-router MPLS chain of `blockwire router`s in
//! namespaces (client - LER - LSR - LSR - LSR - LER - target). Needs root.

mod common;
use bw_lab::route::{PathKind, RouteNet, CUSTOMER_IF, TARGET_IP};
use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MTU: u32 = 9000;

fn chain(tag: &str) -> RouteNet {
    require_root();
    RouteNet::build(PathKind::Mpls, &unique(tag), MTU, &blockwire_bin()).expect("build the MPLS chain")
}

/// `blockwire serve` in the target namespace: e1.2 over AoE, LUN 0 over iSCSI.
fn serve(net: &RouteNet) -> Serve {
    Serve::start_in(
        Some(&net.target_ns),
        &["--volume", "d=ram:80M", "--aoe", &format!("{CUSTOMER_IF},volume=d,shelf=1,slot=2"), "--iscsi", &format!("{TARGET_IP}:3260")],
    )
}

/// Nothing of `net` left once it is dropped: namespaces, router processes.
fn assert_gone(namespaces: Vec<String>, pids: Vec<u32>) {
    let list = sh("ip netns list");
    for ns in &namespaces {
        assert!(!list.lines().any(|l| l.split_whitespace().next() == Some(ns)), "namespace {ns} left behind");
    }
    for pid in pids {
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists() || sh(&format!("cat /proc/{pid}/stat")).contains(") Z"), "router {pid} still running");
    }
}

/// tshark fields of MPLS frames in `pcap`: (top label, top TTL, bottom label, bottom TTL).
fn label_pairs(pcap: &str) -> Vec<(u32, u8, u32, u8)> {
    let out = sh(&format!("tshark -r {pcap} -Y mpls -T fields -E separator=\\; -e mpls.label -e mpls.ttl"));
    out.lines()
        .filter_map(|l| {
            let (labels, ttls) = l.split_once(';')?;
            let l: Vec<u32> = labels.split(',').filter_map(|x| x.parse().ok()).collect();
            let t: Vec<u8> = ttls.split(',').filter_map(|x| x.parse().ok()).collect();
            (l.len() == 2 && t.len() == 2).then(|| (l[0], t[0], l[1], t[1]))
        })
        .collect()
}

#[test]
fn aoe_and_iscsi_cross_five_routers() {
    let net = chain("mc");
    let target = serve(&net);
    // Capture in the middle (between lsr1 and lsr2) while discovery runs.
    let dir = TempDir::new("mpls-cap");
    let pcap = dir.path().join("mid.pcap");
    let (cap_ns, cap_if) = net.capture_point.clone();
    let mut tshark = Command::new("ip")
        .args(["netns", "exec", &cap_ns, "tshark", "-q", "-i", &cap_if, "-w"])
        .arg(&pcap)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tshark");
    // tshark says "Capturing on" once the socket is open.
    let mut err = tshark.stderr.take().expect("stderr");
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !seen.contains("Capturing on") && Instant::now() < deadline {
        let mut b = [0u8; 256];
        let n = std::io::Read::read(&mut err, &mut b).unwrap_or(0);
        seen.push_str(&String::from_utf8_lossy(&b[..n]));
    }
    let out = blockwire_ok(Some(&net.client_ns), &["aoe", "discover", CUSTOMER_IF]);
    assert!(out.contains("e1.2") && out.contains("80M"), "discover across MPLS: {out}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(tshark.id() as i32, libc::SIGINT) };
    let _ = tshark.wait();
    let pcap_s = pcap.to_str().expect("utf-8");
    let pairs = label_pairs(pcap_s);
    // Eastbound: ler1 pushed 101/1000 at TTL 255, lsr1 swapped to 102 at 254.
    assert!(pairs.contains(&(102, 254, 1000, 255)), "eastbound labels: {pairs:?}");
    // Westbound: ler2 pushed 201, lsr3 and lsr2 swapped: 203 at 253.
    assert!(pairs.contains(&(203, 253, 1000, 255)), "westbound labels: {pairs:?}");
    assert!(pairs.iter().all(|p| [(102, 254, 1000, 255), (203, 253, 1000, 255)].contains(p)), "{pairs:?}");
    // The pseudowire's AoE decodes cleanly (pwethcw: Ethernet with control word).
    let aoe = sh(&format!("tshark -r {pcap_s} -d mpls.label==102,pwethcw -d mpls.label==203,pwethcw -Y aoe -T fields -e aoe.cmd"));
    assert!(aoe.lines().count() >= 2, "AoE inside the labels: {aoe:?}");
    let bad = sh(&format!("tshark -r {pcap_s} -d mpls.label==102,pwethcw -d mpls.label==203,pwethcw -Y _ws.malformed"));
    assert!(bad.trim().is_empty(), "malformed frames: {bad}");

    let v = blockwire_ok(Some(&net.client_ns), &["verify", &format!("aoe://{CUSTOMER_IF}/1.2"), "--size", "64M"]);
    eprintln!("{v}");
    let found = blockwire_ok(Some(&net.client_ns), &["iscsi", "discover", TARGET_IP]);
    let iqn = found.split_whitespace().find(|w| w.starts_with("iqn.")).expect("an IQN").to_string();
    let v = blockwire_ok(Some(&net.client_ns), &["verify", &format!("iscsi://{TARGET_IP}/{iqn}/0"), "--size", "64M", "--seed", "7"]);
    eprintln!("{v}");
    drop(target);
    let (namespaces, pids) = (net.namespaces().to_vec(), net.pids());
    assert_eq!(pids.len(), 5);
    drop(net);
    assert_gone(namespaces, pids);
}
