//! The net suite's records: the link shapes a run used and the iperf3 runs
//! per MTU, link shape and stream count, with the ceiling (the best mean
//! rate) the report shows beside every protocol's numbers. Running iperf3
//! and shaping the links is the lab's (`bw_lab::suites::net`).

use crate::keys::LinkName;
use serde::{Deserialize, Serialize};

/// Counter deltas of the client-side veth over one run (both directions).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct WireCounters {
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub tx_packets: u64,
}

impl WireCounters {
    /// `after - before`, saturating (counters never go backwards on a live link).
    pub fn delta(before: &WireCounters, after: &WireCounters) -> WireCounters {
        WireCounters {
            rx_bytes: after.rx_bytes.saturating_sub(before.rx_bytes),
            tx_bytes: after.tx_bytes.saturating_sub(before.tx_bytes),
            rx_packets: after.rx_packets.saturating_sub(before.rx_packets),
            tx_packets: after.tx_packets.saturating_sub(before.tx_packets),
        }
    }
    pub fn bytes(&self) -> u64 {
        self.rx_bytes + self.tx_bytes
    }
    pub fn frames(&self) -> u64 {
        self.rx_packets + self.tx_packets
    }
}

/// Parallel streams per iperf3 run (study 4 in docs/studies.md went 1/2/4/8).
pub const STREAMS: [u32; 4] = [1, 2, 4, 8];

/// A link shape: unshaped veth, or a token bucket at `bits_per_s`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkShape {
    /// As given: `none`, `1gbit`, `10gbit`, `500mbit`.
    pub name: LinkName,
    pub bits_per_s: Option<u64>,
}

impl LinkShape {
    pub fn none() -> LinkShape {
        LinkShape { name: LinkName::none(), bits_per_s: None }
    }
}

/// Parse `none`, `1gbit`, `10gbit`, `100mbit` (tc's rate units).
pub fn parse_link(s: &str) -> anyhow::Result<LinkShape> {
    let s = s.trim().to_ascii_lowercase();
    if s == LinkName::NONE {
        return Ok(LinkShape::none());
    }
    let (num, mul) = if let Some(n) = s.strip_suffix("gbit") {
        (n, 1_000_000_000u64)
    } else if let Some(n) = s.strip_suffix("mbit") {
        (n, 1_000_000)
    } else {
        anyhow::bail!("invalid link {s:?} (none, or a rate such as 1gbit, 10gbit, 100mbit)");
    };
    let n: u64 = num.parse().map_err(|_| anyhow::anyhow!("invalid link rate {s:?}"))?;
    anyhow::ensure!(n > 0, "invalid link rate {s:?}");
    Ok(LinkShape { name: LinkName::new(s), bits_per_s: Some(n * mul) })
}

/// The token bucket for a rate: 4 ms of traffic, at least 64 KiB (bytes).
pub fn tbf_burst(bits_per_s: u64) -> u64 {
    (bits_per_s / 8 / 250).max(64 * 1024)
}

/// One iperf3 run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetSample {
    pub link: LinkName,
    pub mtu: u32,
    pub streams: u32,
    pub repeat: u32,
    /// Received by the server, all streams together.
    pub bits_per_s: f64,
    pub retransmits: u64,
    /// iperf3's CPU share of the client (sender) and the server (receiver), % of one CPU.
    pub client_cpu_pct: f64,
    pub server_cpu_pct: f64,
}

/// The best mean rate over stream counts at (`link`, `mtu`), in bits/s.
pub fn ceiling(samples: &[NetSample], link: &LinkName, mtu: u32) -> Option<(f64, u32)> {
    let mut best: Option<(f64, u32)> = None;
    for &n in &STREAMS {
        let v: Vec<f64> = samples.iter().filter(|s| &s.link == link && s.mtu == mtu && s.streams == n).map(|s| s.bits_per_s).collect();
        if v.is_empty() {
            continue;
        }
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        if best.is_none_or(|(b, _)| mean > b) {
            best = Some((mean, n));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_parse() {
        assert_eq!(parse_link("none").unwrap(), LinkShape::none());
        assert_eq!(parse_link("1gbit").unwrap().bits_per_s, Some(1_000_000_000));
        assert_eq!(parse_link("10Gbit").unwrap().bits_per_s, Some(10_000_000_000));
        assert_eq!(parse_link("100mbit").unwrap().bits_per_s, Some(100_000_000));
        for bad in ["", "1g", "fast", "0gbit", "-1gbit"] {
            assert!(parse_link(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ceiling_is_the_best_mean_over_stream_counts() {
        let s = |streams, bps| NetSample {
            link: "none".into(),
            mtu: 1500,
            streams,
            repeat: 1,
            bits_per_s: bps,
            retransmits: 0,
            client_cpu_pct: 0.0,
            server_cpu_pct: 0.0,
        };
        let v = vec![s(1, 5e9), s(1, 7e9), s(2, 6.5e9), s(2, 6.0e9), s(8, 1e9)];
        assert_eq!(ceiling(&v, &LinkName::none(), 1500), Some((6.25e9, 2)));
        assert_eq!(ceiling(&v, &LinkName::new("1gbit"), 1500), None);
    }
}
