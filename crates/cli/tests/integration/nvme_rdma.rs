//! NVMe over RDMA on soft-RoCE, in one boot of the kernel VM (this host's
//! kernel has no RDMA): `blockwire serve --nvme-rdma` against the Linux
//! nvme-rdma host (ext4, a checksummed tree, e2fsck, reconnect), bad input
//! on queues of their own while the Linux host stays connected, and the
//! blockwire initiator against the kernel's nvmet-rdma and against
//! blockwire (tests/kernel-vm/nvme-rdma.sh); between them, `nvme discover`
//! and `nvme connect-all` through blockwire's discovery controller, and the
//! admission limits on RDMA queues (a second blockwire with tight limits).
//!
//! The bad input comes from this test binary itself, run in the guest
//! (`guest_bad_input`, ignored on the host): it speaks the transport with
//! bw-rdma directly, to send what a correct initiator never would.

use crate::common;
use bw_nvme::fabrics::{self, reg, Connect, ConnectData, Property};
use bw_nvme::queue_entry::{nvm, sgl, Keyed, Sgl, Sqe};
use bw_nvme::limits::INCAPSULE_DATA;
use bw_nvme::rdma_queue::{cm, CAPSULE_LEN};
use bw_nvme::{Cqe, Status};
use bw_rdma::{BufId, ConnectError, EventKind, Queue, Wc};
use common::*;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.org.blockwire:rdma-test";
const KNQN: &str = "nqn.2026-11.org.linux:nvmet-rdma";
const HOSTNQN: &str = "nqn.2026-11.org.blockwire:kernel-vm";
/// DH-HMAC-CHAP secrets of `HOSTNQN.auth` (as in nvme_auth.rs: a 64-byte
/// key, SHA-512 transformed; a 48-byte controller key, SHA-384), and a
/// valid secret that is nobody's.
const AUTH_KEY: &str = "DHHC-1:03:fmr/LwuNLBEnjnefsP/MrOqUuTmdSJawd7ARVTktU4OuVqbM7G6TQN/S2d40eM8xcUN6zXQYlSRludHzlbwzBQCJBwY=:";
const AUTH_CTRL_KEY: &str = "DHHC-1:02:phwQVxrn55BfJCE9I4UsS6K5UF+mV6Wyu9tCE6xlSiLjKDUvQ2pk53WFjssJg1vVjAzGxQ==:";
const AUTH_BAD_KEY: &str = "DHHC-1:00:SoDN1KTIIw7BrNLOO2E5gZ6RT0203EbsYh0K3YjV4wWw+zY8:";

