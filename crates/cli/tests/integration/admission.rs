//! Admission against clients without credentials: discovery sessions
//! (iSCSI SendTargets, NVMe/TCP discovery controllers) have a pool of their
//! own and cannot take a host's place; an iSCSI discovery session without
//! requests is closed even while it answers our NOP-In pings; connections
//! that have not logged in are capped across all addresses and cost a
//! descriptor, no thread, while they wait.

use crate::common::*;
use crate::load::{closed_by_target, config, opts, proc_stats, runtime, socket_from, IQN, NQN};
use bw_iscsi::msg::{login_status, LoginRequest, Message, NopOut};
use bw_iscsi::pdu::{field, Bhs, Decoder};
use bw_nvme::fabrics::{Connect, ConnectData};
use bw_nvme::pdu::{CapsuleCmd, IcReq};
use bw_nvme::{Pdu as NvmePdu, DISCOVERY_NQN};
use bytes::{Bytes, BytesMut};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Read what the socket has within `wait` into `inbox`; false once closed.
fn pump(s: &mut TcpStream, inbox: &mut BytesMut, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).expect("timeout");
    let mut b = [0u8; 4096];
    match s.read(&mut b) {
        Ok(0) => false,
        Ok(n) => {
            inbox.extend_from_slice(&b[..n]);
            true
        }
        // A signal (EINTR) is not the server closing: read again next round.
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => true,
        Err(e) => {
            eprintln!("read from the target failed: {e} ({:?})", e.kind());
            false
        }
    }
}

fn iscsi_bytes(mut bhs: Bhs, data: &[u8]) -> Vec<u8> {
    bhs.set_data_segment_len(data.len());
    let mut v = bhs.0.to_vec();
    v.extend_from_slice(data);
    v.resize(v.len() + (4 - data.len() % 4) % 4, 0);
    v
}

/// An iSCSI discovery login without authentication on a new connection:
/// the login status (0: logged in) and the socket.
fn iscsi_discovery_login(port: u16, n: u8) -> (u16, TcpStream, BytesMut) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let name = format!("iqn.2026-11.org.blockwire.test:discovery{n}");
    let text = bw_iscsi::text::encode(&[
        ("InitiatorName", name.as_str()),
        ("SessionType", "Discovery"),
        ("HeaderDigest", "None"),
        ("DataDigest", "None"),
    ]);
    let login = LoginRequest { transit: true, csg: 1, nsg: 3, isid: [0x80, 0, 0, 0, 1, n], cmd_sn: 1, ..Default::default() };
    s.write_all(&iscsi_bytes(Message::LoginRequest(login).encode(), &text)).expect("send login");
    let dec = Decoder::new(1 << 20);
    let mut inbox = BytesMut::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(p)) = dec.decode(&mut inbox) {
            let status = u16::from(p.bhs.get(field::STATUS_CLASS)) << 8 | u16::from(p.bhs.get(field::STATUS_DETAIL));
            return (status, s, inbox);
        }
        assert!(pump(&mut s, &mut inbox, Duration::from_millis(50)), "discovery login {n}: closed without a login response");
        assert!(Instant::now() < deadline, "discovery login {n}: no login response");
    }
}

/// An NVMe/TCP discovery controller (KATO 0) on a new connection: the
/// Connect's status (0: connected) and the socket.
fn nvme_discovery_connect(port: u16, n: u8) -> (u16, TcpStream) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let d = bw_nvme::Digests::default();
    let mut out = Vec::new();
    NvmePdu::IcReq(IcReq { pfv: 0, hpda: 0, digests: d, maxr2t: 0 }).encode_into(d, &mut out);
    let c = Connect { recfmt: 0, qid: 0, sqsize: 31, cattr: 0, kato_ms: 0 };
    let cd = ConnectData {
        hostid: [n; 16],
        cntlid: 0xFFFF,
        subnqn: DISCOVERY_NQN.into(),
        hostnqn: format!("nqn.2014-08.org.nvmexpress:uuid:discovery-{n}"),
    };
    NvmePdu::CapsuleCmd(CapsuleCmd { sqe: c.to_sqe(1), data: Bytes::from(cd.encode()) }).encode_into(d, &mut out);
    s.write_all(&out).expect("send ICReq and Connect");
    let mut inbox = BytesMut::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        while let Ok(Some(p)) = bw_nvme::pdu::decode(&mut inbox, d, 1 << 20) {
            if let NvmePdu::CapsuleResp(r) = p {
                return (r.status.0, s);
            }
        }
        assert!(pump(&mut s, &mut inbox, Duration::from_millis(50)), "discovery Connect {n}: closed without a response");
        assert!(Instant::now() < deadline, "discovery Connect {n}: no response");
    }
}

