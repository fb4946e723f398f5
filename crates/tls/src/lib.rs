//! TLS 1.3 with external pre-shared keys, as NVMe/TCP uses it (NVMe TCP
//! Transport Specification, "Transport Layer Security", TP 8011): only
//! TLS 1.3, only PSK authentication with (EC)DHE key exchange
//! (psk_dhe_ke: forward secrecy), only TLS_AES_128_GCM_SHA256 and
//! TLS_AES_256_GCM_SHA384 (a PSK's hash picks one), no session tickets, no
//! early data, no post-handshake messages. TLS_CHACHA20_POLY1305_SHA256
//! only for the Linux hosts whose tlshd binds a SHA-384 PSK with SHA-256
//! (see [`handshake`]): the one suite of that hash they offer.
//!
//! - [`handshake`]: the handshake through OpenSSL (rustls has no external
//!   PSKs), sans-IO: bytes in, bytes out, whole records only, with the
//!   limits a hostile peer meets before it has proven anything.
//! - [`record`]: the records after it, protected in user space
//!   ([`record::Sealer`], [`record::Opener`]) with the traffic keys the
//!   handshake leaves.
//! - [`ktls`]: the same keys handed to the kernel (`TLS_TX`/`TLS_RX`), so
//!   the socket carries plaintext for us and sendfile and gathered
//!   sendmsg keep working.
//! - [`secure`]: both over a tokio `TcpStream` — run the handshake, then
//!   kTLS where the kernel has it (or as asked), else the user-space layer.
//!
//! The NVMe-specific keys (configured, retained and TLS PSKs, identities)
//! are `bw_nvme::tls_psk`'s.

pub mod fuzzing;
pub mod handshake;
pub mod ktls;
pub mod record;
pub mod secure;

use bw_nvme::tls_psk::PskHash;

/// The cipher suites NVMe/TCP uses (the first two), and the one a Linux
/// host's tlshd 1.0 leaves for a SHA-384 PSK it binds with SHA-256.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Suite {
    Aes128GcmSha256,
    Aes256GcmSha384,
    Chacha20Poly1305Sha256,
}

impl Suite {
    /// The suite a PSK of `hash` is used with.
    pub fn of(hash: PskHash) -> Suite {
        match hash {
            PskHash::Sha256 => Suite::Aes128GcmSha256,
            PskHash::Sha384 => Suite::Aes256GcmSha384,
        }
    }
    pub fn hash(self) -> PskHash {
        match self {
            Suite::Aes128GcmSha256 => PskHash::Sha256,
            Suite::Aes256GcmSha384 => PskHash::Sha384,
            Suite::Chacha20Poly1305Sha256 => PskHash::Sha256,
        }
    }
    pub fn key_len(self) -> usize {
        match self {
            Suite::Aes128GcmSha256 => 16,
            Suite::Aes256GcmSha384 | Suite::Chacha20Poly1305Sha256 => 32,
        }
    }
    /// The IANA name (as OpenSSL's TLS 1.3 ciphersuites take it).
    pub fn name(self) -> &'static str {
        match self {
            Suite::Aes128GcmSha256 => "TLS_AES_128_GCM_SHA256",
            Suite::Aes256GcmSha384 => "TLS_AES_256_GCM_SHA384",
            Suite::Chacha20Poly1305Sha256 => "TLS_CHACHA20_POLY1305_SHA256",
        }
    }
    /// The suite's two-byte code point.
    pub fn code(self) -> [u8; 2] {
        match self {
            Suite::Aes128GcmSha256 => [0x13, 0x01],
            Suite::Aes256GcmSha384 => [0x13, 0x02],
            Suite::Chacha20Poly1305Sha256 => [0x13, 0x03],
        }
    }
    pub fn from_code(code: [u8; 2]) -> Option<Suite> {
        match code {
            [0x13, 0x01] => Some(Suite::Aes128GcmSha256),
            [0x13, 0x02] => Some(Suite::Aes256GcmSha384),
            [0x13, 0x03] => Some(Suite::Chacha20Poly1305Sha256),
            _ => None,
        }
    }
}

impl std::fmt::Display for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Who runs a connection's record layer once the handshake is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordLayer {
    /// The kernel (kTLS): the socket carries plaintext for us.
    Kernel,
    /// This process ([`record::Sealer`], [`record::Opener`]).
    User,
}

impl RecordLayer {
    /// As `session_list` and the metrics say it.
    pub fn name(self) -> &'static str {
        match self {
            RecordLayer::Kernel => "ktls",
            RecordLayer::User => "user",
        }
    }
}

impl std::fmt::Display for RecordLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which record layer a connection asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RecordChoice {
    /// The kernel's where it has kTLS, else ours.
    #[default]
    Auto,
    /// The kernel's or none (the connection fails without kTLS).
    Kernel,
    /// Ours.
    User,
}

impl RecordChoice {
    pub fn parse(s: &str) -> Option<RecordChoice> {
        Some(match s {
            "auto" => RecordChoice::Auto,
            "kernel" | "ktls" => RecordChoice::Kernel,
            "user" => RecordChoice::User,
            _ => return None,
        })
    }
}
