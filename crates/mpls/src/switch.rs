//! The label-switching router as a pure function of (port, frame): the
//! ingress edge pushes, switch routers swap, the egress edge pops. The
//! socket driver (`bw-router`) only moves bytes between this and the wire.

use crate::label::{
    ControlWord, LabelEntry, ENTRY_LEN, ETHERTYPE_MPLS, FIRST_UNRESERVED_LABEL, MAX_LABEL,
};
use std::collections::BTreeMap;

/// A port of the router, an index into [`RouterConfig::port_macs`].
pub type PortId = usize;
pub type Mac = [u8; 6];

const ETH_HEADER: usize = 14;
/// Deepest label stack a switch router walks looking for the bottom entry.
pub const MAX_STACK_DEPTH: usize = 8;

/// Swap an incoming top label for `out_label` and send to `next_hop` on `port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swap {
    pub out_label: u32,
    pub port: PortId,
    pub next_hop: Mac,
}

/// One customer attachment at an edge router. Frames from `customer_port`
/// leave on `core_port` with `[route_label, customer_label]` and a control
/// word; frames arriving with a local (popped) top label and
/// `customer_label` below it go back out on `customer_port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pseudowire {
    pub customer_port: PortId,
    pub core_port: PortId,
    pub route_label: u32,
    pub customer_label: u32,
    pub next_hop: Mac,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterConfig {
    /// MAC address of each port (source address of frames sent there).
    pub port_macs: Vec<Mac>,
    /// Incoming label -> swap (switch routers).
    pub swaps: BTreeMap<u32, Swap>,
    /// Labels that end at this router (egress edge): popped with the
    /// customer label below them.
    pub pop_labels: Vec<u32>,
    pub pseudowires: Vec<Pseudowire>,
    /// EtherTypes a pseudowire carries (others are dropped at both edges).
    pub customer_ethertypes: Vec<u16>,
    /// TTL of the entries the ingress edge pushes.
    pub push_ttl: u8,
}

/// EtherTypes carried by default: AoE, IPv4 and ARP (so iSCSI and NVMe/TCP
/// cross the same network as AoE).
pub const DEFAULT_CUSTOMER_ETHERTYPES: [u16; 3] = [0x88A2, 0x0800, 0x0806];

impl RouterConfig {
    pub fn new(port_macs: Vec<Mac>) -> RouterConfig {
        RouterConfig {
            port_macs,
            swaps: BTreeMap::new(),
            pop_labels: Vec::new(),
            pseudowires: Vec::new(),
            customer_ethertypes: DEFAULT_CUSTOMER_ETHERTYPES.to_vec(),
            push_ttl: 255,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("port {0} does not exist")]
    NoSuchPort(PortId),
    #[error("label {0} is reserved or out of range (use {FIRST_UNRESERVED_LABEL}..={MAX_LABEL})")]
    BadLabel(u32),
    #[error("label {0} is both swapped and popped")]
    SwapAndPop(u32),
    #[error("port {0} is the customer port of two pseudowires")]
    SharedCustomerPort(PortId),
    #[error("customer label {0} is used by two pseudowires")]
    SharedCustomerLabel(u32),
    #[error("port {0} is both a customer port and a core port")]
    CustomerPortInCore(PortId),
    #[error("push TTL must be at least 2")]
    PushTtl,
}

/// Why a frame was dropped. Every malformed or unroutable frame ends here,
/// never in a panic or a forwarded frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Drop {
    #[error("frame shorter than its headers")]
    Runt,
    #[error("frame from a port this router does not have")]
    UnknownPort,
    #[error("not addressed to this router")]
    NotForUs,
    #[error("not MPLS on a core port")]
    NotMpls,
    #[error("EtherType not carried by the pseudowire")]
    EtherTypeNotCarried,
    #[error("broken label stack")]
    BrokenStack,
    #[error("TTL expired")]
    TtlExpired,
    #[error("reserved label on top")]
    ReservedLabel,
    #[error("unknown label")]
    UnknownLabel,
    #[error("missing or bad pseudowire control word")]
    BadControlWord,
    #[error("frame too big for the output buffer")]
    TooBig,
}

impl Drop {
    /// Short stable name, for counters.
    pub fn name(&self) -> &'static str {
        match self {
            Drop::Runt => "runt",
            Drop::UnknownPort => "unknown-port",
            Drop::NotForUs => "not-for-us",
            Drop::NotMpls => "not-mpls",
            Drop::EtherTypeNotCarried => "ethertype",
            Drop::BrokenStack => "broken-stack",
            Drop::TtlExpired => "ttl",
            Drop::ReservedLabel => "reserved-label",
            Drop::UnknownLabel => "unknown-label",
            Drop::BadControlWord => "control-word",
            Drop::TooBig => "too-big",
        }
    }
}

