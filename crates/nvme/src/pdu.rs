//! NVMe/TCP PDUs (NVMe/TCP transport spec 1.0; Linux `include/linux/nvme-tcp.h`).
//!
//! Every PDU starts with an 8-byte common header: type, flags, hlen, pdo,
//! plen (little-endian u32, whole PDU length). After the `hlen`-byte header
//! comes an optional 4-byte CRC32C header digest (HDGST flag), then data at
//! offset `pdo`, then an optional CRC32C data digest (DDGST flag). ICReq and
//! ICResp never carry digests.
//!
//! [`decode`] frames and validates one PDU from a receive buffer, lending the
//! payload as `Bytes` (no copy). Its first step, [`frame`] (every check
//! but a data PDU's DATAL), lets a receiver read the PDU type it handles
//! most where it lies (a controller's commands: [`Framed::sqe`]).
//! [`Pdu::encode_parts`] produces the header bytes, the payload and the
//! trailing digest separately so a sender can write large payloads
//! without copying them.

use crate::queue_entry::{Cqe, Sqe};
use bw_wire::{Field, Le};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::ops::Range;

pub mod kind {
    pub const IC_REQ: u8 = 0x00;
    pub const IC_RESP: u8 = 0x01;
    pub const H2C_TERM_REQ: u8 = 0x02;
    pub const C2H_TERM_REQ: u8 = 0x03;
    pub const CAPSULE_CMD: u8 = 0x04;
    pub const CAPSULE_RESP: u8 = 0x05;
    pub const H2C_DATA: u8 = 0x06;
    pub const C2H_DATA: u8 = 0x07;
    pub const R2T: u8 = 0x09;
}

pub mod flags {
    pub const HDGST: u8 = 0x01;
    pub const DDGST: u8 = 0x02;
    /// Data PDUs: last PDU of the transfer.
    pub const DATA_LAST: u8 = 0x04;
    /// C2HData: the command completed successfully, no CapsuleResp follows.
    pub const DATA_SUCCESS: u8 = 0x08;
}

/// Digest bits in ICReq/ICResp.
pub const IC_HDGST: u8 = 0x01;
pub const IC_DDGST: u8 = 0x02;

/// Header fields after the type byte, each defined once and read and
/// written through these (little-endian, as all of NVMe).
pub mod field {
    use bw_wire::{Field, Le};

    // Common header.
    pub const PDU_TYPE: Field<u8> = Field::at(0);
    pub const FLAGS: Field<u8> = Field::at(1);
    pub const HLEN: Field<u8> = Field::at(2);
    pub const PDO: Field<u8> = Field::at(3);
    pub const PLEN: Field<Le<u32>> = Field::at(4);
    // ICReq and ICResp.
    pub const PFV: Field<Le<u16>> = Field::at(8);
    /// ICReq HPDA, ICResp CPDA.
    pub const PDA: Field<u8> = Field::at(10);
    pub const DGST: Field<u8> = Field::at(11);
    pub const MAXR2T: Field<Le<u32>> = Field::at(12);
    pub const MAXH2CDATA: Field<Le<u32>> = Field::at(12);
    // H2CTermReq and C2HTermReq.
    pub const FES: Field<Le<u16>> = Field::at(8);
    pub const FEI: Field<Le<u32>> = Field::at(10);
    // H2CData, C2HData and R2T.
    pub const CCCID: Field<Le<u16>> = Field::at(8);
    pub const TTAG: Field<Le<u16>> = Field::at(10);
    pub const DATAO: Field<Le<u32>> = Field::at(12);
    pub const DATAL: Field<Le<u32>> = Field::at(16);
}

/// A CRC32C digest `at` bytes into a PDU (after the header, or after the
/// payload).
const fn digest_at(at: usize) -> Field<Le<u32>> {
    Field::at(at)
}

pub const CH_LEN: usize = 8;
pub const IC_LEN: usize = 128;
pub const CMD_HLEN: usize = 72;
pub const RESP_HLEN: usize = 24;
pub const DATA_HLEN: usize = 24;
pub const R2T_HLEN: usize = 24;
pub const TERM_HLEN: usize = 24;
pub const DIGEST_LEN: usize = 4;
/// A TermReq carries at most this much of the offending PDU's header.
pub const TERM_MAX_DATA: usize = 152 - TERM_HLEN;

