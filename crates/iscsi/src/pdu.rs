//! iSCSI PDU framing (RFC 7143 section 11): the 48-byte Basic Header Segment,
//! additional header segments, data segment with padding, and CRC32C digests.
//!
//! A [`Pdu`] keeps the header as raw bytes ([`Bhs`]) and the data segment as
//! a `bytes::Bytes` cut out of the receive buffer without copying. Typed
//! views of each opcode live in [`crate::msg`].

use bytes::{Buf, BufMut, Bytes, BytesMut};
use num_enum::TryFromPrimitive;
/// The digest of both header and data (one implementation switch: [`bw_wire::crc32c::set_impl`]).
pub use bw_wire::crc32c::{crc32c, crc32c_append, set_impl as set_digest_impl, Impl as DigestImpl};

pub const BHS_LEN: usize = 48;

/// Every Basic Header Segment field (RFC 7143 section 11), defined once:
/// [`crate::msg`] decodes and encodes each message through these, and the
/// framing here reads the lengths through them. Fields that share bytes in
/// different PDUs have one name per meaning.
pub mod field {
    use bw_wire::{Bits, Field, Flag, U24};

    // Byte 0.
    pub const OPCODE: Bits = Bits::at(0, 0x3f);
    pub const IMMEDIATE: Flag = Flag::at(0, 0x40);
    // Byte 1: flags, by PDU.
    pub const FINAL: Flag = Flag::at(1, 0x80);
    /// SCSI Command.
    pub const READ: Flag = Flag::at(1, 0x40);
    pub const WRITE: Flag = Flag::at(1, 0x20);
    pub const ATTR: Bits = Bits::at(1, 0x07);
    /// Login request/response (TRANSIT is the F bit's place); Text.
    pub const TRANSIT: Flag = Flag::at(1, 0x80);
    pub const CONTINUE: Flag = Flag::at(1, 0x40);
    pub const CSG: Bits = Bits::at(1, 0x0c);
    pub const NSG: Bits = Bits::at(1, 0x03);
    /// Data-In and SCSI Response.
    pub const ACKNOWLEDGE: Flag = Flag::at(1, 0x40);
    pub const RESIDUAL_OVERFLOW: Flag = Flag::at(1, 0x04);
    pub const RESIDUAL_UNDERFLOW: Flag = Flag::at(1, 0x02);
    pub const STATUS_PRESENT: Flag = Flag::at(1, 0x01);
    /// Task Management request.
    pub const TMF_FUNCTION: Bits = Bits::at(1, 0x7f);
    /// Logout request.
    pub const LOGOUT_REASON: Bits = Bits::at(1, 0x7f);
    /// SNACK request.
    pub const SNACK_TYPE: Bits = Bits::at(1, 0x0f);
    // Bytes 2 and 3.
    pub const RESPONSE: Field<u8> = Field::at(2);
    pub const VERSION_MAX: Field<u8> = Field::at(2);
    pub const REJECT_REASON: Field<u8> = Field::at(2);
    pub const STATUS: Field<u8> = Field::at(3);
    /// VERSION-MIN in a request, VERSION-ACTIVE in a response.
    pub const VERSION_MIN: Field<u8> = Field::at(3);
    pub const VERSION_ACTIVE: Field<u8> = Field::at(3);
    // Lengths.
    /// In 4-byte words.
    pub const TOTAL_AHS_LENGTH: Field<u8> = Field::at(4);
    pub const DATA_SEGMENT_LENGTH: Field<U24> = Field::at(5);
    // Bytes 8..16.
    pub const LUN: Field<u64> = Field::at(8);
    pub const ISID: Field<[u8; 6]> = Field::at(8);
    pub const TSIH: Field<u16> = Field::at(14);
    // Bytes 16..24.
    pub const ITT: Field<u32> = Field::at(16);
    pub const TTT: Field<u32> = Field::at(20);
    pub const EDTL: Field<u32> = Field::at(20);
    pub const REFERENCED_TASK_TAG: Field<u32> = Field::at(20);
    pub const CID: Field<u16> = Field::at(20);
    // Sequence numbers.
    pub const CMD_SN: Field<u32> = Field::at(24);
    pub const STAT_SN: Field<u32> = Field::at(24);
    pub const EXP_STAT_SN: Field<u32> = Field::at(28);
    pub const EXP_CMD_SN: Field<u32> = Field::at(28);
    pub const MAX_CMD_SN: Field<u32> = Field::at(32);
    pub const REF_CMD_SN: Field<u32> = Field::at(32);
    pub const CDB: Field<[u8; 16]> = Field::at(32);
    pub const DATA_SN: Field<u32> = Field::at(36);
    pub const R2T_SN: Field<u32> = Field::at(36);
    pub const EXP_DATA_SN: Field<u32> = Field::at(36);
    pub const STATUS_CLASS: Field<u8> = Field::at(36);
    pub const STATUS_DETAIL: Field<u8> = Field::at(37);
    pub const ASYNC_EVENT: Field<u8> = Field::at(36);
    pub const ASYNC_VCODE: Field<u8> = Field::at(37);
    pub const PARAMETER1: Field<u16> = Field::at(38);
    pub const PARAMETER2: Field<u16> = Field::at(40);
    pub const PARAMETER3: Field<u16> = Field::at(42);
    pub const BUFFER_OFFSET: Field<u32> = Field::at(40);
    pub const BEG_RUN: Field<u32> = Field::at(40);
    pub const TIME2WAIT: Field<u16> = Field::at(40);
    pub const TIME2RETAIN: Field<u16> = Field::at(42);
    pub const RESIDUAL_COUNT: Field<u32> = Field::at(44);
    pub const DESIRED_LENGTH: Field<u32> = Field::at(44);
    pub const RUN_LENGTH: Field<u32> = Field::at(44);
}
/// ITT/TTT value meaning "none" (RFC 7143 "reserved tag").
pub const RESERVED_TAG: u32 = 0xFFFF_FFFF;
/// Largest data segment the 24-bit DataSegmentLength field can describe.
pub const MAX_DATA_SEGMENT: usize = (1 << 24) - 1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    #[error("header digest mismatch")]
    HeaderDigest,
    #[error("data digest mismatch")]
    DataDigest,
    #[error("data segment of {len} bytes exceeds the limit of {max}")]
    DataTooLong { len: usize, max: usize },
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    #[error("invalid field: {0}")]
    InvalidField(&'static str),
}

