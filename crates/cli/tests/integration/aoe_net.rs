//! AoE end to end over a veth pair: `blockwire serve` inside a namespace,
//! the initiator (CLI and library) and raw frames outside. Needs root.

use crate::common;
use bw_aoe::ata::{self, AFLAG_WRITE};
use bw_aoe::frame::{AoeHeader, Mac};
use bw_aoe::initiator::{self as req, Addr, AtaRequest};
use bw_aoe::mask::{Directive, DirectiveCommand, MCMD_EDIT, MCMD_READ};
use bw_aoe::query_config::ConfigCommand;
use bw_aoe::reserve_release;
use bw_initiator::aoe::AoeClient;
use bw_initiator::{BlockClient, ClientError, ConnectOptions, TargetUrl};
use bw_net::PacketSocket;
use common::*;
use std::time::{Duration, Instant};

/// A target in a namespace: e1.2 = 80 MiB RAM disk, e1.3 = read-only 8 MiB.
fn target(tag: &str, mtu: u32) -> (NetnsPair, Serve) {
    target_on(tag, mtu, "d=ram:80M", &[])
}

/// The same with e1.2 on the given volume, and more `serve` flags.
fn target_on(tag: &str, mtu: u32, volume: &str, extra: &[&str]) -> (NetnsPair, Serve) {
    let pair = NetnsPair::new(tag, mtu);
    let (d, ro) = (format!("{},volume=d,shelf=1,slot=2", pair.ns_if), format!("{},volume=ro,shelf=1,slot=3", pair.ns_if));
    let mut args = vec!["--volume", volume, "--volume", "ro=ram:8M,readonly", "--aoe", &d, "--aoe", &ro];
    args.extend_from_slice(extra);
    let serve = Serve::start_in(Some(&pair.ns), &args);
    (pair, serve)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

fn client(rt: &tokio::runtime::Runtime, iface: &str, slot: u8) -> AoeClient {
    let url = TargetUrl::parse(&format!("aoe://{iface}/1.{slot}")).expect("url");
    let opts = ConnectOptions { timeout: Duration::from_secs(5), ..Default::default() };
    rt.block_on(AoeClient::connect(&url, &opts)).expect("connect")
}

fn end_to_end(mtu: u32, sectors: u8, volume: &str, extra: &[&str]) {
    let (pair, mut serve) = target_on("ae", mtu, volume, extra);
    let out = blockwire_ok(None, &["aoe", "discover", &pair.host_if]);
    assert!(out.contains("e1.2") && out.contains("e1.3"), "discover: {out}");
    assert!(out.contains("80M") && out.contains(&format!("sectors/frame {sectors}")), "discover: {out}");
    let url = format!("aoe://{}/1.2", pair.host_if);
    let v = blockwire_ok(None, &["verify", &url, "--size", "64M"]);
    eprintln!("verify: {v}");

    let rt = runtime();
    let c = client(&rt, &pair.host_if, 2);
    assert_eq!(c.frame_sectors(), sectors);
    assert_eq!(c.size_bytes(), 80 << 20);
    // Unaligned-to-frame sizes and the last sector of the disk.
    let data: Vec<u8> = (0..(sectors as usize * 3 + 1) * 512).map(|i| (i * 7 % 253) as u8).collect();
    let off = (80 << 20) - data.len() as u64;
    rt.block_on(c.write(off, &data)).expect("write at the end");
    let mut back = vec![0u8; data.len()];
    rt.block_on(c.read(off, &mut back)).expect("read at the end");
    assert_eq!(back, data);
    rt.block_on(c.flush()).expect("flush");
    // Reads dropped mid-flight give their slots and window back, and their
    // late replies land nowhere: the client keeps working afterwards.
    for _ in 0..20 {
        let mut big = vec![0u8; 1 << 20];
        let _ = rt.block_on(async { tokio::time::timeout(Duration::from_micros(300), c.read(0, &mut big)).await });
    }
    let mut again = vec![0u8; data.len()];
    rt.block_on(c.read(off, &mut again)).expect("read after cancelled reads");
    assert_eq!(again, data);
    let mut big = vec![0u8; 4 << 20];
    rt.block_on(c.read(0, &mut big)).expect("a full window after cancelled reads");

    // Read-only export: writes fail with an ATA error (ABRT), reads work.
    let ro = client(&rt, &pair.host_if, 3);
    match rt.block_on(ro.write(0, &[1u8; 512])) {
        Err(ClientError::Target(m)) => assert!(m.contains("ABRT") && m.contains("ATA"), "{m}"),
        other => panic!("write to read-only export: {other:?}"),
    }
    let mut b = [0u8; 512];
    rt.block_on(ro.read(0, &mut b)).expect("read-only export still reads");
    assert!(serve.is_running());
    if volume.contains(",direct") {
        assert!(serve.log_text().contains("I/O threads for device-backed exports"), "{}", serve.log_text());
    }
    assert!(serve.stop().success());
}

#[test]
fn aoe_end_to_end_mtu_1500() {
    end_to_end(1500, 2, "d=ram:80M", &[]);
}

/// At MTU 9000 e1.2 is an O_DIRECT file: not memory-backed, so with
/// --aoe-io-threads its frames go through the target's I/O pool.
#[test]
fn aoe_end_to_end_mtu_9000() {
    let dir = TempDir::new_in(env!("CARGO_TARGET_TMPDIR"), "aoe-direct");
    let volume = format!("d=file:{},size=80M,direct", dir.path().join("d.img").display());
    end_to_end(9000, 17, &volume, &["--aoe-io-threads", "32"]);
}

/// Raw frames from made-up MACs, to test per-initiator behaviour.
struct Raw {
    sock: PacketSocket,
    target: Mac,
}

impl Raw {
    fn new(iface: &str, target: Mac) -> Raw {
        let sock = PacketSocket::open(iface, bw_aoe::ETHERTYPE_AOE).expect("packet socket");
        sock.set_recv_timeout(Duration::from_millis(100)).unwrap();
        Raw { sock, target }
    }

    fn to(&self, src: Mac, slot: u8) -> Addr {
        Addr { src, dst: self.target, shelf: 1, slot }
    }

    /// Send `frame` and wait up to `wait` for the reply with the same tag.
    fn exchange(&self, frame: &[u8], wait: Duration) -> Option<Vec<u8>> {
        let tag = AoeHeader::parse(frame).map(|h| h.tag()).ok();
        let src = &frame[6..12];
        self.sock.send(frame).expect("send");
        let deadline = Instant::now() + wait;
        let mut buf = vec![0u8; 9100];
        while Instant::now() < deadline {
            let Ok(n) = self.sock.recv(&mut buf) else { continue };
            let f = &buf[..n];
            if let Ok(h) = AoeHeader::parse(f) {
                if h.is_response() && &f[0..6] == src && (tag.is_none() || Some(h.tag()) == tag) {
                    return Some(f.to_vec());
                }
            }
        }
        None
    }

    fn ata(&self, src: Mac, tag: u32, r: &AtaRequest<'_>) -> Option<Vec<u8>> {
        let mut f = vec![0u8; 9100];
        let n = req::ata(&mut f, &self.to(src, 2), tag, r).unwrap();
        self.exchange(&f[..n], Duration::from_secs(1))
    }

    fn qc(&self, src: Mac, tag: u32) -> Option<Vec<u8>> {
        let mut f = [0u8; 64];
        let n = req::query_config(&mut f, &self.to(src, 2), tag, ConfigCommand::Read, b"").unwrap();
        self.exchange(&f[..n], Duration::from_millis(600))
    }
}

const FAKE: Mac = [0x02, 0xfa, 0x4e, 0, 0, 1];

/// `--metrics` on AoE: reads and writes of the export's volume, frames in
/// and out, and a request sent twice under one tag counted as a resend.
#[test]
fn aoe_metrics_count_reads_writes_frames_and_same_tag_resends() {
    let pair = NetnsPair::new("am", 1500);
    let (_host_ip, ns_ip) = pair.with_ipv4(219);
    let metrics = format!("{ns_ip}:{}", free_port());
    let d = format!("{},volume=d,shelf=1,slot=2", pair.ns_if);
    let serve = Serve::start_in(Some(&pair.ns), &["--volume", "d=ram:8M", "--aoe", &d, "--metrics", &metrics]);
    let rt = runtime();
    let c = client(&rt, &pair.host_if, 2);
    let raw = Raw::new(&pair.host_if, c.target().mac);
    assert!(raw.ata(FAKE, 77, &AtaRequest::read(0, 2)).is_some());
    assert!(raw.ata(FAKE, 77, &AtaRequest::read(0, 2)).is_some(), "a resend is answered too");
    // 4 KiB in frames of 2 sectors (MTU 1500): 4 writes.
    rt.block_on(c.write(0, &[3u8; 4096])).expect("write");
    // A worker counts the replies of a batch after it has sent them: the
    // initiator can hold its last reply before the counter moves (a busy
    // machine widens that window). Scrape until the sent frames are
    // counted; the asserts below then check every figure.
    let sent = |text: &str| metric_sample(text, &format!("blockwire_aoe_frames_sent_total{{interface=\"{}\"}}", pair.ns_if));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut text = scrape_metrics(&metrics);
    while sent(&text) < 6.0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
        text = scrape_metrics(&metrics);
    }
    let v = |name: &str, op: &str| metric_sample(&text, &format!("{name}{{volume=\"d\",protocol=\"aoe\",op=\"{op}\"}}"));
    assert!(v("blockwire_volume_operations_total", "read") >= 2.0, "{text}");
    assert_eq!(v("blockwire_volume_operations_total", "write"), 4.0, "{text}");
    assert_eq!(v("blockwire_volume_bytes_total", "write"), 4096.0, "{text}");
    assert_eq!(v("blockwire_volume_errors_total", "write"), 0.0, "{text}");
    let iface = |name: &str| metric_sample(&text, &format!("{name}{{interface=\"{}\"}}", pair.ns_if));
    assert_eq!(iface("blockwire_aoe_retransmits_total"), 1.0, "{text}");
    assert!(iface("blockwire_aoe_frames_received_total") >= 6.0 && iface("blockwire_aoe_frames_sent_total") >= 6.0, "{text}");
    assert!(serve.stop().success());
}

