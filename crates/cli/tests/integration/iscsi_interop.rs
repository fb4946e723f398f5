//! iSCSI interoperability with third-party peers, and refusals:
//! - qemu-img convert to the LUN and back (checksums match), qemu-io at odd
//!   offsets, against `blockwire serve --iscsi`;
//! - blockwire's initiator (`verify`, `iscsi discover`) against tgt (tgtd);
//! - login refused with the right status class for a wrong CHAP secret, an
//!   unknown target and an initiator outside the ACL; discovery CHAP;
//! - a flood of malformed PDUs on some connections does not disturb another
//!   session's verify;
//! - a second login with the same initiator name and ISID reinstates the
//!   session: the target ends the old connection, and only that one.

use crate::common;
use common::*;
use std::io::Write;
use std::process::Command;
use std::time::Duration;

fn target_iqn(serve: &Serve) -> String {
    let log = serve.log_text();
    log.lines()
        .find_map(|l| l.split("iSCSI target ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no target IQN printed:\n{log}"))
        .to_string()
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn sha256(path: &std::path::Path) -> String {
    sh(&format!("sha256sum {}", path.display())).split_whitespace().next().unwrap_or_default().to_string()
}

#[test]
fn qemu_img_convert_round_trip_and_qemu_io_odd_offsets() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let serve = Serve::start(&["--volume", "d0=ram:32M", "--volume", "d1=ram:16M", "--iscsi", &listen]);
    let iqn = target_iqn(&serve);
    let dir = TempDir::new("iscsiqemu");
    let src = dir.path().join("src.img");
    let back = dir.path().join("back.img");
    sh(&format!("head -c 33554432 /dev/urandom > {}", src.display()));
    let url0 = format!("iscsi://{listen}/{iqn}/0");
    let (ok, out) = run(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(&src).arg(&url0));
    assert!(ok, "qemu-img convert to the LUN failed:\n{out}");
    let (ok, out) = run(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "raw"]).arg(&url0).arg(&back));
    assert!(ok, "qemu-img convert from the LUN failed:\n{out}");
    assert_eq!(sha256(&src), sha256(&back), "image changed on its way through the LUN");

    // qemu-io on LUN 1: unaligned writes become read-modify-write.
    let url1 = format!("iscsi://{listen}/{iqn}/1");
    let (ok, out) = run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0xab 12345 7777",
        "-c",
        "write -P 0x5c 1048575 3",
        "-c",
        "read -P 0xab 12345 7777",
        "-c",
        "read -P 0x5c 1048575 3",
        "-c",
        "read -P 0 0 12345",
        "-c",
        "read -P 0 20122 1028453",
        "-c",
        "read -P 0 1048578 1000",
        &url1,
    ]));
    assert!(ok && !out.contains("fail") && !out.contains("error"), "qemu-io:\n{out}");
    assert_eq!(out.matches("read ").count(), 5, "qemu-io did not do all reads:\n{out}");
}

#[test]
fn blockwire_initiator_against_tgt() {
    require_root();
    let dir = TempDir::new("iscsitgt");
    let img = dir.path().join("lun.img");
    sh(&format!("truncate -s 64M {}", img.display()));
    let iqn = "iqn.2026-11.org.blockwire.test:tgt";
    let tgtd = Tgtd::start(&img, iqn);
    let port = tgtd.port;
    let portal = format!("127.0.0.1:{port}");
    let listed = blockwire_ok(None, &["iscsi", "discover", &portal]);
    assert!(listed.contains(iqn), "discovery against tgt did not list {iqn}:\n{listed}");
    let url = format!("iscsi://{portal}/{iqn}/1");
    blockwire_ok(None, &["verify", &url, "--size", "64M", "--concurrency", "16"]);
    // Digests and small odd-sized chunks exercise R2T and Data-In splitting.
    blockwire_ok(None, &["verify", &url, "--size", "8M", "--chunk", "12K", "--seed", "7"]);
}

const CHAP_IQN: &str = "iqn.2026-11.org.blockwire.test:secure";

fn secure_serve(port: u16, dir: &TempDir) -> Serve {
    let cfg = format!(
        r#"
[[volume]]
name = "d0"
backend = "ram:32M"
[iscsi]
listen = ["127.0.0.1:{port}"]
[[iscsi.target]]
iqn = "{CHAP_IQN}"
luns = [{{ lun = 0, volume = "d0" }}]
allowed_initiators = ["iqn.2026-11.org.blockwire.test:good"]
chap = {{ user = "alice", secret = "alice-secret-01" }}
"#
    );
    Serve::with_config(dir, &cfg, &[])
}

