//! NVMe in-band authentication (DH-HMAC-CHAP) end to end:
//! - blockwire's initiator against `blockwire serve`: one-way, bidirectional,
//!   I/O queues authenticating too, wrong host secret refused, wrong
//!   controller secret detected by the host, no secret refused;
//! - a raw host that skips authentication: every other command is refused
//!   with AUTH_REQUIRED and the login timeout drops it;
//! - the configuration: secrets checked at load, hidden by --print-config;
//! - the Linux nvme-tcp host with nvme-cli (Linux 6.12: Debian's 6.1 has no
//!   CONFIG_NVME_AUTH) against `blockwire serve` (tests/kernel-vm/nvme-auth.sh).

use crate::common;
use bw_nvme::auth::host::RECEIVE_LEN;
use bw_nvme::auth::message::AuthCommand;
use bw_nvme::auth::{AuthConfig, DhGroup, Entropy, HostAction, HostAuth, Secret, SeqNum};
use bw_nvme::queue_entry::{admin, nvm, sgl, Sgl, Sqe};
use bw_nvme::fabrics::{self, reg, Property};
use bw_nvme::Status;
use common::nvme_raw::RawNvme as RawQueue;
use common::*;
use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.org.blockwire:auth";
// Secrets as `nvme gen-dhchap-key` writes them; the kernel VM test checks
// each with `nvme check-dhchap-key`.
/// 32-byte key used as it is.
const K1: &str = "DHHC-1:00:icgRoAopl0tiy0SClYpv7+LgxqHrXYjx8KqHslq+Cjci2Jq0:";
/// 64-byte key, SHA-512 transformation.
const K2: &str = "DHHC-1:03:fmr/LwuNLBEnjnefsP/MrOqUuTmdSJawd7ARVTktU4OuVqbM7G6TQN/S2d40eM8xcUN6zXQYlSRludHzlbwzBQCJBwY=:";
/// 48-byte controller key, SHA-384 transformation.
const C2: &str =
    "DHHC-1:02:phwQVxrn55BfJCE9I4UsS6K5UF+mV6Wyu9tCE6xlSiLjKDUvQ2pk53WFjssJg1vVjAzGxQ==:";
/// 32-byte key, SHA-256 transformation.
const K3: &str = "DHHC-1:01:7QK5RuEaPUsfngnaJ1Wotoi+fPJT2g0kfEHw4pAlhauh8gsx:";
/// Valid, and nobody's.
const BAD: &str = "DHHC-1:00:SoDN1KTIIw7BrNLOO2E5gZ6RT0203EbsYh0K3YjV4wWw+zY8:";

fn host(i: u32) -> String {
    format!("nqn.2026-11.org.blockwire:auth-host-{i}")
}

/// A subsystem for hosts 1 (one-way, K1), 2 (bidirectional K2/C2, sha512 and
/// ffdhe3072 only), 3 (K3, sha384 and the null group only).
fn config(dir: &TempDir, port: u16, extra: &str) -> String {
    format!(
        r#"
[[volume]]
name = "d0"
backend = "file:{}/disk.img,size=64M"
[nvme]
listen = ["127.0.0.1:{port}"]
[[nvme.subsystem]]
nqn = "{NQN}"
namespaces = [{{ nsid = 1, volume = "d0" }}]
[[nvme.subsystem.host]]
nqn = "{h1}"
dhchap_secret = "{K1}"
[[nvme.subsystem.host]]
nqn = "{h2}"
dhchap_secret = "{K2}"
dhchap_ctrl_secret = "{C2}"
dhchap_hashes = ["sha512"]
dhchap_dhgroups = ["ffdhe3072"]
[[nvme.subsystem.host]]
nqn = "{h3}"
dhchap_secret = "{K3}"
dhchap_hashes = ["sha384"]
dhchap_dhgroups = ["null"]
{extra}
"#,
        dir.path().display(),
        h1 = host(1),
        h2 = host(2),
        h3 = host(3),
    )
}