#[test]
fn aoe_reserve_release_and_mac_mask() {
    let (pair, mut serve) = target("ar", 1500);
    let rt = runtime();
    let c = client(&rt, &pair.host_if, 2);
    let me = bw_net::interface_info(&pair.host_if).unwrap().mac;
    let raw = Raw::new(&pair.host_if, c.target().mac);

    // Reserve for ourselves: the other MAC gets error 6 on ATA, IDENTIFY still answers.
    assert_eq!(rt.block_on(c.reserve_release(reserve_release::RCMD_SET, &[me])).unwrap(), vec![me]);
    let r = raw.ata(FAKE, 1, &AtaRequest::write(0, &[9u8; 512])).expect("reply to reserved write");
    assert_eq!((r[14], r[15]), (0x1C, 6), "error 6 target reserved");
    let r = raw.ata(FAKE, 2, &AtaRequest::simple(ata::CMD_IDENTIFY_DEVICE)).expect("identify reply");
    assert_eq!(r[14], 0x18);
    // The other MAC cannot take it with rcmd 1, and we can still write.
    let mut f = [0u8; 64];
    let n = req::reserve(&mut f, &raw.to(FAKE, 2), 3, reserve_release::RCMD_SET, &[FAKE]).unwrap();
    let r = raw.exchange(&f[..n], Duration::from_secs(1)).expect("reserve reply");
    assert_eq!((r[14], r[15]), (0x1C, 6));
    rt.block_on(c.write(0, &[1u8; 1024])).expect("holder writes");
    // Force set by the other MAC locks us out.
    let n = req::reserve(&mut f, &raw.to(FAKE, 2), 4, reserve_release::RCMD_FORCE_SET, &[FAKE]).unwrap();
    let r = raw.exchange(&f[..n], Duration::from_secs(1)).expect("force reply");
    assert_eq!(&r[24..32], &[2, 1, 0x02, 0xfa, 0x4e, 0, 0, 1]);
    match rt.block_on(c.write(0, &[1u8; 512])) {
        Err(ClientError::Target(m)) => assert!(m.contains("reserved"), "{m}"),
        other => panic!("write while reserved by another MAC: {other:?}"),
    }
    // Release by the holder; everyone may write again.
    let n = req::reserve(&mut f, &raw.to(FAKE, 2), 5, reserve_release::RCMD_SET, &[]).unwrap();
    assert_eq!(&raw.exchange(&f[..n], Duration::from_secs(1)).expect("release")[24..26], &[1, 0]);
    rt.block_on(c.write(0, &[2u8; 512])).expect("write after release");
    assert_eq!(rt.block_on(c.reserve_release(reserve_release::RCMD_READ, &[])).unwrap(), Vec::<Mac>::new());

    // MAC mask: only our MAC is served; the other one gets silence.
    assert!(raw.qc(FAKE, 10).is_some());
    let add = Directive { command: DirectiveCommand::Add, mac: me };
    let (merr, list) = rt.block_on(c.mac_mask(MCMD_EDIT, &[add])).unwrap();
    assert_eq!((merr, list.len()), (0, 1));
    assert_eq!(list[0].mac, me);
    assert!(raw.qc(FAKE, 11).is_none(), "masked MAC must get no reply");
    assert!(raw.ata(FAKE, 12, &AtaRequest::read(0, 1)).is_none());
    let mut b = [0u8; 512];
    rt.block_on(c.read(0, &mut b)).expect("listed MAC still served");
    assert_eq!(b, [2u8; 512]);
    // Bad directive: merror 2.
    let bad = Directive { command: DirectiveCommand::Other(7), mac: FAKE };
    assert_eq!(rt.block_on(c.mac_mask(MCMD_EDIT, &[bad])).unwrap().0, 2);
    // Delete: open again.
    let del = Directive { command: DirectiveCommand::Delete, mac: me };
    assert_eq!(rt.block_on(c.mac_mask(MCMD_EDIT, &[del])).unwrap(), (0, vec![]));
    assert!(raw.qc(FAKE, 13).is_some());
    assert_eq!(rt.block_on(c.mac_mask(MCMD_READ, &[])).unwrap(), (0, vec![]));

    // Config string: set if empty, then a different set fails with error 4;
    // test-exact mismatch gets no reply (a timeout for the client).
    let t = rt.block_on(c.query_config(ConfigCommand::SetIfEmpty, b"owner=test")).unwrap();
    assert_eq!(t.config, b"owner=test");
    match rt.block_on(c.query_config(ConfigCommand::SetIfEmpty, b"other")) {
        Err(ClientError::Target(m)) => assert!(m.contains("error 4"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(rt.block_on(c.query_config(ConfigCommand::TestPrefix, b"owner")).is_ok());
    let out = blockwire_ok(None, &["aoe", "discover", &pair.host_if]);
    assert!(out.contains("owner=test"), "discover shows the config string: {out}");
    assert!(serve.is_running());
}

#[test]
fn aoe_malformed_frames_do_not_stop_the_target() {
    let (pair, mut serve) = target("am", 1500);
    let rt = runtime();
    let c = client(&rt, &pair.host_if, 2);
    let raw = Raw::new(&pair.host_if, c.target().mac);
    let mut f = vec![0u8; 2000];
    let n = req::ata(&mut f, &raw.to(FAKE, 2), 100, &AtaRequest::read(0, 1)).unwrap();

    // Shorter than an AoE header: ignored.
    raw.sock.send(&f[..20]).unwrap();
    // Truncated ATA argument: bad argument (error 2).
    let r = raw.exchange(&f[..30], Duration::from_secs(1)).expect("reply to truncated arg");
    assert_eq!((r[14], r[15]), (0x1C, 2));
    // Wrong version: error 5.
    let mut v = f[..n].to_vec();
    v[14] = 0x20;
    let r = raw.exchange(&v, Duration::from_secs(1)).expect("reply to version 2");
    assert_eq!((r[14], r[15]), (0x1C, 5));
    // Sector count above what the MTU allows (2 at 1500), and zero: error 2.
    for (tag, count) in [(101u32, 3u8), (102, 0), (103, 255)] {
        let mut b = f[..n].to_vec();
        b[20..24].copy_from_slice(&tag.to_be_bytes());
        b[26] = count;
        let r = raw.exchange(&b, Duration::from_secs(1)).expect("reply to bad count");
        assert_eq!((r[14], r[15]), (0x1C, 2), "count {count}");
    }
    // Write announcing 2 sectors carrying 1: error 2.
    let data = [7u8; 1024];
    let wn = req::ata(&mut f, &raw.to(FAKE, 2), 104, &AtaRequest::write(0, &data)).unwrap();
    let r = raw.exchange(&f[..wn - 512], Duration::from_secs(1)).expect("reply to short write");
    assert_eq!((r[14], r[15]), (0x1C, 2));
    // Write flag on a READ command: error 2.
    let mut b = f[..36].to_vec();
    b[27] = ata::CMD_READ_SECTORS_EXT;
    b[24] |= AFLAG_WRITE;
    b.resize(60, 0);
    let r = raw.exchange(&b, Duration::from_secs(1)).expect("reply");
    assert_eq!((r[14], r[15]), (0x1C, 2));
    // LBA past the end: ATA status ERR with IDNF, not the E flag.
    let r = raw.ata(FAKE, 105, &AtaRequest::read((80 << 20) / 512, 1)).expect("reply past end");
    assert_eq!(r[14], 0x18);
    assert_eq!(r[27] & ata::STATUS_ERR, ata::STATUS_ERR);
    assert_eq!(r[25] & ata::ERR_IDNF, ata::ERR_IDNF);
    // Unknown AoE command: error 1. Unknown ATA command: ABRT.
    let mut u = f[..60].to_vec();
    u[19] = 0x42;
    let r = raw.exchange(&u, Duration::from_secs(1)).expect("reply to unknown command");
    assert_eq!((r[14], r[15]), (0x1C, 1));
    let r = raw.ata(FAKE, 106, &AtaRequest::simple(0x99)).expect("reply to unknown ATA");
    assert_eq!((r[27], r[25]), (ata::STATUS_DRDY | ata::STATUS_ERR, ata::ERR_ABRT));
    // A stream of random garbage with the AoE EtherType.
    let mut seed = 0x1234_5678u32;
    for _ in 0..500 {
        let len = 14 + (seed % 1400) as usize;
        let mut g = vec![0u8; len];
        for b in g.iter_mut() {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            *b = (seed >> 16) as u8;
        }
        g[0..6].copy_from_slice(&raw.target);
        g[6..12].copy_from_slice(&FAKE);
        g[12] = 0x88;
        g[13] = 0xa2;
        raw.sock.send(&g).unwrap();
    }
    // Still serving, correctly.
    assert!(serve.is_running());
    let data: Vec<u8> = (0..8192).map(|i| (i % 256) as u8).collect();
    rt.block_on(c.write(4096, &data)).expect("write after garbage");
    let mut back = vec![0u8; 8192];
    rt.block_on(c.read(4096, &mut back)).expect("read after garbage");
    assert_eq!(back, data);
    assert!(serve.stop().success());
}

#[test]
fn aoe_frames_decode_cleanly_in_tshark() {
    if std::process::Command::new("tshark").arg("--version").output().is_err() {
        panic!("tshark is not installed (Debian package tshark)");
    }
    let (pair, _serve) = target("at", 9000);
    let dir = TempDir::new("aoecap");
    let cap = dir.path().join("aoe.pcapng");
    let mut dumpcap = std::process::Command::new("dumpcap")
        .args(["-q", "-i", &pair.host_if, "-f", "ether proto 0x88a2", "-w"])
        .arg(&cap)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn dumpcap");
    // dumpcap opens the interface before it creates the file: from then
    // on every frame is captured (one sent the moment the file appeared
    // was, 8 times of 8 beside stress-ng).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cap.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    blockwire_ok(None, &["aoe", "discover", &pair.host_if]);
    // An ATA error reply (read-only export) is in the capture too. It goes
    // first so the frames after it push it through dumpcap's buffers: the
    // last frames before SIGINT were sometimes missing on a loaded machine.
    // The initiator on AF_PACKET: frames an XDP program takes to an AF_XDP
    // socket (and those it sends) pass no capture on its interface.
    let rt = runtime();
    let url = TargetUrl::parse(&format!("aoe://{}/1.3", pair.host_if)).unwrap();
    let opts = ConnectOptions { timeout: Duration::from_secs(5), aoe_datapath: bw_net::Datapath::Packet, ..Default::default() };
    let ro = rt.block_on(AoeClient::connect(&url, &opts)).expect("connect");
    assert!(rt.block_on(ro.write(0, &[0u8; 512])).is_err());
    blockwire_ok(None, &["verify", &format!("aoe://{}/1.2", pair.host_if), "--size", "2M", "--aoe-datapath", "packet"]);
    // Stop once the capture holds what the checks below look for: dumpcap
    // writes each frame as it takes it, so the file is read as it grows
    // (tshark's status is not checked here: the last frame may be half
    // written).
    let live = |filter: &str| {
        let out = std::process::Command::new("tshark").arg("-r").arg(&cap).args(["-Y", filter, "-T", "fields", "-e", "frame.number"]).output().expect("tshark");
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while live("aoe") <= 100 || live("aoe.ata.status == 0x41") == 0 {
        assert!(Instant::now() < deadline, "the capture does not hold 100 AoE frames and the ATA error reply 60 s after they were sent");
        std::thread::sleep(Duration::from_millis(200));
    }
    // SAFETY: signalling our own child by PID.
    unsafe { libc::kill(dumpcap.id() as i32, libc::SIGINT) };
    let _ = dumpcap.wait();

    let tshark = |args: &[&str]| {
        let out = std::process::Command::new("tshark").arg("-r").arg(&cap).args(args).output().expect("tshark");
        // A bad display filter must fail the test, not read as "no matches".
        assert!(out.status.success(), "tshark {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let total = tshark(&["-T", "fields", "-e", "frame.number"]).lines().count();
    let aoe = tshark(&["-Y", "aoe", "-T", "fields", "-e", "frame.number"]).lines().count();
    assert!(total > 100, "captured only {total} frames");
    assert_eq!(aoe, total, "every frame decodes as AoE");
    let bad = tshark(&["-Y", "_ws.malformed || _ws.expert.severity >= 6291456"]);
    assert!(bad.trim().is_empty(), "malformed or expert warnings:\n{bad}");
    let expert = tshark(&["-q", "-z", "expert"]);
    assert!(!expert.contains("Malformed") && !expert.contains("Warnings (") && !expert.contains("Errors ("), "{expert}");
    // The ATA error reply is there and decodes with its status.
    let errs = tshark(&["-Y", "aoe.ata.status == 0x41"]);
    assert!(!errs.trim().is_empty(), "ATA error reply not found in the capture");
}

/// Our initiator against vblade (a real peer, advertising 16 buffers):
/// verify must pass and the window must respect vblade's buffer count.
#[test]
fn aoe_initiator_against_vblade() {
    let vblade = std::process::Command::new("sh").args(["-c", "command -v vblade"]).output().expect("sh");
    assert!(vblade.status.success(), "vblade is not installed (Debian package vblade)");
    let pair = NetnsPair::new("av", 9000);
    let dir = TempDir::new("aoevb");
    let img = dir.path().join("vblade.img");
    std::fs::File::create(&img).unwrap().set_len(32 << 20).unwrap();
    let _vb = Vblade::start(&pair, 4, 5, &img);
    let url = format!("aoe://{}/4.5", pair.host_if);
    blockwire_ok(None, &["verify", &url, "--size", "16M", "--concurrency", "16"]);
    let rt = runtime();
    let u = TargetUrl::parse(&url).unwrap();
    let c = rt.block_on(AoeClient::connect(&u, &ConnectOptions::default())).expect("connect to vblade");
    assert_eq!(c.target().buffer_count, 16, "vblade's default buffer count");
    assert!(c.window() <= 16);
    let data = vec![0xA5u8; 1 << 20];
    rt.block_on(c.write(1 << 20, &data)).expect("write 1 MiB to vblade");
    let mut back = vec![0u8; 1 << 20];
    rt.block_on(c.read(1 << 20, &mut back)).expect("read back");
    assert_eq!(back, data);
    assert!(c.window() <= 16);
    assert_eq!(c.retransmits(), 0, "no frame should be lost within vblade's buffer count");
}

/// Access control: e1.2 allows only our interface's MAC, e1.3 anyone. A
/// station off the list gets no reply to anything (and cannot edit the mask
/// list or force a reservation), the mask list cannot be edited from the
/// wire, and an ATA write to the broadcast shelf and slot changes nothing.
#[test]
fn aoe_allow_list_and_broadcast_writes() {
    let pair = NetnsPair::new("al", 1500);
    let me = bw_net::interface_info(&pair.host_if).unwrap().mac;
    let allowed = format!("{},volume=a,shelf=1,slot=2,allow={}", pair.ns_if, bw_aoe::frame::format_mac(&me));
    let open = format!("{},volume=b,shelf=1,slot=3", pair.ns_if);
    let mut serve = Serve::start_in(Some(&pair.ns), &["--volume", "a=ram:8M", "--volume", "b=ram:8M", "--aoe", &allowed, "--aoe", &open]);
    let rt = runtime();
    let a = client(&rt, &pair.host_if, 2);
    let b = client(&rt, &pair.host_if, 3);
    let raw = Raw::new(&pair.host_if, a.target().mac);
    let wait = Duration::from_secs(1);
    let mut f = vec![0u8; 2000];

    // FAKE is not on e1.2's list: silence for every command, and no effect.
    assert!(raw.qc(FAKE, 1).is_none(), "a station off the allow-list must get no reply");
    assert!(raw.ata(FAKE, 2, &AtaRequest::write(0, &[0xEE; 512])).is_none());
    let n = req::reserve(&mut f, &raw.to(FAKE, 2), 3, reserve_release::RCMD_FORCE_SET, &[FAKE]).unwrap();
    assert!(raw.exchange(&f[..n], wait).is_none(), "FORCE_SET from a station off the allow-list");
    let add_fake = Directive { command: DirectiveCommand::Add, mac: FAKE };
    let n = req::mac_mask(&mut f, &raw.to(FAKE, 2), 4, MCMD_EDIT, &[add_fake]).unwrap();
    assert!(raw.exchange(&f[..n], wait).is_none());
    // The allowed station cannot edit the list either (merror 1); it reads
    // as the allow-list, and the reservation list stayed empty.
    assert_eq!(rt.block_on(a.mac_mask(MCMD_EDIT, &[add_fake])).unwrap(), (1, vec![]));
    let del_me = Directive { command: DirectiveCommand::Delete, mac: me };
    assert_eq!(rt.block_on(a.mac_mask(MCMD_EDIT, &[del_me])).unwrap().0, 1);
    let (merr, list) = rt.block_on(a.mac_mask(MCMD_READ, &[])).unwrap();
    assert_eq!((merr, list.iter().map(|d| d.mac).collect::<Vec<_>>()), (0, vec![me]));
    assert_eq!(rt.block_on(a.reserve_release(reserve_release::RCMD_READ, &[])).unwrap(), Vec::<Mac>::new());
    assert!(raw.qc(FAKE, 5).is_none(), "still no reply after the edits");
    // e1.3 has no list: FAKE is served there.
    let n = req::query_config(&mut f, &raw.to(FAKE, 3), 6, ConfigCommand::Read, b"").unwrap();
    assert!(raw.exchange(&f[..n], wait).is_some());

    // One ATA write to every shelf and slot, from an allowed MAC: ignored
    // by both exports.
    let everyone = Addr { src: me, dst: bw_aoe::BROADCAST_MAC, shelf: 0xFFFF, slot: 0xFF };
    let n = req::ata(&mut f, &everyone, 7, &AtaRequest::write(0, &[0xBB; 512])).unwrap();
    assert!(raw.exchange(&f[..n], wait).is_none(), "a broadcast write must get no reply");
    for (c, name) in [(&a, "e1.2"), (&b, "e1.3")] {
        let mut back = [0u8; 512];
        rt.block_on(c.read(0, &mut back)).expect("read");
        assert_eq!(back, [0u8; 512], "{name} was written by a station off its list or by a broadcast");
    }
    // The allowed station itself writes as usual.
    rt.block_on(a.write(0, &[0xAA; 512])).expect("write from the allowed MAC");
    assert!(serve.is_running());
    assert!(serve.stop().success());
}

/// `blockwire ctl` against the running target, whose socket is a file (it
/// works across network namespaces); the reply's stdout.
fn ctl(sock: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut a = vec!["ctl", "--control", sock.to_str().unwrap()];
    a.extend_from_slice(args);
    blockwire(None, &a)
}

/// Live AoE exports: `aoe_export_add` makes e1.7 appear on the interface
/// serve listens on (discover finds it, the initiator verifies it, the
/// saved configuration has it), `aoe_export_remove` makes it silent
/// (connecting fails within the client's timeout), while writes and reads
/// on e1.2 go on throughout without an error.
#[test]
fn aoe_exports_added_and_removed_live() {
    let dir = TempDir::new("aoelive");
    let sock = dir.path().join("control.sock");
    let (pair, mut serve) = target_on("lv", 1500, "d=ram:16M", &["--volume", "n=ram:8M", "--control", sock.to_str().unwrap()]);
    let host_if = pair.host_if.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Stops the I/O thread however this test ends.
    struct StopOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let _stop_guard = StopOnDrop(stop.clone());
    let io = {
        let (host_if, stop) = (host_if.clone(), stop.clone());
        std::thread::spawn(move || -> Result<u32, String> {
            let rt = runtime();
            let c = client(&rt, &host_if, 2);
            let mut rounds = 0u32;
            // At least a few rounds, so the I/O overlaps the changes.
            while rounds < 3 || !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let data: Vec<u8> = (0..64 << 10).map(|i| (i as u32 * 13 + rounds) as u8).collect();
                let off = (rounds as u64 % 200) << 16;
                rt.block_on(c.write(off, &data)).map_err(|e| format!("write in round {rounds}: {e}"))?;
                let mut back = vec![0u8; data.len()];
                rt.block_on(c.read(off, &mut back)).map_err(|e| format!("read in round {rounds}: {e}"))?;
                if back != data {
                    return Err(format!("round {rounds}: read back differs"));
                }
                rounds += 1;
            }
            Ok(rounds)
        })
    };
    let ok = |args: &[&str]| {
        let o = ctl(&sock, args);
        assert!(o.status.success(), "ctl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let e17 = format!(r#"{{"interface": "{}", "shelf": 1, "slot": 7}}"#, pair.ns_if);
    let add = format!(r#"{{"interface": "{}", "shelf": 1, "slot": 7, "volume": "n"}}"#, pair.ns_if);
    let out = ok(&["aoe_export_add", &add]);
    assert!(out.contains("e1.7") && out.contains("added"), "{out}");
    let found = blockwire_ok(None, &["aoe", "discover", &host_if]);
    assert!(found.contains("e1.7") && found.contains("e1.2"), "discover: {found}");
    blockwire_ok(None, &["verify", &format!("aoe://{host_if}/1.7"), "--size", "4M"]);
    let saved = dir.path().join("saved.toml");
    ok(&["save_config", &format!(r#"{{"path": "{}"}}"#, saved.display())]);
    let text = std::fs::read_to_string(&saved).unwrap();
    assert!(text.contains("slot = 7") && text.contains("volume = \"n\""), "{text}");
    // Refused, nothing changed: the volume is in use, the interface not served.
    let o = ctl(&sock, &["volume_remove", r#"{"name": "n"}"#]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("AoE 1.7"), "{o:?}");
    let o = ctl(&sock, &["aoe_export_add", r#"{"interface": "lo", "shelf": 1, "slot": 8, "volume": "n"}"#]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("not served on lo"), "{o:?}");

    let out = ok(&["aoe_export_remove", &e17]);
    assert!(out.contains("e1.7") && out.contains("removed"), "{out}");
    let rt = runtime();
    let url = TargetUrl::parse(&format!("aoe://{host_if}/1.7")).unwrap();
    let opts = ConnectOptions { timeout: Duration::from_secs(2), ..Default::default() };
    assert!(rt.block_on(AoeClient::connect(&url, &opts)).is_err(), "e1.7 still answers after its removal");
    ok(&["volume_remove", r#"{"name": "n"}"#]);

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = io.join().expect("I/O thread").unwrap_or_else(|e| panic!("I/O on e1.2 failed during the changes: {e}"));
    eprintln!("e1.2: {rounds} write/read rounds during the changes");
    assert!(serve.is_running());
    assert!(serve.stop().success());
}
