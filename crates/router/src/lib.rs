//! `blockwire router`: a label-switching router, with two datapaths.
//!
//! [`spec`] turns the command line (`--port`, `--pseudowire`, `--swap`,
//! `--pop`) into a [`bw_mpls::RouterConfig`], the one description both
//! datapaths use:
//!
//! - [`run`] (userspace): one AF_PACKET socket and one thread per port,
//!   frames received in batches, each decided by the
//!   [`bw_mpls::LabelRouter`] state machine and sent in batches;
//! - [`bpf`] (kernel): tc and XDP programs (`bpf/mpls.bpf.c`) loaded with
//!   aya, tables filled from the same config, checked byte for byte against
//!   the state machine.
//!
//! See `docs/routing.md` for which is faster and why.

pub mod bpf;
pub mod netlink;
pub mod run;
pub mod spec;

pub use run::{run, Stats};
pub use spec::{parse, RouterSpec, SpecError};
