//! NVMe/TCP over TLS 1.3 (TP 8011) on this host, whose kernel has no kTLS:
//! every connection here uses the user-space record layer.
//! - blockwire's initiator against `blockwire serve` on a TLS-required
//!   port and a TLS-allowed one: PSKs inline and from a key file, both
//!   suites, both identity versions, with DH-HMAC-CHAP on top; what
//!   `session_list`, the metrics and the discovery log say;
//! - refusals: a wrong PSK, a plaintext host on a TLS-required port, a
//!   Connect as another host than the PSK's;
//! - hostile input (malformed, oversized and out-of-place records, a
//!   ClientHello without a PSK from `openssl s_client`, a post-handshake
//!   KeyUpdate, a flood of handshake bytes) closes that connection only
//!   and the target serves the next host;

use crate::common;
use bw_nvme::fabrics::{Connect, ConnectData};
use bw_nvme::pdu::{self, Digests, IcReq, Pdu};
use bw_nvme::tls_psk::{ConfiguredPsk, Derivation, IdentityVersion};
use bw_tls::record::{ContentType, Sealer};
use bw_tls::secure::{self, RecordReader};
use bw_tls::RecordChoice;
use bytes::BytesMut;
use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::time::Duration;

const NQN: &str = "nqn.2026-11.org.blockwire:tls";
/// `nvme gen-tls-key --secret=000102..1f --hmac=1` (nvme-cli 2.13).
const K256: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
/// `nvme gen-tls-key --secret=404142..6f --hmac=2`.
const K384: &str = "NVMeTLSkey-1:02:QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl9gYWJjZGVmZ2hpamtsbW5voBXMjQ==:";
/// Used as it is (00), for the host that authenticates too.
const K00: &str = "NVMeTLSkey-1:00:oKGio6SlpqeoqaqrrK2ur7CxsrO0tba3uLm6u7y9vr8G4daz:";
/// Valid, and nobody's.
const BAD: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
const DHCHAP: &str = "DHHC-1:00:icgRoAopl0tiy0SClYpv7+LgxqHrXYjx8KqHslq+Cjci2Jq0:";

fn host(i: u32) -> String {
    format!("nqn.2026-11.org.blockwire:tls-host-{i}")
}

