//! TLS 1.3 records (RFC 8446 section 5): the 5-byte header and its limits,
//! and the AEAD protection of one direction of a connection once the
//! handshake is over — what the user-space record layer runs, and what
//! the kernel runs instead with kTLS (the same keys and sequence numbers,
//! [`Keys`]).
//!
//! Every protected record goes out as type application_data, version
//! 0x0303, `len` bytes of AEAD (AES-GCM or ChaCha20-Poly1305) ciphertext and tag; inside, the content,
//! then its real type, then optional zero padding (we send none). The
//! nonce is the 12-byte IV XORed with the 64-bit record sequence number.

use crate::Suite;
use bw_nvme::tls_psk::hkdf_expand_label;
use bytes::BytesMut;
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use zeroize::Zeroizing;

pub const HEADER_LEN: usize = 5;
/// Most content one record carries.
pub const MAX_PLAINTEXT: usize = 1 << 14;
/// Most bytes after a record's header (RFC 8446 5.2: content, type, padding and tag).
pub const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
pub const TAG_LEN: usize = 16;
const IV_LEN: usize = 12;

/// A record's content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentType {
    ChangeCipherSpec,
    Alert,
    Handshake,
    ApplicationData,
}

impl ContentType {
    pub fn from_u8(b: u8) -> Option<ContentType> {
        Some(match b {
            20 => ContentType::ChangeCipherSpec,
            21 => ContentType::Alert,
            22 => ContentType::Handshake,
            23 => ContentType::ApplicationData,
            _ => return None,
        })
    }
    pub fn to_u8(self) -> u8 {
        match self {
            ContentType::ChangeCipherSpec => 20,
            ContentType::Alert => 21,
            ContentType::Handshake => 22,
            ContentType::ApplicationData => 23,
        }
    }
}

/// Why a record was refused; each ends the connection.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("a TLS record of unknown content type {0}")]
    ContentType(u8),
    #[error("a TLS record with version {0:#06x} (TLS records say 0x0301 to 0x0303)")]
    Version(u16),
    #[error("a TLS record of {0} bytes, over the {MAX_CIPHERTEXT} TLS allows")]
    TooLong(usize),
    #[error("a protected TLS record of {0} bytes, shorter than its tag")]
    TooShort(usize),
    #[error("a {0:?} record where only protected records may come")]
    Unprotected(ContentType),
    #[error("a TLS record failed authentication (bad_record_mac): another key, or altered on the way")]
    BadMac,
    #[error("a TLS record holding {0} bytes, over the 16384 TLS allows")]
    PlaintextTooLong(usize),
    #[error("a TLS record with no content type (all padding)")]
    NoContentType,
    #[error("the peer sent a post-handshake TLS message of type {0} (a KeyUpdate, or a renegotiation attempt): not supported by NVMe/TCP's record layer here, so the connection is closed")]
    PostHandshake(u8),
    #[error("the peer sent TLS alert {0} ({})", alert_name(*.0))]
    Alert(u8),
    #[error("a malformed TLS {0:?} record")]
    Malformed(ContentType),
}

/// RFC 8446 6's names of the alerts a peer is likely to send.
pub fn alert_name(desc: u8) -> &'static str {
    match desc {
        0 => "close_notify",
        10 => "unexpected_message",
        20 => "bad_record_mac",
        22 => "record_overflow",
        40 => "handshake_failure",
        47 => "illegal_parameter",
        50 => "decode_error",
        51 => "decrypt_error",
        70 => "protocol_version",
        80 => "internal_error",
        90 => "user_canceled",
        109 => "missing_extension",
        110 => "unsupported_extension",
        115 => "unknown_psk_identity",
        _ => "other",
    }
}

/// A record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: ContentType,
    /// Bytes after the header.
    pub len: usize,
}

