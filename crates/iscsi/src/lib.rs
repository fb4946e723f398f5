//! iSCSI (RFC 7143) without sockets: PDU framing and typed headers, login
//! text and key negotiation, CHAP, the target's login state machine and its
//! full-feature session logic, and the initiator's login engine. The
//! `bw-serve` and `bw-initiator` crates put these on TCP.

pub mod chap;
pub mod fuzzing;
pub mod initiator;
pub mod initiator_session;
pub mod login;
pub mod msg;
pub mod negotiate;
pub mod pdu;
pub mod session;
pub mod text;

pub use msg::Message;
pub use pdu::{Bhs, Decoder, Digests, Opcode, Pdu, PduError};
