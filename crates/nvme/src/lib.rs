//! NVMe command set, NVMe/TCP PDUs and controller logic; no sockets.
//!
//! - [`pdu`]: the NVMe/TCP PDU codec (common header, IC, capsules, data
//!   PDUs, R2T, TermReq; CRC32C header/data digests), data as `Bytes`.
//! - [`queue_entry`]: the 64-byte submission entry and 16-byte completion.
//! - [`fabric_queue`]: what every controller-side queue does whatever the
//!   transport (Connect, login deadline, DH-HMAC-CHAP, keep-alive, queue
//!   depth and command IDs, dispatch), driven by [`target_queue`]
//!   (NVMe/TCP: PDUs, R2T/H2CData, C2HData) and [`rdma_queue`] (NVMe/RDMA:
//!   the connection manager's private data, capsules in, RDMA READ/WRITE
//!   and SENDs out).
//! - [`host_queue`] (NVMe/TCP) and [`rdma_host`] (NVMe/RDMA): one host-side
//!   queue each, over [`in_flight`]: the commands in flight by ID.
//! - [`command_table`]: every admin and NVM command, one row each, naming
//!   its body ([`controller`]'s admin commands, [`nvm_commands`],
//!   [`reservation`]); [`admin`] (`Controller::execute_admin`) and
//!   [`nvm_io`] dispatch from it.
//! - [`status`]: status codes as Linux spells them (SCT << 8 | SC, DNR 0x4000).
//! - [`fabrics`]: Connect / Property Get/Set / Disconnect encodings.
//! - [`auth`]: in-band authentication (DH-HMAC-CHAP), both sides.
//! - [`identify`], [`logpage`]: data structures the host reads.
//! - [`controller`]: one controller's admin state machine (properties,
//!   features, AER, keep-alive, logs) and [`nvm_io`]: the NVM command set
//!   over a `bw_block::Volume` (its entry points; the commands'
//!   bodies are [`nvm_commands`]).
//! - [`limits`]: queue sizes, in-capsule data and MDTS.
//!
//! Header fields are `bw_wire::Field<Le<..>>` constants, one per field, in
//! the module of the structure they belong to (`queue_entry::sqe`,
//! `pdu::field`, `identify::ctrl`, ...).
//! - [`reservation`]: NVMe reservations on the volume's shared state
//!   (`bw_reservation`), one per volume whichever protocol asks.
//! - [`fuzzing`]: the fuzz harness bodies (crates/nvme/fuzz), replayed on
//!   the inputs that once crashed them by `tests/fuzz_regressions.rs`.
//!
//! The target and the initiator crates put sockets around these.

pub mod admin;
pub mod auth;
pub mod command_table;
pub mod controller;
pub mod fabric_queue;
pub mod fabrics;
pub mod features;
pub mod fuzzing;
pub mod host_queue;
pub mod identify;
pub mod in_flight;
pub mod limits;
mod key_text;
pub mod nvm_io;
pub mod ana;
pub mod logpage;
pub mod nvm_commands;
pub mod pdu;
pub mod queue_entry;
pub mod rdma_host;
pub mod rdma_queue;
pub mod reservation;
pub mod status;
pub mod subsystem;
pub mod target_queue;
pub mod tls_psk;

pub use queue_entry::{Cqe, Sqe};
pub use controller::{AdminOutcome, Completion, Controller};
pub use subsystem::{changed_for_host, changed_namespaces, LiveSubsystem, Namespace, Subsystem, DISCOVERY_NQN};

pub use pdu::{Digests, Pdu, PduError};
pub use status::Status;


/// Logical block size of every namespace (matches `bw_block::SECTOR_SIZE`).
pub const LBA_SIZE: u32 = 512;
/// log2 of [`LBA_SIZE`].
pub const LBA_SHIFT: u32 = 9;

/// Write `s` into a fixed field, padded with `pad` (NVMe strings are
/// space-padded ASCII; NQNs are NUL-padded).
pub(crate) fn put_str(dst: &mut [u8], s: &str, pad: u8) {
    dst.fill(pad);
    let b = s.as_bytes();
    let n = b.len().min(dst.len());
    dst[..n].copy_from_slice(&b[..n]);
}

/// Read a NUL- or space-padded ASCII field.
pub fn get_str(src: &[u8]) -> String {
    let end = src.iter().position(|&c| c == 0).unwrap_or(src.len());
    String::from_utf8_lossy(&src[..end]).trim_end().to_string()
}