fn verify(
    port: u16,
    hostnqn: &str,
    secrets: &[(&str, &str)],
    extra: &[&str],
) -> std::process::Output {
    let url = format!("nvme+tcp://127.0.0.1:{port}/{NQN}/1");
    let mut args = vec![
        "verify",
        &url,
        "--size",
        "4M",
        "--initiator-name",
        hostnqn,
        "--timeout",
        "20",
    ];
    args.extend_from_slice(extra);
    let mut c = std::process::Command::new(blockwire_bin());
    c.args(&args)
        .env_remove("BLOCKWIRE_DHCHAP_SECRET")
        .env_remove("BLOCKWIRE_DHCHAP_CTRL_SECRET");
    for (k, v) in secrets {
        c.env(k, v);
    }
    c.output().expect("run blockwire verify")
}

fn wait_log(serve: &Serve, needle: &str) -> bool {
    serve.wait_log(needle, Duration::from_secs(10))
}

#[test]
fn blockwire_initiator_one_way_bidirectional_and_refusals() {
    let dir = TempDir::new("nva");
    let port = free_port();
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut serve = Serve::with_config(&dir, &config(&dir, port, ""), &["-v", "--metrics", &metrics]);
    let (s, c) = ("BLOCKWIRE_DHCHAP_SECRET", "BLOCKWIRE_DHCHAP_CTRL_SECRET");

    // One-way, with two I/O queues: every queue authenticates.
    let o = verify(port, &host(1), &[(s, K1)], &["--queues", "2"]);
    assert!(
        o.status.success(),
        "one-way: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    for q in 0..3 {
        let line = format!(
            "queue {q}: {} authenticated (DH-HMAC-CHAP sha256 ffdhe2048, host only)",
            host(1)
        );
        assert!(
            wait_log(&serve, &line),
            "missing {line:?}:\n{}",
            serve.log_text()
        );
    }
    // Bidirectional, flags instead of the environment.
    let o = verify(
        port,
        &host(2),
        &[],
        &["--dhchap-secret", K2, "--dhchap-ctrl-secret", C2],
    );
    assert!(
        o.status.success(),
        "bidirectional: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        wait_log(
            &serve,
            &format!(
                "{} authenticated (DH-HMAC-CHAP sha512 ffdhe3072, bidirectional)",
                host(2)
            )
        ),
        "{}",
        serve.log_text()
    );
    // The null group.
    let o = verify(port, &host(3), &[(s, K3)], &[]);
    assert!(
        o.status.success(),
        "null group: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(wait_log(
        &serve,
        &format!(
            "{} authenticated (DH-HMAC-CHAP sha384 null, host only)",
            host(3)
        )
    ));

    // Refusals, each with the reason on the host's side and the target's:
    // (what, host NQN, the host's secret flags, host says, target logs).
    type Refusal<'a> = (&'a str, String, Vec<(&'a str, &'a str)>, &'a str, &'a str);
    let cases: Vec<Refusal> = vec![
        (
            "wrong host secret",
            host(1),
            vec![(s, BAD)],
            "the controller refused authentication: authentication failed",
            "does not match its secret",
        ),
        (
            "wrong controller secret",
            host(2),
            vec![(s, K2), (c, BAD)],
            "did not prove it knows the controller secret",
            "host refused the controller's response",
        ),
        (
            "another host's secret",
            host(3),
            vec![(s, K1)],
            "refused authentication",
            "does not match its secret",
        ),
        (
            "no secret",
            host(1),
            vec![],
            "requires in-band authentication",
            "torn down: admin queue closed",
        ),
        (
            "bidirectional where not configured",
            host(1),
            vec![(s, K1), (c, C2)],
            "refused authentication",
            "no dhchap_ctrl_secret is configured",
        ),
    ];
    for (what, h, env, host_says, target_says) in cases {
        let o = verify(port, &h, &env, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{what}: verify succeeded");
        assert!(err.contains(host_says), "{what}: host said {err}");
        assert!(
            wait_log(&serve, target_says),
            "{what}: target log lacks {target_says:?}:\n{}",
            serve.log_text()
        );
    }
    // A host that is not listed at all is refused at Connect.
    let o = verify(port, &host(9), &[(s, K1)], &[]);
    assert!(
        !o.status.success()
            && String::from_utf8_lossy(&o.stderr).contains("Connect (queue 0) refused")
    );
    // Both kinds of refusal are counted per host in the metrics.
    let text = scrape_metrics(&metrics);
    let failures = |h: &str| metric_sample(&text, &format!("blockwire_target_auth_failures_total{{protocol=\"nvme-tcp\",target=\"{NQN}\",initiator=\"{h}\"}}"));
    assert!(failures(&host(1)) >= 2.0, "{text}");
    assert_eq!(failures(&host(9)), 1.0, "{text}");
    // A malformed secret is refused before anything goes on the wire.
    let o = verify(port, &host(1), &[(s, &K1.replace("icgR", "icgS"))], &[]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("CRC-32"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Secrets never reach the log.
    for secret in [K1, K2, C2, K3, BAD] {
        let b64 = secret.split(':').nth(2).unwrap();
        assert!(
            !serve.log_text().contains(b64),
            "a secret is in the target's log"
        );
    }
    assert!(serve.is_running());
    assert!(serve.stop().success());
}

/// Authentication on a raw queue (the fixture is `common::nvme_raw`).
impl RawQueue {
    /// DH-HMAC-CHAP on this queue with our host's state machine.
    fn authenticate(
        &mut self,
        qid: u16,
        hostnqn: &str,
        cfg: &Arc<AuthConfig>,
    ) -> Result<(), String> {
        let entropy = Entropy::from_os(&SeqNum::new(1)).unwrap();
        let mut h = HostAuth::new(cfg.clone(), hostnqn, NQN, qid, entropy);
        let mut act = h.start();
        loop {
            act = match act {
                HostAction::Send(b) => {
                    let mut s = AuthCommand::send_sqe(20, b.len() as u32);
                    s.set_sgl(Sgl {
                        addr: 0,
                        length: b.len() as u32,
                        kind: sgl::INCAPSULE,
                    });
                    let (c, _) = self.exchange(s, &b).ok_or("closed after Auth Send")?;
                    if !c.status.is_success() {
                        return Err(format!("Auth Send: {}", c.status));
                    }
                    h.sent()
                }
                HostAction::Receive => {
                    let (c, d) = self
                        .exchange(auth_receive(21), &[])
                        .ok_or("closed after Auth Receive")?;
                    if !c.status.is_success() {
                        return Err(format!("Auth Receive: {}", c.status));
                    }
                    h.received(&d)
                }
                HostAction::Done => return Ok(()),
                HostAction::Failed { error, .. } => return Err(error.to_string()),
            };
        }
    }

    /// Whether the target closed the connection (rather than answering or
    /// staying silent).
    fn closed_by_target(&mut self) -> bool {
        self.s
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut b = [0u8; 4096];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
            }
        }
    }
}

