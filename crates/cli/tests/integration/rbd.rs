//! Ceph RBD behind blockwire gateways (issue 14), with our own initiators:
//! every protocol on an `rbd:` volume, two gateways sharing one image (and
//! growing it), the backend's flush/discard/write-zeroes/size, and a Ceph outage under load.
//! The Linux host against two gateways is in `rbd_gateways`.

use crate::common;

use crate::common::nvme_raw::RawNvme;
use crate::control::{admin_waiting_for_events, changed_namespace_log, ctl, ctl_err, status, wait_for_event};
use bw_nvme::identify::cns;
use bw_nvme::pdu::Pdu;
use bw_nvme::queue_entry::{admin, sgl, Sgl, Sqe};
use common::blockwire_ok;
use common::ceph::{gateway_toml, Ceph, Gateway, GATEWAY_IQN as IQN, GATEWAY_NQN as NQN};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn qemu_img(args: &[&str]) {
    let out = std::process::Command::new("qemu-img")
        .args(args)
        .output()
        .expect("spawn qemu-img");
    assert!(
        out.status.success(),
        "qemu-img {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn gateway<'a>(
    image: &'a str,
    group: u16,
    iscsi_port: u16,
    nvme_port: u16,
    aoe_if: Option<&'a str>,
    timeout_s: u32,
) -> Gateway<'a> {
    Gateway {
        image,
        group,
        preferred: group == 1,
        iscsi_port,
        nvme_port,
        aoe_if,
        timeout_s,
    }
}

/// `verify` over iSCSI, NVMe/TCP and AoE (on a veth, initiator in a
/// namespace) against an `rbd:` volume; then data written through gateway A
/// (qemu-img over libiscsi) reads back through a second gateway B on the
/// same image, and `rbd export` (straight from the cluster) agrees.
#[test]
fn rbd_volume_serves_every_protocol_and_two_gateways_share_it() {
    common::require_root();
    let ceph = Ceph::shared();
    let image = format!("shared{}", common::unique(""));
    ceph.rbd(&[
        "create",
        "--size",
        "64M",
        "--image-feature",
        "layering",
        &format!("rbd/{image}"),
    ]);
    let pair = common::NetnsPair::new("rbd", 1500);
    let dir = common::TempDir::new("rbd-gw");
    let (ia, na) = (common::free_port(), common::free_port());
    let sock_a = dir.path().join("control.sock");
    let a = common::Serve::with_config(
        &dir,
        &gateway_toml(ceph, &gateway(&image, 1, ia, na, Some(&pair.host_if), 8)),
        &["--control", sock_a.to_str().expect("utf-8")],
    );

    blockwire_ok(
        None,
        &[
            "verify",
            &format!("iscsi://127.0.0.1:{ia}/{IQN}/0"),
            "--size",
            "8M",
            "--concurrency",
            "16",
        ],
    );
    blockwire_ok(
        None,
        &[
            "verify",
            &format!("nvme+tcp://127.0.0.1:{na}/{NQN}/1"),
            "--size",
            "8M",
            "--offset",
            "8M",
            "--concurrency",
            "16",
            "--seed",
            "2",
        ],
    );
    blockwire_ok(
        Some(&pair.ns),
        &[
            "verify",
            &format!("aoe://{}/7.1", pair.ns_if),
            "--size",
            "4M",
            "--offset",
            "16M",
            "--seed",
            "3",
        ],
    );

    let dir_b = common::TempDir::new("rbd-gwb");
    let (ib, nb) = (common::free_port(), common::free_port());
    let sock_b = dir_b.path().join("control.sock");
    let b = common::Serve::with_config(
        &dir_b,
        &gateway_toml(ceph, &gateway(&image, 2, ib, nb, None, 8)),
        &["--control", sock_b.to_str().expect("utf-8")],
    );
    let src = dir.path().join("src.bin");
    let back = dir.path().join("back.bin");
    let exported = dir.path().join("export.bin");
    let data: Vec<u8> = (0..64u32 << 20)
        .map(|i| (i.wrapping_mul(2_246_822_519) >> 11) as u8)
        .collect();
    std::fs::write(&src, &data).expect("write source");
    qemu_img(&[
        "convert",
        "-n",
        "-f",
        "raw",
        "-O",
        "raw",
        src.to_str().expect("utf-8"),
        &format!("iscsi://127.0.0.1:{ia}/{IQN}/0"),
    ]);
    qemu_img(&[
        "convert",
        "-f",
        "raw",
        "-O",
        "raw",
        &format!("iscsi://127.0.0.1:{ib}/{IQN}/0"),
        back.to_str().expect("utf-8"),
    ]);
    assert!(
        std::fs::read(&back).expect("read back") == data,
        "gateway B returned other data than was written through gateway A"
    );
    ceph.rbd(&[
        "export",
        "--no-progress",
        &format!("rbd/{image}"),
        exported.to_str().expect("utf-8"),
    ]);
    assert!(
        std::fs::read(&exported).expect("read export") == data,
        "rbd export differs from what gateway A acknowledged"
    );
    grow_through_both_gateways(ceph, &image, [(&sock_a, na, ia), (&sock_b, nb, ib)], &dir);
    follow_resizes_made_elsewhere(ceph, &image, [(&sock_a, na, &dir), (&sock_b, nb, &dir_b)], &b);
    assert!(
        a.stop().success() && b.stop().success(),
        "a gateway did not stop cleanly"
    );
    ceph.rbd_rm(&format!("rbd/{image}"));
}

