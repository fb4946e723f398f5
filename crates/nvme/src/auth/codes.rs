//! The identifiers DH-HMAC-CHAP's messages carry: hash functions (HashID),
//! Diffie-Hellman groups (DHGID) and failure reasons.

use std::fmt;

/// The hash functions DH-HMAC-CHAP defines (HashID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashId {
    Sha256 = 1,
    Sha384 = 2,
    Sha512 = 3,
}

impl HashId {
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    pub fn from_id(id: u8) -> Option<HashId> {
        HashId::ALL.into_iter().find(|h| h.id() == id)
    }
    pub fn id(self) -> u8 {
        self as u8
    }
    /// Digest length in bytes (the HL field).
    pub fn digest_len(self) -> usize {
        match self {
            HashId::Sha256 => 32,
            HashId::Sha384 => 48,
            HashId::Sha512 => 64,
        }
    }
    /// The name in configuration files: `sha256`, `sha384`, `sha512`
    /// (Linux's `hmac(sha256)` spelling is accepted too).
    pub fn name(self) -> &'static str {
        match self {
            HashId::Sha256 => "sha256",
            HashId::Sha384 => "sha384",
            HashId::Sha512 => "sha512",
        }
    }
    pub fn from_name(s: &str) -> Option<HashId> {
        let s = s.trim().to_ascii_lowercase();
        let s = s
            .strip_prefix("hmac(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or(&s);
        HashId::ALL
            .into_iter()
            .find(|h| h.name() == s || h.name().replace("sha", "sha-") == s)
    }
}

impl fmt::Display for HashId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The Diffie-Hellman groups DH-HMAC-CHAP defines (DHGID). `Null` means no
/// exchange: the challenge is used as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DhGroup {
    Null = 0,
    Ffdhe2048 = 1,
    Ffdhe3072 = 2,
    Ffdhe4096 = 3,
    Ffdhe6144 = 4,
    Ffdhe8192 = 5,
}

impl DhGroup {
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    pub fn from_id(id: u8) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| g.id() == id)
    }
    pub fn id(self) -> u8 {
        self as u8
    }
    /// Bytes of a public value (the group's prime size); 0 for `Null`.
    pub fn value_len(self) -> usize {
        self.prime_bits() as usize / 8
    }
    pub(crate) fn prime_bits(self) -> u32 {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 2048,
            DhGroup::Ffdhe3072 => 3072,
            DhGroup::Ffdhe4096 => 4096,
            DhGroup::Ffdhe6144 => 6144,
            DhGroup::Ffdhe8192 => 8192,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }
    pub fn from_name(s: &str) -> Option<DhGroup> {
        let s = s.trim().to_ascii_lowercase();
        DhGroup::ALL.into_iter().find(|g| g.name() == s)
    }
}

impl fmt::Display for DhGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reason code explanation of AUTH_Failure1/2 (the reason code itself is
/// always 01h, "authentication failure").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FailureReason(pub u8);

impl FailureReason {
    pub const FAILED: FailureReason = FailureReason(0x01);
    pub const PROTOCOL_NOT_USABLE: FailureReason = FailureReason(0x02);
    pub const CONCAT_MISMATCH: FailureReason = FailureReason(0x03);
    pub const HASH_UNUSABLE: FailureReason = FailureReason(0x04);
    pub const DHGROUP_UNUSABLE: FailureReason = FailureReason(0x05);
    pub const INCORRECT_PAYLOAD: FailureReason = FailureReason(0x06);
    pub const INCORRECT_MESSAGE: FailureReason = FailureReason(0x07);
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match *self {
            FailureReason::FAILED => "authentication failed",
            FailureReason::PROTOCOL_NOT_USABLE => "authentication protocol not usable",
            FailureReason::CONCAT_MISMATCH => "secure channel concatenation mismatch",
            FailureReason::HASH_UNUSABLE => "hash function not usable",
            FailureReason::DHGROUP_UNUSABLE => "DH group not usable",
            FailureReason::INCORRECT_PAYLOAD => "incorrect payload",
            FailureReason::INCORRECT_MESSAGE => "incorrect protocol message",
            _ => "unknown reason",
        };
        write!(f, "{what} ({:#04x})", self.0)
    }
}
