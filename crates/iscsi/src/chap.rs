//! CHAP for iSCSI login (RFC 7143 section 12.1.3, RFC 1994): response =
//! H(identifier || secret || challenge), with MD5 (CHAP_A=5) or SHA-256
//! (CHAP_A=7). Binary values travel as `0x` hex or `0b` base64.

use md5::Digest as _;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChapAlgorithm {
    Md5 = 5,
    Sha256 = 7,
}

impl ChapAlgorithm {
    pub fn from_code(c: u64) -> Option<ChapAlgorithm> {
        match c {
            5 => Some(ChapAlgorithm::Md5),
            7 => Some(ChapAlgorithm::Sha256),
            _ => None,
        }
    }
    pub fn code(self) -> u8 {
        self as u8
    }
    pub fn digest_len(self) -> usize {
        match self {
            ChapAlgorithm::Md5 => 16,
            ChapAlgorithm::Sha256 => 32,
        }
    }
    /// Pick the first algorithm we support from a `CHAP_A` list.
    pub fn choose(list: &str) -> Option<ChapAlgorithm> {
        list.split(',').filter_map(|v| crate::negotiate::parse_number(v.trim())).find_map(ChapAlgorithm::from_code)
    }
}

pub fn response(alg: ChapAlgorithm, id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
    match alg {
        ChapAlgorithm::Md5 => {
            let mut h = md5::Md5::new();
            h.update([id]);
            h.update(secret);
            h.update(challenge);
            h.finalize().to_vec()
        }
        ChapAlgorithm::Sha256 => {
            let mut h = sha2::Sha256::new();
            h.update([id]);
            h.update(secret);
            h.update(challenge);
            h.finalize().to_vec()
        }
    }
}

/// Constant-time comparison (subtle), so timing does not leak how much matched.
pub fn verify(expected: &[u8], got: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    expected.ct_eq(got).into()
}

pub fn encode_hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 + b.len() * 2);
    s.push_str("0x");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// Decode a binary value: `0x`/`0X` hex or `0b`/`0B` base64 (RFC 7143
/// 6.1), strictly: any character outside the alphabet, or base64 with
/// wrong padding, is refused. Hex may have an odd number of digits (a
/// leading zero is implied).
pub fn decode_binary(v: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        if h.is_empty() {
            return None;
        }
        if h.len() % 2 == 1 { hex::decode(format!("0{h}")) } else { hex::decode(h) }.ok()
    } else if let Some(b) = v.strip_prefix("0b").or_else(|| v.strip_prefix("0B")) {
        base64::engine::general_purpose::STANDARD.decode(b).ok().filter(|d| !d.is_empty())
    } else {
        None
    }
}

/// Random bytes for one login's CHAP identifier and challenge, drawn by the
/// caller from the operating system's generator and passed in,
/// so the login state machines stay deterministic under test. There is no
/// fallback: without the OS generator there is no login.
#[derive(Clone, Copy, Debug)]
pub struct ChapEntropy(pub [u8; 33]);

impl ChapEntropy {
    /// The CHAP identifier (CHAP_I).
    pub fn id(&self) -> u8 {
        self.0[0]
    }
    /// A challenge of `len` bytes (at most 32: the longest digest we offer).
    pub fn challenge(&self, len: usize) -> Vec<u8> {
        self.0[1..1 + len.min(32)].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_response_matches_rfc1994_shape() {
        // MD5(0x01 || "secret" || 0x00..0x0f), computed independently.
        let ch: Vec<u8> = (0..16).collect();
        let r = response(ChapAlgorithm::Md5, 1, b"secret", &ch);
        assert_eq!(r.len(), 16);
        let mut m = md5::Md5::new();
        m.update([1u8]);
        m.update(b"secret");
        m.update(&ch);
        assert_eq!(r, m.finalize().to_vec());
        assert!(verify(&r, &r.clone()));
        assert!(!verify(&r, &r[..15]));
    }

    #[test]
    fn md5_known_answer() {
        // md5(b"\x00" + b"a" + b"b") computed with Python hashlib.
        let r = response(ChapAlgorithm::Md5, 0, b"a", b"b");
        assert_eq!(encode_hex(&r), "0x1219a5ffd3f440e80e30ccf668deb6e7");
    }

    #[test]
    fn binary_encodings() {
        assert_eq!(decode_binary("0x0aFF"), Some(vec![0x0a, 0xff]));
        assert_eq!(decode_binary("0xabc"), Some(vec![0x0a, 0xbc]));
        assert_eq!(decode_binary("0bAQID"), Some(vec![1, 2, 3]));
        assert_eq!(decode_binary("0xzz"), None);
        assert_eq!(decode_binary("1234"), None);
        assert_eq!(encode_hex(&[1, 0xab]), "0x01ab");
        assert_eq!(ChapAlgorithm::choose("7,5"), Some(ChapAlgorithm::Sha256));
        assert_eq!(ChapAlgorithm::choose("6,5"), Some(ChapAlgorithm::Md5));
        assert_eq!(ChapAlgorithm::choose("6"), None);
    }

    #[test]
    fn binary_values_are_parsed_strictly() {
        // Characters outside the alphabet, bad padding, empty values.
        for bad in ["0x", "0x12 34", "0x12g4", "0b", "0bAQI", "0bAQ==x", "0bA*ID", "0bAQID=", "0xé1"] {
            assert_eq!(decode_binary(bad), None, "{bad:?} must be refused");
        }
        assert_eq!(decode_binary("0bAQ=="), Some(vec![1]));
        assert_eq!(decode_binary("0X0A"), Some(vec![10]));
    }

    #[test]
    fn challenges_come_from_the_entropy_given() {
        let e = ChapEntropy(core::array::from_fn(|i| i as u8));
        assert_eq!(e.id(), 0);
        assert_eq!(e.challenge(16), (1..17).collect::<Vec<u8>>());
        assert_eq!(e.challenge(64).len(), 32);
    }
}
