//! DH-HMAC-CHAP secrets as hosts and targets exchange them:
//! `DHHC-1:<hh>:<base64 of key || CRC-32(key), little-endian>:` where `hh`
//! is 00 (use the key as it is) or the hash (01 SHA-256, 02 SHA-384,
//! 03 SHA-512) that transforms it before use: HMAC(key, NQN ||
//! "NVMe-over-Fabrics"), the NQN being the host's for the host key and the
//! subsystem's for the controller key. Keys are 32, 48 or 64 bytes; a
//! transformed key is as long as its hash's output (nvme-cli refuses
//! others, and Linux before 6.7 computed them differently).
//!
//! `nvme gen-dhchap-key` prints this form; Linux reads it
//! (`nvme_auth_extract_key`).

use super::response::hmac;
use super::codes::HashId;
use crate::key_text::{self, KeyTextError};
use std::fmt;
use zeroize::Zeroizing;

const PREFIX: &str = "DHHC-1:";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("a DH-HMAC-CHAP secret starts with \"DHHC-1:\"")]
    Prefix,
    #[error("the transformation id after \"DHHC-1:\" must be 00, 01, 02 or 03")]
    Transform,
    #[error("the key is not valid base64")]
    Base64,
    #[error("the key is {0} bytes long; DH-HMAC-CHAP keys are 32, 48 or 64 bytes (with their CRC: 36, 52 or 68)")]
    Length(usize),
    #[error("the key's CRC-32 does not match: the secret was mistyped or truncated")]
    Crc,
    #[error(
        "a key transformed with {hash} must be {want} bytes long, not {got} (as nvme-cli checks)"
    )]
    TransformLength {
        hash: HashId,
        want: usize,
        got: usize,
    },
    #[error("unexpected text after the key's closing ':'")]
    Trailing,
}

/// A DH-HMAC-CHAP key with its transformation. Debug output never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    transform: Option<HashId>,
    key: Zeroizing<Vec<u8>>,
}

impl Secret {
    /// Parse `DHHC-1:hh:BASE64:` (the final ':' may be left out).
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let (id, key) = key_text::decode(text, PREFIX, &[32, 48, 64]).map_err(|e| match e {
            KeyTextError::Prefix => SecretError::Prefix,
            KeyTextError::Id => SecretError::Transform,
            KeyTextError::Base64 => SecretError::Base64,
            KeyTextError::Length(n) => SecretError::Length(n),
            KeyTextError::Crc => SecretError::Crc,
            KeyTextError::Trailing => SecretError::Trailing,
        })?;
        let transform = match id {
            0 => None,
            1..=3 => HashId::from_id(id),
            _ => return Err(SecretError::Transform),
        };
        Secret::from_key(&key, transform)
    }

    /// A secret from raw key bytes (32, 48 or 64 of them).
    pub fn from_key(key: &[u8], transform: Option<HashId>) -> Result<Secret, SecretError> {
        if !matches!(key.len(), 32 | 48 | 64) {
            return Err(SecretError::Length(key.len()));
        }
        if let Some(hash) = transform.filter(|h| h.digest_len() != key.len()) {
            return Err(SecretError::TransformLength {
                hash,
                want: hash.digest_len(),
                got: key.len(),
            });
        }
        Ok(Secret {
            transform,
            key: Zeroizing::new(key.to_vec()),
        })
    }

    /// The `DHHC-1:hh:BASE64:` text (what configuration files hold).
    pub fn encode(&self) -> String {
        key_text::encode(PREFIX, self.transform.map_or(0, HashId::id), &self.key)
    }

    pub fn transform(&self) -> Option<HashId> {
        self.transform
    }
    pub fn key_len(&self) -> usize {
        self.key.len()
    }

    /// The key the responses are keyed with: the key itself, or
    /// HMAC(key, `nqn` || "NVMe-over-Fabrics") with the transformation hash.
    pub fn transformed(&self, nqn: &str) -> Zeroizing<Vec<u8>> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => Zeroizing::new(hmac(h, &self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"])),
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Secret(DHHC-1:{:02x}:<{} bytes redacted>)",
            self.transform.map_or(0, HashId::id),
            self.key.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // `nvme gen-dhchap-key --secret=000102..1f --hmac=N --nqn=nqn.test:host`
    // (nvme-cli 2.3 / libnvme 1.3, run in the kernel VM). With --hmac 1 it
    // prints the key already transformed, which checks our transformation.
    const KEY: [u8; 32] = {
        let mut k = [0u8; 32];
        let mut i = 0;
        while i < 32 {
            k[i] = i as u8;
            i += 1;
        }
        k
    };

    #[test]
    fn nvme_cli_representation_and_transformation() {
        let plain =
            Secret::parse("DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:").unwrap();
        assert_eq!(&**plain.key, &KEY);
        assert_eq!(plain.transform(), None);
        assert_eq!(
            plain.encode(),
            "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:"
        );
        let cli =
            Secret::parse("DHHC-1:01:0fJS36Wnj8zkI9noG6XzglMvd8Z4FxwQFjlhA480rAFD99vN:").unwrap();
        assert_eq!(cli.transform(), Some(HashId::Sha256));
        let ours = Secret::from_key(&KEY, Some(HashId::Sha256))
            .unwrap()
            .transformed("nqn.test:host");
        assert_eq!(&**ours, &**cli.key);
        // Without the final ':' too; round trip.
        assert_eq!(
            Secret::parse("DHHC-1:01:0fJS36Wnj8zkI9noG6XzglMvd8Z4FxwQFjlhA480rAFD99vN").unwrap(),
            cli
        );
        assert_eq!(Secret::parse(&cli.encode()).unwrap(), cli);
    }

    #[test]
    fn strict_parsing() {
        let good = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
        assert_eq!(
            Secret::parse(&good.replace("DHHC-1", "DHHC-2")),
            Err(SecretError::Prefix)
        );
        assert_eq!(
            Secret::parse(&good.replace(":00:", ":04:")),
            Err(SecretError::Transform)
        );
        assert_eq!(
            Secret::parse(&good.replace(":00:", ":1:")),
            Err(SecretError::Transform)
        );
        // One character changed: the CRC catches it.
        assert_eq!(
            Secret::parse(&good.replace("AAEC", "AAED")),
            Err(SecretError::Crc)
        );
        assert_eq!(
            Secret::parse(&good.replace("KfiaR", "KfiaR=")),
            Err(SecretError::Base64)
        );
        assert_eq!(
            Secret::parse(&good.replace("AAECAwQF", "")),
            Err(SecretError::Length(30))
        );
        assert_eq!(
            Secret::parse(&format!("{good}x")),
            Err(SecretError::Trailing)
        );
        assert!(Secret::from_key(&[1; 40], None).is_err());
        // `nvme check-dhchap-key` says "Invalid key length for SHA(512)".
        let short512 = Secret::from_key(&[1; 32], None)
            .unwrap()
            .encode()
            .replace(":00:", ":03:");
        assert_eq!(
            Secret::parse(&short512),
            Err(SecretError::TransformLength {
                hash: HashId::Sha512,
                want: 64,
                got: 32
            })
        );
        let dbg = format!("{:?}", Secret::parse(good).unwrap());
        assert!(!dbg.contains("AAEC") && dbg.contains("redacted"), "{dbg}");
    }
}
