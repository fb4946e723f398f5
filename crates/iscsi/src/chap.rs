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

/// Constant-time comparison, so timing does not leak how much matched.
pub fn verify(expected: &[u8], got: &[u8]) -> bool {
    expected.len() == got.len() && expected.iter().zip(got).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

pub fn encode_hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 + b.len() * 2);
    s.push_str("0x");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// Decode a binary value: `0x`/`0X` hex or `0b`/`0B` base64.
pub fn decode_binary(v: &str) -> Option<Vec<u8>> {
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        let h = if h.len() % 2 == 1 { format!("0{h}") } else { h.to_string() };
        (0..h.len()).step_by(2).map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok()).collect()
    } else if let Some(b) = v.strip_prefix("0b").or_else(|| v.strip_prefix("0B")) {
        base64_decode(b)
    } else {
        None
    }
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes() {
        acc = (acc << 6) | val(c)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Fresh random challenge bytes. Uses the kernel's generator; failing that
/// (no /dev/urandom) falls back to time and address entropy mixed by SHA-256.
pub fn random_bytes(n: usize) -> Vec<u8> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)).is_ok() {
        return buf;
    }
    let mut out = Vec::new();
    let mut ctr = 0u64;
    while out.len() < n {
        let mut h = sha2::Sha256::new();
        h.update(format!("{:?}{ctr}{:p}", std::time::SystemTime::now(), &buf).as_bytes());
        out.extend_from_slice(&h.finalize());
        ctr += 1;
    }
    out.truncate(n);
    out
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
}
