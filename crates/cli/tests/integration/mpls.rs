//! AoE and iSCSI across a five-router MPLS chain of `blockwire router`s in
//! namespaces (client - LER - LSR - LSR - LSR - LER - target). Needs root.

use crate::common;
use bw_lab::route::{self, PathKind, RouteNet, CUSTOMER_IF, TARGET_IP};
use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MTU: u32 = 9000;

fn chain(tag: &str) -> RouteNet {
    require_root();
    RouteNet::build(PathKind::Mpls, &unique(tag), MTU, &blockwire_bin())
        .expect("build the MPLS chain")
}

/// `blockwire serve` in the target namespace: e1.2 over AoE, LUN 0 over iSCSI.
fn serve(net: &RouteNet) -> Serve {
    Serve::start_in(
        Some(&net.target_ns),
        &[
            "--volume",
            "d=ram:80M",
            "--aoe",
            &format!("{CUSTOMER_IF},volume=d,shelf=1,slot=2"),
            "--iscsi",
            &format!("{TARGET_IP}:3260"),
        ],
    )
}

/// Nothing of `net` left once it is dropped: namespaces, router processes.
fn assert_gone(namespaces: Vec<String>, pids: Vec<u32>) {
    let list = sh("ip netns list");
    for ns in &namespaces {
        assert!(
            !list
                .lines()
                .any(|l| l.split_whitespace().next() == Some(ns)),
            "namespace {ns} left behind"
        );
    }
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || sh(&format!("cat /proc/{pid}/stat")).contains(") Z"),
            "router {pid} still running"
        );
    }
}

/// tshark fields of MPLS frames in `pcap`: (top label, top TTL, bottom label, bottom TTL).
fn label_pairs(pcap: &str) -> Vec<(u32, u8, u32, u8)> {
    let out = sh(&format!(
        "tshark -r {pcap} -Y mpls -T fields -E separator=\\; -e mpls.label -e mpls.ttl"
    ));
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
        .args([
            "netns", "exec", &cap_ns, "tshark", "-q", "-c", "200", "-i", &cap_if, "-w",
        ])
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
    assert!(
        out.contains("e1.2") && out.contains("80M"),
        "discover across MPLS: {out}"
    );
    let v = blockwire_ok(
        Some(&net.client_ns),
        &[
            "verify",
            &format!("aoe://{CUSTOMER_IF}/1.2"),
            "--size",
            "64M",
        ],
    );
    eprintln!("{v}");
    // tshark stops by itself after 200 frames (-c); the verify sent far more.
    let deadline = Instant::now() + Duration::from_secs(20);
    while tshark.try_wait().expect("wait tshark").is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: signalling our own child (a no-op if it already ended).
    unsafe { libc::kill(tshark.id() as i32, libc::SIGINT) };
    let _ = tshark.wait();
    let pcap_s = pcap.to_str().expect("utf-8");
    let pairs = label_pairs(pcap_s);
    // Eastbound: ler1 pushed 101/1000 at TTL 255, lsr1 swapped to 102 at 254.
    assert!(
        pairs.contains(&(102, 254, 1000, 255)),
        "eastbound labels: {pairs:?}"
    );
    // Westbound: ler2 pushed 201, lsr3 and lsr2 swapped: 203 at 253.
    assert!(
        pairs.contains(&(203, 253, 1000, 255)),
        "westbound labels: {pairs:?}"
    );
    assert!(
        pairs
            .iter()
            .all(|p| [(102, 254, 1000, 255), (203, 253, 1000, 255)].contains(p)),
        "{pairs:?}"
    );
    // The pseudowire's AoE decodes cleanly. Decode-as keys on the bottom
    // (customer) label: pwethcw = Ethernet pseudowire with control word.
    let aoe = sh(&format!(
        "tshark -r {pcap_s} -d mpls.label==1000,pwethcw -Y aoe -T fields -e aoe.cmd"
    ));
    assert!(aoe.lines().count() >= 100, "AoE inside the labels: {aoe:?}");
    let bad = sh(&format!(
        "tshark -r {pcap_s} -d mpls.label==1000,pwethcw -Y _ws.malformed"
    ));
    assert!(bad.trim().is_empty(), "malformed frames: {bad}");

    let found = blockwire_ok(Some(&net.client_ns), &["iscsi", "discover", TARGET_IP]);
    let iqn = found
        .split_whitespace()
        .find(|w| w.starts_with("iqn."))
        .expect("an IQN")
        .to_string();
    let v = blockwire_ok(
        Some(&net.client_ns),
        &[
            "verify",
            &format!("iscsi://{TARGET_IP}/{iqn}/0"),
            "--size",
            "64M",
            "--seed",
            "7",
        ],
    );
    eprintln!("{v}");
    drop(target);
    let (namespaces, pids) = (net.namespaces().to_vec(), net.pids());
    assert_eq!(pids.len(), 5);
    drop(net);
    assert_gone(namespaces, pids);
}

/// Run `f` on a thread inside network namespace `ns`.
fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("open netns");
        // SAFETY: setns on this thread only, with an fd we hold open.
        let r = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
}

fn mac_bytes(s: &str) -> [u8; 6] {
    let v: Vec<u8> = s
        .split(':')
        .map(|x| u8::from_str_radix(x, 16).expect("hex"))
        .collect();
    v.try_into().expect("6 bytes")
}