/// Port `req` requires TLS, `allowed` allows it. Host 1: K256 inline;
/// host 2: K384 from a key file; host 3: K00 and DH-HMAC-CHAP.
fn config(dir: &TempDir, req: u16, allowed: u16) -> String {
    let key = dir.path().join("key384");
    std::fs::write(&key, format!("{K384}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    format!(
        r#"
[[volume]]
name = "d0"
backend = "ram:64M"
[nvme]
listen = ["127.0.0.1:{req}", "127.0.0.1:{allowed}"]
tls = "required"
tls_ports = {{ "127.0.0.1:{allowed}" = "allowed" }}
[[nvme.key]]
name = "key384"
path = "{key}"
[[nvme.subsystem]]
nqn = "{NQN}"
namespaces = [{{ nsid = 1, volume = "d0" }}]
[[nvme.subsystem.host]]
nqn = "{h1}"
tls_psk = "{K256}"
[[nvme.subsystem.host]]
nqn = "{h2}"
tls_key = "key384"
[[nvme.subsystem.host]]
nqn = "{h3}"
tls_psk = "{K00}"
dhchap_secret = "{DHCHAP}"
"#,
        key = key.display(),
        h1 = host(1),
        h2 = host(2),
        h3 = host(3),
    )
}

fn verify(port: u16, q: &str, hostnqn: &str, extra: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let url = format!("nvme+tcp://127.0.0.1:{port}/{NQN}/1{q}");
    let mut c = std::process::Command::new(blockwire_bin());
    c.args(["verify", &url, "--size", "2M", "--initiator-name", hostnqn, "--timeout", "20"]).args(extra);
    c.env_remove("BLOCKWIRE_TLS_PSK").env_remove("BLOCKWIRE_DHCHAP_SECRET");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run blockwire verify")
}

fn ok(o: &std::process::Output, what: &str) -> String {
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{what}: {out}");
    out
}

fn wait_log(serve: &Serve, needle: &str) -> bool {
    serve.wait_log(needle, Duration::from_secs(20))
}

#[test]
fn blockwire_initiator_over_tls_and_refusals() {
    let dir = TempDir::new("nvtls");
    let (req, allowed) = (free_port(), free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let sock = dir.path().join("control.sock");
    let mut serve = Serve::with_config(&dir, &config(&dir, req, allowed), &["-v", "--metrics", &metrics, "--control", sock.to_str().unwrap()]);
    let psk = "BLOCKWIRE_TLS_PSK";

    // Host 1, identity version 0 (as Linux before 6.13), SHA-256 suite.
    let out = ok(&verify(req, "?tls", &host(1), &[], &[(psk, K256)]), "host 1");
    assert!(out.contains("TLS TLS_AES_128_GCM_SHA256, user"), "{out}");
    assert!(wait_log(&serve, &format!("TLS TLS_AES_128_GCM_SHA256 as \"NVMe0R01 {} {NQN}\"", host(1))), "{}", serve.log_text());
    // Host 2: a key file, the SHA-384 suite, identity version 1, the
    // record layer asked for by name, the PSK from a file.
    let pskfile = dir.path().join("host2.psk");
    std::fs::write(&pskfile, K384).unwrap();
    let out = ok(&verify(req, "?tls=user", &host(2), &["--tls-identity", "1", "--tls-psk-file", pskfile.to_str().unwrap()], &[]), "host 2");
    assert!(out.contains("TLS TLS_AES_256_GCM_SHA384, user"), "{out}");
    assert!(wait_log(&serve, &format!("as \"NVMe1R02 {} {NQN} ", host(2))));
    // Host 3: TLS first, then DH-HMAC-CHAP on every queue, inside it.
    ok(&verify(req, "?tls", &host(3), &["--queues", "2"], &[(psk, K00), ("BLOCKWIRE_DHCHAP_SECRET", DHCHAP)]), "host 3");
    assert!(wait_log(&serve, &format!("queue 1: {} authenticated (DH-HMAC-CHAP", host(3))), "{}", serve.log_text());
    // This host has no kTLS: asking for it is refused, clearly.
    if !std::path::Path::new("/proc/net/tls_stat").exists() {
        let o = verify(req, "?tls=kernel", &host(1), &[], &[(psk, K256)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("kTLS"), "{err}");
    }

    // Refusals, each with its reason on both sides.
    let o = verify(req, "?tls", &host(1), &[], &[(psk, BAD)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("refused the TLS handshake"), "wrong PSK: {err}");
    assert!(wait_log(&serve, "is not the one configured for it (the PSK binder does not verify)"), "{}", serve.log_text());
    let o = verify(req, "", &host(1), &[], &[]);
    assert!(!o.status.success(), "plaintext on the TLS-required port connected");
    assert!(wait_log(&serve, "on a port that requires TLS: refused"));
    let o = verify(req, "?tls", &host(9), &[], &[(psk, K256)]);
    assert!(!o.status.success());
    assert!(wait_log(&serve, &format!("PSK identity \"NVMe0R01 {} {NQN}\" refused: no key is configured for it", host(9))), "{}", serve.log_text());
    // The allowed port: plaintext and TLS alike.
    ok(&verify(allowed, "", &host(1), &[], &[]), "plaintext on the allowed port");
    ok(&verify(allowed, "?tls", &host(1), &[], &[(psk, K256)]), "TLS on the allowed port");
    // A PSK without ?tls is a mistake, said before connecting.
    let o = verify(allowed, "", &host(1), &[], &[(psk, K256)]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not ask for TLS (add ?tls)"));

    // The discovery log (read over the allowed port, in plaintext).
    let o = blockwire(None, &["nvme", "discover", &format!("127.0.0.1:{allowed}"), "--initiator-name", &host(1)]);
    let disc = ok(&o, "discover");
    assert!(disc.contains(&format!("127.0.0.1:{req}/{NQN} (subtype nvme, portid 1, TLS required)")), "{disc}");
    assert!(disc.contains(&format!("127.0.0.1:{allowed}/{NQN} (subtype nvme, portid 2, TLS allowed)")), "{disc}");

    // session_list and the metrics while a TLS controller is connected.
    while_connected(req, &sock, "TLS_AES_128_GCM_SHA256 user, sealed inline", || {
        let text = scrape_metrics(&metrics);
        assert!(metric_sample(&text, "blockwire_tls_connections{protocol=\"nvme-tcp\",record_layer=\"user\"}") >= 2.0, "{text}");
        assert!(metric_sample(&text, "blockwire_tls_handshakes_total{protocol=\"nvme-tcp\",record_layer=\"user\"}") >= 8.0, "{text}");
        assert!(metric_sample(&text, "blockwire_tls_refused_total{protocol=\"nvme-tcp\"}") >= 3.0, "{text}");
        assert!(!text.contains("AAECAwQF") && !serve.log_text().contains("AAECAwQF"), "a secret in the metrics or the log");
    });
    assert!(serve.is_running());
}

/// While host 1 has a controller over TLS on `port`: `session_list` (on
/// control socket `sock`) says its TLS is `tls`, then `more` runs.
fn while_connected(port: u16, sock: &std::path::Path, tls: &str, more: impl FnOnce()) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let opts = bw_initiator::ConnectOptions { initiator_name: Some(host(1)), tls_psk: Some(K256.into()), timeout: Duration::from_secs(20), ..Default::default() };
    let client = rt.block_on(bw_initiator::connect(&format!("nvme+tcp://127.0.0.1:{port}/{NQN}/1?tls"), &opts)).unwrap();
    let o = blockwire(None, &["ctl", "--control", sock.to_str().unwrap(), "--json", "session_list"]);
    let v: Value = serde_json::from_str(&ok(&o, "session_list")).unwrap();
    let sessions = v["result"].as_array().cloned().unwrap_or_default();
    assert!(sessions.iter().any(|s| s["initiator"] == host(1) && s["tls"] == tls), "{v}");
    more();
    rt.block_on(client.close()).unwrap();
}

/// `[tuning] tls_sealing = "thread"` reaches the connections (serve's log
/// and `session_list` say it) and 1 MiB reads sealed in part on the helper
/// thread come back whole (`verify` compares what it wrote), as they do
/// sealed inline, the default (`blockwire_initiator_over_tls_and_refusals`).
#[test]
fn large_reads_over_tls_sealed_on_a_thread() {
    let dir = TempDir::new("nvtls-seal");
    let (req, allowed) = (free_port(), free_port());
    let sock = dir.path().join("control.sock");
    let cfg = format!("{}\n[tuning]\ntls_sealing = \"thread\"\n", config(&dir, req, allowed));
    let mut serve = Serve::with_config(&dir, &cfg, &["-v", "--control", sock.to_str().unwrap()]);
    let env = [("BLOCKWIRE_TLS_PSK", K256)];
    ok(&verify(req, "?tls", &host(1), &["--chunk", "1M"], &env), "1 MiB reads sealed on a thread");
    assert!(wait_log(&serve, "records user (sealed thread)"), "{}", serve.log_text());
    while_connected(req, &sock, "TLS_AES_128_GCM_SHA256 user, sealed thread", || {});
    assert!(serve.is_running());
}

/// A TLS connection made by hand: the handshake as `identity` with
/// `psk`, then the records ours.
struct RawTls {
    stream: tokio::net::TcpStream,
    sealer: Sealer,
    reader: RecordReader,
    plain: BytesMut,
}

impl RawTls {
    async fn open(port: u16, hostnqn: &str) -> RawTls {
        let c = ConfiguredPsk::parse(K256).unwrap();
        let id = c.identity(Derivation::Rfc8446, IdentityVersion::V0, hostnqn, NQN);
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let s = secure::connect(&stream, &id.to_string(), c.tls_psk(Derivation::Rfc8446, &id).unwrap(), RecordChoice::User).await.unwrap();
        let u = s.user.unwrap();
        RawTls { stream, sealer: u.sealer, reader: u.reader, plain: s.plaintext }
    }

    async fn send(&mut self, kind: ContentType, b: &[u8]) {
        use tokio::io::AsyncWriteExt;
        let mut out = Vec::new();
        self.sealer.seal(kind, &[b], &mut out);
        self.stream.write_all(&out).await.unwrap();
    }

    async fn send_pdu(&mut self, p: Pdu) {
        self.send(ContentType::ApplicationData, &p.encode_parts(Digests::default()).concat()).await;
    }

    /// Whether the target closed the connection within `wait` (EOF, a
    /// reset or an alert), reading and dropping what comes before.
    async fn ended(&mut self, wait: Duration) -> bool {
        let until = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(until, self.stream.readable()).await {
                Err(_) => return false,
                Ok(Err(_)) => return true,
                Ok(Ok(())) => {}
            }
            match self.reader.fill(&self.stream, &mut self.plain) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Ok(0) | Err(_) => return true,
                Ok(_) => self.plain.clear(),
            }
        }
    }

    /// The next PDU; None when the target closed the connection.
    async fn next(&mut self) -> Option<Pdu> {
        loop {
            if let Ok(Some(p)) = pdu::decode(&mut self.plain, Digests::default(), 1 << 20) {
                return Some(p);
            }
            tokio::time::timeout(RawNvme::WAIT, self.stream.readable()).await.ok()?.ok()?;
            match self.reader.fill(&self.stream, &mut self.plain) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }
}

use common::nvme_raw::RawNvme;

/// Whether the target closed `s` within the wait (reads EOF or a reset).
fn closed(s: &mut std::net::TcpStream) -> bool {
    s.set_read_timeout(Some(RawNvme::WAIT)).unwrap();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe) => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn hostile_tls_input_closes_that_connection_only() {
    let dir = TempDir::new("nvtlsh");
    let (req, allowed) = (free_port(), free_port());
    // A short login deadline: the half record below is dropped by it.
    let cfg = format!("{}\n[limits]\nlogin_timeout_s = 3\n", config(&dir, req, allowed));
    let mut serve = Serve::with_config(&dir, &cfg, &["-v"]);
    let raw = |bytes: &[u8]| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", req)).unwrap();
        s.write_all(bytes).unwrap();
        s
    };
    // A record longer than TLS allows; a record of an unknown type; a
    // record version no TLS has; application data before any handshake.
    for (bytes, says) in [
        (&[22u8, 3, 1, 0x41, 0x01][..], "over the 16640 TLS allows"),
        (&[22, 3, 1, 0, 1, 0, 24, 3, 3, 0, 1, 0][..], "TLS handshake failed"),
        (&[22, 3, 2, 0, 4, 1, 0, 0, 0][..], "TLS handshake failed"),
        (&[23, 3, 3, 0, 1, 0][..], "first byte 0x17"),
    ] {
        let mut s = raw(bytes);
        assert!(closed(&mut s), "{bytes:?} left open");
        assert!(wait_log(&serve, says), "{bytes:?}: no {says:?} in\n{}", serve.log_text());
    }
    // Half a record, then nothing: the login deadline (3 s) ends it; the
    // half left in place meanwhile is all it holds.
    let mut half = raw(&[22, 3, 1, 0x10, 0x00, 1, 0, 0x0f]);
    // A flood of handshake records announcing a 16 MB ClientHello: closed
    // after at most 64 KiB were taken, the writer sees the door shut long
    // before 16 MB went.
    let mut flood = std::net::TcpStream::connect(("127.0.0.1", req)).unwrap();
    let mut rec = vec![22u8, 3, 1, 0x40, 0x00];
    rec.extend(std::iter::repeat_n(0u8, 0x4000));
    rec[5..9].copy_from_slice(&[1, 0xFF, 0xFF, 0xFF]);
    let mut sent = 0usize;
    flood.set_write_timeout(Some(RawNvme::WAIT)).unwrap();
    while sent < 16 << 20 {
        match flood.write(&rec) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
        rec[5..9].fill(0);
    }
    assert!(sent < 16 << 20, "16 MB of handshake accepted");
    assert!(wait_log(&serve, "went past 65536 bytes") || wait_log(&serve, "excessive message size"), "{}", serve.log_text());
    // A real TLS 1.3 client that offers no PSK (a certificate handshake).
    let o = std::process::Command::new("openssl")
        .args(["s_client", "-tls1_3", "-connect", &format!("127.0.0.1:{req}")])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl s_client (make deps installs openssl)");
    assert!(!o.status.success() || !String::from_utf8_lossy(&o.stdout).contains("Verification"), "s_client connected");
    assert!(wait_log(&serve, "the ClientHello offered no pre-shared key"), "{}", serve.log_text());

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // A post-handshake KeyUpdate (and so any renegotiation attempt):
        // the connection ends with the reason.
        let mut t = RawTls::open(req, &host(1)).await;
        t.send(ContentType::Handshake, &[24, 0, 0, 1, 0]).await;
        assert!(t.next().await.is_none(), "a KeyUpdate was taken");
        // TLS as host 1, Connect as host 2: refused.
        let mut t = RawTls::open(req, &host(1)).await;
        t.send_pdu(Pdu::IcReq(IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 })).await;
        assert!(matches!(t.next().await, Some(Pdu::IcResp(_))));
        let c = Connect { recfmt: 0, qid: 0, sqsize: 31, cattr: 0, kato_ms: 30_000 };
        let d = ConnectData { hostid: [1; 16], cntlid: 0xFFFF, subnqn: NQN.into(), hostnqn: host(2) };
        t.send_pdu(Pdu::CapsuleCmd(pdu::CapsuleCmd { sqe: c.to_sqe(1), data: bytes::Bytes::from(d.encode()) })).await;
        match t.next().await {
            Some(Pdu::CapsuleResp(cqe)) => assert_eq!(cqe.status, bw_nvme::Status::CONNECT_INVALID_HOST),
            other => panic!("Connect as another host: {other:?}"),
        }
    });
    assert!(wait_log(&serve, "post-handshake TLS message of type 24"), "{}", serve.log_text());
    assert!(wait_log(&serve, &format!("Connect as host {} over a TLS connection keyed for {}", host(2), host(1))));
    // Meanwhile the half record sat there; the target still serves hosts.
    ok(&verify(req, "?tls", &host(1), &[], &[("BLOCKWIRE_TLS_PSK", K256)]), "after the hostile input");
    assert!(closed(&mut half), "the half record was held past the login deadline");
    assert!(serve.is_running());
}