/// Whether the target's log shows `what` within a few seconds.
fn log_eventually(serve: &Serve, what: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !serve.log_text().contains(what) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Threads of `pid` that run one connection each (`iscsi-conn`, `nvme-conn`).
fn conn_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("read /proc task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim_end().ends_with("-conn"))
        .count()
}

/// A host logs in, reads a block and logs out.
fn host_reads(url: &str) -> Result<(), String> {
    let rt = runtime();
    let c = rt.block_on(bw_initiator::connect(url, &opts(1))).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 4096];
    rt.block_on(c.read(0, &mut buf)).map_err(|e| e.to_string())?;
    rt.block_on(c.close()).map_err(|e| e.to_string())
}

/// With `max_sessions` 2, four discovery sessions of each protocol are
/// admitted (`max_discovery_sessions` 4) and a fifth is refused, and hosts
/// still log in to both places of the normal pool.
#[test]
fn discovery_sessions_have_their_own_pool() {
    let dir = TempDir::new("discpool");
    let (ip, np) = (free_port(), free_port());
    let cfg = config(&dir, "ram:16M", "127.0.0.1", ip, np, None);
    let serve = Serve::start(&["--config", &cfg, "--max-sessions", "2", "--max-discovery-sessions", "4"]);
    let mut held = Vec::new();
    for n in 0..4 {
        let (status, s, _) = iscsi_discovery_login(ip, n);
        assert_eq!(status, 0, "iSCSI discovery session {n} of 4 refused");
        held.push(s);
        let (status, s) = nvme_discovery_connect(np, n);
        assert_eq!(status, 0, "NVMe/TCP discovery controller {n} of 4 refused");
        held.push(s);
    }
    let (status, _, _) = iscsi_discovery_login(ip, 9);
    assert_eq!(status, login_status::OUT_OF_RESOURCES, "a fifth iSCSI discovery session");
    let (status, _) = nvme_discovery_connect(np, 9);
    assert_ne!(status, 0, "a fifth NVMe/TCP discovery controller was admitted");
    // Discovery sessions stay on the shared runtime; a host's connections
    // get threads of their own.
    let pid = serve.pid();
    assert_eq!(conn_threads(pid), 0, "threads for discovery sessions");
    let rt = runtime();
    for url in [format!("iscsi://127.0.0.1:{ip}/{IQN}/0"), format!("nvme+tcp://127.0.0.1:{np}/{NQN}/1")] {
        // Both places of the normal pool, at once.
        let a = rt.block_on(bw_initiator::connect(&url, &opts(1))).unwrap_or_else(|e| panic!("{url}: first host refused past 4 discovery sessions: {e}"));
        // (The thread starts once the login response has gone out.)
        let deadline = Instant::now() + Duration::from_secs(10);
        while conn_threads(pid) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(conn_threads(pid) >= 1, "{url}: a logged-in connection has no thread of its own");
        host_reads(&url).unwrap_or_else(|e| panic!("{url}: second host refused past 4 discovery sessions: {e}"));
        rt.block_on(a.close()).expect("logout");
    }
    drop(held);
    assert!(log_eventually(&serve, "max_discovery_sessions"), "the refusals are logged with the knob's name");
    assert!(serve.stop().success());
}

/// An iSCSI discovery session that sends no request is closed after
/// `discovery_idle_timeout_s`, although it answers every NOP-In (our own
/// keep-alive, sent after 15 s of silence). Before, NOP-In kept it forever.
#[test]
fn idle_iscsi_discovery_session_is_closed_despite_nop_replies() {
    let dir = TempDir::new("discidle");
    let (ip, np) = (free_port(), free_port());
    let cfg = config(&dir, "ram:16M", "127.0.0.1", ip, np, None);
    let idle_s = 20;
    let serve = Serve::start(&["--config", &cfg, "--discovery-idle-timeout", &idle_s.to_string()]);
    let (status, mut s, mut inbox) = iscsi_discovery_login(ip, 1);
    assert_eq!(status, 0, "discovery login refused");
    let dec = Decoder::new(1 << 20);
    let t0 = Instant::now();
    let mut answered = 0;
    // Immediate NOP-Outs do not advance CmdSN.
    let cmd_sn = 2;
    // Generous: with answers counted as requests, it never closes.
    let limit = Duration::from_secs(idle_s + 60);
    let closed = loop {
        while let Ok(Some(p)) = dec.decode(&mut inbox) {
            if let Ok(Message::NopIn(ping)) = Message::decode(&p.bhs) {
                if ping.ttt != 0xFFFF_FFFF {
                    let pong = NopOut { immediate: true, lun: ping.lun, itt: 0xFFFF_FFFF, ttt: ping.ttt, cmd_sn, exp_stat_sn: ping.stat_sn };
                    s.write_all(&iscsi_bytes(Message::NopOut(pong).encode(), &p.data)).expect("answer NOP-In");
                    answered += 1;
                }
            }
        }
        if !pump(&mut s, &mut inbox, Duration::from_millis(200)) {
            break true;
        }
        if t0.elapsed() > limit {
            break false;
        }
    };
    let took = t0.elapsed();
    eprintln!("idle discovery session closed: {closed} after {took:?}, {answered} NOP-In answered (discovery_idle_timeout_s = {idle_s})");
    assert!(closed, "an idle discovery session was still open after {took:?} ({answered} NOP-In answered)");
    // The line is written after the socket has closed.
    assert!(log_eventually(&serve, "discovery_idle_timeout_s"), "the close is logged with the knob's name");
    // A host's session is not a discovery session: it stays.
    host_reads(&format!("iscsi://127.0.0.1:{ip}/{IQN}/0")).expect("host login");
    assert!(serve.stop().success());
}

