//! The Ethernet + AoE common header (24 bytes), as a view and an encoder.

use crate::{need, need_out, WireError, AOE_VERSION, ETHERTYPE_AOE, HEADER_LEN};
use num_enum::{FromPrimitive, IntoPrimitive, TryFromPrimitive};

/// The header's fields (Ethernet, then AoE r11 section 2), each defined
/// once for [`AoeHeader`] (reading) and [`HeaderFields::encode`] (writing).
pub mod field {
    use bw_wire::{Bits, Field};
    pub const DST: Field<[u8; 6]> = Field::at(0);
    pub const SRC: Field<[u8; 6]> = Field::at(6);
    pub const ETHERTYPE: Field<u16> = Field::at(12);
    pub const VERSION: Bits = Bits::at(14, 0xf0);
    pub const FLAGS: Bits = Bits::at(14, 0x0f);
    pub const ERROR: Field<u8> = Field::at(15);
    pub const SHELF: Field<u16> = Field::at(16);
    pub const SLOT: Field<u8> = Field::at(18);
    pub const COMMAND: Field<u8> = Field::at(19);
    pub const TAG: Field<u32> = Field::at(20);
    const _: () = assert!(TAG.end() == crate::HEADER_LEN);
}

/// Where an XDP program finds what it steers AoE frames by (the offsets,
/// masks and keys bw-net's xsk_redirect.bpf.c is given; it knows no AoE):
/// the flags byte for requests against replies, the tag for an initiator's
/// prefix, and a 32-bit key word holding shelf and slot, with the command
/// byte after them masked off.
pub mod xdp_match {
    use super::field;
    /// The byte holding [`super::FLAG_RESPONSE`].
    pub const FLAGS_OFFSET: u16 = field::FLAGS.offset() as u16;
    pub const TAG_OFFSET: u16 = field::TAG.offset() as u16;
    /// The word `shelf (16 bits), slot, command`, big-endian.
    pub const ADDRESS_OFFSET: u16 = field::SHELF.offset() as u16;
    pub const ADDRESS_MASK: u32 = 0xFFFF_FF00;
    const _: () = assert!(field::SLOT.offset() == field::SHELF.offset() + 2 && field::COMMAND.offset() == field::SHELF.offset() + 3);

    /// The key of requests to (and replies from) `shelf.slot`. The
    /// broadcast shelf and slot are never exported, so a key set of
    /// exports never takes a broadcast or wildcard query.
    pub const fn address_key(shelf: u16, slot: u8) -> u32 {
        (shelf as u32) << 16 | (slot as u32) << 8
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_address_key_is_the_masked_word_of_a_frame() {
            let mut f = [0u8; 24];
            f[16..20].copy_from_slice(&[0x12, 0x34, 0x56, 0x01]);
            let at = ADDRESS_OFFSET as usize;
            let word = u32::from_be_bytes(f[at..at + 4].try_into().unwrap());
            assert_eq!(word & ADDRESS_MASK, address_key(0x1234, 0x56));
        }
    }
}

pub type Mac = [u8; 6];
pub const BROADCAST_MAC: Mac = [0xFF; 6];

/// Response flag (set in every frame a target sends).
pub const FLAG_RESPONSE: u8 = 0x8;
/// Error flag: the `error` byte holds an [`ErrorCode`].
pub const FLAG_ERROR: u8 = 0x4;

/// AoE commands (byte 19).
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromPrimitive, IntoPrimitive)]
#[repr(u8)]
pub enum Command {
    Ata = 0,
    QueryConfig = 1,
    MacMask = 2,
    ReserveRelease = 3,
    /// Vendor-specific or unknown: answered with error 1.
    #[num_enum(catch_all)]
    Other(u8),
}

/// Protocol error codes carried with the E flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, TryFromPrimitive)]
#[repr(u8)]
pub enum ErrorCode {
    UnrecognizedCommand = 1,
    BadArgument = 2,
    DeviceUnavailable = 3,
    ConfigStringPresent = 4,
    UnsupportedVersion = 5,
    TargetReserved = 6,
}

/// A decoded view over the first 24 bytes of a frame. The EtherType is
/// checked; the version is not (the target answers a wrong version with
/// error 5, so it must be able to read the rest of the header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AoeHeader<'a> {
    buf: &'a [u8],
}

impl<'a> AoeHeader<'a> {
    pub fn parse(buf: &'a [u8]) -> Result<Self, WireError> {
        need(buf, HEADER_LEN)?;
        let et = field::ETHERTYPE.get(buf);
        if et != ETHERTYPE_AOE {
            return Err(WireError::NotAoe(et));
        }
        Ok(AoeHeader { buf })
    }
    /// The whole frame this header starts.
    pub fn frame(&self) -> &'a [u8] {
        self.buf
    }
    /// Bytes after the 24-byte header.
    pub fn payload(&self) -> &'a [u8] {
        &self.buf[HEADER_LEN..]
    }
    pub fn dst(&self) -> Mac {
        field::DST.get(self.buf)
    }
    pub fn src(&self) -> Mac {
        field::SRC.get(self.buf)
    }
    pub fn version(&self) -> u8 {
        field::VERSION.get(self.buf)
    }
    pub fn flags(&self) -> u8 {
        field::FLAGS.get(self.buf)
    }
    pub fn is_response(&self) -> bool {
        self.flags() & FLAG_RESPONSE != 0
    }
    pub fn is_error(&self) -> bool {
        self.flags() & FLAG_ERROR != 0
    }
    pub fn error(&self) -> u8 {
        field::ERROR.get(self.buf)
    }
    pub fn shelf(&self) -> u16 {
        field::SHELF.get(self.buf)
    }
    pub fn slot(&self) -> u8 {
        field::SLOT.get(self.buf)
    }
    pub fn command(&self) -> Command {
        Command::from(field::COMMAND.get(self.buf))
    }
    pub fn tag(&self) -> u32 {
        field::TAG.get(self.buf)
    }
}

