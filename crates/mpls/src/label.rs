//! Label stack entries and the pseudowire control word: each wire format here, once.

/// EtherType of MPLS unicast (RFC 3032).
pub const ETHERTYPE_MPLS: u16 = 0x8847;
/// Bytes of one label stack entry.
pub const ENTRY_LEN: usize = 4;
/// Labels 0..=15 are reserved (explicit null, router alert, ...); the
/// router never allocates them and drops frames that carry them on top.
pub const FIRST_UNRESERVED_LABEL: u32 = 16;
/// Labels are 20 bits.
pub const MAX_LABEL: u32 = (1 << 20) - 1;

/// One label stack entry: label (20 bits), traffic class (3), bottom of
/// stack (1), TTL (8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LabelEntry {
    pub label: u32,
    pub tc: u8,
    pub bottom: bool,
    pub ttl: u8,
}

impl LabelEntry {
    pub fn decode(b: [u8; 4]) -> LabelEntry {
        let v = u32::from_be_bytes(b);
        LabelEntry {
            label: v >> 12,
            tc: ((v >> 9) & 7) as u8,
            bottom: v & 0x100 != 0,
            ttl: (v & 0xff) as u8,
        }
    }

    pub fn encode(&self) -> [u8; 4] {
        let v = ((self.label & MAX_LABEL) << 12)
            | (((self.tc & 7) as u32) << 9)
            | ((self.bottom as u32) << 8)
            | self.ttl as u32;
        v.to_be_bytes()
    }

    /// Read the entry at the start of `b`, if there are 4 bytes.
    pub fn read(b: &[u8]) -> Option<LabelEntry> {
        Some(LabelEntry::decode(b.get(..ENTRY_LEN)?.try_into().ok()?))
    }
}

/// The Ethernet pseudowire control word (RFC 4448 section 4.6): four bytes
/// whose first nibble is 0, so a transit router that peeks past the label
/// stack never mistakes the customer frame for IPv4 (4) or IPv6 (6). We send
/// a zero sequence number (sequencing not used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlWord {
    pub sequence: u16,
}

impl ControlWord {
    pub const LEN: usize = 4;

    pub fn encode(&self) -> [u8; 4] {
        let s = self.sequence.to_be_bytes();
        [0, 0, s[0], s[1]]
    }

    /// `None` unless the first nibble is 0 and the flags/reserved bits are 0.
    pub fn read(b: &[u8]) -> Option<ControlWord> {
        let w = b.get(..Self::LEN)?;
        if w[0] != 0 || w[1] != 0 {
            return None;
        }
        Some(ControlWord {
            sequence: u16::from_be_bytes([w[2], w[3]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_bytes() {
        // label 1000 = 0x003E8, tc 0, bottom, ttl 255
        let e = LabelEntry {
            label: 1000,
            tc: 0,
            bottom: true,
            ttl: 255,
        };
        assert_eq!(e.encode(), [0x00, 0x3E, 0x81, 0xFF]);
        assert_eq!(LabelEntry::decode([0x00, 0x3E, 0x81, 0xFF]), e);
        let e = LabelEntry {
            label: MAX_LABEL,
            tc: 5,
            bottom: false,
            ttl: 1,
        };
        assert_eq!(e.encode(), [0xFF, 0xFF, 0xFA, 0x01]);
        assert_eq!(LabelEntry::read(&[1, 2, 3]), None);
    }

    #[test]
    fn control_word() {
        assert_eq!(ControlWord { sequence: 0 }.encode(), [0; 4]);
        assert_eq!(
            ControlWord::read(&[0, 0, 0, 7]),
            Some(ControlWord { sequence: 7 })
        );
        assert_eq!(ControlWord::read(&[0x45, 0, 0, 0]), None);
        assert_eq!(ControlWord::read(&[0, 0, 0]), None);
    }

    proptest::proptest! {
        #[test]
        fn entry_round_trip(b: [u8; 4]) {
            proptest::prop_assert_eq!(LabelEntry::decode(b).encode(), b);
        }
    }
}