/// Opcodes; initiator ones below 0x20, target ones from 0x20.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, TryFromPrimitive)]
#[num_enum(error_type(name = PduError, constructor = PduError::UnknownOpcode))]
#[repr(u8)]
pub enum Opcode {
    NopOut = 0x00,
    ScsiCommand = 0x01,
    TaskMgmtRequest = 0x02,
    LoginRequest = 0x03,
    TextRequest = 0x04,
    DataOut = 0x05,
    LogoutRequest = 0x06,
    SnackRequest = 0x10,
    NopIn = 0x20,
    ScsiResponse = 0x21,
    TaskMgmtResponse = 0x22,
    LoginResponse = 0x23,
    TextResponse = 0x24,
    DataIn = 0x25,
    LogoutResponse = 0x26,
    R2t = 0x31,
    AsyncMessage = 0x32,
    Reject = 0x3F,
}


/// The Basic Header Segment as raw bytes, with big-endian field accessors.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Bhs(pub [u8; BHS_LEN]);

impl std::fmt::Debug for Bhs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bhs(op={:#04x} ", self.opcode_raw())?;
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

impl Default for Bhs {
    fn default() -> Self {
        Bhs([0; BHS_LEN])
    }
}

impl Bhs {
    pub fn opcode_raw(&self) -> u8 {
        field::OPCODE.get(&self.0)
    }
    pub fn opcode(&self) -> Result<Opcode, PduError> {
        Opcode::try_from(self.opcode_raw())
    }
    pub fn immediate(&self) -> bool {
        field::IMMEDIATE.get(&self.0)
    }
    pub fn final_bit(&self) -> bool {
        field::FINAL.get(&self.0)
    }
    pub fn total_ahs_len(&self) -> usize {
        field::TOTAL_AHS_LENGTH.get(&self.0) as usize * 4
    }
    pub fn data_segment_len(&self) -> usize {
        field::DATA_SEGMENT_LENGTH.get(&self.0) as usize
    }
    pub fn set_data_segment_len(&mut self, len: usize) {
        field::DATA_SEGMENT_LENGTH.set(&mut self.0, len as u32)
    }
    pub fn itt(&self) -> u32 {
        field::ITT.get(&self.0)
    }

    /// A field's value (see [`field`]).
    #[inline]
    pub fn get<C: bw_wire::Codec>(&self, f: bw_wire::Field<C>) -> C::Value {
        f.get(&self.0)
    }
    #[inline]
    pub fn set<C: bw_wire::Codec>(&mut self, f: bw_wire::Field<C>, v: C::Value) {
        f.set(&mut self.0, v)
    }
    #[inline]
    pub fn flag(&self, f: bw_wire::Flag) -> bool {
        f.get(&self.0)
    }
    #[inline]
    pub fn set_flag(&mut self, f: bw_wire::Flag, on: bool) {
        f.set(&mut self.0, on)
    }
    #[inline]
    pub fn bits(&self, f: bw_wire::Bits) -> u8 {
        f.get(&self.0)
    }
    #[inline]
    pub fn set_bits(&mut self, f: bw_wire::Bits, v: u8) {
        f.set(&mut self.0, v)
    }
}

/// Which digests a connection uses (negotiated at login).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// One PDU: header, additional header segments (raw, padded to 4 bytes) and
/// the data segment without padding.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pdu {
    pub bhs: Bhs,
    pub ahs: Bytes,
    pub data: Bytes,
}

/// Padding after a data segment of `n` bytes.
pub fn pad4(n: usize) -> usize {
    (4 - n % 4) % 4
}

impl Pdu {
    pub fn new(bhs: Bhs, data: Bytes) -> Pdu {
        Pdu { bhs, ahs: Bytes::new(), data }
    }

    /// Bytes on the wire for this PDU with `digests`.
    pub fn wire_len(&self, d: Digests) -> usize {
        BHS_LEN
            + self.ahs.len()
            + if d.header { 4 } else { 0 }
            + if self.data.is_empty() { 0 } else { self.data.len() + pad4(self.data.len()) + if d.data { 4 } else { 0 } }
    }

    /// Header part on the wire: BHS (with lengths filled in) + AHS + header
    /// digest. The data segment follows, then [`Pdu::trailer`].
    pub fn header_bytes(&self, d: Digests) -> BytesMut {
        self.header_bytes_for(d, self.data.len())
    }

    /// Header part for a data segment of `data_len` bytes that the caller
    /// sends itself (e.g. with `sendfile`), followed by [`pad4`] zero bytes
    /// and no data digest.
    pub fn header_bytes_for(&self, d: Digests, data_len: usize) -> BytesMut {
        let mut bhs = self.bhs;
        bhs.set(field::TOTAL_AHS_LENGTH, (self.ahs.len() / 4) as u8);
        bhs.set_data_segment_len(data_len);
        let mut out = BytesMut::with_capacity(BHS_LEN + self.ahs.len() + 4);
        out.put_slice(&bhs.0);
        out.put_slice(&self.ahs);
        if d.header {
            let crc = crc32c(&out);
            out.put_u32_le(crc);
        }
        out
    }

    /// Header part for a data segment of `data_len` bytes without a heap
    /// allocation for PDUs without AHS (every PDU a target sends).
    pub fn head(&self, d: Digests, data_len: usize) -> Head {
        if !self.ahs.is_empty() {
            return Head::Long(self.header_bytes_for(d, data_len));
        }
        let mut b = [0u8; BHS_LEN + 4];
        b[..BHS_LEN].copy_from_slice(&self.bhs.0);
        field::TOTAL_AHS_LENGTH.set(&mut b, 0);
        field::DATA_SEGMENT_LENGTH.set(&mut b, data_len as u32);
        let mut len = BHS_LEN;
        if d.header {
            let crc = crc32c(&b[..BHS_LEN]);
            b[BHS_LEN..].copy_from_slice(&crc.to_le_bytes());
            len += 4;
        }
        Head::Short(b, len)
    }

    /// Padding and data digest that follow the data segment (empty if none).
    pub fn trailer(&self, d: Digests) -> ([u8; 8], usize) {
        trailer(&self.data, d)
    }

    /// The whole PDU in one buffer (copies the data; fine for small PDUs).
    pub fn encode(&self, d: Digests) -> BytesMut {
        let mut out = self.header_bytes(d);
        out.reserve(self.data.len() + 8);
        out.put_slice(&self.data);
        let (t, n) = self.trailer(d);
        out.put_slice(&t[..n]);
        out
    }
}

/// Append one PDU without AHS to `out` as it goes on the wire: the BHS
/// with its data segment length, the header digest, `data`, its padding
/// and the data digest (as `d` says). The one encoding both ends use for
/// PDUs they build in a send buffer.
pub fn encode_into(bhs: &Bhs, data: &[u8], d: Digests, out: &mut Vec<u8>) {
    encode_head_into(bhs, data.len(), d, out);
    out.extend_from_slice(data);
    let (t, n) = trailer(data, d);
    out.extend_from_slice(&t[..n]);
}

/// Append the header part of a PDU without AHS for a data segment of
/// `data_len` bytes that the caller sends itself (then [`trailer`]).
pub fn encode_head_into(bhs: &Bhs, data_len: usize, d: Digests, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&bhs.0);
    field::TOTAL_AHS_LENGTH.set(&mut out[start..], 0);
    field::DATA_SEGMENT_LENGTH.set(&mut out[start..], data_len as u32);
    if d.header {
        let crc = crc32c(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
    }
}

/// The padding and data digest that follow `data` on the wire, and how
/// many of the 8 bytes they take (none for an empty data segment).
pub fn trailer(data: &[u8], d: Digests) -> ([u8; 8], usize) {
    let mut t = [0u8; 8];
    if data.is_empty() {
        return (t, 0);
    }
    let pad = pad4(data.len());
    let mut n = pad;
    if d.data {
        let crc = crc32c_append(crc32c(data), &t[..pad]);
        t[pad..pad + 4].copy_from_slice(&crc.to_le_bytes());
        n += 4;
    }
    (t, n)
}

/// The header part of a PDU on the wire (see [`Pdu::head`]).
pub enum Head {
    Short([u8; BHS_LEN + 4], usize),
    Long(BytesMut),
}

impl std::ops::Deref for Head {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Head::Short(b, n) => &b[..*n],
            Head::Long(b) => b,
        }
    }
}