#[test]
fn logins_refused_with_the_right_status_class() {
    let port = free_port();
    let dir = TempDir::new("iscsineg");
    let serve = secure_serve(port, &dir);
    let good = ["--initiator-name", "iqn.2026-11.org.blockwire.test:good"];
    let verify = |url: &str, extra: &[&str]| {
        let mut args = vec!["verify", url, "--size", "1M"];
        args.extend_from_slice(extra);
        let out = blockwire(None, &args);
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    let (ok, out) = verify(&format!("iscsi://alice%alice-secret-01@127.0.0.1:{port}/{CHAP_IQN}/0"), &good);
    assert!(ok, "correct CHAP login failed:\n{out}");
    let (ok, out) = verify(&format!("iscsi://alice%wrong-secret@127.0.0.1:{port}/{CHAP_IQN}/0"), &good);
    assert!(!ok && out.contains("0x0201"), "wrong secret not refused with 0x0201:\n{out}");
    let (ok, out) = verify(&format!("iscsi://127.0.0.1:{port}/{CHAP_IQN}/0"), &good);
    assert!(!ok && out.contains("0x0201"), "missing CHAP not refused with 0x0201:\n{out}");
    let (ok, out) = verify(&format!("iscsi://alice%alice-secret-01@127.0.0.1:{port}/iqn.2026-11.org.blockwire.test:nope/0"), &good);
    assert!(!ok && out.contains("0x0203"), "unknown target not refused with 0x0203:\n{out}");
    let (ok, out) = verify(
        &format!("iscsi://alice%alice-secret-01@127.0.0.1:{port}/{CHAP_IQN}/0"),
        &["--initiator-name", "iqn.2026-11.org.blockwire.test:intruder"],
    );
    assert!(!ok && out.contains("0x0202"), "initiator outside the ACL not refused with 0x0202:\n{out}");
    // Discovery from outside the ACL sees nothing.
    let out = blockwire(None, &["iscsi", "discover", &format!("127.0.0.1:{port}"), "--initiator-name", "iqn.x:intruder"]);
    let listed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!listed.contains(CHAP_IQN), "discovery leaked a target outside the ACL:\n{listed}");
    let listed = blockwire_ok(None, &["iscsi", "discover", &format!("127.0.0.1:{port}"), "--initiator-name", good[1]]);
    assert!(listed.contains(CHAP_IQN), "discovery did not list the target to an allowed initiator:\n{listed}");
    drop(serve);
}