fn auth_receive(cid: u16) -> Sqe {
    let mut s = AuthCommand::receive_sqe(cid, RECEIVE_LEN);
    s.set_sgl(Sgl {
        addr: 0,
        length: RECEIVE_LEN,
        kind: sgl::TRANSPORT,
    });
    s
}

#[test]
fn commands_before_authentication_are_refused_and_the_login_timeout_drops_the_queue() {
    let dir = TempDir::new("nvr");
    let port = free_port();
    let mut serve = Serve::with_config(
        &dir,
        &config(&dir, port, "[limits]\nlogin_timeout_s = 3"),
        &["-v"],
    );
    let t0 = Instant::now();
    let (mut q, cqe) = RawQueue::connected(port, NQN, 0, 0xFFFF, &host(1), [7; 16]);
    assert!(cqe.status.is_success(), "{}", cqe.status);
    assert_ne!(
        cqe.dw0() & fabrics::AUTHREQ_ATR,
        0,
        "Connect response lacks AUTHREQ.ATR: {:#x}",
        cqe.dw0()
    );
    let st = q.command(Property::get_sqe(2, reg::CAP, true), &[]).expect("connection closed").status;
    assert_eq!(
        st,
        Status::AUTH_REQUIRED.dnr(),
        "Property Get before authentication: {st}"
    );
    let mut id = Sqe::new(admin::IDENTIFY, 3, 0);
    id.set_cdw(10, 1);
    assert_eq!(q.command(id, &[]).expect("connection closed").status, Status::AUTH_REQUIRED.dnr());
    // Silence: the queue goes when the login timeout passes.
    assert!(
        q.next(RawQueue::WAIT).is_none(),
        "the target sent something instead of closing"
    );
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(2900) && waited < Duration::from_secs(15),
        "closed after {waited:?} (login_timeout_s = 3)"
    );
    assert!(
        wait_log(
            &serve,
            "no DH-HMAC-CHAP authentication before the login timeout"
        ),
        "{}",
        serve.log_text()
    );
    assert!(serve.is_running());
    drop(serve);

    // A host allowed without a secret: AUTHREQ stays clear, commands run.
    let dir = TempDir::new("nvr");
    let port = free_port();
    let plain = config(&dir, port, "").replace(
        &format!("nqn = \"{}\"", host(1)),
        &format!("nqn = \"{}\"", host(8)),
    );
    let plain = plain.replace(
        "namespaces = [{ nsid = 1, volume = \"d0\" }]",
        &format!(
            "namespaces = [{{ nsid = 1, volume = \"d0\" }}]\nallowed_hosts = [\"{}\"]",
            host(1)
        ),
    );
    let serve = Serve::with_config(&dir, &plain, &[]);
    let (mut q, cqe) = RawQueue::connected(port, NQN, 0, 0xFFFF, &host(1), [7; 16]);
    assert!(cqe.status.is_success());
    assert_eq!(cqe.dw0() & fabrics::AUTHREQ_ATR, 0);
    assert!(q
        .command(Property::get_sqe(2, reg::CAP, true), &[])
        .expect("connection closed")
        .status
        .is_success());
    drop(serve);
}

