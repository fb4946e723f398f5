//! NVMe in-band authentication: DH-HMAC-CHAP (NVMe TP 8006, now the
//! "Authentication" section of the NVMe Base specification 2.x and the
//! Auth Send / Auth Receive fabrics commands), without sockets.
//!
//! One authentication transaction runs on each queue right after its
//! Connect, when the Connect response sets AUTHREQ.ATR:
//!
//! ```text
//! host                                  controller
//! Auth Send    AUTH_Negotiate      ->   (hash and DH group lists)
//! Auth Receive                     <-   DH-HMAC-CHAP_Challenge (hash, group, C1, S1, g^x)
//! Auth Send    _Reply              ->   (R1 = HMAC(Kh', Ca1 ...), C2, S2, g^y)
//! Auth Receive                     <-   _Success1 (R2 when C2 was valid) or _Failure1
//! Auth Send    _Success2           ->   (bidirectional only) or _Failure2
//! ```
//!
//! - [`HashId`], [`DhGroup`], [`FailureReason`] (`codes.rs`): the
//!   identifiers the messages carry.
//! - [`message`]: every message's encoding and parsing, and the Auth
//!   Send/Receive command fields.
//! - [`secret`]: the `DHHC-1:<hmac>:<base64 key+CRC-32>:` representation and
//!   the key transformation HMAC(key, NQN || "NVMe-over-Fabrics").
//! - [`dh`]: the RFC 7919 groups (constant-time modular exponentiation).
//! - [`response`]: the HMAC responses and the augmented challenge.
//! - [`controller`] and [`host`]: the two state machines. Randomness comes
//!   in as [`Entropy`], drawn by the caller ([`Entropy::from_os`]).

mod codes;
pub mod controller;
pub mod dh;
mod ffdhe;
pub mod host;
pub mod message;
pub mod response;
pub mod secret;

#[cfg(test)]
mod tests;

pub use controller::ControllerAuth;
pub use host::{HostAction, HostAuth};
pub use codes::{DhGroup, FailureReason, HashId};
pub use secret::{Secret, SecretError};

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

/// What one side knows and accepts: its keys and, in preference order, the
/// hash functions and DH groups it offers (host) or may pick (controller).
#[derive(Clone, PartialEq)]
pub struct AuthConfig {
    /// The host's secret (both sides hold it).
    pub host_key: Secret,
    /// The controller's secret: bidirectional authentication when set.
    pub ctrl_key: Option<Secret>,
    pub hashes: Vec<HashId>,
    pub groups: Vec<DhGroup>,
}

impl AuthConfig {
    /// Every hash and group, in the order the controller prefers them:
    /// SHA-256 first (what Linux's target picks by default) and ffdhe2048
    /// before the larger groups and before `null`, so a host that offers
    /// everything gets a Diffie-Hellman exchange at the cheapest size.
    pub fn new(host_key: Secret, ctrl_key: Option<Secret>) -> AuthConfig {
        AuthConfig {
            host_key,
            ctrl_key,
            hashes: HashId::ALL.to_vec(),
            groups: vec![
                DhGroup::Ffdhe2048,
                DhGroup::Ffdhe3072,
                DhGroup::Ffdhe4096,
                DhGroup::Ffdhe6144,
                DhGroup::Ffdhe8192,
                DhGroup::Null,
            ],
        }
    }
}

impl fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthConfig")
            .field("host_key", &self.host_key)
            .field("ctrl_key", &self.ctrl_key)
            .field("hashes", &self.hashes)
            .field("groups", &self.groups)
            .finish()
    }
}

/// Random bytes for one transaction: the challenge, the DH private
/// exponent, and a sequence number. Drawn by the caller, so the state
/// machines stay deterministic under test.
#[derive(Clone)]
pub struct Entropy {
    pub bytes: [u8; 128],
    pub seqnum: u32,
}

impl Entropy {
    /// From the operating system's random source (no fallback), with the
    /// next sequence number of `seq`.
    pub fn from_os(seq: &SeqNum) -> Result<Entropy, getrandom::Error> {
        let mut bytes = [0u8; 128];
        getrandom::getrandom(&mut bytes)?;
        Ok(Entropy {
            bytes,
            seqnum: seq.next(),
        })
    }
    /// The challenge: `len` (at most 64) bytes.
    pub(crate) fn challenge(&self, len: usize) -> &[u8] {
        &self.bytes[..len.min(64)]
    }
    /// Material for a DH private exponent (64 bytes).
    pub(crate) fn dh_private(&self) -> &[u8] {
        &self.bytes[64..]
    }
}

impl Drop for Entropy {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.bytes);
    }
}

/// Sequence numbers (S1, S2): a counter that starts at a random value and
/// skips 0, which in a Reply means "no controller authentication". Linux
/// keeps one such counter per host and per target.
#[derive(Debug)]
pub struct SeqNum(AtomicU32);

impl SeqNum {
    pub fn new(start: u32) -> SeqNum {
        SeqNum(AtomicU32::new(start))
    }
    /// Seeded from the operating system's random source.
    pub fn from_os() -> Result<SeqNum, getrandom::Error> {
        let mut b = [0u8; 4];
        getrandom::getrandom(&mut b)?;
        Ok(SeqNum::new(u32::from_le_bytes(b)))
    }
    pub fn next(&self) -> u32 {
        loop {
            let n = self.0.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            if n != 0 {
                return n;
            }
        }
    }
}
