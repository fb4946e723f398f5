//! The values DH-HMAC-CHAP computes (NVMe Base 2.x, "DH-HMAC-CHAP
//! protocol"):
//!
//! - augmented challenge, when a DH group is used:
//!   `Ca = HMAC(H(Ks), C)` with Ks the DH shared secret;
//! - host response `R1 = HMAC(Kh', Ca1 || S1 || T_ID || SC_C || "HostHost" ||
//!   NQNh || 00h || NQNc)`;
//! - controller response `R2 = HMAC(Kc', Ca2 || S2 || T_ID || SC_C ||
//!   "Controller" || NQNc || 00h || NQNh)`;
//!
//! S and T_ID little-endian, SC_C one byte (0: no secure channel), Kh' and
//! Kc' the transformed keys ([`super::Secret::transformed`]).

use super::codes::HashId;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha384, Sha512};

fn hmac_with<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    // HMAC takes keys of any length (longer ones are hashed first).
    let mut m = <M as hmac::digest::KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().to_vec()
}

/// HMAC with `hash` over the concatenation of `parts`.
pub fn hmac(hash: HashId, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    match hash {
        HashId::Sha256 => hmac_with::<Hmac<Sha256>>(key, parts),
        HashId::Sha384 => hmac_with::<Hmac<Sha384>>(key, parts),
        HashId::Sha512 => hmac_with::<Hmac<Sha512>>(key, parts),
    }
}

/// The plain hash H().
pub fn digest(hash: HashId, data: &[u8]) -> Vec<u8> {
    match hash {
        HashId::Sha256 => Sha256::digest(data).to_vec(),
        HashId::Sha384 => Sha384::digest(data).to_vec(),
        HashId::Sha512 => Sha512::digest(data).to_vec(),
    }
}

/// `HMAC(H(session_key), challenge)`.
pub fn augmented_challenge(hash: HashId, session_key: &[u8], challenge: &[u8]) -> Vec<u8> {
    let hk = zeroize::Zeroizing::new(digest(hash, session_key));
    hmac(hash, &hk, &[challenge])
}

/// What a response covers besides the key.
pub struct ResponseInput<'a> {
    pub hash: HashId,
    /// The challenge, augmented when a DH group is in use.
    pub challenge: &'a [u8],
    pub seqnum: u32,
    pub tid: u16,
    /// Secure channel concatenation (always 0 here).
    pub sc_c: u8,
    pub hostnqn: &'a str,
    pub subnqn: &'a str,
}

/// R1: the host proves it holds the host key (`key` = Kh').
pub fn host_response(key: &[u8], i: &ResponseInput) -> Vec<u8> {
    let (s, t) = (i.seqnum.to_le_bytes(), i.tid.to_le_bytes());
    hmac(
        i.hash,
        key,
        &[
            i.challenge,
            &s,
            &t,
            &[i.sc_c],
            b"HostHost",
            i.hostnqn.as_bytes(),
            &[0],
            i.subnqn.as_bytes(),
        ],
    )
}

/// R2: the controller proves it holds the controller key (`key` = Kc').
pub fn ctrl_response(key: &[u8], i: &ResponseInput) -> Vec<u8> {
    let (s, t) = (i.seqnum.to_le_bytes(), i.tid.to_le_bytes());
    hmac(
        i.hash,
        key,
        &[
            i.challenge,
            &s,
            &t,
            &[i.sc_c],
            b"Controller",
            i.subnqn.as_bytes(),
            &[0],
            i.hostnqn.as_bytes(),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc4231_case_2() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let d: &[&[u8]] = &[b"what do ya want ", b"for nothing?"];
        let want256 = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        let want512 = "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737";
        assert_eq!(hex(&hmac(HashId::Sha256, b"Jefe", d)), want256);
        assert_eq!(hex(&hmac(HashId::Sha512, b"Jefe", d)), want512);
        assert_eq!(hmac(HashId::Sha384, b"Jefe", d).len(), 48);
        assert_eq!(digest(HashId::Sha384, b"").len(), 48);
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn responses_differ_by_role_and_cover_every_field() {
        let i = ResponseInput {
            hash: HashId::Sha256,
            challenge: &[1; 32],
            seqnum: 7,
            tid: 3,
            sc_c: 0,
            hostnqn: "nqn.h",
            subnqn: "nqn.s",
        };
        let r1 = host_response(b"k", &i);
        assert_ne!(r1, ctrl_response(b"k", &i));
        for changed in [
            ResponseInput { seqnum: 8, ..i },
            ResponseInput { tid: 4, ..i },
            ResponseInput {
                challenge: &[2; 32],
                ..i
            },
            ResponseInput {
                hostnqn: "nqn.x",
                ..i
            },
            ResponseInput {
                subnqn: "nqn.x",
                ..i
            },
        ] {
            assert_ne!(host_response(b"k", &changed), r1);
        }
        // NQN boundaries are separated by the 00h byte.
        let a = ResponseInput {
            hostnqn: "nqn.ab",
            subnqn: "c",
            ..i
        };
        let b = ResponseInput {
            hostnqn: "nqn.a",
            subnqn: "bc",
            ..i
        };
        assert_ne!(host_response(b"k", &a), host_response(b"k", &b));
    }
}