impl Header {
    /// The header at the front of `b`, checked; `Ok(None)` while fewer than
    /// [`HEADER_LEN`] bytes are there.
    pub fn parse(b: &[u8]) -> Result<Option<Header>, RecordError> {
        let Some(h) = b.get(..HEADER_LEN) else { return Ok(None) };
        let kind = ContentType::from_u8(h[0]).ok_or(RecordError::ContentType(h[0]))?;
        let version = u16::from_be_bytes([h[1], h[2]]);
        if !(0x0301..=0x0303).contains(&version) {
            return Err(RecordError::Version(version));
        }
        let len = u16::from_be_bytes([h[3], h[4]]) as usize;
        if len > MAX_CIPHERTEXT {
            return Err(RecordError::TooLong(len));
        }
        Ok(Some(Header { kind, len }))
    }

    /// Header plus content.
    pub fn total(&self) -> usize {
        HEADER_LEN + self.len
    }
}

/// Whether `first` (the first bytes a peer sent) starts a TLS handshake
/// record rather than an NVMe/TCP PDU (an ICReq starts with PDU type 0):
/// `None` while too few bytes are there to tell.
pub fn starts_handshake(first: &[u8]) -> Option<bool> {
    match first {
        [] => None,
        [22] | [22, 3] => None,
        [22, 3, v, ..] => Some((1..=3).contains(v)),
        _ => Some(false),
    }
}

/// One direction's traffic keys: the AEAD key and IV derived from a
/// traffic secret (RFC 8446 7.3), and the next record's sequence number.
pub struct Keys {
    pub suite: Suite,
    pub key: Zeroizing<Vec<u8>>,
    pub iv: [u8; IV_LEN],
    pub seq: u64,
}

impl Keys {
    /// The keys of `secret` (a `*_TRAFFIC_SECRET_0`), from record 0.
    pub fn from_secret(suite: Suite, secret: &[u8]) -> Keys {
        let key = hkdf_expand_label(suite.hash(), secret, "key", b"", suite.key_len());
        let mut iv = [0u8; IV_LEN];
        iv.copy_from_slice(&hkdf_expand_label(suite.hash(), secret, "iv", b"", IV_LEN));
        Keys { suite, key, iv, seq: 0 }
    }
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keys({:?}, record {}, <redacted>)", self.suite, self.seq)
    }
}

/// The AEAD state of one direction: ring's, whose AES-GCM uses
/// VAES/VPCLMULQDQ where the CPU has them (about 2x Debian 12's OpenSSL
/// 3.0 per 16 KiB record on this project's hosts); keyed once, a nonce
/// per record.
struct Aead {
    key: LessSafeKey,
    iv: [u8; IV_LEN],
    seq: u64,
    /// The first sequence number this state may not use: a
    /// [`Sealer::take_run`] seals only the records it was given (a nonce
    /// used twice would give away the key stream).
    end: u64,
}

impl Aead {
    fn new(k: &Keys) -> Aead {
        let alg = match k.suite {
            Suite::Aes128GcmSha256 => &aead::AES_128_GCM,
            Suite::Aes256GcmSha384 => &aead::AES_256_GCM,
            Suite::Chacha20Poly1305Sha256 => &aead::CHACHA20_POLY1305,
        };
        let key = UnboundKey::new(alg, &k.key).expect("a key of the suite's length");
        Aead { key: LessSafeKey::new(key), iv: k.iv, seq: k.seq, end: u64::MAX }
    }

    /// The next record's nonce (RFC 8446 5.3), counting the record.
    fn next_nonce(&mut self) -> Nonce {
        assert!(self.seq < self.end, "a run of TLS records sealed past its last sequence number ({})", self.end);
        let mut nonce = self.iv;
        for (n, s) in nonce[IV_LEN - 8..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        // A connection cannot live through 2^64 records (RFC 8446 5.5
        // limits AES-GCM keys to far fewer, 2^24.5 full records, before a
        // KeyUpdate; see the crate's notes).
        self.seq = self.seq.checked_add(1).expect("TLS record sequence number wrapped");
        Nonce::assume_unique_for_key(nonce)
    }
}

/// Protects what we send.
pub struct Sealer(Aead);

/// A record [`Sealer::begin`] started: where its header goes in the output.
#[must_use = "a record begun is finished or abandoned"]
#[derive(Debug)]
pub struct Started(usize);

impl Sealer {
    pub fn new(k: &Keys) -> Sealer {
        Sealer(Aead::new(k))
    }