/// A raw NVMe host's checks that its gateway told it of a resize:
/// Namespace Attribute Changed (the AER it left outstanding, cid 40),
/// Changed Namespace List [1], Identify Namespace's NSZE `size`; then it
/// waits for the next event.
fn host_told(q: &mut RawNvme, who: &str, size: u64) {
    match q.next(RawNvme::WAIT) {
        Some(Pdu::CapsuleResp(c)) => assert_eq!((c.cid, c.result), (40, bw_nvme::controller::AEN_NS_CHANGED as u64), "{who}"),
        p => panic!("{who}'s host got no Namespace Attribute Changed event: {:?}", p.map(|p| p.kind())),
    }
    assert_eq!(changed_namespace_log(q), [1], "{who}");
    assert_eq!(nsze(q), size, "{who}: Identify Namespace's size");
    wait_for_event(q);
}

/// Identify Namespace 1's size (NSZE) in bytes.
fn nsze(q: &mut RawNvme) -> u64 {
    let mut s = Sqe::new(admin::IDENTIFY, 50, 1);
    s.set_cdw(10, cns::NAMESPACE as u32);
    s.set_sgl(Sgl { addr: 0, length: 4096, kind: sgl::TRANSPORT });
    let (c, d) = q.exchange(s, &[]).expect("Identify Namespace answered");
    assert!(c.status.is_success(), "{c:?}");
    u64::from_le_bytes(d[..8].try_into().expect("8 bytes")) * 512
}

/// Volume v's size as a gateway's `status` says it.
fn size_of(sock: &std::path::Path) -> Option<u64> {
    status(sock)["volumes"][0]["size"].as_u64()
}

