//! The TCP congestion control of iSCSI and NVMe/TCP connections, as the
//! kernel reports it for both ends (`ss -ti`), in a namespace whose default
//! is BBR: `auto` (the default) runs cubic on a connection within the
//! machine and keeps BBR for one from another address; `system` keeps the
//! default everywhere; a name is used on every connection.

use crate::common;
use common::*;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.org.blockwire:cc-test";
const IQN: &str = "iqn.2026-11.org.blockwire:cc-test";

/// `ss` in `netns` (None: this namespace).
fn ss(netns: Option<&str>, filter: &str) -> String {
    match netns {
        Some(ns) => sh(&format!("ip netns exec {ns} ss -tinH state established '{filter}'")),
        None => sh(&format!("ss -tinH state established '{filter}'")),
    }
}

/// The congestion-control names `ss -ti` shows for the sockets matching
/// `filter`: the first word of each socket's info line.
fn algorithms(netns: Option<&str>, filter: &str) -> Vec<String> {
    let out = ss(netns, filter);
    out.lines()
        .filter(|l| l.starts_with(char::is_whitespace))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// `blockwire bench` against `url` for a few seconds, in the background.
fn bench(netns: Option<&str>, url: &str, extra: &[&str]) -> Child {
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(blockwire_bin());
            c
        }
        None => Command::new(blockwire_bin()),
    };
    c.args(["bench", url, "--rw", "read", "--bs", "64k", "--iodepth", "4", "--runtime", "4"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn blockwire bench")
}

/// While a bench runs, what the target's sockets on `port` (in `target_ns`)
/// and the initiator's (in `client_ns`) run. Waits until the I/O
/// connections exist (NVMe/TCP: admin and I/O queue; iSCSI: one).
fn while_running(target_ns: Option<&str>, client_ns: Option<&str>, port: u16, url: &str, extra: &[&str], conns: usize) -> (Vec<String>, Vec<String>) {
    let mut b = bench(client_ns, url, extra);
    let deadline = Instant::now() + Duration::from_secs(20);
    let found = loop {
        let t = algorithms(target_ns, &format!("( sport = :{port} )"));
        let c = algorithms(client_ns, &format!("( dport = :{port} )"));
        if t.len() >= conns && c.len() >= conns {
            break (t, c);
        }
        if Instant::now() > deadline || b.try_wait().ok().flatten().is_some() {
            let _ = b.kill();
            let _ = b.wait();
            panic!("no {conns} connections to port {port} seen (target {t:?}, initiator {c:?})");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let st = b.wait().expect("wait for bench");
    assert!(st.success(), "bench {url} {extra:?}: {st}");
    found
}

fn config(dir: &TempDir, listen: &[String], iscsi_port: u16) -> String {
    let l: Vec<String> = listen.iter().map(|a| format!("{a:?}")).collect();
    let cfg = dir.path().join("serve.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[volume]]\nname = \"d\"\nbackend = \"ram:64M\"\n\
             [nvme]\nlisten = [{}]\n[[nvme.subsystem]]\nnqn = \"{NQN}\"\nnamespaces = [{{ nsid = 1, volume = \"d\" }}]\n\
             [iscsi]\nlisten = [\"127.0.0.1:{iscsi_port}\"]\n[[iscsi.target]]\niqn = \"{IQN}\"\nluns = [{{ lun = 0, volume = \"d\" }}]\n",
            l.join(", ")
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_string()
}

fn all(v: &[String], want: &str) -> bool {
    !v.is_empty() && v.iter().all(|a| a == want)
}

#[test]
fn congestion_control_per_policy_against_a_bbr_default() {
    require_root();
    let pair = NetnsPair::new("cc", 1500);
    let (_host_ip, ns_ip) = pair.with_ipv4(181);
    let ns = Some(pair.ns.as_str());
    sh(&format!("ip netns exec {} sysctl -qw net.ipv4.tcp_congestion_control=bbr", pair.ns));
    let host_default = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap().trim().to_string();
    let dir = TempDir::new("tcpcc");
    let (nport, iport) = (free_port(), free_port());
    let cfg = config(&dir, &[format!("127.0.0.1:{nport}"), format!("{ns_ip}:{nport}")], iport);
    let nvme_lo = format!("nvme+tcp://127.0.0.1:{nport}/{NQN}/1");
    let nvme_veth = format!("nvme+tcp://{ns_ip}:{nport}/{NQN}/1");
    let iscsi_lo = format!("iscsi://127.0.0.1:{iport}/{IQN}/0");

    // auto (the default on both sides).
    let serve = Serve::start_in(ns, &["--config", &cfg]);
    let (t, c) = while_running(ns, ns, nport, &nvme_lo, &[], 2);
    assert!(all(&t, "cubic") && all(&c, "cubic"), "auto, NVMe/TCP over loopback: target {t:?}, initiator {c:?}");
    let (t, c) = while_running(ns, ns, iport, &iscsi_lo, &[], 1);
    assert!(all(&t, "cubic") && all(&c, "cubic"), "auto, iSCSI over loopback: target {t:?}, initiator {c:?}");
    // From another namespace, i.e. another host's address: the target
    // keeps the namespace's BBR, the initiator its own default.
    let (t, c) = while_running(ns, None, nport, &nvme_veth, &[], 2);
    assert!(all(&t, "bbr"), "auto, NVMe/TCP from another address: target {t:?}");
    assert!(all(&c, &host_default), "auto, initiator towards another address: {c:?}, default {host_default}");
    drop(serve);

    // system: the default everywhere.
    let serve = Serve::start_in(ns, &["--config", &cfg, "--tcp-congestion", "system"]);
    let (t, c) = while_running(ns, ns, nport, &nvme_lo, &["--tcp-congestion", "system"], 2);
    assert!(all(&t, "bbr") && all(&c, "bbr"), "system, over loopback: target {t:?}, initiator {c:?}");
    drop(serve);

    // A name: that algorithm on every connection.
    let serve = Serve::start_in(ns, &["--config", &cfg, "--tcp-congestion", "reno"]);
    let (t, c) = while_running(ns, ns, iport, &iscsi_lo, &["--tcp-congestion", "reno"], 1);
    assert!(all(&t, "reno") && all(&c, "reno"), "reno, iSCSI: target {t:?}, initiator {c:?}");
    let (t, _) = while_running(ns, None, nport, &nvme_veth, &[], 2);
    assert!(all(&t, "reno"), "reno, from another address: target {t:?}");
    drop(serve);

    // A name the kernel does not have: a clear error, at start-up.
    let out = blockwire(ns, &["serve", "--config", &cfg, "--tcp-congestion", "no-such-cc"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-cc"), "{err}");
}