#[test]
fn nvme_rdma_on_soft_roce() {
    require_root();
    let dir = TempDir::new("nvr");
    let bw = blockwire_bin();
    let exe = std::env::current_exe().expect("test binary path");
    let probe_of = |name: &str| format!("{} nvme_rdma::{name} --exact --ignored --nocapture --test-threads 1", exe.display());
    let (probe, probe_limits, probe_lab) = (probe_of("guest_bad_input"), probe_of("guest_admission"), probe_of("guest_lab_rdma_rule"));
    let body = guest_script_with("nvme-host-lib.sh", "nvme-rdma.sh");
    let script = dir.path().join("nvme-rdma.sh");
    let head = format!(
        "BW={}\nPROBE='{probe}'\nPROBE_LIMITS='{probe_limits}'\nPROBE_LAB='{probe_lab}'\nPORT=4420\nDPORT=8009\nLPORT=4422\nKPORT=4421\nNQN={NQN}\nKNQN={KNQN}\nHOSTNQN={HOSTNQN}\nAUTH_KEY='{AUTH_KEY}'\nAUTH_CTRL_KEY='{AUTH_CTRL_KEY}'\nAUTH_BAD_KEY='{AUTH_BAD_KEY}'\n",
        bw.display()
    );
    std::fs::write(&script, head + &body).unwrap();
    let (bw, exe) = (bw.display().to_string(), exe.display().to_string());
    let t0 = Instant::now();
    // Two large binaries come along into the guest's memory.
    let vm = BackgroundVm::start_with(None, &script, "", &["--with", &bw, "--with", &exe], &[("KVM_MEM", "2048")]);
    let (status, output) = vm.finish();
    eprintln!("nvme_rdma: guest ran {:?}", t0.elapsed());
    for step in [
        "RDMA-OK: rxe0 on eth0",
        "PROBE-OK: the lab finds rxe0 on eth0 and no RDMA device on lo",
        "RDMA-OK: blockwire listens",
        "RDMA-OK: ext4 mkfs, checksummed tree, e2fsck -fn clean",
        "RDMA-OK: checksums match after a reconnect",
        "PROBE-OK: connect request with a bad queue size rejected",
        "PROBE-OK: Connect with a queue size other than the request's refused",
        "PROBE-OK: SGL outside the registered region closes that queue",
        "PROBE-OK: disconnect mid-transfer",
        "PROBE-OK: a capsule longer than the receive buffer closes that queue",
        "PROBE-OK: a new controller still connects",
        "RDMA-OK: the Linux host's queues carried on",
        "RDMA-OK: nvme discover (tcp 8009 and rdma 4420) lists the RDMA port",
        "RDMA-OK: nvme connect-all connects over rdma through the discovery log",
        "RDMA-OK: a second host over max_sessions refused",
        "RDMA-OK: a host not on the allow-list refused",
        "PROBE-OK: max_pending_logins bounds RDMA connections without a Connect",
        "PROBE-OK: login timeout closes an RDMA connection without a Connect",
        "RDMA-OK: blockwire verify against the kernel's nvmet-rdma",
        "RDMA-OK: blockwire verify against blockwire over rdma",
        "RDMA-OK: DH-HMAC-CHAP over rdma: both ways with the secrets, refused with a wrong one or none",
        "RDMA-ALL-OK",
    ] {
        assert!(output.contains(step), "guest did not report {step:?}\n{output}");
    }
    assert!(status.success(), "guest script failed");
    // The target closed the bad queues: the refused request, the queue
    // whose Connect data was outside the host's memory (never connected:
    // controller 0; whether its failed READ or the host's disconnect is
    // seen first is a race), the I/O queue that went mid-transfer.
    for why in ["connect request refused (reject status 4)", "queue 0 of controller 0 closed", "queue 1 of controller"] {
        assert!(output.lines().any(|l| l.contains("TARGET-LOG:") && l.contains(why)), "target log has no {why:?}\n{output}");
    }
    // The limited target said why it refused each one.
    for why in ["(max_sessions)", "host not allowed", "(max_pending_logins)", "no Connect before the login timeout"] {
        assert!(output.lines().any(|l| l.contains("TARGET2-LOG:") && l.contains(why)), "limited target's log has no {why:?}\n{output}");
    }
}

/// One raw NVMe/RDMA queue, synchronous: capsules out, completions in.
struct RawQueue {
    q: Queue,
    /// Completion receive slots, capsule send buffer, a data buffer the
    /// target may read and write.
    recv: BufId,
    send: BufId,
    data: BufId,
    cid: u16,
}

const SLOTS: usize = 32;

impl RawQueue {
    /// The connection manager's exchange alone (Err: the reject status).
    fn open(target: &str, qid: u16, hsqsize: u16) -> Result<RawQueue, u16> {
        let (ip, port) = target.rsplit_once(':').expect("ADDR:PORT");
        let port: u16 = port.parse().unwrap();
        let mut q = Queue::resolve(ip, port, 64, SLOTS as u32, Duration::from_secs(5)).expect("resolve the target");
        let recv = q.register(SLOTS * 64, false).unwrap();
        for i in 0..SLOTS {
            q.post_recv(i as u64, recv, i * 64, 64).unwrap();
        }
        // Room for a capsule longer than the target's receive buffers.
        let send = q.register(64 + 2 * INCAPSULE_DATA as usize, false).unwrap();
        let data = q.register(1 << 20, true).unwrap();
        let req = cm::Request { recfmt: 0, qid, hrqsize: hsqsize.saturating_add(1), hsqsize, cntlid: 0xFFFF };
        match q.connect(&req.encode(), 4, 4, Duration::from_secs(5)) {
            Ok(_) => Ok(RawQueue { q, recv, send, data, cid: 0 }),
            Err(ConnectError::Rejected(p)) => Err(cm::parse_reject(&p).unwrap_or(0)),
            Err(e) => panic!("connect: {e}"),
        }
    }