/// Growing the shared image 64 -> 96 MiB through gateway A's control API
/// (`volume_resize`, as ControllerExpandVolume does): A grows the image
/// (`rbd info` says so) and tells its NVMe host; B, never told, follows
/// by itself (its librbd update watch) and tells its own host the same
/// way. Shrinking is refused and changes nothing. The new end, written
/// through B, reads back through A (iSCSI, a fresh session: READ CAPACITY
/// says 96 MiB) as `rbd export` has it.
fn grow_through_both_gateways(ceph: &Ceph, image: &str, gateways: [(&std::path::Path, u16, u16); 2], dir: &common::TempDir) {
    const NEW: u64 = 96 << 20;
    let rbd_size = || ceph.rbd(&["info", "--format", "json", &format!("rbd/{image}")]).parse::<serde_json::Value>().expect("rbd info json")["size"].as_u64();
    let mut hosts: Vec<RawNvme> = gateways.iter().map(|(_, np, _)| admin_waiting_for_events(*np, NQN)).collect();

    ctl(gateways[0].0, &["volume_resize", r#"{"name": "v", "size": "96M"}"#]);
    assert_eq!(rbd_size(), Some(NEW), "the image did not grow");
    host_told(&mut hosts[0], "gateway A", NEW);
    host_told(&mut hosts[1], "gateway B (not told, following the image)", NEW);
    assert_eq!(size_of(gateways[1].0), Some(NEW), "gateway B's status");
    let e = ctl_err(gateways[0].0, &["volume_resize", r#"{"name": "v", "size": "32M"}"#]);
    assert!(e.contains("not shrunk"), "{e}");
    assert_eq!((rbd_size(), size_of(gateways[0].0)), (Some(NEW), Some(NEW)), "a refused shrink changed something");

    blockwire_ok(None, &["verify", &format!("nvme+tcp://127.0.0.1:{}/{NQN}/1", gateways[1].1), "--size", "16M", "--offset", "80M", "--seed", "9"]);
    let (via_a, exported) = (dir.path().join("grown-a.bin"), dir.path().join("grown-export.bin"));
    qemu_img(&["convert", "-f", "raw", "-O", "raw", &format!("iscsi://127.0.0.1:{}/{IQN}/0", gateways[0].2), via_a.to_str().expect("utf-8")]);
    ceph.rbd(&["export", "--no-progress", &format!("rbd/{image}"), exported.to_str().expect("utf-8")]);
    let (via_a, exported) = (std::fs::read(&via_a).expect("read"), std::fs::read(&exported).expect("read"));
    assert_eq!(via_a.len() as u64, NEW, "gateway A's LUN is not the grown size");
    assert!(via_a == exported, "gateway A reads other data than the image has after B wrote its new end");
    assert!(via_a[(80 << 20)..].iter().any(|&b| b != 0), "nothing of B's write past the old end");
}

/// Resizes neither gateway was told of: `rbd resize` from Ceph's CLI grows
/// the image to 128 MiB, then shrinks it (`--allow-shrink`) to 112 MiB.
/// Each gateway follows by itself (status, its NVMe host told, the new
/// `size=` in its configuration file); after the shrink a request past the
/// new end is refused and the gateway says why in its log. Removing the
/// volume from B ends B's update watch: none left in the process, and a
/// later resize, which A follows, reaches nothing of B's.
fn follow_resizes_made_elsewhere(ceph: &Ceph, image: &str, gateways: [(&std::path::Path, u16, &common::TempDir); 2], b: &common::Serve) {
    let mut hosts: Vec<RawNvme> = gateways.iter().map(|(_, np, _)| admin_waiting_for_events(*np, NQN)).collect();
    let followed = |hosts: &mut [RawNvme], size: u64, spelled: &str| {
        for (i, (sock, _, dir)) in gateways.iter().enumerate() {
            let who = format!("gateway {} after rbd resize to {spelled}", ["A", "B"][i]);
            host_told(&mut hosts[i], &who, size);
            assert_eq!(size_of(sock), Some(size), "{who}: status");
            let saved = std::fs::read_to_string(dir.path().join("serve.toml")).expect("read serve.toml");
            assert!(saved.contains(&format!(",size={spelled}")), "{who}: serve.toml does not have the new size:\n{saved}");
        }
    };
    let rbd_resize = |size: &str, extra: &[&str]| ceph.rbd(&[&["resize", "--no-progress", "--size", size], extra, &[&format!("rbd/{image}")]].concat());

    rbd_resize("128M", &[]);
    followed(&mut hosts, 128 << 20, "128M");
    rbd_resize("112M", &["--allow-shrink"]);
    followed(&mut hosts, 112 << 20, "112M");
    assert!(b.log_text().contains("shrank from 134217728 to 117440512 bytes outside this gateway"), "gateway B did not log the shrink:\n{}", b.log_text());
    let past_end = common::blockwire(None, &["verify", &format!("nvme+tcp://127.0.0.1:{}/{NQN}/1", gateways[1].1), "--size", "1M", "--offset", "112M"]);
    let err = String::from_utf8_lossy(&past_end.stderr);
    assert!(!past_end.status.success() && err.contains("range"), "a write past the shrunk end through B: {}\n{err}", past_end.status);

    let (sock_b, sock_a) = (gateways[1].0, gateways[0].0);
    assert_eq!((status(sock_b)["volumes"][0]["size_watched"].as_bool(), status(sock_b)["rbd_update_watches"].as_u64()), (Some(true), Some(1)));
    ctl(sock_b, &["volume_remove", r#"{"name": "v", "force": true}"#]);
    assert_eq!(status(sock_b)["rbd_update_watches"].as_u64(), Some(0), "B's update watch outlived its volume");
    rbd_resize("120M", &[]);
    host_told(&mut hosts[0], "gateway A after rbd resize to 120M", 120 << 20);
    assert_eq!(size_of(sock_a), Some(120 << 20));
    assert!(!b.log_text().contains("size watch that has ended"), "B heard of the image after its volume was removed:\n{}", b.log_text());
}

/// The backend itself, without a front-end: size= creates an image and must
/// match an existing one, a missing image without size= is refused with a
/// hint, and write/read, flush, discard and write-zeroes (both must read
/// back as zeroes, also for partial objects) do what they say.
#[test]
fn rbd_backend_creates_sizes_flushes_discards_and_zeroes() {
    common::require_root();
    let ceph = Ceph::shared();
    let image = format!("be{}", common::unique(""));
    let spec = |extra: &str| {
        bw_block::BackendSpec::parse(&format!(
            "rbd:rbd/{image},conf={}{extra}",
            ceph.conf().display()
        ))
        .expect("spec")
    };
    let err = bw_block::open(&spec(""))
        .err()
        .expect("opening a missing image without size= must fail")
        .to_string();
    assert!(
        err.contains("size="),
        "the error should say how to create the image: {err}"
    );
    let dev = bw_block::open(&spec(",size=12M")).expect("create with size=");
    assert_eq!(dev.info().size_bytes, 12 << 20);
    assert!(
        dev.info().remote && dev.info().supports_discard,
        "rbd volumes are remote and discard"
    );
    drop(dev);
    let err = bw_block::open(&spec(",size=16M"))
        .err()
        .expect("a size= that differs from the image must fail")
        .to_string();
    assert!(err.contains("12M") && err.contains("16M"), "{err}");
    let dev = bw_block::open(&spec("")).expect("open the existing image");
    assert_eq!(dev.info().size_bytes, 12 << 20);

    let data: Vec<u8> = (0..12u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8 | 1)
        .collect();
    dev.write_at(&data, 0).expect("write 12 MiB");
    dev.flush().expect("flush");
    let mut back = vec![0u8; data.len()];
    dev.read_at(&mut back, 0).expect("read 12 MiB");
    assert!(back == data, "read back differs from what was written");
    // Across an object boundary (4 MiB objects) and partial at both ends.
    let (d_off, d_len) = ((4 << 20) - 6144, 10240u64);
    dev.discard(d_off, d_len).expect("discard");
    let (z_off, z_len) = ((8 << 20) - 512, 4096 + 1024u64);
    dev.write_zeroes(z_off, z_len).expect("write zeroes");
    dev.read_at(&mut back, 0)
        .expect("read after discard and zeroes");
    for (i, (&got, &had)) in back.iter().zip(&data).enumerate() {
        let i = i as u64;
        let zero = (d_off..d_off + d_len).contains(&i) || (z_off..z_off + z_len).contains(&i);
        let want = if zero { 0 } else { had };
        assert_eq!(
            got,
            want,
            "byte {i}: {} expected",
            if zero {
                "zero (discarded or zeroed)"
            } else {
                "the data written"
            }
        );
    }
    // submit: many requests in flight at once, writes in pieces (one
    // rbd_aio_writev), each completed on a librbd thread, never the caller's.
    assert!(dev.info().async_submit, "rbd submits without waiting");
    let (tx, rx) = std::sync::mpsc::channel();
    let caller = std::thread::current().id();
    let piece = |i: u64, k: u8| bytes::Bytes::from(vec![i as u8 ^ k; 1536]);
    for i in 0..32u64 {
        let data = vec![piece(i, 1), piece(i, 2), bytes::Bytes::new(), piece(i, 3)];
        let tx = tx.clone();
        dev.submit(
            bw_block::Request::Write { offset: i * 8192 + 512, data },
            Box::new(move |req, r| tx.send((std::thread::current().id(), req, r)).expect("send")),
        );
    }
    for _ in 0..32 {
        let (thread, req, r) = rx.recv_timeout(Duration::from_secs(60)).expect("a write completes");
        r.expect("submitted write");
        assert!(req.is_write() && req.len() == 3 * 1536);
        assert_ne!(thread, caller, "completed on the submitting thread");
    }
    for i in 0..32u64 {
        let tx = tx.clone();
        dev.submit(
            bw_block::Request::read(i * 8192 + 512, 3 * 1536),
            Box::new(move |req, r| tx.send((std::thread::current().id(), req, r)).expect("send")),
        );
    }
    for _ in 0..32 {
        let (_, req, r) = rx.recv_timeout(Duration::from_secs(60)).expect("a read completes");
        r.expect("submitted read");
        let i = (req.offset() - 512) / 8192;
        let buf = req.into_buf();
        let want: Vec<u8> = [1u8, 2, 3].iter().flat_map(|&k| vec![i as u8 ^ k; 1536]).collect();
        assert!(buf == want, "submitted read {i} differs from its submitted write");
    }
    // More pieces than one rbd_aio_writev takes (IOV_MAX): still written.
    let many: Vec<bytes::Bytes> = (0..1100u32).map(|i| bytes::Bytes::from(vec![(i % 251) as u8 | 1; 512])).collect();
    let want: Vec<u8> = many.iter().flat_map(|b| b.iter().copied()).collect();
    let t = tx.clone();
    dev.submit(
        bw_block::Request::Write { offset: 6 << 20, data: many },
        Box::new(move |req, r| t.send((std::thread::current().id(), req, r)).expect("send")),
    );
    rx.recv_timeout(Duration::from_secs(60)).expect("the write completes").2.expect("a write in 1100 pieces");
    let mut got = vec![0u8; want.len()];
    dev.read_at(&mut got, 6 << 20).expect("read the 1100 pieces back");
    assert!(got == want, "a write in 1100 pieces reads back differently");
    // A request librbd fails (past the end: the backend itself does no
    // range checks) comes back as an error, not a hang.
    dev.submit(
        bw_block::Request::read(13 << 20, 4096),
        Box::new(move |req, r| tx.send((std::thread::current().id(), req, r)).expect("send")),
    );
    let (_, _, r) = rx.recv_timeout(Duration::from_secs(60)).expect("the failed read completes");
    assert!(r.is_err(), "a read past the end of the image succeeded");
    dev.read_at(&mut back, 0).expect("read back all");
    for i in 0..32u64 {
        let at = (i * 8192 + 512) as usize;
        for (k, b) in [1u8, 2, 3].into_iter().enumerate() {
            data_at(&back, at + k * 1536, 1536, i as u8 ^ b);
        }
    }
    // The cluster agrees.
    let export = ceph.dir().join(format!("{image}.bin"));
    ceph.rbd(&[
        "export",
        "--no-progress",
        &format!("rbd/{image}"),
        export.to_str().expect("UTF-8"),
    ]);
    assert!(
        std::fs::read(&export).expect("export") == back,
        "rbd export differs from what the backend reads"
    );
    // Update watches: another client's resize (`rbd resize`) calls each
    // back on librbd's thread, and size_now reads the new size; an ended
    // watch is never called again. librbd calls its watchers in the order
    // they were made, on one thread, so once the second has heard of the
    // next resize the ended first one would have too.
    let (wtx, wrx) = std::sync::mpsc::channel();
    let watch = |k: u8| {
        let t = wtx.clone();
        dev.watch_size(Box::new(move || t.send(k).expect("send"))).expect("rbd_update_watch").expect("rbd volumes have update watches")
    };
    let (first, second) = (watch(1), watch(2));
    let heard = |who: u8| loop {
        match wrx.recv_timeout(Duration::from_secs(60)) {
            Ok(k) if k == who => break,
            Ok(_) => {}
            Err(e) => panic!("update watch {who} heard nothing of rbd resize: {e}"),
        }
    };
    ceph.rbd(&["resize", "--no-progress", "--size", "14M", &format!("rbd/{image}")]);
    heard(1);
    heard(2);
    assert_eq!(dev.size_now().expect("size_now"), 14 << 20, "size_now after rbd resize");
    dev.unwatch_size(first);
    let _ = wrx.try_iter().count();
    ceph.rbd(&["resize", "--no-progress", "--size", "16M", &format!("rbd/{image}")]);
    match wrx.recv_timeout(Duration::from_secs(60)) {
        Ok(2) => {}
        Ok(k) => panic!("update watch {k} was called after it ended"),
        Err(e) => panic!("update watch 2 heard nothing of the second rbd resize: {e}"),
    }
    // librbd refreshes the image at the first call after a header update:
    // here, not under the writes left in flight at the drop below.
    assert_eq!(dev.size_now().expect("size_now"), 16 << 20, "size_now after the second rbd resize");
    dev.unwatch_size(second);
    // Dropped with requests in flight: rbd_close waits for them, so every
    // callback has run (and none runs on a closed image) once drop returns.
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..32u64 {
        let tx = tx.clone();
        let data = vec![bytes::Bytes::from(vec![7u8; 4096])];
        dev.submit(
            bw_block::Request::Write { offset: i * 4096, data },
            Box::new(move |_, r| tx.send(r.is_ok()).expect("send")),
        );
    }
    drop((tx, dev));
    let done: Vec<bool> = rx.try_iter().collect();
    assert_eq!(done.len(), 32, "requests still in flight after the device was dropped");
    assert!(done.iter().all(|&ok| ok), "a write in flight at close failed");
    ceph.rbd_rm(&format!("rbd/{image}"));
}

/// Checks that `len` bytes at `at` are all `byte`.
fn data_at(buf: &[u8], at: usize, len: usize, byte: u8) {
    assert!(buf[at..at + len].iter().all(|&b| b == byte), "bytes {at}..{} are not {byte:#04x}", at + len);
}

/// A load generator: `blockwire bench` with an initiator timeout far longer
/// than the gateway's rbd timeout, so any error it reports comes from the
/// gateway, not from its own patience running out.
fn load(url: &str) -> std::process::Child {
    Command::new(common::blockwire_bin())
        .args([
            "bench",
            url,
            "--rw",
            "randwrite",
            "--iodepth",
            "16",
            "--runtime",
            "600",
            "--timeout",
            "300",
            "--size",
            "32M",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn blockwire bench")
}

/// Ceph stops under load (first the OSD, so requests pile up in the
/// gateway's librados client, then the monitor too): the gateway keeps many
/// requests in flight at the cluster (its client's `objecter_requests`), the
/// initiators get errors (ABORTED COMMAND / COMMAND INTERRUPTED) once the
/// gateway's rbd timeout passes, while the cluster is still stopped, instead
/// of hanging; when Ceph returns, the same gateway process serves I/O again.
#[test]
fn ceph_stopped_under_load_fails_requests_and_the_gateway_recovers() {
    common::require_root();
    // Its own cluster: pausing the shared one would stall the other tests.
    let ceph = Ceph::start();
    ceph.rbd(&[
        "create",
        "--size",
        "64M",
        "--image-feature",
        "layering",
        "rbd/outage",
    ]);
    let dir = common::TempDir::new("rbd-out");
    let (ip, np) = (common::free_port(), common::free_port());
    const RBD_TIMEOUT_S: u64 = 5;
    let mut gw = common::Serve::with_config(
        &dir,
        &gateway_toml(
            &ceph,
            &gateway("outage", 1, ip, np, None, RBD_TIMEOUT_S as u32),
        ),
        &[],
    );
    let pid = gw.pid();
    let urls = [
        format!("iscsi://127.0.0.1:{ip}/{IQN}/0"),
        format!("nvme+tcp://127.0.0.1:{np}/{NQN}/1"),
    ];
    for (i, url) in urls.iter().enumerate() {
        blockwire_ok(
            None,
            &[
                "verify",
                url,
                "--size",
                "4M",
                "--offset",
                &format!("{}M", 32 + 4 * i),
            ],
        );
    }

    let mut loads: Vec<std::process::Child> = urls.iter().map(|u| load(u)).collect();
    std::thread::sleep(Duration::from_secs(2));
    for l in &mut loads {
        assert!(
            l.try_wait().expect("try_wait").is_none(),
            "the load ended before Ceph was stopped"
        );
    }
    ceph.pause_osd();
    let stopped = Instant::now();
    // Both initiators keep 16 requests in flight; with the OSD frozen they
    // all wait in the gateway's librados client at once.
    let mut in_flight = 0;
    while stopped.elapsed() < Duration::from_secs(RBD_TIMEOUT_S - 2) {
        in_flight = in_flight.max(ceph.client_ops_in_flight(pid));
        std::thread::sleep(Duration::from_millis(200));
    }
    ceph.pause();
    eprintln!("rbd: {in_flight} requests in flight in the gateway's librados client while the OSD was stopped");
    assert!(in_flight >= 24, "the gateway kept only {in_flight} requests in flight at the cluster for 32 outstanding at the initiators");

    // The liveness bound of the test, far above the 5 s rbd timeout: an
    // initiator still waiting after it is hanging.
    let limit = Duration::from_secs(120);
    let mut ended: Vec<Option<(std::process::ExitStatus, Duration)>> = vec![None; loads.len()];
    while ended.iter().any(Option::is_none) {
        for (l, e) in loads.iter_mut().zip(ended.iter_mut()) {
            if e.is_none() {
                *e = l
                    .try_wait()
                    .expect("try_wait")
                    .map(|s| (s, stopped.elapsed()));
            }
        }
        if stopped.elapsed() > limit {
            for l in &mut loads {
                let _ = l.kill();
                let _ = l.wait();
            }
            panic!(
                "no answer {} s after Ceph stopped: the initiators hang ({ended:?})",
                limit.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for ((url, l), e) in urls.iter().zip(&mut loads).zip(ended) {
        let (status, after) = e.expect("ended");
        let mut err = String::new();
        l.stderr
            .take()
            .expect("piped")
            .read_to_string(&mut err)
            .expect("read stderr");
        eprintln!(
            "rbd: {url}: failed {:.1} s after the OSD stopped: {}",
            after.as_secs_f64(),
            err.trim()
        );
        assert!(
            !status.success(),
            "{url}: the load succeeded with Ceph stopped"
        );
        assert!(
            err.contains("sense 70000b") || err.contains("command interrupted"),
            "{url}: expected the gateway's timeout status (ABORTED COMMAND / COMMAND INTERRUPTED), got: {err}"
        );
    }
    // Still stopped: a Ceph client cannot reach it either.
    let out = ceph.rbd_output(&["info", "rbd/outage"], Duration::from_secs(5));
    assert!(
        !out.status.success(),
        "rbd info answered while the cluster was stopped"
    );
    ceph.resume();

    // The same gateway process serves again, over both protocols.
    for (i, url) in urls.iter().enumerate() {
        blockwire_ok(
            None,
            &[
                "verify",
                url,
                "--size",
                "8M",
                "--offset",
                &format!("{}M", 40 + 8 * i),
                "--timeout",
                "60",
                "--seed",
                "7",
            ],
        );
    }
    assert!(
        gw.is_running() && gw.pid() == pid,
        "the gateway did not survive the outage:\n{}",
        gw.log_text()
    );
    assert!(
        gw.log_text().contains("timed out"),
        "the gateway did not log the failed requests:\n{}",
        gw.log_text()
    );
    assert!(gw.stop().success(), "gateway did not stop cleanly");
}