/// What to do with one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send the first `len` bytes of the output buffer on `port`.
    Forward {
        port: PortId,
        len: usize,
    },
    Drop(Drop),
}

/// A validated configuration, ready to forward.
#[derive(Debug, Clone)]
pub struct LabelRouter {
    cfg: RouterConfig,
    /// customer port -> index into cfg.pseudowires
    by_customer_port: BTreeMap<PortId, usize>,
    /// customer label -> index into cfg.pseudowires
    by_customer_label: BTreeMap<u32, usize>,
}

fn check_label(l: u32) -> Result<(), ConfigError> {
    if (FIRST_UNRESERVED_LABEL..=MAX_LABEL).contains(&l) {
        Ok(())
    } else {
        Err(ConfigError::BadLabel(l))
    }
}

impl LabelRouter {
    pub fn new(cfg: RouterConfig) -> Result<LabelRouter, ConfigError> {
        let ports = cfg.port_macs.len();
        let port = |p: PortId| {
            if p < ports {
                Ok(())
            } else {
                Err(ConfigError::NoSuchPort(p))
            }
        };
        if cfg.push_ttl < 2 {
            return Err(ConfigError::PushTtl);
        }
        for (&l, s) in &cfg.swaps {
            check_label(l)?;
            check_label(s.out_label)?;
            port(s.port)?;
        }
        for &l in &cfg.pop_labels {
            check_label(l)?;
            if cfg.swaps.contains_key(&l) {
                return Err(ConfigError::SwapAndPop(l));
            }
        }
        let mut by_customer_port = BTreeMap::new();
        let mut by_customer_label = BTreeMap::new();
        for (i, pw) in cfg.pseudowires.iter().enumerate() {
            port(pw.customer_port)?;
            port(pw.core_port)?;
            check_label(pw.route_label)?;
            check_label(pw.customer_label)?;
            if by_customer_port.insert(pw.customer_port, i).is_some() {
                return Err(ConfigError::SharedCustomerPort(pw.customer_port));
            }
            if by_customer_label.insert(pw.customer_label, i).is_some() {
                return Err(ConfigError::SharedCustomerLabel(pw.customer_label));
            }
        }
        for pw in &cfg.pseudowires {
            let core_use = cfg.swaps.values().any(|s| s.port == pw.customer_port)
                || cfg
                    .pseudowires
                    .iter()
                    .any(|p| p.core_port == pw.customer_port);
            if core_use {
                return Err(ConfigError::CustomerPortInCore(pw.customer_port));
            }
        }
        Ok(LabelRouter {
            cfg,
            by_customer_port,
            by_customer_label,
        })
    }

    pub fn config(&self) -> &RouterConfig {
        &self.cfg
    }

    /// Is `port` a customer (plain Ethernet) port? The others carry MPLS.
    pub fn is_customer_port(&self, port: PortId) -> bool {
        self.by_customer_port.contains_key(&port)
    }

    /// Forward one frame (Ethernet header included) that arrived on
    /// `in_port`, writing the frame to send into `out`.
    pub fn process(&self, in_port: PortId, frame: &[u8], out: &mut [u8]) -> Verdict {
        match self.route(in_port, frame, out) {
            Ok((port, len)) => Verdict::Forward { port, len },
            Err(d) => Verdict::Drop(d),
        }
    }

