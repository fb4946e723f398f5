//! NVMe/TCP against peers that hold resources without credentials:
//! - connections that never Connect cannot make the target ask for (and
//!   hold) write data: a command other than Connect ends the connection
//!   with a C2HTermReq, and the target's memory stays flat;
//! - a discovery controller that asked for no keep-alive (KATO 0) is torn
//!   down once idle, and its place in `max_sessions` comes back.

use crate::common::nvme_raw::RawNvme as Raw;
use crate::common::*;
use bw_nvme::queue_entry::{nvm, sgl, Sgl, Sqe};
use bw_nvme::fabrics::{reg, Property};
use bw_nvme::pdu::{self, DataPdu, Digests, Pdu};
use bw_nvme::{Cqe, Status, DISCOVERY_NQN};
use bytes::Bytes;
use std::io::Write;
use std::time::Duration;

const NQN: &str = "nqn.2026-11.org.blockwire:hostile";
const HOST: &str = "nqn.2026-11.org.blockwire:hostile-host";

fn config(port: u16, limits: &str) -> String {
    format!(
        r#"
[[volume]]
name = "d0"
backend = "ram:64M"
[nvme]
listen = ["127.0.0.1:{port}"]
[[nvme.subsystem]]
nqn = "{NQN}"
namespaces = [{{ nsid = 1, volume = "d0" }}]
allowed_hosts = ["{HOST}"]
[limits]
{limits}
"#
    )
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The admin queue's Connect as this module's host.
impl Raw {
    fn connect_admin(&mut self, subnqn: &str, kato_ms: u32) -> Cqe {
        self.connect(subnqn, 0, 0xFFFF, HOST, [5; 16], kato_ms).expect("Connect answered")
    }
}

/// Six connections each send an ICReq, then sixteen 1 MiB writes with no
/// Connect, and then the data of every R2T they get, all but its last
/// block. Today's target answers the first write with a C2HTermReq and
/// closes; it used to ask for all 16 MiB on each and hold what came.
#[test]
fn writes_before_connect_are_refused_and_hold_no_memory() {
    let dir = TempDir::new("nvh");
    let port = free_port();
    let mut serve = Serve::with_config(&dir, &config(port, ""), &[]);
    const CONNS: usize = 6;
    const WRITES: u16 = 16;
    const LEN: u32 = 1 << 20;
    let before = rss_kib(serve.pid());
    let mut held = Vec::new();
    let mut seen = Vec::new();
    for _ in 0..CONNS {
        let mut r = Raw::open(port);
        let mut out = Vec::new();
        for cid in 0..WRITES {
            let mut s = Sqe::new(nvm::WRITE, cid, 1);
            s.set_rw(cid as u64 * (LEN as u64 / 512), LEN / 512);
            s.set_sgl(Sgl {
                addr: 0,
                length: LEN,
                kind: sgl::TRANSPORT,
            });
            pdu::encode_capsule(&s, &[], Digests::default(), &mut out);
        }
        let _ = r.s.write_all(&out);
        let got = r.until_closed(WRITES as usize, Duration::from_secs(10));
        for p in &got.pdus {
            if let Pdu::R2T(t) = p {
                let d = Pdu::H2CData(DataPdu {
                    cid: t.cid,
                    ttag: t.ttag,
                    offset: 0,
                    last: false,
                    success: false,
                    data: Bytes::from(vec![0xA5; t.length as usize - 512]),
                });
                let mut b = Vec::new();
                d.encode_into(Digests::default(), &mut b);
                if r.s.write_all(&b).is_err() {
                    break;
                }
            }
        }
        seen.push(got);
        held.push(r);
    }
    // A moment for the target to take in what was sent: only the figure
    // printed depends on it (the target that asks for no data holds none
    // however long it is given); the checks below do not.
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_kib(serve.pid());
    let grown_mib = after.saturating_sub(before) / 1024;
    eprintln!("target RSS {before} KiB -> {after} KiB with {CONNS} connections that never Connect");
    assert!(
        grown_mib < 24,
        "target RSS grew {grown_mib} MiB ({before} -> {after} KiB) for {CONNS} connections that never connected"
    );
    for (i, got) in seen.iter().enumerate() {
        let r2ts = got.pdus.iter().filter(|p| matches!(p, Pdu::R2T(_))).count();
        assert_eq!(r2ts, 0, "connection {i}: {r2ts} R2Ts before Connect");
        assert!(
            matches!(got.pdus[..], [Pdu::C2HTermReq(ref t)] if t.fes == pdu::fes::PDU_SEQUENCE_ERROR),
            "connection {i}: expected one C2HTermReq, got {:?}",
            got.pdus.iter().map(|p| p.kind()).collect::<Vec<_>>()
        );
        assert!(got.closed, "connection {i} left open");
    }
    drop(held);
    // The target still serves a host that does connect.
    let mut r = Raw::open(port);
    assert!(r.connect_admin(NQN, 10_000).status.is_success());
    assert!(serve.is_running());
    assert!(serve.stop().success());
}

/// Wait (generously) until `ok`.
fn eventually(serve: &Serve, what: &str, mut ok: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{what}:\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// With max_discovery_sessions = 2, two discovery controllers that asked
/// for no keep-alive (KATO 0) and went idle are torn down after the idle
/// limit (discovery_idle_timeout_s), and the pool has room again.
#[test]
fn idle_discovery_controllers_without_keep_alive_go() {
    let dir = TempDir::new("nvd");
    let port = free_port();
    let mut serve = Serve::with_config(
        &dir,
        &config(port, "max_discovery_sessions = 2\ndiscovery_idle_timeout_s = 2"),
        &["-v"],
    );
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut r = Raw::open(port);
        let c = r.connect_admin(DISCOVERY_NQN, 0);
        assert!(c.status.is_success(), "discovery Connect: {}", c.status);
        let cap = r
            .command(Property::get_sqe(2, reg::CAP, true), &[])
            .expect("CAP");
        assert!(cap.status.is_success());
        held.push(r);
    }
    // Silence from both: the target closes them (within a generous bound;
    // a target that keeps them leaves the read waiting until it gives up).
    for (i, r) in held.iter_mut().enumerate() {
        let got = r.until_closed(1, Duration::from_secs(60));
        assert!(
            got.closed && got.pdus.is_empty(),
            "idle discovery controller {i} not closed:\n{}",
            serve.log_text()
        );
    }
    // The target logs why once each connection has ended (after its
    // socket closed), and gives the connection's places back then.
    eventually(&serve, "no keep-alive timeout logged", || {
        serve
            .log_text()
            .matches("keep-alive timeout (2000 ms")
            .count()
            == 2
    });
    eventually(
        &serve,
        "no discovery controller after the idle ones went",
        || Raw::open(port).connect_admin(DISCOVERY_NQN, 0).status == Status::SUCCESS,
    );
    assert!(serve.is_running());
    assert!(serve.stop().success());
}