/// A PDU as it goes on the wire, in three parts (header with its digest,
/// the data segment, then padding and data digest), so that both ends can
/// send it with one vectored write and never copy the data segment.
pub struct WireParts<'a> {
    head: Head,
    data: &'a [u8],
    trailer: ([u8; 8], usize),
}

impl WireParts<'_> {
    /// The parts as I/O slices (empty ones included).
    pub fn io_slices(&self) -> [std::io::IoSlice<'_>; 3] {
        [std::io::IoSlice::new(&self.head), std::io::IoSlice::new(self.data), std::io::IoSlice::new(&self.trailer.0[..self.trailer.1])]
    }

    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.data.len() + self.trailer.1
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Pdu {
    /// This PDU on the wire with digests `d` (see [`WireParts`]).
    pub fn wire_parts(&self, d: Digests) -> WireParts<'_> {
        WireParts { head: self.head(d, self.data.len()), data: &self.data, trailer: self.trailer(d) }
    }
}

/// A PDU's header as [`Decoder::peek_header`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub bhs: Bhs,
    /// Bytes on the wire before the data segment (BHS, AHS, header digest).
    pub header_len: usize,
    /// The data segment's length, without padding and digest.
    pub data_len: usize,
}

impl Header {
    /// Padding and digest after the data segment, with digests `d`.
    pub fn trailer_len(&self, d: Digests) -> usize {
        if self.data_len == 0 {
            0
        } else {
            pad4(self.data_len) + if d.data { 4 } else { 0 }
        }
    }
}

