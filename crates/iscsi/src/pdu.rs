//! iSCSI PDU framing (RFC 7143 section 11): the 48-byte Basic Header Segment,
//! additional header segments, data segment with padding, and CRC32C digests.
//!
//! A [`Pdu`] keeps the header as raw bytes ([`Bhs`]) and the data segment as
//! a `bytes::Bytes` cut out of the receive buffer without copying. Typed
//! views of each opcode live in [`crate::msg`].

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub const BHS_LEN: usize = 48;
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

impl Opcode {
    pub fn from_u8(v: u8) -> Result<Opcode, PduError> {
        use Opcode::*;
        Ok(match v & 0x3F {
            0x00 => NopOut,
            0x01 => ScsiCommand,
            0x02 => TaskMgmtRequest,
            0x03 => LoginRequest,
            0x04 => TextRequest,
            0x05 => DataOut,
            0x06 => LogoutRequest,
            0x10 => SnackRequest,
            0x20 => NopIn,
            0x21 => ScsiResponse,
            0x22 => TaskMgmtResponse,
            0x23 => LoginResponse,
            0x24 => TextResponse,
            0x25 => DataIn,
            0x26 => LogoutResponse,
            0x31 => R2t,
            0x32 => AsyncMessage,
            0x3F => Reject,
            other => return Err(PduError::UnknownOpcode(other)),
        })
    }
}

/// The Basic Header Segment as raw bytes, with big-endian field accessors.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Bhs(pub [u8; BHS_LEN]);

impl std::fmt::Debug for Bhs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bhs(op={:#04x} ", self.0[0] & 0x3F)?;
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
        self.0[0] & 0x3F
    }
    pub fn opcode(&self) -> Result<Opcode, PduError> {
        Opcode::from_u8(self.0[0])
    }
    pub fn immediate(&self) -> bool {
        self.0[0] & 0x40 != 0
    }
    pub fn final_bit(&self) -> bool {
        self.0[1] & 0x80 != 0
    }
    pub fn total_ahs_len(&self) -> usize {
        self.0[4] as usize * 4
    }
    pub fn data_segment_len(&self) -> usize {
        self.u24(5) as usize
    }
    pub fn set_data_segment_len(&mut self, len: usize) {
        self.set_u24(5, len as u32)
    }
    pub fn itt(&self) -> u32 {
        self.u32(16)
    }

    pub fn u8(&self, at: usize) -> u8 {
        self.0[at]
    }
    pub fn u16(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.0[at], self.0[at + 1]])
    }
    pub fn u24(&self, at: usize) -> u32 {
        u32::from_be_bytes([0, self.0[at], self.0[at + 1], self.0[at + 2]])
    }
    pub fn u32(&self, at: usize) -> u32 {
        u32::from_be_bytes([self.0[at], self.0[at + 1], self.0[at + 2], self.0[at + 3]])
    }
    pub fn u64(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[at..at + 8]);
        u64::from_be_bytes(b)
    }
    pub fn set_u8(&mut self, at: usize, v: u8) {
        self.0[at] = v
    }
    pub fn set_u16(&mut self, at: usize, v: u16) {
        self.0[at..at + 2].copy_from_slice(&v.to_be_bytes())
    }
    pub fn set_u24(&mut self, at: usize, v: u32) {
        self.0[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..])
    }
    pub fn set_u32(&mut self, at: usize, v: u32) {
        self.0[at..at + 4].copy_from_slice(&v.to_be_bytes())
    }
    pub fn set_u64(&mut self, at: usize, v: u64) {
        self.0[at..at + 8].copy_from_slice(&v.to_be_bytes())
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
        bhs.0[4] = (self.ahs.len() / 4) as u8;
        bhs.set_data_segment_len(data_len);
        let mut out = BytesMut::with_capacity(BHS_LEN + self.ahs.len() + 4);
        out.put_slice(&bhs.0);
        out.put_slice(&self.ahs);
        if d.header {
            let crc = crc32c::crc32c(&out);
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
        b[4] = 0;
        b[5..8].copy_from_slice(&(data_len as u32).to_be_bytes()[1..]);
        let mut len = BHS_LEN;
        if d.header {
            let crc = crc32c::crc32c(&b[..BHS_LEN]);
            b[BHS_LEN..].copy_from_slice(&crc.to_le_bytes());
            len += 4;
        }
        Head::Short(b, len)
    }

    /// Padding and data digest that follow the data segment (empty if none).
    pub fn trailer(&self, d: Digests) -> ([u8; 8], usize) {
        let mut t = [0u8; 8];
        if self.data.is_empty() {
            return (t, 0);
        }
        let pad = pad4(self.data.len());
        let mut n = pad;
        if d.data {
            let crc = crc32c::crc32c_append(crc32c::crc32c(&self.data), &t[..pad]);
            t[pad..pad + 4].copy_from_slice(&crc.to_le_bytes());
            n += 4;
        }
        (t, n)
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

/// Write one PDU (header, data segment, padding and data digest) to an
/// async writer; meant for a buffered writer, flushed by the caller.
#[cfg(feature = "tokio")]
pub async fn write_pdu<W: tokio::io::AsyncWrite + Unpin>(w: &mut W, p: &Pdu, d: Digests) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    w.write_all(&p.head(d, p.data.len())).await?;
    if !p.data.is_empty() {
        w.write_all(&p.data).await?;
        let (t, n) = p.trailer(d);
        w.write_all(&t[..n]).await?;
    }
    Ok(())
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
        let hd = if self.digests.header { 4 } else { 0 };
        let (header_len, total) = self.lengths(&bhs);
        if buf.len() >= header_len && self.digests.header {
            let want = crc32c::crc32c(&buf[..BHS_LEN + ahs_len]);
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
        let mut frame = buf.split_to(total);
        frame.advance(BHS_LEN);
        let ahs = frame.split_to(ahs_len).freeze();
        frame.advance(hd);
        let mut data = frame.split_to(dlen);
        if dlen > 0 && self.digests.data {
            let pad = pad4(dlen);
            let want = crc32c::crc32c_append(crc32c::crc32c(&data), &frame[..pad]);
            let got = u32::from_le_bytes([frame[pad], frame[pad + 1], frame[pad + 2], frame[pad + 3]]);
            if want != got {
                return Err(PduError::DataDigest);
            }
        }
        data.truncate(dlen);
        Ok(Some(Pdu { bhs, ahs, data: data.freeze() }))
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
        bhs.0[0] = 0x01;
        bhs.set_u32(16, 0x1234);
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
        bhs.0[0] = 0x25;
        bhs.0[4] = 9; // stale lengths are replaced
        bhs.set_u32(16, 0xabcd);
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
    fn crc32c_known_vector() {
        // RFC 3720 B.4: 32 bytes of zeroes -> 0x8a9136aa.
        assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8a91_36aa);
    }

    #[test]
    fn digest_errors_detected() {
        let p = Pdu::new(Bhs::default(), Bytes::from_static(b"abcd"));
        let d = Digests { header: true, data: true };
        let mut dec = Decoder::new(8192);
        dec.digests = d;
        let mut wire = p.encode(d);
        wire[3] ^= 1;
        assert_eq!(dec.decode(&mut wire.clone()), Err(PduError::HeaderDigest));
        let mut wire = p.encode(d);
        wire[BHS_LEN + 4] ^= 1;
        assert_eq!(dec.decode(&mut wire), Err(PduError::DataDigest));
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