    /// Send `sqe` (with `incapsule` data) and wait for its completion;
    /// Err when the queue ends first.
    fn cmd(&mut self, mut sqe: Sqe, incapsule: &[u8]) -> Result<Cqe, String> {
        self.cid = self.cid.wrapping_add(1);
        sqe.set_cid(self.cid);
        let b = self.q.buf_mut(self.send).unwrap();
        b[..64].copy_from_slice(&sqe.0);
        b[64..64 + incapsule.len()].copy_from_slice(incapsule);
        self.q.post_send(1000, self.send, 0, 64 + incapsule.len(), None, true).map_err(|e| e.to_string())?;
        let end = Instant::now() + Duration::from_secs(10);
        let mut wcs = [Wc::default(); 16];
        while Instant::now() < end {
            let n = self.q.poll(&mut wcs).map_err(|e| e.to_string())?;
            for wc in &wcs[..n] {
                if !wc.ok() {
                    return Err(format!("work completion: {}", wc.status_str()));
                }
                if wc.wr_id < SLOTS as u64 {
                    let off = wc.wr_id as usize * 64;
                    let c = Cqe::parse(&self.q.buf(self.recv)[off..off + 16]);
                    self.q.post_recv(wc.wr_id, self.recv, off, 64).map_err(|e| e.to_string())?;
                    if c.cid == self.cid {
                        return Ok(c);
                    }
                }
            }
            while let Some(ev) = self.q.cm_event().map_err(|e| e.to_string())? {
                if ev.kind == EventKind::Disconnected {
                    return Err("disconnected by the target".into());
                }
            }
            if n == 0 {
                self.q.rearm().map_err(|e| e.to_string())?;
                self.q.wait(Duration::from_millis(50)).map_err(|e| e.to_string())?;
            }
        }
        Err("no completion within 10 s".into())
    }

    /// This queue's data buffer as a keyed descriptor of `len` bytes at `off`.
    fn keyed(&self, off: u64, len: u32) -> Keyed {
        let (addr, key) = self.q.remote_key(self.data).unwrap();
        Keyed { addr: addr + off, length: len, key, invalidate: false }
    }

    fn connect(&mut self, qid: u16, sqsize: u16, cntlid: u16) -> Cqe {
        let mut s = Connect { recfmt: 0, qid, sqsize, cattr: 0, kato_ms: if qid == 0 { 30_000 } else { 0 } }.to_sqe(0);
        s.set_sgl(Sgl { addr: 0, length: 1024, kind: sgl::INCAPSULE });
        let hostnqn = std::env::var("BW_RDMA_HOSTNQN").unwrap();
        let subnqn = std::env::var("BW_RDMA_NQN").unwrap();
        let d = ConnectData { hostid: [0x42; 16], cntlid, subnqn, hostnqn };
        self.cmd(s, &d.encode()).expect("Connect completes")
    }
}