    /// The sequence number of the next record.
    pub fn seq(&self) -> u64 {
        self.0.seq
    }

    /// A sealer for the next `records` records only (it refuses to seal
    /// more), which may seal them on another thread; this one goes on
    /// after them. Records of several runs sealed at once are sent in the
    /// order the runs were taken: the peer opens them by sequence number.
    pub fn take_run(&mut self, records: u64) -> Sealer {
        let seq = self.0.seq;
        let end = seq.checked_add(records).filter(|e| *e <= self.0.end).expect("a run of TLS records past the sealer's own");
        self.0.seq = end;
        Sealer(Aead { key: self.0.key.clone(), iv: self.0.iv, seq, end })
    }

    /// Append one record of `kind` carrying the bytes of `pieces`, in
    /// order (at most [`MAX_PLAINTEXT`] in all), to `out`: the pieces are
    /// copied into `out`'s room and encrypted there, while they are still
    /// in the cache (the copy costs a small part of the cipher's time).
    pub fn seal(&mut self, kind: ContentType, pieces: &[&[u8]], out: &mut Vec<u8>) {
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        out.reserve(HEADER_LEN + len + 1 + TAG_LEN);
        let record = Sealer::begin(out);
        for p in pieces {
            out.extend_from_slice(p);
        }
        self.finish(kind, out, record);
    }

    /// Start a record at the end of `out`: room for its header is kept in
    /// front, and the caller appends the record's content (at most
    /// [`MAX_PLAINTEXT`] bytes) to `out` itself, from wherever it comes
    /// (a `pread` from a volume's file straight into the record), before
    /// [`Sealer::finish`] encrypts it there, in place: the content is
    /// written once, by whoever produces it, and never copied again.
    pub fn begin(out: &mut Vec<u8>) -> Started {
        let at = out.len();
        out.extend_from_slice(&[0; HEADER_LEN]);
        Started(at)
    }

    /// Seal the record [`Sealer::begin`] started: everything appended to
    /// `out` since is its content, of type `kind`; its header is written
    /// in the room kept, its type and tag appended.
    pub fn finish(&mut self, kind: ContentType, out: &mut Vec<u8>, record: Started) {
        let start = record.0 + HEADER_LEN;
        let len = out.len() - start;
        assert!(len <= MAX_PLAINTEXT, "a record carries at most {MAX_PLAINTEXT} bytes, not {len}");
        let body = len + 1 + TAG_LEN;
        let h = [ContentType::ApplicationData.to_u8(), 3, 3, (body >> 8) as u8, body as u8];
        let nonce = self.0.next_nonce();
        out[record.0..start].copy_from_slice(&h);
        out.push(kind.to_u8());
        let tag = self.0.key.seal_in_place_separate_tag(nonce, Aad::from(h), &mut out[start..]).expect("AEAD seal of a record");
        out.extend_from_slice(tag.as_ref());
    }

    /// Undo [`Sealer::begin`] (nothing was sealed: the content could not
    /// be had): `out` as it was before.
    pub fn abandon(out: &mut Vec<u8>, record: Started) {
        out.truncate(record.0);
    }

    /// Append `data` as application data records of at most [`MAX_PLAINTEXT`] each.
    pub fn seal_all(&mut self, data: &[u8], out: &mut Vec<u8>) {
        self.seal_run(&[data], out);
    }