/// The Linux host and the kernel's nvmet against blockwire over TLS, in one
/// boot of Linux 6.12 (tests/kernel-vm/nvme-tls.sh): the Linux host (tlshd,
/// kTLS on its side) to `blockwire serve` here (user-space record layer:
/// this host has no kTLS), ext4 made and fsck clean, `connect-all` from the
/// discovery log, DH-HMAC-CHAP inside TLS, a wrong PSK and plaintext
/// refused; `blockwire serve` in the guest on kTLS with the guest's Linux
/// host; blockwire's initiator here against nvmet requiring TLS.
#[test]
fn linux_host_and_nvmet_over_tls() {
    require_root();
    let kvm = kernel_612_image();
    let dir = TempDir::new("nvtlsvm");
    let port = free_port();
    let sock = dir.path().join("control.sock");
    let cfg = format!(
        r#"
[[volume]]
name = "d0"
backend = "ram:64M"
[nvme]
listen = ["127.0.0.1:{port}"]
tls = "required"
[[nvme.subsystem]]
nqn = "{NQN}"
namespaces = [{{ nsid = 1, volume = "d0" }}]
[[nvme.subsystem.host]]
nqn = "{h1}"
tls_psk = "{K256}"
[[nvme.subsystem.host]]
nqn = "{h2}"
tls_psk = "{K00}"
dhchap_secret = "{DHCHAP}"
[[nvme.subsystem.host]]
nqn = "{h3}"
tls_psk = "{K00}"
[[nvme.subsystem.host]]
nqn = "{h5}"
tls_psk = "{K384}"
"#,
        h1 = host(1),
        h2 = host(2),
        h3 = host(3),
        h5 = host(5)
    );
    let mut serve = Serve::with_config(&dir, &cfg, &["-v", "--control", sock.to_str().unwrap()]);
    // blockwire in the guest: a copy without debug information (the image
    // is an initrd in guest memory).
    let bw = dir.path().join("blockwire");
    let st = std::process::Command::new("strip").arg("-o").arg(&bw).arg(blockwire_bin()).status().unwrap();
    assert!(st.success(), "strip blockwire");
    let (tnqn, done) = ("nqn.2026-11.org.blockwire:nvmet-tls", "nqn.2026-11.org.blockwire:tls-done");
    let script = dir.path().join("nvme-tls.sh");
    let body = guest_script_with("nvme-host-lib.sh", "nvme-tls.sh");
    let vars = format!(
        "PORT={port}\nNQN={NQN}\nH1={}\nK1='{K256}'\nH2={}\nK2='{K00}'\nD2='{DHCHAP}'\nH3={}\nBAD='{BAD}'\nH5={}\nK5='{K384}'\nBW={}\nTNQN={tnqn}\nTH={}\nTK='{K256}'\nTH5={}\nDONE={done}\n",
        host(1),
        host(2),
        host(3),
        host(5),
        bw.display(),
        host(4),
        host(6)
    );
    std::fs::write(&script, format!("{vars}{body}")).unwrap();
    let (tport, dport, kport) = (free_port(), free_port(), free_port());
    // kport: the guest's second serve (kTLS records), for the KeyUpdate;
    // ssh: the guest as the lab's target host and client host.
    let ssh = [free_port(), free_port()];
    let fwd = format!(
        "tcp:127.0.0.1:{tport}-:4430,tcp:127.0.0.1:{dport}-:4431,tcp:127.0.0.1:{kport}-:4424,tcp:127.0.0.1:{}-:22,tcp:127.0.0.1:{}-:22",
        ssh[0], ssh[1]
    );
    crate::lab_ssh::ssh_keys_and_config(dir.path(), "127.0.0.1:1");
    let key_pub = dir.path().join("client.pub").display().to_string();
    let bw_path = bw.to_str().unwrap().to_string();
    // What the lab runs in the guest besides blockwire (as lab_ssh's VM test).
    let mut with = vec!["--with", &bw_path];
    for w in ["/usr/bin/fio", "/usr/bin/ip", "/usr/bin/flock", "/usr/bin/getconf", "/lib/x86_64-linux-gnu/libgcc_s.so.1"] {
        with.extend(["--with", w]);
    }
    // nvmet is up (after the guest's steps A to C) once its plaintext port
    // lists the subsystem to host 4.
    let up = || {
        let o = blockwire(None, &["nvme", "discover", &format!("127.0.0.1:{dport}"), "--initiator-name", &host(4), "--timeout", "10"]);
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains(tnqn)
    };
    let mut boots = 0;
    let vm = loop {
        boots += 1;
        let mut vm = BackgroundVm::start_with(Some(&kvm), &script, &fwd, &with, &[("KVM_SSH_KEY", &key_pub), ("KVM_MEM", "1536")]);
        match vm.wait_until(Duration::from_secs(900), up) {
            Ok(()) => break vm,
            Err(console) if vm_boot_flaked(&console) && boots < 3 => eprintln!("guest boot failed (emulated timer check), booting again"),
            Err(console) => panic!("{console}"),
        }
    };
    // What the target here saw of the Linux host's steps.
    for line in [
        format!("as \"NVMe0R01 {} {NQN}\"", host(1)),
        format!("TLS TLS_AES_128_GCM_SHA256 as \"NVMe0R01 {} {NQN}\"", host(2)),
        format!("queue 1: {} authenticated (DH-HMAC-CHAP", host(2)),
        "is not the one configured for it (the PSK binder does not verify)".to_string(),
        "on a port that requires TLS: refused".to_string(),
        // tlshd 1.0 binds the SHA-384 PSK with SHA-256: the one suite of
        // that hash it offers.
        format!("TLS TLS_CHACHA20_POLY1305_SHA256 as \"NVMe0R02 {} {NQN}\"", host(5)),
    ] {
        assert!(wait_log(&serve, &line), "target log lacks {line:?}:\n{}", serve.log_text());
    }
    // blockwire's initiator against nvmet requiring TLS (user-space records).
    let url = format!("nvme+tcp://127.0.0.1:{tport}/{tnqn}/1");
    let run = |q: &str, h: &str, psk: &str| {
        let mut c = std::process::Command::new(blockwire_bin());
        c.args(["verify", &format!("{url}{q}"), "--size", "4M", "--queues", "2", "--initiator-name", h, "--timeout", "120"]);
        // The TLS candidates the initiator tried, and the one that worked.
        c.env_remove("BLOCKWIRE_DHCHAP_SECRET").env("BLOCKWIRE_TLS_PSK", psk).env("RUST_LOG", "warn,bw_initiator::nvme::tls=debug");
        if psk.is_empty() {
            c.env_remove("BLOCKWIRE_TLS_PSK");
        }
        c.output().unwrap()
    };
    let out = ok(&run("?tls", &host(4), K256), "blockwire to nvmet over TLS");
    assert!(out.contains("TLS TLS_AES_128_GCM_SHA256, user"), "{out}");
    let o = run("?tls", &host(4), BAD);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("refused the TLS handshake"), "wrong PSK against nvmet: {err}");
    let o = run("", &host(4), "");
    assert!(!o.status.success(), "plaintext to nvmet's TLS-required port connected");
    eprintln!("plaintext to nvmet: {}", String::from_utf8_lossy(&o.stderr));
    // A SHA-384 PSK (NVMeTLSkey-1:02) against nvmet, whose handshakes are
    // tlshd 1.0's (GnuTLS server credentials without a hash: SHA-256
    // binders): our initiator binds it with SHA-384 for
    // TLS_AES_256_GCM_SHA384 first, as TP 8011 says; refused, it binds the
    // same 48 bytes with SHA-256 and gets TLS_AES_128_GCM_SHA256 (tlshd's
    // server side takes it; its client side offers only ChaCha20 of that
    // hash), on both queues.
    let o = run("?tls", &host(6), K384);
    eprintln!("SHA-384 PSK to nvmet: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let out = ok(&o, "blockwire to nvmet over TLS with a SHA-384 PSK");
    assert!(out.contains("TLS TLS_AES_128_GCM_SHA256, user, SHA-384 PSK bound with SHA-256 as tlshd 1.0 does"), "{out}");
    // The first queue was refused TP 8011's binding and said which one
    // worked; the other two started with that (no refusal after it).
    let lines: Vec<&str> = out.lines().collect();
    let took: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].contains("the controller's other queues use this one")).collect();
    let refused: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].contains("nvme: TLS with the PSK derived by")).collect();
    assert_eq!(took.len(), 1, "{out}");
    assert!(lines[took[0]].contains("SHA-384 PSK bound with SHA-256 as tlshd 1.0 does"), "{out}");
    assert!(refused.first().is_some_and(|r| lines[*r].contains("SHA-384 PSK bound with SHA-384 as TP 8011 says")), "{out}");
    assert!(refused.iter().all(|&r| r < took[0]), "a queue after the first was refused again: {out}");
    // A KeyUpdate to the guest's serve on kTLS receive: that connection
    // ends (the guest checks serve's reason, stepKU), the next host is served.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut t = RawTls::open(kport, &host(1)).await;
        // ICReq/ICResp first: the records are then the kernel's (a record
        // sent right after the handshake is read with it, in user space).
        t.send_pdu(Pdu::IcReq(IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 })).await;
        assert!(matches!(t.next().await, Some(Pdu::IcResp(_))), "no ICResp from the guest's serve");
        t.send(ContentType::Handshake, &[24, 0, 0, 1, 0]).await;
        assert!(t.ended(Duration::from_secs(60)).await, "the guest's serve on kTLS kept the connection after a KeyUpdate");
    });
    let log = guest_sh(dir.path(), ssh[0], "cat /tmp/bw/serve2.log");
    assert!(log.contains("records ktls"), "the guest's second serve is not on kTLS: {log}");
    assert!(log.contains("KeyUpdate is not supported on kTLS receive"), "the guest serve's log does not say the connection ended for a KeyUpdate: {log}");
    let guest = format!("nvme+tcp://127.0.0.1:{kport}/{NQN}/1?tls");
    let o = std::process::Command::new(blockwire_bin())
        .args(["verify", &guest, "--size", "1M", "--initiator-name", &host(1), "--timeout", "120"])
        .env_remove("BLOCKWIRE_DHCHAP_SECRET")
        .env("BLOCKWIRE_TLS_PSK", K256)
        .output()
        .unwrap();
    ok(&o, "the guest's serve after the KeyUpdate");
    // The lab with --tls on, the guest as target and client host over ssh.
    let lab = lab_over_tls(dir.path(), &bw, ssh);
    // The done signal, over the plaintext port.
    let _ = blockwire(None, &["verify", &format!("nvme+tcp://127.0.0.1:{dport}/{tnqn}/1"), "--size", "1M", "--initiator-name", done, "--timeout", "20"]);
    let (status, all) = vm.finish();
    for step in [
        "TLS-OK: nvme connect --tls, ext4 made, written, fsck clean, disconnected",
        "TLS-OK: the discovery log says TLS 1.3 is required",
        "TLS-OK: TLS with DH-HMAC-CHAP, ext4 fsck clean",
        "TLS-OK: wrong PSK refused, the next host served",
        "TLS-OK: plaintext refused on the TLS-required port",
        "TLS-OK: a SHA-384 PSK connects, 1 MiB written and read back",
        "TLS-OK: a SHA-384 PSK on kTLS (ChaCha20-Poly1305)",
        "TLS-OK: kTLS record layer: Linux host to blockwire serve in the guest",
        "TLS-OK: connect-all over TLS from the discovery log",
        "TLS-OK: a SHA-384 PSK from the Linux host to nvmet",
        "TLS-OK: a KeyUpdate on kTLS receive ends that connection, the log says why",
        "TLS-ALL-OK",
    ] {
        assert!(all.contains(step), "guest did not report {step:?}\n{all}");
    }
    assert!(status.success(), "kernel-vm failed: {status}");
    assert!(serve.is_running(), "target died");
    assert!(serve.stop().success());
    eprintln!("lab --tls on in the guest took {lab:?}");
}