/// Connections that have not logged in are capped across addresses
/// (`max_pending_logins`): past the cap a connection from a fresh address
/// is closed at once, below it (and once the idle ones are gone) hosts log
/// in. Each idle connection costs a descriptor and no thread (it waits on
/// the shared runtime). The login timeout is far longer than the test, so
/// no idle connection can time out while it is being counted: the test
/// closes them itself.
#[test]
fn pending_logins_are_capped_across_addresses_and_cost_no_thread() {
    let dir = TempDir::new("pending");
    let (ip, np) = (free_port(), free_port());
    let cfg = config(&dir, "ram:16M", "127.0.0.1", ip, np, None);
    let cap = 40;
    let serve = Serve::start(&["--config", &cfg, "--max-pending-logins", &cap.to_string(), "--login-timeout", "3600"]);
    let pid = serve.pid();
    let idle_state = proc_stats(pid);
    // Until the process is back to its idle descriptors and threads (a
    // previous round's connections have ended), or the bound.
    let settle = || {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let now = proc_stats(pid);
            if (now.fds <= idle_state.fds && now.threads <= idle_state.threads) || Instant::now() > deadline {
                return now;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    for (port, url) in [(ip, format!("iscsi://127.0.0.1:{ip}/{IQN}/0")), (np, format!("nvme+tcp://127.0.0.1:{np}/{NQN}/1"))] {
        // Below the cap a host logs in next to idle sockets.
        let before = settle();
        let mut idle: Vec<TcpStream> =
            (0..cap - 1).map(|i| socket_from(&format!("127.0.3.{}", 1 + i), port).expect("idle socket")).collect();
        // Wait until the target holds them all (descriptors settle).
        let deadline = Instant::now() + Duration::from_secs(120);
        while proc_stats(pid).fds < before.fds + idle.len() as u64 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(300));
        let flooded = proc_stats(pid);
        let (fds, threads) = (flooded.fds.saturating_sub(before.fds), flooded.threads.saturating_sub(before.threads));
        eprintln!("port {port}: {} idle connections cost {fds} descriptors and {threads} threads ({before:?} -> {flooded:?})", idle.len());
        assert!(fds >= idle.len() as u64, "port {port}: the target holds {fds} descriptors for {} idle connections", idle.len());
        assert!(fds <= 2 * idle.len() as u64, "{fds} descriptors for {} idle connections", idle.len());
        assert!(threads < idle.len() as u64 / 4, "{threads} threads for {} idle connections", idle.len());
        host_reads(&url).unwrap_or_else(|e| panic!("{url}: host refused below max_pending_logins: {e}"));
        // At the cap, a fresh address is turned away. (Connections are
        // accepted in the order they were made: the 40th is counted
        // before the 41st arrives.)
        idle.push(socket_from("127.0.3.200", port).expect("the last idle socket"));
        let mut extra = socket_from("127.0.3.201", port).expect("connect past the cap");
        assert!(closed_by_target(&mut extra, Duration::from_secs(60)), "port {port}: a connection past max_pending_logins stayed open");
        // The idle ones go; then hosts get in again.
        drop(idle);
        let mut ok = None;
        for _ in 0..600 {
            match host_reads(&url) {
                Ok(()) => {
                    ok = Some(());
                    break;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        assert!(ok.is_some(), "{url}: no login after the idle connections were dropped");
    }
    assert!(log_eventually(&serve, "max_pending_logins"), "the refusal is logged with the knob's name");
    assert!(serve.stop().success());
}