#[test]
fn discovery_requires_the_portal_chap_secret_when_configured() {
    let port = free_port();
    let dir = TempDir::new("iscsidisc");
    let cfg = format!(
        r#"
[[volume]]
name = "d0"
backend = "ram:16M"
[iscsi]
listen = ["127.0.0.1:{port}"]
discovery_chap = {{ user = "scan", secret = "scan-secret-42" }}
[[iscsi.target]]
iqn = "{CHAP_IQN}"
luns = [{{ lun = 0, volume = "d0" }}]
"#
    );
    let mut serve = Serve::with_config(&dir, &cfg, &[]);
    let discover = |portal: String| {
        let out = blockwire(None, &["iscsi", "discover", &portal]);
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    let (ok, out) = discover(format!("127.0.0.1:{port}"));
    assert!(!ok && out.contains("0x0201"), "discovery without CHAP not refused with 0x0201:\n{out}");
    let (ok, out) = discover(format!("scan%wrong-secret-1@127.0.0.1:{port}"));
    assert!(!ok && out.contains("0x0201"), "discovery with a wrong secret not refused with 0x0201:\n{out}");
    let (ok, out) = discover(format!("scan%scan-secret-42@127.0.0.1:{port}"));
    assert!(ok && out.contains(CHAP_IQN), "discovery with the right secret did not list the target:\n{out}");
    // The target itself has no CHAP: normal sessions need no discovery secret.
    blockwire_ok(None, &["verify", &format!("iscsi://127.0.0.1:{port}/{CHAP_IQN}/0"), "--size", "1M"]);
    assert!(serve.is_running(), "target died:\n{}", serve.log_text());
}

/// LUNs from 16384 up need SAM's extended flat space format. The initiator
/// once had its own LUN encoder without it, so `.../16384` silently reached
/// LUN 0: here LUN 0 is 1 MiB and LUN 16384 is 2 MiB, so a 2 MiB verify only
/// passes on the right LUN.
#[test]
fn luns_above_16383_are_addressed_with_extended_flat_space() {
    let port = free_port();
    let dir = TempDir::new("iscsilun");
    let iqn = "iqn.2026-11.org.blockwire.test:luns";
    let cfg = format!(
        r#"
[[volume]]
name = "small"
backend = "ram:1M"
[[volume]]
name = "big"
backend = "ram:2M"
[[volume]]
name = "mid"
backend = "ram:3M"
[iscsi]
listen = ["127.0.0.1:{port}"]
[[iscsi.target]]
iqn = "{iqn}"
luns = [{{ lun = 0, volume = "small" }}, {{ lun = 300, volume = "mid" }}, {{ lun = 16384, volume = "big" }}]
"#
    );
    let mut serve = Serve::with_config(&dir, &cfg, &[]);
    blockwire_ok(None, &["verify", &format!("iscsi://127.0.0.1:{port}/{iqn}/16384"), "--size", "2M"]);
    blockwire_ok(None, &["verify", &format!("iscsi://127.0.0.1:{port}/{iqn}/300"), "--size", "3M"]);
    let out = blockwire(None, &["verify", &format!("iscsi://127.0.0.1:{port}/{iqn}/16384"), "--size", "3M"]);
    assert!(!out.status.success(), "LUN 16384 is 2 MiB: a 3 MiB verify must fail");
    let out = blockwire(None, &["verify", &format!("iscsi://127.0.0.1:{port}/{iqn}/16777216"), "--size", "1M"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("LUN must be below 16777216"), "{err}");
    assert!(serve.is_running(), "target died:\n{}", serve.log_text());
}

/// Garbage the target must survive, each on its own connection.
fn malformed_streams() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    v.push(vec![0xFF; 4096]); // unknown opcode, absurd lengths
    let mut huge = vec![0u8; 48];
    huge[0] = 0x43;
    huge[5..8].copy_from_slice(&[0xFF, 0xFF, 0xFF]); // 16 MiB data segment during login
    v.push(huge);
    let mut bad_text = vec![0u8; 48];
    bad_text[0] = 0x43;
    bad_text[1] = 0x81;
    bad_text[7] = 8;
    bad_text.extend_from_slice(b"\xff\xfe=\x00ab\x00\x00");
    v.push(bad_text);
    let mut scsi_before_login = vec![0u8; 48];
    scsi_before_login[0] = 0x01;
    v.push(scsi_before_login);
    v.push((0..10_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect());
    v
}

#[test]
fn malformed_pdu_flood_does_not_disturb_other_sessions() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut serve = Serve::start(&["--volume", "d0=ram:64M", "--iscsi", &listen]);
    let iqn = target_iqn(&serve);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let flood = std::thread::spawn(move || {
        let mut n = 0u32;
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            for junk in malformed_streams() {
                if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                    let _ = c.set_write_timeout(Some(Duration::from_millis(200)));
                    let _ = c.write_all(&junk);
                    n += 1;
                }
            }
        }
        n
    });
    let url = format!("iscsi://{listen}/{iqn}/0");
    let out = blockwire(None, &["verify", &url, "--size", "32M", "--concurrency", "16"]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = flood.join().unwrap();
    assert!(
        out.status.success(),
        "verify failed during the flood:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(sent > 10, "flood sent only {sent} connections");
    assert!(serve.is_running(), "target died under malformed PDUs:\n{}", serve.log_text());
    // Still serving afterwards, also with CRC32C digests and odd chunk sizes
    // (R2T and Data-In splitting).
    blockwire_ok(None, &["verify", &url, "--size", "8M", "--chunk", "12K", "--header-digest", "--data-digest", "--seed", "3"]);
}

/// A normal-session login with a chosen ISID over a plain socket, driven by
/// the sans-IO initiator login of bw-iscsi. Returns the connection in full
/// feature phase.
fn raw_login(port: u16, target: &str, isid: [u8; 6]) -> std::net::TcpStream {
    use bw_iscsi::initiator_login::{InitiatorConfig, InitiatorLogin, Progress};
    use bw_iscsi::pdu::{Decoder, Digests};
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut login = InitiatorLogin::new(InitiatorConfig {
        initiator_name: "iqn.2026-11.org.blockwire.test:reinstate".into(),
        target_name: Some(target.into()),
        chap: None,
        mutual_chap: None,
        limits: bw_iscsi::negotiate::LocalLimits::default(),
        isid,
    }, bw_iscsi::chap::ChapEntropy(core::array::from_fn(|i| (i as u8).wrapping_mul(151) ^ isid[5])));
    let dec = Decoder::new(64 * 1024);
    let mut buf = bytes::BytesMut::new();
    let mut req = login.start();
    loop {
        s.write_all(&req.encode(Digests::default())).expect("send login request");
        let resp = loop {
            if let Some(p) = dec.decode(&mut buf).expect("login response decodes") {
                break p;
            }
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).expect("read login response");
            assert!(n > 0, "target closed the connection during login");
            buf.extend_from_slice(&chunk[..n]);
        };
        match login.on_response(&resp).expect("login accepted") {
            Progress::Send(p) => req = p,
            Progress::Done(_) => return s,
        }
    }
}

