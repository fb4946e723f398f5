//! `blockwire router`: a label-switching router on AF_PACKET sockets.
//!
//! [`spec`] turns the command line (`--port`, `--pseudowire`, `--swap`,
//! `--pop`) into a [`bw_mpls::RouterConfig`]; [`run`] opens one socket per
//! port and one thread per port, receives frames in batches, asks the
//! [`bw_mpls::LabelRouter`] what to do with each and sends the results in
//! batches. All forwarding decisions live in `bw-mpls`; this crate only
//! moves bytes and counts.

pub mod run;
pub mod spec;

pub use run::{run, Stats};
pub use spec::{parse, RouterSpec, SpecError};