/// Runs inside the guest (started by `nvme_rdma_on_soft_roce` through the
/// guest script); prints one PROBE-OK line per check.
#[test]
#[ignore = "runs inside the kernel VM (tests/kernel-vm/nvme-rdma.sh)"]
fn guest_bad_input() {
    let Ok(target) = std::env::var("BW_RDMA_TARGET") else {
        eprintln!("BW_RDMA_TARGET not set: nothing to probe");
        return;
    };
    // 1. A queue size we do not offer: rejected by the connection manager.
    let r = RawQueue::open(&target, 0, 4095);
    assert_eq!(r.err(), Some(cm::reject::INVALID_HSQSIZE), "connect request with HSQSIZE 4095");
    println!("PROBE-OK: connect request with a bad queue size rejected");

    // 2. Connect's SQSIZE other than the request's HSQSIZE: that Connect is refused.
    let mut q = RawQueue::open(&target, 0, 31).expect("admin queue");
    let c = q.connect(0, 63, 0xFFFF);
    assert_eq!(c.status, Status::CONNECT_INVALID_PARAM.dnr());
    let c = q.connect(0, 31, 0xFFFF);
    assert!(c.status.is_success(), "Connect: {}", c.status);
    println!("PROBE-OK: Connect with a queue size other than the request's refused");

    drop(q);

    // 3. A Connect whose keyed SGL points past the end of our registered
    //    buffer: the target's RDMA READ of the Connect data fails (remote
    //    access error) and that queue closes.
    let mut q = RawQueue::open(&target, 0, 31).expect("admin queue");
    let mut s = Connect { recfmt: 0, qid: 0, sqsize: 31, cattr: 0, kato_ms: 30_000 }.to_sqe(0);
    s.set_keyed_sgl(q.keyed(1 << 20, 1024));
    let r = q.cmd(s, &[]);
    assert!(r.is_err() || !r.as_ref().unwrap().status.is_success(), "Connect with data outside the registered memory succeeded: {r:?}");
    let r2 = q.cmd(Property::get_sqe(0, reg::CAP, true), &[]);
    assert!(r2.is_err(), "the queue still answers after the bad SGL: {r2:?}");
    println!("PROBE-OK: SGL outside the registered region closes that queue ({})", r.err().unwrap_or_default());
    drop(q);

    // 4. A controller with an I/O queue; a 1 MiB write, and the queue
    //    disconnects before the target has fetched the data.
    let mut admin = RawQueue::open(&target, 0, 31).expect("admin queue");
    let c = admin.connect(0, 31, 0xFFFF);
    assert!(c.status.is_success(), "Connect: {}", c.status);
    let cntlid = c.dw0() as u16;
    admin.cmd(Property::set_sqe(0, reg::CC, (6 << 16) | (4 << 20) | 1), &[]).expect("enable");
    let t0 = Instant::now();
    while admin.cmd(Property::get_sqe(0, reg::CSTS, false), &[]).expect("CSTS").result & 1 == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "controller never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut io = RawQueue::open(&target, 1, 31).expect("I/O queue");
    let c = io.connect(1, 31, cntlid);
    assert!(c.status.is_success(), "I/O Connect: {}", c.status);
    let mut w = Sqe::new(nvm::WRITE, 0, 1);
    w.set_rw(0, 2048);
    w.set_keyed_sgl(io.keyed(0, 1 << 20));
    w.set_cid(77);
    let b = io.q.buf_mut(io.send).unwrap();
    b[..64].copy_from_slice(&w.0);
    io.q.post_send(1000, io.send, 0, 64, None, true).unwrap();
    // Gone as soon as the capsule has arrived (its SEND acknowledged),
    // while the target fetches the megabyte.
    let t0 = Instant::now();
    let mut wcs = [Wc::default(); 16];
    'sent: while t0.elapsed() < Duration::from_secs(10) {
        let n = io.q.poll(&mut wcs).unwrap();
        for wc in &wcs[..n] {
            if wc.wr_id == 1000 {
                assert!(wc.ok(), "the write's capsule: {}", wc.status_str());
                break 'sent;
            }
        }
    }
    io.q.disconnect();
    drop(io);
    // The admin queue is another queue: it still answers.
    let c = admin.cmd(Property::get_sqe(0, reg::CSTS, false), &[]).expect("admin queue after the I/O queue's disconnect");
    assert!(c.status.is_success());
    println!("PROBE-OK: disconnect mid-transfer");
    admin.cmd(fabrics::disconnect_sqe(0), &[]).expect("Disconnect");
    drop(admin);

    // 5. A capsule longer than the receive buffers the target posted: the
    //    target's RECV fails (length error), that queue closes.
    let mut q = RawQueue::open(&target, 0, 31).expect("admin queue");
    assert!(q.connect(0, 31, 0xFFFF).status.is_success());
    let r = q.cmd(Property::get_sqe(0, reg::CAP, true), &vec![0u8; CAPSULE_LEN]);
    assert!(r.is_err(), "an oversized capsule was answered: {r:?}");
    let r2 = q.cmd(Property::get_sqe(0, reg::CAP, true), &[]);
    assert!(r2.is_err(), "the queue still answers after the oversized capsule: {r2:?}");
    println!("PROBE-OK: a capsule longer than the receive buffer closes that queue ({})", r.err().unwrap_or_default());
    drop(q);

    // 6. The target still takes new controllers.
    let mut q = RawQueue::open(&target, 0, 31).expect("admin queue after the bad input");
    assert!(q.connect(0, 31, 0xFFFF).status.is_success());
    println!("PROBE-OK: a new controller still connects");
}

