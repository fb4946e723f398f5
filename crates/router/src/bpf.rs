//! The kernel datapath: `bpf/mpls.bpf.c`, compiled by clang at build time
//! (build.rs), loaded and attached here with aya.
//!
//! The tables are filled from the same [`RouterSpec`] the userspace router
//! uses: ports (ifindex -> MAC, role), pseudowires (with the pushed header
//! encoded by `bw-mpls`), swaps and pops. `bw_mpls_tc` is attached with a
//! tcx link (Linux 6.6+) at ingress of every port; `bw_mpls_xdp` (the pop)
//! with an XDP link in generic mode on every core port of a router that has
//! pop labels. Links, programs and maps belong to this process's file
//! descriptors: when it ends, however it ends, the kernel detaches and frees
//! them. Nothing is pinned, and tcx needs no qdisc, so nothing can be left
//! behind.

use crate::run::Stats;
use crate::spec::RouterSpec;
use aya::maps::{Array, HashMap, MapData, PerCpuArray};
use aya::programs::tc::TcAttachOptions;
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType, Xdp, XdpMode};
use aya::{Ebpf, TestRun, TestRunOptions};
use bw_mpls::switch::PortId;
use bw_mpls::{ControlWord, LabelEntry, ETHERTYPE_MPLS};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The compiled object (empty when clang was missing at build time).
#[cfg(bpf_object)]
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/mpls.bpf.o"));
#[cfg(not(bpf_object))]
static OBJECT: &[u8] = &[];

const TC_PROGRAM: &str = "bw_mpls_tc";
const XDP_PROGRAM: &str = "bw_mpls_xdp";
/// Bytes the ingress edge puts in front of a customer frame.
pub const PUSH_LEN: usize = 14 + 2 * 4 + ControlWord::LEN;
const MAX_PORTS: usize = 16;
const MAX_ETHERTYPES: usize = 8;
/// Counter slots of `enum counter` in mpls.bpf.c, in order: received,
/// forwarded, then the drop reasons under bw_mpls::Drop's names, then the
/// frames the kernel refused to resize, then pops that reached tc (the XDP
/// program missing: never, unless attaching went wrong).
const COUNTER_NAMES: [&str; 15] = [
    "received",
    "forwarded",
    "runt",
    "unknown-port",
    "not-for-us",
    "not-mpls",
    "ethertype",
    "broken-stack",
    "ttl",
    "reserved-label",
    "unknown-label",
    "control-word",
    "too-big",
    "send-errors",
    "pop-without-xdp",
];
const C_PORT_BASE: u32 = 16;

