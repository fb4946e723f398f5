//! Log lines about refused peers, at most one per peer and interval: a
//! client that is refused a thousand times a second (wrong credentials in
//! a loop, or on purpose) must not fill the journal. The lines held back
//! are counted and said with the next one. Time is passed in, so the rule
//! is tested without a clock.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Peers remembered at most: past this, the ones not heard from for an
/// interval are forgotten (their next line is printed at once), and if all
/// were heard from, the oldest are.
const MAX_PEERS: usize = 1024;

pub struct LogThrottle {
    interval: Duration,
    peers: Mutex<HashMap<IpAddr, Peer>>,
}

struct Peer {
    /// When the last line about this peer was let through.
    said: Instant,
    /// Lines held back since.
    held: u64,
}

impl LogThrottle {
    pub fn new(interval: Duration) -> LogThrottle {
        LogThrottle { interval, peers: Mutex::new(HashMap::new()) }
    }

    /// Whether a line about `peer` at `now` is let through: `Some(n)`, with
    /// `n` lines held back since the last one (to be said with it), or
    /// `None` (held back and counted).
    pub fn admit(&self, peer: IpAddr, now: Instant) -> Option<u64> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = peers.get_mut(&peer) {
            if now.saturating_duration_since(p.said) < self.interval {
                p.held += 1;
                return None;
            }
            let held = p.held;
            *p = Peer { said: now, held: 0 };
            return Some(held);
        }
        if peers.len() >= MAX_PEERS {
            let interval = self.interval;
            peers.retain(|_, p| now.saturating_duration_since(p.said) < interval);
            while peers.len() >= MAX_PEERS {
                let oldest = *peers.iter().min_by_key(|(_, p)| p.said).map(|(ip, _)| ip).expect("not empty");
                peers.remove(&oldest);
            }
        }
        peers.insert(peer, Peer { said: now, held: 0 });
        Some(0)
    }

    /// `line` through [`LogThrottle::admit`] at warn level, with the count
    /// of the lines held back before it.
    pub fn warn(&self, peer: IpAddr, line: std::fmt::Arguments<'_>) {
        match self.admit(peer, Instant::now()) {
            Some(0) => log::warn!("{line}"),
            Some(held) => log::warn!("{line} (and {held} more like it from {peer} not logged in the last {:?})", self.interval),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_peer_and_interval_and_the_rest_counted() {
        let t = LogThrottle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        assert_eq!(t.admit(a, t0), Some(0));
        for s in 1..=5 {
            assert_eq!(t.admit(a, t0 + Duration::from_secs(s)), None, "held back within the interval");
        }
        assert_eq!(t.admit(b, t0 + Duration::from_secs(1)), Some(0), "another peer is not held back");
        assert_eq!(t.admit(a, t0 + Duration::from_secs(10)), Some(5), "the next line says how many were held");
        assert_eq!(t.admit(a, t0 + Duration::from_secs(11)), None);
    }

    #[test]
    fn the_peers_remembered_are_bounded() {
        let t = LogThrottle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 0..(MAX_PEERS as u32 + 100) {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            assert_eq!(t.admit(ip, t0 + Duration::from_millis(u64::from(i))), Some(0));
        }
        assert!(t.peers.lock().unwrap().len() <= MAX_PEERS);
    }
}
