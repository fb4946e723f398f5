//! The network first, as the studies measure it: iperf3 with 1, 2, 4 and 8
//! parallel TCP streams per MTU and link shape, with the CPU share of both
//! ends (client and server namespace). The best rate is the ceiling shown
//! beside every protocol's numbers. Link shapes are tc tbf on both directions
//! of the veth pair (this kernel has no netem).

use crate::cleanup::{registry, Token};
use crate::hosts::host::Host;
use crate::network::topology::{Link, Topology};
pub use bw_lab_results::net::*;

/// iperf3's TCP port inside the target namespace.
pub const IPERF_PORT: u16 = 5201;

/// `tc` arguments that put a tbf of `bits_per_s` on `dev` (egress). The
/// bucket holds 4 ms of traffic (at least 64 KiB), enough for the kernel's
/// timer granularity at 10 Gbit/s; packets wait at most 20 ms in the queue.
pub fn tbf_args(dev: &str, bits_per_s: u64) -> Vec<String> {
    let burst = tbf_burst(bits_per_s);
    ["qdisc", "replace", "dev", dev, "root", "tbf", "rate", &format!("{bits_per_s}bit"), "burst", &burst.to_string(), "latency", "20ms"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// Shape both directions of `link` (each end's egress), or remove the
/// shaping for `none`. The qdiscs are tracked for Ctrl-C cleanup. On a
/// real NIC (allowed by `--allow-nic-changes`) the root qdisc must be the
/// kernel's default, which comes back when ours is deleted; the qdisc goes
/// into the host's state file first, so a killed run's next run removes it.
pub fn apply_shape(topo: &Topology, link: &Link, shape: &LinkShape) -> anyhow::Result<Vec<Token>> {
    let mut tokens = vec![];
    for (host, dev) in [(&topo.target, &link.target_if), (&topo.client, &link.client_if)] {
        match shape.bits_per_s {
            // The lab's own veths are reshaped freely; a real NIC only
            // from the kernel's default qdisc.
            Some(rate) if host.links_are_the_labs() => tokens.push(host.set_root_qdisc(dev, &tbf_args(dev, rate))?),
            Some(rate) => tokens.push(shape_real_nic(host, dev, rate)?),
            // The default qdisc comes back when the root one goes.
            None if host.links_are_the_labs() => {
                let _ = host.tc(&["qdisc".into(), "del".into(), "dev".into(), dev.clone(), "root".into()]);
            }
            // A real NIC's own qdiscs are never touched; ours went with
            // the previous shape's tokens.
            None => {}
        }
    }
    Ok(tokens)
}

/// A tbf on a real NIC `dev` of `host`, if its root qdisc is the kernel's
/// default (handle `0:`): one the user set up would not come back.
fn shape_real_nic(host: &Host, dev: &str, rate: u64) -> anyhow::Result<Token> {
    let now = host.run("tc", &["-j", "qdisc", "show", "dev", dev, "root"])?;
    if let Some(h) = own_root_qdisc(&now) {
        anyhow::bail!(
            "{dev} on {} has a root qdisc of its own ({h}): the lab would not put it back, so it does not shape that NIC (remove it, or use --link none)",
            host.name()
        );
    }
    host.set_root_qdisc(dev, &tbf_args(dev, rate))
}

/// The root qdisc in `tc -j qdisc show dev DEV root` output when it is not
/// the kernel's default (`kind handle`), None when it is.
fn own_root_qdisc(json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    v.as_array()?.iter().find_map(|q| {
        let handle = q.get("handle")?.as_str()?;
        (handle != "0:").then(|| format!("{} {handle}", q.get("kind").and_then(|k| k.as_str()).unwrap_or("?")))
    })
}

/// What one `iperf3 -J` run reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Iperf {
    pub bits_per_s: f64,
    pub retransmits: u64,
    pub client_cpu_pct: f64,
    pub server_cpu_pct: f64,
}

pub fn parse_iperf3_json(text: &str) -> anyhow::Result<Iperf> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| anyhow::anyhow!("iperf3 output is not JSON: {e}"))?;
    if let Some(err) = v.get("error").and_then(|e| e.as_str()) {
        anyhow::bail!("iperf3: {err}");
    }
    let end = v.get("end").ok_or_else(|| anyhow::anyhow!("iperf3 output has no end section"))?;
    let f = |path: &[&str]| -> Option<f64> {
        let mut x = end;
        for p in path {
            x = x.get(p)?;
        }
        x.as_f64()
    };
    Ok(Iperf {
        bits_per_s: f(&["sum_received", "bits_per_second"]).ok_or_else(|| anyhow::anyhow!("iperf3 output lacks end.sum_received"))?,
        retransmits: f(&["sum_sent", "retransmits"]).unwrap_or(0.0) as u64,
        client_cpu_pct: f(&["cpu_utilization_percent", "host_total"]).unwrap_or(0.0),
        server_cpu_pct: f(&["cpu_utilization_percent", "remote_total"]).unwrap_or(0.0),
    })
}

