//! Sense data: the (key, ASC, ASCQ) triples this disk reports, and their
//! fixed-format (response code 0x70) encoding.

/// Sense keys (SPC-4 table 48).
pub mod key {
    pub const NO_SENSE: u8 = 0x0;
    pub const NOT_READY: u8 = 0x2;
    pub const MEDIUM_ERROR: u8 = 0x3;
    pub const HARDWARE_ERROR: u8 = 0x4;
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    pub const UNIT_ATTENTION: u8 = 0x6;
    pub const DATA_PROTECT: u8 = 0x7;
    pub const ABORTED_COMMAND: u8 = 0xB;
    pub const MISCOMPARE: u8 = 0xE;
}

/// One sense condition, plus the optional INFORMATION field (e.g. the offset
/// of the first miscompared byte) and sense-key specific field pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
    pub information: Option<u32>,
    /// Field pointer for ILLEGAL REQUEST: (in CDB?, byte, bit).
    pub field: Option<(bool, u16, Option<u8>)>,
}

impl Sense {
    pub const fn new(key: u8, asc: u8, ascq: u8) -> Self {
        Sense { key, asc, ascq, information: None, field: None }
    }

    pub const INVALID_OPCODE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x20, 0x00);
    pub const LBA_OUT_OF_RANGE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x21, 0x00);
    pub const INVALID_FIELD_IN_CDB: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x24, 0x00);
    pub const LUN_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x25, 0x00);
    pub const INVALID_FIELD_IN_PARAM_LIST: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x00);
    pub const PARAM_LIST_LENGTH_ERROR: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x1A, 0x00);
    pub const SAVING_PARAMS_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x39, 0x00);
    pub const INVALID_RELEASE_OF_PR: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x04);
    pub const INSUFFICIENT_REGISTRATION_RESOURCES: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x55, 0x04);
    pub const WRITE_PROTECTED: Sense = Sense::new(key::DATA_PROTECT, 0x27, 0x00);
    pub const POWER_ON_RESET: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x00);
    pub const MODE_PARAMETERS_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2A, 0x01);
    pub const RESERVATIONS_PREEMPTED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2A, 0x03);
    pub const RESERVATIONS_RELEASED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2A, 0x04);
    pub const REGISTRATIONS_PREEMPTED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2A, 0x05);
    pub const ASYMMETRIC_ACCESS_STATE_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2A, 0x06);
    pub const CAPACITY_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2A, 0x09);
    pub const REPORTED_LUNS_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x3F, 0x0E);
    pub const MISCOMPARE_DURING_VERIFY: Sense = Sense::new(key::MISCOMPARE, 0x1D, 0x00);
    pub const UNRECOVERED_READ_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x11, 0x00);
    pub const WRITE_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x0C, 0x00);
    pub const INTERNAL_TARGET_FAILURE: Sense = Sense::new(key::HARDWARE_ERROR, 0x44, 0x00);
    pub const NO_SENSE: Sense = Sense::new(key::NO_SENSE, 0x00, 0x00);
    /// For a transport's data-out shorter than the CDB asks for (iSCSI).
    /// For a transport's data phase that went wrong (iSCSI Data-Out errors).
    pub const DATA_PHASE_ERROR: Sense = Sense::new(key::ABORTED_COMMAND, 0x4B, 0x00);
    pub const INVALID_FIELD_IN_IU: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x0E, 0x03);

    /// ILLEGAL REQUEST / INVALID FIELD IN CDB pointing at `byte` (and `bit`).
    pub fn invalid_cdb_field(byte: u16, bit: Option<u8>) -> Self {
        Sense { field: Some((true, byte, bit)), ..Sense::INVALID_FIELD_IN_CDB }
    }

    /// ILLEGAL REQUEST / INVALID FIELD IN CDB pointing at the named field.
    pub fn invalid_in_cdb(f: impl crate::cdb::FieldPointer) -> Self {
        let (byte, bit) = f.pointer();
        Self::invalid_cdb_field(byte, bit)
    }

    /// ILLEGAL REQUEST / INVALID FIELD IN PARAMETER LIST pointing at `byte`.
    pub fn invalid_param_field(byte: u16, bit: Option<u8>) -> Self {
        Sense { field: Some((false, byte, bit)), ..Sense::INVALID_FIELD_IN_PARAM_LIST }
    }

    pub fn with_information(mut self, info: u32) -> Self {
        self.information = Some(info);
        self
    }

    /// Fixed-format sense data, 18 bytes (SPC-4 4.5.3).
    pub fn to_fixed(&self) -> Vec<u8> {
        let mut s = vec![0u8; 18];
        self.write_fixed(&mut s);
        s
    }

    pub fn write_fixed(&self, s: &mut [u8]) {
        s[0] = 0x70;
        s[2] = self.key & 0x0f;
        if let Some(info) = self.information {
            s[0] |= 0x80; // VALID: the INFORMATION field is meaningful
            s[3..7].copy_from_slice(&info.to_be_bytes());
        }
        s[7] = 10; // additional sense length
        s[12] = self.asc;
        s[13] = self.ascq;
        if let Some((cd, byte, bit)) = self.field {
            s[15] = 0x80 | if cd { 0x40 } else { 0 } | bit.map(|b| 0x08 | (b & 7)).unwrap_or(0);
            s[16..18].copy_from_slice(&byte.to_be_bytes());
        }
    }
}

/// The sense key of sense data in either format a target may send: fixed
/// (response codes 0x70/0x71) or descriptor (0x72/0x73). `None` for anything
/// else, including empty or truncated data.
pub fn key_of(sense: &[u8]) -> Option<u8> {
    match sense.first()? & 0x7F {
        0x70 | 0x71 => sense.get(2).map(|b| b & 0x0F),
        0x72 | 0x73 => sense.get(1).map(|b| b & 0x0F),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_format_layout() {
        let s = Sense::invalid_cdb_field(2, Some(1)).to_fixed();
        assert_eq!(s, vec![0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0xc9, 0, 2]);
        let m = Sense::MISCOMPARE_DURING_VERIFY.with_information(700).to_fixed();
        assert_eq!(&m[..8], &[0xf0, 0, 0x0e, 0, 0, 0x02, 0xbc, 10]);
        assert_eq!((m[12], m[13]), (0x1d, 0));
    }
}

#[cfg(test)]
mod key_tests {
    use super::*;

    #[test]
    fn key_of_both_formats() {
        assert_eq!(key_of(&Sense::POWER_ON_RESET.to_fixed()), Some(key::UNIT_ATTENTION));
        // Descriptor format: key in byte 1.
        assert_eq!(key_of(&[0x72, 0x06, 0x29, 0x00, 0, 0, 0, 0]), Some(key::UNIT_ATTENTION));
        assert_eq!(key_of(&[0x70, 0]), None);
        assert_eq!(key_of(&[]), None);
        assert_eq!(key_of(&[0x12, 0, 6]), None);
    }

    #[test]
    fn invalid_field_in_iu_layout() {
        // The bytes the iSCSI target sent before it used this constant.
        assert_eq!(Sense::INVALID_FIELD_IN_IU.to_fixed(), vec![0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x0E, 3, 0, 0, 0, 0]);
    }
}
