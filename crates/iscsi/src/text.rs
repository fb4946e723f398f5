//! Login/Text key=value data (RFC 7143 section 6): `key=value\0` pairs.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    #[error("text is not UTF-8")]
    NotUtf8,
    #[error("pair {0:?} has no '='")]
    NoEquals(String),
    #[error("key {0:?} is empty, too long or has invalid characters")]
    BadKey(String),
    #[error("value for key {0} is longer than 8192 bytes")]
    ValueTooLong(String),
}

/// Longest key name (RFC 7143 6.1: 63 bytes).
pub const MAX_KEY_LEN: usize = 63;
/// Longest value we accept (RFC 7143 allows up to 8192 for most keys; CHAP
/// values may be larger, see [`MAX_CHAP_VALUE_LEN`]).
pub const MAX_VALUE_LEN: usize = 8192;
const MAX_CHAP_VALUE_LEN: usize = 16384;

fn key_ok(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= MAX_KEY_LEN
        && k.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'+' | b'@' | b'_' | b'#'))
}

/// Parse a complete (not continued) text data segment.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    let s = std::str::from_utf8(data).map_err(|_| TextError::NotUtf8)?;
    let mut out = Vec::new();
    for pair in s.split('\0') {
        if pair.is_empty() {
            continue; // trailing NUL, or padding NULs
        }
        let (k, v) = pair.split_once('=').ok_or_else(|| TextError::NoEquals(pair.chars().take(64).collect()))?;
        if !key_ok(k) {
            return Err(TextError::BadKey(k.chars().take(64).collect()));
        }
        let max = if k.starts_with("CHAP_") { MAX_CHAP_VALUE_LEN } else { MAX_VALUE_LEN };
        if v.len() > max {
            return Err(TextError::ValueTooLong(k.to_string()));
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

/// Encode pairs, each NUL-terminated.
pub fn encode<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref().as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_ref().as_bytes());
        out.push(0);
    }
    out
}

/// Look a key up in parsed pairs.
pub fn get<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_encodes() {
        let raw = b"InitiatorName=iqn.a:b\0SessionType=Normal\0AuthMethod=CHAP,None\0";
        let p = parse(raw).unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(get(&p, "AuthMethod"), Some("CHAP,None"));
        assert_eq!(encode(&p), raw.to_vec());
        // Empty value and '=' inside a value are legal.
        assert_eq!(parse(b"X-a=\0k=a=b\0").unwrap()[1].1, "a=b");
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse(b"novalue\0"), Err(TextError::NoEquals("novalue".into())));
        assert!(matches!(parse(b"=x\0"), Err(TextError::BadKey(_))));
        assert!(matches!(parse(b"a b=x\0"), Err(TextError::BadKey(_))));
        assert_eq!(parse(&[0xff, b'=', 0]), Err(TextError::NotUtf8));
        let long = format!("K={}\0", "x".repeat(9000));
        assert!(matches!(parse(long.as_bytes()), Err(TextError::ValueTooLong(_))));
    }
}