#[test]
fn secrets_are_checked_at_load_and_hidden_by_print_config() {
    let dir = TempDir::new("nvc");
    let port = free_port();
    let path = dir.path().join("serve.toml");
    std::fs::write(&path, config(&dir, port, "")).unwrap();
    let o = blockwire(
        None,
        &[
            "serve",
            "--config",
            path.to_str().unwrap(),
            "--print-config",
        ],
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        text.contains("dhchap_secret") && text.contains("<redacted>"),
        "{text}"
    );
    for secret in [K1, K2, C2, K3] {
        assert!(
            !text.contains(secret.split(':').nth(2).unwrap()),
            "--print-config shows a secret:\n{text}"
        );
    }
    for (bad, says) in [
        (K1.replace("icgR", "icgS"), "CRC-32"),
        (K1.replace("DHHC-1:00", "DHHC-1:05"), "transformation id"),
        (K1.replace(":00:", ":03:"), "must be 64 bytes"),
    ] {
        std::fs::write(&path, config(&dir, port, "").replace(K1, &bad)).unwrap();
        let o = blockwire(
            None,
            &[
                "serve",
                "--config",
                path.to_str().unwrap(),
                "--print-config",
            ],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(&host(1)) && err.contains(says),
            "{bad}: {err}"
        );
        assert!(!err.contains(&bad), "the error repeats the secret: {err}");
    }
    std::fs::write(&path, config(&dir, port, "").replace(C2, K2)).unwrap();
    let o = blockwire(
        None,
        &[
            "serve",
            "--config",
            path.to_str().unwrap(),
            "--print-config",
        ],
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("two different keys"));
    std::fs::write(
        &path,
        config(&dir, port, "").replace("\"ffdhe3072\"", "\"ffdhe1024\""),
    )
    .unwrap();
    let o = blockwire(
        None,
        &[
            "serve",
            "--config",
            path.to_str().unwrap(),
            "--print-config",
        ],
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown group \"ffdhe1024\""));
}