    fn route(
        &self,
        in_port: PortId,
        frame: &[u8],
        out: &mut [u8],
    ) -> Result<(PortId, usize), Drop> {
        if in_port >= self.cfg.port_macs.len() {
            return Err(Drop::UnknownPort);
        }
        if frame.len() < ETH_HEADER {
            return Err(Drop::Runt);
        }
        if let Some(&pw) = self.by_customer_port.get(&in_port) {
            return self.push(&self.cfg.pseudowires[pw], frame, out);
        }
        if frame[..6] != self.cfg.port_macs[in_port] {
            return Err(Drop::NotForUs);
        }
        if u16::from_be_bytes([frame[12], frame[13]]) != ETHERTYPE_MPLS {
            return Err(Drop::NotMpls);
        }
        let stack = &frame[ETH_HEADER..];
        let top = LabelEntry::read(stack).ok_or(Drop::Runt)?;
        check_stack(stack)?;
        if top.label < FIRST_UNRESERVED_LABEL {
            return Err(Drop::ReservedLabel);
        }
        if top.ttl <= 1 {
            return Err(Drop::TtlExpired);
        }
        if let Some(s) = self.cfg.swaps.get(&top.label) {
            let len = frame.len();
            let o = out.get_mut(..len).ok_or(Drop::TooBig)?;
            o[..6].copy_from_slice(&s.next_hop);
            o[6..12].copy_from_slice(&self.cfg.port_macs[s.port]);
            o[12..14].copy_from_slice(&ETHERTYPE_MPLS.to_be_bytes());
            let e = LabelEntry {
                label: s.out_label,
                ttl: top.ttl - 1,
                ..top
            };
            o[14..18].copy_from_slice(&e.encode());
            o[18..].copy_from_slice(&frame[18..]);
            return Ok((s.port, len));
        }
        if self.cfg.pop_labels.contains(&top.label) {
            return self.pop(top, stack, out);
        }
        Err(Drop::UnknownLabel)
    }

    /// Ingress edge: the customer frame behind a two-label stack and a control word.
    fn push(&self, pw: &Pseudowire, frame: &[u8], out: &mut [u8]) -> Result<(PortId, usize), Drop> {
        if !self.carried(frame) {
            return Err(Drop::EtherTypeNotCarried);
        }
        let head = ETH_HEADER + 2 * ENTRY_LEN + ControlWord::LEN;
        let len = head + frame.len();
        let o = out.get_mut(..len).ok_or(Drop::TooBig)?;
        o[..6].copy_from_slice(&pw.next_hop);
        o[6..12].copy_from_slice(&self.cfg.port_macs[pw.core_port]);
        o[12..14].copy_from_slice(&ETHERTYPE_MPLS.to_be_bytes());
        let ttl = self.cfg.push_ttl;
        let route = LabelEntry {
            label: pw.route_label,
            tc: 0,
            bottom: false,
            ttl,
        };
        let customer = LabelEntry {
            label: pw.customer_label,
            tc: 0,
            bottom: true,
            ttl,
        };
        o[14..18].copy_from_slice(&route.encode());
        o[18..22].copy_from_slice(&customer.encode());
        o[22..26].copy_from_slice(&ControlWord { sequence: 0 }.encode());
        o[head..].copy_from_slice(frame);
        Ok((pw.core_port, len))
    }

    /// Egress edge: exactly [local label, customer label], a control word,
    /// then the customer frame, which goes out unchanged.
    fn pop(&self, top: LabelEntry, stack: &[u8], out: &mut [u8]) -> Result<(PortId, usize), Drop> {
        if top.bottom {
            return Err(Drop::BrokenStack);
        }
        let customer = LabelEntry::read(&stack[ENTRY_LEN..]).ok_or(Drop::BrokenStack)?;
        if !customer.bottom {
            return Err(Drop::BrokenStack);
        }
        let pw = self
            .by_customer_label
            .get(&customer.label)
            .ok_or(Drop::UnknownLabel)?;
        let pw = &self.cfg.pseudowires[*pw];
        let rest = &stack[2 * ENTRY_LEN..];
        ControlWord::read(rest).ok_or(Drop::BadControlWord)?;
        let inner = &rest[ControlWord::LEN..];
        if inner.len() < ETH_HEADER {
            return Err(Drop::Runt);
        }
        if !self.carried(inner) {
            return Err(Drop::EtherTypeNotCarried);
        }
        out.get_mut(..inner.len())
            .ok_or(Drop::TooBig)?
            .copy_from_slice(inner);
        Ok((pw.customer_port, inner.len()))
    }

    fn carried(&self, eth: &[u8]) -> bool {
        let et = u16::from_be_bytes([eth[12], eth[13]]);
        self.cfg.customer_ethertypes.contains(&et)
    }
}

/// The stack must end (bottom-of-stack bit) within the frame and within
/// [`MAX_STACK_DEPTH`] entries.
fn check_stack(stack: &[u8]) -> Result<(), Drop> {
    for i in 0..MAX_STACK_DEPTH {
        let e = LabelEntry::read(&stack[(i * ENTRY_LEN).min(stack.len())..])
            .ok_or(Drop::BrokenStack)?;
        if e.bottom {
            return Ok(());
        }
    }
    Err(Drop::BrokenStack)
}

#[cfg(test)]
mod tests;
