//! The net suite: iperf3 and the link shapes ([`iperf`]), run on every link
//! before any target starts ([`stage`]).

pub mod iperf;
pub mod stage;
