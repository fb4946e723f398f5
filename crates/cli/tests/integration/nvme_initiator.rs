//! blockwire's NVMe/TCP initiator against blockwire's target over loopback,
//! and the target's behaviour with hostile or silent hosts: allow lists,
//! keep-alive timeout, malformed PDUs (answered with C2HTermReq, ending only
//! their own connection while another connection keeps working).

use crate::common;
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.org.blockwire:nvme-test";
const GOOD_HOST: &str = "nqn.2026-11.org.blockwire:good-host";

fn config(dir: &TempDir, port: u16, allowed: &[&str]) -> String {
    let cfg = dir.path().join("serve.toml");
    let hosts: Vec<String> = allowed.iter().map(|h| format!("{h:?}")).collect();
    let dport = free_port();
    std::fs::write(
        &cfg,
        format!(
            r#"
[[volume]]
name = "d0"
backend = "ram:128M"
[[volume]]
name = "d1"
backend = "file:{}/d1.img,size=16M"
[nvme]
listen = ["127.0.0.1:{port}"]
discovery_listen = "127.0.0.1:{dport}"
[[nvme.subsystem]]
nqn = "{NQN}"
namespaces = [{{ nsid = 1, volume = "d0" }}, {{ nsid = 2, volume = "d1" }}]
allowed_hosts = [{}]
"#,
            dir.path().display(),
            hosts.join(", ")
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_string()
}

/// The target's log gains a line containing every needle (the log is read
/// from its stderr by another thread, so give it a moment).
fn wait_log(serve: &Serve, needles: &[&str]) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        let log = serve.log_text();
        if needles.iter().all(|n| log.contains(n)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn url(port: u16, nsid: u32) -> String {
    format!("nvme+tcp://127.0.0.1:{port}/{NQN}/{nsid}")
}

#[test]
fn verify_with_queues_digests_and_small_writes() {
    let dir = TempDir::new("nvv");
    let port = free_port();
    let serve = Serve::start(&["--config", &config(&dir, port, &[])]);
    let u1 = url(port, 1);
    // Several I/O queues, many commands in flight, 1 MiB writes (R2T path).
    let out = blockwire_ok(None, &["verify", &u1, "--size", "64M", "--queues", "3", "--concurrency", "16"]);
    assert!(out.contains("3 I/O queues"), "{out}");
    // Header and data digests, 4 KiB writes (in-capsule path).
    blockwire_ok(None, &["verify", &u1, "--size", "8M", "--chunk", "4k", "--header-digest", "--data-digest", "--seed", "7"]);
    // Only one digest kind, large chunks, at an offset, on the file-backed namespace.
    blockwire_ok(None, &["verify", &url(port, 2), "--size", "12M", "--offset", "2M", "--chunk", "256k", "--data-digest"]);
    blockwire_ok(None, &["verify", &url(port, 2), "--size", "4M", "--header-digest", "--queues", "2"]);
    // A namespace that does not exist is an error, not a hang.
    let out = blockwire(None, &["verify", &url(port, 9), "--size", "1M"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid namespace"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(serve.stop().success());
}

#[test]
fn flag_only_serve_has_discovery_on_8009() {
    let port = free_port();
    if std::net::TcpListener::bind("127.0.0.1:8009").is_err() {
        panic!("127.0.0.1:8009 is in use by something else; this test needs it");
    }
    let serve = Serve::start(&["--volume", "a=ram:16M", "--volume", "b=ram:8M", "--nvme", &format!("127.0.0.1:{port}")]);
    let log = serve.log_text();
    let nqn = log
        .lines()
        .find_map(|l| l.strip_prefix("blockwire: nvme subsystem ").and_then(|r| r.split_whitespace().next()))
        .unwrap_or_else(|| panic!("no subsystem NQN printed at start-up:\n{log}"))
        .to_string();
    let out = blockwire_ok(None, &["nvme", "discover", "127.0.0.1"]);
    assert!(out.contains(&format!("nvme+tcp://127.0.0.1:{port}/{nqn}")), "{out}");
    // Both volumes are namespaces 1 and 2, in the order given.
    blockwire_ok(None, &["verify", &format!("nvme+tcp://127.0.0.1:{port}/{nqn}/2"), "--size", "8M"]);
    let out = blockwire(None, &["verify", &format!("nvme+tcp://127.0.0.1:{port}/{nqn}/3"), "--size", "1M"]);
    assert!(!out.status.success());
    assert!(serve.stop().success());
}

#[test]
fn host_outside_allow_list_is_refused_at_connect() {
    let dir = TempDir::new("nva");
    let port = free_port();
    let serve = Serve::start(&["--config", &config(&dir, port, &[GOOD_HOST]), "-v"]);
    let out = blockwire(None, &["verify", &url(port, 1), "--size", "1M", "--initiator-name", "nqn.2026-11.org.blockwire:bad-host"]);
    assert!(!out.status.success(), "a host outside the allow list got in");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Connect") && err.contains("host not allowed"), "unexpected error: {err}");
    blockwire_ok(None, &["verify", &url(port, 1), "--size", "4M", "--initiator-name", GOOD_HOST]);
    assert!(wait_log(&serve, &["is not allowed on"]), "refusal not logged:\n{}", serve.log_text());
    assert!(serve.stop().success());
}

// ---- raw NVMe/TCP from the test itself: byte vectors, no client library ----

fn icreq(digest_bits: u8) -> Vec<u8> {
    let mut b = vec![0u8; 128];
    b[..8].copy_from_slice(&[0x00, 0x00, 128, 0, 128, 0, 0, 0]);
    b[11] = digest_bits;
    b
}

/// A CapsuleCmd carrying Connect with its 1024 bytes in the capsule.
fn connect_capsule(qid: u16, kato_ms: u32, cntlid: u16, hostnqn: &str) -> Vec<u8> {
    let plen = 72 + 1024u32;
    let mut b = vec![0x04, 0x00, 72, 72];
    b.extend_from_slice(&plen.to_le_bytes());
    let mut sqe = [0u8; 64];
    sqe[0] = 0x7F;
    sqe[1] = 0x40;
    sqe[2] = 1; // cid 1
    sqe[4] = 0x01; // Connect
    sqe[32..36].copy_from_slice(&1024u32.to_le_bytes());
    sqe[39] = 0x01; // in-capsule offset SGL
    sqe[42..44].copy_from_slice(&qid.to_le_bytes());
    sqe[44..46].copy_from_slice(&31u16.to_le_bytes());
    sqe[48..52].copy_from_slice(&kato_ms.to_le_bytes());
    b.extend_from_slice(&sqe);
    let mut d = vec![0u8; 1024];
    d[16..18].copy_from_slice(&cntlid.to_le_bytes());
    d[256..256 + NQN.len()].copy_from_slice(NQN.as_bytes());
    d[512..512 + hostnqn.len()].copy_from_slice(hostnqn.as_bytes());
    b.extend_from_slice(&d);
    b
}

fn open(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// Read one PDU (header and payload, no digests).
fn read_pdu(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut ch = [0u8; 8];
    s.read_exact(&mut ch).ok()?;
    let plen = u32::from_le_bytes(ch[4..8].try_into().unwrap()) as usize;
    let mut rest = vec![0u8; plen.saturating_sub(8)];
    s.read_exact(&mut rest).ok()?;
    let mut v = ch.to_vec();
    v.extend(rest);
    Some(v)
}

/// ICReq/ICResp, then an admin Connect; returns the controller ID.
fn admin_connect(port: u16, kato_ms: u32) -> (TcpStream, u16) {
    let mut s = open(port);
    s.write_all(&icreq(0)).unwrap();
    let r = read_pdu(&mut s).expect("ICResp");
    assert_eq!(&r[..4], &[0x01, 0x00, 128, 0], "ICResp header");
    assert_eq!(r[10], 0, "CPDA must be 0");
    assert!(u32::from_le_bytes(r[12..16].try_into().unwrap()) >= 4096, "MAXH2CDATA");
    s.write_all(&connect_capsule(0, kato_ms, 0xFFFF, "nqn.2026-11.org.blockwire:raw")).unwrap();
    let r = read_pdu(&mut s).expect("Connect response");
    assert_eq!(r[0], 0x05, "CapsuleResp");
    let status = u16::from_le_bytes(r[22..24].try_into().unwrap()) >> 1;
    assert_eq!(status, 0, "Connect failed with status {status:#x}");
    (s, u16::from_le_bytes(r[8..10].try_into().unwrap()))
}

/// The connection ends (EOF or reset) within `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let t0 = Instant::now();
    let mut b = [0u8; 256];
    while t0.elapsed() < limit {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => continue,
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn silent_host_is_torn_down_after_kato() {
    let dir = TempDir::new("nvk");
    let port = free_port();
    let serve = Serve::start(&["--config", &config(&dir, port, &[]), "-v"]);
    // KATO 1 s, then silence: the controller and its connection must go.
    let (mut s, cntlid) = admin_connect(port, 1000);
    assert!(closed_within(&mut s, Duration::from_secs(60)), "connection still open long after KATO");
    let who = format!("controller {cntlid} ");
    assert!(wait_log(&serve, &[&who, "keep-alive timeout"]), "no keep-alive teardown logged:\n{}", serve.log_text());
    // An I/O queue connect to the dead controller is refused.
    let mut s = open(port);
    s.write_all(&icreq(0)).unwrap();
    read_pdu(&mut s).expect("ICResp");
    s.write_all(&connect_capsule(1, 0, cntlid, "nqn.2026-11.org.blockwire:raw")).unwrap();
    let r = read_pdu(&mut s).expect("Connect response");
    assert_eq!(u16::from_le_bytes(r[22..24].try_into().unwrap()) >> 1 & 0x7FF, 0x182, "connect to a torn-down controller");
    // A host that keeps talking (our initiator sends Keep Alive) stays up.
    blockwire_ok(None, &["verify", &url(port, 1), "--size", "16M"]);
    assert!(serve.stop().success());
}

#[test]
fn malformed_pdus_end_only_their_own_connection() {
    let dir = TempDir::new("nvm");
    let port = free_port();
    let mut serve = Serve::start(&["--config", &config(&dir, port, &[])]);
    // A long verify on its own connections while we misbehave on others.
    let u = url(port, 1);
    let bg = std::thread::spawn(move || blockwire(None, &["verify", &u, "--size", "96M", "--chunk", "64k", "--queues", "2"]));
    std::thread::sleep(Duration::from_millis(200));

    // 1. Unknown PDU type before ICReq: C2HTermReq, PDU sequence or header error.
    let mut s = open(port);
    s.write_all(&[0x42, 0, 24, 0, 24, 0, 0, 0]).unwrap();
    s.write_all(&[0u8; 16]).unwrap();
    let t = read_pdu(&mut s).expect("C2HTermReq");
    assert_eq!(t[0], 0x03, "C2HTermReq expected, got {t:?}");
    assert_eq!(u16::from_le_bytes([t[8], t[9]]), 0x01, "FES invalid header field");
    assert!(closed_within(&mut s, Duration::from_secs(10)));

    // 2. ICReq with an unsupported PDU format version: FES unsupported parameter.
    let mut s = open(port);
    let mut ic = icreq(0);
    ic[8] = 1;
    s.write_all(&ic).unwrap();
    let t = read_pdu(&mut s).expect("C2HTermReq");
    assert_eq!((t[0], u16::from_le_bytes([t[8], t[9]])), (0x03, 0x06));
    assert!(closed_within(&mut s, Duration::from_secs(10)));

    // 3. After a good Connect: a capsule with a bad header length.
    let (mut s, _) = admin_connect(port, 0);
    s.write_all(&[0x04, 0, 99, 0, 99, 0, 0, 0]).unwrap();
    s.write_all(&[0u8; 91]).unwrap();
    let t = read_pdu(&mut s).expect("C2HTermReq");
    assert_eq!(t[0], 0x03);
    assert_eq!((u16::from_le_bytes([t[8], t[9]]), u32::from_le_bytes(t[10..14].try_into().unwrap())), (0x01, 2), "FES/FEI for hlen");
    assert!(closed_within(&mut s, Duration::from_secs(10)));

    // 4. H2CData nobody asked for (unknown transfer tag).
    let (mut s, _) = admin_connect(port, 0);
    let mut h2c = vec![0x06, 0x04, 24, 24, 28, 0, 0, 0, 5, 0, 0x34, 0x12, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0];
    h2c.extend_from_slice(&[1, 2, 3, 4]);
    s.write_all(&h2c).unwrap();
    let t = read_pdu(&mut s).expect("C2HTermReq");
    assert_eq!((t[0], u16::from_le_bytes([t[8], t[9]])), (0x03, 0x01));
    assert!(closed_within(&mut s, Duration::from_secs(10)));

    // 5. A PDU type only a controller sends (R2T from the host).
    let (mut s, _) = admin_connect(port, 0);
    s.write_all(&[0x09, 0, 24, 0, 24, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0]).unwrap();
    let t = read_pdu(&mut s).expect("C2HTermReq");
    assert_eq!(t[0], 0x03);
    assert!(closed_within(&mut s, Duration::from_secs(10)));

    // 6. A huge PDU length, then garbage, then a hang-up mid-PDU.
    let mut s = open(port);
    s.write_all(&icreq(0)).unwrap();
    read_pdu(&mut s).expect("ICResp");
    s.write_all(&[0x04, 0, 72, 72, 0xFF, 0xFF, 0xFF, 0x7F]).unwrap();
    let t = read_pdu(&mut s).expect("C2HTermReq");
    assert_eq!((t[0], u16::from_le_bytes([t[8], t[9]])), (0x03, 0x04), "FES data transfer out of range");
    for _ in 0..5 {
        let mut s = open(port);
        s.write_all(&icreq(0)[..50]).unwrap();
        drop(s);
    }

    let out = bg.join().unwrap();
    assert!(out.status.success(), "verify on another connection failed:\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(serve.is_running(), "target died");
    blockwire_ok(None, &["verify", &url(port, 1), "--size", "8M", "--seed", "3"]);
    assert!(serve.stop().success());
}