/// Whether the target has closed `s`: EOF or reset within `wait`. Anything
/// it sends first (an Async Message) is read past.
fn closed_by_target(s: &mut std::net::TcpStream, wait: Duration) -> bool {
    use std::io::Read;
    s.set_read_timeout(Some(wait)).unwrap();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn a_second_login_with_the_same_isid_reinstates_the_session() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut serve = Serve::start(&["--volume", "d0=ram:16M", "--iscsi", &listen]);
    let iqn = target_iqn(&serve);
    let isid = [0x80, 0x00, 0x02, 0x12, 0x34, 0x56];
    let mut first = raw_login(port, &iqn, isid);
    // Another ISID is another session: the first one stays.
    let mut other = raw_login(port, &iqn, [0x80, 0x00, 0x02, 0xAB, 0xCD, 0xEF]);
    assert!(!closed_by_target(&mut first, Duration::from_millis(500)), "a login with another ISID ended the first session");
    let mut second = raw_login(port, &iqn, isid);
    assert!(closed_by_target(&mut first, Duration::from_secs(5)), "the reinstated session's old connection is still open");
    assert!(!closed_by_target(&mut second, Duration::from_millis(300)), "the reinstating connection was closed");
    assert!(!closed_by_target(&mut other, Duration::from_millis(300)), "reinstatement ended an unrelated session");
    assert!(serve.is_running(), "target died:\n{}", serve.log_text());
    drop(serve);
}

/// The other tuning corners of the iSCSI front-end: connections as tasks on
/// the shared runtime, every READ and WRITE on the blocking pool (its
/// results come back to the connection task over a channel), zero-copy
/// reads from 4 KiB on, answers sent after every command (under the former
/// flag name) and after every 8. Each must
/// still verify, digests on and off, and a header digest alone.
#[test]
fn iscsi_tuning_corners_verify() {
    for flags in [
        &[
            "--iscsi-connection-threads",
            "false",
            "--inline-max",
            "0",
        ][..],
        &["--iscsi-zero-copy-min", "4k", "--iscsi-flush-every", "1"][..],
        &["--commands-per-send", "8"][..],
    ] {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec!["--volume", "d=ram:32M", "--iscsi", listen.as_str()];
        args.extend_from_slice(flags);
        let mut serve = Serve::start(&args);
        let url = format!("iscsi://127.0.0.1:{port}/{}/0", target_iqn(&serve));
        // A header digest alone keeps reads below the zero-copy size
        // mapped: each Data-In header (52 bytes with its digest) goes out
        // in one segment with its payload (`Outbox::push_headed`).
        for (digest, chunk) in [(&[][..], "128k"), (&["--header-digest"][..], "16k"), (&["--header-digest", "--data-digest"][..], "128k")] {
            let mut v = vec![
                "verify",
                url.as_str(),
                "--size",
                "16M",
                "--chunk",
                chunk,
                "--concurrency",
                "8",
            ];
            v.extend_from_slice(digest);
            blockwire_ok(None, &v);
        }
        assert!(
            serve.is_running(),
            "{flags:?}: target died:\n{}",
            serve.log_text()
        );
    }
}