#[test]
fn linux_host_with_nvme_cli_authenticates_against_blockwire() {
    require_root();
    let kvm = kernel_612_image();
    let dir = TempDir::new("nvl");
    let port = free_port();
    let mut serve = Serve::with_config(&dir, &config(&dir, port, ""), &["-v"]);
    let script = dir.path().join("nvme-auth.sh");
    let body = guest_script_with("nvme-host-lib.sh", "nvme-auth.sh");
    let vars = format!(
        "PORT={port}\nNQN={NQN}\nH1={}\nH2={}\nH3={}\nK1='{K1}'\nK2='{K2}'\nC2='{C2}'\nK3='{K3}'\nBAD='{BAD}'\n",
        host(1),
        host(2),
        host(3)
    );
    std::fs::write(&script, format!("{vars}{body}")).unwrap();
    let mut run = kernel_vm_in(Some(&kvm), &script, None, None);
    for _ in 0..2 {
        if !vm_boot_flaked(&run.output) {
            break;
        }
        run = kernel_vm_in(Some(&kvm), &script, None, None);
    }
    for step in [
        "AUTH-OK: nvme check-dhchap-key accepts every secret",
        "AUTH-OK: one-way authentication, I/O on two queues",
        "AUTH-OK: bidirectional authentication and I/O",
        "AUTH-OK: sha384 with the null DH group",
        "AUTH-OK: wrong host secret refused",
        "AUTH-OK: wrong controller secret detected by the host",
        "AUTH-OK: host without a secret refused",
        "AUTH-ALL-OK",
    ] {
        assert!(
            run.output.contains(step),
            "guest did not report {step:?}\n{}",
            run.output
        );
    }
    assert!(run.status.success(), "guest script failed");
    // What the target saw: the Linux host's I/O queues authenticated too,
    // and the refusals were for the right reasons.
    for line in [
        format!(
            "queue 1: {} authenticated (DH-HMAC-CHAP sha256 ffdhe2048, host only)",
            host(1)
        ),
        format!(
            "queue 2: {} authenticated (DH-HMAC-CHAP sha256 ffdhe2048, host only)",
            host(1)
        ),
        format!(
            "queue 1: {} authenticated (DH-HMAC-CHAP sha512 ffdhe3072, bidirectional)",
            host(2)
        ),
        format!(
            "{} authenticated (DH-HMAC-CHAP sha384 null, host only)",
            host(3)
        ),
        format!(
            "authentication of {} failed: the host's response does not match its secret",
            host(1)
        ),
        format!(
            "authentication of {} failed: the host refused the controller's response",
            host(2)
        ),
    ] {
        assert!(
            wait_log(&serve, &line),
            "target log lacks {line:?}:\n{}",
            serve.log_text()
        );
    }
    assert!(serve.is_running(), "target died");
    assert!(serve.stop().success());
}

