//! iSCSI (RFC 7143) without sockets: PDU framing and typed headers, login
//! text and key negotiation, CHAP, the target's login state machine and its
//! full-feature session logic, and the initiator's login engine. The
//! `bw-serve` and `bw-initiator` crates put these on TCP.

pub mod chap;
pub mod fuzzing;
pub mod initiator_login;
pub mod initiator_session;
pub mod msg;
pub mod negotiate;
pub mod pdu;
pub mod target_login;
pub mod target_session;
pub mod task_map;
pub mod text;

pub use msg::Message;
pub use pdu::{Bhs, Decoder, Digests, Opcode, Pdu, PduError};