/// `blockwire lab --tls on` with the guest as target host (nvmet with
/// tlshd, blockwire serve) and client host (blockwire bench, nvme-tcp with
/// --tls) over ssh: every subject measured over TLS, the report saying how
/// each end's records went, and nothing left in the guest (its lab
/// subsystem, port and PSK). How long it took.
fn lab_over_tls(dir: &std::path::Path, exe: &std::path::Path, ssh: [u16; 2]) -> Duration {
    let t0 = std::time::Instant::now();
    let opts = guest_ssh_options(dir);
    let out = dir.join("lab");
    // The stripped copy: the lab copies itself to the guest's memory.
    let mut c = std::process::Command::new(exe);
    c.arg("lab").args(common::LAB_AT_ONCE).args([
        "--quick", "--suite", "micro", "--repeat", "1", "--size", "16M", "--runtime", "1", "--protocols", "nvme", "--peers", "nvmet",
        "--clients", "blockwire,kernel", "--tls", "on", "--micro-workloads", "randread-4k-qd1", "--data-addr", "10.0.2.15",
    ]);
    c.arg("--target-host").arg(format!("ssh://root@127.0.0.1:{}", ssh[0]));
    c.arg("--client-host").arg(format!("ssh://root@127.0.0.1:{}", ssh[1]));
    for o in &opts {
        c.arg("--ssh-option").arg(o);
    }
    let mut child = c.arg("--out").arg(&out).stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().expect("start the lab");
    let (st, text) = crate::lab_ssh::wait_done(&mut child, Duration::from_secs(600), "the lab");
    eprintln!("{text}");
    assert!(st.success(), "the lab failed: {text}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let subject = |k: &str| r["subjects"].as_array().unwrap().iter().find(|s| s["key"] == k).cloned().unwrap_or_else(|| panic!("no subject {k}: {text}"));
    for (k, says) in [
        ("nvmet-nvme", "TLS_AES_128_GCM_SHA256 ktls records (tlshd handshake)"),
        ("nvmet-nvme", "client ktls records"),
        ("blockwire-nvme", "ktls records"),
        ("kernel-nvme@nvmet", "client ktls records (nvme connect --tls"),
        ("kernel-nvme@blockwire", "client ktls records (nvme connect --tls"),
    ] {
        let s = subject(k);
        eprintln!("{k}: datapaths {}; settings {}", s["target_datapath"], s["settings"]);
        let samples: Vec<&Value> = r["samples"].as_array().unwrap().iter().filter(|x| x["subject"] == k).collect();
        assert!(!samples.is_empty() && samples.iter().all(|x| x["bench"]["ios"].as_u64().unwrap_or(0) > 0), "{k}: no samples over TLS: {text}");
        assert!(s["target_datapath"].to_string().contains(says), "{k}: datapath {} lacks {says:?}", s["target_datapath"]);
    }
    let settings = subject("nvmet-nvme")["settings"].as_str().unwrap_or_default().to_string();
    assert!(settings.contains("NVMe/TCP over TLS 1.3 required") && settings.contains("records by the kernel (kTLS)"), "nvmet's settings: {settings}");
    // Nothing of the run left in the guest: its subsystem, ports, PSKs.
    let left = guest_sh(
        dir,
        ssh[0],
        "ls /sys/kernel/config/nvmet/subsystems | grep blockwire.lab; ls /sys/kernel/config/nvmet/ports | grep -vx 1 | grep -vx 2; \
             h=nqn.2026-11.org.blockwire.lab:tls-client; for n in nqn.2026-11.org.blockwire.lab:nvmet nqn.2026-11.org.blockwire.lab:disk; do \
             keyctl show %:.nvme | grep -F \"psk: NVMe0R01 $h $n\"; done; \
             ls /sys/class/nvme-subsystem; pidof fio; true",
    );
    assert!(left.trim().is_empty(), "left in the guest after the lab: {left}");
    t0.elapsed()
}

/// The ssh options for the guest (the client key made in `dir`).
fn guest_ssh_options(dir: &std::path::Path) -> [String; 4] {
    let key = dir.join("client").display().to_string();
    ["StrictHostKeyChecking=no".to_string(), "UserKnownHostsFile=/dev/null".into(), format!("IdentityFile={key}"), "LogLevel=ERROR".into()]
}

/// What `line` prints in the guest, over ssh.
fn guest_sh(dir: &std::path::Path, port: u16, line: &str) -> String {
    let o = std::process::Command::new("ssh")
        .args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=5"])
        .args(guest_ssh_options(dir).iter().flat_map(|o| ["-o".to_string(), o.clone()]))
        .args(["-p", &port.to_string(), "root@127.0.0.1", line])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}