// Map values, laid out as the structs in mpls.bpf.c.

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PortValue {
    mac: [u8; 6],
    customer: u8,
    index: u8,
    pw: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PseudowireValue {
    header: [u8; PUSH_LEN],
    core_index: u8,
    customer_index: u8,
    core_peer: u8,
    _pad: [u8; 3],
    core_ifindex: u32,
    customer_ifindex: u32,
    core_max_frame: u32,
    customer_max_frame: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct SwapValue {
    next_hop: [u8; 6],
    src_mac: [u8; 6],
    out_label: u32,
    ifindex: u32,
    max_frame: u32,
    index: u32,
    peer: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct SettingsValue {
    n_ethertypes: u32,
    ethertypes: [u16; MAX_ETHERTYPES],
}

// SAFETY: plain repr(C) data without padding holes the kernel could read.
unsafe impl aya::Pod for PortValue {}
// SAFETY: as above (26 + 6 bytes, then u32s: no padding).
unsafe impl aya::Pod for PseudowireValue {}
// SAFETY: as above.
unsafe impl aya::Pod for SwapValue {}
// SAFETY: as above.
unsafe impl aya::Pod for SettingsValue {}

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error(
        "this blockwire was built without the BPF datapath (clang or libbpf-dev missing at build time): install them and rebuild, or use --datapath userspace"
    )]
    NotBuilt,
    #[error("loading the BPF datapath: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("BPF program {0}: {1}")]
    Program(&'static str, aya::programs::ProgramError),
    #[error("BPF map {0}: {1}")]
    Map(&'static str, aya::maps::MapError),
    #[error("BPF object has no {0}")]
    Missing(&'static str),
    #[error("interface {iface}: {err}")]
    Interface { iface: String, err: std::io::Error },
    #[error("the BPF datapath takes at most {MAX_PORTS} ports")]
    TooManyPorts,
    #[error("the BPF datapath carries at most {MAX_ETHERTYPES} customer EtherTypes")]
    TooManyEthertypes,
    #[error(
        "attaching {program} to {iface}: {err} (the BPF datapath needs tcx and XDP links: Linux 6.6 or later)"
    )]
    Attach {
        program: &'static str,
        iface: String,
        err: aya::programs::ProgramError,
    },
}

/// What the datapath did with one frame (see [`Datapath::run_frame`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Forward {
        port: PortId,
        frame: Vec<u8>,
    },
    /// Dropped, with the counter that says why (bw_mpls::Drop::name()).
    Drop(&'static str),
}

struct Port {
    iface: String,
    ifindex: u32,
    customer: bool,
}

/// The loaded programs and their tables for one router.
pub struct Datapath {
    ebpf: Ebpf,
    ports: Vec<Port>,
    /// The pop program is used (the router has pop labels).
    xdp: bool,
    /// Keeps BPF run-time statistics on while held (BPF_ENABLE_STATS), so
    /// the programs' CPU time is readable from their fdinfo.
    _stats: Option<OwnedFd>,
}

fn map_err(name: &'static str) -> impl Fn(aya::maps::MapError) -> BpfError {
    move |e| BpfError::Map(name, e)
}

/// What the tables need to know about one port's interface.
struct PortFacts {
    ifindex: u32,
    /// MTU plus the Ethernet header.
    max_frame: u32,
    /// A veth into another namespace: frames are delivered into the other
    /// end (bpf_redirect_peer); see mpls.bpf.c, forward().
    peer: bool,
}

impl PortFacts {
    fn of(spec: &RouterSpec) -> Result<Vec<PortFacts>, BpfError> {
        let mut facts = Vec::new();
        for (_, iface) in &spec.ports {
            let interface_err = |err| BpfError::Interface {
                iface: iface.clone(),
                err,
            };
            let i = bw_net::interface_info(iface).map_err(interface_err)?;
            let ifindex = i.index as u32;
            let link = crate::netlink::link_facts(ifindex).map_err(interface_err)?;
            facts.push(PortFacts {
                ifindex,
                max_frame: (i.mtu + 14) as u32,
                peer: link.veth_to_other_netns(),
            });
        }
        Ok(facts)
    }
}

/// The `ports` table: each interface's MAC, whether it is a customer
/// port and of which pseudowire.
fn fill_ports(ebpf: &mut Ebpf, spec: &RouterSpec, facts: &[PortFacts]) -> Result<Vec<Port>, BpfError> {
    let cfg = &spec.config;
    let customer_of = |p: PortId| cfg.pseudowires.iter().position(|w| w.customer_port == p);
    let mut ports: HashMap<&mut MapData, u32, PortValue> =
        HashMap::try_from(ebpf.map_mut("ports").ok_or(BpfError::Missing("ports"))?)
            .map_err(map_err("ports"))?;
    let mut list = Vec::new();
    for (i, (_, iface)) in spec.ports.iter().enumerate() {
        let pw = customer_of(i);
        let v = PortValue {
            mac: cfg.port_macs[i],
            customer: pw.is_some() as u8,
            index: i as u8,
            pw: pw.unwrap_or(0) as u32,
        };
        ports.insert(facts[i].ifindex, v, 0).map_err(map_err("ports"))?;
        list.push(Port {
            iface: iface.clone(),
            ifindex: facts[i].ifindex,
            customer: pw.is_some(),
        });
    }
    Ok(list)
}

/// The `pseudowires` table: the header pushed and both ends' ports.
fn fill_pseudowires(ebpf: &mut Ebpf, spec: &RouterSpec, facts: &[PortFacts]) -> Result<(), BpfError> {
    let cfg = &spec.config;
    let mut pws: Array<&mut MapData, PseudowireValue> = Array::try_from(
        ebpf.map_mut("pseudowires")
            .ok_or(BpfError::Missing("pseudowires"))?,
    )
    .map_err(map_err("pseudowires"))?;
    for (i, w) in cfg.pseudowires.iter().enumerate() {
        let (core, customer) = (&facts[w.core_port], &facts[w.customer_port]);
        pws.set(
            i as u32,
            PseudowireValue {
                header: push_header(w, cfg.port_macs[w.core_port], cfg.push_ttl),
                core_index: w.core_port as u8,
                customer_index: w.customer_port as u8,
                core_peer: core.peer as u8,
                _pad: [0; 3],
                core_ifindex: core.ifindex,
                customer_ifindex: customer.ifindex,
                core_max_frame: core.max_frame,
                customer_max_frame: customer.max_frame,
            },
            0,
        )
        .map_err(map_err("pseudowires"))?;
    }
    Ok(())
}

/// The label tables: customer labels to pseudowires, swaps, pops.
fn fill_label_tables(ebpf: &mut Ebpf, spec: &RouterSpec, facts: &[PortFacts]) -> Result<(), BpfError> {
    let cfg = &spec.config;
    let mut labels: HashMap<&mut MapData, u32, u32> = HashMap::try_from(
        ebpf.map_mut("customer_labels")
            .ok_or(BpfError::Missing("customer_labels"))?,
    )
    .map_err(map_err("customer_labels"))?;
    for (i, w) in cfg.pseudowires.iter().enumerate() {
        labels
            .insert(w.customer_label, i as u32, 0)
            .map_err(map_err("customer_labels"))?;
    }

    let mut swaps: HashMap<&mut MapData, u32, SwapValue> =
        HashMap::try_from(ebpf.map_mut("swaps").ok_or(BpfError::Missing("swaps"))?)
            .map_err(map_err("swaps"))?;
    for (&label, s) in &cfg.swaps {
        let v = SwapValue {
            next_hop: s.next_hop,
            src_mac: cfg.port_macs[s.port],
            out_label: s.out_label,
            ifindex: facts[s.port].ifindex,
            max_frame: facts[s.port].max_frame,
            index: s.port as u32,
            peer: facts[s.port].peer as u32,
        };
        swaps.insert(label, v, 0).map_err(map_err("swaps"))?;
    }
    let mut pops: HashMap<&mut MapData, u32, u8> =
        HashMap::try_from(ebpf.map_mut("pops").ok_or(BpfError::Missing("pops"))?)
            .map_err(map_err("pops"))?;
    for &label in &cfg.pop_labels {
        pops.insert(label, 1, 0).map_err(map_err("pops"))?;
    }
    Ok(())
}

/// The `settings` table: the customer EtherTypes carried.
fn fill_settings(ebpf: &mut Ebpf, spec: &RouterSpec) -> Result<(), BpfError> {
    let cfg = &spec.config;
    let mut settings: Array<&mut MapData, SettingsValue> = Array::try_from(
        ebpf.map_mut("settings")
            .ok_or(BpfError::Missing("settings"))?,
    )
    .map_err(map_err("settings"))?;
    let mut s = SettingsValue {
        n_ethertypes: cfg.customer_ethertypes.len() as u32,
        ethertypes: [0; MAX_ETHERTYPES],
    };
    s.ethertypes[..cfg.customer_ethertypes.len()].copy_from_slice(&cfg.customer_ethertypes);
    settings.set(0, s, 0).map_err(map_err("settings"))?;
    Ok(())
}

/// Load (verify) the tc and XDP programs; attaching is separate.
fn load_programs(ebpf: &mut Ebpf) -> Result<(), BpfError> {
    let tc: &mut SchedClassifier = ebpf
        .program_mut(TC_PROGRAM)
        .ok_or(BpfError::Missing(TC_PROGRAM))?
        .try_into()
        .map_err(|e| BpfError::Program(TC_PROGRAM, e))?;
    tc.load().map_err(|e| BpfError::Program(TC_PROGRAM, e))?;
    let x: &mut Xdp = ebpf
        .program_mut(XDP_PROGRAM)
        .ok_or(BpfError::Missing(XDP_PROGRAM))?
        .try_into()
        .map_err(|e| BpfError::Program(XDP_PROGRAM, e))?;
    x.load().map_err(|e| BpfError::Program(XDP_PROGRAM, e))?;
    Ok(())
}

impl Datapath {
    /// Load the programs and fill the tables for `spec`; the interfaces are
    /// looked up in the current network namespace. Nothing is attached yet.
    pub fn load(spec: &RouterSpec) -> Result<Datapath, BpfError> {
        if OBJECT.is_empty() {
            return Err(BpfError::NotBuilt);
        }
        let cfg = &spec.config;
        if spec.ports.len() > MAX_PORTS {
            return Err(BpfError::TooManyPorts);
        }
        if cfg.customer_ethertypes.len() > MAX_ETHERTYPES {
            return Err(BpfError::TooManyEthertypes);
        }
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
        let mut ebpf = Ebpf::load(OBJECT)?;
        let facts = PortFacts::of(spec)?;
        let list = fill_ports(&mut ebpf, spec, &facts)?;
        fill_pseudowires(&mut ebpf, spec, &facts)?;
        fill_label_tables(&mut ebpf, spec, &facts)?;
        fill_settings(&mut ebpf, spec)?;
        load_programs(&mut ebpf)?;
        let redirect: Vec<String> = spec
            .ports
            .iter()
            .zip(&facts)
            .map(|((n, _), f)| format!("{n}:{}", if f.peer { "peer" } else { "egress" }))
            .collect();
        log::info!("router datapath bpf: ports {}", redirect.join(" "));
        Ok(Datapath {
            ebpf,
            ports: list,
            xdp: !cfg.pop_labels.is_empty(),
            _stats: stats,
        })
    }

    /// Attach: tcx ingress on every port, XDP (generic) on the core ports
    /// when the router pops. Detached when `self` is dropped.
    pub fn attach(&mut self) -> Result<(), BpfError> {
        let ports: Vec<(String, bool)> = self
            .ports
            .iter()
            .map(|p| (p.iface.clone(), p.customer))
            .collect();
        let tc: &mut SchedClassifier = self
            .ebpf
            .program_mut(TC_PROGRAM)
            .ok_or(BpfError::Missing(TC_PROGRAM))?
            .try_into()
            .map_err(|e| BpfError::Program(TC_PROGRAM, e))?;
        for (iface, _) in &ports {
            tc.attach_with_options(
                iface,
                TcAttachType::Ingress,
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            )
            .map_err(|err| BpfError::Attach {
                program: TC_PROGRAM,
                iface: iface.clone(),
                err,
            })?;
        }
        if self.xdp {
            let x: &mut Xdp = self
                .ebpf
                .program_mut(XDP_PROGRAM)
                .ok_or(BpfError::Missing(XDP_PROGRAM))?
                .try_into()
                .map_err(|e| BpfError::Program(XDP_PROGRAM, e))?;
            for (iface, _) in ports.iter().filter(|(_, customer)| !customer) {
                x.attach(iface, XdpMode::Skb)
                    .map_err(|err| BpfError::Attach {
                        program: XDP_PROGRAM,
                        iface: iface.clone(),
                        err,
                    })?;
            }
        }
        Ok(())
    }

    fn counters(&self) -> Result<Vec<u64>, BpfError> {
        let m: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(
            self.ebpf
                .map("counters")
                .ok_or(BpfError::Missing("counters"))?,
        )
        .map_err(map_err("counters"))?;
        (0..C_PORT_BASE + MAX_PORTS as u32)
            .map(|i| {
                m.get(&i, 0)
                    .map(|v| v.iter().sum())
                    .map_err(map_err("counters"))
            })
            .collect()
    }

    /// The counters, in the userspace router's form.
    pub fn stats(&self) -> Result<Stats, BpfError> {
        let c = self.counters()?;
        let mut st = Stats {
            received: c[0],
            forwarded: c[1],
            send_errors: c[13],
            ..Stats::default()
        };
        for (i, name) in COUNTER_NAMES.iter().enumerate().skip(2) {
            if c[i] > 0 && i != 13 {
                st.dropped.insert(name, c[i]);
            }
        }
        Ok(st)
    }

    /// CPU time the programs have used so far (BPF run-time statistics),
    /// and how many times they ran.
    pub fn run_time(&self) -> (Duration, u64) {
        let mut t = Duration::ZERO;
        let mut n = 0;
        for name in [TC_PROGRAM, XDP_PROGRAM] {
            let info = self.ebpf.program(name).and_then(|p| p.info().ok());
            if let Some(i) = info {
                t += i.run_time();
                n += i.run_count();
            }
        }
        (t, n)
    }

    /// Run one frame through the programs as if it had arrived on `port`
    /// (BPF_PROG_TEST_RUN: nothing is sent), for checking the datapath
    /// against `bw_mpls::LabelRouter`. The frame goes through the XDP pop
    /// program first where it is attached, as on the wire. The kernel's
    /// test run takes 14 to ~3000 bytes (one page) and refuses IPv4 frames
    /// shorter than 34 bytes and IPv6 ones shorter than 54 (EINVAL).
    pub fn run_frame(&self, port: PortId, frame: &[u8]) -> Result<Outcome, BpfError> {
        let p = self.ports.get(port).ok_or(BpfError::TooManyPorts)?;
        let before = self.counters()?;
        let mut out = vec![0u8; frame.len() + 256];
        if self.xdp && !p.customer {
            let x: &Xdp = self
                .ebpf
                .program(XDP_PROGRAM)
                .ok_or(BpfError::Missing(XDP_PROGRAM))?
                .try_into()
                .map_err(|e| BpfError::Program(XDP_PROGRAM, e))?;
            // struct xdp_md: data, data_end, data_meta, ingress_ifindex, ...
            let mut ctx = [0u8; 24];
            ctx[4..8].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
            ctx[12..16].copy_from_slice(&p.ifindex.to_ne_bytes());
            let r = x
                .test_run(TestRunOptions {
                    data_in: Some(frame),
                    data_out: Some(&mut out),
                    ctx_in: Some(&ctx),
                    ..TestRunOptions::new()
                })
                .map_err(|e| BpfError::Program(XDP_PROGRAM, e))?;
            const XDP_PASS: u32 = 2;
            if r.return_value != XDP_PASS {
                let after = self.counters()?;
                return Ok(outcome(&before, &after, &out[..r.data_size_out as usize]));
            }
        }
        let tc: &SchedClassifier = self
            .ebpf
            .program(TC_PROGRAM)
            .ok_or(BpfError::Missing(TC_PROGRAM))?
            .try_into()
            .map_err(|e| BpfError::Program(TC_PROGRAM, e))?;
        // struct __sk_buff up to ifindex (at offset 40): the device the
        // frame "arrived" on; the rest must be zero.
        let mut ctx = [0u8; 44];
        ctx[40..44].copy_from_slice(&p.ifindex.to_ne_bytes());
        let r = tc
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ctx_in: Some(&ctx),
                ..TestRunOptions::new()
            })
            .map_err(|e| BpfError::Program(TC_PROGRAM, e))?;
        let after = self.counters()?;
        Ok(outcome(&before, &after, &out[..r.data_size_out as usize]))
    }
}