#[test]
fn blockwire_initiator_authenticates_against_linux_nvmet() {
    require_root();
    let kvm = kernel_612_image();
    let dir = TempDir::new("nvn");
    let port = free_port();
    let (nqn, done) = (
        "nqn.2026-11.org.blockwire:nvmet-auth",
        "nqn.2026-11.org.blockwire:auth-done",
    );
    let script = dir.path().join("nvme-auth-target.sh");
    let body =
        std::fs::read_to_string(repo_root().join("tests/kernel-vm/nvme-auth-target.sh")).unwrap();
    let vars = format!(
        "NQN={nqn}\nDONE={done}\nH1={}\nK1='{K2}'\nC1='{C2}'\nH2={}\nK2='{K3}'\n",
        host(1),
        host(2)
    );
    std::fs::write(&script, format!("{vars}{body}")).unwrap();
    // Discovery needs no authentication on nvmet; it lists the subsystem
    // to an allowed host once the target is up.
    let up = || {
        let o = blockwire(
            None,
            &[
                "nvme",
                "discover",
                &format!("127.0.0.1:{port}"),
                "--initiator-name",
                &host(1),
                "--timeout",
                "10",
            ],
        );
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains(nqn)
    };
    let mut boots = 0;
    let vm = loop {
        boots += 1;
        let mut vm =
            BackgroundVm::start(Some(&kvm), &script, &format!("tcp:127.0.0.1:{port}-:4420"));
        match vm.wait_until(Duration::from_secs(900), up) {
            Ok(()) => break vm,
            Err(console) if vm_boot_flaked(&console) && boots < 3 => {
                eprintln!("guest boot failed (emulated timer check), booting again")
            }
            Err(console) => panic!("{console}"),
        }
    };
    let url = format!("nvme+tcp://127.0.0.1:{port}/{nqn}/1");
    let run = |h: &str, secrets: &[&str]| {
        let mut args = vec![
            "verify",
            url.as_str(),
            "--size",
            "4M",
            "--queues",
            "2",
            "--initiator-name",
            h,
            "--timeout",
            "120",
        ];
        args.extend_from_slice(secrets);
        blockwire(None, &args)
    };
    let ok = |o: &std::process::Output, what: &str| {
        assert!(
            o.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let refused = |o: &std::process::Output, what: &str, says: &str| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{what}: {err}");
    };
    // Bidirectional, sha512 + ffdhe4096, admin and two I/O queues.
    ok(
        &run(
            &host(1),
            &["--dhchap-secret", K2, "--dhchap-ctrl-secret", C2],
        ),
        "bidirectional against nvmet",
    );
    // One-way, sha384 + null group.
    ok(
        &run(&host(2), &["--dhchap-secret", K3]),
        "one-way against nvmet",
    );
    // nvmet tears the controller down as it answers with Failure1, and the
    // answer does not always make it out: either way it is a refusal.
    let o = run(&host(1), &["--dhchap-secret", BAD]);
    let err = String::from_utf8_lossy(&o.stderr);
    let says = [
        "the controller refused authentication: authentication failed",
        "closed the connection after our DH-HMAC-CHAP_Reply",
    ];
    assert!(
        !o.status.success() && says.iter().any(|s| err.contains(s)),
        "wrong host secret: {err}"
    );
    refused(
        &run(
            &host(1),
            &["--dhchap-secret", K2, "--dhchap-ctrl-secret", BAD],
        ),
        "wrong controller secret",
        "did not prove it knows the controller secret",
    );
    refused(
        &run(&host(2), &[]),
        "no secret",
        "requires in-band authentication",
    );
    // Tell the guest we are done: it watches dmesg for this host NQN.
    let _ = run(done, &[]);
    let (status, all) = vm.finish();
    assert!(
        all.contains("NVMET-DONE"),
        "guest did not see the done signal"
    );
    assert!(status.success(), "kernel-vm failed: {status}");
}

/// Host 2 (bidirectional DH-HMAC-CHAP) owns a controller with an
/// authenticated I/O queue. Peers that know its host NQN but not its
/// secret try to join: one with another Host ID, one that fails its
/// authentication, one that connects a queue ID and sits on it. None of them
/// ends or blocks host 2's controller: its Keep Alive and reads go on, and
/// it connects the queue ID the third peer tried to hold.
#[test]
fn a_peer_without_the_secret_neither_ends_nor_blocks_an_authenticated_host() {
    let dir = TempDir::new("nvp");
    let port = free_port();
    let mut serve = Serve::with_config(&dir, &config(&dir, port, ""), &["-v"]);
    let mut cfg = AuthConfig::new(Secret::parse(K2).unwrap(), Some(Secret::parse(C2).unwrap()));
    cfg.groups = DhGroup::ALL.to_vec();
    let cfg = Arc::new(cfg);
    let h2 = host(2);
    let hostid = [0x22; 16];

    // Host 2: admin queue, enabled, four I/O queues granted, queue 1 open.
    let (mut admin, c) = RawQueue::connected(port, NQN, 0, 0xFFFF, &h2, hostid);
    assert!(c.status.is_success(), "{}", c.status);
    let cntlid = c.dw0() as u16;
    admin
        .authenticate(0, &h2, &cfg)
        .expect("admin queue authenticates");
    let cc = 1 | (6 << 16) | (4 << 20);
    assert!(admin
        .command(Property::set_sqe(2, reg::CC, cc), &[])
        .expect("connection closed")
        .status
        .is_success());
    let t0 = Instant::now();
    while admin
        .command(Property::get_sqe(3, reg::CSTS, false), &[])
        .expect("connection closed")
        .dw0()
        & 1
        == 0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "controller never ready"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut nq = Sqe::new(admin::SET_FEATURES, 4, 0);
    nq.set_cdw(10, bw_nvme::controller::feature::NUM_QUEUES as u32);
    nq.set_cdw(11, 3 | (3 << 16));
    assert!(admin.command(nq, &[]).expect("connection closed").status.is_success());
    let io = |qid: u16| {
        let (mut q, c) = RawQueue::connected(port, NQN, qid, cntlid, &h2, hostid);
        assert!(c.status.is_success(), "queue {qid}: Connect {}", c.status);
        q.authenticate(qid, &h2, &cfg)
            .unwrap_or_else(|e| panic!("queue {qid}: {e}"));
        q
    };
    let mut q1 = io(1);
    // Still in business: a Keep Alive on the admin queue and a read.
    let alive = |admin: &mut RawQueue, q: &mut RawQueue, what: &str| {
        let ka = admin.exchange(Sqe::new(admin::KEEP_ALIVE, 5, 0), &[]);
        assert!(
            ka.is_some_and(|(c, _)| c.status.is_success()),
            "{what}: host 2's Keep Alive failed:\n{}",
            serve.log_text()
        );
        let mut rd = Sqe::new(nvm::READ, 6, 1);
        rd.set_rw(0, 8);
        rd.set_sgl(Sgl {
            addr: 0,
            length: 4096,
            kind: sgl::TRANSPORT,
        });
        let r = q.exchange(rd, &[]);
        assert!(
            r.is_some_and(|(c, d)| c.status.is_success() && d.len() == 4096),
            "{what}: host 2's read failed:\n{}",
            serve.log_text()
        );
    };
    alive(&mut admin, &mut q1, "before");

    // A peer with host 2's NQN and another Host ID, failing to authenticate
    // if it gets that far.
    let (mut p1, c1) = RawQueue::connected(port, NQN, 2, cntlid, &h2, [0x99; 16]);
    if c1.status.is_success() {
        let _ = p1.exchange(auth_receive(1), &[]);
    }
    alive(&mut admin, &mut q1, "after a peer with another Host ID");
    assert_eq!(
        (c1.status, c1.result),
        (
            Status::CONNECT_INVALID_PARAM.dnr(),
            fabrics::ipo_data(fabrics::CD_CNTLID)
        ),
        "an I/O Connect with another Host ID"
    );

    // A peer with host 2's NQN and Host ID (neither is secret) that fails
    // its authentication: its queue alone closes.
    let (mut p2, c2) = RawQueue::connected(port, NQN, 2, cntlid, &h2, hostid);
    assert!(c2.status.is_success(), "{}", c2.status);
    assert_ne!(c2.dw0() & fabrics::AUTHREQ_ATR, 0);
    let _ = p2.exchange(auth_receive(1), &[]);
    assert!(p2.closed_by_target(), "the failing queue stays open");
    alive(
        &mut admin,
        &mut q1,
        "after a failed authentication on another queue",
    );

    // A peer that connects queue 2 and never authenticates does not hold it.
    let (p3, c3) = RawQueue::connected(port, NQN, 2, cntlid, &h2, hostid);
    assert!(c3.status.is_success(), "{}", c3.status);
    let mut q2 = io(2);
    alive(
        &mut admin,
        &mut q2,
        "on the queue a peer had connected first",
    );
    drop(p3);
    // ... and its going does not free host 2's queue ID for another.
    let (_, c4) = RawQueue::connected(port, NQN, 2, cntlid, &h2, hostid);
    assert_eq!(
        c4.status,
        Status::CONNECT_INVALID_PARAM.dnr(),
        "queue 2 is host 2's"
    );
    alive(&mut admin, &mut q1, "at the end");
    // (The target logs a connection's end after closing it.)
    assert!(
        wait_log(
            &serve,
            "authentication of nqn.2026-11.org.blockwire:auth-host-2 failed"
        ),
        "{}",
        serve.log_text()
    );
    let log = serve.log_text();
    assert!(!log.contains("torn down"), "{log}");
    assert!(serve.is_running());
    assert!(serve.stop().success());
}