    /// Append the bytes of `run`, in order, as application data records
    /// of [`MAX_PLAINTEXT`] each (the last shorter): a record gathers the
    /// end of one piece and the start of the next (a burst's PDU headers
    /// and the payload behind them share records).
    pub fn seal_run(&mut self, run: &[&[u8]], out: &mut Vec<u8>) {
        let total: usize = run.iter().map(|p| p.len()).sum();
        out.reserve(total + total.div_ceil(MAX_PLAINTEXT) * (HEADER_LEN + 1 + TAG_LEN));
        let mut rest = run.iter().copied().filter(|p| !p.is_empty());
        let mut cur: &[u8] = rest.next().unwrap_or_default();
        while !cur.is_empty() {
            // At most a few pieces a record: a burst is one buffer of
            // headers and a payload.
            let mut pieces: [&[u8]; 8] = [&[]; 8];
            let (mut n, mut k) = (0, 0);
            while n < MAX_PLAINTEXT && k < pieces.len() && !cur.is_empty() {
                let take = cur.len().min(MAX_PLAINTEXT - n);
                pieces[k] = &cur[..take];
                cur = &cur[take..];
                n += take;
                k += 1;
                if cur.is_empty() {
                    cur = rest.next().unwrap_or_default();
                }
            }
            self.seal(ContentType::ApplicationData, &pieces[..k], out);
        }
    }

    /// Append a close_notify alert: the orderly end of what we send.
    pub fn close_notify(&mut self, out: &mut Vec<u8>) {
        self.seal(ContentType::Alert, &[&[1, 0]], out);
    }
}

/// What one protected record held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// Application data, appended to the output.
    Data(usize),
    /// The peer ends its side in order (close_notify).
    Closed,
    /// A NewSessionTicket, dropped: nothing here resumes sessions.
    Ticket,
}

/// Removes the protection of what we receive.
pub struct Opener {
    aead: Aead,
    /// Whether a peer's NewSessionTicket is dropped (we are its client)
    /// rather than refused.
    drop_tickets: bool,
}

impl Opener {
    pub fn new(k: &Keys, drop_tickets: bool) -> Opener {
        Opener { aead: Aead::new(k), drop_tickets }
    }

    /// The sequence number of the next record.
    pub fn seq(&self) -> u64 {
        self.aead.seq
    }

    /// Open the record at the front of `input` and append its application
    /// data to `out`. `Ok(None)` while the record is incomplete (nothing
    /// consumed); else the bytes it took from `input` and what it held.
    /// An alert other than close_notify, a post-handshake message other
    /// than a ticket, an unprotected record or a failed tag is an error.
    pub fn open(&mut self, input: &[u8], out: &mut BytesMut) -> Result<Option<(usize, Opened)>, RecordError> {
        let Some(h) = Header::parse(input)? else { return Ok(None) };
        if input.len() < h.total() {
            return Ok(None);
        }
        // Copied to `out` and opened there (it keeps `out` initialized).
        let start = out.len();
        out.extend_from_slice(&input[..h.total()]);
        let r = self.open_within(out, start, start);
        out.truncate(match r {
            Ok(Some((_, Opened::Data(n)))) => start + n,
            _ => start,
        });
        r
    }