/// Runs inside the guest against a blockwire with `max_pending_logins = 2`
/// and `login_timeout_s = 10` (tests/kernel-vm/nvme-rdma.sh): connections
/// that never send a Connect hold a pending-login place each, a third is
/// rejected (no resources), and the login timeout closes them.
#[test]
#[ignore = "runs inside the kernel VM (tests/kernel-vm/nvme-rdma.sh)"]
fn guest_admission() {
    let Ok(target) = std::env::var("BW_RDMA_TARGET") else {
        eprintln!("BW_RDMA_TARGET not set: nothing to probe");
        return;
    };
    // Refused hosts' connections may still hold places for a moment: take
    // a place as soon as one is free.
    let open = || {
        for _ in 0..100 {
            match RawQueue::open(&target, 0, 31) {
                Ok(q) => return q,
                Err(sts) => assert_eq!(sts, cm::reject::NO_RESOURCES, "connect request rejected"),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("no pending-login place came free");
    };
    // The login timeout may close a held queue before the third asks (a
    // stall of the emulated guest): then its place is free again, and the
    // round is repeated. The target disconnects that queue before it
    // accepts another, so its Disconnected event is here by then.
    let closed = |q: &mut RawQueue| std::iter::from_fn(|| q.q.cm_event().unwrap()).any(|e| e.kind == EventKind::Disconnected);
    let mut held = None;
    for _ in 0..10 {
        let mut a = open();
        let mut b = open();
        let third = RawQueue::open(&target, 0, 31);
        if !closed(&mut a) && !closed(&mut b) {
            assert_eq!(third.err(), Some(cm::reject::NO_RESOURCES), "a third connection without a Connect was accepted");
            held = Some((a, b));
            break;
        }
    }
    let (mut a, mut b) = held.expect("two pending connections held at once");
    println!("PROBE-OK: max_pending_logins bounds RDMA connections without a Connect");
    let mut gone = [false, false];
    let t0 = Instant::now();
    while gone != [true, true] {
        assert!(t0.elapsed() < Duration::from_secs(120), "the target never closed the connections without a Connect");
        gone[0] |= closed(&mut a);
        gone[1] |= closed(&mut b);
        std::thread::sleep(Duration::from_millis(100));
    }
    drop((a, b));
    drop(open());
    println!("PROBE-OK: login timeout closes an RDMA connection without a Connect");
}

/// Runs inside the guest once rxe0 is on eth0: the lab's availability rule
/// for its NVMe/RDMA subjects (bw_lab::network::rdma) on a host that has a device.
#[test]
#[ignore = "runs inside the kernel VM (tests/kernel-vm/nvme-rdma.sh)"]
fn guest_lab_rdma_rule() {
    use bw_lab::hosts::host::Host;
    assert_eq!(bw_lab::network::rdma::check(&Host::Local, "eth0"), None, "rxe0 on eth0 not found");
    let why = bw_lab::network::rdma::check(&Host::Local, "lo").expect("lo has no RDMA device");
    assert!(why.starts_with("no RDMA device on lo of this machine (it has rxe0 on eth0"), "{why}");
    println!("PROBE-OK: the lab finds rxe0 on eth0 and no RDMA device on lo ({why})");
}