/// Read the verdict off the counters that moved: a per-port slot names the
/// output port, a drop slot the reason.
fn outcome(before: &[u64], after: &[u64], frame: &[u8]) -> Outcome {
    let moved = |i: usize| after[i] > before[i];
    if let Some(port) = (0..MAX_PORTS).find(|&p| moved(C_PORT_BASE as usize + p)) {
        return Outcome::Forward {
            port,
            frame: frame.to_vec(),
        };
    }
    let reason = (2..COUNTER_NAMES.len())
        .find(|&i| moved(i))
        .map(|i| COUNTER_NAMES[i])
        .unwrap_or("no-counter");
    Outcome::Drop(reason)
}

/// The bytes the ingress edge pushes for `w`, encoded by bw-mpls.
fn push_header(w: &bw_mpls::Pseudowire, core_mac: [u8; 6], ttl: u8) -> [u8; PUSH_LEN] {
    let mut h = [0u8; PUSH_LEN];
    h[..6].copy_from_slice(&w.next_hop);
    h[6..12].copy_from_slice(&core_mac);
    h[12..14].copy_from_slice(&ETHERTYPE_MPLS.to_be_bytes());
    let entry = |label, bottom| LabelEntry {
        label,
        tc: 0,
        bottom,
        ttl,
    };
    h[14..18].copy_from_slice(&entry(w.route_label, false).encode());
    h[18..22].copy_from_slice(&entry(w.customer_label, true).encode());
    h[22..26].copy_from_slice(&ControlWord { sequence: 0 }.encode());
    h
}

/// Load, attach, say ready, and wait for `stop`; returns the counters.
pub fn run(spec: &RouterSpec, stop: Arc<AtomicBool>) -> Result<Stats, BpfError> {
    let mut dp = Datapath::load(spec)?;
    dp.attach()?;
    // Tests and the lab wait for this line.
    log::info!(
        "router datapath bpf attached (tcx ingress on every port{}); blockwire: ready",
        if dp.xdp {
            ", XDP pop on the core ports"
        } else {
            ""
        }
    );
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = dp.stats()?;
    let (t, n) = dp.run_time();
    log::info!(
        "router bpf programs ran {n} times, {:.3} s CPU ({:.0} ns per run)",
        t.as_secs_f64(),
        t.as_nanos() as f64 / n.max(1) as f64
    );
    Ok(st)
}