    /// Open the record at `buf[at..]` where it lies: its content is
    /// written from `buf[to..]` on (`to <= at`), over the record's own
    /// header and whatever was between (ring decrypts and moves in one
    /// pass), so records read straight into a receive buffer become
    /// contiguous plaintext there with no copy. `Ok(None)` while the
    /// record is incomplete; else the record's bytes and what it held
    /// (only [`Opened::Data`]'s content is left at `buf[to..]`; other
    /// records leave garbage there). Errors as [`Opener::open`].
    pub fn open_within(&mut self, buf: &mut [u8], to: usize, at: usize) -> Result<Option<(usize, Opened)>, RecordError> {
        assert!(to <= at, "a record's content moves towards the front only");
        let input = &buf[at..];
        let Some(h) = Header::parse(input)? else { return Ok(None) };
        if input.len() < h.total() {
            return Ok(None);
        }
        if h.kind != ContentType::ApplicationData {
            return Err(RecordError::Unprotected(h.kind));
        }
        if h.len < TAG_LEN + 1 {
            return Err(RecordError::TooShort(h.len));
        }
        let header: [u8; HEADER_LEN] = input[..HEADER_LEN].try_into().expect("5 bytes");
        let nonce = self.aead.next_nonce();
        let region = &mut buf[to..at + h.total()];
        let plain = self.aead.key.open_within(nonce, Aad::from(header), region, at + HEADER_LEN - to..).map_err(|_| RecordError::BadMac)?;
        // The content type is the last byte that is not padding.
        let Some(content) = plain.iter().rposition(|&b| b != 0) else {
            return Err(RecordError::NoContentType);
        };
        let kind = plain[content];
        if content > MAX_PLAINTEXT {
            return Err(RecordError::PlaintextTooLong(content));
        }
        let body = &plain[..content];
        let opened = match ContentType::from_u8(kind) {
            Some(ContentType::ApplicationData) => Opened::Data(content),
            Some(ContentType::Alert) => match *body {
                [_, 0] => Opened::Closed,
                [_, desc] => return Err(RecordError::Alert(desc)),
                _ => return Err(RecordError::Malformed(ContentType::Alert)),
            },
            // NewSessionTicket (4): one record may hold several messages;
            // a ticket is dropped only when the record holds nothing else.
            Some(ContentType::Handshake) if self.drop_tickets && only_tickets(body) => Opened::Ticket,
            Some(ContentType::Handshake) => return Err(RecordError::PostHandshake(body.first().copied().unwrap_or(0))),
            Some(k) => return Err(RecordError::Unprotected(k)),
            None => return Err(RecordError::ContentType(kind)),
        };
        Ok(Some((h.total(), opened)))
    }
}