pub fn iperf3_client_args(server: &str, streams: u32, secs: u32) -> Vec<String> {
    ["-c", server, "-p", &IPERF_PORT.to_string(), "-P", &streams.to_string(), "-t", &secs.to_string(), "-J"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The net suite on one link: an iperf3 server in the target namespace,
/// clients with each stream count `repeats` times (stream counts rotated
/// between repeats, like the subjects of the other suites).
pub fn run_net(topo: &Topology, link: &Link, shape: &LinkShape, secs: u32, repeats: u32) -> anyhow::Result<Vec<NetSample>> {
    let mut server = topo.target.daemon_command("iperf3", &["-s", "-B", &link.target_ip.to_string(), "-p", &IPERF_PORT.to_string()]);
    server.stdin(topo.target.service_stdin()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let (token, _child) = registry().spawn(&mut server, "iperf3 server", crate::cleanup::Role::Service)?;
    let r = (|| {
        let ip = link.target_ip.to_string();
        // The server listens shortly after start (over ssh, a session and a
        // busy host later): retry the first connection.
        let mut first = Err(anyhow::anyhow!("iperf3 server did not answer"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline && !crate::cleanup::interrupted() {
            first = one(topo, &ip, 1, 1);
            if first.is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        first?;
        let mut out = vec![];
        for rep in 1..=repeats {
            for turn in 0..STREAMS.len() {
                if crate::cleanup::interrupted() {
                    anyhow::bail!("interrupted");
                }
                let streams = STREAMS[(turn + rep as usize - 1) % STREAMS.len()];
                let m = one(topo, &ip, streams, secs)?;
                out.push(NetSample {
                    link: shape.name.clone(),
                    mtu: link.mtu,
                    streams,
                    repeat: rep,
                    bits_per_s: m.bits_per_s,
                    retransmits: m.retransmits,
                    client_cpu_pct: m.client_cpu_pct,
                    server_cpu_pct: m.server_cpu_pct,
                });
            }
        }
        Ok(out)
    })();
    let _ = registry().release(token);
    r
}

/// One iperf3 client run. The server takes one test at a time and tells a
/// client that comes while it is still closing the previous test that it is
/// busy (a busy host makes that window wide): such a client waits and asks
/// again, for as long as a loaded machine can take to close a test.
fn one(topo: &Topology, ip: &str, streams: u32, secs: u32) -> anyhow::Result<Iperf> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = topo.client.command_with("iperf3", &iperf3_client_args(ip, streams, secs)).stdin(std::process::Stdio::null()).output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let r = topo.client.program_output(&stdout).and_then(parse_iperf3_json);
        match r {
            Err(e) if is_server_busy(&e) && std::time::Instant::now() < deadline && !crate::cleanup::interrupted() => {
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            r => return r,
        }
    }
}

fn is_server_busy(e: &anyhow::Error) -> bool {
    let e = e.to_string();
    // A busy server writes its refusal and closes without reading the
    // client's cookie, so its kernel may reset the connection before the
    // client reads the refusal: the client then reports a reset control
    // connection instead (make test on a loaded machine, 2026-11-27, between
    // two tests of the remote lab's net suite).
    e.contains("the server is busy") || (e.contains("control message") && e.contains("Connection reset by peer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tbf_bucket_covers_the_timer_tick() {
        let a = tbf_args("veth0", 10_000_000_000);
        assert_eq!(&a[..6], &["qdisc", "replace", "dev", "veth0", "root", "tbf"]);
        let at = |k: &str| a[a.iter().position(|x| x == k).unwrap() + 1].clone();
        assert_eq!(at("rate"), "10000000000bit");
        // 4 ms at 10 Gbit/s = 5 MB; a smaller bucket caps the rate below the setting.
        assert_eq!(at("burst"), "5000000");
        let b = tbf_args("v", 1_000_000);
        assert_eq!(b[b.iter().position(|x| x == "burst").unwrap() + 1], "65536");
    }

    #[test]
    fn a_real_nics_own_root_qdisc_is_told_from_the_default() {
        // `tc -j qdisc show dev X root` (iproute2 6.1): the kernel's default
        // has handle 0:, one added by hand gets 8001: and up.
        assert_eq!(own_root_qdisc(r#"[{"kind":"fq_codel","handle":"0:","root":true,"refcnt":2,"options":{}}]"#), None);
        assert_eq!(own_root_qdisc(r#"[{"kind":"mq","handle":"0:","root":true,"options":{}}]"#), None);
        assert_eq!(own_root_qdisc(r#"[{"kind":"fq","handle":"8001:","root":true,"options":{}}]"#).as_deref(), Some("fq 8001:"));
    }

    #[test]
    fn parses_iperf3_json() {
        // Trimmed from `iperf3 -c ... -P 2 -J` (iperf3 3.12).
        let text = r#"{"start":{},"intervals":[],"end":{"sum_sent":{"bytes":1250000000,"bits_per_second":9.9e9,"retransmits":3},
            "sum_received":{"bytes":1240000000,"bits_per_second":9.8e9},
            "cpu_utilization_percent":{"host_total":71.5,"host_user":2.0,"host_system":69.5,"remote_total":88.25,"remote_user":1.0,"remote_system":87.0}}}"#;
        let m = parse_iperf3_json(text).unwrap();
        assert_eq!(m, Iperf { bits_per_s: 9.8e9, retransmits: 3, client_cpu_pct: 71.5, server_cpu_pct: 88.25 });
        let err = parse_iperf3_json(r#"{"start":{},"error":"unable to connect to server: Connection refused"}"#).unwrap_err();
        assert!(format!("{err}").contains("Connection refused"));
        assert!(!is_server_busy(&err));
        // iperf3 3.12's answer to a client that comes while a test runs.
        let busy = parse_iperf3_json(r#"{"start":{},"error":"the server is busy running a test. try again later"}"#).unwrap_err();
        assert!(is_server_busy(&busy));
        // The same refusal when the server's reset overtakes it.
        let reset = parse_iperf3_json(r#"{"start":{},"error":"unable to receive control message: Connection reset by peer"}"#).unwrap_err();
        assert!(is_server_busy(&reset));
        let other_reset = parse_iperf3_json(r#"{"start":{},"error":"unable to connect to server: Connection reset by peer"}"#).unwrap_err();
        assert!(!is_server_busy(&other_reset));
        assert!(parse_iperf3_json("").is_err());
        assert!(parse_iperf3_json(r#"{"end":{}}"#).is_err());
    }
}