/// Fatal error status (FES) of a TermReq.
pub mod fes {
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    pub const PDU_SEQUENCE_ERROR: u16 = 0x02;
    pub const HEADER_DIGEST_ERROR: u16 = 0x03;
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    pub const R2T_LIMIT_EXCEEDED: u16 = 0x05;
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

/// Digests negotiated for a connection (after the IC exchange).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

impl Digests {
    pub fn from_ic_bits(bits: u8) -> Digests {
        Digests { header: bits & IC_HDGST != 0, data: bits & IC_DDGST != 0 }
    }
    pub fn ic_bits(self) -> u8 {
        (self.header as u8 * IC_HDGST) | (self.data as u8 * IC_DDGST)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    pub kind: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

impl CommonHeader {
    pub fn parse(b: &[u8]) -> CommonHeader {
        CommonHeader {
            kind: field::PDU_TYPE.get(b),
            flags: field::FLAGS.get(b),
            hlen: field::HLEN.get(b),
            pdo: field::PDO.get(b),
            plen: field::PLEN.get(b),
        }
    }
    fn write(&self, b: &mut [u8]) {
        field::PDU_TYPE.set(b, self.kind);
        field::FLAGS.set(b, self.flags);
        field::HLEN.set(b, self.hlen);
        field::PDO.set(b, self.pdo);
        field::PLEN.set(b, self.plen);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    pub pfv: u16,
    /// Host PDU data alignment (dwords, zero-based).
    pub hpda: u8,
    pub digests: Digests,
    /// Zero-based number of R2Ts the host accepts outstanding per command.
    pub maxr2t: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    pub pfv: u16,
    /// Controller PDU data alignment; Linux hosts accept only 0.
    pub cpda: u8,
    pub digests: Digests,
    /// Largest H2CData payload the controller accepts (bytes, not zero-based).
    pub maxh2cdata: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TermReq {
    pub fes: u16,
    /// Fatal error information: the byte offset of the bad header field.
    pub fei: u32,
    /// The header of the PDU that caused the error (up to 128 bytes).
    pub data: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapsuleCmd {
    pub sqe: Sqe,
    /// In-capsule data (empty when the command has none).
    pub data: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataPdu {
    pub cid: u16,
    /// Transfer tag: echoes the R2T's ttag in H2CData; 0 in C2HData.
    pub ttag: u16,
    pub offset: u32,
    pub last: bool,
    /// C2HData only: completes the command without a CapsuleResp.
    pub success: bool,
    pub data: Bytes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2t {
    pub cid: u16,
    pub ttag: u16,
    pub offset: u32,
    pub length: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pdu {
    IcReq(IcReq),
    IcResp(IcResp),
    H2CTermReq(TermReq),
    C2HTermReq(TermReq),
    CapsuleCmd(CapsuleCmd),
    CapsuleResp(Cqe),
    H2CData(DataPdu),
    C2HData(DataPdu),
    R2T(R2t),
}

/// Why a PDU could not be decoded. Each maps to the TermReq the receiver
/// sends before closing ([`PduError::fes`], [`PduError::fei`]), except data
/// digest errors, which fail only the command they belong to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    #[error("unknown PDU type {0:#04x}")]
    UnknownType(u8),
    #[error("PDU type {kind:#04x}: header length {hlen} (expected {want})")]
    BadHlen { kind: u8, hlen: u8, want: u8 },
    #[error("PDU type {kind:#04x}: bad PDU length {plen}")]
    BadPlen { kind: u8, plen: u32 },
    #[error("PDU type {kind:#04x}: bad data offset {pdo}")]
    BadPdo { kind: u8, pdo: u8 },
    #[error("PDU type {kind:#04x}: digest flags {flags:#04x} do not match the negotiated digests")]
    DigestFlags { kind: u8, flags: u8 },
    #[error("PDU type {kind:#04x}: header digest mismatch")]
    HeaderDigest { kind: u8 },
    #[error("PDU type {kind:#04x} for command {cid}: data digest mismatch")]
    DataDigest { kind: u8, cid: u16 },
    #[error("PDU of {plen} bytes is larger than the {max}-byte limit")]
    TooLarge { plen: u32, max: u32 },
}

impl PduError {
    /// Fatal error status for the TermReq; None for errors that only fail a
    /// command.
    pub fn fes(&self) -> Option<u16> {
        match self {
            PduError::DataDigest { .. } => None,
            PduError::HeaderDigest { .. } => Some(fes::HEADER_DIGEST_ERROR),
            PduError::TooLarge { .. } => Some(fes::DATA_OUT_OF_RANGE),
            _ => Some(fes::INVALID_HEADER_FIELD),
        }
    }
    /// Byte offset of the offending field in the PDU header.
    pub fn fei(&self) -> u32 {
        match self {
            PduError::UnknownType(_) => 0,
            PduError::DigestFlags { .. } => 1,
            PduError::BadHlen { .. } => 2,
            PduError::BadPdo { .. } => 3,
            PduError::BadPlen { .. } | PduError::TooLarge { .. } => 4,
            _ => 0,
        }
    }
}

fn expected_hlen(kind: u8) -> Option<usize> {
    Some(match kind {
        kind::IC_REQ | kind::IC_RESP => IC_LEN,
        kind::H2C_TERM_REQ | kind::C2H_TERM_REQ => TERM_HLEN,
        kind::CAPSULE_CMD => CMD_HLEN,
        kind::CAPSULE_RESP => RESP_HLEN,
        kind::H2C_DATA | kind::C2H_DATA => DATA_HLEN,
        kind::R2T => R2T_HLEN,
        _ => return None,
    })
}

pub fn crc32c(b: &[u8]) -> u32 {
    bw_wire::crc32c::crc32c(b)
}

/// Frame one PDU from the front of `buf`. Returns `Ok(None)` when more bytes
/// are needed; on success the PDU's bytes are removed from `buf`.
/// `max_plen` bounds what a peer can make us buffer. [`frame`], then
/// [`Framed::into_pdu`].
pub fn decode(buf: &mut BytesMut, digests: Digests, max_plen: u32) -> Result<Option<Pdu>, PduError> {
    match frame(buf, digests, max_plen)? {
        Some(f) => f.into_pdu().map(Some),
        None => Ok(None),
    }
}

/// A PDU framed at the front of a receive buffer and checked, still in
/// the buffer: see [`frame`]. Taken out by [`Framed::take`] or
/// [`Framed::into_pdu`]; until then the next [`frame`] finds it again.
#[must_use = "a framed PDU stays in the buffer until it is taken"]
pub struct Framed<'a> {
    buf: &'a mut BytesMut,
    ch: CommonHeader,
    /// Its header's length (without the header digest).
    hlen: usize,
    /// Where its payload lies (a TermReq's: the part of the offending
    /// header it quotes).
    data: Range<usize>,
}

// The checks shared by `frame` (and `check`, `Framed::into_pdu`) and
// `peek_data_header`: the one copy of each. Macros, so that a failed check
// returns its error from the function that makes it, as each did with its
// own copy: as `#[inline(always)]` functions returning a `Result`, the
// errors' fields were packed on the per-PDU path whatever the PDU, +6 to
// +15 instructions per `frame`, +9 per `peek_data_header` (callgrind,
// docs/notes/2026-11-28-h51pk-data-header-checks.md).

/// A PDU's layout as its common header gives it: `check_common!`.
struct Layout {
    /// Its header digest's length (0 or [`DIGEST_LEN`]).
    hd: usize,
    /// It has room for a payload after the header and is a type that
    /// carries one (its DDGST flag and PDO mean something: `check_payload!`).
    with_data: bool,
}

/// The checks of a PDU's common header, all its first [`CH_LEN`] bytes
/// allow, once its type is known to have `want`-byte headers, in this
/// order: header length, HDGST flag against the negotiated digests (IC
/// PDUs: no digest flags at all; TermReqs: taken without digests), `plen`
/// against `max_plen`, then against the least the header needs and the
/// room the type may have for a payload. Gives its [`Layout`].
macro_rules! check_common {
    ($ch:expr, $want:expr, $digests:expr, $max_plen:expr) => {{
        let (ch, want, digests, max_plen): (&CommonHeader, usize, Digests, u32) = ($ch, $want, $digests, $max_plen);
        if ch.hlen as usize != want {
            return Err(PduError::BadHlen { kind: ch.kind, hlen: ch.hlen, want: want as u8 });
        }
        let is_ic = matches!(ch.kind, kind::IC_REQ | kind::IC_RESP);
        let is_term = matches!(ch.kind, kind::H2C_TERM_REQ | kind::C2H_TERM_REQ);
        // TermReqs are sent when the digest state may be in doubt: like Linux, take
        // them without digests.
        let hd = if is_ic || is_term {
            if ch.flags & (flags::HDGST | flags::DDGST) != 0 && is_ic {
                return Err(PduError::DigestFlags { kind: ch.kind, flags: ch.flags });
            }
            0
        } else {
            if (ch.flags & flags::HDGST != 0) != digests.header {
                return Err(PduError::DigestFlags { kind: ch.kind, flags: ch.flags });
            }
            if digests.header { DIGEST_LEN } else { 0 }
        };
        let plen = ch.plen as usize;
        if ch.plen > max_plen {
            return Err(PduError::TooLarge { plen: ch.plen, max: max_plen });
        }
        if plen < want + hd || (is_ic && plen != IC_LEN) {
            return Err(PduError::BadPlen { kind: ch.kind, plen: ch.plen });
        }
        let has_data_room = plen > want + hd;
        let carries_data = matches!(ch.kind, kind::CAPSULE_CMD | kind::H2C_DATA | kind::C2H_DATA);
        if has_data_room && !carries_data && !is_term {
            return Err(PduError::BadPlen { kind: ch.kind, plen: ch.plen });
        }
        Layout { hd, with_data: has_data_room && carries_data }
    }};
}

/// The header digest of a PDU `raw` whose `hlen`-byte header it follows
/// (at least `hlen` + [`DIGEST_LEN`] bytes of it).
macro_rules! check_header_digest {
    ($ch:expr, $raw:expr, $hlen:expr) => {{
        let (ch, raw, hlen): (&CommonHeader, &[u8], usize) = ($ch, $raw, $hlen);
        if crc32c(&raw[..hlen]) != digest_at(hlen).get(raw) {
            return Err(PduError::HeaderDigest { kind: ch.kind });
        }
    }};
}

/// The payload bounds of a `plen`-byte PDU that carries data
/// (`Layout::with_data`) and whose header (with its digest) ends at
/// `header_end`: its DDGST flag against the negotiated digests, then PDO.
/// Gives where the payload starts and the data digest's length.
macro_rules! check_payload {
    ($ch:expr, $header_end:expr, $plen:expr, $digests:expr) => {{
        let (ch, header_end, plen, digests): (&CommonHeader, usize, usize, Digests) = ($ch, $header_end, $plen, $digests);
        let dd = if ch.flags & flags::DDGST != 0 { DIGEST_LEN } else { 0 };
        if (dd != 0) != digests.data {
            return Err(PduError::DigestFlags { kind: ch.kind, flags: ch.flags });
        }
        let pdo = ch.pdo as usize;
        if pdo < header_end || pdo + dd > plen {
            return Err(PduError::BadPdo { kind: ch.kind, pdo: ch.pdo });
        }
        (pdo, dd)
    }};
}

/// A data PDU's DATAL (in its header `h`) against its payload's length.
macro_rules! check_datal {
    ($ch:expr, $h:expr, $data_len:expr) => {{
        let (ch, h, data_len): (&CommonHeader, &[u8], usize) = ($ch, $h, $data_len);
        if field::DATAL.get(h) as usize != data_len {
            return Err(PduError::BadPlen { kind: ch.kind, plen: ch.plen });
        }
    }};
}

/// Every check of the PDU at the front of `buf` but a data PDU's DATAL
/// (the one [`Framed::into_pdu`] makes): its common header, each field
/// as soon as its 8 bytes are in, then, once all `plen` bytes are, its
/// digests and payload bounds. `Ok(None)`: more bytes are needed (room
/// for them reserved). A PDU that fails a check once framed leaves
/// `buf` (the TermReq quotes what follows it).
///
/// [`decode`] is this and [`Framed::into_pdu`]; a receiver that handles
/// one PDU type itself (a controller's commands, [`Framed::sqe`]) reads
/// it where it lies and takes its payload without building a [`Pdu`].
pub fn frame(buf: &mut BytesMut, digests: Digests, max_plen: u32) -> Result<Option<Framed<'_>>, PduError> {
    if buf.len() < CH_LEN {
        return Ok(None);
    }
    let ch = CommonHeader::parse(&buf[..CH_LEN]);
    let want = expected_hlen(ch.kind).ok_or(PduError::UnknownType(ch.kind))?;
    let Layout { hd, with_data } = check_common!(&ch, want, digests, max_plen);
    let plen = ch.plen as usize;
    if buf.len() < plen {
        buf.reserve(plen - buf.len());
        return Ok(None);
    }
    // Checked where it lies; it leaves `buf` when it is taken, with only
    // a payload split off (no copy, one reference). Splitting the whole
    // PDU off and slicing its payload out of that cost a split, a freeze,
    // a slice and two reference counts per PDU: -83 instructions per read
    // command, which has no payload, -39 per 4 KiB write with the payload
    // handled as in `Framed::take` (docs/notes/2026-11-27-h51t-nvme-target.md,
    // docs/notes/2026-11-27-h51x-nvme-writes.md).
    match check(&ch, &buf[..plen], want, hd, with_data, digests) {
        Ok(data) => Ok(Some(Framed { buf, ch, hlen: want, data })),
        Err(e) => {
            buf.advance(plen);
            Err(e)
        }
    }
}

/// The digest checks of a framed PDU `raw` (`hd`: its header digest's
/// length; `with_data`: it carries a payload), and where its payload lies
/// in `raw`. Inlined into [`frame`], its one caller: as a call it was
/// ~40 instructions per PDU (`#[inline]` alone left it a call).
#[inline(always)]
fn check(ch: &CommonHeader, raw: &[u8], want: usize, hd: usize, with_data: bool, digests: Digests) -> Result<Range<usize>, PduError> {
    let plen = raw.len();
    if hd != 0 {
        check_header_digest!(ch, raw, want);
    }
    // Payload bounds, and whether a data digest follows the payload (only
    // a PDU that carries data has one: a TermReq's DDGST flag means nothing).
    let (data_start, data_end, dd) = if with_data {
        let (pdo, dd) = check_payload!(ch, want + hd, plen, digests);
        (pdo, plen - dd, dd)
    } else {
        (want + hd, want + hd, 0)
    };
    if dd != 0 {
        let got = digest_at(data_end).get(raw);
        if crc32c(&raw[data_start..data_end]) != got {
            let cid = match ch.kind {
                kind::CAPSULE_CMD => crate::queue_entry::sqe::CID.get(&raw[CH_LEN..want]),
                _ => field::CCCID.get(raw),
            };
            return Err(PduError::DataDigest { kind: ch.kind, cid });
        }
    }
    // What a TermReq may carry (TERM_MAX_DATA); a longer one from a broken
    // peer is still taken as the termination it is.
    if matches!(ch.kind, kind::H2C_TERM_REQ | kind::C2H_TERM_REQ) {
        return Ok(want..plen.min(want + TERM_MAX_DATA));
    }
    Ok(data_start..data_end)
}

impl Framed<'_> {
    /// A CapsuleCmd's SQE, read where it lies (None for other PDU types).
    /// With [`Framed::take`], a controller's commands without the generic
    /// [`Pdu`] built, returned and matched again (a target's
    /// `TargetQueue::receive`: -84 instructions per 4 KiB read command,
    /// -117 per write, docs/notes/2026-11-28-h51zd-nvme-decode.md).
    #[inline]
    pub fn sqe(&self) -> Option<Sqe> {
        (self.ch.kind == kind::CAPSULE_CMD).then(|| Sqe::from_slice(&self.buf[CH_LEN..CMD_HLEN]))
    }

    /// Take the PDU out of the buffer; its payload (empty if it has none)
    /// stays where it was received.
    #[inline]
    pub fn take(self) -> Bytes {
        let plen = self.ch.plen as usize;
        if self.data.is_empty() {
            self.buf.advance(plen);
            return Bytes::new();
        }
        // Frozen before it is advanced past its header: `Bytes::advance` is
        // ~10 instructions where `BytesMut::advance` is ~30 (its KIND_VEC
        // branch).
        let mut payload = self.buf.split_to(self.data.end).freeze();
        payload.advance(self.data.start);
        if plen > self.data.end {
            self.buf.advance(plen - self.data.end);
        }
        payload
    }

    /// The typed PDU, taken out of the buffer (also when its typed fields
    /// fail the last check, a data PDU's DATAL).
    pub fn into_pdu(self) -> Result<Pdu, PduError> {
        let mut pdu = match typed(&self.ch, &self.buf[..self.hlen], self.data.len()) {
            Ok(p) => p,
            Err(e) => {
                self.buf.advance(self.ch.plen as usize);
                return Err(e);
            }
        };
        let data = self.take();
        if !data.is_empty() {
            pdu.set_data(data);
        }
        Ok(pdu)
    }
}

impl Pdu {
    /// Make `d` the PDU's payload (a PDU kind without one drops it).
    /// Inlined: as a call it was 28 instructions per write.
    #[inline(always)]
    fn set_data(&mut self, d: Bytes) {
        match self {
            Pdu::H2CTermReq(t) | Pdu::C2HTermReq(t) => t.data = d,
            Pdu::CapsuleCmd(c) => c.data = d,
            Pdu::H2CData(p) | Pdu::C2HData(p) => p.data = d,
            _ => {}
        }
    }
}

/// The typed PDU of a framed and checked one, its payload (if any) still
/// empty: `h` is its header (without digest), `data_len` its payload's
/// length.
fn typed(ch: &CommonHeader, h: &[u8], data_len: usize) -> Result<Pdu, PduError> {
    Ok(match ch.kind {
        kind::IC_REQ => Pdu::IcReq(IcReq {
            pfv: field::PFV.get(h),
            hpda: field::PDA.get(h),
            digests: Digests::from_ic_bits(field::DGST.get(h)),
            maxr2t: field::MAXR2T.get(h),
        }),
        kind::IC_RESP => Pdu::IcResp(IcResp {
            pfv: field::PFV.get(h),
            cpda: field::PDA.get(h),
            digests: Digests::from_ic_bits(field::DGST.get(h)),
            maxh2cdata: field::MAXH2CDATA.get(h),
        }),
        kind::H2C_TERM_REQ | kind::C2H_TERM_REQ => {
            let t = TermReq { fes: field::FES.get(h), fei: field::FEI.get(h), data: Bytes::new() };
            if ch.kind == kind::H2C_TERM_REQ {
                Pdu::H2CTermReq(t)
            } else {
                Pdu::C2HTermReq(t)
            }
        }
        kind::CAPSULE_CMD => Pdu::CapsuleCmd(CapsuleCmd { sqe: Sqe::from_slice(&h[CH_LEN..CH_LEN + 64]), data: Bytes::new() }),
        kind::CAPSULE_RESP => Pdu::CapsuleResp(Cqe::parse(&h[CH_LEN..CH_LEN + 16])),
        kind::H2C_DATA | kind::C2H_DATA => {
            check_datal!(ch, h, data_len);
            let DataPduHeader { cid, ttag, offset, last, success } = data_header(h, ch.flags);
            let d = DataPdu { cid, ttag, offset, last, success, data: Bytes::new() };
            if ch.kind == kind::H2C_DATA {
                Pdu::H2CData(d)
            } else {
                Pdu::C2HData(d)
            }
        }
        kind::R2T => Pdu::R2T(R2t {
            cid: field::CCCID.get(h),
            ttag: field::TTAG.get(h),
            offset: field::DATAO.get(h),
            length: field::DATAL.get(h),
        }),
        other => return Err(PduError::UnknownType(other)),
    })
}

/// A data PDU's header, checked as [`decode`] checks it, before its payload
/// has arrived: lets a receiver read the payload straight to where it
/// belongs. The payload starts `data_start` bytes into the PDU and is
/// `data_len` bytes long; `ddgst` says a 4-byte data digest follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeaderView {
    pub kind: u8,
    pub hdr: DataPduHeader,
    pub data_start: usize,
    pub data_len: usize,
    pub ddgst: bool,
}

/// If `buf` starts with a complete C2HData/H2CData header (through the data
/// offset), check and return it without consuming anything. `Ok(None)`: not
/// a data PDU, a data PDU without payload, or not enough bytes yet.
pub fn peek_data_header(buf: &[u8], digests: Digests, max_plen: u32) -> Result<Option<DataHeaderView>, PduError> {
    if buf.len() < CH_LEN {
        return Ok(None);
    }
    let ch = CommonHeader::parse(&buf[..CH_LEN]);
    if !matches!(ch.kind, kind::C2H_DATA | kind::H2C_DATA) {
        return Ok(None);
    }
    // `decode`'s checks, its very code, in the order the bytes allow: the
    // common header's; the payload bounds, which need only the common
    // header (`check` makes them after the header digest, once all of the
    // PDU is in); the header digest once the header is in; DATAL (which
    // `decode` makes after the data digest, which this never sees). So of
    // a PDU with two faults this may report the other one.
    let Layout { hd, with_data } = check_common!(&ch, DATA_HLEN, digests, max_plen);
    if !with_data {
        return Ok(None);
    }
    let plen = ch.plen as usize;
    let (pdo, dd) = check_payload!(&ch, DATA_HLEN + hd, plen, digests);
    if buf.len() < pdo {
        return Ok(None);
    }
    if hd != 0 {
        check_header_digest!(&ch, buf, DATA_HLEN);
    }
    let data_len = plen - dd - pdo;
    check_datal!(&ch, buf, data_len);
    let hdr = data_header(buf, ch.flags);
    Ok(Some(DataHeaderView { kind: ch.kind, hdr, data_start: pdo, data_len, ddgst: dd != 0 }))
}

/// The header (and header digest) of a C2HData or H2CData PDU whose
/// `len`-byte payload the sender writes itself, straight from where the data
/// lives (a file with sendfile, the caller's buffer). When `digests.data` is
/// set the sender must follow the payload with its CRC32C.
pub struct DataHeader {
    buf: [u8; DATA_HLEN + DIGEST_LEN],
    len: usize,
}

impl DataHeader {
    pub fn new(h2c: bool, d: &DataPduHeader, len: u32, digests: Digests) -> DataHeader {
        let mut buf = [0u8; DATA_HLEN + DIGEST_LEN];
        let hd = if digests.header { DIGEST_LEN } else { 0 };
        let dd = if digests.data && len > 0 { DIGEST_LEN } else { 0 };
        let mut fl = 0u8;
        if d.last {
            fl |= flags::DATA_LAST;
        }
        if d.success {
            fl |= flags::DATA_SUCCESS;
        }
        if hd != 0 {
            fl |= flags::HDGST;
        }
        if dd != 0 {
            fl |= flags::DDGST;
        }
        let pdo = if len == 0 { 0 } else { (DATA_HLEN + hd) as u8 };
        let kind = if h2c { kind::H2C_DATA } else { kind::C2H_DATA };
        let plen = (DATA_HLEN + hd + dd) as u32 + len;
        CommonHeader { kind, flags: fl, hlen: DATA_HLEN as u8, pdo, plen }.write(&mut buf);
        field::CCCID.set(&mut buf, d.cid);
        field::TTAG.set(&mut buf, d.ttag);
        field::DATAO.set(&mut buf, d.offset);
        field::DATAL.set(&mut buf, len);
        if hd != 0 {
            let c = crc32c(&buf[..DATA_HLEN]);
            digest_at(DATA_HLEN).set(&mut buf, c);
        }
        DataHeader { buf, len: DATA_HLEN + hd }
    }
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// The fields of a data PDU other than its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataPduHeader {
    pub cid: u16,
    pub ttag: u16,
    pub offset: u32,
    pub last: bool,
    pub success: bool,
}

/// The fields of an H2CData/C2HData PDU header `h` (common header flags `f`).
fn data_header(h: &[u8], f: u8) -> DataPduHeader {
    DataPduHeader {
        cid: field::CCCID.get(h),
        ttag: field::TTAG.get(h),
        offset: field::DATAO.get(h),
        last: f & flags::DATA_LAST != 0,
        success: f & flags::DATA_SUCCESS != 0,
    }
}

/// Append a CapsuleCmd (commands, the host's most common PDU) with its
/// in-capsule `data`, straight from where the caller keeps them.
pub fn encode_capsule(sqe: &Sqe, data: &[u8], digests: Digests, out: &mut Vec<u8>) {
    encode_capsule_head(sqe, data.len(), digests, out);
    out.extend_from_slice(data);
    if let Some(d) = capsule_data_digest(data, digests) {
        out.extend_from_slice(&d);
    }
}

/// What [`encode_capsule`] puts before the in-capsule data (`data_len`
/// bytes of it): for a sender that sends the data from where it is, then
/// [`capsule_data_digest`] if there is one.
pub fn encode_capsule_head(sqe: &Sqe, data_len: usize, digests: Digests, out: &mut Vec<u8>) {
    let hd = if digests.header { DIGEST_LEN } else { 0 };
    let dd = if digests.data && data_len > 0 { DIGEST_LEN } else { 0 };
    let fl = (if hd != 0 { flags::HDGST } else { 0 }) | (if dd != 0 { flags::DDGST } else { 0 });
    let pdo = if data_len == 0 { 0 } else { (CMD_HLEN + hd) as u8 };
    let plen = (CMD_HLEN + hd + data_len + dd) as u32;
    // Filled on the stack and appended in one copy: zero-extending `out`
    // and writing the fields through it cost ~2x as many instructions
    // (once per host command, docs/notes/2026-11-27-h51w-client.md).
    let mut h = [0u8; CMD_HLEN];
    CommonHeader { kind: kind::CAPSULE_CMD, flags: fl, hlen: CMD_HLEN as u8, pdo, plen }.write(&mut h);
    h[CH_LEN..].copy_from_slice(&sqe.0);
    out.extend_from_slice(&h);
    if hd != 0 {
        out.extend_from_slice(&crc32c(&h).to_le_bytes());
    }
}

/// Append a CapsuleResp (completions, the controller's most common PDU)
/// for `cqe`: the one encoder of its layout, [`Pdu::encode_into`]'s too.
/// Inlined, so a controller completing a command does not build a
/// [`Pdu`] only to have `encode_into` match it again (a target's
/// `TcpWire::complete`: -23 instructions per 4 KiB write,
/// docs/notes/2026-11-28-h51zd-nvme-decode.md).
#[inline]
pub fn encode_capsule_resp(cqe: &Cqe, digests: Digests, out: &mut Vec<u8>) {
    // Built in an array of the header's fixed length, where the fields'
    // bounds are known when compiling, then appended once.
    let hd = if digests.header { DIGEST_LEN } else { 0 };
    let mut h = [0u8; RESP_HLEN];
    let fl = if hd != 0 { flags::HDGST } else { 0 };
    CommonHeader { kind: kind::CAPSULE_RESP, flags: fl, hlen: RESP_HLEN as u8, pdo: 0, plen: (RESP_HLEN + hd) as u32 }.write(&mut h);
    cqe.write(&mut h[CH_LEN..]);
    out.extend_from_slice(&h);
    if hd != 0 {
        out.extend_from_slice(&crc32c(&h).to_le_bytes());
    }
}

/// The data digest that follows in-capsule `data`, if the connection has
/// data digests.
pub fn capsule_data_digest(data: &[u8], digests: Digests) -> Option<[u8; DIGEST_LEN]> {
    (digests.data && !data.is_empty()).then(|| crc32c(data).to_le_bytes())
}

/// A PDU ready to send: header (with header digest and padding), payload,
/// and the data digest if any.
pub struct Encoded {
    pub head: Bytes,
    pub data: Bytes,
    pub ddgst: Option<[u8; 4]>,
}

impl Encoded {
    pub fn len(&self) -> usize {
        self.head.len() + self.data.len() + if self.ddgst.is_some() { 4 } else { 0 }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// All parts in one buffer (small PDUs, tests).
    pub fn concat(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(&self.head);
        v.extend_from_slice(&self.data);
        if let Some(d) = self.ddgst {
            v.extend_from_slice(&d);
        }
        v
    }
}

impl Pdu {
    pub fn kind(&self) -> u8 {
        match self {
            Pdu::IcReq(_) => kind::IC_REQ,
            Pdu::IcResp(_) => kind::IC_RESP,
            Pdu::H2CTermReq(_) => kind::H2C_TERM_REQ,
            Pdu::C2HTermReq(_) => kind::C2H_TERM_REQ,
            Pdu::CapsuleCmd(_) => kind::CAPSULE_CMD,
            Pdu::CapsuleResp(_) => kind::CAPSULE_RESP,
            Pdu::H2CData(_) => kind::H2C_DATA,
            Pdu::C2HData(_) => kind::C2H_DATA,
            Pdu::R2T(_) => kind::R2T,
        }
    }

    /// Encode with the connection's digests. Data PDUs and capsules with data
    /// put the payload right after the header (PDO = hlen + header digest),
    /// which is what a CPDA/HPDA of 0 asks for.
    pub fn encode_parts(&self, digests: Digests) -> Encoded {
        let k = self.kind();
        let hlen = expected_hlen(k).unwrap_or(CH_LEN);
        let is_ic = matches!(self, Pdu::IcReq(_) | Pdu::IcResp(_));
        let is_term = matches!(self, Pdu::H2CTermReq(_) | Pdu::C2HTermReq(_));
        let hd = if digests.header && !is_ic && !is_term { DIGEST_LEN } else { 0 };
        let mut h = BytesMut::zeroed(hlen);
        let mut fl = 0u8;
        let data: Bytes = match self {
            Pdu::IcReq(r) => {
                field::PFV.set(&mut h, r.pfv);
                field::PDA.set(&mut h, r.hpda);
                field::DGST.set(&mut h, r.digests.ic_bits());
                field::MAXR2T.set(&mut h, r.maxr2t);
                Bytes::new()
            }
            Pdu::IcResp(r) => {
                field::PFV.set(&mut h, r.pfv);
                field::PDA.set(&mut h, r.cpda);
                field::DGST.set(&mut h, r.digests.ic_bits());
                field::MAXH2CDATA.set(&mut h, r.maxh2cdata);
                Bytes::new()
            }
            Pdu::H2CTermReq(t) | Pdu::C2HTermReq(t) => {
                field::FES.set(&mut h, t.fes);
                field::FEI.set(&mut h, t.fei);
                t.data.slice(..t.data.len().min(TERM_MAX_DATA))
            }
            Pdu::CapsuleCmd(c) => {
                h[CH_LEN..CH_LEN + 64].copy_from_slice(&c.sqe.0);
                c.data.clone()
            }
            Pdu::CapsuleResp(cqe) => {
                cqe.write(&mut h[CH_LEN..CH_LEN + 16]);
                Bytes::new()
            }
            Pdu::H2CData(d) | Pdu::C2HData(d) => {
                field::CCCID.set(&mut h, d.cid);
                field::TTAG.set(&mut h, d.ttag);
                field::DATAO.set(&mut h, d.offset);
                field::DATAL.set(&mut h, d.data.len() as u32);
                if d.last {
                    fl |= flags::DATA_LAST;
                }
                if d.success {
                    fl |= flags::DATA_SUCCESS;
                }
                d.data.clone()
            }
            Pdu::R2T(r) => {
                field::CCCID.set(&mut h, r.cid);
                field::TTAG.set(&mut h, r.ttag);
                field::DATAO.set(&mut h, r.offset);
                field::DATAL.set(&mut h, r.length);
                Bytes::new()
            }
        };
        let dd = if digests.data && !data.is_empty() && !is_term { DIGEST_LEN } else { 0 };
        if hd != 0 {
            fl |= flags::HDGST;
        }
        if dd != 0 {
            fl |= flags::DDGST;
        }
        let pdo = if data.is_empty() || is_term { 0 } else { (hlen + hd) as u8 };
        let plen = (hlen + hd + data.len() + dd) as u32;
        CommonHeader { kind: k, flags: fl, hlen: hlen as u8, pdo, plen }.write(&mut h);
        if hd != 0 {
            let c = crc32c(&h);
            h.put_u32_le(c);
        }
        let ddgst = if dd != 0 { Some(crc32c(&data).to_le_bytes()) } else { None };
        Encoded { head: h.freeze(), data, ddgst }
    }

    /// Append the encoded PDU to `out`. Completions, the most common PDU,
    /// are written in place without building the parts first.
    pub fn encode_into(&self, digests: Digests, out: &mut Vec<u8>) {
        if let Pdu::CapsuleResp(cqe) = self {
            return encode_capsule_resp(cqe, digests, out);
        }
        if let Pdu::CapsuleCmd(c) = self {
            return encode_capsule(&c.sqe, &c.data, digests, out);
        }
        let e = self.encode_parts(digests);
        out.extend_from_slice(&e.head);
        out.extend_from_slice(&e.data);
        if let Some(d) = e.ddgst {
            out.extend_from_slice(&d);
        }
    }

    /// Encode into one contiguous buffer.
    pub fn encode(&self, digests: Digests, out: &mut BytesMut) {
        let e = self.encode_parts(digests);
        out.extend_from_slice(&e.head);
        out.extend_from_slice(&e.data);
        if let Some(d) = e.ddgst {
            out.extend_from_slice(&d);
        }
    }
}

#[cfg(test)]
mod tests;
