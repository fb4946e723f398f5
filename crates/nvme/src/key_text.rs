//! The text form NVMe keys travel in between people, files and tools:
//! `<PREFIX><hh>:<base64 of key || CRC-32(key), little-endian>:`, the
//! same envelope for DH-HMAC-CHAP secrets (`DHHC-1:`,
//! [`crate::auth::secret`]) and TLS pre-shared keys (`NVMeTLSkey-1:`,
//! [`crate::tls_psk`]); `hh` is two decimal digits that each format reads
//! on its own (a transformation hash). The final ':' may be left out, as
//! nvme-cli and Linux accept.

use base64::Engine;
use zeroize::Zeroizing;

/// What is wrong with an envelope (each key format words it for its users).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyTextError {
    /// Not starting with the prefix.
    Prefix,
    /// `hh` is not two decimal digits followed by ':'.
    Id,
    Base64,
    /// The decoded bytes (key and CRC) are this many, which is not one of
    /// the key lengths allowed plus 4.
    Length(usize),
    Crc,
    Trailing,
}

/// The id and the key of `text` (its length one of `key_lens`, its CRC
/// checked), which must start with `prefix`.
pub(crate) fn decode(text: &str, prefix: &str, key_lens: &[usize]) -> Result<(u8, Zeroizing<Vec<u8>>), KeyTextError> {
    let rest = text.trim().strip_prefix(prefix).ok_or(KeyTextError::Prefix)?;
    let (id, rest) = rest.split_once(':').ok_or(KeyTextError::Id)?;
    if id.len() != 2 || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(KeyTextError::Id);
    }
    let id = (id.as_bytes()[0] - b'0') * 10 + (id.as_bytes()[1] - b'0');
    let b64 = match rest.split_once(':') {
        Some((k, "")) => k,
        Some(_) => return Err(KeyTextError::Trailing),
        None => rest,
    };
    let raw = Zeroizing::new(base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| KeyTextError::Base64)?);
    if !key_lens.iter().any(|&n| n + 4 == raw.len()) {
        return Err(KeyTextError::Length(raw.len()));
    }
    let (key, crc) = raw.split_at(raw.len() - 4);
    if crc32fast::hash(key).to_le_bytes() != crc {
        return Err(KeyTextError::Crc);
    }
    Ok((id, Zeroizing::new(key.to_vec())))
}

/// `<prefix><id>:<base64(key || CRC)>:`.
pub(crate) fn encode(prefix: &str, id: u8, key: &[u8]) -> String {
    let mut raw = Zeroizing::new(key.to_vec());
    raw.extend_from_slice(&crc32fast::hash(key).to_le_bytes());
    format!("{prefix}{id:02}:{}:", base64::engine::general_purpose::STANDARD.encode(&*raw))
}