/// Splits a byte stream into PDUs.
#[derive(Debug, Clone)]
pub struct Decoder {
    pub digests: Digests,
    /// Largest data segment accepted (our MaxRecvDataSegmentLength, or a
    /// login-phase cap). Longer ones are a connection-fatal error.
    pub max_data: usize,
}

impl Decoder {
    pub fn new(max_data: usize) -> Decoder {
        Decoder { digests: Digests::default(), max_data }
    }

    /// Length on the wire of the PDU at the front of `buf` (header, data,
    /// padding, digests), once its BHS is there.
    pub fn frame_len(&self, buf: &[u8]) -> Option<usize> {
        let mut bhs = Bhs::default();
        bhs.0.copy_from_slice(buf.get(..BHS_LEN)?);
        Some(self.lengths(&bhs).1)
    }

    /// (header length incl. AHS and header digest, whole PDU length) on the
    /// wire for the PDU that starts with `bhs`.
    fn lengths(&self, bhs: &Bhs) -> (usize, usize) {
        let dlen = bhs.data_segment_len();
        let hd = if self.digests.header { 4 } else { 0 };
        let header_len = BHS_LEN + bhs.total_ahs_len() + hd;
        let data_total = if dlen == 0 { 0 } else { dlen + pad4(dlen) + if self.digests.data { 4 } else { 0 } };
        (header_len, header_len + data_total)
    }