/// An MPLS frame to lsr1's west port: `stack` entries, a control word, then
/// an AoE frame whose source MAC is `marker`.
fn mpls_frame(stack: &[(u32, bool, u8)], marker: [u8; 6]) -> Vec<u8> {
    let mut f = mac_bytes(&route::router_mac(1, 0)).to_vec();
    f.extend_from_slice(&mac_bytes(&route::router_mac(0, 1)));
    f.extend_from_slice(&[0x88, 0x47]);
    for &(label, bottom, ttl) in stack {
        f.extend_from_slice(
            &bw_mpls::LabelEntry {
                label,
                tc: 0,
                bottom,
                ttl,
            }
            .encode(),
        );
    }
    f.extend_from_slice(&[0; 4]);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&marker);
    f.extend_from_slice(&[0x88, 0xA2, 0x10, 0, 0, 0, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5]);
    f.resize(f.len().max(80), 0);
    f
}

#[test]
fn malformed_mpls_is_dropped_and_random_frames_do_not_hurt() {
    use rand::{Rng, SeedableRng};
    let mut net = chain("mm");
    let target = serve(&net);
    let good = [0x02, 0xee, 0, 0, 0, 1];
    let bad = [
        [0x02, 0xee, 0, 0, 0, 2],
        [0x02, 0xee, 0, 0, 0, 3],
        [0x02, 0xee, 0, 0, 0, 4],
    ];
    // Listen on lsr2's west port: everything lsr1 forwards arrives there.
    let lsr2 = net.routers[2].ns.clone();
    let listener = in_netns(&lsr2, move || {
        let s = bw_net::PacketSocket::open("west", 0x8847).expect("listen on lsr2 west");
        s.set_recv_timeout(Duration::from_millis(1500))
            .expect("timeout");
        let mut seen = Vec::new();
        let mut buf = vec![0u8; 16384];
        while let Ok(n) = s.recv(&mut buf) {
            seen.push(buf[..n].to_vec());
        }
        seen
    });
    std::thread::sleep(Duration::from_millis(200));
    let ler1 = net.routers[0].ns.clone();
    let sent = in_netns(&ler1, move || {
        let s = bw_net::PacketSocket::open("core", 0x8847).expect("raw socket on ler1 core");
        s.send(&mpls_frame(&[(101, false, 64), (1000, true, 64)], good))
            .expect("send");
        s.send(&mpls_frame(&[(101, false, 1), (1000, true, 64)], bad[0]))
            .expect("send TTL 1");
        s.send(&mpls_frame(&[(555, false, 64), (1000, true, 64)], bad[1]))
            .expect("send unknown label");
        let no_bottom: Vec<(u32, bool, u8)> = std::iter::once((101, false, 64))
            .chain(std::iter::repeat((1000, false, 64)).take(7))
            .collect();
        s.send(&mpls_frame(&no_bottom, bad[2]))
            .expect("send broken stack");
        // Random frames: any EtherType, and MPLS with random stacks.
        let mut rng = rand::rngs::SmallRng::seed_from_u64(12);
        let mut n = 0;
        for i in 0..3000 {
            let len = rng.gen_range(14..300);
            let mut f: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            f[..6].copy_from_slice(&mac_bytes(&route::router_mac(1, 0)));
            if i % 2 == 0 {
                f[12..14].copy_from_slice(&[0x88, 0x47]);
            }
            if s.send(&f).is_ok() {
                n += 1;
            }
        }
        n
    });
    let sent = sent.join().expect("sender");
    assert!(sent > 2500, "only {sent} random frames went out");
    let seen = listener.join().expect("listener");
    let has = |m: &[u8; 6]| seen.iter().any(|f| f.windows(6).any(|w| w == m));
    assert!(
        has(&good),
        "the well-formed frame was not forwarded ({} frames seen)",
        seen.len()
    );
    for (m, what) in bad.iter().zip(["TTL 1", "unknown label", "broken stack"]) {
        assert!(!has(m), "the {what} frame was forwarded");
    }
    // Still alive, and the chain still works end to end.
    let pid = net.routers[1].pid().expect("lsr1 pid");
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    let out = blockwire_ok(Some(&net.client_ns), &["aoe", "discover", CUSTOMER_IF]);
    assert!(out.contains("e1.2"), "{out}");
    let counters = net.stop_router("lsr1").expect("stop lsr1");
    eprintln!("lsr1: {counters}");
    for reason in ["ttl=", "unknown-label=", "broken-stack="] {
        assert!(
            counters.contains(reason),
            "lsr1 counted no {reason} drops: {counters}"
        );
    }
    drop(target);
}

#[test]
fn aoe_verify_survives_a_switch_router_restart() {
    let mut net = chain("mr");
    let target = serve(&net);
    let mut verify = Command::new("ip")
        .args(["netns", "exec", &net.client_ns])
        .arg(blockwire_bin())
        .args([
            "verify",
            &format!("aoe://{CUSTOMER_IF}/1.2"),
            "--size",
            "80M",
            "--seed",
            "3",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn verify");
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        verify.try_wait().expect("wait").is_none(),
        "verify ended before the restart: make it bigger"
    );
    let counters = net.stop_router("lsr2").expect("stop lsr2");
    eprintln!("lsr2 before restart: {counters}");
    assert!(counters.contains("forwarded"), "{counters}");
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        verify.try_wait().expect("wait").is_none(),
        "verify ended while a router was down"
    );
    net.start_router_again("lsr2").expect("restart lsr2");
    let out = verify.wait_with_output().expect("verify");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "verify across the restart failed: {text}"
    );
    eprintln!("{text}");
    drop(target);
}
