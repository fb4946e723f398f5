//! MPLS for blockwire's label-switching router, with no sockets.
//!
//! [`label`] is the wire format of a label stack entry (RFC 3032) and of the
//! Ethernet pseudowire control word (RFC 4448); [`switch`] is the router's
//! forwarding logic: a frame and the port it came in on go in, a verdict
//! (send these bytes on that port, or drop for this reason) comes out.
//!
//! Customer frames cross the MPLS network as an Ethernet pseudowire: the
//! ingress edge pushes a two-label stack (top: the route, bottom: the
//! customer) and a control word in front of the whole customer frame, so
//! AoE (which has no IP header to route on), ARP and IPv4 all cross it
//! unchanged, broadcasts included.

pub mod label;
pub mod switch;

pub use label::{ControlWord, LabelEntry, ETHERTYPE_MPLS};
pub use switch::{Drop, LabelRouter, PortId, Pseudowire, RouterConfig, Swap, Verdict};
