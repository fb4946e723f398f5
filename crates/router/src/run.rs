//! The socket side: one AF_PACKET socket and one thread per port.

use crate::spec::RouterSpec;
use bw_mpls::{LabelRouter, Verdict, ETHERTYPE_MPLS};
use bw_net::{FrameBatch, PacketSocket};
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Every EtherType (customer ports carry AoE, IPv4 and ARP; the router
/// state machine drops the rest).
const ETH_P_ALL: u16 = 0x0003;
const BATCH: usize = 64;
/// Room for the pushed headers (Ethernet 14 + labels 8 + control word 4)
/// on top of an Ethernet frame of the largest MTU.
const HEADROOM: usize = 14 + 26 + 64;

/// What the router did, summed over its ports.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub received: u64,
    pub forwarded: u64,
    /// Drop reason name -> frames.
    pub dropped: BTreeMap<&'static str, u64>,
    /// Frames the kernel refused to send (interface down, buffer full).
    pub send_errors: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.received += o.received;
        self.forwarded += o.forwarded;
        self.send_errors += o.send_errors;
        for (k, v) in &o.dropped {
            *self.dropped.entry(k).or_default() += v;
        }
    }

    /// One line: `received N forwarded N dropped ttl=N,unknown-label=N send-errors N`.
    pub fn line(&self) -> String {
        let d: Vec<String> = self
            .dropped
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let d = if d.is_empty() {
            "none".to_string()
        } else {
            d.join(",")
        };
        format!(
            "received {} forwarded {} dropped {} send-errors {}",
            self.received, self.forwarded, d, self.send_errors
        )
    }
}

/// Open every port and forward until `stop` is set; returns the counters.
pub fn run(spec: &RouterSpec, stop: Arc<AtomicBool>) -> io::Result<Stats> {
    let router = Arc::new(
        LabelRouter::new(spec.config.clone())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
    );
    let mut socks = Vec::new();
    for (i, (name, iface)) in spec.ports.iter().enumerate() {
        let et = if router.is_customer_port(i) {
            ETH_P_ALL
        } else {
            ETHERTYPE_MPLS
        };
        let s = PacketSocket::open(iface, et)
            .map_err(|e| io::Error::new(e.kind(), format!("port {name} ({iface}): {e}")))?;
        s.set_recv_timeout(Duration::from_millis(100))?;
        let _ = s.set_buffer_sizes(4 << 20, 4 << 20);
        socks.push(s);
    }
    // Tests and the lab wait for this line: every port is open from here on.
    log::info!("router ports open; blockwire: ready");
    let frame_size = socks.iter().map(|s| s.mtu()).max().unwrap_or(1500) + HEADROOM;
    let socks = Arc::new(socks);
    let total = Arc::new(Mutex::new(Stats::default()));
    let mut threads = Vec::new();
    for port in 0..socks.len() {
        let (router, socks, stop, total) =
            (router.clone(), socks.clone(), stop.clone(), total.clone());
        let name = format!("router-{}", spec.ports[port].0);
        threads.push(std::thread::Builder::new().name(name).spawn(move || {
            let st = forward_loop(&router, &socks, port, frame_size, &stop);
            total.lock().unwrap_or_else(|p| p.into_inner()).add(&st);
        })?);
    }
    for t in threads {
        let _ = t.join();
    }
    let st = total.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(st)
}

fn forward_loop(
    router: &LabelRouter,
    socks: &[PacketSocket],
    port: usize,
    frame_size: usize,
    stop: &AtomicBool,
) -> Stats {
    let mut st = Stats::default();
    let mut inb = FrameBatch::new(BATCH, frame_size);
    // One outgoing batch per port, filled in receive order.
    let mut outb: Vec<FrameBatch> = socks
        .iter()
        .map(|_| FrameBatch::new(BATCH, frame_size))
        .collect();
    let mut counts = vec![0usize; socks.len()];
    while !stop.load(Ordering::Relaxed) {
        let n = match socks[port].recv_batch(&mut inb) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => {
                // Interface going away (a neighbour restarting): keep trying.
                log::debug!("receive on port {port}: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        st.received += n as u64;
        counts.iter_mut().for_each(|c| *c = 0);
        for i in 0..n {
            // Decide into the slot of the port most frames go to, then
            // move it if the verdict names another port (rare: only
            // three-port routers).
            let guess = (port + 1) % socks.len();
            let slot = counts[guess];
            let verdict = router.process(port, inb.frame(i), outb[guess].slot_mut(slot));
            match verdict {
                Verdict::Forward { port: out, len } if len > socks[out].mtu() + 14 => {
                    *st.dropped.entry("too-big").or_default() += 1;
                }
                Verdict::Forward { port: out, len } => {
                    if out != guess {
                        let c = counts[out];
                        let tmp = outb[guess].slot_mut(slot)[..len].to_vec();
                        outb[out].slot_mut(c)[..len].copy_from_slice(&tmp);
                        outb[out].set_len(c, len);
                        counts[out] += 1;
                    } else {
                        outb[guess].set_len(slot, len);
                        counts[guess] += 1;
                    }
                }
                Verdict::Drop(d) => *st.dropped.entry(d.name()).or_default() += 1,
            }
        }
        for (out, &c) in counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            match socks[out].send_batch(&mut outb[out], c) {
                Ok(sent) => {
                    st.forwarded += sent as u64;
                    st.send_errors += (c - sent) as u64;
                }
                Err(e) => {
                    log::debug!("send on port {out}: {e}");
                    st.send_errors += c as u64;
                }
            }
        }
    }
    st
}