/// Whether `msgs` is one or more whole NewSessionTicket messages.
fn only_tickets(mut msgs: &[u8]) -> bool {
    if msgs.is_empty() {
        return false;
    }
    while let [4, a, b, c, rest @ ..] = msgs {
        let len = u32::from_be_bytes([0, *a, *b, *c]) as usize;
        if rest.len() < len {
            return false;
        }
        msgs = &rest[len..];
    }
    msgs.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// RFC 8448 3 (a simple 1-RTT handshake): the server's first protected
    /// record (EncryptedExtensions .. Finished) from its handshake traffic
    /// secret, byte for byte; opened again, it gives the handshake bytes.
    #[test]
    fn rfc8448_server_handshake_record() {
        let secret = hex("b67b7d690cc16c4e75e54213cb2d37b4e9c912bcded9105d42befd59d391ad38");
        let keys = Keys::from_secret(Suite::Aes128GcmSha256, &secret);
        assert_eq!(*keys.key, hex("3fce516009c21727d0f2e4e86ee403bc"));
        assert_eq!(keys.iv.to_vec(), hex("5d313eb2671276ee13000b30"));
        // The start of the plaintext (EncryptedExtensions) and of the record.
        let plain_start = hex("080000240022000a00140012001d00170018001901000101010201030104001c0002400100000000");
        let mut out = Vec::new();
        let mut s = Sealer::new(&keys);
        s.seal(ContentType::Handshake, &[&plain_start], &mut out);
        // The RFC's record begins "17 03 03 02 a2 d1 ff 33 4a 56 f5 bf f6 59
        // 4a 07 cc 87 b5 80 23 3f 50 0f 45 e4 89 e7 f3 3a f3 5e df 78 69 fc f4
        // 0a a4 0a a2 b8 ea 73 f8": the same keystream over the same first
        // bytes (the tag differs: the record here is shorter).
        let want = hex("d1ff334a56f5bff6594a07cc87b580233f500f45e489e7f33af35edf7869fcf40aa40aa2b8ea73f8");
        assert_eq!(&out[HEADER_LEN..HEADER_LEN + want.len()], &want[..]);
    }

    fn pair(suite: Suite) -> (Sealer, Opener) {
        let keys = Keys::from_secret(suite, &[7u8; 48][..suite.hash().key_len()]);
        (Sealer::new(&keys), Opener::new(&keys, false))
    }

    #[test]
    fn gathered_pieces_round_trip_in_order() {
        for suite in [Suite::Aes128GcmSha256, Suite::Aes256GcmSha384] {
            let (mut s, mut o) = pair(suite);
            let header = [1u8; 24];
            let payload: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
            let mut wire = Vec::new();
            s.seal(ContentType::ApplicationData, &[&header, &payload, &header], &mut wire);
            s.seal_all(&vec![9u8; MAX_PLAINTEXT + 10], &mut wire);
            s.close_notify(&mut wire);
            let mut plain = BytesMut::new();
            let mut at = 0;
            let mut seen = Vec::new();
            // Byte by byte: a partial record is never consumed.
            let mut avail = 0;
            while at < wire.len() {
                avail = (avail + 1).min(wire.len());
                match o.open(&wire[at..avail], &mut plain).unwrap() {
                    None => continue,
                    Some((n, what)) => {
                        at += n;
                        seen.push(what);
                    }
                }
            }
            assert_eq!(seen, [Opened::Data(4144), Opened::Data(MAX_PLAINTEXT), Opened::Data(10), Opened::Closed]);
            let mut want = header.to_vec();
            want.extend_from_slice(&payload);
            want.extend_from_slice(&header);
            want.extend_from_slice(&vec![9u8; MAX_PLAINTEXT + 10]);
            assert_eq!(&plain[..], &want[..]);
            assert_eq!((s.seq(), o.seq()), (4, 4));
        }
    }

    /// A run of pieces (a burst's headers, then a payload) fills whole
    /// records across the pieces' boundaries: as many records as the
    /// bytes need, not one more per piece.
    #[test]
    fn a_run_of_pieces_shares_records() {
        let (mut s, mut o) = pair(Suite::Aes128GcmSha256);
        let headers = vec![1u8; 3 * 24];
        // Headers and payload fill 64 records exactly: a record per piece
        // would take 65.
        let payload: Vec<u8> = (0..(1u32 << 20) - headers.len() as u32).map(|i| (i % 249) as u8).collect();
        let mut wire = Vec::new();
        s.seal_run(&[&headers, &[], &payload], &mut wire);
        let total = headers.len() + payload.len();
        assert_eq!(s.seq() as usize, total.div_ceil(MAX_PLAINTEXT));
        assert_eq!(wire.len(), total + total.div_ceil(MAX_PLAINTEXT) * (HEADER_LEN + 1 + TAG_LEN));
        let mut plain = BytesMut::new();
        let mut at = 0;
        while let Some((n, _)) = o.open(&wire[at..], &mut plain).unwrap() {
            at += n;
        }
        assert_eq!(at, wire.len());
        assert!(plain[..headers.len()] == headers[..] && plain[headers.len()..] == payload[..]);
    }

    /// Runs taken off a sealer seal their own records, on other threads,
    /// in any order: sent in the order the runs were taken they open in
    /// sequence (the nonces are the ones the sealer would have used),
    /// the sealer goes on after them, and a run seals no more than it
    /// was given.
    #[test]
    fn runs_taken_off_a_sealer_seal_on_other_threads_in_sequence() {
        let (mut s, mut o) = pair(Suite::Aes128GcmSha256);
        let data: Vec<u8> = (0..10 * MAX_PLAINTEXT as u32).map(|i| (i % 247) as u8).collect();
        let mut first = Vec::new();
        s.seal_all(&data[..MAX_PLAINTEXT], &mut first);
        let mut a = s.take_run(3);
        let mut b = s.take_run(4);
        let (pa, pb) = (&data[MAX_PLAINTEXT..4 * MAX_PLAINTEXT], &data[4 * MAX_PLAINTEXT..8 * MAX_PLAINTEXT]);
        // The later run first, on a thread of its own.
        let wb = std::thread::scope(|sc| {
            let later = sc.spawn(move || {
                let mut w = Vec::new();
                b.seal_all(pb, &mut w);
                (w, b)
            });
            let (w, b) = later.join().unwrap();
            assert_eq!(b.seq(), 8);
            w
        });
        let mut wa = Vec::new();
        a.seal_all(pa, &mut wa);
        assert_eq!(s.seq(), 8);
        let mut rest = Vec::new();
        s.seal_all(&data[8 * MAX_PLAINTEXT..], &mut rest);
        let wire = [first, wa, wb, rest].concat();
        let mut plain = BytesMut::new();
        let mut at = 0;
        while let Some((n, _)) = o.open(&wire[at..], &mut plain).unwrap() {
            at += n;
        }
        assert!(at == wire.len() && plain[..] == data[..]);
        let over = std::panic::catch_unwind(move || a.seal_all(&[1], &mut Vec::new()));
        assert!(over.is_err(), "a run sealed a record past the ones it was given");
    }

    /// Records back to back in one buffer, opened where they lie: their
    /// contents end up contiguous at the front, a dropped ticket in
    /// between leaves nothing, and each record's bytes are counted.
    #[test]
    fn records_open_within_one_buffer_into_contiguous_content() {
        for suite in [Suite::Aes128GcmSha256, Suite::Aes256GcmSha384, Suite::Chacha20Poly1305Sha256] {
            let keys = Keys::from_secret(suite, &[8u8; 48][..suite.hash().key_len()]);
            let (mut s, mut o) = (Sealer::new(&keys), Opener::new(&keys, true));
            let data: Vec<u8> = (0..3 * MAX_PLAINTEXT as u32 + 77).map(|i| (i % 241) as u8).collect();
            let mut wire = vec![0xee; 3];
            s.seal_all(&data[..MAX_PLAINTEXT + 5], &mut wire);
            s.seal(ContentType::Handshake, &[&[4, 0, 0, 1, 7]], &mut wire);
            s.seal_all(&data[MAX_PLAINTEXT + 5..], &mut wire);
            let (mut to, mut at, mut seen) = (3, 3, Vec::new());
            while let Some((n, what)) = o.open_within(&mut wire, to, at).unwrap() {
                at += n;
                if let Opened::Data(len) = what {
                    to += len;
                }
                seen.push(what);
            }
            assert_eq!(at, wire.len(), "{suite:?}");
            assert_eq!(seen.len(), 6, "{suite:?}");
            assert!(wire[..3] == [0xee; 3] && wire[3..to] == data[..], "{suite:?}: the content is not contiguous");
            // A bit flipped in the next record: refused, where it lies too.
            s.seal_all(b"more", &mut wire);
            let last = wire.len() - 1;
            wire[last] ^= 1;
            assert_eq!(o.open_within(&mut wire, to, at), Err(RecordError::BadMac));
        }
    }

    #[test]
    fn altered_truncated_oversized_and_out_of_order_records_are_refused() {
        let (mut s, _) = pair(Suite::Aes128GcmSha256);
        let mut wire = Vec::new();
        s.seal_all(b"hello", &mut wire);
        s.seal_all(b"world", &mut wire);
        let one = wire.len() / 2;
        let mut plain = BytesMut::new();
        // A flipped bit anywhere (header, ciphertext, tag).
        for i in 0..one {
            let mut w = wire[..one].to_vec();
            w[i] ^= 1;
            let (_, mut o) = pair(Suite::Aes128GcmSha256);
            let r = o.open(&w, &mut plain);
            assert!(matches!(r, Err(_) | Ok(None)), "byte {i} altered: {r:?}");
            assert!(plain.is_empty());
        }
        // The second record first (a replay or reordering): wrong nonce.
        let (_, mut o) = pair(Suite::Aes128GcmSha256);
        assert_eq!(o.open(&wire[one..], &mut plain), Err(RecordError::BadMac));
        // Another key.
        let (_, mut o) = pair(Suite::Aes256GcmSha384);
        assert_eq!(o.open(&wire, &mut plain), Err(RecordError::BadMac));
        // A header claiming more than TLS allows, or an odd type or version.
        let (_, mut o) = pair(Suite::Aes128GcmSha256);
        assert_eq!(o.open(&[23, 3, 3, 0x48, 0x01], &mut plain), Err(RecordError::TooLong(0x4801)));
        assert_eq!(o.open(&[24, 3, 3, 0, 1, 0], &mut plain), Err(RecordError::ContentType(24)));
        assert_eq!(o.open(&[23, 3, 4, 0, 1, 0], &mut plain), Err(RecordError::Version(0x0304)));
        assert_eq!(o.open(&[22, 3, 3, 0, 1, 0], &mut plain), Err(RecordError::Unprotected(ContentType::Handshake)));
        assert_eq!(o.open(&[23, 3, 3, 0, 3, 0, 0, 0], &mut plain), Err(RecordError::TooShort(3)));
        assert!(plain.is_empty());
    }

    #[test]
    fn alerts_and_post_handshake_messages() {
        type Case<'a> = (ContentType, &'a [u8], bool, Result<Opened, RecordError>);
        let cases: [Case; 6] = [
            (ContentType::Alert, &[2, 40], false, Err(RecordError::Alert(40))),
            (ContentType::Alert, &[1], false, Err(RecordError::Malformed(ContentType::Alert))),
            // KeyUpdate
            (ContentType::Handshake, &[24, 0, 0, 1, 0], true, Err(RecordError::PostHandshake(24))),
            // NewSessionTicket: dropped by a client, refused by a server.
            (ContentType::Handshake, &[4, 0, 0, 2, 9, 9], true, Ok(Opened::Ticket)),
            (ContentType::Handshake, &[4, 0, 0, 2, 9, 9], false, Err(RecordError::PostHandshake(4))),
            // A ticket with a ClientHello behind it in the same record.
            (ContentType::Handshake, &[4, 0, 0, 0, 1, 0, 0, 0], true, Err(RecordError::PostHandshake(4))),
        ];
        for (kind, body, client, want) in cases {
            let keys = Keys::from_secret(Suite::Aes128GcmSha256, &[3u8; 32]);
            let (mut s, mut o) = (Sealer::new(&keys), Opener::new(&keys, client));
            let mut wire = Vec::new();
            s.seal(kind, &[body], &mut wire);
            let mut plain = BytesMut::new();
            let got = o.open(&wire, &mut plain).map(|r| r.unwrap().1);
            assert_eq!(got, want, "{kind:?} {body:?}");
            assert!(plain.is_empty());
        }
        // All padding, no type.
        let keys = Keys::from_secret(Suite::Aes128GcmSha256, &[3u8; 32]);
        let (mut s, mut o) = (Sealer::new(&keys), Opener::new(&keys, false));
        let mut wire = Vec::new();
        // A record whose "type" is 0 looks like one of all padding.
        s.seal(ContentType::ApplicationData, &[], &mut wire);
        let last = wire.len() - TAG_LEN - 1;
        let mut tampered = Vec::new();
        let mut s2 = Sealer::new(&keys);
        let nonce = s2.0.next_nonce();
        tampered.extend_from_slice(&wire[..HEADER_LEN]);
        let mut b = [0u8; 1];
        let h: [u8; HEADER_LEN] = wire[..HEADER_LEN].try_into().unwrap();
        let tag = s2.0.key.seal_in_place_separate_tag(nonce, Aad::from(h), &mut b).unwrap();
        tampered.extend_from_slice(&b);
        tampered.extend_from_slice(tag.as_ref());
        assert_eq!(last, HEADER_LEN);
        assert_eq!(o.open(&tampered, &mut BytesMut::new()), Err(RecordError::NoContentType));
    }

    #[test]
    fn tells_handshakes_from_pdus() {
        assert_eq!(starts_handshake(&[]), None);
        assert_eq!(starts_handshake(&[22, 3]), None);
        assert_eq!(starts_handshake(&[22, 3, 1]), Some(true));
        assert_eq!(starts_handshake(&[22, 3, 3, 0, 200]), Some(true));
        assert_eq!(starts_handshake(&[22, 3, 9]), Some(false));
        // An ICReq: PDU type 0, HLEN 128.
        assert_eq!(starts_handshake(&[0, 0, 128, 0]), Some(false));
    }
}