    /// The header of the PDU at the front of `buf`, checked (header digest,
    /// data segment length), once the whole header is there: a transport
    /// that puts a data segment somewhere of its own reads the header with
    /// this and the data itself. `Ok(None)`: the header is not complete.
    pub fn peek_header(&self, buf: &[u8]) -> Result<Option<Header>, PduError> {
        if buf.len() < BHS_LEN {
            return Ok(None);
        }
        let mut bhs = Bhs::default();
        bhs.0.copy_from_slice(&buf[..BHS_LEN]);
        let (header_len, _) = self.lengths(&bhs);
        if buf.len() < header_len {
            return Ok(None);
        }
        let ahs_len = bhs.total_ahs_len();
        if self.digests.header {
            let want = crc32c(&buf[..BHS_LEN + ahs_len]);
            let at = BHS_LEN + ahs_len;
            if want != u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) {
                return Err(PduError::HeaderDigest);
            }
        }
        let data_len = bhs.data_segment_len();
        if data_len > self.max_data {
            return Err(PduError::DataTooLong { len: data_len, max: self.max_data });
        }
        Ok(Some(Header { bhs, header_len, data_len }))
    }

    /// Take one complete PDU off the front of `buf`, if there is one. On
    /// error the stream cannot be resynchronised: close the connection.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Pdu>, PduError> {
        if buf.len() < BHS_LEN {
            return Ok(None);
        }
        let mut bhs = Bhs::default();
        bhs.0.copy_from_slice(&buf[..BHS_LEN]);
        let ahs_len = bhs.total_ahs_len();
        let dlen = bhs.data_segment_len();
        let (header_len, total) = self.lengths(&bhs);
        if buf.len() >= header_len && self.digests.header {
            let want = crc32c(&buf[..BHS_LEN + ahs_len]);
            let got = u32::from_le_bytes([
                buf[BHS_LEN + ahs_len],
                buf[BHS_LEN + ahs_len + 1],
                buf[BHS_LEN + ahs_len + 2],
                buf[BHS_LEN + ahs_len + 3],
            ]);
            if want != got {
                return Err(PduError::HeaderDigest);
            }
        }
        if dlen > self.max_data {
            return Err(PduError::DataTooLong { len: dlen, max: self.max_data });
        }
        if buf.len() < total {
            buf.reserve(total - buf.len());
            return Ok(None);
        }
        if dlen > 0 && self.digests.data {
            let (d, pad) = (&buf[header_len..header_len + dlen], pad4(dlen));
            let t = &buf[header_len + dlen..];
            let want = crc32c_append(crc32c(d), &t[..pad]);
            if want != u32::from_le_bytes([t[pad], t[pad + 1], t[pad + 2], t[pad + 3]]) {
                return Err(PduError::DataDigest);
            }
        }
        // Only the data segment is cut out of the buffer (a reference, no
        // copy): a PDU without data (most commands) takes no reference at
        // all, and an AHS (rare: extended CDBs) is copied.
        let ahs = if ahs_len == 0 { Bytes::new() } else { Bytes::copy_from_slice(&buf[BHS_LEN..BHS_LEN + ahs_len]) };
        // The buffer is moved on only as often as needed (each move is an
        // out-of-line call in `bytes`): a 4 KiB write's data needs no
        // padding or digest skipped after it.
        if dlen == 0 {
            buf.advance(total);
            return Ok(Some(Pdu { bhs, ahs, data: Bytes::new() }));
        }
        buf.advance(header_len);
        let data = buf.split_to(dlen).freeze();
        let trailer = total - header_len - dlen;
        if trailer > 0 {
            buf.advance(trailer);
        }
        Ok(Some(Pdu { bhs, ahs, data }))
    }
}