pub(crate) fn mac_at(b: &[u8], off: usize) -> Mac {
    let mut m = [0u8; 6];
    m.copy_from_slice(&b[off..off + 6]);
    m
}

/// Fields of a header to encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderFields {
    pub dst: Mac,
    pub src: Mac,
    pub flags: u8,
    pub error: u8,
    pub shelf: u16,
    pub slot: u8,
    pub command: Command,
    pub tag: u32,
}

impl HeaderFields {
    /// Write the 24-byte header at the start of `out`.
    pub fn encode(&self, out: &mut [u8]) -> Result<(), WireError> {
        need_out(out, HEADER_LEN)?;
        field::DST.set(out, self.dst);
        field::SRC.set(out, self.src);
        field::ETHERTYPE.set(out, ETHERTYPE_AOE);
        field::VERSION.set(out, AOE_VERSION);
        field::FLAGS.set(out, self.flags);
        field::ERROR.set(out, self.error);
        field::SHELF.set(out, self.shelf);
        field::SLOT.set(out, self.slot);
        field::COMMAND.set(out, self.command.into());
        field::TAG.set(out, self.tag);
        Ok(())
    }

    pub fn decode(h: &AoeHeader<'_>) -> HeaderFields {
        HeaderFields {
            dst: h.dst(),
            src: h.src(),
            flags: h.flags(),
            error: h.error(),
            shelf: h.shelf(),
            slot: h.slot(),
            command: h.command(),
            tag: h.tag(),
        }
    }
}

/// Format a MAC as `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(m: &Mac) -> String {
    format!("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
}

/// Parse `aa:bb:cc:dd:ee:ff` (or with `-`).
pub fn parse_mac(s: &str) -> Option<Mac> {
    let mut m = [0u8; 6];
    let mut n = 0;
    for part in s.split([':', '-']) {
        if n == 6 || part.len() != 2 {
            return None;
        }
        m[n] = u8::from_str_radix(part, 16).ok()?;
        n += 1;
    }
    (n == 6).then_some(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // A Query Config broadcast as the Linux driver sends it.
    const DISCOVER: [u8; 24] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // dst
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, // src
        0x88, 0xa2, // EtherType
        0x10, 0x00, // ver 1, flags 0, error 0
        0xff, 0xff, 0xff, // shelf, slot broadcast
        0x01, // Query Config
        0x12, 0x34, 0x56, 0x78, // tag
    ];

    #[test]
    fn decodes_a_broadcast_query() {
        let h = AoeHeader::parse(&DISCOVER).unwrap();
        assert_eq!(h.dst(), BROADCAST_MAC);
        assert_eq!(h.src(), [2, 0, 0, 0, 0, 1]);
        assert_eq!(h.version(), 1);
        assert!(!h.is_response() && !h.is_error());
        assert_eq!((h.shelf(), h.slot()), (0xFFFF, 0xFF));
        assert_eq!(h.command(), Command::QueryConfig);
        assert_eq!(h.tag(), 0x12345678);
        let mut out = [0u8; 24];
        HeaderFields::decode(&h).encode(&mut out).unwrap();
        assert_eq!(out, DISCOVER);
    }

    #[test]
    fn rejects_short_and_foreign_frames() {
        assert_eq!(AoeHeader::parse(&DISCOVER[..23]), Err(WireError::Truncated { have: 23, need: 24 }));
        let mut ip = DISCOVER;
        ip[12] = 0x08;
        ip[13] = 0x00;
        assert_eq!(AoeHeader::parse(&ip), Err(WireError::NotAoe(0x0800)));
        assert!(HeaderFields::decode(&AoeHeader::parse(&DISCOVER).unwrap()).encode(&mut [0u8; 10]).is_err());
    }

    #[test]
    fn macs_format_and_parse() {
        let m = [0x02, 0xab, 0, 1, 0xff, 0x10];
        assert_eq!(format_mac(&m), "02:ab:00:01:ff:10");
        assert_eq!(parse_mac("02:ab:00:01:ff:10"), Some(m));
        assert_eq!(parse_mac("02:ab:00:01:ff"), None);
        assert_eq!(parse_mac("02:ab:00:01:ff:10:11"), None);
        assert_eq!(parse_mac("zz:ab:00:01:ff:10"), None);
    }

    proptest! {
        #[test]
        fn header_round_trips(dst in any::<[u8;6]>(), src in any::<[u8;6]>(), flags in 0u8..16, error in any::<u8>(),
                              shelf in any::<u16>(), slot in any::<u8>(), cmd in any::<u8>(), tag in any::<u32>()) {
            let f = HeaderFields { dst, src, flags, error, shelf, slot, command: Command::from(cmd), tag };
            let mut buf = [0u8; 24];
            f.encode(&mut buf).unwrap();
            let h = AoeHeader::parse(&buf).unwrap();
            prop_assert_eq!(h.version(), 1);
            prop_assert_eq!(HeaderFields::decode(&h), f);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = AoeHeader::parse(&bytes);
        }
    }
}