/// Extended CDB from an AHS list (type 1), for CDBs longer than 16 bytes.
pub fn extended_cdb(ahs: &[u8]) -> Option<&[u8]> {
    let mut rest = ahs;
    while rest.len() >= 4 {
        let len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
        let ty = rest[2];
        let body_end = 3 + len;
        if body_end > rest.len() {
            return None;
        }
        if ty == 1 && len >= 1 {
            return Some(&rest[4..body_end]);
        }
        let padded = body_end + pad4(body_end);
        if padded > rest.len() {
            return None;
        }
        rest = &rest[padded..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_digests_and_padding() {
        let mut bhs = Bhs::default();
        bhs.set_bits(field::OPCODE, 0x01);
        bhs.set(field::ITT, 0x1234);
        let p = Pdu::new(bhs, Bytes::from_static(b"hello"));
        for d in [Digests::default(), Digests { header: true, data: true }] {
            let wire = p.encode(d);
            assert_eq!(wire.len(), p.wire_len(d));
            assert_eq!(wire.len() % 4, 0);
            let mut buf = BytesMut::from(&wire[..]);
            let mut dec = Decoder::new(8192);
            dec.digests = d;
            // Partial input yields nothing and keeps the bytes.
            let mut part = BytesMut::from(&wire[..50]);
            assert_eq!(dec.decode(&mut part).unwrap(), None);
            assert_eq!(dec.frame_len(&part), Some(wire.len()));
            assert_eq!(dec.frame_len(&wire[..47]), None);
            let got = dec.decode(&mut buf).unwrap().unwrap();
            assert_eq!(got.data, &b"hello"[..]);
            assert_eq!(got.bhs.itt(), 0x1234);
            assert_eq!(got.bhs.data_segment_len(), 5);
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn stack_head_matches_header_bytes() {
        let mut bhs = Bhs::default();
        bhs.set_bits(field::OPCODE, 0x25);
        bhs.set(field::TOTAL_AHS_LENGTH, 9); // stale lengths are replaced
        bhs.set(field::ITT, 0xabcd);
        let p = Pdu::new(bhs, Bytes::from_static(b"xyz"));
        for d in [Digests::default(), Digests { header: true, data: false }] {
            assert_eq!(&p.head(d, 3)[..], &p.header_bytes(d)[..]);
            assert_eq!(&p.head(d, 70000)[..], &p.header_bytes_for(d, 70000)[..]);
        }
        let with_ahs = Pdu { ahs: Bytes::from_static(&[0, 1, 1, 0]), ..p };
        let d = Digests { header: true, data: true };
        assert_eq!(&with_ahs.head(d, 3)[..], &with_ahs.header_bytes(d)[..]);
    }

    #[test]
    fn wire_parts_are_the_encoding() {
        let mut bhs = Bhs::default();
        bhs.set_bits(field::OPCODE, 0x25);
        for data in [&b""[..], b"a", b"abcd", b"hello world"] {
            let p = Pdu::new(bhs, Bytes::copy_from_slice(data));
            for d in [Digests::default(), Digests { header: true, data: true }] {
                let parts = p.wire_parts(d);
                let joined: Vec<u8> = parts.io_slices().iter().flat_map(|s| s.to_vec()).collect();
                assert_eq!(joined, p.encode(d).to_vec());
                assert_eq!(parts.len(), p.wire_len(d));
            }
        }
    }

    /// `encode_into` writes what `Pdu::encode` does, and `peek_header`
    /// reads the header back (checked) once it is whole.
    #[test]
    fn encode_into_and_peek_header() {
        let mut bhs = Bhs::default();
        bhs.set_bits(field::OPCODE, 0x25);
        bhs.set(field::ITT, 77);
        for data in [&b""[..], b"a", b"abcde"] {
            for d in [Digests::default(), Digests { header: true, data: true }] {
                let p = Pdu::new(bhs, Bytes::copy_from_slice(data));
                let mut out = vec![9u8];
                encode_into(&bhs, data, d, &mut out);
                assert_eq!(&out[1..], &p.encode(d)[..]);
                let mut dec = Decoder::new(8192);
                dec.digests = d;
                let hl = BHS_LEN + if d.header { 4 } else { 0 };
                assert_eq!(dec.peek_header(&out[1..hl]), Ok(None));
                let h = dec.peek_header(&out[1..]).unwrap().unwrap();
                assert_eq!((h.bhs.itt(), h.header_len, h.data_len), (77, hl, data.len()));
                assert_eq!(hl + h.data_len + h.trailer_len(d), out.len() - 1);
                if d.header {
                    out[3] ^= 1;
                    assert_eq!(dec.peek_header(&out[1..]), Err(PduError::HeaderDigest));
                }
            }
        }
        let mut big = bhs;
        big.set_data_segment_len(9000);
        assert!(matches!(Decoder::new(8192).peek_header(&big.0), Err(PduError::DataTooLong { .. })));
    }

    #[test]
    fn crc32c_known_vector() {
        // RFC 3720 B.4: 32 bytes of zeroes -> 0x8a9136aa.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
    }

    /// With the CPU's CRC instruction and with the portable tables
    /// (`set_digest_impl`): the same digests on the wire, and a flipped bit
    /// in the header or the data is caught either way.
    #[test]
    fn digest_errors_detected() {
        let p = Pdu::new(Bhs::default(), Bytes::from_static(b"abcd"));
        let d = Digests { header: true, data: true };
        let mut dec = Decoder::new(8192);
        dec.digests = d;
        let hw = p.encode(d);
        for imp in [DigestImpl::Hardware, DigestImpl::Soft] {
            set_digest_impl(imp);
            assert_eq!(p.encode(d), hw, "{imp:?}");
            assert!(dec.decode(&mut hw.clone()).is_ok(), "{imp:?}");
            let mut wire = p.encode(d);
            wire[3] ^= 1;
            assert_eq!(dec.decode(&mut wire.clone()), Err(PduError::HeaderDigest), "{imp:?}");
            let mut wire = p.encode(d);
            wire[BHS_LEN + 4] ^= 1;
            assert_eq!(dec.decode(&mut wire), Err(PduError::DataDigest), "{imp:?}");
        }
        set_digest_impl(DigestImpl::Hardware);
    }

    #[test]
    fn oversized_data_segment_refused() {
        let mut bhs = Bhs::default();
        bhs.set_data_segment_len(100_000);
        let mut buf = BytesMut::from(&bhs.0[..]);
        assert!(matches!(Decoder::new(8192).decode(&mut buf), Err(PduError::DataTooLong { .. })));
    }

    #[test]
    fn extended_cdb_ahs() {
        // AHSLength 17 (1 reserved + 16 extra CDB bytes), type 1.
        let mut ahs = vec![0, 17, 1, 0];
        ahs.extend(1..=16u8);
        ahs.extend([0u8; 3]);
        assert_eq!(extended_cdb(&ahs).unwrap(), &(1..=16u8).collect::<Vec<_>>()[..]);
        assert_eq!(extended_cdb(&[0, 40, 1, 0]), None);
    }
}
